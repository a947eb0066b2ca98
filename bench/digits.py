"""The digits example side by side: time per training sample under unix MicroPython
(utrain's fallback, or ulab if $MICROPYTHON has it) and under CPython + numpy, measured
in the same run, and the smallest heap (-X heapsize, found by bisection) in which the
MicroPython run still trains.

    python bench/digits.py [--samples 400] [--epochs 1] [--model mlp|cnn]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402


def ms_per_sample(out, python):
    code, text = runner.run(out, python=python, stream=False)
    if code:
        raise SystemExit(text)
    rows = [line.split(',') for line in open(os.path.join(out, 'train.log'))][1:]
    rows = [r for r in rows if int(r[0]) > 0]          # epoch 0 is the evaluation
    return sum(float(r[5]) for r in rows) / len(rows), text


def trains_in(out, heap):
    argv, env = runner.command(out)
    argv[argv.index('-X') + 1] = 'heapsize=%d' % heap
    r = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True)
    return r.returncode == 0


def smallest_heap(out, lo=16 * 1024, hi=1024 * 1024, step=1024):
    if not trains_in(out, hi):
        return None
    while hi - lo > step:
        mid = (lo + hi) // 2
        if trains_in(out, mid):
            hi = mid
        else:
            lo = mid
    return hi


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--samples', type=int, default=400)
    ap.add_argument('--epochs', type=int, default=1)
    ap.add_argument('--model', choices=('mlp', 'cnn'), default='mlp')
    a = ap.parse_args()
    z = np.load(os.path.join(ROOT, 'datasets', 'digits', 'digits.npz'))
    tmp = tempfile.mkdtemp()
    data = os.path.join(tmp, 'd.npz')
    np.savez(data, x=z['x'][:a.samples], y=z['y'][:a.samples])
    model = os.path.join(ROOT, 'datasets', 'digits', f'digits_{a.model}.circle')
    rows = []
    for opt in ('sgd', 'adam'):
        out = os.path.join(tmp, opt)
        prepare(model, out, data=data, loss='scce', optimizer=opt, lr=0.01, batch=4,
                epochs=a.epochs)
        shutil.copytree(out, out + '_py')
        mp_ms, _ = ms_per_sample(out, False)
        py_ms, _ = ms_per_sample(out + '_py', True)
        heap = smallest_heap(out)
        rows.append((opt, mp_ms / a.samples, py_ms / a.samples, heap))
    mp = runner.micropython_binary()
    backend = 'ulab' if subprocess.run([mp, '-c', 'import ulab'], capture_output=True).returncode == 0 else 'fallback'
    title = 'MLP 64-32-10' if a.model == 'mlp' else 'CNN conv-pool-dwconv-pool-fc'
    print(f'digits {title}, {a.samples} samples, batch 4, MicroPython backend: {backend}')
    print(f'{"optimizer":10s} {"MicroPython ms/sample":>22s} {"CPython ms/sample":>18s} {"ratio":>7s} {"smallest heap":>14s}')
    for opt, m, p, h in rows:
        print(f'{opt:10s} {m:22.3f} {p:18.4f} {m / p:7.1f} {str(h // 1024) + " KB" if h else "-":>14s}')
    shutil.rmtree(tmp)


if __name__ == '__main__':
    main()
