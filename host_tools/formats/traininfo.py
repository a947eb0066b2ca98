"""Read and write ONERT's ``CIRCLE_TRAINING`` metadata (circle_traininfo.fbs).

A circle model may carry a metadata entry named ``CIRCLE_TRAINING`` whose
buffer holds a separate flatbuffer (root table ``circle.ModelTraining``, file
identifier ``CTR0``) with the training settings ONERT uses by default.

This is an independent, small reader/writer written from the schema facts
below, using only ``flatbuffers.table.Table`` / ``flatbuffers.Builder``.

Schema (Samsung/ONE circle_traininfo.fbs, identifier "CTR0"):

    enum Optimizer : byte { SGD = 0, ADAM = 1 }
    union OptimizerOptions { SGDOptions = 1, AdamOptions = 2 }     (NONE = 0)
    table SGDOptions  { learning_rate:float (id 0) }
    table AdamOptions { learning_rate:float (0); beta_1:float (1);
                        beta_2:float (2); epsilon:float (3) }      all default 0
    enum LossFn : byte { SPARSE_CATEGORICAL_CROSSENTROPY = 0,
                         CATEGORICAL_CROSSENTROPY = 1, MEAN_SQUARED_ERROR = 2 }
    union LossFnOptions { SparseCategoricalCrossentropyOptions = 1,
                          CategoricalCrossentropyOptions = 2,
                          MeanSquaredErrorOptions = 3 }             (NONE = 0)
    table SparseCategoricalCrossentropyOptions { from_logits:bool (0) }
    table CategoricalCrossentropyOptions       { from_logits:bool (0) }
    table MeanSquaredErrorOptions { }
    enum LossReductionType : byte { SumOverBatchSize = 0, Sum = 1 }
    table ModelTraining {                      field id (vtable slot)
        version:uint;                          0
        optimizer:Optimizer;                   1
        optimizer_opt:OptimizerOptions;        2 (_type, ubyte), 3 (offset)
        lossfn:LossFn;                         4
        lossfn_opt:LossFnOptions;              5 (_type, ubyte), 6 (offset)
        epochs:int;                            7
        batch_size:int;                        8
        loss_reduction_type:LossReductionType; 9
        trainable_ops:[int];                   10   (CTR0 only)
    }

A variant of the schema with identifier "CTR1" has the same fields 0..9 and
no ``trainable_ops``; it is accepted by the reader (and can be written with
``file_identifier=b'CTR1'``), but the ONERT runtime we test against verifies
the identifier "CTR0", so that is what ``build_traininfo`` writes by default.

Dict form (plain Python values):

    {'version': int,
     'optimizer': 'sgd' | 'adam',
     'lr': float, 'beta1': float, 'beta2': float, 'eps': float,  (adam only)
     'loss': 'scce' | 'cce' | 'mse',
     'from_logits': bool,                                       (scce/cce only)
     'reduction': 'mean' | 'sum',
     'epochs': int, 'batch': int,
     'trainable_ops': list[int]}                                (CTR0 only)

Scalars absent from the buffer are reported with their schema default.
Optimizer / loss options are reported only when the options table is present
(the schema allows it to be absent; ONERT itself needs the optimizer options).
Floats are float32 in the buffer; they are returned as the shortest decimal
that round-trips through float32 (so 0.01 reads back as 0.01).
"""

import math
import struct

import flatbuffers
from flatbuffers import number_types as N
from flatbuffers.table import Table

__all__ = ['parse_traininfo', 'build_traininfo', 'METADATA_NAME',
           'FILE_IDENTIFIER', 'KNOWN_IDENTIFIERS']

METADATA_NAME = 'CIRCLE_TRAINING'
FILE_IDENTIFIER = b'CTR0'
KNOWN_IDENTIFIERS = (b'CTR0', b'CTR1')

# ModelTraining field ids
_F_VERSION = 0
_F_OPTIMIZER = 1
_F_OPT_TYPE = 2
_F_OPT = 3
_F_LOSSFN = 4
_F_LOSS_TYPE = 5
_F_LOSS = 6
_F_EPOCHS = 7
_F_BATCH = 8
_F_REDUCTION = 9
_F_TRAINABLE_OPS = 10
_N_FIELDS = {b'CTR0': 11, b'CTR1': 10}

# enums: schema value <-> dict name
_OPTIMIZERS = {0: 'sgd', 1: 'adam'}
_OPT_UNION = {'sgd': 1, 'adam': 2}           # OptimizerOptions union tags
_OPT_UNION_NAMES = {0: 'NONE', 1: 'SGDOptions', 2: 'AdamOptions'}
_LOSSES = {0: 'scce', 1: 'cce', 2: 'mse'}
_LOSS_UNION = {'scce': 1, 'cce': 2, 'mse': 3}  # LossFnOptions union tags
_LOSS_UNION_NAMES = {0: 'NONE', 1: 'SparseCategoricalCrossentropyOptions',
                     2: 'CategoricalCrossentropyOptions',
                     3: 'MeanSquaredErrorOptions'}
_REDUCTIONS = {0: 'mean', 1: 'sum'}

# Defaults used by build_traininfo for Adam parameters not given (Keras's);
# the schema's own default for every float is 0.0.
_ADAM_DEFAULTS = {'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-7}

_I32 = (-2 ** 31, 2 ** 31 - 1)
_U32 = (0, 2 ** 32 - 1)


def _f32(x):
    """Shortest decimal float that packs to the same float32 as ``x``."""
    packed = struct.pack('<f', x)
    if not math.isfinite(x):
        return x
    for digits in range(1, 10):
        y = float('%.*g' % (digits, x))
        if struct.pack('<f', y) == packed:
            return y
    return x


# --------------------------------------------------------------------------
# reading


class _Reader:
    """Bounds-checked access to flatbuffer tables in ``buf``.

    Every position is checked against the buffer before a
    ``flatbuffers.table.Table`` reads it, so a malformed buffer gives a
    ValueError instead of an IndexError/struct.error or a silent wrap-around.
    """

    def __init__(self, buf, where):
        self.buf = buf
        self.n = len(buf)
        self.where = where

    def fail(self, msg):
        raise ValueError('%s: %s' % (self.where, msg))

    def need(self, pos, size, what):
        if pos < 0 or pos + size > self.n:
            self.fail('truncated or corrupt buffer: %s at offset %d (%d bytes) '
                      'lies outside the %d-byte buffer' % (what, pos, size, self.n))

    def u32(self, pos, what):
        self.need(pos, 4, what)
        return struct.unpack_from('<I', self.buf, pos)[0]

    def table(self, pos, what):
        """Verify the table at ``pos`` (and its vtable); return a Table."""
        self.need(pos, 4, what)
        soff = struct.unpack_from('<i', self.buf, pos)[0]
        vt = pos - soff
        self.need(vt, 4, what + ' vtable')
        vsize, tsize = struct.unpack_from('<HH', self.buf, vt)
        if vsize < 4 or vsize % 2:
            self.fail('corrupt %s vtable: size %d' % (what, vsize))
        self.need(vt, vsize, what + ' vtable')
        if tsize < 4:
            self.fail('corrupt %s: inline size %d' % (what, tsize))
        self.need(pos, tsize, what)
        return _Tab(self, Table(self.buf, pos), tsize, what)


class _Tab:
    def __init__(self, rd, tab, tsize, what):
        self.rd = rd
        self.tab = tab
        self.tsize = tsize
        self.what = what

    def _off(self, fid, size, name):
        off = self.tab.Offset(4 + 2 * fid)
        if off:
            if off < 4 or off + size > self.tsize:
                self.rd.fail('corrupt %s: field %s at offset %d is outside the '
                             'table' % (self.what, name, off))
        return off

    def scalar(self, fid, flags, default, name):
        off = self._off(fid, flags.bytewidth, name)
        if not off:
            return default
        return self.tab.Get(flags, self.tab.Pos + off)

    def subtable(self, fid, name):
        off = self._off(fid, 4, name)
        if not off:
            return None
        pos = self.tab.Pos + off
        target = pos + self.rd.u32(pos, name + ' offset')
        return self.rd.table(target, name)

    def int32_vector(self, fid, name):
        off = self._off(fid, 4, name)
        if not off:
            return None
        pos = self.tab.Pos + off
        vec = pos + self.rd.u32(pos, name + ' offset')
        length = self.rd.u32(vec, name + ' length')
        self.rd.need(vec + 4, 4 * length, name + ' data')
        start = self.tab.Vector(off)
        return [self.tab.Get(N.Int32Flags, start + 4 * i) for i in range(length)]


def _union(rd, root, type_field, tab_field, name, union, names, expected, owner, what):
    """(type, table) of a union field, checked against the enum value it belongs to."""
    kind = root.scalar(type_field, N.Uint8Flags, 0, name + '_type')
    if kind not in names:
        rd.fail('unknown %s type %d' % (union, kind))
    tab = root.subtable(tab_field, name)
    if kind and tab is None:
        rd.fail('%s_type is %s but the options table is missing' % (name, names[kind]))
    if kind and kind != expected:
        rd.fail('%s but %s are %s' % (owner, what, names[kind]))
    return kind, tab


def parse_traininfo(buf, where=METADATA_NAME):
    """Decode a CIRCLE_TRAINING (circle.ModelTraining) flatbuffer into a dict.

    ``where`` names the source in error messages. Malformed input raises
    ValueError whose message starts with ``where``.
    """
    try:
        buf = bytes(buf)
    except TypeError:
        raise ValueError('%s: expected bytes, got %s' % (where, type(buf).__name__))
    rd = _Reader(buf, where)
    if len(buf) < 8:
        rd.fail('truncated buffer: %d bytes, a flatbuffer needs at least 8 '
                '(root offset + file identifier)' % len(buf))
    ident = buf[4:8]
    if ident not in KNOWN_IDENTIFIERS:
        rd.fail('bad file identifier %r, expected %s' % (
            ident, ' or '.join(repr(i) for i in KNOWN_IDENTIFIERS)))
    root = rd.table(rd.u32(0, 'root offset'), 'ModelTraining table')

    def enum(fid, table, enum_name):
        v = root.scalar(fid, N.Int8Flags, 0, enum_name)
        if v not in table:
            rd.fail('unknown %s value %d' % (enum_name, v))
        return table[v]

    out = {}
    out['version'] = root.scalar(_F_VERSION, N.Uint32Flags, 0, 'version')

    # optimizer + its options union
    opt = enum(_F_OPTIMIZER, _OPTIMIZERS, 'Optimizer')
    out['optimizer'] = opt
    opt_type, opt_tab = _union(rd, root, _F_OPT_TYPE, _F_OPT, 'optimizer_opt', 'OptimizerOptions',
                               _OPT_UNION_NAMES, _OPT_UNION[opt], 'optimizer is ' + opt.upper(),
                               'optimizer options')
    if opt_type:
        F = N.Float32Flags
        out['lr'] = _f32(opt_tab.scalar(0, F, 0.0, 'learning_rate'))
        if opt == 'adam':
            out['beta1'] = _f32(opt_tab.scalar(1, F, 0.0, 'beta_1'))
            out['beta2'] = _f32(opt_tab.scalar(2, F, 0.0, 'beta_2'))
            out['eps'] = _f32(opt_tab.scalar(3, F, 0.0, 'epsilon'))

    # loss function + its options union
    loss = enum(_F_LOSSFN, _LOSSES, 'LossFn')
    out['loss'] = loss
    loss_type, loss_tab = _union(rd, root, _F_LOSS_TYPE, _F_LOSS, 'lossfn_opt', 'LossFnOptions',
                                 _LOSS_UNION_NAMES, _LOSS_UNION[loss], 'loss function is ' + loss,
                                 'loss options')
    if loss_type and loss in ('scce', 'cce'):
        out['from_logits'] = bool(loss_tab.scalar(0, N.Uint8Flags, 0, 'from_logits'))

    out['reduction'] = enum(_F_REDUCTION, _REDUCTIONS, 'LossReductionType')
    out['epochs'] = root.scalar(_F_EPOCHS, N.Int32Flags, 0, 'epochs')
    out['batch'] = root.scalar(_F_BATCH, N.Int32Flags, 0, 'batch_size')
    if ident == b'CTR0':
        ops = root.int32_vector(_F_TRAINABLE_OPS, 'trainable_ops')
        out['trainable_ops'] = ops if ops is not None else []
    return out


# --------------------------------------------------------------------------
# writing

_KEYS = ('version', 'optimizer', 'lr', 'beta1', 'beta2', 'eps', 'loss',
         'from_logits', 'reduction', 'epochs', 'batch', 'trainable_ops')


def _bad(msg):
    raise ValueError('build_traininfo: ' + msg)


def _int(settings, key, default, lo_hi):
    v = settings.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        _bad('%s must be an int, got %r' % (key, v))
    if not lo_hi[0] <= v <= lo_hi[1]:
        _bad('%s=%d is out of range' % (key, v))
    return v


def _float(settings, key, default=None):
    if key not in settings and default is None:
        _bad('%s is required' % key)
    v = settings.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        _bad('%s must be a number, got %r' % (key, v))
    v = float(v)
    if not math.isfinite(v) or abs(v) > 3.4028234663852886e38:
        _bad('%s=%r does not fit a float32' % (key, v))
    return v


def _name(settings, key, table, default):
    v = settings.get(key, default)
    codes = {name: code for code, name in table.items()}
    if v not in codes:
        _bad('unknown %s %r (expected one of %s)' % (key, v, ', '.join(codes)))
    return v, codes[v]


def build_traininfo(settings, file_identifier=FILE_IDENTIFIER):
    """Encode a settings dict (the form parse_traininfo returns) as bytes.

    Required: 'optimizer' and 'lr' (ONERT needs the optimizer options).
    'loss' defaults to the schema default 'scce', 'reduction' to 'mean',
    'version'/'epochs'/'batch' to 0, 'from_logits' to False, Adam's
    beta1/beta2/eps to Keras's 0.9/0.999/1e-7, 'trainable_ops' to none.
    """
    _check_keys(settings, file_identifier)
    v = _values(settings, file_identifier)
    b = flatbuffers.Builder(128)
    # children first (flatbuffers are built back to front)
    ops_off = _ops_vector(b, v['ops'])
    opt_off = _optimizer_table(b, v)
    loss_off = _loss_table(b, v)
    root = _root_table(b, v, file_identifier, ops_off, opt_off, loss_off)
    b.Finish(root, file_identifier=file_identifier)
    return bytes(b.Output())


def _check_keys(settings, file_identifier):
    # what a settings dict and the schema must be before any value is read
    if not isinstance(settings, dict):
        _bad('settings must be a dict')
    unknown = sorted(set(settings) - set(_KEYS))
    if unknown:
        _bad('unknown settings %s' % ', '.join(map(repr, unknown)))
    if file_identifier not in KNOWN_IDENTIFIERS:
        _bad('file_identifier must be one of %r' % (KNOWN_IDENTIFIERS,))
    if 'optimizer' not in settings:
        _bad('optimizer is required')


def _values(settings, file_identifier):
    """Each setting checked and defaulted: {name: value}, the enums with their codes."""
    v = {'version': _int(settings, 'version', 0, _U32)}
    v['opt'], v['opt_code'] = _name(settings, 'optimizer', _OPTIMIZERS, None)
    v['lr'] = _float(settings, 'lr')
    v['adam'] = None
    if v['opt'] == 'adam':
        v['adam'] = [_float(settings, k, _ADAM_DEFAULTS[k]) for k in ('beta1', 'beta2', 'eps')]
    else:
        extra = [k for k in ('beta1', 'beta2', 'eps') if k in settings]
        if extra:
            _bad('%s only apply to adam' % ', '.join(extra))
    v['loss'], v['loss_code'] = _name(settings, 'loss', _LOSSES, 'scce')
    v['from_logits'] = from_logits = settings.get('from_logits', False)
    if not isinstance(from_logits, bool):
        _bad('from_logits must be a bool, got %r' % (from_logits,))
    if v['loss'] == 'mse' and from_logits:
        _bad('from_logits does not apply to mse')
    _, v['red_code'] = _name(settings, 'reduction', _REDUCTIONS, 'mean')
    v['epochs'] = _int(settings, 'epochs', 0, _I32)
    v['batch'] = _int(settings, 'batch', 0, _I32)
    v['ops'] = _trainable_ops(settings.get('trainable_ops'), file_identifier)
    return v


def _trainable_ops(ops, file_identifier):
    if ops is None:
        return None
    if file_identifier != b'CTR0':
        _bad('trainable_ops is not part of the %r schema' % (file_identifier,))
    if not isinstance(ops, (list, tuple)):
        _bad('trainable_ops must be a list of ints')
    return [_int({'trainable_ops[%d]' % i: x}, 'trainable_ops[%d]' % i, 0, _I32)
            for i, x in enumerate(ops)]


def _ops_vector(b, ops):
    if ops is None:
        return None
    b.StartVector(4, len(ops), 4)
    for x in reversed(ops):
        b.PrependInt32(x)
    return b.EndVector()


def _optimizer_table(b, v):
    # SGD's options: lr; Adam's: lr, beta1, beta2, eps
    if v['opt'] == 'adam':
        b.StartObject(4)
        b.PrependFloat32Slot(0, v['lr'], 0.0)
        for slot, x in enumerate(v['adam'], 1):
            b.PrependFloat32Slot(slot, x, 0.0)
    else:
        b.StartObject(1)
        b.PrependFloat32Slot(0, v['lr'], 0.0)
    return b.EndObject()


def _loss_table(b, v):
    # MSE has no options; the cross-entropies have from_logits
    if v['loss'] == 'mse':
        b.StartObject(0)
    else:
        b.StartObject(1)
        b.PrependBoolSlot(0, v['from_logits'], False)
    return b.EndObject()


def _root_table(b, v, file_identifier, ops_off, opt_off, loss_off):
    b.StartObject(_N_FIELDS[file_identifier])
    if ops_off is not None:
        b.PrependUOffsetTRelativeSlot(_F_TRAINABLE_OPS, ops_off, 0)
    b.PrependInt32Slot(_F_BATCH, v['batch'], 0)
    b.PrependInt32Slot(_F_EPOCHS, v['epochs'], 0)
    b.PrependUOffsetTRelativeSlot(_F_LOSS, loss_off, 0)
    b.PrependUOffsetTRelativeSlot(_F_OPT, opt_off, 0)
    b.PrependUint32Slot(_F_VERSION, v['version'], 0)
    b.PrependInt8Slot(_F_REDUCTION, v['red_code'], 0)
    b.PrependUint8Slot(_F_LOSS_TYPE, _LOSS_UNION[v['loss']], 0)
    b.PrependInt8Slot(_F_LOSSFN, v['loss_code'], 0)
    b.PrependUint8Slot(_F_OPT_TYPE, _OPT_UNION[v['opt']], 0)
    b.PrependInt8Slot(_F_OPTIMIZER, v['opt_code'], 0)
    return b.EndObject()
