# Row-band execution of a frozen chain (docs/memory.md, "Frozen layers a few rows at a
# time"), as MCUNetV2's patch-based inference: the ops lo..hi-1 of a band group
# (CONV_2D, DEPTHWISE_CONV_2D, PAD on H/W, same-shape ADD; none trains, none keeps an
# activation for backward) compute their outputs a few rows at a time.  Every tensor
# the group makes and uses itself lives as a window of rows (its rows base..done-1 in
# a [cap*W, C] array); a window drops the rows no consumer will read again.  Tensors the
# group hands to later ops are made whole.  The group's first inputs are whole (the
# sample, or an activation made before it).
# Pull order: for band e (rows of the group's outputs up to e) an op first pulls the
# input rows its outputs up to e need -- conv: input rows up to (e-1)*stride - pad top
# + (KH-1)*dilation + 1 -- then computes its new rows with its own kernel on a view of
# the input window (options rewritten: H, OH, pad top for that strip; walk() skips
# padding rows as for the whole image), so the result equals the whole op's (bit for bit
# with ulab and the fallback; numpy's BLAS may sum a strip in another order).
# plan() runs the same schedule without arithmetic: the window sizes, which the host's
# planner (host_tools/plan/memory.py) reads from the same code.
# Group record in the .flat: (lo, hi, rows per band): host_tools/graph/bands.py chooses them.
try:
    from micropython import const
except ImportError:
    def const(x):
        return x
_ADD = const(0)
_CONV_2D = const(3)
_DEPTHWISE_CONV_2D = const(4)
_PAD = const(34)
_ELEM = const(-2)         # (utrain.q8bands' stand-in: an elementwise op of its first input)
_ACT = const(0)
_G_H = const(1)
_G_W = const(2)
_G_OH = const(4)
_G_OW = const(5)
_G_KH = const(7)
_G_SH = const(9)
_G_DH = const(11)
_G_PT = const(13)
_G_PL = const(14)
_C_NB = const(1)          # PAD's copy plan (op_shape): input rows (H) when it pads W,
_C_N1 = const(2)          # rows per block (W), and the block's first row in the output
_C_B = const(13)
SPATIAL = (_CONV_2D, _DEPTHWISE_CONV_2D)


class Group:
    """Band group lo..hi-1 of net (ops, shape, free_infer; the host passes a stand-in)
    computed `rows` output rows at a time."""

    def __init__(self, net, lo, hi, rows):
        self.net, self.lo, self.hi, self.rows = net, lo, hi, rows
        ops = net.ops
        dims = {}          # tensor -> (H, W)
        self.rule = rule = {}   # op -> (stride, pad top, reach): out rows [a, b) read
        self.acts = acts = {}   # input rows [a*s - pt, (b-1)*s - pt + reach)
        self.prod = prod = {}
        for i in range(lo, hi):
            code, ins, outs, o = ops[i]
            prod[outs[0]] = i
            if code in SPATIAL:
                dims[ins[0]] = (int(o[_G_H]), int(o[_G_W]))
                dims[outs[0]] = (int(o[_G_OH]), int(o[_G_OW]))
                rule[i] = (int(o[_G_SH]), int(o[_G_PT]), (int(o[_G_KH]) - 1) * int(o[_G_DH]) + 1)
                acts[i] = (ins[0],)
            elif code == _ADD:
                rule[i] = (1, 0, 1)
                acts[i] = (ins[0], ins[1])
            elif code == _ELEM:
                rule[i] = (1, 0, 1)
                acts[i] = (ins[0],)
            elif code == _PAD:
                acts[i] = (ins[0],)
            else:
                raise ValueError('op %d (code %d) cannot run in row bands' % (i, code))
        for _ in range(hi - lo):        # ADD and PAD take their rows from their neighbours
            for i in range(lo, hi):
                code, ins, outs, o = ops[i]
                if code == _ADD or code == _ELEM:
                    ks = (ins[0], outs[0]) if code == _ELEM else (ins[0], ins[1], outs[0])
                    d = None
                    for k in ks:
                        d = d or dims.get(k)
                    if d:
                        for k in ks:
                            dims[k] = d
                elif code == _PAD and outs[0] in dims:
                    OW = dims[outs[0]][1]
                    pt, pl = divmod(int(o[_C_B]), OW)
                    rule[i] = (1, pt, 1)
                    self.rule[-1 - i] = pl
                    if ins[0] not in dims:      # the model's input: its copy plan's blocks
                        n = net.shape[ins[0]][0]
                        W = int(o[_C_N1]) if int(o[_C_NB]) > 1 else OW
                        if n % W == 0:
                            dims[ins[0]] = (n // W, W)
        self.dims = dims
        # a PAD read by one conv of the group alone is folded into that conv's padding
        # (walk() skips padding rows and columns): the padded tensor is never made
        self.fold = fold = {}
        for i in range(lo, hi):
            code, ins, outs, o = ops[i]
            if code == _PAD and i in rule:
                c = [j for j in range(lo, hi) if outs[0] in ops[j][1]]
                if len(c) == 1 and ops[c[0]][0] in SPATIAL and outs[0] in net.free_infer[c[0]]:
                    c = c[0]
                    s, pt, reach = rule[c]
                    rule[c] = (s, pt + rule[i][1], reach)
                    fold[c] = self.rule.pop(-1 - i)
                    acts[c] = acts[i]
                    fold[i] = None
                    del prod[outs[0]], acts[i]
        for i in range(lo, hi):
            if i in fold and fold[i] is None:
                continue
            for k in acts[i] + (ops[i][2][0],):
                if k not in dims or i not in rule:
                    raise ValueError('op %d: tensor %d has no row geometry' % (i, k))
        inner = set()
        for i in range(lo, hi):
            inner.update(net.free_infer[i])
        # windows: made and used here; whole: handed on (or the group's own inputs)
        self.win = [k for k in prod if k in inner]
        self.outs = [k for k in prod if k not in inner]
        self.cons = cons = {}
        for i in acts:
            for k in acts[i]:
                cons.setdefault(k, []).append(i)
        self.cap = self.buf = None

    def _start(self):
        self.done, self.base = {}, {}
        for k in self.dims:
            self.done[k] = 0 if k in self.prod else self.dims[k][0]
            self.base[k] = 0

    def _keep(self, k):
        # the first row of k a consumer will still read
        lo = None
        done, rule, ops = self.done, self.rule, self.net.ops
        for c in self.cons.get(k, ()):
            s, pt, _ = rule[c]
            r = max(0, done[ops[c][2][0]] * s - pt)
            lo = r if lo is None or r < lo else lo
        return self.done[k] if lo is None else lo

    def _need(self, k, e):
        # rows of k up to e, `rows` output rows per step: each step pulls only the input
        # rows it reads, then drops what nobody reads again (windows hold the kernel's
        # reach, not a band's worth of every tensor).  A stack of [tensor, rows, the
        # step's first row, its next input], not recursion: a step a layer deep (21
        # layers, MobileNetV2 at 128x128) passed a Pico's recursion limit
        done = self.done
        if done[k] >= e:
            return
        R, plan = self.rows, self.plan_only
        st = [[k, e, done[k], 0]]
        while st:
            fr = st[-1]
            k, e, r, n = fr
            i = self.prod[k]
            s, pt, reach = self.rule[i]
            f = min(e, r + R)
            acts = self.acts[i]
            if n < len(acts):       # its inputs' rows first, one at a time
                fr[3] = n + 1
                j = acts[n]
                m = min(self.dims[j][0], (f - 1) * s - pt + reach)
                if done[j] < m:
                    st.append([j, m, done[j], 0])
                continue
            if k in self.cap_of:            # a window: drop rows nobody reads again
                b = self._keep(k)
                if b > self.base[k]:
                    self._shift(k, b)
                if plan:
                    self.cap_of[k] = max(self.cap_of[k], f - self.base[k])
            if plan:
                sp = self.step
                sp[i] = max(sp.get(i, 0), f - r)
                for j in acts:          # input rows one step reads at most
                    if j not in self.prod:
                        m = min(self.dims[j][0], (f - 1) * s - pt + reach) - max(0, r * s - pt)
                        self.span[j] = max(self.span.get(j, 0), m)
            else:
                self._compute(i, k, r, f)
            done[k] = f
            if f < e:
                fr[2], fr[3] = f, 0
            else:
                st.pop()

    def _shift(self, k, b):
        base = self.base[k]
        if not self.plan_only:
            W = self.dims[k][1]
            a, n, m = self.buf[k], self.done[k] - b, b - base
            # move rows b..done-1 to the top, m rows at a time (no overlap in one copy)
            for r in range(0, n, m):
                c = min(m, n - r)
                a[r * W:(r + c) * W] = a[(r + m) * W:(r + m + c) * W]
        self.base[k] = b

    def _rows(self, k, a, b):
        # rows a..b-1 of tensor k: a view of its window, or of the whole array, or read
        # from the sample's file into a strip (the model's input as Rows)
        W, base = self.dims[k][1], self.base[k]
        x = self.buf[k] if k in self.buf else self.net.t[k]
        if isinstance(x, Rows):
            return x.read(a * W, self.strip[k][:(b - a) * W])
        return x[(a - base) * W:(b - base) * W]

    def _compute(self, i, k, d, e):
        net = self.net
        code, ins, outs, o = net.ops[i]
        OW = self.dims[k][1]
        dst = self._rows(k, d, e)
        if code == _ADD:
            from utrain.op_act import act
            dst[:] = act(self._rows(ins[0], d, e) + self._rows(ins[1], d, e), int(o[_ACT]))
            return
        x = self.acts[i][0]
        H, W = self.dims[x]
        s, pt, reach = self.rule[i]
        if code == _PAD:
            pl = self.rule[-1 - i]
            dst[:] = 0.0
            for r in range(max(d, pt), min(e, pt + H)):
                v = dst[(r - d) * OW + pl:(r - d) * OW + pl + W]
                v[:] = self._rows(x, r - pt, r - pt + 1)
            return
        a, b = max(0, d * s - pt), min(H, (e - 1) * s - pt + reach)
        o2 = o[:]
        o2[_G_H], o2[_G_OH], o2[_G_PT] = b - a, e - d, pt + a - d * s
        if i in self.fold:          # reads the PAD's input: its padding is the conv's
            o2[_G_W] = W
            o2[_G_PL] = o[_G_PL] + self.fold[i]
        t, sh, st = net.t, net.shape, net.stream
        x = ins[0]
        keep, full = t[x], sh[k]
        t[x] = self._rows(self.acts[i][0], a, b)
        sh[k] = ((e - d) * OW, full[1])
        if st:
            st.fetch(i)
        net.mods[i].forward(net, (code, ins, outs, o2))
        if st:
            st.drop(i)
        dst[:] = t[k]
        t[x], t[k], sh[k] = keep, None, full

    def _run(self):
        self._start()
        R = self.rows
        H = max(self.dims[k][0] for k in self.outs)
        for e in range(R, H + R, R):
            for k in self.outs:
                Hk = self.dims[k][0]
                self._need(k, min(Hk, -(-e * Hk // H)))

    def plan(self):
        """Rows each window holds at most ({tensor: rows}), and each op's largest step
        in output rows ({op: rows}); computes nothing."""
        if self.cap is None:
            self.plan_only = True
            self.cap_of = dict((k, 0) for k in self.win)
            self.step, self.span = {}, {}
            self._run()
            self.cap = self.cap_of
        return self.cap

    def run(self, free):
        """Compute the group's outputs into net.t; frees what the group's ops free."""
        from utrain.xnp import zeros  # (q8bands' int8 groups load no float code)
        cap = self.plan()
        net = self.net
        if net.stream:
            net.stream.ready(self.lo)
        self.plan_only = False
        self.buf = buf = {}
        self.strip = {}
        for k in self.span:
            if isinstance(net.t[k], Rows):
                self.strip[k] = zeros((self.span[k] * self.dims[k][1], net.shape[k][1]))
        for k in self.outs:
            buf[k] = zeros(net.shape[k])
        for k in self.win:
            buf[k] = zeros((cap[k] * self.dims[k][1], net.shape[k][1]))
        self._run()
        t = net.t
        for k in self.outs:
            t[k] = buf[k]
        self.buf = self.strip = None
        for i in range(self.lo, self.hi):
            for k in free[i]:
                t[k] = None


class Rows:
    """The model's input of sample j of Dataset ds, read a strip of rows at a time by
    the band group that takes it (the whole sample is never in the heap)."""

    def __init__(self, ds, j):
        self.ds, self.j = ds, j

    def read(self, r, a):
        # device rows r.. of the sample's x into a (float32 or quantized samples)
        from utrain.xnp import np, readinto, decode
        ds = self.ds
        n = a.shape[0] * a.shape[1]
        f, q = ds.f, ds.xq()
        f.seek(ds.head + self.j * ds.rec + (ds.xbytes // ds.x_len) * r * a.shape[1])
        if q is None:
            readinto(f, a, ds.path)
        else:
            q = memoryview(q)[:n]
            if f.readinto(q) != n:
                raise ValueError('%s: truncated' % ds.path)
            decode(q, a, ds.xs, ds.xo)
        s = np.sum(a)
        if not -3e38 < s < 3e38:
            raise ValueError('%s: sample %d holds NaN or Inf' % (self.ds.path, self.j))
        return a


BAND = '<HHH'       # the .flat's band table: per group first op, op after it, rows per band


def table(b, nops, name, err):
    """{first op: (op after the group, rows per band)} from the .flat's band table b."""
    from struct import unpack_from
    bands = {}
    for i in range(len(b) // 6):
        lo, hi, rows = unpack_from(BAND, b, 6 * i)
        if not lo < hi <= nops or not rows:
            raise err('%s: bad band group %d (ops %d..%d, %d rows)' % (name, i, lo, hi - 1, rows))
        bands[lo] = (hi, rows)
    return bands


def rows(net):
    """Rows when the band group at op 0 is the only reader of the model's input (the
    trainer then hands it Rows instead of the sample), else None."""
    b = net.bands
    if 0 not in b:
        return None
    k = net.inputs[0]
    hi = b[0].hi if isinstance(b[0], Group) else b[0][0]
    for i in range(hi, len(net.ops)):
        if k in net.ops[i][1]:
            return None
    return Rows


def run(net, i, free):
    """Run the band group starting at op i; returns the op after it."""
    b = net.bands
    if not isinstance(b[i], Group):
        for lo in b:
            if not isinstance(b[lo], Group):
                b[lo] = Group(net, lo, b[lo][0], b[lo][1])
                b[lo].plan()
    g = b[i]
    g.run(free)
    return g.hi
