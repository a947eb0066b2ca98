"""Updates far below a weight's int8 step (issue 28: a real two-input Keras int8 file,
trained on unix MicroPython and on the host, ended with 31 of its last Dense's 64 weights
a step apart).  Once its sigmoid head saturated, the gradient reaching the first conv was
zero at a scale near 2^-83, so the update's requantization shifted right by 67: the
host's numpy rqk took 1 << 67 as 0 (a rounding mask of -1) and rounded every 0 up to
1/256 of a step, each step, and 64-bit viper took the shift count mod 64.  Every kernel
now rounds a shift past 31 to 0 (|r| < 2^31), as the Thumb one did.  Here the two-input
net with a sigmoid head (tests/support/kerasgraphs.py build_int8_narrow) trained at lr
1e-18, whose every update rounds to 0 (the CNN with a residual ADD and batch 4 as well):
board and host end with the prepared weights."""
import os
import sys

import pytest

from repo import ROOT, assert_same_logs, board_and_host_runs, no_keep_best
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.target import runner  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from test_recal_narrow import _case  # noqa: E402

MP = runner.find_micropython()


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('kind,batch', [('two', 1), ('cnn', 1), ('two', 4)])
def test_updates_below_a_step_leave_the_weights_on_board_and_host(tmp_path, kind, batch):
    """Before: the host's weights drifted a 1/256 step a step (its log's losses moved)
    and the board's moved by whole steps; now both trained.wof are the prepared weights
    and the logs agree."""
    path, _, data, _ = _case(tmp_path, kind, cal=1 / 16 if kind == 'two' else 1 / 32, n=96)
    d = str(tmp_path / 'q8')
    prepare(path, d, data=data, test_split=0.25, optimizer='sgd', lr=1e-18, epochs=3,
            batch=batch, log=lambda *a: None)
    no_keep_best(d)
    with open(os.path.join(d, 'weights.wof'), 'rb') as f:
        before = f.read()
    (bw, _, blog), (hw, _, hlog) = board_and_host_runs(d, 'train.log')
    assert bw == hw, sum(a != b for a, b in zip(bw, hw))
    assert hw == before
    assert_same_logs(blog, hlog)
    assert len({tuple(r[2:]) for r in hlog[1:]}) == 1, hlog
