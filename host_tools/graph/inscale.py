"""The input scale: a model's input multiplied so its RMS suits training, the weights it
reaches divided back (scale_input), undone for export (unscale_input)."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator
from .edit import WEIGHT_OUT_AXIS, consumers, is_const, new_tensor, remove_op, renumber, trains_as
from .inout import io_name


# ops f with f(s x) = s f(x) for s > 0 (one data input; fused activation none or RELU):
# an input scale passes through them unchanged (scale_input)
HOMOGENEOUS = {'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS', 'TRANSPOSE', 'STRIDED_SLICE', 'SLICE',
               'SPLIT', 'SPLIT_V', 'MAX_POOL_2D', 'AVERAGE_POOL_2D', 'MEAN', 'RELU', 'PAD'}


_SCALED = '/utrain_scaled'      # the name scale_input gives the scaled input (and export finds)


def scaled_reach(g: Graph, x: int, dtype=np.float32):
    """The weighted ops (WEIGHT_OUT_AXIS: their data input first, a weight of dtype read
    by them alone: float32, or an int8 model's int8, quant.relabel_input) that tensor x
    reaches through HOMOGENEOUS ops only, or None when x reaches anything else (another
    op, a graph output, a shared weight)."""
    ends, todo, seen = [], [x], set()
    while todo:
        k = todo.pop()
        if k in g.outputs:
            return None
        for op in consumers(g, k):
            if id(op) in seen:
                continue
            seen.add(id(op))
            data = [i for i in op.inputs if i >= 0 and not is_const(g, i)]
            act = op.options.get('fused_activation_function') or 'NONE'
            if op.name in WEIGHT_OUT_AXIS and data == [k] and op.inputs[0] == k and \
                    is_const(g, op.inputs[1]) and len(consumers(g, op.inputs[1])) == 1 and \
                    np.asarray(g.tensors[op.inputs[1]].data).dtype == dtype:
                ends.append(op)
            elif op.name in HOMOGENEOUS and data == [k] and act in ('NONE', 'RELU'):
                todo.extend(op.outputs)
            else:
                return None
    return ends


def input_scale_for(rms) -> float:
    """The power of two nearest 1 / rms that scale_input multiplies an input of that root
    mean square by, or 0 where the rms is under 2^2.5 (or none, or not finite)."""
    if not rms or not np.isfinite(rms):
        return 0
    e = int(round(float(np.log2(rms))))
    return 2.0 ** -e if e >= 3 else 0


def adam_keeps_scale(ws, s) -> bool:
    """Does an input scale s suit Adam for the weights ws it reaches (float arrays, as the
    file has them)?  Adam's step is lr in each weight's own units whatever the gradient's
    size, so scaling moves those weights' steps by s relative to them.  Where the file's
    weights carry a folded input scale (Keras Rescaling(1/255) in a conv: weights ~1/255 of
    their trained size) the scaled weights (ws / s) are of ordinary size and Adam steps as
    in the unfolded model Keras trained; where the model was trained on the raw input
    (weights already of ordinary size, ws / s far larger) scaling leaves their steps s times
    too small (h39i: a +-100 input lost 27-54 points under Adam), so Adam takes it as
    given.  Ordinary: root mean square of ws / s at most 1."""
    w = np.concatenate([np.asarray(a, np.float64).ravel() for a in ws]) if ws else np.zeros(0)
    return bool(w.size) and float(np.sqrt(np.mean(np.square(w)))) / s <= 1.0


def scale_input(g: Graph, keep=frozenset()):
    """A float model whose input is far larger than 1 (g.input_rms: 0..255 pixels into a
    Conv2D whose Keras Rescaling(1/255) the converter folded into its weights, raw sensor
    units) trains on its input times s, the power of two nearest 1 / rms: a MUL by s
    before everything and the weights of the layers the input reaches (through
    HOMOGENEOUS ops) divided by s.  The same function, bit for bit; but SGD moves those
    weights s^2 times less (Adam s times), as when the model was trained with the scale
    in a layer of its own: on the folded form SGD's default lr makes the loss diverge.
    Only where a layer the input reaches trains (keep: ids of the ops that do) and the
    rms is 2^2.5 or more.  Export folds s back (unscale_input).  Returns s, or 0.  A
    model with several inputs: each input by its own (g.inputs_rms {its data key
    (io_name): rms of the data's array for it}), returning {key: s} of those scaled, or 0."""
    if len(g.inputs) > 1:
        rms = getattr(g, 'inputs_rms', None) or {}
        out = {}
        for x in list(g.inputs):
            s = _scale_one(g, x, input_scale_for(rms.get(io_name(g, x))), keep)
            if s:
                out[io_name(g, x)] = s
        return out or 0
    return _scale_one(g, g.inputs[0], input_scale_for(g.input_rms), keep)


def _scale_one(g: Graph, x: int, s: float, keep) -> float:
    """scale_input of graph input x by s (0: not): s where it scaled, else 0."""
    if not s or g.tensors[x].dtype != 'float32':
        return 0
    ends = scaled_reach(g, x)
    if not ends or not any(id(trains_as(op)) in keep for op in ends):
        return 0
    with np.errstate(over='ignore'):
        scaled = [(np.asarray(g.tensors[op.inputs[1]].data) / np.float32(s)).astype(np.float32)
                  for op in ends]
    if not all(np.isfinite(w).all() for w in scaled):
        return 0                # (data in the 1e30s: the weights would overflow float32)
    if getattr(g, 'optimizer', None) == 'adam' and \
            not adam_keeps_scale([g.tensors[op.inputs[1]].data for op in ends], s):
        return 0                # (trained on the raw input: Adam takes it as given)
    first = consumers(g, x)
    y = new_tensor(g, g.tensors[x].name + _SCALED, g.tensors[x].shape)
    c = new_tensor(g, g.tensors[x].name + '/utrain_scale', [1], np.array([s], np.float32))
    for op in first:
        op.inputs = [y if k == x else k for k in op.inputs]
    g.ops.insert(0, Operator(-1, OP_CODES['MUL'], 'MUL', [x, c], [y],
                             {'fused_activation_function': 'NONE'}, src=first[0].number))
    renumber(g)
    for op, w in zip(ends, scaled):
        g.tensors[op.inputs[1]].data = w
    return s


def unscale_input(g: Graph, weights=None):
    """scale_input undone in g (for export: the file's graph): its MUL (each input's, of a
    model with several) dropped and the weights it reaches multiplied by s again, in g and
    in weights {tensor index: trained array} (returned).  Returns (weights, the first
    input's s or 0)."""
    w, first = dict(weights or {}), 0
    while True:
        op = next((o for o in g.ops if o.name == 'MUL' and o.inputs and o.inputs[0] in g.inputs
                   and g.tensors[o.outputs[0]].name.endswith(_SCALED)), None)
        if op is None or not is_const(g, op.inputs[1]):
            return w, first
        x, y = op.inputs[0], op.outputs[0]
        s = np.float32(np.asarray(g.tensors[op.inputs[1]].data).reshape(-1)[0])
        for e in scaled_reach(g, y) or ():
            k, t = e.inputs[1], g.tensors[e.inputs[1]]
            t.data = (np.asarray(t.data, np.float32) * s).astype(np.float32)
            if k in w:
                w[k] = (np.asarray(w[k], np.float32).reshape(t.shape) * s).astype(np.float32)
        for o in g.ops:
            o.inputs = [x if k == y else k for k in o.inputs]
        remove_op(g, op)
        first = first or float(s)
