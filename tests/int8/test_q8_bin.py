"""Elementwise int8 ops of two inputs with broadcasting (ADD that broadcasts or adds a
constant, SUB, MUL: utrain.q8bin) and slices (SLICE, STRIDED_SLICE, SPLIT: utrain.q8slc),
in a model built here as Keras 3's converter writes a squeeze-excite gate, a broadcast
Add, a split into heads and a Lambda slice (issue 28): the forward bit-exact with
TFLite Micro on the file as written, the conv's update through every one of them
against finite differences of the float forward of the dequantized graph, training
that lowers the loss with the same integers under viper (unix MicroPython) as on the
host, the trained model exported bit-exact, and the refusals (a slice that is not one
strided copy, an op without an int8 kernel) saying what to do."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from kerasgraphs import build_int8_binary  # noqa: E402
from q8cases import tflm_agrees  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from test_q8 import spy_updates  # noqa: E402
from test_q8_cat import MP, _fd_grad, _step_against_fd, _viper_matches  # noqa: E402

H, W, I = 4, 4, 2


def _net(tmp_path, train='all'):
    path, fwd, swc, sx = build_int8_binary(tmp_path / 'b.tflite')
    quant.write(quant.rewritten(read_model(path)), str(tmp_path), train)
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)                    # as the board reads it
    return path, fwd, swc, sx, m


def _x(seed):
    return np.random.default_rng(80 + seed).integers(-125, 126, (H, W, I)).astype(np.int8)


def test_layers_and_forward_bit_exact_with_tflite_micro(tmp_path):
    from tflite_micro.python.tflite_micro import runtime
    path, _, _, _, m = _net(tmp_path)
    ks = [d['k'] for d in m['layers']]
    assert ks.count(quant.BIN) == 6 and ks.count(quant.SLC) == 4 and quant.ADD not in ks
    bins = [d for d in m['layers'] if d['k'] == quant.BIN]
    assert [d["bo"] for d in bins] == [2, 2, 0, 1, 2, 0]        # MUL MUL ADD SUB MUL ADD
    assert bins[1]["lb"] == [0, 4] and bins[-1].get("kc") and bins[0]["in"][0] == bins[0]["in"][1]
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(path)
    outs = set()
    for i in range(8):
        xq = _x(i)
        got = np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8)
        it.set_input(xq.reshape(1, H, W, I), 0)
        it.invoke()
        assert np.array_equal(got, it.get_output(0).ravel()), i
        outs.add(tuple(got))
    assert len(outs) >= 6


def test_conv_update_through_the_ops_matches_finite_differences(tmp_path, monkeypatch):
    """The conv's int8 update (through the FC, the MEAN, the constant ADD, the SLICE, the
    squared MUL, the MUL of two heads, the STRIDED_SLICE, the SUB of the SPLIT's halves,
    the broadcast ADD and the gate's MUL, to both of its inputs: the conv's output
    directly and through the MEAN and the FC) against finite differences of the float
    forward of the dequantized graph."""
    got = spy_updates(monkeypatch)
    path, fwd, swc, sx, m = _net(tmp_path)
    g = read_model(path)
    w0 = next(t for t in g.tensors if t.name == 'w')
    wf = w0.data.astype(np.float64) * swc[:, None, None, None]
    lr, cos = 0.01, []
    for i in range(5):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        xq, label = _x(i), i % 3
        conv, ref, c = _step_against_fd(net, got, xq, label, lr, np.repeat(swc, 9 * I), fwd,
                                        xq.astype(np.float64) * sx, wf, 1e-4)
        cos.append(c)
        assert 0.6 < np.linalg.norm(conv) / np.linalg.norm(ref) < 1.6, i
    assert min(cos) > 0.93 and np.mean(cos) > 0.97, cos


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_trains_on_micropython_as_on_the_host_and_exports(tmp_path):
    """prepare, then three epochs of SGD on 24 samples of a task the model can learn,
    on unix MicroPython (viper) and on the host (numpy): the same trained.wof and log,
    the loss falls; export --quantized of it: TFLite Micro's logits are the board's."""
    path, fwd, swc, sx = build_int8_binary(tmp_path / 'b.tflite')
    r = np.random.default_rng(3)
    x = r.uniform(-2.4, 2.4, (24, H, W, I)).astype(np.float32)
    trains_and_exports(tmp_path, path, x, fwd)


def trains_and_exports(tmp_path, path, x, fwd, **kw):
    """prepare int8 model path on samples x labelled by its float forward fwd, skewed
    (a task it can learn), three epochs of SGD on unix MicroPython and on the host: the
    same trained.wof and log, the loss falls; export --quantized of it: TFLite Micro's
    logits are the board's.  Returns prepare's summary."""
    from host_tools.prepare.pipeline import prepare
    from repo import board_and_host_runs, no_keep_best
    y = np.array([int(np.argmax(fwd(v.astype(np.float64)) * [1, -1, 0.5])) for v in x])
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = tmp_path / 'run'
    s = prepare(path, str(d), data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd', lr=0.02,
                epochs=3, train='all', log=lambda *a: None, **kw)
    no_keep_best(str(d))
    outs = board_and_host_runs(d, 'train.json')
    assert outs[0] == outs[1]
    for e in ('.q8s', '.q8w', '.q8a'):      # (the int8 state beside trained.wof: the same)
        a, b = (os.path.join(str(d) + r, 'trained.wof' + e) for r in ('mp', 'py'))
        assert os.path.exists(a) == os.path.exists(b)
        assert not os.path.exists(a) or open(a, 'rb').read() == open(b, 'rb').read()
    log = outs[0][2]
    assert float(log[-1][0]) < 0.8 * float(log[1][0]), log      # (epoch 3's loss, epoch 1's)
    exported_is_the_board(path, str(d) + 'mp', str(tmp_path / 'q.tflite'), x[:8])
    return s


def exported_is_the_board(path, run, q, x):
    """export --quantized of int8 model path with run folder run's trained.wof (and the
    state beside it) into q: TFLite Micro's logits of q are the board's (utrain.q8 with
    the trained weights loaded) on float samples x."""
    from host_tools.prepare.pipeline import export
    from tflite_micro.python.tflite_micro import runtime
    with open(os.path.join(run, 'q8.json')) as f:
        net = Q8Net(json.load(f), os.path.join(run, 'weights.wof'))
    net.load_weights(os.path.join(run, 'trained.wof'))
    export(path, os.path.join(run, 'trained.wof'), q, quantized=True)
    it = runtime.Interpreter.from_file(q)
    for v in x:
        xq = net.quantize_input(v.ravel().tolist())
        it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(it.get_input_details(0)['shape']), 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(xq)), np.int8),
                              it.get_output(0).ravel())


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_viper_steps_as_the_host(tmp_path):
    """Three SGD steps under viper (unix MicroPython) end with the host's weights."""
    _net(tmp_path)
    _viper_matches(tmp_path, tmp_path, [_x(i) for i in range(3)])


def _tflm_matches(path, m, d, xs, distinct=None):
    """utrain.q8's forward of q8.json m (folder d) is TFLite Micro's on the int8 inputs xs
    (their outputs all differ, or at least distinct of them)."""
    tflm_agrees(path, Q8Net(m, str(d / 'weights.wof')), xs, distinct)


def test_a_slice_of_three_axes_gathers_and_five_is_refused(tmp_path):
    """A SLICE of three axes of [1, 4, 4, 2] is no one strided copy: a gather over the
    output's axes (SLC 'gx'), bit-exact with TFLite Micro; a TRANSPOSE that leaves 5 axes
    apart is refused naming the file and op and what to do."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    q = {'scale': [0.05], 'zero_point': [0]}
    x = b.tensor('x', [1, 4, 4, 2], dtype='int8', quant=q)
    s = b.tensor('s', [1, 2, 2, 1], dtype='int8', quant=q)
    b.op('SLICE', [x, b.tensor('b', [4], data=np.array([0, 1, 1, 1], np.int32)),
                   b.tensor('n', [4], data=np.array([1, 2, 2, 1], np.int32))], [s])
    y = b.tensor('y', [1, 3], dtype='int8', quant={'scale': [0.1], 'zero_point': [0]})
    w = np.arange(-6, 6, dtype=np.int8).reshape(3, 4) * 9
    r = b.tensor('r', [1, 4], dtype='int8', quant=q)
    b.op('RESHAPE', [s, b.tensor('sh', [2], data=np.array([1, 4], np.int32))], [r])
    b.op('FULLY_CONNECTED', [r, b.tensor('w', w.shape, data=w, quant={'scale': [0.01], 'zero_point': [0]}), -1],
         [y])
    b.inputs(x)
    b.outputs(y)
    p = b.save(str(tmp_path / 'two.tflite'))
    quant.write(quant.rewritten(read_model(p)), str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert m['layers'][0]['gx'] == [1, 1, 2, 2, 0, 0, 8, 2, 11]
    r = np.random.default_rng(4)
    _tflm_matches(p, m, tmp_path, [r.integers(-128, 128, (4, 4, 2)).astype(np.int8) for _ in range(4)])
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [2, 2, 2, 2, 2], dtype='int8', quant=q)
    t = b.tensor('t', [2, 2, 2, 2, 2], dtype='int8', quant=q)
    b.op('TRANSPOSE', [x, b.tensor('p', [5], data=np.array([4, 3, 2, 1, 0], np.int32))], [t])
    b.inputs(x)
    b.outputs(t)
    p = b.save(str(tmp_path / 'five.tflite'))
    with pytest.raises(ValueError, match=r'five\.tflite: TRANSPOSE op 0: output .* at most 4 '
                                         r'axes.*--dequantize'):
        quant.layers(quant.rewritten(read_model(p)), 'all')


def _tabled(tmp_path, built, seed, n):
    """A kerasgraphs builder's (path, fwd, scale, sx) rewritten and written as its int8
    table, all layers training: (path, fwd, scale, sx, graph, q8.json, n random int8 [6, 5]
    inputs drawn with seed)."""
    path, fwd, s1, sx = built
    g = quant.rewritten(read_model(path))
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    r = np.random.default_rng(seed)
    return path, fwd, s1, sx, g, m, [r.integers(-120, 121, (6, 5)).astype(np.int8) for _ in range(n)]


def _transposed(tmp_path):
    from kerasgraphs import build_int8_transpose
    return _tabled(tmp_path, build_int8_transpose(tmp_path / 't.tflite'), 6, 5)


def test_transpose_gathers_bit_exact_and_its_gradient_scatters(tmp_path, monkeypatch):
    """A TRANSPOSE of [1, T, F] to [1, F, T] (Keras's Permute, issue 28): a gather (SLC
    'gx'; the net keeps two gradient buffers) and a slice that reverses two axes (a
    gather with negative strides), bit-exact with TFLite Micro; the first layer's update
    through them against finite differences."""
    from utrain.q8load import gtwo
    path, fwd, s1, sx, g, m, xs = _transposed(tmp_path)
    ls = m['layers']
    assert [d['k'] for d in ls] == [quant.CONV, quant.SLC, quant.SLC, quant.FC]
    assert ls[1]['gx'] == [1, 1, 4, 6, 0, 0, 1, 4, 0] and gtwo(ls)
    assert ls[2]['gx'] == [1, 1, 2, 4, 0, 0, -6, -1, 16]        # (reversed: strides < 0)
    _tflm_matches(path, m, tmp_path, xs)
    _steps_as_differences(monkeypatch, tmp_path, g, m, xs, fwd, s1, sx, 0.93, 0.97, True)


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_transpose_steps_under_viper_as_the_host(tmp_path):
    """Three SGD steps through the TRANSPOSE's gather and scatter under viper (unix
    MicroPython) end with the host's weights."""
    xs = _transposed(tmp_path)[-1]
    _viper_matches(tmp_path, tmp_path, xs[:3])


def _steps_as_differences(monkeypatch, tmp_path, g, m, xs, fwd, s1, sx, low, mean, ratio):
    """The first layer's ('w1') int8 update on each sample against finite differences of
    the float forward fwd: cosines at least low, their mean above mean (ratio: the
    update's size within 0.6-1.6 of the reference's too)."""
    spy = spy_updates(monkeypatch)
    w0 = next(t for t in g.tensors if t.name == 'w1').data.astype(np.float64) * s1
    cos = []
    for i, xq in enumerate(xs):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        upd, ref, c = _step_against_fd(net, spy, xq, i % 3, 0.01, s1, fwd,
                                       xq.astype(np.float64) * sx, w0, 1e-5)
        cos.append(c)
        assert not ratio or 0.6 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.6, i
    assert min(cos) > low and np.mean(cos) > mean, cos


def _island(tmp_path, two=False, elu=False):
    from kerasgraphs import build_int8_island
    return _tabled(tmp_path, build_int8_island(tmp_path / 'i.tflite', two=two, elu=elu), 7, 5)


def test_float_elu_between_dequantize_and_quantize_is_a_table(tmp_path, monkeypatch):
    """An int8 model's ELU as Keras 3's converter writes it (DEQUANTIZE, ELU, QUANTIZE:
    refused before as float ops int8 training cannot tabulate): one LUT layer, forward
    bit-exact with TFLite Micro, the first layer's update through it against finite
    differences of the float forward."""
    path, fwd, s1, sx, g, m, xs = _island(tmp_path, elu=True)
    assert [d['k'] for d in m['layers']] == [quant.CONV, quant.LUT, quant.FC]
    _tflm_matches(path, m, tmp_path, xs)
    _steps_as_differences(monkeypatch, tmp_path, g, m, xs, fwd, s1, sx, 0.9, 0.95, False)


def test_float_ops_between_dequantize_and_quantize_are_one_table(tmp_path, monkeypatch):
    """-h / 0.25 as a converter writes it (DEQUANTIZE, NEG, DIV by a scalar, QUANTIZE: no
    int8 kernel for them, issue 28): one LUT layer, its table TFLite Micro's float32
    kernels and std::round (forward bit-exact), its derivative -4 (beyond the table's 2:
    'ds'); the first layer's update through it against finite differences.  h / h is a
    function of the one input too."""
    path, fwd, s1, sx, g, m, xs = _island(tmp_path)
    ls = m['layers']
    assert [d['k'] for d in ls] == [quant.CONV, quant.LUT, quant.FC] and ls[1]['ds'] == 4
    with open(tmp_path / 'q8.req', 'rb') as f:     # (its tables: 256 int8, 256 int16)
        dt = np.frombuffer(f.read()[ls[1]['lt'] + 256:ls[1]['lt'] + 768], '<i2')
    assert set(dt[ls[1]['zx'] + 129:ls[1]['zx'] + 160]) == {-16384}     # (-4 / 4)
    _tflm_matches(path, m, tmp_path, xs)
    _steps_as_differences(monkeypatch, tmp_path, g, m, xs, fwd, s1, sx, 0.93, 0.97, True)
    (tmp_path / 'two').mkdir()
    m = _island(tmp_path / 'two', two=True)[5]
    assert [d['k'] for d in m['layers']] == [quant.CONV, quant.LUT, quant.FC]


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_float_island_steps_under_viper_as_the_host(tmp_path):
    """Three SGD steps through the tabulated float ops ('ds') under viper end with the
    host's weights."""
    xs = _island(tmp_path)[-1]
    _viper_matches(tmp_path, tmp_path, xs[:3])


@pytest.mark.parametrize('cmp,apart', [('GREATER', False), ('LESS_EQUAL', False),
                                       ('GREATER', True)])
def test_int8_where_is_one_table(tmp_path, monkeypatch, cmp, apart):
    """Keras's tf.where(h > 0.25, h, 0.3 h - 0.1) in an int8 file (int8 GREATER, MUL,
    SUB and SELECT_V2 of h and scalar constants: the model had trained dequantized or
    been refused, issue 28): one LUT layer of h's 256 codes, TFLite Micro's int8 kernels
    (forward bit-exact on the file; the branches at other scales than h's too, where
    select.cc copies codes), its derivative 1 above 0.25 and 0.3 below (no gradient
    through the mask), the first layer's update through it against finite differences
    of the float forward."""
    from kerasgraphs import build_int8_where
    path, fwd, s1, sx, g, m, xs = _tabled(tmp_path, build_int8_where(
        tmp_path / 'w.tflite', cmp=cmp, apart=apart), 9, 6)
    ls = m['layers']
    assert [d['k'] for d in ls] == [quant.CONV if ls[0]['k'] == quant.CONV else quant.FC,
                                    quant.LUT, quant.FC]
    _tflm_matches(path, m, tmp_path, xs)
    with open(tmp_path / 'q8.req', 'rb') as f:
        raw = f.read()[ls[1]['lt']:ls[1]['lt'] + 768]
    t, dt = np.frombuffer(raw[:256], np.int8), np.frombuffer(raw[256:], '<i2') / 16384
    h = (np.arange(-128, 128) + 20) * 0.03            # (h's codes: scale 0.03, zero point -20)
    inside = (t > -128) & (t < 127)
    ss, sb = (0.025, 0.02) if apart else (0.03, 0.03)   # (a branch's code at the output's scale)
    np.testing.assert_allclose(dt[inside & (h > 0.27)], ss / 0.03, rtol=1e-3)
    np.testing.assert_allclose(dt[inside & (h < 0.23) & (h > -3)], 0.3 * ss / sb, rtol=1e-3)
    _steps_as_differences(monkeypatch, tmp_path, g, m, xs, fwd, s1, sx, 0.9, 0.95, False)


def test_float_ops_of_two_int8_tensors_are_refused_saying_what_to_do(tmp_path):
    """A MUL of two dequantized int8 tensors in float32 is no function of one input (and
    not a DIV, which may be an int8 DIV): refused naming the file, the DEQUANTIZE and
    what to do."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    q = {'scale': [0.05], 'zero_point': [0]}
    x = b.tensor('x', [1, 4], dtype='int8', quant=q)
    x2 = b.tensor('x2', [1, 4], dtype='int8', quant=q)
    fs = [b.tensor(f'f{i}', [1, 4], dtype='float32') for i in range(3)]
    b.op('DEQUANTIZE', [x], [fs[0]])
    b.op('DEQUANTIZE', [x2], [fs[1]])
    b.op('MUL', fs[:2], [fs[2]], fused_activation_function='NONE')
    y = b.tensor('y', [1, 4], dtype='int8', quant=q)
    b.op('QUANTIZE', [fs[2]], [y])
    z = b.tensor('z', [1, 2], dtype='int8', quant=q)
    w = np.ones((2, 4), np.int8)
    b.op('FULLY_CONNECTED', [y, b.tensor('w', w.shape, data=w, quant={'scale': [0.01], 'zero_point': [0]}), -1],
         [z])
    b.inputs(x, x2)
    b.outputs(z)
    p = b.save(str(tmp_path / 'div.tflite'))
    g = quant.rewritten(read_model(p))
    with pytest.raises(ValueError, match=r'div\.tflite: op 0 \(DEQUANTIZE\) starts float32 ops .*'
                                         r'ops of two int8 tensors') as e:
        quant.layers(g, 'all')
    msg = quant.refusal(g, p, str(e.value), 'all')
    assert msg.count(p) == 1 and msg.count('--dequantize') == quant.float_takes(g, 'all'), msg


def test_int8_div_by_a_constant_is_tflite_micros_integers_and_neg_a_table(tmp_path):
    """An int8 DIV by one constant (TFLite Micro's integer div.cc: a fixed-point
    reciprocal, issue 28) is a LUT whose 256 outputs are TFLite Micro's (random scales,
    zero points and divisors; where its shift reaches 32 bits, undefined in C, ARM's
    +-1), its derivative 1 / c; an int8 NEG a table of -x."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(0)
    for trial in range(6):
        sx, sy, s2 = r.uniform(0.005, 0.1), r.uniform(0.005, 0.2), r.uniform(0.005, 0.3)
        zx, zy, z2 = (int(v) for v in r.integers(-20, 20, 3))
        cv = int(r.integers(-128, 128))
        cv += cv == z2
        b = CircleBuilder(identifier=b'TFL3')
        x = b.tensor('x', [1, 256], dtype='int8', quant={'scale': [sx], 'zero_point': [zx]})
        c = b.tensor('c', [], dtype='int8', quant={'scale': [s2], 'zero_point': [z2]},
                     data=np.array(cv, np.int8))
        y = b.tensor('y', [1, 256], dtype='int8', quant={'scale': [sy], 'zero_point': [zy]})
        b.op('DIV', [x, c], [y], fused_activation_function='NONE')
        b.inputs(x)
        b.outputs(y)
        p = b.save(str(tmp_path / f'd{trial}.tflite'))
        it = runtime.Interpreter.from_file(p)
        it.set_input(np.arange(-128, 128).astype(np.int8).reshape(1, 256), 0)
        it.invoke()
        ref = it.get_output(0).ravel()
        d = quant.layers(quant.rewritten(read_model(p)), 'all')[0]
        assert d['k'] == quant.LUT and d['in'] == [0]
        t = np.array(d['t'])
        v = cv - z2
        m, e = quant._f32div(sx, s2, sy)
        a = (np.arange(-128, 128) - zx) * np.sign(v)
        hr = np.array([31 if k == 0 else 31 - int(~k if k < 0 else k).bit_length() for k in a])
        # (where TFLite Micro shifts by 32 or more and a != 0 x86 builds wrap the shift)
        ok = (e - (abs(v).bit_length() - 1) - hr >= -31) | (a == 0)
        assert ok.sum() > 200 and np.array_equal(t[ok], ref[ok]), trial
        assert set(t[~ok]) <= {zy - 1, zy + 1}
        dt = np.array(d['dt']) * d.get('ds', 1) / 16384
        inside = (t > -128) & (t < 127)
        assert np.allclose(dt[inside], 1 / (v * s2), rtol=1e-3) and not dt[~inside].any()
    b = CircleBuilder(identifier=b'TFL3')
    q = {'scale': [0.05], 'zero_point': [3]}
    x = b.tensor('x', [1, 4], dtype='int8', quant=q)
    n = b.tensor('n', [1, 4], dtype='int8', quant={'scale': [0.07], 'zero_point': [-2]})
    b.op('NEG', [x], [n])
    y = b.tensor('y', [1, 4], dtype='int8', quant=q)
    b.op('DIV', [n, b.tensor('c', [4], dtype='int8', quant=q, data=np.arange(1, 5).astype(np.int8))], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    p = b.save(str(tmp_path / 'neg.tflite'))
    g = quant.rewritten(read_model(p))
    assert [(d['k'], d.get('bo')) for d in quant.layers(g, 'all')] == [(quant.LUT, None), (quant.BIN, 3)]
    g.ops = g.ops[:1]
    g.outputs = [n]
    d = quant.layers(g, 'all')[0]
    q8 = np.arange(-128, 128)
    assert d['t'] == [int(v) for v in np.clip(np.round(-(q8 - 3) * 0.05 / 0.07) - 2, -128, 127)]
    assert set(d['dt'][10:100]) == {-16384}


def _fc_softmax_dequantized(path, r, float_in, uint8=False):
    """An int8 FC (3 of 8, weights drawn from r), SOFTMAX, DEQUANTIZE to a float output,
    its input float through a QUANTIZE (float_in, the converter's default) or int8
    (inference_input_type int8 alone); uint8: input and output uint8 through QUANTIZEs
    (inference_input_type and inference_output_type tf.uint8).  Returns (path, the
    SOFTMAX's output tensor)."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 8]) if float_in and not uint8 else \
        b.tensor('x', [1, 8], dtype='uint8', quant={'scale': [0.04], 'zero_point': [125]}) \
        if uint8 else None
    xq = b.tensor('xq', [1, 8], dtype='int8', quant={'scale': [0.04], 'zero_point': [-3]})
    if float_in or uint8:
        b.op('QUANTIZE', [x], [xq])
    else:
        x = xq
    w = r.integers(-127, 128, (3, 8)).astype(np.int8)
    y = b.tensor('y', [1, 3], dtype='int8', quant={'scale': [0.09], 'zero_point': [2]})
    b.op('FULLY_CONNECTED', [xq, b.tensor('w', w.shape, data=w, quant={'scale': [0.01], 'zero_point': [0]}),
                             b.tensor('b', [3], data=np.array([50, -20, 0], np.int32),
                                      quant={'scale': [0.0004], 'zero_point': [0]})], [y])
    p = b.tensor('p', [1, 3], dtype='int8', quant={'scale': [1 / 256], 'zero_point': [-128]})
    b.op('SOFTMAX', [y], [p], beta=1.0)
    if uint8:
        pf = b.tensor('pu', [1, 3], dtype='uint8', quant={'scale': [1 / 256], 'zero_point': [0]})
        b.op('QUANTIZE', [p], [pf])
    else:
        pf = b.tensor('pf', [1, 3])
        b.op('DEQUANTIZE', [p], [pf])
    b.inputs(x)
    b.outputs(pf)
    return b.save(str(path)), p


def test_float_input_and_output_ends_train_as_int8(tmp_path, monkeypatch):
    """A full-int8 model as the converter writes it without inference_input_type (float
    input QUANTIZE, int8 FC, SOFTMAX, DEQUANTIZE to a float output): an int8 model whose
    input is the QUANTIZE's output and whose logits are the FC's; the board's forward
    dequantized is TFLite Micro's float logits; prepare trains it as int8 (with a loss the
    int8 path takes; with mse dequantized, as before)."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.prepare.pipeline import prepare
    r = np.random.default_rng(1)
    path, p = _fc_softmax_dequantized(tmp_path / 'fio.tflite', r, float_in=True)
    g = read_model(path)
    assert quant.float_ends(g) and not quant.is_int8(g)
    g = quant.rewritten(g)
    assert g.inputs == [1] and g.outputs == [p] and [op.number for op in g.ops] == [1, 2]
    monkeypatch.setattr(quant, '_widen_logits', lambda g: None)     # (the file's logits)
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert [d['k'] for d in m['layers']] == [quant.FC] and (m['sx'], m['zx']) == (np.float32(0.04), -3)
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(path)
    for i in range(5):
        q = r.integers(-128, 128, 8)
        it.set_input(((q + 3) * np.float32(0.04)).astype(np.float32).reshape(1, 8), 0)
        it.invoke()
        got = np.frombuffer(bytes(net.forward(bytearray(q.astype(np.int8).tobytes()))), np.int8)
        z = (got.astype(np.float64) - 2) * 0.09
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert np.abs(it.get_output(0).ravel() - want).max() < 2 / 256
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((12, 8)).astype(np.float32), y=r.integers(0, 3, 12))
    s = prepare(path, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce', train='all',
                log=lambda *a: None)
    assert os.path.exists(tmp_path / 'run' / 'q8.json') and s['trainable_params'] == 27
    np.savez(tmp_path / 'm.npz', x=r.standard_normal((12, 8)).astype(np.float32),
             y=r.random((12, 3)).astype(np.float32))
    s = prepare(path, str(tmp_path / 'mse'), data=str(tmp_path / 'm.npz'), loss='mse', train='all',
                log=lambda *a: None)        # (settings int8 training does not take: float32)
    assert not os.path.exists(tmp_path / 'mse' / 'q8.json') and s['trainable_params'] == 27


def test_int8_input_with_a_float_output_trains_as_int8(tmp_path):
    """inference_input_type int8 with a float output (int8 input, FC, SOFTMAX, DEQUANTIZE
    last; a held-out Keras model was refused: "op 6 (SOFTMAX) is not supported by int8
    training"): the DEQUANTIZE goes as it does with a float input, and prepare trains it
    as int8."""
    from host_tools.prepare.pipeline import prepare
    r = np.random.default_rng(2)
    path, p = _fc_softmax_dequantized(tmp_path / 'i8f.tflite', r, float_in=False)
    g = quant.rewritten(read_model(path))
    assert g.outputs == [p] and [op.name for op in g.ops] == ['FULLY_CONNECTED', 'SOFTMAX']
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((12, 8)).astype(np.float32), y=r.integers(0, 3, 12))
    s = prepare(path, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce', train='all',
                log=lambda *a: None)
    assert os.path.exists(tmp_path / 'run' / 'q8.json') and s['trainable_params'] == 27


def test_uint8_input_and_output_ends_train_as_int8_and_export_as_uint8(tmp_path):
    """Issue 28: a full-int8 model converted with inference_input_type and
    inference_output_type tf.uint8 (as Edge Impulse's uint8 models are: QUANTIZE uint8 ->
    int8 first, QUANTIZE int8 -> uint8 last) had trained dequantized in float32, saying no
    why; its int8 middle is the model, as with float ends: it trains as int8, and export
    writes the uint8 ends back (TFLite Micro runs it as it ran the file)."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.prepare.pipeline import prepare, export
    r = np.random.default_rng(3)
    path, p = _fc_softmax_dequantized(tmp_path / 'u8.tflite', r, float_in=False, uint8=True)
    g = read_model(path)
    assert quant.float_ends(g) and not quant.is_int8(g)
    gr = quant.rewritten(g)
    assert gr.inputs == [1] and gr.outputs == [p] and [op.name for op in gr.ops] == [
        'FULLY_CONNECTED', 'SOFTMAX']
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((12, 8)).astype(np.float32), y=r.integers(0, 3, 12))
    s = prepare(path, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce', train='all',
                log=lambda *a: None)
    assert os.path.exists(tmp_path / 'run' / 'q8.json') and s['trainable_params'] == 27
    out = str(tmp_path / 'out.tflite')
    export(path, str(tmp_path / 'run' / 'weights.wof'), out)
    h = read_model(out)
    assert [h.tensors[k].dtype for k in h.inputs + h.outputs] == ['uint8', 'uint8']
    assert [op.name for op in h.ops] == ['QUANTIZE', 'FULLY_CONNECTED', 'SOFTMAX', 'QUANTIZE']
    a, b = runtime.Interpreter.from_file(path), runtime.Interpreter.from_file(out)
    for i in range(4):
        q = r.integers(0, 256, (1, 8)).astype(np.uint8)
        for it in (a, b):
            it.set_input(q, 0)
            it.invoke()
        assert b.get_output(0).dtype == np.uint8
        np.testing.assert_array_equal(a.get_output(0), b.get_output(0))


def _div(tmp_path):
    from kerasgraphs import build_int8_div
    return _tabled(tmp_path, build_int8_div(tmp_path / 'd.tflite'), 8, 6)


def test_int8_div_by_a_tensor_is_tflite_micros_integers(tmp_path, monkeypatch):
    """DIV of two int8 tensors (h / e, e broadcast over the channels) and by a per-channel
    constant (issue 28): BIN layers whose forward is TFLite Micro's div.cc (a reciprocal
    per divisor value, two products; ReLU's zeros divided as it rounds them), bit-exact;
    the update of the dividend's layer and of the divisor's against finite differences
    (cosine 0.98-1.0; 0.82 on a sample whose dividend is mostly ReLU's zeros, where the
    int8 forward's quotients differ from float's most)."""
    path, fwd, ss, sx, g, m, xs = _div(tmp_path)
    assert [(d['k'], d.get('bo')) for d in m['layers']] == [
        (quant.CONV, None), (quant.CONV, None), (quant.BIN, 3), (quant.BIN, 3), (quant.FC, None)]
    _tflm_matches(path, m, tmp_path, xs)
    spy = spy_updates(monkeypatch)
    w0 = {k: next(t for t in g.tensors if t.name == k).data.astype(np.float64) * ss[k]
          for k in ('w1', 'w2')}
    cos = {'w1': [], 'w2': []}
    for i, xq in enumerate(xs):
        xf = xq.astype(np.float64) * sx
        for k, n in (('w1', 20), ('w2', 5)):
            net = Q8Net(m, str(tmp_path / 'weights.wof'))
            spy.clear()
            net.step(bytearray(xq.tobytes()), i % 3, 0.01)
            upd = next(u for u in spy if len(u) == n) / 256.0 * ss[k]
            ref = 0.01 * _fd_grad(lambda x, w: fwd(x, {k: w}), xf, w0[k], i % 3, 1e-5)
            c = float(upd @ ref / (np.linalg.norm(upd) * np.linalg.norm(ref) + 1e-30))
            cos[k].append(c)
            assert 0.6 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.6, (k, i)
    for k in cos:
        assert min(cos[k]) > 0.8 and np.mean(cos[k]) > 0.95, (k, cos[k])


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_int8_div_steps_under_viper_as_the_host(tmp_path):
    """Three SGD steps through the DIVs under viper end with the host's weights."""
    xs = _div(tmp_path)[-1]
    _viper_matches(tmp_path, tmp_path, xs[:3])


def _sqd(tmp_path):
    from kerasgraphs import build_int8_sqd_minmax
    built = build_int8_sqd_minmax(tmp_path / 's.tflite')
    path, fwd, ss, sx = built
    g = quant.rewritten(read_model(path))
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    r = np.random.default_rng(3)
    return path, fwd, ss, sx, g, m, [r.integers(-120, 121, (4, 5)).astype(np.int8) for _ in range(6)]


def test_squared_difference_maximum_minimum_are_tflite_micros_integers(tmp_path, monkeypatch):
    """SQUARED_DIFFERENCE (one input broadcast), MAXIMUM (one scale) and MINIMUM with a
    per-channel constant, as Keras's converter writes tf.math.squared_difference,
    tf.maximum and tf.minimum (int8 kernels; they were refused): BIN layers whose forward
    is TFLite Micro's integers, bit-exact; the update of each of the three Dense layers
    that feed them against finite differences of the float graph (2 (a - b) to both
    sides of the difference, the gradient to the input taken by the max, the min's cap
    passing none)."""
    path, fwd, ss, sx, g, m, xs = _sqd(tmp_path)
    assert [(d['k'], d.get('bo')) for d in m['layers'][3:6]] == [
        (quant.BIN, 4), (quant.BIN, 5), (quant.BIN, 6)]
    _tflm_matches(path, m, tmp_path, xs)
    spy = spy_updates(monkeypatch)
    w0 = {k: next(t for t in g.tensors if t.name == k).data.astype(np.float64) * ss[k]
          for k in ss}
    size = {'w1': 15, 'w2': 5, 'w3': 15}
    cos = {k: [] for k in ss}
    for i, xq in enumerate(xs):
        xf = xq.astype(np.float64) * sx
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        spy.clear()
        net.step(bytearray(xq.tobytes()), i % 3, 0.01)
        for k in ss:
            upd = spy[-1 - ['w1', 'w2', 'w3'].index(k)] / 256.0 * ss[k]     # (backward order: w1's last)
            assert len(upd) == size[k]
            ref = 0.01 * _fd_grad(lambda x, w: fwd(x, {k: w}), xf, w0[k], i % 3, 1e-5)
            if np.linalg.norm(ref) < 1e-9:     # (the max took none of c's outputs)
                assert np.abs(upd).max() == 0
                continue
            cos[k].append(float(upd @ ref / (np.linalg.norm(upd) * np.linalg.norm(ref))))
            assert 0.6 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.6, (k, i)
    for k in cos:
        assert len(cos[k]) >= 4 and min(cos[k]) > 0.9 and np.mean(cos[k]) > 0.97, (k, cos[k])


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_squared_difference_maximum_minimum_step_under_viper_as_the_host(tmp_path):
    """Three SGD steps through them under viper end with the host's weights."""
    xs = _sqd(tmp_path)[-1]
    _viper_matches(tmp_path, tmp_path, xs[:3])


def _div_island_file(tmp_path, sy, n=4096, op='DIV'):
    """DEQUANTIZE a, DEQUANTIZE b, DIV (op) in float32, QUANTIZE (Keras's a / b of two int8
    tensors of n values, scales 0.0066, zero points -128; the quotient at sy)."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    q = {'scale': [0.0066], 'zero_point': [-128]}
    x = b.tensor('x', [1, 2, n], dtype='int8', quant=q)
    a, c = b.tensor('a', [1, 1, n], dtype='int8', quant=q), b.tensor('c', [1, 1, n], dtype='int8', quant=q)
    for k, t in enumerate((a, c)):
        b.op('SLICE', [x, b.tensor(f'b{k}', [3], data=np.array([0, k, 0], np.int32)),
                       b.tensor(f'n{k}', [3], data=np.array([1, 1, n], np.int32))], [t])
    fa, fc, fy = b.tensor('fa', [1, 1, n]), b.tensor('fc', [1, 1, n]), b.tensor('fy', [1, 1, n])
    y = b.tensor('y', [1, 1, n], dtype='int8', quant={'scale': [sy], 'zero_point': [-128]})
    b.op('DEQUANTIZE', [a], [fa])
    b.op('DEQUANTIZE', [c], [fc])
    b.op(op, [fa, fc], [fy], **({'fused_activation_function': 'NONE'} if op == 'DIV' else {}))
    b.op('QUANTIZE', [fy], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(tmp_path / f'i{sy}{op}.tflite'))


@pytest.mark.parametrize('op,hint', [('POW', 'x * x'), ('FLOOR_DIV', 'gradient is zero'),
                                     ('ATAN2', 'two tensors themselves')])
def test_a_float_op_of_two_int8_tensors_no_path_trains_is_refused_naming_it(tmp_path, op, hint):
    """POW, FLOOR_DIV and ATAN2 of two int8 tensors (TF's converter leaves them in float32
    between DEQUANTIZEs and a QUANTIZE: no int8 kernel; held-out Keras files of
    tf.math.pow, floordiv, atan2 of two Dense outputs were so): a function of 65,536 input
    pairs, no table, and the float path has no kernel either: prepare refuses naming the
    op, not the DEQUANTIZE, and says what to do."""
    from host_tools.graph.passes import PrepareError
    from host_tools.prepare.pipeline import prepare
    p = _div_island_file(tmp_path, 0.01, 8, op)
    np.savez(tmp_path / 'd.npz', x=np.zeros((4, 2, 8), np.float32), y=np.zeros(4, np.int64))
    with pytest.raises(PrepareError) as e:
        prepare(p, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce',
                log=lambda *a: None)
    msg = str(e.value)
    assert msg.count(p) == 1 and f'op 4 ({op})' in msg and 'on two int8 tensors' in msg, msg
    assert 'compute it outside the model' in msg and hint in msg and 'DEQUANTIZE)' not in msg, msg


def test_a_float_div_of_two_int8_tensors_is_an_int8_div_where_they_agree(tmp_path):
    """Keras's a / b of two int8 tensors (float32 between DEQUANTIZEs and a QUANTIZE, no
    int8 kernel in the converter): an int8 DIV (BIN) where TFLite Micro's int8 div.cc
    gives the float ops' result on all 65536 input pairs (these scales: the held-out
    model's), bit-exact with TFLite Micro on the file; where they differ (another output
    scale) refused naming the first pair."""
    from tflite_micro.python.tflite_micro import runtime
    p = _div_island_file(tmp_path, 0.0042)
    g = quant.rewritten(read_model(p))
    assert [(e['k'], e.get('bo')) for e in quant.layers(g, 'all')] == [
        (quant.SLC, None), (quant.SLC, None), (quant.BIN, 3)]
    quant.write(g, str(tmp_path), 'none')
    with open(tmp_path / 'q8.json') as f:
        net = Q8Net(json.load(f), str(tmp_path / 'weights.wof'))
    r = np.random.default_rng(5)
    x = r.integers(-128, 128, (2, 4096)).astype(np.int8)
    x[1][x[1] == -128] = -127                       # (no division by 0)
    it = runtime.Interpreter.from_file(p, arena_size=1 << 20)
    it.set_input(x.reshape(1, 2, -1), 0)
    it.invoke()
    got = np.frombuffer(bytes(net.forward(bytearray(x.tobytes()))), np.int8)
    assert np.array_equal(got, it.get_output(0).ravel())
    p = _div_island_file(tmp_path, 0.006)
    with pytest.raises(ValueError, match=r'DIV op 4 divides two int8 tensors in float32 .* differs '
                                         r'from it at these scales \(first at int8 inputs -?\d+ / '
                                         r'-?\d+\): export the model with an int8 DIV'):
        quant.layers(quant.rewritten(read_model(p)), 'all')


def test_unpack_and_tiling_slices_become_splits(tmp_path, monkeypatch):
    """Keras's unrolled steps (UNPACK: a SPLIT and RESHAPEs) and slices that tile the
    channels (one SPLIT_V) on an int8 graph: rewritten as for float, bit-exact with TFLite
    Micro, the first layer's update through them against finite differences."""
    from tflite_micro.python.tflite_micro import runtime
    from kerasgraphs import build_int8_unpack
    path, fwd, s1, sx = build_int8_unpack(tmp_path / 'u.tflite')
    g = quant.rewritten(read_model(path))
    assert g.rewrites['splits'] == 2
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert [d['k'] for d in m['layers']] == [quant.CONV] + [quant.SLC] * 8 + [
        quant.BIN, quant.CAT, quant.FC]
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(path)
    r = np.random.default_rng(2)
    xs = [r.integers(-120, 121, (6, 5)).astype(np.int8) for _ in range(5)]
    outs = set()
    for xq in xs:
        got = np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8)
        it.set_input(xq.reshape(1, 6, 5), 0)
        it.invoke()
        assert np.array_equal(got, it.get_output(0).ravel())
        outs.add(tuple(got))
    assert len(outs) == len(xs)
    _steps_as_differences(monkeypatch, tmp_path, g, m, xs, fwd, s1, sx, 0.93, 0.97, True)


def test_an_op_without_an_int8_kernel_is_refused_saying_what_to_do(tmp_path):
    """An op neither path runs (ATAN2 of two activations; POW of two trains in float
    since session 32): prepare names the file once, the op by its number in the file,
    and what to do."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.pipeline import prepare
    from host_tools.graph.passes import PrepareError
    b = CircleBuilder(identifier=b'TFL3')
    q = {'scale': [0.05], 'zero_point': [0]}
    x = b.tensor('x', [1, 4], dtype='int8', quant=q)
    h = b.tensor('h', [1, 4], dtype='int8', quant=q)
    w = np.ones((4, 4), np.int8)
    b.op('FULLY_CONNECTED', [x, b.tensor('w', w.shape, data=w, quant={'scale': [0.01], 'zero_point': [0]}), -1],
         [h])
    mx = b.tensor('mx', [1, 4], dtype='int8', quant=q)
    b.op('ATAN2', [h, x], [mx])
    y = b.tensor('y', [1, 3], dtype='int8', quant={'scale': [0.1], 'zero_point': [0]})
    b.op('FULLY_CONNECTED', [mx, b.tensor('w2', (3, 4), data=np.ones((3, 4), np.int8),
                                          quant={'scale': [0.01], 'zero_point': [0]}), -1], [y])
    b.inputs(x)
    b.outputs(y)
    p = b.save(str(tmp_path / 'mx.tflite'))
    np.savez(tmp_path / 'd.npz', x=np.zeros((4, 4), np.float32), y=np.zeros(4, np.int64))
    with pytest.raises(PrepareError) as e:
        prepare(p, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce',
                log=lambda *a: None)
    msg = str(e.value)
    assert msg.count('mx.tflite') == 1 and 'op 1 (ATAN2)' in msg and 'export the model' in msg


def test_an_op_only_the_float_path_runs_trains_dequantized(tmp_path):
    """An int8 model with an op int8 training has no kernel for but the float path runs
    (ABS; PRELU was one before it trained as int8): prepare trains it in float32,
    dequantized, and says why."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.pipeline import prepare
    r = np.random.default_rng(3)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s, z=0: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    x = b.tensor('x', [1, 4], dtype='int8', quant=q(0.05))
    h = b.tensor('h', [1, 6], dtype='int8', quant=q(0.05))
    b.op('FULLY_CONNECTED', [x, b.tensor('w', (6, 4), data=r.integers(-100, 100, (6, 4)).astype(np.int8),
                                         quant=q(0.01)), -1], [h])
    p_ = b.tensor('p', [1, 6], dtype='int8', quant=q(0.04))
    b.op('ABS', [h], [p_])
    y = b.tensor('y', [1, 3], dtype='int8', quant=q(0.1))
    b.op('FULLY_CONNECTED', [p_, b.tensor('w2', (3, 6), data=r.integers(-100, 100, (3, 6)).astype(np.int8),
                                          quant=q(0.01)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    path = b.save(str(tmp_path / 'ab.tflite'))
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((8, 4)).astype(np.float32), y=r.integers(0, 3, 8))
    said = []
    s = prepare(path, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce', from_logits=True,
                log=lambda *a: said.append(' '.join(map(str, a))))
    assert not os.path.exists(tmp_path / 'run' / 'q8.json')
    assert any('trains in float32, dequantized' in m and 'op 1 (ABS)' in m for m in said), said
    assert 'op 1 (ABS)' in s['dequantized_because']


def test_an_op_form_only_the_float_path_takes_trains_dequantized(tmp_path):
    """An int8 model with an op of a form int8 training refuses while the float path
    trains it (a MAXIMUM of inputs at two scales, which TFLite's int8 kernel compares as
    codes; a MEAN over the channels of [1, T, C] was the example until int8 training took
    it, quant._trailing_means) trains in float32, dequantized, when nobody named
    --dequantize, as an op without an int8 kernel does; the reason is said once, without
    the refusal's own '--dequantize' advice twice."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.pipeline import prepare
    r = np.random.default_rng(4)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s, z=0: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    x = b.tensor('x', [1, 4], dtype='int8', quant=q(0.05))
    m = b.tensor('m', [1, 4], dtype='int8', quant=q(0.05))
    b.op('MAXIMUM', [x, b.tensor('c', [4], data=np.array([-3, 0, 5, 9], np.int8), dtype='int8',
                                 quant=q(0.1))], [m])
    y = b.tensor('y', [1, 3], dtype='int8', quant=q(0.1))
    b.op('FULLY_CONNECTED', [m, b.tensor('w', (3, 4), data=r.integers(-100, 100, (3, 4)).astype(np.int8),
                                         quant=q(0.01)), b.tensor('bi', [3], data=np.zeros(3, np.int32),
                                                                  dtype='int32', quant=q(0.0005))], [y])
    b.inputs(x)
    b.outputs(y)
    path = b.save(str(tmp_path / 'mn.tflite'))
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((8, 4)).astype(np.float32), y=r.integers(0, 3, 8))
    said = []
    s = prepare(path, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce', from_logits=True,
                log=lambda *a: said.append(' '.join(map(str, a))))
    assert not os.path.exists(tmp_path / 'run' / 'q8.json')
    why = [m for m in said if 'trains in float32, dequantized' in m]
    assert len(why) == 1 and 'MAXIMUM op 0' in why[0] and why[0].count('--dequantize') == 1, said
    assert 'MAXIMUM op 0' in s['dequantized_because']
    g = read_model(path)            # (a refusal, where one is made: the advice once)
    try:
        quant.layers(quant.rewritten(g), 'all')
    except ValueError as e:
        msg = quant.refusal(g, path, str(e), 'all')
    assert msg.count('--dequantize') == 1 and msg.count('mn.tflite') == 1, msg


def test_prefix_cache_takes_a_constant_input_in_the_trained_part(tmp_path):
    """--cache: the trained part may read a constant (an ADD of a bias vector) besides
    the one tensor the frozen layers end with; the split's trained table computes what
    the whole table does."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s, z=0: {'scale': [s], 'zero_point': [z]}    # noqa: E731
    r = np.random.default_rng(0)
    x = b.tensor('x', [1, 6], dtype='int8', quant=q(0.05))
    h = b.tensor('h', [1, 6], dtype='int8', quant=q(0.05))
    b.op('FULLY_CONNECTED', [x, b.tensor('w0', (6, 6), data=r.integers(-90, 90, (6, 6)).astype(np.int8),
                                         quant=q(0.01)), -1], [h])
    h2 = b.tensor('h2', [1, 4], dtype='int8', quant=q(0.05))
    b.op('FULLY_CONNECTED', [h, b.tensor('w1', (4, 6), data=r.integers(-90, 90, (4, 6)).astype(np.int8),
                                         quant=q(0.01)), -1], [h2])
    a = b.tensor('a', [1, 4], dtype='int8', quant=q(0.06, 3))
    b.op('ADD', [h2, b.tensor('kc', [4], data=np.array([-50, 20, 60, 0], np.int8), quant=q(0.01))],
         [a])
    y = b.tensor('y', [1, 3], dtype='int8', quant=q(0.1))
    b.op('FULLY_CONNECTED', [a, b.tensor('w2', (3, 4), data=r.integers(-90, 90, (3, 4)).astype(np.int8),
                                         quant=q(0.02)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    g = quant.rewritten(read_model(b.save(str(tmp_path / 'c.tflite'))))
    m = quant.meta(g, 'last:3')
    p, t = quant.split(g, m)
    assert [d['k'] for d in t['layers']] == [quant.FC, quant.BIN, quant.FC]
    _split_computes_the_whole(tmp_path, g, m, p, t, r)


def _split_computes_the_whole(tmp_path, g, m, p, t, r):
    """The prefix table p then the trained table t (quant.split of m) compute what the
    whole table m does, on 4 int8 inputs of 6 values."""
    quant.write(g, str(tmp_path / 'whole'), m=m)
    quant.write(g, str(tmp_path / 'cut'), m=m, tables={'q8.json': p, 'q8t.json': t})

    def load(d, name):
        with open(tmp_path / d / name) as f:
            return Q8Net(json.load(f), str(tmp_path / d / 'weights.wof'))
    net, pn, tn = load('whole', 'q8.json'), load('cut', 'q8.json'), load('cut', 'q8t.json')
    for i in range(4):
        xq = bytearray(r.integers(-120, 120, 6).astype(np.int8).tobytes())
        assert bytes(net.forward(xq)) == bytes(tn.forward(bytearray(pn.forward(xq))))


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_the_plan_bounds_the_heap_it_needs(tmp_path):
    """The heap planner prices q8bin and q8slc (their bytecode, the broadcast tables, the
    gradient buffers they ask for): the run trains in the planned heap, not in plan / 1.2."""
    path = build_int8_binary(tmp_path / 'b.tflite')[0]
    x = np.random.default_rng(4).uniform(-2.4, 2.4, (6, H, W, I)).astype(np.float32)
    plan_bounds_the_heap(tmp_path, path, x)


def plan_bounds_the_heap(tmp_path, path, x):
    """prepare int8 model path on samples x: the run trains in the planned heap (unix
    MicroPython), not in plan / 1.2."""
    from host_tools.plan.memory import trains_in
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(len(x)) % 3)
    out = str(tmp_path / 'run')
    s = prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd', lr=0.01,
                epochs=1, train='all', log=lambda *a: None)
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), plan
    assert not trains_in(out, int(plan / 1.2)), plan


def test_a_binary_op_of_frozen_tensors_above_a_trained_layer(tmp_path):
    """A MUL whose inputs both come from frozen layers, read after the first trained
    layer (a branch beside it): the backward pass walks through it giving neither input
    a gradient, and the trained layer still gets the sum's."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s, z=0: {'scale': [s], 'zero_point': [z]}    # noqa: E731
    r = np.random.default_rng(1)
    x = b.tensor('x', [1, 6], dtype='int8', quant=q(0.05))

    def fc(name, src, n, s=0.05):
        t = b.tensor(name, [1, n], dtype='int8', quant=q(s))
        w = r.integers(-90, 90, (n, 6)).astype(np.int8)
        b.op('FULLY_CONNECTED', [src, b.tensor('w' + name, w.shape, data=w, quant=q(0.01)), -1], [t])
        return t
    f0, f1, c = fc('f0', x, 4), fc('f1', x, 4), fc('c', x, 4)
    m = b.tensor('m', [1, 4], dtype='int8', quant=q(0.02))
    b.op('MUL', [f0, f1], [m])
    a = b.tensor('a', [1, 4], dtype='int8', quant=q(0.06))
    b.op('ADD', [m, c], [a])
    y = b.tensor('y', [1, 3], dtype='int8', quant=q(0.1))
    w = r.integers(-90, 90, (3, 4)).astype(np.int8)
    b.op('FULLY_CONNECTED', [a, b.tensor('wy', w.shape, data=w, quant=q(0.02)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    g = quant.rewritten(read_model(b.save(str(tmp_path / 'f.tflite'))))
    quant.write(g, str(tmp_path), [2, 5])
    with open(tmp_path / 'q8.json') as f:
        m8 = json.load(f)
    assert [d['k'] for d in m8['layers']][3] == quant.BIN and m8['layers'][3].get('back')
    net = Q8Net(m8, str(tmp_path / 'weights.wof'))
    w0 = bytes(net.layers[2].w)
    for i in range(3):
        net.step(bytearray(r.integers(-120, 120, 6).astype(np.int8).tobytes()), i, 0.05)
    assert bytes(net.layers[2].w) != w0


def _rnn_like(tmp_path, zero_state=False):
    """An int8 graph as Keras 3 writes an unrolled recurrent layer: TRANSPOSE [1, T, C] ->
    [T, 1, C] (only a unit axis moves: the same bytes), SPLIT into steps, each step's FC
    with one shared weight tensor (and, zero_state, an FC of a constant zero state), ADD,
    then an FC."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s, z=0: {'scale': [s], 'zero_point': [z]}    # noqa: E731
    r = np.random.default_rng(2)
    x = b.tensor('x', [1, 2, 3], dtype='int8', quant=q(0.05))
    tr = b.tensor('tr', [2, 1, 3], dtype='int8', quant=q(0.05))
    b.op('TRANSPOSE', [x, b.tensor('perm', [3], data=np.array([1, 0, 2], np.int32))], [tr])
    st = [b.tensor(f's{k}', [1, 1, 3], dtype='int8', quant=q(0.05)) for k in range(2)]
    b.op('SPLIT', [b.tensor('ax', [], data=np.array(0, np.int32)), tr], st, num_splits=2)
    w = b.tensor('w', (4, 3), data=r.integers(-90, 90, (4, 3)).astype(np.int8), quant=q(0.01))
    hs = []
    for k in range(2):
        rs = b.tensor(f'r{k}', [1, 3], dtype='int8', quant=q(0.05))
        b.op('RESHAPE', [st[k], b.tensor(f'rs{k}', [2], data=np.array([1, 3], np.int32))], [rs])
        h = b.tensor(f'h{k}', [1, 4], dtype='int8', quant=q(0.04))
        b.op('FULLY_CONNECTED', [rs, w, -1], [h])
        hs.append(h)
    if zero_state:
        z = b.tensor('zeros', [1, 4], data=np.zeros((1, 4), np.int8), quant=q(0.04))
        h = b.tensor('hz', [1, 4], dtype='int8', quant=q(0.04))
        b.op('FULLY_CONNECTED', [z, b.tensor('wz', (4, 4), data=np.ones((4, 4), np.int8),
                                                  quant=q(0.01)),
                                 b.tensor('bz', [4], data=np.array([50, -30, 10, 0], np.int32),
                                          quant=q(0.04 * 0.01))], [h])
        hs[1] = h
    a = b.tensor('a', [1, 4], dtype='int8', quant=q(0.06))
    b.op('ADD', hs, [a])
    y = b.tensor('y', [1, 3], dtype='int8', quant=q(0.1))
    b.op('FULLY_CONNECTED', [a, b.tensor('wy', (3, 4), data=r.integers(-90, 90, (3, 4)).astype(np.int8),
                                         quant=q(0.02)), -1], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(tmp_path / ('z.tflite' if zero_state else 'rnn.tflite')))


def test_unrolled_steps_transposed_split_and_a_zero_state(tmp_path):
    """A TRANSPOSE that moves only a unit axis is its input's bytes (no layer: TFLite
    Micro's output bit for bit); steps sharing a weight tensor train it as one (q8.json
    'sh': the first step's layer, utrain.q8share); an FC of a
    constant zero state (Keras's unrolled SimpleRNN, GRU and LSTM: refused, even for the
    classifier alone) reads it as a constant made once: TFLite Micro's output bit for
    bit, and its bias trains (its weights get no gradient: their input is zero)."""
    from tflite_micro.python.tflite_micro import runtime
    p = _rnn_like(tmp_path)
    g = quant.rewritten(read_model(p))
    quant.write(g, str(tmp_path / 'r'), 'last:1')
    with open(tmp_path / 'r' / 'q8.json') as f:
        m = json.load(f)
    assert [d['k'] for d in m['layers']] == [quant.SLC, quant.SLC, quant.FC, quant.FC, quant.ADD,
                                             quant.FC]
    net = Q8Net(m, str(tmp_path / 'r' / 'weights.wof'))
    it = runtime.Interpreter.from_file(p)
    for v in ([10, -20, 30, 40, -50, 60], [-100, 3, 7, 90, 11, -2]):
        xq = np.array(v, np.int8)
        it.set_input(xq.reshape(1, 2, 3), 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8),
                              it.get_output(0).ravel())
    ls = quant.layers(quant.rewritten(read_model(p)), 'all')     # (one weight, two steps:
    assert [d.get('sh') for d in ls if d['k'] == quant.FC] == [2, 2, None]  # utrain.q8share)
    pz = _rnn_like(tmp_path, zero_state=True)
    quant.write(quant.rewritten(read_model(pz)), str(tmp_path / 'z'), [6, 8])
    with open(tmp_path / 'z' / 'q8.json') as f:
        m = json.load(f)
    assert [d['op'] for d in m['layers'] if d.get('kt')] == [6]
    it = runtime.Interpreter.from_file(pz)
    r = np.random.default_rng(5)
    net = Q8Net(m, str(tmp_path / 'z' / 'weights.wof'))
    L = next(L for L in net.layers if L.d.get('kt'))
    b0, w0 = list(L.b), bytes(L.w)
    xs = [r.integers(-120, 121, 6).astype(np.int8) for _ in range(3)]
    for xq in xs:
        it.set_input(xq.reshape(1, 2, 3), 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8),
                              it.get_output(0).ravel())
    for i, xq in enumerate(xs):
        net.step(bytearray(xq.tobytes()), i, 0.05)
    assert list(L.b) != b0 and bytes(L.w) == w0


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_a_zero_state_steps_under_viper_as_the_host(tmp_path):
    """Three SGD steps of the zero-state graph (its FC reads the constant, the bias
    trains) under viper end with the host's weights."""
    quant.write(quant.rewritten(read_model(_rnn_like(tmp_path, zero_state=True))), str(tmp_path), [6, 8])
    r = np.random.default_rng(6)
    _viper_matches(tmp_path, tmp_path, [r.integers(-120, 121, 6).astype(np.int8) for _ in range(3)])


def test_int8_pack_trains_as_int8(tmp_path):
    """Issue 28: an int8 PACK of activations (the steps stacked back, here reversed) was
    refused; it is a CONCATENATION of the steps with a unit axis opened, the q8 forward =
    TFLite Micro exactly, and prepare trains it as int8 (no dequantization)."""
    from tflite_micro.python.tflite_micro import runtime
    from kerasgraphs import build_int8_pack
    from host_tools.prepare.pipeline import prepare
    path = build_int8_pack(tmp_path / 'p.tflite')
    g = quant.rewritten(read_model(path))
    assert g.rewrites['packs'] == 1 and 'PACK' not in [op.name for op in g.ops]
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert quant.CAT in [d['k'] for d in m['layers']]
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(path)
    r = np.random.default_rng(2)
    outs = set()
    for _ in range(6):
        xq = r.integers(-120, 121, (4, 3)).astype(np.int8)
        got = np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8)
        it.set_input(xq.reshape(1, 4, 3), 0)
        it.invoke()
        assert np.array_equal(got, it.get_output(0).ravel())
        outs.add(tuple(got))
    assert len(outs) > 3
    x = r.standard_normal((12, 4, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=r.integers(0, 3, 12))
    s = prepare(path, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),
                train='all', log=lambda *a: None)
    assert s.get('int8') and not s.get('dequantized_because')

    # TimeDistributed: the steps' layers share a weight: trained as int8 too, nobody
    # naming what trains or --train all (utrain.q8share; tests/int8/test_q8_share.py)
    path = build_int8_pack(tmp_path / 'td.tflite', shared=True)
    for k, train in enumerate((None, 'all')):
        s = prepare(path, os.fspath(tmp_path / f'run{k + 2}'), data=os.fspath(tmp_path / 'd.npz'),
                    train=train, log=lambda *a: None)
        assert s.get('int8') and not s.get('dequantized_because'), s


def build_tensordot_dense(path, seed=0):
    """A Dense on a 3-D input as TF 2.21's converter writes it (issue 28's held-out
    attention): x [1, 8, 3] -> RESHAPE [8, 3] -> FULLY_CONNECTED of per-channel int8
    weights, no bias -> RESHAPE [1, 8, 8] -> ADD of the bias as an int8 tensor [8] at its
    own scale and zero point (the output's scale a little off the FC's, as the converter
    leaves it) -> MEAN over the steps -> FC -> logits [3]; the ADD's output is a graph
    output too."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(seed)
    w = r.standard_normal((8, 3)) * 0.6
    sw = np.abs(w).max(axis=1) / 127
    wq = np.round(w / sw[:, None]).astype(np.int8)
    bias = r.standard_normal(8) * 0.004
    sb = (bias.max() - bias.min()) / 255
    zb = int(np.clip(round(-128 - bias.min() / sb), -128, 127))
    bq = np.clip(np.round(bias / sb) + zb, -128, 127).astype(np.int8)
    w2 = np.round(r.standard_normal((3, 8)) * 40).astype(np.int8)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 8, 3], dtype='int8', quant={'scale': [0.0295], 'zero_point': [-22]})
    x2 = b.tensor('x2', [8, 3], dtype='int8', quant={'scale': [0.0295], 'zero_point': [-22]})
    q = {'scale': [0.0341], 'zero_point': [-24]}
    f = b.tensor('f', [8, 8], dtype='int8', quant=q)
    f3 = b.tensor('f3', [1, 8, 8], dtype='int8', quant=q)
    a = b.tensor('a', [1, 8, 8], dtype='int8', quant={'scale': [0.03409], 'zero_point': [-23]})
    g = b.tensor('g', [1, 8], dtype='int8', quant={'scale': [0.0177], 'zero_point': [3]})
    y = b.tensor('y', [1, 3], dtype='int8', quant={'scale': [0.11], 'zero_point': [0]})
    b.op('RESHAPE', [x, b.tensor('s2', [2], data=np.array([8, 3], np.int32))], [x2])
    b.op('FULLY_CONNECTED', [x2, b.tensor('w', [8, 3], data=wq, quant={
        'scale': [float(s) for s in sw], 'zero_point': [0] * 8, 'quantized_dimension': 0}), -1], [f])
    b.op('RESHAPE', [f, b.tensor('s3', [3], data=np.array([1, 8, 8], np.int32))], [f3])
    b.op('ADD', [f3, b.tensor('bias', [8], data=bq, quant={'scale': [sb], 'zero_point': [zb]})], [a])
    b.op('MEAN', [a, b.tensor('ax', [1], data=np.array([1], np.int32))], [g], keep_dims=False)
    b.op('FULLY_CONNECTED', [g, b.tensor('w2', [3, 8], data=w2, quant={'scale': [0.004], 'zero_point': [0]}), -1], [y])
    b.inputs(x)
    b.outputs(y, a)
    return b.save(str(path))


def test_tensordot_dense_bias_add_bit_exact_with_tflite_micro(tmp_path):
    """A Dense on a 3-D input (FC of [8, 3] per-channel, then the int8 bias ADD as its own
    op, issue 28): the FC a layer of its own, the ADD a BIN layer requantizing the sum to
    its own scale (not folded into the FC's int32 bias: the FC's output is rounded to int8
    first), every value of the ADD's output and the logits TFLite Micro's.  (TFLite's
    interpreter, TF 2.21, rounds FULLY_CONNECTED's requantization once, TFLite Micro
    twice: the int8 FC output differs by one in about a fifth of the held-out model's
    samples; the board runs TFLite Micro's.)"""
    from tflite_micro.python.tflite_micro import runtime
    path = build_tensordot_dense(tmp_path / 'td.tflite')
    quant.write(quant.rewritten(read_model(path)), str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    L = m['layers']
    add = [d for d in L if d['k'] == quant.BIN]
    assert len(add) == 1 and add[0]['bo'] == 0 and add[0]['in'][0] == L[0]['out']
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(path)
    r = np.random.default_rng(7)
    seen = set()
    for _ in range(60):
        xq = r.integers(-128, 128, (1, 8, 3)).astype(np.int8)
        y = np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8)
        a = np.frombuffer(bytes(net.t[add[0]['out']]), np.int8)[:64]
        it.set_input(xq, 0)
        it.invoke()
        assert np.array_equal(a, it.get_output(1).ravel())
        assert np.array_equal(y, it.get_output(0).ravel())
        seen.add(a.tobytes())
    assert len(seen) == 60


def test_prefix_cache_cuts_below_a_residual_block(tmp_path):
    """--cache where the lowest trained layer is inside a residual block (its ADD also
    reads the block's input): the cut moves down to the block's input and the frozen
    layers from there run each step (before: refused, 'do not start from one tensor', and
    --select's int8 pricer counted every such choice as over the budget: the biases of
    MobileNetV2's ops 59, 60).  The split computes what the whole table does, and a run
    with the cache trains the same bytes as one without."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s, z=0: {'scale': [s], 'zero_point': [z]}    # noqa: E731
    r = np.random.default_rng(1)

    def fc(i, n_in, n_out, s, name, zp=0):
        o = b.tensor(name, [1, n_out], dtype='int8', quant=q(s, zp))
        w = b.tensor(name + 'w', (n_out, n_in), data=r.integers(-90, 90, (n_out, n_in)).astype(np.int8),
                     quant=q(0.01))
        bias = b.tensor(name + 'b', [n_out], dtype='int32', data=r.integers(-200, 200, n_out).astype(np.int32),
                        quant=q(0.01 * 0.05))
        b.op('FULLY_CONNECTED', [i, w, bias], [o])
        return o
    x = b.tensor('x', [1, 6], dtype='int8', quant=q(0.05))
    h = fc(x, 6, 6, 0.05, 'h')               # op 0: frozen, below the block (the prefix)
    h1 = fc(h, 6, 8, 0.05, 'h1')             # op 1: frozen, inside the block
    h2 = fc(h1, 8, 6, 0.05, 'h2', 2)         # op 2: its bias trains
    a = b.tensor('a', [1, 6], dtype='int8', quant=q(0.07, 1))
    b.op('ADD', [h2, h], [a])                # op 3: the skip reads op 0's output
    y = fc(a, 6, 3, 0.1, 'y')                # op 4: the classifier
    b.inputs(x)
    b.outputs(y)
    path = b.save(str(tmp_path / 'res.tflite'))
    g = quant.rewritten(read_model(path))
    m = quant.meta(g, 'none', ranks={2: 1, 4: 0})
    p, t = quant.split(g, m)
    assert [d['k'] for d in p['layers']] == [quant.FC]
    assert [d['k'] for d in t['layers']] == [quant.FC, quant.FC, quant.ADD, quant.FC]
    _split_computes_the_whole(tmp_path, g, m, p, t, r)
    np.savez(tmp_path / 'd.npz', x=r.uniform(-5, 5, (12, 6)).astype(np.float32), y=np.arange(12) % 3)
    got = {}
    for cache in (False, True):
        out = str(tmp_path / ('run%d' % cache))
        prepare(path, out, data=str(tmp_path / 'd.npz'), test_split=0.25, loss='scce', optimizer='sgd',
                lr=0.05, batch=1, epochs=2, train='none', ranks='2:bias,4:all', cache=cache,
                log=lambda *a: None)
        assert os.path.exists(os.path.join(out, 'q8t.json')) == cache
        code, text = runner.run(out, python=True, stream=False)
        assert code == 0, text[-500:]
        with open(os.path.join(out, 'trained.wof'), 'rb') as f:
            got[cache] = f.read()
    with open(tmp_path / 'run0' / 'weights.wof', 'rb') as f:
        assert got[False] != f.read()           # (it trained)
    assert got[True] == got[False]


def test_a_float_island_of_two_int8_tensors_trains_dequantized(tmp_path):
    """Issue 28: TF 2.21's full-integer converter leaves a Maximum / Subtract of two
    branches in float32 (DEQUANTIZE of each, SUB, QUANTIZE: a held-out Keras model with an
    ELU branch); int8 training cannot tabulate float ops of two tensors, and prepare
    stopped with an error where every other form only the float path takes trains
    dequantized on its own: now it says why once and trains it so."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.pipeline import prepare
    r = np.random.default_rng(5)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s, z=0: {'scale': [s], 'zero_point': [z]}     # noqa: E731
    x = b.tensor('x', [1, 4], dtype='int8', quant=q(0.05))
    hs = []
    for j in range(2):
        h = b.tensor(f'h{j}', [1, 5], dtype='int8', quant=q(0.04, 3 * j))
        b.op('FULLY_CONNECTED', [x, b.tensor(f'w{j}', (5, 4), data=r.integers(-100, 100, (5, 4)).astype(np.int8),
                                             quant=q(0.01)),
                                 b.tensor(f'b{j}', [5], data=np.zeros(5, np.int32), dtype='int32',
                                          quant=q(0.0005))], [h])
        f = b.tensor(f'f{j}', [1, 5])
        b.op('DEQUANTIZE', [h], [f])
        hs.append(f)
    d, dq = b.tensor('d', [1, 5]), b.tensor('dq', [1, 5], dtype='int8', quant=q(0.06))
    b.op('SUB', hs, [d], fused_activation_function='NONE')
    b.op('QUANTIZE', [d], [dq])
    y = b.tensor('y', [1, 3], dtype='int8', quant=q(0.1))
    b.op('FULLY_CONNECTED', [dq, b.tensor('w2', (3, 5), data=r.integers(-100, 100, (3, 5)).astype(np.int8),
                                          quant=q(0.01)),
                             b.tensor('bi', [3], data=np.zeros(3, np.int32), dtype='int32', quant=q(0.0006))], [y])
    b.inputs(x)
    b.outputs(y)
    path = b.save(str(tmp_path / 'two.tflite'))
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((8, 4)).astype(np.float32), y=r.integers(0, 3, 8))
    said = []
    s = prepare(path, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce', from_logits=True,
                lr=0.01, log=lambda *a: said.append(' '.join(map(str, a))))
    why = [m for m in said if 'trains in float32, dequantized' in m]
    assert len(why) == 1 and 'DEQUANTIZE' in why[0] and why[0].count('--dequantize') == 1, said
    assert s.get('dequantized_because') and not os.path.exists(tmp_path / 'run' / 'q8.json')
