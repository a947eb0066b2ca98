# Int8 training of an int8 model (issue 16): the forward pass in integers as TFLite
# Micro runs it (int8 activations and weights, int32 sums and biases, per-tensor or
# per-channel requantization), the loss and its softmax in float, and the backward pass
# in integers (int8 gradients with a power-of-two scale per tensor, int32 sums) with
# QAS updates: for an int8 weight w_q = W / s_W the gradient g_q = s_W dL/dW scaled by
# s_W^-2 gives w_q -= lr dL/dW / s_W, applied per output channel with stochastic
# rounding; biases keep a float copy (b -= lr dL/db, stored int32 b / (s_x s_W)).
# Batch > 1 (Q8Net.accum, then apply at the batch's end): each sample's weight-gradient
# sums are requantized into one int32 sum per weight in 2^-12 weight steps (scales differ
# between samples by powers of two) and the update is applied from those.  Adam keeps a
# float32 master copy of the trained weights (and its moments): the update goes to the
# master, the int8 weights the forward pass reads are the master requantized.
# The model is q8.json (layers, written by host_tools/quant.py) + a .wof with int8
# weights and int32 biases as raw bytes (onert-micro's layout).
from array import array
from math import exp, log, frexp, sqrt
from utrain import q8kern as K

FC, CONV, DW, MEAN = 0, 1, 2, 3
FS = 4096.0          # batch sums: int32 gradient in 1/FS weight steps


def qmul(x):
    # TFLite's QuantizeMultiplier: x = m * 2^(s - 31), m in [2^30, 2^31)
    if x == 0:
        return 0, 0
    f, e = frexp(x)
    m = int(round(f * 2147483648.0))
    if m == 2147483648:
        m //= 2
        e += 1
    return m, e


def _i32(n, data=None, tc='i'):
    # an int32 (tc 'f': float32) array of n zeros, or of the raw little-endian bytes data
    if data is None:
        data = bytes(4 * n)
    try:
        return array(tc, data)           # MicroPython copies a bytes initializer raw
    except TypeError:                    # CPython
        a = array(tc)
        a.frombytes(data)
        return a


def _f32(n, data=None):
    return _i32(n, data, 'f')


class Layer:
    def __init__(self, d, w, b, acc):
        self.k = d['k']
        self.d = d
        self.w = w                      # int8 bytearray (None for MEAN)
        self.b = b                      # int32 array
        self.nout = d['nout']
        self.zx, self.zy = d['zx'], d['zy']
        self.lo, self.hi = d['lo'], d['hi']
        self.mul = array('i', d['mul'])
        self.shf = array('i', d['shf'])
        self.c = len(d['mul'])
        self.acc = acc                  # int32 sums, one buffer shared by all layers
        self.y = bytearray(self.nout)
        if 'g' in d:
            self.g = array('i', d['g'])
        self.train = d.get('train', 0)
        self.back = self.train or d.get('back', 0)     # passes a gradient (CONV, DW, FC)
        if self.back and self.k != MEAN:
            oc = len(b)
            self.dz = bytearray(self.nout)             # int8 gradient, allocated once
            sw = d['sw']
            m = max(sw)
            # per-channel weight scales: the input gradient's dz is rescaled by
            # sw[o] / max(sw) first (rqk's multipliers; none when per-tensor)
            self.dxm = None
            if min(sw) != m:
                mm = [qmul(v / m) for v in sw]
                self.dxm = array('i', [v[0] for v in mm])
                self.dxs = array('i', [v[1] for v in mm])
        if self.train:
            sw, sx = d['sw'], d['sx']
            self.bf = _f32(len(b))                        # float bias
            self.set_bias()
            # backward buffers, allocated once (a board's heap fragments on per-step ones):
            # weight-gradient sums, per-channel update multipliers
            oc = len(b)
            self.gw = _i32(len(w))
            self.um, self.us = _i32(oc), _i32(oc)
            self.bs = _i32(oc)
        self.ga = None                       # batch sums, made by Q8Net.setup
        self.x = None
        self.dg = None                       # MEAN's input gradient, made on first use

    def set_bias(self):
        # the float bias (and Adam's float master) from the int32 bias and int8 weights
        sw, sx, b = self.d['sw'], self.d['sx'], self.b
        for o in range(len(b)):
            self.bf[o] = b[o] * sx * sw[o % len(sw)]
        wm = getattr(self, 'wm', None)
        if wm is not None:
            oc, row, blk = self.geo()
            w = self.w
            for i in range(len(w)):
                wm[i] = ((w[i] ^ 128) - 128) * sw[(i // blk) % oc % len(sw)]

    def geo(self):
        # (output channels, weights per channel, blk): weight i's channel is (i // blk) % oc
        d = self.d
        if self.k == FC:
            return self.nout, d['nin'], d['nin']
        gm = d['g']
        if self.k == CONV:
            r = gm[4] * gm[5] * gm[2]
            return gm[3], r, r
        return gm[3], gm[4] * gm[5], 1

    def forward(self, x):
        self.x = x
        d = self.d
        if self.k == FC:
            K.fck(self.acc, x, 0, self.zx, self.w, self.b, 1, d['nin'], self.nout)
        elif self.k == CONV:
            K.convk(self.acc, x, self.zx, self.g, self.w, self.b)
        elif self.k == DW:
            K.dwk(self.acc, x, self.zx, self.g, self.w, self.b)
        else:
            K.sumk(self.acc, x, self.zx, d['n'], self.nout)
        K.rqk(self.acc, self.nout, self.c, 1, self.mul, self.shf, self.y, self.zy, self.lo,
              self.hi, 0)
        return self.y


class Q8Net:
    def __init__(self, meta, wof_path):
        from utrain import wof
        self.meta = meta
        ls = meta['layers']
        nb = [None] * meta['ntensors']
        for d in ls:
            if d['k'] != MEAN:
                nb[d['wt']] = d['wn']
                nb[d['bt']] = 4 * d['nb']
        with wof.openr(wof_path) as f:
            offs = wof.read_table(f, wof_path, nb, nb)[0]
            self.layers = []
            acc = _i32(max([d['nout'] for d in ls]))
            for d in ls:
                w = b = None
                if d['k'] != MEAN:
                    f.seek(offs[d['wt']])
                    w = bytearray(f.read(d['wn']))
                    f.seek(offs[d['bt']])
                    b = _i32(0, f.read(4 * d['nb']))
                self.layers.append(Layer(d, w, b, acc))
        self.sy, self.zy = meta['sy'], meta['zy']
        self.sx, self.zx = meta['sx'], meta['zx']
        self.seed = 12345
        self.first = min([i for i in range(len(ls)) if ls[i].get('train')] or [len(ls)])
        self.gb = None
        self.sink = self          # run.py's Ctrl-C handler calls tr.net.sink.zero()
        self.setup()

    def quantize_input(self, xf):
        # float sample -> int8 bytes with the input tensor's scale and zero point
        s, z = self.sx, self.zx
        out = bytearray(len(xf))
        for i in range(len(xf)):
            q = int(round(xf[i] / s)) + z
            out[i] = (-128 if q < -128 else 127 if q > 127 else q) & 255
        return out

    def forward(self, x):
        for L in self.layers:
            x = L.forward(x)
        return x

    def logits(self, x):
        y = self.forward(x)
        s, z = self.sy, self.zy
        return [s * (((v ^ 128) - 128) - z) for v in y]

    def loss(self, x, label, grad=False):
        """(loss, hit) of int8 sample x with target label, a class index (scce) or a list
        of class probabilities (cce): softmax cross-entropy on the dequantized logits, hit
        1 when the largest logit is the (most probable) class's; with grad, also
        dL/dlogits."""
        lg = self.logits(x)
        m = max(lg)
        e = [exp(v - m) for v in lg]
        t = sum(e)
        if isinstance(label, int):
            c, tv, st = label, None, 1.0
            loss = log(t) - (lg[label] - m)
        else:
            tv, lt = label, log(t)
            loss = st = 0.0
            for i in range(len(tv)):
                if tv[i]:
                    loss -= tv[i] * (lg[i] - m - lt)
                    st += tv[i]
            c = tv.index(max(tv))
        hit = 1 if lg[c] == m and lg.index(m) == c else 0
        if not grad:
            return loss, hit
        dl = [v * st / t for v in e]
        if tv is None:
            dl[label] -= 1.0
        else:
            for i in range(len(dl)):
                dl[i] -= tv[i]
        return loss, hit, dl

    def setup(self, optimizer='sgd', batch=1, beta1=0.9, beta2=0.999, eps=1e-7):
        """Optimizer and batch: sgd at batch 1 updates each layer as its gradient is done
        (step); otherwise accum sums gradients and apply updates.  Adam's float32 master
        weights and moments (3 floats per trained weight and bias) are made here."""
        self.adam = optimizer == 'adam'
        self.b1, self.b2, self.eps = beta1, beta2, eps
        self.t = 0
        if optimizer == 'sgd' and batch == 1:
            return
        for L in self.layers:
            if L.train:
                n, oc = len(L.w), len(L.b)
                L.ga, L.ba = _i32(n), _f32(oc)
                if self.adam:
                    L.wm, L.am, L.av = _f32(n), _f32(n), _f32(n)
                    L.bm, L.bv = _f32(oc), _f32(oc)
                    L.set_bias()

    def step(self, x, label, lr):
        """One SGD step (batch 1) on int8 sample x with target label; returns loss, hit."""
        return self._run(x, label, lr)

    def accum(self, x, label):
        """Forward and backward of one sample, its gradients added to the batch's sums
        (apply updates from them); returns loss, hit."""
        return self._run(x, label, None)

    def _run(self, x, label, lr):
        loss, hit, dl = self.loss(x, label, True)
        # the float loss gradient as int32 with scale s = 2^-20 (|dL/dlogit| <= 1: a scale
        # every sample shares, so batch sums differ only by the layers' powers of two)
        s = 1.0 / 1048576.0
        g = array('i', [int(round(v / s)) for v in dl])
        i = len(self.layers) - 1
        while i >= self.first:
            g, s = self._back(self.layers[i], g, s, lr, i > self.first)
            i -= 1
        return loss, hit

    def zero(self):
        """Drop the gradient sums of an unfinished batch."""
        for L in self.layers:
            if L.ga is not None:
                K.zk(L.ga, len(L.ga))
                for o in range(len(L.ba)):
                    L.ba[o] = 0.0

    def apply(self, lr, scale):
        """Update every trained layer from the batch's sums times scale (1/batch for a mean),
        then zero them."""
        if self.adam:
            self.t += 1
            b1, b2, t = self.b1, self.b2, self.t
            lr = lr * sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
        for L in self.layers:
            if L.ga is None:
                continue
            sw, sx = L.d['sw'], L.d['sx']
            nw = len(sw)
            oc, row, blk = L.geo()
            n = len(L.w)
            ga, ba, bf, b = L.ga, L.ba, L.bf, L.b
            if self.adam:
                self._adam(L, lr, scale)
            else:
                # w_q -= lr * scale * ga / FS weight steps, as 1/256 steps for upk
                L.um[0], L.us[0] = qmul(lr * scale * 256.0 / FS)
                K.rqk(ga, n, 1, n, L.um, L.us, ga, 0, 0, 0, 1)
                self.seed = K.upk(L.w, ga, n, self.seed)
                for o in range(oc):
                    bf[o] -= lr * scale * ba[o]
            for o in range(oc):
                q = int(round(bf[o] / (sx * sw[o % nw])))
                b[o] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q
        self.zero()

    def _adam(self, L, lr, scale):
        # TensorFlow's Adam (lr already bias-corrected) on the float32 masters; the int8
        # weights are the masters requantized
        b1, b2, eps = self.b1, self.b2, self.eps
        sw = L.d['sw']
        nw = len(sw)
        oc, row, blk = L.geo()
        ga, wm, am, av, w = L.ga, L.wm, L.am, L.av, L.w
        for i in range(len(w)):
            s = sw[(i // blk) % oc % nw]
            g = ga[i] * s * scale / FS              # dL/dW
            m = am[i] = b1 * am[i] + (1.0 - b1) * g
            v = av[i] = b2 * av[i] + (1.0 - b2) * g * g
            x = wm[i] = wm[i] - lr * m / (sqrt(v) + eps)
            q = int(round(x / s))
            w[i] = (-127 if q < -127 else 127 if q > 127 else q) & 255
        ba, bf, bm, bv = L.ba, L.bf, L.bm, L.bv
        for o in range(oc):
            g = ba[o] * scale
            m = bm[o] = b1 * bm[o] + (1.0 - b1) * g
            v = bv[o] = b2 * bv[o] + (1.0 - b2) * g * g
            bf[o] -= lr * m / (sqrt(v) + eps)

    def load_weights(self, path):
        """The int8 weights and int32 biases a .wof holds (all of weights.wof's layers, or
        trained.wof's trained ones); float copies follow."""
        from utrain import wof
        nb = [None] * self.meta['ntensors']
        for L in self.layers:
            if L.k != MEAN:
                nb[L.d['wt']], nb[L.d['bt']] = L.d['wn'], 4 * L.d['nb']
        with wof.openr(path) as f:
            offs = wof.read_table(f, path, nb, nb)[0]
            for L in self.layers:
                if L.k != MEAN and offs[L.d['wt']]:
                    f.seek(offs[L.d['wt']])
                    f.readinto(L.w)
                if L.k != MEAN and offs[L.d['bt']]:
                    f.seek(offs[L.d['bt']])
                    L.b = _i32(0, f.read(4 * L.d['nb']))
                if L.train:
                    L.set_bias()

    def _gbuf(self, g, n):
        # an int32 input-gradient buffer of n values that is not g: two shared by all
        # layers (each layer's is read by the layer before it, then free), made on first use
        gb = self.gb
        if gb is None or len(gb[0]) < n:
            m = 0
            for L in self.layers:
                d = L.d
                m = max(m, d['nin'] if L.k == FC else d['n'] * L.nout if L.k == MEAN
                        else d['g'][0] * d['g'][1] * d['g'][2])
            gb = self.gb = (_i32(m), _i32(m))
        return gb[1] if g is gb[0] else gb[0]

    def _back(self, L, g, s, lr, need_dx):
        # g: int32 dL/dy (before the fused activation and clamp) with float scale s;
        # returns the input's (g, s) when need_dx
        d = L.d
        n = L.nout
        if L.k == MEAN:
            N = d['n']
            dg = self._gbuf(g, N * n)
            K.rpk(dg, g, N, n, 0)
            return dg, s / N
        dz = L.dz
        k = _shift(g, n)
        K.shk(dz, g, n, k, L.y, L.lo, L.hi)
        sz = s * (1 << k)
        bs = self._grads(L, dz) if L.train else None
        dx = None
        if need_dx:
            dx, sx = self._dx(L, g, dz, s, sz)
        if L.train:                            # after dx: its gradient is the old weights'
            if lr is None:
                self._acc(L, bs, sz)
            else:
                self._apply(L, bs, sz, lr)
        return dx, (sx if need_dx else 0.0)

    def _dx(self, L, g, dz, s, sz):
        # the int32 input gradient of layer L from its int8 output gradient dz (scale sz;
        # g: the int32 one it came from, scale s) and its scale
        d = L.d
        n = L.nout
        if L.dxm is not None:
            # per-channel weight scales: dz * sw[o] / max(sw), requantized to int8
            c = len(L.dxm)
            K.rqk(g, n, c, 1, L.dxm, L.dxs, g, 0, 0, 0, 1)
            k = _shift(g, n)
            K.shk(dz, g, n, k, L.y, L.lo, L.hi)
            sz = s * (1 << k)
        if L.k == FC:
            dx = self._gbuf(g, d['nin'])
            K.dxk(dx, dz, 0, L.w, n, d['nin'])
        else:
            gm = L.g
            dx = self._gbuf(g, gm[0] * gm[1] * gm[2])
            (K.cdk if L.k == CONV else K.ddk)(dx, dz, L.w, gm)
        return dx, sz * max(d['sw'])

    def _grads(self, L, dz):
        # layer L's weight-gradient sums (L.gw) and bias sums (returned) from its int8
        # output gradient dz
        d = L.d
        n = L.nout
        gw = L.gw
        K.zk(gw, len(L.w))
        if L.k == FC:
            ni = d['nin']
            K.gwk(gw, dz, 0, L.x, 0, L.zx, 0, n, ni)
            return [((v ^ 128) - 128) for v in dz]
        gm = L.g
        oc = gm[3]
        bsum = L.bs
        K.sumk(bsum, dz, 0, n // oc, oc)
        if L.k == CONV:
            K.cgk(gw, dz, L.x, L.zx, gm, 0, oc)
        else:                                  # DW: weights [KH, KW, C*M], channel last
            K.dgk(gw, dz, L.x, L.zx, gm)
        return list(bsum)

    def _acc(self, L, bs, sz):
        # add layer L's gradient sums (scale sz) to the batch's: in 1/FS weight steps
        sx, sw = L.d['sx'], L.d['sw']
        oc, row, blk = L.geo()
        mul, shf = L.um, L.us
        nw = len(sw)
        for o in range(oc):
            mul[o], shf[o] = qmul(sz * sx / sw[o % nw] * FS)
        K.rqk(L.gw, oc * row, oc, blk, mul, shf, L.gw, 0, 0, 0, 1)
        K.adk(L.ga, L.gw, oc * row)
        ba = L.ba
        for o in range(oc):
            ba[o] += sz * bs[o]

    def _apply(self, L, bs, sz, lr):
        # QAS SGD of layer L from its gradient sums at scale sz
        d = L.d
        sx, sw = d['sx'], d['sw']
        gw = L.gw
        oc, row, blk = L.geo()
        # QAS update per output channel: w_q -= lr sz sx / s_W[o] * gw (in 1/256 steps)
        mul, shf = L.um, L.us
        nw = len(sw)
        for o in range(oc):
            mul[o], shf[o] = qmul(lr * sz * sx / sw[o % nw] * 256.0)
        K.rqk(gw, oc * row, oc, blk, mul, shf, gw, 0, 0, 0, 1)
        self.seed = K.upk(L.w, gw, oc * row, self.seed)
        bf, b = L.bf, L.b
        for o in range(oc):
            bf[o] -= lr * sz * bs[o]
            q = int(round(bf[o] / (sx * sw[o % nw])))
            b[o] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q


def _shift(g, n):
    # the k that brings the int32 values g[:n] into int8 by g >> k
    big = K.nrk(g, n)
    k = 0
    while (big >> k) > 127:
        k += 1
    return k
