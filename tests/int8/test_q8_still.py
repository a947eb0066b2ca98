"""Updates under a weight step (issue 28, "beyond our own examples": a float Keras
autoencoder from GitHub, trained as int8 for a Pico at lr 0.01, kept its loss to six
digits for six epochs while its float twin's fell, and the run said nothing).  Its
gradients were right (the int8 updates against finite differences of the dequantized
model at cosine 0.81-0.99, layers 1-4), but each step's update was rounded to 1/256 of a
weight step before the weight's kept fraction took it: an update under 1/512 step was 0,
every step, and a layer whose updates all were (its first Dense at lr 0.01) never moved
where float's weights did.  The rounding of an FC layer's update at SGD batch 1 is now
dithered (unbiased), and an epoch that moved no trained weight says so, once with what to
do."""
import os
import sys

import numpy as np
import pytest

from repo import ROOT
sys.path.insert(0, os.path.join(ROOT, 'micro'))
sys.path.insert(0, os.path.dirname(__file__))

from host_tools.target import runner  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from test_q8_reg import _regressor  # noqa: E402

MP = runner.find_micropython()


def _data(path, n=48, seed=0):
    r = np.random.default_rng(seed)
    x = r.standard_normal((n, 16)).astype(np.float32)
    np.savez(path, x=x, y=(0.5 * np.tanh(x[:, :4])).astype(np.float32))
    return str(path)


def _prepared(tmp_path, lr, epochs=3):
    d = str(tmp_path / 'q8')
    prepare(_regressor(tmp_path), d, data=_data(tmp_path / 'd.npz'), loss='mse',
            optimizer='sgd', batch=1, lr=lr, epochs=epochs, train='all',
            log=lambda *a: None)
    return d


def _run(d, python):
    code, out = runner.run(d, python=python, stream=False)
    assert code == 0, out
    with open(os.path.join(d, 'weights.wof'), 'rb') as f, \
            open(os.path.join(d, 'trained.wof'), 'rb') as g:
        w0, w1 = f.read(), g.read()
    return out, w0, w1


def _moved(d, w0, w1):
    """How many int8 weights of the trained layers trained.wof changed from weights.wof."""
    import json
    from utrain.q8 import Q8Net
    with open(os.path.join(d, 'q8.json')) as f:
        m = json.load(f)
    net = Q8Net(m, os.path.join(d, 'weights.wof'))
    a = [bytes(L.w) for L in net.layers if L.w is not None]
    net.load_weights(os.path.join(d, 'trained.wof'))
    b = [bytes(L.w) for L in net.layers if L.w is not None]
    net.close()
    return sum(x != y for p, q in zip(a, b) for x, y in zip(p, q))


@pytest.mark.parametrize('python', [True, pytest.param(False, marks=pytest.mark.skipif(
    not MP, reason='no unix MicroPython'))])
def test_updates_under_half_a_unit_move_the_weights(tmp_path, python):
    """At lr 1e-6 almost every update of the int8 regression MLP (SGD batch 1) is under
    1/512 weight step.  Before: each rounded to 0, 4 epochs of 48 samples moved 1 weight
    and the loss by 0.004 (7.806 -> 7.803); now the dithered rounding moves 19 and the loss
    falls to 7.749 (the same on unix MicroPython: one integer generator)."""
    d = _prepared(tmp_path, 1e-6, epochs=4)
    out, w0, w1 = _run(d, python)
    assert _moved(d, w0, w1) >= 10, out
    losses = [float(v.split(' loss ')[1].split()[0]) for v in out.splitlines()
              if v.startswith('epoch ')]
    assert losses[-1] < losses[0] - 0.03, out


@pytest.mark.parametrize('python', [True, pytest.param(False, marks=pytest.mark.skipif(
    not MP, reason='no unix MicroPython'))])
def test_an_epoch_that_moves_no_weight_says_so(tmp_path, python):
    """At lr 1e-12 no int8 weight moves: each epoch's line says '(no weight moved)' and
    the first is followed by one line saying to raise the lr or train in float; train.log
    keeps its rows (plot and a resume read them).  At lr 0.05 none of it."""
    d = _prepared(tmp_path, 1e-12)
    out, w0, w1 = _run(d, python)
    assert _moved(d, w0, w1) == 0
    lines = out.splitlines()
    said = [v for v in lines if 'moved no trained weight' in v]
    assert len(said) == 1 and 'raise "lr"' in said[0] and '--float32' in said[0], out
    eps = [v for v in lines if v.startswith('epoch ')]
    assert len(eps) == 3 and all(v.endswith('(no weight moved)') for v in eps), out
    assert lines.index(said[0]) == lines.index(eps[0]) - 1
    with open(os.path.join(d, 'train.log')) as f:
        rows = f.read().splitlines()
    assert rows[0].startswith('epoch,') and [r.split(',')[0] for r in rows[1:]] == ['1', '2', '3']
    d2 = str(tmp_path / 'ok')
    prepare(_regressor(tmp_path), d2, data=str(tmp_path / 'd.npz'), loss='mse',
            optimizer='sgd', batch=1, lr=0.05, epochs=2, train='all', log=lambda *a: None)
    out2 = _run(d2, python)[0]
    assert 'no weight moved' not in out2 and 'moved no trained weight' not in out2, out2
