# SGD momentum's weight velocities of an int8 run (issue 29), loaded by utrain.q8 only
# with --momentum.  A trained weight's velocity is an int16 in 1/256 weight steps (2
# bytes; it was an int32: 4), kept for a rank's window alone: v = mu v + d, w -= v (d:
# this step's update, 1/256 steps, as upk / upek take it).  mu v is rounded
# stochastically (mu as round(mu 2^15), a draw of q8kern's generator per nonzero v):
# rounded to nearest, a velocity of a few 1/256 steps stays forever (round(0.9 * 4) =
# 4) and walks a weight whose gradient went quiet by that much every step.  |v| is
# held within 32767 (128 weight steps a step: more than the int8 range).  Stored in a
# bytearray of 2 bytes a value (made at its size, zeroed, no temporary), its raw bytes
# in checkpoints.  (vmk and hk, viper, here: native code is heap on an RP2040.)
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

    class ptr16:
        # (the stand-in: a velocity's two little-endian bytes of a bytearray)
        def __init__(self, b):
            self.b = b

        def __getitem__(self, i):
            return self.b[2 * i] | self.b[2 * i + 1] << 8

        def __setitem__(self, i, x):
            self.b[2 * i], self.b[2 * i + 1] = x & 255, (x >> 8) & 255


def vel(L, n):
    """Layer L's n zero velocities (those made with the net where there are), or none where
    its weights step without momentum (q8.json 'nv': prepare found them over the plan's
    limit; its bias keeps its velocity); int8 where 'v8' (a byte each and the layer's
    exponent last: step)."""
    v = L.vw
    k = n + 1 if L.d.get('v8') else 2 * n
    return None if L.d.get('nv') else v if v is not None and len(v) == k else bytearray(k)


def step(L, v, j, d, n, p, seed):
    """The velocities of L's window from j on (n) stepped by d (utrain.q8 Q8Net._upd);
    returns the generator's state.  int8 velocities ('v8', prepare's choice where int16
    ones are over the plan's limit: a MobileNetV2 classifier's 12.5 KB instead of 25):
    v[i] 2^e 1/256 weight steps, e (0..8) the layer's, in v's last byte.  This step's
    velocity r = mu v + d is applied exactly (vma, as vmk's, within +-32767); it is kept
    rounded stochastically to the layer's 2^e steps (vqb); e grows to hold the chunk's
    largest |r| within 127 steps (every kept velocity rescaled, sb) and, where the chunk
    is the whole window, shrinks to the least that does."""
    p[1] = seed
    if not L.d.get('v8'):
        vmk(memoryview(v)[2 * j:] if j else v, d, n, p)
        return p[1]
    w = memoryview(v)[j:] if j else v
    p[2], p[3] = v[-1], 0
    vma(w, d, n, p)
    e, m = v[-1], p[3]
    while e < 8 and m >> e > 127:
        e += 1
    if n == len(v) - 1:
        while e and m >> (e - 1) <= 127:
            e -= 1
    if e != v[-1]:
        sb(v, len(v) - 1, 1, e - v[-1])
        v[-1] = p[2] = e
    vqb(w, d, n, p)
    return p[1]


@micropython.viper
def vma(v, d, n: int, p):
    # int8 velocities v[i] in 2^e 1/256 weight steps (e = p[2]): d[i] = mu v[i] + d[i]
    # (1/256 steps, within +-32767; mu v rounded stochastically, d[i] taken as (d[i] +
    # h) >> sh, as vmk's, p[0], p[1], p[4], p[5]), the largest |d[i]| left in p[3]
    pv = ptr8(v)
    pd = ptr32(d)
    pp = ptr32(p)
    m = int(pp[0])
    s = int(pp[1])
    e = int(pp[2])
    hf = int(pp[4])
    sh = int(pp[5])
    mx = 0
    for i in range(n):
        x = int(pv[i])
        if x > 127:
            x -= 256
        t = (x * m) << e            # |t| <= 2^30
        q = 0
        if t != 0:
            s = (s * 69069 + 1) & 0x3fffffff
            q = t >> 15
            if (t & 0x7fff) > ((s >> 12) & 0x7fff):
                q += 1
        u = int(pd[i])
        h = u >> 16
        u = (((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (u & 0xffff)) + hf
        r = q + (u >> sh)
        if r > 32767:
            r = 32767
        if r < -32767:
            r = -32767
        pd[i] = r
        if r < 0:
            r = 0 - r
        if r > mx:
            mx = r
    pp[1] = s
    pp[3] = mx


@micropython.viper
def vqb(v, d, n: int, p):
    # v[i] = d[i] / 2^e (e = p[2]) rounded stochastically (one draw of p[1]'s generator
    # where it has a remainder), held within +-127
    pv = ptr8(v)
    pd = ptr32(d)
    pp = ptr32(p)
    s = int(pp[1])
    e = int(pp[2])
    k = (1 << e) - 1
    for i in range(n):
        u = int(pd[i])
        h = u >> 16
        r = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (u & 0xffff)
        y = r >> e
        if r & k:
            s = (s * 69069 + 1) & 0x3fffffff
            if (r & k) > ((s >> 12) & k):
                y += 1
        if y > 127:
            y = 127
        if y < -127:
            y = -127
        pv[i] = y & 0xff
    pp[1] = s


@micropython.viper
def sb(v, n: int, st: int, sh: int):
    # the int8 velocities v[0], v[st], ... (n of them) times 2^-sh: sh > 0 rounded half up
    # (a weight scale doubled, utrain.q8grow; a layer's exponent grown), sh < 0 exactly
    # (held within +-127)
    pv = ptr8(v)
    i = 0
    for j in range(n):
        x = int(pv[i])
        if x > 127:
            x -= 256
        if sh > 0:
            x = (x + (1 << (sh - 1))) >> sh
        else:
            x = x << (0 - sh)
        if x > 127:
            x = 127
        if x < -127:
            x = -127
        pv[i] = x & 0xff
        i += st


def setup(net, batch, qmul, _i32):
    """utrain.q8 Q8Net.setup's momentum constants (qmul, _i32: utrain.q8's, passed in: no
    import circle): mu as a multiplier and shift (mum,
    mus: the int32 bias velocities') and vmk's (vmp: round(mu 2^15), the seed).  (The
    float weight scales of bias-only layers at batch 1: dropped by Q8Net.setup, with or
    without momentum.)"""
    from array import array
    mu = net.mom
    net.mum, net.mus = _i32(1), _i32(1)
    net.mum[0], net.mus[0] = qmul(mu)
    # (and step's e, max |r|; vmk / vma's dither h, shift: Q8Net._upd's)
    net.vmp = array('i', [int(round(mu * 32768)), 0, 0, 0, 0, 0])


@micropython.viper
def vmk(v, d, n: int, p):
    # v[i] = mu v[i] + d[i] (int16; d int32, both 1/256 weight steps), held within
    # +-32767, and d[i] = v[i] (what upk / upek apply); mu v rounded stochastically:
    # p[0] = round(mu 2^15) (<= 2^15), p[1] the generator's state (q8kern.upk's LCG,
    # one draw per nonzero v[i], in order), left in p[1]; d[i] taken as (d[i] + h) >> sh,
    # p[4] = h, p[5] = sh (0, 0: as it is; h a dither, 8: d in 1/65536 steps, Q8Net._dith)
    pv = ptr16(v)
    pd = ptr32(d)
    pp = ptr32(p)
    m = int(pp[0])
    s = int(pp[1])
    hf = int(pp[4])
    sh = int(pp[5])
    for i in range(n):
        t = (((int(pv[i]) & 0xffff) ^ 0x8000) - 0x8000) * m        # |t| <= 2^30
        q = 0
        if t != 0:
            s = (s * 69069 + 1) & 0x3fffffff
            q = t >> 15
            if (t & 0x7fff) > ((s >> 12) & 0x7fff):
                q += 1
        u = int(pd[i])
        h = u >> 16
        u = (((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (u & 0xffff)) + hf
        r = q + (u >> sh)
        if r > 32767:
            r = 32767
        if r < -32767:
            r = -32767
        pv[i] = r & 0xffff
        pd[i] = r
    pp[1] = s


@micropython.viper
def hk(v, n: int, st: int):
    # the velocities v[0], v[st], ... (n of them) halved (a weight scale doubled:
    # utrain.q8grow), rounded down as >> rounds
    pv = ptr16(v)
    i = 0
    for j in range(n):
        t = (((int(pv[i]) & 0xffff) ^ 0x8000) - 0x8000) >> 1
        pv[i] = t & 0xffff
        i += st


# ARM boards: vmk on q8masm's Thumb loop (~60 cycles a velocity for viper's ~260 on a
# Cortex-M0+); the viper one (V) stays its reference: tests/support/q8kern_cases.py
V = None
from utrain.q8kern import _A  # noqa: E402
if _A is not None:      # (q8asm staged: so is q8masm)
    V = {'vmk': vmk}
    from utrain.q8masm import vmk

if not VIPER:
    import sys
    if sys.implementation.name != 'micropython':    # CPython: the loop in numpy
        try:
            from utrain.q8np import install
            install(globals(), ('vmk',))
        except ImportError:
            pass
