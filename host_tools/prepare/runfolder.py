"""The prepared folder: the files prepare writes for the board (FILES; OUTPUTS: every name
it may write) and the passes that check and write them, shared by the float path
(prepare.py) and the int8 path (quant.prepare_q8): the output-folder check, the samples
read (read_data) and written (write_data), the board's flash checked (check_flash), the
frozen-prefix caches, train.json and prepare.json (write_run_config); and the file
identifier an exported model gets (out_identifier)."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np

from ..files import dataset as ds
from ..files.locks import PID_FILE, staging_folder, holder, locked
from ..formats.circle_io import atomic_write
from ..graph.passes import PrepareError
from ..target.runner import FILES


def progress_step(n: int) -> int:
    """A round number of samples between progress lines, about 4 per epoch (0 = none
    for small epochs)."""
    if n < 200:
        return 0
    step = 10 ** (len(str(n // 4)) - 1)
    return n // 4 // step * step


OUTPUTS = tuple(FILES.values()) + ('train.json', 'prepare.json', 'train.tcfg')


def too_long_to_stage(out_dir):
    """PrepareError when out_dir's name, or its staging folder's (staging_folder: the
    name + '.preparing'), does not fit its file system: the refusal had named
    OUT.preparing, a folder the user never gave, as 'too long'."""
    from ..files.locks import PREPARING
    name = os.fsencode(os.path.basename(os.path.normpath(out_dir)))
    try:
        most = os.pathconf(os.path.dirname(os.path.abspath(out_dir)), 'PC_NAME_MAX')
    except (OSError, ValueError):   # (a parent not there yet: the common limit)
        most = 255
    if most < len(name):        # (also named as OUT.preparing, 'the name is too long')
        raise PrepareError(f'{out_dir}: a name of {len(name)} bytes, over the file system\'s '
                           f'{most} bytes a name: give -o a name of at most '
                           f'{most - len(PREPARING)} bytes')
    if len(name) <= most < len(name) + len(PREPARING):
        raise PrepareError(f'{out_dir}: a name of {len(name)} bytes; prepare writes the folder '
                           f'first as that name + {PREPARING!r} beside it, over the file '
                           f"system's {most} bytes a name: give -o a name of at most "
                           f'{most - len(PREPARING)} bytes')


def check_outputs(out_dir, inputs, names=OUTPUTS, cmd='prepare'):
    """The output-folder pass: PrepareError when out_dir is not a folder, is in the image
    folder it reads, or a file prepare writes there (names) is one of its inputs (model,
    data, training config, in that order; None: not given); cmd: the command, in the
    refusals (`dataset` checks its -o so too).  The rewritten graph is checked where it is written: a graph that needs no
    rewrite may be prepared again from its own folder's rewritten.circle.  (A run or
    another prepare in out_dir: Staged refuses it.)"""
    for src in inputs:
        for n in names:
            if src and n != FILES['rewritten'] and os.path.exists(os.path.join(out_dir, n)) \
                    and os.path.exists(src) and os.path.samefile(src, os.path.join(out_dir, n)):
                raise PrepareError(f'{src}: {cmd} writes {n} in {out_dir}, which is this input; '
                                   f'{cmd} into another folder (-o)')
    from ..paths import broken_link, MICRO
    if (os.path.realpath(out_dir) + os.sep).startswith(os.path.realpath(MICRO) + os.sep):
        # (its train.json, model and samples had been written among the board's code, which
        # deploy copies onto every board and run copies into every run folder)
        raise PrepareError(f'{out_dir}: utrain\'s own board code ({MICRO}), which deploy and '
                           f'run copy onto the board: {cmd} into another folder (-o)')
    loop = broken_link(out_dir, loops_only=True)    # (had been 'OUT.preparing: a part of
    if loop:                                        # the path is a file')
        raise PrepareError(loop)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PrepareError(f'{out_dir}: is a file, and {cmd} writes a folder there; give -o the '
                           'path of a folder (a new one, or one that exists)')
    src = inputs[1] if len(inputs) > 1 else None       # (the data: an image folder)
    if src and os.path.isdir(src) and (os.path.realpath(out_dir) + os.sep).startswith(
            os.path.realpath(src) + os.sep):
        # (its run's lib/ and earlier-N/ became class folders, its files sat among them)
        raise PrepareError(f'{out_dir}: in the image folder {src}, whose sub-folders are '
                           f'its classes: {cmd} into a folder outside it (-o)')


# A prepare writes its folder OUT in a staging folder beside it, OUT.preparing (a copy of
# OUT as it was, when there was one), which replaces OUT when everything is written: a
# prepare stopped half way (Ctrl-C, a kill, a refusal, an error) leaves OUT as it was, or
# no OUT.  OUT.preparing and OUT (if any) are locked (flock: the kernel drops the lock with
# the process, killed or not) for the prepare's time, as runner.run locks OUT for a run's.


def _locked(path, refusal):
    """An fd of path (a folder) holding its lock, or PrepareError(refusal(who holds it))."""
    return locked(path, refusal, PrepareError)


def _exchange(a, b) -> bool:
    """Swap folders a and b in one step (Linux renameat2 RENAME_EXCHANGE); False where
    the system cannot."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        f = libc.renameat2
    except (OSError, AttributeError):
        return False
    return f(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0     # (AT_FDCWD, EXCHANGE)


def _fill(src, dst):
    """dst (the staging folder) as src is: its files copied (prepare writes over some),
    its folders' (earlier-N/, lib/: prepare writes in none) linked, not copied."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    for n in os.listdir(src):
        a, b = os.path.join(src, n), os.path.join(dst, n)
        if os.path.isdir(a) and not os.path.islink(a):
            shutil.copytree(a, b, symlinks=True, copy_function=link)
        else:
            shutil.copy2(a, b, follow_symlinks=False)


class Staged:
    """with Staged(out_dir, log) as stage: prepare writes into stage; on leaving without
    an exception stage replaces out_dir (the old folder removed), else stage is removed
    and out_dir is as it was.  Refuses (PrepareError) when another prepare or a run holds
    out_dir or its staging folder, naming it; a staging folder nothing holds (a prepare
    killed half way) is removed, and said so."""

    def __init__(self, out_dir, log=print):
        # (a symbolic link to a folder: the folder it names is replaced, the link kept)
        self.out, self.log, self.fds = os.path.realpath(out_dir), log, []
        self.stage = staging_folder(self.out)
        self.given = out_dir            # (named in what prepare says)
        here = os.path.realpath(os.getcwd())
        # written in place: the folder this process (and the shell that started it) is in,
        # as a folder swapped away would leave the shell in a removed one; a folder of
        # other files than a preparation's (-o ~, -o /), which staging would copy whole
        self.inplace = here == self.out or here.startswith(self.out + os.sep) or (
            os.path.isdir(self.out) and bool(os.listdir(self.out)) and not any(
                os.path.isfile(os.path.join(self.out, n)) for n in ('train.json', 'prepare.json')))

    def __enter__(self):
        out, stage = self.out, self.stage
        name, sname = os.path.normpath(self.given), staging_folder(self.given)

        def preparing(who):     # (another prepare holds the staging folder)
            return (f'{name}: {who} is preparing this folder (in {sname}); wait for it to end '
                    '(or stop it), or prepare into another folder')
        os.makedirs(os.path.dirname(stage), exist_ok=True)
        if os.path.isdir(out):
            self.fds.append(_locked(out, lambda who: (
                f'{name}: {who} is using this folder; wait for it to end (or stop it), or '
                'prepare into another folder')))
        if self.inplace:
            return self.given
        try:
            os.mkdir(stage)
        except FileExistsError:
            if not os.path.isdir(stage):
                self._unlock()
                raise PrepareError(f'{sname}: a file where prepare writes {name} first (its '
                                   'staging folder); move it away') from None
            fd = _locked(stage, preparing)
            try:
                with open(os.path.join(stage, PID_FILE)) as f:
                    old = f' (pid {int(f.read().split()[0])})'
            except (OSError, ValueError, IndexError):
                old = ''
            shutil.rmtree(stage)
            os.close(fd)
            self.log(f'{sname}: removed, the unfinished folder of a prepare that was stopped '
                     f'half way{old}; {name} was left '
                     'as it was')
            os.mkdir(stage)
        self.fds.append(_locked(stage, preparing))
        try:
            with open(os.path.join(stage, PID_FILE), 'w') as f:
                f.write(f'{os.getpid()}\n')
            if os.path.isdir(out):      # (what prepare keeps of it: earlier runs, ...)
                _fill(out, stage)
        except BaseException:
            self._drop()
            raise
        return stage

    def _unlock(self):
        while self.fds:
            os.close(self.fds.pop())

    def _drop(self):
        shutil.rmtree(self.stage, ignore_errors=True)
        self._unlock()

    def __exit__(self, kind, e, tb):
        if self.inplace:
            self._unlock()
            return False
        if kind is not None:
            self._drop()
            return False
        try:
            os.remove(os.path.join(self.stage, PID_FILE))
            if not os.path.isdir(self.out):
                os.rename(self.stage, self.out)
            elif _exchange(self.stage, self.out):
                shutil.rmtree(self.stage, ignore_errors=True)      # (the folder as it was)
            else:
                gone = self.stage + '.old'
                os.rename(self.out, gone)
                os.rename(self.stage, self.out)
                shutil.rmtree(gone, ignore_errors=True)
        except BaseException:
            self._drop()
            raise
        self._unlock()
        return False


# the defaults that depend on the run (run_defaults): SGD's lr a sample (DEFAULTS' lr, at
# batch 1), the samples a run sees at least, in at most MOST_EPOCHS epochs
SEEN = 1000
MOST_EPOCHS = 10


def run_defaults(s, given, n_train, log, model_path) -> dict:
    """s with the settings nobody gave (given: the names the command line or the model's
    metadata set) that depend on the run: SGD's lr (mean reduction) its default a sample
    times the batch (at a board's batch of 4 the default took a quarter of the steps at
    one size: a tico CNN fine-tuned on a Pico's defaults fell from 0.92 to 0.74 test
    accuracy where batch 1 reached 0.99; PyTorch's SGD the same), and epochs enough to
    see about SEEN samples (n_train: the training samples; at most MOST_EPOCHS: one epoch
    of 90 samples barely moved five Keras models made outside the project, ten took them
    from 0.33-0.57 to 0.63-0.80).  Says what it chose."""
    from ..files.flatmodel import DEFAULTS
    s, said = dict(s), []
    if 'lr' not in given and s['optimizer'] == 'sgd' and s['reduction'] == 'mean' and \
            int(s['batch']) > 1 and n_train != 1 and s['lr'] == DEFAULTS['lr']:
        # (a batch larger than the samples updates with the mean of those there are: a
        # --batch 1000 on 30 samples had lr 10, 0.33 a sample, and the run diverged)
        b = min(int(s['batch']), n_train or int(s['batch']))
        s['lr'] = DEFAULTS['lr'] * b
        said.append(f'lr {s["lr"]:g} ({DEFAULTS["lr"]:g} a sample, at batch {s["batch"]}'
                    + (f', one update of all {b} samples an epoch' if b < int(s['batch']) else '')
                    + ')')
    if 'epochs' not in given and n_train and s['epochs'] == DEFAULTS['epochs']:
        e = min(MOST_EPOCHS, max(1, -(-SEEN // n_train)))
        if e != s['epochs']:
            s['epochs'] = e
            said.append(f'{e} epochs (about {e * n_train} samples seen of {n_train})')
    if said:
        log(f'{model_path}: trains at ' + ' and '.join(said) + ': --lr and --epochs set others')
    return s


def read_data(data, shape=None, n_out=None, perm=None, loss=None, where='the model input',
              inputs=None, out_shape=None):
    """The read half of prepare's samples pass (dataset.read_samples), before anything is
    written: data laid out for the model input of shape (perm: as the rewrites transposed
    it; inputs: a model's several, joined: dataset.load_inputs) with n_out outputs and
    targets for loss (out_shape: the output's).  Returns (x, y), or None without data."""
    return ds.read_samples(data, shape, perm, loss, n_out, where, inputs=inputs,
                           out_shape=out_shape) if data else None


def budget_short(model_path, budget, heap, limit, advice) -> str | None:
    """A --budget (its text) below this run's code and interpreter alone (heap: its plan,
    limit: the budget's bytes) where no option tried fits (advice: the planner's lines):
    one paragraph, what it is short of and what to give, for the planner's report."""
    from ..target.runner import roomier
    fixed = heap['parts']['code'] + heap['parts']['interpreter']
    if limit >= fixed or 'nothing tried fits' not in str(advice):
        return None
    need = -(-heap['total'] // 1024)
    return (f'{model_path}: --budget {budget} is less than the utrain code and MicroPython '
            f'interpreter of this run take alone (about {fixed // 1024} KB), before the model; '
            f'the whole run plans about {need} KB: give --budget {need}K or more if your board '
            'has it free' + (roomier(heap) or '; or --board NAME for a known board\'s heap'))


def int8_bytes(g) -> int:
    """What an int8 run of graph g stores on the board besides the samples: its weights
    as int8 (a float model's as they will be) and 32-bit biases (weights.wof), q8.req's
    multipliers and q8.json, reckoned at a fifth more than the weights and 16 KB."""
    n = sum(t.data.size * (4 if t.data.dtype.kind in 'iu' and t.data.dtype.itemsize >= 4 else 1)
            for t in g.tensors if t.data is not None)
    return int(1.2 * n) + 16384


def float_bytes(g, model_path) -> int:
    """What a float run of graph g stores on the board besides the samples (model.flat and
    weights.wof): its constants as float32 (int8 ones dequantized), or the model file's
    size where that is more.  The file's size alone had passed an ONNX model whose
    weights lie in an external .data file (13 KB given, 1 MB on the board) and an int8
    file trained dequantized (277 KB given, 1 MB on the board) on a Pico's 1408 KB, that
    deploy then refused."""
    n = sum(t.data.size * max(4, t.data.dtype.itemsize) for t in g.tensors if t.data is not None)
    return max(os.path.getsize(model_path), n + 4096)


def cut_bytes(g, params) -> int:
    """Bytes a sample of a --cache-on-host prefix cache holds (utrain.prefix: the float32
    values the frozen prefix hands the first op that trains; params: the trained tensors),
    reckoned on graph g: the inputs without data of the ops from that one on which the
    ops before it, or the model input, make."""
    from ..graph.optable import SPECS
    from ..plan.memory import prefix_cut
    k = min((op.index for op in g.ops
             if any(t in params for t in SPECS[op.name].inputs(op))), default=0)
    return sum(4 * int(np.prod(g.tensors[t].shape)) for t in prefix_cut(g, k))


def check_flash(model_path, xy, dtype, board, model_bytes=None, writes=None):
    """The flash pass: with --board, samples stored as dtype that would overflow the
    board's file system with the model and the code are refused, saying what fits
    (runner.flash_advice: --dtype uint8 for float samples; fewer samples or a board with
    more flash for 8-bit ones).  The model's files are reckoned at model_bytes, or at its
    file's size (a float model trained as int8 stores its int8 weights: the int8 path
    gives their size).  writes: runner.train_writes's keywords (the trained layers or
    shapes, optimizer, momentum; cache: an int8 trained part's table whose prefix cache the
    board makes, here sized for these samples): what training writes there, counted too."""
    if not board or xy is None:
        return
    from ..target.runner import flash_advice, on_flash
    from ..plan.memory import mpy_sizes
    x, y = xy
    samples = 2 * ds.HEAD + len(x) * ((4 if dtype == 'float32' else 1) * x.shape[1] + 4 * y.shape[1])
    if model_bytes is None:
        model_bytes = os.path.getsize(model_path)
    # (in the file system's blocks: the samples' files, the model's (reckoned as one),
    # the code's and train.py / train.json, a block more each at the most)
    ds_files = [samples] if samples else []
    total = on_flash(ds_files + [model_bytes] + list(mpy_sizes().values()) + [4096], board)
    made = (0, '')
    if writes is not None:
        from ..target.runner import train_writes, q8_cache_bytes
        w = dict(writes)
        table = w.pop('cache', None)
        rec = w.pop('cut', 0)
        if table is not None:
            w['cache'] = q8_cache_bytes(table, len(x), y.shape[1])
        elif rec:           # (--cache-on-host: train.ds.pfx / test.ds.pfx, deploy copies them)
            w['cache'] = (2 * ds.HEAD + len(x) * rec, len(x))
            w['cache_what'] = 'the prefix cache prepare writes'
        made = train_writes(**w)
    why = flash_advice(model_path, total, board, samples, len(x), dtype, made)
    if why:
        raise PrepareError(why)


def write_data(out_dir, xy, files, loss, test_split=0.0, split_seed=0, dtype='float32',
               scale=None, offset=None, out_shape=None, where=None) -> dict:
    """The write half: train.ds and test.ds from xy (read_data's; None: no data), split
    and stored as dtype (scale, offset: given, or from the data's range; out_shape: the
    output's, whose rows a class a step fill).  Sets files' train and test to what it
    wrote (None: not written); returns the summary's sample fields."""
    if xy is None:
        files['train'] = files['test'] = None
        _drop_stale_samples(out_dir, files)
        return {}
    x, y = xy
    tr, te, _, _, wrote = ds.write_samples(out_dir, x, y, test_split, split_seed, dtype,
                                           (files['train'], files['test']), scale, offset,
                                           where)
    if files['test'] not in wrote:
        files['test'] = None
    _drop_stale_samples(out_dir, files)
    return dict(train_samples=len(tr), test_samples=len(te), dtype=dtype,
                shuffled=bool(np.any(np.diff(tr) < 0)),     # (ds.sorted_by_class)
                balance=ds.balance(y[tr], (ds.per_step(out_shape) or (0, 0))[1] if
                                   y.shape[1] > 1 else 0) if loss in ('scce', 'cce') else None)


def _drop_stale_samples(out_dir, files):
    """An earlier prepare's train.ds / test.ds this one did not write (no --data, no test
    split now) would be taken for this preparation's samples (evaluate, deploy by hand)."""
    for k in ('train', 'test'):
        p = os.path.join(out_dir, FILES[k])
        if files[k] is None and os.path.isfile(p):
            os.remove(p)


# an int8 run's state beside trained.wof (ranges, weight scales, PRELU slopes, transposed
# convolutions', embedding tables: utrain.q8*), which export reads with it
BESIDE = ('.q8s', '.q8w', '.q8a', '.q8c', '.q8e')
# what a run leaves in its folder (train.py): they belong to the preparation it ran
RUN_OUTPUTS = (FILES['log'], FILES['out'], FILES['out'] + '.best', FILES['checkpoint']) + tuple(
    FILES['out'] + e for e in BESIDE)


def set_aside_earlier_run(out_dir, log=print) -> str | None:
    """A folder prepared again: an earlier run's train.log, trained.wof (and .best) and
    checkpoint.ckpt belong to the earlier preparation (another model or settings): the new
    run would append its epochs under the old log's header (a regression's MAE under an
    'accuracy' column, plot drawing both runs as one) and resume from the old checkpoint.
    They move into earlier-N/ in the folder, nothing lost, and prepare says so; the
    preparation's other files (prepare.json, a rewritten graph, q8.json, ...; not the
    samples) are copied beside them, so that `export MODEL earlier-N/trained.wof` works.
    Returns that folder, or None."""
    import shutil
    there = [n for n in RUN_OUTPUTS if os.path.isfile(os.path.join(out_dir, n))]
    if not there:
        return None
    k = 1
    while os.path.exists(os.path.join(out_dir, f'earlier-{k}')):
        k += 1
    dst = os.path.join(out_dir, f'earlier-{k}')
    os.mkdir(dst)
    for n in there:
        os.replace(os.path.join(out_dir, n), os.path.join(dst, n))
    for n in os.listdir(out_dir):
        if os.path.isfile(os.path.join(out_dir, n)) and not n.endswith(('.ds', '.pfx', '.tmp')) \
                and n != PID_FILE:
            shutil.copy2(os.path.join(out_dir, n), os.path.join(dst, n))
    log(f'{out_dir} held an earlier run: moved its {", ".join(there)} to {dst} (this '
        'preparation starts a run of its own)')
    return dst


def write_prefix_caches(out_dir, files, cache) -> dict:
    """The prefix-cache pass: drops an earlier prepare's frozen-prefix caches (stale now)
    and with cache 'host' writes the datasets' (host_tools.files.prefixcache).  Returns the
    summary's 'prefix_cache' field, if any."""
    for f in os.listdir(out_dir):
        if f.endswith(('.pfx', '.pfx.tmp')):
            os.remove(os.path.join(out_dir, f))
    if cache == 'host' and files['train']:
        from ..files.prefixcache import write_caches
        return {'prefix_cache': write_caches(out_dir, files)}
    return {}


def fingerprint(out_dir, files) -> int:
    """The CRC32 of the prepared files a run's checkpoint belongs to (files' model,
    weights, quant and prefix, as written in out_dir): train.json's run.fingerprint, which
    the board writes into every checkpoint and compares, bytes only, when it resumes one (a
    checkpoint of another model of the same tensor sizes, copied in from another folder,
    had resumed without a word; docs/formats.md)."""
    import zlib
    c = 0
    for k in ('model', 'weights', 'quant', 'prefix'):
        if files.get(k):
            with open(os.path.join(out_dir, files[k]), 'rb') as f:
                c = zlib.crc32(f.read(), c)
    return c


def write_run_config(out_dir, files, s, summary, progress=None, extra=(), **run) -> dict:
    """The run-config pass: train.json (files, run: how train.py behaves (README), the
    settings s, then extra) and prepare.json (summary).  Progress lines every N samples
    (None: about 4 per epoch); the best weights are kept by validation when there is a
    test split; run: the rest of the run block (on_nan: on a NaN/Inf, restore and lower lr
    or 'stop').  Returns summary with the settings."""
    if progress is None:
        progress = progress_step(summary.get('train_samples', 0))
    cfg = {'files': files, 'run': dict({'resume': False, 'progress': progress,
                                        'checkpoint_every': 0, 'keep_best': bool(files['test'])},
                                       **run, fingerprint=fingerprint(out_dir, files))}
    cfg.update(s)
    cfg.update(extra)
    # the board's own check of what it will read (utrain/config.py): a train.json it refuses
    # is refused here, before anything is written (the settings were checked one by one,
    # not together: a warmup past the decay's end had been written)
    from ..target.device import module
    try:
        as_read = json.loads(json.dumps(cfg))
        module('config').settings(as_read, as_read['run'], 'train.json')
    except ValueError as e:
        raise PrepareError(f'{e}: the board would refuse the train.json these options make; '
                           'change them (docs/options.md)') from None
    atomic_write(os.path.join(out_dir, 'train.json'),
                 (json.dumps(cfg, indent=1) + '\n').encode())
    atomic_write(os.path.join(out_dir, 'prepare.json'),
                 (json.dumps(summary, indent=1) + '\n').encode())
    summary['settings'] = s
    return summary


def out_identifier(out_path, ident: bytes) -> bytes:
    """The file identifier an exported model gets: what its name's extension says
    (.circle: CIR0, .tflite: TFL3; the schemas share their tables and op codes), else
    the model's own."""
    ext = os.path.splitext(out_path)[1].lower()
    return {'.circle': b'CIR0', '.tflite': b'TFL3'}.get(ext, ident)
