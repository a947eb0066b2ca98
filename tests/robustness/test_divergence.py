"""Issue 28: a run whose loss becomes Inf/NaN (a linear model, mse, lr 1e6) stops on the
board (unix MicroPython's fallback and the CPython+numpy simulation alike) with one line
saying what happened and what to do, keeps the last good weights and checkpoint, and
writes no NaN weights and no NaN log row; the simulation printed numpy's RuntimeWarnings
('overflow encountered in multiply') between its lines, and the stop said nothing of
what to change."""
import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT, set_train  # noqa: E402

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.files.wof import read_wof  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402

MP = runner.find_micropython()


def linear(path, n_in=6, n_out=3):
    rng = np.random.default_rng(0)
    b = CircleBuilder()
    x, y = b.tensor('x', [1, n_in]), b.tensor('y', [1, n_out])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [n_out, n_in], data=rng.normal(
        0, .5, (n_out, n_in)).astype(np.float32)), b.tensor('b', [n_out], data=np.zeros(
            n_out, np.float32))], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(path))


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp('nan')
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 6)).astype(np.float32)
    np.savez(d / 'reg.npz', x=x, y=2 * x[:, :3])
    m = linear(d / 'lin.circle')
    prepare(m, str(d / 'base'), data=str(d / 'reg.npz'), loss='mse', lr=0.01, epochs=1,
            int8=False, log=lambda *a: None)
    return d, m


def copy_of(folder, name, python):
    """A copy of the prepared base folder to run (skipped without MicroPython)."""
    if not python and MP is None:
        pytest.skip('no MicroPython')
    d, m = folder
    out = d / ('%s%d' % (name, python))
    shutil.copytree(d / 'base', out)
    return out, m


def finite_wof(path, model):
    return all(np.isfinite(v).all() for v in read_wof(str(path), read_model(model)).values())


@pytest.mark.parametrize('python', [False, True])
def test_an_inf_loss_stops_the_run_saying_what_to_do_and_keeps_the_good_weights(folder, python):
    out, m = copy_of(folder, 'fresh', python)
    set_train(out, lr=1e6, epochs=3)
    code, text = runner.run(str(out), python=python, stream=False)
    assert code == 1, text
    assert 'Warning' not in text and 'Traceback' not in text, text
    stop = [ln for ln in text.splitlines() if ln.startswith('utrain: stopped: ')]
    assert len(stop) == 1 and 'loss is inf' in stop[0] and 'lower "lr" in train.json (1e+06)' \
        in stop[0] and 'resume' not in stop[0], text
    assert 'saved trained.wof (the last good weights, restored)' in text, text
    # the good weights are the starting ones: trained.wof holds them, no row was logged
    assert (out / 'trained.wof').read_bytes() == (out / 'weights.wof').read_bytes()
    assert (out / 'train.log').read_text().splitlines()[1:] == []


@pytest.mark.parametrize('python', [False, True])
def test_diverging_after_a_checkpoint_keeps_it_and_says_resume(folder, python):
    out, m = copy_of(folder, 'ckpt', python)
    assert runner.run(str(out), python=python, stream=False)[0] == 0     # one good epoch
    ckpt = (out / 'checkpoint.ckpt').read_bytes()
    log = (out / 'train.log').read_text()
    set_train(out, lr=1e6, epochs=3, run={'resume': True})
    code, text = runner.run(str(out), python=python, stream=False)
    assert code == 1 and 'Warning' not in text, text
    assert 'restored checkpoint.ckpt; lower "lr" in train.json (1e+06) and run again with ' \
        '"resume": true' in text, text
    assert (out / 'checkpoint.ckpt').read_bytes() == ckpt
    assert (out / 'train.log').read_text() == log
    assert finite_wof(out / 'trained.wof', m)
