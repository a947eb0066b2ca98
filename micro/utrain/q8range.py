# Activation ranges that follow training (issue 33), loaded by utrain.q8 only for a
# table with 'rr'.  A float model calibrated as int8 from its untrained weights
# (host_tools/prepare/fromfloat.py) grows its activations several times over while it
# trains (the digits CNN's 7-10x in 10 epochs); at the calibrated range they clip, and a
# clipped value passes no gradient: int8 training then lags float.  q8.json's 'rr' =
# [every, shift, [[producer, [consumers], [clamp bytes]], ...]] names the layers whose output
# range may double (the host checked they can: utrain.q8's FC / CONV_2D / DEPTHWISE_CONV_2D
# layers that train and MEANs above them, reached through pools only).  Every `every`
# samples (at a batch's end) the last sample's outputs of each producer are counted at
# the clamp bytes (a producer that keeps only a mask of its output, q8sparse, as its
# forward made the mask); more than 2^-shift of them there doubles that range: the producer's
# multipliers halve (shift - 1; the zero point stays: z = -128 - lo / s for the doubled
# lo and s), the consumers' input scale doubles (multipliers x 2) and their int32 biases
# (a MEAN has none) are quantized again at it.  The exponents go into checkpoints; trained.wof keeps the biases at the
# calibrated scales (x 2^k, exact) so that export reads it with the calibrated model,
# and trained.wof.q8s (JSON) names the exponents (load_weights, export --quantized).

MAXK = 8            # at most 2^8 times the calibrated range


def _ones(m, n):
    # the set bits among the first n of mask m (q8sparse.mkk's: lo < y < hi)
    c = 0
    for i in range(n >> 3):
        c += bin(m[i]).count('1')
    if n & 7:
        c += bin(m[n >> 3] & ((1 << (n & 7)) - 1)).count('1')
    return c


class Ranges:
    TAG = b'UTRR'       # its state in a checkpoint's tail (utrain.q8train: parts, put)

    def __init__(self, net, rr):
        self.net, self.every, self.sh, self.ent = net, rr[0], rr[1], rr[2]
        self.e = bytearray(len(self.ent))           # each range's exponent
        self.top = [[bytes([v]) for v in t[2]] for t in self.ent]

    def check(self):
        """Double the range of each producer whose last outputs clip (see above)."""
        e = self.e
        for j in range(len(e)):
            n = self.net.layers[self.ent[j][0]].nout
            if (self.clipped(j) << self.sh) > n and e[j] < MAXK:
                e[j] += 1
                self._scale(j, 1, 1)

    def clipped(self, j):
        """How many of range j's producer's last outputs are at its clamp bytes."""
        L = self.net.layers[self.ent[j][0]]
        y, n = L.y, L.nout
        if L.mk is not None:
            # its output is not kept (a mask only: q8sparse): the forward counted its top
            # clamp (rc); at a range clamped at both ends every output the mask stops is
            return n - _ones(L.mk, n) if len(self.top[j]) > 1 else L.rc
        c = 0
        for i in range(0, n, 256):
            b = bytes(y[i:min(n, i + 256)])
            for t in self.top[j]:
                c += b.count(t)
        return c

    def _scale(self, j, u, bias):
        # range j times 2^u (u 1 or -1); bias: the trained consumers' int32 biases quantized
        # again from their float biases (else they are already at the new scale: loaded)
        net = self.net
        p, cs = self.ent[j][0], self.ent[j][1]
        f = 2.0 if u > 0 else 0.5
        L = net.layers[p]
        L.d['sy'] *= f
        sh = L.shf
        for o in range(len(sh)):
            sh[o] -= u
        if p == len(net.layers) - 1:        # the logits: the loss's scale, softmax table
            net.sy *= f
            self._etab()
        for c in cs:
            C = net.layers[c]
            d = C.d
            bc = bias and C.b is not None       # (a MEAN: its multiplier alone)
            d['sx'] *= f
            sh = C.shf
            for o in range(len(sh)):
                sh[o] += u
            if bc and C.be is not None:     # (SGD's integer bias and its fraction)
                for o in range(len(C.b)):
                    C.rebias(o, u)
            elif bc and C.stale:
                # b stepped in integers, no float held (a per-tensor layer's): halved (ties
                # to even) or doubled in integers; from a float every odd b halved was a tie
                # that float32 on a board and float64 on the host broke apart
                b = C.b
                for o in range(len(b)):
                    v = b[o]
                    v = (v >> 1) + ((v & 3) == 3) if u > 0 else v + v
                    b[o] = -2147483647 if v < -2147483647 else 2147483647 if v > 2147483647 else v
            elif bc:
                sx, sw, b, bf = d['sx'], d['sw'], C.b, C.bf
                nw = len(sw)
                for o in range(len(b)):
                    q = int(round(bf[o] / (sx * sw[o % nw])))
                    b[o] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q

    def _etab(self):
        # scce's table at the logits' scale s 2^k: round(2^14 exp(-s 2^k d)) is the
        # calibrated table's entry 2^k d (exact: no exp on the board)
        k = self.e[[t[0] for t in self.ent].index(len(self.net.layers) - 1)]
        E, T = self.net.meta['etab'], self.net.etab
        if T is None:
            return
        for d in range(256):
            i = d << k
            T[d] = E[i] if i < len(E) else 0

    def parts(self):
        return [self.e]

    def nstate(self):
        return len(self.e)

    def put(self, want):
        """The exponents want (a checkpoint's), the biases already at their scales."""
        for j in range(len(self.e)):
            while self.e[j] != want[j]:
                u = 1 if want[j] > self.e[j] else -1
                self.e[j] += u
                self._scale(j, u, 0)

    def _of(self, c):
        # the exponent of consumer layer c's input range (0: none)
        for j in range(len(self.ent)):
            if c in self.ent[j][1]:
                return self.e[j]
        return 0

    def filed(self, i, b):
        """Layer i's int32 biases b as trained.wof keeps them: at the calibrated scale."""
        k = self._of(i)
        if not k:
            return b
        from array import array
        out = array('i', b)
        for o in range(len(b)):
            q = b[o] << k
            out[o] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q
        return out

    def save(self, path):
        """path.q8s: the exponents of the weights just saved at path (JSON)."""
        with open(path + '.q8s.tmp', 'w') as f:
            f.write('[%s]' % ','.join([str(v) for v in self.e]))
        from utrain.wof import _replace
        _replace(path + '.q8s.tmp', path + '.q8s')

    def loaded(self, path):
        """After Q8Net.load_weights(path): the exponents of path.q8s (none: 0), the
        biases brought from the calibrated scale to them."""
        want = bytes(len(self.e))
        from utrain.wof import exists
        if exists(path + '.q8s'):
            import json
            try:
                with open(path + '.q8s') as f:
                    v = bytes(json.load(f))
            except (ValueError, TypeError):
                v = None
            if v is None or len(v) != len(want):
                # (cut short or another run's: it had been taken as no doublings, the
                # biases then at other scales than the weights', unsaid)
                raise ValueError('%s.q8s: not the scales of %s (cut short, or another '
                                 "run's): copy both again (pull)" % (path, path))
            want = v
        self.put(want)
        ls = self.net.layers
        for i in range(len(ls)):
            k = self._of(i)
            L = ls[i]
            if k and L.b is not None:
                b, h = L.b, 1 << (k - 1)
                for o in range(len(b)):
                    b[o] = (b[o] + h) >> k
                if L.train:
                    L.set_bias()
