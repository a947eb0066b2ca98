# CONCATENATION and PAD of int8 tensors (utrain.q8 layer kind CAT), loaded only by a
# layer table that has one: forward and gradient side by side.  Each input is placed
# in the output as q8.json's 'cp' says, four numbers an input: rows, row length, the
# output's stride between rows, the first row's offset (host_tools/prepare/quant.py
# _cat_layer: any axis of a CONCATENATION, the padded axes of a PAD, that one strided
# copy can place).  An input at the output's scale and zero point is copied ('mul' 0);
# another is requantized to the output's (rqk with s_in / s_out, as a 1x requantizing
# ADD would).  PAD fills the output with its zero point first ('fill').  The gradient:
# each input's is its slice of the output's (the same real units: same scale), gathered
# out; the first input that takes one gets it in place in the output's buffer (a row
# never moves up), the others are held for their producers (utrain.q8hold).
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

from utrain import q8kern as K


@micropython.viper
def fik(y, n: int, v: int):
    # y[i] = v (int8) for n bytes: a PAD's border at the output's zero point
    py = ptr8(y)
    b = v & 255
    for i in range(n):
        py[i] = b


@micropython.viper
def gak(d, g, r: int, n: int, st: int, off: int, add: int):
    # d[p*n + j] = g[off + p*st + j] (int32), or += with add: r rows of n values out of
    # g; in place (d is g) too: a row never moves up (off >= 0, st >= n)
    pd = ptr32(d)
    pg = ptr32(g)
    q = 0
    for p in range(r):
        b = off + p * st
        if add:
            for j in range(n):
                pd[q] += pg[b + j]
                q += 1
        else:
            for j in range(n):
                pd[q] = pg[b + j]
                q += 1


@micropython.viper
def czk(g, y, n: int, lo: int, hi: int):
    # g[i] = 0 (int32) where the int8 output y[i] sat at its clamp lo or hi
    pg = ptr32(g)
    py = ptr8(y)
    for i in range(n):
        t = (int(py[i]) ^ 128) - 128
        if t <= lo or t >= hi:
            pg[i] = 0


def fwd(L, net, t):
    """The output of CAT layer L from the net's tensors t (int8 bytes by tensor index)."""
    d = L.d
    y, cp, ins = L.y, d['cp'], L.ins
    zy, lo, hi = L.zy, L.lo, L.hi
    if d.get('fill'):
        fik(y, L.nout, zy)
    acc, a8 = net.acc, net.acc8
    A = len(acc)
    mv = memoryview
    for j in range(len(ins)):
        x = t[ins[j]]
        r, n, st, off = cp[4 * j], cp[4 * j + 1], cp[4 * j + 2], cp[4 * j + 3]
        if not L.mul[j]:
            K.stk(y, off, st, x, r, n)          # its scale: a copy
            continue
        # requantized through the sums buffer: R rows at a time, or a row in pieces
        m, s, z = mv(L.mul)[j:], mv(L.shf)[j:], d['zi'][j]
        w = n if n < A else A
        R = A // n if n < A else 1
        for r0 in range(0, r, R):
            k = R if r0 + R <= r else r - r0
            for c0 in range(0, n, w):
                c = w if c0 + w <= n else n - c0
                K.exk(acc, mv(x)[r0 * n + c0:], k * c, z, 0)
                K.rqk(acc, k * c, 1, 1, m, s, a8, zy, lo, hi, 0)
                K.stk(y, off + r0 * st + c0, st, a8, k, c)
    return y


def back(L, net, g, s):
    """The gradient of CAT layer L's inputs from g, its output's (int32, scale s):
    held for the inputs after the first that takes one, that one's returned (g, s), in
    place in g."""
    d = L.d
    cp, ins, gi = d['cp'], L.ins, L.gi
    if not gi:      # (its inputs below the trained layers: a PAD or copy of a frozen
        return g, s     # branch's tensor that a trained layer after the first one reads)
    n = L.nout
    if d.get('cl'):             # requantized or clamped: nothing passes the clamp
        czk(g, L.y, n, L.lo, L.hi)
    for a in range(len(gi) - 1, 0, -1):
        j = gi[a]
        s = net.H.hold(ins[j], g, s, n, cp[4 * j:4 * j + 4])   # (utrain.q8hold)
    j = gi[0]
    gak(g, g, cp[4 * j], cp[4 * j + 1], cp[4 * j + 2], cp[4 * j + 3], 0)
    return g, s
