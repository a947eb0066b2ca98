# The flattened model (docs/flat-model.md) and the engine that runs it:
# forward, backward over the host-derived backward list, weight-gradient sums.
# The file is parsed while streaming: only the small tables are read as bytes;
# constant data goes straight from the file into preallocated arrays.
from struct import unpack, calcsize
from utrain.xnp import zeros, readinto

MAGIC = b'UTFM'
VERSION = 1
HDR = '<4sHHHHHBBII8x'
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
    return {'loss': LOSSES[s[0]], 'reduction': REDUCTIONS[s[1]], 'from_logits': bool(s[2]),
            'optimizer': OPTIMIZERS[s[3]], 'metric': METRICS[s[4]], 'shuffle': bool(s[5]),
            'batch': s[6], 'epochs': s[7], 'seed': s[9], 'lr': s[10], 'momentum': s[11],
            'beta1': s[12], 'beta2': s[13], 'eps': s[14], 'rho': s[15]}

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


class Net:
    """A loaded model: tensors t[k], their 2-D shapes, ops, and the backward list."""

    def __init__(self, path):
        self.path = path
        with open(path, 'rb') as f:
            self._load(f, path)

    def _load(self, f, name):
        h = _read(f, 32, name, 'header')
        magic, ver, flags, nt, nops, nbwd, nin, nout, dstart, size = unpack(HDR, h)
        if magic != MAGIC:
            raise ModelError('%s: not a utrain flattened model (magic %r, want %r)' % (name, magic, MAGIC))
        if ver != VERSION:
            raise ModelError('%s: format version %d, this utrain reads %d' % (name, ver, VERSION))
        f.seek(0, 2)
        real = f.tell()
        if real != size:
            raise ModelError('%s: %d bytes, header says %d (truncated or padded)' % (name, real, size))
        f.seek(32)
        self.settings = settings_dict(unpack(SETTINGS, _read(f, calcsize(SETTINGS), name, 'settings')))
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
                if k >= nt:
                    raise ModelError('%s: op %d uses tensor %d, model has %d' % (name, i, k, nt))
            ops.append((code, ins, outs, opts))
            mods.append(_kernel(code, name, i))
        bwd = []
        for i in range(nbwd):
            oi, fl = unpack('<HH', _read(f, 4, name, 'backward list'))
            if oi >= nops:
                raise ModelError('%s: backward entry %d names op %d, model has %d' % (name, i, oi, nops))
            bwd.append((oi, fl))
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
        for k in sorted(offs):
            f.seek(offs[k])
            t[k] = readinto(f, zeros(shape[k]), name)
        self.trainable = [k for k in range(nt) if kinds[k] == TRAIN]
        self.acc = {}
        self.g = {}

    def load_weights(self, path):
        """Load the trainable tensors from a .wof file (onert-micro layout)."""
        from utrain.wof import read_table
        with open(path, 'rb') as f:
            offs, size = read_table(f, path, len(self.t))
            for k in self.trainable:
                o = offs[k]
                r, c = self.shape[k]
                if o == 0:
                    raise ModelError('%s: no data for trainable tensor %d' % (path, k))
                if o + 4 * r * c > size:
                    raise ModelError('%s: data of tensor %d runs past the end of the file' % (path, k))
                f.seek(o)
                if self.t[k] is None:
                    self.t[k] = zeros((r, c))
                readinto(f, self.t[k], path)

    def set_input(self, x, i=0):
        self.t[self.inputs[i]] = x

    def output(self, i=0):
        return self.t[self.outputs[i]]

    def forward(self, train=False):
        t = self.t
        free = self.free_train if train else self.free_infer
        ops, mods = self.ops, self.mods
        for i in range(len(ops)):
            mods[i].forward(self, ops[i])
            for k in free[i]:
                t[k] = None

    def backward(self, dy):
        """Run the backward list from dL/d(output); adds into the weight-gradient sums."""
        g = self.g
        g[self.outputs[0]] = dy
        ops, mods = self.ops, self.mods
        for oi, fl in self.bwd:
            op = ops[oi]
            d = g.pop(op[2][0], None)
            if d is not None:
                mods[oi].backward(self, op, d, fl)
        g.clear()

    def add_grad(self, k, d):
        """Gradient arriving at activation tensor k (summed over its consumers)."""
        old = self.g.get(k)
        self.g[k] = d if old is None else old + d

    def wgrad(self, k):
        """The gradient sum of weight tensor k (created on first use)."""
        a = self.acc.get(k)
        if a is None:
            a = self.acc[k] = zeros(self.shape[k])
        return a

    def add_wgrad(self, k, d):
        a = self.wgrad(k)
        a += d

    def zero_grads(self):
        for a in self.acc.values():
            a[:] = 0.0
