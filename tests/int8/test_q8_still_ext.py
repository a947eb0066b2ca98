"""Updates under half a 1/256 weight step (issue 28) in the layers whose weights train
outside the layer table (Layer.xo): a TRANSPOSE_CONV's (utrain.q8tcv) and an int8
embedding table's (utrain.q8emb), at SGD batch 1 with and without momentum.  Rounded to
the nearest 1/256 step (the TRANSPOSE_CONV's) or truncated to it (the table's), every
such update was 0, each step: the weights and velocities never moved.  Made in 1/65536
steps and rounded to 1/256 with a dither (Q8Net._fits, _dith, _upd: the other layers'
path), they move as the float gradient says on average, and unix MicroPython (64-bit,
and the 32-bit build where $UTRAIN_MP32 names one) ends with the host's bytes."""
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))
sys.path.insert(0, os.path.dirname(__file__))

from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from kerasgraphs import build_int8_embedding, build_keras_autoencoder  # noqa: E402

MP = runner.find_micropython()
MP32 = os.environ.get('UTRAIN_MP32')


def _moves(w0, w1, u, lr, steps, mu):
    """(weights moved, of them the float update's way, the moves projected on the float
    update: 1 unbiased) from int8 weights w0 to w1 given u, dL/dW / s_W in 1/256 steps a
    step, over steps at lr (momentum mu: w -= v each step, v = mu v + lr u)."""
    k = np.arange(1, steps + 1)
    total = lr * ((1 - mu ** k) / (1 - mu)).sum() if mu else lr * steps
    d = (np.frombuffer(bytes(w1), np.int8).astype(np.float64)
         - np.frombuffer(bytes(w0), np.int8)) * 256
    want = -total * np.ravel(u)
    moved = d != 0
    return (int(moved.sum()), int((np.sign(d) == np.sign(want))[moved].sum()),
            float(d @ want / (want @ want)))


@pytest.mark.parametrize('mu', [0.0, 0.9])
def test_transpose_conv_updates_under_half_a_unit_move(tmp_path, mu):
    """The autoencoder (CONV_2D 16 channels -> TRANSPOSE_CONV, mse), one sample over and
    over at an lr where the TRANSPOSE_CONV's largest update is 0.45/256 of a weight step
    (with momentum a tenth of it: its velocities' sum about as much): its weights move,
    each the way PyTorch's float gradient says, by about lr STEPS dL/dW / s_W in all
    (projected on it; 0.95 and 0.84 the mean of 8 generator seeds).  Rounded to the
    nearest 1/256 step none moved."""
    torch = pytest.importorskip('torch')
    from test_q8_tcv import _autoencoder, _torch_grads
    path, xs, m, net = _autoencoder(tmp_path, channels=16)
    net.setup('sgd', momentum=mu)
    L = net.layers[1]
    sw = np.asarray(L.d['sw']).reshape(-1, 1, 1, 1)
    xq, t, dtw, dtb, dcw = _torch_grads(torch, path, m, net, xs[3])
    u = dtw / sw * 256
    lr = 0.45 / np.abs(u).max() * (0.1 if mu else 1.0)
    w0, steps = bytes(L.tw), 400
    for _ in range(steps):
        net.step(xq, t.tolist(), lr)
    n, same, proj = _moves(w0, L.tw, u, lr, steps, mu)
    assert n >= 6 and same == n and 0.5 < proj < 1.6, (n, same, proj)


@pytest.mark.parametrize('mu', [0.0, 0.9])
def test_embedding_updates_under_a_unit_move(tmp_path, mu):
    """An int8 table (12 x 16) trained alone (GATHER -> MEAN -> FC), one sample of 8 ids
    (row 3 read three times) over and over at an lr where the largest row update is
    0.9/256 of a weight step (with momentum a tenth): the rows read move, each entry the
    way the float gradient says, by about lr STEPS dL/dE / s_E in all (0.98 and 1.04 the
    mean of 8 generator seeds); the others stay.  Truncated to 1/256 steps none moved."""
    from test_q8_emb import _net, _sample, _row_grads
    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=12, D=16, L=8, O=4, seed=3)
    gf = read_model(path)
    gather = next(op.number for op in gf.ops if op.name == 'GATHER')
    fc = next(t for t in gf.tensors if t.name == 'w')
    W = fc.data.astype(np.float64) * np.asarray(fc.quant['scale'])[:, None]
    net, m = _net(path, tmp_path, [gather])
    net.setup('sgd', momentum=mu)
    L = net.layers[0]
    ids, label = [0, 3, 3, 8, 1, 5, 10, 3], 2
    u = _row_grads(net, m, W, ids, label) * 256
    lr = 0.9 / np.abs(u).max() * (0.1 if mu else 1.0)
    w0, steps, x = bytes(L.tt), 400, _sample(m, ids)
    for _ in range(steps):
        net.step(x, label, lr)
    n, same, proj = _moves(w0, L.tt, u, lr, steps, mu)
    assert n >= 8 and same == n and 0.5 < proj < 1.6, (n, same, proj)
    unread = [i for i in range(12) if i not in ids]
    assert np.array_equal(np.frombuffer(bytes(L.tt), np.int8).reshape(12, -1)[unread],
                          np.frombuffer(w0, np.int8).reshape(12, -1)[unread])


def _both(tmp_path, d, side, was):
    """Run d on unix MicroPython and on the host: the same trained.wof and side file
    (its TRANSPOSE_CONV's or table's trained bytes), which moved from the model's."""
    from test_q8_reg import trained_on_both
    trained_on_both(d, tmp_path)
    with open(os.path.join(d, 'trained.wof.' + side), 'rb') as f:
        got = f.read()
    assert got[12:12 + len(was)] != was


def _board(monkeypatch, exe):
    if exe == 'mp32':
        if not (MP32 and os.path.exists(MP32)):
            pytest.skip('$UTRAIN_MP32 names no 32-bit MicroPython build')
        monkeypatch.setenv('MICROPYTHON', MP32)     # (prepared for it: its float32)
        monkeypatch.delenv('UTRAIN_FLOAT', raising=False)
    elif not MP:
        pytest.skip('no unix MicroPython')


@pytest.mark.parametrize('exe', ['mp', 'mp32'])
@pytest.mark.parametrize('mu', [0.0, 0.9])
def test_small_updates_on_micropython_equal_the_host(tmp_path, monkeypatch, exe, mu):
    """prepare's int8 autoencoder and embedding classifier at an lr where their
    TRANSPOSE_CONV's and table's updates are mostly under a 1/256 step (SGD batch 1, with
    and without momentum): on unix MicroPython (viper) they move, and end with CPython's
    bytes (one integer generator, one dither a layer's step)."""
    _board(monkeypatch, exe)
    r = np.random.default_rng(2)
    xs = r.random((24, 8, 8, 1)).astype(np.float32)
    path, _ = build_keras_autoencoder(tmp_path / 'ae.tflite', int8_on=xs)
    np.savez(tmp_path / 'a.npz', x=xs, y=np.clip(xs * 0.7 + 0.2, 0, 1).reshape(24, -1))
    d = str(tmp_path / 'ae')
    s = prepare(path, d, data=str(tmp_path / 'a.npz'), loss='mse', epochs=2, lr=1e-5,
                momentum=mu, train='all', log=lambda *a: None)
    assert s['int8'] and 'tconv.w' in s['trainable']
    _both(tmp_path / 'a', d, 'q8c', read_model(path).tensors[4].data.tobytes())

    path, E, so, zo = build_int8_embedding(tmp_path / 'e.tflite', N=12, D=8, seed=5)
    x = r.integers(0, 12, (40, 5)).astype(np.float32)
    np.savez(tmp_path / 'e.npz', x=x, y=(x[:, 0] // 4).astype(np.int64))
    d = str(tmp_path / 'emb')
    s = prepare(path, d, data=str(tmp_path / 'e.npz'), loss='scce', epochs=2, lr=1e-4,
                momentum=mu, log=lambda *a: None)
    assert s['int8'] and 'emb' in s['trainable']
    _both(tmp_path / 'e', d, 'q8e', E.tobytes())
