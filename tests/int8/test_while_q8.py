"""export --quantized of a model whose Keras recurrent layers are WHILE loops (issue 28):
the int8 file keeps the file's WHILE, cond and body subgraphs, its body tensors int8
(prepare/loopq8.py), where it had written the unrolled graph or refused.  References:
TFLite Micro runs the WHILE file (an interpreter of its own, not utrain's code), compared
with utrain's own forward of the run (the integer forward of the trained int8 model, or
the float forward of a run trained dequantized).  The TFLite interpreter (TensorFlow 2.21,
reference kernels) gave the same on TensorFlow's own LSTM, SimpleRNN and Bidirectional
LSTM files: docs/models.md."""
import os

import numpy as np
import pytest

from repo import ROOT  # noqa: F401,E402

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare, export  # noqa: E402
from host_tools.target import runner  # noqa: E402
from kerasgraphs import build_keras_while_lstm  # noqa: E402

T, F = 5, 3
pytest.importorskip('tflite_micro')


def _data(tmp_path, forward, n=48):
    x = np.random.default_rng(0).standard_normal((n, T, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=forward(x.astype(np.float64)).argmax(1))
    return str(tmp_path / 'd.npz'), x


# LR: these tests check what prepare and export write, not the lr: given, prepare's lr
# probe (host_tools/prepare/lrprobe.py, most of each prepare's seconds here) does not run;
# it chooses 0.01 itself on all but the bidirectional LSTM (0.032)
LR = 0.01


def _trained(src, d, data, **kw):
    prepare(src, d, data=data, epochs=1, lr=LR, log=lambda *a: None, **kw)
    code, out = runner.run(d, python=True)
    assert code == 0, out
    return os.path.join(d, 'trained.wof')


def _tflm(path, x):
    from host_tools.prepare.infer import predictor
    run, runtime, _ = predictor(path)
    assert runtime == 'TFLite Micro', runtime
    return np.asarray(run(x), np.float64).reshape(len(x), -1)


def _loops(path):
    """The file's WHILEs with their cond and body subgraphs: [(op, cond, body)]."""
    g = read_model(path)
    return g, [(op, g.subgraphs[op.options['cond_subgraph_index']],
                g.subgraphs[op.options['body_subgraph_index']])
               for op in g.ops if op.name == 'WHILE']


@pytest.mark.parametrize('kw', [{}, {'seq': True}, {'cell': 'rnn'}, {'cell': 'rnn', 'seq': True},
                                {'bi': True}],
                         ids=['last', 'sequences', 'simple-rnn', 'simple-rnn-sequences',
                              'bidirectional'])
def test_int8_run_exports_the_while_file_as_int8(tmp_path, kw):
    """A float WHILE LSTM or SimpleRNN trained as int8 (prepare --int8): export --quantized writes the
    WHILE file (its subgraphs, ops and loop values as they were) with every float tensor
    int8, a loop value one scale on every side of the loop (TFLite's WHILE copies bytes),
    the body's FULLY_CONNECTEDs with the int32 bias the run trained; TFLite Micro on it
    gives utrain's own integer forward of the trained model within a few int8 steps, the
    same class on 44 of 48 samples at least.  On main: 'trained.wof holds 117 buffers,
    the model has 120 tensors'."""
    from host_tools.prepare.quant import export as export_int8
    from host_tools.prepare.exportcheck import _int8_outputs
    import json
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', T=T, O=3, **kw)
    data, x = _data(tmp_path, forward)
    d = str(tmp_path / 'run')
    wof = _trained(src, d, data, int8=True)
    out = str(tmp_path / 'q.tflite')
    r = export(src, wof, out, quantized=True)
    assert r.get('int8'), r
    g, loops = _loops(out)
    f, floops = _loops(src)
    assert [op.name for op in g.ops] == [op.name for op in f.ops] and len(loops) == len(floops)
    assert g.n_subgraphs == f.n_subgraphs
    every = [g] + list(g.subgraphs.values())
    assert not [t.name for s in every for t in s.tensors if t.dtype == 'float32']
    for op, cond, body in loops:
        assert [o.name for o in body.ops] == [o.name for o in floops[0][2].ops]
        for j, k in enumerate(op.inputs):
            sides = [g.tensors[k], g.tensors[op.outputs[j]], body.tensors[body.inputs[j]],
                     body.tensors[body.outputs[j]], cond.tensors[cond.inputs[j]]]
            if sides[0].dtype == 'int8':
                assert len({(t.quant['scale'][0], t.quant['zero_point'][0]) for t in sides}) == 1
        fcs = [o for o in body.ops if o.name == 'FULLY_CONNECTED']
        assert fcs and all(len(o.inputs) > 2 and body.tensors[o.inputs[2]].dtype == 'int32'
                           for o in fcs)
    with open(os.path.join(d, 'prepare.json')) as fh:
        s = json.load(fh)
    unrolled = str(tmp_path / 'u.tflite')       # (the run's trained int8 model, unrolled)
    export_int8(os.path.join(d, 'int8.circle'), wof, unrolled, 'all', s, None, calibrated=True)
    ref = _int8_outputs(unrolled, x.reshape(len(x), -1))
    got = _tflm(out, x)
    step = g.tensors[g.outputs[0]].quant['scale'][0]
    assert np.abs(got - ref).max() <= 8 * step, (np.abs(got - ref).max() / step)
    assert np.mean(np.abs(got - ref)) <= 2 * step
    assert (got.argmax(1) == ref.argmax(1)).sum() >= 44


def test_int8_while_file_trained_dequantized_exports_into_its_body(tmp_path):
    """An int8 WHILE file (what the export above writes; TensorFlow 2.21's full-integer
    converter segfaults on a WHILE LSTM) trains dequantized; export --quantized puts the
    trained weights, at the file's scales, into its body subgraph (every scale and zero
    point as the file's): TFLite Micro on it gives utrain's float forward of the trained
    weights within int8 steps.  On main: 'has no constant tensor ... export the float
    model instead'; --data is refused (the loops' scales are not recalibrated)."""
    from host_tools.prepare.exportcheck import _float_outputs
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', T=T, O=3)
    data, x = _data(tmp_path, forward)
    q8 = str(tmp_path / 'q8.tflite')
    export(src, _trained(src, str(tmp_path / 'a'), data, int8=True), q8, quantized=True)
    d = str(tmp_path / 'run')
    wof = _trained(q8, d, data, dequantize=True)
    out = str(tmp_path / 'e.tflite')
    r = export(q8, wof, out, quantized=True)
    assert any('not recalibrated' in n for n in r['notes']), r
    g, loops = _loops(out)
    g0, loops0 = _loops(q8)
    body, body0 = loops[0][2], loops0[0][2]
    moved = [t.name for t, t0 in zip(body.tensors, body0.tensors) if t.data is not None
             and not np.array_equal(t.data, t0.data)]
    assert 'lstm0/MatMul' in moved and 'lstm0/bias' in moved, moved
    assert [t.quant for t in body.tensors] == [t.quant for t in body0.tensors]
    ref = _float_outputs(d, wof, x)
    got = _tflm(out, x)
    step = g.tensors[g.outputs[0]].quant['scale'][0]
    assert np.abs(got - ref).max() <= 8 * step, (np.abs(got - ref).max() / step)
    assert (got.argmax(1) == ref.argmax(1)).sum() >= 44
    with pytest.raises(ValueError, match=r'--data .*WHILE; leave --data out'):
        export(q8, wof, str(tmp_path / 'f.tflite'), quantized=True, data=data)
    assert not os.path.exists(tmp_path / 'f.tflite')


def test_float_while_run_quantized_says_prepare_int8(tmp_path):
    """A float WHILE model trained in float32: no int8 file to write into: refused,
    saying that prepare --int8 gives an int8 export (it had said 'has no constant tensor
    lstm0/MatMul_1', a name the user never gave)."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', T=T, O=3)
    data, _ = _data(tmp_path, forward, 8)
    wof = _trained(src, str(tmp_path / 'run'), data, int8=False)
    with pytest.raises(ValueError, match=r'w.tflite: --quantized needs the quantized model .*'
                                         r'prepare it with --int8'):
        export(src, wof, str(tmp_path / 'q.tflite'), quantized=True)


def test_loop_file_the_int8_model_does_not_fit_is_refused(tmp_path):
    """Where the trained int8 model has no faithful place in the WHILE file (here: an op
    it runs that the file has no op for), loopq8 refuses, naming the file and what to do
    instead, and writes nothing."""
    from host_tools.graph.inout import save_graph
    from host_tools.graph.loops import unroll_loops
    from host_tools.prepare.loopq8 import write_int8_loops
    src, _ = build_keras_while_lstm(tmp_path / 'w.tflite', T=T, O=3)
    u = read_model(src)
    unroll_loops(u)
    u.ops[-1].name, u.ops[-1].options = 'QUANTIZE', {}    # (an op the file lacks)
    save_graph(u, tmp_path / 'u.circle')
    with pytest.raises(ValueError, match=r'w.tflite: export --quantized cannot write its WHILE '
                                         r'loops as int8 \(the int8 model has QUANTIZE.*\); '
                                         r'export without --quantized writes .*float32.*unroll=True'):
        write_int8_loops(src, str(tmp_path / 'u.circle'), str(tmp_path / 'o.tflite'))
    assert not os.path.exists(tmp_path / 'o.tflite')


def test_int8_version_of_a_loop_has_one_scale_a_body_tensor(tmp_path):
    """prepare --int8 of a WHILE LSTM calibrates each body tensor at one range over its
    unrolled steps (the loop file has one tensor for all of them), so the recurrent FCs
    read h at one scale and train one zero bias, as the body's one FC: the int8 model
    the run trains is the one export writes into the loop.  On main each step had its
    own scale (h 0.0061..0.0074 over 5 steps) and the recurrent FC T-1 biases."""
    import re
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', T=T, O=3)
    data, _ = _data(tmp_path, forward)
    d = str(tmp_path / 'run')
    prepare(src, d, data=data, epochs=1, int8=True, lr=LR, log=lambda *a: None)
    g = read_model(os.path.join(d, 'int8.circle'))
    steps = {}
    for t in g.tensors:
        m = re.fullmatch(r'(.+)/t\d+', t.name)
        if m and t.dtype == 'int8':
            steps.setdefault(m.group(1), set()).add((t.quant['scale'][0], t.quant['zero_point'][0]))
    assert {'h', 'c', 'sum', 'mm_h'} <= set(steps), sorted(steps)
    assert all(len(v) == 1 for v in steps.values()), steps
    biases = [op.inputs[2] for op in g.ops if op.name == 'FULLY_CONNECTED'
              and g.tensors[op.inputs[1]].name == 'lstm0/MatMul_1']
    assert len(biases) == T - 1 and len(set(biases)) == 1, biases


def test_int8_run_of_an_unrolled_lstm_exports_quantized(tmp_path):
    """An LSTM unrolled in the file (what Keras's unroll=True writes: here the WHILE
    builder's graph unrolled and saved) trained as int8: each step's recurrent FC reads h
    at its own scale and trains a zero bias of its own; export --quantized writes the
    trained int8 model (on main: 'trained.wof holds 118 buffers, the model has 121
    tensors' or so, rewrite's second pass over int8.circle had copied the shared recurrent
    weight a step), whose TFLite Micro outputs are utrain's own integer forward's."""
    from host_tools.graph.inout import save_graph
    from host_tools.graph.rewrite import rewrite
    from host_tools.prepare.exportcheck import _int8_outputs
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', T=T, O=3)
    g = read_model(src)
    rewrite(g)
    save_graph(g, tmp_path / 'u.tflite')
    assert g.n_subgraphs == 1
    data, x = _data(tmp_path, forward)
    u = str(tmp_path / 'u.tflite')
    wof = _trained(u, str(tmp_path / 'run'), data, int8=True)
    out = str(tmp_path / 'q.tflite')
    assert export(u, wof, out, quantized=True).get('int8')
    ref = _int8_outputs(out, x.reshape(len(x), -1))
    got = _tflm(out, x)
    step = read_model(out).tensors[read_model(out).outputs[0]].quant['scale'][0]
    assert np.abs(got - ref).max() <= 2 * step


def _unrolled_int8(tmp_path, **kw):
    """(run folder, the unrolled int8 file quant.export writes of it, samples, the float
    forward) of build_keras_while_lstm(**kw) prepared --int8 and trained one epoch."""
    from host_tools.prepare.quant import export as export_int8
    import json
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', T=T, O=3, **kw)
    data, x = _data(tmp_path, forward)
    d = str(tmp_path / 'run')
    prepare(src, d, data=data, epochs=1, int8=True, lr=LR, log=lambda *a: None)
    with open(os.path.join(d, 'prepare.json')) as fh:
        s = json.load(fh)
    unrolled = str(tmp_path / 'u.tflite')
    export_int8(os.path.join(d, 'int8.circle'), os.path.join(d, 'weights.wof'), unrolled, 'all',
                s, None, calibrated=True)
    return d, unrolled, x, forward


@pytest.mark.parametrize('kw', [{}, {'seq': True}, {'bi': True}],
                         ids=['last', 'sequences', 'bidirectional'])
def test_int8_version_of_a_gru_reads_the_zero_state_at_its_steps_scale(tmp_path, kw):
    """A loop whose recurrent FC has a bias (Keras's GRU with reset_after) taken to int8:
    its first step applies that FC to the zero state, a constant, which shares the FC's
    weight and int32 bias with the later steps, whose input is h.  The int32 bias is at
    h's scale x the weight's; the constant had its own scale (1.0 for zeros), so the
    first step's output was the bias / h's scale: utrain's int8 forward of the untrained
    model was 0.13 (last step), 0.63 (sequences), 0.12 (bidirectional) mean off the float
    logits, where an LSTM's without that bias is 0.02-0.04.  Now the constant takes h's
    scale: within 0.06."""
    from host_tools.prepare.exportcheck import _int8_outputs
    _, unrolled, x, forward = _unrolled_int8(tmp_path, fc_bias=True, **kw)
    got = _int8_outputs(unrolled, x.reshape(len(x), -1))
    ref = forward(x.astype(np.float64)).reshape(len(x), -1)
    assert np.mean(np.abs(got - ref)) < 0.06, np.mean(np.abs(got - ref))


@pytest.mark.parametrize('kw', [{}, {'cell': 'rnn'}, {'fc_bias': True}, {'fc_bias': True, 'seq': True},
                                {'bi': True}],
                         ids=['lstm', 'simple-rnn', 'gru-like', 'gru-like-sequences', 'bidirectional'])
def test_int8_loop_biases_are_at_input_times_weight_scale(tmp_path, kw):
    """The int8 model prepare --int8 calibrates from a WHILE file (unrolled) and the
    file export --quantized writes of it: every FULLY_CONNECTED's int32 bias has the
    scales of its weight (one for a per-tensor weight, as TFLite's converter writes it;
    the zero bias the int8 path gives Keras's cell FCs had one a channel, which XNNPack,
    the TFLite interpreter's default, refuses: 'failed to delegate FULLY_CONNECTED'),
    one zero point a scale (the bias had one scale and a zero point a channel), and its
    scale is input scale x weight scale within TFLite's 1e-6 (the steps sharing one bias
    read h at two scales: a Keras GRU's second step reads the first's output, another body
    tensor than the later steps' h, 1.03x off)."""
    d, unrolled, _, _ = _unrolled_int8(tmp_path, **kw)
    bad, n = [], 0
    for path in (os.path.join(d, 'int8.circle'), unrolled):
        g = read_model(path)
        for op in g.ops:
            if op.name != 'FULLY_CONNECTED' or len(op.inputs) < 3 or op.inputs[2] < 0:
                continue
            xq, wq, bq = (g.tensors[op.inputs[i]].quant for i in range(3))
            want = np.float32(xq['scale'][0]) * np.float32(wq['scale'])
            sb = np.asarray(bq['scale'], np.float32)
            n += 1
            if len(sb) != len(want) or len(bq['zero_point']) != len(sb) or \
                    np.abs(sb - want).max() > 1e-6 * want.min():
                bad.append((os.path.basename(path), op.number, g.tensors[op.inputs[2]].name,
                            len(sb), len(want), len(bq['zero_point']), float((sb / want).max())))
    assert n >= 2 * T and not bad, bad
