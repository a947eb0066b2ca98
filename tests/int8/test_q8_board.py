"""`prepare --select board` on an int8 model trained as int8 (issue 29): prepare writes
the union of a short list of the configurations its int8 trials tried, the board
(unix MicroPython) measures each candidate's Fisher potential per output channel with
the int8 engine on its own samples (utrain.q8fish), weighs the configurations' proxy
gains with it (utrain.fpick.pick) and trains its choice as int8 (utrain.q8keep: the
union's table restricted to it).  The model is test_q8_sparse's (conv RELU -> depthwise
RELU6 -> pointwise conv RELU -> MEAN -> FC, int8, per-channel scales).  The trials'
scores here are a fixed table (the int8 trials themselves: test_q8_sparse's
test_select_auto_on_int8_chooses_as_int8), so that the configurations the board weighs
are known: the best trains the pointwise conv at 1/8 of its channels."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.plan.memory import q8_modules  # noqa: E402
from host_tools.prepare import select as sl  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_q8_sparse import build, NCLS, H0, C0  # noqa: E402

MP = runner.find_micropython()
# proxy accuracy of each configuration the trials would score (describe(): op:rank);
# others score as the classifier alone
SCORES = {'2:1/8,4:all': 0.70, '0:bias,1:bias,4:all': 0.66, '2:all,4:all': 0.62}
PROBE = """import gc, sys
gc.threshold(2048)
from utrain.run import start
start()
print('LOADED', ' '.join(sorted(k[7:] for k in sys.modules if k.startswith('utrain.'))))
"""


def _data(path, n=60, seed=1):
    r = np.random.default_rng(seed)
    y = r.integers(0, NCLS, n)
    x = r.uniform(-0.3, 0.3, (n, H0, H0, C0)) + (y[:, None, None, None] % 3 == np.arange(3)) * 0.6
    np.savez(path, x=x.astype(np.float32), y=y)
    return path


def _run_board(d, heap):
    """train.py's run on unix MicroPython in heap bytes, then the utrain modules it holds."""
    argv, env = runner.command(d)
    with open(os.path.join(d, 'probe.py'), 'w') as f:
        f.write(PROBE)
    argv[argv.index('-X') + 1] = 'heapsize=%d' % heap
    argv[-1] = 'probe.py'
    r = subprocess.run(argv, cwd=d, env=env, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.PIPE)
    assert r.returncode == 0 and 'utrain: end: ok' in r.stdout, r.stdout + r.stderr
    out, loaded = r.stdout.split('LOADED')
    return out, set(loaded.split())


def _choice(out):
    return [ln for ln in out.splitlines() if ln.startswith(('config ', '-> config', 'op '))]


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_board_chooses_and_trains_int8_as_the_host(tmp_path, monkeypatch):
    monkeypatch.setattr(sl.Q8Trials, 'score',
                        lambda self, ranks, fold=0: SCORES.get(sl.describe(ranks), 0.5))
    model = build(str(tmp_path / 'm.tflite'))
    data = _data(str(tmp_path / 'd.npz'))
    d0 = str(tmp_path / 'prepared')
    sm = prepare(model, d0, data=data, loss='scce', lr=0.05, epochs=1, select='board',
                 budget=400 * 1024, log=lambda *a: None)
    assert sm['int8'] and 'configs' in sm['select']['select']
    # the union of the short list (the configurations tried, in turn while it fits)
    # trains in the table prepare wrote
    assert sm['select']['ranks']['2'] == sm['select']['ranks']['4'] == 'all'
    assert len(sm['select']['select']['configs']) >= 3
    assert sm['select']['graph_ops'] == [0, 1, 2, 3, 4]     # (q8.json's layers: the ops)
    outs = {}
    for py in (True, False):
        d = str(tmp_path / ('py' if py else 'mp'))
        shutil.copytree(d0, d)
        if py:
            code, out = runner.run(d, python=True, stream=False)
            assert code == 0, out
        else:
            # the board trains within the plan (its scoring pass priced), and holds
            # q8keep's code after it, not the scoring pass's: as the planner counts
            out, loaded = _run_board(d, sm['heap']['total'])
            assert 'board scoring pass' in ' '.join(sm['heap']['parts'])
            with open(os.path.join(d, 'q8.json')) as f:
                mods, _ = q8_modules(json.load(f), settings=sm['settings'])
            assert 'q8keep' in mods and 'q8keep' in loaded
            assert not {'q8fish', 'fpick', 'fisher', 'xnp'} & loaded, loaded
        with open(os.path.join(d, 'trained.wof'), 'rb') as f:
            wof = f.read()
        with open(os.path.join(d, 'checkpoint.ckpt.sel')) as f:
            keep = {i: w for i, w in json.load(f)}
        outs[py] = (_choice(out), keep, wof)
    assert outs[True] == outs[False]
    lines, keep, _ = outs[False]
    # the proxy's best (the pointwise conv's weights at 2 of 16 channels, the FC) trains:
    # the board's data is the proxy's kind, so its potentials weigh the gains alike
    at = lines.index('-> config 0')
    assert [ln.split(':')[0] for ln in lines[at + 1:]] == ['op 2 tensor 8', 'op 2 tensor 9']
    assert set(keep) == {2, 4} and keep[4] is None and keep[2][1] - keep[2][0] == 2
    # ... as int8: the pointwise conv's int8 weights moved in that window alone
    from host_tools.prepare import quant
    from host_tools.formats.circle_io import read_model
    d = str(tmp_path / 'mp')
    with open(os.path.join(d, 'q8.json')) as f:
        m = json.load(f)
    g = quant.rewritten(read_model(model))
    before = quant.read_q8_wof(os.path.join(d, 'weights.wof'), g, m)
    after = quant.read_q8_wof(os.path.join(d, 'trained.wof'), g, m)
    L = m['layers'][2]
    w0 = np.asarray(before[L['wt']]).reshape(L['nb'], -1)
    w1 = np.asarray(after[L['wt']]).reshape(L['nb'], -1)
    lo, hi = keep[2]
    assert (lo, hi) == (0, 2)       # (channel_range of 1/8 of 16: the window measured)
    moved = np.flatnonzero(np.any(w0 != w1, axis=1))
    assert len(moved) and lo <= moved.min() and moved.max() < hi
    # ... and exactly as a table prepared for that configuration alone trains (--ranks:
    # the same window, 1/8's; the union's int8 weights and scales are the same here)
    r = str(tmp_path / 'ranks')
    prepare(model, r, data=data, loss='scce', lr=0.05, epochs=1, ranks={2: 5, 4: 0},
            train='none', log=lambda *a: None)
    for name in ('weights.wof', 'train.ds'):
        with open(os.path.join(r, name), 'rb') as f, open(os.path.join(d, name), 'rb') as g0:
            assert f.read() == g0.read(), name
    code, out = runner.run(r, python=True, stream=False)
    assert code == 0, out
    with open(os.path.join(r, 'trained.wof'), 'rb') as f:
        assert f.read() == outs[False][2]
    # a resumed run trains the same choice (kept beside the checkpoint), with no pass
    d = str(tmp_path / 'py')
    with open(os.path.join(d, 'train.json')) as f:
        cfg = json.load(f)
    cfg['epochs'], cfg['run']['resume'] = 2, True
    with open(os.path.join(d, 'train.json'), 'w') as f:
        json.dump(cfg, f)
    code, out = runner.run(d, python=True, stream=False)
    assert code == 0 and 'board selection' not in out, out
    assert "resuming the board's choice: layers 2:%d-%d 4" % (lo, hi) in out
