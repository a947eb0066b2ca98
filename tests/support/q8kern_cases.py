# q8kern's multiply-add kernels on seeded random int8 data and edge cases (odd lengths,
# rows of -128 or 127, extreme zero points, padding, strides, dilation, sub-ranges of
# output channels, offsets, a depthwise multiplier of 2), one digest line per case and
# implementation: `CASE <name> <impl> <digest of every output>`.  Runs unchanged under
# CPython (q8kern as plain Python), unix MicroPython (viper) and on a board with
# utrain.q8asm (then both the assembler kernels and q8kern.vk()'s viper ones); also
# q8sparse.dak, mkk, smk, smc and smb (their viper references: q8sparse.V), and q8mom.vmk
# (momentum's int16 velocities: q8masm's Thumb loop on a board, q8mom.V its viper one),
# q8grow.c7n and gsk (their Thumb loops on a board, q8vk's viper ones).
from array import array
from utrain import q8kern as K
from utrain import q8sparse as S
from utrain import q8mom as M

NAMES = ('fck', 'convk', 'dwk', 'gwk', 'dxk', 'cgk', 'cdk', 'ddk', 'dgk', 'rqk', 'upk', 'sumk')
IMPLS = [('kern', dict([(n, getattr(K, n)) for n in NAMES]))]
IMPLS[0][1]['upmk'] = K.upmk
IMPLS[0][1]['upek'] = K.upek
for _n in ('dak', 'mkk', 'smk', 'smc', 'flk'):
    IMPLS[0][1][_n] = getattr(S, _n)
if getattr(K, 'ASM', False):
    IMPLS = [('asm', IMPLS[0][1]), ('viper', K.vk())]
    IMPLS[1][1].update(S.V)
IMPLS[0][1]['stk'] = K.stk
IMPLS[0][1]['vmk'] = M.vmk
for _n in ('vma', 'vqb', 'sb'):     # (viper alone, every implementation's)
    for _i in IMPLS:
        _i[1][_n] = getattr(M, _n)
if M.V:
    IMPLS[1][1].update(M.V)
IMPLS[0][1]['smb'] = S.smb
IMPLS[0][1]['ubek'] = K.ubek
IMPLS[0][1]['nrk'] = K.nrk
IMPLS[0][1]['ack'] = K.ack


class R:
    def __init__(self, seed):
        self.s = seed

    def bytes(self, n, fill=None):
        b = bytearray(n)
        for i in range(n):
            self.s = (self.s * 1103515245 + 12345) & 0x7fffffff
            b[i] = fill if fill is not None else (self.s >> 13) & 255
        return b

    def ints(self, n, big=1 << 20):
        a = array('i', [0] * n)
        for i in range(n):
            self.s = (self.s * 1103515245 + 12345) & 0x7fffffff
            a[i] = (self.s >> 4) % (2 * big) - big
        return a


def rq_args(r, n, c, big):
    # rqk's n sums within +-big, c multipliers in [2^30, 2^31) and shifts -6..2
    a = r.ints(n, big)
    mul = r.ints(c, 1 << 29)
    shf = r.ints(c, 4)
    for j in range(c):
        mul[j] += 3 << 29
        shf[j] = shf[j] % 9 - 6
    return a, mul, shf


def digest(buf):
    if isinstance(buf, int):
        return buf
    h = 0
    if isinstance(buf, (bytes, bytearray)):
        for v in buf:
            h = (h * 31 + v) & 0x3fffffff
    else:
        for v in buf:
            h = (h * 31 + (v & 0xffffffff)) & 0x3fffffff
    return h


def geo(H, W, I, O, KH, KW, sh, sw, ph, pw, dh=1, dw=1):
    OH = (H + 2 * ph - dh * (KH - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (KW - 1) - 1) // sw + 1
    return array('i', [H, W, I, O, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw])


FC = [  # ni, no, n rows, xz, fill (None: random), lo, hi
    (1, 1, 1, 0, None, 0, 1), (3, 5, 2, -128, None, 1, 4), (17, 7, 1, 127, None, 0, 7),
    (16, 32, 1, -3, None, 0, 32), (33, 9, 3, 5, 0x80, 2, 9), (8, 4, 1, -128, 0x7f, 0, 4)]
CONV = [  # H, W, I, O, KH, KW, sh, sw, ph, pw, dh, dw, xz, fill
    (5, 5, 7, 3, 1, 1, 1, 1, 0, 0, 1, 1, -7, None),        # pointwise
    (5, 4, 3, 5, 1, 1, 2, 2, 0, 0, 1, 1, 4, None),         # 1x1 stride 2
    (6, 5, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1, -128, None),      # padded 3x3
    (7, 6, 1, 6, 4, 3, 2, 1, 1, 2, 1, 1, 127, None),       # one input channel, strides
    (7, 7, 2, 3, 3, 3, 1, 1, 2, 2, 2, 2, 0, None),         # dilation 2
    (4, 4, 5, 2, 3, 3, 1, 1, 1, 1, 1, 1, -128, 0x7f),      # saturated input
]
CONV2 = [  # (run after the others: their seeded data unchanged) q8asm's dot2, rows in pairs
    (2, 3, 8, 5, 1, 1, 1, 1, 0, 0, 1, 1, 6, None),         # pointwise, an even count
    (1, 1, 4, 3, 1, 1, 1, 1, 0, 0, 1, 1, -128, 0x80),      # pointwise, one row
    (3, 4, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 5, None),         # im2col rows: 4 a row, n odd
]
CONV3 = [  # (after CONV2) q8asm's _dot3: pointwise rows in threes, two channels a turn
    (5, 2, 13, 7, 1, 1, 1, 1, 0, 0, 1, 1, -128, None),     # 10 rows: a row left, O odd
    (11, 1, 4, 2, 1, 1, 1, 1, 0, 0, 1, 1, 127, None),      # 11 rows: a pair left
    (3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 3, None),         # one input, one output channel
    (3, 1, 9, 4, 1, 1, 1, 1, 0, 0, 1, 1, -5, 0x80),        # saturated input
    (2, 3, 7, 5, 1, 1, 1, 1, 0, 0, 1, 1, 9, None),         # n 7: weight sums 3 + 4
    (3, 3, 6, 3, 1, 1, 1, 1, 0, 0, 1, 1, -128, None),      # c -128: no weight sums
]
DW = [  # H, W, C, M, K, s, p, xz, fill
    (5, 5, 7, 1, 3, 1, 1, -5, None), (8, 7, 4, 1, 3, 2, 1, 127, None),
    (6, 6, 3, 2, 3, 1, 1, 3, None), (4, 5, 5, 1, 3, 1, 0, -128, 0x80),
    (9, 3, 2, 1, 5, 1, 2, 0, None), (4, 3, 20, 1, 3, 2, 1, 9, None)]   # (C > 16: zeros grown)
RQ = [  # n, channels, values per channel run, wide, |sums| <, shifts from, to
    (40, 4, 1, 0, 1 << 20, -12, 2), (45, 3, 5, 1, 1 << 24, -20, 0), (7, 1, 1, 0, 1 << 30, -31, 0),
    (33, 11, 1, 1, 1 << 28, -9, -1), (24, 2, 12, 0, 1 << 10, 1, 3),
    (30, 1, 30, 1, 1 << 24, -14, 2), (19, 1, 7, 0, 1 << 20, -8, 3),   # (one multiplier, runs)
    (10, 2, 5, 0, 1 << 31, -2, 0), (10, 1, 10, 1, 1 << 31, -31, 0),   # sums near -2^31 and 2^31 - 1
    # right shifts past 31 (a tiny gradient scale: issue 28's first conv, -70; every sum
    # rounds to 0, where numpy's 1 << 64 rounded each up to 1 and a 32-bit viper shift
    # wrapped its count)
    (24, 4, 3, 1, 1 << 31, -80, -28), (21, 3, 1, 0, 1 << 30, -70, -29)]
UP = [(37, 1 << 10, 12345), (64, 1 << 16, 0x3fffffff), (5, 300, 0)]   # n, |d| <, seed


def _convs(r, k, cases, tag, out):
    for i, c in enumerate(cases):
        H, W, I, O, KH, KW, sh, sw, ph, pw, dh, dw, xz, fill = c
        gm = geo(H, W, I, O, KH, KW, sh, sw, ph, pw, dh, dw)
        N = gm[10] * gm[11]
        x = r.bytes(H * W * I, fill)
        w = r.bytes(O * KH * KW * I)
        b = r.ints(O)
        acc = r.ints(N * O)
        k['convk'](acc, x, xz, gm, w, b)
        dz = r.bytes(N * O)
        g = r.ints(O * KH * KW * I)
        k['cgk'](g, dz, x, xz, gm, 0, O)
        g2 = r.ints((O - 1) * KH * KW * I)
        k['cgk'](g2, dz, x, xz, gm, 1, O)
        dx = r.ints(H * W * I)
        k['cdk'](dx, dz, w, gm)
        # (digests at once: the board's heap holds no case's buffers past it)
        out.append((tag + '%d' % i, digest(acc), digest(g), digest(g2), digest(dx)))


class Out:
    # each case's line printed as it is made (its buffers not held: the Pico's heap is
    # short for all of them)
    def __init__(self, name):
        self.name = name

    def append(self, o):
        print('CASE %s %s %s' % (o[0], self.name, ' '.join([str(digest(v)) for v in o[1:]])))


def run(r, name, k):
    out = Out(name)
    for i, (ni, no, n, xz, fill, lo, hi) in enumerate(FC):
        x = r.bytes(n * ni + 3, fill)
        w = r.bytes(ni * no)
        b = r.ints(no)
        acc = array('i', [0] * (n * no))
        k['fck'](acc, x, 3, xz, w, b, n, ni, no)
        dz = r.bytes(no + 2)
        dz[2] = 0
        g = r.ints((hi - lo) * ni)
        k['gwk'](g, dz, 2, x, 1, xz, lo, hi, ni)
        dx = r.ints(ni)
        k['dxk'](dx, dz, 1, w, no, ni)
        out.append(('fc%d' % i, acc, g, dx))
    _convs(r, k, CONV, 'conv', out)
    for i, (H, W, C, M, KS, s, p, xz, fill) in enumerate(DW):
        gm = geo(H, W, C, C * M, KS, KS, s, s, p, p)
        N = gm[10] * gm[11]
        x = r.bytes(H * W * C, fill)
        w = r.bytes(KS * KS * C * M)
        b = r.ints(C * M)
        acc = r.ints(N * C * M)
        k['dwk'](acc, x, xz, gm, w, b)
        dz = r.bytes(N * C * M)
        dx = r.ints(H * W * C)
        k['ddk'](dx, dz, w, gm)
        g = r.ints(KS * KS * C * M)
        k['dgk'](g, dz, x, xz, gm)
        # again on a new geometry of the same words (q8asm keeps a table per shape: a
        # hit), another zero point, then on the first one cut to fewer output rows in
        # place (as q8.py's forward bands a shared geometry: a changed shape)
        g2 = geo(H, W, C, C * M, KS, KS, s, s, p, p)
        acc2 = r.ints(N * C * M)
        k['dwk'](acc2, x, -1 - xz, g2, w, b)
        dx2 = r.ints(H * W * C)
        k['ddk'](dx2, dz, w, g2)
        gw2 = r.ints(KS * KS * C * M)
        k['dgk'](gw2, dz, x, -1 - xz, g2)
        gm[10] -= 1
        acc3 = r.ints(N * C * M)
        k['dwk'](acc3, x, xz, gm, w, b)
        out.append(('dw%d' % i, acc, dx, g, acc2, dx2, gw2, acc3))
    for i, (n, c, blk, wide, big, s0, s1) in enumerate(RQ):
        a = r.ints(n, big)
        a[0] = big - 1
        a[n - 1] = 1 - big
        mul = r.ints(c, 1 << 29)
        shf = r.ints(c, 1 << 20)
        for j in range(c):
            mul[j] += 3 << 29          # [2^30, 2^31)
            shf[j] = s0 + shf[j] % (s1 - s0 + 1)
        mul[0] = 0x7fffffff
        y = array('i', [0] * n) if wide else bytearray(n)
        k['rqk'](a, n, c, blk, mul, shf, y, i - 3, -128 + 5 * i, 127 - 3 * i, wide)
        k['rqk'](a, n, c, blk, mul, shf, a, 0, 0, 0, 1)         # in place
        out.append(('rq%d' % i, y, a))
    for i, (n, big, seed) in enumerate(UP):
        w = r.bytes(n)
        w[0], w[1], w[2] = 0x81, 0x7f, 0x80             # -127, 127, -128
        d = r.ints(n, big)
        for j in range(0, n, 3):
            d[j] = 0
        d[1], d[2] = -(1 << 16), 1 << 16               # saturating updates
        s = k['upk'](w, d, n, seed)
        out.append(('up%d' % i, w, array('i', [s])))
    # upmk: |d| < 2^15, 15-bit multipliers, every shift it takes
    for i, (n, sh, seed) in enumerate(((1, 0, 5), (37, 7, 11), (300, 16, 3), (257, 24, 77),
                                       (64, 31, 9))):
        w = r.bytes(n)
        d = r.ints(n, (1 << 15) - 1)
        for j in range(0, n, 4):
            d[j] = 0
        d[n - 1] = (1 << 15) - 1
        p = array('i', [seed, (1 << 15) - 1 - 977 * i, sh, (1 << (sh - 1)) if sh else 0, 69069])
        s = k['upmk'](w, d, n, p)
        out.append(('upm%d' % i, w, array('i', [s])))
        # upek: the same updates with the rounding's error kept (remainders e), twice
        w, e = r.bytes(n), r.bytes(n)
        w[0] = 0x81
        if n > 4:       # a -128 weight with no step (d[4] 0, no fraction) stays as it is
            w[4], e[4] = 0x80, 0
        for q in (array('i', [n, p[1], sh, p[3]]), array('i', [n, 0, 0, 0])):
            k['upek'](w, e, d, q)
        out.append(('upe%d' % i, w, e))
    # upmk / upek at m 1, sh 8 (Q8Net._dith: d in 1/65536 steps within 2^29, rounded to
    # 1/256 with a dither h under 256): d at several sizes, the ends, -1, zeros
    for i, (n, big, h, seed) in enumerate(((1, 1 << 8, 0, 5), (37, 1 << 12, 255, 11),
                                           (300, 1 << 29, 128, 3), (64, 1 << 17, 77, 9))):
        d = r.ints(n, big)
        for j in range(0, n, 5):
            d[j] = 0
        if n > 3:
            d[1], d[2], d[3] = (1 << 29) - 1, 1 - (1 << 29), -1
        w = r.bytes(n)
        s = k['upmk'](w, d, n, array('i', [seed, 1, 8, h, 69069]))
        out.append(('upf%d' % i, w, array('i', [s])))
        w, e = r.bytes(n), r.bytes(n)
        for _ in range(2):
            k['upek'](w, e, d, array('i', [n, 1, 8, h]))
        out.append(('uef%d' % i, w, e))
    # ubek: int32 biases and their kept fractions (SGD's integer bias step), steps in
    # 2^-(8 + j) bias steps, twice; biases pushed past +-(2^31 - 1) held there
    for i, (n, j) in enumerate(((1, 0), (37, 3), (300, 8))):
        b, e, d = r.ints(n, 1 << 24), r.bytes(n), r.ints(n, 1 << 18)
        for q in range(0, n, 5):
            d[q] = 0
        if n > 2:
            b[0], d[0], b[1], d[1] = 0x7ffffff0, -(1 << 28), -0x7ffffff0, 1 << 28
        for _ in range(2):
            k['ubek'](b, e, d, n, j)
        out.append(('ube%d' % i, b, e))
    # nrk: the shift bringing int32 values into int8 (random sizes, the 127 / 128 edge,
    # +-(2^31 - 1), zeros, none)
    for i, (n, big) in enumerate(((7, 1 << 20), (33, 1 << 30), (5, 100), (4, 1), (0, 1))):
        a = r.ints(n + 1, big)
        if i == 2:
            a[0], a[1] = -128, 127
        if i == 3:
            a[0], a[2] = 0x7fffffff, -0x7fffffff
        out.append(('nr%d' % i, k['nrk'](a, n), k['nrk'](memoryview(a)[1:], n)))
    # q8sparse.dak: a chunk of output channels' input gradient, added (P positions)
    # (zero gradients: skipped rows, two in a row, an odd count of channels)
    for i, (P, O, I, o0, m) in enumerate(((1, 5, 7, 0, 5), (9, 12, 13, 4, 5), (3, 4, 1, 3, 1),
                                          (4, 16, 33, 8, 8), (2, 10, 6, 1, 7))):
        dz = r.bytes(P * O)
        dz[o0] = 0
        if m == 7:
            for q in range(P):
                for j in (2, 3, 5):
                    dz[q * O + o0 + j] = 0
        w = r.bytes(m * I)
        w[0] = 0x80
        dx = r.ints(P * I)
        k['dak'](dx, dz, w, o0, m, O, P, I)
        out.append(('da%d' % i, dx))
    # q8sparse.smb: a row-fed layer's bias sums from its broadcast row at once = smc's dz
    # a chunk of channels at a time summed over positions (sumk), channels whose mask
    # bits are all clear, all set, and rows past the int8 clamp
    for i, (P, O, kk, c) in enumerate(((9, 40, 3, 7), (1, 5, 0, 5), (4, 33, 12, 8))):
        x = r.ints(O, 1 << 18)
        x[0], x[1] = 1 << 24, -(1 << 24)
        mk = r.bytes((P * O + 7) // 8)
        for q in range(P):
            j = q * O + 2
            mk[j >> 3] &= 255 - (1 << (j & 7))
            j += 1
            mk[j >> 3] |= 1 << (j & 7)
        s = r.ints(O)
        k['smb'](s, x, kk, mk, O, P)
        ref, dz = array('i', [0] * O), bytearray(P * c)
        for o0 in range(0, O, c):
            m = min(c, O - o0)
            S.smc(dz, x, kk, mk, o0, m, O, P, O)
            K.sumk(memoryview(ref)[o0:], dz, 0, P, m)
        assert list(s) == list(ref), ('smb', i)
        out.append(('smb%d' % i, s))
    # q8sparse.mkk: the mask bits of lo < y < hi (whole bytes, a partial last byte over
    # old bits, none) and the count at hi or above; y at lo, hi, their neighbours, the ends
    for i, (n, lo, hi) in enumerate(((37, -128, 127), (16, -20, 6), (9, 0, 1), (0, -5, 5),
                                     (64, -128, 0), (5, 126, 127))):
        y = r.bytes(n)
        for q, v in enumerate((lo, hi, lo + 1, hi - 1, -128, 127)[:n]):
            y[(7 * q) % n] = v & 255
        mk = r.bytes((n + 7) // 8 + 1)
        c = k['mkk'](mk, y, n, lo, hi)
        out.append(('mk%d' % i, mk, array('i', [c])))
    # q8sparse.smk / smc: the int8 of x / 2^k (half away from zero, +-127) where the mask
    # passes; x past the clamp, at halves, a row of p broadcast (p 0: none); smc's chunk
    # of c channels of O over P rows (within what the board's gradients take: no sum
    # past int32, k < 31)
    for i, (n, kk, p) in enumerate(((37, 3, 0), (21, 0, 7), (9, 20, 0), (0, 2, 0),
                                    (24, 12, 24))):
        x = r.ints(n if not p else p, 1 << 20)
        for q, v in enumerate((-(1 << 29), 1 << 29, 4, -4, 12, -12, 1 << 14)[:len(x)]):
            x[q] = v
        mk = r.bytes((n + 7) // 8)
        d = r.bytes(n)
        k['smk'](d, x, n, kk, mk, p)
        out.append(('sk%d' % i, d))
    for i, (P, O, o0, c, kk) in enumerate(((9, 40, 7, 12, 4), (1, 5, 0, 5, 0), (3, 33, 30, 3, 18),
                                         (2, 8, 3, 0, 1))):
        x = r.ints(O, 1 << 18)
        x[o0 % O], x[(o0 + 1) % O] = -(1 << 29), 1 << 29
        mk = r.bytes((P * O + 7) // 8)
        d = r.bytes(P * c)
        k['smc'](d, x, kk, mk, o0, c, O, P, O)
        out.append(('sc%d' % i, d))
    # sumk: column sums of n rows of c int8 values less the zero point (a MEAN, bias sums)
    for i, (n, c, xz) in enumerate(((9, 40, 6), (1, 3, -128), (7, 1, 127), (0, 4, 5),
                                    (300, 2, -3))):
        x = r.bytes(n * c)
        if n * c > 2:
            x[0], x[1] = 0x80, 0x7f
        a = r.ints(c)
        k['sumk'](a, x, xz, n, c)
        out.append(('su%d' % i, a))
    _convs(r, k, CONV2, 'pair', out)
    _convs(r, k, CONV3, 'three', out)
    # _dot3 a three a turn (3 * I > _ROWS / 2), a row left: the forward alone (the board's
    # heap holds no int32 input gradient of that size)
    for i, (R, I, O, xz) in enumerate(((7, 350, 3, 9),)):
        gm = geo(R, 1, I, O, 1, 1, 1, 1, 0, 0)
        x = r.bytes(R * I)
        w = r.bytes(O * I)
        b = r.ints(O)
        acc = r.ints(R * O)
        k['convk'](acc, x, xz, gm, w, b)
        out.append(('wide%d' % i, acc))
    # rqk one multiplier a value (q8asm._rq: channel by channel) over a count that is no
    # multiple of the channels, in place (wide) and into bytes; then into bytes over its
    # own sums (q8.Layer.conv's chunks: each sum read before a byte lands on it)
    for i, (n, c) in enumerate(((13, 5), (3, 7), (18, 5), (9, 9))):
        a, mul, shf = rq_args(r, n, c, 1 << 26)
        if i > 1:
            a8 = memoryview(a).cast('B') if hasattr(memoryview(a), 'cast') else a
            k['rqk'](a, n, c, 1, mul, shf, a8, -5, -120, 100, 0)
            out.append(('rqo%d' % i, bytes(a8)[:n]))
            continue
        y = bytearray(n)
        k['rqk'](a, n, c, 1, mul, shf, y, 3, -100, 90, 0)
        k['rqk'](a, n, c, 1, mul, shf, a, 0, 0, 0, 1)
        out.append(('rqc%d' % i, y, a))
    # rqk into int8 rows wide apart (q8.Layer.conv: a chunk of channels into its layer's
    # output; the bytes between untouched), and with lo >= zp (a ReLU's: q8asm._rq gives
    # lo for a sum <= 0 without its product), by channel and per tensor (runs)
    for i, (n, c, st, zp, lo) in enumerate(((18, 6, 9, -128, -128), (9, 9, 11, 3, 3),
                                           (10, 5, 7, -4, 0), (13, 4, 4, -128, -128))):
        a, mul, shf = rq_args(r, n, c, 1 << 24)
        a[0], a[1], a[2] = 0, -1, 1
        y = r.bytes(((n - 1) // c) * st + c + 1)
        k['rqk'](a, n, c, 1, mul, shf, y, zp, lo, 100, st)
        y2 = bytearray(n)
        k['rqk'](a, n, 1, n, mul, shf, y2, zp, lo, 100, 0)
        out.append(('rqs%d' % i, y, y2))
    # q8sparse.flk: a broadcast row's chunk (each column's nonzero dz one value, masked
    # rows: random, all set, none set, -128 and 127, the (P + 1) / 2 edge either side),
    # its P rows and the shared row after them; one row; no channel
    for i, (P, m) in enumerate(((9, 13), (2, 5), (1, 3), (9, 0), (4, 7))):
        dz = r.bytes((P + 1) * m + 2)
        e = r.bytes(m)
        bits = r.bytes(P * m)
        for j in range(m):
            v = (0x80, 0x7f, 0, 1)[j] if j < 4 else e[j]
            for q in range(P):
                on = j == 0 or j == 5 or (j != 6 and (bits[q * m + j] & 3) != 0) or (
                    j == 7 and q <= P // 2) or (j == 8 and q < (P + 1) // 2)
                dz[q * m + j] = v if on else 0
        k['flk'](dz, m, P)
        out.append(('fl%d' % i, dz))
    # stk: rows of a chunk of channels put in place (one row, one channel, none)
    for i, (n, c, ys, yo) in enumerate(((9, 97, 200, 5), (1, 3, 3, 0), (4, 1, 7, 6), (0, 4, 4, 0))):
        src = r.bytes(n * c)
        y = r.bytes(n * ys + yo)
        k['stk'](y, yo, ys, src, n, c)
        out.append(('st%d' % i, y))
    # q8mom.vmk: v = clamp(mu v + d) (+-32767, int16 in bytes), d = v, mu v stochastically
    # rounded (a draw a nonzero v mu, the state left in p[1]): random, the clamps at both
    # ends and d beyond them, zeros (no draw), mu 1 and 0, one value, none, a view past
    # the start; d taken as (d + h) >> sh (a dither, d in 1/65536 steps: Q8Net._dith)
    for i, (n, mu, seed, big, h, sh) in enumerate((
            (50, 29491, 12345, 1 << 12, 0, 0), (9, 32768, 7, 1 << 16, 0, 0),
            (6, 0, 99, 1 << 8, 0, 0), (1, 16384, 1, 3, 0, 0), (0, 29491, 5, 1, 0, 0),
            (40, 31130, 1 << 29, 1 << 30, 0, 0), (50, 29491, 321, 1 << 20, 173, 8),
            (9, 32768, 9, 1 << 25, 255, 8), (40, 31130, 77, 1 << 29, 0, 8))):
        v = r.bytes(2 * n + 4)
        d = r.ints(n + 1, big)
        for q, (a, b) in enumerate(((0x7fff, 100), (0x8001, -100), (0, 5), (0xffff, 0),
                                    (1, 65535), (0x8000, -65536))[:n]):
            v[2 * q + 2], v[2 * q + 3], d[q] = a & 255, a >> 8, b
        p = array('i', [mu, seed, 0, 0, h, sh])
        k['vmk'](memoryview(v)[2:], d, n, p)
        out.append(('vm%d' % i, v, d, p))
    # q8mom.vma / vqb / sb (momentum's int8 velocities, 'v8'): d = clamp(mu v 2^e + d)
    # (+-32767, mu v stochastically rounded), the largest |d| in p[3]; v = d / 2^e rounded
    # stochastically, held within +-127; v times 2^-k at a stride (k > 0 rounded, k < 0
    # exactly, held): random, the clamps, e 0 and 8, zeros, none, a view past the start
    for i, (n, mu, seed, e, big, h, sh) in enumerate((
            (50, 29491, 12345, 3, 1 << 12, 0, 0), (9, 32768, 7, 8, 1 << 16, 0, 0),
            (6, 0, 99, 0, 1 << 8, 0, 0), (1, 16384, 1, 5, 3, 0, 0), (0, 29491, 5, 2, 1, 0, 0),
            (40, 31130, 1 << 29, 7, 1 << 30, 0, 0), (50, 29491, 321, 3, 1 << 20, 173, 8),
            (9, 32768, 9, 8, 1 << 25, 255, 8))):
        v = r.bytes(n + 2)
        d = r.ints(n + 1, big)
        for q, (a, b) in enumerate(((127, 100), (129, -100), (0, 5), (255, 0), (1, 40000),
                                    (128, -40000))[:n]):
            v[q + 1], d[q] = a, b
        p = array('i', [mu, seed, e, 0, h, sh])
        k['vma'](memoryview(v)[1:], d, n, p)
        out.append(('va%d' % i, v, d, p))
        k['vqb'](memoryview(v)[1:], d, n, p)
        out.append(('vq%d' % i, v, d, p))
        for j, (st, sh) in enumerate(((1, 1), (3, 2), (2, -1), (1, -3))):
            k['sb'](memoryview(v)[1:], n // st, st, sh)
            out.append(('sb%d.%d' % (i, j), v))
    # q8kern.ack: a[i] += t, negative, zero, none, a view
    for i, (n, t) in enumerate(((13, 3), (5, -7), (4, 0), (0, 9))):
        a = r.ints(n + 2)
        k['ack'](memoryview(a)[1:], n, t)
        out.append(('ac%d' % i, a))


for name, k in IMPLS:
    run(R(1), name, k)


def grow(r, name, c7n, gsk):
    # q8grow.c7n: each channel's +-127 weights (at most 255) and their total: channels
    # in rows, strided (a depthwise layer's), one window, more than 255 in a channel, an
    # empty channel, none
    out = Out(name)
    for i, (N, n, st, cs) in enumerate(((7, 56, 1, 56), (5, 9, 5, 1), (1, 301, 1, 0),
                                        (2, 300, 1, 300), (3, 0, 1, 4), (0, 8, 1, 8))):
        w = r.bytes(max((N - 1) * cs + (n - 1) * st + 1, 1))
        for j in range(len(w)):
            if w[j] & 3 == 0 or (i == 3 and j < 280):
                w[j] = (127, 129, 128, 126)[(w[j] >> 2) & 3] if i != 3 else 127
        c = r.bytes(N + 2)
        t = array('i', [N, n, st, cs, 0, 0])
        v = c7n(w, t, memoryview(c)[1:])
        out.append(('c7%d' % i, c, array('i', [v])))
    # q8grow.gsk: s[i] -= e[o0 + i] (bytes e up to 255), an offset, one, none
    for i, (n, o0) in enumerate(((40, 0), (7, 5), (1, 2), (0, 1))):
        a = r.ints(n + 1)
        e = r.bytes(n + o0 + 1)
        e[o0] = 255
        gsk(a, e, o0, n)
        out.append(('gs%d' % i, a))


# (q8grow loaded after the other cases: a Pico's heap is short for both; q8vk's c7n is
# its viper one, the reference of q8asm's)
from utrain import q8grow as G  # noqa: E402
for name, k in IMPLS:
    if name == 'viper':
        from utrain import q8vk
    grow(R(2), name, *((q8vk.c7n, q8vk.gsk) if name == 'viper' else (G.c7n, G.gsk)))
