# The flattened model's reader (layout: docs/flat-model.md; the host writes it with
# host_tools/files/flatmodel.py, which takes these constants from here).  Imported by Net
# only while it loads a model and dropped after (code is heap on a board).
# The file is parsed while streaming: only the small tables are read as bytes;
# constant data goes straight from the file into preallocated arrays, or, when the
# model was prepared with --stream, stays in the file (utrain.stream).
from struct import unpack, calcsize
from array import array
from utrain.xnp import zeros, readinto, big_first, const
from utrain.losses import LOSSES, METRICS
from utrain.optim import OPTIMIZERS
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_ADD = const(0)
_AVERAGE_POOL_2D = const(1)
_CONCATENATION = const(2)
_CONV_2D = const(3)
_DEPTHWISE_CONV_2D = const(4)
_FULLY_CONNECTED = const(9)
_LOGISTIC = const(14)
_MAX_POOL_2D = const(17)
_MUL = const(18)
_RELU = const(19)
_RELU_N1_TO_1 = const(20)
_RELU6 = const(21)
_RESHAPE = const(22)
_SOFTMAX = const(25)
_BETA = const(0)        # opc.BETA: SOFTMAX's options
_TANH = const(28)
_PAD = const(34)
_TRANSPOSE = const(39)
_MEAN = const(40)
_SUB = const(41)
_DIV = const(42)
_SQUEEZE = const(43)
_STRIDED_SLICE = const(45)
_EXPAND_DIMS = const(70)
_LEAKY_RELU = const(98)
_ELU = const(111)
_HARD_SWISH = const(117)
_SPLIT = const(49)
_SPLIT_V = const(102)
_SQRT = const(75)
_RSQRT = const(76)
_EXP = const(47)
_LOG = const(73)
_GELU = const(150)
_ROUND = const(116)
_FLOOR = const(8)
_CEIL = const(104)
_SIGN = const(158)
_BATCH_MATMUL = const(126)
_TRANSPOSE_CONV = const(67)
_GATHER = const(36)
_RESIZE_BILINEAR = const(23)
_RESIZE_NEAREST_NEIGHBOR = const(97)
_LESS = const(58)
_GREATER = const(61)
_GREATER_EQUAL = const(62)
_LESS_EQUAL = const(63)
_EQUAL = const(71)
_NOT_EQUAL = const(72)
_SELECT = const(64)
_SELECT_V2 = const(123)

MAGIC = b'UTFM'
VERSION = 3
HDR = '<4sHHHHHBBIIHHI'   # ... data_start, size, n_ranks, n_bands, crc32 (of the file with it zero)
RANK = '<HBBII'
SETTINGS = '<BBBBBBHHHIffffff'
TENSOR = '<BBHIII'
ACT, CONST, TRAIN, UNUSED = 0, 1, 2, 3
SAVE = 1
GRAD = 2     # an op's data input n >= 1 whose gradient is needed (ADD's b, CONCATENATION's)
OP = '<BHHH'   # op record: code, n_in, n_out, n_opt
NO_USE = 0xFFFF
REDUCTIONS = ('mean', 'sum')


def settings_dict(s):
    """The unpacked SETTINGS tuple as named training settings."""
    if s[0] >= len(LOSSES) or s[1] >= len(REDUCTIONS) or s[3] >= len(OPTIMIZERS) or s[4] >= len(METRICS):
        raise ValueError('unknown loss/reduction/optimizer/metric code %r' % (s[:5],))
    return {'loss': LOSSES[s[0]], 'reduction': REDUCTIONS[s[1]], 'from_logits': bool(s[2]),
            'optimizer': OPTIMIZERS[s[3]], 'metric': METRICS[s[4]], 'shuffle': bool(s[5]),
            'batch': s[6], 'epochs': s[7], 'seed': s[9], 'lr': s[10], 'momentum': s[11],
            'beta1': s[12], 'beta2': s[13], 'eps': s[14], 'rho': s[15], 'stream': bool(s[8] & 1),
            # train.json's training recipes (docs/training.md), not stored here
            'weight_decay': 0.0, 'schedule': 'constant', 'warmup': 0, 'schedule_steps': 0,
            'step_size': 1, 'gamma': 0.1, 'min_lr': 0.0}

# circle builtin code -> kernel module; imported only when a model uses it
KERNELS = {_FULLY_CONNECTED: 'op_fc', _SOFTMAX: 'op_act', _LOGISTIC: 'op_act', _RELU: 'op_act',
           _RELU_N1_TO_1: 'op_act', _RELU6: 'op_act', _TANH: 'op_act', _HARD_SWISH: 'op_act',
           _LEAKY_RELU: 'op_act', _ELU: 'op_act', _ADD: 'op_elem', _SUB: 'op_elem', _MUL: 'op_elem', _DIV: 'op_elem',
           _RESHAPE: 'op_shape', _PAD: 'op_shape', _CONCATENATION: 'op_shape',
           _TRANSPOSE: 'op_shape', _SQUEEZE: 'op_shape', _EXPAND_DIMS: 'op_shape',
           _STRIDED_SLICE: 'op_shape', _CONV_2D: 'op_conv', _DEPTHWISE_CONV_2D: 'op_conv',
           _AVERAGE_POOL_2D: 'op_pool', _MAX_POOL_2D: 'op_pool', _MEAN: 'op_pool',
           _SPLIT: 'op_split', _SPLIT_V: 'op_split', _SQRT: 'op_math', _RSQRT: 'op_math',
           _GELU: 'op_math', _ROUND: 'op_math', _FLOOR: 'op_math', _CEIL: 'op_math',
           _SIGN: 'op_math', _EXP: 'op_math', _LOG: 'op_math', _BATCH_MATMUL: 'op_bmm',
           _TRANSPOSE_CONV: 'op_tconv', _GATHER: 'op_emb', _RESIZE_BILINEAR: 'op_rsz',
           _RESIZE_NEAREST_NEIGHBOR: 'op_rsz', _LESS: 'op_elem', _GREATER: 'op_elem',
           _GREATER_EQUAL: 'op_elem', _LESS_EQUAL: 'op_elem', _EQUAL: 'op_elem',
           _NOT_EQUAL: 'op_elem', _SELECT: 'op_sel',
           _SELECT_V2: 'op_sel'}


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


def load(net, f, name, wof):
    """Read the flattened model from the open file f (named name) into net: the header,
    the settings, the tensor and op tables, the backward, rank and band tables, what
    each op frees, then the arrays (the constants' data read, or streamed:
    utrain.stream); each table is gone before the arrays are made."""
    nt, nops, nbwd, nin, nout, dstart, size, nrk, nbd = _header(f, name, wof)
    f.seek(32)
    try:
        net.settings = settings_dict(unpack(SETTINGS, _read(f, calcsize(SETTINGS), name, 'settings')))
    except ValueError as e:
        raise ModelError('%s: settings: %s' % (name, e))
    io = unpack('<%dH' % (nin + nout), _read(f, 2 * (nin + nout), name, 'inputs/outputs'))
    net.inputs, net.outputs = io[:nin], io[nin:]
    kinds, sflags, last, shape, offs = _tables(net, f, name, nt, nops, dstart, size, io)
    bwd = []
    for i in range(nbwd):
        oi, fl = unpack('<HH', _read(f, 4, name, 'backward list'))
        if oi >= nops:
            raise ModelError('%s: backward entry %d names op %d, model has %d' % (name, i, oi, nops))
        bwd.append((oi, fl))
    net.bwd = bwd
    # a final LOGISTIC or SOFTMAX (beta 1), first on the backward list, its output the
    # model's and read by no other op: (its input, the losses that take it whole), for
    # Net.fuse_head (here: the reader's code leaves the heap once the model is loaded)
    net.fin, net.head, net.sk = None, 0, net.outputs[0]     # (Net.fuse_head's)
    if bwd:
        code, ins, outs, opts = net.ops[bwd[0][0]]
        k = net.outputs[0]
        if outs[0] == k and not any(k in op[1] for op in net.ops) and (
                code == _LOGISTIC or code == _SOFTMAX and opts[_BETA] == 1.0):
            net.fin = (ins[0], ('bce',) if code == _LOGISTIC else ('cce', 'scce'))
    # sparse update: tensor -> (axis, lo, hi), the output channels that train
    net.rank = rank = {}
    for i in range(nrk):
        k, ax, _, lo, hi = unpack(RANK, _read(f, 12, name, 'rank table'))
        if k >= nt or kinds[k] != TRAIN or ax > 1 or not lo < hi <= shape[k][ax]:
            raise ModelError('%s: bad rank entry %d (tensor %d)' % (name, i, k))
        rank[k] = (ax, lo, hi)
    # band groups: read by utrain.bands, imported only by a model that has them
    net.bands = nbd and __import__('utrain.bands').bands.table(_read(f, 6 * nbd, name, 'band table'),
                                                               nops, name, ModelError)
    net.shape = shape
    # the data inputs n >= 1 whose gradient a kernel computes (op_elem, op_shape)
    net.gin = set(k for k in range(nt) if sflags[k] & GRAD) or ()
    _frees(net, kinds, sflags, last, nt, nops)
    net.trainable = [k for k in range(nt) if kinds[k] == TRAIN]
    del kinds, sflags, last, io
    _arrays(net, f, name, shape, offs)


def _header(f, name, wof):
    # the header checked (magic, version, size, checksum, counts): its counts
    h = _read(f, 32, name, 'header')
    magic, ver, flags, nt, nops, nbwd, nin, nout, dstart, size, nrk, nbd, crc = unpack(HDR, h)
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
    return nt, nops, nbwd, nin, nout, dstart, size, nrk, nbd


def _tables(net, f, name, nt, nops, dstart, size, io):
    # the tensor table (kinds, flags, last use, shapes, {constant: data offset}, returned)
    # and the op table (net.ops: (code, ins, outs, options); net.mods: kernel modules)
    kinds = bytearray(nt)
    sflags = bytearray(nt)
    last = [0] * nt
    shape = [None] * nt
    offs = {}
    seen = {}
    for k in range(nt):
        kind, fl, lu, r, c, off = unpack(TENSOR, _read(f, 16, name, 'tensor table'))
        if kind > UNUSED:
            raise ModelError('%s: tensor %d has unknown kind %d' % (name, k, kind))
        # tensors of one shape share its tuple (an unrolled RNN's 397 tensors have a
        # handful of shapes: 6 KB of tuples on a 32-bit board otherwise)
        s = (r, c)
        kinds[k], sflags[k], last[k], shape[k] = kind, fl, lu, seen.setdefault(s, s)
        if kind == CONST:
            if off < dstart or off + 4 * r * c > size:
                raise ModelError('%s: tensor %d data offset %d out of range' % (name, k, off))
            offs[k] = off
    for k in io:
        if k >= nt:
            raise ModelError('%s: input/output tensor %d out of range' % (name, k))
    net.ops = ops = []
    net.mods = mods = []
    for i in range(nops):
        code, ni, no, nopt = unpack(OP, _read(f, 7, name, 'op table'))
        ins = unpack('<%dh' % ni, _read(f, 2 * ni, name, 'op table'))
        outs = unpack('<%dh' % no, _read(f, 2 * no, name, 'op table'))
        raw = _read(f, 4 * nopt, name, 'op table')
        # ops with the same options share them (no kernel writes its options): an
        # unrolled RNN's 20 steps repeat each op's
        opts = seen.get(raw)
        if opts is None:
            opts = unpack('<%df' % nopt, raw)
            if nopt > 1:      # as float32 array: 4 bytes each, not a boxed float (16-32 B)
                opts = array('f', opts)
            seen[raw] = opts
        for k in ins + outs:
            if not -1 <= k < nt or (k < 0 and (k in outs or not ins or k == ins[0])):
                raise ModelError('%s: op %d uses tensor %d, model has %d' % (name, i, k, nt))
        ops.append((code, ins, outs, opts))
        mods.append(_kernel(code, name, i))
    return kinds, sflags, last, shape, offs


def _frees(net, kinds, sflags, last, nt, nops):
    # what to drop after each op: inference frees every dead tensor, training
    # keeps those the backward pass reads (flag SAVE)
    # Per op a tuple (most ops free nothing: the shared empty tuple; training shares
    # inference's tuple where it frees the same): a list per op and mode cost 21 KB on a
    # 32-bit board for an unrolled LSTM's 265 ops (each empty list holds 4 item slots)
    # (grown a tuple at a time in place: a dict of lists an op, the load's largest
    # transient, stood over the run's whole plan for an unrolled GRU's 356 ops)
    keep = set(net.outputs)
    fi, ft = [()] * nops, [()] * nops
    for k in range(nt):
        i = last[k]
        if kinds[k] == ACT and i != NO_USE and k not in keep and i < nops:
            fi[i] += (k,)
            if not sflags[k] & SAVE:
                ft[i] += (k,)
    for i in range(nops):
        if len(ft[i]) == len(fi[i]):
            ft[i] = fi[i]
    net.free_infer, net.free_train = fi, ft


def _arrays(net, f, name, shape, offs):
    # the tensors' arrays: the trained ones (net.trainable), then the constants read (or
    # streamed)
    net.t = t = [None] * len(shape)
    net.stream = None
    # the large arrays first, largest first, while the heap has long free runs
    for k in big_first(net.trainable, shape):
        t[k] = zeros(shape[k])
    if net.settings['stream']:
        from utrain.stream import Stream
        net.stream = Stream(net, offs)
    else:
        for k in big_first(offs, shape):
            t[k] = zeros(shape[k])
        for k in sorted(offs):
            f.seek(offs[k])
            readinto(f, t[k], name)
