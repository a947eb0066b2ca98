"""The planner sweep (issue 28): for every model x setting cell, the heap planner's figure
(plan), the smallest heap that trains (need: bisected to 1 KB on a unix MicroPython) and
plan / need; a cell is flagged UNDER when plan < need (a board the plan admits fails) and
OVER when plan > 1.2 x need (a board that fits is turned away).

    python bench/sweep.py [--mp32 MP | --pico] [--ulab] [--int8] [--only NAME]
                          [--settings A,B] [--cache FILE] [--samples N] [--step F]
                          [--sturdy] [--list] [--model FILE ...]

Models (--model FILE, repeatable: those files instead, e.g. models made outside the
project; named by the file's name, with its folders where names repeat): the digits MLP and CNN, the held-out small CNN and MobileNet head
(host_tools/formats/refmodels.py), the zoo's PyTorch nets through tico (bench/zoo/nets.py: IMU
1-D conv, LayerNorm block, LSTM, GRU, DS-CNN, ResNet-8; skipped without torch/tico) and
the Keras float MLP and DS-CNN.  Settings (prepare's): SGD batch 1 all layers, Adam
batch 4, the last two ops with --stream, --cache-on-host, the upper / lower half of the
last weighted op's channels (--ranks up / low), with row bands where prepare chooses them
(its default); named in --settings, also SGD momentum 0.9 at batch 1 ('momentum b1'),
SGD batch 4 ('sgd b4'), the last two ops streamed at SGD batch 4 ('b4 last:2 stream'), the last two ops from the board's own --cache ('last:2 cache')
and the last two ops over one-row bands (--bands 1, 'last:2 bands 1').  Each cell
trains one epoch of N random samples (default 8) of the model's input shape, no
evaluation, from a fresh prepare.

Int8 cells (memory.plan_heap_q8's plans): an int8 file (full-integer .tflite) trains as
int8 as it is; --int8 prepares the float models with --int8 (an int8 version calibrated
on the cell's random samples).  Their settings: SGD batch 1 and Adam batch 4 all layers,
the last two ops plain and from the board's own prefix cache (--cache), and the ranks
(int8 files only: --int8 from a float model refuses --ranks); a cell prepare trains in
float32 after all (dequantized) is named '(float32)'.  The needs are kept apart from the
float cells' in --cache (the key ends 'int8').

The build: the 64-bit unix MicroPython the runner finds ($MICROPYTHON), or --mp32 (default
$UTRAIN_MP32), a 32-bit build: the plan is then for that build's word size; --ulab plans
and trains with ulab's arrays (prepare --backend ulab) on a build with ulab ($UTRAIN_MP_ULAB,
or with --mp32 $UTRAIN_MP32_ULAB).  --pico measures on the emulated Raspberry Pi Pico
instead (host_tools/boards/pico.py: the real MicroPython rp2 firmware in rp2040js,
$UTRAIN_PICO_FIRMWARE, with --ulab $UTRAIN_PICO_ULAB_FIRMWARE; utrain staged as .mpy with
armv6m native code, as a user's Pico loads it): the plan is prepare --board rp2040's
(32-bit words, native code and npasm's Thumb kernels in the heap, littlefs; the cell's
settings as given: no profile default streams, no int8 from a float model unless --int8), the heap a
ballast leaves plus what the firmware holds after boot.  A run there takes about a
minute: a few cells (--only, --settings), 2-4 samples, --step 0.02.  Bisection
starts at the plan (one run says on which side the need lies), then halves [plan/2, plan]
or [plan, 1.5 plan]; a need outside that range prints as '<' / '>' the bound.  --sturdy:
the need is the smallest heap above which every heap up to the plan trains (each step
from the bisected need to the plan is run; fragmentation makes some cells train in a heap
and fail in a larger one).  --cache
FILE keeps measured needs keyed by cell, build and utrain's code (bench/memory.py's
code_key), with the row bands prepare chose (they follow the plan: a need measured on a
run banded otherwise is measured again), so a rerun re-plans only.  Prints one markdown table and the worst cells.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from host_tools.target import runner  # noqa: E402
from host_tools.files.dataset import DataError  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.plan.memory import first_run, trains_in  # noqa: E402
from host_tools.graph.optable import SPECS  # noqa: E402
from host_tools.graph.passes import PrepareError  # noqa: E402
from host_tools.prepare import quant  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

SLACK = 1.2          # plan / need above this: OVER
STEP = 1024


def models(tmp):
    """{name: () -> model path}: each made when asked for."""
    from host_tools.formats.refmodels import mobilenet_head, small_cnn
    digits = os.path.join(ROOT, 'datasets', 'digits')
    keras = os.path.join(ROOT, 'bench', 'zoo', 'keras')

    def zoo(n):
        from bench.zoo import nets       # (torch and tico)
        p = os.path.join(tmp, n + '.circle')
        nets.export(n, p)
        return p
    out = {'digits MLP': lambda: os.path.join(digits, 'digits_mlp.circle'),
           'digits CNN': lambda: os.path.join(digits, 'digits_cnn.circle'),
           'small CNN 16x16': lambda: small_cnn(os.path.join(tmp, 'small_cnn.circle')),
           'head 132k': lambda: mobilenet_head(os.path.join(tmp, 'head.circle')),
           'Keras MLP': lambda: os.path.join(keras, 'mlp_float.tflite'),
           'Keras DS-CNN': lambda: os.path.join(keras, 'dscnn_kws_float.tflite')}
    for n in ('imu', 'lnblock', 'lstm', 'gru', 'dscnn', 'resnet8'):
        out['zoo ' + n] = lambda n=n: zoo(n)
    return out


def model_names(paths):
    """[(name, path)] for --model files: the file's name, with as many of its folders
    before it as tell it from the others (tico's exports are each a model.circle)."""
    parts = [os.path.abspath(p).split(os.sep) for p in paths]
    out = []
    for p in parts:
        n = 1
        while n < len(p) and sum(q[-n:] == p[-n:] for q in parts) > 1:
            n += 1
        out.append(('/'.join(p[-n:]), os.sep.join(p)))
    return out


def settings(g, asked=None, int8=False):
    """[(name, prepare keywords)] for graph g (ranks on its last weighted op); with the
    names asked (--settings), also the settings swept only when named: SGD momentum at
    batch 1, SGD at batch 4, the last two ops from the board's own prefix cache (--cache),
    the last two ops with the frozen chains before them in one-row bands (--bands 1; the
    default bands them only where that lowers the plan).  int8 (an int8 run: an int8 file,
    or --int8 from a float model): the last two ops plain and from the board's own cache
    (--cache) instead of streamed (the int8 path streams the layers it chooses, not as
    --stream asks: the plans are the plain cell's) and from a host-made cache (refused by
    design); the ranks cells of a float model taken to int8 are refused by prepare (--int8
    does not go with --ranks) and print as refused."""
    weighted = [op.index for op in g.ops if SPECS.get(op.name) and SPECS[op.name].roles(op, g)
                and op.name in ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D')]
    b1 = dict(optimizer='sgd', batch=1)
    out = [('sgd b1', dict(b1, train='all')),
           ('adam b4', dict(optimizer='adam', batch=4, train='all'))]
    out += [('last:2', dict(b1, train='last:2')),
            ('last:2 cache', dict(b1, train='last:2', cache=True))] if int8 else [
        ('last:2 stream', dict(b1, train='last:2', stream=True)),
        ('last:2 cache-on-host', dict(b1, train='last:2', cache='host'))]
    if weighted:
        i = weighted[-1]
        out += [(f'ranks {i}:up', dict(b1, train='none', ranks=f'{i}:up')),
                (f'ranks {i}:low', dict(b1, train='none', ranks=f'{i}:low'))]
    named = [('momentum b1', dict(b1, train='all', momentum=0.9)),
             ('sgd b4', dict(optimizer='sgd', batch=4, train='all')),
             ('b4 last:2 stream', dict(optimizer='sgd', batch=4, train='last:2', stream=True)),
             ('last:2 cache', dict(b1, train='last:2', cache=True)),
             ('last:2 bands 1', dict(b1, train='last:2', bands=1))]
    have = {n for n, _ in out}
    return out + [(n, kw) for n, kw in named if asked and n in asked and n not in have]


def on_board(board, kw, int8=False):
    """prepare's keywords for a board profile's plan: the cell's settings stay as they are
    (no profile default streams, no int8 from a float model unless int8, --int8: the float
    plan is measured, or the int8 one)."""
    if not board:
        return dict(int8=True) if int8 else {}
    return dict(board=board, stream=kw.get('stream', False), int8=int8)


def samples(g, path, n):
    shape = g.tensors[g.inputs[0]].shape
    classes = int(np.prod(g.tensors[g.outputs[0]].shape))
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.standard_normal((n,) + tuple(shape[1:])).astype(np.float32),
             y=rng.integers(0, classes, n))
    return path


def need(out, plan, step=STEP, trains=None, top=None):
    """The smallest heap (bytes, within step) that trains the run in out, searched around
    the plan: (need, '' or '<' / '>' when it lies beyond [plan / 2, 1.5 plan], or beyond
    top, the largest heap the build has).  Frugal: when the plan trains, plan / SLACK is
    tried next, and the search stays in [plan / SLACK, plan] when it does not (a cell
    within bounds costs 2 + log2 runs).  trains(out, heap): default a unix build's run."""
    trains = trains or trains_in
    runner.stage(out)
    if plan > (top or plan):
        plan = top                      # (the build has less: the search starts there)
    if trains(out, plan):
        edge = int(plan / SLACK)
        if not trains(out, edge):
            lo, hi = edge, plan
        else:
            lo, hi = plan // 2, edge
            if trains(out, lo):
                return lo, '<'
    else:
        lo, hi = plan, min(int(plan * 1.5), top or plan * 2)
        if hi <= lo or not trains(out, hi):
            return hi, '>'
    while hi - lo > step:
        mid = (lo + hi) // 2
        if trains(out, mid):
            hi = mid
        else:
            lo = mid
    return hi, ''


def sturdy(out, n, plan, step, trains=None):
    """The smallest heap above which every heap up to the plan trains, from the bisected
    need n: each heap n + step, n + 2 step ... plan is run, and one that fails moves the
    need past it.  A step's peak is a matter of fragmentation where its arrays are large
    next to the heap: the zoo imu net, --ranks 19:up on 32-bit ulab, trained at 126 and
    129.6 KB but failed at 128 KB (session 4): a bisection's edge, not a need."""
    trains = trains or trains_in
    h = n + step
    while h <= plan:
        if not trains(out, h):
            n = h + step
        h += step
    return n


def pico_trains(ulab, timeout=3600):
    """trains(out, heap) on the emulated Pico (host_tools/boards/pico.py: the real rp2
    firmware in rp2040js): a ballast leaves heap minus what the firmware holds after boot,
    so the figure compares with a unix build's -X heapsize; as trains_in, each run a first
    run (memory.first_run: no board-made prefix cache, and no log, checkpoint or trained
    weights the last run copied back; before session 20 these stayed, and every run after
    the first found train.log and a checkpoint there)."""
    from host_tools.boards import pico
    total, free = pico.gc_total(ulab)
    held = total - free

    def trains(out, heap):
        first_run(out)
        try:
            code, text = pico.run_folder(out, ulab, heap=heap - held, stream=False,
                                         timeout=timeout)
        except pico.PicoError as e:
            print(f'    pico, {heap} B: {e}', file=sys.stderr)
            return False
        print(f'    pico, {heap} B: ' + ('trains' if code == 0 else 'fails: ' + ' '.join(
            text.strip().splitlines()[-1:])[:120]), file=sys.stderr, flush=True)
        return code == 0
    return trains, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--mp32', default=os.environ.get('UTRAIN_MP32'),
                    help='a 32-bit unix MicroPython (default $UTRAIN_MP32; else the 64-bit one)')
    ap.add_argument('--ulab', action='store_true',
                    help='--backend ulab, on a build with ulab (--mp32 MP, else $UTRAIN_MP_ULAB)')
    ap.add_argument('--only', help='models whose name contains this (comma-separated)')
    ap.add_argument('--settings', help='only settings whose name contains one of these; '
                    "'momentum b1', 'sgd b4', 'b4 last:2 stream', 'last:2 cache', 'last:2 bands 1' are swept only when named")
    ap.add_argument('--cache', help='JSON file of measured needs, read and updated')
    ap.add_argument('--samples', type=int, default=8)
    ap.add_argument('--list', action='store_true', help='plan only, measure nothing')
    ap.add_argument('--model', action='append', default=[],
                    help='a model file (.circle, .tflite, .onnx) to sweep instead of the built-in '
                    'models; repeatable')
    ap.add_argument('--pico', action='store_true',
                    help='measure on the emulated Raspberry Pi Pico (the real rp2 firmware in '
                    'rp2040js: $UTRAIN_PICO_FIRMWARE, with --ulab $UTRAIN_PICO_ULAB_FIRMWARE), '
                    'planned for --board rp2040; slow: few cells, few samples, a coarse --step')
    ap.add_argument('--sturdy', action='store_true',
                    help='the need is the smallest heap above which every heap up to the plan '
                    'trains (each step between the bisected need and the plan is run): '
                    'fragmentation can make a step train in a heap and fail in a larger one')
    ap.add_argument('--int8', action='store_true',
                    help='int8 cells: a float model prepared with --int8 (calibrated on the '
                    'samples), an int8 file as it is; the int8 settings (settings())')
    ap.add_argument('--step', type=float, default=0,
                    help='bisection step as a fraction of the plan (default: 1 KB); e.g. 0.015')
    a = ap.parse_args()
    board, on = None, []        # on: (trains, top) of the emulated Pico, once one is asked for
    if a.pico:
        from host_tools.boards import pico
        build = os.path.basename(pico.firmware(a.ulab))
        board = 'rp2040'
    if a.mp32 and os.path.exists(a.mp32):
        os.environ['MICROPYTHON'] = a.mp32
    elif a.ulab and os.environ.get('UTRAIN_MP_ULAB'):
        os.environ['MICROPYTHON'] = os.environ['UTRAIN_MP_ULAB']
    backend = 'ulab' if a.ulab else 'fallback'
    if not a.pico:
        build = os.path.basename(runner.micropython_binary() or 'none')
        if a.ulab and not a.list and subprocess.run([runner.micropython_binary(), '-c', 'import ulab'],
                                     capture_output=True).returncode:
            # (a build without it runs the fallback's arrays: needs of another backend,
            # 15-19 KB above the ulab plan on the digits models, all "UNDER")
            sys.exit(f'--ulab: {runner.micropython_binary()} has no ulab; give --mp32 a build with '
                     'it ($UTRAIN_MP32_ULAB) or set $UTRAIN_MP_ULAB')
    from bench.memory import code_key
    key = code_key()
    cache = {}
    if a.cache and os.path.exists(a.cache):
        with open(a.cache) as f:
            cache = json.load(f)
    tmp = tempfile.mkdtemp()
    rows = []
    only = a.only.split(',') if a.only else None
    table = {name: (lambda m=m: m) for name, m in model_names(a.model)} if a.model else models(tmp)
    for name, make in table.items():
        if only and not any(o in name for o in only):
            continue
        try:
            path = make()
        except Exception as e:  # noqa: B902 - no torch / tico: the zoo's nets are left out
            print(f'({name} left out: {type(e).__name__}: {e})', file=sys.stderr)
            continue
        g = read_model(path)
        data = samples(g, os.path.join(tmp, 'd.npz'), a.samples)
        q8file = quant.is_int8(g) or quant.float_ends(g)    # (trained as int8 as it is)
        for sname, kw in settings(g, a.settings and a.settings.split(','), a.int8 or q8file):
            if a.settings and not any(s in sname for s in a.settings.split(',')):
                continue
            out = os.path.join(tmp, 'run')
            shutil.rmtree(out, ignore_errors=True)
            try:
                s = prepare(path, out, data=data, loss='scce', from_logits=True, lr=0.01,
                            epochs=1, log=lambda *m: None, backend=backend,
                            **dict(kw, **on_board(board, kw, a.int8 and not q8file)))
            except (PrepareError, DataError) as e:     # (DataError: a model of several inputs)
                print(f'  {name} | {sname}: refused ({str(e).splitlines()[0][:100]})', file=sys.stderr)
                continue
            plan = s['heap']['total']
            if (a.int8 or q8file) and not s.get('int8'):
                sname += ' (float32)'   # (prepare trains it dequantized: not an int8 cell)
            k = '|'.join((name, sname, build, key, str(a.samples)) + ('ulab',) * a.ulab
                         + ('sturdy',) * a.sturdy + ('int8',) * (a.int8 and not q8file))
            bands = s.get('bands') or []
            if k in cache and len(cache[k]) > 2 and cache[k][2] != bands:
                del cache[k]        # measured on a run prepare banded otherwise (the plan chose)
            if not a.list and k not in cache:
                if a.pico and not on:
                    on.append(pico_trains(a.ulab))
                step = max(STEP, int(a.step * plan))
                got = list(need(out, plan, step, *(on[0] if on else ())))
                if a.sturdy and not got[1]:
                    got[0] = sturdy(out, got[0], plan, step, on[0][0] if on else None)
                cache[k] = got + [bands]
                if a.cache:
                    with open(a.cache, 'w') as f:
                        json.dump(cache, f, indent=0)
            got = cache.get(k)
            rows.append((name, sname, plan, got))
            print('  ' + ' | '.join(map(str, rows[-1])), file=sys.stderr, flush=True)
    word = 32 if a.pico else runner.simulator_word() * 8
    print(f'build: {build} ({word}-bit{", planned for --board rp2040" if a.pico else ""}), '
          f'{backend}{"; float models --int8" if a.int8 else ""}; {a.samples} samples, one epoch')
    print('| model | setting | plan KB | need KB | plan/need | |')
    print('|---|---|---|---|---|---|')
    worst = []
    for name, sname, plan, got in rows:
        if got is None:
            print(f'| {name} | {sname} | {plan / 1024:.0f} | - | - | |')
            continue
        n, bound = got[:2]
        r = plan / n
        flag = 'UNDER' if r < 1 and bound != '<' or bound == '>' else 'OVER' if r > SLACK else ''
        worst.append((r, name, sname))
        print(f'| {name} | {sname} | {plan / 1024:.0f} | {bound}{n / 1024:.0f} | {r:.2f} | {flag} |')
    if worst:
        worst.sort()
        print(f'\ncells {len(worst)}; lowest plan/need {worst[0][0]:.2f} ({worst[0][1]}, '
              f'{worst[0][2]}); highest {worst[-1][0]:.2f} ({worst[-1][1]}, {worst[-1][2]}); '
              f'under: {sum(r < 1 for r, *_ in worst)}, over {SLACK}x: '
              f'{sum(r > SLACK for r, *_ in worst)}')


if __name__ == '__main__':
    main()
