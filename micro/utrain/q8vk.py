# The viper kernels of utrain.q8kern that utrain.q8asm replaces on ARM boards (the
# multiply-adds, the requantization, the int8 updates), in a module of their own: q8kern
# loads them where no q8asm is staged (the unix port, ESP32, CPython through q8np); a
# training run on an ARM board never does (8.5 KB of armv6m code in an RP2040's heap),
# only the tests and benches that compare both (q8kern.vk(); also q8sparse's flk, q8grow's
# c7n and gsk).  Same conventions as q8kern (viper: unboxed machine ints, ptr8/ptr32; CPython: the
# same integers).
from utrain.q8viper import micropython, VIPER
if not VIPER:
    from utrain.q8viper import ptr8, ptr32


@micropython.viper
def fck(acc, x, xo: int, xz: int, w, b, n: int, ni: int, no: int):
    # FULLY_CONNECTED: acc[r*no + o] = b[o] + sum_i (x[xo + r*ni + i] - xz) * w[o*ni + i]
    pa = ptr32(acc)
    px = ptr8(x)
    xc = 128 + xz        # (x ^ 128) - xc = x - xz for the int8 byte x
    pw = ptr8(w)
    pb = ptr32(b)
    q = 0
    for r in range(n):
        xb = xo + r * ni
        for o in range(no):
            v = int(pb[o])
            h = v >> 16
            s = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
            wb = o * ni - xb
            for t in range(xb, xb + ni):
                s += ((int(px[t]) ^ 128) - xc) * ((int(pw[t + wb]) ^ 128) - 128)
            pa[q] = s
            q += 1


@micropython.viper
def convk(acc, x, xz: int, g, w, b):
    # CONV_2D, batch 1, NHWC input [H, W, I], weights [O, KH, KW, I]; g: array('i') of
    # H, W, I, O, KH, KW, stride h, w, pad top, left, OH, OW, dilation h, w.  Padded
    # taps are skipped (TFLite Micro's input offset makes them zero).
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; I = pg[2]; O = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    pa = ptr32(acc)
    px = ptr8(x)
    xc = 128 + xz        # (x ^ 128) - xc = x - xz for the int8 byte x
    pw = ptr8(w)
    pb = ptr32(b)
    q = 0
    for oy in range(OH):
        for ox in range(OW):
            for o in range(O):
                v = int(pb[o])
                h = v >> 16
                s = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
                for ky in range(KH):
                    iy = oy * sh - ph + ky * dh
                    if iy < 0 or iy >= H:
                        continue
                    for kx in range(KW):
                        ix = ox * sw - pw_ + kx * dw
                        if ix < 0 or ix >= W:
                            continue
                        xb = (iy * W + ix) * I
                        wb = ((o * KH + ky) * KW + kx) * I - xb
                        for t in range(xb, xb + I):
                            s += ((int(px[t]) ^ 128) - xc) * ((int(pw[t + wb]) ^ 128) - 128)
                pa[q] = s
                q += 1


@micropython.viper
def rqk(acc, n: int, c: int, blk: int, mul, shf, out, zp: int, lo: int, hi: int,
        wide: int):
    # Requantize n int32 sums (channel (index // blk) % c: blk 1 for activations
    # [..., c], the row length for weights [c, blk]) as TFLite Micro's
    # MultiplyByQuantizedMultiplier (double rounding: SaturatingRoundingDoublingHighMul
    # then RoundingDivideByPOT).  The 62-bit product is done in 15-bit limbs so a
    # 32-bit port gets the same integers.  wide=0: out int8 = clamp(r + zp, lo, hi);
    # wide=1: out int32 = r (no offset, no clamp); wide > 1 (blk 1): int8 outputs in rows
    # wide apart, value r*c + j to out[r*wide + j] (a chunk of channels into its layer's
    # output, no copy after).
    pa = ptr32(acc)
    pm = ptr32(mul)
    ps = ptr32(shf)
    po8 = ptr8(out)
    po32 = ptr32(out)
    ch = 0
    b = 0
    o = 0
    g = 0
    if wide > 1:
        g = wide - c
        wide = 0
    for i in range(n):
        v = int(pa[i])
        h = v >> 16
        a = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        m = int(pm[ch])
        sh = int(ps[ch])
        h = sh >> 16
        sh = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (sh & 0xffff)
        if sh > 0:
            a = a << sh
            rs = 0
        else:
            rs = 0 - sh
        neg = 0
        if a < 0:
            neg = 1
            a = 0 - a
        u0 = a & 0x7fff
        u1 = (a >> 15) & 0x7fff
        u2 = a >> 30
        m0 = m & 0x7fff
        m1 = (m >> 15) & 0x7fff
        m2 = m >> 30
        # P + nudge, nudge 2^30 (P >= 0) or 2^30 - 1 (P < 0), in base-2^15 columns
        c0 = u0 * m0 + neg * 0x7fff
        c1 = u0 * m1 + u1 * m0 + neg * 0x7fff + (c0 >> 15)
        c2 = u0 * m2 + u1 * m1 + u2 * m0 + (1 - neg) + (c1 >> 15)
        c3 = u1 * m2 + u2 * m1 + (c2 >> 15)
        c4 = u2 * m2 + (c3 >> 15)
        r = ((c2 & 0x7fff) >> 1) | ((c3 & 0x7fff) << 14) | (c4 << 29)
        if neg:
            r = 0 - r
        if rs > 31:         # (|r| < 2^31: 0; a machine shift by 32.. wraps its count)
            r = 0
        elif rs > 0:
            k = (1 << rs) - 1
            t = (k >> 1) + (1 if r < 0 else 0)
            e = r & k
            r = r >> rs
            if e > t:
                r += 1
        if wide:
            po32[i] = r
        else:
            r += zp
            if r < lo:
                r = lo
            if r > hi:
                r = hi
            po8[o] = r & 255
        o += 1
        b += 1
        if b == blk:
            b = 0
            ch += 1
            if ch == c:
                ch = 0
                o += g


@micropython.viper
def gwk(g, dz, zo: int, x, xo: int, xz: int, lo: int, hi: int, ni: int):
    # weight gradient of FC, one sample: g[(o-lo)*ni + i] += dz[zo + o] * (x[xo + i] - xz)
    # for the training rows lo <= o < hi (int8 dz and x, int32 g)
    pg = ptr32(g)
    pz = ptr8(dz)
    px = ptr8(x)
    xc = 128 + xz        # (x ^ 128) - xc = x - xz for the int8 byte x
    q = 0
    for o in range(lo, hi):
        z = (int(pz[zo + o]) ^ 128) - 128
        if z == 0:
            q += ni
            continue
        for t in range(xo, xo + ni):
            pg[q] += z * ((int(px[t]) ^ 128) - xc)
            q += 1


@micropython.viper
def dxk(dx, dz, zo: int, w, no: int, ni: int):
    # input gradient of FC, one sample: dx[i] = sum_o dz[zo + o] * w[o*ni + i] (int32)
    pd = ptr32(dx)
    pz = ptr8(dz)
    pw = ptr8(w)
    for i in range(ni):
        pd[i] = 0
    for o in range(no):
        z = (int(pz[zo + o]) ^ 128) - 128
        if z == 0:
            continue
        wb = o * ni
        for i in range(ni):
            pd[i] += z * ((int(pw[wb + i]) ^ 128) - 128)


@micropython.viper
def cgk(g, dz, x, xz: int, gm, lo: int, hi: int):
    # weight gradient of CONV_2D (batch 1, geometry gm as convk's), output channels
    # lo..hi-1: g[(o-lo), ky, kx, i] += sum over outputs dz[oy, ox, o] * (x[iy, ix, i] - xz)
    pg = ptr32(gm)
    H = pg[0]; W = pg[1]; I = pg[2]; O = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    pd = ptr32(g)
    pz = ptr8(dz)
    px = ptr8(x)
    xc = 128 + xz        # (x ^ 128) - xc = x - xz for the int8 byte x
    KK = KH * KW * I
    for oy in range(OH):
        for ox in range(OW):
            zb = (oy * OW + ox) * O
            for o in range(lo, hi):
                z = (int(pz[zb + o]) ^ 128) - 128
                if z == 0:
                    continue
                for ky in range(KH):
                    iy = oy * sh - ph + ky * dh
                    if iy < 0 or iy >= H:
                        continue
                    for kx in range(KW):
                        ix = ox * sw - pw_ + kx * dw
                        if ix < 0 or ix >= W:
                            continue
                        xb = (iy * W + ix) * I
                        gb = (o - lo) * KK + (ky * KW + kx) * I - xb
                        for t in range(xb, xb + I):
                            pd[t + gb] += z * ((int(px[t]) ^ 128) - xc)


@micropython.viper
def upk(w, d, n: int, seed: int) -> int:
    # int8 update: w[i] -= d[i] / 256 rounded stochastically (d int32 in 1/256 steps of
    # w, e.g. from rqk(wide=1) with 8 more fraction bits), clamped to +-127 (weights are
    # symmetric).  A 30-bit LCG gives the rounding draws; returns its state.
    pw = ptr8(w)
    pd = ptr32(d)
    s = seed
    for i in range(n):
        v = int(pd[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        if v == 0:
            continue
        s = (s * 69069 + 1) & 0x3fffffff
        q = v >> 8
        if (v & 255) > ((s >> 12) & 255):
            q += 1
        if q == 0:
            continue
        r = ((int(pw[i]) ^ 128) - 128) - q
        if r > 127:
            r = 127
        if r < -127:
            r = -127
        pw[i] = r & 255
    return s


@micropython.viper
def upmk(w, d, n: int, p) -> int:
    # upk from unscaled sums: w[i] -= (d[i] * m + h) >> sh (1/256 steps) rounded
    # stochastically as upk, p = array('i') of seed, m, sh, h (m < 2^15, |d[i]| < 2^15: an
    # FC layer's weight-gradient products at batch 1; h <= 2^30: the sum within 31 bits);
    # returns the generator's state.  One pass, no rescaled copy (rqk + upk's two).
    pw = ptr8(w)
    pd = ptr32(d)
    pp = ptr32(p)
    s = pp[0]
    m = pp[1]
    sh = pp[2]
    hf = pp[3]
    for i in range(n):
        v = int(pd[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        v = (v * m + hf) >> sh
        if v == 0:
            continue
        s = (s * 69069 + 1) & 0x3fffffff
        q = v >> 8
        if (v & 255) > ((s >> 12) & 255):
            q += 1
        if q == 0:
            continue
        r = ((int(pw[i]) ^ 128) - 128) - q
        if r > 127:
            r = 127
        if r < -127:
            r = -127
        pw[i] = r & 255
    return s


@micropython.viper
def upek(w, e, d, p):
    # int8 update with the rounding's error kept (issue 33: no rounding noise), p =
    # array('i') of n, m, sh, h: t = the update d[i] in 1/256 weight steps (m 0: d as it
    # is; else (d[i] * m + h) >> sh, as upmk) plus e[i], weight i's int8 remainder from
    # the steps before; w[i] -= (t + 128) >> 8 clamped to +-127, e[i] = the rest (-128..127)
    pw = ptr8(w)
    pe = ptr8(e)
    pd = ptr32(d)
    pp = ptr32(p)
    n = pp[0]
    m = pp[1]
    sh = pp[2]
    hf = pp[3]
    for i in range(n):
        v = int(pd[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        if m:
            v = (v * m + hf) >> sh
        v += (int(pe[i]) ^ 128) - 128
        q = (v + 128) >> 8
        pe[i] = (v - (q << 8)) & 255
        if q == 0:
            continue
        r = ((int(pw[i]) ^ 128) - 128) - q
        if r > 127:
            r = 127
        if r < -127:
            r = -127
        pw[i] = r & 255


@micropython.viper
def cdk(dx, dz, w, gm):
    # input gradient of CONV_2D (geometry gm as convk's): dx[iy, ix, i] = sum over the
    # outputs and taps that read it of dz[oy, ox, o] * w[o, ky, kx, i] (int8 dz and w,
    # int32 dx; padded taps read nothing)
    pg = ptr32(gm)
    H = pg[0]; W = pg[1]; I = pg[2]; O = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    pd = ptr32(dx)
    pz = ptr8(dz)
    pw = ptr8(w)
    for t in range(H * W * I):
        pd[t] = 0
    for oy in range(OH):
        for ox in range(OW):
            zb = (oy * OW + ox) * O
            for o in range(O):
                z = (int(pz[zb + o]) ^ 128) - 128
                if z == 0:
                    continue
                for ky in range(KH):
                    iy = oy * sh - ph + ky * dh
                    if iy < 0 or iy >= H:
                        continue
                    for kx in range(KW):
                        ix = ox * sw - pw_ + kx * dw
                        if ix < 0 or ix >= W:
                            continue
                        xb = (iy * W + ix) * I
                        wb = ((o * KH + ky) * KW + kx) * I - xb
                        for t in range(xb, xb + I):
                            pd[t] += z * ((int(pw[t + wb]) ^ 128) - 128)


@micropython.viper
def nrk(x, n: int) -> int:
    # the k that brings n int32 values x into int8 by x >> k: the least k with
    # max |x[i]| >> k <= 127
    px = ptr32(x)
    m = 0
    for i in range(n):
        v = int(px[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        if v < 0:
            v = 0 - v
        if v > m:
            m = v
    k = 0
    while (m >> k) > 127:
        k += 1
    return k


@micropython.viper
def ubek(b, e, d, n: int, j: int):
    # int32 bias step with its rounding kept (SGD, utrain.q8 _ibias): d[i] in 2^-(8 + j)
    # bias steps, rounded to 1/256 steps, plus the kept fraction e[i] (int8, 1/256 steps)
    # is t; b[i] -= (t + 128) >> 8 (held within +-(2^31 - 1)), e[i] = the rest: the bias
    # held, b[i] - e[i] / 256, moves by exactly the rounded d[i]
    pb = ptr32(b)
    pe = ptr8(e)
    pd = ptr32(d)
    mx = 0x7fff
    mx = (mx << 16) | 0xffff
    h0 = (1 << j) >> 1
    for i in range(n):
        v = int(pd[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        v = ((v + h0) >> j) + (int(pe[i]) ^ 128) - 128
        q = (v + 128) >> 8
        pe[i] = (v - (q << 8)) & 255
        if q == 0:
            continue
        u = int(pb[i])
        h = u >> 16
        u = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (u & 0xffff)
        if q > 0:
            if u < q - mx:
                u = q - mx
        elif u > mx + q:
            u = mx + q
        pb[i] = u - q


@micropython.viper
def flk(dz, m: int, P: int):
    # a broadcast row's chunk of P rows of m dz (each channel's nonzero ones one value e:
    # smc's) and a row after them: where a channel has more than (P + 1) / 2 nonzero, the
    # row after holds e and its P rows -e where they held 0, 0 where e; elsewhere the row
    # after holds 0.  dak over the P rows, plus dak of the row after added to each row:
    # the same integers from min(c, P + 1 - c) rows a channel instead of c
    pz = ptr8(dz)
    s = P * m
    for j in range(m):
        c = 0
        e = 0
        t = j
        for q in range(P):
            if pz[t]:
                c += 1
                e = pz[t]
            t += m
        if 2 * c > P + 1:
            pz[s + j] = e
            e = (256 - e) & 255
            t = j
            for q in range(P):
                if pz[t]:
                    pz[t] = 0
                else:
                    pz[t] = e
                t += m
        else:
            pz[s + j] = 0


@micropython.viper
def c7n(w, t, c) -> int:
    # q8grow's: the +-127 int8 weights of t[0] channels of t[1] weights, t[2] bytes apart
    # in a channel, channels t[3] apart, from w[0]: each channel's count (at most 255)
    # into bytes c; returns them all (one call a layer: a call a channel and a Python
    # loop over them cost a Pico ~45 ms a step over op 62's 168 channels)
    pw = ptr8(w)
    pt = ptr32(t)
    pc = ptr8(c)
    n = pt[1]
    st = pt[2]
    s = 0
    b = 0
    for o in range(pt[0]):
        q = 0
        i = b
        for j in range(n):
            v = int(pw[i])
            if v == 127 or v == 129:
                q += 1
            i += st
        s += q
        if q > 255:
            q = 255
        pc[o] = q
        b += pt[3]
    return s


@micropython.viper
def gsk(s, e, o0: int, n: int):
    # s[i] -= e[o0 + i] for n int32 shifts s, bytes e (the exponents of a layer's weight
    # scales: its bias step's per-channel shifts, utrain.q8 _ibias)
    ps = ptr32(s)
    pe = ptr8(e)
    for i in range(n):
        ps[i] -= int(pe[o0 + i])


@micropython.viper
def ack(a, n: int, t: int):
    # a[i] += t for n int32 values (a layer's kept update shifts moved by the gradient
    # scale's exponent, utrain.q8 _mults: a Python step a channel cost a Pico ~3 ms)
    pa = ptr32(a)
    for i in range(n):
        pa[i] += t
