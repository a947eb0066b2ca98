"""The frozen-prefix cache (utrain.prefix): training and evaluating from each sample's
cached input to the first trained op gives the weights training without it gives (bit
for bit, CPython and unix MicroPython, shuffled, with a test split); the cache file is
written whole or not at all, and one that does not match the model or dataset is
computed again, never trusted."""
import os
import sys

import numpy as np
import pytest

from test_parity import MICROPYTHON, ROOT  # sys.path set up there  # noqa: F401
from host_tools.target import runner
from host_tools.prepare.pipeline import prepare

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
CNN = os.path.join(DIGITS, 'digits_cnn.circle')
MICRO = os.path.join(ROOT, 'micro')
if MICRO not in sys.path:
    sys.path.insert(0, MICRO)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    path = str(tmp_path_factory.mktemp('d') / 'd.npz')
    np.savez(path, x=z['x'][:40], y=z['y'][:40])
    return path


def _prep(out, data, cache, train='last:2', epochs=3):
    return prepare(CNN, str(out), data=data, test_split=0.25, loss='scce', from_logits=True,
                   lr=0.05, epochs=epochs, shuffle=True, optimizer='sgd', batch=1, train=train,
                   cache=cache)


def _read(path):
    with open(path, 'rb') as f:
        return f.read()


@pytest.mark.parametrize('python', [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=['cpython', 'micropython'])
def test_cached_prefix_trains_like_the_whole_model(tmp_path, data, python):
    if not python and not MICROPYTHON:
        pytest.skip('no MicroPython binary')
    runs = {}
    for cache in (False, True):
        out = tmp_path / ('c' if cache else 'n')
        _prep(out, data, cache)
        code, text = runner.run(str(out), python=python, stream=False)
        assert code == 0, text
        runs[cache] = out, text
    out, text = runs[True]
    assert _read(out / 'trained.wof') == _read(runs[False][0] / 'trained.wof')
    # the test loss lines agree too (evaluations ran from the cache)
    pick = [[ln.split('test_loss')[1].split('ms')[0].rsplit(' ', 2)[0] for ln in t.splitlines() if 'test_loss' in ln]
            for _, t in runs.values()]
    assert pick[0] == pick[1]
    assert (out / 'train.ds.pfx').exists() and (out / 'test.ds.pfx').exists()
    assert not [f for f in os.listdir(out) if f.endswith('.tmp')]
    assert not [f for f in os.listdir(runs[False][0]) if '.pfx' in f]


def _trainer(out):
    from utrain.trainer import Trainer
    from utrain.data import Dataset
    tr = Trainer(str(out / 'model.flat'), str(out / 'weights.wof'))
    tr.cache = True
    return tr, Dataset(str(out / 'train.ds'))


def test_cache_is_written_whole_or_not_at_all(tmp_path, data):
    out = tmp_path / 'o'
    _prep(out, data, True)
    tr, ds = _trainer(out)

    def stop(i, n, ls, ms):
        if i == 5:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        tr.train_epoch(ds, stop)
    assert not (out / 'train.ds.pfx').exists()
    tr, ds = _trainer(out)
    tr.train_epoch(ds)
    from utrain.prefix import cut
    k, ts = cut(tr.net)
    assert k > 0 and ts
    sh = tr.net.shape
    body = ds.n * 4 * sum(sh[t][0] * sh[t][1] for t in ts)
    assert os.path.getsize(out / 'train.ds.pfx') == 24 + 12 * len(ts) + body


@pytest.mark.parametrize('damage', ['truncated', 'other model', 'other dataset'])
def test_a_cache_that_does_not_match_is_computed_again(tmp_path, data, damage, capsys):
    out = tmp_path / 'o'
    _prep(out, data, True)
    tr, ds = _trainer(out)
    tr.train_epoch(ds)
    ref = tr.evaluate(ds)
    pfx = out / 'train.ds.pfx'
    good = _read(pfx)
    if damage == 'truncated':
        pfx.write_bytes(good[:-4])
    elif damage == 'other model':
        # same sizes, another cut op: as after preparing another --train in this folder
        pfx.write_bytes(good[:6] + bytes([good[6] ^ 1]) + good[7:])
    else:
        b = bytearray(good)
        b[16] ^= 1                  # the dataset size it was made from
        pfx.write_bytes(bytes(b))
    tr2, ds2 = _trainer(out)
    tr2.net.load_weights(str(out / 'weights.wof'))
    for k in tr.net.trainable:
        tr2.net.t[k][:] = tr.net.t[k]
    assert np.allclose(tr2.evaluate(ds2), ref, rtol=1e-6, atol=0)
    assert 'computing it again' in capsys.readouterr().out
    assert _read(pfx) == good


def test_no_prefix_no_cache(tmp_path, data):
    out = tmp_path / 'o'
    _prep(out, data, True, train='all', epochs=1)
    tr, ds = _trainer(out)
    tr.train_epoch(ds)
    assert not [f for f in os.listdir(out) if '.pfx' in f]


@pytest.mark.parametrize('python', [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=['cpython', 'micropython'])
def test_cache_made_on_the_host(tmp_path, data, python):
    """prepare --cache-on-host: the board trains from prepare's cache (the prefix's tables
    dropped) to the weights training the whole model gives (float32 rounding apart:
    the host computed the prefix with numpy)."""
    if not python and not MICROPYTHON:
        pytest.skip('no MicroPython binary')
    from host_tools.files.wof import read_wof
    from host_tools.formats.circle_io import read_model
    outs = {}
    for cache in (False, 'host'):
        out = tmp_path / str(cache)
        s = _prep(out, data, cache)
        if cache:
            assert s['prefix_cache']['op'] > 0
            before = {f: _read(out / f) for f in os.listdir(out) if f.endswith('.pfx')}
            assert sorted(before) == ['test.ds.pfx', 'train.ds.pfx']
        code, text = runner.run(str(out), python=python, stream=False)
        assert code == 0, text
        if cache:
            assert 'computing it again' not in text
            assert before == {f: _read(out / f) for f in before}      # used as it was
        g = read_model(CNN if not os.path.exists(out / 'rewritten.circle') else str(out / 'rewritten.circle'))
        outs[cache] = read_wof(str(out / 'trained.wof'), g)
    for k, w in outs[False].items():
        np.testing.assert_allclose(outs['host'][k], w, rtol=1e-4, atol=1e-6)
