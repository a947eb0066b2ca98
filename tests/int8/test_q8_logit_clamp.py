"""A classifier whose logit sits at the int8 clamp (issue 28: after a large step a wrong
class's logit at +127 on every sample passes no gradient through the clamp).  With
prepare's defaults the logits' range follows training (utrain.q8range, q8.json 'rr'):
the clamped logit doubles its range at the next checks until it is inside, and the net
learns.  Branch h59g's one-sided clamp (the loss's input passing its clamp where the
gradient points back into range) was not merged: on built int8 classifiers calibrated
too narrowly (MLPs and CNNs, 3-10 classes, logits' ranges 1/100 to 1/20 of what the
training samples reach), with prepare's defaults, --cache (fixed ranges) and lr up to
0.1, main learnt wherever the mask changed anything, within the runs' noise of it.
These tests pin the recovery.  The model is test_q8_pool's conv -> max pool -> conv ->
FC, its FC trained; its class-0 bias is pushed 2^20 int32 steps up so that logit is +127
on every sample, as a large step leaves it."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from utrain.data import Dataset  # noqa: E402
from utrain.q8train import Q8Trainer  # noqa: E402
from test_q8_pool import build, CASES, NCLS, H0, C0  # noqa: E402

MP = runner.find_micropython()
PUSH = 1 << 20


def _prepared(tmp_path, n=48):
    path = build(str(tmp_path / 'm.tflite'), *CASES[1])
    r = np.random.default_rng(4)
    y = r.integers(0, NCLS, n)
    c = r.standard_normal((NCLS, H0, H0, C0))
    x = (c[y] + 0.5 * r.standard_normal((n, H0, H0, C0))).astype(np.float32)
    np.savez(str(tmp_path / 'd.npz'), x=x, y=y)
    out = str(tmp_path / 'run')
    prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd', lr=0.03,
            epochs=3, train='last:1', log=lambda *a: None)
    return out


def _stuck(tr, ds):
    """How many of ds's samples have the class-0 logit at +127."""
    net, k = tr.net, 0
    for i in range(ds.n):
        tr._read(ds, i)
        k += net.forward(tr.x)[0] == 127
    return k


@pytest.mark.parametrize('grow', [True, False])
def test_a_logit_stuck_at_the_top_clamp_comes_down_as_its_range_grows(tmp_path, monkeypatch, grow):
    """The board's own epoch loop (Q8Trainer._pass: a step a sample, the ranges checked
    every 8): the stuck logit's range doubles (3 times here) until it is inside, and in
    the third epoch the net classifies > 0.8 of its samples.  Without range growth (q8.json
    without 'rr': ranges that cannot follow, as with row bands or a rank window) it stays
    at +127 on every sample and accuracy at 0.19 (the case pinned as such)."""
    if not grow:
        monkeypatch.setattr(quant, 'follow_ranges', lambda m, **k: None)
    out = _prepared(tmp_path)
    tr = Q8Trainer(os.path.join(out, 'q8.json'), os.path.join(out, 'weights.wof'), lr=0.03)
    assert (tr.net.rr is not None) == grow
    ds = Dataset(os.path.join(out, 'train.ds'), False)
    tr.net.layers[-1].b[0] += PUSH
    assert _stuck(tr, ds) == ds.n == 48
    for e in range(3):
        loss, acc = tr._pass(ds, True)
    if grow:
        assert tr.net.rr.e[-1] >= 1 and _stuck(tr, ds) == 0, list(tr.net.rr.e)
        assert acc > 0.8 and loss < 1.0, (acc, loss)
    else:
        assert _stuck(tr, ds) == ds.n and acc < 0.3, acc
    ds.f.close()
    tr.net.close()


MP_RUN = '''
import json
from utrain.q8train import Q8Trainer
from utrain.data import Dataset
tr = Q8Trainer('q8.json', 'weights.wof', lr=0.03)
ds = Dataset('train.ds', False)
L = tr.net.layers[-1]
L.b[0] += %d
print(json.dumps([tr._pass(ds, True)[1], list(tr.net.rr.e), list(L.w), list(L.b)]))
'''


@pytest.mark.parametrize('env', ['MICROPYTHON', 'UTRAIN_MP32'])
def test_the_recovery_on_micropython_as_on_the_host(tmp_path, env):
    """unix MicroPython's viper kernels (64-bit, and $UTRAIN_MP32's 32-bit) make the
    host's epoch from the stuck logit: its accuracy, the ranges' exponents and the trained
    FC's weights and biases, bit for bit."""
    exe = MP if env == 'MICROPYTHON' else os.environ.get(env)
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip(f'no {env} binary')
    out = _prepared(tmp_path)
    tr = Q8Trainer(os.path.join(out, 'q8.json'), os.path.join(out, 'weights.wof'), lr=0.03)
    ds = Dataset(os.path.join(out, 'train.ds'), False)
    L = tr.net.layers[-1]
    L.b[0] += PUSH
    want = [tr._pass(ds, True)[1], list(tr.net.rr.e), list(L.w), list(L.b)]
    ds.f.close()
    tr.net.close()
    assert want[1][-1] >= 1         # (the logits' range grew in it)
    mpy = int(subprocess.run([exe, '-c', 'import sys;print(sys.implementation._mpy)'],
                             capture_output=True, text=True).stdout.split()[-1])
    runner.stage(out, mpy=mpy)
    with open(os.path.join(out, 'case.py'), 'w') as f:
        f.write(MP_RUN % PUSH)
    r = subprocess.run([exe, 'case.py'], cwd=out, capture_output=True, text=True,
                       env=dict(os.environ, MICROPYPATH=':lib'), timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got[1:] == want[1:] and abs(got[0] - want[0]) < 1e-6, (got, want)     # (32-bit: float32)
