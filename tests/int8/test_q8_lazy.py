"""Int8 device code a model does not need is not loaded (code is heap on a board): the
modules utrain.q8 loads on use (a graph's held gradients q8hold, the batch updates
q8batch, pools q8pool, growing scales q8grow, ...) are those the planner prices for the
model (host_tools/plan/memory.py q8_modules), read from what unix MicroPython has
loaded after a training step of models built here: a chain trained at SGD batch 1
loads none of q8hold and q8batch."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.plan.memory import q8_modules  # noqa: E402
from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from kerasgraphs import build_int8_branches  # noqa: E402
from test_q8_pool import build as build_pool  # noqa: E402

MP = runner.find_micropython()
# what utrain.q8 loads only on use (q8asm: staged for ARM boards alone)
ON_USE = {'q8hold', 'q8batch', 'q8share', 'q8pool', 'q8grow', 'q8sparse', 'q8cat', 'q8lut', 'q8bin', 'q8slc', 'q8nrm', 'q8slope', 'q8range',
          'q8bands', 'bands', 'q8keep', 'q8fish', 'fpick', 'fisher'}   # (the last: --select board's, test_q8_board)

STEP = """
import sys, json
sys.path.insert(0, {lib!r})
from utrain.q8 import Q8Net
net = Q8Net(json.load(open({d!r} + '/q8.json')), {d!r} + '/weights.wof')
net.setup({opt!r}, {batch})
x = bytearray({nin})
sgd1 = {opt!r} == 'sgd' and {batch} == 1
for i in range({batch}):
    if sgd1:
        net.step(x, i % 3, 0.01)
    else:
        net.accum(x, i % 3)
if not sgd1:
    net.apply(0.01, 1.0 / {batch})
print('LOADED', ' '.join(sorted(k[7:] for k in sys.modules if k.startswith('utrain.'))))
"""


def _model(tmp_path, kind):
    if kind == 'branches':      # Add() of 3 branches of one input, 2 heads concatenated
        path = build_int8_branches(tmp_path / 'b.tflite')[0]
    elif kind == 'prelu':       # Dense -> PReLU (its slopes train) -> L2 normalization -> Dense
        from kerasgraphs import build_int8_prelu_l2
        path = build_int8_prelu_l2(tmp_path / 'p.tflite')[0]
    else:                       # conv -> max pool -> conv -> FC: a chain
        path = build_pool(str(tmp_path / 'p.tflite'), 'MAX_POOL_2D')
    d = str(tmp_path / kind)
    quant.write(quant.rewritten(read_model(path)), d, 'all')
    with open(os.path.join(d, 'q8.json')) as f:
        return d, json.load(f)


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
@pytest.mark.parametrize('kind,opt,batch', [('pool', 'sgd', 1), ('pool', 'adam', 2),
                                            ('branches', 'sgd', 1), ('prelu', 'adam', 2)])
def test_int8_code_loaded_is_what_the_plan_counts(tmp_path, kind, opt, batch):
    d, table = _model(tmp_path, kind)
    runner.stage(str(tmp_path / 'st'))
    code = STEP.format(lib=str(tmp_path / 'st' / 'lib'), d=d, opt=opt, batch=batch,
                       nin=table['nin'])
    out = subprocess.run([MP, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    loaded = set(out.stdout.split('LOADED')[1].split())
    mods, natives = q8_modules(table, settings={'optimizer': opt, 'batch': batch})
    assert loaded & ON_USE == (mods | set(natives)) & ON_USE
    assert ('q8hold' in loaded) == (kind == 'branches')      # a chain walks layer to layer
    assert ('q8batch' in loaded) == (opt != 'sgd' or batch > 1)
    assert ('q8pool' in loaded) == (kind == 'pool')
    assert ('q8slope' in loaded) == ('q8nrm' in loaded) == (kind == 'prelu')


DROPS = """
import sys, json
sys.path.insert(0, {lib!r})
import utrain.wof
utrain.wof.hold(1000)          # (train.json's run.save_reserve on a littlefs board)
from utrain.q8train import Q8Trainer
tr = Q8Trainer({d!r} + '/q8.json', {d!r} + '/weights.wof')
print('LOADED', 'utrain.wof' in sys.modules or 'utrain.q8load' in sys.modules)
tr.net.step(bytearray({nin}), 1, 0.01)
tr.save_weights({d!r} + '/trained.wof')
tr.save_checkpoint({d!r} + '/c.ckpt')
print('SAVED', 'utrain.wof' in sys.modules)
tr.load_checkpoint({d!r} + '/c.ckpt')
print('RESUMED', 'utrain.wof' in sys.modules or 'utrain.ckread' in sys.modules)
import utrain.wof
print('RESERVE', utrain.wof.RES[0], len(utrain.wof.RES[1]))
"""


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_int8_run_drops_the_load_and_file_code_after_use(tmp_path):
    """Code the int8 run needs only for a moment leaves the heap after it: the net's load
    (utrain.q8load) once the net is built, and utrain.wof (3.9 KB resident on 32-bit),
    needed only for files, once weights.wof and q8.req are open; a save or a resume
    imports wof and drops it after, and the planner counts it among no trainer's
    modules.  The save's reserve (utrain.wof.hold) outlives the module."""
    d, table = _model(tmp_path, 'pool')
    runner.stage(str(tmp_path / 'st'))
    code = DROPS.format(lib=str(tmp_path / 'st' / 'lib'), d=d, nin=table['nin'])
    out = subprocess.run([MP, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    said = dict(line.split(' ', 1) for line in out.stdout.splitlines() if ' ' in line)
    assert said['LOADED'] == 'False'
    assert said['SAVED'] == 'False'
    assert said['RESUMED'] == 'False'
    assert said['RESERVE'] == '1000 1000'
    assert 'wof' not in q8_modules(table)[0]


PHASES = """
import sys, json, gc
sys.path.insert(0, {lib!r})
import utrain
seen = []
real = utrain.drop


def drop(name):
    if name == 'q8load':        # (the modules resident while the net loaded)
        seen.append(set(k[7:] for k in sys.modules if k.startswith('utrain.')))
    real(name)


utrain.drop = drop
from utrain.q8train import Q8Trainer
import utrain.q8 as q8
tr = Q8Trainer({d!r} + '/q8.json', {d!r} + '/weights.wof', **{s!r})
net = tr.net
if {s!r}.get('batch', 1) == 1:
    net.step(bytearray({nin}), 1, 0.01)
else:
    net.accum(bytearray({nin}), 1)
    net.apply(0.01, 1.0)
print('LOAD', ' '.join(sorted(seen[0])))
print('AFTER', ' '.join(sorted(set(k[7:] for k in sys.modules if k.startswith('utrain.')))))
print('KEPT', ' '.join(n for n in {names!r} if hasattr(q8, n)))
"""
# what only the load reads: utrain.q8load's, not utrain.q8's (resident through training)
LOAD_ONLY = ('trained_n', 'umn', 'held_bytes', 'held_at', 'cdn', 'lowest', 'grads', 'chain',
             'bufs', 'gwn', 'rowfed', 'dzn', 'bsn', 'gin', 'gtwo', 'bcast', 'UMAX')


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
@pytest.mark.parametrize('s', [{'optimizer': 'sgd', 'batch': 1, 'momentum': 0.9},
                               {'optimizer': 'adam', 'batch': 2}])
def test_int8_load_and_training_code_are_apart(tmp_path, s):
    """utrain.q8load (the net's load, with the table's sizes and a layer's set-up that only
    the load reads) is dropped before the code training keeps loads: the ranges that follow
    training (q8range), the growing weight scales (q8grow), momentum (q8mom) load after it,
    none while it is resident (the batch updates, q8batch, before it: the trainer's), and
    utrain.q8 holds none of the load's functions.  The planner prices the two phases apart
    (memory.q8_after_load: what loads after the load; its plan's code is the larger
    phase's): what the device loads after is among them, and nothing it loads before."""
    d, table = _model(tmp_path, 'pool')
    assert table.get('rr') and any(x.get('gw') for x in table['layers'])
    runner.stage(str(tmp_path / 'st'))
    code = PHASES.format(lib=str(tmp_path / 'st' / 'lib'), d=d, nin=table['nin'], names=LOAD_ONLY, s=s)
    out = subprocess.run([MP, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    said = dict((line + ' ').split(' ', 1) for line in out.stdout.splitlines())
    load, after = set(said['LOAD'].split()), set(said['AFTER'].split())
    assert 'q8load' in load and 'q8load' not in after
    assert {'q8range', 'q8grow'} <= after - load
    assert ('q8mom' in after - load) == bool(s.get('momentum'))
    assert ('q8batch' in load) == (s['optimizer'] == 'adam')
    assert said['KEPT'].split() == []
    from host_tools.plan.memory import Q8_SAVE, Q8_SETUP, plan_heap_q8, q8_after_load, q8_code, target
    late = set(q8_after_load(s))
    assert not load & late and after - load <= late
    assert not set(Q8_SETUP) & (load | after)   # (the set-up's: loaded after the load, dropped)
    t = target(None)
    both = q8_code(table, t, settings=s)
    plan = plan_heap_q8({'q8.json': table}, s)
    assert q8_code(table, t, settings=s, without=tuple(late) + Q8_SETUP) <= plan['parts']['code'] < both
    assert q8_code(table, t, settings=s, without=('q8load',)) < plan['parts']['code']
    assert not set(Q8_SAVE) & after     # (a save's code: loaded for it, dropped after)


def test_a_table_that_holds_every_weight_has_no_weight_scratch(tmp_path):
    """The weight scratch (q8.json 'wbuf', 4 KB at least) is read only by a layer whose
    weights stay in flash (a frozen one read a chunk at a time, a rank's frozen rows): a
    table whose every weighted layer trains or passes a gradient holds them all in RAM
    and gets none, planned without it; training it makes the bytes the scratch's table
    makes (CPython), and a table with a frozen layer keeps its scratch."""
    from host_tools.plan.memory import plan_heap_q8
    from utrain.q8 import Q8Net
    d, table = _model(tmp_path, 'pool')
    assert table['wbuf'] == 0 and all(x.get('train') or x.get('back') for x in table['layers'] if 'wt' in x)
    s = {'optimizer': 'sgd', 'batch': 1}
    with_scratch = dict(table, wbuf=4096)
    assert plan_heap_q8({'q8.json': with_scratch}, s)['total'] - plan_heap_q8({'q8.json': table}, s)['total'] >= 4096
    out = []
    for t in (table, with_scratch):
        net = Q8Net(json.loads(json.dumps(t)), os.path.join(d, 'weights.wof'))
        assert (net.wbuf is None) == (t is table)
        w0 = [bytes(L.w) + bytes(L.b) for L in net.layers if L.train]
        for i in range(3):
            net.step(bytearray((7 * i + j) & 255 for j in range(t['nin'])), i % 3, 0.05)
        out.append([bytes(L.w) + bytes(L.b) for L in net.layers if L.train])
        assert out[-1] != w0        # (the steps moved them)
        net.close()
    assert out[0] == out[1]
    path = build_pool(str(tmp_path / 'f.tflite'), 'MAX_POOL_2D')
    quant.write(quant.rewritten(read_model(path)), str(tmp_path / 'f'), 'last:1')
    with open(tmp_path / 'f' / 'q8.json') as f:
        assert json.load(f)['wbuf'] >= 4096      # (its frozen conv: read from flash)
