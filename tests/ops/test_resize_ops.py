"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (micro/utrain/op_rsz.py; issue 28: Keras
Resizing / UpSampling2D(interpolation='bilinear'), PyTorch interpolate bilinear, nearest by
factors that are not whole had been refused naming the op).

Forward against a float64 numpy reference written here from TFLite's reference kernels
(bilinear: the four corners x[y0, x0] (1 - dy)(1 - dx) + ... at once, not the device's
axis-by-axis tables) and TFLite Micro, with align_corners and half_pixel_centers in
their combinations; gradients against float64 central finite differences on the device
code, and the same under unix MicroPython (float32), with tests/support/op_harness.py's
models: x[1, 3] -> FC -> RESHAPE [1, H, W, C] -> RESIZE -> FC -> y, so the first FC's
weight gradient checks the op's input gradient element by element."""
import os

import numpy as np
import pytest

import op_harness as oh  # noqa: E402
from test_split_math_ops import tflm_infer  # noqa: E402

F32 = np.float32


def _src(i, n, m, align, half):
    # TFLite's ComputeInterpolationValues / GetNearestNeighbor input coordinate, float32
    scale = F32(n - 1) / F32(m - 1) if align and m > 1 else F32(n) / F32(m)
    return scale, (F32(i) + F32(0.5)) * scale - F32(0.5) if half else F32(i) * scale


def bilinear_ref(x, OH, OW, align=False, half=False):
    _, H, W, C = x.shape
    y = np.zeros((1, OH, OW, C))
    for i in range(OH):
        _, v = _src(i, H, OH, align, half)
        y0, y1 = max(int(np.floor(v)), 0), min(int(np.ceil(v)), H - 1)
        dy = float(v) - y0
        for j in range(OW):
            _, u = _src(j, W, OW, align, half)
            x0, x1 = max(int(np.floor(u)), 0), min(int(np.ceil(u)), W - 1)
            dx = float(u) - x0
            y[0, i, j] = (x[0, y0, x0] * (1 - dy) * (1 - dx) + x[0, y1, x0] * dy * (1 - dx)
                          + x[0, y0, x1] * (1 - dy) * dx + x[0, y1, x1] * dy * dx)
    return y


def nearest_ref(x, OH, OW, align=False, half=False):
    _, H, W, C = x.shape

    def pick(i, n, m):
        scale = F32(n - 1) / F32(m - 1) if align and m > 1 else F32(n) / F32(m)
        v = (F32(i) + F32(0.5 if half else 0)) * scale
        j = min(int(np.floor(v + F32(0.5))) if align else int(np.floor(v)), n - 1)
        return max(j, 0) if half else j
    return x[:, [pick(i, H, OH) for i in range(OH)]][:, :, [pick(j, W, OW) for j in range(OW)]]


def _resize(name, x_shape, out_hw, align=False, half=False):
    def build(m):
        a = m.act_input(x_shape)
        ref = (bilinear_ref if name == 'RESIZE_BILINEAR' else nearest_ref)(
            m.val[a], out_hw[0], out_hw[1], align, half)
        return m.op(name, [a, m.tensor([2], oh.ints(out_hw))], ref,
                    align_corners=align, half_pixel_centers=half)
    return build


_B, _N = 'RESIZE_BILINEAR', 'RESIZE_NEAREST_NEIGHBOR'
CASES = {
    # Keras Resizing(bilinear) / PyTorch align_corners=False: half-pixel centres, up by
    # factors that are not whole (and one axis down)
    'bilinear-half-up': _resize(_B, [1, 3, 4, 2], (5, 7), half=True),
    'bilinear-half-mixed': _resize(_B, [1, 4, 3, 2], (3, 5), half=True),
    # TF1's resize_bilinear(align_corners=True) / PyTorch align_corners=True
    'bilinear-align': _resize(_B, [1, 3, 4, 2], (6, 5), align=True),
    # neither (TF1's default), down
    'bilinear-plain-down': _resize(_B, [1, 5, 6, 1], (3, 4)),
    # UpSampling2D(2, interpolation='bilinear'): whole factors, one channel more
    'bilinear-half-x2': _resize(_B, [1, 2, 3, 3], (4, 6), half=True),
    # nearest by factors prepare does not turn into copies
    'nearest-half': _resize(_N, [1, 3, 4, 2], (5, 6), half=True),
    'nearest-align': _resize(_N, [1, 3, 4, 2], (5, 7), align=True),
    'nearest-plain-down': _resize(_N, [1, 5, 6, 1], (3, 4)),
}


def build(cid, where, seed):
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    m = oh.Model(np.random.default_rng(seed))
    y = m.finish(CASES[cid](m), path)
    return oh.prepared(m, y, where)


@pytest.fixture(scope='module')
def device(tmp_path_factory):
    return oh.run_device(tmp_path_factory.mktemp('resize_ops'), CASES, build, 9500)


@pytest.mark.parametrize('cid', list(CASES))
def test_forward_and_gradients(device, cid):
    oh.check_case(device, cid, 1e-6, tflm_infer, 'TFLite Micro')


def test_ops_micropython_match_float64(device, tmp_path):
    """Each case under unix MicroPython (npfallback, or ulab when $MICROPYTHON has it),
    float32, against the float64 CPython run."""
    oh.check_micropython(device, CASES, tmp_path)


def test_align_corners_with_half_pixel_centres_is_refused(tmp_path):
    """A bilinear resize with both flags (TFLite refuses it too) is refused naming the
    file, the op and what to do."""
    from host_tools.graph.passes import PrepareError, plan
    from host_tools.formats.circle_io import read_model
    m = oh.Model(np.random.default_rng(0))
    a = m.act_input([1, 2, 2, 1])
    out = m.tensor([1, 3, 3, 1])
    m.b.op(_B, [a, m.tensor([2], oh.ints([3, 3]))], [out], align_corners=True,
           half_pixel_centers=True)
    m.b.outputs(out)
    path = str(tmp_path / 'r.circle')
    m.b.save(path)
    with pytest.raises(PrepareError) as e:
        plan(read_model(path))
    assert path in str(e.value) and 'op 2 RESIZE_BILINEAR' in str(e.value) and \
        'export it with one of them' in str(e.value), str(e.value)
