"""The host simulation's fast path (numpy: whole-array optimizer steps, max pools and
convolutions in one gather, utrain/xnumpy.py) against the board's steps under the same
backend (host_tools.target.device.board_steps: a row at a time, a tap at a time): the same
training to float rounding, on small models of our own (FC; conv with padding and
stride, overlapping and disjoint max pools, depthwise with a multiplier), batch 1 and 4,
SGD and Adam."""
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, ROOT)

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.target.device import board_steps, module  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402


def _w(rng, *shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def build(path, kind, seed=4):
    """fc: x[1,12] -> FC 10 RELU -> FC 4.  cnn: x[1,7,7,2] -> CONV 3x3 SAME 4 RELU ->
    MAX_POOL 3x3 s2 SAME (overlapping) -> DEPTHWISE 3x3 x2 SAME RELU -> MAX_POOL 2x2 s2
    VALID -> CONV 2x2 s2 SAME 6 -> RESHAPE -> FC 4."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    if kind == 'fc':
        x = b.tensor('x', [1, 12])
        w1, b1 = b.tensor('w1', [10, 12], data=_w(rng, 10, 12)), b.tensor('b1', [10], data=_w(rng, 10))
        h = b.tensor('h', [1, 10])
        b.op('FULLY_CONNECTED', [x, w1, b1], [h], fused_activation_function='RELU')
        cur, n = h, 10
    else:
        x = b.tensor('x', [1, 7, 7, 2])
        w = b.tensor('cw', [4, 3, 3, 2], data=_w(rng, 4, 3, 3, 2))
        bb = b.tensor('cb', [4], data=_w(rng, 4))
        y1 = b.tensor('y1', [1, 7, 7, 4])
        b.op('CONV_2D', [x, w, bb], [y1], padding='SAME', stride_h=1, stride_w=1,
             dilation_h_factor=1, dilation_w_factor=1, fused_activation_function='RELU')
        p1 = b.tensor('p1', [1, 4, 4, 4])
        b.op('MAX_POOL_2D', [y1], [p1], padding='SAME', stride_h=2, stride_w=2,
             filter_height=3, filter_width=3, fused_activation_function='NONE')
        dw = b.tensor('dw', [1, 3, 3, 8], data=_w(rng, 1, 3, 3, 8))
        db = b.tensor('db', [8], data=_w(rng, 8))
        y2 = b.tensor('y2', [1, 4, 4, 8])
        b.op('DEPTHWISE_CONV_2D', [p1, dw, db], [y2], padding='SAME', stride_h=1, stride_w=1,
             dilation_h_factor=1, dilation_w_factor=1, depth_multiplier=2,
             fused_activation_function='RELU')
        p2 = b.tensor('p2', [1, 2, 2, 8])
        b.op('MAX_POOL_2D', [y2], [p2], padding='VALID', stride_h=2, stride_w=2,
             filter_height=2, filter_width=2, fused_activation_function='NONE')
        w3 = b.tensor('w3', [6, 2, 2, 8], data=_w(rng, 6, 2, 2, 8))
        b3 = b.tensor('b3', [6], data=_w(rng, 6))
        y3 = b.tensor('y3', [1, 1, 1, 6])
        b.op('CONV_2D', [p2, w3, b3], [y3], padding='SAME', stride_h=2, stride_w=2,
             dilation_h_factor=1, dilation_w_factor=1, fused_activation_function='NONE')
        cur, n = b.tensor('f', [1, 6]), 6
        b.op('RESHAPE', [y3], [cur], new_shape=[1, 6])
    w2, b2 = b.tensor('w2', [4, n], data=_w(rng, 4, n)), b.tensor('b2', [4], data=_w(rng, 4))
    out = b.tensor('out', [1, 4])
    b.op('FULLY_CONNECTED', [cur, w2, b2], [out])
    b.inputs(x)
    b.outputs(out)
    return b.save(path)


def train(folder, epochs=2):
    """(loss and metric per epoch, test (loss, metric), trained weights) of the prepared
    folder under the host simulation, in this process."""
    Trainer, Dataset = module('trainer').Trainer, module('data').Dataset
    tr = Trainer(os.path.join(folder, 'model.flat'), os.path.join(folder, 'weights.wof'))
    train, test = Dataset(os.path.join(folder, 'train.ds')), Dataset(os.path.join(folder, 'test.ds'))
    try:
        hist = [tr.train_epoch(train) for _ in range(epochs)]
        ev = tr.evaluate(test)
    finally:
        train.close()
        test.close()
    return hist, ev, {k: np.array(v, dtype=np.float64) for k, v in tr.weights().items()}


@pytest.mark.parametrize('kind', ['fc', 'cnn'])
@pytest.mark.parametrize('optimizer,lr', [('sgd', 0.05), ('adam', 0.01)])
@pytest.mark.parametrize('batch', [1, 4])
def test_fast_path_trains_as_the_board_steps(tmp_path, kind, optimizer, lr, batch):
    if module('xnp').BACKEND != 'numpy':
        pytest.skip('the fast path is numpy\'s')
    model = build(str(tmp_path / 'm.circle'), kind)
    rng = np.random.default_rng(9)
    n = 24
    x = rng.standard_normal((n, 12) if kind == 'fc' else (n, 7, 7, 2)).astype(np.float32)
    y = rng.integers(0, 4, n)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    folder = str(tmp_path / 'run')
    prepare(model, folder, data=str(tmp_path / 'd.npz'), test_split=0.25, loss='scce',
            from_logits=True, optimizer=optimizer, lr=lr, batch=batch, epochs=2, shuffle=True,
            seed=3, log=lambda *a: None)
    fast = train(folder)
    with board_steps():
        slow = train(folder)
    for (l1, m1), (l0, m0) in zip(fast[0], slow[0]):
        assert l1 == pytest.approx(l0, rel=1e-5, abs=1e-6) and m1 == m0
    assert fast[1][0] == pytest.approx(slow[1][0], rel=1e-5, abs=1e-6)
    assert fast[1][1] == slow[1][1]
    start = train(folder, epochs=0)[2]
    assert fast[2].keys() == slow[2].keys() == start.keys() and start
    for k in fast[2]:
        np.testing.assert_allclose(fast[2][k], slow[2][k], rtol=1e-5, atol=1e-6)
    # training moved every weight: the two paths agree on doing something
    assert min(np.abs(fast[2][k] - start[k]).max() for k in start) > 1e-3
