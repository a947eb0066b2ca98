"""utrain.ulconv, ulab's conv steps (a few array calls per kernel tap), against a direct
float64 convolution: forward, weight gradient and input gradient of CONV_2D and
DEPTHWISE_CONV_2D over dilations, paddings, depth multipliers and kernel shapes (odd,
even, 1xN), and one-channel convs at any stride; the other strided and VALID convs are
declined (op_conv walks rows) and left unwritten.  Run by CPython + numpy (the same array calls) and,
when $UTRAIN_MP_ULAB / $UTRAIN_MP32_ULAB name a MicroPython built with ulab, by it."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
MICRO = os.path.join(ROOT, 'micro')


def cases():
    rng = np.random.default_rng(3)
    out = []
    shapes = [  # H, W, C, O/M, KH, KW, s, d, padding
        (7, 6, 3, 4, 3, 3, 1, 1, 'same'), (8, 5, 2, 3, 3, 3, 2, 1, 'same'),
        (9, 9, 2, 2, 3, 3, 1, 2, 'same'), (6, 7, 3, 5, 2, 3, 1, 1, 'valid'),
        (10, 4, 1, 8, 3, 3, 2, 1, 'same'), (5, 5, 4, 4, 1, 1, 1, 1, 'valid'),
        (12, 3, 2, 2, 5, 1, 1, 1, 'same'), (4, 4, 3, 3, 3, 3, 1, 1, 'valid'),
        (11, 8, 2, 3, 3, 3, 3, 1, 'same'), (6, 6, 2, 2, 4, 4, 2, 1, 'same'),
        (6, 9, 3, 3, 1, 5, 1, 1, 'same'), (8, 6, 2, 3, 4, 2, 1, 1, 'same'),
        (9, 7, 3, 2, 5, 5, 1, 2, 'same'), (3, 12, 2, 2, 3, 3, 1, 1, 'same'),
        (2, 7, 3, 2, 3, 3, 1, 1, 'same'), (1, 9, 2, 3, 3, 3, 1, 1, 'same'),
        (24, 6, 2, 2, 3, 3, 1, 1, 'same'), (49, 10, 1, 8, 3, 3, 2, 1, 'same'),
        (9, 8, 1, 3, 4, 3, 2, 2, 'same'), (11, 7, 1, 4, 3, 2, 3, 1, 'valid'),
        # pieces shorter than an image row (ulconv._CH // channels < W: 16, 10 and 5
        # pixels), cut anywhere in a row, with columns off the image on either side
        (3, 40, 4, 32, 3, 3, 1, 1, 'same'), (4, 21, 6, 48, 1, 5, 1, 2, 'same'),
        (4, 20, 48, 2, 3, 3, 1, 2, 'same'),
    ]
    for i, (H, W, C, OM, KH, KW, s, d, pad) in enumerate(shapes):
        for kind in ('C', 'D'):
            M = OM if kind == 'D' and i % 3 == 0 else 1
            O = OM if kind == 'C' else C * M
            ekh, ekw = (KH - 1) * d + 1, (KW - 1) * d + 1
            if pad == 'same':
                OH, OW = -(-H // s), -(-W // s)
                pt = max(0, ((OH - 1) * s + ekh - H)) // 2
                pl = max(0, ((OW - 1) * s + ekw - W)) // 2
            else:
                OH, OW, pt, pl = (H - ekh) // s + 1, (W - ekw) // s + 1, 0, 0
            o = [0, H, W, C, OH, OW, O, KH, KW, s, s, d, d, pt, pl, M]
            x = rng.standard_normal((H * W, C))
            w = (rng.standard_normal((O, KH * KW * C)) if kind == 'C'
                 else rng.standard_normal((KH * KW, O)))
            dz = rng.standard_normal((OH * OW, O))
            out.append({'kind': kind, 'o': o, 'x': x.tolist(), 'w': w.tolist(),
                        'dz': dz.tolist()})
    return out


def reference(c):
    """y, dW, dx of the case by direct loops (float64)."""
    o = c['o']
    H, W, C, OH, OW, O, KH, KW, s, _, d, _, pt, pl, M = o[1:]
    x, w, dz = (np.array(c[k]) for k in ('x', 'w', 'dz'))
    y, dw, dx = np.zeros((OH * OW, O)), np.zeros_like(w), np.zeros_like(x)
    for oh in range(OH):
        for ow in range(OW):
            for kh in range(KH):
                for kw in range(KW):
                    ih, iw = oh * s - pt + kh * d, ow * s - pl + kw * d
                    if not (0 <= ih < H and 0 <= iw < W):
                        continue
                    k, yi, xi = kh * KW + kw, oh * OW + ow, ih * W + iw
                    if c['kind'] == 'C':
                        wk = w[:, k * C:(k + 1) * C]
                        y[yi] += wk @ x[xi]
                        dw[:, k * C:(k + 1) * C] += np.outer(dz[yi], x[xi])
                        dx[xi] += dz[yi] @ wk
                    else:
                        xs = np.repeat(x[xi], M)
                        y[yi] += xs * w[k]
                        dw[k] += dz[yi] * xs
                        dx[xi] += (dz[yi] * w[k]).reshape(C, M).sum(1)
    return y, dw, dx


SCRIPT = r'''
import json, sys
sys.path.insert(0, %r)
from utrain.xnp import np, zeros
from utrain import ulconv
from utrain.op_conv import spread
def A(v):
    return np.array(v)
out = []
for c in json.load(open(%r)):
    o, x, w, dz = c['o'], A(c['x']), A(c['w']), A(c['dz'])
    k = c['kind']
    y, g, dx = zeros(dz.shape), zeros(w.shape), zeros(x.shape)
    r = [ulconv.steps(k + 'f', y, x, w, o, None, o[9], spread),
         ulconv.steps(k + 'w', g, dz, x, o, None, o[9], spread),
         ulconv.steps(k + 'x', dx, dz, w, o, None, o[9], spread)]
    out.append([r, y.tolist(), g.tolist(), dx.tolist()])
print('OUT' + json.dumps(out))
'''


def run(tmp_path, binary):
    cs = cases()
    (tmp_path / 'cases.json').write_text(json.dumps(cs))
    (tmp_path / 'run.py').write_text(SCRIPT % (MICRO, str(tmp_path / 'cases.json')))
    argv = [binary, str(tmp_path / 'run.py')] if binary else [sys.executable, str(tmp_path / 'run.py')]
    if binary:
        argv[1:1] = ['-X', 'heapsize=8M']
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, UTRAIN_NP=''))
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.split('OUT', 1)[1])
    for c, (r, y, g, dx) in zip(cs, got):
        o = c['o']
        # stride 1 with the output the input's size, or one input channel, is ulconv's;
        # the rest walk rows
        assert r == [o[9] == 1 and o[1:3] == o[4:6] or o[3] == 1] * 3, (c['kind'], o)
        ref = reference(c)
        for done, v, want in zip(r, (y, g, dx), ref):
            if done:
                np.testing.assert_allclose(np.array(v), want, rtol=2e-4, atol=2e-4 * (1 + np.abs(want).max()),
                                           err_msg=f'{c["kind"]} {c["o"]}')
            else:
                assert not np.any(v), 'declined but wrote'
    return sum(r[0] for r, *_ in got)


def test_ulconv_on_numpy_matches_direct_convolution(tmp_path):
    assert run(tmp_path, None) == 36


@pytest.mark.parametrize('var', ['UTRAIN_MP_ULAB', 'UTRAIN_MP32_ULAB'])
def test_ulconv_on_ulab_matches_direct_convolution(tmp_path, var):
    b = os.environ.get(var)
    if not b or not os.access(b, os.X_OK):
        pytest.skip(f'${var} (a unix MicroPython built with ulab) not set')
    assert run(tmp_path, b) == 36
