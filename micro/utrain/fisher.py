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
# have on the board's own data than on the proxy, and trains the best (the largest plan
# within TIE of it, as prepare's --select auto), each part of a layer on the channels
# the host measured unless the board's data puts more than NOISE times their potential
# in another window than the proxy had there (on each half of its samples, the window
# chosen on the other half).  A candidate with no finite, positive
# potential is refused (said).  The choice goes into the checkpoint (utrain/chosen.py),
# so a resumed run trains the same set.  run.py loads this module once, before the
# Trainer, on a net of its own (choose_on), and drops it: its code and arrays are gone
# before training allocates.  An int8 run's choice (utrain.q8fish) weighs its own
# potentials with pick() below: the array module (utrain.xnp; without ulab the numpy
# fallback's code) loads only for the float pass, not with this module.
try:
    from micropython import const
except ImportError:
    def const(x):
        return x

# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_DW = const(2)
_DB = const(4)
_FULLY_CONNECTED = const(9)
_CONV_2D = const(3)
_DEPTHWISE_CONV_2D = const(4)
_DX_ANY = const(~(_DW | _DB))   # data-input gradient bits (DW, DB are the parameters')
WEIGHTED = (_FULLY_CONNECTED, _CONV_2D, _DEPTHWISE_CONV_2D)
TIE = 0.005             # configurations this close to the best count as as good (select.TIE)
# A candidate's share of the classifier's potential, from 16 samples, differs from the
# proxy's by up to about this factor on data like the proxy's (bench/transfer.py: 1.7):
# only what goes beyond it weighs a prior gain
NOISE = 2.0


def candidates(net):
    # [(op index, its trainable tensors)] in execution order
    tr = net.trainable
    out = []
    for i in range(len(net.ops)):
        ks = [k for k in net.ops[i][1] if k >= 0 and k in tr]
        if ks:
            out.append((i, ks))
    return out


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
            dy = loss(cfg['loss'], net.output(), y, cfg['from_logits'])[1]
            g = net.g
            g[net.outputs[0]] = dy
            # every op of the backward list runs, as Net.backward runs it (its weight
            # gradients off): flags 0 may still pass a gradient (an ADD's second
            # input goes by net.gin: a residual whose skip branch is frozen), and a
            # SPLIT runs when any of its outputs has one
            for oi, fl in net.bwd:
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


def _total(p):
    return sum(p[0, c] for c in range(p.shape[1]))


def _usable(v):
    return v == v and v > 0.0 and v - v == 0.0       # finite and positive


def window(p, w):
    """(lo, hi): the window of w channels of potentials p (1, C) with the most."""
    s = _sums(p, w)
    lo = max(range(len(s)), key=lambda c0: s[c0])
    return lo, lo + w


def _sums(p, w):
    """[potential of the w channels from c0 for c0 in 0..C-w] of p (1, C), sliding."""
    cur = sum(p[0, c] for c in range(w))
    out = [cur]
    for c0 in range(1, p.shape[1] - w + 1):
        cur += p[0, c0 + w - 1] - p[0, c0 - 1]
        out.append(cur)
    return out


def _over(s, c0, lo):
    """How many times the measured window's potential (from lo) the window from c0 has,
    of window sums s."""
    m, t = s[lo], s[c0]
    return t / m if m > 0.0 else (1e30 if t > 0.0 else 0.0)


def measured(p, w, lo, q=None, r=None):
    """(lo, hi) of w channels of potentials p (1, C) to train with the host's priors, and
    a word on which: the window the host measured (from lo; None: not said) unless the
    board's data moves potential into another window.  r (1, C): the proxy's potentials
    of these channels; a window's gain is how many times the measured window's potential
    it has here over how many times it had on the proxy, where the host measured the
    accuracy the measured window gives (tico-cnn rotated: 1:5 had 2.17x of 0:4 here and
    2.15x on the proxy, and lost 5.7 points when the board moved there).  q: the part of
    p from half the samples; the best of the C - w + 1 windows on the samples that chose
    it is biased upward against any one window, so the window with the best gain on each
    half is weighed on the other half, and the measured window gives way only where both
    gain more than NOISE (the one of the two with more on all samples trains).  Without
    q, the best on all samples; without r, a gain is the ratio here."""
    C = p.shape[1]
    if lo is None or lo < 0 or lo + w > C:
        return window(p, w), 'most potential'
    why = ' the measured %d:%d' % (lo, lo + w)
    sp = _sums(p, w)
    if not _usable(sp[lo]):
        b = window(p, w)
        if _usable(sp[b[0]]):      # the measured channels have no potential here
            return b, 'most potential, none in' + why
        return (lo, lo + w), 'measured on the proxy'
    sr = _sums(r, w) if r is not None else None

    def gain(s, c0):
        g = _over(s, c0, lo)
        return g / max(_over(sr, c0, lo), 1e-9) if sr else g

    def best(s):
        return max(range(C - w + 1), key=lambda c0: gain(s, c0))
    if q is None:
        c = best(sp)
        g = gain(sp, c)
        on = ''
    else:
        sq = _sums(q, w)
        sa = [x - y for x, y in zip(sp, sq)]
        ca, cq = best(sa), best(sq)
        ga, gq = gain(sq, ca), gain(sa, cq)
        c = ca if sp[ca] >= sp[cq] else cq
        g = min(ga, gq)
        on = ' on each half of the samples (chosen on the other)'
    if g > NOISE:
        return (c, c + w), 'more potential%s: %.3g x%s%s' % (
            on, g, why, ' beyond the proxy\'s' if sr else '')
    return (lo, lo + w), 'measured on the proxy'


def classifier(net):
    cls = None
    for i, ks in candidates(net):
        if net.ops[i][0] in WEIGHTED:
            cls = i
    return cls


def refused(net, P):
    """{op: why} of the candidates the board will not train: no finite, positive
    Fisher potential on its data (a NaN from a diverging sample, or outputs that do not
    change the loss: nothing to gain from training them)."""
    out = {}
    cls = classifier(net)
    for i in P:
        v = _total(P[i])
        if i != cls and not _usable(v):
            out[i] = 'refused: Fisher potential %s on this data' % v
    return out


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


def board_heap():
    """The heap this board gives (None under CPython)."""
    try:
        import gc
        return gc.mem_free() + gc.mem_alloc()
    except AttributeError:
        return None


def _zeros(n):
    from utrain.xnp import zeros
    return zeros((1, n))


def pick(net, P, configs, proxy, have=None, half=None, row=_zeros):
    """With the host's priors: configs [[gain, heap, [[tensor, axis, width, lo], ...]], ...]
    (gain: accuracy over the classifier alone on the proxy; axis 2: the whole tensor; lo:
    the first of the channels the host measured, see measured()),
    proxy [[op, share of the classifier's potential on the proxy(, [its channels'
    potentials there] for a layer trained in part)], ...].  A
    configuration's gain is weighed by rho = (its layers' share of the classifier's
    potential here) / (their share on the proxy), beyond NOISE (rho / NOISE above it,
    rho * NOISE below 1 / NOISE, else 1); the best weighed gain trains (the largest
    heap within TIE of it: it trains the most).  Configurations with a refused layer are
    out, and so are those planned above the heap this board has (have, bytes: its GC's
    tables aside, a 1/32 margin); half: potentials()'s half (see measured()); row(n):
    a (1, n) row of zeros of the kind P holds (utrain.q8fish: its own).
    Returns (keep, log lines)."""
    cls = classifier(net)
    no = refused(net, P)
    op_of = {}
    for i, ks in candidates(net):
        for k in ks:
            op_of[k] = i
    pc = _total(P[cls])
    here = {}
    for i in P:
        here[i] = _total(P[i]) / pc if _usable(pc) else 0.0
    there, chans = {}, {}
    for e in proxy:
        there[e[0]] = e[1]
        if len(e) > 2 and e[0] in P and len(e[2]) == P[e[0]].shape[1]:
            r = chans[e[0]] = row(len(e[2]))
            for c in range(len(e[2])):
                r[0, c] = e[2][c]
    lines, rated = [], []
    for j in range(len(configs)):
        gain, heap, ents = configs[j]
        ops = []
        for e in ents:
            if e[0] not in op_of:
                raise ValueError('selection names tensor %d, which is not a candidate' % e[0])
            i = op_of[e[0]]
            if i != cls and i not in ops:
                ops.append(i)
        out = [i for i in ops if i in no]
        why = ', refused (op %d)' % out[0] if out else ''
        if have and heap > have + (have >> 5):
            why = ', refused: planned above this board\'s %d KB heap' % (have // 1024)
        b = sum(here[i] for i in ops)
        q = sum(there.get(i, 0.0) for i in ops)
        rho = b / q if q > 0.0 else 1.0
        w = gain * (rho / NOISE if rho > NOISE else rho * NOISE if rho * NOISE < 1.0 else 1.0)
        lines.append('config %d (ops %s): proxy gain %.3f, potential here/proxy %.2f -> %.3f, %d KB%s'
                     % (j, ','.join('%d' % i for i in ops) or 'classifier only', gain, rho, w,
                        heap // 1024, why))
        if not why:
            rated.append((w, heap, j))
    if rated:
        top = max(r[0] for r in rated)
        best = max([r for r in rated if r[0] >= top - TIE], key=lambda r: (r[1], r[0]))[2]
    else:       # (the classifier alone is planned above this board's heap)
        best = min(range(len(configs)), key=lambda j: configs[j][1])
        lines.append('every configuration refused: the smallest trains')
    lines.append('-> config %d' % best)
    keep, wins = {}, {}
    for e in configs[best][2]:
        k, ax, w = e[0], e[1], e[2]
        if ax == 2:
            keep[k] = None
            continue
        i = op_of[k]
        if (i, w) not in wins:
            wins[(i, w)] = measured(P[i], w, e[3] if len(e) > 3 else None,
                                    half[i] if half else None, chans.get(i))
        (lo, hi), why = wins[(i, w)]
        keep[k] = (ax, lo, hi)
        lines.append('op %d tensor %d: channels %d:%d of %d (%s)'
                     % (i, k, lo, hi, net.shape[k][ax], why))
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
    keep = select(net, data, sel, cfg, log)
    net = None
    return keep


class Chooser:
    """Trainer(keep=Chooser(...)): the board's choice, made on the Trainer's own net."""

    def __init__(self, data, sel, cfg):
        self.data, self.sel, self.cfg = data, sel, cfg

    def __call__(self, net):
        return select(net, self.data, self.sel, self.cfg)


