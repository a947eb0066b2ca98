"""Int8 training vs float training of the same int8 model (issue 16), side by side in
one process per interpreter: `python -m bench.int8 [--models mlp,dscnn] [--quick]`.

Per model and interpreter (unix MicroPython without ulab; $UTRAIN_MP32, the 32-bit
build, when set), one run of bench/int8_step.py alternating in short rounds: the float
training step (the model dequantized by prepare, utrain's Trainer, SGD batch 1), the
int8 training step (utrain.q8: integer forward, QAS SGD, batch 1, same trained layers),
q8kern's FC multiply-add loop and a bare viper int8 multiply-add loop of as many MACs.
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

from host_tools import quant, runner  # noqa: E402
from host_tools.circle_io import read_model  # noqa: E402
from host_tools.prepare import prepare  # noqa: E402

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
            lr=0.01, batch=1, epochs=1, train=ftrain)
    g = read_model(path)
    m = quant.meta(g, qtrain)
    with open(os.path.join(out, 'q8.json'), 'w') as f:
        json.dump(m, f)
    from host_tools.wof import write_wof
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


def interpreters():
    out = [('unix64', runner.micropython_binary())]
    p = os.environ.get('UTRAIN_MP32')
    if p and os.access(p, os.X_OK):
        out.append(('unix32', p))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.int8')
    ap.add_argument('--models', default='mlp,dscnn')
    ap.add_argument('--quick', action='store_true')
    a = ap.parse_args(argv)
    rows = []
    for name in a.models.split(','):
        for iname, binary in interpreters():
            with tempfile.TemporaryDirectory() as out:
                folder(name, out, 4 if a.quick else 16)
                f, q, fc, bare = run(out, binary, a.quick)
            rows.append((name, iname, f, q, f / q, fc, fc / bare))
    head = ('model', 'build', 'float us', 'int8 us', 'float/int8', 'FC MAC us', 'FC/bare')
    print('| ' + ' | '.join(head) + ' |')
    print('|' + '---|' * len(head))
    for r in rows:
        print('| %s | %s | %.0f | %.0f | %.1f | %.0f | %.2f |' % r)
    return rows


if __name__ == '__main__':
    main()
