"""K independent trials of `--select auto` trained at once (issue 30), on the host only.

A trial is batch-1 training (each sample's forward depends on the last update), so its
samples cannot go through together; but the trials of a selection are independent of
each other.  Here K trials of one prepared model (a configuration's folds: the same
model.flat and weights, their own samples, sample order and validation part) run side
by side: every activation is a [K, rows, cols] array, every trained weight and its
optimizer state [K, ...] (each trial its own), frozen constants shared, so one numpy
call does the K trials' step of an op and numpy's per-call overhead (which dominates
at batch 1 on tiny arrays) is paid once per K trials.  The arithmetic per trial is the
sequential path's (utrain's micro/ code under numpy, xnumpy's im2col): the same
products and sums, up to the order a batched product or reduction takes (float
rounding).  The update rule is utrain.optim's own (Optimizer._row on the stacked
arrays); the frozen prefix (utrain.prefix.cut) is computed per sample by the micro/
code as the sequential trials do.

Covered (`covers` says why not otherwise, and the caller runs the trials one by one):
  ops      FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D (whole weights in memory),
           ADD/SUB/MUL/DIV of one block (same shapes, or a row/column broadcast, as a
           BatchNorm's scale and shift), MAX_POOL_2D, MEAN, RESHAPE/SQUEEZE/EXPAND_DIMS,
           the fused activations NONE, RELU, RELU_N1_TO_1, RELU6, TANH, LOGISTIC;
           channel windows (ranks) on any trained weight or bias
  losses   scce, cce, mse; metrics accuracy and mae
  training batch 1 (the trials' setting), any optimizer of utrain.optim; no --stream,
           no row bands, no weight read by two ops
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..target.device import module

# circle builtin codes (utrain.opc)
_ADD, _SUB, _MUL, _DIV = 0, 41, 18, 42
_CONV, _DW, _FC, _MAXPOOL, _MEAN = 3, 4, 9, 17, 40
_SHAPE = (22, 43, 70)
_ELEM = (_ADD, _SUB, _MUL, _DIV)
COVERED = set(_SHAPE + _ELEM + (_CONV, _DW, _FC, _MAXPOOL, _MEAN))
_ACTS = (0, 1, 2, 3, 4, 6)
_DX, _DWF, _DB = 1, 2, 4


def covers(net, cfg) -> str | None:
    """None when the stacked path runs net with settings cfg, else why not."""
    if int(cfg['batch']) != 1:
        return 'batch %d' % int(cfg['batch'])
    if cfg['loss'] not in ('scce', 'cce', 'mse') or cfg['metric'] not in ('accuracy', 'mae'):
        return 'loss %s, metric %s' % (cfg['loss'], cfg['metric'])
    if net.stream or net.bands or net.shared() or len(net.inputs) != 1 or len(net.outputs) != 1:
        return 'streamed, banded, shared weights or several inputs/outputs'
    for op in net.ops:
        if op[0] not in COVERED:
            return 'op code %d' % op[0]
        if op[0] in (_CONV, _DW, _FC, _MAXPOOL) + _ELEM and int(op[3][0]) not in _ACTS:
            return 'activation %d' % int(op[3][0])
        if op[0] in _ELEM and int(op[3][2]) * int(op[3][3]) != 1:
            return 'a blockwise broadcast'
        if op[0] in (_CONV, _DW, _FC) and net.t[op[1][1]] is None:
            return 'a weight streamed from the model file'
    return None


# The dtypes are the sequential path's, for the same roundings: a convolution's output
# and gradients are summed into float32 arrays (xnp.zeros), a max pool's output is a
# float64 array (op_pool's np.full), the rest follows numpy's promotion as there.
_F32 = np.float32


def _padded(x, fill):
    # x [K, n, C] with one more row of fill (what a padding tap reads)
    xp = np.empty((x.shape[0], x.shape[1] + 1, x.shape[2]), dtype=x.dtype)
    xp[:, :-1] = x
    xp[:, -1] = fill
    return xp


def _span(i0, s, n, outs):
    # [lo, hi): the outputs o (of outs) whose x index o * s + i0 falls in [0, n)
    lo = (s - 1 - i0) // s if i0 < 0 else 0
    hi = min(outs, (n - 1 - i0) // s + 1) if i0 <= n - 1 else 0
    return lo, hi


def _scatter(o, g, n, disjoint, v):
    # [K, n, C]: v [K, outputs, taps, C] summed into the x rows g names (padding taps
    # dropped).  Where windows overlap, in the order np.add.at (xnumpy's) adds them, g's
    # flat order (outputs, then taps): the taps that read one x row come from later
    # outputs the earlier the tap (the output's row and column fall as the kernel's rise),
    # so a strided slice per tap, the last tap first, adds each row's values in that
    # order (the same sums, 5-10x faster than one fancy-indexed pass per occurrence)
    K, R, T, C = v.shape
    if disjoint:
        d = np.zeros((K, n + 1, C), dtype=v.dtype)
        d[:, g] = v
        return d[:, :n]
    H, W, OH, OW = int(o[1]), int(o[2]), int(o[4]), int(o[5])
    KH, KW, sh, sw = int(o[7]), int(o[8]), int(o[9]), int(o[10])
    dh, dw, pt, pl = int(o[11]), int(o[12]), int(o[13]), int(o[14])
    d = np.zeros((K, H, W, C), dtype=v.dtype)
    v = v.reshape((K, OH, OW, T, C))
    for kh in range(KH - 1, -1, -1):
        ih = kh * dh - pt
        ylo, yhi = _span(ih, sh, H, OH)
        if yhi <= ylo:
            continue
        for kw in range(KW - 1, -1, -1):
            iw = kw * dw - pl
            xlo, xhi = _span(iw, sw, W, OW)
            if xhi > xlo:
                d[:, ylo * sh + ih:(yhi - 1) * sh + ih + 1:sh,
                  xlo * sw + iw:(xhi - 1) * sw + iw + 1:sw] += v[:, ylo:yhi, xlo:xhi, kh * KW + kw]
    return d.reshape((K, n, C))


def _T(w):
    return w.swapaxes(-1, -2)


def _mm(a, b):
    # a @ b as np.dot computes it: both operands in their common dtype first (a float32
    # operand of a float64 product gives other bits when matmul mixes them)
    dt = np.result_type(a, b)
    return np.matmul(a.astype(dt, copy=False), b.astype(dt, copy=False))


def signature(net) -> str:
    """What a loaded net is besides its channel windows (net.rank): nets of one
    signature train side by side, each trial its own windows."""
    h = hashlib.sha1(repr((net.inputs, net.outputs, net.shape, list(net.trainable),
                           [tuple(b) for b in net.bwd], sorted(net.gin))).encode())
    for op in net.ops:
        h.update(repr((op[0], list(op[1]), list(op[2]), [float(v) for v in op[3]])).encode())
    for a in net.t:
        h.update(b'-' if a is None else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Stack:
    """K trials of one loaded net (utrain.model.Net, weights loaded) with settings cfg
    (the trainer's: net.settings and train.json's recipe); ranks: each trial's channel
    windows ({tensor: (axis, lo, hi)}, net.rank's form; default net's own)."""

    def __init__(self, net, cfg, K, ranks=None):
        self.net, self.cfg, self.K = net, cfg, K
        net.fuse_head(cfg['loss'], cfg['from_logits'])  # (the trainer's: a final SOFTMAX whole)
        self.act, self.act_grad = module('op_act')._act, module('op_act').act_grad
        self.elem = module('op_elem')
        self.walk = module('op_conv').walk
        self.window = module('xnumpy')._window
        self.sink = module('sink')
        self.k0, self.cut = module('prefix').cut(net)
        # per op, once: its options as ints (all this path reads of them) and its window
        # table, not numpy scalars and xnumpy's cache keyed by the options' bytes each
        # sample (at K = 1 a trial's time is mostly such per-op overhead)
        self.ops, self.wins = [], {}
        for i, (code, ins, outs, o) in enumerate(net.ops):
            if code in (_CONV, _DW, _MAXPOOL):
                self.wins[i] = self.window(o, self.walk, int(o[10]))
            self.ops.append((code, ins, outs, [int(v) if np.isfinite(v) else 0 for v in o]))
        self.w = {k: np.repeat(net.t[k][None], K, axis=0) for k in net.trainable}
        O = module('optim')
        self.opt = O.Optimizer(cfg['optimizer'])
        self.opt.set(cfg, 1.0)
        # a weight every trial trains in the same window updates that window (win);
        # one trained in windows that differ updates whole, its gradient zero outside
        # each trial's window (mask): a zero gradient leaves a weight and its SGD or
        # Adam state exactly as they are (without weight decay: run() checks)
        ranks = ranks or [net.rank] * K
        self.win, self.mask = {}, {}
        for k in net.trainable:
            rs = [r.get(k) for r in ranks]
            if all(r == rs[0] for r in rs):
                self.win[k] = rs[0]
                continue
            self.win[k] = None
            m = self.mask[k] = np.zeros((K,) + net.shape[k], dtype=bool)
            for j, r in enumerate(rs):
                if r is None:
                    m[j] = True
                elif r[0] == 0:
                    m[j, r[1]:r[2]] = True
                else:
                    m[j, :, r[1]:r[2]] = True
        for k in net.trainable:
            r = self.win[k]
            shape = net.shape[k] if r is None else \
                ((r[2] - r[1], net.shape[k][1]) if r[0] == 0 else (net.shape[k][0], r[2] - r[1]))
            if 'adam' in self.opt.kind or (self.opt.kind == 'sgd' and self.opt.momentum):
                self.opt.m[k] = np.zeros((K,) + shape, dtype=net.t[k].dtype)
            if self.opt.kind != 'sgd':
                self.opt.v[k] = np.zeros((K,) + shape, dtype=net.t[k].dtype)
        self.dead = np.zeros(K, dtype=bool)     # a trial that diverged scores the worst
        self.flat, self.gdt = None, {}          # (_flatten)

    # -- values
    def _v(self, k):
        # tensor k: a trained weight [K, ...], an activation [K, ...], or a frozen constant
        if k in self.w:
            return self.w[k]
        v = self.t.get(k)
        return self.net.t[k] if v is None else v

    def _win(self, k, a):
        # a [K, ...] of k's whole shape cut to k's training channels (sink.trained)
        r = self.win.get(k)
        if r is None or a.shape[1:] != self.net.shape[k]:
            return a
        ax, lo, hi = r
        return a[:, lo:hi] if ax == 0 else a[:, :, lo:hi]

    def _update(self, k, g):
        # the batch-1 sink: k's gradient g [K, ...] (its whole shape or its window)
        m = self.mask.get(k)
        if m is not None:
            g = np.where(m, g.reshape(m.shape), 0.0)
        if self.flat:                           # into its group's gradient, stepped at the end
            gv = self.gview[k]
            if g.dtype != gv.dtype:
                raise ValueError('tensor %d: a gradient of another dtype' % k)
            self._win(k, gv)[...] = self._win(k, g.reshape((self.K,) + g.shape[-2:]))
            return
        self.gdt[k] = g.dtype
        self.opt.step(k, self._win(k, self.w[k]), self._win(k, g))

    # After the first step the trained weights, their optimizer state and gradients live
    # in one [K, n] array per gradient dtype (float32, or float64 behind a max pool's
    # float64 output) and the optimizer steps each array once a sample, not each weight
    # (22 of them in the IMU net, most BatchNorm rows): the same rule per element, a
    # window's outside a zero gradient that leaves it as it is (hence no weight decay),
    # every weight still stepped after its gradient is complete and before it is read
    # again (no weight is read by two ops: covers()).

    def _flatten(self):
        net, K, opt = self.net, self.K, self.opt
        if self.cfg.get('weight_decay') or set(self.gdt) != set(net.trainable):
            self.flat = False
            return
        self.flat, self.gview = [], {}
        for dt in sorted({d.str for d in self.gdt.values()}):
            ks = [k for k in net.trainable if self.gdt[k].str == dt]
            n = sum(int(np.prod(net.shape[k])) for k in ks)
            W = np.empty((K, n), dtype=_F32)
            G = np.zeros((K, n), dtype=np.dtype(dt))
            name = 'flat:' + dt
            st = [(opt.m, np.zeros((K, n), dtype=_F32)) if k in opt.m else None for k in ks[:1]]
            st += [(opt.v, np.zeros((K, n), dtype=_F32)) if ks[0] in opt.v else None]
            o = 0
            for k in ks:
                size = int(np.prod(net.shape[k]))
                shape = (K,) + net.shape[k]
                W[:, o:o + size] = self.w[k].reshape((K, size))
                self.w[k] = W[:, o:o + size].reshape(shape)
                self.gview[k] = G[:, o:o + size].reshape(shape)
                for s in st:
                    if s is not None:
                        whole = s[1][:, o:o + size].reshape(shape)
                        self._win(k, whole)[...] = s[0].pop(k)
                o += size
            for s in st:
                if s is not None:
                    s[0][name] = s[1]
            self.flat.append((name, W, G))

    # -- one pass
    def forward(self, cut):
        """Ops k0.. from the cut tensors {k: [K, rows, cols]}; returns the output."""
        net = self.net
        self.t = dict(cut)
        self.saved = {}
        for i in range(self.k0, len(net.ops)):
            self._fwd(i, self.ops[i])
        return self.t[net.outputs[0]]

    def _fwd(self, i, op):
        code, ins, outs, o = op
        net, t, K = self.net, self.t, self.K
        x = self._v(ins[0])
        shape = (K,) + net.shape[outs[0]]
        if code in _SHAPE:
            t[outs[0]] = x.reshape(shape)
            return
        if code == _MEAN:
            outer, red, inner = int(o[0]), int(o[1]), int(o[2])
            if inner == 1:
                y = x.reshape((K, outer, red)).mean(axis=2)
            elif outer == 1:
                y = x.reshape((K, red, inner)).mean(axis=1)
            else:
                y = x.reshape((K, outer, red, inner)).mean(axis=2).astype(_F32)
            t[outs[0]] = y.reshape(shape)
            return
        if code in _ELEM:
            y = self.elem._f(code, x, self._v(ins[1]))
        elif code == _FC:
            n = net.shape[ins[1]][1]
            y = _mm(x.reshape((K, -1, n)), _T(self._v(ins[1])))
            if len(ins) > 2 and ins[2] >= 0:
                y += self._v(ins[2])
        elif code == _MAXPOOL:
            g, n, disjoint = self.wins[i]
            xw = _padded(x, -3.4e38)[:, g]                  # [K, outputs, taps, C]
            self.saved[i] = xw
            y = np.full(xw.shape[:2] + xw.shape[3:], -3.4e38)     # (float64, as op_pool's)
            np.maximum(y, xw.max(axis=2), out=y)
        else:
            g, n, disjoint = self.wins[i]
            w = self._v(ins[1])
            R, KK = g.shape
            if code == _CONV:
                cols = _padded(x, 0.0)[:, g].reshape((K, R, -1))
                self.saved[i] = cols
                y = _mm(cols, _T(w)).astype(_F32)
            else:
                M = net.shape[outs[0]][1] // x.shape[2]
                xw = _padded(np.repeat(x, M, axis=2) if M > 1 else x, 0.0)[:, g]
                self.saved[i] = xw
                y = (xw * (w[:, None] if w.ndim == 3 else w[None, None])).sum(axis=2).astype(_F32)
            if len(ins) > 2 and ins[2] >= 0:
                y += self._v(ins[2])
        y = self.act(y, int(o[0])) if int(o[0]) else y
        t[outs[0]] = y if y.shape == shape else y.reshape(shape)

    def backward(self, dy):
        """The backward list from dL/d(output) [K, ...]; each weight updated as its
        gradient is complete (batch 1: utrain.sink.Apply)."""
        net = self.net
        self.g = {net.sk: dy}
        self.opt.begin()
        for oi, fl in net.bwd[net.head:]:
            outs = net.ops[oi][2]
            d = self.g.pop(outs[0], None)
            if d is not None:
                self._bwd(oi, self.ops[oi], d, fl)
        if self.flat:
            for name, W, G in self.flat:
                self.opt.step(name, W, G)
        elif self.flat is None:
            self._flatten()

    def _add_grad(self, k, d):
        old = self.g.get(k)
        self.g[k] = d if old is None else old + d

    def _bwd(self, i, op, dy, fl):
        code, ins, outs, o = op
        net, t, K = self.net, self.t, self.K
        xs = (K,) + net.shape[ins[0]]
        if code in _SHAPE:
            if fl & _DX:
                self._add_grad(ins[0], dy.reshape(xs))
            return
        if code == _MEAN:
            if fl & _DX:
                outer, red, inner = int(o[0]), int(o[1]), int(o[2])
                d = (dy * (1.0 / red)).reshape((K, outer, 1, inner))
                dx = np.zeros((K, outer, red, inner), dtype=_F32) + d
                if outer > 1 and inner > 1:
                    dx = dx.astype(_F32)
                self._add_grad(ins[0], dx.reshape(xs))
            return
        a = int(o[0])
        dz = self.act_grad(dy, t[outs[0]], a) if a else dy
        if code in _ELEM:
            self._bwd_elem(code, ins, o, dz, fl)
        elif code == _FC:
            self._bwd_fc(ins, dz, fl)
        elif code == _MAXPOOL:
            if fl & _DX:
                self._bwd_maxpool(i, ins, o, dz, xs)
        else:
            self._bwd_conv(i, code, ins, outs, o, dz, fl, xs)

    def _bwd_elem(self, code, ins, o, dz, fl):
        E = self.elem
        a, b = self._v(ins[0]), self._v(ins[1])
        p = int(o[1])
        for s in (0, 1):
            if not ((fl & _DX if s == 0 else ins[1] in self.net.gin)
                    or (fl & (_DWF | _DB) and p == s)):
                continue
            k = ins[s]
            rows, cols = self.net.shape[k]
            g = E._g(code, s, dz, a, b)
            if cols == 1 and g.shape[2] > 1:
                g = g.sum(axis=2).reshape((self.K, g.shape[1], 1))
            if rows == 1 and g.shape[1] > 1:
                g = g.sum(axis=1).reshape((self.K, 1, g.shape[2]))
            if p == s:
                self._update(k, g)
            else:
                self._add_grad(k, g)

    def _bwd_fc(self, ins, dz, fl):
        net, K = self.net, self.K
        o, n = net.shape[ins[1]]
        dz = dz.reshape((K, -1, o))
        if fl & _DX:
            dx = _mm(dz, self._v(ins[1]))
            self._add_grad(ins[0], dx.reshape((K,) + net.shape[ins[0]]))
        if fl & _DWF:
            x = self._v(ins[0]).reshape((K, -1, n))
            r = self.win.get(ins[1])
            lo, hi = (r[1], r[2]) if r is not None and r[0] == 0 else (0, o)
            u = dz[:, :, lo:hi]
            if x.shape[1] == 1:                 # an outer product (sink: step_outer)
                gw = u[:, 0, :, None] * x[:, 0, None, :]
            else:
                gw = _mm(_T(u), x)
            self._update(ins[1], gw)
        if fl & _DB:
            self._update(ins[2], dz if dz.shape[1] == 1 else dz.sum(axis=1)[:, None])

    def _bwd_maxpool(self, i, ins, o, dz, xs):
        g, n, disjoint = self.wins[i]
        xw = self.saved[i]
        K, R, KK, C = xw.shape
        # the max: the output itself when no activation follows (op_pool's)
        m = xw.max(axis=2) if int(o[0]) else self.t[self.net.ops[i][2][0]]
        eq = xw == m[:, :, None, :]
        first = eq.argmax(axis=2)                               # [K, R, C]
        give = np.where(eq.any(axis=2), dz, 0.0)
        d = np.zeros((K, n + 1, C), dtype=_F32)
        if disjoint:        # each x row in one window: its gradient stored at its tap
            hit = np.arange(KK)[None, None, :, None] == first[:, :, None, :]
            d[:, g] = np.where(hit, give[:, :, None, :], 0.0)
        else:
            src = g[np.arange(R)[None, :, None], first]         # its x row
            np.add.at(d, (np.arange(K)[:, None, None], src, np.arange(C)[None, None, :]), give)
        self._add_grad(ins[0], d[:, :n].reshape(xs))

    def _bwd_conv(self, i, code, ins, outs, o, dz, fl, xs):
        net, K = self.net, self.K
        g, n, disjoint = self.wins[i]
        R, KK = g.shape
        w = self._v(ins[1])
        if fl & _DB:
            self._update(ins[2], dz.sum(axis=1)[:, None])
        gw = None
        if fl & _DWF:
            if code == _CONV:
                gw = _mm(_T(dz), self.saved[i]).astype(_F32)
            else:
                gw = (dz[:, :, None, :] * self.saved[i]).sum(axis=1).astype(_F32)
        if fl & _DX:
            if code == _CONV:
                dx = _scatter(o, g, n, disjoint, _mm(dz, w).reshape((K, R, KK, -1)))
            else:
                ww = w[:, None] if w.ndim == 3 else w[None, None]
                dx = _scatter(o, g, n, disjoint, dz[:, :, None, :] * ww)
                M = net.shape[outs[0]][1] // xs[2]
                if M > 1:
                    dx = dx.reshape((K, n, xs[2], M)).sum(axis=3)
            self._add_grad(ins[0], dx.astype(_F32).reshape(xs))
        if gw is not None:                          # after dx: dx reads the old weight
            self._update(ins[1], gw)

    # -- losses and metrics (utrain.losses, per trial)
    def loss(self, y, lab):
        """(loss [K], dL/dy [K, ...]) of outputs y against targets lab."""
        kind = self.cfg['loss']
        if kind == 'mse':
            d = y - lab
            n = y.shape[1] * y.shape[2]
            return (d * d).sum(axis=(1, 2)) / n, d * (2.0 / n)
        if kind == 'scce':
            oh = np.zeros_like(y)
            oh[np.arange(self.K), 0, lab[:, 0, 0].astype(int)] = 1.0
            lab = oh
        if self.cfg['from_logits']:
            e = np.exp((y - y.max(axis=2, keepdims=True)) * 1.0)
            p = e / e.sum(axis=2, keepdims=True)
            return -(lab * np.log(p.clip(1e-30, 1.0))).sum(axis=(1, 2)), p - lab
        return (-(lab * np.log(y.clip(1e-7, 1.0))).sum(axis=(1, 2)),
                y - lab if self.net.head else -lab / np.maximum(y, 1e-20))

    def metric(self, y, lab):
        if self.cfg['metric'] == 'mae':
            return abs(y - lab).sum(axis=(1, 2)) / (y.shape[1] * y.shape[2])
        K = self.K
        if y.shape[1] * y.shape[2] == 1:
            cut = 0.0 if self.cfg['from_logits'] else 0.5
            return ((y[:, 0, 0] > cut) == (lab[:, 0, 0] > 0.5)).astype(float)
        want = lab[:, 0, 0].astype(int) if self.cfg['loss'] == 'scce' else \
            np.argmax(lab.reshape((K, -1)), axis=1)
        return (np.argmax(y.reshape((K, -1)), axis=1) == want).astype(float)

    def finite(self):
        """Per trial: are its trained weights finite (the trainer's epoch check)."""
        ok = np.ones(self.K, dtype=bool)
        for w in self.w.values():
            ok &= np.isfinite(w.reshape((self.K, -1)).sum(axis=1))
        return ok


def run(net, cfg, K, cuts, orders, tests, epochs, ranks=None):
    """Train K trials of net (settings cfg) and return each one's test metric mean (NaN
    for a trial that diverged).  cuts.batch([i_j]): ({cut tensor: [K, ...]}, targets
    [K, ...]) of trial j's training sample i_j (cuts.n samples each); orders(j, e):
    trial j's sample order in epoch e (None: file order); tests the same as cuts for
    the test samples; ranks: each trial's channel windows (Stack)."""
    if ranks and cfg.get('weight_decay') and any(r != ranks[0] for r in ranks):
        raise ValueError('trials with other windows stack only without weight decay')
    s = Stack(net, cfg, K, ranks)
    n_tr, n_te = cuts.n, tests.n
    for e in range(epochs):
        idx = [orders(j, e) for j in range(K)]
        for i in range(n_tr):
            c, lab = cuts.batch([idx[j][i] if idx[j] else i for j in range(K)])
            y = s.forward(c)
            l, dy = s.loss(y, lab)
            s.dead |= ~np.isfinite(l)
            s.backward(dy)
        s.dead |= ~s.finite()
    ms = np.zeros(K)
    for i in range(n_te):
        c, lab = tests.batch([i] * K)
        y = s.forward(c)
        ms += s.metric(y, lab)
    ms /= max(n_te, 1)
    ms[s.dead] = np.nan
    return ms
