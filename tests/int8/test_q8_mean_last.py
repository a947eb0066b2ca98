"""Issue 28: an int8 MEAN over the last axis of a sequence [1, T, C] (Keras's
LayerNormalization on a sequence: its mean and variance over C) made int8 training fall
back to float ("int8 training reduces the leading axes that are not 1").  prepare reads
it through a TRANSPOSE that puts the reduced axis first (quant._trailing_means): the
logits are TFLite Micro's bit for bit, and one SGD step moves the Dense layer before it
by lr times the finite differences of the float forward of the dequantized graph."""
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from q8cases import tflm_agrees  # noqa: E402
from test_q8 import spy_updates  # noqa: E402
from test_q8_cat import _fd_grad  # noqa: E402
from test_q8_prelu_l2 import _table  # noqa: E402

T, C, F, O = 5, 4, 6, 3
SX, S1, SH, SM, S2, SY = 0.05, 0.004, 0.03, 0.02, 0.01, 0.1
ZH, ZM = -128, -20


def _build(path, seed=0):
    """x int8 [1, T, C] -> FC keep_num_dims RELU (op 0) -> h [1, T, F] -> MEAN over axis 2,
    keep_dims (op 1) -> [1, T, 1] -> RESHAPE [1, T] -> FC (op 3) -> y [1, O].  Returns
    (path, float forward of the dequantized graph f(x [T, C], w1 float) -> logits)."""
    r = np.random.default_rng(seed)
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = r.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = r.integers(-300, 900, F).astype(np.int32)
    w2 = r.integers(-127, 128, (O, T)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(SX, 0))
    h = b.tensor('h', [1, T, F], dtype='int8', quant=q(SH, ZH))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(S1, 0)),
                             b.tensor('b1', [F], data=b1, quant=q(SX * S1, 0))], [h],
         fused_activation_function='RELU', keep_num_dims=True)
    m = b.tensor('m', [1, T, 1], dtype='int8', quant=q(SM, ZM))
    b.op('MEAN', [h, b.tensor('ax', [1], data=np.array([2], np.int32))], [m], keep_dims=True)
    f = b.tensor('f', [1, T], dtype='int8', quant=q(SM, ZM))
    b.op('RESHAPE', [m, b.tensor('rs', [2], data=np.array([1, T], np.int32))], [f])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(SY, 0))
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', w2.shape, data=w2, quant=q(S2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xf, wf):
        hf = np.clip(np.maximum(xf @ wf.T + b1 * SX * S1, 0), None, (127 - ZH) * SH)
        return (w2 * S2) @ hf.mean(-1)
    return os.fspath(path), forward, w1


def test_mean_over_the_last_axis_trains_as_int8(tmp_path, monkeypatch):
    path, fwd, w1 = _build(tmp_path / 'm.tflite')
    g, m = _table(tmp_path, path)
    assert [op.name for op in g.ops][:3] == ['FULLY_CONNECTED', 'TRANSPOSE', 'MEAN']
    r = np.random.default_rng(1)
    tflm_agrees(path, Q8Net(m, str(tmp_path / 'weights.wof')),
                [r.integers(-128, 128, (T, C)).astype(np.int8) for _ in range(40)], 21)
    spy = spy_updates(monkeypatch)
    w0 = w1.astype(np.float64) * S1
    for i in range(3):
        xq = r.integers(-120, 121, (T, C)).astype(np.int8)
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        spy.clear()
        net.step(bytearray(xq.tobytes()), i, 0.01)
        assert len(spy) == 2
        upd = spy[-1] / 256.0 * S1                      # (w1: the last in backward order)
        ref = 0.01 * _fd_grad(fwd, xq.astype(np.float64) * SX, w0, i, 1e-5)
        assert 0.8 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.25, i
        assert upd @ ref / (np.linalg.norm(upd) * np.linalg.norm(ref)) > 0.95, i


def test_a_float_model_with_it_trains_as_int8_with_int8(tmp_path):
    """The same form in a float model given --int8 (a tico / Keras sequence model with a
    LayerNorm): refused before ('--int8 cannot train it as int8: MEAN op 1 reduces axes
    [2] ...'); now calibrated and trained as int8."""
    from host_tools.prepare.pipeline import prepare
    r = np.random.default_rng(2)
    w1, b1 = r.standard_normal((F, C)).astype(np.float32), r.standard_normal(F).astype(np.float32)
    w2, b2 = r.standard_normal((O, T)).astype(np.float32), r.standard_normal(O).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x, h, m, f, y = (b.tensor(n, s) for n, s in (('x', [1, T, C]), ('h', [1, T, F]), ('m', [1, T, 1]),
                                                  ('f', [1, T]), ('y', [1, O])))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [F], data=b1)], [h],
         fused_activation_function='RELU', keep_num_dims=True)
    b.op('MEAN', [h, b.tensor('ax', [1], data=np.array([2], np.int32))], [m], keep_dims=True)
    b.op('RESHAPE', [m, b.tensor('rs', [2], data=np.array([1, T], np.int32))], [f])
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [O], data=b2)], [y])
    b.inputs(x)
    b.outputs(y)
    path = b.save(str(tmp_path / 'f.tflite'))
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((24, T, C)).astype(np.float32), y=r.integers(0, O, 24))
    s = prepare(path, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), epochs=1, lr=0.01, int8=True,
                loss='scce', from_logits=True, log=lambda *a: None)
    assert s['int8'] and os.path.exists(tmp_path / 'run' / 'q8.json')
