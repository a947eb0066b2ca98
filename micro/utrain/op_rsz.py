# RESIZE_BILINEAR (23: Keras Resizing / UpSampling2D(interpolation='bilinear'), PyTorch
# interpolate bilinear) and RESIZE_NEAREST_NEIGHBOR (97) by factors prepare does not
# write as copies (host_tools/graph/rewrite.py resize_to_concat: whole factors), on
# [H*W, C] activations (batch 1, NHWC).  Both are a linear map, separable by axis:
# output row i of an axis is (1 - f) * input row lo + f * input row hi.  The host
# computes lo, hi, f per output row and column as TFLite's kernels do (align_corners,
# half_pixel_centers; nearest: lo = hi, f = 0) (host_tools/graph/optable.py
# _resize_options): utrain.opc's R_H, R_W, R_OH, R_OW, then from R_T the OH triples of
# the rows and the OW triples of the columns.
#   forward  t = the columns resized ([H*OW, C]), y = t's rows resized ([OH*OW, C])
#   dx       the transpose, in the reverse order: dt[lo] += (1 - f) dy[i], += f at hi
# Saved: nothing (linear).  Temporaries: t (or dt) and one block product at a time.
from utrain.xnp import zeros, const
_R_H = const(0)
_R_W = const(1)
_R_OH = const(2)
_R_OW = const(3)
_R_T = const(4)


def _axis(y, x, o, k, n, m, blk, back):
    # y's row blocks i < n (of blk rows each) from x's (back: x's += from y's), by the
    # triples at o[k]; m: x's block count.  Blocks of one row (a column index) repeat
    # every n rows of y and m rows of x: one row per outer step
    reps = y.shape[0] // (n * blk)
    for i in range(n):
        lo, hi, f = int(o[k + 3 * i]), int(o[k + 3 * i + 1]), o[k + 3 * i + 2]
        for r in range(reps):
            a, b = (r * n + i) * blk, (r * m) * blk
            for s, w in ((lo, 1.0 - f), (hi, f)):
                if w:
                    c = b + s * blk
                    if back:
                        x[c:c + blk] += y[a:a + blk] * w
                    else:
                        y[a:a + blk] += x[c:c + blk] * w


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
