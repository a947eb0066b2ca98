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

# the layer kinds of q8.json's 'k': the one table (host_tools/quant.py reads it from here;
# q8bands, which q8 imports, keeps private copies marked '# q8.NAME', tests/test_contract.py)
FC, CONV, DW, MEAN, ADD, PMAX, PAVG = 0, 1, 2, 3, 4, 5, 6
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
        # made at its size from range's length, then zeroed: no 4n-byte temporary beside
        # it (bytes(4n) would need twice the array's size free; grown a chunk at a time,
        # each regrowth that cannot stay in place copies it and leaves a hole)
        a = array(tc, range(n))
        K.zk(a, n)
        return a
    try:
        return array(tc, data)           # MicroPython copies a bytes initializer raw
    except TypeError:                    # CPython
        a = array(tc)
        a.frombytes(data)
        return a


def _f32(n, data=None):
    return _i32(n, data, 'f')


class Layer:
    # defaults as class attributes: a frozen layer's instance holds only what differs
    # (a board pays for every instance attribute of every layer)
    train = back = 0
    x = dg = dx = dxm = ga = None    # the input seen; input-gradient buffers (made on use),
    #                                  per-channel dz rescaling, batch sums (Q8Net.setup)
    w = b = mul = shf = None
    c = 1
    sync = 0     # 1: b = the float bias bf requantized, for every output (_apply's skip)

    def __init__(self, d, w, b, acc, y=None, net=None):
        self.k = k = d['k']
        self.d = d
        if w is not None:
            self.w = w                  # int8 bytearray (None: MEAN, ADD, or streamed)
            self.b = b                  # int32 array
        self.nout = d['nout']
        self.zx, self.zy = d['zx'], d['zy']
        self.lo, self.hi = d['lo'], d['hi']
        if 'mul' in d:                  # (else in q8.req)
            self.mul = array('i', d['mul'])
            self.shf = array('i', d['shf'])
            self.c = len(d['mul'])      # 1: per-tensor scales
        elif d.get('nq', 1) > 1:
            self.c = d['nq']
        self.acc = acc                  # int32 sums, one buffer shared by all layers
        self.net = net
        self.y = bytearray(self.nout) if y is None else y
        self.ins = d.get('in')
        if 'g' in d:
            self.g = array('i', d['g'])
            # the geometry of one call (rows, channels): one array all layers share
            self.gs = net.gs if net is not None else array('i', d['g'])
        if k == ADD:                         # the multipliers of input 2 and the sum
            self.m2 = memoryview(self.mul)[1:]
            self.s2 = memoryview(self.shf)[1:]
            self.m3 = memoryview(self.mul)[2:]
            self.s3 = memoryview(self.shf)[2:]
        if d.get('train', 0):
            self.train = 1
        if self.train or d.get('back', 0):
            self.back = 1             # passes a gradient (CONV, DW, FC, MEAN, pools)
        if self.back and k < MEAN:
            self.dz = bytearray(self.nout)             # int8 gradient, allocated once
            sw = d['sw']
            m = max(sw)
            # per-channel weight scales: the input gradient's dz is rescaled by
            # sw[o] / max(sw) first (rqk's multipliers; none when per-tensor)
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

    def set_bias(self):
        # the float bias (and Adam's float master) from the int32 bias and int8 weights
        sw, sx, b = self.d['sw'], self.d['sx'], self.b
        self.sync = 0
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

    def forward(self, x, x2=None):
        if self.back:
            self.x = x              # (the backward pass of a trained layer / pool reads it)
        d = self.d
        k = self.k
        if k >= PMAX:               # MAX_POOL_2D, AVERAGE_POOL_2D: int8 to int8
            K.pok(self.y, x, self.g, self.lo, self.hi, k - PMAX)
            return self.y
        if k == CONV or k == DW:
            self.conv(x, self.g, self.y)
            return self.y
        if k == ADD:
            self.add(x, x2, self.y, self.nout)
            return self.y
        if k == FC:
            self.fc(x)
            return self.y
        K.sumk(self.acc, x, self.zx, d['n'], self.nout)
        K.rqk(self.acc, self.nout, self.c, 1, self.mul, self.shf, self.y, self.zy, self.lo,
              self.hi, 0)
        return self.y

    def _chunk(self, o0, n, row):
        # weights, biases, multipliers, shifts and multiplier count of output channels
        # o0..o0+n-1 (row: weight bytes per channel; 0: a depthwise layer's, all read):
        # views of this layer's own, or read into the net's scratch (frozen layers)
        net = self.net
        w = self.w
        if w is None:
            w = net.weights(self, o0, n * row if row else self.d['wn'])
        elif o0:
            w = memoryview(w)[o0 * row:]
        b, m, s = self.b, self.mul, self.shf
        if b is None:
            b = net.biases(self, o0, n)
        elif o0:
            b = memoryview(b)[o0:]
        if m is None:
            m, s = net.quant(self, o0, n)
        elif o0 and self.c > 1:
            m, s = memoryview(m)[o0:], memoryview(s)[o0:]
        return w, b, m, s, n if self.c > 1 else 1

    def fc(self, x):
        d, acc = self.d, self.acc
        ni, no = d['nin'], self.nout
        nc = d.get('nc', no)
        if nc >= no and self.w is not None and self.mul is not None:
            # the layer's own weights in one chunk: _chunk's views are the arrays themselves
            # (fewer Python steps: each costs thousands of cycles on a Cortex-M0+)
            K.fck(acc, x, 0, self.zx, self.w, self.b, 1, ni, no)
            K.rqk(acc, no, no if self.c > 1 else 1, 1, self.mul, self.shf, self.y, self.zy,
                  self.lo, self.hi, 0)
            return
        for o0 in range(0, no, nc):
            n = min(nc, no - o0)
            w, b, m, s, c = self._chunk(o0, n, ni)
            K.fck(acc, x, 0, self.zx, w, b, 1, ni, n)
            K.rqk(acc, n, c, 1, m, s, memoryview(self.y)[o0:], self.zy, self.lo, self.hi, 0)

    def conv(self, x, gm, y):
        """CONV_2D / DEPTHWISE_CONV_2D of input x with geometry gm (the layer's, or a band
        of rows of it) into int8 y: a few output rows at a time (the sums fit the shared
        buffer), and for a streamed CONV_2D a chunk of output channels at a time."""
        acc, gs, d = self.acc, self.gs, self.d
        K.cpk(gs, gm, 14)
        OH, OW, O, sh, ph, H = gm[10], gm[11], gm[3], gm[6], gm[8], gm[0]
        xrow = gm[1] * gm[2]
        nc = d.get('nc', O) if self.k == CONV else O
        row = gm[4] * gm[5] * gm[2] if self.k == CONV else 0
        dw = self.k == DW
        for o0 in range(0, O, nc):
            n = min(nc, O - o0)
            w, bv, mv, sv, c = self._chunk(o0, n, row)
            gs[3] = n
            R = max(1, len(acc) // (OW * n))
            for r0 in range(0, OH, R):
                r = min(R, OH - r0)
                # rows r0.. read input rows from a on: the input from row a, the pad top
                # what is left of it (never negative: viper reads the table unsigned)
                a = r0 * sh - ph
                a = a if a > 0 else 0
                gs[10] = r
                gs[8] = ph + a - r0 * sh
                gs[0] = H - a
                xa = memoryview(x)[a * xrow:] if a else x
                if dw:
                    K.dwk(acc, xa, self.zx, gs, w, bv)
                else:
                    K.convk(acc, xa, self.zx, gs, w, bv)
                if n == O:
                    K.rqk(acc, r * OW * n, c, 1, mv, sv, memoryview(y)[r0 * OW * O:], self.zy,
                          self.lo, self.hi, 0)
                else:
                    a8 = self.net.acc8
                    K.rqk(acc, r * OW * n, c, 1, mv, sv, a8, self.zy, self.lo, self.hi, 0)
                    K.stk(y, r0 * OW * O + o0, O, a8, r * OW, n)

    def add(self, x, x2, y, n):
        """ADD as TFLite Micro's int8 kernel: each input minus its zero point, shifted
        left 20 bits and requantized by its multiplier, the sum requantized to y; in
        chunks of half the shared sum buffer."""
        acc, d = self.acc, self.d
        h = len(acc) // 2
        a2 = memoryview(acc)[h:]
        mv = memoryview
        for i0 in range(0, n, h):
            m = min(h, n - i0)
            K.exk(acc, mv(x)[i0:], m, self.zx, 20)
            K.rqk(acc, m, 1, 1, self.mul, self.shf, acc, 0, 0, 0, 1)
            K.exk(a2, mv(x2)[i0:], m, d['z2'], 20)
            K.rqk(a2, m, 1, 1, self.m2, self.s2, a2, 0, 0, 0, 1)
            K.adk(acc, a2, m)
            K.rqk(acc, m, 1, 1, self.m3, self.s3, mv(y)[i0:], self.zy, self.lo, self.hi, 0)


class Q8Net:
    def __init__(self, meta, wof_path):
        from utrain import wof
        self.meta = meta
        ls = meta['layers']
        nb = [None] * meta['ntensors']
        for d in ls:
            if 'wt' in d:
                nb[d['wt']] = d['wn']
                nb[d['bt']] = 4 * d['nb']
        for k, n in meta.get('wsizes', ()):    # (a part of the model: the file holds all)
            nb[k] = n
        # activations: one int8 arena at the offsets the host planned (q8.json 'at':
        # tensor, offset, bytes), or (a table without a plan) one buffer per layer
        import gc
        gc.collect()
        self.arena = bytearray(meta.get('arena', 0))
        self.t = t = {}
        am = memoryview(self.arena)
        for k, o, n in meta.get('at', ()):
            t[k] = am[o:o + n]
        acc = self.acc = _i32(meta.get('acc') or max([d['nout'] for d in ls]))
        try:
            self.acc8 = memoryview(acc).cast('B')     # CPython: the sums' bytes
        except AttributeError:                        # MicroPython: viper's ptr8 reads them
            self.acc8 = acc if K.VIPER else bytearray(4 * len(acc))
        self.f = f = wof.openr(wof_path)
        self.woff = wof.read_table(f, wof_path, nb, nb)[0]
        req = meta.get('req')
        if req:
            i = wof_path.rfind('/')
            self.rf = wof.openr((wof_path[:i + 1] if i >= 0 else '') + req)
        # streamed layers' scratch: a chunk of weights, one layer's biases and multipliers
        ws = meta.get('wbuf', 0)
        self.wbuf = bytearray(ws) if ws else None
        cmax = meta.get('qbuf') or max([d.get('nb', 1) for d in ls])
        self.qb, self.qm, self.qs = _i32(cmax), _i32(cmax), _i32(cmax)
        self.gs = _i32(14)
        # the trained layers first: their big buffers (weights, gradient sums) find
        # room before the frozen layers' many small objects fragment the heap
        self.layers = lay = [None] * len(ls)
        order = [i for i in range(len(ls)) if ls[i].get('train')]
        order += [i for i in range(len(ls)) if not ls[i].get('train')]
        for i in order:
            d = ls[i]
            w = b = None
            if 'wt' in d and (d.get('train') or d.get('back') or d.get('res') or not ws):
                w = self._read(self.woff[d['wt']], bytearray(d['wn']))
                b = self._read(self.woff[d['bt']], _i32(d['nb']))
            L = lay[i] = Layer(d, w, b, acc, t.get(d.get('out')), self)
            if w is not None and L.mul is None:
                L.mul, L.shf = self._req(d, _i32(d['nq'])), self._req(d, _i32(d['nq']), 1)
            t[d.get('out')] = L.y
        self.sy, self.zy = meta['sy'], meta['zy']
        self.sx, self.zx = meta['sx'], meta['zx']
        self.xin = meta.get('xin', 0)
        self.src = None             # (file, offset) of the sample, read by strips
        self.seed = 12345
        self.first = min([i for i in range(len(ls)) if ls[i].get('train')] or [len(ls)])
        self.groups = {}
        if meta.get('groups'):
            from utrain.q8bands import Q8Group
            for lo, hi, rows in meta['groups']:
                self.groups[lo] = Q8Group(self, lo, hi, rows)
        self.gb = None
        self.sink = self          # run.py's Ctrl-C handler calls tr.net.sink.zero()
        self.setup()

    def strips(self):
        """True when a band group takes the model's input: forward(None) then reads the
        sample a strip of rows at a time from self.src (file, offset)."""
        g = self.groups.get(0)
        return g is not None and g.takes(self.xin)

    def close(self):
        self.f.close()
        if self.meta.get('req'):
            self.rf.close()

    def _read(self, off, buf, n=None):
        f = self.f
        f.seek(off)
        m = memoryview(buf)
        if n is not None:
            m = m[:n]
        f.readinto(m)
        return buf

    def _req(self, d, buf, half=0):
        # a layer's multipliers (half 0) or shifts (1) from q8.req
        c = d['nq']
        f = self.rf
        f.seek(d['ro'] + half * 4 * c)
        f.readinto(memoryview(buf)[:c])
        return buf

    def biases(self, L, o0, n):
        """n biases of frozen layer L from output channel o0 on, into the shared scratch."""
        return self._read(self.woff[L.d['bt']] + 4 * o0, self.qb, n)

    def quant(self, L, o0, n):
        """Frozen layer L's multipliers and shifts from output channel o0 on (n of them;
        the one of a per-tensor layer), into the shared scratch."""
        d = L.d
        c = d['nq']
        f = self.rf
        if c == 1:
            o0, n = 0, 1
        f.seek(d['ro'] + 4 * o0)
        f.readinto(memoryview(self.qm)[:n])
        f.seek(d['ro'] + 4 * (c + o0))
        f.readinto(memoryview(self.qs)[:n])
        return self.qm, self.qs

    def weights(self, L, o0, n):
        """n bytes of streamed layer L's weights from output channel o0 on (row-major), into
        the shared scratch."""
        d = L.d
        row = d['wn'] // d['nb'] if L.k != DW else 0
        self._read(self.woff[d['wt']] + o0 * row, self.wbuf, n)
        return self.wbuf

    def quantize_input(self, xf):
        # float sample -> int8 bytes with the input tensor's scale and zero point
        s, z = self.sx, self.zx
        out = bytearray(len(xf))
        for i in range(len(xf)):
            q = int(round(xf[i] / s)) + z
            out[i] = (-128 if q < -128 else 127 if q > 127 else q) & 255
        return out

    def forward(self, x):
        t, ls, n = self.t, self.layers, len(self.layers)
        t[self.xin] = x
        i = 0
        while i < n:
            g = self.groups.get(i)
            if g is not None:           # a band group: its layers a few rows at a time
                g.run()
                i = g.hi
                x = t[ls[i - 1].d['out']]   # (the last layer's output, whole)
                continue
            L = ls[i]
            ins = L.ins
            if ins is None:             # a table without tensor indices: a chain
                x = L.forward(x)
            elif L.k == ADD:
                x = L.forward(t[ins[0]], t[ins[1]])
            else:
                x = L.forward(t[ins[0]])
            i += 1
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
        self.nstep = 0
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
            self.nstep += 1
            b1, b2, t = self.b1, self.b2, self.nstep
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
        ws = [L for L in self.layers if 'wt' in L.d]
        for L in ws:
            nb[L.d['wt']], nb[L.d['bt']] = L.d['wn'], 4 * L.d['nb']
        with wof.openr(path) as f:
            offs = wof.read_table(f, path, nb, nb)[0]
            for L in ws:
                if offs[L.d['wt']]:
                    f.seek(offs[L.d['wt']])
                    f.readinto(L.w)
                if offs[L.d['bt']]:
                    f.seek(offs[L.d['bt']])
                    L.b = _i32(0, f.read(4 * L.d['nb']))
                if L.train:
                    L.set_bias()

    def _gbuf(self, g, n):
        # an int32 input-gradient buffer of n values that is not g: two shared by all
        # layers (each layer's is read by the layer before it, then free), made on first use
        gb = self.gb
        if gb is None or len(gb[0]) < n:
            m = gin(self.meta['layers'])
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
        if L.k >= PMAX:
            # a pool: the int32 gradient to the window's max (its first in scan order), or
            # spread over the window (scale s / (KH KW), edge windows' counts rounded)
            gm = L.g
            dx = self._gbuf(g, gm[0] * gm[1] * gm[2])
            lo, hi = L.lo, L.hi
            K.pbk(dx, g, L.x, gm, L.y, lo if lo > -128 else -129, hi if hi < 127 else 128,
                  L.k - PMAX)
            return dx, (s / (gm[4] * gm[5]) if L.k == PAVG else s)
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
        bsum = L.bs                            # (int32, no list made per step)
        if L.k == FC:
            ni = d['nin']
            K.gwk(gw, dz, 0, L.x, 0, L.zx, 0, n, ni)
            K.sumk(bsum, dz, 0, 1, n)
            return bsum
        gm = L.g
        oc = gm[3]
        K.sumk(bsum, dz, 0, n // oc, oc)
        if L.k == CONV:
            K.cgk(gw, dz, L.x, L.zx, gm, 0, oc)
        else:                                  # DW: weights [KH, KW, C*M], channel last
            K.dgk(gw, dz, L.x, L.zx, gm)
        return bsum

    def _acc(self, L, bs, sz):
        # add layer L's gradient sums (scale sz) to the batch's: in 1/FS weight steps
        sx, sw = L.d['sx'], L.d['sw']
        oc, row, blk = L.geo()
        _mults(L, oc, row, blk, sz * sx, FS)
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
        _mults(L, oc, row, blk, lr * sz * sx, 256.0)
        self.seed = K.upk(L.w, gw, oc * row, self.seed)
        bf, b = L.bf, L.b
        nw = len(sw)
        c = lr * sz                            # (the products as before: same floats)
        den = sx * sw[0]
        # a zero gradient leaves bf[o] as it is (bf - 0.0), and so b[o] once every b[o]
        # is bf[o] requantized (sync): skipped (float steps cost thousands of cycles)
        sk = L.sync
        for o in range(oc):
            v = bs[o]
            if sk and not v:
                continue
            bf[o] -= c * v
            q = int(round(bf[o] / (den if nw == 1 else sx * sw[o % nw])))
            b[o] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q
        L.sync = 1


def _mults(L, oc, row, blk, f, u):
    # layer L's weight-gradient sums L.gw rescaled in place by f / s_W[o] * u per output
    # channel o (rqk, wide): per-tensor scales take one multiplier for all (the same
    # qmul every channel would get), per-channel ones one each
    sw, mul, shf = L.d['sw'], L.um, L.us
    nw = len(sw)
    n = oc * row
    if nw == 1:
        mul[0], shf[0] = qmul(f / sw[0] * u)
        K.rqk(L.gw, n, 1, n, mul, shf, L.gw, 0, 0, 0, 1)
        return
    for o in range(oc):
        mul[o], shf[o] = qmul(f / sw[o % nw] * u)
    K.rqk(L.gw, n, oc, blk, mul, shf, L.gw, 0, 0, 0, 1)


def gin(ls):
    """The most values an input gradient of layer table ls has: the size of _gbuf's
    two buffers (host_tools/memory.py plans them with this)."""
    m = 0
    for d in ls:
        if d.get('train') or d.get('back'):
            k = d['k']
            m = max(m, d['nin'] if k == FC else d['n'] * d['nout'] if k == MEAN
                    else d['g'][0] * d['g'][1] * d['g'][2])
    return m


def _shift(g, n):
    # the k that brings the int32 values g[:n] into int8 by g >> k (found in the kernel:
    # a Python loop step costs thousands of cycles on a Cortex-M0+)
    return K.nrk(g, n)
