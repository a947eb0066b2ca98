# The int8 updates from a batch's sums (utrain.q8): SGD at a batch > 1 (with or without
# momentum) and Adam on float32 master weights (any batch), applied by Q8Net.apply at a
# batch's end.  Loaded by Q8Net.setup only for those settings: SGD at batch 1, the
# common case on a board, updates each layer as its gradient is made (Q8Net.step) and
# loads none of this (code is heap on a board).
from math import sqrt, frexp
from utrain import q8kern as K


def apply(net, lr, scale, qmul, FS):
    """Update every trained layer of net from the batch's sums times scale (1/batch for a
    mean), then zero them (qmul, FS: utrain.q8's, which imports this: no import circle)."""
    if net.adam:
        net.nstep += 1
        b1, b2, t = net.b1, net.b2, net.nstep
        lr = lr * sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
    for L in net.layers:
        if L.ga is not None:
            upd(net, L, lr, scale, qmul, FS)
    if net.sl is not None:      # (PRELU slopes that train: utrain.q8slope)
        net.sl.apply(lr, scale)
    x = net.ext[-1] if net.ext else None
    if x is not None and x.TAG == b'UTTC':      # (TRANSPOSE_CONV weights: utrain.q8tcv)
        x.apply(lr, scale)
    net.zero()


def upd(net, L, lr, scale, qmul, FS):
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
        if n:   # w_q -= lr * scale * ga / FS weight steps, as 1/256 steps for upk
            L.um[0], L.us[0] = qmul(lr * scale * 256.0 / FS)
            L.uk = None     # (_mults' kept multipliers: um[0] is not theirs now)
            K.rqk(ga, n, 1, n, L.um, L.us, ga, 0, 0, 0, 1)
            net._upd(L, w0, ga, n)
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


def unit(L, gw, n, c0, nc, blk, f, qmul):
    """Adam: the chunk gw (n int32 sums of output channels c0..c0+nc-1, blk values each,
    cycling; dL/dW = gw f) rescaled in place into the unit of L's batch sums, 2^-gk[0] of
    dL/dW (0 outside L's weight window; utrain.q8 adds it to L.ga).  The unit is the
    batch's largest f so far: gw f 2^gk[0] < 1 (no left shift on a 32-bit board; the sums
    stay within the raw sums' own bound) and >= 1/2 for that sample.  Not in weight steps
    as SGD's: Adam divides each weight's step by its own gradient's size, so each needs
    its gradient to a few bits, where 1/4096 weight steps rounded small gradients away
    (the layers an input relabelling scales, 2^18 finer) and large ones overflowed int32."""
    gk, mul, shf = L.gk, L.um, L.us
    L.uk = None             # (um: not _mults' kept multipliers now)
    e = -frexp(f)[1]        # (f 2^e in [1/2, 1))
    if not gk[1]:
        gk[0], gk[1] = e, 1
    elif e < gk[0]:         # a larger gradient: the sums so far at the coarser unit
        mul[0], shf[0] = qmul(2.0 ** (e - gk[0]))
        K.rqk(L.ga, len(L.ga), 1, len(L.ga), mul, shf, L.ga, 0, 0, 0, 1)
        gk[0] = e
    m, s = qmul(f * 2.0 ** gk[0])
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
    for j in range(n):
        i = w0 + j
        s = sw[(i // blk) % oc % nw]
        g = ga[j] * c                           # dL/dW
        m = am[j] = b1 * am[j] + (1.0 - b1) * g
        v = av[j] = b2 * av[j] + (1.0 - b2) * g * g
        x = wm[j] = wm[j] - lr * m / (sqrt(v) + eps)
        q = int(round(x / s))
        w[i - wo] = (-127 if q < -127 else 127 if q > 127 else q) & 255
    if L.sb:
        return
    ba, bf, bm, bv = L.ba, L.bf, L.bm, L.bv
    for o in range(L.blo, L.bhi):
        g = ba[o] * scale
        m = bm[o] = b1 * bm[o] + (1.0 - b1) * g
        v = bv[o] = b2 * bv[o] + (1.0 - b2) * g * g
        bf[o] -= lr * m / (sqrt(v) + eps)
