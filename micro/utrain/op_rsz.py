# RESIZE_BILINEAR (23: Keras Resizing / UpSampling2D(interpolation='bilinear'), PyTorch
# interpolate bilinear) and RESIZE_NEAREST_NEIGHBOR (97) by factors prepare does not
# write as copies (host_tools/graph/spellings.py resize_to_concat: whole factors), on
# [H*W, C] activations (batch 1, NHWC).  Both are a linear map, separable by axis:
# output row i of an axis is (1 - f) * input row lo + f * input row hi.  The host
# computes lo, hi, f per output row and column as TFLite's kernels do (align_corners,
# half_pixel_centers; nearest: lo = hi, f = 0) (host_tools/graph/optable.py
# _resize_options): utrain.opc's R_H, R_W, R_OH, R_OW, then from R_T the OH triples of
# the rows and the OW triples of the columns.
#   forward  t = the columns resized ([H*OW, C]), y = t's rows resized ([OH*OW, C])
#   dx       the transpose, in the reverse order: dt[lo] += (1 - f) dy[i], += f at hi
# Saved: nothing (linear).  Temporaries: t (or dt) and one product of an axis row at a
# time (a strided view of the columns: a loop over OW and OH, not over pixels).
from utrain.xnp import zeros, const
_R_H = const(0)
_R_W = const(1)
_R_OH = const(2)
_R_OW = const(3)
_R_T = const(4)


def _axis(y, x, o, k, n, m, blk, back):
    # y's rows along the axis (n of them) from x's (m; back: x's += from y's), by the
    # triples at o[k]: blk 1, the columns (row i of the axis: every n-th row of y from
    # i on, a strided view), else the rows (row i: the block of blk rows at i * blk)
    for i in range(n):
        lo, hi, f = int(o[k + 3 * i]), int(o[k + 3 * i + 1]), o[k + 3 * i + 2]
        v = _rows(y, i, n, blk)
        for s, w in ((lo, 1.0 - f), (hi, f)):
            if w:
                u = _rows(x, s, m, blk)
                if back:
                    u += v * w
                else:
                    v += u * w


def _rows(a, i, n, blk):
    if blk > 1:
        return a[i * blk:(i + 1) * blk]
    return a[i:i + a.shape[0] - n + 1:n]


def forward(rt, op):
    code, ins, outs, o = op
    H, W, OH, OW = int(o[_R_H]), int(o[_R_W]), int(o[_R_OH]), int(o[_R_OW])
    x = rt.t[ins[0]]
    C = x.shape[1]
    t = zeros((H * OW, C))
    _axis(t, x, o, _R_T + 3 * OH, OW, W, 1, 0)      # the columns: H runs of OW
    y = zeros((OH * OW, C))
    _axis(y, t, o, _R_T, OH, H, OW, 0)              # the rows: blocks of OW
    rt.t[outs[0]] = y


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    H, W, OH, OW = int(o[_R_H]), int(o[_R_W]), int(o[_R_OH]), int(o[_R_OW])
    C = dy.shape[1]
    dt = zeros((H * OW, C))
    _axis(dy, dt, o, _R_T, OH, H, OW, 1)
    dx = zeros((H * W, C))
    _axis(dt, dx, o, _R_T + 3 * OH, OW, W, 1, 1)
    rt.add_grad(ins[0], dx)
