# The board chooses what trains from its own data (prepare --select board), as TinyTrain
# does.  prepare made every candidate layer trainable, each at the largest channel
# ratio the budget allows for the whole set; here a few samples give each candidate's
# output channels their Fisher potential
#   P_c = 1/(2N) sum_n (sum_d a_ndc * g_ndc)^2    a: the layer's output, g: dL/da
# (one forward and one backward pass a sample; no weight gradient, no update).  A layer
# scores s = P / ((params / max params) * (MACs / max MACs)), P = sum_c P_c; the
# classifier trains, and of the layers whose P is at least `share` of the classifier's
# the `layers` best by score, each on the window of channels (its prepared width) with
# the largest potential; the others are frozen.
# With priors (prepare --select board given --data: a proxy dataset), prepare tried a
# short list of configurations on the proxy (their accuracy gain over the classifier
# alone) and measured each candidate's share of the classifier's potential there; the
# board weighs each configuration's gain by how much more (or less) potential its layers
# have on the board's own data than on the proxy, and trains the best (of those within
# TIE of it the first the host lists, as prepare's --select auto orders them), each part of a layer on the channels
# the host measured unless the board's data puts more than NOISE times their potential
# in another window than the proxy had there (on each half of its samples, the window
# chosen on the other half): utrain.fpick, which an int8 run's choice (utrain.q8fish)
# shares.  A candidate with no finite, positive potential is refused (said).  The choice
# goes into the checkpoint (utrain/chosen.py), so a resumed run trains the same set.
# run.py loads this module once, before the Trainer, on a net of its own (choose_on),
# and drops it and fpick: their code and arrays are gone before training allocates.
try:
    from micropython import const
except ImportError:
    def const(x):
        return x
from utrain.fpick import (WEIGHTED, candidates, classifier, refused, window, pick,  # noqa: F401
                          measured, board_heap, _total)

# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_DW = const(2)
_DB = const(4)
_DX_ANY = const(~(_DW | _DB))   # data-input gradient bits (DW, DB are the parameters')


def potentials(net, ds, n, cfg, half=None):
    """{op index: (1, C) Fisher potentials of its output channels} over n samples of
    ds (spread over the file); cfg: the training settings (loss).  half: a dict that
    gets {op index: the part of those potentials from the odd samples} (measured())."""
    from utrain.losses import loss
    from utrain.xnp import np, zeros
    cands = candidates(net)
    outs = {}
    P = {}
    for i, _ in cands:
        o = net.ops[i][2][0]
        outs[o] = i
        P[i] = zeros((1, net.shape[o][1]))
        if half is not None:
            half[i] = zeros((1, net.shape[o][1]))
    ys = (1, 1) if cfg['loss'] == 'scce' else net.shape[net.outputs[0]]
    ds.check(net.shape[net.inputs[0]], ys)
    x, y = zeros(net.shape[net.inputs[0]]), zeros(ys)
    free = net.free_train
    net.free_train = [[k for k in f if k not in outs] for f in free]
    n = max(1, min(n, ds.n))
    st = net.stream
    try:
        for j in range(n):
            ds.read(j * ds.n // n, x, y)
            net.set_input(x)
            net.forward(True)
            g = net.g
            g[net.sk] = loss(cfg['loss'], net.output(), y, cfg['from_logits'],
                             net.fuse_head(cfg['loss'], cfg['from_logits']))[1]
            # every op of the backward list runs, as Net.backward runs it (its weight
            # gradients off): flags 0 may still pass a gradient (an ADD's second
            # input goes by net.gin: a residual whose skip branch is frozen), and a
            # SPLIT runs when any of its outputs has one
            for oi, fl in net.bwd[net.head:]:
                op = net.ops[oi]
                outs = op[2]
                d = g.pop(outs[0], None)
                if d is None and not (len(outs) > 1 and any(k in g for k in outs)):
                    continue
                if oi in P and d is not None:
                    a = net.t[outs[0]]
                    s = np.sum(a * d, axis=0)
                    s = s.reshape((1, s.shape[0])) if len(s.shape) == 1 else s
                    s = s * s
                    p = P[oi]
                    p += s
                    if j & 1 and half is not None:
                        p = half[oi]
                        p += s
                if st:
                    st.fetch(oi)
                net.mods[oi].backward(net, op, d, fl & _DX_ANY)
                if st:
                    st.drop(oi)
            g.clear()
    finally:
        net.free_train = free
        for k in outs:
            net.t[k] = None
    for i in P:     # (no *=: the fallback's arrays would be rebound, not scaled)
        P[i] = P[i] * (0.5 / n)
        if half is not None:
            half[i] = half[i] * (0.5 / n)
    return P


def choose(net, P, layers, share=0.0):
    """{tensor: (axis, lo, hi) or None (whole)} of the tensors that train, and the
    log lines saying why."""
    no = refused(net, P)
    cands = [c for c in candidates(net) if c[0] not in no]
    size = lambda k: net.shape[k][0] * net.shape[k][1]     # noqa: E731
    info = []
    cls = None
    for i, ks in cands:
        params = sum(size(k) for k in ks)
        macs = max(size(k) for k in ks) * net.shape[net.ops[i][2][0]][0]
        pot = _total(P[i])
        info.append([i, ks, params, macs, pot])
        if net.ops[i][0] in WEIGHTED:
            cls = i
    pmax = max(c[2] for c in info)
    mmax = max(c[3] for c in info)
    for c in info:
        c.append(c[4] / ((c[2] / pmax) * (c[3] / mmax)))
    # worth training: a potential at least `share` of the classifier's; the best
    # `layers` of those by score
    top = share * [c[4] for c in info if c[0] == cls][0]
    others = sorted([c for c in info if c[0] != cls], key=lambda c: (c[4] < top, -c[5]))
    layers = min(layers, len([c for c in others if c[4] >= top]))
    chosen = [c for c in info if c[0] == cls] + others[:layers]
    keep = {}
    lines = []
    for i, ks, params, macs, pot, s in chosen:
        p = P[i]
        win = None
        for k in ks:
            r = net.rank.get(k)
            if r:
                w = r[2] - r[1]
                if win is None:     # the window of w channels with the most potential
                    win = window(p, w)
                keep[k] = (r[0], win[0], win[1])
            else:
                keep[k] = None
        lines.append('op %d: potential %.3g, %d params, %d MACs, score %.3g -> trains %s'
                     % (i, pot, params, macs, s, 'channels %d:%d' % win if win else 'whole'))
    for i, ks, params, macs, pot, s in others[layers:]:
        lines.append('op %d: potential %.3g, %d params, %d MACs, score %.3g -> frozen'
                     % (i, pot, params, macs, s))
    for i in no:
        lines.append('op %d: %s' % (i, no[i]))
    return keep, lines


def select(net, data, sel, cfg, log=print):
    """The board's choice on a loaded net (Trainer(keep=) calls it before any optimizer
    state exists): its candidates scored on sel['samples'] samples of the dataset
    file data; the classifier and up to sel['layers'] others (potential at least
    sel['share'] of the classifier's) train.  Returns keep for restrict()."""
    from utrain.data import Dataset
    ds = Dataset(data)
    n = int(sel.get('samples', 16))
    half = {} if n > 1 and sel.get('configs') else None
    try:
        P = potentials(net, ds, n, cfg, half)
    finally:
        ds.close()
    if sel.get('configs'):
        keep, lines = pick(net, P, sel['configs'], sel.get('proxy', ()), board_heap(),
                           half if min(n, ds.n) > 1 else None)
    else:
        keep, lines = choose(net, P, int(sel.get('layers', 1)), float(sel.get('share', 0.0)))
    log('board selection (Fisher potential on %d samples):' % min(n, ds.n))
    for line in lines:
        log(line)
    return keep


def choose_on(model, weights, data, sel, cfg, log=print):
    """The board's choice on a net of its own (model.flat with weights), made before the
    Trainer exists (run.py): the net, this module's code and the scoring arrays are all
    garbage when training allocates.  Returns keep for Trainer(keep=)."""
    from utrain.model import Net
    net = Net(model)
    net.load_weights(weights)
    try:
        return select(net, data, sel, cfg, log)
    finally:
        from utrain.run import drop
        drop('fpick')           # (run.aux drops this module)


class Chooser:
    """Trainer(keep=Chooser(...)): the board's choice, made on the Trainer's own net."""

    def __init__(self, data, sel, cfg):
        self.data, self.sel, self.cfg = data, sel, cfg

    def __call__(self, net):
        return select(net, self.data, self.sel, self.cfg)


