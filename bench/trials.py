"""--select auto's trials on the host simulation, the per-sample path against the host's
fast path, side by side in one run (issue 30).

    python bench/trials.py [--models tico-cnn,mbnet,imu] [--task new-classes] [--n 240]

The trials (host_tools/prepare/select.py) train utrain's device code under CPython + numpy.  On a
board the optimizer steps a weight a row at a time and pools and convolutions walk a row
and a tap at a time (temporaries one row long); the host's numpy backend now steps whole
arrays (xnp.ROWWISE) and takes every window of a max pool or convolution in one gather
(im2col, utrain/xnumpy.py), and trials that can run together do (host_tools/prepare/stacked.py:
a configuration's folds, and configurations that differ only in a layer's channel window,
trained side by side, one numpy call for all of them, the same bits as one by one);
host_tools.target.device.board_steps() puts the old path back (a trial at a time, a sample
at a time, a tap at a time).  For each of bench/transfer.py's
models (Adam lr 0.005, batch 1, its first task, n training samples, the budget of full
fine-tuning) one `prepare --select auto` runs with each path, trial cache empty, CPU
time measured (process_time: other processes on a busy machine stay out).  Columns:
  old s, new s   CPU seconds of the selection (every trial: screening and folds)
  trials         trials run (the same in both)
  old/new        the ratio
  same choice    the chosen configuration is the same
  max |d score|  the largest difference of a trial's score between the paths
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from host_tools.target.device import board_steps  # noqa: E402


def select_once(path, kw, budget):
    """(chosen ranks, {trial: score}, CPU seconds) of one --select auto, cache empty."""
    from host_tools.prepare.pipeline import prepare
    old = tempfile.tempdir
    tmp = tempfile.mkdtemp(prefix='utrain-bench-trials-')
    tempfile.tempdir = tmp          # a trial cache of its own (select.Trials)
    res = {}
    try:
        t = time.process_time()
        s = prepare(path, os.path.join(tmp, 'out'), select='auto', budget=budget,
                    log=lambda *a: None, **kw)
        dt = time.process_time() - t
        import glob
        import json
        for p in glob.glob(os.path.join(tmp, 'utrain-select-*', '*.json')):
            with open(p) as f:
                res.update(json.load(f))
    finally:
        tempfile.tempdir = old
        shutil.rmtree(tmp, ignore_errors=True)
    return s['select']['ranks'], res, dt


def main(argv=None):
    from bench import transfer as T
    from host_tools.prepare.pipeline import prepare
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--models', default=','.join(T.MODELS))
    ap.add_argument('--task', default='new-classes')
    ap.add_argument('--n', type=int, default=240, help='training samples of the task')
    a = ap.parse_args(argv)
    os.makedirs(T.TMP, exist_ok=True)
    print('| model | old s | new s | trials | old/new | same choice | max abs d score |')
    print('|---|---|---|---|---|---|---|')
    for m in a.models.split(','):
        path = T.MODELS[m][0]()
        data, split = T.MODELS[m][1](a.task, a.n)
        kw = dict(data=data, test_split=split, split_seed=0, epochs=T.EPOCHS, **T.SETTINGS)
        work = tempfile.mkdtemp(prefix='utrain-bench-trials-')
        try:
            full = prepare(path, os.path.join(work, 'full'), train='all', log=lambda *x: None,
                           **kw)['heap']['total']
        finally:
            shutil.rmtree(work, ignore_errors=True)
        with board_steps():
            r0, s0, t0 = select_once(path, kw, full)
        r1, s1, t1 = select_once(path, kw, full)
        d = max((abs(s0[k] - s1[k]) for k in s0 if k in s1), default=float('nan'))
        print(f'| {m} | {t0:.1f} | {t1:.1f} | {len(s0)}/{len(s1)} | {t0 / t1:.2f} | '
              f'{"yes" if r0 == r1 else "NO: %s vs %s" % (r0, r1)} | {d:.2g} |', flush=True)


if __name__ == '__main__':
    main()
