"""A run whose inputs come from a prefix cache the host made (--cache-on-host) reads only
the targets from train.ds: the 8-bit samples' byte buffer is made at the first input read,
not with the dataset (a 64x64x3 uint8 sample's 12 KB had been made anyway, outside the
plan: a held-out MobileNet-like net's classifier, planned at 94 KB for an ESP32, needed
117 KB on 32-bit unix MicroPython; 78-80 KB now)."""
import os

import numpy as np

from test_conv_ops import CONV, DW, MEAN, build
from host_tools.plan.memory import trains_in
from host_tools.prepare.pipeline import prepare
from host_tools.target import runner
from host_tools.target.device import module


def test_an_8bit_datasets_input_buffer_is_made_at_the_first_input_read(tmp_path):
    from host_tools.files.dataset import write_samples
    x = np.random.default_rng(0).integers(0, 255, (3, 300)).astype(np.float32)
    y = np.array([[0.0], [1.0], [2.0]], np.float32)
    write_samples(os.fspath(tmp_path), x, y, 0.0, 0, 'uint8', ('t.ds', None))
    d = module('data').Dataset(os.fspath(tmp_path / 't.ds'))
    yy, xx = np.zeros((1, 1), np.float32), np.zeros((1, 300), np.float32)
    try:
        d.read(1, None, yy)
        assert d.qx is None and yy[0, 0] == 1.0
        d.read(2, xx, yy)
        assert len(d.qx) == 300 and np.allclose(xx[0], x[2], atol=1.0) and yy[0, 0] == 2.0
    finally:
        d.close()


def test_a_host_cached_run_with_large_8bit_samples_trains_in_its_plan(tmp_path):
    spec = {'input': [1, 64, 64, 3], 'layers': [
        CONV(8, k=3, s=4, act='RELU'), DW(1, s=2, act='RELU'), CONV(16, k=1, act='RELU'),
        MEAN([1, 2], keep=False), ('FC', 4)]}
    build(spec, np.random.default_rng(1), os.fspath(tmp_path / 'm.circle'))
    rng = np.random.default_rng(2)
    np.savez(tmp_path / 'd.npz', x=rng.integers(0, 255, (8, 64, 64, 3)).astype(np.float32),
             y=rng.integers(0, 4, 8))
    out = os.fspath(tmp_path / 'run')
    s = prepare(os.fspath(tmp_path / 'm.circle'), out, data=os.fspath(tmp_path / 'd.npz'),
                loss='scce', lr=0.01, epochs=1, train='last:1', cache='host', dtype='uint8',
                log=lambda *a: None)
    runner.stage(out)
    assert trains_in(out, s['heap']['total'])
