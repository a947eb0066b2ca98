"""The int8 trainer's shared int32 sums buffer (q8.json 'acc', utrain.q8load) is what
the table's kernels write at once: a conv's or depthwise layer's output row, an FC's or
MEAN's output, the weight-gradient chunk kept in it (q8load.gwn).  It had a floor of
1024 values (4 KB) whatever the model: a small CNN's widest row is ~100-200 values, and
the 4 KB left int8 CNNs of the bench over --board esp32's budget.  The kernels that
chunk by its length (ADD, CAT, BIN, ...) compute each value alone: the trained bytes are
those of the old 1024 (the residual CNN's here: its second conv's weight-gradient
chunk of 432 values trained; its last FC alone, its ADD of 96 values in 2 chunks)."""
import json
import os
import shutil
import sys

import pytest

from repo import ROOT, no_keep_best
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.target import runner, device  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from test_recal_narrow import _case  # noqa: E402

MP = runner.find_micropython()


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('train,acc', [('all', 432), ('last:1', 96)])
def test_sums_buffer_is_the_widest_write_and_trains_the_same_bytes(tmp_path, train, acc):
    path, _, data, _ = _case(tmp_path, 'cnn', cal=1 / 32, n=24)
    d = str(tmp_path / 'q8')
    prepare(path, d, data=data, train=train, optimizer='sgd', lr=0.01, epochs=1, log=lambda *a: None)
    no_keep_best(d)
    with open(os.path.join(d, 'q8.json')) as f:
        meta = json.load(f)
    ls = meta['layers']
    q8 = device.module('q8')
    rows = [L['g'][11] * L['g'][3] for L in ls if L['k'] in (q8.CONV, q8.DW)]
    outs = [L['nout'] for L in ls if L['k'] in (q8.FC, q8.MEAN)]
    gchunk = device.module('q8load').bufs(ls)[2]
    assert max(L['nout'] for L in ls if L['k'] == q8.ADD) == 96 == max(rows)
    assert meta['acc'] == max(rows + outs + [gchunk]) == acc, meta['acc']
    got = {}
    for a in (acc, 1024):       # (1024: the old floor)
        run = str(tmp_path / str(a))
        shutil.copytree(d, run)
        with open(os.path.join(run, 'q8.json'), 'w') as f:
            json.dump(dict(meta, acc=a), f)
        code, out = runner.run(run, python=False, stream=False)
        assert code == 0, out
        got[a] = [open(os.path.join(run, n), 'rb').read() for n in ('trained.wof', 'checkpoint.ckpt')]
    assert got[acc] == got[1024]
    with open(os.path.join(d, 'weights.wof'), 'rb') as f:
        assert got[acc][0] != f.read()          # (it trained)
