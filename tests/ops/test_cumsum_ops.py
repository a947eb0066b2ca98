"""CUMSUM (tf.math.cumsum in a Keras Lambda: TFLite's CUMSUM; torch.cumsum: ONNX CumSum), a
running total over time, had been refused ('op 0 is CUMSUM, which utrain cannot run';
'cannot read ONNX op CumSum'): spellings.cumsums_to_fc makes it a FULLY_CONNECTED by a
frozen 0 / 1 triangle over the axis (TRANSPOSEs around it for another axis), exclusive
and reverse its other triangles.  Forward and gradients against float64 numpy; the
triangle is no parameter (float, and the int8 path from float)."""
import os

import numpy as np
import pytest

import test_parity as tp  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

T, C, O = 5, 3, 2


def _tri(n, exclusive, reverse):
    """M with cumsum(v) = M @ v along the summed axis."""
    j, i = np.indices((n, n))
    return ((i > j if exclusive else i >= j) if reverse else
            (i < j if exclusive else i <= j)).astype(np.float64)


def _model(path, axis, exclusive, reverse, seed=0):
    """x [1, T, C] -> FC W1 [C, C] (keep_num_dims) -> CUMSUM(axis) -> RESHAPE [1, T*C] ->
    FC W2 [O, T*C] -> y."""
    rng = np.random.default_rng(seed)
    W1 = rng.normal(size=(C, C)).astype(np.float32)
    W2 = rng.normal(size=(O, T * C)).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C])
    h = b.tensor('h', [1, T, C])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [C, C], data=W1), -1], [h],
         fused_activation_function='NONE', keep_num_dims=True)
    s = b.tensor('cumsum', [1, T, C])
    b.op('CUMSUM', [h, b.tensor('axis', [], data=np.array(axis, np.int32))], [s],
         exclusive=exclusive, reverse=reverse)
    f = b.tensor('flat', [1, T * C])
    b.op('RESHAPE', [s, b.tensor('shape', [2], data=np.array([1, T * C], np.int32))], [f])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', [O, T * C], data=W2), -1], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path), W1.astype(np.float64), W2.astype(np.float64)


@pytest.mark.parametrize('axis,exclusive,reverse', [(1, False, False), (-1, False, False),
                                                    (1, True, False), (1, False, True),
                                                    (2, True, True)])
def test_cumsum_forward_and_gradients(tmp_path, axis, exclusive, reverse):
    from utrain.sink import Sums
    src, W1, W2 = _model(tmp_path / 'c.tflite', axis, exclusive, reverse)
    x = np.random.default_rng(1).normal(size=(4, T, C)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((4, O), np.float32))
    out = tmp_path / 'run'
    s = prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.1,
                log=lambda *a, **k: None)
    assert sorted(s['trainable'].values()) == sorted([[C, C], [O, T * C]])    # the triangle: frozen
    tr = tp.new_trainer(out / 'model.flat', out / 'weights.wof')
    on_t = axis % 3 == 1
    M = _tri(T if on_t else C, exclusive, reverse)

    def sums(h):                    # h [T, C]
        return M @ h if on_t else h @ M.T
    cs = [sums(xi.astype(np.float64) @ W1.T) for xi in x]
    want = np.stack([W2 @ c.reshape(-1) for c in cs])
    np.testing.assert_allclose(tp.utrain_predict(tr, x, [1, T, C]), want, rtol=1e-5, atol=1e-5)
    # the gradient through the sums reaches the layer before them
    tr.net.sink = Sums(tr.net)
    tr.set_input(x[:1])
    tr.net.forward(True)
    dy = np.array([[0.5, -1.5]])
    tr.net.backward(dy.astype(np.float32))
    dcs = (W2.T @ dy[0]).reshape(T, C)
    dh = M.T @ dcs if on_t else dcs @ M
    g = read_model(os.fspath(out / 'rewritten.circle'))
    k = next(k for k in tr.net.trainable if g.tensors[k].shape == [C, C])
    np.testing.assert_allclose(np.asarray(tr.net.sink.acc[k]).reshape(C, C),
                               dh.T @ x[0].astype(np.float64), rtol=1e-5, atol=1e-6)


def test_cumsum_int8_from_float_keeps_the_triangle_frozen(tmp_path):
    """The int8 path from the float model reads the rewritten graph back from its file,
    which does not carry Tensor.frozen: the triangle had trained as a weight there."""
    src, _, _ = _model(tmp_path / 'c.tflite', 1, False, False)
    x = np.random.default_rng(1).normal(size=(16, T, C)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((16, O), np.float32))
    s = prepare(src, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),
                loss='mse', lr=0.1, int8=True, log=lambda *a, **k: None)
    assert s.get('int8'), s
    # (each FC a zero int32 bias that trains, as the int8 path gives a bias-less FC)
    assert s['trainable_params'] == C * C + C + O * T * C + O, s['trainable_params']


def test_onnx_cumsum_runs(tmp_path):
    """torch.cumsum as ONNX CumSum (axis a constant input, exclusive / reverse attributes)."""
    onnx = pytest.importorskip('onnx')
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    W0 = rng.normal(size=(C, C)).astype(np.float32)
    W = rng.normal(size=(C, O)).astype(np.float32)
    nodes = [helper.make_node('MatMul', ['x', 'w0'], ['h']),
             helper.make_node('CumSum', ['h', 'ax'], ['c'], reverse=1),
             helper.make_node('MatMul', ['c', 'w'], ['y'])]
    m = helper.make_model(helper.make_graph(
        nodes, 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, T, C])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, T, O])],
        [helper.make_tensor('ax', TensorProto.INT64, [], [1]),
         helper.make_tensor('w0', TensorProto.FLOAT, [C, C], W0.ravel()),
         helper.make_tensor('w', TensorProto.FLOAT, [C, O], W.ravel())]),
        opset_imports=[helper.make_opsetid('', 13)])
    p = os.fspath(tmp_path / 'c.onnx')
    onnx.save(m, p)
    x = np.random.default_rng(1).normal(size=(4, T, C)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((4, T, O), np.float32))
    out = tmp_path / 'run'
    prepare(p, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.1,
            log=lambda *a, **k: None)
    tr = tp.new_trainer(out / 'model.flat', out / 'weights.wof')
    want = np.stack([_tri(T, False, True) @ xi @ W0 for xi in x.astype(np.float64)]) @ W
    np.testing.assert_allclose(tp.utrain_predict(tr, x, [1, T, C]), want.reshape(4, -1),
                               rtol=1e-5, atol=1e-5)
