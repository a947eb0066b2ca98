"""Graphs as another exporter writes them, built here with circle_build: what Keras 3
puts in a .tflite that our own examples never had (tests/formats/test_rewrite.py,
tests/int8/test_fromfloat.py)."""
import os

import numpy as np

from host_tools.formats.circle_build import CircleBuilder


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def build_keras_shapes(path, three_d=False, seed=0):
    """What Keras 3 exports for Reshape + Conv + GlobalMaxPooling, built here: the
    batch read at run time (SHAPE -> STRIDED_SLICE shrink -> PACK with constant dims ->
    RESHAPE [1, 1, L, 3]; the input's batch left open in every activation's shape
    signature, which ONERT cannot run as it is), a 1xk CONV_2D, REDUCE_MAX over H and W (three_d: the conv
    map reshaped to [1, L', C] and reduced over axis 1, keep_dims), an FC without bias.
    Returns (path, numpy forward of the model as its ops define it)."""
    rng = np.random.default_rng(seed)
    L, C, O = 12, 5, 3
    w = _rand(rng, C, 1, 3, 3)
    bc = _rand(rng, C)
    wf = _rand(rng, O, C)
    b = CircleBuilder(identifier=b'TFL3')

    def act(name, shape):       # an activation: Keras 3 leaves its batch open
        return b.tensor(name, shape, signature=[-1] + list(shape[1:]))
    x = act('x', [1, L, 3])
    shp = b.tensor('shape', [3], dtype=np.int32)
    b.op('SHAPE', [x], [shp], out_type='INT32')
    i0 = b.tensor('i0', [1], data=np.array([0], np.int32))
    i1 = b.tensor('i1', [1], data=np.array([1], np.int32))
    n = b.tensor('n', [], dtype=np.int32)
    b.op('STRIDED_SLICE', [shp, i0, i1, i1], [n], shrink_axis_mask=1)
    dims = [b.tensor(f'd{k}', [], data=np.array(v, np.int32)) for k, v in enumerate((1, L, 3))]
    new = b.tensor('new', [4], dtype=np.int32)
    b.op('PACK', [n] + dims, [new], values_count=4, axis=0)
    r = act('r', [1, 1, L, 3])
    b.op('RESHAPE', [x, new], [r])
    c = act('c', [1, 1, L - 2, C])
    b.op('CONV_2D', [r, b.tensor('w', w.shape, data=w), b.tensor('bc', [C], data=bc)], [c],
         padding='VALID', fused_activation_function='RELU')
    p = act('p', [1, C])
    if three_d:
        c3 = act('c3', [1, L - 2, C])
        b.op('RESHAPE', [c], [c3], new_shape=[1, L - 2, C])
        pk = act('pk', [1, 1, C])
        b.op('REDUCE_MAX', [c3, b.tensor('ax', [1], data=np.array([1], np.int32))], [pk],
             keep_dims=True)
        b.op('RESHAPE', [pk], [p], new_shape=[1, C])
    else:
        b.op('REDUCE_MAX', [c, b.tensor('ax', [2], data=np.array([1, 2], np.int32))], [p])
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [p, b.tensor('wf', wf.shape, data=wf), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        win = np.stack([xs[:, j:j + 3, :] for j in range(L - 2)], 1)     # [n, L-2, 3, 3]
        z = np.maximum(np.einsum('njkc,okc->njo', win, w[:, 0]) + bc, 0)
        return z.max(1) @ wf.T
    return os.fspath(path), forward


def build_keras_rnn(path, seed=0, T=5, F=3, H=4, O=3):
    """What Keras 3 exports for an unrolled SimpleRNN + Dense, built here: the zero initial
    state as FILL of a shape read at run time (SHAPE -> STRIDED_SLICE -> PACK -> FILL),
    the sequence cut into its steps by UNPACK, each step h = tanh(FC(x_t) + FC(h), the
    recurrent FC without bias and its weight shared by every step), then an FC.  Returns
    (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    wx, bx, wh = _rand(rng, H, F), _rand(rng, H), _rand(rng, H, H) * 0.5
    wo, bo = _rand(rng, O, H), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')

    def act(name, shape):
        return b.tensor(name, shape, signature=[-1] + list(shape[1:]))
    x = act('x', [1, T, F])
    shp = b.tensor('shape', [3], dtype=np.int32)
    b.op('SHAPE', [x], [shp], out_type='INT32')
    i0 = b.tensor('i0', [1], data=np.array([0], np.int32))
    i1 = b.tensor('i1', [1], data=np.array([1], np.int32))
    n = b.tensor('n', [], dtype=np.int32)
    b.op('STRIDED_SLICE', [shp, i0, i1, i1], [n], shrink_axis_mask=1)
    dims = b.tensor('dims', [2], dtype=np.int32)
    b.op('PACK', [n, b.tensor('h', [], data=np.array(H, np.int32))], [dims], values_count=2,
         axis=0)
    h = act('h0', [1, H])
    b.op('FILL', [dims, b.tensor('zero', [], data=np.array(0.0, np.float32))], [h])
    steps = [act(f'x{t}', [1, F]) for t in range(T)]
    b.op('UNPACK', [x], steps, num=T, axis=1)
    twx, tbx, twh = (b.tensor('wx', wx.shape, data=wx), b.tensor('bx', [H], data=bx),
                     b.tensor('wh', wh.shape, data=wh))
    for t in range(T):
        a, r, s = act(f'a{t}', [1, H]), act(f'r{t}', [1, H]), act(f's{t}', [1, H])
        b.op('FULLY_CONNECTED', [steps[t], twx, tbx], [a])
        b.op('FULLY_CONNECTED', [h, twh, -1], [r])
        b.op('ADD', [a, r], [s])
        h = act(f'h{t + 1}', [1, H])
        b.op('TANH', [s], [h])
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [h, b.tensor('wo', wo.shape, data=wo), b.tensor('bo', [O], data=bo)],
         [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        hs = np.zeros((len(xs), H))
        for t in range(T):
            hs = np.tanh(xs[:, t] @ wx.T + bx + hs @ wh.T)
        return hs @ wo.T + bo
    return os.fspath(path), forward


def build_keras_upsample(path, seed=0, H=3, W=4, C=2, O=3):
    """What Keras 3 exports for Conv2D -> UpSampling2D((2, 1)) -> Flatten -> Dense, built
    here: the rows repeated by EXPAND_DIMS [1, H, 1, W, C] -> TILE [1, 1, 2, 1, 1] (a 5-D
    tensor) -> RESHAPE to a shape computed at run time (SHAPE -> STRIDED_SLICE ->
    CONCATENATION), whose output the file gives the wrong static shape [1, 1, 2H, ...]
    as the converter does when it cannot infer it.  Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    w, bc = _rand(rng, C, 1, 1, 1), _rand(rng, C)
    wf, bf = _rand(rng, O, 2 * H * W * C), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')

    def act(name, shape):
        return b.tensor(name, shape, signature=[-1] + list(shape[1:]))
    x = act('x', [1, H, W, 1])
    c = act('c', [1, H, W, C])
    b.op('CONV_2D', [x, b.tensor('w', w.shape, data=w), b.tensor('bc', [C], data=bc)], [c],
         padding='VALID', fused_activation_function='RELU')
    e = act('e', [1, H, 1, W, C])
    b.op('EXPAND_DIMS', [c, b.tensor('ax', [], data=np.array(2, np.int32))], [e])
    t = act('t', [1, H, 2, W, C])
    b.op('TILE', [e, b.tensor('mult', [5], data=np.array([1, 1, 2, 1, 1], np.int32))], [t])
    shp = b.tensor('shape', [4], dtype=np.int32)
    b.op('SHAPE', [c], [shp], out_type='INT32')
    n = b.tensor('n', [1], dtype=np.int32)
    i0 = b.tensor('i0', [1], data=np.array([0], np.int32))
    i1 = b.tensor('i1', [1], data=np.array([1], np.int32))
    b.op('STRIDED_SLICE', [shp, i0, i1, i1], [n], begin_mask=1)
    new = b.tensor('new', [4], dtype=np.int32)
    b.op('CONCATENATION', [n, b.tensor('rest', [3], data=np.array([2 * H, W, C], np.int32))],
         [new], axis=0)
    u = b.tensor('u', [1, 1, 2 * H, W], signature=[-1, -1, 2 * H, W])  # (wrong: as converters do)
    b.op('RESHAPE', [t, new], [u])
    f = act('f', [1, 2 * H * W * C])
    b.op('RESHAPE', [u], [f], new_shape=[1, 2 * H * W * C])
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [f, b.tensor('wf', wf.shape, data=wf), b.tensor('bf', [O], data=bf)],
         [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        z = np.maximum(xs.reshape(len(xs), H, W, 1) * w[:, 0, 0, 0] + bc, 0)    # [n, H, W, C]
        z = np.repeat(z, 2, axis=1)
        return z.reshape(len(xs), -1) @ wf.T + bf
    return os.fspath(path), forward


def build_keras_layernorm(path, seed=0, F=6, H=8, O=2, eps=1e-3):
    """What Keras 3 exports for Dense(elu) -> LayerNormalization -> Dense, built here:
    ELU, then the moments as MEAN, NEG of the mean, SQUARED_DIFFERENCE, MEAN, ADD eps,
    RSQRT, and gamma and beta applied through MULs and ADDs as the converter orders them.
    Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    w1, b1 = _rand(rng, H, F), _rand(rng, H)
    gamma, beta = 1 + 0.2 * _rand(rng, 1, H), 0.2 * _rand(rng, 1, H)
    w2, b2 = _rand(rng, O, H), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')

    def act(name, shape):
        return b.tensor(name, shape, signature=[-1] + list(shape[1:]))

    def op(name, ins, shape, **kw):
        out = act(name.lower() + str(len(ins)) + str(op.n), shape)
        op.n += 1
        b.op(name, ins, [out], **kw)
        return out
    op.n = 0
    x = act('x', [1, F])
    h = op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [H], data=b1)], [1, H])
    h = op('ELU', [h], [1, H])
    ax = b.tensor('ax', [1], data=np.array([-1], np.int32))
    mean = op('MEAN', [h, ax], [1, 1], keep_dims=True)
    neg = op('NEG', [mean], [1, 1])
    sq = op('SQUARED_DIFFERENCE', [h, mean], [1, H])
    var = op('MEAN', [sq, ax], [1, 1], keep_dims=True)
    ve = op('ADD', [var, b.tensor('eps', [], data=np.array(eps, np.float32))], [1, 1])
    r = op('RSQRT', [ve], [1, 1])
    m = op('MUL', [r, b.tensor('gamma', [1, H], data=gamma)], [1, H])
    m1 = op('MUL', [neg, m], [1, H])
    a1 = op('ADD', [m1, b.tensor('beta', [1, H], data=beta)], [1, H])
    m2 = op('MUL', [h, m], [1, H])
    n = op('ADD', [m2, a1], [1, H])
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [n, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [O], data=b2)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        z = xs @ w1.T + b1
        z = np.where(z > 0, z, np.expm1(np.minimum(z, 0)))
        mu = z.mean(1, keepdims=True)
        v = ((z - mu) ** 2).mean(1, keepdims=True)
        z = (z - mu) / np.sqrt(v + eps) * gamma + beta
        return z @ w2.T + b2
    return os.fspath(path), forward
