"""Models made outside the project, as their exporters write them, built here
(issue 28, a new user's sweep): Keras's Dense on a 4-D input (Tensordot's shape
arithmetic), a float16-quantized .tflite, an int8 file with float inputs and outputs
under --dequantize, a dilated convolution under TFLite Micro, an int8 op TFLite Micro has
no kernel for, channels-first 3-D samples, a run's test.ds scored on an ONNX model."""
import functools
import re
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from kerasgraphs import _act, build_keras_dilated, build_int8_unary  # noqa: E402


def _ints(b, name, v):
    v = np.array(v, np.int32)
    return b.tensor(name, list(v.shape), data=v)


def _prepare_run(src, tmp_path, x, y, **kw):
    """prepare src on x, y (SGD, one epoch, a test split), run it on the host; returns
    (prepare's summary, the run folder)."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    out = tmp_path / 'run'
    s = prepare(os.fspath(src), os.fspath(out), data=os.fspath(tmp_path / 'd.npz'),
                log=lambda *a: None, **dict(dict(epochs=1, lr=0.05, optimizer='sgd'), **kw))
    code, text = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    return s, out


def build_keras_dense4d(path, seed=0, H=4, W=3, C=3, U=5, O=3):
    """Keras 3's Dense(U) on a 4-D input, as TFLite's converter writes it (Tensordot):
    SHAPE -> GATHER of the free axes -> REDUCE_PROD, GATHER of the last -> REDUCE_PROD,
    PACK -> RESHAPE to [rows, C] (the file's static shape [1, 1], signature [-1, -1]) ->
    FULLY_CONNECTED without bias -> RESHAPE to [1, H, W, U] (a CONCATENATION of the free
    dims and U) -> ADD bias RELU; Flatten -> FC.  Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    wd, bd = rng.standard_normal((U, C)).astype(np.float32), rng.standard_normal(U).astype(np.float32)
    wf = (0.3 * rng.standard_normal((O, H * W * U))).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    act = functools.partial(_act, b)
    x = act('x', [1, H, W, C])
    shp = b.tensor('shape', [4], dtype=np.int32)
    b.op('SHAPE', [x], [shp], out_type='INT32')
    gf = b.tensor('free', [3], dtype=np.int32)
    b.op('GATHER', [shp, _ints(b, 'free_ax', [0, 1, 2])], [gf], axis=0)
    pf = b.tensor('prod_free', [], dtype=np.int32)
    b.op('REDUCE_PROD', [gf, _ints(b, 'ax0', [0])], [pf])
    ga = b.tensor('axes', [1], dtype=np.int32)
    b.op('GATHER', [shp, _ints(b, 'axes_ax', [3])], [ga], axis=0)
    pa = b.tensor('prod_axes', [], dtype=np.int32)
    b.op('REDUCE_PROD', [ga, _ints(b, 'ax0b', [0])], [pa])
    cat = b.tensor('out_shape', [4], dtype=np.int32)
    b.op('CONCATENATION', [gf, _ints(b, 'units', [U])], [cat], axis=0)
    st = b.tensor('stack', [2], dtype=np.int32)
    b.op('PACK', [pf, pa], [st], values_count=2, axis=0)
    r = b.tensor('rows', [1, 1], signature=[-1, -1])
    b.op('RESHAPE', [x, st], [r])
    m = b.tensor('mm', [1, U], signature=[-1, U])
    b.op('FULLY_CONNECTED', [r, b.tensor('wd', wd.shape, data=wd), -1], [m])
    t = act('t', [1, H, W, U])
    b.op('RESHAPE', [m, cat], [t])
    a = act('a', [1, H, W, U])
    b.op('ADD', [t, b.tensor('bd', [U], data=bd)], [a], fused_activation_function='RELU')
    f = act('f', [1, H * W * U])
    b.op('RESHAPE', [a], [f], new_shape=[1, H * W * U])
    y = act('y', [1, O])
    b.op('FULLY_CONNECTED', [f, b.tensor('wf', wf.shape, data=wf), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        h = np.maximum(xs @ wd.T.astype(np.float64) + bd, 0).reshape(len(xs), -1)
        return h @ wf.T.astype(np.float64)
    return os.fspath(path), forward


def test_keras_dense_on_4d_input_trains(tmp_path):
    """Keras's Dense on a 4-D input (Tensordot's SHAPE -> GATHER -> REDUCE_PROD -> PACK
    shape arithmetic, an FC input of file shape [1, 1]) had been refused ('weight of
    shape [5, 3] does not fit input of shape [1, 1]'): the shapes fold on the host, ONERT
    on the rewritten graph gives the model's definition (numpy), and it trains: the
    Dense's weight and bias move."""
    from host_tools.graph import rewrite as rw
    from host_tools.graph.inout import compact, save_graph
    from onert_ref import onert_infer
    src, forward = build_keras_dense4d(tmp_path / 'd4.tflite')
    g = read_model(src)
    rw.rewrite(g)
    compact(g)
    assert not {'SHAPE', 'REDUCE_PROD', 'GATHER', 'PACK'} & {op.name for op in g.ops}
    dst = save_graph(g, os.fspath(tmp_path / 'r.circle'))
    x = np.random.default_rng(1).standard_normal((5, 4, 3, 3)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    xs = np.random.default_rng(2).standard_normal((12, 4, 3, 3)).astype(np.float32)
    s, out = _prepare_run(src, tmp_path, xs, np.arange(12) % 3, loss='scce', from_logits=True)
    from host_tools.files.wof import read_wof
    h = read_model(out / s['rewritten'])
    before, after = read_wof(out / 'weights.wof', h), read_wof(out / 'trained.wof', h)
    moved = {h.tensors[k].name for k in before if not np.array_equal(before[k], after[k])}
    assert {'wd', 'bd', 'wf'} <= moved, moved


def build_float16(path, seed=0, I=6, H=5, O=3):
    """A float16-quantized .tflite (Optimize.DEFAULT with float16 types): every weight
    float16, a DEQUANTIZE to float32 before each op, the activations float32:
    FC RELU -> FC -> SOFTMAX.  Returns (path, numpy forward)."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((H, I)).astype(np.float16), rng.standard_normal(H).astype(np.float16)
    w2, b2 = rng.standard_normal((O, H)).astype(np.float16), rng.standard_normal(O).astype(np.float16)
    b = CircleBuilder(identifier=b'TFL3')
    deq = {}
    for n, v in (('w1', w1), ('b1', b1), ('w2', w2), ('b2', b2)):
        h = b.tensor(n + '16', list(v.shape), data=v, dtype='float16')
        deq[n] = b.tensor(n, list(v.shape))
        b.op('DEQUANTIZE', [h], [deq[n]])
    x, h, z, y = (b.tensor(n, s) for n, s in (('x', [1, I]), ('h', [1, H]), ('z', [1, O]),
                                              ('y', [1, O])))
    b.op('FULLY_CONNECTED', [x, deq['w1'], deq['b1']], [h], fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, deq['w2'], deq['b2']], [z])
    b.op('SOFTMAX', [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        f = lambda a: a.astype(np.float64)   # noqa: E731
        e = np.maximum(xs @ f(w1).T + f(b1), 0) @ f(w2).T + f(b2)
        e = np.exp(e - e.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    return os.fspath(path), forward


def test_float16_tflite_evaluates_trains_and_exports(tmp_path):
    """A float16-quantized .tflite: evaluate had refused it (ONERT cannot load it, nor
    TFLite Micro its float16 DEQUANTIZE): now scored on its graph as prepare rewrites it,
    the model's definition (numpy); prepare trains it and export writes the trained
    weights back (it had failed, 'has data for tensor 1, which takes none here': the
    rewrite that only dropped DEQUANTIZEs left no rewritten.circle for the .wof's
    numbering); the export scores as the run's last epoch."""
    import csv
    from host_tools.prepare.infer import predictor, evaluate
    from host_tools.prepare.pipeline import export
    src, forward = build_float16(tmp_path / 'f16.tflite')
    run, runtime, _ = predictor(src)
    assert 'dequantized' in runtime, runtime
    x = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)
    np.testing.assert_allclose(run(x), forward(x.astype(np.float64)), rtol=1e-4, atol=1e-6)
    xs = np.random.default_rng(2).standard_normal((40, 6)).astype(np.float32)
    s, out = _prepare_run(src, tmp_path, xs, np.arange(40) % 3, loss='scce', test_split=0.25,
                          epochs=2)
    assert s['rewritten']
    export(src, os.fspath(out / 'trained.wof'), os.fspath(tmp_path / 'out.tflite'))
    r = evaluate(os.fspath(tmp_path / 'out.tflite'), os.fspath(out / 'test.ds'))
    rows = list(csv.DictReader(open(out / 'train.log')))
    # (trained.wof holds the best epoch's weights)
    assert min(abs(r['loss'] - float(q['test_loss'])) for q in rows[1:]) < 1e-4, (r, rows)
    assert float(rows[-1]['test_loss']) != float(rows[0]['test_loss'])


def build_int8_float_io(path, seed=0, I=6, H=8, O=4):
    """A full-integer int8 model with float input and output (the converter's default
    inference types): QUANTIZE -> FC RELU -> FC -> SOFTMAX (int8, 1/256, -128) ->
    DEQUANTIZE."""
    rng = np.random.default_rng(seed)
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, I])
    xq = b.tensor('xq', [1, I], dtype='int8', quant=q(0.02, 0))
    b.op('QUANTIZE', [x], [xq])
    h = b.tensor('h', [1, H], dtype='int8', quant=q(0.05, -128))
    w1 = rng.integers(-127, 128, (H, I)).astype(np.int8)
    b.op('FULLY_CONNECTED', [xq, b.tensor('w1', [H, I], data=w1, quant=q(0.01, 0)),
                             b.tensor('b1', [H], data=np.zeros(H, np.int32), quant=q(0.0002, 0))],
         [h], fused_activation_function='RELU')
    z = b.tensor('z', [1, O], dtype='int8', quant=q(0.1, 0))
    w2 = rng.integers(-127, 128, (O, H)).astype(np.int8)
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', [O, H], data=w2, quant=q(0.01, 0)), -1], [z])
    p = b.tensor('p', [1, O], dtype='int8', quant=q(1 / 256, -128))
    b.op('SOFTMAX', [z], [p], beta=1.0)
    y = b.tensor('y', [1, O])
    b.op('DEQUANTIZE', [p], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return os.fspath(path)


def test_int8_float_io_softmax_dequantized_takes_probabilities(tmp_path):
    """An int8 model with float I/O ends SOFTMAX -> DEQUANTIZE: under --dequantize the
    loss had been told the output was logits ('made by op 4 (DEQUANTIZE), not SOFTMAX')
    and trained cross-entropy on the softmax of probabilities.  Now scce reads the
    softmax's probabilities, as for the int8-output file."""
    from host_tools.prepare.pipeline import prepare
    src = build_int8_float_io(tmp_path / 'q.tflite')
    np.savez(tmp_path / 'd.npz', x=np.random.default_rng(0).standard_normal((20, 6)).astype(np.float32),
             y=np.arange(20) % 4)
    said = []
    prepare(src, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
            dequantize=True, log=said.append)
    tj = json.load(open(tmp_path / 'run' / 'train.json'))
    flat = json.dumps(tj)
    assert '"from_logits": true' not in flat, flat
    assert not any('not SOFTMAX' in str(m) for m in said), said


def test_dilated_convolution_scored_as_tensorflow_defines_it(tmp_path):
    """TFLite Micro's SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND around a dilated convolution
    gave NaN on a float file and other values than TensorFlow's on an int8 one (a Keras
    Conv2D(dilation_rate=2) scored 0.25 where the run's epoch 0 and TensorFlow said
    0.275): evaluate's TFLite Micro path runs the dilated convolution prepare makes of
    it, the definition's values (numpy)."""
    from host_tools.prepare.infer import _tflm_folded
    src, forward = build_keras_dilated(tmp_path / 'dil.tflite')
    g = read_model(src)
    x = np.random.default_rng(1).standard_normal((4, 13, 2)).astype(np.float32)
    run = _tflm_folded(src, g, x[:1])
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(run(x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)


def build_int8_sqrt(path, seed=0, I=6, H=8, O=3):
    """An int8 FC RELU -> SQRT -> FC (Keras's tf.math.sqrt in a Lambda, as the converter
    writes it full-integer).  Returns (path, numpy forward of the dequantized graph)."""
    rng = np.random.default_rng(seed)
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    sx, s1, sh, ss, s2, sy = 0.05, 0.01, 0.02, 0.01, 0.01, 0.05
    w1 = rng.integers(-127, 128, (H, I)).astype(np.int8)
    b1 = rng.integers(-200, 200, H).astype(np.int32)
    w2 = rng.integers(-127, 128, (O, H)).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, I], dtype='int8', quant=q(sx, 0))
    h = b.tensor('h', [1, H], dtype='int8', quant=q(sh, -128))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [H, I], data=w1, quant=q(s1, 0)),
                             b.tensor('b1', [H], data=b1, quant=q(sx * s1, 0))], [h],
         fused_activation_function='RELU')
    r = b.tensor('r', [1, H], dtype='int8', quant=q(ss, -128))
    b.op('SQRT', [h], [r])
    y = b.tensor('y', [1, O], dtype='int8', quant=q(sy, 0))
    b.op('FULLY_CONNECTED', [r, b.tensor('w2', [O, H], data=w2, quant=q(s2, 0)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        hf = np.maximum(xs @ (w1 * s1).T + b1 * sx * s1, 0)
        return np.sqrt(hf) @ (w2 * s2).T
    return os.fspath(path), forward


def test_int8_op_without_tflm_kernel_scored_dequantized(tmp_path):
    """An int8 model with an op TFLite Micro has no int8 kernel for (Keras's
    tf.math.sqrt in a Lambda: the converter writes an int8 SQRT) had evaluate fail
    ('Interpreter invocation failed'): it is now scored on the graph dequantized, as
    `prepare --dequantize` trains it, and says so; the score is the dequantized graph's
    definition (numpy)."""
    from host_tools.prepare.infer import predictor
    src, forward = build_int8_sqrt(tmp_path / 'sq.tflite')
    run, runtime, _ = predictor(src)
    assert 'dequantized' in runtime and 'TFLite Micro cannot run it' in runtime, runtime
    # (the op and why, from TFLite Micro's log, which it writes to stderr only)
    assert "SQRT kernel failed to invoke" in runtime and 'INT8' in runtime, runtime
    x = np.random.default_rng(1).uniform(-2, 2, (6, 6))
    xq = np.clip(np.round(x / 0.05), -128, 127) * 0.05      # (the input's int8 grid)
    ref = forward(xq)
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(run(xq.astype(np.float32)), ref, rtol=1e-4, atol=1e-4)


def test_int8_gelu_scored_dequantized_names_gelu(tmp_path):
    """An int8 file with GELU (TFLite Micro has no GELU kernel) is scored dequantized, as
    `prepare --dequantize` trains it; what it said was 'TFLM failed to allocate tensors'
    (the op named on stderr only): it names GELU.  The score: the dequantized graph's
    numpy forward."""
    from host_tools.prepare.infer import predictor
    src, forward, _ = build_int8_unary(str(tmp_path / 'gelu.tflite'), 'GELU')
    run, runtime, _ = predictor(src)
    assert 'dequantized' in runtime and 'TFLite Micro has no kernel for GELU' in runtime, runtime
    x = np.clip(np.round(np.random.default_rng(2).uniform(-3, 3, (6, 6)) / 0.05), -128, 127) * 0.05
    np.testing.assert_allclose(run(x.astype(np.float32)), [forward(v) for v in x], rtol=2e-3,
                               atol=2e-3)


def build_conv1d_nlc(path, seed=0, L=10, C=3, F=4, O=3):
    """A Keras-style Conv1D on [1, L, C] (channels last: a CONV_2D on [1, 1, L, C] between
    RESHAPEs) -> Flatten -> FC.  Returns (path, numpy forward on (N, L, C))."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((F, 1, 3, C)).astype(np.float32)
    wf = (0.3 * rng.standard_normal((O, (L - 2) * F))).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, L, C])
    x4 = b.tensor('x4', [1, 1, L, C])
    b.op('RESHAPE', [x], [x4], new_shape=[1, 1, L, C])
    c = b.tensor('c', [1, 1, L - 2, F])
    b.op('CONV_2D', [x4, b.tensor('w', w.shape, data=w), -1], [c], padding='VALID',
         fused_activation_function='RELU')
    f = b.tensor('f', [1, (L - 2) * F])
    b.op('RESHAPE', [c], [f], new_shape=[1, (L - 2) * F])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [f, b.tensor('wf', wf.shape, data=wf), -1], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        win = np.stack([xs[:, j:j + L - 2] for j in range(3)], 2)      # n, L-2, 3, C
        h = np.maximum(np.einsum('nljc,fjc->nlf', win, w[:, 0].astype(np.float64)), 0)
        return h.reshape(len(xs), -1) @ wf.T.astype(np.float64)
    return os.fspath(path), forward


def test_channels_first_1d_samples_laid_out_for_a_channels_last_model(tmp_path):
    """(N, C, L) samples, PyTorch's Conv1d order, for a model taking [1, L, C] (a Keras
    Conv1D, or a PyTorch model once prepared and exported) had been read flat in the
    model's order: trained and scored on scrambled samples, saying nothing (4-D NCHW
    was already told apart).  prepare and evaluate now lay them out as the model takes
    them, where the sizes tell the two orders apart."""
    from host_tools.files.dataset import read_samples
    from host_tools.prepare.infer import evaluate
    src, forward = build_conv1d_nlc(tmp_path / 'c1.tflite')
    rng = np.random.default_rng(3)
    nlc = rng.standard_normal((12, 10, 3)).astype(np.float32)
    y = forward(nlc.astype(np.float64)).argmax(1)
    np.savez(tmp_path / 'ncl.npz', x=nlc.transpose(0, 2, 1), y=y)
    np.savez(tmp_path / 'nlc.npz', x=nlc, y=y)
    for name in ('ncl.npz', 'nlc.npz'):
        x, _ = read_samples(os.fspath(tmp_path / name), shape=[1, 10, 3])
        np.testing.assert_array_equal(x, nlc.reshape(12, -1))
        r = evaluate(src, os.fspath(tmp_path / name))
        assert r['accuracy'] == 1.0, (name, r)
    assert r['transposed'] is False


def test_run_test_split_scored_on_the_onnx_model_it_came_from(tmp_path):
    """prepare stores an ONNX Conv1d model's samples as the rewritten graph takes them
    (channels last); `evaluate model.onnx run/test.ds` had read them in the file's NCL
    order: an accuracy of chance for the model the run itself scored 0.92.  The run's
    prepare.json says the layout, and evaluate lays the samples back; the scores equal
    those of the same rows of the .npz."""
    torch = pytest.importorskip('torch')
    from host_tools.prepare.infer import evaluate
    from host_tools.prepare.pipeline import prepare
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(4 * 8, 3)).eval()
    src = os.fspath(tmp_path / 'c1.onnx')
    torch.onnx.export(m, torch.zeros(1, 3, 10), src, input_names=['x'], output_names=['y'],
                      opset_version=13, dynamo=False)
    x = np.random.default_rng(4).standard_normal((40, 3, 10)).astype(np.float32)
    with torch.no_grad():
        y = m(torch.from_numpy(x)).numpy().argmax(1)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    out = tmp_path / 'run'
    s = prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), test_split=0.25,
                loss='scce', log=lambda *a: None)
    assert s.get('input_perm'), s
    r = evaluate(src, os.fspath(out / 'test.ds'))
    assert r['n'] == 10 and r['accuracy'] == 1.0, r
    assert 'laid out back' in r['transposed']


def test_a_keras_rnn_written_as_a_while_loop_is_refused_saying_unroll(tmp_path):
    """Issue 28: TF 2.21 writes a Keras LSTM that is not unrolled as a WHILE op over
    subgraphs of its own (cond, body).  prepare and inspect had said 'has 3 subgraphs;
    utrain trains subgraph 0 of single-subgraph models only', not why or what to do.
    prepare unrolls one of a fixed trip count (tests/formats/test_while.py); one whose
    bound is computed at run time, and any WHILE under --no-rewrite, are refused saying
    unroll=True."""
    import io
    from contextlib import redirect_stderr, redirect_stdout
    from host_tools.cli import main
    from host_tools.prepare.pipeline import prepare
    from kerasgraphs import build_keras_while_lstm
    p, _ = build_keras_while_lstm(tmp_path / 'lstm.tflite', trip='runtime')
    says = ('lstm.tflite: op 3 WHILE: its trip count is not known before it runs (its '
            'condition\'s LESS reads cond_arg6 computed at run time), so utrain cannot unroll '
            'it; give the recurrent layer unroll=True')
    with pytest.raises(ValueError, match=re.escape(says)):
        prepare(str(p), str(tmp_path / 'run'), loss='mse', log=lambda *a: None)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        assert main(['inspect', str(p)]) == 2
    assert says.split(': ', 1)[1] in out.getvalue()
    p, _ = build_keras_while_lstm(tmp_path / 'fixed.tflite')
    with pytest.raises(ValueError, match=re.escape(
            'fixed.tflite: has 3 subgraphs (op 1 is WHILE, control flow: how TFLiteConverter '
            'writes a Keras LSTM, GRU or RNN layer that is not unrolled; prepare unrolls a '
            'WHILE of a fixed trip count unless --no-rewrite); utrain trains single-subgraph '
            'models: give each recurrent layer unroll=True')):
        prepare(str(p), str(tmp_path / 'run2'), loss='mse', rewrite=False, log=lambda *a: None)


def test_weights_as_resource_variables_refused_by_every_command(tmp_path):
    """Issue 28 (session 18): TFLiteConverter.from_concrete_functions([f], model), the
    form TensorFlow's guide shows, writes a Keras model's weights as resource variables
    (VAR_HANDLE -> READ_VARIABLE, no value in the file).  inspect and evaluate had ended
    in a traceback (TypeError: data type 'resource' not understood), prepare had said
    'op 0 (VAR_HANDLE) has no inputs'."""
    import io
    from contextlib import redirect_stderr
    from circle_schema.v0_10 import circle as C
    from host_tools.cli import main
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4])
    hw = b.tensor('dense/kernel', [], dtype=np.int32)
    b._tensors[hw].type = C.TensorType.TensorType.RESOURCE
    b.op('VAR_HANDLE', [], [hw], shared_name='dense/kernel')
    w = b.tensor('ReadVariableOp', [4, 3])
    b.op('READ_VARIABLE', [hw], [w])
    y = b.tensor('y', [1, 3])
    b.op('BATCH_MATMUL', [x, w], [y])
    b.inputs(x)
    b.outputs(y)
    p = tmp_path / 'vars.tflite'
    b.save(p)
    np.savez(tmp_path / 'd.npz', x=np.ones((4, 4), np.float32), y=np.zeros((4, 3), np.float32))
    says = ('vars.tflite: op 0 is VAR_HANDLE: the model\'s weights are resource variables the '
            'file reads at run time, not constants in it')
    for argv in (['inspect', str(p)], ['evaluate', str(p), str(tmp_path / 'd.npz')],
                 ['prepare', str(p), '-o', str(tmp_path / 'run'), '--data', str(tmp_path / 'd.npz')]):
        err = io.StringIO()
        with redirect_stderr(err):
            assert main(argv) == 2, argv
        assert says in err.getvalue() and 'from_keras_model' in err.getvalue(), (argv, err.getvalue())


@pytest.mark.parametrize('int8', [None, True])
def test_train_last_n_hint_on_two_heads_names_an_op_of_the_run(tmp_path, int8):
    """Issue 28 (session 18): Keras's two heads (a class softmax, a regression Dense written
    after it) with --train last:2 selects the softmax and the other head: nothing to train.
    The hint had said 'last:1 reaches op 3', the head this run leaves out (nothing again),
    and under --int8 'without --int8 it trains in float32', which it does not."""
    from host_tools.graph.passes import PrepareError
    from host_tools.prepare.pipeline import prepare
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4])
    w = lambda n, *s: b.tensor(n, list(s), data=rng.standard_normal(s).astype(np.float32))
    h = b.tensor('h', [1, 6])
    b.op('FULLY_CONNECTED', [x, w('w0', 6, 4), w('b0', 6)], [h], fused_activation_function='RELU')
    z = b.tensor('z', [1, 2])
    b.op('FULLY_CONNECTED', [h, w('w1', 2, 6), w('b1', 2)], [z])
    p = b.tensor('p', [1, 2])
    b.op('SOFTMAX', [z], [p], beta=1.0)
    r = b.tensor('r', [1, 1])
    b.op('FULLY_CONNECTED', [h, w('w3', 1, 6), w('b3', 1)], [r])
    b.inputs(x)
    b.outputs(p, r)
    src = tmp_path / 'heads.tflite'
    b.save(src)
    xs = rng.standard_normal((40, 4)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=(xs[:, 0] > 0).astype(np.int64))
    with pytest.raises(PrepareError) as e:
        prepare(str(src), str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), train='last:2',
                int8=int8, log=lambda *a: None)
    says = str(e.value)
    assert 'nothing to train' in says and 'last:3 reaches op 1 (FULLY_CONNECTED)' in says, says
    assert 'op 3 feeds only outputs this run does not train' in says, says
    assert 'last:1' not in says and 'without --int8' not in says, says


@pytest.mark.parametrize('end', ['LOGISTIC', 'SOFTMAX'])
def test_from_logits_on_a_model_ending_in_probabilities_trains_them_as_such(tmp_path, end):
    """Issue 28 (session 18): --from-logits given for a Keras model ending in a sigmoid
    (bce) or a softmax (scce) read its probabilities as logits: a sigmoid of values in
    0..1 is over 0.5 for every sample, so the held-out accuracy sat at the share of 1s
    and never moved.  prepare says so and trains on the probabilities (the same gradient
    as from the logits the activation reads)."""
    rng = np.random.default_rng(3)
    n_out = 1 if end == 'LOGISTIC' else 2
    w = (2.0 * np.eye(n_out, 4)).astype(np.float32)
    if end == 'SOFTMAX':
        w[1] = -w[0]
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4])
    z = b.tensor('z', [1, n_out])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', w.shape, data=w),
                             b.tensor('b', [n_out], data=np.full(n_out, -1.5, np.float32))], [z])
    p = b.tensor('p', [1, n_out])
    b.op(end, [z], [p], **({'beta': 1.0} if end == 'SOFTMAX' else {}))
    b.inputs(x)
    b.outputs(p)
    src = tmp_path / 'prob.tflite'
    b.save(src)
    xs = rng.standard_normal((200, 4)).astype(np.float32)
    y = (xs[:, 0] > 0).astype(np.float32 if end == 'LOGISTIC' else np.int64)
    said = []
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    np.savez(tmp_path / 'd.npz', x=xs, y=y[:, None] if end == 'LOGISTIC' else y)
    out = tmp_path / 'run'
    prepare(str(src), str(out), data=str(tmp_path / 'd.npz'), test_split=0.25,
            loss='bce' if end == 'LOGISTIC' else 'scce', from_logits=True, epochs=2,
            lr=0.1, optimizer='sgd', log=said.append)
    assert json.load(open(out / 'train.json'))['from_logits'] is False
    assert any(f'ends in op 1 ({end}): its output is probabilities, not logits' in s
               for s in said), said
    code, text = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    acc = [float(v) for v in re.findall(r'test_accuracy ([0-9.]+)', text)]
    share = float(np.mean(y[150:] == 1))        # (the held-out share of 1s)
    assert acc[-1] >= 0.9 and acc[-1] > share + 0.2, (acc, share, text)


def test_fake_quant_weight_of_no_shape_in_the_file_reads(tmp_path):
    """A quantization-aware-trained Keras model converted without quantizing (a GitHub
    gearbox-fault DNN): each weight and activation a uint8 QUANTIZE -> DEQUANTIZE pair, and
    the last Dense's weight pair given no shape in the file (QUANTIZE of the constant
    [O, H] -> [] -> DEQUANTIZE -> []).  prepare refused it ('weight ... of shape [] does not
    fit input'); the pair's outputs have its input's shape, as the runtime gives them, and
    it trains: evaluate of the export = the run's last test loss."""
    import csv
    from host_tools.prepare.infer import evaluate
    from host_tools.prepare.pipeline import export
    rng = np.random.default_rng(0)
    q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    I, H, O = 6, 8, 3
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, I])

    def fake(k, shape, name, s=0.05):       # (shape: as the file gives the pair's outputs)
        u = b.tensor(name + '/q', shape, dtype='uint8', quant=q(s, 128))
        b.op('QUANTIZE', [k], [u])
        f = b.tensor(name + '/dq', shape)
        b.op('DEQUANTIZE', [u], [f])
        return f
    w1 = b.tensor('w1', [H, I], data=(0.5 * rng.standard_normal((H, I))).astype(np.float32))
    w2 = b.tensor('w2', [O, H], data=(0.5 * rng.standard_normal((O, H))).astype(np.float32))
    h = b.tensor('h', [1, H])
    b.op('FULLY_CONNECTED', [fake(x, [1, I], 'x'), fake(w1, [H, I], 'w1', 0.01),
                             b.tensor('b1', [H], data=np.zeros(H, np.float32))], [h],
         fused_activation_function='RELU')
    z = b.tensor('z', [1, O])
    b.op('FULLY_CONNECTED', [fake(h, [1, H], 'h'), fake(w2, [], 'w2', 0.01),
                             b.tensor('b2', [O], data=np.zeros(O, np.float32))], [z])
    y = b.tensor('y', [1, O])
    b.op('SOFTMAX', [fake(z, [1, O], 'z')], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    src = tmp_path / 'qat.tflite'
    b.save(src)
    xs = rng.standard_normal((40, I)).astype(np.float32)
    s, out = _prepare_run(src, tmp_path, xs, np.argmax(xs[:, :O], 1), loss='scce',
                          test_split=0.25, epochs=2)
    assert sorted(s['trainable']) == ['b1', 'b2', 'w1', 'w2'], s['trainable']
    export(os.fspath(src), os.fspath(out / 'trained.wof'), os.fspath(tmp_path / 'out.tflite'))
    r = evaluate(os.fspath(tmp_path / 'out.tflite'), os.fspath(out / 'test.ds'))
    rows = list(csv.DictReader(open(out / 'train.log')))
    assert min(abs(r['loss'] - float(t['test_loss'])) for t in rows[1:]) < 1e-4, (r, rows)


def test_float16_file_of_two_inputs_is_scored(tmp_path):
    """A float16-quantized .tflite of two inputs (a GitHub microplastic detector: a
    200-step spectrum and 7 features): evaluate stopped ('ONERT cannot load it'), where a
    one-input file is scored; the weights are read as float32 (prepare reads them so) and
    the score is the model's."""
    from host_tools.prepare.infer import evaluate
    rng = np.random.default_rng(0)
    w0, w1 = (rng.standard_normal((2, n)).astype(np.float16) for n in (4, 3))
    b = CircleBuilder(identifier=b'TFL3')
    x0, x1 = b.tensor('a', [1, 4]), b.tensor('b', [1, 3])
    parts = []
    for n, x, w in (('w0', x0, w0), ('w1', x1, w1)):
        d = b.tensor(n, [2, w.shape[1]])
        b.op('DEQUANTIZE', [b.tensor(n + '16', list(w.shape), data=w, dtype='float16')], [d])
        z = b.tensor(n + '_out', [1, 2])
        b.op('FULLY_CONNECTED', [x, d, -1], [z])
        parts.append(z)
    y = b.tensor('y', [1, 2])
    b.op('ADD', parts, [y], fused_activation_function='NONE')
    b.inputs(x0, x1)
    b.outputs(y)
    src = os.fspath(tmp_path / 'f16.tflite')
    b.save(src)
    a, c = rng.standard_normal((10, 4)).astype(np.float32), rng.standard_normal((10, 3)).astype(np.float32)
    ref = a @ w0.astype(np.float64).T + c @ w1.astype(np.float64).T
    t = (ref + 0.5).astype(np.float32)
    np.savez(tmp_path / 'd.npz', a=a, b=c, y=t)
    r = evaluate(src, os.fspath(tmp_path / 'd.npz'))
    assert abs(r['mae'] - 0.5) < 1e-4, r
