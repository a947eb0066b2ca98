"""Binary cross-entropy on the int8 path (utrain.q8reg's bce): a model ending in a sigmoid
(LOGISTIC) with 0/1 targets, the loss prepare picks for it, had trained dequantized in
float32 (a float model's --int8 refused it) though int8 is the fast path on a board
without ulab.  The final LOGISTIC is the loss's, as a final SOFTMAX is scce's: the net
ends at the logits, and bce applies the sigmoid in floats.  Checked: the loss and its
gradient against utrain.losses' bce from logits and finite differences; a float sigmoid
model --int8 and its int8 export trained natively both start at the float model's loss
(numpy) and learn; export puts the LOGISTIC back (TFLite Micro / ONERT evaluate the
board's loss); unix MicroPython trains the same bytes as the host."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT, assert_same_logs, board_and_host_runs, no_keep_best
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare import quant  # noqa: E402
from host_tools.prepare.infer import evaluate  # noqa: E402
from host_tools.prepare.pipeline import prepare, export  # noqa: E402
from host_tools.target import runner  # noqa: E402
from utrain import q8reg, losses  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from utrain.xnp import np as xnp  # noqa: E402

F32 = np.float32
MP = runner.find_micropython()


def _sigmoid_model(path, F=6, H=12, O=1, seed=0):
    """FC(H, relu) -> FC(O) -> LOGISTIC, float; returns (path, numpy logits of x)."""
    r = np.random.default_rng(seed)
    w1, w2 = (r.standard_normal((H, F)) * 0.4).astype(F32), (r.standard_normal((O, H)) * 0.4).astype(F32)
    b1, b2 = (r.standard_normal(H) * 0.1).astype(F32), (r.standard_normal(O) * 0.1).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    x, h, z, y = (b.tensor(n, [1, k]) for n, k in (('x', F), ('h', H), ('z', O), ('y', O)))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [H, F], data=w1), b.tensor('b1', [H], data=b1)], [h],
         fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', [O, H], data=w2), b.tensor('b2', [O], data=b2)], [z])
    b.op('LOGISTIC', [z], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path), lambda v: np.maximum(v @ w1.T + b1, 0) @ w2.T + b2


def _data(path, F=6, O=1, n=200):
    r = np.random.default_rng(1)
    x = r.standard_normal((n, F)).astype(F32)
    a = np.random.default_rng(2).standard_normal((F, O))
    y = (x @ a > 0).astype(F32)
    np.savez(path, x=x, y=y if O > 1 else y[:, 0])
    return os.fspath(path), x, y


def _bce(z, t):
    return float(np.mean(np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))))


def _rows(o):
    return [v.split(',') for v in open(os.path.join(o, 'train.log')).read().split()[1:]]


@pytest.mark.parametrize('O', [1, 3])
def test_bce_loss_and_gradient_as_the_float_path_and_finite_differences(tmp_path, O):
    src, _ = _sigmoid_model(tmp_path / 's.tflite', O=O)
    data, x, _ = _data(tmp_path / 'd.npz', O=O)
    o = str(tmp_path / 'o')
    # (no training: lr given so that prepare's lr probe, most of the test's time, does not run)
    prepare(src, o, data=data, epochs=0, int8=True, lr=0.01, log=lambda *a: None)
    with open(os.path.join(o, 'q8.json')) as f:
        m = json.load(f)
    net = Q8Net(m, os.path.join(o, 'weights.wof'))
    tr = type('T', (), {})()
    tr.net, tr.cfg = net, {'loss': 'bce', 'metric': 'accuracy'}
    q8reg.use(tr)
    r = np.random.default_rng(3)
    for i in range(4):
        xq = net.quantize_input(x[i].tolist())
        t = (r.random(O) > 0.5).astype(float).tolist()
        z = np.array(net.logits(xq))
        loss, hit, g = net.loss(xq, t, True)
        want, wg = losses.loss('bce', xnp.array([z.tolist()]), xnp.array([t]), from_logits=True)
        assert abs(loss - float(want)) < 1e-9 * max(1.0, abs(loss)), (loss, want)
        assert np.allclose(g, np.ravel(wg), atol=1e-12)
        assert hit == losses.metric('accuracy', xnp.array([z.tolist()]), xnp.array([t]), 'bce',
                                    from_logits=True)
        h = 1e-6
        fd = [(_bce(z + h * e, t) - _bce(z - h * e, t)) / (2 * h) for e in np.eye(O)]
        assert np.allclose(g, fd, atol=1e-6), (g, fd)
    net.close()


def test_a_sigmoid_model_trains_bce_as_int8_and_exports_its_sigmoid(tmp_path):
    src, logits = _sigmoid_model(tmp_path / 's.tflite')
    data, x, y = _data(tmp_path / 'd.npz')
    from host_tools.files.dataset import split
    te = split(len(x), 0.25, 0)[1]
    o = str(tmp_path / 'f')
    s = prepare(src, o, data=data, test_split=0.25, epochs=3, int8=True, optimizer='sgd', lr=0.1,
                batch=1, log=lambda *a: None)
    assert s['int8'] and s['settings']['loss'] == 'bce', s['settings']
    assert json.load(open(os.path.join(o, 'prepare.json')))['sigmoid_loss']
    g8 = read_model(os.path.join(o, 'int8.circle'))
    m = json.load(open(os.path.join(o, 'q8.json')))
    assert m['layers'][-1]['k'] != 0 or len(m['layers']) == 2, m['layers']     # (no LUT at the end)
    assert m['nclass'] == 1 and [op.name for op in g8.ops][-1] == 'LOGISTIC'
    no_keep_best(o)
    code, out = runner.run(o, python=True, stream=False)
    assert code == 0, out
    rows = _rows(o)
    ref = _bce(logits(x[te].astype(np.float64)), y[te])
    assert abs(float(rows[0][3]) - ref) < 0.03 + 0.05 * ref, (rows[0], ref)
    assert float(rows[-1][3]) < 0.7 * float(rows[0][3]), rows
    # export: float32 again, its LOGISTIC in place (ONERT), and --quantized (TFLite Micro)
    np.savez(tmp_path / 't.npz', x=x[te], y=y[te])
    for q, name in ((False, 'out.tflite'), (True, 'q.tflite')):
        export(src, os.path.join(o, 'trained.wof'), str(tmp_path / name), quantized=q)
        assert read_model(str(tmp_path / name)).ops[-1].name == 'LOGISTIC'
        got = evaluate(str(tmp_path / name), str(tmp_path / 't.npz'))
        assert got['loss_name'] == 'binary cross-entropy'
        assert abs(got['loss'] - float(rows[-1][3])) < 0.03 + 0.1 * got['loss'], (q, got, rows[-1])
    # the int8 export, trained natively as int8 (not dequantized): from its loss, it learns
    q = str(tmp_path / 'q.tflite')
    o2 = str(tmp_path / 'n')
    said = []
    s2 = prepare(q, o2, data=data, test_split=0.25, epochs=2, optimizer='sgd', lr=0.05, batch=1,
                 train='all', log=said.append)
    assert s2['int8'] and not any('dequantized' in v for v in said), said
    no_keep_best(o2)
    code, out = runner.run(o2, python=True, stream=False)
    assert code == 0, out
    r2 = _rows(o2)
    assert abs(float(r2[0][3]) - float(rows[-1][3])) < 0.1, (r2, rows[-1])
    export(q, os.path.join(o2, 'trained.wof'), str(tmp_path / 'q2.tflite'))
    got = evaluate(str(tmp_path / 'q2.tflite'), str(tmp_path / 't.npz'))
    assert abs(got['loss'] - float(r2[-1][3])) < 0.03 + 0.1 * got['loss'], (got, r2[-1])


def test_bce_on_a_softmax_or_a_plain_output_says_what_to_do(tmp_path):
    """bce needs a final sigmoid (or --from-logits): on outputs that are neither, the
    int8 path's refusal says so (the float model keeps float32)."""
    s = {'loss': 'bce', 'optimizer': 'sgd', 'momentum': 0.0}
    b = CircleBuilder(identifier=b'TFL3')
    x, z = b.tensor('x', [1, 4]), b.tensor('z', [1, 2])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [2, 4], data=np.ones((2, 4), F32)),
                             b.tensor('b', [2], data=np.zeros(2, F32))], [z], fused_activation_function='RELU')
    b.inputs(x)
    b.outputs(z)
    g = read_model(b.save(str(tmp_path / 'r.tflite')))
    why = quant.loss_refusal(s, g)
    assert why and 'sigmoid' in why and '--from-logits' in why and '--dequantize' in why
    assert quant.loss_refusal(dict(s, from_logits=True), g) is None


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_int8_bce_trains_on_micropython_as_on_the_host(tmp_path):
    src, _ = _sigmoid_model(tmp_path / 's.tflite', O=3)
    data, _, _ = _data(tmp_path / 'd.npz', O=3, n=40)
    o = str(tmp_path / 'q')
    prepare(src, o, data=data, test_split=0.25, epochs=2, int8=True, optimizer='adam', lr=0.01,
            batch=4, log=lambda *a: None)
    (wa, _, la), (wb, _, lb) = board_and_host_runs(o, 'trained.wof')
    assert wa == wb and len(la) == 4, la
    assert_same_logs(la, lb)
