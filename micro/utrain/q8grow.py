# Weight scales that grow (issue 29), loaded by utrain.q8 only for a table with a layer
# marked 'gw' (host_tools/prepare/quant.py: every layer whose weights train).  A trained
# weight that reaches +-127 clamps: the update past it is lost (MobileNetV2's op 62 at 1/2
# ended with 54-86 of its window's weights there, the classifier up to 100; ~1 point of
# the int8/float gap).  After each update (Q8Net.step, apply) the trained window's +-127
# weights are counted (c7n, one call a layer; Thumb on ARM: a viper count over op 62's
# window and the classifier, a call a channel, cost a Pico ~45 ms a step); an output
# channel with more there than it had (a per-channel model's calibrated maximum sits at
# +-127 from the start: not a clamp) doubles its weight scale (a per-tensor layer: the
# tensor's): its int8 weights and their kept fractions halve (hvk: the value they hold,
# 256 w - e, halved and split again), momentum's velocities halve, its requantization
# shift grows by one (sx s_W / s_y doubles: the same multiplier), its int32 bias is
# requantized from the float one and its input-gradient rescaling (sw[o] / max(sw)) made
# again.  Each channel's exponent (at most MAXK) and count go into checkpoints (after the
# other int8 state, b'UTGW'); the exponents beside trained.wof in trained.wof.q8w (binary:
# b'UTGW', then per layer u32 weight tensor, u32 count, a byte each), which load_weights
# reads and export writes into the model's scales.
# (c7d and hvk, viper, are here: loaded only with this module, not in q8kern: native
# code is heap on an RP2040.)
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER, side_save, side_load
if not VIPER:
    from utrain.q8kern import ptr8, ptr32
_FC = 0    # q8.FC

MAXK = 12           # at most 2^12 times a channel's calibrated scale
_DW = 2     # q8.DW


class Grow:
    TAG = b'UTGW'       # its state in a checkpoint's tail (utrain.q8train: parts, put)

    def __init__(self, net, qmul, i32):
        self.net, self.qmul, self.i32 = net, qmul, i32      # (utrain.q8's: no import circle)
        # (a per-tensor layer only when its weights train whole: the frozen rows of a
        # rank's window share the scale)
        self.ls = [L for L in net.layers if L.train and L.whi > L.wlo and L.d.get('gw') and (
            len(L.d['sw']) > 1 or L.wr() == (0, L.d['wn']))]
        # each channel's +-127 weights, counted (capped at 255): one scratch for all
        self.c = bytearray(max([len(L.d['sw']) for L in self.ls] or [0]))
        self.t = i32(6)     # (c7n's table, two words its scratch)
        self.sk = gsk       # (utrain.q8 _ibias)
        for L in self.ls:
            L.ge = bytearray(len(L.d['sw']))       # its weight scales' exponents
            L.g0 = bytearray(len(L.d['sw']))       # its channels' +-127 weights, last seen
            self.base(L)

    def base(self, L):
        """The counts a channel must exceed to double: its +-127 weights now (a
        per-channel model's calibrated maximum sits there: not a clamp)."""
        L.gt = self._counts(L)
        for o in _chans(L):
            L.g0[o] = self.c[o]

    def _counts(self, L):
        # self.c = each channel's +-127 weights in the window, at most 255 (a per-tensor
        # layer's: one count); returns the window's (c7n: one call a layer)
        # (ints, not wr() and geo()'s tuples; a target a statement: more than three at
        # once build a tuple. A check a step: each was heap)
        row = L.row()
        t, w, o = self.t, L.w, 0
        if len(L.ge) == 1:
            t[0] = 1
            t[1] = L.nw()
            t[2] = 1
            t[3] = 0
            i = L.w0() - L.wo
        elif L.k == _DW or row == 1:    # depthwise: a channel's weights strided by oc
            oc = L.nout if L.k == _FC else L.d['g'][3]     # (geo()'s)
            t[0] = oc
            t[1] = row
            t[2] = oc
            t[3] = 1
            i = 0
        else:
            o = L.wlo
            t[0] = L.whi - o
            t[1] = row
            t[2] = 1
            t[3] = row
            i = o * row - L.wo
        return c7n(memoryview(w)[i:] if i else w, t, memoryview(self.c)[o:] if o else self.c)

    def check(self):
        """Double the scale of each trained output channel with more weights at +-127
        than it had (a weight that reached it clamps there: the update past it is lost);
        fewer: the count to exceed drops to it.  The channels are compared only when the
        window's total moved."""
        for L in self.ls:
            t = self._counts(L)
            if t == L.gt:
                continue
            r = _chans(L)
            c = self.c
            if c7d(c, L.g0, L.ge, r[0], len(r), MAXK):
                for o in r:
                    if c[o]:
                        self.double(L, o)
                t = self._counts(L)
            L.gt = t

    def double(self, L, o):
        """Channel o's weight scale (the tensor's for a per-tensor layer) times 2."""
        d = L.d
        sw = d['sw']
        sw[o] *= 2.0
        k = L.uk
        if k is not None and L.wlo <= o < L.whi:
            # its kept update multiplier (utrain.q8 _mults) halved: exactly one shift less
            u = L.us
            u[o - L.wlo] -= 1
            k[3] = min(k[3], u[o - L.wlo])      # (a list, in place: utrain.q8 _mults)
        L.shf[o] += 1
        L.ge[o] += 1
        oc, row, blk = L.geo()
        w0, w1 = L.wr()
        per = len(sw) > 1
        # the weights of channel o (all, per-tensor) in the window: index i of the layer,
        # L.w[i - wo], its state (fractions, velocities, Adam's master) at i - w0
        if not per:
            i0, n, st = w0, w1 - w0, 1
        elif blk == 1:              # depthwise: channel o's weights are strided by oc
            i0, n, st = w0 + o, row, oc
        else:
            i0, n, st = o * row, row, 1
        w, f, v, wm, wo = L.w, L.wf, L.vw, getattr(L, 'wm', None), L.wo
        mw = memoryview(w)[i0 - wo:]
        if wm is not None:          # Adam: the int8 weights are the master requantized
            for k in range(n):
                j = i0 - w0 + k * st
                t = int(round(wm[j] / sw[o]))
                mw[k * st] = (-127 if t < -127 else 127 if t > 127 else t) & 255
        else:
            hvk(mw, memoryview(f)[i0 - w0:] if f is not None else mw, n, st,
                  1 if f is not None else 0)
        if v is not None:           # momentum's velocities (int16, or int8: utrain.q8mom)
            if L.d.get('v8'):
                self.net.M.sb(memoryview(v)[i0 - w0:], n, st, 1)
            else:
                self.net.M.hk(memoryview(v)[2 * (i0 - w0):], n, st)
        self._bias(L, range(len(L.b)) if not per else (o,))
        if L is not self.net.layers[self.net.first]:    # (the lowest passes no gradient)
            self._dxm(L)

    def _bias(self, L, chans):
        if L.be is not None:        # (SGD's integer bias, its fraction, velocity: halved)
            for c in chans:
                L.rebias(c, 1)
            return
        if L.stale:
            # b stepped in integers (a per-tensor layer's, q8 _bias), no float held: halved
            # in integers, ties to even.  From the float bias (b sx sw / (sx 2 sw)) every odd
            # b was a tie that float32 on a board and float64 on the host broke apart
            b = L.b
            for c in chans:
                v = b[c]
                b[c] = (v >> 1) + ((v & 3) == 3)
            return              # (stale: bf made again from b where a step needs it)
        d = L.d
        sw, sx, b, bf = d['sw'], d['sx'], L.b, L.bf
        nw = len(sw)
        for c in chans:
            q = int(round(bf[c] / (sx * sw[c % nw])))
            b[c] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q

    def _dxm(self, L):
        # dz's per-channel rescaling sw[o] / max(sw) for the input gradient, made again
        # (held: a broadcast row's layer reads q8.req's, made for the calibrated scales)
        L.swm = max(L.d['sw'])      # (the input gradient's scale, utrain.q8 _dx)
        if not L.d.get('back') or len(L.d['sw']) < 2:     # (passes no input gradient)
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
        moved = 0
        for o in range(len(ge)):
            u = want[o] - ge[o]
            if u:
                sw[o] *= 2.0 ** u
                L.shf[o] += u
                ge[o] = want[o]
                moved = 1
                L.uk = None
        if moved and L is not self.net.layers[self.net.first]:
            self._dxm(L)

    def parts(self):
        """The exponents and counts of every growing layer, one after another, as the
        buffers themselves (a checkpoint's tail)."""
        out = []
        for L in self.ls:
            out.append(L.ge)
            out.append(L.g0)
        return out

    def nstate(self):
        return sum([2 * len(L.ge) for L in self.ls])

    def put(self, s):
        """A checkpoint's exponents and counts (parts()' bytes)."""
        o = 0
        for L in self.ls:
            n = len(L.ge)
            self.set(L, s[o:o + n])
            L.g0[:] = s[o + n:o + 2 * n]
            L.gt = self._counts(L)
            o += 2 * n

    def save(self, path):
        """path.q8w: the exponents of the weights just saved at path: b'UTGW', then per
        growing layer u32 its weight tensor, u32 its scales, a byte each (its exponent)."""
        side_save(path + '.q8w', b'UTGW', [(L.d['wt'], L.ge) for L in self.ls])

    def loaded(self, path):
        """After Q8Net.load_weights(path): the exponents of path.q8w (none: 0)."""
        got = side_load(path + '.q8w', b'UTGW', {L.d['wt']: len(L.ge) for L in self.ls})
        for L in self.ls:
            self.set(L, got.get(L.d['wt']) or bytes(len(L.ge)))
            L.set_bias()
            self.base(L)


def _chans(L):
    # the output channels whose weights train: a rank's window (a depthwise layer's
    # weights, strided, all), one for a per-tensor layer
    if len(L.ge) == 1:
        return range(1)
    return range(len(L.ge)) if L.k == _DW else range(L.wlo, L.whi)


@micropython.viper
def c7d(c, g, e, o0: int, n: int, mk: int) -> int:
    # channels o0..o0+n-1 whose count c[o] passed the one last seen g[o], exponent e[o]
    # below mk: c[o] = 1 (to double), g[o] = 0; the others c[o] = 0, g[o] = their count;
    # returns how many double
    pc = ptr8(c)
    pg = ptr8(g)
    pe = ptr8(e)
    d = 0
    for o in range(o0, o0 + n):
        q = int(pc[o])
        if q > int(pg[o]) and int(pe[o]) < mk:
            pc[o] = 1
            pg[o] = 0
            d += 1
        else:
            pc[o] = 0
            pg[o] = q
    return d


@micropython.viper
def hvk(w, e, n: int, st: int, he: int):
    # the int8 weights w[0], w[st], ... (n of them) halved: the value
    # each holds, 256 w - e in 1/256 steps (e: its kept fraction, he 1; else 0), halved
    # and split again into w and e (-128..127, as upek keeps them)
    pw = ptr8(w)
    pe = ptr8(e)
    i = 0
    for j in range(n):
        q = (int(pw[i]) ^ 128) - 128
        f = 0
        if he:
            f = (int(pe[i]) ^ 128) - 128
        t = ((q << 8) - f) >> 1
        q = (t + 127) >> 8
        if he:
            pe[i] = ((q << 8) - t) & 255
        pw[i] = q & 255
        i += st


# c7n, gsk: q8asm's Thumb loops on ARM boards, else q8vk's viper ones (their reference,
# which an ARM board does not load: tests/support/q8kern_cases.py compares them there)
from utrain.q8kern import _A  # noqa: E402
if _A is not None:
    c7n, gsk = _A.c7n, _A.gsk
else:
    from utrain.q8vk import c7n, gsk

if not VIPER:
    import sys
    if sys.implementation.name != 'micropython':    # CPython: the loops in numpy
        try:
            from utrain.q8np import install
            install(globals(), ('c7n', 'hvk'))
        except ImportError:
            pass
