"""The bench runs end to end (quick mode) and prints its one table with every column and
every reference model; no timing is asserted (benchmarks are tables, not tests)."""
import json
import os
import subprocess
import sys

import pytest

from repo import ROOT  # noqa: E402

from host_tools.target.runner import find_micropython  # noqa: E402

pytestmark = pytest.mark.slow   # end to end throughout (tests/README.md)


def test_bench_quick_prints_the_table():
    p = subprocess.run([sys.executable, '-m', 'bench', '--quick'], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    from bench.__main__ import COLUMNS
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('|')]
    header = [c.strip() for c in lines[0].strip('|').split('|')]
    assert header == COLUMNS
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip('|').split('|')]
        assert len(cells) == len(COLUMNS)
        rows[(cells[0], cells[1])] = dict(zip(COLUMNS, cells))
    names = {m for m, _ in rows}
    assert {'sine MLP 1-16-16-1', 'digits MLP 64-32-10', 'digits CNN',
            'DS-CNN 49x10 KWS'} <= names
    full = rows[('digits MLP 64-32-10', 'full')]
    sparse = [r for (m, u), r in rows.items() if m == 'digits MLP 64-32-10' and u != 'full']
    assert sparse and sparse[0]['update'].startswith('sparse last:')
    # the MLP rows are measured by every engine the machine has (ratios are numbers)
    assert full['MACs'] == '5056'               # 3 x 64*32 + 2 x 32*10 (no dx of layer 0)
    for col in ('Py us', 'Py/dot', 'torch us', 'Py/torch', 'ONERT us', 'Py/ONERT'):
        float(full[col].rstrip('x'))
    if find_micropython():
        float(full['MP/loop'].rstrip('x'))
        float(full['MP/Py'].rstrip('x'))
    # models with ops utrain lacks say which op, the peers still run
    for (m, u), r in rows.items():
        if r['Py us'].startswith('n/a'):
            assert 'not supported' in r['Py us'] or 'not there' in r['MP us']


def test_planner_sweep_flags_a_cell_under_its_need(tmp_path):
    """bench/sweep.py: a cell's plan, need and ratio from a cached need; a need above the
    plan is flagged UNDER and named among the worst, one below plan / 1.2 OVER."""
    from bench.memory import code_key
    from host_tools.target import runner
    if not runner.find_micropython():
        pytest.skip('no MicroPython binary')
    cache = tmp_path / 'c.json'
    key = code_key()
    build = os.path.basename(runner.micropython_binary())
    cache.write_text(json.dumps({f'digits MLP|sgd b1|{build}|{key}|8': [10 ** 6, ''],
                                 f'digits MLP|adam b4|{build}|{key}|8': [1024, '']}))
    p = subprocess.run([sys.executable, 'bench/sweep.py', '--only', 'digits MLP', '--settings',
                        'sgd b1,adam b4', '--cache', str(cache)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != 'UTRAIN_MP32'})  # the build keyed above
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {ln.split('|')[2].strip(): ln for ln in p.stdout.splitlines() if ln.startswith('| digits')}
    assert rows['sgd b1'].rstrip(' |').endswith('UNDER') and rows['adam b4'].rstrip(' |').endswith('OVER')
    assert 'under: 1, over 1.2x: 1' in p.stdout and 'lowest' in p.stdout and '(digits MLP, sgd b1)' in p.stdout


def test_planner_sweep_runs_the_named_settings_only_when_asked(tmp_path):
    """bench/sweep.py --settings 'momentum b1,sgd b4,last:2 cache' (and 'b4 last:2 stream'): swept only when
    named (the default sweep keeps its six settings), each planned as prepare plans
    those options: momentum's velocities as optimizer state, batch 4's gradient sums,
    the board's own prefix cache's module."""
    p = subprocess.run([sys.executable, 'bench/sweep.py', '--only', 'digits MLP', '--list'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    names = [ln.split('|')[2].strip() for ln in p.stdout.splitlines() if ln.startswith('| digits')]
    assert names == ['sgd b1', 'adam b4', 'last:2 stream', 'last:2 cache-on-host', 'ranks 1:up',
                     'ranks 1:low']
    from bench.sweep import settings
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import prepare
    mlp = os.path.join(ROOT, 'datasets', 'digits', 'digits_mlp.circle')
    g = read_model(mlp)
    asked = dict(settings(g, ['sgd b1', 'momentum b1', 'sgd b4', 'last:2 cache']))
    assert set(asked) >= {'sgd b1', 'momentum b1', 'sgd b4', 'last:2 cache'} and 'last:2 bands 1' not in asked
    assert 'b4 last:2 stream' not in asked
    b4s = dict(settings(g, ['b4 last:2 stream']))['b4 last:2 stream']
    assert (b4s['batch'], b4s['train'], b4s['stream']) == (4, 'last:2', True)
    data = os.path.join(ROOT, 'datasets', 'digits', 'digits.npz')
    heap = {}
    for name in ('sgd b1', 'momentum b1', 'sgd b4', 'last:2 cache'):
        s = prepare(mlp, str(tmp_path / name.replace(' ', '_').replace(':', '')), data=data,
                    loss='scce', epochs=1, log=lambda *m: None, **asked[name])
        heap[name] = s['heap']['parts']
    assert heap['sgd b1']['optimizer state'] == 0 < heap['momentum b1']['optimizer state']
    assert heap['sgd b1']['gradient sums'] == 0 < heap['sgd b4']['gradient sums']
    with open(tmp_path / 'last2_cache' / 'train.json') as f:
        assert json.load(f)['run'].get('cache') is True
    assert heap['momentum b1']['optimizer state'] == heap['momentum b1']['trainable weights']


def test_planner_sweep_plans_the_pico_column_for_rp2040(tmp_path):
    """bench/sweep.py --pico: the plan is prepare --board rp2040's for the cell's settings
    (float, not streamed by the profile: npkern's armv6m code in the heap, 32-bit words),
    keyed by the firmware; a cached need gives the ratio without booting the emulator."""
    import json
    import numpy as np
    from bench.memory import code_key
    from host_tools.prepare.pipeline import prepare
    fw = tmp_path / 'RPI_PICO-test.uf2'         # (only its name is used: the need is cached)
    fw.write_bytes(b'')
    mlp = os.path.join(ROOT, 'datasets', 'digits', 'digits_mlp.circle')
    rng = np.random.default_rng(0)
    data = tmp_path / 'd.npz'
    np.savez(data, x=rng.standard_normal((3, 64)).astype(np.float32), y=rng.integers(0, 10, 3))
    want = {}
    for board in ('rp2040', None):
        s = prepare(mlp, str(tmp_path / f'r{board}'), data=str(data), loss='scce',
                    from_logits=True, lr=0.01, epochs=1, log=lambda *m: None,
                    optimizer='sgd', batch=1, train='all',
                    **(dict(board=board, stream=False, int8=False) if board else {}))
        want[board] = s['heap']['total']
    cache = tmp_path / 'c.json'
    cache.write_text(json.dumps({f'digits MLP|sgd b1|{fw.name}|{code_key()}|3': [
        want['rp2040'] - 2048, '', []]}))
    p = subprocess.run([sys.executable, 'bench/sweep.py', '--pico', '--only', 'digits MLP',
                        '--settings', 'sgd b1', '--samples', '3', '--cache', str(cache)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, UTRAIN_PICO_FIRMWARE=str(fw)))
    assert p.returncode == 0, p.stdout + p.stderr
    plan = int(p.stderr.split('digits MLP | sgd b1 | ')[1].split(' |')[0])
    assert plan == want['rp2040'] != want[None]
    assert 'planned for --board rp2040' in p.stdout and f'{(want["rp2040"] - 2048) / 1024:.0f} |' in p.stdout


def test_sturdy_need_is_above_every_heap_that_fails():
    """bench/sweep.py --sturdy: from a bisected need, every step up to the plan is run and
    a heap that fails moves the need past it (fragmentation: the zoo imu net trained at 126
    and 129.6 KB and failed at 128 KB on 32-bit ulab); a need that holds stays."""
    from bench.sweep import sturdy
    ran = []

    def trains(out, heap):                  # trains from 100 on, except at 106 and 107
        ran.append(heap)
        return heap >= 100 and heap not in (106, 107)
    assert sturdy(None, 100, 112, 1, trains) == 108
    assert ran == list(range(101, 113))
    assert sturdy(None, 100, 105, 1, trains) == 100
    assert sturdy(None, 100, 106, 1, trains) == 107     # past the plan: an under-plan
