# Int8 training of an int8 model (issue 16): the forward pass in integers as TFLite
# Micro runs it (int8 activations and weights, int32 sums and biases, per-tensor or
# per-channel requantization), the loss and its softmax on the dequantized logits (scce
# in integers: Q8Net.loss; cce in float: utrain.q8reg), and the backward pass
# in integers (int8 gradients with a power-of-two scale per tensor, int32 sums) with
# QAS updates: for an int8 weight w_q = W / s_W the gradient g_q = s_W dL/dW scaled by
# s_W^-2 gives w_q -= lr dL/dW / s_W, applied per output channel with stochastic
# rounding; biases keep a float copy (b -= lr dL/db, stored int32 b / (s_x s_W)), but
# at SGD batch 1 a layer with one weight scale moves its int32 bias by stochastically
# rounded steps (ubk: no float step per channel, each thousands of cycles on a board).
# Batch > 1 (Q8Net.accum, then apply at the batch's end): each sample's weight-gradient
# sums are requantized into one int32 sum per weight, in weight steps (Adam: dL/dW) at a
# unit per layer and batch (utrain.q8batch.unit), and the update is applied from those.
# Adam keeps a float32 master copy of the trained weights (and its moments): the update
# goes to the master, the int8 weights the forward pass reads are the master requantized.
# The model is q8.json (layers, written by host_tools/prepare/quant.py) + a .wof with int8
# weights and int32 biases as raw bytes (onert-micro's layout).
from array import array
from math import exp, log, frexp
from utrain import q8kern as K

# the layer kinds of q8.json's 'k': the one table (host_tools/prepare/quant.py reads it from here;
# q8bands, which q8 imports, keeps private copies marked '# q8.NAME', tests/ops/test_contract.py)
FC, CONV, DW, MEAN, ADD, PMAX, PAVG, CAT, LUT, BIN, SLC, NRM, TCV, EMB = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13


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


# MicroPython: a stream's readinto takes a count (its memoryview has no cast, with the
# viper kernels or without: a firmware without the native emitter, its decorators stripped)
_RC = K.VIPER or not hasattr(memoryview, 'cast')


def _b8(a):
    # int32 array a's bytes: a view (CPython), a itself (viper's ptr8 reads them), or a
    # buffer of its size (no viper)
    try:
        return memoryview(a).cast('B')
    except AttributeError:
        return a if K.VIPER else bytearray(4 * len(a))


def _f32(n, data=None):
    return _i32(n, data, 'f')


def _once(fn, *a):
    # utrain.q8setup's fn(*a, this module's globals): code run once, loaded for the call
    # and dropped after, unless it was loaded before (Q8Trainer's set-up runs in it)
    import sys
    held = 'utrain.q8setup' in sys.modules
    from utrain import q8setup
    getattr(q8setup, fn)(*(a + (globals(),)))
    if not held:
        from utrain import drop
        drop('q8setup')


class Layer:
    # defaults as class attributes: a frozen layer's instance holds only what differs
    # (a board pays for every instance attribute of every layer)
    train = back = 0
    x = dg = dx = dxm = ga = None    # the input seen; input-gradient buffers (made on use),
    #                                  per-channel dz rescaling, batch sums (Q8Net.setup)
    gk = None       # the batch sums' unit 2^-gk[0], gk[1] 1 once set (q8batch.unit)
    w = b = mul = shf = None
    mk = vw = vb = bs = None    # output mask bits (q8sparse); momentum velocities; bias sums
    rc = 0          # a masked layer's outputs at its top clamp (mkk's count: utrain.q8range)
    ge = None       # its weight scales' exponents (utrain.q8grow: 'gw')
    wf = None       # SGD: the trained weights' kept fractions (q8kern.upek; q8.json 'wf')
    bf = None       # the float bias (none where SGD steps the int32 bias in integers: be)
    be = None       # SGD, per-channel scales: the int32 biases' kept fractions (q8kern.ubek)
    bc = 0          # a MEAN whose input's layer reads its gradient broadcast (smk's period)
    wlo = whi = 0
    gi = ()         # the inputs (positions in ins) the backward pass gives a gradient
    tt = None       # a LUT layer's tables (utrain.q8lut)
    dxr = 0         # 1: dz's per-channel rescaling made from sw when used (a broadcast row)
    pw = wo = 0     # pw: w holds the window's rows alone, from weight wo on (the rest in flash)
    c = 1
    sync = 0     # 1: b = the float bias bf requantized, for every output (_apply's skip)
    stale = 0    # 1: bf lags b (the integer bias update of per-tensor layers moved b)
    whole = 0    # 1: an FC layer with its weights and multipliers in RAM, one chunk
    uk = None    # what its window's update multipliers were made for (_mults)
    sh = None    # its weight tensor's uses (utrain.q8share); sa, sb: an alias of its
    sa = sb = 0  # first use's weights, and bias
    xo = 0       # 1: weights that train outside 'wt' / 'bt' (q8tcv, q8emb: their Train;
    #              2: its sums at SGD momentum's batch 1 too), optimizer state made here

    def __init__(self, d, w, b, acc, y=None, net=None):
        # (the load's: utrain.q8load, loaded while the net is built)
        from utrain.q8load import layer
        layer(self, d, w, b, acc, y, net, globals())

    def wr(self):
        # (first, end) of the weights that train: a rank's rows (FC, CONV_2D), all of a
        # depthwise layer's (its channels are strided: the window by zero multipliers)
        if self.whi <= self.wlo:
            return 0, 0
        w0 = self.w0()
        return w0, w0 + self.nw()

    def w0(self):
        # wr()[0] (no tuple: a step asks for it a chunk at a time, and a tuple is heap)
        if self.whi <= self.wlo or self.k == DW:
            return 0
        return self.wlo * self.row()

    def nw(self):
        # the weights that train, wr()[1] - wr()[0]
        if self.whi <= self.wlo:
            return 0
        if self.k == DW:
            return self.d['g'][3] * self.row()
        return (self.whi - self.wlo) * self.row()

    def row(self):
        # geo()[1], the weights per output channel
        d = self.d
        if self.k == FC:
            return d['nin']
        gm = d['g']
        return gm[4] * gm[5] * gm[2] if self.k == CONV else gm[4] * gm[5]

    def set_bias(self):
        # the float bias (made here on first use; Adam's float master too) from the int32
        # bias and int8 weights; where SGD steps the int32 bias and its fraction (be), no
        # float bias: the int32 bias is the one held (the fractions zeroed)
        b = self.b
        self.sync = self.stale = 0
        if self.be is not None:
            self.be[:] = bytes(len(b))
            return
        sw, sx = self.d['sw'], self.d['sx']
        if self.bf is None:
            self.bf = _f32(len(b))
        for o in range(len(b)):
            self.bf[o] = b[o] * sx * sw[o % len(sw)]
        wm = getattr(self, 'wm', None)
        if wm is not None:
            oc, row, blk = self.geo()
            w = self.w
            w0, w1 = self.wr()
            wo = self.wo
            for i in range(w0, w1):
                wm[i - w0] = ((w[i - wo] ^ 128) - 128) * sw[(i // blk) % oc % len(sw)]

    def rebias(self, o, u):
        # channel o's int32 bias and kept fraction (the value held, b - be / 256 bias
        # steps), and its momentum velocity, at a scale 2^u times the old (u = 1:
        # halved, -1: doubled)
        b, e, v = self.b, self.be, self.vb
        t = 256 * b[o] - ((e[o] ^ 128) - 128)
        t = t >> 1 if u > 0 else t + t
        q = (t + 127) >> 8
        e[o] = (256 * q - t) & 255
        b[o] = _clamp(q)
        if v is not None:
            v[o] = v[o] >> 1 if u > 0 else _clamp(v[o] + v[o])

    def opi(self):
        # (output channels, positions, input channels): an FC's, or a 1x1 conv's as an FC
        # over its positions (a streamed layer's: q8sparse.dak)
        if self.k == FC:
            return self.nout, 1, self.d['nin']
        gm = self.d['g']
        return gm[3], gm[10] * gm[11], gm[2]

    def geo(self):
        # (output channels, weights per channel, blk): weight i's channel is (i // blk) % oc
        r = self.row()
        return (self.nout if self.k == FC else self.d['g'][3]), r, (1 if self.k == DW else r)

    def forward(self, x, x2=None):
        if self.back:
            self.x = x              # (the backward pass of a trained layer / pool reads it)
        k = self.k
        if k == FC:                 # (first: each Python step costs thousands of cycles)
            self.fc(x)
            return self.y
        d = self.d
        if k >= PMAX:               # MAX_POOL_2D, AVERAGE_POOL_2D: int8 to int8
            self.net.X[PMAX].pok(self.y, x, self.g, self.lo, self.hi, k - PMAX)
            return self.y
        if k == CONV or k == DW:
            self.conv(x, self.g, self.y)
            return self.y
        if k == ADD:
            self.add(x, x2, self.y, self.nout)
            return self.y
        K.sumk(self.acc, x, self.zx, d['n'], self.nout)
        K.rqk(self.acc, self.nout, self.c, 1, self.mul, self.shf, self.y, self.zy, self.lo,
              self.hi, 0)
        return self.y

    def rows(self, o0, n, row):
        # the weights of output channels o0..o0+n-1 (row bytes each; 0: a depthwise
        # layer's, all): a view of the held ones, or read into the net's scratch
        w = self.w
        if w is None or (self.pw and not self.wlo <= o0 < self.whi):
            return self.net.weights(self, o0, n * row if row else self.d['wn'])
        o = o0 * row - self.wo
        return memoryview(w)[o:] if o else w

    def _chunk(self, o0, n, row, a=None):
        # weights, biases, multipliers, shifts and multiplier count of output channels
        # o0..o0+n-1 (row: weight bytes per channel; 0: a depthwise layer's, all read):
        # views of this layer's own, or read into the net's scratch (frozen layers; a:
        # (an int32 buffer, Q8Net.wide's, views of it past a chunk's weights for the
        # biases, multipliers and shifts), a streamed layer's, instead)
        net = self.net
        if a is None:
            w, q = self.rows(o0, n, row), None
        else:       # (a partial layer's held rows: their own, a's for the rest)
            w, q = (self.rows(o0, n, row) if self.pw and self.wlo <= o0 < self.whi else
                    net._read(net.woff[self.d['wt']] + o0 * row, a[0], n * row)), a[2]
        b, m, s = self.b, self.mul, self.shf
        if b is None:
            b = net.biases(self, o0, n) if a is None else net._read(
                net.woff[self.d['bt']] + 4 * o0, a[1], 4 * n)
        elif o0:
            b = memoryview(b)[o0:]
        if m is None:
            m, s = net.quant(self, o0, n, 0, q)
        elif o0 and self.c > 1:
            m, s = memoryview(m)[o0:], memoryview(s)[o0:]
        ck = net.ck     # (a list kept, not a tuple a chunk)
        ck[0] = w
        ck[1] = b
        ck[2] = m
        ck[3] = s
        ck[4] = n if self.c > 1 else 1
        return ck

    def seg(self, o0, O, nc):
        # the channels of the chunk of at most nc from o0 of O: none straddles the edges
        # of a partial layer's held window (pw) (a count, not a generator's tuples: heap)
        e = O
        if self.pw:
            e = self.wlo if o0 < self.wlo else self.whi if o0 < self.whi else O
        return min(nc, e - o0)

    def fc(self, x):
        d, acc = self.d, self.acc
        ni, no = d['nin'], self.nout
        if self.whole:
            # the layer's own weights in one chunk: _chunk's views are the arrays themselves
            # (fewer Python steps: each costs thousands of cycles on a Cortex-M0+)
            K.fck(acc, x, 0, self.zx, self.w, self.b, 1, ni, no)
            K.rqk(acc, no, self.c, 1, self.mul, self.shf, self.y, self.zy, self.lo, self.hi, 0)
            return
        nc = d.get('nc', no)
        if nc < no and self.w is not None and not self.pw:
            # (held weights: chunks as long as the multipliers' scratch and the sums, not
            # the weight scratch's: a chunk cost a Pico ~1.3 ms)
            nc = max(nc, min(no if self.c == 1 else len(self.net.qm), len(acc)))
        if nc >= no and self.w is not None and self.mul is not None and self.b is not None and (
                not self.pw):
            self.whole = 1          # (mul: read from q8.req after __init__)
            return self.fc(x)
        o0 = 0
        while o0 < no:
            n = self.seg(o0, no, nc)
            w, b, m, s, c = self._chunk(o0, n, ni)
            K.fck(acc, x, 0, self.zx, w, b, 1, ni, n)
            K.rqk(acc, n, c, 1, m, s, memoryview(self.y)[o0:], self.zy, self.lo, self.hi, 0)
            o0 += n

    def conv(self, x, gm, y):
        """CONV_2D / DEPTHWISE_CONV_2D of input x with geometry gm (the layer's, or a band
        of rows of it) into int8 y: a few output rows at a time (the sums fit the shared
        buffer), and for a streamed CONV_2D a chunk of output channels at a time."""
        acc, gs, d = self.acc, self.gs, self.d
        K.cpk(gs, gm, 14)
        # (one name a statement: more than three at once build a tuple, heap)
        OH = gm[10]
        OW = gm[11]
        O = gm[3]
        sh = gm[6]
        ph = gm[8]
        H = gm[0]
        xrow = gm[1] * gm[2]
        nc = d.get('nc', O) if self.k == CONV else O
        row = gm[4] * gm[5] * gm[2] if self.k == CONV else 0
        dw = self.k == DW
        net = self.net
        gb = net.gb     # (a streamed conv: a chunk's all in the idle input-gradient buffer)
        wide = gb and (self.w is None or self.pw) and row and 'yg' not in d
        cap = len(acc) // (OH * OW)
        # (viper and assembler kernels: the biases, multipliers and shifts in the idle
        # weight scratch, the weights alone in that buffer: fewer chunks)
        v = wide and K.VIPER and len(net.wbuf or b'') >= 12 * cap
        nw = net.wide(gb[0] if wide else None, row if v else row + 12, cap, nc)
        wa = None
        if nw:      # (the views made once a call, not a chunk: heap)
            wa = memoryview(gb[0])
            b, k, e = (memoryview(net.wbuf), 0, 4 * nw) if v else (wa, (nw * row + 3) >> 2, nw)
            # (the weights' view as the kernels read int8: a byte view on CPython, the
            # buffer itself for viper and assembler kernels; read by _read, a call less)
            wa = (wa if K.VIPER else wa.cast('B'), b[k:k + e],
                  (b[k + e:k + 2 * e], b[k + 2 * e:k + 3 * e]))
        xv, yv = memoryview(x), memoryview(y)   # (a view a call, not a row: heap)
        sy = 'yg' not in d      # (y bytes, not the int32 gradient buffer's on a board)
        nc = nw or nc
        # (the kernels and the zero points and clamps in locals: a chunk's rows cost
        # a Cortex-M0+ a Python attribute look-up each, thousands of cycles a step)
        ck, rq = K.dwk if dw else K.convk, K.rqk
        zx, zy = self.zx, self.zy
        lo, hi = self.lo, self.hi
        L = len(acc)
        o0 = 0
        while o0 < O:
            n = self.seg(o0, O, nc)
            w, bv, mv, sv, c = self._chunk(o0, n, row, wa)
            gs[3] = n
            R = max(1, L // (OW * n))
            r0 = 0
            while r0 < OH:      # (not a range of step R: an iterator a chunk, heap)
                r = min(R, OH - r0)
                # rows r0.. read input rows from a on: the input from row a, the pad top
                # what is left of it (never negative: viper reads the table unsigned)
                a = r0 * sh - ph
                a = a if a > 0 else 0
                gs[10] = r
                gs[8] = ph + a - r0 * sh
                gs[0] = H - a
                ck(acc, xv[a * xrow:] if a else x, zx, gs, w, bv)
                if n == O:
                    rq(acc, r * OW * n, c, 1, mv, sv, yv[r0 * OW * O:], zy, lo, hi, 0)
                elif c == n and sy:     # (into y, rows O apart: no copy after)
                    rq(acc, r * OW * n, c, 1, mv, sv, yv[r0 * OW * O + o0:], zy, lo, hi, O)
                else:       # (into the idle dz where it fits: not over the sums)
                    a8 = net.dz if len(net.dz) >= r * OW * n else net.acc8
                    rq(acc, r * OW * n, c, 1, mv, sv, a8, zy, lo, hi, 0)
                    K.stk(y, r0 * OW * O + o0, O, a8, r * OW, n)
                r0 += R
            o0 += n

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
    def __init__(self, meta, wof_path, mom=0.0, adam=0, setup=1, batch=1):
        # the load: utrain.q8load, dropped after it (none of it runs again), and
        # collected before the code training keeps that the net's table asks for loads
        # (utrain.q8ext, itself dropped after): not both at once (the load's peak: a BatchNorm-folded int8 CNN, whose
        # ranges follow training and whose weight scales grow, needed 91 KB with
        # utrain.q8load, q8range and q8grow resident together, 32-bit)
        from utrain.q8load import build
        build(self, meta, wof_path, mom, adam, batch, globals())
        build = None
        from utrain import drop
        drop('q8load')
        import gc
        gc.collect()
        from utrain.q8ext import ext
        ext(self, globals())
        ext = None
        drop('q8ext')
        if setup:       # (setup=0: the trainer's own follows, with its settings: made here
            self.setup()    # at SGD batch 1's, a batch's arrays, and a shared weight's
            #                 uses' bias sums, were garbage between the load's survivors:
            #                 TimeDistributed steps at SGD batch 4 0.985x their plan, 32-bit)

    def strips(self):
        """True when a band group takes the model's input: forward(None) then reads the
        sample a strip of rows at a time from self.src (file, offset)."""
        g = self.groups.get(0)
        return g is not None and g.takes(self.xin)

    def close(self):
        self.f.close()
        if self.meta.get('req'):
            self.rf.close()
            self.rs.close()
        if K._A is not None:    # (its tables' raw addresses would keep our buffers)
            K._A.forget()

    def _read(self, off, buf, n=0):
        # n bytes (0: all of buf) of the weights file from off into buf's start
        f = self.f
        f.seek(off)
        if not n:
            f.readinto(buf)
        elif _RC:       # (readinto's count: no view, heap the collector comes back for)
            f.readinto(buf, n)
        else:
            f.readinto(memoryview(buf).cast('B')[:n])
        return buf

    def _req(self, d, buf, half=0):
        # a layer's multipliers (half 0), shifts (1) or weight scales (2) from q8.req
        c = d['nq']
        f = self.rf
        f.seek(d['ro'] + half * 4 * c)
        f.readinto(memoryview(buf)[:c])
        return buf

    def biases(self, L, o0, n):
        """n biases of frozen layer L from output channel o0 on, into the shared scratch."""
        return self._read(self.woff[L.d['bt']] + 4 * o0, self.qb, 4 * n)

    def quant(self, L, o0, n, h=0, q=None):
        """Frozen layer L's multipliers and shifts from output channel o0 on (n of them;
        the one of a per-tensor layer), into the shared scratch (or the pair q); h=3: its
        input gradient's per-channel rescaling (sw[o] / max(sw), after its weight scales
        in q8.req)."""
        d = L.d
        c = d['nq']
        f, g = self.rf, self.rs
        qm, qs = q = q or self.qq
        if c == 1:
            o0, n = 0, 1
        v, n = _RC, 4 * n         # (bytes: readinto's count on a board, no view)
        f.seek(d['ro'] + 4 * (h * c + o0))
        f.readinto(qm, n) if v else f.readinto(memoryview(qm).cast('B')[:n])
        g.seek(d['ro'] + 4 * ((h + 1) * c + o0))
        g.readinto(qs, n) if v else g.readinto(memoryview(qs).cast('B')[:n])
        return q

    def _wide(self, a):
        # a wider scratch pair for quant than qm, qs: the halves of int32 buffer a's
        # values (a free part of an input-gradient buffer), else None; the pairs of the
        # last two buffers asked for kept (the sums buffer's, a gradient buffer's: asked
        # for a layer a step, their views and tuple were heap each time)
        c = self.wc
        if c[0] is a:
            return c[1]
        if c[2] is a:
            return c[3]
        h = len(a) >> 1
        r = None
        if h > len(self.qm):
            v = memoryview(a)
            r = v[:h], v[h:2 * h]
        if type(a) is not memoryview:   # (a view is made anew each time: not kept)
            c[2], c[3] = c[0], c[1]
            c[0], c[1] = a, r
        return r

    def wide(self, a, per, cap, nc):
        # the output channels a chunk of a streamed layer takes when they are read into
        # int32 buffer a (free: an input-gradient buffer, idle in a forward pass, or its
        # part past the input gradient being made) at per bytes a channel, at most cap (its
        # sums, its dz); 0 where that is no more than nc (the weight scratch's, q8.json
        # 'nc') or no int8 view of a exists. Fewer chunks: each costs a Cortex-M0+ ~1 ms
        # of Python and reads (MobileNetV2's 1x1 head: 13 for 36 forward, 18 backward).
        # The same integers: a channel's sums, and the input gradient's, do not depend on
        # the chunks.
        if a is None or not (K.VIPER or hasattr(memoryview, 'cast')):
            return 0
        n = min((4 * len(a) - 4) // per, cap)
        return n if n > nc else 0

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
        if not self.groups:         # (no band group: fewer steps a layer)
            for L in ls:
                ins = L.ins
                if ins is None:
                    x = L.forward(x)
                elif L.k == ADD:
                    x = L.forward(t[ins[0]], t[ins[1]])
                elif L.k >= CAT:
                    x = self.X[L.k].fwd(L, self, t)
                else:
                    x = L.forward(t[ins[0]])
                if L.mk is not None:
                    L.rc = self.S.mkk(L.mk, x, L.nout, L.lo, L.hi)
            return x
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
            elif L.k >= CAT:
                x = self.X[L.k].fwd(L, self, t)
            else:
                x = L.forward(t[ins[0]])
            if L.mk is not None:
                L.rc = self.S.mkk(L.mk, x, L.nout, L.lo, L.hi)
            i += 1
        return x

    def logits(self, x):
        y = self.forward(x)
        s, z, n = self.sy, self.zy, len(y)
        out = [0.0] * n         # (at its size: a list grown to it is a block of the next
        for i in range(n):      # power of two, its growth's blocks holes in the heap)
            out[i] = s * (((y[i] ^ 128) - 128) - z)
        return out

    def loss(self, x, label, grad=False):
        """(loss, hit) of int8 sample x with class index label (scce): softmax
        cross-entropy on the dequantized logits, hit 1 when the largest logit is the
        class's; with grad, also dL/dlogits.  In integers: the int8 logits' differences to
        their max d index a table of round(2^14 exp(-s_y d)) (made once), the gradient
        p - onehot is int32 at scale 2^-14 (kernels sfk, sgk: no float object per class
        on a board).  A loss on float targets (cce's class probabilities, mse, mae, bce)
        is utrain.q8reg's, which Q8Trainer puts in this one's place."""
        y = self.forward(x)
        n = len(y)
        T = self.etab
        if T is None:               # (a table from before prepare wrote q8.json's etab)
            s = self.sy
            T = self.etab = array('i', [int(round(16384.0 * exp(-s * d))) for d in range(256)])
        g, r = self.g0, self.smr
        K.sfk(y, n, T, g, r)
        t = r[0]
        loss = self.sy * (r[2] + 128 - (y[label] ^ 128)) + log(t / 16384.0)
        hit = 1 if r[1] == label else 0
        if not grad:
            return loss, hit
        K.sgk(g, n, 268435456 // t)
        g[label] -= 16384
        return loss, hit, g

    def setup(self, optimizer='sgd', batch=1, beta1=0.9, beta2=0.999, eps=1e-7, momentum=0.0):
        """Optimizer and batch: sgd at batch 1 updates each layer as its gradient is done
        (step); otherwise accum sums gradients and apply updates; their state made once
        (utrain.q8setup)."""
        _once('setup', self, optimizer, batch, beta1, beta2, eps, momentum)

    def step(self, x, label, lr):
        """One SGD step (batch 1) on int8 sample x with target label; returns loss, hit."""
        r = self._run(x, label, lr)
        if self.sh is not None:     # (the shared weights' summed gradients)
            self.sh.step(lr)
        if self.wg is not None:
            self.wg.check()
        return r

    def accum(self, x, label):
        """Forward and backward of one sample, its gradients added to the batch's sums
        (apply updates from them); returns loss, hit."""
        return self._run(x, label, None)

    def _run(self, x, label, lr):
        self.lr = lr                # (SGD at batch 1: a layer's own update, utrain.q8slope)
        loss, hit, dl = self.loss(x, label, True)
        self.bq[3] = None           # (_ibias's multiplier: none kept from a step cut short)
        # the loss gradient as int32 with scale s = 2^-14 (scce's own) or 2^-20 (cce's
        # floats; |dL/dlogit| <= 1: a scale every sample shares, so batch sums differ only
        # by the layers' powers of two)
        if isinstance(label, int):
            g, s = dl, 1.0 / 16384.0
        else:               # (into the scce gradient's buffer, free here: a list
            s = 1.0 / 1048576.0     # grown to its size was a 1 KB block a step)
            g = self.g0
            for j in range(len(dl)):
                g[j] = int(round(dl[j] / s))
        if self.H is not None:      # a graph: gradients held for their producers
            self.H.walk(g, s, lr)
            return loss, hit
        # a chain (chain()): each layer from the loss down hands its input's gradient to
        # the layer below, until one passes none
        ls = self.layers
        i = len(ls) - 1
        while i >= self.first:
            L = ls[i]
            gi = L.gi
            g, s = self._back(L, g, s, lr, len(gi) > 0)
            if not gi:
                break
            i -= 1
        return loss, hit

    def zero(self):
        """Drop the gradient sums of an unfinished batch."""
        for L in self.layers:
            if L.ga is not None:
                K.zk(L.ga, len(L.ga))
                if L.gk is not None:
                    L.gk[1] = 0
                for o in range(len(L.ba)):
                    L.ba[o] = 0.0

    def apply(self, lr, scale):
        """Update every trained layer from the batch's sums times scale (1/batch for a mean),
        then zero them (utrain.q8batch, which setup loads for Adam or a batch > 1)."""
        self.B.apply(self, lr, scale, qmul)
        if self.wg is not None:
            self.wg.check()

    def _fits(self, d, n, t):
        # whether n int32 values d times c (> 0; t = 64 / c, made once a call) stay within
        # 2^29 in 1/65536 weight steps: |d| < 2^(e + 7) (e = nrk), c 2^e < 2^6, i.e.
        # 2^e < t (no frexp: ~40 us a call on an RP2040; a small int against a float
        # makes no float, where c 2^k made one a chunk, heap): _dith's updates
        # (q8batch.upd's too)
        e = K.nrk(d, n)
        return (1 << e) < t if e < 30 else float(1 << e) < t    # (2^30: a long int)

    def _swn(self, sw):
        # min(sw) of a layer's float32 weight scales (an array: boxing one value, not
        # each, heap; a list, bench.int8's, holds them boxed)
        return min(sw) if type(sw) is list else sw[K.mink(sw, len(sw))]

    def _dith(self):
        # _upd's h for updates in 1/65536 weight steps (within 2^30: _fits), rounded to
        # 1/256 with it: a draw of upk's generator (0..255), one a layer's step (its
        # chunks the same h: chunked as whole).  Unbiased, where rounding to the nearest
        # made an update under 1/512 step 0, each step (issue 28: a layer whose updates
        # all were never moved where float's weights did)
        self.seed = r = K.lcg(self.seed)
        return r >> 22

    def _upd(self, L, i0, d, n, h=-1):
        # the int8 update of L's weights i0..i0+n-1 by d (int32, 1/256 weight steps),
        # through the momentum velocity where there is one (v = mu v + d; w -= v: d = v);
        # h >= 0: d in 1/65536 steps, (d + h) >> 8 in 1/256 (a dither: _dith), in vmk /
        # vma's add to the velocity, else in upek / upmk
        v, f = L.vw, L.wf
        if v is not None or f is not None:
            j = i0 - L.w0()         # (the index in the window's state)
        if v is not None:
            p = self.vmp
            if h >= 0:
                p[4], p[5] = h, 8
            else:
                p[4], p[5] = 0, 0
            self.seed = self.M.step(L, v, j, d, n, p, self.seed)
            h = -1                  # (d: the velocity, 1/256 steps)
        i0 -= L.wo
        w = memoryview(L.w)[i0:] if i0 else L.w
        if f is not None:           # exact, through the fractions
            p = self.upe
            p[0], p[1] = n, 0
            if h >= 0:
                p[1], p[2], p[3] = 1, 8, h
            K.upek(w, memoryview(f)[j:] if j else f, d, p)
        elif h >= 0:
            p = self.upm
            p[0] = self.seed    # (a target a statement: four build a tuple, heap)
            p[1], p[2], p[3] = 1, 8, h
            self.seed = K.upmk(w, d, n, p)
        else:
            self.seed = K.upk(w, d, n, self.seed)

    def load_weights(self, path):
        """The int8 weights and int32 biases a .wof holds (all of weights.wof's layers, or
        trained.wof's trained ones); float copies follow (utrain.q8setup)."""
        _once('load_weights', self, path)

    def _gbuf(self, g, n):
        # an int32 input-gradient buffer of n values that is not g: two shared by all
        # layers (each layer's is read by the layer before it, then free), made with the net
        gb = self.gb
        if gb is None or len(gb[0]) < n:
            w = self.wc     # (_wide's pairs: none of the old buffers kept)
            w[0] = w[1] = w[2] = w[3] = None
            gb = self.gb = self._gbs(self.gm)
        return gb[1] if g is gb[0] else gb[0]

    def _gbs(self, m):
        # the input-gradient buffers: two, or one twice (a weighted layer's int32 output
        # gradient is dead once its int8 dz is made: its input's may overwrite it)
        a = _i32(m)
        return (a, _i32(m) if self.g2 else a)     # (g2: q8load.gtwo's, the load's)

    def _back(self, L, g, s, lr, need_dx):
        # g: int32 dL/dy (before the fused activation and clamp) with float scale s;
        # returns the input's (g, s) when need_dx
        d = L.d
        n = L.nout
        if L.k == ADD:
            # dL/dx1 = dL/dx2 = dL/dy (real units: the same g and scale) where y passed
            # its clamp: on the chain (the first input that takes one) and held for the
            # other, which _run adds to its gradient at its producer (x + x: twice g)
            self.S.mzk(g, n, L.mk)
            if L.ins[0] == L.ins[1]:
                return g, 2 * s
            if len(L.gi) > 1:       # (a graph's: utrain.q8hold)
                s = self.H.hold(L.ins[L.gi[1]], g, s, n)
            return g, s
        if L.k >= CAT:
            return self.X[L.k].back(L, self, g, s)
        if L.k == MEAN:
            N = d['n']
            if 'sm' not in d:   # (a SUM's: g itself)
                s /= N
            if L.bc:            # broadcast over the N positions by the layer below (smk)
                self.bc = n
                return g, s
            dg = self._gbuf(g, N * n)
            K.rpk(dg, g, N, n, 0)
            return dg, s
        if L.k >= PMAX:
            # a pool: the int32 gradient to the window's max (its first in scan order), or
            # spread over the window (scale s / (KH KW), edge windows' counts rounded)
            gm = L.g
            dx = self._gbuf(g, gm[0] * gm[1] * gm[2])
            lo, hi = L.lo, L.hi
            self.X[PMAX].pbk(dx, g, L.x, gm, L.y, lo if lo > -128 else -129, hi if hi < 127 else 128,
                  L.k - PMAX)
            return dx, (s / (gm[4] * gm[5]) if L.k == PAVG else s)
        dz = self.dz
        if L.sh is not None:
            lr = None           # (a shared weight: its uses' sums, utrain.q8share)
        p = self.bc             # g: one row of p values for every position (a MEAN's)
        self.bc = 0
        # a broadcast row into a streamed layer (its weights frozen, read from flash a
        # chunk of output channels at a time): its dz made a chunk at a time too, in the
        # shared dz (never its whole output's: MobileNetV2's 1x1 head, 11.5 KB), from
        # the row kept in the sums buffer (free in a backward pass; as long as a MEAN's
        # output: quant.plan) while the input gradient fills the gradient buffer
        ch = p and L.w is None
        if ch:
            K.cpk(self.acc, g, p)
            g = self.acc
        k = _shift(g, p or n)
        if not ch:
            self._mask(L, dz, g, n, k, p)
        sz = s * (1 << k)
        bs = L.bs           # (None: a layer that passes the gradient alone)
        if L.train:                            # bias sums
            gb = self.gb
            O, P, I = L.opi() if ch else (0, 0, 0)
            if ch and p == O and gb is not None and len(gb[0]) >= O:
                # all channels' sums at once from the row (q8sparse.smb: the chunks'
                # integers, no dz) in the input-gradient buffer that _dx fills next, and
                # one bias step (a chunk's sums a call cost ~2 ms a chunk on a Cortex-M0+;
                # g: the row in the sums buffer, not gb's)
                bs = gb[0]
                self.S.smb(bs, g, k, L.mk, O, P)
                # (the rest of that buffer: the bias step's multipliers a few reads at
                # a time, not 36 of qbuf's; _dx's rescaling likewise, the whole buffer)
                self._bias(L, sz, lr, 0, O, bs, self._wide(memoryview(bs)[O:]))
            elif ch:        # (and the bias steps: a chunk's sums alone held, bsn)
                for o0, m in self._chunks(L, g, k, p):
                    K.sumk(bs, dz, 0, P, m)
                    self._bias(L, sz, lr, o0, o0 + m, bs)
            else:
                oc = L.nout if L.k == FC else L.g[3]
                K.sumk(bs, dz, 0, n // oc, oc)
        dx = None
        if need_dx:
            dx, sx = self._dx(L, g, dz, s, sz, p, k, ch)
        if L.train:        # after dx (the old weights'): each chunk applied as it is made
            self._wgrad(L, dz, sz, lr, None if need_dx or self.H is not None else g)
            if not ch:      # (the per-channel multipliers a few reads at a time, in the
                lo = L.blo      # sums buffer: free once the weight gradient is applied)
                self._bias(L, sz, lr, lo, L.bhi, memoryview(bs)[lo:] if lo else bs,
                           self._wide(self.acc))
        return dx, (sx if need_dx else 0.0)

    def _chunks(self, L, g, k, p, nc=0):
        # (first, count) of each chunk of streamed layer L's output channels (nc a chunk,
        # 0: its table's), their dz (P positions x count) made in the shared dz from the
        # broadcast row g (p values) >> k where L's mask passes (q8sparse.smc)
        O, P, I = L.opi()
        nc = nc or L.d.get('nc', O)
        o0 = 0
        while o0 < O:
            m = L.seg(o0, O, nc)
            self.S.smc(self.dz, g, k, L.mk, o0, m, O, P, p)
            yield o0, m
            o0 += m

    def _mask(self, L, dz, g, n, k, p=0):
        # dz = int8 of g >> k where the forward output passed its clamp (its mask bits, or
        # the output itself); p: g is one row of p values broadcast (masked layers only)
        if L.mk is not None:
            self.S.smk(dz, g, n, k, L.mk, p)
        else:
            K.shk(dz, g, n, k, L.y, L.lo, L.hi)

    def _dx(self, L, g, dz, s, sz, p=0, k=0, ch=0):
        # the int32 input gradient of layer L from its int8 output gradient dz (scale sz;
        # g: the int32 one it came from, scale s; p: its broadcast period) and its scale
        # (ch: dz made a chunk at a time from g >> k, _chunks)
        d = L.d
        n = L.nout
        if L.dxm is not None or L.dxr:
            # per-channel weight scales: dz * sw[o] / max(sw), requantized to int8 (in
            # dz2 when dz stays for the weight gradient; a layer whose weights do not
            # train is done with dz: in place)
            if L.dxr:
                gb = self.gb    # (ch: g is the sums buffer, the input-gradient one free)
                self._rescale(L, g, p, self._wide(gb[0]) if ch and gb is not None else None)
            else:
                K.rqk(g, p or n, len(L.dxm), 1, L.dxm, L.dxs, g, 0, 0, 0, 1)
            k = _shift(g, p or n)
            if L.whi > L.wlo:
                dz = self.dz2
            if not ch:
                self._mask(L, dz, g, n, k, p)
            sz = s * (1 << k)
        if L.w is None or L.pw:     # streamed (q8sparse.dak): a chunk of output channels
            O, P, I = L.opi()       # at a time (a partial layer's window from its rows)
            dx = self._gbuf(g, P * I)
            K.zk(dx, P * I)
            if ch:      # (a chunk's weights in dx's buffer past dx: fewer chunks)
                self.S.dxch(self, L, dx, dz, g, k, p, P, I, d.get('nc', O))
            else:
                nc = d.get('nc', O)
                o0 = 0
                while o0 < O:
                    m = L.seg(o0, O, nc)
                    self.S.dak(dx, dz, L.rows(o0, m, I), o0, m, O, P, I)
                    o0 += m
        elif L.k == FC:
            dx = self._gbuf(g, d['nin'])
            K.dxk(dx, dz, 0, L.w, n, d['nin'])
        else:
            gm = L.g
            dx = self._gbuf(g, gm[0] * gm[1] * gm[2])
            (K.cdk if L.k == CONV else K.ddk)(dx, dz, L.w, gm)
        return dx, sz * L.swm

    def _rescale(self, L, g, p, q=None):
        # g[:p] (one row, a channel each) times sw[o] / max(sw), the multipliers read a
        # scratch at a time (q: a wider pair, _wide; the host's qmul, as held ones: the
        # same integers)
        qm, qs = q = q or self.qq
        sw = L.d.get('sw')
        c = len(qm)
        for o0 in range(0, p, c):
            k = min(c, p - o0)
            if 'ro' in L.d:
                self.quant(L, o0, k, 3, q)
            else:           # (a table not written to files: its scales inline, a host's)
                for j in range(k):
                    qm[j], qs[j] = qmul(sw[o0 + j] / max(sw))
            v = memoryview(g)[o0:] if o0 else g
            K.rqk(v, k, k, 1, qm, qs, v, 0, 0, 0, 1)

    def _wgrad(self, L, dz, sz, lr, g=None):
        # layer L's weight gradient from its int8 output gradient dz (scale sz), a chunk of
        # output channels at a time in the shared buffer gw (or in g, the int32 output
        # gradient dz was made from, an input-gradient buffer dead once dz is made, where
        # it holds more channels: fewer chunks, the same integers): QAS SGD applied at once
        # (lr; w_q -= lr sz sx / s_W[o] * gw, in 1/256 steps), or added to the batch's sums
        # (lr None; q8batch.unit's).  A depthwise layer's in one piece.
        d = L.d
        if L.whi <= L.wlo:
            return                              # bias alone
        sx = d['sx']
        f, u = sz * sx * (1.0 if lr is None else lr), 256.0
        B = self.B or L.sh      # (unit: q8batch's; shared weights' at SGD batch 1 too)
        gw = self.gw
        row = L.row()       # (and oc: ints, not geo()'s tuple, heap a step)
        oc = L.nout if L.k == FC else d['g'][3]
        if L.k == DW:
            n = oc * row
            K.zk(gw, n)
            K.dgk(gw, dz, L.x, L.zx, L.g)
            if lr is None:
                B.unit(L, gw, n, 0, oc, 1, f, qmul, _mults)
            elif f and self._fits(gw, n, 64.0 * self._swn(d['sw']) / f):
                _mults(L, gw, n, 0, oc, 1, f, 65536.0)
                self._upd(L, 0, gw, n, self._dith())
                return
            else:
                _mults(L, gw, n, 0, oc, 1, f, u)
            self._put(L, 0, gw, n, lr)
            return
        nc = d.get('gc', oc)
        gb = self.gb
        if gb is not None and (g is gb[0] or g is gb[1]) and len(g) // row > nc:
            gw, nc = g, len(g) // row
            if len(d['sw']) > 1 and len(L.um) < L.whi - L.wlo:
                nc = min(nc, len(L.um))     # (_mults: a multiplier a chunk's channel)
        p = None
        sw = d['sw']
        if L.k == FC and lr is not None and L.vw is None and len(sw) == 1:
            # an FC layer at batch 1 without momentum, per-tensor: |gw| < 2^15, so upmk
            # (upek with fractions) scales it by a 15-bit multiplier in its one pass (fewer
            # cycles than rqk's 62-bit products then upk)
            mm, e = qmul(f / sw[0] * u)
            if -15 <= e <= 15:
                p = self.upm
                p[1], p[2] = mm >> 16, 15 - e
                # the rounding to 1/256 steps dithered (h uniform in [0, 2^sh), a draw a
                # step of upk's generator): unbiased, where half a unit rounded every
                # update under 1/512 step to 0, each step, and a layer whose updates all
                # were never moved (issue 28: a float autoencoder's first Dense as int8
                # at lr 0.01, float's weights moving); h < 2^30 keeps the sum in 31 bits
                self.seed = r = K.lcg(self.seed)
                p[3] = r >> (15 + e)
        h = self._dith() if p is None and lr is not None else -1
        t = 64.0 * self._swn(sw) / f if h >= 0 and f else 1e38     # (_fits', a call's)
        o0 = L.wlo
        while o0 < L.whi:   # (not a range of step nc: a range object a call, heap)
            m = min(nc, L.whi - o0)
            o1 = o0 + m     # (the next chunk's, set here: the loop's body continues)
            n = m * row
            K.zk(gw, n)
            if L.k == FC:
                K.gwk(gw, dz, 0, L.x, 0, L.zx, o0, o0 + m, row)
            else:
                K.cgk(gw, dz, L.x, L.zx, L.g, o0, o0 + m)
            if p is not None and L.wf is not None:
                j = (o0 - L.wlo) * row
                pe = self.upe
                pe[0] = n       # (a target a statement: four build a tuple, heap)
                pe[1] = p[1]
                pe[2] = p[2]
                pe[3] = p[3]
                K.upek(memoryview(L.w)[o0 * row:] if o0 else L.w,
                       memoryview(L.wf)[j:] if j else L.wf, gw, pe)
                o0 = o1
                continue
            if p is not None:
                p[0] = self.seed
                self.seed = K.upmk(memoryview(L.w)[o0 * row:] if o0 else L.w, gw, n, p)
                o0 = o1
                continue
            if lr is None:      # (a batch's sums: q8batch.unit)
                B.unit(L, gw, n, o0, m, row, f, qmul, _mults)
            elif self._fits(gw, n, t):
                # in 1/65536 steps where they stay within 2^30, then to 1/256 with a
                # dither h (_dith; with momentum too): nearest rounding made an update
                # under 1/512 step 0, each step (issue 28: a Keras int8 autoencoder's
                # per-channel Dense layers at a small lr never moved where float's did)
                _mults(L, gw, n, o0, m, row, f, 65536.0)
                self._upd(L, o0 * row, gw, n, h)
                o0 = o1
                continue
            else:
                _mults(L, gw, n, o0, m, row, f, u)
            self._put(L, o0 * row, gw, n, lr)
            o0 = o1

    def _put(self, L, i0, gw, n, lr):
        # weights i0..i0+n-1's rescaled gradient: applied, or added to the batch's sums
        if lr is None:
            w0 = L.w0()
            K.adk(memoryview(L.ga)[i0 - w0:] if i0 > w0 else L.ga, gw, n)
        else:
            self._upd(L, i0, gw, n)

    def _bias(self, L, sz, lr, lo, hi, bs, q=None):
        # the bias sums bs of output channels lo..hi-1 (bs[o - lo]: channel o's) at scale
        # sz: the float biases stepped at once (lr) and requantized, or added to the
        # batch's sums (a layer's window whole, or a chunk of it at a time, in order)
        if lr is None:
            ba = L.ba
            for o in range(lo, hi):
                ba[o] += sz * bs[o - lo]
            return
        if L.be is not None:
            return self._ibias(L, lr * sz, lo, hi, bs, q)
        sx, sw = L.d['sx'], L.d['sw']
        bf, b, vb, mu = L.bf, L.b, L.vb, self.mom
        nw = len(sw)
        if nw == 1 and vb is None:
            # per-tensor scales: b -= lr sz bs / (sx s_W) bias steps, stochastically rounded
            # like the weights: one multiplier, no float step per channel
            L.um[0], L.us[0] = qmul(lr * sz / (sx * sw[0]) * 256.0)
            if L.us[0] < 16:                   # (bs << shift stays within 31 bits)
                n = hi - lo
                K.rqk(bs, n, 1, n, L.um, L.us, bs, 0, 0, 0, 1)
                self.seed = K.ubk(memoryview(b)[lo:] if lo else b, bs, n, self.seed)
                L.stale = 1                    # (bf: not kept by this update)
                return
        if L.stale:
            L.set_bias()
        c = lr * sz                            # (the products as before: same floats)
        # a zero gradient leaves bf[o] as it is (bf - 0.0), and so b[o] once every b[o]
        # is bf[o] requantized (sync, set by a pass's last chunk): skipped (float steps
        # cost thousands of cycles)
        sk = L.sync and vb is None
        if hi == L.bhi:
            L.sync = 1
        if vb is None and 1 < nw == len(b):
            # (SGD, per-channel scales, nw = the channels: the loop below with fewer
            # Python steps a channel, each costs thousands of cycles on a Cortex-M0+)
            for o in range(lo, hi):
                v = bs[o - lo]
                if v or not sk:
                    bf[o] -= c * v
                    q = int(round(bf[o] / (sx * sw[o])))
                    # (+-2^30: a small int's compare; a long one's only beyond)
                    b[o] = q if -1073741824 < q < 1073741824 else _clamp(q)
            return
        den = sx * sw[0]
        for o in range(lo, hi):
            v = bs[o - lo]
            if sk and not v:
                continue
            if vb is None:
                bf[o] -= c * v
            else:
                vb[o] = mu * vb[o] + c * v
                bf[o] -= vb[o]
            b[o] = _clamp(int(round(bf[o] / (den if nw == 1 else sx * sw[o % nw]))))

    def _ibias(self, L, c, lo, hi, bs, q=None):
        # SGD, per-channel scales: b[o] -= c bs / (sx sw[o]) bias steps in integers, the
        # rounding kept in L.be (q8kern.ubek; a float step a channel cost a Cortex-M0+
        # ~200 us): one multiplier c / (sx bsm) for all channels, in 2^-(8 + j) steps (j
        # <= 8 as fine as bs's bound, |bs| <= 128 positions, leaves within 2^29; a step
        # past that bound is clipped to it), then each channel's bsm / sw[o] (q8.req's, a
        # scratch at a time; a doubled weight scale's: 2^-ge[o] of it).  Momentum: the
        # steps in 1/256 (j = 0) into the int32 velocity (v = mu v + step; b -= v), the
        # bound 2^7 times lower (a velocity sums up to 1 / (1 - mu) steps)
        d, bq, v = L.d, self.bq, L.vb
        qm, qs = q or self.qq      # (q: a wider scratch pair, _wide)
        if bq[3] is not L:      # (a row-fed layer's chunks after its first: made there)
            m, e = qmul(c / (d['sx'] * d['bsm']) * 256.0)
            t = 15 if v is not None else 22
            P = 1 if L.k == FC else d['g'][10] * d['g'][11]     # (opi()[1]: no tuple)
            while (1 << (22 - t)) < P:
                t -= 1          # (2^(22 - t) >= P)
            j = t - e if t - e < 8 else 8
            if v is not None and j > 0:
                j = 0
            if j < 0:
                m, e, j = 2147483647, t, 0
            # (the layer itself, not its id: a long int on a 32-bit port; one target a
            # statement: four build a tuple)
            bq[0] = m
            bq[1] = e + j
            bq[2] = j
            bq[3] = L
        if hi == L.bhi:
            bq[3] = None        # (the layer's last chunk: the next call makes its own)
        qm[0], qs[0] = bq[0], bq[1]
        n = hi - lo
        K.rqk(bs, n, 1, n, qm, qs, bs, 0, 0, 0, 1)
        w, ge = len(qm), L.ge
        if ge is not None and not any(ge):
            ge = None
        o0 = lo
        while o0 < hi:      # (not a range of step w: a range object a call, heap)
            m = min(w, hi - o0)
            self.quant(L, o0, m, d['bh'], q)
            if ge is not None:      # (q8grow.gsk: a Python loop cost a Pico ~8 ms)
                self.wg.sk(qs, ge, o0, m)
            u = memoryview(bs)[o0 - lo:] if o0 > lo else bs
            K.rqk(u, m, m, 1, qm, qs, u, 0, 0, 0, 1)
            o0 += w
        if v is not None:
            v = memoryview(v)[lo:] if lo else v
            K.rqk(v, n, 1, n, self.mum, self.mus, v, 0, 0, 0, 1)
            K.adk(v, bs, n)
            bs = v
        K.ubek(memoryview(L.b)[lo:] if lo else L.b, memoryview(L.be)[lo:] if lo else L.be,
               bs, n, bq[2])


def _clamp(q):
    # an int32 bias: within +-(2^31 - 1)
    return -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q


def _mults(L, gw, n, c0, nc, blk, f, u):
    # gw[:n] (output channels c0..c0+nc-1, blk values each in turn, cycling) rescaled in
    # place by f / s_W[o] * u per output channel o (rqk, wide), 0 outside the layer's
    # weight window: per-tensor scales over a window take one multiplier for all (the
    # same qmul every channel would get), the others one each
    sw, mul, shf = L.d['sw'], L.um, L.us
    nw = len(sw)
    lo, hi = L.wlo, L.whi
    if nw == 1 and lo <= c0 and c0 + nc <= hi:
        mul[0], shf[0] = qmul(f / sw[0] * u)
        K.rqk(gw, n, 1, n, mul, shf, gw, 0, 0, 0, 1)
        return
    w = hi - lo
    if lo <= c0 and c0 + nc <= hi and len(mul) >= w:
        # the window's multipliers kept (umn), made again only when f's mantissa, u or a
        # weight scale (q8grow: uk None) changed: f moves by powers of two from step to
        # step (the gradient's scales) and f / s_W[o] * u with it, exactly (binary
        # floats, far from their range's ends), so qmul's multipliers stay and their
        # shifts move by f's exponent (a float step a channel cost ~150 us on a Cortex-M0+)
        # (uk: a list kept, changed in place: a new tuple a step was heap)
        fr, e = frexp(f)
        v = u
        if u == 65536.0:    # (the dithered update's unit: 2^8 times 256's, exactly, so
            e += 8          # the same multipliers, their shifts 8 more; made again at
            v = 256.0       # each switch between the two, they were 1 KB a step)
        k = L.uk
        if k is None or k[0] != fr or k[2] != v or not (
                -100 < k[3] + e - k[1] and k[4] + e - k[1] < 100):
            a = b = 0
            for j in range(w):
                mul[j], t = qmul(f / sw[(lo + j) % nw] * u)
                shf[j] = t
                if j == 0 or t < a:     # (the shifts' least and most: no copy of them)
                    a = t
                if j == 0 or t > b:
                    b = t
            if k is None:
                L.uk = k = [0, 0, 0, 0, 0]
            k[0], k[1], k[2] = fr, e, v
            k[3], k[4] = a, b
        elif e != k[1]:
            t = e - k[1]
            K.ack(shf, w, t)
            k[1] = e
            k[3] += t
            k[4] += t
        j = c0 - lo
        K.rqk(gw, n, nc, blk, memoryview(mul)[j:] if j else mul,
              memoryview(shf)[j:] if j else shf, gw, 0, 0, 0, 1)
        return
    for j in range(nc):
        o = c0 + j
        mul[j], shf[j] = qmul(f / sw[o % nw] * u) if lo <= o < hi else (0, 0)
    K.rqk(gw, n, nc, blk, mul, shf, gw, 0, 0, 0, 1)


def _shift(g, n):
    # the k that brings the int32 values g[:n] into int8 by g >> k (found in the kernel:
    # a Python loop step costs thousands of cycles on a Cortex-M0+)
    return K.nrk(g, n)
