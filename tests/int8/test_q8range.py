"""Activation ranges that follow training (issue 33, micro/utrain/q8range.py): a float
model calibrated as int8 from untrained weights grows its activations past their
calibrated ranges; the ranges q8.json's 'rr' names double when they clip.  Here: which
ranges prepare marks, a doubling keeps what the net computes, the same run on unix
MicroPython and on the host, checkpoints and trained.wof keep the ranges."""
import json
import os
import sys

from array import array

import numpy as np
import pytest

from repo import ROOT, assert_same_logs, board_and_host_runs, no_keep_best
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare import fromfloat, quant  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from utrain.q8 import Q8Net, FC, CONV, DW  # noqa: E402

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
CNN = os.path.join(DIGITS, 'digits_cnn.circle')
MP = runner.find_micropython()


def _run_dir(tmp_path, monkeypatch, n=80, epochs=1, headroom=0.5, name='q'):
    """The digits CNN prepared as int8 from float on n samples, its activation ranges
    calibrated at headroom x the measured ones (0.5: too narrow, they clip at once)."""
    monkeypatch.setattr(fromfloat, 'HEADROOM', headroom)
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=z['x'][:n].reshape(-1, 8, 8, 1), y=z['y'][:n])
    d = str(tmp_path / name)
    prepare(CNN, d, data=data, test_split=0.25, epochs=epochs, int8=True, loss='scce',
            optimizer='sgd', lr=0.02, batch=1, log=lambda *a: None)
    return d, z['x'][:n], z['y'][:n]


def test_prepare_marks_the_ranges_that_can_double(tmp_path, monkeypatch):
    """The digits CNN (CONV_2D, pool, DEPTHWISE_CONV_2D, pool, FULLY_CONNECTED): each
    weighted layer's range, read by the next weighted layer through a pool, the logits'
    on both sides; a model not calibrated from float (the Keras int8 MLP) has none."""
    d, _, _ = _run_dir(tmp_path, monkeypatch, n=20, headroom=2.0)
    m = json.loads(open(os.path.join(d, 'q8.json')).read())
    ls = m['layers']
    every, shift, ents = m['rr']
    assert (every, shift) == (quant.RANGE_EVERY, quant.RANGE_SHIFT)
    kinds = [ls[p]['k'] for p, _, _ in ents]
    assert kinds == [CONV, DW, FC]
    assert [cs for _, cs, _ in ents] == [[2], [4], []]
    assert [t for _, _, t in ents] == [[127], [127], [127, 128]]    # RELU; the logits both
    g = read_model(os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mlp_int8.tflite'))
    assert 'rr' not in quant.meta(g, 'all')


def _deq(L, y=None):
    y = L.y if y is None else y
    return (np.frombuffer(bytes(y), np.int8).astype(np.float64) - L.zy) * L.d['sy']


def test_doubling_a_range_keeps_what_the_net_computes(tmp_path, monkeypatch):
    """Doubling every range: the CONV_2D's outputs (dequantized) move by at most one step
    of its doubled scale, the logits by a few; halving back restores the multipliers,
    scales and softmax table exactly."""
    d, x, _ = _run_dir(tmp_path, monkeypatch, n=40, headroom=4.0)
    m = json.loads(open(os.path.join(d, 'q8.json')).read())
    net = Q8Net(m, os.path.join(d, 'weights.wof'))
    rr = net.rr
    xs = [net.quantize_input(v.tolist()) for v in x[:30]]
    before = []
    for xq in xs:
        net.forward(xq)
        before.append((_deq(net.layers[0]), _deq(net.layers[-1])))
    keep = [(list(L.shf), L.d.get('sx'), L.d.get('sy')) for L in net.layers if L.shf is not None]
    etab = list(net.etab)
    for j in range(len(rr.e)):
        rr.e[j] += 1
        rr._scale(j, 1, 1)
    for xq, (y0, z0) in zip(xs, before):
        net.forward(xq)
        assert np.abs(_deq(net.layers[0]) - y0).max() <= net.layers[0].d['sy'] + 1e-9
        assert np.abs(_deq(net.layers[-1]) - z0).max() <= 3 * net.sy, (z0, _deq(net.layers[-1]))
    assert list(net.etab[:128]) == [etab[2 * i] if 2 * i < 256 else 0 for i in range(128)]
    rr.put(bytes(len(rr.e)))
    assert keep == [(list(L.shf), L.d.get('sx'), L.d.get('sy')) for L in net.layers
                    if L.shf is not None]
    assert list(net.etab) == etab


def _same_runs(outs):
    """board_and_host_runs' two runs: the same trained bytes and exponents, the logs'
    figures to the last printed digit (assert_same_logs)."""
    (wa, ea, a), (wb, eb, b) = outs
    assert wa == wb and ea == eb, (ea, eb)
    assert_same_logs(a, b)


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_ranges_follow_on_micropython_as_on_the_host(tmp_path, monkeypatch):
    """Ranges calibrated too narrow double while the CNN trains, on unix MicroPython as
    on the host's numpy trainer: the same trained.wof, exponents and log."""
    d, _, _ = _run_dir(tmp_path, monkeypatch, n=80, epochs=2)
    no_keep_best(d)                     # (trained.wof: the last epoch's)
    outs = board_and_host_runs(d, 'trained.wof.q8s', lambda f: json.loads(f.read()))
    _same_runs(outs)
    assert max(outs[0][1]) > 0, outs[0][1]


def test_checkpoints_and_trained_wof_keep_the_ranges(tmp_path, monkeypatch):
    """A checkpoint taken after ranges doubled resumes to the same weights as training on;
    trained.wof holds the biases at the calibrated scales (export dequantizes them with
    the calibrated model to the trained float biases) and load_weights brings them back."""
    d, x, y = _run_dir(tmp_path, monkeypatch, n=80)
    os.chdir(d)
    from utrain.q8train import Q8Trainer
    cfg = json.loads(open('train.json').read())
    kw = {k: cfg[k] for k in ('loss', 'optimizer', 'lr', 'batch')}

    def trainer():
        return Q8Trainer('q8.json', 'weights.wof', **kw)

    def steps(tr, a, b):
        for i in range(a, b):
            tr.net.step(xq[i], int(y[i]), kw['lr'])
            if not (i + 1) % tr.net.rr.every:
                tr.net.rr.check()
    tr = trainer()
    xq = [tr.net.quantize_input(v.tolist()) for v in x]
    steps(tr, 0, 40)
    assert max(tr.net.rr.e) > 0
    tr.save_checkpoint('c.ckpt')
    steps(tr, 40, 60)
    want = [(bytes(L.w), list(L.b)) for L in tr.net.layers if L.train]
    t2 = trainer()
    t2.load_checkpoint('c.ckpt')
    steps(t2, 40, 60)
    assert [(bytes(L.w), list(L.b)) for L in t2.net.layers if L.train] == want
    assert bytes(t2.net.rr.e) == bytes(tr.net.rr.e)
    tr.save_weights('trained.wof')
    g8 = read_model(fromfloat.INT8_MODEL)
    deq = fromfloat.dequantized(fromfloat.INT8_MODEL, 'trained.wof', 'all', len(g8.tensors))
    for L in tr.net.layers:
        if L.train:
            sw, sx = np.asarray(L.d['sw']), L.d['sx']
            assert np.allclose(deq[L.d['bt']], np.asarray(L.b) * sx * sw, rtol=1e-6, atol=1e-9)
    t3 = trainer()
    t3.net.load_weights('trained.wof')
    assert bytes(t3.net.rr.e) == bytes(tr.net.rr.e)
    assert [list(L.b) for L in t3.net.layers if L.train] == [
        list(L.b) for L in tr.net.layers if L.train]
    for i in range(5):
        assert t3.net.loss(xq[i], int(y[i])) == tr.net.loss(xq[i], int(y[i]))


@pytest.mark.parametrize('scaled', [False, True])
def test_upek_keeps_the_rounding_error(scaled):
    """upek (SGD's update of a float model trained as int8): over many steps each weight
    moves by the sum of its updates rounded once (the remainder carries what rounding
    left: |remainder| <= half a weight step); numpy's and the plain kernel's integers agree."""
    from array import array
    from utrain import q8kern as K
    rng = np.random.default_rng(3)
    n = 200
    p = array('i', [n, 0, 0, 0] if not scaled else [n, 20000, 22, 1 << 21])
    outs = []
    for kern in (K.upek, K.py_upek):
        w = bytearray(np.zeros(n, np.int8).tobytes())
        e = bytearray(n)
        tot = np.zeros(n, np.int64)
        for _ in range(50):
            d = rng.integers(-300, 300, n).astype(np.int32) * (1 + 9 * (rng.random(n) < 0.05))
            kern(w, e, array('i', d.tolist()), p)
            tot += (d.astype(np.int64) * 20000 + (1 << 21)) >> 22 if scaled else d
        wq, eq = (np.frombuffer(bytes(b), np.int8).astype(np.int64) for b in (w, e))
        ok = np.abs(wq) < 127
        assert np.array_equal((-wq[ok] * 256 + eq[ok]), tot[ok])
        assert np.abs(eq).max() <= 128 and ok.mean() > 0.9
        outs.append((bytes(w), bytes(e)))
        rng = np.random.default_rng(3)
    assert outs[0] == outs[1]


def test_export_quantized_writes_the_ranges_the_run_doubled(tmp_path, monkeypatch):
    """export --quantized of a run whose ranges doubled: TFLite Micro computes the
    exported model's logits as the board's int8 net with trained.wof (and its
    exponents) does, bit for bit."""
    pytest.importorskip('tflite_micro')
    from q8cases import assert_exported_logits_as_board
    d, x, y = _run_dir(tmp_path, monkeypatch, n=80)
    no_keep_best(d)
    code, out = runner.run(d, python=True, stream=False)
    assert code == 0, out
    ex = json.loads(open(os.path.join(d, 'trained.wof.q8s')).read())
    assert max(ex) > 0, ex
    m = json.loads(open(os.path.join(d, 'q8.json')).read())
    net = Q8Net(m, os.path.join(d, 'weights.wof'))
    net.load_weights(os.path.join(d, 'trained.wof'))
    assert list(net.rr.e) == ex
    assert_exported_logits_as_board(CNN, d, net, x[:10], tmp_path)


def _gap_dir(tmp_path, monkeypatch, n=48, epochs=1, pool=True, act='RELU', headroom=0.5):
    """A float CONV_2D (act) -> MAX_POOL_2D (pool) -> MEAN over H, W -> FC -> SOFTMAX on
    the digits, built here, prepared as int8 from float with its ranges calibrated at
    headroom x the measured ones.  Without the pool the conv keeps only a mask of its output
    (the MEAN's backward does not read it: q8sparse).  pool='rsz': a RESIZE_BILINEAR to
    11x11 and a second CONV_2D (RELU, masked: the MEAN reads it) in the pool's place."""
    from host_tools.formats.circle_build import CircleBuilder
    monkeypatch.setattr(fromfloat, 'HEADROOM', headroom)
    r = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 8, 8, 1])
    c = b.tensor('c', [1, 8, 8, 6])
    b.op('CONV_2D', [x, b.tensor('w', [6, 3, 3, 1], data=(r.standard_normal((6, 3, 3, 1)) * 0.3).astype(
        np.float32)), b.tensor('bb', [6], data=np.zeros(6, np.float32))], [c], padding='SAME',
         stride_w=1, stride_h=1, fused_activation_function=act)
    pc = c
    if pool == 'rsz':
        t = b.tensor('t', [1, 11, 11, 6])
        b.op('RESIZE_BILINEAR', [c, b.tensor('sz', [2], data=np.array([11, 11], np.int32))], [t],
             align_corners=False, half_pixel_centers=True)
        pc = b.tensor('c2', [1, 11, 11, 6])
        b.op('CONV_2D', [t, b.tensor('w1', [6, 3, 3, 6], data=(r.standard_normal((6, 3, 3, 6)) * 0.2).astype(
            np.float32)), b.tensor('b1', [6], data=np.zeros(6, np.float32))], [pc], padding='SAME',
             stride_w=1, stride_h=1, fused_activation_function='RELU')
    elif pool:
        pc = b.tensor('pc', [1, 4, 4, 6])
        b.op('MAX_POOL_2D', [c], [pc], padding='VALID', stride_w=2, stride_h=2, filter_width=2,
             filter_height=2, fused_activation_function='NONE')
    m = b.tensor('m', [1, 6])
    b.op('MEAN', [pc, b.tensor('ax', [2], data=np.array([1, 2], np.int32))], [m], keep_dims=False)
    y = b.tensor('y', [1, 10])
    b.op('FULLY_CONNECTED', [m, b.tensor('w2', [10, 6], data=(r.standard_normal((10, 6)) * 0.3).astype(
        np.float32)), b.tensor('b2', [10], data=np.zeros(10, np.float32))], [y])
    p = b.tensor('p', [1, 10])
    b.op('SOFTMAX', [y], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    path = b.save(str(tmp_path / 'gap.tflite'))
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    data = str(tmp_path / 'g.npz')
    np.savez(data, x=z['x'][:n].reshape(-1, 8, 8, 1), y=z['y'][:n])
    d = str(tmp_path / f'g{headroom}')
    prepare(path, d, data=data, test_split=0.25, epochs=epochs, int8=True, loss='scce',
            optimizer='sgd', lr=0.02, batch=1, log=lambda *a: None)
    return path, d, z['x'][:n]


def test_a_mean_range_follows_and_keeps_what_the_net_computes(tmp_path, monkeypatch):
    """A MEAN above a trained layer (a global average pool, issue 28) reads the conv's
    range (through the pool: its multiplier doubles with it) and is a range of its own,
    read by the FC; doubling it moves the outputs inside the calibrated range by at most
    one step of the doubled scale and lets those at its clamp grow past it; its scales
    stay in q8.json for it."""
    from utrain.q8 import MEAN
    _, d, x = _gap_dir(tmp_path, monkeypatch)
    m = json.loads(open(os.path.join(d, 'q8.json')).read())
    ls = m['layers']
    ents = m['rr'][2]
    assert [(ls[p]['k'], cs) for p, cs, _ in ents] == [(CONV, [2]), (MEAN, [3]), (FC, [])]
    assert 'sy' in ls[2] and 'sx' in ls[2]
    net = Q8Net(m, os.path.join(d, 'weights.wof'))
    xs = [net.quantize_input(v.tolist()) for v in x[:20]]
    before = []
    for xq in xs:
        net.forward(xq)
        before.append((_deq(net.layers[2]), _deq(net.layers[-1])))
    top = (127 - ls[2]['zy']) * ls[2]['sy']
    net.rr.e[1] += 1
    net.rr._scale(1, 1, 1)
    grew = 0
    for xq, (y0, z0) in zip(xs, before):
        net.forward(xq)
        y1, step = _deq(net.layers[2]), net.layers[2].d['sy'] + 1e-9
        at = y0 >= top - 1e-9
        assert np.abs(y1 - y0)[~at].max(initial=0) <= step and (y1 >= y0 - step).all()
        grew += int((y1[at] > top + step).sum())
    assert grew           # (it clipped at the calibrated range)


@pytest.mark.parametrize('act', ['RELU', 'NONE'])
def test_a_masked_conv_under_a_mean_follows_its_range(tmp_path, monkeypatch, act):
    """A conv that feeds a MEAN directly keeps only a mask of its output (q8sparse), and
    its range follows training all the same (it had been left out: its output bytes are
    gone by the check): the clamped outputs counted as its forward masked them (a RELU's
    top; without an activation both ends) are those of its output itself."""
    from utrain.q8 import MEAN
    _, d, x = _gap_dir(tmp_path, monkeypatch, n=24, pool=False, act=act)
    m = json.loads(open(os.path.join(d, 'q8.json')).read())
    ls = m['layers']
    assert [(ls[p]['k'], cs) for p, cs, _ in m['rr'][2]] == [(CONV, [1]), (MEAN, [2]), (FC, [])]
    assert ls[0].get('mask') and (len(m['rr'][2][0][2]) == 2) == (act == 'NONE')
    net = Q8Net(m, os.path.join(d, 'weights.wof'))
    L = net.layers[0]
    seen = []
    for v in x[:12]:
        xq = net.quantize_input(v.tolist())
        net.forward(xq)
        y = np.frombuffer(bytes(L.forward(xq)), np.int8)        # (the conv alone, again)
        want = int((y == 127).sum() + ((y == -128).sum() if act == 'NONE' else 0))
        assert net.rr.clipped(0) == want
        seen.append(want)
    assert max(seen) > 0 and min(seen) < L.nout


def test_a_range_follows_through_a_resize_and_keeps_what_the_net_computes(tmp_path, monkeypatch):
    """A conv under a RESIZE_BILINEAR (one scale across it) and the conv above it (masked:
    the MEAN reads it) are ranges that can double: the lower conv's had stayed at its
    calibration, and a conv whose weights grow clipped there and stopped training (a
    held-out Keras int8 file: .48 against .87 dequantized).  Doubling it (calibrated with
    room: nothing clips) moves the lower conv's outputs by at most a step of the doubled
    scale, the upper conv's (as its forward makes them) and the logits by a few; calibrated
    too narrow, its clipped outputs grow past the calibrated range."""
    from utrain.q8 import MEAN
    for headroom in (4.0, 0.5):
        _, d, x = _gap_dir(tmp_path, monkeypatch, n=24, pool='rsz', headroom=headroom)
        m = json.loads(open(os.path.join(d, 'q8.json')).read())
        ls = m['layers']
        assert [(ls[p]['k'], cs) for p, cs, _ in m['rr'][2]] == [
            (CONV, [2]), (CONV, [3]), (MEAN, [4]), (FC, [])]
        assert ls[1].get('rz') and ls[2].get('mask')
        net = Q8Net(m, os.path.join(d, 'weights.wof'))
        L0, L2 = net.layers[0], net.layers[2]
        xs = [net.quantize_input(v.tolist()) for v in x[:12]]
        before = []
        for xq in xs:
            net.forward(xq)
            before.append((_deq(L0, L0.forward(xq)), _deq(L2, L2.forward(net.t[L2.d['in'][0]])),
                           _deq(net.layers[-1])))
        top = (127 - L0.zy) * L0.d['sy']
        net.rr.e[0] += 1
        net.rr._scale(0, 1, 1)
        grew = 0
        for xq, (y0, u0, z0) in zip(xs, before):
            net.forward(xq)
            y1 = _deq(L0, L0.forward(xq))
            at = y0 >= top - 1e-9
            assert np.abs(y1 - y0)[~at].max(initial=0) <= L0.d['sy'] + 1e-9
            grew += int((y1[at] > top + L0.d['sy']).sum())
            if headroom > 1:
                u1 = _deq(L2, L2.forward(net.t[L2.d['in'][0]]))
                # each input of the upper conv off by at most 1.5 steps of the lower
                # conv's first scale (half a step before, half a doubled one after):
                # the upper's outputs by its weights' L1 norm times that, and a step
                w = np.frombuffer(bytes(L2.w), np.int8).reshape(6, -1) * np.asarray(L2.d['sw'])[:, None]
                tol = np.abs(w).sum(1).max() * 1.5 * L0.d['sy'] / 2 + L2.d['sy']
                assert np.abs(u1 - u0).max() <= tol, (np.abs(u1 - u0).max(), tol)
                assert np.abs(_deq(net.layers[-1]) - z0).max() <= 3 * net.sy
        assert (grew > 0) == (headroom < 1)


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('pool', [True, False, 'rsz'])
def test_a_mean_range_doubles_on_micropython_as_on_the_host_and_exports(tmp_path, monkeypatch,
                                                                         pool):
    """The conv's range (the MEAN reads it, through a pool or directly: then the conv
    keeps a mask of its output) and the MEAN's double while the model trains,
    on unix MicroPython as on the host: the same trained.wof, exponents and log (pool
    'rsz': the conv under a resize and the one above it double too); export
    --quantized writes the doubled scales: TFLite Micro's logits are the board's."""
    pytest.importorskip('tflite_micro')
    from q8cases import assert_exported_logits_as_board
    path, d, x = _gap_dir(tmp_path, monkeypatch, pool=pool)
    no_keep_best(d)
    outs = board_and_host_runs(d, 'trained.wof.q8s', lambda f: json.loads(f.read()))
    _same_runs(outs)
    assert min(outs[0][1][:2]) > 0, outs[0][1]      # (the conv's, read by the MEAN; the MEAN's)
    assert pool != 'rsz' or min(outs[0][1][:3]) > 0, outs[0][1]    # (and the upper conv's)
    run = d + 'mp'
    m = json.loads(open(os.path.join(run, 'q8.json')).read())
    net = Q8Net(m, os.path.join(run, 'weights.wof'))
    net.load_weights(os.path.join(run, 'trained.wof'))
    assert list(net.rr.e) == outs[0][1]
    assert_exported_logits_as_board(path, run, net, x[:8], tmp_path)


def test_an_integer_stepped_bias_follows_its_range_in_integers(tmp_path, monkeypatch):
    """A per-tensor consumer's int32 bias that SGD steps in integers (no float bias held:
    stale) is halved in integers, ties to even, when its input range doubles, and doubled
    when it halves back.  From a float bias made from it every odd b was a tie that float32
    (a board) and float64 (the host) broke apart (as q8grow's doubling: test_q8grow.py)."""
    d, _, _ = _run_dir(tmp_path, monkeypatch, n=20, headroom=2.0)
    net = Q8Net(json.loads(open(os.path.join(d, 'q8.json')).read()),
                os.path.join(d, 'weights.wof'))
    rr = net.rr
    j = [i for i, (_, cs, _) in enumerate(rr.ent) if cs and net.layers[cs[0]].k == FC][0]
    fc = net.layers[rr.ent[j][1][0]]
    assert fc.be is None and len(fc.d['sw']) == 1
    n = len(fc.b)
    for b0 in range(-3001, 3001, n):
        want = list(range(b0, b0 + n))
        fc.b[:] = array('i', want)
        fc.stale = 1            # (as q8 _bias leaves it after an integer step)
        rr._scale(j, 1, 1)
        assert list(fc.b) == [(v >> 1) + ((v & 3) == 3) for v in want]
        half = list(fc.b)
        rr._scale(j, -1, 1)
        assert list(fc.b) == [2 * v for v in half]
