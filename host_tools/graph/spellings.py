"""Ops utrain lacks spelled with ops it has: SPLIT for slices and UNPACK, STRIDED_SLICE
for SLICE, GATHER for MIRROR_PAD, slices and RESHAPEs for DEPTH_TO_SPACE and SPACE_TO_DEPTH,
PAD for PADV2, CONCATENATION for PACK, TILE and RESIZE, HARD_SWISH expanded, GATHERs as slices, a global REDUCE_MAX
as a pool, dilated convs, elementwise forms, piecewise SELECTs as RELUs."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator
from .edit import (FLOAT_FNS, NO_ACTIVATION, REDUCE, const_ints, consumers, is_const,
                   make_reshape, new_tensor, own, producer, remove_op, renumber, replace_op,
                   reversal_ops, slice_op, spell)
from .optable import same_pads, tconv_form


def slices_to_split(g: Graph) -> int:
    """STRIDED_SLICEs that cut one activation into consecutive pieces along one axis
    (stride 1, no masks; tico's unrolled LSTM/GRU takes each time step of the input
    projection so) -> one SPLIT_V: its backward writes one input-sized gradient instead
    of one per slice, summed (T of them for T steps: O(T^2) work and heap churn).
    Returns the number of SPLIT_Vs made."""
    groups = {}
    for op in g.ops:
        if op.name != 'STRIDED_SLICE' or len(op.inputs) < 4 or is_const(g, op.inputs[0]):
            continue
        o = op.options
        if any(o.get(k) for k in ('begin_mask', 'end_mask', 'ellipsis_mask', 'new_axis_mask',
                                  'shrink_axis_mask', 'offset')):
            continue
        if not all(is_const(g, k) for k in op.inputs[1:4]):
            continue
        X = list(g.tensors[op.inputs[0]].shape)
        b, e, st = (const_ints(g, k) for k in op.inputs[1:4])
        if len(b) != len(X) or any(v != 1 for v in st):
            continue
        b = [v + n if v < 0 else v for v, n in zip(b, X)]
        e = [min(v + n if v < 0 else v, n) for v, n in zip(e, X)]
        cut = [d for d in range(len(X)) if (b[d], e[d]) != (0, X[d])]
        if len(cut) != 1 or list(g.tensors[op.outputs[0]].shape) != \
                [e[d] - b[d] for d in range(len(X))]:
            continue
        groups.setdefault((op.inputs[0], cut[0]), []).append((b[cut[0]], e[cut[0]], op))
    made = 0
    for (src, d), parts in groups.items():
        parts.sort(key=lambda p: p[0])
        n = g.tensors[src].shape[d]
        if len(parts) < 2 or parts[0][0] != 0 or parts[-1][1] != n or \
                any(p[1] != q[0] for p, q in zip(parts, parts[1:])):
            continue                     # not a tiling of the axis
        first = min(g.ops.index(p[2]) for p in parts)
        sizes = new_tensor(g, g.tensors[src].name + '/split_sizes', [len(parts)],
                           np.array([p[1] - p[0] for p in parts], np.int32))
        axis = new_tensor(g, g.tensors[src].name + '/split_axis', [], np.array(d, np.int32))
        g.ops.insert(first, Operator(-1, OP_CODES['SPLIT_V'], 'SPLIT_V', [src, sizes, axis],
                                     [p[2].outputs[0] for p in parts],
                                     {'num_splits': len(parts)}, src=g.ops[first].src))
        renumber(g)
        for p in parts:
            remove_op(g, p[2])
        made += 1
    return made


def unpack_to_split(g: Graph) -> int:
    """UNPACK along an axis (Keras's recurrent layers unrolled: the sequence cut into its
    steps) -> SPLIT along that axis into size-1 pieces, and a RESHAPE of each piece to its
    step's shape (the axis dropped): the same values, through ops that train.  Returns
    how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'UNPACK' or len(op.inputs) != 1:
            continue
        x = op.inputs[0]
        shape = list(g.tensors[x].shape)
        a = int(op.options.get('axis', 0)) % len(shape)
        if shape[a] != len(op.outputs):
            continue
        piece = shape[:a] + [1] + shape[a + 1:]
        parts = [new_tensor(g, g.tensors[y].name + '/piece', piece, like=y) for y in op.outputs]
        axis = new_tensor(g, g.tensors[x].name + '/unpack_axis', [], np.array(a, np.int32))
        at = g.ops.index(op)
        for y, pc in zip(reversed(op.outputs), reversed(parts)):
            rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [pc], [y], {}, src=op.src)
            make_reshape(g, rs, list(g.tensors[y].shape))
            g.ops.insert(at + 1, rs)
        op.name, op.code = 'SPLIT', OP_CODES['SPLIT']
        op.inputs, op.outputs = [axis, x], parts
        op.options = {'num_splits': len(parts)}
        renumber(g)
        done += 1
    return done


def pack_to_concat(g: Graph) -> int:
    """PACK of activations along an axis (Keras's TimeDistributed and stack: the steps'
    outputs stacked back into a sequence) -> a RESHAPE of each input opening a unit axis
    there and a CONCATENATION along it: the same values, and each input's gradient its
    slice.  (A PACK of constants is folded by fold_shapes.)  Float and int8: TFLite's PACK
    keeps one scale, which the reshapes and the concatenation keep.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'PACK' or not op.inputs or any(is_const(g, k) for k in op.inputs):
            continue
        shape = list(g.tensors[op.inputs[0]].shape)
        a = int(op.options.get('axis', 0)) % (len(shape) + 1)
        opened = shape[:a] + [1] + shape[a:]
        out = list(g.tensors[op.outputs[0]].shape)
        if any(list(g.tensors[k].shape) != shape for k in op.inputs) or \
                out != shape[:a] + [len(op.inputs)] + shape[a:]:
            continue
        made, parts = [], {}
        for k in op.inputs:
            if k not in parts:      # (one input packed twice: one reshape, read twice)
                parts[k] = new_tensor(g, g.tensors[k].name + '/opened', opened, like=k)
                rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [k], [parts[k]], {}, src=op.src)
                make_reshape(g, rs, opened)
                made.append(rs)
        made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION',
                             [parts[k] for k in op.inputs], list(op.outputs),
                             {'axis': a, 'fused_activation_function': 'NONE'}, src=op.src))
        replace_op(g, op, made)
        done += 1
    return done


def tile_to_concat(g: Graph) -> int:
    """TILE by constant multiples -> a CONCATENATION of m copies of its input along each
    axis tiled m times (Keras's UpSampling2D: EXPAND_DIMS -> TILE -> RESHAPE per axis);
    the same values, and the gradient of the copies sums into the input as a tensor read
    m times does.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'TILE' or len(op.inputs) != 2 or not is_const(g, op.inputs[1]) or \
                is_const(g, op.inputs[0]):
            continue
        mult = const_ints(g, op.inputs[1])
        x, y = op.inputs[0], op.outputs[0]
        shape = list(g.tensors[x].shape)
        if len(mult) != len(shape) or min(mult) < 1 or \
                [n * m for n, m in zip(shape, mult)] != list(g.tensors[y].shape):
            continue
        axes = [a for a, m in enumerate(mult) if m > 1]
        made = []
        for j, a in enumerate(axes):
            shape[a] *= mult[a]
            out = y if j == len(axes) - 1 else new_tensor(g, g.tensors[y].name + f'/tile{a}',
                                                          list(shape), like=y)
            made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', [x] * mult[a],
                                 [out], {'axis': a, 'fused_activation_function': 'NONE'},
                                 src=op.src))
            x = out
        if not made:            # multiples all 1: a copy
            made.append(Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [x], [y], {}, src=op.src))
            make_reshape(g, made[0], list(g.tensors[y].shape))
        replace_op(g, op, made)
        done += 1
    return done


def hard_swish_expanded(g: Graph) -> int:
    """A float HARD_SWISH -> x * RELU6(x + 3) * (1/6): ADD, RELU6, MUL, MUL, the same
    values (to float rounding) in ops every host runtime has (ONERT 0.1.0 has no
    HARD_SWISH: `evaluate` of a Keras hard_swish / PyTorch Hardswish model).  Returns how
    many; an int8 one stays (TFLite Micro has its kernel)."""
    done = 0
    for op in list(g.ops):
        x = op.inputs[0] if op.name == 'HARD_SWISH' else -1
        if x < 0 or g.tensors[x].dtype != 'float32':
            continue
        y, shape, name = op.outputs[0], g.tensors[x].shape, g.tensors[op.outputs[0]].name
        three = new_tensor(g, name + '/3', [1], np.float32([3.0]))
        sixth = new_tensor(g, name + '/sixth', [1], np.float32([1.0 / 6.0]))
        a, r, m = (new_tensor(g, name + s, shape) for s in ('/add3', '/relu6', '/mul'))
        none = {'fused_activation_function': 'NONE'}
        replace_op(g, op, [
            Operator(-1, OP_CODES['ADD'], 'ADD', [x, three], [a], dict(none), src=op.src),
            Operator(-1, OP_CODES['RELU6'], 'RELU6', [a], [r], {}, src=op.src),
            Operator(-1, OP_CODES['MUL'], 'MUL', [x, r], [m], dict(none), src=op.src),
            Operator(-1, OP_CODES['MUL'], 'MUL', [m, sixth], [y], dict(none), src=op.src)])
        done += 1
    return done


def mirror_pads(g: Graph) -> int:
    """MIRROR_PAD by constant paddings (tf.pad(mode='REFLECT' / 'SYMMETRIC'), ONNX Pad mode
    reflect: nn.ReflectionPad2d; ONNX's mode edge, Operator.edge: nn.ReplicationPad2d, the
    border row repeated) -> a GATHER of the input's own elements at constant indices along
    each padded axis, which gathers_to_slices (run next) spells as STRIDED_SLICEs and a
    CONCATENATION: the same values, float and int8; a copied element's gradient sums into
    the element.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'MIRROR_PAD' or len(op.inputs) != 2 or not is_const(g, op.inputs[1]) \
                or is_const(g, op.inputs[0]):
            continue
        x, y = op.inputs[0], op.outputs[0]
        shape = list(g.tensors[x].shape)
        pads = np.asarray(g.tensors[op.inputs[1]].data).reshape(-1, 2).astype(int)
        edge, sym = getattr(op, 'edge', False), op.options.get('mode') in ('SYMMETRIC', 1)
        if len(pads) != len(shape) or pads.min() < 0 or pads[0].any() or not edge and \
                any(max(p) > n - (0 if sym else 1) for p, n in zip(pads, shape)):
            continue            # (TFLite refuses pads past the mirrored rows too)
        axes = [a for a, p in enumerate(pads) if p.any()]
        made, name = [], g.tensors[y].name
        for j, a in enumerate(axes):
            n, (p0, p1) = shape[a], pads[a]
            k = np.arange(-p0, n + p1)
            idx = np.clip(k, 0, n - 1) if edge else \
                np.where(k < 0, -k - 1 if sym else -k,
                         np.where(k > n - 1, 2 * n - 1 - k if sym else 2 * n - 2 - k, k))
            shape[a] = n + p0 + p1
            out = y if j == len(axes) - 1 else new_tensor(g, name + f'/mirror{a}', list(shape),
                                                          like=y)
            ids = new_tensor(g, name + f'/mirror{a}_ids', [len(idx)], idx.astype(np.int32))
            made.append(Operator(-1, OP_CODES['GATHER'], 'GATHER', [x, ids], [out],
                                 {'axis': a, 'batch_dims': 0}, src=op.src))
            x = out
        if not made:
            continue
        replace_op(g, op, made)
        done += 1
    return done


def _runs(idx):
    """Constant gather indices -> (start, stop, step) runs of evenly spaced ascending ones,
    in order: [0, 2, 4, 5, 1] -> (0, 5, 2), (5, 6, 1), (1, 2, 1)."""
    runs, i = [], 0
    while i < len(idx):
        j, st = i + 1, (idx[i + 1] - idx[i]) if i + 1 < len(idx) else 1
        if st <= 0:
            st = 1
        while j < len(idx) and idx[j] - idx[j - 1] == st:
            j += 1
        runs.append((idx[i], idx[j - 1] + 1, st if j - i > 1 else 1))
        i = j
    return runs


def gathers_to_slices(g: Graph) -> int:
    """GATHER of an activation by constant indices along an axis (keras.ops.take /
    tf.gather(x, [0, 2], axis=2): picking channels or steps) -> a STRIDED_SLICE per run of
    evenly spaced ascending indices and, for several, a CONCATENATION on that axis; a
    scalar index a STRIDED_SLICE that drops the axis.  The same values; an index taken
    twice is read twice, its gradients summed; float and int8 (slices keep the scale).
    An embedding's GATHER (a constant table) is not one.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'GATHER' or len(op.inputs) != 2 or is_const(g, op.inputs[0]) or \
                not is_const(g, op.inputs[1]) or op.options.get('batch_dims'):
            continue
        x, y = op.inputs[0], op.outputs[0]
        X, ids = list(g.tensors[x].shape), g.tensors[op.inputs[1]].data
        a = int(op.options.get('axis', 0))
        a += len(X) if a < 0 else 0
        if not 0 < a < len(X) or ids.ndim > 1:
            continue
        n = X[a]
        flat = [int(v) + (n if v < 0 else 0) for v in np.ravel(ids)]
        if not flat or not all(0 <= v < n for v in flat):
            continue
        parts, made, name = [], [], g.tensors[y].name
        for j, (b0, e0, st) in enumerate(_runs(flat)):
            b, e, s = [0] * len(X), list(X), [1] * len(X)
            b[a], e[a], s[a] = b0, e0, st
            shape = list(X)
            shape[a] = len(range(b0, e0, st))
            out = y if ids.ndim == 0 or len(_runs(flat)) == 1 else \
                new_tensor(g, name + f'/take{j}', shape, like=y)
            made.append(slice_op(g, x, out, name + f'/take{j}', b, e, s, op.src,
                                  (1 << a) if ids.ndim == 0 else 0))
            parts.append(out)
        if len(parts) > 1:
            made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', parts, [y],
                                 {'axis': a, 'fused_activation_function': 'NONE'}, src=op.src))
        replace_op(g, op, made)
        done += 1
    return done


def slice_to_strided(g: Graph) -> int:
    """SLICE by a constant begin and size (tico's nn.ConvTranspose2d with padding: a VALID
    TRANSPOSE_CONV cropped by a SLICE; torch's narrow and x[:, a:b]) -> a STRIDED_SLICE
    with strides 1 (size -1: to the end), the same values and gradient.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'SLICE' or len(op.inputs) != 3 or is_const(g, op.inputs[0]) or \
                not all(is_const(g, k) for k in op.inputs[1:]):
            continue
        X = list(g.tensors[op.inputs[0]].shape)
        b, n = const_ints(g, op.inputs[1]), const_ints(g, op.inputs[2])
        if not len(b) == len(n) == len(X):
            continue
        e = [d if k < 0 else a + k for a, k, d in zip(b, n, X)]
        if any(not 0 <= a <= z <= d for a, z, d in zip(b, e, X)):
            continue        # (left to validation to name)
        y = op.outputs[0]
        replace_op(g, op, [slice_op(g, op.inputs[0], y, g.tensors[y].name + '/slice', b, e,
                                    [1] * len(X), op.src)])
        done += 1
    return done


def reversed_slices(g: Graph) -> int:
    """STRIDED_SLICE of an activation with a negative stride (a reversal: Keras's
    x[:, ::-1], torch.flip and x.flip(1) through torch.onnx, a backward pass over time
    written by hand; refused before: "utrain slices with positive strides") -> a
    STRIDED_SLICE with positive strides picking the same values, then along each axis that
    ran backwards a STRIDED_SLICE of each index and a CONCATENATION of them in reverse order
    (loops.reverse_to_concat's reversal): the same values and gradient through ops that
    train.  Float tensors; an int8 graph's slices gather (quant._slc_layer).  Returns how
    many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'STRIDED_SLICE' or len(op.inputs) != 4 or is_const(g, op.inputs[0]) or \
                not all(is_const(g, k) for k in op.inputs[1:]) or \
                np.dtype(g.tensors[op.outputs[0]].dtype).kind != 'f' or \
                any(op.options.get(k) for k in ('ellipsis_mask', 'new_axis_mask', 'offset')):
            continue
        X = list(g.tensors[op.inputs[0]].shape)
        b, e, st = (const_ints(g, k) for k in op.inputs[1:])
        o = op.options
        shrink = o.get('shrink_axis_mask', 0)
        if not len(b) == len(e) == len(st) == len(X) or 0 in st or \
                all(v > 0 or shrink >> d & 1 for d, v in enumerate(st)):
            continue
        begin, end, back = [], [], []
        for d, n in enumerate(X):
            if shrink >> d & 1:
                i = b[d] + n if b[d] < 0 else b[d]
                begin.append(i)
                end.append(i + 1)
                continue
            picks = list(range(n)[slice(None if o.get('begin_mask', 0) >> d & 1 else b[d],
                                        None if o.get('end_mask', 0) >> d & 1 else e[d], st[d])])
            if not picks:
                break
            begin.append(min(picks))
            end.append(max(picks) + 1)
            if st[d] < 0 and len(picks) > 1:
                back.append(d - bin(shrink & ((1 << d) - 1)).count('1'))   # (the output's axis)
        else:
            y = op.outputs[0]
            name = g.tensors[y].name
            step = [1 if shrink >> d & 1 else abs(v) for d, v in enumerate(st)]
            whole = not shrink and begin == [0] * len(X) and end == X and step == [1] * len(X)
            if whole and back:          # (a plain reversal: its slices read the input)
                h, made = op.inputs[0], []
            else:
                h = new_tensor(g, name + '/forward', list(g.tensors[y].shape), like=y) if back else y
                made = [slice_op(g, op.inputs[0], h, name + '/forward', begin, end, step, op.src,
                                 shrink)]
            for j, a in enumerate(back):
                Y = list(g.tensors[h].shape)
                out = y if j == len(back) - 1 else new_tensor(g, f'{name}/back{j}', Y, like=y)
                made += reversal_ops(g, h, out, a, f'{name}/back{j}_', op.src, like=y)
                h = out
            replace_op(g, op, made)
            done += 1
    return done


def splits_to_slices(g: Graph) -> int:
    """SPLIT / SPLIT_V of an activation by constant sizes -> a STRIDED_SLICE per piece, the
    same values: ONERT 0.1.0 gives other values for a SPLIT_V's pieces (keras.ops.split on the
    time axis: `evaluate` scored 1.17 where TensorFlow and the run's epoch 0 say 1.02);
    evaluate only (the board's SPLIT_V writes one gradient for all pieces).  Returns how
    many."""
    done = 0
    for op in list(g.ops):
        if op.name not in ('SPLIT', 'SPLIT_V'):
            continue
        x, ax = (op.inputs[1], op.inputs[0]) if op.name == 'SPLIT' else (op.inputs[0], op.inputs[2])
        if is_const(g, x) or not is_const(g, ax):
            continue
        X = list(g.tensors[x].shape)
        a = int(np.ravel(g.tensors[ax].data)[0])
        a += len(X) if a < 0 else 0
        made, at = [], 0
        for j, y in enumerate(op.outputs):
            n = int(g.tensors[y].shape[a])
            b, e = [0] * len(X), list(X)
            b[a], e[a] = at, at + n
            at += n
            made.append(slice_op(g, x, y, g.tensors[y].name + '/piece', b, e, [1] * len(X),
                                  op.src))
        if at != X[a]:
            continue
        replace_op(g, op, made)
        done += 1
    return done


def resize_to_concat(g: Graph) -> int:
    """RESIZE_NEAREST_NEIGHBOR of an NHWC map by whole factors (Keras 2's UpSampling2D,
    tico's nn.Upsample(mode='nearest'); not align_corners) -> per axis it grows, a
    RESHAPE that opens a unit axis after it, a CONCATENATION of k copies on that axis
    and a RESHAPE that merges them: row i of the output is row i // k, as TFLite's kernel
    (with or without half-pixel centres) gives for whole factors; the copies' gradients
    sum into the input.  Float and int8 (copies keep the scale).  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'RESIZE_NEAREST_NEIGHBOR' or len(op.inputs) < 2 or \
                not is_const(g, op.inputs[1]) or op.options.get('align_corners'):
            continue
        x, y = op.inputs[0], op.outputs[0]
        shape = list(g.tensors[x].shape)
        size = const_ints(g, op.inputs[1])
        if len(shape) != 4 or len(size) != 2 or any(n < 1 or m % n for n, m in zip(shape[1:3], size)):
            continue
        made = []
        for a, k in ((1, size[0] // shape[1]), (2, size[1] // shape[2])):
            if k == 1:
                continue
            opened = shape[:a + 1] + [1] + shape[a + 1:]
            t1 = new_tensor(g, g.tensors[y].name + f'/axis{a}', opened, like=x)
            r1 = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [x], [t1], {}, src=op.src)
            make_reshape(g, r1, opened)
            grown = list(opened)
            grown[a + 1] = k
            t2 = new_tensor(g, g.tensors[y].name + f'/copies{a}', grown, like=x)
            cat = Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', [t1] * k, [t2],
                           {'axis': a + 1, 'fused_activation_function': 'NONE'}, src=op.src)
            shape = list(shape)
            shape[a] *= k
            t3 = new_tensor(g, g.tensors[y].name + f'/merged{a}', shape, like=x)
            r2 = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [t2], [t3], {}, src=op.src)
            make_reshape(g, r2, shape)
            made += [r1, cat, r2]
            x = t3
        if not made:
            made = [Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [x], [y], {}, src=op.src)]
            make_reshape(g, made[0], list(g.tensors[y].shape))
        else:
            made[-1].outputs = [y]      # (its own tensor goes: compact)
        replace_op(g, op, made)
        done += 1
    return done


# what a piecewise branch may be made of (one activation input, scalar or broadcast
# constants): ops the float path trains through, and their values on the host
_PIECE = {k: FLOAT_FNS[k] for k in ('MUL', 'ADD', 'SUB', 'DIV', 'EXP', 'LOG', 'TANH', 'NEG',
                                    'LOGISTIC', 'RELU')}


def _branch(g: Graph, k: int, x: int, select: Operator):
    """The ops making tensor k from x alone (a chain of _PIECE ops, each reading x's chain
    and constants, read by nothing else), first op first; [] when k is x; None otherwise."""
    chain = []
    while k != x:
        op = next((o for o in g.ops if k in o.outputs), None)
        if op is None or op.name not in _PIECE or len(op.outputs) != 1 or \
                consumers(g, k) != [chain[-1] if chain else select] or \
                op.options.get('fused_activation_function', 'NONE') != 'NONE':
            return None
        live = [j for j in op.inputs if j >= 0 and not is_const(g, j)]
        if len(live) != 1:
            return None
        chain.append(op)
        k = live[0]
    return chain[::-1]


def _at(g: Graph, chain, x: int, v: float):
    """The value of the chain's output where x is v everywhere (numpy, on the host)."""
    val = np.full(g.tensors[x].shape, v, np.float64)
    for op in chain:
        args = [val if not is_const(g, j) else np.asarray(g.tensors[j].data, np.float64)
                for j in op.inputs if j >= 0]
        val = _PIECE[op.name](*args)
    return np.broadcast_to(val, g.tensors[x].shape)


def cumsums_to_fc(g: Graph) -> int:
    """CUMSUM of an activation along a constant axis (tf.math.cumsum, torch.cumsum: a
    running total over time) -> a FULLY_CONNECTED by a frozen 0 / 1 triangle [T, T] over
    that axis, moved last by TRANSPOSEs where it is not (exclusive and reverse pick the
    triangle's side and diagonal): the same sums, and its gradient the reverse running
    total.  Float graphs (int8: no such pass).  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'CUMSUM' or len(op.inputs) != 2 or is_const(g, op.inputs[0]) or \
                not is_const(g, op.inputs[1]):
            continue
        x, y = op.inputs[0], op.outputs[0]
        X = list(g.tensors[x].shape)
        ax = int(np.asarray(g.tensors[op.inputs[1]].data).reshape(-1)[0]) % max(len(X), 1)
        T, name = X[ax], g.tensors[y].name
        i, j = np.meshgrid(np.arange(T), np.arange(T))      # W[j, i]: y_j += x_i
        rev, exc = bool(op.options.get('reverse')), bool(op.options.get('exclusive'))
        keep = (i > j if exc else i >= j) if rev else (i < j if exc else i <= j)
        w = new_tensor(g, name + '/triangle', [T, T], keep.astype(np.float32))
        g.tensors[w].frozen = True
        fc = dict(NO_ACTIVATION, keep_num_dims=True, weights_format='DEFAULT',
                  asymmetric_quantize_inputs=False)
        if ax == len(X) - 1:
            made = [Operator(-1, OP_CODES['FULLY_CONNECTED'], 'FULLY_CONNECTED', [x, w, -1], [y],
                             fc, src=op.src)]
        else:
            p = [d for d in range(len(X)) if d != ax] + [ax]
            q = list(np.argsort(p))
            xt = new_tensor(g, name + '/moved', [X[d] for d in p], like=x)
            yt = new_tensor(g, name + '/sums', [X[d] for d in p], like=y)
            made = [Operator(-1, OP_CODES['TRANSPOSE'], 'TRANSPOSE',
                             [x, new_tensor(g, name + '/perm', [len(p)], np.int32(p))], [xt], {},
                             src=op.src),
                    Operator(-1, OP_CODES['FULLY_CONNECTED'], 'FULLY_CONNECTED', [xt, w, -1], [yt],
                             fc, src=op.src),
                    Operator(-1, OP_CODES['TRANSPOSE'], 'TRANSPOSE',
                             [yt, new_tensor(g, name + '/back', [len(q)], np.int32(q))], [y], {},
                             src=op.src)]
        replace_op(g, op, made)
        done += 1
    return done


def _selection(g: Graph, op):
    """A STRIDED_SLICE's [(begin, end, stride, shrink)] per axis of its input, from its
    constant begin / end / strides and masks, or None (ellipsis, new axes, non-constant)."""
    o = op.options
    if len(op.inputs) != 4 or not all(is_const(g, k) for k in op.inputs[1:]) or \
            o.get('ellipsis_mask') or o.get('new_axis_mask') or o.get('offset'):
        return None
    X = list(g.tensors[op.inputs[0]].shape)
    b, e, st = (const_ints(g, k) for k in op.inputs[1:])
    if not len(b) == len(e) == len(st) == len(X) or 0 in st:
        return None
    sel = []
    for d, n in enumerate(X):
        if o.get('shrink_axis_mask', 0) >> d & 1:
            i = b[d] + n if b[d] < 0 else b[d]
            sel.append((i, i + 1, 1, True))
            continue
        r = range(n)[slice(None if o.get('begin_mask', 0) >> d & 1 else b[d],
                           None if o.get('end_mask', 0) >> d & 1 else e[d], st[d])]
        sel.append((r.start, r.stop, r.step, False))
    return sel


def frame_slices(g: Graph) -> int:
    """Keras 3's TimeDistributed (a Conv2D a frame of a [1, T, H, W, C] clip) writes the
    frames as STRIDED_SLICEs of a TRANSPOSE or RESHAPE that moves T first ([T, 1, H, W, C]:
    5-D with a leading axis of T, which utrain does not hold), and its outputs PACKed
    back [T, 1, ...] and sliced again per frame.  A slice of such a tensor (the same
    elements, size-1 axes moved) becomes a slice of the tensor before the move (its
    axes mapped) and a RESHAPE; a slice picking one PACKed input whole becomes a RESHAPE
    of that input.  prepare had refused them ('tensor ... has shape [4, 1, 8, 8, 1]; utrain
    handles up to 4-D').  The moves left unread go.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'STRIDED_SLICE' or op not in g.ops:
            continue
        src = producer(g, op.inputs[0])
        sel = _selection(g, op) if src is not None else None
        if sel is None or src.name not in ('TRANSPOSE', 'RESHAPE', 'PACK'):
            continue
        y = op.outputs[0]
        Y = list(g.tensors[op.inputs[0]].shape)
        made = None
        if src.name == 'PACK':
            a = int(src.options.get('axis', 0)) % len(Y)
            i, j, k, _ = sel[a]
            if j - i == 1 and all(s[:3] == (0, n, 1) for d, (s, n) in enumerate(zip(sel, Y))
                                  if d != a) and 0 <= i < len(src.inputs):
                made = [Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [src.inputs[i]], [y], {},
                                 src=op.src)]
        else:
            x = src.inputs[0]
            X = list(g.tensors[x].shape)
            nx = [d for d, n in enumerate(X) if n != 1]
            ny = [d for d, n in enumerate(Y) if n != 1]
            same = [X[d] for d in nx] == [Y[d] for d in ny]
            if src.name == 'TRANSPOSE':
                perm = const_ints(g, src.inputs[1]) if is_const(g, src.inputs[1]) else None
                same = same and perm is not None and [p for p in perm if X[p] != 1] == nx
            if same and all(sel[d][:3] == (0, 1, 1) for d in range(len(Y)) if Y[d] == 1) and \
                    len(X) <= 4 + sum(1 for n in X[:-4] if n == 1):
                at = dict(zip(nx, ny))
                b = [sel[at[d]][0] if d in at else 0 for d in range(len(X))]
                e = [sel[at[d]][1] if d in at else 1 for d in range(len(X))]
                st = [sel[at[d]][2] if d in at else 1 for d in range(len(X))]
                shp = [len(range(bb, ee, ss)) for bb, ee, ss in zip(b, e, st)]
                mid = new_tensor(g, g.tensors[y].name + '/frame', shp, like=y)
                made = [slice_op(g, x, mid, g.tensors[y].name + '/frame', b, e, st, op.src),
                        Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [mid], [y], {}, src=op.src)]
        if made is None or int(np.prod(g.tensors[made[-1].inputs[0]].shape)) != \
                int(np.prod(g.tensors[y].shape)):
            continue
        make_reshape(g, made[-1], list(g.tensors[y].shape))
        replace_op(g, op, made)
        if src.outputs[0] not in g.outputs and not consumers(g, src.outputs[0]):
            remove_op(g, src)
        done += 1
    return done


def constant_masks(g: Graph) -> int:
    """A SELECT / SELECT_V2 whose condition is a bool constant (Keras's MultiHeadAttention
    with use_causal_mask: FILL of true, LOGICAL_AND with the triangle, both folded by
    fold_shapes) -> the same select reading a float32 1.0 / 0.0 copy of it: utrain holds a
    condition as such a mask (op_sel), and prepare had refused the bool tensor ('utrain
    trains float32 models').  Returns how many."""
    done = 0
    for sel in g.ops:
        if sel.name not in ('SELECT', 'SELECT_V2') or not sel.inputs or \
                not is_const(g, sel.inputs[0]) or g.tensors[sel.inputs[0]].dtype != 'bool':
            continue
        c = g.tensors[sel.inputs[0]]
        sel.inputs = [new_tensor(g, c.name + '/mask', c.shape,
                                 np.asarray(c.data).reshape(c.shape).astype(np.float32))
                      ] + sel.inputs[1:]
        g.tensors[sel.inputs[0]].frozen = True
        done += 1
    return done


def selects_to_relu(g: Graph) -> int:
    """SELECT_V2(x > c, A(x), B(x)) with the branches continuous at c (Keras 3's selu:
    GREATER x 0, scale * x, scale * alpha * (exp(x) - 1)) -> A(c + RELU(x - c)) +
    B(x - RELU(x - c)) - A(c): each branch reads x on its own side of c only, its ops
    kept; the gradient is A'(x) above c and B'(x) below.  GREATER_EQUAL alike; LESS /
    LESS_EQUAL swap the branches.  Returns how many."""
    done = 0
    for sel in list(g.ops):
        if sel.name != 'SELECT_V2' or len(sel.inputs) != 3:
            continue
        cond = next((o for o in g.ops if sel.inputs[0] in o.outputs), None)
        if cond is None or cond.name not in ('GREATER', 'GREATER_EQUAL', 'LESS', 'LESS_EQUAL') \
                or len(cond.inputs) != 2 or not is_const(g, cond.inputs[1]) or \
                consumers(g, sel.inputs[0]) != [sel]:
            continue
        x, cv = cond.inputs[0], np.asarray(g.tensors[cond.inputs[1]].data).reshape(-1)
        if is_const(g, x) or cv.size != 1:
            continue
        c = float(cv[0])
        hi, lo = (sel.inputs[1], sel.inputs[2]) if cond.name.startswith('GREATER') else \
            (sel.inputs[2], sel.inputs[1])
        above, below = _branch(g, hi, x, sel), _branch(g, lo, x, sel)
        if above is None or below is None:
            # PyTorch's softplus(x, beta, threshold): beta * x > threshold picks x, else
            # log(1 + exp(beta * x)) / beta: the test on x0 > threshold / beta, where
            # x = x0 * beta (a MUL by a positive scalar) and x0 is one branch
            m = producer(g, x)
            k = [j for j in m.inputs if is_const(g, j)] if m is not None and \
                m.name == 'MUL' and len(m.inputs) == 2 else []
            sv = np.asarray(g.tensors[k[0]].data).reshape(-1) if len(k) == 1 else []
            if len(sv) == 1 and float(sv[0]) > 0:
                x0 = [j for j in m.inputs if j != k[0]][0]
                c0 = c / float(sv[0])
                keep = cond.inputs
                cond.inputs = [x0, new_tensor(g, g.tensors[cond.outputs[0]].name + '/at',
                                              [], np.array(c0, np.float32))]
                above, below = _branch(g, hi, x0, sel), _branch(g, lo, x0, sel)
                if above is None or below is None:
                    cond.inputs = keep
                else:
                    x, c = x0, c0
        if above is None or below is None or {id(o) for o in above} & {id(o) for o in below}:
            continue
        a0, b0 = _at(g, above, x, c), _at(g, below, x, c)
        if not np.allclose(a0, b0, rtol=1e-5, atol=1e-6):
            continue            # (a jump at c: no sum of the two sides is it)
        y, shp = sel.outputs[0], list(g.tensors[x].shape)
        made, name = [], g.tensors[y].name

        def step(op_name, ins, out=None, opts=NO_ACTIVATION):
            """Append op_name(ins) writing out (None: a new tensor of x's shape)."""
            out = new_tensor(g, f'{name}/{op_name.lower()}{len(made)}', shp, like=x) \
                if out is None else out
            made.append(Operator(-1, OP_CODES[op_name], op_name, ins, [out], dict(opts),
                                 src=sel.src))
            return out

        def scalar(v):
            return new_tensor(g, f'{name}/k{len(made)}', [], np.array(v, np.float32))
        r = step('RELU', [step('SUB', [x, scalar(c)]) if c else x], opts={})   # RELU(x - c)
        xa = step('ADD', [r, scalar(c)]) if c else r                           # max(x, c)
        xb = step('SUB', [x, r])                                               # min(x, c)
        ends = []
        for chain, xs in ((above, xa), (below, xb)):
            if chain:
                chain[0].inputs = [xs if j == x else j for j in chain[0].inputs]
                ends.append(chain[-1].outputs[0])
            else:
                ends.append(xs)
        head = made[:]
        at_c = float(a0.reshape(-1)[0]) if np.ptp(a0) == 0 else None
        if at_c == 0:
            step('ADD', ends, y)
        else:                   # (a per-channel value at c: a constant of x's shape)
            step('SUB', [step('ADD', ends), scalar(at_c) if at_c is not None else new_tensor(
                g, f'{name}/at_c', shp, np.asarray(a0, np.float32))], y)
        # the branches' ops now read max(x, c) / min(x, c): they come after those, before
        # the sum; the comparison goes
        for o in [cond] + above + below:
            g.ops.remove(o)
        replace_op(g, sel, head + above + below + made[len(head):])
        done += 1
    return done


def _pow_steps(g: Graph, x: int, e: float, name: str) -> list:
    """spell()'s steps of POW(x, e), e a nonzero constant: SQRT (0.5), RSQRT (-0.5); a
    whole e as MULs (x*x, then square and multiply by x along e's bits: x**3 of a
    PyTorch GELU's tanh form, a cube law), DIV(1, x**|e|) where e < 0; any other e as
    EXP(e * LOG(x)), which is x**e where x > 0 (elsewhere pow is NaN or infinite for a
    fractional e too).  Each step's gradient the chain rule's; the constants frozen."""
    def const(tag, v):
        k = new_tensor(g, f'{name}/{tag}', [], np.array(v, np.float32))
        g.tensors[k].frozen = True
        return k
    if e in (0.5, -0.5):
        return [('SQRT' if e > 0 else 'RSQRT', [x], {}, None)]
    n = abs(e)
    if n != int(n) or n > 1024:
        return [('LOG', [x], {}, None), ('MUL', ['prev', const('exponent', e)], NO_ACTIVATION, None),
                ('EXP', ['prev'], {}, None)]
    steps, cur = [], x
    for bit in bin(int(n))[3:]:
        steps.append(('MUL', [cur, cur], NO_ACTIVATION, None))
        cur = f'@{len(steps) - 1}'
        if bit == '1':
            steps.append(('MUL', [cur, x], NO_ACTIVATION, None))
            cur = f'@{len(steps) - 1}'
    if e < 0:
        steps.append(('DIV', [const('one', 1.0), cur], NO_ACTIVATION, None))
    return steps or [('MUL', [x, const('one', 1.0)], NO_ACTIVATION, None)]


def _pow_of_activation(g: Graph, op: Operator) -> bool:
    """POW(x, y) of an activation exponent y spelled: c ** y of a constant base c > 0 as
    EXP(y * ln c) (ln c a frozen constant); x ** y of an activation base as EXP(y *
    LOG(x)).  Both are TFLite's and ONNX's pow, value and gradient (dy: y x**(y-1), and
    x**y ln x), where the base is positive, and where x = 0 and y != 0 (0, or inf); where
    x < 0 (pow: NaN for a fractional y, and no gradient in y for a whole one) or x = y = 0
    they give NaN, which stops a training run as diverged.  A constant base with an
    element <= 0 is left as it is (passes.plan refuses it, saying so).  Returns whether
    it spelled op."""
    x, y = op.inputs
    name = g.tensors[op.outputs[0]].name
    if is_const(g, x):
        c = np.asarray(g.tensors[x].data, np.float64)
        if c.size == 0 or not np.all(c > 0) or not np.all(np.isfinite(c)):
            return False
        ln = new_tensor(g, f'{name}/log_base', list(g.tensors[x].shape),
                        np.log(c).astype(np.float32))
        g.tensors[ln].frozen = True
        spell(g, op, [('MUL', [y, ln], NO_ACTIVATION, None), ('EXP', ['prev'], {}, None)])
        return True
    spell(g, op, [('LOG', [x], {}, list(g.tensors[x].shape)),
                  ('MUL', [y, 'prev'], NO_ACTIVATION, None), ('EXP', ['prev'], {}, None)])
    return True


def elementwise_forms(g: Graph) -> int:
    """Elementwise ops written with the ones that train: NEG x -> MUL(x, -1) and
    SQUARED_DIFFERENCE(a, b) -> d = SUB(a, b), MUL(d, d) (Keras's LayerNormalization
    and variance: MEAN, NEG, SQUARED_DIFFERENCE, RSQRT); a MUL reading one tensor twice
    sums both gradients into it.  MAXIMUM(a, b) -> b + RELU(a - b) and MINIMUM(a, b) ->
    a - RELU(a - b) (the gradient goes to the larger / smaller operand, as TFLite's
    reference picks it; a constant bound is frozen: Tensor.frozen); PRELU(x, alpha) -> RELU(x) + alpha * (x - RELU(x)) (alpha: a
    MUL's constant, which trains where it has more than one value, as Keras's PReLU
    learns it); L2_NORMALIZATION(x) -> x * RSQRT(n * MEAN(x * x) + 1e-12) over the last
    axis; SQUARE x -> MUL(x, x); ABS x -> 2 * RELU(x) - x; SUM over axes -> n * MEAN
    over them; POW(x, e) of a constant e (tf.pow, x ** e of a PyTorch export) -> MULs
    for a whole e (a DIV of 1 by them for a negative one), SQRT / RSQRT for +-0.5,
    EXP(e * LOG(x)) for any other (_pow_steps); POW of an activation exponent as EXP(y
    LOG x) (_pow_of_activation).  Float tensors only.  Returns how many."""
    done = 0
    one = ('NEG', 'L2_NORMALIZATION', 'SQUARE', 'ABS')
    for op in list(g.ops):
        if op.name == 'POW' and len(op.inputs) == 2 and not is_const(g, op.inputs[1]) and \
                np.dtype(g.tensors[op.outputs[0]].dtype).kind == 'f':
            if _pow_of_activation(g, op):
                done += 1
            continue
        if op.name == 'POW' and len(op.inputs) == 2 and is_const(g, op.inputs[1]) and \
                not is_const(g, op.inputs[0]) and g.tensors[op.inputs[1]].data.size == 1 and \
                np.dtype(g.tensors[op.outputs[0]].dtype).kind == 'f':
            e = float(g.tensors[op.inputs[1]].data.reshape(-1)[0])
            if e != 0.0 and np.isfinite(e):
                spell(g, op, _pow_steps(g, op.inputs[0], e, g.tensors[op.outputs[0]].name))
                done += 1
            continue
        if op.name not in ('SQUARED_DIFFERENCE', 'MAXIMUM', 'MINIMUM', 'PRELU', 'SUM') + one or \
                len(op.outputs) != 1 or np.dtype(g.tensors[op.outputs[0]].dtype).kind != 'f':
            continue
        y = op.outputs[0]
        if len(op.inputs) != (1 if op.name in one else 2) or \
                is_const(g, op.inputs[0]) and op.name != 'MAXIMUM' and op.name != 'MINIMUM' or \
                op.name == 'SUM' and not is_const(g, op.inputs[1]):
            continue
        if op.name == 'NEG':
            m1 = new_tensor(g, g.tensors[y].name + '/minus_one', [], np.array(-1.0, np.float32))
            op.name, op.code, op.inputs = 'MUL', OP_CODES['MUL'], [op.inputs[0], m1]
            op.options = dict(NO_ACTIVATION)
            renumber(g)
        elif op.name == 'SQUARE':
            op.name, op.code, op.inputs = 'MUL', OP_CODES['MUL'], [op.inputs[0]] * 2
            op.options = dict(NO_ACTIVATION)
        elif op.name == 'ABS':
            two = new_tensor(g, g.tensors[y].name + '/two', [], np.array(2.0, np.float32))
            x = op.inputs[0]
            spell(g, op, [('RELU', [x], {}, None), ('MUL', ['prev', two], NO_ACTIVATION, None),
                           ('SUB', ['prev', x], NO_ACTIVATION, None)])
        elif op.name == 'SUM':
            x, ax = op.inputs
            shape = g.tensors[x].shape
            n = int(np.prod([shape[a % len(shape)] for a in set(const_ints(g, ax))]))
            nt = new_tensor(g, g.tensors[y].name + '/n', [], np.array(float(n), np.float32))
            spell(g, op, [('MEAN', [x, ax], {'keep_dims': bool(op.options.get('keep_dims'))},
                            list(g.tensors[y].shape)), ('MUL', ['prev', nt], NO_ACTIVATION, None)])
        elif op.name == 'SQUARED_DIFFERENCE':
            spell(g, op, [('SUB', op.inputs, NO_ACTIVATION, None), ('MUL', ['prev', 'prev'], NO_ACTIVATION, None)])
        elif op.name in ('MAXIMUM', 'MINIMUM'):
            a, b = op.inputs
            c = own(g, b) if op.name == 'MAXIMUM' else own(g, a)
            for k in (a, b, c):     # a clip's bound (tf.clip_by_value, torch.clamp): not a
                if is_const(g, k):  # parameter, and its two copies would drift apart
                    g.tensors[k].frozen = True
            last = ('ADD', [c, 'prev'], NO_ACTIVATION) if op.name == 'MAXIMUM' else ('SUB', [c, 'prev'], NO_ACTIVATION)
            spell(g, op, [('SUB', [a, b], NO_ACTIVATION, None), ('RELU', ['prev'], {}, None),
                           last + (None,)], own=0)
        elif op.name == 'PRELU':
            x, alpha = op.inputs
            spell(g, op, [('RELU', [x], {}, None), ('SUB', [x, 'prev'], NO_ACTIVATION, None),
                           ('MUL', ['prev', alpha], NO_ACTIVATION, None),
                           ('ADD', ['@0', 'prev'], NO_ACTIVATION, None)], own=2)
        else:
            x = op.inputs[0]
            shape = list(g.tensors[x].shape)
            axis = new_tensor(g, g.tensors[y].name + '/axis', [1], np.array([len(shape) - 1], np.int32))
            n = new_tensor(g, g.tensors[y].name + '/n', [], np.array(float(shape[-1]), np.float32))
            eps = new_tensor(g, g.tensors[y].name + '/eps', [], np.array(1e-12, np.float32))
            row = shape[:-1] + [1]
            spell(g, op, [('MUL', [x, x], NO_ACTIVATION, None), ('MEAN', ['prev', axis], {'keep_dims': True}, row),
                           ('MUL', ['prev', n], NO_ACTIVATION, row), ('ADD', ['prev', eps], NO_ACTIVATION, row),
                           ('RSQRT', ['prev'], {}, row), ('MUL', [x, 'prev'], NO_ACTIVATION, None)])
        done += 1
    return done


def gapped_means(g: Graph) -> int:
    """A float MEAN or SUM whose reduced axes (size-1 axes aside) are not one run (Keras's
    GroupNormalization: moments over axes [1, 2, 4] of [1, H, W, groups, C / groups]) ->
    a TRANSPOSE moving the kept axes first and the reduced last (each in its order), the
    reduction over the trailing run, a RESHAPE to the output's shape (keep_dims or not):
    utrain reduces one run of axes, and prepare had refused it ('the reduced axes must be
    adjacent').  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name not in ('MEAN', 'SUM') or len(op.inputs) < 2 or \
                not is_const(g, op.inputs[1]) or g.tensors[op.inputs[0]].dtype != 'float32':
            continue
        x, y = op.inputs[0], op.outputs[0]
        X = list(g.tensors[x].shape)
        axes = {a % max(len(X), 1) for a in const_ints(g, op.inputs[1])}
        flags = [d in axes for d in range(len(X)) if X[d] != 1]
        if True not in flags:
            continue
        first, last = flags.index(True), len(flags) - 1 - flags[::-1].index(True)
        if all(flags[first:last + 1]):
            continue
        kept = [d for d in range(len(X)) if d not in axes]
        red = sorted(axes)
        p = kept + red
        name = g.tensors[y].name
        xt = new_tensor(g, name + '/moved', [X[d] for d in p], like=x)
        r = new_tensor(g, name + '/reduced', [X[d] for d in kept], like=y)
        made = [Operator(-1, OP_CODES['TRANSPOSE'], 'TRANSPOSE',
                         [x, new_tensor(g, name + '/perm', [len(p)], np.int32(p))], [xt], {},
                         src=op.src),
                Operator(-1, op.code, op.name,
                         [xt, new_tensor(g, name + '/axes', [len(red)],
                                         np.int32(list(range(len(kept), len(p)))))], [r],
                         {'keep_dims': False}, src=op.src),
                Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [r], [y], {}, src=op.src)]
        make_reshape(g, made[2], list(g.tensors[y].shape))
        replace_op(g, op, made)
        done += 1
    return done


def unit_reductions(g: Graph) -> int:
    """A MEAN, SUM, REDUCE_MAX, REDUCE_MIN or REDUCE_PROD whose reduced axes all have
    size 1 (tf.clip_by_norm's REDUCE_MAX of a [1, 1] norm) -> a RESHAPE (a SQUEEZE to a
    scalar): each output is its one input (an int8 one only where input and output share
    a scale).  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name not in REDUCE or len(op.inputs) < 2 or not is_const(g, op.inputs[1]):
            continue
        x, y = (g.tensors[k] for k in (op.inputs[0], op.outputs[0]))
        shape = list(x.shape)
        axes = {a % max(len(shape), 1) for a in const_ints(g, op.inputs[1])}
        if any(shape[a] != 1 for a in axes if a < len(shape)) or \
                _scales(x.quant) != _scales(y.quant):
            continue
        op.inputs = op.inputs[:1]
        if y.shape:
            make_reshape(g, op, list(y.shape))
        else:   # (to a scalar: a RESHAPE's shape tensor would have 0 values, which a
            op.name, op.code = 'SQUEEZE', OP_CODES['SQUEEZE']   # file holds as no data)
            op.options = {'squeeze_dims': list(range(len(shape)))}
        done += 1
    return done


def _scales(q):
    """A tensor's scales and zero points (None for a float tensor)."""
    return None if not q else ([float(a) for a in q.get('scale') or []],
                               [int(a) for a in q.get('zero_point') or []])


def _pool_axes(g: Graph, op):
    """(shape, axes, the axes not of size 1, those of them reduced) of a REDUCE_MAX /
    REDUCE_MIN a max pool computes (its reduced axes one run but for size-1 axes), else
    None."""
    if len(op.inputs) < 2 or not is_const(g, op.inputs[1]):
        return None
    shape = list(g.tensors[op.inputs[0]].shape)
    if not shape:
        return None
    axes = {a % len(shape) for a in const_ints(g, op.inputs[1])}
    keep = [i for i, n in enumerate(shape) if n != 1]
    red = [i for i in keep if i in axes]
    at = keep.index(red[0]) if red else 0
    return (shape, axes, keep, red) if red and keep[at:at + len(red)] == red else None


def reduce_min_to_max(g: Graph) -> int:
    """REDUCE_MIN that a max pool computes (reduce_max_to_pool) -> MUL by -1, REDUCE_MAX,
    MUL by -1: min(x) = -max(-x), and its gradient goes to the minimum as the max's goes
    to the maximum (tf.reduce_min, Keras's min over time, ONNX ReduceMin).  Float only.
    Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'REDUCE_MIN' or _pool_axes(g, op) is None or \
                g.tensors[op.outputs[0]].dtype != 'float32':
            continue
        x, ax = op.inputs[:2]
        name = g.tensors[op.outputs[0]].name
        minus = [new_tensor(g, f'{name}/minus_one{j}', [], np.array(-1.0, np.float32))
                 for j in range(2)]
        spell(g, op, [('MUL', [x, minus[0]], NO_ACTIVATION, list(g.tensors[x].shape)),
                      ('REDUCE_MAX', ['prev', ax], dict(op.options), None),
                      ('MUL', ['prev', minus[1]], NO_ACTIVATION, None)], own=1)
        done += 1
    return done


def reduce_max_to_pool(g: Graph) -> int:
    """REDUCE_MAX over one run of axes but for size-1 axes (a global max pool: Keras's
    GlobalMaxPooling1D/2D; a max over the last axis, or a middle one) -> MAX_POOL_2D with
    the reduced axes as its window (the max and its gradient to the maximum are the
    same), with a RESHAPE to [1, reduced, 1, rest] (axes before it: [1, before, reduced,
    rest], a window along W) before it and one to the output's shape after it unless the
    input is NHWC with H and W reduced.  Returns how many."""
    done = 0
    for op in list(g.ops):
        run = _pool_axes(g, op) if op.name == 'REDUCE_MAX' else None
        if run is None:
            continue            # (the reduced axes are not one run)
        x, y = op.inputs[0], op.outputs[0]
        shape, axes, keep, red = run
        R = int(np.prod([shape[i] for i in red]))
        P = int(np.prod([shape[i] for i in keep if i < red[0]]))
        C = int(np.prod([shape[i] for i in keep if i > red[-1]]))
        direct = len(shape) == 4 and axes == {1, 2}
        kh, kw = (shape[1], shape[2]) if direct else (R, 1) if P == 1 else (1, R)
        m4 = [1, R, 1, C] if P == 1 else [1, P, R, C]
        at = op
        if not direct:
            x4 = new_tensor(g, g.tensors[x].name + '/as_nhwc', m4, like=x)
            rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [x], [x4], {}, src=op.src)
            make_reshape(g, rs, m4)
            g.ops.insert(g.ops.index(op), rs)
            x = x4
        p = new_tensor(g, g.tensors[y].name + '/pooled', [1, P, 1, C], like=y) if not direct or \
            list(g.tensors[y].shape) != [1, 1, 1, C] else y
        op.name, op.code = 'MAX_POOL_2D', OP_CODES['MAX_POOL_2D']
        op.inputs, op.outputs = [x], [p]
        op.options = {'padding': 'VALID', 'stride_w': 1, 'stride_h': 1, 'filter_width': kw,
                      'filter_height': kh, 'fused_activation_function': 'NONE'}
        if p != y:
            rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [p], [y], {}, src=op.src)
            make_reshape(g, rs, list(g.tensors[y].shape))
            g.ops.insert(g.ops.index(at) + 1, rs)
        renumber(g)
        done += 1
    return done


_SHAPE_OPS = ('RESHAPE', 'SQUEEZE', 'EXPAND_DIMS')


def _sole_chain(g: Graph, k: int, stop):
    """The ops from tensor k through shape-only ops (_SHAPE_OPS), each the sole reader of
    the last one's output, to the first op stop(op) accepts: (shape ops, that op), or
    None."""
    chain = []
    while True:
        cons = consumers(g, k)
        if len(cons) != 1 or k in g.outputs:
            return None
        op = cons[0]
        if stop(op):
            return chain, op
        if op.name not in _SHAPE_OPS or op.inputs[0] != k:
            return None
        chain.append(op)
        k = op.outputs[0]


def dilated_convs(g: Graph) -> int:
    """A dilated convolution as TFLite's converter writes it (Keras's Conv1D/Conv2D/
    DepthwiseConv2D with dilation_rate > 1, causal TCN layers): SPACE_TO_BATCH_ND (the
    block, paddings) -> [EXPAND_DIMS] -> a VALID stride-1 CONV_2D / DEPTHWISE_CONV_2D ->
    [RESHAPE / SQUEEZE] -> BATCH_TO_SPACE_ND (the block, crops) -> the same convolution
    with dilation = block on the padded input (the b phases' convolutions interleaved
    are the dilated one at every position), with a PAD of the paddings less the crops
    (cropping the last outputs of a VALID convolution is reading fewer trailing inputs)
    and RESHAPEs in place of the shape ops.  The same arithmetic per output: int8
    graphs too.  Returns how many."""
    done = 0
    for s2b in list(g.ops):
        if s2b.name != 'SPACE_TO_BATCH_ND' or len(s2b.inputs) != 3:
            continue
        x = s2b.inputs[0]
        blk, pads = const_ints(g, s2b.inputs[1]), const_ints(g, s2b.inputs[2])
        xs = list(g.tensors[x].shape)
        if blk is None or pads is None or not xs or xs[0] != 1 or len(xs) != len(blk) + 2:
            continue
        m = len(blk)
        pre = _sole_chain(g, s2b.outputs[0], lambda o: o.name in ('CONV_2D', 'DEPTHWISE_CONV_2D'))
        if pre is None or any(o.name != 'EXPAND_DIMS' for o in pre[0]):
            continue
        conv = pre[1]
        o = conv.options
        if conv.inputs[0] != (pre[0][-1].outputs[0] if pre[0] else s2b.outputs[0]) or \
                o.get('padding', 'SAME') != 'VALID' or o.get('stride_h', 1) != 1 or \
                o.get('stride_w', 1) != 1 or o.get('dilation_h_factor', 1) != 1 or \
                o.get('dilation_w_factor', 1) != 1:
            continue
        post = _sole_chain(g, conv.outputs[0], lambda op: op.name == 'BATCH_TO_SPACE_ND')
        if post is None:
            continue
        b2s = post[1]
        if len(b2s.inputs) != 3 or const_ints(g, b2s.inputs[1]) != blk:
            continue
        crops = const_ints(g, b2s.inputs[2])
        # the axes the EXPAND_DIMS insert, and where x's blocked axes 1..m land in the
        # convolution's NHWC input
        inserted = [const_ints(g, e.inputs[1])[0] % (len(g.tensors[e.inputs[0]].shape) + 1)
                    for e in pre[0]]
        axes = list(range(1, m + 1))
        for a in inserted:
            axes = [v + 1 if v >= a else v for v in axes]
        pad = [(pads[2 * i] - crops[2 * i], pads[2 * i + 1] - crops[2 * i + 1]) for i in range(m)]
        if len(g.tensors[conv.inputs[0]].shape) != 4 or not set(axes) <= {1, 2} or \
                min(min(p) for p in pad) < 0:
            continue
        dil = {1: 1, 2: 1}
        for a, bk in zip(axes, blk):
            dil[a] = bk
        # x padded, then shaped as the convolution's input (the shape ops' inserted 1s)
        xp = x
        if any(p != (0, 0) for p in pad):
            pshape = [xs[0]] + [xs[i + 1] + sum(pad[i]) for i in range(m)] + xs[m + 1:]
            xp = new_tensor(g, g.tensors[x].name + '/dilation_pad', pshape, like=x)
            pt = new_tensor(g, g.tensors[x].name + '/dilation_paddings', [len(xs), 2],
                            np.array([[0, 0]] + [list(p) for p in pad] + [[0, 0]] * (len(xs) - m - 1),
                                     np.int32))
            g.ops.insert(g.ops.index(s2b), Operator(-1, OP_CODES['PAD'], 'PAD', [x, pt], [xp], {},
                                                    src=s2b.src))
        cin = list(g.tensors[xp].shape)
        for a in inserted:
            cin.insert(a, 1)
        w = g.tensors[conv.inputs[1]].shape
        kh, kw = w[1], w[2]
        cout = [1, cin[1] - dil[1] * (kh - 1), cin[2] - dil[2] * (kw - 1),
                g.tensors[conv.outputs[0]].shape[3]]
        y = b2s.outputs[0]
        if min(cout) < 1 or int(np.prod(cout)) != int(np.prod(g.tensors[y].shape)):
            continue
        # the convolution reads the padded input shaped, dilated, and its output is the
        # BATCH_TO_SPACE_ND's output shaped: the blocking ops go, the shape ops become one
        # RESHAPE each side (none where the shapes agree)
        ci = g.tensors[conv.inputs[0]]
        ci.shape = cin
        for op in [s2b] + pre[0]:
            remove_op(g, op)
        if cin != list(g.tensors[xp].shape):
            rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [xp], [ci.index], {}, src=conv.src)
            make_reshape(g, rs, cin)
            g.ops.insert(g.ops.index(conv), rs)
        else:
            conv.inputs[0] = xp
        co = g.tensors[conv.outputs[0]]
        co.shape = cout
        conv.options = dict(o, dilation_h_factor=dil[1], dilation_w_factor=dil[2])
        for op in post[0] + [b2s]:
            remove_op(g, op)
        if cout != list(g.tensors[y].shape):
            rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [co.index], [y], {}, src=conv.src)
            make_reshape(g, rs, list(g.tensors[y].shape))
            g.ops.insert(g.ops.index(conv) + 1, rs)
        else:
            conv.outputs[0] = y
        renumber(g)
        done += 1
    return done


def padv2_to_pad(g: Graph) -> int:
    """A float PADV2 (PAD with a constant value c: F.pad(x, value=c), tf.pad's
    constant_values) -> SUB c, PAD (zeros), ADD c (c frozen); c 0: a PAD.  Returns how
    many.  (MIRROR_PAD: mirror_pads.)"""
    done = 0
    for op in list(g.ops):
        if op.name != 'PADV2' or len(op.inputs) < 3 or not is_const(g, op.inputs[1]) or \
                not is_const(g, op.inputs[2]) or \
                np.dtype(g.tensors[op.outputs[0]].dtype).kind != 'f':
            continue
        x, y, c = op.inputs[0], op.outputs[0], g.tensors[op.inputs[2]].data
        if np.size(c) != 1:
            continue
        c = float(np.asarray(c).reshape(-1)[0])
        if c == 0.0:
            op.name, op.code, op.inputs = 'PAD', OP_CODES['PAD'], op.inputs[:2]
        else:
            k = new_tensor(g, f'{g.tensors[y].name}/value', [], np.array(c, np.float32))
            g.tensors[k].frozen = True
            spell(g, op, [('SUB', [x, k], NO_ACTIVATION, list(g.tensors[x].shape)),
                          ('PAD', ['prev', op.inputs[1]], {}, None),
                          ('ADD', ['prev', k], NO_ACTIVATION, None)], own=1)
        done += 1
    return done


def depth_to_space(g: Graph) -> int:
    """DEPTH_TO_SPACE of block b (tf.nn.depth_to_space: a super-resolution model's pixel
    shuffle) [1, H, W, b*b*C] -> [1, H*b, W*b, C], and its inverse SPACE_TO_DEPTH, float
    and int8: output row h*b + i, column w*b + j, channel c is input (h, w) channel
    (i*b + j)*C + c, so the channels of row offset i are one run of b*C, which a RESHAPE
    [1, H, W*b, C] lays out along the row, and a map [1, H, b*W*b, C] holds each row's b
    rows side by side.  DEPTH_TO_SPACE: per i a STRIDED_SLICE of that run and that
    RESHAPE, their CONCATENATION along W, RESHAPEd to [1, H*b, W*b, C]; SPACE_TO_DEPTH the
    same backwards (RESHAPE, per i a slice along W and a RESHAPE, CONCATENATION along the
    channels).  Copies only, in the file's layout (no TRANSPOSE for cancel_transposes to
    fold into a weight): each output's gradient goes to the input it copies.  Returns how
    many."""
    done = 0
    for op in list(g.ops):
        if op.name not in ('DEPTH_TO_SPACE', 'SPACE_TO_DEPTH') or len(op.inputs) != 1 or \
                is_const(g, op.inputs[0]):
            continue
        x, y = op.inputs[0], op.outputs[0]
        b = int(op.options.get('block_size', 0) or 0)
        deep, flat = list(g.tensors[x].shape), list(g.tensors[y].shape)
        if op.name == 'SPACE_TO_DEPTH':
            deep, flat = flat, deep
        if len(deep) != 4 or deep[0] != 1 or b < 1 or deep[3] % (b * b) or \
                flat != [1, deep[1] * b, deep[2] * b, deep[3] // (b * b)]:
            continue
        _, H, W, D = deep
        C, name, made = D // (b * b), g.tensors[y].name, []

        def tensor(what, shape):
            return new_tensor(g, f'{name}/{what}', shape, like=y)

        def reshape(a, out):
            made.append(Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [a], [out], {}, src=op.src))
            make_reshape(g, made[-1], list(g.tensors[out].shape))
            return out

        def join(parts, axis, out):
            made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', parts, [out],
                                 {'axis': axis, 'fused_activation_function': 'NONE'},
                                 src=op.src))
            return out

        def cut(a, what, begin, end, strides, shape):
            made.append(slice_op(g, a, tensor(what, shape), f'{name}/{what}', begin, end,
                                 strides, op.src))
            return made[-1].outputs[0]
        if op.name == 'SPACE_TO_DEPTH':
            rows = reshape(x, tensor('rows', [1, H, b * W * b, C]))
            join([reshape(cut(rows, f'row{i}_wide', [0, 0, i * W * b, 0],
                              [1, H, (i + 1) * W * b, C], [1] * 4, [1, H, W * b, C]),
                          tensor(f'row{i}', [1, H, W, b * C])) for i in range(b)], 3, y)
        else:
            parts = []
            for i in range(b):
                if getattr(op, 'crd', False):
                    # (ONNX's mode CRD, torch's PixelShuffle: channel c*b*b + i*b + j, so
                    # offset (i, j)'s channels are every b*b-th: joined j by j as DCR has them)
                    part = join([cut(x, f'row{i}_col{j}', [0, 0, 0, i * b + j], [1, H, W, D],
                                     [1, 1, 1, b * b], [1, H, W, C]) for j in range(b)],
                                3, tensor(f'row{i}', [1, H, W, b * C]))
                else:
                    part = cut(x, f'row{i}', [0, 0, 0, i * b * C], [1, H, W, (i + 1) * b * C],
                               [1] * 4, [1, H, W, b * C])
                parts.append(reshape(part, tensor(f'row{i}_wide', [1, H, W * b, C])))
            reshape(join(parts, 2, tensor('rows', [1, H, b * W * b, C])), y)
        replace_op(g, op, made)
        done += 1
    return done


def _frames_stacked(g, op, x, name, shape):
    """What a 3-D conv's 2-D spelling starts from: its list of new ops, a step(op_name,
    ins, shape, **opts) that appends one (named after the output `name`, read back to
    op's source) and returns its output, and the 5-D input x RESHAPEd to `shape`, its
    frames stacked along H."""
    made = []

    def step(op_name, ins, shape, **opts):
        out = new_tensor(g, f'{name}/{op_name.lower()}{len(made)}', shape)
        made.append(Operator(-1, OP_CODES[op_name], op_name, ins, [out], opts, src=op.src))
        return out
    x4 = step('RESHAPE', [x], shape)
    make_reshape(g, made[-1], shape)
    return made, step, x4


def _stands_for(op, made, first):
    """The conv just made (made[-1]) in a 3-D conv's 2-D spelling: the first is op itself,
    rewritten in place (--train and --ranks select by identity), the others train with
    it.  Returns the first."""
    conv = made[-1]
    if first is not None:
        conv.trains_with = op
        return first
    op.name, op.code, op.inputs, op.outputs, op.options = \
        conv.name, conv.code, conv.inputs, conv.outputs, conv.options
    made[-1] = op
    return conv


def conv3d_to_conv2d(g: Graph) -> int:
    """A float CONV_3D (Keras Conv3D) [1, D, H, W, C] * [kd, kh, kw, C, O] -> a CONV_2D per
    output frame and depth tap: frame f of the input (a STRIDED_SLICE of it seen as
    [1, D*H, W, C], PADded in H and W where SAME) convolved with the tap's [O, kh, kw, C]
    slice of the weight (one constant per tap, read by every output frame: its gradient
    summed over them), the taps of an output frame ADDed (the op's activation on the
    last), the frames joined along H and RESHAPEd to [1, Do, Ho, Wo, O].  A depth tap
    that falls in the depth padding reads zeros: it is left out.  A grouped one (ONNX's
    Conv of group G: weight [kd, kh, kw, C / G, O]) makes grouped CONV_2Ds ([O, kh, kw,
    C / G]), which split_groups splits.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'CONV_3D' or len(op.inputs) < 2 or not is_const(g, op.inputs[1]) or \
                g.tensors[op.outputs[0]].dtype != 'float32' or \
                len(g.tensors[op.inputs[0]].shape) != 5:
            continue
        o = op.options
        x, y = op.inputs[0], op.outputs[0]
        _, D, H, W, C = g.tensors[x].shape
        Wt = np.asarray(g.tensors[op.inputs[1]].data, np.float32)
        kd, kh, kw, Cg, O = Wt.shape      # (Cg = C / groups: each tap a grouped CONV_2D)
        if C % Cg or O % (C // Cg):
            continue
        sd, sh, sw = (int(o.get(f'stride_{a}', 1) or 1) for a in 'dhw')
        dd, dh, dw = (int(o.get(f'dilation_{a}_factor', 1) or 1) for a in 'dhw')
        same = o.get('padding') == 'SAME'
        pads = getattr(op, 'pads3d', None)      # (ONNX's: begin d, h, w, end d, h, w)
        if pads is not None:
            fd, ph0, pw0, ed, ph1, pw1 = pads
            Do, Ho, Wo = ((n + p0 + p1 - (k - 1) * dl - 1) // s + 1 for n, k, s, dl, p0, p1 in (
                (D, kd, sd, dd, fd, ed), (H, kh, sh, dh, ph0, ph1), (W, kw, sw, dw, pw0, pw1)))
        elif same:
            (fd, _, Do), (ph0, ph1, Ho), (pw0, pw1, Wo) = (
                same_pads(D, kd, sd, dd), same_pads(H, kh, sh, dh), same_pads(W, kw, sw, dw))
        else:
            fd = ph0 = ph1 = pw0 = pw1 = 0
            Do, Ho, Wo = ((n - (k - 1) * dl - 1) // s + 1
                          for n, k, s, dl in ((D, kd, sd, dd), (H, kh, sh, dh), (W, kw, sw, dw)))
        lives = [[(i, d * sd + i * dd - fd) for i in range(kd)
                  if 0 <= d * sd + i * dd - fd < D] for d in range(Do)]
        if [1, Do, Ho, Wo, O] != list(g.tensors[y].shape) or not all(lives):
            continue        # (an output frame whose taps all read the padding: left as it is)
        bias = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] >= 0 else -1
        name = g.tensors[y].name
        made, step, x4 = _frames_stacked(g, op, x, name, [1, D * H, W, C])
        # (named after the weight: export maps a tap back into it, export_onnx)
        taps = [new_tensor(g, f'{g.tensors[op.inputs[1]].name}/tap{i}', [O, kh, kw, Cg],
                           np.ascontiguousarray(Wt[i].transpose(3, 0, 1, 2)))
                for i in range(kd)]
        frames, outs, first = {}, [], None
        for d in range(Do):
            acc, live = None, lives[d]
            for n, (i, f) in enumerate(live):
                if f not in frames:
                    fr = new_tensor(g, f'{name}/frame{f}', [1, H, W, C])
                    made.append(slice_op(g, x4, fr, f'{name}/frame{f}', [0, f * H, 0, 0],
                                         [1, (f + 1) * H, W, C], [1, 1, 1, 1], op.src))
                    if ph0 or ph1 or pw0 or pw1:
                        pads = new_tensor(g, f'{name}/frame{f}_pads', [4, 2], np.array(
                            [[0, 0], [ph0, ph1], [pw0, pw1], [0, 0]], np.int32))
                        fr = step('PAD', [fr, pads], [1, H + ph0 + ph1, W + pw0 + pw1, C])
                    frames[f] = fr
                last = n == len(live) - 1
                act = o.get('fused_activation_function', 'NONE') if last and n == 0 else 'NONE'
                c = step('CONV_2D', [frames[f], taps[i], bias if n == 0 else -1], [1, Ho, Wo, O],
                         padding='VALID', stride_h=sh, stride_w=sw, dilation_h_factor=dh,
                         dilation_w_factor=dw, fused_activation_function=act)
                first = _stands_for(op, made, first)
                acc = c if acc is None else step(
                    'ADD', [acc, c], [1, Ho, Wo, O], fused_activation_function=o.get(
                        'fused_activation_function', 'NONE') if last else 'NONE')
            outs.append(acc)
        joined = outs[0] if Do == 1 else step('CONCATENATION', outs, [1, Do * Ho, Wo, O],
                                              axis=1, fused_activation_function='NONE')
        made.append(Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [joined], [y], {}, src=op.src))
        make_reshape(g, made[-1], [1, Do, Ho, Wo, O])
        replace_op(g, op, made)
        renumber(g)
        done += 1
    return done


def conv3d_transpose_to_2d(g: Graph) -> int:
    """A float CONV_3D_TRANSPOSE (Keras Conv3DTranspose; an ONNX ConvTranspose of three
    spatial dimensions) [1, D, H, W, C] with weight [kd, kh, kw, O, C] -> a TRANSPOSE_CONV
    per input frame and depth tap: output frame f (of the full transposed convolution, the
    depth padding's begin on) is the sum over the taps i and input frames d with
    d * stride_d + i = f of frame d (a STRIDED_SLICE of the input seen as [1, D*H, W, C])
    transposed-convolved with the tap's [O, kh, kw, C] slice of the weight (one constant
    per tap, 'W/ttap{i}', read by every frame: its gradient summed over them), ADDed (the
    bias in each frame's first, the op's activation on its last); H and W as TFLite's
    TRANSPOSE_CONV computes them (SAME or VALID at the output's size where TensorFlow's
    sizes allow it, so that TFLite runs the exported graph; else, ONNX's other pads and
    output_padding, VALID to the full size, cut by a STRIDED_SLICE); an output frame no tap reaches
    (stride_d > kd) is the bias (a TRANSPOSE_CONV of a frozen zero tap, the bias trains
    there too).  The frames are joined along H and RESHAPEd to [1, Do,
    Ho, Wo, O].  Dilation and groups are left as they are (refused).  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'CONV_3D_TRANSPOSE' or len(op.inputs) < 3 or \
                not is_const(g, op.inputs[1]) or g.tensors[op.outputs[0]].dtype != 'float32' \
                or len(g.tensors[op.inputs[2]].shape) != 5:
            continue
        o = op.options
        x, y = op.inputs[2], op.outputs[0]
        _, D, H, W, C = g.tensors[x].shape
        Wt = np.asarray(g.tensors[op.inputs[1]].data, np.float32)
        kd, kh, kw, O, C2 = Wt.shape
        ys = list(g.tensors[y].shape)
        if C2 != C or len(ys) != 5 or ys[4] != O or any(
                int(o.get(f'dilation_{a}_factor', 1) or 1) != 1 for a in 'dhw'):
            continue
        _, Do, Ho, Wo, _ = ys
        sd, sh, sw = (int(o.get(f'stride_{a}', 1) or 1) for a in 'dhw')
        begin = getattr(op, 'tpads3d', None)    # (ONNX's pads begin: d, h, w)
        if begin is None:       # (TFLite's: the pad of the convolution it is the transpose of)
            begin = [same_pads(n, k, s, 1)[0] if o.get('padding') == 'SAME' else 0
                     for n, k, s in ((Do, kd, sd), (Ho, kh, sh), (Wo, kw, sw))]
        bd, bh, bw = begin
        # (each TRANSPOSE_CONV of a size TensorFlow's own rules allow, so that TFLite runs
        # the exported graph as utrain does: optable.tconv_form)
        form = tconv_form((H, W), (Ho, Wo), (kh, kw), (sh, sw), (bh, bw))
        if form is None:
            continue            # (rows past what any tap reaches: left as it is)
        pad, big = form[0], [1] + form[1] + [O]
        bias = op.inputs[3] if len(op.inputs) > 3 and op.inputs[3] >= 0 else -1
        act = o.get('fused_activation_function', 'NONE')
        name = g.tensors[y].name
        made, step, x4 = _frames_stacked(g, op, x, name, [1, D * H, W, C])
        # (named after the weight: export maps a tap back into it, export_onnx)
        taps = [new_tensor(g, f'{g.tensors[op.inputs[1]].name}/ttap{i}', [O, kh, kw, C],
                           np.ascontiguousarray(Wt[i].transpose(2, 0, 1, 3)))
                for i in range(kd)]
        shape = new_tensor(g, f'{name}/frame_shape', [4], np.array(big, np.int32))
        frames, outs, first, zero = {}, [], None, None
        for od in range(Do):
            f = od + bd
            live = [(i, (f - i) // sd) for i in range(kd)
                    if (f - i) % sd == 0 and 0 <= (f - i) // sd < D]
            acc = None
            for n, (i, d) in enumerate(live):
                if d not in frames:
                    fr = new_tensor(g, f'{name}/frame{d}', [1, H, W, C])
                    made.append(slice_op(g, x4, fr, f'{name}/frame{d}', [0, d * H, 0, 0],
                                         [1, (d + 1) * H, W, C], [1, 1, 1, 1], op.src))
                    frames[d] = fr
                last = n == len(live) - 1
                c = step('TRANSPOSE_CONV', [shape, taps[i], frames[d]] + (
                    [bias] if n == 0 and bias >= 0 else []), big, padding=pad or 'VALID',
                    stride_h=sh, stride_w=sw,
                    fused_activation_function=act if last and n == 0 else 'NONE')
                first = _stands_for(op, made, first)
                acc = c if acc is None else step('ADD', [acc, c], big,
                                                 fused_activation_function=act if last else 'NONE')
            if acc is None:         # (no tap reaches it: the bias alone, as a TRANSPOSE_CONV
                # of a frozen zero tap, so that the bias trains there too)
                if 0 not in frames:
                    frames[0] = new_tensor(g, f'{name}/frame0', [1, H, W, C])
                    made.append(slice_op(g, x4, frames[0], f'{name}/frame0', [0, 0, 0, 0],
                                         [1, H, W, C], [1, 1, 1, 1], op.src))
                if zero is None:
                    zero = new_tensor(g, f'{g.tensors[op.inputs[1]].name}/zero_tap',
                                      [O, kh, kw, C], np.zeros((O, kh, kw, C), np.float32))
                    g.tensors[zero].frozen = True
                acc = step('TRANSPOSE_CONV', [shape, zero, frames[0]] + (
                    [bias] if bias >= 0 else []), big, padding=pad or 'VALID', stride_h=sh,
                    stride_w=sw, fused_activation_function=act)
                made[-1].trains_with = op
            if not pad:
                cut = new_tensor(g, f'{name}/cut{od}', [1, Ho, Wo, O])
                made.append(slice_op(g, acc, cut, f'{name}/cut{od}', [0, bh, bw, 0],
                                     [1, bh + Ho, bw + Wo, O], [1, 1, 1, 1], op.src))
                acc = cut
            outs.append(acc)
        if first is None:       # (no frame any tap reaches: left as it is)
            continue
        joined = outs[0] if Do == 1 else step('CONCATENATION', outs, [1, Do * Ho, Wo, O],
                                              axis=1, fused_activation_function='NONE')
        made.append(Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [joined], [y], {}, src=op.src))
        make_reshape(g, made[-1], [1, Do, Ho, Wo, O])
        replace_op(g, op, made)
        renumber(g)
        done += 1
    return done
