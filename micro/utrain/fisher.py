# The board chooses what trains from its own data (prepare --select board), as TinyTrain
# does.  prepare made every candidate layer trainable, each at the largest channel
# ratio the budget allows for the whole set; here a few samples give each candidate's
# output channels their Fisher potential
#   P_c = 1/(2N) sum_n (sum_d a_ndc * g_ndc)^2    a: the layer's output, g: dL/da
# (one forward and one backward pass a sample; no weight gradient, no update).  A layer
# scores s = P / ((params / max params) * (MACs / max MACs)), P = sum_c P_c; the
# classifier trains, and of the layers whose P is at least `share` of the classifier's
# the `layers` best by score, each on the window of channels (its prepared width) with
# the largest potential; the others are frozen.  The choice goes
# into the checkpoint (save_state), so a resumed run trains the same set.
# Imported lazily (code is heap) before training and dropped.
from struct import pack, unpack, calcsize
from utrain.xnp import np, zeros, const

# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_DW = const(2)
_DB = const(4)
_FULLY_CONNECTED = const(9)
_CONV_2D = const(3)
_DEPTHWISE_CONV_2D = const(4)
_DX_ANY = const(~(_DW | _DB))   # data-input gradient bits (DW, DB are the parameters')
WEIGHTED = (_FULLY_CONNECTED, _CONV_2D, _DEPTHWISE_CONV_2D)
TAG = b'UTSL'
ENTRY = '<HBBHH'        # tensor, axis (2: whole), 0, lo, hi


def candidates(net):
    # [(op index, its trainable tensors)] in execution order
    tr = net.trainable
    out = []
    for i in range(len(net.ops)):
        ks = [k for k in net.ops[i][1] if k >= 0 and k in tr]
        if ks:
            out.append((i, ks))
    return out


def potentials(net, ds, n, cfg):
    """{op index: (1, C) Fisher potentials of its output channels} over n samples of
    ds (spread over the file); cfg: the training settings (loss)."""
    from utrain.losses import loss
    cands = candidates(net)
    outs = {}
    P = {}
    for i, _ in cands:
        o = net.ops[i][2][0]
        outs[o] = i
        P[i] = zeros((1, net.shape[o][1]))
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
            for oi, fl in net.bwd:
                op = net.ops[oi]
                d = g.pop(op[2][0], None)
                if d is None:
                    continue
                if oi in P:
                    a = net.t[op[2][0]]
                    s = np.sum(a * d, axis=0)
                    s = s.reshape((1, s.shape[0])) if len(s.shape) == 1 else s
                    p = P[oi]
                    p += s * s
                fl &= _DX_ANY
                if fl:
                    if st:
                        st.fetch(oi)
                    net.mods[oi].backward(net, op, d, fl)
                    if st:
                        st.drop(oi)
            g.clear()
    finally:
        net.free_train = free
        for k in outs:
            net.t[k] = None
    for i in P:
        p = P[i]
        p *= 0.5 / n
    return P


def choose(net, P, layers, share=0.0):
    """{tensor: (axis, lo, hi) or None (whole)} of the tensors that train, and the
    log lines saying why."""
    cands = candidates(net)
    size = lambda k: net.shape[k][0] * net.shape[k][1]     # noqa: E731
    info = []
    cls = None
    for i, ks in cands:
        params = sum(size(k) for k in ks)
        macs = max(size(k) for k in ks) * net.shape[net.ops[i][2][0]][0]
        p = P[i]
        pot = sum(p[0, c] for c in range(p.shape[1]))
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
        C = p.shape[1]
        win = None
        for k in ks:
            r = net.rank.get(k)
            if r:
                w = r[2] - r[1]
                if win is None:
                    # the window of w channels with the largest potential
                    best, lo = -1.0, 0
                    cur = sum(p[0, c] for c in range(w))
                    for c0 in range(C - w + 1):
                        if c0:
                            cur += p[0, c0 + w - 1] - p[0, c0 - 1]
                        if cur > best:
                            best, lo = cur, c0
                    win = (lo, lo + w)
                keep[k] = (r[0], win[0], win[1])
            else:
                keep[k] = None
        lines.append('op %d: potential %.3g, %d params, %d MACs, score %.3g -> trains %s'
                     % (i, pot, params, macs, s, 'channels %d:%d' % win if win else 'whole'))
    for i, ks, params, macs, pot, s in others[layers:]:
        lines.append('op %d: potential %.3g, %d params, %d MACs, score %.3g -> frozen'
                     % (i, pot, params, macs, s))
    return keep, lines


def restrict(net, keep):
    """Train only the tensors in keep ({tensor: (axis, lo, hi) or None}): the others
    are frozen, the backward list loses their gradients (and the ops before the first
    that trains).  Call it before the Trainer makes optimizer state (Trainer(keep=))."""
    for k in keep:
        if k not in net.trainable:
            raise ValueError('selection names tensor %d, which is not a candidate' % k)
    net.trainable = [k for k in net.trainable if k in keep]
    for k in list(net.rank):
        if keep.get(k) is None:
            del net.rank[k]
    for k in keep:
        if keep[k]:
            net.rank[k] = keep[k]
    first = min(i for i in range(len(net.ops)) if any(k in keep for k in net.ops[i][1]))
    bwd = []
    for oi, fl in net.bwd:
        if oi < first:
            continue
        code, ins = net.ops[oi][0], net.ops[oi][1]
        if code in WEIGHTED:
            if len(ins) < 2 or ins[1] not in keep:
                fl &= ~_DW
            if len(ins) < 3 or ins[2] not in keep:
                fl &= ~_DB
        elif not any(k in keep for k in ins):
            fl &= ~(_DW | _DB)
        if oi == first:
            fl &= _DW | _DB           # nothing before it trains
        if fl:
            bwd.append((oi, fl))
    net.bwd = bwd
    net.select = blob(keep)


def blob(keep):
    out = [TAG, pack('<H', len(keep))]
    for k in sorted(keep):
        r = keep[k] or (2, 0, 0)
        out.append(pack(ENTRY, k, r[0], 0, r[1], r[2]))
    return b''.join(out)


def unblob(b, path):
    n = unpack('<H', b[4:6])[0] if len(b) >= 6 and b[:4] == TAG else -1
    e = calcsize(ENTRY)
    if n < 0 or len(b) != 6 + n * e:
        raise ValueError('%s: bad board-selection block' % path)
    keep = {}
    for j in range(n):
        k, ax, _, lo, hi = unpack(ENTRY, b[6 + j * e:6 + (j + 1) * e])
        keep[k] = None if ax == 2 else (ax, lo, hi)
    return keep


def select(net, data, sel, cfg, log=print):
    """The board's choice on a loaded net (Trainer(keep=) calls it before any optimizer
    state exists): its candidates scored on sel['samples'] samples of the dataset
    file data; the classifier and up to sel['layers'] others (potential at least
    sel['share'] of the classifier's) train.  Returns keep for restrict()."""
    from utrain.data import Dataset
    ds = Dataset(data)
    n = int(sel.get('samples', 16))
    try:
        P = potentials(net, ds, n, cfg)
    finally:
        ds.close()
    keep, lines = choose(net, P, int(sel.get('layers', 1)), float(sel.get('share', 0.0)))
    log('board selection (Fisher potential on %d samples):' % min(n, ds.n))
    for line in lines:
        log(line)
    return keep


class Chooser:
    """Trainer(keep=Chooser(...)): the board's choice, made on the Trainer's own net."""

    def __init__(self, data, sel, cfg):
        self.data, self.sel, self.cfg = data, sel, cfg

    def __call__(self, net):
        return select(net, self.data, self.sel, self.cfg)


def read(path, log=print):
    """The set the checkpoint at path was trained with (its selection block)."""
    from utrain import wof
    with wof.openr(path) as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(0)
        h = f.read(20)
        oo = unpack('<HBBIIII', h)[5] if len(h) == 20 else 0
        end = size
        if size >= 28:
            f.seek(size - 8)
            if f.read(4) == wof.TAG:
                end = size - 8
        at = oo + 8 + calcsize(wof.RESUME)
        if not 20 < oo < at <= end:
            raise ValueError('%s: no board-selection block (prepared without --select board?)'
                             % path)
        f.seek(at)
        b = f.read(end - at)
    keep = unblob(b, path)
    log('board selection from %s: tensors %s' % (path, ', '.join(
        '%d' % k + (' %d:%d' % (keep[k][1], keep[k][2]) if keep[k] else '') for k in sorted(keep))))
    return keep
