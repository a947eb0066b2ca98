"""EQUAL and NOT_EQUAL (op_elem: a 1.0 / 0.0 mask, no gradient, as LESS / GREATER) and
REDUCE_MIN (spellings.reduce_min_to_max: -max(-x), its gradient to the minimum), which
had been refused (issue 28), or NOT_EQUAL spelled min(|x - c|, 1) in RELUs where it
compared with an integer: no mask of a float x, and a gradient through it.  Forward
against a float64 numpy reference and TFLite Micro, gradients against float64 central
finite differences of the device code, and the same under unix MicroPython, with
tests/support/op_harness.py's models (x[1, 3] -> FC -> RESHAPE -> OP ... -> FC -> y);
then Keras-style masks (a CAST to float) through prepare's rewrites, and the ONNX
spellings (Equal, Not, Where, ReduceMin, Greater) against ONNX Runtime and PyTorch
autograd."""
import os

import numpy as np
import pytest

import op_harness as oh  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from test_split_math_ops import tflm_infer  # noqa: E402

F32 = np.float32


def _masked(name, shape):
    """SELECT_V2(CMP(RELU(h), 0), h, h / 4) (NOT_EQUAL) or its sides swapped (EQUAL): a
    leaky ReLU made with a mask of exact zeros, the mask's comparison passing no
    gradient, each side the gradient where it was taken."""
    def build(m):
        h = m.act_input(shape)
        v = m.val[h]
        r = m.op('RELU', [h], np.maximum(v, 0.0))
        mask = m.b.tensor(m._name('m'), list(shape), dtype='bool')
        m.b.op(name, [r, m.tensor([], F32(0.0))], [mask])
        low = m.op("MUL", [h, m.tensor([], F32(0.25))], 0.25 * v)
        sides = [h, low] if name == 'NOT_EQUAL' else [low, h]
        return m.op('SELECT_V2', [mask] + sides, np.where(v > 0, v, 0.25 * v), kinks=(0.0,),
                    pre=v)
    return build


def _reduce_min(shape, axes, keep):
    def build(m):
        h = m.act_input(shape)
        v = np.min(m.val[h], axis=tuple(axes), keepdims=keep)
        ax = m.tensor([len(axes)], oh.ints(axes))
        return m.op('REDUCE_MIN', [h, ax], v, keep_dims=keep)
    return build


def _step(name, shape, join):
    """join(STEP(h), h) (ADD, MUL): ROUND (torch.round through tico, half to even),
    FLOOR or SIGN, which had been refused (issue 28); no gradient through the step (torch's),
    h's FC trained through join's other operand.  h kept off the steps' jumps."""
    def build(m):
        h = m.act_input(shape)
        v = m.val[h]
        f = {'ROUND': np.round, 'FLOOR': np.floor, 'SIGN': np.sign}[name]
        jump = {'ROUND': v - np.floor(v) - 0.5, 'FLOOR': v - np.round(v), 'SIGN': v}[name]
        r = m.op(name, [h], f(v), kinks=(0.0,), pre=jump)
        return m.op(join, [r, h], f(v) + v if join == 'ADD' else f(v) * v,
                    fused_activation_function='NONE')
    return build


CASES = {
    'ROUND': _step('ROUND', [1, 3, 4], 'ADD'),
    'FLOOR': _step('FLOOR', [1, 6], 'MUL'),
    'SIGN': _step('SIGN', [1, 5], 'MUL'),
    'NOT_EQUAL': _masked('NOT_EQUAL', [1, 2, 3]),
    'EQUAL': _masked('EQUAL', [1, 4, 2]),
    'REDUCE_MIN-time': _reduce_min([1, 5, 3], [1], False),       # Keras's min over time
    'REDUCE_MIN-hw-keep': _reduce_min([1, 3, 2, 2], [1, 2], True),
    'REDUCE_MIN-last': _reduce_min([1, 2, 4], [2], False),
}


def build(cid, where, seed):
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    for s in range(seed, seed + 50):    # (a draw whose steps' inputs keep off their jumps)
        m = oh.Model(np.random.default_rng(s))
        y = m.finish(CASES[cid](m), path)
        if m.ok:
            break
    rewrite = cid.startswith('REDUCE_MIN')
    job, host = oh.prepared(m, y, where, rewrite=rewrite)
    if rewrite:     # (the parameters as the rewritten graph the device runs numbers them)
        from host_tools.formats.circle_io import read_model
        at = {t.name: t.index for t in read_model(os.path.join(where, 'rewritten.circle')).tensors}
        names = {t.index: t.name for t in read_model(path).tensors}
        host['params'] = {at[names[k]]: v for k, v in host['params'].items()}
    return job, host


@pytest.fixture(scope='module')
def device(tmp_path_factory):
    return oh.run_device(tmp_path_factory.mktemp('mask_min_ops'), CASES, build, 9300)


@pytest.mark.parametrize('cid', list(CASES))
def test_forward_and_gradients(device, cid):
    # (TFLite Micro has no SIGN kernel: the float64 reference only; ONNX Runtime runs
    # Sign in test_onnx_masks_qdq)
    oh.check_case(device, cid, 1e-10, None if cid == 'SIGN' else tflm_infer, 'TFLite Micro')


def test_ops_micropython_match_float64(device, tmp_path):
    oh.check_micropython(device, CASES, tmp_path)


# ------------------------------------------------------------------ a Keras-style mask
def _cast_mask(path, c=1.0, F=6, O=3, seed=0):
    """x -> FC -> h; CAST(NOT_EQUAL(h, c)) * h -> FC (tf.cast(h != c, tf.float32) * h);
    the first FC's output rounded in the data so some h equal c exactly would be too rare:
    c is compared with x itself too (CAST(NOT_EQUAL(x, c)) * x, x between integers)."""
    rng = np.random.default_rng(seed)
    W1 = rng.normal(size=(F, F)).astype(F32)
    W2 = rng.normal(size=(O, F)).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')

    def masked(v, name, cname):     # CAST(NOT_EQUAL(v, c)) * v
        m = b.tensor(name + 'm', [1, F], dtype='bool')
        b.op('NOT_EQUAL', [v, b.tensor(cname, [], data=np.array(c, F32))], [m])
        mf = b.tensor(name + 'f', [1, F])
        b.op('CAST', [m], [mf])
        out = b.tensor(name + 'x', [1, F])
        b.op('MUL', [v, mf], [out], fused_activation_function='NONE')
        return out
    x = b.tensor('x', [1, F])
    xm = masked(x, 'x', 'c')
    h = b.tensor('h', [1, F])
    b.op('FULLY_CONNECTED', [xm, b.tensor('w1', [F, F], data=W1), -1], [h],
         fused_activation_function='NONE')
    hh = masked(h, 'h', 'c2')
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [hh, b.tensor('w2', [O, F], data=W2), -1], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path)


def test_a_cast_mask_of_floats_is_the_comparison(tmp_path):
    """tf.cast(x != c, tf.float32) * x of float x (some equal to c): utrain's forward is
    TFLite Micro's, and the mask passes no gradient (one step of the first layer's weight
    is x's masked values times the gradient at h, as the mask is a constant).  Main spelled
    it min(|x - c|, 1): 0.5 for x = 1.5."""
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import prepare
    src = _cast_mask(tmp_path / 'm.tflite')
    x = np.random.default_rng(1).normal(size=(8, 6)).astype(F32)
    x[:, 0] = 1.0
    x[:, 1] = 1.5
    x[:, 2] = 0.75
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((8, 3), F32))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.1,
            log=lambda *a, **k: None)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'weights.wof'), x, [1, 6])
    ref = np.concatenate([tflm_run(src, xi[None]) for xi in x])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def tflm_run(path, x):
    from test_rewrite import tflm_infer as run
    return np.asarray(run(path, x), np.float64).reshape(len(x), -1)


def _sparse_w(W, how):
    """W [R, C] in TFLite's sparse format, as EXPERIMENTAL_SPARSITY writes it: (values,
    traversal_order, block_map, dim_metadata) for circle_build's sparse().  csr: rows
    dense, each row's nonzero columns; cols: the same walked column first (traversal
    order [1, 0]); blocks: 1x4 blocks of columns, each row's nonzero blocks whole (the
    layout TFLite's FULLY_CONNECTED reads without a DENSIFY)."""
    R, C = W.shape
    if how == 'blocks':
        nz = [[j for j in range(C // 4) if np.any(W[i, 4 * j:4 * j + 4])] for i in range(R)]
        seg = np.cumsum([0] + [len(r) for r in nz])
        vals = [W[i, 4 * j:4 * j + 4] for i in range(R) for j in nz[i]]
        return (np.concatenate(vals), [0, 1, 2], [1],
                [('DENSE', R, None, None), ('SPARSE_CSR', 0, seg, sum(nz, [])),
                 ('DENSE', 4, None, None)])
    M = W if how == 'csr' else W.T
    nz = [list(np.flatnonzero(row)) for row in M]
    seg = np.cumsum([0] + [len(r) for r in nz])
    return (M[M != 0], [0, 1] if how == 'csr' else [1, 0], [],
            [('DENSE', len(M), None, None), ('SPARSE_CSR', 0, seg, sum(nz, []))])


def _sparse_mlp(path, how, F=8, H=6, seed=0):
    """x [1, F] -> FC (RELU) by a sparse W [H, F] (through DENSIFY, but for blocks) -> FC
    [2, H] -> y: (path, forward(x, w, b, fw), W)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(H, F)).astype(F32)
    W[rng.random((H, F)) < 0.6] = 0.0
    if how == 'blocks':
        W.reshape(H, F // 4, 4)[rng.random((H, F // 4)) < 0.4] = 0.0
    W[0, :4] = 0.0
    bias = rng.normal(size=H).astype(F32) * 0.3
    FW = rng.normal(size=(2, H)).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, F])
    w = b.tensor('w', [H, F], data=W)
    b.sparse(w, *_sparse_w(W, how))
    if how != 'blocks':
        d = b.tensor('w_dense', [H, F])
        b.op('DENSIFY', [w], [d])
        w = d
    h = b.tensor('h', [1, H])
    b.op('FULLY_CONNECTED', [x, w, b.tensor('b', [H], data=bias)], [h],
         fused_activation_function='RELU')
    y = b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [h, b.tensor('fw', [2, H], data=FW), -1], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xv, w=W, b=bias, fw=FW):
        return np.maximum(np.asarray(xv, np.float64) @ np.asarray(w, np.float64).T + b, 0) \
            @ np.asarray(fw, np.float64).T
    return os.fspath(path), forward, W


@pytest.mark.parametrize('how', ['csr', 'cols', 'blocks'])
def test_a_sparse_tensor_trains_dense(tmp_path, how):
    """A TFLite sparse tensor (EXPERIMENTAL_SPARSITY: its buffer the nonzero values or
    blocks, a DENSIFY op reading it) had been refused ('convert the model without that
    optimization').  The reader densifies it (TFLite's format converter: traversal
    order, block map, DENSE / SPARSE_CSR levels) and drops the DENSIFY: utrain's forward
    is the dense model's (numpy, and TFLite Micro on the exported file, which runs no
    sparse tensor), one SGD step of each weight is its gradient (finite differences),
    pruned zeros included, and export writes the weight dense (no sparsity, no DENSIFY)."""
    from test_parity import new_trainer, utrain_predict
    from stepcheck import step_is_the_gradient
    from host_tools.formats.circle_io import read_model
    from circle_schema.v0_10 import circle as C
    src, forward, W = _sparse_mlp(tmp_path / 's.tflite', how)
    g = read_model(src)
    assert [op.name for op in g.ops] == ['FULLY_CONNECTED'] * 2
    np.testing.assert_array_equal(g.tensors[1].data, W)
    x = np.random.default_rng(1).normal(size=(6, 8)).astype(F32)
    step = step_is_the_gradient(src, forward, tmp_path, ('w', 'b', 'fw'), x, exported=True)
    assert np.any(step['w'][W == 0] != 0)      # (the pruned zeros train too: dense)
    got = utrain_predict(new_trainer(tmp_path / 'run' / 'model.flat',
                                     tmp_path / 'run' / 'weights.wof'), x, [1, 8])
    np.testing.assert_allclose(got, forward(x), rtol=1e-5, atol=1e-5)
    e = tmp_path / 'e.tflite'       # (written by step_is_the_gradient)
    m = C.Model.ModelT.InitFromPackedBuf(e.read_bytes(), 0)
    assert all(t.sparsity is None for t in m.subgraphs[0].tensors)
    ge = read_model(os.fspath(e))
    assert [op.name for op in ge.ops] == ['FULLY_CONNECTED'] * 2
    w2 = {t.name: t.data for t in ge.tensors if t.data is not None}
    np.testing.assert_allclose(tflm_run(os.fspath(e), x),
                               forward(x, w2['w'], w2['b'], w2['fw']), rtol=1e-5, atol=1e-5)


def test_a_3d_convolution_is_refused_saying_what_to_export(tmp_path):
    """CONV_3D (Keras Conv3D) had been refused with the list of supported ops only: it
    names the layer and what to export instead."""
    from host_tools.graph.passes import PrepareError, plan
    from host_tools.formats.circle_io import read_model
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4, 5, 5, 1])
    w = b.tensor('w', [3, 3, 3, 1, 2], data=np.ones((3, 3, 3, 1, 2), F32))
    y = b.tensor('y', [1, 2, 3, 3, 2])
    b.op('CONV_3D', [x, w], [y])
    b.inputs(x)
    b.outputs(y)
    path = b.save(tmp_path / 'c.tflite')
    with pytest.raises(PrepareError) as e:
        plan(read_model(path))
    assert 'op 0 is CONV_3D (Keras Conv3D)' in str(e.value) and \
        'frames stacked as a Conv2D\'s channels' in str(e.value), str(e.value)


# ------------------------------------------------------------------ CONV_3D
def _conv3d_ref(x, w, b, s, same):
    """float64 numpy Conv3D: x [D, H, W, C], w [kd, kh, kw, C, O], strides s, TFLite's
    SAME (pad total max((out - 1) s + k - n, 0), the smaller half first) or VALID."""
    k = w.shape[:3]
    if same:
        outs = [-(-n // st) for n, st in zip(x.shape[:3], s)]
        tot = [max((o - 1) * st + kk - n, 0) for o, st, kk, n in zip(outs, s, k, x.shape[:3])]
        x = np.pad(x, [(t // 2, t - t // 2) for t in tot] + [(0, 0)])
    outs = [(n - kk) // st + 1 for n, kk, st in zip(x.shape[:3], k, s)]
    y = np.zeros(outs + [w.shape[4]])
    for d in range(outs[0]):
        for i in range(outs[1]):
            for j in range(outs[2]):
                win = x[d * s[0]:d * s[0] + k[0], i * s[1]:i * s[1] + k[1], j * s[2]:j * s[2] + k[2]]
                y[d, i, j] = np.tensordot(win, w, axes=4) + b
    return y


def _conv3d_model(path, shape, k, O, s, same, act, seed=0):
    """x [1, D, H, W, C] -> CONV_3D (act) -> RESHAPE -> FC [2]: (path, forward(x, w, b, fw))."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=tuple(k) + (shape[-1], O)).astype(F32)
    bias = rng.normal(size=O).astype(F32)
    y3 = _conv3d_ref(np.zeros(shape), w, bias, s, same).shape
    n = int(np.prod(y3))
    fw = (rng.normal(size=(2, n)) / np.sqrt(n)).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1] + list(shape))
    c = b.tensor('c', [1] + list(y3))
    b.op('CONV_3D', [x, b.tensor('w', list(w.shape), data=w), b.tensor('b', [O], data=bias)],
         [c], padding='SAME' if same else 'VALID', stride_d=s[0], stride_h=s[1], stride_w=s[2],
         dilation_d_factor=1, dilation_h_factor=1, dilation_w_factor=1,
         fused_activation_function=act)
    r = b.tensor('r', [1, n])
    b.op('RESHAPE', [c], [r], new_shape=[1, n])
    y = b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [r, b.tensor('fw', [2, n], data=fw), -1], [y])
    b.inputs(x)
    b.outputs(y)

    def forward(xv, w=w, bias=bias, fw=fw):
        h = _conv3d_ref(np.asarray(xv, np.float64).reshape(shape), w.astype(np.float64), bias, s, same)
        if act == 'RELU':
            h = np.maximum(h, 0)
        return (h.reshape(1, -1) @ np.asarray(fw, np.float64).T).ravel()
    return b.save(path), forward, w, bias, fw


def conv3d_step(out, shape, forward):
    """One forward (checked against `forward`) and backward of dy = [0.7, -1.3] through
    the prepared folder `out` on a random input of `shape`, the gradients summed in a
    Sums sink.  Returns (trainer, x, num): num(f, v) is d (f(v) . dy) / d v by central
    differences in float64, the reference for each trained tensor's sums."""
    from test_parity import new_trainer
    from utrain.sink import Sums
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    tr.net.sink = Sums(tr.net)
    x = np.random.default_rng(5).normal(size=(1,) + shape).astype(F32)
    tr.set_input(x)
    tr.net.forward(True)
    y = np.array(tr.net.output(), np.float64).ravel()
    np.testing.assert_allclose(y, forward(x), rtol=1e-5, atol=1e-5)
    dy = np.array([[0.7, -1.3]], F32)
    tr.net.backward(dy)

    def num(f, v):          # d (y . dy) / d v, central differences in float64
        v = np.asarray(v, np.float64)
        g = np.zeros_like(v)
        for j in np.ndindex(v.shape):
            e = np.zeros_like(v)
            e[j] = 1e-4
            g[j] = (f(v + e) - f(v - e)) @ dy.ravel() / 2e-4
        return g
    return tr, x, num


@pytest.mark.parametrize('shape, k, s, same, act', [
    ((4, 5, 5, 1), (3, 3, 3), (1, 1, 1), False, 'NONE'),          # Keras Conv3D's default
    ((5, 6, 7, 2), (3, 3, 3), (2, 1, 2), True, 'RELU'),           # SAME, strides, fused ReLU
    ((3, 6, 5, 1), (2, 3, 1), (1, 2, 1), True, 'NONE'),           # a depth tap in the padding
])
def test_conv3d_forward_and_gradients(tmp_path, shape, k, s, same, act):
    """CONV_3D had been refused: it trains as a CONV_2D per output frame and depth tap
    (spellings.conv3d_to_conv2d).  Forward = a float64 numpy Conv3D (TFLite's SAME); the
    gradient of each depth tap's weights (device [O, kh, kw, C] = w[i]'s transpose), the
    bias and the FC against central differences of that numpy forward."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.formats.circle_io import read_model
    src, forward, w, bias, fw = _conv3d_model(tmp_path / 'c.tflite', shape, k, 3, s, same, act)
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), loss='mse', train='all', lr=0.1, log=lambda *a, **kw: None)
    names = {t.index: t.name for t in read_model(os.fspath(out / 'rewritten.circle')).tensors}
    assert 'CONV_3D' not in {o.name for o in read_model(os.fspath(out / 'rewritten.circle')).ops}
    tr, x, num = conv3d_step(out, shape, forward)
    seen = set()
    for t in tr.net.trainable:
        got = np.asarray(tr.net.sink.acc[t], np.float64)
        n = names[t]
        if '/tap' in n:
            i = int(n.rsplit('/tap', 1)[1])
            want = num(lambda v: forward(x, w=np.concatenate([w[:i], v[None], w[i + 1:]])), w[i])
            want = want.transpose(3, 0, 1, 2)
        elif n == 'b':
            want = num(lambda v: forward(x, bias=v), bias)
        else:
            assert n == 'fw', n
            want = num(lambda v: forward(x, fw=v), fw)
        np.testing.assert_allclose(got.ravel(), want.ravel(), rtol=2e-3, atol=2e-4, err_msg=n)
        seen.add(n.split('/tap')[0] + ('/tap' if '/tap' in n else ''))
    assert len(seen) == 3, seen


def test_int8_pad_of_a_frozen_branch_after_the_first_trained_layer(tmp_path):
    """A float model trained as int8 (--board rp2040): conv A of x (the first trained
    layer), then PAD(a slice of x made before conv A) -> convs B and C, the sum of the
    three -> FC.  The PAD's input is below the trained
    layers, so it passes no gradient, but conv B hands it one: its backward indexed the
    inputs that take one ('IndexError: tuple index out of range' in utrain.q8cat).  A
    CONV_3D's frames (SAME) are such PADs."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.target.runner import run
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4, 4, 1])
    q = b.tensor('q', [1, 3, 4, 1])             # (rows 0-2 of x, padded back to 6 x 6)
    b.op('STRIDED_SLICE', [x] + [b.tensor(n, [4], data=np.array(v, np.int32)) for n, v in (
        ('begin', [0, 0, 0, 0]), ('end', [1, 3, 4, 1]), ('strides', [1, 1, 1, 1]))], [q])
    a = b.tensor('a', [1, 4, 4, 2])
    b.op('CONV_2D', [x, b.tensor('w1', [2, 3, 3, 1], data=rng.normal(size=(2, 3, 3, 1)).astype(F32)),
                     b.tensor('b1', [2], data=np.zeros(2, F32))], [a], padding='SAME',
         stride_h=1, stride_w=1, fused_activation_function='RELU')
    p = b.tensor('p', [1, 6, 6, 1])
    b.op('PAD', [q, b.tensor('pads', [4, 2], data=np.array([[0, 0], [1, 2], [1, 1], [0, 0]],
                                                           np.int32))], [p])
    c = b.tensor('c', [1, 4, 4, 2])
    b.op('CONV_2D', [p, b.tensor('w2', [2, 3, 3, 1], data=rng.normal(size=(2, 3, 3, 1)).astype(F32)),
                     b.tensor('b2', [2], data=np.zeros(2, F32))], [c], padding='VALID',
         stride_h=1, stride_w=1, fused_activation_function='NONE')
    c2 = b.tensor('c2', [1, 4, 4, 2])          # (a second reader: the PAD stays a layer)
    b.op('CONV_2D', [p, b.tensor('w3', [2, 3, 3, 1], data=rng.normal(size=(2, 3, 3, 1)).astype(F32)),
                     b.tensor('b3', [2], data=np.zeros(2, F32))], [c2], padding='VALID',
         stride_h=1, stride_w=1, fused_activation_function='NONE')
    s1 = b.tensor('s1', [1, 4, 4, 2])
    b.op('ADD', [a, c], [s1], fused_activation_function='NONE')
    s = b.tensor('s', [1, 4, 4, 2])
    b.op('ADD', [s1, c2], [s], fused_activation_function='NONE')
    r = b.tensor('r', [1, 32])
    b.op('RESHAPE', [s], [r], new_shape=[1, 32])
    y = b.tensor('y', [1, 3])
    b.op('FULLY_CONNECTED', [r, b.tensor('fw', [3, 32], data=rng.normal(size=(3, 32)).astype(F32)
                                         / 6), b.tensor('fb', [3], data=np.zeros(3, F32))], [y])
    b.inputs(x)
    b.outputs(y)
    src = b.save(tmp_path / 'm.tflite')
    np.savez(tmp_path / 'd.npz', x=rng.random((8, 4, 4, 1)).astype(F32), y=np.arange(8) % 3)
    out = os.fspath(tmp_path / 'run')
    prepare(src, out, data=os.fspath(tmp_path / 'd.npz'), board='rp2040', train='all', lr=0.05,
            epochs=1, log=lambda *a, **k: None)
    assert os.path.exists(os.path.join(out, 'q8.json'))        # (int8 from float)
    run(out, python=True)
    assert os.path.exists(os.path.join(out, 'trained.wof'))


@pytest.mark.parametrize('mode', ['SYMMETRIC', 'REFLECT'])
def test_a_mirror_pad_is_tflms_and_its_step_the_gradient(tmp_path, mode):
    """MIRROR_PAD (tf.pad mode SYMMETRIC / REFLECT) had been refused as an op utrain
    cannot run: spelled as slices of the mirrored rows and a concatenation
    (spellings.mirror_pads), utrain's forward is TFLite Micro's and one SGD step of
    each weight its gradient (finite differences of numpy's np.pad)."""
    rng = np.random.default_rng(0)
    T, C, pads = 4, 3, [[0, 0], [2, 1], [0, 0]]
    W = rng.normal(size=(C, C)).astype(F32)
    FW = rng.normal(size=(2, (T + 3) * C)).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C])
    h = b.tensor('h', [1, T, C])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [C, C], data=W), -1], [h],
         fused_activation_function='NONE', keep_num_dims=True)
    p = b.tensor('p', [1, T + 3, C])
    b.op('MIRROR_PAD', [h, b.tensor('pads', [3, 2], data=np.array(pads, np.int32))], [p], mode=mode)

    def forward(xv, w=W, fw=FW):
        hv = np.asarray(xv, np.float64).reshape(-1, T, C) @ np.asarray(w, np.float64).T
        pv = np.pad(hv, pads, mode='symmetric' if mode == 'SYMMETRIC' else 'reflect')
        return pv.reshape(len(hv), -1) @ np.asarray(fw, np.float64).T
    _head_and_checks(b, x, p, FW, forward, rng.normal(size=(4, T, C)).astype(F32), ('w', 'fw'),
                     tmp_path)


def _head_and_checks(b, x, s, FW, forward, xs, names, tmp_path):
    """b's model x -> ... -> s, RESHAPE [1, n] -> FULLY_CONNECTED 'fw' (FW [2, n]) -> y,
    saved: its forward of xs is TFLite Micro's and forward's (numpy), utrain's too, and
    one SGD step of each weight in names its gradient (stepcheck)."""
    from test_parity import new_trainer, utrain_predict
    from stepcheck import step_is_the_gradient
    f = b.tensor('f', [1, FW.shape[1]])
    b.op('RESHAPE', [s], [f], new_shape=[1, FW.shape[1]])
    y = b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [f, b.tensor('fw', list(FW.shape), data=FW), -1], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    src = os.fspath(tmp_path / 'm.tflite')
    b.save(src)
    np.testing.assert_allclose(tflm_run(src, xs), forward(xs), rtol=1e-5, atol=1e-5)
    step_is_the_gradient(src, forward, tmp_path, names, xs)
    got = utrain_predict(new_trainer(tmp_path / 'run' / 'model.flat',
                                     tmp_path / 'run' / 'weights.wof'), xs, list(xs.shape[1:]))
    np.testing.assert_allclose(got, forward(xs), rtol=1e-5, atol=1e-5)


def test_a_depth_to_space_is_tflms_and_its_step_the_gradient(tmp_path):
    """DEPTH_TO_SPACE (tf.nn.depth_to_space: a super-resolution model's pixel shuffle) had
    been refused as an op utrain cannot run: spelled as slices of each row offset's
    channels, RESHAPEs and a concatenation (spellings.depth_to_space), utrain's forward
    is TFLite Micro's and one SGD step of each weight its gradient (finite differences
    of numpy's reshape-transpose pixel shuffle)."""
    rng = np.random.default_rng(0)
    H, W, bs, C = 3, 2, 2, 2
    D = bs * bs * C
    K = rng.normal(size=(D, 1, 1, D)).astype(F32) * 0.5
    FW = rng.normal(size=(2, H * bs * W * bs * C)).astype(F32) * 0.3
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, H, W, D])
    h = b.tensor('h', [1, H, W, D])
    b.op('CONV_2D', [x, b.tensor('k', list(K.shape), data=K), -1], [h], padding='VALID',
         fused_activation_function='NONE')
    s = b.tensor('s', [1, H * bs, W * bs, C])
    b.op('DEPTH_TO_SPACE', [h], [s], block_size=bs)

    def forward(xv, k=K, fw=FW):
        hv = np.asarray(xv, np.float64).reshape(-1, H, W, D) @ \
            np.asarray(k, np.float64).reshape(D, D).T
        sv = hv.reshape(-1, H, W, bs, bs, C).transpose(0, 1, 3, 2, 4, 5)
        return sv.reshape(len(hv), -1) @ np.asarray(fw, np.float64).T
    _head_and_checks(b, x, s, FW, forward, rng.normal(size=(4, H, W, D)).astype(F32),
                     ('k', 'fw'), tmp_path)
