# SPLIT (49) and SPLIT_V (102): one input cut into n outputs along one axis (tico's
# unrolled LSTM and GRU cut their gate pre-activations, and prepare turns the per-step
# slices of the input projection into one SPLIT_V).  On the device's 2-D arrays a split
# along the last axis takes column ranges; along another axis, with the input's rows as
# [outer, axis, inner] (host_tools/graph/optable.py _split_options), each output takes from
# every outer block the rows axis range * inner.
# Options (utrain.opc slots): S_COLS (1: split the columns), S_OUTER, S_INNER, then from
# S_B0 the n + 1 boundaries along the axis (0 = b0 < b1 < ... < bn = the axis' size).
# Backward: the gradients of the outputs that have one are copied into one zeroed
# input-sized gradient (an output nobody differentiates through contributes zeros).
# Net.backward calls this op when any of its outputs has a gradient: dy is the first
# output's (or None), the others are taken from rt.g.
# Memory: the outputs (forward); one input-sized gradient per op, kept all run.
from utrain.xnp import zeros, const
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_S_COLS = const(0)
_S_OUTER = const(1)
_S_INNER = const(2)
_S_B0 = const(3)


def _parts(o):
    # per output j: (a, b) rows or columns of the input, per outer block
    inner = int(o[_S_INNER])
    return [(int(o[_S_B0 + j]) * inner, int(o[_S_B0 + 1 + j]) * inner)
            for j in range(len(o) - _S_B0 - 1)]


def _move(y, x, o, a, b, back):
    # y (an output or its gradient) <-> the part [a, b) of x (the input or its gradient)
    if o[_S_COLS]:
        if back:
            x[:, a:b] = y
        else:
            y[:] = x[:, a:b]
        return
    outer, step, m = int(o[_S_OUTER]), int(o[len(o) - 1]) * int(o[_S_INNER]), b - a
    for i in range(outer):
        if back:
            x[i * step + a:i * step + b] = y[i * m:(i + 1) * m]
        else:
            y[i * m:(i + 1) * m] = x[i * step + a:i * step + b]


def _bufs(rt):
    # id(op) -> the op's input-sized gradient buffer, made once, reused every step; kept
    # on the Net (its ops live as long as it does)
    b = getattr(rt, 'split_dx', None)
    if b is None:
        b = rt.split_dx = {}
    return b


def forward(rt, op):
    code, ins, outs, o = op
    x = rt.t[ins[0]]
    _dx = _bufs(rt)
    if id(op) not in _dx:
        # made at the first forward pass, on the heap as the model left it: made in the
        # backward pass instead, after a forward pass has left its saved activations
        # scattered over the heap, no free run may be long enough (an unrolled RNN's
        # [T, 4H] projection failed so in a heap 3x its live data)
        _dx[id(op)] = zeros(rt.shape[ins[0]])
    for j, (a, b) in enumerate(_parts(o)):
        y = zeros(rt.shape[outs[j]])
        _move(y, x, o, a, b, 0)
        rt.t[outs[j]] = y


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    _dx = _bufs(rt)
    dx = _dx.get(id(op))
    if dx is None:
        dx = _dx[id(op)] = zeros(rt.shape[ins[0]])
    else:
        dx[:] = 0.0
    for j, (a, b) in enumerate(_parts(o)):
        g = dy if j == 0 else rt.g.pop(outs[j], None)
        if g is not None:
            _move(g, dx, o, a, b, 1)
    rt.add_grad(ins[0], dx)
