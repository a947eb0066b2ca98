"""Float models trained in integers (issue 33, host_tools/prepare/fromfloat.py): prepare's choice
and what it says, the calibrated int8 version training on unix MicroPython bit for bit as
the host's numpy trainer and near the float run's accuracy, and the export read by ONERT
(float32 again) and TFLite Micro (--quantized)."""
import json
import os
import shutil

import numpy as np
import pytest

from repo import ROOT, assert_same_logs, board_and_host_runs, no_keep_best
from kerasgraphs import (build_keras_shapes, build_keras_normalized, build_keras_float_embedding,
                         build_divided, build_clipped, build_constant_op, build_const_state_rnn,
                         build_keras_while_lstm)
from host_tools.prepare import fromfloat
from host_tools.target import runner
from host_tools.formats.circle_io import read_model
from host_tools.prepare.pipeline import prepare, export, PrepareError

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
MLP = os.path.join(DIGITS, 'digits_mlp.circle')
MP = runner.find_micropython()
KW = dict(loss='scce', optimizer='sgd', lr=0.05, batch=1)


def _digits(tmp_path, n, cnn=False):
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    p = str(tmp_path / f'd{n}.npz')
    x = z['x'][:n]
    np.savez(p, x=x.reshape(-1, 8, 8, 1) if cnn else x, y=z['y'][:n])
    return p


def _accs(text):
    return [float(v.split('test_accuracy ')[1].split()[0]) for v in text.splitlines()
            if v.startswith('epoch ')]


def test_prepare_chooses_int8_for_a_board_without_ulab_and_says_how_to_keep_float(tmp_path):
    data = _digits(tmp_path, 40)
    said = []
    s = prepare(MLP, str(tmp_path / 'a'), data=data, epochs=1, board='rp2040', log=said.append,
                **KW)
    assert s['int8'] and s['from_float']['samples'] == 40
    line = [v for v in said if 'prepare chose int8 training' in v]
    assert len(line) == 1 and line[0].startswith(MLP) and '--float32' in line[0], said
    assert '--board rp2040 without ulab' in line[0] and 'float32 again' in line[0]
    assert os.path.exists(tmp_path / 'a' / fromfloat.INT8_MODEL)
    cfg = json.loads((tmp_path / 'a' / 'train.json').read_text())
    assert cfg['files']['model'] == 'q8.json'
    # float32 kept: asked, with ulab, without a board, or with settings the int8 path lacks
    for kw in (dict(board='rp2040', int8=False), dict(board='rp2040', backend='ulab'), {},
               dict(board='rp2040', optimizer='rmsprop')):
        said = []
        s = prepare(MLP, str(tmp_path / 'b'), data=data, epochs=1, log=said.append,
                    **dict(KW, **kw))
        assert not s.get('int8') and not any('int8' in v for v in said), (kw, said)
    with pytest.raises(PrepareError, match=r'--int8 cannot train it as int8: --loss mse'):
        prepare(MLP, str(tmp_path / 'c'), data=data, int8=True, log=lambda *a: None,
                **dict(KW, loss='mse'))
    with pytest.raises(PrepareError, match=r'no --data to calibrate'):
        prepare(MLP, str(tmp_path / 'c'), int8=True, log=lambda *a: None, **KW)


def test_int8_from_float_names_the_files_op_numbers_and_what_to_do(tmp_path):
    """A float model the rewrites shorten (Keras 3's run-time shape chain folded, its
    global max a pool): what prepare --int8 says of an op names it by its number in the
    user's file, not the rewritten graph's; a refusal names the file once, says why and
    what trains it (without --int8: float32)."""
    src, _ = build_keras_shapes(tmp_path / 'k.tflite')
    names = [op.name for op in read_model(src).ops]
    fc = names.index('FULLY_CONNECTED')
    xs = np.random.default_rng(2).standard_normal((32, 12, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.arange(32) % 3)
    said = []
    s = prepare(src, str(tmp_path / 'o'), data=str(tmp_path / 'd.npz'), epochs=1, int8=True,
                from_logits=True, train='all', log=said.append, **KW)
    assert s.get('int8'), said
    assert any(f'op {fc} FULLY_CONNECTED has no bias tensor' in x for x in said), (fc, said)
    with pytest.raises(PrepareError) as e:
        prepare(src, str(tmp_path / 'p'), data=str(tmp_path / 'd.npz'), int8=True,
                log=lambda *a: None, **dict(KW, loss='mse'))
    msg = str(e.value)
    assert msg.count(src) == 1 and msg.count('cannot train it as int8') == 1, msg
    assert msg.endswith('without --int8 it trains in float32'), msg


def test_int8_from_float_refusal_of_an_op_form_says_float32_not_dequantize(tmp_path):
    """A float model with an op of a form the int8 path refuses (a PAD of three axes, which
    int8 training cannot place as rows of one stride; a MEAN over the channels of [1, T, C]
    was the example until int8 training took it, quant._trailing_means): prepare --int8
    refuses saying float32 trains it, not the '--dequantize' an int8 file's refusal gives
    (a float model has nothing to dequantize); without --int8 it trains in float32 and
    says why not as int8."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(5)
    b = CircleBuilder(identifier=b'TFL3')
    x, p, f = b.tensor('x', [1, 4, 4, 2]), b.tensor('pd', [1, 6, 6, 4]), b.tensor('f', [1, 144])
    b.op('PAD', [x, b.tensor('pads', [4, 2], data=np.array([[0, 0], [1, 1], [1, 1], [1, 1]], np.int32))], [p])
    b.op('RESHAPE', [p, b.tensor('rs', [2], data=np.array([1, 144], np.int32))], [f])
    y = b.tensor('y', [1, 3])
    b.op('FULLY_CONNECTED', [f, b.tensor('w', (3, 144), data=r.standard_normal((3, 144)).astype(np.float32)),
                             b.tensor('bi', [3], data=np.zeros(3, np.float32))], [y])
    b.inputs(x)
    b.outputs(y)
    src = b.save(str(tmp_path / 'mn.tflite'))
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((16, 4, 4, 2)).astype(np.float32), y=np.arange(16) % 3)
    with pytest.raises(PrepareError) as e:
        prepare(src, str(tmp_path / 'p'), data=str(tmp_path / 'd.npz'), int8=True, from_logits=True,
                log=lambda *a: None, **KW)
    msg = str(e.value)
    assert 'PAD op 0' in msg and 'dequantize' not in msg, msg
    assert msg.endswith('without --int8 it trains in float32'), msg
    said = []
    prepare(src, str(tmp_path / 'q'), data=str(tmp_path / 'd.npz'), board='rp2040', from_logits=True,
            log=said.append, **KW)
    why = [w for w in said if 'int8 from float does not take it' in w]
    assert why and 'PAD op 0' in why[0] and 'dequantize' not in why[0], said


def test_calibrated_int8_model_computes_the_float_model(tmp_path):
    """The int8 version's dequantized weights are the float weights within half a weight
    step, and its logits (TFLite Micro's integers, utrain.q8) rank the classes as the
    float model's on most samples."""
    data = _digits(tmp_path, 200)
    prepare(MLP, str(tmp_path / 'q'), data=data, epochs=1, int8=True, log=lambda *a: None, **KW)
    g8 = read_model(str(tmp_path / 'q' / fromfloat.INT8_MODEL))
    gf = read_model(MLP)
    for op in gf.ops:
        if op.name != 'FULLY_CONNECTED':
            continue
        w, b = (gf.tensors[k].data for k in op.inputs[1:3])
        w8, b8 = (g8.tensors[k] for k in op.inputs[1:3])
        sw = w8.quant['scale'][0]
        assert np.abs(w8.data * sw - w).max() <= sw / 2 + 1e-7
        assert np.abs(b8.data * np.asarray(b8.quant['scale']) - b).max() < 1e-5
    from host_tools.prepare.exportcheck import _int8_outputs, _float_outputs
    x = np.load(data)['x'][:50]
    with open(tmp_path / 'q' / 'prepare.json') as f:
        assert json.load(f)['from_float']['int8_model'] == fromfloat.INT8_MODEL
    shutil.copy(str(tmp_path / 'q' / fromfloat.INT8_MODEL), str(tmp_path / 'm8.tflite'))
    q = _int8_outputs(str(tmp_path / 'm8.tflite'), x)
    f = prepare(MLP, str(tmp_path / 'f'), data=data, epochs=1, int8=False, log=lambda *a: None,
                **KW)
    assert not f.get('int8')
    fl = _float_outputs(str(tmp_path / 'f'), str(tmp_path / 'f' / 'weights.wof'), x)
    assert np.mean(q.argmax(1) == fl.argmax(1)) >= 0.9


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_int8_from_float_trains_on_micropython_as_on_the_host(tmp_path):
    """The auto-quantized digits MLP on unix MicroPython (viper kernels) and on the host's
    numpy trainer (the same code under CPython): the same trained bytes and log (its
    figures to the last printed digit: a 32-bit board prints its float32 values through
    MicroPython's own formatter, a digit off exact for ~9 % of them)."""
    data = _digits(tmp_path, 60)
    outs = []
    for py in (False, True):
        d = str(tmp_path / ('py' if py else 'mp'))
        prepare(MLP, d, data=data, test_split=0.25, epochs=2, board='rp2040',
                log=lambda *a: None, **dict(KW, lr=0.02))
        code, out = runner.run(d, python=py, stream=False)
        assert code == 0, out
        with open(os.path.join(d, 'trained.wof'), 'rb') as f:
            outs.append((f.read(), [v.split(',')[1:5] for v in
                                    open(os.path.join(d, 'train.log')).read().splitlines()]))
    assert outs[0][0] == outs[1][0]
    (a, b) = (o[1] for o in outs)
    assert len(a) > 2, a
    assert_same_logs(a, b)


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_int8_from_float_learns_near_float_and_exports(tmp_path):
    """The digits MLP from its untrained weights: the int8 run (unix MicroPython) ends
    within a few points of the float run (host) on 100 held-out samples, its loss falls;
    export writes a float model ONERT reads with the int8 run's accuracy, and with
    --quantized the int8 model TFLite Micro reads."""
    data = _digits(tmp_path, 400)
    acc = {}
    for kind in ('int8', 'float32'):
        d = str(tmp_path / kind)
        prepare(MLP, d, data=data, test_split=0.25, epochs=4, int8=kind == 'int8',
                log=lambda *a: None, **dict(KW, lr=0.02))
        code, out = runner.run(d, python=kind == 'float32', stream=False)
        assert code == 0, out
        acc[kind] = _accs(out)
        if kind == 'int8':
            loss = [float(v.split(' loss ')[1].split()[0]) for v in out.splitlines()
                    if v.startswith('epoch ')]
            assert loss[-1] < 0.6 * loss[0], out
    assert acc['int8'][-1] >= acc['float32'][-1] - 0.04, acc
    assert acc['int8'][-1] > 0.85, acc
    from host_tools.prepare.infer import evaluate
    out = str(tmp_path / 'trained.circle')
    r = export(MLP, str(tmp_path / 'int8' / 'trained.wof'), out)
    assert r.get('dequantized_from_int8') and read_model(out).tensors[1].dtype == 'float32'
    x, y = np.load(data)['x'], np.load(data)['y']
    np.savez(str(tmp_path / 'all.npz'), x=x, y=y)
    ev = evaluate(out, str(tmp_path / 'all.npz'))
    assert ev['runtime'] == 'ONERT' and ev['accuracy'] > 0.85, ev
    pytest.importorskip('tflite_micro')
    q = str(tmp_path / 'trained.tflite')
    export(MLP, str(tmp_path / 'int8' / 'trained.wof'), q, quantized=True)
    ev8 = evaluate(q, str(tmp_path / 'all.npz'))
    assert ev8['runtime'] == 'TFLite Micro' and abs(ev8['accuracy'] - ev['accuracy']) < 0.03


@pytest.mark.slow
@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_int8_from_float_trains_in_its_planned_heap(tmp_path):
    """The digits MLP trained as int8 from float trains in the heap prepare planned for
    it (unix MicroPython, -X heapsize) and not in the plan / 1.3."""
    from host_tools.plan.memory import trains_in
    out = str(tmp_path / 'q')
    s = prepare(MLP, out, data=_digits(tmp_path, 12), test_split=0.25, epochs=1, int8=True,
                log=lambda *a: None, **KW)
    no_keep_best(out)
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), plan
    assert not trains_in(out, int(plan / 1.3)), plan


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_bench_fromfloat_accuracy_table_quick(capsys):
    """python -m bench.fromfloat --accuracy --quick --models mlp prints its table: a row
    with the int8 and float32 accuracies and their differences (last epoch, all epochs)."""
    from bench import fromfloat as bf
    bf.main(['--accuracy', '--quick', '--models', 'mlp'])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith('| digits MLP')]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].strip('|').split('|')]
    q, f, d = float(cells[3]), float(cells[4]), float(cells[5])
    assert q > 0.5 and f > 0.5 and abs(100 * (q - f) - d) < 0.051
    assert abs(float(cells[6])) < 50          # the difference over all epochs, in points


def test_bench_sensor_task_prepares_as_int8_with_ranges_that_follow(tmp_path):
    """bench.fromfloat's untuned task: its 1-D CNN (CONV_2D 5x1, 3x1 over a 3-axis
    window) and its samples prepare as int8 from float, every weighted layer's range
    marked to follow training (utrain/q8range.py); the classes differ (a float model
    could learn them: the mean windows of two classes are apart)."""
    from bench import fromfloat as bf
    npz = str(tmp_path / 'sensor.npz')
    bf.data('sensor 1-D conv', 80, npz)
    z = np.load(npz)
    assert z['x'].shape == (80, bf.SENSOR_T, 1, bf.SENSOR_C) and set(z['y']) == {0, 1, 2, 3}
    energy = [np.abs(np.diff(z['x'][z['y'] == k], axis=1)).mean() for k in range(4)]
    assert energy[0] < energy[2], energy        # still < running: the steps' frequencies
    s = prepare(bf.model_path('sensor 1-D conv', str(tmp_path)), str(tmp_path / 'q'), data=npz,
                test_split=0.25, epochs=1, int8=True, log=lambda *a: None, **KW)
    assert s['int8']
    m = json.loads((tmp_path / 'q' / 'q8.json').read_text())
    assert [p for p, _, _ in m['rr'][2]] == [0, 2, 4]


def test_a_layer_without_bias_is_calibrated_and_trains_as_int8(tmp_path):
    """A float Keras 3 model whose FC has no bias (use_bias=False), trained as int8: its
    weights get their scale from the float weights as every layer's (they were left at a
    placeholder scale of 1, quantized to zeros: the held-out sensor net's int8 version
    started at a uniform softmax and learnt nothing), and its logits follow the float
    model's (TFLite Micro on the calibrated int8 model)."""
    from tflite_micro.python.tflite_micro import runtime
    src, forward = build_keras_shapes(tmp_path / 'k.tflite')
    r = np.random.default_rng(3)
    xs = r.standard_normal((40, 12, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.arange(40) % 3)
    s = prepare(src, str(tmp_path / 'q'), data=str(tmp_path / 'd.npz'), epochs=1, int8=True,
                loss='scce', from_logits=True, optimizer='sgd', lr=0.01, train='all',
                log=lambda *a: None)
    assert s['int8']
    g8 = read_model(str(tmp_path / 'q' / fromfloat.INT8_MODEL))
    fc = next(op for op in g8.ops if op.name == 'FULLY_CONNECTED')
    w = g8.tensors[fc.inputs[1]]
    assert np.abs(w.data).max() >= 127 // fromfloat.WEIGHT_HEADROOM - 1
    it = runtime.Interpreter.from_file(str(tmp_path / 'q' / fromfloat.INT8_MODEL))
    xq_s, xq_z = g8.tensors[g8.inputs[0]].quant['scale'][0], g8.tensors[g8.inputs[0]].quant['zero_point'][0]
    y = g8.tensors[g8.outputs[0]].quant
    got, ref = [], forward(xs[:20].astype(np.float64))
    for x in xs[:20]:
        it.set_input(np.clip(np.round(x / xq_s) + xq_z, -128, 127).astype(np.int8)[None], 0)
        it.invoke()
        got.append((it.get_output(0).ravel().astype(np.float64) - y['zero_point'][0]) * y['scale'][0])
    got = np.array(got)
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.95


def _tanh_concat_model(path, seed=0, I=6, H=5, O=3):
    """A float Keras-style model with branches (issue 28's held-out 'branch'): FC RELU6
    and FC -> TANH, CONCATENATION of the two, FC -> LOGISTIC -> RESHAPE -> FC -> SOFTMAX.
    Returns (path, numpy forward: probabilities)."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(seed)
    w = {n: (0.6 * rng.standard_normal(s)).astype(np.float32) for n, s in (
        ('wa', (H, I)), ('ba', (H,)), ('wt', (H, I)), ('bt', (H,)), ('wg', (H, 2 * H)),
        ('bg', (H,)), ('wo', (O, H)), ('bo', (O,)))}
    b = CircleBuilder(identifier=b'TFL3')
    t = {n: b.tensor(n, list(v.shape), data=v) for n, v in w.items()}
    x, a, z, h, c, gz, g, r, lo, y = (b.tensor(n, s) for n, s in (
        ('x', [1, I]), ('a', [1, H]), ('z', [1, H]), ('h', [1, H]), ('c', [1, 2 * H]),
        ('gz', [1, H]), ('g', [1, H]), ('r', [1, 1, H]), ('lo', [1, O]), ('y', [1, O])))
    b.op('FULLY_CONNECTED', [x, t['wa'], t['ba']], [a], fused_activation_function='RELU6')
    b.op('FULLY_CONNECTED', [x, t['wt'], t['bt']], [z])
    b.op('TANH', [z], [h])
    b.op('CONCATENATION', [a, h], [c], axis=1)
    b.op('FULLY_CONNECTED', [c, t['wg'], t['bg']], [gz])
    b.op('LOGISTIC', [gz], [g])
    b.op('RESHAPE', [g], [r], new_shape=[1, 1, H])
    b.op('FULLY_CONNECTED', [r, t['wo'], t['bo']], [lo])
    b.op('SOFTMAX', [lo], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs):
        f = {n: v.astype(np.float64) for n, v in w.items()}
        a_ = np.clip(xs @ f['wa'].T + f['ba'], 0, 6)
        h_ = np.tanh(xs @ f['wt'].T + f['bt'])
        g_ = 1 / (1 + np.exp(-(np.concatenate([a_, h_], 1) @ f['wg'].T + f['bg'])))
        e = np.exp(g_ @ f['wo'].T + f['bo'])
        return e / e.sum(1, keepdims=True)
    return os.fspath(path), forward


def test_tanh_and_sigmoid_calibrate_at_tflites_fixed_scales(tmp_path):
    """A float model calibrated as int8 (the default on an rp2040 without ulab) gave its
    TANH and LOGISTIC outputs, and every tensor tied to them (a RESHAPE after, a
    CONCATENATION reading one), the placeholder scale 1.0: a tanh at three levels, and a
    RELU6 branch concatenated with it at seven (held-out Keras models: the run's accuracy
    before training fell from 0.325 to 0.175; the int8 export scored cross-entropy 13.5
    under TFLite Micro).  Now TANH is at TFLite's 1/128 and LOGISTIC at 1/256, the tensors
    tied to them share it, and a fixed output a CONCATENATION reads is requantized by a
    QUANTIZE (as TFLite's converter writes it); TFLite Micro on the calibrated model gives
    the float model's probabilities (numpy) within int8's steps."""
    from host_tools.prepare.exportcheck import _int8_outputs
    src, forward = _tanh_concat_model(tmp_path / 'tc.tflite')
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.5, 1.5, (60, 6)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=forward(x.astype(np.float64)).argmax(1))
    prepare(src, str(tmp_path / 'q'), data=str(tmp_path / 'd.npz'), epochs=1, int8=True,
            log=lambda *a: None, **KW)
    g8 = read_model(str(tmp_path / 'q' / fromfloat.INT8_MODEL))
    q = {g8.tensors[k].name: g8.tensors[k].quant for op in g8.ops for k in op.outputs}
    assert q['h']['scale'] == [1 / 128] and q['g']['scale'] == [1 / 256] == q['r']['scale']
    cat = next(op for op in g8.ops if op.name == 'CONCATENATION')
    assert len({tuple(g8.tensors[k].quant['scale']) for k in cat.inputs + cat.outputs}) == 1
    assert [op.name for op in g8.ops].count('QUANTIZE') == 1
    shutil.copy(str(tmp_path / 'q' / fromfloat.INT8_MODEL), str(tmp_path / 'm8.tflite'))
    got = _int8_outputs(str(tmp_path / 'm8.tflite'), x)
    ref = forward(x.astype(np.float64))
    assert np.abs(got - ref).max() < 0.05, np.abs(got - ref).max()
    assert np.mean(got.argmax(1) == ref.argmax(1)) >= 0.95


def test_prepares_own_int8_choice_over_the_budget_trains_in_float32(tmp_path):
    """prepare's own choice of int8 (a board without ulab: an ESP32 with PSRAM, whose 4 MB heap
    the budget bounds) whose int8 plan the budget does not
    fit, where the float32 plan does, trains in float32 and says why, naming the int8 plan and
    the options it would fit with; --int8 asked still refuses with that advice."""
    data = _digits(tmp_path, 40)
    h8 = prepare(MLP, str(tmp_path / 'i'), data=data, epochs=1, board='esp32-psram', int8=True,
                 log=lambda *a: None, **KW)['heap']['total']
    hf = prepare(MLP, str(tmp_path / 'f'), data=data, epochs=1, board='esp32-psram', int8=False,
                 log=lambda *a: None, **KW)['heap']['total']
    assert hf + 2048 < h8, (hf, h8)     # (int8's code: the kernels beside the trainer)
    # (the float32 plan itself: int8 may fit a budget between the two by giving up its
    # scale growth, q8grow, which prepare does; here not even that fits.  Since session 32
    # int8 without growth plans within bytes of float32 here (its set-up code loads for
    # the call), so the budget is the float32 plan, not a little over it)
    budget = str(hf)
    said = []
    s = prepare(MLP, str(tmp_path / 'a'), data=data, epochs=1, board='esp32-psram', budget=budget,
                log=said.append, **KW)
    assert not s.get('int8') and s['heap']['total'] <= hf, s['heap']['total']
    line = [v for v in said if 'trains in float32 after all' in v]
    assert len(line) == 1 and line[0].startswith(MLP) and f'needs about {h8 // 1024} KB' in line[0] \
        and '--int8' in line[0], said
    cfg = json.loads((tmp_path / 'a' / 'train.json').read_text())
    assert cfg['files']['model'] != 'q8.json'
    assert not os.path.exists(tmp_path / 'a' / fromfloat.INT8_MODEL)
    with pytest.raises(PrepareError, match=r'training as int8 needs about'):
        prepare(MLP, str(tmp_path / 'b'), data=data, epochs=1, board='esp32-psram', budget=budget,
                int8=True, log=lambda *a: None, **KW)
    # a budget neither fits: the int8 refusal, its advice, and the float32 plan's line
    with pytest.raises(PrepareError, match=r'training as int8 needs about[^$]*\n  in float32 '
                       r'\(--float32\), training needs about'):
        prepare(MLP, str(tmp_path / 'c'), data=data, epochs=1, board='esp32-psram',
                budget='%dK' % (hf // 2048), log=lambda *a: None, **KW)
    assert not os.path.exists(tmp_path / 'c' / 'train.json')


def _scce(logits, y):
    z = logits - logits.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def _int8_prepared(tmp_path, src, data):
    """Float model src prepared --int8 on data (test split 0.25, 3 epochs, --train all,
    every epoch's weights kept): (folder, its int8 graph, the float graph)."""
    o = str(tmp_path / 'q')
    s = prepare(src, o, data=data, test_split=0.25, epochs=3, int8=True, from_logits=True,
                train='all', log=lambda *a: None, **dict(KW, lr=0.02))
    assert s['int8']
    no_keep_best(o)
    return o, read_model(os.path.join(o, fromfloat.INT8_MODEL)), read_model(src)


def _learns_from_numpys_loss(tmp_path, o, src, forward, x, y, frozen=None):
    """The int8 run prepared in o (test split 0.25) on the host: its epoch-0 test loss is
    the float model's (numpy forward), it learns; with frozen ({name: the file's
    constant}), export writes the trained model in float32 again with those constants
    as the file has them, scoring the run's last test loss."""
    from host_tools.files.dataset import split
    from host_tools.prepare.infer import evaluate
    code, out = runner.run(o, python=True, stream=False)
    assert code == 0, out
    rows = [v.split(',') for v in open(os.path.join(o, 'train.log')).read().split()[1:]]
    te = split(len(x), 0.25, 0)[1]
    ref = _scce(forward(x[te].astype(np.float64)), y[te])
    assert abs(float(rows[0][3]) - ref) < 0.03 + 0.03 * ref, (rows[0], ref)
    assert float(rows[-1][3]) < 0.8 * float(rows[0][3]), rows
    if frozen is None:
        return
    export(src, os.path.join(o, 'trained.wof'), str(tmp_path / 'out.tflite'))
    got = {t.name: t.data for t in read_model(str(tmp_path / 'out.tflite')).tensors if t.name in frozen}
    assert set(got) == set(frozen) and all(np.array_equal(got[k], v) for k, v in frozen.items())
    np.savez(tmp_path / 't.npz', x=x[te], y=y[te])
    got = evaluate(str(tmp_path / 'out.tflite'), str(tmp_path / 't.npz'))['loss']
    assert abs(got - float(rows[-1][3])) < 0.03 + 0.03 * got, (got, rows[-1])


def _normalized_or_embedding(tmp_path, kind, bias, n=96):
    """A float model the test builds, Keras's Normalization at the input and mid-network
    ('norm') or an Embedding ('emb'), with or without biases, and its data (labels a
    teacher's: learnable).  Returns (path, numpy forward: logits, data path, x, y)."""
    r = np.random.default_rng(5)
    if kind == 'norm':
        src, forward, make_x = build_keras_normalized(tmp_path / 'n.tflite', bias=bias)
        x = make_x(n)
        t = r.standard_normal((3, x.shape[1]))
        y = ((x - x.mean(0)) / x.std(0) @ t.T).argmax(1)
    else:
        src, E, forward = build_keras_float_embedding(tmp_path / 'e.tflite', bias=bias)
        x = r.integers(0, len(E), (n, 5)).astype(np.float32)
        y = np.minimum((x < 3).sum(1), 2)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    return src, forward, str(tmp_path / 'd.npz'), x, y


@pytest.mark.parametrize('kind,bias', [('norm', True), ('norm', False), ('emb', True), ('emb', False)])
def test_normalization_and_embedding_of_a_float_model_train_as_int8(tmp_path, kind, bias):
    """prepare --int8 had refused a float Keras model with a Normalization layer ("constant
    ... is not the weight or bias of a FULLY_CONNECTED ...") or an Embedding (its table):
    a Normalization's mean and 1 / std (SUB, MUL by constants, at the input and
    mid-network) become int8 constants as TFLite's converter writes them, frozen as in
    Keras; an Embedding's table trains as the int8 embedding (q8.json's eg).  Its epoch-0
    test loss is the float model's (numpy), it learns, and export writes the trained
    model in float32 again, the normalization's constants the file's."""
    src, forward, data, x, y = _normalized_or_embedding(tmp_path, kind, bias)
    o, g8, gf = _int8_prepared(tmp_path, src, data)
    m = json.load(open(os.path.join(o, 'q8.json')))
    if kind == 'norm':
        for op in (op for op in g8.ops if op.name in ('SUB', 'MUL')):
            c = g8.tensors[op.inputs[1]]
            sc, z = c.quant['scale'][0], c.quant['zero_point'][0]
            assert c.dtype == 'int8' and np.abs((c.data.astype(int) - z) * sc - gf.tensors[op.inputs[1]].data
                                                ).max() <= sc / 2 + 1e-6
    else:
        assert any(d.get('eg') for d in m['layers']), m['layers']
    # (the normalization's constants frozen, as Keras's Normalization)
    _learns_from_numpys_loss(tmp_path, o, src, forward, x, y, {
        gf.tensors[op.inputs[1]].name: gf.tensors[op.inputs[1]].data for op in gf.ops
        if op.name in ('SUB', 'MUL')})


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('kind', ['norm', 'emb'])
def test_normalization_and_embedding_as_int8_train_on_micropython_as_on_the_host(tmp_path, kind):
    """The two of test_normalization_and_embedding_of_a_float_model_train_as_int8 on unix
    MicroPython and on the host: the same trained bytes, the same log."""
    src, _, data, _, _ = _normalized_or_embedding(tmp_path, kind, True, n=40)
    o = str(tmp_path / 'q')
    prepare(src, o, data=data, test_split=0.25, epochs=2, int8=True, from_logits=True,
            train='all', log=lambda *a: None, **dict(KW, lr=0.02))
    (wa, _, la), (wb, _, lb) = board_and_host_runs(o, 'trained.wof')
    assert wa == wb and len(la) == 4, la
    assert_same_logs(la, lb)


def _shared_weight_model(path, steps, seed=0, F=6, O=3):
    """x -> FC(W) -> TANH, again `steps` times with the same W tensor (an unrolled Keras
    LSTM or GRU reads its recurrent kernel so, once a step), -> FC -> SOFTMAX.  Returns
    (path, W, numpy forward)."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((F, F)) / np.sqrt(F)).astype(np.float32)
    wo = rng.standard_normal((O, F)).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    h = x = b.tensor('x', [1, F])
    wt = b.tensor('w', [F, F], data=w)
    for i in range(steps):
        z = b.tensor(f'z{i}', [1, F])
        b.op('FULLY_CONNECTED', [h, wt, -1], [z])
        h = b.tensor(f'h{i}', [1, F])
        b.op('TANH', [z], [h])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [h, b.tensor('wo', [O, F], data=wo), b.tensor('bo', [O], data=np.zeros(O, np.float32))], [y])
    p = b.tensor('p', [1, O])
    b.op('SOFTMAX', [y], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    b.save(path)

    def forward(xs):
        hs = xs.astype(np.float64)
        for _ in range(steps):
            hs = np.tanh(hs @ w.T)
        return hs @ wo.T
    return str(path), w, forward


def test_a_weight_several_ops_share_is_calibrated_once(tmp_path):
    """Issue 28 (session 18): an unrolled Keras LSTM (unroll=True) reads its kernels once
    a step.  int8 from float gave each weight its headroom once per op reading it, 3 ** 10
    times its range for 10 steps: the kernels quantized to zeros, the int8 LSTM (--int8,
    and prepare's own choice on an RP2040) started at chance and learnt nothing, and
    export wrote zeros into the float model.  The shared weight's int8 values are the
    float ones within half a step at the scale of one op reading it, and the int8 model's
    logits follow the float model's."""
    from host_tools.prepare.exportcheck import _int8_outputs
    src, w, forward = _shared_weight_model(tmp_path / 'shared.tflite', steps=4)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((60, 6)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=forward(xs).argmax(1))
    s = prepare(src, str(tmp_path / 'q'), data=str(tmp_path / 'd.npz'), epochs=1, int8=True,
                loss='scce', optimizer='sgd', lr=0.01, log=lambda *a: None)
    assert s['int8']
    g8 = read_model(str(tmp_path / 'q' / fromfloat.INT8_MODEL))
    w8 = next(t for t in g8.tensors if t.name == 'w')
    sw = w8.quant['scale'][0]
    assert sw == pytest.approx(fromfloat.WEIGHT_HEADROOM * np.abs(w).max() / 127, rel=0.02)
    assert np.abs(w8.data * sw - w).max() <= sw / 2 + 1e-7
    shutil.copy(str(tmp_path / 'q' / fromfloat.INT8_MODEL), str(tmp_path / 'm8.tflite'))
    q = _int8_outputs(str(tmp_path / 'm8.tflite'), xs[:40])
    assert np.mean(q.argmax(1) == forward(xs[:40]).argmax(1)) >= 0.85
    # export --quantized --data's recalibration of a frozen shared weight (no float values
    # given): its values as the file has them, read once (not requantized per op)
    from host_tools.prepare.exportcheck import recalibrate
    was = w8.data * sw
    recalibrate(g8, {}, {})
    w9 = next(t for t in g8.tensors if t.name == 'w')
    assert np.abs(w9.data * w9.quant['scale'][0] - was).max() <= w9.quant['scale'][0] / 2 + 1e-7


@pytest.mark.parametrize('h0', [0.0, 0.5])
def test_a_recurrent_layer_on_a_constant_state_trains_as_int8(tmp_path, h0):
    """Issue 28: a Keras GRU (reset_after, TensorFlow 2.21's WHILE, unrolled) applies its
    recurrent layer, b_hh inside, to the zero state in its first step: --int8 (and an
    RP2040's default) refused it ("constant 'gru/zeros' is not the weight or bias of a
    FULLY_CONNECTED ...").  The state is an int8 constant activation the layer reads; W,
    U, b_x and b_hh train as one parameter each (as the float path's 22 + 1 + 3 x 5 + 3
    values); the epoch-0 test loss is the float model's (numpy), it learns, and export
    writes the trained model in float32 again, scoring the run's last test loss."""
    src, forward = build_const_state_rnn(tmp_path / 'r.tflite', h0=h0)
    r = np.random.default_rng(3)
    x = r.standard_normal((96, 12)).astype(np.float32)
    y = np.minimum((x[:, 0::3].sum(1) > 0) + (x[:, 1::3].sum(1) > 1), 2)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    o, g8, gf = _int8_prepared(tmp_path, src, str(tmp_path / 'd.npz'))
    z = next(t for t in g8.tensors if t.name == 'zeros')
    assert z.dtype == 'int8' and np.allclose((z.data.astype(int) - z.quant['zero_point'][0]) *
                                             z.quant['scale'][0], h0, atol=1e-6)
    m = json.load(open(os.path.join(o, 'q8.json')))
    fcs = [d for d in m['layers'] if d.get('wt') is not None]
    assert len({d['wt'] for d in fcs}) == 3 and len(fcs) == 9     # (W, U, the head)
    _learns_from_numpys_loss(tmp_path, o, src, forward, x, y, {})


def test_a_loop_whose_first_step_reads_the_zero_state_trains_as_int8_and_exports_the_loop(
        tmp_path):
    """The same in TensorFlow 2.21's own form: a WHILE whose cell's recurrent FC has a bias
    (b_hh, as Keras's GRU with reset_after), unrolled by prepare: --int8 had refused it;
    it learns from the float model's loss, and export writes the file as it is (the WHILE
    and its body, the trained weights in the body, as the float path's export does; it had
    written the unrolled graph), which ONERT scores at the run's last test loss."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', fc_bias=True, O=2)
    x = np.random.default_rng(3).standard_normal((96, 5, 3)).astype(np.float32)
    y = (x[:, :, 0].mean(1) + 0.5 * x[:, -2:, 1].mean(1) > 0).astype(int)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    o, _, _ = _int8_prepared(tmp_path, src, str(tmp_path / 'd.npz'))
    _learns_from_numpys_loss(tmp_path, o, src, forward, x, y, {})
    out = read_model(str(tmp_path / 'out.tflite'))
    assert 'WHILE' in {op.name for op in out.ops}
    body = [t for sg in out.subgraphs.values() for t in sg.tensors if t.name == 'lstm0/bias_hh']
    was = [t for sg in read_model(src).subgraphs.values() for t in sg.tensors
           if t.name == 'lstm0/bias_hh']
    assert len(body) == len(was) == 1 and not np.array_equal(body[0].data, was[0].data)


def test_a_loop_with_layers_without_bias_as_int8_exports_unrolled_saying_why(tmp_path):
    """A WHILE whose FCs have no bias (Keras's LSTM cell) trains as int8 with zero biases,
    which the loop's body has no tensor for: export writes the unrolled graph and says
    so, and what exports the loop."""
    src, forward = build_keras_while_lstm(tmp_path / 'w.tflite', O=2)
    x = np.random.default_rng(3).standard_normal((40, 5, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=forward(x).argmax(1))
    o = str(tmp_path / 'q')
    prepare(src, o, data=str(tmp_path / 'd.npz'), epochs=1, int8=True, from_logits=True,
            log=lambda *a: None, **KW)
    r = export(src, os.path.join(o, 'weights.wof'), str(tmp_path / 'out.tflite'))
    assert 'WHILE' not in {op.name for op in read_model(str(tmp_path / 'out.tflite')).ops}
    assert any('loop unrolled (the zero bias' in v and '--float32' in v for v in r['notes']), r


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_a_recurrent_layer_on_a_constant_state_as_int8_trains_on_micropython_as_on_the_host(
        tmp_path):
    """test_a_recurrent_layer_on_a_constant_state_trains_as_int8's model on unix
    MicroPython and on the host: the same trained bytes, the same log."""
    src, _ = build_const_state_rnn(tmp_path / 'r.tflite')
    x = np.random.default_rng(3).standard_normal((40, 12)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0::3].sum(1) > 0).astype(int))
    o = str(tmp_path / 'q')
    prepare(src, o, data=str(tmp_path / 'd.npz'), test_split=0.25, epochs=2, int8=True,
            from_logits=True, train='all', log=lambda *a: None, **dict(KW, lr=0.02))
    (wa, _, la), (wb, _, lb) = board_and_host_runs(o, 'trained.wof')
    assert wa == wb and len(la) == 4, la
    assert_same_logs(la, lb)


def _divided_or_clipped(tmp_path, kind, bias, n=96):
    """A float model the test builds dividing by constants ('div': (x - mean) / std at the
    input, h / c mid-network) or clipping by them ('clip': MAXIMUM(-1), MINIMUM(6), a
    MINIMUM by a bound a feature), and its data (labels a teacher's: learnable).
    Returns (path, numpy forward: logits, data path, x, y)."""
    build = build_divided if kind == 'div' else build_clipped
    src, forward, make_x = build(tmp_path / f'{kind}.tflite', bias=bias)
    x = make_x(n)
    t = np.random.default_rng(5).standard_normal((3, x.shape[1]))
    y = ((x - x.mean(0)) / x.std(0) @ t.T).argmax(1)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    return src, forward, str(tmp_path / 'd.npz'), x, y


@pytest.mark.parametrize('kind,bias', [('div', True), ('div', False), ('clip', True),
                                       ('clip', False)])
def test_division_and_clips_by_constants_of_a_float_model_train_as_int8(tmp_path, kind, bias):
    """prepare --int8 had refused a float model dividing an activation by a constant (a
    PyTorch (x - mean) / std, x / 255.: "constant ... is not the weight or bias of a
    FULLY_CONNECTED ..."), and took a clip by constants (MAXIMUM, MINIMUM: tf.clip_by_value,
    torch.clamp) as the float path spells it (x - RELU(x - c): three int8 ops, the RELU's
    range 0 where no sample reached the bound).  Now x / c is the int8 MUL by 1 / c and a
    clip the int8 MAXIMUM / MINIMUM, its constant at the scale its input and output share
    (TFLite's kernels compare the int8 values), an input much wider than the clip's
    output (each of these: a Dense's) requantized to the output's range first, as
    TFLite's quantizer does; both frozen.  Its epoch-0 test loss is the
    float model's (numpy), it learns, and export writes the trained model in float32
    again, the constants the file's."""
    src, forward, data, x, y = _divided_or_clipped(tmp_path, kind, bias)
    o, g8, gf = _int8_prepared(tmp_path, src, data)
    names = [op.name for op in g8.ops]
    consts = {gf.tensors[k].name: gf.tensors[k].data for op in gf.ops if op.name in (
        'DIV', 'MAXIMUM', 'MINIMUM') for k in op.inputs if gf.tensors[k].data is not None}
    if kind == 'div':
        assert 'DIV' not in names and names.count('MUL') == 2, names
        for op in (op for op in g8.ops if op.name == 'MUL'):
            c = g8.tensors[op.inputs[1]]
            sc, z = c.quant['scale'][0], c.quant['zero_point'][0]
            assert c.dtype == 'int8' and np.abs((c.data.astype(int) - z) * sc - 1 / consts[c.name]
                                                ).max() <= sc / 2 + 1e-6
    else:
        assert [v for v in names if v != 'QUANTIZE'] == [
            'FULLY_CONNECTED', 'MAXIMUM', 'MINIMUM', 'FULLY_CONNECTED', 'MINIMUM',
            'FULLY_CONNECTED'], names
        assert names.count('QUANTIZE') == 3, names
        for op in (op for op in g8.ops if op.name in ('MAXIMUM', 'MINIMUM')):
            a, c, out = (g8.tensors[k] for k in (*op.inputs, *op.outputs))
            q = [(t.quant['scale'][0], t.quant['zero_point'][0]) for t in (a, c, out)]
            assert q[0] == q[1] == q[2] and c.dtype == 'int8', (op.name, q)
            assert np.abs((c.data.astype(int) - q[1][1]) * q[1][0] - consts[c.name]).max() <= \
                q[1][0] / 2 + 1e-6
    _learns_from_numpys_loss(tmp_path, o, src, forward, x, y, consts)


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_clips_by_constants_as_int8_train_on_micropython_as_on_the_host(tmp_path):
    """The clipped model of test_division_and_clips_by_constants_of_a_float_model_train_as_int8
    on unix MicroPython and on the host: the same trained bytes, the same log."""
    src, _, data, _, _ = _divided_or_clipped(tmp_path, 'clip', True, n=40)
    o = str(tmp_path / 'q')
    prepare(src, o, data=data, test_split=0.25, epochs=2, int8=True, from_logits=True,
            train='all', log=lambda *a: None, **dict(KW, lr=0.02))
    names = [op.name for op in read_model(os.path.join(o, fromfloat.INT8_MODEL)).ops]
    assert names.count('MINIMUM') == 2 and 'MAXIMUM' in names, names
    (wa, _, la), (wb, _, lb) = board_and_host_runs(o, 'trained.wof')
    assert wa == wb and len(la) == 4, la
    assert_same_logs(la, lb)


@pytest.mark.parametrize('kind', ['cdiv', 'pow2', 'pow05'])
def test_constant_first_division_and_a_square_of_a_float_model_train_as_int8(tmp_path, kind):
    """c / x (a constant divided by an activation: an int8 DIV, its constant at its own
    range), POW(x, 2) (the float path's MUL(x, x)) and POW(x, 0.5) (SQRT: a q8lut table as
    TFLite's int8 SQRT) had been refused by prepare --int8 (c / x: "constant ... is not
    the weight or bias"; POW: not run by either path; SQRT: no int8 path until session
    32).  Its epoch-0 test loss is the float model's (numpy) and it learns."""
    src, forward, make_x = build_constant_op(tmp_path / f'{kind}.tflite', kind)
    x = make_x(96)
    y = (forward(x.astype(np.float64)) @ np.random.default_rng(5).standard_normal((3, 3))).argmax(1)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    o, _, _ = _int8_prepared(tmp_path, src, str(tmp_path / 'd.npz'))
    _learns_from_numpys_loss(tmp_path, o, src, forward, x, y)


def test_powers_neither_path_runs_are_refused_saying_so(tmp_path):
    """POW(x, 3) had been refused by both paths (--int8's refusal had added "without
    --int8 it trains in float32", which was not so): it is x * x * x now
    (spellings._pow_steps), which both train; POW(x, 0.5) is SQRT, which --int8 refused
    until session 32 and now trains as int8 too."""
    for kind in ('pow05', 'pow3'):
        src, _, make_x = build_constant_op(tmp_path / f'{kind}.tflite', kind)
        np.savez(tmp_path / 'd.npz', x=make_x(16), y=np.arange(16) % 3)
        s = prepare(src, str(tmp_path / f'q{kind}'), data=str(tmp_path / 'd.npz'), int8=True,
                    epochs=1, from_logits=True, log=lambda *a: None, **KW)
        assert s.get('int8')
        s = prepare(src, str(tmp_path / f'f{kind}'), data=str(tmp_path / 'd.npz'), epochs=1,
                    from_logits=True, log=lambda *a: None, **KW)
        assert not s.get('int8')


@pytest.mark.parametrize('op', ['REDUCE_MAX', 'SLICE'])
def test_quantized_export_keeps_a_copying_ops_scale(tmp_path, op):
    """export --quantized --data's recalibration gives a REDUCE_MAX (Keras's
    GlobalMaxPooling1D) or a SLICE its input's scale and zero point, as TFLite's int8
    kernels take them (they copy the codes: TFLite Micro refuses another scale, "scale_diff
    <= 1.0e-6 was not true"; TFLite reads the codes at the wrong scale): issue 28's int8
    Conv1DTranspose -> Conv1D -> GlobalMaxPooling1D model exported so and did not run."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.exportcheck import recalibrate
    q = lambda s, z=0: {'scale': [float(s)], 'zero_point': [int(z)], 'quantized_dimension': 0}  # noqa: E731
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4], dtype='int8', quant=q(0.05))
    h = b.tensor('h', [1, 6], dtype='int8', quant=q(0.02))
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [6, 4], data=rng.integers(-100, 100, (6, 4)).astype(np.int8),
                                         quant=q(0.01)),
                             b.tensor('b', [6], data=np.zeros(6, np.int32), quant=q(0.0005))], [h])
    r = b.tensor('r', [1, 3, 2], dtype='int8', quant=q(0.02))
    b.op('RESHAPE', [h, b.tensor('s', [3], data=np.array([1, 3, 2], np.int32))], [r])
    m = b.tensor('m', [1, 2] if op == 'REDUCE_MAX' else [1, 2, 2], dtype='int8', quant=q(0.02))
    if op == 'REDUCE_MAX':
        b.op('REDUCE_MAX', [r, b.tensor('ax', [1], data=np.array([1], np.int32))], [m])
    else:
        b.op('SLICE', [r, b.tensor('at', [3], data=np.array([0, 1, 0], np.int32)),
                       b.tensor('n', [3], data=np.array([1, 2, 2], np.int32))], [m])
    b.inputs(x)
    b.outputs(m)
    g = read_model(b.save(os.fspath(tmp_path / 'm.tflite')))
    # measured ranges: the copy's output narrower than its input (as a max over fewer
    # values, a slice of part of them, is)
    recalibrate(g, {'x': (-3.0, 3.0), 'h': (-2.0, 2.0), 'r': (-2.0, 2.0), 'm': (-0.1, 0.6)}, {})
    qs = {t.name: (t.quant['scale'], t.quant['zero_point']) for t in g.tensors if t.name in 'hrm'}
    assert qs['m'] == qs['r'] == qs['h'], qs


def test_a_littlefs_boards_int8_run_holds_its_save_in_reserve(tmp_path, monkeypatch):
    """An int8 run planned for a board with littlefs (rp2040) holds its plan's save part
    as one block from before the net loads and frees it for each save (train.json
    run.save_reserve, utrain.wof.hold): after training the emulated Pico's heap had 11 KB
    free in holes of 72 blocks at most and the checkpoint's file (1148 B, its cache)
    found none (a tico dilated Conv1d --int8, SGD batch 1: 0.99x its plan, now 1.02x).
    A run planned for the unix build (the OS's files) holds none; the board's save opens
    its file in the freed reserve, and the reserve is taken again after a checkpoint or
    after the best weights' save (utrain.best.save: trained.wof, its side files, its
    record), not after trained.wof alone (the files after it had found it held)."""
    import sys
    from host_tools.plan.memory import SAVE, OPEN_FILE
    data = _digits(tmp_path, 16)
    s = prepare(MLP, str(tmp_path / 'a'), data=data, epochs=1, board='rp2040',
                log=lambda *a: None, **KW)
    run = json.loads((tmp_path / 'a' / 'train.json').read_text())['run']
    assert s['int8'] and run['save_reserve'] == s['heap']['parts'][SAVE] > OPEN_FILE[4, 'littlefs']
    s = prepare(MLP, str(tmp_path / 'b'), data=data, epochs=1, int8=True, log=lambda *a: None, **KW)
    assert s['int8'] and 'save_reserve' not in json.loads((tmp_path / 'b' / 'train.json').read_text())['run']
    if MP:      # (the board's code reads the setting: an unknown one is refused)
        code, text = runner.run(str(tmp_path / 'a'), stream=False)
        assert code == 0 and 'utrain: end: ok' in text, text
    sys.path.insert(0, os.path.join(ROOT, 'micro'))
    from utrain import wof
    monkeypatch.setattr(wof, 'RES', [])
    wof.hold(1000)
    assert len(wof.RES[1]) == 1000
    seen = []
    real = open

    def spy(path, *a):
        seen.append(wof.RES[1])
        return real(path, *a)
    monkeypatch.setattr('builtins.open', spy)
    wof.save_wof(str(tmp_path / 'w.wof'), 2, {0: bytearray(4)})
    assert seen == [None] and wof.RES[1] is None
    wof.save_checkpoint(str(tmp_path / 'c.ckpt'), 2, {0: bytearray(4)}, None, None, 0, 0)
    monkeypatch.setattr('builtins.open', real)
    assert seen == [None, None] and len(wof.RES[1]) == 1000


def test_an_int8_conv_input_gradient_buffer_is_made_with_the_net_and_planned(tmp_path):
    """q8asm's conv input gradients (cdk: a run of output pixels' int32 im2col rows, up
    to 2 KB) were made at the first backward, where the emulated Pico found no run of
    2 KB among a sample's holes (a Keras Conv1D int8 file at SGD batch 1 failed in its
    first sample at 0.96x its plan, now 1.01x); the net makes it with the held weights
    and an ARM board's plan counts it: for the int8 residual CNN's strided 3x3 conv (12
    channels in: 108 values a pixel, 4 pixels a run), 432 int32s on rp2040, none on the
    unix build (no q8asm there) nor where no conv passes an input gradient."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, 'micro'))
    from utrain import q8load
    from kerasgraphs import build_int8_rescnn
    model = build_int8_rescnn(str(tmp_path / 'res.tflite'))
    rng = np.random.default_rng(1)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((4, 24, 24, 3)).astype(np.float32), y=rng.integers(0, 5, 4))
    part = "convs' input-gradient rows (q8asm cdk)"
    s = prepare(model, str(tmp_path / 'a'), data=data, epochs=1, board='rp2040', train='all',
                log=lambda *a: None, **KW)
    ls = json.loads((tmp_path / 'a' / 'q8.json').read_text())['layers']
    assert q8load.cdn(ls) == 432 and s['heap']['parts'][part] >= 4 * 432
    s = prepare(model, str(tmp_path / 'b'), data=data, epochs=1, train='all',
                log=lambda *a: None, **KW)
    assert s['int8'] and part not in s['heap']['parts']
    s = prepare(model, str(tmp_path / 'c'), data=data, epochs=1, board='rp2040', train='last:1',
                log=lambda *a: None, **KW)
    assert part not in s['heap']['parts']


def _build_ending_in_add(path, seed=0, F=6, H=8, O=3):
    """A float model whose output is an ADD of two heads (PyTorch's `return a + b`, a
    Keras Add() as the last layer): x -> FC(H, relu) -> FC(O) = a; x -> FC(O) = b;
    y = a + b."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(seed)
    w1, w2, w3 = (0.5 * r.standard_normal(s).astype(np.float32) for s in ((H, F), (O, H), (O, F)))
    b = CircleBuilder(identifier=b'TFL3')
    x, h, a, c, y = (b.tensor(n, [1, k]) for n, k in (('x', F), ('h', H), ('a', O), ('c', O), ('y', O)))
    zeros = lambda n, k: b.tensor(n, [k], data=np.zeros(k, np.float32))  # noqa: E731
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [H, F], data=w1), zeros('b1', H)], [h],
         fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', [O, H], data=w2), zeros('b2', O)], [a])
    b.op('FULLY_CONNECTED', [x, b.tensor('w3', [O, F], data=w3), zeros('b3', O)], [c])
    b.op('ADD', [a, c], [y], fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    return b.save(os.fspath(path))


def test_a_model_ending_in_an_add_trains_as_int8(tmp_path):
    """A float model whose last op is an ADD (a held-out tico model `return fc(h) +
    0 * softplus(x[:, :3])`) trained as int8 stopped on the board at its first backward
    step (the ADD's clamp mask was never made for the last layer: "TypeError: can't
    convert NoneType to int"); now it trains on the board and the host alike and learns."""
    path = _build_ending_in_add(tmp_path / 'add.tflite')
    rng = np.random.default_rng(1)
    x = rng.standard_normal((120, 6)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=x[:, :3].argmax(1))
    s = prepare(path, str(tmp_path / 'r'), data=str(tmp_path / 'd.npz'), int8=True,
                test_split=0.25, epochs=3, log=lambda *a: None, **KW)
    assert s['int8']
    code, out = runner.run(str(tmp_path / 'r'), python=True, stream=False)
    assert code == 0 and 'utrain: end: ok' in out, out
    with open(tmp_path / 'r' / 'q8.json') as f:
        assert json.load(f)['layers'][-1].get('mask') == 1
    acc = [float(v.split('test_accuracy ')[1].split()[0]) for v in out.splitlines()
           if v.startswith('epoch') and 'test_accuracy' in v]
    assert acc[-1] > acc[0] + 0.1 or acc[-1] >= 0.9, out
    if MP:
        code, out = runner.run(str(tmp_path / 'r'), stream=False)
        assert code == 0 and 'utrain: end: ok' in out, out


def test_a_class_a_step_model_on_a_board_trains_in_float32(tmp_path):
    """A sequence labeller (a class a step: logits [1, T, C], labels (N, T)) on a board
    without ulab: prepare chose int8 itself and then refused it ("the int8 path's softmax
    cross-entropy takes all the outputs as one row; --dequantize ...": a held-out Keras
    TimeDistributed(Dense) labeller had no run on a Pico at all); now the choice falls
    back to float32 and says why, and --int8 is refused saying float32 trains it, without
    --dequantize (an int8 file's option)."""
    from host_tools.formats.circle_build import CircleBuilder
    T, F, C = 6, 4, 3
    r = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x, h, y = b.tensor('x', [1, T, F]), b.tensor('h', [1, T, 8]), b.tensor('y', [1, T, C])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [8, F], data=r.standard_normal((8, F)).astype(np.float32)),
                             b.tensor('b1', [8], data=np.zeros(8, np.float32))], [h],
         fused_activation_function='RELU', keep_num_dims=True)
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', [C, 8], data=r.standard_normal((C, 8)).astype(np.float32)),
                             b.tensor('b2', [C], data=np.zeros(C, np.float32))], [y],
         keep_num_dims=True)
    b.inputs(x)
    b.outputs(y)
    path = b.save(os.fspath(tmp_path / 'steps.tflite'))
    xs = r.standard_normal((40, T, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=(xs[:, :, 0] > 0).astype(int) + (xs[:, :, 1] > 1))
    said = []
    s = prepare(path, str(tmp_path / 'a'), data=str(tmp_path / 'd.npz'), board='rp2040',
                epochs=1, log=said.append)
    assert not s.get('int8')
    assert any('trains in float32 (int8 from float does not take it: --loss cce on rows' in v
               and 'dequantize' not in v for v in said), said
    with pytest.raises(PrepareError, match=r'--int8 cannot train it as int8: --loss cce on rows'
                                           r'[^;]*; without --int8 it trains in float32$'):
        prepare(path, str(tmp_path / 'b'), data=str(tmp_path / 'd.npz'), int8=True,
                epochs=1, log=lambda *a: None)


def test_a_pruned_channel_keeps_its_bias_in_int32(tmp_path):
    """Issue 28 (a Keras MobileNetV2 .tflite from GitHub with pruned conv channels, max
    |w| 4e-18): the channel's weight scale was max |w| / 127, 3e-20, its bias 1e23 codes,
    cast to int32 as garbage (numpy's 'invalid value encountered in cast').  As TFLite's
    converter does, the weight scale grows until the bias fits: the int8 model's biases
    are the float model's (the channel's weights all but zero at it, as they were)."""
    import warnings
    from kerasgraphs import build_raw_cnn
    rng = np.random.default_rng(0)
    K, P, O = 4, 3, 3
    wc = 0.3 * rng.standard_normal((K, 3, 3, 1))
    wc[1] = 1e-18 * rng.standard_normal((3, 3, 1))      # pruned
    bc = np.array([0.1, 3.0, -0.2, 0.05])
    model = build_raw_cnn(tmp_path / 'm.tflite', (wc, bc, 0.3 * rng.standard_normal(
        (O, K * P * P)), np.zeros(O)))
    np.savez(tmp_path / 'd.npz', x=rng.standard_normal((40, 8, 8, 1)).astype(np.float32),
             y=np.arange(40) % O)
    with warnings.catch_warnings():
        warnings.simplefilter('error', RuntimeWarning)
        prepare(model, str(tmp_path / 'q'), data=str(tmp_path / 'd.npz'), int8=True,
                loss='scce', from_logits=True, train='all', epochs=1, lr=0.01,
                log=lambda *a: None)
    g8 = read_model(str(tmp_path / 'q' / fromfloat.INT8_MODEL))
    conv = next(op for op in g8.ops if op.name == 'CONV_2D')
    b = g8.tensors[conv.inputs[2]]
    scale = np.asarray(b.quant['scale'], np.float64)
    got = b.data.astype(np.float64) * scale
    assert np.abs(b.data).max() < 2 ** 30 and np.all(np.abs(got - bc) <= 0.51 * scale), got


def test_prepares_own_int8_choice_refused_names_what_fits_in_float32(tmp_path):
    """prepare's own choice of int8 refused where int8 fits with nothing tried, the float32
    plan with some option: the refusal names those options (with --float32), and prepare
    given them fits.  Google's KWS CNN on --board esp32 had been refused 'nothing tried
    fits ... a board with more heap holds it' while --float32 --train last:4 --cache-on-host
    trains in 92 KB (the float plan's advice was dropped from the message)."""
    data = _digits(tmp_path, 24)
    with pytest.raises(PrepareError) as e:
        prepare(MLP, str(tmp_path / 'a'), data=data, epochs=1, board='esp32-psram', budget='60K',
                log=lambda *a: None, **KW)
    msg = str(e.value)
    assert 'training as int8 needs about' in msg and '\n  in float32 (--float32)' in msg, msg
    assert '\n  nothing tried fits' not in msg, msg     # (int8's: said as int8's)
    fits = [v.strip() for v in msg.split('\n') if v.strip().startswith('would fit: --float32 ')]
    assert fits, msg
    flags = fits[0][len('would fit: '):].split('  (about')[0].split()
    kb = int(fits[0].split('(about ')[1].split(' KB')[0])
    kw = dict(KW, int8=False)
    for f, v in zip(flags, flags[1:] + ['']):
        if f == '--backend':
            kw['backend'] = v
        elif f == '--stream':
            kw['stream'] = True
        elif f == '--cache-on-host':
            kw['cache'] = 'host'
        elif f == '--train':
            kw['train'] = v
    s = prepare(MLP, str(tmp_path / 'b'), data=data, epochs=1, board='esp32-psram', budget='60K',
                log=lambda *a: None, **kw)
    assert s['heap']['total'] // 1024 == kb and s['heap']['total'] <= 60 * 1024, (fits, s['heap'])


def test_an_l2_normalisations_far_guard_leaves_its_range_to_the_data(tmp_path):
    """Keras's UnitNormalization converts to h * MINIMUM(RSQRT(SUM(h * h)), 1/sqrt(eps))
    (1e6 here): calibrating the float model as int8, the MINIMUM's range took in its bound,
    so the RSQRT's output (0.6..1.7) was 1e6 wide, every value a step of 0: prepare --int8
    said the int8 path reads it as a constant and trains nothing before it, and a board
    without ulab trained the model in float32.  A bound far outside what the data reach
    (over 4x the span) no longer widens the range; the int8 forward is the float one's."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    t = lambda n, s: b.tensor(n, s)        # noqa: E731
    x, h, sq, sm, rs, mn, u, z, y = (t('x', [1, 6]), t('h', [1, 8]), t('sq', [1, 8]), t('sm', [1, 1]),
                                     t('rs', [1, 1]), t('mn', [1, 1]), t('u', [1, 8]),
                                     t('z', [1, 3]), t('y', [1, 3]))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [8, 6], data=np.float32(rng.standard_normal((8, 6)))),
                             b.tensor('b1', [8], data=np.zeros(8, np.float32))], [h])
    b.op('MUL', [h, h], [sq], fused_activation_function='NONE')
    b.op('SUM', [sq, b.tensor('ax', [1], data=np.int32([-1]))], [sm], keep_dims=True)
    b.op('RSQRT', [sm], [rs])
    b.op('MINIMUM', [rs, b.tensor('guard', [], data=np.float32(1e6))], [mn])
    b.op('MUL', [h, mn], [u], fused_activation_function='NONE')
    b.op('FULLY_CONNECTED', [u, b.tensor('w2', [3, 8], data=np.float32(rng.standard_normal((3, 8)))),
                             b.tensor('b2', [3], data=np.zeros(3, np.float32))], [z])
    b.op('SOFTMAX', [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    model = b.save(os.fspath(tmp_path / 'l2.tflite'))
    xs = np.float32(rng.standard_normal((40, 6)))
    np.savez(tmp_path / 'd.npz', x=xs, y=rng.integers(0, 3, 40))
    said = []
    prepare(model, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'), lr=1e-9,
            epochs=1, batch=1, int8=True, log=said.append)
    assert not [m for m in said if 'reads it as a constant' in m], said
    code, text = runner.run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    loss = float(text.split('epoch 1/1 loss ')[1].split()[0])
    g = read_model(model)
    W1, W2 = (next(t.data for t in g.tensors if t.name == n) for n in ('w1', 'w2'))
    hv = xs.astype(np.float64) @ W1.T
    zv = (hv / np.linalg.norm(hv, axis=1, keepdims=True)) @ W2.T
    p = np.exp(zv - zv.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = -np.log(p[np.arange(40), np.load(tmp_path / 'd.npz')['y']]).mean()
    assert abs(loss - want) < 0.02, (loss, want)
