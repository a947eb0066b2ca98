"""The reference models of the bench, their data, and the multiply-adds a training
step does (forward + backward, counted from the graph and the backward plan)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from host_tools.formats.circle_build import CircleBuilder
from host_tools.graph.optable import SPECS, DX, DW

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(ROOT, 'datasets', 'digits')


def sine_tflite():
    """tflite-micro's sine_float.tflite (16-16 MLP), found in the installed package."""
    spec = importlib.util.find_spec('tflite_micro')
    if spec is None:
        return None
    for base in spec.submodule_search_locations:
        p = os.path.join(base, 'python', 'tflite_micro', 'sine_float.tflite')
        if os.path.exists(p):
            return p
    return None


def build_dscnn(path, seed=0):
    """MobileNet-style keyword-spotting CNN on a 49x10 input: CONV 3x3/2 (8) ->
    [DEPTHWISE 3x3 + CONV 1x1] x2 (16) -> MEAN over H, W -> FC 12 -> SOFTMAX."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(description='utrain bench DS-CNN 49x10')

    def w(*shape):
        fan = int(np.prod(shape[1:])) if shape[0] != 1 else int(np.prod(shape[1:3]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan)).astype(np.float32)

    x = b.tensor('input', [1, 49, 10, 1])
    h = x
    y = b.tensor('conv0', [1, 25, 5, 8])
    b.op('CONV_2D', [h, b.tensor('conv0/w', [8, 3, 3, 1], w(8, 3, 3, 1)),
                     b.tensor('conv0/b', [8], np.zeros(8, np.float32))], [y],
         padding='SAME', stride_w=2, stride_h=2, fused_activation_function='RELU')
    h, c = y, 8
    for i, oc in enumerate((16, 16)):
        d = b.tensor(f'dw{i}', [1, 25, 5, c])
        b.op('DEPTHWISE_CONV_2D', [h, b.tensor(f'dw{i}/w', [1, 3, 3, c], w(1, 3, 3, c)),
                                   b.tensor(f'dw{i}/b', [c], np.zeros(c, np.float32))], [d],
             padding='SAME', depth_multiplier=1, fused_activation_function='RELU')
        p = b.tensor(f'pw{i}', [1, 25, 5, oc])
        b.op('CONV_2D', [d, b.tensor(f'pw{i}/w', [oc, 1, 1, c], w(oc, 1, 1, c)),
                         b.tensor(f'pw{i}/b', [oc], np.zeros(oc, np.float32))], [p],
             padding='VALID', fused_activation_function='RELU')
        h, c = p, oc
    m = b.tensor('mean', [1, c])
    b.op('MEAN', [h, b.tensor('mean/axis', [2], np.array([1, 2], np.int32))], [m],
         keep_dims=False)
    z = b.tensor('logits', [1, 12])
    b.op('FULLY_CONNECTED', [m, b.tensor('fc/w', [12, c], w(12, c)),
                             b.tensor('fc/b', [12], np.zeros(12, np.float32))], [z])
    out = b.tensor('probs', [1, 12])
    b.op('SOFTMAX', [z], [out], beta=1.0)
    b.inputs(x)
    b.outputs(out)
    b.save(path)
    return path


def reference_models(tmp):
    """[(name, model path or None, why missing)] in table order."""
    cnn = os.path.join(DIGITS, 'digits_cnn.circle')
    sine = sine_tflite()
    return [
        ('sine MLP 1-16-16-1', sine, None if sine else 'tflite-micro not installed'),
        ('digits MLP 64-32-10', os.path.join(DIGITS, 'digits_mlp.circle'), None),
        ('digits CNN', cnn if os.path.exists(cnn) else None,
         None if os.path.exists(cnn) else 'datasets/digits/digits_cnn.circle not there yet'),
        ('DS-CNN 49x10 KWS', build_dscnn(os.path.join(tmp, 'dscnn.circle')), None),
    ]


def unsupported(g):
    """Name of the first op utrain cannot train through, or None."""
    for op in g.ops:
        if op.name not in SPECS:
            return op.name
    return None


def is_classifier(g):
    return g.ops[-1].name == 'SOFTMAX'


def data(g, path, n, seed=1):
    """n samples (x [n, inputs], y) for the model: the digits for digits models,
    sin(x) for the sine model, random inputs and classes otherwise."""
    n_in = int(np.prod(g.tensors[g.inputs[0]].shape))
    n_out = int(np.prod(g.tensors[g.outputs[0]].shape))
    rng = np.random.default_rng(seed)
    if 'digits' in os.path.basename(path) and n_in == 64:
        z = np.load(os.path.join(DIGITS, 'digits.npz'))
        return z['x'][:n].astype(np.float32), z['y'][:n]
    x = rng.standard_normal((n, n_in)).astype(np.float32)
    if is_classifier(g):
        return x, rng.integers(0, n_out, n)
    if n_in == 1 and n_out == 1:
        x = rng.uniform(0, 2 * np.pi, (n, 1)).astype(np.float32)
        return x, np.sin(x)
    return x, rng.standard_normal((n, n_out)).astype(np.float32)


# ops with weights (input position 1) and bias (2), for counting work whether or not
# utrain supports them yet
WEIGHTED = ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D')


def sparse_setting(g):
    """--train last:N that trains only the last op with weights (and what follows)."""
    last = max(op.index for op in g.ops if op.name in WEIGHTED)
    return 'last:%d' % (len(g.ops) - last)


def trained_ops(g, train):
    """Indices of the ops that train under --train all | last:N (ONERT's count)."""
    n = len(g.ops) if train == 'all' else int(train.split(':')[1])
    return set(range(len(g.ops) - n, len(g.ops)))


def backward_flags(g, train):
    """{op index: DX|DW flags} the backward pass computes, as host_tools.graph.passes derives
    them (gradients only where a trained weight needs them), for any op."""
    trained = trained_ops(g, train)
    needs = {}

    def below(op):      # a data input needs its gradient (SPLIT's is input 1, ADD's 0 and 1)
        spec = SPECS.get(op.name)
        ins = spec.data(op) if spec else [(0, op.inputs[0])]
        return any(needs.get(k, False) for _, k in ins)

    for op in g.ops:
        trains = op.index in trained and op.name in WEIGHTED
        for k in op.outputs:
            needs[k] = trains or below(op)
    flags = {}
    for op in g.ops:
        if needs[op.outputs[0]]:
            f = DX if needs.get(op.inputs[0], False) else 0
            if op.index in trained and op.name in WEIGHTED:
                f |= DW
            flags[op.index] = f
    return flags


def trained_params(g, train):
    """Tensor indices of the weights and biases that train."""
    ps = set()
    for i in trained_ops(g, train):
        op = g.ops[i]
        if op.name in WEIGHTED:
            ps.update(k for k in op.inputs[1:3] if k >= 0)
    return ps


def _layer(g, op):
    """(forward MACs, bare-loop dot length K, GEMMs fwd, dx, dw as (M, K, N)) or None."""
    shp = lambda k: list(g.tensors[k].shape)
    if op.name == 'FULLY_CONNECTED':
        o, i = shp(op.inputs[1])
        rows = int(np.prod(shp(op.inputs[0]))) // i
        return rows * i * o, i, [(rows, i, o), (rows, o, i), (o, rows, i)]
    if op.name == 'CONV_2D':
        oc, kh, kw, ic = shp(op.inputs[1])
        _, oh, ow, _ = shp(op.outputs[0])
        m, k = oh * ow, kh * kw * ic
        return m * k * oc, k, [(m, k, oc), (m, oc, k), (oc, m, k)]
    if op.name == 'DEPTHWISE_CONV_2D':
        _, kh, kw, c = shp(op.inputs[1])
        _, oh, ow, _ = shp(op.outputs[0])
        m, k = oh * ow, kh * kw
        return m * k * c, k, [(m * c, k, 1), (m * c, 1, k), (c, m, k)]
    return None


def work(g, train):
    """Multiply-adds of one training step under the --train setting, and the same work
    as bare-loop shapes: {'macs', 'loops': [(K, reps)], 'gemms': [(M, K, N)]}."""
    flags = backward_flags(g, train)
    macs, loops, gemms = 0, [], []
    for op in g.ops:
        layer = _layer(g, op)
        if layer is None:
            continue
        n, k, (fwd, dx, dw) = layer
        parts = [fwd]
        f = flags.get(op.index, 0)
        if f & DX:
            parts.append(dx)
        if f & DW:
            parts.append(dw)
        macs += n * len(parts)
        loops.append((k, n * len(parts) // k))
        gemms.extend(parts)
    return {'macs': macs, 'loops': loops, 'gemms': gemms}

