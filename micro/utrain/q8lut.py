# Elementwise int8 ops of one input (utrain.q8 layer kind LUT: LOGISTIC, TANH,
# HARD_SWISH, RELU, RELU6, LEAKY_RELU, ELU, GELU, NEG, EXP, LOG, QUANTIZE as standalone
# ops), loaded only by a layer table that has one: forward and gradient side by side.
# An int8 input takes 256 values, so the host tabulates the op (quant.py _lut_layer):
# 't', the int8 output of each input value -128..127 (in q8.req at 'lt'), and 'dt', the op's
# derivative there (dy/dx in real units, 2^-14 steps, times 'ds' where given: a derivative
# beyond 2, as a division by a small constant; 0 where the output clamps).  A converter's
# float ops between a DEQUANTIZE and a QUANTIZE (NEG, a DIV by a constant) are one too.
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER, nrk
if not VIPER:
    from utrain.q8kern import ptr8, ptr32, ptr16

from array import array


@micropython.viper
def luk(y, x, n: int, t):
    # y[i] = t[x[i] + 128] (int8 x as its byte ^ 128: the table's index)
    py = ptr8(y)
    px = ptr8(x)
    pt = ptr8(t)
    for i in range(n):
        py[i] = pt[int(px[i]) ^ 128]


@micropython.viper
def lgk(g, x, n: int, dt) -> int:
    # g[i] = (g[i] >> sh) * dt[x[i] + 128] / 2^14, rounded (int32 g, int16 dt), sh the
    # least shift that keeps |g >> sh| below 2^16 (no 32-bit overflow); returns sh
    pg = ptr32(g)
    px = ptr8(x)
    pd = ptr16(dt)
    sh = int(nrk(g, n)) - 9      # (q8kern's least sh with |g >> sh| <= 127 = 2^16 / 2^9)
    if sh < 0:
        sh = 0
    for i in range(n):
        v = int(pg[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        d = int(pd[int(px[i]) ^ 128])
        d = ((d & 0xffff) ^ 0x8000) - 0x8000
        p = (v >> sh) * d
        if p < 0:
            pg[i] = 0 - ((8192 - p) >> 14)
        else:
            pg[i] = (p + 8192) >> 14
    return sh


def tables(L):
    # the layer's tables as the kernels read them (made once, on first use): from q8.req
    # at 'lt' (256 int8 outputs, 256 int16 derivatives), or a table's lists.  From q8.req
    # the outputs are kept, one copy an offset (layers whose tables are the same bytes
    # share one: an unrolled RNN's gate at each step), and the derivatives read when its
    # gradient is made, into one array the net's LUT layers share (back): an unrolled
    # GRU's 24 gates held 13 KB of them
    d = L.d
    if 'lt' in d:
        net = L.net
        c = getattr(net, 'lc', None)
        if c is None:
            c = net.lc = {}
            net.ld = array('h', range(256))
        o = d['lt']
        if o not in c:
            f = net.rf
            f.seek(o)
            c[o] = bytearray(256)
            f.readinto(c[o])
        L.tt = c[o]
        return
    L.tt = bytearray([v & 255 for v in d['t']])
    L.dt = array('h', d['dt'])


def fwd(L, net, t):
    """The output of LUT layer L from the net's tensors t (int8 bytes by tensor index)."""
    if 'sm' in L.d:         # a SOFTMAX inside the graph: utrain.q8smx, loaded only then
        from utrain import q8smx
        return q8smx.fwd(L, net, t)
    if L.tt is None:
        tables(L)
    x = t[L.ins[0]]
    if L.back:
        L.x = x             # (its gradient reads the input)
    luk(L.y, x, L.nout, L.tt)
    return L.y


def back(L, net, g, s):
    """The gradient of LUT layer L's input from g, its output's (int32, scale s): in
    place, at scale s 2^sh."""
    d = L.d
    if 'sm' in d:
        from utrain import q8smx
        return q8smx.back(L, net, g, s)
    if 'lt' in d:           # (q8.req's, after its outputs: into the net's one array)
        dt = net.ld
        f = net.rf
        f.seek(d['lt'] + 256)
        f.readinto(dt)
    else:
        dt = L.dt
    sh = lgk(g, L.x, L.nout, dt)
    return g, s * (1 << sh) * d.get('ds', 1)
