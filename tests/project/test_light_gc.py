"""The device code's gc.collect() as the host runs it: the youngest generation only (a
full collection walks every object the host process holds: 0.25 s a call with torch
imported, most of a small model's prepare)."""
import gc
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
from repo import ROOT  # noqa: E402,F401
from host_tools.target.device import light_gc  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from kerasgraphs import build_int8_embedding  # noqa: E402


def test_light_gc_collects_the_youngest_generation_and_restores(monkeypatch):
    asked = []
    monkeypatch.setattr(gc, 'collect', lambda generation=2: asked.append(generation) or 0)
    spy = gc.collect
    with light_gc():
        gc.collect()
        with light_gc():
            gc.collect()
        assert gc.collect is not spy
    assert gc.collect is spy and asked == [0, 0]


def test_prepare_runs_the_device_code_with_youngest_generation_collections(tmp_path, monkeypatch):
    path = build_int8_embedding(tmp_path / 'e.tflite')[0]      # (int8: its trainers collect)
    x = np.random.default_rng(0).integers(0, 7, (20, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 3).astype(np.int64))
    real = gc.collect
    asked = []
    monkeypatch.setattr(gc, 'collect', lambda generation=2: asked.append(generation) or real(0))
    spy = gc.collect
    prepare(path, os.fspath(tmp_path / 'run'),
            data=os.fspath(tmp_path / 'd.npz'), loss='scce', log=lambda *a: None)
    assert asked and set(asked) == {0}       # (the lr probe's trainers collected)
    assert gc.collect is spy
