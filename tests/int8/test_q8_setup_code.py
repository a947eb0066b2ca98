"""Code an int8 run needs once is not held while it trains (code is heap on a board):
the trainer's set-up once the net is loaded, the optimizer's state and a start from
trained weights (utrain.q8setup) load after the net's load (utrain.q8load, dropped) and
leave before the first sample; a resume's reader (utrain.q8resume) loads only to resume.
What unix MicroPython holds in each phase (the load, the set-up, training) is what the
planner prices for it (host_tools/plan/memory.py q8_phases).  (What it bought: docs/memory.md,
session 31: 4.3-5.4 KB less code in the ESP32 plans of small int8 models.)"""
import os
import subprocess
import sys

import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.target import runner  # noqa: E402
from test_q8_lazy import _model  # noqa: E402

MP = runner.find_micropython()

PHASES = """
import sys
sys.path.insert(0, {lib!r})
import utrain
seen = {{}}
real = utrain.drop


def drop(name):
    if name in ('q8load', 'q8setup') and name not in seen:     # (what is resident then)
        seen[name] = ' '.join(sorted(k[7:] for k in sys.modules if k.startswith('utrain.')))
    real(name)


utrain.drop = drop
from utrain.q8train import Q8Trainer
tr = Q8Trainer({d!r} + '/q8.json', {d!r} + '/weights.wof', **{s!r})
if {s!r}.get('batch', 1) == 1 and {s!r}.get('optimizer', 'sgd') == 'sgd':
    tr.net.step(bytearray({nin}), 1, 0.01)
else:
    tr.net.accum(bytearray({nin}), 1)
    tr.net.apply(0.01, 1.0)
print('load', seen['q8load'])
print('setup', seen['q8setup'])
print('training', ' '.join(sorted(k[7:] for k in sys.modules if k.startswith('utrain.'))))
"""
# loaded by q8kern with it, priced with it (memory.q8_code)
HELPERS = {'q8viper', 'q8vk', 'q8asm', 'q8np'}


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
@pytest.mark.parametrize('s', [{'optimizer': 'sgd', 'batch': 1},
                               {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.9},
                               {'optimizer': 'adam', 'batch': 2}])
def test_int8_phases_hold_what_the_plan_prices(tmp_path, s):
    from host_tools.plan.memory import q8_modules, q8_phases
    d, table = _model(tmp_path, 'pool')
    runner.stage(str(tmp_path / 'st'))
    code = PHASES.format(lib=str(tmp_path / 'st' / 'lib'), d=d, nin=table['nin'], s=s)
    out = subprocess.run([MP, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    held = {p: set(rest.split()) - HELPERS for p, _, rest in
            (line.partition(' ') for line in out.stdout.splitlines())}
    mods, natives = q8_modules(table, settings=s)
    every = (mods | set(natives)) - {'run', '__init__'}     # (train.py's; not loaded here)
    for phase, without in q8_phases(s).items():
        assert held[phase] == every - set(without), phase
    assert 'q8setup' not in held['training'] and 'q8resume' not in held['training']


RESUME = """
import sys
sys.path.insert(0, {lib!r})
from utrain.q8train import Q8Trainer
tr = Q8Trainer({d!r} + '/q8.json', {d!r} + '/weights.wof')
tr.net.step(bytearray({nin}), 1, 0.01)
tr.save_checkpoint({d!r} + '/c.ckpt')
w = bytes(tr.net.layers[0].w)
tr.net.step(bytearray({nin}), 2, 0.5)
tr.load_checkpoint({d!r} + '/c.ckpt')
print('SAME', bytes(tr.net.layers[0].w) == w)
print('HELD', ' '.join(k[7:] for k in ('utrain.q8resume', 'utrain.q8setup', 'utrain.ckread')
                       if k in sys.modules))
"""


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_int8_resume_loads_its_reader_for_the_call(tmp_path):
    """A resume restores the checkpoint's weights through utrain.q8resume and drops it."""
    d, table = _model(tmp_path, 'pool')
    runner.stage(str(tmp_path / 'st'))
    code = RESUME.format(lib=str(tmp_path / 'st' / 'lib'), d=d, nin=table['nin'])
    out = subprocess.run([MP, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    said = dict((line + ' ').split(' ', 1) for line in out.stdout.splitlines())
    assert said['SAME'].strip() == 'True'
    assert said['HELD'].strip() == ''

