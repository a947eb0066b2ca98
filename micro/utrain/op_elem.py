# ADD (0), SUB (41), MUL (18), DIV (42): y = act(a OP b) with broadcasting, both operands
# activations (a residual add) or one a constant, which may be the op's trainable
# parameter (a folded BatchNorm's scale and shift).
# Options (host_tools/optable.py _elem_options): act, parameter position (-1 none),
# n0 n1 n2, then per operand d0 d1 rows: the output's rows are n0 x n1 blocks of n2
# rows and block (i, j) of an operand is its rows i*d0 + j*d1 .. + rows (rows = n2, or 1
# broadcasting down the block).  Columns broadcast natively ([R, C] with [., 1]).
# One block (same shapes, per-channel [1, C], scalars) works on the whole arrays;
# more (e.g. NCHW's [1,C,1,1] against [1,C,H,W] = [C*H, W] rows) loop block by block.
# Backward: dz = act'(y) dy; da = dz (ADD, SUB), dz*b (MUL), dz/b (DIV); db = dz, -dz
# (SUB), dz*a (MUL), -dz*a/b^2 (DIV); each summed over what its operand broadcasts.
# Temporaries: forward, the output plus one block result; backward, dz, two or three
# block-sized products (DIV's db) and their sums, and the operand-sized gradient.
from utrain.xnp import np, zeros
from utrain.op_act import act, act_grad

DX, DW, DB = 1, 2, 4


def _f(code, a, b):
    if code == 0:
        return a + b
    if code == 41:
        return a - b
    if code == 18:
        return a * b
    return a / b


def _g(code, s, dz, a, b):
    # dz * d(a OP b) / d(operand s), broadcast to dz's shape
    if code == 18:
        return dz * (b if s == 0 else a)
    if code == 42:
        return dz / b if s == 0 else dz * a / -(b * b)
    return -dz if code == 41 and s == 1 else dz


def _blk(x, o, k, i, j):
    # operand block (i, j): a view of its rows (None: an ADD/SUB operand not kept)
    m = o[k + 2]
    if x is None or m == x.shape[0]:
        return x
    r = i * o[k] + j * o[k + 1]
    return x[r:r + m]


def forward(rt, op):
    code, ins, outs, o = op
    t = rt.t
    a, b = t[ins[0]], t[ins[1]]
    o = [int(v) for v in o]
    n0, n1, n2 = o[2], o[3], o[4]
    if n0 * n1 == 1:
        y = _f(code, a, b)
    else:
        y = zeros(rt.shape[outs[0]])
        for i in range(n0):
            for j in range(n1):
                r = (i * n1 + j) * n2
                y[r:r + n2] = _f(code, _blk(a, o, 5, i, j), _blk(b, o, 8, i, j))
    t[outs[0]] = act(y, o[0])


def _red(g, rows, cols):
    # sum the block gradient g down to an operand block of shape (rows, cols)
    if cols == 1 and g.shape[1] > 1:
        g = np.sum(g, axis=1).reshape((g.shape[0], 1))
    if rows == 1 and g.shape[0] > 1:
        g = np.sum(g, axis=0).reshape((1, g.shape[1]))
    return g


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    t = rt.t
    o = [int(v) for v in o]
    dz = act_grad(dy, t[outs[0]], o[0]) if o[0] else dy
    a, b = t[ins[0]], t[ins[1]]      # read by MUL and DIV only (kept for them)
    n0, n1, n2 = o[2], o[3], o[4]
    for s in (0, 1):
        if not (flags & (DX if s == 0 else 8) or (flags & (DW | DB) and o[1] == s)):
            continue
        k = ins[s]
        rows, cols = rt.shape[k]
        if n0 * n1 == 1:
            g = _red(_g(code, s, dz, a, b), rows, cols)
        else:
            g = zeros((rows, cols))
            m = o[7 + 3 * s]
            for i in range(n0):
                for j in range(n1):
                    r = (i * n1 + j) * n2
                    gb = _g(code, s, dz[r:r + n2], _blk(a, o, 5, i, j), _blk(b, o, 8, i, j))
                    r = i * o[5 + 3 * s] + j * o[6 + 3 * s]
                    v = g[r:r + m]
                    v += _red(gb, m, cols)
        if o[1] == s:
            rt.add_wgrad(k, g)
        else:
            rt.add_grad(k, g)
