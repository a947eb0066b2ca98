# MAX_POOL_2D, AVERAGE_POOL_2D and MEAN on [H*W, C] activations (batch 1, NHWC).
# Pools take op_conv's option floats (act, H, W, C, OH, OW, C, KH, KW, strides,
# dilations 1, pads) and its tap walk: one elementwise step per output row and tap.
# MAX_POOL_2D: y = act(max over the window's valid pixels).  Backward: each output's
#   gradient goes to the first pixel of its window (scan order) equal to the max,
#   found again from x.  Saves x (and y when fused).  Temporaries: one output-sized
#   copy of dz (the gradient not yet given out; plus the pre-activation max when fused)
#   and one [OW, C] mask/product per step.
# AVERAGE_POOL_2D: mean over the valid pixels (padding not counted, as TFLite).
#   Backward spreads dz / count.  Saves y only when fused.  Temporaries: one
#   output-sized dz / count and one [OW, 1] column of 1 / count.
# MEAN: options outer, red, inner: the tensor seen as [outer, red, inner] (the reduced
#   axes a contiguous run once size-1 axes are dropped); y[o, i] = mean_r x[o, r, i].
#   No saves; temporaries: one [inner] row (outer > 1 and inner > 1: per outer index).
from utrain.xnp import np, zeros, maxpool_steps, const
from utrain.op_act import act, act_grad
from utrain.op_conv import walk
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_MAX_POOL_2D = const(17)
_MEAN = const(40)
_DX = const(1)
_ACT = const(0)
_G_H = const(1)
_G_W = const(2)
_G_OH = const(4)
_G_OW = const(5)
_G_KH = const(7)
_G_KW = const(8)
_G_SH = const(9)
_G_SW = const(10)
_G_PT = const(13)
_G_PL = const(14)
_M_OUTER = const(0)
_M_RED = const(1)
_M_INNER = const(2)


def _counts(n, k, s, p, size):
    # valid window length for each of n outputs along one axis
    return [min(i * s - p + k, size) - max(i * s - p, 0) for i in range(n)]


def _inv(o):
    # per output row: (1 / row count, [OW, 1] column of 1 / column counts)
    ch = _counts(int(o[_G_OH]), int(o[_G_KH]), int(o[_G_SH]), int(o[_G_PT]), int(o[_G_H]))
    cw = _counts(int(o[_G_OW]), int(o[_G_KW]), int(o[_G_SW]), int(o[_G_PL]), int(o[_G_W]))
    col = np.array([[1.0 / c] for c in cw])
    return [1.0 / c for c in ch], col


def _maxpool(x, o, shape):
    sw = int(o[_G_SW])
    y = np.full(shape, -3.4e38)
    if maxpool_steps and maxpool_steps(o, walk, sw, y, x):   # the backend's, in one call
        return y
    for k, xr, yr, n in walk(o):
        y[yr:yr + n] = np.maximum(y[yr:yr + n], x[xr:xr + (n - 1) * sw + 1:sw])
    return y


def _scale(a, o, out):
    # out (or a new array) = a / window count, row block by row block
    rows, col = _inv(o)
    OW = int(o[_G_OW])
    if out is None:
        out = zeros(a.shape)
    for i in range(len(rows)):
        r = i * OW
        out[r:r + OW] = a[r:r + OW] * col * rows[i]
    return out


def _mean_shape(o):
    return int(o[_M_OUTER]), int(o[_M_RED]), int(o[_M_INNER])


def forward(rt, op):
    code, ins, outs, o = op
    t = rt.t
    x = t[ins[0]]
    s = rt.shape[outs[0]]
    if code == _MEAN:
        outer, red, inner = _mean_shape(o)
        if inner == 1:
            y = np.mean(x.reshape((outer, red)), axis=1)
        elif outer == 1:
            y = np.mean(x.reshape((red, inner)), axis=0)
        else:
            x = x.reshape((outer * red, inner))
            y = zeros((outer, inner))
            for i in range(outer):
                y[i] = np.mean(x[i * red:(i + 1) * red], axis=0)
        t[outs[0]] = y.reshape(s)
        return
    if code == _MAX_POOL_2D:
        y = _maxpool(x, o, s)
    else:
        sw = int(o[_G_SW])
        y = zeros(s)
        for k, xr, yr, n in walk(o):
            ys = y[yr:yr + n]
            ys += x[xr:xr + (n - 1) * sw + 1:sw]
        _scale(y, o, y)
    t[outs[0]] = act(y, int(o[_ACT]))


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    if not flags & _DX:
        return
    t = rt.t
    xs = rt.shape[ins[0]]
    if code == _MEAN:
        outer, red, inner = _mean_shape(o)
        d = dy * (1.0 / red)
        # (added in place: zeros(...) + d made a second input-sized array, the first
        # garbage at once: a 1-D conv net's 15 KB of it cut its heap, issue 28)
        if inner == 1:
            dx = zeros((outer, red))
            dx += d.reshape((outer, 1))
        elif outer == 1:
            dx = zeros((red, inner))
            dx += d.reshape((1, inner))
        else:
            d = d.reshape((outer, inner))
            dx = zeros((outer * red, inner))
            for i in range(outer):
                blk = dx[i * red:(i + 1) * red]
                blk += d[i]
        rt.add_grad(ins[0], dx.reshape(xs))
        return
    a = int(o[_ACT])
    y = t[outs[0]]
    dz = act_grad(dy, y, a) if a else dy
    sw = int(o[_G_SW])
    dx = zeros(xs)
    if code == _MAX_POOL_2D:
        x = t[ins[0]]
        m = _maxpool(x, o, y.shape) if a else y
        rem = dz.copy()
        steps = walk(o)
        if maxpool_steps and maxpool_steps(o, walk, sw, m, x, dx, rem):
            steps = ()
        for k, xr, yr, n in steps:
            xv = x[xr:xr + (n - 1) * sw + 1:sw]
            rv = rem[yr:yr + n]
            hit = np.where(xv == m[yr:yr + n], rv, 0.0)
            rv -= hit
            dxs = dx[xr:xr + (n - 1) * sw + 1:sw]
            dxs += hit
    else:
        sdz = _scale(dz, o, None)
        for k, xr, yr, n in walk(o):
            dxs = dx[xr:xr + (n - 1) * sw + 1:sw]
            dxs += sdz[yr:yr + n]
    rt.add_grad(ins[0], dx)
