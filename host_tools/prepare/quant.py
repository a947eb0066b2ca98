"""Int8 models trained as int8 (issue 16), host side: the layer table q8.json and the
int8 .wof that utrain.q8 runs, and the export of trained int8 weights back into the
model with its original scales and layout.

The requantization parameters follow TFLite Micro: QuantizeMultiplier of
s_x * s_W[c] / s_y per output channel for FULLY_CONNECTED / CONV_2D /
DEPTHWISE_CONV_2D, MEAN's s_x / s_y with 1/N folded in as reduce_common.cc does, and
ADD's as add.cc does (inputs shifted left 20 bits, each scaled by s_i / (2 max(s_1, s_2)),
the sum by 2 max(s_1, s_2) / (2^20 s_y)).  A PAD on H/W whose only reader is a
convolution is folded into that convolution's padding (PAD fills with the zero point,
which the kernels' skipped taps equal); RESHAPE is a no-op (its output is its input).
The final SOFTMAX is left out: utrain's loss takes the dequantized logits in float.

Memory (plan()): the layers read their inputs by tensor index (the graph need not be a
chain: a residual ADD reads an earlier tensor); every activation lives in one int8 arena
at an offset planned here from its lifetime (producer to last reader; the tensors of
the trained part to the end, the backward pass reads them), so a tensor's bytes are
reused after its last reader.  The early high-resolution frozen layers can run in row
bands (utrain.bands' schedule, utrain.q8bands), their inner tensors as windows of a few
rows in the arena.  Frozen layers' weights stay in the .wof and are read when the layer
runs (big ones a chunk of output channels at a time, into one scratch buffer); their
per-channel requantization multipliers go to q8.req (int32 multipliers, then shifts, then
the weight scales of the layers that train or pass a gradient),
so q8.json stays small enough to parse on a board."""
from __future__ import annotations

import copy
import functools
import json
import math
import os

import numpy as np

from ..formats.circle_io import Graph, Tensor, atomic_write, read_model
from ..target.device import module
from ..files import wof as hwof
from ..graph.edit import FLOAT_FNS
from ..graph.optable import out_pad
from ..graph.passes import PrepareError

# the layer kinds (q8.json's 'k'): utrain.q8's table, the one the board runs
_Q8 = module('q8')
FC, CONV, DW, MEAN, ADD = _Q8.FC, _Q8.CONV, _Q8.DW, _Q8.MEAN, _Q8.ADD
POOL_MAX, POOL_AVG, CAT, LUT, BIN, SLC, NRM, TCV, EMB = (
    _Q8.PMAX, _Q8.PAVG, _Q8.CAT, _Q8.LUT, _Q8.BIN, _Q8.SLC, _Q8.NRM, _Q8.TCV, _Q8.EMB)
# elementwise ops of one input, tabulated over the 256 int8 inputs (_lut_layer): the
# real function and its derivative (numpy, x real)
_ERF = np.vectorize(math.erf)
UNARY = {
    'LOGISTIC': (lambda x, o: 1 / (1 + np.exp(-x)),
                 lambda x, o: np.exp(-x) / (1 + np.exp(-x)) ** 2),
    'TANH': (lambda x, o: np.tanh(x), lambda x, o: 1 - np.tanh(x) ** 2),
    'HARD_SWISH': (lambda x, o: x * np.clip(x + 3, 0, 6) / 6,
                   lambda x, o: np.where(x < -3, 0.0, np.where(x > 3, 1.0, (2 * x + 3) / 6))),
    'LEAKY_RELU': (lambda x, o: np.where(x > 0, x, x * o.get('alpha', 0.2)),
                   lambda x, o: np.where(x > 0, 1.0, o.get('alpha', 0.2))),
    'ELU': (lambda x, o: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
            lambda x, o: np.where(x > 0, 1.0, np.exp(np.minimum(x, 0)))),
    'NEG': (lambda x, o: -x, lambda x, o: -np.ones_like(x)),
    'GELU': (lambda x, o: 0.5 * x * (1 + _ERF(x / math.sqrt(2))),
             lambda x, o: 0.5 * (1 + _ERF(x / math.sqrt(2))) + x * np.exp(-x * x / 2)
             / math.sqrt(2 * math.pi)),
    # tabulated as TFLite's int8 EXP and LOG (_lut_populate); a non-positive LOG input is
    # log 0 = -inf there, the output's lowest code, its derivative 0
    'EXP': (lambda x, o: np.exp(x), lambda x, o: np.exp(x)),
    'LOG': (lambda x, o: np.log(x), lambda x, o: 1 / np.where(x > 0, x, np.inf)),
    # LayerNormalization's 1 / sqrt(variance + eps); TFLite Micro computes it in fixed
    # point (refusing inputs <= 0): the rounded real value differed from it by one code
    # at one of 7,650 positive inputs over 30 scale pairs; 1 / sqrt(0) and below: the
    # highest code, derivative 0
    'RSQRT': (lambda x, o: np.where(x > 0, 1 / np.sqrt(np.where(x > 0, x, 1.0)), np.inf),
              lambda x, o: -0.5 * np.where(x > 0, x, np.inf) ** -1.5),
    # tabulated as TFLite's int8 SQRT (_tfl_sqrt: float32, truncated; TFLite Micro has
    # none, the converter writes it for tf.math.sqrt); a negative input, which TFLite
    # refuses, is sqrt 0's code, derivative 0; at 0 the chord to the next code, 1 / sqrt(sx)
    'SQRT': (lambda x, o: np.sqrt(np.maximum(x, 0.0)),
             lambda x, o: 0.5 / np.sqrt(np.where(x > 0, x, np.inf))),
}
# the UNARY ops whose int8 kernel is TFLite's LUTPopulate (float32, std::round)
LUT_F32 = ('EXP', 'LOG')
# and the ones TFLite Micro computes by one requantization and a clamp (its integers)
REQUANT = ('RELU', 'RELU6', 'RELU_N1_TO_1', 'QUANTIZE')
KINDS = {'FULLY_CONNECTED': FC, 'CONV_2D': CONV, 'DEPTHWISE_CONV_2D': DW, 'MEAN': MEAN, 'SUM': MEAN,
         'ADD': ADD, 'MAX_POOL_2D': POOL_MAX, 'AVERAGE_POOL_2D': POOL_AVG,
         'CONCATENATION': CAT, 'PAD': CAT, **{k: LUT for k in (*UNARY, *REQUANT, 'DIV')},
         'SUB': BIN, 'MUL': BIN, 'SQUARED_DIFFERENCE': BIN, 'MAXIMUM': BIN, 'MINIMUM': BIN,
         'PRELU': BIN, 'BATCH_MATMUL': BIN, 'SOFTMAX': LUT, 'L2_NORMALIZATION': NRM, 'TRANSPOSE_CONV': TCV, 'GATHER': EMB, **{k: SLC for k in ('SLICE', 'STRIDED_SLICE', 'SPLIT', 'SPLIT_V', 'TRANSPOSE', 'RESIZE_BILINEAR', 'RESIZE_NEAREST_NEIGHBOR')}}
BINARY = ('ADD', 'SUB', 'MUL', 'DIV', 'SQUARED_DIFFERENCE', 'MAXIMUM', 'MINIMUM', 'PRELU',
          'BATCH_MATMUL')   # BIN's 'bo'
SQD_SHIFT = 7               # TFLite's left_shift for int8 SQUARED_DIFFERENCE
RECIP = 14                  # a BIN DIV's gradient table: round(2^RECIP / b) ('ri')
POOLS = (POOL_MAX, POOL_AVG)
TRAINABLE = (FC, CONV, DW)
BACK = (FC, CONV, DW, MEAN, POOL_MAX, POOL_AVG, ADD, CAT, LUT, BIN, SLC, NRM, TCV)   # kinds utrain.q8 passes a gradient through
WEIGHTED = (FC, CONV, DW)
ADD_SHIFT = 20              # TFLite's left_shift for int8 ADD
MIN_ACC = 64                # int32 values of the sums buffer at least: the kernels that chunk by
                            # its length (utrain.q8bin's DIV in quarters, PRELU thirds, ADD halves)
                            # take 16 or more values a chunk (a table of a few values wrote none)
GCHUNK = 1024               # int32 values of a trained layer's weight-gradient chunk (at most)


def quantize_multiplier(x: float):
    """TFLite's QuantizeMultiplier: (m, shift), x = m * 2^(shift - 31), m in [2^30, 2^31)."""
    if x == 0:
        return 0, 0
    f, e = math.frexp(x)
    m = int(round(f * (1 << 31)))
    if m == 1 << 31:
        m //= 2
        e += 1
    if e < -31:
        return 0, 0
    return m, e


def _act_range(act, s, z):
    lo, hi = -128, 127
    if act in ('RELU', 'RELU6', 'RELU_N1_TO_1'):
        lo = max(lo, z + (int(round(-1 / s)) if act == 'RELU_N1_TO_1' else 0))
    if act == 'RELU6':
        hi = min(hi, z + int(np.round(6 / s)))
    elif act == 'RELU_N1_TO_1':
        hi = min(hi, z + int(np.round(1 / s)))
    elif act not in ('NONE', 'RELU', None):
        raise ValueError(f'fused activation {act} is not supported by int8 training')
    return lo, hi


def _q(t):
    if t.dtype != 'int8' or not t.quant or not t.quant.get('scale'):
        raise ValueError(f'tensor {t.name!r} is {t.dtype}'
                         f'{"" if t.quant else " without quantization"}: int8 training needs '
                         'int8 activations and weights with scales (prepare --dequantize trains '
                         'it in float)')
    return [float(v) for v in t.quant['scale']], [int(v) for v in t.quant.get('zero_point') or [0]]


def is_int8(g: Graph) -> bool:
    """True when the model's input and weights are int8 with scales (an int8 model)."""
    t = g.tensors[g.inputs[0]]
    return t.dtype == 'int8' and bool(t.quant and t.quant.get('scale'))


def float_ends(g: Graph) -> bool:
    """Is g a full-int8 model with float input (and output): its float32 input read only
    by a QUANTIZE to int8 (_float_ends)?  prepare trains it as int8 where the int8 path
    takes the settings (settings_refusal), else dequantized as before."""
    return all(g.tensors[k].dtype in ENDS and _entry(g, k) is not None for k in g.inputs)


def int8_input_range(g: Graph):
    """(scale, zero point, lowest, highest value) an int8 model's input holds (a full-int8
    one with float input: its QUANTIZE's output), or None for another model."""
    k = g.inputs[0] if is_int8(g) else (_entry(g).outputs[0] if float_ends(g) else None)
    q = g.tensors[k].quant if k is not None else None
    if not q or not q.get('scale'):
        return None
    s, z = float(q['scale'][0]), int((q.get('zero_point') or [0])[0])
    return s, z, (-128 - z) * s, (127 - z) * s


def input_range_warning(g: Graph, data, x) -> str | None:
    """The warning for samples x (as given) of an int8 model (or a full-int8 one with
    float input) that mostly lie outside the range its int8 input holds, or None: an Edge
    Impulse style model of 0..1 inputs (scale 1/255, zero point -128) given raw 0..255
    pixels trained on them, dequantized and scaled, while TFLite and the exported int8
    model clip every such value to 1; or that span fewer than 16 of its 256 steps (0..1
    samples for a model of raw 0..255 pixels: a few levels each as int8)."""
    r = int8_input_range(g)
    x = np.asarray(x, np.float64)
    if r is None or not x.size:
        return None
    s, z, lo, hi = r
    frac = float(np.mean((x < lo - s) | (x > hi + s)))
    levels = (x.max() - x.min()) / s
    if frac <= 0.01 and 0 < levels < 16 and np.abs(x).max() > 0:
        # the other way round: 0..1 samples for a model of raw 0..255 pixels (a Keras
        # Rescaling(1/255) before the int8 input's QUANTIZE) keep a few levels as int8
        far = 255 if lo >= -s and x.min() >= 0 and x.max() <= 1 and hi > 200 else \
            max(hi, -lo) / np.abs(x).max()
        return (f'warning: {data}: the input values span {x.min():.4g} to {x.max():.4g}, '
                f'{levels:.2g} of the 256 steps {g.path}\'s int8 input holds (scale {s:.4g}, zero '
                f'point {z}: {lo:.4g} to {hi:.4g}), which the model was calibrated on: as int8 '
                'each sample keeps that few values; if x is in other units (0..1 for a model of '
                f'raw 0..255 pixels), give x * {far:.3g}')
    if frac <= 0.01:
        return None
    if -128 <= x.min() < 0 and x.max() <= 127 and np.all(x == np.round(x)):
        # issue 28: the int8 codes the model's int8 input takes (what TFLite's interpreter
        # is given for an int8-input file), read here as real values: the way back is the
        # input's own scale, not a unit's factor
        return (f'warning: {data}: {frac:.0%} of the input values lie outside {lo:.4g} to '
                f'{hi:.4g}, what {g.path}\'s int8 input holds (scale {s:.4g}, zero point {z}), '
                'and all are integers in -128..127: x looks like that input\'s int8 codes, '
                'which utrain reads as real values (it quantizes them itself); give the real '
                f'values, (x - ({z})) * {s:.6g}')
    far = max(x.max() / hi if hi > 0 else 0.0, x.min() / lo if lo < 0 else 0.0)
    if x.min() >= 0 and x.max() <= 255 and np.all(x == np.round(x)):
        far = 255 / hi          # bytes (pixels) for a model of inputs up to hi
    return (f'warning: {data}: {frac:.0%} of the input values lie outside {lo:.4g} to {hi:.4g}, '
            f'what {g.path}\'s int8 input holds (scale {s:.4g}, zero point {z}): the model was '
            'calibrated on inputs in that range, and its int8 form clips the rest; if x is in '
            f'other units (raw 0..255 pixels for a model of 0..1 inputs), give x / {far:.3g}')


def several_refusal(g: Graph) -> str | None:
    """Why int8 model g with several inputs does not train as int8 (its inputs are not
    all int8 at a scale, or int8 after a float input's QUANTIZE: ids beside features), or
    None."""
    if len(g.inputs) < 2:
        return None
    ids = _ids_of(g)
    bad = [rw_name(g, k) for k in g.inputs if not _is_q8(g, k) and k not in ids]
    if bad:
        return ('the int8 path joins a model\'s inputs at their int8 scales, and input'
                f'{"s" if len(bad) > 1 else ""} {", ".join(bad)} '
                f'{"are" if len(bad) > 1 else "is"} not int8 (nor float read by a QUANTIZE)')
    return None


def _ids_of(g: Graph) -> set:
    """The inputs of int8 graph g (several) read only as an int8 embedding's ids
    (_ids_inputs, on rewritten(g)), or an empty set."""
    if not any(op.name == 'GATHER' for op in g.ops):
        return set()
    try:
        return set(rewritten(g).ids_q8) & set(g.inputs)
    except (ValueError, AttributeError):
        return set()


def ids_beside_int8(g: Graph) -> bool:
    """Does g take an int8 embedding's ids (int32) beside int8 inputs (each int8 with a
    scale or float read by a QUANTIZE)?  It trains as int8 (several_refusal: none)."""
    return len(g.inputs) > 1 and bool(_ids_of(g)) and not several_refusal(g)


def _is_q8(g: Graph, k) -> bool:
    """Is input k of g int8 with a scale, or float read only by a QUANTIZE to int8?"""
    t = g.tensors[k]
    return (t.dtype == 'int8' and bool(t.quant and t.quant.get('scale'))) or (
        t.dtype in ENDS and _entry(g, k) is not None)


def rw_name(g: Graph, k) -> str:
    from ..graph.inout import io_name
    return repr(io_name(g, k))


def embedding_entry(g: Graph) -> bool:
    """Does g gather rows of an int8 table (an int8 Keras Embedding: CAST of the float
    ids, GATHER)?  The int8 path has no GATHER; prepare trains such a model dequantized."""
    return any(op.name == 'GATHER' and g.tensors[op.inputs[0]].data is not None
               and g.tensors[op.inputs[0]].dtype == 'int8' for op in g.ops)


def embedding_ids(g: Graph) -> bool:
    """Does int8 model g read its ids (a float32 or int32 input) only by GATHERs of int8
    tables (a Keras Embedding: CAST, Keras 3's negative-id SELECT_V2, folded by
    rewritten()'s embedding_gathers)?  Such a model trains as int8 with its tables frozen
    (utrain.q8emb: the layers above them train); an int8 input's ids (DEQUANTIZE, CAST)
    are not exact and stay on the dequantized path (embedding_ids_note)."""
    if len(g.inputs) != 1 or len(g.outputs) != 1 or not embedding_entry(g):
        return False
    gr = rewritten(g)
    k = gr.inputs[0]
    rs = [op for op in gr.ops if k in op.inputs]
    return gr.tensors[k].dtype == 'float32' and bool(rs) and all(
        op.name == 'GATHER' and op.inputs[1] == k and gr.tensors[op.inputs[0]].dtype == 'int8'
        for op in rs)


def embedding_ids_note(g: Graph) -> str:
    """'' or what an int8 input does to an int8 embedding's ids: TFLite dequantizes it
    and CASTs (truncating), so an id the input's scale does not hold exactly reaches
    the table as another row, which the board's exact float ids never do."""
    t = g.tensors[g.inputs[0]]
    tables = [g.tensors[op.inputs[0]].shape[0] for op in g.ops if op.name == 'GATHER'
              and g.tensors[op.inputs[0]].data is not None]
    if t.dtype != 'int8' or not tables or not (t.quant and t.quant.get('scale')):
        return ''
    s, z = float(t.quant['scale'][0]), int((t.quant.get('zero_point') or [0])[0])
    i = np.arange(max(tables))
    j = np.trunc((np.clip(np.round(i / s) + z, -128, 127) - z) * np.float32(s)).astype(int)
    bad = np.flatnonzero(i != j)
    if not bad.size:
        return ''
    return (f'; its int8 input (scale {s:g}, zero point {z}) reads id {bad[0]} as '
            f'{j[bad[0]]} ({bad.size} of {i.size} ids), so the file gives other rows than '
            'the ids the board trains on: export the model with a float32 or int32 input '
            '(the converter\'s inference_input_type)')


LOSSES = ('scce', 'cce', 'mse', 'mae', 'bce')     # the int8 path's (utrain.q8train)


def softmax_end(g: Graph, name='SOFTMAX') -> bool:
    """Does g's output come from a SOFTMAX (name: that op; a float output's DEQUANTIZE,
    shape ops between)?"""
    prod = {k: op for op in g.ops for k in op.outputs}
    op = prod.get(g.outputs[0]) if g.outputs else None
    while op is not None and op.name in ('DEQUANTIZE', 'RESHAPE', 'SQUEEZE'):
        op = prod.get(op.inputs[0])
    return op is not None and op.name == name


def sigmoid_loss(g: Graph, s: dict) -> bool:
    """Does the bce of settings s take graph g's final LOGISTIC as its own (the int8 net
    ends at the logits, utrain.q8reg's bce applies the sigmoid in floats), as scce and cce
    take a final SOFTMAX?"""
    return s.get('loss') == 'bce' and softmax_end(g, 'LOGISTIC')


def _last(g: Graph, ops) -> bool:
    """Is ops' last op the loss's (layers() leaves it out): a SOFTMAX, or a LOGISTIC whose
    bce takes it (g.sigmoid_loss, set by prepare_q8 and export from the run's loss)?"""
    return bool(ops) and (ops[-1].name == 'SOFTMAX' or ops[-1].name == 'LOGISTIC'
                          and getattr(g, 'sigmoid_loss', False))


def loss_refusal(s: dict, g: Graph = None) -> str | None:
    """Why the int8 path does not train model g (None: any) with s's loss, or None."""
    if s['loss'] not in LOSSES:
        return (f'int8 training takes --loss {", ".join(LOSSES)}, and this run\'s loss is '
                f'{s["loss"]}')
    if s['loss'] in ('mse', 'mae', 'bce') and g is not None and softmax_end(g):
        return (f'--loss {s["loss"]} on a model ending in SOFTMAX: the int8 path leaves the '
                'final SOFTMAX to its softmax losses (scce, cce); --dequantize trains it in '
                f'float32 with {s["loss"]} on the probabilities')
    if s['loss'] == 'bce' and g is not None and not softmax_end(g, 'LOGISTIC') and \
            not s.get('from_logits'):
        return ('--loss bce on outputs that are not a final sigmoid\'s (LOGISTIC): the int8 '
                'path takes bce on the logits, a model ending in a sigmoid or --from-logits '
                'on one that gives logits; --dequantize trains it in float32')
    from ..files.dataset import per_step
    if s['loss'] in ('scce', 'cce') and g is not None and softmax_end(g) and \
            per_step(g.tensors[g.outputs[0]].shape):
        return ('--loss cce on rows of probabilities (a class a step): the int8 path\'s softmax '
                'cross-entropy takes all the outputs as one row; --dequantize trains it in '
                'float32 a row a step')
    return None


def settings_refusal(s: dict, g: Graph = None) -> str | None:
    """Why the int8 path does not train (model g, None: any) with settings s (prepare's
    resolved loss, optimizer, schedule), or None."""
    if s.get('weight_decay') or s.get('schedule', 'constant') != 'constant' or s.get('warmup'):
        return ('int8 training has no weight decay or learning-rate schedule; --dequantize '
                'trains the model in float32 with them')
    why = loss_refusal(s, g)
    if why and s['loss'] in LOSSES:
        return why
    if (why or s['optimizer'] not in ('sgd', 'adam')
            or (s['momentum'] and s['optimizer'] != 'sgd')):
        return ('int8 training takes --loss scce, cce, mse, mae or bce, --optimizer sgd (with or without '
                'momentum) or adam; --dequantize trains it in float with '
                f'{s["loss"]}/{s["optimizer"]}' + (f' momentum {s["momentum"]}' if s['momentum'] else ''))
    return None


def _entry(g: Graph, k=None):
    """The QUANTIZE that alone reads float input k (the only input where None) and writes
    an int8 tensor with a scale, or None."""
    if k is None:
        if len(g.inputs) != 1:
            return None
        k = g.inputs[0]
    r = [op for op in g.ops if k in op.inputs]
    if len(r) != 1 or r[0].name != 'QUANTIZE':
        return None
    t = g.tensors[r[0].outputs[0]]
    return r[0] if t.dtype == 'int8' and t.quant and t.quant.get('scale') else None


# the ends a full-int8 file may have around its int8 middle: float32 (the converter's
# default), uint8 (inference_input_type / inference_output_type tf.uint8: a QUANTIZE
# between uint8 and int8, as Edge Impulse's uint8 models have)
ENDS = ('float32', 'uint8')


def _exit(g: Graph, op) -> bool:
    """Is op an output end of an int8 middle: a DEQUANTIZE of int8 to float32, or a
    QUANTIZE of int8 to uint8?"""
    return g.tensors[op.inputs[0]].dtype == 'int8' and (
        op.name == 'DEQUANTIZE' or op.name == 'QUANTIZE' and g.tensors[op.outputs[0]].dtype == 'uint8')


def _float_ends(g: Graph):
    """A full-int8 model with float input and output (the converter's default without
    inference_input_type: QUANTIZE first, DEQUANTIZE last) as its int8 middle: the
    QUANTIZE's output is the input (the board quantizes samples at its scale, as it
    does an int8 model's) and the DEQUANTIZE's input the output (the loss dequantizes
    the logits); the file keeps both ops, export writes into its tensors (_ends_back).
    Either end alone too (inference_input_type int8 with a float output, or the other
    way); each input and output of a model with several."""
    from ..graph.edit import remove_op
    from ..graph.inout import io_name
    for i, k in enumerate(list(g.inputs)):
        op = _entry(g, k) if g.tensors[k].dtype in ENDS else None
        if op is not None:
            g.inputs[i] = op.outputs[0]
            # (its maker's name and place: data files and --output name the float end)
            g.tensors[op.outputs[0]].sig = g.tensors[k].sig or (i, io_name(g, k))
            remove_op(g, op)
    prod = {k: op for op in g.ops for k in op.outputs}
    for i, k in enumerate(list(g.outputs)):
        op = prod.get(k)
        if op is not None and _exit(g, op) and not any(k in o.inputs for o in g.ops):
            g.outputs[i] = op.inputs[0]
            g.tensors[op.inputs[0]].sig = g.tensors[k].sig or (i, io_name(g, k))
            remove_op(g, op)


def _softmax_last(g: Graph) -> bool:
    """A final SOFTMAX with shape ops after it (RESHAPE, SQUEEZE, EXPAND_DIMS that keep
    the last axis, the one the SOFTMAX normalises: a Keras Reshape after its Softmax) goes
    after them: they reshape the logits, and the SOFTMAX, now the graph's last op, is the
    loss's (layers() leaves it out), as it is where nothing follows it (was refused: only
    dequantized).  Same output; export writes the ops in this order.  Whether it moved."""
    from ..graph.edit import new_tensor, move_after
    prod = {k: op for op in g.ops for k in op.outputs}
    reads = _readers(g.ops)
    k = g.outputs[0] if len(g.outputs) == 1 else None
    chain = []
    while k in prod and prod[k].name in ALIASES and len(reads.get(k, ())) == bool(chain):
        chain.insert(0, prod[k])
        k = prod[k].inputs[0]
    sm = prod.get(k)
    if not chain or sm is None or sm.name != 'SOFTMAX' or len(reads.get(k, ())) != 1:
        return False
    x, y = sm.inputs[0], g.outputs[0]
    if any(g.tensors[op.outputs[0]].shape[-1:] != g.tensors[x].shape[-1:] for op in chain):
        return False        # (a softmax over other rows: left where it is, refused)
    chain[0].inputs[0] = x
    for op in chain[:-1]:       # (the logits' scale: the shape ops' outputs are aliases)
        t = g.tensors[op.outputs[0]]
        t.dtype, t.quant = g.tensors[x].dtype, dict(g.tensors[x].quant or {}) or None
    chain[-1].outputs[0] = new_tensor(g, g.tensors[y].name + '/logits', g.tensors[y].shape,
                                      like=x)
    sm.inputs, sm.outputs = [chain[-1].outputs[0]], [y]
    move_after(g, sm, chain[-1])
    return True


def rewritten(g: Graph) -> Graph:
    """A copy of int8 graph g with the exporter-output passes that apply to int8
    (rewrite.PASSES: Keras 3's run-time batch in Reshape folded, a global REDUCE_MAX as a
    MAX_POOL_2D), as the float path runs them, float input and output ends dropped
    (_float_ends); tensors keep their indices (new ones are
    appended), so the trained weights go back into the same tensors, and ops keep their
    number in the user's file (Operator.number, g.nfile: the file's op count) for
    --train, --ranks and the messages.  Every reader of an int8 model (prepare, export,
    inspect, --select's pricing) takes the table of this graph."""
    import copy
    from ..graph.rewrite import rewrite
    from ..graph.shapes import check_window_shapes
    from ..plan.runplan import one_input_output
    if getattr(g, 'q8_rewritten', False):
        return g
    g = copy.deepcopy(g)
    g.nfile = getattr(g, 'nfile', None) or len(g.ops)
    _float_ends(g)
    _softmax_last(g)
    # (an int8 model prepare calibrated from a float one, int8.circle: its rewrites ran
    # on the float graph; again, they copied an unrolled RNN's recurrent weight a step,
    # its steps' zero biases apart: 'trained.wof holds 184 buffers, the model has 190')
    g.rewrites = rewrite(g, int8=True) if not getattr(g, 'calibrated', False) else {}
    _trailing_means(g)
    _hoist_input_transpose(g)
    check_window_shapes(g)
    g.q8_rewritten = True
    # an int8 file's logits and trained layers' output ranges follow training (meta)
    g.follow_logits = 1
    _widen_logits(g)
    _ids_inputs(g)          # (ids beside int8 inputs: their bytes in the joined input)
    one_input_output(g)     # (several: the trained output's ops, the inputs joined)
    return g


def _trailing_means(g: Graph) -> int:
    """An int8 MEAN or SUM over axes after others that are not 1 (Keras's
    LayerNormalization on a sequence [1, T, C]: its mean and variance over C; a mean over
    a feature map's channels) reads its input through a TRANSPOSE that puts the reduced
    axes first (an SLC layer: a copy, the same scale and zero point), then reduces those
    leading axes as _mean_layer takes them: the output's values are in the same order, so
    the output tensor stays as it is.  Such a model had trained dequantized, in float.
    Returns how many."""
    from ..formats.circle_io import OP_CODES, Operator
    from ..graph.edit import new_tensor, renumber
    done = 0
    for op in list(g.ops):
        if op.name not in ('MEAN', 'SUM') or len(op.inputs) < 2 or \
                g.tensors[op.inputs[1]].data is None or g.tensors[op.inputs[0]].dtype != 'int8':
            continue
        x = op.inputs[0]
        shape = [int(v) for v in g.tensors[x].shape]
        axes = {int(a) % len(shape) for a in np.asarray(g.tensors[op.inputs[1]].data).ravel()}
        keep = [i for i, v in enumerate(shape) if v != 1]
        red = [i for i in keep if i in axes]
        if not red or keep[:len(red)] == red:
            continue
        perm = [i for i, v in enumerate(shape) if v == 1] + red + [i for i in keep if i not in axes]
        name = g.tensors[x].name + f'/op{op.number}_reduced_first'
        t = new_tensor(g, name, [shape[i] for i in perm], like=x)
        pk = new_tensor(g, name + '_perm', [len(perm)], np.array(perm, np.int32))
        ak = new_tensor(g, name + '_axes', [len(red)], np.array([perm.index(i) for i in red], np.int32))
        tr = Operator(-1, OP_CODES['TRANSPOSE'], 'TRANSPOSE', [x, pk], [t], {}, src=op.src)
        op.inputs = [t, ak] + list(op.inputs[2:])
        g.ops.insert(g.ops.index(op), tr)
        renumber(g)
        done += 1
    return done


def _hoist_input_transpose(g: Graph):
    """A TRANSPOSE that reads the int8 model input and nothing else (a PyTorch NCHW net
    through tico: NCHW -> NHWC first, the same scale and zero point on both sides) leaves
    the graph the board runs: the input becomes its output, so the board neither runs nor
    plans it; the host lays the samples out so (g.input_perm: prepare's read_data, the
    summary's input_perm, as the float path's transposes.hoist_input_transpose).  export puts
    it back (_transpose_back): the written model takes the user's layout."""
    g.input_perm = g.input_transpose = None
    if len(g.inputs) != 1:
        return None
    x = g.inputs[0]
    rs = [op for op in g.ops if x in op.inputs]
    if len(rs) != 1 or rs[0].name != 'TRANSPOSE' or rs[0].inputs[0] != x or \
            rs[0].outputs[0] in g.outputs or g.tensors[rs[0].inputs[1]].data is None or \
            _unit_transpose(g, rs[0]):      # (that one is an alias already: no cost)
        return None
    t = rs[0]
    try:
        if _q(g.tensors[x]) != _q(g.tensors[t.outputs[0]]):
            return None         # (a TRANSPOSE copies bytes: a scale change is not ours to drop)
    except ValueError:
        return None
    from ..graph.transposes import hoist_input_transpose
    g.input_perm = hoist_input_transpose(g)
    if g.input_perm is not None:
        g.input_perm = [int(v) for v in g.input_perm]
        g.input_transpose = (x, t)
    return g.input_perm


def _transpose_back(g: Graph) -> None:
    """export: the input TRANSPOSE _hoist_input_transpose took out goes back in front, the
    model's input its input again (the tensors kept their indices)."""
    x, t = getattr(g, 'input_transpose', None) or (None, None)
    if t is not None and g.inputs == [t.outputs[0]]:
        g.ops.insert(0, t)
        for i, op in enumerate(g.ops):
            op.index = i
        g.inputs = [x]


def _ids_inputs(g: Graph) -> set:
    """Of a graph with several inputs, those read only as ids by GATHERs of int8 tables
    of up to 65,536 rows (an int32 Keras Embedding input beside int8 ones, made float32 by
    embeddings.embedding_gathers): typed int8 at scale 1, zero point -128 (each byte of the
    id as utrain.q8emb reads it), so join_inputs joins them as int8 parts; g.ids_q8 their
    tensors (export types them back), g.ids_ib the bytes an id (1: every table of up to
    256 rows, else 2, low byte first: join_inputs gives such a part 2 bytes a value, one
    id format for the input as meta's 'ib'; before session 14 a larger table beside other
    inputs trained dequantized)."""
    g.ids_q8, g.ids_ib = set(), 1
    if len(g.inputs) < 2:
        return g.ids_q8
    for k in g.inputs:
        t, rs = g.tensors[k], _readers(g.ops).get(k, [])
        if t.dtype == 'float32' and rs and all(
                op.name == 'GATHER' and op.inputs[1] == k and len(g.tensors[op.inputs[0]].shape) == 2
                and g.tensors[op.inputs[0]].dtype == 'int8' and g.tensors[op.inputs[0]].data is not None
                and g.tensors[op.inputs[0]].shape[0] <= 65536 for op in rs):
            t.dtype, t.quant = 'int8', {'scale': [1.0], 'zero_point': [-128]}
            g.ids_q8.add(k)
            if max(g.tensors[op.inputs[0]].shape[0] for op in rs) > 256:
                g.ids_ib = 2
    return g.ids_q8


# an int8 model's logits narrower than +-NARROW_LOGITS are widened to +-WIDE_LOGITS (a
# float model calibrated as int8 starts at +-fromfloat.LOGITS: never narrow)
NARROW_LOGITS, WIDE_LOGITS = 2.0, 4.0
# and logits with less than ONE_SIDED of their range on one side of 0 get as much room
# on that side as on the other (zero point 0)
ONE_SIDED = 1 / 8


def _widen_logits(g: Graph):
    """Logits whose int8 range is narrower than +-NARROW_LOGITS (a converter calibrated
    them on a model that had barely learnt: a Keras CNN's at +-0.24) become +-WIDE_LOGITS
    (zero point 0; the layer's multipliers follow from the scale) and follow training
    (meta: q8range): at +-0.24 a softmax can never grow confident and the gradient stops
    where they clip; logits on one side of 0 get room on the other (ONE_SIDED).  export
    writes the new scale and zero point into the model."""
    if getattr(g, 'regression', False):
        # (a regression's output is no logits: its range is the targets' as the converter
        # calibrated it, and it follows training as logits do; made +-4 it was 0.031 a
        # step for targets within +-0.001, and a VLP net's 0..4145 mm, on one side of 0,
        # was made +-4145: 32 mm a step where the file had 16)
        return
    prod = {k: op for op in g.ops for k in op.outputs}
    t = g.outputs[0] if g.outputs else None
    op = prod.get(t)
    if op is not None and _last(g, [op]):
        t = op.inputs[0]
    chain = [t]
    while prod.get(t) is not None and (prod[t].name in ALIASES or _unit_transpose(g, prod[t])):
        t = prod[t].inputs[0]
        chain.append(t)
    q = g.tensors[t].quant if t is not None else None
    if not q or not q.get('scale') or g.tensors[t].dtype != 'int8' or \
            prod.get(t) is None or prod[t].name not in ('FULLY_CONNECTED', 'CONV_2D'):
        return
    s = float(q['scale'][0])
    z = int((q.get('zero_point') or [0])[0])
    # logits of any width follow training (q8range, rewritten()): the converter's range
    # is the data it was calibrated on; a fine-tuning step that takes them past it clips
    # them, and a clipped logit's gradient is 0 (a Keras MLP on 0..255 pixels, its logits
    # at +-300 before, clipped all five after its first SGD step and never trained again)
    # (narrow: its span, not its sides: a Keras Conv1D's logits at [-136, 0], zero point
    # 127, all about -100, are wide; taken as narrow they became +-4 and all clipped)
    lo, hi = s * (-128 - z), s * (127 - z)
    if 255 * s >= 2 * NARROW_LOGITS:
        # wide, but on one side of 0 (a Keras Conv1D's at [-136, 0], zero point 127): the
        # range doubles around 0 as training grows it (q8range), so a logit past 0 clips
        # at every width, its gradient is 0, and scce's logits move freely (a shift of
        # all is the same softmax): under Adam they crossed 0 in a few epochs and the run
        # stayed at chance with all of them clipped.  Both sides get the larger's room
        # (a fused RELU's side is the activation's: never past it)
        if min(-lo, hi) >= ONE_SIDED * (hi - lo) or \
                prod[t].options.get('fused_activation_function', 'NONE') != 'NONE':
            return
        s2, z2 = 2 * max(-lo, hi) / 255, 0
    else:
        s2 = 2 * WIDE_LOGITS / 255
        mid = s * (-0.5 - z)                # (the middle of its range, kept where it is not 0)
        z2 = 0 if abs(mid) <= WIDE_LOGITS - NARROW_LOGITS else int(np.clip(round(-0.5 - mid / s2), -128, 127))
    g.logits_quant = {k: g.tensors[k].quant for k in chain}     # (regressed: put back)
    for k in chain:
        g.tensors[k].quant = dict(g.tensors[k].quant, scale=[s2], zero_point=[z2])
    g.narrow_logits = 1


def regressed(g: Graph, s: dict) -> Graph:
    """g for settings s: with a regression's loss (mse, mae) its output is no logits
    (g.regression: _widen_logits leaves it as the file has it, and puts back what it
    widened where g was rewritten before the loss was known); g itself otherwise."""
    if s.get('loss') not in ('mse', 'mae') or getattr(g, 'regression', False):
        return g
    g = copy.deepcopy(g)
    g.regression = True
    for k, q in (getattr(g, 'logits_quant', None) or {}).items():
        g.tensors[k].quant = q
    g.logits_quant, g.narrow_logits = None, 0
    return g


def numbered(g: Graph, run) -> Graph:
    """g (an int8 model a run wrote, read back) as the run's prepare.json (prepare_q8's
    summary, a dict; None: as read) says: 'op_numbers', the number of each op in the
    user's file, and 'file_ops', that file's op count; 'sigmoid_loss', the final LOGISTIC
    is the bce loss's (layers() leaves it out)."""
    run = run or {}
    ops, n = run.get('op_numbers'), run.get('file_ops')
    if run.get('sigmoid_loss'):
        g.sigmoid_loss = True
    if run.get('regression'):
        g.regression = True
    if ops and len(ops) == len(g.ops):
        for op, k in zip(g.ops, ops):
            op.src = int(k)
        g.nfile = int(n or len(g.ops))
    return g


def _ops_on(g: Graph, train, ranks):
    """--train and --ranks {op: rank}, ops numbered as in the user's file, as the
    rewritten graph g's op indices: (set of indices, {index: rank})."""
    from ..graph.passes import parse_train
    on = parse_train(train, getattr(g, 'nfile', None) or len(g.ops)) | set(ranks)
    return ({op.index for op in g.ops if op.number in on},
            {op.index: ranks[op.number] for op in g.ops if op.number in ranks})


# ops whose int8 output is their input's bytes (a shape, the same scale): no layer
ALIASES = ('RESHAPE', 'SQUEEZE', 'EXPAND_DIMS')


def _folds(g: Graph, ops):
    """{PAD output tensor: (PAD input tensor, pad top, bottom, left, right)} of the PADs
    folded into their one reader's padding (the others are CAT layers: _cat_layer), and
    {RESHAPE output: input}."""
    readers = _readers(ops)
    pads, alias = {}, {}
    for op in ops:
        if op.name in ALIASES or _unit_transpose(g, op):
            if _q(g.tensors[op.inputs[0]]) != _q(g.tensors[op.outputs[0]]):
                raise ValueError(f'{g.path}: {op.name} op {op.number} changes the scale or zero '
                                 'point; int8 training reads its output as its input\'s bytes')
            alias[op.outputs[0]] = op.inputs[0]
        elif op.name == 'PAD':
            x, y = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
            p = g.tensors[op.inputs[1]].data
            r = readers.get(op.outputs[0], [])
            ok = (p is not None and len(x.shape) == 4 and len(op.inputs) == 2
                  and len(r) == 1 and r[0].name in ('CONV_2D', 'DEPTHWISE_CONV_2D')
                  and op.outputs[0] not in g.outputs and _q(x) == _q(y))
            if ok:
                p = [int(v) for v in np.asarray(p).reshape(-1)]
                ok = p[0] == p[1] == p[6] == p[7] == 0 and min(p) >= 0
            if ok:              # (else a CAT layer of its own)
                pads[op.outputs[0]] = (op.inputs[0], p[2], p[3], p[4], p[5])
    return pads, alias


def _unit_transpose(g: Graph, op) -> bool:
    """Is op a TRANSPOSE that moves only axes of size 1 (the non-unit axes keep their
    order: [1, T, C] -> [T, 1, C], a recurrent layer's time-major input): its output is
    its input's bytes, an alias as a RESHAPE?"""
    if op.name != 'TRANSPOSE' or len(op.inputs) < 2 or g.tensors[op.inputs[1]].data is None:
        return False
    shape = list(g.tensors[op.inputs[0]].shape)
    perm = [int(v) % len(shape) for v in np.asarray(g.tensors[op.inputs[1]].data).reshape(-1)]
    keep = [a for a in perm if shape[a] != 1]
    return sorted(perm) == list(range(len(shape))) and keep == sorted(keep)


def zero_bias(g: Graph, op, sx: float, sw: list, fb=None) -> int:
    """Give a weighted op without a bias tensor (Keras's use_bias=False, a converter
    that drops an all-zero bias) a zero int32 bias at TFLite's bias scale sx * sw, zero
    point 0: it computes what the op did, trains like any bias and goes into the exported
    model (the same tensor index every time the file is read).  Returns its index.
    fb: the op's float32 bias tensor (a PyTorch model quantized to int8 and converted by
    tico, which quantizes biases of uint8 and int16 inputs only): its values rounded to
    int32 at that scale, as TFLite's converter quantizes a bias."""
    w = g.tensors[op.inputs[1]]
    n = int(w.shape[0] if op.name != 'DEPTHWISE_CONV_2D' else w.shape[-1])
    # (a per-tensor weight's bias: one scale, as TFLite's converter writes it; XNNPack
    # refuses an FC whose bias has a scale a channel and its weight one)
    scale = [sx * s for s in sw]
    name = f'{w.name}/zero_bias' if fb is None else f'{fb.name}/int32'
    data = np.zeros(n, np.int32)
    if fb is not None:
        b = np.asarray(fb.data, np.float64).reshape(-1)
        if b.size != n:
            raise ValueError(f'{g.path}: float bias {fb.name!r} of op {op.number} has {b.size} '
                             f'values for {n} output channels')
        data = np.clip(np.round(b / np.asarray(scale)), -2**31, 2**31 - 1).astype(np.int32)
    # one for the ops that share a weight tensor and read inputs at one scale (Keras's
    # TimeDistributed, an unrolled layer's input steps): one bias trains (utrain.q8share)
    k = next((t.index for t in g.tensors if t.name == name and t.quant['scale'] == scale), None)
    if k is None:
        k = len(g.tensors)
        g.tensors.append(Tensor(k, name, [n], 'int32', data, -1,
                                {'scale': scale, 'zero_point': [0] * len(scale),
                                 'quantized_dimension': 0}))
    if len(op.inputs) < 3:
        op.inputs.append(k)
    else:
        op.inputs[2] = k
    return k


def op_refusal(g: Graph, train='none'):
    """'op N (NAME) is not supported by int8 training' where int8 training has no kernel
    for an op of int8 graph g (layers() refuses it; train: as --train), or does not train
    the weights of one --train names (frozen_named); else None."""
    import re
    try:
        layers(rewritten(g), train)
    except ValueError as e:
        m = re.search(r'op \d+ \(\w+\) is not supported by int8 training', str(e))
        if m:
            return m.group(0)
        # a refusal of an op's form that says the float path trains it (a MEAN over the
        # channels, a SOFTMAX at another scale, ...): that advice said once, by the caller
        why = str(e)
        why = why[len(g.path) + 2:] if why.startswith(f'{g.path}: ') else why
        return without_dequantize(why) if 'dequantize' in why else None
    return frozen_named(g, train)


def without_dequantize(why: str) -> str:
    """Refusal why without its '(prepare --dequantize trains it in float)' or '; --dequantize
    trains it in float32 ...' advice: for a caller that trains it so itself or says what to
    do instead (a float model's --int8, or prepare's own int8 choice falling back)."""
    import re
    why = re.sub(r'[;,] *--dequantize trains (it|the model) in float(32)?[^;()]*', '', why)
    return re.sub(r'[;,]? *(or )?\(?(int8 training; )?prepare --dequantize trains it in '
                  r'float(32)?\)?', '', why)


def frozen_named(g: Graph, train) -> str | None:
    """What int8 training leaves frozen among the ops --train names (a TRANSPOSE_CONV's
    weights train only where a layer below it trains: utrain.q8tcv), or None."""
    gr = rewritten(g)
    on, _ = _ops_on(gr, train, {})
    ls = layers(gr, train)
    ops = [gr.ops[d['op']] for d in ls if d['k'] == TCV and d['op'] in on and not d.get('xt')]
    emb = [gr.ops[d['op']].number for d in ls if d['k'] == EMB and d['op'] in on
           and not d.get('eg')]
    out = [f'op{"s" * (len(emb) > 1)} {", ".join(map(str, emb))} (GATHER of an int8 table, an '
           'embedding): int8 training copies its rows as TFLite Micro does and keeps the table '
           'frozen (a --train that names it trains it dequantized)'] if emb else []
    if ops:
        out.append(f'op{"s" * (len(ops) > 1)} {", ".join(str(op.number) for op in ops)} '
                   '(TRANSPOSE_CONV): int8 training trains its weights only where a layer below '
                   'it trains (its gradient comes from the backward pass)')
    return '; '.join(out) or None


def layers(g: Graph, train='last:1', ranks=None):
    """The q8 layer table of graph g: one dict per op, ending before a final SOFTMAX
    (PAD and RESHAPE make none: folded / aliased).  Each reads tensors 'in' and writes
    tensor 'out'.  train: as prepare's --train ('all', 'none', 'last:N': the last N
    operators of any kind, or op indices); the FULLY_CONNECTED / CONV_2D /
    DEPTHWISE_CONV_2D ops among them train, and every op after the first trained one
    passes its gradient back ('back'; FC, CONV_2D, DEPTHWISE_CONV_2D, MEAN, MAX_POOL_2D,
    AVERAGE_POOL_2D: not ADD).  A pool's 'g' is a convolution's geometry with I = O = C
    (H, W, C, C, KH, KW, stride h, w, pad top, left, OH, OW, 1, 1).
    ranks {op index: rank code} (passes.RANKS, as --ranks): those ops train too, a
    rank's output channels only ('tw': [lo, hi], passes.channel_range, as the float
    path; its biases the same window) or the bias alone ('tw': [0, 0]).  A layer of the
    backward pass whose output no backward step reads keeps a 1-bit mask of it ('mask')."""
    ops = list(g.ops)
    if _last(g, ops):
        ops = ops[:-1]
    pads, alias = _folds(g, ops)

    def src(k):
        while k in alias:
            k = alias[k]
        return k
    _one_bias(g, ops)
    isl, dvi, sel = _islands(g, ops), _div_islands(g, ops), _select_islands(g, ops)
    inside = {id(o) for v in isl.values() for o in v[1:]} | {
        id(o) for v in dvi.values() for o in v if o.name != 'DIV'} | {
        id(o) for v in sel.values() for o in v[1][:-1]}
    out = []
    for op in ops:
        if op.outputs[0] in alias or op.outputs[0] in pads or id(op) in inside:
            continue
        if op.index in isl:
            out.append(_island_layer(g, isl[op.index], src))
            continue
        if op.index in sel:
            out.append(_select_layer(g, *sel[op.index], src))
            continue
        if op.index in dvi:
            op = _div_island(g, *dvi[op.index])
        if op.name == 'DEQUANTIZE':
            _island_refusal(g, op)
        k = KINDS.get(op.name)
        if op.name == 'CUSTOM':     # (a Flex op: no runtime on a board runs it)
            from ..graph.passes import custom_hint
            raise ValueError(f'{g.path}: op {op.number} is CUSTOM '
                             f'({op.options.get("custom_code") or "no custom code"}), which '
                             f'utrain cannot run or train through: {custom_hint(op)}')
        if k is None:
            raise ValueError(f'{g.path}: op {op.number} ({op.name}) is not supported by int8 '
                             'training: export the model with that layer made of ops it supports '
                             '(FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, MEAN, SUM, ADD, '
                             'SUB, MUL, DIV, SQUARED_DIFFERENCE, MAXIMUM, MINIMUM, PRELU, '
                             'BATCH_MATMUL, SOFTMAX (inside the graph too), L2_NORMALIZATION, TRANSPOSE_CONV (frozen), '
                             'MAX_POOL_2D, AVERAGE_POOL_2D, '
                             'CONCATENATION, PAD, SLICE, STRIDED_SLICE, SPLIT, SPLIT_V, TRANSPOSE, '
                             'RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR, '
                             'RESHAPE, SQUEEZE, EXPAND_DIMS, '
                             + ', '.join((*UNARY, *REQUANT)) + '; float ops of one int8 tensor '
                             'between a DEQUANTIZE and a QUANTIZE; a SELECT_V2 whose mask and '
                             'values are int8 comparisons, MUL, ADD and SUB of one int8 tensor '
                             'and scalars)')
        if k == SLC and op.name.startswith('RESIZE'):
            out.append(_resize_layer(g, op, src))
            continue
        if k == SLC:
            out += _slice_layers(g, op, src)
            continue
        if k == EMB:
            out.append(_emb_layer(g, op))
            continue
        if k == ADD and not _plain_add(g, op) or op.name == 'DIV' and not _scalar(g, op.inputs[1]):
            k = BIN
        xi = op.inputs[2] if k == TCV else op.inputs[0]     # (TRANSPOSE_CONV: shape, w, x)
        x, y = g.tensors[xi], g.tensors[op.outputs[0]]
        pad = pads.get(xi) if k != TCV else None
        xin = src(pad[0] if pad else xi)
        sx, zx = _q(x)
        sy, zy = _q(y)
        d = {'k': k, 'op': op.index, 'zx': zx[0], 'zy': zy[0], 'sx': sx[0], 'sy': sy[0],
             'nout': int(np.prod(y.shape)), 'in': [xin], 'out': op.outputs[0]}
        lo, hi = _act_range(op.options.get('fused_activation_function', 'NONE'), sy[0], zy[0])
        d['lo'], d['hi'] = lo, hi
        if k == ADD:
            _add_layer(g, op, d, x, y, xin, src(op.inputs[1]))
        elif k == BIN:
            _bin_layer(g, op, d, src)
        elif k == CAT:
            _cat_layer(g, op, d, y, src)
        elif k == LUT:
            _lut_layer(g, op, d)
        elif k == NRM:
            _l2_layer(g, op, d, x)
        elif k == TCV:
            _tconv_layer(g, op, d, x, y)
        elif k in POOLS:
            _pool_layer(g, op, d, x, y)
        elif k == MEAN:
            _mean_layer(g, op, d, x)
        else:
            _weighted_layer(g, op, d, x, pad)
        out.append(d)
    _check_reads(g, out, src(g.inputs[0]))
    _mark_trained(g, out, train, ranks or {})
    _tabulate_frozen(out)
    return out


def _tabulate_frozen(ls):
    """layers(): a frozen ADD, SUB or MUL of an activation and one int8 constant (a Keras
    Rescaling layer's x * 1/127.5, then - 1, as TFLite's converter writes it: two ops
    before the first conv of a Teachable Machine MobileNet) as a LUT layer: a function of
    the int8 input alone, tabulated with TFLite Micro's integers (add.cc / sub.cc:
    each side << 20 times its multiplier, the sum's requantized; mul.cc: the product's),
    the table utrain.q8bin's forward would compute.  A LUT runs in row bands (a BIN does
    not), so the band group can start at the sample.  Below the first trained layer
    only: no gradient passes it."""
    first = module('q8load').lowest(ls)
    for i in range(first):
        d = ls[i]
        if d['k'] != BIN or d.get('bo') not in (0, 1, 2) or d.get('kp') != 1 or len(
                d.get('kc', ())) != 1 or d.get('back') or d.get('train'):
            continue
        z1, z2 = d['zi']
        c = d['kc'][0] - z2
        m, e = d['mul'], d['shf']
        t = []
        for x in range(-128, 128):
            if d['bo'] == 2:
                v = mbqm((x - z1) * c, m[0], e[0])
            else:
                a, b = mbqm((x - z1) << ADD_SHIFT, m[0], e[0]), mbqm(c << ADD_SHIFT, m[1], e[1])
                v = mbqm(a + b if d['bo'] == 0 else a - b, m[2], e[2])
            t.append(min(d['hi'], max(d['lo'], v + d['zy'])))
        ls[i] = {k: d[k] for k in ('op', 'zx', 'zy', 'sx', 'sy', 'nout', 'out', 'lo', 'hi')
                 if k in d}
        ls[i].update({'k': LUT, 'in': d['in'][:1], 't': t, 'dt': [0] * 256})


# float32 ops a converter leaves between a DEQUANTIZE and a QUANTIZE (ops it has no int8
# kernel for: Keras's -x is DEQUANTIZE, NEG, QUANTIZE): numpy of float32 arrays, as
# TFLite Micro's float kernels compute them
_F32 = FLOAT_FNS           # float ops an island tabulates (numpy, as the host computes them)
# float ops a converter leaves in float32 (TFLite has no int8 kernel for them; TFLite
# Micro none for POW and ATAN2) that neither path trains: what to do instead (_island_refusal)
_NO_PATH = {'POW': 'x * x for x ** 2, SQRT for x ** 0.5',
            'FLOOR_DIV': 'its gradient is zero wherever it is defined: nothing trains through it',
            'ATAN2': 'a Dense after it can read the two tensors themselves'}
_FUSED = {'RELU': lambda x: np.maximum(x, 0), 'RELU6': lambda x: np.clip(x, 0, 6),
          'RELU_N1_TO_1': lambda x: np.clip(x, -1, 1)}


def _readers(ops) -> dict:
    """{tensor: [the ops of ops that read it]}."""
    out = {}
    for op in ops:
        for k in op.inputs:
            out.setdefault(k, []).append(op)
    return out


def _islands(g, ops) -> dict:
    """{DEQUANTIZE op index: [it, the float ops after it, the QUANTIZE that ends them]}:
    float32 elementwise ops (_F32) between the DEQUANTIZE of one int8 tensor and one
    QUANTIZE back to int8, their other inputs scalar constants: a function of 256 int8
    values, a LUT layer (_island_layer)."""
    readers = _readers(ops)
    out = {}
    for op in ops:
        if op.name != 'DEQUANTIZE' or g.tensors[op.inputs[0]].dtype != 'int8':
            continue
        made, body, todo, end = {op.outputs[0]}, [op], [op.outputs[0]], []
        ok = True
        while todo and ok:
            k = todo.pop()
            if k in g.outputs or not readers.get(k):
                ok = False
            for r in readers.get(k, []):
                if r in body or r in end:
                    continue
                if r.name == 'QUANTIZE' and g.tensors[r.outputs[0]].dtype == 'int8':
                    end.append(r)
                elif r.name in _F32 and all(
                        j in made or (g.tensors[j].data is not None and g.tensors[j].data.size == 1)
                        for j in r.inputs) and len(r.outputs) == 1:
                    body.append(r)
                    made.add(r.outputs[0])
                    todo.append(r.outputs[0])
                else:
                    ok = False
        if ok and len(end) == 1:
            pos = {id(o): i for i, o in enumerate(ops)}
            out[op.index] = [op] + sorted(body[1:], key=lambda o: pos[id(o)]) + end
    return out


def _div_islands(g, ops) -> dict:
    """{DIV op index: (DEQUANTIZE a, DEQUANTIZE b, the DIV, QUANTIZE)}: a converter's
    a / b of two int8 tensors in float32 (Keras's: it has no int8 DIV in its kernels),
    each float tensor read by the next op alone (_div_island)."""
    readers = _readers(ops)
    prod = {k: op for op in ops for k in op.outputs}
    out = {}
    for op in ops:
        if op.name != 'DIV' or len(op.inputs) != 2:
            continue
        dq = [prod.get(k) for k in op.inputs]
        r = readers.get(op.outputs[0], [])
        if all(o is not None and o.name == 'DEQUANTIZE' and g.tensors[o.inputs[0]].dtype == 'int8'
               and len(readers.get(o.outputs[0], [])) == 1 and o.outputs[0] not in g.outputs
               for o in dq) and len(r) == 1 and r[0].name == 'QUANTIZE' and \
                g.tensors[r[0].outputs[0]].dtype == 'int8' and op.outputs[0] not in g.outputs:
            out[op.index] = (dq[0], dq[1], op, r[0])
    return out


def _div_island(g, dqa, dqb, op, qt):
    """layers(): the float island (DEQUANTIZE a, DEQUANTIZE b, DIV, QUANTIZE) as an int8
    DIV of a and b (a BIN layer: TFLite Micro's div.cc) where that computes the island's
    float32 ops and rounding on every one of the 65536 input pairs (else refused
    naming the first that differs); returns the DIV op as that int8 op."""
    import dataclasses
    (sa,), (za,) = _q(g.tensors[dqa.inputs[0]])
    (sb,), (zb,) = _q(g.tensors[dqb.inputs[0]])
    (sy,), (zy,) = _q(g.tensors[qt.outputs[0]])
    act = op.options.get('fused_activation_function', 'NONE')
    if act not in ('NONE', 'RELU'):
        raise ValueError(f'{g.path}: DIV op {op.number} between DEQUANTIZE and QUANTIZE fuses '
                         f'{act}: int8 training takes it as an int8 DIV with none or RELU')
    bad = _div_differs(sa, za, sb, zb, sy, zy, act)
    if bad:
        raise ValueError(f'{g.path}: DIV op {op.number} divides two int8 tensors in float32 '
                         f'(between DEQUANTIZE and QUANTIZE); TFLite Micro\'s int8 DIV differs from '
                         f'it at these scales (first at int8 inputs {bad[0]} / {bad[1]}): export '
                         'the model with an int8 DIV')
    return dataclasses.replace(op, inputs=[dqa.inputs[0], dqb.inputs[0]], outputs=[qt.outputs[0]])


@functools.lru_cache(maxsize=64)
def _div_differs(sa, za, sb, zb, sy, zy, act):
    """The first int8 pair (a, b), b not at its zero point, where TFLite Micro's int8 DIV
    (_tflm_div) differs from DEQUANTIZE, float32 DIV (act: NONE or RELU), QUANTIZE at
    these scales, or None (each layer table prepare makes asks again: cached)."""
    lo, hi = _act_range(act, sy, zy)
    f = np.float32
    q = np.arange(-128, 128)
    fa = f(sa) * (q - za).astype(f)
    me = _f32div(sa, sb, sy)
    with np.errstate(all='ignore'):
        for x in q:
            if x == zb:
                continue
            r = (fa / (f(sb) * f(x - zb))) / f(sy)
            if act == 'RELU':
                r = np.maximum(r, f(0))
            fl = np.clip(np.sign(r) * np.floor(np.abs(r).astype(np.float64) + 0.5) + zy, lo, hi)
            it = np.clip([zy + _tflm_div(int(a), int(x - zb), me) for a in q - za], lo, hi)
            if (fl != it).any():
                return int(q[np.argmax(fl != it)]), int(x)
    return None


def _island_refusal(g, op):
    """layers(): a DEQUANTIZE that starts no island (_islands): refused saying why, naming
    a float op after it that neither path trains (_NO_PATH: POW, FLOOR_DIV, ATAN2, which
    TF's converter leaves in float32 between DEQUANTIZEs and a QUANTIZE)."""
    todo, seen = [op.outputs[0]], set()
    while todo:
        k = todo.pop()
        for r in g.ops:
            if k not in r.inputs or r.index in seen or r.name == 'QUANTIZE':
                continue
            seen.add(r.index)
            if r.name in _NO_PATH:
                two = sum(1 for j in r.inputs if j >= 0 and not _scalar(g, j)) > 1
                hint = _NO_PATH[r.name]
                raise ValueError(
                    f'{g.path}: op {r.number} ({r.name}) computes in float32 between DEQUANTIZE '
                    f'and QUANTIZE{" on two int8 tensors" if two else ""} (TFLite has no int8 '
                    f'{r.name} kernel); neither int8 training nor the '
                    'float path (--dequantize) has one: compute it outside the model (on its '
                    f'input) or export the model without it ({hint})')
            todo += r.outputs
    raise ValueError(f'{g.path}: op {op.number} (DEQUANTIZE) starts float32 ops that int8 training '
                     'cannot tabulate: it takes float ops between a DEQUANTIZE and a QUANTIZE when '
                     'they read one int8 tensor and scalar constants (ops of two int8 tensors, a '
                     'per-channel constant or a float output is not one; a DIV of two is an int8 '
                     'DIV where they agree): export the model with int8 ops there (prepare '
                     '--dequantize trains it in float)')


def _island_layer(g, isl, src) -> dict:
    """layers(): the float island isl (_islands) as a LUT layer: each of the 256 int8
    inputs dequantized, the ops run in float32 and quantized back as TFLite Micro does
    ('t'); the derivative of the same ops in float64 by central differences ('dt', at
    2^-14 'ds' steps: _put_table)."""
    dq, qt = isl[0], isl[-1]
    (sx,), (zx,) = _q(g.tensors[dq.inputs[0]])
    (sy,), (zy,) = _q(g.tensors[qt.outputs[0]])
    q = np.arange(-128, 128)

    def run(x, ft):
        v = {dq.outputs[0]: x}
        for op in isl[1:-1]:
            a = [v[k] if k in v else np.asarray(g.tensors[k].data, ft).reshape(()) for k in op.inputs]
            y = np.asarray(_F32[op.name](*a), ft)
            f = _FUSED.get(op.options.get('fused_activation_function'))
            v[op.outputs[0]] = np.asarray(f(y), ft) if f else y
        return v[qt.inputs[0]]
    with np.errstate(all='ignore'):
        y = run(np.float32(sx) * (q - zx).astype(np.float32), np.float32)
        r = y / np.float32(sy)
        u = np.sign(r) * np.floor(np.abs(r).astype(np.float64) + 0.5) + zy      # (std::round)
        t = np.clip(np.nan_to_num(u, nan=zy, posinf=127, neginf=-128), -128, 127).astype(int)
        x = sx * (q - zx).astype(np.float64)
        h = sx / 8
        dv = (run(x + h, np.float64) - run(x - h, np.float64)) / (2 * h)
    d = {'k': LUT, 'op': dq.index, 'zx': zx, 'zy': zy, 'sx': sx, 'sy': sy, 'lo': -128, 'hi': 127,
         'nout': int(np.prod(g.tensors[qt.outputs[0]].shape)), 'in': [src(dq.inputs[0])],
         'out': qt.outputs[0]}
    _put_table(d, t, np.where((u >= -128) & (u <= 127) & np.isfinite(dv), dv, 0.0))
    return d


# int8 ops a converter writes for tf.where(x > c, A(x), B(x)) (GREATER, SELECT_V2 and
# the branches' MUL, ADD, SUB of x and scalars): one function of x's 256 codes
_CMP = {'GREATER': np.greater, 'GREATER_EQUAL': np.greater_equal, 'LESS': np.less,
        'LESS_EQUAL': np.less_equal, 'EQUAL': np.equal, 'NOT_EQUAL': np.not_equal}
_SEL_OPS = (*_CMP, 'SELECT_V2', 'MUL', 'ADD', 'SUB')


def _select_islands(g, ops) -> dict:
    """{SELECT_V2 op index: (x, [the ops, the SELECT_V2 last])}: an int8 SELECT_V2 whose
    mask and values are int8 ops (_SEL_OPS) of one int8 tensor x and scalar constants,
    each tensor between them read by those ops alone (tf.where of x: a LUT layer,
    _select_layer).  A SELECT_V2 inside another's island is not one of its own."""
    prod = {k: op for op in ops for k in op.outputs}
    readers = _readers(ops)
    out = {}
    for op in ops:
        if op.name != 'SELECT_V2' or g.tensors[op.outputs[0]].dtype != 'int8':
            continue
        body, roots, todo = [op], set(), list(op.inputs)
        while todo:
            k = todo.pop()
            t = g.tensors[k]
            if t.data is not None:
                if t.data.size != 1 or (t.dtype == 'int8' and not t.quant):
                    roots.add(None)
                continue
            p = prod.get(k)
            inner = p is not None and p.name in _SEL_OPS and len(p.outputs) == 1 and (
                p.name in _CMP or t.dtype == 'int8') and k not in g.outputs and all(
                any(r is o for o in body) for r in readers.get(k, []))
            if inner and not any(p is o for o in body):
                body.append(p)
                todo += p.inputs
            elif not inner:
                roots.add(k)
        if len(roots) == 1 and None not in roots and g.tensors[next(iter(roots))].dtype == 'int8':
            pos = {id(o): i for i, o in enumerate(ops)}
            out[op.index] = (next(iter(roots)), sorted(body, key=lambda o: pos[id(o)]))
    inner = {o.index for _, b in out.values() for o in b[:-1]}
    return {k: v for k, v in out.items() if k not in inner}


def _int8_op(g, op, v):
    """TFLite Micro's int8 kernel of op (_SEL_OPS) on the codes v {tensor: int array}
    (scalar constants read from g): comparisons.cc (each input times its scale, shifted
    8 bits left), select.cc (the codes), mul.cc, add.cc / sub.cc (ADD_SHIFT)."""
    def arg(k):
        t = g.tensors[k]
        return v[k] if k in v else np.asarray(t.data).reshape(-1)[:1].astype(np.int64)
    if op.name == 'SELECT_V2':
        return np.where(arg(op.inputs[0]) != 0, arg(op.inputs[1]), arg(op.inputs[2]))
    (s1,), (z1,) = _q(g.tensors[op.inputs[0]])
    (s2,), (z2,) = _q(g.tensors[op.inputs[1]])
    a, b = np.broadcast_arrays(arg(op.inputs[0]), arg(op.inputs[1]))
    if op.name in _CMP:
        m1, m2 = quantize_multiplier(s1), quantize_multiplier(s2)
        return _CMP[op.name](np.array([mbqm(int(x - z1) << 8, *m1) for x in a]),
                             np.array([mbqm(int(x - z2) << 8, *m2) for x in b])).astype(np.int64)
    (sy,), (zy,) = _q(g.tensors[op.outputs[0]])
    lo, hi = _act_range(op.options.get('fused_activation_function', 'NONE'), sy, zy)
    if op.name == 'MUL':
        me = quantize_multiplier(s1 * s2 / sy)
        r = [zy + mbqm(int(x - z1) * int(w - z2), *me) for x, w in zip(a, b)]
    else:
        tm = 2 * max(s1, s2)
        m1, m2, mo = (quantize_multiplier(x) for x in (s1 / tm, s2 / tm,
                                                       tm / ((1 << ADD_SHIFT) * sy)))
        sg = 1 if op.name == 'ADD' else -1
        r = [zy + mbqm(mbqm(int(x - z1) << ADD_SHIFT, *m1) + sg * mbqm(int(w - z2) << ADD_SHIFT, *m2),
                       *mo) for x, w in zip(a, b)]
    return np.clip(np.array(r, np.int64), lo, hi)


def _select_layer(g, x, isl, src) -> dict:
    """layers(): a select island (_select_islands) as a LUT layer: 't' TFLite Micro's int8
    kernels run on each of x's 256 codes (_int8_op: bit for bit), 'dt' the derivative of
    the ops in real units with each mask as at that code (the branch it takes: a
    comparison passes no gradient), 0 where the output clamps."""
    sel = isl[-1]
    (sx,), (zx,) = _q(g.tensors[x])
    (sy,), (zy,) = _q(g.tensors[sel.outputs[0]])
    q = np.arange(-128, 128)
    v = {x: q.astype(np.int64)}
    for op in isl:
        v[op.outputs[0]] = _int8_op(g, op, v)
    t = np.broadcast_to(v[sel.outputs[0]], q.shape)

    def real(xr, masks):
        w = {x: xr}
        for op in isl:
            a = [w[k] if k in w else (float(np.asarray(g.tensors[k].data).reshape(-1)[0]) -
                                      _q(g.tensors[k])[1][0]) * _q(g.tensors[k])[0][0]
                 for k in op.inputs]
            if op.name in _CMP:
                w[op.outputs[0]] = masks[op.outputs[0]]
            elif op.name == 'SELECT_V2':    # (select.cc copies codes: at the output's scale)
                (so,), (zo,) = _q(g.tensors[op.outputs[0]])
                w[op.outputs[0]] = np.where(a[0], *[(a[j] / _q(g.tensors[k])[0][0] +
                                                     _q(g.tensors[k])[1][0] - zo) * so
                                                    for j, k in ((1, op.inputs[1]),
                                                                 (2, op.inputs[2]))])
            else:
                f = _FUSED.get(op.options.get('fused_activation_function'))
                w[op.outputs[0]] = f(FLOAT_FNS[op.name](*a)) if f else FLOAT_FNS[op.name](*a)
        return np.broadcast_to(w[sel.outputs[0]], xr.shape)
    masks = {op.outputs[0]: v[op.outputs[0]] != 0 for op in isl if op.name in _CMP}
    xr, h = sx * (q - zx).astype(np.float64), sx / 8
    u = real(xr, masks) / sy + zy
    dv = (real(xr + h, masks) - real(xr - h, masks)) / (2 * h)
    d = {'k': LUT, 'op': sel.index, 'zx': zx, 'zy': zy, 'sx': sx, 'sy': sy, 'lo': -128,
         'hi': 127, 'nout': int(np.prod(g.tensors[sel.outputs[0]].shape)), 'in': [src(x)],
         'out': sel.outputs[0]}
    _put_table(d, t, np.where((u >= -128) & (u <= 127), dv, 0.0))
    return d


def _check_reads(g, out, xin):
    """layers(): every layer reads the model's input or an earlier layer's output (or a
    BIN layer's constant); a weighted layer may read a constant int8 activation (a
    recurrent layer's zero state folded to a constant: its bytes in the layer's 'kt',
    made once on the board; no gradient passes to it): else refused naming the op."""
    made = {xin}
    for d in out:
        for j, k in enumerate(d['in']):
            if k in made or 'kc' in d and j == d['kp']:
                continue
            t = g.tensors[k]
            if d['k'] not in WEIGHTED or t.data is None or t.dtype != 'int8' or not t.quant:
                raise ValueError(f'{g.path}: op {g.ops[d["op"]].number} ({g.ops[d["op"]].name}) '
                                 f'reads {t.name!r}, a constant activation (a recurrent '
                                 'layer\'s zero state): int8 training reads one only into a '
                                 'FULLY_CONNECTED, CONV_2D or DEPTHWISE_CONV_2D (export the '
                                 'model with the state as an input)')
            d.setdefault('kt', []).append([k, [int(v) for v in np.asarray(t.data).reshape(-1)]])
            made.add(k)
        made.add(d['out'])


def _one_bias(g, ops):
    """layers(): weighted ops that read one weight tensor and bias tensors of the same
    values and scales (a converter's copy a step: Keras's unrolled GRU) read the first of
    those: one bias trains with the one weight (utrain.q8share); export writes it there."""
    first = {}
    for op in ops:
        if op.name in ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D') and len(op.inputs) > 2 \
                and op.inputs[2] >= 0:
            b = g.tensors[op.inputs[2]]
            if b.data is None or not b.quant:
                continue
            key = (op.inputs[1], b.dtype, b.data.tobytes(), tuple(b.quant.get('scale', ())),
                   tuple(b.quant.get('zero_point', ())))
            op.inputs[2] = first.setdefault(key, op.inputs[2])


def _uses(out) -> list:
    """layers(): the positions in table out of the layers that read each weight tensor
    read by more than one (an unrolled recurrent layer's steps, TimeDistributed's)."""
    by = {}
    for i, d in enumerate(out):
        if 'wt' in d:
            by.setdefault(d['wt'], []).append(i)
    return [v for v in by.values() if len(v) > 1]


def _add_layer(g, op, d, x, y, xin, x2in):
    """layers(): an ADD's inputs (x2in: its second, aliases resolved) and its
    requantization as TFLite's add.cc (inputs shifted left ADD_SHIFT bits)."""
    sx, sy = d['sx'], d['sy']
    x2 = g.tensors[op.inputs[1]]
    if list(x2.shape) != list(x.shape) or list(y.shape) != list(x.shape):
        raise ValueError(f'{g.path}: ADD op {op.number} broadcasts; int8 training adds '
                         'tensors of one shape')
    (s2,), (z2,) = _q(x2)
    tm = 2 * max(sx, s2)
    ms = [quantize_multiplier(v) for v in (sx / tm, s2 / tm,
                                            tm / ((1 << ADD_SHIFT) * sy))]
    d['in'] = [xin, x2in]
    d.update(z2=z2, mul=[m for m, _ in ms], shf=[e for _, e in ms], s2=s2)
    shp = list(x.shape)
    if len(shp) == 4:
        d['hw'] = shp[1:]


def _scalar(g, k) -> bool:
    """Is tensor k one constant value (a DIV by it is a LUT: _lut_layer)?"""
    return k >= 0 and g.tensors[k].data is not None and g.tensors[k].data.size == 1


def _plain_add(g, op) -> bool:
    """Is ADD op one of two activations of the output's shape (the ADD kind; else BIN)?"""
    a, b = (g.tensors[k] for k in op.inputs[:2])
    return (a.data is None and b.data is None and len(op.inputs) == 2
            and list(a.shape) == list(b.shape) == list(g.tensors[op.outputs[0]].shape))


def _bin_layer(g, op, d, src):
    """layers(): an ADD that broadcasts (or adds a constant), a SUB, MUL, DIV,
    SQUARED_DIFFERENCE, MAXIMUM or MINIMUM of two int8 tensors as utrain.q8bin runs it:
    TFLite Micro's multipliers (add.cc / sub.cc: each input shifted left ADD_SHIFT bits
    and scaled by s_i / (2 max(s_1, s_2)), the sum by 2 max(s_1, s_2) / (2^20 s_y);
    squared_difference.cc: the same with SQD_SHIFT bits, the squared difference by
    (2 max(s_1, s_2))^2 / (2^14 s_y); mul.cc: s_1 s_2 / s_y; maximum_minimum.cc compares
    the int8 values: one scale and zero point for the inputs and output; prelu.cc: s_x /
    s_y where x >= 0, s_x s_alpha / s_y below, alpha a constant of one scale), and the broadcast: the output
    as 4 dims (runs of axes that broadcast alike merged) and each input's strides along
    them ('bg', 0 where it broadcasts); a constant input's values in 'kc'."""
    if op.name == 'BATCH_MATMUL':
        return _bmm_layer(g, op, d, src)
    ys = [int(v) for v in g.tensors[op.outputs[0]].shape]
    xs = [g.tensors[k] for k in op.inputs[:2]]
    # (a constant of any size: q8.json's 'kc', its bytes on the board and a PRELU's
    # slopes' gradient are in the heap plan, memory.py; a cap of 4096 had sent Keras's
    # PReLU without shared_axes, a slope a position, to float training)
    if len(op.inputs) != 2 or all(t.data is not None for t in xs):
        raise ValueError(f'{g.path}: {op.name} op {op.number} needs two inputs, an activation '
                         'and an activation or a constant (int8 training)')
    sh = [[1] * (len(ys) - len(t.shape)) + [int(v) for v in t.shape] for t in xs]
    if len(sh[0]) != len(ys) or len(sh[1]) != len(ys) or any(
            a not in (1, n) or b not in (1, n) for a, b, n in zip(sh[0], sh[1], ys)):
        raise ValueError(f'{g.path}: {op.name} op {op.number}: inputs {[list(t.shape) for t in xs]} '
                         f'do not broadcast to its output {ys}')
    # the axes that are not 1, runs that broadcast alike merged: at most 4
    dims, pat = [], []
    for a in range(len(ys)):
        if ys[a] == 1:
            continue
        p = (sh[0][a] == ys[a], sh[1][a] == ys[a])
        if pat and pat[-1] == p:
            dims[-1] *= ys[a]
        else:
            dims.append(ys[a])
            pat.append(p)
    if len(dims) > 4:
        raise ValueError(f'{g.path}: {op.name} op {op.number} broadcasts {[list(t.shape) for t in xs]} '
                         'over more than 4 alternating axes; int8 training takes 4 (prepare '
                         '--dequantize trains it in float)')
    dims, pat = [1] * (4 - len(dims)) + dims, [(True, True)] * (4 - len(pat)) + pat
    strides = []
    for j in (0, 1):
        st, acc = [0] * 4, 1
        for a in range(3, -1, -1):
            if pat[a][j]:
                st[a] = acc
                acc *= dims[a]
        strides += st
    (s1,), (z1,) = _q(xs[0])
    (s2,), (z2,) = _q(xs[1])
    sy = d['sy']
    bo = BINARY.index(op.name)
    if bo == 7 and (xs[1].data is None or len(xs[1].quant.get('scale', ())) != 1):
        raise ValueError(f'{g.path}: PRELU op {op.number}: its alpha is not a constant of one '
                         'scale, which int8 training (as TFLite Micro\'s prelu.cc) needs (prepare '
                         '--dequantize trains it in float)')
    if bo == 7:
        ms = [quantize_multiplier(s1 / sy), quantize_multiplier(s1 * s2 / sy)]
    elif bo == 3:
        ms = [_f32div(s1, s2, sy)]
    elif bo == 2:
        ms = [quantize_multiplier(s1 * s2 / sy)]
    elif bo > 4:
        if not (math.isclose(s1, sy, rel_tol=1e-6) and math.isclose(s2, sy, rel_tol=1e-6)
                and z1 == z2 == d['zy']):
            raise ValueError(f'{g.path}: {op.name} op {op.number} has inputs at scales {s1}, '
                             f'{s2} (zero points {z1}, {z2}) and its output at {sy} ({d["zy"]}); '
                             f'TFLite\'s int8 {op.name} compares the int8 values, which needs '
                             'them equal (prepare --dequantize trains it in float)')
        ms = [(1 << 30, 1)]                 # (x 1)
    else:
        tm = 2 * max(s1, s2)
        ms = [quantize_multiplier(v) for v in (s1 / tm, s2 / tm, tm * tm / ((1 << 2 * SQD_SHIFT) * sy)
                                                  if bo == 4 else tm / ((1 << ADD_SHIFT) * sy))]
        if bo == 4 and ms[2][1] > 0:
            raise ValueError(f'{g.path}: SQUARED_DIFFERENCE op {op.number}: its output scale '
                             f'{sy} is below (2 max input scale)^2 / 2^14, where TFLite\'s int8 '
                             'kernel cannot requantize (prepare --dequantize trains it in float)')
    n = int(np.prod(ys))
    ni = [int(np.prod(t.shape)) for t in xs]
    d.update(bo=bo, zi=[z1, z2], mul=[m for m, _ in ms], shf=[e for _, e in ms],
             bg=dims + strides, ni=ni, lb=[int(math.ceil(math.log2(n // v))) for v in ni],
             cl=1, **{'in': [src(k) if t.data is None else k for k, t in zip(op.inputs, xs)]})
    if bo == 2:
        d.update(si=[s1, s2], kx=1)         # (its gradient reads both inputs)
    elif bo == 4:
        # the gradient 2 (x_j - x_other): each input's values as the forward scales them
        # (scale tm / 2^SQD_SHIFT), their difference times 2 tm / 2^SQD_SHIFT
        d.update(si=[2 * tm / (1 << SQD_SHIFT)] * 2, kx=1,
                 tq=[mbqm((x - z) << SQD_SHIFT, *me) for z, me in ((z1, ms[0]), (z2, ms[1]))
                     for x in range(-128, 128)])
    elif bo == 7:
        # the gradient to x: g where x >= 0, g alpha below: alpha's 256 values, then 1,
        # in 2^-k steps ('tq'), k as fine as the largest within 2^14
        k = 14 - max(0, math.ceil(math.log2(max(1.0, 128 * s2 + abs(z2) * s2))))
        d.update(si=[2.0 ** -k] * 2, kx=1, tq=[int(round(s2 * (v - z2) * 2 ** k))
                                               for v in range(-128, 128)] + [1 << k], ts=[s1, s2])
    elif bo > 4:
        d['kx'] = 1
    if bo == 3:
        _div_tables(d, z2, s2, sy)
    for j, t in enumerate(xs):
        if t.data is not None:
            d.update(kc=[int(v) for v in np.asarray(t.data).reshape(-1)], kp=j)
    if min(ni) < n or (d['in'][0] != d['in'][1] and 'kc' not in d):
        d['gn'] = n                         # (a gradient apart from g's: q8.gtwo)


def _bmm_layer(g, op, d, src):
    """_bin_layer of a BATCH_MATMUL of two int8 tensors as utrain.q8bmm runs it (TFLite
    Micro's batch_matmul.cc: sum_k (a - z_a)(b - z_b) per output, requantized by s_a s_b
    / s_y): 'bm' M, K, N and a's strides along its rows and depth, b's along its depth
    and columns (adj_x / adj_y: stored transposed), 'bb' each output matrix's offsets
    into a and b (the batch axes broadcast), 'lb' ceil(log2) of the terms a value of
    each input's gradient sums (g b^T: N a batch, a^T g: M), 'gn' the larger input (its
    gradient can be larger than the output)."""
    where = f'{g.path}: BATCH_MATMUL op {op.number}'
    xs = [g.tensors[k] for k in op.inputs[:2]]
    ys = [int(v) for v in g.tensors[op.outputs[0]].shape]
    if len(op.inputs) != 2 or all(t.data is not None for t in xs):
        raise ValueError(f'{where} needs two inputs, an activation and an activation or a '
                         'constant (int8 training; prepare --dequantize trains it in float)')
    sa, sb = ([int(v) for v in t.shape] for t in xs)
    if len(sa) < 2 or len(sb) < 2 or len(ys) < 2:
        raise ValueError(f'{where}: operands {sa} and {sb}; BATCH_MATMUL takes matrices')
    ax, ay = op.options.get('adjoint_lhs', False), op.options.get('adjoint_rhs', False)
    M, Kd = (sa[-1], sa[-2]) if ax else (sa[-2], sa[-1])
    K2, N = (sb[-1], sb[-2]) if ay else (sb[-2], sb[-1])
    nb = len(ys) - 2
    pa, pb = [1] * (nb - len(sa) + 2) + sa[:-2], [1] * (nb - len(sb) + 2) + sb[:-2]
    if Kd != K2 or ys[-2:] != [M, N] or len(pa) != nb or len(pb) != nb or any(
            a not in (1, n) or b not in (1, n) for a, b, n in zip(pa, pb, ys[:-2])):
        raise ValueError(f'{where}: operands {sa} and {sb} (adj_x {ax}, adj_y {ay}) do not make '
                         f'its output {ys}; the file is not a valid model: re-export it')
    for t in xs:
        if len((t.quant or {}).get('scale', ())) != 1:
            raise ValueError(f'{where}: an operand of {len((t.quant or {}).get("scale", ()))} '
                             'scales; TFLite\'s int8 BATCH_MATMUL takes one a tensor (prepare '
                             '--dequantize trains it in float)')
    bb = []
    for ix in np.ndindex(*ys[:-2]):
        for p, mat in ((pa, M * Kd), (pb, Kd * N)):
            o, st = 0, 1
            for a in range(nb - 1, -1, -1):
                if p[a] != 1:
                    o += ix[a] * st
                st *= p[a]
            bb.append(o * mat)
    ai, ak = (1, M) if ax else (Kd, 1)
    bk, bj = (1, Kd) if ay else (N, 1)
    (s1,), (z1,) = _q(xs[0])
    (s2,), (z2,) = _q(xs[1])
    m, e = quantize_multiplier(s1 * s2 / d['sy'])
    ni = [int(np.prod(t.shape)) for t in xs]
    B = len(bb) // 2
    d.update(bo=BINARY.index('BATCH_MATMUL'), zi=[z1, z2], mul=[m], shf=[e],
             bm=[M, Kd, N, ai, ak, bk, bj], bb=bb, ni=ni, si=[s1, s2], kx=1, cl=1,
             lb=[int(math.ceil(math.log2(max(1, c)))) for c in (N * B * M * Kd // ni[0],
                                                                  M * B * Kd * N // ni[1])],
             gn=max(ni), **{'in': [src(k) if t.data is None else k for k, t in zip(op.inputs, xs)]})
    for j, t in enumerate(xs):
        if t.data is not None:
            d.update(kc=[int(v) for v in np.asarray(t.data).reshape(-1)], kp=j)


def _emb_layer(g, op) -> dict:
    """layers(): a GATHER of an int8 table's rows by the model's ids (utrain.q8emb): 'et'
    the table tensor, 'en' its rows, 'ed' bytes a row, 'ew' 1 where Keras 3 reads a
    negative id from the end (prepare makes it id + N), 'es' its scale; 'ib' (meta) bytes
    an id."""
    w, y = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
    ids = op.inputs[1]
    where = f'{g.path}: op {op.number} (GATHER)'
    if (ids not in g.inputs or g.tensors[ids].dtype != 'float32') and \
            ids not in getattr(g, 'ids_q8', ()) or w.data is None or \
            len(w.shape) != 2 or int(op.options.get('axis', 0)) or op.options.get('batch_dims'):
        raise ValueError(f'{where}: int8 training gathers the rows of a constant 2-D int8 table '
                         'by the model\'s ids (a float32 or int32 input); prepare --dequantize '
                         'trains this one in float32')
    sw, zw = _q(w)
    sy, zy = _q(y)
    if len(sw) != 1 or not np.isclose(sw[0], sy[0], rtol=1e-6, atol=0) or zw[0] != zy[0]:
        raise ValueError(f'{where}: its output\'s scale and zero point ({sy[0]:g}, {zy[0]}) are '
                         f'not its table\'s ({sw[0]:g}, {zw[0]}); TFLite Micro\'s GATHER copies '
                         'the rows: prepare --dequantize trains it in float32')
    n, r = (int(v) for v in w.shape)
    if n > 65536:
        raise ValueError(f'{where}: a table of {n} rows; int8 training takes ids of up to 2 '
                         'bytes (65,536 rows): prepare --dequantize trains it in float32')
    return {'k': EMB, 'op': op.index, 'zx': -128, 'zy': zy[0], 'sx': 1.0, 'sy': sy[0],
            'nout': int(np.prod(y.shape)), 'in': [ids], 'out': op.outputs[0], 'lo': -128,
            'hi': 127, 'et': op.inputs[0], 'en': n, 'ed': r, 'ew': int(len(op.inputs) > 2), 'es': sw[0],
            'ib': 1 if n <= 256 else 2}


def emb_ids(m: dict, x) -> np.ndarray:
    """The samples x (float ids, [n, ...]) of layer table m whose input is an embedding's
    ids (EMB layers) as the board reads them (utrain.q8emb): 'ib' bytes an id, low byte
    first, each the byte's value (stored at scale 1, zero point -128: prepare's int8
    samples); a negative id of a table that wraps (Keras 3) as id + N.  ValueError naming
    the sample and the id where one is not an integer or a row."""
    es = [d for d in m['layers'] if d['k'] == EMB]
    n, ib, wrap = min(d['en'] for d in es), es[0]['ib'], all(d['ew'] for d in es)
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    i = np.where((x < 0) & wrap, x + n, x)
    bad = np.argwhere((i != np.round(i)) | (i < 0) | (i >= n))
    if bad.size:
        s, j = bad[0]
        raise ValueError(f'sample {s}, position {j}: id {x[s, j]:g} is not a row of the '
                         f'embedding\'s {n} (0..{n - 1}{f", or -{n}..-1" if wrap else ""}); '
                         'give the model ids in that range')
    i = i.astype(np.int64)
    if ib == 1:
        return i.astype(np.float64)
    return np.stack([i & 255, i >> 8], -1).reshape(len(x), -1).astype(np.float64)


def _l2_layer(g, op, d, x):
    """layers(): an L2_NORMALIZATION (over the last axis) as utrain.q8nrm runs it, TFLite
    Micro's reference_integer_ops::L2Normalization: its output at TFLite's fixed scale
    1/128 and zero point 0 (its kernel refuses others), no fused activation; 'n' the
    row's length, 'si' its gradient's factor 1 / s_x."""
    act = op.options.get('fused_activation_function', 'NONE')
    if not math.isclose(d['sy'], 1 / 128, rel_tol=1e-6) or d['zy'] != 0 or act not in ('NONE', None):
        raise ValueError(f'{g.path}: L2_NORMALIZATION op {op.number} has its output at scale '
                         f'{d["sy"]}, zero point {d["zy"]}, activation {act}; TFLite\'s int8 '
                         'kernel (and int8 training) takes scale 1/128, zero point 0 and none '
                         '(prepare --dequantize trains it in float)')
    d.update(n=int(x.shape[-1]) if len(x.shape) else 1, kx=1, si=[1 / d['sx']])


def _tconv_layer(g, op, d, x, y):
    """layers(): a TRANSPOSE_CONV as utrain.q8tcv runs it (TFLite Micro's
    reference_integer_ops::TransposeConv; frozen: its weights do not train): 'g' the
    geometry of the convolution it is the input gradient of (its input H, W, I this op's
    output, its output OH, OW, O this op's input; the padding TFLite Micro computes from
    the output's size), its weights 'xw' [I, KH, KW, O] and bias 'xb' (a zero one where
    the file has none), per-channel 'mul', 'shf', 'sw'; 'gn' its input's size, 'gx' (its
    input's gradient is not made in place), 'cl' (its output is kept: the gradient's
    clamp mask)."""
    w = g.tensors[op.inputs[1]]
    sw, _ = _q(w)
    I, KH, KW, O = (int(v) for v in w.shape)
    H, W = int(y.shape[1]), int(y.shape[2])
    OH, OW = int(x.shape[1]), int(x.shape[2])
    pad = op.options.get('padding', 'SAME')
    sh, sw_ = op.options.get('stride_h', 1), op.options.get('stride_w', 1)
    where = f'{g.path}: TRANSPOSE_CONV op {op.number}'
    ph, pw = out_pad(H, KH, sh, 1, pad, where)[1], out_pad(W, KW, sw_, 1, pad, where)[1]
    if len(op.inputs) < 4 or op.inputs[3] < 0:
        stand = type('Op', (), {'inputs': [None, op.inputs[1]], 'name': 'TRANSPOSE_CONV'})()
        op.inputs[3:] = [zero_bias(g, stand, d['sx'], sw)]
    b = g.tensors[op.inputs[3]]
    if b.dtype != 'int32' or int(x.shape[3]) != O or int(y.shape[3]) != I:
        raise ValueError(f'{g.path}: TRANSPOSE_CONV op {op.number}: bias {b.dtype}, input '
                         f'{list(x.shape)}, weights {list(w.shape)}, output {list(y.shape)}: '
                         'int8 training takes int32 biases and NHWC tensors (prepare --dequantize '
                         'trains it in float)')
    sw = list(sw) if len(sw) == I else list(sw) * I
    mm = [quantize_multiplier(d['sx'] * s / d['sy']) for s in sw]
    d.update(xw=op.inputs[1], xb=op.inputs[3], wn=int(w.data.size), nb=I, sw=sw,
             mul=[m for m, _ in mm], shf=[e for _, e in mm], gn=int(np.prod(x.shape)), gx=1,
             cl=1, g=[H, W, I, O, KH, KW, sh, sw_, ph, pw, OH, OW, 1, 1])


def _div_tables(d, z2, s2, sy):
    """_bin_layer(): a DIV's tables over the divisor's 256 int8 values x (b = x - z2):
    'rv' gemmlowp's reciprocal of |b| and 'rs' its shift (+64 where b < 0: the dividend
    negated), as TFLite Micro's div.cc computes them per element (_tflm_div; b = 0: 0,
    the output's zero point); 'ri' round(2^RECIP / b) for the gradient (to input 1
    g / b, to input 2 -g y / b: the output y) and 'si' its two scales."""
    rv, rs, ri = [], [], []
    for x in range(-128, 128):
        b = x - z2
        if b == 0:
            rv.append(0)
            rs.append(0)
            ri.append(0)
            continue
        hp1 = 32 - abs(b).bit_length()
        rv.append(_tflm_div(0, abs(b), (0, 0), recip=True))
        rs.append(31 - hp1 + (64 if b < 0 else 0))
        ri.append(int(round((1 << RECIP) / b)))
    d.update(rv=rv, rs=rs, ri=ri, kx=1,
             si=[1 / (s2 * (1 << RECIP)), sy / (s2 * (1 << RECIP))])


def _slice_layers(g, op, src) -> list:
    """layers(): a SLICE, STRIDED_SLICE (any strides, masks), SPLIT / SPLIT_V or TRANSPOSE
    of an int8 tensor as utrain.q8slc runs it, one layer per output: the strided copy out
    of the input ('cp': rows, row length, input stride, offset: _copy_rows, as a
    CONCATENATION places an input), else a gather over the output as 4 dims ('gx':
    _gather: a transpose, a slice of several axes), and the input's size ('gn': its
    gradient's)."""
    from ..graph.shapes import strided_slice
    xk = op.inputs[1] if op.name == 'SPLIT' else op.inputs[0]
    x = g.tensors[xk]
    xs = [int(v) for v in x.shape]
    idx = np.arange(int(np.prod(xs))).reshape(xs)
    c = lambda k: [int(v) for v in np.asarray(g.tensors[k].data).reshape(-1)]   # noqa: E731
    bad = f'{g.path}: {op.name} op {op.number}'
    consts = op.inputs[:1] if op.name == 'SPLIT' else op.inputs[1:]
    if any(k < 0 or g.tensors[k].data is None for k in consts):
        raise ValueError(f'{bad} takes its begin, size, axis or permutation at run time; int8 '
                         'training needs them constant')
    parts = []
    if op.name == 'TRANSPOSE':
        p = [int(v) % len(xs) for v in c(op.inputs[1])]
        if sorted(p) != list(range(len(xs))):
            raise ValueError(f'{bad}: {p} is not a permutation of its input\'s {len(xs)} axes')
        parts.append(np.transpose(idx, p))
    elif op.name == 'SLICE':
        b, n = c(op.inputs[1]), c(op.inputs[2])
        parts.append(idx[tuple(slice(v, xs[a] if m == -1 else v + m)
                               for a, (v, m) in enumerate(zip(b, n)))])
    elif op.name == 'STRIDED_SLICE':
        v = strided_slice(idx, c(op.inputs[1]), c(op.inputs[2]), c(op.inputs[3]), op.options)
        if v is None:
            raise ValueError(f'{bad} has an ellipsis, new-axis or offset mask; int8 training '
                             'takes begin, end, strides and the begin, end and shrink masks')
        parts.append(np.asarray(v))
    else:
        ax = c(op.inputs[0] if op.name == 'SPLIT' else op.inputs[2])[0] % len(xs)
        sizes = ([xs[ax] // len(op.outputs)] * len(op.outputs) if op.name == 'SPLIT'
                 else c(op.inputs[1]))
        if -1 in sizes:
            sizes[sizes.index(-1)] = xs[ax] - (sum(sizes) + 1)
        at = np.cumsum([0] + sizes)
        parts = [idx[(slice(None),) * ax + (slice(int(a), int(e)),)] for a, e in zip(at, at[1:])]
    if len(parts) != len(op.outputs):
        raise ValueError(f'{bad}: {len(op.outputs)} outputs for {len(parts)} pieces')
    (sx,), (zx,) = _q(x)
    # (the SPLIT_V of a model's inputs joined (inout.join_inputs): each part's bytes at
    # its own input's scale and zero point, copied as they are)
    joined = getattr(g, 'joined', None) and xk == g.inputs[0]
    out = []
    for k, ix in zip(op.outputs, parts):
        y = g.tensors[k]
        (sy,), (zy,) = _q(y)
        ix = np.asarray(ix)
        ok = ix.size == int(np.prod(y.shape))
        cp = _copy_rows(ix.reshape(-1)) if ok else None
        gx = _gather(ix) if ok and cp is None else None
        if (cp is None and gx is None) or zy != zx and not joined:
            raise ValueError(f'{bad}: output {y.name!r} is not a strided copy of its input at '
                             'its zero point (int8 training copies along at most 4 axes, after '
                             'merging those that stay contiguous); prepare --dequantize trains '
                             'it in float')
        d = {'k': SLC, 'op': op.index, 'zx': zx, 'zy': zy, 'sx': sx, 'sy': sy, 'lo': -128,
             'hi': 127, 'nout': int(np.prod(y.shape)), 'in': [src(xk)], 'out': k,
             'gn': int(np.prod(xs))}
        d.update({'cp': cp} if cp else {'gx': gx})
        if not math.isclose(sx, sy, rel_tol=1e-6):
            d['sr'] = sy / sx
        out.append(d)
    return out


def _resize_axis_q8(n, m, align, half, nearest):
    """_resize_layer(): per output row (column) of an axis of m from n, [lo, hi, a, b]
    (input indices, weights of lo and hi): nearest as TFLite's float index (a copy, a = 1,
    b = 0); bilinear as TFLite Micro's ResizeBilinearInteger (scale in 1/1024, C's
    truncating division; a + b = 1024)."""
    from ..graph.optable import _resize_axis
    if nearest:
        return [[j, j, 1, 0] for j in _resize_axis(n, m, align, half, True)[::3]]
    s10 = ((1 << 10) * n + m // 2) // m
    if align and m > 1:
        s10 = ((1 << 10) * (n - 1) + (m - 1) // 2) // (m - 1)
    out = []
    for i in range(m):
        v = i * s10 + s10 // 2 - (1 << 9) if half else i * s10
        lo = max(int(v / 1024), 0)
        hi = min(int((v + 1023) / 1024), n - 1)
        out.append([lo, hi, 1024 - (v - 1024 * lo), v - 1024 * lo])
    return out


def _resize_layer(g, op, src) -> dict:
    """layers(): a RESIZE_BILINEAR or RESIZE_NEAREST_NEIGHBOR of an int8 [1, H, W, C] map as
    utrain.q8rsz runs it (an SLC layer with 'rz' [OH, OW, C, k, rb, ty, tx]; 'ry', 'rx' per output
    row and column the input's offsets lo, hi in bytes and weights a, b + 4096; 'gn' the
    input's size)."""
    bad = f'{g.path}: {op.name} op {op.number}'
    x, y = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
    (sx,), (zx,) = _q(x)
    (sy,), (zy,) = _q(y)
    xs, ys = [int(v) for v in x.shape], [int(v) for v in y.shape]
    if len(xs) != 4 or len(ys) != 4 or xs[0] != 1 or xs[3] != ys[3]:
        raise ValueError(f'{bad}: input {xs}, output {ys}: int8 training resizes one NHWC map '
                         '(prepare --dequantize trains it in float)')
    if zx != zy or not math.isclose(sx, sy, rel_tol=1e-6):
        raise ValueError(f'{bad}: output scale {sy:.6g} / zero point {zy} is not the input\'s '
                         f'({sx:.6g} / {zx}), which TFLite Micro\'s int8 resize keeps: export '
                         'it with one quantization (prepare --dequantize trains it in float)')
    _, H, W, C = xs
    OH, OW = ys[1], ys[2]
    align = bool(op.options.get('align_corners'))
    half = bool(op.options.get('half_pixel_centers'))
    near = op.name == 'RESIZE_NEAREST_NEIGHBOR'
    if align and half and not near:
        raise ValueError(f'{bad}: align_corners and half_pixel_centers both set, which '
                         'TFLite refuses too: export it with one of them')
    ry = _resize_axis_q8(H, OH, align, half, near)
    rx = _resize_axis_q8(W, OW, align, half, near)

    def most(t, n, r=0):        # the largest sum of |weights >> r| one input index gets
        s = [0] * n
        for lo, hi, a, b in t:
            s[lo] += abs((a + (1 << r >> 1)) >> r)
            s[hi] += abs((b + (1 << r >> 1)) >> r)
        return max(s)
    # (the gradient's weights: >> t, so that an axis's sums stay within 2^8)
    ty, tx = (max(most(t, n).bit_length() - 8, 0) for t, n in ((ry, H), (rx, W)))
    rb = (most(ry, H, ty) * most(rx, W, tx)).bit_length()
    return {'k': SLC, 'op': op.index, 'zx': zx, 'zy': zy, 'sx': sx, 'sy': sy, 'lo': -128,
            'hi': 127, 'nout': OH * OW * C, 'in': [src(op.inputs[0])], 'out': op.outputs[0],
            'gn': H * W * C, 'rz': [OH, OW, C, 0 if near else 20, rb, ty, tx],
            'ry': [v for lo, hi, a, b in ry for v in (lo * W * C, hi * W * C, a + 4096, b + 4096)],
            'rx': [v for lo, hi, a, b in rx for v in (lo * C, hi * C, a + 4096, b + 4096)]}


def _gather(ix):
    """[D0, D1, D2, D3, S0, S1, S2, S3, offset]: the output whose elements are input
    positions ix (an array in the output's order, any shape) as a gather over 4 dims with
    the input's stride along each (axes of size 1 dropped, neighbours that stay
    contiguous merged), or None (more than 4 axes left, or not strided)."""
    D, S = [], []
    for a, n in enumerate(ix.shape):
        if n == 1:
            continue
        st = int(np.take(ix, 1, axis=a).flat[0] - ix.flat[0])
        if D and S[-1] == st * n:
            D[-1] *= n
            S[-1] = st
        else:
            D.append(int(n))
            S.append(st)
    if len(D) > 4:
        return None
    D, S = [1] * (4 - len(D)) + D, [0] * (4 - len(S)) + S
    off = int(ix.flat[0])
    at = off + sum(c * s for c, s in zip(np.indices(D), S))
    return D + S + [off] if np.array_equal(at.reshape(-1), ix.reshape(-1)) else None


def _cat_layer(g, op, d, y, src):
    """layers(): a CONCATENATION (any number of inputs, on any axis) or a PAD (constant
    paddings, not folded into a convolution) as utrain.q8cat places it: per input the
    strided copy ('cp': rows, row length, output stride, offset) and the requantization
    to the output's scale and zero point ('mul', 'shf': 0 for an input at the output's
    quantization and range, a copy; 'zi' its zero point), 'fill' where the inputs do
    not cover the output (a PAD's border, at the output's zero point)."""
    ys = list(y.shape)
    idx = np.arange(int(np.prod(ys))).reshape(ys)
    if op.name == 'PAD':
        x = g.tensors[op.inputs[0]]
        p = g.tensors[op.inputs[1]].data if len(op.inputs) > 1 else None
        p = None if p is None else np.asarray(p).reshape(-1, 2)
        if p is None or len(p) != len(x.shape) or (p < 0).any() or \
                [int(a + b + n) for (a, b), n in zip(p, x.shape)] != ys:
            raise ValueError(f'{g.path}: PAD op {op.number} needs constant, non-negative '
                             'paddings that make its output\'s shape')
        parts = [(op.inputs[0], idx[tuple(slice(int(a), int(a) + n)
                                          for (a, _), n in zip(p, x.shape))])]
    else:
        ax = int(op.options.get('axis', 0)) % len(ys)
        parts, at = [], 0
        for k in op.inputs:
            n = g.tensors[k].shape[ax]
            parts.append((k, idx[(slice(None),) * ax + (slice(at, at + n),)]))
            at += n
        if at != ys[ax] or any(len(g.tensors[k].shape) != len(ys) for k in op.inputs):
            raise ValueError(f'{g.path}: CONCATENATION op {op.number}: its inputs\' shapes do '
                             f'not make its output\'s {ys} on axis {ax}')
    d['in'], d['cp'], d['mul'], d['shf'], d['zi'] = [], [], [], [], []
    full = d['lo'] == -128 and d['hi'] == 127
    for k, ix in parts:
        cp = _copy_rows(ix.reshape(-1))
        if cp is None:
            raise ValueError(f'{g.path}: {op.name} op {op.number}: input {k} is not one strided '
                             'copy into the output (int8 training places each input as rows '
                             'of one stride: a PAD of more than two axes, a CONCATENATION '
                             'inside a padded tensor); prepare --dequantize trains it in float')
        (s,), (z,) = _q(g.tensors[k])
        same = math.isclose(s, d['sy'], rel_tol=1e-6) and z == d['zy']
        m, e = (0, 0) if same and full else quantize_multiplier(s / d['sy'])
        d['in'].append(src(k))
        d['cp'] += cp
        d['mul'].append(m)
        d['shf'].append(e)
        d['zi'].append(z)
        if m:
            d['cl'] = 1         # its gradient stops where the output sat at the clamp
    if sum(int(np.prod(g.tensors[k].shape)) for k, _ in parts) != d['nout']:
        d['fill'] = 1


def mbqm(x, m: int, e: int) -> int:
    """TFLite's MultiplyByQuantizedMultiplier of int x by (m, e) (quantize_multiplier):
    SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT (utrain.q8kern rqk's
    integers)."""
    a = x << e if e > 0 else x
    p = a * m
    p += (1 << 30) if p >= 0 else 1 - (1 << 30)
    r = abs(p) >> 31
    r = -r if p < 0 else r
    rs = -e if e < 0 else 0
    if rs:
        k = (1 << rs) - 1
        t = (k >> 1) + (1 if r < 0 else 0)
        r = (r >> rs) + (1 if (r & k) > t else 0)
    return r


def _lut_layer(g, op, d):
    """layers(): an elementwise op of one int8 input (LOGISTIC, TANH, HARD_SWISH,
    LEAKY_RELU, ELU, GELU, NEG, EXP, LOG, RSQRT, SQRT; RELU, RELU6, RELU_N1_TO_1 and QUANTIZE as TFLite Micro's
    one requantization and clamp; a DIV by one constant as its integer div.cc,
    _tflm_div) as utrain.q8lut runs it: 't' its int8 output for each input value
    -128..127, 'dt' its derivative there (real units, 2^-14 steps of 'ds'; 0 where the
    output clamps).  Where TFLite Micro's DIV shifts by 32 bits or more (a quotient far
    below the output's step) its rounding gives the zero point + 1 (- 1 when negative, as
    on ARM: x86 builds saturate there, the shift being undefined in C); _tflm_div."""
    if op.name == 'SOFTMAX':
        return _softmax_layer(g, op, d)
    sx, zx, sy, zy = d['sx'], d['zx'], d['sy'], d['zy']
    q = np.arange(-128, 128)
    x = (q - zx) * sx
    if op.name == 'DIV':                # (by one constant: layers(); else a BIN layer)
        c = g.tensors[op.inputs[1]]
        (s2,), (z2,) = _q(c)
        v = int(np.asarray(c.data).reshape(-1)[0]) - z2
        if v == 0:
            raise ValueError(f'{g.path}: DIV op {op.number} divides by zero')
        t = np.clip([zy + _tflm_div(int(a), v, _f32div(sx, s2, sy)) for a in q - zx], d['lo'], d['hi'])
        dv = np.where((t > d['lo']) & (t < d['hi']), 1 / (v * s2), 0.0)
        _put_table(d, t, dv)
        return
    if op.name in REQUANT:
        lo, hi = _act_range('NONE' if op.name == 'QUANTIZE' else op.name, sy, zy)
        m, e = quantize_multiplier(sx / sy)
        t = np.clip([zy + mbqm(int(v), m, e) for v in q - zx], lo, hi)
        dv = np.where((t > lo) & (t < hi), 1.0, 0.0)     # (x itself inside the clamp)
    else:
        f, df = UNARY[op.name]
        with np.errstate(all='ignore'):
            v = (_lut_populate(f, sx, zx, sy, zy) if op.name in LUT_F32
                 else _tfl_sqrt(sx, zx, sy, zy) if op.name == 'SQRT'
                 else np.round(f(x, op.options) / sy) + zy)
            t = np.clip(np.nan_to_num(v, nan=-128), -128, 127)
            dv = np.where((v >= -128) & (v <= 127), df(x, op.options), 0.0)
            if op.name == 'SQRT':
                dv[(q == zx) & (v < 127)] = 1 / math.sqrt(sx)
    _put_table(d, t, dv)


# the longest row of an int8 SOFTMAX inside the graph (utrain.q8smx): its forward sums a
# row's 'sf' terms (exp at 12 integer bits, up to 2^19 each) in int32, 4095 x 2^19 < 2^31;
# its gradient shifts g to 21 - log2(row) bits first (sums in 31 bits whatever the row)
SOFTMAX_ROW = 4095


def _softmax_layer(g, op, d):
    """_lut_layer of a SOFTMAX inside the graph (attention's; the final one is the loss's)
    as utrain.q8smx runs it, TFLite Micro's reference int8 softmax: 'sm' the rows'
    length (the last axis), 'se' exp_on_negative_values of each difference 0..255 to the
    row's maximum (its input rescaled by PreprocessSoftmaxScaling's multiplier, 5 integer
    bits; 0 beyond diff_min, CalculateInputRadius), 'sf' those rescaled to 12 integer bits."""
    where = f'{g.path}: SOFTMAX op {op.number}'
    prod = {k: o for o in g.ops for k in o.outputs}
    e = prod.get(g.outputs[0]) if g.outputs else None
    while e is not None and e is not op and e.name in ('DEQUANTIZE', 'RESHAPE', 'SQUEEZE'):
        e = prod.get(e.inputs[0])
    if e is op:             # (softmax_end: the loss's softmax, not one inside the graph)
        raise ValueError(f'{where} is the model\'s last but for shape ops after it; int8 '
                         'training leaves a final SOFTMAX to its loss only as the last op '
                         '(prepare --dequantize trains it in float)')
    x = g.tensors[op.inputs[0]]
    n = int(x.shape[-1]) if len(x.shape) else 1
    if d['zy'] != -128 or abs(d['sy'] - 1 / 256) > 1e-3 / 256:
        raise ValueError(f'{where}: its output is at scale {d["sy"]}, zero point {d["zy"]}; '
                         'TFLite\'s int8 SOFTMAX writes 1/256 and -128 (prepare --dequantize '
                         'trains it in float)')
    if n > SOFTMAX_ROW:
        raise ValueError(f'{where}: rows of {n} values; int8 training takes up to '
                         f'{SOFTMAX_ROW} (a row\'s sum of exps, each up to 2^19 at 12 integer '
                         'bits as TFLite Micro sums them, in 31 bits: prepare --dequantize '
                         'trains it in float)')
    m, e = quantize_multiplier(min(float(op.options.get('beta', 1.0)) * d['sx'] * (1 << 26),
                                   (1 << 31) - 1.0))
    dmin = -int(math.floor(31.0 * (1 << 26) / (1 << e)))
    se = [_gl_exp(mbqm(-k, m, e)) if -k >= dmin else 0 for k in range(256)]
    d.update(sm=n, se=se, sf=[_rdbp(v, 12) for v in se], lo=-128, hi=127)


def _rdbp(x: int, k: int) -> int:
    """gemmlowp's RoundingDivideByPOT (ties away from zero)."""
    mask = (1 << k) - 1
    t = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> k) + (1 if (x & mask) > t else 0)


def _gl_exp(a: int) -> int:
    """gemmlowp's exp_on_negative_values of a (a FixedPoint<int32, 5>'s raw, <= 0): the
    FixedPoint<int32, 0> raw of exp(a / 2^26)."""
    hm = lambda u, v: mbqm(u, v, 0)     # noqa: E731  (SaturatingRoundingDoublingHighMul)
    q = 1 << 24                         # (1/4 at 26 fractional bits)
    am = ((a & (q - 1)) - q)            # a mod 1/4 - 1/4, in [-1/4, 0)
    x = _sat(am << 5) + (1 << 28)       # (Rescale<0>, + 1/8)
    x2 = hm(x, x)
    x3 = hm(x2, x)
    x4 = hm(x2, x2)
    p = _rdbp(hm(_rdbp(x4, 2) + x3, 715827883) + x2, 1)
    r = 1895147668 + hm(1895147668, x + p)
    rem = am - a
    for b, k in enumerate((1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242)):
        if rem & (1 << (24 + b)):
            r = hm(r, k)
    return (1 << 31) - 1 if a == 0 else r


def _tfl_sqrt(sx, zx, sy, zy):
    """TFLite's int8 SQRT (elementwise.cc's SqrtEvalQuantized, TF 2.21) before the clamp:
    each of the 256 inputs dequantized in float32, sqrtf, divided by the float32 sy,
    truncated toward 0 (a cast), plus the zero point; a negative input (which TFLite
    refuses) as 0."""
    f32 = np.float32
    x = f32(sx) * (np.arange(-128, 128) - zx).astype(f32)
    return np.trunc(np.sqrt(np.maximum(x, f32(0))) / f32(sy)).astype(np.float64) + zy


def _lut_populate(f, sx, zx, sy, zy):
    """TFLite's int8 LUTPopulate of f (EXP, LOG): each of the 256 inputs dequantized in
    float32, f in float32, times the float32 1 / sy, std::round, plus the zero point;
    before the clamp (a NaN, LOG of a negative input, is the lowest code there, as the
    float-to-int cast gives it on x86; -inf is on every target)."""
    f32 = np.float32
    y = np.asarray(f(f32(sx) * (np.arange(-128, 128) - zx).astype(f32), {}), f32)
    r = (y * (f32(1) / f32(sy))).astype(np.float64)
    return np.sign(r) * np.floor(np.abs(r) + 0.5) + zy


def _put_table(d, t, dv):
    """A LUT layer's 't' (int8 outputs) and 'dt' (the derivative dv in 2^-14 steps of
    'ds', a power of two where it exceeds 2: a division by a small constant)."""
    dv = np.asarray(dv, np.float64)
    m = float(np.abs(dv).max()) if dv.size else 0.0
    ds = 2.0 ** math.ceil(math.log2(m / 1.99)) if m > 1.99 else 1.0
    d['t'] = [int(v) for v in t]
    d['dt'] = [int(v) for v in np.clip(np.round(dv / ds * 16384), -32768, 32767)]
    if ds != 1:
        d['ds'] = ds


def _f32div(s1, s2, sy):
    """TFLite Micro's DIV multiplier (div.cc: s1 / (s2 s_y) in float32) as
    quantize_multiplier's (m, e)."""
    f = np.float32
    return quantize_multiplier(float(f(s1) / (f(s2) * f(sy))))


def _sat(x: int) -> int:
    return max(-(1 << 31), min((1 << 31) - 1, x))


def _tflm_div(a: int, b: int, me, recip=False) -> int:
    """TFLite Micro's int8 DIV of a by b (inputs minus their zero points, b != 0) before
    the output's zero point and clamp: gemmlowp's fixed-point reciprocal of b (three
    Newton-Raphson steps; its products mbqm(x, y, 0), SaturatingRoundingDoublingHighMul),
    the quotient with a's headroom, then the output multiplier me = (m, e) (reference
    div.h DivElementwise)."""
    if b < 0:
        a, b = -a, -b
    hp1 = 32 - b.bit_length()                   # CountLeadingZeros(b)
    half = ((b << hp1) - (1 << 31)) & 0xffffffff
    half = half - (1 << 32) if half >= 1 << 31 else half
    s = half + (1 << 31) - 1                    # RoundingHalfSum(a, F0::One())
    s += 1 if s >= 0 else -1
    hd = s // 2 if s >= 0 else -(-s // 2)       # (C's division: toward zero)
    x = 1515870810 + mbqm(hd, -1010580540, 0)   # 48/17 - 32/17 hd (F2)
    for _ in range(3):
        p = mbqm(x, (1 << 29) - mbqm(hd, x, 0), 0)
        x += _sat(p * 4) if abs(p) <= (1 << 29) - 1 else ((1 << 31) - 1 if p > 0 else -(1 << 31))
    inv = _sat(x * 2) if abs(x) <= (1 << 30) - 1 else ((1 << 31) - 1 if x > 0 else -(1 << 31))
    if recip:
        return inv
    hr = 31 if a == 0 else 31 - (~a if a < 0 else a).bit_length()     # CountLeadingSignBits
    u = mbqm(a, inv, hr)                        # (MultiplyByQuantizedMultiplierGreaterThanOne)
    m, e = me
    sh = e - (31 - hp1) - hr
    if sh < -31:
        # gemmlowp's RoundingDivideByPOT by 32 bits or more: its mask (1 << 32+) - 1 is
        # -1 as int32, so it rounds up: 1 (-1 when negative: the shift itself is undefined
        # in C; ARM's gives -1, x86 builds' wrap); a = 0 (ReLU's zeros) gives 1 everywhere
        return -1 if mbqm(u, m, 0) < 0 else 1
    return mbqm(u, m, sh)


def _copy_rows(ix):
    """[rows, row length, stride, offset] that place a tensor whose elements go to output
    positions ix (in order) by one strided copy, or None."""
    n = len(ix)
    if not n:
        return None
    L = 1
    while L < n and ix[L] == ix[0] + L:
        L += 1
    if n % L:
        return None
    r = ix.reshape(-1, L)
    st = int(r[1, 0] - r[0, 0]) if len(r) > 1 else L
    ok = (r - r[:, :1] == np.arange(L)).all() and (
        r[:, 0] == r[0, 0] + st * np.arange(len(r))).all() and st >= L
    return [len(r), L, st, int(ix[0])] if ok else None


def _pool_layer(g, op, d, x, y):
    """layers(): a MAX_POOL_2D / AVERAGE_POOL_2D's geometry (input and output quantized
    alike, as TFLite's int8 pools need)."""
    if len(x.shape) != 4 or len(y.shape) != 4:
        raise ValueError(f'{g.path}: {op.name} op {op.number} must pool an NHWC tensor')
    sx, zx, sy, zy = d['sx'], d['zx'], d['sy'], d['zy']
    if not (math.isclose(sx, sy, rel_tol=1e-6) and zx == zy):
        raise ValueError(f'{g.path}: {op.name} op {op.number} has input scale {sx} '
                         f'zero point {zx} but output scale {sy} zero point '
                         f'{zy}; TFLite\'s int8 pools need them equal')
    H, W, C = x.shape[1:]
    o = op.options
    KH, KW = o.get('filter_height', 1), o.get('filter_width', 1)
    sh, sw_ = o.get('stride_h', 1), o.get('stride_w', 1)
    where = f'{g.path}: {op.name} op {op.number}'
    OH, ph = out_pad(H, KH, sh, 1, o.get('padding', 'SAME'), where)
    OW, pw = out_pad(W, KW, sw_, 1, o.get('padding', 'SAME'), where)
    if [1, OH, OW, C] != list(y.shape) or min(KH, KW, sh, sw_, OH, OW) < 1:
        raise ValueError(f'{g.path}: {op.name} op {op.number}: output shape '
                         f'{list(y.shape)} is not its {KH}x{KW} window\'s [1, {OH}, '
                         f'{OW}, {C}]')
    d['g'] = [H, W, C, C, KH, KW, sh, sw_, ph, pw, OH, OW, 1, 1]


def _mean_layer(g, op, d, x):
    """layers(): a MEAN over the leading axes of its input that are not 1 (H and W of
    NHWC: a global average pool; the steps of [1, T, C]: Keras's GlobalAveragePooling1D),
    with 1/N folded into its multiplier, as TFLite's reduce_common.cc does; a SUM the
    same ('sm': its multiplier s_x / s_y alone, TFLite Micro's int8 SUM; its gradient g
    itself: Keras 3's UnitNormalization sums the squares of [1, C])."""
    shape = list(x.shape)
    axes = {int(a) % len(shape) for a in np.asarray(g.tensors[op.inputs[1]].data).ravel()}
    keep = [i for i, v in enumerate(shape) if v != 1]
    red = [i for i in keep if i in axes]
    if not red or keep[:len(red)] != red:
        raise ValueError(f'{g.path}: {op.name} op {op.number} reduces axes {sorted(axes)} of '
                         f'{shape}; int8 training reduces the leading axes that are not 1 '
                         '(H and W of NHWC, the steps of [1, T, C]); prepare --dequantize '
                         'trains it in float')
    n = int(np.prod([shape[i] for i in red]))
    m, e = quantize_multiplier(d['sx'] / d['sy'])
    if op.name == 'SUM':
        d.update(n=n, mul=[m], shf=[e], sm=1)
        return
    sh = min(int(math.floor(math.log2(n))), 32, 31 + e)
    d.update(n=n, mul=[int((m << sh) // n)], shf=[e - sh])


def _weighted_layer(g, op, d, x, pad):
    """layers(): a FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D's weights, bias (a zero
    one where the file has none), per-channel multipliers and a conv's geometry (a
    folded PAD in its padding)."""
    k = d['k']
    sx = [d['sx']]
    w = g.tensors[op.inputs[1]]
    sw, _ = _q(w)
    T = int(np.prod(x.shape)) // int(w.shape[-1]) if k == FC and len(w.shape) == 2 else 1
    if T > 1:
        # an FC over each of T positions (Keras's Dense on [1, T, C]): a 1x1 convolution
        # over a [1, 1, T, C] input, its weights [O, C] the same bytes as [O, 1, 1, C]
        if int(np.prod(x.shape)) != T * int(w.shape[1]) or pad:
            raise ValueError(f'{g.path}: FULLY_CONNECTED op {op.number}: input {list(x.shape)} '
                             f'is not rows of its {w.shape[1]} inputs')
        d['k'] = k = CONV
    if len(op.inputs) < 3 or op.inputs[2] < 0:
        zero_bias(g, op, sx[0], sw)
    elif g.tensors[op.inputs[2]].dtype == 'float32' and g.tensors[op.inputs[2]].data is not None:
        zero_bias(g, op, sx[0], sw, g.tensors[op.inputs[2]])
    b = g.tensors[op.inputs[2]]
    if b.dtype != 'int32':
        raise ValueError(f'{g.path}: bias {b.name!r} of op {op.number} is {b.dtype}, not int32')
    mm = [quantize_multiplier(sx[0] * s / d['sy']) for s in sw]
    d.update(wt=op.inputs[1], bt=op.inputs[2], wn=int(w.data.size), nb=int(b.data.size),
             sw=sw, mul=[m for m, _ in mm], shf=[e for _, e in mm])
    if min(sw) != max(sw):
        d['pc'] = 1                     # per-channel weight scales that differ
    if k == FC:
        d['nin'] = int(w.shape[1])
        return
    if T > 1:
        O, I = w.shape
        d['g'] = [1, T, I, O, 1, 1, 1, 1, 0, 0, 1, T, 1, 1]
        return
    H, W, I = x.shape[1:]
    pt = pb = pl = pr = 0
    if pad:
        H, W, I = g.tensors[pad[0]].shape[1:]
        pt, pb, pl, pr = pad[1:]
    if k == CONV:
        O, KH, KW, _ = w.shape
    else:
        _, KH, KW, O = w.shape
    dh, dw = op.options.get('dilation_h_factor', 1), op.options.get('dilation_w_factor', 1)
    sh, sw_ = op.options.get('stride_h', 1), op.options.get('stride_w', 1)
    where = f'{g.path}: {op.name} op {op.number}'
    OH, ph = out_pad(H + pt + pb, KH, sh, dh, op.options.get('padding', 'SAME'), where)
    OW, pw = out_pad(W + pl + pr, KW, sw_, dw, op.options.get('padding', 'SAME'), where)
    d['g'] = [H, W, I, O, KH, KW, sh, sw_, ph + pt, pw + pl, OH, OW, dh, dw]


def _mark_trained(g, out, train, ranks):
    """layers(): 'train' on the FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D layers
    --train and the ranks {op: rank code} select ('tw': a rank's window of output
    channels, [0, 0] the bias alone), 'back' on every layer after the first of them
    (refused where one cannot pass a gradient back), the masks (masks())."""
    from ..graph.passes import channel_range, RANK_NAMES
    ops_on, rk = _ops_on(g, train, ranks)
    # (a frozen weight is no parameter: spellings.cumsums_to_fc's triangle)
    chosen = [i for i, d in enumerate(out) if d['k'] in TRAINABLE and d['op'] in ops_on
              and not getattr(g.tensors[g.ops[d['op']].inputs[1]], 'frozen', False)]
    bad = sorted(set(ranks) - {g.ops[out[i]['op']].number for i in chosen})
    if bad:
        name = next((op.name for op in g.ops if op.number == bad[0]), 'folded away')
        raise ValueError(f'{g.path}: --ranks names op {bad[0]} ({name}), which '
                         'int8 training cannot train (ranks are for FULLY_CONNECTED, CONV_2D, '
                         'DEPTHWISE_CONV_2D)')
    ranks = rk
    uses = _uses(out)
    for v in uses:      # a shared weight trains with all its uses (utrain.q8share)
        if set(v) & set(chosen):
            chosen = sorted(set(chosen) | set(v))
            if any(ranks.get(out[i]['op']) for i in v):
                raise ValueError(f'{g.path}: --ranks names op {g.ops[out[v[0]]["op"]].number}, whose '
                                 'weight tensor ops ' + ', '.join(str(g.ops[out[i]['op']].number) for i in v)
                                 + ' read (unrolled steps): int8 training trains a shared weight '
                                 'whole (leave these ops out of --ranks, or name them in --train)')
    emb = [i for i, d in enumerate(out) if d['k'] == EMB and d['op'] in ops_on]
    for i in emb:               # an embedding's table that trains (utrain.q8emb)
        out[i]['eg'] = 1
    chosen = sorted(chosen + emb)
    if chosen:
        for i in range(chosen[0] + 1, len(out)):
            d = out[i]
            if d['k'] not in BACK:
                raise ValueError(f'{g.path}: op {g.ops[d["op"]].number} lies between trained '
                                 'layers; int8 training passes no gradient through it (train '
                                 'later layers only, or prepare --dequantize)')
            d['back'] = 1                     # passes the gradient back to a trained layer
            if d['k'] == TCV and d['op'] in ops_on:
                d['xt'] = d['kx'] = 1         # its weights train too (utrain.q8tcv: x kept)
            if d.get('bo') == 7 and d['op'] in ops_on:
                d['ta'] = 1                   # a PRELU's slopes train (utrain.q8slope)
        for i in chosen:
            d = out[i]
            if i in emb:
                continue
            d['train'] = 1
            r = ranks.get(d['op'], 0)
            if r == 1:
                d['tw'] = [0, 0]
            elif r:
                lo, hi = channel_range(r, d['nb'])
                if hi - lo < 1:
                    raise ValueError(f'{g.path}: op {g.ops[d["op"]].number}: rank {RANK_NAMES[r]} of '
                                     f'{d["nb"]} output channels leaves none to train')
                if (lo, hi) != (0, d['nb']):
                    d['tw'] = [lo, hi]
            if r != 1 and d['k'] in (CONV, DW):
                # SGD moves its weights exactly through an int8 fraction each (utrain.q8
                # Layer.wf, q8kern.upek): a convolution's few weights per output (a 1x1
                # expand's 56, a depthwise's 9) carry each update's stochastic-rounding
                # noise into its outputs (MobileNetV2's op 62 at 1/2: int8 2-3 points
                # below float without them); an FC's sum over its many inputs averages it
                d['wf'] = 1
            if r != 1 and len(d['sw']) > 1:
                # its per-channel weight scales grow where its weights reach +-127
                # (utrain.q8grow): clamped there, the update past it was lost
                # (MobileNetV2's op 62 at 1/2: ~1 point of the int8/float gap).  Not a
                # per-tensor layer's (an FC classifier's, which q8grow can double whole):
                # loading q8grow for it alone put the biases 62-65 scheme 4 KB up)
                d['gw'] = 1
        if any(out[i].get('gw') for i in chosen) or getattr(g, 'grow_fc', 0):
            # q8grow is loaded: a per-tensor layer whose weights all train doubles its one
            # scale too (the digits MobileNetV2's op-62 scheme's classifier: 0.8 points).
            # A float model calibrated as int8 (fromfloat, its FCs per-tensor): its weights
            # sit at 1/3 of +-127 and grow as its activation ranges do (issue 28: an MLP on
            # a +-500 input, whose SGD steps move its classifier ~7x, clamped there and
            # learnt 0.47 where float32 learnt 0.85; 0.79 with them growing; prepare_q8
            # leaves them fixed where q8grow's code does not fit the plan)
            for i in chosen:
                if 'tw' not in out[i] and i not in emb:
                    out[i]['gw'] = 1
        for v in uses:
            if out[v[0]].get('train'):
                # one weight tensor read by layers v (Keras's TimeDistributed, an unrolled
                # recurrence): the first holds the weights and their state, the others read
                # them ('sh': its index); one update a step from the sum of their gradients
                # (utrain.q8share); its scales stay (q8grow would move one use's alone)
                for i in v:
                    out[i]['sh'] = v[0]
                    out[i].pop('gw', None)
                    if i != v[0]:
                        out[i].pop('wf', None)
        masks(out, chosen[0])
    return out


def masks(ls, first):
    """Mark ('mask') the FC / CONV_2D / DEPTHWISE_CONV_2D layers of the backward pass
    (from layer first on) whose output no backward step reads as its input (no later
    layer whose weights train, no pool, reads it), but the last, and every ADD (the last
    too: its backward reads the mask alone): they keep a 1-bit mask of where the output
    passed its clamp (utrain.q8sparse) instead of the int8 output, which the arena frees
    after its last forward reader (the Tiny Training Engine's ReLU mask of a layer whose
    bias alone trains)."""
    needs = set()
    for d in ls[first:]:
        tw = d.get('tw')
        if d['k'] in POOLS or d['k'] == LUT or d.get('kx') or (d.get('train') and not (
                tw and tw[1] <= tw[0])):
            needs.update(d['in'])
    for d in ls[first:]:
        # (an ADD's gradient passes both inputs on its mask: a model ending in one,
        # PyTorch's `return a + b`, had none, and the board's backward stopped there)
        if (d['k'] in WEIGHTED and d['out'] not in needs and d is not ls[-1]) or d['k'] == ADD:
            d['mask'] = 1


def _intervals(ls, first, free, groups=()):
    """{tensor: (first layer, last layer, bytes)} each arena tensor is live over; groups:
    (lo, hi, Q8Group)s whose windows live over lo..hi-1 and whose outputs from lo on."""
    n = len(ls)
    last = {}
    for i, fr in enumerate(free):
        for k in fr:
            last[k] = i
    iv = {}
    for i, d in enumerate(ls):
        iv[d['out']] = [i, last.get(d['out'], n), d['nout']]
    for lo, hi, grp in groups:
        for k in grp.win:
            iv[k] = [lo, hi - 1, grp.nbytes(k)]
        for k in grp.outs:
            iv[k][0] = lo
    return iv


def _place(iv):
    """First-fit offsets, biggest first: {tensor: offset}, arena bytes."""
    at, placed = {}, []
    for k in sorted(iv, key=lambda k: (-iv[k][2], k)):
        a, b, n = iv[k]
        n = (n + 3) & ~3
        busy = sorted((o, o + m) for o, m, a2, b2 in placed if a2 <= b and a <= b2)
        off = 0
        for o0, o1 in busy:
            if off + n <= o0:
                break
            off = max(off, o1)
        at[k] = off
        placed.append((off, n, a, b))
    return at, max([o + n for o, n, _, _ in placed] or [0])


BANDED = (CONV, DW, ADD, POOL_MAX, POOL_AVG, LUT)   # the layer kinds utrain.q8bands runs


def _banded_kind(d) -> bool:
    return d['k'] in BANDED and 'sm' not in d      # (a SOFTMAX LUT: not elementwise)


def _bands(ls, first, free, rows=None):
    """[(lo, hi, Q8Group)]: the row-band groups of table ls's frozen layers (below first)
    that make the arena smallest.  Each run of CONV_2D, DEPTHWISE_CONV_2D, same-shape ADD,
    MAX_POOL_2D, AVERAGE_POOL_2D and elementwise LUT layers (the kinds utrain.q8bands
    computes a few rows at a time; a run ends at any other layer: a global pool, a broadcasting op, the trained
    part) is taken from its start in
    groups: the group that lowers the arena most (its end, and rows per band: `rows`, or
    1, 2, 4 or 8), then the next from where it ends, while one lowers it (a group over the
    whole chain of a 224x224 MobileNetV2 holds tens of rows of each 112x112 tensor to make
    one row of its 7x7 output: groups that end at a middle resolution hold less); ties go
    to fewer groups, shorter ones, fewer rows a band."""
    qb = module('q8bands')
    net = qb.standin(ls, free)
    q = type('Q', (), {'first': first, 'meta': {'layers': ls}})
    runs, i = [], 0          # [start of its ungrouped part, end]
    while i < first:
        j = i
        while j < first and _banded_kind(ls[j]):
            j += 1
        if j - i > 1:
            runs.append([i, j])
        i = j + 1
    groups = []
    best = _place(_intervals(ls, first, free))[1]
    more = True
    while more:         # (again while one lowers it: another run's group may have been
        more = False    # what held the arena up when this one's was tried)
        for run in runs:
            i, end = run
            if end - i < 2:
                continue
            cand = None
            for hi in range(i + 2, end + 1):
                for r in ([rows] if rows else (1, 2, 4, 8)):
                    try:
                        grp = qb.Q8Group(q, i, hi, r, net)
                        grp.plan()
                    except (ValueError, KeyError):
                        continue
                    size = _place(_intervals(ls, first, free, groups + [(i, hi, grp)]))[1]
                    if size < best and (cand is None or size < cand[0]):
                        cand = (size, hi, grp)
            if cand is not None:
                best, run[0], grp = cand
                groups.append((i, run[0], grp))
                more = True
    groups.sort(key=lambda g: g[0])
    return groups


def plan(ls, rows=None, wbuf=4096, acc=1024, resident=True, alias=False):
    """The memory plan of layer table ls: arena offsets (with the row-band groups that
    make the arena smallest, _bands; none when rows == 0), the sum buffer's and the weight
    scratch's sizes, the channel chunks of streamed layers.  resident: a band group's
    layers keep their few weights in RAM (else read at each band step, as the other
    frozen layers are once a forward: the prefix cache's pass runs once a sample).
    alias: a streamed conv's output that only a broadcasting MEAN reads ('yg') goes in
    the input-gradient buffer, idle in a forward pass, not in the arena (not under the
    board's scoring pass, utrain.q8fish, which reads it in the backward pass).
    Returns the meta entries."""
    qb = module('q8bands')
    first = module('q8load').lowest(ls)
    free = qb.frees(ls, first)
    groups = _bands(ls, first, free, rows) if rows != 0 else []
    iv = _intervals(ls, first, free, groups)
    at, size = _place(iv)
    banded = {i for lo, hi, _ in groups for i in range(lo, hi)}
    # the shared int32 sum buffer: what a kernel writes at once, a depthwise row, a MEAN,
    # an FC output, a conv row of a chunk of its channels, a SOFTMAX row (utrain.q8smx;
    # pools write int8 straight from their window: none); and at least (up to acc
    # values) a conv's whole output row and (below) the weight-gradient chunk, kept in
    # it (q8load.gwn): a table that wants more than acc gets acc as before (the
    # elementwise kernels' chunks), a small CNN its widest row, not 4 KB it never wrote
    # (the chunks change, none of the integers: a kernel's values are each their own)
    A = max([d['g'][11] * d['g'][3] for d in ls if d['k'] == DW]
            + [d['nout'] for d in ls if d['k'] in (MEAN, FC)]
            + [d['g'][11] for d in ls if d['k'] == CONV]
            + [d['sm'] for d in ls if d.get('sm')]
            + [min(acc, max([MIN_ACC] + [d['g'][11] * d['g'][3] for d in ls if d['k'] == CONV]))])
    # the weight scratch: a frozen depthwise layer's weights (read whole), a row of an FC's
    # or conv's; not a depthwise layer that trains or passes a gradient (its weights held
    # in RAM, utrain.q8 Q8Net: MCUNet's 5x5x576 op 35 had a 14 KB scratch beside them)
    W = max([wbuf] + [d['wn'] for d in ls if d['k'] == DW and not (d.get('train') or d.get('back'))]
            + [d['wn'] // d['nb'] for d in ls if d['k'] in (FC, CONV)])
    Q = 1
    for i, d in enumerate(ls):
        if d['k'] in (FC, CONV):
            row = d['wn'] // d['nb']
            nc = W // row
            if d['k'] == CONV:
                nc = min(nc, A // d['g'][11])
            if nc < d['nb']:
                d['nc'] = nc
            tw = d.get('tw')
            wtrains = d.get('train') and not (tw and tw[1] <= tw[0])
            if (d['wn'] > W and (d.get('back') or d.get('train')) and not wtrains and
                    (d['k'] == FC or pointwise(d['g']))):
                # its weights do not train and the gradient passes it: read a chunk of
                # output channels at a time for the input gradient too (q8sparse.dak),
                # not held in RAM
                d['sd'] = 1
            if (wtrains and tw and tw[1] - tw[0] < d['nb'] and d['wn'] > W and
                    (d['k'] == FC or pointwise(d['g']))):
                # a rank's window of a wide layer: its rows alone held in RAM, the frozen
                # ones read from flash a chunk at a time (forward and input gradient)
                d['pw'] = 1
        if d.get('train') and d['k'] in (FC, CONV):
            # output channels a chunk of the weight gradient holds (utrain.q8 _wgrad)
            row = d['wn'] // d['nb']
            lo, hi = d.get('tw', (0, d['nb']))
            gc = max(1, min(hi - lo, GCHUNK // row))
            if gc < hi - lo:
                d['gc'] = gc
        if resident and i in banded and d['k'] in WEIGHTED:
            d['res'] = 1             # in a band group: its few weights stay in RAM
        elif d['k'] in WEIGHTED and (not d.get('train') or d.get('sd')):
            Q = max(Q, d.get('nc', d['nb']))
    if alias:
        # (a MobileNet's 1x1 head into its global pool: 20 KB of arena at 128x128; its
        # mask bits are what the backward pass reads, the MEAN's gradient a row)
        gb = 4 * module('q8load').gin(ls)
        yg = {d['out'] for i, d in enumerate(ls) if i > first and d.get('sd') and d.get('nc')
              and d['k'] == CONV and i + 1 < len(ls) and module('q8load').bcast(ls, i + 1) and d['nout'] <= gb}
        for d in ls:
            if d['out'] in yg:
                d['yg'] = 1
        if yg:
            iv = {k: v for k, v in iv.items() if k not in yg}
            at, size = _place(iv)
    # Q: the biases / multipliers a frozen layer reads at once (a chunk's, or all)
    if not any('wt' in d and (d.get('sd') or d.get('pw') or not (
            d.get('train') or d.get('back') or d.get('res'))) for d in ls):
        # every layer's weights held in RAM (utrain.q8load: a table without a scratch
        # holds all): none reads the scratch (a streamed layer's chunks, a partial one's
        # frozen rows, their wide kernels' multipliers), 4 KB a small CNN's board lacked
        W = 0
    # and (up to acc, as before) the weight-gradient chunk, and a streamed conv's whole
    # output: the channels a wide chunk of it takes in a training pass (utrain.q8
    # Layer.conv, Q8Net.wide: fewer chunks, each ~1 ms of a Cortex-M0+'s reads); the conv
    # chunks nc above are not bound by them (A // OW: all its channels, or A is acc)
    back = any(d.get('train') or d.get('back') for d in ls)
    A = max([A, min(acc, module('q8load').bufs(ls)[2])] + [
        min(acc, d['nout']) for d in ls if W and back and d['k'] == CONV and 'yg' not in d and (
            d.get('sd') or d.get('pw') or not (d.get('train') or d.get('back') or d.get('res')))])
    return {'arena': size, 'at': [[k, at[k], iv[k][2]] for k in sorted(at)], 'acc': A,
            'wbuf': W, 'qbuf': Q, 'groups': [[lo, hi, g.rows] for lo, hi, g in groups]}


def pointwise(gm) -> bool:
    """Is conv geometry gm a 1x1 convolution at stride 1 without padding (an FC over
    the positions)?"""
    return gm[4] == gm[5] == gm[6] == gm[7] == 1 and gm[8] == gm[9] == 0


def meta(g: Graph, train='last:1', rows=None, ranks=None, alias=False) -> dict:
    """The q8 table: layers, input and output scales, and the memory plan (rows: the
    row-band step, None: chosen, 0: no bands; ranks: as layers(); alias: as plan())."""
    ls = layers(g, train, ranks)
    g.q8_input_scale = relabel_input(g, ls)     # (s, the op numbers: prepare_q8 says so)
    x, y = g.tensors[g.inputs[0]], g.tensors[ls[-1]['out']]
    es = [d for d in ls if d['k'] == EMB]
    ib = max([d['ib'] for d in es] or [1])
    for d in es:            # (one id format for the input: utrain.q8emb, emb_ids)
        d['ib'] = ib
    (sx,), (zx,) = ([1.0], [-128]) if es and not getattr(g, 'joined', None) else _q(x)   # (ids:
    #                bytes at scale 1; beside int8 inputs each part as joined_codes makes it)
    (sy,), (zy,) = _q(y)
    m = {'format': 'utrain-q8', 'version': 2, 'ntensors': len(g.tensors), 'layers': ls,
         'sx': sx, 'zx': zx, 'sy': sy, 'zy': zy,
         'nin': int(np.prod(x.shape)) * (1 if getattr(g, 'joined', None) else ib),   # (joined:
         #  join_inputs gave the ids' part ib bytes a value)
         'nclass': int(np.prod(y.shape)), 'xin': g.inputs[0], 'etab': etab(sy)}
    if _xsizes(ls):
        m['wsizes'] = _xsizes(ls)
    m.update(plan(ls, rows, alias=alias))
    if getattr(g, 'follow_ranges', 0):     # a float model calibrated as int8 (fromfloat)
        # the softmax table on to its zeros (at most ETAB_MAX entries): the logits' range
        # doubled k times reads its entries 2^k d (utrain.q8range)
        m['etab'] = etab(sy, ETAB_MAX)
        rr = follow_ranges(m)
        if rr:
            m['rr'] = rr
        for d in ls:        # every trained weight keeps its update's fraction (Layer.wf):
            if d.get('train') and 'wt' in d:     # no rounding noise (the FCs' too)
                d['wf'] = 1
    elif getattr(g, 'follow_logits', 0):
        # an int8 file: the logits' range (widened by rewritten() if narrow) and its
        # trained layers' output ranges double as training grows them (utrain.q8range),
        # as a float model's calibrated as int8 do: the converter calibrated them on its
        # own data and weights, and a clipped value passes no gradient (the converter's
        # depthwise file under Adam at lr 0.01 ended 10 points under --dequantize with
        # its logits' range alone following, 1 with all)
        rr = follow_ranges(dict(m, etab=etab(sy, ETAB_MAX)))
        if rr:
            m['rr'], m['etab'] = rr, etab(sy, ETAB_MAX)
    return m


def joined_codes(g: Graph, x) -> np.ndarray:
    """Samples x of int8 graph g's inputs joined (inout.join_inputs; one row a sample,
    each input's values in g.data_inputs' order) as the joined input holds them: each
    part quantized at its own input's scale and zero point, the int8 codes as floats (the
    joined input's scale is 1, its zero point 0)."""
    by_name = {t.name: t for t in g.tensors}
    ib, ids = getattr(g, 'ids_ib', 1), getattr(g, 'ids_q8', ())
    out = np.empty((len(x), int(np.prod(g.tensors[g.inputs[0]].shape))), np.float32)
    at = o = 0          # (x's column, out's: an id of 2 bytes takes 2)
    for name, shape, _ in g.data_inputs[0]:
        n = int(np.prod(shape[1:]))
        k = by_name[name].index
        if k in ids:        # (an embedding's ids: the rows, checked; ib bytes each)
            rs = [op for op in g.ops if op.name == 'GATHER' and op.inputs[1] == k]
            part = {'layers': [{'k': EMB, 'en': min(g.tensors[op.inputs[0]].shape[0] for op in rs),
                                'ib': ib, 'ew': int(all(len(op.inputs) > 2 for op in rs))}]}
            out[:, o:o + n * ib] = emb_ids(part, x[:, at:at + n]) - 128
            at, o = at + n, o + n * ib
            continue
        (s,), (z,) = _q(by_name[name])
        out[:, o:o + n] = np.clip(np.round(np.asarray(x[:, at:at + n], np.float64) / s) + z,
                                  -128, 127)
        at, o = at + n, o + n
    return out


def relabel_input(g: Graph, ls: list) -> float:
    """An input far larger than 1 (g.input_rms, the data's: 0..255 pixels into a conv
    whose Keras Rescaling(1/255) the converter folded into its weights) as the float path
    trains it (inscale.scale_input: on the input times s, the weights it reaches / s, whose
    SGD steps are s^2 times smaller; on the file's form SGD diverges).  In int8 that is a
    relabelling of scales: the layers the input reaches (through HOMOGENEOUS ops) read it
    at s x their input scale 'sx' and hold their weights at 'sw' / s: the same integers
    forward (sx sw, the bias scale, and so every multiplier are unchanged, exactly: s is
    a power of two), while QAS's weight step lr dL/dW / s_W (lr sz sx / s_W the gradient's
    integers) and Adam's float masters (the int8 weights times 'sw') become the float
    scaled run's; biases step alike in both.  Only where one of those layers trains; the
    model file keeps its scales (export).  Layer table ls in place; returns (s, the
    relabelled ops' numbers), or (0, []).  Inputs joined (inout.join_inputs): each
    input by its own rms (g.inputs_rms, by data key), s then {key: s} of those relabelled."""
    from ..graph.inscale import input_scale_for
    if getattr(g, 'joined', None):
        rms, by_name = getattr(g, 'inputs_rms', None) or {}, {t.name: t.index for t in g.tensors}
        out, ops = {}, []
        for name, _, key in g.data_inputs[0]:
            s = input_scale_for(rms.get(key))
            got = _relabel(g, ls, by_name[name], s) if s else []
            if got:
                out[key] = s
                ops += got
        return (out, ops) if out else (0, [])
    s = input_scale_for(getattr(g, 'input_rms', None))
    got = _relabel(g, ls, g.inputs[0], s) if s and len(g.inputs) == 1 else []
    return (s, got) if got else (0, [])


def _relabel(g: Graph, ls: list, k: int, s: float) -> list:
    """relabel_input's of tensor k by s: the numbers of the ops relabelled, or []."""
    from ..graph.inscale import scaled_reach
    on = {op.index for op in scaled_reach(g, k, np.int8) or ()}
    ds = [d for d in ls if d['op'] in on and 'wt' in d]
    if not any(d.get('train') for d in ds):
        return []
    if getattr(g, 'optimizer', None) == 'adam':     # (inscale.adam_keeps_scale)
        from ..graph.inscale import adam_keeps_scale
        # (each layer's weights at about their integers' rms times their scales' rms)
        if not adam_keeps_scale([np.sqrt(np.mean(np.square(np.asarray(
                g.tensors[d['wt']].data, np.float64))) * np.mean(np.square(d['sw']))) * 1
                for d in ds], s):
            return []
    for d in ds:
        d['sx'] = d['sx'] * s
        d['sw'] = [v / s for v in d['sw']]
    return [g.ops[d['op']].number for d in ds]


RANGE_EVERY = 8         # utrain.q8range: samples between the checks of the ranges,
RANGE_SHIFT = 6         # and a range doubles when more than 2^-RANGE_SHIFT of its values clip


def follow_ranges(m: dict) -> list | None:
    """q8.json's 'rr' for layer table m (utrain.q8range: the activation ranges that double
    while the model trains): [every, shift, [[producer, [consumers], [clamp bytes]], ...]] of
    each trained FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D layer (one that keeps only
    a mask of its output too: q8range counts its clamp as the mask is made), and each
    MEAN above one, whose output range can double (RANGE_EVERY, RANGE_SHIFT: when to): no clamp
    inside the int8 range but its zero point's (none, or RELU), read through pools and
    resizes only (one scale: utrain.q8rsz's codes do not depend on it) by trained weighted
    layers (a masked one too: the mask is of its output) or MEANs (its multiplier
    doubles, no bias) that take it as their one input, or the logits (the softmax
    table's end zero).  (A conv under a resize had a fixed range: a held-out Keras int8
    file's conv grew its weights 2.5x in float, clipped at its range as int8 and stopped:
    .48 against .87 dequantized.)  None without a layer that can (or with row bands: the
    bands' buffers are not the layers')."""
    ls = m['layers']
    if m.get('groups'):
        return None
    ents = []
    for i, d in enumerate(ls):
        grows = d['k'] in (FC, CONV, DW) and d.get('train') or d['k'] == MEAN and d.get('back')
        if not grows or d.get('sd') or d.get('pw') or d['hi'] != 127 or \
                d['lo'] not in (-128, d['zy']):
            continue
        ts, cs, ok = {d['out']}, [], True
        for j in range(i + 1, len(ls)):
            e = ls[j]
            if not ts & set(e['in']):
                continue
            if (e['k'] in (POOL_MAX, POOL_AVG) or e['k'] == SLC and e.get('rz')) and (
                    e['lo'], e['hi']) == (-128, 127):
                ts.add(e['out'])
            elif (e['k'] in (FC, CONV, DW) and e.get('train') or e['k'] == MEAN) and len(
                    e['in']) == 1 and not (e.get('sd') or e.get('pw')):
                cs.append(j)
            else:
                ok = False
        last = i == len(ls) - 1
        if ok and (cs and not last or last and len(m['etab']) < ETAB_MAX):
            ents.append([i, cs, [127] + ([128] if d['lo'] == -128 and d['zy'] > -128 else [])])
    return [RANGE_EVERY, RANGE_SHIFT, ents] if ents else None


ETAB_MAX = 1024         # the longest softmax table a model whose logits' range doubles gets


def etab(sy: float, n=256) -> list:
    """scce's softmax table for logits at scale sy (utrain.q8 Q8Net.loss): round(2^14
    exp(-sy d)) for the logit differences d = 0..n-1, its zeros at the end left out.
    Made here, not on the board: 256 soft-float exps cost a Cortex-M0+ millions of
    cycles."""
    t = [int(round(16384.0 * math.exp(-sy * d))) for d in range(n)]
    while t and not t[-1]:
        t.pop()
    return t


def wof_arrays(g: Graph, m: dict) -> dict:
    """{tensor: int8/int32 array} of every weight and bias in the layer table."""
    out = {}
    for d in m['layers']:
        for w, b in (('wt', 'bt'), ('xw', 'xb')):   # (xw: a TRANSPOSE_CONV's, utrain.q8tcv)
            if w in d:
                out[d[w]] = g.tensors[d[w]].data
                out[d[b]] = g.tensors[d[b]].data
        if 'et' in d:                               # (an embedding's table: utrain.q8emb)
            out[d['et']] = g.tensors[d['et']].data
    return out


def _xsizes(ls) -> list:
    """meta's 'wsizes' of the weights a layer reads that are not its 'wt' (a
    TRANSPOSE_CONV's 'xw', 'xb': utrain.q8tcv): tensor, bytes, ..."""
    return [v for d in ls if 'xw' in d for v in (d['xw'], d['wn'], d['xb'], 4 * d['nb'])] + [
        v for d in ls if 'et' in d for v in (d['et'], d['en'] * d['ed'])]


def split(g: Graph, m: dict, rows=None, alias=False):
    """(prefix table, trained table) of table m cut at the first trained layer's input, or
    where that layer's block reads more than one tensor from below it, at the nearest
    layer under it whose input is the one tensor the layers above read (a residual
    block's input): the prefix (the frozen layers below the cut, their output that
    tensor) runs once per sample into a cache (utrain.q8prefix), the trained part takes
    the cache's samples."""
    import copy
    ls = m['layers']
    top = min([i for i, d in enumerate(ls) if d.get('train') or d.get('eg')] or [0])

    def one(first):         # does the part from layer first on start from one tensor?
        cut = ls[first]['in'][0]
        made = {d['out'] for d in ls[first:]}
        return ls[first - 1]['out'] == cut and not any(
            k != cut and k not in made and not ('kc' in d and k == d['in'][d['kp']])
            and k not in [c for c, _ in d.get('kt', ())]
            for d in ls[first:] for k in d['in'])           # (kc, kt: a constant input)
    # the lowest trained layer inside a residual block (its skip reads a tensor from
    # below it): cut at the block's input, the frozen layers from there run each step
    first = next((j for j in range(top, 0, -1) if one(j)), 0)
    if not first:
        raise ValueError('the trained layers do not start from one tensor the frozen layers '
                         'end with: no prefix cache')
    cut = ls[first]['in'][0]
    (sc,), (zc,) = _q(g.tensors[cut])
    pre = [copy.deepcopy(d) for d in ls[:first]]
    for d in pre:
        d.pop('nc', None), d.pop('res', None), d.pop('sd', None), d.pop('pw', None)
    post = [copy.deepcopy(d) for d in ls[first:]]
    for d in post:
        d.pop('nc', None), d.pop('res', None), d.pop('sd', None), d.pop('pw', None)
    base = {k: m[k] for k in ('format', 'version', 'ntensors')}
    # the .wof holds both parts' tensors: tensor, bytes of each in one flat list, for its
    # header check (a list of pairs: 106 small lists, 3.9 KB parsed on a 32-bit board
    # for MobileNetV2, against 1 KB)
    base['wsizes'] = [v for d in ls if 'wt' in d
                      for v in (d['wt'], d['wn'], d['bt'], 4 * d['nb'])] + _xsizes(ls)
    p = dict(base, layers=pre, sx=m['sx'], zx=m['zx'], sy=sc, zy=zc, nin=m['nin'],
             nclass=ls[first - 1]['nout'], xin=m['xin'])
    p.update(plan(pre, rows, resident=False))
    t = dict(base, layers=post, sx=sc, zx=zc, sy=m['sy'], zy=m['zy'],
             nin=ls[first - 1]['nout'], nclass=m['nclass'], xin=cut, etab=m['etab'])
    t.update(plan(post, 0, alias=alias))
    return p, t


def write(g: Graph, folder, train='last:1', m=None, tables=None) -> dict:
    """q8.json, q8.req and weights.wof (int8 weights as int8 bytes, int32 biases) in
    folder; m: the layer table (meta), made when not given; tables: {file name: table}
    to write instead of q8.json (a prefix and a trained part).  The layers that do not
    train keep their per-channel multipliers and shifts in q8.req (int32
    little-endian, a layer's multipliers then its shifts, at its 'ro'), not in q8.json,
    and a layer that trains or passes a gradient its weight scales after them (float32,
    'fs'): JSON's numbers are boxed objects on a board."""
    m = m or meta(g, train)
    outs, req = as_written(m, tables)
    os.makedirs(folder, exist_ok=True)
    for name, out in outs.items():
        atomic_write(os.path.join(folder, name), json.dumps(out).encode())
    if req:
        atomic_write(os.path.join(folder, 'q8.req'), bytes(req))
    hwof.write_wof(os.path.join(folder, 'weights.wof'), len(g.tensors), wof_arrays(g, m),
                   keep_dtype=True)
    return m


def as_written(m: dict, tables=None):
    """({file name: table as the board reads it}, q8.req's bytes) of layer table m (or
    of tables, a prefix and a trained part): what write() writes, and what the heap
    plan (memory.plan_heap_q8) prices."""
    req = bytearray()
    outs = {}
    luts = {}       # a LUT's tables' bytes: their offset (the same op at the same scales, as
    #                 an unrolled RNN's gates at each step: one copy, shared on the board)
    for name, t in (tables or {'q8.json': m}).items():
        out = outs[name] = dict(t, layers=[])
        rr = t.get('rr')
        follow = {i for p, cs, _ in rr[2] for i in [p] + cs} if rr else set()
        for i, d in enumerate(t['layers']):
            d = dict(d)
            if d['k'] == LUT and 't' in d:
                # a LUT layer's tables: 256 int8 outputs, then 256 int16 derivatives (in a
                # list, a board boxes each: 530 KB of a Bidirectional LSTM's 80 gates)
                b = (np.asarray(d.pop('t'), np.int8).tobytes()
                     + np.asarray(d.pop('dt'), '<i2').tobytes())
                if b not in luts:
                    luts[b] = len(req)
                    req += b
                d['lt'] = luts[b]
            if 'wt' in d:
                d['ro'], d['nq'] = len(req), len(d['mul'])
                req += np.asarray(d.pop('mul'), '<i4').tobytes()
                req += np.asarray(d.pop('shf'), '<i4').tobytes()
                if d.get('back') or d.get('train'):   # its weight scales, float32, after them
                    sw = np.asarray(d.pop('sw'), '<f4')
                    req += sw.tobytes()
                    d['fs'] = 1
                    if len(sw) > 1 and sw.min() != sw.max():
                        # then dz's per-channel rescaling for the input gradient, sw[o] /
                        # max(sw) as multipliers and shifts (q8.py _rescale reads them a
                        # scratch at a time: made on the board, each cost thousands of cycles)
                        mx = float(sw.max())
                        ms = [quantize_multiplier(float(v) / mx) for v in sw]
                        req += np.asarray([m for m, _ in ms], '<i4').tobytes()
                        req += np.asarray([e for _, e in ms], '<i4').tobytes()
                    if d.get('train') and len(sw) > 1:
                        # then SGD's integer bias step's per-channel factor min(sw) / sw[o]
                        # (utrain.q8 _bias: one multiplier lr sz / (sx bsm) for all
                        # channels, then these: no float step a channel on the board)
                        d['bh'] = 5 if sw.min() != sw.max() else 3
                        d['bsm'] = float(sw.min())
                        ms = [quantize_multiplier(float(sw.min()) / float(v)) for v in sw]
                        req += np.asarray([m for m, _ in ms], '<i4').tobytes()
                        req += np.asarray([e for _, e in ms], '<i4').tobytes()
                else:
                    del d['sw']
            for k in ('sx', 'sy', 's2', 'op', 'hw'):  # (the board needs them only to train,
                if not (d.get('train') or d.get('xt')) and not (i in follow and k in ('sx', 'sy')):
                    d.pop(k, None)                      # and a range that doubles its scales)
            out['layers'].append(d)
    for out in outs.values():
        if req:
            out['req'] = 'q8.req'
            out['reqb'] = len(req)      # (its size: one cut short is refused on the board)
    return outs, req


def read_q8_wof(path, g: Graph, m: dict) -> dict:
    """The int8 weights and int32 biases of a q8 .wof for graph g (checked by the
    device reader)."""
    import io
    dev = module('wof')
    with open(path, 'rb') as f:
        data = f.read()
    nb = [None] * len(g.tensors)
    for d in m['layers']:
        if 'wt' in d:
            nb[d['wt']], nb[d['bt']] = d['wn'], 4 * d['nb']
    try:
        offs = dev.read_table(io.BytesIO(data), path, nb, nb)[0]
    except dev.FormatError as e:
        from ..files.wof import _what_to_do
        raise ValueError(f'{e}{_what_to_do(path, e, int8=True)}') from None
    out = {}
    for k, o in enumerate(offs):
        if o:
            t = g.tensors[k]
            dt = np.int8 if t.dtype == 'int8' else np.dtype('<i4')
            out[k] = np.frombuffer(data[o:o + nb[k]], dt).reshape(t.shape).copy()
    return out


def export(model_path, wof_path, out_path, train='last:1', run=None, output=None,
           calibrated=False) -> str:
    """The int8 model with the trained int8 weights and int32 biases of wof_path, every
    scale, zero point and layout as in model_path (after the int8 rewrites prepare ran:
    rewritten(), a grouped convolution joined again; run: prepare.json's, as numbered()).  output:
    of a model with several outputs, the trained one's place (prepare.json's); every
    input and output written as the file has them.  calibrated: model_path is the int8
    model prepare calibrated from a float one (fromfloat), whose graph rewrites are done."""
    from ..graph.inout import save_graph, compact, choose_output, file_graph
    from ..graph.groups import join_groups
    from ..graph.embeddings import embedding_ids_back
    from .runfolder import out_identifier
    from .recal import replay
    g0 = read_model(model_path)
    ints = {g0.tensors[k].name: g0.tensors[k].dtype for k in g0.inputs}
    if len(g0.outputs) > 1:
        choose_output(g0, output)
    g0.calibrated = calibrated
    g = rewritten(numbered(g0, run))
    replay(g, os.path.dirname(os.path.abspath(wof_path)))    # (prepare's recalibration)
    m = meta(g, train)
    trained = read_q8_wof(wof_path, g, m)
    for k, a in trained.items():
        g.tensors[k].data = a
    followed(g, m, wof_path)
    grown(g, m, wof_path, trained)
    sloped(g, m, wof_path)
    tconved(g, m, wof_path)
    embedded(g, m, wof_path)
    ids8 = getattr(g, 'ids_q8', ())
    for k in ids8:          # (ids beside int8 inputs: floats, then the file's ints, at
        t = g.tensors[k]    # the file's shape: join_inputs gave 2-byte ids 2 values each)
        t.dtype, t.quant, t.shape = 'float32', None, getattr(t, 'file_shape', t.shape)
    if any(d['k'] == EMB for d in m['layers']) and not ids8:   # (the ids as the file reads them)
        embedding_ids_back(g, ints)
    g = file_graph(g)       # (several: every input apart and every output, the file's)
    if ids8:
        embedding_ids_back(g, ints)
    _transpose_back(g)
    _ends_back(g, g0)
    if join_groups(g)[1]:               # (a grouped convolution as the file has it)
        compact(g)
    g.identifier = out_identifier(out_path, g.identifier)
    return save_graph(g, out_path)


def _ends_back(g: Graph, g0: Graph) -> None:
    """export: the float inputs' QUANTIZEs and the float outputs' DEQUANTIZEs that
    _float_ends took out of the rewritten graph g go back in, as file g0 has them (the
    tensors keep their indices), so the written model takes and gives what the file did."""
    q = {op.outputs[0]: op for op in g0.ops if op.name == 'QUANTIZE' and op.inputs[0] in g0.inputs}
    d = {op.inputs[0]: op for op in g0.ops if op.name in ('DEQUANTIZE', 'QUANTIZE')
         and op.outputs[0] in g0.outputs and _exit(g0, op)}
    back = [q[k] for k in g.inputs if k in q]
    g.ops[0:0] = back
    g.ops += [d[k] for k in g.outputs if k in d]
    for op in back + [d[k] for k in g.outputs if k in d]:
        g.tensors[op.outputs[0] if op in back else op.inputs[0]].sig = None
    g.inputs = [q[k].inputs[0] if k in q else k for k in g.inputs]
    g.outputs = [d[k].outputs[0] if k in d else k for k in g.outputs]
    for k in g.inputs + g.outputs:
        g.tensors[k].sig = g0.tensors[k].sig


def _side(g: Graph, p, tag, ok, what, file_what) -> None:
    """A side file a run wrote beside trained.wof (utrain.q8kern side_save: tag, then per
    tensor u32 its index, u32 its bytes, the bytes) into g's tensors; ok {tensor: bytes}
    the ones it may hold; what / file_what name them in a refusal."""
    if not os.path.exists(p):
        return
    try:        # (each layer the run trains must be there, as the board requires: one cut
        got = module('q8kern').side_load(p, tag, ok)    # at a record had left the model's)
    except ValueError as e:
        raise ValueError(f'{p}: not {file_what} of this model ({str(e).split(": ", 1)[-1]})') from None
    for k, v in got.items():        # (side_load read it whole: tag, records, no tail)
        if ok.get(k) != len(v):
            raise ValueError(f'{p}: tensor {k} ({len(v)} bytes) is not {what} of this model '
                             f'(prepare writes {os.path.basename(p)} beside the run)')
        t = g.tensors[k]
        t.data = np.frombuffer(v, np.int8 if t.dtype == 'int8' else '<i4').reshape(t.shape).copy()


def embedded(g: Graph, m: dict, wof_path) -> None:
    """The embedding tables a run trained (wof_path + '.q8e', utrain.q8emb: b'UTEM', int8
    rows) into g's table tensors."""
    _side(g, wof_path + '.q8e', b'UTEM', {d['et']: d['en'] * d['ed'] for d in m['layers']
                                          if d.get('eg')}, 'a trained embedding table',
          'the trained embedding tables')


def sloped(g: Graph, m: dict, wof_path) -> None:
    """The PRELU slopes a run trained (wof_path + '.q8a', utrain.q8slope: b'UTPA', then
    per layer u32 its alpha tensor, u32 its values, int8 each) into g's alpha tensors."""
    _side(g, wof_path + '.q8a', b'UTPA', {d['in'][1]: len(d['kc']) for d in m['layers'] if d.get('ta')},
          'a trained PRELU alpha', 'the trained PRELU slopes')


def tconved(g: Graph, m: dict, wof_path) -> None:
    """The TRANSPOSE_CONV weights and biases a run trained (wof_path + '.q8c',
    utrain.q8tcv: b'UTTC', int8 weights, int32 biases) into g's tensors."""
    _side(g, wof_path + '.q8c', b'UTTC', {k: n for d in m['layers'] if d.get('xt') for k, n in (
        (d['xw'], d['wn']), (d['xb'], 4 * d['nb']))}, 'a trained TRANSPOSE_CONV weight or bias',
        'the trained TRANSPOSE_CONV weights')


SAME_SCALE = ('MAX_POOL_2D', 'AVERAGE_POOL_2D', 'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS',
              'RESIZE_BILINEAR', 'RESIZE_NEAREST_NEIGHBOR')


def followed(g: Graph, m: dict, wof_path) -> None:
    """The activation ranges a run doubled while it trained (wof_path + '.q8s', exponents
    utrain.q8range wrote beside the weights) put into int8 graph g (layer table m), its
    biases read from wof_path (at the calibrated scales): each range's tensors (its
    producer's output, the pools' and reshapes' after it) scale x 2^k, its consumers' biases to the
    bias scale x 2^k as the board holds them.  Nothing without the file."""
    p = wof_path + '.q8s'
    if not os.path.exists(p):
        return
    try:
        with open(p) as f:
            ex = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f'{p}: not readable ({e}); the run writes it beside {wof_path}') from None
    # the ranges the run followed: its q8.json's (beside the weights), else the table's
    # (every int8 file's logits follow; a float model calibrated as int8 follows more:
    # its graph read back here is not marked so) whose count is the file's
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(wof_path)), 'q8.json')) as f:
            rr = json.load(f).get('rr')
    except (OSError, ValueError, AttributeError):
        rr = None
    if not rr:
        cands = [r for r in (m.get('rr'), follow_ranges(m)) if r]
        rr = next((r for r in cands if isinstance(ex, list) and len(r[2]) == len(ex)),
                  cands[0] if cands else None)
    if not rr or not isinstance(ex, list) or len(ex) != len(rr[2]) or not all(
            isinstance(k, int) and 0 <= k <= 8 for k in ex):
        raise ValueError(f'{p}: not the ranges of this model ({len(rr[2]) if rr else 0} '
                         'exponents 0..8 expected); remove it to export at the calibrated ranges')
    ls = m['layers']
    for (i, cs, _), k in zip(rr[2], ex):
        if not k:
            continue
        ts, n = {ls[i]['out']}, 0
        while n != len(ts):         # and the pools' and shape ops' after it (one scale)
            n = len(ts)
            for op in g.ops:
                if op.name in SAME_SCALE and op.inputs[0] in ts:
                    ts.update(op.outputs)
        for t in ts:
            q = g.tensors[t].quant
            q['scale'] = [float(v) * 2 ** k for v in q['scale']]
        for c in cs:
            if 'bt' not in ls[c]:
                continue            # (a MEAN: TFLite Micro's multiplier follows the scales)
            b = g.tensors[ls[c]['bt']]
            b.data = ((b.data.astype(np.int64) + (1 << (k - 1))) >> k).astype(np.int32)
            b.quant = dict(b.quant, scale=[float(v) * 2 ** k for v in b.quant['scale']])


def grown(g: Graph, m: dict, wof_path, trained=None) -> None:
    """The weight scales a run doubled while it trained (wof_path + '.q8w', utrain.q8grow
    wrote it beside the weights, which are at those scales: b'UTGW', then per layer u32
    weight tensor, u32 count, a byte each, the exponent of each output channel's scale
    or of a per-tensor layer's one) put into int8 graph g (layer table m): each weight
    tensor's scale and its bias tensor's x 2^k.  Nothing without the file.  trained: the
    tensors wof_path holds; each growing layer's among them must be in the file, as the
    board requires them (utrain.q8kern side_load reads it for both)."""
    p = wof_path + '.q8w'
    if not os.path.exists(p):
        return
    with open(p, 'rb') as f:
        data = f.read()
    by = {d['wt']: d for d in m['layers'] if 'wt' in d}
    bad = f'{p}: not the weight scales of this model; remove it only if {wof_path} was not trained with it'
    if data[:4] != b'UTGW' or len(data) < 12:     # (its tag alone: cut short, unsaid)
        raise ValueError(bad + ('' if data[:4] != b'UTGW' else ' (cut short: no layer in it)'))
    # the layers the board grew (utrain.q8grow Grow.ls: its q8.json's marked 'gw', whose
    # weights trained): a per-tensor one only trained whole, which a board's own choice
    # (--select board) may not have made
    chose = _beside(wof_path, 'train.json').get('select') is not None
    table = _beside(wof_path, 'q8.json').get('layers')
    want = {}
    for d in table if isinstance(table, list) else m['layers']:
        k = d.get('wt') if isinstance(d, dict) else None
        if d.get('gw') if k in by else False:
            n = len(g.tensors[k].quant['scale'])
            if (trained is None or k in trained) and (n > 1 or not ('tw' in d or chose)):
                want[k] = n
    try:
        got = module('q8kern').side_load(p, b'UTGW', want)
    except ValueError as e:
        raise ValueError(f'{bad} ({str(e).split(": ", 1)[-1]})') from None
    for k, e in got.items():
        e = list(e)
        d = by.get(k)
        if not d or len(e) != len(g.tensors[k].quant['scale']) or max(e) > 30:
            raise ValueError(bad + f' (tensor {k})')
        n = len(e)
        for t in (d['wt'], d['bt']):
            q = g.tensors[t].quant
            sc = [float(v) for v in q['scale']]
            if len(sc) == 1 and n > 1:
                sc = sc * n
            q['scale'] = [s * 2 ** v for s, v in zip(sc, e if n == len(sc) else e * len(sc))]


def _beside(wof_path, name) -> dict:
    """The JSON file name beside wof_path ({} when there is none or it is not an object)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(wof_path)), name)) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return {}
    return c if isinstance(c, dict) else {}


def trained_params(ls) -> int:
    """Weights and biases that train in layer table ls (a rank's window of them; a
    tensor several layers read, once), PRELU slopes and TRANSPOSE_CONV weights."""
    n = sum(len(d['kc']) for d in ls if d.get('ta')) + sum(d['wn'] + d['nb'] for d in ls if d.get('xt'))
    n += sum(d['en'] * d['ed'] for d in ls if d.get('eg'))     # (embedding tables)
    seen = set()
    for d in ls:
        if d.get('train'):
            oc = d['nb']
            lo, hi = d.get('tw', (0, oc))
            n += (0 if d['bt'] in seen else hi - lo if hi > lo else oc) + (
                0 if d['wt'] in seen else (hi - lo) * (d['wn'] // oc))
            seen.update((d['wt'], d['bt']))
    return n


def planned(g: Graph, s: dict, train, cache=False, bands=None, board=None, ranks=None,
            alias=True):
    """(layer table, {file: table} or None, heap plan) of an int8 run: the tables as
    write() writes them, priced by memory.plan_heap_q8 (alias: as plan()'s, never under
    the board's scoring pass).  ValueError: the model does not train as int8 that way
    (prepare says why)."""
    from ..plan.memory import plan_heap_q8
    alias = alias and not s.get('select')   # (the board's scoring pass reads what it aliases)
    m = meta(g, train, bands, ranks, alias)
    tables = None
    if cache:                # the board computes the frozen prefix once per sample
        p, t = split(g, m, bands, alias)
        tables = {'q8.json': p, 'q8t.json': t}
    outs = json.loads(json.dumps(as_written(m, tables)[0]))     # as the board parses them
    heap = plan_heap_q8(outs, s, board)
    if bands is None and banded(m, tables):     # bands only where they lower the plan
        m0, t0, h0 = planned(g, s, train, cache, 0, board, ranks, alias)
        if h0['total'] <= heap['total']:
            return m0, t0, h0
    return m, tables, heap


def banded(m, tables) -> bool:
    """Does the run compute some frozen layers in row bands (its table, or its prefix's)?"""
    return bool(m.get('groups') or (tables and any(t.get('groups') for t in tables.values())))


def unbanded_if_it_fits(g, s, train, cache, board, limit, m, tables, heap, model_path, log,
                        ranks=None):
    """Row bands chosen by prepare (--bands not given), as the float path chooses them:
    planned() keeps them only where they lower the plan; under a budget or board, only
    when the plan does not fit without them (a banded step costs time: the DS-CNN's int8
    last:2 step 1.8x on a Pico).  Returns the run to write: (table, tables, heap)."""
    try:
        m0, t0, h0 = planned(g, s, train, cache, 0, board, ranks)
    except ValueError:
        return m, tables, heap
    lim = limit(h0) if limit else None
    if h0['total'] <= heap['total'] or (lim is not None and h0['total'] <= lim):
        return m0, t0, h0
    log(f'{model_path}: row bands: the frozen early layers are computed a few rows at a time '
        f'(about {heap["total"] // 1024} KB planned; {h0["total"] // 1024} KB without them'
        + (f', over the {lim // 1024} KB limit' if lim is not None else '') + '; --bands 0: never)')
    return m, tables, heap


def unaliased_if_it_fits(g, s, train, cache, bands, board, limit, m, tables, heap, ranks=None,
                         model_path='', log=lambda t: None):
    """planned() writes a streamed conv's output that only a MEAN reads in the idle
    input-gradient buffer (plan()'s alias); under a budget or board only when the plan does
    not fit without it, nor with the state dropped that costs nothing (state_where_it_fits'
    'ns': scales no step reads): that conv's forward then reads its weights a scratch's
    chunk at a time (MobileNetV2's head: 36 chunks for 13, ~1 ms each on a Pico; w62 on a
    Pico 322 ms a sample with it, 288 without it and 'ns', the smallest heap on 32-bit unix
    MicroPython 189 KB and 188 KB: the alias and 'ns' each save ~7 KB at the peak).
    Returns the run to write: (table, tables, heap)."""
    if not limit or not any(d.get('yg') for t in (tables or {0: m}).values() for d in t['layers']):
        return m, tables, heap
    try:
        m0, t0, h0 = planned(g, s, train, cache, bands if banded(m, tables) else 0, board,
                             ranks, False)
    except ValueError:
        return m, tables, heap
    lim = limit(h0)
    if lim is not None and h0['total'] > lim:
        m0, t0, h0, _ = state_where_it_fits(g, s, board, limit, m0, t0, h0, model_path, log,
                                            ('ns',))
        lim = limit(h0)
    return (m0, t0, h0) if lim is not None and h0['total'] <= lim else (m, tables, heap)


def state_where_it_fits(g, s, board, limit, m, tables, heap, model_path, log, keys=None):
    """SGD state over the plan's limit, dropped until the plan fits (issue 29), in this
    order: at batch 1 the float weight scales of the layers whose bias alone trains, in
    integers (q8.json 'ns', all at once: no step reads them, the same integers; a
    MobileNetV2's four: 7 KB; momentum drops them anyway); momentum's int16 weight
    velocities (utrain.q8mom, 2 bytes a trained weight; a MobileNetV2 classifier's 25 KB;
    'nv': those weights step without momentum, the biases and the other weights with
    it), a layer at a time, the largest first; then the convolutions' int8 weight
    fractions (dropping 'wf', 1 byte a trained weight; op 62 whole's 18 KB: those
    updates stochastically rounded, as an FC's, instead of exact), the same way.  Said in
    the log, named in the summary ('no_velocity', 'no_fractions'); left as they were where
    dropping all of them does not fit either (keys: only those kinds).  Returns (table,
    tables, heap, {'nv' / 'wf': the weight tensors dropped})."""
    from ..plan.memory import plan_heap_q8, q8_trained_weights
    lim = limit(heap) if limit else None
    if lim is None or heap['total'] <= lim or s['optimizer'] != 'sgd':
        return m, tables, heap, {}
    ts = [m] + list((tables or {}).values())
    ls = ts[-1]['layers']
    own = [d for i, d in enumerate(ls) if d.get('train') and 'wt' in d and d.get('sh', i) == i
           and q8_trained_weights(d)]
    wl = as_written(m, tables)[0]['q8t.json' if tables else 'q8.json']['layers']    # ('bh', 'fs')
    ns = [d for d in wl if d.get('train') and 'wt' in d and not q8_trained_weights(d)
          and 'bh' in d and d.get('fs') and d['k'] <= DW and not d.get('gw')]
    cands = [('ns', sum(4 * d['nq'] for d in ns), [d['wt'] for d in ns])] if ns and int(s['batch']) == 1 and not s.get('momentum') and not (
        ts[-1].get('rr')) else []
    # (momentum: int8 velocities first, the largest first, then none from the lowest layer
    # up, the one nearest the loss last, after the fractions and the bias velocities: on
    # MobileNetV2 w62, one seed, momentum with both layers' weight velocities .827, the
    # classifier's alone .816, op 62's alone .825, neither .683, plain SGD .702.  Session 15
    # (h44a), seeds 1-3, bench.sparse's task: dropping the classifier's first instead makes
    # w62 + momentum keep op 62's int8 velocities and the bias velocities, 234.0 KB against
    # this order's 228.3, and trains to .830 / .742 / .720 against .806 / .825 / .725; on
    # MCUNet op 36 at 1/8 op 36's alone .748 / .758 / .628, the classifier's .727 / .648 /
    # .666: no order better beyond the seeds' spread, this one the smaller plan)
    cands += sorted([('v8', q8_trained_weights(d) - 1, [d['wt']]) for d in own
                     if s.get('momentum')], key=lambda c: -c[1])
    nv = [('nv', q8_trained_weights(d) + 1, [d['wt']]) for d in own if s.get('momentum')]
    nbv = [d for d in ls if d.get('train') and 'wt' in d] if s.get('momentum') and int(
        s['batch']) == 1 else []
    cands += nv[:-1] + sorted([('wf', q8_trained_weights(d), [d['wt']]) for d in own
                               if d.get('wf')], key=lambda c: -c[1]) + (
        [('nbv', sum(4 * d['nb'] for d in nbv), [d['wt'] for d in nbv])] if nbv else []) + nv[-1:]
    cands = [c for c in cands if keys is None or c[0] in keys]

    def mark(key, wts, on):
        for t in ts:
            for d in t['layers']:
                if d.get('wt') in wts:
                    if key == 'nv' and on:
                        d.pop('v8', None)
                    if (key == 'wf') != on:
                        d[key] = 1
                    else:
                        d.pop(key, None)
    done = []
    what = {'ns': 'no float weight scales of a bias-only layer (no step reads them: the same '
                  'integers)',
            'v8': "int8 weight velocities instead of int16 (a layer's 2^e 1/256-steps, rounded "
                  'stochastically)',
            'nv': 'no weight velocities (those weights step without momentum; the biases and '
                  'the other weights keep theirs)',
            'wf': 'no int8 weight fractions (those updates stochastically rounded, as an FC\'s, '
                  'instead of exact)',
            'nbv': 'no bias velocities (the biases step without momentum)'}
    for c in cands:
        done.append(c)
        mark(c[0], c[2], True)
        h = plan_heap_q8(json.loads(json.dumps(as_written(m, tables)[0])), s, board)
        if h['total'] <= limit(h):
            said = []
            for key in ('ns', 'v8', 'nv', 'wf', 'nbv'):
                wts = [wt for k, _, w in done if k == key for wt in w]
                gone = [wt for k, _, w in done if k == 'nv' for wt in w]
                if key == 'v8':     # (dropped after: no velocities at all)
                    wts = [wt for wt in wts if wt not in gone]
                ops = sorted({g.ops[d['op']].number for d in ls if d.get('wt') in wts})
                if ops:
                    kb = sum(2 * (n - 1) if key == 'nv' else n      # (nv: the int16 ones)
                             for k, n, w in done if k == key and (key != 'v8' or w[0] not in gone)
                             ) / 1024
                    said.append(f'op{"s" if len(ops) > 1 else ""} {", ".join(map(str, ops))} '
                                f'keep{"" if len(ops) > 1 else "s"} {what[key]}'
                                + (f', {kb:.1f} KB' if kb else ''))
            log(f'{model_path}: SGD\'s state is over the {lim // 1024} KB limit (about '
                f'{heap["total"] // 1024} KB planned): ' + '; '.join(said) + f'; about '
                f'{h["total"] // 1024} KB' + ('; --momentum 0: none has momentum'
                                              if s.get('momentum') else ''))
            out = {k: [wt for k2, _, w in done if k2 == k for wt in w]
                   for k in ('v8', 'nv', 'wf', 'nbv')}
            out['v8'] = [wt for wt in out['v8'] if wt not in out['nv']]
            return m, tables, h, out
    for c in done:
        mark(c[0], c[2], False)
    return m, tables, heap, {}


def settled(g: Graph, s: dict, train, cache, bands, board, limit, ranks=None, model_path='',
            log=lambda t: None, start=None):
    """The int8 run prepare writes for these settings, and what its plan is: planned()
    (start: its (table, tables, heap) where the caller has it), then under a limit
    (limit(heap) -> bytes, or None) row bands dropped where the plan fits without them
    (--bands not given), the alias dropped where that fits, SGD state dropped until it
    fits.  prepare_q8, fit_options and fit_advice all plan through it, so that an option
    the advice names plans, given, the figure the advice said (the EI MobileNetV1 96 on
    rp2040 had been advised --batch 1 --cache --train last:4 at 163 KB, the prefix pass in
    bands, and prepare with those flags planned 227 KB: the bands dropped as it fits).
    Returns (table, tables, heap, {'nv' / 'wf' / ...: the weight tensors dropped})."""
    m, tables, heap = start or planned(g, s, train, cache, bands, board, ranks)
    if bands is None and banded(m, tables):
        m, tables, heap = unbanded_if_it_fits(g, s, train, cache, board, limit, m, tables, heap,
                                              model_path, log, ranks)
    m, tables, heap = unaliased_if_it_fits(g, s, train, cache, bands, board, limit, m, tables,
                                           heap, ranks, model_path, log)
    return state_where_it_fits(g, s, board, limit, m, tables, heap, model_path, log)


def fit_advice(g: Graph, s: dict, train, cache, bands, board, limit, heap, ranks=None) -> list:
    """Lines naming settings whose int8 run fits limit(heap) (bytes): batch 1, SGD, SGD
    without momentum, with momentum the layers at a channel ratio training their biases
    alone (momentum's velocities: one a trained weight), the prefix cache, fewer layers
    trained (--train last:N over the model's ops).  Each is planned as prepare plans it
    given those flags (settled: row bands only where the plan needs them, SGD state
    dropped where that fits), at the figure prepare will plan, saying where the frozen
    layers run in row bands or state is dropped to fit."""
    from ..graph.passes import RANK_NAMES
    from ..plan.memory import LONGEST, longest_last, short_of
    ranks = ranks or None       # (prepare hands {} where no --ranks was given)
    cands = []
    if int(s['batch']) > 1:
        cands.append(({'batch': 1}, train, cache, ranks))
    if s['optimizer'] != 'sgd':
        cands.append(({'optimizer': 'sgd'}, train, cache, ranks))
    elif s.get('momentum'):
        cands.append(({'momentum': 0.0}, train, cache, ranks))
        if ranks and any(v > 1 for v in ranks.values()):
            cands.append(({}, train, cache, {k: 1 if v > 1 else v for k, v in ranks.items()}))
    cheap = {'batch': 1, 'optimizer': 'sgd', 'momentum': 0.0}
    if not cache:
        cands.append((cheap, train, True, ranks))
    for c in sorted({bool(cache), True}):      # (the longest last:N that fits, bisected)
        cands.append((cheap, LONGEST, c, None))
    out, seen, deeper = [], set(), {}   # deeper: cache -> the plan of a longer last:N that fits
    for change, tr, c, rk in cands:
        s2 = dict(s, **change)
        if tr is LONGEST:
            def total(t, s2=s2, c=c):
                m, _, h, _ = settled(g, s2, t, c, bands, board, limit)
                return (h['total'], limit(h)) if any(d.get('train') for d in m['layers']) \
                    else None
            tr = longest_last(len(g.ops), total, None)
            if tr is None:
                continue
        new = [k for k in change if (s.get(k) or 0) != change[k]]
        desc = ' '.join(['--batch 1'] * ('batch' in new) + ['--optimizer sgd'] * ('optimizer' in new)
                        + ['--momentum 0'] * ('momentum' in new and 'optimizer' not in new)
                        + ['--cache'] * (c and not cache) + [f'--train {tr}'] * (tr != train)
                        + ['--ranks ' + ','.join(f'{k}:{RANK_NAMES[v]}' for k, v in sorted(rk.items()))
                           for _ in range(tr == train and bool(rk) and rk != ranks)])
        if not desc or desc in seen:
            continue
        seen.add(desc)
        try:
            m, tb, h, dropped = settled(g, s2, tr, c, bands, board, limit, rk)
        except ValueError:
            continue
        if any(d.get('train') for d in m['layers']) and h['total'] <= limit(h):
            if tr != train and tr.startswith('last:'):
                if c in deeper and h['total'] >= deeper[c] - 1024:
                    continue    # trains less than a longer last:N that fits for as much
                deeper[c] = h['total']
            # (what prepare then does to fit that the flags do not say, as it will say it)
            how = ['the frozen early layers computed in row bands'] * (
                bands is None and banded(m, tb)) + [
                what for k, what in (('v8', 'int8 weight velocities'),
                                     ('nv', 'some weights stepping without momentum'),
                                     ('wf', 'some weights without int8 fractions'),
                                     ('nbv', 'the biases stepping without momentum'))
                if dropped.get(k)]
            out.append(f'  would fit: {desc}  (about {h["total"] // 1024} KB)'
                       + (' with ' + ' and '.join(how) if how else ''))
            if len(out) >= 3:
                break
    from ..target.runner import roomier
    return out or ['  nothing tried fits: ' + short_of(heap, limit(heap)) + roomier(heap)]


class HeapRefusal(PrepareError):
    """The int8 run's heap plan exceeds the board's heap or the budget; int8_fits: some
    other int8 settings fit (the message names them), else prepare may train the model
    dequantized instead, where that fits."""
    int8_fits = False


def float_takes(g: Graph, train) -> bool:
    """Does prepare's float path (--dequantize) train int8 model g with --train train?"""
    from ..plan.runplan import select_rewrite_plan
    try:
        return bool(select_rewrite_plan(g, train, {})[-1].params)
    except Exception:           # noqa: BLE001 (any refusal of the float path: it does not)
        return False


def refusal(g: Graph, model_path, why: str, train) -> str:
    """An int8 path refusal: the model's file named once, and --dequantize when the float
    path trains the model."""
    msg = why if why.startswith(f'{g.path}: ') else f'{model_path}: {why}'
    if float_takes(g, train) and '--dequantize' not in msg:
        msg += '; --dequantize trains it in float32 (export --quantized writes it back as int8)'
    return msg


def inspect_lines(g: Graph) -> list:
    """What `inspect` says of an int8 model: how prepare trains it (as int8, or why not
    and whether --dequantize does) and its int8 parameters."""
    n = sum(int(np.prod(t.shape)) for t in g.tensors if t.data is not None and t.quant
            and t.dtype in ('int8', 'int32'))
    out = [f'int8 model: {n} parameters (int8 weights, int32 biases, with scales)']
    try:
        gr = rewritten(g)
        ls = layers(gr, 'all')
        # (the file's ops: a grouped conv's layers, one per group, are one)
        n = len({gr.ops[d['op']].number for d in ls if d.get('train')})
        pr = sum(1 for d in ls if d.get('ta'))
        out.append('prepare trains it as int8 (int8 weights, integer forward, QAS updates): '
                   f'{n} FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D layers can train'
                   + (f' and {pr} PRELU\'s slopes (a layer below it training)' if pr else '')
                   + ' (--train last:N); --dequantize trains it in float32 instead (the rewrites above)')
    except ValueError as e:
        out.append('prepare does not train it as int8: ' + refusal(g, g.path, str(e), 'all'))
    return out


def per_layer_cost(g: Graph, m, heap) -> list:
    """['  most of it: ...'] where the int8 net's per-layer parts (q8.json's parsed table and
    the layer objects: a dict and an object a layer, whatever its size) are the largest
    share of the plan beside the code, naming the layer count and, where a WHILE loop was
    unrolled (its steps' layers share the loop's op number), the loop: issue 28's Keras
    GRU(6) over 8 steps is 160 int8 layers, 60 + 56 KB of a 311 KB plan (a measured need of
    265 KB on the 32-bit unix build: not a planner error), where the float run's flat model
    is 25 KB.  Else []."""
    parts, ls = heap['parts'], m['layers']
    per = sum(v for k, v in parts.items() if k.startswith(('layer table', 'layer objects')))
    rest = max([v for k, v in parts.items() if not k.startswith(
        ('layer table', 'layer objects', 'code', 'interpreter'))] or [0])
    if per < 16384 or per <= rest:
        return []
    nums = [g.ops[d['op']].number for d in ls if 0 <= d.get('op', -1) < len(g.ops)]
    steps = max([nums.count(n) for n in set(nums)] or [0])
    loop = (' (a loop unrolled: %d of them are the steps of one op of the file, each '
            'step\'s ops layers of their own)' % steps) if steps >= 8 else ''
    return [f'  most of it: {len(ls)} int8 layers{loop}, their table and layer objects '
            f'{per // 1024} KB (a dict and an object a layer, whatever its size)']


def fit_options(g: Graph, model_path, s, train, cache, bands, board, limit, heap, given, log,
                ranks=None):
    """prepare.fit_options for an int8 run: the options the user left to prepare (given:
    the ones set on the command line) that bring the plan within limit(plan): --cache (the frozen
    prefix runs first on a net of its own), --batch 1, each alone, else both.  Returns
    (table, tables, heap, settings, cache, the state dropped: settled()) or None."""
    free = [n for n in ('cache', 'batch') if n not in given and not (
        (n == 'cache' and cache) or (n == 'batch' and int(s['batch']) == 1))]
    tries = [[n] for n in free] + ([free] if len(free) > 1 else [])
    for names in tries:
        s2 = dict(s, batch=1) if 'batch' in names else s
        c2 = True if 'cache' in names else cache
        said = []   # (planned as the same flags given are: settled; said if chosen)
        try:
            m, tables, h, dropped = settled(g, s2, train, c2, bands, board, limit, ranks,
                                            model_path, said.append)
        except ValueError:
            continue
        if h['total'] <= limit(h):
            for line in said:
                log(line)
            flags = ['--cache'] * ('cache' in names) + ['--batch 1'] * ('batch' in names)
            log(f'{model_path}: the int8 plan ({heap["total"] // 1024} KB) is over the '
                f'{limit(h) // 1024} KB limit; prepare chose {" ".join(flags)} (about '
                f'{h["total"] // 1024} KB): '
                + '; '.join(['--cache: the frozen layers run once per sample in the first '
                             'epoch, on a net of their own'] * ('cache' in names)
                            + ['--batch 1: each sample updates at once'] * ('batch' in names))
                + ' (give the flag yourself to decide otherwise)')
            return m, tables, h, s2, c2, dropped
    return None


def prepare_q8(g: Graph, model_path, out_dir, s: dict, train, data=None, test_split=0.0,
               split_seed=0, progress=None, cache=False, bands=None, board=None,
               limit=None, why_limit='', log=print, given=None, ranks=None) -> dict:
    """prepare's int8 path: q8.json, weights.wof (int8), the samples as int8 at the model
    input's scale and zero point (a sample's bytes are the model's input), train.json
    naming q8.json as the model.  s: the resolved settings; board: what the heap plan is
    for; limit(heap): the heap it must fit (prepare.heap_limit; why_limit names the
    budget or board), refused with advice beyond it.  ranks {op: rank code}: the sparse
    update (layers())."""
    from .runfolder import (FILES, OUTPUTS, budget_short, check_flash, check_outputs, int8_bytes,
                            read_data, run_defaults, set_aside_earlier_run, write_data,
                            write_run_config)
    from ..plan.memory import plans_by_target, plan_heap_q8
    g = regressed(g, s)
    if sigmoid_loss(g, s) != getattr(g, 'sigmoid_loss', False):
        g = copy.deepcopy(g)
        g.sigmoid_loss = sigmoid_loss(g, s)
        if getattr(g, 'q8_rewritten', False):
            _widen_logits(g)            # (its logits: the LOGISTIC's input now)
    g = rewritten(g)
    why = settings_refusal(s, g)
    if why:
        raise PrepareError(f'{model_path}: {why}')
    if cache == 'host':
        raise PrepareError(f'{model_path}: an int8 model\'s prefix cache is made by the board '
                           '(--cache); --cache-on-host is for the float path (--dequantize)')
    n0 = len(g.tensors)
    try:
        m, tables, heap = planned(g, s, train, cache, bands, board, ranks)
        lim = limit(heap) if limit is not None and getattr(g, 'grow_fc', 0) else None
        if lim is not None and heap['total'] > lim:
            g.grow_fc = 0       # (fromfloat's per-tensor FCs: scales that grow, or a fit)
            got = planned(g, s, train, cache, bands, board, ranks)
            if got[2]['total'] <= (limit(got[2]) or 0):
                log(f'{model_path}: its FULLY_CONNECTED weight scales stay as calibrated (3x '
                    f'their largest weight): growing them (utrain.q8grow) is over the '
                    f'{lim // 1024} KB limit{why_limit}')
                m, tables, heap = got
            else:
                g.grow_fc = 1
    except ValueError as e:
        raise PrepareError(refusal(g, model_path, str(e), train)) from None
    fb = [t for t in g.tensors[n0:] if t.name.endswith('/int32')]
    if fb:                              # zero_bias(fb): a float32 bias quantized
        ops = [op for op in g.ops if any(t.index in op.inputs[2:4] for t in fb)]
        log(f'{model_path}: {len(fb)} float32 biases of int8 ops (ops '
            f'{", ".join(str(op.number) for op in ops[:6])}{" .." if len(ops) > 6 else ""}: '
            "tico's int8 export) train as int32 at the input scale x the weight scale, as "
            "TFLite's converter quantizes a bias; export writes them so")
    said = {}                           # (an unrolled loop's steps: one line a name)
    for t in g.tensors[n0:]:            # zero_bias: the ops the file gave no bias
        ops = [op for op in g.ops if t.index in op.inputs[2:4] and t.name.endswith('/zero_bias')]
        if ops:
            said.setdefault(t.name, (t, []))[1].extend(ops)
    for t, ops in said.values():
        nums = sorted({op.number for op in ops})
        if len(nums) < len(ops):
            log(f'{model_path}: op{"s" if len(nums) > 1 else ""} {", ".join(map(str, nums))} '
                f'(a loop\'s steps: {len(ops)} {ops[0].name}) without a bias tensor train with '
                f'a zero int32 bias ({t.name}), which export writes into the trained model')
            continue
        log(f'{model_path}: op{"s" if len(ops) > 1 else ""} {", ".join(str(op.number) for op in ops)} '
            f'{ops[0].name} ha{"ve" if len(ops) > 1 else "s"} no bias tensor: '
            f'{"they train" if len(ops) > 1 else "it trains"} with a zero int32 bias ({t.name}), '
            'which export writes into the trained model')
    why = frozen_named(g, train if not ranks else 'none')
    if why:
        log(f'{model_path}: {why}: they stay as the file has them (--dequantize trains them too)')
    if not any(d.get('train') or d.get('eg') for d in m['layers']):
        from ..graph.passes import reach_hint
        raise PrepareError(refusal(g, model_path, 'nothing to train as int8 (no FULLY_CONNECTED, '
                                   f'CONV_2D or DEPTHWISE_CONV_2D among --train {train})' +
                                   reach_hint([(op.number, op.name) for op in g.ops],
                                              getattr(g, 'nfile', len(g.ops)), train), train))
    xs, on = getattr(g, 'q8_input_scale', (0, []))
    if isinstance(xs, dict):        # (inputs joined: each by its own)
        for key, sc in xs.items():
            log(f'{model_path}: input {key!r}\'s root mean square is {g.inputs_rms[key]:.4g} '
                f'on {data}: it trains as int8 on it times {sc:g}, as the float path does (the '
                f'layers it reaches read it at {sc:g} x its int8 scale and hold their weights '
                f'at {1 / sc:g} x theirs: the same integers, whose QAS steps are '
                f'1/{1 / sc ** 2:g} of those on the input as given); the model file keeps its '
                'scales')
    elif xs:
        one = len(on) == 1
        ops = ('op %s reads' if one else 'ops %s read') % ', '.join(map(str, on))
        log(f'{model_path}: its input\'s root mean square is {g.input_rms:.4g} on {data}: it '
            f'trains as int8 on the input times {xs:g}, as the float path does ({ops} it at '
            f'{xs:g} x its int8 scale and hold{"s" if one else ""} {"its" if one else "their"} '
            f'weights at {1 / xs:g} x theirs: the same integers, whose QAS steps are '
            f'1/{1 / xs ** 2:g} of those on the input as given); the model file keeps its scales')
    shape = g.tensors[g.inputs[0]].shape        # (4-D: samples laid out as it takes them)
    emb = any(d['k'] == EMB for d in m['layers'])
    nin = int(np.prod(shape)) if emb else m['nin']      # (ids: as given, then emb_ids)
    if emb and getattr(g, 'joined', None):      # (as the data gives them: 2-byte ids, one)
        nin = sum(int(np.prod(sh[1:])) for _, sh, _ in g.data_inputs[0])
    perm = getattr(g, 'input_perm', None) if int(np.prod(shape)) == nin else None
    xy = read_data(data, shape if int(np.prod(shape)) == nin else [nin], m['nclass'], perm,
                   loss=s['loss'], inputs=getattr(g, 'data_inputs', None))
    from ..files.validate import one_class_warning, same_inputs_warning
    warn = same_inputs_warning(data, xy and xy[0])
    if warn:
        log(warn)
    warn = one_class_warning(data, s, xy and xy[1], m['nclass'])
    if warn:
        log(warn)
    if xy is not None and getattr(g, 'joined', None):
        try:
            xy = (joined_codes(g, xy[0]),) + tuple(xy[1:])
        except ValueError as e:
            raise PrepareError(f'{data}: {e}') from None
    if emb and xy is not None and not getattr(g, 'joined', None):
        try:
            xy = (emb_ids(m, xy[0]),) + tuple(xy[1:])
        except ValueError as e:
            raise PrepareError(f'{data}: {e}') from None
    from . import recal
    steps = []
    if xy is not None and not getattr(g, 'follow_ranges', 0):
        # the trained layers' output ranges on the training samples (recal: widened
        # where they clip; the same shapes, so the same plan), before anything is chosen
        from ..files.dataset import split as split_idx
        tr, _ = split_idx(len(xy[0]), test_split, split_seed)
        steps = recal.recalibrate(g, xy[0][tr], train, ranks, meta, wof_arrays,
                                  log=lambda t: log(f'{model_path}: {t}'))
        if steps:
            m, tables, heap = planned(g, s, train, cache, bands, board, ranks)
    m, tables, heap, dropped = settled(g, s, train, cache, bands, board, limit, ranks, model_path,
                                       log, (m, tables, heap))
    lim = limit(heap) if limit else None
    if lim is not None and heap['total'] > lim and given is not None:
        m, tables, heap, s, cache, dropped = fit_options(
            g, model_path, s, train, cache, bands, board, limit, heap, given, log, ranks) or (
            m, tables, heap, s, cache, dropped)
        lim = limit(heap)
    if lim is not None and heap['total'] > lim:
        parts = ', '.join(f'{k} {v // 1024} KB' for k, v in heap['parts'].items() if v >= 1024)
        advice = fit_advice(g, s, train, cache, bands, board, limit, heap, ranks)
        short = None if why_limit else budget_short(model_path, f'{lim // 1024}K', heap, lim,
                                                     advice)
        e = HeapRefusal(short or '\n'.join(
            [f'{model_path}: training as int8 needs about {heap["total"] // 1024} KB of heap, '
             f'the budget is {lim // 1024} KB{why_limit}.', f'  planned: {parts}']
            + per_layer_cost(g, m, heap) + advice))
        e.int8_fits = any(a.startswith('  would fit') for a in advice)
        raise e
    # the samples as int8 at the model input's scale and zero point, beside the int8
    # tables the board stores (not the model file: a float model's is 4 times larger)
    check_flash(model_path, xy, 'int8', board, int8_bytes(g), dict(
        layers=m['layers'], optimizer=s['optimizer'], momentum=s['momentum'],
        cache=tables['q8t.json'] if tables and cache != 'host' else None))
    check_outputs(out_dir, (model_path, data), OUTPUTS + ('q8.json', 'q8.req', 'q8t.json'))
    set_aside_earlier_run(out_dir, log)
    cal = os.path.join(out_dir, recal.FILE)
    for f in os.listdir(out_dir) if os.path.isdir(out_dir) else ():
        if f.endswith('.q8.pfx'):        # a cache of samples this prepare replaces
            os.remove(os.path.join(out_dir, f))
    outs = json.loads(json.dumps(as_written(m, tables)[0]))
    over = {}
    from ..plan.memory import save_reserve, target
    reserve = save_reserve(heap, target(board))     # (held on every target the run is on)
    heap['by_target'] = plans_by_target(lambda t: plan_heap_q8(outs, s, t, reserve), over)
    if over:                # (boards whose heap the plan exceeds: prepare's --select note)
        heap['over_boards'] = over
    write(g, out_dir, train, m, tables)
    if steps:                           # (export replays them on the model file)
        atomic_write(cal, json.dumps(steps).encode())
    elif os.path.exists(cal):
        os.remove(cal)
    files = dict(FILES, model='q8.json', rewritten=None)
    if cache:
        files.update(model='q8t.json', prefix='q8.json')
    if any('wt' in d for d in m['layers']):
        files['quant'] = 'q8.req'        # (deploy copies it with the model)
    trained = [t for d in m['layers'] if d.get('train') for t in (d['wt'], d['bt'])] + [
        d['in'][1] for d in m['layers'] if d.get('ta')] + [     # (PRELU slopes: utrain.q8slope)
        t for d in m['layers'] if d.get('xt') for t in (d['xw'], d['xb'])] + [   # (q8tcv)
        d['et'] for d in m['layers'] if d.get('eg')]      # (an embedding's table: q8emb)
    summary = {'model': os.path.abspath(model_path), 'int8': True, 'train': train,
               'trainable': {g.tensors[k].name: list(g.tensors[k].shape) for k in trained},
               'trainable_params': trained_params(m['layers']),
               'rewritten': None, 'quant': {}, 'heap': heap, 'input_scale': xs,
               'input_perm': perm,      # (the samples as the board's input takes them)
               # output channels lo:hi of the layers whose weights train in part (or not)
               'ranks': {g.tensors[d['wt']].name: d['tw'] for d in m['layers'] if 'tw' in d}}
    for key, name in (('v8', 'int8_velocity'), ('nv', 'no_velocity'), ('wf', 'no_fractions'),
                      ('nbv', 'no_bias_velocity')):
        if dropped.get(key):    # (state_where_it_fits: without momentum, without fractions)
            summary[name] = sorted(g.tensors[wt].name for wt in dropped[key])
    if g.nfile != len(g.ops) or any(op.number != op.index for op in g.ops):
        # the op numbers of the user's file (export reads the run's int8 model with them)
        summary.update(op_numbers=[op.number for op in g.ops], file_ops=g.nfile)
    if getattr(g, 'sigmoid_loss', False):   # (export's table: the final LOGISTIC the loss's)
        summary['sigmoid_loss'] = True
    if getattr(g, 'regression', False):     # (export's: the output's range as trained)
        summary['regression'] = True
    if getattr(g, 'as_file', None):     # several inputs or outputs (as the float path's)
        from ..plan.runplan import io_summary
        summary.update(io_summary(g))
    rwi = getattr(g, 'rewrites', None) or {}
    if rwi.get('changed'):
        summary['rewrites'] = {k: v for k, v in rwi.items() if k not in ('quant', 'changed')}
    if getattr(g, 'joined', None) and not getattr(g, 'ids_q8', ()):
        # (each input's codes at its own scale, as joined_codes stores them: evaluate
        # scores the run's samples as values, infer._stored_parts)
        by_name = {t.name: t for t in g.tensors}
        summary['inputs_stored'] = {key: [float(sc), -float(z) * float(sc)] for name, _, key
                                    in g.data_inputs[0] for (sc,), (z,) in [_q(by_name[name])]}
    summary.update(write_data(out_dir, xy, files, s['loss'], test_split, split_seed, 'int8',
                              m['sx'], -m['zx'] * m['sx']))
    if given is not None:       # (prepare's: a --select trial's settings stay as given)
        s = run_defaults(s, given, summary.get('train_samples'), log, model_path)
    return write_run_config(out_dir, files, s, summary, progress, on_nan='stop',
                            **({'planned': heap['total']} if lim is not None else {}),
                            **({'save_reserve': reserve} if reserve else {}))
