# Sparse update of int8 layers (issue 29), loaded only by a layer table that uses it
# (utrain.q8): a layer whose output no backward step reads keeps a 1-bit mask of where
# its output was inside its fused activation's (and int8's) range instead of the int8
# output itself, as the Tiny Training Engine keeps a bias-trained layer's ReLU mask.
# Viper code like q8kern (host_tools compiles it for the board's architecture).
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER
from utrain import q8kern as K
if not VIPER:
    from utrain.q8kern import ptr8, ptr32


@micropython.viper
def mkk(m, y, n: int, lo: int, hi: int) -> int:
    # bit i of m (byte i >> 3, bit i & 7) = 1 where lo < y[i] < hi (int8 y): the
    # positions the gradient passes (shk's mask); returns how many y are at hi or above
    # (utrain.q8range counts a masked layer's top clamp so: y itself is not kept)
    pm = ptr8(m)
    py = ptr8(y)
    b = 0
    v = 0
    c = 0
    for i in range(n):
        t = (int(py[i]) ^ 128) - 128
        if lo < t and t < hi:
            v |= 1 << b
        elif t >= hi:
            c += 1
        b += 1
        if b == 8:
            pm[i >> 3] = v
            b = 0
            v = 0
    if b:
        pm[n >> 3] = v
    return c


@micropython.viper
def smk(d, x, n: int, k: int, m, p: int):
    # q8kern.shk with the mask bits m (mkk's) in place of the output: d[i] = int8 of
    # x[j] / 2^k (rounded half away from zero, clamped to +-127) where bit i is set, else
    # 0; j = i, or i mod p for p > 0 (x: one row of p values broadcast over the rows, a
    # MEAN's gradient)
    pd = ptr8(d)
    px = ptr32(x)
    pm = ptr8(m)
    h2 = (1 << k) >> 1
    j = 0
    for i in range(n):
        q = j
        j += 1
        if j == p:
            j = 0
        if not ((int(pm[i >> 3]) >> (i & 7)) & 1):
            pd[i] = 0
            continue
        v = int(px[q])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        if v < 0:
            r = 0 - ((h2 - v) >> k)
        else:
            r = (v + h2) >> k
        if r > 127:
            r = 127
        if r < -127:
            r = -127
        pd[i] = r & 255


@micropython.viper
def smc(d, x, k: int, m, o0: int, c: int, O: int, P: int, p: int):
    # smk for output channels o0..o0+c-1 alone of a layer of P positions of O channels
    # (a streamed layer's chunk): d[r*c + j] = int8 of x[i mod p] / 2^k where bit i of
    # m is set, else 0, i = r*O + o0 + j (x: one row of p values broadcast)
    pd = ptr8(d)
    px = ptr32(x)
    pm = ptr8(m)
    h2 = (1 << k) >> 1
    t = 0
    for r in range(P):
        i = r * O + o0
        q = i
        while q >= p:
            q -= p
        for j in range(c):
            if (int(pm[i >> 3]) >> (i & 7)) & 1:
                v = int(px[q])
                h = v >> 16
                v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
                if v < 0:
                    e = 0 - ((h2 - v) >> k)
                else:
                    e = (v + h2) >> k
                if e > 127:
                    e = 127
                if e < -127:
                    e = -127
                pd[t] = e & 255
            else:
                pd[t] = 0
            t += 1
            i += 1
            q += 1
            if q == p:
                q = 0


@micropython.viper
def smb(s, x, k: int, m, O: int, P: int):
    # a row-fed layer's bias sums from its broadcast row alone (x: O values, one a
    # channel): s[o] = the int8 of x[o] / 2^k (smc's) times the positions r < P whose
    # mask bit r*O + o is set: smc's dz summed over positions (sumk), all O channels in
    # one call, no dz made (utrain.q8 _back)
    ps = ptr32(s)
    px = ptr32(x)
    pm = ptr8(m)
    h2 = (1 << k) >> 1
    for o in range(O):
        c = 0
        i = o
        for r in range(P):
            c += (int(pm[i >> 3]) >> (i & 7)) & 1
            i += O
        if c == 0:
            ps[o] = 0
            continue
        v = int(px[o])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        if v < 0:
            e = 0 - ((h2 - v) >> k)
        else:
            e = (v + h2) >> k
        if e > 127:
            e = 127
        if e < -127:
            e = -127
        ps[o] = e * c


@micropython.viper
def dak(dx, dz, w, o0: int, m: int, O: int, P: int, I: int):
    # the input gradient of an FC (P = 1) or a 1x1 stride-1 conv (P positions) from
    # output channels o0..o0+m-1 whose weights w hold (a chunk read from flash), added:
    # dx[p*I + i] += sum_j dz[p*O + o0 + j] * w[j*I + i] (int8 dz and w, int32 dx)
    pd = ptr32(dx)
    pz = ptr8(dz)
    pw = ptr8(w)
    for p in range(P):
        zb = p * O + o0
        xb = p * I
        for j in range(m):
            z = (int(pz[zb + j]) ^ 128) - 128
            if z == 0:
                continue
            wb = j * I
            for i in range(I):
                pd[xb + i] += z * ((int(pw[wb + i]) ^ 128) - 128)


def dxch(net, L, dx, dz, g, k, p, P, I, nc):
    # the input gradient dx (P rows of I) of streamed layer L fed a broadcast row g (its
    # dz made a chunk at a time, utrain.q8 Q8Net._chunks): where more channels fit past
    # dx's rows than in the weight scratch (nc) and dz holds one row more than a chunk's,
    # a chunk's weights read there, the rows' shared part (flk) summed in the bias sums
    # (free: L's were stepped before) or else the buffer's last I values, and added to
    # every row at the end
    # (viper and assembler kernels, and dx within the weight scratch, idle here: dx summed
    # there and its whole buffer takes the weights, copied back at the end: fewer chunks,
    # each ~0.5 ms of a Pico's calls and reads)
    sr, d = net.bs, dx
    n = len(dx) - (0 if len(sr) >= I else I)
    wa = memoryview(dx)[P * I:n] if n >= P * I else None
    cap = len(dz) // (P + 1)
    w = net.wide(wa, I, cap, nc)
    if VIPER and len(net.wbuf or b'') >= 4 * P * I and len(sr) >= I and net.wide(
            dx, I, cap, nc) > w:
        d, wa = net.wbuf, memoryview(dx)
        w = net.wide(wa, I, cap, nc)
        K.zk(d, P * I)
    if w:
        if n < len(dx):
            sr = memoryview(dx)[n:]
        K.zk(sr, I)
    off, rd = net.woff[L.d['wt']], net._read
    if w and not VIPER:     # (the weights as the kernels read int8: bytes on CPython)
        wa = wa.cast('B')
    for o0, m in net._chunks(L, g, k, p, w):
        if w:
            r = rd(off + o0 * I, wa, m * I)
            flk(dz, m, P)
            dak(d, dz, r, 0, m, m, P, I)
            dak(sr, dz, r, P * m, m, (P + 1) * m, 1, I)
        else:
            dak(dx, dz, L.rows(o0, m, I), 0, m, m, P, I)
    if d is not dx:
        K.cpk(dx, d, P * I)
    if w:
        for q in range(P):
            K.adk(memoryview(dx)[q * I:], sr, I)


@micropython.viper
def mzk(g, n: int, m):
    # g[i] = 0 (int32) where bit i of mask m is clear (a residual ADD's clamp)
    pg = ptr32(g)
    pm = ptr8(m)
    for i in range(n):
        if not ((int(pm[i >> 3]) >> (i & 7)) & 1):
            pg[i] = 0


# ARM boards: dak, mkk, smk, smc, smb and flk on q8asm's assembler loops (_da: two
# nonzero dz a turn; _mk, _sm, _sb, _fl: ~10-30 cycles a value for viper's ~80-120 on a
# Cortex-M0+); the viper ones above (V; flk's in q8vk) stay their reference:
# tests/support/q8kern_cases.py compares them on the board
V = None
from utrain.q8kern import _A  # noqa: E402
if _A is not None:
    V = {'dak': dak, 'mkk': mkk, 'smk': smk, 'smc': smc, 'smb': smb}
    dak, mkk, smk, smc, smb, flk = _A.dak, _A.mkk, _A.smk, _A.smc, _A.smb, _A.flk
else:       # (flk's viper loop: q8vk's, which an ARM board does not load)
    from utrain.q8vk import flk

if not VIPER:
    import sys
    if sys.implementation.name != 'micropython':    # CPython: the loops in numpy
        try:
            from utrain.q8np import install_sparse
            install_sparse(globals())
        except ImportError:
            pass
