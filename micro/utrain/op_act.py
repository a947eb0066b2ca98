# Activations: forward and gradient side by side.  Gradients are taken from the
# op's output y (saved by the forward pass), so nothing else needs keeping.
# Activation codes (opc AF_*) are circle's ActivationFunctionType; LOGISTIC gets 6.
from utrain.xnp import np, const, BACKEND
_ULAB = BACKEND == 'ulab'
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_NONE = const(0)   # opc.AF_NONE
_RELU = const(1)   # opc.AF_RELU
_RELU_N1_TO_1 = const(2)   # opc.AF_RELU_N1_TO_1
_RELU6 = const(3)   # opc.AF_RELU6
_TANH = const(4)   # opc.AF_TANH
_LOGISTIC = const(6)   # opc.AF_LOGISTIC
_SOFTMAX = const(25)
_HARD_SWISH = const(117)
_LEAKY_RELU = const(98)
_ELU = const(111)
_BETA = const(0)
_ALPHA = const(0)
_OP_RELU = const(19)   # opc.RELU
_OP_RELU6 = const(21)   # opc.RELU6
_OP_TANH = const(28)   # opc.TANH
_OP_LOGISTIC = const(14)   # opc.LOGISTIC
_OP_RELU_N1_TO_1 = const(20)   # opc.RELU_N1_TO_1
# a clipping activation on more than _WHOLE values works _CHUNK values of rows at a time
# (the host's planner reads both: host_tools/graph/optable.py _act_temps)
_WHOLE = const(4096)
_CHUNK = const(1024)


def act(y, code):
    """Apply activation `code` to the fresh array y (may reuse y).  The clipping ones
    work in place on a large y, 1024 values at a time: a second array of y's size (442 KB
    for MobileNetV2's first expansion) never exists."""
    if code == _NONE:
        return y
    if _RELU <= code <= _RELU6 and y.size > _WHOLE:
        r = max(1, _CHUNK // y.shape[1])
        for i in range(0, y.shape[0], r):
            y[i:i + r] = _act(y[i:i + r], code)
        return y
    return _act(y, code)


def _act(y, code):
    if code == _RELU:
        return np.maximum(y, 0.0)
    if code == _RELU6:
        return np.clip(y, 0.0, 6.0)
    if code == _RELU_N1_TO_1:
        return np.clip(y, -1.0, 1.0)
    if code == _TANH:
        return np.tanh(y, out=y)
    if code == _LOGISTIC:
        e = np.exp(-y)
        e += 1.0
        return 1.0 / e
    raise ValueError('activation %d not supported' % code)


def keep0(g, dy):
    """g = dy * f'(x) with 0 wherever dy is 0.  A select's untaken side holds values its
    gradient never reaches (EXP's inf beyond 88, SQRT's NaN below 0, RSQRT's inf at 0):
    there dy is 0 and 0 * inf = NaN would stop the run.  The common case (g finite) costs
    one reduction, whose inf or NaN says to look: a sum (ulab's dot of g with itself, 3-10x
    faster than its 2-D sum; an overflow of the squares only takes the exact path)."""
    if _ULAB:
        v = g.reshape((g.size,))
        s = np.dot(v, v)
    else:
        s = np.sum(g)
    if s - s == 0.0:
        return g
    return np.where(dy == 0.0, 0.0, g)


def act_grad(dy, y, code):
    """Gradient through the activation, given the upstream dy and the output y."""
    if code == _NONE:
        return dy
    if code == _RELU:
        return np.where(y > 0.0, dy, 0.0)
    if code == _RELU6:
        return np.where(y > 0.0, np.where(y < 6.0, dy, 0.0), 0.0)
    if code == _RELU_N1_TO_1:
        return np.where(y > -1.0, np.where(y < 1.0, dy, 0.0), 0.0)
    if code == _TANH:
        return dy * (1.0 - y * y)
    if code == _LOGISTIC:
        return dy * (y * (1.0 - y))
    raise ValueError('activation %d not supported' % code)


# standalone activation ops: circle builtin code -> activation code
_OPS = {_OP_RELU: _RELU, _OP_RELU6: _RELU6, _OP_TANH: _TANH, _OP_LOGISTIC: _LOGISTIC,
        _OP_RELU_N1_TO_1: _RELU_N1_TO_1}


# HARD_SWISH y = x relu6(x + 3) / 6 and LEAKY_RELU (alpha) take their
# gradients from the saved input x; ELU from its output y.  Temporaries: two arrays of x's size.
def forward(rt, op):
    code, ins, outs, opts = op
    x = rt.t[ins[0]]
    if code == _SOFTMAX:
        rt.t[outs[0]] = softmax(x, opts[_BETA])
    elif code == _HARD_SWISH:
        rt.t[outs[0]] = np.clip(x * (1.0 / 6.0) + 0.5, 0.0, 1.0) * x
    elif code == _LEAKY_RELU:
        rt.t[outs[0]] = np.where(x > 0.0, x, x * opts[_ALPHA])
    elif code == _ELU:      # exp(x) - 1 below 0; its gradient from y: y + 1 there
        rt.t[outs[0]] = np.where(x > 0.0, x, np.exp(np.minimum(x, 0.0)) - 1.0)
    else:
        c = _OPS[code]
        # act works in place on tanh and on a large clipping input: on a copy unless
        # the input dies here (another reader, a saved activation, kept its values)
        if c == _TANH or x.size > _WHOLE and _RELU <= c <= _RELU6 and ins[0] not in rt.dead:
            x = x * 1.0
        rt.t[outs[0]] = act(x, c)


def backward(rt, op, dy, flags):
    code, ins, outs, opts = op
    if code == _HARD_SWISH:
        x = rt.t[ins[0]]
        g = np.where(x > 3.0, dy, np.where(x < -3.0, 0.0, dy * (x * (1.0 / 3.0) + 0.5)))
        rt.add_grad(ins[0], g)
        return
    if code == _LEAKY_RELU:
        x = rt.t[ins[0]]
        rt.add_grad(ins[0], np.where(x > 0.0, dy, dy * opts[_ALPHA]))
        return
    y = rt.t[outs[0]]
    if code == _SOFTMAX:
        rt.add_grad(ins[0], softmax_grad(dy, y, opts[_BETA]))
    elif code == _ELU:
        rt.add_grad(ins[0], np.where(y > 0.0, dy, dy * (y + 1.0)))
    else:
        rt.add_grad(ins[0], act_grad(dy, y, _OPS[code]))


def _rows(a):
    # per-row column vector (rows, 1) of a row reduction
    return a.reshape((a.shape[0], 1)) if a.shape[0] > 1 else a


def softmax(x, beta=1.0):
    """Softmax over the last axis of a 2-D (rows, C) array."""
    if x.shape[0] == 1:
        e = np.exp((x - np.max(x)) * beta)
        return e / np.sum(e)
    e = np.exp((x - _rows(np.max(x, axis=1))) * beta)
    return e / _rows(np.sum(e, axis=1))


def softmax_grad(dy, y, beta=1.0):
    if y.shape[0] == 1:
        s = np.sum(dy * y)
        return (dy - s) * y * beta
    return (dy - _rows(np.sum(dy * y, axis=1))) * y * beta
