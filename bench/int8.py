"""Int8 training vs float training of the same int8 model (issue 16), side by side in
one process per interpreter: `python -m bench.int8 [--models mlp,dscnn] [--quick]`.

Per model and interpreter (unix MicroPython without ulab; $UTRAIN_MP32, the 32-bit
build, $UTRAIN_M0, the emulated Cortex-M0 firmware under qemu, and $UTRAIN_PICO_FIRMWARE,
the real rp2 firmware on the emulated Pico, whose times are RP2040 microseconds at 125 MHz,
when set), one run of bench/int8_step.py alternating in short rounds: the float
training step (the model dequantized by prepare, utrain's Trainer, SGD batch 1), the
int8 training step (utrain.q8: integer forward, QAS SGD, batch 1, same trained layers),
q8kern's FC multiply-add loop and a bare int8 multiply-add loop of as many MACs (viper; on
the Pico both are utrain.q8asm's inline assembler).
Columns: float us, int8 us, float/int8 (the speed-up), FC us, FC/bare.

The models are the Keras int8 ones of bench/zoo/keras (MLP: every layer trains; DS-CNN:
the last pointwise conv and the dense layer train)."""
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
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

KERAS = os.path.join(ROOT, 'bench', 'zoo', 'keras')
# model: (file stem, int8 --train, float --train): the same ops
MODELS = {'mlp': ('mlp', 'all', 'all'), 'dscnn': ('dscnn_kws', 'last:4', 'last:4')}


def folder(name, out, n=16):
    """A folder holding both the float run (prepare) and the int8 run of model name."""
    stem, qtrain, ftrain = MODELS[name]
    path = os.path.join(KERAS, stem + '_int8.tflite')
    d = np.load(os.path.join(KERAS, stem + '_data.npz'))
    x, y = d['x'][:n], d['y'][:n]
    np.savez(os.path.join(out, 'data.npz'), x=x, y=y)
    prepare(path, out, data=os.path.join(out, 'data.npz'), loss='scce', optimizer='sgd',
            lr=0.01, batch=1, epochs=1, train=ftrain, dequantize=True)
    g = read_model(path)
    m = quant.meta(g, qtrain)
    with open(os.path.join(out, 'q8.json'), 'w') as f:
        json.dump(m, f)
    from host_tools.files.wof import write_wof
    write_wof(os.path.join(out, 'q8.wof'), len(g.tensors), quant.wof_arrays(g, m), keep_dtype=True)
    (sx,), (zx,) = quant._q(g.tensors[g.inputs[0]])
    q = np.clip(np.round(x.reshape(len(x), -1) / sx) + zx, -128, 127).astype(np.int8)
    with open(os.path.join(out, 'q8x.bin'), 'wb') as f:
        for i in range(len(q)):
            f.write(q[i].tobytes() + bytes([int(y[i])]))
    return m


def run(out, binary, quick):
    cfg = {'lr': 0.01, 'mac_shape': [256, 64], 'loops': [], 'rounds': 3 if quick else 10,
           'round_us': 20000 if quick else 100000}
    with open(os.path.join(out, 'bench.json'), 'w') as f:
        json.dump(cfg, f)
    for s in ('step.py', 'int8_step.py'):
        shutil.copy(os.path.join(ROOT, 'bench', s), out)
    mpy = subprocess.run([binary, '-c', "import sys;print(sys.implementation._mpy)"],
                         capture_output=True, text=True, timeout=60).stdout.split()[-1]
    runner.stage(out, mpy=int(mpy))         # lib/utrain as .mpy, q8kern as this arch's viper code
    env = dict(os.environ, MICROPYPATH=':lib')
    argv = [binary, '-X', 'heapsize=8M', 'int8_step.py']
    r = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=1800)
    line = [v for v in r.stdout.splitlines() if v.startswith('RESULT')]
    if r.returncode or not line:
        err = (r.stdout + r.stderr).strip().splitlines()
        raise RuntimeError(err[-1] if err else f'exit {r.returncode}')
    return [float(v) for v in line[0].split()[1:]]


def task(name, path, n, seed=7, noise=None):
    """A fine-tuning task for model name: its synthetic data (the class templates the
    model was pre-trained on: bench/zoo/make_keras.py's, pretrain_dscnn.py's) with more
    noise and the labels permuted, n samples in an .npz."""
    r = np.random.default_rng(seed)
    noise = TASKS[name][0] if noise is None else noise
    if name == 'mlp':
        c = np.random.default_rng(0).standard_normal((4, 16)) * 1.5
        y = r.integers(0, 4, n)
        x = c[y] + noise * r.standard_normal((n, 16))
        perm = np.array([2, 0, 3, 1])
    else:
        t = np.random.default_rng(1).standard_normal((12, 49, 10))
        y = r.integers(0, 12, n)
        x = (t[y] + noise * r.standard_normal((n, 49, 10)))[..., None]
        perm = np.roll(np.arange(12), 5)
    np.savez(path, x=x.astype(np.float32), y=perm[y])


# model: (task noise, samples, epochs, lr) of the accuracy table (pre-training noise:
# MLP 1.0, DS-CNN 0.7)
# A quarter of the samples test: MLP 1000 (one point = 10 samples; at 300 the last epoch's
# int8 - float moved between -1 and +1.3 points with the draw alone), DS-CNN 300.  DS-CNN's
# lr: float's best of 0.01/0.03/0.1 (0.727/0.727/0.567 at epoch 4)
TASKS = {'mlp': (2.0, 4000, 4, 0.02), 'dscnn': (1.5, 1200, 4, 0.01)}


def accuracy(name, n, epochs, lr, kinds=('int8', 'float')):
    """Test accuracy per epoch of the int8 run (unix MicroPython, viper) and the float
    run (prepare --dequantize, CPython + numpy: the same code) on the same split."""
    from host_tools.prepare.pipeline import prepare
    stem, qtrain, ftrain = MODELS[name]
    path = os.path.join(KERAS, stem + '_int8.tflite')
    out = {}
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, 'task.npz')
        task(name, data, n)
        for kind in kinds:
            f = os.path.join(d, kind)
            prepare(path, f, data=data, test_split=0.25, loss='scce', optimizer='sgd', lr=lr,
                    epochs=epochs, train=qtrain if kind == 'int8' else ftrain,
                    dequantize=kind == 'float')
            code, text = runner.run(f, python=kind == 'float', stream=False)
            if code:
                raise RuntimeError(text.strip().splitlines()[-1])
            acc = [float(v.split('test_accuracy ')[1].split()[0]) for v in text.splitlines()
                   if v.startswith('epoch ') or v.startswith('before training')]
            out[kind] = (acc, os.path.getsize(os.path.join(f, 'trained.wof')))
    return out


M0_FILES = ('bench.json', 'step.py', 'int8_step.py', 'q8.json', 'q8.wof', 'q8x.bin', 'train.ds',
            'weights.wof', 'model.flat')


def run_m0(out, elf, quick):
    """int8_step.py on the emulated Cortex-M0 ($UTRAIN_M0: the qemu firmware of
    ../shared/board-sim.md), over its UART pty with mpremote."""
    import re
    import time
    cfg = {'lr': 0.01, 'mac_shape': [256, 64], 'loops': [], 'rounds': 1 if quick else 2,
           'round_us': 1000 if quick else 200000}
    with open(os.path.join(out, 'bench.json'), 'w') as f:
        json.dump(cfg, f)
    for s in ('step.py', 'int8_step.py'):
        shutil.copy(os.path.join(ROOT, 'bench', s), out)
    runner.stage(out, mpy=(4 << 10) | 0x306)      # armv6m
    log = os.path.join(out, 'qemu.log')
    with open(log, 'w') as lf:
        q = subprocess.Popen(['qemu-system-arm', '-machine', 'microbit', '-global',
                              'nrf51-soc.flash-size=1048576', '-global',
                              'nrf51-soc.sram-size=4194304', '-nographic', '-monitor', 'null',
                              '-semihosting', '-device', 'loader,addr=0x20100000,data=0,data-len=4',
                              '-serial', 'pty', '-kernel', elf], stdout=lf, stderr=lf)
    try:
        pty = None
        for _ in range(100):
            time.sleep(0.1)
            m = re.search(r'/dev/pts/\d+', open(log).read())
            if m:
                pty = m.group(0)
                break
        if not pty:
            raise RuntimeError('qemu printed no pty')
        mp = [sys.executable, '-m', 'mpremote', 'connect', pty]
        subprocess.run(mp + ['mkdir', ':lib', '+', 'cp', '-r', 'lib/utrain/', ':lib/', '+', 'cp']
                       + list(M0_FILES) + [':'], cwd=out, check=True, capture_output=True,
                       timeout=600)
        r = subprocess.run(mp + ['run', 'int8_step.py'], cwd=out, capture_output=True, text=True,
                           timeout=3600)
    finally:
        q.kill()
        q.wait()
    line = [v for v in r.stdout.splitlines() if v.startswith('RESULT')]
    if not line:
        raise RuntimeError((r.stdout + r.stderr).strip()[-300:])
    return [float(v) for v in line[0].split()[1:]]


def run_pico(out, ulab, quick):
    """int8_step.py on the emulated Raspberry Pi Pico (the real rp2 firmware in rp2040js,
    host_tools/boards/pico.py): times are the chip's (the emulated clock at 125 MHz)."""
    from host_tools.boards import pico
    cfg = {'lr': 0.01, 'mac_shape': [256, 64], 'loops': [], 'rounds': 1,
           'round_us': 1000 if quick else 50000}
    with open(os.path.join(out, 'bench.json'), 'w') as f:
        json.dump(cfg, f)
    for s in ('step.py', 'int8_step.py'):
        shutil.copy(os.path.join(ROOT, 'bench', s), out)
    code, text = pico.run_folder(out, ulab=ulab, stream=False, script='int8_step.py')
    line = [v for v in text.splitlines() if v.startswith('RESULT')]
    if code or not line:
        raise RuntimeError(text.strip()[-300:])
    return [float(v) for v in line[0].split()[1:]]


def interpreters():
    out = [('unix64', runner.micropython_binary())]
    from host_tools.boards import pico
    if pico.available():
        out.append(('pico', 'stock'))
    p = os.environ.get('UTRAIN_MP32')
    if p and os.access(p, os.X_OK):
        out.append(('unix32', p))
    p = os.environ.get('UTRAIN_M0')
    if p and os.path.exists(p) and shutil.which('qemu-system-arm'):
        out.append(('cortex-m0', p))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.int8')
    ap.add_argument('--models', default='mlp,dscnn')
    ap.add_argument('--quick', action='store_true')
    ap.add_argument('--keras', help='a folder of make_keras.py output to take the models '
                    'from instead of bench/zoo/keras')
    ap.add_argument('--accuracy', action='store_true',
                    help='the accuracy table instead: int8 vs float fine-tuning, same data')
    a = ap.parse_args(argv)
    global KERAS
    if a.keras:
        KERAS = a.keras
    if a.accuracy:
        print('| model | samples | epochs | int8 test acc (per epoch) | float test acc (per '
              'epoch) | int8 - float (last) | trained.wof int8/float |')
        print('|---|---|---|---|---|---|---|')
        for name in a.models.split(','):
            n, ep, lr = TASKS[name][1:]
            r = accuracy(name, n, ep, lr)
            (qa, qs), (fa, fs) = r['int8'], r['float']
            print('| %s | %d | %d | %s | %s | %+.1f | %d / %d B |'
                  % (name, n, ep, ' '.join('%.3f' % v for v in qa),
                     ' '.join('%.3f' % v for v in fa), 100 * (qa[-1] - fa[-1]), qs, fs))
        return None
    rows = []
    for name in a.models.split(','):
        for iname, binary in interpreters():
            with tempfile.TemporaryDirectory() as out:
                folder(name, out, 4 if a.quick or iname == 'pico' else 16)   # a Pico holds few
                try:
                    if iname == 'pico':
                        f, q, fc, bare = run_pico(out, False, a.quick)
                    elif iname == 'cortex-m0':
                        f, q, fc, bare = run_m0(out, binary, a.quick)
                    else:
                        f, q, fc, bare = run(out, binary, a.quick)
                except RuntimeError as e:
                    print(f'{name} on {iname}: {e}', file=sys.stderr)
                    continue
            # (CPU time is tick-granular: a --quick round on a busy machine can read 0)
            rows.append((name, iname, f, q, f / max(q, 1e-9), fc, fc / max(bare, 1e-9)))
    head = ('model', 'build', 'float us', 'int8 us', 'float/int8', 'FC MAC us', 'FC/bare')
    print('| ' + ' | '.join(head) + ' |')
    print('|' + '---|' * len(head))
    for r in rows:
        if r[2] < 0:
            print('| %s | %s | out of memory | %.0f | - | %.0f | %.2f |' % (r[:2] + r[3:4] + r[5:]))
        else:
            print('| %s | %s | %.0f | %.0f | %.1f | %.0f | %.2f |' % r)
    return rows


if __name__ == '__main__':
    main()
