# FULLY_CONNECTED: y = act(x . W^T + b), W is circle's [out, in].
# Backward: dz = act'(y) dy;  dW += dz^T . x;  db += dz;  dx = dz . W.
# Saved for backward: x (when W trains), y (when the activation is not NONE).
# Temporaries: dz [rows, out], dx [rows, in].  dW goes to the gradient sink as the
# product dz^T . x (rt.sink.grad(W, dz, x)): for one row an outer product that the sink
# sums or applies row by row without an [out, in] temporary (utrain/sink.py).
from utrain.xnp import np, zeros, const, matmul
from utrain.op_act import act, act_grad
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_DX = const(1)
_DW = const(2)
_DB = const(4)
_ACT = const(0)

ROWS = (1,)     # a frozen W streamed from the model file may come a few rows at a time (stream.py)


def forward(rt, op):
    code, ins, outs, opts = op
    t = rt.t
    x = t[ins[0]]
    w = t[ins[1]]
    n = rt.shape[ins[1]][1]
    if x.shape[1] != n:
        x = x.reshape((x.size // n, n))
    if w is None:                   # streamed by rows (rt.stream.chunks)
        y = zeros((x.shape[0], rt.shape[ins[1]][0]))
        for r0, wc in rt.stream.chunks(ins[1]):
            y[:, r0:r0 + wc.shape[0]] = np.dot(x, wc.T)
    else:
        y = matmul(x, w, 1)
    if len(ins) > 2 and ins[2] >= 0:
        y += t[ins[2]]
    y = act(y, int(opts[_ACT]))
    shape = rt.shape[outs[0]]
    t[outs[0]] = y if y.shape == shape else y.reshape(shape)


def backward(rt, op, dy, flags):
    code, ins, outs, opts = op
    t = rt.t
    w = t[ins[1]]
    o, n = rt.shape[ins[1]]
    if dy.shape[1] != o:
        dy = dy.reshape((dy.size // o, o))
    dz = act_grad(dy, t[outs[0]], int(opts[_ACT])) if opts[_ACT] else dy
    if flags & _DX:              # first: a batch-1 sink updates w at DW
        if w is None:           # frozen, streamed by rows
            dx = zeros((dz.shape[0], n))
            for r0, wc in rt.stream.chunks(ins[1]):
                dx += np.dot(dz[:, r0:r0 + wc.shape[0]], wc)
        else:
            dx = matmul(dz, w)
        s = rt.shape[ins[0]]
        rt.add_grad(ins[0], dx if dx.shape == s else dx.reshape(s))
    if flags & _DW:
        x = t[ins[0]]
        rt.sink.grad(ins[1], dz, x if x.shape[1] == n else x.reshape((x.size // n, n)))
    if flags & _DB:
        rt.sink.grad(ins[2], dz if dz.shape[0] == 1 else np.sum(dz, axis=0))
