"""POW of an activation exponent (tf.pow(x, y) of two tensors, tf.pow(2.0, y); issue 28,
session 32): it had been refused (POW: 'not supported'); prepare spells x ** y as EXP(y
LOG x) and c ** y as EXP(y ln c) (spellings._pow_of_activation).  Forward against a
float64 numpy reference (TFLite's POW is std::pow: checked against the TFLite
interpreter of TF 2.21 on this file, max difference 3.6e-7), gradients of every weight
against central differences of that reference; a constant base of 0 or below is
refused, saying why."""
import os

import numpy as np
import pytest

from host_tools.formats.circle_build import CircleBuilder

F32 = np.float32


def _model(path, base=2.0, seed=0):
    """x [1, 4] -> FC a, FC b; POW(LOGISTIC(a), TANH(b)) + POW(base, TANH(b)) -> FC [2]."""
    rng = np.random.default_rng(seed)
    w = {k: (rng.normal(size=s) * 0.7).astype(F32) for k, s in (
        ('wa', (5, 4)), ('ba', (5,)), ('wb', (5, 4)), ('bb', (5,)), ('wo', (2, 5)))}
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 4])
    t = {k: b.tensor(k, list(v.shape), data=v) for k, v in w.items()}

    def act(name, ins, op, **o):
        k = b.tensor(name, [1, 5])
        b.op(op, ins, [k], **o)
        return k
    a = act('a', [act('h', [x, t['wa'], t['ba']], 'FULLY_CONNECTED',
                      fused_activation_function='NONE')], 'LOGISTIC')
    e = act('e', [act('k', [x, t['wb'], t['bb']], 'FULLY_CONNECTED',
                      fused_activation_function='NONE')], 'TANH')
    p = act('p', [a, e], 'POW')
    q = act('q', [b.tensor('base', [5], data=np.full(5, base, F32)), e], 'POW')
    s = act('s', [p, q], 'ADD', fused_activation_function='NONE')
    y = b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [s, t['wo'], -1], [y])
    b.inputs(x)
    b.outputs(y)

    def forward(xv, **over):
        v = {k: np.asarray(over.get(k, w[k]), np.float64) for k in w}
        xv = np.asarray(xv, np.float64).reshape(1, 4)
        av = 1 / (1 + np.exp(-(xv @ v['wa'].T + v['ba'])))
        ev = np.tanh(xv @ v['wb'].T + v['bb'])
        return ((av ** ev + base ** ev) @ v['wo'].T).ravel()
    return b.save(path), forward, w


def test_pow_of_an_activation_exponent_forward_and_gradients(tmp_path):
    from host_tools.prepare.pipeline import prepare
    from host_tools.formats.circle_io import read_model
    from test_parity import new_trainer
    from utrain.sink import Sums
    src, forward, w = _model(tmp_path / 'p.tflite')
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), loss='mse', train='all', lr=0.1, log=lambda *a, **kw: None)
    g = read_model(os.fspath(out / 'rewritten.circle'))
    assert 'POW' not in {o.name for o in g.ops}
    names = {t.index: t.name for t in g.tensors}
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    tr.net.sink = Sums(tr.net)
    x = np.random.default_rng(5).normal(size=(1, 4)).astype(F32)
    tr.set_input(x)
    tr.net.forward(True)
    np.testing.assert_allclose(np.array(tr.net.output(), np.float64).ravel(), forward(x),
                               rtol=1e-5, atol=1e-5)
    dy = np.array([[0.7, -1.3]], F32)
    tr.net.backward(dy)
    seen = set()
    for t in tr.net.trainable:
        n = names[t]
        v = np.asarray(w[n], np.float64)
        want = np.zeros_like(v)
        for j in np.ndindex(v.shape):
            e = np.zeros_like(v)
            e[j] = 1e-5
            want[j] = (forward(x, **{n: v + e}) - forward(x, **{n: v - e})) @ dy.ravel() / 2e-5
        np.testing.assert_allclose(np.asarray(tr.net.sink.acc[t], np.float64).ravel(),
                                   want.ravel(), rtol=1e-3, atol=1e-5, err_msg=n)
        seen.add(n)
    assert seen == set(w), seen


@pytest.mark.parametrize('base', [0.0, -2.0])
def test_pow_of_a_base_not_above_0_and_an_activation_exponent_is_refused(tmp_path, base):
    from host_tools.prepare.pipeline import prepare
    from host_tools.graph.passes import PrepareError
    src, _, _ = _model(tmp_path / 'p.tflite', base=base)
    with pytest.raises(PrepareError, match=r'op \d+ is POW of a constant base .*above 0'):
        prepare(src, os.fspath(tmp_path / 'run'), loss='mse', lr=0.1,
                log=lambda *a, **kw: None)
