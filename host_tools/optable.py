"""What the host knows about each operator the device can train through.

The forward kernel and its gradient live together on the device (micro/utrain/op_*.py);
this table only describes, per circle operator, what the host passes need: the device
opcode and option floats, which inputs are trainable parameters, and which tensors the
gradient rule reads (so the memory plan can keep exactly those).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# backward flags, one bit per gradient the device computes (micro/utrain/op_fc.py):
# DX the first data input's, DW the weight's, DB the bias's; data input n >= 1 (an ADD's
# second operand, a CONCATENATION's inputs) has bit dx_bit(n) = 4 << n.
DX, DW, DB = 1, 2, 4


def dx_bit(n):
    return DX if n == 0 else 4 << n

ACTIVATIONS = {'NONE': 0, 'RELU': 1, 'RELU_N1_TO_1': 2, 'RELU6': 3, 'TANH': 4}


@dataclass(frozen=True)
class OpSpec:
    name: str
    code: int                      # circle builtin code; the device dispatches on it
    params: dict                   # input position -> 'weight' | 'bias' (or (op, g) -> that)
    options: Callable              # (op, graph) -> list of floats for the device
    saves: Callable                # (op, flags) -> tensors the gradient reads
    data_inputs: tuple = (0,)      # input positions that carry activations
    # input positions the device receives (None: all).  Constant index tensors (a
    # RESHAPE's shape, a TRANSPOSE's perm, PAD's paddings...) are read on the host and
    # go to the device as option floats instead.
    device_inputs: tuple = None
    # op -> {tensor index: (rows, cols)}: device shapes for tensors this op wants laid
    # out otherwise than passes.device_shape's [prod(leading dims), last dim] (same
    # bytes, so .wof files stay onert-micro's; e.g. a conv weight as [O, KH*KW*I]).
    shapes: Callable = None

    def roles(self, op, g):
        """input position -> 'weight' | 'bias' for this op (an ADD's or MUL's parameter is
        whichever operand is constant)."""
        return self.params(op, g) if callable(self.params) else self.params

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


SUPPORTED = sorted(SPECS)
