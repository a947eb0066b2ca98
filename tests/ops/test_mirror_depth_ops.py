"""MIRROR_PAD (tf.pad REFLECT / SYMMETRIC) and DEPTH_TO_SPACE / SPACE_TO_DEPTH (a
sub-pixel convolution's upsampling) as the TFLite converter writes them (issue 28): they
were refused ('cannot run or train through yet').  prepare spells them with ops that
train (GATHERs read as slices and a concatenation; channel slices, RESHAPEs and a
concatenation): utrain's
forward equals numpy's (np.pad, the block moves written out), float and int8, and a run
trains and exports."""
import os

import numpy as np
import pytest

from host_tools.formats.circle_build import CircleBuilder
from host_tools.formats.circle_io import read_model
from host_tools.prepare.pipeline import export, prepare
from host_tools.target.runner import run
from test_parity import new_trainer, utrain_predict

F32 = np.float32
PADS = [[0, 0], [1, 2], [2, 1], [0, 0]]


def d2s(x, b):
    n, h, w, c = x.shape
    return x.reshape(n, h, w, b, b, c // (b * b)).transpose(0, 1, 3, 2, 4, 5) \
        .reshape(n, h * b, w * b, c // (b * b))


def s2d(x, b):
    n, h, w, c = x.shape
    return x.reshape(n, h // b, b, w // b, b, c).transpose(0, 1, 3, 2, 4, 5) \
        .reshape(n, h // b, w // b, b * b * c)


def build(path, int8=False):
    """x [1, 4, 4, 2] -> MIRROR_PAD REFLECT -> CONV 1x1 (8) -> DEPTH_TO_SPACE 2 ->
    MIRROR_PAD SYMMETRIC -> SPACE_TO_DEPTH 2 -> MEAN over H, W -> FC [1, 3]; int8: the
    same with int8 activations (scales wide enough).  Returns (path, numpy forward)."""
    r = np.random.default_rng(0)
    w = (0.5 * r.standard_normal((8, 1, 1, 2))).astype(F32)
    wf = (0.5 * r.standard_normal((3, 8))).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    dt = 'int8' if int8 else 'float32'
    q = (lambda s: {'scale': [s], 'zero_point': [0]}) if int8 else (lambda s: None)
    x = b.tensor('x', [1, 4, 4, 2], dtype=dt, quant=q(0.03))
    p1 = b.tensor('p1', [1, 7, 7, 2], dtype=dt, quant=q(0.03))
    b.op('MIRROR_PAD', [x, b.tensor('pads1', [4, 2], data=np.int32(PADS))], [p1], mode='REFLECT')
    c = b.tensor('c', [1, 7, 7, 8], dtype=dt, quant=q(0.05))
    if int8:
        wq = b.tensor('w', [8, 1, 1, 2], dtype='int8', data=np.round(w / 0.01).astype(np.int8),
                      quant={'scale': [0.01], 'zero_point': [0]})
        bq = b.tensor('b', [8], dtype='int32', data=np.zeros(8, np.int32),
                      quant={'scale': [0.0003], 'zero_point': [0]})
    else:
        wq, bq = b.tensor('w', [8, 1, 1, 2], data=w), b.tensor('b', [8], data=np.zeros(8, F32))
    b.op('CONV_2D', [p1, wq, bq], [c], padding='VALID', stride_w=1, stride_h=1,
         fused_activation_function='NONE')
    d = b.tensor('d', [1, 14, 14, 2], dtype=dt, quant=q(0.05))
    b.op('DEPTH_TO_SPACE', [c], [d], block_size=2)
    p2 = b.tensor('p2', [1, 16, 16, 2], dtype=dt, quant=q(0.05))
    b.op('MIRROR_PAD', [d, b.tensor('pads2', [4, 2], data=np.int32([[0, 0], [1, 1], [0, 2], [0, 0]]))],
         [p2], mode='SYMMETRIC')
    s = b.tensor('s', [1, 8, 8, 8], dtype=dt, quant=q(0.05))
    b.op('SPACE_TO_DEPTH', [p2], [s], block_size=2)
    m = b.tensor('m', [1, 8], dtype=dt, quant=q(0.02))
    b.op('MEAN', [s, b.tensor('axes', [2], data=np.int32([1, 2]))], [m], keep_dims=False)
    y = b.tensor('y', [1, 3], dtype=dt, quant=q(0.02))
    if int8:
        fw = b.tensor('wf', [3, 8], dtype='int8', data=np.round(wf / 0.01).astype(np.int8),
                      quant={'scale': [0.01], 'zero_point': [0]})
        fb = b.tensor('bf', [3], dtype='int32', data=np.zeros(3, np.int32),
                      quant={'scale': [0.0002], 'zero_point': [0]})
    else:
        fw, fb = b.tensor('wf', [3, 8], data=wf), b.tensor('bf', [3], data=np.zeros(3, F32))
    b.op('FULLY_CONNECTED', [m, fw, fb], [y], fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xs):
        h = np.pad(xs.astype(np.float64), PADS, mode='reflect')
        h = d2s(h @ w[:, 0, 0, :].T, 2)
        h = s2d(np.pad(h, [[0, 0], [1, 1], [0, 2], [0, 0]], mode='symmetric'), 2)
        return h.mean((1, 2)) @ wf.T
    return os.fspath(path), forward


@pytest.mark.parametrize('int8', [False, True])
def test_mirror_pads_and_depth_moves_run_as_numpy_and_train(tmp_path, int8):
    src, forward = build(tmp_path / 'm.tflite', int8)
    r = np.random.default_rng(1)
    x = (0.5 * r.standard_normal((8, 4, 4, 2))).astype(F32)
    np.savez(tmp_path / 'd.npz', x=x, y=r.integers(0, 3, 8))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
            from_logits=True, optimizer='sgd', lr=0.05, batch=1, epochs=2,
            int8=None if int8 else False, log=lambda *a: None)
    if not int8:
        tr = new_trainer(out / 'model.flat', out / 'weights.wof')
        np.testing.assert_allclose(utrain_predict(tr, x, [1, 4, 4, 2]), forward(x),
                                   rtol=1e-5, atol=1e-6)
    code, text = run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    assert 'loss' in text and 'nan' not in text
    dst = os.fspath(tmp_path / 'trained.tflite')
    export(src, os.fspath(out / 'trained.wof'), dst)
    assert read_model(dst).ops
    if not int8:
        from onert_ref import onert_infer
        tr = new_trainer(out / 'model.flat', out / 'trained.wof')
        got = utrain_predict(tr, x, [1, 4, 4, 2])
        assert np.abs(got - forward(x)).max() > 1e-3           # (it trained)
        np.testing.assert_allclose(onert_infer(dst, x), got, rtol=1e-4, atol=1e-5)
