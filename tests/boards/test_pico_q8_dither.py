"""The int8 updates rounded to 1/256 weight step with a dither (1/65536 steps in, one
draw a layer's step: upek / upmk at m 1, sh 8; momentum's vmk / vma taking (d + h) >>
8) on the real rp2 firmware in rp2040js, where they run as q8asm / q8masm's inline
Thumb code: the trained weights are the bytes CPython (`run --python`) and 64-bit unix
MicroPython (viper) write, for an int8 conv model (per-channel: the 3x3, depthwise and
pointwise convs and the FC all train) at SGD batch 1, batch 4 with momentum, and the
digits MLP trained as int8 (--int8) at batch 1 and 4.  The kernel calls (counted under
CPython): the conv model at batch 1, upek and upmk at m 1, sh 8 for every layer; at
batch 4 with momentum, vmk at sh 8; the MLP at batch 1 upek's one-pass multiplier with
its dither (its layers per-tensor), at batch 4 upek at m 1, sh 8 (q8batch).  Skipped
without the firmware ($UTRAIN_PICO_FIRMWARE); ~2 minutes in all."""
import os
import shutil
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'tests', 'int8'))

from host_tools.boards import pico  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.pico,
              pytest.mark.skipif(not pico.available(), reason='no emulated Pico firmware '
                                 '($UTRAIN_PICO_FIRMWARE)')]
DIGITS = os.path.join(ROOT, 'datasets', 'digits')
MLP = os.path.join(DIGITS, 'digits_mlp.circle')


def _conv(tmp_path, n=10):
    from test_q8_sparse import build, NCLS, H0, C0
    r = np.random.default_rng(1)
    y = r.integers(0, NCLS, n)
    x = r.uniform(-0.3, 0.3, (n, H0, H0, C0)) + (y[:, None, None, None] % 3 == np.arange(3)) * 0.6
    np.savez(str(tmp_path / 'c.npz'), x=x.astype(np.float32), y=y)
    return build(str(tmp_path / 'c.tflite')), str(tmp_path / 'c.npz'), {}


def _mlp(tmp_path, n=12):
    with np.load(os.path.join(DIGITS, 'digits.npz')) as z:
        np.savez(str(tmp_path / 'm.npz'), x=z['x'][:n], y=z['y'][:n])
    return MLP, str(tmp_path / 'm.npz'), dict(int8=True, dtype='uint8')


@pytest.mark.parametrize('model,batch,mu', [('conv', 1, 0.0), ('conv', 4, 0.9),
                                            ('mlp', 1, 0.0), ('mlp', 4, 0.0)])
def test_dithered_updates_on_pico_as_on_unix_and_cpython(tmp_path, model, batch, mu):
    path, data, kw = (_conv if model == 'conv' else _mlp)(tmp_path)
    d = str(tmp_path / 'pico')
    prepare(path, d, data=data, loss='scce', optimizer='sgd', batch=batch, momentum=mu,
            lr=0.01, epochs=2, train='all', board='rp2040', log=lambda *a, **k: None, **kw)
    runs = {}
    for how in ('python', 'unix'):
        u = str(tmp_path / how)
        shutil.copytree(d, u)
        if how == 'unix' and not runner.find_micropython():
            continue
        code, text = runner.run(u, python=how == 'python', board='rp2040', stream=False)
        assert code == 0, text[-500:]
        runs[how] = u, text
    code, text = pico.run_folder(d, stream=False)
    assert code == 0, text[-500:]
    runs['pico'] = d, text
    out = {}
    for how, (u, text) in runs.items():
        with open(os.path.join(u, 'trained.wof'), 'rb') as f:
            out[how] = f.read()
        lines = [v for v in text.splitlines() if v.startswith('epoch ')]
        assert len(lines) == 2 and 'no weight moved' not in lines[-1], text
    with open(os.path.join(d, 'weights.wof'), 'rb') as f:
        assert out['pico'] != f.read()
    assert all(v == out['pico'] for v in out.values()), {k: len(v) for k, v in out.items()}
