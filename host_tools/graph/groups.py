"""Grouped convolutions: split into a conv per group for training, joined back for
export."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator
from .edit import consumers, is_const, new_tensor, renumber, replace_op


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
    the file's number).  A weight (and bias) several grouped convs read (a 3-D conv's
    depth tap, read by every output frame: spellings.conv3d_to_conv2d) is split once,
    its parts read by each of them, and the group convs train with the op they all train
    with.  join_groups puts them back for export.  Returns how many."""
    done, cut = 0, {}

    def part(key, make):
        if key not in cut:
            cut[key] = make()
        return cut[key]
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
            def as_dw():
                dw = new_tensor(g, w.name + _AS_DW.format(G), [1] + w.shape[1:3] + [w.shape[0]],
                                np.ascontiguousarray(np.asarray(w.data).transpose(3, 1, 2, 0)),
                                dtype=w.dtype)
                g.tensors[dw].quant = _quant_part(w.quant, 0, w.shape[0], axis=3)
                return dw
            dw = part((op.inputs[1], 'dw', G), as_dw)
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

            def w_part():
                wj = new_tensor(g, w.name + _GROUP.format(j, G), [n] + w.shape[1:],
                                np.array(w.data[lo:hi]), dtype=w.dtype)
                g.tensors[wj].quant = _quant_part(w.quant, lo, hi)
                return wj

            def b_part():
                bt = g.tensors[b]
                bj = new_tensor(g, bt.name + _GROUP.format(j, G), [n],
                                np.array(np.asarray(bt.data).reshape(-1)[lo:hi]), dtype=bt.dtype)
                g.tensors[bj].quant = _quant_part(bt.quant, lo, hi)
                return bj
            wj = part((op.inputs[1], j, G), w_part)
            bj = part((b, j, G), b_part) if b >= 0 else -1
            yj = new_tensor(g, g.tensors[y].name + _GROUP.format(j, G),
                            g.tensors[y].shape[:3] + [n], like=y)
            outs.append(yj)
            c = op if j == 0 else Operator(-1, OP_CODES['CONV_2D'], 'CONV_2D', [], [],
                                           dict(op.options), src=op.src)
            c.inputs, c.outputs = [parts[j], wj, bj], [yj]
            if j:
                c.trains_with = getattr(op, 'trains_with', op)
            made.append(c)
        made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', outs, [y],
                             {'axis': 3, 'fused_activation_function': 'NONE'}, src=op.src))
        replace_op(g, op, made)
        done += 1
    return done


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
    w, done, made = dict(weights or {}), 0, {}

    def joined(ks, name, axis):
        if tuple(ks) in made:       # (parts several convs read: joined once)
            return made[tuple(ks)]
        made[tuple(ks)] = k = _joined(ks, name, axis)
        return k

    def _joined(ks, name, axis):
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
            k = made.get(('dw', op.inputs[1]))    # (one several convs read: joined once)
            if k is None:
                k = made[('dw', op.inputs[1])] = new_tensor(
                    g, wt.name[:-len(_AS_DW.format(G))], [wt.shape[3]] + wt.shape[1:3] + [1],
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
        renumber(g)
        done += 1
    return w, done
