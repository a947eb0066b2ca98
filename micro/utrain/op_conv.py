# CONV_2D and DEPTHWISE_CONV_2D on [H*W, C] activations (batch 1, NHWC order).
# Option floats (host_tools/graph/optable.py _spatial): act, H, W, C, OH, OW, OC, KH, KW,
# stride h, w, dilation h, w, pad top, pad left [, depth multiplier].
# The steps are the backend's (utrain.xnp.conv_steps) or, where it declines,
# utrain.convwalk's: one output row and kernel tap (kh, kw) at a time, whose input
# pixels are a strided run of x's rows (walk() below), no im2col of the image.  The step
# modules get walk and spread handed in (they import nothing back from here).
# CONV_2D: weight circle [O, KH, KW, I] seen as [O, KH*KW*I]; tap k is columns
#   k*I:(k+1)*I.  y[oh, ow] = act(sum_taps x[ih, iw] . W_k^T + b).
#   Backward: dz = act'(y) dy; dW_k += dz_run^T . x_run; db += sum dz; dx_run += dz_run . W_k.
#   Temporaries: one [OW, O] product (forward, dx: [OW, I]) and one [O, I] (dW) per step.
# DEPTHWISE_CONV_2D: weight circle [1, KH, KW, C*M] seen as [KH*KW, C*M]; output
#   channel c*M+m reads input channel c.  With M > 1 x is first spread to [H*W, C*M]
#   (each channel repeated M times), then y_run += x_run * w[k] like M = 1.
#   Temporaries: one [OW, C*M] product per step (dW: plus its [C*M] column sum);
#   M > 1: one [H*W, C*M] spread copy of x (and one of dx, summed back at the end).
# Saved for backward: x (when W trains), y (when the fused activation is not NONE).
from utrain.xnp import np, zeros, conv_steps, const
from utrain.op_act import act, act_grad
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_CONV_2D = const(3)
_DX = const(1)
_DW = const(2)
_DB = const(4)
_ACT = const(0)
_G_H = const(1)
_G_W = const(2)
_G_OH = const(4)
_G_OW = const(5)
_G_KH = const(7)
_G_KW = const(8)
_G_SH = const(9)
_G_SW = const(10)
_G_DH = const(11)
_G_DW = const(12)
_G_PT = const(13)
_G_PL = const(14)

# a large frozen weight streamed from the model file (prepare --stream) comes a few rows
# at a time (rt.stream.chunks): CONV_2D output channels, DEPTHWISE_CONV_2D taps; it is
# never whole in the heap (567 KB for MobileNetV2-0.35's last 1x1 conv).  Those steps
# live in utrain.convrows, imported only by a model that has such a weight.
ROWS = (1,)
# the weight gradient is added tap by tap into an array of the whole weight's shape
# (rt.sink.grad(W)), so the sink holds it whole, not only a rank's training channels;
# the host row's wgrad 'whole' is the planner's own fact (docs/flat-model.md)
WGRAD_WHOLE = True


def walk(o):
    """(tap, first x row, first y row, count) for every output row and kernel tap;
    x rows step by the stride, y rows by 1.  Padding is skipped, never stored."""
    H, W, OH, OW = int(o[_G_H]), int(o[_G_W]), int(o[_G_OH]), int(o[_G_OW])
    KH, KW, sh, sw = int(o[_G_KH]), int(o[_G_KW]), int(o[_G_SH]), int(o[_G_SW])
    dh, dw, pt, pl = int(o[_G_DH]), int(o[_G_DW]), int(o[_G_PT]), int(o[_G_PL])
    cols = []
    for kw in range(KW):
        iw = kw * dw - pl
        lo = 0 if iw >= 0 else (sw - 1 - iw) // sw
        hi = OW if W - 1 - iw < 0 else min(OW, (W - 1 - iw) // sw + 1)
        if W - 1 - iw >= 0 and hi > lo:
            cols.append((kw, lo, hi - lo, lo * sw + iw))
    for oh in range(OH):
        for kh in range(KH):
            ih = oh * sh - pt + kh * dh
            if 0 <= ih < H:
                for kw, lo, n, iw in cols:
                    yield kh * KW + kw, ih * W + iw, oh * OW + lo, n


def spread(x, M):
    # depthwise input with each channel repeated M times: [H*W, C*M] (column c*M+m = c)
    if M == 1:
        return x
    xm = zeros((x.shape[0], x.shape[1] * M))
    for m in range(M):
        v = xm[:, m::M]
        v += x
    return xm


def _bias(rt, ins, y):
    if len(ins) > 2 and ins[2] >= 0:
        y += rt.t[ins[2]]


def _steps(kind, out, p, q, o, sw):
    # the backend's steps (utrain.xnp.conv_steps: the fallback's native loops, numpy's
    # a tap at a time; under ulab utrain.ulconv), else a row and tap at a time
    s = conv_steps
    if s is None:
        from utrain.ulconv import steps as s
    if not s(kind, out, p, q, o, walk, sw, spread):
        from utrain.convwalk import steps
        steps(kind, out, p, q, o, walk, sw, spread)


def forward(rt, op):
    code, ins, outs, o = op
    t = rt.t
    x, w = t[ins[0]], t[ins[1]]
    y = zeros(rt.shape[outs[0]])
    if w is None:
        from utrain.convrows import steps
        steps(rt, op, y, x, False, walk, spread)
    else:
        _steps('Cf' if code == _CONV_2D else 'Df', y, x, w, o, int(o[_G_SW]))
    _bias(rt, ins, y)
    t[outs[0]] = act(y, int(o[_ACT]))


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    t = rt.t
    a = int(o[_ACT])
    dz = act_grad(dy, t[outs[0]], a) if a else dy
    if flags & _DB:
        rt.sink.grad(ins[2], np.sum(dz, axis=0))
    w = t[ins[1]]
    sw = int(o[_G_SW])
    c = 'C' if code == _CONV_2D else 'D'
    if flags & _DW:
        _steps(c + 'w', rt.sink.grad(ins[1]), dz, t[ins[0]], o, sw)
    if flags & _DX:
        dx = zeros(rt.shape[ins[0]])
        if w is None:               # frozen, streamed by rows
            from utrain.convrows import steps
            steps(rt, op, dx, dz, True, walk, spread)
        else:
            _steps(c + 'x', dx, dz, w, o, sw)
        rt.add_grad(ins[0], dx)
