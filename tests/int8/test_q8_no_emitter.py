"""An int8 run on a firmware without the native emitter (host_tools stages q8kern with its
viper decorators stripped: plain Python kernels).  Q8Net.quant and _read took q8kern's
VIPER for "a stream's readinto takes a count" and read a per-channel layer's multipliers
through memoryview.cast, which MicroPython has not: such a run ended in an AttributeError
at its first step.  Now it trains, to the integers the viper kernels give."""
import os
import shutil
import subprocess

import pytest

from repo import no_keep_best
from q8cases import digits_cnn_int8

from host_tools.target import runner
from host_tools.prepare.pipeline import prepare

MP = runner.find_micropython()


def _train(d, mpy=None):
    runner.stage(d, mpy=mpy)
    r = subprocess.run([MP, '-X', 'heapsize=4000000', 'train.py'], cwd=d, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, MICROPYPATH=':lib'),
                       stdin=subprocess.DEVNULL)
    assert 'utrain: end: ok' in r.stdout, r.stdout[-1500:] + r.stderr[-1500:]
    with open(os.path.join(d, 'trained.wof'), 'rb') as f:
        return f.read()


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_per_channel_int8_run_trains_without_the_native_emitter(tmp_path):
    a = digits_cnn_int8(prepare, tmp_path, 4, 'a')      # (per-channel conv and depthwise)
    no_keep_best(a)
    b = str(tmp_path / 'b')
    shutil.copytree(a, b)
    # (sys.implementation._mpy of a firmware without the native emitter: no arch bits)
    assert _train(b, mpy=6) == _train(a)
