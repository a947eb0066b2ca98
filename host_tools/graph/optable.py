"""What the host knows about each operator the device can train through: one row per op.

The forward kernel and its gradient live together on the device (micro/utrain/op_*.py);
the opcode, option slots and backward flags are the device's (utrain/opc.py), and the
kernel module is the device's table (utrain/flat.py KERNELS).  A row adds what only
the host passes need: which inputs are trainable parameters, how to compute the option
floats, which tensors the gradient rule reads (so the memory plan keeps exactly those),
and what the heap planner (memory.py) counts while the op runs.  Adding an op: one
device file, one row here, one test case (docs/flat-model.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..target.device import module

opc = module('opc')
# backward flags, one bit per gradient the device computes: DX the first data input's,
# DW the weight's, DB the bias's; data input n >= 1 (an ADD's second operand, a
# CONCATENATION's inputs) has bit dx_bit(n) = DXN << n in the plan (any n: a Python int);
# the flat model stores DX, DW, DB in the backward entry and n >= 1 as its tensor's GRAD
# flag (host_tools/files/flatmodel.py).
DX, DW, DB = opc.DX, opc.DW, opc.DB


def dx_bit(n):
    return DX if n == 0 else opc.DXN << n


ACTIVATIONS = {'NONE': opc.AF_NONE, 'RELU': opc.AF_RELU, 'RELU_N1_TO_1': opc.AF_RELU_N1_TO_1,
               'RELU6': opc.AF_RELU6, 'TANH': opc.AF_TANH}


@dataclass(frozen=True)
class OpSpec:
    name: str                      # circle's name, also the opcode's in utrain.opc
    params: dict                   # input position -> 'weight' | 'bias' (or (op, g) -> that)
    options: Callable              # (op, graph) -> list of floats for the device
    saves: Callable                # (op, flags) -> tensors the gradient reads
    data_inputs: tuple = (0,)      # input positions that carry activations (None: all)
    # input positions the device receives (None: all).  Constant index tensors (a
    # RESHAPE's shape, a TRANSPOSE's perm, PAD's paddings...) are read on the host and
    # go to the device as option floats instead.
    device_inputs: tuple = None
    # (op, graph) -> {tensor index: (rows, cols)}: device shapes for tensors this op wants
    # laid out otherwise than passes.device_shape's [prod(leading dims), last dim] (same
    # bytes, so .wof files stay onert-micro's; e.g. a conv weight as [O, KH*KW*I]).
    shapes: Callable = None
    # for the heap planner: the kernel's temporaries while it runs forward and backward,
    # as (output-sized, input-sized) arrays, and the array views a tap walk holds at once
    fwd: tuple = (2, 1)
    bwd: tuple = (2, 2)
    taps: int = 0
    # ... the forward's (output-sized, input-sized) temporaries on the fallback, where
    # its native loops (npfallback._conv_steps through utrain.xnp.conv_steps) write into
    # the kernel's output: no per-tap product (None: as fwd).  taps stays: the row walk's
    # tuples are made all the same (the digits CNN's 64-bit plan without them: 0.98x)
    fwd_native: tuple = None
    # ... and the backward's: the activation's gradient (op_act.act_grad: np.where on a
    # comparison, whose mask is a byte array) and dx, but no per-tap products
    bwd_native: tuple = None
    # (op, graph) -> floats of the largest piece of a tap's product under ulab, whose
    # steps (utrain.ulconv, ulmono, convwalk) take it a few output rows at a time and add
    # it into the output: there the kernel is planned with the native figures above and
    # memory.ULAB_PIECES such pieces instead of output-sized products (None: fwd, bwd)
    piece: Callable = None
    # for the planner: how the kernel hands its weight gradient to the sink
    # (micro/utrain/sink.py): 'rows', a product the sink sums or applies row by row
    # (nothing weight-sized at batch 1), or 'whole', a weight-sized array at batch 1 (a
    # grad(k) array or a g handed to grad(k, g)).  Not the device's WGRAD_WHOLE, which
    # says the sink must give the kernel a whole-shaped array under a rank (grad(k)):
    # that implies 'whole', not the converse (docs/flat-model.md, adding an op)
    wgrad: str = 'whole'
    # ... and under plain SGD at batch 1 (no momentum, no weight decay), where that differs
    # (None: wgrad): op_emb steps the table rows it used in place, nothing table-sized
    wgrad_sgd: str = None
    # for the planner: input-sized buffers the kernel keeps from its forward pass until
    # the backward pass is over (op_split's gradient buffer, summed over the outputs'
    # gradients as they arrive)
    held: int = 0
    # the device weight's axis that holds the output channels a rank (sparse update)
    # trains: rows ([O, ...]: FC, CONV_2D), or columns (DEPTHWISE_CONV_2D's [taps, C*M])
    out_axis: int = 0
    # (op, graph, arrays, banded) -> device modules the kernel's steps import on that
    # array backend ('fallback' | 'ulab'), banded: the op runs in a row band
    steps: Callable = None
    # the output is a view of the first input (a reshape: the same floats under another
    # shape, on both array backends): the planner counts its storage once
    view: bool = False
    # (op, graph, arrays) -> (output-sized, input-sized arrays, floats of the pieces live
    # at once) the forward makes beside its output on that array backend, where they
    # depend on the op (a copy plan's blocks, broadcast blocks, the fused activation):
    # the planner's figure for a whole op (None: fwd, fwd_native, piece); fwd stays the
    # row bands' figure for a strip
    fwd_of: Callable = None
    # weight-sized temporaries the kernel holds while it runs forward (op_tconv: its
    # weight in its convolution's layout); the backward holds as many, and one more for
    # the weight's gradient in that layout when the weight trains
    wtemp: int = 0
    # the most of fwd's temporaries the forward holds at once, (output-sized, input-sized),
    # where they are a chain of expressions each freed once the next is made (op_act's
    # HARD_SWISH): in a run that collects every gc_every bytes (run.gc_every) with arrays
    # of at least that many bytes, each of them is made after a collection, so the dead
    # ones are gone (None: fwd, every temporary live at the peak)
    fwd_live: tuple = None
    # (op, graph, arrays) -> (output-sized, input-sized arrays, floats of the pieces live
    # at once, data inputs passed dz) the backward makes beside the gradients in flight
    # and the weight's gradient where they depend on the op (a conv's fused activation:
    # none for NONE, dz and its byte mask for RELU; its dx; a depthwise multiplier's
    # spread copies under ulab): the planner's figure for a whole op (None: bwd,
    # bwd_native, piece).  The input-sized count is dx and what makes it; the sum with a
    # gradient already in flight (a second reader of the input: model.add_grad's old +
    # d) is the planner's.  Passed: the data inputs (numbered as data()) whose gradient
    # is the op's dz itself, not an array of its own (a residual ADD's operands: dz, or
    # dy itself without a fused activation), counted once while in flight
    bwd_of: Callable = None
    # (op, graph, arrays, back) -> (output-sized, input-sized arrays, floats of the pieces live
    # at once) the kernel makes forward (back False) or for dx (back True) where its frozen
    # weight is streamed by rows (--stream, the kernel's ROWS: utrain.convrows, on either
    # array backend), planned instead of fwd / bwd_of's figures (None: those)
    rows_of: Callable = None
    # (op, graph) -> whether the forward writes its output into its first input's array
    # where that input dies at the op (not saved, no later reader: utrain.model's
    # rt.dead), no array of its own (op_act's clipping activations on a large input)
    in_place: Callable = None

    @property
    def code(self) -> int:
        """The circle builtin code the device dispatches on (utrain.opc)."""
        return getattr(opc, self.name)

    @property
    def kernel(self) -> str:
        """The device module that runs it (utrain.flat.KERNELS)."""
        return module('flat').KERNELS[self.code]

    @property
    def stream_rows(self) -> tuple:
        """Input positions whose frozen constant the kernel can read a few rows at a
        time when streamed (the kernel module's ROWS; utrain/stream.py)."""
        return getattr(module(self.kernel), 'ROWS', ())

    def roles(self, op, g):
        """input position -> 'weight' | 'bias' for this op (an ADD's or MUL's parameter is
        whichever operand is constant)."""
        return self.params(op, g) if callable(self.params) else self.params

    def data(self, op):
        """[(n, tensor)] of the op's data inputs: n numbers them (0: DX's, n >= 1:
        dx_bit(n)'s; a CONCATENATION has as many as the file gives it)."""
        pos = range(len(op.inputs)) if self.data_inputs is None else self.data_inputs
        return [(n, op.inputs[p]) for n, p in enumerate(pos) if p < len(op.inputs)]

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


def _slots(values: dict) -> list:
    """Option floats from {slot (utrain.opc): value}, slots 0..max all given."""
    out = [None] * (max(values) + 1)
    for k, v in values.items():
        out[k] = float(v)
    assert None not in out, values
    return out


def _fc_options(op, g=None):
    fmt = op.options.get('weights_format', 'DEFAULT')
    if fmt not in ('DEFAULT', 0):
        raise ValueError(f'op {op.number} FULLY_CONNECTED: weights_format {fmt} is not supported')
    return _slots({opc.ACT: _fused(op, f'op {op.number} FULLY_CONNECTED')})


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
    OpSpec('FULLY_CONNECTED', {1: 'weight', 2: 'bias'}, _fc_options, _fc_saves,
           fwd=(2, 0), bwd=(2, 2), wgrad='rows'),
    OpSpec('LOGISTIC', {}, _none, _out),
    OpSpec('TANH', {}, _none, _out),
    # (backward: dy * y, dy - its row sums, * y, * beta: 4 output-sized arrays, measured
    # on 32-bit ulab, tests/planner/test_memory.py::test_activation_temporaries_are_planned_as_allocated)
    OpSpec('SOFTMAX', {}, lambda op, g=None: _slots({opc.BETA: op.options.get('beta', 1.0)}), _out,
           fwd=(3, 0), bwd=(4, 0)),
    OpSpec('RESHAPE', {}, _none, _none, device_inputs=(0,), fwd=(0, 0), bwd=(0, 0), view=True),
]}

# Each group of operators registers its specs here (one block per kernel module).

# ---- ops-spatial: CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D, AVERAGE_POOL_2D, MEAN
# (micro/utrain/op_conv.py, op_pool.py).  4-D NHWC tensors, batch 1; the device gets the
# geometry as option floats: act, H, W, C, OH, OW, OC, KH, KW, stride h, w, dilation
# h, w, pad top, pad left [, depth multiplier].

def same_pads(n, k, s, d):
    """TFLite's SAME padding of an axis of n, kernel k, stride s, dilation d: (before,
    after, output size)."""
    out = -(-n // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2, out


def tconv_form(ins, outs, ks, ss, begin):
    """How a TRANSPOSE_CONV of input sizes ins (H, W) to outs, whose row 0 is the full
    transposed convolution's row begin (ONNX's pads begin), is written so that TFLite runs
    it as utrain does (TensorFlow's own size rules): ('SAME', outs) where in = ceil(out /
    s) and begin is SAME's pad; ('VALID', outs) where begin is 0 and out is the full size
    to its s - 1 rows past it; else (None, big): VALID to big (the full size, or begin plus
    the output where that is more), cut from begin by a STRIDED_SLICE.  None where big
    reaches rows past what any tap does."""
    full = [(n - 1) * s + k for n, k, s in zip(ins, ks, ss)]
    if list(begin) == [same_pads(o, k, s, 1)[0] for o, k, s in zip(outs, ks, ss)] and \
            [-(-o // s) for o, s in zip(outs, ss)] == list(ins):
        return 'SAME', list(outs)
    if not any(begin) and all(f <= o < f + s for f, o, s in zip(full, outs, ss)):
        return 'VALID', list(outs)
    big = [max(f, b + o) for f, b, o in zip(full, begin, outs)]
    if any(m >= f + s for m, f, s in zip(big, full, ss)):
        return None
    return None, big


def out_pad(n, k, s, d, padding, where):
    """TFLite's output size and leading pad along one axis."""
    if padding == 'SAME':
        before, _, out = same_pads(n, k, s, d)
        return out, before
    if padding == 'VALID':
        return -(-(n - (k - 1) * d) // s), 0
    raise ValueError(f'{where}: padding {padding} is not supported (SAME, VALID)')


def _nhwc(g, k, where, what):
    shape = list(g.tensors[k].shape)
    if len(shape) != 4 or shape[0] != 1:
        raise ValueError(f'{where}: {what} has shape {shape}; utrain runs 4-D NHWC '
                         'tensors with batch 1 here')
    return shape[1:]


def _spatial(op, g, kh, kw, sh, sw, dh, dw, extra=None):
    where = f'op {op.number} {op.name}'
    H, W, C = _nhwc(g, op.inputs[0], where, 'the input')
    OH, OW, OC = _nhwc(g, op.outputs[0], where, 'the output')
    pad = op.options.get('padding', 'SAME')
    oh, pt = out_pad(H, kh, sh, dh, pad, where)
    ow, pl = out_pad(W, kw, sw, dw, pad, where)
    if (oh, ow) != (OH, OW):
        raise ValueError(f'{where}: output is {OH}x{OW}, {pad} padding gives {oh}x{ow}')
    v = {opc.ACT: _fused(op, where), opc.G_H: H, opc.G_W: W, opc.G_C: C, opc.G_OH: OH,
         opc.G_OW: OW, opc.G_OC: OC, opc.G_KH: kh, opc.G_KW: kw, opc.G_SH: sh, opc.G_SW: sw,
         opc.G_DH: dh, opc.G_DW: dw, opc.G_PT: pt, opc.G_PL: pl}
    v.update(extra or {})
    return _slots(v)


def _strides(op):
    o = op.options
    return int(o.get('stride_h', 1)), int(o.get('stride_w', 1))


def _dilations(op):
    o = op.options
    return int(o.get('dilation_h_factor', 1) or 1), int(o.get('dilation_w_factor', 1) or 1)


def _conv_options(op, g):
    O, KH, KW, I = g.tensors[op.inputs[1]].shape
    if _nhwc(g, op.inputs[0], f'op {op.number} CONV_2D', 'the input')[2] != I:
        raise ValueError(f'op {op.number} CONV_2D: weight has {I} input channels, input has '
                         f'{g.tensors[op.inputs[0]].shape[3]} (grouped convolution is not supported)')
    return _spatial(op, g, KH, KW, *_strides(op), *_dilations(op))


def _dwconv_options(op, g):
    _, KH, KW, CM = g.tensors[op.inputs[1]].shape
    C = _nhwc(g, op.inputs[0], f'op {op.number} DEPTHWISE_CONV_2D', 'the input')[2]
    if CM % C:
        raise ValueError(f'op {op.number} DEPTHWISE_CONV_2D: {CM} output channels for {C} inputs')
    return _spatial(op, g, KH, KW, *_strides(op), *_dilations(op), extra={opc.G_MULT: CM // C})


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
    where = f'op {op.number} MEAN'
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
    return _slots({opc.M_OUTER: prod(dims[:first]), opc.M_RED: prod(dims[first:last + 1]),
                   opc.M_INNER: prod(dims[last + 1:])})


def _conv_steps(op, g, arrays, banded, x=None, y=None):
    # ulab's steps (utrain.ulconv) take stride-1 convs whose output is the input's size,
    # utrain.ulmono those of one input channel; the others, and a band's strips, walk
    # rows (utrain.convwalk).  x, y: the convolution's input and output (a
    # TRANSPOSE_CONV's are its output and input)
    if arrays != 'ulab':
        return ()
    x = g.tensors[op.inputs[0] if x is None else x].shape
    y = g.tensors[op.outputs[0] if y is None else y].shape
    if _strides(op) == (1, 1) and not banded and x[1:3] == y[1:3]:
        return ('ulconv',)
    return ('ulconv', 'ulmono' if x[-1] == 1 else 'convwalk')


def _conv_piece(op, g, x=0):
    # ulconv: at most max(1, 512 // C) pixels of C channels (C the product's: O, or I for
    # dx); ulmono: max(1, 512 // (OW * O)) output rows; convwalk: one output row.  Never
    # more than the whole output or input (micro/utrain/ulconv.py, ulmono.py _CH).
    # (ulconv's pieces had been an image row at least: the 1-D conv net's 24 KB dz piece
    # found no run in a fragmented heap, 0.92x on 32-bit ulab, issue 28.)
    _, H, W, I = g.tensors[op.inputs[x]].shape
    _, OH, OW, O = g.tensors[op.outputs[0]].shape
    ch = module('ulconv')._CH
    whole = max(OH * OW * O, H * W * I)
    if _strides(op) == (1, 1) and (H, W) == (OH, OW):     # ulconv's alone (_conv_steps)
        return min(whole, max(ch, O, I))
    return min(whole, max(max(W, OW) * max(O, I), ch))


def _act_grad_temps(op, n):
    """(output-sized arrays, floats) utrain.op_act.act_grad holds at once for op's fused
    activation on n values: NONE none (dz is dy); RELU np.where's result and its
    comparison's byte mask (n bytes: n / 4 floats); RELU6 / RELU_N1_TO_1 two where()s
    and a mask; TANH / LOGISTIC two of their three products."""
    a = op.options.get('fused_activation_function', 'NONE')
    if a == 'NONE':
        return 0, 0
    if a in ('RELU', 'RELU6', 'RELU_N1_TO_1'):
        return 1 + (a != 'RELU'), n // 4
    return 2, 0


def _conv_fwd(op, g, arrays):
    """utrain.op_conv's forward beside its output (zeros, which the steps write into):
    the fused activation's arrays (_act_temps: none for NONE, in place a chunk of rows at
    a time on a large output), under ulab a tap's product a piece at a time (_conv_piece;
    freed before the activation runs) and a depthwise multiplier M > 1's spread copy of
    x (M input-sized floats); the fallback's native loops write into the output, a
    depthwise's of any multiplier too (npfallback._dfxk reads channel c*M+m's input in
    place: planned one input-sized array, the held-out 1-D depthwise-separable net's
    streamed and ranked cells were 1.23-1.26x on 32-bit).  (Planned as one more output-sized
    array whatever the activation, the held-out 1-D conv nets' second conv, whose 15 KB
    output has none, stood at their forward peak: 1.55x on 32-bit ulab, issue 28.)"""
    _, OH, OW, O = g.tensors[op.outputs[0]].shape
    fo, act = _act_temps(op, OH * OW * O, O, arrays)
    if arrays != 'ulab':
        return fo, 0, act
    return fo, _dw_spread(op, g), max(_conv_piece(op, g), act)


def _dw_spread(op, g):
    """Input-sized arrays of a depthwise multiplier M > 1's spread copy under ulab (M of
    them: op_conv.spread, made by utrain.ulconv and convwalk), none where utrain.ulmono
    runs the op (one input channel, not ulconv's stride-1 same-size case: it reads the
    image as it is; planned as 8 input-sized copies, the held-out 1 -> 8 depthwise net's
    ranked cells were 1.25x on 32-bit ulab), nor for M = 1 or another op."""
    if op.name != 'DEPTHWISE_CONV_2D':
        return 0
    x, y = g.tensors[op.inputs[0]].shape, g.tensors[op.outputs[0]].shape
    m = y[-1] // x[-1]
    if m == 1 or 'ulmono' in _conv_steps(op, g, 'ulab', False):
        return 0
    return m


def _conv_bwd(op, g, arrays):
    """utrain.op_conv's backward beside the gradients in flight: the fused activation's
    gradient (_act_grad_temps), dx (zeros, which the steps write into: the fallback's
    native loops, ulab's a piece of a tap's product at a time, _conv_piece), and under
    ulab a depthwise multiplier M > 1's spread copy (x for dW, dx before it is summed
    back: M input-sized arrays, one at a time).  (Planned as two output- and two
    input-sized arrays, a conv without activation and its input's one reader got an
    activation gradient and a sum it never makes: the held-out residual CNN 1.22x on
    32-bit.)"""
    n = int(np.prod(g.tensors[op.outputs[0]].shape))
    fo, mask = _act_grad_temps(op, n)
    fi = 1 + (_dw_spread(op, g) if arrays == 'ulab' else 0)
    piece = _conv_piece(op, g) if arrays == 'ulab' else 0
    return fo, fi, mask + piece, ()


def _conv_rows(op, g, arrays, back):
    """utrain.convrows' arrays (a frozen weight streamed by rows through one
    stream.CHUNK-float buffer, the buffer planned with the slot buffers) on either array
    backend: forward per tap step an [OW, m] product (CONV_2D: m the chunk's output
    channels, CHUNK // (KH*KW*I), at least 1; DEPTHWISE_CONV_2D: all C*M, and with a
    multiplier M > 1 the spread copy of x), then, once the steps have returned, the fused
    activation's arrays (_act_temps: in place a chunk of rows at a time on a large
    output); for dx the activation's gradient (_conv_bwd's), dx and an [OW, I] product
    (DEPTHWISE_CONV_2D: [OW, C*M], and with M > 1 the M input-sized spread dx).
    (Planned as ulab's whole-output pieces and a whole-output activation, the zoo IMU
    net's streamed 64 x 32 conv, SGD b4 on 32-bit ulab, was 1.21x its smallest heap; the
    fallback's had no product at all.)"""
    _, H, W, I = g.tensors[op.inputs[0]].shape
    _, OH, OW, O = g.tensors[op.outputs[0]].shape
    dw = op.name == 'DEPTHWISE_CONV_2D'
    m = O // I if dw else 1
    if back:
        fo, mask = _act_grad_temps(op, OH * OW * O)
        return fo, 1 + (m if m > 1 else 0), mask + OW * (O if dw else I)
    if dw:
        steps = OW * O + (H * W * O if m > 1 else 0)
    else:
        _, KH, KW, _ = g.tensors[op.inputs[1]].shape
        steps = OW * min(O, max(1, module('stream').CHUNK // (KH * KW * I)))
    fo, act = _act_temps(op, OH * OW * O, O, arrays)
    return fo, 0, max(steps, act)


def _conv_saves(op, flags):
    return _fc_saves(op, flags)          # x when W trains, y when fused


def _maxpool_saves(op, flags):
    return [op.inputs[0], op.outputs[0]] if flags & DX else []


def _avgpool_saves(op, flags):
    fused = op.options.get('fused_activation_function', 'NONE') != 'NONE'
    return [op.outputs[0]] if flags & DX and fused else []


def _pool_fwd(op, g, arrays):
    """utrain.op_pool's MAX_POOL_2D and AVERAGE_POOL_2D forward beside the output (np.full /
    zeros): the max pool a row at a time, np.maximum's [n, C] result (n <= OW) and, under
    ulab, its copy into the output (the fallback's native maxpool_steps: none); the average
    pool added in place through views, then _scale a row at a time (a * col, * rows[i] and
    under ulab the copy); then the fused activation's arrays (_act_temps).  (The default
    two output-sized arrays, a 2x2 max pool of a 28x28x8 map stood at the held-out conv
    net's forward peak: 1.2-1.3x its need on 32-bit, issue 28.)"""
    _, OH, OW, C = g.tensors[op.outputs[0]].shape
    fo, act = _act_temps(op, OH * OW * C, C, arrays)
    if op.name == 'MAX_POOL_2D':
        rows = 2 * OW * C if arrays == 'ulab' else 0
    else:
        rows = (2 + (arrays == 'ulab')) * OW * C
    return fo, 0, max(rows, act)


SPECS.update({s.name: s for s in [
    OpSpec('CONV_2D', {1: 'weight', 2: 'bias'}, _conv_options, _conv_saves,
           shapes=_conv_shapes, fwd=(2, 0), bwd=(3, 2), taps=24, steps=_conv_steps,
           fwd_native=(1, 0), bwd_native=(2, 2), piece=_conv_piece, bwd_of=_conv_bwd,
           rows_of=_conv_rows, fwd_of=_conv_fwd),   # (fwd: the fused activation's array)
    OpSpec('DEPTHWISE_CONV_2D', {1: 'weight', 2: 'bias'}, _dwconv_options, _conv_saves,
           fwd=(2, 1), bwd=(3, 3), taps=24, out_axis=1, steps=_conv_steps,
           fwd_native=(1, 1), bwd_native=(2, 2), piece=_conv_piece, bwd_of=_conv_bwd,
           rows_of=_conv_rows, fwd_of=_conv_fwd),   # (fwd: and op_conv._spread's copy)
    OpSpec('MAX_POOL_2D', {}, _pool_options, _maxpool_saves, fwd=(2, 0), bwd=(3, 2), taps=16,
           fwd_of=_pool_fwd),
    OpSpec('AVERAGE_POOL_2D', {}, _pool_options, _avgpool_saves, fwd=(2, 0), bwd=(3, 2),
           taps=16, fwd_of=_pool_fwd),
    OpSpec('MEAN', {}, _mean_options, _none, device_inputs=(0,), fwd=(0, 0), bwd=(1, 1)),   # (dx: zeros, d added in place)
]})


# ---- TRANSPOSE_CONV (micro/utrain/op_tconv.py): inputs output_shape (read here: the
# output tensor's static shape), weight [O, KH, KW, I], input, optional bias.  It is the
# input gradient of a convolution C (C's input: this op's output, C's output: its input,
# the same kernel, stride and padding as TFLite computes it from the output's size), so
# the device gets C's geometry and runs op_conv's steps with roles swapped.

_TC = 'TRANSPOSE_CONV'


def _tconv_options(op, g):
    where = f'op {op.number} {_TC}'
    if len(op.inputs) < 3:
        raise ValueError(f'{where}: has {len(op.inputs)} inputs; TFLite\'s has output_shape, '
                         'weights, input [, bias]')
    Hi, Wi, I = _nhwc(g, op.inputs[2], where, 'the input')
    Ho, Wo, O = _nhwc(g, op.outputs[0], where, 'the output')
    w = g.tensors[op.inputs[1]].shape
    if len(w) != 4 or (w[0], w[3]) != (O, I):
        raise ValueError(f'{where}: weight of shape {list(w)} for {I} input and {O} output '
                         'channels (TFLite\'s is [out, kh, kw, in]; grouped transposed '
                         'convolution is not supported)')
    _, KH, KW, _ = w
    sh, sw = _strides(op)
    dh, dw = _dilations(op)
    pad = op.options.get('padding', 'SAME')
    ch, pt = out_pad(Ho, KH, sh, dh, pad, where)
    cw, pl = out_pad(Wo, KW, sw, dw, pad, where)
    return _slots({opc.ACT: _fused(op, where), opc.G_H: Ho, opc.G_W: Wo, opc.G_C: O,
                   opc.G_OH: Hi, opc.G_OW: Wi, opc.G_OC: I, opc.G_KH: KH, opc.G_KW: KW,
                   opc.G_SH: sh, opc.G_SW: sw, opc.G_DH: dh, opc.G_DW: dw, opc.G_PT: pt,
                   opc.G_PL: pl})


def _tconv_saves(op, flags):
    keep = [op.inputs[2]] if flags & DW else []
    if op.options.get('fused_activation_function', 'NONE') != 'NONE':
        keep.append(op.outputs[0])
    return keep


def _tconv_steps(op, g, arrays, banded):
    # op_conv's, of the convolution whose input is this op's output
    return ('op_conv',) + _conv_steps(op, g, arrays, banded, op.outputs[0], op.inputs[2])


SPECS.update({s.name: s for s in [
    OpSpec(_TC, {1: 'weight', 3: 'bias'}, _tconv_options, _tconv_saves, data_inputs=(2,),
           device_inputs=(2, 1, 3), shapes=_conv_shapes, fwd=(2, 0), bwd=(3, 2), taps=24,
           steps=_tconv_steps, fwd_native=(1, 0), bwd_native=(2, 2), piece=lambda op, g: _conv_piece(op, g, 2),
           wtemp=1),
]})



# ---- ops-elem: ADD/SUB/MUL/DIV with broadcasting (op_elem), PAD/CONCATENATION/TRANSPOSE/
# STRIDED_SLICE as block copies and SQUEEZE/EXPAND_DIMS as reshapes (op_shape),
# HARD_SWISH/LEAKY_RELU/ELU (op_act).  Shapes and constant index inputs are read here.

def _where(op):
    return f'op {op.number} {op.name}'


def _shape4(g, k, op):
    """Tensor k's shape left-padded to 4-D (the device keeps [d0*d1*d2, d3]); a higher
    rank whose leading axes are 1 (Keras's UpSampling2D tiles [1, H, 1, W, C]) drops them."""
    s = list(g.tensors[k].shape)
    while len(s) > 4 and s[0] == 1:
        s = s[1:]
    if len(s) > 4:
        raise ValueError(f'{_where(op)}: tensor {k} has shape {list(g.tensors[k].shape)}; '
                         'utrain handles up to 4-D (or more with leading axes of 1)')
    return [1] * (4 - len(s)) + s


def _const_ints(g, op, pos, what):
    k = op.inputs[pos] if pos < len(op.inputs) else -1
    if k < 0 or g.tensors[k].data is None:
        raise ValueError(f'{_where(op)}: its {what} (input {pos}) must be a constant tensor')
    return [int(v) for v in g.tensors[k].data.ravel()]


def _elem_roles(op, g):
    # the operand that is a float constant of more than one element is the op's
    # parameter (BatchNorm's scale and shift become MUL and ADD constants): trainable like
    # an FC's weight or bias.  Scalars (an exported hard-swish's 3 and 6) stay frozen, and
    # so does a DIV's constant, divisor or dividend: no Keras layer trains one (a Lambda's
    # x / c, a Normalization's std are constants there), a trained divisor can cross 0,
    # and the int8 path keeps it the file's (fromfloat: x / c is a MUL by 1 / c).
    const = [p for p in (0, 1) if g.tensors[op.inputs[p]].data is not None]
    if len(const) != 1 or op.name not in ('ADD', 'SUB', 'MUL', 'BATCH_MATMUL'):
        return {}
    t = g.tensors[op.inputs[const[0]]]
    if t.dtype != 'float32' or t.data.size < 2 and not _one_unit_bias(op, g, const[0]) \
            and not _prelu_slope(op, g, const[0]) or \
            normalization(op, g) or t.frozen:       # (a clip's bound: spellings.elementwise_forms)
        return {}
    return {const[0]: 'weight' if op.name in ('MUL', 'DIV', 'BATCH_MATMUL') else 'bias'}


def _prelu_slope(op, g, c) -> bool:
    """Is op's one-element constant c a PReLU's one shared slope: the MUL of
    spellings.elementwise_forms's PRELU(x, alpha) -> RELU(x) + alpha * (x - RELU(x))
    (PyTorch's nn.PReLU(), its default of one slope for every unit, which it trains;
    frozen as a scalar constant before, while a slope a channel trained)?"""
    if op.name != 'MUL':
        return False
    prod = {k: o for o in g.ops for k in o.outputs}
    sub = prod.get(op.inputs[1 - c])
    if sub is None or sub.name != 'SUB' or len(sub.inputs) != 2:
        return False
    r = prod.get(sub.inputs[1])
    return r is not None and r.name == 'RELU' and r.inputs[:1] == sub.inputs[:1]


def _one_unit_bias(op, g, c) -> bool:
    """Is op's one-element constant c the bias of a one-unit layer: an ADD right after a
    FULLY_CONNECTED without a bias of its own and of one output (an ONNX MatMul + Add: the
    output layer of scikit-learn's MLPRegressor or binary MLPClassifier through skl2onnx,
    whose intercept had stayed frozen as a scalar)?"""
    if op.name != 'ADD':
        return False
    x = op.inputs[1 - c]
    # (graph.edit.producer's lookup: edit reads circle_io, whose onnx_io reads optable)
    fc = next((o for o in g.ops if x in o.outputs), None)
    return fc is not None and fc.name == 'FULLY_CONNECTED' and \
        (len(fc.inputs) < 3 or fc.inputs[2] < 0) and \
        int(g.tensors[x].shape[-1] if g.tensors[x].shape else 0) == 1


def _const_operand(op, g) -> int:
    """The position of op's one float constant operand (a binary op's), or -1."""
    c = [p for p in (0, 1) if p < len(op.inputs) and op.inputs[p] >= 0
         and g.tensors[op.inputs[p]].data is not None]
    return c[0] if len(c) == 1 and len(op.inputs) == 2 and \
        g.tensors[op.inputs[c[0]]].dtype == 'float32' else -1


def normalization(op, g) -> bool:
    """Is op half of a normalization by statistics: SUB of a constant from an activation
    (x - mean) whose result some MUL or DIV by a constant scales (1 / std), or that MUL or
    DIV?  Keras's Normalization layer (and a PyTorch model's (x - mean) / std of buffers)
    exports so; its mean and variance are not trained there (Keras: trainable=False), so
    they stay the file's here too, where a folded BatchNorm's MUL and ADD constants, its
    trained gamma and beta, train."""
    if op.name == 'SUB':
        if _const_operand(op, g) != 1:
            return False
        y = op.outputs[0]
        return any(o.name in ('MUL', 'DIV') and y in o.inputs and _const_operand(o, g) >= 0
                   and o.inputs[_const_operand(o, g)] != y for o in g.ops)
    if op.name not in ('MUL', 'DIV') or _const_operand(op, g) < 0:
        return False
    x = op.inputs[1 - _const_operand(op, g)]
    return any(o.name == 'SUB' and o.outputs[0] == x and _const_operand(o, g) == 1 for o in g.ops)


def _elem_options(op, g):
    """act, parameter position or -1, n0, n1, n2, then per operand d0, d1, rows (utrain.opc
    E_*): the output's rows (dims 0-2) as n0 x n1 blocks of n2 rows; block (i, j) of an
    operand starts at its row i*d0 + j*d1 and has n2 rows, or 1 that broadcasts.  Columns
    broadcast natively (an operand's last dim is the output's or 1)."""
    S = _shape4(g, op.outputs[0], op)
    X = [_shape4(g, k, op) for k in op.inputs[:2]]
    if [max(a, b) for a, b in zip(*X)] != S or any(x[d] not in (1, S[d]) for x in X for d in range(4)):
        raise ValueError(f'{_where(op)}: shapes {[g.tensors[k].shape for k in op.inputs[:2]]} do not '
                         f'broadcast to the output shape {g.tensors[op.outputs[0]].shape}')
    levels = _levels(S[:3], [x[:3] for x in X])
    p = list(_elem_roles(op, g)) or [-1]
    opts = {opc.ACT: _fused(op, _where(op)), opc.E_PARAM: p[0], opc.E_N2: levels[2][0]}
    for side in (1, 2):
        _blocks(opts, levels, side, 1, 1 if levels[2][side] else levels[2][0])
    return _slots(opts)


def _levels(S, X):
    """The axes of shape S (X: the two operands' sizes along them, S's or 1) as levels
    [size, operand 0 broadcasts, operand 1 broadcasts], neighbours that broadcast alike
    merged, left-padded to as many levels as S has axes."""
    levels = []
    for d in range(len(S)):
        if S[d] > 1:
            st = [X[0][d] == 1, X[1][d] == 1]
            if levels and levels[-1][1:] == st:
                levels[-1][0] *= S[d]
            else:
                levels.append([S[d]] + st)
    return [[1, True, True]] * (len(S) - len(levels)) + levels


def _blocks(opts, levels, side, unit, rows):
    """The block slots (utrain.opc E_*) of operand side (1, 2) over the first two levels:
    the output's N0 x N1 blocks and the operand's row steps per block (unit rows an element
    of the last level, 0 where it broadcasts) and its rows a block."""
    step, d = unit, [0] * len(levels)
    for i in reversed(range(len(levels))):
        if not levels[i][side]:
            d[i] = step
            step *= levels[i][0]
    e = opc.E_OPD * (side - 1)
    opts.update({opc.E_N0: levels[0][0], opc.E_N1: levels[1][0], e + opc.E_D0: d[0],
                 e + opc.E_D1: d[1], e + opc.E_ROWS: rows})


def _elem_saves(op, flags):
    keep = [op.outputs[0]] if op.options.get('fused_activation_function', 'NONE') != 'NONE' else []
    if op.name in ('MUL', 'DIV'):         # each operand's gradient reads the other one
        if flags & (DX | DW) or op.name == 'DIV':     # (and DIV's b its own value)
            keep.append(op.inputs[1])
        if flags & (dx_bit(1) | DW):
            keep.append(op.inputs[0])
    return keep


def _rowcol(N):
    """(row step, column step) of each axis of a 4-D shape N on the device."""
    return [(N[1] * N[2], 0), (N[2], 0), (1, 0), (0, 1)]


def _at(N, idx):
    rc = _rowcol(N)
    return sum(i * r for i, (r, c) in zip(idx, rc)), idx[3]


def _copy_plan(box, a0, b0):
    """The C_PART floats (utrain.opc C_*) of one block copy B[box] = A[box] between two
    device arrays (see micro/utrain/op_shape.py).  box: per dim (size, (A row, col step), (B row, col step));
    a0, b0: (row, col) where the box starts in A and in B."""
    dims = []
    for n, a, b in box:                   # drop size-1 dims, merge contiguous neighbours
        if n == 1:
            continue
        if dims and all(o == i * n for o, i in zip(dims[-1][1] + dims[-1][2], a + b)):
            dims[-1] = [dims[-1][0] * n, a, b]
        else:
            dims.append([n, a, b])
    one = [1, (0, 0), (0, 0)]
    pc = [d for d in dims if d[2][1]]     # the dim along B's columns, if any
    qa = [d for d in dims if d[1][1]]     # the dim along A's columns, if any
    if pc and qa and pc[0] is not qa[0]:
        u, v, tr = qa[0], pc[0], 1        # A's block is transposed
    elif pc:
        v = pc[0]
        rest = [d for d in dims if d is not v] or [one]
        u, tr = (rest[-1], 0) if qa else (one, 1)
    elif qa:
        u, v, tr = qa[0], one, 1
    else:
        u, v, tr = (dims[-1] if dims else one), one, 0
    outer = [d for d in dims if d is not u and d is not v]
    assert len(outer) <= 2, box           # a missing column dim leaves <= 3 dims
    outer = [one] * (2 - len(outer)) + outer
    plan = {opc.C_NA: outer[0][0], opc.C_NB: outer[1][0], opc.C_N1: u[0], opc.C_N2: v[0],
            opc.C_TR: tr}
    for side, start, at in ((1, a0, opc.C_A), (2, b0, opc.C_B)):
        rs, cs = ((v, u) if tr and side == 1 else (u, v))
        fields = [start[0], start[1], *outer[0][side], *outer[1][side],
                  rs[side][0] or 1, cs[side][1] or 1]
        assert len(fields) == opc.C_SIDE
        plan.update((at + i, f) for i, f in enumerate(fields))
    plan = _slots(plan)
    assert len(plan) == opc.C_PART
    return plan


def _pad_options(op, g):
    X, Y = _shape4(g, op.inputs[0], op), _shape4(g, op.outputs[0], op)
    pads = _const_ints(g, op, 1, 'paddings')
    pads = [0] * (8 - len(pads)) + pads
    before = pads[0::2]
    if min(pads) < 0 or [x + p + q for x, p, q in zip(X, before, pads[1::2])] != Y:
        raise ValueError(f'{_where(op)}: paddings {pads} do not take {X} to {Y}')
    return _copy_plan(list(zip(X, _rowcol(X), _rowcol(Y))), (0, 0), _at(Y, before))


def _transpose_options(op, g):
    X, Y = _shape4(g, op.inputs[0], op), _shape4(g, op.outputs[0], op)
    perm = _const_ints(g, op, 1, 'permutation')
    r = len(perm)
    perm = [p % r for p in perm]
    shape = list(g.tensors[op.inputs[0]].shape)
    while r > 4 and perm[0] == 0 and shape[0] == 1:     # (Keras's batch axis of a 5-D
        perm, shape, r = [p - 1 for p in perm[1:]], shape[1:], r - 1    # Permute: in place)
    perm = list(range(4 - r)) + [p + 4 - r for p in perm]
    if sorted(perm) != [0, 1, 2, 3] or [X[p] for p in perm] != Y:
        raise ValueError(f'{_where(op)}: permutation {perm} does not take {X} to {Y}')
    ax = _rowcol(X)
    return _copy_plan([(Y[d], ax[perm[d]], _rowcol(Y)[d]) for d in range(4)], (0, 0), (0, 0))


def _slice_options(op, g):
    o = op.options
    if any(o.get(k) for k in ('ellipsis_mask', 'new_axis_mask', 'offset')):
        raise ValueError(f'{_where(op)}: only begin, end and shrink-axis masks are supported '
                         '(no ellipsis or new-axis masks, no offset)')
    X, Y = _shape4(g, op.inputs[0], op), _shape4(g, op.outputs[0], op)
    n = len(g.tensors[op.inputs[0]].shape)
    begin, end, step = (_const_ints(g, op, i, w) for i, w in ((1, 'begin'), (2, 'end'), (3, 'strides')))
    start, count, ax = [0] * 4, [1] * 4, _rowcol(X)
    shrink, kept = o.get('shrink_axis_mask', 0), list(range(4 - n))
    for i in range(n):
        d, dim, s = i + 4 - n, X[i + 4 - n], step[i]
        b = 0 if o.get('begin_mask', 0) >> i & 1 else begin[i]
        e = dim if o.get('end_mask', 0) >> i & 1 else end[i]
        b, e = (min(max(v + dim if v < 0 else v, 0), dim) for v in (b, e))
        if shrink >> i & 1:               # one index, the axis dropped from the output
            e, s = b + 1, 1
        else:
            kept.append(d)
        if s <= 0:
            raise ValueError(f'{_where(op)}: stride {s} (utrain slices with positive strides)')
        start[d], count[d] = b, max(0, -(-(e - b) // s))
        ax[d] = (ax[d][0] * s, ax[d][1] * s)
    out = [1] * (4 - len(kept)) + [count[d] for d in kept]
    if out != Y:
        raise ValueError(f'{_where(op)}: slicing {X} gives {out}, the output is {Y}')
    to = dict(zip(kept, _rowcol(Y)[4 - len(kept):]))     # input axis -> output steps
    box = [(count[d], ax[d], to.get(d, (0, 0))) for d in range(4)]
    return _copy_plan(box, _at(X, start), (0, 0))


def _concat_options(op, g):
    _fused(op, _where(op))
    if op.options.get('fused_activation_function', 'NONE') != 'NONE':
        raise ValueError(f'{_where(op)}: a fused activation on CONCATENATION is not supported; '
                         'apply it as an op of its own after the concatenation')
    Y = _shape4(g, op.outputs[0], op)
    n = len(g.tensors[op.outputs[0]].shape)
    axis = op.options.get('axis', 0)
    axis = (axis + n if axis < 0 else axis) + 4 - n
    plan, at = [], [0] * 4
    for k in op.inputs:
        X = _shape4(g, k, op)
        plan += _copy_plan(list(zip(X, _rowcol(X), _rowcol(Y))), (0, 0), _at(Y, at))
        at[axis] += X[axis]
    if at[axis] != Y[axis]:
        raise ValueError(f'{_where(op)}: inputs along axis {axis} do not add up to {Y}')
    return plan


def _in(op, flags):
    return [op.inputs[0]]


# What these kernels make beside their output (gc.mem_alloc around each kernel on the
# 32-bit builds, docs/memory.md): ulab's slice assignment copies its source first (a
# block's copy, one block at a time), the fallback's writes in place (npfallback._put);
# np.clip makes two arrays on both.  optable had planned two output-sized temporaries and
# an input-sized one for each (the default fwd): ResNet-8's 64 KB transposes, 3.3x.

def _act_temps(op, n, cols, arrays):
    """(output-sized arrays, floats of the pieces live at once) utrain.op_act.act makes
    for op's fused activation on a fresh output of n values in cols columns: a clipping
    one np.maximum's result (RELU) or np.clip's two, beyond op_act._WHOLE values in place
    op_act._CHUNK values of rows at a time (each chunk's results and, under ulab, their
    copy into the output); NONE and TANH (out=) none."""
    a = op.options.get('fused_activation_function', 'NONE')
    if a not in ('RELU', 'RELU6', 'RELU_N1_TO_1'):
        return 0, 0
    k = 1 if a == 'RELU' else 2
    m = module('op_act')
    if n > m._WHOLE:
        return 0, (k + (arrays == 'ulab')) * max(1, m._CHUNK // cols) * cols
    return k, 0


def _elem_fwd(op, g, arrays):
    """utrain.op_elem's forward: the output (a OP b), or with broadcast blocks a zeroed
    output and each block's result (and, under ulab, its copy into the output), then the
    fused activation."""
    *lead, cols = _shape4(g, op.outputs[0], op)
    rows = lead[0] * lead[1] * lead[2]
    o = _elem_options(op, g)
    n0, n1, n2 = (int(o[k]) for k in (opc.E_N0, opc.E_N1, opc.E_N2))
    blocks = (1 + (arrays == 'ulab')) * n2 * cols if n0 * n1 > 1 else 0
    fo, act = _act_temps(op, rows * cols, cols, arrays)
    return fo, 0, max(blocks, act)


def _copy_fwd(op, g, arrays):
    """utrain.op_shape's forward: a zeroed output and, under ulab, the copy of one block
    of the copy plan at a time (the largest: C_N1 x C_N2 floats)."""
    if arrays != 'ulab':
        return 0, 0, 0
    p = SPECS[op.name].options(op, g)
    return 0, 0, max(int(p[k + opc.C_N1] * p[k + opc.C_N2]) for k in range(0, len(p), opc.C_PART))


def _act_fwd(op, g, arrays):
    """utrain.op_act's standalone RELU, RELU6 and RELU_N1_TO_1 forward (act): up to
    op_act._WHOLE values np.maximum's output (RELU) or np.clip's two arrays; beyond it a
    copy of the input (the output) clipped in place a chunk of rows at a time
    (_act_temps' pieces).  (The default (2, 1) planned a 16x16x8 RELU after a PReLU
    rewrite as four arrays: the held-out PReLU CNN's ranked cells 1.22x on 32-bit.)"""
    *lead, cols = _shape4(g, op.outputs[0], op)
    k = 1 if op.name == 'RELU' else 2
    m = module('op_act')
    if lead[0] * lead[1] * lead[2] * cols > m._WHOLE:
        return 0, 0, (k + (arrays == 'ulab')) * max(1, m._CHUNK // cols) * cols
    return k - 1, 0, 0


def _act_in_place(op, g):
    """utrain.op_act's standalone clipping activation beyond op_act._WHOLE values: the
    output is its input's array, clipped in place, where the input dies at the op (a copy
    of it otherwise).  (Planned as a copy always, a frozen 28x28 1 -> 8 conv's RELU, a
    25 KB map, stood at the held-out conv net's forward peak: 1.3x on 32-bit ulab.)"""
    return int(np.prod(g.tensors[op.inputs[0]].shape)) > module('op_act')._WHOLE


def _act_bwd(op, g, arrays):
    """op_act.act_grad of RELU (a byte mask and where's result, the input's gradient),
    RELU6 and RELU_N1_TO_1 (two masks, two where()s)."""
    n = int(np.prod(g.tensors[op.inputs[0]].shape))
    k = 1 if op.name == 'RELU' else 2
    return 0, k, k * _bytes_mask(n, arrays), ()


def _copy_bwd(op, g, arrays):
    """utrain.op_shape's backward: each input's gradient a zeroed input-sized array the
    blocks of dy are copied into (the first input's here, the others' the planner counts
    as data inputs' gradients) and, under ulab, one block's copy at a time (_copy_fwd's);
    nothing output-sized (the default figures planned two output- and two input-sized
    arrays: a PAD of 12x12x8 was 21 KB on 32-bit, where it holds its 4.7 KB dx)."""
    return 0, 1, _copy_fwd(op, g, arrays)[2], ()


def _bytes_mask(n, arrays):
    """Floats' worth of a comparison's byte mask of n values: ulab's uint8 array, the
    fallback's array('B') made from a bytearray of its size (npfallback._new: both
    allocated)."""
    return (n // 4) * (2 if arrays != 'ulab' else 1)


def _elu_fwd(op, g, arrays):
    """utrain.op_act's ELU forward, where(x > 0, x, exp(minimum(x, 0)) - 1): the mask,
    minimum's, exp's and - 1's arrays and the output (the default (3, 1) planned an
    input-sized array more than the mask: the held-out Conv1D + ELU net's forward peak,
    1.17x its smallest 32-bit heap)."""
    return 3, 0, _bytes_mask(int(np.prod(g.tensors[op.outputs[0]].shape)), arrays)


def _elu_bwd(op, g, arrays):
    """utrain.op_act's ELU backward, where(y > 0, dy, dy * (y + 1)): the mask, y + 1,
    its product with dy and the where's result, the input's gradient (the default 2 + 2
    arrays)."""
    n = int(np.prod(g.tensors[op.inputs[0]].shape))
    return 0, 3, _bytes_mask(n, arrays), ()


def _add_bwd(op, g, arrays):
    """utrain.op_elem's ADD / SUB backward without broadcast blocks: dz (the fused
    activation's gradient, _act_grad_temps; dy itself without one) is each operand's
    gradient where the operand is the output's size (_red leaves it as it is), SUB's
    second operand -dz (an array of its own, which the planner counts as that input's
    gradient); an operand of fewer rows or columns gets dz summed down (small), blocks
    zeros and each block's product (the default figures).  (A residual ADD was planned
    as six arrays of its size and its skip's gradient as one more array in flight down
    the branch: the held-out residual CNN's peak, 1.2x on 32-bit ulab.)"""
    o = _elem_options(op, g)
    if int(o[opc.E_N0]) * int(o[opc.E_N1]) > 1:
        return 2, 2, 0, ()
    n = int(np.prod(g.tensors[op.outputs[0]].shape))
    fo, mask = _act_grad_temps(op, n)
    passed = tuple(s for s in ((0,) if op.name == 'SUB' else (0, 1))
                   if int(np.prod(g.tensors[op.inputs[s]].shape)) == n)
    return fo, 0 if 0 in passed else 1, mask, passed


def _hswish_bwd(op, g, arrays):
    """utrain.op_act's HARD_SWISH backward, on both array kinds: x > 3 and x < -3 (two
    byte masks: n / 4 floats each), x / 3, + 0.5, dy * that and two where()s: five
    input-sized arrays and the masks, each made once (bwd's 6 rounded the masks up to a
    whole array; fewer live at once where the run collects before each was measured
    too low: four of them put the held-out ho_hswish under on 32-bit ulab, 0.995)."""
    n = int(np.prod(g.tensors[op.inputs[0]].shape))
    return 0, 5, 2 * (n // 4), ()


_ELEM = (0, 1)
SPECS.update({s.name: s for s in [
    OpSpec('ADD', _elem_roles, _elem_options, _elem_saves, data_inputs=_ELEM, fwd_of=_elem_fwd,
           bwd_of=_add_bwd),
    OpSpec('SUB', _elem_roles, _elem_options, _elem_saves, data_inputs=_ELEM, fwd_of=_elem_fwd,
           bwd_of=_add_bwd),
    OpSpec('MUL', _elem_roles, _elem_options, _elem_saves, data_inputs=_ELEM, fwd_of=_elem_fwd),
    OpSpec('DIV', _elem_roles, _elem_options, _elem_saves, data_inputs=_ELEM, fwd_of=_elem_fwd),
    OpSpec('PAD', {}, _pad_options, _none, device_inputs=(0,), fwd_of=_copy_fwd,
           bwd_of=_copy_bwd),
    OpSpec('TRANSPOSE', {}, _transpose_options, _none, device_inputs=(0,), fwd_of=_copy_fwd,
           bwd_of=_copy_bwd),
    OpSpec('STRIDED_SLICE', {}, _slice_options, _none, device_inputs=(0,), fwd_of=_copy_fwd,
           bwd_of=_copy_bwd),
    OpSpec('CONCATENATION', {}, _concat_options, _none, data_inputs=None, fwd_of=_copy_fwd,
           bwd_of=_copy_bwd),
    # (a view both ways, as RESHAPE: the forward hands x on reshaped, the backward dy;
    # planned with the default temporaries, a Keras Conv1D's EXPAND_DIMS stood over its
    # convs' forward and backward: the held-out Conv1D net 1.2x on 32-bit)
    OpSpec('SQUEEZE', {}, _none, _none, view=True, fwd=(0, 0), bwd=(0, 0)),
    OpSpec('EXPAND_DIMS', {}, _none, _none, device_inputs=(0,), view=True, fwd=(0, 0), bwd=(0, 0)),
    # HARD_SWISH as op_act makes it, on both array kinds: forward x/6, +0.5, clip's two
    # and the output (5 arrays: the default planned 4); backward two byte masks, x/3,
    # +0.5, dy * that and two where()s (5.5: the default 4).  A held-out Keras hard_swish
    # CNN was planned at its need (SGD b1, 32-bit ulab: 1.00x; 4.7 KB less fails in this
    # backward) and 0.5 % over it (Adam b4, 32-bit fallback): the sample's and the static
    # part's excess had covered it
    # (fwd_live: with a collection before each of its arrays, the output and three of the
    # four temporaries stay referenced at its worst allocation: clip's input while clip
    # makes its two, and a reference the stack keeps (measured: two fewer, the held-out
    # ho_hswish, frozen up to the activation, failed in this forward 5-8 KB above the
    # plan on both 32-bit builds); all five planned: its streamed and ranked cells on
    # 32-bit ulab were 1.20-1.22x their need, now 1.14-1.15, 1.08-1.09 on 32-bit)
    OpSpec('HARD_SWISH', {}, _none, _in, fwd=(3, 1), bwd=(0, 6), fwd_live=(3, 0),
           bwd_of=_hswish_bwd),
    OpSpec('LEAKY_RELU', {}, lambda op, g=None: _slots({opc.ALPHA: op.options.get('alpha', 0.0)}),
           _in),
    # (forward: a byte mask, minimum, exp, - 1 and the where(): 4.25 arrays, the default 4;
    # fwd stays the row bands' figure)
    OpSpec('ELU', {}, _none, _out, fwd=(3, 1), fwd_of=_elu_fwd, bwd_of=_elu_bwd),
    # (the standalone clipping activations as op_act makes them)
    OpSpec('RELU', {}, _none, _out, fwd_of=_act_fwd, bwd_of=_act_bwd, in_place=_act_in_place),
    OpSpec('RELU_N1_TO_1', {}, _none, _out, fwd_of=_act_fwd, bwd_of=_act_bwd, in_place=_act_in_place),
    OpSpec('RELU6', {}, _none, _out, fwd_of=_act_fwd, bwd_of=_act_bwd, in_place=_act_in_place),
]})



# ---- attention (issue 28): BATCH_MATMUL (micro/utrain/op_bmm.py), a product of two
# activations (Q K^T, P V) or of an activation and a constant, batched over the leading
# axes with broadcasting, adj_x / adj_y transposing an operand's matrices.

def _bmm_options(op, g):
    """ADJ, the parameter's position or -1, then N0, N1, N2 and per operand D0, D1, ROWS
    as ADD's (utrain.opc E_*): the output's batch of matrices as N0 x N1 blocks of N2 rows,
    the operand's matrix in block (i, j) its rows i*D0 + j*D1 .. + ROWS.  Batch axes that
    broadcast alike merge; more than two kinds of them are refused."""
    where = _where(op)
    a, b = (list(g.tensors[k].shape) for k in op.inputs[:2])
    y = list(g.tensors[op.outputs[0]].shape)
    if min(len(a), len(b)) < 2:
        raise ValueError(f'{where}: operands {a} and {b}; BATCH_MATMUL takes matrices '
                         '(rank 2 or more)')
    ax, ay = bool(op.options.get('adjoint_lhs')), bool(op.options.get('adjoint_rhs'))   # adj_x, adj_y
    M, K = a[-1:-3:-1] if ax else a[-2:]
    K2, N = b[-1:-3:-1] if ay else b[-2:]
    n = max(len(a), len(b)) - 2
    A, B = ([1] * (n + 2 - len(s)) + s[:-2] for s in (a, b))
    S = [max(p, q) for p, q in zip(A, B)]
    if K != K2:
        raise ValueError(f'{where}: {a}{" (adj_x)" if ax else ""} times {b}{" (adj_y)" if ay else ""}: '
                         f'the first operand\'s matrices have {K} columns, the second\'s {K2} rows '
                         '(adj_x / adj_y transpose them; give the options the exporter meant)')
    if any(x[d] not in (1, S[d]) for x in (A, B) for d in range(n)) \
            or y[-2:] != [M, N] or int(np.prod(y[:-2])) != int(np.prod(S)):
        raise ValueError(f'{where}: {a}{" (adj_x)" if ax else ""} times {b}'
                         f'{" (adj_y)" if ay else ""} does not give the output {y}')
    levels = [v for v in _levels(S, [A, B]) if v[0] > 1]
    if len(levels) > 2:
        raise ValueError(f'{where}: batch axes {A} and {B} broadcast in {len(levels)} '
                         'alternating runs; utrain takes two (reshape the operands so that '
                         'the axes each broadcasts along are adjacent)')
    levels = [[1, True, True]] * (2 - len(levels)) + levels
    p = list(_elem_roles(op, g)) or [-1]
    opts = {opc.ADJ: ax + 2 * ay, opc.E_PARAM: p[0], opc.E_N2: M}
    for side, x in ((1, a), (2, b)):
        _blocks(opts, levels, side, x[-2], x[-2])
    return _slots(opts)


def _bmm_saves(op, flags):
    # da reads b, db reads a (the constant among them is not an activation to keep)
    keep = [op.inputs[1]] if flags & (DX | DW) else []
    return keep + ([op.inputs[0]] if flags & (dx_bit(1) | DW) else [])


def _bmm_fwd(op, g, arrays):
    """utrain.op_bmm's forward: the product is the output, or with several blocks a zeroed
    output and one block's product (copied into it under ulab)."""
    o = _bmm_options(op, g)
    blocks = int(o[opc.E_N0] * o[opc.E_N1])
    m, n = g.tensors[op.outputs[0]].shape[-2:]
    return 0, 0, (1 + (arrays == 'ulab')) * m * n if blocks > 1 else 0


SPECS.update({s.name: s for s in [
    # bwd: per operand its gradient (the second's counted by the planner as any data
    # input n >= 1's) and one block's product
    OpSpec('BATCH_MATMUL', _elem_roles, _bmm_options, _bmm_saves, data_inputs=_ELEM,
           fwd_of=_bmm_fwd, bwd=(1, 1), out_axis=1),
]})


# ---- zoo ops (issue 15): SPLIT/SPLIT_V (micro/utrain/op_split.py: row or column ranges),
# RSQRT/SQRT/EXP/LOG/GELU/ROUND/FLOOR/CEIL/SIGN (op_math.py).

def _split_options(op, g):
    """[cols, outer, inner, b0 .. bn] (micro/utrain/op_split.py): the split axis' part
    boundaries; along the last axis the device splits columns, else its rows seen as
    [outer, axis, inner]."""
    data = 1 if op.name == 'SPLIT' else 0
    axis = _const_ints(g, op, 0 if op.name == 'SPLIT' else 2, 'axis')
    n = len(g.tensors[op.inputs[data]].shape)
    if len(axis) != 1 or not -n <= axis[0] < n:
        raise ValueError(f'{_where(op)}: axis {axis} for a rank-{n} input')
    d = axis[0] % n + 4 - n
    X = _shape4(g, op.inputs[data], op)
    bounds = [0]
    for k in op.outputs:
        Y = _shape4(g, k, op)
        if [Y[i] for i in range(4) if i != d] != [X[i] for i in range(4) if i != d]:
            raise ValueError(f'{_where(op)}: output {list(g.tensors[k].shape)} is not a part of '
                             f'{list(g.tensors[op.inputs[data]].shape)} along axis {axis[0]}')
        bounds.append(bounds[-1] + Y[d])
    if bounds[-1] != X[d]:
        raise ValueError(f'{_where(op)}: outputs along axis {axis[0]} add up to {bounds[-1]}, '
                         f'the input has {X[d]}')
    cols = d == 3
    slots = {opc.S_COLS: cols, opc.S_OUTER: 1 if cols else np.prod(X[:d]),
             opc.S_INNER: 1 if cols else np.prod(X[d + 1:3])}
    slots.update({opc.S_B0 + i: b for i, b in enumerate(bounds)})
    return _slots(slots)


def _gelu_options(op, g=None):
    return _slots({opc.APPROX: bool(op.options.get('approximate'))})


SPECS.update({s.name: s for s in [
    OpSpec('SPLIT', {}, _split_options, _none, data_inputs=(1,), device_inputs=(1,),
           fwd=(0, 0), bwd=(0, 1), held=1),
    OpSpec('SPLIT_V', {}, _split_options, _none, device_inputs=(0,), fwd=(0, 0), bwd=(0, 1),
           held=1),
    OpSpec('RSQRT', {}, _none, _out),
    OpSpec('SQRT', {}, _none, _out),
    OpSpec('EXP', {}, _none, _out),
    OpSpec('LOG', {}, _none, _in),
    # GELU's exact form (erf's quintic, utrain/op_math.py) chains ~20 elementwise steps,
    # none freed before a collection: a LayerNorm block with it needed 4 output-sized
    # arrays more than with the tanh form (64-bit unix, fallback: 122 against 117 KB at
    # hidden 32, 163 against 147 KB at hidden 128), which fits the tanh form's 6; the
    # backward's live arrays under numpy are 8.  One figure per op: the tanh form is
    # planned as the exact one (issue 28's sweep: the LayerNorm block 0.95-0.99x)
    OpSpec('GELU', {}, _gelu_options, _in, fwd=(10, 0), bwd=(8, 1)),
] + [
    # steps (torch.round through tico, tf.math.floor): no gradient, as torch gives them
    # (dy/dx = 0 wherever it exists); no data input, so no backward runs
    OpSpec(name, {}, _none, _none, data_inputs=(), fwd=(1, 0), bwd=(0, 0))
    for name in ('ROUND', 'FLOOR', 'CEIL', 'SIGN')
]})


# ---- embeddings (issue 28): GATHER of a constant table's rows by the model's input ids
# (micro/utrain/op_emb.py); Keras's CAST and negative-id SELECT_V2 before it, and ONNX's
# Gather of an initializer, are made this one op by embeddings.embedding_gathers / onnx_io.

def _gather_options(op, g):
    where = _where(op)
    w, x, y = (g.tensors[k] for k in (op.inputs[0], op.inputs[1], op.outputs[0]))
    if int(op.options.get('axis', 0)) or op.options.get('batch_dims'):
        raise ValueError(f'{where}: a gather along axis {op.options.get("axis", 0)} (batch_dims '
                         f'{op.options.get("batch_dims", 0)}) is not supported; utrain gathers '
                         'rows of a table (an Embedding layer: axis 0)')
    if w.data is None or len(w.shape) != 2:
        raise ValueError(f'{where}: gathers from tensor {op.inputs[0]} ({w.name}, shape {w.shape}), '
                         'which is not a constant 2-D table; utrain gathers rows of an embedding '
                         'table [rows, width] by the input\'s ids')
    if list(y.shape) != list(x.shape) + [w.shape[1]]:
        raise ValueError(f'{where}: ids {x.shape} from a table {w.shape} do not give the '
                         f'output {y.shape}')
    return _slots({opc.GA_N: w.shape[0], opc.GA_WRAP: len(op.inputs) > 2})


SPECS.update({s.name: s for s in [
    # no data input: the ids get no gradient (op_emb); the table's gradient is its rows
    # (plain SGD at batch 1 steps them in place, other rules sum into a table-sized array)
    # (a third input, embeddings.embedding_gathers' N, says that ids -N..-1 count from the
    # table's end: read here, not sent)
    OpSpec('GATHER', {0: 'weight'}, _gather_options,
           lambda op, flags: [op.inputs[1]] if flags & DW else [], data_inputs=(),
           device_inputs=(0, 1), fwd=(0, 0), bwd=(0, 0), wgrad_sgd='rows'),
]})

# ---- comparisons and selects (issue 28: tico's torch.where, Softplus's threshold
# branch, Mish, Threshold): LESS, GREATER, GREATER_EQUAL, LESS_EQUAL in op_elem (a 1.0 /
# 0.0 mask, broadcast as ADD's; no gradient: no data input) and SELECT, SELECT_V2 in
# op_sel (c ? a : b; a and b get the gradient where they were taken).

COMPARISONS = ('LESS', 'GREATER', 'GREATER_EQUAL', 'LESS_EQUAL', 'EQUAL', 'NOT_EQUAL')


def _sel_options(op, g):
    """No option floats; each operand must be the output's device array [rows, cols] or
    broadcast natively along its rows and / or columns (a scalar, a per-column row,
    a per-row column)."""
    S = _shape4(g, op.outputs[0], op)
    for p, k in enumerate(op.inputs[:3]):
        X = _shape4(g, k, op)
        if any(x not in (1, s) for x, s in zip(X, S)) or \
                (X[:3] != S[:3] and int(np.prod(X[:3])) != 1):
            raise ValueError(
                f'{_where(op)}: operand {p} (tensor {k}, shape {list(g.tensors[k].shape)}) '
                f'broadcasts to the output {list(g.tensors[op.outputs[0]].shape)} along '
                'some leading axes only; utrain selects between operands of the output\'s '
                'shape, scalars and per-last-axis vectors (expand the operand to the '
                'output\'s shape in the model, e.g. torch.where(c, a.expand_as(b), b))')
    if len(op.inputs) != 3:
        raise ValueError(f'{_where(op)}: {len(op.inputs)} inputs; a select takes 3')
    if op.name == 'SELECT' and any(g.tensors[k].shape != g.tensors[op.outputs[0]].shape
                                   for k in op.inputs):
        raise ValueError(f'{_where(op)}: SELECT (v1) of shapes '
                         f'{[list(g.tensors[k].shape) for k in op.inputs]}: utrain takes '
                         'SELECT with all shapes the output\'s (SELECT_V2 broadcasts)')
    return []


SPECS.update({s.name: s for s in [
    OpSpec(name, {}, _elem_options, _none, data_inputs=(), fwd_of=_elem_fwd, bwd=(0, 0))
    for name in COMPARISONS] + [
    # (the mask is read back by the gradient)
    OpSpec(name, {}, _sel_options, lambda op, flags: [op.inputs[0]], data_inputs=(1, 2),
           fwd=(1, 0), bwd=(2, 1))
    for name in ('SELECT', 'SELECT_V2')
]})

# ---- RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR (micro/utrain/op_rsz.py; nearest by whole
# factors is rewritten as copies first: spellings.resize_to_concat): per output row and
# column the input rows lo, hi and the weight f of hi, as TFLite's reference kernels
# compute them in float32 (align_corners, half_pixel_centers; nearest: lo = hi, f = 0)


def _resize_axis(n, m, align, half, nearest):
    f32 = np.float32
    scale = f32(n - 1) / f32(m - 1) if align and m > 1 else f32(n) / f32(m)
    out = []
    for i in range(m):
        if nearest:
            v = (f32(i) + f32(0.5 if half else 0)) * scale
            j = min(int(np.floor(np.abs(v) + f32(0.5)) * np.sign(v)) if align else int(np.floor(v)),
                    n - 1)
            j = max(j, 0) if half else j
            out += [j, j, 0.0]
            continue
        v = (f32(i) + f32(0.5)) * scale - f32(0.5) if half else f32(i) * scale
        lo = max(int(np.floor(v)), 0)
        hi = min(int(np.ceil(v)), n - 1)
        out += [lo, hi, float(f32(v) - f32(lo))]
    return out


def _resize_options(op, g):
    where = _where(op)
    H, W, C = _nhwc(g, op.inputs[0], where, 'the input')
    OH, OW, OC = _nhwc(g, op.outputs[0], where, 'the output')
    size = _const_ints(g, op, 1, 'size')
    if size != [OH, OW] or OC != C:
        raise ValueError(f'{where}: size {size} does not take {[H, W, C]} to {[OH, OW, OC]}')
    align = bool(op.options.get('align_corners'))
    half = bool(op.options.get('half_pixel_centers'))
    nearest = op.name == 'RESIZE_NEAREST_NEIGHBOR'
    if align and half and not nearest:
        raise ValueError(f'{where}: align_corners and half_pixel_centers both set, which '
                         'TFLite refuses too: export it with one of them (Keras Resizing and '
                         'PyTorch interpolate(align_corners=False) write half_pixel_centers)')
    return [H, W, OH, OW] + _resize_axis(H, OH, align, half, nearest) + \
        _resize_axis(W, OW, align, half, nearest)


SPECS.update({s.name: s for s in [
    # linear: the gradient reads nothing; forward and backward hold the column-resized
    # [H*OW, C] and one block product
    OpSpec(name, {}, _resize_options, _none, device_inputs=(0,), fwd=(2, 1), bwd=(2, 2))
    for name in ('RESIZE_BILINEAR', 'RESIZE_NEAREST_NEIGHBOR')
]})

SUPPORTED = sorted(SPECS)
