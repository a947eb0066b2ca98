"""Float models trained in integers (issue 33): on a board without ulab every float is a
boxed soft-float object (thousands of cycles a multiply-add on an RP2040), while the int8
path (host_tools/prepare/quant.py, utrain.q8) runs its loops in viper or Thumb assembler.  prepare
calibrates an int8 version of a float model from the samples it was given and trains that
on the int8 path (integer forward, QAS updates); export dequantizes the trained integers
back into the float model (or writes the int8 one with --quantized).

The calibration is export --quantized --data's (host_tools/prepare/exportcheck.py): the float
model's activation ranges over the training samples (utrain's own float kernels, op by op)
become asymmetric int8 scales (ops that keep their input's scale share one), the weights
per-output-channel symmetric int8 (max |w| / 127), the biases int32 at input scale x weight
scale, SOFTMAX's output TFLite's 1/256 and -128."""
from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile

import numpy as np

from ..formats.circle_io import Graph, read_model
from .exportcheck import POSITIONS      # (a TRANSPOSE_CONV's x, w, bias: 2, 1, 3)

# an .onnx model trains in float32 only: export writes the .onnx back, and an int8 .onnx
# (QDQ) is no file the int8 path reads or writes
ONNX_WHY = ('an .onnx model: export writes .onnx from float32 training only (for int8 '
            'training give the model as a .circle (PyTorch through tico) or a .tflite)')
INT8_MODEL = 'int8.circle'          # the calibrated int8 model, beside the run's files
FLOAT_MODEL = 'float.circle'        # the float graph it came from (rewritten), for export
WEIGHTED = {'FULLY_CONNECTED': 0, 'CONV_2D': 0, 'DEPTHWISE_CONV_2D': 3,   # op: channel axis
            'TRANSPOSE_CONV': 0}


def why_not(s: dict, cache=False, model_path=None) -> str | None:
    """What in the settings s keeps the int8 path from training float model model_path
    (None: any) (None: nothing): what quant.prepare_q8 refuses, said for a float model."""
    from .quant import LOSSES, softmax_end
    from ..formats.onnx_io import is_onnx
    if model_path and is_onnx(model_path):     # (first: no setting changes it)
        return ONNX_WHY
    if s['loss'] not in LOSSES:
        return f'--loss {s["loss"]} (the int8 path takes {", ".join(LOSSES)})'
    if s['loss'] in ('mse', 'mae', 'bce') and model_path and softmax_end(read_model(model_path)):
        return (f'--loss {s["loss"]} on a model ending in SOFTMAX (the int8 path leaves it '
                'to scce or cce)')
    if s['loss'] == 'bce' and not s.get('from_logits') and (
            model_path is None or not softmax_end(read_model(model_path), 'LOGISTIC')):
        return ('--loss bce on outputs that are not a final sigmoid\'s (the int8 path takes '
                'bce on the logits: a model ending in a sigmoid, or --from-logits)')
    if s['optimizer'] not in ('sgd', 'adam') or (s.get('momentum') and s['optimizer'] != 'sgd'):
        return f'--optimizer {s["optimizer"]}' + (f' momentum {s["momentum"]}' if s.get('momentum')
                                                   else '') + ' (the int8 path: sgd, adam)'
    if s.get('weight_decay') or s.get('schedule', 'constant') != 'constant' or s.get('warmup'):
        return 'weight decay or a learning-rate schedule (the int8 path has neither)'
    if cache == 'host':
        return '--cache-on-host (the int8 path caches on the board: --cache)'
    return None


# ops whose int8 output scale TFLite's kernels fix (TANH and LOGISTIC had kept the
# placeholder scale 1.0 here: a tanh at 3 levels, and the layers tied to it too)
FIXED_OUT = {'SOFTMAX': (1 / 256, -128), 'LOGISTIC': (1 / 256, -128), 'TANH': (1 / 128, 0)}


def _requantize_fixed(og: Graph) -> None:
    """A fixed-scale output (FIXED_OUT) that a CONCATENATION reads is requantized first
    by a QUANTIZE op to a tensor of its own, as TFLite's converter writes it: the
    concatenation's inputs and output then share one scale (TFLite Micro's int8
    CONCATENATION copies bytes: inputs at other scales read wrong), measured over the
    others' ranges too.  og.requantized: {new tensor name: the fixed output's}."""
    from ..formats.circle_io import OP_CODES, Operator
    from ..graph.edit import new_tensor, renumber
    og.requantized = {}
    for op in list(og.ops):
        if op.name not in FIXED_OUT:
            continue
        y = op.outputs[0]
        cats = [o for o in og.ops if o.name == 'CONCATENATION' and y in o.inputs]
        if not cats:
            continue
        t = og.tensors[y]
        k = new_tensor(og, t.name + '/requantized', t.shape, like=y)
        og.tensors[k].quant = {'scale': [1.0], 'zero_point': [0]}
        og.requantized[og.tensors[k].name] = t.name
        for c in cats:
            c.inputs = [k if i == y else i for i in c.inputs]
        og.ops.insert(og.ops.index(op) + 1, Operator(-1, OP_CODES['QUANTIZE'], 'QUANTIZE',
                                                      [y], [k], {}, src=op.number))
    renumber(og)


ELEMENTWISE = ('ADD', 'SUB', 'MUL', 'DIV')   # by a constant: int8 constants at their own
#                                           range (utrain.q8bin; x / c: _divisions)
CLIPS = ('MAXIMUM', 'MINIMUM')  # by a constant: at the scale of its input and output


def _one_constant(g: Graph, op, dtype='float32') -> int:
    """The position of op's one constant operand (of dtype) beside an activation, or -1."""
    ts = [g.tensors[k] for k in op.inputs]
    if len(ts) != 2 or (ts[0].data is None) == (ts[1].data is None):
        return -1
    p = 0 if ts[0].data is not None else 1
    return p if ts[p].dtype == dtype else -1


def _clips(og: Graph) -> int:
    """MAXIMUM and MINIMUM of an activation and a constant as TFLite's int8 kernels run
    them, back from the float path's spelling (spellings.elementwise_forms: MAXIMUM(a, b) ->
    b + RELU(a - b), MINIMUM(a, b) -> a - RELU(a - b): three int8 ops, each rounding, the
    RELU's range 0 where no calibration sample reached the bound, its scale then none).
    The SUB becomes the op (its number, the user's), the RELU and the ADD / SUB go; their
    tensors stay, unused (the float graph's indices).  Returns how many."""
    from ..formats.circle_io import OP_CODES
    from ..graph.edit import renumber
    readers = {}
    for op in og.ops:
        for k in op.inputs:
            readers.setdefault(k, []).append(op)
    made = {k: op for op in og.ops for k in op.outputs}
    done = 0
    for sub in list(og.ops):
        if sub.name != 'SUB' or _one_constant(og, sub) < 0 or \
                sub.options.get('fused_activation_function', 'NONE') != 'NONE':
            continue
        a, b = sub.inputs
        rs = readers.get(sub.outputs[0], [])
        if len(rs) != 1 or rs[0].name != 'RELU' or sub.outputs[0] in og.outputs:
            continue
        relu = rs[0]
        ls = readers.get(relu.outputs[0], [])
        if len(ls) != 1 or relu.outputs[0] in og.outputs or len(ls[0].inputs) != 2 or \
                ls[0].options.get('fused_activation_function', 'NONE') != 'NONE':
            continue
        last = ls[0]
        r = relu.outputs[0]

        def same(k, j):         # (k is j, or its copy: edit.own)
            t, u = og.tensors[k], og.tensors[j]
            return k == j or (t.data is not None and u.data is not None and k not in made
                              and np.array_equal(t.data, u.data))
        if last.name == 'ADD' and r in last.inputs and same(last.inputs[1 - last.inputs.index(r)], b):
            name = 'MAXIMUM'
        elif last.name == 'SUB' and last.inputs[1] == r and same(last.inputs[0], a):
            name = 'MINIMUM'
        else:
            continue
        sub.name, sub.code, sub.outputs, sub.options = name, OP_CODES[name], list(last.outputs), {}
        og.ops.remove(relu)
        og.ops.remove(last)
        done += 1
    renumber(og)
    return done


SPREAD = 1.5          # an input range wider than this x its clip's output range: requantized


def _requantize_clips(og: Graph, ranges: dict) -> list:
    """The activation input of a MAXIMUM or MINIMUM by a constant whose range (ranges:
    {name: (lo, hi)}, the widened ones) spans more than SPREAD times its output's is
    requantized first by a QUANTIZE op to a tensor of its own at the output's range, as
    TFLite's quantizer writes an op whose inputs and output share one scale: tied to its
    input, a clip's output had the input's steps (a Dense's output clipped to -1..6 at
    the Dense's -24..28: 4x coarser than its own range gives it).  Nothing a clip passes
    on is lost (the output saturates where the requantized input does).  ranges gets the
    new tensors'; returns their names."""
    from ..formats.circle_io import OP_CODES, Operator
    from ..graph.edit import new_tensor, renumber

    def span(n, more=()):
        lo, hi = ranges[n]
        return max(0.0, hi, *more) - min(0.0, lo, *more)
    made = []
    for op in list(og.ops):
        p = _one_constant(og, op, 'int8') if op.name in CLIPS else -1
        if p < 0:
            continue
        a, y = og.tensors[op.inputs[1 - p]], og.tensors[op.outputs[0]]
        if a.name not in ranges or y.name not in ranges or \
                span(a.name) <= SPREAD * span(y.name):
            continue
        k = new_tensor(og, a.name + '/requantized', a.shape, like=a.index)
        og.tensors[k].quant = {'scale': [1.0], 'zero_point': [0]}
        ranges[og.tensors[k].name] = ranges[y.name]
        op.inputs[1 - p] = k
        og.ops.insert(og.ops.index(op), Operator(-1, OP_CODES['QUANTIZE'], 'QUANTIZE', [a.index],
                                                 [k], {}, src=getattr(op, 'src', op.number)))
        made.append(og.tensors[k].name)
    renumber(og)
    return made


def _divisions(og: Graph) -> int:
    """Each DIV of an activation by a float constant c becomes the MUL by 1 / c (float32):
    TFLite's int8 MUL (TFLite has no int8 DIV; TFLite Micro's div.cc needs three tables
    of the divisor's 256 codes a layer, where a MUL's constant is one array), quantized
    at 1 / c's own range as any MUL constant; the float graph keeps its DIV and c (export
    writes them: frozen, nothing of it trains).  ValueError: c holds a zero.  Returns how
    many."""
    from ..formats.circle_io import OP_CODES
    done = 0
    for op in og.ops:
        if op.name != 'DIV' or _one_constant(og, op) != 1:
            continue
        t = og.tensors[op.inputs[1]]
        c = np.asarray(t.data, np.float64)
        if not np.all(c != 0):
            raise ValueError(f"DIV op {getattr(op, 'src', op.number)} divides by constant "
                             f"{t.name!r}, which holds a zero")
        t.data = (1 / c).astype(np.float32)
        op.name, op.code = 'MUL', OP_CODES['MUL']
        done += 1
    return done


def _constants(g: Graph) -> tuple[set, set, set]:
    """The tensors of float graph g that int8_graph types other than as activations,
    weights and biases: (constants an activation is added to, subtracted from,
    multiplied or divided by, or compared with (a Keras Normalization layer's SUB of the
    mean, MUL by 1 / std, at the input or mid-network; c - x, c / x; a clip's bound),
    float tables a GATHER reads rows of (an Embedding), the ids it reads them by (the
    model input, float ids: embeddings.embedding_gathers, done on g here) and tensors no op
    uses any more (the float path's spelling of a clip, _clips))."""
    from ..graph.embeddings import embedding_gathers
    embedding_gathers(g)        # (the ids' CAST and SELECT_V2 go: the GATHER reads the input)
    consts, tables, ids = set(), set(), set()
    used = {k for op in g.ops for k in (*op.inputs, *op.outputs)}
    ids.update(t.index for t in g.tensors if t.index not in used)
    for op in g.ops:
        ts = [g.tensors[k] for k in op.inputs]
        if op.name in ELEMENTWISE + CLIPS and _one_constant(g, op) >= 0:
            consts.add(op.inputs[_one_constant(g, op)])
        elif op.name == 'GATHER' and len(ts) >= 2 and ts[0].data is not None and \
                ts[0].dtype == 'float32' and ts[1].data is None:
            tables.add(ts[0].index)
            ids.add(ts[1].index)
    return consts, tables, ids


def quantize_constant(a, q: dict) -> np.ndarray:
    """Float constant a as int8 at one asymmetric scale over its range and 0, as TFLite's
    converter writes an elementwise op's constant; q (its quant) is set."""
    a = np.asarray(a, np.float64)
    lo, hi = min(0.0, float(a.min())), max(0.0, float(a.max()))
    s = (hi - lo) / 255 or 1.0
    z = int(min(127, max(-128, round(-128 - lo / s))))
    q.update(scale=[float(np.float32(s))], zero_point=[z])
    return np.clip(np.round(a / np.float32(s)) + z, -128, 127).astype(np.int8)


def int8_graph(g: Graph) -> tuple[Graph, dict]:
    """A copy of float graph g typed as an int8 model, its scales still to be set
    (exportcheck.recalibrate): activations int8 with one scale, weights of CONV_2D /
    DEPTHWISE_CONV_2D int8 with a scale per output channel (FULLY_CONNECTED: one), their
    biases int32, SOFTMAX's
    output at TFLite's fixed 1/256, -128.  Returns (graph, {name: float weight or bias}).
    ValueError when g is not a plain float model."""
    og = copy.deepcopy(g)
    trained = {}
    weights = {}
    _clips(og)
    _divisions(og)
    consts, tables, ids = _constants(og)
    clips = {op.inputs[_one_constant(og, op)] for op in og.ops if op.name in CLIPS and
             _one_constant(og, op) >= 0}
    states = set()      # constant data inputs: a recurrent layer's zero state (below)
    for op in og.ops:
        if op.name in WEIGHTED and len(op.inputs) > 1:
            weights[op.inputs[1]] = (op, WEIGHTED[op.name])
            xp, _, bp = POSITIONS.get(op.name, (0, 1, 2))
            if len(op.inputs) > bp and op.inputs[bp] >= 0:
                weights[op.inputs[bp]] = (op, None)
            if og.tensors[op.inputs[xp]].data is not None:
                states.add(op.inputs[xp])
    for t in og.tensors:
        if t.index in ids:
            continue                    # (an Embedding's ids: int32, read as ids)
        if t.index in states and t.index not in weights and t.dtype == 'float32':
            # the data input of a weighted op is a constant: Keras's GRU (reset_after)
            # applies its recurrent layer, bias b_hh inside, to the zero state in its first
            # step (h0 = 0).  An int8 constant activation at its own range: the int8 path
            # reads it into the layer ('kt', quant._check_reads); the weight's gradient
            # from it is x * dy (0 for the zero state), the bias's dy, as on the float path
            t.dtype, t.quant = 'int8', {}
            t.data = quantize_constant(t.data, t.quant)
            continue
        if t.index in consts:           # (a Normalization's mean and 1 / std)
            if t.index in clips:        # (its scale: its op's output's, recalibrate's)
                trained[t.name] = np.asarray(t.data, np.float32)
            t.dtype, t.quant = 'int8', {'scale': [1.0], 'zero_point': [0]}
            t.data = quantize_constant(t.data, t.quant)
            continue
        if t.index in tables:           # (its scale: its output's, recalibrate's)
            trained[t.name] = np.asarray(t.data, np.float32)
            t.dtype, t.quant = 'int8', {'scale': [1.0], 'zero_point': [0]}
            t.data = np.zeros(t.shape, np.int8)
            continue
        if t.dtype != 'float32':
            if t.data is None:
                raise ValueError(f'tensor {t.name!r} is {t.dtype}: int8 from float takes float32 '
                                 'activations')
            continue                    # (shapes, axes, paddings)
        if t.data is None:
            t.dtype, t.quant = 'int8', {'scale': [1.0], 'zero_point': [0]}
            continue
        if t.index not in weights:
            raise ValueError(f'constant {t.name!r} is not the weight or bias of a '
                             'FULLY_CONNECTED, CONV_2D or DEPTHWISE_CONV_2D')
        op, ax = weights[t.index]
        trained[t.name] = np.asarray(t.data, np.float32)
        w = og.tensors[op.inputs[1]]
        # one weight scale per output channel (a conv's, as TFLite's converter gives
        # them); a FULLY_CONNECTED's per tensor, as TFLite's: on the board each channel's
        # scale costs float steps per update (QAS multipliers, the dz rescaling)
        n = int(w.shape[WEIGHTED[op.name]]) if op.name != 'FULLY_CONNECTED' else 1
        if ax is None:
            t.dtype, t.data = 'int32', np.zeros(t.shape, np.int32)
            t.quant = {'scale': [1.0] * n, 'zero_point': [0] * n, 'quantized_dimension': 0}
        else:
            t.dtype = 'int8'
            t.quant = {'scale': [1.0] * n, 'zero_point': [0] * n, 'quantized_dimension': ax}
    for op in og.ops:
        if op.name in FIXED_OUT:
            s, z = FIXED_OUT[op.name]
            og.tensors[op.outputs[0]].quant = {'scale': [s], 'zero_point': [z]}
    _requantize_fixed(og)
    if len({t.name for t in og.tensors}) != len(og.tensors):
        raise ValueError('tensor names repeat (the calibration matches tensors by name)')
    return og, trained


# room to train (python -m bench.fromfloat --accuracy chose them: weights at 2x their
# largest value clipped the fine-tuned Keras MLP 1 point below float, 3x kept it within)
HEADROOM = 2.0              # activations: x the measured range
LOGITS = 4.0                # the logits span at least +-LOGITS (their range doubles as they
#                             grow: utrain.q8range; at +-8 the untrained digits CNN's logits,
#                             +-0.6, had 10 steps, and it learnt 2 points later)
WEIGHT_HEADROOM = 3.0       # weights: x their largest magnitude


def widened(g: Graph, ranges: dict, targets=None) -> dict:
    """The measured ranges with room to train: training grows activations, and an int8
    activation clips at its calibrated range (its gradient then stops).  The input keeps
    its range (the samples'); the logits (SOFTMAX's input, a final LOGISTIC's) span at least +-LOGITS, or the
    softmax of an untrained model could never grow confident (the trained output's: the
    others, which do not train, as any activation); the others HEADROOM times the
    measured range.  targets: (lo, hi) of a regression's targets (mse, mae): the trained
    output is no logits but values the loss holds to them, HEADROOM times the range of
    both (with 0) and no +-LOGITS floor (targets within +-0.001 put it at 0.031 a step:
    every output one int8 code, and nothing trained at any lr)."""
    logits = {g.tensors[op.inputs[0]].name for op in g.ops if op.name == 'SOFTMAX'}
    # (a final sigmoid's input: bce's logits, quant.sigmoid_loss)
    logits |= {g.tensors[op.inputs[0]].name for op in g.ops if op.name == 'LOGISTIC'
               and op.outputs[0] in g.outputs[:1]}
    # (the trained output's: g.outputs[0], choose_output's; an output that does not
    # train keeps HEADROOM, as its other activations)
    trained = {g.tensors[k].name for k in g.outputs[:1]} - {g.tensors[op.outputs[0]].name
                                                             for op in g.ops if op.name == 'SOFTMAX'}
    if targets is None:
        logits |= trained
    else:
        logits -= trained
        for name in trained & set(ranges):
            lo, hi = ranges[name]
            ranges = dict(ranges, **{name: (min(lo, targets[0], 0.0), max(hi, targets[1], 0.0))})
    inputs = {g.tensors[k].name for k in g.inputs}
    out = {}
    for name, (lo, hi) in ranges.items():
        if name in inputs:
            out[name] = (lo, hi)
        elif name in logits:
            out[name] = (min(lo * HEADROOM, -LOGITS), max(hi * HEADROOM, LOGITS))
        else:
            out[name] = (lo * HEADROOM, hi * HEADROOM)
    return out


STEPS = 2                   # fewer int8 steps than this over a tensor's measured range: crushed


def crushed(og: Graph, measured: dict) -> list:
    """What calibrated int8 model og holds in fewer than STEPS int8 steps over its measured
    range: an activation that shares its scale with a much wider one (a CONCATENATION's
    inputs share one: a +-500 input's branch beside a 0..1 image's put the image's conv
    outputs, 0..0.83, at 4.7 a step: all one code), which the int8 path reads as a constant
    and passes no gradient (h40m's e: 0.38 test accuracy as int8, 0.76 in float32; 0.98
    as int8 with that input in units).  One sentence each, naming op numbers."""
    made = {k: op for op in og.ops for k in op.outputs}
    acts = [t for t in og.tensors if t.dtype == 'int8' and t.data is None and t.quant
            and t.quant.get('scale') and t.name in measured]
    out, said = [], set()
    for t in acts:
        lo, hi = measured[t.name]
        s = t.quant['scale'][0]
        key = (s, t.quant['zero_point'][0])
        if not hi > lo or (hi - lo) / s >= STEPS or t.index not in made or key in said:
            continue
        said.add(key)           # (one sentence a shared scale: its first tensor's)
        wide = max((u for u in acts if (u.quant['scale'][0], u.quant['zero_point'][0]) == key),
                   key=lambda u: measured[u.name][1] - measured[u.name][0])
        op, by = made[t.index], ''
        if wide is not t and wide.index in made:
            w = made[wide.index]
            by = (f" (the scale it shares with op {getattr(w, 'src', w.number)}'s output, measured "
                  f"{measured[wide.name][0]:.3g}..{measured[wide.name][1]:.3g})")
        out.append(f"op {getattr(op, 'src', op.number)} ({op.name})'s output {t.name!r} measured "
                   f"{lo:.3g}..{hi:.3g} spans {(hi - lo) / s:.2g} int8 steps at {s:.3g} a step{by}: "
                   'the int8 path reads it as a constant and trains nothing before it')
    return out


def calibrate(run_dir, g: Graph, x, more=None, steps=False, targets=None) -> Graph:
    """The int8 model of float graph g (the prepared float folder run_dir's, its
    model.flat and weights.wof) calibrated on samples x (one a row).  more: the measured
    ranges of the ops only g's other outputs need (_other_ranges), which run_dir's
    model.flat (the trained output's ops) does not run.  steps: g holds WHILE loops
    unrolled (rewrite.unroll_loops: a body tensor's steps are NAME/t0, NAME/t1, ...), each
    body tensor calibrated at one range over its steps, as the loop file has one tensor
    for all of them (export --quantized writes it: loopq8); the steps' FULLY_CONNECTEDs
    then train one zero bias (quant.zero_bias), as the body has one FC.  targets: a
    regression's (lo, hi) (widened)."""
    from .exportcheck import activation_ranges, recalibrate, tie_bounds
    og, trained = int8_graph(g)
    og.follow_ranges = 1        # its activation ranges double as training grows them (quant)
    og.grow_fc = 1              # its per-tensor FCs' weight scales too, where they fit (quant)
    measured = activation_ranges(run_dir, os.path.join(run_dir, 'weights.wof'), g, x)
    for k, (lo, hi) in (more or {}).items():
        a, b = measured.get(k, (lo, hi))
        measured[k] = (min(a, lo), max(b, hi))
    ranges = widened(g, measured, targets)
    out = g.tensors[g.outputs[0]].name
    if targets is not None and out in measured:     # (the range it trains to: crushed's)
        lo, hi = measured[out]
        measured[out] = (min(lo, targets[0]), max(hi, targets[1]))
    for k, src in getattr(og, 'requantized', {}).items():
        if src in ranges:
            ranges[k] = ranges[src]
    if steps:
        _one_range_a_body_tensor(ranges, og)
    _requantize_clips(og, ranges)
    for t in og.tensors:                # a tensor no sample reached: no scale to give it
        if t.dtype == 'int8' and t.data is None and t.name not in ranges and not (
                t.quant['scale'][0] in (1 / 256, 1 / 128)):
            raise ValueError(f'tensor {t.name!r}: no range measured')
    recalibrate(og, ranges, trained)
    og.crushed = crushed(og, measured)
    for t in og.tensors:    # float32, as the file stores them: the run's tables = the file's
        if t.quant and t.quant.get('scale') and t.dtype == 'int8' and t.data is None:
            t.quant['scale'] = [float(np.float32(v)) for v in t.quant['scale']]
    tie_bounds(og, {t.index: trained[t.name].astype(np.float64) for t in og.tensors
                    if t.data is not None and t.name in trained and t.dtype == 'int8'})
    _states_at_their_steps_scale(og)
    done = set()    # (a weight several ops share, an unrolled LSTM's kernel one a step:
    #                  given its room once, not WEIGHT_HEADROOM ** steps)
    for op in og.ops:       # weights with room to grow, the int32 biases at their scales
        if op.name not in WEIGHTED or len(op.inputs) < 2:
            continue
        xp, _, bp = POSITIONS.get(op.name, (0, 1, 2))
        x, w = og.tensors[op.inputs[xp]], og.tensors[op.inputs[1]]
        ax = w.quant.get('quantized_dimension', 0)
        if w.index in done:
            sw = np.float32(np.asarray(w.quant['scale'], np.float64))
        else:
            done.add(w.index)
            sw = np.float32(np.asarray(w.quant['scale'], np.float64) * WEIGHT_HEADROOM)
            wf = trained[w.name].astype(np.float64)
            shp = [-1 if i == ax else 1 for i in range(wf.ndim)]
            w.data = np.clip(np.round(wf / sw.astype(np.float64).reshape(shp)), -127, 127).astype(np.int8)
            w.quant = dict(w.quant, scale=[float(v) for v in sw])
        sb = np.float32(np.float64(x.quant['scale'][0]) * sw.astype(np.float64))
        if len(op.inputs) <= bp or op.inputs[bp] < 0:
            continue        # (no bias: the int8 path gives it a zero one, quant.zero_bias)
        b = og.tensors[op.inputs[bp]]
        b.quant = dict(b.quant, scale=[float(v) for v in sb], zero_point=[0] * len(sb))
        b.data = np.round(trained[b.name].astype(np.float64).reshape(-1) / sb.astype(np.float64)
                          ).astype(np.int32).reshape(b.shape)
    return og


def _states_at_their_steps_scale(og: Graph) -> None:
    """A weighted op's constant data input (a recurrent layer's zero state, int8_graph)
    takes the scale and zero point of the activation the other ops reading the same
    weight take (an unrolled loop's later steps: h): the int32 bias they share is right
    at one input scale only (input scale x weight scale), and at the constant's own range
    (1.0 for zeros) the first step's output was its bias / h's scale (a Keras GRU
    --int8: logits 0.13 mean off the float model's, 0.63 with sequences; 0.02-0.04 for
    an LSTM without the first step's bias).  A constant several such ops read is copied
    for each; one the steps' range does not hold keeps its own."""
    from ..graph.edit import new_tensor
    from ..graph.qparams import quantize
    xp = lambda op: POSITIONS.get(op.name, (0, 1, 2))[0]   # noqa: E731
    ops = [op for op in og.ops if op.name in WEIGHTED and len(op.inputs) > 1]
    scale = {}
    for op in ops:
        x = og.tensors[op.inputs[xp(op)]]
        if x.data is None and x.quant and x.quant.get('scale'):
            scale.setdefault(op.inputs[1], (x.quant['scale'][0], x.quant['zero_point'][0]))
    done = set()
    for op in ops:
        k = op.inputs[xp(op)]
        x = og.tensors[k]
        if x.data is None or x.dtype != 'int8' or op.inputs[1] not in scale:
            continue
        s, z = scale[op.inputs[1]]
        v = (x.data.astype(np.float64) - x.quant['zero_point'][0]) * x.quant['scale'][0]
        q, clipped = quantize(v, {'scale': [s], 'zero_point': [z]}, np.int8)
        if clipped:
            continue        # (a constant the steps' range does not hold: its own, as before)
        if k in done:       # (read by another op already: a copy of its own)
            k = new_tensor(og, f'{x.name}/{op.index}', x.shape, data=x.data)
            op.inputs[xp(op)] = k
            x = og.tensors[k]
        done.add(k)
        x.quant = {'scale': [s], 'zero_point': [z]}
        x.data = q


def _one_range_a_body_tensor(ranges: dict, og: Graph = None) -> None:
    """ranges {name: (lo, hi)} of an unrolled loop's steps (NAME/tN) each the union of
    its body tensor's steps, and (og: the int8 graph) of the activations the steps' ops
    sharing one weight read: the one int32 bias they share is right at one input scale
    only (input scale x weight scale).  A Keras GRU's first step folds its zero state
    away, so its second step reads h as mul_2/t0, the later steps as add_4/tN: two body
    tensors, two scales, the shared bias 1.03x off at one (TFLite's bias-scale check)."""
    from ..graph.loops import body_name, union_find
    find, join = union_find()
    for n in ranges:
        if (b := body_name(n)):
            join(n, ('body', b))
    first = {}
    for op in (og.ops if og is not None else ()):
        if op.name in WEIGHTED and len(op.inputs) > 1:
            x = og.tensors[op.inputs[POSITIONS.get(op.name, (0, 1, 2))[0]]]
            if x.data is None and x.name in ranges:
                join(x.name, first.setdefault(op.inputs[1], x.name))
    span = {}
    for n, (lo, hi) in ranges.items():
        a, b = span.get(find(n), (lo, hi))
        span[find(n)] = (min(a, lo), max(b, hi))
    for n in list(ranges):
        ranges[n] = span[find(n)]


def _other_ranges(model_path, data, places, x, prepare, tmp, split=(0.0, 0)) -> dict:
    """{tensor name: (min, max)} over samples of data of the activations of the float
    model's outputs at places (in natural order: choose_output's) other than the trained
    one: each prepared as float into a scratch folder of tmp (its ops, model.flat) and
    run on its inputs' samples (x where the model has one input; else the training rows
    of split, (test fraction, seed) as prepare splits them, as many as x), each
    calibrated at its own range, as the trained output's; export --quantized writes them
    all."""
    from ..files.dataset import load_inputs, split as rows
    from ..graph.inout import choose_output
    from ..plan.runplan import data_inputs
    from .exportcheck import activation_ranges
    out = {}
    for j in places:
        d = tempfile.mkdtemp(prefix=f'out{j}-', dir=tmp)
        s = prepare(model_path, d, log=lambda *a: None, int8=False, progress=0,
                    train='all', scale_input=False, output=j, loss='mse')
        gj = read_model(os.path.join(d, s['rewritten']) if s.get('rewritten') else model_path)
        choose_output(gj, j)
        ins = data_inputs(gj)
        if ins is None:
            xj = x
        else:       # (the test rows are not calibrated on: the trained output's are not)
            xj = np.asarray(load_inputs(data, ins)[0], np.float32)
            xj = xj[rows(len(xj), *split)[0]][:len(x)]
        for name, (lo, hi) in activation_ranges(d, os.path.join(d, 'weights.wof'), gj,
                                                xj.reshape(len(xj), -1)).items():
            a, b = out.get(name, (lo, hi))
            out[name] = (min(a, lo), max(b, hi))
    return out


def from_float(model_path, data, overrides: dict, train, split=(0.0, 0), prepare=None,
               rms=None, output=None):
    """The float model at model_path prepared as float into a scratch folder (its rewrites,
    model.flat), calibrated as int8 on the training samples of data.  Returns (int8 graph,
    float graph, samples calibrated on, whether prepare rewrote the graph).  ValueError:
    not convertible.  prepare: host_tools.prepare.pipeline.prepare (passed in: prepare calls this
    module, which imports nothing of it).  rms: the input's root mean square (the int8
    graph's input_rms): an input far larger than 1 is calibrated as the file has it, and
    the int8 run scales it by relabelling (quant.relabel_input), not by a MUL.  output:
    of a model with several outputs, the trained one's place (choose_output's); the
    others are calibrated too, each on its own ops' ranges (_other_ranges)."""
    from ..formats.onnx_io import is_onnx
    if is_onnx(model_path):
        raise ValueError(ONNX_WHY)
    tmp = tempfile.mkdtemp(prefix='utrain-q8f-')
    try:
        kw = {k: v for k, v in overrides.items() if k not in ('stream', 'batch')}
        s = prepare(model_path, tmp, data=data, test_split=split[0], split_seed=split[1],
                    log=lambda *a: None, int8=False, progress=0, train=train,
                    scale_input=False, output=output, **kw)
        g = read_model(os.path.join(tmp, s['rewritten']) if s.get('rewritten') else model_path)
        frozen = set(s.get('frozen_constants') or ())
        for t in g.tensors:     # (spellings.cumsums_to_fc's triangle: no int8 parameter)
            t.frozen = t.name in frozen
        places = []
        if len(g.outputs) > 1:      # (the trained one first, as prepare's run has it)
            from ..graph.inout import choose_output, natural
            order = natural(g, g.outputs)       # (the file's, before choose_output's)
            choose_output(g, output)
            places = [order.index(k) for k in g.outputs[1:]]
        for op, n in zip(g.ops, s.get('op_numbers') or ()):
            op.src = n          # messages name the user's op numbers, not the rewrite's
        from ..files.dataset import read_samples
        from ..plan.runplan import data_inputs, one_input_output
        ins = data_inputs(g)        # several inputs: train.ds holds them joined
        x, y = read_samples(os.path.join(tmp, 'train.ds'), [1, sum(
            int(np.prod(sh[1:])) for _, sh, _ in ins[0])] if ins else g.tensors[g.inputs[0]].shape)
        more = _other_ranges(model_path, data, places, x[:1000], prepare, tmp, split)
        with open(os.path.join(tmp, 'train.json')) as f:
            loss = json.load(f).get('loss')
        y = np.asarray(y, np.float64)
        og = calibrate(tmp, g, x[:1000], more,  # (each input's range its own: the SPLIT_V's parts)
                       steps=bool(s.get('file_tensors')),
                       targets=(float(y.min()), float(y.max())) if loss in ('mse', 'mae')
                       and y.size and np.all(np.isfinite(y)) else None)
        og.path = model_path
        og.regression = loss in ('mse', 'mae')     # (its output no logits: quant.regressed)
        og.dead_relu = s.get('dead_relu')   # (the float prepare's warning: said by the caller)
        # an unrolled loop's (a Keras RNN's WHILE): where each trained tensor is in the
        # file, for export to write the file as it is (pipeline.write_in_place)
        og.file_tensors = s.get('file_tensors')
        # --train counts the user's file's ops; the float path's rewrites are done
        og.nfile = len(read_model(model_path).ops) if s.get('op_numbers') else len(g.ops)
        from .quant import _trailing_means
        _trailing_means(og)     # (a MEAN over C of [1, T, C]: a LayerNorm's, as quant.rewritten)
        og.q8_rewritten = True
        # an NCHW input (a PyTorch model through tico) the float rewrites hoisted: the int8
        # model takes NHWC as the float run does, its samples laid out so (quant's
        # read_data); export writes that layout and says so (it had been refused:
        # 'its input is transposed by the rewrites (NCHW)', every tico net of C > 1)
        og.input_perm = [int(v) for v in s['input_perm']] if s.get('input_perm') else None
        og.input_transpose = None
        if ins:     # (an int8 model of several inputs, as quant.rewritten joins one)
            og.inputs_rms = rms
        else:
            og.input_rms = rms
        if ins or len(og.outputs) > 1:      # (the trained output's ops: the others exported)
            one_input_output(og)
        return og, g, len(x[:1000]), bool(s.get('rewritten'))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def choose(int8, model_path, board, backend, data, s, cache):
    """Whether prepare trains float model model_path as int8 (int8: True asked, False
    refused, None: prepare's choice: yes for a board profile other than unix with the
    fallback backend, no ulab, when data and the settings allow).  Returns (yes, why);
    ValueError when int8 was asked and cannot be."""
    if int8 is False:
        return False, ''
    why = why_not(s, cache, model_path) or (None if data else 'no --data to calibrate the int8 scales on')
    if int8:
        if why:
            raise ValueError(f'{model_path}: {why}; without --int8 it trains in float32')
        return True, 'asked (--int8)'
    if not board or board == 'unix' or not backend.startswith('fallback') or why:
        return False, ''
    return True, (f'--board {board} without ulab: every float32 value there is a heap object'
                  + (' (and an RP2040 has no FPU)' if board == 'rp2040' else '')
                  + '; the int8 path runs its loops in viper or assembler kernels')


def dequantized(int8_path, wof_path, train, n, run=None, output=None, biases=None) -> dict:
    """{tensor index: float32 array} of the trained int8 weights, biases and embedding
    tables in wof_path,
    dequantized with the scales of the run's int8 model int8_path: the first n tensors
    (its float graph's) bear the same indices.  run: the run's prepare.json
    (quant.numbered reads its op numbers).  output: of a model with several outputs, the
    trained one's place (prepare.json's).  biases: a dict given the trained zero biases
    the int8 path gave layers without one (quant.zero_bias), {weight tensor index: float32}."""
    from . import quant
    from ..graph.inout import choose_output
    from ..plan.runplan import one_input_output
    g8 = quant.numbered(read_model(int8_path), run)
    if len(g8.outputs) > 1:
        choose_output(g8, output)
    one_input_output(g8)        # (several inputs: joined, as prepare's run has them)
    from .recal import replay
    replay(g8, os.path.dirname(os.path.abspath(wof_path)))     # (prepare's recalibration)
    m = quant.meta(g8, train)
    out = {}
    got = quant.read_q8_wof(wof_path, g8, m)
    for k, a in got.items():
        g8.tensors[k].data = a
    # the scales the run moved as it trained, as export --quantized writes them (the
    # weight scales q8grow doubled had been left out: a Keras SeparableConv2D's pointwise
    # weights came back 2x, 0.89 where the int8 model scores 1.00)
    quant.followed(g8, m, wof_path)
    quant.grown(g8, m, wof_path, got)
    quant.sloped(g8, m, wof_path)
    got = {k: g8.tensors[k].data for k in got}
    quant.tconved(g8, m, wof_path)          # (TRANSPOSE_CONV weights: trained.wof.q8c)
    quant.embedded(g8, m, wof_path)         # (embedding tables: trained.wof.q8e)
    got.update({k: g8.tensors[k].data for d in m['layers'] if d.get('xt') for k in (d['xw'], d['xb'])})
    got.update({d['et']: g8.tensors[d['et']].data for d in m['layers'] if d.get('eg')})
    for k, a in got.items():
        t = g8.tensors[k]
        if k >= n and not (biases is not None and t.name.endswith('/zero_bias')):
            continue                    # (a tensor the float model has no place for)
        s = np.asarray(t.quant['scale'], np.float64)
        z = np.asarray(t.quant.get('zero_point') or [0], np.float64)    # (a table's: its output's)
        ax = int(t.quant.get('quantized_dimension', 0))
        if s.size > 1:
            s, z = (v.reshape([-1 if i == ax else 1 for i in range(a.ndim)]) for v in (s, z))
        out[k] = ((a.astype(np.float64) - z) * s).astype(np.float32)
        if k >= n:      # (the weight's: the ops that read it have no bias in the float model)
            biases[next(op.inputs[1] for op in g8.ops if k in op.inputs[2:])] = out.pop(k)
    return out
