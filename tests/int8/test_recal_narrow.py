"""int8 files whose activation ranges were calibrated on data much smaller than the
samples they are trained on (issue 28: a Keras int8 file valid under TFLite Micro, whose
float twin learnt, did not learn as int8: its last Dense, before a sigmoid and a MUL, had
every output at 127 on the user's samples, the MUL's output too).  prepare widens every
range that clips, the ops' outputs TFLite requantizes (ADD, MUL, MEAN, ...) as well as
the weighted layers', as many times as it takes (not 3 at most), ties a
CONCATENATION's inputs to its output (TFLite Micro refuses others), gives a range on one
side of 0 room on the other, and widens the input of a sigmoid to the span its int8
output changes over.  The models are built here (tests/support/kerasgraphs.py
build_int8_narrow: MLP, CNN with a residual ADD, two inputs); the reference is each
model's float forward on the training samples."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare import quant, recal  # noqa: E402
from host_tools.prepare.pipeline import prepare, export  # noqa: E402
from host_tools.target import runner  # noqa: E402
from kerasgraphs import build_int8_narrow  # noqa: E402


def _case(tmp_path, kind, cal=1 / 16, shift=0.0, n=160):
    """The model, its float forward, its training samples (N(0, 1): 1 / cal times the
    calibration data) in an .npz, the samples."""
    path, acts, ins = build_int8_narrow(tmp_path / f'{kind}.tflite', kind, cal=cal, shift=shift)
    r = np.random.default_rng(1)
    xs = {k: r.standard_normal((n, *s)).astype(np.float32) for k, s in ins.items()}
    first = next(iter(xs.values())).reshape(n, -1)
    if kind == 'two':       # (a sigmoid head: targets near 0 where shift puts the logits above)
        y = 4 / (1 + np.exp(-(first[:, 0] + first[:, 1] - 2 * shift)))
    else:
        y = 0.5 * acts(xs)['y'][:, 0] + 0.5 * first[:, 0] + 0.2 * first[:, 1]
    data = str(tmp_path / f'{kind}.npz')
    np.savez(data, y=y.astype(np.float32), **xs)
    return path, acts, data, xs


def _outside(g, acts, xs):
    """{tensor name: the share of the float model's values on samples xs outside what
    the int8 tensor holds (beyond its ends by more than a step)} for g's activations."""
    out = {}
    for t in g.tensors:
        v = acts(xs).get(t.name)
        if v is None or t.data is not None:
            continue
        s, z = float(t.quant['scale'][0]), int(t.quant['zero_point'][0])
        out[t.name] = float(((v < (-129 - z) * s) | (v > (128 - z) * s)).mean())
    return out


def _prepared(tmp_path, path, data, **kw):
    q = str(tmp_path / 'q8')
    said = []
    prepare(path, q, data=data, test_split=0.25, optimizer='sgd', lr=0.01, epochs=6,
            log=said.append, **kw)
    g = quant.rewritten(read_model(path))       # (as export reads it: the narrow logits widened)
    recal.replay(g, q)
    return q, g, said


@pytest.mark.parametrize('kind,cal', [('mlp', 1 / 16), ('cnn', 1 / 32), ('two', 1 / 16)])
def test_no_range_clips_the_float_models_values_after_prepare(tmp_path, kind, cal):
    """Before: a quarter or more of some layer's values (the float model's) lie outside
    its int8 range.  After prepare, none outside by more than 2 % in any layer: the MLP's
    output MUL, the CNN's residual ADD and MEAN, the two-input model's MUL among them
    (main widened FC / CONV outputs alone, x8 at most, and left these clipping)."""
    path, acts, data, xs = _case(tmp_path, kind, cal)
    before = _outside(read_model(path), acts, xs)
    assert max(before.values()) > 0.25, before
    q, g, said = _prepared(tmp_path, path, data)
    after = _outside(g, acts, xs)
    assert max(after.values()) < 0.02, (after, said)
    widened = [v for v in said if 'range widened' in str(v)]
    assert widened and all(' -> ' in v and ' after' in v for v in widened), said


def test_a_one_sided_range_before_a_sigmoid_gets_room_below_0(tmp_path):
    """The Keras Microplastic model's head, built here: the Dense before the sigmoid was
    calibrated at [0, 2.3] (every calibration logit above 0) and clips at its top on the
    training samples; widened, its range reaches the sigmoid's input span on both sides
    (about +-6: past it the int8 sigmoid's output does not change), since the board
    cannot follow a range a LOGISTIC reads (its table is the host's)."""
    path, acts, data, xs = _case(tmp_path, 'two', shift=2.0)
    z = read_model(path).tensors[[t.name for t in read_model(path).tensors].index('z')].quant
    assert z['zero_point'] == [-128]        # (the file's: [0, 2.3])
    q, g, said = _prepared(tmp_path, path, data)
    t = g.tensors[[t.name for t in g.tensors].index('z')]
    s, zp = float(t.quant['scale'][0]), int(t.quant['zero_point'][0])
    assert (-128 - zp) * s <= -5.5 and (127 - zp) * s >= 2.3, (s, zp)     # (down to -6.2)


def _tflm_matches_the_net(q, dst, xs, n=6):
    """The exported model under TFLite Micro gives the board's int8 net's outputs (the
    trained weights) on the first n samples xs, bit for bit."""
    from tflite_micro.python.tflite_micro import runtime
    from utrain.q8 import Q8Net
    it = runtime.Interpreter.from_file(dst)
    with open(os.path.join(q, 'q8.json')) as f:
        net = Q8Net(json.load(f), os.path.join(q, 'weights.wof'))
    net.load_weights(os.path.join(q, 'trained.wof'))
    g = read_model(dst)
    for j in range(n):
        codes = []
        for i, k in enumerate(g.inputs):
            v = xs[g.tensors[k].name][j].reshape(-1)
            c = np.clip(np.round(v / (8 / 255)), -128, 127).astype(np.int8)
            it.set_input(c.reshape(g.tensors[k].shape), i)
            codes.append(c)
        it.invoke()
        got = np.frombuffer(bytes(net.forward(bytearray(np.concatenate(codes).tobytes()))), np.int8)
        assert np.array_equal(got, it.get_output(0).ravel()), j
    net.close()


def _mae(dst, xs, y):
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(dst)
    g = read_model(dst)
    o = g.tensors[g.outputs[0]].quant
    err = []
    for j in range(len(y)):
        for i, k in enumerate(g.inputs):
            v = xs[g.tensors[k].name][j].reshape(g.tensors[k].shape)
            it.set_input(np.clip(np.round(v / (8 / 255)), -128, 127).astype(np.int8), i)
        it.invoke()
        out = (float(it.get_output(0).ravel()[0]) - o['zero_point'][0]) * o['scale'][0]
        err.append(abs(out - y[j]))
    return float(np.mean(err))


@pytest.mark.parametrize('kind,shift', [('mlp', 0.0), ('two', 2.0)])
def test_it_learns_as_int8_and_the_export_runs_under_tflite_micro(tmp_path, kind, shift):
    """Trained as int8 (the board's integers on the host), the exported model's error
    under TFLite Micro falls below half the file's (main: the MLP's 0.71 -> 0.57, its
    output MUL clipping; the two-input head stuck at 4 sigmoid(0) = 2 where its logits'
    range ended at 0, and its export refused by TFLite Micro's CONCATENATION), and
    TFLite Micro computes what the board's net computes."""
    pytest.importorskip('tflite_micro')
    path, acts, data, xs = _case(tmp_path, kind, shift=shift)
    q, g, said = _prepared(tmp_path, path, data)
    code, out = runner.run(q, python=True, stream=False)
    assert code == 0, out
    dst = str(tmp_path / 'trained.tflite')
    export(path, os.path.join(q, 'trained.wof'), dst)
    _tflm_matches_the_net(q, dst, xs)
    y = np.load(data)['y']
    before, after = _mae(path, xs, y), _mae(dst, xs, y)
    assert after < 0.5 * before, (before, after, said)


def test_a_range_widening_cannot_reach_is_said(tmp_path, monkeypatch):
    """Where MAXK doublings of a range (here 2: the MLP's first layer needs 16x) leave it
    clipping, prepare says which layer, how much of it and that those outputs pass no
    gradient."""
    monkeypatch.setattr(recal, 'MAXK', 2, raising=False)
    path, acts, data, xs = _case(tmp_path, 'mlp')
    q, g, said = _prepared(tmp_path, path, data)
    msg = [v for v in said if 'cannot widen further' in str(v)]
    assert msg and 'op 0 FULLY_CONNECTED' in msg[0] and 'still clipping at 4x' in msg[0] and \
        'widened x4' in msg[0] and '% at 127 after' in msg[0], said
