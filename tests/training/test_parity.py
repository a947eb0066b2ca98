"""Parity of utrain with independent references.

* ONERT (``onert_ref.onert_train`` / ``onert_infer``) is the oracle for training and for
  forward outputs: utrain runs end to end (prepare -> runner.run -> export) under CPython
  + numpy and under unix MicroPython (pure-Python array fallback), and the exported
  weights are compared tensor by tensor with the ones ONERT exports after training the
  same circle model on the same data in the same order.
* The .wof written by ``prepare`` is parsed by a reader written here from
  /work/shared/formats.md alone (not host_tools.files.wof, not micro/utrain/wof).
* Every training comparison also checks that the weights moved far more than the
  tolerance, so a run that silently trains nothing cannot pass.

Models and data are tiny: MicroPython runs about 100x slower than numpy.
"""

import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
MICRO = os.path.join(ROOT, "micro")
for _p in (MICRO,):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model, tensor_data  # noqa: E402
from host_tools.prepare.pipeline import export, prepare  # noqa: E402
from host_tools.target.runner import find_micropython, run  # noqa: E402
from host_tools.files.wof import read_wof  # noqa: E402
from onert_ref import build_mlp, onert_infer, onert_train  # noqa: E402

MICROPYTHON = find_micropython()
needs_mp = pytest.mark.skipif(MICROPYTHON is None, reason="unix micropython not found")
BACKENDS = ["cpython", pytest.param("micropython", marks=needs_mp)]

TOL = 1e-4             # relative, per tensor (training parity)
MOVED = 100 * TOL      # a trained tensor must move at least this much (relative)
FWD_TOL = 1e-5         # forward outputs
N_SAMPLES = 48


# --------------------------------------------------------------------------- helpers

def rel_err(a, b):
    """max |a - b| / max |b| (b the reference)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def make_data(kind, n=N_SAMPLES, n_in=8, n_out=4, seed=7):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    if kind == "cce":
        y = np.eye(n_out, dtype=np.float32)[rng.integers(0, n_out, n)]
    else:   # regression targets: a fixed random linear map of the inputs plus a nonlinearity
        m = rng.standard_normal((n_in, n_out)).astype(np.float32) * 0.5
        y = np.tanh(x @ m).astype(np.float32)
    return x, y


def prepare_dir(model, out_dir, x, y, **settings):
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    npz = os.path.join(out_dir, "data.npz")
    np.savez(npz, x=x, y=y)
    kw = dict(test_split=0.0, shuffle=False, epochs=1, reduction="mean")
    kw.update(settings)
    prepare(model, out_dir, data=npz, **kw)
    return out_dir


def run_backend(out_dir, backend):
    code, text = run(out_dir, board="unix", python=(backend == "cpython"), stream=False)
    assert code == 0, f"utrain run ({backend}) failed:\n{text}"
    assert os.path.exists(os.path.join(out_dir, "trained.wof")), text
    return text


def export_trained(model, out_dir, out_path):
    """trained.wof merged into the circle model (host_tools' export: into the rewritten
    graph when prepare rewrote the model)."""
    export(model, os.path.join(out_dir, "trained.wof"), out_path)
    return out_path


def export_cli(model, wof_path, out_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "host_tools", "export", os.fspath(model),
                        os.fspath(wof_path), "-o", os.fspath(out_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return out_path


def const_names(model):
    return {t.index: t.name for t in read_model(model).tensors if t.data is not None}


def device_shape(shape):
    shape = list(shape)
    return (int(np.prod(shape[:-1])) if len(shape) > 1 else 1, int(shape[-1]))


def new_trainer(model_flat, weights):
    from utrain.trainer import Trainer     # CPython + numpy backend (micro/ on sys.path)
    return Trainer(os.fspath(model_flat), os.fspath(weights))


def utrain_predict(trainer, x, in_shape):
    """Outputs for each row of x, stacked (a copy: predict returns the net's buffer)."""
    ds = device_shape(in_shape)
    return np.stack([np.array(trainer.predict(np.ascontiguousarray(
        x[i].reshape(ds), np.float32)), dtype=np.float64, copy=True).reshape(-1)
        for i in range(len(x))])


def read_wof_from_spec(path):
    """(magic, version, reserved, n_buffers, offsets, raw bytes): formats.md's .wof table."""
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) >= 8
    magic, version, reserved, n = struct.unpack_from("<HBBI", raw, 0)
    assert len(raw) >= 8 + 4 * n
    offs = list(struct.unpack_from(f"<{n}I", raw, 8))
    return magic, version, reserved, n, offs, raw


# --------------------------------------------------------------------------- models

# training cases: name -> (model kind, loss, optimizer, batch, lr)
TRAIN_CASES = {
    "cce-sgd-b1": ("softmax", "cce", "sgd", 1, 0.05),
    "cce-sgd-b4": ("softmax", "cce", "sgd", 4, 0.05),
    "cce-adam-b4": ("softmax", "cce", "adam", 4, 0.01),
    "mse-sgd-b4": ("regression", "mse", "sgd", 4, 0.05),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_models")
    models = {
        # FC(8->16) - RELU - FC(16->4) - SOFTMAX, ops 0..3
        "softmax": build_mlp(os.path.join(d, "mlp.circle"), seed=0),
        # FC(8->16) - RELU - FC(16->4): regression, no softmax
        "regression": build_mlp(os.path.join(d, "reg.circle"), seed=1, softmax=False),
    }
    return {"dir": d, "models": models, "onert": {}}


def onert_result(work, key, model, x, y, **kw):
    """ONERT-trained constant tensors, computed once per key for the module."""
    if key not in work["onert"]:
        out = os.path.join(work["dir"], f"onert_{key}.circle")
        work["onert"][key] = tensor_data(onert_train(model, x, y, out_path=out, **kw))
    return work["onert"][key]


# --------------------------------------------------------------------------- 1. training parity

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_training_matches_onert(work, tmp_path, case, backend):
    kind, loss, opt, batch, lr = TRAIN_CASES[case]
    model = work["models"][kind]
    x, y = make_data("cce" if loss == "cce" else "mse")
    assert N_SAMPLES % batch == 0                   # every batch full: no padding rules
    d = prepare_dir(model, tmp_path / "run", x, y, loss=loss, optimizer=opt, lr=lr,
                    batch=batch, train="all")
    run_backend(d, backend)
    got = tensor_data(export_trained(model, d, tmp_path / "utrain.circle"))
    ref = onert_result(work, case, model, x, y, loss=loss, optimizer=opt, lr=lr,
                       batch=batch, epochs=1, trainable_ops=-1)
    w0 = tensor_data(model)
    names = const_names(model)
    assert sorted(got) == sorted(ref) == sorted(w0)
    for k in w0:
        err = rel_err(got[k], ref[k])
        moved = float(np.abs(ref[k].astype(np.float64) - w0[k]).max() / np.abs(ref[k]).max())
        moved_u = float(np.abs(got[k].astype(np.float64) - w0[k]).max() / np.abs(ref[k]).max())
        assert err <= TOL, f"{case}/{backend}: tensor {k} {names[k]}: rel err {err:.3e}"
        assert moved >= MOVED, f"{case}: ONERT barely moved {names[k]} ({moved:.2e})"
        assert moved_u >= MOVED, f"{case}/{backend}: utrain barely moved {names[k]} ({moved_u:.2e})"


# --------------------------------------------------------------------------- 2. --train last:N

@pytest.mark.parametrize("backend", BACKENDS)
def test_train_last_2_matches_onert(work, tmp_path, backend):
    model = work["models"]["softmax"]            # FC-RELU-FC-SOFTMAX: last 2 = FC2, SOFTMAX
    x, y = make_data("cce")
    d = prepare_dir(model, tmp_path / "run", x, y, loss="cce", optimizer="sgd", lr=0.05,
                    batch=4, train="last:2")
    run_backend(d, backend)
    exported = export_trained(model, d, tmp_path / "utrain.circle")
    got = tensor_data(exported)
    ref = onert_result(work, "last2", model, x, y, loss="cce", optimizer="sgd", lr=0.05,
                       batch=4, epochs=1, trainable_ops=2)
    w0 = tensor_data(model)
    by_name = {v: k for k, v in const_names(model).items()}
    trained = {by_name["w2"], by_name["b2"]}
    frozen = {by_name["w1"], by_name["b1"]}
    # ONERT's own reading of num_of_trainable_ops=2 (sanity of the oracle)
    for k in frozen:
        assert ref[k].tobytes() == w0[k].tobytes()
    for k in frozen:
        assert got[k].tobytes() == w0[k].tobytes(), f"frozen tensor {k} changed"
    for k in trained:
        err = rel_err(got[k], ref[k])
        moved = float(np.abs(got[k].astype(np.float64) - w0[k]).max() / np.abs(ref[k]).max())
        assert err <= TOL, f"last:2/{backend}: tensor {k}: rel err {err:.3e}"
        assert moved >= MOVED, f"last:2/{backend}: tensor {k} barely moved ({moved:.2e})"
    # trained.wof holds only the trained tensors
    *_, offs, _ = read_wof_from_spec(os.path.join(d, "trained.wof"))
    assert {k for k, o in enumerate(offs) if o not in (0, 0xFFFFFFFF)} == trained


# --------------------------------------------------------------------------- 3. forward outputs

def _w(rng, *shape, scale=0.7):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def build_forward_model(path, name, seed=3):
    """x[1,8] -> FC(8->6, fused) [-> op]; activations are large enough that RELU6 clips."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    if name == "RESHAPE":
        # x[1,2,4] -> RESHAPE[1,8] -> FC(8->6) -> RESHAPE[1,2,3]
        x = b.tensor("x", [1, 2, 4])
        xf = b.tensor("xf", [1, 8])
        b.op("RESHAPE", [x], [xf], new_shape=[1, 8])
        w, bias = b.tensor("w", [6, 8], data=_w(rng, 6, 8)), b.tensor("b", [6], data=_w(rng, 6))
        h = b.tensor("h", [1, 6])
        b.op("FULLY_CONNECTED", [xf, w, bias], [h])
        y = b.tensor("y", [1, 2, 3])
        b.op("RESHAPE", [h], [y], new_shape=[1, 2, 3])
    else:
        x = b.tensor("x", [1, 8])
        fused = name[3:] if name.startswith("FC_") else "NONE"
        w = b.tensor("w", [6, 8], data=_w(rng, 6, 8, scale=1.5))
        bias = b.tensor("b", [6], data=_w(rng, 6))
        h = b.tensor("h", [1, 6])
        b.op("FULLY_CONNECTED", [x, w, bias], [h], fused_activation_function=fused)
        y = h
        if not name.startswith("FC_"):
            y = b.tensor("y", [1, 6])
            if name.startswith("SOFTMAX"):
                b.op("SOFTMAX", [h], [y], beta=0.5 if name == "SOFTMAX_beta0.5" else 1.0)
            else:
                b.op(name, [h], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(path), read_model(path).tensors[x].shape


def build_chain_model(path, seed=5):
    """Every supported op in one chain (the MicroPython forward check)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    x = b.tensor("x", [1, 2, 4])
    cur = b.tensor("x8", [1, 8])
    b.op("RESHAPE", [x], [cur], new_shape=[1, 8])
    n = 8
    for i, (fused, act, m) in enumerate([("NONE", "RELU", 10), ("RELU6", "TANH", 8),
                                         ("RELU", "LOGISTIC", 8), ("NONE", "RELU6", 6),
                                         ("NONE", "SOFTMAX", 4)]):
        w = b.tensor(f"w{i}", [m, n], data=_w(rng, m, n, scale=1.5))
        bias = b.tensor(f"b{i}", [m], data=_w(rng, m))
        h = b.tensor(f"h{i}", [1, m])
        b.op("FULLY_CONNECTED", [cur, w, bias], [h], fused_activation_function=fused)
        out = b.tensor(f"a{i}", [1, m])
        if act == "SOFTMAX":
            b.op("SOFTMAX", [h], [out], beta=1.0)
        else:
            b.op(act, [h], [out])
        cur, n = out, m
    y = b.tensor("y", [1, 2, 2])
    b.op("RESHAPE", [cur], [y], new_shape=[1, 2, 2])
    b.inputs(x)
    b.outputs(y)
    return b.save(path)


FORWARD_MODELS = ["FC_NONE", "FC_RELU", "FC_RELU6", "RELU", "RELU6", "LOGISTIC", "TANH",
                  "SOFTMAX", "SOFTMAX_beta0.5", "RESHAPE"]


def _fwd_inputs(n, seed=11, scale=2.0):
    return (np.random.default_rng(seed).standard_normal((n, 8)) * scale).astype(np.float32)


@pytest.mark.parametrize("name", FORWARD_MODELS)
def test_forward_matches_onert(tmp_path, name):
    model, in_shape = build_forward_model(tmp_path / "m.circle", name)
    prepare(model, tmp_path, loss="mse")
    x = _fwd_inputs(16)
    ref = onert_infer(model, x.reshape([16] + list(in_shape[1:]))).reshape(16, -1)
    got = utrain_predict(new_trainer(tmp_path / "model.flat", tmp_path / "weights.wof"),
                         x, in_shape)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max())
    assert err <= FWD_TOL * max(1.0, float(np.abs(ref).max())), f"{name}: max err {err:.3e}"
    # the inputs exercise the interesting regions of the activation
    if name in ("FC_RELU6", "RELU6"):
        assert (ref == 6).any() and (ref == 0).any() and ((ref > 0) & (ref < 6)).any()
    if name in ("FC_RELU", "RELU"):
        assert (ref == 0).any() and (ref > 0).any()


MP_PREDICT = """\
import json
from utrain.trainer import Trainer
tr = Trainer('model.flat', 'weights.wof')
with open('x.json') as f:
    xs = json.load(f)
out = []
for x in xs:
    y = tr.predict(x)
    out.append([float(v) for row in y.tolist() for v in row])
print('OUT ' + json.dumps(out))
"""


def test_forward_chain_micropython_and_cpython(tmp_path):
    model = build_chain_model(tmp_path / "chain.circle")
    prepare(model, tmp_path, loss="cce")
    x = _fwd_inputs(6, seed=12)
    ref = onert_infer(model, x.reshape(6, 2, 4)).reshape(6, -1)
    got_py = utrain_predict(new_trainer(tmp_path / "model.flat", tmp_path / "weights.wof"),
                            x, [1, 2, 4])
    assert float(np.abs(got_py - ref).max()) <= FWD_TOL
    if MICROPYTHON is None:
        pytest.skip("unix micropython not found (CPython part passed)")
    (tmp_path / "x.json").write_text(json.dumps(x.reshape(6, 2, 4).tolist()))
    (tmp_path / "predict.py").write_text(MP_PREDICT)
    env = dict(os.environ, MICROPYPATH=MICRO)
    p = subprocess.run([MICROPYTHON, "predict.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("OUT ")][-1]
    got_mp = np.array(json.loads(line[4:]), np.float64)
    assert got_mp.shape == ref.shape
    err = float(np.abs(got_mp - ref).max())
    assert err <= FWD_TOL, f"MicroPython forward: max err {err:.3e}"


# --------------------------------------------------------------------------- 4. .wof from the spec

@pytest.mark.parametrize("train", ["all", "last:2"])
def test_prepared_wof_layout(tmp_path, train):
    # FC-RELU-FC-SOFTMAX with a RESHAPE in front: the int32 shape tensor is a constant
    # that must not go into the .wof
    rng = np.random.default_rng(21)
    b = CircleBuilder()
    x = b.tensor("x", [1, 2, 4])
    xf = b.tensor("xf", [1, 8])
    b.op("RESHAPE", [x], [xf], new_shape=[1, 8])
    w1, b1 = b.tensor("w1", [5, 8], data=_w(rng, 5, 8)), b.tensor("b1", [5], data=_w(rng, 5))
    h0, h = b.tensor("h0", [1, 5]), b.tensor("h", [1, 5])
    b.op("FULLY_CONNECTED", [xf, w1, b1], [h0])
    b.op("RELU", [h0], [h])
    w2, b2 = b.tensor("w2", [3, 5], data=_w(rng, 3, 5)), b.tensor("b2", [3], data=_w(rng, 3))
    z, y = b.tensor("z", [1, 3]), b.tensor("y", [1, 3])
    b.op("FULLY_CONNECTED", [h, w2, b2], [z])
    b.op("SOFTMAX", [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    model = b.save(tmp_path / "m.circle")
    prepare(model, tmp_path / "p", train=train, loss="cce")

    g = read_model(model)
    magic, version, reserved, n, offs, raw = read_wof_from_spec(tmp_path / "p" / "weights.wof")
    assert (magic, version, reserved) == (429, 1, 0)
    assert n == len(g.tensors) == len(offs)
    trainable = {w1, b1, w2, b2} if train == "all" else {w2, b2}
    assert {k for k, o in enumerate(offs) if o != 0} == trainable   # writers use 0, not -1
    pos = 8 + 4 * n                         # data back to back, no padding, in file order
    for k in sorted(trainable, key=lambda k: offs[k]):
        t = g.tensors[k]
        assert offs[k] == pos
        count = int(np.prod(t.shape))
        data = np.frombuffer(raw, "<f4", count, offs[k]).reshape(t.shape)
        assert data.tobytes() == np.ascontiguousarray(t.data, "<f4").tobytes()
        pos += 4 * count
    assert pos == len(raw)
    # the non-trainable constants (int32 shape, frozen weights) exist but are not in it
    consts = {t.index for t in g.tensors if t.data is not None}
    assert consts - trainable and all(offs[k] == 0 for k in consts - trainable)


# --------------------------------------------------------------------------- 5. export -> ONERT

@pytest.mark.parametrize("backend", BACKENDS)
def test_export_reproduces_trained_model(work, tmp_path, backend):
    model = work["models"]["softmax"]
    x, y = make_data("cce", seed=8)
    d = prepare_dir(model, tmp_path / "run", x, y, loss="cce", optimizer="adam", lr=0.01,
                    batch=4, train="all")
    run_backend(d, backend)
    exported = export_cli(model, os.path.join(d, "trained.wof"), tmp_path / "exported.circle")
    xt = _fwd_inputs(12, seed=13, scale=1.0)
    ref = onert_infer(exported, xt)
    got = utrain_predict(new_trainer(os.path.join(d, "model.flat"),
                                     os.path.join(d, "trained.wof")), xt, [1, 8])
    assert float(np.abs(got - ref).max()) <= FWD_TOL
    # the trained model differs from the initial one by far more than the tolerance
    before = onert_infer(model, xt)
    assert float(np.abs(ref - before).max()) > 100 * FWD_TOL


# --------------------------------------------------------------------------- 6. MicroPython vs CPython

def read_log(path):
    with open(path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    assert lines[0] == "epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap", lines[0]
    rows = []
    for ln in lines[1:]:
        parts = ln.split(",")
        assert len(parts) == 7, ln
        rows.append([int(parts[0])] + [float(v) if v else None for v in parts[1:5]])
    return rows


@needs_mp
def test_micropython_and_cpython_runs_agree(tmp_path):
    model = build_mlp(tmp_path / "small.circle", n_in=6, n_hidden=8, n_out=3, seed=4)
    x, y = make_data("cce", n=40, n_in=6, n_out=3, seed=9)
    base = prepare_dir(model, tmp_path / "base", x, y, loss="cce", optimizer="adam", lr=0.01,
                       batch=4, epochs=2, test_split=0.2, train="all")
    dirs = {}
    for backend in ("cpython", "micropython"):
        dirs[backend] = d = os.fspath(tmp_path / backend)
        shutil.copytree(base, d)
        run_backend(d, backend)
    logs = {b: read_log(os.path.join(d, "train.log")) for b, d in dirs.items()}
    py, mp = logs["cpython"], logs["micropython"]
    assert [r[0] for r in py] == [r[0] for r in mp] == [0, 1, 2]
    for rp, rm in zip(py, mp):
        for col, name in zip(range(1, 5), ("loss", "accuracy", "test_loss", "test_accuracy")):
            a, b = rm[col], rp[col]
            if rp[0] == 0 and col < 3:
                assert a is None and b is None
                continue
            assert abs(a - b) <= TOL * abs(b), f"epoch {rp[0]} {name}: mp {a} vs cpython {b}"
    # the losses do change over training (the comparison is not of constants)
    assert abs(py[2][1] - py[1][1]) > 100 * TOL * py[1][1]
    assert abs(py[2][3] - py[0][3]) > 100 * TOL * py[0][3]
    # and so do the trained weights agree
    g = read_model(model)
    wp = read_wof(os.path.join(dirs["cpython"], "trained.wof"), g)
    wm = read_wof(os.path.join(dirs["micropython"], "trained.wof"), g)
    assert sorted(wp) == sorted(wm)
    for k in wp:
        assert rel_err(wm[k], wp[k]) <= TOL
