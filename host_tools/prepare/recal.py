"""Output ranges of the trained layers recalibrated on the fine-tuning data (issue 29).

An int8 model's activation ranges were calibrated on the data it was trained on; fine-
tuned on other data, a trained layer's output may clip at an end of its range (the
digits MobileNetV2's op 64, calibrated on the digits 0-4, put 10 % of its outputs at
-128 on the digits 5-9): a clipped output passes no gradient and loses what it held.
Before an int8 run is written, prepare runs the int8 forward (utrain.q8, the board's
integers) over the training samples and widens the range of each FULLY_CONNECTED /
CONV_2D / DEPTHWISE_CONV_2D output from the first trained layer on where more than CLIP
of its values sit at an end its fused activation does not set: the scale doubles, the
other end stays (the zero point moves), the pools' and shape ops' outputs after it
follow (one scale; so do a MAXIMUM's or MINIMUM's other input and output, a SELECT_V2's
value inputs and output), the int32
biases of the layers reading it are halved (bias scale s_x s_W).  Up to ROUNDS passes, the forward run again on the widened model.  The widen
steps go into the run folder as q8cal.json ([[tensor, end], ...], end -1 the low, 1
the high), which export replays on the model file before it writes the trained weights
(the same graph: the trained biases are at the widened scales).  One pass on the host,
before training: the board's tables and memory plan are the model's, as for any file.
"""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from ..formats.circle_io import Graph

CLIP = 1 / 64           # a fraction of outputs at an end that widens it
ROUNDS = 3
SAMPLES = 64            # at most this many training samples, evenly spread
FILE = 'q8cal.json'
SAME = ('MAX_POOL_2D', 'AVERAGE_POOL_2D', 'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS', 'PAD',
        # (copies: TFLite's int8 kernels take their outputs at the input's scale; a
        # GRU's gates are STRIDED_SLICEs of an FC's output)
        'STRIDED_SLICE', 'SLICE', 'SPLIT', 'SPLIT_V', 'TRANSPOSE', 'UNPACK')
DATA = {'SPLIT': 1}     # (the input a SAME op copies, where it is not the first)
# (the inputs, None: every one, at the output's scale: MAXIMUM and MINIMUM compare the
# int8 values; SELECT_V2 copies its value inputs' codes, so a branch widened alone would
# be read at the output's old scale: tf.where(h > 0.5, h, 0.3 h + 0.35) after its Dense's
# range widened had computed 0.5 h + 1.5 above 0.5, and trained 4-6 points under
# --dequantize on h40m's held-out model)
TIED = {'MAXIMUM': None, 'MINIMUM': None, 'SELECT_V2': (1, 2), 'SELECT': (1, 2)}
WEIGHTED = ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED')


def widen(g: Graph, t: int, end: int) -> None:
    """Tensor t's range (and the same-scale tensors after it, and those tied to it: a
    MAXIMUM's or MINIMUM's inputs and output, one scale as TFLite's kernel needs, a
    SELECT_V2's value inputs and output, whose codes it copies, a constant input's values
    quantized again) twice as wide, end (-1 the low, 1 the high;
    0 both) moving, the other staying; the biases of the weighted ops reading them halved
    (rounded half away from zero) with their scales doubled."""
    ts, n = {t}, 0
    while n != len(ts):
        n = len(ts)
        for op in g.ops:
            x = op.inputs[DATA.get(op.name, 0)] if op.inputs else -1
            if op.name in SAME and (x in ts or ts & {*op.outputs}):
                ts.update([x, *op.outputs])
            elif op.name in TIED:
                v = [op.inputs[j] for j in TIED[op.name] or range(len(op.inputs))]
                if ts & {*v, *op.outputs}:
                    ts.update([*v, *op.outputs])
    for k in sorted(ts):
        q = g.tensors[k].quant
        s, z = float(q['scale'][0]), int(q['zero_point'][0])
        z2 = 127 - (127 - z) / 2 if end < 0 else -128 + (128 + z) / 2 if end > 0 else z / 2
        q['scale'] = [2.0 * s]
        q['zero_point'] = [int(min(127, max(-128, np.floor(z2 + 0.5))))]
        c = g.tensors[k]
        if c.data is not None:      # (a constant: its real values at the new scale)
            v = (c.data.astype(np.float64) - z) * s / (2.0 * s) + q['zero_point'][0]
            c.data = np.clip(np.sign(v) * np.floor(np.abs(v) + 0.5), -128, 127).astype(c.data.dtype)
    ops = [op for op in g.ops if op.name in WEIGHTED and op.inputs[0] in ts and len(op.inputs) > 2
           and op.inputs[2] >= 0]
    for k in sorted({op.inputs[2] for op in ops}):
        b = g.tensors[k]
        if any(op.name in WEIGHTED and len(op.inputs) > 2 and op.inputs[2] == k and op not in ops
               for op in g.ops):
            # a bias other ops read too (the steps of an unrolled layer, one reading the
            # widened tensor): these read a copy of their own at the new scale
            import copy
            c = copy.copy(b)
            c.index, c.name, c.buffer = len(g.tensors), b.name + '/widened', -1
            g.tensors.append(c)
            for op in ops:
                if op.inputs[2] == k:
                    op.inputs[2] = c.index
            b = c
        v = b.data.astype(np.int64)
        b.data = (np.sign(v) * ((np.abs(v) + 1) >> 1)).astype(np.int32)
        b.quant = dict(b.quant, scale=[2.0 * float(v) for v in b.quant['scale']])


def replay(g: Graph, folder) -> list:
    """The widen steps of folder's q8cal.json applied to g (the model file prepare read);
    [] without the file."""
    p = os.path.join(folder, FILE)
    if not os.path.exists(p):
        return []
    try:
        with open(p) as f:
            steps = json.load(f)
        assert isinstance(steps, list) and all(
            isinstance(t, int) and 0 <= t < len(g.tensors) and e in (-1, 0, 1) for t, e in steps)
    except (OSError, ValueError, AssertionError, TypeError) as e:
        raise ValueError(f'{p}: not the recalibrated ranges of this model ({e or "bad steps"}); '
                         'prepare writes it beside q8.json') from None
    for t, e in steps:
        widen(g, t, e)
    return steps


def recalibrate(g: Graph, x, train, ranks, meta, arrays, log=None) -> list:
    """Widen (in g) the clipping output ranges of the trained layers on samples x (float,
    the model's input); returns the widen steps ([tensor, end]).  meta, arrays: quant's
    layer table and its weight arrays (handed in: quant calls this)."""
    from ..files import wof as hwof
    from ..target.device import module
    q8 = module('q8')
    if len(x) > SAMPLES:
        x = x[np.linspace(0, len(x) - 1, SAMPLES).astype(int)]
    steps = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ROUNDS):
            m = meta(g, train, 0, ranks)
            ls = m['layers']
            first = min([i for i, d in enumerate(ls) if d.get('train')] or [len(ls)])
            cands = [i for i in range(first, len(ls)) if ls[i]['k'] in (q8.FC, q8.CONV, q8.DW)]
            if not cands:
                break
            m = dict(m, at=[], arena=0, groups=[])      # (every output its own buffer)
            w = os.path.join(tmp, 'w.wof')
            hwof.write_wof(w, len(g.tensors), arrays(g, m), keep_dtype=True)
            net = q8.Q8Net(m, w)
            lo = {i: 0 for i in cands}
            hi = dict(lo)
            xs = np.asarray(x, np.float64).reshape(len(x), -1)
            qx = np.clip(np.floor(xs / m['sx'] + 0.5) + m['zx'], -128, 127).astype(np.int8)
            for v in qx:
                net.forward(bytearray(v.tobytes()))
                for i in cands:
                    y = np.frombuffer(bytes(net.layers[i].y), np.int8)
                    lo[i] += int((y == -128).sum())
                    hi[i] += int((y == 127).sum())
            net.close()
            new = []
            for i in cands:
                d = ls[i]
                act = g.ops[d['op']].options.get('fused_activation_function', 'NONE')
                n = d['nout'] * len(qx)
                a = d['lo'] == -128 and act in ('NONE', None) and lo[i] > CLIP * n
                b = d['hi'] == 127 and act in ('NONE', None, 'RELU') and hi[i] > CLIP * n
                if a or b:
                    end = 0 if a and b else -1 if a else 1
                    new.append([d['out'], end])
                    if log:
                        log(f'op {g.ops[d["op"]].number} {g.ops[d["op"]].name}: '
                            + ' and '.join(f'{100 * c / n:.1f} % of its outputs at {v}'
                                           for c, v, f in ((lo[i], -128, a), (hi[i], 127, b)) if f)
                            + ' on the training samples: its range widened x2')
            if not new:
                break
            for t, e in new:
                widen(g, t, e)
            steps += new
    return steps
