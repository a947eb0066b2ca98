"""Updates under half a 1/256 weight step (issue 28) in the layers whose update is
rescaled per channel: convolutions (3x3, depthwise, pointwise; exact through their int8
fractions) and a per-channel Dense layer (stochastically rounded), at SGD batch 1 and 4,
with and without momentum.  Rounded to the nearest 1/256 step, every such update was 0,
each step: the weights, their fractions and velocities never moved.  Made in 1/65536 steps
and rounded to 1/256 with a dither, they move as the float gradient says on average.

The model is test_q8_sparse's (conv RELU -> depthwise RELU6 -> pointwise conv RELU ->
MEAN -> FC, per-channel weight scales), every layer trained; one sample over and over at
an lr where each step's largest update is 0.4/256 of a weight step, so the gradient
stays the float one of the step before (no int8 weight flips the forward pass)."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))
sys.path.insert(0, os.path.dirname(__file__))

from host_tools.prepare import quant  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from test_q8_sparse import build, _ref, _sample  # noqa: E402

STEPS = 48


def _expected(net, m, xq, label):
    """{layer index: dL/dW / s_W in 1/256 weight steps, shaped as the int8 weights}."""
    out = {}
    for i, (gW, _) in _ref(net, m, xq, label).items():
        sw = np.array(m['layers'][i]['sw'])
        L = net.layers[i]
        if L.k == quant.DW:             # [KH, KW, C]: the channel last
            u = gW / sw
        else:
            u = gW / sw.reshape((-1,) + (1,) * (gW.ndim - 1))
        out[i] = u.reshape(-1) * 256
    return out


def _held(L):
    """Layer L's weights in 1/256 steps: int8 times 256 less the fraction still to take
    (q8kern.upek's e), where kept."""
    w = np.frombuffer(bytes(L.w), np.int8).astype(np.float64) * 256
    return w - (np.frombuffer(bytes(L.wf), np.int8) if L.wf is not None else 0)


@pytest.mark.parametrize('batch,mu', [(1, 0.0), (4, 0.0), (1, 0.9), (4, 0.9)])
def test_updates_under_half_a_unit_move_per_channel_layers(tmp_path, batch, mu):
    """48 updates of one sample: every layer's weights (in 1/256 steps: int8 and
    fraction) move, in the float gradient's direction, and all of them by about lr
    STEPS dL/dW / s_W (with momentum, its velocities' sum; projected on it: 0.9-1.2 here,
    one dither a layer's step, so its weights' rounding errors move together).  Rounded to
    the nearest 1/256 step no weight moved (batch 4 and momentum until now; SGD at batch
    1 until h68a)."""
    g = read_model(build(str(tmp_path / 'm.tflite')))
    t = quant.meta(g, 'all', None, None)
    for d in t['layers']:       # (the FC's fractions too, as a float model's calibrated
        if d['k'] == quant.FC:  # as int8 keeps: its moves made exactly)
            d['wf'] = 1
    m = quant.write(g, str(tmp_path), 'all', t)
    with open(tmp_path / 'q8.json') as f:
        net = Q8Net(json.load(f), str(tmp_path / 'weights.wof'), mu)      # (as a board)
    net.setup('sgd', batch, momentum=mu)
    xq, label = _sample(0), 1
    ex = _expected(net, m, xq, label)
    kinds = sorted(net.layers[i].k for i in ex)
    assert kinds == sorted([quant.CONV, quant.CONV, quant.DW, quant.FC])
    assert all(len(m['layers'][i]['sw']) > 1 for i in ex)
    # the largest update of any layer 0.4/256 of a weight step (every one under 1/512)
    lr = 0.4 / max(np.abs(u).max() for u in ex.values())
    h0 = {i: _held(net.layers[i]) for i in ex}
    for _ in range(STEPS):
        if batch == 1:
            net.step(bytearray(xq), label, lr)
        else:
            for _ in range(batch):
                net.accum(bytearray(xq), label)
            net.apply(lr, 1.0 / batch)
    # w -= v each step, v = mu v + lr u: the sum of the velocities
    k = np.arange(1, STEPS + 1)
    total = lr * ((1 - mu ** k) / (1 - mu)).sum() if mu else lr * STEPS
    got, d, want = {}, [], []
    for i, u in ex.items():
        d.append(_held(net.layers[i]) - h0[i])
        want.append(-total * u)
        moved = d[-1] != 0
        got[(i, net.layers[i].k)] = (int(moved.sum()), len(u),
                                     int((np.sign(d[-1]) == np.sign(want[-1]))[moved].sum()))
    d, want = np.concatenate(d), np.concatenate(want)
    proj = float((d * want).sum() / (want * want).sum())
    # every layer moves (a few % of its weights at least), each weight that moved the way
    # the float gradient says (a dithered rounding never turns an update's sign), and
    # the whole by about as much
    assert all(n >= 4 and s == n for n, _, s in got.values()), got
    assert 0.6 < proj < 1.5, (proj, got)
