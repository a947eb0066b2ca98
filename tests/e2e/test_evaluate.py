"""`evaluate MODEL DATA`: the scores against a numpy forward pass of the same weights
(an independent reference), the layout rule, the refusals."""
import os

import numpy as np
import pytest

from host_tools.prepare import infer
from host_tools.formats import refmodels
from host_tools.formats.circle_io import read_model
from host_tools.cli import main

from repo import ROOT  # noqa: E402
from kerasgraphs import build_keras_shapes  # noqa: E402
pytest.importorskip('onert')


def numpy_mlp(path, x, softmax=True):
    g = read_model(path)
    h = x.astype(np.float64)
    fcs = [op for op in g.ops if op.name == 'FULLY_CONNECTED']
    for i, op in enumerate(fcs):
        w, b = (g.tensors[j].data.astype(np.float64) for j in op.inputs[1:3])
        h = h @ w.T + b
        if i < len(fcs) - 1:
            h = np.maximum(h, 0)
    if softmax:
        h = np.exp(h - h.max(axis=1, keepdims=True))
        h /= h.sum(axis=1, keepdims=True)
    return h


def test_classifier_accuracy_and_loss_match_numpy(tmp_path, capsys):
    path = refmodels.mlp(str(tmp_path / 'm.circle'), [6, 12, 4], seed=3)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 6)).astype(np.float32)
    y = rng.integers(0, 4, 50)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    p = numpy_mlp(path, x)
    want = float(np.mean(p.argmax(1) == y))
    assert 0 < want < 1                          # the check can fail both ways
    r = infer.evaluate(path, str(tmp_path / 'd.npz'))
    assert r['metric'] == 'accuracy' and r['n'] == 50
    assert r['accuracy'] == pytest.approx(want)
    assert r['loss'] == pytest.approx(-np.mean(np.log(p[np.arange(50), y])), rel=1e-4)
    assert main(['evaluate', path, str(tmp_path / 'd.npz')]) == 0
    assert f'accuracy {want:.4f}' in capsys.readouterr().out


def test_keras3_shape_chain_scored_on_its_folded_graph(tmp_path):
    """A Keras 3 export computes its reshape at run time and leaves every batch open: ONERT
    fails on it as it is; evaluate scores the graph with the shape arithmetic folded (what
    prepare trains), the same values as the ops define."""
    src, forward = build_keras_shapes(tmp_path / 'k.tflite')
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 12, 3)).astype(np.float32)
    out = forward(x)
    y = np.where(rng.random(40) < 0.7, out.argmax(1), rng.integers(0, 3, 40))
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    r = infer.evaluate(src, tmp_path / 'd.npz')
    assert r['hits'] == int(np.sum(out.argmax(1) == y)) and r['hits'] < 40
    assert 'folded' in r['runtime']
    run, _, _ = infer.predictor(src)
    np.testing.assert_allclose(run(x[:5]), forward(x[:5]), rtol=1e-4, atol=1e-4)


def test_float_tflite_onert_cannot_run_is_scored_by_tflite_micro(tmp_path):
    """ONERT 0.1.0 has no HARD_SWISH, TFLite Micro no GELU (a Keras Conv1D(hard_swish) ->
    Dense(gelu) model): evaluate had refused it, "ONERT cannot load it (NNFW_STATUS_ERROR)".
    The HARD_SWISH is spelled in ADD / RELU6 / MUL for ONERT: scored as numpy computes
    the model (HARD_SWISH alone had been scored by TFLite Micro, which runs float models
    too)."""
    pytest.importorskip('tflite_micro')
    from math import erf
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(4)
    w1, b1, w2, b2 = (rng.normal(size=s).astype(np.float32) for s in ([8, 5], [8], [3, 8], [3]))
    xs = rng.normal(size=(30, 5)).astype(np.float32)
    z = xs @ w1.T + b1
    hs = z * np.clip(z + 3, 0, 6) / 6
    for gelu in (False, True):
        b = CircleBuilder(identifier=b'TFL3')
        x, h, a, y = b.tensor('x', [1, 5]), b.tensor('h', [1, 8]), b.tensor('a', [1, 8]), b.tensor('y', [1, 3])
        b.op('FULLY_CONNECTED', [x, b.tensor('w1', [8, 5], data=w1), b.tensor('b1', [8], data=b1)], [h])
        b.op('HARD_SWISH', [h], [a])
        if gelu:
            a2 = b.tensor('a2', [1, 8])
            b.op('GELU', [a], [a2], approximate=False)
            a = a2
        b.op('FULLY_CONNECTED', [a, b.tensor('w2', [3, 8], data=w2), b.tensor('b2', [3], data=b2)], [y])
        b.inputs(x)
        b.outputs(y)
        path = b.save(str(tmp_path / f'hs{gelu:d}.tflite'))
        act = hs * 0.5 * (1 + np.vectorize(erf)(hs / np.sqrt(2))) if gelu else hs
        out = act @ w2.T + b2
        ys = np.where(rng.random(30) < 0.6, out.argmax(1), rng.integers(0, 3, 30))
        np.savez(tmp_path / 'd.npz', x=xs, y=ys)
        r = infer.evaluate(path, str(tmp_path / 'd.npz'))
        assert r['hits'] == int(np.sum(out.argmax(1) == ys)) and 0 < r['hits'] < 30, r
        run, runtime, _ = infer.predictor(path)
        np.testing.assert_allclose(run(xs[:6]), out[:6], rtol=1e-4, atol=1e-4)
        assert runtime.startswith('ONERT'), runtime


def test_regression_scores_mae_and_mse(tmp_path):
    path = refmodels.mlp(str(tmp_path / 'r.circle'), [5, 8, 2], seed=4, softmax=False)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 5)).astype(np.float32)
    t = rng.normal(size=(30, 2)).astype(np.float32)
    np.savetxt(tmp_path / 'd.csv', np.hstack([x, t[:, :1]]), delimiter=',')
    np.savez(tmp_path / 'd.npz', x=x, y=t)
    d = numpy_mlp(path, x, softmax=False) - t
    r = infer.evaluate(path, str(tmp_path / 'd.npz'))
    assert r['metric'] == 'mae'
    assert r['mae'] == pytest.approx(np.mean(np.abs(d)), rel=1e-5)
    assert r['loss'] == pytest.approx(np.mean(d * d), rel=1e-5)
    with pytest.raises(infer.InferError, match='outputs 2'):
        infer.evaluate(path, str(tmp_path / 'd.csv'))          # one target column, two outputs


def test_layout_transposes_nchw_only_when_it_can_tell():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)      # N C H W
    got, moved = infer.layout(x, [1, 4, 5, 3])
    assert moved and np.array_equal(got, x.transpose(0, 2, 3, 1))
    flat = x.reshape(2, -1)
    got, moved = infer.layout(flat, [1, 4, 5, 3])                  # flat: taken as NHWC
    assert not moved and np.array_equal(got.reshape(2, -1), flat)
    got, moved = infer.layout(flat, [1, 4, 5, 3], nchw=True)
    assert moved and np.array_equal(got, x.transpose(0, 2, 3, 1))
    with pytest.raises(infer.InferError, match='takes 60'):
        infer.layout(np.zeros((2, 7)), [1, 4, 5, 3])


def test_int8_tflite_runs_quantized(tmp_path):
    pytest.importorskip('tflite_micro')
    keras = os.path.join(ROOT, 'bench', 'zoo', 'keras')
    r = infer.evaluate(os.path.join(keras, 'dscnn_kws_int8.tflite'),
                       os.path.join(keras, 'dscnn_kws_data.npz'))
    # bench/zoo/pretrain_dscnn.py trained it to this data: a wrongly quantized input or
    # output would score near chance (1/12)
    assert r['runtime'] == 'TFLite Micro' and r['accuracy'] > 0.9


def test_onnx_model_scored_as_torch_scores_it(tmp_path):
    """An .onnx from torch.onnx.export (NCHW input) runs under ONNX Runtime on data in
    the model's own layout: the accuracy PyTorch's own forward gives."""
    torch = pytest.importorskip('torch')
    pytest.importorskip('onnxruntime')
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 3)).eval()
    path = str(tmp_path / 'm.onnx')
    torch.onnx.export(m, (torch.zeros(1, 2, 5, 5),), path, dynamo=False)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 2, 5, 5)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    with torch.no_grad():
        want = float((m(torch.from_numpy(x)).argmax(1).numpy() == y).mean())
    assert 0 < want < 1
    r = infer.evaluate(path, str(tmp_path / 'd.npz'))
    assert r['runtime'] == 'ONNX Runtime' and r['accuracy'] == pytest.approx(want)


def test_refusals(tmp_path):
    # (neither ONNX Runtime nor utrain's reader loads it: the reader's words, which say
    # what the file is and what to do; had been ONNX Runtime's)
    with pytest.raises(infer.InferError, match='not a model: it reads as text; give the model'):
        (tmp_path / 'm.onnx').write_bytes(b'onnx')
        infer.predictor(str(tmp_path / 'm.onnx'))
    with pytest.raises(infer.InferError, match='no such model'):
        infer.predictor(str(tmp_path / 'none.circle'))


@pytest.mark.parametrize('inputs', [1, 2])
def test_a_batch_fixed_in_the_file_is_scored_a_sample_at_a_time(tmp_path, inputs):
    """Issue 28 (a Keras model with Input(batch_size=4)): evaluate runs it at batch 1
    (formats.batch), as the numpy forward of its weights scores it; it had been refused
    (before, ONERT's 'cannot run it'), and a model of two inputs too."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    xs = [b.tensor(f'x{i}', [4, 3]) for i in range(inputs)]
    h = xs[0]
    if inputs == 2:
        h = b.tensor('h', [4, 3])
        b.op('ADD', xs, [h], fused_activation_function='NONE')
    y = b.tensor('y', [4, 2])
    b.op('FULLY_CONNECTED', [h, b.tensor('w', [2, 3], data=rng.standard_normal((2, 3)).astype(np.float32)),
                             b.tensor('b', [2], data=np.zeros(2, np.float32))], [y])
    b.inputs(*xs)
    b.outputs(y)
    path = b.save(str(tmp_path / 'b4.tflite'))
    arrays = {f'x{i}': rng.standard_normal((8, 3)).astype(np.float32) for i in range(inputs)}
    if inputs == 1:
        arrays = {'x': arrays['x0']}
    np.savez(tmp_path / 'd.npz', y=np.arange(8) % 2, **arrays)
    x = sum(arrays.values()).astype(np.float64)
    w = read_model(path).tensors
    w = [t.data for t in w if t.name == 'w'][0].astype(np.float64)
    want = np.mean((x @ w.T).argmax(1) == np.arange(8) % 2)
    assert infer.evaluate(path, str(tmp_path / 'd.npz'))['accuracy'] == pytest.approx(want)


def _one_output(path, sigmoid, F=5):
    from host_tools.formats.circle_build import CircleBuilder
    w = np.random.default_rng(0).standard_normal((1, F)).astype(np.float32) * 2
    b = CircleBuilder(identifier=b'TFL3')
    x, z = b.tensor('x', [1, F]), b.tensor('z', [1, 1])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', w.shape, data=w),
                             b.tensor('b', [1], data=np.zeros(1, np.float32))], [z])
    out = z
    if sigmoid:
        out = b.tensor('p', [1, 1])
        b.op('LOGISTIC', [z], [out])
    b.inputs(x)
    b.outputs(out)
    return b.save(str(path)), w


def test_a_sigmoid_on_labels_0_and_1_scores_accuracy(tmp_path):
    """Issue 28: a held-out Keras Dense(1, sigmoid) classifier trained with bce (prepare:
    accuracy on the board) was scored by evaluate as a regression (MAE): one output in
    0..1 against labels 0 and 1 is binary accuracy; the same labels against a linear
    output, or real targets, stay MAE."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 5)).astype(np.float32)
    y = rng.integers(0, 2, 40)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    path, w = _one_output(tmp_path / 's.tflite', True)
    p = 1 / (1 + np.exp(-(x.astype(np.float64) @ w[0])))
    r = infer.evaluate(path, str(tmp_path / 'd.npz'))
    assert r['metric'] == 'accuracy' and r['hits'] == int(np.sum((p > 0.5) == (y == 1)))
    np.savez(tmp_path / 'r.npz', x=x, y=y * 0.5 + 0.2)
    assert infer.evaluate(path, str(tmp_path / 'r.npz'))['metric'] == 'mae'
    lin, _ = _one_output(tmp_path / 'l.tflite', False)
    assert infer.evaluate(lin, str(tmp_path / 'd.npz'))['metric'] == 'mae'


def test_a_tico_model_onert_cannot_run_is_scored_on_its_rewritten_graph(tmp_path):
    """Issue 28: `evaluate model.circle data` (the README's 'before') of a tico ResNet
    block (a residual ADD of NCHW convs) was 'ONERT loads it but cannot run it (Session
    preparation failed)': it is scored on the graph as prepare rewrites it (the layout
    transposes cancelled), as PyTorch scores it."""
    torch = pytest.importorskip('torch')
    tico = pytest.importorskip('tico')
    nn = torch.nn
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
            self.f = nn.Linear(8, 3)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.f(torch.relu(h + self.b(h)).mean((2, 3)))
    m = Block().eval()
    path = str(tmp_path / 'block.circle')
    tico.convert(m, (torch.zeros(1, 1, 12, 12),)).save(path)
    rng = np.random.default_rng(2)
    x = rng.random((30, 1, 12, 12)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.tensor(x)).numpy()
    y = want.argmax(1)
    y[:7] = (y[:7] + 1) % 3                     # 23 of 30 right, as torch scores them
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    r = infer.evaluate(path, str(tmp_path / 'd.npz'))
    assert r['metric'] == 'accuracy' and r['hits'] == 23, r
    run, runtime, g = infer.predictor(path)
    xs, _ = infer.layout(x, g.tensors[g.inputs[0]].shape)
    np.testing.assert_allclose(run(xs), want, atol=1e-5)


def test_data_prepare_refuses_is_refused_naming_the_file(tmp_path):
    """Issue 28: evaluate judges its data as prepare does.  NaN in a sample had been scored
    ('cross-entropy of the softmax nan', an accuracy beside it), and labels outside the
    model's classes refused without naming the file or what to do ('targets have 1 values
    per sample, the model outputs 4')."""
    path = refmodels.mlp(str(tmp_path / 'm.circle'), [6, 12, 4], seed=3)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 6)).astype(np.float32)
    y = rng.integers(0, 4, 20)
    xn = x.copy()
    xn[3, 2] = np.nan
    for name, xs, ys, says in (
            ('nan.npz', xn, y, r'nan\.npz: x of sample 3 holds NaN or Inf .*drop those samples'),
            ('above.npz', x, y + 4, r'above\.npz: .*whole numbers 0 to 3, and these run from 4 to 7'
                                    r': number the classes from 0'),
            ('below.npz', x, y - 1, r'below\.npz: .*these run from -1 to 2: number the classes'),
            ('wide.npz', x, rng.normal(size=(20, 3)), r'wide\.npz: .*give 4 target values a sample')):
        np.savez(tmp_path / name, x=xs, y=ys)
        with pytest.raises(ValueError, match=says):
            infer.evaluate(path, str(tmp_path / name))


def test_an_embeddings_ids_are_judged_and_wrapped_as_the_board_reads_them(tmp_path):
    """A Keras Embedding (float ids -> CAST -> SELECT_V2 reading a negative id from the
    table's end -> GATHER): evaluate scored an id past the table (45 of 9 rows, which
    prepare refuses and TFLite stops at) and read negative ids out of range on the
    graph it runs (the score of a held-out Keras text classifier changed from run to run,
    0.98 or 0.77; TFLite's interpreter 0.945).  Now the first is refused naming the data,
    and negative ids score as numpy's table[id] (the model's definition)."""
    from kerasgraphs import build_keras_float_embedding
    src, E, forward = build_keras_float_embedding(tmp_path / 'e.tflite', N=9, L=5, O=3)
    rng = np.random.default_rng(2)
    ids = rng.integers(-9, 9, (40, 5)).astype(np.float32)
    ids[:, 0] = -1                              # (every sample reads a wrapped row)
    p = forward(ids)
    y = p.argmax(1)
    y[::4] = (y[::4] + 1) % 3                   # (an accuracy of 0.75, and a loss to match)
    np.savez(tmp_path / 'neg.npz', x=ids, y=y)
    r = infer.evaluate(src, str(tmp_path / 'neg.npz'))
    e = np.exp(p - p.max(1, keepdims=True))
    want = float(np.mean(-np.log((e / e.sum(1, keepdims=True))[np.arange(40), y])))
    assert r['accuracy'] == pytest.approx(0.75) and r['loss'] == pytest.approx(want, rel=1e-4)
    bad = ids.copy()
    bad[7, 2] = 45
    np.savez(tmp_path / 'oov.npz', x=bad, y=y)
    with pytest.raises(ValueError, match=r'oov\.npz: .*GATHER reads rows of a 9-row table .*'
                                         r'id 45 .*give ids the table has'):
        infer.evaluate(src, str(tmp_path / 'oov.npz'))


def test_an_int8_model_tflite_micro_crashes_on_is_scored_not_aborted(tmp_path):
    """TFLite Micro aborts the process, saying nothing, loading some valid int8 files (a
    Keras Softmax over two axes writes a SUB of a tensor from itself, whose output scale
    of 1e-8 its int8 SUB's prepare cannot take): `evaluate` died with exit code 134 and no
    word.  The load is tried in a forked child first: evaluate scores the model with
    another runtime (utrain's own forward here) and says why."""
    import subprocess
    import sys
    pytest.importorskip('tflite_micro')
    from host_tools.formats.circle_build import CircleBuilder
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4], dtype='int8', quant=q(0.05, 0))
    d = b.tensor('d', [1, 4], dtype='int8', quant=q(1e-8, -128))
    b.op('SUB', [x, x], [d], fused_activation_function='NONE')
    w = b.tensor('w', [2, 4], dtype='int8', data=np.int8([[10, -20, 30, 5], [-7, 8, 9, -10]]),
                 quant=q(0.01, 0))
    bias = b.tensor('b', [2], dtype='int32', data=np.int32([0, 0]), quant=q(0.0005, 0))
    h = b.tensor('h', [1, 4], dtype='int8', quant=q(0.05, 0))
    b.op('ADD', [x, d], [h], fused_activation_function='NONE')
    y = b.tensor('y', [1, 2], dtype='int8', quant=q(0.02, 0))
    b.op('FULLY_CONNECTED', [h, w, bias], [y], fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    m = b.save(os.fspath(tmp_path / 'sub.tflite'))
    r = np.random.default_rng(0)
    np.savez(tmp_path / 'd.npz', x=r.uniform(-2, 2, (8, 4)).astype(np.float32),
             y=r.integers(0, 2, 8))
    p = subprocess.run([sys.executable, '-m', 'host_tools', 'evaluate', m,
                        os.fspath(tmp_path / 'd.npz')], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert 'accuracy' in p.stdout and 'TFLite Micro' in p.stdout and 'crashed' in p.stdout, p.stdout
