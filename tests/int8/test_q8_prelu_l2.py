"""PRELU (Keras's PReLU: utrain.q8bin, a BIN layer of the input and its int8 slope alpha
broadcast), L2_NORMALIZATION (tf.math.l2_normalize: utrain.q8nrm) and SUM (Keras 3's
UnitNormalization is SQUARE, SUM, RSQRT, MINIMUM, MUL in TF 2.21's int8 files: a MEAN
layer with TFLite Micro's SUM multiplier) train as int8 (issue 28: they trained
dequantized before), in models built here as Keras's full-integer converter writes them: the forward bit-exact with
TFLite Micro's integer kernels (prelu.cc; reference_integer_ops::L2Normalization with
its fixed-point inverse square root), rows of zeros and one-element rows included; the
updates of the Dense layers before and after them against finite differences of the
float forward of the dequantized graph; the same integers under viper as on the host;
prepare trains such a model as int8 on unix MicroPython and export writes it back;
an L2_NORMALIZATION output off TFLite's fixed scale is refused saying why."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from kerasgraphs import build_int8_prelu_l2, build_int8_unitnorm  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from q8cases import tflm_agrees  # noqa: E402
from test_q8 import spy_updates  # noqa: E402
from test_q8_cat import MP, _fd_grad, _viper_matches  # noqa: E402
from test_q8_bin import exported_is_the_board, plan_bounds_the_heap, trains_and_exports  # noqa: E402

T, C = 4, 5
BOTH = ('PRELU', 'L2_NORMALIZATION')


def _table(tmp_path, path, train='all'):
    g = quant.rewritten(read_model(path))
    quant.write(g, str(tmp_path), train)
    with open(tmp_path / 'q8.json') as f:
        return g, json.load(f)                 # (as the board reads it)


@pytest.mark.parametrize('op', BOTH)
def test_forward_bit_exact_with_tflite_micro(tmp_path, op):
    """The op alone, rows of 1 to 300 values, input zero points 7, -128 and 0, random
    inputs over random sub-ranges, rows all at the zero point (L2: a zero sum of
    squares, which TFLite takes as 1) and one code off it: TFLite Micro's outputs."""
    from tflite_micro.python.tflite_micro import runtime
    r = np.random.default_rng(1)
    n = 0
    for F, rows, za in ((1, 3, 7), (2, 5, -128), (7, 3, 0), (300, 2, 7)):
        d = tmp_path / f'{F}_{za}'
        d.mkdir()
        path = build_int8_prelu_l2(d / 'm.tflite', ops=(op,), T=rows, F=F, za=za, bare=True)
        _, m = _table(d, path, 'none')
        assert [(x['k'], x.get('bo')) for x in m['layers']] == [
            (quant.BIN, 7) if op == 'PRELU' else (quant.NRM, None)]
        net = Q8Net(m, str(d / 'weights.wof'))
        it = runtime.Interpreter.from_file(path)
        outs = set()
        for i in range(60):
            lo = int(r.integers(-128, 127))
            xq = r.integers(lo, int(r.integers(lo + 1, 129)), (rows, F)).astype(np.int8)
            if i % 7 == 0:
                xq[:] = za
                xq[0, 0] = za + (1 if i % 14 else -1) if -128 < za < 127 else za
            got = np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8)
            it.set_input(xq.reshape(1, rows, F), 0)
            it.invoke()
            assert np.array_equal(got, it.get_output(0).ravel()), (F, za, i)
            outs.add(got.tobytes())
            n += 1
        assert len(outs) > (3 if F == 1 else 15)     # (a one-value row: +-1 or 0)
    assert n == 240


def test_model_forward_bit_exact_with_tflite_micro(tmp_path):
    """Dense -> PReLU -> UnitNormalization -> Dense: the logits are TFLite Micro's."""
    path = build_int8_prelu_l2(tmp_path / 'm.tflite')[0]
    _, m = _table(tmp_path, path)
    assert [(d['k'], d.get('bo')) for d in m['layers']][1:] == [
        (quant.BIN, 7), (quant.NRM, None), (quant.FC, None)]
    r = np.random.default_rng(2)
    tflm_agrees(path, Q8Net(m, str(tmp_path / 'weights.wof')),
                [r.integers(-128, 128, (T, C)).astype(np.int8) for _ in range(20)], 0)


@pytest.mark.parametrize('ops', [('PRELU',), ('L2_NORMALIZATION',), BOTH, BOTH[::-1]])
def test_updates_through_them_match_finite_differences(tmp_path, monkeypatch, ops):
    """One SGD step: the updates of the Dense layer before the ops (its gradient through
    PRELU's slopes and the normalization's (g - y sum(y g)) / |x|), of PRELU's slopes
    alpha (g x where x < 0) and of the Dense layer after them, against lr times the
    finite differences of the float forward of the dequantized graph."""
    path, fwd, ss, sx = build_int8_prelu_l2(tmp_path / 'm.tflite', ops=ops)
    g, m = _table(tmp_path, path)
    spy = spy_updates(monkeypatch)
    w0 = {k: next(t for t in g.tensors if t.name == k).data.astype(np.float64) * ss[k]
          for k in ss}
    assert [d.get('ta') for d in m['layers'] if d.get('bo') == 7] == [1] * ops.count('PRELU')
    order = ['w2'] + sorted([k for k in ss if k[0] == 'a'], reverse=True) + ['w1']
    r = np.random.default_rng(3)
    cos = {k: [] for k in ss}
    for i in range(6):
        xq = r.integers(-120, 121, (T, C)).astype(np.int8)
        xf = xq.astype(np.float64) * sx
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        spy.clear()
        net.step(bytearray(xq.tobytes()), i % 3, 0.01)
        assert len(spy) == len(order)
        for k in ss:
            upd = spy[order.index(k)] / 256.0 * ss[k]       # (in backward order)
            ref = 0.01 * _fd_grad(lambda x, w: fwd(x, {k: w}), xf, w0[k], i % 3, 1e-5)
            cos[k].append(float(upd @ ref / (np.linalg.norm(upd) * np.linalg.norm(ref))))
            assert 0.8 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.25, (k, i)
    for k in cos:
        assert min(cos[k]) > 0.95 and np.mean(cos[k]) > 0.99, (k, cos[k])


def test_keras_unit_normalization_as_int8_ops(tmp_path, monkeypatch):
    """Keras 3's UnitNormalization as TF 2.21 writes it (SQUARE in a float island, an
    int8 SUM over the last axis, RSQRT, MINIMUM with a cap, MUL): the SUM a MEAN layer
    ('sm': s_x / s_y, no 1/N; its gradient g itself), the logits TFLite Micro's, the
    Dense updates against finite differences."""
    path, fwd, ss, sx = build_int8_unitnorm(tmp_path / 'u.tflite')
    g, m = _table(tmp_path, path)
    assert [(d['k'], d.get('bo'), d.get('sm')) for d in m['layers']] == [
        (quant.FC, None, None), (quant.LUT, None, None), (quant.MEAN, None, 1),
        (quant.LUT, None, None), (quant.BIN, 6, None), (quant.BIN, 2, None), (quant.FC, None, None)]
    r = np.random.default_rng(7)
    tflm_agrees(path, Q8Net(m, str(tmp_path / 'weights.wof')),
                [r.integers(-128, 128, (1, 16)).astype(np.int8) for _ in range(40)], 0)
    spy = spy_updates(monkeypatch)
    w0 = {k: next(t for t in g.tensors if t.name == k).data.astype(np.float64) * ss[k]
          for k in ss}
    cos = {k: [] for k in ss}
    for i in range(6):
        xq = r.integers(-120, 121, (1, 16)).astype(np.int8)
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        spy.clear()
        net.step(bytearray(xq.tobytes()), i % 4, 0.01)
        for k in ss:
            upd = spy[-1 - ['w1', 'w2'].index(k)] / 256.0 * ss[k]
            ref = 0.01 * _fd_grad(lambda x, w: fwd(x, {k: w}), (xq.ravel() - 4.0) * sx, w0[k],
                                  i % 4, 1e-5)
            cos[k].append(float(upd @ ref / (np.linalg.norm(upd) * np.linalg.norm(ref))))
            assert 0.8 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.25, (k, i)
    for k in cos:
        assert min(cos[k]) > 0.95 and np.mean(cos[k]) > 0.99, (k, cos[k])


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_viper_steps_as_the_host(tmp_path):
    """Three SGD steps through both under viper end with the host's weights."""
    _table(tmp_path, build_int8_prelu_l2(tmp_path / 'm.tflite')[0])
    r = np.random.default_rng(4)
    _viper_matches(tmp_path, tmp_path, [r.integers(-120, 121, (T, C)).astype(np.int8)
                                        for _ in range(3)])


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_prepare_trains_it_as_int8_on_micropython_and_exports(tmp_path):
    """prepare takes the model as int8 (q8.json, no dequantized_because), three epochs of
    SGD on unix MicroPython give the host's trained.wof, slopes (trained.wof.q8a) and log,
    the loss falls, and export --quantized of it (the slopes too) gives TFLite Micro the
    board's logits (trains_and_exports)."""
    path, fwd, _, _ = build_int8_prelu_l2(tmp_path / 'm.tflite')
    x = np.random.default_rng(5).uniform(-4, 4, (30, T, C)).astype(np.float32)
    s = trains_and_exports(tmp_path, path, x, fwd)
    assert os.path.exists(tmp_path / 'run' / 'q8.json') and not s.get('dequantized_because')
    assert os.path.exists(tmp_path / 'runmp' / 'trained.wof.q8a')      # (its slopes trained)
    assert s['trainable']['alpha0'] == [6] and 'w1' in s['trainable'], s['trainable']


@pytest.mark.slow
@pytest.mark.parametrize('opt,batch', [('sgd', 1), ('adam', 3)])
def test_ctrl_c_resume_with_trained_slopes_bit_identical(tmp_path, opt, batch):
    """Ctrl-C at random moments and train.py again with resume: trained.wof, its slopes
    (trained.wof.q8a), the checkpoint (the int8 slopes; Adam's float master and moments)
    and the log equal an uninterrupted run's bit for bit."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    from repo import set_train
    from test_ctrl_c import interrupted_runs
    path, fwd, _, _ = build_int8_prelu_l2(tmp_path / 'm.tflite')
    x = np.random.default_rng(8).uniform(-4, 4, (480, T, C)).astype(np.float32)   # (long
    #                                       enough that a Ctrl-C lands in it on a busy machine)
    y = np.array([int(np.argmax(fwd(v.astype(np.float64)) * [1, -1, 0.5])) for v in x])
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    base = tmp_path / 'base'
    prepare(path, str(base), data=str(tmp_path / 'd.npz'), test_split=0.25, loss='scce',
            optimizer=opt, lr=0.02 if opt == 'sgd' else 0.003, batch=batch, epochs=3,
            shuffle=True, seed=7, train='all', log=lambda *a: None)
    set_train(base, run={'checkpoint_every': 20})
    runner.stage(str(base))
    tally = interrupted_runs(base, tmp_path, not MP, 4, 5)
    assert tally['identical'] == 4 and tally['tracebacks'] == 0 and tally['restarts'] > 0, tally
    with open(base / 'q8.json') as f:
        d = next(d for d in json.load(f)['layers'] if d.get('bo') == 7)
    with open(tmp_path / 'whole' / 'trained.wof.q8a', 'rb') as f:
        got = f.read()[12:]
    assert d.get('ta') == 1 and got != bytes([v & 255 for v in d['kc']])     # (they trained)


@pytest.mark.slow
@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_pull_brings_the_slopes_and_export_writes_them(tmp_path):
    """deploy --run on a board on a serial port, pull: trained.wof.q8a (the trained
    slopes) comes back beside trained.wof, and export writes them: TFLite Micro's logits
    of the exported file are the board's."""
    from fakeboard import FakeBoard
    from host_tools.boards import board
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    path, fwd, _, _ = build_int8_prelu_l2(tmp_path / 'm.tflite')
    x = np.random.default_rng(9).uniform(-4, 4, (24, T, C)).astype(np.float32)
    y = np.array([int(np.argmax(fwd(v.astype(np.float64)) * [1, -1, 0.5])) for v in x])
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    out, flash = str(tmp_path / 'run'), tmp_path / 'flash'
    flash.mkdir()
    prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd', lr=0.05,
            epochs=2, train='all', log=lambda *a: None)
    with FakeBoard(MP, str(flash), heap=runner.boards()['unix']['heap']) as b:
        board.deploy(out, b.port, resume=True, run=True)
        names = board.pull(out, b.port, resume=True)
    assert 'trained.wof.q8a' in names
    assert (flash / 'trained.wof.q8a').read_bytes() == open(out + '/trained.wof.q8a', 'rb').read()
    exported_is_the_board(path, out, str(tmp_path / 'q.tflite'), x[:6])


def test_prelu_with_a_slope_a_position_trains_as_int8(tmp_path, monkeypatch):
    """Issue 28: Keras's PReLU without shared_axes after a conv has a slope per position
    and channel (a 32x32x8 map: 8192); int8 training refused more than 4096 and the model
    fell back to float (a 537 KB plan for a 32x32 CNN that fits no board), though nothing
    on the board is bounded by it (q8.json's constant and the slopes' gradient are in the
    plan).  With 4100 slopes: the layer trains its slopes ('ta'), the logits are TFLite
    Micro's, and one SGD step moves the slopes by lr times the
    finite differences of the float forward of the dequantized graph."""
    F, Cx = 4100, 3
    path, fwd, ss, sx = build_int8_prelu_l2(tmp_path / 'm.tflite', ops=('PRELU',), T=1, C=Cx, F=F)
    g, m = _table(tmp_path, path)
    assert [d.get('ta') for d in m['layers'] if d.get('bo') == 7] == [1]
    assert len(next(d for d in m['layers'] if d.get('bo') == 7)['kc']) == F
    r = np.random.default_rng(3)
    tflm_agrees(path, Q8Net(m, str(tmp_path / 'weights.wof')),
                [r.integers(-120, 121, (1, Cx)).astype(np.int8) for _ in range(8)], 0)
    spy = spy_updates(monkeypatch)
    w0 = {k: next(t for t in g.tensors if t.name == k).data.astype(np.float64) * ss[k] for k in ss}
    order = ['w2', 'alpha0', 'w1']
    for i in range(1):
        xq = r.integers(-120, 121, (1, Cx)).astype(np.int8)
        xf = xq.astype(np.float64) * sx
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        spy.clear()
        net.step(bytearray(xq.tobytes()), i, 0.01)
        assert len(spy) == len(order)
        for k in ('alpha0',):
            upd = spy[order.index(k)] / 256.0 * ss[k]
            ref = 0.01 * _fd_grad(lambda x, w: fwd(x, {k: w}), xf, w0[k], i, 1e-5)
            assert 0.8 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.25, (k, i)
            assert upd @ ref / (np.linalg.norm(upd) * np.linalg.norm(ref)) > 0.95, (k, i)


def test_l2_normalization_off_tflites_output_scale_is_refused(tmp_path):
    """An int8 L2_NORMALIZATION whose output is not at 1/128, zero point 0 (TFLite's int8
    kernel refuses it): int8 training refuses it naming the op, the scale and what to do."""
    path = build_int8_prelu_l2(tmp_path / 'm.tflite', ops=('L2_NORMALIZATION',), bare=True)
    g = read_model(path)
    u = next(t for t in g.tensors if t.name == 'u0')
    u.quant = {'scale': [0.01], 'zero_point': [0]}
    with pytest.raises(ValueError) as e:
        quant.layers(quant.rewritten(g), 'none')
    msg = str(e.value)
    assert 'L2_NORMALIZATION op 0' in msg and '0.01' in msg and '--dequantize' in msg


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_the_plan_prices_them(tmp_path):
    """The heap planner prices q8nrm and PRELU's tables (bytecode, the row's sums, the
    slope table): the run trains in the planned heap, not in plan / 1.2."""
    x = np.random.default_rng(6).uniform(-4, 4, (6, T, C)).astype(np.float32)
    plan_bounds_the_heap(tmp_path, build_int8_prelu_l2(tmp_path / 'm.tflite')[0], x)
