"""The memory table: per reference model and training setting, the planner's heap figure
and the measured one, on unix MicroPython (64-bit), code included as .mpy.

    python bench/memory.py [--ulab MICROPYTHON] [--frozen MICROPYTHON] [--quick]

measured = the smallest `-X heapsize` (bisection, 1 KB) at which the run trains: one
epoch of 16 digits samples, evaluation, checkpoint and weights saved.  This is the
honest peak for a board: micropython.mem_peak() never subtracts what the garbage
collector frees on this port, and gc.mem_alloc() after gc.collect() misses the
temporaries inside an op and the fragmentation that makes a large block fail.
The fallback column runs $MICROPYTHON (or the MicroPython the runner finds); --ulab adds
a column for a build with real ulab, --frozen one for a ulab build with utrain frozen
into it (boards/freeze.md: its code off the heap).
"""
import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from host_tools import runner  # noqa: E402
from host_tools.memory import smallest_heap  # noqa: E402
from host_tools.prepare import prepare  # noqa: E402
from host_tools.refmodels import mobilenet_head  # noqa: E402

DIGITS = os.path.join(ROOT, 'datasets', 'digits')

SETTINGS = [
    ('digits MLP', 'adam, batch 4 (demo)', dict(optimizer='adam', batch=4)),
    ('digits MLP', 'sgd, batch 4', dict(optimizer='sgd', batch=4)),
    ('digits MLP', 'adam, batch 1', dict(optimizer='adam', batch=1)),
    ('digits MLP', 'sgd, batch 1', dict(optimizer='sgd', batch=1)),
    ('digits MLP', 'sgd b1, ranks 0:bias,1:1/2', dict(optimizer='sgd', batch=1, ranks='0:bias,1:1/2')),
    ('digits CNN', 'adam, batch 4', dict(optimizer='adam', batch=4)),
    ('digits CNN', 'sgd, batch 1', dict(optimizer='sgd', batch=1)),
    ('digits CNN', 'sgd b1, stream', dict(optimizer='sgd', batch=1, stream=True)),
    ('head 132k', 'last:2 sgd b1, in RAM', dict(optimizer='sgd', batch=1, train='last:2')),
    ('head 132k', 'last:2 sgd b1, stream', dict(optimizer='sgd', batch=1, train='last:2', stream=True)),
    ('head 132k', 'ranks 2:bias,3:1/4 adam b1, stream',
     dict(optimizer='adam', batch=1, train='none', ranks='2:bias,3:1/4', stream=True)),
    ('head 132k', 'last:3 ranks 2:1/4 sgd b1, stream',
     dict(optimizer='sgd', batch=1, train='last:3', ranks='2:1/4', stream=True)),
]


def models(tmp):
    out = {'digits MLP': os.path.join(DIGITS, 'digits_mlp.circle'),
           'head 132k': mobilenet_head(os.path.join(tmp, 'head.circle'))}
    cnn = os.path.join(DIGITS, 'digits_cnn.circle')
    if os.path.exists(cnn):
        out['digits CNN'] = cnn
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--ulab', help='a MicroPython with ulab, for a second column')
    ap.add_argument('--frozen', help='a MicroPython with ulab and utrain frozen in, for a third column')
    ap.add_argument('--quick', action='store_true', help='only the first setting per model')
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    data = os.path.join(tmp, 'd.npz')
    np.savez(data, x=z['x'][:16], y=z['y'][:16])
    mdl = models(tmp)
    builds = [('fallback', runner.micropython_binary())]
    if a.ulab:
        builds.append(('ulab', a.ulab))
    if a.frozen:
        builds.append(('ulab-frozen', a.frozen))
    rows = []
    seen = set()
    for name, desc, kw in SETTINGS:
        if name not in mdl or (a.quick and name in seen):
            continue
        seen.add(name)
        row = [name, desc]
        for backend, binary in builds:
            out = os.path.join(tmp, 'run')
            s = prepare(mdl[name], out, data=data, loss='scce', lr=0.01, epochs=1,
                        backend=backend, **kw)
            os.environ['MICROPYTHON'] = binary
            h = smallest_heap(out, frozen=backend.endswith('-frozen'))
            plan = s['heap']['total']
            row += [plan, h]
        row.insert(2, s['trainable_params'])
        row.insert(3, s['trainable_params'] + s['frozen_params'])
        rows.append(row)
        print('  ' + ' | '.join(str(v) for v in row), file=sys.stderr, flush=True)
    head = '| model | setting | trained params | all params |'
    line = '|---|---|---|---|'
    for backend, _ in builds:
        head += f' {backend}: planner KB | {backend}: measured KB | ratio |'
        line += '---|---|---|'
    print(head)
    print(line)
    for r in rows:
        cells = [r[0], r[1], str(r[2]), str(r[3])]
        for i in range(len(builds)):
            plan, h = r[4 + 2 * i], r[5 + 2 * i]
            cells += [f'{plan / 1024:.0f}', f'{h / 1024:.0f}' if h else '-',
                      f'{plan / h:.2f}' if h else '-']
        print('| ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
    main()
