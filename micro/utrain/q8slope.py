# The slopes alpha of PRELU layers that train (q8.json 'ta': a layer below them trains;
# utrain.q8bin runs the layer, q8bin.back hands its gradient here first), loaded by utrain.q8
# only for a table with one: utrain.q8 keeps it among its ext state (checkpoints,
# trained.wof.q8a, which export reads: host_tools/prepare/quant.py sloped).
from array import array
from math import sqrt
from utrain import q8kern as K
from utrain.q8bin import bgk, tables


class Slopes:
    """The slopes alpha of the PRELU layers whose 'ta' is set (a layer below trains;
    q8.json 'ts': [s_x, s_alpha]), trained as int8 (utrain.q8 keeps it among its ext
    state: checkpoints, trained.wof.q8a).  dL/dalpha = sum of g x over the outputs that
    read each slope where x < 0 (bgk, f & 512), a unit s 2^sh s_x.  SGD at batch 1 moves
    the int8 alpha by lr dL/dalpha / s_alpha steps, stochastically rounded (rqk, upk: no
    float a slope); Adam and batches > 1 keep a float32 master of alpha and its sums
    (apply, from utrain.q8batch), alpha the master requantized."""
    TAG = b'UTPA'

    def __init__(self, net, qmul, f32):
        self.net, self.qmul, self.f32 = net, qmul, f32      # (utrain.q8's: no import circle)
        self.ls = [L for L in net.layers if 'ta' in L.d]
        self.q = array('i', [0, 0])
        for L in self.ls:
            tables(L)
            L.ag = array('i', range(len(L.kc)))
            L.ma = None

    def _ready(self):
        # (Adam, batch > 1: net.B) each layer's float32 master from its int8 slopes, their
        # sums and moments, made once the optimizer is known (Q8Net.setup)
        for L in self.ls:
            if self.net.B is None:
                L.ma = None
            elif L.ma is None:
                self._mk(L)

    def _mk(self, L):
        n, net = len(L.kc), self.net
        L.ma, L.af = array('f', range(n)), array('f', range(n))
        L.m1 = array('f', range(n)) if net.adam else None
        L.m2 = array('f', range(n)) if net.adam else None
        self._master(L)

    def _master(self, L):
        sa, za = L.d['ts'][1], L.d['zi'][1]
        for j in range(len(L.kc)):
            L.ma[j] = sa * (((L.kc[j] ^ 128) - 128) - za)
            L.af[j] = 0.0
            if L.m1 is not None:
                L.m1[j] = L.m2[j] = 0.0

    def grad(self, L, g, s, nb):
        """L's slopes' gradient from g (its output's, scale s; |g| < 2^nb): applied at
        SGD batch 1, else added to the batch's sums."""
        net, a, n = self.net, L.ag, len(L.kc)
        d = L.d
        K.zk(a, n)
        sh = nb + 8 + d['lb'][1] - 30
        sh = sh if sh > 0 else 0
        bgk(a, g, L.bg, 1, L.x, L.zx, sh, 517, L.y, L.lo, L.hi, L.bg, L.x2)
        u = s * (1 << sh) * d['ts'][0]         # (a's unit: dL/dalpha)
        if net.B is None:
            q = self.q
            q[0], q[1] = self.qmul(net.lr * u * 256.0 / d['ts'][1])
            K.rqk(a, n, 1, n, q, memoryview(q)[1:], a, 0, 0, 0, 1)
            net.seed = K.upk(L.kc, a, n, net.seed)
            return
        self._ready()
        f = L.af
        for j in range(n):
            f[j] += a[j] * u

    def apply(self, lr, scale):
        """The batch's update (lr: Adam's bias-corrected, as utrain.q8batch's), then the
        int8 slopes from the master."""
        net = self.net
        for L in self.ls:
            if L.ma is None:
                continue
            m, f, m1, m2 = L.ma, L.af, L.m1, L.m2
            sa, za = L.d['ts'][1], L.d['zi'][1]
            for j in range(len(m)):
                v = f[j] * scale
                f[j] = 0.0
                if m1 is not None:
                    m1[j] = net.b1 * m1[j] + (1.0 - net.b1) * v
                    m2[j] = net.b2 * m2[j] + (1.0 - net.b2) * v * v
                    v = m1[j] / (sqrt(m2[j]) + net.eps)
                m[j] -= lr * v
                q = int(round(m[j] / sa)) + za
                L.kc[j] = (-128 if q < -128 else 127 if q > 127 else q) & 255

    def parts(self):
        self._ready()
        out = []
        for L in self.ls:
            out.append(L.kc)
            if L.ma is not None:
                out += [x for x in (L.ma, L.m1, L.m2) if x is not None]
        return out

    def nstate(self):
        return sum([len(x) * (1 if type(x) is bytearray else 4) for x in self.parts()])

    def put(self, s):
        """The state s (a checkpoint's, parts' bytes) back; the batch's sums zeroed."""
        self._ready()
        o = 0
        for L in self.ls:
            n = len(L.kc)
            L.kc[:] = s[o:o + n]
            o += n
            if L.ma is not None:
                for x in (L.ma, L.m1, L.m2):
                    if x is not None:
                        x[:] = self.f32(0, s[o:o + 4 * n])
                        o += 4 * n
                for j in range(n):
                    L.af[j] = 0.0

    def save(self, path):
        """path.q8a: the slopes of the weights just saved at path: b'UTPA', then per
        layer u32 its alpha tensor, u32 its values, a byte each (int8)."""
        K.side_save(path + '.q8a', self.TAG, [(L.ins[1], L.kc) for L in self.ls])

    def loaded(self, path):
        """After Q8Net.load_weights(path): the slopes of path.q8a (none: q8.json's)."""
        got = K.side_load(path + '.q8a', self.TAG, {L.ins[1]: len(L.kc) for L in self.ls})
        for L in self.ls:
            L.kc[:] = got.get(L.ins[1]) or bytes([q & 255 for q in L.d['kc']])
            if L.ma is not None:
                self._master(L)
