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


CASES = {
    'NOT_EQUAL': _masked('NOT_EQUAL', [1, 2, 3]),
    'EQUAL': _masked('EQUAL', [1, 4, 2]),
    'REDUCE_MIN-time': _reduce_min([1, 5, 3], [1], False),       # Keras's min over time
    'REDUCE_MIN-hw-keep': _reduce_min([1, 3, 2, 2], [1, 2], True),
    'REDUCE_MIN-last': _reduce_min([1, 2, 4], [2], False),
}


def build(cid, where, seed):
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    m = oh.Model(np.random.default_rng(seed))
    y = m.finish(CASES[cid](m), path)
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
    oh.check_case(device, cid, 1e-10, tflm_infer, 'TFLite Micro')


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
    x = b.tensor('x', [1, F])
    cc = b.tensor('c', [], data=np.array(c, F32))
    m = b.tensor('m', [1, F], dtype='bool')
    b.op('NOT_EQUAL', [x, cc], [m])
    mf = b.tensor('mf', [1, F])
    b.op('CAST', [m], [mf])
    xm = b.tensor('xm', [1, F])
    b.op('MUL', [x, mf], [xm], fused_activation_function='NONE')
    h = b.tensor('h', [1, F])
    b.op('FULLY_CONNECTED', [xm, b.tensor('w1', [F, F], data=W1), -1], [h],
         fused_activation_function='NONE')
    hm = b.tensor('hm', [1, F], dtype='bool')
    b.op('NOT_EQUAL', [h, b.tensor('c2', [], data=np.array(c, F32))], [hm])
    hf = b.tensor('hf', [1, F])
    b.op('CAST', [hm], [hf])
    hh = b.tensor('hh', [1, F])
    b.op('MUL', [h, hf], [hh], fused_activation_function='NONE')
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


def test_a_sparse_tensor_is_refused_saying_so(tmp_path):
    """A TFLite sparse tensor (EXPERIMENTAL_SPARSITY: its buffer the nonzero values, a
    DENSIFY op reading it) had been read as a dense one: 'constant data has 24 bytes, but
    shape [4, 3] of float32 needs 48'.  It is refused naming the tensor and the
    conversion option to leave out."""
    from circle_schema.v0_10 import circle as C
    from host_tools.formats.circle_build import pack_model
    from host_tools.formats.circle_io import read_model
    from host_tools.formats.ir import ModelError
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 3])
    w = b.tensor('w', [6], data=np.arange(6, dtype=F32))    # 6 of the 12 values
    d = b.tensor('dense', [4, 3])
    b.op('DENSIFY', [w], [d])
    y = b.tensor('y', [1, 4])
    b.op('FULLY_CONNECTED', [x, d, -1], [y])
    b.inputs(x)
    b.outputs(y)
    m = b.model()
    sp = C.SparsityParameters.SparsityParametersT()
    sp.traversalOrder = [0, 1]
    m.subgraphs[0].tensors[w].sparsity = sp
    m.subgraphs[0].tensors[w].shape = [4, 3]
    path = tmp_path / 's.tflite'
    path.write_bytes(pack_model(m, b'TFL3'))
    with pytest.raises(ModelError) as e:
        read_model(os.fspath(path))
    assert "tensor 1 ('w') is a sparse tensor" in str(e.value) and \
        'EXPERIMENTAL_SPARSITY' in str(e.value), str(e.value)


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
