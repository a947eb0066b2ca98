"""Issue 28: --select priced a candidate against the board's flash (select._Fits,
pipeline._flash_fits) only for a model of one input; one of several inputs had its
choice refused after the trials by prepare's flash pass.  A two-input model on a board
whose flash holds its classifier-only run but no more: the choice fits it, and prepare
succeeds (on main: 'does not fit' after the trials)."""
import os
import sys

from host_tools.target import runner
from host_tools.prepare import pipeline
from host_tools.prepare.pipeline import prepare

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'tests', 'formats'))
from test_fixed_batch import mlp, data  # noqa: E402


def test_a_two_input_selection_keeps_to_what_the_boards_flash_holds(tmp_path, monkeypatch):
    path, fwd = mlp(tmp_path / 'two.tflite', 1, inputs=2, H=200)   # (w1: 5 KB)
    d, _, _ = data(tmp_path, 2, fwd, n=40)
    kw = dict(board='rp2040', test_split=0.2, epochs=1, log=lambda *a: None)
    seen = []
    real, profs = runner.flash_advice, runner.boards()
    monkeypatch.setattr(runner, 'flash_advice', lambda *a: seen.append(a) or real(*a))
    prepare(path, str(tmp_path / 'c'), d, train='last:2', **kw)
    _, total, _, _, _, _, writes = seen[-1]
    p = {k: dict(v) for k, v in profs.items()}
    p['rp2040']['flash_fs'] = '%dK' % ((total + writes[0]) // 1024)   # (not a block more)
    monkeypatch.setattr(runner, 'boards', lambda: p)
    monkeypatch.setattr(pipeline, 'boards', lambda: p, raising=False)
    seen.clear()
    from host_tools.prepare import select as sl       # (the trials prefer w1 training too)
    monkeypatch.setattr(sl.Trials, 'score', lambda self, ranks, fold=0: 0.6 + 0.2 * (2 in ranks))
    monkeypatch.setattr(sl.Trials, 'prefetch', lambda self, items: None)
    s = prepare(path, str(tmp_path / 'o'), d, select='auto', **kw)
    assert s['select']['ranks'] == {'3': 'all'} and len(seen) > 1     # (each candidate priced)
