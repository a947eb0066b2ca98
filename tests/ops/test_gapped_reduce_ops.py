"""A MEAN or SUM over axes that are not one run (Keras's GroupNormalization: moments over
axes [1, 2, 4] of [1, H, W, groups, C / groups]) had been refused ('the reduced axes
must be adjacent'): spellings.gapped_means moves the kept axes first and the reduced
last, reduces the trailing run, reshapes to the output.  Forward against float64 numpy,
gradients against central differences of the numpy forward."""
import os

import numpy as np
import pytest

import test_parity as tp  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

F, O = 6, 2


def _model(path, op, shape, axes, keep, seed=0):
    """x [1, F] -> FC W1 [n, F] -> RESHAPE shape -> h; op(h, axes, keep) -> m;
    keep: SUB(h, m) (a centring, as the group norm's) -> RESHAPE [1, n]; else m
    reshaped flat -> FC W2 -> y.  Returns (path, numpy forward(x, W1))."""
    n = int(np.prod(shape))
    rng = np.random.default_rng(seed)
    W1 = rng.normal(size=(n, F)).astype(np.float32)
    m_shape = [1 if d in axes else s for d, s in enumerate(shape)] if keep else \
        [s for d, s in enumerate(shape) if d not in axes]
    k = int(np.prod(m_shape)) if keep is False else n
    W2 = rng.normal(size=(O, k)).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, F])
    h0 = b.tensor('h0', [1, n])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [n, F], data=W1), -1], [h0],
         fused_activation_function='NONE')
    h = b.tensor('h', shape)
    b.op('RESHAPE', [h0, b.tensor('s1', [len(shape)], data=np.int32(shape))], [h])
    m = b.tensor('m', m_shape)
    b.op(op, [h, b.tensor('axes', [len(axes)], data=np.int32(axes))], [m], keep_dims=keep)
    if keep:
        c = b.tensor('c', shape)
        b.op('SUB', [h, m], [c], fused_activation_function='NONE')
        m = c
    f = b.tensor('f', [1, k])
    b.op('RESHAPE', [m, b.tensor('s2', [2], data=np.int32([1, k]))], [f])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', [O, k], data=W2), -1], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    red = np.mean if op == 'MEAN' else np.sum

    def forward(xi, w1=W1.astype(np.float64)):
        hv = (w1 @ xi.astype(np.float64)).reshape(shape)
        mv = red(hv, axis=tuple(axes), keepdims=bool(keep))
        return W2.astype(np.float64) @ (hv - mv if keep else mv).reshape(-1)
    return os.fspath(path), forward, W1.astype(np.float64)


@pytest.mark.parametrize('op,shape,axes,keep', [
    ('MEAN', [1, 3, 2, 2, 2], [1, 2, 4], True),      # GroupNormalization's moments
    ('MEAN', [1, 3, 2, 4], [1, 3], False),
    ('SUM', [1, 2, 3, 2], [1, 3], True)])
def test_gapped_reduction_forward_and_gradients(tmp_path, op, shape, axes, keep):
    from utrain.sink import Sums
    src, forward, W1 = _model(tmp_path / 'm.tflite', op, shape, axes, keep)
    x = np.random.default_rng(1).normal(size=(4, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((4, O), np.float32))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.1,
            log=lambda *a, **k: None)
    tr = tp.new_trainer(out / 'model.flat', out / 'weights.wof')
    np.testing.assert_allclose(tp.utrain_predict(tr, x, [1, F]),
                               np.stack([forward(xi) for xi in x]), rtol=1e-5, atol=1e-5)
    tr.net.sink = Sums(tr.net)
    tr.set_input(x[:1])
    tr.net.forward(True)
    dy = np.array([0.5, -1.5])
    tr.net.backward(dy[None].astype(np.float32))
    want = np.zeros_like(W1)
    for i in np.ndindex(*W1.shape):     # central differences of dy . y(W1)
        e = np.zeros_like(W1)
        e[i] = 1e-4
        want[i] = dy @ (forward(x[0], W1 + e) - forward(x[0], W1 - e)) / 2e-4
    g = read_model(os.fspath(out / 'rewritten.circle'))
    k = next(k for k in tr.net.trainable if g.tensors[k].shape == list(W1.shape))
    np.testing.assert_allclose(np.asarray(tr.net.sink.acc[k]).reshape(W1.shape), want,
                               rtol=1e-4, atol=1e-5)
