"""Optimizer update rules against hand-written float64 formulas, and the checkpoint
layout read back with a reader written from docs/formats.md."""
import os
import struct
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from utrain.optim import Optimizer  # noqa: E402
from utrain import wof, ckread  # noqa: E402


def reference(kind, w, grads, lr, momentum=0.0, b1=0.9, b2=0.999, eps=1e-7, rho=0.9):
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        if kind == 'sgd':
            m = momentum * m + g          # PyTorch form; plain SGD when momentum is 0
            w -= lr * m
        elif kind == 'adam':
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            w -= lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
        else:
            v = rho * v + (1 - rho) * g * g
            w -= lr * g / (np.sqrt(v) + eps)
    return w


@pytest.mark.parametrize('kind,kw', [('sgd', {}), ('sgd', {'momentum': 0.9}),
                                     ('adam', {}), ('adam', {'beta1': 0.8, 'beta2': 0.99, 'eps': 1e-3}),
                                     ('rmsprop', {}), ('rmsprop', {'rho': 0.5})])
@pytest.mark.parametrize('shape', [(1, 5), (4, 3)])
def test_update_rule(kind, kw, shape):
    rng = np.random.default_rng(3)
    w0 = rng.normal(size=shape).astype(np.float32)
    grads = [rng.normal(size=shape).astype(np.float32) for _ in range(6)]
    o = Optimizer(kind, lr=0.05, **kw)
    o.init(0, shape)
    w = w0.copy()
    for g in grads:
        o.begin()
        o.step(0, w, g * 2, scale=0.5)          # sum of two samples, reduction mean
    ref_kw = {'momentum': kw.get('momentum', 0.0), 'b1': kw.get('beta1', 0.9),
              'b2': kw.get('beta2', 0.999), 'eps': kw.get('eps', 1e-7), 'rho': kw.get('rho', 0.9)}
    ref = reference(kind, w0, grads, 0.05, **ref_kw)
    assert np.abs(ref - w0).max() > 0.05        # it moved
    np.testing.assert_allclose(w, ref, rtol=2e-5, atol=2e-6)


def test_checkpoint_layout_and_round_trip(tmp_path):
    """onert-micro layout (formats.md): header, weight table, m and v tables, counters."""
    n = 5
    rng = np.random.default_rng(0)
    w = {1: rng.normal(size=(2, 3)).astype(np.float32), 3: rng.normal(size=(1, 2)).astype(np.float32)}
    m = {k: a * 2 for k, a in w.items()}
    v = {k: a * a for k, a in w.items()}
    path = str(tmp_path / 'c.ckpt')
    wof.save_checkpoint(path, n, w, m, v, 17, 3)
    data = open(path, 'rb').read()
    magic, ver, _, mo, vo, oo, nb = struct.unpack_from('<HBBIIII', data)
    assert (magic, ver, nb) == (429, 1, n) and mo and vo and oo
    assert struct.unpack_from('<II', data, oo) == (17, 3)
    for at, table in ((20, w), (mo, m), (vo, v)):
        offs = struct.unpack_from(f'<{n}I', data, at)
        for k in range(n):
            if k in table:
                got = np.frombuffer(data, '<f4', table[k].size, offs[k]).reshape(table[k].shape)
                np.testing.assert_array_equal(got, table[k])
            else:
                assert offs[k] == 0
    shapes = [None, (2, 3), None, (1, 2), None]
    w2, m2, v2, step, epoch, extra = ckread.load_checkpoint(path, n, shapes)
    assert (step, epoch, extra) == (17, 3, b'')
    for a, b in ((w, w2), (m, m2), (v, v2)):
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert not os.path.exists(path + '.tmp')


def test_sgd_checkpoint_has_no_moment_tables(tmp_path):
    path = str(tmp_path / 's.ckpt')
    wof.save_checkpoint(path, 2, {0: np.ones((1, 2), np.float32)}, {}, {}, 1, 1)
    magic, ver, _, mo, vo, oo, nb = struct.unpack_from('<HBBIIII', open(path, 'rb').read())
    assert mo == 0 and vo == 0 and oo > 0
