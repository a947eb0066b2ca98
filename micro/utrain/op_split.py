# SPLIT (49) and SPLIT_V (102): one input cut into n outputs along one axis (tico's
# unrolled LSTM and GRU cut their gate pre-activations this way).  Each output is one
# block copy out of the input, planned on the host like op_shape's STRIDED_SLICE
# (host_tools/optable.py _split_options: 21 option floats per output, op_shape's layout,
# side A the input at the output's offset, side B the output).
# Backward: the gradients of the outputs that have one are copied into a zeroed
# input-sized gradient (an output nobody differentiates through contributes zeros).
# Net.backward calls this op when any of its outputs has a gradient: dy is the first
# output's (or None), the others are taken from rt.g.
# Temporaries: the outputs (forward), the input-sized gradient (backward).
from utrain.xnp import zeros
from utrain.op_shape import _copy


def forward(rt, op):
    code, ins, outs, p = op
    x = rt.t[ins[0]]
    p = [int(v) for v in p]
    for j in range(len(outs)):
        y = zeros(rt.shape[outs[j]])
        _copy(y, x, p, 21 * j, 0)
        rt.t[outs[j]] = y


def backward(rt, op, dy, flags):
    code, ins, outs, p = op
    p = [int(v) for v in p]
    dx = zeros(rt.shape[ins[0]])
    for j in range(len(outs)):
        g = dy if j == 0 else rt.g.pop(outs[j], None)
        if g is not None:
            _copy(g, dx, p, 21 * j, 1)
    rt.add_grad(ins[0], dx)
