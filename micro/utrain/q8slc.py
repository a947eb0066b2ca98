# SLICE, STRIDED_SLICE, SPLIT / SPLIT_V and TRANSPOSE of int8 tensors (utrain.q8 layer
# kind SLC: a SPLIT is one layer per output), loaded only by a layer table that has one:
# forward and gradient side by side.  The output is one strided copy out of the input,
# as q8cat places an input into its output the other way: q8.json's 'cp' is rows, row
# length, the input's stride between rows, the first row's offset
# (host_tools/prepare/quant.py _slice_layers, the same _copy_rows as a CONCATENATION's);
# or, where no such copy makes it (a transpose, a slice of several axes), 'gx': a
# gather over the output as 4 dims, the input's stride along each, the offset
# (_gather); its gradient goes into the net's other buffer (q8.gtwo), not in place.
# The bytes are copied (TFLite Micro's kernels copy them: the scale and zero point do
# not change); the gradient is the output's scattered back into an input-sized one,
# zero elsewhere ('sr': the output's scale over the input's, where they differ).
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

from array import array
from utrain import q8kern as K


@micropython.viper
def gik(y, x, r: int, n: int, st: int, off: int):
    # y[p*n + j] = x[off + p*st + j] (int8): r rows of n bytes out of x
    py = ptr8(y)
    px = ptr8(x)
    q = 0
    for p in range(r):
        b = off + p * st
        for j in range(n):
            py[q] = px[b + j]
            q += 1


@micropython.viper
def sck(d, g, r: int, n: int, st: int, off: int, nin: int):
    # d[off + p*st + j] = g[p*n + j] (int32) for r rows of n, d[:nin] 0 elsewhere; the
    # last row first, so in place (d is g) too: a value never moves down
    pd = ptr32(d)
    pg = ptr32(g)
    e = nin
    p = r - 1
    while p >= 0:
        b = off + p * st
        i = e - 1
        while i >= b + n:
            pd[i] = 0
            i -= 1
        j = n - 1
        while j >= 0:
            pd[b + j] = pg[p * n + j]
            j -= 1
        e = b
        p -= 1
    i = e - 1
    while i >= 0:
        pd[i] = 0
        i -= 1


@micropython.viper
def g4k(y, x, gm, d: int):
    # y[i] = x[o + c0 S0 + c1 S1 + c2 S2 + c3 S3] (int8; the output's dims gm[0:4] with
    # c0..c3 in order, the input's strides gm[4:8], o = gm[8]), or with d the gradient's
    # way back (int32 y, x): y[that position] = x[i]
    pm = ptr32(gm)
    D0 = int(pm[0])
    D1 = int(pm[1])
    D2 = int(pm[2])
    D3 = int(pm[3])
    S0 = int(pm[4])
    h = S0 >> 16                # (a stride < 0, a reversed slice: ptr32 reads zero-extend
    S0 = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (S0 & 0xffff)    # on 64-bit ports)
    S1 = int(pm[5])
    h = S1 >> 16
    S1 = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (S1 & 0xffff)
    S2 = int(pm[6])
    h = S2 >> 16
    S2 = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (S2 & 0xffff)
    S3 = int(pm[7])
    h = S3 >> 16
    S3 = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (S3 & 0xffff)
    o = int(pm[8])
    py = ptr8(y)
    px = ptr8(x)
    qy = ptr32(y)
    qx = ptr32(x)
    i = 0
    for c0 in range(D0):
        for c1 in range(D1):
            for c2 in range(D2):
                p = o + c0 * S0 + c1 * S1 + c2 * S2
                if d:
                    for c3 in range(D3):
                        qy[p] = qx[i]
                        i += 1
                        p += S3
                else:
                    for c3 in range(D3):
                        py[i] = px[p]
                        i += 1
                        p += S3


def fwd(L, net, t):
    """The output of SLC layer L from the net's tensors t (int8 bytes by tensor index)."""
    d = L.d
    if 'rz' in d:           # a resize: utrain.q8rsz, loaded only then
        from utrain import q8rsz
        return q8rsz.fwd(L, net, t)
    if 'gx' in d:
        if getattr(L, 'gx', None) is None:
            L.gx = array('i', d['gx'])
        g4k(L.y, t[L.ins[0]], L.gx, 0)
        return L.y
    cp = d['cp']
    gik(L.y, t[L.ins[0]], cp[0], cp[1], cp[2], cp[3])
    return L.y


def back(L, net, g, s):
    """The gradient of SLC layer L's input from g, its output's (int32, scale s)."""
    d = L.d
    if 'rz' in d:
        from utrain import q8rsz
        return q8rsz.back(L, net, g, s)
    n = d['gn']
    dx = net._gbuf(g, n)
    if 'gx' in d:               # (dx is not g: q8.gtwo)
        K.zk(dx, n)
        g4k(dx, g, L.gx, 1)
        return dx, s * d.get('sr', 1.0)
    cp = d['cp']
    sck(dx, g, cp[0], cp[1], cp[2], cp[3], n)
    return dx, s * d.get('sr', 1.0)
