"""Reading ONNX models into the host's graph IR (ir.Graph), and writing trained
weights back into the .onnx file.  Uses the `onnx` package only (no TensorFlow).

ONNX is NCHW; utrain's kernels are NHWC.  Every value has up to two IR tensors: its
ONNX layout ("plain") and, for a rank-4 activation, its NHWC layout.  Ops that need NHWC
(Conv, the pools, BatchNormalization on a feature map) ask for it, the others for the
plain one or whichever exists; where a value has only the other layout a TRANSPOSE is
emitted.  So the model's rank-4 input enters as ONNX has it and is transposed once,
right away; prepare's rewrite (transposes.hoist_input_transpose) moves that transpose into
the input, and prepare transposes the samples: data in the ONNX model's own layout just
works.  A Flatten/Reshape of an NHWC map that only a Gemm/MatMul reads permutes the
weight's columns instead of the map; the graph's output is always in ONNX's layout.

Each IR constant made from an ONNX initializer records how (``Graph.onnx_origin``:
IR tensor name -> ('plain', initializer, steps) | ('bn_scale', ...) | ('bn_shift', ...)),
so :func:`export_onnx` maps trained IR tensors back onto the initializers.  A
BatchNormalization becomes MUL by scale/sqrt(var+eps) and ADD of B - mean*scale (folded
into a frozen conv before it by prepare; trained as per-channel scale and shift
otherwise); export writes trained values back as scale' = s' sqrt(var+eps),
B' = b' + mean s' (mean and var unchanged), so ONNX computes what utrain trained.
LayerNormalization becomes tico's ops (MEAN, SUB, MUL, MEAN, ADD eps, RSQRT, MUL, MUL
scale, ADD bias).  Shape subgraphs (Shape, Gather, Concat, Unsqueeze, ...) are folded to
constants; Identity and Dropout are dropped.  Anything else is a ModelError naming the
node and the file.
"""
from __future__ import annotations

import os
import re

import numpy as np

from .ir import AGAIN, CONV3D_HINT, Graph, ModelError, Operator, Tensor, OP_CODES
from .onnx_rnn import RecurrentOps

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)
POS_IN_NHWC = (0, 3, 1, 2)       # NCHW axis a sits at NHWC axis POS_IN_NHWC[a]
# A rank-3 activation [N, C, L] (Conv1d's) has the NHWC twin [N, 1, L, C]: a 1-D
# convolution or pool runs as the 2-D one over a unit H axis.


def _pos(r):
    """IR axis of the NHWC twin where ONNX axis a of a rank-r (3 or 4) activation sits."""
    return POS_IN_NHWC if r == 4 else (0, 3, 2)


def _nhwc_shape(s):
    s = list(s)
    return [s[i] for i in NCHW_TO_NHWC] if len(s) == 4 else [s[0], 1, s[2], s[1]]


def _to4(s):
    """An ONNX [N, C, L] shape as the NCHW [N, C, 1, L] it is run as (rank 4 as is)."""
    s = list(s)
    return s if len(s) == 4 else [s[0], s[1], 1, s[2]]


def _twin_list(vals, fill):
    """Per-axis values of an ONNX rank-3/4 activation (begins, pads...) for its twin."""
    out = [fill] * 4
    for a, v in enumerate(vals):
        out[_pos(len(vals))[a]] = v
    return out

# comparisons of activations: a 1.0 / 0.0 mask (utrain.op_elem), no gradient; Not of
# one is the opposite comparison
_CMP = {'Equal': 'EQUAL', 'Less': 'LESS', 'Greater': 'GREATER', 'LessOrEqual': 'LESS_EQUAL',
        'GreaterOrEqual': 'GREATER_EQUAL'}
_NOT = {'EQUAL': 'NOT_EQUAL', 'NOT_EQUAL': 'EQUAL', 'LESS': 'GREATER_EQUAL',
        'GREATER_EQUAL': 'LESS', 'GREATER': 'LESS_EQUAL', 'LESS_EQUAL': 'GREATER'}


def _drop_qdq(graph) -> int:
    """A QDQ model's QuantizeLinear -> DequantizeLinear pairs of activations (onnxruntime's
    quantize_static writes one after each quantized op) taken out of graph in place, their
    readers reading the float activation (a pair ending the model: the op before it writes
    the output's name), or a Relu where the pair's range starts at 0 (the quantizer
    fuses a ReLU into the op before it, the pair's clamp at 0 doing its work): the model
    trains dequantized, its patterns (a Flatten read by a Gemm, a GELU) as the float
    model's.  Returns how many."""
    from onnx import numpy_helper
    inits = {t.name for t in graph.initializer}
    made = {o: n for n in graph.node for o in n.output}
    outs, ins = {o.name for o in graph.output}, {i.name for i in graph.input}
    done = 0
    for dq in list(graph.node):
        q = made.get(dq.input[0]) if dq.op_type == 'DequantizeLinear' and dq.input else None
        if q is None or q.op_type != 'QuantizeLinear' or q.input[0] in inits or \
                made.get(q.input[0]) is None and q.input[0] not in ins \
                or made.get(q.input[0]) is not None and made[q.input[0]].op_type == 'Constant':
            continue        # (a constant's pair: folded, its value the file's rounding)
        x, y = q.input[0], dq.output[0]
        zp = next((t for t in graph.initializer if len(q.input) > 2 and t.name == q.input[2]),
                  None)
        z = numpy_helper.to_array(zp) if zp is not None else np.zeros((), np.uint8)
        if z.size == 1 and int(z.reshape(-1)[0]) == np.iinfo(z.dtype).min:
            # (a range from 0: the pair clamps at 0, a ReLU the quantizer fused into the
            # op before it, its Relu node gone)
            dq.op_type = 'Relu'
            del dq.input[1:]
            dq.input[0] = x
            del dq.attribute[:]
            if not any(q.output[0] in n.input for n in graph.node):
                graph.node.remove(q)
            made = {o: n for n in graph.node for o in n.output}
            done += 1
            continue
        if y in outs:           # (the float value takes the output's name)
            if x in outs or x in ins:
                continue
            old, new = x, y
        else:
            old, new = y, x
        graph.node.remove(dq)
        if not any(q.output[0] in n.input for n in graph.node):
            graph.node.remove(q)
        for n in graph.node:
            for lst in (n.input, n.output):
                for j, v in enumerate(lst):
                    if v == old:
                        lst[j] = new
        made = {o: n for n in graph.node for o in n.output}
        done += 1
    return done


# onnxruntime's QOperator ops (quantize_static(quant_format=QOperator)), each the float op
# between its operands' dequantization and its output's quantization: {op: (float op,
# its quantized operands as (value, scale, zero point) input positions, the int32 bias'
# position (scale: the first two operands' scales multiplied) or None, the output's
# (scale, zero point) positions or None (a float output), attributes left out)}
_QOPS = {
    'QLinearConv': ('Conv', ((0, 1, 2), (3, 4, 5)), 8, (6, 7), ()),
    'QLinearMatMul': ('MatMul', ((0, 1, 2), (3, 4, 5)), None, (6, 7), ()),
    'QGemm': ('Gemm', ((0, 1, 2), (3, 4, 5)), 6, (7, 8), ()),
    'QLinearAdd': ('Add', ((0, 1, 2), (3, 4, 5)), None, (6, 7), ()),
    'QLinearMul': ('Mul', ((0, 1, 2), (3, 4, 5)), None, (6, 7), ()),
    'QLinearSigmoid': ('Sigmoid', ((0, 1, 2),), None, (3, 4), ()),
    'QLinearLeakyRelu': ('LeakyRelu', ((0, 1, 2),), None, (3, 4), ()),
    'QLinearSoftmax': ('Softmax', ((0, 1, 2),), None, (3, 4), ('opset',)),
    'QLinearAveragePool': ('AveragePool', ((0, 1, 2),), None, (3, 4), ('channels_last',)),
    'QLinearGlobalAveragePool': ('GlobalAveragePool', ((0, 1, 2),), None, (3, 4),
                                 ('channels_last',)),
    'QLinearReduceMean': ('ReduceMean', ((0, 1, 2),), None, (3, 4), ()),
}


_QOP_KEY = 'utrain.qoperator_ops'
# onnxruntime's contrib ops of a quantized model (quantize_dynamic's LSTM and attention,
# the optimizer's fusions of its ops): refused saying how to quantize without them
_ORT_QUANTIZED = ('DynamicQuantizeLSTM', 'DynamicQuantizeMatMul', 'MatMulIntegerToFloat',
                  'QAttention', 'QEmbedLayerNormalization', 'QOrderedMatMul')


def _qoperator_to_qdq(graph) -> int:
    """A QOperator model's integer ops (QLinearConv, QGemm, QLinearAdd, ...: _QOPS, and
    QLinearConcat) written in graph, in place, as the QDQ model's spelling of them:
    DequantizeLinear of each operand (a weight's per channel along its output axis, the
    int32 bias' at the product of the scales), the float op, QuantizeLinear of the output
    at its scale and zero point; a DequantizeLinear goes before any other node reading a
    quantized value (a MaxPool, a Flatten between QLinear ops) and one of a value that is
    float now becomes an Identity.  The model then reads as a QDQ model (_drop_qdq: it
    trains dequantized) and export writes the weights back into the QOperator file's
    integer initializers.  Returns how many integer ops."""
    from onnx import helper, numpy_helper
    inits = {t.name: t for t in graph.initializer}
    quant = {}          # quantized value -> (scale, zero point) names
    floats = set()      # values of the QOperator graph that are float now
    pre, out, done, k = [], [], 0, 0

    def uname(base):
        nonlocal k
        k += 1
        return f'{base}/qop{k}'

    def dq(v, sc, zp, axis=None):
        y = uname(v)
        # (a weight's first: the reader knows it a constant where the nodes before its
        # reader look ahead, a Flatten read only by a Gemm)
        (pre if v in inits else out).append(helper.make_node(
            'DequantizeLinear', [v, sc] + ([zp] if zp else []), [y], name=y,
            **({} if axis is None else {'axis': axis})))
        return y

    def const(base, arr):
        name = uname(base)
        graph.initializer.append(numpy_helper.from_array(arr, name))
        inits[name] = graph.initializer[-1]
        return name

    def scale(name):
        return numpy_helper.to_array(inits[name]).astype(np.float32) if name in inits else None

    for node in list(graph.node):
        ins = list(node.input)
        t = node.op_type
        if t == 'QuantizeLinear':
            quant[node.output[0]] = (ins[1], ins[2] if len(ins) > 2 else '')
            out.append(node)
            continue
        if t == 'DequantizeLinear':
            if ins[0] not in floats:
                out.append(node)
            else:           # (of a value a float op made of dequantized ones: as it is)
                out.append(helper.make_node('Identity', [ins[0]], list(node.output),
                                            name=node.name))
            continue
        if t == 'QLinearConcat':
            ys, yz = ins[0], ins[1]
            parts = [ins[j] if ins[j] in floats else dq(ins[j], ins[j + 1], ins[j + 2])
                     for j in range(2, len(ins), 3)]
            y = node.output[0]
            out.append(helper.make_node('Concat', parts, [y + '/float'], name=node.name,
                                        axis=int(_attrs(node).get('axis', 0))))
            out.append(helper.make_node('QuantizeLinear', [y + '/float', ys, yz], [y],
                                        name=uname(y)))
            quant[y] = (ys, yz)
            done += 1
            continue
        spec = _QOPS.get(t)
        if spec is None:
            new = [dq(v, *quant[v]) if v in quant else v for v in ins]
            if new != ins:      # (a MaxPool, a Flatten of a quantized value: of its float one)
                del node.input[:]
                node.input.extend(new)
                floats.update(node.output)
            elif any(v in floats for v in ins):
                floats.update(node.output)
            out.append(node)
            continue
        ft, qins, bias, yq, drop = spec
        a = _attrs(node)
        attrs = {n: v for n, v in a.items() if n not in drop}
        if t == 'QGemm':
            attrs.setdefault('beta', 1.0)
        new = []
        for p, (v, sc, zp) in enumerate(qins):
            x, xs = ins[v], ins[sc]
            xz = ins[zp] if zp < len(ins) else ''
            if x in floats:
                new.append(x)
                continue
            axis = None
            if x in inits and scale(xs) is not None and scale(xs).size > 1:
                nd = len(inits[x].dims)     # (a weight's scales per output channel)
                axis = 0 if ft == 'Conv' or (ft == 'Gemm' and a.get('transB')) else nd - 1
            new.append(dq(x, xs, xz, axis))
        if bias is not None and bias < len(ins) and ins[bias]:
            s0, s1 = scale(ins[qins[0][1]]), scale(ins[qins[1][1]])
            if s0 is None or s1 is None:
                raise ValueError(f'{node.name}: a bias whose scale is not a constant')
            bs = const(ins[bias] + '_scale', (s0.reshape(-1) * s1.reshape(-1)).astype(np.float32))
            new.append(dq(ins[bias], bs, '', 0 if np.size(scale(bs)) > 1 else None))
        y = node.output[0]
        has_y = yq is not None and yq[0] < len(ins) and ins[yq[0]]
        fy = y + '/float' if has_y else y
        out.append(helper.make_node(ft, new, [fy], name=node.name, **attrs))
        if has_y:
            yz = ins[yq[1]] if yq[1] < len(ins) else ''
            out.append(helper.make_node('QuantizeLinear', [fy, ins[yq[0]]] + ([yz] if yz else []),
                                        [y], name=uname(y)))
            quant[y] = (ins[yq[0]], yz)
        else:
            floats.add(y)
        done += 1
    if done:
        del graph.node[:]
        graph.node.extend(pre + out)
    return done


_DYN_KEY = 'utrain.dynamic_weights'


# ops that move a quantized value's integers as they are (onnxruntime's Direct8BitOp)
_DIRECT8 = ('Transpose', 'Reshape', 'Squeeze', 'Unsqueeze', 'Flatten', 'Gather', 'Slice',
            'Identity')


def _dynamic_to_float(graph) -> dict:
    """A model of onnxruntime's quantize_dynamic written in graph, in place, as the float
    model it was made of: each ConvInteger / MatMulInteger of a DynamicQuantizeLinear'd
    activation (the activation quantized at run time) and an int8 / uint8 weight,
    followed by its Cast to float and Mul by the product of the two scales, becomes
    the float Conv / MatMul of the activation and the weight's DequantizeLinear (at the
    scale that product takes from the file); the DynamicQuantizeLinear and the scales'
    Mul, read by nothing then, go.  (A MatMulInteger of two such activations: their
    MatMul.)  A quantized table (a Gather of an int8 / uint8 embedding, its rows kept
    integer through Transpose, Reshape... to a DequantizeLinear or an integer op) is read
    as the table's DequantizeLinear, the ops after it on floats.  An integer op not in
    that pattern is left as it is (the reader refuses it).  Returns (how many integer
    ops and tables, {weight initializer: (its scale initializer, its zero
    point initializer or '')}: export writes a moved weight back at scales recomputed as
    quantize_dynamic computes them, _requantized)."""
    from onnx import helper
    inits = {t.name: t for t in graph.initializer}
    made = {o: n for n in graph.node for o in n.output}
    readers = {}
    for n in graph.node:
        for v in n.input:
            readers.setdefault(v, []).append(n)

    def only(v, op, **at):
        r = readers.get(v, [])
        if len(r) != 1 or r[0].op_type != op or any(
                _attrs(r[0]).get(k) != w for k, w in at.items()):
            return None
        return r[0]

    # a quantized table (quantize_dynamic's Gather of an embedding): its integer rows go
    # through the Gather and the 8-bit ops after it (Transpose, Reshape...) to a
    # DequantizeLinear or an integer op; read as the table dequantized, those ops on
    # floats ({value: its table}, {table: (scale, zero point)} from a DequantizeLinear)
    chain, tsz = {}, {}
    for n in graph.node:
        if n.op_type == 'Gather' and n.input and n.input[0] in inits and \
                inits[n.input[0]].data_type in (2, 3):
            chain[n.output[0]] = n.input[0]
        elif n.op_type in _DIRECT8 and n.input and n.input[0] in chain:
            chain.update((o, chain[n.input[0]]) for o in n.output)
        elif n.op_type == 'DequantizeLinear' and n.input[0] in chain and \
                all(v in inits for v in n.input[1:] if v):
            tsz.setdefault(chain[n.input[0]], (n.input[1], n.input[2] if len(n.input) > 2 else ''))
    for v, t in chain.items():      # (each reader one of those, or an integer op)
        if any(r.op_type not in _DIRECT8 + ('DequantizeLinear', 'ConvInteger', 'MatMulInteger')
               for r in readers.get(v, [])) or v in {o.name for o in graph.output}:
            tsz.pop(t, None)
    weights, drop, before, done = {}, set(), {}, 0
    for node in list(graph.node):
        if node.op_type not in ('ConvInteger', 'MatMulInteger') or \
                node.domain not in ('', 'ai.onnx'):
            continue
        ins = list(node.input) + [''] * (4 - len(node.input))
        cast = only(node.output[0], 'Cast', to=1)
        mul = cast and only(cast.output[0], 'Mul')
        if mul is None:
            continue
        s = [v for v in mul.input if v != cast.output[0]]
        smul = made.get(s[0]) if len(s) == 1 else None
        if smul is None or smul.op_type != 'Mul':
            continue
        sides, scales = [], list(smul.input)
        for v, zp in ((ins[0], ins[2]), (ins[1], ins[3])):
            d = made.get(v)
            if d is not None and d.op_type == 'DynamicQuantizeLinear' and d.output[0] == v \
                    and zp in ('', d.output[2]) and d.output[1] in scales:
                scales.remove(d.output[1])
                sides.append(('act', d.input[0], None))
            elif chain.get(v) in tsz and tsz[chain[v]][0] in scales and \
                    zp == tsz[chain[v]][1]:
                scales.remove(tsz[chain[v]][0])     # (a table's rows: float now)
                sides.append(('act', v, None))
            elif v in inits and inits[v].data_type in (2, 3):      # (uint8, int8)
                sides.append(('w', v, zp))
            else:
                break
        ws = [sd for sd in sides if sd[0] == 'w']
        if len(sides) != 2 or len(ws) > 1 or len(scales) != len(ws) or \
                any(v not in inits for v in scales) or \
                any(zp and zp not in inits for _, _, zp in ws):
            continue
        new = []
        for kind, v, zp in sides:
            if kind == 'act':
                new.append(v)
                continue
            sc = scales[0]
            ssz = int(np.prod(inits[sc].dims)) if inits[sc].dims else 1
            if len(inits[sc].dims) > 1:
                break           # (a scale shaped to broadcast: left to the refusal)
            axis = {} if ssz == 1 else {
                'axis': 0 if node.op_type == 'ConvInteger' else len(inits[v].dims) - 1}
            y = f'{v}/dequantized'
            if y not in made:
                before.setdefault(id(node), []).append(helper.make_node(
                    'DequantizeLinear', [v, sc] + ([zp] if zp else []), [y], name=y, **axis))
                made[y] = before[id(node)][-1]
            weights[v] = (sc, zp)
            new.append(y)
        else:
            node.op_type = 'Conv' if node.op_type == 'ConvInteger' else 'MatMul'
            del node.input[:]
            node.input.extend(new)
            node.output[0] = mul.output[0]
            drop.update((id(cast), id(mul)))
            done += 1
    for n in graph.node:
        if n.op_type == 'Gather' and n.input[0] in tsz:
            t = n.input[0]
            sc, zp = tsz[t]
            y = f'{t}/dequantized'
            if y not in made:
                before.setdefault(id(n), []).append(helper.make_node(
                    'DequantizeLinear', [t, sc] + ([zp] if zp else []), [y], name=y))
                made[y] = before[id(n)][-1]
            weights[t] = (sc, zp)
            n.input[0] = y
            done += 1
        elif n.op_type == 'DequantizeLinear' and chain.get(n.input[0]) in tsz:
            n.op_type = 'Identity'      # (of a value float now)
            del n.input[1:]
    if not done:
        return 0, {}
    kept = [vi for vi in graph.value_info if vi.name not in chain]
    del graph.value_info[:]         # (the table's values: float now, not the file's type)
    graph.value_info.extend(kept)
    nodes = []
    for n in graph.node:
        if id(n) not in drop:
            nodes.extend(before.get(id(n), []) + [n])
    while True:     # (the DynamicQuantizeLinears and the scales' Muls no node reads now)
        read = {v for n in nodes for v in n.input} | {o.name for o in graph.output}
        dead = [n for n in nodes if n.op_type in ('DynamicQuantizeLinear', 'Mul')
                and not any(o in read for o in n.output)]
        if not dead:
            break
        nodes = [n for n in nodes if n not in dead]
    del graph.node[:]
    graph.node.extend(nodes)
    return done, weights


def _requantized(w, q0, zp0, axis):
    """The float weight w quantized as onnxruntime's quantize_dynamic quantizes a weight
    of the file's type, scheme and channels: the file's integer weight q0 and zero point
    zp0 (its scale and zero point along axis where they are per channel, else None) tell
    int8 or uint8, symmetric (zero point 0, or 128 for uint8) or not, and reduced range
    (the file's integers within [-64, 64], [0, 127]).  Returns (q, scale, zero point),
    the scale and zero point as the file's (one, or one per channel)."""
    q0, zp0 = np.asarray(q0), np.asarray(zp0)
    info = np.iinfo(q0.dtype)
    sym = bool(np.all(zp0 == (0 if info.min < 0 else 128)))
    reduced = bool(np.all(q0 >= -64) and np.all(q0 <= 64)) if info.min < 0 else \
        bool(np.all(q0 <= 127))
    if reduced:
        qmin, qmax = (-64, 64) if info.min < 0 else (0, 127)
    else:
        qmin, qmax = (-127, 127) if sym and info.min < 0 else (info.min, info.max)
    w = np.asarray(w, np.float64)
    red = tuple(a for a in range(w.ndim) if a != axis) if axis is not None else None
    rmin = np.minimum(w.min(axis=red, keepdims=True), 0)
    rmax = np.maximum(w.max(axis=red, keepdims=True), 0)
    if sym:
        rmax = np.maximum(-rmin, rmax)
        rmin = -rmax
    scale = ((rmax - rmin) / (qmax - qmin)).astype(np.float32).astype(np.float64)
    tiny = scale < np.finfo(np.float32).tiny
    scale = np.where(tiny, 1.0, scale)
    zp = np.round((qmin + qmax) / 2.0) * np.ones_like(scale) if sym else \
        np.round(qmin - rmin / scale)
    zp = np.where(tiny, 0, zp)
    q = np.clip(np.round(w / scale) + zp, qmin, qmax)
    return q.astype(q0.dtype), scale.reshape(-1 if axis is not None else ()), \
        zp.reshape(-1 if axis is not None else ()).astype(q0.dtype)


class _Node:
    """A node of the reader's own (an op written as another op's steps: ReduceMin's max)."""
    op_type = ''

    def __init__(self, output):
        self.output, self.input, self.name = output, [], output[0]


SUPPORTED = sorted({
    'Abs', 'Add', 'AveragePool', 'BatchNormalization', 'Ceil', 'Clip', 'Concat', 'Constant',
    'Cast (to float)', 'Celu', 'Conv', 'DepthToSpace', 'ConvTranspose', 'Div', 'Dropout', 'Elu', 'Exp', 'Log', 'Mish', 'Softplus', 'Erf (in GELU)', 'Expand', 'Flatten', 'GRU',
    'Gather', 'Gelu', 'Gemm', 'LogSoftmax (ending the model)', 'GlobalAveragePool', 'GlobalMaxPool', 'HardSigmoid',
    'HardSwish', 'Identity', 'Einsum (a matrix product)', 'InstanceNormalization', 'LSTM', 'LayerNormalization', 'LeakyRelu', 'MatMul', 'Max',
    'MaxPool', 'Mean', 'Min', 'Sum', 'Mul', 'Neg', 'PRelu', 'Pad', 'Pow', 'ReduceL2', 'ReduceMax', 'ReduceMean',
    'ReduceMin', 'Equal', 'Less', 'Greater', 'LessOrEqual', 'GreaterOrEqual', 'Not', 'Where',
    'ReduceSum', 'Relu', 'Reshape', 'Resize (nearest, integer scales)', 'Round', 'Floor',
    'Selu', 'Sigmoid', 'Sign',
    'Slice', 'Softmax', 'Softsign', 'Split', 'Sqrt', 'Squeeze', 'Sub', 'Tanh', 'Tile', 'Transpose',
    'Unsqueeze', 'Upsample (nearest, integer scales)'})


# ops refused with what to do instead (the device has no kernel they could be made of)
_QUANTIZED = ('an op of a model quantized by onnxruntime.quantization that utrain does not '
              'read: a QOperator op other than ' + ', '.join(sorted(_QOPS) + ['QLinearConcat'])
              + ', or an integer op of quantize_dynamic\'s outside its pattern (utrain reads '
              'a ConvInteger / MatMulInteger of a DynamicQuantizeLinear\'d activation and an '
              'int8 / uint8 weight, Cast to float, times the product of their scales; not '
              'an ONNX Runtime optimizer\'s fused DynamicQuantizeMatMul or MatMulIntegerToFloat): '
              'quantize_static (QDQ or QOperator) and quantize_dynamic train (dequantized) '
              'as onnxruntime.quantization writes them, or give utrain the '
              'float model from before quantizing it (quantize the exported model again '
              'after), or a full-integer .tflite for int8 training')
_RANDOM = ('a random draw (a stochastic policy\'s sampled action, a VAE\'s sample): utrain '
           'trains deterministic models: export the model without it (a Stable-Baselines3 '
           'policy: its deterministic action, the actor\'s mean; a VAE: the mean), or keep '
           'it beside another output, which utrain then trains alone')
_LABEL = ('it picks a class number (no gradient through it): export the model ending in its '
          'scores or probabilities (before the ArgMax; take the largest on the board), or keep '
          'it beside those as another output, which utrain then leaves out')
ADVICE = {op: _RANDOM for op in ('RandomNormal', 'RandomNormalLike', 'RandomUniform',
                                 'RandomUniformLike', 'Multinomial', 'Bernoulli')}
ADVICE.update({op: _LABEL for op in ('ArgMax', 'ArgMin', 'TopK')})
ADVICE.update({op: _QUANTIZED for op in (
    'DynamicQuantizeLinear', 'QuantizeLinear', 'DequantizeLinear', 'MatMulInteger',
    'ConvInteger', 'QLinearConv', 'QLinearMatMul', 'QLinearAdd', 'QLinearMul',
    'QGemm', 'DynamicQuantizeMatMul')})


def _onnx():
    try:
        import onnx
    except ImportError:           # pragma: no cover
        raise ModelError('onnx', 'reading .onnx models needs the onnx package '
                         '(pip install -r requirements.txt)') from None
    return onnx


def is_onnx(path) -> bool:
    return os.fspath(path).lower().endswith('.onnx')


# --------------------------------------------------------------------------- weight steps
# An IR constant is an initializer put through steps, each invertible:
# ('R', from_shape, to_shape), ('T', perm), ('cols', src) (IR[:, j] = W[:, src[j]]),
# ('scale', a), and first of all ('part', lo, hi): elements lo:hi of the flattened
# initializer (an RNN's W/R bias halves; export writes the part back into the whole).

def apply_steps(a, steps):
    a = np.asarray(a, np.float64)
    for s in steps:
        if s[0] == 'R':
            a = a.reshape(s[2])
        elif s[0] == 'T':
            a = a.transpose(s[1])
        elif s[0] == 'cols':
            a = a[:, s[1]]
        elif s[0] == 'scale':
            a = a * s[1]
        elif s[0] == 'part':
            a = a.reshape(-1)[s[1]:s[2]]
        elif s[0] == 'dq':          # DequantizeLinear of an int weight: (q - zero) * scale
            sc, zp = _along(s[1], a, s[3]), _along(s[2], a, s[3])
            a = (a - zp) * sc
    return a


def invert_steps(a, steps):
    a = np.asarray(a, np.float64)
    for s in reversed(steps):
        if s[0] == 'R':
            a = a.reshape(s[1])
        elif s[0] == 'T':
            a = a.transpose(np.argsort(s[1]))
        elif s[0] == 'cols':
            b = np.empty_like(a)
            b[:, s[1]] = a
            a = b
        elif s[0] == 'scale':
            a = a / s[1]
        elif s[0] == 'dq':          # ... back at the file's scales: rounded, clipped
            sc, zp = _along(s[1], a, s[3]), _along(s[2], a, s[3])
            a = np.clip(np.round(a / sc) + zp, s[4], s[5])
    return a


def _along(v, a, axis):
    """A DequantizeLinear's scale or zero point v (a scalar, or one a slice along axis)
    shaped to broadcast against a."""
    v = np.asarray(v, np.float64)
    if v.size == 1 or a.ndim == 0:
        return v.reshape(())
    shape = [1] * a.ndim
    shape[axis % a.ndim] = v.size
    return v.reshape(shape)


# --------------------------------------------------------------------------- folding

def _attrs(node):
    """{name: value} of node's attributes, strings (and lists of them) as str: protobuf
    hands them over as bytes (a byte the text cannot hold shows as U+FFFD in a message)."""
    from onnx import helper

    def text(v):
        if isinstance(v, bytes):
            return v.decode('utf-8', 'replace')
        if isinstance(v, list) and v and isinstance(v[0], bytes):
            return [text(u) for u in v]
        return v
    return {a.name: text(helper.get_attribute_value(a)) for a in node.attribute}


def _np_dtype(onnx_type):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(onnx_type)


def _slice(x, starts, ends, axes, steps):
    sl = [slice(None)] * x.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        sl[int(ax)] = slice(int(st), int(en), int(sp))
    return x[tuple(sl)]


def _fold(node, vals, a):
    """numpy value(s) of a node whose inputs are all constants, or None when the op is
    not one the shape subgraphs use."""
    t = node.op_type
    x = vals[0] if vals else None
    if t == 'DequantizeLinear':       # an int8 weight or int32 bias of a QDQ model
        zp = vals[2] if len(vals) > 2 else 0
        return apply_steps(x, [('dq', vals[1], zp, int(a.get('axis', 1)))]).astype(np.float32)
    if t == 'QuantizeLinear':         # (a QDQ model's constant operand)
        zp = np.asarray(vals[2]) if len(vals) > 2 else np.zeros((), np.uint8)
        q = np.iinfo(zp.dtype)
        return invert_steps(np.asarray(x, np.float64), [
            ('dq', vals[1], zp, int(a.get('axis', 1)), q.min, q.max)]).astype(zp.dtype)
    if t == 'Shape':
        s = np.array(x.shape, np.int64)
        return s[a.get('start', 0):a.get('end', None)]
    if t == 'Gather':
        return np.take(x, vals[1].astype(np.int64), axis=a.get('axis', 0))
    if t == 'Concat':
        return np.concatenate([np.asarray(v) for v in vals], axis=a['axis'])
    if t in ('Unsqueeze', 'Squeeze'):
        axes = a.get('axes') if len(vals) < 2 else [int(v) for v in vals[1]]
        if t == 'Squeeze':
            return np.squeeze(x, axis=tuple(axes) if axes is not None else None)
        out = x
        n = x.ndim + len(axes)
        for ax in sorted(v % n for v in axes):
            out = np.expand_dims(out, ax)
        return out
    if t == 'Cast':
        return x.astype(_np_dtype(a['to']))
    if t == 'Slice':
        if len(vals) >= 3:
            st, en = vals[1], vals[2]
            ax = vals[3] if len(vals) > 3 and vals[3] is not None else range(len(st))
            sp = vals[4] if len(vals) > 4 and vals[4] is not None else [1] * len(st)
        else:
            st, en = a['starts'], a['ends']
            ax, sp = a.get('axes', range(len(st))), [1] * len(st)
        return _slice(x, st, en, ax, sp)
    if t == 'Reshape':
        shape = [int(v) for v in vals[1]]
        shape = [x.shape[i] if v == 0 and not a.get('allowzero') else v
                 for i, v in enumerate(shape)]
        return x.reshape(shape)
    if t in ('Sum', 'Mean', 'Max', 'Min'):      # (any number of inputs, broadcast)
        f = {'Sum': np.add, 'Mean': np.add, 'Max': np.maximum, 'Min': np.minimum}[t]
        r = vals[0]
        for v in vals[1:]:
            r = f(r, v)
        return (r / len(vals) if t == 'Mean' else r).astype(np.result_type(*vals))
    ops = {'Add': np.add, 'Sub': np.subtract, 'Mul': np.multiply, 'Equal': np.equal,
           'Max': np.maximum, 'Min': np.minimum, 'Pow': np.power, 'Less': np.less,
           'Greater': np.greater}
    if t in ops:
        return ops[t](vals[0], vals[1]).astype(np.result_type(vals[0], vals[1])) \
            if t not in ('Equal', 'Less', 'Greater') else ops[t](vals[0], vals[1])
    if t == 'Div':
        if np.issubdtype(x.dtype, np.integer):
            return (x // vals[1]).astype(x.dtype)
        return (x / vals[1]).astype(x.dtype)
    if t == 'Mod':              # (nn.MultiheadAttention's TorchScript export, on shapes)
        return (np.fmod if a.get('fmod', 0) else np.mod)(x, vals[1]).astype(x.dtype)
    if t in ('Sqrt', 'Neg', 'Floor', 'Ceil', 'Abs', 'Reciprocal', 'Exp', 'Log'):
        f = {'Sqrt': np.sqrt, 'Neg': np.negative, 'Floor': np.floor, 'Ceil': np.ceil,
             'Abs': np.abs, 'Reciprocal': np.reciprocal, 'Exp': np.exp, 'Log': np.log}[t]
        return f(x).astype(x.dtype)
    if t in ('Identity', 'Dropout'):
        return x
    if t == 'ConstantOfShape':
        v = a.get('value')
        from onnx import numpy_helper
        fill = numpy_helper.to_array(v).reshape(-1)[0] if v is not None else np.float32(0)
        return np.full([int(d) for d in x], fill, dtype=np.asarray(fill).dtype)
    if t == 'Range':
        return np.arange(vals[0], vals[1], vals[2]).astype(vals[0].dtype)
    if t == 'Where':
        return np.where(vals[0], vals[1], vals[2])
    if t == 'Expand':
        return x * np.ones([int(d) for d in vals[1]], x.dtype)
    if t == 'Transpose':
        return x.transpose(a.get('perm'))
    if t == 'Split':            # a tuple: one value an output (_Reader.step)
        ax = int(a.get('axis', 0)) % x.ndim
        if len(vals) > 1 and vals[1] is not None:
            sizes = [int(v) for v in vals[1]]
        elif 'split' in a:
            sizes = [int(v) for v in a['split']]
        else:                   # opset 18's num_outputs (the last part the smaller)
            n = int(a.get('num_outputs', len(node.output)))
            sizes = [-(-x.shape[ax] // n)] * n
            sizes[-1] = x.shape[ax] - sum(sizes[:-1])
        return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=ax))
    if t == 'Clip':             # (F.normalize's eps floor of a weight's norm)
        lo = vals[1] if len(vals) > 1 and vals[1] is not None else a.get('min', -np.inf)
        hi = vals[2] if len(vals) > 2 and vals[2] is not None else a.get('max', np.inf)
        return np.clip(x, lo, hi).astype(x.dtype)
    if t in ('Relu', 'Sigmoid', 'Tanh', 'Softplus'):
        f = {'Relu': lambda v: np.maximum(v, 0), 'Sigmoid': lambda v: 1 / (1 + np.exp(-v)),
             'Tanh': np.tanh, 'Softplus': lambda v: np.logaddexp(0, v)}[t]
        return f(x).astype(x.dtype)
    if t in ('ReduceL2', 'ReduceMean', 'ReduceSumSquare'):
        f = {'ReduceL2': lambda v, **k: np.sqrt(np.sum(v * v, **k)), 'ReduceMean': np.mean,
             'ReduceSumSquare': lambda v, **k: np.sum(v * v, **k)}[t]
        axes = a.get('axes') if len(vals) < 2 or vals[1] is None else [int(v) for v in vals[1]]
        return f(x, axis=tuple(axes) if axes else None,
                 keepdims=bool(a.get('keepdims', 1))).astype(x.dtype)
    if t in ('ReduceProd', 'ReduceSum', 'ReduceMax', 'ReduceMin'):
        f = {'ReduceProd': np.prod, 'ReduceSum': np.sum, 'ReduceMax': np.max,
             'ReduceMin': np.min}[t]
        axes = a.get('axes') if len(vals) < 2 else [int(v) for v in vals[1]]
        return f(x, axis=tuple(axes) if axes else None,
                 keepdims=bool(a.get('keepdims', 1))).astype(x.dtype)
    return None


# --------------------------------------------------------------------------- reader

# ops on weights that export cannot map a trained value back through (not a reshape, a
# transpose or a cast): a weight computed by them on the host is frozen (_Reader.derived)
_NOT_INVERTED = ('Clip', 'ReduceL2', 'ReduceMean', 'ReduceSumSquare', 'Sqrt', 'Div', 'Max',
                 'Sum', 'Mean',
                 'Min', 'Relu', 'Sigmoid', 'Tanh', 'Softplus', 'Exp', 'Log', 'Abs',
                 'Reciprocal', 'Expand')

# ops that only select or reshape their first input: a zero initializer read only by them
# is a state, not a parameter (_Reader.run)
_STATE_READERS = ('Split', 'Squeeze', 'Unsqueeze', 'Reshape', 'Expand', 'Slice', 'Gather',
                  'Identity', 'Flatten', 'Tile')

class _Reader(RecurrentOps):
    def __init__(self, path, model):
        self.path = os.fspath(path)
        self.model = model
        self.qdq_pairs = _drop_qdq(model.graph)
        self.tensors: list[Tensor] = []
        self.ops: list[Operator] = []
        self.const: dict[str, np.ndarray] = {}      # ONNX value -> constant (ONNX layout)
        self.inits: set = set()                      # names of initializers
        self.cnodes: set = set()    # float tensors a Constant node holds (torch's opset-17
        #                             LayerNorm without affine: its ones and zeros); a
        #                             weight made of one: export writes it into the node
        self.shape: dict[str, list] = {}             # activation -> ONNX shape
        self.plain: dict[str, int] = {}              # activation -> IR tensor, ONNX layout
        self.nhwc: dict[str, int] = {}               # rank-4 activation -> IR tensor, NHWC
        self.colperm: dict[str, int] = {}            # flattened NHWC map -> (IR tensor, src)
        self.seq: dict[str, tuple] = {}              # an RNN's Y -> (IR tensor per step, time axis)
        self.reshaped: dict[str, tuple] = {}         # constant -> (initializer, steps): a
        #                                              reshape of it folded (export maps back)
        self.origin: dict[str, tuple] = {}
        self.shared: dict = {}      # (initializer, steps, dtype, shape): its IR tensor
        self.fills: set = set()     # constants made of no weight: a ConstantOfShape's fill
        #                             and what is folded from fills and shapes alone
        self.consumers: dict[str, list] = {}
        # a QDQ model's: activations a QuantizeLinear made, int weights dequantized
        self.quantized, self.qdq_weights = set(), 0
        # a quantize_dynamic model's: (integer ops, {int weight: (scale, zero point)})
        import json
        self.dynamic = next((json.loads(p.value) for p in model.metadata_props
                             if p.key == _DYN_KEY), (0, {}))
        self.left: dict = {}        # outputs of the node read that it leaves out -> why
        self.softmaxed: set = set()     # values a LinearClassifier's SOFTMAX made
        self.names: set = set()
        self.node = None
        # constants folded from initializers through ops export cannot map a trained value
        # back through (F.normalize of a cosine classifier's weight): value -> (its
        # initializers, the ops): frozen, and prepare says so (pipeline.dropped_outputs)
        self.derived: dict = {}
        self.computed_frozen: list = []

    # ---- errors and tensors
    def err(self, msg):
        n = self.node
        where = f'node {n.name or "(unnamed)"} ({n.op_type}): ' if n is not None else ''
        raise ModelError(self.path, where + msg)

    def _uname(self, name):
        base, i = name or 't', 1
        while name in self.names or not name:
            name = f'{base}_{i}'
            i += 1
        self.names.add(name)
        return name

    def tensor(self, name, shape, data=None, dtype='float32'):
        if data is not None:
            data = np.ascontiguousarray(data)
            dtype = data.dtype.name
        t = Tensor(len(self.tensors), self._uname(name), [int(s) for s in shape], dtype,
                   data, -1)
        self.tensors.append(t)
        return t.index

    def const_tensor(self, name, value, init=None, steps=(), dtype=np.float32):
        """An IR constant of value (made from initializer init by steps, for export).  An
        initializer several nodes read the same way (a layer applied again: an unrolled
        RNN's steps, tied weights) is one IR tensor, one parameter as in the model: a
        tensor each would train apart and export could write back only one of them."""
        v = np.asarray(value, dtype=dtype)
        if init is None and name in self.reshaped:      # e.g. Unsqueeze(gn.weight)
            init, pre = self.reshaped[name]
            steps = pre + list(steps)
        elif init is None and name in self.cnodes:
            init = name         # (a Constant node's tensor: export writes the node's)
        key = (init, repr(list(steps)), v.dtype.str, v.shape) if init is not None else None
        if key in self.shared:
            k = self.shared[key]
            if np.array_equal(self.tensors[k].data, v):
                return k
        k = self.tensor(name, v.shape, v)
        if init is not None:
            self.shared[key] = k
            self.origin[self.tensors[k].name] = ('plain', init, list(steps))
        elif name in self.fills:
            # (a fill of a run-time shape, an SB3 policy's ones_like times exp(log_std):
            # no weight of the model's maker, frozen as a folded FILL is in a .tflite)
            self.tensors[k].frozen = True
        elif name in self.derived:
            self.tensors[k].frozen = True
            inits, ops = self.derived[name]
            self.computed_frozen.append((self.tensors[k].name, sorted(inits), ops))
        elif name in self.const and name not in self.inits and v.dtype.kind == 'f':
            self.origin[self.tensors[k].name] = ('computed', name)
        return k

    def init_const(self, name, v, steps):
        """An IR constant made from ONNX constant v by weight steps (mapped back on export)."""
        return self.const_tensor(name, apply_steps(self.const[v], steps),
                                 v if v in self.inits else None, steps)

    def emit(self, name, inputs, outputs, **options):
        op = Operator(len(self.ops), OP_CODES[name], name, list(inputs), list(outputs),
                      options, src=len(self.ops))
        op.onnx = self.node.name if self.node is not None else None
        self.ops.append(op)
        return op

    # ---- layouts
    def oshape(self, v):
        if v not in self.shape:
            self.err(f'the shape of {v!r} is not known (give the model static shapes, '
                     'e.g. export it with a fixed input size)')
        return self.shape[v]

    def get(self, v, layout='plain'):
        """IR tensor of activation v in layout 'plain' (ONNX's), 'nhwc', or 'any'."""
        if v in self.colperm:
            self.err(f'{v!r} is a flattened NHWC map that only a Gemm/MatMul can read here')
        if v in self.seq and v not in self.plain:
            self._seq_materialize(v)
        if layout == 'any':
            layout = 'nhwc' if v in self.nhwc else 'plain'
        if layout == 'plain':
            if v not in self.plain:
                src = self.nhwc[v]
                s = self.oshape(v)
                out = self.tensor(v, s)
                if len(s) == 3:         # [N, 1, L, C] -> [N, L, C] -> [N, C, L]
                    src = self.reshape_to(src, [s[0], s[2], s[1]], v + '/nlc')
                    self.emit('TRANSPOSE', [src, self.perm_const(v, (0, 2, 1))], [out])
                else:
                    self.emit('TRANSPOSE', [src, self.perm_const(v, NHWC_TO_NCHW)], [out])
                self.plain[v] = out
            return self.plain[v]
        if v not in self.nhwc:
            s = self.oshape(v)
            if len(s) not in (3, 4):
                self.err(f'{v!r} has shape {s}; this op needs a 4-D NCHW (or 3-D NCL) tensor')
            out = self.tensor(v + '/nhwc', _nhwc_shape(s))
            if len(s) == 3:             # [N, C, L] -> [N, L, C] -> [N, 1, L, C]
                t = self.tensor(v + '/nlc', [s[0], s[2], s[1]])
                self.emit('TRANSPOSE', [self.plain[v], self.perm_const(v, (0, 2, 1))], [t])
                self.reshape_to(t, _nhwc_shape(s), out=out)
            else:
                self.emit('TRANSPOSE', [self.plain[v], self.perm_const(v, NCHW_TO_NHWC)],
                          [out])
            self.nhwc[v] = out
        return self.nhwc[v]

    def reshape_to(self, x, shape, name=None, out=None):
        """A RESHAPE of IR tensor x to shape (into out, or a new tensor); returns it."""
        shape = [int(n) for n in shape]
        if out is None:
            out = self.tensor(name or self.tensors[x].name + '/r', shape)
        k = self.tensor(self.tensors[out].name + '/shape', [len(shape)],
                        np.array(shape, np.int32))
        self.emit('RESHAPE', [x, k], [out], new_shape=shape)
        return out

    def perm_const(self, v, perm):
        return self.tensor(v + '/perm', [len(perm)], np.array(perm, np.int32))

    def out(self, v, layout='plain', shape=None):
        """A new IR tensor for ONNX output v in layout."""
        s = list(shape if shape is not None else self.oshape(v))
        self.shape.setdefault(v, s)
        if layout == 'nhwc':
            k = self.tensor(v + '/nhwc', _nhwc_shape(s))
            self.nhwc[v] = k
        else:
            k = self.tensor(v, s)
            self.plain[v] = k
        return k

    def alias(self, dst, src):
        for m in (self.plain, self.nhwc, self.colperm, self.const, self.seq):
            if src in m:
                m[dst] = m[src]
        if src in self.shape:
            self.shape[dst] = self.shape[src]

    def _no_param(self, v) -> bool:
        """Constant v is no parameter of the model's maker: a fill (ConstantOfShape, a zero
        state) or integers (shapes, axes, indices)."""
        return v in self.fills or np.asarray(self.const[v]).dtype.kind in 'iub'

    def cval(self, v, what):
        if v not in self.const:
            self.err(f'{what} ({v!r}) must be a constant')
        return self.const[v]

    # ---- the graph
    def run(self):
        g = self.model.graph
        from onnx import numpy_helper
        for init in g.initializer:
            self.const[init.name] = numpy_helper.to_array(init)
            self.inits.add(init.name)
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            s = _static_shape(vi)
            if s is not None:
                self.shape[vi.name] = s
        self.nodes = list(g.node)
        for node in self.nodes:
            for i in node.input:
                self.consumers.setdefault(i, []).append(node)
        for name in self.inits:
            # all zeros and read only to be split, sliced or reshaped: an initial state
            # (torch.zeros in forward, lifted to an initializer by the dynamo exporter), no
            # parameter; a parameter (a zero bias) is read by the op it belongs to
            c = self.consumers.get(name)
            if c and all(n.op_type in _STATE_READERS and n.input[0] == name for n in c) and \
                    np.asarray(self.const[name]).dtype.kind == 'f' and \
                    not np.any(self.const[name]):
                self.fills.add(name)
        inputs = [vi for vi in g.input if vi.name not in self.const]
        for vi in inputs:
            s = _static_shape(vi, batch1=True)
            if s is None:
                raise ModelError(self.path, _open_shape(vi))
            et = vi.type.tensor_type.elem_type
            cons = self.consumers.get(vi.name, [])
            if et in (6, 7) and cons and all(n.op_type == 'Gather' and list(n.input).index(vi.name) == 1
                                             for n in cons):
                et = 1                  # int32 / int64 ids of an embedding: floats here
            if et != 1:
                raise ModelError(self.path, f'input {vi.name!r} is not float32 (ONNX type {et}); '
                                 'utrain reads integer inputs only as the ids of an '
                                 'embedding (Gather of a table)')
            self.shape[vi.name] = s
            self.plain[vi.name] = self.tensor(vi.name, s)
        self.skip = set()
        # values made by a node utrain cannot read, and those made from them: an output
        # that needs one is left out where another can be read (a stochastic policy's
        # sampled action beside its value head, a label's ArgMax beside the scores)
        dead, first = {}, None      # {value: the ModelError of the node it needs}
        for i, node in enumerate(self.nodes):
            if i in self.skip:
                continue
            self.node = node
            e = next((dead[v] for v in node.input if v in dead), None)
            if e is None:
                n_ops = len(self.ops)
                try:
                    self.step(i, node)
                    dead.update(self.left)      # (a LinearClassifier's class label)
                    self.left.clear()
                    continue
                except ModelError as err:
                    self.left.clear()
                    del self.ops[n_ops:]
                    first, e = first or err, err
            dead.update((o, e) for o in node.output)
        self.node = None
        live = [vi for vi in g.output if vi.name not in dead]
        if not live and first is not None:
            raise first
        self.dropped = [(vi.name, dead[vi.name].message) for vi in g.output if vi.name in dead]
        outs, passed = [], []
        for vi in live:
            if vi.name in self.const:
                # (had said what, not what to do)
                raise ModelError(self.path, f'output {vi.name!r} is a constant (no node '
                                 'computes it; an exporter folded it): export the model '
                                 'without that output, with the ones its nodes compute')
            k = self.get(vi.name, 'plain')
            src = next((v.name for v in inputs if self.plain.get(v.name) == k), None)
            if src is not None:     # (Godot RL Agents' state_ins -> state_outs)
                passed.append((vi.name, src))
                continue
            outs.append(k)
        if passed and not outs:
            raise ModelError(self.path, f'output {passed[0][0]!r} is the input')
        self.dropped += [(name, f'it is input {src!r} passed through (Identity: a recurrent '
                                'state\'s placeholder), nothing to train')
                         for name, src in passed]
        self.unread = []
        if self.dropped:        # (the ops only the outputs left out read: none to train)
            need, kept = set(outs), []
            for op in reversed(self.ops):
                if need.intersection(op.outputs):
                    need.update(k for k in op.inputs if k >= 0)
                    kept.append(op)
            self.ops[:] = kept[::-1]
            for j, op in enumerate(self.ops):
                op.index = j
            # (an input only those outputs read: the run has none of it; evaluate feeds
            # ONNX Runtime zeros for it)
            self.unread = [v.name for v in inputs if self.plain[v.name] not in need]
            inputs = [v for v in inputs if v.name not in self.unread]
            if not inputs:
                raise ModelError(self.path, 'no output left that reads an input')
        opset = max((o.version for o in self.model.opset_import if o.domain in ('', 'ai.onnx')),
                    default=0)
        gr = Graph(path=self.path, identifier=b'CIR0', version=3,
                   description=f'ONNX opset {opset} ({self.model.producer_name} '
                               f'{self.model.producer_version}) read by utrain',
                   tensors=self.tensors, ops=self.ops,
                   inputs=[self.plain[vi.name] for vi in inputs], outputs=outs, metadata={},
                   n_subgraphs=1)
        gr.onnx_origin = self.origin
        # [(output name, why)]: outputs left out, each needing a node utrain cannot read
        gr.onnx_dropped = self.dropped
        gr.onnx_computed_frozen = self.computed_frozen
        gr.onnx_unread = self.unread       # inputs only those outputs read
        gr.onnx_qdq = (self.qdq_pairs + len(self.quantized), self.qdq_weights)   # (QDQ pairs, int weights)
        gr.onnx_qop = next((int(p.value) for p in self.model.metadata_props
                            if p.key == _QOP_KEY), 0)     # (QOperator ops read as QDQ)
        gr.onnx_dynamic = self.dynamic[0]   # (quantize_dynamic's integer ops read as float)
        # the file's names of outputs another tensor stands for (a ZipMap's, skl2onnx's
        # 'output_probability': the probabilities it wraps): --output takes them too (it
        # had refused the name the file, ONNX Runtime and skl2onnx give, listing others)
        gr.output_names = {vi.name: self.get(vi.name, 'plain') for vi in live
                           if vi.name not in dict(passed)
                           and self.tensors[self.get(vi.name, 'plain')].name != vi.name}
        # the file's outputs by place, as ONNX Runtime and Netron list them (those left
        # out too): --output takes a place of the file's where utrain's count differs
        gr.file_outputs = [vi.name for vi in g.output]
        # the class labels a label output picks from by the probabilities' place
        # (skl2onnx: ArgMax, then ArrayFeatureExtractor of its classes), where they are not
        # those places: validate.class_labels
        gr.onnx_classes = None
        for node in self.nodes:
            if node.op_type == 'ArrayFeatureExtractor' and node.input[0] in self.const:
                c = np.asarray(self.const[node.input[0]]).ravel()
                if c.dtype.kind in 'iu' and not np.array_equal(c, np.arange(len(c))):
                    gr.onnx_classes = [int(v) for v in c]
        return gr

    def step(self, i, node):
        t = node.op_type
        a = _attrs(node)
        ins = list(node.input)
        if node.domain == 'ai.onnx.ml' and t == 'ZipMap':
            # (skl2onnx's MLPClassifier: its probabilities as {class: p} maps; the tensor
            # it reads is the output trained, export keeps the ZipMap, evaluate scores that)
            self.alias(node.output[0], ins[0])
            return
        if node.domain == 'ai.onnx.ml' and hasattr(self, 'ml_' + t):
            getattr(self, 'ml_' + t)(node, ins, a, i)
            return
        if node.domain == 'ai.onnx.ml':
            self.err(f'operator domain \'ai.onnx.ml\' is not supported: {t} is a classical '
                     'machine-learning model\'s (scikit-learn through skl2onnx: trees, SVMs, '
                     'encoders), not a neural network\'s layer; of that domain utrain reads '
                     'the linear models (LinearRegressor, LinearClassifier), Scaler, '
                     'Normalizer and ZipMap; else train a neural network on the same features '
                     '(Keras, PyTorch, or scikit-learn\'s MLPClassifier / MLPRegressor) and '
                     'give utrain its .tflite or .onnx')
        if node.domain == 'com.microsoft' and t in _ORT_QUANTIZED:
            self.err(f'{t} is an ONNX Runtime contrib op (domain com.microsoft) that '
                     'quantize_dynamic writes for an LSTM or an attention layer (or ONNX '
                     'Runtime\'s optimizer fuses into a saved model): utrain reads '
                     'quantize_dynamic\'s standard ops (DynamicQuantizeLinear, MatMulInteger, '
                     'ConvInteger, a quantized Gather); quantize the float model with '
                     'quantize_dynamic(..., op_types_to_quantize=[\'MatMul\', \'Conv\', '
                     '\'Gather\']) (its LSTM or attention kept float), or give utrain the '
                     'float model')
        if node.domain not in ('', 'ai.onnx'):
            self.err(f'operator domain {node.domain!r} is not supported')
        if t == 'Constant':
            from onnx import numpy_helper
            if 'value' in a:
                self.const[node.output[0]] = numpy_helper.to_array(a['value'])
                if self.const[node.output[0]].dtype.kind == 'f':
                    self.cnodes.add(node.output[0])
            elif 'value_float' in a:
                self.const[node.output[0]] = np.array(a['value_float'], np.float32)
            elif 'value_int' in a:
                self.const[node.output[0]] = np.array(a['value_int'], np.int64)
            elif 'value_floats' in a:
                self.const[node.output[0]] = np.array(a['value_floats'], np.float32)
            elif 'value_ints' in a:
                self.const[node.output[0]] = np.array(a['value_ints'], np.int64)
            else:
                self.err('unsupported Constant attribute')
            return
        present = [v for v in ins if v]
        if t == 'Shape' and ins[0] not in self.const:
            s = np.array(self.oshape(ins[0]), np.int64)
            self.const[node.output[0]] = s[a.get('start', 0):a.get('end', None)]
            return
        if present and all(v in self.const for v in present):
            vals = [self.const[v] if v else None for v in ins]
            # a product with a zero state (no parameter): zeros, whatever the other factor
            # (a weight's gradient through it is 0 too): an unrolled RNN's first step
            zero = any(v in self.fills and not np.any(self.const[v]) for v in present)
            zero_fill = t in ('MatMul', 'Mul') and zero
            if t == 'Add' and len(present) == 2 and zero and \
                    np.size(np.add(*vals)) == max(np.size(v) for v in vals):
                zero_fill = None    # (x + 0 and no broadcast: x, a weight's steps kept)
            r = (np.zeros_like(np.matmul(*vals) if t == 'MatMul' else vals[0] * vals[1])
                 if zero_fill else _fold(node, vals, a))
            if r is None:
                self.err(f'utrain cannot read ONNX op {t}: {ADVICE[t]}' if t in ADVICE
                         else 'cannot fold this op on constants')
            if isinstance(r, tuple):    # (Split: a value an output)
                fill = all(self._no_param(u) for u in present)
                src, lo = ins[0], 0
                whole = src in self.inits and all(
                    d == 1 for d in np.shape(self.const[src])[:int(a.get('axis', 0)) %
                                                              np.ndim(self.const[src])])
                for o, part in zip(node.output, r):
                    self.const[o] = np.asarray(part)
                    if fill:
                        self.fills.add(o)
                    elif whole:         # a run of the initializer's elements (export: back)
                        self.reshaped[o] = (src, [('part', lo, lo + part.size),
                                                  ('R', [part.size], list(part.shape))])
                    lo += part.size
                return
            self.const[node.output[0]] = np.asarray(r)
            if t == 'ConstantOfShape' or all(self._no_param(v) for v in present) or \
                    zero_fill:
                self.fills.add(node.output[0])     # (torch.ones_like(x): no parameter)
            elif t in _NOT_INVERTED or any(v in self.derived for v in present):
                inits, ops = set(), [t]
                for v in present:
                    if v in self.derived:
                        inits |= self.derived[v][0]
                        ops = self.derived[v][1] + [o for o in ops if o not in self.derived[v][1]]
                    elif (v in self.inits or v in self.reshaped) and \
                            np.asarray(self.const[v]).dtype.kind == 'f' and \
                            np.size(self.const[v]) > 1:     # (not a scalar bound, a shape)
                        inits.add(v if v in self.inits else self.reshaped[v][0])
                if inits:
                    self.derived[node.output[0]] = (inits, ops)
            src = ins[0] if ins else None
            if zero_fill is None:       # (x + 0, a zero state's: x as it is)
                src = next((v for v in present if v not in self.fills), None)
            if t == 'DequantizeLinear' and src in self.inits and src == ins[0]:
                # an int weight of a QDQ model: trains dequantized, export writes it back
                # at the file's scales (rounded, clipped to its type)
                q = np.iinfo(np.asarray(self.const[src]).dtype)
                zp = self.const[ins[2]] if len(ins) > 2 and ins[2] else 0
                # (a quantize_dynamic model's: the names of its scale and zero point,
                # which export recomputes for a moved weight)
                self.reshaped[node.output[0]] = (src, [('dq', np.asarray(self.const[ins[1]]),
                                                        np.asarray(zp), int(a.get('axis', 1)),
                                                        q.min, q.max)
                                                       + tuple(self.dynamic[1].get(src, ()))])
                self.qdq_weights += 1
                return
            if t in ('Unsqueeze', 'Squeeze', 'Reshape', 'Flatten', 'Identity', 'Transpose',
                     'Add', 'Cast') and (src in self.inits or src in self.reshaped) and \
                    src not in self.fills and (t != 'Add' or zero_fill is None) and \
                    (t != 'Cast' or a.get('to') == 1):
                # a weight reshaped, transposed or cast to float32 by nodes (a dynamo
                # export's Transpose(weight) into a MatMul; a float16 weight's Cast): the
                # steps export maps back by (it writes the initializer's own type)
                init, pre = (src, []) if src in self.inits else self.reshaped[src]
                self.reshaped[node.output[0]] = (init, pre + (
                    [('T', list(a.get('perm', range(np.ndim(self.const[src]))[::-1])))]
                    if t == 'Transpose' else
                    [('R', list(np.shape(self.const[src])), list(np.shape(r)))]))
            return
        if ins and ins[0] in self.seq and ins[0] not in self.plain and self._seq_op(node, ins, a):
            return
        h = getattr(self, 'op_' + t, None)
        if h is None:
            if t in ADVICE:
                self.err(f'utrain cannot read ONNX op {t}: {ADVICE[t]}')
            self.err(f'utrain cannot read ONNX op {t}; supported: {", ".join(SUPPORTED)}')
        h(node, ins, a, i)

    # ---- scikit-learn's linear models (skl2onnx, domain ai.onnx.ml): a layer whose weights
    # are the node's attributes (export writes them back there: origin 'attr')
    def _ml_fc(self, node, i, x, W, b, tied=False, out=None):
        """FULLY_CONNECTED of ONNX value x by W [out, F] and b [out] read from node i's
        attributes 'coefficients' and 'intercepts' (tied: the file holds [-W; W] and
        [-b; b], the two classes of a binary logistic regression), into ONNX value out (else
        a tensor of its own); returns the IR tensor."""
        xk = self.get(x, 'plain')
        xs = self.tensors[xk].shape
        if len(xs) != 2 or xs[1] != W.shape[1]:
            self.err(f'{W.shape[0] * (1 + tied)} x {W.shape[1]} coefficients for an input of '
                     f'shape {xs}: the file is damaged; convert the model again')
        how = 'tied' if tied else 'rows'
        wk = self.const_tensor(node.output[-1] + '/coefficients', W)
        bk = self.const_tensor(node.output[-1] + '/intercepts', b)
        self.origin[self.tensors[wk].name] = ('attr', i, 'coefficients', how)
        self.origin[self.tensors[bk].name] = ('attr', i, 'intercepts', how)
        out = self.out(out, 'plain', [xs[0], W.shape[0]]) if out else \
            self.tensor(node.output[-1] + '/scores', [xs[0], W.shape[0]])
        self.emit('FULLY_CONNECTED', [xk, wk, bk], [out], fused_activation_function='NONE',
                  keep_num_dims=False)
        return out

    def _ml_weights(self, a, n_out=None):
        W = np.asarray(a.get('coefficients', []), np.float32)
        b = np.asarray(a.get('intercepts', []), np.float32)
        n = n_out or len(b) or 1
        if not W.size or W.size % n or (b.size and b.size != n):
            self.err(f'{W.size} coefficients and {b.size} intercepts do not make {n} rows: the '
                     'file is damaged; convert the model again')
        return W.reshape(n, -1), (b if b.size else np.zeros(n, np.float32))

    def _ml_post(self, a, allowed):
        pt = str(a.get('post_transform', 'NONE'))
        if pt not in allowed:
            self.err(f'post_transform {pt} is not supported here (only {", ".join(allowed)})')
        return pt

    def ml_LinearRegressor(self, node, ins, a, i):
        """scikit-learn's LinearRegression / Ridge / ... through skl2onnx: Y = X W^T + b."""
        self._ml_post(a, ('NONE',))
        W, b = self._ml_weights(a, int(a.get('targets', 1)))
        self._ml_fc(node, i, ins[0], W, b, out=node.output[0])

    def ml_LinearClassifier(self, node, ins, a, i):
        """scikit-learn's LogisticRegression (and the other linear classifiers) through
        skl2onnx: scores X W^T + b, then its post_transform: SOFTMAX (multinomial), NONE
        (decision scores), or LOGISTIC of a binary model, whose two rows are one
        negated (P(0) = 1 - P(1)): read as p = sigmoid(w x + b) and Concat(1 - p, p), which
        trains p with bce (formats.ir.drop_two_class_sigmoid).  The class label output (an
        ArgMax of the scores) is left out, as a label's ArgMax is."""
        labels = a.get('classlabels_ints', a.get('classlabels_strings', []))
        W, b = self._ml_weights(a)
        pt = self._ml_post(a, ('NONE', 'SOFTMAX', 'LOGISTIC'))
        if len(labels) != W.shape[0]:
            self.err(f'{W.shape[0]} rows of coefficients for {len(labels)} classes (a binary '
                     'model of one row) is not supported: convert it with the rows of both '
                     'classes (skl2onnx writes them for LogisticRegression)')
        z = node.output[1] if len(node.output) > 1 else ''
        label = node.output[0]
        self.left[label] = ModelError(self.path, f'node {node.name or "(unnamed)"} ('
                                      f'{node.op_type}): its class label {label!r} is the '
                                      'largest of its scores (no gradient through it): utrain '
                                      f'trains the scores, {z!r}')
        if not z:
            self.err('it has no scores output, only the class label: ' + _LABEL)
        n = self.tensors[self.get(ins[0], 'plain')].shape[0]
        if pt == 'LOGISTIC':
            if W.shape[0] != 2 or not (np.allclose(W[0], -W[1]) and np.allclose(b[0], -b[1])):
                self.err('post_transform LOGISTIC of more than two classes (one-vs-rest) is '
                         'not supported: convert LogisticRegression(multi_class='
                         '\'multinomial\') (SOFTMAX), the scikit-learn default since 1.5')
            s = self._ml_fc(node, i, ins[0], W[1:], b[1:], tied=True)
            p = self._ir('LOGISTIC', [s], z + '[:, 1]')     # (P(1), the column evaluate scores)
            q = self._ir('SUB', [self._scalar(z + '/one', 1.0), p], z + '/1-p', [n, 1])
            self.emit('CONCATENATION', [q, p], [self.out(z, 'plain', [n, 2])], axis=1,
                      fused_activation_function='NONE')
            return
        if pt == 'NONE':
            self._ml_fc(node, i, ins[0], W, b, out=z)
            return
        s = self._ml_fc(node, i, ins[0], W, b)
        self.emit('SOFTMAX', [s], [self.out(z, 'plain', [n, W.shape[0]])], beta=1.0)
        self.softmaxed.add(z)

    def ml_Normalizer(self, node, ins, a, i):
        """skl2onnx's L1 normalisation of a LogisticRegression's softmax: the same values."""
        norm = str(a.get('norm', 'MAX'))
        if norm != 'L1' or ins[0] not in self.softmaxed:
            self.err(f'a {norm} Normalizer is supported only as skl2onnx writes it after a '
                     'softmax (L1: the same probabilities)')
        self.alias(node.output[0], ins[0])
        self.softmaxed.add(node.output[0])

    def ml_Scaler(self, node, ins, a, i):
        """scikit-learn's StandardScaler / MinMaxScaler through skl2onnx: (X - offset) *
        scale, frozen (the statistics of the data it was fit on, no weights to train)."""
        x = self.get(ins[0], 'plain')
        xs = self.tensors[x].shape
        sc = np.asarray(a.get('scale', [1.0]), np.float32)
        off = np.asarray(a.get('offset', [0.0]), np.float32)
        if sc.size not in (1, xs[-1]) or off.size not in (1, xs[-1]):
            self.err(f'scale {sc.size} and offset {off.size} for {xs[-1]} features')
        y = node.output[0]
        k1 = self.tensor(y + '/scale', [xs[-1]], np.broadcast_to(sc, [xs[-1]]).copy())
        k2 = self.tensor(y + '/shift', [xs[-1]], np.broadcast_to(-off * sc, [xs[-1]]).copy())
        self.tensors[k1].frozen = self.tensors[k2].frozen = True
        m = self._ir('MUL', [x, k1], y + '/scaled')
        self._ir('ADD', [m, k2], self.out(y, 'plain', xs))

    # ---- ops
    def op_QuantizeLinear(self, node, ins, a, i):
        """A QDQ model's QuantizeLinear of an activation (onnxruntime's quantize_static, its
        default QDQ format): read with the DequantizeLinear after it as nothing, the
        activation float (the model trains dequantized: prepare says so)."""
        self.quantized.add(node.output[0])
        self.alias(node.output[0], ins[0])

    def op_DequantizeLinear(self, node, ins, a, i):
        if ins[0] not in self.quantized:
            self.err(f'a DequantizeLinear of {ins[0]!r}, which no QuantizeLinear made (an int8 '
                     f'model input, or a QOperator model): {_QUANTIZED}')
        self.alias(node.output[0], ins[0])

    def op_Identity(self, node, ins, a, i):
        self.alias(node.output[0], ins[0])

    def op_Dropout(self, node, ins, a, i):
        self.alias(node.output[0], ins[0])

    def op_Cast(self, node, ins, a, i):
        """A Cast of an activation to float32 (of the float32 input, as an SB3 policy's
        export starts): nothing to do; to another type: refused."""
        if int(a.get('to', 0)) != 1:
            self.err(f'a Cast of an activation to ONNX type {a.get("to")}: utrain computes '
                     'in float32; export the model without it')
        self.alias(node.output[0], ins[0])

    def _unary(self, name, node, ins, **opts):
        v = ins[0]
        lay = 'nhwc' if v in self.nhwc else 'plain'
        x = self.get(v, lay)
        self.emit(name, [x], [self.out(node.output[0], lay, self.oshape(v))], **opts)

    def op_Relu(self, node, ins, a, i):
        self._unary('RELU', node, ins)

    def op_Sigmoid(self, node, ins, a, i):
        self._unary('LOGISTIC', node, ins)

    def op_Tanh(self, node, ins, a, i):
        self._unary('TANH', node, ins)

    def op_HardSwish(self, node, ins, a, i):
        self._unary('HARD_SWISH', node, ins)

    def op_Sqrt(self, node, ins, a, i):
        self._unary('SQRT', node, ins)

    def op_Round(self, node, ins, a, i):
        """Round (half to even, as TFLite's ROUND), Floor, Ceil: steps, no gradient
        (torch's); utrain.op_math."""
        self._unary('ROUND', node, ins)

    def op_Floor(self, node, ins, a, i):
        self._unary('FLOOR', node, ins)

    def op_Ceil(self, node, ins, a, i):
        self._unary('CEIL', node, ins)

    def op_Sign(self, node, ins, a, i):
        self._unary('SIGN', node, ins)

    def op_Exp(self, node, ins, a, i):
        self._unary('EXP', node, ins)

    def op_Log(self, node, ins, a, i):
        self._unary('LOG', node, ins)

    def _softplus(self, x, b, y=None):
        """log(1 + exp(x)) as the device's EXP, ADD 1, LOG (Keras's softplus ops), into y
        (None: a new tensor)."""
        e = self._ir('EXP', [x], b + '/exp')
        return self._ir('LOG', [self._ir('ADD', [e, self._scalar(b + '/one', 1.0)], b + '/exp1')],
                        b + '/softplus' if y is None else y)

    def op_Softplus(self, node, ins, a, i):
        self._unary_chain(node, ins, lambda x, y, b: self._softplus(x, b, y))

    def op_Mish(self, node, ins, a, i):
        """x tanh(softplus(x))."""
        self._unary_chain(node, ins, lambda x, y, b: self._ir(
            'MUL', [x, self._ir('TANH', [self._softplus(x, b)], b + '/tanh')], y))

    def op_Elu(self, node, ins, a, i):
        alpha = float(a.get('alpha', 1.0))
        if alpha == 1.0:
            self._unary('ELU', node, ins)
        else:
            self._unary_chain(node, ins, lambda x, y, b: self._elu(x, y, b, alpha, 1.0))

    def _elu(self, x, y, b, alpha, gamma):
        """gamma * ELU_alpha(x) with the device's ELU (alpha 1): the negative side is
        alpha (exp(x) - 1), the positive x, so gamma alpha ELU(x) + gamma (1 - alpha)
        RELU(x) (nn.ELU(alpha), nn.SELU: gamma 1.0507, alpha 1.6733)."""
        e = self._ir('MUL', [self._ir('ELU', [x], b + '/elu'),
                             self._scalar(b + '/ga', gamma * alpha)], b + '/gae')
        if abs(1 - alpha) < 1e-12:
            return self._ir('ADD', [e, self._scalar(b + '/zero', 0.0)], y)
        r = self._ir('MUL', [self._ir('RELU', [x], b + '/relu'),
                             self._scalar(b + '/g1a', gamma * (1 - alpha))], b + '/g1ar')
        return self._ir('ADD', [e, r], y)

    def op_Selu(self, node, ins, a, i):
        al = float(a.get('alpha', 1.67326319217681884765625))
        ga = float(a.get('gamma', 1.05070102214813232421875))
        self._unary_chain(node, ins, lambda x, y, b: self._elu(x, y, b, al, ga))

    def op_Celu(self, node, ins, a, i):
        """max(0, x) + min(0, alpha (exp(x / alpha) - 1)) = alpha ELU(x / alpha)."""
        al = float(a.get('alpha', 1.0))

        def build(x, y, b):
            if al != 1.0:
                x = self._ir('MUL', [x, self._scalar(b + '/inv', 1 / al)], b + '/xa')
            e = self._ir('ELU', [x], b + '/elu' if al != 1.0 else y)
            if al != 1.0:
                self._ir('MUL', [e, self._scalar(b + '/alpha', al)], y)
        self._unary_chain(node, ins, build)

    def op_Softsign(self, node, ins, a, i):
        """x / (1 + |x|)."""
        self._unary_chain(node, ins, lambda x, y, b: self._ir('DIV', [x, self._ir(
            'ADD', [self._abs(x, b + '/abs', b + '/abs'), self._scalar(b + '/one', 1.0)],
            b + '/den')], y))

    def _ir(self, name, xs, out, shape=None, **opts):
        """One op on IR tensors; out: an IR tensor or a name for a new one (shape of xs[0])."""
        if isinstance(out, str):
            out = self.tensor(out, shape or self.tensors[xs[0]].shape)
        if name in ('ADD', 'SUB', 'MUL', 'DIV', 'FULLY_CONNECTED', 'CONCATENATION',
                    'MAX_POOL_2D'):
            opts.setdefault('fused_activation_function', 'NONE')
        self.emit(name, xs, [out], **opts)
        return out

    def _scalar(self, base, value):
        return self.tensor(base, [], np.array(value, np.float32))   # one element: frozen

    def _unary_chain(self, node, ins, build):
        """An activation written with the device's ops: build(x, y_out, base) emits them."""
        v = ins[0]
        lay = 'nhwc' if v in self.nhwc else 'plain'
        x = self.get(v, lay)
        build(x, self.out(node.output[0], lay, self.oshape(v)), node.output[0])

    def op_HardSigmoid(self, node, ins, a, i):
        """max(0, min(1, alpha x + beta)) = RELU6(6 alpha x + 6 beta) / 6."""
        al, be = float(a.get('alpha', 0.2)), float(a.get('beta', 0.5))

        def build(x, y, b):
            if abs(6 * al - 1) > 1e-7:
                x = self._ir('MUL', [x, self._scalar(b + '/6alpha', 6 * al)], b + '/ax')
            x = self._ir('ADD', [x, self._scalar(b + '/6beta', 6 * be)], b + '/axb')
            r6 = self._ir('RELU6', [x], b + '/relu6')
            self._ir('MUL', [r6, self._scalar(b + '/sixth', 1 / 6)], y)
        self._unary_chain(node, ins, build)

    def op_Neg(self, node, ins, a, i):
        self._unary_chain(node, ins, lambda x, y, b: self._ir(
            'MUL', [x, self._scalar(b + '/minus_one', -1.0)], y))

    def op_Reciprocal(self, node, ins, a, i):
        """1 / x (torch.reciprocal): DIV of the constant 1 by x."""
        self._unary_chain(node, ins, lambda x, y, b: self._ir(
            'DIV', [self._scalar(b + '/one', 1.0), x], y))

    def op_Abs(self, node, ins, a, i):
        self._unary_chain(node, ins, self._abs)

    def _abs(self, x, y, b):
        """|x| = RELU(x) + RELU(-x)."""
        n = self._ir('MUL', [x, self._scalar(b + '/minus_one', -1.0)], b + '/neg')
        p = self._ir('RELU', [x], b + '/pos')
        return self._ir('ADD', [p, self._ir('RELU', [n], b + '/negpart')], y)

    def _maxmin(self, node, ins, is_max):
        """max(a, b) = RELU(a - b) + b, min(a, b) = a - RELU(a - b): two activations or
        an activation and a scalar (clamp); a tensor constant would train as a bias.  (More
        operands or one: _variadic.)"""
        for v in ins:
            c = np.asarray(self.const.get(v, 0.0)).reshape(-1)
            if v in self.const and np.any(c != c[0]):
                self.err(f'{node.op_type} with a constant tensor {v!r}: utrain takes two '
                         'activations or an activation and a scalar (torch.clamp)')
        acts = [v for v in ins if v not in self.const]
        s = self.oshape(node.output[0]) if node.output[0] in self.shape else \
            list(np.broadcast_shapes(*[tuple(self.oshape(v)) for v in acts]))
        lay = 'nhwc' if len(s) in (3, 4) and any(v in self.nhwc for v in acts) and \
            all(len(self.oshape(v)) == len(s) for v in acts) else 'plain'
        xs = [self._scalar(f'{node.output[0]}/k{j}', float(np.asarray(self.const[v]).flat[0]))
              if v in self.const else self.get(v, lay) for j, v in enumerate(ins)]
        b = node.output[0]
        ish = _nhwc_shape(s) if lay == 'nhwc' else s
        d = self._ir('SUB', xs, b + '/difference', ish)
        r = self._ir('RELU', [d], b + '/relu', ish)
        y = self.out(b, lay, s)
        self._ir('ADD', [r, xs[1]], y) if is_max else self._ir('SUB', [xs[0], r], y)

    def _variadic(self, node, ins, pair):
        """Sum, Max, Min or Mean of any number of inputs (ONNX allows 1 to 2^31 - 1, with
        multidirectional broadcasting): the first one itself, else a chain of the two-input
        op, pair(node, [a, b]), the activations first (the accumulator one of them, so that
        each step has an activation).  Returns the chain's last ONNX name."""
        vs = [v for v in ins if v]
        vs = [v for v in vs if v not in self.const] + [v for v in vs if v in self.const]
        if len(vs) == 1:
            return vs[0]
        acc, o = vs[0], node.output[0]
        for j, v in enumerate(vs[1:], 1):
            nd = _Node([o if j == len(vs) - 1 else f'{o}/part{j}'])
            nd.op_type = node.op_type
            pair(nd, [acc, v])
            acc = nd.output[0]
        return acc

    def _chain(self, node, ins, pair):
        """node's output as _variadic's chain (one input: that input, aliased)."""
        v = self._variadic(node, ins, pair)
        if v != node.output[0]:
            self.alias(node.output[0], v)

    def op_Max(self, node, ins, a, i):
        self._chain(node, ins, lambda nd, xy: self._maxmin(nd, xy, True))

    def op_Min(self, node, ins, a, i):
        self._chain(node, ins, lambda nd, xy: self._maxmin(nd, xy, False))

    def op_Sum(self, node, ins, a, i):
        """torch's x + y + z as one node (what other exporters write): a chain of ADDs."""
        nd = _Node([node.output[0]])
        nd.op_type = 'Add'
        self._chain(nd, ins, self._binary)

    def op_Mean(self, node, ins, a, i):
        """The inputs' Sum (a chain of ADDs) times 1 / their count."""
        vs = [v for v in ins if v]
        if len(vs) == 1:
            return self.alias(node.output[0], vs[0])
        o = node.output[0]
        nd = _Node([o + '/sum'])
        nd.op_type = 'Add'
        self._variadic(nd, vs, self._binary)
        v = o + '/sum'
        lay = 'nhwc' if v in self.nhwc else 'plain'
        self._ir('MUL', [self.get(v, lay), self._scalar(o + '/one_over_n', 1.0 / len(vs))],
                 self.out(o, lay, self.oshape(v)))

    def op_LeakyRelu(self, node, ins, a, i):
        self._unary('LEAKY_RELU', node, ins, alpha=float(a.get('alpha', 0.01)))

    def op_Gelu(self, node, ins, a, i):
        self._unary('GELU', node, ins, approximate=a.get('approximate') == 'tanh')

    def op_Clip(self, node, ins, a, i):
        lo, hi = a.get('min'), a.get('max')
        if len(ins) > 1 and ins[1]:
            lo = float(self.cval(ins[1], 'min'))
        if len(ins) > 2 and ins[2]:
            hi = float(self.cval(ins[2], 'max'))
        lo = -np.inf if lo is None else float(lo)
        hi = np.inf if hi is None else float(hi)
        name = {(0.0, 6.0): 'RELU6', (-1.0, 1.0): 'RELU_N1_TO_1', (0.0, np.inf): 'RELU'}.get((lo, hi))
        if name is not None:
            return self._unary(name, node, ins)
        if lo > hi:
            self.err(f'Clip to [{lo}, {hi}]: an empty range')

        def build(x, y, b):         # max(x, lo) = RELU(x - lo) + lo; min(x, hi) = x - RELU(x - hi)
            if lo > -np.inf:
                d = self._ir('SUB', [x, self._scalar(b + '/lo', lo)], b + '/minus_lo')
                r = self._ir('RELU', [d], b + '/above_lo')
                x = self._ir('ADD', [r, self._scalar(b + '/lo_', lo)],
                             b + '/max_lo' if hi < np.inf else y)
            if hi < np.inf:
                d = self._ir('SUB', [x, self._scalar(b + '/hi', hi)], b + '/minus_hi')
                self._ir('SUB', [x, self._ir('RELU', [d], b + '/above_hi')], y)
        self._unary_chain(node, ins, build)

    def op_Pow(self, node, ins, a, i):
        if ins[1] not in self.const:
            # an activation exponent (x ** y, c ** y): POW of the two, which prepare spells
            # as EXP(y LOG x) (spellings.elementwise_forms: pow where x > 0)
            xs, lay, out_shape = self._operands(node, ins)
            self.emit('POW', xs, [self.out(node.output[0], lay, out_shape)])
            return
        e = np.asarray(self.cval(ins[1], 'the exponent')).reshape(-1)
        if e.size != 1 or float(e[0]) == 0.0 or not np.isfinite(e[0]):
            self.err(f'exponent {e.tolist()}: utrain takes one nonzero constant exponent')
        if float(e[0]) == 0.5:
            return self._unary('SQRT', node, ins)
        lay = 'nhwc' if ins[0] in self.nhwc else 'plain'
        x = self.get(ins[0], lay)
        y = self.out(node.output[0], lay, self.oshape(ins[0]))
        if float(e[0]) == 2.0:
            self.emit('MUL', [x, x], [y], fused_activation_function='NONE')
        else:       # (prepare spells it: spellings.elementwise_forms)
            k = self.tensor(node.output[0] + '/exponent', [], np.array(e[0], np.float32))
            self.tensors[k].frozen = True
            self.emit('POW', [x, k], [y])

    def _gelu_pattern(self, i):
        """Div(x, sqrt 2) (or Mul by 1 / sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5 (any
        order of the Muls: torch.onnx's dynamo exporter writes x * (0.5 * (1 + erf))), as
        exporters before opset 20 write GELU: returns (x, last node index, nodes)."""
        nodes = self.nodes
        div = nodes[i]

        def only(v):
            c = self.consumers.get(v, [])
            return c[0] if len(c) == 1 else None

        def other(node, v):
            rest = [u for u in node.input if u != v]
            return rest[0] if len(rest) == 1 else None

        def value(v):
            c = self.const.get(v)
            return np.nan if c is None or np.asarray(c).size != 1 else float(np.asarray(c).reshape(-1)[0])

        if div.op_type == 'Div':
            x, k = div.input[0], value(div.input[1])
        else:                           # Mul(x, 1 / sqrt 2), either side
            x = next((v for v in div.input if v not in self.const), None)
            k = 1 / value(other(div, x)) if x is not None and other(div, x) else np.nan
        if not abs(k - np.sqrt(2)) <= 1e-3:
            return None
        erf = only(div.output[0])
        if erf is None or erf.op_type != 'Erf':
            return None
        add = only(erf.output[0])
        if add is None or add.op_type != 'Add' or \
                abs(float(np.asarray(self.const.get(other(add, erf.output[0]), np.nan)).reshape(-1)[0]) - 1) > 1e-6:
            return None
        m1 = only(add.output[0])
        if m1 is None or m1.op_type != 'Mul':
            return None
        o = other(m1, add.output[0])
        if o != x and abs(value(o) - 0.5) <= 1e-6:     # 0.5 * (1 + erf) then * x
            m2 = only(m1.output[0])
            if m2 is None or m2.op_type != 'Mul' or other(m2, m1.output[0]) != x:
                return None
            return x, m2, [div, erf, add, m1, m2]
        if o == x:                      # x * (1 + erf) then * 0.5
            m2 = only(m1.output[0])
            if m2 is None or m2.op_type != 'Mul' or abs(float(np.asarray(self.const.get(
                    other(m2, m1.output[0]), np.nan)).reshape(-1)[0]) - 0.5) > 1e-6:
                return None
            last = m2
        else:                           # (x * 0.5) * (1 + erf)
            half = [n for n in self.consumers.get(x, []) if n.op_type == 'Mul' and
                    n.output[0] == o]
            if not half or abs(float(np.asarray(self.const.get(other(half[0], x), np.nan))
                                     .reshape(-1)[0]) - 0.5) > 1e-6:
                return None
            last = m1
        used = [div, erf, add, m1, last]
        return x, last, used

    def _index(self, node):
        return next(j for j, n in enumerate(self.nodes) if n is node)

    def op_Erf(self, node, ins, a, i):
        self.err('Erf outside the GELU pattern x * 0.5 * (1 + erf(x / sqrt(2)))')

    def _binary_name(self, t):
        return {'Add': 'ADD', 'Sub': 'SUB', 'Mul': 'MUL', 'Div': 'DIV', 'PRelu': 'PRELU',
                **_CMP}[t]

    def op_Equal(self, node, ins, a, i):
        self._binary(node, ins)

    op_Less = op_Greater = op_LessOrEqual = op_GreaterOrEqual = op_Equal

    def op_Div(self, node, ins, a, i):
        if self._gelu(i):
            return
        self._binary(node, ins)

    def _gelu(self, i) -> bool:
        """Node i begins _gelu_pattern's GELU: emitted as one op, its nodes skipped."""
        pat = self._gelu_pattern(i)
        if pat is None:
            return False
        x, last, used = pat
        self.skip.update(self._index(n) for n in used)
        lay = 'nhwc' if x in self.nhwc else 'plain'
        self.emit('GELU', [self.get(x, lay)],
                  [self.out(last.output[0], lay, self.oshape(x))], approximate=False)
        return True

    def op_Add(self, node, ins, a, i):
        self._binary(node, ins)

    def op_Sub(self, node, ins, a, i):
        self._binary(node, ins)

    def op_Mul(self, node, ins, a, i):
        if self._gelu(i):
            return
        self._binary(node, ins)

    def op_PRelu(self, node, ins, a, i):
        # PRELU(x, slope), the slope laid out as a MUL's constant (host_tools/graph/spellings.py
        # writes it with RELU, SUB, MUL and ADD: the slope trains as the MUL's constant)
        self._binary(node, ins)

    def _binary(self, node, ins):
        xs, lay, out_shape = self._operands(node, ins)
        name = self._binary_name(node.op_type)
        self.emit(name, xs, [self.out(node.output[0], lay, out_shape)],
                  **({} if name == 'PRELU' or name in _CMP.values()
                     else {'fused_activation_function': 'NONE'}))

    def op_Where(self, node, ins, a, i):
        """torch.where(c, a, b): SELECT_V2 of the mask (a comparison's 1.0 / 0.0) and the
        two sides, each getting the gradient where it was taken (a constant side frozen)."""
        xs, lay, out_shape = self._operands(node, ins)
        self.emit('SELECT_V2', xs, [self.out(node.output[0], lay, out_shape)])

    def op_Not(self, node, ins, a, i):
        """Not of a comparison this reader made (Not(Equal): torch's !=, a Keras-style
        mask): the opposite comparison (NOT_EQUAL, GREATER_EQUAL, ...) where the Not is its
        mask's one reader; else 1 - mask."""
        v = ins[0]
        op = next((o for o in reversed(self.ops) if o.name in _NOT and
                   any(v in m and m[v] == o.outputs[0] for m in (self.plain, self.nhwc))), None)
        if op is not None and len(self.consumers.get(v, [])) == 1 and \
                v not in [o.name for o in self.model.graph.output]:
            op.name = _NOT[op.name]
            op.code = OP_CODES[op.name]
            return self.alias(node.output[0], v)
        self._unary_chain(node, ins, lambda x, y, b: self._ir('ADD', [self._ir(
            'MUL', [x, self._scalar(b + '/minus_one', -1.0)], b + '/negated'),
            self._scalar(b + '/one', 1.0)], y))

    def _operands(self, node, ins):
        """The IR tensors of an elementwise node's operands (constants as float32 tensors
        laid out as the activations), their layout and the output's shape."""
        acts = [v for v in ins if v not in self.const]
        out_shape = self.oshape(node.output[0]) if node.output[0] in self.shape else \
            list(np.broadcast_shapes(*[tuple(self.oshape(v)) if v not in self.const
                                       else self.const[v].shape for v in ins]))
        r = len(out_shape)
        lay = 'plain'
        if r in (3, 4) and any(v in self.nhwc for v in acts) and \
                all(len(self.oshape(v)) == r for v in acts):
            lay = 'nhwc'
        xs = []
        for v in ins:
            if v in self.const:
                c = np.asarray(self.const[v])
                if c.dtype.kind != 'f':
                    c = c.astype(np.float32)
                steps = []
                if lay == 'nhwc':
                    s4 = _to4([1] * (r - c.ndim) + list(c.shape))
                    steps = [('R', list(c.shape), s4), ('T', NCHW_TO_NHWC)]
                    c4 = c.reshape(s4).transpose(NCHW_TO_NHWC)
                    keep = list(c4.shape)
                    while len(keep) > 1 and keep[0] == 1:
                        keep.pop(0)
                    if c.ndim == 0:
                        keep = []
                    steps.append(('R', list(c4.shape), keep))
                    c = c4.reshape(keep)
                xs.append(self.const_tensor(v, c, v if v in self.inits else None, steps))
            else:
                xs.append(self.get(v, lay))
        if len(acts) == 0:
            self.err('no activation operand')
        return xs, lay, out_shape

    # ---- dense
    def op_Gemm(self, node, ins, a, i):
        if a.get('transA', 0):
            self.err('transA=1 is not supported')
        if ins[1] not in self.const:
            self.err('B must be a constant (an initializer): utrain trains weights')
        B = self.const[ins[1]]
        alpha, beta = float(a.get('alpha', 1.0)), float(a.get('beta', 1.0))
        steps = [] if a.get('transB', 0) else [('T', (1, 0))]
        if alpha != 1.0:
            steps.append(('scale', alpha))
        C = ins[2] if len(ins) > 2 and ins[2] else None
        self._fc(node, ins[0], ins[1], B, steps, C, beta, node.output[0])

    def _fc(self, node, x, wname, W, steps, bname, beta, out):
        src = None
        if x in self.colperm:
            xk, src = self.colperm[x]
        else:
            xk = self.get(x, 'plain')
        xs = self.tensors[xk].shape
        w = apply_steps(W, steps)
        if src is not None:
            steps = steps + [('cols', src)]
            w = w[:, src]
        if w.shape[1] != xs[-1]:
            self.err(f'weight {list(w.shape)} does not fit input {xs}')
        wk = self.const_tensor(wname, w, wname if wname in self.inits else None, steps)
        bk = -1
        if bname is not None:
            bc = np.asarray(self.cval(bname, 'the bias'))
            if bc.size != w.shape[0]:
                self.err(f'bias of shape {list(bc.shape)} for {w.shape[0]} outputs')
            bsteps = [('R', list(bc.shape), [w.shape[0]])]
            if beta != 1.0:
                bsteps.append(('scale', beta))
            bk = self.const_tensor(bname, apply_steps(bc, bsteps),
                                   bname if bname in self.inits else None, bsteps)
        oshape = list(xs[:-1]) + [w.shape[0]]
        self.emit('FULLY_CONNECTED', [xk, wk, bk], [self.out(out, 'plain', oshape)],
                  fused_activation_function='NONE', keep_num_dims=len(xs) > 2)

    def op_MatMul(self, node, ins, a, i):
        if ins[1] not in self.const or np.ndim(self.const[ins[1]]) != 2:
            return self._batch_matmul(node, ins)
        B = self.const[ins[1]]
        out, bias = node.output[0], None
        cs = self.consumers.get(out, [])
        if len(cs) == 1 and cs[0].op_type == 'Add' and out not in \
                [o.name for o in self.model.graph.output]:
            other = [v for v in cs[0].input if v != out]
            c = np.asarray(self.const[other[0]]) if len(other) == 1 and \
                other[0] in self.const else None
            # (a bias of [N], or [1, N] as skl2onnx writes an MLP's intercepts: the same
            # broadcast; read apart, the layer had been said to have no bias tensor)
            if c is not None and c.size == B.shape[1] and c.shape[-1] == B.shape[1] and \
                    c.ndim <= len(self.oshape(ins[0])):
                bias = other[0]
                self.skip.add(self._index(cs[0]))
                out = cs[0].output[0]
        self._fc(node, ins[0], ins[1], B, [('T', (1, 0))], bias, 1.0, out)

    def op_Einsum(self, node, ins, a, i):
        """Einsum of two operands that is a matrix product (attention's 'bhid,bhjd->bhij',
        'bij,bjk->bik', a weight's 'bti,io->bto'): each operand transposed to [batch
        letters, its own letters, the summed letters] and reshaped to 3-D (2-D with no
        batch letter: a weight's MatMul, a FULLY_CONNECTED), one MatMul, the product
        reshaped and transposed to the output's letters (nodes read as the file's)."""
        from onnx import helper
        eq = a.get('equation', '')
        eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(' ', '')
        lhs, _, out = eq.partition('->')
        terms = lhs.split(',')
        if len(terms) != 2 or len(ins) != 2 or '.' in eq or not _:
            self.err(f'equation {eq!r}: utrain reads an Einsum of two operands with an '
                     'explicit output and no ellipsis (a matrix product); write it with '
                     'torch.matmul / transpose')
        shapes = [list(np.shape(self.const[v])) if v in self.const else self.oshape(v)
                  for v in ins]
        size = {}
        for t, sh in zip(terms, shapes):
            if len(t) != len(sh) or len(set(t)) != len(t):
                self.err(f'equation {eq!r} for operands of shapes {shapes}: each letter once '
                         'an operand, a letter an axis')
            for c, n in zip(t, sh):
                if size.setdefault(c, n) != n:
                    self.err(f'equation {eq!r}: letter {c!r} is {size[c]} and {n} long '
                             '(broadcast): utrain reads equal sizes')
        A, B = terms
        batch = [c for c in out if c in A and c in B]
        m = [c for c in out if c in A and c not in B]
        n = [c for c in out if c in B and c not in A]
        k = [c for c in A if c in B and c not in out]
        if sorted(batch + m + n) != sorted(out) or len(set(out)) != len(out) or \
                len(batch + m + k) != len(A) or len(batch + n + k) != len(B):
            self.err(f'equation {eq!r}: a letter summed in one operand only, or an output '
                     'letter of neither: utrain reads matrix products')
        base = node.output[0]

        def sub(op, xs, name, **at):
            self.step(i, helper.make_node(op, xs, [name], **at))
            return name

        def shaped(v, name, want):
            if list(np.shape(self.const[v]) if v in self.const else self.oshape(v)) == want:
                return v
            self.const[name + '/shape'] = np.array(want, np.int64)
            return sub('Reshape', [v, name + '/shape'], name)

        def arrange(v, t, groups, name):
            order = batch + [c for g in groups for c in g]
            perm = [t.index(c) for c in order]
            if perm != list(range(len(t))):
                v = sub('Transpose', [v], name + '/t', perm=perm)
            dims = [int(np.prod([size[c] for c in g])) for g in ([batch] if batch else []) + groups]
            return shaped(v, name + '/r', dims)
        x0 = arrange(ins[0], A, [m, k], base + '/a')
        x1 = arrange(ins[1], B, [k, n], base + '/b')
        prod = sub('MatMul', [x0, x1], base + '/mm')
        full = batch + m + n
        y = shaped(prod, base + '/o', [size[c] for c in full])
        perm = [full.index(c) for c in out]
        if perm != list(range(len(out))):
            sub('Transpose', [y], base, perm=perm)
        else:
            self.alias(base, y)

    def _batch_matmul(self, node, ins):
        """MatMul of two activations (attention's Q K^T, P V) or by a constant that is not
        a 2-D weight: BATCH_MATMUL over the broadcast batch axes (a constant operand
        trains, as a MUL's does)."""
        xs, shapes = [], []
        for v in ins[:2]:
            if v in self.const:
                c = np.asarray(self.const[v])
                xs.append(self.const_tensor(v, c.astype(np.float32) if c.dtype.kind != 'f' else c,
                                            v if v in self.inits else None))
                shapes.append(list(c.shape))
            else:
                xs.append(self.get(v, 'plain'))
                shapes.append(list(self.oshape(v)))
        if min(len(s) for s in shapes) < 2:
            self.err(f'operands of shapes {shapes}: utrain multiplies matrices (rank 2 or '
                     'more; unsqueeze a vector)')
        try:
            batch = list(np.broadcast_shapes(*(tuple(s[:-2]) for s in shapes)))
        except ValueError:
            self.err(f'operands of shapes {shapes} do not broadcast')
        self.emit('BATCH_MATMUL', xs, [self.out(node.output[0], 'plain',
                                                batch + [shapes[0][-2], shapes[1][-1]])],
                  adjoint_lhs=False, adjoint_rhs=False)

    # ---- spatial
    def _pads(self, a, H, W, kh, kw, sh, sw, dh, dw):
        """(top, left, bottom, right) from pads / auto_pad."""
        ap = a.get('auto_pad', 'NOTSET')
        if ap in ('SAME_UPPER', 'SAME_LOWER'):
            res = []
            for n, k, s, d in ((H, kh, sh, dh), (W, kw, sw, dw)):
                o = -(-n // s)
                tot = max((o - 1) * s + (k - 1) * d + 1 - n, 0)
                lo = tot // 2 if ap == 'SAME_UPPER' else tot - tot // 2
                res.append((lo, tot - lo))
            return res[0][0], res[1][0], res[0][1], res[1][1]
        if ap == 'VALID':
            return 0, 0, 0, 0
        p = list(a.get('pads', [0, 0, 0, 0]))
        return p[0], p[1], p[2], p[3]

    def _padding(self, x, H, W, kh, kw, sh, sw, dh, dw, pads, OH, OW, zero_ok=True,
                 same_ok=True):
        """TFLite padding for ONNX pads: 'VALID', 'SAME', or a PAD op in front (zeros;
        zero_ok False: None when that would change the result)."""
        t, l, b, r = pads

        def tfl(n, k, s, d, mode):
            eff = (k - 1) * d + 1
            if mode == 'SAME':
                o = -(-n // s)
                return o, max((o - 1) * s + eff - n, 0) // 2
            return -(-(n - eff + 1) // s), 0
        if (t, l, b, r) == (0, 0, 0, 0) and (tfl(H, kh, sh, dh, 'VALID')[0],
                                             tfl(W, kw, sw, dw, 'VALID')[0]) == (OH, OW):
            return x, 'VALID'
        sy, sx = tfl(H, kh, sh, dh, 'SAME'), tfl(W, kw, sw, dw, 'SAME')
        if same_ok and (sy[0], sx[0]) == (OH, OW) and (sy[1], sx[1]) == (t, l):
            return x, 'SAME'
        if not zero_ok:
            return None, None
        s = self.tensors[x].shape
        ps = [s[0], s[1] + t + b, s[2] + l + r, s[3]]
        pk = self.tensor(self.tensors[x].name + '/pad', [4, 2],
                         np.array([[0, 0], [t, b], [l, r], [0, 0]], np.int32))
        y = self.tensor(self.tensors[x].name + '/padded', ps)
        self.emit('PAD', [x, pk], [y])
        if (tfl(ps[1], kh, sh, dh, 'VALID')[0], tfl(ps[2], kw, sw, dw, 'VALID')[0]) != (OH, OW):
            self.err(f'pads {list(pads)} give an output TFLite cannot compute')
        return y, 'VALID'

    def _as2d(self, a, rank):
        """A 1-D conv's or pool's attributes (rank-3 input) as the 2-D op's over H = 1."""
        if rank != 3:
            return a
        a = dict(a)
        for k, one in (('kernel_shape', 1), ('strides', 1), ('dilations', 1)):
            if k in a:
                a[k] = [one] + list(a[k])
        if 'pads' in a:
            a['pads'] = [0, a['pads'][0], 0, a['pads'][1]]
        return a

    def _conv_weight(self, ins, a, what):
        """(weight as 4-D, its steps so far, attributes, input rank) of a Conv or
        ConvTranspose: a 1-D one's [A, B, K] as [A, B, 1, K] over H = 1."""
        if ins[1] not in self.const:
            self.err('the weight must be a constant (an initializer)')
        Wt = self.const[ins[1]]
        r = len(self.oshape(ins[0]))
        pre = []
        if Wt.ndim == 3 and r == 3:
            pre = [('R', list(Wt.shape), [Wt.shape[0], Wt.shape[1], 1, Wt.shape[2]])]
            Wt = Wt.reshape(pre[0][2])
            a = self._as2d(a, 3)
        if Wt.ndim != 4:
            self.err(f'weight of shape {list(Wt.shape)} ({Wt.ndim - 2}-D {what}): ' + (
                CONV3D_HINT if Wt.ndim == 5 and what == 'convolutions' else
                f'utrain runs 1-D and 2-D {what} only'))
        return Wt, pre, a, r

    def _conv3d(self, node, ins, a):
        """A 3-D Conv (torch.nn.Conv3d, grouped too): the [N, C, D, H, W] input TRANSPOSEd to
        [N, D, H, W, C], a CONV_3D of weight [kd, kh, kw, C / group, O] (TFLite's; prepare spells it
        with a CONV_2D per output frame and depth tap: spellings.conv3d_to_conv2d, which
        takes ONNX's pads, op.pads3d), its output TRANSPOSEd back."""
        Wt = np.asarray(self.const[ins[1]])
        O, IG, kd, kh, kw = Wt.shape
        N, C, D, H, W = self.oshape(ins[0])
        grp = int(a.get('group', 1))
        if grp < 1 or C % grp or IG * grp != C or O % grp:
            # (grouped: each depth tap's CONV_2D a grouped one, [O, kh, kw, C / group],
            # which prepare splits into groups: groups.split_groups)
            self.err(f'group {grp} with {C} input channels and a weight of shape '
                     f'{list(Wt.shape)}: a group convolution wants [out, channels / group, '
                     'kd, kh, kw] with out and channels multiples of group')
        k, st = (kd, kh, kw), [int(v) for v in a.get('strides', [1, 1, 1])]
        dl = [int(v) for v in a.get('dilations', [1, 1, 1])]
        ap = a.get('auto_pad', 'NOTSET')
        n3 = (D, H, W)
        if ap in ('SAME_UPPER', 'SAME_LOWER'):
            tot = [max((-(-n // s_) - 1) * s_ + (k_ - 1) * d_ + 1 - n, 0)
                   for n, k_, s_, d_ in zip(n3, k, st, dl)]
            lo = [t // 2 if ap == 'SAME_UPPER' else t - t // 2 for t in tot]
            pads = lo + [t - l_ for t, l_ in zip(tot, lo)]
        else:
            pads = [int(v) for v in a.get('pads', [0] * 6)] if ap != 'VALID' else [0] * 6
        out = [(n + pads[j] + pads[j + 3] - (k[j] - 1) * dl[j] - 1) // st[j] + 1
               for j, n in enumerate(n3)]
        self.shape[node.output[0]] = [N, O] + out
        x, wk, bk = self._ndhwc_operands(ins, Wt, [N, D, H, W, C])
        y = self.tensor(node.output[0] + '/ndhwc', [N] + out + [O])
        op = self.emit('CONV_3D', [x, wk, bk], [y], padding='VALID', stride_d=st[0],
                       stride_h=st[1], stride_w=st[2], dilation_d_factor=dl[0],
                       dilation_h_factor=dl[1], dilation_w_factor=dl[2],
                       fused_activation_function='NONE')
        op.pads3d = pads
        self.emit('TRANSPOSE', [y, self.perm_const(node.output[0], (0, 4, 1, 2, 3))],
                  [self.out(node.output[0], 'plain')])

    def _ndhwc_operands(self, ins, Wt, ndhwc):
        """A 3-D conv's operands in TFLite's layout: the [N, C, D, H, W] input TRANSPOSEd
        to ndhwc, the weight's axes [2, 3, 4, 1, 0] (steps export undoes), the bias or -1."""
        x = self.tensor(ins[0] + '/ndhwc', ndhwc)
        self.emit('TRANSPOSE', [self.get(ins[0], 'plain'),
                                self.perm_const(ins[0], (0, 2, 3, 4, 1))], [x])
        steps = [('T', (2, 3, 4, 1, 0))]
        wk = self.const_tensor(ins[1], apply_steps(Wt, steps),
                               ins[1] if ins[1] in self.inits else None, steps)
        bk = -1
        if len(ins) > 2 and ins[2]:
            bk = self.const_tensor(ins[2], self.cval(ins[2], 'the bias'),
                                   ins[2] if ins[2] in self.inits else None)
        return x, wk, bk

    def _conv3d_transpose(self, node, ins, a):
        """A 3-D ConvTranspose (torch.nn.ConvTranspose3d, group 1, no dilation): the
        [N, C, D, H, W] input TRANSPOSEd to [N, D, H, W, C], TFLite's CONV_3D_TRANSPOSE of
        weight [kd, kh, kw, O, C] to the output's size (prepare spells it with a
        TRANSPOSE_CONV per input frame and depth tap: spellings.conv3d_transpose_to_2d,
        which takes the pads' begin, op.tpads3d: ONNX output frame j is the full transposed
        convolution's j + begin, zeros past its end: output_padding), its output TRANSPOSEd
        back."""
        Wt = np.asarray(self.const[ins[1]])
        I, O, kd, kh, kw = Wt.shape
        N, C, D, H, W = self.oshape(ins[0])
        if int(a.get('group', 1)) != 1 or I != C:
            self.err(f'group {a.get("group", 1)} with {C} input channels and a weight of '
                     f'shape {list(Wt.shape)}: utrain runs ungrouped transposed convolutions')
        if any(int(d) != 1 for d in a.get('dilations', [1, 1, 1])):
            self.err('dilated transposed convolution is not supported')
        k, st = (kd, kh, kw), [int(v) for v in a.get('strides', [1, 1, 1])]
        op_ = [int(v) for v in a.get('output_padding', [0, 0, 0])]
        ap = a.get('auto_pad', 'NOTSET')
        full = [(n - 1) * s_ + k_ + p for n, s_, k_, p in zip((D, H, W), st, k, op_)]
        if 'output_shape' in a or ap in ('SAME_UPPER', 'SAME_LOWER'):
            outs = [int(v) for v in a['output_shape']][-3:] if 'output_shape' in a else \
                [n * s_ for n, s_ in zip((D, H, W), st)]
            begin = [(f - o) // 2 if ap == 'SAME_UPPER' else (f - o) - (f - o) // 2
                     for f, o in zip(full, outs)]
        else:
            p = [0] * 6 if ap == 'VALID' else [int(v) for v in a.get('pads', [0] * 6)]
            begin, outs = p[:3], [f - p[j] - p[j + 3] for j, f in enumerate(full)]
        if min(begin) < 0 or min(outs) < 1:
            self.err(f'pads {a.get("pads")} / output_shape {a.get("output_shape")} give an '
                     'output TFLite cannot compute')
        self.shape[node.output[0]] = [N, O] + outs
        x, wk, bk = self._ndhwc_operands(ins, Wt, [N, D, H, W, C])
        y = self.tensor(node.output[0] + '/ndhwc', [N] + outs + [O])
        shp = self.tensor(node.output[0] + '/shape', [5], np.array([N] + outs + [O], np.int32))
        op = self.emit('CONV_3D_TRANSPOSE', [shp, wk, x, bk], [y], padding='VALID',
                       stride_d=st[0], stride_h=st[1], stride_w=st[2], dilation_d_factor=1,
                       dilation_h_factor=1, dilation_w_factor=1,
                       fused_activation_function='NONE')
        op.tpads3d = begin
        self.emit('TRANSPOSE', [y, self.perm_const(node.output[0], (0, 4, 1, 2, 3))],
                  [self.out(node.output[0], 'plain')])

    def op_Conv(self, node, ins, a, i):
        if ins[1] in self.const and np.ndim(self.const[ins[1]]) == 5 and \
                len(self.oshape(ins[0])) == 5:
            return self._conv3d(node, ins, a)
        Wt, pre, a, r = self._conv_weight(ins, a, 'convolutions')
        x = self.get(ins[0], 'nhwc')
        _, H, W, C = self.tensors[x].shape
        O, IG, kh, kw = Wt.shape
        grp = int(a.get('group', 1))
        sh, sw = (list(a.get('strides', [1, 1])) + [1, 1])[:2]
        dh, dw = (list(a.get('dilations', [1, 1])) + [1, 1])[:2]
        pads = self._pads(a, H, W, kh, kw, sh, sw, dh, dw)
        OH, OW = _out_size(H, W, kh, kw, sh, sw, dh, dw, pads, False)
        self.shape[node.output[0]] = [1, O, OH, OW] if r == 4 else [1, O, OW]
        x, pad = self._padding(x, H, W, kh, kw, sh, sw, dh, dw, pads, OH, OW)
        opts = dict(padding=pad, stride_h=sh, stride_w=sw, dilation_h_factor=dh,
                    dilation_w_factor=dw, fused_activation_function='NONE')
        if grp == C and IG == 1 and O % C == 0:
            name, steps = 'DEPTHWISE_CONV_2D', [('T', (1, 2, 3, 0))]
            opts['depth_multiplier'] = O // C
        elif grp >= 1 and C % grp == 0 and IG * grp == C and O % grp == 0:
            # (grouped: a CONV_2D of [O, kh, kw, C / group] as TFLite writes it, which
            # prepare splits into groups: groups.split_groups)
            name, steps = 'CONV_2D', [('T', (0, 2, 3, 1))]
        else:
            self.err(f'group {grp} with {C} input channels and a weight of shape '
                     f'{list(Wt.shape)}: a group convolution wants [out, channels / group, '
                     'kh, kw] with out and channels multiples of group')
        wk = self.const_tensor(ins[1], apply_steps(Wt, steps),
                               ins[1] if ins[1] in self.inits else None, pre + steps)
        bk = -1
        if len(ins) > 2 and ins[2]:
            bk = self.const_tensor(ins[2], self.cval(ins[2], 'the bias'),
                                   ins[2] if ins[2] in self.inits else None)
        self.emit(name, [x, wk, bk], [self.out(node.output[0], 'nhwc')], **opts)

    def op_ConvTranspose(self, node, ins, a, i):
        """TFLite's TRANSPOSE_CONV (weight [out, kh, kw, in]) of the NHWC map.  ONNX's
        output row j is the full (VALID) transposed convolution's row j + pads begin
        (rows past its end zero, output_padding): TFLite's VALID (offset 0) or SAME
        (offset its own) where the pads and sizes are ones TensorFlow allows, else VALID
        to the full size (or the pads begin plus the output's, where more), cut by a
        STRIDED_SLICE (optable.tconv_form)."""
        if ins[1] in self.const and np.ndim(self.const[ins[1]]) == 5 and \
                len(self.oshape(ins[0])) == 5:
            return self._conv3d_transpose(node, ins, a)
        Wt, pre, a, r = self._conv_weight(ins, a, 'transposed convolutions')
        if r == 3:                        # ConvTranspose1d: [I, O, K] as [I, O, 1, K]
            for k in ('output_padding', 'output_shape'):
                if k in a:
                    a[k] = [0 if k == 'output_padding' else 1] + list(a[k])
        x = self.get(ins[0], 'nhwc')
        _, H, W, C = self.tensors[x].shape
        I, O, kh, kw = Wt.shape
        if int(a.get('group', 1)) != 1 or I != C:
            self.err(f'group {a.get("group", 1)} with {C} input channels and a weight of '
                     f'shape {list(Wt.shape)}: utrain runs ungrouped transposed convolutions')
        if any(d != 1 for d in a.get('dilations', [1, 1])):
            self.err('dilated transposed convolution is not supported')
        sh, sw = (list(a.get('strides', [1, 1])) + [1, 1])[:2]
        op_ = (list(a.get('output_padding', [0, 0])) + [0, 0])[:2]
        ap = a.get('auto_pad', 'NOTSET')
        full = [(H - 1) * sh + kh + op_[0], (W - 1) * sw + kw + op_[1]]
        if 'output_shape' in a or ap in ('SAME_UPPER', 'SAME_LOWER'):
            outs = list(a['output_shape'])[-2:] if 'output_shape' in a else [H * sh, W * sw]
            begin = []
            for n, o in zip(full, outs):
                tot = n - o
                begin.append(tot // 2 if ap == 'SAME_UPPER' else tot - tot // 2)
        else:
            p = [0, 0, 0, 0] if ap == 'VALID' else list(a.get('pads', [0, 0, 0, 0]))
            begin, outs = [p[0], p[1]], [full[0] - p[0] - p[2], full[1] - p[1] - p[3]]
        if min(begin) < 0 or min(outs) < 1:
            self.err(f'pads {a.get("pads")} / output_shape {a.get("output_shape")} give an '
                     'output TFLite cannot compute')
        OH, OW = outs
        self.shape[node.output[0]] = [1, O, OH, OW] if r == 4 else [1, O, OW]
        # (sizes TensorFlow's own rules allow, so that TFLite runs the exported graph as
        # utrain does, or VALID to full size plus a cut: optable.tconv_form)
        from ..graph.optable import tconv_form
        form = tconv_form((H, W), (OH, OW), (kh, kw), (sh, sw), begin)
        if form is None:
            self.err(f'output_padding {op_} / output_shape {a.get("output_shape")} reach '
                     'rows no tap of the kernel does (output_padding must be under the stride)')
        pad, big = form
        wk = self.const_tensor(ins[1], apply_steps(Wt, [('T', (1, 2, 3, 0))]),
                               ins[1] if ins[1] in self.inits else None, pre + [('T', (1, 2, 3, 0))])
        bk = []
        if len(ins) > 2 and ins[2]:
            bk = [self.const_tensor(ins[2], self.cval(ins[2], 'the bias'),
                                    ins[2] if ins[2] in self.inits else None)]
        y = self.out(node.output[0], 'nhwc')
        big = [1] + big + [O]
        t = self.tensor(self.tensors[y].name + '/full', big) if pad is None else y
        shp = self.tensor(self.tensors[t].name + '/shape', [4], np.array(big, np.int32))
        self.emit('TRANSPOSE_CONV', [shp, wk, x] + bk, [t],
                  padding=pad or 'VALID', stride_h=sh, stride_w=sw,
                  fused_activation_function='NONE')
        if pad is None:                 # rows and columns pads-begin on
            c = self.tensors[t].name
            ks = [self.tensor(c + n, [4], np.array(v, np.int32)) for n, v in (
                ('/begin', [0, begin[0], begin[1], 0]),
                ('/end', [1, begin[0] + OH, begin[1] + OW, O]),
                ('/strides', [1, 1, 1, 1]))]
            self.emit('STRIDED_SLICE', [t] + ks, [y], begin_mask=0, end_mask=0,
                      ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0)

    def _pool(self, node, ins, a, name):
        r = len(self.oshape(ins[0]))
        a = self._as2d(a, r)
        x = self.get(ins[0], 'nhwc')
        _, H, W, C = self.tensors[x].shape
        kh, kw = a['kernel_shape']
        sh, sw = (list(a.get('strides', [1, 1])) + [1, 1])[:2]
        if any(d != 1 for d in a.get('dilations', [1, 1])):
            self.err('dilated pooling is not supported')
        pads = self._pads(a, H, W, kh, kw, sh, sw, 1, 1)
        OH, OW = _out_size(H, W, kh, kw, sh, sw, 1, 1, pads, a.get('ceil_mode', 0))
        self.shape[node.output[0]] = [1, C, OH, OW] if r == 4 else [1, C, OW]
        # a max pool ignores padding, TFLite's SAME average pool counts valid inputs
        # only; ONNX's count_include_pad counts the zeros: a PAD in front
        zeros = name == 'AVERAGE_POOL_2D' and bool(a.get('count_include_pad', 0)) and any(pads)
        y, pad = self._padding(x, H, W, kh, kw, sh, sw, 1, 1, pads, OH, OW, zeros, not zeros) \
            if [OH, OW] == _out_size(H, W, kh, kw, sh, sw, 1, 1, pads, 0) else (None, None)
        if y is None:
            return self._pool_padded(node, x, H, W, C, kh, kw, sh, sw, pads, OH, OW, name,
                                     bool(a.get('count_include_pad', 0)))
        self.emit(name, [y], [self.out(node.output[0], 'nhwc')], padding=pad, stride_h=sh,
                  stride_w=sw, filter_height=kh, filter_width=kw,
                  fused_activation_function='NONE')

    def _pool_padded(self, node, x, H, W, C, kh, kw, sh, sw, pads, OH, OW, name, incl):
        """A pool whose pads (or ceil_mode's last window) are no TFLite SAME or VALID: the
        map padded to the windows (a max pool: its edge rows and columns repeated, which
        every window holding them holds too; an average pool: zeros), pooled VALID; an
        average pool's sums then divided by what each window counts (the input's cells,
        and count_include_pad's pads), a constant map."""
        t, l, pb, pr = pads
        b = max(0, (OH - 1) * sh + kh - H - t)
        r = max(0, (OW - 1) * sw + kw - W - l)
        if name == 'MAX_POOL_2D':
            y = self._edge_nhwc(self._edge_nhwc(x, 1, t, b), 2, l, r)
        else:
            y = self.tensor(self.tensors[x].name + '/padded', [1, H + t + b, W + l + r, C])
            pk = self.tensor(self.tensors[x].name + '/pad', [4, 2],
                             np.array([[0, 0], [t, b], [l, r], [0, 0]], np.int32))
            self.emit('PAD', [x, pk], [y])

        def counts(o, k, s, p0, n, p1):
            lo, hi = (-p0, n + p1) if incl else (0, n)
            st = np.arange(o) * s - p0
            return np.minimum(st + k, hi) - np.maximum(st, lo)
        div = np.outer(counts(OH, kh, sh, t, H, pb), counts(OW, kw, sw, l, W, pr))
        out = self.out(node.output[0], 'nhwc')
        avg = name == 'AVERAGE_POOL_2D' and np.any(div != kh * kw)
        p = self.tensor(self.tensors[out].name + '/sums', [1, OH, OW, C]) if avg else out
        self.emit(name, [y], [p], padding='VALID', stride_h=sh, stride_w=sw,
                  filter_height=kh, filter_width=kw, fused_activation_function='NONE')
        if avg:
            m = self.tensor(self.tensors[out].name + '/counted', [1, OH, OW, 1],
                            (kh * kw / div).reshape(1, OH, OW, 1).astype(np.float32))
            self.tensors[m].frozen = True
            self.emit('MUL', [p, m], [out], fused_activation_function='NONE')

    def _edge_nhwc(self, x, axis, before, after):
        """IR tensor x with its first element along axis repeated before times ahead of it
        and its last after times behind it: STRIDED_SLICEs and a CONCATENATION."""
        if not (before or after):
            return x
        s = list(self.tensors[x].shape)
        base = f'{self.tensors[x].name}/edge{axis}'
        parts = []
        for k, m in ((0, before), (s[axis] - 1, after)):
            if not m:
                parts.append([])
                continue
            begin, end, ps = [0] * len(s), list(s), list(s)
            begin[axis], end[axis], ps[axis] = k, k + 1, 1
            e = self.tensor(f'{base}/at{k}', ps)
            ks = [self.tensor(f'{base}/{w}{k}', [len(s)], np.array(z, np.int32))
                  for w, z in (('begin', begin), ('end', end), ('strides', [1] * len(s)))]
            self.emit('STRIDED_SLICE', [x] + ks, [e])
            parts.append([e] * m)
        s[axis] += before + after
        y = self.tensor(base, s)
        self.emit('CONCATENATION', parts[0] + [x] + parts[1], [y], axis=axis,
                  fused_activation_function='NONE')
        return y

    def op_MaxPool(self, node, ins, a, i):
        if len(node.output) > 1 and node.output[1]:
            self.err('the Indices output is not supported')
        self._pool(node, ins, a, 'MAX_POOL_2D')

    def op_AveragePool(self, node, ins, a, i):
        self._pool(node, ins, a, 'AVERAGE_POOL_2D')

    def _mean(self, v, axes, keep, out):
        s = self.oshape(v)
        r = len(s)
        axes = sorted({int(x) % r for x in axes})
        lay = 'nhwc' if (v in self.nhwc and r in (3, 4)) else 'plain'
        if lay == 'nhwc':
            iaxes = sorted(_pos(r)[x] for x in axes)
            if not keep:
                if r == 3:              # the twin's unit H axis goes too
                    iaxes = sorted(set(iaxes) | {1})
                rest = [_pos(r)[d] for d in range(r) if d not in axes]
                if rest != sorted(rest):
                    lay = 'plain'
        if lay == 'plain':
            iaxes = axes
        x = self.get(v, lay)
        ish = self.tensors[x].shape
        oshape = [1 if d in iaxes else n for d, n in enumerate(ish)] if keep else \
            [n for d, n in enumerate(ish) if d not in iaxes]
        ax = self.tensor(self.tensors[x].name + '/axes', [len(iaxes)], np.array(iaxes, np.int32))
        y = self.tensor(out + ('/nhwc' if lay == 'nhwc' and keep else ''), oshape)
        self.emit('MEAN', [x, ax], [y], keep_dims=bool(keep))
        onnx_shape = [1 if d in axes else n for d, n in enumerate(s)] if keep else \
            [n for d, n in enumerate(s) if d not in axes]
        self.shape[out] = onnx_shape
        if lay == 'nhwc' and keep:
            self.nhwc[out] = y
        else:
            self.plain[out] = y

    def op_GlobalAveragePool(self, node, ins, a, i):
        r = len(self.oshape(ins[0]))
        if r not in (3, 4):
            self.err('GlobalAveragePool of a tensor not 3-D or 4-D')
        if ins[0] not in self.nhwc:
            self.get(ins[0], 'nhwc')
        self._mean(ins[0], list(range(2, r)), True, node.output[0])

    def _embedding(self, node, ins, a):
        """An embedding (PyTorch's nn.Embedding): Gather of an initializer's rows (axis 0)
        by the input's ids -> GATHER (micro/utrain/op_emb.py), whose table trains and goes
        back into the initializer; ids -N..-1 count from the end, as ONNX's Gather (its
        third input, N, says so).  Other gathers of activations are refused."""
        # (a table dequantized, quantize_dynamic's: a weight made of one by steps)
        if ins[0] not in self.inits and ins[0] not in self.reshaped or \
                int(a.get('axis', 0)) or np.ndim(self.const[ins[0]]) != 2:
            self.err('a Gather from a constant by computed ids is read as an embedding: the '
                     'rows (axis 0) of a 2-D initializer (nn.Embedding); this one gathers '
                     f'along axis {a.get("axis", 0)} of {ins[0]!r}, shape '
                     f'{list(np.shape(self.const[ins[0]]))}')
        W = self.const[ins[0]]
        if W.dtype.kind != 'f':
            self.err(f'the table {ins[0]!r} is {W.dtype}; utrain trains float tables')
        n = int(W.shape[0])
        w = self.init_const(ins[0], ins[0], [])
        ids = self.get(ins[1], 'plain')
        y = self.out(node.output[0], 'plain', list(self.oshape(ins[1])) + [int(W.shape[1])])
        self.emit('GATHER', [w, ids, self.tensor(ins[0] + '/rows', [1], np.array([n], np.int32))],
                  [y], axis=0, batch_dims=0)

    def op_ReduceMean(self, node, ins, a, i):
        axes = a.get('axes')
        if len(ins) > 1 and ins[1]:
            axes = [int(v) for v in self.cval(ins[1], 'axes')]
        if axes is None:
            axes = list(range(len(self.oshape(ins[0]))))
        self._mean(ins[0], axes, a.get('keepdims', 1), node.output[0])

    def op_ReduceSum(self, node, ins, a, i):
        self._reduce_sum(ins, a, node.output[0])

    def _reduce_sum(self, ins, a, out):
        """A MEAN times the number of elements it averages (a scalar: frozen), into out."""
        s = self.oshape(ins[0])
        axes = self._axes(ins, a)
        if not axes:
            if a.get('noop_with_empty_axes', 0):
                return self.alias(out, ins[0])
            axes = list(range(len(s)))
        tmp = out + '/mean'
        self._mean(ins[0], axes, a.get('keepdims', 1), tmp)
        n = int(np.prod([s[x % len(s)] for x in set(axes)]))
        lay = 'nhwc' if tmp in self.nhwc else 'plain'
        x = self.get(tmp, lay)
        self._ir('MUL', [x, self._scalar(tmp + '/count', float(n))],
                 self.out(out, lay, self.oshape(tmp)))

    def op_ReduceL2(self, node, ins, a, i):
        """sqrt of the sum of squares (F.normalize's norm): MUL of x by itself, ReduceSum's
        MEAN times the count, SQRT."""
        v, y = ins[0], node.output[0]
        lay = 'nhwc' if v in self.nhwc else 'plain'
        x = self.get(v, lay)
        self._ir('MUL', [x, x], self.out(y + '/square', lay, self.oshape(v)))
        self._reduce_sum([y + '/square'] + list(ins[1:]), a, y + '/sum')
        lay = 'nhwc' if y + '/sum' in self.nhwc else 'plain'
        self._ir('SQRT', [self.get(y + '/sum', lay)], self.out(y, lay, self.oshape(y + '/sum')))

    def op_ReduceMax(self, node, ins, a, i):
        """A max over a run of axes (a global max pool: torch.amax over H, W or over time)
        -> MAX_POOL_2D whose window is the reduced axes (RESHAPEs around it elsewhere)."""
        v = ins[0]
        s = self.oshape(v)
        r = len(s)
        axes = self._axes(ins, a)
        axes = sorted({x % r for x in axes}) if axes else list(range(r))
        keep = a.get('keepdims', 1)
        lay = 'nhwc' if r in (3, 4) and (v in self.nhwc or 1 not in axes) else 'plain'
        x = self.get(v, lay)
        ish = list(self.tensors[x].shape)
        iax = sorted({_pos(r)[d] for d in axes}) if lay == 'nhwc' else axes
        if iax != list(range(iax[0], iax[-1] + 1)):
            self.err(f'max over axes {axes} of {s}: utrain takes the max over one run of '
                     'axes (a max pool)')
        o = node.output[0]
        if lay == 'nhwc' and iax == [1, 2]:
            kh, kw, src, P = ish[1], ish[2], x, 1
        else:                       # [P, R, Q] as a [1, P, R, Q] map, pooled over R
            P, R = int(np.prod(ish[:iax[0]])), int(np.prod([ish[d] for d in iax]))
            Q = int(np.prod(ish[iax[-1] + 1:]))
            kh, kw, src = 1, R, self.reshape_to(x, [1, P, R, Q], o + '/as_nhwc')
        C = self.tensors[src].shape[3]
        pooled = self._ir('MAX_POOL_2D', [src], o + '/pooled', [1, P, 1, C], padding='VALID',
                          stride_h=1, stride_w=1, filter_height=kh, filter_width=kw)
        out = [1 if d in axes else n for d, n in enumerate(s)] if keep else \
            [n for d, n in enumerate(s) if d not in axes]
        if lay == 'nhwc' and keep and iax == [1, 2]:
            self.nhwc[o], self.shape[o] = pooled, out
        else:
            self.reshape_to(pooled, out, out=self.out(o, 'plain', out))

    def op_ReduceLogSumExp(self, node, ins, a, i):
        """torch.logsumexp: m + log(sum(exp(x - m))), m the max over the axes (ReduceMax's
        pool), so that EXP never overflows; its gradient is the softmax over the axes
        (m's share cancels exactly)."""
        o, keep = node.output[0], a.get('keepdims', 1)

        def n(name, t=''):
            nd = _Node([o + name])
            nd.op_type = t
            return nd
        self.op_ReduceMax(n('/max'), [ins[0]] + list(ins[1:]), {**a, 'keepdims': 1}, i)
        self._binary(n('/centered', 'Sub'), [ins[0], o + '/max'])
        self._unary('EXP', n('/exp'), [o + '/centered'])
        self._reduce_sum([o + '/exp'] + list(ins[1:]), {**a, 'keepdims': 1}, o + '/sum')
        self._unary('LOG', n('/log'), [o + '/sum'])
        if keep:
            self._binary(n('', 'Add'), [o + '/log', o + '/max'])
            return
        self._binary(n('/kept', 'Add'), [o + '/log', o + '/max'])
        s = self.oshape(o + '/kept')
        axes = self._axes(ins, a)
        axes = {x % len(s) for x in axes} if axes else set(range(len(s)))
        self._reshape(o + '/kept', [d for k, d in enumerate(s) if k not in axes], o)

    def op_ReduceMin(self, node, ins, a, i):
        """min(x) = -max(-x) (torch.amin): a MUL by -1, ReduceMax's pool, a MUL by -1; the
        gradient goes to the minimum as the max's goes to the maximum."""
        v, o = ins[0], node.output[0]
        lay = 'nhwc' if v in self.nhwc else 'plain'
        self._ir('MUL', [self.get(v, lay), self._scalar(o + '/minus_one', -1.0)],
                 self.out(o + '/negated', lay, self.oshape(v)))
        self.op_ReduceMax(_Node([o + '/max']), [o + '/negated'] + list(ins[1:]), a, i)
        lay = 'nhwc' if o + '/max' in self.nhwc else 'plain'
        self._ir('MUL', [self.get(o + '/max', lay), self._scalar(o + '/minus_one_out', -1.0)],
                 self.out(o, lay, self.oshape(o + '/max')))

    def op_GlobalMaxPool(self, node, ins, a, i):
        r = len(self.oshape(ins[0]))
        a = dict(a, axes=list(range(2, r)), keepdims=1)
        self.get(ins[0], 'nhwc')
        self.op_ReduceMax(node, ins[:1], a, i)

    def op_Expand(self, node, ins, a, i):
        """Broadcast of an activation to a constant shape: copies concatenated along each
        axis it grows (their gradients sum into it)."""
        v = ins[0]
        s = self.oshape(v)
        want = [int(n) for n in np.asarray(self.cval(ins[1], 'the shape')).reshape(-1)]
        out = list(np.broadcast_shapes(tuple(s), tuple(want)))
        readers = self.consumers.get(node.output[0], [])
        if readers and all(c.op_type in ('Add', 'Sub', 'Mul', 'Div') and len(c.input) == 2 and
                           all(u == node.output[0] or u in self.shape and
                               list(self.oshape(u)) == out for u in c.input) for c in readers):
            # read only by elementwise ops whose other operand has the expanded shape
            # (F.normalize: x / norm.expand_as(x)): they broadcast it as they are
            return self.alias(node.output[0], v)
        s1 = [1] * (len(out) - len(s)) + list(s)
        x = self.get(v, 'plain')
        if s1 != s:
            x = self.reshape_to(x, s1, node.output[0] + '/ranked')
        for d, (n, m) in enumerate(zip(s1, out)):
            if n != m:
                x = self.repeat(x, d, m)
        self.plain[node.output[0]], self.shape[node.output[0]] = x, out

    def op_BatchNormalization(self, node, ins, a, i):
        if a.get('training_mode', 0) or (len(node.output) > 1 and any(node.output[1:])):
            self.err('training-mode BatchNormalization: export the model in eval mode')
        for v in ins[1:5]:
            self.cval(v, 'BatchNorm parameters')
        sc, B, mean, var = (np.asarray(self.const[v], np.float64) for v in ins[1:5])
        eps = float(a.get('epsilon', 1e-5))
        s = sc / np.sqrt(var + eps)
        b = B - mean * s
        v = ins[0]
        r = len(self.oshape(v))
        if r == 4 or (r == 3 and v in self.nhwc):
            lay, cshape = 'nhwc', [len(s)]
        elif r == 2:
            lay, cshape = 'plain', [len(s)]
        else:
            lay, cshape = 'plain', [len(s)] + [1] * (r - 2)
        x = self.get(v, lay)
        base = node.name or node.output[0]
        sk = self.tensor(base + '/bn_scale', cshape, s.reshape(cshape).astype(np.float32))
        bk = self.tensor(base + '/bn_shift', cshape, b.reshape(cshape).astype(np.float32))
        sn, bn = self.tensors[sk].name, self.tensors[bk].name
        # (mean and var: their values, as a constant of any spelling: torch.onnx writes a
        # fresh BatchNorm1d's running_var as an Identity of its weight, both ones, and its
        # running_mean of its bias; export had said 'comes from no initializer')
        info = dict(scale=ins[1], B=ins[2], mean=ins[3], var=ins[4], eps=eps,
                    scale_tensor=sn, shape=cshape, mean_v=mean, var_v=var)
        if all(u in self.inits for u in ins[1:3]):
            self.origin[sn] = ('bn_scale', info)
            self.origin[bn] = ('bn_shift', info)
        mid = self.tensor(node.output[0] + '/bn_scaled', self.tensors[x].shape)
        self.emit('MUL', [x, sk], [mid], fused_activation_function='NONE')
        self.emit('ADD', [mid, bk], [self.out(node.output[0], lay, self.oshape(v))],
                  fused_activation_function='NONE')

    def _normalized(self, x, axes, n, eps):
        """(x - mean) / sqrt(var + eps) over IR axes of x as tico writes LayerNorm: MEAN,
        SUB, MUL, MEAN, ADD eps, RSQRT, MUL."""
        s = list(self.tensors[x].shape)
        red = [1 if d in axes else k for d, k in enumerate(s)]
        ax = lambda: self.tensor(n + '/axes', [len(axes)], np.array(axes, np.int32))  # noqa: E731
        m = self._ir('MEAN', [x, ax()], n + '/mean', red, keep_dims=True)
        d = self._ir('SUB', [x, m], n + '/centered', s)
        var = self._ir('MEAN', [self._ir('MUL', [d, d], n + '/squared'), ax()], n + '/var', red,
                       keep_dims=True)
        ve = self._ir('ADD', [var, self._scalar(n + '/eps', eps)], n + '/var_eps')
        return self._ir('MUL', [d, self._ir('RSQRT', [ve], n + '/rstd')], n + '/normalized', s)

    def op_InstanceNormalization(self, node, ins, a, i):
        """Per sample and channel over the spatial axes (nn.InstanceNorm1d/2d; GroupNorm
        exports as one over [N, groups, -1]): tico's LayerNorm ops over those axes, then
        the per-channel scale and bias (trainable; left out where they are constant ones
        and zeros that are not initializers, as GroupNorm's export writes them)."""
        v = ins[0]
        s = self.oshape(v)
        r = len(s)
        if r < 3:
            self.err(f'input of shape {s}: InstanceNormalization needs [N, C, spatial...]')
        lay = 'nhwc' if r in (3, 4) and v in self.nhwc else 'plain'
        x = self.get(v, lay)
        n = node.output[0]
        cur = self._normalized(x, [1, 2] if lay == 'nhwc' else list(range(2, r)), n,
                               float(a.get('epsilon', 1e-5)))
        cshape = [s[1]] if lay == 'nhwc' else [s[1]] + [1] * (r - 2)
        for k, name, unit in ((ins[1], 'MUL', 1.0), (ins[2], 'ADD', 0.0)):
            c = np.asarray(self.cval(k, 'the scale and bias'), np.float32)
            if k not in self.inits and np.all(c == unit):
                continue
            ck = self.const_tensor(k, c.reshape(cshape), k if k in self.inits else None,
                                   [('R', list(c.shape), cshape)])
            cur = self._ir(name, [cur, ck], f'{n}/{name.lower()}')
        self.shape[n] = list(s)
        (self.nhwc if lay == 'nhwc' else self.plain)[n] = cur

    def op_LayerNormalization(self, node, ins, a, i):
        v = ins[0]
        s = self.oshape(v)
        axis = int(a.get('axis', -1)) % len(s)
        if axis != len(s) - 1:
            self.err(f'axis {a.get("axis")}: utrain normalizes over the last axis only')
        if len(node.output) > 1 and any(node.output[1:]):
            self.err('the Mean / InvStdDev outputs are not supported')
        eps = float(a.get('epsilon', 1e-5))
        x = self.get(v, 'plain')
        n = node.output[0]
        cur = self._normalized(x, [len(s) - 1], n, eps)
        sc = np.asarray(self.cval(ins[1], 'the scale'))
        last = [len(ins) > 2 and bool(ins[2])]
        sk = self.const_tensor(ins[1], sc.reshape(-1),
                               ins[1] if ins[1] in self.inits else None,
                               [('R', list(sc.shape), [sc.size])])
        y = self.tensor(n + '/scaled', s) if last[0] else self.out(n, 'plain', s)
        self.emit('MUL', [cur, sk], [y], fused_activation_function='NONE')
        if last[0]:
            bc = np.asarray(self.cval(ins[2], 'the bias'))
            bk = self.const_tensor(ins[2], bc.reshape(-1),
                                   ins[2] if ins[2] in self.inits else None,
                                   [('R', list(bc.shape), [bc.size])])
            self.emit('ADD', [y, bk], [self.out(n, 'plain', s)], fused_activation_function='NONE')

    def _softmax_axis(self, a, s):
        """The axis a Softmax / LogSoftmax node of input shape s normalises over (-1 by
        default from opset 13, 1 before)."""
        opset = max((o.version for o in self.model.opset_import if o.domain in ('', 'ai.onnx')),
                    default=13)
        return int(a.get('axis', -1 if opset >= 13 else 1)) % len(s)

    def op_Softmax(self, node, ins, a, i):
        v = ins[0]
        s = self.oshape(v)
        axis = self._softmax_axis(a, s)
        if axis == 1 and (len(s) == 4 or (len(s) == 3 and v in self.nhwc)):
            x = self.get(v, 'nhwc')
            self.emit('SOFTMAX', [x], [self.out(node.output[0], 'nhwc', s)], beta=1.0)
            return
        x, n = self.get(v, 'plain'), node.output[0]
        if axis != len(s) - 1:
            # over another axis (attention weights over time, [N, T, 1]): moved last,
            # normalised there and moved back, as TensorFlow's converter writes it
            if len(s) > 4:
                self.err(f'softmax over axis {axis} of shape {s}: utrain moves it last '
                         'for up to 4 axes; give the softmax the last axis')
            p = list(range(len(s)))
            p[axis], p[-1] = p[-1], p[axis]
            t = self.tensor(n + '/moved', [s[d] for d in p])
            self.emit('TRANSPOSE', [x, self.perm_const(n + '/moved', p)], [t])
            x = self.tensor(n + '/softmax', [s[d] for d in p])
            self.emit('SOFTMAX', [t], [x], beta=1.0)
            self.emit('TRANSPOSE', [x, self.perm_const(n, p)], [self.out(n, 'plain', s)])
            return
        self.emit('SOFTMAX', [x], [self.out(n, 'plain', s)], beta=1.0)

    def op_CumSum(self, node, ins, a, i):
        """A running total along a constant axis (torch.cumsum): TFLite's CUMSUM, which
        spellings.cumsums_to_fc makes a FULLY_CONNECTED by a frozen triangle."""
        v = ins[0]
        s = self.oshape(v)
        axis = int(np.asarray(self.cval(ins[1], 'the axis')).reshape(-1)[0]) % len(s)
        n = node.output[0]
        ax = self.tensor(n + '/axis', [], np.array(axis, np.int32))
        self.emit('CUMSUM', [self.get(v, 'plain'), ax], [self.out(n, 'plain', s)],
                  exclusive=bool(a.get('exclusive', 0)),
                  reverse=bool(a.get('reverse', 0)))

    def op_LogSoftmax(self, node, ins, a, i):
        # (only as the model's last op: ir.drop_final_log_softmax trains its logits)
        v = ins[0]
        s = self.oshape(v)
        axis = self._softmax_axis(a, s)
        if axis != len(s) - 1:
            self.err(f'log_softmax over axis {axis} of shape {s}: utrain takes the last axis')
        self.emit('LOG_SOFTMAX', [self.get(v, 'plain')], [self.out(node.output[0], 'plain', s)])

    # ---- shapes
    def _reshape(self, v, out_shape, out, node_out_consumers_fc=False):
        s = self.oshape(v)
        self.shape[out] = list(out_shape)
        if v in self.nhwc and v not in self.plain and len(s) in (3, 4):
            n, c, h, w = _to4(s)
            if c == 1 or h * w == 1:                     # same order in both layouts
                x = self.nhwc[v]
            elif node_out_consumers_fc and len(out_shape) == 2 and out_shape[0] == 1:
                # flatten for a Gemm: the weight's columns take the NHWC order
                src = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
                y = self.tensor(out, out_shape)
                shp = self.tensor(out + '/shape', [2], np.array(out_shape, np.int32))
                self.emit('RESHAPE', [self.nhwc[v], shp], [y], new_shape=list(out_shape))
                self.colperm[out] = (y, src)
                return
            else:
                x = self.get(v, 'plain')
        else:
            x = self.get(v, 'plain')
        shp = self.tensor(out + '/shape', [len(out_shape)], np.array(out_shape, np.int32))
        self.emit('RESHAPE', [x, shp], [self.out(out, 'plain', out_shape)],
                  new_shape=list(out_shape))

    def _fc_only(self, out):
        cs = self.consumers.get(out, [])
        return bool(cs) and all(c.op_type in ('Gemm', 'MatMul') and c.input[0] == out
                                and np.ndim(self.const.get(c.input[1])) == 2 for c in cs) and \
            out not in [o.name for o in self.model.graph.output]

    def op_Flatten(self, node, ins, a, i):
        s = self.oshape(ins[0])
        ax = int(a.get('axis', 1)) % (len(s) + 1) if len(s) else 0
        shape = [int(np.prod(s[:ax])), int(np.prod(s[ax:]))]
        self._reshape(ins[0], shape, node.output[0], self._fc_only(node.output[0]))

    def op_Reshape(self, node, ins, a, i):
        s = self.oshape(ins[0])
        want = [int(x) for x in self.cval(ins[1], 'the shape')]
        want = [s[j] if x == 0 and not a.get('allowzero') else x for j, x in enumerate(want)]
        shape = list(np.empty(s, np.int8).reshape(want).shape)
        self._reshape(ins[0], shape, node.output[0], self._fc_only(node.output[0]))

    def _axes(self, ins, a):
        if len(ins) > 1 and ins[1]:
            return [int(v) for v in self.cval(ins[1], 'axes')]
        return a.get('axes')

    def op_Squeeze(self, node, ins, a, i):
        s = self.oshape(ins[0])
        axes = self._axes(ins, a)
        axes = {x % len(s) for x in axes} if axes is not None else {d for d, n in enumerate(s) if n == 1}
        self._reshape(ins[0], [n for d, n in enumerate(s) if d not in axes], node.output[0],
                      self._fc_only(node.output[0]))

    def op_Unsqueeze(self, node, ins, a, i):
        s = self.oshape(ins[0])
        axes = self._axes(ins, a)
        n = len(s) + len(axes)
        out = list(s)
        for ax in sorted(x % n for x in axes):
            out.insert(ax, 1)
        self._reshape(ins[0], out, node.output[0])

    def op_Transpose(self, node, ins, a, i):
        v = ins[0]
        s = self.oshape(v)
        p = list(a.get('perm', list(range(len(s)))[::-1]))
        out_shape = [s[d] for d in p]
        if v in self.nhwc and v not in self.plain:
            x = self.nhwc[v]
            if len(s) == 3:             # the twin [N, 1, L, C] is [N, L, C] reshaped
                x = self.reshape_to(x, [s[0], s[2], s[1]], v + '/nlc')
                q = [(0, 2, 1)[d] for d in p]
            else:
                q = [POS_IN_NHWC[d] for d in p]
            if q == list(range(len(s))):       # x.permute(0, 2, 1) of a Conv1d's map
                self.plain[node.output[0]] = x
                self.shape[node.output[0]] = out_shape
                return
            self.emit('TRANSPOSE', [x, self.perm_const(v, q)],
                      [self.out(node.output[0], 'plain', out_shape)])
            return
        if p == list(NHWC_TO_NCHW):     # NHWC data made NCHW (tf2onnx): the output's NHWC
            self.nhwc[node.output[0]] = self.get(v, 'plain')    # twin is the input
            self.shape[node.output[0]] = out_shape
            return
        x = self.get(v, 'plain')
        y = self.out(node.output[0], 'plain', out_shape)
        if len(s) > 4:
            return self._transpose_compact(x, s, p, y)
        self.emit('TRANSPOSE', [x, self.perm_const(v, p)], [y])

    def _transpose_compact(self, x, s, p, y):
        """A transpose of more than 4 axes (a channel shuffle's view(n, g, c/g, h, w)
        .transpose(1, 2)) without its size-1 axes and with the axes that stay together
        merged: RESHAPE, a TRANSPOSE of at most 4 axes, RESHAPE."""
        keep = [d for d in range(len(s)) if s[d] != 1]
        groups = []
        for d in (d for d in p if s[d] != 1):
            if groups and keep.index(d) == keep.index(groups[-1][-1]) + 1:
                groups[-1].append(d)
            else:
                groups.append([d])
        order = sorted(range(len(groups)), key=lambda j: groups[j][0])
        if len(groups) > 4:
            self.err(f'a transpose of {s} by {p} moves more than 4 axes; utrain transposes '
                     'up to 4')
        if len(groups) < 2:
            self.reshape_to(x, self.tensors[y].shape, out=y)
            return
        red = [int(np.prod([s[d] for d in groups[j]])) for j in order]
        xr = self.reshape_to(x, red, self.tensors[x].name + '/grouped')
        q = [order.index(j) for j in range(len(groups))]
        t = self.tensor(self.tensors[y].name + '/moved', [red[k] for k in q])
        self.emit('TRANSPOSE', [xr, self.perm_const(self.tensors[y].name, q)], [t])
        self.reshape_to(t, self.tensors[y].shape, out=y)

    def _layout_for(self, vs):
        r = len(self.oshape(vs[0]))
        return 'nhwc' if r in (3, 4) and all(len(self.oshape(v)) == r for v in vs) and \
            any(v in self.nhwc for v in vs) else 'plain'

    def op_Concat(self, node, ins, a, i):
        """CONCATENATION of the activations and constants (a CoordConv's coordinate
        channels, a fixed token: laid out as the activations, frozen) in the layout the
        activations share."""
        vs = [v for v in ins if v]
        acts = [v for v in vs if v not in self.const]
        lay = self._layout_for(acts)
        r = len(self.oshape(acts[0]))

        def shape(v):
            return list(self.oshape(v)) if v not in self.const else list(np.shape(self.const[v]))
        if any(len(shape(v)) != r for v in vs):
            self.err(f'operands of shapes {[shape(v) for v in vs]}: a Concat of one rank')
        axis = int(a['axis']) % r
        if lay == 'nhwc':
            axis = _pos(r)[axis]
        xs = []
        for v in vs:
            if v not in self.const:
                xs.append(self.get(v, lay))
                continue
            c = np.asarray(self.const[v])
            steps = [('R', list(c.shape), _to4(c.shape)), ('T', NCHW_TO_NHWC)] \
                if lay == 'nhwc' else []
            xs.append(self.const_tensor(v, apply_steps(c, steps), v if v in self.inits else None,
                                        steps))
            self.tensors[xs[-1]].frozen = True
        oshape = shape(acts[0])
        oshape[int(a['axis']) % r] = sum(shape(v)[int(a['axis']) % r] for v in vs)
        self.emit('CONCATENATION', xs, [self.out(node.output[0], lay, oshape)], axis=axis,
                  fused_activation_function='NONE')

    def op_Tile(self, node, ins, a, i):
        """Tile of an activation by constant repeats (torch's x.repeat, a seq2seq decoder's
        latent repeated a step each): a CONCATENATION of m copies along each axis it
        repeats (their gradients sum into it)."""
        v = ins[0]
        s = list(self.oshape(v))
        reps = [int(n) for n in np.asarray(self.cval(ins[1], 'the repeats')).reshape(-1)]
        if len(reps) != len(s) or min(reps) < 1:
            self.err(f'repeats {reps} for an input of shape {s}')
        x = self.get(v, 'plain')
        for d, m in enumerate(reps):
            if m > 1:
                s[d] *= m
                y = self.tensor(node.output[0] + f'/tile{d}', s)
                self.emit('CONCATENATION', [x] * m, [y], axis=d, fused_activation_function='NONE')
                x = y
        self.plain[node.output[0]], self.shape[node.output[0]] = x, s

    def op_Split(self, node, ins, a, i):
        v = ins[0]
        s = self.oshape(v)
        r = len(s)
        axis = int(a.get('axis', 0)) % r
        if len(ins) > 1 and ins[1]:
            sizes = [int(x) for x in self.cval(ins[1], 'split')]
        elif 'split' in a:
            sizes = list(a['split'])
        else:
            n = len(node.output)
            sizes = [-(-s[axis] // n)] * n
            sizes[-1] = s[axis] - sum(sizes[:-1])
        lay = 'nhwc' if r in (3, 4) and v in self.nhwc else 'plain'
        x = self.get(v, lay)
        iax = _pos(r)[axis] if lay == 'nhwc' else axis
        outs = []
        for o, n in zip(node.output, sizes):
            os_ = list(s)
            os_[axis] = n
            outs.append(self.out(o, lay, os_))
        sz = self.tensor(node.output[0] + '/split_sizes', [len(sizes)], np.array(sizes, np.int32))
        axk = self.tensor(node.output[0] + '/split_axis', [], np.array(iax, np.int32))
        self.emit('SPLIT_V', [x, sz, axk], outs, num_splits=len(sizes))

    def _slice_args(self, ins, a, s):
        """(begin, end, stride) per axis of a Slice node on a value of shape s."""
        r = len(s)
        if len(ins) >= 3:
            st = [int(x) for x in self.cval(ins[1], 'starts')]
            en = [int(x) for x in self.cval(ins[2], 'ends')]
            ax = [int(x) for x in self.cval(ins[3], 'axes')] if len(ins) > 3 and ins[3] \
                else list(range(len(st)))
            sp = [int(x) for x in self.cval(ins[4], 'steps')] if len(ins) > 4 and ins[4] \
                else [1] * len(st)
        else:
            st, en = list(a['starts']), list(a['ends'])
            ax, sp = list(a.get('axes', range(len(st)))), [1] * len(st)
        begin, end, stride, past = [0] * r, list(s), [1] * r, [0] * r
        for b, e, d, k in zip(st, en, ax, sp):
            d %= r
            if k == 0:
                self.err('step 0: the file is not a valid model (ONNX Slice steps are not 0)')
            n = s[d]
            if k > 0:
                b = min(max(b + n if b < 0 else b, 0), n)
                e = min(max(e + n if e < 0 else e, 0), n)
            else:               # (torch.flip: backwards, the end clamped to -1, past index 0)
                b = min(max(b + n if b < 0 else b, 0), n - 1)
                e = min(max(e + n if e < 0 else e, -1), n - 1)
                past[d] = int(e < 0)
            begin[d], end[d], stride[d] = b, e, k
        return begin, end, stride, past

    def op_Slice(self, node, ins, a, i):
        v = ins[0]
        s = self.oshape(v)
        r = len(s)
        begin, end, stride, past = self._slice_args(ins, a, s)
        out_shape = [max(0, -(-(e - b) // k)) for b, e, k in zip(begin, end, stride)]
        lay = 'nhwc' if r in (3, 4) and v in self.nhwc else 'plain'
        if lay == 'nhwc':
            begin, end, stride = _twin_list(begin, 0), _twin_list(end, 1), _twin_list(stride, 1)
            past = _twin_list(past, 0)
        x = self.get(v, lay)
        ks = [self.tensor(node.output[0] + '/' + w, [len(z)], np.array(z, np.int32))
              for w, z in (('begin', begin), ('end', end), ('strides', stride))]
        # (a backward axis running past index 0: TFLite's end_mask, its end -1 being n - 1;
        # spellings.reversed_slices makes such a slice ops that train)
        mask = sum(1 << d for d, f in enumerate(past) if f)
        self.emit('STRIDED_SLICE', [x] + ks, [self.out(node.output[0], lay, out_shape)],
                  **({'end_mask': mask} if mask else {}))

    def op_Gather(self, node, ins, a, i):
        """Gather of an activation at constant indices (y[:, -1] of a sequence): a
        STRIDED_SLICE per run of consecutive indices (one CONCATENATION of them for
        others), a RESHAPE dropping the axis for a scalar index.  A constant's rows by
        computed ids: an embedding (_embedding)."""
        v = ins[0]
        if v in self.const:
            return self._embedding(node, ins, a)
        s = self.oshape(v)
        r = len(s)
        axis = int(a.get('axis', 0)) % r
        idx = np.asarray(self.cval(ins[1], 'the indices')).astype(np.int64)
        if idx.ndim > 1:
            self.err(f'indices of shape {list(idx.shape)}: utrain gathers a scalar or a list')
        flat = [int(k) % s[axis] for k in idx.reshape(-1)]
        runs = []
        for k in flat:
            if runs and runs[-1][1] == k:
                runs[-1][1] = k + 1
            else:
                runs.append([k, k + 1])
        x = self.get(v, 'plain')
        base = node.output[0]
        parts = []
        for j, (b, e) in enumerate(runs):
            begin, end = [0] * r, list(s)
            begin[axis], end[axis] = b, e
            ps = list(s)
            ps[axis] = e - b
            y = self.tensor(f'{base}/gather{j}', ps)
            ks = [self.tensor(f'{base}/{w}{j}', [r], np.array(z, np.int32))
                  for w, z in (('begin', begin), ('end', end), ('strides', [1] * r))]
            self.emit('STRIDED_SLICE', [x] + ks, [y])
            parts.append(y)
        full = list(s)
        full[axis] = len(flat)
        if len(parts) > 1:
            y = self.tensor(base + '/gathered', full)
            self.emit('CONCATENATION', parts, [y], axis=axis, fused_activation_function='NONE')
            parts = [y]
        oshape = s[:axis] + list(idx.shape) + s[axis + 1:]
        if oshape == full:
            self.plain[node.output[0]] = parts[0]
            self.shape[node.output[0]] = oshape
        else:
            self.reshape_to(parts[0], oshape, out=self.out(node.output[0], 'plain', oshape))

    def repeat(self, x, axis, m):
        """IR tensor x with each element repeated m times along axis (nearest upsampling):
        a RESHAPE to [P, 1, Q], a CONCATENATION of m copies (their gradients sum into x,
        as prepare's TILE rewrite does it), a RESHAPE back."""
        sh = list(self.tensors[x].shape)
        P, Q = int(np.prod(sh[:axis + 1])), int(np.prod(sh[axis + 1:]))
        name = self.tensors[x].name
        x3 = self.reshape_to(x, [P, 1, Q], f'{name}/rep{axis}')
        y3 = self.tensor(f'{name}/rep{axis}x{m}', [P, m, Q])
        self.emit('CONCATENATION', [x3] * m, [y3], axis=1, fused_activation_function='NONE')
        sh[axis] *= m
        return self.reshape_to(y3, sh, f'{name}/repeated{axis}')

    def op_Resize(self, node, ins, a, i):
        """Resize (and opset 7-9 Upsample) mode nearest by integer factors: each element
        repeated along each scaled axis (nn.Upsample(scale_factor=k), F.interpolate with
        an integer multiple of the size)."""
        v = ins[0]
        s = self.oshape(v)
        r = len(s)
        mode = a.get('mode', 'nearest')
        scales = sizes = None
        scales_v = a.get('scales')                          # Upsample opset 7-8
        if node.op_type == 'Upsample' or len(ins) == 2:          # X, scales
            scales = ins[1] if len(ins) > 1 and ins[1] else None
        else:
            scales = ins[2] if len(ins) > 2 and ins[2] else None
            sizes = ins[3] if len(ins) > 3 and ins[3] else None
        axes = list(a.get('axes', range(r)))
        if sizes is not None:
            want = [int(n) for n in np.asarray(self.cval(sizes, 'sizes')).reshape(-1)]
            out = list(s)
            for d, n in zip(axes, want):
                out[d % r] = n
            if a.get('keep_aspect_ratio_policy', 'stretch') != 'stretch':
                self.err('keep_aspect_ratio_policy other than stretch is not supported')
        else:
            if scales is None and scales_v is None:
                self.err('neither scales nor sizes given')
            sc = [float(f) for f in np.asarray(self.cval(scales, 'scales')).reshape(-1)] \
                if scales is not None else [float(f) for f in scales_v]
            out = list(s)
            for d, f in zip(axes, sc):
                out[d % r] = int(np.floor(s[d % r] * f + 1e-9))
        mult = [o // n if o % n == 0 else 0 for o, n in zip(out, s)]
        if (mode == 'linear' and out != list(s) or min(mult) < 1) and r == 4 and out[:2] == s[:2]:
            return self._resize_hw(node, v, s, out, mode, None if sizes is not None else
                                   sc[-2:] if len(sc) >= 2 else None, a)
        if (mode == 'linear' and out != list(s) or min(mult) < 1) and r == 3 and out[:2] == s[:2]:
            # a 1-D resize (F.interpolate(mode='linear') of [N, C, L]): the map [N, C, 1, L]
            # resized along its width, as _resize_hw does; prepare had refused it
            o = node.output[0]
            self._reshape(v, s[:2] + [1, s[2]], o + '/as_map')
            n4 = _Node([o + '/map'])
            n4.op_type = node.op_type
            self._resize_hw(n4, o + '/as_map', s[:2] + [1, s[2]], out[:2] + [1, out[2]], mode,
                            None if sizes is not None else [1.0, sc[-1]], a)
            self._reshape(o + '/map', out, o)
            return
        if min(mult) < 1:
            self.err(f'resizing {s} to {out}: utrain resizes by integer factors only '
                     '(nearest, e.g. nn.Upsample(scale_factor=2))')
        if max(mult) > 1 and mode != 'nearest':
            self.err(f"mode {mode}: utrain resizes with mode 'linear' (bilinear) or 'nearest'; "
                     "export the model with one of them")
        ctm = a.get('coordinate_transformation_mode', 'half_pixel' if node.op_type == 'Resize'
                  else 'asymmetric')
        nm = a.get('nearest_mode', 'round_prefer_floor' if node.op_type == 'Resize' else 'floor')
        for n, m in zip(s, mult):
            if m > 1:
                src = _nearest_src(n, n * m, ctm, nm)
                if src is None or not np.array_equal(src, np.repeat(np.arange(n), m)):
                    self.err(f'coordinate_transformation_mode {ctm} with nearest_mode {nm} '
                             f'does not repeat each value {m} times; utrain upsamples by '
                             'repeating (PyTorch nn.Upsample nearest exports so)')
        lay = 'nhwc' if r in (3, 4) and v in self.nhwc else 'plain'
        x = self.get(v, lay)
        for d, m in enumerate(mult):
            if m > 1:
                x = self.repeat(x, _pos(r)[d] if lay == 'nhwc' else d, m)
        self.shape[node.output[0]] = out
        (self.nhwc if lay == 'nhwc' else self.plain)[node.output[0]] = x

    def _resize_hw(self, node, v, s, out, mode, sc, a):
        """Resize of an NCHW map's height and width, mode linear (nn.Upsample bilinear,
        F.interpolate) or nearest by factors not whole: TFLite's RESIZE_BILINEAR /
        RESIZE_NEAREST_NEIGHBOR (utrain's op_rsz) on the NHWC map, with the flags that
        pick the same source pixels and weights as ONNX's mode."""
        from ..graph.optable import _resize_axis
        if mode not in ('linear', 'nearest'):
            self.err(f"mode {mode}: utrain resizes with mode 'linear' (bilinear) or 'nearest'; "
                     "export the model with one of them")
        ctm = a.get('coordinate_transformation_mode', 'half_pixel' if node.op_type == 'Resize'
                  else 'asymmetric')
        flags = {'half_pixel': (False, True), 'pytorch_half_pixel': (False, True),
                 'align_corners': (True, False), 'asymmetric': (False, False)}.get(ctm)
        what = f'resizing {s} to {out} ({mode}, coordinate_transformation_mode {ctm}'
        if flags is None or ctm == 'pytorch_half_pixel' and \
                1 in [o for o, n in zip(out[2:], s[2:]) if o != n]:
            self.err(f'{what}): utrain resizes as half_pixel, align_corners or asymmetric do '
                     '(PyTorch interpolate exports them)')
        if mode == 'linear' and sc and ctm != 'align_corners' and any(abs(n * f - o) > 1e-6 * o
                                                  for n, f, o in zip(s[2:], sc, out[2:])):
            self.err(f'{what}): scales [{", ".join("%g" % f for f in sc)}] do not give whole sizes; give sizes (F.interpolate(size=...)) '
                     'or scales that do')
        if mode == 'linear' and a.get('antialias', 0) and any(o < n for n, o in zip(s[2:], out[2:])):
            self.err(f'{what}): antialias when shrinking is not supported; export with antialias=False')
        if mode == 'nearest':
            nm = a.get('nearest_mode', 'round_prefer_floor' if node.op_type == 'Resize' else 'floor')
            picks = [(al, hp) for al, hp in ((False, True), (True, False), (False, False))
                     if all(np.array_equal(_nearest_src(n, o, ctm, nm, f), _resize_axis(n, o, al, hp, True)[::3])
                            for n, o, f in zip(s[2:], out[2:], sc or (None, None)))]
            if not picks:
                self.err(f'{what}, nearest_mode {nm}): picks source pixels no TFLite resize '
                         'picks (its scale is not the output size over the input size); give '
                         'F.interpolate the size (size=...) instead of scale_factor')
            flags = picks[0]
        x = self.get(v, 'nhwc')
        y = self.tensor(node.output[0] + '/nhwc', _nhwc_shape(out))
        size = self.const_tensor(node.output[0] + '/size', out[2:], dtype=np.int32)
        self.emit('RESIZE_BILINEAR' if mode == 'linear' else 'RESIZE_NEAREST_NEIGHBOR', [x, size], [y],
                  align_corners=flags[0], half_pixel_centers=flags[1])
        self.shape[node.output[0]] = out
        self.nhwc[node.output[0]] = y

    def op_Upsample(self, node, ins, a, i):
        self.op_Resize(node, ins, a, i)

    def op_DepthToSpace(self, node, ins, a, i):
        """DEPTH_TO_SPACE of the NHWC map (mode DCR as TFLite's; CRD, torch's
        PixelShuffle: Operator.crd), spelled by prepare (spellings.depth_to_space)."""
        N, C, H, W = self.oshape(ins[0])
        b = int(a.get('blocksize', 0))
        if len(self.oshape(ins[0])) != 4 or b < 1 or C % (b * b):
            self.err(f'blocksize {b} for an input of shape {self.oshape(ins[0])}')
        op = self.emit('DEPTH_TO_SPACE', [self.get(ins[0], 'nhwc')],
                       [self.out(node.output[0], 'nhwc', [N, C // (b * b), H * b, W * b])],
                       block_size=b)
        op.crd = a.get('mode', 'DCR') == 'CRD'

    def op_Pad(self, node, ins, a, i):
        """PAD (zeros), PADV2 (another constant value) or MIRROR_PAD (mode reflect; mode
        edge: the border row repeated, Operator.edge), the last two spelled by prepare
        (spellings.mirror_pads, padv2_to_pad); negative pads crop first (a
        STRIDED_SLICE); mode wrap: _pad_wrapped."""
        mode = a.get('mode', 'constant')
        if isinstance(mode, bytes):
            mode = mode.decode()
        if mode not in ('constant', 'reflect', 'edge', 'wrap'):
            self.err(f'mode {mode}: utrain pads with a constant, a reflection, the edge or a wrap')
        v = ins[0]
        s = self.oshape(v)
        r = len(s)
        pads = [int(x) for x in self.cval(ins[1], 'pads')] if len(ins) > 1 and ins[1] \
            else list(a.get('pads'))
        value = float(np.asarray(self.const[ins[2]]).reshape(-1)[0]) \
            if len(ins) > 2 and ins[2] else float(a.get('value', 0.0))
        axes = [int(x) % r for x in self.cval(ins[3], 'axes')] if len(ins) > 3 and ins[3] \
            else list(range(r))
        pp = [[0, 0] for _ in range(r)]
        for j, d in enumerate(axes):
            pp[d] = [pads[j], pads[j + len(axes)]]
        if mode == 'wrap' and any(p[0] or p[1] for p in pp):   # (F.pad circular)
            if min(min(p) for p in pp) < 0:
                self.err('negative pads (crops) with mode wrap are not supported: crop first '
                         '(a Slice), then pad')
            return self._pad_wrapped(node, v, s, pp, i)
        lay = 'nhwc' if r in (3, 4) and v in self.nhwc else 'plain'
        x = self.get(v, lay)
        if min(min(p) for p in pp) < 0:         # (a crop: F.pad with negative pads)
            cut = [n + min(p[0], 0) + min(p[1], 0) for n, p in zip(s, pp)]
            if min(cut) < 1:
                self.err(f'pads {pads} crop all of shape {s}')
            begin, end = [-min(p[0], 0) for p in pp], [n + min(p[1], 0) for n, p in zip(s, pp)]
            shape = cut
            if lay == 'nhwc':
                begin, end, shape = _twin_list(begin, 0), _twin_list(end, 1), _nhwc_shape(cut)
            c = node.output[0] + '/crop'
            ks = [self.tensor(c + n, [len(q)], np.array(q, np.int32)) for n, q in (
                ('/begin', begin), ('/end', end), ('/strides', [1] * len(begin)))]
            y = self.tensor(c, shape)
            self.emit('STRIDED_SLICE', [x] + ks, [y])
            x, s, pp = y, cut, [[max(p[0], 0), max(p[1], 0)] for p in pp]
        out_shape = [n + p[0] + p[1] for n, p in zip(s, pp)]
        if lay == 'nhwc':
            pp = _twin_list(pp, [0, 0])
        pk = self.tensor(node.output[0] + '/paddings', [len(pp), 2], np.array(pp, np.int32))
        y = self.out(node.output[0], lay, out_shape)
        if mode != 'constant':
            op = self.emit('MIRROR_PAD', [x, pk], [y], mode='REFLECT')
            op.edge = mode == 'edge'
        elif value != 0:
            k = self.tensor(node.output[0] + '/value', [], np.array(value, np.float32))
            self.tensors[k].frozen = True
            self.emit('PADV2', [x, pk, k], [y])
        else:
            self.emit('PAD', [x, pk], [y])

    def _pad_wrapped(self, node, v, s, pp, i):
        """Pad of mode wrap (torch's F.pad 'circular'; op_Pad reads reflect and edge as a
        MIRROR_PAD): along each padded axis a Gather of the input's own elements at
        constant indices (op_Gather: STRIDED_SLICEs and a CONCATENATION, which train)."""
        from onnx import helper
        cur, last = v, max(d for d, p in enumerate(pp) if p[0] or p[1])
        for d, (p0, p1) in enumerate(pp):
            if not (p0 or p1):
                continue
            n = s[d]
            if max(p0, p1) > n:
                self.err(f'wrap pads {[p0, p1]} of an axis of {n}: a wrap pads at most n')
            out = node.output[0] if d == last else f'{node.output[0]}/pad{d}'
            self.const[out + '/idx'] = (np.arange(-p0, n + p1) % n).astype(np.int64)
            self.op_Gather(helper.make_node('Gather', [cur, out + '/idx'], [out], axis=d),
                           [cur, out + '/idx'], {'axis': d}, i)
            s = list(s)
            s[d] = n + p0 + p1
            cur = out

def _out_size(H, W, kh, kw, sh, sw, dh, dw, pads, ceil):
    t, l, b, r = pads
    out = []
    for n, k, s, d, p0, p1 in ((H, kh, sh, dh, t, b), (W, kw, sw, dw, l, r)):
        span = n + p0 + p1 - ((k - 1) * d + 1)
        o = (-(-span // s) if ceil else span // s) + 1
        if ceil and (o - 1) * s >= n + p0:
            o -= 1                  # the last window must start inside the input
        out.append(o)
    return out


def _nearest_src(n, out, ctm, nm, sc=None):
    """Source index of each of out outputs of ONNX Resize mode nearest along an axis of n
    (coordinate_transformation_mode ctm, nearest_mode nm, the scale given, else out / n),
    or None for a mode not known."""
    x = np.arange(out, dtype=np.float64)
    sc = sc or out / n
    f = {'half_pixel': lambda: (x + 0.5) / sc - 0.5,
         'pytorch_half_pixel': lambda: (x + 0.5) / sc - 0.5 if out > 1 else 0 * x,
         'align_corners': lambda: x * (n - 1) / (out - 1) if out > 1 else 0 * x,
         'asymmetric': lambda: x / sc,
         'tf_half_pixel_for_nn': lambda: (x + 0.5) / sc}.get(ctm)
    r = {'round_prefer_floor': lambda u: np.where(u - np.floor(u) == 0.5, np.floor(u), np.round(u)),
         'round_prefer_ceil': lambda u: np.where(u - np.floor(u) == 0.5, np.ceil(u), np.round(u)),
         'floor': np.floor, 'ceil': np.ceil}.get(nm)
    if f is None or r is None:
        return None
    return np.clip(r(f()), 0, n - 1).astype(np.int64)


def _open_shape(vi) -> str:
    """Why input vi has no shape utrain can train, and what to do: which of its
    dimensions after the batch are known only at run time (a tf2onnx export of a Keras
    model whose Input named no feature count; a torch.onnx dynamic_axes entry)."""
    tt = vi.type.tensor_type
    if not tt.HasField('shape'):
        return (f'input {vi.name!r} has no shape in the file; utrain trains a fixed input '
                'shape: export the model with the input\'s shape given')
    dims = [d.dim_value if d.HasField('dim_value') and d.dim_value > 0 else
            (d.dim_param or '?') for d in tt.shape.dim]
    open_ = [j for j, d in enumerate(dims) if j and not isinstance(d, int)]
    return (f'input {vi.name!r} has shape [{", ".join(map(str, dims))}]: dimension'
            f'{"s" * (len(open_) > 1)} {", ".join(map(str, open_))} known only at run time; '
            'utrain trains a fixed input shape: export the model with it fixed (tf2onnx: '
            '--inputs NAME[1,F,...] or a Keras Input with every size given; torch.onnx.export: '
            'leave the axis out of dynamic_axes), or set it in the file with '
            'onnx.tools.update_model_dims.update_inputs_outputs_dims; prepare and evaluate '
            'with data set it from the samples themselves (an .npz x of the input\'s rank, '
            'or one open dimension; of several inputs, an .npz array per input named as '
            'the input or x0, x1, ..)')


def input_dims(model) -> list:
    """[(input name, its dimensions, None where known only at run time)] of ModelProto
    model's inputs that are no initializer, in the file's order ([] for one the file
    gives no shape)."""
    inits = {t.name for t in model.graph.initializer}
    return [(vi.name, [d.dim_value if d.HasField('dim_value') and d.dim_value > 0 else None
                       for d in vi.type.tensor_type.shape.dim])
            for vi in model.graph.input if vi.name not in inits]


def with_dims(model, dims: dict):
    """ModelProto model with its inputs' open dimensions set: dims {input name: shape}
    (the batch 1 too); the copy prepare trains (prepare.json's "fixed_dims")."""
    for vi in model.graph.input:
        if vi.name in dims:
            for d, n in zip(vi.type.tensor_type.shape.dim, dims[vi.name]):
                d.Clear()
                d.dim_value = int(n)
    return model


def _static_shape(vi, batch1=False):
    tt = vi.type.tensor_type
    if not tt.HasField('shape'):
        return None
    out = []
    for j, d in enumerate(tt.shape.dim):
        if d.HasField('dim_value') and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif batch1 and j == 0:
            out.append(1)
        else:
            return None
    return out


def _external_data_beside(path):
    """ModelError where the weights of .onnx file path are stored in a file of their own
    (ONNX external data: torch.onnx.export's model.onnx.data beside model.onnx) that is
    not beside it: which file, and what to do (onnx's own error said the tensor 'should
    be stored in ... but it is not regular file')."""
    onnx = _onnx()
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception:   # noqa: B902 - (load says what is wrong with the file)
        return
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    folder = os.path.dirname(os.path.abspath(path))
    locs = {ExternalDataInfo(t).location for t in m.graph.initializer if uses_external_data(t)}
    missing = sorted(loc for loc in locs if not os.path.isfile(os.path.join(folder, loc)))
    if missing:
        raise ModelError(path, f'its weights are stored in a file of their own, '
                         f'{" and ".join(map(repr, missing))} (ONNX external data, as '
                         'torch.onnx.export writes them), which is not in '
                         f'{folder}: put it beside the .onnx under that name (copy both '
                         'files), or save the model as one file: onnx.save(onnx.load(SRC), '
                         'DST, save_as_external_data=False) where both are')


def load(path):
    """The onnx ModelProto of path, shape-inferred with the batch dimension 1; ModelError
    for a file that is not an ONNX model."""
    from .ir import check_path
    onnx = _onnx()
    path = check_path(path)
    _external_data_beside(path)
    try:
        model = onnx.load(path)
    except Exception as e:
        from .kinds import kind_of
        with open(path, 'rb') as f:
            kind = kind_of(f.read(4096))
        named = re.match(r'(.+) \((\.circle|\.tflite)\)$', kind or '')
        if named:
            # (a circle or TFLite model named .onnx had been 'not a model: it reads as a
            # circle model (.circle); give the model file (.circle, ...) here')
            raise ModelError(path, f'{named.group(1)} named .onnx: utrain reads a file by its '
                             f'name\'s suffix; name it {named.group(2)}') from None
        if kind:        # (a Git LFS pointer, a placeholder text, an archive: as a .tflite's)
            raise ModelError(path, f'not a model: it reads as {kind}; give the model file '
                             '(.circle, .tflite or .onnx) here') from None
        raise ModelError(path, f'not a valid ONNX model ({type(e).__name__}: {e})'
                         + AGAIN) from None
    if not model.graph.node:
        raise ModelError(path, ('file is empty' if not os.path.getsize(path) else
                                'not a valid ONNX model (no graph nodes)') + AGAIN)
    _check_defined(path, model)
    qops = _qoperator_to_qdq(model.graph)
    dyn = _dynamic_to_float(model.graph)
    inits = {t.name for t in model.graph.initializer}
    n = fixed_batch(model)
    for vi in model.graph.input:          # a symbolic batch dimension is 1
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) and not (dims[0].HasField('dim_value') and dims[0].dim_value > 0):
            dims[0].Clear()
            dims[0].dim_value = 1
        elif len(dims) > 1 and n > 1 and dims[0].dim_value == n:
            dims[0].dim_value = 1         # (a batch fixed in the file: a sample at a time)
    if n > 1:       # (a Reshape's shape that carries it; one merging it fails to read)
        from onnx import numpy_helper
        shapes = {nd.input[1] for nd in model.graph.node if nd.op_type == 'Reshape' and len(nd.input) > 1}
        for k, t in enumerate(model.graph.initializer):
            if t.name in shapes:
                v = numpy_helper.to_array(t).copy()
                if v.ndim == 1 and v.size and int(v[0]) == n:
                    v[0] = 1
                    model.graph.initializer[k].CopyFrom(numpy_helper.from_array(v, t.name))
        for vi in list(model.graph.output) + list(model.graph.value_info):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) and dims[0].HasField('dim_value') and dims[0].dim_value == n:
                dims[0].dim_value = 1
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:
        raise ModelError(path, f'ONNX shape inference failed: {e}') from None
    if qops:        # (_Reader: prepare says the model trains dequantized)
        inferred.metadata_props.add(key=_QOP_KEY, value=str(qops))
    if dyn[0]:      # (_Reader: the weights' scales, which export recomputes)
        import json
        inferred.metadata_props.add(key=_DYN_KEY, value=json.dumps(dyn))
    return model, inferred


def fixed_batch(model) -> int:
    """The batch N > 1 an ONNX model's inputs of rank 2 or more fix (their first dimension
    a number they share), else 1: read with batch 1 (load), exported into the file as it
    is (its batch kept), run by evaluate N samples at a time."""
    inits = {t.name for t in model.graph.initializer}
    ns = set()
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name not in inits and len(dims) > 1 and dims[0].HasField('dim_value'):
            ns.add(int(dims[0].dim_value))
    ns.discard(1)
    return max(ns) if len(ns) == 1 else 1


def _check_defined(path, model):
    """ModelError for a damaged file (a byte changed in a name, a type, an attribute), which
    the reader had met as a KeyError, TypeError or AttributeError traceback: a node reading
    a value nothing defines before it (a graph input, an initializer, an earlier node's
    output: ONNX's order), a name that is not text, an initializer of no element type, a
    node's attributes not as ONNX defines its op (onnx.checker; an op ONNX does not define
    is left to the reader, which says it is not supported)."""
    graph = model.graph
    from onnx import AttributeProto as A, checker, defs, helper
    ctx = checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    scope = checker.C.LexicalScopeContext()

    def schema_ok(node):
        v = ctx.opset_imports.get(node.domain or '', ctx.opset_imports.get('ai.onnx'))
        try:
            return v is not None and defs.has(node.op_type, v, node.domain or '')
        except Exception:   # noqa: B902 - onnx's own errors: no schema to check against
            return False
    known = {vi.name for vi in graph.input}
    for t in graph.initializer:
        try:
            helper.tensor_dtype_to_np_dtype(t.data_type)
        except (KeyError, ValueError):
            raise ModelError(path, f'initializer {t.name!r} has element type {t.data_type}, which '
                                   'ONNX does not define: the file is damaged; export the model '
                                   'again') from None
        known.add(t.name)
    const = {'value': A.TENSOR, 'value_float': A.FLOAT, 'value_int': A.INT, 'value_floats': A.FLOATS,
             'value_ints': A.INTS, 'value_string': A.STRING, 'value_strings': A.STRINGS,
             'sparse_value': A.SPARSE_TENSOR}
    for k, node in enumerate(graph.node):
        what = f'node {k} ({node.op_type!r})'
        names = [node.op_type, node.name, node.domain] + list(node.input) + list(node.output) + [
            at.name for at in node.attribute]
        if not all(isinstance(n, str) for n in names):     # (protobuf: bytes when not UTF-8)
            raise ModelError(path, f'{what}: a name that is not UTF-8 text: the file is damaged; '
                                   'export the model again')
        for at in node.attribute:
            want = const.get(at.name) if node.op_type == 'Constant' else None
            if at.type == A.UNDEFINED or (want is not None and at.type != want) or \
                    (at.type == A.TENSOR and not at.HasField('t')):
                raise ModelError(path, f'{what}: attribute {at.name!r} is of type '
                                       f'{A.AttributeType.Name(at.type)}' + (
                                           f', not {A.AttributeType.Name(want)}' if want else '')
                                 + ': the file is damaged; export the model again')
        if schema_ok(node):         # (an op ONNX defines: its attributes as it defines them)
            try:
                checker.check_node(node, ctx, scope)
            except checker.ValidationError as e:
                why = str(e).splitlines()[0]
                # (an attribute of the op's older versions, e.g. Clip's min and max at
                # opset 17: the reader takes it)
                if not why.startswith('Unrecognized attribute'):
                    raise ModelError(path, f'{what}: {why}: the file is damaged; export the '
                                           'model again') from None
        for v in node.input:
            if v and v not in known:
                raise ModelError(path, f'node {k} ({node.op_type} {node.name!r}) reads {v!r}, which '
                                       'no graph input, initializer or earlier node defines: the '
                                       'file is damaged (or its nodes out of order); export the '
                                       'model again')
        known.update(node.output)
    for vi in graph.output:
        if vi.name not in known:
            raise ModelError(path, f'the graph output {vi.name!r} is defined by no node, input or '
                                   'initializer: the file is damaged; export the model again')


def read_onnx(path) -> Graph:
    """Read an .onnx model into the IR (see the module's docstring).  Raises ModelError."""
    model, inferred = load(path)
    r = _Reader(path, inferred)
    try:
        return r.run()
    except ModelError:
        raise
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        # (a damaged file _check_defined does not see, e.g. a weight's dims changed:
        # a refusal naming the node, not a traceback)
        n = r.node
        where = f'node {n.name or "(unnamed)"} ({n.op_type})' if n is not None else 'the graph'
        raise ModelError(path, f'{where} cannot be read ({type(e).__name__}: {e}): the file may be '
                               'damaged: export the model again (if it is not, report this with '
                               'the file: a utrain bug)') from None


# --------------------------------------------------------------------------- export

def _taps_back(trained, start, origin, vals) -> None:
    """The depth taps of a 3-D convolution's weight W [kd, kh, kw, C, O] that
    spellings.conv3d_to_conv2d made ('W/tap{i}', [O, kh, kw, C]) put back into W in
    trained (the untrained ones as the file has them; a tap that is not the file's W[i]
    at the start: ModelError, as export_onnx's check)."""
    taps = {}
    for name in list(trained):
        m = re.fullmatch(r'(.+)/(t?tap)(\d+)', name)
        if m and m.group(1) not in trained and (origin.get(m.group(1)) or ('',))[0] == 'plain':
            taps.setdefault((m.group(1), m.group(2)), {})[int(m.group(3))] = trained.pop(name)
    for (w, kind), got in taps.items():
        _, init, steps = origin[w]
        full = apply_steps(vals[init], steps)
        # (a CONV_3D's W [kd, kh, kw, C, O]: tap [O, kh, kw, C]; a CONV_3D_TRANSPOSE's
        # [kd, kh, kw, O, C], spellings.conv3d_transpose_to_2d: 'ttap' [O, kh, kw, C])
        perm = (3, 0, 1, 2) if kind == 'tap' else (2, 0, 1, 3)
        for i, v in got.items():
            t0 = start.get(f'{w}/{kind}{i}')
            if t0 is not None and not np.allclose(t0, full[i].transpose(perm),
                                                  rtol=1e-5, atol=1e-6):
                raise ModelError(w, f'tap {i} of the prepared model is not what the ONNX '
                                 'reader makes of its initializer; export cannot write it back')
            full[i] = np.asarray(v, np.float64).reshape(
                t0.shape if t0 is not None else full[i].transpose(perm).shape
            ).transpose(np.argsort(perm))
        trained[w] = full


def export_onnx(model_path, base, weights: dict, out_path) -> dict:
    """Write out_path: model_path with the initializers that the trained IR tensors
    (weights {tensor index of base: array}, base: the graph the .wof indexes) came from
    replaced.  Checks that base's untrained values are what the reader makes of the
    initializers (a rewrite that changed a trained tensor cannot be mapped back)."""
    onnx = _onnx()
    from onnx import numpy_helper
    from .ir import atomic_write
    g0 = read_onnx(model_path)
    origin = g0.onnx_origin
    orig = onnx.load(os.fspath(model_path))
    inits = {t.name: t for t in orig.graph.initializer}
    for node in orig.graph.node:    # (a Constant node's tensor: written as an initializer's)
        if node.op_type == 'Constant' and node.domain in ('', 'ai.onnx'):
            inits.update((node.output[0], at.t) for at in node.attribute if at.name == 'value')
    vals = {n: numpy_helper.to_array(t).astype(np.float64) for n, t in inits.items()}
    new = {}
    trained = {base.tensors[k].name: np.asarray(w, np.float64) for k, w in weights.items()}
    start = {t.name: t.data for t in base.tensors if t.data is not None}

    def check(name, want):
        have = start.get(name)
        if have is not None and (have.shape != want.shape or
                                 not np.allclose(have, want, rtol=1e-5, atol=1e-6)):
            raise ModelError(model_path, f'tensor {name!r} of the prepared model is not '
                             'what the ONNX reader makes of its initializer (prepare '
                             'rewrote it); export cannot write it back')

    _taps_back(trained, start, origin, vals)
    bn_done = set()
    attrs = {}      # (node number, attribute) -> its new values (a scikit-learn linear model's)
    for name, w in trained.items():
        o = origin.get(name)
        if o is not None and o[0] == 'attr':
            _, k, at, how = o
            node = orig.graph.node[k]
            have = np.asarray(_attrs(node).get(at, []), np.float64)
            w = np.asarray(w, np.float64).reshape(start[name].shape if name in start else -1)
            if have.size:
                # (the file's values; tied: the second half, the first its negation)
                check(name, (have[have.size // 2:] if how == 'tied' else have)
                      .reshape(w.shape).astype(np.float32))
            attrs[(k, at)] = np.concatenate([-w.ravel(), w.ravel()]) if how == 'tied' \
                else w.ravel()
            continue
        if o is None:
            raise ModelError(model_path, f'trained tensor {name!r} comes from no initializer '
                             'of this ONNX model (was it prepared from this file?)')
        if o[0] == 'computed':
            raise ModelError(model_path, f'trained tensor {name!r} is {o[1]!r}, which the '
                             'graph computes from initializers with constant nodes (e.g. '
                             'torch.onnx.export(..., do_constant_folding=False)); export '
                             'writes trained values into initializers only: export the '
                             'model with constant folding (the default), then prepare it')
        if o[0] == 'plain':
            _, init, steps = o
            check(name, apply_steps(vals[init], steps).astype(np.float32))
            w = w.reshape(start[name].shape) if name in start else w
            s0 = steps[0] if steps else ('',)
            if s0[0] == 'dq' and len(s0) > 6 and name in start and \
                    not np.array_equal(np.asarray(start[name], np.float64), w):
                # a quantize_dynamic model's moved weight: at scales recomputed as its
                # quantizer computes them (the file's kept where the weight did not move)
                sc, zp = s0[6], s0[7]
                axis = s0[3] % vals[init].ndim if np.size(s0[1]) > 1 else None
                q, new[sc], z = _requantized(invert_steps(w, steps[1:]),
                                             numpy_helper.to_array(inits[init]), s0[2], axis)
                new[init] = q
                if zp:
                    new[zp] = z
                continue
            if steps and steps[0][0] == 'part':
                full = np.array(new.get(init, vals[init]), np.float64).reshape(-1)
                full[steps[0][1]:steps[0][2]] = invert_steps(w, steps[1:]).reshape(-1)
                new[init] = full.reshape(vals[init].shape)
            else:
                new[init] = invert_steps(w, steps)
        else:
            info = o[1]
            key = info['scale_tensor']
            if key in bn_done:
                continue
            bn_done.add(key)
            shift_name = [n for n, v in origin.items() if v[0] == 'bn_shift'
                          and v[1]['scale_tensor'] == key][0]
            var, mean = info['var_v'], info['mean_v']
            sd = np.sqrt(var + info['eps'])
            s0 = vals[info['scale']] / sd
            b0 = vals[info['B']] - mean * s0
            check(key, s0.reshape(info['shape']).astype(np.float32))
            check(shift_name, b0.reshape(info['shape']).astype(np.float32))
            s = trained[key].reshape(-1) if key in trained else s0
            b = trained[shift_name].reshape(-1) if shift_name in trained else b0
            new[info['scale']] = s * sd
            new[info['B']] = b + mean * s
    from onnx import helper
    for (k, at), v in attrs.items():
        node = orig.graph.node[k]
        kept = [x for x in node.attribute if x.name != at]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(at, [float(f) for f in v])])
    # an initializer written that an Identity node also reads (torch.onnx's dedup of
    # equal initializers: a fresh BatchNorm's running_var = Identity(weight)): the
    # Identity's output becomes an initializer of the old value, which it was
    # (after the attributes: their keys are node positions)
    for k in range(len(orig.graph.node) - 1, -1, -1):
        node = orig.graph.node[k]
        if node.op_type == 'Identity' and node.domain in ('', 'ai.onnx') and \
                node.input[0] in new and node.input[0] in inits and node.output[0] not in inits:
            t = numpy_helper.from_array(numpy_helper.to_array(inits[node.input[0]]), node.output[0])
            orig.graph.initializer.append(t)
            del orig.graph.node[k]
    for init, arr in new.items():
        t = inits[init]
        dt = numpy_helper.to_array(t).dtype
        arr = np.asarray(arr).reshape(tuple(t.dims)).astype(dt)
        t.CopyFrom(numpy_helper.from_array(arr, t.name))
    atomic_write(out_path, orig.SerializeToString())
    return {'model': os.fspath(model_path), 'tensors': len(new) + len(attrs), 'clipped': 0,
            'onnx': True}
