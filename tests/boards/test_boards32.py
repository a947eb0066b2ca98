"""Issue 14 on 32-bit builds (../shared/board-sim.md; built outside this repository, each
named by an environment variable, skipped without it):

  UTRAIN_MP32, UTRAIN_MP32_ULAB  32-bit unix MicroPython without / with ulab
  UTRAIN_M0, UTRAIN_M0_ULAB      the emulated Cortex-M0 board's firmware (qemu .elf)

The planner is held to the smallest heap that trains on each (trains at its figure, not
at figure / 1.3); on the emulated Cortex-M0 the digits MLP prepared with --board rp2040
trains through deploy, `mpremote run train.py` and pull at the planned heap, and a run
that runs out of memory there makes deploy --run fail with utrain's message."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

import m0board  # noqa: E402
import q8cases  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.plan.memory import trains_in  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.formats.refmodels import small_cnn  # noqa: E402

pytestmark = pytest.mark.slow   # end to end throughout (tests/README.md)

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
MLP = os.path.join(DIGITS, 'digits_mlp.circle')


def build(var):
    path = os.environ.get(var)
    return path if path and os.path.exists(path) else None


def needs(var):
    return pytest.mark.skipif(not build(var), reason=f'${var} names no build')


def needs_m0(var):
    return pytest.mark.skipif(not (build(var) and m0board.qemu()),
                              reason=f'${var} names no firmware, or no qemu-system-arm')


@pytest.fixture
def digits16(tmp_path):
    with np.load(os.path.join(DIGITS, 'digits.npz')) as z:
        path = str(tmp_path / 'd16.npz')
        np.savez(path, x=z['x'][:16], y=z['y'][:16])
    return path


@pytest.fixture
def use(monkeypatch):
    """Run the simulated board on the given MicroPython build."""
    def use(var):
        monkeypatch.setenv('MICROPYTHON', build(var))
        return build(var)
    return use


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, '-m', 'host_tools', *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


CASES = {
    'mlp-adam-b4': (MLP, dict(optimizer='adam', batch=4)),
    'mlp-sgd-b1-ranked': (MLP, dict(optimizer='sgd', batch=1, ranks='0:bias,1:1/2')),
    'cnn-sgd-b1': (os.path.join(DIGITS, 'digits_cnn.circle'), dict(optimizer='sgd', batch=1)),
}


@pytest.mark.parametrize('var,backend', [pytest.param('UTRAIN_MP32', 'fallback', marks=needs('UTRAIN_MP32')),
                                         pytest.param('UTRAIN_MP32_ULAB', 'ulab',
                                                      marks=needs('UTRAIN_MP32_ULAB'))])
@pytest.mark.parametrize('case', list(CASES))
def test_planner_bounds_the_smallest_heap_on_32bit_unix(tmp_path, digits16, use, var, backend, case):
    use(var)
    model, kw = CASES[case]
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=digits16, loss='scce', lr=0.01, epochs=1, backend=backend, **kw)
    assert 'unix 32-bit' in s['heap']['target'], s['heap']['target']
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'{case}: does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), f'{case}: trains in plan / 1.3 = {int(plan / 1.3)} B'


@needs('UTRAIN_MP32')
@pytest.mark.parametrize('case', list(q8cases.CASES))
def test_int8_planner_bounds_the_smallest_heap_on_32bit_unix(tmp_path, use, case):
    """An int8 model trained as int8 on a 32-bit build: trains in the plan, not in
    plan / 1.3."""
    use('UTRAIN_MP32')
    out, s = q8cases.prepared(prepare, case, tmp_path)
    assert 'unix 32-bit' in s['heap']['target'], s['heap']['target']
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'{case}: does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), f'{case}: trains in plan / 1.3 = {int(plan / 1.3)} B'


@needs('UTRAIN_MP32_ULAB')
def test_small_cnn_trains_in_every_heap_from_its_need_to_the_plan_on_32bit_ulab(tmp_path, use):
    """The held-out target: a 16x16x1 CNN (3x3x8 SAME conv, 2x2 pool, FC; 2,645
    parameters) on 32-bit ulab.  Its step's 8 KB arrays make fragmentation decide where
    it fits: collected only when the heap was full it trained in 110 KB but not in
    111-121 KB; collected every 1/32 of the heap it was given, the collections moved with
    the heap and it trained in 96 and 102 KB but not in 98 or 100 (the folder's path
    length decided 96).  Collected every so many bytes, the same in any heap (1/32 of the
    plan until session 29, the model's since, with collections at op boundaries too),
    its smallest heap is an edge: a scan of heaps 2 KB apart from the plan down to plan
    / 1.3 trains in every heap from the edge up and in none below it, and the plan is at
    most 1.2x the edge."""
    use('UTRAIN_MP32_ULAB')
    model = small_cnn(str(tmp_path / 'cnn.circle'))
    rng = np.random.default_rng(0)
    np.savez(str(tmp_path / 'img.npz'), x=rng.normal(size=(24, 16, 16, 1)).astype(np.float32),
             y=np.arange(24) % 5)
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=str(tmp_path / 'img.npz'), loss='scce', optimizer='sgd', batch=1,
                lr=0.01, epochs=1, backend='ulab')
    assert s['trainable_params'] == 2645 and s['frozen_params'] == 0
    plan = s['heap']['total']
    with open(os.path.join(out, 'train.json')) as f:
        # bytes, the model's (memory.gc_bytes: at least 4 KB)
        assert json.load(f)['run']['gc_every'] == 4096
    runner.stage(out)
    scan = []
    heap = plan
    while heap > plan / 1.3:
        scan.append((heap, trains_in(out, heap)))
        heap -= 2048
    shown = ' '.join('%.1f%s' % (h / 1024, '' if ok else 'x') for h, ok in scan)
    assert scan[0][1], f'does not train in its plan: {shown}'
    edge = scan[[ok for _, ok in scan].index(False) - 1][0] if not all(ok for _, ok in scan) else scan[-1][0]
    assert not any(ok for h, ok in scan if h < edge), f'trains below a heap that fails (KB): {shown}'
    assert plan <= 1.2 * edge, f'plan {plan} B over 1.2x the smallest heap {edge} B: {shown}'


@pytest.mark.parametrize('var,backend', [pytest.param('UTRAIN_M0', 'fallback', marks=needs_m0('UTRAIN_M0')),
                                         pytest.param('UTRAIN_M0_ULAB', 'ulab', marks=needs_m0('UTRAIN_M0_ULAB'))])
def test_m0_trains_at_the_heap_prepare_planned_for_rp2040(tmp_path, digits16, var, backend):
    """The README's board commands on the emulated Cortex-M0 (RP2040's CPU): prepare
    --board rp2040 (adam, batch 4), deploy, mpremote run train.py, pull, at the planned
    heap; at plan / 1.3 deploy --run fails with utrain's out-of-memory message."""
    elf = build(var)
    out = str(tmp_path / 'run')
    r = cli('prepare', MLP, '-o', out, '--data', digits16, '--board', 'rp2040', '--backend', backend,
            '--loss', 'scce', '--optimizer', 'adam', '--lr', '0.01', '--epochs', '1',
            '--float32')                    # (the float run: fallback would train int8)
    assert r.returncode == 0, r.stderr
    assert 'for rp2040: 32-bit' in r.stdout, r.stdout
    with open(os.path.join(out, 'prepare.json')) as f:
        plan = json.load(f)['heap']['total']
    with m0board.M0Board(elf, plan) as b:
        r = cli('deploy', out, '--port', b.port, '--board', 'rp2040')
        assert r.returncode == 0, r.stdout + r.stderr
        r = m0board.mpremote(b.port, 'run', 'train.py', cwd=out)
        assert r.returncode == 0 and r.stdout.rstrip().endswith('utrain: end: ok'), r.stdout + r.stderr
        r = cli('pull', out, '--port', b.port)
        assert r.returncode == 0, r.stdout + r.stderr
    assert open(os.path.join(out, 'trained.wof'), 'rb').read() != open(os.path.join(out, 'weights.wof'), 'rb').read()
    with m0board.M0Board(elf, int(plan / 1.3)) as b:
        r = cli('deploy', out, '--port', b.port, '--run')
        assert r.returncode == 2, r.stdout + r.stderr
        assert 'utrain: out of memory' in r.stdout and 'training failed: out of memory' in r.stderr, \
            r.stdout + r.stderr


@needs('UTRAIN_MP32')
def test_int8_prefix_cache_made_and_trained_in_one_run_at_the_plan(tmp_path, use):
    """prepare --cache on an int8 model: the board's first run computes the frozen prefix
    into the cache and trains in the same run, at the planned heap; the pass leaves
    nothing behind (training has the free heap a second run, from the cache, has: a
    prefix net whose buffers stayed referenced fails this); and a heap too small for the
    pass says so on the end line (not 'loading the model')."""
    use('UTRAIN_MP32')
    out, s = q8cases.prepared(prepare, 'dscnn-last2-cache', tmp_path)
    plan = s['heap']['total']
    argv, env = runner.command(out)

    def run(heap):
        argv[argv.index('-X') + 1] = 'heapsize=%d' % heap
        p = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=300)
        free = [int(v) for v in re.findall(r'free heap (\d+)', p.stdout)]
        return p.stdout.strip().splitlines()[-1], free

    def caches():
        return sorted(f for f in os.listdir(out) if f.endswith('.q8.pfx'))

    assert not caches()
    end, first = run(plan)
    assert end == 'utrain: end: ok' and caches() == ['test.ds.q8.pfx', 'train.ds.q8.pfx'], end
    end, second = run(plan)
    assert end == 'utrain: end: ok', end
    assert abs(first[0] - second[0]) <= 256, (first, second)
    for f in caches():
        os.remove(os.path.join(out, f))
    end, _ = run(plan * 3 // 4)
    assert end == 'utrain: end: out of memory in the frozen prefix pass', end


@needs('UTRAIN_MP32')
@pytest.mark.parametrize('opt,batch', [('sgd', 1), ('adam', 4)])
def test_int8_planner_bounds_a_wide_graph_on_32bit_unix(tmp_path, use, opt, batch):
    """An int8 graph of many small trained layers (as a held-out Keras MLP: 6 bias-less
    branches ADDed, 20 heads concatenated, 27 trained FCs; planned 0.89x its need before
    the per-trained-layer fragmentation allowance): trains in the plan on a 32-bit build,
    not in plan / 1.3."""
    from kerasgraphs import build_int8_branches
    use('UTRAIN_MP32')
    path, _, _ = build_int8_branches(tmp_path / 'w.tflite', n=6, heads=20)
    r = np.random.default_rng(0)
    np.savez(tmp_path / 'd.npz', x=r.uniform(-4, 4, (24, 5)).astype(np.float32),
             y=r.integers(0, 3, 24))
    out = str(tmp_path / 'o')
    s = prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer=opt, batch=batch,
                lr=0.01, epochs=1, train='all', log=lambda *a: None)
    assert 'unix 32-bit' in s['heap']['target'] and s['trainable_params'] > 200
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), f'trains in plan / 1.3 = {int(plan / 1.3)} B'
