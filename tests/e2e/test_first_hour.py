"""A newcomer's first hour (issue 31): each problem as a class, on models and data made
here: an int8 CNN whose frozen prefix runs in row bands, an int8 Conv1D (Keras's
RESHAPE -> CONV_2D -> RESHAPE -> MEAN over time), float MLPs for a classifier and a
regression."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT, no_keep_best, set_train  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare, PrepareError  # noqa: E402

MP = runner.find_micropython()
NCLS = 3


def _q(s, z):
    return {'scale': [s], 'zero_point': [z]}


class _Int8:
    """An int8 TFLite file under construction: weights with per-channel scales that keep
    each layer's outputs a few tens of steps wide."""

    def __init__(self, seed=0):
        self.b = CircleBuilder(identifier=b'TFL3')
        self.rng = np.random.default_rng(seed)

    def weighted(self, kind, x, sx, y, sy, shape, fan, **opt):
        rng, b = self.rng, self.b
        O = shape[-1] if kind == 'DEPTHWISE_CONV_2D' else shape[0]
        sw = rng.uniform(0.7, 1.3, O) * 30 * sy / (fan ** 0.5 * 40 * sx * 73)
        wq = rng.integers(-127, 128, shape).astype(np.int8)
        w = b.tensor(f'w{y}', shape, data=wq, quant={
            'scale': list(sw), 'zero_point': [0] * O,
            'quantized_dimension': 3 if kind == 'DEPTHWISE_CONV_2D' else 0})
        bq = rng.integers(-300, 300, O).astype(np.int32)
        bt = b.tensor(f'b{y}', [O], data=bq, quant={'scale': list(sx * sw), 'zero_point': [0] * O})
        b.op(kind, [x, w, bt], [y], **opt)

    def mean_fc(self, x, sx, axes, C, classes):
        b = self.b
        m = b.tensor('mean', [1, C], dtype='int8', quant=_q(sx, -5))
        b.op('MEAN', [x, b.tensor('axes', [len(axes)], data=np.array(axes, np.int32))], [m],
             keep_dims=False)
        y = b.tensor('y', [1, classes], dtype='int8', quant=_q(0.08, -2))
        self.weighted('FULLY_CONNECTED', m, sx, y, 0.08, (classes, C), C)
        return y


def int8_cnn(path, H=12, W=12, C=2, F=6, classes=NCLS):
    """conv 3x3 (RELU) -> depthwise 3x3 (RELU) -> conv 1x1 (RELU) -> MEAN over H, W ->
    FC: with --train last:3 the first two are the frozen prefix, row bands take them."""
    m = _Int8()
    b = m.b
    x = b.tensor('x', [1, H, W, C], dtype='int8', quant=_q(0.02, 3))
    c1 = b.tensor('c1', [1, H, W, F], dtype='int8', quant=_q(0.03, -128))
    m.weighted('CONV_2D', x, 0.02, c1, 0.03, (F, 3, 3, C), 9 * C, padding='SAME',
               stride_w=1, stride_h=1, fused_activation_function='RELU')
    c2 = b.tensor('c2', [1, H, W, F], dtype='int8', quant=_q(0.04, -128))
    m.weighted('DEPTHWISE_CONV_2D', c1, 0.03, c2, 0.04, (1, 3, 3, F), 9, padding='SAME',
               stride_w=1, stride_h=1, depth_multiplier=1, fused_activation_function='RELU')
    c3 = b.tensor('c3', [1, H, W, F], dtype='int8', quant=_q(0.05, -128))
    m.weighted('CONV_2D', c2, 0.04, c3, 0.05, (F, 1, 1, F), F, padding='VALID',
               stride_w=1, stride_h=1, fused_activation_function='RELU')
    b.inputs(x)
    b.outputs(m.mean_fc(c3, 0.05, [1, 2], F, classes))
    b.save(path)
    return path


def int8_conv1d(path, T=24, C=3, F=6, classes=NCLS, divide=False):
    """A Keras Conv1D as the converter writes it: [1, T, C] -> RESHAPE [1, 1, T, C] ->
    CONV_2D 1x3 (RELU) -> RESHAPE [1, T, F] -> MEAN over time -> FC; divide: the map
    divided by a per-channel constant in float32 between a DEQUANTIZE and a QUANTIZE (a
    converter's float island, which int8 training does not take: not a function of one
    int8 value; the float path keeps the divisor the file's) before the MEAN."""
    m = _Int8()
    b = m.b
    x = b.tensor('x', [1, T, C], dtype='int8', quant=_q(0.02, 3))
    x4 = b.tensor('x4', [1, 1, T, C], dtype='int8', quant=_q(0.02, 3))
    b.op('RESHAPE', [x, b.tensor('s1', [4], data=np.array([1, 1, T, C], np.int32))], [x4],
         new_shape=[1, 1, T, C])
    c = b.tensor('c', [1, 1, T, F], dtype='int8', quant=_q(0.03, -128))
    m.weighted('CONV_2D', x4, 0.02, c, 0.03, (F, 1, 3, C), 3 * C, padding='SAME',
               stride_w=1, stride_h=1, fused_activation_function='RELU')
    c3 = b.tensor('c3', [1, T, F], dtype='int8', quant=_q(0.03, -128))
    b.op('RESHAPE', [c, b.tensor('s2', [3], data=np.array([1, T, F], np.int32))], [c3],
         new_shape=[1, T, F])
    if divide:
        f = b.tensor('f', [1, T, F])
        b.op('DEQUANTIZE', [c3], [f])
        dv = b.tensor('dv', [F], data=np.linspace(1, 3, F).astype(np.float32))
        fd = b.tensor('fd', [1, T, F])
        b.op('DIV', [f, dv], [fd], fused_activation_function='NONE')
        sq = b.tensor('sq', [1, T, F], dtype='int8', quant=_q(0.02, -128))
        b.op('QUANTIZE', [fd], [sq])
        c3 = sq
    b.inputs(x)
    b.outputs(m.mean_fc(c3, 0.03, [1], F, classes))
    b.save(path)
    return path


def _data(path, shape, n=12, classes=NCLS, seed=0):
    r = np.random.default_rng(seed)
    y = r.integers(0, classes, n)
    c = r.standard_normal((classes,) + shape)
    x = (c[y] + 0.5 * r.standard_normal((n,) + shape)).astype(np.float32)
    np.savez(path, x=x, y=y)
    return path


_no_best = no_keep_best     # the run ends saving its weights


def _trained(out):
    with open(os.path.join(out, 'trained.wof'), 'rb') as f:
        return f.read()


# ------------------------------------------------------------------ 2: int8 --cache, bands
@pytest.mark.parametrize('python', [True, False])
def test_int8_cache_with_banded_prefix_trains_as_whole_model(tmp_path, python):
    """--cache on an int8 model whose whole frozen prefix runs in row bands: the board
    computes the prefix's output (the band group's last tensor) into the cache, and the
    trained weights are the bytes of a run without the cache."""
    if not python and not MP:
        pytest.skip('no unix MicroPython')
    model = int8_cnn(str(tmp_path / 'm.tflite'))
    data = _data(str(tmp_path / 'd.npz'), (12, 12, 2), n=6)
    outs = []
    for cache in (True, False):
        out = str(tmp_path / ('c' if cache else 'w'))
        prepare(model, out, data=data, loss='scce', optimizer='sgd', lr=0.01, epochs=1,
                train='last:3', cache=cache, bands=1, log=lambda *a: None)
        if cache:
            with open(os.path.join(out, 'q8.json')) as f:
                pre = json.load(f)      # the prefix: conv, dw, both in one band group
            assert pre['groups'] == [[0, 2, 1]] and len(pre['layers']) == 2
        _no_best(out)
        code, text = runner.run(out, python=python, stream=False)
        assert code == 0 and text.rstrip().endswith('utrain: end: ok'), text
        outs.append(_trained(out))
    assert outs[0] == outs[1]


def test_an_unexpected_error_ends_with_the_end_line(tmp_path):
    """Whatever stops the run (here an exception utrain does not expect: a layer table
    whose output scale is a string, a TypeError deep in the loss), its last line is
    `utrain: end:` and what stopped it, and the exit status is 1."""
    model = int8_cnn(str(tmp_path / 'm.tflite'))
    data = _data(str(tmp_path / 'd.npz'), (12, 12, 2), n=4)
    out = str(tmp_path / 'o')
    prepare(model, out, data=data, loss='scce', epochs=1, train='last:2', log=lambda *a: None)
    with open(os.path.join(out, 'q8.json')) as f:
        m = json.load(f)
    m['sy'] = 'x'
    with open(os.path.join(out, 'q8.json'), 'w') as f:
        json.dump(m, f)
    code, text = runner.run(out, python=True, stream=False)
    last = text.rstrip().splitlines()[-1]
    assert code == 1 and last.startswith('utrain: end: error: TypeError'), text


# ------------------------------------------------------------------ 1: run --board's heap
def _mlp_run(tmp_path, name, h=16, **kw):
    from host_tools.formats.refmodels import mlp
    model = mlp(str(tmp_path / 'mlp.circle'), [64, h, h, 4])
    r = np.random.default_rng(0)
    np.savez(str(tmp_path / 'mlp.npz'), x=r.random((8, 64), dtype=np.float32),
             y=r.integers(0, 4, 8))
    out = str(tmp_path / name)
    prepare(model, out, data=str(tmp_path / 'mlp.npz'), loss='scce',
            log=lambda *a: None, **dict(dict(epochs=1), **kw))
    _no_best(out)
    return out


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_run_board_scales_the_heap_to_the_simulated_word(tmp_path):
    """run --board esp32 (32-bit) on a simulated board of another word size gets the
    board's heap scaled by the planner's figures for this run on both, says so, and a run
    prepared to fit the board trains."""
    out = _mlp_run(tmp_path, 'o', board='esp32')
    with open(os.path.join(out, 'prepare.json')) as f:
        by = json.load(f)['heap']['by_target']
    assert by['sim32'] < by['sim64'] and by['esp32'] <= by['rp2040']   # native code in rp2's heap
    sim = runner.simulator_word()
    heap, note = runner.sim_heap(out, 'esp32')
    if sim == 4:
        assert (heap, note) == (100 * 1024, None)
    else:
        assert heap == 100 * 1024 * by['sim64'] // by['esp32'] > 100 * 1024
        assert f'simulated as {heap // 1024} KB' in note
    code, text = runner.run(out, board='esp32', stream=False)
    assert code == 0 and (note is None or text.startswith(note)), text
    assert runner.sim_heap(out, 'unix') == (1024 * 1024, None)      # the simulated board itself


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('board', [False, True])
def test_out_of_memory_advice_is_not_what_was_done(tmp_path, board):
    """Out of memory: a run prepared against a board or budget is told its plan fell short
    and to prepare with a budget below the heap it had (not the --board it was prepared
    with); one prepared without is told to plan with --budget."""
    import re
    import subprocess
    out = _mlp_run(tmp_path, 'o', h=64, board=board and 'esp32-psram')
    runner.stage(out)
    argv, env = runner.command(out)
    argv[argv.index('-X') + 1] = 'heapsize=%d' % (100 * 1024)
    r = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and 'utrain: end: out of memory' in r.stdout, r.stdout
    m = re.search(r"--budget (\d+)K", r.stdout)
    assert m, r.stdout
    budget, had = int(m.group(1)), int(re.search(r'\(heap (\d+) B', r.stdout).group(1)) // 1024
    if board:
        assert 'planned this run at' in r.stdout and budget < had, r.stdout
    else:
        assert 'planned this run' not in r.stdout and budget == had, r.stdout


# ------------------------------------------------------------------ 9: a regression fleet
def test_regression_fleet_names_its_metric_mae(tmp_path):
    """A fleet of a regression model (mse, metric mae) calls its metric mae in the
    console, the history, fleet.csv and the plot's axis, never accuracy."""
    pytest.importorskip('flwr')
    from host_tools.boards import fleet as fl
    from host_tools.plot import read_log
    from host_tools.formats.refmodels import mlp
    model = mlp(str(tmp_path / 'reg.circle'), [6, 8, 2], softmax=False)
    r = np.random.default_rng(0)
    x = r.standard_normal((24, 6)).astype(np.float32)
    y = (x[:, :2] * 0.5).astype(np.float32)
    np.savez(str(tmp_path / 'reg.npz'), x=x, y=y)
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=str(tmp_path / 'reg.npz'), test_split=0.25, loss='mse',
                epochs=1, log=lambda *a: None)
    assert s['settings']['metric'] == 'mae'
    said = []
    st = fl.fleet(out, boards=2, rounds=1, python=True, say=said.append)
    assert all('test_mae' in h and 'mae' in h and 'test_accuracy' not in h and 'accuracy' not in h
               for h in st['history']), st['history']
    text = '\n'.join(said)
    assert 'test_mae' in text and 'accuracy' not in text, text
    log = read_log(os.path.join(out, 'fleet', 'fleet.csv'))
    assert list(log)[:5] == ['round', 'loss', 'mae', 'test_loss', 'test_mae']
    assert log['test_mae'] == pytest.approx([h['test_mae'] for h in st['history']], abs=1e-6)


# ------------------------------------------------------------------ 8: int8 under CPython
GEOS = [  # H, W, I, O, KH, KW, sh, sw, ph, pw, dh, dw (O: DW's multiplier x I)
    (7, 6, 3, 5, 3, 3, 1, 1, 1, 1, 1, 1), (9, 8, 2, 4, 3, 2, 2, 2, 1, 0, 1, 1),
    (8, 9, 4, 8, 3, 3, 2, 1, 1, 1, 2, 1), (5, 5, 3, 3, 1, 1, 1, 1, 0, 0, 1, 1),
    (1, 12, 3, 6, 1, 3, 1, 1, 0, 1, 1, 1)]


@pytest.mark.parametrize('geo', GEOS)
def test_numpy_int8_kernels_equal_the_board_loops(geo):
    """Under CPython utrain.q8np replaces q8kern's heavy loops (plain Python byte loops
    there): the same integers, forward, both gradients and the requantization, for
    convolutions and depthwise convolutions with strides, padding and dilation."""
    from array import array
    from utrain import q8kern as K
    H, W, I, O, KH, KW, sh, sw, ph, pw, dh, dw = geo
    OH = (H + 2 * ph - (KH - 1) * dh - 1) // sh + 1
    OW = (W + 2 * pw - (KW - 1) * dw - 1) // sw + 1
    r = np.random.default_rng(sum(geo))
    i8 = lambda n: bytearray(r.integers(-128, 128, n).astype(np.int8).tobytes())  # noqa
    x = i8(H * W * I)
    for fwd, dx_, gw_, O in (('convk', 'cdk', 'cgk', O), ('dwk', 'ddk', 'dgk', 2 * I)):
        g = array('i', [H, W, I, O, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw])
        wn = O * KH * KW * (I if fwd == 'convk' else 1)
        w, dz = i8(wn), i8(OH * OW * O)
        b = array('i', r.integers(-5000, 5000, O).tolist())
        for name, args in ((fwd, lambda a: (a, x, -7, g, w, b)),
                           (dx_, lambda a: (a, dz, w, g)),
                           (gw_, lambda a: (a, dz, x, 5, g) + ((1, O) if gw_ == 'cgk' else ()))):
            n = OH * OW * O if name == fwd else H * W * I if name == dx_ else wn
            got = array('i', r.integers(-99, 99, n).tolist())
            want = array('i', got)          # (the weight gradients add to what is there)
            getattr(K, name)(*args(got))
            getattr(K, 'py_' + name)(*args(want))
            assert got == want, name
    acc = array('i', r.integers(-2 ** 28, 2 ** 28, 60).tolist())     # (<< 2 stays in 31 bits)
    mul = array('i', r.integers(2 ** 30, 2 ** 31, 3).tolist())
    shf = array('i', [-9, 2, 0])
    for wide in (0, 1):
        outs = [bytearray(60) if not wide else array('i', [0] * 60) for _ in range(2)]
        K.rqk(acc, 60, 3, 4, mul, shf, outs[0], -3, -128, 100, wide)
        K.py_rqk(acc, 60, 3, 4, mul, shf, outs[1], -3, -128, 100, wide)
        assert outs[0] == outs[1]
    y = i8(60)
    d = [bytearray(60), bytearray(60)]
    K.shk(d[0], acc, 60, 9, y, -100, 120)
    K.py_shk(d[1], acc, 60, 9, y, -100, 120)
    assert d[0] == d[1] and K.nrk(acc, 60) == K.py_nrk(acc, 60)
    sums = [array('i', acc) for _ in range(2)]      # (a batch's gradient sums: adk, zk)
    for k, (add, zero) in enumerate(((K.adk, K.zk), (K.py_adk, K.py_zk))):
        add(memoryview(sums[k])[5:], acc, 50)
        zero(memoryview(sums[k])[40:], 7)
    assert sums[0] == sums[1] and sums[0][5] == acc[5] + acc[0] and sums[0][40] == 0


# ------------------------------------------------------------------ 8: progress lines
def _progress_lines(tmp_path, python):
    out = _mlp_run(tmp_path, 'p', h=8, epochs=2, progress=2)
    code, text = runner.run(out, python=python, stream=False)
    assert code == 0, text
    return out, text


def test_progress_says_eta_and_no_heap_under_cpython(tmp_path):
    """Progress lines carry the run's ETA (nothing left at the last one); under CPython,
    which has no MicroPython heap, no line tells a free heap (it said "free -1")."""
    import re
    out, text = _progress_lines(tmp_path, True)
    prog = [ln for ln in text.splitlines() if ln.startswith('  ') and '/8 loss' in ln]
    assert len(prog) == 8 and all(re.search(r' eta \d+s', ln) for ln in prog), text
    assert prog[-1].rstrip().endswith(' eta 0s'), text
    assert 'free' not in text and '-1' not in text, text
    epochs = [ln for ln in text.splitlines() if ln.startswith('epoch ')]
    assert ' eta ' in epochs[0] and ' eta ' not in epochs[1], text     # (the last: none left)
    with open(os.path.join(out, 'train.log')) as f:
        rows = f.read().split()
    assert all(r.endswith(',') for r in rows[1:]), rows             # the free_heap column: empty


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_progress_on_the_board_tells_free_heap_and_eta(tmp_path):
    _, text = _progress_lines(tmp_path, False)
    prog = [ln for ln in text.splitlines() if ln.startswith('  ') and '/8 loss' in ln]
    assert prog and all(' eta ' in ln and ' free ' in ln for ln in prog), text


def test_ms_per_sample_after_resume_counts_the_samples_run(tmp_path):
    """A run resumed at sample 6 of 8 trains 2 samples of that epoch: its time per
    sample is the epoch's time over those 2, and the line says so."""
    import re
    from utrain.trainer import Trainer
    out = _mlp_run(tmp_path, 'r', h=8, epochs=1)
    tr = Trainer(os.path.join(out, 'model.flat'), os.path.join(out, 'weights.wof'))
    tr.pos, tr.sums = 6, (1.5, 3.0)
    tr.save_checkpoint(os.path.join(out, 'checkpoint.ckpt'))
    set_train(out, run={'resume': True})
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0 and 'at epoch 0, sample 6' in text, text
    m = re.search(r'  (\d+) ms \(([\d.]+) ms/sample, [\d.]+ samples/s over 2 samples\)', text)
    assert m and float(m.group(2)) == pytest.approx(int(m.group(1)) / 2, abs=0.006), text


# ------------------------------------------------------------------ 6: the board's flash
def _wide_mlp(tmp_path, n, seed=0):
    from host_tools.formats.refmodels import mlp
    model = mlp(str(tmp_path / 'wide.circle'), [256, 8, 4])
    r = np.random.default_rng(seed)
    data = str(tmp_path / f'wide{n}.npz')
    np.savez(data, x=r.random((n, 256), dtype=np.float32), y=r.integers(0, 4, n))
    return model, data


def test_float_model_trained_as_int8_is_reckoned_at_its_int8_size_in_flash(tmp_path):
    """A float model --board rp2040 trains as int8 stores int8 weights (a quarter of its
    float file): its samples are checked against the flash beside those, not beside the
    float file (a held-out Keras MobileNetV2: refused with room for its samples)."""
    from host_tools.formats.refmodels import mlp
    model = mlp(str(tmp_path / 'w.circle'), [64, 2048, 4])       # 553 KB of float32
    r = np.random.default_rng(0)
    n = 11000                   # 730 KB as int8: beside 553 KB + the code, over 1408 KB (12000
    # had fit by bytes; in littlefs blocks, with what training writes, 8 KB over)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=r.random((n, 64), dtype=np.float32), y=r.integers(0, 4, n))
    d = str(tmp_path / 'o')
    s = prepare(model, d, data=data, loss='scce', epochs=1, board='rp2040', train='last:2',
                log=lambda *a: None)
    assert s['int8']
    with open(os.path.join(d, 'train.json')) as f:
        files = json.load(f)['files']
    from host_tools.boards import board as bd
    size = bd.sample_files(d, files)[0]
    stored = size + sum(os.path.getsize(os.path.join(d, f)) for f in ('weights.wof', 'q8.req', 'q8.json'))
    assert stored < 1100 * 1024 < size + os.path.getsize(model) + 250 * 1024


def test_prepare_refuses_samples_the_boards_flash_cannot_hold(tmp_path, monkeypatch):
    """prepare --board checks the board's file system: float samples that overflow it are
    stored as uint8 where no --dtype is given (said), refused naming --dtype uint8 where
    --dtype float32 is; 8-bit samples that overflow it are
    refused naming how many fit (and that many do) and boards with more flash, never
    --dtype uint8; deploy's check says the same of a prepared folder."""
    from host_tools.boards import board as bd
    # (float32 training: --board rp2040 would train it as int8, its samples stored as int8)
    kw = dict(loss='scce', epochs=1, board='rp2040', int8=False, log=lambda *a: None)
    model, data = _wide_mlp(tmp_path, 2000)          # 2 MB as float32, 0.5 MB as uint8
    with pytest.raises(PrepareError, match=r'1408K file system of rp2040; --dtype uint8 stores'):
        prepare(model, str(tmp_path / 'f'), data=data, dtype='float32', **kw)
    assert not os.path.exists(tmp_path / 'f')        # refused before anything was written
    said = []
    s = prepare(model, str(tmp_path / 'u'), data=data, **dict(kw, log=said.append))
    assert s['dtype'] == 'uint8' and any('stored as uint8' in m for m in said), said
    prepare(model, str(tmp_path / 'u'), data=data, dtype='uint8', **kw)
    model, data = _wide_mlp(tmp_path, 7000)          # 1.8 MB as uint8
    for dtype in ('uint8', 'int8'):
        with pytest.raises(PrepareError) as e:
            prepare(model, str(tmp_path / 'b'), data=data, dtype=dtype, **kw)
        msg = str(e.value)
        assert '--dtype' not in msg and 'esp32s3 (6M)' in msg and 'rp2040 (' not in msg, msg
        fit = int(msg.split('at most ')[1].split()[0])
        assert 3000 < fit < 7000, msg      # (in littlefs blocks, with what training writes)
    # --select's trials (minutes on a large model) do not run first: refused before them
    lines = []
    with pytest.raises(PrepareError, match='file system of rp2040'):
        prepare(model, str(tmp_path / 's'), data=data, loss='scce', board='rp2040',
                select='auto', log=lines.append)
    assert not any('select auto' in ln for ln in lines), lines
    _, few = _wide_mlp(tmp_path, fit)
    prepare(model, str(tmp_path / 'b'), data=few, dtype='int8', **kw)
    # deploy's check, on a folder whose samples are 8-bit: no --dtype uint8 either
    d = str(tmp_path / 'b')
    with open(os.path.join(d, 'train.json')) as f:
        files = json.load(f)['files']
    size, n, dtype = bd.sample_files(d, files)
    assert (n, dtype) == (fit, 'int8') and runner.flash_advice(d, size, 'rp2040', size, n, dtype) is None
    monkeypatch.setattr(bd, 'board_mpy', lambda port, resume: 0)
    monkeypatch.setattr(runner, 'boards', lambda: {'tiny': {'flash_fs': '%dK' % (size // 1024)}})
    with pytest.raises(bd.BoardError) as e:
        bd.deploy(d, 'nowhere', board='tiny', source=True)
    msg = str(e.value)
    assert 'file system of tiny' in msg and '--dtype' not in msg and '8-bit already' in msg, msg


# ------------------------------------------------------------------ 5: int8 refusals, inspect
def test_int8_refusal_names_dequantize_and_the_file_once(tmp_path):
    """An int8 Conv1D whose map is divided by a per-channel constant in float32 (ops
    between a DEQUANTIZE and a QUANTIZE that int8 training does not take) trains
    dequantized as --dequantize does, said once naming its file (session 29: it had been
    refused, naming --dequantize); inspect says the same, and of an int8 model that trains as int8 that it
    does, with its int8 parameters counted.  The plain Conv1D (MEAN over time) trains
    as int8."""
    import contextlib
    import io
    from host_tools.cli import main
    data = _data(str(tmp_path / 'd.npz'), (24, 3))
    s = prepare(int8_conv1d(str(tmp_path / 'plain.tflite')), str(tmp_path / 'p'), data=data,
                loss='scce', log=lambda *a: None)
    assert os.path.exists(tmp_path / 'p' / 'q8.json')
    model = int8_conv1d(str(tmp_path / 'c1.tflite'), divide=True)
    said = []
    s = prepare(model, str(tmp_path / 'q'), data=data, loss='scce', log=said.append)
    why = [m for m in said if 'trains in float32, dequantized as --dequantize does' in m]
    assert len(why) == 1 and why[0].count(model) == 1, said
    assert not os.path.exists(tmp_path / 'q' / 'q8.json')
    assert s['trainable_params'] == 6 * 3 * 3 + 6 + 3 * 6 + 3     # (the divisor stays the file's)
    for path, says in ((model, 'does not train it as int8'),
                       (int8_cnn(str(tmp_path / 'cnn.tflite')), 'trains it as int8')):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(['inspect', path])
        text = out.getvalue()
        assert says in text and '--dequantize' in text and 'float32 constants' not in text, text
    assert 'int8 model: %d parameters' % (6 * 9 * 2 + 6 + 6 * 9 + 6 + 36 + 6 + 18 + 3) in text, text


# ------------------------------------------------------------------ 3: every memory option
@pytest.mark.parametrize('size,firmware', [(18, False), (32, True)])
def test_budget_advice_considers_every_memory_option(tmp_path, size, firmware):
    """A CNN whose frozen convolution's activations do not fit an ESP32 without PSRAM
    beside the code: the refusal names what fits, the prefix cached by prepare
    (--cache-on-host) among it, and when nothing fits on this firmware, what fits on
    one with ulab or utrain frozen in; each suggestion, typed back, plans what it said."""
    from host_tools.formats.refmodels import small_cnn
    from test_memory import advice_keeps_its_word
    model = small_cnn(str(tmp_path / 'cnn.circle'), size=size, classes=4)
    kw = dict(loss='scce', board='esp32', train='last:2', log=lambda *a: None)
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'o'), **kw)
    msg = str(e.value)
    assert 'nothing tried fits' not in msg, msg
    fits = advice_keeps_its_word(tmp_path, e, model, dict(train='last:2'), **kw)
    assert all('--cache-on-host' in f for f in fits), msg
    assert all('--backend' in f for f in fits) == firmware, msg


# ------------------------------------------------------------------ 7: export
def _onert_outputs(path, x):
    onert = pytest.importorskip('onert')
    sess = onert.infer.session(path)
    return np.array([np.ravel(sess.infer([np.ascontiguousarray(v[None], np.float32)])[0]) for v in x])


def test_quantized_export_recalibrates_on_data_and_measures(tmp_path):
    """export --quantized --data: weights that outgrew the original int8 scales (the
    first convolution's, 6x here) saturate its activations.  With --data the export
    recalibrates the activation scales on the samples and measures the float weights
    (what ONERT scores the float export: labels are its own predictions, so 1.0), the
    int8 model with the original scales (less) and the recalibrated one (better), and
    keeps the better: the written file is the recalibrated model, whose saturated
    activation's scale grew.  Without --data it says it did not recalibrate."""
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import export
    from host_tools.files.wof import read_wof, write_wof
    from host_tools.prepare import exportcheck
    model = int8_cnn(str(tmp_path / 'm.tflite'))
    x = _data(str(tmp_path / 'd.npz'), (12, 12, 2), n=60)
    out = str(tmp_path / 'f')
    prepare(model, out, data=x, loss='scce', dequantize=True, log=lambda *a: None)
    g = read_model(os.path.join(out, 'rewritten.circle'))
    w = read_wof(os.path.join(out, 'weights.wof'), g)
    first = g.ops[0].inputs[1]
    w[first] = w[first] * 6
    trained = os.path.join(out, 'trained.wof')
    write_wof(trained, len(g.tensors), w)
    export(model, trained, str(tmp_path / 'float.tflite'))
    xs = np.load(x)['x']
    labels = np.argmax(_onert_outputs(str(tmp_path / 'float.tflite'), xs), 1)
    np.savez(str(tmp_path / 'own.npz'), x=xs, y=labels)
    q = str(tmp_path / 'q.tflite')
    r = export(model, trained, q, quantized=True, data=str(tmp_path / 'own.npz'))
    m = r['measured']
    assert m['samples'] == 60 and m['float'] == 1.0 and m['int8'] < 0.9, m
    assert m['calibrated'] >= m['int8'] + 0.1 and m['kept'] == 'calibrated' and m['tensors'] >= 3, m
    assert 'measured on 60 samples: accuracy 1.0000 as trained (float), %.4f as int8 with the ' \
        'original activation scales, %.4f recalibrated' % (m['int8'], m['calibrated']) in r['notes'][0]
    assert r['notes'][0].startswith('warning: ') == (m['calibrated'] < 0.99), r['notes']
    out8 = exportcheck._int8_outputs(q, xs.reshape(60, -1))
    assert np.mean(np.argmax(out8, 1) == labels) == m['calibrated']
    scales = {t.name: t.quant['scale'][0] for t in read_model(q).tensors if t.quant}
    orig = {t.name: t.quant['scale'][0] for t in read_model(model).tensors if t.quant}
    assert scales['c1'] > 3 * orig['c1']                    # the saturated activation's
    r = export(model, trained, str(tmp_path / 'q2.tflite'), quantized=True)
    assert 'export --data D recalibrates' in r['notes'][0], r['notes']


def test_export_writes_what_its_name_says_and_counts_int8_tensors(tmp_path):
    """-o x.circle from a .tflite writes a circle file (and -o x.tflite a TFLite one),
    float or int8; an int8 run's export counts the tensors it trained."""
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import export
    import shutil
    model = int8_cnn(str(tmp_path / 'm.tflite'))
    data = _data(str(tmp_path / 'd.npz'), (12, 12, 2), n=4)
    q, f = str(tmp_path / 'q'), str(tmp_path / 'f')
    s = prepare(model, q, data=data, loss='scce', train='last:2', log=lambda *a: None)
    prepare(model, f, data=data, loss='scce', dequantize=True, log=lambda *a: None)
    for d in (q, f):
        shutil.copy(os.path.join(d, 'weights.wof'), os.path.join(d, 'trained.wof'))
    for d, kw in ((q, {}), (f, {}), (f, dict(quantized=True))):
        for ext, ident in (('circle', b'CIR0'), ('tflite', b'TFL3')):
            dst = str(tmp_path / f'out.{ext}')
            r = export(model, os.path.join(d, 'trained.wof'), dst, **kw)
            with open(dst, 'rb') as fh:
                assert fh.read(8)[4:] == ident, (d, kw, ext)
            assert read_model(dst).ops
            if d == q:
                assert r['int8'] and r['tensors'] == len(s['trainable']) == 2, r


def test_export_of_a_transposed_input_says_it_takes_nhwc(tmp_path):
    """A PyTorch-style model (NCHW input, TRANSPOSE to NHWC first, as tico writes it):
    prepare moves the transpose into the data; the float export takes NHWC and says so,
    naming the transpose to apply."""
    from host_tools.prepare.pipeline import export
    r = np.random.default_rng(0)
    b = CircleBuilder()
    x = b.tensor('x', [1, 2, 6, 6])
    t = b.tensor('t', [1, 6, 6, 2])
    b.op('TRANSPOSE', [x, b.tensor('perm', [4], data=np.array([0, 2, 3, 1], np.int32))], [t])
    c = b.tensor('c', [1, 6, 6, 4])
    b.op('CONV_2D', [t, b.tensor('w', [4, 3, 3, 2], data=r.normal(0, 0.3, (4, 3, 3, 2)).astype(np.float32)),
                     b.tensor('b', [4], data=np.zeros(4, np.float32))], [c], padding='SAME',
         stride_w=1, stride_h=1, fused_activation_function='RELU')
    m = b.tensor('m', [1, 4])
    b.op('MEAN', [c, b.tensor('ax', [2], data=np.array([1, 2], np.int32))], [m], keep_dims=False)
    y = b.tensor('y', [1, 3])
    b.op('FULLY_CONNECTED', [m, b.tensor('fw', [3, 4], data=r.normal(0, 0.5, (3, 4)).astype(np.float32)),
                             b.tensor('fb', [3], data=np.zeros(3, np.float32))], [y])
    b.inputs(x)
    b.outputs(y)
    model = b.save(str(tmp_path / 'nchw.circle'))
    data = _data(str(tmp_path / 'd.npz'), (2, 6, 6), n=6)
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', from_logits=True, log=lambda *a: None)
    assert s['input_perm'] == [0, 2, 3, 1]
    res = export(model, os.path.join(out, 'weights.wof'), str(tmp_path / 'e.circle'))
    assert any('takes its input as NHWC [1, 6, 6, 2], not [1, 2, 6, 6]' in n
               and 'x.transpose(0, 2, 3, 1)' in n for n in res['notes']), res['notes']
    xs = np.load(data)['x']
    want = _onert_outputs(model, xs)
    got = _onert_outputs(str(tmp_path / 'e.circle'), xs.transpose(0, 2, 3, 1))
    assert np.allclose(want, got, atol=1e-5)     # the note's transpose is the right one
