"""The flattened model: the compact file the device interpreter streams with `struct`.
Layout: docs/flat-model.md.  write_flat serialises a Graph + Plan (the one writer);
read_flat parses it back with the board's reader (tests, export of a ranked checkpoint).
"""
from __future__ import annotations

import io
import struct
import types
import zlib

import numpy as np

from ..formats.circle_io import Graph, atomic_write
from ..graph.optable import SPECS, DX, DW, DB, dx_bit
from ..graph.passes import Plan, device_shapes

# The layout constants have one home: the device's reader.
from ..target.device import module

_dev = module('flat')
MAGIC, VERSION, HDR, SETTINGS, TENSOR, RANK = (_dev.MAGIC, _dev.VERSION, _dev.HDR, _dev.SETTINGS,
                                               _dev.TENSOR, _dev.RANK)
ACT, CONST, TRAIN, UNUSED, SAVE, NO_USE = (_dev.ACT, _dev.CONST, _dev.TRAIN, _dev.UNUSED,
                                           _dev.SAVE, _dev.NO_USE)
GRAD, OP = _dev.GRAD, _dev.OP
LOSSES, OPTIMIZERS, METRICS, REDUCTIONS = _dev.LOSSES, _dev.OPTIMIZERS, _dev.METRICS, _dev.REDUCTIONS

DEFAULTS = dict(loss='mse', reduction='mean', from_logits=False, optimizer='sgd',
                metric='accuracy', shuffle=False, batch=1, epochs=1, seed=0, lr=0.01,
                momentum=0.0, beta1=0.9, beta2=0.999, eps=1e-7, rho=0.9, stream=False,
                # training recipes: train.json only (micro/utrain/optim.py, trainer.RECIPE)
                weight_decay=0.0, schedule='constant', warmup=0, schedule_steps=0,
                step_size=1, gamma=0.1, min_lr=0.0)
SCHEDULES = module('sched').SCHEDULES
RECIPE = ('weight_decay', 'schedule', 'warmup', 'schedule_steps', 'step_size', 'gamma', 'min_lr')


def pack_settings(s: dict) -> bytes:
    return struct.pack(SETTINGS, LOSSES.index(s['loss']), REDUCTIONS.index(s['reduction']),
                       int(s['from_logits']), OPTIMIZERS.index(s['optimizer']),
                       METRICS.index(s['metric']), int(s['shuffle']), s['batch'], s['epochs'],
                       int(bool(s.get('stream'))), s['seed'], s['lr'], s['momentum'], s['beta1'], s['beta2'], s['eps'],
                       s['rho'])


def tensor_kinds(g: Graph, plan: Plan) -> list[int]:
    """Device kind per tensor: trainable, frozen constant, activation, or unused."""
    used = set()
    for op in g.ops:
        used.update(k for k in SPECS[op.name].inputs(op) if k >= 0)
        used.update(op.outputs)
    used.update(g.inputs)
    kinds = []
    for t in g.tensors:
        if t.index not in used:
            kinds.append(UNUSED)
        elif t.index in plan.params:
            kinds.append(TRAIN)
        elif t.data is not None:
            kinds.append(CONST)
        else:
            kinds.append(ACT)
    return kinds


def grad_inputs(g: Graph, plan: Plan) -> set:
    """The tensors flagged GRAD: data inputs n >= 1 of a backward entry whose gradient
    it computes (its flags' dx_bit(n))."""
    out = set()
    for i, fl in plan.backward:
        for n, k in SPECS[g.ops[i].name].data(g.ops[i]):
            if n and fl & dx_bit(n):
                out.add(k)
    return out


def write_flat(g: Graph, plan: Plan, settings: dict, path) -> dict:
    """Write the flattened model; returns a small summary (sizes) for the caller."""
    kinds = tensor_kinds(g, plan)
    nt = len(g.tensors)
    # the format's own bounds (tensor indices are i16, op indices u16 with 0xFFFF for
    # 'never freed'): refused by name, not a struct.error
    if nt > 0x7FFF or len(g.ops) >= NO_USE:
        raise ValueError(f'{g.path}: {nt} tensors and {len(g.ops)} ops; the flat model holds up '
                         f'to {0x7FFF} tensors and {NO_USE - 1} ops')
    head = bytearray()
    head += pack_settings(settings)
    head += struct.pack(f'<{len(g.inputs) + len(g.outputs)}H', *g.inputs, *g.outputs)
    table_at = 32 + len(head)
    ops = bytearray()
    for op in g.ops:
        spec = SPECS[op.name]
        ins = spec.inputs(op)
        opts = spec.options(op, g)
        for what, n in (('inputs', len(ins)), ('outputs', len(op.outputs)), ('option floats', len(opts))):
            if n > 0xFFFF:
                raise ValueError(f'op {op.number} {op.name}: {n} {what}; the flat model holds up to 65535')
        ops += struct.pack(OP, spec.code, len(ins), len(op.outputs), len(opts))
        ops += struct.pack(f'<{len(ins)}h', *ins)
        ops += struct.pack(f'<{len(op.outputs)}h', *op.outputs)
        ops += struct.pack(f'<{len(opts)}f', *opts)
    # the backward entry's u16 holds DX, DW and DB; a data input n >= 1 whose gradient is
    # needed (the plan's dx_bit(n)) is flagged GRAD on its tensor, so an op may have any
    # number of inputs (a CONCATENATION of every time step's state)
    bwd = b''.join(struct.pack('<HH', i, fl & (DX | DW | DB)) for i, fl in plan.backward)
    grad_in = grad_inputs(g, plan)
    bwd += b''.join(struct.pack(RANK, k, ax, 0, lo, hi) for k, (ax, lo, hi) in sorted(plan.ranks.items()))
    bwd += b''.join(struct.pack(module('bands').BAND, *b) for b in plan.bands)
    data_start = table_at + 16 * nt + len(ops) + len(bwd)
    data_start += -data_start % 4
    tensors = bytearray()
    blobs = []
    pos = data_start
    for t, kind, (r, c) in zip(g.tensors, kinds, device_shapes(g)):
        off = 0
        if kind == CONST:
            blob = np.ascontiguousarray(t.data, dtype='<f4').tobytes()
            off = pos
            blobs.append(blob)
            pos += len(blob)
        flags = (SAVE if t.index in plan.saved else 0) | (GRAD if t.index in grad_in else 0)
        last = plan.last_use.get(t.index, NO_USE)
        if t.index in g.outputs:
            last = NO_USE
        tensors += struct.pack(TENSOR, kind, flags, last, r, c, off)
    body = bytes(head) + bytes(tensors) + bytes(ops) + bwd
    body += b'\0' * (data_start - 32 - len(body))
    fields = (MAGIC, VERSION, 1 if plan.backward else 0, nt, len(g.ops), len(plan.backward),
              len(g.inputs), len(g.outputs), data_start, pos, len(plan.ranks), len(plan.bands))
    rest = body + b''.join(blobs)
    crc = zlib.crc32(rest, zlib.crc32(struct.pack(HDR, *fields, 0)))
    data = struct.pack(HDR, *fields, crc) + rest
    assert len(data) == pos
    atomic_write(path, data)
    return {'bytes': pos, 'const_bytes': pos - data_start, 'table_bytes': data_start}


def read_flat(path) -> dict:
    """Parse a flattened model with the board's reader (utrain.flat.load: the same checks,
    size and CRC first), for tests and the host's tools.  Returns its tables: settings,
    inputs, outputs, shapes, ops, backward, ranks, trainable, consts {tensor: array},
    size."""
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f'{path}: cannot read ({e.strerror})') from None
    net = types.SimpleNamespace()
    try:
        _dev.load(net, io.BytesIO(data), path, module('wof'))
    except _dev.ModelError as e:
        raise ValueError(str(e)) from None
    consts = {k: net.t[k] for k in range(len(net.t))
              if net.t[k] is not None and k not in net.trainable}
    return dict(settings=net.settings, inputs=net.inputs, outputs=net.outputs, shapes=net.shape,
                ops=net.ops, backward=net.bwd, ranks=net.rank, trainable=net.trainable,
                consts=consts, size=len(data))
