"""Graph-editing primitives every rewrite pass uses: readers of a tensor, new tensors,
removing, replacing and moving ops, constants read as integers, the op families."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator, Tensor


UNARY = {'RELU', 'RELU6', 'RELU_N1_TO_1', 'LOGISTIC', 'TANH', 'HARD_SWISH', 'LEAKY_RELU', 'ELU',
         'ABS', 'NEG', 'EXP', 'LOG', 'SQRT', 'RSQRT', 'SQUARE', 'ELU', 'GELU', 'PRELU_NONE',
         'CAST', 'FLOOR', 'CEIL', 'SIN', 'COS', 'QUANTIZE', 'DEQUANTIZE'}


BINARY = {'ADD', 'SUB', 'MUL', 'DIV', 'MAXIMUM', 'MINIMUM', 'SQUARED_DIFFERENCE', 'POW'}


REDUCE = {'MEAN', 'SUM', 'REDUCE_MAX', 'REDUCE_MIN', 'REDUCE_PROD'}


# float elementwise ops as the host computes them (numpy): an int8 model's float islands
# tabulated (prepare/quant.py), a piecewise branch's value at its break (selects_to_relu);
# a comparison gives 1.0 / 0.0, which SELECT_V2 reads as its mask
FLOAT_FNS = {'NEG': np.negative, 'ABS': np.abs, 'SQUARE': np.square, 'SQRT': np.sqrt,
             'RSQRT': lambda x: 1 / np.sqrt(x), 'EXP': np.exp, 'LOG': np.log,
             'LOGISTIC': lambda x: 1 / (1 + np.exp(-x)), 'TANH': np.tanh,
             'RELU': lambda x: np.maximum(x, 0), 'RELU6': lambda x: np.clip(x, 0, 6),
             'ELU': lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
             'ADD': np.add, 'SUB': np.subtract, 'MUL': np.multiply, 'DIV': np.divide,
             'MAXIMUM': np.maximum, 'MINIMUM': np.minimum,
             'GREATER': np.greater, 'GREATER_EQUAL': np.greater_equal, 'LESS': np.less,
             'LESS_EQUAL': np.less_equal, 'SELECT_V2': lambda m, a, b: np.where(m != 0, a, b)}


# out-channel axis of each layer's weight (the axis a per-channel scale multiplies)
WEIGHT_OUT_AXIS = {'CONV_2D': 0, 'DEPTHWISE_CONV_2D': 3, 'FULLY_CONNECTED': 0}


QUANT_TYPES = {'int8', 'uint8', 'int16', 'int32'}


def consumers(g: Graph, k: int) -> list:
    return [op for op in g.ops if k in op.inputs]


def is_const(g: Graph, k: int) -> bool:
    return k >= 0 and g.tensors[k].data is not None


def new_tensor(g: Graph, name: str, shape, data=None, dtype=None, like=None) -> int:
    """Append a tensor; like: a tensor index whose dtype and quantization it takes (an
    activation of an int8 graph stays int8 at its scale)."""
    quant = None
    if like is not None:
        dtype, quant = g.tensors[like].dtype, g.tensors[like].quant
    if data is not None:
        data = np.asarray(data, dtype=dtype)
        dtype = data.dtype.name
    t = Tensor(len(g.tensors), name, [int(s) for s in shape], dtype or 'float32', data, -1,
               dict(quant) if quant else None)
    g.tensors.append(t)
    return t.index


def renumber(g: Graph):
    for i, op in enumerate(g.ops):
        op.index = i


def remove_op(g: Graph, op: Operator):
    g.ops.remove(op)
    renumber(g)


def replace_op(g: Graph, op: Operator, made: list):
    """The ops made (a rewrite of op into several) take op's place in g's order."""
    at = g.ops.index(op)
    g.ops[at:at + 1] = made
    renumber(g)


def move_after(g: Graph, op: Operator, anchor: Operator):
    g.ops.remove(op)
    g.ops.insert(g.ops.index(anchor) + 1, op)
    renumber(g)


def bypass(g: Graph, op: Operator, src: int, dst: int):
    """Delete ``op`` (whose output ``dst`` equals its input ``src`` in value): readers of
    dst read src.  When dst is a graph output, the producer of src writes dst instead."""
    if dst in g.outputs:
        prod = [o for o in g.ops if src in o.outputs]
        if src in g.inputs or not prod or len(consumers(g, src)) > 1 or \
                g.tensors[src].shape != g.tensors[dst].shape:
            return False
        p = prod[0]
        p.outputs[p.outputs.index(src)] = dst
    else:
        for o in g.ops:
            o.inputs = [src if k == dst else k for k in o.inputs]
    remove_op(g, op)
    return True


def const_ints(g: Graph, k: int):
    if not is_const(g, k):
        return None
    return [int(v) for v in np.asarray(g.tensors[k].data).reshape(-1)]


def perm_of(g: Graph, op: Operator):
    """The permutation of a TRANSPOSE with a constant perm, else None."""
    if op.name != 'TRANSPOSE' or len(op.inputs) < 2:
        return None
    return const_ints(g, op.inputs[1])


def make_reshape(g: Graph, op: Operator, out_shape):
    op.name, op.code = 'RESHAPE', OP_CODES['RESHAPE']
    shp = new_tensor(g, g.tensors[op.outputs[0]].name + '/shape', [len(out_shape)],
                     np.array(out_shape, np.int32))
    op.inputs = [op.inputs[0], shp]
    op.options = {'new_shape': list(out_shape)}


def slice_op(g: Graph, x: int, y: int, name: str, begin, end, strides, src,
              shrink: int = 0) -> Operator:
    """A STRIDED_SLICE of x into y, its begin / end / strides constant int32 tensors named
    name + '_begin' ... (gathers_to_slices, splits_to_slices)."""
    ins = [x] + [new_tensor(g, name + f'_{w}', [len(v)], np.int32(v))
                 for w, v in (('begin', begin), ('end', end), ('strides', strides))]
    return Operator(-1, OP_CODES['STRIDED_SLICE'], 'STRIDED_SLICE', ins, [y],
                    {'shrink_axis_mask': shrink} if shrink else {}, src=src)


def reversal_ops(g: Graph, x: int, y: int, a: int, prefix: str, src, like=None) -> list:
    """x reversed along axis a into y through ops that train: a STRIDED_SLICE of each index
    along it (tensors prefix + 'at<i>', dtype of like, else y) and a CONCATENATION of them
    in reverse order (loops.reverse_to_concat, spellings.reversed_slices)."""
    X = list(g.tensors[x].shape)
    made, parts = [], []
    for i in reversed(range(X[a])):
        b, e = [0] * len(X), list(X)
        b[a], e[a] = i, i + 1
        parts.append(new_tensor(g, f'{prefix}at{i}', X[:a] + [1] + X[a + 1:],
                                like=y if like is None else like))
        made.append(slice_op(g, x, parts[-1], f'{prefix}at{i}', b, e, [1] * len(X), src))
    made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', parts, [y],
                         {'axis': a, 'fused_activation_function': 'NONE'}, src=src))
    return made


def spell(g: Graph, op: Operator, steps, own=-1) -> None:
    """Replace op by steps [(name, inputs, options, shape)]: each writes a new float32
    tensor of that shape (None: op's output shape), the last writes op's output; an
    input 'prev' is the previous step's output, '@j' step j's.  Step `own` is op itself,
    rewritten in place: --train and --ranks find the ops they select by identity (the
    step with the op's parameter trains when the op does)."""
    y, made, outs = op.outputs[0], [], []
    own %= len(steps)
    for j, (name, ins, opts, shape) in enumerate(steps):
        ins = [outs[-1] if k == 'prev' else outs[int(k[1:])] if isinstance(k, str) else k
               for k in ins]
        out = y if j == len(steps) - 1 else new_tensor(
            g, g.tensors[y].name + f'/{name.lower()}{j}',
            list(g.tensors[y].shape) if shape is None else shape)
        outs.append(out)
        if j == own:
            op.name, op.code, op.inputs, op.outputs, op.options = \
                name, OP_CODES[name], ins, [out], dict(opts)
            made.append(op)
        else:
            made.append(Operator(-1, OP_CODES[name], name, ins, [out], dict(opts), src=op.src))
    replace_op(g, op, made)


def own(g: Graph, k: int) -> int:
    """k, or a copy of it when it is a constant (a rewrite reading it twice would
    otherwise train one parameter from two ops)."""
    if not is_const(g, k):
        return k
    t = g.tensors[k]
    return new_tensor(g, t.name + '/copy', t.shape, np.array(t.data), dtype=t.dtype)


NO_ACTIVATION = {'fused_activation_function': 'NONE'}


def producer(g: Graph, k: int):
    return next((o for o in g.ops if k in o.outputs), None)


def trains_as(op: Operator) -> Operator:
    """The op whose selection (--train, --ranks: by identity) op follows: the op a rewrite
    made it from where it carries a part of that op's weights (split_groups), else op."""
    return getattr(op, 'trains_with', op)
