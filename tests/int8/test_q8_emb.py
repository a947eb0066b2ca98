"""Int8 embeddings (issues 28/29: utrain.q8emb, Keras's Embedding in a full-integer
file: CAST of the float ids, Keras 3's SELECT_V2(LESS(i, 0), ADD(i, N), i), GATHER of an
int8 table): the ids reach the board exactly (1 or 2 bytes an id), the forward bit for
bit TFLite Micro's (1- and 2-byte ids), a bad id stops the run naming the table and the
id, one SGD step's table update against lr dL/dE / s_E of the dequantized model, the
Keras-shaped classifier's int8 run on unix MicroPython (viper) equal to CPython's and
exported as int8 (the ids' CAST and SELECT_V2 back) that TFLite Micro runs as trained."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare, export, PrepareError  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from kerasgraphs import build_int8_embedding  # noqa: E402

MP = runner.find_micropython()


def _net(path, folder, train='none'):
    g = quant.rewritten(read_model(path))
    m = quant.write(g, os.fspath(folder), train)
    m = json.loads(json.dumps(quant.as_written(m)[0]['q8.json']))
    return Q8Net(m, os.path.join(os.fspath(folder), 'weights.wof')), m


def _sample(m, ids):
    # the board's sample bytes of float ids (prepare's int8 samples: quant.emb_ids at
    # scale 1, zero point -128)
    v = quant.emb_ids(m, np.asarray(ids, np.float64)[None])[0]
    return bytearray((v.astype(np.int64) - 128).astype(np.int8).tobytes())


def _tflm(path, ids, so, zo):
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(path)
    it.set_input(np.asarray(ids, np.float32)[None], 0)
    it.invoke()
    return np.round(it.get_output(0).ravel() / so).astype(int) + zo


@pytest.mark.parametrize('N', [7, 300])         # (300: two bytes an id)
def test_forward_bit_exact_with_tflite_micro(tmp_path, N):
    """The int8 logits of utrain.q8emb's GATHER -> MEAN -> FC are TFLite Micro's on the
    file (without Keras 3's SELECT_V2: TFLite Micro has no int32 one), ids of 1 and 2
    bytes; the sample holds the ids exactly."""
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=N, wrap=False, seed=N)
    net, m = _net(path, tmp_path)
    assert m['layers'][0]['k'] == quant.EMB and m['layers'][0]['ib'] == (2 if N > 256 else 1)
    assert m['nin'] == 5 * m['layers'][0]['ib']
    r = np.random.default_rng(1)
    seen = set()
    for _ in range(12):
        ids = r.integers(0, N, 5)
        ids[0] = N - 1
        ours = np.frombuffer(bytes(net.forward(_sample(m, ids))), np.int8).astype(int)
        assert np.array_equal(ours, _tflm(path, ids, so, zo)), ids
        # (its output again: the arena's later layers reuse its bytes)
        rows = net.X[quant.EMB].fwd(net.layers[0], net, net.t)
        assert np.array_equal(np.frombuffer(bytes(rows), np.int8).reshape(5, -1), E[ids])
        seen.add(tuple(ours))
    assert len(seen) > 6


def test_ids_exact_negative_ids_and_bad_ids(tmp_path):
    """prepare's ids: a negative id of a Keras 3 table reads row id + N (its SELECT_V2); an
    id that is not a row (or not an integer) is refused naming it; on the board an id past
    the table's rows stops the run naming the table tensor and the id; a table of more
    rows than 2-byte ids reach is refused, saying --dequantize."""
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=7)
    net, m = _net(path, tmp_path)
    assert m['layers'][0]['ew'] == 1
    a = np.frombuffer(bytes(net.forward(_sample(m, [-1, -7, 0, 3, 6]))), np.int8)
    b = np.frombuffer(bytes(net.forward(_sample(m, [6, 0, 0, 3, 6]))), np.int8)
    assert np.array_equal(a, b)
    for bad in (7, 2.5, -8):
        with pytest.raises(ValueError, match=r'id %g is not a row of the embedding\'s 7' % bad):
            quant.emb_ids(m, np.array([[0, 1, bad, 2, 3]], np.float64))
    x = _sample(m, [0, 1, 2, 3, 4])
    x[2] = (9 - 128) & 255                  # (id 9 as the sample stores it)
    t = m['layers'][0]['et']
    with pytest.raises(ValueError, match=r'GATHER of table tensor %d: id 9 is not a row of its 7 '
                       r'\(0\.\.6\)' % t):
        net.forward(x)
    big, _, _, _ = build_int8_embedding(tmp_path / 'big.tflite', N=65537, D=1)
    with pytest.raises(ValueError, match=r'big\.tflite: op 4 \(GATHER\): a table of 65537 rows; int8 training '
                       r'takes ids of up to 2 bytes'):
        quant.layers(quant.rewritten(read_model(big)), 'all')


def test_one_sgd_step_against_the_float_gradient(tmp_path, monkeypatch):
    """--train naming the GATHER alone: one SGD step moves each used row by lr dL/dE / s_E
    (1/256 steps before their stochastic rounding, upk's) of the dequantized model
    (softmax cross-entropy on the int8 logits, the MEAN's and FC's gradient in float):
    cosine > 0.99, norm within 5 %; the rows no id reads stay; the FC does not move."""
    from test_q8 import spy_updates
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=9, D=6, L=5, O=4, seed=3)
    gf = read_model(path)
    gather = next(op.number for op in gf.ops if op.name == 'GATHER')
    net, m = _net(path, tmp_path, [gather])
    d0 = m['layers'][0]
    assert d0.get('eg') and not any(d.get('train') for d in m['layers'])
    fc = next(t for t in gf.tensors if t.name == 'w')
    W = fc.data.astype(np.float64) * np.asarray(fc.quant['scale'])[:, None]
    st = d0['es']
    got = spy_updates(monkeypatch)
    L = net.layers[0]
    w8 = bytes(net.layers[2].w)
    for ids, label in (([0, 3, 3, 8, 1], 2), ([5, 5, 2, 0, 7], 0)):
        x = _sample(m, ids)
        lg = np.array(net.logits(x))
        p = np.exp(lg - lg.max())
        p /= p.sum()
        p[label] -= 1.0                       # dL/dlogits
        dmean = p @ W                         # dL/dmean (its clamp not reached: checked)
        mq = np.frombuffer(bytes(net.t[m['layers'][1]['out']]), np.int8)
        assert -128 < mq.min() and mq.max() < 127
        want = np.concatenate([dmean / 5 * 0.5 / st * 256 for _ in ids])
        before = np.frombuffer(bytes(L.tt), np.int8).reshape(9, -1).copy()
        del got[:]
        net.step(x, label, 0.5)
        upd = np.concatenate(got)
        cos = float(upd @ want / np.linalg.norm(upd) / np.linalg.norm(want))
        assert cos > 0.99 and abs(np.linalg.norm(upd) / np.linalg.norm(want) - 1) < 0.05, cos
        after = np.frombuffer(bytes(L.tt), np.int8).reshape(9, -1)
        unused = [i for i in range(9) if i not in ids]
        assert np.array_equal(before[unused], after[unused])
        assert np.abs(after[ids].astype(int) - before[ids]).sum() > 0
    assert bytes(net.layers[2].w) == w8


def test_prepare_says_what_of_it_trains(tmp_path):
    """The default --train all trains the table as int8 with the layers above it, under
    momentum, Adam and a batch > 1 too; a --train without the GATHER freezes the table."""
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite')
    x = np.random.default_rng(0).integers(0, 7, (20, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 3).astype(np.int64))
    data = os.fspath(tmp_path / 'd.npz')
    s = prepare(path, os.fspath(tmp_path / 'a'), data=data, loss='scce', log=lambda *a: None)
    assert s['int8'] and 'emb' in s['trainable'] and s['trainable_params'] == 7 * 4 + 3 * 4 + 3
    for kw in (dict(momentum=0.9), dict(optimizer='adam'), dict(batch=4)):
        said = []
        s = prepare(path, os.fspath(tmp_path / 'b'), data=data, loss='scce', log=said.append, **kw)
        assert s['int8'] and 'emb' in s['trainable'] and not any('dequantiz' in v for v in said), said
    s = prepare(path, os.fspath(tmp_path / 'c'), data=data, loss='scce', momentum=0.9,
                train='last:2', log=lambda *a: None)
    assert s['int8'] and 'emb' not in s['trainable']
    with open(tmp_path / 'c' / 'q8.json') as f:
        assert not json.load(f)['layers'][0].get('eg')
    np.savez(tmp_path / 'bad.npz', x=np.where(x > 5, 7, x), y=np.zeros(20, np.int64))
    with pytest.raises(PrepareError, match=r'bad\.npz: sample \d+, position \d+: id 7 is not a row'):
        prepare(path, os.fspath(tmp_path / 'e'), data=os.fspath(tmp_path / 'bad.npz'),
                loss='scce', log=lambda *a: None)


def test_evaluate_reads_a_runs_two_byte_ids(tmp_path):
    """A run's test.ds of a table of more than 256 rows holds each id in two bytes (low
    first): evaluate of the model on it had refused ('10 values per sample, the model input
    takes 5'); it scores it as on the same samples' ids (the .npz), TFLite Micro's figures."""
    from host_tools.files.dataset import split
    from host_tools.prepare.infer import evaluate
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=300, seed=2)
    x = np.random.default_rng(1).integers(0, 300, (24, 5)).astype(np.float32)
    y = (x[:, 0] > 150).astype(np.int64)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    prepare(path, os.fspath(tmp_path / 'a'), data=os.fspath(tmp_path / 'd.npz'), test_split=0.5,
            loss='scce', log=lambda *a: None)
    te = split(len(x), 0.5, 0)[1]
    np.savez(tmp_path / 't.npz', x=x[te], y=y[te])
    a = evaluate(path, os.fspath(tmp_path / 'a' / 'test.ds'))
    b = evaluate(path, os.fspath(tmp_path / 't.npz'))
    assert a['n'] == b['n'] == 12 and a['hits'] == b['hits'] and a['loss'] == pytest.approx(b['loss'])


def _row_grads(net, m, W, ids, label):
    # dL/dE / s_E per table row [N, D] of the dequantized model on one sample (the MEAN
    # over the positions and the FC in float, softmax cross-entropy on the int8 logits)
    d0 = m['layers'][0]
    lg = np.array(net.logits(_sample(m, ids)))
    p = np.exp(lg - lg.max())
    p /= p.sum()
    p[label] -= 1.0
    dmean = p @ W
    mq = np.frombuffer(bytes(net.t[m['layers'][1]['out']]), np.int8)
    assert -128 < mq.min() and mq.max() < 127       # (the MEAN's clamp not reached)
    g = np.zeros((d0['en'], d0['ed']))
    for i in ids:
        g[i] += dmean / len(ids) / d0['es']
    return g


def _cos(a, b):
    return float((a * b).sum() / np.linalg.norm(a) / np.linalg.norm(b))


def test_batch_adam_and_momentum_against_the_float_gradient(tmp_path):
    """The table under a batch > 1, Adam and momentum, as an FC's weights (q8batch's and
    q8mom's state and updates): a sample's batch sums (weight steps, 2^-gk[0] a unit) are dL/dE /
    s_E of the dequantized model (cosine > 0.99, norm within 5 %, unused rows 0); Adam's
    first step moves the float32 master of each entry by -lr sign(dL/dE), the int8 table
    its master requantized; momentum's first velocities are the SGD step (1/256 steps)
    and a row read by the first sample alone keeps moving at the second (0.9 of it)."""
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=9, D=6, L=5, O=4, seed=3)
    gf = read_model(path)
    gather = next(op.number for op in gf.ops if op.name == 'GATHER')
    fc = next(t for t in gf.tensors if t.name == 'w')
    W = fc.data.astype(np.float64) * np.asarray(fc.quant['scale'])[:, None]
    a, b = ([0, 3, 3, 8, 1], 2), ([5, 5, 2, 0, 7], 0)
    net, m = _net(path, tmp_path / 'b', [gather])
    net.setup('sgd', batch=2)
    L = net.layers[0]
    want = _row_grads(net, m, W, *a)
    net.accum(_sample(m, a[0]), a[1])
    ga = np.array(L.ga, np.float64).reshape(want.shape) * 2.0 ** -L.gk[0]
    assert _cos(ga, want) > 0.99 and abs(np.linalg.norm(ga) / np.linalg.norm(want) - 1) < 0.05
    assert not ga[[2, 4, 5, 6, 7]].any()
    t0 = bytes(L.tt)
    net.apply(0.5, 0.5)
    assert bytes(L.tt) != t0 and not any(L.ga)

    net, m = _net(path, tmp_path / 'a', [gather])
    net.setup('adam')
    L = net.layers[0]
    st = m['layers'][0]['es']
    w0 = np.array(L.wm)
    assert np.allclose(w0, (np.frombuffer(bytes(L.tt), np.int8) * st))
    want = _row_grads(net, m, W, *a).ravel()
    net.accum(_sample(m, a[0]), a[1])
    net.apply(0.01, 1.0)
    dw = np.array(L.wm) - w0
    big = np.abs(want) > 1e-3 * np.abs(want).max()
    assert big.sum() > 10 and np.allclose(dw[big], -0.01 * np.sign(want[big]), rtol=0.02)
    assert not dw[want == 0].any()
    assert np.array_equal(np.frombuffer(bytes(L.tt), np.int8),
                          np.clip(np.round(np.array(L.wm) / st), -127, 127))

    net, m = _net(path, tmp_path / 'm', [gather])
    net.setup('sgd', momentum=0.9)
    L = net.layers[0]
    want = _row_grads(net, m, W, *a) * 0.1 * 256        # (|v| held within 32767)
    net.step(_sample(m, a[0]), a[1], 0.1)
    v1 = np.frombuffer(bytes(L.vw), np.int16).reshape(want.shape).astype(np.float64)
    assert _cos(v1, want) > 0.99 and abs(np.linalg.norm(v1) / np.linalg.norm(want) - 1) < 0.05
    before = np.frombuffer(bytes(L.tt), np.int8).reshape(want.shape).copy()
    net.step(_sample(m, b[0]), b[1], 0.1)
    v2 = np.frombuffer(bytes(L.vw), np.int16).reshape(want.shape).astype(np.float64)
    only = [1, 3, 8]                 # (read by the first sample alone)
    assert np.allclose(v2[only], 0.9 * v1[only], atol=1)
    after = np.frombuffer(bytes(L.tt), np.int8).reshape(want.shape)
    assert np.abs(after[only].astype(int) - before[only]).sum() > 0
    assert np.array_equal(after[[4, 6]], before[[4, 6]])


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('kw', [dict(lr=0.05), dict(optimizer='adam', lr=0.01),
                                dict(lr=0.01, momentum=0.9), dict(lr=0.1, batch=4)])
def test_keras_embedding_classifier_trains_as_int8_on_micropython_and_exports(tmp_path, kw):
    """The Keras-shaped int8 classifier (class: which of three id groups the sample's
    first id falls in) trains as int8, table and Dense (SGD, Adam, momentum, a batch of
    4), on unix MicroPython (viper),
    lowering the test loss, and ends with CPython's trained.wof and table (.q8e); export
    --quantized writes the trained table and Dense into the file (its CAST and SELECT_V2
    back, and its float output's DEQUANTIZE), which TFLite Micro runs bit for bit as the trained net (on the file without
    the SELECT_V2, which it cannot run: the same trained tensors)."""
    from test_q8_reg import trained_on_both
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=12, seed=5)
    r = np.random.default_rng(2)
    x = r.integers(0, 12, (160, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] // 4).astype(np.int64))
    d = os.fspath(tmp_path / 'mp')
    s = prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', epochs=4,
                test_split=0.25, log=lambda *a: None, **kw)
    assert s['int8'] and 'emb' in s['trainable']
    tl = trained_on_both(d, tmp_path)
    assert tl[-1] < 0.9 * tl[0], tl
    q = os.fspath(tmp_path / 'q.tflite')
    export(path, os.path.join(d, 'trained.wof'), q, quantized=True)
    g = read_model(q)
    assert [op.name for op in g.ops] == ['CAST', 'LESS', 'ADD', 'SELECT_V2', 'GATHER', 'MEAN',
                                         'FULLY_CONNECTED', 'DEQUANTIZE']
    assert [g.tensors[k].dtype for k in g.inputs + g.outputs] == ['float32', 'float32']
    with open(os.path.join(d, 'q8.json')) as f:
        m = json.load(f)
    net = Q8Net(m, os.path.join(d, 'weights.wof'))
    net.load_weights(os.path.join(d, 'trained.wof'))
    t = {t.name: t for t in g.tensors}
    assert not np.array_equal(t['emb'].data, E)
    # the same trained tensors in the file without the SELECT_V2 (TFLite Micro's)
    plain, _, _, _ = build_int8_embedding(tmp_path / 'p.tflite', N=12, seed=5, wrap=False)
    gp = read_model(plain)
    for k in gp.tensors:
        if k.name in ('emb', 'w', 'b'):
            k.data = t[k.name].data
    from host_tools.graph.inout import save_graph
    save_graph(gp, os.fspath(tmp_path / 'p2.tflite'))
    for ids in x[:8].astype(int):
        ours = np.frombuffer(bytes(net.forward(_sample(m, ids))), np.int8).astype(int)
        assert np.array_equal(ours, _tflm(os.fspath(tmp_path / 'p2.tflite'), ids, so, zo))


@pytest.mark.slow
@pytest.mark.parametrize('kw', [dict(optimizer='sgd', lr=0.05), dict(optimizer='adam', lr=0.01),
                                dict(optimizer='sgd', lr=0.02, momentum=0.9, batch=2)])
def test_ctrl_c_resume_with_the_table_training_bit_identical(tmp_path, kw):
    """Ctrl-C at random moments and train.py again with resume: trained.wof, the table
    (trained.wof.q8e, the checkpoint's ext state: with Adam's masters and moments,
    momentum's velocities) and the log equal an uninterrupted run's bit for bit."""
    from repo import set_train
    from test_ctrl_c import interrupted_runs
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=12, seed=5)
    x = np.random.default_rng(3).integers(-12, 12, (400, 5)).astype(np.float32)   # (-12..-1: Keras 3's)
    np.savez(tmp_path / 'd.npz', x=x, y=(np.abs(x[:, 0]) // 5).astype(np.int64))
    base = tmp_path / 'base'
    s = prepare(path, os.fspath(base), data=os.fspath(tmp_path / 'd.npz'), test_split=0.25,
                loss='scce', epochs=3, shuffle=True, seed=7, log=lambda *a: None, **kw)
    assert s['int8'] and 'emb' in s['trainable']
    set_train(base, run={'checkpoint_every': 20})
    runner.stage(os.fspath(base))
    tally = interrupted_runs(base, tmp_path, not MP, 4, 5)
    assert tally['identical'] == 4 and tally['tracebacks'] == 0 and tally['restarts'] > 0, tally
    with open(tmp_path / 'whole' / 'trained.wof.q8e', 'rb') as f:
        got = f.read()
    assert got[:4] == b'UTEM' and got[12:] != E.tobytes()      # (it trained)


def test_adam_steps_only_the_rows_a_batch_read(tmp_path):
    """Adam is lazy on a table (TensorFlow Addons' LazyAdam, PyTorch's SparseAdam): a
    step moves the rows its batch read, their masters and moments, and leaves every other
    row as it was, its moments too (dense Adam, as before, moved a row the first sample
    alone read again at the second step, by its momentum); the rows read move as dense
    Adam moves them (the step's bias correction)."""
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=9, D=6, L=5, O=4, seed=3)
    gather = next(op.number for op in read_model(path).ops if op.name == 'GATHER')
    a, b = ([0, 3, 3, 8, 1], 2), ([5, 5, 2, 0, 7], 0)
    net, m = _net(path, tmp_path / 'a', [gather])
    net.setup('adam', batch=2)
    L = net.layers[0]
    D = 6
    st = lambda: [np.array(x).reshape(9, D).copy() for x in (L.wm, L.am, L.av)]  # noqa: E731
    net.accum(_sample(m, a[0]), a[1])
    net.accum(_sample(m, a[0]), a[1])
    net.apply(0.01, 0.5)
    one = st()
    assert np.abs(one[0] - np.array(L.wm).reshape(9, D)).max() == 0
    net.accum(_sample(m, b[0]), b[1])
    net.accum(_sample(m, b[0]), b[1])
    net.apply(0.01, 0.5)
    two = st()
    only = [1, 3, 8]                 # (read by the first batch alone)
    for x, y in zip(one, two):
        assert np.array_equal(x[only], y[only])
    # the rows the second batch read: dense Adam's step on them (m, v from the first)
    for r in (0, 2, 5, 7):
        assert np.abs(two[0][r] - one[0][r]).max() > 0
    lr2 = 0.01 * np.sqrt(1 - 0.999 ** 2) / (1 - 0.9 ** 2)
    for r in (0, 2, 5, 7):
        gr = (two[1][r] - 0.9 * one[1][r]) / 0.1
        want = one[0][r] - lr2 * two[1][r] / (np.sqrt(two[2][r]) + 1e-7)
        assert np.allclose(two[0][r], want, rtol=1e-5, atol=1e-7)
        assert np.allclose(two[2][r], 0.999 * one[2][r] + 0.001 * gr * gr, rtol=1e-4, atol=1e-12)
    assert L.ln == 0 and not any(L.lz)

