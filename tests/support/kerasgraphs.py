"""Graphs as another exporter writes them, built here with circle_build: what Keras 3
puts in a .tflite that our own examples never had (tests/formats/test_rewrite.py,
tests/int8/test_fromfloat.py)."""
import functools
import os

import numpy as np

from host_tools.formats.circle_build import CircleBuilder


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _qclip(v, s, z):
    """Real values v clipped to the range of int8 at scale s, zero point z."""
    return np.clip(v, (-128 - z) * s, (127 - z) * s)


def _act(b, name, shape):
    """An activation whose batch the file leaves open (signature -1), as Keras 3 writes it."""
    return b.tensor(name, shape, signature=[-1] + list(shape[1:]))


def _batch_and(b, x, rank, dims):
    """Keras 3's shape read at run time: SHAPE of x (rank axes) -> STRIDED_SLICE of the
    batch -> PACK with the constant dims after it.  Returns the packed shape tensor."""
    shp = b.tensor('shape', [rank], dtype=np.int32)
    b.op('SHAPE', [x], [shp], out_type='INT32')
    i0 = b.tensor('i0', [1], data=np.array([0], np.int32))
    i1 = b.tensor('i1', [1], data=np.array([1], np.int32))
    n = b.tensor('n', [], dtype=np.int32)
    b.op('STRIDED_SLICE', [shp, i0, i1, i1], [n], shrink_axis_mask=1)
    ds = [b.tensor(f'd{k}', [], data=np.array(v, np.int32)) for k, v in enumerate(dims)]
    new = b.tensor('new', [1 + len(dims)], dtype=np.int32)
    b.op('PACK', [n] + ds, [new], values_count=1 + len(dims), axis=0)
    return new


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

    act = functools.partial(_act, b)
    x = act('x', [1, L, 3])
    new = _batch_and(b, x, 3, (1, L, 3))
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

    act = functools.partial(_act, b)
    x = act('x', [1, T, F])
    dims = _batch_and(b, x, 3, (H,))
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


def build_keras_upsample(path, seed=0, H=3, W=4, C=2, O=3, tail='flatten'):
    """What Keras 3 exports for Conv2D -> UpSampling2D((2, 1)) -> Flatten -> Dense, built
    here: the rows repeated by EXPAND_DIMS [1, H, 1, W, C] -> TILE [1, 1, 2, 1, 1] (a 5-D
    tensor) -> RESHAPE to a shape computed at run time (SHAPE -> STRIDED_SLICE ->
    CONCATENATION), whose output the file gives the wrong static shape [1, 1, 2H, ...]
    as the converter does when it cannot infer it.  tail 'conv': the upsampled map goes
    on to a 1x2 VALID Conv2D (relu), GlobalAveragePooling2D (MEAN) and the Dense, and
    the file's shapes are wrong from the RESHAPE to the conv's output, as the converter
    writes them (the upsampled [1, 2H, W, C] as [1, 1, W, C], the conv's [1, 2H, W - 1,
    C2] as [1, 1, W - 1, C2]).  tail 'crop': 'conv' with Keras's Cropping2D(((1, 1),
    (1, 0))) before the conv, a STRIDED_SLICE whose file shape is wrong too ([1, 1, W - 1,
    C] for [1, 2H - 2, W - 1, C]).  tail 'up': the upsampled map is the model's output
    (a decoder's last layer, regression), its file shape wrong ([1, 1, W, C] with
    signature [-1, -1, W, C]); 'conv-out': the conv after it is (no pool, no Dense).
    Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    w, bc = _rand(rng, C, 1, 1, 1), _rand(rng, C)
    C2 = 3
    w2, b2 = _rand(rng, C2, 1, 2, C), _rand(rng, C2)
    wf, bf = _rand(rng, O, 2 * H * W * C if tail == 'flatten' else C2), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')

    act = functools.partial(_act, b)
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
    if tail == 'flatten':
        u = b.tensor('u', [1, 1, 2 * H, W], signature=[-1, -1, 2 * H, W])  # (wrong: as converters do)
        b.op('RESHAPE', [t, new], [u])
        f = act('f', [1, 2 * H * W * C])
        b.op('RESHAPE', [u], [f], new_shape=[1, 2 * H * W * C])
    else:
        u = b.tensor('u', [1, 1, W, C], signature=[-1, -1, W, C])            # (wrong)
        b.op('RESHAPE', [t, new], [u])
        Wc = W
    if tail in ('up', 'conv-out'):
        if tail == 'conv-out':
            v = b.tensor('v', [1, 1, W - 1, C2], signature=[-1, -1, W - 1, C2])   # (wrong)
            b.op('CONV_2D', [u, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [C2], data=b2)],
                 [v], padding='VALID', fused_activation_function='RELU')
            u = v
        y = u
    elif tail != 'flatten':
        if tail == 'crop':      # Cropping2D(((1, 1), (1, 0))): a STRIDED_SLICE
            Wc = W - 1
            k = b.tensor('k', [1, 1, Wc, C], signature=[-1, -1, Wc, C])      # (wrong)
            b.op('STRIDED_SLICE', [u, b.tensor('cb', [4], data=np.array([0, 1, 1, 0], np.int32)),
                                   b.tensor('ce', [4], data=np.array([0, -1, 0, 0], np.int32)),
                                   b.tensor('cs', [4], data=np.ones(4, np.int32))], [k],
                 begin_mask=9, end_mask=13)
            u = k
        v = b.tensor('v', [1, 1, Wc - 1, C2], signature=[-1, -1, Wc - 1, C2])  # (wrong)
        b.op('CONV_2D', [u, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [C2], data=b2)], [v],
             padding='VALID', fused_activation_function='RELU')
        f = act('f', [1, C2])
        b.op('MEAN', [v, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [f])
    if tail not in ('up', 'conv-out'):
        y = act('y', [1, O])
        b.op('FULLY_CONNECTED', [f, b.tensor('wf', wf.shape, data=wf), b.tensor('bf', [O], data=bf)],
             [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        z = np.maximum(xs.reshape(len(xs), H, W, 1) * w[:, 0, 0, 0] + bc, 0)    # [n, H, W, C]
        z = np.repeat(z, 2, axis=1)
        if tail == 'up':
            return z
        if tail == 'conv-out':
            return np.maximum(np.einsum('nhwc,oc->nhwo', z[:, :, :-1], w2[:, 0, 0]) +
                              np.einsum('nhwc,oc->nhwo', z[:, :, 1:], w2[:, 0, 1]) + b2, 0)
        if tail == 'crop':
            z = z[:, 1:-1, 1:]
        if tail != 'flatten':
            z = np.maximum(np.einsum('nhwc,oc->nhwo', z[:, :, :-1], w2[:, 0, 0]) +
                           np.einsum('nhwc,oc->nhwo', z[:, :, 1:], w2[:, 0, 1]) + b2, 0)
            return z.mean((1, 2)) @ wf.T + bf
        return z.reshape(len(xs), -1) @ wf.T + bf
    return os.fspath(path), forward


def _dilated(x, kh, kw, d, pads):
    """numpy: the windows [n, OH, OW, kh, kw, C] of a dilated VALID convolution, by its
    definition: x [n, H, W, C] padded by pads ((top, bottom), (left, right)), dilation d
    (dh, dw)."""
    xp = np.pad(x, ((0, 0),) + tuple(pads) + ((0, 0),))
    OH, OW = xp.shape[1] - d[0] * (kh - 1), xp.shape[2] - d[1] * (kw - 1)
    return np.stack([np.stack([xp[:, i * d[0]:i * d[0] + OH, j * d[1]:j * d[1] + OW]
                               for j in range(kw)], 3) for i in range(kh)], 3)


def build_keras_dilated(path, seed=0, L=13, C=2, O=3, H=5, K=4):
    """What TFLite's converter writes for dilated convolutions (Keras Conv1D causal with
    dilation_rate 2, DepthwiseConv2D SAME with dilation_rate 2), built here:
    PAD (causal) -> SPACE_TO_BATCH_ND [2] paddings [0, 1] -> EXPAND_DIMS -> CONV_2D VALID
    -> RESHAPE -> BATCH_TO_SPACE_ND crops [0, 1] -> ADD bias (RELU); an FC to a 2-D map
    [1, H, H, K] -> SPACE_TO_BATCH_ND [2, 2] paddings
    [2, 3] -> DEPTHWISE_CONV_2D VALID -> BATCH_TO_SPACE_ND crops [0, 1] -> FC.  The blocked
    tensors' static shapes keep batch 1, as the converter leaves them.  Returns (path,
    numpy forward by the definition: dilated convolutions)."""
    rng = np.random.default_rng(seed)
    w1, b1 = _rand(rng, O, 1, 3, C), _rand(rng, O)
    wm, bm = _rand(rng, H * H * K, L * O) * 0.3, _rand(rng, H * H * K)
    wd = _rand(rng, 1, 3, 3, K)
    wf, bf = _rand(rng, 3, H * H * K) * 0.3, _rand(rng, 3)
    b = CircleBuilder(identifier=b'TFL3')

    act = functools.partial(_act, b)

    def ints(name, v):
        v = np.array(v, np.int32)
        return b.tensor(name, list(v.shape), data=v)
    x = act('x', [1, L, C])
    xp = act('xp', [1, L + 4, C])
    b.op('PAD', [x, ints('causal', [[0, 0], [4, 0], [0, 0]])], [xp])
    s = act('s', [1, (L + 5) // 2, C])
    b.op('SPACE_TO_BATCH_ND', [xp, ints('blk1', [2]), ints('pad1', [[0, 1]])], [s])
    e = act('e', [1, 1, (L + 5) // 2, C])
    b.op('EXPAND_DIMS', [s, ints('ax', -3)], [e])
    c = act('c', [1, 1, (L + 5) // 2 - 2, O])
    b.op('CONV_2D', [e, b.tensor('w1', w1.shape, data=w1), b.tensor('z1', [O], data=np.zeros(O, np.float32))],
         [c], padding='VALID')
    r = act('r', [1, (L + 5) // 2 - 2, O])
    b.op('RESHAPE', [c, ints('shp1', [-1, (L + 5) // 2 - 2, O])], [r])
    u = act('u', [1, L, O])
    b.op('BATCH_TO_SPACE_ND', [r, ints('blk1b', [2]), ints('crop1', [[0, 1]])], [u])
    a = act('a', [1, L, O])
    b.op('ADD', [u, b.tensor('b1', [1, 1, O], data=b1.reshape(1, 1, O))], [a],
         fused_activation_function='RELU')
    f = act('f', [1, L * O])
    b.op('RESHAPE', [a], [f], new_shape=[1, L * O])
    m = act('m', [1, H * H * K])
    b.op('FULLY_CONNECTED', [f, b.tensor('wm', wm.shape, data=wm), b.tensor('bm', [H * H * K], data=bm)], [m])
    m4 = act('m4', [1, H, H, K])
    b.op('RESHAPE', [m], [m4], new_shape=[1, H, H, K])
    s2 = act('s2', [1, (H + 5) // 2, (H + 5) // 2, K])
    b.op('SPACE_TO_BATCH_ND', [m4, ints('blk2', [2, 2]), ints('pad2', [[2, 3], [2, 3]])], [s2])
    dz = act('dz', [1, (H + 5) // 2 - 2, (H + 5) // 2 - 2, K])
    b.op('DEPTHWISE_CONV_2D', [s2, b.tensor('wd', wd.shape, data=wd), b.tensor('zd', [K], data=np.zeros(K, np.float32))],
         [dz], padding='VALID', depth_multiplier=1)
    d2 = act('d2', [1, H, H, K])
    b.op('BATCH_TO_SPACE_ND', [dz, ints('blk2b', [2, 2]), ints('crop2', [[0, 1], [0, 1]])], [d2])
    g = act('g', [1, H * H * K])
    b.op('RESHAPE', [d2], [g], new_shape=[1, H * H * K])
    y = act('y', [1, 3])
    b.op('FULLY_CONNECTED', [g, b.tensor('wf', wf.shape, data=wf), b.tensor('bf', [3], data=bf)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        n = len(xs)
        win = _dilated(xs.reshape(n, 1, L, C), 1, 3, (1, 2), ((0, 0), (4, 0)))   # n 1 L 1 3 C
        h = np.maximum(np.einsum('nabijc,oijc->nabo', win, w1) + b1, 0).reshape(n, L * O)
        h = (h @ wm.T + bm).reshape(n, H, H, K)
        win = _dilated(h, 3, 3, (2, 2), ((2, 2), (2, 2)))                         # n H H 3 3 K
        h = np.einsum('nabijk,ijk->nabk', win, wd[0]).reshape(n, -1)
        return h @ wf.T + bf
    return os.fspath(path), forward


def build_keras_dilated_shared_zero(path, seed=0, L=13, C=2, O=3):
    """Keras Conv1D(dilation_rate=2, causal, bias) then Dense(O) whose zero bias the
    converter keeps as one tensor with the conv's: PAD -> SPACE_TO_BATCH_ND -> EXPAND_DIMS
    -> CONV_2D (the shared zeros) -> RESHAPE -> BATCH_TO_SPACE_ND -> ADD (the conv's bias)
    -> RESHAPE -> FULLY_CONNECTED (the shared zeros)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')

    def ints(name, v):
        v = np.array(v, np.int32)
        return b.tensor(name, list(v.shape), data=v)
    z = b.tensor('zeros', [O], data=np.zeros(O, np.float32))
    x, xp = _act(b, 'x', [1, L, C]), _act(b, 'xp', [1, L + 4, C])
    b.op('PAD', [x, ints('causal', [[0, 0], [4, 0], [0, 0]])], [xp])
    s = _act(b, 's', [1, (L + 5) // 2, C])
    b.op('SPACE_TO_BATCH_ND', [xp, ints('blk', [2]), ints('pad', [[0, 1]])], [s])
    e = _act(b, 'e', [1, 1, (L + 5) // 2, C])
    b.op('EXPAND_DIMS', [s, ints('ax', -3)], [e])
    w1 = _rand(rng, O, 1, 3, C)
    c = _act(b, 'c', [1, 1, (L + 5) // 2 - 2, O])
    b.op('CONV_2D', [e, b.tensor('w1', w1.shape, data=w1), z], [c], padding='VALID')
    r = _act(b, 'r', [1, (L + 5) // 2 - 2, O])
    b.op('RESHAPE', [c, ints('shp', [-1, (L + 5) // 2 - 2, O])], [r])
    u = _act(b, 'u', [1, L, O])
    b.op('BATCH_TO_SPACE_ND', [r, ints('blkb', [2]), ints('crop', [[0, 1]])], [u])
    a = _act(b, 'a', [1, L, O])
    b.op('ADD', [u, b.tensor('b1', [1, 1, O], data=_rand(rng, 1, 1, O))], [a],
         fused_activation_function='RELU')
    f = _act(b, 'f', [1, L * O])
    b.op('RESHAPE', [a], [f], new_shape=[1, L * O])
    w2 = _rand(rng, O, L * O) * 0.3
    y = _act(b, 'y', [1, O])
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', w2.shape, data=w2), z], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return os.fspath(path)


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

    act = functools.partial(_act, b)

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


def build_keras_gates(path, seed=0, F=5, H=6, O=2, lo=0.4):
    """Elementwise layers a converter writes as ops of their own, built here: Dense ->
    PReLU (PRELU, a slope per unit), a second Dense beside it, Maximum of the two
    (MAXIMUM), Minimum with a scalar (MINIMUM), UnitNormalization (L2_NORMALIZATION),
    Dense.  Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    w1, b1, alpha = _rand(rng, H, F), _rand(rng, H), 0.5 * _rand(rng, H)
    w2, b2 = _rand(rng, H, F), _rand(rng, H)
    w3, b3 = _rand(rng, O, H), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')

    act = functools.partial(_act, b)
    x = act('x', [1, F])
    h = act('h', [1, H])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [H], data=b1)], [h])
    p = act('p', [1, H])
    b.op('PRELU', [h, b.tensor('alpha', [H], data=alpha)], [p])
    q = act('q', [1, H])
    b.op('FULLY_CONNECTED', [x, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [H], data=b2)], [q])
    m = act('m', [1, H])
    b.op('MAXIMUM', [p, q], [m])
    n = act('n', [1, H])
    b.op('MINIMUM', [m, b.tensor('lo', [], data=np.array(lo, np.float32))], [n])
    u = act('u', [1, H])
    b.op('L2_NORMALIZATION', [n], [u])
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [u, b.tensor('w3', w3.shape, data=w3), b.tensor('b3', [O], data=b3)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs, w1=w1, alpha=alpha, w3=w3):
        h = xs @ w1.T + b1
        p = np.where(h > 0, h, alpha * h)
        n = np.minimum(np.maximum(p, xs @ w2.T + b2), lo)
        u = n / np.sqrt((n * n).sum(1, keepdims=True))
        return u @ w3.T + b3
    return os.fspath(path), forward


def build_keras_abs_square_sum(path, seed=0, F=5, H=6, O=2):
    """ABS, SQUARE and SUM as a converter writes them for Keras ops (tf.abs, tf.square,
    tf.reduce_sum(keepdims=True)), built here: Dense -> |h| + h^2 -> its sum over the
    units scales h -> Dense.  Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    w1, b1 = 0.5 * _rand(rng, H, F), _rand(rng, H)
    w3, b3 = _rand(rng, O, H), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')

    act = functools.partial(_act, b)
    x = act('x', [1, F])
    h = act('h', [1, H])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [H], data=b1)], [h])
    a, q, c, m, z = (act(n, s) for n, s in (('a', [1, H]), ('q', [1, H]), ('c', [1, H]),
                                             ('m', [1, 1]), ('z', [1, H])))
    b.op('ABS', [h], [a])
    b.op('SQUARE', [h], [q])
    b.op('ADD', [a, q], [c])
    b.op('SUM', [c, b.tensor('axis', [1], data=np.array([1], np.int32))], [m], keep_dims=True)
    b.op('MUL', [h, m], [z])
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [z, b.tensor('w3', w3.shape, data=w3), b.tensor('b3', [O], data=b3)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs, w1=w1, w3=w3):
        h = xs @ w1.T + b1
        return h * (np.abs(h) + h * h).sum(1, keepdims=True) @ w3.T + b3
    return os.fspath(path), forward


def build_keras_resize(path, seed=0, H=3, W=2, C=2, O=3, fy=2, fx=3):
    """Keras 2's UpSampling2D / Resizing(interpolation='nearest') and tico's nn.Upsample
    as converters write them, built here: Conv2D 1x1 (relu) -> RESIZE_NEAREST_NEIGHBOR to
    [fy H, fx W] (half-pixel centres) -> Conv2D 2x2 VALID (relu) -> MEAN over H, W ->
    Dense.  Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    w, bc = _rand(rng, C, 1, 1, 1), np.abs(_rand(rng, C)) + 0.3      # (the relus alive)
    w2, b2 = _rand(rng, 3, 2, 2, C), np.abs(_rand(rng, 3)) + 0.3
    wf, bf = _rand(rng, O, 3), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, H, W, 1])
    c = b.tensor('c', [1, H, W, C])
    b.op('CONV_2D', [x, b.tensor('w', w.shape, data=w), b.tensor('bc', [C], data=bc)], [c],
         padding='VALID', fused_activation_function='RELU')
    u = b.tensor('u', [1, fy * H, fx * W, C])
    b.op('RESIZE_NEAREST_NEIGHBOR', [c, b.tensor('size', [2], data=np.array([fy * H, fx * W], np.int32))],
         [u], align_corners=False, half_pixel_centers=True)
    v = b.tensor('v', [1, fy * H - 1, fx * W - 1, 3])
    b.op('CONV_2D', [u, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [3], data=b2)], [v],
         padding='VALID', fused_activation_function='RELU')
    f = b.tensor('f', [1, 3])
    b.op('MEAN', [v, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [f])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [f, b.tensor('wf', wf.shape, data=wf), b.tensor('bf', [O], data=bf)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        z = np.maximum(xs.reshape(len(xs), H, W, 1) * w[:, 0, 0, 0] + bc, 0)
        z = np.repeat(np.repeat(z, fy, 1), fx, 2)
        v = sum(np.einsum('nhwc,oc->nhwo', z[:, i:i + fy * H - 1, j:j + fx * W - 1], w2[:, i, j])
                for i in range(2) for j in range(2)) + b2
        return np.maximum(v, 0).mean((1, 2)) @ wf.T + bf
    return os.fspath(path), forward


def build_keras_int8_cat(path, seed=0, differ=False, sy=0.1, zy=0):
    """An int8 model as Keras 3's full-integer converter writes one, built here: the
    run-time batch of a Reshape (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE, ops 0-3), a
    1x3 CONV_2D (op 4), a PAD read by a max pool (ops 5, 6: not foldable into a
    convolution), a CONCATENATION of the conv and the pool on channels (op 7), a global
    average (MEAN) and a global max (REDUCE_MAX) of it (ops 8, 9), a CONCATENATION of
    three inputs, one read twice (op 10), an FC without bias (op 11).  Concatenated
    inputs share the output's scale, as TFLite's converter makes them; differ: the MEAN
    at another scale and zero point (requantized by the CONCATENATION); sy: the logits'
    scale (0.002: +-0.26, as a converter calibrates a model that had barely learnt), zy
    their zero point.  Returns (path,
    float numpy forward of the dequantized graph: f(x float [L, 3], conv weights float
    or None) -> logits, the conv's weight scales)."""
    rng = np.random.default_rng(seed)
    L, C, O = 10, 4, 3
    sx, sc = 0.05, 0.04
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    sw = rng.uniform(0.5, 1.0, C) * 0.004      # (conv outputs of a few units: no clamp)
    wq = rng.integers(-127, 128, (C, 1, 3, 3)).astype(np.int8)
    bq = rng.integers(-200, 400, C).astype(np.int32)
    swf = 0.1 * 30 / (6 * C * sc * 60 * 60) * (1 if sy >= 0.1 else sy / 0.1)
    wfq = rng.integers(-127, 128, (O, 6 * C)).astype(np.int8)
    sm, zm = (sc * 0.5, -100) if differ else (sc, -128)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, L, 3], dtype='int8', quant=q(sx, 0))
    new = _batch_and(b, x, 3, (1, L, 3))
    r = b.tensor('r', [1, 1, L, 3], dtype='int8', quant=q(sx, 0))
    b.op('RESHAPE', [x, new], [r])
    c = b.tensor('c', [1, 1, L, C], dtype='int8', quant=q(sc, -128))
    w = b.tensor('w', wq.shape, data=wq, quant={'scale': list(sw), 'zero_point': [0] * C,
                                               'quantized_dimension': 0})
    bt = b.tensor('b', [C], data=bq, quant={'scale': list(sx * sw), 'zero_point': [0] * C})
    b.op('CONV_2D', [r, w, bt], [c], padding='SAME', stride_w=1, stride_h=1,
         fused_activation_function='RELU')
    cp = b.tensor('cp', [1, 1, L + 2, C], dtype='int8', quant=q(sc, -128))
    b.op('PAD', [c, b.tensor('pads', [4, 2], data=np.array(
        [[0, 0], [0, 0], [1, 1], [0, 0]], np.int32))], [cp])
    mp = b.tensor('mp', [1, 1, L, C], dtype='int8', quant=q(sc, -128))
    b.op('MAX_POOL_2D', [cp], [mp], padding='VALID', stride_w=1, stride_h=1, filter_width=3,
         filter_height=1, fused_activation_function='NONE')
    cc = b.tensor('cc', [1, 1, L, 2 * C], dtype='int8', quant=q(sc, -128))
    b.op('CONCATENATION', [c, mp], [cc], axis=3, fused_activation_function='NONE')
    ax = b.tensor('ax', [2], data=np.array([1, 2], np.int32))
    m1 = b.tensor('m1', [1, 2 * C], dtype='int8', quant=q(sm, zm))
    b.op('MEAN', [cc, ax], [m1], keep_dims=False)
    m2 = b.tensor('m2', [1, 2 * C], dtype='int8', quant=q(sc, -128))
    b.op('REDUCE_MAX', [cc, ax], [m2], keep_dims=False)
    h = b.tensor('h', [1, 6 * C], dtype='int8', quant=q(sc, -128))
    b.op('CONCATENATION', [m1, m2, m1], [h], axis=1, fused_activation_function='NONE')
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, zy))
    wf = b.tensor('wf', wfq.shape, data=wfq, quant=q(swf, 0))
    b.op('FULLY_CONNECTED', [h, wf, -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wc=None):
        wc = wq * sw[:, None, None, None] if wc is None else wc
        xp = np.pad(xf, ((1, 1), (0, 0)))
        cf = np.maximum(np.einsum('ljc,ojc->lo', np.stack([xp[i:i + L] for i in range(3)], 1),
                                  wc[:, 0]) + bq * sx * sw, 0)               # [L, C]
        cpf = np.pad(cf, ((1, 1), (0, 0)))
        mpf = np.max(np.stack([cpf[i:i + L] for i in range(3)]), 0)
        ccf = np.concatenate([cf, mpf], 1)
        hf = np.concatenate([ccf.mean(0), ccf.max(0), ccf.mean(0)])
        return (wfq * swf) @ hf
    return os.fspath(path), forward, sw


def build_keras_int8_seq(path, seed=0):
    """An int8 sequence model as Keras 3's converter writes Dense on [1, T, C] and
    GlobalAveragePooling1D, built here: FULLY_CONNECTED on a 3-D input (keep_num_dims,
    op 0, RELU), MEAN over axis 1 of [1, T, H] (op 1), FULLY_CONNECTED (op 2).  Returns
    (path, float numpy forward of the dequantized graph: f(x float [T, C], first
    weights float or None) -> logits, the first layer's weight scale)."""
    rng = np.random.default_rng(seed)
    T, C, H, O = 7, 5, 6, 3
    sx, sh, sm, sy = 0.05, 0.03, 0.02, 0.08
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    s1 = 0.006
    w1 = rng.integers(-127, 128, (H, C)).astype(np.int8)
    b1 = rng.integers(-300, 300, H).astype(np.int32)
    s2 = 0.01
    w2 = rng.integers(-127, 128, (O, H)).astype(np.int8)
    b2 = rng.integers(-300, 300, O).astype(np.int32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    h = b.tensor('h', [1, T, H], dtype='int8', quant=q(sh, -128))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [H], data=b1, quant=q(sx * s1, 0))], [h],
         fused_activation_function='RELU', keep_num_dims=True)
    m = b.tensor('m', [1, H], dtype='int8', quant=q(sm, -128))
    b.op('MEAN', [h, b.tensor('ax', [1], data=np.array([1], np.int32))], [m], keep_dims=False)
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [m, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)),
                             b.tensor('b2', [O], data=b2, quant=q(sm * s2, 0))], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wf=None):
        wf = w1 * s1 if wf is None else wf
        hf = np.maximum(xf @ wf.T + b1 * sx * s1, 0)
        return (w2 * s2) @ hf.mean(0) + b2 * sm * s2
    return os.fspath(path), forward, s1


# output (scale, zero point) of each elementwise op in build_int8_unary (LOGISTIC and
# TANH at the ones TFLite's int8 kernels require, RELU6 at its input's as TFLite Micro assumes)
UNARY_OUT = {'LOGISTIC': (1 / 256, -128), 'TANH': (1 / 128, 0), 'HARD_SWISH': (0.03, -30),
             'RELU': (0.03, -128), 'RELU6': (0.04, 0), 'LEAKY_RELU': (0.03, 10),
             'ELU': (0.03, -60), 'GELU': (0.03, -40), 'QUANTIZE': (0.045, 7),
             'EXP': (0.03, -128), 'LOG': (0.02, 30), 'RSQRT': (0.04, -128),
             'SQRT': (0.01, -128)}


def build_int8_unary(path, name, seed=0, sx=0.05, zx=0):
    """An int8 FC -> `name` (a standalone elementwise op, as converters write a Keras
    activation layer or a requantization) -> FC model, built here.  Returns (path, float
    numpy forward of the dequantized graph: f(x float [6], first weights float or None)
    -> logits, the first layer's weight scale; forward.f is the op's float function).
    sx, zx: the input's quantization."""
    import math
    rng = np.random.default_rng(seed)
    I, H, O = 6, 8, 3
    sh, s1, s2, sy = 0.04, 0.003, 0.005, 0.1
    so, zo = UNARY_OUT[name]
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (H, I)).astype(np.int8)
    b1 = rng.integers(-500, 500, H).astype(np.int32)
    w2 = rng.integers(-127, 128, (O, H)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, I], dtype='int8', quant=q(sx, zx))
    h = b.tensor('h', [1, H], dtype='int8', quant=q(sh, 0))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [H], data=b1, quant=q(sx * s1, 0))], [h])
    a = b.tensor('a', [1, H], dtype='int8', quant=q(so, zo))
    b.op(name, [h], [a], **({'alpha': 0.1} if name == 'LEAKY_RELU' else {}))
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [a, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    erf = np.vectorize(math.erf)
    fs = {'LOGISTIC': lambda v: 1 / (1 + np.exp(-v)), 'TANH': np.tanh,
          'HARD_SWISH': lambda v: v * np.clip(v + 3, 0, 6) / 6,
          'RELU': lambda v: np.maximum(v, 0), 'RELU6': lambda v: np.clip(v, 0, 6),
          'LEAKY_RELU': lambda v: np.where(v > 0, v, 0.1 * v),
          'ELU': lambda v: np.where(v > 0, v, np.expm1(np.minimum(v, 0))),
          'GELU': lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))), 'QUANTIZE': lambda v: v,
          'EXP': np.exp, 'LOG': lambda v: np.log(np.maximum(v, 1e-300)),   # (log 0: the lowest code)
          'RSQRT': lambda v: 1 / np.sqrt(np.maximum(v, 1e-300)),
          'SQRT': lambda v: np.sqrt(np.maximum(v, 0))}     # (TFLite refuses v < 0)

    def forward(xf, wf=None):
        wf = w1 * s1 if wf is None else wf
        hf = xf @ wf.T + b1 * sx * s1
        af = np.clip(fs[name](hf), (-128 - zo) * so, (127 - zo) * so)
        return (w2 * s2) @ af
    forward.f = fs[name]            # (the op's own float function)
    return os.fspath(path), forward, s1


def build_int8_branches(path, seed=0, n=3, heads=2):
    """An int8 model as Keras's converter writes Add() of n bias-less Dense branches of one
    input (a chain of ADDs, each reading the sum so far: nested residuals) and a
    CONCATENATION of `heads` Dense heads of the sum, then a bias-less FC, built here.
    Returns (path, float numpy forward of the dequantized graph: f(x float [5], the first
    branch's weights float or None) -> logits, that branch's weight scale)."""
    rng = np.random.default_rng(seed)
    I, H, O = 5, 6, 3
    sx, s1, sa, s2, sh, s3, sy = 0.05, 0.0015, 0.03, 0.004, 0.03, 0.01, 0.08
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, I], dtype='int8', quant=q(sx, 0))
    ws = [rng.integers(-127, 128, (H, I)).astype(np.int8) for _ in range(n)]
    br = []
    for k, w in enumerate(ws):
        t = b.tensor(f'br{k}', [1, H], dtype='int8', quant=q(sa, 3 * k))
        b.op('FULLY_CONNECTED', [x, b.tensor(f'w{k}', w.shape, data=w, quant=q(s1, 0)), -1], [t])
        br.append(t)
    acc, scales = br[0], [sa]
    for k in range(1, n):
        last = k == n - 1
        t = b.tensor(f'sum{k}', [1, H], dtype='int8', quant=q(sa * 1.5, -128 if last else 0))
        b.op('ADD', [acc, br[k]], [t], fused_activation_function='RELU' if last else 'NONE')
        acc = t
    wh = [rng.integers(-127, 128, (2, H)).astype(np.int8) for _ in range(heads)]
    bh = [rng.integers(-200, 200, 2).astype(np.int32) for _ in range(heads)]
    hs = []
    for k in range(heads):
        t = b.tensor(f'h{k}', [1, 2], dtype='int8', quant=q(sh, 0))
        b.op('FULLY_CONNECTED', [acc, b.tensor(f'wh{k}', wh[k].shape, data=wh[k], quant=q(s2, 0)),
                                 b.tensor(f'bh{k}', [2], data=bh[k], quant=q(sa * 1.5 * s2, 0))],
             [t])
        hs.append(t)
    c = b.tensor('c', [1, 2 * heads], dtype='int8', quant=q(sh, 0))
    b.op('CONCATENATION', hs, [c], axis=1, fused_activation_function='NONE')
    w3 = rng.integers(-127, 128, (O, 2 * heads)).astype(np.int8)
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [c, b.tensor('w3', w3.shape, data=w3, quant=q(s3, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, w0=None):
        w0 = ws[0] * s1 if w0 is None else w0
        z = xf @ w0.T + sum(xf @ (w * s1).T for w in ws[1:])
        z = np.maximum(z, 0)
        h = np.concatenate([(wh[k] * s2) @ z + bh[k] * sa * 1.5 * s2 for k in range(heads)])
        return (w3 * s3) @ h
    return os.fspath(path), forward, s1


def build_int8_binary(path, seed=0, H=4, W=4, I=2, C=4, O=3):
    """An int8 model with the elementwise ops of two inputs and the slices Keras 3 writes
    (a squeeze-excite gate, a broadcast Add, a Lambda slice, a split into heads), built
    here: CONV_2D 3x3 SAME RELU (op 0) -> c [1, H, W, C]; MEAN over H, W (1), FC RELU (2)
    -> e [1, C], MUL e x e (3: one input twice); MUL c x e^2 as [1, 1, 1, C] (RESHAPE 4,
    MUL 5: the gate); ADD of another FC of the mean (6, 7: [1, 1, 1, C], broadcast);
    SPLIT on channels (8) into halves a1, a2; SUB a1 - a2 (9); STRIDED_SLICE channels
    1..C/2 of the sum (10); MUL of the two (11, same shapes); SLICE rows 1..H-2 (12); ADD
    a constant [C/2] (13); MEAN (14); FC (15).  Every activation's scale and zero point from its range
    on random inputs (no clamp on them).  Returns (path, float numpy forward of the
    dequantized graph: f(x float [H, W, I], conv weights float or None) -> logits, the
    conv's weight scales, the input's scale)."""
    rng = np.random.default_rng(seed)
    h = C // 2
    wc = rng.standard_normal((C, 3, 3, I)) * 0.3
    bc = rng.standard_normal(C) * 0.1
    we, be = rng.standard_normal((C, C)) * 0.5, rng.standard_normal(C) * 0.1 + 0.5
    wa = rng.standard_normal((C, C)) * 0.5
    kc = rng.standard_normal(h) * 0.3
    wy = rng.standard_normal((O, h)) * 0.5
    sx = 0.02
    swc = np.abs(wc).reshape(C, -1).max(1) / 127
    wcq = np.round(wc / swc[:, None, None, None]).astype(np.int8)
    q = lambda a: (np.abs(a).max() / 127, np.round(a / (np.abs(a).max() / 127)).astype(np.int8))  # noqa: E731
    (se_, weq), (sa_, waq), (sy_, wyq) = q(we), q(wa), q(wy)

    def fwd(xf, w=None, scales=None):
        w = wcq * swc[:, None, None, None] if w is None else w
        xp = np.pad(xf, ((1, 1), (1, 1), (0, 0)))
        c = np.zeros((H, W, C))
        for ky in range(3):
            for kx in range(3):
                c += xp[ky:ky + H, kx:kx + W] @ w[:, ky, kx].T
        c = np.maximum(c + bcq * sx * swc, 0)
        m = c.mean((0, 1))
        e = np.maximum((weq * se_) @ m + beq * S['m'] * se_, 0)
        g = c * e * e
        a = g + (waq * sa_) @ m
        d = a[..., :h] - a[..., h:]
        mm = d * a[..., 1:1 + h]
        sl = mm[1:H - 1]
        k = sl + kcq * S['kc']
        return (wyq * sy_) @ k.mean((0, 1))
    # the activations' ranges (float weights, biases unquantized first: then quantized)
    S = {'m': 1.0, 'kc': 1.0}
    bcq, beq, kcq = bc / (sx * swc), be / se_, kc
    xs = rng.uniform(-2.5, 2.5, (64, H, W, I))
    names = ('c', 'm', 'e', 'ee', 'g', 'f', 'a', 'd', 'mm', 'k', 'km', 'y')
    R = {n: [0.0, 0.0] for n in names}

    def track(xf):
        w = wcq * swc[:, None, None, None]
        xp = np.pad(xf, ((1, 1), (1, 1), (0, 0)))
        c = np.zeros((H, W, C))
        for ky in range(3):
            for kx in range(3):
                c += xp[ky:ky + H, kx:kx + W] @ w[:, ky, kx].T
        c = np.maximum(c + bc, 0)
        m = c.mean((0, 1))
        e = np.maximum((weq * se_) @ m + be, 0)
        f = (waq * sa_) @ m
        g = c * e * e
        a = g + f
        d = a[..., :h] - a[..., h:]
        mm = d * a[..., 1:1 + h]
        k = mm[1:H - 1] + kc
        km = k.mean((0, 1))
        y = (wyq * sy_) @ km
        for n, v in zip(names, (c, m, e, e * e, g, f, a, d, mm, k, km, y)):
            R[n][0] = min(R[n][0], float(v.min()))
            R[n][1] = max(R[n][1], float(v.max()))
    for xf in xs:
        track(xf)

    def qp(n):
        lo, hi = R[n][0] * 1.3, R[n][1] * 1.3
        s = (hi - lo) / 255
        return s, int(np.clip(round(-128 - lo / s), -128, 127))
    Q = {n: qp(n) for n in names}
    S['m'] = Q['m'][0]
    bcq = np.round(bc / (sx * swc)).astype(np.int32)
    beq = np.round(be / (Q['m'][0] * se_)).astype(np.int32)
    skc = np.abs(kc).max() / 127
    kcq = np.round(kc / skc).astype(np.int8)
    S['kc'] = skc
    b = CircleBuilder(identifier=b'TFL3')
    qd = lambda n: {'scale': [Q[n][0]], 'zero_point': [Q[n][1]]}  # noqa: E731
    T = lambda n, shape: b.tensor(n, shape, dtype='int8', quant=qd(n))  # noqa: E731
    x = b.tensor('x', [1, H, W, I], dtype='int8', quant={'scale': [sx], 'zero_point': [0]})
    c = T('c', [1, H, W, C])
    b.op('CONV_2D', [x, b.tensor('w', wcq.shape, data=wcq, quant={
        'scale': list(swc), 'zero_point': [0] * C, 'quantized_dimension': 0}),
        b.tensor('bc', [C], data=bcq, quant={'scale': list(sx * swc), 'zero_point': [0] * C})],
        [c], padding='SAME', stride_w=1, stride_h=1, fused_activation_function='RELU')
    ax = b.tensor('ax', [2], data=np.array([1, 2], np.int32))
    m = T('m', [1, C])
    b.op('MEAN', [c, ax], [m], keep_dims=False)
    e = T('e', [1, C])
    b.op('FULLY_CONNECTED', [m, b.tensor('we', weq.shape, data=weq, quant={'scale': [se_], 'zero_point': [0]}),
                             b.tensor('be', [C], data=beq, quant={'scale': [Q['m'][0] * se_], 'zero_point': [0]})],
         [e], fused_activation_function='RELU')
    ee = T('ee', [1, C])
    b.op('MUL', [e, e], [ee], fused_activation_function='NONE')
    e4 = b.tensor('e4', [1, 1, 1, C], dtype='int8', quant=qd('ee'))
    b.op('RESHAPE', [ee, b.tensor('s4', [4], data=np.array([1, 1, 1, C], np.int32))], [e4])
    gt = T('g', [1, H, W, C])
    b.op('MUL', [c, e4], [gt], fused_activation_function='NONE')
    f = b.tensor('f', [1, 1, 1, C], dtype='int8', quant=qd('f'))
    f2 = T('f', [1, C])
    b.op('FULLY_CONNECTED', [m, b.tensor('wa', waq.shape, data=waq, quant={'scale': [sa_], 'zero_point': [0]}), -1],
         [f2])
    b.op('RESHAPE', [f2, b.tensor('s4b', [4], data=np.array([1, 1, 1, C], np.int32))], [f])
    a = T('a', [1, H, W, C])
    b.op('ADD', [gt, f], [a], fused_activation_function='NONE')
    a1 = b.tensor('a1', [1, H, W, h], dtype='int8', quant=qd('a'))
    a2 = b.tensor('a2', [1, H, W, h], dtype='int8', quant=qd('a'))
    b.op('SPLIT', [b.tensor('sax', [], data=np.array(3, np.int32)), a], [a1, a2], num_splits=2)
    d = T('d', [1, H, W, h])
    b.op('SUB', [a1, a2], [d], fused_activation_function='NONE')
    sl = b.tensor('sl', [1, H, W, h], dtype='int8', quant=qd('a'))
    b.op('STRIDED_SLICE', [a, b.tensor('b0', [4], data=np.array([0, 0, 0, 1], np.int32)),
                           b.tensor('e0', [4], data=np.array([1, H, W, 1 + h], np.int32)),
                           b.tensor('st', [4], data=np.array([1, 1, 1, 1], np.int32))], [sl])
    mm = T('mm', [1, H, W, h])
    b.op('MUL', [d, sl], [mm], fused_activation_function='NONE')
    sl2 = b.tensor('sl2', [1, H - 2, W, h], dtype='int8', quant=qd('mm'))
    b.op('SLICE', [mm, b.tensor('b1', [4], data=np.array([0, 1, 0, 0], np.int32)),
                   b.tensor('z1', [4], data=np.array([1, H - 2, -1, -1], np.int32))], [sl2])
    k = T('k', [1, H - 2, W, h])
    b.op('ADD', [sl2, b.tensor('kc', [h], data=kcq, quant={'scale': [skc], 'zero_point': [0]})],
         [k], fused_activation_function='NONE')
    km = T('km', [1, h])
    b.op('MEAN', [k, ax], [km], keep_dims=False)
    y = T('y', [1, O])
    b.op('FULLY_CONNECTED', [km, b.tensor('wy', wyq.shape, data=wyq, quant={'scale': [sy_], 'zero_point': [0]}), -1],
         [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return os.fspath(path), fwd, swc, sx


def build_int8_unpack(path, seed=0, T=6, C=5, F=4, O=3):
    """An int8 model as Keras 3's converter writes an unrolled sequence and a Lambda
    split of the channels, built here: Dense on [1, T, C] RELU (op 0) -> h [1, T, F];
    UNPACK of the steps (1); STRIDED_SLICEs of channels 0:F/2 and F/2:F (2, 3: they tile
    the axis); MUL of the two halves (4); RESHAPE to [1, T F/2] (5); CONCATENATION of steps
    T-1 and 0 and the product (6); FC (7).  Returns (path, float numpy forward of the
    dequantized graph: f(x float [T, C], first weights float or None) -> logits, the
    first layer's weight scale, the input's scale)."""
    rng = np.random.default_rng(seed)
    h = F // 2
    sx, s1, sh, sy = 0.05, 0.0012, 0.03, 0.1
    sp, zh, zp = sh, -128, -128           # (TFLite Micro concatenates inputs of one scale)
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = rng.integers(-100, 900, F).astype(np.int32)
    n2 = 2 * F + T * h
    w2 = rng.integers(-127, 128, (O, n2)).astype(np.int8)
    s2 = 0.015
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    ht = b.tensor('h', [1, T, F], dtype='int8', quant=q(sh, zh))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [F], data=b1, quant=q(sx * s1, 0))], [ht],
         fused_activation_function='RELU', keep_num_dims=True)
    steps = [b.tensor(f'h{t}', [1, F], dtype='int8', quant=q(sh, zh)) for t in range(T)]
    b.op('UNPACK', [ht], steps, num=T, axis=1)
    halves = []
    for k in range(2):
        o = b.tensor(f'half{k}', [1, T, h], dtype='int8', quant=q(sh, zh))
        b.op('STRIDED_SLICE', [ht, b.tensor(f'b{k}', [3], data=np.array([0, 0, k * h], np.int32)),
                               b.tensor(f'e{k}', [3], data=np.array([1, T, k * h + h], np.int32)),
                               b.tensor(f's{k}', [3], data=np.array([1, 1, 1], np.int32))], [o])
        halves.append(o)
    p = b.tensor('p', [1, T, h], dtype='int8', quant=q(sp, zp))
    b.op('MUL', halves, [p], fused_activation_function='NONE')
    pr = b.tensor('pr', [1, T * h], dtype='int8', quant=q(sp, zp))
    b.op('RESHAPE', [p, b.tensor('ps', [2], data=np.array([1, T * h], np.int32))], [pr])
    c = b.tensor('c', [1, n2], dtype='int8', quant=q(sp, zp))
    b.op('CONCATENATION', [steps[T - 1], steps[0], pr], [c], axis=1,
         fused_activation_function='NONE')
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [c, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wf=None):
        wf = w1 * s1 if wf is None else wf
        hf = np.clip(np.maximum(xf @ wf.T + b1 * sx * s1, 0), None, (127 - zh) * sh)
        pf = np.clip(hf[:, :h] * hf[:, h:], (-128 - zp) * sp, (127 - zp) * sp)
        cf = np.clip(np.concatenate([hf[T - 1], hf[0], pf.reshape(-1)]), (-128 - zp) * sp,
                     (127 - zp) * sp)
        return (w2 * s2) @ cf
    return os.fspath(path), forward, s1, sx


def build_int8_transpose(path, seed=0, T=6, C=5, F=4, O=3):
    """An int8 model as Keras 3's converter writes a Permute of a sequence, built here:
    Dense on [1, T, C] RELU (op 0) -> h [1, T, F]; TRANSPOSE to [1, F, T] (1, a gather:
    no one strided copy makes it); STRIDED_SLICE of rows 2:0:-1 and steps 4:0:-1 (2: a
    gather with negative strides); RESHAPE (3); FC
    (4).  Returns (path, float numpy forward of the dequantized graph: f(x float [T, C],
    first weights float or None) -> logits, the first layer's weight scale, the input's
    scale)."""
    rng = np.random.default_rng(seed)
    sx, s1, sh, sy, s2, zh = 0.05, 0.0012, 0.03, 0.1, 0.015, -128
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = rng.integers(-100, 900, F).astype(np.int32)
    w2 = rng.integers(-127, 128, (O, 8)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    ht = b.tensor('h', [1, T, F], dtype='int8', quant=q(sh, zh))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [F], data=b1, quant=q(sx * s1, 0))], [ht],
         fused_activation_function='RELU', keep_num_dims=True)
    tt = b.tensor('t', [1, F, T], dtype='int8', quant=q(sh, zh))
    b.op('TRANSPOSE', [ht, b.tensor('perm', [3], data=np.array([0, 2, 1], np.int32))], [tt])
    st = b.tensor('s', [1, 2, 4], dtype='int8', quant=q(sh, zh))
    b.op('STRIDED_SLICE', [tt, b.tensor('sb', [3], data=np.array([0, 2, 4], np.int32)),
                           b.tensor('se', [3], data=np.array([1, 0, 0], np.int32)),
                           b.tensor('ss', [3], data=np.array([1, -1, -1], np.int32))], [st])
    r = b.tensor('r', [1, 8], dtype='int8', quant=q(sh, zh))
    b.op('RESHAPE', [st, b.tensor('rs', [2], data=np.array([1, 8], np.int32))], [r])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [r, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wf=None):
        wf = w1 * s1 if wf is None else wf
        hf = np.clip(np.maximum(xf @ wf.T + b1 * sx * s1, 0), None, (127 - zh) * sh)
        return (w2 * s2) @ hf.T[2:0:-1, 4:0:-1].reshape(-1)
    return os.fspath(path), forward, s1, sx


def build_int8_island(path, seed=0, T=6, C=5, F=4, O=3, two=False, elu=False):
    """An int8 model as Keras 3's converter writes -x / 4 (float ops it has no int8 kernel
    for, between a DEQUANTIZE and a QUANTIZE), built here: Dense on [1, T, C] RELU (op 0)
    -> h [1, T, F]; DEQUANTIZE (1), NEG (2), DIV by the scalar 0.25 (3: a derivative of
    -4), QUANTIZE (4); RESHAPE (5); FC (6).  two: the DIV divides by h itself (a float
    op of the one input still; elu: ELU instead of NEG (Keras 3's converter leaves an
    int8 model's ELU in float32), the Dense without its RELU).  Returns (path, float numpy
    forward of the dequantized
    graph: f(x float [T, C], first weights float or None) -> logits, the first layer's
    weight scale, the input's scale)."""
    rng = np.random.default_rng(seed)
    sx, s1, sh, sn, sy, s2, zh, zn = 0.05, 0.0012, 0.03, 0.15, 0.1, 0.0015, -128, 100
    if elu:
        zh, zn = 0, -100
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = rng.integers(-100, 900, F).astype(np.int32)
    w2 = rng.integers(-127, 128, (O, T * F)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    ht = b.tensor('h', [1, T, F], dtype='int8', quant=q(sh, zh))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [F], data=b1, quant=q(sx * s1, 0))], [ht],
         fused_activation_function='NONE' if elu else 'RELU', keep_num_dims=True)
    f = b.tensor('f', [1, T, F], dtype='float32')
    b.op('DEQUANTIZE', [ht], [f])
    n = b.tensor('n', [1, T, F], dtype='float32')
    b.op('ELU' if elu else 'NEG', [f], [n])
    dv = b.tensor('d', [1, T, F], dtype='float32')
    b.op('DIV', [n, f if two else b.tensor('k', [], data=np.array(0.25, np.float32))], [dv],
         fused_activation_function='NONE')
    nq = b.tensor('nq', [1, T, F], dtype='int8', quant=q(sn, zn))
    b.op('QUANTIZE', [dv], [nq])
    r = b.tensor('r', [1, T * F], dtype='int8', quant=q(sn, zn))
    b.op('RESHAPE', [nq, b.tensor('rs', [2], data=np.array([1, T * F], np.int32))], [r])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [r, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wf=None):
        wf = w1 * s1 if wf is None else wf
        hf = xf @ wf.T + b1 * sx * s1
        hf = np.clip(hf if elu else np.maximum(hf, 0), (-128 - zh) * sh, (127 - zh) * sh)
        nf = np.where(hf > 0, hf, np.expm1(np.minimum(hf, 0))) if elu else -hf
        nf = np.clip(nf / 0.25, (-128 - zn) * sn, (127 - zn) * sn)
        return (w2 * s2) @ nf.reshape(-1)
    return os.fspath(path), forward, s1, sx


def build_int8_where(path, seed=0, T=6, C=5, F=4, O=3, cmp='GREATER', apart=False):
    """An int8 model as TF 2.21's converter writes Keras's tf.where(h > 0.25, h, 0.3 h -
    0.1) (int8 GREATER, MUL, SUB and SELECT_V2 of h and scalar constants at scales and
    zero points of their own, as its file has them), built here: Dense on [1, T, C] (op 0)
    -> h [1, T, F]; GREATER(h, 0.25) (1), MUL(h, 0.3) (2), SUB(., 0.1) (3), SELECT_V2 (4);
    RESHAPE (5); FC (6).  cmp: the comparison (LESS_EQUAL: the branches swapped, the same
    function); apart: the SUB and the SELECT_V2 write other scales than h's (select.cc
    copies codes: the branch h reads at the output's scale).  Returns (path, float numpy
    forward of the dequantized graph: f(x float [T, C], first weights float or None) ->
    logits, the first layer's weight scale, the input's scale)."""
    rng = np.random.default_rng(seed)
    sx, s1, sh, sy, s2, zh = 0.05, 0.0012, 0.03, 0.1, 0.0015, -20
    sm, zm, sb, zb, ss, zs = 0.012, 10, sh, zh, sh, zh
    if apart:
        sb, zb, ss, zs = 0.02, 5, 0.025, -30
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = rng.integers(-400, 400, F).astype(np.int32)
    w2 = rng.integers(-127, 128, (O, T * F)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    ht = b.tensor('h', [1, T, F], dtype='int8', quant=q(sh, zh))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [F], data=b1, quant=q(sx * s1, 0))], [ht],
         fused_activation_function='NONE', keep_num_dims=True)

    def const(name, v):                 # (a scalar v at v / 255, zero point -128: code 127)
        return b.tensor(name, [], data=np.array(127, np.int8), quant=q(v / 255, -128))
    mask = b.tensor('mask', [1, T, F], dtype='bool')
    b.op(cmp, [ht, const('c', 0.25)], [mask])
    mt = b.tensor('m', [1, T, F], dtype='int8', quant=q(sm, zm))
    b.op('MUL', [ht, const('k', 0.3)], [mt], fused_activation_function='NONE')
    bt = b.tensor('b', [1, T, F], dtype='int8', quant=q(sb, zb))
    b.op('SUB', [mt, const('k2', 0.1)], [bt], fused_activation_function='NONE')
    st = b.tensor('s', [1, T, F], dtype='int8', quant=q(ss, zs))
    b.op('SELECT_V2', [mask, ht, bt] if cmp == 'GREATER' else [mask, bt, ht], [st])
    r = b.tensor('r', [1, T * F], dtype='int8', quant=q(ss, zs))
    b.op('RESHAPE', [st, b.tensor('rs', [2], data=np.array([1, T * F], np.int32))], [r])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [r, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wf=None):
        wf = w1 * s1 if wf is None else wf
        hf = np.clip(xf @ wf.T + b1 * sx * s1, (-128 - zh) * sh, (127 - zh) * sh)
        lo = np.clip(np.clip(0.3 * hf, (-128 - zm) * sm, (127 - zm) * sm) - 0.1,
                     (-128 - zb) * sb, (127 - zb) * sb)
        # (select.cc copies codes: each branch's code read at the output's scale)
        nf = np.where(hf > 0.25, (hf / sh + zh - zs) * ss, (lo / sb + zb - zs) * ss)
        return (w2 * s2) @ np.clip(nf, (-128 - zs) * ss, (127 - zs) * ss).reshape(-1)
    return os.fspath(path), forward, s1, sx


def build_int8_div(path, seed=0, T=6, C=5, F=4, O=3, island=False, sq=0.06):
    """An int8 model with DIVs as TFLite's int8 kernel takes them (div.cc), built here:
    Dense on [1, T, C] RELU (op 0) -> h [1, T, F]; Dense on [1, T, C] RELU (1, a large
    bias: values near 1.7) -> e [1, T, 1]; DIV h / e (2: by a tensor, broadcast over F);
    DIV by a per-channel constant [F] (3); RESHAPE (4); FC (5).  Returns (path, float numpy
    forward of the dequantized graph: f(x float [T, C], weights {name: float}) -> logits,
    the weight scales {name: scale}, the input's scale).  island: op 2 as Keras's
    converter writes a / b (DEQUANTIZE h, DEQUANTIZE e, DIV in float32, QUANTIZE)."""
    rng = np.random.default_rng(seed)
    sx, s1, s2, sh, se, sr, sy, s3 = 0.05, 0.0012, 0.0003, 0.03, 0.01, 0.2, 0.1, 0.0005
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = rng.integers(-100, 900, F).astype(np.int32)
    w2 = rng.integers(-127, 128, (1, C)).astype(np.int8)
    b2 = np.array([int(1.7 / (sx * s2))], np.int32)      # (e in [0.6, 2.55]: never 0)
    kc = np.array([3, 5, 8, 13], np.int8)[:F]
    w3 = rng.integers(-127, 128, (O, T * F)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    ht = b.tensor('h', [1, T, F], dtype='int8', quant=q(sh, -128))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [F], data=b1, quant=q(sx * s1, 0))], [ht],
         fused_activation_function='RELU', keep_num_dims=True)
    et = b.tensor('e', [1, T, 1], dtype='int8', quant=q(se, -128))
    b.op('FULLY_CONNECTED', [x, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)),
                             b.tensor('b2', [1], data=b2, quant=q(sx * s2, 0))], [et],
         fused_activation_function='RELU', keep_num_dims=True)
    zq = -100                               # (small quotients inside the range, not at its clamp)
    qt = b.tensor('q', [1, T, F], dtype='int8', quant=q(sq, zq))
    if island:
        hf, ef, qf = (b.tensor(n, sh_) for n, sh_ in (('hf', [1, T, F]), ('ef', [1, T, 1]),
                                                        ('qf', [1, T, F])))
        b.op('DEQUANTIZE', [ht], [hf])
        b.op('DEQUANTIZE', [et], [ef])
        b.op('DIV', [hf, ef], [qf], fused_activation_function='NONE')
        b.op('QUANTIZE', [qf], [qt])
    else:
        b.op('DIV', [ht, et], [qt], fused_activation_function='NONE')
    rt = b.tensor('r', [1, T, F], dtype='int8', quant=q(sr, zq))
    b.op('DIV', [qt, b.tensor('k', [F], data=kc, quant=q(0.1, 0))], [rt],
         fused_activation_function='NONE')
    r2 = b.tensor('r2', [1, T * F], dtype='int8', quant=q(sr, zq))
    b.op('RESHAPE', [rt, b.tensor('rs', [2], data=np.array([1, T * F], np.int32))], [r2])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [r2, b.tensor('w3', w3.shape, data=w3, quant=q(s3, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, ws=None):
        ws = ws or {}
        a = ws.get('w1', w1 * s1)
        c = ws.get('w2', w2 * s2)
        hf = np.clip(np.maximum(xf @ a.T + b1 * sx * s1, 0), None, 255 * sh)
        ef = np.clip(np.maximum(xf @ c.T + b2 * sx * s2, 0), None, 255 * se)
        qf = np.clip(hf / ef, (-128 - zq) * sq, (127 - zq) * sq)
        rf = np.clip(qf / (kc * 0.1), (-128 - zq) * sr, (127 - zq) * sr)
        return (w3 * s3) @ rf.reshape(-1)
    return os.fspath(path), forward, {'w1': s1, 'w2': s2}, sx


def build_int8_sqd_minmax(path, seed=0, T=4, C=5, F=3, O=3):
    """An int8 model with the binary ops Keras's converter writes as int8 kernels besides
    ADD, SUB and MUL, built here: Dense on [1, T, C] (ops 0, 1, 2) -> a [1, T, F],
    b [1, T, 1], c [1, T, F] (a and c at one scale); SQUARED_DIFFERENCE a, b (3: b
    broadcast over F); MAXIMUM a, c (4: one scale, as maximum_minimum.cc needs); MINIMUM
    of the squared difference and a per-channel constant [F] (5: a cap); ADD of the two
    (6); RESHAPE (7); FC (8).  Returns (path, float numpy forward of the dequantized graph:
    f(x float [T, C], weights {name: float}) -> logits, the weight scales {name: scale},
    the input's scale)."""
    rng = np.random.default_rng(seed)
    sx, s1, s2, s3, sa, sb, sd, ss, s4, sy = 0.05, 0.002, 0.0015, 0.002, 0.03, 0.02, 0.05, 0.06, 0.004, 0.1
    za, zb, zd, zs = 5, -3, -128, -40
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    ws = {k: rng.integers(-127, 128, (n, C)).astype(np.int8) for k, n in (('w1', F), ('w2', 1), ('w3', F))}
    bs = {k: rng.integers(-300, 300, len(w)).astype(np.int32) for k, w in ws.items()}
    sc = {'w1': s1, 'w2': s2, 'w3': s3}
    kc = np.array([-68, -8, 52, 100], np.int8)[:F]          # (3, 6, 9 real)
    w4 = rng.integers(-127, 128, (O, T * F)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    outs = {}
    for k, (shp, s, z) in (('w1', ([1, T, F], sa, za)), ('w2', ([1, T, 1], sb, zb)),
                           ('w3', ([1, T, F], sa, za))):
        outs[k] = b.tensor('o' + k, shp, dtype='int8', quant=q(s, z))
        b.op('FULLY_CONNECTED', [x, b.tensor(k, ws[k].shape, data=ws[k], quant=q(sc[k], 0)),
                                 b.tensor('b' + k, [len(ws[k])], data=bs[k], quant=q(sx * sc[k], 0))],
             [outs[k]], keep_num_dims=True)
    dt = b.tensor('d', [1, T, F], dtype='int8', quant=q(sd, zd))
    b.op('SQUARED_DIFFERENCE', [outs['w1'], outs['w2']], [dt])
    mt = b.tensor('m', [1, T, F], dtype='int8', quant=q(sa, za))
    b.op('MAXIMUM', [outs['w1'], outs['w3']], [mt])
    nt = b.tensor('n', [1, T, F], dtype='int8', quant=q(sd, zd))
    b.op('MINIMUM', [dt, b.tensor('k', [F], data=kc, quant=q(sd, zd))], [nt])
    st = b.tensor('s', [1, T, F], dtype='int8', quant=q(ss, zs))
    b.op('ADD', [mt, nt], [st], fused_activation_function='NONE')
    r2 = b.tensor('r2', [1, T * F], dtype='int8', quant=q(ss, zs))
    b.op('RESHAPE', [st, b.tensor('rs', [2], data=np.array([1, T * F], np.int32))], [r2])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [r2, b.tensor('w4', w4.shape, data=w4, quant=q(s4, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def rng_of(s, z):
        return (-128 - z) * s, (127 - z) * s

    def forward(xf, wf=None):
        wf = wf or {}
        o = {k: np.clip(xf @ wf.get(k, ws[k] * sc[k]).T + bs[k] * sx * sc[k], *rng_of(*zs_))
             for k, zs_ in (('w1', (sa, za)), ('w2', (sb, zb)), ('w3', (sa, za)))}
        d = np.clip((o['w1'] - o['w2']) ** 2, *rng_of(sd, zd))
        m = np.maximum(o['w1'], o['w3'])
        n = np.minimum(d, (kc.astype(np.float64) - zd) * sd)
        s = np.clip(m + n, *rng_of(ss, zs))
        return (w4 * s4) @ s.reshape(-1)
    return os.fspath(path), forward, sc, sx


def build_keras_timedistributed(path, seed=0, T=4, C=3, F=5, O=2):
    """What Keras 3 writes for TimeDistributed(Dense) over a sequence, built here: the
    steps cut out (UNPACK), one FULLY_CONNECTED a step sharing its weight and bias (RELU),
    the outputs stacked back (PACK on axis 1), a MEAN over the steps, a Dense.  Returns
    (path, numpy forward f(x [n, T, C], w1=, w2=) -> [n, O])."""
    rng = np.random.default_rng(seed)
    w1, b1 = _rand(rng, F, C), _rand(rng, F)
    w2, b2 = _rand(rng, O, F), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')
    act = functools.partial(_act, b)
    x = act('x', [1, T, C])
    steps = [act(f'x{t}', [1, C]) for t in range(T)]
    b.op('UNPACK', [x], steps, num=T, axis=1)
    wk, bk = b.tensor('w1', [F, C], data=w1), b.tensor('b1', [F], data=b1)
    hs = [act(f'h{t}', [1, F]) for t in range(T)]
    for st, h in zip(steps, hs):
        b.op('FULLY_CONNECTED', [st, wk, bk], [h], fused_activation_function='RELU')
    p = act('packed', [1, T, F])
    b.op('PACK', hs, [p], values_count=T, axis=1)
    m = act('m', [1, F])
    b.op('MEAN', [p, b.tensor('axis', [1], data=np.array([1], np.int32))], [m], keep_dims=False)
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [m, b.tensor('w2', [O, F], data=w2), b.tensor('b2', [O], data=b2)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs, w1=w1, w2=w2):
        h = np.maximum(xs.reshape(len(xs), T, C) @ w1.T + b1, 0)
        return h.mean(1) @ w2.T + b2
    return os.fspath(path), forward


def build_int8_pack(path, seed=0, T=4, C=3, F=5, O=3, shared=False):
    """An int8 model stacking a sequence's steps back in another order, built here: Dense
    on [1, T, C] (RELU, keep_num_dims) -> [1, T, F]; UNPACK of the steps; PACK of them
    reversed on axis 1 (TFLite's int8 PACK: one scale); RESHAPE to [1, T F]; FC.
    shared: Keras's TimeDistributed(Dense) instead: the input's steps cut out, one FC a
    step sharing the Dense's weight, then the PACK."""
    rng = np.random.default_rng(seed)
    sx, s1, sh, s2, sy = 0.05, 0.01, 0.03, 0.01, 0.1
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = rng.integers(-100, 900, F).astype(np.int32)
    w2 = rng.integers(-127, 128, (O, T * F)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    wk = b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0))
    bk = b.tensor('b1', [F], data=b1, quant=q(sx * s1, 0))
    steps = [b.tensor(f'h{t}', [1, F], dtype='int8', quant=q(sh, -128)) for t in range(T)]
    if shared:
        xs = [b.tensor(f'x{t}', [1, C], dtype='int8', quant=q(sx, 0)) for t in range(T)]
        b.op('UNPACK', [x], xs, num=T, axis=1)
        for xt, h in zip(xs, steps):
            b.op('FULLY_CONNECTED', [xt, wk, bk], [h], fused_activation_function='RELU')
    else:
        h = b.tensor('h', [1, T, F], dtype='int8', quant=q(sh, -128))
        b.op('FULLY_CONNECTED', [x, wk, bk], [h], fused_activation_function='RELU',
             keep_num_dims=True)
        b.op('UNPACK', [h], steps, num=T, axis=1)
    p = b.tensor('p', [1, T, F], dtype='int8', quant=q(sh, -128))
    b.op('PACK', steps[::-1], [p], values_count=T, axis=1)
    pr = b.tensor('pr', [1, T * F], dtype='int8', quant=q(sh, -128))
    b.op('RESHAPE', [p, b.tensor('ps', [2], data=np.array([1, T * F], np.int32))], [pr])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [pr, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return os.fspath(path)


def build_keras_mha(path, seed=0, T=5, F=4, H=2, d=3, O=2):
    """What the TFLite converter writes for Keras 3's MultiHeadAttention(num_heads=H,
    key_dim=d) on [T, F] -> GlobalAveragePooling1D -> Dense, built here (op for op as
    TF 2.21 wrote it for a held-out model): the query, key and value projections as
    FULLY_CONNECTED (keep_num_dims) -> RESHAPE [-1, T, H, d]; TRANSPOSE of the query to
    [1, H, T, d] and of the key to [1, H, d, T]; BATCH_MATMUL; MUL by 1/sqrt(d); SOFTMAX
    over the last axis of the rank-4 scores; BATCH_MATMUL by the value [1, H, T, d];
    TRANSPOSE back, RESHAPE [-1, T, H*d], the output projection (keep_num_dims), MEAN over
    time, FULLY_CONNECTED.  Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    E = H * d
    W = {k: _rand(rng, E, F) * 0.6 for k in ('wq', 'wk', 'wv')}
    W.update({k: _rand(rng, E) * 0.3 for k in ('bq', 'bk', 'bv')})
    W.update(wo=_rand(rng, F, E) * 0.5, bo=_rand(rng, F) * 0.3, w2=_rand(rng, O, F), b2=_rand(rng, O))
    scale = np.float32(1 / np.sqrt(d))
    b = CircleBuilder(identifier=b'TFL3')
    act = functools.partial(_act, b)
    const = {k: b.tensor(k, v.shape, data=v) for k, v in W.items()}
    ints = lambda name, v: b.tensor(name, [len(v)], data=np.array(v, np.int32))  # noqa: E731
    heads, flat = ints('heads', [-1, T, H, d]), ints('flat', [-1, T, E])
    p0213, p0231 = ints('p0213', [0, 2, 1, 3]), ints('p0231', [0, 2, 3, 1])

    def op(name, ins, shape, **kw):
        out = act(f'{name.lower()}{op.n}', shape)
        op.n += 1
        b.op(name, ins, [out], **kw)
        return out
    op.n = 0
    x = act('x', [1, T, F])

    def proj(k):
        h = op('FULLY_CONNECTED', [x, const['w' + k], const['b' + k]], [1, T, E], keep_num_dims=True)
        return op('RESHAPE', [h, heads], [1, T, H, d])
    key, query = proj('k'), proj('q')
    q = op('TRANSPOSE', [query, p0213], [1, H, T, d])
    k = op('TRANSPOSE', [key, p0231], [1, H, d, T])
    s = op('BATCH_MATMUL', [q, k], [1, H, T, T])
    s = op('MUL', [s, b.tensor('scale', [], data=np.array(scale))], [1, H, T, T])
    p = op('SOFTMAX', [s], [1, H, T, T], beta=1.0)
    v = op('TRANSPOSE', [proj('v'), p0213], [1, H, T, d])
    o = op('BATCH_MATMUL', [p, v], [1, H, T, d])
    o = op('RESHAPE', [op('TRANSPOSE', [o, p0213], [1, T, H, d]), flat], [1, T, E])
    o = op('FULLY_CONNECTED', [o, const['wo'], const['bo']], [1, T, F], keep_num_dims=True)
    m = op('MEAN', [o, b.tensor('time', [], data=np.array(1, np.int32))], [1, F])
    y = op('FULLY_CONNECTED', [m, const['w2'], const['b2']], [1, O])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs, **p):
        w = dict(W, **p)
        xs = xs.reshape(-1, T, F)
        def split(k):        # [N, T, E] -> [N, H, T, d]
            return (xs @ w['w' + k].T + w['b' + k]).reshape(-1, T, H, d).transpose(0, 2, 1, 3)
        z = split('q') @ split('k').transpose(0, 1, 3, 2) * float(scale)
        z = np.exp(z - z.max(-1, keepdims=True))
        o = (z / z.sum(-1, keepdims=True)) @ split('v')
        o = o.transpose(0, 2, 1, 3).reshape(-1, T, E) @ w['wo'].T + w['bo']
        return o.mean(1) @ w['w2'].T + w['b2']
    return os.fspath(path), forward


def grouped_conv(x, w, b=None, stride=1, pads=((0, 0), (0, 0))):
    """numpy: TFLite's CONV_2D with a grouped weight [O, kh, kw, C / G] (Keras's
    Conv2D(groups=G)) by its definition: output channel o sums input channels of group
    o // (O / G) only.  x [n, H, W, C]."""
    O, kh, kw, ig = w.shape
    G = x.shape[-1] // ig
    win = _dilated(x, kh, kw, (1, 1), pads)[:, ::stride, ::stride]
    y = np.concatenate([np.einsum('nhwijc,oijc->nhwo', win[..., j * ig:(j + 1) * ig],
                                  w[j * O // G:(j + 1) * O // G]) for j in range(G)], -1)
    return y if b is None else y + b


def build_keras_grouped(path, int8=False, seed=0, H=5, C=4):
    """Grouped convolutions as TFLite's converter writes Keras's Conv2D(groups=G): a
    CONV_2D whose weight has C / G input channels.  x [1, H, H, C] -> w1 [6, 3, 3, 2]
    (2 groups) SAME RELU -> w2 [12, 3, 3, 1] (6 groups of one channel: a depthwise with
    multiplier 2) VALID stride 2 RELU -> w3 [6, 1, 1, 4] (3 groups, no bias) -> MEAN over
    H, W -> FC wf, bf [2].  int8: full-integer, per-channel conv weight scales, every
    activation's scale and zero point from its range on random inputs, and a SOFTMAX
    at the end.  Returns (path, numpy forward f(x [n, H, H, C], **weights by name) of the
    float graph (int8: of the dequantized one; its logits))."""
    rng = np.random.default_rng(seed)
    p = {'w1': _rand(rng, 6, 3, 3, C // 2) * 0.5, 'b1': _rand(rng, 6) * 0.2,
         'w2': _rand(rng, 12, 3, 3, 1) * 0.5, 'b2': _rand(rng, 12) * 0.2,
         'w3': _rand(rng, 6, 1, 1, 4) * 0.5, 'wf': _rand(rng, 2, 6) * 0.5,
         'bf': _rand(rng, 2) * 0.2}
    H2 = (H - 3) // 2 + 1

    def layers(x, **kw):
        q = dict(p, **kw)
        h1 = np.maximum(grouped_conv(x, q['w1'], q['b1'], 1, ((1, 1), (1, 1))), 0)
        h2 = np.maximum(grouped_conv(h1, q['w2'], q['b2'], 2), 0)
        h3 = grouped_conv(h2, q['w3'])
        m = h3.mean((1, 2))
        return {'h1': h1, 'h2': h2, 'h3': h3, 'm': m, 'y': m @ q['wf'].T + q['bf']}
    sx, qt = 0.03, {}
    if int8:            # weights as int8 (per output channel for a conv), dequantized
        for k in ('w1', 'w2', 'w3', 'wf'):
            ax = (1, 2, 3) if k != 'wf' else (0, 1)
            s = np.abs(p[k]).max(ax, keepdims=True) / 127
            qt[k] = (np.round(p[k] / s).astype(np.int8), s.reshape(-1))
            p[k] = (qt[k][0] * s).astype(np.float32)
        r = layers(rng.uniform(-3, 3, (64, H, H, C)).astype(np.float64))
        for k, v in r.items():
            lo, hi = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
            s = (hi - lo) / 255
            qt[k] = (s, int(np.clip(np.round(-128 - lo / s), -128, 127)))
    b = CircleBuilder(identifier=b'TFL3')

    def act(name, shape):
        if not int8:
            return b.tensor(name, shape)
        s, z = qt.get(name, (sx, 0))
        return b.tensor(name, shape, dtype=np.int8, quant={'scale': [s], 'zero_point': [z]})

    def const(name, s_in=None):
        if not int8:
            return b.tensor(name, list(p[name].shape), data=p[name])
        if name.startswith('w'):
            a, s = qt[name]
            return b.tensor(name, list(a.shape), data=a, dtype=np.int8, quant={
                'scale': list(s), 'zero_point': [0] * len(s), 'quantized_dimension': 0})
        sw = qt['w' + name[1:]][1]
        s = s_in * sw * np.ones(len(p[name]))
        return b.tensor(name, [len(p[name])], data=np.round(p[name] / s).astype(np.int32),
                        dtype=np.int32, quant={'scale': list(s), 'zero_point': [0] * len(s),
                                               'quantized_dimension': 0})
    sin = lambda k: qt[k][0] if int8 else None     # noqa: E731
    x = act('x', [1, H, H, C])
    h1 = act('h1', [1, H, H, 6])
    b.op('CONV_2D', [x, const('w1'), const('b1', sx)], [h1], padding='SAME',
         fused_activation_function='RELU')
    h2 = act('h2', [1, H2, H2, 12])
    b.op('CONV_2D', [h1, const('w2'), const('b2', sin('h1'))], [h2], padding='VALID',
         stride_h=2, stride_w=2, fused_activation_function='RELU')
    h3 = act('h3', [1, H2, H2, 6])
    b.op('CONV_2D', [h2, const('w3'), -1], [h3], padding='VALID')
    m = act('m', [1, 6])
    b.op('MEAN', [h3, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m])
    y = act('y', [1, 2])
    b.op('FULLY_CONNECTED', [m, const('wf'), const('bf', sin('m'))], [y])
    b.inputs(x)
    if int8:
        o = b.tensor('p', [1, 2], dtype=np.int8, quant={'scale': [1 / 256], 'zero_point': [-128]})
        b.op('SOFTMAX', [y], [o], beta=1.0)
        y = o
    b.outputs(y)
    b.save(path)
    return os.fspath(path), lambda x, **kw: layers(x, **kw)['y']


def build_int8_prelu_l2(path, seed=0, T=4, C=5, F=6, O=3, ops=('PRELU', 'L2_NORMALIZATION'),
                        za=7, sq=0.004, bare=False):
    """An int8 model with PReLU and UnitNormalization as Keras's full-integer converter
    writes them (PRELU, its slope alpha an int8 constant [F] broadcast over the steps;
    L2_NORMALIZATION over the last axis, its output at TFLite's fixed 1/128, zero point 0),
    built here: Dense on [1, T, C] (op 0) -> a [1, T, F]; then the ops named in ops, in
    order; RESHAPE; FC.  Returns (path, float numpy forward of the dequantized graph:
    f(x float [T, C], weights {name: float}) -> logits, the weight scales {name: scale}
    (w1, w2 and op k's slopes alpha<k>), the input's scale).  bare: the ops alone, from the input [1, T, F] (at sa, za) to
    their output."""
    rng = np.random.default_rng(seed)
    sx, s1, sa, salpha, sp, s2, sy = 0.05, 0.004, 0.03, 0.005, 0.025, sq, 0.1
    zp = -9
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (F, C)).astype(np.int8)
    b1 = rng.integers(-400, 400, F).astype(np.int32)
    alpha = rng.integers(-60, 100, F).astype(np.int8)       # (slopes -0.3 .. 0.46)
    w2 = rng.integers(-127, 128, (O, T * F)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    a = b.tensor('a', [1, T, F], dtype='int8', quant=q(sa, za))
    if not bare:
        x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
        b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                                 b.tensor('b1', [F], data=b1, quant=q(sx * s1, 0))], [a],
             keep_num_dims=True)
    sc = {'w1': s1, 'w2': s2}
    h, hq = a, (sa, za)
    for k, name in enumerate(ops):
        if name == 'PRELU':
            o = b.tensor(f'p{k}', [1, T, F], dtype='int8', quant=q(sp, zp))
            b.op('PRELU', [h, b.tensor(f'alpha{k}', [F], data=alpha, quant=q(salpha, 0))], [o])
            hq = (sp, zp)
            sc[f'alpha{k}'] = salpha
        else:
            o = b.tensor(f'u{k}', [1, T, F], dtype='int8', quant=q(1 / 128, 0))
            b.op('L2_NORMALIZATION', [h], [o])
            hq = (1 / 128, 0)
        h = o
    if bare:
        b.inputs(a)
        b.outputs(h)
        return b.save(path)
    r = b.tensor('r', [1, T * F], dtype='int8', quant=q(*hq))
    b.op('RESHAPE', [h, b.tensor('rs', [2], data=np.array([1, T * F], np.int32))], [r])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [r, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wf=None):
        wf = wf or {}
        v = _qclip(xf @ wf.get('w1', w1 * s1).T + b1 * sx * s1, sa, za)
        for k, name in enumerate(ops):
            if name == 'PRELU':
                v = _qclip(np.where(v >= 0, v, v * wf.get(f'alpha{k}', alpha * salpha)), sp, zp)
            else:
                v = _qclip(v / np.sqrt((v * v).sum(-1, keepdims=True)), 1 / 128, 0)
        return wf.get('w2', w2 * s2) @ v.reshape(-1)
    return os.fspath(path), forward, sc, sx


def build_int8_unitnorm(path, seed=0, F=16, H=32, O=4):
    """Keras 3's UnitNormalization as TF 2.21's full-integer converter writes it (a held-out
    Dense(32) -> UnitNormalization -> Dense(4) file's ops and scales), built here: FC ->
    a [1, H]; DEQUANTIZE, SQUARE, QUANTIZE (a float island); SUM over the last axis,
    keep_dims (int8); RSQRT (int8); MINIMUM with a constant at its top code (1 / sqrt(eps)
    capped); MUL of a by it (broadcast); FC.  Returns (path, float numpy forward of the
    dequantized graph, the weight scales {name: scale}, the input's scale)."""
    rng = np.random.default_rng(seed)
    sx, zx, s1, sa, za, sq, zq, ss, zs, sr, zr, sm, zm, s2 = (
        0.0242, 4, 0.0029, 0.0271, 12, 0.0561, -128, 0.3735, -128, 0.00378, -128, 0.00435, 6, 0.0076)
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    w1 = rng.integers(-127, 128, (H, F)).astype(np.int8)
    b1 = rng.integers(-3000, 3000, H).astype(np.int32)
    w2 = rng.integers(-127, 128, (O, H)).astype(np.int8)
    b2 = rng.integers(-3000, 3000, O).astype(np.int32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, F], dtype='int8', quant=q(sx, zx))
    a = b.tensor('a', [1, H], dtype='int8', quant=q(sa, za))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [H], data=b1, quant=q(sx * s1, 0))], [a])
    af = b.tensor('af', [1, H], dtype='float32')
    b.op('DEQUANTIZE', [a], [af])
    sf = b.tensor('sf', [1, H], dtype='float32')
    b.op('SQUARE', [af], [sf])
    sqt = b.tensor('sq', [1, H], dtype='int8', quant=q(sq, zq))
    b.op('QUANTIZE', [sf], [sqt])
    st = b.tensor('s', [1, 1], dtype='int8', quant=q(ss, zs))
    b.op('SUM', [sqt, b.tensor('ax', [1], data=np.array([-1], np.int32))], [st], keep_dims=True)
    rt = b.tensor('r', [1, 1], dtype='int8', quant=q(sr, zr))
    b.op('RSQRT', [st], [rt])
    mt = b.tensor('mn', [1, 1], dtype='int8', quant=q(sr, zr))
    b.op('MINIMUM', [rt, b.tensor('cap', [], data=np.array(127, np.int8), quant=q(sr, zr))], [mt])
    ut = b.tensor('u', [1, H], dtype='int8', quant=q(sm, zm))
    b.op('MUL', [a, mt], [ut], fused_activation_function='NONE')
    y = b.tensor('y', [1, O], dtype='int8', quant=q(0.0233, -5))
    b.op('FULLY_CONNECTED', [ut, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)),
                             b.tensor('b2', [O], data=b2, quant=q(sm * s2, 0))], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xf, wf=None):
        wf = wf or {}
        v = _qclip(xf @ wf.get('w1', w1 * s1).T + b1 * sx * s1, sa, za)
        t = _qclip(_qclip(v * v, sq, zq).sum(), ss, zs)
        r = min(_qclip(1 / np.sqrt(t), sr, zr), 127 * sr + 128 * sr)
        u = _qclip(v * r, sm, zm)
        return wf.get('w2', w2 * s2) @ u + b2 * sm * s2
    return os.fspath(path), forward, {'w1': s1, 'w2': s2}, sx


def _ae_weights(seed, C=4):
    rng = np.random.default_rng(seed)
    return ((_rand(rng, C, 3, 3, 1) * 0.5).astype(np.float32),
            (_rand(rng, C) * 0.1).astype(np.float32),
            (_rand(rng, 1, 3, 3, C) * 0.3).astype(np.float32))


def _ae_forward(xs, wc, bc, wt, bt=0.0, hidden=False):
    """The autoencoder's float64 forward on [n, N, N, 1] (N even): CONV_2D SAME stride 2
    3x3 + RELU, then TRANSPOSE_CONV SAME stride 2 3x3 (pad 0 on top and left) + bt."""
    N, C, out, hs = xs.shape[1], wc.shape[0], [], []
    M = N // 2
    for x1 in xs.reshape(-1, N, N):
        xp = np.pad(x1.astype(np.float64), ((0, 1), (0, 1)))    # SAME on N: pad 0, 1
        hm = np.zeros((M, M, C))
        for i in range(M):
            for j in range(M):
                hm[i, j] = wc.reshape(C, 9).astype(np.float64) @ \
                    xp[2 * i:2 * i + 3, 2 * j:2 * j + 3].reshape(9) + bc
        hm = np.maximum(hm, 0)
        y1 = np.zeros((N + 1, N + 1))
        for i in range(M):
            for j in range(M):
                y1[2 * i:2 * i + 3, 2 * j:2 * j + 3] += np.einsum(
                    'abc,c->ab', wt[0].astype(np.float64), hm[i, j])
        out.append(y1[:N, :N, None] + bt)
        hs.append(hm)
    return (np.stack(out), np.stack(hs)) if hidden else np.stack(out)


def _q(scale, zero=0, dim=0):
    s = [float(v) for v in np.ravel(scale)]
    return {'scale': s, 'zero_point': [int(zero)] * len(s), 'quantized_dimension': dim}


def build_keras_autoencoder(path, seed=0, int8_on=None, size=8, channels=4):
    """What TF 2.21 writes for Keras's Conv2D(4, 3, strides=2, padding='same',
    activation='relu') -> Conv2DTranspose(1, 3, strides=2, padding='same') on [8, 8, 1]
    (the bias of a fresh Conv2DTranspose, zeros, is dropped: TRANSPOSE_CONV has three
    inputs), built here: the output shape read at run time (SHAPE of the conv's map ->
    STRIDED_SLICE of the batch -> PACK with 8, 8, 1), the weight [1, 3, 3, 4].
    int8_on: samples in [0, 1] to calibrate an int8 model on, as the converter writes
    one with a representative dataset (input 1/255 zero point -128, per-channel weights
    on axis 0, int32 biases at input x weight scale: the TRANSPOSE_CONV's too, 0.05).
    size, channels: [size, size, 1] (even) and the conv's channels, for other shapes.
    Returns (path, numpy forward of the float model as its ops define it)."""
    N, C, M = size, channels, size // 2
    wc, bc, wt = _ae_weights(seed, C)
    bt = 0.05 if int8_on is not None else 0.0
    b = CircleBuilder(identifier=b'TFL3')
    act = functools.partial(_act, b)
    if int8_on is None:
        x = act('x', [1, N, N, 1])
        w = b.tensor('conv.w', [C, 3, 3, 1], data=wc)
        bias = b.tensor('conv.b', [C], data=bc)
        h = act('h', [1, M, M, C])
        wk = b.tensor('tconv.w', [1, 3, 3, C], data=wt)
        y = act('y', [1, N, N, 1])
        tins = []
    else:
        yv, hv = _ae_forward(int8_on, wc, bc, wt, bt, hidden=True)
        sx, sh = 1 / 255, hv.max() / 255
        lo, hi = min(yv.min(), 0.0), max(yv.max(), 0.0)
        sy, zy = (hi - lo) / 255, int(round(-128 - lo / ((hi - lo) / 255)))
        swc = np.abs(wc).reshape(C, -1).max(1) / 127
        swt = np.abs(wt).reshape(1, -1).max(1) / 127
        x = b.tensor('x', [1, N, N, 1], dtype=np.int8, quant=_q(sx, -128),
                     signature=[-1, N, N, 1])
        w = b.tensor('conv.w', [C, 3, 3, 1], data=np.round(wc / swc[:, None, None, None])
                     .astype(np.int8), quant=_q(swc))
        bias = b.tensor('conv.b', [C], data=np.round(bc / (sx * swc)).astype(np.int32),
                        quant=_q(sx * swc))
        h = b.tensor('h', [1, M, M, C], dtype=np.int8, quant=_q(sh, -128),
                     signature=[-1, M, M, C])
        wk = b.tensor('tconv.w', [1, 3, 3, C], data=np.round(wt / swt[0]).astype(np.int8),
                      quant=_q(swt))
        tins = [b.tensor('tconv.b', [1], data=np.round(np.array([bt]) / (sh * swt))
                         .astype(np.int32), quant=_q(sh * swt))]
        y = b.tensor('y', [1, N, N, 1], dtype=np.int8, quant=_q(sy, zy), signature=[-1, N, N, 1])
    b.op('CONV_2D', [x, w, bias], [h], padding='SAME', stride_h=2, stride_w=2,
         fused_activation_function='RELU')
    new = _batch_and(b, h, 4, (N, N, 1))
    b.op('TRANSPOSE_CONV', [new, wk, h] + tins, [y], padding='SAME', stride_h=2, stride_w=2,
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path), lambda xs: _ae_forward(xs, wc, bc, wt, bt)


def build_int8_shared(path, kind='rnn', copies=False, seed=0, T=4, C=3, F=5, O=3, pc=False,
                      bias=True):
    """An int8 model whose weight tensors several layers read, as Keras's full-integer
    converter writes them, built here.  kind 'td': TimeDistributed(Dense): UNPACK of the
    steps of x [1, T, C], one FC (RELU) a step reading the one w1 and b1, PACK, RESHAPE,
    FC.  kind 'rnn': an unrolled SimpleRNN-like recurrence with ReLU: h0 = FC(x0; wx, bx,
    RELU), then h_t = ADD(FC(x_t; wx, bx), FC(h_t-1; wh), RELU) at a scale a step (the
    recurrent FC reads inputs at T-1 scales; it has no bias tensor), FC of the last
    state.  bias=False: the FCs of w1 / wx have none either.  copies: each layer
    reads a copy of its own (the same values: the unshared model).  pc: w1 / wx at a
    scale an output channel.  Returns (path, float numpy forward of the dequantized
    graph: f(x float [T, C], weights {name: float}) -> logits, the weight scales {name:
    scale (an array a channel for pc)}, the input's scale)."""
    rng = np.random.default_rng(seed)
    sx, sy = 0.02, 0.1
    q = lambda s, z: {'scale': list(np.atleast_1d(s)), 'zero_point': [z] * len(np.atleast_1d(s)),  # noqa: E731
                      **({'quantized_dimension': 0} if np.size(s) > 1 else {})}
    s1 = np.array([0.008, 0.012, 0.01, 0.006, 0.015][:F] + [0.01] * max(0, F - 5)) if pc else 0.01
    w1 = rng.integers(-70, 71, (F, C)).astype(np.int8)
    b1 = rng.integers(-300, 300, F).astype(np.int32)
    sh_, s2 = 0.008, 0.003
    wh = rng.integers(-90, 91, (F, F)).astype(np.int8)
    w2 = rng.integers(-100, 101, (O, F if kind == 'rnn' else T * F)).astype(np.int8)
    sc = {'w1': s1, 'w2': s2} if kind == 'td' else {'wx': s1, 'wh': sh_, 'w2': s2}
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C], dtype='int8', quant=q(sx, 0))
    xs = [b.tensor(f'x{t}', [1, C], dtype='int8', quant=q(sx, 0)) for t in range(T)]
    b.op('UNPACK', [x], xs, num=T, axis=1)
    made = {}

    def const(name, t, data, qt):
        key = name + (str(t) if copies else '')
        if key not in made:
            made[key] = b.tensor(key, data.shape, data=data, quant=qt)
        return made[key]
    n1 = 'w1' if kind == 'td' else 'wx'
    wq, bq = q(s1, 0), q(sx * np.asarray(s1, np.float64), 0)

    def bt(t):
        return const('b1' if kind == 'td' else 'bx', t, b1, bq) if bias else -1
    if kind == 'td':
        sh = 0.03
        hs = [b.tensor(f'h{t}', [1, F], dtype='int8', quant=q(sh, -128)) for t in range(T)]
        for t in range(T):
            b.op('FULLY_CONNECTED', [xs[t], const(n1, t, w1, wq), bt(t)], [hs[t]],
                 fused_activation_function='RELU')
        p = b.tensor('p', [1, T, F], dtype='int8', quant=q(sh, -128))
        b.op('PACK', hs, [p], values_count=T, axis=1)
        last = b.tensor('pr', [1, T * F], dtype='int8', quant=q(sh, -128))
        b.op('RESHAPE', [p, b.tensor('ps', [2], data=np.array([1, T * F], np.int32))], [last])
    else:
        sa, za, sr, zr = 0.04, 3, 0.05, -2
        sh = [0.03 + 0.012 * t for t in range(T)]
        h = b.tensor('h0', [1, F], dtype='int8', quant=q(sh[0], -128))
        b.op('FULLY_CONNECTED', [xs[0], const(n1, 0, w1, wq), bt(0)], [h],
             fused_activation_function='RELU')
        for t in range(1, T):
            a = b.tensor(f'a{t}', [1, F], dtype='int8', quant=q(sa, za))
            b.op('FULLY_CONNECTED', [xs[t], const(n1, t, w1, wq), bt(t)], [a])
            r = b.tensor(f'r{t}', [1, F], dtype='int8', quant=q(sr, zr))
            b.op('FULLY_CONNECTED', [h, const('wh', t, wh, q(sh_, 0)), -1], [r])
            h = b.tensor(f'h{t}', [1, F], dtype='int8', quant=q(sh[t], -128))
            b.op('ADD', [a, r], [h], fused_activation_function='RELU')
        last = h
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [last, b.tensor('w2', w2.shape, data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    s1c = np.asarray(s1, np.float64).reshape(-1, 1)
    bf = b1 * sx * np.asarray(s1, np.float64) * bias

    def forward(xf, wf=None):
        wf = wf or {}
        W1 = wf.get(n1, w1 * s1c)
        if kind == 'td':
            hf = _qclip(np.maximum(xf @ W1.T + bf, 0), sh, -128)
            return wf.get('w2', w2 * s2) @ hf.reshape(-1)
        Wh = wf.get('wh', wh * sh_)
        hf = _qclip(np.maximum(xf[0] @ W1.T + bf, 0), sh[0], -128)
        for t in range(1, T):
            a = _qclip(xf[t] @ W1.T + bf, sa, za)
            r = _qclip(hf @ Wh.T, sr, zr)
            hf = _qclip(np.maximum(a + r, 0), sh[t], -128)
        return wf.get('w2', w2 * s2) @ hf
    return os.fspath(path), forward, sc, sx


def build_raw_cnn(path, w, cin=1, depthwise=False, scale_layer=None):
    """Keras's Rescaling folded by the converter into the first conv (issue 28): x [1, H,
    H, cin] (0..255 pixels) -> (a MUL by scale_layer: the scale as a layer of its own) ->
    CONV_2D 3x3 VALID RELU (or DEPTHWISE_CONV_2D) -> MAX_POOL 2 -> RESHAPE ->
    FULLY_CONNECTED -> logits.  w: (conv weight in the file's layout with the rescaling in
    it, its bias, FC weight, its bias); H from the FC's inputs."""
    wc, bc, wf, bf = (np.asarray(a, np.float32) for a in w)
    K, O = len(bc), len(bf)
    P = int(round((wf.shape[1] // K) ** 0.5))
    H = 2 * P + 2
    b = CircleBuilder(identifier=b'TFL3')
    x = inp = b.tensor('x', [1, H, H, cin])
    if scale_layer:
        inp = b.tensor('xs', [1, H, H, cin])
        b.op('MUL', [x, b.tensor('s', [1], data=np.float32([scale_layer]))], [inp],
             fused_activation_function='NONE')
    c = b.tensor('c', [1, H - 2, H - 2, K])
    opts = dict(padding='VALID', stride_w=1, stride_h=1, fused_activation_function='RELU')
    if depthwise:
        opts['depth_multiplier'] = K // cin
    b.op('DEPTHWISE_CONV_2D' if depthwise else 'CONV_2D',
         [inp, b.tensor('wc', list(wc.shape), data=wc), b.tensor('bc', [K], data=bc)], [c],
         **opts)
    p = b.tensor('p', [1, P, P, K])
    b.op('MAX_POOL_2D', [c], [p], padding='VALID', stride_w=2, stride_h=2, filter_width=2,
         filter_height=2, fused_activation_function='NONE')
    r = b.tensor('r', [1, K * P * P])
    b.op('RESHAPE', [p, b.tensor('shape', [2], data=np.array([1, K * P * P], np.int32))], [r])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [r, b.tensor('wf', list(wf.shape), data=wf),
                             b.tensor('bf', [O], data=bf)], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(os.fspath(path))


def raw_images(path, n, seed=3, H=8, C=1, O=3):
    """n 0..255 images [H, H, C] in an .npz whose class (of O) is the brightest third of
    the image (top, middle, bottom); returns (path, x, y)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 120, (n, H, H, C)).astype(np.float32)
    y = rng.integers(0, O, n)
    for i in range(n):
        x[i, y[i] * 3:y[i] * 3 + 2] += 130
    np.savez(path, x=x, y=y)
    return os.fspath(path), x, y


def keras_ids(b, x, N, L, ints=False, wrap=True, select='SELECT_V2'):
    """The ids [1, L] of a Keras Embedding of N rows from input x as TF 2.21 writes them
    into builder b: a CAST of the float ids to int32 (ints: x is int32 already), Keras 3's
    SELECT_V2(LESS(i, 0), ADD(i, N), i) for negative ids (wrap; select 'SELECT': as the
    converter writes it for an input of a fixed batch).  Returns the tensor."""
    c = x
    if not ints:
        c = b.tensor('cast', [1, L], dtype='int32')
        b.op('CAST', [x], [c])
    if not wrap:
        return c
    zero = b.tensor('zero', [], data=np.array(0, np.int32))
    n = b.tensor('n', [], data=np.array(N, np.int32))
    less, add, sel = (b.tensor(s, [1, L], dtype=dt) for s, dt in
                      (('less', 'bool'), ('add', 'int32'), ('sel', 'int32')))
    b.op('LESS', [c, zero], [less])
    b.op('ADD', [c, n], [add], fused_activation_function='NONE')
    b.op(select, [less, add, c], [sel])
    return sel


def build_int8_embedding(path, N=7, D=4, L=5, O=3, wrap=True, seed=0, st=0.01, zt=-1, half=True,
                         sw=(0.04, 0.08), wide=2.2):
    """float ids [1, L] -> CAST -> [LESS, ADD, SELECT_V2: Keras 3's negative ids] ->
    GATHER of an int8 table [N, D] (scale st, zero point zt; the output at the table's, as
    TFLite requires) -> MEAN over L -> FULLY_CONNECTED (per-channel, weight scales in sw)
    -> DEQUANTIZE: TF 2.21's full-integer Embedding + GlobalAveragePooling1D + Dense with
    float I/O (tests/int8/test_q8_emb.py, tests/ops/test_embedding_ops.py).  half: the
    table's values use about half its range (a trained table can grow); the logits' range
    at least +-wide (0: as calibrated; past +-2 the int8 path keeps it: quant's
    _widen_logits).  Returns (path, the table, its int8 output's scale and zero point)."""
    r = np.random.default_rng(seed)
    E = (r.integers(-60, 61, (N, D)) if half else r.integers(-127, 128, (N, D))).astype(np.int8)
    W = r.integers(-127, 128, (O, D)).astype(np.int8)
    sw = r.uniform(*sw, O)
    sm = st * 0.6 if half else st
    B = r.integers(-300, 300, O).astype(np.int32)
    ids = r.integers(0, N, (256, L))
    of = ((E[ids].astype(float) - zt) * st).mean(1) @ (W * sw[:, None]).T + B * sw * sm
    so, zo = max(1.5 * np.abs(of).max(), wide) / 127, 2 if wide else 0
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('ids', [1, L])
    i = keras_ids(b, x, N, L, wrap=wrap)
    emb = b.tensor('emb', [N, D], data=E, quant={'scale': [st], 'zero_point': [zt]})
    g = b.tensor('gathered', [1, L, D], dtype=np.int8, quant={'scale': [st], 'zero_point': [zt]})
    b.op('GATHER', [emb, i], [g], axis=0, batch_dims=0)
    axis = b.tensor('axis', [1], data=np.array([1], np.int32))
    m = b.tensor('mean', [1, D], dtype=np.int8, quant={'scale': [sm], 'zero_point': [0]})
    b.op('MEAN', [g, axis], [m], keep_dims=False)
    w = b.tensor('w', [O, D], data=W, quant={'scale': list(sw), 'zero_point': [0] * O,
                                            'quantized_dimension': 0})
    bias = b.tensor('b', [O], data=B, quant={'scale': list(sw * sm), 'zero_point': [0] * O})
    yq = b.tensor('yq', [1, O], dtype=np.int8, quant={'scale': [so], 'zero_point': [zo]})
    b.op('FULLY_CONNECTED', [m, w, bias], [yq], fused_activation_function='NONE')
    y = b.tensor('y', [1, O])
    b.op('DEQUANTIZE', [yq], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path), E, so, zo


def _int8_layers(b, rng, spread=2):
    """act(shape, scale, zero point) -> an int8 activation tensor of builder b, and
    layer(kind 'fc' / 'conv' / 'dw', x, its scale, I, O, y's shape, y's scale and zero
    point, k, stride, fused) -> y: a layer with random per-channel int8 weights scaled
    so its outputs' spread is about `spread` steps of y's scale for inputs spread 40
    steps of theirs (rng's draws in a fixed order)."""
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa: E731
    n = [0]

    def act(shape, s_, z):
        n[0] += 1
        return b.tensor(f'a{n[0]}', shape, dtype='int8', quant=q(s_, z))

    def layer(kind, x, sx, I, O_, shape_y, sy, zy, k=3, stride=1, fused='NONE'):
        fan = I if kind == 'fc' else k * k * (1 if kind == 'dw' else I)
        sw = rng.uniform(0.7, 1.3, O_) * spread * sy / (fan ** 0.5 * 40 * sx * 73)
        wshape = {'fc': (O_, I), 'conv': (O_, k, k, I), 'dw': (1, k, k, O_)}[kind]
        w = b.tensor(f'w{n[0]}', wshape, data=rng.integers(-127, 128, wshape).astype(np.int8),
                     quant={'scale': list(sw), 'zero_point': [0] * O_,
                            'quantized_dimension': 3 if kind == 'dw' else 0})
        bt = b.tensor(f'b{n[0]}', [O_], data=rng.integers(-300, 300, O_).astype(np.int32),
                      quant={'scale': list(sx * sw), 'zero_point': [0] * O_})
        y = act(shape_y, sy, zy)
        name = {'fc': 'FULLY_CONNECTED', 'conv': 'CONV_2D', 'dw': 'DEPTHWISE_CONV_2D'}[kind]
        opts = {} if kind == 'fc' else dict(padding='SAME', stride_w=stride, stride_h=stride)
        if kind == 'dw':
            opts['depth_multiplier'] = 1
        b.op(name, [x, w, bt], [y], fused_activation_function=fused, **opts)
        return y
    return act, layer


def build_int8_rescnn(path, seed=0, H=24, C=12, D=16, O=5):
    """A residual CNN as Keras's converter writes one at full int8 (SeparableConv2D +
    Add): conv 3x3 stride 2 RELU (C) -> [depthwise 3x3 -> 1x1 RELU -> depthwise 3x3 ->
    1x1] + the conv's output (ADD) -> RELU -> conv 3x3 stride 2 RELU (D) -> MEAN -> FC
    (O): the held-out hr_rescnn_int8 of docs/memory.md's sweep, random weights."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa: E731
    act, layer = _int8_layers(b, rng)
    h, h2 = H // 2, H // 4
    x = b.tensor('x', [1, H, H, 3], dtype='int8', quant=q(0.03, 0))
    c = layer('conv', x, 0.03, 3, C, [1, h, h, C], 0.04, -128, stride=2, fused='RELU')
    y = layer('dw', c, 0.04, C, C, [1, h, h, C], 0.05, 3)
    y = layer('conv', y, 0.05, C, C, [1, h, h, C], 0.04, -128, k=1, fused='RELU')
    y = layer('dw', y, 0.04, C, C, [1, h, h, C], 0.05, 2)
    y = layer('conv', y, 0.05, C, C, [1, h, h, C], 0.06, 5, k=1)
    a = act([1, h, h, C], 0.06, -128)
    b.op('ADD', [c, y], [a], fused_activation_function='RELU')
    z = layer('conv', a, 0.06, C, D, [1, h2, h2, D], 0.05, -128, stride=2, fused='RELU')
    return _int8_head(b, act, layer, path, x, z, D, O, -20)


def _int8_head(b, act, layer, path, x, z, D, O, zm):
    """A global average pool (MEAN, zero point zm) of z [1, h, w, D] and an FC (O) as the
    model's output (x its input), saved at path."""
    m = act([1, D], 0.04, zm)
    b.op('MEAN', [z, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m], keep_dims=False)
    o = layer('fc', m, 0.04, D, O, [1, O], 0.08, -2)
    b.inputs(x)
    b.outputs(o)
    b.save(path)
    return path


def build_int8_rescaled_mbv2(path, seed=0, H=32, C=8, E=3, D=12, O=3, mul=2.0, add=-1.0,
                             pool=None, per_channel=False, sub=False):
    """A Teachable Machine / Model Maker style int8 MobileNet in small: the Rescaling
    layer's MUL and ADD of int8 scalar constants (x * mul + add, 0..1 pixels to -1..1)
    before the convolutions, as TFLite's converter writes them (two elementwise ops of a
    constant, not folded into the first conv), then conv 3x3 stride 2 RELU6 (C) ->
    depthwise 3x3 RELU6 -> 1x1 (C) -> expand 1x1 RELU6 (E C) -> depthwise 3x3 stride 2
    RELU6 -> 1x1 (D) -> [expand 1x1 RELU6 -> depthwise 3x3 RELU6 -> 1x1 (D)] + its input
    (ADD) -> MEAN -> FC (O).  pool: (MAX_POOL_2D or AVERAGE_POOL_2D, filter, stride,
    padding) after the first conv; per_channel: the MUL's constant one a channel (a
    Normalization layer's), not one value; sub: a SUB of -add, not an ADD.  Random
    weights."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa: E731
    act, layer = _int8_layers(b, rng, 40)
    h = -(-H // 2)
    s0 = 1 / 255
    x = b.tensor('x', [1, H, H, 3], dtype='int8', quant=q(s0, -128))
    km = (127 if mul > 0 else -127) * np.array([1, .9, .8] if per_channel else 1)
    km = b.tensor('k_mul', [3] if per_channel else [], dtype='int8',
                  data=np.round(km).astype(np.int8), quant=q(abs(mul) / 127, 0))
    s1 = abs(mul) / 255
    xm = act([1, H, H, 3], s1, -128 if mul > 0 else 127)
    b.op('MUL', [x, km], [xm], fused_activation_function='NONE')
    ka = b.tensor('k_add', [], dtype='int8', data=np.array(
        (-127 if add < 0 else 127) * (-1 if sub else 1), np.int8), quant=q(abs(add) / 127, 0))
    lo, hi = min(0, mul) + add, max(0, mul) + add
    s2 = (hi - lo) / 255
    z2 = int(round(-128 - lo / s2))
    xa = act([1, H, H, 3], s2, z2)
    b.op('SUB' if sub else 'ADD', [xm, ka], [xa], fused_activation_function='NONE')
    r6 = 6 / 255
    c = layer('conv', xa, s2, 3, C, [1, h, h, C], r6, -128, stride=2, fused='RELU6')
    if pool:
        name, k, st, pad = pool
        h = -(-h // st) if pad == 'SAME' else (h - k) // st + 1
        cp = act([1, h, h, C], r6, -128)
        b.op(name, [c], [cp], padding=pad, stride_w=st, stride_h=st, filter_width=k,
             filter_height=k, fused_activation_function='NONE')
        c = cp
    h2 = -(-h // 2)
    y = layer('dw', c, r6, C, C, [1, h, h, C], r6, -128, fused='RELU6')
    y = layer('conv', y, r6, C, C, [1, h, h, C], 0.05, 3, k=1)
    y = layer('conv', y, 0.05, C, E * C, [1, h, h, E * C], r6, -128, k=1, fused='RELU6')
    y = layer('dw', y, r6, E * C, E * C, [1, h2, h2, E * C], r6, -128, stride=2, fused='RELU6')
    p = layer('conv', y, r6, E * C, D, [1, h2, h2, D], 0.05, -4, k=1)
    y = layer('conv', p, 0.05, D, E * D, [1, h2, h2, E * D], r6, -128, k=1, fused='RELU6')
    y = layer('dw', y, r6, E * D, E * D, [1, h2, h2, E * D], r6, -128, fused='RELU6')
    y = layer('conv', y, r6, E * D, D, [1, h2, h2, D], 0.05, 2, k=1)
    a = act([1, h2, h2, D], 0.07, -1)
    b.op('ADD', [p, y], [a], fused_activation_function='NONE')
    return _int8_head(b, act, layer, path, x, a, D, O, -3)


def _bias_input(b, bias):
    """fn(name, values) -> a weighted op's bias input: [the float32 tensor] (bias), else
    [-1] (the op has none, as Keras's use_bias=False writes it)."""
    return (lambda n, v: [b.tensor(n, [len(v)], data=np.asarray(v, np.float32))]) if bias else (
        lambda n, v: [-1])


def build_keras_normalized(path, seed=0, F=5, H=6, O=3, bias=True):
    """Keras's Normalization layer as TF 2.21 writes it, at the input and mid-network:
    x -> SUB(mean) -> MUL(1 / std) -> Dense(H, relu) -> SUB(mean_h) -> MUL(1 / std_h)
    -> Dense(O) (bias: the Dense layers' biases; without, no bias tensor), the
    constants adapted on the samples make_x gives.  Returns (path, numpy forward:
    logits, make_x(n, seed): samples far from 0 and 1)."""
    rng = np.random.default_rng(seed)
    off, sc = rng.uniform(20, 60, F), rng.uniform(2, 12, F)

    def make_x(n, s=1):
        return (np.random.default_rng(s).standard_normal((n, F)) * sc + off).astype(np.float32)
    xs = make_x(400, 99).astype(np.float64)
    w1, w2 = _rand(rng, H, F), _rand(rng, O, H)
    b1, b2 = (0.3 * _rand(rng, H), 0.3 * _rand(rng, O)) if bias else (np.zeros(H), np.zeros(O))
    m1, i1 = xs.mean(0), 1 / xs.std(0)
    hs = np.maximum((xs - m1) * i1 @ w1.T + b1, 0)
    m2, i2 = hs.mean(0), 1 / np.maximum(hs.std(0), 1e-3)
    b = CircleBuilder(identifier=b'TFL3')
    act = functools.partial(_act, b)
    x, n1, z1, h, n2, z2, y = (act(n, [1, k]) for n, k in (
        ('x', F), ('sub', F), ('norm', F), ('h', H), ('hsub', H), ('hnorm', H), ('y', O)))
    f32 = np.float32
    b.op('SUB', [x, b.tensor('mean', [F], data=m1.astype(f32))], [n1])
    b.op('MUL', [n1, b.tensor('inv_std', [F], data=i1.astype(f32))], [z1])
    bt = _bias_input(b, bias)
    b.op('FULLY_CONNECTED', [z1, b.tensor('w1', w1.shape, data=w1)] + bt('b1', b1), [h],
         fused_activation_function='RELU')
    b.op('SUB', [h, b.tensor('mean_h', [H], data=m2.astype(f32))], [n2])
    b.op('MUL', [n2, b.tensor('inv_std_h', [H], data=i2.astype(f32))], [z2])
    b.op('FULLY_CONNECTED', [z2, b.tensor('w2', w2.shape, data=w2)] + bt('b2', b2), [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xs):
        f = [np.asarray(v, np.float64) for v in (m1.astype(f32), i1.astype(f32), m2.astype(f32),
                                                   i2.astype(f32))]
        h = np.maximum((xs - f[0]) * f[1] @ w1.T + b1, 0)
        return (h - f[2]) * f[3] @ w2.T + b2
    return os.fspath(path), forward, make_x


def build_keras_float_embedding(path, N=9, D=4, L=5, O=3, seed=0, bias=True):
    """A float Keras Embedding as TF 2.21 writes it: float ids [1, L] -> CAST ->
    SELECT_V2 (Keras 3's negative ids) -> GATHER of a float table [N, D] -> MEAN over L
    (GlobalAveragePooling1D) -> Dense(O) (bias: with its bias).  Returns (path, the
    table, numpy forward of ids: logits)."""
    r = np.random.default_rng(seed)
    E, W = _rand(r, N, D), _rand(r, O, D)
    B = 0.3 * _rand(r, O) if bias else np.zeros(O, np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('ids', [1, L])
    i = keras_ids(b, x, N, L)
    g = b.tensor('gathered', [1, L, D])
    b.op('GATHER', [b.tensor('emb', [N, D], data=E), i], [g], axis=0, batch_dims=0)
    m = b.tensor('mean', [1, D])
    b.op('MEAN', [g, b.tensor('axis', [1], data=np.array([1], np.int32))], [m], keep_dims=False)
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [m, b.tensor('w', [O, D], data=W)] + (
        [b.tensor('b', [O], data=B)] if bias else [-1]), [y], fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path), E, lambda ids: E[np.asarray(ids, int)].mean(1) @ W.T + B


def build_divided(path, seed=0, F=5, H=6, O=3, bias=True):
    """A PyTorch-style float model dividing by constants, at the input and mid-network:
    x -> SUB(mean) -> DIV(std) ((x - mean) / std of buffers) -> FC(H, relu) -> DIV(c_h)
    (a per-feature constant) -> FC(O) (bias: with biases; without, no bias tensor).
    Returns (path, numpy forward: logits, make_x(n, seed): samples far from 0 and 1)."""
    rng = np.random.default_rng(seed)
    off, sc = rng.uniform(20, 60, F), rng.uniform(2, 12, F)

    def make_x(n, s=1):
        return (np.random.default_rng(s).standard_normal((n, F)) * sc + off).astype(np.float32)
    f32 = np.float32
    m1, s1 = off.astype(f32), sc.astype(f32)
    w1, w2 = _rand(rng, H, F), _rand(rng, O, H)
    b1, b2 = (0.3 * _rand(rng, H), 0.3 * _rand(rng, O)) if bias else (np.zeros(H), np.zeros(O))
    ch = rng.uniform(0.5, 4, H).astype(f32)
    b = CircleBuilder(identifier=b'TFL3')
    x, n1, z1, h, z2, y = (_act(b, n, [1, k]) for n, k in (
        ('x', F), ('sub', F), ('norm', F), ('h', H), ('hdiv', H), ('y', O)))
    bt = _bias_input(b, bias)
    b.op('SUB', [x, b.tensor('mean', [F], data=m1)], [n1])
    b.op('DIV', [n1, b.tensor('std', [F], data=s1)], [z1])
    b.op('FULLY_CONNECTED', [z1, b.tensor('w1', w1.shape, data=w1)] + bt('b1', b1), [h],
         fused_activation_function='RELU')
    b.op('DIV', [h, b.tensor('c_h', [H], data=ch)], [z2])
    b.op('FULLY_CONNECTED', [z2, b.tensor('w2', w2.shape, data=w2)] + bt('b2', b2), [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xs):
        f = [np.asarray(v, np.float64) for v in (m1, s1, ch)]
        h = np.maximum((xs - f[0]) / f[1] @ w1.T + b1, 0)
        return h / f[2] @ w2.T + b2
    return os.fspath(path), forward, make_x


def build_clipped(path, seed=0, F=5, H=6, O=3, bias=True):
    """A float model clipped by constants: x -> FC(H) -> MAXIMUM(-1, a scalar []) ->
    MINIMUM(6, a [1]) (tf.clip_by_value, torch.clamp) -> FC(H, relu) -> MINIMUM(c, one
    bound a feature: a ReLU(max_value) of its own each) -> FC(O) (bias: with biases).
    Returns (path, numpy forward: logits, make_x(n, seed): samples that reach every
    clip)."""
    rng = np.random.default_rng(seed)

    def make_x(n, s=1):
        return (2 * np.random.default_rng(s).standard_normal((n, F))).astype(np.float32)
    f32 = np.float32
    w1, w2, w3 = _rand(rng, H, F), _rand(rng, H, H), _rand(rng, O, H)
    b1, b2, b3 = ((0.3 * _rand(rng, H), 0.3 * _rand(rng, H), 0.3 * _rand(rng, O)) if bias
                  else (np.zeros(H), np.zeros(H), np.zeros(O)))
    c = rng.uniform(1, 5, H).astype(f32)
    b = CircleBuilder(identifier=b'TFL3')
    x, a, lo, hi, r, cl, y = (_act(b, n, [1, k]) for n, k in (
        ('x', F), ('a', H), ('lo', H), ('hi', H), ('r', H), ('clip', H), ('y', O)))
    bt = _bias_input(b, bias)
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1)] + bt('b1', b1), [a])
    b.op('MAXIMUM', [a, b.tensor('minus_one', [], data=np.array(-1, f32))], [lo])
    b.op('MINIMUM', [lo, b.tensor('six', [1], data=np.array([6], f32))], [hi])
    b.op('FULLY_CONNECTED', [hi, b.tensor('w2', w2.shape, data=w2)] + bt('b2', b2), [r],
         fused_activation_function='RELU')
    b.op('MINIMUM', [r, b.tensor('cap', [H], data=c)], [cl])
    b.op('FULLY_CONNECTED', [cl, b.tensor('w3', w3.shape, data=w3)] + bt('b3', b3), [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xs):
        h = np.clip(xs @ w1.T + b1, -1, 6)
        return np.minimum(np.maximum(h @ w2.T + b2, 0), c.astype(np.float64)) @ w3.T + b3
    return os.fspath(path), forward, make_x


def build_constant_op(path, kind, seed=0, F=5, H=6, O=3):
    """x -> an op of x and a constant -> FC(H, relu) -> FC(O): kind 'cdiv' c / x (a
    constant first, c one a feature, x in 1..4), 'pow2' POW(x, 2) (tf.pow, a PyTorch
    x ** 2), 'pow05' POW(x, 0.5) (x in 0.1..4), 'pow3' POW(x, 3).  Returns (path, numpy
    forward: logits, make_x(n, seed))."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    c = rng.uniform(1, 3, F).astype(f32)
    w1, b1, w2, b2 = (0.5 * _rand(rng, H, F), 0.2 * _rand(rng, H), 0.5 * _rand(rng, O, H),
                      0.2 * _rand(rng, O))
    lo, hi = {'cdiv': (1, 4), 'pow05': (0.1, 4)}.get(kind, (-2, 2))

    def make_x(n, s=1):
        return np.random.default_rng(s).uniform(lo, hi, (n, F)).astype(f32)
    e = {'pow2': 2.0, 'pow05': 0.5, 'pow3': 3.0}.get(kind)
    b = CircleBuilder(identifier=b'TFL3')
    x, z, h, y = (_act(b, n, [1, k]) for n, k in (('x', F), ('z', F), ('h', H), ('y', O)))
    if kind == 'cdiv':
        b.op('DIV', [b.tensor('c', [F], data=c), x], [z])
    else:
        b.op('POW', [x, b.tensor('e', [], data=np.array(e, f32))], [z])
    b.op('FULLY_CONNECTED', [z, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [H], data=b1)],
         [h], fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [O], data=b2)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xs):
        z = c.astype(np.float64) / xs if kind == 'cdiv' else xs ** e
        return np.maximum(z @ w1.T + b1, 0) @ w2.T + b2
    return os.fspath(path), forward, make_x


def build_keras_while_lstm(path, seed=0, T=5, F=3, H=4, O=3, seq=False, trip='static',
                           body_op=None, bi=False, f16=False, fc_bias=False, cell='lstm',
                           step_shape=False, permute=False):
    """What TFLiteConverter.from_keras_model writes for a Keras LSTM that is not
    unroll=True (TensorFlow 2.21), built here: a WHILE over the loop values (counter,
    step, output buffer, h, c, the time-major sequence [T, 1, F]); its cond subgraph
    LESS(step, T) AND LESS(counter, T); its body the cell (FCs without bias, the bias
    ADDed, SPLIT into i, f, g, o, LOGISTIC / TANH / MUL), the step's input by GATHER with
    the int counter, and for seq (return_sequences) the buffer rebuilt as
    concat(buf[:i], h, buf[i+1:]) by SLICEs whose begin and size are int arithmetic on the
    counter (RESHAPE, CONCATENATION), then Flatten -> Dense; else h after the loop ->
    Dense.  bi: a second loop reads the sequence REVERSE_V2'd and its h is concatenated
    (Bidirectional).  trip 'runtime': the cond's bound is computed from the input
    (ARG_MAX: not known before the loop runs); body_op: an op (a name) on the cell's
    output that utrain has no kernel for; f16: the cell's weights float16, each DEQUANTIZEd
    in the body (the converter's float16 quantization); fc_bias: each FC with a bias inside
    (the input's the cell's bias, the recurrent one a b_hh of its own, as Keras's GRU with
    reset_after writes its cell: the first step's recurrent FC then reads the zero state
    and b_hh); cell 'rnn': a SimpleRNN's instead (h = tanh(x Wx + h Wh + b), no c among
    the loop values); step_shape (with seq): the loop's output buffer given one step's
    shape [1, 1, H] (signature [-1, -1, H]), and so the batch-major TRANSPOSE and the
    BatchNormalization (MUL, ADD) after it, as TensorFlow 2.x wrote a GitHub Keras
    LSTM(return_sequences) -> BatchNormalization -> Flatten model; permute (with seq):
    Permute((2, 1)) before the Flatten (RESHAPE [1, T, H], TRANSPOSE to [1, H, T]).
    Returns (path, numpy forward)."""
    lstm = cell == 'lstm'
    G = 4 if lstm else 1                # (gates)
    rng = np.random.default_rng(seed)
    nets = []
    for _ in range(2 if bi else 1):
        nets.append(tuple(w.astype(np.float16).astype(np.float32) if f16 else w for w in (
            _rand(rng, G * H, F) * 0.5, _rand(rng, G * H, H) * 0.5, _rand(rng, G * H) * 0.3)))
    bhh = [_rand(rng, G * H) * 0.3 if fc_bias else np.zeros(G * H, np.float32) for _ in nets]
    bn = (1 + 0.2 * _rand(rng, H), 0.1 * _rand(rng, H)) if step_shape else \
        (np.ones(H, np.float32), np.zeros(H, np.float32))
    wo = _rand(rng, O, (T * H if seq else H) * len(nets))
    bo = _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')
    i32 = lambda name, v: b.tensor(name, np.shape(v), data=np.array(v, np.int32))  # noqa: E731

    x = b.tensor('x', [1, T, F])
    xt = b.tensor('x_tm', [T, 1, F])
    b.op('RESHAPE', [x, i32('tm', [T, 1, F])], [xt])
    zero, zs = i32('zero', 0), b.tensor('h0', [1, H], data=np.zeros((1, H), np.float32))
    nb = T if seq else 1
    buf0 = b.tensor('buf0', [nb, 1, H], data=np.zeros((nb, 1, H), np.float32))
    lim = None
    if trip == 'runtime':
        am = b.tensor('argmax', [1, F], dtype=np.int32)
        b.op('ARG_MAX', [x, i32('ax1', 1)], [am], output_type='INT32')
        lim = b.tensor('limit', [], dtype=np.int32)
        b.op('REDUCE_MAX', [am, i32('ax01', [0, 1])], [lim])
    hs = []
    # loop values: counter, step, output buffer, h, (c), the sequence, (the bound)
    specs = [([], np.int32), ([], np.int32), ([nb, 1, H], None), ([1, H], None)] + \
        ([([1, H], None)] if lstm else []) + [([T, 1, F], None)] + \
        ([([], np.int32)] if lim is not None else [])
    iS = len(specs) - 1 - (lim is not None)
    for j, (wx, wh, bias) in enumerate(nets):
        src = xt
        if j:
            src = b.tensor('x_rev', [T, 1, F])
            b.op('REVERSE_V2', [xt, i32('rev_axis', [0])], [src])
        # cond
        c = CircleBuilder(identifier=b'TFL3')
        ca = [c.tensor(f'cond_arg{k}', s, dtype=d) for k, (s, d) in enumerate(specs)]
        bound = ca[iS + 1] if lim is not None else c.tensor('T', [], data=np.array(T, np.int32))
        l1, l2, both = (c.tensor(n, [], dtype=np.bool_) for n in ('less', 'less1', 'and'))
        c.op('LESS', [ca[1], bound], [l1])
        c.op('LESS', [ca[0], bound], [l2])
        c.op('LOGICAL_AND', [l2, l1], [both])
        c.inputs(*ca)
        c.outputs(both)
        # body
        d = CircleBuilder(identifier=b'TFL3')
        a = [d.tensor(f'body_arg{k}', s, dtype=dt) for k, (s, dt) in enumerate(specs)]
        di = lambda name, v: d.tensor(name, np.shape(v), data=np.array(v, np.int32))  # noqa: E731
        one = di('one', 1)
        step, cnt = d.tensor('add', [], dtype=np.int32), d.tensor('add_1', [], dtype=np.int32)
        d.op('ADD', [a[1], one], [step])
        d.op('ADD', [a[0], one], [cnt])
        tw = [d.tensor(f'lstm{j}/{n}', w.shape, data=w.astype(np.float16) if f16 else w)
              for n, w in (('MatMul', wx), ('MatMul_1', wh), ('bias', bias))]
        if f16:                     # (float16 weights: a DEQUANTIZE of each in the body)
            for k, w in enumerate(tw):
                tw[k] = d.tensor(f'lstm{j}/w{k}', d._tensors[w].shape)
                d.op('DEQUANTIZE', [w], [tw[k]])
        xi = d.tensor('x_t', [1, F])
        d.op('GATHER', [a[iS], a[1]], [xi], axis=0)
        r1, r2, s1 = (d.tensor(n, [1, G * H]) for n in ('mm_h', 'mm_x', 'sum'))
        r1f = d.tensor('mm_h_flat', [G * H])
        bh = d.tensor(f'lstm{j}/bias_hh', [G * H], data=bhh[j]) if fc_bias else -1
        d.op('FULLY_CONNECTED', [a[3], tw[1], bh], [r1])
        d.op('RESHAPE', [r1, di('flat', [G * H])], [r1f])
        d.op('FULLY_CONNECTED', [xi, tw[0], tw[2] if fc_bias else -1], [r2])
        d.op('ADD', [r2, r1f], [s1])
        s2 = s1
        if not fc_bias:
            s2 = d.tensor('biased', [1, G * H])
            d.op('ADD', [s1, tw[2]], [s2])
        if not lstm:
            h2, c2 = d.tensor('h', [1, H]), None
            d.op('TANH', [s2], [h2])
        else:
            gates = [d.tensor(f'gate{k}', [1, H]) for k in range(4)]
            d.op('SPLIT', [one, s2], gates, num_splits=4)
            ig, fg, og, gg = (d.tensor(n, [1, H]) for n in ('i', 'f', 'o', 'g'))
            d.op('LOGISTIC', [gates[0]], [ig])
            d.op('LOGISTIC', [gates[1]], [fg])
            d.op('LOGISTIC', [gates[3]], [og])
            d.op('TANH', [gates[2]], [gg])
            fc_, ig_, c2, tc, h2 = (d.tensor(n, [1, H]) for n in ('fc', 'ig', 'c', 'tanh_c', 'h'))
            d.op('MUL', [fg, a[4]], [fc_])
            d.op('MUL', [ig, gg], [ig_])
            d.op('ADD', [fc_, ig_], [c2])
            d.op('TANH', [c2], [tc])
            d.op('MUL', [og, tc], [h2])
        if body_op:
            h3 = d.tensor('h_odd', [1, H])
            d.op(body_op, [h2], [h3])
            h2 = h3
        h3d = d.tensor('h_3d', [1, 1, H])
        d.op('RESHAPE', [h2, di('h3shape', [1, 1, H])], [h3d])
        if seq:                         # buf[:i], h, buf[i+1:] (TensorListSetItem)
            i1 = d.tensor('i1', [1], dtype=np.int32)
            d.op('RESHAPE', [a[1], di('one_1', [1])], [i1])
            sz = d.tensor('size', [3], dtype=np.int32)
            d.op('CONCATENATION', [i1, di('m1', [-1, -1])], [sz], axis=0)
            head = d.tensor('head', [1, 1, 1], signature=[-1, -1, -1])
            d.op('SLICE', [a[2], di('z3', [0, 0, 0]), sz], [head])
            n1 = d.tensor('n1', [1], dtype=np.int32)
            d.op('RESHAPE', [step, di('one_2', [1])], [n1])
            bg = d.tensor('begin', [3], dtype=np.int32)
            d.op('CONCATENATION', [n1, di('z2', [0, 0])], [bg], axis=0)
            tail = d.tensor('tail', [1, 1, H], signature=[-1, 1, H])
            d.op('SLICE', [a[2], bg, di('m3', [-1, -1, -1])], [tail])
            nbuf = d.tensor('buf', [nb, 1, H])
            d.op('CONCATENATION', [head, h3d, tail], [nbuf], axis=0)
        else:
            nbuf = h3d
        d.inputs(*a)
        d.outputs(cnt, step, nbuf, h2, *([c2] if lstm else []), a[iS], *a[iS + 1:])
        for t in (d._tensors + c._tensors) if j else ():     # (names of their own, as
            if not t.name.startswith('lstm'):                  # TensorFlow's backward layer)
                t.name = 'backward/' + t.name
        ci, bi_ = b.subgraph(c, f'while_cond{j}'), b.subgraph(d, f'while_body{j}')
        outs = [b.tensor(f'w{j}_{k}', [1, 1, H], signature=[-1, -1, H])
                if step_shape and k == 2 else b.tensor(f'w{j}_{k}', s, dtype=dt)
                for k, (s, dt) in enumerate(specs)]
        b.op('WHILE', [zero, zero, buf0, zs] + [zs] * lstm + [src] + ([lim] if lim is not None
                                                                       else []), outs,
             cond_subgraph_index=ci, body_subgraph_index=bi_)
        if seq and step_shape:          # (-> BatchNormalization: MUL, ADD by constants)
            bm, sc, sh = (b.tensor(f'{n}{j}', [1, 1, H], signature=[-1, -1, H])
                          for n in ('batch_major', 'bn_mul', 'bn_add'))
            b.op('TRANSPOSE', [outs[2], i32(f'perm{j}', [1, 0, 2])], [bm])
            b.op('MUL', [bm, b.tensor(f'bn_scale{j}', [H], data=bn[0])], [sc])
            b.op('ADD', [sc, b.tensor(f'bn_shift{j}', [H], data=bn[1])], [sh])
            f = b.tensor(f'flat{j}', [1, T * H], signature=[-1, T * H])
            b.op('RESHAPE', [sh, i32(f'fshape{j}', [-1, T * H])], [f])
            hs.append(f)
        elif seq:
            f, cur = b.tensor(f'flat{j}', [1, T * H]), outs[2]
            if permute:                 # (Permute((2, 1)): the steps last)
                bt, ht = b.tensor(f'batch_major{j}', [1, T, H]), b.tensor(f'permuted{j}', [1, H, T])
                b.op('RESHAPE', [cur, i32(f'bshape{j}', [1, T, H])], [bt])
                b.op('TRANSPOSE', [bt, i32(f'perm{j}', [0, 2, 1])], [ht])
                cur = ht
            b.op('RESHAPE', [cur, i32(f'fshape{j}', [1, T * H])], [f])
            hs.append(f)
        else:
            hs.append(outs[3])
    feat = hs[0]
    if bi:
        feat = b.tensor('both', [1, wo.shape[1]])
        b.op('CONCATENATION', hs, [feat], axis=1)
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [feat, b.tensor('wo', wo.shape, data=wo), b.tensor('bo', [O], data=bo)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def sig(v):
        return 1 / (1 + np.exp(-v))

    def forward(xs, **p):               # (p: weights by tensor name, in place of the file's)
        feats = []
        for j, ws in enumerate(nets):
            wx, wh, bias = (p.get(f'lstm{j}/{n}', w) for n, w in zip(('MatMul', 'MatMul_1', 'bias'), ws))
            bias = bias + p.get(f'lstm{j}/bias_hh', bhh[j])
            h = np.zeros((len(xs), H))
            c = np.zeros((len(xs), H))
            outs = []
            for t in range(T):
                z = xs[:, T - 1 - t if j else t] @ wx.T + h @ wh.T + bias
                if not lstm:
                    h = np.tanh(z)
                    outs.append(h)
                    continue
                i_, f_, g_, o_ = (z[:, k * H:(k + 1) * H] for k in range(4))
                c = sig(f_) * c + sig(i_) * np.tanh(g_)
                h = sig(o_) * np.tanh(c)
                outs.append(h)
            seqs = np.stack([o * bn[0] + bn[1] for o in outs], 1)      # [N, T, H]
            feats.append((seqs.transpose(0, 2, 1) if permute else seqs).reshape(len(xs), -1)
                         if seq else h)
        return np.concatenate(feats, 1) @ p.get('wo', wo).T + p.get('bo', bo)
    return os.fspath(path), forward


def build_const_state_rnn(path, seed=0, T=4, F=3, H=5, O=3, h0=0.0):
    """An unrolled recurrent layer whose recurrent FULLY_CONNECTED (bias b_hh inside, as
    Keras's GRU with reset_after writes it) reads a constant state in its first step, as
    TensorFlow 2.21's WHILE GRU is after utrain unrolls it: x [1, T*F] -> SPLIT into T
    steps; h = h0 (a constant [1, H]: zeros, or h0 itself); each step
    h = tanh(FC(x_t, W, b_x) + FC(h, U, b_hh)), every step the same W, U, b_x, b_hh
    tensors -> FC -> logits.  Returns (path, numpy forward of the logits)."""
    rng = np.random.default_rng(seed)
    w, u = _rand(rng, H, F) * 0.7, _rand(rng, H, H) * 0.5
    bx, bh = _rand(rng, H) * 0.3, _rand(rng, H) * 0.3
    wo, bo = _rand(rng, O, H), _rand(rng, O) * 0.1
    s0 = np.full((1, H), h0, np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T * F])
    steps = [b.tensor(f'x{t}', [1, F]) for t in range(T)]
    b.op('SPLIT', [b.tensor('axis', [], data=np.array(1, np.int32)), x], steps, num_splits=T)
    wt, ut = b.tensor('W', [H, F], data=w), b.tensor('U', [H, H], data=u)
    bxt, bht = b.tensor('b_x', [H], data=bx), b.tensor('b_hh', [H], data=bh)
    h = b.tensor('zeros', [1, H], data=s0)
    for t in range(T):
        a, r, s = (b.tensor(f'{n}{t}', [1, H]) for n in ('a', 'r', 's'))
        b.op('FULLY_CONNECTED', [steps[t], wt, bxt], [a])
        b.op('FULLY_CONNECTED', [h, ut, bht], [r])
        b.op('ADD', [a, r], [s])
        h = b.tensor(f'h{t}', [1, H])
        b.op('TANH', [s], [h])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [h, b.tensor('wo', [O, H], data=wo), b.tensor('bo', [O], data=bo)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        xs = np.asarray(xs, np.float64).reshape(len(xs), T, F)
        hs = np.broadcast_to(s0.astype(np.float64), (len(xs), H))
        for t in range(T):
            hs = np.tanh(xs[:, t] @ w.T + bx + hs @ u.T + bh)
        return hs @ wo.T + bo
    return str(path), forward


def build_sliced(path, seed=0, T=5, F=4, H=6, O=2, circle=False):
    """SLICE by constant begin and size (tico's padded nn.ConvTranspose2d crops its VALID
    TRANSPOSE_CONV with one; torch's narrow, x[:, a:b]): x [1, F] -> FC(T H, relu) ->
    RESHAPE [1, T, H] -> SLICE begin [0, 1, 2] size [1, 3, -1] (rows 1-3, columns 2..H-1)
    -> RESHAPE [1, 3 (H - 2)] -> FC(O).  circle: a CIR0 file, as tico writes.  Returns
    (path, numpy forward(xs, w1=, w2=))."""
    rng = np.random.default_rng(seed)
    w1, b1 = _rand(rng, T * H, F), _rand(rng, T * H)
    w2, b2 = _rand(rng, O, 3 * (H - 2)), _rand(rng, O)
    b = CircleBuilder(identifier=b'CIR0' if circle else b'TFL3')
    x, h, m, s, f, y = (b.tensor(n, k) for n, k in (
        ('x', [1, F]), ('h', [1, T * H]), ('m', [1, T, H]), ('s', [1, 3, H - 2]),
        ('f', [1, 3 * (H - 2)]), ('y', [1, O])))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [T * H], data=b1)],
         [h], fused_activation_function='RELU')
    b.op('RESHAPE', [h], [m], new_shape=[1, T, H])
    b.op('SLICE', [m, b.tensor('begin', [3], data=np.array([0, 1, 2], np.int32)),
                   b.tensor('size', [3], data=np.array([1, 3, -1], np.int32))], [s])
    b.op('RESHAPE', [s], [f], new_shape=[1, 3 * (H - 2)])
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [O], data=b2)],
         [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xs, w1=w1, w2=w2):
        hs = np.maximum(xs @ w1.T + b1, 0).reshape(len(xs), T, H)[:, 1:4, 2:]
        return hs.reshape(len(xs), -1) @ w2.T + b2
    return os.fspath(path), forward


def build_sliced_heads(path, seed=0, F=5, T=4, H=3, O=2):
    """STRIDED_SLICEs that cut one activation into consecutive pieces (tico's attention
    takes q, k and v out of one projection so; prepare makes them one SPLIT_V): x [1, F]
    -> FC(T 3H) -> RESHAPE [1, T, 3H] -> q, k, v = the three H-wide slices of the last
    axis -> q * k + v -> RESHAPE [1, T H] -> FC(O).  Returns (path, numpy forward(xs,
    w1=, w2=))."""
    rng = np.random.default_rng(seed)
    w1, b1 = 0.3 * _rand(rng, 3 * T * H, F), 0.3 * _rand(rng, 3 * T * H)
    w2, b2 = 0.3 * _rand(rng, O, T * H), _rand(rng, O)
    b = CircleBuilder(identifier=b'TFL3')
    x, p, r = b.tensor('x', [1, F]), b.tensor('p', [1, 3 * T * H]), b.tensor('r', [1, T, 3 * H])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [3 * T * H], data=b1)], [p])
    b.op('RESHAPE', [p], [r], new_shape=[1, T, 3 * H])
    qkv = []
    for j, n in enumerate('qkv'):
        t = b.tensor(n, [1, T, H])
        b.op('STRIDED_SLICE', [r, b.tensor(f'{n}_b', [3], data=np.array([0, 0, j * H], np.int32)),
                               b.tensor(f'{n}_e', [3], data=np.array([1, T, (j + 1) * H], np.int32)),
                               b.tensor(f'{n}_s', [3], data=np.ones(3, np.int32))], [t])
        qkv.append(t)
    m, a, f, y = (b.tensor(n, s) for n, s in (('m', [1, T, H]), ('a', [1, T, H]), ('f', [1, T * H]),
                                                ('y', [1, O])))
    b.op('MUL', qkv[:2], [m], fused_activation_function='NONE')
    b.op('ADD', [m, qkv[2]], [a], fused_activation_function='NONE')
    b.op('RESHAPE', [a], [f], new_shape=[1, T * H])
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [O], data=b2)], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xs, w1=w1, w2=w2, b1=b1, b2=b2):
        r = (xs @ w1.T + b1).reshape(len(xs), T, 3 * H)
        q, k, v = r[..., :H], r[..., H:2 * H], r[..., 2 * H:]
        return (q * k + v).reshape(len(xs), -1) @ w2.T + b2
    return os.fspath(path), forward


def build_int8_narrow(path, kind='mlp', seed=0, cal=1 / 16, F=6, H=12, L=8, shift=0.0):
    """An int8 model whose activation ranges a converter calibrated on data `cal` times
    the size of the data it is then trained on (the file's scales from another
    distribution: utrain issue 28, a Keras int8 file whose layers clip on every user's
    sample), built here: every activation's range the min / max (with 0) of a float
    forward over 256 calibration samples N(0, cal^2) per input value, the inputs' at +-4
    (the training samples N(0, 1) fit), per-channel int8 weights, int32 biases.  kind:
    'mlp' x [F] -> FC RELU [H] -> FC RELU [H] -> FC [1] -> MUL by a constant 2 (a Keras
    Rescaling of the output); 'cnn' x [1, L, 2] -> CONV_2D 1x3 RELU [H] -> CONV_2D 1x3
    [H] -> ADD of the two (a residual) RELU -> MEAN -> FC [1]; 'two' a [F], b [3] -> FC
    RELU [H] each -> CONCATENATION (one scale) -> FC [1] -> LOGISTIC -> MUL by a constant
    4 (the held-out Keras Microplastic model's head; shift added to the last Dense's
    bias: its calibrated range on one side of 0, as the Microplastic model's [0, 4.4]).
    Returns (path, float forward of the model: f(dict of input arrays [n, ...]) -> each
    activation's values by tensor name ('y' the output, [n, 1]), the inputs' shapes)."""
    rng = np.random.default_rng(seed)
    q = lambda s, z: {'scale': [float(s)], 'zero_point': [int(z)]}     # noqa: E731
    if kind == 'mlp':
        ins = {'x': [F]}
        Ws = {'w1': (H, F), 'w2': (H, H), 'w3': (1, H)}
    elif kind == 'cnn':
        ins = {'x': [1, L, 2]}
        Ws = {'w1': (H, 1, 3, 2), 'w2': (H, 1, 3, H), 'w3': (1, H)}
    else:
        ins = {'a': [F], 'b': [3]}
        Ws = {'wa': (H, F), 'wb': (H, 3), 'w2': (1, 2 * H)}
    W = {k: (rng.standard_normal(s) * 1.5 / np.sqrt(np.prod(s[1:]))).astype(np.float32)
         for k, s in Ws.items()}
    B = {k: (0.1 * rng.standard_normal(s[0])).astype(np.float32) for k, s in Ws.items()}
    if kind == 'two':
        B['w2'] += np.float32(shift)

    def conv(x, w):             # (1x3 SAME over [n, L, C])
        xp = np.pad(x, ((0, 0), (1, 1), (0, 0)))
        win = np.stack([xp[:, i:i + L] for i in range(3)], 2)
        return np.einsum('nlkc,okc->nlo', win, w[:, 0])

    def acts(xs):
        r = lambda v: np.maximum(v, 0)      # noqa: E731
        if kind == 'mlp':
            h1 = r(xs['x'] @ W['w1'].T + B['w1'])
            h2 = r(h1 @ W['w2'].T + B['w2'])
            z = h2 @ W['w3'].T + B['w3']
            return {'h1': h1, 'h2': h2, 'z': z, 'y': 2 * z}
        if kind == 'cnn':
            c1 = r(conv(xs['x'].reshape(-1, L, 2), W['w1']) + B['w1'])
            c2 = conv(c1, W['w2']) + B['w2']
            a = r(c1 + c2)
            m = a.mean(1)
            return {'c1': c1, 'c2': c2, 'a': a, 'm': m, 'y': m @ W['w3'].T + B['w3']}
        ha = r(xs['a'] @ W['wa'].T + B['wa'])
        hb = r(xs['b'] @ W['wb'].T + B['wb'])
        h = np.concatenate([ha, hb], 1)
        z = h @ W['w2'].T + B['w2']
        return {'ha': ha, 'hb': hb, 'h': h, 'z': z, 'y': 4 / (1 + np.exp(-z))}

    xc = {k: (rng.standard_normal((256, *s)) * cal).astype(np.float32) for k, s in ins.items()}
    ranges = {}
    for k, v in acts(xc).items():
        lo, hi = min(0.0, float(v.min())), max(0.0, float(v.max()))
        s_ = max(hi - lo, 1e-3) / 255
        ranges[k] = (s_, int(np.clip(round(-128 - lo / s_), -128, 127)))
    if kind == 'two':
        ranges['ha'] = ranges['hb'] = ranges['h']       # (the converter's: one scale)
        ranges['s'] = (1 / 256, -128)
    sx = 8 / 255
    b = CircleBuilder(identifier=b'TFL3')
    T = {k: b.tensor(k, [1, *s], dtype='int8', quant=q(sx, 0)) for k, s in ins.items()}

    def act(name, shape):
        T[name] = b.tensor(name, shape, dtype='int8', quant=q(*ranges[name]))
        return T[name]

    def weighted(opname, x, wk, y, **opts):
        w, sxi = W[wk], ranges[x_names[x]][0] if x in x_names else sx
        sw = np.maximum(np.abs(w).reshape(len(w), -1).max(1), 1e-6) / 127
        wq = np.round(w / sw.reshape(-1, *[1] * (w.ndim - 1))).astype(np.int8)
        bq = np.round(B[wk] / (sxi * sw)).astype(np.int32)
        n = len(w)
        wt = b.tensor(wk, list(w.shape), data=wq, quant={
            'scale': [float(v) for v in sw], 'zero_point': [0] * n, 'quantized_dimension': 0})
        bt = b.tensor(wk + '_b', [n], data=bq, quant={
            'scale': [float(sxi * v) for v in sw], 'zero_point': [0] * n})
        b.op(opname, [x, wt, bt], [y], **opts)

    x_names = {}

    def named(name, shape):
        t = act(name, shape)
        x_names[t] = name
        return t

    cv = dict(padding='SAME', stride_w=1, stride_h=1)
    if kind == 'mlp':
        weighted('FULLY_CONNECTED', T['x'], 'w1', named('h1', [1, H]), fused_activation_function='RELU')
        weighted('FULLY_CONNECTED', T['h1'], 'w2', named('h2', [1, H]), fused_activation_function='RELU')
        weighted('FULLY_CONNECTED', T['h2'], 'w3', named('z', [1, 1]))
        two = b.tensor('two', [1], data=np.array([127], np.int8), quant=q(2 / 127, 0))
        b.op('MUL', [T['z'], two], [act('y', [1, 1])], fused_activation_function='NONE')
    elif kind == 'cnn':
        weighted('CONV_2D', T['x'], 'w1', named('c1', [1, 1, L, H]),
                 fused_activation_function='RELU', **cv)
        weighted('CONV_2D', T['c1'], 'w2', named('c2', [1, 1, L, H]),
                 fused_activation_function='NONE', **cv)
        b.op('ADD', [T['c1'], T['c2']], [named('a', [1, 1, L, H])], fused_activation_function='RELU')
        b.op('MEAN', [T['a'], b.tensor('axes', [2], data=np.array([1, 2], np.int32))],
             [named('m', [1, H])], keep_dims=False)
        weighted('FULLY_CONNECTED', T['m'], 'w3', act('y', [1, 1]))
    else:
        weighted('FULLY_CONNECTED', T['a'], 'wa', named('ha', [1, H]), fused_activation_function='RELU')
        weighted('FULLY_CONNECTED', T['b'], 'wb', named('hb', [1, H]), fused_activation_function='RELU')
        b.op('CONCATENATION', [T['ha'], T['hb']], [named('h', [1, 2 * H])], axis=1,
             fused_activation_function='NONE')
        weighted('FULLY_CONNECTED', T['h'], 'w2', named('z', [1, 1]))
        b.op('LOGISTIC', [T['z']], [act('s', [1, 1])])
        four = b.tensor('four', [1, 1], data=np.array([[127]], np.int8), quant=q(4 / 255, -128))
        b.op('MUL', [T['s'], four], [act('y', [1, 1])], fused_activation_function='NONE')
    b.inputs(*[T[k] for k in ins])
    b.outputs(T['y'])
    b.save(os.fspath(path))
    return os.fspath(path), acts, ins


def build_conv1d_stack(path, W=192, C=8, H=16, O=32, classes=4, seed=0, act='RELU'):
    """A 1-D conv net as a Conv1D exporter writes it (one image row): x [1, 1, W, C] ->
    CONV_2D 1x5 SAME (H, act) -> CONV_2D 1x5 SAME (O, act) -> MEAN over the row ->
    FULLY_CONNECTED (classes) -> logits.  Its second conv's weight (O x 5H floats) is
    larger than utrain.stream's CHUNK: with --stream it comes by rows (utrain.convrows)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    x = prev = b.tensor('x', [1, 1, W, C])
    cin = C
    for i, co in enumerate((H, O)):
        y = b.tensor(f'conv{i}', [1, 1, W, co])
        w = rng.normal(0, (2 / (5 * cin)) ** 0.5, (co, 1, 5, cin)).astype(np.float32)
        b.op('CONV_2D', [prev, b.tensor(f'w{i}', [co, 1, 5, cin], data=w),
                         b.tensor(f'b{i}', [co], data=np.zeros(co, np.float32))], [y],
             padding='SAME', stride_w=1, stride_h=1, fused_activation_function=act)
        prev, cin = y, co
    m = b.tensor('mean', [1, O])
    b.op('MEAN', [prev, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m],
         keep_dims=False)
    z = b.tensor('y', [1, classes])
    b.op('FULLY_CONNECTED', [m, b.tensor('wf', [classes, O], data=0.3 * _rand(rng, classes, O)),
                             b.tensor('bf', [classes], data=np.zeros(classes, np.float32))], [z])
    b.inputs(x)
    b.outputs(z)
    return b.save(os.fspath(path))


def build_tf_norm(path, seed=0, F=6, N=8):
    """What TensorFlow writes for Dense -> tf.reshape(h, [batch, -1]) -> tf.clip_by_norm-
    like scaling by the norm (a real GitHub embedding net), built here: the reshape's
    shape worked out at run time (SHAPE -> GATHER -> CONCATENATION with -1 -> EQUAL 0 ->
    WHERE -> GATHER -> SPARSE_TO_DENSE -> ADD -> CAST), its output's file shape the
    converter's guess [1, 1] (signature [-1, -1]); the norm SUM -> SQRT -> REDUCE_MAX of
    its one value to a scalar -> MAXIMUM(eps) -> DIV.  Outputs: the reshaped h (first,
    its size known at run time only) and the scaled one.  Returns (path, numpy forward
    of the scaled output)."""
    rng = np.random.default_rng(seed)
    w, bias = _rand(rng, N, F), _rand(rng, N)
    b = CircleBuilder(identifier=b'TFL3')
    x = _act(b, 'x', [1, F])
    h = _act(b, 'h', [1, N])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', w.shape, data=w), b.tensor('b', [N], data=bias)], [h])
    i64 = lambda name, shape, v=None: b.tensor(name, shape, dtype=np.int64) if v is None else \
        b.tensor(name, shape, data=np.array(v, np.int64))          # noqa: E731
    shp = i64('shape', [2])
    b.op('SHAPE', [h], [shp], out_type='INT64')
    n = i64('n', [])
    b.op('GATHER', [shp, i64('i0', [], 0)], [n], axis=0)
    n1 = i64('n1', [1])
    b.op('RESHAPE', [n, b.tensor('one', [1], data=np.array([1], np.int32))], [n1])
    cat = i64('cat', [2])
    b.op('CONCATENATION', [n1, i64('m1', [1], [-1])], [cat], axis=0)
    eq = b.tensor('eq', [2], dtype=np.bool_)
    b.op('EQUAL', [cat, i64('zero', [], 0)], [eq])
    wh = b.tensor('where', [1, 1], dtype=np.int64, signature=[-1, 1])
    b.op('WHERE', [eq], [wh])
    wr = b.tensor('where1', [1], dtype=np.int64, signature=[-1])
    b.op('RESHAPE', [wh, b.tensor('m1s', [1], data=np.array([-1], np.int32))], [wr])
    gv = b.tensor('gv', [1], dtype=np.int64, signature=[-1])
    b.op('GATHER', [shp, wr], [gv], axis=0)
    sd = i64('sd', [2])
    b.op('SPARSE_TO_DENSE', [wh, i64('two', [1], [2]), gv, i64('z0', [], 0)], [sd])
    nw = i64('new64', [2])
    b.op('ADD', [cat, sd], [nw])
    nw32 = b.tensor('new', [2], dtype=np.int32)
    b.op('CAST', [nw], [nw32])
    r = b.tensor('r', [1, 1], signature=[-1, -1])       # (wrong: the converter's guess)
    b.op('RESHAPE', [h, nw32], [r])
    sq = _act(b, 'sq', [1, N])
    b.op('MUL', [r, r], [sq])
    s = _act(b, 's', [1, 1])
    b.op('SUM', [sq, b.tensor('ax1', [1], data=np.array([1], np.int32))], [s], keep_dims=True)
    q = _act(b, 'q', [1, 1])
    b.op('SQRT', [s], [q])
    m = b.tensor('m', [])
    b.op('REDUCE_MAX', [q, b.tensor('ax01', [2], data=np.array([0, 1], np.int32))], [m],
         keep_dims=False)
    mx = b.tensor('mx', [])
    b.op('MAXIMUM', [m, b.tensor('eps', [], data=np.array(1e-3, np.float32))], [mx])
    y = _act(b, 'y', [1, N])
    b.op('DIV', [r, mx], [y])
    b.inputs(x)
    b.outputs(r, y)
    b.save(path)

    def forward(xv):
        hv = xv.reshape(len(xv), -1) @ w.T.astype(np.float64) + bias
        return hv / np.maximum(np.sqrt((hv * hv).sum(1, keepdims=True)), 1e-3)
    return os.fspath(path), forward
