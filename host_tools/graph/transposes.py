"""Layout TRANSPOSEs (tico, ONNX) cancelled, sunk or folded: cancel_transposes,
and hoist_input_transpose for an input read transposed."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator
from .edit import (BINARY, REDUCE, UNARY, bypass, const_ints, consumers, is_const, make_reshape,
                   move_after, new_tensor, perm_of, remove_op, renumber)


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
                renumber(g)
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
        renumber(g)
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
    renumber(g)
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
    weight's columns instead (the flatten of an NCHW map after an NHWC kernel).  Not
    where export writes the weight back into the file, whose TRANSPOSE stays: an unrolled
    loop's file (Tensor.origin), a quantized file's `export --quantized` (by name:
    g.dequantized); its columns permuted there were another model's."""
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
    if g.tensors[fc.inputs[1]].origin is not None or getattr(g, 'dequantized', False):
        return False
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
                make_reshape(g, t, g.tensors[b].shape)
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
                    # (an ONNX graph's weight keeps its initializer's values, which
                    # export finds it by: the reader permutes the columns itself where
                    # it can, a 3-D convolution's flattened output stays a TRANSPOSE)
                    done = (not _onnx(g) and _fold_into_fc(g, t, p)) or \
                        _sink_through(g, t, c, p) or \
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
