# utrain.q8train's and utrain.q8's one-time set-up once the net is loaded, imported for
# it and dropped after (code is heap on a board, and none of this runs again): the
# trainer's (Q8Trainer()'s end), the optimizer's state (Q8Net.setup: Adam's, momentum's,
# a batch's sums) and a start from trained weights (Q8Net.load_weights: "start": "best",
# a kept best's restore).  Loaded after utrain.q8load is dropped and dropped before the
# first sample, it is in neither the load's code nor training's
# (host_tools/plan/memory.py: Q8_SETUP).
from array import array


def trainer(tr, weights):
    """Q8Trainer tr's set-up once its net is loaded (Q8Trainer.__init__): a loss on float
    targets, the net's optimizer state, a start from trained weights, the counters."""
    c = tr.cfg
    meta = tr.net.meta
    if c['loss'] != 'scce':     # (cce, mse, mae, bce: float targets)
        from utrain.q8reg import use
        use(tr)
    # the net's load garbage (json's, the layers') collected before the trained
    # layers' batch / Adam / momentum arrays: else they go beyond it (hr_rescnn_int8)
    import gc
    gc.collect()
    tr.net.setup(c['optimizer'], int(c['batch']), c['beta1'], c['beta2'], c['eps'],
                 c['momentum'])
    if 'base' in c:     # ("start": "best": utrain.config)
        tr.net.load_weights(weights)
    tr.epoch = tr.pos = tr.retries = tr.pending = 0
    tr.sums = (0.0, 0.0)
    tr.lr_scale = 1.0
    tr.best = None
    tr.good = None          # the checkpoint last saved or loaded
    # Ctrl-C exactness (run.py, utrain.once): commit = (pos, sums) at the last whole
    # batch; dirty while weights change
    tr.commit, tr.dirty, tr.last = (0, (0.0, 0.0)), False, None
    tr.ds = None     # the dataset _read last checked
    tr.ncls = meta['nclass']
    tr.y = None if c['loss'] == 'scce' else [0.0] * tr.ncls


def setup(net, optimizer, batch, beta1, beta2, eps, momentum, q8g):
    """Optimizer and batch: sgd at batch 1 updates each layer as its gradient is done
    (step); otherwise accum sums gradients and apply updates.  Adam's float32 master
    weights and moments (3 floats per trained weight and bias) and SGD momentum's
    velocities (an int16 per trained weight in 1/256 weight steps, utrain.q8mom; an
    int32 or a float per bias) are made here; only a rank's window of weights has them.
    q8g: utrain.q8's globals."""
    MEAN, qmul, _i32, _f32 = [q8g[k] for k in ('MEAN', 'qmul', '_i32', '_f32')]
    net.adam = optimizer == 'adam'
    net.B = None           # Adam or a batch > 1: their updates (utrain.q8batch)
    if net.adam or batch > 1:
        from utrain import q8batch
        net.B = q8batch
    net.b1, net.b2, net.eps = beta1, beta2, eps
    net.nstep = 0
    net.mom = 0.0 if net.adam else momentum
    if net.mom:
        from utrain import q8mom as M
        net.M = M
        M.setup(net, batch, qmul, _i32)    # (mum, mus, vmp: mu's multiplier, vmk's mu and seed)
    for L in net.layers:
        if L.train or L.xo:
            w0, w1 = L.wr()
            n, oc = w1 - w0, len(L.b)
            # SGD at batch 1 with per-channel scales (q8.json 'bh'): the int32 bias
            # steps in integers, an int8 fraction a bias (1/256 steps) instead of a
            # float bias (_ibias), momentum's bias velocities int32 (1/256 bias
            # steps); the others step a float bias
            ib = 'bh' in L.d and not net.adam and batch == 1
            d = L.d
            if d.get('fs'):     # its float weight scales, in q8.req
                if ib and (net.mom or d.get('ns')) and L.whi <= L.wlo and L.k < MEAN and not (
                        d.get('gw') or net.meta.get('rr')):
                    # its bias alone trains, stepped in integers (_ibias): no step reads
                    # them; dropped with momentum (a MobileNetV2's four bias-only layers:
                    # 7 KB, the bias velocities' room) or where prepare asks ('ns': the
                    # plan over its limit); not where its scales grow (q8grow) or ranges
                    # follow training (q8range)
                    d.pop('sw', None)
                elif 'sw' not in d:     # (dropped by the net's own setup(): read again)
                    d['sw'] = net._req(d, _f32(d['nq']), 2)
            # an alias of a shared weight (sa; and bias, sb: utrain.q8share) reads its
            # owner's state, linked once every layer's is made: none of its own (an
            # unrolled GRU's 8 aliases' Adam arrays, 59 KB held through setup, 32-bit)
            sa, sb = L.sa, L.sb
            if net.mom:
                L.vw = None if sa else M.vel(L, n)  # (made with the net: zeros; none: 'nv')
                L.vb = None if sb or L.d.get('nbv') else (_i32 if ib else _f32)(oc)
            # SGD: an int8 fraction (1/256 steps) per trained weight where the table
            # asks for one (quant.py: convolutions; every layer of a float model
            # trained as int8), the update exact, no rounding noise (q8kern.upek)
            L.wf = (L.wf if L.wf is not None and len(L.wf) == n else bytearray(n)) if (
                n and not net.adam and L.d.get('wf') and not sa) else None
            L.be = (L.be or bytearray(oc)) if ib else None
            if L.be is None and L.bf is None:
                L.set_bias()
            if optimizer == 'sgd' and batch == 1 and not (net.mom and L.xo > 1):
                continue
            if not sa and (L.ga is None or len(L.ga) != n):
                L.ga = _i32(n)      # (a shared weight's: made with the net)
            if not sb:
                L.ba = _f32(oc)
            if net.B and not sa:
                L.gk = array('i', [0, 0])
            if net.adam and not sa and (getattr(L, 'wm', None) is None or len(L.wm) != n):
                L.wm, L.am, L.av = _f32(n), _f32(n), _f32(n)
            if net.adam and not sb:
                L.bm, L.bv = _f32(oc), _f32(oc)
    for L in net.layers:
        # Adam's masters filled once every layer's arrays are made: the fill's boxed
        # floats (garbage) between them cut the heap up (hr_rescnn_int8, 32-bit)
        if net.adam and (L.train or L.xo):
            L.set_bias()
    for x in net.ext:      # (q8share, q8tcv, q8emb)
        if hasattr(x, 'setup'):
            x.setup(batch)


def load_weights(net, path, q8g):
    """The int8 weights and int32 biases a .wof holds (all of weights.wof's layers, or
    trained.wof's trained ones); float copies follow.  q8g: utrain.q8's globals."""
    _i32 = q8g['_i32']
    from utrain import wof
    nb = [None] * net.meta['ntensors']
    ws = [L for L in net.layers if 'wt' in L.d]
    for L in ws:
        nb[L.d['wt']], nb[L.d['bt']] = L.d['wn'], 4 * L.d['nb']
    with wof.openr(path) as f:
        offs = wof.read_table(f, path, nb, nb)[0]
        for L in ws:
            if offs[L.d['wt']] and L.w is not None:
                f.seek(offs[L.d['wt']] + L.wo)
                f.readinto(L.w)
            if offs[L.d['bt']]:
                f.seek(offs[L.d['bt']])
                L.b = _i32(0, f.read(4 * L.d['nb']))
            if L.train:
                L.set_bias()
    for x in net.ext:      # (its biases and weights at the scales path's files name)
        x.loaded(path)
    from utrain import drop
    drop('wof')
