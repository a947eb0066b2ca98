# The board's choice of what an int8 model trains as int8 (prepare --select board),
# as utrain.fisher does for a float one: prepare's int8 contribution analysis tried a short
# list of configurations on a proxy dataset (their accuracy gain over the classifier
# alone) and wrote the layer table of their union (every candidate trains); here the
# int8 engine measures each candidate's Fisher potential per output channel on the
# board's own samples,
#   P_c = 1/(2N) sum_n (sum_d a_ndc g_ndc)^2    a: the layer's int8 output dequantized,
#                                               g: dL/da, the int32 gradient the int8
#                                               backward pass hands the layer
# (one forward and one backward pass a sample, no update: the net's trained layers are
# told not to train), and utrain.fpick.pick weighs each configuration's proxy gain by
# the candidates' potential here against the proxy's, which prepare measured with this
# code on the host.  The chosen configuration trains: utrain.q8keep restricts the
# union's table to it before the trainer's net is made.  Sums are integers, then Python
# floats in a fixed order: the host simulation and the board choose alike.
# run.py loads this module once, before the trainer, with its net (the union's table,
# each candidate's output in a buffer of its own: the arena reuses the space after its
# last forward reader), and drops both: gone before training allocates.
from array import array
from utrain import fpick
try:
    from micropython import const
except ImportError:
    def const(x):
        return x

_FULLY_CONNECTED = const(9)     # the op contract's (utrain/opc.py): a weighted op


class Row:
    # a (1, C) row of potentials as utrain.fpick reads one (p[0, c], shape)
    def __init__(self, n):
        self.v = array('d', [0.0 for _ in range(n)])
        self.shape = (1, n)

    def __getitem__(self, i):
        return self.v[i[1]]

    def __setitem__(self, i, x):
        self.v[i[1]] = x


class Shim:
    # the candidates as utrain.fpick reads a float net's: one op a layer of the table,
    # a trained layer's weights and bias its inputs (a weighted op's code), each
    # tensor's output channels its first axis
    def __init__(self, ls):
        self.ops, self.trainable, self.shape, self.rank = [], [], {}, {}
        for d in ls:
            if d.get('train'):
                ks = (d['wt'], d['bt'])
                self.ops.append((_FULLY_CONNECTED, ks, ()))
                self.trainable += ks
                self.shape[ks[0]] = self.shape[ks[1]] = (d['nb'], 1)
            else:
                self.ops.append((0, (), ()))


def scoring(meta):
    # the union's table for the pass: each candidate's output in a buffer of its own
    # (out of the arena's plan), read when the backward pass reaches the layer
    outs = [d['out'] for d in meta['layers'] if d.get('train')]
    meta['at'] = [a for a in meta.get('at', ()) if a[0] not in outs]
    return meta


def potentials(tr, ds, n, half=None):
    """{layer position: Row of its output channels' Fisher potentials} of the trained
    layers of Q8Trainer tr (made with keep=scoring) over n samples of dataset ds spread
    over the file; half gets the part from the odd samples (utrain.fpick.measured).
    The layers stop training (their gradient sums and updates)."""
    net = tr.net
    ls = net.layers
    P, at = {}, {}
    for i in range(len(ls)):
        L = ls[i]
        if L.train:
            L.train = 0
            at[L] = i
            P[i] = Row(len(L.b))
            if half is not None:
                half[i] = Row(len(L.b))
    back = net._back
    odd = [0]

    def hook(L, g, s, lr, need):
        i = at.get(L)
        if i is not None:
            _add(L, g, s, net.bc, P[i].v, half[i].v if odd[0] and half is not None else None)
        return back(L, g, s, lr, need)
    net._back = hook
    n = max(1, min(n, ds.n))
    for j in range(n):
        odd[0] = j & 1
        net.accum(tr.x, tr._read(ds, j * ds.n // n))
    for i in P:
        for r in (P[i], half[i] if half is not None else None):
            if r is not None:
                v = r.v
                for c in range(len(v)):
                    v[c] = v[c] * (0.5 / n)
    return P


def _add(L, g, s, p, v, h):
    # the potentials v (and h) of layer L's channels += (sum over its positions of a g)^2:
    # y int8 with zero point zy and scale sy, g int32 with scale s (p: one row of p
    # values every position reads, a MEAN's gradient broadcast)
    y, z, n, oc = L.y, L.zy, L.nout, len(v)
    f = L.d['sy'] * s
    for c in range(oc):
        t = 0
        if p:
            for i in range(c, n, oc):
                t += (y[i] ^ 128) - 128
            t = (t - z * (n // oc)) * g[c]
        else:
            for i in range(c, n, oc):
                t += ((y[i] ^ 128) - 128 - z) * g[i]
        x = t * f
        x = x * x
        v[c] += x
        if h is not None:
            h[c] += x


def measure(model, weights, data, n, cfg, half=None):
    """(potentials(), the layer table, the samples scored) of the union's table model
    (q8.json) with weights on n samples of the dataset file data (cfg: the training
    settings; the pass is SGD at batch 1: no batch sums)."""
    from utrain.q8train import Q8Trainer
    from utrain.data import Dataset
    c = dict(cfg)
    c.update(optimizer='sgd', batch=1, momentum=0.0)
    tr = Q8Trainer(model, weights, keep=scoring, **c)
    ds = Dataset(data, False)
    try:
        return potentials(tr, ds, n, half), tr.net.meta['layers'], min(n, ds.n)
    finally:
        ds.close()
        tr.net.close()


def select(model, weights, data, sel, cfg, log=print):
    """The board's choice: {layer position: None (whole), [lo, hi] (a window of its
    output channels), [0, 0] (its bias alone)} of the configuration
    utrain.fpick.pick weighs best (sel: train.json's select block)."""
    if not sel.get('configs'):
        raise ValueError('train.json: select: an int8 run chooses among the configurations '
                         'prepare --select board writes (configs): prepare again')
    n = int(sel.get('samples', 16))
    half = {} if n > 1 else None
    P, ls, m = measure(model, weights, data, n, cfg, half)
    net = Shim(ls)
    keep, lines = fpick.pick(net, P, sel['configs'], sel.get('proxy', ()), fpick.board_heap(),
                              half if m > 1 else None, Row)
    log('board selection (Fisher potential on %d samples, int8; op N: layer N of %s, '
        'prepare.json select.graph_ops gives its op):' % (m, model))
    for line in lines:
        log(line)
    out = {}
    for i in range(len(ls)):
        d = ls[i]
        if not d.get('train'):
            continue
        if d['wt'] in keep:
            w = keep[d['wt']]
            out[i] = None if w is None else [w[1], w[2]]
        elif d['bt'] in keep:
            out[i] = [0, 0]
    return out


def choose_on(model, weights, data, sel, cfg, log=print):
    """run.py's call: the choice, made on a net of its own (garbage when it returns);
    utrain.fpick's code goes with this module's (run.aux drops this one)."""
    try:
        return select(model, weights, data, sel, cfg, log)
    finally:
        from utrain.run import drop
        drop('fpick')
