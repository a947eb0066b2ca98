"""python -m bench [--quick] [--budget S]: time per training sample (batch 1, SGD) of the
reference models, full and sparse update, under every engine, as one table of ratios
measured side by side in the same run.

Columns (us = microseconds per training sample):
  MACs        multiply-adds of one training step (forward + backward, from the graph)
  MP us       unix MicroPython, utrain with the pure-MicroPython fallback (.mpy)
  MP/loop     that over a bare MicroPython loop doing the same multiply-adds (a*b summed
              over array('f'), dot products as long as the layer's), same process
  ulab us     the same with real ulab, when a ulab build is found ($UTRAIN_BENCH_ULAB,
              else $UTRAIN_MP_ULAB: a unix MicroPython built with ulab)
  ulab/dot    that over bare ulab.numpy.dot calls on the same GEMM sizes (as Py/dot),
              alternated in the same process: the ulab path against its own limit
  ulab32 us, ulab32/dot  the same under a 32-bit ulab build ($UTRAIN_MP32_ULAB)
  Pico Mcyc   RP2040 cycles (millions) per training step on the emulated Raspberry Pi
              Pico (the real MicroPython rp2 firmware in rp2040js, host_tools/boards/pico.py;
              with --pico), ms at 125 MHz = Mcyc x 8; Pico/loop: that over the bare loop
              on the chip; Pico-ulab Mcyc, Pico-ulab/dot: the firmware with ulab, against
              bare ulab dot.  A step estimated above --pico-max G cycles is not run.
  Py us       CPython + numpy running the same micro/ code
  Py/dot      that over bare np.dot calls on the same GEMM sizes, same process
  torch us    PyTorch eager, same graph and weights, SGD step per sample, 1 thread
  Py/torch    Py us over torch us;  ONERT us, Py/ONERT: ONERT training, same file
Frozen convs run whole (prepare --bands 0): row bands trade time for memory, 1.5x on
the fallback and up to 6x under ulab (python bench/zoo/mobilenet.py --whole prints it).
The in-process engines (Py, np.dot, torch, ONERT) run in many short alternating rounds;
MicroPython alternates with its bare loop inside its own process.  Times are CPU time
(process_time: medians of the rounds; /proc/self/schedstat under MicroPython, tick-
granular, so summed over the rounds), so other processes on a busy machine stay out.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, 'micro')):
    if p not in sys.path:
        sys.path.insert(0, p)
os.environ.pop('UTRAIN_NP', None)           # the in-process utrain runs on numpy float32

from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from bench import models, peers  # noqa: E402

ULAB_DEFAULT = '/work/scratch/ulab/micropython'
COLUMNS = ['model', 'update', 'MACs', 'MP us', 'MP/loop', 'ulab us', 'ulab/dot', 'ulab32 us',
           'ulab32/dot', 'Pico Mcyc', 'Pico/loop', 'Pico-ulab Mcyc', 'Pico-ulab/dot',
           'Py us', 'Py/dot',
           'torch us', 'Py/torch', 'ONERT us', 'Py/ONERT', 'MP/Py']


def ulab_binary(bits=64):
    """A unix MicroPython with ulab (64-bit: $UTRAIN_BENCH_ULAB, $UTRAIN_MP_ULAB or the
    default build; 32-bit: $UTRAIN_MP32_ULAB), or None."""
    if bits == 32:
        names = [os.environ.get('UTRAIN_MP32_ULAB')]
    else:
        names = [os.environ.get('UTRAIN_BENCH_ULAB'), os.environ.get('UTRAIN_MP_ULAB'), ULAB_DEFAULT]
    for p in names:
        if p and os.access(p, os.X_OK):
            return p
    return None


def ulab_columns(row, out, cfg, a, bits, heap=None):
    """row['ulab us'], row['ulab/dot'] (or 'ulab32 ...'): step.py under a ulab build,
    the step against bare ulab dot on the same GEMM sizes in the same process."""
    c = 'ulab' if bits == 64 else 'ulab32'
    ub = ulab_binary(bits) if not a.no_ulab else None
    if not ub:
        row[c + ' us'] = row[c + '/dot'] = 'n/a (no ulab build)'
        return
    try:
        row[c + ' us'], row[c + '/dot'] = micropython_step(out, cfg, ub, heap=heap)
    except Exception as e:      # noqa: BLE001  (a row says why, the table goes on)
        row[c + ' us'] = row[c + '/dot'] = 'n/a (' + err(e) + ')'


def micropython_step(out, cfg, binary=None, heap=None):
    """(step us, step / bare loop) of step.py under unix MicroPython in folder out
    (heap: -X heapsize, instead of the unix profile's)."""
    with open(os.path.join(out, 'bench.json'), 'w') as f:
        json.dump(cfg, f)
    shutil.copy(os.path.join(ROOT, 'bench', 'step.py'), out)
    argv, env = runner.command(out)
    argv[-1] = 'step.py'
    if binary:
        argv[0] = binary
    if heap:
        argv[argv.index('-X') + 1] = 'heapsize=' + heap
    r = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith('RESULT')]
    if r.returncode or not line:
        err = (r.stdout + r.stderr).strip().splitlines()
        raise RuntimeError(err[-1] if err else f'exit {r.returncode}')
    _, s, l, ratio, _ = line[0].split()
    return float(s), float(ratio)


# RP2040 cycles per multiply-add of a training step, measured on the emulated Pico (the
# digits MLP: 27 M cycles for 7.2 K on stock firmware, 4.8 M with ulab), only to skip
# steps that would take the emulator too long
PICO_CYC_PER_MAC = {False: 4000, True: 700}


def pico_columns(row, out, cfg, a):
    """row['Pico Mcyc'], row['Pico/loop'] and the ulab firmware's: step.py on the
    emulated Pico (one warm-up step, one timed step, the bare loop once), device time
    (the emulated clock) x 125 MHz."""
    from host_tools.boards import pico
    for ulab, c, lim in ((False, 'Pico', 'Pico/loop'), (True, 'Pico-ulab', 'Pico-ulab/dot')):
        if not a.pico or not pico.available(ulab):
            row[c + ' Mcyc'] = row[lim] = 'n/a (no firmware)' if a.pico else 'n/a'
            continue
        est = row['MACs'] * PICO_CYC_PER_MAC[ulab] / 1e9
        if est > a.pico_max:
            row[c + ' Mcyc'] = row[lim] = f'n/a (~{est:.0f} G cycles)'
            continue
        with open(os.path.join(out, 'bench.json'), 'w') as f:
            json.dump(dict(cfg, rounds=1, budget_us=0, round_us=0, max_samples=2), f)
        shutil.copy(os.path.join(ROOT, 'bench', 'step.py'), out)
        try:
            code, text = pico.run_folder(out, ulab=ulab, stream=False, script='step.py')
            line = [x for x in text.splitlines() if x.startswith('RESULT')]
            if code or not line:
                raise RuntimeError(text.strip().splitlines()[-1] if text.strip() else 'no output')
            _, s, l, ratio, _ = line[0].split()
            row[c + ' Mcyc'], row[lim] = float(s) * pico.MHZ / 1e6, float(ratio)
        except Exception as e:      # noqa: BLE001  (a row says why, the table goes on)
            row[c + ' Mcyc'] = row[lim] = 'n/a (' + err(e) + ')'


def side_by_side(fns, budget_s, rounds, round_s=0.02):
    """Callables f(n, j) (n units each) run in many short alternating rounds so that all
    see the same machine: ({name: CPU us per unit, the median round}, ratio(a, b): the
    median over rounds of a's time over b's)."""
    import time
    clock = time.process_time           # CPU time: blind to other processes' load
    counts, cost = {}, 0.0
    for name, f in fns.items():
        t = time.perf_counter()
        f(1, 0)
        one = max(time.perf_counter() - t, 1e-6)
        counts[name] = max(1, min(2000, int(round_s / one)))
        cost += counts[name] * one
    rounds = max(rounds, min(500, int(budget_s / max(cost, 1e-6))))
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name, f in fns.items():
            n = counts[name]
            t = clock()
            f(n, 1 + r * n)
            times[name].append((clock() - t) * 1e6 / n)
    med = lambda v: sorted(v)[len(v) // 2]
    return ({name: med(v) for name, v in times.items()},
            lambda a, b: med([x / max(y, 1e-9) for x, y in zip(times[a], times[b])]))


def err(e):
    s = str(e).strip().splitlines()
    s = s[-1] if s else type(e).__name__
    return s if len(s) < 60 else s[:57] + '...'


def measure(name, path, setting, tmp, a):
    """One table row: {column: number or 'n/a (...)'}."""
    row = {'model': name, 'update': 'full' if setting == 'all' else 'sparse ' + setting}
    g = read_model(path)
    x, y = models.data(g, path, a.samples)
    classifier = models.is_classifier(g)
    w = models.work(g, setting)
    row['MACs'] = w['macs']
    cfg = {'rounds': a.rounds, 'budget_us': int(a.budget * 1e6), 'round_us': 20000,
           'max_steps': a.max_steps,
           'gemms': w['gemms'], 'loops': w['loops']}
    fns = {}
    missing = models.unsupported(g)
    out = os.path.join(tmp, f'{len(os.listdir(tmp))}')
    if missing:
        why = f'n/a (op {missing} not supported)'
        for c in ('MP us', 'MP/loop', 'ulab us', 'ulab/dot', 'ulab32 us', 'ulab32/dot', 'Py us', 'Py/dot'):
            row[c] = why
    else:
        npz = os.path.join(tmp, 'data.npz')
        np.savez(npz, x=x, y=y)
        prepare(path, out, data=npz, loss='scce' if classifier else 'mse', optimizer='sgd',
                lr=0.01, batch=1, epochs=1, train=setting, bands=0)
        try:
            row['MP us'], row['MP/loop'] = micropython_step(out, cfg)
        except Exception as e:          # noqa: BLE001  (a row says why, the table goes on)
            row['MP us'] = row['MP/loop'] = 'n/a (' + err(e) + ')'
        ulab_columns(row, out, cfg, a, 64)
        ulab_columns(row, out, cfg, a, 32)
        pico_columns(row, out, cfg, a)
        from bench import step
        fns['Py'], fns['dot'] = step.setup(out, cfg)
    try:
        fns['torch'] = peers.torch_trainer(g, setting, x, y, classifier)
    except Exception as e:              # noqa: BLE001
        row['torch us'] = 'n/a (' + err(e) + ')'
    try:
        n_ops = -1 if setting == 'all' else int(setting.split(':')[1])
        fns['onert'] = peers.onert_trainer(path, g, n_ops, x, y, classifier)
    except Exception as e:              # noqa: BLE001
        row['ONERT us'] = 'n/a (' + err(e) + ')'
    best, ratio = side_by_side(fns, a.budget, a.rounds)
    if 'Py' in best:
        row['Py us'], row['Py/dot'] = best['Py'], ratio('Py', 'dot')
        if isinstance(row.get('MP us'), float):
            row['MP/Py'] = row['MP us'] / best['Py']
    for k, c in (('torch', 'torch us'), ('onert', 'ONERT us')):
        if k in best:
            row[c] = best[k]
            if 'Py' in best:
                row['Py/' + ('torch' if k == 'torch' else 'ONERT')] = ratio('Py', k)
    for c in COLUMNS:
        row.setdefault(c, 'n/a')
    return row


def fmt(v, col):
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    if '/' in col:
        return f'{v:.2f}x'
    return f'{v:.1f}' if v < 1000 else f'{v:.0f}'


def table(rows, columns=COLUMNS):
    """A markdown table of rows ({column: value}; a missing cell is 'n/a')."""
    cells = [[fmt(r.get(c, 'n/a'), c) for c in columns] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(columns)]
    line = lambda xs: '| ' + ' | '.join(x.ljust(width[i]) for i, x in enumerate(xs)) + ' |'  # noqa: E731
    out = [line(columns), '|' + '|'.join('-' * (w + 2) for w in width) + '|']
    out += [line(x) for x in cells]
    return '\n'.join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench', description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--quick', action='store_true', help='CI smoke run: tiny budgets')
    ap.add_argument('--budget', type=float, default=1.5,
                    help='CPU seconds per engine and row (default 1.5)')
    ap.add_argument('--rounds', type=int, default=3, help='at least this many rounds')
    ap.add_argument('--samples', type=int, default=64, help='distinct samples cycled')
    ap.add_argument('--max-steps', type=int, default=2000)
    ap.add_argument('--no-ulab', action='store_true', help='skip the real-ulab column')
    ap.add_argument('--only', help='models whose name contains this')
    ap.add_argument('--pico', action='store_true', help='the emulated Pico columns (needs '
                    '$UTRAIN_PICO_FIRMWARE, and $UTRAIN_PICO_ULAB_FIRMWARE for ulab)')
    ap.add_argument('--pico-max', type=float, default=1.5,
                    help='G cycles: emulate no step estimated above this (default 1.5)')
    a = ap.parse_args(argv)
    if a.quick:
        a.budget, a.rounds, a.samples, a.max_steps = 0.05, 1, 8, 2
    tmp = tempfile.mkdtemp(prefix='utrain_bench_')
    rows = []
    try:
        for name, path, why in models.reference_models(tmp):
            if a.only and a.only.lower() not in name.lower():
                continue
            if path is None:
                row = dict({c: '-' for c in COLUMNS}, model=name)
                row['MP us'] = f'n/a ({why})'
                rows.append(row)
                continue
            g = read_model(path)
            for setting in ('all', models.sparse_setting(g)):
                rows.append(measure(name, path, setting, tmp, a))
                print(f'  measured {name}, {rows[-1]["update"]}', file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import torch
    print(f'time per training sample, batch 1, SGD; torch {torch.__version__} with '
          f'{torch.get_num_threads()} thread; MicroPython {runner.micropython_binary()}')
    print(table(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
