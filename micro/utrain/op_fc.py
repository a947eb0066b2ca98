# FULLY_CONNECTED: y = act(x . W^T + b), W is circle's [out, in].
# Backward: dz = act'(y) dy;  dW += dz^T . x;  db += dz;  dx = dz . W.
# Saved for backward: x (when W trains), y (when the activation is not NONE).
# Temporaries: dz [rows, out], dx [rows, in]; a one-row dW is summed in place by
# xnp.add_outer (no [out, in] temporary: a board's heap fragments on them).
# Sparse update: only W's rows lo:hi (rt.rows) get gradients.  Batch 1 (rt.upd set):
# each gradient row updates its weight row at once, so no dW buffer exists at all
# (plain SGD: one add_outer of dz * -lr straight into W's rows, rt.upd_outer).
from utrain.xnp import np, zeros, add_outer
from utrain.op_act import act, act_grad


DX, DW, DB = 1, 2, 4
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
    o, n = rt.shape[ins[1]]
    if dy.shape[1] != o:
        dy = dy.reshape((dy.size // o, o))
    dz = act_grad(dy, t[outs[0]], int(opts[0])) if opts[0] else dy
    if flags & DX:              # first: a batch-1 update below changes w
        if w is None:           # frozen, streamed by rows
            dx = zeros((dz.shape[0], n))
            for r0, wc in rt.stream.chunks(ins[1]):
                dx += np.dot(dz[:, r0:r0 + wc.shape[0]], wc)
        else:
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
            if rt.upd is not None:          # batch 1: update W's rows at once
                if rt.upd_outer is None or not rt.upd_outer(k, dz[:, lo:hi], x):
                    x = x[0]
                    for j in range(lo, hi):
                        rt.upd_row(k, j - lo, x * dz[0, j])
            else:
                add_outer(rt.wgrad_rows(k), dz[:, lo:hi], x)
        else:
            g = np.dot((dz[:, lo:hi] if hi - lo < o else dz).T, x)
            if rt.upd is not None:
                rt.upd(k, g)
            else:
                a = rt.wgrad_rows(k)
                a += g
    if flags & DB:
        rt.add_wgrad(ins[2], dz if dz.shape[0] == 1 else np.sum(dz, axis=0))
