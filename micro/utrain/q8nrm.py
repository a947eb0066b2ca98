# L2_NORMALIZATION of int8 rows (utrain.q8 layer kind NRM: Keras's UnitNormalization,
# tf.math.l2_normalize over the last axis), loaded only by a layer table that has one:
# forward and gradient side by side.  q8.json (host_tools/prepare/quant.py _l2_layer):
# 'n' the row's length (the last axis), 'si' [1 / s_x] (s_x the input's scale); the output's scale is
# TFLite's fixed 1/128, zero point 0.
# Forward: TFLite Micro's reference_integer_ops::L2Normalization per row: a = x - zx,
# the sum of a^2, its inverse square root as GetInvSqrtQuantizedMultiplierExp computes
# it (gemmlowp's fixed-point Newton iterations: isq, Python ints, once a row), each a
# times it requantized at 2^7 more (rqk: MultiplyByQuantizedMultiplier), clamped to int8.
# Gradient (the float formula, y = a / |a|): dx = (g - y sum(y g)) / (s_x |a|), per row
# in integers: g shifted to g' (a row's sum of a g' within 31 bits), P = sum a g',
# c = round(2^8 P / sum a^2), u = 2^8 g' - a c (|u| < 2^31: |a c| <= 2^8 |g'|), u times
# isq's 1 / |a| (rqk), at scale s 2^sh / (2^8 s_x); a row of zeros passes none.  The
# output's clamp at 127 (y within 1/256 of 1) is not masked: its derivative is ~0 there.
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

from array import array
from utrain import q8kern as K

_M = 0x7fffffff


@micropython.viper
def ssk(x, o: int, n: int, z: int, g, sh: int, r):
    # r[0] = sum (x[o+i] - z)^2 over a row of n int8 values; with sh >= 0 also r[1] =
    # sum (x[o+i] - z) (g[o+i] >> sh, rounded) (int32 g)
    px = ptr8(x)
    pg = ptr32(g)
    pr = ptr32(r)
    xc = 128 + z
    s = 0
    p = 0
    h2 = 0
    if sh > 0:
        h2 = 1 << (sh - 1)
    for i in range(o, o + n):
        a = (int(px[i]) ^ 128) - xc
        s += a * a
        if sh >= 0:
            v = int(pg[i])
            h = v >> 16
            v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
            p += a * ((v + h2) >> sh)
    pr[0] = s
    pr[1] = p


@micropython.viper
def l2k(g, o: int, x, n: int, z: int, sh: int, c: int):
    # g[o+i] = ((g[o+i] >> sh, rounded) << 8) - (x[o+i] - z) c over a row of n (int32 g)
    pg = ptr32(g)
    px = ptr8(x)
    xc = 128 + z
    h2 = (1 << sh) >> 1
    for i in range(o, o + n):
        v = int(pg[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        pg[i] = (((v + h2) >> sh) << 8) - ((int(px[i]) ^ 128) - xc) * c


def _hm(a, b):
    # gemmlowp's SaturatingRoundingDoublingHighMul of int32 a, b
    if a == b == -_M - 1:
        return _M
    p = a * b
    p += 0x40000000 if p >= 0 else 1 - 0x40000000
    r = (p if p >= 0 else -p) >> 31
    return r if p >= 0 else -r


def _pot(x, e):
    # gemmlowp's SaturatingRoundingMultiplyByPOT<e> (e > 0), RoundingDivideByPOT (e < 0)
    if e < 0:
        k = (1 << -e) - 1
        return (x >> -e) + ((x & k) > (k >> 1) + (x < 0))
    t = (1 << (31 - e)) - 1
    return _M if x > t else -_M - 1 if x < -t else x << e


def isq(v):
    """TFLite's GetInvSqrtQuantizedMultiplierExp(v, -1): (multiplier, shift) with
    multiplier 2^(shift - 31) ~ 1 / sqrt(v) (shift TFLite's left shift, <= 0)."""
    if v <= 1:
        return _M, 0
    e = 11
    while v >= 1 << 29:
        v //= 4
        e += 1
    k = 0
    while v << (2 * k + 2) < 1 << 29:      # (CountLeadingZeros' pairs, less one)
        k += 1
    e -= k
    v <<= 2 * k
    h = _pot(v >> 1, -1)
    x = 1 << 28
    for _ in range(5):
        x3 = _pot(_hm(_hm(x, x), x), 6)
        x = _pot(_hm(0x18000000, x) - _hm(h, x3), 3)
    x = _hm(x, 1518500250)
    if e < 0:
        x = ((x << -e) + 0x80000000 & 0xffffffff) - 0x80000000
        e = 0
    return x, -e


def fwd(L, net, t):
    """The output of NRM layer L from the net's tensors t (int8 bytes by tensor index)."""
    x = t[L.ins[0]]
    if L.back:
        L.x = x             # (its gradient reads the input)
    if L.tt is None:
        L.tt = array('i', [0, 0, 0, 0])     # (ssk's sums; a row's multiplier, shift)
    r, D, y, acc, z, mv = L.tt, L.d['n'], L.y, net.acc, L.zx, memoryview
    q, A = mv(r)[2:], len(acc)
    for o in range(0, L.nout, D):
        ssk(x, o, D, z, x, -1, r)
        m, e = isq(r[0])
        r[2], r[3] = m, e + 7
        for c0 in range(0, D, A):
            c = D - c0 if D - c0 < A else A
            K.exk(acc, mv(x)[o + c0:], c, z, 0)
            K.rqk(acc, c, 1, 1, q, mv(q)[1:], mv(y)[o + c0:], L.zy, L.lo, L.hi, 0)
    return y


def back(L, net, g, s):
    """The gradient of NRM layer L's input from g, its output's (int32, scale s): in
    place, at scale s 2^sh / (2^8 s_x)."""
    r, D, x, z, mv = L.tt, L.d['n'], L.x, L.zx, memoryview
    q = mv(r)[2:]
    b = 0
    while (1 << b) < D:
        b += 1
    sh = K.nrk(g, L.nout) + 7 - (15 if b < 8 else 22 - b)   # (|g'| < 2^15, or 2^(22 - b))
    sh = sh if sh > 0 else 0
    for o in range(0, L.nout, D):
        ssk(x, o, D, z, g, sh, r)
        a = r[0]
        if a == 0:
            K.zk(mv(g)[o:], D)
            continue
        c = r[1] * 256
        c = (c + a // 2) // a
        l2k(g, o, x, D, z, sh, c)
        r[2], r[3] = isq(a)
        K.rqk(mv(g)[o:], D, 1, 1, q, mv(q)[1:], mv(g)[o:], 0, 0, 0, 1)
    return g, s * (1 << sh) * L.d['si'][0] / 256
