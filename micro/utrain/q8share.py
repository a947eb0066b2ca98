# Weight tensors several trained layers read (q8.json 'sh': the index of the first of
# them, the owner): Keras's TimeDistributed(Dense) steps, an unrolled SimpleRNN / GRU /
# LSTM's steps, both directions' cells of a Bidirectional layer.  One int8 tensor, one
# scale, one update a step: each use's weight gradient goes into the owner's int32 sums
# (as a batch's: Q8Net._wgrad with lr None, in q8batch.unit's) and its bias's into float
# sums; at SGD batch 1 the update is applied once the backward pass has made every use's
# (apply: the input gradients of all uses read the weights the forward pass read), at a
# batch > 1 and under Adam by utrain.q8batch at the batch's end, the owner's alone.
# Loaded by utrain.q8 only for a table with one; kept among its ext state (its links are
# made again after a checkpoint or a .wof is read).
from utrain import q8kern as K
from utrain import q8batch
from array import array

# the weight state an alias reads from its owner, and the bias state where the bias
# tensor is shared too
_W = ('w', 'ga', 'gk', 'vw', 'wf', 'wm', 'am', 'av')
_B = ('b', 'bf', 'ba', 'vb', 'bm', 'bv', 'be')


class Share:
    TAG = b'UTSH'       # (no state of its own in a checkpoint's tail: the owner's is)

    unit = staticmethod(q8batch.unit)   # (Q8Net._wgrad's at SGD batch 1: the sums' unit)

    def __init__(self, net, qmul, i32, f32):
        # (qmul, _i32, _f32: utrain.q8's, which imports this: no import circle)
        self.net, self.qmul, self.i32, self.f32 = net, qmul, i32, f32
        ls = net.layers
        gs = {}
        for i in range(len(ls)):
            L = ls[i]
            j = L.d.get('sh')
            if j is not None:
                gs.setdefault(j, []).append(L)
                L.sh = self
        self.gs = [gs[j] for j in sorted(gs)]        # (owner first: the lowest index)
        for g in self.gs:
            for L in g[1:]:
                L.sa = 1
                if L.d['bt'] == g[0].d['bt']:
                    L.sb = 1
        self.one = 0

    def setup(self, batch):
        """After Q8Net.setup: at SGD batch 1 the uses sum into the owner's int32 sums and
        float bias sums (a float bias: no integer bias step), applied at the step's end."""
        net = self.net
        self.one = one = not net.adam and batch == 1
        f32 = self.f32
        for g in self.gs:
            O = g[0]
            if one:
                n = len(O.w)
                if O.ga is None or len(O.ga) != n:
                    O.ga = self.i32(n)
                if O.gk is None:
                    O.gk = array('i', [0, 0])
            for L in g:
                if one:
                    oc = len(L.b)
                    L.be = None
                    if getattr(L, 'ba', None) is None or len(L.ba) != oc:
                        L.ba = f32(oc)
                    if net.mom:
                        L.vb = f32(oc)
                    L.set_bias()
        self.link()

    def link(self):
        # every alias reads its owner's weight state (and bias state: a shared bias)
        for g in self.gs:
            O = g[0]
            for L in g[1:]:
                for k in _W:
                    setattr(L, k, getattr(O, k, None))
                if L.sb:
                    for k in _B:
                        setattr(L, k, getattr(O, k, None))

    def step(self, lr):
        """SGD batch 1: the summed gradients applied, once for each weight and bias."""
        net = self.net
        for g in self.gs:
            for L in g:
                q8batch.upd(net, L, lr, 1.0, self.qmul)
            for L in g:
                if not L.sa:
                    K.zk(L.ga, len(L.ga))
                    L.gk[1] = 0
                if not L.sb:
                    ba = L.ba
                    for o in range(len(ba)):
                        ba[o] = 0.0

    # ext state (utrain.q8train checkpoints, Q8Net.load_weights): the owner's is saved;
    # after a load the aliases read the owner's new buffers
    def parts(self):
        return []

    def nstate(self):
        return 0

    def put(self, s):
        self.link()

    def save(self, path):
        pass

    def loaded(self, path):
        self.link()
