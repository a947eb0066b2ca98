"""Reference models for the memory planner's tests and bench/memory.py, built with
circle_build: small enough to build in milliseconds, shaped like the real thing."""
from __future__ import annotations

import numpy as np

from .circle_build import CircleBuilder


def mlp(path, sizes, acts=None, seed=0, softmax=True):
    """FC stack sizes[0] -> sizes[1] -> ... (RELU between, none on the last), then
    SOFTMAX.  He-initialised, zero biases."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    x = b.tensor('x', [1, sizes[0]])
    b.inputs(x)
    n = len(sizes) - 1
    for i in range(n):
        fi, fo = sizes[i], sizes[i + 1]
        w = b.tensor(f'w{i}', [fo, fi], data=rng.normal(0, (2.0 / fi) ** 0.5, (fo, fi)).astype(np.float32))
        bias = b.tensor(f'b{i}', [fo], data=np.zeros(fo, np.float32))
        y = b.tensor(f'h{i}', [1, fo])
        act = (acts[i] if acts else ('RELU' if i < n - 1 else 'NONE'))
        b.op('FULLY_CONNECTED', [x, w, bias], [y], fused_activation_function=act)
        x = y
    if softmax:
        p = b.tensor('p', [1, sizes[-1]])
        b.op('SOFTMAX', [x], [p], beta=1.0)
        x = p
    b.outputs(x)
    b.save(path)
    return path


def mobilenet_head(path, seed=0):
    """The classifier end of a MobileNet-style network on an 8x8 digits input seen as
    features: 64 -> 512 -> 160 -> 96 -> 10 (pointwise-width layers, ~132k parameters,
    the first two far larger than a small board's heap when held in RAM)."""
    return mlp(path, [64, 512, 160, 96, 10], seed=seed)
