"""`export --quantized --data D`: float-trained weights written back into the int8 model,
its activation scales recalibrated on D and what that gains measured.  Written with the
original model's activation scales and zero points, the int8 model can score less than
the float weights it came from: training moves the activations (issue 31: 1.00 -> 0.87
on a holdout, silently).  calibrated() measures the activations' ranges of the trained
float model on D's samples (utrain's float kernels, op by op), gives the int8 model those
ranges as scales (and its weights and biases scales that fit them), and runs the float
model, the int8 model with the original scales and the recalibrated one on D with
utrain's own code under CPython (utrain.q8's integer forward, as a board trains it)."""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from ..files import dataset as ds
from ..target.device import module

MAX_SAMPLES = 1000
BIAS_CODES = 1 << 24      # the most a bias takes in int32 codes at its weight scale (recalibrate)


def _metric(out, y, loss):
    """accuracy (classification losses) or mean absolute error of outputs out [n, k]."""
    if loss in ('scce', 'cce', 'bce'):
        labels = np.argmax(y, 1) if y.shape[1] > 1 else y[:, 0].astype(int)
        pred = np.argmax(out, 1) if out.shape[1] > 1 else (out[:, 0] > 0.5).astype(int)
        return 'accuracy', float(np.mean(pred == labels))
    return 'mae', float(np.mean(np.abs(out - y.reshape(out.shape))))


def _float_outputs(run_dir, wof_path, x):
    Net = module('model').Net
    net = Net(os.path.join(run_dir, 'model.flat'))
    net.load_weights(wof_path)
    shape = net.shape[net.inputs[0]]
    out = []
    for v in x:
        net.set_input(v.astype(np.float32).reshape(shape))
        net.forward()
        out.append(np.array(net.output(), np.float64).ravel())
    return np.array(out)


def _int8_outputs(model_path, x):
    from ..formats.circle_io import read_model
    from . import quant
    Q8Net = module('q8').Q8Net
    g = read_model(model_path)
    with tempfile.TemporaryDirectory() as tmp:
        quant.write(g, tmp, 'none')
        with open(os.path.join(tmp, 'q8.json')) as f:
            net = Q8Net(json.load(f), os.path.join(tmp, 'weights.wof'))
        try:
            out = np.array([net.logits(net.quantize_input(v.tolist())) for v in x])
        finally:
            net.close()
    if g.ops[-1].name == 'SOFTMAX':     # (q8 stops before it: the logits' argmax is the same)
        e = np.exp(out - out.max(1, keepdims=True))
        out = e / e.sum(1, keepdims=True)
    return out


def calibrated(run_dir, wof_path, out_path, data, g, w, perm=None) -> dict:
    """The int8 export at out_path (the trained weights at the original scales) against
    one whose activation scales are recalibrated on data's samples (recalibrate()):
    both measured with the float weights they came from (g: the trained float graph, w
    its trained weights {tensor index: array}); out_path keeps the better (the
    recalibrated one on a tie, or when the int8 model does not run here).  Returns
    {'metric', 'float', 'int8', 'calibrated', 'kept', 'samples', 'tensors'}, 'error' for
    what could not be measured."""
    from ..formats.circle_io import read_model
    from ..graph.inout import save_graph
    with open(os.path.join(run_dir, 'train.json')) as f:
        loss = json.load(f).get('loss', 'scce')
    if not wof_path.endswith('.wof'):
        return {'error': 'measured and calibrated with a .wof (trained.wof), not a checkpoint'}
    x, y = ds.read_samples(data, g.tensors[g.inputs[0]].shape, perm, None, None)
    x, y = x[:MAX_SAMPLES], y[:MAX_SAMPLES].reshape(min(len(y), MAX_SAMPLES), -1)
    og = read_model(out_path)
    n = recalibrate(og, activation_ranges(run_dir, wof_path, g, x),
                    {g.tensors[k].name: a for k, a in w.items()})
    tmp = out_path + '.calibrated'
    save_graph(og, tmp)
    r = {'samples': len(x), 'tensors': n, 'kept': 'calibrated'}
    try:
        try:
            name, r['float'] = _metric(_float_outputs(run_dir, wof_path, x), y, loss)
            r['metric'] = name
            r['int8'] = _metric(_int8_outputs(out_path, x), y, loss)[1]
            r['calibrated'] = _metric(_int8_outputs(tmp, x), y, loss)[1]
            worse = r['calibrated'] < r['int8'] if name == 'accuracy' else r['calibrated'] > r['int8']
            if worse:
                r['kept'] = 'original'
        except ValueError as e:
            r['error'] = f'the int8 model does not run here ({e})'
        if r['kept'] == 'calibrated':
            os.replace(tmp, out_path)
    finally:            # (stopped half way, Ctrl-C: no .calibrated file left beside it)
        if os.path.exists(tmp):
            os.remove(tmp)
    return r


# ops whose int8 output must keep its input's scale and zero point (TFLite's kernels
# move the integers as they are), and ops whose output scale is fixed by the kernel
# (REDUCE_MAX: Keras's GlobalMaxPooling1D; TFLite Micro refuses other scales, TFLite
# copies the codes; so do the other copies here)
TIED = ('RESHAPE', 'MAX_POOL_2D', 'AVERAGE_POOL_2D', 'PAD', 'SQUEEZE', 'EXPAND_DIMS',
        'CONCATENATION', 'STRIDED_SLICE', 'TRANSPOSE', 'SPLIT', 'SPLIT_V', 'GATHER',
        'RESIZE_BILINEAR', 'RESIZE_NEAREST_NEIGHBOR', 'REDUCE_MAX', 'REDUCE_MIN', 'SLICE',
        'PACK', 'UNPACK', 'TILE', 'BATCH_TO_SPACE_ND', 'SPACE_TO_BATCH_ND', 'DEPTH_TO_SPACE',
        'SPACE_TO_DEPTH', 'PADV2', 'MIRROR_PAD')
FIXED = ('SOFTMAX', 'LOGISTIC', 'TANH')
# (TFLite's int8 MAXIMUM and MINIMUM compare the int8 values: their inputs and output one
# scale, a constant input's values quantized at it)
CLIPS = ('MAXIMUM', 'MINIMUM')
BOUND_SPREAD = 4.0  # a clip's bound widens its range up to this x the data's, no further
WEIGHTED = ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D', 'TRANSPOSE_CONV')
# (data input, weight, bias) positions: TRANSPOSE_CONV's inputs are output_shape,
# weight, input, bias
POSITIONS = {'TRANSPOSE_CONV': (2, 1, 3)}


def _dequantized(t):
    q = t.quant
    return (t.data.astype(np.float64) - q.get('zero_point', [0])[0]) * q['scale'][0]


def activation_ranges(run_dir, wof_path, g, x) -> dict:
    """{tensor name: (min, max)} of every activation of the trained float model (the
    prepared folder's model.flat with wof_path's weights, graph g its rewritten circle)
    over the samples x, computed op by op with utrain's float kernels."""
    net = module('model').Net(os.path.join(run_dir, 'model.flat'))
    net.load_weights(wof_path)
    net.bands = None
    shape, st = net.shape[net.inputs[0]], net.stream
    lo, hi = {}, {}

    def seen(k):
        v = net.t[k]
        if v is not None and k < len(g.tensors):
            a = np.asarray(v, np.float64)
            lo[k], hi[k] = min(lo.get(k, np.inf), a.min()), max(hi.get(k, -np.inf), a.max())
    for v in x:
        net.set_input(v.astype(np.float32).reshape(shape))
        seen(net.inputs[0])
        for i, op in enumerate(net.ops):
            if st:
                st.fetch(i)
            net.mods[i].forward(net, op)
            if st:
                st.drop(i)
            for k in op[2]:
                seen(k)
    return {g.tensors[k].name: (float(lo[k]), float(hi[k])) for k in lo}


def dead_relu(run_dir, g, params, x, model_path) -> str | None:
    """A warning when a ReLU of g (a fused RELU or RELU6, or the op) is 0 on every sample of
    x (a few training samples, as the model takes them) while parameters at or before it
    train: no gradient passes it, so they do not learn (the Arduino tutorial's gesture MLP
    from GitHub, on its own repository's gestures: all 50 first-layer ReLUs off, every run
    kept its first weights and nothing said why); else None.  run_dir: the prepared float
    folder (model.flat, weights.wof)."""
    if not len(x) or not params:
        return None
    ranges = activation_ranges(run_dir, os.path.join(run_dir, 'weights.wof'), g, x)
    first = next((i for i, op in enumerate(g.ops) if set(op.inputs) & set(params)), None)
    dead = [op for i, op in enumerate(g.ops) if first is not None and i >= first and (
        op.name in ('RELU', 'RELU6') or op.options.get('fused_activation_function') in
        ('RELU', 'RELU6')) and ranges.get(g.tensors[op.outputs[0]].name, (0, 1))[1] <= 0]
    if not dead:
        return None
    # the gradient reaches a tensor from the outputs through every op but the dead ones: a
    # ReLU with a path around it (a MINIMUM / MAXIMUM spelled a - RELU(a - b), the guard of
    # an L2 normalisation's never reached) leaves what is before it learning
    reach, off = set(g.outputs), {id(op) for op in dead}
    for op in reversed(g.ops):
        if id(op) not in off and reach.intersection(op.outputs):
            reach.update(op.inputs)
    cut = {k for k in params if k not in reach}
    if not cut:
        return None
    op = [d for d in dead if any(set(o.inputs) & cut for o in g.ops[:g.ops.index(d) + 1])][-1]
    n = int(np.prod(g.tensors[op.outputs[0]].shape[1:]))
    return (f'{model_path}: warning: op {op.number} {op.name}: all {n} of its ReLU outputs '
            f'are 0 on the {len(x)} training samples looked at (every unit off): no '
            'gradient passes it, so it and the layers before it will not learn from these '
            'samples; check that they are in the units the model was made for (its input '
            'normalisation, applied to x): a layer off on all of them is rare on its own data')


def tie_bounds(og, bounds) -> None:
    """The constants of og's MAXIMUMs and MINIMUMs {tensor: real values} quantized at
    their op's output scale and zero point (its other input's: one scale, recalibrate's)."""
    from ..graph.qparams import quantize
    for op in og.ops:
        for k in op.inputs if op.name in CLIPS else ():
            if k in bounds:
                t, q = og.tensors[k], og.tensors[op.outputs[0]].quant
                t.quant = dict(t.quant, scale=list(q['scale']), zero_point=list(q['zero_point']))
                t.data = quantize(bounds[k].reshape(t.shape), t.quant, 'int8')[0]


def recalibrate(og, ranges, trained) -> int:
    """Give int8 model og (a Graph, changed in place) activation scales and zero points
    from the measured ranges {name: (min, max)} (tensors an op ties together share the
    union of their ranges; a kernel's fixed output scale, SOFTMAX's, stays; a MAXIMUM's or
    MINIMUM's constant at its op's, its values (trained's, else its own) inside), per-channel
    weight scales from the trained float weights {name: array} (max |w| / 127; a layer
    without a bias too), and the int32 biases quantized again at input scale x weight scale.  Returns how many
    activation tensors got new scales."""
    from ..graph.qparams import quantize
    parent = {}

    def find(k):
        while parent.get(k, k) != k:
            k = parent[k]
        return k
    act = {t.index for t in og.tensors if t.data is None and t.dtype == 'int8' and t.quant
           and t.quant.get('scale')}
    fixed, tables = set(), []
    ranges = dict(ranges)
    bounds = {}         # {a MAXIMUM's / MINIMUM's constant: its real values}
    for op in og.ops:
        for k in op.inputs if op.name in CLIPS else ():
            t = og.tensors[k]
            if t.data is not None and t.quant and t.quant.get('scale'):
                v = trained.get(t.name)
                bounds[k] = np.asarray(v if v is not None else _dequantized(t), np.float64)
    for op in og.ops:
        # the float graph has no DEQUANTIZE / QUANTIZE: its tensor is the int8 one's
        # (a float output's last layer; the input), named as the float side
        if op.name in ('DEQUANTIZE', 'QUANTIZE') and op.inputs and op.outputs:
            a, b = (og.tensors[k].name for k in (op.inputs[0], op.outputs[0]))
            q, f = (a, b) if op.name == 'DEQUANTIZE' else (b, a)
            if q not in ranges and f in ranges:
                ranges[q] = ranges[f]
    for op in og.ops:
        t = og.tensors[op.inputs[0]] if op.inputs else None
        if op.name == 'GATHER' and t.data is not None and t.quant and op.outputs[0] in act:
            # an embedding: its output keeps the table's scale, so the table is
            # requantized at the output's, whose range takes in the whole trained table
            tf = trained.get(t.name)
            tf = np.asarray(tf if tf is not None else _dequantized(t), np.float64)
            tables.append((op, tf))
            n = og.tensors[op.outputs[0]].name
            lo, hi = ranges.get(n, (0.0, 0.0))
            ranges[n] = (min(lo, tf.min()), max(hi, tf.max()))
            continue
        if op.name in TIED or op.name in CLIPS:
            ins = [k for k in op.inputs if k in act]
            for k in (ins if op.name in ('CONCATENATION', 'PACK', *CLIPS) else ins[:1]) + [
                    o for o in op.outputs if o in act]:
                parent[find(k)] = find(ins[0])
            n = og.tensors[op.outputs[0]].name      # (the bound is inside the range)
            for v in (bounds[k] for k in op.inputs if k in bounds):
                if n in ranges:
                    lo, hi = ranges[n]
                    w = (min(lo, v.min()), max(hi, v.max()))
                    # (unless far outside what the data reach: an L2 normalisation's
                    # 1 / sqrt(eps) guard, never met, had made the range 1e6 wide and
                    # every value 0; the bound saturates at the range's edge instead)
                    if max(w[1], 0) - min(w[0], 0) <= BOUND_SPREAD * (max(hi, 0) - min(lo, 0)):
                        ranges[n] = w
        elif op.name in FIXED:
            fixed.update(op.outputs)
    groups = {}
    for k in act:
        groups.setdefault(find(k), []).append(k)
    old = {t.index: dict(t.quant) for t in og.tensors if t.quant}
    changed = 0
    for members in groups.values():
        names = [og.tensors[k].name for k in members]
        if fixed & set(members):
            # (a kernel's fixed scale, and the tensors tied to it: a RESHAPE of a tanh,
            # which had kept its placeholder scale in a model calibrated from float)
            q = og.tensors[min(fixed & set(members))].quant
            for k in set(members) - fixed:
                og.tensors[k].quant = dict(og.tensors[k].quant, scale=list(q['scale']),
                                           zero_point=list(q['zero_point']))
                changed += 1
            continue
        if not all(n in ranges for n in names):
            continue
        lo = min(0.0, min(ranges[n][0] for n in names))
        hi = max(0.0, max(ranges[n][1] for n in names))
        if hi - lo <= 0:
            continue
        s = (hi - lo) / 255
        z = int(min(127, max(-128, round(-128 - lo / s))))
        for k in members:
            og.tensors[k].quant = dict(og.tensors[k].quant, scale=[s], zero_point=[z])
            changed += 1
    for op, tf in tables:
        t, q = og.tensors[op.inputs[0]], og.tensors[op.outputs[0]].quant
        t.quant = dict(t.quant, scale=list(q['scale']), zero_point=list(q['zero_point']))
        t.data = quantize(tf.reshape(t.shape), t.quant, 'int8')[0]
    tie_bounds(og, bounds)
    first = {}      # a weight several ops share: its values as first read (not requantized)
    for op in og.ops:
        xp, wp, bp = POSITIONS.get(op.name, (0, 1, 2))
        if op.name not in WEIGHTED or len(op.inputs) <= max(xp, wp):
            continue
        x, w = og.tensors[op.inputs[xp]], og.tensors[op.inputs[wp]]
        b = og.tensors[op.inputs[bp]] if len(op.inputs) > bp and op.inputs[bp] >= 0 else None
        if not (w.quant and x.quant) or w.data is None or (b is not None and (
                not b.quant or b.data is None)):
            continue
        ax = int(w.quant.get('quantized_dimension', 0))
        wf = trained.get(w.name, first.get(w.index))
        if wf is None:              # frozen: the original integers' values
            sw0 = np.asarray(old[w.index]['scale'], np.float64)
            wf = w.data.astype(np.float64) * (sw0.reshape([-1 if i == ax else 1 for i in range(w.data.ndim)])
                                              if sw0.size > 1 else sw0[0])
        wf = first[w.index] = np.asarray(wf, np.float64).reshape(w.shape)
        per = len(old[w.index]['scale']) > 1
        m = np.abs(np.moveaxis(wf, ax, 0).reshape(wf.shape[ax], -1)).max(1) if per else \
            np.array([np.abs(wf).max()])
        sw = np.where(m > 0, m / 127, np.asarray(old[w.index]['scale'], np.float64))
        if b is not None:
            bf = trained.get(b.name)
            if bf is None:
                bf = b.data.astype(np.float64) * np.asarray(old[b.index]['scale'], np.float64)
            # a channel whose weights are all but zero (pruned: a Keras MobileNetV2's max
            # |w| 4e-18) had a weight scale of 3e-20 and its bias 1e23 codes, past int32:
            # as TFLite's converter does, the weight scale grows until the bias fits
            # (BIAS_CODES), the channel's weights all but zero at it as they were
            bmax = np.abs(np.asarray(bf, np.float64)).reshape(-1)
            sw = np.maximum(sw, (bmax if per else bmax.max(initial=0.0))
                            / (x.quant['scale'][0] * BIAS_CODES))
        w.quant = dict(w.quant, scale=[float(v) for v in sw], zero_point=[0] * len(sw))
        w.data = quantize(wf, w.quant, 'int8')[0]
        if b is None:       # (no bias: weights only; the int8 path adds a zero one)
            continue
        sb = x.quant['scale'][0] * sw      # (per tensor: one scale, as the weight's)
        b.quant = dict(b.quant, scale=[float(v) for v in sb], zero_point=[0] * len(sb))
        b.data = np.round(np.asarray(bf, np.float64).reshape(-1) / sb).astype(np.int32).reshape(b.shape)
    return changed
