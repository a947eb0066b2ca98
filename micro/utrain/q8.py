# Int8 training of an int8 model (issue 16): the forward pass in integers as TFLite
# Micro runs it (int8 activations and weights, int32 sums and biases, per-tensor or
# per-channel requantization), the loss and its softmax in float, and the backward pass
# in integers (int8 gradients with a power-of-two scale per tensor, int32 sums) with
# QAS updates: for an int8 weight w_q = W / s_W the gradient g_q = s_W dL/dW scaled by
# s_W^-2 gives w_q -= lr dL/dW / s_W, applied per output channel with stochastic
# rounding; biases keep a float copy (b -= lr dL/db, stored int32 b / (s_x s_W)).
# The model is q8.json (layers, written by host_tools/quant.py) + a .wof with int8
# weights and int32 biases as raw bytes (onert-micro's layout).
from array import array
from math import exp, log, frexp
from utrain import q8kern as K

FC, CONV, DW, MEAN = 0, 1, 2, 3


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


def _i32(n, data=None):
    # an int32 array of n zeros, or of the raw little-endian bytes data
    if data is None:
        data = bytes(4 * n)
    try:
        return array('i', data)          # MicroPython copies a bytes initializer raw
    except TypeError:                    # CPython
        a = array('i')
        a.frombytes(data)
        return a


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
        if self.train:
            sw, sx = d['sw'], d['sx']
            self.bf = [b[o] * sx * sw[o % len(sw)] for o in range(len(b))]   # float bias
            # backward buffers, allocated once (a board's heap fragments on per-step ones):
            # int8 gradient, weight-gradient sums, per-channel update multipliers
            oc = len(b)
            self.dz = bytearray(self.nout)
            self.gw = _i32(len(w))
            self.um, self.us = _i32(oc), _i32(oc)
            self.bs = _i32(oc)
        self.x = None
        self.dg = self.dx = None             # input-gradient buffers, made on first use

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
        """(loss, hit) of int8 sample x with class label: softmax cross-entropy on the
        dequantized logits, 1 when the largest logit is the label's; with grad, also
        dL/dlogits."""
        lg = self.logits(x)
        m = max(lg)
        e = [exp(v - m) for v in lg]
        t = sum(e)
        loss = log(t) - (lg[label] - m)
        hit = 1 if lg[label] == m and lg.index(m) == label else 0
        if not grad:
            return loss, hit
        dl = [v / t for v in e]
        dl[label] -= 1.0
        return loss, hit, dl

    def step(self, x, label, lr):
        """One SGD step (batch 1) on int8 sample x with class label; returns loss, hit."""
        loss, hit, dl = self.loss(x, label, True)
        # the float loss gradient as int32 with scale s (2^-20 of its largest value)
        a = max(abs(v) for v in dl) or 1.0
        s = a / 1048576.0
        g = array('i', [int(round(v / s)) for v in dl])
        i = len(self.layers) - 1
        while i >= self.first:
            g, s = self._back(self.layers[i], g, s, lr, i > self.first)
            i -= 1
        return loss, hit

    def _back(self, L, g, s, lr, need_dx):
        # g: int32 dL/dy (before the fused activation and clamp) with float scale s
        d = L.d
        n = L.nout
        if L.k == MEAN:
            N = d['n']
            dg = L.dg
            if dg is None:
                dg = L.dg = _i32(N * n)      # kept: one allocation, not one a step
            K.rpk(dg, g, N, n, 0)
            return dg, s / N
        big = K.nrk(g, n)
        k = 0
        while (big >> k) > 127:
            k += 1
        dz = L.dz
        K.shk(dz, g, n, k, L.y, L.lo, L.hi)
        sz = s * (1 << k)
        sx, sw = d['sx'], d['sw']
        dx = None
        if L.k == FC:
            ni = d['nin']
            if need_dx:
                dx = L.dx
                if dx is None:
                    dx = L.dx = _i32(ni)
                K.dxk(dx, dz, 0, L.w, n, ni)
            gw = L.gw
            K.zk(gw, n * ni)
            K.gwk(gw, dz, 0, L.x, 0, L.zx, 0, n, ni)
            bs = [((v ^ 128) - 128) for v in dz]
            oc, row = n, ni
        else:  # CONV (weights and bias; no input gradient)
            gm = L.g
            oc = gm[3]
            row = gm[4] * gm[5] * gm[2]
            gw = L.gw
            K.zk(gw, oc * row)
            K.cgk(gw, dz, L.x, L.zx, gm, 0, oc)
            bsum = L.bs
            K.sumk(bsum, dz, 0, n // oc, oc)
            bs = list(bsum)
        # QAS update per output channel: w_q -= lr sz sx / s_W[o] * gw (in 1/256 steps)
        mul, shf = L.um, L.us
        nw = len(sw)
        for o in range(oc):
            mul[o], shf[o] = qmul(lr * sz * sx / sw[o % nw] * 256.0)
        K.rqk(gw, oc * row, oc, row, mul, shf, gw, 0, 0, 0, 1)
        self.seed = K.upk(L.w, gw, oc * row, self.seed)
        bf, b = L.bf, L.b
        for o in range(oc):
            bf[o] -= lr * sz * bs[o]
            q = int(round(bf[o] / (sx * sw[o % nw])))
            b[o] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q
        if dx is not None:
            return dx, sz * sw[0]
        return None, 0.0
