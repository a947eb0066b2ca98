"""Issue 28: a Keras recurrent layer that is not unroll=True (LSTM, GRU, SimpleRNN,
Bidirectional) converts to a WHILE with cond and body subgraphs; loops.unroll_loops
inlines the body once a step when the trip count is static.  Models are built here as
TensorFlow 2.21 writes them (tests/support/kerasgraphs.build_keras_while_lstm); ONERT runs
the WHILE itself, an independent reference for the unrolled graph."""
import os

import re

import numpy as np
import pytest

from repo import ROOT  # noqa: F401,E402

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.graph import rewrite as rw  # noqa: E402
from host_tools.graph.inout import compact, save_graph
from host_tools.graph.spellings import splits_to_slices
from host_tools.graph.loops import unroll_loops
from host_tools.prepare.pipeline import prepare, export  # noqa: E402
from kerasgraphs import build_keras_while_lstm  # noqa: E402
from onert_ref import onert_infer  # noqa: E402
from stepcheck import step_is_the_gradient  # noqa: E402

T, F, H, O = 5, 3, 4, 3


def _unrolled(src, dst):
    g = read_model(src)
    info = rw.rewrite(g, list(g.ops))     # (every op trains: no bias folded into step 0)
    splits_to_slices(g)          # (ONERT 0.1.0's SPLIT_V gives other values: evaluate's)
    compact(g)
    save_graph(g, dst)
    return g, info


@pytest.mark.parametrize('kw', [{}, {'seq': True}, {'bi': True}, {'seq': True, 'bi': True},
                                {'cell': 'rnn', 'seq': True}],
                         ids=['last', 'sequences', 'bidirectional', 'bi-sequences', 'simple-rnn'])
def test_while_unrolls_to_the_same_values(tmp_path, kw):
    """The WHILE (and Bidirectional's REVERSE_V2) gone, one subgraph, no GATHER or SLICE
    left (the counters folded, the output buffer's slices its parts); ONERT on the
    unrolled graph = ONERT on the WHILE = the model's definition (numpy); the cell's
    weights are one tensor each, read by every step."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', **kw)
    x = np.random.default_rng(1).standard_normal((6, T, F)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(src, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    g, info = _unrolled(src, tmp_path / 'r.circle')
    assert info['loops'] == (2 if kw.get('bi') else 1) and g.n_subgraphs == 1
    assert not {'WHILE', 'GATHER', 'SLICE', 'REVERSE_V2', 'LESS'} & {op.name for op in g.ops}
    np.testing.assert_allclose(onert_infer(tmp_path / 'r.circle', x).reshape(ref.shape), ref,
                               rtol=1e-4, atol=1e-5)
    names = [t.name for t in g.tensors]
    assert names.count('lstm0/MatMul') == names.count('lstm0/MatMul_1') == 1
    fcs = [op for op in g.ops if op.name == 'FULLY_CONNECTED']
    w = names.index('lstm0/MatMul_1')
    assert sum(w in op.inputs for op in fcs) == T - 1     # (step 0's h is zero: folded)


def test_while_trains_one_parameter_per_weight_and_exports_into_the_body(tmp_path):
    """prepare trains the LSTM's three tensors once each (the Keras layer's parameter
    count, no copies); one SGD step moves each by -lr times the finite-difference
    gradient of the model's definition, read from the model `export` writes: the WHILE
    file as it was, the trained values in its body subgraph; ONERT on that file = ONERT
    on the unrolled graph with the run's trained weights."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', seq=True, O=2)
    x = np.random.default_rng(2).standard_normal((8, T, F)).astype(np.float32)
    step = step_is_the_gradient(src, forward, tmp_path, ('lstm0/MatMul', 'lstm0/MatMul_1',
                                                         'lstm0/bias', 'wo', 'bo'), x,
                                exported=True)
    assert {n for n, v in step.items() if np.any(v)} == {'lstm0/MatMul', 'lstm0/MatMul_1',
                                                         'lstm0/bias', 'wo', 'bo'}
    s = prepare(src, os.fspath(tmp_path / 'p'), data=os.fspath(tmp_path / 'd.npz'),
                loss='mse', log=lambda *a: None)
    assert s['trainable_params'] == 4 * H * (F + H + 1) + 2 * (T * H + 1)
    e = read_model(tmp_path / 'e.tflite')
    assert e.n_subgraphs == 3 and [op.name for op in e.ops].count('WHILE') == 1
    g = read_model(tmp_path / 'run' / 'rewritten.circle')
    from host_tools.files.wof import read_wof
    for k, a in read_wof(tmp_path / 'run' / 'trained.wof', g).items():
        g.tensors[k].data = np.asarray(a, np.float32).reshape(g.tensors[k].shape)
    splits_to_slices(g)
    save_graph(g, tmp_path / 't.circle')
    np.testing.assert_allclose(onert_infer(tmp_path / 'e.tflite', x),
                               onert_infer(tmp_path / 't.circle', x), rtol=1e-5, atol=1e-6)


def test_while_then_a_permuted_flatten_exports_into_the_file_as_trained(tmp_path):
    """An LSTM(return_sequences) loop -> Permute((2, 1)) -> Flatten -> Dense: the Dense's
    weight follows the TRANSPOSE, which export writes back with the loop's file as it is
    (its weights in place): one SGD step of each weight, read from the exported file, is
    its gradient.  cancel_transposes had folded the TRANSPOSE into the Dense's weight in
    place (columns permuted), which export then wrote into the file with its TRANSPOSE
    (the step of 'wo' in another column order)."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', seq=True, O=2, permute=True)
    x = np.random.default_rng(2).standard_normal((8, T, F)).astype(np.float32)
    np.testing.assert_allclose(onert_infer(src, x), forward(x.astype(np.float64)),
                               rtol=1e-4, atol=1e-5)
    step_is_the_gradient(src, forward, tmp_path, ('lstm0/MatMul', 'wo'), x, exported=True)
    assert [op.name for op in read_model(tmp_path / 'e.tflite').ops].count('WHILE') == 1


@pytest.mark.parametrize('kw,said', [
    ({'trip': 'runtime'}, r'op 3 WHILE: its trip count is not known before it runs .*'
                          r'unroll=True .*ONNX'),
    ({'body_op': 'SIN'}, r'op 1 is a WHILE .* whose body holds SIN, which utrain cannot .*'
                         r'unroll=True .*ONNX')])
def test_while_that_cannot_unroll_is_refused(tmp_path, kw, said):
    """A loop whose bound is computed at run time, and a body with an op utrain has no
    kernel for: refused, naming the op and what to do."""
    src, _ = build_keras_while_lstm(tmp_path / 'w.tflite', **kw)
    np.savez(tmp_path / 'd.npz', x=np.zeros((4, T, F), np.float32), y=np.zeros((4, O), np.float32))
    with pytest.raises(ValueError, match=said):
        prepare(src, os.fspath(tmp_path / 'o'), data=os.fspath(tmp_path / 'd.npz'), loss='mse',
                log=lambda *a: None)


def test_quantized_loop_body_is_refused_for_int8_training(tmp_path):
    """An int8 body (what a full-integer converter would write; TensorFlow 2.21's
    segfaults on a WHILE LSTM) is not unrolled for int8 training, whose export writes
    subgraph 0 only: refused, naming --dequantize and unroll=True; the float path unrolls
    it."""
    src, _ = build_keras_while_lstm(tmp_path / 'w.tflite')
    g = read_model(src)
    body = g.subgraphs[g.ops[1].options['body_subgraph_index']]
    t = next(t for t in body.tensors if t.name == 'h')
    t.dtype, t.quant = 'int8', {'scale': [0.01], 'zero_point': [0], 'quantized_dimension': 0}
    with pytest.raises(ValueError, match=r'op 1 WHILE: its body is quantized \(h is int8\).*'
                                         r'--dequantize.*unroll=True'):
        rw.rewrite(g, int8=True)
    assert unroll_loops(read_model(src)) == 1


def test_float16_weights_of_a_loop_stay_one_parameter(tmp_path):
    """A body's float16 weights (converter.target_spec.supported_types = [tf.float16]:
    a DEQUANTIZE of each in the body) are dequantized once, not once a step: the unrolled
    graph has no DEQUANTIZE, each weight one float32 tensor, and the model's values."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', f16=True, seq=True)
    g, info = _unrolled(src, tmp_path / 'r.circle')
    assert 'DEQUANTIZE' not in {op.name for op in g.ops} and g.n_subgraphs == 1
    ws = [t for t in g.tensors if t.name.startswith('lstm0/') and t.data is not None]
    assert sorted(t.name for t in ws) == ['lstm0/MatMul', 'lstm0/MatMul_1', 'lstm0/bias']
    assert all(t.dtype == 'float32' for t in ws)
    x = np.random.default_rng(1).standard_normal((6, T, F)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(tmp_path / 'r.circle', x).reshape(ref.shape), ref,
                               rtol=1e-4, atol=1e-5)


def test_evaluate_runs_the_loop_unrolled(tmp_path):
    """`evaluate` scores a WHILE file on its unrolled graph (ONERT 0.1.0 runs TensorFlow's
    Bidirectional LSTM file's two WHILEs 0.38 off TFLite's outputs): the model's values."""
    from host_tools.prepare.infer import predictor
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', bi=True, seq=True)
    run, runtime, _ = predictor(src)
    assert 'loops unrolled' in runtime
    x = np.random.default_rng(1).standard_normal((6, T, F)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(run(x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)


def test_prepares_own_int8_choice_refused_says_nothing_of_the_int8_version(tmp_path):
    """A Keras LSTM (FCs without bias) on a board without ulab: prepare chooses int8 and its
    int8 plan does not fit the budget, so it trains in float32 after all; the lines about
    the int8 version (a zero int32 bias each bias-less FC trains with, 'which export writes')
    are not said, as that version does not train (the float run trains them without one)."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', T=6)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 6, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=forward(x).argmax(1))
    d, none = str(tmp_path / 'd.npz'), lambda *a: None
    # (lr given: prepare's lr probe, most of these four prepares' seconds, does not run;
    # the plans and what prepare says of int8 do not depend on it)
    kw = dict(data=d, epochs=1, board='esp32-psram', lr=0.01)
    h8 = prepare(src, str(tmp_path / 'i'), int8=True, log=none, **kw)['heap']['total']
    hf = prepare(src, str(tmp_path / 'f'), int8=False, log=none, **kw)['heap']['total']
    assert hf + 2048 < h8, (hf, h8)
    said = []
    s = prepare(src, str(tmp_path / 'a'), budget='%dK' % ((hf + h8) // 2048), log=said.append,
                **kw)
    assert not s.get('int8'), said
    text = '\n'.join(map(str, said))
    assert 'prepare chose int8' in text and 'trains in float32 after all' in text, said
    # why int8 is so large (issue 28): the unrolled loop's layers, each a dict and an object
    assert re.search(r'after all: [^\n]*; \d+ int8 layers \(a loop unrolled: \d+ of them are '
                     r'the steps of one op of the file[^\n]*their table and layer objects '
                     r'\d+ KB', text), said
    assert 'zero int32 bias' not in text, said
    said = []
    prepare(src, str(tmp_path / 'b'), int8=True, log=said.append, **kw)
    assert 'zero int32 bias' in '\n'.join(map(str, said)), said    # (int8 trains: said)


def test_bidirectional_with_its_forward_loop_first_trains(tmp_path):
    """A Bidirectional layer whose forward WHILE comes before the backward one's
    REVERSE_V2 in the file (TensorFlow's own files put the backward loop first): the
    forward loop's steps reuse the slices the reversal takes later in the file, and the
    unrolled graph keeps its ops in an order where each comes after what it reads, so the
    run trains (on main: "AttributeError: 'NoneType' object has no attribute 'shape'",
    a traceback from the board's forward) and its model.flat runs the model's values."""
    from host_tools.target import runner
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', bi=True)
    g = read_model(src)
    assert [op.name for op in g.ops].index('WHILE') < [op.name for op in g.ops].index('REVERSE_V2')
    x = np.random.default_rng(1).standard_normal((16, T, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=forward(x.astype(np.float64)).argmax(1))
    d = str(tmp_path / 'run')
    s = prepare(src, d, data=str(tmp_path / 'd.npz'), epochs=1, log=lambda *a: None)
    r = read_model(os.path.join(d, s['rewritten']))
    made = {k: i for i, op in enumerate(r.ops) for k in op.outputs}
    assert all(made.get(k, -1) < i for i, op in enumerate(r.ops) for k in op.inputs)
    code, out = runner.run(d, python=True)
    assert code == 0 and 'end: ok' in out, out


def test_loop_output_given_one_steps_shape_takes_every_steps(tmp_path):
    """A GitHub Keras LSTM(50, return_sequences) -> Flatten -> Dense file: TensorFlow gave
    the loop's output buffer (every step's h) one step's shape [1, 1, 32], and the
    TRANSPOSE after it too; unrolled, the buffer is [T, 1, H], and the RESHAPE after the
    transpose failed in training ('cannot reshape array of size 1600 into shape (1,32)',
    prepare's lr probe and the run).  The ops after the loop take their shapes from it:
    utrain's forward = the model's definition, and it trains."""
    from host_tools.target.runner import run
    from test_parity import new_trainer
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', seq=True, step_shape=True)
    r = np.random.default_rng(1)
    x = r.standard_normal((12, T, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=r.integers(0, O, 12))
    d = os.fspath(tmp_path / 'run')
    prepare(src, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            lr=0.01, epochs=1, log=lambda *a: None)
    tr = new_trainer(os.path.join(d, 'model.flat'), os.path.join(d, 'weights.wof'))
    got = np.stack([np.array(tr.predict(np.ascontiguousarray(x[i].reshape(T, F))), np.float64)
                    .ravel() for i in range(len(x))])
    np.testing.assert_allclose(got, forward(x.astype(np.float64)), rtol=1e-4, atol=1e-5)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
