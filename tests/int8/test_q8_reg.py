"""Regression losses of int8 training (issue 28: utrain.q8reg, mse and mae): the loss and
its gradient against the float path's (utrain.losses) and finite differences, the int8
step's QAS updates against finite differences of the dequantized model's loss, and an
int8 regression MLP (the Keras MLP without its softmax) prepared, trained on unix
MicroPython as on CPython (the same bytes), its loss lowered, and exported as int8 that
TFLite Micro runs as the board's net."""
import os
import shutil
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.graph.inout import save_graph  # noqa: E402
from host_tools.prepare.pipeline import prepare, PrepareError  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from utrain import q8reg, losses  # noqa: E402
from utrain.xnp import np as xnp  # noqa: E402

MLP = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mlp_int8.tflite')
MP = runner.find_micropython()


def _regressor(tmp_path):
    """The Keras int8 MLP (16 -> 4 outputs) without its SOFTMAX: a regression MLP."""
    g = read_model(MLP)
    g.outputs, g.ops = [g.ops[-2].outputs[0]], g.ops[:-1]
    return save_graph(g, str(tmp_path / 'reg.tflite'))


def _data(path, n=200, seed=0):
    r = np.random.default_rng(seed)
    x = r.standard_normal((n, 16)).astype(np.float32)
    a = np.random.default_rng(9).standard_normal((16, 4)) * 0.3
    np.savez(path, x=x, y=np.tanh(x @ a).astype(np.float32))
    return str(path)


def _net(tmp_path, kind='mse'):
    """A Q8Net of the regression MLP (every layer trains) with the loss kind."""
    g = read_model(_regressor(tmp_path))
    m = quant.write(g, str(tmp_path), 'all')
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    tr = type('T', (), {})()        # (what q8reg.use reads of a Q8Trainer)
    tr.net, tr.cfg = net, {'loss': kind, 'metric': 'mae'}
    q8reg.use(tr)
    return net, m


@pytest.mark.parametrize('kind', ['mse', 'mae'])
def test_loss_and_gradient_as_the_float_path_and_finite_differences(tmp_path, kind):
    net, _ = _net(tmp_path, kind)
    r = np.random.default_rng(1)
    for i in range(4):
        xq = net.quantize_input(r.standard_normal(16).tolist())
        t = (r.standard_normal(4) * 2).tolist()
        y = np.array(net.logits(xq))
        loss, mae, g = net.loss(xq, t, True)
        want, wg = losses.loss(kind, xnp.array([y.tolist()]), xnp.array([t]))
        assert abs(loss - float(want)) < 1e-9 * max(1.0, abs(loss))
        assert abs(mae - np.mean(np.abs(y - t))) < 1e-9
        assert np.allclose(g, np.ravel(wg), atol=1e-12)
        assert net.loss(xq, t) == (loss, mae)
        # dL/dy by central differences of the loss in the dequantized outputs
        f = (lambda v: np.mean((v - t) ** 2)) if kind == 'mse' else (lambda v: np.mean(np.abs(v - t)))
        h = 1e-6
        fd = [(f(y + h * e) - f(y - h * e)) / (2 * h) for e in np.eye(4)]
        assert np.allclose(g, fd, atol=1e-6), (g, fd)


def test_int8_mse_step_against_finite_differences(tmp_path, monkeypatch):
    """One SGD step of the int8 regression MLP under mse: each layer's int8 update (in
    1/256 weight steps) against lr dL/dW / s_W of the dequantized model (float weights,
    float activations) by central differences; cosine > 0.98."""
    from test_q8 import spy_updates
    net, m = _net(tmp_path)
    r = np.random.default_rng(4)
    xq = net.quantize_input(r.standard_normal(16).tolist())
    x = (np.frombuffer(bytes(xq), np.int8).astype(np.float64) - m['zx']) * m['sx']
    t = np.array([0.5, -0.3, 0.2, 0.8])
    Ls = net.layers
    W = [np.frombuffer(bytes(L.w), np.int8).reshape(L.nout, -1) * L.d['sw'][0] for L in Ls]
    B = [np.array(L.b, np.float64) * L.d['sw'][0] * (m['sx'] if i == 0 else Ls[i - 1].d['sy'])
         for i, L in enumerate(Ls)]
    relu = [op.options.get('fused_activation_function') == 'RELU'
            for op in read_model(MLP).ops[:len(Ls)]]

    def loss(W):
        a = x
        for i in range(len(W)):
            a = W[i] @ a + B[i]
            a = np.maximum(a, 0) if relu[i] else a
        return np.mean((a - t) ** 2)
    lr = 0.02
    got = spy_updates(monkeypatch)
    net.step(xq, t.tolist(), lr)
    for i, L in enumerate(Ls):
        fd = np.zeros_like(W[i])
        h = 1e-5
        for j in range(W[i].size):
            e = np.zeros(W[i].size)
            e[j] = h
            Wp = [w.copy() for w in W]
            Wm = [w.copy() for w in W]
            Wp[i] = W[i] + e.reshape(W[i].shape)
            Wm[i] = W[i] - e.reshape(W[i].shape)
            fd.flat[j] = (loss(Wp) - loss(Wm)) / (2 * h)
        want = lr * fd / L.d['sw'][0] * 256
        upd = got[len(Ls) - 1 - i].reshape(want.shape)
        cos = float((upd * want).sum() / np.linalg.norm(upd) / np.linalg.norm(want))
        assert cos > 0.98, (i, cos)


def test_regression_loss_refused_on_a_softmax_output(tmp_path):
    data = _data(tmp_path / 'd.npz')
    with pytest.raises(PrepareError, match=r'--loss mse on a model ending in SOFTMAX.*--dequantize'):
        prepare(MLP, str(tmp_path / 'o'), data=data, loss='mse', train='all', log=lambda *a: None)


def trained_on_both(d, tmp_path):
    """Run the prepared folder d on unix MicroPython (viper) and a copy of it on CPython:
    both end well with the same trained.wof and files beside it.  Returns the MicroPython run's test losses
    (before training, then each epoch's)."""
    shutil.copytree(d, str(tmp_path / 'py'))
    code, out = runner.run(d, python=False, stream=False)
    assert code == 0, out
    code, out2 = runner.run(str(tmp_path / 'py'), python=True, stream=False)
    assert code == 0, out2
    def ours(p):                # (trained.wof.best: the record of its file stamps, not state)
        return sorted(f for f in os.listdir(p) if f.startswith('trained.wof') and f[-5:] != '.best')
    names = ours(d)
    assert names == ours(str(tmp_path / 'py'))
    for f in names:             # (and the state beside it: q8tcv's .q8c, ...)
        with open(os.path.join(d, f), 'rb') as a, open(str(tmp_path / 'py' / f), 'rb') as b:
            assert a.read() == b.read(), f
    return [float(v.split('test_loss ')[1].split()[0]) for v in out.splitlines() if 'test_loss' in v]


def assert_export_runs_as_trained(model, d, xs, tmp_path):
    """export --quantized of d's trained.wof into model: TFLite Micro's int8 outputs of
    the written model on samples xs are the trained net's (run folder d's table with
    trained.wof and the state beside it loaded), bit for bit, and not the untrained's."""
    import json
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.prepare.pipeline import export
    q = str(tmp_path / 'q.tflite')
    export(model, os.path.join(d, 'trained.wof'), q, quantized=True)
    with open(os.path.join(d, 'q8.json')) as f:
        m = json.load(f)
    net = Q8Net(m, os.path.join(d, 'weights.wof'))
    before = [bytes(net.forward(net.quantize_input(v.ravel().tolist()))) for v in xs]
    net.load_weights(os.path.join(d, 'trained.wof'))
    g = read_model(q)
    it = runtime.Interpreter.from_file(q)
    shape = [1] + list(g.tensors[g.inputs[0]].shape[1:])
    for v in xs:
        xq = net.quantize_input(v.ravel().tolist())
        it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(shape), 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(xq)), np.int8),
                              it.get_output(0).ravel())
    assert before != [bytes(net.forward(net.quantize_input(v.ravel().tolist()))) for v in xs]


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_int8_regression_mlp_trains_on_micropython_and_exports(tmp_path):
    """prepare trains the regression MLP as int8 with mse (q8.json, the targets as floats
    in train.ds); unix MicroPython's run (viper kernels) lowers the test loss and ends
    with CPython's trained.wof; export --quantized writes a model whose int8 outputs in
    TFLite Micro are the trained net's."""
    model = _regressor(tmp_path)
    data = _data(tmp_path / 'd.npz')
    d = str(tmp_path / 'mp')
    s = prepare(model, d, data=data, loss='mse', optimizer='sgd', lr=0.05, epochs=3,
                test_split=0.25, train='all', log=lambda *a: None)
    assert s['int8'] and os.path.exists(os.path.join(d, 'q8.json'))
    tl = trained_on_both(d, tmp_path)
    assert tl[-1] < 0.5 * tl[0], tl
    assert_export_runs_as_trained(model, d, np.load(data)['x'][:6], tmp_path)


def test_float_regression_model_trains_as_int8_for_a_board_without_ulab(tmp_path):
    """A float regression MLP (mse) prepared for --board rp2040 without ulab now trains
    as int8 (fromfloat; it fell back to float32 for want of the loss), the test loss
    lowers (CPython: the board's integers), export writes float32 again."""
    from onert_ref import build_mlp
    from host_tools.prepare.pipeline import export
    p = str(tmp_path / 'mlp.circle')
    build_mlp(p, n_in=8, n_hidden=16, n_out=3, softmax=False)
    r = np.random.default_rng(0)
    x = r.standard_normal((240, 8)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.tanh(x[:, :3]).astype(np.float32))
    said = []
    d = str(tmp_path / 'o')
    s = prepare(p, d, data=str(tmp_path / 'd.npz'), loss='mse', board='rp2040', lr=0.02, epochs=3,
                test_split=0.25, log=said.append)
    assert s.get('int8') and any('prepare chose int8 training' in v for v in said), said
    code, out = runner.run(d, python=True, stream=False)
    assert code == 0, out
    tl = [float(v.split('test_loss ')[1].split()[0]) for v in out.splitlines() if 'test_loss' in v]
    assert tl[-1] < 0.7 * tl[0], out
    export(p, os.path.join(d, 'trained.wof'), str(tmp_path / 'f.circle'))
    g = read_model(str(tmp_path / 'f.circle'))
    assert all(t.dtype == 'float32' for t in g.tensors if t.data is not None)


@pytest.mark.parametrize('scale,made,lr', [(1e-3, True, 0.01), (1e3, False, 1e-4)])
def test_a_regressions_int8_output_is_calibrated_to_its_targets(tmp_path, scale, made, lr):
    """A float regression MLP taken to int8 (--int8, mse): the trained output's int8 range
    is its own and the targets' (HEADROOM times), not logits' +-4 at least
    (fromfloat.widened).  A net made for targets within +-0.001 (made: its last layer at
    their scale) had its output at 0.031 a step (every output one code: 'reads it as a
    constant', nothing trained at any lr); targets within +-1000 a net's outputs of +-8
    had not reached were clipped at +-16 (the loss could never fall)."""
    from onert_ref import build_mlp
    from host_tools.formats.circle_io import write_with_weights
    p = str(tmp_path / 'mlp.circle')
    build_mlp(str(tmp_path / 'm.circle'), n_in=8, n_hidden=16, n_out=3, softmax=False)
    g = read_model(str(tmp_path / 'm.circle'))
    write_with_weights(str(tmp_path / 'm.circle'), p, {
        t.index: (t.data * (scale if made else 1.0)).astype(np.float32)
        for t in g.tensors if t.name in ('w2', 'b2')})
    r = np.random.default_rng(0)
    x = r.standard_normal((160, 8)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=(scale * np.tanh(x[:, :3])).astype(np.float32))
    said, d = [], str(tmp_path / 'o')
    s = prepare(p, d, data=str(tmp_path / 'd.npz'), loss='mse', int8=True, lr=lr, epochs=3,
                test_split=0.25, log=said.append)
    assert s.get('int8') and not any('as a constant' in str(v) for v in said), said
    g = read_model(os.path.join(d, 'int8.circle'))
    q = g.tensors[g.outputs[0]].quant
    span = 255 * q['scale'][0]
    assert 2 * scale <= span and (span < 50 * scale or not made), (span, scale)
    code, out = runner.run(d, python=True, stream=False)
    assert code == 0, out
    tl = [float(v.split('test_loss ')[1].split()[0]) for v in out.splitlines() if 'test_loss' in v]
    assert tl[-1] < 0.7 * tl[0] if scale > 1 else True, out


@pytest.mark.parametrize('scale,shift,lo,hi', [(1e-3, 0.0, -0.003, 0.003),
                                               (1e3, 2.0, 0.0, 4000.0)])
def test_an_int8_regression_files_output_keeps_its_range(tmp_path, scale, shift, lo, hi):
    """An int8 regression file (mse) trains and exports with its output's scale and zero
    point as the file has them: a regression's output is no logits (quant.regressed).
    Narrower than +-2 they had been made +-4 (targets within +-0.003: 0.031 a step, every
    output one code); on one side of 0 (einstein8612/VLP-pico's positions, 0..4145 mm)
    given as much room on the other (32 mm a step where the file had 16)."""
    from onert_ref import build_mlp
    from host_tools.formats.circle_io import write_with_weights
    from host_tools.prepare.pipeline import export
    build_mlp(str(tmp_path / 'b.circle'), n_in=8, n_hidden=16, n_out=3, softmax=False)
    g = read_model(str(tmp_path / 'b.circle'))
    write_with_weights(str(tmp_path / 'b.circle'), str(tmp_path / 'm.circle'), {
        t.index: (t.data * scale / 10 + (shift * scale if t.name == 'b2' else 0)).astype(
            np.float32) for t in g.tensors if t.name in ('w2', 'b2')})     # (outputs in lo..hi)
    r = np.random.default_rng(0)
    x = r.standard_normal((40, 8)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=(scale * (np.tanh(x[:, :3]) + shift)).astype(np.float32))
    none = lambda *a: None  # noqa: E731
    prepare(str(tmp_path / 'm.circle'), str(tmp_path / 'f'), data=str(tmp_path / 'd.npz'),
            loss='mse', int8=True, lr=0.01, epochs=1, log=none)
    g = read_model(str(tmp_path / 'f' / 'int8.circle'))
    out = g.outputs[0]

    def edit(model):        # (the output's range as a converter calibrated it)
        q = model.subgraphs[0].tensors[out].quantization
        q.scale, q.zeroPoint = [(hi - lo) / 255], [int(round(-128 - lo * 255 / (hi - lo)))]
    q8 = str(tmp_path / 'q8.circle')
    write_with_weights(str(tmp_path / 'f' / 'int8.circle'), q8, {}, edit=edit)
    d = str(tmp_path / 'o')
    assert prepare(q8, d, data=str(tmp_path / 'd.npz'), loss='mse', lr=0.01, epochs=1,
                   log=none).get('int8')
    export(q8, os.path.join(d, 'weights.wof'), str(tmp_path / 'e.circle'))
    f, e = (read_model(v) for v in (q8, str(tmp_path / 'e.circle')))
    assert e.tensors[e.outputs[0]].quant['scale'] == f.tensors[f.outputs[0]].quant['scale']
    assert e.tensors[e.outputs[0]].quant['zero_point'] == \
        f.tensors[f.outputs[0]].quant['zero_point']
