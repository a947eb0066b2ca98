# Row bands for int8 layers (utrain.q8): the early high-resolution frozen layers of a
# model such as MobileNetV2 (convolutions, same-shape ADDs, MAX_POOL_2D and
# AVERAGE_POOL_2D, elementwise LUT layers) computed a few output rows at a time, on utrain.bands'
# schedule (Group: which rows each op pulls, windows that drop the rows nobody reads
# again), with q8's int8 kernels and the windows at the arena offsets the host planned
# (host_tools/prepare/quant.py plan(): it runs the same schedule to size them).  Imported only
# by a model with band groups.
from array import array
from utrain.bands import Group
from utrain import q8kern as K

_CONV = 1   # q8.CONV
_DW = 2     # q8.DW
_MEAN = 3   # q8.MEAN
_ADD = 4    # q8.ADD
_PMAX = 5   # q8.PMAX
_PAVG = 6   # q8.PAVG
_LUT = 8    # q8.LUT


class _Net:
    pass


def frees(layers, first):
    """Per layer, the tensors its run is the last to read (none that the backward pass
    reads: the inputs of pools and of layers whose weights train, the outputs of pools
    and of layers that keep no mask of them; nor the last output)."""
    last, keep = {}, set()
    for i in range(len(layers)):
        d = layers[i]
        for k in d['in']:
            last[k] = i
        if i >= first:
            tw = d.get('tw')
            pool = _PMAX <= d['k'] <= _PAVG
            if pool or d['k'] == _LUT or d.get('kx') or (d.get('train') and not (
                    tw and tw[1] <= tw[0])):      # (kx: a MUL's, utrain.q8bin)
                keep.update(d['in'])
            if pool or (d['k'] < _MEAN and not d.get('mask')) or d.get('cl'):
                keep.add(d['out'])      # (a clamping CAT's: its gradient's mask)
    keep.add(layers[-1]['out'])
    out = [[] for _ in layers]
    for k in last:
        if k not in keep:
            out[last[k]].append(k)
    return out


def standin(layers, free):
    """What bands.Group reads of a net (ops as (code, ins, outs, options) with the float
    path's op codes and geometry slots, free_infer), and each tensor's channels."""
    ops, ch = [], {}
    for d in layers:
        k = d['k']
        o = [0] * 15
        code = -1
        if k == _CONV or k == _DW or _PMAX <= k <= _PAVG:     # (a pool: g as a conv's)
            H, W, I, O, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw = d['g']
            o[1], o[2], o[4], o[5], o[7], o[9], o[11], o[13], o[14] = (H, W, OH, OW, KH, sh, dh,
                                                                       ph, pw)
            code = 3 if k == _CONV else 4
            ch[d['in'][0]] = I
            ch[d['out']] = O
        elif k == _ADD:
            code = 0
        elif k == _LUT and 'sm' not in d:      # elementwise (utrain.bands' _ELEM)
            code = -2
        ops.append((code, tuple(d['in']), (d['out'],), o))
    for _ in range(2):
        for d in layers:
            if d['k'] == _ADD or d['k'] == _LUT:
                ks = [d['out']] + d['in'][:2 if d['k'] == _ADD else 1]
                c = None
                for k in ks:
                    c = c or ch.get(k)
                if c:
                    for k in ks:
                        ch[k] = c
    n = _Net()
    n.ops, n.free_infer, n.ch = ops, free, ch
    return n


class Q8Group(Group):
    """Band group lo..hi-1 of Q8Net q, `rows` output rows a step."""

    def __init__(self, q, lo, hi, rows, net=None):
        if net is None:
            ls = q.meta['layers']
            net = standin(ls[:hi], frees(ls, q.first)[:hi])
        Group.__init__(self, net, lo, hi, rows)
        self.q = q
        self.ch = net.ch
        self.gm = array('i', [0] * 14)
        self.strip = None

    def nbytes(self, k):
        # bytes of tensor k's window (after plan())
        return self.cap[k] * self.dims[k][1] * self.ch[k]

    def _shift(self, k, b):
        base = self.base[k]
        if not self.plan_only:
            R = self.dims[k][1] * self.ch[k]
            a, n, m = self.buf[k], self.done[k] - b, b - base
            for r in range(0, n, m):
                c = min(m, n - r)
                a[r * R:(r + c) * R] = a[(r + m) * R:(r + m + c) * R]
        self.base[k] = b

    def takes(self, k):
        # is tensor k an input of this group read whole (the sample, for strips)?
        self.plan()
        return k in self.span

    def _rows(self, k, a, b):
        R, base = self.dims[k][1] * self.ch[k], self.base[k]
        x = self.buf[k] if k in self.buf else self.q.t[k]
        if x is None:               # the sample in its file: rows a..b-1 into the strip
            f, at = self.q.src
            f.seek(at + a * R)
            s = memoryview(self.strip)[:(b - a) * R]
            f.readinto(s)
            return s
        return x[(a - base) * R:(b - base) * R]

    def _compute(self, i, k, d, e):
        L = self.q.layers[i]
        dst = self._rows(k, d, e)
        if L.k == _LUT:             # its table over the rows
            X = self.q.X[_LUT]
            if L.tt is None:
                X.tables(L)
            X.luk(dst, self._rows(L.ins[0], d, e), len(dst), L.tt)
            return
        if L.k == _ADD:
            ins = L.ins
            L.add(self._rows(ins[0], d, e), self._rows(ins[1], d, e), dst, len(dst))
            return
        x = self.acts[i][0]
        H = self.dims[x][0]
        s, pt, reach = self.rule[i]
        a, b = max(0, d * s - pt), min(H, (e - 1) * s - pt + reach)
        gm, g = self.gm, L.g
        K.cpk(gm, g, 14)
        gm[0], gm[10], gm[8] = b - a, e - d, pt + a - d * s
        if L.k >= _PMAX:            # a pool's window over the strip (padded taps excluded)
            self.q.X[_PMAX].pok(dst, self._rows(x, a, b), gm, L.lo, L.hi, L.k - _PMAX)
            return
        L.conv(self._rows(x, a, b), gm, dst)

    def run(self):
        """Compute the group's outputs into the arena (its windows there too)."""
        self.plan()
        self.plan_only = False
        t = self.q.t
        for k in self.span:
            if t[k] is None and self.strip is None:
                self.strip = bytearray(self.span[k] * self.dims[k][1] * self.ch[k])
        self.buf = buf = {}
        for k in self.outs:
            buf[k] = t[k]
        for k in self.win:
            buf[k] = t[k]
        self._run()
        self.buf = None
