# int8 SOFTMAX inside the graph (attention's softmax(Q K^T): a LUT layer of utrain.q8 with
# 'sm', the rows' length), loaded by utrain.q8lut only for a table that has one: forward
# and gradient side by side.  The final SOFTMAX is the loss's (host_tools/prepare/quant.py).
# q8.json (quant.py _softmax_layer): 'se' gemmlowp's exp_on_negative_values of each
# difference to the row's maximum, 0..255 below it (int32, Q0.31: 0 under TFLite's
# diff_min), 'sf' the same rescaled to 12 integer bits (the sum's terms).
# The forward is TFLite Micro's reference int8 softmax: a row's sum of 'sf', its
# fixed-point reciprocal (GetReciprocal: three Newton-Raphson steps, in Python ints), each
# 'se' times it requantized to the output (scale 1/256, zero point -128).  The gradient
# (in place): dx_i = y_i (g_i - sum_j y_j g_j), y_i = (q_i + 128) / 256, in int32 with g
# shifted right first so that the row's sums stay within 31 bits.
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

from array import array
from utrain import q8kern as K


@micropython.viper
def sxk(a, x, o: int, n: int, e, f) -> int:
    # the row x[o:o+n] (int8): a[i] = e[max - x[i]], returns the sum of f[max - x[i]]
    px = ptr8(x)
    pa = ptr32(a)
    pe = ptr32(e)
    pf = ptr32(f)
    m = -128
    for i in range(n):
        v = (int(px[o + i]) ^ 128) - 128
        if v > m:
            m = v
    s = 0
    for i in range(n):
        k = m - ((int(px[o + i]) ^ 128) - 128)
        pa[i] = pe[k]
        s += int(pf[k])
    return s


@micropython.viper
def sgk(g, y, r: int, n: int, sh: int):
    # for each of r rows of n: g_i = u_i ((256 (g_i >> sh) - sum_j u_j (g_j >> sh)) >> 8),
    # u = y + 128 (y int8, g int32 in place; shifts rounded)
    pg = ptr32(g)
    py = ptr8(y)
    h2 = (1 << sh) >> 1
    o = 0
    for _ in range(r):
        s = 0
        for i in range(o, o + n):
            v = int(pg[i])
            h = v >> 16
            v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
            v = (v + h2) >> sh
            pg[i] = v
            s += v * int(py[i] ^ 128)
        for i in range(o, o + n):
            v = int(pg[i])
            h = v >> 16
            v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
            pg[i] = ((256 * v - s + 128) >> 8) * int(py[i] ^ 128)
        o += n


def _hm(a, b):
    # gemmlowp's SaturatingRoundingDoublingHighMul (Python ints; never both -2^31 here)
    p = a * b
    p += (1 << 30) if p >= 0 else 1 - (1 << 30)
    r = (p if p >= 0 else -p) >> 31
    return r if p >= 0 else -r


def _sat(v):
    return -2147483648 if v < -2147483648 else 2147483647 if v > 2147483647 else v


def recip(x):
    """TFLite's GetReciprocal(x, 12) of a row's sum x > 0: (1 / (1 + a) as gemmlowp's
    one_over_one_plus_x_for_x_in_0_1 of x's mantissa a, num_bits_over_unit)."""
    h = 32
    while x >> (32 - h):
        h -= 1
    hd = ((x << h) - (1 << 31) + (1 << 31)) >> 1        # RoundingHalfSum(a, One)
    v = 1515870810 + _hm(hd, -1010580540)               # 48/17 - 32/17 hd (F2)
    for _ in range(3):
        v += _sat(4 * _hm(v, (1 << 29) - _hm(hd, v)))
    return _sat(2 * v), 12 - h


def fwd(L, net, t):
    """The output of SOFTMAX layer L (utrain.q8lut hands it over) from the net's tensors t."""
    d = L.d
    if L.tt is None:
        L.tt = array('i', d['se'])
        L.dt = array('i', d['sf'])
        L.sm = array('i', [0, 0])          # (a row's multiplier and shift)
    x = t[L.ins[0]]
    n, acc, y, p = d['sm'], net.acc, L.y, L.sm
    mv = memoryview
    for o in range(0, L.nout, n):
        m, b = recip(sxk(acc, x, o, n, L.tt, L.dt))
        p[0], p[1] = m, -23 - b
        K.rqk(acc, n, 1, 1, p, mv(p)[1:], mv(y)[o:], -128, -128, 127, 0)
    return y


def back(L, net, g, s):
    """The gradient of SOFTMAX layer L's input from g, its output's (int32, scale s): in
    place, at scale s 2^sh / 256."""
    n = L.d['sm']
    b = 0
    while (1 << b) < n:
        b += 1
    sh = K.nrk(g, L.nout) + 7 - 21 + b          # (|g| < 2^(21 - b): the sums in 31 bits)
    sh = sh if sh > 0 else 0
    sgk(g, L.y, L.nout // n, n, sh)
    return g, s * (1 << sh) / 256
