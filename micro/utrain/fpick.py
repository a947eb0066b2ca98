# The board's choice among the configurations prepare --select board short-listed
# (utrain.fisher for a float model, utrain.q8fish for an int8 one trained as int8, each
# with its own pass measuring the candidates' Fisher potentials): prepare tried the
# configurations on a proxy dataset (their accuracy gain over the classifier alone) and
# measured each candidate's share of the classifier's potential there; pick() weighs each
# configuration's gain by how much more (or less) potential its layers have on the
# board's own data than on the proxy, and trains the best (of those within TIE of it the
# first in the host's order, which puts first the one that trains the most, as prepare's
# --select auto), each part of a layer on the channels the host measured
# unless the board's data puts more than NOISE times their potential in another window
# than the proxy had there (measured(): on each half of its samples, the window chosen on
# the other half).  Plain Python over rows of potentials (p[0, c], p.shape: an array of
# utrain.xnp, or q8fish's Row): no array module of its own.  Loaded with the pass, dropped
# with it.
try:
    from micropython import const
except ImportError:
    def const(x):
        return x

# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_FULLY_CONNECTED = const(9)
_CONV_2D = const(3)
_DEPTHWISE_CONV_2D = const(4)
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
    (gain: accuracy over the classifier alone on the proxy, the best one's for a choice
    the host settled among tied ones on longer trials; axis 2: the whole tensor; lo:
    the first of the channels the host measured, see measured()),
    proxy [[op, share of the classifier's potential on the proxy(, [its channels'
    potentials there] for a layer trained in part)], ...].  A
    configuration's gain is weighed by rho = (its layers' share of the classifier's
    potential here) / (their share on the proxy), beyond NOISE (rho / NOISE above it,
    rho * NOISE below 1 / NOISE, else 1); the best weighed gain trains (of those within
    TIE of it the first listed: the host lists them as --select auto orders them, the
    one that trains the most first).  Configurations with a refused layer are
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
        best = min([r[2] for r in rated if r[0] >= top - TIE])
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
