"""A batch fixed in a .tflite / .circle file (Keras's Input(batch_size=4), a converter
given a batch-4 signature), rewritten to another where it is only a batch (issue 28).

utrain runs a model a sample at a time: prepare and evaluate run a copy of such a file
with batch 1 (pipeline.unbatched, infer.unbatched: check_batch, then set_batch), and
export writes the trained model back with the file's batch (set_batch on the exported
file).  The batch is 'only a batch' when every tensor computed from the batched inputs
keeps it as its first dimension: a RESHAPE that merges it into the features ([4, 8] ->
[32]), a TRANSPOSE that moves it, an op over axis 0 (a CONCATENATION, GATHER, reduction)
or a constant operand with a row per sample mixes it with the data, and set_batch
refuses it (BatchError) saying so."""
from __future__ import annotations

import numpy as np

from .circle_io import read_model, write_with_weights

# element-wise ops whose constant operand with the batch's rows would differ per sample
_ELEMENTWISE = {'ADD', 'SUB', 'MUL', 'DIV', 'MAXIMUM', 'MINIMUM', 'SQUARED_DIFFERENCE',
                'SELECT', 'SELECT_V2', 'POW', 'FLOOR_DIV', 'FLOOR_MOD', 'LESS', 'GREATER',
                'LESS_EQUAL', 'GREATER_EQUAL', 'EQUAL', 'NOT_EQUAL'}
# ops with an axis option that must not be the batch's
_AXIS_OPS = {'CONCATENATION', 'PACK', 'UNPACK', 'GATHER', 'SPLIT', 'SPLIT_V', 'ARG_MAX',
             'ARG_MIN', 'CUMSUM', 'SOFTMAX', 'L2_NORMALIZATION', 'REVERSE_V2'}
# ops whose axes are a constant input (input 1)
_AXES_INPUT = {'MEAN', 'SUM', 'REDUCE_MAX', 'REDUCE_MIN', 'REDUCE_PROD', 'REDUCE_ANY',
               'REVERSE_V2', 'CUMSUM', 'SPLIT'}


class BatchError(ValueError):
    pass


def file_batch(g) -> int:
    """The batch fixed in g's file: the first dimension its inputs of rank 2 or more share
    when it is more than 1 (validate.fixed_batch's), else 1."""
    ns = {int(g.tensors[k].shape[0]) for k in g.inputs if len(g.tensors[k].shape) >= 2}
    ns.discard(1)
    return max(ns) if ns else 1


def _plan(g, old, new):
    """(tensors to give first dimension new, {constant tensor: new data}, {op index:
    new_shape option}) for g's batch old -> new; BatchError where old is not only a batch."""
    where = g.path
    if getattr(g, 'n_subgraphs', 1) > 1:
        raise BatchError(f'{where}: its batch of {old} is fixed in a model with subgraphs '
                         '(a WHILE loop\'s, a Keras RNN\'s), which utrain does not rewrite')

    def const(k):
        return k >= 0 and g.tensors[k].data is not None

    def refuse(op, why):
        raise BatchError(f'{where}: op {op.index} ({op.name}) {why}, so the batch of {old} fixed '
                         'in the file is part of the data, not only a batch: utrain runs a sample '
                         'at a time; export the model with batch 1 or open (keras.Input(shape) '
                         'without batch_size; PyTorch: a dummy input of batch 1)')
    batch = {k for k in g.inputs if len(g.tensors[k].shape) >= 1
             and int(g.tensors[k].shape[0]) == old}
    consts, opts = {}, {}
    for op in g.ops:
        bin_ = [k for k in op.inputs if k in batch]
        if not bin_ or op.name == 'SHAPE':     # (SHAPE: run-time shape arithmetic)
            continue
        rank = len(g.tensors[bin_[0]].shape)
        for k in op.outputs:
            t = g.tensors[k]
            if not len(t.shape) or int(t.shape[0]) != old:
                refuse(op, f'gives tensor {k} ({t.name!r}) shape {list(t.shape)} from '
                           f'{list(g.tensors[bin_[0]].shape)}')
            batch.add(k)
        ax = op.options.get('axis')
        if op.name in _AXIS_OPS and isinstance(ax, int) and ax % max(rank, 1) == 0:
            refuse(op, 'works over axis 0')
        if op.name in _AXES_INPUT and len(op.inputs) > 1 and const(op.inputs[1 if op.name != 'SPLIT' else 0]):
            axes = np.asarray(g.tensors[op.inputs[1 if op.name != 'SPLIT' else 0]].data).ravel()
            if any(int(a) % max(rank, 1) == 0 for a in axes):
                refuse(op, 'works over axis 0')
        if op.name == 'TRANSPOSE' and len(op.inputs) > 1 and const(op.inputs[1]):
            if int(np.asarray(g.tensors[op.inputs[1]].data).ravel()[0]) != 0:
                refuse(op, 'moves the batch axis')
        if op.name in _ELEMENTWISE and old > 1:
            for k in op.inputs:
                t = g.tensors[k] if k >= 0 else None
                if t is not None and const(k) and len(t.shape) == rank and int(t.shape[0]) == old:
                    refuse(op, f'takes the constant tensor {k} ({t.name!r}) of shape '
                               f'{list(t.shape)}, a row for each sample of the batch')
        if op.name == 'RESHAPE':
            if len(op.inputs) > 1 and const(op.inputs[1]):
                d = np.array(g.tensors[op.inputs[1]].data).copy()
                if d.size and int(d.ravel()[0]) == old:
                    d.ravel()[0] = new
                    consts[op.inputs[1]] = d
            ns = op.options.get('new_shape')
            if ns and int(ns[0]) == old:
                opts[op.index] = [new] + [int(v) for v in ns[1:]]
        if op.name == 'SLICE' and len(op.inputs) > 2 and const(op.inputs[2]):
            d = np.array(g.tensors[op.inputs[2]].data).copy()
            if d.size and int(d.ravel()[0]) == old:
                d.ravel()[0] = new
                consts[op.inputs[2]] = d
        if op.name == 'STRIDED_SLICE' and len(op.inputs) > 2 and const(op.inputs[2]) and \
                not int(op.options.get('end_mask') or 0) & 1:
            d = np.array(g.tensors[op.inputs[2]].data).copy()
            if d.size and int(d.ravel()[0]) == old:
                d.ravel()[0] = new
                consts[op.inputs[2]] = d
    return batch, consts, opts


def check_batch(g, old=None) -> int:
    """g's fixed batch (1: none), BatchError where it is mixed with the data."""
    old = file_batch(g) if old is None else old
    if old > 1:
        _plan(g, old, 1)
    return old


def set_batch(src, out, old, new) -> int:
    """Write src to out with its batch old as new (tensors' first dimension and shape
    signature, RESHAPE shape constants and options, SLICE sizes / STRIDED_SLICE ends that
    span the batch); everything else as the file has it.  Returns how many tensors
    changed; BatchError where the batch is mixed with the data."""
    g = read_model(src)
    batch, consts, opts = _plan(g, old, new)

    def edit(model):
        sg = model.subgraphs[0]
        for k in batch:
            t = sg.tensors[k]
            t.shape = np.array([new] + [int(v) for v in t.shape[1:]], np.int32)
            if t.shapeSignature is not None and len(t.shapeSignature) == len(t.shape) \
                    and int(t.shapeSignature[0]) > 0:
                t.shapeSignature = np.array([new] + [int(v) for v in t.shapeSignature[1:]],
                                            np.int32)
        for i, ns in opts.items():
            o = sg.operators[i].builtinOptions
            if o is not None and getattr(o, 'newShape', None) is not None:
                o.newShape = np.array(ns, np.int32)
    write_with_weights(src, out, consts, edit=edit)
    return len(batch)
