"""Int8 models trained as int8 (issue 16), host side: the layer table q8.json and the
int8 .wof that utrain.q8 runs, and the export of trained int8 weights back into the
model with its original scales and layout.

The requantization parameters follow TFLite Micro: QuantizeMultiplier of
s_x * s_W[c] / s_y per output channel for FULLY_CONNECTED / CONV_2D /
DEPTHWISE_CONV_2D, and MEAN's s_x / s_y with 1/N folded in as reduce_common.cc does.
The final SOFTMAX is left out: utrain's loss takes the dequantized logits in float."""
from __future__ import annotations

import json
import math
import os

import numpy as np

from .circle_io import Graph, atomic_write, read_model
from . import wof as hwof

FC, CONV, DW, MEAN = 0, 1, 2, 3
KINDS = {'FULLY_CONNECTED': FC, 'CONV_2D': CONV, 'DEPTHWISE_CONV_2D': DW, 'MEAN': MEAN}
TRAINABLE = (FC, CONV, DW)
BACK = (FC, CONV, DW, MEAN)          # kinds utrain.q8 passes a gradient through


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


def _pad(n, k, s, d, padding):
    if padding == 'VALID':
        out = (n - (k - 1) * d - 1) // s + 1
        return out, 0
    out = (n + s - 1) // s
    return out, max((out - 1) * s + (k - 1) * d + 1 - n, 0) // 2


def is_int8(g: Graph) -> bool:
    """True when the model's input and weights are int8 with scales (an int8 model)."""
    t = g.tensors[g.inputs[0]]
    return t.dtype == 'int8' and bool(t.quant and t.quant.get('scale'))


def layers(g: Graph, train='last:1'):
    """The q8 layer table of graph g: one dict per op, ending before a final SOFTMAX.
    train: as prepare's --train ('all', 'none', 'last:N': the last N operators of any
    kind, or op indices); the FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D ops among
    them train, and every op after the first trained one passes its gradient back
    ('back')."""
    ops = list(g.ops)
    if ops and ops[-1].name == 'SOFTMAX':
        ops = ops[:-1]
    out = []
    for op in ops:
        k = KINDS.get(op.name)
        if k is None:
            raise ValueError(f'{g.path}: op {op.index} ({op.name}) is not supported by int8 '
                             'training (FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, MEAN); '
                             'prepare --dequantize trains it in float')
        x, y = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
        sx, zx = _q(x)
        sy, zy = _q(y)
        d = {'k': k, 'op': op.index, 'zx': zx[0], 'zy': zy[0], 'sx': sx[0], 'sy': sy[0],
             'nout': int(np.prod(y.shape))}
        lo, hi = _act_range(op.options.get('fused_activation_function', 'NONE'), sy[0], zy[0])
        d['lo'], d['hi'] = lo, hi
        if k == MEAN:
            axis = sorted(int(a) % 4 for a in g.tensors[op.inputs[1]].data.ravel())
            if len(x.shape) != 4 or axis != [1, 2]:
                raise ValueError(f'{g.path}: MEAN op {op.index} must reduce H and W of NHWC')
            n = x.shape[1] * x.shape[2]
            m, e = quantize_multiplier(sx[0] / sy[0])
            sh = min(int(math.floor(math.log2(n))), 32, 31 + e)
            d.update(n=n, mul=[int((m << sh) // n)], shf=[e - sh])
            out.append(d)
            continue
        w = g.tensors[op.inputs[1]]
        sw, _ = _q(w)
        if len(op.inputs) < 3 or op.inputs[2] < 0:
            raise ValueError(f'{g.path}: op {op.index} ({op.name}) has no bias tensor; int8 '
                             'training needs one')
        b = g.tensors[op.inputs[2]]
        if b.dtype != 'int32':
            raise ValueError(f'{g.path}: bias {b.name!r} of op {op.index} is {b.dtype}, not int32')
        mm = [quantize_multiplier(sx[0] * s / sy[0]) for s in sw]
        d.update(wt=op.inputs[1], bt=op.inputs[2], wn=int(w.data.size), nb=int(b.data.size),
                 sw=sw, mul=[m for m, _ in mm], shf=[e for _, e in mm])
        if k == FC:
            d['nin'] = int(w.shape[1])
        else:
            H, W, I = x.shape[1:]
            if k == CONV:
                O, KH, KW, _ = w.shape
            else:
                _, KH, KW, O = w.shape
            dh, dw = op.options.get('dilation_h_factor', 1), op.options.get('dilation_w_factor', 1)
            sh, sw_ = op.options.get('stride_h', 1), op.options.get('stride_w', 1)
            OH, ph = _pad(H, KH, sh, dh, op.options.get('padding', 'SAME'))
            OW, pw = _pad(W, KW, sw_, dw, op.options.get('padding', 'SAME'))
            d['g'] = [H, W, I, O, KH, KW, sh, sw_, ph, pw, OH, OW, dh, dw]
        out.append(d)
    from .passes import parse_train
    ops_on = parse_train(train, len(g.ops))
    chosen = [i for i, d in enumerate(out) if d['k'] in TRAINABLE and d['op'] in ops_on]
    if chosen:
        for i in range(chosen[0] + 1, len(out)):
            d = out[i]
            if d['k'] not in BACK:
                raise ValueError(f'{g.path}: op {d["op"]} lies between trained layers; int8 '
                                 'training passes no gradient through it (train later layers '
                                 'only, or prepare --dequantize)')
            d['back'] = 1                     # passes the gradient back to a trained layer
        for i in chosen:
            out[i]['train'] = 1
    return out


def meta(g: Graph, train='last:1') -> dict:
    ls = layers(g, train)
    x, y = g.tensors[g.inputs[0]], g.tensors[g.ops[ls[-1]['op']].outputs[0]]
    (sx,), (zx,) = _q(x)
    (sy,), (zy,) = _q(y)
    return {'format': 'utrain-q8', 'version': 1, 'ntensors': len(g.tensors), 'layers': ls,
            'sx': sx, 'zx': zx, 'sy': sy, 'zy': zy, 'nin': int(np.prod(x.shape)),
            'nclass': int(np.prod(y.shape))}


def wof_arrays(g: Graph, m: dict) -> dict:
    """{tensor: int8/int32 array} of every weight and bias in the layer table."""
    out = {}
    for d in m['layers']:
        if d['k'] != MEAN:
            out[d['wt']] = g.tensors[d['wt']].data
            out[d['bt']] = g.tensors[d['bt']].data
    return out


def write(g: Graph, folder, train='last:1', m=None) -> dict:
    """q8.json and weights.wof (int8 weights as int8 bytes, int32 biases) in folder;
    m: the layer table (meta), made when not given."""
    m = m or meta(g, train)
    os.makedirs(folder, exist_ok=True)
    atomic_write(os.path.join(folder, 'q8.json'), json.dumps(m).encode())
    hwof.write_wof(os.path.join(folder, 'weights.wof'), len(g.tensors), wof_arrays(g, m),
                   keep_dtype=True)
    return m


def read_q8_wof(path, g: Graph, m: dict) -> dict:
    """The int8 weights and int32 biases of a q8 .wof for graph g (checked by the
    device reader)."""
    import io
    from .device import module
    dev = module('wof')
    with open(path, 'rb') as f:
        data = f.read()
    nb = [None] * len(g.tensors)
    for d in m['layers']:
        if d['k'] != MEAN:
            nb[d['wt']], nb[d['bt']] = d['wn'], 4 * d['nb']
    try:
        offs = dev.read_table(io.BytesIO(data), path, nb, nb)[0]
    except dev.FormatError as e:
        raise ValueError(str(e)) from None
    out = {}
    for k, o in enumerate(offs):
        if o:
            t = g.tensors[k]
            dt = np.int8 if t.dtype == 'int8' else np.dtype('<i4')
            out[k] = np.frombuffer(data[o:o + nb[k]], dt).reshape(t.shape).copy()
    return out


def export(model_path, wof_path, out_path, train='last:1') -> str:
    """The int8 model with the trained int8 weights and int32 biases of wof_path, every
    scale, zero point and layout as in model_path."""
    from .rewrite import save_graph
    g = read_model(model_path)
    m = meta(g, train)
    for k, a in read_q8_wof(wof_path, g, m).items():
        g.tensors[k].data = a
    return save_graph(g, out_path)


def prepare_q8(g: Graph, model_path, out_dir, s: dict, train, data=None, test_split=0.0,
               split_seed=0, progress=None) -> dict:
    """prepare's int8 path: q8.json, weights.wof (int8), the samples as int8 at the model
    input's scale and zero point (a sample's bytes are the model's input), train.json
    naming q8.json as the model.  s: the resolved settings."""
    from .prepare import (FILES, OUTPUTS, PrepareError, check_outputs, read_data, write_data,
                          write_run_config)
    if s['loss'] not in ('scce', 'cce') or s['optimizer'] not in ('sgd', 'adam') or s['momentum']:
        raise PrepareError(f'{model_path}: int8 training takes --loss scce or cce, --optimizer '
                           'sgd (no momentum) or adam; --dequantize trains it in float with '
                           f'{s["loss"]}/{s["optimizer"]}'
                           + (f' momentum {s["momentum"]}' if s['momentum'] else ''))
    try:
        m = meta(g, train)
    except ValueError as e:
        raise PrepareError(str(e)) from None
    if not any(d.get('train') for d in m['layers']):
        raise PrepareError(f'{model_path}: nothing to train (no FULLY_CONNECTED, CONV_2D or DEPTHWISE_CONV_2D '
                           f'among --train {train})')
    # the samples as int8 at the model input's scale and zero point
    xy = read_data(data, [m['nin']], m['nclass'], loss=s['loss'])
    check_outputs(out_dir, (model_path, data), OUTPUTS + ('q8.json',))
    write(g, out_dir, train, m)
    files = dict(FILES, model='q8.json', rewritten=None)
    trained = [t for d in m['layers'] if d.get('train') for t in (d['wt'], d['bt'])]
    summary = {'model': os.path.abspath(model_path), 'int8': True, 'train': train,
               'trainable': {g.tensors[k].name: list(g.tensors[k].shape) for k in trained},
               'trainable_params': int(sum(g.tensors[k].data.size for k in trained)),
               'rewritten': None, 'quant': {}}
    summary.update(write_data(out_dir, xy, files, s['loss'], test_split, split_seed, 'int8',
                              m['sx'], -m['zx'] * m['sx']))
    return write_run_config(out_dir, files, s, summary, progress, on_nan='stop')
