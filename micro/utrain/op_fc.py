# FULLY_CONNECTED: y = act(x . W^T + b), W is circle's [out, in].
# Backward: dz = act'(y) dy;  dW += dz^T . x;  db += dz;  dx = dz . W.
# Saved for backward: x (when W trains), y (when the activation is not NONE).
# Temporaries: dz [rows, out], dx [rows, in], and one [in] row at a time while dW
# is summed row by row (no [out, in] temporary: a board's heap fragments on them).
# Sparse update: only W's rows lo:hi (rt.rows) get gradients.  Batch 1 (rt.upd set):
# each gradient row updates its weight row at once, so no dW buffer exists at all.
from utrain.xnp import np
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
    if flags & DX:              # first: a batch-1 update below changes w
        dx = np.dot(dz, w)
        s = rt.shape[ins[0]]
        rt.add_grad(ins[0], dx if dx.shape == s else dx.reshape(s))
    if flags & DW:
        k = ins[1]
        x = t[ins[0]]
        if x.shape[1] != n:
            x = x.reshape((x.size // n, n))
        lo, hi = rt.rows(k)
        if x.shape[0] == 1:
            x = x[0]
            if rt.upd is not None:          # batch 1: update each row from its gradient
                for j in range(lo, hi):
                    rt.upd_row(k, j - lo, x * dz[0, j])
            else:
                a = rt.wgrad(k)
                for j in range(lo, hi):
                    row = a[j - lo]
                    row += x * dz[0, j]
        else:
            g = np.dot((dz[:, lo:hi] if hi - lo < w.shape[0] else dz).T, x)
            if rt.upd is not None:
                rt.upd(k, g)
            else:
                a = rt.wgrad(k)
                a += g
    if flags & DB:
        rt.add_wgrad(ins[2], dz if dz.shape[0] == 1 else np.sum(dz, axis=0))
