# TRANSPOSE_CONV (Keras Conv2DTranspose/Conv1DTranspose; PyTorch ConvTranspose2d/1d read
# from ONNX) on [H*W, C] activations (batch 1, NHWC order).
# A transposed convolution is the input gradient of a convolution C, and its own input
# gradient is C: the option floats are C's geometry (host_tools/graph/optable.py
# _tconv_options: C's input H, W, C are this op's output, C's output OH, OW, OC this
# op's input), so op_conv's walk and steps run it unchanged with roles swapped:
#   forward  y  = C's dx step of x     ('Cx': y[ih, iw] += x[oh, ow] . Wc_k)
#   dx       dx = C's forward of dz    ('Cf')
#   dW       dWc_k += x_run^T . dz_run ('Cw', C's dz being x and its x dz)
# The weight is TFLite's [O, KH, KW, I] (O this op's output channels), device [O, KH*KW*I];
# C's weight Wc is [I, KH*KW*O]: tap k of one is tap k of the other transposed.  Wc is
# made per call (one weight-sized temporary, forward and backward), and the gradient,
# summed in C's layout, is added back tap by tap into the sink's array (a second one).
# Bias [O] and the fused activation as CONV_2D's.  Saved: x (when W trains), y (fused).
from utrain.xnp import np, zeros, const
from utrain.op_conv import _steps, _bias
from utrain.op_act import act, act_grad
_DX = const(1)
_DW = const(2)
_DB = const(4)
_ACT = const(0)
_G_KH = const(7)
_G_KW = const(8)
_G_SW = const(10)

# the weight gradient is added tap by tap into rt.sink.grad(W) (docs/flat-model.md)
WGRAD_WHOLE = True


def _swap(w, out, n):
    # out's tap k (n taps) += w's tap k transposed: [O, n*I] <-> [I, n*O]
    O, I = w.shape[0], w.shape[1] // n
    for k in range(n):
        v = out[:, k * O:(k + 1) * O]
        v += w[:, k * I:(k + 1) * I].T


def _wc(w, o):
    n = int(o[_G_KH]) * int(o[_G_KW])
    c = zeros((w.shape[1] // n, n * w.shape[0]))
    _swap(w, c, n)
    return c


def forward(rt, op):
    code, ins, outs, o = op
    t = rt.t
    y = zeros(rt.shape[outs[0]])
    _steps('Cx', y, t[ins[0]], _wc(t[ins[1]], o), o, int(o[_G_SW]))
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
    if flags & _DW:
        n = int(o[_G_KH]) * int(o[_G_KW])
        gc = zeros((w.shape[1] // n, n * w.shape[0]))
        _steps('Cw', gc, t[ins[0]], dz, o, sw)
        _swap(gc, rt.sink.grad(ins[1]), n)
        gc = None
    if flags & _DX:
        dx = zeros(rt.shape[ins[0]])
        _steps('Cf', dx, dz, _wc(w, o), o, sw)
        rt.add_grad(ins[0], dx)
