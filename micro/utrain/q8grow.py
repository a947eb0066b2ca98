# Weight scales that grow (issue 29), loaded by utrain.q8 only for a table with a layer
# marked 'gw' (host_tools/prepare/quant.py: every layer whose weights train).  A trained
# weight that reaches +-127 clamps: the update past it is lost (MobileNetV2's op 62 at
# 1/2 ended with 54-86 of its window's weights there, the classifier up to 100; ~1 point
# of the int8/float gap).  After each update (Q8Net.step, apply) the trained window's
# +-127 weights are counted (bytes.count over 256-byte slices: no native code); an
# output channel with more there than it had (a per-channel model's calibrated maximum
# sits at +-127 from the start: not a clamp) doubles its weight scale (a per-tensor layer: the tensor's): its int8
# weights and their kept fractions halve (the value they hold, w - e/256 steps, halved
# and split again), momentum's velocities halve, its requantization shift grows by one
# (sx s_W / s_y doubles: the same multiplier), its int32 bias is requantized from the
# float one and its input-gradient rescaling (sw[o] / max(sw)) made again.  Each
# channel's exponent is kept (at most MAXK): in checkpoints (after the other int8
# state, b'UTGW', with the counts to exceed), and beside trained.wof as trained.wof.q8w (JSON {weight tensor:
# [exponents]}), which load_weights reads and export --quantized writes into the
# .tflite's per-channel scales.
from utrain.wof import exists, _replace

MAXK = 12           # at most 2^12 times a channel's calibrated scale
SEVEN = (b'\x7f', b'\x81')      # +127, -127


class Grow:
    def __init__(self, net, qmul, i32):
        self.net, self.qmul, self.i32 = net, qmul, i32      # (utrain.q8's: no import circle)
        # (a per-tensor layer only when its weights train whole: the frozen rows of a
        # rank's window share the scale)
        self.ls = [L for L in net.layers if L.train and L.whi > L.wlo and L.d.get('gw') and (
            len(L.d['sw']) > 1 or L.wr() == (0, L.d['wn']))]
        for L in self.ls:
            L.ge = bytearray(len(L.d['sw']))       # its weight scales' exponents
            L.g0 = bytearray(len(L.d['sw']))       # its channels' +-127 weights, last seen
            self.base(L)

    def base(self, L):
        """The counts a channel must exceed to double: its +-127 weights now (a
        per-channel model's calibrated maximum sits there: not a clamp)."""
        c = self._counts(L)
        for o in range(len(c)):
            L.g0[o] = min(255, c[o])
        L.gt = sum(L.g0)

    def _total(self, L):
        # the window's +-127 weights (bytes.count over 256-byte slices)
        w0, w1 = L.wr()
        mv = memoryview(L.w)
        i, end, t = w0 - L.wo, w1 - L.wo, 0
        while i < end:
            b = bytes(mv[i:min(end, i + 256)])
            t += b.count(SEVEN[0]) + b.count(SEVEN[1])
            i += 256
        return t

    def _counts(self, L):
        # each channel's +-127 weights in the window (a per-tensor layer's: one count)
        if len(L.ge) == 1:
            return [self._total(L)]
        w0, w1 = L.wr()
        oc, row, blk = L.geo()
        c = [0] * oc
        mv, wo = memoryview(L.w), L.wo
        if blk == 1:                # depthwise: channels strided
            for i in range(w0, w1):
                v = mv[i - wo]
                if v == 127 or v == 129:
                    c[i % oc] += 1
            return c
        for o in range(w0 // row, w1 // row):
            b = bytes(mv[o * row - wo:(o + 1) * row - wo])
            c[o] = b.count(SEVEN[0]) + b.count(SEVEN[1])
        return c

    def check(self):
        """Double the scale of each trained output channel with more weights at +-127
        than it had (a weight that reached it clamps there: the update past it is lost);
        fewer: the count to exceed drops to it.  The channels are counted only when the
        window's total moved."""
        for L in self.ls:
            if self._total(L) == L.gt:
                continue
            c = self._counts(L)
            g0, ge = L.g0, L.ge
            for o in range(len(c)):
                if c[o] > g0[o] and ge[o] < MAXK:
                    self.double(L, o)
                    g0[o] = 0
                else:
                    g0[o] = min(255, c[o])
            L.gt = sum(g0)

    def double(self, L, o):
        """Channel o's weight scale (the tensor's for a per-tensor layer) times 2."""
        d = L.d
        if L.stale:
            L.set_bias()            # (bf from the integer-updated b first)
        sw = d['sw']
        sw[o] *= 2.0
        L.shf[o] += 1
        L.ge[o] += 1
        oc, row, blk = L.geo()
        w0, w1 = L.wr()
        per = len(sw) > 1
        # the weights of channel o (all, per-tensor) in the window: index i of the layer
        # (L.w[i - wo]), j = i - w0 of its state (fractions, velocities, Adam's master)
        if not per:
            idx = range(w0, w1)
        elif blk == 1:              # depthwise: channel o's weights are strided by oc
            idx = range(w0 + o, w1, oc)
        else:
            idx = range(o * row, (o + 1) * row)
        w, f, v, wm, wo = L.w, L.wf, L.vw, getattr(L, 'wm', None), L.wo
        for i in idx:
            j = i - w0
            q = w[i - wo]
            q = (q ^ 128) - 128
            if wm is not None:      # Adam: the int8 weights are the master requantized
                t = int(round(wm[j] / sw[o]))
            else:
                e = 0
                if f is not None:
                    e = (f[j] ^ 128) - 128
                t = (256 * q - e) >> 1              # the value held, halved (1/256 steps)
                q2 = (t + 127) >> 8
                if f is not None:
                    f[j] = (256 * q2 - t) & 255     # (-128..127)
                t = q2
            w[i - wo] = (-127 if t < -127 else 127 if t > 127 else t) & 255
            if v is not None:
                v[j] >>= 1
        self._bias(L, range(len(L.b)) if not per else (o,))
        self._dxm(L)

    def _bias(self, L, chans):
        d = L.d
        sw, sx, b, bf = d['sw'], d['sx'], L.b, L.bf
        nw = len(sw)
        for c in chans:
            q = int(round(bf[c] / (sx * sw[c % nw])))
            b[c] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q

    def _dxm(self, L):
        # dz's per-channel rescaling sw[o] / max(sw) for the input gradient, made again
        # (held: a broadcast row's layer reads q8.req's, made for the calibrated scales)
        if not L.back or len(L.d['sw']) < 2:
            return
        qmul, _i32 = self.qmul, self.i32
        sw = L.d['sw']
        c = len(sw)
        if L.dxm is None:
            L.dxm, L.dxs = _i32(c), _i32(c)
            L.dxr = 0
        m = max(sw)
        for o in range(c):
            L.dxm[o], L.dxs[o] = qmul(sw[o] / m)

    def set(self, L, want):
        """Layer L's exponents want (a checkpoint's, a .q8w's): its scales and shifts
        brought to them, its weights and biases already at them (as loaded)."""
        sw, ge = L.d['sw'], L.ge
        for o in range(len(ge)):
            u = want[o] - ge[o]
            if u:
                sw[o] *= 2.0 ** u
                L.shf[o] += u
                ge[o] = want[o]
        self._dxm(L)

    def state(self):
        """The exponents and counts of every growing layer, one after another (checkpoints)."""
        return b''.join([bytes(L.ge) + bytes(L.g0) for L in self.ls])

    def nstate(self):
        return sum([2 * len(L.ge) for L in self.ls])

    def put(self, s):
        """A checkpoint's exponents and counts (state()'s bytes)."""
        o = 0
        for L in self.ls:
            n = len(L.ge)
            self.set(L, s[o:o + n])
            L.g0[:] = s[o + n:o + 2 * n]
            L.gt = sum(L.g0)
            o += 2 * n

    def save(self, path):
        """path.q8w: the exponents of the weights just saved at path (JSON {tensor: [...]})."""
        with open(path + '.q8w.tmp', 'w') as f:
            f.write('{%s}' % ','.join(['"%d":[%s]' % (L.d['wt'], ','.join(
                [str(v) for v in L.ge])) for L in self.ls]))
        _replace(path + '.q8w.tmp', path + '.q8w')

    def loaded(self, path):
        """After Q8Net.load_weights(path): the exponents of path.q8w (none: 0)."""
        v = {}
        if exists(path + '.q8w'):
            import json
            with open(path + '.q8w') as f:
                v = json.load(f)
        for L in self.ls:
            e = v.get(str(L.d['wt']))
            self.set(L, bytes(e) if e and len(e) == len(L.ge) else bytes(len(L.ge)))
            L.set_bias()
            self.base(L)
