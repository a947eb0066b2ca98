"""Session 28's hostile-input round (h64c): what h63b's round left (a checkpoint cut at
its counters, pull between folders of one model, a .q8w cut at a record boundary, plot's
default output, --stream with nothing frozen, "start": "best" of a float model trained as
int8), and the classes its own round found.  Each had been taken without a word, or
ended in a traceback; each now is refused naming the file and what to do, or said."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_pipeline import small_mlp  # noqa: E402
from test_refusals import files, says  # noqa: E402,F401  (a model, samples)
from test_hostile_round27 import q8, trained, int8_run, _board  # noqa: E402,F401

MP = runner.find_micropython()
WHERE = ['python'] + (['micropython'] if MP else [])
MICRO = os.path.join(ROOT, 'micro')


# ------------------------------------------------------------------ a checkpoint cut at its counters
@pytest.mark.parametrize('where', WHERE)
def test_a_checkpoint_cut_at_its_counters_is_refused(trained, tmp_path, where):
    """A utrain checkpoint cut exactly at the end of its counters (no resume block, no
    trailer) read as an onert-micro checkpoint: the run resumed at its epoch, at sample 0,
    with no best record, no lr scale, unsaid.  Its header now says utrain wrote it."""
    d = tmp_path / 'r'
    shutil.copytree(trained[0], d, ignore=shutil.ignore_patterns('lib'))
    b = (d / 'checkpoint.ckpt').read_bytes()
    cut = b[:struct.unpack_from('<I', b, 12)[0] + 8]
    (d / 'checkpoint.ckpt').write_bytes(cut)
    code, log = runner.run(os.fspath(d), python=where == 'python', stream=False)
    assert code == 1 and 'checkpoint.ckpt: cut short' in log, log
    assert 'cannot be resumed from' in runner.end_advice(os.fspath(d), log)
    assert (d / 'checkpoint.ckpt').read_bytes() == cut
    code, err = says(['export', trained[0].parent / 'm.circle', d / 'checkpoint.ckpt', '-o',
                      tmp_path / 'o.circle'])
    assert code == 2 and 'checkpoint.ckpt: cut short' in err and 'copy it again' in err, err
