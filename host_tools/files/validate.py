"""Checks of what a user hands `prepare` before anything is allocated or written
(issue 13): settings the formats cannot store, data arrays (sizes read from headers
first, so a .npy claiming 10^11 samples or a zip bomb is refused unread), and graphs
that parse but make no sense.  Every error names the file, and for a graph the op (the
file's numbering) and the tensor."""
from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from ..graph.passes import PrepareError
from ..formats.ir import final_op

# the largest dataset prepare loads into memory, and the largest activation a board
# could ever hold (elements)
MAX_DATA_BYTES = 2 << 30
MAX_ACTIVATION = 1 << 26
# float32's largest and smallest normal values: a board's float, and model.flat's settings
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)

# setting: (kind, lowest, highest, lowest excluded, highest excluded); what
# model.flat's SETTINGS ('<...HHHI...') and train.json (finite JSON numbers) can hold
SETTINGS = {
    'batch': (int, 1, 65535), 'epochs': (int, 0, 65535), 'seed': (int, 0, 0xFFFFFFFF),
    'progress': (int, 0, 0xFFFFFFFF), 'split_seed': (int, 0, 0xFFFFFFFF),
    'lr': (float, 0.0, 3e38, True, False), 'momentum': (float, 0.0, 1.0, False, True),
    'beta1': (float, 0.0, 1.0, False, True), 'beta2': (float, 0.0, 1.0, False, True),
    'eps': (float, 0.0, 1.0, True, False), 'rho': (float, 0.0, 1.0, False, True),
    'weight_decay': (float, 0.0, 3e38, False, False), 'warmup': (int, 0, 0xFFFFFFFF),
    'schedule_steps': (int, 0, 0xFFFFFFFF), 'step_size': (int, 1, 0xFFFFFFFF),
    'gamma': (float, 0.0, 1.0, True, False), 'min_lr': (float, 0.0, 1.0, False, False),
}
FLAGS = {'batch': '--batch', 'epochs': '--epochs', 'seed': '--seed', 'progress': '--progress',
         'split_seed': '--split-seed', 'lr': '--lr', 'momentum': '--momentum', 'beta1': '--beta1',
         'beta2': '--beta2', 'eps': '--eps', 'rho': '--rho', 'weight_decay': '--weight-decay',
         'warmup': '--schedule warmup=', 'schedule_steps': '--schedule steps=',
         'step_size': '--schedule step_size=', 'gamma': '--schedule gamma=',
         'min_lr': '--schedule min_lr='}
SCHEDULE_KEYS = {'warmup': ('warmup', int), 'steps': ('schedule_steps', int),
                 'step_size': ('step_size', int), 'gamma': ('gamma', float),
                 'min_lr': ('min_lr', float)}


def parse_schedule(spec) -> dict:
    """--schedule 'KIND[,warmup=N][,steps=N][,step_size=N][,gamma=F][,min_lr=F]' (KIND
    constant, linear, step or cosine; steps: the updates the decay ends at, 0 = the whole
    run; min_lr a fraction of lr) -> train.json's settings."""
    from .flatmodel import SCHEDULES
    parts = [p.strip() for p in str(spec).split(',') if p.strip()]
    if not parts or parts[0] not in SCHEDULES:
        raise PrepareError(f'--schedule {spec!r}: expected one of {", ".join(SCHEDULES)}, then '
                           'optional ,warmup=N ,steps=N ,step_size=N ,gamma=F ,min_lr=F '
                           '(e.g. cosine,warmup=100)')
    out = {'schedule': parts[0]}
    for p in parts[1:]:
        k, _, v = p.partition('=')
        if k not in SCHEDULE_KEYS or not v:
            raise PrepareError(f'--schedule {spec!r}: {p!r} is not one of '
                               f'{", ".join(k + "=..." for k in SCHEDULE_KEYS)}')
        name, kind = SCHEDULE_KEYS[k]
        try:
            out[name] = kind(v)
        except ValueError:
            raise PrepareError(f'--schedule {spec!r}: {k} must be '
                               f'{"a whole number" if kind is int else "a number"}') from None
    return out


def check_settings(s: dict) -> None:
    """PrepareError for a setting outside what model.flat and train.json store."""
    for k, spec in SETTINGS.items():
        v = s.get(k)
        if v is None:
            continue
        name = FLAGS[k]
        if spec[0] is int:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not spec[1] <= v <= spec[2]:
                raise PrepareError(f'{name} {v!r}: must be a whole number from {spec[1]} to {spec[2]}')
        else:
            lo, hi, xlo, xhi = spec[1:]
            try:        # (a string from Python, prepare(lr='0.1'): float() took it, the
                if isinstance(v, (str, bytes, bool)):      # comparisons then failed with
                    raise TypeError                        # a TypeError's traceback)
                f = float(v)
            except (TypeError, ValueError):
                raise PrepareError(f'{name} {v!r}: must be a number') from None
            def ok(f):
                return math.isfinite(f) and (lo < f if xlo else lo <= f) and (f < hi if xhi else f <= hi)
            if not ok(f):
                raise PrepareError(f'{name} {v!r}: must be a finite number {">" if xlo else ">="} '
                                   f'{lo:g} and {"<" if xhi else "<="} {hi:g}')
            # a board's float is 32 bits (and model.flat stores float32): --lr 1e-50 is 0
            # there, --beta2 0.99999999 is 1 (Adam's 1 - beta2 ** t: a division by 0)
            with np.errstate(over='ignore', under='ignore'):
                f32 = float(np.float32(f))
            if not ok(f32):
                raise PrepareError(f'{name} {v!r}: a board\'s float (32 bits) holds it as {f32:g}, '
                                   f'which is not {">" if xlo else ">="} {lo:g} and '
                                   f'{"<" if xhi else "<="} {hi:g}: give a value float32 holds '
                                   f'within that (e.g. {("%g" % (hi * 0.9999)) if xhi and f32 >= hi else "1e-30"})')
            if 0 < abs(f) < FLOAT32_TINY:
                # (below float32's normal range: MicroPython reads 1e-39 as 6.4e-39)
                raise PrepareError(f'{name} {v!r}: below {FLOAT32_TINY:.3g}, the smallest value a '
                                   'board\'s float (32 bits) holds exactly: give a value from '
                                   '1e-30' + ('' if xlo else ', or 0'))


# a loss on probabilities (no --from-logits) wants the model to end in the op that makes
# them; ops that only move values may come after it
PROBABILITIES = {'cce': 'SOFTMAX', 'scce': 'SOFTMAX', 'bce': 'LOGISTIC'}


def target_range_warning(path, g, s: dict, y) -> str | None:
    """The warning for targets y a model ending in SOFTMAX or LOGISTIC cannot reach
    (outside [0, 1]) under a loss on its outputs as they are (mse, mae, bce, cce without
    --from-logits), or None: trained, the loss can never fall below the distance to them
    (a held-out sigmoid model given class numbers 0..4 trained as a regression to them,
    saying nothing)."""
    op = final_op(g) if g.outputs else None
    if op is None or op.name not in ('SOFTMAX', 'LOGISTIC') or s.get('from_logits') or \
            s['loss'] == 'scce' or y is None or not np.size(y):
        return None
    lo, hi = float(np.min(y)), float(np.max(y))
    if lo >= 0 and hi <= 1:
        return None
    act = 'a softmax' if op.name == 'SOFTMAX' else 'a sigmoid'
    return (f'warning: {path}: the targets run from {lo:g} to {hi:g}, and the model ends in '
            f'{act} (op {op.number}), whose outputs stay in 0 to 1: {s["loss"]} cannot reach '
            'them. For classes give class numbers 0, 1, ... to a model with one output per class '
            '(scce), or 0/1 targets (bce); for a regression, a model without the final activation')


def one_class_warning(path, s: dict, y, n_out) -> str | None:
    """The warning for classifier targets y (scce's class numbers, cce's one-hot rows) of
    one class alone for a model of n_out classes, or None: trained on them it learns to
    answer that class for every input (an image folder of one class sub-folder was
    prepared, trained and scored 1.00, saying nothing)."""
    if s['loss'] not in ('scce', 'cce') or y is None or not np.size(y) or n_out < 2:
        return None
    y = np.asarray(y).reshape(len(y), -1)
    lab = y[:, 0] if y.shape[1] == 1 else y.argmax(axis=1) if y.shape[1] == n_out else None
    if lab is None or len(np.unique(lab)) != 1:
        return None
    return (f'warning: {path}: every sample is class {int(lab[0])}: a classifier of {n_out} '
            'classes trained on one class alone learns to answer it for every input; give '
            'samples of the other classes too' + (' (a sub-folder of images each)' if
                                                 os.path.isdir(os.fspath(path)) else ''))


def same_inputs_warning(path, x) -> str | None:
    """The warning for samples x (one a row) whose inputs are all the same (all zeros, one
    sample repeated, a column of labels read as the inputs), or None: the model cannot
    tell them apart and learns only how often each target is (it had trained, unsaid)."""
    if x is None or len(x) < 2:
        return None
    x = np.asarray(x).reshape(len(x), -1)
    if not np.all(x == x[:1]):
        return None
    what = 'all 0' if not np.any(x[0]) else 'each sample the same values'
    return (f'warning: {path}: every one of its {len(x)} samples has the same inputs ({what}): '
            'the model cannot tell them apart and learns only how often each target is; '
            'check the inputs (x, or the columns before the label)')


def softmax_of_one(g):
    """PrepareError when graph g's output is made by a SOFTMAX over 1 value (Keras's
    Dense(1, activation='softmax')): its output is 1 whatever the input, so no weight
    below it can train (bce took that 1 as a logit, mse and mae as the answer, and each
    run trained nothing, unsaid)."""
    op = final_op(g) if g.outputs else None
    if op is None or op.name != 'SOFTMAX' or not op.outputs:
        return
    shape = g.tensors[op.outputs[0]].shape
    if len(shape) and int(shape[-1]) == 1:
        raise PrepareError(f'{g.path}: op {op.number} (SOFTMAX) normalises 1 value: its output '
                           'is 1 for every input, so nothing below it can train (Keras: '
                           "Dense(1, activation='softmax')); end a yes/no classifier in a "
                           "sigmoid (Dense(1, activation='sigmoid'), then --loss bce), or give "
                           'it one output per class (--loss scce)')


def loss_on_logits(g, s: dict):
    """cce/scce (bce) without from_logits take probabilities, so the model should end in
    SOFTMAX (LOGISTIC).  When graph g's output is made by another op it is logits (a
    PyTorch model through tico, a Keras model without its activation): the loss then
    normalises them itself (s['from_logits'] set True), as ONERT's training does for a
    model without a final SOFTMAX; read as probabilities, a logit <= 0 would make the
    gradient -1/y about 1e20 (NaN within a few samples at any learning rate).  Returns
    the line that says so, or None when nothing changed."""
    want = PROBABILITIES.get(s['loss'])
    if want is None or getattr(g, 'step_rows', False) or getattr(g, 'step_probs', False):
        return None         # (rows of logits a step: a softmax over each, inout.step_softmax;
        #                     or each row a softmax's already: pipeline.step_classes)
    op = final_op(g)
    if s.get('from_logits'):
        if op is None or op.name != want:
            return None
        # (probabilities read as logits go through a second softmax or sigmoid: a sigmoid
        # of values in 0..1 is over 0.5 for every sample, bce's accuracy stuck at the share
        # of 1s; Keras warns of it.  The loss on the probabilities is the loss from logits
        # of the op's input: the same training)
        s['from_logits'] = False
        return (f'{g.path}: the model ends in op {op.number} ({op.name}): its output is '
                f'probabilities, not logits; {s["loss"]} takes them as probabilities (the same '
                f'gradient as from the logits {op.name} reads), without --from-logits, which '
                f'would pass them through a second {op.name}')
    if op is not None and op.name == want:
        return None
    s['from_logits'] = True
    ls = getattr(g, 'log_softmax', None)
    if ls is not None:
        if s['loss'] == 'bce':
            raise PrepareError(f'{g.path}: the model ends in op {ls} (LOG_SOFTMAX): its '
                               'log-probabilities train with --loss scce or cce (NLL), not bce')
        return (f'{g.path}: op {ls} (LOG_SOFTMAX) ends the model: {s["loss"]} trains the '
                'logits it reads (--from-logits: the NLL of its log-probabilities, the same '
                'gradient); the exported model keeps it')
    made = f'op {op.number} ({op.name})' if op is not None else 'no op'
    return (f'{g.path}: the output is made by {made}, not {want}: {s["loss"]} takes it as '
            'logits (--from-logits)')


# ------------------------------------------------------------------ data
def npz_headers(path: str) -> dict:
    """{name: (shape, dtype)} of the arrays in an .npz, from their .npy headers only."""
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.filename.endswith('.npy'):
                    continue
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                    else:
                        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                out[info.filename[:-4]] = (shape, dtype, info.file_size, info.compress_size)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, RuntimeError, NotImplementedError) as e:
        # (a model, an .npy or a CSV by another name given as the data had been 'not a
        # readable .npz file (File is not a zip file)': said what it is)
        from ..formats.kinds import kind_of
        try:
            with open(path, 'rb') as f:
                raw = f.read(4096)
        except OSError:
            raw = None
        if raw and (raw[:4] == b'PK\x03\x04' or b'PK\x03\x04'.startswith(raw)) and \
                path.lower().endswith('.npz'):
            # (the first bytes of a zip's start alone, 'P' or 'PK': an .npz cut within its
            # first 4 bytes had been 'it reads as text, not an .npz (a CSV? ...)')
            # (a zip's start, its directory at the end gone or its entries damaged: an .npz
            # cut short had been 'it reads as a zip archive (an .npz of data?), not an .npz')
            raise PrepareError(f'{path}: an .npz cut short or damaged ({e}): {NPZ_AGAIN}') from None
        kind = kind_of(raw) if raw and isinstance(e, zipfile.BadZipFile) else None
        what = (f'it reads as {kind}, not an .npz' + (
            ' (a CSV? it is read by its .csv name)' if kind == 'text' else '') if kind else
            'not a readable .npz file: the file is empty (cut short, or saved by a program '
            f'stopped before it wrote it: {NPZ_AGAIN})' if raw == b'' else
            f'not a readable .npz file ({e})')
        raise PrepareError(f'{path}: {what}; data is an .npz of arrays x '
                           'and y (np.savez(path, x=x, y=y)), a .csv, a .ds file or a folder of '
                           'class folders of images') from None
    return out


# what to do about an .npz cut short or damaged
NPZ_AGAIN = 'copy it again, or save it again (np.savez(path, x=x, y=y))'


def check_npz(path: str) -> None:
    """Refuse before loading: missing x/y, non-numeric or 0-d arrays, sizes beyond
    MAX_DATA_BYTES (as declared, and as the zip entries would inflate to)."""
    h = npz_headers(path)
    for name in ('x', 'y'):
        if name not in h:
            continue            # load_npz names what is missing
        shape, dtype, size, packed = h[name]
        if dtype.hasobject or dtype.kind not in 'biuf':
            raise PrepareError(f'{path}: array {name} holds {dtype} values; it must hold numbers' + (
                ': give class numbers 0, 1, ... (np.unique(y, return_inverse=True)[1] numbers '
                'text labels in sorted order)' if name == 'y' and dtype.kind in 'USO' else
                # (x had been left at 'it must hold numbers': what to save instead)
                f': save {name} as an array of numbers, one row a sample (np.asarray({name}, '
                'np.float32); samples of different lengths make an object array: pad or cut '
                'them to one length)'))
        if len(shape) == 0:
            raise PrepareError(f'{path}: array {name} is a single value (0-d); it must hold one '
                               'entry per sample')
        n = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if n > MAX_DATA_BYTES or size > MAX_DATA_BYTES:
            raise PrepareError(f'{path}: array {name} of shape {tuple(shape)} would take '
                               f'{n / 2**30:.3g} GB; at most {MAX_DATA_BYTES >> 30} GB is loaded: '
                               'give a part of the samples (x[:n], y[:n]); a file much smaller '
                               f'than that is damaged: {NPZ_AGAIN}')
        if size < n:
            raise PrepareError(f'{path}: array {name} claims shape {tuple(shape)} '
                               f'({n} bytes) but holds {size} bytes (truncated or corrupt): '
                               f'{NPZ_AGAIN}')


def check_values(path: str, x, y) -> None:
    """NaN/Inf in x or y, or a value float32 cannot hold (a float64 1e300, a '1e39' in a
    .csv: stored, it is Inf, which the NaN check had passed): the sample is named."""
    for name, a in (('x', x), ('y', y)):
        a = np.asarray(a)
        if a.dtype.kind != 'f':
            continue
        rows = a.reshape(len(a), -1)
        bad = ~np.isfinite(rows).all(axis=1)
        if bad.any():
            raise PrepareError(f'{path}: {name} of sample {int(np.argmax(bad))} holds NaN or Inf '
                               f'({int(bad.sum())} samples do): drop those samples or fill '
                               f'the gaps (keep = np.isfinite({name}.reshape(len({name}), -1))'
                               '.all(1))')
        big = (np.abs(rows) > FLOAT32_MAX).any(axis=1) if a.dtype.itemsize > 4 else bad
        if big.any():
            k = int(np.argmax(big))
            v = rows[k][np.argmax(np.abs(rows[k]))]
            raise PrepareError(f'{path}: {name} of sample {k} holds {float(v):g} ({int(big.sum())} '
                               f'samples hold values beyond ±{FLOAT32_MAX:.4g}), more than float32 '
                               'holds (the board stores it as Inf): scale the data into range, '
                               'or drop those samples')
        sums = np.abs(rows).sum(axis=1, dtype=np.float64)
        big = sums > FLOAT32_MAX
        if big.any():
            # (each value float32 holds, their sum not: the board checks a sample by its
            # sum, and had refused train.ds as 'holds NaN or Inf', a folder prepare wrote)
            k = int(np.argmax(big))
            raise PrepareError(f'{path}: {name} of sample {k} sums to {sums[k]:.4g} in magnitude '
                               f'({int(big.sum())} samples do), beyond ±{FLOAT32_MAX:.4g}, '
                               'what float32 holds: a board adds a sample\'s values up (its '
                               'check, its first layer) and gets Inf; scale the data down, or '
                               'drop those samples')


# ------------------------------------------------------------------ graphs
def fixed_batch(g, x) -> str | None:
    """Why input tensor x of g cannot run a sample at a time (a batch of N > 1 fixed in
    the file: Keras's Input(batch_size=8)), with what to do, or None.  prepare refuses
    it so (it had been refused as the data's size, 'x has 72 values per sample, the model
    input takes 576'), and so does evaluate (ONERT's 'cannot run it' had said nothing
    of the batch)."""
    if x is None or len(x.shape) < 2 or int(x.shape[0]) <= 1:
        return None
    return (f'{g.path}: the input tensor {x.index} ({x.name!r}) has shape {list(x.shape)}: '
            f'a batch of {int(x.shape[0])} fixed in the file; utrain runs the '
            'model a sample at a time (the batch is a training setting: '
            '--batch): export it with batch 1 or open (keras.Input(shape) '
            'without batch_size; PyTorch: a dummy input of batch 1)')


def check_graph(g) -> None:
    """PrepareError for a graph that parses but cannot run (check_runnable) or that
    utrain cannot train: an input whose length or batch is fixed at run time / in the
    file; weights that do not fit their op."""
    tname = runnable(g)     # (prepare's refusal had said what was wrong, not what to do)
    where = g.path
    nt = len(g.tensors)
    for k in g.inputs:
        x = g.tensors[k] if 0 <= k < nt else None
        sig = (x.signature or []) if x is not None else []
        free = [a for a in range(1, len(sig)) if sig[a] < 0 and x.shape[a] == 1]
        if free:        # (Keras's Input((None, F)): the file's shape holds 1 there)
            raise PrepareError(f'{where}: the input {tname(x.index)} has a length known only at '
                               f'run time (dimension {", ".join(map(str, free))} of shape signature '
                               f'{x.signature}; the file gives {list(x.shape)}): utrain trains a '
                               'fixed input shape: export the model with it fixed, e.g. '
                               'keras.Input((T, F)) with the length of your samples')
        why = fixed_batch(g, x)
        if why:
            raise PrepareError(why)
    for op in g.ops:
        check_weights(g, op, tname)


def runnable(g):
    """check_runnable for a model given to evaluate, inspect or prepare: its refusal says
    the file is damaged and what to do.  Returns check_runnable's tensor-naming function."""
    try:
        return check_runnable(g)
    except ValueError as e:
        raise PrepareError(f'{e}; the file is damaged or not a model utrain reads: use the '
                           'original (or export it again)') from None


def check_runnable(g):
    """PrepareError for a graph that parses but no runtime can run, checked before one
    (ONERT, TFLite Micro: native code that crashes the process on such a file) or prepare
    is given it: an op reading a missing or later-written tensor (a cycle, a constant
    whose buffer is gone), writing a constant or a tensor another op writes, without
    inputs or outputs; 0/negative dimensions, weights whose data does not match their
    shape or holds NaN/Inf, activations over MAX_ACTIVATION elements.  Returns the
    tensor-naming function its messages use."""
    where = g.path
    nt = len(g.tensors)
    if not g.inputs or not g.outputs:
        raise PrepareError(f'{where}: the graph names {len(g.inputs)} inputs and {len(g.outputs)} '
                           'outputs; utrain trains a model with at least one of each')

    def tname(k):
        return f'tensor {k} ({g.tensors[k].name!r})' if 0 <= k < nt else f'tensor {k}'

    for t in g.tensors:
        if any(int(d) <= 0 for d in t.shape):
            raise PrepareError(f'{where}: {tname(t.index)} has shape {list(t.shape)}: every '
                               'dimension must be at least 1')
        if t.data is not None:
            n = int(np.prod(t.shape, dtype=object)) if len(t.shape) else 1
            if t.data.size != n:
                raise PrepareError(f'{where}: {tname(t.index)} has shape {list(t.shape)} ({n} '
                                   f'values) but its buffer holds {t.data.size}')
            if t.data.dtype.kind == 'f' and not np.isfinite(t.data).all():
                raise PrepareError(f'{where}: {tname(t.index)} holds NaN or Inf weights')
        elif int(np.prod(t.shape, dtype=object)) > MAX_ACTIVATION:
            raise PrepareError(f'{where}: {tname(t.index)} of shape {list(t.shape)} has '
                               f'{int(np.prod(t.shape, dtype=object))} elements; a board holds '
                               f'at most {MAX_ACTIVATION}')
    for k in list(g.inputs) + list(g.outputs):
        if not 0 <= k < nt:
            raise PrepareError(f'{where}: the graph names {tname(k)} as an input or output; '
                               f'it has {nt} tensors')
    written = {k: None for k in g.inputs}
    for op in g.ops:
        what = f'{where}: op {op.index} ({op.name})'
        if not [k for k in op.inputs if k >= 0]:
            raise PrepareError(f'{what} has no inputs')
        if not op.outputs:
            raise PrepareError(f'{what} has no outputs')
        for k in op.inputs:
            if k < 0:
                continue
            if k >= nt:
                raise PrepareError(f'{what} reads {tname(k)}; the graph has {nt} tensors')
            t = g.tensors[k]
            if t.data is None and k not in written:
                later = [o.index for o in g.ops if k in o.outputs]
                raise PrepareError(f'{what} reads {tname(k)}, which ' + (
                    f'op {later[0]} writes after it (a cycle, or ops out of order)' if later
                    else 'is neither a constant, a graph input nor written by an op'))
        for k in op.outputs:
            if not 0 <= k < nt:
                raise PrepareError(f'{what} writes {tname(k)}; the graph has {nt} tensors')
            if g.tensors[k].data is not None:
                raise PrepareError(f'{what} writes {tname(k)}, which is a constant')
            if k in written:
                prev = written[k]
                raise PrepareError(f'{what} writes {tname(k)}, which ' + (
                    'is a graph input' if prev is None else f'op {prev} writes too'))
            written[k] = op.index
    for k in g.outputs:
        if k not in written and g.tensors[k].data is None:
            raise PrepareError(f'{where}: graph output {tname(k)} is written by no op')
    return tname


def _shape(g, k):
    return [int(d) for d in g.tensors[k].shape]


def check_weights(g, op, tname):
    """Weights that do not fit their op's input: FULLY_CONNECTED [out, in] against the
    input's features, CONV_2D (grouped too) / DEPTHWISE_CONV_2D against the input's channels, and a
    bias of the wrong length."""
    what = f'{g.path}: op {op.index} ({op.name})'
    ins = op.inputs
    if op.name not in ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D') or len(ins) < 2 or ins[1] < 0:
        return
    x, w = _shape(g, ins[0]), _shape(g, ins[1])
    if any(int(d) < 0 for d in (g.tensors[ins[0]].signature or [])[1:]):
        return      # (a shape read at run time, [1, 1] in the file: fold_shapes computes it)
    n_out = None
    if op.name == 'FULLY_CONNECTED':
        if len(w) != 2 or (x and int(np.prod(x)) % w[1]) or (x and x[-1] != w[1] and len(x) <= 2):
            raise PrepareError(f'{what}: weight {tname(ins[1])} of shape {w} does not fit input '
                               f'{tname(ins[0])} of shape {x} (FULLY_CONNECTED wants [outputs, {x[-1] if x else "?"}])')
        n_out = w[0]
    elif op.name == 'CONV_2D':
        # (a grouped convolution's weight has in / groups channels: groups.split_groups)
        if len(w) != 4 or len(x) != 4 or w[3] < 1 or x[3] % w[3] or w[0] % (x[3] // w[3]):
            c = x[3] if len(x) == 4 else 'in'
            raise PrepareError(f'{what}: weight {tname(ins[1])} of shape {w} does not fit input '
                               f'{tname(ins[0])} of shape {x} (CONV_2D wants [out, h, w, {c}], or '
                               f'[out, h, w, {c} / groups] with out a multiple of groups)')
        n_out = w[0]
    else:
        if len(w) != 4 or len(x) != 4 or w[3] % x[3]:
            raise PrepareError(f'{what}: weight {tname(ins[1])} of shape {w} does not fit input '
                               f'{tname(ins[0])} of shape {x} (DEPTHWISE_CONV_2D wants [1, h, w, '
                               f'{x[3] if len(x) == 4 else "in"} x multiplier])')
        n_out = w[3]
    if len(ins) > 2 and ins[2] >= 0 and int(np.prod(_shape(g, ins[2]))) != n_out:
        raise PrepareError(f'{what}: bias {tname(ins[2])} of shape {_shape(g, ins[2])} does not '
                           f'match the {n_out} outputs of weight {tname(ins[1])}')


# What to do about a file the system refused, by errno (os_error_text)
_OS_ADVICE = {
    'ENOENT': 'no such file or folder; check the path',
    'EISDIR': 'is a folder; give the path of a file',
    'ENOTDIR': 'a part of the path is a file, not a folder; check the path',
    'EEXIST': 'exists already; give a path that does not, or remove it',
    'EACCES': 'permission denied; use a path you may read and write',
    'EPERM': 'not permitted; use a path you may read and write',
    'ENOSPC': 'no space left on the device; free some space or write elsewhere',
    'EDQUOT': 'over the disk quota; free some space or write elsewhere',
    'EFBIG': 'larger than this process may write (the shell\'s `ulimit -f`); raise the limit '
             'or write elsewhere',
    'EROFS': 'on a read-only file system; write elsewhere',
    'ENAMETOOLONG': 'the name is too long; use a shorter path',
}


def os_error_text(e: OSError, where=None) -> str:
    """An OSError as a refusal: the file it names, what the system said and what to do
    ("[Errno 21] Is a directory: '/tmp'" becomes "/tmp: is a folder; give the path of a
    file").  An error our code worded (no errno) stays as it is.  A write the system
    refused at a file's close names no file: it is named by where, the folder or file
    the command writes (a full disk had been "[Errno 28] No space left on device")."""
    import errno
    name = errno.errorcode.get(e.errno, '') if e.errno else ''
    full = name in ('ENOSPC', 'EDQUOT', 'EFBIG')
    if full and e.filename2 is not None:
        # (shutil.copy names its source first: the copy of micro/train.py into a run
        # folder on a full disk had blamed micro/train.py)
        e = OSError(e.errno, e.strerror, e.filename2)
    if e.filename is None and ': cannot write it (' in str(e.strerror):
        return e.strerror       # (atomic_write's words, without '[Errno 28] ' before them)
    if full and e.filename is None and where:
        return f'{where}: cannot write there: {_OS_ADVICE[name]}'
    if not e.errno or e.filename is None:
        return str(e)
    if name == 'EEXIST' and os.path.lexists(e.filename) and not os.path.isdir(e.filename):
        # (a folder to make where a file is: `-o model.circle/run`, `dataset -o notes.txt`;
        # 'exists already; ... or remove it' had advised removing the user's file)
        return (f'{e.filename}: is a file, and a folder is needed there; give the path of a '
                'folder (a new one, or one that exists)')
    if name in ('ENOENT', 'ELOOP'):
        from ..paths import broken_link
        link = broken_link(e.filename)
        if link:
            return link
    what = _OS_ADVICE.get(name, f'{e.strerror}; check the path')
    return f'{e.filename}: {what}'
