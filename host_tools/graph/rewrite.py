"""Graph rewrites for exporter output, run by `prepare` before validation.

Each pass is a small function over the circle_io Graph IR that edits the graph in place
and returns how many changes it made:

* unroll_loops        a WHILE whose trip count the host knows (a Keras LSTM, GRU,
                      SimpleRNN or Bidirectional layer that is not unroll=True) -> its
                      body inlined once a step, counters and buffer slices folded, the
                      body's weights one tensor each (Tensor.origin: where export writes
                      them); reverse_to_concat before it makes a REVERSE_V2 slices.  Both
                      run before dequantize.
* dequantize          int8/uint8/int16 (and int32 bias) tensors with quantization
                      parameters -> float32 (constants dequantized with their scales and
                      zero points), QUANTIZE/DEQUANTIZE ops dropped.
* cancel_transposes   the layout TRANSPOSEs that tico puts around NHWC kernels: sinks each
                      TRANSPOSE through elementwise ops (permuting broadcast constants),
                      reductions (remapping axes) and other transposes (composing), turns a
                      transpose that only moves size-1 dims into a RESHAPE, folds a
                      TRANSPOSE-RESHAPE-FULLY_CONNECTED flatten into the FC's weight columns,
                      merges transposes of one tensor by one perm, hoists one
                      TRANSPOSE out of a binary op whose inputs are all transposed by
                      the same perm (a residual ADD of two NCHW branches), merges
                      RESHAPE chains and deletes identities.  A transpose that cannot
                      be cancelled stays (a TRANSPOSE kernel runs it).
* fold_batchnorm      a MUL/ADD/SUB/DIV by a per-channel constant after CONV_2D,
                      DEPTHWISE_CONV_2D or FULLY_CONNECTED (tico's eval-mode BatchNorm2d)
                      folded into the layer's weight and bias, for frozen layers only.
* first_steps         tico's folded first RNN step (nn.GRU / nn.LSTM): copies of b_hh
                      -> the recurrent FC applied to a frozen zero state (tied to b_hh);
                      the zero state's constants frozen.
* scaled_copies       a layer tico copied scaled by beta (softplus's beta * linear(x))
                      -> MUL(the layer's output, beta).
* slices_to_split     STRIDED_SLICEs tiling one activation along one axis (an unrolled
                      RNN's time steps) -> one SPLIT_V.
* fold_shapes         shape arithmetic the host knows (SHAPE of a tensor, and STRIDED_SLICE,
                      PACK, CONCATENATION, GATHER, CAST, RESHAPE, ADD/SUB/MUL/..., REDUCE_PROD/SUM of
                      integer constants: Keras's Reshape/Flatten with a dynamic batch)
                      computed once into constants.
* reduce_max_to_pool  REDUCE_MAX over one run of axes (a global max pool) -> a
                      MAX_POOL_2D whose window is the reduced axes (RESHAPEs around it
                      where the input is not NHWC with H and W reduced).
* split_groups        a grouped CONV_2D (weight [O, kh, kw, I/G]) -> SPLIT -> a CONV_2D
                      per group -> CONCATENATION (one channel per group: a
                      DEPTHWISE_CONV_2D); join_groups undoes it for export.

Tensors are never renumbered by the passes (new ones are appended; dead ones stay unused
until :func:`compact`), and surviving Operator objects keep their identity, so a set of
trainable ops chosen on the original graph carries over.  :func:`save_graph` writes the
result as a circle file.
"""
from __future__ import annotations

import copy
import dataclasses

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


# --------------------------------------------------------------------------- helpers

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


# the name ending of the SOFTMAX prepare puts after a float model's rows of logits a step
# (step_softmax): export takes it out again (drop_step_softmax)
STEP_SOFTMAX = '/utrain_step_softmax'


def step_softmax(g: Graph) -> int:
    """Append a SOFTMAX over each row of float graph g's output (rows of logits, a class
    a step: the board's cross-entropy takes probabilities a row, and from logits it would
    normalise all the rows as one); the output is its result.  Returns the op's number
    (the op making the logits': --train last:N counts the file's ops)."""
    k = g.outputs[0]
    made = next((op for op in g.ops if k in op.outputs), None)
    t = g.tensors[k]
    p = new_tensor(g, t.name + STEP_SOFTMAX, t.shape)
    g.tensors[p].sig, t.sig = t.sig, None
    g.ops.append(Operator(len(g.ops), OP_CODES['SOFTMAX'], 'SOFTMAX', [k], [p], {'beta': 1.0},
                          src=made.number if made is not None else None))
    g.outputs[0] = p
    return g.ops[-1].number


def drop_step_softmax(g: Graph) -> bool:
    """Take step_softmax's op out of graph g (export: the model gives its logits as the
    file did); whether there was one."""
    op = next((o for o in g.ops if o.name == 'SOFTMAX' and
               g.tensors[o.outputs[0]].name.endswith(STEP_SOFTMAX)), None)
    if op is None:
        return False
    g.outputs = [op.inputs[0] if k == op.outputs[0] else k for k in g.outputs]
    g.tensors[op.inputs[0]].sig = g.tensors[op.outputs[0]].sig
    remove_op(g, op)
    return True


def _renumber(g: Graph):
    for i, op in enumerate(g.ops):
        op.index = i


def remove_op(g: Graph, op: Operator):
    g.ops.remove(op)
    _renumber(g)


def replace_op(g: Graph, op: Operator, made: list):
    """The ops made (a rewrite of op into several) take op's place in g's order."""
    at = g.ops.index(op)
    g.ops[at:at + 1] = made
    _renumber(g)


def move_after(g: Graph, op: Operator, anchor: Operator):
    g.ops.remove(op)
    g.ops.insert(g.ops.index(anchor) + 1, op)
    _renumber(g)


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


def _inverse(p):
    inv = [0] * len(p)
    for i, v in enumerate(p):
        inv[v] = i
    return inv


def _only_moves_ones(shape, p):
    """True when transposing ``shape`` by ``p`` keeps the order of its non-1 dims: the
    data is unchanged, so the transpose is a reshape."""
    kept = [v for v in p if shape[v] != 1]
    return kept == sorted(kept)


def _make_reshape(g: Graph, op: Operator, out_shape):
    op.name, op.code = 'RESHAPE', OP_CODES['RESHAPE']
    shp = new_tensor(g, g.tensors[op.outputs[0]].name + '/shape', [len(out_shape)],
                     np.array(out_shape, np.int32))
    op.inputs = [op.inputs[0], shp]
    op.options = {'new_shape': list(out_shape)}


# --------------------------------------------------------------------------- transposes

def _sink_through(g: Graph, t: Operator, c: Operator, p) -> bool:
    """Move TRANSPOSE ``t`` (perm p) below its only consumer ``c``."""
    a, b = t.inputs[0], t.outputs[0]
    ashape = g.tensors[a].shape
    out = c.outputs[0]
    r = len(p)
    if c.name in UNARY or c.name in BINARY:
        if c.name in BINARY:
            other = [k for k in c.inputs if k != b]
            if len(other) != 1 or c.inputs.count(b) != 1 or \
                    not (is_const(g, other[0]) or _broadcast_vector(g, other[0], p)):
                return False
            k = other[0]
            if not is_const(g, k):
                # a per-channel [1, C, 1, 1] map (a squeeze-excite's weights): the same
                # values as [1, 1, 1, C], a RESHAPE before c
                ks = [1] * (r - len(g.tensors[k].shape)) + list(g.tensors[k].shape)
                shape = [ks[v] for v in _inverse(p)]
                nk = new_tensor(g, g.tensors[k].name + '/nhwc', shape, like=k)
                rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE',
                              [k, new_tensor(g, g.tensors[k].name + '/nhwc_shape', [r],
                                             np.array(shape, np.int32))], [nk],
                              {'new_shape': shape}, src=c.src)
                g.ops.insert(g.ops.index(c), rs)
                _renumber(g)
            else:
                kd = np.asarray(g.tensors[k].data)
                if kd.ndim > r:
                    return False
                kd = kd.reshape([1] * (r - kd.ndim) + list(kd.shape)).transpose(_inverse(p))
                nk = new_tensor(g, g.tensors[k].name + '/nhwc', kd.shape,
                                np.ascontiguousarray(kd), like=k)
            c.inputs = [nk if x == k else x for x in c.inputs]
        oshape = list(ashape)
    elif c.name in REDUCE and len(c.inputs) >= 2:
        axes = const_ints(g, c.inputs[1])
        if axes is None:
            return False
        axes = sorted({x % r for x in axes})
        new_axes = sorted(p[x] for x in axes)
        keep = bool(c.options.get('keep_dims', False))
        c.inputs = [c.inputs[0], new_tensor(g, g.tensors[c.inputs[1]].name + '/nhwc',
                                             [len(new_axes)], np.array(new_axes, np.int32))]
        oshape = [1 if i in new_axes else ashape[i] for i in range(r)]
        if not keep:
            rest = [i for i in range(r) if i not in new_axes]
            oshape = [ashape[i] for i in rest]
            kept_b = [p[i] for i in range(r) if i not in axes]     # a-dims, in b's order
            p = [rest.index(v) for v in kept_b]
    else:
        return False
    c.inputs = [a if x == b else x for x in c.inputs]
    mid = new_tensor(g, g.tensors[out].name + '/pre_transpose', oshape, like=out)
    c.outputs[0] = mid
    t.inputs = [mid, new_tensor(g, g.tensors[t.inputs[1]].name + '/moved', [len(p)],
                                np.array(p, np.int32))]
    t.outputs = [out]
    move_after(g, t, c)
    return True


def _onnx(g: Graph) -> bool:
    """g read from an .onnx file: the moves made for tico's graphs (a reshape, several
    readers, slices, a concatenation, a [1, C, 1, 1] operand) are left out there, where
    export finds each trained tensor by its initializer's name (a moved constant's
    '/nhwc' copy has none) and the input's layout stays as session 18 left it."""
    return str(getattr(g, 'path', '') or '').lower().endswith('.onnx')


def _broadcast_vector(g: Graph, k: int, p) -> bool:
    """Activation k, as an operand broadcast against a map transposed by p, is the same
    values transposed back: a [1, C, 1, 1] vector (its non-1 dims keep their order)."""
    ks = list(g.tensors[k].shape)
    if len(ks) > len(p) or k in g.inputs or _onnx(g):
        return False
    ks = [1] * (len(p) - len(ks)) + ks
    return _only_moves_ones(ks, _inverse(p))


def _ones_only(a, b) -> bool:
    """A reshape of shape a into b that only inserts or removes 1s (a squeeze or an
    unsqueeze: the data's order is unchanged)."""
    return [d for d in a if d != 1] == [d for d in b if d != 1]


def _sink_through_reshape(g: Graph, t: Operator, r: Operator, p) -> bool:
    """TRANSPOSE ``t`` (perm p) -> RESHAPE ``r`` that only adds or drops 1s (tico's
    [1, C, L, 1] -> [1, C, L] after a Conv1d's NHWC conv): the reshape runs first, on
    t's input, and a TRANSPOSE of r's rank follows it, which can sink on (a
    ``x.mean(-1)`` of the Conv1d's NCL map then reduces the channels-last map's steps)."""
    if r.name != 'RESHAPE' or r.inputs[0] != t.outputs[0] or len(r.outputs) != 1:
        return False
    a, b, c = t.inputs[0], t.outputs[0], r.outputs[0]
    ashape, bshape = g.tensors[a].shape, g.tensors[b].shape
    cshape = g.tensors[c].shape
    if c in g.outputs or not _ones_only(bshape, cshape):
        return False
    s = [p[i] for i in range(len(p)) if bshape[i] != 1]     # a's axes, in b's order
    srt = sorted(s)
    pc = [j for j, d in enumerate(cshape) if d != 1]
    mid = list(cshape)
    q = list(range(len(cshape)))
    for m, j in enumerate(pc):
        mid[j] = ashape[srt[m]]
        q[j] = pc[srt.index(s[m])]
    r.inputs = [a, new_tensor(g, g.tensors[c].name + '/shape_nhwc', [len(mid)],
                              np.array(mid, np.int32))]
    r.options = dict(r.options or {}, new_shape=list(mid))
    m_t = new_tensor(g, g.tensors[c].name + '/pre_transpose', mid, like=c)
    r.outputs = [m_t]
    t.inputs = [m_t, new_tensor(g, g.tensors[t.inputs[1]].name + '/squeezed', [len(q)],
                                np.array(q, np.int32))]
    t.outputs = [c]
    move_after(g, t, r)
    return True


def _split_readers(g: Graph, t: Operator, p) -> bool:
    """TRANSPOSE ``t`` read by several elementwise ops, one of them unary or of t and
    constants (tico's SiLU x * sigmoid(x) of an NCL map: LOGISTIC and MUL read it; its
    Hardswish x * relu6(x + 3) / 6: ADD and MUL): a TRANSPOSE for each such reader,
    sunk below it, so that the binary op reading them all through
    transposes by p hoists them (_hoist_binary) and one TRANSPOSE goes on down."""
    a, b = t.inputs[0], t.outputs[0]
    cs = consumers(g, b)
    def alone(c):           # (a reader _sink_through takes: b, constants, a [1, C, 1, 1])
        if c.name in REDUCE:
            return c.inputs[0] == b and len(c.inputs) >= 2 and is_const(g, c.inputs[1])
        return c.name in UNARY or (c.name in BINARY and c.inputs.count(b) == 1 and all(
            k == b or is_const(g, k) or _broadcast_vector(g, k, p) for k in c.inputs))
    if b in g.outputs or len(cs) < 2 or not any(alone(c) for c in cs) or \
            not all(c.name in UNARY or c.name in BINARY or c.name in REDUCE for c in cs):
        return False
    sunk = False
    for c in cs:
        if not alone(c):
            continue
        u = new_tensor(g, g.tensors[b].name + '/for_' + str(c.index), g.tensors[b].shape, like=b)
        tc = dataclasses.replace(t, inputs=[a, t.inputs[1]], outputs=[u],
                                 options=dict(t.options or {}))
        g.ops.insert(g.ops.index(t) + 1, tc)
        _renumber(g)
        c.inputs = [u if k == b else k for k in c.inputs]
        sunk = _sink_through(g, tc, c, p) or sunk
    if not consumers(g, b):         # (every reader had its own)
        remove_op(g, t)
    return sunk


def _hoist_concat(g: Graph, c: Operator, p) -> bool:
    """A CONCATENATION ``c`` whose inputs all arrive through TRANSPOSEs by p, each read
    by c alone (tico's grouped Conv2d: a conv per group, each wrapped in TRANSPOSEs,
    joined on NCHW's channel axis): c joins the transposes' inputs on axis p[axis] and
    one TRANSPOSE by p follows it."""
    if c.name != 'CONCATENATION' or len(c.outputs) != 1 or len(set(c.inputs)) != len(c.inputs):
        return False
    ts = _transposed_inputs(g, c, p)
    if ts is None:
        return False
    ax = int(c.options.get('axis', 0)) % len(p)
    c.options = dict(c.options, axis=p[ax])
    return _one_transpose_after(g, c, ts, p)


def _transposed_inputs(g: Graph, c: Operator, p):
    """{input: the TRANSPOSE by p that writes it} for each input of c, each read by c
    alone and not a graph output, or None where one is not so."""
    ts = {}
    for k in set(c.inputs):
        prod = [o for o in g.ops if k in o.outputs]
        if len(prod) != 1 or perm_of(g, prod[0]) != p or k in g.outputs or \
                consumers(g, k) != [c] or len(g.tensors[prod[0].inputs[0]].shape) != len(p):
            return None
        ts[k] = prod[0]
    return ts


def _one_transpose_after(g: Graph, c: Operator, ts: dict, p) -> bool:
    """c reads the inputs of its input TRANSPOSEs ts (_transposed_inputs) and one of them,
    by p, follows it; the others go."""
    out = c.outputs[0]
    inv = _inverse(p)
    c.inputs = [ts[k].inputs[0] for k in c.inputs]
    c.outputs[0] = new_tensor(g, g.tensors[out].name + '/pre_transpose',
                              [g.tensors[out].shape[inv[i]] for i in range(len(p))], like=out)
    t, *rest = ts.values()
    for o in rest:
        remove_op(g, o)
    t.inputs = [c.outputs[0], t.inputs[1]]
    t.outputs = [out]
    move_after(g, t, c)
    return True


def _hoist_over_slice(g: Graph, t: Operator, p) -> bool:
    """TRANSPOSE ``t`` (perm p) of a STRIDED_SLICE of x that only t reads (tico's grouped
    Conv2d: a slice of the NCHW map per group, each transposed to NHWC for its conv):
    x is transposed first and sliced on the permuted axes.  The transposes of x by p
    that this makes for each group are one (cancel_transposes), which then cancels with
    the transpose before it, or moves into the model's input."""
    a = t.inputs[0]
    prod = [o for o in g.ops if a in o.outputs]
    if len(prod) != 1 or prod[0].name != 'STRIDED_SLICE' or a in g.outputs or \
            consumers(g, a) != [t] or len(prod[0].inputs) != 4:
        return False
    sl = prod[0]
    x = sl.inputs[0]
    o = sl.options or {}
    if any(o.get(k, 0) for k in ('ellipsis_mask', 'new_axis_mask', 'shrink_axis_mask')) or \
            o.get('offset', False):
        return False
    vals = [const_ints(g, k) for k in sl.inputs[1:]]
    r = len(p)
    if any(v is None or len(v) != r for v in vals) or len(g.tensors[x].shape) != r:
        return False
    xshape = g.tensors[x].shape
    y = new_tensor(g, g.tensors[x].name + '/nhwc', [xshape[v] for v in p], like=x)
    tx = dataclasses.replace(t, inputs=[x, t.inputs[1]], outputs=[y], options=dict(t.options or {}))
    g.ops.insert(g.ops.index(sl), tx)
    _renumber(g)
    names = ('begin', 'end', 'strides')
    sl.inputs = [y] + [new_tensor(g, g.tensors[k].name + '/nhwc', [r],
                                  np.array([v[p[j]] for j in range(r)], np.int32))
                       for k, v, _ in zip(sl.inputs[1:], vals, names)]
    bits = {}
    for k in ('begin_mask', 'end_mask'):
        m = int(o.get(k, 0))
        bits[k] = sum(1 << j for j in range(r) if m >> p[j] & 1)
    sl.options = dict(o, **bits)
    sl.outputs = list(t.outputs)
    remove_op(g, t)
    return True


def _hoist_binary(g: Graph, c: Operator, p) -> bool:
    """A binary elementwise op ``c`` (ADD, SUB, MUL, ...; fused activation or not) whose
    inputs all arrive through TRANSPOSEs by the same perm p, each read by c alone: c runs
    on the transposes' inputs and one TRANSPOSE by p follows it.  tico's residual ADD of
    two NCHW branches so loses its two transposes, and the one after it cancels with the
    next conv's.  (A transposed input and a constant is _sink_through's case.)"""
    if c.name not in BINARY or len(c.outputs) != 1:
        return False
    ts = _transposed_inputs(g, c, p)
    return ts is not None and _one_transpose_after(g, c, ts, p)


def _fold_into_fc(g: Graph, t: Operator, p) -> bool:
    """TRANSPOSE -> RESHAPE [1, N] -> FULLY_CONNECTED (constant weight): permute the
    weight's columns instead (the flatten of an NCHW map after an NHWC kernel)."""
    b = t.outputs[0]
    rs = consumers(g, b)
    if len(rs) != 1 or rs[0].name != 'RESHAPE' or b in g.outputs:
        return False
    r = rs[0]
    fcs = consumers(g, r.outputs[0])
    if len(fcs) != 1 or fcs[0].name != 'FULLY_CONNECTED' or r.outputs[0] in g.outputs \
            or fcs[0].inputs[0] != r.outputs[0] or not is_const(g, fcs[0].inputs[1]):
        return False
    fc = fcs[0]
    ashape = g.tensors[t.inputs[0]].shape
    n = int(np.prod(ashape))
    w = g.tensors[fc.inputs[1]]
    if w.data.ndim != 2 or w.data.shape[1] != n or g.tensors[r.outputs[0]].shape[-1] != n:
        return False
    src = np.arange(n).reshape(ashape).transpose(p).reshape(-1)
    nw = np.empty_like(w.data)
    nw[:, src] = w.data
    if len([o for o in g.ops if fc.inputs[1] in o.inputs]) == 1:
        w.data = nw
    else:
        fc.inputs[1] = new_tensor(g, w.name + '/nhwc', w.shape, nw, like=fc.inputs[1])
    r.inputs[0] = t.inputs[0]
    remove_op(g, t)
    return True


def _merge_reshapes(g: Graph) -> int:
    n = 0
    for op in list(g.ops):
        if op.name != 'RESHAPE' or op not in g.ops:
            continue
        a, b = op.inputs[0], op.outputs[0]
        if g.tensors[a].shape == g.tensors[b].shape and bypass(g, op, a, b):
            n += 1
            continue
        cs = consumers(g, b)
        if b not in g.outputs and cs and all(c.name == 'RESHAPE' and c.inputs[0] == b for c in cs):
            for c in cs:
                c.inputs[0] = a
            remove_op(g, op)
            n += 1
    return n


def cancel_transposes(g: Graph) -> int:
    """Sink, compose, fold and delete TRANSPOSEs until nothing changes; returns the
    number of rewrites."""
    total = 0
    changed = True
    while changed:
        changed = False
        for t in list(g.ops):
            if t not in g.ops:
                continue
            p = perm_of(g, t)
            if p is None:
                continue
            a, b = t.inputs[0], t.outputs[0]
            ashape = g.tensors[a].shape
            if len(p) != len(ashape):
                continue
            if p == list(range(len(p))):
                done = bypass(g, t, a, b)
            elif _only_moves_ones(ashape, p):
                _make_reshape(g, t, g.tensors[b].shape)
                done = True
            else:
                # a later transpose of a by p (tico writes one per reader of a map,
                # and the model's input may have several) is t's output again
                done = False
                for o in consumers(g, a):
                    if o is not t and o.inputs[0] == a and perm_of(g, o) == p and \
                            o.outputs[0] not in g.outputs and g.ops.index(o) > g.ops.index(t):
                        done = bypass(g, o, b, o.outputs[0]) or done
                cs = consumers(g, b)
                # transposes reading t read t's input by the composed perm (tico writes
                # one per reader of a map: a residual block's branch and shortcut)
                for c in cs:
                    q = perm_of(g, c)
                    if q is not None and len(q) == len(p) and c.inputs[0] == b:
                        comp = [p[i] for i in q]
                        c.inputs = [a, new_tensor(g, g.tensors[c.inputs[1]].name + '/composed',
                                                  [len(comp)], np.array(comp, np.int32))]
                        done = True
                if done and not consumers(g, b) and b not in g.outputs:
                    remove_op(g, t)
                elif not done and len(cs) == 1 and b not in g.outputs:
                    c = cs[0]
                    done = _fold_into_fc(g, t, p) or _sink_through(g, t, c, p) or \
                        _hoist_binary(g, c, p) or (not _onnx(g) and (
                            _sink_through_reshape(g, t, c, p) or _hoist_concat(g, c, p)))
                elif not done and len(cs) > 1 and not _onnx(g):
                    done = _split_readers(g, t, p)
                if not done and t in g.ops and not _onnx(g):
                    done = _hoist_over_slice(g, t, p)
            if done:
                total += 1
                changed = True
        m = _merge_reshapes(g)
        total += m
        changed = changed or bool(m)
    return total


# --------------------------------------------------------------------------- BatchNorm

def _per_channel(g: Graph, k: int, channels: int):
    """Constant k as a vector over the last axis (length channels), or None when it
    varies along another axis."""
    d = np.asarray(g.tensors[k].data, np.float64)
    if d.size == 1:
        return np.full(channels, float(d.reshape(-1)[0]))
    if d.ndim == 0 or d.shape[-1] != channels or d.size != channels:
        return None
    return d.reshape(channels)


def fold_batchnorm(g: Graph, keep=()) -> int:
    """Fold MUL/DIV/ADD/SUB by a per-channel constant into the preceding CONV_2D,
    DEPTHWISE_CONV_2D or FULLY_CONNECTED (fused NONE, output read only by that op), unless
    the layer or the MUL/ADD is in ``keep`` (ids of the trainable Operator objects, or of
    the op it trains as: an unrolled loop's steps train as its WHILE; there the affine
    stays a separate, trainable op).  Returns the number of ops folded."""
    n = 0
    changed = True
    while changed:
        changed = False
        for m in list(g.ops):
            if m.name not in ('MUL', 'DIV', 'ADD', 'SUB') or id(trains_as(m)) in keep or \
                    len(m.inputs) != 2:
                continue
            prod = [o for o in g.ops if set(o.outputs) & set(m.inputs)
                    and o.name in WEIGHT_OUT_AXIS]
            if len(prod) != 1:
                continue
            layer = prod[0]
            y = layer.outputs[0]
            kpos = 1 - m.inputs.index(y)
            k = m.inputs[kpos]
            if id(trains_as(layer)) in keep or not is_const(g, k) or y in g.outputs or \
                    len(consumers(g, y)) != 1 or m.inputs.count(y) != 1 or \
                    layer.options.get('fused_activation_function', 'NONE') != 'NONE' or \
                    (m.name in ('SUB', 'DIV') and kpos != 1) or \
                    not is_const(g, layer.inputs[1]):
                continue
            oshape = g.tensors[m.outputs[0]].shape
            if oshape != g.tensors[y].shape:
                continue
            ch = oshape[-1]
            v = _per_channel(g, k, ch)
            if v is None:
                continue
            w = g.tensors[layer.inputs[1]]
            axis = WEIGHT_OUT_AXIS[layer.name]
            if w.data.shape[axis] != ch:
                continue
            has_bias = len(layer.inputs) > 2 and layer.inputs[2] >= 0
            bias = g.tensors[layer.inputs[2]].data.astype(np.float64) if has_bias \
                else np.zeros(ch)
            if m.name in ('MUL', 'DIV'):
                s = v if m.name == 'MUL' else 1.0 / v
                shp = [1] * w.data.ndim
                shp[axis] = ch
                w.data = (w.data.astype(np.float64) * s.reshape(shp)).astype(np.float32)
                bias = bias * s
            else:
                bias = bias + (v if m.name == 'ADD' else -v)
            if has_bias:
                g.tensors[layer.inputs[2]].data = bias.astype(np.float32)
            elif m.name in ('ADD', 'SUB'):
                bi = new_tensor(g, w.name + '/bias', [ch], bias.astype(np.float32))
                layer.inputs = (layer.inputs + [-1])[:2] + [bi]
            layer.options['fused_activation_function'] = \
                m.options.get('fused_activation_function', 'NONE')
            layer.outputs[0] = m.outputs[0]
            remove_op(g, m)
            n += 1
            changed = True
    return n


# --------------------------------------------------------------------------- quantized

def _qparams(quant, ndim):
    """(scale, zero point) as float64 arrays broadcasting over a tensor of ``ndim`` dims
    (per-axis along quantized_dimension)."""
    scale = np.asarray(quant['scale'], np.float64)
    zp = np.asarray(quant.get('zero_point') or [0] * len(scale), np.float64)
    if scale.size > 1:
        shp = [1] * ndim
        shp[quant.get('quantized_dimension', 0)] = scale.size
        scale, zp = scale.reshape(shp), zp.reshape(shp)
    return scale, zp


def _dequant(data, quant):
    q = np.asarray(data, np.float64)
    scale, zp = _qparams(quant, q.ndim)
    return ((q - zp) * scale).astype(np.float32)


def quantize(data, quant, dtype):
    """float array -> integers of ``dtype`` with the tensor's scale(s) and zero point(s),
    rounded to nearest and clipped to the type's range; returns (array, n clipped)."""
    x = np.asarray(data, np.float64)
    scale, zp = _qparams(quant, x.ndim)
    q = np.round(x / scale) + zp
    info = np.iinfo(np.dtype(dtype))
    clipped = int(((q < info.min) | (q > info.max)).sum())
    return np.clip(q, info.min, info.max).astype(dtype), clipped


def dequantize(g: Graph) -> dict:
    """Quantized tensors -> float32 in place; QUANTIZE/DEQUANTIZE ops removed.  Returns
    {tensor name: (original dtype, quant params)} for re-quantizing on export."""
    origin = {}
    for t in g.tensors:
        if t.dtype == 'float16' and t.data is not None:
            t.data, t.dtype = t.data.astype(np.float32), 'float32'
            continue
        if t.dtype not in QUANT_TYPES or not t.quant or not t.quant.get('scale'):
            continue
        origin[t.name] = (t.dtype, dict(t.quant))
        if t.data is not None:
            t.data = _dequant(t.data, t.quant)
        t.dtype, t.quant = 'float32', None
    for op in list(g.ops):
        if op.name in ('QUANTIZE', 'DEQUANTIZE') and op in g.ops:
            a, b = op.inputs[0], op.outputs[0]
            if g.tensors[a].dtype == g.tensors[b].dtype == 'float32':
                if a in g.inputs and b not in g.outputs:
                    # the model's input becomes float: drop the op, readers take the input
                    for o in g.ops:
                        o.inputs = [a if k == b else k for k in o.inputs]
                    remove_op(g, op)
                else:
                    bypass(g, op, a, b)
    return origin


def hoist_input_transpose(g: Graph):
    """A TRANSPOSE reached from the model's input through elementwise ops only (tico's
    NCHW -> NHWC for an input with more than one channel, maybe after a BatchNorm's
    MUL/ADD) moves up into the input: the model then takes NHWC data.  Returns the
    permutation the data must get (x.transpose(perm), batch axis first), or None."""
    if len(g.inputs) != 1:
        return None
    x = g.inputs[0]
    chain, cur = [], x
    while True:
        cs = consumers(g, cur)
        if len(cs) != 1 or cur in g.outputs:
            return None
        c = cs[0]
        p = perm_of(g, c)
        if p is not None:
            break
        if c.name in BINARY:
            other = [k for k in c.inputs if k != cur]
            if len(other) != 1 or not is_const(g, other[0]):
                return None
        elif c.name not in UNARY:
            return None
        chain.append(c)
        cur = c.outputs[0]
    t = c
    if p[0] != 0 or t.inputs[0] != cur or t.outputs[0] in g.outputs:
        return None
    r = len(p)
    for op in chain:                  # each op now works on the transposed tensor
        for i, k in enumerate(op.inputs):
            if is_const(g, k):
                kd = np.asarray(g.tensors[k].data)
                if kd.ndim > r:
                    return None
                kd = kd.reshape([1] * (r - kd.ndim) + list(kd.shape)).transpose(p)
                op.inputs[i] = new_tensor(g, g.tensors[k].name + '/nhwc', kd.shape,
                                          np.ascontiguousarray(kd))
        o = g.tensors[op.outputs[0]]
        o.shape = [o.shape[v] for v in p]
    out = t.outputs[0]
    if chain:
        last = chain[-1].outputs[0]
        for o in g.ops:
            o.inputs = [last if k == out else k for k in o.inputs]
        g.tensors[last].name, g.tensors[out].name = g.tensors[out].name, g.tensors[last].name
        xs = g.tensors[x]
        xs.shape = [xs.shape[v] for v in p]
    else:
        g.inputs = [out]
    remove_op(g, t)
    return p


# --------------------------------------------------------------------------- whole graph

def compact(g: Graph) -> Graph:
    """Drop tensors nothing reads or writes; renumber the rest in order."""
    used = set(g.inputs) | set(g.outputs)
    for op in g.ops:
        used.update(k for k in op.inputs + op.outputs if k >= 0)
    order = sorted(used)
    new = {k: i for i, k in enumerate(order)}
    new[-1] = -1
    tensors = []
    for k in order:
        t = g.tensors[k]
        t.index = new[k]
        tensors.append(t)
    g.tensors = tensors
    for op in g.ops:
        op.inputs = [new[k] for k in op.inputs]
        op.outputs = [new[k] for k in op.outputs]
    g.inputs = [new[k] for k in g.inputs]
    g.outputs = [new[k] for k in g.outputs]
    _renumber(g)
    return g


def save_graph(g: Graph, path) -> str:
    """Write the Graph as a circle (or TFLite, after g.identifier) file."""
    from ..formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=g.identifier, description=g.description or 'utrain rewrite',
                      version=g.version or 3)
    for t in g.tensors:
        if t.data is not None:
            b.tensor(t.name, t.shape, data=t.data, dtype=t.data.dtype, quant=t.quant)
        else:
            b.tensor(t.name, t.shape, dtype=t.dtype, quant=t.quant)
    for op in g.ops:
        opts = {k: v for k, v in op.options.items() if v is not None}
        b.op(op.name, op.inputs, op.outputs, **opts)
    b.inputs(*g.inputs)
    b.outputs(*g.outputs)
    io = [natural(g, ks) for ks in (g.inputs, g.outputs)]
    if all(g.tensors[k].sig for ks in io for k in ks):      # (the file's SignatureDef)
        b.signature(*[[(g.tensors[k].sig[1], k) for k in ks] for ks in io])
    for name, blob in g.metadata.items():
        b.metadata(name, blob)
    return b.save(path)


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
        _renumber(g)
        for p in parts:
            remove_op(g, p[2])
        made += 1
    return made


# --------------------------------------------------------------------------- shapes

# ops fold_shapes computes when every input is known on the host (integer outputs only:
# shape arithmetic, never an activation or a weight)
_INT_BINARY = {'ADD': np.add, 'SUB': np.subtract, 'MUL': np.multiply,
               'FLOOR_DIV': np.floor_divide, 'MAXIMUM': np.maximum, 'MINIMUM': np.minimum}
# (Keras 3's Dense on a 3-D or 4-D input: SHAPE -> GATHER -> REDUCE_PROD -> PACK -> RESHAPE)
_INT_REDUCE = {'REDUCE_PROD': np.prod, 'SUM': np.sum, 'REDUCE_MAX': np.max,
               'REDUCE_MIN': np.min}


def _strided_slice(x, b, e, st, o):
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


def _host_value(g: Graph, op: Operator):
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
    if op.name in ('CAST', 'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS'):
        return v[0]
    if op.name == 'STRIDED_SLICE' and len(v) == 4:
        return _strided_slice(v[0], *(list(a.reshape(-1)) for a in v[1:]), o)
    if op.name in _INT_REDUCE and len(v) == 2:
        axes = tuple(int(a) % max(v[0].ndim, 1) for a in v[1].reshape(-1))
        return _INT_REDUCE[op.name](v[0], axis=axes, keepdims=bool(o.get('keep_dims')))
    if op.name in _INT_BINARY and len(v) == 2 and o.get('fused_activation_function',
                                                        'NONE') == 'NONE':
        return _INT_BINARY[op.name](v[0], v[1])
    return None


def _integer(dtype: str) -> bool:
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
    state, sized by the batch read at run time: any dtype, it is a constant).  Only ops
    with integer outputs that are not graph outputs fold; the folded ops are removed.
    Returns how many."""
    done = 0
    for op in list(g.ops):
        outs = [g.tensors[k] for k in op.outputs]
        if len(outs) != 1 or op.outputs[0] in g.outputs or not (
                op.name == 'FILL' or _integer(outs[0].dtype)):
            continue
        try:
            v = _host_value(g, op)
        except (ValueError, IndexError, TypeError):     # (left to validation to name)
            v = None
        if v is None or int(np.prod(outs[0].shape)) != v.size:
            continue
        outs[0].data = np.ascontiguousarray(v.astype(outs[0].dtype).reshape(outs[0].shape))
        # (a FILL's values, a recurrent layer's zero initial state, are no parameter:
        # Keras does not train them, and the converter's one h0 = c0 would train as both)
        outs[0].frozen = outs[0].frozen or op.name == 'FILL'
        remove_op(g, op)
        done += 1
    if done:
        _reshape_outputs(g)
    return done


def _reshape_outputs(g: Graph):
    """A RESHAPE whose new shape the host now knows gets that shape on its output: where
    the exporter could not infer it (a shape read at run time) the file may give a wrong
    one (Keras 3's UpSampling2D: [1, 1, 8, 4] for [1, 8, 8, 4]), and so may every op
    after it (the next conv's [1, 1, 6, 4] for [1, 6, 6, 4]): _propagate_shapes."""
    changed = set()
    for op in g.ops:
        if op.name != 'RESHAPE' or len(op.inputs) < 2 or not is_const(g, op.inputs[1]):
            continue
        new = _reshaped(g, op, g.tensors[op.inputs[0]].shape)
        y = g.tensors[op.outputs[0]]
        if new is not None and list(y.shape) != new and op.outputs[0] not in g.outputs:
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
        from .optable import _out_pad       # (TFLite's output size, as the float path checks it)
        pad, where = o.get('padding', 'SAME'), f'op {op.number} {op.name}'
        try:
            return [x[0], _out_pad(x[1], kh, int(o.get('stride_h', 1)), int(o.get('dilation_h_factor', 1) or 1),
                                   pad, where)[0],
                    _out_pad(x[2], kw, int(o.get('stride_w', 1)), int(o.get('dilation_w_factor', 1) or 1),
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
            return list(_strided_slice(np.broadcast_to(np.int8(0), x), begin, end, step, o).shape)
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


def _propagate_shapes(g: Graph, changed: set):
    """Each op reading a tensor whose shape changed gets its output shape again from its
    inputs (_shape_after), in execution order; graph outputs keep the file's shape (the
    loss and the data are checked against it)."""
    for op in g.ops:
        if not changed.intersection(op.inputs) or len(op.outputs) != 1 or \
                op.outputs[0] in g.outputs:
            continue
        y = g.tensors[op.outputs[0]]
        new = _shape_after(g, op)
        if new is not None and list(y.shape) != list(new) and \
                all(isinstance(d, (int, np.integer)) and d > 0 for d in new):
            y.shape = [int(d) for d in new]
            changed.add(op.outputs[0])


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
            _make_reshape(g, rs, list(g.tensors[y].shape))
            g.ops.insert(at + 1, rs)
        op.name, op.code = 'SPLIT', OP_CODES['SPLIT']
        op.inputs, op.outputs = [axis, x], parts
        op.options = {'num_splits': len(parts)}
        _renumber(g)
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
                _make_reshape(g, rs, opened)
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
            _make_reshape(g, made[0], list(g.tensors[y].shape))
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


def _slice_op(g: Graph, x: int, y: int, name: str, begin, end, strides, src,
              shrink: int = 0) -> Operator:
    """A STRIDED_SLICE of x into y, its begin / end / strides constant int32 tensors named
    name + '_begin' ... (gathers_to_slices, splits_to_slices)."""
    ins = [x] + [new_tensor(g, name + f'_{w}', [len(v)], np.int32(v))
                 for w, v in (('begin', begin), ('end', end), ('strides', strides))]
    return Operator(-1, OP_CODES['STRIDED_SLICE'], 'STRIDED_SLICE', ins, [y],
                    {'shrink_axis_mask': shrink} if shrink else {}, src=src)


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
            made.append(_slice_op(g, x, out, name + f'/take{j}', b, e, s, op.src,
                                  (1 << a) if ids.ndim == 0 else 0))
            parts.append(out)
        if len(parts) > 1:
            made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', parts, [y],
                                 {'axis': a, 'fused_activation_function': 'NONE'}, src=op.src))
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
            made.append(_slice_op(g, x, y, g.tensors[y].name + '/piece', b, e, [1] * len(X),
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
            _make_reshape(g, r1, opened)
            grown = list(opened)
            grown[a + 1] = k
            t2 = new_tensor(g, g.tensors[y].name + f'/copies{a}', grown, like=x)
            cat = Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', [t1] * k, [t2],
                           {'axis': a + 1, 'fused_activation_function': 'NONE'}, src=op.src)
            shape = list(shape)
            shape[a] *= k
            t3 = new_tensor(g, g.tensors[y].name + f'/merged{a}', shape, like=x)
            r2 = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [t2], [t3], {}, src=op.src)
            _make_reshape(g, r2, shape)
            made += [r1, cat, r2]
            x = t3
        if not made:
            made = [Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [x], [y], {}, src=op.src)]
            _make_reshape(g, made[0], list(g.tensors[y].shape))
        else:
            made[-1].outputs = [y]      # (its own tensor goes: compact)
        replace_op(g, op, made)
        done += 1
    return done


def _spell(g: Graph, op: Operator, steps, own=-1) -> None:
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


def _own(g: Graph, k: int) -> int:
    """k, or a copy of it when it is a constant (a rewrite reading it twice would
    otherwise train one parameter from two ops)."""
    if not is_const(g, k):
        return k
    t = g.tensors[k]
    return new_tensor(g, t.name + '/copy', t.shape, np.array(t.data), dtype=t.dtype)


_NONE = {'fused_activation_function': 'NONE'}


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


def _producer(g: Graph, k: int):
    return next((o for o in g.ops if k in o.outputs), None)


def _only_reader(g: Graph, k: int, op: Operator) -> bool:
    return k not in g.outputs and consumers(g, k) == [op]


def _wrapped_index(g: Graph, k: int, n: int):
    """c where tensor k is SELECT_V2(LESS(c, 0), ADD(c, n), c): Keras 3's Embedding
    reading a negative id from the table's end (its n rows), else None."""
    sel = _producer(g, k)
    if sel is None or sel.name != 'SELECT_V2' or len(sel.inputs) != 3:
        return None
    m, a, c = sel.inputs
    less, add = _producer(g, m), _producer(g, a)
    if less is None or add is None or less.name != 'LESS' or add.name != 'ADD' \
            or less.inputs[0] != c or const_ints(g, less.inputs[1]) != [0] \
            or add.inputs[0] != c or const_ints(g, add.inputs[1]) != [n] \
            or not _only_reader(g, m, sel) or not _only_reader(g, a, sel):
        return None
    return c


def _tables(g: Graph):
    """The GATHERs of a constant 2-D table's rows (axis 0): embeddings."""
    return [op for op in g.ops if op.name == 'GATHER' and not int(op.options.get('axis', 0))
            and not op.options.get('batch_dims') and is_const(g, op.inputs[0])
            and len(g.tensors[op.inputs[0]].shape) == 2]


def unwrap_ids(g: Graph, keep=True) -> int:
    """Keras 3's Embedding reads a negative id from the table's end: SELECT_V2(LESS(i, 0),
    ADD(i, N), i) before its GATHER.  The GATHER reads i itself, and (keep) the ADD's
    constant N as a third input, which says so (circle's GATHER has no such option;
    optable reads it); without keep a negative id is out of range, as TFLite's GATHER
    alone has it (evaluate's runtimes have no int32 SELECT_V2).  Returns how many."""
    done = 0
    for op in _tables(g):
        sel = _producer(g, op.inputs[1])
        c = _wrapped_index(g, op.inputs[1], g.tensors[op.inputs[0]].shape[0])
        if c is None or not _only_reader(g, op.inputs[1], op):
            continue
        less, add = _producer(g, sel.inputs[0]), _producer(g, sel.inputs[1])
        op.inputs[1:] = [c] + [add.inputs[1]] * keep
        for o in (sel, less, add):
            remove_op(g, o)
        done += 1
    return done


def embedding_gathers(g: Graph) -> int:
    """A GATHER of a constant float table's rows (axis 0) by ids from the model's input
    (an embedding) reads the input itself: Keras 3's negative-id SELECT_V2 goes
    (unwrap_ids), then Keras's CAST of the float input to int32; an int32 or int64 model
    input read only as ids becomes float32 here (the data are floats holding the ids:
    the device checks they are integers).  No tensor is made, so the file's numbering
    holds and the pass alone leaves no rewritten graph to export: the trained table goes
    into the file as it is (rewrite() does not count it as a change).  Returns how many."""
    done = unwrap_ids(g)
    for op in _tables(g):
        k = op.inputs[1]
        cast = _producer(g, k)
        if cast is not None and cast.name == 'CAST' and _only_reader(g, k, op) \
                and g.tensors[cast.inputs[0]].dtype == 'float32':
            op.inputs[1] = cast.inputs[0]
            remove_op(g, cast)
            done += 1
        k = op.inputs[1]
        if k in g.inputs and g.tensors[k].dtype in ('int32', 'int64') and all(
                r.name == 'GATHER' and r.inputs.index(k) == 1 for r in consumers(g, k)):
            g.tensors[k].dtype = 'float32'
            done += 1
    return done


def embedding_ids_back(g: Graph, int_inputs=None) -> int:
    """For export of a rewritten graph: each GATHER that embedding_gathers made read float
    ids reads int32 ones again, as the file had them: the model input's own type where
    int_inputs {input name: dtype} says it was an integer, else a CAST of the float
    input; a third input N (Keras 3's negative ids) becomes SELECT_V2(LESS(i, 0),
    ADD(i, N), i) again.  Returns how many."""
    done = 0
    for op in _tables(g):
        k = op.inputs[1]
        if g.tensors[k].dtype != 'float32':
            continue
        name, shape, made = g.tensors[k].name, g.tensors[k].shape, []

        def step(op_name, ins, dtype='int32', **opts):
            out = new_tensor(g, f'{name}/{op_name.lower()}', shape, dtype=dtype)
            made.append(Operator(-1, OP_CODES[op_name], op_name, ins, [out], opts, src=op.src))
            return out
        if k in g.inputs and (int_inputs or {}).get(name) in ('int32', 'int64'):
            g.tensors[k].dtype = int_inputs[name]
            i = k
        else:
            i = step('CAST', [k])
        if len(op.inputs) > 2:
            zero = new_tensor(g, f'{name}/zero', [], np.array(0, np.int32))
            i = step('SELECT_V2', [step('LESS', [i, zero], 'bool'),
                                   step('ADD', [i, op.inputs[2]], fused_activation_function='NONE'),
                                   i])
        op.inputs = op.inputs[:1] + [i]
        replace_op(g, op, made + [op])
        done += 1
    return done


def id_masks(g: Graph) -> int:
    """Keras's Embedding(mask_zero=True): NOT_EQUAL(ids, c) -> a bool mask that Keras
    CASTs to float (the pooling's count) and SELECT_V2(mask, rows, 0)s the gathered rows
    with.  For integer ids (the embedding's, floats here) the mask is min(|ids - c|, 1):
    d = ids - c, a = 2 RELU(d) - d, a - RELU(a - 1), float 0 / 1; its CASTs go, and a
    SELECT_V2 of it against zeros is a MUL by it (the rows' gradient times the mask, the
    select's).  Only where every reader of the mask (through EXPAND_DIMS / RESHAPE) is
    one of those.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'NOT_EQUAL' or len(op.inputs) != 2 or g.tensors[op.inputs[0]].dtype != 'float32':
            continue
        x, c = op.inputs
        cv = const_ints(g, c)
        if cv is None or len(cv) != 1 or is_const(g, x):
            continue
        bools, readers, todo = [op.outputs[0]], [], [op.outputs[0]]
        while todo:
            for r in consumers(g, todo.pop()):
                if r.name in ('EXPAND_DIMS', 'RESHAPE') and r.inputs[0] in bools:
                    bools.append(r.outputs[0])
                    todo.append(r.outputs[0])
                readers.append(r)
        ok = all(r.name in ('EXPAND_DIMS', 'RESHAPE') or
                 r.name == 'CAST' and g.tensors[r.outputs[0]].dtype == 'float32' or
                 r.name == 'SELECT_V2' and r.inputs[0] in bools and r.inputs[1] not in bools
                 and is_const(g, r.inputs[2]) and not np.any(g.tensors[r.inputs[2]].data)
                 for r in readers)
        if not ok or any(k in g.outputs for k in bools):
            continue
        for k in bools:
            g.tensors[k].dtype = 'float32'
        name = g.tensors[op.outputs[0]].name
        one = new_tensor(g, name + '/one', [], np.array(1.0, np.float32))
        two = new_tensor(g, name + '/two', [], np.array(2.0, np.float32))
        steps = [('SUB', [x, new_tensor(g, name + '/c', [], np.array(float(cv[0]), np.float32))],
                  _NONE, None)] if cv[0] else []
        d = 'prev' if steps else x
        steps += [('RELU', [d], {}, None), ('MUL', ['prev', two], _NONE, None),
                  ('SUB', ['prev', d if d == x else f'@{0}'], _NONE, None),
                  ('SUB', ['prev', one], _NONE, None), ('RELU', ['prev'], {}, None),
                  ('SUB', [f'@{len(steps) + 2}', 'prev'], _NONE, None)]
        _spell(g, op, steps)
        for r in readers:
            if r.name == 'CAST':
                bypass(g, r, r.inputs[0], r.outputs[0])
            elif r.name == 'SELECT_V2':
                r.name, r.code = 'MUL', OP_CODES['MUL']
                r.inputs, r.options = [r.inputs[1], r.inputs[0]], dict(_NONE)
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
            m = _producer(g, x)
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

        def step(op_name, ins, out=None, opts=_NONE):
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


def _added_bias(g: Graph, add: Operator, y: int, n: int):
    """The float constant [n] (or [1, .., n]) that ADD op `add` adds to tensor y, read by
    that ADD alone, reshaped to [n] (a layer's bias: fc_bias_adds, conv_bias_adds), or
    None."""
    b = [k for k in add.inputs if k != y]
    if len(b) != 1 or not is_const(g, b[0]) or len(consumers(g, b[0])) != 1 or \
            int(np.prod(g.tensors[b[0]].shape)) != n or \
            int(g.tensors[b[0]].shape[-1]) != n or g.tensors[b[0]].dtype != 'float32':
        return None
    t = g.tensors[b[0]]
    t.data, t.shape = np.asarray(t.data, np.float32).reshape(n), [n]
    return b[0]


def fc_bias_adds(g: Graph) -> int:
    """A FULLY_CONNECTED without a bias -> RESHAPE -> ADD of a constant [N] (or [1, .., N])
    over its N outputs (Keras 3's Dense on a 3-D input: the bias is added after the
    reshape back to [1, T, N]) -> the FC with that constant as its bias (and the ADD's
    fused activation), then the RESHAPE: the same values; the bias trains as the FC's,
    and the int8 path (`--int8`) calibrates it as one (it had refused the model: 'constant
    ... is not the weight or bias of a FULLY_CONNECTED').  Float only.  Returns how many."""
    done = 0
    for fc in list(g.ops):
        if fc.name != 'FULLY_CONNECTED' or (len(fc.inputs) > 2 and fc.inputs[2] >= 0) or \
                g.tensors[fc.outputs[0]].dtype != 'float32' or \
                fc.options.get('fused_activation_function', 'NONE') != 'NONE':
            continue
        rs = consumers(g, fc.outputs[0])
        if len(rs) != 1 or rs[0].name != 'RESHAPE' or fc.outputs[0] in g.outputs:
            continue
        adds = consumers(g, rs[0].outputs[0])
        if len(adds) != 1 or adds[0].name != 'ADD' or rs[0].outputs[0] in g.outputs:
            continue
        add = adds[0]
        b = _added_bias(g, add, rs[0].outputs[0], int(g.tensors[fc.outputs[0]].shape[-1]))
        if b is None:
            continue
        fc.inputs = fc.inputs[:2] + [b]
        fc.options['fused_activation_function'] = add.options.get('fused_activation_function', 'NONE')
        rs[0].outputs = list(add.outputs)
        remove_op(g, add)
        done += 1
    return done


def conv_bias_adds(g: Graph, keep=()) -> int:
    """A CONV_2D / DEPTHWISE_CONV_2D with an all-zero float bias -> [RESHAPEs keeping the
    channel axis last] -> ADD of a constant [C] (or [1, .., C]) over its C channels ->
    the convolution with that constant as its bias (and the ADD's fused activation), then
    the RESHAPEs: the same values.  TFLite's converter writes a dilated Conv1D/Conv2D
    (Keras's causal TCN layers) so: a zero bias inside SPACE_TO_BATCH_ND ..
    BATCH_TO_SPACE_ND and the Keras bias in an ADD after it; both trained, the layer
    had a bias too many (Keras's parameter count, and the zero one, shared by the
    layers, copied per layer).  Runs after `dilated_convs`.  Not an ADD in ``keep`` (ids of
    the trainable Operator objects) whose convolution is not: a BatchNorm's shift that
    trains without its layer, as fold_batchnorm keeps it (folded, it vanished and its
    configuration trained the classifier alone); with the convolution it trains as its
    bias.  Float only.  Returns how many."""
    done = 0
    for conv in list(g.ops):
        if conv.name not in ('CONV_2D', 'DEPTHWISE_CONV_2D') or len(conv.inputs) < 3 or \
                not is_const(g, conv.inputs[2]) or \
                g.tensors[conv.outputs[0]].dtype != 'float32' or \
                conv.options.get('fused_activation_function', 'NONE') != 'NONE' or \
                np.any(np.asarray(g.tensors[conv.inputs[2]].data) != 0):
            continue
        n = int(g.tensors[conv.outputs[0]].shape[-1])
        chain, y = [], conv.outputs[0]
        while True:
            cs = consumers(g, y)
            if len(cs) != 1 or y in g.outputs or cs[0].name != 'RESHAPE' or \
                    int(g.tensors[cs[0].outputs[0]].shape[-1]) != n:
                break
            chain.append(cs[0])
            y = cs[0].outputs[0]
        cs = consumers(g, y)
        if len(cs) != 1 or y in g.outputs or cs[0].name != 'ADD':
            continue
        add = cs[0]
        b = None if id(add) in keep and id(conv) not in keep else _added_bias(g, add, y, n)
        if b is None:
            continue
        conv.inputs = conv.inputs[:2] + [b] + conv.inputs[3:]
        conv.options['fused_activation_function'] = add.options.get('fused_activation_function', 'NONE')
        last = chain[-1] if chain else conv
        last.outputs = list(add.outputs)
        remove_op(g, add)
        done += 1
    return done


def separable_biases(g: Graph) -> int:
    """A DEPTHWISE_CONV_2D with an all-zero float bias and no activation whose one reader
    is a 1x1 stride-1 CONV_2D (Keras's SeparableConv1D/2D as TFLite's converter writes
    it: the depthwise step has no bias in Keras, the converter gives it a zero one) keeps
    that bias frozen (Tensor.frozen): the pointwise conv's bias already shifts every
    output the depthwise bias could (W b), so training both trained a parameter Keras
    has not (its count: 8 more for a SeparableConv2D on 8 channels).  Float only.
    Returns how many."""
    done = 0
    for dw in g.ops:
        if dw.name != 'DEPTHWISE_CONV_2D' or len(dw.inputs) < 3 or dw.inputs[2] < 0 or \
                not is_const(g, dw.inputs[2]) or g.tensors[dw.inputs[2]].frozen or \
                g.tensors[dw.outputs[0]].dtype != 'float32' or \
                dw.options.get('fused_activation_function', 'NONE') != 'NONE' or \
                np.any(np.asarray(g.tensors[dw.inputs[2]].data) != 0) or dw.outputs[0] in g.outputs:
            continue
        cs = consumers(g, dw.outputs[0])
        if len(cs) != 1 or cs[0].name != 'CONV_2D' or cs[0].inputs[0] != dw.outputs[0] or \
                list(g.tensors[cs[0].inputs[1]].shape[1:3]) != [1, 1] or \
                cs[0].options.get('stride_h', 1) != 1 or cs[0].options.get('stride_w', 1) != 1 or \
                len(cs[0].inputs) < 3 or cs[0].inputs[2] < 0:
            continue
        g.tensors[dw.inputs[2]].frozen = True
        done += 1
    return done


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
    over them; POW(x, 2) -> MUL(x, x), POW(x, 0.5) -> SQRT(x) (tf.pow, x ** 2 of a
    PyTorch export; other exponents stay POW, which neither path runs).  Float tensors
    only.  Returns how many."""
    done = 0
    one = ('NEG', 'L2_NORMALIZATION', 'SQUARE', 'ABS')
    for op in list(g.ops):
        if op.name == 'POW' and len(op.inputs) == 2 and is_const(g, op.inputs[1]) and \
                not is_const(g, op.inputs[0]) and g.tensors[op.inputs[1]].data.size == 1 and \
                float(g.tensors[op.inputs[1]].data.reshape(-1)[0]) in (2.0, 0.5) and \
                np.dtype(g.tensors[op.outputs[0]].dtype).kind == 'f':
            sq = float(g.tensors[op.inputs[1]].data.reshape(-1)[0]) == 2.0
            op.name = 'MUL' if sq else 'SQRT'
            op.code, op.options = OP_CODES[op.name], dict(_NONE) if sq else {}
            op.inputs = [op.inputs[0]] * 2 if sq else [op.inputs[0]]
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
            op.options = dict(_NONE)
            _renumber(g)
        elif op.name == 'SQUARE':
            op.name, op.code, op.inputs = 'MUL', OP_CODES['MUL'], [op.inputs[0]] * 2
            op.options = dict(_NONE)
        elif op.name == 'ABS':
            two = new_tensor(g, g.tensors[y].name + '/two', [], np.array(2.0, np.float32))
            x = op.inputs[0]
            _spell(g, op, [('RELU', [x], {}, None), ('MUL', ['prev', two], _NONE, None),
                           ('SUB', ['prev', x], _NONE, None)])
        elif op.name == 'SUM':
            x, ax = op.inputs
            shape = g.tensors[x].shape
            n = int(np.prod([shape[a % len(shape)] for a in set(const_ints(g, ax))]))
            nt = new_tensor(g, g.tensors[y].name + '/n', [], np.array(float(n), np.float32))
            _spell(g, op, [('MEAN', [x, ax], {'keep_dims': bool(op.options.get('keep_dims'))},
                            list(g.tensors[y].shape)), ('MUL', ['prev', nt], _NONE, None)])
        elif op.name == 'SQUARED_DIFFERENCE':
            _spell(g, op, [('SUB', op.inputs, _NONE, None), ('MUL', ['prev', 'prev'], _NONE, None)])
        elif op.name in ('MAXIMUM', 'MINIMUM'):
            a, b = op.inputs
            c = _own(g, b) if op.name == 'MAXIMUM' else _own(g, a)
            for k in (a, b, c):     # a clip's bound (tf.clip_by_value, torch.clamp): not a
                if is_const(g, k):  # parameter, and its two copies would drift apart
                    g.tensors[k].frozen = True
            last = ('ADD', [c, 'prev'], _NONE) if op.name == 'MAXIMUM' else ('SUB', [c, 'prev'], _NONE)
            _spell(g, op, [('SUB', [a, b], _NONE, None), ('RELU', ['prev'], {}, None),
                           last + (None,)], own=0)
        elif op.name == 'PRELU':
            x, alpha = op.inputs
            _spell(g, op, [('RELU', [x], {}, None), ('SUB', [x, 'prev'], _NONE, None),
                           ('MUL', ['prev', alpha], _NONE, None),
                           ('ADD', ['@0', 'prev'], _NONE, None)], own=2)
        else:
            x = op.inputs[0]
            shape = list(g.tensors[x].shape)
            axis = new_tensor(g, g.tensors[y].name + '/axis', [1], np.array([len(shape) - 1], np.int32))
            n = new_tensor(g, g.tensors[y].name + '/n', [], np.array(float(shape[-1]), np.float32))
            eps = new_tensor(g, g.tensors[y].name + '/eps', [], np.array(1e-12, np.float32))
            row = shape[:-1] + [1]
            _spell(g, op, [('MUL', [x, x], _NONE, None), ('MEAN', ['prev', axis], {'keep_dims': True}, row),
                           ('MUL', ['prev', n], _NONE, row), ('ADD', ['prev', eps], _NONE, row),
                           ('RSQRT', ['prev'], {}, row), ('MUL', [x, 'prev'], _NONE, None)])
        done += 1
    return done


def reduce_max_to_pool(g: Graph) -> int:
    """REDUCE_MAX over one run of axes with nothing but size-1 axes before it (a global
    max pool: Keras's GlobalMaxPooling1D/2D) -> MAX_POOL_2D with the reduced axes as its
    window (the max and its gradient to the maximum are the same), with a RESHAPE to
    [1, reduced, 1, rest] before it and one to the output's shape after it unless the
    input is NHWC with H and W reduced.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'REDUCE_MAX' or len(op.inputs) < 2 or not is_const(g, op.inputs[1]):
            continue
        x, y = op.inputs[0], op.outputs[0]
        shape = list(g.tensors[x].shape)
        axes = {a % len(shape) for a in const_ints(g, op.inputs[1])}
        keep = [i for i, n in enumerate(shape) if n != 1]
        red = [i for i in keep if i in axes]
        if not red or keep[:len(red)] != red:
            continue            # the reduced axes are not one run after size-1 axes
        R = int(np.prod([shape[i] for i in red]))
        C = int(np.prod([shape[i] for i in keep[len(red):]]))
        direct = len(shape) == 4 and axes == {1, 2}
        kh, kw = (shape[1], shape[2]) if direct else (R, 1)
        at = op
        if not direct:
            x4 = new_tensor(g, g.tensors[x].name + '/as_nhwc', [1, R, 1, C], like=x)
            rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [x], [x4], {}, src=op.src)
            _make_reshape(g, rs, [1, R, 1, C])
            g.ops.insert(g.ops.index(op), rs)
            x = x4
        p = new_tensor(g, g.tensors[y].name + '/pooled', [1, 1, 1, C], like=y) if not direct or \
            list(g.tensors[y].shape) != [1, 1, 1, C] else y
        op.name, op.code = 'MAX_POOL_2D', OP_CODES['MAX_POOL_2D']
        op.inputs, op.outputs = [x], [p]
        op.options = {'padding': 'VALID', 'stride_w': 1, 'stride_h': 1, 'filter_width': kw,
                      'filter_height': kh, 'fused_activation_function': 'NONE'}
        if p != y:
            rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [p], [y], {}, src=op.src)
            _make_reshape(g, rs, list(g.tensors[y].shape))
            g.ops.insert(g.ops.index(at) + 1, rs)
        _renumber(g)
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
            _make_reshape(g, rs, cin)
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
            _make_reshape(g, rs, list(g.tensors[y].shape))
            g.ops.insert(g.ops.index(conv) + 1, rs)
        else:
            conv.outputs[0] = y
        _renumber(g)
        done += 1
    return done


def _quant_part(q, lo, hi, axis=None):
    """Quantization q of channels lo..hi of a tensor quantized per channel (per tensor:
    the same); axis: the slice's quantized_dimension when it moves."""
    if not q:
        return None
    q = dict(q)
    n = len(q.get('scale') or [])
    if n > 1:
        q['scale'] = list(q['scale'][lo:hi])
        q['zero_point'] = list((q.get('zero_point') or [0] * n)[lo:hi])
    if axis is not None:
        q['quantized_dimension'] = axis
    return q


def _quant_joined(qs, counts):
    """The quantization of parts qs (_quant_part's, of counts[j] channels each) put back
    together: per channel where the parts' scales differ (a per-tensor scale each part
    grew on its own in int8 training)."""
    if not qs[0]:
        return None
    q = dict(qs[0])
    if all(p == q for p in qs) and len(q.get('scale') or []) <= 1:
        return q

    def each(p, n, key, v):         # per channel: a per-tensor value n times
        a = list(p.get(key) or [v])
        return a * n if len(a) == 1 else a
    q['scale'] = [s for p, n in zip(qs, counts) for s in each(p, n, 'scale', 1.0)]
    q['zero_point'] = [z for p, n in zip(qs, counts) for z in each(p, n, 'zero_point', 0)]
    return q


# names of the tensors split_groups makes (join_groups finds its work by them)
_GROUP, _AS_DW = '/group{}of{}', '/groups{}'
# the CONV_2D options a DEPTHWISE_CONV_2D has too
_DW_OPTIONS = ('padding', 'stride_h', 'stride_w', 'dilation_h_factor', 'dilation_w_factor',
               'fused_activation_function')


def _grouped(g: Graph, op: Operator):
    """(groups, output channels per group) of a grouped CONV_2D (Keras's Conv2D(groups=G),
    ONNX's Conv with 1 < group: a weight [O, kh, kw, I/G] on an input of I channels), or
    None for an ordinary one or one that fits no grouping."""
    if op.name != 'CONV_2D' or len(op.inputs) < 2 or not is_const(g, op.inputs[1]):
        return None
    xs, ws = g.tensors[op.inputs[0]].shape, g.tensors[op.inputs[1]].shape
    if len(xs) != 4 or len(ws) != 4 or ws[3] < 1 or ws[3] == xs[3] or xs[3] % ws[3]:
        return None
    G = xs[3] // ws[3]
    return (G, ws[0] // G) if ws[0] % G == 0 else None


def split_groups(g: Graph) -> int:
    """A grouped CONV_2D (G groups, _grouped; TFLite runs them since 2.9) -> SPLIT of its
    input into G channel groups, a CONV_2D per group with its output channels' rows of
    the weight and of the bias, and a CONCATENATION of their outputs (the kernels the
    device has); with one input channel per group (G = I) a DEPTHWISE_CONV_2D with
    depth multiplier O/I instead (the same sums: output channel o reads input o // M).
    int8 too: the parts keep the scales (a per-channel weight's and bias's scales sliced
    with them), the group outputs the output's.  The convolutions of one op train
    together: op itself is group 0's, the others name it (Operator.trains_with; ops keep
    the file's number).  join_groups puts them back for export.  Returns how many."""
    done = 0
    for op in list(g.ops):
        gr = _grouped(g, op)
        if gr is None:
            continue
        G, n = gr
        op.src = op.number          # (the file's, for the ops made of it too)
        x, y = op.inputs[0], op.outputs[0]
        w = g.tensors[op.inputs[1]]
        b = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] >= 0 else -1
        if w.shape[3] == 1:
            dw = new_tensor(g, w.name + _AS_DW.format(G), [1] + w.shape[1:3] + [w.shape[0]],
                            np.ascontiguousarray(np.asarray(w.data).transpose(3, 1, 2, 0)),
                            dtype=w.dtype)
            g.tensors[dw].quant = _quant_part(w.quant, 0, w.shape[0], axis=3)
            op.name, op.code = 'DEPTHWISE_CONV_2D', OP_CODES['DEPTHWISE_CONV_2D']
            op.inputs = [x, dw, b]
            op.options = dict({k: v for k, v in op.options.items() if k in _DW_OPTIONS},
                              depth_multiplier=n)
            done += 1
            continue
        xs = g.tensors[x].shape
        parts = [new_tensor(g, g.tensors[x].name + _GROUP.format(j, G), xs[:3] + [xs[3] // G],
                            like=x) for j in range(G)]
        axis = new_tensor(g, g.tensors[x].name + '/group_axis', [], np.array(3, np.int32))
        made = [Operator(-1, OP_CODES['SPLIT'], 'SPLIT', [axis, x], parts, {'num_splits': G},
                         src=op.src)]
        outs = []
        for j in range(G):
            lo, hi = j * n, (j + 1) * n
            wj = new_tensor(g, w.name + _GROUP.format(j, G), [n] + w.shape[1:],
                            np.array(w.data[lo:hi]), dtype=w.dtype)
            g.tensors[wj].quant = _quant_part(w.quant, lo, hi)
            bj = -1
            if b >= 0:
                bt = g.tensors[b]
                bj = new_tensor(g, bt.name + _GROUP.format(j, G), [n],
                                np.array(np.asarray(bt.data).reshape(-1)[lo:hi]), dtype=bt.dtype)
                g.tensors[bj].quant = _quant_part(bt.quant, lo, hi)
            yj = new_tensor(g, g.tensors[y].name + _GROUP.format(j, G),
                            g.tensors[y].shape[:3] + [n], like=y)
            outs.append(yj)
            c = op if j == 0 else Operator(-1, OP_CODES['CONV_2D'], 'CONV_2D', [], [],
                                           dict(op.options), src=op.src)
            c.inputs, c.outputs = [parts[j], wj, bj], [yj]
            if j:
                c.trains_with = op
            made.append(c)
        made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', outs, [y],
                             {'axis': 3, 'fused_activation_function': 'NONE'}, src=op.src))
        replace_op(g, op, made)
        done += 1
    return done


def trains_as(op: Operator) -> Operator:
    """The op whose selection (--train, --ranks: by identity) op follows: the op a rewrite
    made it from where it carries a part of that op's weights (split_groups), else op."""
    return getattr(op, 'trains_with', op)


def _group_name(name: str, j: int, G: int):
    """name without split_groups' mark of part j of G (at its end, or before a name part
    a later pass added: the int8 path's '/zero_bias'), or None."""
    tail = _GROUP.format(j, G)
    i = name.rfind(tail)
    if i < 0 or name[i + len(tail):i + len(tail) + 1] not in ('', '/'):
        return None
    return name[:i] + name[i + len(tail):]


def join_groups(g: Graph, weights=None):
    """split_groups undone in g (for export: the file the user gave back with its grouped
    CONV_2D): a SPLIT -> per-group CONV_2Ds -> CONCATENATION it made (its tensor names)
    becomes one CONV_2D again whose weight (and bias) are the groups' rows in order,
    under the names the file had, and a DEPTHWISE_CONV_2D it made a CONV_2D of
    [O, kh, kw, 1].  weights {tensor index: trained array} of g: returned with the
    parts' arrays replaced by the joined tensors' (g keeps the values it had: a caller
    compares them with the file's).  int8: only where every group's output has the
    output's scale (else the split form stays: it computes the same).  Dead tensors
    stay (compact drops them).  Returns (weights, how many ops were joined)."""
    w, done = dict(weights or {}), 0

    def joined(ks, name, axis):
        ts = [g.tensors[k] for k in ks]
        data = np.concatenate([np.asarray(t.data).reshape(t.shape) for t in ts], axis)
        k = new_tensor(g, name, data.shape, data, dtype=ts[0].dtype)
        g.tensors[k].quant = _quant_joined([t.quant for t in ts], [t.shape[axis] for t in ts])
        if any(i in w for i in ks):
            w[k] = np.concatenate([np.asarray(w.get(i, g.tensors[i].data)).reshape(
                g.tensors[i].shape) for i in ks], axis)
            for i in ks:
                w.pop(i, None)
        return k

    for op in list(g.ops):
        if op.name == 'DEPTHWISE_CONV_2D' and len(op.inputs) > 1:
            wt = g.tensors[op.inputs[1]]
            G = g.tensors[op.inputs[0]].shape[-1]
            if not wt.name.endswith(_AS_DW.format(G)) or len(wt.shape) != 4:
                continue
            k = new_tensor(g, wt.name[:-len(_AS_DW.format(G))], [wt.shape[3]] + wt.shape[1:3] + [1],
                           np.ascontiguousarray(np.asarray(wt.data).transpose(3, 1, 2, 0)),
                           dtype=wt.dtype)
            g.tensors[k].quant = _quant_part(wt.quant, 0, wt.shape[3], axis=0)
            if op.inputs[1] in w:
                w[k] = np.ascontiguousarray(np.asarray(w.pop(op.inputs[1])).reshape(
                    wt.shape).transpose(3, 1, 2, 0))
            op.name, op.code = 'CONV_2D', OP_CODES['CONV_2D']
            op.inputs = [op.inputs[0], k] + op.inputs[2:]
            op.options = {a: v for a, v in op.options.items() if a != 'depth_multiplier'}
            done += 1
            continue
        if op.name != 'SPLIT' or op not in g.ops or len(op.inputs) != 2:
            continue
        G, parts = len(op.outputs), op.outputs
        convs = [consumers(g, k) for k in parts]
        if G < 2 or any(len(c) != 1 or c[0].name != 'CONV_2D' or c[0].inputs[0] != k
                        or k in g.outputs for c, k in zip(convs, parts)):
            continue
        convs = [c[0] for c in convs]
        wname = [_group_name(g.tensors[c.inputs[1]].name, j, G) for j, c in enumerate(convs)]
        cat = consumers(g, convs[0].outputs[0])
        if wname[0] is None or len(set(wname)) != 1 or len(cat) != 1 or \
                cat[0].name != 'CONCATENATION' or \
                cat[0].inputs != [c.outputs[0] for c in convs] or \
                any(c.options != convs[0].options for c in convs):
            continue
        cat, y = cat[0], cat[0].outputs[0]
        if any(g.tensors[c.outputs[0]].quant != g.tensors[y].quant for c in convs):
            continue                    # (int8: a group's output scale moved in training)
        biased = [len(c.inputs) > 2 and c.inputs[2] >= 0 for c in convs]
        bname = [_group_name(g.tensors[c.inputs[2]].name, j, G) if biased[j] else None
                 for j, c in enumerate(convs)]
        if any(biased) and (not all(biased) or len(set(bname)) != 1 or bname[0] is None):
            continue
        wk = joined([c.inputs[1] for c in convs], wname[0], 0)
        bk = joined([c.inputs[2] for c in convs], bname[0], 0) if biased[0] else -1
        c0 = convs[0]
        c0.inputs, c0.outputs = [op.inputs[1], wk, bk], [y]
        for o in [op, cat] + convs[1:]:
            g.ops.remove(o)
        _renumber(g)
        done += 1
    return w, done


# ops f with f(s x) = s f(x) for s > 0 (one data input; fused activation none or RELU):
# an input scale passes through them unchanged (scale_input)
HOMOGENEOUS = {'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS', 'TRANSPOSE', 'STRIDED_SLICE', 'SLICE',
               'SPLIT', 'SPLIT_V', 'MAX_POOL_2D', 'AVERAGE_POOL_2D', 'MEAN', 'RELU', 'PAD'}
_SCALED = '/utrain_scaled'      # the name scale_input gives the scaled input (and export finds)


def _scaled_reach(g: Graph, x: int, dtype=np.float32):
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
    ends = _scaled_reach(g, x)
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
    _renumber(g)
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
        for e in _scaled_reach(g, y) or ():
            k, t = e.inputs[1], g.tensors[e.inputs[1]]
            t.data = (np.asarray(t.data, np.float32) * s).astype(np.float32)
            if k in w:
                w[k] = (np.asarray(w[k], np.float32).reshape(t.shape) * s).astype(np.float32)
        for o in g.ops:
            o.inputs = [x if k == y else k for k in o.inputs]
        remove_op(g, op)
        first = first or float(s)


# ------------------------------------------------------- several inputs, several outputs

def input_key(name: str) -> str:
    """The data file's array name for a model input named name: TFLite's
    'serving_default_' prefix and ':0' suffix dropped (Keras's Input(name='meta') is
    'serving_default_meta:0' in the .tflite file: 'meta'), tico's 'tico::' namespace
    too (forward(self, img, vec): 'tico::img' is 'img')."""
    import re
    n = re.sub(r':\d+$', '', str(name)).rsplit('::', 1)[-1]
    return n[len('serving_default_'):] if n.startswith('serving_default_') else n


def io_name(g: Graph, k: int) -> str:
    """A graph input's or output's name as its maker knows it: the SignatureDef's (Keras's
    Input name, 'output_0' for its first output), else input_key of the tensor's."""
    t = g.tensors[k]
    return t.sig[1] if t.sig else input_key(t.name)


def natural(g: Graph, ks) -> list:
    """Graph inputs or outputs ks in their maker's order: the SignatureDef's when it names
    each (a Keras model's: the converter may list them otherwise), else as given."""
    ks = list(ks)
    if ks and all(g.tensors[k].sig for k in ks):
        return sorted(ks, key=lambda k: g.tensors[k].sig[0])
    return ks


def _fits(n: int, y) -> bool:
    """Whether targets y (one row a sample) suit an output of n values: class labels
    0..C-1 a classifier of C or more, a vector of n values an output of n."""
    y = np.asarray(y)
    if y.ndim == 0 or not len(y):
        return False
    y = y.reshape(len(y), -1)
    if y.shape[1] > 1:
        return y.shape[1] == n
    v = y[:, 0].astype(np.float64)
    if np.all(v == np.round(v)) and v.min() >= 0:       # labels (0/1: bce's too)
        return (n == 1 and v.max() <= 1) or (n > 1 and n > v.max())
    return n == 1


def choose_output(g: Graph, which=None, y=None):
    """The output the loss reads, of a model with several, goes first in g.outputs (where
    every pass reads it); g.output_at is its place in the file's outputs (prune_outputs
    leaves the others out of the graph that trains, export keeps them).  which: its
    place in natural order, or its name (io_name's, or the tensor's); None: the first in
    natural order whose size suits the data's targets y (every output's when y is None
    or none does).  Returns a line saying which output trains and how to choose
    another, or None for a model with one output."""
    outs, order = list(g.outputs), natural(g, g.outputs)
    desc = lambda j: f'{j} {io_name(g, order[j])!r} {list(g.tensors[order[j]].shape)}'  # noqa: E731
    how = ''
    if which is None or which == '':
        fit = [j for j, k in enumerate(order)
               if y is not None and _fits(int(np.prod(g.tensors[k].shape)), y)]
        i = fit[0] if fit else 0
        how = (', the first whose size the data\'s targets fit' if fit and len(fit) < len(order)
               else ', the first')
    else:
        w = str(which)
        named = [j for j, k in enumerate(order) if w in (io_name(g, k), g.tensors[k].name)]
        i = int(w) if w.lstrip('-').isdigit() else named[0] if len(named) == 1 else None
        if i is None or not 0 <= i < len(order):
            if len(named) > 1:
                raise ValueError(f'{g.path}: --output {which!r} names outputs '
                                 + ', '.join(desc(j) for j in named) + '; give its place')
            raise ValueError(f'{g.path}: --output {which!r}: the model\'s outputs are '
                             + ', '.join(desc(j) for j in range(len(order)))
                             + '; give one\'s place or name')
    k = order[i]
    g.output_at, g.output_place = outs.index(k), i
    g.outputs = [k] + [o for o in outs if o != k]
    if len(outs) == 1:
        return None
    return (f'{g.path}: has {len(outs)} outputs; training output {desc(i)}{how} (the loss '
            'reads it; --output NAME|INDEX chooses another: '
            + ', '.join(desc(j) for j in range(len(order)) if j != i)
            + '); the ops only the others need are left out of the run, and export keeps '
            'them, their weights as trained where they share them')


def needed(g: Graph):
    """(the ops g.outputs[0] needs, in order; the tensors they read or make)."""
    need = {g.outputs[0]}
    keep = []
    for op in reversed(g.ops):
        if any(k in need for k in op.outputs):
            keep.append(op)
            need.update(k for k in op.inputs if k >= 0)
    return keep[::-1], need


def prune_outputs(g: Graph) -> int:
    """Only g.outputs[0] (choose_output's) is kept: the ops it does not need leave g, and
    the inputs it does not read leave g.inputs; tensors keep their numbers.  Returns how
    many ops left."""
    if len(g.outputs) < 2:
        return 0
    keep, need = needed(g)
    n = len(g.ops) - len(keep)
    g.ops = keep
    _renumber(g)
    g.outputs = g.outputs[:1]
    g.inputs = [k for k in g.inputs if k in need] or g.inputs[:1]
    return n


JOINED = 'utrain_inputs'


def join_inputs(g: Graph):
    """A graph with several inputs takes them as one [1, n] input, JOINED (the inputs'
    values one after the other, each flattened, in their maker's order (natural): what a
    data file's arrays become, dataset.load_inputs): a SPLIT_V of it into each input's values, and a
    RESHAPE of each to its input's shape; the devices run one input as before.  Tensors
    are appended (the others keep their numbers).  Int8 inputs (the int8 path) keep
    their scales and zero points: the joined input is each one's int8 codes one after
    the other (at scale 1, zero point 0: the SPLIT_V copies bytes, and each part is its
    input at its own scale; quant.prepare_q8 quantizes each part's samples so).  Float
    inputs stored as 8-bit samples (g.inputs_stored {data key: (scale, offset)}, --dtype:
    each input's own, pipeline.stored_parts) take their part as the stored codes and a MUL
    by its scale (an ADD of its offset) after the SPLIT_V gives the input's values.  Sets
    and returns g.joined, [(name, shape)] of the inputs joined, or None for a graph with
    one input."""
    if len(g.inputs) < 2:
        return None
    g.inputs = natural(g, g.inputs)
    parts = [(g.tensors[k].name, [int(d) for d in g.tensors[k].shape]) for k in g.inputs]
    sizes = [int(np.prod(s[1:], dtype=np.int64)) for _, s in parts]
    ib = getattr(g, 'ids_ib', 1)
    for i, k in enumerate(g.inputs):
        if ib > 1 and k in getattr(g, 'ids_q8', ()):
            # (an int8 embedding's ids of 2 bytes each, quant._ids_inputs: the part is
            # the ids tensor itself, [1, 2 n] bytes as utrain.q8emb reads them; export
            # gives it its file_shape back)
            t = g.tensors[k]
            t.file_shape, t.shape = list(t.shape), [1, sizes[i] * ib]
            sizes[i] *= ib
    q8 = all(g.tensors[k].dtype == 'int8' and (g.tensors[k].quant or {}).get('scale')
             for k in g.inputs)
    src = g.ops[0].src if g.ops else None
    x = new_tensor(g, JOINED, [1, sum(sizes)], dtype='int8' if q8 else None)
    if q8:
        g.tensors[x].quant = {'scale': [1.0], 'zero_point': [0]}
    sz = new_tensor(g, JOINED + '/sizes', [len(sizes)], np.array(sizes, np.int32))
    ax = new_tensor(g, JOINED + '/axis', [], np.array(1, np.int32))
    made, outs = [], []
    for k, n in zip(g.inputs, sizes):
        if list(g.tensors[k].shape) == [1, n]:
            outs.append(k)          # (a [1, n] input is its part as it is)
            continue
        outs.append(new_tensor(g, g.tensors[k].name + '/joined_part', [1, n],
                               like=k if q8 else None))
        rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [outs[-1]], [k], {}, src=src)
        _make_reshape(g, rs, list(g.tensors[k].shape))
        made.append(rs)
    split = Operator(-1, OP_CODES['SPLIT_V'], 'SPLIT_V', [x, sz, ax], outs,
                     {'num_splits': len(outs)}, src=src)
    stored = getattr(g, 'inputs_stored', None) or {}
    keys = {n: key for n, _, key in (getattr(g, 'data_inputs', None) or ((),))[0]}
    for i, (k, (name, _)) in enumerate(zip(g.inputs, parts)):
        sc, off = stored.get(keys.get(name), (1.0, 0.0)) if not q8 else (1.0, 0.0)
        for what, c, op in (('offset', off, 'ADD'), ('scale', sc, 'MUL')):  # (code sc + off)
            if c == (1.0 if op == 'MUL' else 0.0):
                continue
            raw = new_tensor(g, f'{name}/stored_{what}d', [1, sizes[i]])
            made.insert(0, Operator(-1, OP_CODES[op], op, [raw, new_tensor(
                g, f'{name}/stored_{what}', [1], np.array([c], np.float32))], [outs[i]],
                {'fused_activation_function': 'NONE'}, src=src))
            outs[i] = raw       # (the SPLIT_V's own list: it writes the stored codes)
    g.ops[0:0] = [split] + made
    _renumber(g)
    for k in g.inputs if not q8 else ():
        g.tensors[k].dtype = 'float32'
    g.inputs = [x]
    g.joined = parts
    return parts


def join_ops(g: Graph) -> set:
    """ids of the ops join_inputs made in g (none where it joined nothing)."""
    if not getattr(g, 'joined', None):
        return set()
    split = next(op for op in g.ops if g.inputs[0] in op.inputs)
    out, todo = {id(split)}, list(split.outputs)
    while todo:         # (an 8-bit part's MUL, ADD: join_inputs's stored codes; the RESHAPE)
        k = todo.pop()
        for op in g.ops:
            if k in op.inputs and (op.name == 'RESHAPE' or op.name in ('MUL', 'ADD') and
                                   g.tensors[op.inputs[1]].name.rsplit('/', 1)[-1] in
                                   ('stored_scale', 'stored_offset')):
                out.add(id(op))
                todo += op.outputs if op.name != 'RESHAPE' else ()
    return out


def keep_file_view(g: Graph):
    """Before prune_outputs and join_inputs: what file_graph gives back (g's tensors as
    they are numbered now, its ops, its inputs and the file's outputs in its order)."""
    o, i = list(g.outputs), getattr(g, 'output_at', 0)
    g.as_file = (len(g.tensors), copy.deepcopy(g.ops), list(g.inputs), o[1:i + 1] + o[:1] + o[i + 1:])


def file_graph(g: Graph) -> Graph:
    """g as the file has it (keep_file_view's): its inputs apart and every output, for
    the rewritten model export writes the trained weights into; g itself when nothing
    was joined or left out."""
    v = getattr(g, 'as_file', None)
    if v is None or (len(v[2]) == len(g.inputs) and len(v[3]) == len(g.outputs)):
        return g
    n, ops, ins, outs = v
    return dataclasses.replace(g, tensors=g.tensors[:n], ops=copy.deepcopy(ops), inputs=ins,
                               outputs=outs)


def reverse_to_concat(g: Graph) -> int:
    """REVERSE_V2 of an activation along one axis (Keras's Bidirectional: the backward
    layer reads the sequence reversed) -> a STRIDED_SLICE of each index along it and a
    CONCATENATION of them in reverse order: the same values through ops that train (an
    unrolled backward layer's steps read the slices themselves: unroll_loops, and
    slices_to_split makes them one SPLIT_V).  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'REVERSE_V2' or len(op.inputs) != 2 or is_const(g, op.inputs[0]) or \
                not is_const(g, op.inputs[1]) or len(const_ints(g, op.inputs[1])) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        X = list(g.tensors[x].shape)
        a = const_ints(g, op.inputs[1])[0] % len(X)
        made, parts, name = [], [], g.tensors[y].name
        for i in reversed(range(X[a])):
            b, e = [0] * len(X), list(X)
            b[a], e[a] = i, i + 1
            parts.append(new_tensor(g, f'{name}/at{i}', X[:a] + [1] + X[a + 1:], like=y))
            made.append(_slice_op(g, x, parts[-1], f'{name}/at{i}', b, e, [1] * len(X), op.src))
        made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', parts, [y],
                             {'axis': a, 'fused_activation_function': 'NONE'}, src=op.src))
        replace_op(g, op, made)
        done += 1
    return done


# --------------------------------------------------------------------------- loops

# the host's values of a loop's counters and its condition (with _host_value's integer
# arithmetic, shape ops and GATHER)
_LOGIC = {'LESS': np.less, 'LESS_EQUAL': np.less_equal, 'GREATER': np.greater,
          'GREATER_EQUAL': np.greater_equal, 'EQUAL': np.equal, 'NOT_EQUAL': np.not_equal,
          'LOGICAL_AND': np.logical_and, 'LOGICAL_OR': np.logical_or}
# ops that only move values: computed on the host over constants, whatever their dtype
_MOVES = {'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS', 'CONCATENATION', 'GATHER', 'STRIDED_SLICE',
          'SLICE', 'PACK'}
_CONTROL = ('WHILE', 'IF', 'CALL', 'CALL_ONCE')
# most steps unroll_loops makes of one WHILE (a loop that does not stop on the host)
MAX_STEPS = 4096
# what a loop that cannot unroll is told to do
UNROLL_HINT = ('give the recurrent layer unroll=True (Keras; a fixed sequence length) and '
               'convert again, or export the model to ONNX')


def _loop_value(g: Graph, op: Operator):
    """The host's value of op's output over constant inputs (integer and boolean
    arithmetic, comparisons, shape ops, and data moves of any dtype), else None."""
    if not op.inputs or not all(is_const(g, k) for k in op.inputs if k >= 0):
        return None
    out = g.tensors[op.outputs[0]] if len(op.outputs) == 1 else None
    if out is None or not (_integer(out.dtype) or out.dtype == 'bool' or op.name in _MOVES):
        return None
    v = [np.asarray(g.tensors[k].data).reshape(g.tensors[k].shape) for k in op.inputs if k >= 0]
    if op.name in _LOGIC and len(v) == 2:
        return _LOGIC[op.name](v[0], v[1])
    if op.name == 'LOGICAL_NOT':
        return np.logical_not(v[0])
    if op.name == 'SLICE' and len(v) == 3:
        b = [int(i) for i in v[1].reshape(-1)]
        n = [int(i) for i in v[2].reshape(-1)]
        return v[0][tuple(slice(s, None if k < 0 else s + k) for s, k in zip(b, n))]
    try:
        return _host_value(g, op)
    except (ValueError, IndexError, TypeError):
        return None


def _zeros(g: Graph, k: int) -> bool:
    """Tensor k is float zeros (a recurrent layer's initial state), a constant or the
    DEQUANTIZE of one (a float16 file's, dequantized after the loops unroll)."""
    if k >= 0 and not is_const(g, k):
        p = _producer(g, k)
        if p is None or p.name != 'DEQUANTIZE' or g.tensors[p.inputs[0]].quant:
            return False
        k = p.inputs[0]
    return is_const(g, k) and g.tensors[k].dtype in ('float32', 'float16') and \
        not np.any(g.tensors[k].data)


def unroll_loops(g: Graph, int8=False) -> int:
    """A WHILE whose trip count the host knows (TFLiteConverter's Keras LSTM, GRU,
    SimpleRNN and Bidirectional layers that are not unroll=True: the cond compares two
    counters with the sequence length) -> its body inlined into the graph once a step,
    the loop-carried tensors wired through: the plain unrolled RNN Keras's unroll=True
    writes.  Each step's integer arithmetic (counters, the shapes of the output buffer's
    slices) folds to constants, so the step's GATHER of the sequence becomes a slice, and
    the output buffer's SLICEs of a CONCATENATION are its parts (empty ones dropped); a
    zero initial state folds away as Keras's unrolled layer has it.  The body's
    constants (the cell's weights) are one tensor each, read by every step (one
    parameter, trained by all of them); each constant's Tensor.origin is its (subgraph,
    tensor) in the file (export writes the trained values back there).  Refuses a loop
    whose condition needs a value computed at run time, and for int8 training (int8) a
    quantized body (the int8 path writes trained weights into subgraph 0 only).  Returns
    how many WHILEs."""
    done = 0
    for op in list(g.ops):
        if op.name != 'WHILE':
            continue
        subs = g.subgraphs or {}
        cond = subs.get(op.options.get('cond_subgraph_index'))
        body = subs.get(op.options.get('body_subgraph_index'))
        if cond is None or body is None or not (
                len(cond.inputs) == len(body.inputs) == len(body.outputs) == len(op.inputs)
                == len(op.outputs)) or len(cond.outputs) != 1:
            raise ValueError(f'{g.path}: op {op.number} WHILE: its cond and body subgraphs do '
                             'not take and give its loop values; the file is damaged')
        for t in g.tensors:         # (where export finds each weight in the file: the
            if t.data is not None and t.origin is None and t.buffer > 0:    # file's own)
                t.origin = (0, t.index)
        q = next((t for t in body.tensors if t.data is None and t.quant and
                  t.dtype in ('int8', 'uint8', 'int16')), None)
        if int8 and q is not None:
            raise ValueError(f'{g.path}: op {op.number} WHILE: its body is quantized ({q.name} is '
                             f'{q.dtype}), and utrain trains an unrolled loop in float: prepare '
                             '--dequantize trains it so (export writes the float model), or '
                             + UNROLL_HINT)
        made, shared, cur = [], {}, list(op.inputs)
        for step in range(MAX_STEPS + 1):
            if not _goes_on(g, op, cond, cur, step):
                break
            if step == MAX_STEPS:
                raise ValueError(f'{g.path}: op {op.number} WHILE runs more than {MAX_STEPS} '
                                 'steps; ' + UNROLL_HINT)
            cur = _step(g, op, body, cur, step, shared, made)
        out = dict(zip(op.outputs, cur))
        for o in made:              # (--train and --ranks name the WHILE: its steps train)
            o.trains_with = op
        replace_op(g, op, made)
        for o in g.ops:
            o.inputs = [out.get(k, k) for k in o.inputs]
        g.outputs = [out.get(k, k) for k in g.outputs]
        _drop_dead(g, made, op.inputs)
        done += 1
    if done and not any(op.name in _CONTROL for op in g.ops):
        g.n_subgraphs = 1           # (validate: nothing runs another subgraph now)
    return done


def _goes_on(g: Graph, op: Operator, cond: Graph, cur, step) -> bool:
    """The WHILE's condition on the loop values cur, computed on the host."""
    val = {k: g.tensors[c].data for k, c in zip(cond.inputs, cur) if is_const(g, c)}
    for c in cond.ops:
        h = Graph(g.path, g.identifier, 0, '', [], [], [], [], {}, 1)
        for k in c.inputs + c.outputs:
            if k >= 0:
                t = cond.tensors[k]
                data = val.get(k, t.data)
                h.tensors.append(Tensor(len(h.tensors), t.name, t.shape, t.dtype, data, -1))
        ix = {k: i for i, k in enumerate(c.inputs + c.outputs) if k >= 0}
        hop = Operator(0, c.code, c.name, [ix[k] if k >= 0 else -1 for k in c.inputs],
                       [ix[k] for k in c.outputs], c.options)
        v = _loop_value(h, hop) if len(c.outputs) == 1 else None
        if v is None:
            late = [cond.tensors[k].name for k in c.inputs if k >= 0 and val.get(
                k, cond.tensors[k].data) is None]
            raise ValueError(
                f'{g.path}: op {op.number} WHILE: its trip count is not known before it runs '
                f'(its condition\'s {c.name} reads {", ".join(late) or "values"} computed at '
                f'run time{", at step " + str(step) if step else ""}), so utrain cannot unroll it; '
                + UNROLL_HINT)
        val[c.outputs[0]] = np.asarray(v)
    return bool(np.all(val[cond.outputs[0]]))


def _step(g: Graph, op: Operator, body: Graph, cur, t, shared, made):
    """One step of WHILE op's body appended to made (ops over g's tensors, simplified as
    they come: _simplified), reading the loop values cur; returns the next ones."""
    m = dict(zip(body.inputs, cur))

    def get(k):
        if k < 0 or k in m:
            return m.get(k, -1)
        bt = body.tensors[k]
        if bt.data is None:
            raise ValueError(f'{g.path}: op {op.number} WHILE: its body reads tensor {k} '
                             f'({bt.name}) before any op writes it; the file is damaged')
        if k not in shared:         # (one tensor for every step: a weight trains as one)
            shared[k] = new_tensor(g, bt.name, bt.shape, bt.data.copy())
            g.tensors[shared[k]].quant = dict(bt.quant) if bt.quant else None
            g.tensors[shared[k]].origin = (op.options['body_subgraph_index'], k)
        return shared[k]

    for b in body.ops:
        if b.name in _CONTROL:
            raise ValueError(f'{g.path}: op {op.number} WHILE: its body holds a {b.name} '
                             '(nested control flow), which utrain does not unroll; ' + UNROLL_HINT)
        if b.outputs and all(k in shared for k in b.outputs):
            m.update((k, shared[k]) for k in b.outputs)     # (computed at the first step)
            continue
        # an op of the body's constants alone (float16 weights' DEQUANTIZE) computes the
        # same at every step: once, its result read by all (one parameter still)
        same = all(k < 0 or k not in body.inputs and (k in shared or body.tensors[k].data
                                                        is not None) for k in b.inputs)
        ins = [get(k) for k in b.inputs]
        outs = []
        for k in b.outputs:
            bt = body.tensors[k]
            outs.append(new_tensor(g, f'{bt.name}/t{t}', bt.shape, dtype=bt.dtype))
            g.tensors[outs[-1]].quant = dict(bt.quant) if bt.quant else None
        new = Operator(-1, b.code, b.name, ins, outs, dict(b.options), src=op.src)
        for k, v in zip(b.outputs, _simplified(g, new, made)):
            m[k] = v
            if same:
                shared[k] = v
    return [get(k) for k in body.outputs]


def _producer_in(g: Graph, made, k):
    return next((o for o in reversed(made) if k in o.outputs), None) or _producer(g, k)


def _simplified(g: Graph, op: Operator, made) -> list:
    """op (its outputs fresh tensors) as the step needs it: its value where the host
    knows it (a constant), an input it passes on unchanged, the parts of a buffer it
    slices, or op itself (appended to made).  Returns its outputs' tensors."""
    y = op.outputs[0]
    v = _loop_value(g, op) if len(op.outputs) == 1 else None
    if v is not None:
        t, v = g.tensors[y], np.asarray(v)
        if op.name not in ('SLICE', 'CONCATENATION'):     # (their shapes vary by step)
            v = v.reshape(t.shape) if v.size == int(np.prod(t.shape)) else None
    if v is not None:
        t.data = np.array(v, dtype=t.dtype)        # (a 0-d counter stays 0-d)
        t.shape = list(t.data.shape)
        return [y]
    x = op.inputs[0] if op.inputs else -1
    if op.name == 'MUL' and any(_zeros(g, k) for k in op.inputs) or \
            op.name == 'FULLY_CONNECTED' and _zeros(g, x) and (
                len(op.inputs) < 3 or op.inputs[2] < 0):
        # (a zero initial state: its terms are zero; the weights read no gradient there)
        g.tensors[y].data = np.zeros(g.tensors[y].shape, np.float32)
        return [y]
    if op.name in ('ADD', 'SUB') and op.options.get('fused_activation_function',
                                                    'NONE') == 'NONE':
        for a, b in ((0, 1), (1, 0)) if op.name == 'ADD' else ((0, 1),):
            if _zeros(g, op.inputs[b]) and g.tensors[op.inputs[a]].shape == g.tensors[y].shape:
                return [op.inputs[a]]
    if op.name == 'SLICE' and all(is_const(g, k) for k in op.inputs[1:3]):
        X = list(g.tensors[x].shape)
        b, n = const_ints(g, op.inputs[1]), const_ints(g, op.inputs[2])
        k = x
        for d in range(len(X)):
            e = X[d] if n[d] < 0 else b[d] + n[d]
            if (b[d], e) != (0, X[d]):
                k = _take(g, k, d, b[d], e, made, g.tensors[y].name)
        return [k]
    if op.name == 'GATHER' and is_const(g, op.inputs[1]) and not is_const(g, x) and \
            g.tensors[op.inputs[1]].data.ndim == 0 and not op.options.get('batch_dims'):
        X = list(g.tensors[x].shape)
        a = int(op.options.get('axis', 0)) % len(X)
        i = int(g.tensors[op.inputs[1]].data) % X[a]
        k = _take(g, x, a, i, i + 1, made, g.tensors[y].name)
        shape = X[:a] + X[a + 1:]
        g.tensors[y].shape = shape
        rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [k], [y], {}, src=op.src)
        _make_reshape(g, rs, shape)
        made.append(rs)
        return [y]
    if op.name == 'CONCATENATION':
        a = int(op.options.get('axis', 0))
        a %= max(len(g.tensors[x].shape), 1)
        parts = []
        for k in op.inputs:
            p = _producer_in(g, made, k)
            if p is not None and p.name == 'CONCATENATION' and p.options.get('axis', 0) % \
                    len(g.tensors[k].shape) == a and p.options.get(
                        'fused_activation_function', 'NONE') == 'NONE':
                parts += p.inputs
            else:
                parts.append(k)
        parts = [k for k in parts if int(np.prod(g.tensors[k].shape))] or parts[:1]
        shape = list(g.tensors[parts[0]].shape)
        shape[a] = sum(g.tensors[k].shape[a] for k in parts)
        if len(parts) == 1 and op.options.get('fused_activation_function', 'NONE') == 'NONE':
            return parts
        g.tensors[y].shape = shape
        op.inputs = parts
    made.append(op)
    return op.outputs


def _take(g: Graph, x: int, a: int, b: int, e: int, made, name) -> int:
    """A tensor of x[b:e] along axis a (all of the other axes): x itself, a constant,
    the parts of the CONCATENATION that made x (those it spans, themselves taken), or a
    STRIDED_SLICE appended to made."""
    X = list(g.tensors[x].shape)
    b, e = max(b, 0), min(e, X[a])
    if (b, e) == (0, X[a]):
        return x
    shape = X[:a] + [max(e - b, 0)] + X[a + 1:]
    if is_const(g, x) or e <= b:
        data = np.asarray(g.tensors[x].data).reshape(X)[(slice(None),) * a + (slice(b, e),)] \
            if is_const(g, x) else np.zeros(shape, np.float32)
        return new_tensor(g, f'{name}/part', shape, data.astype(g.tensors[x].dtype))
    p = _producer_in(g, made, x)
    if p is not None and p.name == 'CONCATENATION' and p.options.get('axis', 0) % len(X) == a \
            and p.options.get('fused_activation_function', 'NONE') == 'NONE':
        got, at = [], 0
        for k in p.inputs:
            n = g.tensors[k].shape[a]
            if at < e and at + n > b:
                got.append(_take(g, k, a, b - at, e - at, made, name))
            at += n
        if len(got) == 1:
            return got[0]
        y = new_tensor(g, f'{name}/parts', shape, like=x)
        made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', got, [y],
                             {'axis': a, 'fused_activation_function': 'NONE'}, src=p.src))
        return y
    begin, end = [0] * len(X), list(X)
    begin[a], end[a] = b, e
    for o in g.ops + made:          # (the same slice taken before: Bidirectional's two loops)
        if o.name == 'STRIDED_SLICE' and o.inputs[0] == x and not any(o.options.values()) and \
                [const_ints(g, k) for k in o.inputs[1:4]] == [begin, end, [1] * len(X)]:
            return o.outputs[0]
    y = new_tensor(g, f'{name}/slice', shape, like=x)
    made.append(_slice_op(g, x, y, f'{name}/slice', begin, end, [1] * len(X), None))
    return y


def _drop_dead(g: Graph, made, fed):
    """The ops of made nothing reads (the loop's counters, the buffers of steps before
    the last) taken out of g, and the ops that fed the loop (fed: tensors the WHILE read)
    that nothing reads now (reverse_to_concat's CONCATENATION, whose slices the steps
    read instead), and so on up."""
    made, fed = {id(o) for o in made}, set(fed)
    while True:
        read = set(g.outputs)
        for o in g.ops:
            read.update(o.inputs)
        dead = [o for o in g.ops if not read & set(o.outputs) and (
            id(o) in made or fed & set(o.outputs))]
        if not dead:
            break
        for o in dead:
            g.ops.remove(o)
            fed.update(o.inputs)
    _renumber(g)


# The exporter-output passes in the order rewrite() runs them after dequantize:
# (report key, pass, whether it runs on an int8 graph that trains as int8).  The int8
# ones only fold what the host knows or change an op for one that computes the same
# integers (a max keeps its input's scale, a tile is copies, an unpack or slices a split
# of the same bytes); the others edit float constants or make float constants (NEG's -1).
def unshare_constants(g: Graph) -> int:
    """A constant tensor that ops of different layers read as a weight or bias gets a
    copy per layer: the TFLite converter keeps one tensor for equal constants (Keras's
    all-zero conv biases, equal weights), and trained as one they would move together,
    fewer parameters than the model has.  Readers are one layer applied again (a
    TimeDistributed's steps, an unrolled RNN's: utrain.q8share) where they are the same
    op reading the same constants (its options may differ: an RNN's first step fuses the
    activation the others apply after adding the recurrent term): those keep sharing.  The first
    group keeps the tensor, each other group reads a copy (appended: the tensors before
    keep their indices), frozen ones too (export writes the copies as tensors of their
    own).  Float and int8 graphs (an int8 copy keeps the scales).  Returns the copies made."""
    from .optable import SPECS
    readers = {}
    for op in g.ops:
        spec = SPECS.get(op.name)
        if spec is None:
            continue
        for pos in spec.roles(op, g):
            k = op.inputs[pos] if pos < len(op.inputs) else -1
            if is_const(g, k):
                readers.setdefault(k, []).append((op, pos))
    made = 0
    g.unshared = []     # (each tensor copied and its copies: still_shared counts them)
    for k, rs in readers.items():
        layers = {}
        for op, pos in rs:
            # (its weights and biases: a step that reads a constant as data, an unrolled
            # loop's first FC of its zero initial state, is the same layer)
            roles = SPECS[op.name].roles(op, g)
            key = (op.name, pos, tuple(i if is_const(g, i) and p in roles else -1
                                       for p, i in enumerate(op.inputs)))
            layers.setdefault(key, []).append(op)
        t = g.tensors[k]
        family = [t]
        for j, ops in enumerate(list(layers.values())[1:], 1):
            c = new_tensor(g, f'{t.name}/utrain_copy{j}', t.shape, t.data.copy(), like=k)
            for op in ops:
                op.inputs = [c if i == k else i for i in op.inputs]
            family.append(g.tensors[c])
            made += 1
        if len(family) > 1:
            g.unshared.append(family)
    return made


def still_shared(g: Graph) -> list:
    """The names of unshare_constants's tensors (a constant several layers read, and its
    copies) that ops still read once the passes have run, for each constant two or more
    of them are: a fold that replaces a layer's bias (a dilated convolution's zero bias,
    its ADD's bias moved in) leaves its copy read by nothing, and a constant one layer
    reads is no longer shared."""
    read = {id(g.tensors[k]) for op in g.ops for k in op.inputs if k >= 0}
    fams = [[t.name for t in f if id(t) in read] for f in getattr(g, 'unshared', ())]
    return [f for f in fams if len(f) > 1]


def _recurrent_fcs(g: Graph) -> list:
    """FULLY_CONNECTED ops whose weight and bias (constants) other FULLY_CONNECTED ops read
    too: one layer applied a step at a time (an unrolled RNN's hidden-to-hidden layer)."""
    by = {}
    for op in g.ops:
        b = op.inputs[2] if len(op.inputs) > 2 else -1
        if op.name == 'FULLY_CONNECTED' and is_const(g, op.inputs[1]) and \
                (b < 0 or is_const(g, b)) and not is_const(g, op.inputs[0]):
            by.setdefault((op.inputs[1], b), []).append(op)
    return [ops[0] for ops in by.values() if len(ops) > 1]


def _reaches(g: Graph, op: Operator, k: int) -> bool:
    """Does tensor k depend on op's outputs (g's ops are in order)?"""
    seen = set(op.outputs)
    for o in g.ops[g.ops.index(op) + 1:]:
        if seen.intersection(o.inputs):
            seen.update(o.outputs)
    return k in seen


def first_steps(g: Graph) -> int:
    """An unrolled RNN's first step as tico writes it (a PyTorch nn.GRU / nn.LSTM): with
    the initial state h0 = 0 the converter folds W_hh h0 + b_hh into constants, b_hh or
    its gate slices (GRU: b_hr, b_hz, b_hn; zeros for a layer without a bias), read by
    the step's ADD and MUL, and writes
    the zero state (GRU's h0 in h0 - n, LSTM's c0 in f * c0) as an all-zero constant.
    Trained as parameters of their own they would move apart from b_hh, and h0 would
    train where PyTorch holds it at 0.  So a constant that equals block j of n of a
    recurrent FULLY_CONNECTED's bias (the same layer a later step applies: _recurrent_fcs),
    read by an op the layer's input depends on, becomes piece j of that FC applied to a
    zero state (FC -> SPLIT -> RESHAPE): b_hh is one parameter again, trained by every
    step as PyTorch trains it, and export writes one tensor.  An all-zero constant read
    as a binary op's operand on the way to such a layer's input, of the state's size or
    of the layer's output (or a gate's part of it), is frozen (Tensor.frozen).  (A b_hh
    initialised to zeros is then frozen in step 0, where the later steps train it: its
    copies cannot be told from a zero state by value.)  Float graphs.  Returns how many
    constants."""
    fcs = _recurrent_fcs(g)
    if not fcs:
        return 0
    done, zero_state = 0, {}
    for op in list(g.ops):
        if op.name not in BINARY or len(op.inputs) != 2:
            continue
        for pos in (0, 1):
            k = op.inputs[pos]
            if not is_const(g, k) or is_const(g, op.inputs[1 - pos]) or \
                    g.tensors[k].dtype != 'float32' or g.tensors[k].frozen:
                continue
            c = np.asarray(g.tensors[k].data, np.float32).reshape(-1)
            for f in fcs:
                # (no bias, nn.GRU(bias=False): step 0's W_hh h0 folds to zeros, frozen)
                b = np.asarray(g.tensors[f.inputs[2]].data, np.float32).reshape(-1) \
                    if len(f.inputs) > 2 and f.inputs[2] >= 0 else np.zeros(0, np.float32)
                n, m = b.size // c.size, c.size
                if not c.any():
                    # the state (h0, c0: the FC's input size) or W_hh h0 (its output
                    # size, or a gate's part of it) of a layer without a bias
                    out = int(g.tensors[f.outputs[0]].shape[-1])
                    if (m == int(np.prod(g.tensors[f.inputs[0]].shape)) or out % m == 0) and \
                            _reaches(g, op, f.inputs[0]):
                        g.tensors[k].frozen = True      # (h0 / c0: no parameter)
                        done += 1
                        break
                    continue
                if not b.size or b.size % m or not _reaches(g, op, f.inputs[0]) or m == 1 and (
                        len(g.tensors[k].shape) != len(g.tensors[f.outputs[0]].shape) or
                        len(g.tensors[k].shape) < 2):
                    continue        # (a scalar 1 or 0.5 is no gate's bias: a 1-unit
                    # layer's has the state's rank)
                j = next((j for j in range(n) if np.array_equal(b[j * m:(j + 1) * m], c)), None)
                if j is None:
                    continue
                key = (id(f), n)
                if key not in zero_state:
                    zero_state[key] = _applied_to_zero(g, f, op, n)
                piece = zero_state[key][1][j]
                if list(g.tensors[piece].shape) != list(g.tensors[k].shape):
                    r = new_tensor(g, g.tensors[k].name + '/utrain_tied', g.tensors[k].shape,
                                   like=k)
                    shp = new_tensor(g, g.tensors[k].name + '/utrain_shape',
                                     [len(g.tensors[k].shape)],
                                     np.array(g.tensors[k].shape, np.int32))
                    g.ops.insert(g.ops.index(op), Operator(
                        -1, OP_CODES['RESHAPE'], 'RESHAPE', [piece, shp], [r],
                        {'new_shape': list(g.tensors[k].shape)}, src=op.src))
                    _renumber(g)
                    piece = r
                op.inputs[pos] = piece
                done += 1
                break
    return done


def scaled_copies(g: Graph) -> int:
    """A FULLY_CONNECTED, CONV_2D or DEPTHWISE_CONV_2D whose weight and bias are another's
    of the same op, options and input times one positive number s (tico folds PyTorch's
    softplus(x, beta) beta * linear(x) into a second copy of the linear layer) ->
    MUL(that other's output, s), s frozen: trained as a copy it would move apart from the
    layer PyTorch trains.  Float graphs.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name not in WEIGHT_OUT_AXIS or len(op.inputs) < 3 or not all(
                is_const(g, k) for k in op.inputs[1:3]):
            continue
        w, b = (np.asarray(g.tensors[k].data, np.float64) for k in op.inputs[1:3])
        for o in g.ops:
            # (the copy is the one whose weight the converter wrote after: tico's
            # p_fc_weight_weight_fused after p_fc_weight)
            if o is op or o.name != op.name or o.inputs[0] != op.inputs[0] or \
                    o.inputs[1] > op.inputs[1] or \
                    len(o.inputs) != len(op.inputs) or o.options != op.options or \
                    not all(is_const(g, k) for k in o.inputs[1:3]) or \
                    list(g.tensors[o.outputs[0]].shape) != list(g.tensors[op.outputs[0]].shape):
                continue
            w0, b0 = (np.asarray(g.tensors[k].data, np.float64) for k in o.inputs[1:3])
            if w0.shape != w.shape or b0.shape != b.shape or not np.abs(w0).any():
                continue
            i = int(np.argmax(np.abs(w0)))
            s = w.reshape(-1)[i] / w0.reshape(-1)[i]
            if not s > 0 or s == 1 or not np.allclose(w, s * w0, rtol=1e-6, atol=0) or \
                    not np.allclose(b, s * b0, rtol=1e-6, atol=1e-30):
                continue
            if op.options.get('fused_activation_function', 'NONE') != 'NONE':
                continue
            k = new_tensor(g, g.tensors[op.outputs[0]].name + '/utrain_scale', [],
                           np.array(s, np.float32))
            g.tensors[k].frozen = True
            if g.ops.index(o) > g.ops.index(op):
                move_after(g, op, o)
            op.name, op.code, op.inputs = 'MUL', OP_CODES['MUL'], [o.outputs[0], k]
            op.options = dict(_NONE)
            done += 1
            break
    return done


def _applied_to_zero(g: Graph, f: Operator, before: Operator, n: int):
    """FC f (its weight and bias) applied to a frozen zero state, split in n along its
    last axis, inserted before op `before`: (FC op, [pieces])."""
    x, y = g.tensors[f.inputs[0]], g.tensors[f.outputs[0]]
    z = new_tensor(g, y.name + '/utrain_zero_state', x.shape, np.zeros(x.shape, np.float32))
    g.tensors[z].frozen = True
    out = new_tensor(g, y.name + '/utrain_first_step', y.shape, like=f.outputs[0])
    made = [Operator(-1, f.code, f.name, [z] + list(f.inputs[1:]), [out], dict(f.options),
                     src=f.src)]
    pieces = [out]
    if n > 1:
        shape = list(y.shape[:-1]) + [y.shape[-1] // n]
        pieces = [new_tensor(g, f'{y.name}/utrain_first_step{j}', shape, like=f.outputs[0])
                  for j in range(n)]
        axis = new_tensor(g, y.name + '/utrain_axis', [], np.array(len(y.shape) - 1, np.int32))
        made.append(Operator(-1, OP_CODES['SPLIT'], 'SPLIT', [axis, out], pieces,
                             {'num_splits': n}, src=f.src))
    at = g.ops.index(before)
    g.ops[at:at] = made
    _renumber(g)
    return made[0], pieces


# (run before dequantize: a loop's body is dequantized with the rest)
LOOP_PASSES = (('reversals', reverse_to_concat, True), ('loops', unroll_loops, True))
PASSES = (('unshared', unshare_constants, True), ('first_steps', first_steps, False),
          ('scaled_copies', scaled_copies, False),
          ('shapes', fold_shapes, True), ('takes', gathers_to_slices, True),
          ('embeddings', embedding_gathers, True),
          ('masks', id_masks, False), ('unpacks', unpack_to_split, True),
          ('packs', pack_to_concat, True), ('tiles', tile_to_concat, True),
          ('resizes', resize_to_concat, True), ('selects', selects_to_relu, False),
          ('elementwise', elementwise_forms, False), ('fc_biases', fc_bias_adds, False),
          ('transposes', cancel_transposes, True), ('batchnorm', fold_batchnorm, False),
          ('splits', slices_to_split, True), ('max_pools', reduce_max_to_pool, True),
          ('dilations', dilated_convs, True), ('conv_biases', conv_bias_adds, False),
          ('separable_biases', separable_biases, False),
          ('groups', split_groups, True))


def rewrite(g: Graph, keep=(), int8=False) -> dict:
    """All passes in order on g (in place).  ``keep``: Operator objects of the original
    graph that train (their BatchNorm stays separate).  int8: g trains as int8 (its
    tensors stay quantized): only the passes PASSES marks for it.  Returns
    {'dequantized': n tensors, 'quant': {...}, 'transposes': n, 'batchnorm': n, ...}."""
    # (a WHILE's body unrolled first: its float16 weights' DEQUANTIZEs are dequantized too)
    loops = {name: fn(g, int8=int8) if fn is unroll_loops else fn(g) for name, fn, _ in LOOP_PASSES}
    n, f16 = len(g.ops), any(t.dtype == 'float16' for t in g.tensors)
    quant = {} if int8 else dequantize(g)
    # (a float16 file's weights: float32 without scales to keep, its DEQUANTIZEs gone)
    moved = not int8 and (f16 or len(g.ops) != n)
    info = {'dequantized': len(quant), 'quant': quant, **loops}
    for name, fn, on_int8 in PASSES:
        if int8 and not on_int8:
            info[name] = 0
            continue
        info[name] = (fn(g, keep={id(op) for op in keep}) if name in ('batchnorm', 'conv_biases')
                      else fn(g))
    if info['unshared']:    # (copies a later fold left unread are not counted)
        info['unshared_names'] = still_shared(g)
        info['unshared'] = sum(len(f) - 1 for f in info['unshared_names'])
    info['changed'] = bool(quant) or moved or any(info[name] for name, _, _ in PASSES + LOOP_PASSES
                                                  if name != 'embeddings')
    info['splits'] += info.pop('unpacks')       # (an UNPACK becomes a SPLIT)
    return info
