"""Float models trained in integers (issue 33): prepare --int8 (what prepare chooses for a
board without ulab) against --float32, same model, data and settings.

    python -m bench.fromfloat [--samples 8]          the speed table
    python -m bench.fromfloat --accuracy [--quick]   the accuracy table
    python -m bench.fromfloat --profile              where a sample's cycles go (Pico)

Speed: the digits MLP 64-32-10 (SGD, batch 1), one epoch of a few samples per build; the
time per sample is the board's own epoch line (ms/sample: reading, step, bookkeeping),
on the emulated Pico's stock firmware (host_tools/boards/pico.py, RP2040 cycles = us x 125;
when $UTRAIN_PICO_FIRMWARE is set) and on unix MicroPython (x86, ms).

Accuracy: the last epoch's test accuracy of the int8 run and the float run on a quarter
of the samples held out, three splits (split seeds 0-2): the digits MLP and CNN (trained
from their untrained weights) and the Keras MLP 16-32-16-4 of bench/zoo (bench/int8.py's
fine-tuning task).  The int8 runs on unix MicroPython (bit for bit the host numpy
trainer's: tests/int8/test_fromfloat.py), the float runs on the host's numpy trainer."""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host_tools.target import runner  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
KERAS = os.path.join(ROOT, 'bench', 'zoo', 'keras')
# name: (model, samples, epochs, lr) of the accuracy table
TASKS = {'digits MLP': ('digits_mlp.circle', 1000, 10, 0.01),
         'digits CNN': ('digits_cnn.circle', 600, 10, 0.01),
         'Keras MLP (zoo)': ('mlp_float.tflite', 4000, 4, 0.02),
         'sensor 1-D conv': ('sensor_cnn.circle', 800, 10, 0.01)}
SENSOR_T, SENSOR_C, SENSOR_K = 32, 3, 4     # time steps, axes, classes


def sensor_model(path, seed=0):
    """A 1-D CNN no tuning saw, untrained (Glorot): [1, 32, 1, 3] (32 steps of a 3-axis
    sensor) -> CONV_2D 5x1 x8 RELU -> MAX_POOL 2x1 -> CONV_2D 3x1 x8 RELU -> MAX_POOL 2x1
    -> [1, 64] -> FULLY_CONNECTED 4 -> SOFTMAX."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(seed)

    def glorot(shape, fi, fo):
        lim = np.sqrt(6.0 / (fi + fo))
        return rng.uniform(-lim, lim, size=shape).astype(np.float32)
    b = CircleBuilder(description='sensor_cnn')
    x = b.tensor('input', [1, SENSOR_T, 1, SENSOR_C])
    t, c, h = x, SENSOR_C, SENSOR_T
    for i, (k, o) in enumerate(((5, 8), (3, 8))):
        y = b.tensor(f'conv{i}/out', [1, h, 1, o])
        b.op('CONV_2D', [t, b.tensor(f'conv{i}/weight', [o, k, 1, c], data=glorot(
            (o, k, 1, c), k * c, k * o)), b.tensor(f'conv{i}/bias', [o], data=np.zeros(
                o, np.float32))], [y], padding='SAME', stride_h=1, stride_w=1,
             fused_activation_function='RELU')
        h //= 2
        t = b.tensor(f'pool{i}/out', [1, h, 1, o])
        b.op('MAX_POOL_2D', [y], [t], padding='VALID', stride_h=2, stride_w=1,
             filter_height=2, filter_width=1)
        c = o
    f = b.tensor('flatten/out', [1, h * c])
    b.op('RESHAPE', [t], [f], new_shape=[1, h * c])
    z = b.tensor('fc/out', [1, SENSOR_K])
    b.op('FULLY_CONNECTED', [f, b.tensor('fc/weight', [SENSOR_K, h * c], data=glorot(
        (SENSOR_K, h * c), h * c, SENSOR_K)), b.tensor('fc/bias', [SENSOR_K], data=np.zeros(
            SENSOR_K, np.float32))], [z])
    p = b.tensor('probabilities', [1, SENSOR_K])
    b.op('SOFTMAX', [z], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    b.save(path)


def sensor_data(n, seed=0):
    """n windows of a 3-axis sensor-like signal, 4 classes (still, walking, running,
    shaking: the step's frequency and amplitude, a gravity offset, noise)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, SENSOR_K, n)
    t = np.arange(SENSOR_T)[None, :, None]
    f = np.array([0.0, 0.06, 0.12, 0.2])[y][:, None, None] * rng.uniform(0.8, 1.2, (n, 1, 1))
    a = np.array([0.05, 0.5, 0.9, 0.4])[y][:, None, None] * rng.uniform(0.6, 1.4, (n, 1, SENSOR_C))
    ph = rng.uniform(0, 2 * np.pi, (n, 1, SENSOR_C))
    g = np.zeros((n, 1, SENSOR_C))
    g[:, 0, 2] = 1.0
    x = g + a * np.sin(2 * np.pi * f * t + ph) + rng.normal(0, 0.5, (n, SENSOR_T, SENSOR_C))
    return x.reshape(n, SENSOR_T, 1, SENSOR_C).astype(np.float32), y


def data(name, n, path):
    """The samples of task name (n of them) in an .npz at path."""
    if name.startswith('Keras'):
        from bench.int8 import task
        task('mlp', path, n)
        return
    if name.startswith('sensor'):
        x, y = sensor_data(n)
        np.savez(path, x=x, y=y)
        sensor_model(os.path.join(os.path.dirname(path), TASKS[name][0]))
        return
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    x = z['x'][:n]
    np.savez(path, x=x.reshape(-1, 8, 8, 1) if 'CNN' in name else x, y=z['y'][:n])


def model_path(name, where=None):
    if name.startswith('sensor'):       # (made by data() beside the samples)
        return os.path.join(where, TASKS[name][0])
    return os.path.join(KERAS if name.startswith('Keras') else DIGITS, TASKS[name][0])


def ms_per_sample(text):
    got = re.findall(r'\(([0-9.]+) ms/sample', text)
    if not got:
        raise RuntimeError(text.strip()[-400:])
    return float(got[-1])


def speed(samples, unix_samples=400):
    """{build: {kind: ms per sample}} of the digits MLP, SGD batch 1 (the emulated Pico:
    samples; unix MicroPython: unix_samples, for the resolution of its ms/sample)."""
    from host_tools.boards import pico
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for kind in ('float32', 'int8'):
            for build, n in (('unix64', unix_samples), ('pico', samples)):
                if build == 'pico' and not pico.available():
                    continue
                npz = os.path.join(d, 'd%d.npz' % n)
                data('digits MLP', n, npz)
                f = os.path.join(d, kind + build)
                prepare(model_path('digits MLP'), f, data=npz, loss='scce', optimizer='sgd',
                        lr=0.01, batch=1, epochs=1, progress=0, int8=kind == 'int8',
                        log=lambda *a: None)
                if build == 'unix64':
                    code, text = runner.run(f, stream=False)
                else:
                    code, text = pico.run_folder(f, stream=False)
                if code:
                    raise RuntimeError(text.strip()[-400:])
                out.setdefault(build, {})[kind] = ms_per_sample(text)
    return out


def profile(samples):
    """[(phase, RP2040 cycles per sample)] of the int8-from-float digits MLP's training
    pass on the emulated Pico (bench/fromfloat_step.py), the rest of the pass (the loop's
    bookkeeping) last."""
    import shutil
    from host_tools.boards import pico
    with tempfile.TemporaryDirectory() as d:
        npz = os.path.join(d, 'd.npz')
        data('digits MLP', samples, npz)
        f = os.path.join(d, 'int8')
        prepare(model_path('digits MLP'), f, data=npz, loss='scce', optimizer='sgd', lr=0.01,
                batch=1, epochs=1, progress=0, int8=True, log=lambda *a: None)
        shutil.copy(os.path.join(ROOT, 'bench', 'fromfloat_step.py'), f)
        code, text = pico.run_folder(f, stream=False, script='fromfloat_step.py')
        if code:
            raise RuntimeError(text.strip()[-400:])
    got = dict(line[5:].split('|') for line in text.splitlines() if line.startswith('PROF '))
    got = {k: float(v) * pico.MHZ for k, v in got.items()}
    whole = got.pop("the trainer's pass")
    rows = sorted(got.items())
    rows.append(('the pass\'s bookkeeping (the rest)', whole - sum(v for _, v in rows)))
    rows.append(("the trainer's pass (all)", whole))
    return rows


def accuracy(name, n, epochs, lr, seed=0):
    """{kind: [test accuracy per epoch]} of task name, int8 and float32, on the split
    drawn with seed.  The int8 run on unix MicroPython when there (bit for bit the host's
    numpy trainer's, tests/int8/test_fromfloat.py; faster), else on the host; float32 on the
    host (numpy)."""
    out = {}
    mp = runner.find_micropython()
    with tempfile.TemporaryDirectory() as d:
        npz = os.path.join(d, 'task.npz')
        data(name, n, npz)
        for kind in ('int8', 'float32'):
            f = os.path.join(d, kind)
            prepare(model_path(name, d), f, data=npz, test_split=0.25, split_seed=seed,
                    loss='scce', optimizer='sgd', lr=lr, batch=1, epochs=epochs, progress=0,
                    int8=kind == 'int8', log=lambda *a: None)
            code, text = runner.run(f, python=kind == 'float32' or not mp, stream=False)
            if code:
                raise RuntimeError(text.strip().splitlines()[-1])
            out[kind] = [float(v.split('test_accuracy ')[1].split()[0])
                         for v in text.splitlines() if v.startswith('epoch ')]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.fromfloat')
    ap.add_argument('--accuracy', action='store_true', help='the accuracy table instead')
    ap.add_argument('--quick', action='store_true', help='--accuracy on fewer samples')
    ap.add_argument('--samples', type=int, default=8, help='samples of the timed epoch')
    ap.add_argument('--profile', action='store_true',
                    help='where an int8-from-float sample\'s cycles go on the emulated Pico')
    ap.add_argument('--models', help='--accuracy: some of the tasks, comma-separated (mlp, '
                    'cnn, zoo, sensor)')
    a = ap.parse_args(argv)
    if a.profile:
        rows = profile(a.samples)
        whole = rows[-1][1]
        print('digits MLP 64-32-10 trained as int8 from float, SGD batch 1, on the emulated '
              'Pico (stock firmware): RP2040 cycles per sample')
        print('| phase | cycles | share |')
        print('|---|---|---|')
        for k, v in rows:
            print('| %s | %.0f | %.0f%% |' % (k, v, 100 * v / whole))
        return
    if a.accuracy:
        seeds = range(1 if a.quick else 3)
        print('| model | samples | epochs | int8 from float: last test acc per split '
              '| float32 | int8 - float (mean, points) | over all epochs (points) |')
        print('|---|---|---|---|---|---|---|')
        pick = a.models.split(',') if a.models else ('mlp', 'cnn', 'zoo', 'sensor')
        for name, (_, n, ep, lr) in TASKS.items():
            if not any(k in name.lower().replace('keras', 'zoo') for k in pick):
                continue
            if a.quick:
                n, ep = n // 4, max(2, ep // 2)
            rs = [accuracy(name, n, ep, lr, seed) for seed in seeds]
            q, f = [r['int8'][-1] for r in rs], [r['float32'][-1] for r in rs]
            # (the mean over every epoch's test accuracy: how fast each learns, less noisy
            # than the last epoch's alone)
            qa, fa = ([sum(r[k]) / len(r[k]) for r in rs] for k in ('int8', 'float32'))
            print('| %s | %d | %d | %s | %s | %+.1f | %+.1f |' % (
                name, n, ep, ' '.join('%.3f' % v for v in q), ' '.join('%.3f' % v for v in f),
                100 * (sum(q) - sum(f)) / len(q), 100 * (sum(qa) - sum(fa)) / len(q)))
        return
    r = speed(a.samples)
    print('digits MLP 64-32-10, SGD batch 1, %d samples: time per sample (the board\'s epoch '
          'line)' % a.samples)
    print('| build | float32 | int8 from float | float / int8 |')
    print('|---|---|---|---|')
    for build, v in r.items():
        if build == 'pico':
            cells = ['%.2f Mcyc' % (v[k] * 125e3 / 1e6) for k in ('float32', 'int8')]
        else:
            cells = ['%.3f ms' % v[k] for k in ('float32', 'int8')]
        print('| %s | %s | %s | %.1fx |' % (
            'emulated Pico, stock firmware' if build == 'pico' else 'unix MicroPython (x86-64)',
            cells[0], cells[1], v['float32'] / v['int8']))


if __name__ == '__main__':
    main()
