"""What the host knows about each operator the device can train through.

The forward kernel and its gradient live together on the device (micro/utrain/op_*.py);
this table only describes, per circle operator, what the host passes need: the device
opcode and option floats, which inputs are trainable parameters, and which tensors the
gradient rule reads (so the memory plan can keep exactly those).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

# backward flags, one bit per gradient the device computes (micro/utrain/op_fc.py)
DX, DW, DB = 1, 2, 4

ACTIVATIONS = {'NONE': 0, 'RELU': 1, 'RELU_N1_TO_1': 2, 'RELU6': 3, 'TANH': 4}


@dataclass(frozen=True)
class OpSpec:
    name: str
    code: int                      # circle builtin code; the device dispatches on it
    params: dict                   # input position -> 'weight' | 'bias'
    options: Callable              # (op, graph) -> list of floats for the device
    saves: Callable                # (op, flags) -> tensors the gradient reads
    data_inputs: tuple = (0,)      # input positions that carry activations
    # input positions the device receives (None: all).  Constant index tensors (a
    # RESHAPE's shape, a TRANSPOSE's perm, PAD's paddings...) are read on the host and
    # go to the device as option floats instead.
    device_inputs: tuple = None
    # (op, graph) -> {tensor index: (rows, cols)}: device shapes for tensors this op wants laid
    # out otherwise than passes.device_shape's [prod(leading dims), last dim] (same
    # bytes, so .wof files stay onert-micro's; e.g. a conv weight as [O, KH*KW*I]).
    shapes: Callable = None

    def inputs(self, op):
        """The op's input tensors as the device sees them."""
        if self.device_inputs is None:
            return list(op.inputs)
        return [op.inputs[p] for p in self.device_inputs if p < len(op.inputs)]


def _fused(op, where):
    act = op.options.get('fused_activation_function', 'NONE')
    if act not in ACTIVATIONS:
        raise ValueError(f'{where}: fused activation {act} is not supported '
                         f'(supported: {", ".join(ACTIVATIONS)})')
    return ACTIVATIONS[act]


def _fc_options(op, g=None):
    fmt = op.options.get('weights_format', 'DEFAULT')
    if fmt not in ('DEFAULT', 0):
        raise ValueError(f'op {op.index} FULLY_CONNECTED: weights_format {fmt} is not supported')
    return [_fused(op, f'op {op.index} FULLY_CONNECTED')]


def _fc_saves(op, flags):
    keep = []
    if flags & DW:
        keep.append(op.inputs[0])
    if op.options.get('fused_activation_function', 'NONE') != 'NONE':
        keep.append(op.outputs[0])
    return keep


def _out(op, flags):
    return [op.outputs[0]]


def _none(op, flags=0):
    return []


SPECS = {s.name: s for s in [
    OpSpec('FULLY_CONNECTED', 9, {1: 'weight', 2: 'bias'}, _fc_options, _fc_saves),
    OpSpec('RELU', 19, {}, _none, _out),
    OpSpec('RELU_N1_TO_1', 20, {}, _none, _out),
    OpSpec('RELU6', 21, {}, _none, _out),
    OpSpec('LOGISTIC', 14, {}, _none, _out),
    OpSpec('TANH', 28, {}, _none, _out),
    OpSpec('SOFTMAX', 25, {}, lambda op, g=None: [float(op.options.get('beta', 1.0))], _out),
    OpSpec('RESHAPE', 22, {}, _none, _none, device_inputs=(0,)),
]}

# Each group of operators registers its specs here (one block per kernel module).

# ---- ops-spatial: CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D, AVERAGE_POOL_2D, MEAN
# (micro/utrain/op_conv.py, op_pool.py).  4-D NHWC tensors, batch 1; the device gets the
# geometry as option floats: act, H, W, C, OH, OW, OC, KH, KW, stride h, w, dilation
# h, w, pad top, pad left [, depth multiplier].

def _out_pad(n, k, s, d, padding, where):
    """TFLite's output size and leading pad along one axis."""
    eff = (k - 1) * d + 1
    if padding == 'SAME':
        out = -(-n // s)
        return out, max((out - 1) * s + eff - n, 0) // 2
    if padding == 'VALID':
        return -(-(n - eff + 1) // s), 0
    raise ValueError(f'{where}: padding {padding} is not supported (SAME, VALID)')


def _nhwc(g, k, where, what):
    shape = list(g.tensors[k].shape)
    if len(shape) != 4 or shape[0] != 1:
        raise ValueError(f'{where}: {what} has shape {shape}; utrain runs 4-D NHWC '
                         'tensors with batch 1 here')
    return shape[1:]


def _spatial(op, g, kh, kw, sh, sw, dh, dw, extra=()):
    where = f'op {op.index} {op.name}'
    H, W, C = _nhwc(g, op.inputs[0], where, 'the input')
    OH, OW, OC = _nhwc(g, op.outputs[0], where, 'the output')
    pad = op.options.get('padding', 'SAME')
    oh, pt = _out_pad(H, kh, sh, dh, pad, where)
    ow, pl = _out_pad(W, kw, sw, dw, pad, where)
    if (oh, ow) != (OH, OW):
        raise ValueError(f'{where}: output is {OH}x{OW}, {pad} padding gives {oh}x{ow}')
    return [float(v) for v in (_fused(op, where), H, W, C, OH, OW, OC, kh, kw, sh, sw, dh, dw,
                               pt, pl) + tuple(extra)]


def _strides(op):
    o = op.options
    return int(o.get('stride_h', 1)), int(o.get('stride_w', 1))


def _dilations(op):
    o = op.options
    return int(o.get('dilation_h_factor', 1) or 1), int(o.get('dilation_w_factor', 1) or 1)


def _conv_options(op, g):
    O, KH, KW, I = g.tensors[op.inputs[1]].shape
    if _nhwc(g, op.inputs[0], f'op {op.index} CONV_2D', 'the input')[2] != I:
        raise ValueError(f'op {op.index} CONV_2D: weight has {I} input channels, input has '
                         f'{g.tensors[op.inputs[0]].shape[3]} (grouped convolution is not supported)')
    return _spatial(op, g, KH, KW, *_strides(op), *_dilations(op))


def _dwconv_options(op, g):
    _, KH, KW, CM = g.tensors[op.inputs[1]].shape
    C = _nhwc(g, op.inputs[0], f'op {op.index} DEPTHWISE_CONV_2D', 'the input')[2]
    if CM % C:
        raise ValueError(f'op {op.index} DEPTHWISE_CONV_2D: {CM} output channels for {C} inputs')
    return _spatial(op, g, KH, KW, *_strides(op), *_dilations(op), extra=(CM // C,))


def _pool_options(op, g):
    o = op.options
    return _spatial(op, g, int(o.get('filter_height', 1)), int(o.get('filter_width', 1)),
                    *_strides(op), 1, 1)


def _conv_shapes(op, g):
    O, KH, KW, I = g.tensors[op.inputs[1]].shape
    return {op.inputs[1]: (O, KH * KW * I)}


def _mean_options(op, g):
    """[outer, red, inner]: the input as [outer, reduced, inner] (the reduced axes must
    form one run once size-1 axes are dropped)."""
    where = f'op {op.index} MEAN'
    shape = list(g.tensors[op.inputs[0]].shape)
    axes_t = g.tensors[op.inputs[1]] if len(op.inputs) > 1 else None
    if axes_t is None or axes_t.data is None:
        raise ValueError(f'{where}: the axes must be a constant tensor')
    axes = {int(a) + (len(shape) if a < 0 else 0) for a in np.ravel(axes_t.data)}
    dims = [(n, i in axes) for i, n in enumerate(shape) if n != 1]
    flags = [r for _, r in dims]
    if True in flags:
        first = flags.index(True)
        last = len(flags) - 1 - flags[::-1].index(True)
        if not all(flags[first:last + 1]):
            raise ValueError(f'{where}: reducing axes {sorted(axes)} of shape {shape} is not '
                             'supported (the reduced axes must be adjacent)')
    else:
        first, last = len(dims), len(dims) - 1
    prod = lambda ds: int(np.prod([n for n, _ in ds])) if ds else 1  # noqa: E731
    return [float(prod(dims[:first])), float(prod(dims[first:last + 1])),
            float(prod(dims[last + 1:]))]


def _conv_saves(op, flags):
    return _fc_saves(op, flags)          # x when W trains, y when fused


def _maxpool_saves(op, flags):
    return [op.inputs[0], op.outputs[0]] if flags & DX else []


def _avgpool_saves(op, flags):
    fused = op.options.get('fused_activation_function', 'NONE') != 'NONE'
    return [op.outputs[0]] if flags & DX and fused else []


SPECS.update({s.name: s for s in [
    OpSpec('CONV_2D', 3, {1: 'weight', 2: 'bias'}, _conv_options, _conv_saves,
           shapes=_conv_shapes),
    OpSpec('DEPTHWISE_CONV_2D', 4, {1: 'weight', 2: 'bias'}, _dwconv_options, _conv_saves),
    OpSpec('MAX_POOL_2D', 17, {}, _pool_options, _maxpool_saves),
    OpSpec('AVERAGE_POOL_2D', 1, {}, _pool_options, _avgpool_saves),
    OpSpec('MEAN', 40, {}, _mean_options, _none, device_inputs=(0,)),
]})


SUPPORTED = sorted(SPECS)
