# SELECT (64), SELECT_V2 (123): y = c ? a : b elementwise, c a mask of 1.0 / 0.0 (a
# comparison's output: utrain.op_elem's LESS, GREATER, ...), as tico writes torch.where,
# Softplus's threshold branch (x * beta > threshold: x, else log1p(exp(beta x)) / beta),
# Mish's softplus and Threshold.  Each operand is the output's [rows, cols] or broadcasts
# natively along its rows and / or columns (a scalar, a per-column row); the host checks.
# Backward: da = dy where c, db = dy where not c, each summed over what its operand
# broadcasts (op_elem's _red); the mask gets no gradient.  Data inputs a (DX) and b
# (its GRAD flag: rt.gin).  Saves c.  Temporaries: the output; backward one
# output-sized product and its sum per operand.
from utrain.xnp import np, const
from utrain.op_elem import _red
_DX = const(1)


def forward(rt, op):
    code, ins, outs, o = op
    t = rt.t
    t[outs[0]] = np.where(t[ins[0]] > 0.5, t[ins[1]], t[ins[2]])


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    t = rt.t
    m = t[ins[0]] > 0.5
    for s in (1, 2):
        k = ins[s]
        if not (flags & _DX if s == 1 else k in rt.gin):
            continue
        g = np.where(m, dy, 0.0) if s == 1 else np.where(m, 0.0, dy)
        rows, cols = rt.shape[k]
        rt.add_grad(k, _red(g, rows, cols))
