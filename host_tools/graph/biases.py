"""Biases and BatchNorm: a per-channel MUL/ADD after a layer folded into it
(fold_batchnorm), a bias ADD after an FC or conv made its bias, separable biases."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import Graph, Operator
from .edit import WEIGHT_OUT_AXIS, consumers, is_const, new_tensor, remove_op, trains_as


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
                    not is_const(g, layer.inputs[1]) or any(
                        len(consumers(g, c)) != 1 for c in layer.inputs[1:] if c >= 0):
                continue        # (a weight other layers read too, an .onnx model's tied
                #                 one: folding would scale theirs)
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
