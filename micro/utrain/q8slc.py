# SLICE, STRIDED_SLICE and SPLIT / SPLIT_V of int8 tensors (utrain.q8 layer kind SLC: a
# SPLIT is one layer per output), loaded only by a layer table that has one: forward
# and gradient side by side.  The output is one strided copy out of the input, as
# q8cat places an input into its output the other way: q8.json's 'cp' is rows, row
# length, the input's stride between rows, the first row's offset
# (host_tools/prepare/quant.py _slice_layers, the same _copy_rows as a CONCATENATION's).
# The bytes are copied (TFLite Micro's kernels copy them: the scale and zero point do
# not change); the gradient is the output's scattered back into an input-sized one,
# zero elsewhere ('sr': the output's scale over the input's, where they differ).
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32


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


def fwd(L, net, t):
    """The output of SLC layer L from the net's tensors t (int8 bytes by tensor index)."""
    cp = L.d['cp']
    gik(L.y, t[L.ins[0]], cp[0], cp[1], cp[2], cp[3])
    return L.y


def back(L, net, g, s):
    """The gradient of SLC layer L's input from g, its output's (int32, scale s)."""
    d = L.d
    cp, n = d['cp'], d['gn']
    dx = net._gbuf(g, n)
    sck(dx, g, cp[0], cp[1], cp[2], cp[3], n)
    return dx, s * d.get('sr', 1.0)
