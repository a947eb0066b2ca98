"""A float SGD trainer (numpy, batch 1, softmax cross-entropy) of an int8 TFLite/circle
graph's dequantized weights, with the int8 model's quantization switched on in parts:
the reference that splits an int8-against-float accuracy gap into its causes
(bench/sparse.py --split).

    FQNet(graph, trains, act=False, wq=False, scales=None, clip=127)

graph: host_tools.formats.ir.Graph of an int8 model (int8 weights with scales, int32
biases).  trains: {op index: (lo, hi)}: the output channels whose weights train (lo ==
hi: the bias alone, every channel's).  act: every op's output fake-quantized at its
tensor's scale and zero point (int8, clamped; the gradient passes where the int8 value is
inside the fused activation's and int8's range, as the int8 trainer's masks; scales:
{tensor: factor} changes a tensor's scale, the zero point kept); wq: the trained layers'
weights (True) or those of the ops in a set, fake-quantized on their int8 grid
(symmetric, per output channel, clamped at +-clip, 0: not clamped) in the forward pass
and the input gradient, updated as float masters (the straight-through estimator).
Neither: the float model trained in float.

Ops: CONV_2D, DEPTHWISE_CONV_2D (multiplier 1), FULLY_CONNECTED, PAD, ADD, MEAN (over H
and W), RESHAPE, SOFTMAX (the loss reads the logits before it).  Host only, float64."""
from __future__ import annotations

import numpy as np

ACT = {'NONE': (-np.inf, np.inf), 'RELU': (0.0, np.inf), 'RELU6': (0.0, 6.0),
       'RELU_N1_TO_1': (-1.0, 1.0), None: (-np.inf, np.inf)}


def _deq(t):
    q = t.quant
    s = np.asarray(q['scale'], np.float64)
    z = np.asarray(q.get('zero_point', [0]), np.float64)
    v = np.asarray(t.data, np.float64)
    if s.size > 1:
        shape = [1] * v.ndim
        shape[q.get('quantized_dimension', 0)] = -1
        s, z = s.reshape(shape), z.reshape(shape) if z.size > 1 else z
    return (v - z) * s


def _pads(n, k, s, same):
    out = -(-n // s) if same else (n - k) // s + 1
    tot = max((out - 1) * s + k - n, 0) if same else 0
    return out, tot // 2, tot - tot // 2


class FQNet:
    def __init__(self, g, trains, act=False, wq=False, first=None, scales=None, clip=127):
        self.g, self.trains, self.act, self.wq = g, dict(trains), act, wq
        self.clip = clip
        self.scales = scales or {}
        self.ops = [o for o in g.ops if o.name != 'SOFTMAX']
        self.const = {}
        for o in self.ops:
            for t in o.inputs[1:]:
                if t >= 0 and g.tensors[t].data is not None and t not in self.const:
                    tt = g.tensors[t]
                    self.const[t] = (_deq(tt) if tt.quant and tt.quant.get('scale') is not None
                                     and len(tt.quant['scale']) else np.asarray(tt.data))
        self.W = {i: self.const[self.ops[i].inputs[1]].copy() for i in self.trains}
        self.B = {i: self.const[self.ops[i].inputs[2]].copy() for i in self.trains}
        self.sw = {}
        for i in self.trains:
            q = g.tensors[self.ops[i].inputs[1]].quant
            self.sw[i] = np.asarray(q['scale'], np.float64)
        self.first = min(self.trains) if first is None else first

    def _w(self, i):
        # op i's weights as the forward pass reads them (trained: the master, on the int8
        # grid with wq: True, or the ops of a set)
        o = self.ops[i]
        if i not in self.W:
            return self.const[o.inputs[1]], self.const[o.inputs[2]] if len(
                o.inputs) > 2 and o.inputs[2] >= 0 else None
        W = self.W[i]
        if self.wq is True or (self.wq and i in self.wq):
            s = self.sw[i].reshape([-1] + [1] * (W.ndim - 1)) if self.sw[i].size > 1 else \
                self.sw[i]
            if o.name == 'DEPTHWISE_CONV_2D' and self.sw[i].size > 1:
                s = self.sw[i].reshape([1] * (W.ndim - 1) + [-1])
            W = np.round(W / s)
            W = (np.clip(W, -self.clip, self.clip) if self.clip else W) * s
        return W, self.B[i]

    def _fq(self, t, y, act):
        # the op's output as the int8 model holds it (act: the fused activation's range)
        lo, hi = ACT[act]
        m = (y > lo) & (y < hi)
        y = np.clip(y, lo, hi)
        if self.act:
            q = self.g.tensors[t].quant
            s, z = float(q['scale'][0]) * self.scales.get(t, 1.0), float(q['zero_point'][0])
            v = np.clip(np.round(y / s) + z, -128, 127)
            m &= (v > -128) & (v < 127)
            y = (v - z) * s
        return y, m

    def forward(self, x, start=0, keep=False, stop=None):
        """Logits of input x (the graph input's float values, or with start the input of
        op start; stop: the input of op stop instead); keep: the values the backward pass
        reads."""
        t = {}
        g = self.g
        t[self.ops[start].inputs[0]] = np.asarray(x, np.float64).reshape(
            g.tensors[self.ops[start].inputs[0]].shape[1:])
        self.saved = []
        for i in range(start, len(self.ops) if stop is None else stop):
            o = self.ops[i]
            a = o.options.get('fused_activation_function') if o.options else None
            x = t[o.inputs[0]]
            n = o.name
            aux = None
            if n in ('CONV_2D', 'DEPTHWISE_CONV_2D'):
                W, b = self._w(i)
                y, aux = self._conv(o, x, W, b)
            elif n == 'FULLY_CONNECTED':
                W, b = self._w(i)
                y = W @ x.ravel() + (0.0 if b is None else b)
            elif n == 'PAD':
                p = self.const[o.inputs[1]][1:]
                y = np.pad(x, [tuple(int(u) for u in v) for v in p])
            elif n == 'ADD':
                y = x + t[o.inputs[1]]
            elif n == 'MEAN':
                y = x.reshape(-1, x.shape[-1]).mean(0)
            elif n == 'RESHAPE':
                y = x.reshape(g.tensors[o.outputs[0]].shape[1:])
            else:
                raise ValueError('FQNet: op %s' % n)
            y, m = self._fq(o.outputs[0], y, a)
            t[o.outputs[0]] = y
            if keep and i >= self.first:
                self.saved.append((i, x, m, aux))
        return y if stop is None else t[self.ops[stop].inputs[0]]

    def _conv(self, o, x, W, b):
        op = o.options
        sh, sw = op.get('stride_h', 1), op.get('stride_w', 1)
        H, Wd, C = x.shape
        dw = o.name == 'DEPTHWISE_CONV_2D'
        KH, KW = W.shape[1], W.shape[2]
        same = op.get('padding') == 'SAME'
        OH, t0, t1 = _pads(H, KH, sh, same)
        OW, l0, l1 = _pads(Wd, KW, sw, same)
        xp = np.pad(x, ((t0, t1), (l0, l1), (0, 0)))
        taps = [xp[ky:ky + sh * (OH - 1) + 1:sh, kx:kx + sw * (OW - 1) + 1:sw, :]
                for ky in range(KH) for kx in range(KW)]
        if dw:
            w = W.reshape(KH * KW, -1)
            y = sum(taps[k] * w[k] for k in range(KH * KW))
        else:
            cols = np.concatenate(taps, -1).reshape(OH * OW, -1)    # [P, KH KW C]
            y = (cols @ W.reshape(W.shape[0], -1).T).reshape(OH, OW, -1)
        if b is not None:
            y = y + b
        return y, (xp.shape, x.shape, (t0, l0), taps, (KH, KW, sh, sw, OH, OW))

    def step(self, x, label, lr, start=0):
        """One SGD step on sample x (from op start's input) with class label; returns
        (loss, hit)."""
        z = self.forward(x, start, keep=True)
        e = np.exp(z - z.max())
        p = e / e.sum()
        loss = -np.log(p[label])
        hit = int(np.argmax(z) == label)
        dy = p.copy()
        dy[label] -= 1.0
        upd = []
        for i, x, m, aux in reversed(self.saved):
            o = self.ops[i]
            n = o.name
            dz = dy * m
            if n == 'MEAN':
                N = x.size // x.shape[-1]
                dy = np.broadcast_to(dz / N, x.shape)
                continue
            if n == 'RESHAPE':
                dy = dz.reshape(x.shape)
                continue
            if n not in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED'):
                raise ValueError('FQNet: no gradient through %s' % n)
            W, _ = self._w(i)
            if n == 'FULLY_CONNECTED':
                gW, gb = np.outer(dz, x.ravel()), dz
                dx = (W.T @ dz).reshape(x.shape) if i > self.first else None
            else:
                gW, gb, dx = self._conv_back(o, dz, W, aux, i > self.first)
            if i in self.trains:
                upd.append((i, gW, gb))
            dy = dx
        for i, gW, gb in upd:
            lo, hi = self.trains[i]
            if hi > lo:
                if self.ops[i].name == 'DEPTHWISE_CONV_2D':
                    self.W[i] -= lr * gW
                else:
                    self.W[i][lo:hi] -= lr * gW[lo:hi]
                self.B[i][lo:hi] -= lr * gb[lo:hi]
            else:
                self.B[i] -= lr * gb
        return loss, hit

    def _conv_back(self, o, dz, W, aux, need_dx):
        shape, xs, (t0, l0), taps, (KH, KW, sh, sw, OH, OW) = aux
        gb = dz.reshape(-1, dz.shape[-1]).sum(0)
        dxp = np.zeros(shape) if need_dx else None
        if o.name == 'DEPTHWISE_CONV_2D':
            w = W.reshape(KH * KW, -1)
            gW = np.stack([(dz * taps[k]).reshape(-1, dz.shape[-1]).sum(0)
                           for k in range(KH * KW)]).reshape(W.shape)
            if need_dx:
                k = 0
                for ky in range(KH):
                    for kx in range(KW):
                        dxp[ky:ky + sh * (OH - 1) + 1:sh, kx:kx + sw * (OW - 1) + 1:sw] += \
                            dz * w[k]
                        k += 1
        else:
            O = W.shape[0]
            cols = np.concatenate(taps, -1).reshape(OH * OW, -1)
            Z = dz.reshape(-1, O)
            gW = (Z.T @ cols).reshape(W.shape)
            if need_dx:
                dc = (Z @ W.reshape(O, -1)).reshape(OH, OW, KH * KW, -1)
                k = 0
                for ky in range(KH):
                    for kx in range(KW):
                        dxp[ky:ky + sh * (OH - 1) + 1:sh, kx:kx + sw * (OW - 1) + 1:sw] += \
                            dc[:, :, k]
                        k += 1
        dx = None
        if need_dx:
            H, Wd = xs[:2]
            dx = dxp[t0:t0 + H, l0:l0 + Wd]
        return gW, gb, dx
