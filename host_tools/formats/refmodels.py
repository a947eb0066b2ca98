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


def small_cnn(path, seed=0, size=16, channels=8, classes=5):
    """The memory issues' held-out CNN: a size x size x 1 input -> CONV_2D 3x3 SAME
    (channels, RELU) -> MAX_POOL_2D 2x2/2 -> RESHAPE -> FULLY_CONNECTED (classes) ->
    SOFTMAX; 2,645 parameters at the defaults (16x16x1, 8 channels, 5 classes)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(description='utrain held-out small CNN')
    x = b.tensor('input', [1, size, size, 1])
    c = b.tensor('conv/out', [1, size, size, channels])
    b.op('CONV_2D', [x, b.tensor('conv/weight', [channels, 3, 3, 1],
                                 data=rng.normal(0, (2 / 9) ** 0.5, (channels, 3, 3, 1)).astype(np.float32)),
                     b.tensor('conv/bias', [channels], data=np.zeros(channels, np.float32))], [c],
         padding='SAME', stride_w=1, stride_h=1, fused_activation_function='RELU')
    h = size // 2
    p = b.tensor('pool/out', [1, h, h, channels])
    b.op('MAX_POOL_2D', [c], [p], padding='VALID', stride_w=2, stride_h=2, filter_width=2,
         filter_height=2)
    n = h * h * channels
    f = b.tensor('flat', [1, n])
    b.op('RESHAPE', [p, b.tensor('flat/shape', [2], data=np.array([1, n], np.int32))], [f])
    z = b.tensor('fc/out', [1, classes])
    b.op('FULLY_CONNECTED', [f, b.tensor('fc/weight', [classes, n],
                                         data=rng.normal(0, (2 / n) ** 0.5, (classes, n)).astype(np.float32)),
                             b.tensor('fc/bias', [classes], data=np.zeros(classes, np.float32))], [z])
    y = b.tensor('probs', [1, classes])
    b.op('SOFTMAX', [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return path
