"""Host passes over a circle graph, each a small function:

validate -> select_trainable -> derive_backward -> plan_memory

The result (a Plan) is what flatmodel.write_flat serialises for the device.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..formats.circle_io import Graph
from ..formats.ir import CONV3D_HINT
from .optable import SPECS, SUPPORTED, COMPARISONS, DW, DB, dx_bit


class PrepareError(ValueError):
    pass


# what validate says of an op it has no kernel for (prepare's int8 pass leaves it to it)
UNSUPPORTED = 'which utrain cannot run or train through yet'

def device_shape(shape):
    """2-D shape a tensor has on the device: (product of leading dims, last dim).
    An op may lay out its own parameters otherwise (OpSpec.shapes; device_shapes)."""
    shape = list(shape) or [1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return rows, int(shape[-1])


def device_shapes(g: Graph) -> list:
    """The device's 2-D shape of every tensor: device_shape, unless the op that reads
    it asks for another layout of the same bytes (OpSpec.shapes)."""
    shapes = [device_shape(t.shape) for t in g.tensors]
    for op in g.ops:
        spec = SPECS.get(op.name)
        if spec is not None and spec.shapes is not None:
            for k, rc in spec.shapes(op, g).items():
                assert rc[0] * rc[1] == shapes[k][0] * shapes[k][1], (op.index, k, rc)
                shapes[k] = rc
    return shapes


# how a Keras recurrent layer converts to ops utrain trains
UNROLL = ('a Keras LSTM, GRU or RNN layer converts to them given unroll=True and a fixed '
          'sequence length (keras.Input((T, F))), or export the model to ONNX')


def custom_hint(op) -> str:
    """What to do about a CUSTOM op: a Flex op is a TensorFlow op the converter kept
    (SELECT_TF_OPS: a Keras LSTM or GRU of an open batch writes TensorList ops), which
    no microcontroller runtime runs; any other is its own runtime's."""
    code = op.options.get('custom_code') or ''
    if code.startswith('Flex'):
        return ('a TensorFlow op the converter kept (converter.target_spec.supported_ops '
                'with SELECT_TF_OPS), which TFLite Micro cannot run either; convert with the '
                'TFLite builtin ops only: ' + UNROLL)
    return ('an op only its own runtime implements; export the model without it, the '
            f'layer made of builtin ops (supported: {", ".join(SUPPORTED)})')


def validate(g: Graph):
    """Reject what the device cannot run, naming the op or tensor and the file."""
    where = g.path
    if g.n_subgraphs != 1:
        loop = next((op for op in g.ops if op.name in ('WHILE', 'IF', 'CALL_ONCE')), None)
        raise PrepareError(f'{where}: has {g.n_subgraphs} subgraphs'
                           + (f' (op {loop.number} is {loop.name}, control flow: how '
                              'TFLiteConverter writes a Keras LSTM, GRU or RNN layer that is '
                              'not unrolled; prepare unrolls a WHILE of a fixed trip count '
                              'unless --no-rewrite)' if loop else '')
                           + '; utrain trains single-subgraph models: give each recurrent layer '
                           'unroll=True (Keras; a fixed sequence length) and convert again, '
                           'or export the model to ONNX')
    for op in g.ops:
        loop = getattr(op, 'trains_with', None)
        if op.name not in SPECS and loop is not None and loop.name == 'WHILE':
            from .loops import UNROLL_HINT        # (loops.unroll_loops made it)
            raise PrepareError(f'{where}: op {op.number} is a WHILE (a recurrent layer\'s loop, '
                               f'which utrain unrolls) whose body holds {op.name}, '
                               f'{UNSUPPORTED}: {UNROLL_HINT} (supported: {", ".join(SUPPORTED)})')
        if op.name == 'CUSTOM':
            raise PrepareError(f'{where}: op {op.number} is CUSTOM '
                               f'({op.options.get("custom_code") or "no custom code"}), '
                               f'{UNSUPPORTED}: {custom_hint(op)}')
        if op.name not in SPECS and 'SEQUENCE_' in op.name:    # (the converter's fused cells)
            raise PrepareError(f'{where}: op {op.number} is {op.name} (a recurrent layer as one '
                               f'fused op), {UNSUPPORTED}: convert it to the ops of its steps: '
                               + UNROLL)
        if op.name in ('CONV_3D', 'CONV_3D_TRANSPOSE'):
            raise PrepareError(f'{where}: op {op.number} is {op.name} (Keras '
                               f'{"Conv3D" if op.name == "CONV_3D" else "Conv3DTranspose"}), '
                               f'{UNSUPPORTED} as it is (prepare spells a float CONV_3D '
                               'with CONV_2Ds and a float CONV_3D_TRANSPOSE without dilation '
                               'with TRANSPOSE_CONVs, unless --no-rewrite): ' + CONV3D_HINT)
        if op.name == 'POW' and op.name not in SPECS and len(op.inputs) == 2 and \
                g.tensors[op.inputs[0]].data is not None and \
                g.tensors[op.inputs[1]].data is None:
            c = np.asarray(g.tensors[op.inputs[0]].data, np.float64)
            raise PrepareError(f'{where}: op {op.number} is POW of a constant base '
                               f'{c.ravel()[:4].tolist()} and an activation exponent: '
                               'utrain computes c ** y as exp(y ln c), which is pow\'s value '
                               'and gradient for a base above 0 only (a base of 0 or below: '
                               'pow is 0, inf or NaN there, and has no gradient in y); give '
                               'a base above 0 (for (-c) ** y of a whole y: multiply c ** y '
                               'by the sign yourself)')
        if op.name not in SPECS:
            raise PrepareError(f'{where}: op {op.number} is {op.name}, {UNSUPPORTED}: '
                               'export the model with the layer made of supported ops '
                               f'instead (supported: {", ".join(SUPPORTED)})')
        try:
            SPECS[op.name].options(op, g)
        except ValueError as e:         # unsupported options, shapes, non-constant indices
            raise PrepareError(f'{where}: {e}') from None
    used = set()
    for op in g.ops:
        spec = SPECS[op.name]
        dev = spec.inputs(op)
        roles = spec.roles(op, g)
        for pos, k in enumerate(op.inputs):
            if k < 0 or k not in dev:
                continue                # read on the host (e.g. a RESHAPE's shape)
            used.add(k)
            if pos in roles and g.tensors[k].data is None:
                raise PrepareError(f'{where}: op {op.number} {op.name} takes its {roles[pos]} '
                                   f'from non-constant tensor {k} ({g.tensors[k].name}); '
                                   'utrain needs constant weights')
        used.update(op.outputs)
    # a comparison's bool output is held as a 1.0 / 0.0 float mask (utrain.op_elem)
    masks = {op.outputs[0] for op in g.ops if op.name in COMPARISONS} - set(g.outputs)
    for k in sorted(used):
        t = g.tensors[k]
        if t.dtype != 'float32' and not (k in masks and t.dtype == 'bool'):
            # (one that carries scales was left by --no-rewrite, which skips the dequantizing:
            # 'this one has none' had been said of it too)
            scaled = t.dtype in ('int8', 'uint8') and (t.quant or {}).get('scale')
            raise PrepareError(f'{where}: tensor {k} ({t.name}) is {t.dtype}; utrain trains '
                               'float32 models (prepare dequantizes int8/uint8 tensors that carry '
                               + ('scales, as this one does, unless --no-rewrite: leave that out '
                                  'to train it)' if scaled else 'scales; this one has none)'))
    for k in list(g.inputs) + list(g.outputs):
        shape = g.tensors[k].shape
        if no_batch(g, k):
            raise PrepareError(no_batch(g, k))
        if shape[0] != 1:
            raise PrepareError(f'{where}: tensor {k} ({g.tensors[k].name}) has shape {shape}; '
                               'the batch dimension must be 1 (batch size is a training setting)')
    if len(g.outputs) != 1 or len(g.inputs) != 1:
        raise PrepareError(f'{where}: the graph the device runs takes one input and makes '
                           f'one output (this one has {len(g.inputs)} and {len(g.outputs)}): '
                           'runplan.one_input_output joins its inputs and keeps the output '
                           'the loss reads')


def no_batch(g, k) -> str | None:
    """Why graph input or output tensor k has no batch dimension utrain can run (a shape
    of rank 0 or 1: [6], []), with what to do, or None.  prepare had said 'the batch
    dimension must be 1' and nothing of what to do; evaluate ONERT's 'cannot run it
    (... name 'Oner' is not defined)'."""
    t = g.tensors[k]
    if len(t.shape) >= 2:
        return None
    io = 'input' if k in g.inputs else 'output'
    return (f'{g.path}: the {io} tensor {k} ({t.name!r}) has shape {list(t.shape)}: no batch '
            'dimension; utrain runs the model a sample at a time, as a batch of 1 '
            f'(shape {[1] + [int(d) for d in t.shape] if len(t.shape) else [1, 1]}): export '
            'it with a batch dimension (Keras: keras.Input(shape=...) without batch_size; '
            'PyTorch through tico: an example input of batch 1)')


def parse_train(spec, n_ops: int) -> set:
    """'all' | 'none' | 'last:N' (ONERT's num_of_trainable_ops: the last N operators in
    execution order, whatever their kind) or a list of op indices -> set of op indices."""
    if isinstance(spec, (list, tuple, set)):
        bad = [i for i in spec if not 0 <= i < n_ops]
        if bad:
            raise PrepareError(f'trainable ops {bad} out of range (the model has {n_ops} ops)')
        return set(spec)
    if spec == 'all':
        return set(range(n_ops))
    if spec == 'none':
        return set()
    if spec.startswith('last:'):
        try:
            n = int(spec[5:])
        except ValueError:
            n = -1
        if n >= 0:
            return set(range(max(n_ops - n, 0), n_ops))
    raise PrepareError(f'--train {spec!r}: expected all, none or last:N')


def reach_hint(ops, n_file: int, train) -> str:
    """For a --train last:N that selects nothing: '' or what N reaches the last op with
    weights.  ops: (file number, name) of the graph's ops; n_file: the file's op count."""
    if train == 'none':     # (the message had stopped at 'no trainable weights selected')
        return ('; --train none trains only the ops --ranks names: give --train all (or '
                'last:N), or --ranks OP:RANK')
    if not (isinstance(train, str) and train.startswith('last:')):
        return ''
    w = [(n, name) for n, name in ops if name in ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D')]
    if not w:
        return ''
    n, name = max(w)
    return (f'; --train last:N counts every op of the file, those after the last layer too: '
            f'last:{n_file - n} reaches op {n} ({name})')


# Sparse update: how much of an op trains.  onert-micro's training-config codes are
# 0 ALL, 1 ONLY_BIAS, 2 UP_1_2_PART (output channels [0, O/2)), 3 LOWER_1_2_PART
# ([O/2, O)); utrain adds the first 1/4 and 1/8 of the output channels (4, 5).
RANKS = {'all': 0, 'bias': 1, 'up': 2, 'low': 3, '1/4': 4, '1/8': 5}
RANKS['1/2'] = RANKS['up']
RANK_NAMES = {v: k for k, v in RANKS.items() if k != '1/2'}


def parse_ranks(text, n_ops: int) -> dict:
    """'OP:RANK,OP:RANK' (RANK: all, bias, 1/2, 1/4, 1/8, up, low; OP an op index or
    last:N for the last N ops) -> {op index: rank code}."""
    out, named = {}, {}
    for item in filter(None, (text or '').split(',')):
        op, _, rank = item.strip().rpartition(':')
        if rank not in RANKS or not op:
            raise PrepareError(f'--ranks {item!r}: expected OP:RANK with RANK one of '
                               f'{", ".join(RANKS)}')
        if not op.startswith('last:') and not op.strip().lstrip('-').isdigit():
            # (had been int()'s "invalid literal for int() with base 10: 'fc'")
            raise PrepareError(f'--ranks {item!r}: {op!r} is no op: give an op\'s index (the '
                               f'numbers `inspect` lists, 0 to {n_ops - 1}) or last:N')
        try:
            ops = parse_train(op, n_ops) if op.startswith('last:') else parse_train([int(op)], n_ops)
        except ValueError as e:
            raise PrepareError(f'--ranks {item!r}: {e}') from None
        if not op.startswith('last:'):      # an op named twice: which rank is meant?
            k = int(op)
            if k in named and named[k] != item.strip():
                raise PrepareError(f'--ranks: op {op} is given twice ({named[k]}, '
                                   f'{item.strip()}); give each op one rank')
            named[k] = item.strip()
        for i in ops:       # (an op named after a last:N range takes its own rank)
            out[i] = RANKS[rank]
    return out


def channel_range(rank: int, n: int):
    """Output channels [lo, hi) that train under rank for an op with n of them."""
    if rank == 2:
        return 0, n // 2
    if rank == 3:
        return n // 2, n
    if rank in (4, 5):
        return 0, max(1, n // (4 if rank == 4 else 8))
    return 0, n


def select_trainable(g: Graph, ops: set, ranks: dict = None):
    """The parameter tensors of the trainable ops -> {tensor: (op index, 'weight'|'bias')}.
    ranks {op: code}: ONLY_BIAS leaves the op's weight frozen."""
    params = {}
    for i in sorted(ops):
        op = g.ops[i]
        roles = SPECS[op.name].roles(op, g)
        if (ranks or {}).get(i) == 1 and not any(
                r == 'bias' and p < len(op.inputs) and op.inputs[p] >= 0 for p, r in roles.items()):
            raise PrepareError(f'{g.path}: op {op.number} {op.name} has no bias tensor: rank bias would '
                               f'train nothing there; give op {op.number} another rank (all, '
                               '1/2, 1/4, 1/8, up, low) or leave it out of --ranks')
        for pos, role in roles.items():
            if (ranks or {}).get(i) == 1 and role == 'weight':
                continue
            if pos < len(op.inputs) and op.inputs[pos] >= 0 and \
                    not g.tensors[op.inputs[pos]].frozen:   # (biases.separable_biases)
                params[op.inputs[pos]] = (i, role)
    return params


def rank_ranges(g: Graph, params: dict, ranks: dict) -> dict:
    """{tensor: (axis, lo, hi)} for parameters that train only some output channels:
    a weight's rows on the device ([O, ...]; a depthwise weight's columns, [taps, C*M]:
    its row's out_axis), a bias's columns ([1, O])."""
    shapes = device_shapes(g)
    out = {}
    for k, (i, role) in params.items():
        r = (ranks or {}).get(i, 0)
        if r < 2:
            continue
        axis = SPECS[g.ops[i].name].out_axis if role == 'weight' else 1
        n = shapes[k][axis]
        lo, hi = channel_range(r, n)
        if hi - lo < 1:
            raise PrepareError(f'op {g.ops[i].number} {g.ops[i].name}: rank {RANK_NAMES[r]} of {n} output '
                               'channels leaves none to train')
        if (lo, hi) != (0, n):
            out[k] = (axis, lo, hi)
    return out


def derive_backward(g: Graph, params: dict):
    """The backward list: (op index, flags) in reverse execution order, pruned to the
    ops whose output gradient some trainable parameter needs.  Data input n's gradient
    bit (dx_bit(n): DX for the first) is set only where that input's own gradient is
    needed further down."""
    needs = {}                       # tensor -> its gradient is needed

    def data(op):                    # (n, tensor) of the op's data inputs
        return SPECS[op.name].data(op)

    for op in g.ops:
        roles = SPECS[op.name].roles(op, g)
        trains = any(op.inputs[p] in params for p in roles if p < len(op.inputs))
        below = any(needs.get(k, False) for n, k in data(op))
        for k in op.outputs:
            needs[k] = trains or below
    out = []
    for op in reversed(g.ops):
        if not any(needs.get(k) for k in op.outputs):     # (a SPLIT's: any output)
            continue
        spec = SPECS[op.name]
        flags = 0
        for n, k in data(op):
            if needs.get(k, False):
                flags |= dx_bit(n)
        for pos, role in spec.roles(op, g).items():
            if pos < len(op.inputs) and op.inputs[pos] in params:
                flags |= DW if role == 'weight' else DB
        out.append((op.index, flags))
    return out


@dataclass
class Plan:
    trainable_ops: set
    params: dict                     # tensor -> (op, role)
    backward: list                   # [(op index, flags)]
    saved: set = field(default_factory=set)
    last_use: dict = field(default_factory=dict)
    ranks: dict = field(default_factory=dict)       # tensor -> (axis, lo, hi)
    op_ranks: dict = field(default_factory=dict)    # op -> rank code (as asked)
    bands: list = field(default_factory=list)       # [(lo, hi, rows)]: host_tools/graph/bands.py


def plan_memory(g: Graph, trainable_ops, params, backward) -> Plan:
    """Mark the activations the backward list reads (kept during a training forward
    pass) and each activation's last forward reader (freed after it)."""
    saved = set()
    for i, flags in backward:
        op = g.ops[i]
        for k in SPECS[op.name].saves(op, flags):
            if g.tensors[k].data is None:
                saved.add(k)
    last = {}
    for op in g.ops:
        for k in op.inputs:
            if k >= 0:
                last[k] = op.index
    return Plan(trainable_ops, params, backward, saved, last)


def plan(g: Graph, train='all', ranks=None) -> Plan:
    """ranks: {op index: rank code}; the ops it lists train too (with that rank)."""
    validate(g)
    ops = parse_train(train, len(g.ops))
    ranks = dict(ranks or {})
    ops |= set(ranks)
    params = select_trainable(g, ops, ranks)
    p = plan_memory(g, ops, params, derive_backward(g, params))
    p.ranks = rank_ranges(g, params, ranks)
    p.op_ranks = {i: ranks.get(i, 0) for i in ops}
    return p
