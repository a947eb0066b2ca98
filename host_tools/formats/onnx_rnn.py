"""ONNX GRU and LSTM nodes unrolled into the device's ops, for the ONNX reader
(onnx_io._Reader mixes this class in; the device has no recurrent kernel).

Each direction: one FULLY_CONNECTED of the whole input sequence by W (+ Wb), split into
steps (SPLIT_V), then per step an FC of h by R (+ Rb) -- one weight tensor that every
step's FC reads, so the steps' gradients sum into it as PyTorch's autograd sums them --
and the gate arithmetic as LOGISTIC, TANH, MUL, ADD, SUB on H-wide pieces (one SPLIT_V
of the recurrent projection per step).  A zero initial h still goes through the
recurrent FC at step 0 (Rb trains there as in PyTorch): it is made as 0 times a slice of
the input projection.  The output sequence Y is kept as its steps' h (``_Reader.seq``):
Squeeze/Reshape/Transpose that keep each step in order move its time axis, a Gather or
Slice of one step is that step's h (PyTorch's ``y[:, -1]``), anything else reading Y
whole gets them concatenated.  W, R and B map back to the initializers by 'part' steps
(a direction's block of W, B's Wb and Rb halves), so export writes trained values back.
"""
from __future__ import annotations

import numpy as np


class RecurrentOps:
    """GRU/LSTM handlers and the lazy output sequence of the ONNX reader."""

    def _rnn_inputs(self, node, ins, a, gates):
        """Checks an ONNX GRU/LSTM node utrain unrolls; returns (T, I, H, D, x as [T, I],
        layout, directions: 0 forward, 1 reverse, in W's order)."""
        t = node.op_type
        d = a.get('direction', 'forward')
        dirs = {'forward': [0], 'reverse': [1], 'bidirectional': [0, 1]}.get(d)
        if dirs is None:
            self.err(f'direction {d!r} is not an ONNX direction')
        if 'clip' in a:
            self.err(f'clip {a["clip"]}: utrain unrolls {t}s without cell clipping')
        if a.get('input_forget', 0):
            self.err('input_forget=1 is not supported')
        default = {'GRU': ['Sigmoid', 'Tanh'], 'LSTM': ['Sigmoid', 'Tanh', 'Tanh'],
                   'RNN': ['Tanh']}[t]
        acts = list(a.get('activations', default * len(dirs)))
        if t == 'RNN' and len(set(acts)) == 1 and acts[0] in ('Tanh', 'Relu'):
            default = acts[:1]      # (nn.RNN(nonlinearity='relu'))
        if acts != default * len(dirs):
            self.err(f'activations {acts}: utrain unrolls {t}s with {default}')
        for k in (1, 2):
            if ins[k] not in self.const:
                self.err(f'input {k} ({ins[k]!r}) must be a constant (an initializer)')
        Wt, Rt = self.const[ins[1]], self.const[ins[2]]
        H = int(a.get('hidden_size', Rt.shape[-1]))
        D = len(dirs)
        if Wt.shape[:2] != (D, gates * H) or Rt.shape != (D, gates * H, H):
            self.err(f'W {list(Wt.shape)} / R {list(Rt.shape)} do not fit hidden_size {H} '
                     f'and {D} direction(s)')
        s = self.oshape(ins[0])
        lay = int(a.get('layout', 0))
        T, B, I = (s[1], s[0], s[2]) if lay else s
        if B != 1:
            self.err(f'batch {B}: utrain trains one sample at a time (batch axis 1)')
        if len(ins) > 4 and ins[4]:
            sl = self.const.get(ins[4])
            if sl is None or np.any(np.asarray(sl) != T):
                self.err('sequence_lens other than the full length are not supported')
        if t == 'LSTM' and len(ins) > 7 and ins[7] and \
                np.any(np.asarray(self.cval(ins[7], 'the peepholes')) != 0):
            self.err('peephole weights (P) are not supported')
        x = self.reshape_to(self.get(ins[0], 'plain'), [T, I], node.output[0] + '/x')
        return T, I, H, D, x, lay, dirs

    def _rnn_weight(self, v, d, n, shape, name):
        """Direction d's n elements from element d*n on of initializer v, shaped."""
        return self.init_const(name, v, [('part', d * n, (d + 1) * n), ('R', [n], list(shape))])

    def _rnn_state(self, node, v, d, D, H, xp, what):
        """Direction d's initial state as a [1, H] activation, or None for a zero c.  A
        zero h still goes through the recurrent FC (its bias trains at step 0, as in
        PyTorch): it is made as 0 times a slice of step 0's input projection; a nonzero
        constant is added to that (and trains as the initial state)."""
        base = f'{node.output[0]}/{what}{d}'
        if v and v not in self.const:
            x = self.reshape_to(self.get(v, 'plain'), [D, H], base + '/all')
            if D == 1:
                return x
            ks = [self.tensor(f'{base}/{w}', [2], np.array(z, np.int32)) for w, z in
                  (('begin', [d, 0]), ('end', [d + 1, H]), ('strides', [1, 1]))]
            return self._ir('STRIDED_SLICE', [x] + ks, base, [1, H])
        c = np.asarray(self.const[v], np.float32).reshape(D, H)[d:d + 1] if v else \
            np.zeros((1, H), np.float32)
        if what == 'c0' and not c.any():
            return None             # f * c0 is 0: the first cell state is i * g
        r = len(self.tensors[xp].shape)
        ks = [self.tensor(f'{base}/{w}', [r], np.array(z, np.int32)) for w, z in
              (('begin', [0] * r), ('end', [1] * (r - 1) + [H]), ('strides', [1] * r))]
        sl = self._ir('STRIDED_SLICE', [xp] + ks, base + '/slice', [1, H])
        z = self._ir('MUL', [sl, self._scalar(base + '/zero_k', 0.0)], base + '/zero')
        if not c.any():
            return z
        k = self._rnn_weight(v, d, H, [1, H], base + '/value')
        return self._ir('ADD', [z, k], base)

    def _split(self, x, sizes, axis, names):
        outs = []
        for n, nm in zip(sizes, names):
            sh = list(self.tensors[x].shape)
            sh[axis] = n
            outs.append(self.tensor(nm, sh))
        base = self.tensors[x].name
        sz = self.tensor(base + '/split_sizes', [len(sizes)], np.array(sizes, np.int32))
        ax = self.tensor(base + '/split_axis', [], np.array(axis, np.int32))
        self.emit('SPLIT_V', [x, sz, ax], outs, num_splits=len(sizes))
        return outs

    def _steps(self, x, T, names):
        return self._split(x, [1] * T, 0, names) if T > 1 else [x]

    def _rnn(self, node, ins, a, gates, cell):
        """Unrolls each direction: the input projection of the whole sequence (one FC
        by that direction's W and Wb), split into steps, then cell(...) per step in
        the direction's order; Y kept as the steps' h, Y_h and Y_c the last states."""
        T, I, H, D, x, lay, dirs = self._rnn_inputs(node, ins, a, gates)
        G = gates * H
        hasb = len(ins) > 3 and bool(ins[3])
        per = []
        for d, rev in enumerate(dirs):
            n = f'{node.output[0]}/{"fb"[rev]}/'
            W = self._rnn_weight(ins[1], d, G * I, [G, I], n + 'W')
            Wb = self._rnn_weight(ins[3], 2 * d, G, [G], n + 'Wb') if hasb else -1
            xp = self._ir('FULLY_CONNECTED', [x, W, Wb], n + 'xproj', [T, G],
                          keep_num_dims=False)
            h = self._rnn_state(node, ins[5] if len(ins) > 5 else '', d, D, H, xp, 'h0')
            c = self._rnn_state(node, ins[6] if len(ins) > 6 else '', d, D, H, xp, 'c0') \
                if gates == 4 else None
            hs = [None] * T
            order = range(T - 1, -1, -1) if rev else range(T)
            step = cell(n, d, ins, hasb, xp, T)
            for t in order:
                h, c = step(t, h, c)
                hs[t] = h
            per.append((hs, h, c))
        outs = list(node.output) + ['', '', '']
        if outs[0]:
            self.shape[outs[0]] = [1, T, D, H] if lay else [T, D, 1, H]
            self.seq[outs[0]] = ([tuple(p[0][t] for p in per) if D > 1 else per[0][0][t]
                                  for t in range(T)], 1 if lay else 0)
        read = {o.name for o in self.model.graph.output} | set(self.consumers)
        for v, j in ((outs[1], 1), (outs[2], 2)):
            if v and v in read:         # Y_h / Y_c nothing reads: no op
                sh = [1, D, H] if lay else [D, 1, H]
                k = per[0][j] if D == 1 else self._ir(
                    'CONCATENATION', [p[j] for p in per], v + '/directions', [D, H], axis=0)
                self.reshape_to(k, sh, out=self.out(v, 'plain', sh))

    def op_GRU(self, node, ins, a, i):
        """ONNX GRU (gates z, r, h), one layer, forward, reverse or both: per step an FC
        of h by R (+ Rb; one weight tensor read by every step), LOGISTIC, TANH, MUL, ADD,
        SUB; as PyTorch exports nn.GRU (linear_before_reset=1), or with the reset gate
        before R (0)."""
        lbr = int(a.get('linear_before_reset', 0))
        H = self.const[ins[2]].shape[-1] if ins[2] in self.const else 0

        def cell(n, d, ins, hasb, xp, T):
            G = 3 * H
            if lbr:
                R = [self._rnn_weight(ins[2], d, G * H, [G, H], n + 'R')]
                Rb = [self._rnn_weight(ins[3], 2 * d + 1, G, [G], n + 'Rb') if hasb else -1]
            else:               # R's and Rb's z, r rows apart from the h rows
                r0, b0 = d * G * H, (2 * d + 1) * G      # this direction's R, Rb
                R = [self.init_const(n + 'Rzr', ins[2], [('part', r0, r0 + 2 * H * H),
                                                         ('R', [2 * H * H], [2 * H, H])]),
                     self.init_const(n + 'Rh', ins[2], [('part', r0 + 2 * H * H, r0 + G * H),
                                                        ('R', [H * H], [H, H])])]
                Rb = [self.init_const(n + 'Rbzr', ins[3], [('part', b0, b0 + 2 * H)]),
                      self.init_const(n + 'Rbh', ins[3], [('part', b0 + 2 * H, b0 + G)])] \
                    if hasb else [-1, -1]
            # gate by gate (one split per step, of H-wide pieces: the split's gradient
            # buffer is held from forward to backward; one per step, not three)
            xg = [self._steps(k, T, [f'{n}x{w}{t}' for t in range(T)]) for k, w in zip(
                self._split(xp, [H, H, H], 1, [n + 'xz', n + 'xr', n + 'xh']), 'zrh')]

            def step(t, h, c):
                m = f'{n}t{t}/'
                hp = self._ir('FULLY_CONNECTED', [h, R[0], Rb[0]], m + 'hproj',
                              [1, G if lbr else 2 * H])
                hg = self._split(hp, [H] * (3 if lbr else 2), 1,
                                 [m + 'hz', m + 'hr', m + 'hh'][:3 if lbr else 2])
                z, r = (self._ir('LOGISTIC', [self._ir('ADD', [xg[j][t], hg[j]], m + w + '_pre')],
                                 m + w) for j, w in enumerate('zr'))
                xh = xg[2]
                if lbr:
                    hh = hg[2]
                    rh = self._ir('MUL', [r, hh], m + 'r_hh')
                else:
                    rh = self._ir('FULLY_CONNECTED', [self._ir('MUL', [r, h], m + 'r_h'),
                                                      R[1], Rb[1]], m + 'r_hh', [1, H])
                nn_ = self._ir('TANH', [self._ir('ADD', [xh[t], rh], m + 'n_pre')], m + 'n')
                dd = self._ir('SUB', [h, nn_], m + 'h_minus_n')
                return self._ir('ADD', [nn_, self._ir('MUL', [z, dd], m + 'z_d')], m + 'h'), None
            return step
        self._rnn(node, ins, a, 3, cell)

    def op_LSTM(self, node, ins, a, i):
        """ONNX LSTM (gates i, o, f, c), one layer, forward, reverse or both, no
        peepholes: per step an FC of h by R (+ Rb; one weight tensor read by every
        step), ADD, LOGISTIC of i, o, f, TANH of the cell input, c = f c + i g,
        h = o tanh(c) (nn.LSTM as PyTorch exports it)."""
        H = self.const[ins[2]].shape[-1] if ins[2] in self.const else 0

        def cell(n, d, ins, hasb, xp, T):
            G = 4 * H
            R = self._rnn_weight(ins[2], d, G * H, [G, H], n + 'R')
            Rb = self._rnn_weight(ins[3], 2 * d + 1, G, [G], n + 'Rb') if hasb else -1
            xs = self._steps(xp, T, [f'{n}x{t}' for t in range(T)])

            def step(t, h, c):
                m = f'{n}t{t}/'
                hp = self._ir('FULLY_CONNECTED', [h, R, Rb], m + 'hproj', [1, G])
                pre = self._ir('ADD', [xs[t], hp], m + 'pre')
                gates = self._split(pre, [H] * 4, 1, [m + w + '_pre' for w in 'iofg'])
                ig, og, fg = (self._ir('LOGISTIC', [k], m + w) for k, w in zip(gates, 'iof'))
                g = self._ir('TANH', [gates[3]], m + 'g')
                cin = self._ir('MUL', [ig, g], m + 'i_g')
                c = cin if c is None else self._ir(
                    'ADD', [self._ir('MUL', [fg, c], m + 'f_c'), cin], m + 'c')
                return self._ir('MUL', [og, self._ir('TANH', [c], m + 'tanh_c')], m + 'h'), c
            return step
        self._rnn(node, ins, a, 4, cell)

    def op_RNN(self, node, ins, a, i):
        """ONNX RNN (nn.RNN, Elman: h = act(x W + Wb + h R + Rb), act Tanh or Relu), one
        layer, forward, reverse or both: per step an FC of h by R (+ Rb; one weight
        tensor read by every step), ADD, TANH or RELU.  It had been refused ('cannot read
        ONNX op RNN')."""
        H = self.const[ins[2]].shape[-1] if ins[2] in self.const else 0
        act = 'RELU' if list(a.get('activations', ['Tanh']))[0] == 'Relu' else 'TANH'

        def cell(n, d, ins, hasb, xp, T):
            R = self._rnn_weight(ins[2], d, H * H, [H, H], n + 'R')
            Rb = self._rnn_weight(ins[3], 2 * d + 1, H, [H], n + 'Rb') if hasb else -1
            xs = self._steps(xp, T, [f'{n}x{t}' for t in range(T)])

            def step(t, h, c):
                m = f'{n}t{t}/'
                hp = self._ir('FULLY_CONNECTED', [h, R, Rb], m + 'hproj', [1, H])
                return self._ir(act, [self._ir('ADD', [xs[t], hp], m + 'pre')], m + 'h'), None
            return step
        self._rnn(node, ins, a, 1, cell)

    def _seq_step(self, v, k):
        """Step k of sequence v as one IR tensor (both directions' h concatenated)."""
        hs = self.seq[v][0]
        if isinstance(hs[k], tuple):
            H = self.tensors[hs[k][0]].shape[-1]
            hs[k] = self._ir('CONCATENATION', list(hs[k]), f'{v}/step{k}', [len(hs[k]), H],
                             axis=0)
        return hs[k]

    def _seq_op(self, node, ins, a):
        """An op on an RNN's Y kept as its steps: Squeeze/Unsqueeze/Reshape/Transpose
        that keep each step's values in order move the time axis, Gather/Slice of one
        step is that step's h (y[:, -1] reads the last step, no concatenation of all).
        False: the op reads Y whole (it is concatenated)."""
        v, t, o = ins[0], node.op_type, node.output[0]
        hs, tax = self.seq[v]
        s = self.oshape(v)
        r = len(s)
        T = s[tax]
        if t in ('Identity', 'Dropout'):
            self.alias(o, v)
            return True
        if t in ('Squeeze', 'Unsqueeze', 'Reshape', 'Flatten'):
            out = self.oshape(o) if o in self.shape else None
            if t == 'Squeeze':
                axes = self._axes(ins, a)
                axes = {x % r for x in axes} if axes is not None else \
                    {d for d, n in enumerate(s) if n == 1}
                out = [n for d, n in enumerate(s) if d not in axes]
            elif t == 'Unsqueeze':
                axes = self._axes(ins, a)
                m = r + len(axes)
                out = list(s)
                for ax in sorted(x % m for x in axes):
                    out.insert(ax, 1)
            elif t == 'Reshape':
                want = [int(x) for x in self.cval(ins[1], 'the shape')]
                want = [s[j] if x == 0 and not a.get('allowzero') else x
                        for j, x in enumerate(want)]
                out = list(np.empty(s, np.int8).reshape(want).shape)
            elif out is None:
                return False
            before = int(np.prod(s[:tax]))
            ntax = [j for j in range(len(out)) if out[j] == T and
                    int(np.prod(out[:j])) == before]
            if not ntax:
                return False            # the time axis is merged with another
            ntax = ntax[0]
        elif t == 'Transpose':
            p = list(a.get('perm', list(range(r))[::-1]))
            out, ntax = [s[d] for d in p], p.index(tax)
            inner = [d for d in p if d != tax and s[d] != 1]
            if inner != sorted(inner) or int(np.prod(out[:ntax])) != 1 or \
                    int(np.prod(s[:tax])) != 1:
                return False            # a step's values would move
        elif t in ('Gather', 'Slice'):
            if t == 'Gather':
                idx = np.asarray(self.const.get(ins[1], np.zeros((2,))))
                if int(a.get('axis', 0)) % r != tax or idx.ndim != 0:
                    return False
                k = int(idx) % T
                out = s[:tax] + s[tax + 1:]
            else:
                b, e, st = self._slice_args(ins, a, s)
                if any((b[d], e[d]) != (0, s[d]) for d in range(r) if d != tax) or \
                        e[tax] - b[tax] != 1:
                    return False
                k, out = b[tax], s[:tax] + [1] + s[tax + 1:]
            if int(np.prod(s[:tax])) != 1:
                return False
            self.reshape_to(self._seq_step(v, k), out, out=self.out(o, 'plain', out))
            return True
        else:
            return False
        self.seq[o] = (hs, ntax)
        self.shape[o] = out
        return True

    def _seq_materialize(self, v):
        """Y read whole: the steps' h concatenated along the time axis."""
        hs, tax = self.seq[v]
        s = self.oshape(v)
        rest = s[:tax] + s[tax + 1:]
        n = int(np.prod(rest))
        parts = []
        for k in range(len(hs)):
            x = self._seq_step(v, k)
            parts.append(x if self.tensors[x].shape == [1, n] else
                         self.reshape_to(x, [1, n], f'{v}/row{k}'))
        cat = self._ir('CONCATENATION', parts, v + '/steps', [len(hs), n], axis=0)
        if all(m == 1 for m in s[:tax]):
            self.reshape_to(cat, s, out=self.out(v, 'plain', s))
            return
        y = self.reshape_to(cat, [len(hs)] + rest, v + '/time_first')
        p = list(range(1, tax + 1)) + [0] + list(range(tax + 1, len(s)))
        self.emit('TRANSPOSE', [y, self.perm_const(v, p)], [self.out(v, 'plain', s)])
