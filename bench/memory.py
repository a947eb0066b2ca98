"""The memory table: per reference model and training setting, the planner's heap figure
and the measured one, on each build given, code included as .mpy.

    python bench/memory.py [--ulab MP] [--mp32 MP] [--mp32-ulab MP] [--m0 ELF]
                           [--m0-ulab ELF] [--frozen MP] [--quick] [--cache FILE] [--int8]

measured = the smallest `-X heapsize` (bisection, 1 KB) at which the run trains: one
epoch of 16 digits samples, evaluation, checkpoint and weights saved.  This is the
honest peak for a board: micropython.mem_peak() never subtracts what the garbage
collector frees on this port, and gc.mem_alloc() after gc.collect() misses the
temporaries inside an op and the fragmentation that makes a large block fail.
The fallback column runs $MICROPYTHON (or the MicroPython the runner finds); --ulab adds
a column for a 64-bit build with real ulab, --mp32 / --mp32-ulab for 32-bit unix builds
without / with ulab, --m0 / --m0-ulab for the emulated Cortex-M0 board (qemu, firmware
without / with ulab: deployed with host_tools deploy over its serial port, trained with
mpremote run, tests/support/m0board.py), --pico for the emulated Raspberry Pi Pico (the real
rp2 firmware, stock and with ulab, in rp2040js: host_tools/boards/pico.py; the heap a ballast
leaves plus what the firmware holds after boot, planned for --board rp2040), --frozen one for a ulab build with utrain frozen in
(boards/freeze.md: its code off the heap).  The builds default to $UTRAIN_MP_ULAB,
$UTRAIN_MP32, $UTRAIN_MP32_ULAB, $UTRAIN_M0, $UTRAIN_M0_ULAB (../shared/board-sim.md
says how to build them).  The planner column of a unix build plans for that build (its
word size); of the Cortex-M0, for `--board rp2040` (armv6m native code in the heap,
littlefs); '-' where the planner refuses the run for that board.  --cache FILE keeps
measured figures (keyed by build and utrain's code) so a rerun only re-plans.
--int8: the int8 models trained as int8 instead (tests/support/q8cases.py's runs and the DS-CNN
trained whole: Keras MLP, DS-CNN, MobileNetV2-0.35; 6 samples, one epoch, no
validation-gated saving), planned by memory.plan_heap_q8 (the ulab columns: the same
int8 code, which needs no ulab).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

sys.path.insert(0, os.path.join(ROOT, 'tests', 'support'))

from host_tools.target import runner  # noqa: E402
from host_tools.plan.memory import smallest_heap  # noqa: E402
from host_tools.graph.passes import PrepareError  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.formats.refmodels import mobilenet_head, small_cnn  # noqa: E402

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
    ('small CNN 16x16', 'sgd, batch 1', dict(optimizer='sgd', batch=1)),
    ('small CNN 16x16', 'adam, batch 4', dict(optimizer='adam', batch=4)),
    ('head 132k', 'last:2 sgd b1, in RAM', dict(optimizer='sgd', batch=1, train='last:2')),
    ('head 132k', 'last:2 sgd b1, stream', dict(optimizer='sgd', batch=1, train='last:2', stream=True)),
    ('head 132k', 'ranks 2:bias,3:1/4 adam b1, stream',
     dict(optimizer='adam', batch=1, train='none', ranks='2:bias,3:1/4', stream=True)),
    ('head 132k', 'last:3 ranks 2:1/4 sgd b1, stream',
     dict(optimizer='sgd', batch=1, train='last:3', ranks='2:1/4', stream=True)),
]


def models(tmp):
    out = {'digits MLP': os.path.join(DIGITS, 'digits_mlp.circle'),
           'small CNN 16x16': small_cnn(os.path.join(tmp, 'small_cnn.circle')),
           'head 132k': mobilenet_head(os.path.join(tmp, 'head.circle'))}
    cnn = os.path.join(DIGITS, 'digits_cnn.circle')
    if os.path.exists(cnn):
        out['digits CNN'] = cnn
    return out


def code_key():
    """A digest of the device code and the planner: a cached measurement is reused only
    for the same code."""
    import hashlib
    h = hashlib.sha1()
    for d in (runner.PACKAGE, runner.MICRO):
        for name in sorted(os.listdir(d)):
            if name.endswith('.py'):
                with open(os.path.join(d, name), 'rb') as f:
                    h.update(name.encode() + f.read())
    return h.hexdigest()[:12]


def measure(kind, binary, out, frozen=False):
    if kind == 'pico':
        from host_tools.boards import pico
        return pico.smallest_heap(out, ulab=binary == 'ulab', lo=32 * 1024)
    if kind == 'm0':
        import m0board
        return m0board.smallest_heap(binary, out, lo=16 * 1024, hi=m0board.MAX_HEAP)
    return smallest_heap(out, frozen=frozen)


def main():
    ap = argparse.ArgumentParser()
    env = os.environ.get
    ap.add_argument('--ulab', default=env('UTRAIN_MP_ULAB'), help='a 64-bit MicroPython with ulab')
    ap.add_argument('--mp32', default=env('UTRAIN_MP32'), help='a 32-bit unix MicroPython')
    ap.add_argument('--mp32-ulab', default=env('UTRAIN_MP32_ULAB'), help='a 32-bit unix MicroPython with ulab')
    ap.add_argument('--m0', default=env('UTRAIN_M0'), help='the emulated Cortex-M0 firmware (.elf)')
    ap.add_argument('--m0-ulab', default=env('UTRAIN_M0_ULAB'), help='the same with ulab')
    ap.add_argument('--pico', action='store_true', help='columns for the emulated Raspberry Pi '
                    'Pico: the real rp2 firmware ($UTRAIN_PICO_FIRMWARE, and with ulab '
                    '$UTRAIN_PICO_ULAB_FIRMWARE when set) in rp2040js, heap shrunk by a ballast')
    ap.add_argument('--frozen', help='a MicroPython with ulab and utrain frozen in, for another column')
    ap.add_argument('--no-64', action='store_true', help='leave out the 64-bit columns')
    ap.add_argument('--only', help='only models whose name contains this')
    ap.add_argument('--quick', action='store_true', help='only the first setting per model')
    ap.add_argument('--cache', help='JSON file of measured figures, read and updated')
    ap.add_argument('--int8', action='store_true', help='the int8 models trained as int8 instead')
    ap.add_argument('--samples', type=int, default=16, help='samples in the run (default 16; '
                    'fewer for the emulated Pico, whose every trial trains them all)')
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    data = os.path.join(tmp, 'd.npz')
    np.savez(data, x=z['x'][:a.samples], y=z['y'][:a.samples])
    rng = np.random.default_rng(0)
    img = os.path.join(tmp, 'img.npz')      # 16 images for the small CNN, 5 classes
    np.savez(img, x=rng.normal(size=(a.samples, 16, 16, 1)).astype(np.float32),
             y=np.arange(a.samples) % 5)
    mdl = models(tmp)
    # (column, backend, binary, kind): kind 'unix' plans for that build, 'm0'/'pico' for rp2040
    builds = []
    if not a.no_64:
        builds.append(('64-bit fallback', 'fallback', runner.micropython_binary(), 'unix'))
        if a.ulab:
            builds.append(('64-bit ulab', 'ulab', a.ulab, 'unix'))
    if a.mp32:
        builds.append(('32-bit fallback', 'fallback', a.mp32, 'unix'))
    if a.mp32_ulab:
        builds.append(('32-bit ulab', 'ulab', a.mp32_ulab, 'unix'))
    if a.m0:
        builds.append(('M0 fallback', 'fallback', a.m0, 'm0'))
    if a.m0_ulab:
        builds.append(('M0 ulab', 'ulab', a.m0_ulab, 'm0'))
    if a.pico:
        from host_tools.boards import pico
        builds.append(('Pico fallback', 'fallback', 'stock', 'pico'))
        if pico.available(ulab=True):
            builds.append(('Pico ulab', 'ulab', 'ulab', 'pico'))
    if a.frozen:
        builds.append(('64-bit ulab-frozen', 'ulab-frozen', a.frozen, 'unix'))
    cache = {}
    if a.cache and os.path.exists(a.cache):
        with open(a.cache) as f:
            cache = json.load(f)
    key = code_key()
    rows = []
    seen = set()
    settings = SETTINGS
    if a.int8:
        import pathlib
        import q8cases
        settings = [(c, 'int8: ' + ', '.join(f'{k} {v}' for k, v in kw.items()), kw)
                    for c, (_, _, kw) in q8cases.BENCH.items()]
        mdl = {c: c for c in q8cases.BENCH}
    for name, desc, kw in settings:
        if name not in mdl or (a.quick and name in seen) or (a.only and a.only not in name):
            continue
        seen.add(name)
        row = [name, desc, None, None]
        for col, backend, binary, kind in builds:
            out = os.path.join(tmp, 'run')
            if os.path.isdir(out):
                shutil.rmtree(out)
            if kind == 'unix':
                os.environ['MICROPYTHON'] = binary
                opts = dict(backend=backend)
            else:
                opts = dict(backend=backend, board='rp2040', stream=kw.get('stream', False),
                            int8=False)       # (the float plan, not prepare's int8 choice)
            try:
                if a.int8:
                    opts.pop('backend')
                    opts.pop('stream', None)
                    d = pathlib.Path(tempfile.mkdtemp())
                    out, s = q8cases.prepared(prepare, name, d, **opts)
                else:
                    s = prepare(mdl[name], out, data=img if 'small' in name else data, loss='scce',
                                lr=0.01, epochs=1, **dict(kw, **opts))
                plan = s['heap']['total']
                row[2:4] = s['trainable_params'], (s['trainable_params'] + s['frozen_params']
                                                   if 'frozen_params' in s else '-')
            except PrepareError:
                row += [None, None]
                continue
            k = '|'.join((name, desc, col, os.path.basename(binary), key))
            if k not in cache:
                if kind == 'unix':
                    os.environ['MICROPYTHON'] = binary
                cache[k] = measure(kind, binary, out, frozen=backend.endswith('-frozen'))
                if a.cache:
                    with open(a.cache, 'w') as f:
                        json.dump(cache, f, indent=0)
            row += [plan, cache[k]]
        rows.append(row)
        print('  ' + ' | '.join(str(v) for v in row), file=sys.stderr, flush=True)
    head = '| model | setting | trained params | all params |'
    line = '|---|---|---|---|'
    for col, *_ in builds:
        head += f' {col}: planner KB | measured KB | ratio |'
        line += '---|---|---|'
    print(head)
    print(line)
    for r in rows:
        cells = [r[0], r[1], str(r[2]), str(r[3])]
        for i in range(len(builds)):
            plan, h = r[4 + 2 * i], r[5 + 2 * i]
            cells += [f'{plan / 1024:.0f}' if plan else '-', f'{h / 1024:.0f}' if h else '-',
                      f'{plan / h:.2f}' if h and plan else '-']
        print('| ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
    main()
