"""`export --quantized --data D`: what writing float-trained weights back into the int8
model costs, measured.  The int8 export keeps the original model's activation scales and
zero points (the weights are quantized with the original per-channel scales); training
moves the activations, so the int8 model can score less than the float weights it came
from (issue 31: 1.00 -> 0.87 on a holdout, silently).  measure() runs both on the
samples of D with utrain's own code under CPython: the trained float model (model.flat
and the weights of the prepared folder) and the int8 export (utrain.q8's integer
forward, as a board trains it) and returns the metric of each."""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from . import dataset as ds
from .device import module

MAX_SAMPLES = 1000


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
    from .circle_io import read_model
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


def measure(run_dir, wof_path, out_path, data, shape, perm=None) -> dict:
    """{'metric', 'float', 'int8', 'samples'} on (at most MAX_SAMPLES of) data's samples
    laid out for the trained model's input of shape (perm: as prepare transposed it), or
    {'error': why not}."""
    with open(os.path.join(run_dir, 'train.json')) as f:
        loss = json.load(f).get('loss', 'scce')
    if not wof_path.endswith('.wof'):
        return {'error': 'measured with a .wof (trained.wof), not a checkpoint'}
    x, y = ds.read_samples(data, shape, perm, None, None)
    x, y = x[:MAX_SAMPLES], y[:MAX_SAMPLES].reshape(min(len(y), MAX_SAMPLES), -1)
    try:
        i8 = _int8_outputs(out_path, x)
    except ValueError as e:
        return {'error': f'the int8 model does not run here ({e})'}
    name, f = _metric(_float_outputs(run_dir, wof_path, x), y, loss)
    _, q = _metric(i8, y, loss)
    return {'metric': name, 'float': f, 'int8': q, 'samples': len(x)}
