"""An int8 run prepared for a littlefs board (--board esp32, rp2040) holds its save's
reserve (train.json run.save_reserve, utrain.wof.hold) wherever it runs, and `run
--board esp32` runs it on the unix build in the heap the planner's figures for both give
(prepare.json heap.by_target: esp32's heap x sim64 / esp32).  The Esp32-Pen gesture CNN
(a float 1-D CNN from outside the project, --int8 --cache --train last:11, a test split)
needed 130.6 KB there, planned 124.1 (96.3 KB on the 32-bit build, planned 90.5): a
name bound to utrain.wof.hold kept that module's code live all run (a second copy at
each save), the reserve was taken again after trained.wof while the best weights'
record was written, the sims' plans had no reserve, and utrain.once's code, loaded
after the net and the datasets to read train.log's tail, was the load's peak.  Now it
needs 119.3 / 88.6 KB (planned 125.3 / 91.7), what it needs without the reserve."""
import json
import os

import numpy as np
import pytest

from repo import ROOT  # noqa: F401

from host_tools.formats.refmodels import small_cnn
from host_tools.plan.memory import SAVE, trains_in
from host_tools.prepare.pipeline import prepare
from host_tools.target import runner


@pytest.mark.parametrize('build', ['64-bit', '32-bit'])
def test_an_int8_run_prepared_for_a_littlefs_board_trains_in_its_simulated_plan(
        tmp_path, monkeypatch, build):
    """The held-out small CNN, --int8 --cache --train last:2 --board esp32 with a test
    split (the best weights kept: their save and record): it trains on the unix build
    in its plan there (by_target: the reserve priced), and in the heaps 1 and 2 KB above
    it, and not in plan / 1.2.  On main the 64-bit build failed in 112.2-113.7 KB
    (planned 111.1: it trained in 111.2-111.7 and from 114.2 up), the 32-bit up to 84.7
    (planned 82.5); now every heap from about 105 and 78.5 KB up trains (planned 112.1 and
    83.7)."""
    if build == '32-bit':
        if not os.path.exists(os.environ.get('UTRAIN_MP32') or '/-'):
            pytest.skip('$UTRAIN_MP32 names no build')
        monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32'])
    elif not runner.find_micropython():
        pytest.skip('no MicroPython binary')
    rng = np.random.default_rng(0)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((8, 16, 16, 1)).astype(np.float32),
             y=rng.integers(0, 3, 8))
    out = str(tmp_path / 'o')
    s = prepare(small_cnn(str(tmp_path / 'm.circle'), classes=3), out, data=data, int8=True,
                cache=True, train='last:2', board='esp32', test_split=0.25, loss='scce',
                lr=0.01, epochs=1, log=lambda *a: None)
    reserve = json.loads(open(os.path.join(out, 'train.json')).read())['run'].get('save_reserve')
    assert s.get('int8') and reserve == s['heap']['parts'][SAVE], (reserve, s['heap']['parts'])
    plan = s['heap']['by_target']['sim%d' % (8 * runner.simulator_word())]
    runner.stage(out)
    for heap in (plan, plan + 1024, plan + 2048):      # (and in the heaps just above it)
        assert trains_in(out, heap), f'does not train in {heap} B, its {build} plan {plan} B'
    assert not trains_in(out, int(plan / 1.2)), \
        f'trains in {int(plan / 1.2)} B, the plan ({plan} B) is over 1.2x the need'
