# BATCH_MATMUL (126): y = op(a) . op(b) for each matrix of a batch, op(a) = a^T where
# adj_x, op(b) = b^T where adj_y.  Both operands activations (attention's Q K^T and
# P V) or one a constant, which may be the op's trainable weight.
# Device shapes: an operand [..., R, C] is [matrices * R, C], its matrix n the rows
# n*R .. (n+1)*R; the output's matrices are N0 x N1 blocks of N2 rows.
# Options (host_tools/graph/optable.py _bmm_options): ADJ (1 adj_x, 2 adj_y), the
# parameter's position (-1 none), N0 N1 N2, then per operand s at E_OPD*s: D0 D1 ROWS:
# in block (i, j) the operand's matrix is its rows i*D0 + j*D1 .. + ROWS (a step 0
# where it broadcasts along that batch axis).
# Backward, A = op(a), B = op(b): dA = dy B^T, dB = A^T dy per block, summed over the
# blocks an operand broadcasts to; da = dA, or dA^T = op(b) dy^T where adj_x; db = dB,
# or dB^T = dy^T op(a) where adj_y.  Saved: b (for da), a (for db).
# Temporaries: forward, the output and (several blocks) one block's product, which
# ulab's slice assignment copies; backward, per operand its gradient, one block's product.
from utrain.xnp import zeros, const, matmul
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_DX = const(1)
_DW = const(2)
_ADJ = const(0)
_E_PARAM = const(1)
_E_N0 = const(2)
_E_N1 = const(3)
_E_N2 = const(4)
_E_D0 = const(5)
_E_D1 = const(6)
_E_ROWS = const(7)
_E_OPD = const(3)


def _mm(p, q, tp, tq):
    # op(p) . op(q), op transposing where tp / tq (q^T by matmul's bt: no copy made)
    return matmul(p.T if tp else p, q, tq)


def _m(x, o, s, n):
    # operand s's matrix in the output's block n (a view of its rows)
    k = _E_OPD * s
    r = n // o[_E_N1] * o[k + _E_D0] + n % o[_E_N1] * o[k + _E_D1]
    return x[r:r + o[k + _E_ROWS]]


def forward(rt, op):
    code, ins, outs, o = op
    t = rt.t
    o = [int(v) for v in o]
    a, b = t[ins[0]], t[ins[1]]
    ax, ay, nb, m = o[_ADJ] & 1, o[_ADJ] >> 1, o[_E_N0] * o[_E_N1], o[_E_N2]
    if nb == 1:
        y = _mm(a, b, ax, ay)
    else:
        y = zeros(rt.shape[outs[0]])
        for n in range(nb):
            y[n * m:n * m + m] = _mm(_m(a, o, 0, n), _m(b, o, 1, n), ax, ay)
    t[outs[0]] = y


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    t = rt.t
    o = [int(v) for v in o]
    a, b = t[ins[0]], t[ins[1]]
    ax, ay, nb, m, p = o[_ADJ] & 1, o[_ADJ] >> 1, o[_E_N0] * o[_E_N1], o[_E_N2], o[_E_PARAM]
    for s in (0, 1):
        if not ((flags & _DW and p == s) or (flags & _DX if s == 0 else ins[1] in rt.gin)):
            continue
        g = None if nb == 1 else zeros(rt.shape[ins[s]])
        for n in range(nb):
            d, u, v = (dy, a, b) if nb == 1 else (dy[n * m:n * m + m], _m(a, o, 0, n), _m(b, o, 1, n))
            if s == 0:
                gb = _mm(v, d, ay, 1) if ax else _mm(d, v, 0, 1 - ay)
            else:
                gb = _mm(d, u, 1, ax) if ay else _mm(u, d, 1 - ax, 0)
            if g is None:
                g = gb
            else:
                r = _m(g, o, s, n)
                r += gb
        if p == s:
            rt.sink.grad(ins[s], g)
        else:
            rt.add_grad(ins[s], g)
