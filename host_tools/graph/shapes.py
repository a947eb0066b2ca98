"""Shapes the host knows: shape arithmetic folded into constants (fold_shapes), the
shape each op gives, window checks."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import Graph, Operator
from .edit import BINARY, REDUCE, UNARY, const_ints, is_const, remove_op


# ops fold_shapes computes when every input is known on the host (integer outputs only:
# shape arithmetic, never an activation or a weight)
_INT_BINARY = {'ADD': np.add, 'SUB': np.subtract, 'MUL': np.multiply,
               'FLOOR_DIV': np.floor_divide, 'MAXIMUM': np.maximum, 'MINIMUM': np.minimum}


# (Keras 3's Dense on a 3-D or 4-D input: SHAPE -> GATHER -> REDUCE_PROD -> PACK -> RESHAPE)
_INT_REDUCE = {'REDUCE_PROD': np.prod, 'SUM': np.sum, 'REDUCE_MAX': np.max,
               'REDUCE_MIN': np.min}


# comparisons and logic (a loop's condition; a reshape's -1 worked out at run time:
# SHAPE -> EQUAL -> WHERE -> SPARSE_TO_DENSE, as TensorFlow writes tf.reshape of a
# shape it computes)
_LOGIC = {'LESS': np.less, 'LESS_EQUAL': np.less_equal, 'GREATER': np.greater,
          'GREATER_EQUAL': np.greater_equal, 'EQUAL': np.equal, 'NOT_EQUAL': np.not_equal,
          'LOGICAL_AND': np.logical_and, 'LOGICAL_OR': np.logical_or}


def strided_slice(x, b, e, st, o):
    """TFLite STRIDED_SLICE on a numpy array (begin/end/shrink masks), None for the
    options it does not take (ellipsis, new axes, offset)."""
    if any(o.get(k) for k in ('ellipsis_mask', 'new_axis_mask', 'offset')) or \
            len(b) != x.ndim:
        return None
    idx = []
    for d in range(x.ndim):
        if o.get('shrink_axis_mask', 0) >> d & 1:
            idx.append(b[d])
        else:
            idx.append(slice(None if o.get('begin_mask', 0) >> d & 1 else b[d],
                             None if o.get('end_mask', 0) >> d & 1 else e[d], st[d]))
    return x[tuple(idx)]


def host_value(g: Graph, op: Operator):
    """The value of op's output when the host knows it (see fold_shapes), else None."""
    if op.name == 'SHAPE':
        return np.array(g.tensors[op.inputs[0]].shape)
    if not op.inputs or not all(is_const(g, k) for k in op.inputs if k >= 0):
        return None
    v = [np.asarray(g.tensors[k].data).reshape(g.tensors[k].shape) for k in op.inputs
         if k >= 0]
    o = op.options
    if op.name == 'PACK':
        return np.stack(v, int(o.get('axis', 0)))
    if op.name == 'FILL' and len(v) == 2:
        return np.full([int(d) for d in v[0].reshape(-1)], v[1].reshape(-1)[0])
    if op.name == 'CONCATENATION':
        return np.concatenate(v, int(o.get('axis', 0)))
    if op.name == 'GATHER' and not o.get('batch_dims'):
        return np.take(v[0], v[1], int(o.get('axis', 0)))
    if op.name == 'RESHAPE' and len(v) == 2 and v[1].size:
        return v[0].reshape([int(d) for d in v[1].reshape(-1)])
    if op.name in ('CAST', 'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS'):
        return v[0]
    if op.name == 'STRIDED_SLICE' and len(v) == 4:
        return strided_slice(v[0], *(list(a.reshape(-1)) for a in v[1:]), o)
    if op.name in _INT_REDUCE and len(v) == 2:
        axes = tuple(int(a) % max(v[0].ndim, 1) for a in v[1].reshape(-1))
        return _INT_REDUCE[op.name](v[0], axis=axes, keepdims=bool(o.get('keep_dims')))
    if op.name in _LOGIC and len(v) == 2:
        return _LOGIC[op.name](v[0], v[1])
    if op.name == 'LOGICAL_NOT':
        return np.logical_not(v[0])
    if op.name == 'WHERE' and len(v) == 1:
        return np.argwhere(v[0])
    if op.name in ('SELECT', 'SELECT_V2') and len(v) == 3:
        return np.where(v[0], v[1], v[2])
    if op.name == 'SPARSE_TO_DENSE' and len(v) == 4:
        out = np.full([int(d) for d in v[1].reshape(-1)], v[3].reshape(-1)[0], v[2].dtype)
        idx = v[0].reshape(-1, out.ndim) if out.ndim else v[0].reshape(-1, 0)
        vals = np.broadcast_to(v[2].reshape(-1), (len(idx),))
        for i, val in zip(idx, vals):
            out[tuple(int(a) for a in i)] = val
        return out
    if op.name == 'SLICE' and len(v) == 3:
        b = [int(i) for i in v[1].reshape(-1)]
        n = [int(i) for i in v[2].reshape(-1)]
        return v[0][tuple(slice(s_, None if k < 0 else s_ + k) for s_, k in zip(b, n))]
    if op.name in _INT_BINARY and len(v) == 2 and o.get('fused_activation_function',
                                                        'NONE') == 'NONE':
        return _INT_BINARY[op.name](v[0], v[1])
    return None


def integer_type(dtype: str) -> bool:
    """A tensor dtype name that is an integer type (False for names numpy lacks:
    'resource', 'variant', 'string', 'bfloat16', ...)."""
    try:
        return np.issubdtype(np.dtype(dtype), np.integer)
    except TypeError:
        return False


def fold_shapes(g: Graph) -> int:
    """Shape arithmetic whose value the host knows -> constants: SHAPE of any tensor
    (every shape is static here) and the integer ops over constants after it (Keras 3
    exports Reshape and Flatten as SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE, the batch
    read at run time), and a FILL of such a shape (a recurrent layer's zero initial
    state, sized by the batch read at run time: any dtype, it is a constant), and the
    comparisons, WHERE and SPARSE_TO_DENSE TensorFlow writes to work out a reshape's -1
    at run time.  Only ops with integer or boolean outputs that are not graph outputs
    fold; the folded ops are removed.
    Returns how many."""
    done, moved = 0, set()     # (moved: tensors whose shape the file could only guess)
    for op in list(g.ops):
        outs = [g.tensors[k] for k in op.outputs]
        if len(outs) != 1 or op.outputs[0] in g.outputs or not (
                op.name == 'FILL' or integer_type(outs[0].dtype) or outs[0].dtype == 'bool'):
            continue
        if op.name == 'SHAPE' and done:     # (a shape read after a reshape whose new shape
            _reshape_outputs(g, moved)      # was worked out above: its own, not the file's)
        try:
            v = host_value(g, op)
        except (ValueError, IndexError, TypeError):     # (left to validation to name)
            v = None
        if v is not None and _run_time_shape(outs[0], v) and list(v.shape) != outs[0].shape:
            outs[0].shape = list(v.shape)   # (WHERE's: the file's [1, 1] was a guess)
            moved.add(op.outputs[0])
        if v is None or int(np.prod(outs[0].shape)) != v.size:
            continue
        outs[0].data = np.ascontiguousarray(v.astype(outs[0].dtype).reshape(outs[0].shape))
        # (a FILL's values, a recurrent layer's zero initial state, are no parameter:
        # Keras does not train them, and the converter's one h0 = c0 would train as both)
        outs[0].frozen = outs[0].frozen or op.name == 'FILL'
        remove_op(g, op)
        done += 1
    if done:
        _reshape_outputs(g, moved)
    return done


def _run_time_shape(t, v) -> bool:
    """Tensor t's shape is known only at run time (its signature has -1s: WHERE's output
    and what is made of it) and value v has a shape that signature allows."""
    sig = t.signature
    return bool(sig) and -1 in sig and len(sig) == v.ndim and \
        all(s in (-1, d) for s, d in zip(sig, v.shape))


def _reshape_outputs(g: Graph, moved=()):
    """A RESHAPE whose new shape the host now knows gets that shape on its output: where
    the exporter could not infer it (a shape read at run time) the file may give a wrong
    one (Keras 3's UpSampling2D: [1, 1, 8, 4] for [1, 8, 8, 4]), and so may every op
    after it (the next conv's [1, 1, 6, 4] for [1, 6, 6, 4]): _propagate_shapes, from
    these and the tensors in moved."""
    changed = set(moved)
    for op in g.ops:
        if op.name != 'RESHAPE' or len(op.inputs) < 2 or not is_const(g, op.inputs[1]):
            continue
        new = _reshaped(g, op, g.tensors[op.inputs[0]].shape)
        y = g.tensors[op.outputs[0]]
        if new is not None and list(y.shape) != new and _may_reshape(g, op.outputs[0], new):
            y.shape = new
            changed.add(op.outputs[0])
    if changed:
        _propagate_shapes(g, changed)


def _reshaped(g: Graph, op: Operator, x):
    """The shape RESHAPE op (its new shape a constant) gives an input of shape x: its
    one -1 resolved; None where the sizes do not match."""
    new, n = const_ints(g, op.inputs[1]), int(np.prod(x))
    if new.count(-1) == 1:
        rest = int(np.prod([d for d in new if d != -1]))
        new[new.index(-1)] = n // rest if rest else 0
    return new if -1 not in new and int(np.prod(new)) == n else None


def _shape_after(g: Graph, op: Operator):
    """op's output shape from its inputs' shapes (TFLite's rules), or None where this
    does not know the op (its file shape is then kept, and validation judges it)."""
    sh = [list(g.tensors[k].shape) if k >= 0 else None for k in op.inputs]
    o, x = op.options, sh[0] if sh else None
    if x is None or len(op.outputs) != 1:
        return None
    if op.name in UNARY or op.name in ('SOFTMAX', 'LOG_SOFTMAX', 'L2_NORMALIZATION'):
        return x
    if op.name in BINARY or op.name == 'PRELU':
        try:
            return list(np.broadcast_shapes(*(tuple(s_) for s_ in sh[:2])))
        except ValueError:
            return None
    if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'MAX_POOL_2D', 'AVERAGE_POOL_2D'):
        if len(x) != 4:
            return None
        if op.name.endswith('POOL_2D'):
            kh, kw, c = int(o.get('filter_height', 1)), int(o.get('filter_width', 1)), x[3]
        else:
            w = sh[1]
            kh, kw = w[1], w[2]
            c = w[0] if op.name == 'CONV_2D' else w[3]
        from .optable import out_pad       # (TFLite's output size, as the float path checks it)
        pad, where = o.get('padding', 'SAME'), f'op {op.number} {op.name}'
        try:
            return [x[0], out_pad(x[1], kh, int(o.get('stride_h', 1)), int(o.get('dilation_h_factor', 1) or 1),
                                   pad, where)[0],
                    out_pad(x[2], kw, int(o.get('stride_w', 1)), int(o.get('dilation_w_factor', 1) or 1),
                             pad, where)[0], c]
        except ValueError:                  # (a padding it does not take: validation names it)
            return None
    if op.name in REDUCE and len(sh) > 1 and is_const(g, op.inputs[1]):
        axes = {a % len(x) for a in const_ints(g, op.inputs[1])}
        if o.get('keep_dims'):
            return [1 if a in axes else d for a, d in enumerate(x)]
        return [d for a, d in enumerate(x) if a not in axes]
    if op.name == 'FULLY_CONNECTED' and len(sh) > 1:
        n = sh[1][0]
        if o.get('keep_num_dims'):
            return x[:-1] + [n]
        return [int(np.prod(x)) // x[-1], n] if x[-1] else None
    if op.name == 'CONCATENATION':
        a = int(o.get('axis', 0)) % len(x)
        y = list(x)
        y[a] = sum(s_[a] for s_ in sh)
        return y
    if op.name == 'PAD' and len(sh) > 1 and is_const(g, op.inputs[1]):
        p = const_ints(g, op.inputs[1])
        return [d + p[2 * a] + p[2 * a + 1] for a, d in enumerate(x)] if len(p) == 2 * len(x) else None
    if op.name == 'TRANSPOSE' and len(sh) > 1 and is_const(g, op.inputs[1]):
        p = const_ints(g, op.inputs[1])
        return [x[a] for a in p] if sorted(p) == list(range(len(x))) else None
    if op.name == 'TILE' and len(sh) > 1 and is_const(g, op.inputs[1]):
        m = const_ints(g, op.inputs[1])
        return [d * k for d, k in zip(x, m)] if len(m) == len(x) else None
    if op.name == 'EXPAND_DIMS' and len(sh) > 1 and is_const(g, op.inputs[1]):
        a = const_ints(g, op.inputs[1])[0]
        a = a % (len(x) + 1)
        return x[:a] + [1] + x[a:]
    return _shape_after_more(g, op, sh, x)


def _shape_after_more(g: Graph, op: Operator, sh, x):
    # _shape_after's shape-moving ops (Keras's Cropping2D after an UpSampling2D is a
    # STRIDED_SLICE of a tensor whose shape the file gives as [1, 1, W, C])
    o = op.options
    consts = len(sh) > 1 and all(is_const(g, k) for k in op.inputs[1:] if k >= 0)
    if op.name == 'STRIDED_SLICE' and consts and len(op.inputs) == 4 and \
            not any(o.get(k) for k in ('ellipsis_mask', 'new_axis_mask', 'offset')):
        begin, end, step = (const_ints(g, op.inputs[i]) for i in (1, 2, 3))
        if not len(begin) == len(end) == len(step) == len(x) or 0 in step:
            return None
        try:        # (the slice of a view of x's shape: no data)
            return list(strided_slice(np.broadcast_to(np.int8(0), x), begin, end, step, o).shape)
        except IndexError:      # (a shrunk axis's index outside it)
            return None
    if op.name == 'SLICE' and consts and len(op.inputs) == 3:
        begin, size = const_ints(g, op.inputs[1]), const_ints(g, op.inputs[2])
        if not len(begin) == len(size) == len(x):
            return None
        return [d - b if n < 0 else n for d, b, n in zip(x, begin, size)]
    if op.name == 'SQUEEZE':
        axes = {a % len(x) for a in o.get('squeeze_dims') or []}
        return [d for a, d in enumerate(x) if (a not in axes if axes else d != 1)]
    if op.name == 'RESHAPE' and consts and len(op.inputs) > 1:
        return _reshaped(g, op, x)
    if op.name in ('RESIZE_NEAREST_NEIGHBOR', 'RESIZE_BILINEAR') and consts and len(x) == 4:
        hw = const_ints(g, op.inputs[1])
        return [x[0]] + list(hw) + [x[3]] if len(hw) == 2 else None
    if op.name in ('PADV2', 'MIRROR_PAD') and consts:
        p = const_ints(g, op.inputs[1])
        return [d + p[2 * a] + p[2 * a + 1] for a, d in enumerate(x)] if len(p) == 2 * len(x) else None
    return None


def check_window_shapes(g: Graph) -> None:
    """ValueError naming the file and op where a convolution's or a pool's output shape
    in the file is not what its input, kernel, strides and padding give (a converter's
    static shape after a shape read at run time that the host could not fold): the int8
    kernels size their buffers from them.  The float path checks the same per op
    (optable._spatial)."""
    for op in g.ops:
        if op.name not in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'MAX_POOL_2D', 'AVERAGE_POOL_2D') \
                or len(op.outputs) != 1:
            continue
        want, has = _shape_after(g, op), list(g.tensors[op.outputs[0]].shape)
        if want is not None and want != has:
            raise ValueError(f'{g.path}: op {op.number} {op.name}: the file gives its output '
                             f'shape {has}, its input {list(g.tensors[op.inputs[0]].shape)} '
                             f'and its geometry give {want}; export the model with static '
                             'shapes (a fixed batch of 1)')


def _may_reshape(g: Graph, k: int, new) -> bool:
    """Whether tensor k may take shape new in place of the file's: any inner tensor; a
    graph output (the loss and the data are checked against its shape) only where the
    file's shape signature says the dimensions that differ are known at run time only
    (-1: Keras's UpSampling2D or Reshape just before the output)."""
    if k not in g.outputs:
        return True
    t = g.tensors[k]
    sig = list(t.signature or [])
    return len(sig) == len(t.shape) == len(new) and all(
        s_ < 0 for s_, a, b in zip(sig, t.shape, new) if a != b)


def _propagate_shapes(g: Graph, changed: set):
    """Each op reading a tensor whose shape changed gets its output shape again from its
    inputs (_shape_after), in execution order; graph outputs keep the file's shape (the
    loss and the data are checked against it) unless its signature leaves the changed
    dimensions to run time (_may_reshape)."""
    for op in g.ops:
        if not changed.intersection(op.inputs) or len(op.outputs) != 1:
            continue
        y = g.tensors[op.outputs[0]]
        new = _shape_after(g, op)
        if new is not None and list(y.shape) != list(new) and \
                all(isinstance(d, (int, np.integer)) and d > 0 for d in new) and \
                _may_reshape(g, op.outputs[0], new):
            y.shape = [int(d) for d in new]
            changed.add(op.outputs[0])
