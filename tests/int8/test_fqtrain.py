"""bench/fqtrain.py, the float trainer bench/sparse.py --split measures the int8/float gap
with: its gradients against finite differences of its own loss (the float model), the
windows it trains, and the int8 model's grid in its fake-quantized modes.  On the tail of
the zoo's MobileNetV2-0.35 digits model from op 62 (CONV_2D 1x1, DEPTHWISE_CONV_2D 3x3,
CONV_2D, CONV_2D, MEAN, FULLY_CONNECTED), random inputs."""
import os

import numpy as np
import pytest

from repo import ROOT  # noqa: F401
from bench.fqtrain import FQNet
from host_tools.formats.circle_io import read_model

MODEL = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mobilenetv2_035_96_digits_int8.tflite')
TRAINS = {62: (0, 168), 63: (0, 0), 64: (0, 0), 65: (0, 0), 67: (0, 10)}


@pytest.fixture(scope='module')
def graph():
    return read_model(MODEL)


def sample(g, seed=0):
    t = g.tensors[g.ops[62].inputs[0]]
    return np.random.default_rng(seed).uniform(-2, 2, t.shape[1:])


def loss(n, x, y):
    z = n.forward(x, 62)
    return np.log(np.exp(z - z.max()).sum()) - (z[y] - z.max())


def test_float_gradients_match_finite_differences_and_only_windows_move(graph):
    x, y, lr = sample(graph), 7, 1.0
    n = FQNet(graph, TRAINS)
    W0 = {i: n.W[i].copy() for i in n.W}
    B0 = {i: n.B[i].copy() for i in n.B}
    n.step(x, y, lr, start=62)
    gW = {i: (W0[i] - n.W[i]) / lr for i in n.W}
    gB = {i: (B0[i] - n.B[i]) / lr for i in n.B}
    assert np.all(gW[62][168:] == 0) and np.any(gW[62][:168])      # the window's rows
    assert np.all(gB[62][168:] == 0)
    for i in (63, 64, 65):                                         # biases alone
        assert np.all(gW[i] == 0) and np.any(gB[i])
    rng = np.random.default_rng(1)
    ref = FQNet(graph, TRAINS)
    checked = 0
    for i, which in [(62, 'W'), (67, 'W'), (62, 'B'), (63, 'B'), (64, 'B'), (65, 'B'),
                     (67, 'B')]:
        P = getattr(ref, which)[i]
        G = (gW if which == 'W' else gB)[i]
        cand = np.argwhere(np.abs(G) > 1e-4 * np.abs(G).max())
        for k in cand[rng.choice(len(cand), min(3, len(cand)), replace=False)]:
            k = tuple(k)
            v, e = P[k], 1e-6
            P[k] = v + e
            up = loss(ref, x, y)
            P[k] = v - e
            dn = loss(ref, x, y)
            P[k] = v
            assert (up - dn) / (2 * e) == pytest.approx(G[k], rel=1e-3, abs=1e-7), (i, which, k)
            checked += 1
    assert checked >= 15


def test_fake_quantized_modes_hold_the_int8_grid(graph):
    x = sample(graph, 2)
    n = FQNet(graph, TRAINS, act=True, wq=True)
    n.forward(x, 62, keep=True)
    for i, xin, m, aux in n.saved[1:]:         # each op's input: an op's int8 output
        q = graph.tensors[n.ops[i].inputs[0]].quant
        v = xin / q['scale'][0] + q['zero_point'][0]
        assert np.allclose(v, np.round(v), atol=1e-6) and v.min() >= -128 and v.max() <= 127
    n.W[62] += 0.3 * n.sw[62][:, None, None, None]      # 0.3 of a step: the grid rounds it away
    W, _ = n._w(62)
    assert np.allclose(W / n.sw[62][:, None, None, None],
                       np.round(W / n.sw[62][:, None, None, None]), atol=1e-9)
    f = FQNet(graph, TRAINS)                   # the float mode: off the grid
    f.forward(x, 62, keep=True)
    xin = f.saved[2][1]
    q = graph.tensors[f.ops[64].inputs[0]].quant
    v = xin / q['scale'][0]
    assert not np.allclose(v, np.round(v), atol=1e-3)
