"""Memory: the host's heap planner for a training run, and the simulated board's
measurement of it.

plan_heap() predicts the smallest MicroPython heap (`-X heapsize`) in which a prepared
run trains, broken down: code (utrain as .mpy, resident), weights held in RAM, optimizer
state, gradient sums, saved activations and the peak of the per-sample working set
(activations in flight and the kernels' temporaries), each array with its object
overhead, plus the interpreter's own share and an allowance for fragmentation.

The measured figure it is compared with is smallest_heap(): the smallest -X heapsize at
which the run still trains (bisection, 1 KB).  micropython.mem_peak() cannot be used:
on this port it never subtracts blocks the garbage collector frees.
"""
from __future__ import annotations

import math
import os
import subprocess

from ..target import runner

# ---------------------------------------------------------------- measurement


def first_run(out_dir):
    """Make the next run in out_dir a first run, as on a board the folder was just copied
    to: no prefix cache (epoch 1 makes it; a host-made one stays), and no log, checkpoint
    or trained weights of an earlier run (with train.log there the run skips its header
    line, and the heap is laid out otherwise: the Keras DS-CNN, --ranks 10:low on 32-bit
    ulab, trained in 220 KB after a run but needed 241-244 KB as a first run; a bisection
    had measured the former).  Every smallest-heap measurement runs it before a run: the
    unix builds' (trains_in) and the emulated Pico's (boards/pico.py, bench/sweep.py),
    whose runs copy back what the board wrote."""
    import json
    with open(os.path.join(out_dir, 'train.json')) as f:
        cfg = json.load(f)
    host_cache = cfg.get('run', {}).get('cache') == 'host'
    files = cfg.get('files', {})
    wrote = ({files.get(k) for k in ('log', 'checkpoint', 'out')}
             - {files.get(k) for k in ('model', 'weights', 'train', 'test')} - {None})
    for f in os.listdir(out_dir):
        if '.pfx' in f and not host_cache or any(f.startswith(w) for w in wrote):
            os.remove(os.path.join(out_dir, f))


def trains_in(out_dir, heap: int, timeout=600, frozen=False) -> bool:
    """Does the prepared run in out_dir train (exit 0, weights saved) in `heap` bytes?
    frozen: the MicroPython has utrain frozen in (boards/freeze.md); lib/ is not used."""
    argv, env = runner.command(out_dir)
    first_run(out_dir)
    if frozen:
        env['MICROPYPATH'] = '.frozen'
    argv[argv.index('-X') + 1] = 'heapsize=%d' % heap
    # stdin an open pipe with nothing on it, as `run` (runner.run) and a board's serial
    # line give it: at its end (/dev/null: a sweep started in the background) utrain.run's
    # Keys reads it once and drops its poll, and the heap is laid out otherwise (the Keras
    # DS-CNN, --ranks 10:up on 32-bit ulab, trained in 212 KB that way, not in 237 KB)
    keep, w = os.pipe()
    try:
        r = subprocess.run(argv, cwd=out_dir, env=env, capture_output=True, text=True,
                           timeout=timeout, stdin=keep)
    finally:
        os.close(keep)
        os.close(w)
    # (a run with a test split that keeps the best epoch says it holds them instead)
    return r.returncode == 0 and ('saved ' in r.stdout or 'holds the best weights' in r.stdout)


def smallest_heap(out_dir, lo=8 * 1024, hi=2048 * 1024, step=1024, frozen=False):
    """The smallest heap (bytes, within `step`) in which the run trains, or None."""
    runner.stage(out_dir)
    return bisect_heap(lambda heap: trains_in(out_dir, heap, frozen=frozen), lo, hi, step)


def bisect_heap(trains, lo, hi, step=1024):
    """The smallest heap in (lo, hi], on a grid of step bytes, for which trains(heap) is
    true (training needs no more when given more), or None when trains(hi) is not: the
    bisection every board's smallest-heap measurement shares (unix builds here, the
    emulated Pico in pico.py, the emulated Cortex-M0 in tests/support/m0board.py)."""
    if not trains(hi):
        return None
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if trains(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------- the planner
# Calibrated on unix MicroPython 1.29 (64-bit) against smallest_heap() for the reference
# models (bench/memory.py prints the comparison); see docs/memory.md.
BLOCK = 32                      # GC block: 4 machine words on the 64-bit unix port
ARRAY_OVERHEAD = {'fallback': 224, 'ulab': 64}   # object + shape/strides per array
CODE_PER_MPY_BYTE = 1.875       # resident heap per byte of .mpy imported (mpy-cross -O3)
# interpreter, train.py stub, files, json, import holes.  +2 KB (issue 15): the zoo's
# small models (Keras MLP, LayerNorm+GELU block) needed 4-6 KB more than planned once the
# model tables were counted as utrain.flat now holds them (the old per-option boxed
# floats had covered it); more would put the digits CNN's plan over the 96 KB target
# (tests/planner/test_memory.py), so the 64-bit plans of those two stay 1-3 % under
# (docs/memory.md); 32-bit +3 KB for the same reason (there they are covered)
BASE = 16 * 1024 + 512     # (+1 KB, session 5: ELU's kernel entry left the digits MLP, Adam b1, 192 B under; its need moves by 0.5 KB run to run)
# npkern (the fallback's native loops): on the unix port its machine code lies outside
# the GC heap; its module table and constants stay (measured).  A board that loads
# native code into its heap (rp2) needs its .mpy size on top.
NATIVE_KERNELS = 5 * 1024
# utrain frozen into the firmware (boards/freeze.md, backend '...-frozen'): bytecode
# stays in flash; module dicts, function and class objects are made in the heap
FROZEN_CODE_PER_MPY_BYTE = 0.35
BASE_FROZEN = 15 * 1024
# the file object and chunk generator while streaming, by word size and file system: on
# a 64-bit port 2 KB (not re-measured); on 32-bit, a littlefs board's open file holds its
# cache buffer besides (1 KB, as before), a unix build's file object is 32 B and the
# chunk generator 80-150 B (measured, mpu32 and mpu32-ulab): 256 B there (1 KB had
# planned the 32-bit ulab 16x16 CNN's streamed cell 1.22x, the same net ranked 1.19x)
STREAM_OVERHEAD = {(8, 'os'): 2048, (8, 'littlefs'): 2048, (4, 'os'): 256, (4, 'littlefs'): 1024}
# one more open file (an int8 net's second handle on q8.req, utrain.q8 Q8Net.rs): its
# object, and on littlefs its 1 KB cache (measured: 1168 B on the emulated Pico, 64 B on
# 64-bit unix, 32 B on mpu32)
OPEN_FILE = {(8, 'os'): 64, (8, 'littlefs'): 1232, (4, 'os'): 32, (4, 'littlefs'): 1168}
# an int8 plan's part for the save after an epoch
SAVE = 'the save after an epoch (the file written, offset tables, CRC buffer)'
SLACK = 0.06                    # fragmentation allowance on the data held all run
# ... and on the per-sample working set: its temporaries are freed between survivors
# (floats, small arrays, saved activations), leaving runs too short for the next array.
# 0.3 before training collected garbage as it goes (run.gc_every, issue 14): with it the
# CNNs' smallest heaps fell 10-25 KB and 0.3 planned 1.2-1.45x of them
WS_SLACK = 0.1
# ... and both without those collections (run.gc_every 0: the digits MLP, whose arrays
# are small): with the figures above their smallest heaps came within 1 % of the plan
SLACK_NOGC, WS_SLACK_NOGC = 0.15, 0.4
# ... and on a row-band group (host_tools/graph/bands.py) on top: its windows and strips are
# made and freed every sample between the step's other arrays; the Keras MobileNetV2 on
# the 32-bit stock build failed at 318 and 331 KB but trained at 312 and 324-328 KB
BAND_SLACK = 0.1
# utrain.prefix (--cache, --cache-on-host) is imported at the first pass over a dataset,
# into a heap that holds the training state already: its loader's transient (the .mpy
# read, its code before it is resident) comes on top of its resident code, planned as
# this many times that (issue 28's sweep: the Keras MLP, last:2 on 64-bit, needed 6 KB
# (host cache) and 10 KB (board cache) more than planned, 0.96-0.99x); per word size: on
# the 32-bit builds importing utrain.prefix (after utrain.xnp) needs no heap beyond its
# resident code (32-bit ulab: 1.8 KB more smallest heap, 0.92 bytes per .mpy byte
# against 1.37 resident; the fallback: 0.1 KB), and the host-cache cells' phase before
# training needs what the whole run needs (32-bit ulab: 52-66 KB, within 1 KB): 1.6
# there planned them 1.22-1.27x
PREFIX_LOAD = {8: 1.6, 4: 0}
# ulab's conv steps (utrain.ulconv, ulmono, convwalk): a tap's product a piece of output
# rows at a time (optable's piece): one at a time, added into the output in place (a
# 16x16x8 conv's 8 KB products in one piece needed 6 KB more smallest heap than 2 KB pieces)
ULAB_PIECES = 1
CORE_MODULES = ('__init__', 'run', 'xnp', 'model', 'sink', 'trainer', 'losses', 'op_act',
                'optim', 'data', 'wof')
# Per op, the planner reads its row in optable.SPECS (kernel module, temporaries, tap
# views, how the weight gradient is handed over), never the op's name.


# ---------------------------------------------------------------- the board planned for
# Board-level figures (issue 14).  The constants above are the 64-bit unix port's; a
# 32-bit board has half-size words, so object and array headers, the GC block (4 words)
# and the code's resident heap per .mpy byte shrink (measured on 32-bit unix
# MicroPython 1.28 against smallest_heap(), docs/memory.md).
WORD_FIGURES = {
    8: dict(block=BLOCK, overhead=ARRAY_OVERHEAD, code=CODE_PER_MPY_BYTE, base=BASE,
            native=NATIVE_KERNELS, frozen_code=FROZEN_CODE_PER_MPY_BYTE, base_frozen=BASE_FROZEN,
            # the fallback's arrays: the load's holes (load_holes; measured on the digits
            # MLP, PyPI's 64-bit build: beyond the data held at the first step, its load
            # needed 12-15 KB and Adam's first sample at batch 1 18 KB, where the plan had
            # 9-13 KB: SGD b1 0.997x, Adam b1 1.003-1.011x, both moving with the folder's path)
            arrays={'fallback': dict(holes=16 * 1024)}),
    # (base: 15 KB as measured before the model's tables were planned apart, less their
    # share in it; 12 KB left the digits MLP on 32-bit ulab no margin)
    4: dict(block=16, overhead={'fallback': 112, 'ulab': 48}, code=1.37, base=17 * 1024,
            native=4 * 1024, frozen_code=0.26, base_frozen=13 * 1024,
            # ulab's arrays: the interpreter's own share; no load-holes floor, as for the
            # fallback (load_holes: on both 32-bit builds the base holds the load's holes)
            arrays={'ulab': dict(base=14 * 1024)}),
}
# A board with a littlefs file system (rp2, esp32: boards.json "fs") holds its caches
# and each open file's buffers in the heap; the unix port's files are the OS's
# (measured: emulated Cortex-M0 against 32-bit unix, both with ulab).
LITTLEFS = 6 * 1024


class Target(dict):
    """What the plan is for: word (bytes), block (GC block bytes), native ('heap': native
    .mpy code is loaded into the GC heap, as on rp2; 'outside': the unix port, ESP32's
    IRAM), arch (mpy-cross -march of that native code), fs ('littlefs' or 'os') and name
    (printed by prepare)."""


def target(board=None) -> Target:
    """The board the plan is for: a boards/boards.json profile (its word, gc_block,
    native_code, fs), else the simulated board `run` uses (unix MicroPython: its word
    size asked once; native code and files outside the heap)."""
    if isinstance(board, Target):
        return board
    profile = None
    if board:
        profiles = runner.boards()
        board = runner.board_name(board, profiles)
        profile = profiles[board]
    if profile and profile.get('word'):
        word = int(profile['word'])
        t = Target(word=word, block=int(profile.get('gc_block', 4 * word)),
                   native=profile.get('native_code', 'outside'), arch=profile.get('mpy_arch'),
                   fs=profile.get('fs', 'littlefs'))
        t['name'] = (f'{board}: {8 * word}-bit, {t["block"]} B GC blocks, native code '
                     + ('in the heap' if t['native'] == 'heap' else 'outside the heap')
                     + f', {t["fs"]} files')
        return t
    word = runner.simulator_word()
    t = Target(word=word, block=4 * word, native='outside', arch=None, fs='os')
    exe = runner.find_micropython() or 'micropython'
    t['name'] = f'the simulated board: {os.path.basename(exe)}, unix {8 * word}-bit'
    return t


def sim_target(word: int) -> Target:
    """The simulated board (unix MicroPython) with `word`-byte words: native code and
    files outside the heap."""
    return Target(word=word, block=4 * word, native='outside', arch=None, fs='os',
                  name=f'unix MicroPython, {8 * word}-bit')


def board_limit(prof, heap) -> int:
    """The heap a plan on board profile prof must fit (bytes): its heap, and its
    heap_budget for model and training state beside the plan's code and interpreter
    (prepare's heap_limit, without a budget)."""
    fixed = heap['parts']['code'] + heap['parts']['interpreter']
    return min(runner.size_bytes(prof['heap']), fixed + int(prof['heap_budget']))


def plans_by_target(price, over=None) -> dict:
    """The same run priced for every target `run --board` may need (issue 31): {'sim32',
    'sim64': the simulated board with 4- and 8-byte words, and each board profile with a
    word size: planned total bytes}; price(Target) -> a heap plan.  runner.sim_heap()
    scales a board's heap by sim / board for a simulated board whose word size differs.
    over (a dict): filled with {board: [plan, its limit]} for each board profile whose
    limit (board_limit: its heap, its heap_budget beside the code) the plan
    exceeds (issue 29: --select without --board chose a 254 KB plan, over an RP2040's)."""
    out, seen = {}, {}
    for w in (4, 8):
        out[f'sim{8 * w}'] = price(sim_target(w))['total']
    for name, prof in runner.boards().items():
        if prof.get('word'):
            t = target(name)
            key = (t['word'], t['block'], t['native'], t['arch'], t['fs'])
            if key not in seen:
                seen[key] = price(t)
            h = seen[key]
            out[name] = h['total']
            lim = board_limit(prof, h)
            if over is not None and h['total'] > lim:
                over[name] = [h['total'], lim]
    return out


def native_mpy_size(arch, name='npkern') -> int:
    """Size of a native module (npkern; q8kern: int8 runs) as .mpy for arch (what rp2
    loads into its heap; cached)."""
    import tempfile
    src = os.path.join(runner.PACKAGE, name + '.py')
    st = os.stat(src)
    cache = os.path.join(tempfile.gettempdir(), 'utrain-mpy-%d' % os.getuid())
    os.makedirs(cache, exist_ok=True)
    dst = os.path.join(cache, '%s-%s-%d-%d-s.mpy' % (name, arch, st.st_mtime_ns, st.st_size))
    if not os.path.exists(dst):
        runner._mpy_cross(src, dst, arch)
    return os.path.getsize(dst)


def array_bytes(n: int, backend='fallback', t=None) -> int:
    """Heap one float32 array of n elements takes, object overhead included, on target
    t (default: the 64-bit unix port)."""
    f = WORD_FIGURES[t['word'] if t else 8]
    return f['overhead'][backend] + -(-4 * n // f['block']) * f['block']


def python_part_size(name) -> int:
    """.mpy size of native module name (micro/utrain/NAME.py) without its viper functions:
    the bytecode a port that keeps native code outside the GC heap (unix) still loads
    into it (the layer's forward and gradient around the kernels; cached)."""
    import re
    import tempfile
    src = os.path.join(runner.PACKAGE, name + '.py')
    st = os.stat(src)
    cache = os.path.join(tempfile.gettempdir(), 'utrain-mpy-%d' % os.getuid())
    os.makedirs(cache, exist_ok=True)
    dst = os.path.join(cache, '%s-%d-%d-py.mpy' % (name, st.st_mtime_ns, st.st_size))
    if not os.path.exists(dst):
        with open(src) as fh:
            text = fh.read()
        # each viper function: its decorator to the next top-level line
        text = re.sub(r'@micropython\.viper\n(?:.*\n)(?:(?:[ \t].*|)\n)*', '', text)
        tmp = '%s.%d' % (dst, os.getpid())
        with open(tmp + '.py', 'w') as fh:
            fh.write(text)
        runner._mpy_cross(tmp + '.py', tmp, name='utrain/' + name + '.py')
        os.remove(tmp + '.py')
        os.replace(tmp, dst)
    return os.path.getsize(dst)


def mpy_sizes() -> dict:
    """{module: .mpy size} of micro/utrain, compiled as `run` stages it (cached)."""
    import tempfile
    cache = os.path.join(tempfile.gettempdir(), 'utrain-mpy-%d' % os.getuid())
    os.makedirs(cache, exist_ok=True)
    out = {}
    for name in sorted(os.listdir(runner.PACKAGE)):
        if not name.endswith('.py') or name in runner.ASM:    # (staged for some archs only)
            continue
        src = os.path.join(runner.PACKAGE, name)
        st = os.stat(src)
        dst = os.path.join(cache, '%s-%d-%d%s-s.mpy' % (name[:-3], st.st_mtime_ns, st.st_size,
                                                       ''.join(runner.MPY_FLAGS)))
        if not os.path.exists(dst):
            # built under a name of this process's own, then renamed: runs in parallel
            # (pytest -n, two prepares) share the cache
            tmp = '%s.%d' % (dst, os.getpid())
            if name in runner.NATIVE:
                # counted as bytecode (a firmware without the native emitter): on the unix
                # port its native code lies outside the GC heap
                runner._bytecode_only(src, tmp + '.py')
                runner._mpy_cross(tmp + '.py', tmp, name='utrain/' + name)
                os.remove(tmp + '.py')
            else:
                runner._mpy_cross(src, tmp)
            os.replace(tmp, dst)
        out[name[:-3]] = os.path.getsize(dst)
    return out


class _Run:
    """What every phase of plan_heap reads: the graph g, its plan, the settings, the
    target t and its word figures f, the device shapes and sizes, the tensor kinds,
    the array kind ('fallback'/'ulab'), frozen (utrain frozen into the firmware), start
    (the first op the board runs: settings['prefix'], a host-made prefix cache) and A(n),
    the heap one n-element array takes."""

    def __init__(self, g, plan, settings, backend, t):
        from ..graph.passes import device_shapes
        from ..files.flatmodel import tensor_kinds
        self.g, self.plan, self.s, self.t = g, plan, settings, t
        self.arrays, _, self.frozen = backend.partition('-')
        f = WORD_FIGURES[t['word']]         # (with the array kind's own figures)
        self.f = dict(f, **f.get('arrays', {}).get(self.arrays, {}))
        self.shapes = device_shapes(g)
        self.size = [r * c for r, c in self.shapes]
        self.kinds = tensor_kinds(g, plan)
        self.start = settings.get('prefix', 0)
        self.prefix_code = 0        # (code_parts: what utrain.prefix.drop frees)
        self.late_code = 0          # (code_parts: code imported after the model's arrays)
        self.largest = 0            # (the working set's largest array: forward_peak, backward_peak)
        self.every = 0              # (run.gc_every's bytes, once a first pass planned them)
        self.views = set()          # (forward_peak: views whose floats are held anyway)
        self.held = None            # (saved_floats)
        self.arena = None           # (forward_peak: its arrays as the pass leaves them)
        self.A = lambda n: array_bytes(n, self.arrays, t)   # noqa: E731


def per_sample(r, held):
    """(parts: held's and the per-sample ones, the collection share, the forward
    peak's op): the working set, the fragmentation allowance, a prefix phase's excess
    and the load's holes on top of the data held all run."""
    parts = dict(held)
    fwd, peak_at, x_in = forward_peak(r)
    parts['working set (activations, temporaries, loss)'] = working_set(r, fwd, backward_peak(r), x_in)
    collect = gc_every(r.g, sum(parts.values()))
    parts['fragmentation allowance'] = fragmentation(parts, collect)
    prefix_phase(r, parts, collect)
    model_load(r, parts)
    load_holes(r, parts)
    return parts, collect, peak_at


def plan_heap(g, plan, settings, backend='fallback', board=None) -> dict:
    """Predicted smallest heap (bytes) for training the prepared model on `board` (a
    boards.json profile; None: the simulated board in use), with its parts: {'total':
    ..., 'parts': {name: bytes}, 'target': what it planned for}.  backend: 'fallback'
    or 'ulab', '-frozen' appended for a firmware with utrain frozen in.
    settings['prefix'] = k: a frozen-prefix cache made on the host, the board runs ops
    k.. only (the cut's buffers held all run instead of the input sample's).
    The phases, each a function below: code_parts, table_bytes, weight_parts,
    state_parts, forward_peak, backward_peak, working_set, fragmentation, prefix_phase."""
    t = board if isinstance(board, Target) else target(board)
    r = _Run(g, plan, settings, backend, t)
    held = code_parts(r)
    held['model tables'] = table_bytes(r)
    held.update(weight_parts(r))
    held.update(state_parts(r))
    if settings.get('dtype', 'float32') != 'float32' and not r.start:
        held['8-bit input buffer'] = sample_bytes(r)
    parts, collect, peak_at = per_sample(r, held)
    total = int(sum(parts.values()))
    # a run that collects every total / collect bytes: an op whose temporaries are that
    # large holds only those it has live at once (spec.fwd_live); planned again with them
    # (the plan and its gc_every only fall, so those ops stay at least that large)
    from ..graph.optable import SPECS
    every = gc_bytes(g) if collect else 0
    if collect and any(SPECS[op.name].fwd_live and r.A(r.size[op.outputs[0]]) >= every
                       for op in g.ops[r.start:]):
        r.every = every
        parts, collect, peak_at = per_sample(r, held)
        total = int(sum(parts.values()))
    # train.json's run.gc_every is bytes (gc_bytes: the model's, not this plan's), the
    # same in every heap the run is given (utrain/run.py gc_every, utrain/model.py)
    out = {'total': total, 'parts': parts, 'backend': backend, 'target': t['name'],
           'gc_every': every, 'peak_op': peak_at, 'largest': r.largest,
           'steps': r.steps}
    if r.start:
        out['prefix_phase'] = int(r.phase_a)
    return out



def sample_bytes(r) -> int:
    """The byte buffer utrain.data.Dataset.xq makes at a run's first input read of an
    8-bit dataset (uint8 / int8 samples, --dtype or chosen for the board's flash) and
    keeps all run: one byte an input value and an array's header (bytes(n) copied into
    it: the pair's run for a moment, planned once).  None where the run reads only
    targets (a prefix cache the host made)."""
    n = r.size[r.g.inputs[0]]
    return r.A(0) + -(-n // BLOCK) * BLOCK


# What survives the board's Fisher phase into training: the interned names of
# utrain/fisher.py and utrain/chosen.py (MicroPython never frees them) and the chosen set;
# and the holes the phase's net leaves among them.  Measured on unix MicroPython (64-bit)
# with bench/transfer.py --measure: the smallest heap of --select board against --ranks
# of the same candidates trained without the pass.
FISHER_RESIDUE = 1024


def add_fisher(heap, g, p, backend, board=None):
    """The board's Fisher phase (utrain/fisher.py with fpick.py, run.py) runs before the Trainer, on a
    net of its own that is garbage when training allocates: its peak is the training
    plan's less what only training holds (optimizer state, gradient sums, the trainer's
    and optimizer's code) plus its own code, every candidate's output kept until the
    backward pass reaches it (those the backward list does not save anyway) and two
    potentials per channel (all samples', half of them's).  Planned: the larger of the two peaks, and a residue."""
    from ..graph.passes import device_shapes
    arrays, _, frozen = backend.partition('-')
    t = target(board)
    f = WORD_FIGURES[t['word']]
    per = f['frozen_code'] if frozen else f['code']
    sizes = mpy_sizes()
    shapes = device_shapes(g)
    kept = 0
    for i in p.trainable_ops:
        o = g.ops[i].outputs[0]
        rows, cols = shapes[o]
        kept += 2 * array_bytes(cols, arrays, t)     # its potentials, and a half's
        if o not in p.saved:
            kept += array_bytes(rows * cols, arrays, t)
    parts = heap['parts']
    phase = (heap['total'] - parts.get('optimizer state', 0) - parts.get('gradient sums', 0)
             - int(per * (sizes.get('trainer', 0) + sizes.get('optim', 0)))
             + int(per * (sizes.get('fisher', 0) + sizes.get('fpick', 0))) + kept)
    extra = max(0, phase - heap['total']) + FISHER_RESIDUE
    heap['parts']['Fisher pass (beyond training: its peak before the Trainer, residue)'] = extra
    heap['fisher_phase'] = phase
    heap['total'] += extra
    return heap

def by_rows(r, op) -> bool:
    """Does the board run op reading a frozen constant a few rows at a time
    (utrain.stream: with --stream, larger than its CHUNK, at one of the kernel's ROWS)?"""
    from ..graph.optable import SPECS
    from ..files.flatmodel import CONST
    from ..target.device import module
    if not r.s.get('stream') or op.index < r.start:
        return False
    chunk = module('stream').CHUNK
    spec = SPECS[op.name]
    return any(pos in spec.stream_rows and k >= 0 and r.kinds[k] == CONST and r.size[k] > chunk
               for pos, k in enumerate(spec.inputs(op)))


def step_modules(r) -> list:
    """The modules the kernels' steps import at their first call (ulab's conv steps;
    utrain.convrows for a conv whose weight is streamed by rows, which runs none of
    the others), sorted: train.json's run.steps, which utrain.run imports with the rest
    of the code before the model loads.  Imported at the first call instead, inside the
    first sample, their code stayed where that sample's arrays had been and cut the runs
    every later sample needs (ho_cnn5bn, Adam batch 4 on 32-bit ulab: 349 KB needed
    against 338 planned)."""
    from ..graph.optable import SPECS
    g = r.g
    banded = {i for b_lo, b_hi, _ in r.plan.bands for i in range(b_lo, b_hi)}
    mods = set()
    for op in g.ops[r.start:]:          # (a host-made cache: the board runs none before)
        spec = SPECS[op.name]
        if spec.kernel == 'op_conv' and by_rows(r, op):
            mods.add('convrows')
        elif spec.steps:
            mods.update(spec.steps(op, g, r.arrays, op.index in banded))
    return sorted(mods - {SPECS[op.name].kernel for op in g.ops})


def code_parts(r) -> dict:
    """{'code': the resident heap of the utrain modules the run imports (and npkern's
    native code where it lies in the heap), 'interpreter': the interpreter's own share
    (littlefs's buffers on a board with one)}."""
    from ..graph.optable import SPECS
    g, plan, s, f, t = r.g, r.plan, r.s, r.f, r.t
    mods = set(CORE_MODULES) | {SPECS[op.name].kernel for op in g.ops}
    if r.arrays == 'fallback':
        mods.add('npfallback')
    r.steps = step_modules(r)
    mods.update(r.steps)
    if s.get('stream'):
        mods.add('stream')
    late = 0
    if s.get('cache'):
        mods.add('prefix')
        late = PREFIX_LOAD[t['word']] * f['code'] * mpy_sizes().get('prefix', 0)
    # a host-made cache: utrain.prefix.drop forgets the kernel modules only the prefix's
    # ops use before training (the modules their steps import stay)
    kept = {SPECS[op.name].kernel for op in g.ops[r.start:]}
    gone = {SPECS[op.name].kernel for op in g.ops[:r.start]} - kept
    if s.get('schedule', 'constant') != 'constant' or s.get('warmup'):
        mods.add('sched')               # the learning-rate schedule (docs/training.md)
    if plan.bands:
        mods.add('bands')
    sizes = mpy_sizes()
    mpy = sum(sizes.get(m, 0) for m in mods)
    if s.get('cache') and not r.frozen:     # (utrain.prefix: imported after the model loads)
        r.late_code = int(f['code'] * sizes.get('prefix', 0))
    if r.frozen:
        parts = {'code': int(f['frozen_code'] * mpy), 'interpreter': f['base_frozen']}
        r.prefix_code = int(f['frozen_code'] * sum(sizes.get(m, 0) for m in gone))
    else:
        r.prefix_code = int(f['code'] * sum(sizes.get(m, 0) for m in gone))
        # npkern's native code: in the GC heap on rp2 (its whole .mpy), else outside
        native = (native_mpy_size(t['arch']) if t['native'] == 'heap' and t['arch'] else f['native'])
        native = native if r.arrays == 'fallback' else 0
        if t['native'] == 'heap' and t['arch'] in runner.ASM['npasm.py']:
            native += native_mpy_size(t['arch'], 'npasm')       # xnp's Thumb kernels (RP2040)
        parts = {'code': int(f['code'] * mpy + native + late), 'interpreter': f['base']}
    if t['fs'] == 'littlefs':
        parts['interpreter'] += LITTLEFS
    return parts


def table_bytes(r) -> int:
    """The model's tables (utrain.flat): per op a tuple of (code, inputs, outputs,
    options), its list slots (ops, kernel modules, both free lists) and backward-list
    entry; ops with equal options share one options object (a float32 array, one boxed
    float, or the empty tuple), and each op's free lists are tuples of what dies there
    (none: the shared empty tuple); tensors of one shape share its tuple.  About 1 KB
    per conv op on 64-bit: 95 KB for a MobileNetV2, which trains from a prefix cache in
    266 KB (the part the other terms left unplanned); the unrolled LSTM's 265 ops:
    38 KB on a 32-bit board (measured: Net less its weights)."""
    from ..graph.optable import SPECS
    from ..files.flatmodel import CONST, ACT, grad_inputs
    g, plan, kinds = r.g, r.plan, r.kinds
    w, B = r.t['word'], r.t['block']
    tup = lambda n: -(-(2 * w + w * n) // B) * B     # noqa: E731
    blk = lambda n: -(-n // B) * B                    # noqa: E731
    tables, seen_opts = 0, set()
    dies = {}
    for k, i in plan.last_use.items():
        if kinds[k] == ACT:
            dies[i] = dies.get(i, 0) + 1
    for op in g.ops:
        spec = SPECS[op.name]
        opts = tuple(spec.options(op, g))
        no = len(opts)
        tables += tup(4) + tup(len(spec.inputs(op))) + tup(len(op.outputs)) + 4 * w
        if no and opts not in seen_opts:
            seen_opts.add(opts)
            tables += (blk(4 * w) + blk(4 * no)) if no > 1 else tup(1) + B
        if op.index in dies:
            tables += 2 * tup(dies[op.index])
        if r.s.get('stream'):     # utrain.stream's per-op list of (tensor, slot, size)
            nc = sum(1 for k in spec.inputs(op) if k >= 0 and kinds[k] == CONST)
            tables += tup(nc) + nc * tup(3) + w
    tables += len(plan.backward) * (tup(2) + w)
    gin = len(grad_inputs(g, plan))     # utrain.flat's net.gin: a set, when it has any
    if gin:
        tables += blk(4 * w) + blk(w * 2 * gin)
    return tables + len(r.shapes) * 3 * w + len(set(r.shapes)) * tup(2)


def weight_parts(r) -> dict:
    """The trainable weights and the frozen ones: held in RAM, or with --stream the
    slot buffers utrain.stream.Stream reads them into (slot j holds the largest j-th whole
    constant of an op the board runs; constants the kernel reads by rows, its ROWS,
    come through one CHUNK buffer)."""
    from ..graph.optable import SPECS
    from ..files.flatmodel import CONST
    g, kinds, size, A = r.g, r.kinds, r.size, r.A
    parts = {'trainable weights': sum(A(size[k]) for k in r.plan.params)}
    if not r.s.get('stream'):
        parts['frozen weights'] = sum(A(size[k]) for k, kind in enumerate(kinds) if kind == CONST)
        return parts
    from ..target.device import module
    CHUNK = module('stream').CHUNK
    slots, big = [], 0
    for op in g.ops[r.start:]:
        rows = SPECS[op.name].stream_rows
        mine = []
        for pos, k in enumerate(SPECS[op.name].inputs(op)):
            if k >= 0 and kinds[k] == CONST:
                if pos in rows and size[k] > CHUNK:
                    big = max(big, r.shapes[k][1], CHUNK)
                else:
                    mine.append(size[k])
        for j, n in enumerate(mine):
            if j == len(slots):
                slots.append(n)
            else:
                slots[j] = max(slots[j], n)
    parts['frozen weights (streamed: slot buffers)'] = (sum(A(n) for n in slots) + (A(big) if big else 0)
                                                        + STREAM_OVERHEAD[r.t['word'], r.t['fs']])
    return parts


def trained_elements(r) -> dict:
    """{parameter: elements that train}: a ranked one's channel window (its rows, or a
    depthwise weight's columns), else all of it."""
    out = {}
    for k in r.plan.params:
        window = r.plan.ranks.get(k)
        if window:
            ax, c_lo, c_hi = window
            out[k] = (c_hi - c_lo) * (r.shapes[k][1] if ax == 0 else r.shapes[k][0])
        else:
            out[k] = r.size[k]
    return out


def state_parts(r) -> dict:
    """The training state held all run: optimizer state (of the trained channels),
    gradient sums, the buffers a kernel keeps (op_split's) and the saved activations."""
    from ..graph.optable import SPECS
    from ..target.device import module
    g, plan, size, A = r.g, r.plan, r.size, r.A
    state = trained_elements(r)
    opt = r.s['optimizer']
    n_state = 2 if opt in ('adam', 'adamw') else 1 if opt == 'rmsprop' or (opt == 'sgd' and r.s.get('momentum')) else 0
    parts = {'optimizer state': n_state * sum(A(state[k]) for k in plan.params)}
    # a weight several ops read (an unrolled RNN's W_hh) is summed over its uses even at
    # batch 1, and then every weight's gradient is summed (Trainer.configure)
    uses = [k for op in g.ops for k in op.inputs if k in plan.params]
    shared = len(uses) > len(set(uses))
    # a kernel with WGRAD_WHOLE (op_conv) sums its weight whole, ranked or not (Sums.alloc)
    whole = {op.inputs[1] for op in g.ops
             if getattr(module(SPECS[op.name].kernel), 'WGRAD_WHOLE', False)}
    parts['gradient sums'] = 0 if int(r.s['batch']) == 1 and not shared else sum(
        A(size[k] if k in whole else state[k]) for k in plan.params)
    # buffers a kernel keeps all run (op_split's input-sized gradient buffer: its row's
    # held), made at the op's first forward pass: none for the ops a host-made prefix
    # cache stands in for, which the board never runs (the zoo GRU's and LSTM's unrolled
    # gate splits, all below last:2: 27.6 and 22.8 KB of their --cache-on-host plans on
    # 32-bit, 1.24x and 1.20x their need; docs/memory.md)
    splits = sum(SPECS[op.name].held * A(size[SPECS[op.name].inputs(op)[0]])
                 for op in g.ops[r.start:])
    if splits:
        parts['split gradient buffers'] = splits
    # a view's output (utrain.op_shape: a reshape) shares its input's floats: saved with
    # it, only its header (the 16x16 CNN's pooled output, saved by the pool and, as the
    # classifier's input, by the FC: 2 KB twice), through views of views (held_views: a
    # Keras Conv1D's RESHAPE and EXPAND_DIMS between its conv and the next op, whose
    # output the next op saves: the held-out Conv1D net's two maps counted twice, 6.2 KB
    # of its SGD b1 plan on 32-bit, 1.22x its need, session 30)
    viewed = held_views(r, False)
    parts['saved activations'] = sum(A(0 if k in viewed else size[k]) for k in plan.saved)
    return parts


def band_groups(r):
    """Row-band groups the board runs (host_tools/graph/bands.py) -> ({first op: group cost},
    tensors made and dropped inside a group, ops inside a group): their windows, the
    tensors they hand on and one op's strip temporaries at once; only the handed-on
    tensors stay live."""
    g, plan = r.g, r.plan
    groups, inner, banded = {}, set(), set()
    if plan.bands:
        from ..graph.bands import group_cost, stand_in
        net = stand_in(g, plan)
        for b_lo, b_hi, rows in plan.bands:
            if b_lo >= r.start:
                groups[b_lo] = group_cost(net, b_lo, b_hi, rows, r.A)[0]
                made = {t for op in g.ops[b_lo:b_hi] for t in op.outputs}
                inner |= {t for t in made if b_lo <= plan.last_use.get(t, len(g.ops)) < b_hi}
                banded.update(range(b_lo, b_hi))
    return groups, inner, banded


def cut_tensors(r) -> set:
    """The tensors a host-made prefix cache hands ops `start`.. (none without one)."""
    return prefix_cut(r.g, r.start)


def prefix_cut(g, lo) -> set:
    """The tensors ops lo.. of graph g read that the ops before lo or the model input make:
    what a prefix cache of ops 0..lo-1 holds a sample (none for lo 0)."""
    from ..graph.optable import SPECS
    if not lo:
        return set()
    made = set(g.inputs) | {o for op in g.ops[:lo] for o in op.outputs}
    return {k for op in g.ops[lo:] for k in SPECS[op.name].inputs(op) if k in made}


def op_temps(r, spec, op, native, plain):
    """(output-sized, input-sized temporaries, bytes of pieces) an op's kernel makes in
    one pass (native, plain: its OpSpec figures for that pass): the fallback's native
    loops write into the output (native); ulab's conv steps add a tap's product a piece
    of rows at a time (spec.piece: ULAB_PIECES pieces beside the native figures); else
    the plain figures.  (The 16x16 CNN's conv planned as three 8 KB products under ulab:
    1.25-1.32x its smallest 32-bit heap.)"""
    if r.arrays == 'fallback' and native:
        return native + (0,)
    if r.arrays == 'ulab' and spec.piece and native:
        return native + (ULAB_PIECES * r.A(spec.piece(op, r.g)),)
    return plain + (0,)


def fwd_temps(r, spec, op):
    """op_temps of the forward pass: the op's own figures where they depend on the op
    and the array kind (spec.fwd_of: the element-wise and copy kernels, whose blocks,
    broadcast blocks and fused activation decide them), those it holds at once
    (spec.fwd_live) where the run collects before each of them (r.every), else op_temps'."""
    if spec.rows_of and by_rows(r, op) or spec.fwd_of:     # (streamed by rows: convrows')
        fo, fi, n = spec.rows_of(op, r.g, r.arrays, False) if spec.rows_of and by_rows(r, op) \
            else spec.fwd_of(op, r.g, r.arrays)
        return fo, fi, r.A(n) if n else 0
    if spec.fwd_live and r.every and r.A(r.size[op.outputs[0]]) >= r.every:
        return spec.fwd_live + (0,)     # (a collection before each: the dead ones gone)
    return op_temps(r, spec, op, spec.fwd_native, spec.fwd)


def forward_peak(r):
    """The forward pass's peak per-sample working set from op `start` on: activations in
    flight (the cut's buffers from a prefix cache, else the sample) and the op's output
    and temporaries (a band group: its windows).  Returns (peak, the op at it, the
    sample buffer's elements: 0 when the cut or a band group's strips replace it).
    Its phases: forward_start (what is in flight before the first op), op_need (one
    op's), forward_frees (what the op leaves freed)."""
    from ..graph.optable import SPECS
    g, plan, size, A = r.g, r.plan, r.size, r.A
    live, x_in, cut = forward_start(r)
    peak = need = peak_at = 0
    groups, inner, banded = band_groups(r)
    r.views = held_views(r, g.inputs[0] in live)
    arena = Arena(A(0))         # (the pass's arrays' data where the board puts it)
    for k in sorted(live):
        arena.alloc(A(size[k]), k)
    for op in g.ops[r.start:]:
        cur = sum(A(0 if k in r.views else size[k]) for k in live if k not in plan.saved)
        kept = in_place(r, op, live, cut)       # (its output is its dying input's array)
        if op.index in groups:      # its windows are made and freed every sample
            need = cur + int(groups[op.index] * (1 + BAND_SLACK))
        elif op.index not in banded:
            need = op_need(r, SPECS[op.name], op, cur, arena, kept)
        if need > peak:
            peak, peak_at = need, op.index
        kept = kept and op.index not in banded
        if kept and SPECS[op.name].inputs(op)[0] in arena.at:
            arena.at[op.outputs[0]] = arena.at.pop(SPECS[op.name].inputs(op)[0])
        elif op.index in banded:
            for k in op.outputs:
                if k not in inner and k not in r.views:
                    arena.alloc(A(size[k]), k)
        live.update(k for k in op.outputs if k not in inner)
        was = set(live)
        forward_frees(r, op, live, cut)
        for k in was - live:
            arena.free(k)
    r.arena = arena
    return peak, peak_at, x_in


def in_place(r, op, live, cut) -> bool:
    """Does op write its output into its first input's array (spec.in_place), that input
    dying here (forward_frees' test: the device's rt.dead)?  Its output is then no array
    of its own, and the input's is no hole."""
    from ..graph.optable import SPECS
    spec = SPECS[op.name]
    return bool(spec.in_place and spec.in_place(op, r.g)) and \
        forward_frees(r, op, set(live), cut, first=True) != []


def held_views(r, sample) -> set:
    """Outputs of view ops (spec.view: a reshape, the same floats under another shape)
    whose floats are held all the forward pass anyway: a saved activation's or the
    sample's (through views of views): only their header counts.  (Counted as arrays of
    their own, a Keras Conv1D's EXPAND_DIMS and RESHAPE around its saved conv outputs
    stood at the held-out Conv1D net's forward peak: 1.2x on 32-bit.)"""
    from ..graph.optable import SPECS
    g = r.g
    held = set(r.plan.saved) | ({g.inputs[0]} if sample else set())
    out = set()
    for op in g.ops:
        if SPECS[op.name].view and op.inputs[0] in held | out:
            out.add(op.outputs[0])
    return out


def forward_start(r):
    """(live tensors, the sample buffer's elements, the cut) before op `start`: the cut
    of a host-made prefix cache (counted live), else the sample, which the first band
    group may read a strip at a time instead (neither then)."""
    g, plan = r.g, r.plan
    cut = cut_tensors(r)
    if r.start:
        return set(cut), 0, cut
    if plan.bands and plan.bands[0][0] == 0 and \
            plan.last_use.get(g.inputs[0], 0) < plan.bands[0][1]:
        return set(), 0, cut
    return {g.inputs[0]}, r.size[g.inputs[0]], cut


def op_need(r, spec, op, cur, arena, inplace=False):
    """The working set while op runs forward: the live data cur, its outputs (none where
    it writes into its dying input: in_place), its temporaries (fwd_temps), the tap views,
    and the heap its arrays cut beyond their bytes: where the arena places them
    (Arena.fresh: its outputs stay there, its temporaries go after it), at least the run
    fresh_run charges them against the free runs the pass's frees made (Arena.holes:
    freed neighbours merged, as the board merges them)."""
    from ..files.flatmodel import ACT
    A, size = r.A, r.size
    fo, fi, pc = fwd_temps(r, spec, op)
    o = op.outputs[0]
    if o in r.views:
        return cur + A(0)      # (a header over floats held anyway)
    ins = [k for k in spec.inputs(op) if k >= 0 and r.kinds[k] == ACT]
    n_in = A(max([size[k] for k in ins] or [0])) if fi else 0
    ins_a = [n_in] * fi
    wt = weight_temps(r, spec, op)
    out = [] if inplace else [A(size[o])]
    more = [A(size[k]) for k in op.outputs[1:]]
    # (its input-sized temporaries are one array: a depthwise multiplier M's spread copy
    # of x, op_conv.spread's [H*W, C*M], the only op that makes more than one)
    spread = [A(fi * max([size[k] for k in ins] or [0]))] if fi else []
    # an op whose arrays are its own figures (spec.fwd_of, rows_of) and which makes
    # output-sized temporaries (fo: a fused activation's) makes its output last: the
    # kernel's array (its steps' pieces made and dropped as they go), then the
    # activation's result (np.maximum(y, 0)) or an expression's value after its terms
    # (ELU), so those lie below it; else the output first (zeros the steps write into),
    # then the steps' pieces.  (Laid out output first, the 1-D depthwise-separable
    # net's convs' RELU results sat below their kernels' arrays, and its 24 KB depthwise
    # output was planned above a 16 KB hole where the board had put it: _dws1d's last two
    # ops streamed on the 32-bit fallback planned 1.23x its need, session 30.)  Not for a
    # saved output: laid out last, its kernel's array stays a hole under it all the
    # pass, and the plans rose by up to 26 KB (the held-out relu_cnn at SGD b1 on 32-bit
    # ulab), measured against no need; saved outputs keep the layout the sweep measured.
    last = fo and (spec.rows_of and by_rows(r, op) or spec.fwd_of) and o not in saved_floats(r)
    if last:        # (the pieces gone before the activation runs: no hole of theirs)
        temps = [arena.alloc(n) for n in [A(size[o])] * fo + spread + [wt] if n]
    if out:
        arena.alloc(out[0], o)
    for k, n in zip(op.outputs[1:], more):
        arena.alloc(n, k)
    if not last:
        temps = [arena.alloc(n) for n in [A(size[o])] * fo + spread + [pc, wt] if n]
    fresh = max(arena.fresh(), fresh_run(out + [A(size[o])] * fo + ins_a + [pc, wt], arena.holes()))
    for k in temps:
        arena.free(k)
    need = cur + sum(out) + fo * A(size[o]) + sum(ins_a) + sum(more) \
        + spec.taps * A(0) + pc + wt + fresh
    r.largest = max([r.largest, A(size[o]), pc] + ins_a)
    return need


def saved_floats(r) -> set:
    """The saved activations and the tensors whose floats a saved view holds (a
    reshape's input: held_views the other way)."""
    if r.held is None:
        from ..graph.optable import SPECS
        r.held = set(r.plan.saved)
        for op in reversed(r.g.ops):
            if SPECS[op.name].view and op.outputs[0] in r.held:
                r.held.add(op.inputs[0])
    return r.held


def weight_temps(r, spec, op, extra=0) -> int:
    """Bytes of the kernel's weight-sized temporaries (spec.wtemp, and extra more: the
    weight's gradient in the kernel's own layout)."""
    n = spec.wtemp + extra if spec.wtemp else 0
    ins = spec.inputs(op)
    return n * r.A(r.size[ins[1]]) if n and len(ins) > 1 and ins[1] >= 0 else 0


def forward_frees(r, op, live, cut, first=False) -> list:
    """The op's activation inputs it is the last reader of (not saved for the backward
    pass, not the sample or the cut): dropped from live; returns their sizes (bytes), the
    first input's first.  first: of the first input only."""
    from ..graph.optable import SPECS
    from ..files.flatmodel import ACT
    g, plan = r.g, r.plan
    out = []
    for k in SPECS[op.name].inputs(op)[:1 if first else None]:
        if k >= 0 and r.kinds[k] == ACT and plan.last_use.get(k) == op.index \
                and k not in plan.saved and k != g.inputs[0] and k not in cut and k in live:
            live.discard(k)
            out.append(r.A(r.size[k]))
    return out


SMALL = 512     # (Arena: an array's data this small goes into the load's small holes)


class Arena:
    """The working set's arrays laid out as MicroPython's gc places them: first fit (each
    array at the lowest address where a free run takes it), a freed array's blocks free
    at once and merged with free neighbours (the run collects before a large array).
    fresh() is the heap its arrays cut beyond their bytes: the free blocks below the
    highest live array, which no array took.  (A list of hole sizes had each freed array
    a hole of its own and every hole below the free heap: cat_skip's PAD, a 20.7 KB
    output after a 16.5 KB RELU, planned 4.4 KB beyond the 16.5 KB hole its conv left,
    failed on the 32-bit fallback with 11.6 KB free below the RELU's output and 17.6 KB
    above it: the hole lies under the RELU's array, not under the free heap.)
    An array of SMALL bytes of data or fewer is no part of it: first fit puts it in the
    small holes below the training's arrays, the load's (the 32-bit bases hold 9-9.5 KB
    of them: runs of 1 to some 30 blocks in the failing runs' heap maps).  (Laid out
    with the rest, a 1-D conv net's 128 B saved MEAN output stood between its freed
    24 KB maps, and MEAN's 24 KB gradient was planned above it: 1.28x its need on
    32-bit ulab.)"""

    def __init__(self, header=0):
        self.at = {}            # key: (address, bytes of its data)
        self.freed = {}         # address: bytes of the free run a free made (merged)
        self.header = header

    def alloc(self, n, key=None):
        key = object() if key is None else key
        n -= self.header if n > self.header else 0
        if n <= SMALL:
            return key
        a = 0
        for lo, m in sorted(self.at.values()):
            if lo - a >= n:
                break
            a = max(a, lo + m)
        self.at[key] = (a, n)
        return key

    def free(self, key):
        if key not in self.at:
            return
        a, n = self.at.pop(key)
        lo, hi = 0, None
        for b, m in self.at.values():
            if b + m <= a:
                lo = max(lo, b + m)
            elif b >= a + n:
                hi = b if hi is None else min(hi, b)
        if hi is None:
            hi = a + n          # (the free heap above: the hole ends with the array)
        for b in [b for b in self.freed if lo <= b < hi]:
            del self.freed[b]
        self.freed[lo] = hi - lo

    def fresh(self) -> int:
        return max([a + n for a, n in self.at.values()] or [0]) - sum(n for _, n in self.at.values())

    def holes(self) -> list:
        """The free runs frees made (merged with their neighbours), as the bytes of the
        array each would take (its header made apart)."""
        return [n + self.header for n in self.freed.values()]


def fresh_run(arrays, holes) -> int:
    """Heap the arrays an op makes (bytes each: its outputs and temporaries) need beyond
    the live data where the holes the pass has freed so far (holes: the freed arrays'
    bytes) do not take them: the largest array goes into the largest hole, the next into
    the next (a hole takes one of them), and an array longer than its hole needs a run of
    its own beside the live arrays that cut the free heap: the part of it longer than the
    hole, for the largest such part (the hole below the free heap, which an array may run
    on from), and for each other array at most the hole it skips (left behind: the zoo's
    LayerNorm + exact GELU block, 11 output-sized arrays against 6 holes of their size
    and 7 small ones, was charged the part beyond each small hole, 15 KB: 1.3x its need
    on 32-bit); arrays past the last hole go where the free heap is one run, nothing
    beyond themselves; none before the pass frees anything: the free heap is one run
    then.  (A CONCATENATION of two 21 KB maps into a 42 KB one after 18 KB ones, 32-bit
    ulab: it failed with 81 KB free and no 42 KB run.  One largest hole for every array,
    ONNX c2's RELU6 after a 1 -> 6 depthwise, banded after it on 32-bit ulab, made two 3.4 KB arrays where the depthwise had freed one
    3.4 KB spread copy and a 2 KB piece: it failed with 17 KB free, planned no run.)
    Never more than the holes' bytes: an array no hole takes goes where the free heap is
    one run, and what it costs beyond the live data is the holes it leaves behind, at most
    all of them.  (Without that bound a 15 KB conv output after one 2 KB piece's hole was
    planned 13 KB of run: the held-out 1-D conv nets 1.3-1.55x on 32-bit ulab, issue 28.)"""
    if not holes:
        return 0
    hs = sorted(holes, reverse=True)
    short = [(n - h, h) for n, h in zip(sorted(arrays, reverse=True), hs) if n > h]
    if not short:
        return 0
    top = max(short)        # (the one that may run on from the hole below the free heap)
    return min(sum(hs), top[0] + sum(min(e, h) for e, h in short) - min(top))


def backward_peak(r) -> int:
    """The backward pass's peak: the gradients in flight and each op's temporaries, and
    the heap their arrays cut where the forward pass's arena (forward_peak) places them
    (Arena.fresh).  A gradient in flight is an array, which several tensors' gradients
    may be (an op that passes its dz on as its inputs' gradients: bwd_temps' passed):
    counted once.  (The backward's new arrays had been planned against a list of hole
    sizes, one per op's frees, each taken as adjacent and below the free heap: the
    held-out strided 1-D net's PAD gradient, SGD b4 on 32-bit ulab, failed its 4 KB copy
    there, 0.997x; now 1.02x.)"""
    from ..graph.optable import SPECS, dx_bit, DW
    g, plan, size, A = r.g, r.plan, r.size, r.A
    batch = int(r.s['batch'])
    peak = 0
    grads = {g.outputs[0]: (size[g.outputs[0]], -1)}     # tensor: (floats, the array)
    arena = r.arena             # (the saved activations and the sample stay all the pass)
    for k in [k for k in arena.at if k not in plan.saved and k != g.inputs[0]]:
        arena.free(k)
    arena.alloc(A(size[g.outputs[0]]), -1)
    for i, flags in plan.backward:
        op = g.ops[i]
        spec = SPECS[op.name]
        bo, bi, pc, passed = bwd_temps(r, spec, op)
        o = op.outputs[0]
        ins = [k for k in spec.inputs(op)[:1] if k >= 0]
        n_in = max([size[k] for k in ins] or [0])
        cur = sum(A(n) for n in {a: n for n, a in grads.values()}.values())
        # a kernel that hands its weight gradient whole holds a weight-sized array during
        # the op (at batch 1; larger batches count it in the gradient sums), and at batch 1
        # what the kernel and the optimizer step add to it (step_wsum: a 573 KB trained 1x1
        # conv needed 2485 KB on 64-bit ulab where 1860 KB were planned)
        wsum = sum(A(size[k]) for k in spec.inputs(op)
                   if k in plan.params and plan.params[k][1] == 'weight') if _wgrad(r, spec) == 'whole' else 0
        # input-sized temporaries (dx and what makes it) only where the op passes a
        # gradient on (flag 1): the lowest trainable op makes none (the DS-CNN's trained
        # 1x1 conv was planned 60 KB of dx it never makes: 1.5x its smallest heap)
        # at batch 1 the sink steps the optimizer on the op's gradients at the op, a row
        # at a time (row_temps): on top of this op's temporaries, not of the pass's peak
        rows = row_temps(r, [k for k in spec.inputs(op) if k in plan.params]) if batch == 1 else 0
        # the gradients of data inputs n >= 1 it makes (a residual ADD's skip, a
        # CONCATENATION's parts, BATCH_MATMUL's second operand: K in Q K^T), then in flight
        more = {k: (size[k], n) for n, k in spec.data(op)[1:] if flags & dx_bit(n)}
        given = list(more.items()) + ([(ins[0], (n_in, 0))] if flags & 1 and ins else [])
        # a gradient that meets one already in flight (a second reader of that tensor
        # gave it first) is summed into a new array (utrain.model add_grad: old + d):
        # counted for the ops whose figures are their own (bwd_of: dx alone); the
        # default figures' two input-sized arrays stand for dx and that sum
        # (the arrays it makes: its outputs and temporaries, the gradients above, those sums)
        made = [A(size[o])] * bo + [A(n_in)] * (bi if flags & 1 else 0) + [pc] \
            + [A(v) for v, n in more.values() if n not in passed] \
            + [A(v) for k, (v, n) in given if k in grads and spec.bwd_of]
        # the arrays it makes, each named by the array it is (dz: its first output-sized
        # one; dx: its first input-sized one, the second the sum where the gradient meets
        # one in flight; a part's; a sum), else a temporary
        tags = [('dz', i)] + [None] * (bo - 1) if bo else []
        if flags & 1 and bi:
            k0 = ins[0] if ins else None
            tags += [('dx', i, k0), ('sum', i, k0) if k0 in grads and not spec.bwd_of else None] \
                + [None] * (bi - 2)
            tags = tags[:bo + bi]
        tags += [None] + [('dx', i, k) for k, (v, n) in more.items() if n not in passed] \
            + [('sum', i, k) for k, (v, n) in given if k in grads and spec.bwd_of]
        # and the weight-sized arrays of its weight gradient's step (step_wsum), the
        # optimizer's row temporaries (row_temps: 3 arrays, 6 with Adam) and the kernel's
        # weight-sized temporaries, laid out in the arena in the kernels' order: a conv's
        # (bwd_of: op_conv.backward) dz, its weight gradient's steps and their pieces,
        # dx; the default figures' first output-sized array, dx, the rest; then a part's
        # gradient, a sum (add_grad, once the op's steps have returned)
        nbi = bo + (bi if flags & 1 else 0)
        sw = step_wsum(r, wsum, _taps(r, spec, op)) if batch == 1 else 0
        nr = 6 if r.s['optimizer'] in ('adam', 'adamw') else 3
        temps = [wsum] * (sw // wsum) + [sw % wsum] if wsum else [sw]
        temps += [pc] + [rows // nr] * nr + [weight_temps(r, spec, op, 1 if flags & DW else 0)]
        dzs, dxs = list(zip(made[:bo], tags[:bo])), list(zip(made[bo:nbi], tags[bo:nbi]))
        temps = [(n, None) for n in temps]
        order = (dzs + temps + dxs if spec.bwd_of else dzs[:1] + dxs + dzs[1:] + temps) \
            + list(zip(made, tags))[nbi + 1:]
        keys = [arena.alloc(n, t) for n, t in order]
        # the live data, what it makes and the heap those arrays cut beyond their bytes
        # where the arena places them (Arena.fresh: the saved activations stay all the
        # pass, gradients in flight where they were made)
        need = cur + sum(n for n, _ in order) + spec.taps * A(0) + arena.fresh()
        peak = max(peak, need)
        r.largest = max(r.largest, A(size[o]) if bo else 0, A(n_in) if bi and flags & 1 else 0, pc)
        # the array dz is: dy's without anything made from it, else the op's own
        dz = grads.get(o, (0, None))[1] if not bo else ('dz', i)
        was = {a: n for n, a in grads.values()}
        for k in op.outputs:
            grads.pop(k, None)
        for k, (v, n) in given:
            grads[k] = (v, ('sum', i, k) if k in grads else dz if n in passed else ('dx', i, k))
        now = {a for n, a in grads.values()}
        # what the op leaves freed: its temporaries and the gradients no longer in flight
        for k in keys + list(was):
            if k not in now:
                arena.free(k)
        for k, (v, a) in grads.items():
            if a not in arena.at:
                arena.alloc(A(v), a)
    return peak


def step_wsum(r, wsum, taps=1) -> int:
    """At batch 1, bytes an op that hands its weight gradient whole (wsum bytes) holds
    for it: two at SGD, four with Adam / RMSprop.  Measured at plain SGD (test_memory.py::
    test_a_1x1_conv_weight_gradient_is_planned_as_it_allocates): ulab holds two for a
    1x1 conv (the sum and utrain.ulconv's [O, I] tap product, np.dot(dz.T, x)), the
    fallback one (its native loops sum in place, xnp.add_scaled steps in one pass).  The
    fallback's second is kept: counted once, ho_cnn5bn SGD b1 on 32-bit went under
    (224 KB planned, 228 needed), only because run.gc_every follows the plan (7169 B
    against 7201: the same files train in 222 KB; docs/memory.md, session 14 h43p).
    Under ulab the product is one tap's (taps: the kernel's KH * KW): a 1x5 conv's is a
    fifth of its weight (counted whole, the held-out 1-D conv nets planned 1.3x at SGD b1
    on 32-bit ulab once ulconv's pieces no longer fragmented their heap, issue 28)."""
    n = wsum * (2 if r.s['optimizer'] == 'sgd' else 4)
    return n - wsum + -(-wsum // taps) if r.arrays == 'ulab' else n


def _taps(r, spec, op) -> int:
    """The kernel taps (KH * KW) of an op whose weight gradient ulab's conv steps make a
    tap at a time (spec.piece), else 1."""
    ins = spec.inputs(op)
    if r.arrays != 'ulab' or not spec.piece or len(ins) < 2 or ins[1] < 0:
        return 1
    s = r.g.tensors[ins[1]].shape
    return max(1, int(s[1]) * int(s[2])) if len(s) == 4 else 1


def bwd_temps(r, spec, op):
    """op_temps of the backward pass and the data inputs whose gradient is the op's dz
    (spec.bwd_of: a conv's fused activation and dx, a residual ADD's pass-through), else
    op_temps' (none passed)."""
    if spec.rows_of and by_rows(r, op):     # (its weight streamed by rows: utrain.convrows)
        bo, bi, n = spec.rows_of(op, r.g, r.arrays, True)
        return bo, bi, r.A(n) if n else 0, ()
    if spec.bwd_of:
        bo, bi, n, passed = spec.bwd_of(op, r.g, r.arrays)
        return bo, bi, r.A(n) if n else 0, passed
    return op_temps(r, spec, op, spec.bwd_native, spec.bwd) + ((),)


def _wgrad(r, spec) -> str:
    """How the op hands its weight gradient under r's settings: spec.wgrad, or
    spec.wgrad_sgd under plain SGD at batch 1 (op_emb steps the rows it used in place)."""
    s = r.s
    if spec.wgrad_sgd and int(s['batch']) == 1 and s['optimizer'] == 'sgd' \
            and not s.get('momentum') and not s.get('weight_decay'):
        return spec.wgrad_sgd
    return spec.wgrad


def row_temps(r, params) -> int:
    """The optimizer's temporaries while it steps the widest row of params (SGD three
    row-sized arrays, Adam six)."""
    n = 6 if r.s['optimizer'] in ('adam', 'adamw') else 3
    return n * r.A(max([r.shapes[k][1] for k in params] or [0]))


def working_set(r, fwd, bwd, x_in) -> int:
    """The per-sample working set: the sample buffer and the largest of its
    phases, which follow one another: the forward pass's peak, the loss (the output and
    its output-sized arrays), the backward pass's peak (at batch 1 with the optimizer's
    per-row temporaries at each op: the 16x16 CNN's classifier rows had been planned on
    top of its conv's backward peak) and, at a batch > 1, the optimizer's per-row
    temporaries at the batch's end; at least the
    checkpoint reader's code (utrain/ckread.py), which loads between samples (a resume,
    a restore after a divergence), when the working set is free.  (The loss's arrays and the row temporaries had been added to the forward
    peak: the 16x16 CNN's conv peak, planned 1.25-1.3x its smallest 32-bit heap.)"""
    A = r.A
    # batch > 1: the step at the batch's end (at batch 1 each op's, in backward_peak)
    step = row_temps(r, r.plan.params) if int(r.s['batch']) > 1 else 0
    loss = 5 * A(r.size[r.g.outputs[0]])
    # the sample: one array (Trainer._pass reads each sample into it), counted live in
    # the forward pass or saved; planned once more on top, twice where it is saved
    # (whole-model training: the CNNs' backward fragments there, ho_mbnet on 32-bit
    # needed the second; where the first op is frozen it stood over ho_hswish's
    # streamed and ranked cells, 1.25x on 32-bit ulab)
    # the step at the batch's end (Trainer.apply) runs after net.backward has returned:
    # the gradients in flight and the saved activations are gone by then, so it is a
    # phase of its own, not on top of the backward peak (the held-out Keras conv + FC
    # net, Adam b4 on 32-bit: 1.21x its need with the two summed, its 294-wide FC rows'
    # six Adam temporaries planned over the backward pass's dz and dx)
    ws = (2 if r.g.inputs[0] in r.plan.saved else 1) * A(x_in) + max(fwd, loss, bwd, step)
    return max(ws, int(r.f['code'] * mpy_sizes().get('ckread', 0)))


def fragmentation(parts, collect) -> int:
    """The fragmentation allowance on the data held all run and on the working set;
    larger when the run collects garbage only when the heap is full (collect 0).  A run
    that collects every 1/collect of the heap holds up to that much garbage between two
    collections, cut up among its arrays: the working set's allowance is at least that
    (issue 28's sweep: the LayerNorm block's smallest 64-bit heap grew 2 and 6 KB when it
    collected every 1/32 and 1/8 instead of 1/128 of it; its 1 KB arrays' WS_SLACK share
    was 1.3 KB)."""
    ws = parts['working set (activations, temporaries, loss)']
    data = sum(v for k, v in parts.items() if k not in ('code', 'interpreter'))
    slack, ws_slack = (SLACK, WS_SLACK) if collect else (SLACK_NOGC, WS_SLACK_NOGC)
    garbage = sum(parts.values()) // collect if collect else 0
    return int(slack * (data - ws) + max(ws_slack * ws, garbage))


HOLES = 'load holes (beyond the per-sample part)'
LOAD = 'model load (its tables\' transient, beyond the run)'


def model_load(r, parts):
    """utrain.flat.load reads the tables before any array is made: the code (all of the
    model's kernels; not utrain.prefix, imported later), the interpreter's share, the
    resident tables and the load's transient ones: per tensor its kind, flags and last
    use (two bytearrays and a list: a word and 2 B), per op the op and kernel-module
    lists' growth (each list's old storage and its doubled one: 2 words, twice), with
    the fragmentation allowance on those tables.  A part for what that peak needs beyond
    the run's (the model's weights, state and working set), where it is the larger: a
    net of many ops and small weights.  (An unrolled TFLite GRU, 1228 ops of 1675
    tensors and 6 KB of weights, failed loading its model 10 KB above the plan once its
    op_split buffers, never made with a host-made prefix cache, were no longer planned:
    needed 39.7 KB beyond code, interpreter and planned tables on both 32-bit builds,
    mpu32 274.0 KB and mpu32-ulab 254.6 KB; this plans 44.7 KB, 1.02x on both.)"""
    w = r.t['word']
    code = parts['code'] + (r.prefix_code if r.start else 0) - r.late_code
    tables = parts['model tables'] + len(r.shapes) * (w + 2) + len(r.g.ops) * 4 * w
    peak = code + parts['interpreter'] + int((1 + SLACK) * tables)
    extra = peak - sum(parts.values())
    if extra > 0:
        parts[LOAD] = extra
    return parts


def load_holes(r, parts):
    """The model's load: its weight and state arrays are made after the code, in a heap
    the code's loading left holes in (train.py collects every 2 KB while it loads), and
    training's arrays come later into what is left; the heap beyond the data held all
    run is at least the holes a large array cannot use ('holes' of WORD_FIGURES'
    figures per array kind): a part for the difference when the per-sample part (saved activations,
    working set, their allowance, a prefix phase's excess) is smaller.  Measured on
    32-bit ulab (issue 28's sweep, session 6: 21 models x 5-6 settings): the data held at
    the first step was 11-17 KB under the plan's (the interpreter's base had stood in
    for the holes), and the heap beyond it at least 8-15 KB whatever the working set
    (the digits MLP, 3 KB of working set, fails making its 8 KB weight array in
    utrain.flat.load with 12 KB free).  Base 17 -> 14 KB and holes 10 KB: plan / need
    1.05-1.28 (17 cells over 1.2) -> 1.02-1.24 (2 over: hswish streamed, mixcnn ranked),
    leaving out ResNet-8's streamed and ranked cells (1.36-1.75: their working set).
    Issue 28 (session 15), the load measured (the smallest heap that reaches the first
    step, the data held there after a collection) on 3 builds x 4 nets (an 8-6-3 MLP, the
    digits MLP, a separable-conv net, a 300-256-128-10 MLP): beyond the data held the load
    needs 7.5-9.3 KB on both 32-bit builds, 9.5-12 KB on 64-bit, the same for arrays of
    100 B and of 8-9 KB (22 and 17 KB with the 300x256 weight): what the code's loading
    leaves, by word size, not the model's arrays.  The 32-bit bases (14 KB ulab, 17 KB
    fallback) hold it already: their planned held data is 5.7-10 KB over the real, so
    the load needs 1.6 KB less to 3.6 KB more than that (the conv net, whose per-sample
    part is 78 KB), and the 10 KB ulab floor planned the 8-6-3 MLP 1.20-1.23x (57-58 KB,
    needs 47-48) where the fallback, which has none, plans it 1.08x: no floor on 32-bit
    (the MLP 1.08-1.10x).  On 64-bit the planned held data is 0-2.8 KB over the real and
    the load needs 7-12 KB more than it: 16 KB stays (the 8-6-3 MLP 1.07x, the digits
    MLP 1.05x; without it both under).
    Not for code frozen into the firmware (no loading holes).  Code imported after the
    arrays (utrain.prefix, a prefix cache's) lands in those holes: the floor is less by
    it (the Keras MLP, last:2 from a host-made cache on 32-bit ulab, needed what its
    SGD cell needs, 54.2 KB, with utrain.prefix's 2.7 KB of code more: planned 1.22x)."""
    floor = r.f.get('holes', 0) - r.late_code
    per = sum(v for k, v in parts.items() if k.startswith(('saved', 'working set', 'fragmentation',
                                                            'prefix phase', 'model load')))
    if floor > per and not r.frozen:
        parts[HOLES] = floor - per
    return parts


def prefix_phase(r, parts, collect):
    """A host-made prefix cache (settings['prefix']) runs in two phases: A, before
    training, the whole model's kernels are in and utrain.prefix loads (its loader's
    transient, PREFIX_LOAD) and makes the cut's buffers; then utrain.prefix.drop forgets
    the kernels only the prefix's ops use, and B, training, holds the rest and the
    working set.  parts (in place): B's, with 'prefix phase' the heap A needs beyond B
    (none when B is the larger).  (One phase planned both together: the 32-bit cells
    1.22-1.23x their need; B alone under-planned a 64-bit one, 0.99x.)"""
    if not r.start:
        return parts
    ws = 'working set (activations, temporaries, loss)'
    frag = 'fragmentation allowance'
    a = dict(parts)
    a[ws] = a["saved activations"] = 0      # no sample yet; the cut's buffers (prefix.get)
    a['cut buffers'] = sum(r.A(r.size[k]) for k in cut_tensors(r))
    del a[frag]
    a[frag] = fragmentation(a, collect)
    parts['code'] -= r.prefix_code
    del parts[frag]
    parts[frag] = fragmentation(parts, collect)
    r.phase_a = sum(a.values())
    extra = r.phase_a - sum(parts.values())
    if extra > 0:
        parts['prefix phase (before training: all kernels, utrain.prefix loading)'] = extra
    return parts


def gc_every(g, planned) -> int:
    """N, where train.json's run.gc_every is the plan / N bytes: collect every 1/32 of
    the planned heap while training when an activation is large next to the heap (at
    least 1/128 of the plan: the digits CNN's
    2 KB, a 16x16 CNN's 8 KB conv output), whose remaking fragments a small heap
    (docs/memory.md), or when the model has 16 ops or more; else 0, only when the heap
    is full: collections cost time (the digits MLP on 32-bit unix: 2.3x per sample) and
    its small arrays gain little."""
    big = largest_activation(g)
    # ... or when a step makes many arrays (16 ops or more): the zoo's LayerNorm+GELU
    # block (24 ops, 1 KB activations) needed 150 KB without collections, 130 with
    return 32 if 4 * big * 128 >= planned or len(g.ops) >= 16 else 0


def gc_bytes(g) -> int:
    """train.json's run.gc_every where the run collects (gc_every): an eighth of the
    model's largest activation, on a 1 KB grid, at least 4 KB: the model's alone, so
    that a plan-only change (a part, the code's size, another board) leaves the run's
    collections where they were.  It had been 1/32 of the plan, and the need followed
    it byte for byte: a streamed 1-D depthwise net's need on 32-bit ulab went between
    130 and 165 KB as gc_every went over 1-12 KB in 256 B steps (docs/memory.md, session
    29).  The device collects at op boundaries too, once the outputs made reach these
    bytes (utrain/model.py); with them that need was 128-133 KB at every gc_every up to
    8 KB (its largest activation is 24 KB), and the concat-skip net's at SGD b1 191-193
    KB at 2-4 KB, 197-213 KB at 5-8 KB (20 KB).  Not smaller: the digits CNN (2 KB
    activations) at 2 KB took 1.8x the CPU time of its 3.9 KB on 64-bit unix; at 4 KB,
    as before."""
    return max(4096, largest_activation(g) // 2 // 1024 * 1024)   # (4 bytes a float, / 8)


def largest_activation(g) -> int:
    """Values in g's largest tensor that is no constant (an activation, the input)."""
    return max([math.prod(t.shape) for t in g.tensors if t.data is None] or [0])


def biases_only(train, ranks, with_params, biased):
    """(train, ranks) of the biases-only candidate of the fit advice, one for every
    firmware it is planned on: each op that has a bias trains its bias alone (rank 1),
    a given rank elsewhere kept unless it is a bias rank on an op without one; where
    some weighted ops have no bias, --train none leaves them frozen (Keras's
    use_bias=False)."""
    rk = {i: v for i, v in ranks.items() if v != 1 or i in biased}
    rk.update({i: 1 for i in biased})
    return ('none' if biased != with_params else train), rk


LONGEST = object()      # fit_advice's candidate: the longest --train last:N that fits


def longest_last(n_ops, planned, limit):
    """'last:N' for the largest N (of n_ops - 1) whose plan fits, bisected: a plan grows
    with the ops it trains (an unrolled GRU of 395 ops had fit_advice plan every N from
    the top, 2 s each: prepare --board pico ran half an hour), or None.  planned(train)
    -> total, (total, its limit), or None when that trains nothing (too few ops)."""
    lo, hi, best = 1, n_ops - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            est = planned('last:%d' % mid)
        except ValueError:
            est = None
        est, lim = est[:2] if isinstance(est, tuple) else (est, limit)
        if est is not None and est <= (limit if lim is None else lim):
            best, lo = mid, mid + 1
        elif est is None:
            lo = mid + 1        # (trains nothing: more ops)
        else:
            hi = mid - 1
    return None if best is None else 'last:%d' % best


def fit_advice(g, settings, train, ranks, backend, limit, heap, planned) -> str:
    """What would fit in `limit`: the planner's figure for cheaper settings, every memory
    option considered: batch 1, SGD, --stream, the frozen-prefix cache made by the board
    (--cache) or by prepare (--cache-on-host), sparse updates, fewer layers trained, and
    a firmware whose code takes less heap (ulab, utrain frozen in).  g is the graph as
    read; train (op numbers) and ranks {op: rank} are in the file's numbering, and so is
    every suggestion (as `inspect` and --train last:N count); planned(train, ranks,
    settings, cache, backend) is the heap plan as prepare would plan that candidate (the
    rewrites differ with what trains, so each is planned on its own rewritten graph):
    its total, or (total, the limit it must fit[, what prepare then does to fit that the
    flags do not say: 'the frozen early layers computed in row bands']), or None when it
    trains nothing."""
    from ..graph.passes import RANK_NAMES
    from ..graph.optable import SPECS
    parts = ', '.join(f'{k} {v // 1024} KB' for k, v in heap['parts'].items() if v >= 1024)
    lines = [f'  planned: {parts}']
    base = dict(settings)
    cache = settings.get('cache', False)
    cands = []      # (settings changed, train, ranks, cache, backend)
    if int(settings['batch']) > 1:
        cands.append(({'batch': 1}, train, ranks, cache, backend))
    if settings['optimizer'] != 'sgd' or settings.get('momentum'):
        cands.append(({'optimizer': 'sgd', 'momentum': 0.0}, train, ranks, cache, backend))
    if not settings.get('stream'):
        cands.append(({'stream': True}, train, ranks, cache, backend))
    caches = [c for c in (True, 'host') if c != cache]     # what trains stays as chosen
    for c in caches:
        cands.append(({}, train, ranks, c, backend))
    cheap = {'batch': 1, 'optimizer': 'sgd', 'momentum': 0.0, 'stream': True}
    for c in [cache] + caches:
        cands.append((cheap, train, ranks, c, backend))
    with_params = [i for i in sorted(set(train) | set(ranks))
                   if g.ops[i].name in SPECS and SPECS[g.ops[i].name].roles(g.ops[i], g)]
    # biases only: of the ops that have one (Keras's use_bias=False leaves some without;
    # those are left frozen: --train none with the ranks)
    biased = [i for i in with_params if any(
        r == 'bias' and p < len(g.ops[i].inputs) and g.ops[i].inputs[p] >= 0
        for p, r in SPECS[g.ops[i].name].roles(g.ops[i], g).items())]
    for c in (cache, 'host'):
        for r in (4, 5):
            rk = dict(ranks)
            rk.update({i: r for i in with_params if rk.get(i, 0) != 1})
            cands.append((cheap, train, rk, c, backend))
        cands.append((cheap,) + biases_only(train, ranks, with_params, biased) + (c, backend))
    for c in (cache, 'host'):       # (the longest last:N that fits: LONGEST, bisected)
        cands.append((cheap, LONGEST, {}, c, backend))
    # then, when nothing fits on this firmware, one whose code takes less heap: what
    # trains as chosen, and the cheapest ways (the prefix cached by prepare, biases only,
    # the last op only)
    firmware = []
    for b in ('ulab', 'fallback-frozen', 'ulab-frozen'):
        if b != backend and (backend.startswith('ulab') <= b.startswith('ulab')):
            firmware += [({}, train, ranks, cache, b), (cheap, train, ranks, 'host', b),
                         (cheap,) + biases_only(train, ranks, with_params, biased) + ('host', b),
                         (cheap, 'last:1', {}, 'host', b)]
    fits, seen, deeper = [], set(), {}     # deeper: settings -> the plan of a longer last:N that fits
    for k, (change, tr, rk, c, b) in enumerate(cands + firmware):
        if k == len(cands) and fits:
            break
        s = dict(base)
        s.update(change)
        if tr is LONGEST:
            tr = longest_last(len(g.ops), lambda t: planned(t, rk, s, c, b), limit)
            if tr is None:
                continue
        new = {k for k, v in change.items() if base.get(k) != v}      # what the user changes
        desc = ' '.join(['--batch 1'] * ('batch' in new) + ['--optimizer sgd'] * ('optimizer' in new)
                        + ['--momentum 0'] * ('momentum' in new and s['optimizer'] == 'sgd')
                        + ['--stream'] * ('stream' in new) + [f'--train {tr}'] * (tr != train)
                        + [('--ranks ' + ','.join(f'{i}:{RANK_NAMES[r]}' for i, r in sorted(rk.items()))
                            if rk else 'without --ranks')] * (rk != ranks)
                        + ['--cache-on-host' if c == 'host' else '--cache'] * (c != cache)
                        + [f'--backend {b}'] * (b != backend))
        if not desc or desc in seen:
            continue
        seen.add(desc)
        try:
            est = planned(tr, rk, s, c, b)
        except ValueError:
            continue
        est, lim, *how = est if isinstance(est, tuple) else (est, limit)
        if est is not None and est <= (limit if lim is None else lim):
            if isinstance(tr, str) and tr.startswith('last:'):
                key = (tuple(sorted((n, s[n]) for n in new)), c, b)    # what else changes
                if key in deeper and est >= deeper[key] - 1024:
                    continue        # trains less than a longer last:N that fits for as much
                deeper[key] = est
            fits.append(f'  would fit: {desc}  (about {est // 1024} KB)' + (
                '' if b == backend else ' on a firmware with ' + ' and '.join(
                    ['ulab'] * b.startswith('ulab') + ['utrain frozen in (boards/freeze.md)']
                    * b.endswith('frozen'))) + ''.join(f' with {w}' for w in how if w))
            if len(fits) >= 3:
                break
    if not fits:
        fits.append('  nothing tried fits (batch 1, sgd, --stream, --cache, --cache-on-host, --ranks, '
                    '--train last:N' + (', a firmware with ulab or utrain frozen in' if firmware else '')
                    + '): ' + short_of(heap, limit) + runner.roomier(heap))
    return '\n'.join(lines + fits)


def short_of(heap, limit) -> str:
    """What keeps plan heap over limit (bytes) where no setting tried fits: the code and
    interpreter alone, where they take it; else the plan's largest part (a 224x224 int8
    MobileNet on an ESP32-S3's 1.6 MB: the frozen prefix's int8 arena, 1617 KB, where the
    code and interpreter take 70 KB, which it had named as the cause), or where they take
    half the budget but a part beside them is larger (an unrolled int8 LSTM on an
    RP2040: its 300 KB of weights, where the code and interpreter take 125 KB)."""
    fixed = heap['parts'].get('code', 0) + heap['parts'].get('interpreter', 0)
    name, size = max(((k, v) for k, v in heap['parts'].items()
                      if k not in ('code', 'interpreter')), key=lambda kv: kv[1],
                     default=('', 0))
    if fixed >= limit or fixed >= limit * 0.5 and fixed >= size:
        return f'the code and interpreter alone take about {fixed // 1024} KB'
    return (f'its largest part, {name}, takes about {size // 1024} KB of the '
            f'{(limit - fixed) // 1024} KB the budget leaves beside the code and interpreter')


# ---------------------------------------------------------------- int8 runs
# An int8 model training as int8 (host_tools/prepare/quant.py, micro/utrain/q8.py): its q8.json
# parsed and kept, one Layer object per op, the int8 arena the host placed, the shared
# int32 sums / weight scratch / multiplier buffers, the weights held in RAM, each trained
# layer's gradient sums, float bias and update multipliers, the optimizer's float32
# arrays, the two shared input-gradient buffers.  With --cache the frozen prefix runs
# first on a net of its own (utrain.q8prefix), then the trained part: the larger of the
# two phases is the plan.
# utrain.wof is not among the trainer's: Q8Net drops it once its files are open, and a
# save imports it and drops it after; its code comes back at each save into the holes
# training leaves (measured on the 32-bit unix build, SGD batch 1: a Keras MLP int8 file
# needed 87.6 KB with it resident, 86.0 without; an int8 RNN of shared weights 132.6 and
# 128.0; 3.9 KB of code)
Q8_MODULES = ('__init__', 'run', 'q8train', 'q8', 'q8load', 'q8setup', 'data')
# and the frozen prefix pass's (utrain.q8prefix), before the trainer's code loads
Q8_PREFIX_MODULES = ('__init__', 'run', 'q8prefix', 'q8', 'q8load', 'data', 'wof')
# (its net is made without the optimizer's set-up: utrain.q8setup is not loaded)
# The net's load (utrain.q8load: Q8Net.__init__) and training are two phases: q8load is
# dropped and collected before the code the table asks for beyond it loads (utrain.q8ext,
# itself dropped after: band groups, ranges, growing scales, PRELU slopes, shared weights;
# its own 0.6 KB less than the saves' Q8_SAVE_CODE, priced in neither; then the trainer's
# setup: momentum, a float-target loss; a batch's updates where SGD at batch 1 loads them
# for shared weights alone: Q8Trainer loads them before the net otherwise).  Planned
# apart (q8_after_load): the load holds what training holds, its code without those;
# training holds its code without q8load, and at each save utrain.wof's and
# utrain.best's besides, of which Q8_SAVE_CODE shows (they load into the holes training
# leaves: on the 32-bit unix build, SGD b1, the saves of a BatchNorm-folded int8 CNN and
# of a residual one's last two layers over row bands needed 2.8 and 2.0 KB above their
# steps' peaks, of 5.8 KB of code; the 64-bit build's residual cell came within 1 % at a
# half; on the emulated Pico that CNN's save needed 120.9-122.1 KB where half its code
# planned 118.4: a littlefs board's import reads each .mpy through an open file, its
# cache beside the code, which is priced whole there: 122.2); the plan is the larger.  (Measured there too: that
# BatchNorm CNN, whose ranges follow training and whose scales grow, needed 91.3 KB with
# q8load, q8range and q8grow resident at once, its load's peak; 84.9 KB after, its
# checkpoint's save the peak.)
Q8_LOAD = ('q8load',)
# The trainer's one-time set-up once the net is loaded (utrain.q8setup: the optimizer's
# state, a start from trained weights, the trainer's counters) is imported after q8load
# is dropped, with what loads after it (q8_after_load), and dropped before the first
# sample: in neither the load's code nor training's.  A resume's reader (utrain.q8resume,
# with utrain.wof and utrain.ckread) loads only for "resume": true, in none of these
# phases.  (Both had been utrain.q8's and utrain.q8train's: 3.2 KB of .mpy training
# held, 4.4 KB of heap on 32-bit.)
Q8_SETUP = ('q8setup',)
Q8_AFTER_LOAD = ('q8bands', 'bands', 'q8range', 'q8grow', 'q8slope', 'q8share', 'q8batch',
                 'q8mom', 'q8reg')
Q8_SAVE = ('wof', 'best')
Q8_SAVE_CODE = {(8, 'os'): 0.75, (4, 'os'): 0.5, (8, 'littlefs'): 1.0, (4, 'littlefs'): 1.0}


def q8_phases(settings) -> dict:
    """{phase: the modules of q8_modules an int8 run with settings has not loaded in it}:
    'load' (the net's load: utrain.q8load resident, not what loads after it nor the
    set-up), 'setup' (the set-up once q8load is dropped: q8setup with what loads after the
    load) and 'training' (neither q8load nor q8setup; a save's code comes on top:
    Q8_SAVE)."""
    return {'load': q8_after_load(settings) + Q8_SETUP, 'setup': Q8_LOAD,
            'training': Q8_LOAD + Q8_SETUP}


def q8_after_load(settings) -> tuple:
    """The modules an int8 run with settings loads after the net's load (Q8_AFTER_LOAD;
    utrain.q8batch before it where Adam or a batch > 1 asks for it: utrain.q8train)."""
    s = settings or {}
    early = s.get('optimizer', 'sgd') != 'sgd' or int(s.get('batch', 1)) > 1
    return tuple(m for m in Q8_AFTER_LOAD if not (early and m == 'q8batch'))


Q8_LAYER_WORDS = 64         # a Layer object and its attributes (measured: 64- and 32-bit unix)
# and a trained layer's more attributes (its window, float bias, sums, multipliers: the
# instance's attribute map grows; 240-260 B a trained FC on the 32-bit unix build, the
# 27 of a held-out Keras MLP of bias-less branches)
Q8_TRAINED_WORDS = 64
# Fragmentation allowance, per word size: on the training buffers and on the rest of the
# data.  Q8Net makes its big buffers first (the weights it holds, largest first, then the
# shared gradient buffers, before the layers' small objects cut the heap up).  Fitted on
# smallest_heap() of the Keras MLP (all layers, SGD; Adam batch 4), the DS-CNN (last:2,
# with and without --cache), MobileNetV2 0.35 (last:2 --cache) and two sparse schemes
# (tests/support/q8cases.py): the plans come within 1.05-1.16x of them on 64-bit, 1.05-1.18x on
# 32-bit
Q8_SLACK = {8: (0.3, 0.15), 4: (0.15, 0.1)}
# and per trained layer, GC blocks: each trained layer's dozen small arrays and its
# attribute map, made between the shared buffers, leave holes the next big block cannot
# use (measured on the 32-bit unix build: the held-out wide MLP's 27 trained layers and the
# sensor net's 5 needed 500-600 B each beyond the plan; with the int8 engine's growing
# weight scales merged, the wide MLP's Adam batch 4 needed 158.9 KB against 155.0
# planned: 144 B more a trained layer)
Q8_TRAINED_FRAG = 50
# and per layer without weights (a slice, an ADD, a LUT, an elementwise op), GC blocks:
# an unrolled RNN has hundreds (a gate a step), their small objects between the rest;
# the save after an epoch (utrain.wof's blocks) then finds no run for a 1.3 KB block
# (measured on the 32-bit unix build: the held-out Keras Bidirectional LSTM(6), 249 such
# layers, needed 420 KB against 408 planned; the GRU's 144, the SimpleRNN's, the
# TimeDistributed's within the plan)
Q8_STEP_FRAG = 4
# and on the code, per word size: loading a module inside the net's set-up keeps more than
# its code live (test_q8_bin's broadcast graph on 64-bit unix: importing utrain.q8grow in
# Q8Net held 11.2 KB after a collection, 4.1 KB when imported alone; its need rose 7.3 KB
# with the plan's code term up 1.5 KB, 1.2 % under).  None measured on 32-bit builds yet.
Q8_CODE_SLACK = {8: 0.1, 4: 0.0}
# The prefix pass (--cache: utrain.q8prefix) runs before the trainer loads: of the
# interpreter's share (WORD_FIGURES base, fitted on training runs) it holds none of what
# training adds (the trainer object, its datasets, the log file, the save's, the names
# the trainer's code interns).  Per word size, bytes less (issue 28: the pass of the Keras
# DS-CNN's last:2 --cache holds 3 KB besides its code and net on the 32-bit unix build,
# planned 1.21x its need, 1.25x on 64-bit; now 1.14, 1.16; a TimeDistributed net, MCUNet,
# MobileNetV2-0.35 1.05-1.11 on 32-bit.  Not more: a pass that loads the band code grows
# the interned names' pools, 4-5 KB (a residual CNN on 64x64 images, 1.03x; with 6 KB
# less 1.005x); the emulated Pico's DS-CNN pass 1.05x)
Q8_PREFIX_BASE = {8: 8 * 1024, 4: 4 * 1024}


def _weights_train(d) -> bool:
    """Whether layer d of an int8 table trains its weights (the terms above were measured
    on such layers; a bias-only layer, window [0, 0], keeps the fitted slack that was
    measured with MobileNetV2's bias schemes)."""
    return bool(d.get('train')) and d.get('tw') != [0, 0]


def json_bytes(v, w, B) -> int:
    """Heap MicroPython's json.load makes for v (a parsed table) on a w-byte-word port
    with B-byte GC blocks: lists grown by doubling from 4 slots, dicts' tables to a power
    of two (keys are the code's interned names), boxed floats, big ints (30 bits and more
    on a 32-bit port) as objects (measured: 64- and 32-bit unix MicroPython)."""
    blk = lambda n: -(-n // B) * B     # noqa: E731
    if isinstance(v, dict):
        cap = 1 << max(2, len(v)).bit_length()
        return blk(4 * w) + blk(2 * w * cap) + sum(json_bytes(x, w, B) for x in v.values())
    if isinstance(v, list):
        cap = 1 << max(2, (len(v) - 1).bit_length()) if v else 4
        return blk(4 * w) + blk(w * cap) + sum(json_bytes(x, w, B) for x in v)
    if isinstance(v, float):
        return blk(2 * w if w == 8 else 3 * w)
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= (1 << (8 * w - 2)):
        return blk(3 * w) + blk(8)
    if isinstance(v, str):
        return blk(4 * w + len(v))
    return 0


Q8_TAP_SLOTS = 16      # utrain.q8asm._S: the depthwise kernels' kept tap tables
Q8_ROWS = 2048         # utrain.q8asm._ROWS: bytes of input rows _dot3 takes at a time


def q8_threes(t) -> int:
    """Bytes of utrain.q8asm._PB (ARM boards) its pointwise convs' forward takes (convk:
    _x3's interleaved copy of the input rows in threes for _dot3, at most Q8_ROWS bytes of
    them, one three at least): for the widest such layer of net table t (P positions, I
    input channels), kept until the net closes (q8asm.forget)."""
    from ..target.device import module
    CONV = module('q8').CONV
    n = 0
    for d in t['layers']:
        g = d.get('g')
        if (d['k'] == CONV and g[4] == g[5] == g[6] == g[7] == 1 and g[8] == g[9] == 0
                and g[11] == g[1]):
            n = max(n, 3 * min(g[10] * g[11] // 3, max(1, Q8_ROWS // (3 * g[2]))) * g[2])
    return n


def _tap_slot(g, mode) -> int:
    """The slot of utrain.q8asm._S (_tab's hash) for geometry g (14 words) and mode."""
    h = g[0] * 5 + g[1] * 3 + g[2] + g[8] * 7 + g[10] * 11 + mode
    return (h ^ (h >> 4)) & (Q8_TAP_SLOTS - 1)


def q8_tap_tables(t, w, B, trains=True) -> int:
    """Heap of the tap tables utrain.q8asm (ARM boards) keeps for net table t's depthwise
    layers (multiplier 1): one per (geometry, mode) a call makes, in 16 slots, the first
    in a slot kept (q8asm._tab, _keep), each an array of 24 + 5 taps + 15 words (~340 B
    for 3x3); until the net closes (q8asm.forget).  The forward pass's geometries are its
    row chunks' (Layer.conv: as many rows as the shared sums hold) or, in a band group,
    its bands' (q8bands: a band's rows; a band's own row chunks not counted); mode 1 (input gradient) where
    the layer passes a gradient back, 2 (weight gradient) where its weights train."""
    from ..target.device import module
    DW = module('q8').DW
    ls = t['layers']
    A = t.get('acc') or max(d['nout'] for d in ls)
    banded = {i: rows for lo, hi, rows in t.get('groups', ()) for i in range(lo, hi)}
    slots = {}
    for i, d in enumerate(ls):
        g = d.get('g')
        if d['k'] != DW or g[3] != g[2]:
            continue
        H, OH, sh, ph = g[0], g[10], g[6], g[8]
        keys = []
        if i in banded:         # a band of rows output rows at a time (q8bands._compute)
            step, reach = banded[i], (g[4] - 1) * g[12] + 1
            for r0 in range(0, OH, step):
                r1 = min(OH, r0 + step)
                a = max(0, r0 * sh - ph)
                keys.append((min(H, (r1 - 1) * sh - ph + reach) - a, r1 - r0, ph + a - r0 * sh))
        else:
            R = max(1, A // (g[11] * g[3]))
            for r0 in range(0, OH, R):
                a = max(0, r0 * sh - ph)
                keys.append((H - a, min(R, OH - r0), ph + a - r0 * sh))
        modes = [(k, 0) for k in keys]
        if trains and d.get('back') and not (d.get('sd') or d.get('pw')):
            modes.append(((H, OH, ph), 1))
        if trains and d.get('train') and q8_trained_weights(d):
            modes.append(((H, OH, ph), 2))
        words = 24 + 5 * g[4] * g[5] + 15
        for (h, oh, pad), mode in modes:
            gm = list(g)
            gm[0], gm[10], gm[8] = h, oh, pad
            slots.setdefault(_tap_slot(gm, mode), words)
    blk = lambda n: -(-n // B) * B     # noqa: E731
    return sum(blk(4 * w) + blk(4 * n) for n in slots.values())


def q8_offset_table(n, w, B) -> int:
    """Heap an int8 net's load of weights.wof keeps for a model of n tensors (the whole
    model's: q8t.json's too): the offset table, one array('I') held all run (Q8Net.woff,
    utrain.wof._table), and the list of the tensors' sizes it is checked against, live
    until the net's buffers are made (its hole among them).  Issue 28: uncounted, the
    PyTorch MobileNetV2 w62 file's 270 tensors needed 751 B over its plan on the 32-bit
    unix build (tests/planner/test_memory.py measures both on the unix builds)."""
    blk = lambda b: -(-b // B) * B     # noqa: E731
    return blk(4 * w) + blk(4 * n) + blk(4 * w) + blk(w * n)


def save_reserve(heap, target) -> int:
    """train.json's run.save_reserve for int8 plan heap for target: its save's part, one
    block the run holds from before the net loads and frees for each save
    (utrain.wof.hold): on a littlefs board the emulated Pico's int8 runs, after training,
    had 11-14 KB free in holes of 39-70 blocks of 16 B, and the file a save opens takes
    72 (1148 B: its cache), the rest of the part the save's smaller pieces that a collection
    lets carve the hole first.  None where the file is the OS's (32-64 B), nor where the
    plan's peak is the prefix pass."""
    return heap['parts'].get(SAVE, 0) if target.get('fs') == 'littlefs' else 0


def _q8_net(t, settings, w, B, trains=True, asm=False, fs='os') -> dict:
    """{part: bytes} one utrain.q8.Q8Net of layer table t (as written: q8.json or
    q8t.json) holds while it trains (trains=False: a prefix net, forward only; fs: the
    board's file system)."""
    from ..target.device import module
    q8, ql = module('q8'), module('q8load')    # (ql: the table's sizes, the load's)
    blk = lambda n: -(-n // B) * B     # noqa: E731
    arr = lambda n: blk(4 * w) + blk(n)     # noqa: E731  (a bytearray / array of n bytes)
    ls = t['layers']
    parts = {'layer table (q8.json parsed)': json_bytes(t, w, B)}
    objs = 0
    luts = set()
    for d in ls:
        objs += blk(Q8_LAYER_WORDS * w) + (blk(Q8_TRAINED_WORDS * w) if trains and _weights_train(d) else 0)
        if 'mul' in d:
            objs += 2 * arr(4 * len(d['mul']))
        if 'g' in d:
            objs += arr(4 * 14)
        if d['k'] == q8.ADD:
            objs += 4 * blk(4 * w)          # its multipliers' memoryviews
        if d['k'] == q8.LUT and 'sm' in d:
            objs += 2 * arr(4 * 256) + arr(8)   # a SOFTMAX's exp tables (utrain.q8smx)
        elif d['k'] == q8.LUT and 'lt' not in d:
            objs += arr(256) + arr(512)     # its tables (utrain.q8lut)
        elif d['k'] == q8.LUT and d['lt'] not in luts:
            # from q8.req (utrain.q8lut): its outputs, one copy an offset, in the net's
            # dict; the derivatives in one array the net's LUT layers share
            objs += arr(256) + (arr(512) + blk(4 * w) + blk(2 * w * 8) if not luts else 0)
            luts.add(d['lt'])
        if d['k'] == q8.NRM:
            objs += arr(16)                 # its row's sums and multiplier (utrain.q8nrm)
        if d.get('eg') and trains:          # a table that trains, held (utrain.q8emb), its
            objs += arr(d['en'] * d['ed']) + arr(2 * (d['nout'] // d['ed'])) + arr(4 * d['ed'])
            #                                   sample's ids and a row's steps
        if trains and (d.get('eg') or d.get('xt')):     # (a trained layer's attributes, its
            objs += blk(Q8_TRAINED_WORDS * w) + blk(12 * w)     # geometry's function: Layer.xo)
        if d['k'] == q8.TCV:                # its weights, bias, int32 sums, and where it
            objs += arr(d['wn']) + arr(4 * d['nb']) + arr(4 * d['nout'])    # passes a
            if trains and d.get('back'):    # gradient its int8 dz and rescaling (q8tcv)
                objs += arr(d['nout']) + arr(4 * d['nb'])
            if trains and d.get('xt'):      # its weights train: their int32 gradient, the
                objs += arr(4 * d['wn']) + 3 * arr(8 * d['nb'])     # bias sums, multipliers
        if d['k'] == q8.BIN and 'bm' in d:  # a BATCH_MATMUL's kernel parameters (utrain.q8bmm)
            objs += arr(4 * 13) + (arr(len(d['kc'])) if 'kc' in d else 0)
        elif d['k'] == q8.BIN:              # its broadcast, a constant input (utrain.q8bin)
            objs += arr(4 * 12) + (arr(len(d['kc'])) if 'kc' in d else 0)
            if 'rv' in d:                   # a DIV's tables (int32 x 2, int16)
                objs += 2 * arr(4 * 256) + arr(2 * 256)
            if 'tq' in d:                   # a SQUARED_DIFFERENCE's gradient table (int16)
                objs += arr(2 * 512)
        if 'gx' in d:                       # a gather's dims and strides (utrain.q8slc)
            objs += arr(4 * 9)
        if 'rz' in d:                       # a resize's row and column tables (utrain.q8rsz)
            objs += arr(4 * 7) + arr(4 * len(d['ry'])) + arr(4 * len(d['rx']))
        for _, v in d.get('kt', ()):        # a constant activation it reads (utrain.q8)
            objs += arr(len(v))
    objs += len(t.get('at', ())) * blk(4 * w)     # the arena's views
    parts['layer objects'] = objs
    parts["weights.wof's offset table (4 B a tensor; a word while loading)"] = q8_offset_table(
        t.get('ntensors', 0), w, B)
    if t.get('req'):
        parts["q8.req's second handle (the shifts)"] = OPEN_FILE[w, fs]
    at = {k for k, _, _ in t.get('at', ())}
    # the sample's buffer: none for a prefix whose first band group reads the sample a
    # strip of rows at a time (Q8Net.strips)
    strips = not trains and any(lo == 0 for lo, _, _ in t.get('groups', ()))
    parts['activations (int8 arena)'] = arr(t.get('arena', 0)) + sum(
        arr(d['nout']) for d in ls if d['out'] not in at and not d.get('yg')) + (
        0 if strips else arr(t['nin']))         # (yg: in the input-gradient buffer)
    A = t.get('acc') or max(d['nout'] for d in ls)
    Q = t.get('qbuf') or max([d.get('nb', 1) for d in ls])
    parts['sums and scratch buffers'] = (arr(4 * A) + (arr(t['wbuf']) if t.get('wbuf') else 0)
                                         + 3 * arr(4 * Q) + arr(4 * 14)
                                         # scce's softmax table and gradient, smk's and
                                         # upmk's parameters (utrain.q8 Q8Net.loss, _apply)
                                         + arr(4 * 256) + arr(4 * ls[-1]['nout'])
                                         + arr(4 * 3) + arr(4 * 5))
    if trains and (settings or {}).get('loss') in ('cce', 'mse', 'mae', 'bce'):
        # float targets (utrain.q8train's y) and the loss's float outputs, its gradient in
        # their place (a list of boxed floats each, made at its size), the gradient as
        # int32 in scce's buffer (Q8Net._run; 'sums and scratch buffers')
        n = ls[-1]['nout']
        parts['loss (float targets, outputs, gradient)'] = 2 * arr(w * n) + 2 * n * blk(2 * w)
    held = 0
    # SGD at batch 1 with momentum, or where prepare asked ('ns'): a layer whose bias alone
    # trains, stepped in integers ('bh'), keeps no float weight scales once built
    # (utrain.q8 Q8Net.setup)
    s = settings or {}
    nosw = trains and s.get('optimizer', 'sgd') == 'sgd' and int(
        s.get('batch', 1)) == 1 and not t.get('rr')
    for i, d in enumerate(ls):
        if nosw and (s.get('momentum') or d.get('ns')) and d.get('train') and not _weights_train(d) and 'bh' in d and d.get('fs') \
                and d['k'] <= q8.DW and not d.get('gw'):
            held -= arr(4 * d['nq'])
        if d.get('sh', i) != i:     # (its first use's weights: utrain.q8share; its bias)
            held += arr(4 * d['nb']) + (0 if 'mul' in d else 2 * arr(4 * d['nq']) + arr(4 * d['nq']))
        elif d.get('sd'):         # weights read a chunk at a time: a trained bias, the scales
            held += (arr(4 * d['nb']) if d.get('train') else 0) + arr(4 * d['nq'])
        elif 'wt' in d and (d.get('train') or d.get('back') or d.get('res') or not t.get('wbuf')):
            held += arr(ql.held_bytes(d)) + arr(4 * d['nb'])     # (pw: the window's rows)
            if 'mul' not in d:
                held += 2 * arr(4 * d['nq']) + (arr(4 * d['nq']) if d.get('fs') else 0)
    parts['weights held in RAM'] = held
    if asm:
        taps = q8_tap_tables(t, w, B, trains)
        if taps:
            parts['depthwise tap tables (q8asm)'] = taps
        n = q8_threes(t)
        if n:
            parts["pointwise convs' input rows in threes (q8asm)"] = blk(n + 4 * w)
        n = ql.cdn(ls) if trains else 0
        if n:       # (made with the net: utrain.q8 Q8Net)
            parts["convs' input-gradient rows (q8asm cdk)"] = arr(4 * n)
    if not trains:
        return parts
    # the save after an epoch (utrain.wof: trained.wof, then the checkpoint), on top of
    # all the net holds: the file it writes (its buffers: a littlefs file's cache), the
    # offset table twice (the zeroed bytes and the array('I') made of them), the
    # checkpoint's CRC buffer.  The emulated Pico's int8 runs at SGD batch 1 failed there,
    # 1-2 % under their plans, inside the fragmentation allowance (session 17)
    # A littlefs board's run holds it as one block from before the net loads and frees
    # it for each save (save_reserve, utrain.wof.hold): where training leaves only small
    # holes, the file's block lands in it
    parts[SAVE] = OPEN_FILE[w, fs] + 2 * arr(4 * t.get('ntensors', 0)) + arr(256)
    hz = q8_held(ls)
    gin = ql.gin(ls, hz)              # its input-gradient buffers (_gbuf: one or two)
    nz, nz2, ng, _ = ql.bufs(ls, hz)  # shared: int8 dz (its rescaled copy), a gradient chunk,
    A = t.get('acc') or max(d['nout'] for d in ls)
    gw = ql.gwn(ng, A)              # (none: the chunk in the sums buffer)
    st = arr(nz) + arr(nz2) + (arr(4 * gw) if gw else 0) + sum(arr(4 * n) for n in hz)
    # (and the held gradients: a slot each, utrain.q8hold); the bias sums, one buffer
    # the trained layers share (Q8Net.bs)
    st += arr(4 * ql.bsn(ls))
    opt, batch = settings['optimizer'], int(settings['batch'])
    mom = opt == 'sgd' and settings.get('momentum')
    ibias = opt == 'sgd' and batch == 1
    mask = 0
    for i, d in enumerate(ls):
        back = d.get('train') or d.get('back')
        if d.get('back') and d['k'] < q8.MEAN and d.get('pc') and not (
                i + 1 < len(ls) and ql.bcast(ls, i + 1)):
            # dz's per-channel rescaling (none held where the gradient is a broadcast row,
            # nor by the lowest trained layer: no 'back', it passes no input gradient)
            st += 2 * arr(4 * (d['nq'] if 'nq' in d else len(d['sw'])))
        if back and d.get('mask'):
            mask += arr((d['nout'] + 7) // 8)                 # its output's 1-bit mask
        if d.get('train'):          # float bias, update multipliers (weights)
            # (SGD at batch 1 with per-channel scales: an int8 fraction a bias instead of
            # a float bias, utrain.q8 Layer.be)
            st += (arr(d['nb']) if d.get('bh') and ibias else arr(4 * d['nb'])) + (
                2 * arr(4 * ql.umn(d)) if ql.umn(d) else 0)
        if d.get('gw') and q8_trained_weights(d):
            # utrain.q8grow: its weight scales' exponents and counts, the count scratch
            # (one, the widest layer's: priced per layer), and dz's per-channel
            # rescaling made at the first doubling where none is held
            nq = d['nq'] if 'nq' in d else len(d['mul'])
            st += 3 * arr(nq)
            if d.get('back') and nq > 1 and not (d.get('pc') and not (
                    i + 1 < len(ls) and ql.bcast(ls, i + 1))):
                st += 2 * arr(4 * nq)
    if mask:
        parts['output masks (1 bit an output)'] = mask
    # made at the first layer above the lowest trained one that passes a gradient back
    first = ql.lowest(ls)
    if not any(d.get('train') or d.get('back') for d in ls[first + 1:]):
        gin = 0
    parts['gradient buffers (int8 dz, int32 sums)'] = st + ((2 if ql.gtwo(ls) else 1) * arr(4 * gin)
                                                            if gin else 0)
    n_w = (1 if opt != 'sgd' or batch > 1 else 0) + (3 if opt == 'adam' else 0)
    n_b = (1 if opt != 'sgd' or batch > 1 else 0) + (2 if opt == 'adam' else 0)
    # SGD: an int8 fraction per trained weight of the layers that ask for it (Layer.wf)
    # (none for an alias of a shared weight: it reads its owner's, utrain.q8share)
    fr = sum(arr(q8_trained_weights(d)) for i, d in enumerate(ls) if d.get('train') and d.get('wf')
             and q8_trained_weights(d) and d.get('sh', i) == i) if opt == 'sgd' else 0
    # PRELU slopes that train (utrain.q8slope): their int32 gradient; Adam or a batch
    # > 1: a float32 master, its sums (and Adam's m, v)
    sl = sum(arr(4 * len(d['kc'])) * (1 + (2 if opt != 'sgd' or batch > 1 else 0)
                                      + (2 if opt == 'adam' else 0)) for d in ls if d.get('ta'))
    # a weight several layers read (utrain.q8share): its state once, the first use's; at
    # SGD batch 1 its int32 sums, and a float bias (not an int8 fraction) and its sums a
    # use (an alias of the first use's bias too: counted, shared)
    if opt == 'sgd' and batch == 1:
        sh = sum(((arr(4 * q8_trained_weights(d)) + arr(8) if d['sh'] == i else 0) + arr(4 * d['nb'])
                  + (arr(4 * d['nb']) - arr(d['nb']) if d.get('bh') else 0))
                 for i, d in enumerate(ls) if 'sh' in d and d.get('train'))
        if sh:
            parts['shared weights (summed gradients)'] = sh
    if n_w or n_b or fr or sl:    # batch sums, Adam's master, m, v: of the window
        # (and the sums' unit a layer, Layer.gk: two ints)
        parts['optimizer state'] = sl + fr + sum(
            (n_w * arr(4 * q8_trained_weights(d)) if d.get('sh', i) == i else 0) + n_b * arr(4 * d['nb'])
            + (arr(8) if n_w else 0) for i, d in enumerate(ls) if d.get('train'))
    if mom:     # an int16 velocity per trained weight (utrain.q8mom; int8 and the layer's
        #         exponent where 'v8'; none where 'nv': its weights step without
        #         momentum), an int32 or float a bias
        parts["momentum's velocities"] = sum((0 if d.get('nbv') else arr(4 * d['nb'])) + (
            (arr(q8_trained_weights(d) + 1) if d.get('v8') else arr(2 * q8_trained_weights(d)))
            if d.get('sh', i) == i and not d.get('nv') else 0)
                                             for i, d in enumerate(ls) if d.get('train'))
    # weights that train outside 'wt' / 'bt' (a TRANSPOSE_CONV's 'xt', an embedding's 'eg':
    # utrain.q8 Layer.xo), a trained layer's state: a float bias, update multipliers; a
    # batch's sums (Adam, a batch > 1; a table's at batch 1 with momentum too: its update
    # moves every row's velocity), Adam's master and moments, momentum's velocities
    xo = 0
    for d in ls:
        if d.get('xt') or d.get('eg'):
            nw, nb = (d['wn'], d['nb']) if d.get('xt') else (d['en'] * d['ed'], 0)
            xo += arr(4 * nb) + 2 * arr(4 * max(nb, 1)) + (
                arr(4 * nw) + arr(4 * nb) if opt != 'sgd' or batch > 1 or (mom and d.get('eg')) else 0) + (
                arr(8) if opt != 'sgd' or batch > 1 else 0) + (     # (the sums' unit, gk)
                3 * arr(4 * nw) + 2 * arr(4 * nb) if opt == 'adam' else 0) + (
                arr(2 * nw) + arr(4 * nb) if mom else 0)
            if d.get('eg') and opt == 'adam':   # (lazy Adam: the rows a batch read, q8emb)
                xo += arr((d['en'] + 7) >> 3) + arr(2 * min(d['en'], batch * (d['nout'] // d['ed'])))
    if xo:
        parts['optimizer state (TRANSPOSE_CONV, embedding)'] = xo
    return parts


def q8_held(ls) -> list:
    """The held gradients' slot sizes (int32 values) of layer table ls: none for a chain
    (utrain.q8load.chain), else utrain.q8hold.holds's, which a graph's net loads."""
    from ..target.device import module
    ql = module('q8load')
    first = ql.lowest(ls)
    ga = ql.grads(ls, first)
    return [] if ql.chain(ls, ga) else module('q8hold').holds(ls, ga)[1]


def q8_trained_weights(d) -> int:
    """Weights of int8 layer d that train (utrain.q8 Layer.wr: a rank's rows, a depthwise
    layer's all, none when the bias alone trains)."""
    from ..target.device import module
    return module('q8load').trained_n(dict(d, train=1))


def q8_modules(tb, trains=True, settings=None):
    """(bytecode modules, native modules) a board loads for a utrain.q8.Q8Net of layer
    table tb (as written): the trainer's (Q8_MODULES), or with trains=False the frozen
    prefix pass's, which runs before the trainer's code loads (Q8_PREFIX_MODULES), and
    those each loads only on use: what tb's layers and keys and the run's settings
    (optimizer, batch) ask for."""
    ls = tb['layers']
    mods = set(Q8_MODULES if trains else Q8_PREFIX_MODULES)
    s = settings or {}
    if trains and (s.get('optimizer', 'sgd') != 'sgd' or int(s.get('batch', 1)) > 1):
        mods.add('q8batch')          # (updates from a batch's sums: Adam, batch > 1)
    natives = ['q8kern']     # (with q8viper, and q8vk or q8asm's kernels: q8_code)
    if tb.get('groups'):
        mods.update(('q8bands', 'bands'))
    if tb.get('rr'):
        mods.add('q8range')          # (ranges that follow training)
    if trains and s.get('loss') in ('cce', 'mse', 'mae', 'bce'):
        mods.add('q8reg')            # (a loss on float targets: cce, mse, mae, bce)
    if trains and s.get('select'):
        mods.add('q8keep')           # (the board's choice applied: --select board)
    if trains and s.get('optimizer', 'sgd') == 'sgd' and s.get('momentum'):
        mods.add('q8mom')            # (momentum's int16 velocities)
        if any(d.get('xt') or d.get('eg') for d in ls):
            mods.add('q8batch')      # (their state in checkpoints: q8batch.xs)
    if trains and any(d.get('gw') and d.get('train') for d in ls):
        mods.add('q8grow')           # (weight scales that grow)
    if trains and q8_held(ls):
        mods.add('q8hold')           # (a graph's backward walk: not a chain)
    if any(d.get('ta') for d in ls):
        mods.add('q8slope')          # (PRELU slopes that train)
    if trains and any('sh' in d for d in ls):
        mods.update(('q8share', 'q8batch'))     # (weights several layers read)
    if any(d.get('mask') or d.get('sd') for d in ls):
        natives.append('q8sparse')
    from ..target.device import module
    q8 = module('q8')
    for kinds, name in (((q8.CAT,), 'q8cat'), ((q8.LUT,), 'q8lut'), ((q8.PMAX, q8.PAVG), 'q8pool'),
                        ((q8.BIN,), 'q8bin'), ((q8.SLC,), 'q8slc'), ((q8.NRM,), 'q8nrm'),
                        ((q8.TCV,), 'q8tcv')):
        if any(d['k'] in kinds for d in ls):
            natives.append(name)
    if any('bm' in d for d in ls):
        natives.append('q8bmm')      # (BATCH_MATMUL: q8bin hands it over)
    if any('sm' in d for d in ls):
        natives.append('q8smx')      # (a SOFTMAX inside the graph: q8lut hands it over)
    if any('rz' in d for d in ls):
        natives.append('q8rsz')      # (a RESIZE_*: q8slc hands it over)
    if any(d['k'] == q8.EMB for d in ls):
        mods.add('q8emb')            # (an int8 embedding's GATHER: bytecode, its table in flash)
    return mods, natives


def q8_code(tb, t, trains=True, settings=None, without=()) -> int:
    """Heap the code of q8_modules(tb, trains, settings) takes on target t: bytecode at the word
    size's resident bytes per .mpy byte; native code (viper, Thumb) in the heap where a
    board loads it into RAM (rp2: its .mpy for the board's arch, q8kern's assembler
    kernels beside it; a bytecode module with a few viper kernels, q8grow, too), else
    its tables alone (the unix port, ESP32); without: modules not loaded in the phase
    priced (Q8_LOAD, Q8_AFTER_LOAD)."""
    f = WORD_FIGURES[t['word']]
    sizes = mpy_sizes()
    mods, natives = q8_modules(tb, trains, settings)
    mods = {m for m in mods if m not in without}
    natives = [m for m in natives if m not in without]
    heap = t['native'] == 'heap' and t['arch']
    if heap:
        natives += [m for m in mods if m + '.py' in runner.NATIVE]
        mods = {m for m in mods if m + '.py' not in runner.NATIVE}
    native = 0
    for name in natives:
        if heap:
            native += native_mpy_size(t['arch'], name)
        else:       # (q8bin's and q8slc's Python part, around their kernels, is bytecode)
            native += f['native'] if name == 'q8kern' else f['native'] // 8 + (
                int(f['code'] * python_part_size(name)) if name in ('q8bin', 'q8slc', 'q8nrm', 'q8tcv', 'q8bmm', 'q8smx', 'q8rsz') else 0)
    if heap:    # q8kern's decorator module, and its Thumb kernels or their viper versions
        native += native_mpy_size(t['arch'], 'q8viper') + native_mpy_size(
            t['arch'], 'q8asm' if t['arch'] in runner.ASM['q8asm.py'] else 'q8vk')
        if 'q8mom' in natives and t['arch'] in runner.ASM['q8masm.py']:
            native += native_mpy_size(t['arch'], 'q8masm')      # (q8mom's Thumb vmk)
    return int(f['code'] * sum(sizes.get(m, 0) for m in mods)) + native


def q8_scoring(tb, sel, t) -> int:
    """Heap the board's scoring pass (prepare --select board on an int8 model: utrain.q8fish,
    run.py) takes beyond training: it runs before the trainer, on a net of its own made
    from the union's table tb (the training net's buffers, SGD at batch 1) with each
    candidate's output in a buffer of its own, two rows of float64 potentials per
    candidate channel, its code and utrain.fpick's, and train.json's select block sel
    (True: not written yet, priced without it); after it, the residue
    (FISHER_RESIDUE: interned names) and the block stay."""
    f = WORD_FIGURES[t['word']]
    w, B = t['word'], t['block']
    blk = lambda n: -(-n // B) * B      # noqa: E731
    sizes = mpy_sizes()
    code = int(f['code'] * (sizes.get('q8fish', 0) + sizes.get('fpick', 0)))
    kept = 0
    for d in tb['layers']:
        if d.get('train'):
            kept += blk(d['nout']) + blk(4 * w)             # its output, a bytearray
            kept += 2 * (blk(8 * d['nb']) + blk(4 * w) + blk(8 * w) + blk(3 * w))   # Rows
            kept += blk(w * d['nb'])        # (a Row's zeros list while it is made)
    block = json_bytes(sel, w, B) if isinstance(sel, dict) else 0
    return code + kept + block + 2 * 1024 + FISHER_RESIDUE


def plan_heap_q8(tables, settings, board=None, reserve=0) -> dict:
    """Predicted smallest heap (bytes) for an int8 run trained as int8, as plan_heap:
    {'total', 'parts', 'target', 'backend'}.  tables: {'q8.json': table} or, with the
    prefix cache, {'q8.json': the prefix's, 'q8t.json': the trained part's}, each as
    quant.as_written() makes it.  reserve: train.json's run.save_reserve (save_reserve:
    the board's plan of its save, a block the run holds while it trains and frees for
    each save), priced as the save's part where it is the larger (a folder prepared for
    a littlefs board run on another target: `run --board esp32` on the unix build, whose
    save takes 0.5-0.7 KB; the small CNN of tests/planner/test_q8_reserve.py needed
    2.5 KB more on 64-bit unix with its 1.5 KB reserve than without)."""
    t = board if isinstance(board, Target) else target(board)
    f = WORD_FIGURES[t['word']]
    w, B = t['word'], t['block']
    trained = tables.get('q8t.json') or tables['q8.json']
    asm = t['native'] == 'heap' and t['arch'] in runner.ASM['q8asm.py']
    # (the largest of the load's code (Q8_LOAD), the set-up's after it (Q8_SETUP with what
    # loads after the load) and training's with its saves'; the rest as all hold)
    ph = q8_phases(settings)
    load = q8_code(trained, t, settings=settings, without=ph['load'])
    setup = q8_code(trained, t, settings=settings, without=ph['setup'])
    sizes = mpy_sizes()
    stays = q8_code(trained, t, settings=settings, without=ph['training']) + int(
        Q8_SAVE_CODE[w, t['fs']] * f['code'] * sum(sizes.get(m, 0) for m in Q8_SAVE)) + (
        OPEN_FILE[w, t['fs']] if t['fs'] == 'littlefs' else 0)
    code = max(stays, load, setup)
    parts = {'code': code, 'interpreter': f['base'] + (LITTLEFS if t['fs'] == 'littlefs' else 0)}
    net = _q8_net(trained, settings, w, B, asm=asm, fs=t['fs'])
    net[SAVE] = max(net[SAVE], reserve)
    data = sum(net.values())
    parts.update(net)
    score = {}
    if settings.get('select'):
        score['board scoring pass (utrain.q8fish: its code, kept outputs, potentials)'] = (
            q8_scoring(trained, settings['select'], t))
    parts.update(score)
    g, r = Q8_SLACK[w]
    grad = sum(v for k, v in net.items() if k.startswith('gradient buffers'))
    # (the code slack on what stays, training's with its saves': utrain.q8load and
    # q8setup go once the net is set up, and what they kept live with them)
    parts['fragmentation allowance'] = int(g * grad + r * (data - grad) + Q8_CODE_SLACK[w] * stays) \
        + B * Q8_TRAINED_FRAG * sum(1 for d in trained['layers'] if _weights_train(d)) \
        + B * Q8_STEP_FRAG * sum(1 for d in trained['layers'] if 'wt' not in d)
    if 'q8t.json' in tables:
        pre = dict(q8_prefix_phase(tables['q8.json'], settings, t), **score)
        if sum(pre.values()) > sum(parts.values()):
            parts = pre
    return {'total': int(sum(parts.values())), 'parts': parts, 'backend': 'fallback',
            'target': t['name'], 'gc_every': 0}


def q8_prefix_phase(tb, settings, t) -> dict:
    """{part: bytes} of the frozen prefix pass of an int8 run with --cache (utrain.q8prefix):
    prefix table tb on a net of its own (then dropped), before the trainer's code loads
    (utrain.run): the prefix's code alone, the interpreter's share less what only training
    holds (Q8_PREFIX_BASE), and the fragmentation of a forward-only net (its data's; no
    trained layer, no save).  plan_heap_q8 plans the larger of this and training."""
    f = WORD_FIGURES[t['word']]
    w, B = t['word'], t['block']
    asm = t['native'] == 'heap' and t['arch'] in runner.ASM['q8asm.py']
    code = q8_code(tb, t, trains=False)
    parts = {'code': code, 'interpreter':
             f['base'] - Q8_PREFIX_BASE[w] + (LITTLEFS if t['fs'] == 'littlefs' else 0)}
    net = _q8_net(tb, settings, w, B, trains=False, asm=asm, fs=t['fs'])
    parts.update({k + ' (prefix pass)': v for k, v in net.items()})
    parts['fragmentation allowance'] = int(Q8_SLACK[w][1] * sum(net.values()) + Q8_CODE_SLACK[w] * code)
    return parts
