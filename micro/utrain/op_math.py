# Elementwise math that exporters emit for LayerNorm and transformer-style blocks, forward
# and gradient side by side:
# RSQRT (76) y = 1 / sqrt(x)      dx = -0.5 y^3 dy          saves y
# SQRT  (75) y = sqrt(x)          dx = 0.5 / y dy           saves y
# EXP   (47) y = exp(x)           dx = y dy                 saves y
# LOG   (73) y = log(x)           dx = dy / x               saves x
#            (Keras's softplus: EXP, ADD 1, LOG)
# GELU (150) y = x Phi(x), Phi the normal CDF (option 0: approximate = 0), or
#            y = 0.5 x (1 + tanh(c (x + k x^3))) (approximate = 1, c = sqrt(2/pi),
#            k = 0.044715); dx = (Phi + x Phi') dy          saves x
#            (option slot utrain.opc APPROX)
# ulab has no erf in every build, so Phi(x) = 1 - q for x >= 0 and q for x < 0 with
# q = 0.5 erfc(|x| / sqrt 2) = 0.5 P(t) exp(-z^2), z = |x| / sqrt 2, t = 1 / (1 + p z),
# P a quintic (Abramowitz-Stegun 7.1.26: |error of erf| < 1.5e-7, below float32's
# resolution of Phi near 1).  The gradient differentiates that same function (Phi' =
# -q'(z) / sqrt 2 on both sides), so it matches finite differences of the forward.
# ROUND (116) y = round(x), half to even (TFLite's, torch.round)   no gradient
# FLOOR   (8) y = floor(x)          CEIL (104) y = ceil(x)          no gradient
# SIGN  (158) y = -1, 0 or 1 (NaN: 0)                                 no gradient
#            (steps: dy/dx = 0, as torch has it; the host lists no data input, so no
#            backward runs); element by element (the array subset has no rounding)
# EXP, LOG, SQRT and RSQRT give 0 where dy is 0 (op_act.keep0): a select's untaken side
# (tico's Softplus beyond its threshold: EXP overflows past 88) has dy = 0 where their
# factor is inf or NaN.  Temporaries: a few arrays of x's size.
from math import ceil, floor
from utrain.xnp import np, const, zeros
from utrain.op_act import keep0
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_SQRT = const(75)
_RSQRT = const(76)
_EXP = const(47)
_LOG = const(73)
_GELU = const(150)
_ROUND = const(116)
_FLOOR = const(8)
_CEIL = const(104)
_SIGN = const(158)
_APPROX = const(0)
_WHOLE = 4503599627370496.0       # 2^52: every float this large is a whole number

_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_R2 = 0.7071067811865476          # 1 / sqrt 2
_C, _K = 0.7978845608028654, 0.044715


def _q(x, grad):
    # q(z) = 0.5 erfc(z) at z = |x| / sqrt 2 and (grad) Phi'(x) = -q'(z) / sqrt 2
    z = abs(x) * _R2
    t = 1.0 / (z * _P + 1.0)
    a1, a2, a3, a4, a5 = _A
    p = (((t * a5 + a4) * t + a3) * t + a2) * t + a1           # P(t) / t
    e = np.exp(-(z * z)) * 0.5
    q = p * t * e
    if not grad:
        return q, None
    dp = (((t * (5.0 * a5) + 4.0 * a4) * t + 3.0 * a3) * t + 2.0 * a2) * t + a1   # P'(t)
    # q' = 0.5 e^-z^2 (P'(t) dt/dz - 2 z P), dt/dz = -p t^2
    return q, (dp * (t * t * _P) + z * 2.0 * p * t) * e * _R2


def gelu(x, approx):
    if approx:
        u = np.tanh((x * x * _K + 1.0) * x * _C)
        return (u + 1.0) * x * 0.5
    q, _ = _q(x, False)
    return x * np.where(x >= 0.0, 1.0 - q, q)


def gelu_grad(x, approx):
    if approx:
        u = np.tanh((x * x * _K + 1.0) * x * _C)
        return (u + 1.0) * 0.5 + (1.0 - u * u) * (x * x * (3.0 * _K) + 1.0) * x * (0.5 * _C)
    q, d = _q(x, True)
    return np.where(x >= 0.0, 1.0 - q, q) + x * d


def _each(x, code):
    f = round if code == _ROUND else (floor if code == _FLOOR else ceil)
    y = zeros(x.shape)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[i, j]
            y[i, j] = f(v) if -_WHOLE < v < _WHOLE else v      # (inf, NaN: as they are)
    return y


def forward(rt, op):
    code, ins, outs, o = op
    x = rt.t[ins[0]]
    if code == _ROUND or code == _FLOOR or code == _CEIL:
        y = _each(x, code)
    elif code == _SIGN:
        y = np.where(x > 0.0, 1.0, np.where(x < 0.0, -1.0, 0.0))
    elif code == _RSQRT:
        y = 1.0 / np.sqrt(x)
    elif code == _SQRT:
        y = np.sqrt(x)
    elif code == _EXP:
        y = np.exp(x)
    elif code == _LOG:
        y = np.log(x)
    else:
        y = gelu(x, o[_APPROX])
    rt.t[outs[0]] = y


def backward(rt, op, dy, flags):
    code, ins, outs, o = op
    if code == _GELU:
        g = dy * gelu_grad(rt.t[ins[0]], o[_APPROX])
    elif code == _LOG:
        g = dy / rt.t[ins[0]]
    elif code == _EXP:
        g = dy * rt.t[outs[0]]
    else:
        y = rt.t[outs[0]]
        g = dy * (y * y * y * -0.5) if code == _RSQRT else dy * (0.5 / y)
    rt.add_grad(ins[0], g if code == _GELU else keep0(g, dy))
