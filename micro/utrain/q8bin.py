# Elementwise int8 ops of two inputs with numpy-style broadcasting (utrain.q8 layer kind
# BIN: ADD of two shapes, SUB, MUL, DIV, SQUARED_DIFFERENCE, MAXIMUM, MINIMUM, PRELU),
# loaded only by a layer table that has one: forward and gradient side by side.  q8.json
# (host_tools/prepare/quant.py _bin_layer): 'bo' the op (0 ADD, 1 SUB, 2 MUL, 3 DIV,
# 4 SQUARED_DIFFERENCE, 5 MAXIMUM, 6 MINIMUM, 7 PRELU; 8 BATCH_MATMUL: utrain.q8bmm), 'zi' the inputs' zero points, 'mul'/'shf'
# TFLite Micro's multipliers (ADD, SUB, SQUARED_DIFFERENCE: input 1, input 2, the sum /
# difference / squared difference, as add.cc / sub.cc / squared_difference.cc; MUL,
# DIV: the product's, the quotient's, as mul.cc, div.cc; MAXIMUM, MINIMUM: 1, the int8
# values compared as maximum_minimum.cc, one scale; PRELU: x >= 0's, x alpha's, as
# prelu.cc; DIV's per-divisor tables 'rv',
# 'rs', 'ri': quant._div_tables), 'bg' the broadcast: the output as 4 dims, then each input's
# element stride along them (0 where it broadcasts), 'ni' each input's values, 'lb'
# ceil(log2) of how many outputs read each input value, 'si' (MUL, SQUARED_DIFFERENCE,
# PRELU) the gradient's factors' scales, 'tq' an int16 table the gradient reads
# (SQUARED_DIFFERENCE: each input's 256 scaled values as the forward makes them; PRELU:
# the slope of each of alpha's 256 values, then 1, in 2^-k steps), 'kc' (and 'kp', its
# position) a constant input's int8 values.
# The forward is TFLite Micro's integers, a chunk of outputs at a time in the shared sums
# buffer.  The gradient (real units: g at scale s) to input j is g summed over the
# outputs that read each of its values (0 where the output sat at its clamp): ADD g,
# SUB -g for input 2, MUL g times the other input (its int8 value minus its zero point:
# scale s s_other), SQUARED_DIFFERENCE g 2 (x_j - x_other) (tq's difference), MAXIMUM
# and MINIMUM g where input j was the one taken (input 1 on a tie, as TensorFlow's
# gradient), PRELU g where x >= 0, g alpha below; g shifted right first so that the
# sums stay within 31 bits.  The
# first input that takes one gets it in place in g when it does not broadcast, the
# others in the net's other gradient buffer, held for their producers (utrain.q8hold).
# A PRELU's slopes alpha train where its layer has 'ta' (utrain.q8slope).
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr16, ptr32

from array import array
from utrain import q8kern as K


@micropython.viper
def bik(a, x, gm, so: int, i0: int, m: int, z: int, sh: int, mul: int):
    # outputs i0..i0+m-1 of the broadcast input x (int8, zero point z; its strides at
    # gm[so:so+4] over the output's dims gm[0:4]): a[i] = (x - z) << sh, or with mul
    # a[i] *= (x - z) (int32 a)
    pm = ptr32(gm)
    D1 = int(pm[1])
    D2 = int(pm[2])
    D3 = int(pm[3])
    S0 = int(pm[so])
    S1 = int(pm[so + 1])
    S2 = int(pm[so + 2])
    S3 = int(pm[so + 3])
    r = i0 // D3
    c3 = i0 - r * D3
    q = r // D2
    c2 = r - q * D2
    c0 = q // D1
    c1 = q - c0 * D1
    p = c0 * S0 + c1 * S1 + c2 * S2 + c3 * S3
    pa = ptr32(a)
    px = ptr8(x)
    xc = 128 + z
    for i in range(m):
        v = (int(px[p]) ^ 128) - xc
        if mul:
            w = int(pa[i])
            h = w >> 16
            w = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (w & 0xffff)
            pa[i] = w * v
        else:
            pa[i] = v << sh
        c3 += 1
        p += S3
        if c3 >= D3:
            c3 = 0
            p += S2 - D3 * S3
            c2 += 1
            if c2 >= D2:
                c2 = 0
                p += S1 - D2 * S2
                c1 += 1
                if c1 >= D1:
                    c1 = 0
                    p += S0 - D1 * S1


@micropython.viper
def cbk(a, d, n: int, op: int):
    # a[i] = a[i] - d[i] (op 1: SUB's scaled inputs), (a[i] - d[i])^2 (4:
    # SQUARED_DIFFERENCE's), max(a[i], d[i]) (5), min(a[i], d[i]) (6) (int32)
    pa = ptr32(a)
    pd = ptr32(d)
    for i in range(n):
        v = int(pa[i])
        u = v >> 16
        v = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        w = int(pd[i])
        u = w >> 16
        w = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (w & 0xffff)
        if op == 5:
            if w > v:
                v = w
        elif op == 6:
            if w < v:
                v = w
        else:
            v = v - w
            if op == 4:
                v = v * v
        pa[i] = v


@micropython.viper
def bgk(d, g, gm, j: int, x, z: int, sh: int, f: int, y, lo: int, hi: int, ri, xj):
    # the gradient of input j from g (int32, the output's): for each output i whose
    # int8 value y[i] passed its clamp (lo, hi), v = g[i] >> sh (rounded), times
    # (x[o] - z) of the other input x (f & 1), or a DIV's (f & 8): times ri[x2] (int16
    # 2^14 / b by the divisor's byte: x is input 2, read where input 2 is), and for
    # input 2 times (y[i] - z) (f & 16), or SQUARED_DIFFERENCE's (f & 32): times
    # ri[256 j + xj] - ri[256 (1 - j) + x] (its int16 tables 'tq' by the bytes of input
    # j, xj, and of the other, x), or 0 where input j was not the one taken (f & 64:
    # MAXIMUM, f & 128: MINIMUM; input 1 on a tie), or PRELU's (f & 256): times ri[256]
    # where input j (xj) is at or above its zero point z, else ri[x's byte], or 0 where x
    # is at or above z (f & 512: a PRELU's slope, j = 1, with f & 1); negated (f & 2),
    # put at input j's value (its strides in gm, as bik's), added there (f & 4: d zeroed
    # first) or set
    # (each value once: in place in g too, an input that does not broadcast)
    pm = ptr32(gm)
    D0 = int(pm[0])
    D1 = int(pm[1])
    D2 = int(pm[2])
    D3 = int(pm[3])
    t = 4 + 4 * j
    u = 8 - 4 * j
    T0 = int(pm[t])
    T1 = int(pm[t + 1])
    T2 = int(pm[t + 2])
    T3 = int(pm[t + 3])
    U0 = int(pm[u])
    U1 = int(pm[u + 1])
    U2 = int(pm[u + 2])
    U3 = int(pm[u + 3])
    pd = ptr32(d)
    pg = ptr32(g)
    px = ptr8(x)
    py = ptr8(y)
    pr = ptr16(ri)
    pw = ptr8(xj)
    xc = 128 + z
    h2 = (1 << sh) >> 1
    i = 0
    for c0 in range(D0):
        for c1 in range(D1):
            for c2 in range(D2):
                pt = c0 * T0 + c1 * T1 + c2 * T2
                po = c0 * U0 + c1 * U1 + c2 * U2
                for c3 in range(D3):
                    q = (int(py[i]) ^ 128) - 128
                    v = 0
                    if q > lo and q < hi:
                        v = int(pg[i])
                        h = v >> 16
                        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
                        v = (v + h2) >> sh
                        if f & 1:
                            r = (int(px[po]) ^ 128) - xc
                            if f & 512 and r >= 0:
                                r = 0
                            v = v * r
                        if f & 8:
                            w = pt if j else po
                            r = int(pr[int(px[w]) ^ 128])
                            v = v * (((r & 0xffff) ^ 0x8000) - 0x8000)
                            if f & 16:
                                v = v * (q - z)
                        if f & 224:
                            a = int(pw[pt]) ^ 128           # (input j's byte, then the other's)
                            b = int(px[po]) ^ 128
                            if f & 32:
                                r = int(pr[256 * j + a])
                                r = ((r & 0xffff) ^ 0x8000) - 0x8000
                                b = int(pr[256 - 256 * j + b])
                                v = v * (r - (((b & 0xffff) ^ 0x8000) - 0x8000))
                            elif (a < b if f & 64 else a > b) or (a == b and j):
                                v = 0
                        if f & 256:
                            r = 256
                            if (int(pw[pt]) ^ 128) < xc:
                                r = int(px[po]) ^ 128
                            r = int(pr[r])
                            v = v * (((r & 0xffff) ^ 0x8000) - 0x8000)
                        if f & 2:
                            v = 0 - v
                    if f & 4:
                        pd[pt] += v
                    else:
                        pd[pt] = v
                    i += 1
                    pt += T3
                    po += U3


@micropython.viper
def prk(a, b, h, n: int, m, s):
    # PRELU's per-element factors (prelu.cc): where a[i] = x - zx < 0, a[i] times b[i] =
    # alpha - za and its multiplier m[1], s[1] into b[i], h[i]; else m[0], s[0] (int32)
    pa = ptr32(a)
    pb = ptr32(b)
    ph = ptr32(h)
    pm = ptr32(m)
    ps = ptr32(s)
    for i in range(n):
        v = int(pa[i])
        u = v >> 16
        v = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        j = 0
        if v < 0:
            w = int(pb[i])
            u = w >> 16
            pa[i] = v * (((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (w & 0xffff))
            j = 1
        pb[i] = pm[j]
        ph[i] = ps[j]


@micropython.viper
def dvk(a, b, h, t, n: int, rv, rs, z2: int, e: int):
    # a DIV's per-element factors (div.cc): a[i] = x1 - z1 (negated where b < 0), b[i]
    # = x2 - z2 in, out gemmlowp's reciprocal of |b| (rv, rs by x2's byte: b + z2 + 128),
    # h[i] = a's headroom (CountLeadingSignBits), t[i] = e - rs - h (the quotient's
    # shift; t < -31: the quotient is 0, a[i] set 0 and t 0 after the first product)
    pa = ptr32(a)
    pb = ptr32(b)
    ph = ptr32(h)
    pt = ptr32(t)
    pv = ptr32(rv)
    ps = ptr32(rs)
    for i in range(n):
        v = int(pa[i])
        u = v >> 16
        v = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        bx = int(pb[i])
        u = bx >> 16
        bx = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (bx & 0xffff)
        bx += z2 + 128
        r = int(ps[bx])
        if r >= 64:
            v = 0 - v
            r -= 64
        w = v
        if w < 0:
            w = -1 - w
        c = 31
        while w:
            w >>= 1
            c -= 1
        pa[i] = v
        pb[i] = pv[bx]
        ph[i] = c
        pt[i] = e - r - c


@micropython.viper
def dzk(a, m, t, h, n: int, mo: int):
    # between a DIV's two products: m[i] = mo (the output multiplier); where the shift
    # t[i] < -31 TFLite Micro's rounding gives 1 (-1 where SaturatingRoundingDoublingHighMul
    # of the quotient a[i] by mo is negative: quant._tflm_div): h[i] = that, a[i] = t[i]
    # = 0 (dfk puts it in), else h[i] = 0
    pa = ptr32(a)
    pm = ptr32(m)
    pt = ptr32(t)
    ph = ptr32(h)
    for i in range(n):
        pm[i] = mo
        v = int(pt[i])
        u = v >> 16
        v = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        ph[i] = 0
        if v < -31:
            v = int(pa[i])
            u = v >> 16
            v = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
            ph[i] = 1
            if v < -1 or (v == -1 and ((mo - 1) >> 30)):     # (mo > 2^30)
                ph[i] = -1
            pa[i] = 0
            pt[i] = 0


@micropython.viper
def dfk(y, h, n: int, zy: int, lo: int, hi: int):
    # y[i] = zy + h[i] clamped where h[i] != 0 (dzk's)
    py = ptr8(y)
    ph = ptr32(h)
    for i in range(n):
        v = int(ph[i])
        if v:
            u = v >> 16
            v = ((((u & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
            v += zy
            if v < lo:
                v = lo
            if v > hi:
                v = hi
            py[i] = v & 255


def tables(L):
    # the layer's tables (a constant input as q8.json gives it), made once on first use
    d = L.d
    if getattr(L, 'bg', None) is None:
        L.bg = array('i', d['bg'])
        if 'kc' in d:
            L.kc = bytearray(array('b', d['kc']))     # (no list of N ints made)
        if 'rv' in d:           # (a DIV's tables)
            L.rv, L.rs, L.ri = array('i', d['rv']), array('i', d['rs']), array('h', d['ri'])
        if 'tq' in d:           # (a SQUARED_DIFFERENCE's, a PRELU's: its gradient's)
            L.ri = array('h', d['tq'])


def ins(L, t):
    # the layer's two int8 inputs
    tables(L)
    d = L.d
    a = L.ins
    if 'kc' in d:
        return (L.kc, t[a[1]]) if d['kp'] == 0 else (t[a[0]], L.kc)
    return t[a[0]], t[a[1]]


def fwd(L, net, t):
    """The output of BIN layer L from the net's tensors t (int8 bytes by tensor index)."""
    d = L.d
    if d['bo'] == 8:            # BATCH_MATMUL: utrain.q8bmm, loaded only then
        from utrain import q8bmm
        return q8bmm.fwd(L, net, t)
    x1, x2 = ins(L, t)
    if L.back:
        L.x, L.x2 = x1, x2      # (the gradient of a MUL reads them)
    z1, z2 = d['zi']
    gm, y, n = L.bg, L.y, L.nout
    acc = net.acc
    mv = memoryview
    m, s = L.mul, L.shf
    if d['bo'] == 3:            # DIV (div.cc): per element a reciprocal and two products
        q = len(acc) // 4
        a, b, h, s2 = acc, mv(acc)[q:], mv(acc)[2 * q:], mv(acc)[3 * q:]
        for i0 in range(0, n, q):
            c = q if i0 + q <= n else n - i0
            bik(a, x1, gm, 4, i0, c, z1, 0, 0)
            bik(b, x2, gm, 8, i0, c, z2, 0, 0)
            dvk(a, b, h, s2, c, L.rv, L.rs, z2, s[0])
            K.rqk(a, c, c, 1, b, h, a, 0, 0, 0, 1)
            dzk(a, b, s2, h, c, m[0])
            K.rqk(a, c, c, 1, b, s2, mv(y)[i0:], L.zy, L.lo, L.hi, 0)
            dfk(mv(y)[i0:], h, c, L.zy, L.lo, L.hi)
        return y
    if d['bo'] == 7:            # PRELU (prelu.cc): x - z1 >= 0 times the first multiplier,
        q = len(acc) // 3       # else (x - z1)(alpha - z2) times the second
        a, b, h = acc, mv(acc)[q:], mv(acc)[2 * q:]
        for i0 in range(0, n, q):
            c = q if i0 + q <= n else n - i0
            bik(a, x1, gm, 4, i0, c, z1, 0, 0)
            bik(b, x2, gm, 8, i0, c, z2, 0, 0)
            prk(a, b, h, c, m, s)
            K.rqk(a, c, c, 1, b, h, mv(y)[i0:], L.zy, L.lo, L.hi, 0)
        return y
    if d['bo'] == 2:            # MUL: (x1 - z1)(x2 - z2) requantized (mul.cc)
        A = len(acc)
        for i0 in range(0, n, A):
            c = A if i0 + A <= n else n - i0
            bik(acc, x1, gm, 4, i0, c, z1, 0, 0)
            bik(acc, x2, gm, 8, i0, c, z2, 0, 1)
            K.rqk(acc, c, 1, 1, m, s, mv(y)[i0:], L.zy, L.lo, L.hi, 0)
        return y
    # ADD, SUB, SQUARED_DIFFERENCE: each input minus its zero point << 20 (7), scaled by
    # its multiplier, the sum (difference, squared difference) requantized (add.cc, sub.cc,
    # squared_difference.cc); MAXIMUM, MINIMUM: the larger (smaller) input minus the zero
    # point, plus it (one scale: maximum_minimum.cc's int8 values); in halves of the sums buffer
    bo = d['bo']
    h = len(acc) // 2
    a2 = mv(acc)[h:]
    sh = 20 if bo < 2 else 7 if bo == 4 else 0
    for i0 in range(0, n, h):
        c = h if i0 + h <= n else n - i0
        bik(acc, x1, gm, 4, i0, c, z1, sh, 0)
        bik(a2, x2, gm, 8, i0, c, z2, sh, 0)
        if bo < 5:
            K.rqk(acc, c, 1, 1, m, s, acc, 0, 0, 0, 1)
            K.rqk(a2, c, 1, 1, mv(m)[1:], mv(s)[1:], a2, 0, 0, 0, 1)
        if bo:
            cbk(acc, a2, c, bo)
        else:
            K.adk(acc, a2, c)
        o = 2 if bo < 5 else 0          # (the output's multiplier)
        K.rqk(acc, c, 1, 1, mv(m)[o:], mv(s)[o:], mv(y)[i0:], L.zy, L.lo, L.hi, 0)
    return y


def back(L, net, g, s):
    """The gradients of BIN layer L's inputs from g, its output's (int32, scale s): held
    for the inputs after the first that takes one, that one's returned (g, s)."""
    d = L.d
    op = d['bo']
    if op == 8:                 # (BATCH_MATMUL)
        from utrain import q8bmm
        return q8bmm.back(L, net, g, s, bgk)
    n, gi, a, gm = L.nout, L.gi, L.ins, L.bg
    mu = op == 2
    nb = K.nrk(g, n) + 7        # (|g| < 2^nb)
    if op == 7 and 'ta' in d:   # (its slopes train: their gradient first, from g)
        net.sl.grad(L, g, s, nb)     # (utrain.q8slope)
    if op == 3:
        return div_back(L, net, g, s, nb)
    if a[0] == a[1]:
        # x + x: 2g; x - x, (x - x)^2: nothing; x x: 2 g (x - z); max(x, x): g
        if op == 1 or op == 4:
            K.zk(g, n)
        if op != 0 and op != 2:
            return g, s
        sh = nb + 8 * mu - 30
        sh = sh if sh > 0 else 0
        bgk(g, g, gm, 0, L.x, d['zi'][0], sh, mu, L.y, L.lo, L.hi, gm, gm)
        return g, 2 * s * (1 << sh) * (d['si'][0] if mu else 1)
    fb = 8 * mu + 15 * (op == 4 or op == 7)    # (the bits of the factor g is multiplied by)
    ff = mu + (32, 64, 128, 256)[op - 4] if op > 3 else mu
    for i in range(len(gi) - 1, -1, -1):
        j = gi[i]
        nj = d['ni'][j]
        sh = nb + fb + d['lb'][j] - 30
        sh = sh if sh > 0 else 0
        f = ff + 2 * (op == 1 and j == 1)
        dst = g
        if i or nj != n:
            dst = net._gbuf(g, nj)
            K.zk(dst, nj)
            f += 4
        xj = L.x if j == 0 else L.x2
        bgk(dst, g, gm, j, L.x2 if j == 0 else L.x, d['zi'][1 - j if op < 7 else 0], sh, f,
            L.y, L.lo, L.hi, L.ri if op == 4 or op == 7 else gm, xj)
        sj = s * (1 << sh) * (d['si'][1 - j] if 'si' in d else 1)
        if i:
            net.H.hold(a[j], dst, sj, nj)      # (utrain.q8hold: not a chain)
        else:
            return dst, sj
    return g, s                 # (no input takes one: both made below the trained layers)


def div_back(L, net, g, s, nb):
    """back() of a DIV (a / b, real): g / b to a, -g y / b to b (y the output), b's
    reciprocal from the table 'ri' (2^14 / b), at the scales 'si' times s 2^sh."""
    d = L.d
    n, gi, a, gm = L.nout, L.gi, L.ins, L.bg
    if a[0] == a[1]:            # x / x: 1, nothing passes
        K.zk(g, n)
        return g, s
    for i in range(len(gi) - 1, -1, -1):
        j = gi[i]
        nj = d['ni'][j]
        sh = nb + 14 + 8 * j + d['lb'][j] - 30
        sh = sh if sh > 0 else 0
        dst = g
        f = 8 + 18 * j          # (input 2: times y - zy, negated)
        if i or nj != n:
            dst = net._gbuf(g, nj)
            K.zk(dst, nj)
            f += 4
        bgk(dst, g, gm, j, L.x2, L.zy, sh, f, L.y, L.lo, L.hi, L.ri, gm)
        sj = s * (1 << sh) * d['si'][j]
        if i:
            net.H.hold(a[j], dst, sj, nj)      # (utrain.q8hold: not a chain)
        else:
            return dst, sj
    return g, s

