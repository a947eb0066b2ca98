# GATHER of an int8 table's rows by the model's ids (a Keras Embedding in an int8 file:
# CAST, Keras 3's negative-id SELECT_V2 and GATHER, folded by the host), utrain.q8 layer
# kind EMB, loaded only by a table that has one.  Forward: TFLite Micro's GATHER, a plain
# copy of int8 rows (the output at the table's scale and zero point).  The ids reach the
# board exactly: the sample holds 'ib' bytes an id (1: ids 0..255, 2: 0..65535, low byte
# first), each byte stored as an int8 at scale 1 and zero point -128 (its raw byte ^ 128:
# the id's byte); negative ids were made row + N by prepare (Keras's wrap).  'et': the
# table tensor, 'en' its rows, 'ed' bytes a row.  An id that is not a row stops the run
# naming the table and the id.
# A frozen table stays in the .wof: each id's row is read into the output.  A table that
# trains ('eg') is held in RAM (L.tt) and is an FC's weights to utrain.q8 (Layer.xo:
# rows of 'ed' weights at one scale 'es', no bias).  SGD at batch 1: its used rows step in
# place by QAS, w_q -= lr dL/dW / s_W, made in 1/65536 steps (rqk), rounded to 1/256
# with a dither, then stochastically (Q8Net._upd, as an FC's weights; clamped to +-127);
# dL/dW of a row is the sum of the gradients at the positions that read it (a
# scatter-add: a row read twice steps twice).  Adam, a batch > 1 and momentum: the rows'
# steps go into the table's sums (Q8Net.setup's L.ga) and the FC's
# updates apply them to every row (utrain.q8batch: Adam's float32 masters and moments, a
# batch's SGD; momentum at batch 1: each sample's, through every row's int16 velocity,
# Q8Net._upd).  Adam is lazy (TensorFlow Addons' LazyAdam, PyTorch's SparseAdam): a
# step moves the rows the batch read alone, their moments too (a row no sample reads
# keeps its moments and does not coast on them as dense Adam's does), at the step's
# bias correction: a step costs the rows read, not the table (600 x 16: 4-6x fewer ms a
# sample on 64-bit unix MicroPython).  It is among utrain.q8's ext state: checkpoints (with that optimizer state),
# trained.wof.q8e (export).
from array import array
from utrain import q8kern as K



def fwd(L, net, t):
    d = L.d
    x, y, w, ids = t[L.ins[0]], L.y, L.tt, L.dg
    n, r, ib = d['en'], d['ed'], d['ib']
    off = net.woff[d['et']]
    my = memoryview(y)
    for j in range(len(y) // r):
        i = (x[j * ib] & 255) ^ 128
        if ib > 1:
            i |= ((x[j * ib + 1] & 255) ^ 128) << 8
        if i >= n:
            raise ValueError('GATHER of table tensor %d: id %d is not a row of its %d (0..%d); '
                             'give the model ids in that range' % (d['et'], i, n, n - 1))
        if w is None:
            net._read(off + i * r, my[j * r:], r)
        else:
            my[j * r:j * r + r] = memoryview(w)[i * r:i * r + r]
            ids[j] = i
    return y


def back(L, net, g, s):
    """The table's update from g, its output's gradient (int32, scale s): each used row
    by lr g s / s_W weight steps (SGD at batch 1), else the rows' steps added to the
    batch's sums L.ga (q8batch.unit's: the int8 FC's Adam / batch update, utrain.q8batch;
    at batch 1 with momentum in 1/256 steps, applied with every velocity at the sample's
    end, as an FC's: Q8Net._upd); no gradient below (the ids are data)."""
    d = L.d
    if L.tt is not None:
        r, u, ga, lr, gk, P = d['ed'], L.dx, L.ga, net.lr, L.gk, len(L.dg)
        h = -1
        if gk is None:
            # SGD at batch 1, or momentum's sums: dL/dW / s_W = g c weight steps, in
            # 1/65536 steps where they stay within 2^30 (Q8Net._fits; momentum's: a row's
            # P positions' sum) and rounded to 1/256 with a dither (Q8Net._dith): to 1/256
            # (truncated), an update under 1/256 step was 0, each step (issue 28)
            c = lr * s / d['es']
            if c and net._fits(g, L.nout, 64.0 / (c if ga is None else c * P)):
                h = net._dith()
            L.um[0], L.us[0] = L.qm(c * (65536.0 if h >= 0 else 256.0))
            e = L.us[0]
            if h < 0 and e > 0:     # (g << e within 32 bits: a step of 2^23 weight
                c = 2147483647 >> e     # steps is past any)
                for j in range(L.nout):
                    v = g[j]
                    if v > c or v < -c:
                        g[j] = c if v > 0 else -c
        for j in range(P):
            o = j * r
            if gk is None:
                K.rqk(memoryview(g)[o:] if o else g, r, 1, r, L.um, L.us, u, 0, 0, 0, 1)
            else:
                for q in range(r):
                    v = g[o + q]
                    u[q] = -0x3fffffff if v < -0x3fffffff else 0x3fffffff if v > 0x3fffffff else v
            k = L.dg[j]
            i = k * r
            if gk is not None:      # (dL/dW = g s, into its sums' unit, q8batch.unit)
                z = L.lz
                if z is not None:   # (Adam: the batch's rows, once each; its first sample
                    if not gk[1]:   # drops a dropped batch's)
                        net.B.rows(L)
                    if not z[k >> 3] >> (k & 7) & 1:
                        z[k >> 3] |= 1 << (k & 7)
                        L.lq[L.ln] = k
                        L.ln += 1
                net.B.unit(L, u, r, k, 1, r, s, L.qm)
            if ga is None:
                net._upd(L, i, u, r, h)
            else:
                K.adk(memoryview(ga)[i:], u, r)
        if ga is not None and lr is not None:
            net._upd(L, 0, ga, len(ga), h)
            K.zk(ga, len(ga))
    return None, s


def ext(net, i32, qmul):
    # (Q8Net: the tables that train, among its ext state; i32, qmul: utrain.q8's)
    ls = [L for L in net.layers if L.d.get('eg')]
    if ls:
        net.ext.append(Train(net, ls, i32, qmul))


class Train:
    """The tables of the EMB layers whose 'eg' is set, trained as int8: each an FC's
    weights to Q8Net.setup (xo: rows of 'ed' weights, one scale 'es', no bias), whose
    optimizer state (Adam's float32 masters and moments, momentum's int16 velocities, a
    batch's sums: the whole table's) and updates (utrain.q8batch, Q8Net._upd) it takes."""
    TAG = b'UTEM'

    def __init__(self, net, ls, i32, qmul):
        self.net, self.ls = net, ls
        for L in ls:
            d = L.d
            L.tt = L.w = net._read(net.woff[d['et']], bytearray(d['en'] * d['ed']))
            L.dg = array('H', bytes(2 * (L.nout // d['ed'])))    # the ids of the sample
            L.dx = array('i', bytes(4 * d['ed']))                 # a row's 1/256 steps
            g = (d['en'], d['ed'], d['ed'])
            L.geo = lambda g=g: g   # noqa: E731  (Layer.wr's, set_bias's)
            L.row = lambda r=g[1]: r    # noqa: E731  (Layer.w0 / nw's, the update's)
            L.xo, L.b, L.whi, L.um, L.us = 2, i32(0), d['en'], i32(1), i32(1)
            L.blo = L.bhi = 0
            L.qm = qmul         # (Adam's sums: q8batch.unit's)
            d['sw'], d['sx'] = [d['es']], 1.0     # (its one scale, as an FC's 'sw'; no bias)

    def setup(self, batch):
        # (Q8Net.setup's: the optimizer state's keeper, utrain.q8batch's xs; Adam's
        # rows a batch read, lz a bit a row, lq their list: q8batch._adam steps those)
        self.B = None
        if any([L.ga is not None or L.vw is not None for L in self.ls]):
            from utrain import q8batch
            self.B = q8batch
        for L in self.ls:
            n = L.d['en']
            L.lz = bytearray((n + 7) >> 3) if self.net.adam else None
            L.lq = array('H', bytes(2 * min(n, batch * len(L.dg)))) if self.net.adam else None
            L.ln = 0

    def parts(self):
        out = []
        for L in self.ls:
            out += [L.tt] + (self.B.xs(L) if self.B else [])
        return out

    def nstate(self):
        return sum([len(p) * (1 if type(p) is bytearray else 4) for p in self.parts()])

    def put(self, s):
        o = 0
        for L in self.ls:
            n = len(L.tt)
            L.tt[:] = s[o:o + n]
            o += n
            if self.B:
                o = self.B.xput(L, s, o)

    def save(self, path):
        """path.q8e: the trained tables: b'UTEM', then per table u32 its tensor, u32 its
        bytes, the int8 bytes."""
        K.side_save(path + '.q8e', self.TAG, [(L.d['et'], L.tt) for L in self.ls])

    def loaded(self, path):
        """After Q8Net.load_weights(path): the tables of path.q8e (none: weights.wof's)."""
        got = K.side_load(path + '.q8e', self.TAG, {L.d['et']: len(L.tt) for L in self.ls})
        net = self.net
        for L in self.ls:
            w = got.get(L.d['et'])
            if w:
                L.tt[:] = w
            else:
                net._read(net.woff[L.d['et']], L.tt)
            if getattr(L, 'wm', None) is not None:
                L.set_bias()        # (Adam's masters: the table's)
