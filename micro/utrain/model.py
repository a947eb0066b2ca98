# The flattened model (docs/flat-model.md) and the engine that runs it:
# forward, backward over the host-derived backward list, weight-gradient sums.
# The file is parsed while streaming: only the small tables are read as bytes;
# constant data goes straight from the file into preallocated arrays, or, when the
# model was prepared with --stream, stays in the file and is read into a few reused
# buffers just before the op that needs it (frozen weights live on flash, not heap).
from struct import unpack, calcsize
from utrain.xnp import zeros, readinto

MAGIC = b'UTFM'
VERSION = 2
HDR = '<4sHHHHHBBIIH2xI'   # ... data_start, size, n_ranks, crc32 (of the file with it zero)
RANK = '<HBBII'
SETTINGS = '<BBBBBBHHHIffffff'
TENSOR = '<BBHIII'
ACT, CONST, TRAIN, UNUSED = 0, 1, 2, 3
SAVE = 1
NO_USE = 0xFFFF
LOSSES = ('mse', 'mae', 'cce', 'scce', 'bce')
OPTIMIZERS = ('sgd', 'adam', 'rmsprop')
METRICS = ('accuracy', 'mae')
REDUCTIONS = ('mean', 'sum')


def settings_dict(s):
    """The unpacked SETTINGS tuple as named training settings."""
    if s[0] >= len(LOSSES) or s[1] >= len(REDUCTIONS) or s[3] >= len(OPTIMIZERS) or s[4] >= len(METRICS):
        raise ValueError('unknown loss/reduction/optimizer/metric code %r' % (s[:5],))
    return {'loss': LOSSES[s[0]], 'reduction': REDUCTIONS[s[1]], 'from_logits': bool(s[2]),
            'optimizer': OPTIMIZERS[s[3]], 'metric': METRICS[s[4]], 'shuffle': bool(s[5]),
            'batch': s[6], 'epochs': s[7], 'seed': s[9], 'lr': s[10], 'momentum': s[11],
            'beta1': s[12], 'beta2': s[13], 'eps': s[14], 'rho': s[15], 'stream': bool(s[8] & 1)}

# circle builtin code -> kernel module; imported only when a model uses it
KERNELS = {9: 'op_fc', 14: 'op_act', 19: 'op_act', 20: 'op_act', 21: 'op_act',
           25: 'op_act', 28: 'op_act', 22: 'op_shape', 117: 'op_act', 98: 'op_act',
           0: 'op_elem', 41: 'op_elem', 18: 'op_elem', 42: 'op_elem', 34: 'op_shape',
           2: 'op_shape', 39: 'op_shape', 43: 'op_shape', 70: 'op_shape', 45: 'op_shape',
           3: 'op_conv', 4: 'op_conv', 1: 'op_pool', 17: 'op_pool', 40: 'op_pool'}


class ModelError(ValueError):
    pass


def _read(f, n, name, what):
    b = f.read(n)
    if len(b) != n:
        raise ModelError('%s: truncated in %s' % (name, what))
    return b


def _kernel(code, name, i):
    m = KERNELS.get(code)
    if m is None:
        raise ModelError('%s: op %d has code %d, which this utrain cannot run' % (name, i, code))
    return __import__('utrain.' + m, None, None, ('forward',))


def big_first(ks, shape):
    return sorted(ks, key=lambda k: -shape[k][0] * shape[k][1])


class Net:
    """A loaded model: tensors t[k], their 2-D shapes, ops, and the backward list."""

    def __init__(self, path):
        self.path = path
        from utrain import wof
        with wof.openr(path) as f:
            self._load(f, path, wof)

    def _load(self, f, name, wof):
        h = _read(f, 32, name, 'header')
        magic, ver, flags, nt, nops, nbwd, nin, nout, dstart, size, nrk, crc = unpack(HDR, h)
        if magic != MAGIC:
            raise ModelError('%s: not a utrain flattened model (magic %r, want %r)' % (name, magic, MAGIC))
        if ver != VERSION:
            raise ModelError('%s: format version %d, this utrain reads %d (prepare the model again)'
                             % (name, ver, VERSION))
        f.seek(0, 2)
        real = f.tell()
        if real != size:
            raise ModelError('%s: %d bytes, header says %d (truncated or padded)' % (name, real, size))
        if wof.crc32 and wof.crc(f, 32, size, wof.crc32(h[:28] + b'\0\0\0\0')) != crc:
            raise ModelError('%s: checksum mismatch (corrupt file)' % name)
        if not nin or not nout or not 72 <= dstart <= size:
            raise ModelError('%s: bad header (%d inputs, %d outputs, data at %d)' % (name, nin, nout, dstart))
        f.seek(32)
        try:
            self.settings = settings_dict(unpack(SETTINGS, _read(f, calcsize(SETTINGS), name, 'settings')))
        except ValueError as e:
            raise ModelError('%s: settings: %s' % (name, e))
        io = unpack('<%dH' % (nin + nout), _read(f, 2 * (nin + nout), name, 'inputs/outputs'))
        self.inputs, self.outputs = io[:nin], io[nin:]
        kinds = bytearray(nt)
        sflags = bytearray(nt)
        last = [0] * nt
        shape = [None] * nt
        offs = {}
        for k in range(nt):
            kind, fl, lu, r, c, off = unpack(TENSOR, _read(f, 16, name, 'tensor table'))
            if kind > UNUSED:
                raise ModelError('%s: tensor %d has unknown kind %d' % (name, k, kind))
            kinds[k], sflags[k], last[k], shape[k] = kind, fl, lu, (r, c)
            if kind == CONST:
                if off < dstart or off + 4 * r * c > size:
                    raise ModelError('%s: tensor %d data offset %d out of range' % (name, k, off))
                offs[k] = off
        for k in io:
            if k >= nt:
                raise ModelError('%s: input/output tensor %d out of range' % (name, k))
        ops = []
        mods = []
        for i in range(nops):
            code, ni, no, nopt = unpack('<BBBB', _read(f, 4, name, 'op table'))
            ins = unpack('<%dh' % ni, _read(f, 2 * ni, name, 'op table'))
            outs = unpack('<%dh' % no, _read(f, 2 * no, name, 'op table'))
            opts = unpack('<%df' % nopt, _read(f, 4 * nopt, name, 'op table'))
            for k in ins + outs:
                if not -1 <= k < nt or (k < 0 and (k in outs or not ins or k == ins[0])):
                    raise ModelError('%s: op %d uses tensor %d, model has %d' % (name, i, k, nt))
            ops.append((code, ins, outs, opts))
            mods.append(_kernel(code, name, i))
        bwd = []
        for i in range(nbwd):
            oi, fl = unpack('<HH', _read(f, 4, name, 'backward list'))
            if oi >= nops:
                raise ModelError('%s: backward entry %d names op %d, model has %d' % (name, i, oi, nops))
            bwd.append((oi, fl))
        # sparse update: tensor -> (axis, lo, hi), the output channels that train
        self.rank = rank = {}
        for i in range(nrk):
            k, ax, _, lo, hi = unpack(RANK, _read(f, 12, name, 'rank table'))
            if k >= nt or kinds[k] != TRAIN or ax > 1 or not lo < hi <= shape[k][ax]:
                raise ModelError('%s: bad rank entry %d (tensor %d)' % (name, i, k))
            rank[k] = (ax, lo, hi)
        self.shape = shape
        self.ops, self.mods, self.bwd = ops, mods, bwd
        # what to drop after each op: inference frees every dead tensor, training
        # keeps those the backward pass reads (flag SAVE)
        keep = set(self.outputs)
        fi = [[] for _ in ops]
        ft = [[] for _ in ops]
        for k in range(nt):
            if kinds[k] == ACT and last[k] != NO_USE and k not in keep and last[k] < nops:
                fi[last[k]].append(k)
                if not sflags[k] & SAVE:
                    ft[last[k]].append(k)
        self.free_infer, self.free_train = fi, ft
        self.t = t = [None] * nt
        self.stream = None
        self.trainable = [k for k in range(nt) if kinds[k] == TRAIN]
        # the large arrays first, largest first, while the heap has long free runs
        for k in big_first(self.trainable, shape):
            t[k] = zeros(shape[k])
        if self.settings['stream']:
            from utrain.stream import Stream
            self.stream = Stream(self, offs)
        else:
            for k in big_first(offs, shape):
                t[k] = zeros(shape[k])
            for k in sorted(offs):
                f.seek(offs[k])
                readinto(f, t[k], name)
        self.acc = {}
        self.g = {}
        # batch 1: the Trainer's upd(k, g) / upd_row(k, r, g) apply each gradient at
        # once (g in state_shape(k) / row r of it) instead of summing it;
        # upd_outer(k, u, v) applies outer(u, v) (True) when k's optimizer step allows
        self.upd = self.upd_row = self.upd_outer = None

    def load_weights(self, path):
        """Load the trainable tensors from a .wof file (onert-micro layout)."""
        from utrain import wof
        with wof.openr(path) as f:
            offs, size = wof.read_table(f, path, self.shape)
            for k in self.trainable:
                o = offs[k]
                if o == 0:
                    raise ModelError('%s: no data for trainable tensor %d' % (path, k))
                f.seek(o)
                if self.t[k] is None:
                    self.t[k] = zeros(self.shape[k])
                readinto(f, self.t[k], path)

    def set_input(self, x, i=0):
        self.t[self.inputs[i]] = x

    def output(self, i=0):
        return self.t[self.outputs[i]]

    def forward(self, train=False):
        t = self.t
        free = self.free_train if train else self.free_infer
        ops, mods, st = self.ops, self.mods, self.stream
        for i in range(len(ops)):
            if st:
                st.fetch(i)
            mods[i].forward(self, ops[i])
            if st:
                st.drop(i)
            for k in free[i]:
                t[k] = None

    def backward(self, dy):
        """Run the backward list from dL/d(output); adds into the weight-gradient sums."""
        g = self.g
        g[self.outputs[0]] = dy
        ops, mods, st = self.ops, self.mods, self.stream
        for oi, fl in self.bwd:
            op = ops[oi]
            d = g.pop(op[2][0], None)
            if d is not None:
                if st:
                    st.fetch(oi)
                mods[oi].backward(self, op, d, fl)
                if st:
                    st.drop(oi)
                if self.upd is not None and self.acc:
                    self._flush()
        g.clear()

    def _flush(self):
        # batch 1: apply the weight gradients a kernel summed into acc, then free them
        acc = self.acc
        for k in acc:
            self.upd(k, self.part(k, acc[k]))
        acc.clear()

    def add_grad(self, k, d):
        """Gradient arriving at activation tensor k (summed over its consumers)."""
        old = self.g.get(k)
        self.g[k] = d if old is None else old + d

    def wgrad(self, k):
        """The gradient sum of weight tensor k, whole (created on first use).  Under a
        rank only its training channels are applied (part())."""
        a = self.acc.get(k)
        if a is None:
            a = self.acc[k] = zeros(self.shape[k])
        return a

    def wgrad_rows(self, k):
        """k's gradient sum in state_shape(k): only its training channels (for
        kernels that compute just those, like op_fc)."""
        a = self.acc.get(k)
        if a is None:
            a = self.acc[k] = zeros(self.state_shape(k))
        return a

    def part(self, k, a):
        """a (k's whole shape or already state_shape(k)) cut to k's training channels."""
        r = self.rank.get(k)
        if r is None or a.shape != self.shape[k]:
            return a
        ax, lo, hi = r
        return a[lo:hi] if ax == 0 else a[:, lo:hi]

    def state_shape(self, k):
        """Shape of k's gradient and optimizer state: the whole tensor, or its
        training output channels (rank)."""
        r = self.rank.get(k)
        if r is None:
            return self.shape[k]
        ax, lo, hi = r
        return (hi - lo, self.shape[k][1]) if ax == 0 else (self.shape[k][0], hi - lo)

    def rows(self, k):
        """The rows lo:hi of weight k that train (its output channels)."""
        r = self.rank.get(k)
        if r is None or r[0]:
            return 0, self.shape[k][0]
        return r[1], r[2]

    def add_wgrad(self, k, d):
        """Weight gradient d (whole tensor shape) of k: applied at once (batch 1)
        or added into its sum, restricted to k's training channels."""
        if len(d.shape) == 1:                   # a bias sum over rows: (n,) -> (1, n)
            d = d.reshape((1, d.shape[0]))
        d = self.part(k, d)
        if self.upd is not None:
            self.upd(k, d)
            return
        a = self.wgrad_rows(k)
        a += d

    def zero_grads(self):
        for a in self.acc.values():
            a[:] = 0.0
