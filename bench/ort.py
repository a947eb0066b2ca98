"""utrain against ONNX Runtime on-device training, side by side: the same .onnx model
(PyTorch, exported), the same initial weights, the same train/test split and sample
order, plain SGD with mean cross-entropy on logits, batch 1 and 4.

    python bench/ort.py [--samples 400] [--epochs 5] [--lr 0.1] [--models mlp,cnn,imu]
                        [--ort-python /work/scratch/ort-venv/bin/python]

(the digits data for mlp and cnn, synthetic IMU windows for imu).

ONNX Runtime's training wheel (onnxruntime-training 1.19.2, the last one; its Python API
imports torch; its artifact generation needs onnx < 1.18) is not a project requirement:
it lives in its own environment ($UTRAIN_ORT_PYTHON or --ort-python; the table says
"skipped" without it).  bench/ort_worker.py runs there.

Printed per model and batch, one row per engine (a markdown table): the train loss of
each epoch (mean over samples), the last epoch's test accuracy, the time per training
sample (ms; utrain's from its epoch lines, an epoch's time over its samples; ORT's over
its train steps), the process's peak RSS (MB, VmHWM; unix MicroPython's heap is the
unix profile's -X heapsize), the time over ORT's, and the largest difference of an
epoch's loss from ORT's (the trajectories agree when it is ~1e-6).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from host_tools.target import runner  # noqa: E402
from host_tools.files.dataset import read_dataset  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

DEFAULT_ORT = '/work/scratch/ort-venv/bin/python'


def models(folder):
    """{name: (onnx path, input shape)}: a digits MLP 64-32-10, a digits CNN (conv-ReLU-
    pool-conv-ReLU, global average pool, Linear) and the zoo's IMU conv net (three 1xk
    conv-BN-ReLU blocks, 6x128 windows, 6 activities; BatchNorm folded by the eval-mode
    export), seeded, exported with a dynamic batch."""
    import torch
    nn = torch.nn
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    cnn = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(16, 10))
    from bench.zoo import nets
    imu, imu_shape, _ = nets.build('imu')     # BatchNorm folded into the convs by the export
    out = {}
    for name, m, shape in (('mlp', mlp, (64,)), ('cnn', cnn, (1, 8, 8)),
                           ('imu', imu, tuple(imu_shape[1:]))):
        path = os.path.join(folder, name + '.onnx')
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            torch.onnx.export(m.eval(), (torch.zeros((1,) + shape),), path, opset_version=17,
                              dynamo=False, input_names=['x'], output_names=['y'],
                              dynamic_axes={'x': {0: 'n'}, 'y': {0: 'n'}})
        out[name] = (path, shape)
    return out


def peak_run(argv, cwd=None, env=None):
    """Run argv; (exit code, output, its peak RSS in KB).  The peak is VmHWM of the
    process after its exec, read every 20 ms (getrusage's maxrss would count the pages
    the child shared with this process before its exec)."""
    import threading
    import time
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()))
    reader.start()
    peak = 0
    while p.poll() is None:
        try:
            with open(f'/proc/{p.pid}/status') as f:
                for line in f:
                    if line.startswith('VmHWM:'):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.02)
    reader.join()
    return p.returncode, out[0], peak


def utrain(run_dir, python):
    argv, env = runner.command(run_dir, python=python)
    code, text, rss = peak_run(argv, run_dir, env)
    if code:
        raise SystemExit(text)
    rows = [r.strip().split(',') for r in open(os.path.join(run_dir, 'train.log'))][1:]
    rows = [r for r in rows if int(r[0]) > 0]
    per = [float(v) for v in re.findall(r'\(([0-9.]+) ms/sample', text)]   # the epoch lines
    return {'loss': [float(r[1]) for r in rows], 'acc': [float(r[4]) for r in rows],
            'ms': sum(per) / len(per), 'rss_kb': rss}


def ort_train(ort_python, path, split, batch, epochs, lr, folder):
    os.makedirs(folder, exist_ok=True)
    args = os.path.join(folder, 'ort_args.json')
    json.dump({'model': path, 'data': split, 'out': os.path.join(folder, 'ort'),
               'batch': batch, 'epochs': epochs, 'lr': lr}, open(args, 'w'))
    code, text, rss = peak_run([ort_python, os.path.join(ROOT, 'bench', 'ort_worker.py'), args])
    if code:
        raise SystemExit('ORT worker failed:\n' + text)
    res = json.loads(text.strip().splitlines()[-1])
    res['rss_kb'] = rss
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--samples', type=int, default=400, help='digits samples (train + test)')
    ap.add_argument('--epochs', type=int, default=5)
    ap.add_argument('--lr', type=float, default=0.1)
    ap.add_argument('--batches', default='1,4')
    ap.add_argument('--models', default='mlp,cnn,imu')
    ap.add_argument('--ort-python', default=os.environ.get('UTRAIN_ORT_PYTHON', DEFAULT_ORT))
    ap.add_argument('--no-mp', action='store_true', help='leave unix MicroPython out')
    ap.add_argument('--mp-models', default='mlp,cnn',
                    help='models unix MicroPython trains too (imu: ~3 s a sample there)')
    a = ap.parse_args(argv)
    have_ort = os.path.exists(a.ort_python)
    d = np.load(os.path.join(ROOT, 'datasets', 'digits', 'digits.npz'))
    digits = d['x'][:a.samples], d['y'][:a.samples]
    tmp = tempfile.mkdtemp(prefix='utrain-ort-')
    nets = models(tmp)
    cols = ['model', 'batch', 'engine'] + [f'loss e{e + 1}' for e in range(a.epochs)] + [
        'test acc', 'ms/sample', 'peak MB', 'time/ORT', 'max loss diff']
    print('| ' + ' | '.join(cols) + ' |')
    print('|' + '---|' * len(cols))
    for name in a.models.split(','):
        path, shape = nets[name]
        npz = os.path.join(tmp, name + '.npz')
        if name == 'imu':       # synthetic watch IMU windows (bench/imu_data.py), 6 classes
            from bench.imu_data import generate
            x, y = generate(a.samples, 0, 6, pad=(shape[-1] - 48) // 2)
        else:
            x, y = digits
        np.savez(npz, x=x.reshape((-1,) + shape), y=y)
        for batch in (int(b) for b in a.batches.split(',')):
            run_dir = os.path.join(tmp, f'{name}-b{batch}')
            prepare(path, run_dir, data=npz, test_split=0.2, loss='scce', from_logits=True,
                    optimizer='sgd', lr=a.lr, batch=batch, epochs=a.epochs, log=lambda *s: None)
            res = {}
            for eng, py in (('utrain Py', True), ('utrain MP', False)):
                if eng == 'utrain MP' and (a.no_mp or name not in a.mp_models.split(',')):
                    continue
                own = run_dir + ('-py' if py else '-mp')     # a fresh folder (log, weights)
                shutil.copytree(run_dir, own)
                res[eng] = utrain(own, py)
            if have_ort:        # the same samples, in the same layout and order
                perm = json.load(open(os.path.join(run_dir, 'prepare.json')))['input_perm']
                split = os.path.join(tmp, f'{name}-split.npz')
                parts = {}
                for k in ('train', 'test'):
                    xs, ys = read_dataset(os.path.join(run_dir, k + '.ds'))
                    xs = xs.reshape((-1,) + tuple(shape[i - 1] for i in perm[1:]) if perm
                                    else (-1,) + shape)
                    if perm:          # prepare stored them NHWC: back to the model's NCHW
                        xs = xs.transpose(np.argsort(perm))
                    parts['x_' + k] = np.ascontiguousarray(xs, np.float32)
                    parts['y_' + k] = ys.reshape(-1).astype(np.int64)
                np.savez(split, **parts)
                res['ORT'] = ort_train(a.ort_python, path, split, batch, a.epochs, a.lr,
                                       os.path.join(tmp, f'{name}-b{batch}-ort'))
            ref = res.get('ORT')
            for eng, r in res.items():
                cells = [name, str(batch), eng] + [f'{v:.5f}' for v in r['loss']] + [
                    f'{r["acc"][-1]:.4f}', f'{r["ms"]:.3f}', f'{r["rss_kb"] / 1024:.1f}',
                    f'{r["ms"] / ref["ms"]:.2f}' if ref else '-',
                    f'{max(abs(p - q) for p, q in zip(r["loss"], ref["loss"])):.1e}'
                    if ref else '-']
                print('| ' + ' | '.join(cells) + ' |')
            if not ref:
                print('| ' + ' | '.join([name, str(batch), 'ORT'] + ['skipped: no '
                      f'onnxruntime-training at {a.ort_python}'] + [''] * (len(cols) - 4)) + ' |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
