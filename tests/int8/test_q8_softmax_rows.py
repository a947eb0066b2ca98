"""int8 SOFTMAX inside the graph (utrain.q8smx) over long rows (issue 28: rows of more
than 256 had been refused, the kernel's int32 sums allowing 4095 terms of at most 2^19):
the forward against the float softmax of the dequantized input (within the output's
1/256 step), the gradient against y (g - sum y g) in float, rows of 300, 1000, 4000 and
4095; 4096 refused (the all-equal row's sum would be 2^31)."""
import os
import sys
from array import array
from types import SimpleNamespace as NS

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from utrain import q8smx  # noqa: E402


def layer(n, rows, sx):
    x = NS(shape=[1, rows, n])
    op = NS(number=0, inputs=[0], options={'beta': 1.0}, outputs=[1], name='SOFTMAX')
    g = NS(path='m.tflite', ops=[op], outputs=[2], tensors=[x])
    d = {'sx': sx, 'sy': 1 / 256, 'zy': -128}
    quant._softmax_layer(g, op, d)
    return d


@pytest.mark.parametrize('n', [300, 1000, 4000, 4095])
def test_long_rows_forward_and_gradient_against_float(n):
    rows, sx = 3, 0.06
    d = layer(n, rows, sx)
    assert d['sm'] == n
    rng = np.random.default_rng(n)
    q = rng.integers(-128, 60, (rows, n))
    q[0, :3] = 127                       # (a row with a few large values: outputs above 0)
    q[1, :] = 5                          # (an all-equal row: the sum's largest)
    x = bytearray(q.astype(np.int8).tobytes())
    L = NS(d=d, tt=None, ins=[0], nout=rows * n, y=bytearray(rows * n))
    net = NS(acc=array('i', [0] * n))
    y = np.frombuffer(bytes(q8smx.fwd(L, net, [x])), np.int8).reshape(rows, n)
    v = q * sx
    ref = np.exp(v - v.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    got = (y.astype(np.float64) + 128) / 256
    assert np.abs(got - ref).max() <= 0.6 / 256, np.abs(got - ref).max()   # (rounding)
    assert (y[0, :3] > -128).all()         # (measured, not all 0)
    gs = 1e-4
    g = rng.integers(-2**20, 2**20, rows * n)
    ga = array('i', g.tolist())
    out, s = q8smx.back(L, net, ga, gs)
    dx = np.array(ga, np.float64).reshape(rows, n) * s
    gf = g.reshape(rows, n) * gs
    want = got * (gf - (got * gf).sum(1, keepdims=True))     # (the kernel's own y)
    scale = np.abs(gf).max() * got.max()
    err = np.abs(dx - want) / scale
    print(n, 'forward', np.abs(got - ref).max() * 256, 'gradient', err.max())
    assert err.max() < 2 ** -6, err.max()


def test_rows_past_the_sums_limit_are_refused():
    with pytest.raises(ValueError, match=r'm\.tflite: SOFTMAX op 0: rows of 4096 values; '
                       r'int8 training takes up to 4095.*--dequantize'):
        layer(4096, 1, 0.06)
