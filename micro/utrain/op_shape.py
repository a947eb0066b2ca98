# Shape ops.  RESHAPE (22), SQUEEZE (43), EXPAND_DIMS (70): a view of the input with the
# output's 2-D shape (no options); the gradient is the reverse reshape.  No temporaries
# when the input is contiguous.
# PAD (34, zeros), TRANSPOSE (39), STRIDED_SLICE (45), CONCATENATION (2): block copies
# between the input(s) and the zeroed output, planned on the host
# (host_tools/graph/optable.py _copy_plan): utrain.opc's C_PART option floats per input, na nb n1 n2 tr, then
# for the input (side A) and the output (side B) each: start row, col; row, col step per
# outer index i; the same per j; row step and column step inside a block.  Block (i, j)
# is an [n1, n2] strided view of the output and of the input ([n2, n1] transposed when
# tr: a TRANSPOSE moving the last axis).  Only 2-D slicing, no index arrays (ulab's 2-D).
# Backward copies the other way, into a zeroed input-sized gradient.
# Temporaries: none besides the output (forward) or each input's gradient (backward).
from utrain.xnp import zeros, const
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_DX = const(1)
_C_NA = const(0)
_C_NB = const(1)
_C_N1 = const(2)
_C_N2 = const(3)
_C_TR = const(4)
_C_A = const(5)
_C_B = const(13)
_C_SIDE = const(8)
_C_PART = const(21)


def _v(x, s, i, j, m, n):
    # the [m, n] block (i, j) of side x, its plan side s (utrain.opc C_SIDE floats)
    r0, c0, ri, ci, rj, cj, rs, cs = s
    r = r0 + i * ri + j * rj
    c = c0 + i * ci + j * cj
    return x[r:r + (m - 1) * rs + 1:rs, c:c + (n - 1) * cs + 1:cs]


def _copy(y, x, p, k, back):
    # y[B blocks] = x[A blocks] of the part at p[k]; back: x[A blocks] = y[B blocks]
    n1, n2, tr = p[k + _C_N1], p[k + _C_N2], p[k + _C_TR]
    sa, sb = p[k + _C_A:k + _C_A + _C_SIDE], p[k + _C_B:k + _C_B + _C_SIDE]
    for i in range(p[k + _C_NA]):
        for j in range(p[k + _C_NB]):
            b = _v(y, sb, i, j, n1, n2)
            if tr:
                a = _v(x, sa, i, j, n2, n1)
                if back:
                    a[:] = b.T
                else:
                    b[:] = a.T
            elif back:
                _v(x, sa, i, j, n1, n2)[:] = b
            else:
                b[:] = _v(x, sa, i, j, n1, n2)


def forward(rt, op):
    code, ins, outs, p = op
    t = rt.t
    s = rt.shape[outs[0]]
    if not p:
        x = t[ins[0]]
        t[outs[0]] = x if x.shape == s else x.reshape(s)
        return
    p = [int(v) for v in p]
    y = zeros(s)
    for j in range(len(ins)):
        _copy(y, t[ins[j]], p, _C_PART * j, 0)
    t[outs[0]] = y


def backward(rt, op, dy, flags):
    code, ins, outs, p = op
    if not p:
        s = rt.shape[ins[0]]
        rt.add_grad(ins[0], dy if dy.shape == s else dy.reshape(s))
        return
    p = [int(v) for v in p]
    for j in range(len(ins)):
        if (flags & _DX) if j == 0 else ins[j] in rt.gin:   # (GRAD: flat.py)
            dx = zeros(rt.shape[ins[j]])
            _copy(dy, dx, p, _C_PART * j, 1)
            rt.add_grad(ins[j], dx)
