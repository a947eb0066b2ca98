"""int8 RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (an SLC layer with 'rz': utrain.q8rsz,
issue 28), in a graph built here: x [1, 8] -> FC -> [1, 24] -> RESHAPE [1, 3, 4, 2] ->
RESIZE to OH x OW -> RESHAPE -> FC -> logits [3].  The forward bit-exact with TFLite
Micro (its ResizeBilinearInteger: 1/1024 weights, rounding half away from zero; nearest:
a copy of codes) under half_pixel_centers, align_corners and neither, up and down; the
first FC's update through the resize (its gradient the transposed interpolation, int32)
against finite differences of the float forward of the dequantized graph; the same
integers under viper."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from test_q8 import spy_updates  # noqa: E402
from test_q8_bmm import act_quant  # noqa: E402
from test_q8_cat import MP, _step_against_fd, _viper_matches  # noqa: E402

_B, _N = 'RESIZE_BILINEAR', 'RESIZE_NEAREST_NEIGHBOR'
CASES = [(_B, 5, 7, {'half_pixel_centers': True}), (_B, 2, 3, {'half_pixel_centers': True}),
         (_B, 5, 6, {'align_corners': True}), (_B, 4, 7, {}), (_B, 9, 12, {'half_pixel_centers': True}),
         (_N, 5, 7, {'half_pixel_centers': True}), (_N, 6, 3, {'align_corners': True}),
         (_N, 2, 7, {})]


def _axis(n, m, nearest, align=False, half=False):
    """[m, n]: output row i of an axis as weights of the input's rows (the float op)."""
    a = np.zeros((m, n))
    s = (n - 1) / (m - 1) if align and m > 1 else n / m
    for i in range(m):
        if nearest:
            v = (i + (0.5 if half else 0)) * s
            j = min(int(np.floor(v + 0.5)) if align else int(np.floor(v)), n - 1)
            a[i, j] = 1
            continue
        v = (i + 0.5) * s - 0.5 if half else i * s
        lo, hi = max(int(np.floor(v)), 0), min(int(np.ceil(v)), n - 1)
        a[i, lo] += 1 - (v - lo) if v > 0 else 1
        a[i, hi] += v - lo if v > 0 else 0
    return a


def build_int8_resize(path, name, OH, OW, opt, seed=0):
    """The graph above; each activation's scale and zero point from its range on random
    inputs, per-tensor int8 weights, no biases.  Returns (path, float forward f(x [8], w1
    [24, 8] or None) -> logits, w1's scale, x's scale)."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(seed)
    ws = [r.standard_normal(s) * k for s, k in (((24, 8), 0.3), ((3, OH * OW * 2), 0.3))]
    qw = [(np.abs(w).max() / 127, np.round(w / (np.abs(w).max() / 127)).astype(np.int8)) for w in ws]
    wq = [q * s for s, q in qw]
    sx = 0.02
    near = name == _N
    ay = _axis(3, OH, near, opt.get('align_corners'), opt.get('half_pixel_centers'))
    ax = _axis(4, OW, near, opt.get('align_corners'), opt.get('half_pixel_centers'))

    def fwd(x, w1=None):
        a = ((wq[0] if w1 is None else w1) @ x).reshape(3, 4, 2)
        t = np.einsum('yi,xj,ijc->yxc', ay, ax, a)
        return wq[1] @ t.reshape(-1), a
    # (the logits' range at least +-4.5: prepare does not widen them)
    Q = act_quant(lambda x: (fwd(x)[1], np.r_[fwd(x)[0], -4.5, 4.5]), r.uniform(-2.5, 2.5, (64, 8)))
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 8], dtype='int8', quant={'scale': [sx], 'zero_point': [0]})
    w = [b.tensor(f'w{i}', q.shape, data=q, quant={'scale': [s], 'zero_point': [0]})
         for i, (s, q) in enumerate(qw)]
    fa = b.tensor('fa', [1, 24], dtype='int8', quant=Q[0])
    a = b.tensor('a', [1, 3, 4, 2], dtype='int8', quant=Q[0])
    t = b.tensor('t', [1, OH, OW, 2], dtype='int8', quant=Q[0])
    tf = b.tensor('tf', [1, OH * OW * 2], dtype='int8', quant=Q[0])
    y = b.tensor('y', [1, 3], dtype='int8', quant=Q[1])
    b.op('FULLY_CONNECTED', [x, w[0], -1], [fa])
    b.op('RESHAPE', [fa, b.tensor('sa', [4], data=np.array([1, 3, 4, 2], np.int32))], [a])
    b.op(name, [a, b.tensor('sz', [2], data=np.array([OH, OW], np.int32))], [t], **opt)
    b.op('RESHAPE', [t, b.tensor('st', [2], data=np.array([1, OH * OW * 2], np.int32))], [tf])
    b.op('FULLY_CONNECTED', [tf, w[1], -1], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(path)), (lambda x, w1=None: fwd(x, w1)[0]), qw[0][0], sx


def _net(tmp_path, case):
    os.makedirs(tmp_path, exist_ok=True)
    path, fwd, sw, sx = build_int8_resize(tmp_path / 'm.tflite', *case)
    quant.write(quant.rewritten(read_model(path)), str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    return path, fwd, sw, sx, m


def _x(i):
    return np.random.default_rng(40 + i).integers(-125, 126, 8).astype(np.int8)


@pytest.mark.parametrize('case', CASES, ids=lambda c: f'{c[0][7:11]}-{c[1]}x{c[2]}-{"".join(c[3])[:5]}')
def test_forward_bit_exact_with_tflite_micro_and_update_matches_fd(tmp_path, monkeypatch, case):
    from test_q8_bin import _tflm_matches
    path, fwd, sw, sx, m = _net(tmp_path, case)
    rz = [d for d in m['layers'] if 'rz' in d]
    assert len(rz) == 1 and rz[0]['k'] == quant.SLC and rz[0]['gn'] == 24
    assert rz[0]['rz'][4] <= 16     # (g keeps 14 bits: the gradient's weights shifted)
    _tflm_matches(path, m, tmp_path, [_x(i) for i in range(10)], 8)
    got = spy_updates(monkeypatch)
    w0 = next(t for t in read_model(path).tensors if t.name == 'w0')
    wf = w0.data.astype(np.float64) * sw
    cos = []
    for i in range(4):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        xq = _x(i)
        up, ref, c = _step_against_fd(net, got, xq, i % 3, 0.01, sw, fwd,
                                      xq.astype(np.float64) * sx, wf, 1e-4)
        cos.append(c)
        assert 0.5 < np.linalg.norm(up) / np.linalg.norm(ref) < 2, i
    assert min(cos) > 0.99, cos


def test_other_scales_refused_naming_the_file(tmp_path):
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 2, 2, 1], dtype='int8', quant={'scale': [0.05], 'zero_point': [0]})
    y = b.tensor('y', [1, 3, 3, 1], dtype='int8', quant={'scale': [0.1], 'zero_point': [0]})
    b.op(_B, [x, b.tensor('sz', [2], data=np.array([3, 3], np.int32))], [y])
    b.inputs(x)
    b.outputs(y)
    p = b.save(str(tmp_path / 'bad.tflite'))
    with pytest.raises(ValueError, match=r'bad\.tflite: RESIZE_BILINEAR op 0: output scale .* one quantization'):
        quant.layers(quant.rewritten(read_model(p)), 'all')


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_viper_steps_as_the_host(tmp_path):
    """Bilinear and nearest: the same integers under viper as on the host."""
    for i in (0, 4):
        _net(tmp_path / str(i), CASES[i])
        _viper_matches(tmp_path, tmp_path / str(i), [_x(k) for k in range(3)])


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_the_plan_bounds_the_heap_it_needs(tmp_path):
    """prepare plans q8rsz (its code, its tables, the input-gradient buffer 'gn' asks
    for): the run trains in the planned heap on unix MicroPython, not in plan / 1.2."""
    from test_q8_bin import plan_bounds_the_heap
    from host_tools.plan.memory import q8_modules
    path = build_int8_resize(tmp_path / 'm.tflite', *CASES[0])[0]
    x = np.random.default_rng(4).uniform(-2.4, 2.4, (6, 8)).astype(np.float32)
    plan_bounds_the_heap(tmp_path, path, x)
    with open(tmp_path / 'run' / 'q8.json') as f:
        assert 'q8rsz' in q8_modules(json.load(f))[1]
