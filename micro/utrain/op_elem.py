# ADD (0), SUB (41), MUL (18), DIV (42): y = act(a OP b) with broadcasting, both operands
# activations (a residual add) or one a constant, which may be the op's trainable
# parameter (a folded BatchNorm's scale and shift).
# Options (host_tools/graph/optable.py _elem_options): act, parameter position (-1 none),
# n0 n1 n2, then per operand d0 d1 rows: the output's rows are n0 x n1 blocks of n2
# rows and block (i, j) of an operand is its rows i*d0 + j*d1 .. + rows (rows = n2, or 1
# broadcasting down the block).  Columns broadcast natively ([R, C] with [., 1]).
# One block (same shapes, per-channel [1, C], scalars) works on the whole arrays;
# more (e.g. NCHW's [1,C,1,1] against [1,C,H,W] = [C*H, W] rows) loop block by block.
# Backward: dz = act'(y) dy; da = dz (ADD, SUB), dz*b (MUL), dz/b (DIV); db = dz, -dz
# (SUB), dz*a (MUL), -dz*a/b^2 (DIV); each summed over what its operand broadcasts.
# LESS (58), GREATER (61), GREATER_EQUAL (62), LESS_EQUAL (63) (torch.where's and
# Softplus's threshold test, Threshold's x <= t, as tico writes them), EQUAL (71),
# NOT_EQUAL (72) (Keras's mask_zero, tf.not_equal, ONNX Equal / Not): y = 1.0 where the
# comparison holds, else 0.0 (the mask utrain.op_sel reads), broadcasting as above; no
# gradient (a step function: the host lists no data input, so no backward runs).
# Temporaries: forward, the output plus one block result; backward, dz, two or three
# block-sized products (DIV's db) and their sums, and the operand-sized gradient.
from utrain.xnp import np, zeros, const
from utrain.op_act import act, act_grad, keep0
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_ADD = const(0)
_SUB = const(41)
_MUL = const(18)
_DIV = const(42)
_LESS = const(58)
_GREATER = const(61)
_GREATER_EQUAL = const(62)
_LESS_EQUAL = const(63)
_EQUAL = const(71)
_NOT_EQUAL = const(72)
_DX = const(1)
_DW = const(2)
_DB = const(4)
_ACT = const(0)
_E_PARAM = const(1)
_E_N0 = const(2)
_E_N1 = const(3)
_E_N2 = const(4)
_E_D0 = const(5)
_E_D1 = const(6)
_E_ROWS = const(7)
_E_OPD = const(3)


def _f(code, a, b):
    if code == _ADD:
        return a + b
    if code == _SUB:
        return a - b
    if code == _MUL:
        return a * b
    if code == _DIV:
        return a / b
    if code == _GREATER:
        m = a > b
    elif code == _GREATER_EQUAL:
        m = a >= b
    elif code == _LESS:
        m = a < b
    elif code == _LESS_EQUAL:
        m = a <= b
    elif code == _EQUAL:
        m = a == b
    else:                   # NOT_EQUAL (the fallback's ndarray has no !=)
        return np.where(a == b, 0.0, 1.0)
    return np.where(m, 1.0, 0.0)


def _g(code, s, dz, a, b):
    # dz * d(a OP b) / d(operand s), broadcast to dz's shape
    # MUL and DIV: 0 where dz is 0 (op_act.keep0: an operand's inf or NaN on a
    # select's untaken side)
    if code == _MUL:
        return keep0(dz * (b if s == 0 else a), dz)
    if code == _DIV:
        return keep0(dz / b if s == 0 else dz * a / -(b * b), dz)
    return -dz if code == _SUB and s == 1 else dz


def _blk(x, o, s, i, j):
    # operand s's block (i, j): a view of its rows (None: an ADD/SUB operand not kept)
    k = _E_OPD * s
    m = o[k + _E_ROWS]
    if x is None or m == x.shape[0]:
        return x
    r = i * o[k + _E_D0] + j * o[k + _E_D1]
    return x[r:r + m]


def forward(rt, op):
    code, ins, outs, o = op
    t = rt.t
    a, b = t[ins[0]], t[ins[1]]
    o = [int(v) for v in o]
    n0, n1, n2 = o[_E_N0], o[_E_N1], o[_E_N2]
    if n0 * n1 == 1:
        y = _f(code, a, b)
    else:
        y = zeros(rt.shape[outs[0]])
        for i in range(n0):
            for j in range(n1):
                r = (i * n1 + j) * n2
                y[r:r + n2] = _f(code, _blk(a, o, 0, i, j), _blk(b, o, 1, i, j))
    t[outs[0]] = act(y, o[_ACT])


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
    dz = act_grad(dy, t[outs[0]], o[_ACT]) if o[_ACT] else dy
    a, b = t[ins[0]], t[ins[1]]      # read by MUL and DIV only (kept for them)
    n0, n1, n2 = o[_E_N0], o[_E_N1], o[_E_N2]
    p = o[_E_PARAM]
    for s in (0, 1):
        if not ((flags & _DX if s == 0 else ins[1] in rt.gin) or (flags & (_DW | _DB) and p == s)):
            continue
        k = ins[s]
        rows, cols = rt.shape[k]
        if n0 * n1 == 1:
            g = _red(_g(code, s, dz, a, b), rows, cols)
        else:
            g = zeros((rows, cols))
            e = _E_OPD * s
            m = o[e + _E_ROWS]
            for i in range(n0):
                for j in range(n1):
                    r = (i * n1 + j) * n2
                    gb = _g(code, s, dz[r:r + n2], _blk(a, o, 0, i, j), _blk(b, o, 1, i, j))
                    r = i * o[e + _E_D0] + j * o[e + _E_D1]
                    v = g[r:r + m]
                    v += _red(gb, m, cols)
        if p == s:
            rt.sink.grad(k, g)
        else:
            rt.add_grad(k, g)
