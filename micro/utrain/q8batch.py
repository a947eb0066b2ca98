# The int8 updates from a batch's sums (utrain.q8): SGD at a batch > 1 (with or without
# momentum) and Adam on float32 master weights (any batch), applied by Q8Net.apply at a
# batch's end.  Loaded by Q8Net.setup only for those settings: SGD at batch 1, the
# common case on a board, updates each layer as its gradient is made (Q8Net.step) and
# loads none of this (code is heap on a board); with momentum, a TRANSPOSE_CONV or an
# embedding that trains loads it for its state in checkpoints (xs, xput).
from math import sqrt, frexp
from utrain import q8kern as K


def apply(net, lr, scale, qmul):
    """Update every trained layer of net from the batch's sums times scale (1/batch for a
    mean), then zero them (qmul: utrain.q8's, which imports this: no import circle)."""
    if net.adam:
        net.nstep += 1
        b1, b2, t = net.b1, net.b2, net.nstep
        lr = lr * sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
    for L in net.layers:
        if L.ga is not None:
            upd(net, L, lr, scale, qmul)
    if net.sl is not None:      # (PRELU slopes that train: utrain.q8slope)
        net.sl.apply(lr, scale)
    net.zero()


def upd(net, L, lr, scale, qmul):
    """Layer L's update from its sums times scale (a weight or bias an earlier layer
    reads too, utrain.q8share: the owner's alone, sa / sb)."""
    sw, sx = L.d['sw'], L.d['sx']
    nw = len(sw)
    w0, w1 = L.wr()
    n = 0 if L.sa else w1 - w0
    ga, ba, bf, b = L.ga, L.ba, L.bf, L.b
    if net.adam:
        _adam(net, L, lr, scale, n)
    else:
        if n:   # w_q -= lr * scale * ga 2^-gk weight steps (unit), as 1/256 steps for upk
            c = lr * scale * 2.0 ** -L.gk[0]
            # (in 1/65536 steps where they stay within 2^30, rounded to 1/256 with a
            # dither, Q8Net._dith: to the nearest, an update under 1/512 step was 0)
            f = net._fits(ga, n, 64.0 / c)
            m, s = L.um[0], L.us[0] = qmul(c * (65536.0 if f else 256.0))
            if L.uk is not None:    # (_mults' kept multipliers: um[0] is not theirs now;
                L.uk = None         # written only then: a new instance attribute grows
                #                     the layer's dict mid-run, a hole where it was)
            if s > 0 and not f:     # (a sum unit past 1/256 step: ga << s within 32
                c = 2147483647 >> s     # bits, a step of 2^23 weight steps is past any)
                for i in range(n):
                    v = ga[i]
                    if v > c or v < -c:
                        ga[i] = c if v > 0 else -c
            K.rqk(ga, n, 1, n, L.um, L.us, ga, 0, 0, 0, 1)
            net._upd(L, w0, ga, n, net._dith() if f else -1)
        if L.sb:
            return
        vb, mu = L.vb, net.mom
        for o in range(L.blo, L.bhi):
            if vb is None:
                bf[o] -= lr * scale * ba[o]
            else:
                vb[o] = mu * vb[o] + lr * scale * ba[o]
                bf[o] -= vb[o]
    if L.sb:
        return
    for o in range(L.blo, L.bhi):
        q = int(round(bf[o] / (sx * sw[o % nw])))
        b[o] = -2147483647 if q < -2147483647 else 2147483647 if q > 2147483647 else q


def unit(L, gw, n, c0, nc, blk, f, qmul, mults=None):
    """A batch's (or shared weights' uses') sums: the chunk gw (n int32 sums of output
    channels c0..c0+nc-1, blk values each, cycling; dL/dW = gw f) rescaled in place into
    the unit of L's sums, 2^-gk[0] of dL/dW under Adam, of dL/dW / s_W (weight steps) under
    SGD (0 outside L's weight window; utrain.q8 adds it to L.ga).  The unit is the batch's
    largest f (SGD: f / the smallest s_W) so far: each multiplier f 2^gk[0] (/ s_W) < 1
    (no left shift on a 32-bit board; the sums stay within the raw sums' own bound) and
    >= 1/2 for that sample's largest.  Not a fixed unit (SGD's 1/4096 weight steps were):
    Adam divides each weight's step by its own gradient's size, so each needs its
    gradient to a few bits, where 1/4096 weight steps rounded small gradients away (the
    layers an input relabelling scales, 2^18 finer), and a large gradient in weight steps
    (a small s_W, a large input range) overflowed int32 at any batch (mults: utrain.q8's
    _mults, per-channel SGD's multipliers)."""
    gk, mul, shf = L.gk, L.um, L.us
    sw = L.d['sw']
    a = getattr(L, 'wm', None) is not None     # (Adam: float masters)
    e = -frexp(f if a else f / min(sw))[1]     # (f 2^e in [1/2, 1))
    if not gk[1]:
        gk[0], gk[1] = e, 1
    elif e < gk[0]:         # a larger gradient: the sums so far at the coarser unit
        if L.uk is not None:    # (um: not _mults' kept multipliers now)
            L.uk = None
        mul[0], shf[0] = qmul(2.0 ** (e - gk[0]))
        K.rqk(L.ga, len(L.ga), 1, len(L.ga), mul, shf, L.ga, 0, 0, 0, 1)
        gk[0] = e
    f *= 2.0 ** gk[0]
    if not a:
        if len(sw) > 1:
            return mults(L, gw, n, c0, nc, blk, f, 1.0)
        f /= sw[0]
    m, s = qmul(f)
    if L.uk is not None:
        L.uk = None
    lo, hi = L.wlo, L.whi
    if lo <= c0 and c0 + nc <= hi:
        mul[0], shf[0] = m, s
        K.rqk(gw, n, 1, n, mul, shf, gw, 0, 0, 0, 1)
        return
    for j in range(nc):
        mul[j], shf[j] = (m, s) if lo <= c0 + j < hi else (0, 0)
    K.rqk(gw, n, nc, blk, mul, shf, gw, 0, 0, 0, 1)


def _adam(net, L, lr, scale, n):
    # TensorFlow's Adam (lr already bias-corrected) on the float32 masters; the int8
    # weights are the masters requantized
    b1, b2, eps = net.b1, net.b2, net.eps
    sw = L.d['sw']
    nw = len(sw)
    oc, row, blk = L.geo()
    ga, wm, am, av, w = L.ga, L.wm, L.am, L.av, L.w
    w0 = L.wr()[0]
    wo = L.wo
    c = scale * 2.0 ** -L.gk[0]                 # (the sums' unit: unit above)
    z = getattr(L, 'lz', None)      # (an embedding table: the rows the batch read, lazy)
    r = 0 if z is None else L.d['ed']
    c1, c2 = 1.0 - b1, 1.0 - b2     # (the same floats, made once: not two a weight, heap)
    for t in range(1 if z is None else L.ln if L.gk[1] else 0):
        j0 = 0 if z is None else L.lq[t] * r
        for j in range(j0, j0 + r if r else n):
            i = w0 + j
            s = sw[(i // blk) % oc % nw]
            g = ga[j] * c                           # dL/dW
            m = am[j] = b1 * am[j] + c1 * g
            v = av[j] = b2 * av[j] + c2 * g * g
            x = wm[j] = wm[j] - lr * m / (sqrt(v) + eps)
            q = int(round(x / s))
            w[i - wo] = (-127 if q < -127 else 127 if q > 127 else q) & 255
    if z is not None:
        rows(L)
    if L.sb:
        return
    ba, bf, bm, bv = L.ba, L.bf, L.bm, L.bv
    for o in range(L.blo, L.bhi):
        g = ba[o] * scale
        m = bm[o] = b1 * bm[o] + c1 * g
        v = bv[o] = b2 * bv[o] + c2 * g * g
        bf[o] -= lr * m / (sqrt(v) + eps)


def rows(L):
    """An embedding table's list of the rows a batch read emptied (lazy Adam, _adam;
    utrain.q8emb keeps it)."""
    z, q = L.lz, L.lq
    for t in range(L.ln):
        z[q[t] >> 3] = 0
    L.ln = 0


_X = ('bf', 'wm', 'am', 'av', 'bm', 'bv', 'vw', 'vb')


def xs(L):
    """The optimizer state of a layer whose weights train outside 'wt' / 'bt' (Layer.xo:
    utrain.q8tcv, q8emb), in checkpoints beside its weights: its float bias, Adam's
    masters and moments, momentum's velocities (a batch's sums: not kept)."""
    return [getattr(L, k) for k in _X if getattr(L, k, None) is not None]


def xput(L, s, o):
    """xs(L) from bytes s at o, in place where it is (a float array: a new one); the
    offset after them."""
    from array import array
    for k in _X:
        a = getattr(L, k, None)
        if a is not None:
            n = len(a) * (1 if type(a) is bytearray else 4)
            if type(a) is bytearray:
                a[:] = s[o:o + n]
            else:
                setattr(L, k, array('f', bytes(s[o:o + n])))
            o += n
    return o
