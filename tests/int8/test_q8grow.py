"""Weight scales that grow (issue 29, micro/utrain/q8grow.py): a trained output channel
whose int8 weights reach +-127 doubles its weight scale.  Here: which channels double,
the halved weights keep the value they held (fractions included) and the forward matches
a float reference of the dequantized weights, a resume after a doubling restores it,
unix MicroPython and the host agree bit for bit, export writes the grown scales."""
import json
import os
import sys

from array import array
from math import frexp

import numpy as np
import pytest

from repo import ROOT, assert_same_logs, board_and_host_runs, no_keep_best
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare import quant  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from utrain.q8 import Q8Net, FC, CONV  # noqa: E402

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
CNN = os.path.join(DIGITS, 'digits_cnn.circle')
MP = runner.find_micropython()


def _run_dir(tmp_path, monkeypatch, n=60, epochs=1, lr=0.05, name='g'):
    """The digits CNN prepared as int8 (from float; its ranges fixed: q8range off), every
    layer trained, SGD batch 1."""
    monkeypatch.setattr(quant, 'follow_ranges', lambda m, **k: None)
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=z['x'][:n].reshape(-1, 8, 8, 1), y=z['y'][:n])
    d = str(tmp_path / name)
    prepare(CNN, d, data=data, test_split=0.25, epochs=epochs, int8=True, loss='scce',
            optimizer='sgd', lr=lr, batch=1, log=lambda *a: None)
    return d, z['x'][:n], z['y'][:n]


def _i8(b):
    return np.frombuffer(bytes(b), np.int8).astype(np.int64)


def _net(d, fc=False):
    m = json.loads(open(os.path.join(d, 'q8.json')).read())
    if fc:                  # (q8grow doubles a per-tensor layer whole; prepare marks none)
        m['layers'][-1]['gw'] = 1
    return Q8Net(m, os.path.join(d, 'weights.wof'))


def test_prepare_marks_the_per_channel_layers_whose_weights_train(tmp_path, monkeypatch):
    d, _, _ = _run_dir(tmp_path, monkeypatch, n=20)
    ls = json.loads(open(os.path.join(d, 'q8.json')).read())['layers']
    # (the per-channel layers; with them the per-tensor FC, whose weights all train)
    assert [bool(L.get('gw')) for L in ls] == [bool(L.get('train')) for L in ls]
    assert any(L.get('gw') and L['nq'] > 1 for L in ls)
    # a per-tensor layer alone does not load q8grow
    g = read_model(os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mlp_int8.tflite'))
    assert not any(L.get('gw') for L in quant.meta(g, 'last:1')['layers'])
    assert any(L.get('gw') for L in ls)


def _fc_ref(net, L, x):
    # the FC's int8 output from float arithmetic on its dequantized input, weights, bias
    d = L.d
    sw = np.asarray(d['sw'], np.float64)
    W = _i8(L.w).reshape(L.nout, d['nin']) * (sw[:, None] if len(sw) > 1 else sw[0])
    xf = (_i8(x) - L.zx) * d['sx']
    z = W @ xf + np.asarray(L.b, np.float64) * d['sx'] * sw
    return np.clip(np.round(z / d['sy']) + L.zy, L.lo, L.hi)


def test_a_saturating_channel_doubles_and_the_forward_follows(tmp_path, monkeypatch):
    """After a check: exactly the channels with a new weight at +-127 double (per-channel
    CONV_2D; the FC's one per-tensor scale), each halved weight holds half the value it
    held to 1/512 of a step (its kept fraction included), and so each int32 bias with its
    fraction (SGD's integer bias step), and the FC's int8 output matches a float reference of the
    dequantized weights (within one output step), as it did before."""
    d, x, _ = _run_dir(tmp_path, monkeypatch, n=20)
    net = _net(d, fc=True)
    rng = np.random.default_rng(1)
    conv = [L for L in net.layers if L.k == CONV and L.train][0]
    fc = net.layers[-1]
    assert fc.k == FC and fc.ge is not None and conv.ge is not None
    xs = [net.quantize_input(v.tolist()) for v in x[:8]]
    for xq in xs:
        net.forward(xq)
        assert np.abs(_i8(fc.y) - _fc_ref(net, fc, fc.x)).max() <= 1
    # saturate a few conv channels' weights (others back from +-127) and give every
    # weight a fraction
    oc, row, _ = conv.geo()
    w = _i8(conv.w).reshape(oc, row)
    w = np.clip(w, -126, 126)
    sat = [1, oc - 2]
    for o in sat:
        w[o, rng.integers(row)] = 127 if o % 2 else -127
    conv.w[:] = (w.ravel() & 255).astype(np.uint8).tobytes()
    if conv.wf is not None:
        conv.wf[:] = rng.integers(0, 256, len(conv.wf)).astype(np.uint8).tobytes()
    T = 256 * w.ravel() - (_i8(conv.wf) if conv.wf is not None else 0)
    # (SGD steps this conv's int32 bias in integers: biases with fractions as well)
    assert conv.be is not None and conv.bf is None
    conv.b[:] = array('i', rng.integers(-3000, 3000, oc).tolist())
    conv.be[:] = rng.integers(0, 256, oc).astype(np.uint8).tobytes()
    TB = 256 * np.asarray(conv.b, np.int64) - _i8(conv.be)
    sw0 = np.array(conv.d['sw'], np.float64)
    shf0 = list(conv.shf)
    fc_sat = _i8(fc.w).__abs__().max() == 127
    net.wg.check()
    assert [o for o in range(oc) if conv.ge[o]] == sat
    assert list(conv.ge) == [1 if o in sat else 0 for o in range(oc)]
    sw1 = np.array(conv.d['sw'], np.float64)
    assert np.allclose(sw1, sw0 * np.where(np.isin(np.arange(oc), sat), 2, 1))
    assert list(conv.shf) == [s + (o in sat) for o, s in enumerate(shf0)]
    T1 = 256 * _i8(conv.w) - (_i8(conv.wf) if conv.wf is not None else 0)
    ch = np.repeat(np.arange(oc), row)
    moved = np.isin(ch, sat)
    assert np.array_equal(T1[~moved], T[~moved])
    assert np.all((2 * T1[moved] - T[moved] >= -1) & (2 * T1[moved] - T[moved] <= 0))
    # the bias and its fraction hold half the value they held at the doubled scale (to
    # 1/512 of a bias step), the others' unchanged
    TB1 = 256 * np.asarray(conv.b, np.int64) - _i8(conv.be)
    assert np.array_equal(np.delete(TB1, sat), np.delete(TB, sat))
    assert np.all((2 * TB1[sat] - TB[sat] >= -1) & (2 * TB1[sat] - TB[sat] <= 0))
    assert fc.ge[0] == (1 if fc_sat else 0)
    # a weight at +-127 when the counts were taken (a per-channel model's calibrated
    # maximum sits there) doubles nothing; one more weight reaching it does
    conv.w[0], conv.w[1] = 127, 0
    net.wg.base(conv)
    net.wg.check()
    assert conv.ge[0] == 0
    conv.w[1] = 129         # (-127)
    net.wg.check()
    assert conv.ge[0] == 1
    fc.w[0] = 127           # the FC saturates: its one scale doubles
    s0 = fc.d['sw'][0]
    net.wg.check()
    assert fc.ge[0] >= 1 and fc.d['sw'][0] == s0 * 2
    for xq in xs:
        net.forward(xq)
        assert np.abs(_i8(fc.y) - _fc_ref(net, fc, fc.x)).max() <= 1


def _exps(data):
    # trained.wof.q8w: {weight tensor: [exponents]}
    import struct
    assert data[:4] == b'UTGW'
    out, o = {}, 4
    while o < len(data):
        k, n = struct.unpack_from('<II', data, o)
        out[k] = list(data[o + 8:o + 8 + n])
        o += 8 + n
    return out


def _trainer(d, mom=0.0):
    from utrain.q8train import Q8Trainer
    cfg = json.loads(open(os.path.join(d, 'train.json')).read())
    kw = {k: cfg[k] for k in ('loss', 'optimizer', 'lr', 'batch')}
    kw['momentum'] = mom
    return Q8Trainer(os.path.join(d, 'q8.json'), os.path.join(d, 'weights.wof'), **kw), kw['lr']


def _state(net):
    return [(bytes(L.w), list(L.b), bytes(L.ge or b''), list(L.shf), [float(v) for v in L.d['sw']],
             bytes(L.vw or b''), bytes(L.vb or b''))
            for L in net.layers if L.train]


@pytest.mark.parametrize('mom', [0.0, 0.9])
def test_resume_after_a_doubling_restores_it(tmp_path, monkeypatch, mom):
    """A checkpoint taken after scales doubled resumes to the same weights, exponents,
    shifts and scales (and momentum's velocities, halved there: utrain.q8mom) as
    training on; trained.wof + .q8w loaded give the same losses."""
    d, x, y = _run_dir(tmp_path, monkeypatch, n=60, lr=1.0 if not mom else 0.1)
    tr, lr = _trainer(d, mom)
    xq = [tr.net.quantize_input(v.tolist()) for v in x]
    for i in range(45):
        tr.net.step(xq[i], int(y[i]), lr)
    assert any(any(L.ge) for L in tr.net.layers if L.ge is not None)
    tr.save_checkpoint(str(tmp_path / 'c.ckpt'))
    for i in range(45, 60):
        tr.net.step(xq[i], int(y[i]), lr)
    want = _state(tr.net)
    t2, _ = _trainer(d, mom)
    t2.load_checkpoint(str(tmp_path / 'c.ckpt'))
    for i in range(45, 60):
        t2.net.step(xq[i], int(y[i]), lr)
    assert _state(t2.net) == want
    tr.save_weights(str(tmp_path / 'trained.wof'))
    t3, _ = _trainer(d)
    t3.net.load_weights(str(tmp_path / 'trained.wof'))
    assert [bytes(L.ge) for L in t3.net.layers if L.ge is not None] == [
        bytes(L.ge) for L in tr.net.layers if L.ge is not None]
    for i in range(5):
        assert t3.net.loss(xq[i], int(y[i])) == tr.net.loss(xq[i], int(y[i]))
    t3.net.load_weights(os.path.join(d, 'weights.wof'))     # (no .q8w: the calibrated scales)
    t4, _ = _trainer(d)
    assert _state(t3.net) == _state(t4.net)


def test_kept_update_multipliers_equal_made_ones(tmp_path, monkeypatch):
    """A per-channel layer keeps its window's weight-update multipliers from step to step
    (utrain.q8 _mults; umn sizes them): made again only when f's mantissa or u changes,
    their shifts moved by f's exponent, a doubled channel's (q8grow) one shift less. The
    same rescaled gradient as multipliers made at each call, chunk by chunk, over f moving
    by powers of two, a new mantissa, a new u and doublings; and in training, qmul called
    for them at the first step alone."""
    from utrain import q8 as Q
    d, x, y = _run_dir(tmp_path, monkeypatch, n=20, lr=1.0)
    nets = [_trainer(d)[0].net for _ in range(2)]
    i = [k for k, L in enumerate(nets[0].layers) if L.train and L.k == CONV and len(L.d['sw']) > 1][0]
    oc, row, blk = nets[0].layers[i].geo()
    rng = np.random.default_rng(3)
    fs = [(0.61, -20, 256.0), (0.61, -24, 256.0), (0.61, -17, 256.0), (0.77, -17, 256.0),
          (0.77, -30, 256.0), (0.77, -30, 4096.0), (0.77, -22, 4096.0)]
    for t, (c, e, u) in enumerate(fs):
        if t in (2, 5):
            for net in nets:
                net.wg.double(net.layers[i], t % oc)
        g = rng.integers(-(1 << 22), 1 << 22, oc * row)
        outs = []
        for kept, net in zip((True, False), nets):
            L = net.layers[i]
            a = array('i', g.tolist())
            for c0 in range(L.wlo, L.whi, 3):      # (chunks of 3 channels)
                if not kept:
                    L.uk = None
                m = min(3, L.whi - c0)
                v = memoryview(a)[c0 * row:]
                Q._mults(L, v, m * row, c0, m, row, c * 2.0 ** e, u)
            outs.append(list(a))
        assert outs[0] == outs[1], t
        assert any(outs[0])
    # training: the multipliers made at the first step; after it only where f's mantissa
    # or u moved (a channel of a layer above that doubles to its layer's largest weight
    # scale moves the gradient's scale by a factor not a power of two) or q8grow.set
    # dropped them.  Counted inside _mults alone: q8grow's own qmul calls after a doubling
    # (_dxm, the input gradient's per-channel rescaling) are not update multipliers, and
    # whether a step doubles such a channel depends on the training path (branch h59g's
    # one-sided clamp of the logits made this run double a layer's channels in step 1:
    # 16 _dxm calls, and moved layer 0's f mantissa in step 2: 8 made again; the calls
    # summed, as they were, held only where a path doubled none of those)
    made, inside = [0, 0], [0]
    real, mults = Q.qmul, Q._mults

    def qm(v):
        made[0] += inside[0]
        return real(v)

    def mm(L, gw, n, c0, nc, blk, f, u):
        k, before = L.uk, made[0]
        inside[0] = len(L.d['sw']) > 1         # (a per-tensor layer makes its one each call)
        try:
            return mults(L, gw, n, c0, nc, blk, f, u)
        finally:
            inside[0] = 0
            if k is None or k[0] != frexp(f)[0] or k[2] != u:
                made[1] += made[0] - before         # (its remakes: f's mantissa, u moved)
    monkeypatch.setattr(Q, 'qmul', qm)
    monkeypatch.setattr(Q, '_mults', mm)
    tr, lr = _trainer(d)
    ls = [L for L in tr.net.layers if L.train and len(L.d['sw']) > 1]
    assert ls and all(len(L.um) == L.whi - L.wlo for L in ls)
    xq = [tr.net.quantize_input(v.tolist()) for v in x]
    per = []
    for k in range(6):
        made[0] = made[1] = 0
        tr.net.step(xq[k], int(y[k]), lr)
        per.append(tuple(made))
    assert per[0][0] >= sum(L.whi - L.wlo for L in ls), per
    assert all(a == b for a, b in per[1:]) and sum(a for a, _ in per[1:]) < per[0][0], per


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_grow_on_micropython_as_on_the_host(tmp_path, monkeypatch):
    """The same run on unix MicroPython and on the host's numpy trainer: the same
    trained.wof, exponents and log, with scales that doubled."""
    d, _, _ = _run_dir(tmp_path, monkeypatch, n=40, lr=1.0)
    no_keep_best(d)
    outs = board_and_host_runs(d, 'trained.wof.q8w')
    assert outs[0][:2] == outs[1][:2]
    assert_same_logs(outs[0][2], outs[1][2])     # (a 32-bit board prints float32)
    assert any(max(v) for v in _exps(outs[0][1]).values()), outs[0][1]


def _grown_run(tmp_path, monkeypatch):
    """The digits CNN trained as int8 at lr 1.0 on the host, some weight scales doubled
    (trained.wof.q8w says which): (run folder, samples)."""
    d, x, _ = _run_dir(tmp_path, monkeypatch, n=40, lr=1.0)
    no_keep_best(d)
    code, out = runner.run(d, python=True, stream=False)
    assert code == 0, out
    ex = _exps(open(os.path.join(d, 'trained.wof.q8w'), 'rb').read())
    assert any(max(v) for v in ex.values()), ex
    return d, x


def test_export_quantized_writes_the_grown_scales(tmp_path, monkeypatch):
    """export --quantized of a run whose weight scales doubled: TFLite Micro computes the
    exported model's logits as the board's int8 net with trained.wof (and its exponents)
    does, bit for bit; without the .q8w (the calibrated scales) it would not."""
    pytest.importorskip('tflite_micro')
    from q8cases import assert_exported_logits_as_board
    d, x = _grown_run(tmp_path, monkeypatch)
    net = _net(d)
    net.load_weights(os.path.join(d, 'trained.wof'))
    assert_exported_logits_as_board(CNN, d, net, x[:10], tmp_path)



def test_float_export_of_a_float_model_trained_as_int8_has_the_grown_scales(tmp_path, monkeypatch):
    """`export` (float32, the default) of a float model trained as int8 whose weight
    scales doubled: every trained weight and bias is the int8 one at the scale the run
    grew it to, as export --quantized writes it (the dequantization had used the
    calibrated scales: a held-out Keras SeparableConv2D's pointwise weights came back at
    half, 0.89 where the int8 model scores 1.00)."""
    from host_tools.prepare.pipeline import export
    d, _ = _grown_run(tmp_path, monkeypatch)
    f, q = str(tmp_path / 'f.circle'), str(tmp_path / 'q.circle')
    export(CNN, os.path.join(d, 'trained.wof'), f)
    export(CNN, os.path.join(d, 'trained.wof'), q, quantized=True)
    fl = {t.name: t for t in read_model(f).tensors}
    seen = 0
    for t in read_model(q).tensors:
        if t.data is None or not t.quant or t.dtype not in ('int8', 'int32') or t.name not in fl:
            continue
        s, z = (np.asarray(t.quant[k], np.float64) for k in ('scale', 'zero_point'))
        if s.size > 1:
            sh = [-1 if i == int(t.quant.get('quantized_dimension', 0)) else 1
                  for i in range(t.data.ndim)]
            s, z = s.reshape(sh), z.reshape(sh)
        want = (t.data.astype(np.float64) - z) * s
        np.testing.assert_allclose(fl[t.name].data, want, rtol=1e-6, atol=1e-7, err_msg=t.name)
        seen += 1
    assert seen >= 4


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_equal_scales_that_grow_apart_get_their_rescaling_buffer(tmp_path, monkeypatch):
    """A layer whose per-channel weight scales are all equal in the file (no 'pc') needs
    no per-channel rescaling of its input gradient until a channel's scale doubles; then
    it rescales into the net's second dz buffer, which had been made empty: CPython
    stopped ('buffer is smaller than requested size'), unix MicroPython's viper kernel
    wrote past it and crashed (SIGSEGV).  The buffer is sized for every layer whose
    scales may grow; both runs end, agree bit for bit, and scales did double."""
    import test_shared_constants as tsc
    monkeypatch.setattr(tsc, 'F', 6)
    src = tsc.build_int8(tmp_path / 'chain.tflite')     # (FC 6 -> 5 -> 5 -> 5, int8)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((24, 6)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.argmax(x[:, :5], 1))
    d = str(tmp_path / 'run')
    prepare(src, d, data=str(tmp_path / 'd.npz'), loss='scce', lr=0.05, epochs=2,
            optimizer='sgd', batch=1, train='all', log=lambda *a: None)
    ls = json.loads(open(os.path.join(d, 'q8.json')).read())['layers']
    assert not any(L.get('pc') for L in ls) and all(L.get('gw') for L in ls)
    no_keep_best(d)
    outs = board_and_host_runs(d, 'trained.wof.q8w')
    assert outs[0][:2] == outs[1][:2]
    assert_same_logs(outs[0][2], outs[1][2])     # (a 32-bit board prints float32)
    assert any(max(v) for v in _exps(outs[0][1]).values()), outs[0][1]


def test_an_integer_stepped_bias_halves_in_integers(tmp_path, monkeypatch):
    """A per-tensor layer's int32 bias that SGD steps in integers (no float bias held:
    stale) is halved in integers, ties to even, when its weight scale doubles.  It was
    quantized again from a float bias made from it (b sx sw / (sx 2 sw)): every odd b a
    tie, broken by the float's rounding, float32 on a board, float64 on the host (w62 +
    momentum on the emulated Pico: 3 of the classifier's 10 biases 1 off the host's)."""
    d, _, _ = _run_dir(tmp_path, monkeypatch, n=20)
    net = _net(d, fc=True)
    fc = net.layers[-1]
    assert fc.be is None and len(fc.d['sw']) == 1
    n, sw, shf = len(fc.b), fc.d['sw'][0], fc.shf[0]
    for b0 in range(-3001, 3001, n):
        want = list(range(b0, b0 + n))
        fc.b[:] = array('i', want)
        fc.stale = 1            # (as q8 _bias leaves it after an integer step)
        fc.d['sw'][0], fc.shf[0], fc.ge[0] = sw, shf, 0
        net.wg.double(fc, 0)
        assert list(fc.b) == [(v >> 1) + ((v & 3) == 3) for v in want]
        assert all(abs(2 * q - v) <= 1 for q, v in zip(fc.b, want))
