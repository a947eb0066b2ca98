# FULLY_CONNECTED: y = act(x . W^T + b), W is circle's [out, in].
# Backward: dz = act'(y) dy;  dW += dz^T . x;  db += dz;  dx = dz . W.
# Saved for backward: x (when W trains), y (when the activation is not NONE).
# Temporaries: dz [rows, out], dx [rows, in]; a one-row dW is summed in place by
# xnp.add_outer (no [out, in] temporary: a board's heap fragments on them).
from utrain.xnp import np, add_outer
from utrain.op_act import act, act_grad

DX, DW, DB = 1, 2, 4


def forward(rt, op):
    code, ins, outs, opts = op
    t = rt.t
    x = t[ins[0]]
    w = t[ins[1]]
    n = w.shape[1]
    if x.shape[1] != n:
        x = x.reshape((x.size // n, n))
    y = np.dot(x, w.T)
    if len(ins) > 2 and ins[2] >= 0:
        y += t[ins[2]]
    y = act(y, int(opts[0]))
    shape = rt.shape[outs[0]]
    t[outs[0]] = y if y.shape == shape else y.reshape(shape)


def backward(rt, op, dy, flags):
    code, ins, outs, opts = op
    t = rt.t
    w = t[ins[1]]
    n = w.shape[1]
    if dy.shape[1] != w.shape[0]:
        dy = dy.reshape((dy.size // w.shape[0], w.shape[0]))
    dz = act_grad(dy, t[outs[0]], int(opts[0])) if opts[0] else dy
    if flags & DW:
        x = t[ins[0]]
        if x.shape[1] != n:
            x = x.reshape((x.size // n, n))
        a = rt.wgrad(ins[1])
        if x.shape[0] == 1:
            add_outer(a, dz, x)
        else:
            a += np.dot(dz.T, x)
    if flags & DB:
        rt.add_wgrad(ins[2], dz if dz.shape[0] == 1 else np.sum(dz, axis=0))
    if flags & DX:
        dx = np.dot(dz, w)
        s = rt.shape[ins[0]]
        rt.add_grad(ins[0], dx if dx.shape == s else dx.reshape(s))
