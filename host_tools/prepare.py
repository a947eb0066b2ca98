"""`prepare`: circle/tflite model (+ data) -> a folder with everything the board needs
besides the micro/ code: model.flat, weights.wof, train.json, train.ds, test.ds."""
from __future__ import annotations

import json
import os

import numpy as np

from . import dataset as ds
from .circle_io import read_model, atomic_write
from .flatmodel import DEFAULTS, write_flat, LOSSES, OPTIMIZERS, REDUCTIONS
from .passes import PrepareError, plan as make_plan, parse_ranks
from .traininfo import parse_traininfo, METADATA_NAME
from .wof import write_wof

FILES = {'model': 'model.flat', 'weights': 'weights.wof', 'train': 'train.ds',
         'test': 'test.ds', 'checkpoint': 'checkpoint.ckpt', 'out': 'trained.wof',
         'log': 'train.log'}


def metadata_settings(g) -> dict:
    """Training settings from the model's CIRCLE_TRAINING metadata, in our names."""
    buf = g.metadata.get(METADATA_NAME)
    if buf is None:
        return {}
    info = parse_traininfo(buf, f'{g.path}: {METADATA_NAME}')
    out = {}
    for k in ('optimizer', 'lr', 'beta1', 'beta2', 'eps', 'loss', 'from_logits', 'reduction'):
        if k in info:
            out[k] = info[k]
    for k in ('epochs', 'batch'):
        if info.get(k):
            out[k] = info[k]
    if info.get('trainable_ops'):
        # ONERT turns the list into num_of_trainable_ops: everything from the lowest
        # listed op to the end trains
        out['train'] = 'last:%d' % (len(g.ops) - min(info['trainable_ops']))
    return out


def resolve_settings(g, overrides: dict) -> dict:
    """Defaults <- CIRCLE_TRAINING metadata <- command line (overrides, None = not given)."""
    s = dict(DEFAULTS, train='all')
    s.update(metadata_settings(g))
    s.update({k: v for k, v in overrides.items() if v is not None})
    if 'metric' not in overrides or overrides['metric'] is None:
        s['metric'] = 'accuracy' if s['loss'] in ('cce', 'scce', 'bce') else 'mae'
    for key, allowed in (('loss', LOSSES), ('optimizer', OPTIMIZERS), ('reduction', REDUCTIONS)):
        if s[key] not in allowed:
            raise PrepareError(f'{key} {s[key]!r}: expected one of {", ".join(allowed)}')
    if s['batch'] < 1 or s['epochs'] < 0:
        raise PrepareError('batch must be >= 1 and epochs >= 0')
    if s['lr'] <= 0:
        raise PrepareError(f'learning rate {s["lr"]} must be positive')
    return s


def progress_step(n: int) -> int:
    """A round number of samples between progress lines, about 4 per epoch (0 = none
    for small epochs)."""
    if n < 200:
        return 0
    step = 10 ** (len(str(n // 4)) - 1)
    return n // 4 // step * step


def parse_budget(text) -> int:
    """'96K', '1M', '98304' -> bytes."""
    t = str(text).strip().upper()
    mul = 1024 if t.endswith('K') else 1024 * 1024 if t.endswith('M') else 1
    try:
        return int(float(t.rstrip('KMB') or 'x') * mul)
    except ValueError:
        raise PrepareError(f'--budget {text!r}: expected bytes, e.g. 98304, 96K or 1M') from None


def board_profile(board, overrides: dict) -> dict:
    """boards/boards.json's profile for `board`; fills the settings it defaults (batch,
    stream = its stream_frozen) into overrides where the caller gave none."""
    from .runner import boards
    known = boards()
    if board not in known:
        raise PrepareError(f'unknown board {board!r}; known: {", ".join(known)}')
    prof = known[board]
    if overrides.get('batch') is None:
        overrides['batch'] = prof['batch']
    if overrides.get('stream') is None:
        overrides['stream'] = bool(prof.get('stream_frozen'))
    return prof


def prepare(model_path, out_dir, data=None, test_split=0.0, split_seed=0, dtype='float32',
            progress=None, ranks=None, train_config=None, budget=None, board=None,
            backend='fallback', **overrides):
    """Run the host passes, check the heap plan against the budget, write the folder.
    Returns a summary dict.  data: an .npz, .csv or folder of class image folders
    (dataset.load); dtype: how the samples are stored (float32, or uint8/int8 with a
    scale, 1/4 of the flash).  ranks: 'OP:RANK,...' or {op: rank code}; train_config: an
    onert-micro training-config file (its ops train with its ranks, the others are
    frozen); budget: bytes or '96K'; board: a boards/boards.json profile: its batch and
    stream_frozen are the defaults, its heap bounds the whole plan and its heap_budget
    the plan's data (all but code and interpreter)."""
    from .memory import plan_heap, fit_advice
    from .trainconfig import read_train_config, write_train_config
    prof = board_profile(board, overrides) if board else None
    g = read_model(model_path)
    s = resolve_settings(g, overrides)
    train = s.pop('train')
    rk = {}
    if train_config:
        rk.update(read_train_config(train_config, len(g.ops)))
        if overrides.get('train') is None:
            train = 'none'
    if isinstance(ranks, dict):
        rk.update(ranks)
    elif ranks:
        rk.update(parse_ranks(ranks, len(g.ops)))
    p = make_plan(g, train, rk)
    if not p.params:
        raise PrepareError(f'{model_path}: nothing to train (no trainable weights selected)')
    heap = plan_heap(g, p, s, backend)
    limit = None
    if prof:
        # the profile's heap_budget is what model and training state may take once the
        # code is loaded: the planner's data parts; its heap bounds the whole plan
        fixed = heap['parts']['code'] + heap['parts']['interpreter']
        limit = min(parse_budget(prof['heap']), fixed + int(prof['heap_budget']))
    if budget:
        limit = parse_budget(budget) if limit is None else min(limit, parse_budget(budget))
    if limit is not None and heap['total'] > limit:
        raise PrepareError(f'{model_path}: training needs about {heap["total"] // 1024} KB of heap '
                           f'({backend}), the budget is {limit // 1024} KB'
                           + (f' ({board}: heap {prof["heap"]}, {int(prof["heap_budget"]) // 1024} KB '
                              'for model and training state)' if prof else '') + '.\n'
                           + fit_advice(g, s, train, rk, backend, limit, heap))
    os.makedirs(out_dir, exist_ok=True)
    files = dict(FILES)
    flat = write_flat(g, p, s, os.path.join(out_dir, files['model']))
    weights = {k: g.tensors[k].data for k in p.params}
    write_wof(os.path.join(out_dir, files['weights']), len(g.tensors), weights)
    summary = {'model': os.path.abspath(model_path), 'flat_bytes': flat['bytes'],
               'trainable': {g.tensors[k].name: list(g.tensors[k].shape) for k in sorted(p.params)},
               'trainable_params': int(sum(g.tensors[k].data.size for k in p.params)),
               'frozen_params': int(sum(t.data.size for t in g.tensors
                                        if t.data is not None and t.index not in p.params
                                        and t.dtype == 'float32')),
               'backward_ops': len(p.backward), 'saved_activations': len(p.saved),
               'heap': heap, 'ranks': {g.tensors[k].name: list(v) for k, v in p.ranks.items()}}
    if any(r for r in p.op_ranks.values()) or train_config:
        try:
            write_train_config(os.path.join(out_dir, 'train.tcfg'), p.op_ranks)
            summary['train_config'] = 'train.tcfg'
        except PrepareError:
            summary['train_config'] = None    # a rank onert-micro has no code for
    if data:
        x, y = ds.load(data)
        n_in = int(np.prod(g.tensors[g.inputs[0]].shape))
        n_out = int(np.prod(g.tensors[g.outputs[0]].shape))
        x = x.reshape(len(x), -1)
        if x.shape[1] != n_in:
            raise ds.DataError(f'{data}: x has {x.shape[1]} values per sample, '
                               f'the model input {g.tensors[g.inputs[0]].shape} takes {n_in}')
        y = ds.targets(y, s['loss'], n_out, data)
        tr, te = ds.split(len(x), test_split, split_seed)
        scale, offset = ds.quantization(x, dtype)     # one scale for train and test
        ds.write_dataset(os.path.join(out_dir, files['train']), x[tr], y[tr], dtype, scale, offset)
        if len(te):
            ds.write_dataset(os.path.join(out_dir, files['test']), x[te], y[te], dtype, scale,
                             offset)
        else:
            files['test'] = None
        summary.update(train_samples=len(tr), test_samples=len(te), dtype=dtype,
                       balance=ds.balance(y[tr]) if s['loss'] in ('scce', 'cce') else None)
    else:
        files['train'] = files['test'] = None
    # run: how train.py behaves (README): progress lines every N samples; validation-gated
    # saving of the best weights when there is a test split; on a NaN/Inf, restore and
    # lower lr (or 'stop')
    if progress is None:
        progress = progress_step(summary.get('train_samples', 0))
    cfg = {'files': files, 'run': {'resume': False, 'progress': progress, 'checkpoint_every': 0,
                                   'keep_best': bool(files['test']), 'on_nan': 'lower',
                                   'lr_factor': 0.5, 'max_retries': 3}}
    cfg.update(s)
    atomic_write(os.path.join(out_dir, 'train.json'),
                 (json.dumps(cfg, indent=1) + '\n').encode())
    atomic_write(os.path.join(out_dir, 'prepare.json'),
                 (json.dumps(summary, indent=1) + '\n').encode())
    summary['settings'] = s
    return summary
