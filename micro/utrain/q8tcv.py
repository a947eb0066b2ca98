# TRANSPOSE_CONV of an int8 tensor (utrain.q8 layer kind TCV: Keras's Conv2DTranspose),
# loaded only by a layer table that has one: forward and gradient side by side.
# A transposed convolution is the input gradient of a convolution C and its own input
# gradient is C's forward (as the float path's utrain.op_tconv): q8.json's 'g' is C's
# geometry (host_tools/prepare/quant.py _tconv_layer: C's input H, W, I are this op's
# output, C's output OH, OW, O this op's input), the weights TFLite's [I, KH, KW, O].
# Forward: TFLite Micro's reference_integer_ops::TransposeConv: int32 sums
# acc[iy, ix, i] = b[i] + sum (x[oy, ox, o] - zx) w[i, ky, kx, o] over C's outputs and taps
# that reach (iy, ix) (tfk, C's input-gradient walk), requantized per channel (rqk), clamped.
# Gradient: dx[oy, ox, o] = sum g[iy, ix, i] w[i, ky, kx, o] (tbk, C's forward walk) with
# g masked where the output clamped, shifted into int8 and rescaled per channel by
# s_W[i] / max s_W (2^-14 steps): at scale s 2^sh max s_W.
# Its weights and bias train where q8.json has 'xt' (a layer below it trains: Train,
# among utrain.q8's ext state: checkpoints, trained.wof.q8c): dW[i, ky, kx, o] =
# sum dz[iy, ix, i] (x[oy, ox, o] - zx) (twk, dz unrescaled, at s 2^sh s_x), dL/db the
# int32 g summed (tsk).  Its weights as a CONV_2D's of I channels (Layer.xo: utrain.q8's
# update multipliers, velocities, sums, float32 masters and moments, Q8Net._upd, _put
# and _bias, utrain.q8batch): SGD at batch 1 (and momentum) moves each by lr dL/dW /
# s_W[i] steps, made in 1/65536 steps, rounded to 1/256 with a dither and then
# stochastically (QAS), the int32 bias by lr dL/db / (s_x s_W[i]) rounded; a batch > 1 and
# Adam through their sums.
# Weights and bias are read once (weights.wof's int8 and int32 tensors 'xw', 'xb'), the
# multipliers are q8.json's 'mul', 'shf' (per channel), the weight scales its 'sw'.
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

from array import array
from utrain import q8kern as K


@micropython.viper
def tfk(acc, x, xz: int, w, gm):
    # acc[iy, ix, i] += sum over C's outputs (oy, ox) and taps reaching (iy, ix), and o,
    # of (x[oy, ox, o] - xz) * w[i, ky, kx, o]
    pg = ptr32(gm)
    H = pg[0]; W = pg[1]; I = pg[2]; O = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    pa = ptr32(acc)
    px = ptr8(x)
    pw = ptr8(w)
    xc = 128 + xz
    q = 0
    for oy in range(OH):
        for ox in range(OW):
            for ky in range(KH):
                iy = oy * sh - ph + ky
                if iy < 0 or iy >= H:
                    continue
                for kx in range(KW):
                    ix = ox * sw - pw_ + kx
                    if ix < 0 or ix >= W:
                        continue
                    ab = (iy * W + ix) * I
                    wb = (ky * KW + kx) * O
                    for i in range(I):
                        s = 0
                        for o in range(O):
                            s += ((int(px[q + o]) ^ 128) - xc) * ((int(pw[wb + o]) ^ 128) - 128)
                        pa[ab + i] += s
                        wb += KH * KW * O
            q += O


@micropython.viper
def tbk(dx, dz, w, gm):
    # dx[oy, ox, o] = sum over taps and i of dz[iy, ix, i] * w[i, ky, kx, o] (int8 dz)
    pg = ptr32(gm)
    H = pg[0]; W = pg[1]; I = pg[2]; O = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    pd = ptr32(dx)
    pz = ptr8(dz)
    pw = ptr8(w)
    q = 0
    for oy in range(OH):
        for ox in range(OW):
            for o in range(O):
                pd[q + o] = 0
            for ky in range(KH):
                iy = oy * sh - ph + ky
                if iy < 0 or iy >= H:
                    continue
                for kx in range(KW):
                    ix = ox * sw - pw_ + kx
                    if ix < 0 or ix >= W:
                        continue
                    zb = (iy * W + ix) * I
                    wb = (ky * KW + kx) * O
                    for i in range(I):
                        z = (int(pz[zb + i]) ^ 128) - 128
                        if z != 0:
                            for o in range(O):
                                pd[q + o] += z * ((int(pw[wb + o]) ^ 128) - 128)
                        wb += KH * KW * O
            q += O


@micropython.viper
def tdk(dz, g, y, n: int, c: int, sh: int, r, lo: int, hi: int):
    # dz[j] = int8 of (g[j] >> sh) * r[j % c] / 2^14, rounded; 0 where int8 y[j] is at
    # lo or hi (the output clamped there)
    pz = ptr8(dz)
    pg = ptr32(g)
    py = ptr8(y)
    pr = ptr32(r)
    h2 = (1 << sh) >> 1
    k = 0
    for j in range(n):
        v = (int(py[j]) ^ 128) - 128
        u = 0
        if lo < v and v < hi:
            a = int(pg[j])
            h = a >> 16
            a = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (a & 0xffff)
            u = (((a + h2) >> sh) * int(pr[k]) + 8192) >> 14
            if u > 127:
                u = 127
            if u < -127:
                u = -127
        pz[j] = u & 255
        k += 1
        if k == c:
            k = 0


@micropython.viper
def twk(gw, dz, x, xz: int, gm):
    # gw[i, ky, kx, o] += sum over C's outputs (oy, ox) and taps of
    # dz[iy, ix, i] * (x[oy, ox, o] - xz)
    pg = ptr32(gm)
    H = pg[0]; W = pg[1]; I = pg[2]; O = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    pd = ptr32(gw)
    pz = ptr8(dz)
    px = ptr8(x)
    xc = 128 + xz
    q = 0
    for oy in range(OH):
        for ox in range(OW):
            for ky in range(KH):
                iy = oy * sh - ph + ky
                if iy < 0 or iy >= H:
                    continue
                for kx in range(KW):
                    ix = ox * sw - pw_ + kx
                    if ix < 0 or ix >= W:
                        continue
                    zb = (iy * W + ix) * I
                    wb = (ky * KW + kx) * O
                    for i in range(I):
                        z = (int(pz[zb + i]) ^ 128) - 128
                        if z != 0:
                            for o in range(O):
                                pd[wb + o] += z * ((int(px[q + o]) ^ 128) - xc)
                        wb += KH * KW * O
            q += O


@micropython.viper
def tsk(bs, g, y, n: int, c: int, k: int, lo: int, hi: int):
    # bs[j % c] += g[j] >> k, rounded, where int8 y[j] is inside (lo, hi) (int32 g)
    pb = ptr32(bs)
    pg = ptr32(g)
    py = ptr8(y)
    h2 = (1 << k) >> 1
    i = 0
    for j in range(n):
        v = (int(py[j]) ^ 128) - 128
        if lo < v and v < hi:
            a = int(pg[j])
            h = a >> 16
            a = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (a & 0xffff)
            pb[i] += (a + h2) >> k
        i += 1
        if i == c:
            i = 0


def _load(L, net):
    # the layer's weights and bias, once (its multipliers and geometry: Layer's mul, shf,
    # g), its sums and, where it passes a gradient, its int8 dz and sw / max sw per
    # channel (2^-14 steps): made with the net, before a step fragments the heap
    d = L.d
    L.tw = net._read(net.woff[d['xw']], bytearray(d['wn']))
    L.tb = net._read(net.woff[d['xb']], array('i', bytes(4 * d['nb'])))
    L.tt = array('i', bytes(4 * L.nout))     # (the int32 sums)
    if L.back:
        sw = d['sw']
        L.tr = array('i', [int(round(16384 * v / max(sw))) for v in sw])
        L.tz = bytearray(L.nout)


def _alias(L):
    # (the weights and bias as a trained Layer's: Q8Net._put, _bias, utrain.q8batch)
    L.w, L.b = L.tw, L.tb


def fwd(L, net, t):
    """The output of TCV layer L from the net's tensors t (int8 bytes by tensor index)."""
    if L.tt is None:
        _load(L, net)
    acc, c, mv = L.tt, L.c, memoryview
    for j in range(0, L.nout, c):
        K.cpk(mv(acc)[j:], L.tb, c)
    x = t[L.ins[0]]
    if 'xt' in L.d:
        L.x = x             # (its weight gradient reads the input)
    tfk(acc, x, L.zx, L.tw, L.g)
    K.rqk(acc, L.nout, c, 1, L.mul, L.shf, L.y, L.zy, L.lo, L.hi, 0)
    return L.y


def back(L, net, g, s):
    """The gradient of TCV layer L's input from g, its output's (int32, scale s)."""
    d = L.d
    n, sw = L.nout, d['sw']
    sh = K.nrk(g, n)
    if 'xt' in d:           # (its weights train: Train, the last of the net's ext)
        net.ext[-1].step(L, g, s, sh)
    tdk(L.tz, g, L.y, n, len(sw), sh, L.tr, L.lo, L.hi)
    dx = net._gbuf(g, d['gn'])
    tbk(dx, L.tz, L.tw, L.g)
    return dx, s * (1 << sh) * max(sw)


class Train:
    """The weights and biases of the TCV layers whose 'xt' is set (a layer below trains),
    trained as int8: utrain.q8 keeps it among its ext state (checkpoints,
    trained.wof.q8c, which export reads: host_tools/prepare/quant.py tconved).  Each is a
    CONV_2D's weights to Q8Net.setup (xo: I channels of KH KW O weights, 'sw', 'sx', a
    bias each), whose optimizer state and updates it takes beyond SGD at batch 1:
    momentum's velocities, a batch's sums, Adam's masters (Q8Net._put, _bias,
    utrain.q8batch)."""
    TAG = b'UTTC'

    def __init__(self, net, qmul, mults):
        self.net, self.qmul, self.mults = net, qmul, mults
        self.ls = [L for L in net.layers if 'xt' in L.d]
        for L in self.ls:
            _load(L, net)
            d = L.d
            I = d['nb']      # noqa: E741  (step's buffers: made here, before a step
            L.tg8 = (array('i', [16384] * I), array('i', bytes(4 * d['wn'])),   # fragments
                     array('i', bytes(4 * I)))                                      # the heap)
            g = (I, d['wn'] // I, d['wn'] // I)
            L.geo = lambda g=g: g   # noqa: E731  (Layer.wr's, set_bias's, q8batch's)
            L.row = lambda r=g[1]: r    # noqa: E731  (Layer.w0 / nw's, the update's)
            L.xo, L.whi, L.blo, L.bhi = 1, I, 0, I
            L.um, L.us = array('i', bytes(4 * I)), array('i', bytes(4 * I))
            _alias(L)

    def setup(self, batch):
        # (Q8Net.setup's: the optimizer state's keeper, utrain.q8batch's xs)
        self.B = None
        if any([L.ga is not None or L.vw is not None for L in self.ls]):
            from utrain import q8batch
            self.B = q8batch

    def step(self, L, g, s, sh):
        """L's update from g (its output's gradient, int32 at scale s; sh: g >> sh fits
        int8), its input x as the forward pass left it."""
        net, d, K_ = self.net, L.d, K     # noqa: N806
        n, I, sw, sx, wn = L.nout, d['nb'], d['sw'], d['sx'], d['wn']
        u, gw, bs = L.tg8
        tdk(L.tz, g, L.y, n, I, sh, u, L.lo, L.hi)      # (dz unrescaled)
        K_.zk(gw, wn)
        twk(gw, L.tz, L.x, L.zx, L.g)
        K_.zk(bs, I)
        k = sh - 7 if sh > 7 else 0         # (|g >> k| < 2^15: 2^16 positions a channel)
        tsk(bs, g, L.y, n, I, k, L.lo, L.hi)
        lr, f = net.lr, s * (1 << sh) * sx      # (dL/dW = gw f)
        if lr is None:      # (a batch's sums, Adam or a batch > 1: q8batch.unit)
            net.B.unit(L, gw, wn, 0, I, wn // I, f, self.qmul, self.mults)
            net._put(L, 0, gw, wn, lr)
        else:
            # SGD at batch 1, momentum too: a CONV_2D's update (all channels one chunk,
            # Q8Net._wgrad's), in 1/65536 steps where they stay within 2^30 and rounded to
            # 1/256 with a dither (Q8Net._dith): to the nearest, an update under 1/512
            # step was 0, each step (issue 28)
            f *= lr
            h = net._dith() if f and net._fits(gw, wn, 64.0 * net._swn(sw) / f) else -1
            self.mults(L, gw, wn, 0, I, wn // I, f, 65536.0 if h >= 0 else 256.0)
            net._upd(L, 0, gw, wn, h)
        if lr is None or L.vw is not None:
            net._bias(L, s * (1 << k), lr, 0, I, bs)
            return
        fb = lr * s * (1 << k)
        for i in range(I):
            L.tb[i] -= int(round(fb * bs[i] / (sx * sw[i])))

    def parts(self):
        out = []
        for L in self.ls:
            out += [L.tw, L.tb] + (self.B.xs(L) if self.B else [])
        return out

    def nstate(self):
        return sum([len(p) * (1 if type(p) is bytearray else 4) for p in self.parts()])

    def put(self, s):
        o = 0
        for L in self.ls:
            n = len(L.tw)
            L.tw[:] = s[o:o + n]
            o += n
            n = 4 * len(L.tb)
            L.tb = array('i', bytes(s[o:o + n]))
            o += n
            _alias(L)
            if self.B:
                o = self.B.xput(L, s, o)

    def save(self, path):
        """path.q8c: the weights and biases of the layers trained: b'UTTC', then per
        tensor u32 its index, u32 its bytes, the bytes (int8 weights, int32 biases)."""
        K.side_save(path + '.q8c', self.TAG, [x for L in self.ls for x in (
            (L.d['xw'], L.tw), (L.d['xb'], bytes(L.tb)))])

    def loaded(self, path):
        """After Q8Net.load_weights(path): those of path.q8c (none: weights.wof's)."""
        want = {}
        for L in self.ls:
            want[L.d['xw']], want[L.d['xb']] = len(L.tw), 4 * len(L.tb)
        got = K.side_load(path + '.q8c', self.TAG, want)
        for L in self.ls:
            w, b = got.get(L.d['xw']), got.get(L.d['xb'])
            if w:
                L.tw[:] = w
                L.tb = array('i', b)
            else:
                _load(L, self.net)
            _alias(L)
            if L.bf is not None:
                L.set_bias()        # (the float bias, Adam's masters: from these)
