"""--select auto's trials stacked (host_tools/prepare/stacked.py, issue 30): a
configuration's folds trained side by side score as the same trials run one by one
(the micro/ code under CPython + numpy), on models of our own (an MLP; a small CNN with
a depthwise convolution and BatchNorm as per-channel scale and shift), with channel
windows and bias-only ranks, and the selection chooses the same either way."""
import os
import sys
import tempfile

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, ROOT)

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.target.device import board_steps, module  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.prepare import select as sl  # noqa: E402

pytestmark = pytest.mark.skipif(module('xnp').BACKEND != 'numpy', reason='a numpy path')


def _w(rng, *shape, scale=0.5):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def build(path, kind, seed=5):
    """mlp: x[1,12] -> FC 10 RELU -> FC 8 RELU -> FC 4.  cnn: x[1,6,6,2] -> CONV 3x3 4 ->
    MUL/ADD per channel (BatchNorm) RELU -> DEPTHWISE 3x3 x2 -> MUL/ADD RELU6 ->
    MAX_POOL 2x2 -> RESHAPE -> FC 4."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    if kind == 'mlp':
        cur = x = b.tensor('x', [1, 12])
        n = 12
        for i, m in enumerate((10, 8)):
            h = b.tensor('h%d' % i, [1, m])
            b.op('FULLY_CONNECTED', [cur, b.tensor('w%d' % i, [m, n], data=_w(rng, m, n)),
                                     b.tensor('b%d' % i, [m], data=_w(rng, m))], [h],
                 fused_activation_function='RELU')
            cur, n = h, m
    else:
        x = b.tensor('x', [1, 6, 6, 2])
        cur, c = x, 2
        for i, (kind_, co, act) in enumerate((('CONV_2D', 4, 'RELU'),
                                              ('DEPTHWISE_CONV_2D', 8, 'RELU6'))):
            y = b.tensor('y%d' % i, [1, 6, 6, co])
            if kind_ == 'CONV_2D':
                w = b.tensor('cw%d' % i, [co, 3, 3, c], data=_w(rng, co, 3, 3, c))
                extra = {}
            else:
                w = b.tensor('cw%d' % i, [1, 3, 3, co], data=_w(rng, 1, 3, 3, co))
                extra = dict(depth_multiplier=co // c)
            b.op(kind_, [cur, w, b.tensor('cb%d' % i, [co], data=_w(rng, co))], [y],
                 padding='SAME', stride_h=1, stride_w=1, dilation_h_factor=1,
                 dilation_w_factor=1, fused_activation_function='NONE', **extra)
            s = b.tensor('s%d' % i, [1, 6, 6, co])
            b.op('MUL', [y, b.tensor('g%d' % i, [co], data=1.0 + _w(rng, co, scale=0.1))], [s],
                 fused_activation_function='NONE')
            z = b.tensor('z%d' % i, [1, 6, 6, co])
            b.op('ADD', [s, b.tensor('be%d' % i, [co], data=_w(rng, co, scale=0.1))], [z],
                 fused_activation_function=act)
            cur, c = z, co
        p = b.tensor('p', [1, 3, 3, 8])
        b.op('MAX_POOL_2D', [cur], [p], padding='VALID', stride_h=2, stride_w=2,
             filter_height=2, filter_width=2, fused_activation_function='NONE')
        cur, n = b.tensor('f', [1, 72]), 72
        b.op('RESHAPE', [p], [cur], new_shape=[1, 72])
    out = b.tensor('out', [1, 4])
    b.op('FULLY_CONNECTED', [cur, b.tensor('wo', [4, n], data=_w(rng, 4, n)),
                             b.tensor('bo', [4], data=_w(rng, 4))], [out])
    b.inputs(x)
    b.outputs(out)
    return b.save(path)


def dataset(path, kind, loss, n=40):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, 12) if kind == 'mlp' else (n, 6, 6, 2)).astype(np.float32)
    t = x.reshape(n, -1)[:, :4] + 0.3 * x.reshape(n, -1)[:, 4:8]       # a teacher
    y = np.argmax(t, axis=1) if loss == 'scce' else t.astype(np.float32)
    np.savez(path, x=x, y=y)
    return path


def settings(loss):
    return dict(loss=loss, from_logits=True, optimizer='adam', lr=0.01, batch=1, epochs=1,
                reduction='mean', momentum=0.0, beta1=0.9, beta2=0.999, eps=1e-7, rho=0.9,
                metric='accuracy' if loss == 'scce' else 'mae')


def configurations(model):
    g = read_model(model)
    cands = sl.layers(g)
    cls = sl.classifier(g, cands)
    before = [c for c in cands if c[0] < cls]
    out = [{cls: 0}, {i: 0 for i, _ in cands}]
    for i, kinds in before[-4:]:    # bias only, 1/8 and 1/4 of the channels, a BatchNorm
        out += [{cls: 0, i: k} for k in kinds if k in (1, 4, 5) or kinds == [0]]
    return out


def _case(d, kind, loss):
    model = build(str(d / 'm.circle'), kind)
    return model, dataset(str(d / 'd.npz'), kind, loss), loss


@pytest.fixture(scope='module', params=[('mlp', 'scce'), ('mlp', 'mse'), ('cnn', 'mse')],
                ids=lambda p: '-'.join(p))
def case(request, tmp_path_factory):
    kind, loss = request.param
    return _case(tmp_path_factory.mktemp(kind + loss), kind, loss)


def test_stacked_folds_score_as_one_by_one(case, monkeypatch, tmp_path):
    """Every configuration's five folds and two of the next partition, stacked (a
    configuration's folds together, and configurations that differ only in a layer's
    channel window), score as the trials run one at a time (-MAE for mse: a
    continuous score, to 1e-5; accuracy: the same)."""
    model, data, loss = case
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))       # a trial cache of its own
    t = sl.Trials(model, data, settings(loss), 0.0, 0, prepare=prepare, log=lambda *a: None)
    try:
        confs = configurations(model)
        assert len(confs) >= 5
        items = [(r, f) for r in confs for f in (0, 1, 2, 3, 4, 5, 7)]
        groups = t._group(items)               # windows of one layer share a model:
        assert max(len({sl.describe(r) for r, _, _ in g}) for g in groups.values()) > 1
        t.prefetch(items)
        assert t.ran == len(items)             # every one stacked
        seen = set()
        for r in confs:
            one = [t._run(r, f) for f in (0, 1, 2, 3, 4, 5, 7)]
            seen.add(tuple(np.round(one, 6)))
            together = [t.cache[t._key(r, f)] for f in (0, 1, 2, 3, 4, 5, 7)]
            np.testing.assert_allclose(together, one, rtol=1e-5, atol=1e-5,
                                       err_msg=sl.describe(r))
        # the trials train: the configurations do not all score the same
        assert len(seen) > 1
    finally:
        t.close()


def test_stacked_path_declines_what_it_does_not_cover(case, monkeypatch, tmp_path):
    model, data, loss = case
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))       # a trial cache of its own
    t = sl.Trials(model, data, dict(settings(loss), batch=2), 0.0, 0, prepare=prepare,
                  log=lambda *a: None)
    try:
        r = configurations(model)[1]
        t.prefetch([(r, 0), (r, 1)])
        assert t.ran == 0 and not t.cache
        assert np.isfinite(t.mean(r))           # one by one instead
    finally:
        t.close()
    with board_steps():         # the board's row-by-row path: trials one by one
        t = sl.Trials(model, data, settings(loss), 0.0, 0, prepare=prepare, log=lambda *a: None)
        try:
            t.mean(configurations(model)[0])
            assert t.ran == t.folds
        finally:
            t.close()


def _auto(model, data, loss, monkeypatch, tmp_path):
    # two partitions of the 40 samples verify a finalist, not 360 validations' nine: the
    # same screening, search and verify steps, a quarter of the trials (the one-by-one
    # path's seconds were the suite's slowest file's tail)
    monkeypatch.setattr(sl, 'VALIDATIONS', 80)
    got = []
    for stack in (False, True):
        monkeypatch.setattr(sl, 'STACK', stack)
        monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path / str(stack)))
        os.makedirs(tempfile.tempdir)
        res = sl.choose_auto(model, data, settings(loss), None, 'fallback', 0.0, 0,
                             log=lambda *a: None, prepare=prepare)
        t = res.pop('trial_runs')
        assert t.parts == 2
        got.append((res['ranks'], dict(t.cache), t.ran))
        t.close()
    (r0, c0, n0), (r1, c1, n1) = got
    assert r0 == r1 and c0.keys() == c1.keys() and n0 == n1 > 10
    for k in c0:
        assert c1[k] == pytest.approx(c0[k], rel=1e-5, abs=1e-5), k


def test_auto_chooses_the_same_stacked_or_not(monkeypatch, tmp_path):
    """choose_auto with the folds stacked and one by one: the same trial scores (1e-5)
    and the same choice (the MLP; the CNN below)."""
    _auto(*_case(tmp_path, 'mlp', 'scce'), monkeypatch, tmp_path)


@pytest.mark.slow
def test_auto_chooses_the_same_stacked_or_not_on_the_cnn(monkeypatch, tmp_path):
    _auto(*_case(tmp_path, 'cnn', 'mse'), monkeypatch, tmp_path)


@pytest.mark.parametrize('H,W,KH,KW,s,d,pad', [
    (5, 6, 3, 3, 1, 1, 1), (7, 6, 3, 3, 2, 1, 1), (6, 5, 5, 3, 1, 2, 2), (4, 4, 2, 2, 3, 1, 0),
    (3, 4, 3, 3, 1, 1, 2), (1, 6, 1, 3, 1, 1, 1)])
def test_overlapping_windows_gradient_sums_as_np_add_at(H, W, KH, KW, s, d, pad):
    """The stacked convolution's input gradient (a strided slice per tap) adds each x
    row's window values in np.add.at's order over the window table, the sequential
    path's (xnumpy): the same bits, for strides, dilations and padding wider than the
    kernel's reach."""
    from host_tools.prepare import stacked
    OH, OW = [(n + 2 * pad - (k - 1) * d - 1) // s + 1 for n, k in ((H, KH), (W, KW))]
    o = np.zeros(16, dtype=np.float32)
    o[[1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14]] = H, W, OH, OW, KH, KW, s, s, d, d, pad, pad
    g, n, disjoint = module('xnumpy')._window(o, module('op_conv').walk, s)
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        v = rng.standard_normal((3, OH * OW, KH * KW, 4)).astype(dt)
        ref = np.zeros((3, n + 1, 4), dtype=dt)
        for k in range(3):
            np.add.at(ref[k], g, v[k])
        got = stacked._scatter(o, g, n, False, v)
        assert got.dtype == dt and np.array_equal(got, ref[:, :n])
