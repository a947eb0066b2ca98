"""Issue 28: a batch fixed in the file (Keras's Input(batch_size=N), a converter given a
batch-N signature) is lifted, not refused: prepare and evaluate run a batch-1 copy
(host_tools.formats.batch), export writes the trained model with the file's batch again;
a batch mixed with the data (a RESHAPE merging it into the features) is refused saying
why.  References: numpy forward passes of the file's weights; the batch-1 int8 file run
by TFLite Micro."""
import json
import os

import numpy as np
import pytest

from host_tools.formats.circle_build import CircleBuilder
from host_tools.formats.circle_io import read_model
from host_tools.formats import batch as fb
from host_tools.graph.passes import PrepareError
from host_tools.prepare import infer
from host_tools.prepare.pipeline import prepare, export

from kerasgraphs import build_int8_unitnorm  # noqa: E402

pytest.importorskip('onert')


def mlp(path, n, inputs=1, shape_const=False, merge=False, seed=0, H=4):
    """x [n, 2, 3] (two inputs: added) -> RESHAPE [n, 6] -> FC(H) RELU -> FC(3) -> SOFTMAX,
    the batch n fixed in every activation; shape_const: the RESHAPE's shape a constant
    (else its new_shape option only); merge: the RESHAPE gives [1, 6n] (the batch merged
    into the features).  Returns (path, numpy forward of one sample [2, 3] each input)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    xs = [b.tensor(f'x{i}', [n, 2, 3]) for i in range(inputs)]
    h = xs[0]
    if inputs == 2:
        h = b.tensor('sum', [n, 2, 3])
        b.op('ADD', xs, [h], fused_activation_function='NONE')
    to = [1, 6 * n] if merge else [n, 6]
    f = b.tensor('flat', to)
    if shape_const:
        b.op('RESHAPE', [h, b.tensor('shape', [2], dtype='int32', data=np.array(to, np.int32))], [f])
    else:
        b.op('RESHAPE', [h], [f], new_shape=to)
    w1 = rng.standard_normal((H, to[1])).astype(np.float32)
    b1 = rng.standard_normal(H).astype(np.float32) * 0.1
    w2 = rng.standard_normal((3, H)).astype(np.float32)
    b2 = np.zeros(3, np.float32)
    a = b.tensor('a', [to[0], H])
    b.op('FULLY_CONNECTED', [f, b.tensor('w1', [H, to[1]], data=w1), b.tensor('b1', [H], data=b1)],
         [a], fused_activation_function='RELU')
    z = b.tensor('z', [to[0], 3])
    b.op('FULLY_CONNECTED', [a, b.tensor('w2', [3, H], data=w2), b.tensor('b2', [3], data=b2)], [z])
    y = b.tensor('y', [to[0], 3])
    b.op('SOFTMAX', [z], [y], beta=1.0)
    b.inputs(*xs)
    b.outputs(y)

    def forward(*x):
        s = sum(np.asarray(v, np.float64) for v in x).reshape(len(x[0]), -1)
        o = np.maximum(s @ w1.T + b1, 0) @ w2.T + b2
        e = np.exp(o - o.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    return b.save(str(path)), forward


def data(tmp_path, inputs, forward, n=40, seed=1):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((n, 2, 3)).astype(np.float32) for _ in range(inputs)]
    y = forward(*xs).argmax(1)
    y[::5] = (y[::5] + 1) % 3          # (not every sample right: the score is measured)
    arrays = {'x': xs[0]} if inputs == 1 else {f'x{i}': v for i, v in enumerate(xs)}
    p = str(tmp_path / 'd.npz')
    np.savez(p, y=y, **arrays)
    return p, xs, y


@pytest.mark.parametrize('n,inputs,shape_const', [(2, 1, True), (8, 1, False), (32, 1, True),
                                                  (4, 2, True)])
def test_a_batch_fixed_in_the_file_trains_and_exports_with_it(tmp_path, n, inputs, shape_const):
    """prepare lifts it (and says so), evaluate scores the file as the numpy forward of its
    weights does, export writes the batch back (every activation, the RESHAPE's shape) with
    the weights it was given."""
    path, forward = mlp(tmp_path / f'b{n}.tflite', n, inputs, shape_const)
    d, xs, y = data(tmp_path, inputs, forward)
    want = float(np.mean(forward(*xs).argmax(1) == y))
    assert infer.evaluate(path, d)['accuracy'] == pytest.approx(want)
    logs = []
    out = str(tmp_path / 'run')
    r = prepare(path, out, d, log=logs.append, epochs=1)
    assert any(f'fixes a batch of {n}' in m and 'batch 1' in m for m in logs), logs
    assert r['fixed_batch']['batch'] == n
    assert read_model(os.path.join(out, f'b{n}.batch1.tflite')).tensors[0].shape[0] == 1
    ex = str(tmp_path / 'out.tflite')
    e = export(path, os.path.join(out, 'weights.wof'), ex)
    assert e['batch'] == n
    g0, g1 = read_model(path), read_model(ex)
    assert [list(t.shape) for t in g1.tensors if t.data is None] == \
        [list(t.shape) for t in g0.tensors if t.data is None]
    for op in g1.ops:
        if op.name == 'RESHAPE':
            got = list(g1.tensors[op.inputs[1]].data) if shape_const else op.options['new_shape']
            assert int(got[0]) == n
    assert infer.evaluate(ex, d)['accuracy'] == pytest.approx(want)


def test_a_fixed_batch_in_an_int8_file(tmp_path):
    """An int8 file of batch 4 (the batch-1 file's tensors given 4 rows): evaluate = TFLite
    Micro on the batch-1 file; prepare trains it as int8 and export writes batch 4."""
    p1, _, _, _ = build_int8_unitnorm(tmp_path / 'u1.tflite')
    p4 = str(tmp_path / 'u4.tflite')
    g = read_model(p1)
    # (the batch-4 file: every activation's first dimension 4)
    from host_tools.formats.circle_io import write_with_weights

    def edit(model):
        for k, t in enumerate(model.subgraphs[0].tensors):
            if g.tensors[k].data is None and len(t.shape) and int(t.shape[0]) == 1 and len(t.shape) > 1:
                t.shape = np.array([4] + [int(v) for v in t.shape[1:]], np.int32)
    write_with_weights(p1, p4, {}, edit=edit)
    assert read_model(p4).tensors[read_model(p4).inputs[0]].shape[0] == 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal((24, 16)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=rng.integers(0, 4, 24))
    d = str(tmp_path / 'd.npz')
    want = infer.evaluate(p1, d)
    got = infer.evaluate(p4, d)
    assert got['accuracy'] == want['accuracy'] and got['runtime'] == want['runtime']
    out = str(tmp_path / 'run')
    prepare(p4, out, d, log=lambda *a: None, epochs=1)
    ex = str(tmp_path / 'out.tflite')
    e = export(p4, os.path.join(out, 'weights.wof'), ex)
    assert e['batch'] == 4 and read_model(ex).tensors[read_model(ex).inputs[0]].shape[0] == 4
    assert infer.evaluate(ex, d)['accuracy'] == want['accuracy']


def test_a_batch_merged_into_the_features_is_refused_saying_why(tmp_path):
    path, forward = mlp(tmp_path / 'm.tflite', 4, merge=True)
    d, _, _ = data(tmp_path, 1, lambda x: np.zeros((len(x), 3)))
    why = r"m.tflite: op 0 \(RESHAPE\) gives tensor .* shape \[1, 24\] from \[4, 2, 3\].*batch of 4.*part of the data.*batch 1"
    with pytest.raises(PrepareError, match=why):
        prepare(path, str(tmp_path / 'run'), d, log=lambda *a: None)
    with pytest.raises(infer.InferError, match=why):
        infer.evaluate(path, d)
    with pytest.raises(fb.BatchError, match='part of the data'):
        fb.check_batch(read_model(path))


def test_an_onnx_model_with_a_fixed_batch(tmp_path):
    """An ONNX file of batch 4 (its Reshape's shape [4, 6] too) is read at batch 1, scored
    by ONNX Runtime 4 samples a run (30 samples: the last run padded) as numpy scores it,
    and export writes the weights into the file, its batch 4 kept."""
    onnx = pytest.importorskip('onnx')
    pytest.importorskip('onnxruntime')
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [4, 2, 3])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [4, 3])
    inits = [numpy_helper.from_array(np.array([4, 6], np.int64), 'shape'),
             numpy_helper.from_array(w, 'w'), numpy_helper.from_array(np.zeros(3, np.float32), 'b')]
    nodes = [helper.make_node('Reshape', ['x', 'shape'], ['f']),
             helper.make_node('MatMul', ['f', 'w'], ['h']),
             helper.make_node('Add', ['h', 'b'], ['z']),
             helper.make_node('Softmax', ['z'], ['y'], axis=-1)]
    m = helper.make_model(helper.make_graph(nodes, 'g', [x], [y], inits),
                          opset_imports=[helper.make_opsetid('', 17)])
    path = str(tmp_path / 'b4.onnx')
    onnx.save(m, path)
    xs = rng.standard_normal((30, 2, 3)).astype(np.float32)
    ys = (xs.reshape(30, -1) @ w).argmax(1)
    ys[::4] = (ys[::4] + 1) % 3
    np.savez(tmp_path / 'd.npz', x=xs, y=ys)
    d = str(tmp_path / 'd.npz')
    want = float(np.mean((xs.reshape(30, -1) @ w).argmax(1) == ys))
    assert infer.evaluate(path, d)['accuracy'] == pytest.approx(want)
    logs = []
    out = str(tmp_path / 'run')
    prepare(path, out, d, log=logs.append, epochs=1)
    assert any('fixes a batch of 4' in m for m in logs), logs
    ex = str(tmp_path / 'out.onnx')
    export(path, os.path.join(out, 'weights.wof'), ex)
    assert onnx.load(ex).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 4
    assert infer.evaluate(ex, d)['accuracy'] == pytest.approx(want)


def test_a_fixed_batch_float_file_trained_as_int8_exports(tmp_path):
    """A float file fixing a batch of 4, trained as int8 (--int8; rp2040's and ESP32's
    default): export takes the folder's batch-1 copy as the model it was prepared from
    (it had refused: 'not the model ... was prepared from') and writes batch 4 again,
    the weights dequantized from the int8 training (the untrained ones as the file's,
    within an int8 step)."""
    path, forward = mlp(tmp_path / 'b4.tflite', 4, 1, True)
    d, xs, y = data(tmp_path, 1, forward)
    out = str(tmp_path / 'run')
    # (lr given: it exports the untrained weights; prepare's lr probe was most of the time)
    r = prepare(path, out, d, log=lambda *m: None, epochs=1, int8=True, lr=0.01)
    assert r['fixed_batch']['batch'] == 4 and r.get('int8')
    ex = str(tmp_path / 'out.tflite')
    e = export(path, os.path.join(out, 'weights.wof'), ex)
    assert e['batch'] == 4
    g0, g1 = read_model(path), read_model(ex)
    assert [list(t.shape) for t in g1.tensors if t.data is None] == \
        [list(t.shape) for t in g0.tensors if t.data is None]
    want = float(np.mean(forward(*xs).argmax(1) == y))
    assert infer.evaluate(ex, d)['accuracy'] == pytest.approx(want, abs=0.1)


def test_export_of_a_fixed_batch_run_into_another_model_is_refused(tmp_path):
    """export writes a fixed-batch run from the folder's batch-1 copy, so the model named
    must be the one prepared: another file (here one fixing another batch) is refused,
    naming it, where it had been left unread and the prepared model written under the
    other's name ('written with the batch of 4 <other> fixes')."""
    path, forward = mlp(tmp_path / 'b4.tflite', 4, 1, True)
    other, _ = mlp(tmp_path / 'b8.tflite', 8, 1, True, seed=1)
    d, _, _ = data(tmp_path, 1, forward)
    out = str(tmp_path / 'run')
    prepare(path, out, d, log=lambda *m: None, epochs=1, int8=False)
    ex = str(tmp_path / 'out.tflite')
    with pytest.raises(PrepareError, match='not the model .* was prepared from'):
        export(other, os.path.join(out, 'weights.wof'), ex)
    assert not os.path.exists(ex)
    assert export(path, os.path.join(out, 'weights.wof'), ex)['batch'] == 4
