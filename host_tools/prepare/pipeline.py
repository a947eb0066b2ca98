"""`prepare`: circle/tflite model (+ data) -> a folder with everything the board needs
besides the micro/ code: model.flat, weights.wof, train.json, train.ds, test.ds.

prepare() is a list of passes: settle (settings, model read and checked) -> [an int8
model: quant.prepare_q8] -> [a float model for a board without ulab, or --int8:
from_float, an int8 version calibrated on the data (fromfloat.py), quant.prepare_q8] ->
validate.loss_on_logits -> run_select (--select) ->
what_trains (--train, --ranks, --train-config) -> select_rewrite_plan (select, rewrite,
plan) -> plan_memory -> check_budget -> read_data -> check_outputs -> write_folder (+
describe: prepare.json's summary) -> write_data -> write_prefix_caches ->
write_run_config: nothing is written before every check has passed.  The run's plan
(what_trains .. plan_memory) is host_tools/plan/runplan.py's, the folder's files and their
passes (FILES, read_data, check_outputs, write_data ..) host_tools/prepare/runfolder.py's, which
the int8 path shares; the rest is here.  `inspect` runs select_rewrite; `dataset` the
samples pass (dataset.read_samples, write_samples) as well."""
from __future__ import annotations

import copy
import json
import os

import numpy as np

from ..formats.circle_io import read_model, atomic_write
from ..files.flatmodel import DEFAULTS, write_flat, LOSSES, OPTIMIZERS, REDUCTIONS, SCHEDULES
from ..plan.memory import board_limit, plans_by_target
from ..graph.passes import PrepareError, RANK_NAMES, UNSUPPORTED, parse_ranks
from . import quant
from ..graph.inout import choose_output, compact, drop_step_softmax, file_graph, save_graph
from ..graph.embeddings import embedding_ids_back
from ..graph.groups import join_groups
from ..graph.edit import new_tensor
from ..graph.qparams import quantize
from ..graph.inscale import unscale_input
from ..files.dataset import split as ds_split
from .lrprobe import probe_lr, probe_written
from .runfolder import (FILES, OUTPUTS, Staged, budget_short, check_flash, check_outputs,
                        cut_bytes, float_bytes,
                        int8_bytes, out_identifier, read_data, run_defaults, set_aside_earlier_run,
                        too_long_to_stage, write_data, write_prefix_caches, write_run_config)
from ..plan.runplan import (plan_memory, select_rewrite, select_rewrite_plan, what_trains, off_output,
                            io_summary)
from ..formats.traininfo import parse_traininfo, METADATA_NAME
from ..files.validate import (loss_on_logits, one_class_warning, target_range_warning,
                              same_inputs_warning)
from ..files.wof import write_wof
from ..target.device import light_gc

# prepare's refusal of a selection with no weights (float and int8 alike)
NOTHING = 'nothing to train (no trainable weights selected)'


def missing_biases(model_path, g, p) -> list:
    """A line on the trained ops whose file gives them no bias tensor (Keras's
    use_bias=False): the float path trains them without one, their weights only (the
    int8 path adds a zero bias: quant.zero_bias).  One line for all of them (an unrolled
    recurrent layer has one such op per step)."""
    from ..graph.optable import SPECS
    ops = []
    for i in sorted(p.trainable_ops):
        op = g.ops[i]
        for pos, role in SPECS[op.name].roles(op, g).items():
            if role == 'bias' and (pos >= len(op.inputs) or op.inputs[pos] < 0):
                ops.append(op)
    if not ops:
        return []
    nums = sorted({op.number for op in ops})     # (a WHILE's unrolled steps: its number)
    if len(ops) == 1:
        return [f'{model_path}: op {ops[0].number} {ops[0].name} has no bias tensor: it trains '
                'without one (its weights only; the exported model has none either)']
    names = ', '.join(sorted({op.name for op in ops}))
    if len(nums) == 1:
        return [f'{model_path}: op {nums[0]} has {len(ops)} {names} without a bias tensor '
                '(a loop\'s steps): they train without one (their weights only; the exported '
                'model has none either)']
    return [f'{model_path}: ops {", ".join(map(str, nums))} ({names}) have no '
            'bias tensor: they train without one (their weights only; the exported model '
            'has none either)']


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


def _outputs(g) -> int:
    return int(np.prod(g.tensors[g.outputs[0]].shape)) if g.outputs else 0


def default_metric(g, loss: str) -> str:
    """accuracy for a classifier's loss, mae otherwise: bce on several outputs is
    multi-label, where the board's accuracy (the largest output's class against the
    target's) means nothing."""
    return 'accuracy' if loss in ('cce', 'scce') or loss == 'bce' and _outputs(g) < 2 else 'mae'


def resolve_settings(g, overrides: dict) -> dict:
    """Defaults <- CIRCLE_TRAINING metadata <- command line (overrides, None = not given).
    A name that is none of the settings is refused (prepare(..., float32=True) from
    Python had it written into train.json, which the board refused when the run began)."""
    unknown = sorted(k for k in overrides if k not in DEFAULTS and k not in ('train', 'select'))
    if unknown:
        raise PrepareError(f'prepare: {unknown[0]!r} is none of its settings or arguments '
                           f'(settings: {", ".join(sorted(DEFAULTS))}, train)')
    s = dict(DEFAULTS, train='all')
    s.update(metadata_settings(g))
    s.update({k: v for k, v in overrides.items() if v is not None})
    if 'metric' not in overrides or overrides['metric'] is None:
        s['metric'] = default_metric(g, s['loss'])
    for key, allowed in (('loss', LOSSES), ('optimizer', OPTIMIZERS), ('reduction', REDUCTIONS),
                         ('schedule', SCHEDULES)):
        if s[key] not in allowed:
            raise PrepareError(f'{key} {s[key]!r}: expected one of {", ".join(allowed)}')
    if s['batch'] < 1 or s['epochs'] < 0:
        raise PrepareError('batch must be >= 1 and epochs >= 0')
    if s['lr'] <= 0:
        raise PrepareError(f'learning rate {s["lr"]} must be positive')
    return s


def loss_from_data(g, s, data, overrides, log=print) -> dict:
    """s with the loss the data asks for when neither the command line nor the model's
    CIRCLE_TRAINING metadata names one, for a model with several outputs: scce where the
    data's targets are class numbers (one integer per sample, 0 .. outputs - 1), cce
    where they are one-hot rows (one value per output, 0s and a single 1), bce where the
    model ends in a sigmoid (LOGISTIC) and every target is 0 or 1, as a user with
    labelled samples expects (the default mse refuses labels: "y has 1 values per
    sample, the model outputs 10", trains one-hot classes as a regression, and int8
    training takes scce or cce only); else s as it is.  Says which it chose."""
    from ..files import dataset as ds
    from ..files.validate import PROBABILITIES
    from ..formats.ir import final_op
    if not data or overrides.get('loss') is not None or 'loss' in metadata_settings(g):
        return s
    n_out = int(np.prod(g.tensors[g.outputs[0]].shape)) if g.outputs else 0
    try:
        y = np.asarray(ds.labels(data, shape=g.tensors[g.inputs[0]].shape if len(g.inputs) == 1
                                 else None))
    except (ValueError, OSError):
        return s                        # (read again by the samples pass, which says what is wrong)
    if not y.ndim or not len(y) or not np.issubdtype(y.dtype, np.number):
        return s                        # (0-d: the samples pass refuses it, naming the file)
    last = final_op(g) if g.outputs else None
    # (a sigmoid's outputs in rows, [18, 12] a sample, take 0/1 targets of that shape)
    if last is not None and last.name == PROBABILITIES['bce'] and y.size == len(y) * n_out and \
            np.all((y == 0) | (y == 1)):
        loss, what = 'bce', f'targets of 0 and 1 for {n_out} sigmoid output{"s" * (n_out > 1)}'
    elif n_out < 2 or y.ndim > 2:
        return s
    elif y.ndim == 2 and y.shape[1] == n_out > 1:
        if not (np.all((y == 0) | (y == 1)) and np.all(y.sum(1) == 1)):
            return s
        loss, what = 'cce', 'one-hot rows of class targets'
    elif y.ndim == 1 or y.shape[1] == 1:
        y = y.reshape(-1)
        if np.any(y != np.round(y)) or y.min() < 0 or y.max() >= n_out:
            return s
        loss, what = 'scce', 'one class number per sample'
    else:
        return s
    s = dict(s, loss=loss)
    if overrides.get('metric') is None:
        s['metric'] = default_metric(g, loss)
    log(f'loss: {loss} ({data}: {what}, the model has {n_out} output{"s" * (n_out != 1)}; '
        '--loss sets another)')
    return s


def _rows_softmaxed(g, k, C, depth=0) -> bool:
    """Is tensor k made of SOFTMAX outputs over rows of C, through RESHAPE / SQUEEZE /
    EXPAND_DIMS and PACK / CONCATENATION of such rows only?"""
    op = next((o for o in g.ops if k in o.outputs), None)
    if op is None or depth > 8:
        return False
    if op.name == 'SOFTMAX':
        return int(g.tensors[k].shape[-1]) == C
    if op.name in ('RESHAPE', 'SQUEEZE', 'EXPAND_DIMS'):
        return _rows_softmaxed(g, op.inputs[0], C, depth + 1)
    if op.name in ('PACK', 'CONCATENATION') and op.inputs:
        if op.name == 'CONCATENATION' and int(op.options.get('axis', 0)) % max(
                len(g.tensors[k].shape), 1) == len(g.tensors[k].shape) - 1:
            return False        # (joined along the rows: not rows of C)
        return all(_rows_softmaxed(g, i, C, depth + 1) for i in op.inputs)
    return False


def step_classes(g, s, data, overrides, log=print) -> dict:
    """s for a class number a step (y (N, T), or one-hot a step, (N, T, C)) given a model
    whose output is a row of C values a step (T x C, dataset.per_step): cce on them
    one-hot a step where no loss is named, the model ending in a softmax over each row
    (the sum of the steps' cross-entropies), and metric mae (the board's accuracy takes
    one class a sample: the largest of all T x C outputs); refused, saying what to do, where the output's rows are
    not probabilities (logits: cce from logits normalises all T x C values as one row)."""
    from ..files import dataset as ds
    from ..formats.ir import final_op
    shape = g.tensors[g.outputs[0]].shape if g.outputs else None
    ps = ds.per_step(shape)
    if not data or not ps:
        return s
    try:
        y = np.asarray(ds.labels(data, shape=g.tensors[g.inputs[0]].shape if len(g.inputs) == 1
                                 else None))
    except (ValueError, OSError):
        return s                        # (read again by the samples pass)
    onehot = y.ndim == 3 and y.shape[1:] == ps and bool(np.all((y == 0) | (y == 1))) and \
        bool(np.all(y.sum(-1) == 1))           # (N, T, C): one-hot a step
    if not (onehot or ds.step_labels(y, shape)):
        return s
    named = overrides.get('loss') is not None or 'loss' in metadata_settings(g)
    if named and s['loss'] not in ('cce', 'scce'):
        return s
    last = final_op(g)
    if _rows_softmaxed(g, g.outputs[0], ps[1]):
        # each row a SOFTMAX's, PACKed / joined and reshaped after (Keras's
        # TimeDistributed(Dense(C, activation='softmax')) unrolled): probabilities already;
        # a softmax over each row again had trained the softmax of probabilities
        last = next(o for o in g.ops if o.name == 'SOFTMAX')
        g.step_probs = True         # (validate.loss_on_logits: probabilities, as they are)
        s = dict(s, from_logits=False)
    elif (last is None or last.name != 'SOFTMAX') and g.tensors[g.outputs[0]].dtype == 'float32' \
            and len(g.outputs) == 1:
        # rows of logits (a Conv1d / Dense head without its softmax): a softmax over each
        # row for the run (the board's loss from logits would normalise all rows as one),
        # which export takes out again
        g.step_rows = True          # (runplan.rewrite_for_training: inout.step_softmax)
        log(f'{data}: a class a step for {ps[0]} rows of {ps[1]} logits: trains with a softmax '
            f'over each row after op {last.number if last else "?"} (cce on its probabilities, '
            'summed over the steps); export writes the model as it was, giving logits')
        s = dict(s, from_logits=False)
    elif last is None or last.name != 'SOFTMAX' or s.get('from_logits') or \
            int(g.tensors[last.inputs[0]].shape[-1]) != ps[1]:
        made = 'logits' if last is None or last.name != 'SOFTMAX' else \
            'probabilities over more than a row'
        raise PrepareError(f'{data}: a class a step ({ps[0]} a sample) for a model whose '
                           f'{ps[0]} rows of {ps[1]} are {made}: a class a step trains '
                           f'with cce on a softmax over each row; end the model in one (Keras '
                           f'Dense({ps[1]}, activation="softmax") on the steps; PyTorch '
                           f'torch.softmax(y, -1) on (N, T, {ps[1]}))')
    if overrides.get('metric') == 'accuracy':
        raise PrepareError(f'{data}: --metric accuracy counts one class a sample (the largest '
                           f'of its {ps[0] * ps[1]} outputs); leave it out for a class a step (mae: '
                           f'the mean distance of each probability from its one-hot target; '
                           f'evaluate counts the steps right)')
    if not named:
        log(f'loss: cce ({data}: {"one-hot rows" if onehot else "a class number"} a step, over '
            f'the model\'s {ps[0]} rows of {ps[1]} probabilities; --loss sets another)')
    return dict(s, loss=s['loss'] if named else 'cce',
                metric='mae' if overrides.get('metric') is None else s['metric'])


def step_schedule_warning(s, train_samples) -> str | None:
    """The warning for a `step` schedule whose learning rate has fallen below a thousandth
    of --lr by the end of the first epoch (step_size counts updates, and a user of
    PyTorch's StepLR, stepped once an epoch, gives it in epochs: step_size=2 at 28
    updates an epoch left lr x 0.5^14 after one epoch and the run stood still), or None."""
    if s.get('schedule') != 'step' or not train_samples:
        return None
    per = -(-train_samples // s['batch'])
    size, gamma = int(s.get('step_size') or 1), float(s.get('gamma', 0.1))
    fell = gamma ** (max(per - int(s.get('warmup') or 0), 0) // size)
    if not 0 <= gamma < 1 or fell >= 1e-3:
        return None
    return (f'warning: --schedule step: lr x {gamma:g} every {size} update{"s" * (size > 1)} is '
            f'lr x {fell:.2g} after the first epoch ({per} updates of {s["batch"]} of the '
            f'{train_samples} training samples), and the run stands still from there: '
            f'step_size counts updates, not epochs (every 2 epochs: step_size={2 * per})')


def parse_budget(text) -> int:
    """'96K', '1M', '98304' -> bytes (runner.size_bytes); PrepareError naming --budget."""
    from ..target.runner import size_bytes
    try:
        return size_bytes(text)
    except ValueError:
        raise PrepareError(f'--budget {text}: not a heap size. --budget is the heap the run may '
                           'take on the board, in bytes or with K or M (98304, 96K, 1M): '
                           + BUDGET_HOW) from None


# what a --budget refusal says to do (one paragraph: check_budget_given)
BUDGET_HOW = ('give --budget the heap your board has free for training, or --board NAME to '
              "plan for a known board's heap (unix, rp2040, rp2350, esp32, esp32s3, "
              'esp32-psram); without either the plan has no bound')


def check_select_options(select, layers, ranks, train_config, train):
    """--select chooses what trains: PrepareError for --ranks, --train-config or --train
    given with it (the selection had replaced them, saying nothing), and for
    --select-layers without --select board or below 0 (-1 went into train.json)."""
    given = [f for f, v in (('--ranks', ranks), ('--train-config', train_config),
                            ('--train', train)) if v is not None]
    if select and given:
        raise PrepareError(f'--select {select} chooses what trains, and {" and ".join(given)} '
                           f'say{"s" * (len(given) == 1)} it too: leave out '
                           f'{" and ".join(given)}, or --select to train what '
                           f'{"they say" if len(given) > 1 else "it says"}')
    if layers is not None and select != 'board':
        raise PrepareError(f'--select-layers {layers}: the layers the board trains besides the '
                           'classifier when it chooses (--select board); give --select board, '
                           'or leave --select-layers out')
    if layers is not None and layers < 0:
        raise PrepareError(f'--select-layers {layers}: 0 or more layers besides the classifier '
                           '(0: the classifier alone; leave it out: as many as fit)')


def check_budget_given(budget, log=print):
    """--budget before anything is planned: PrepareError (one paragraph) for a budget
    under 1 KB (0, 1, 512: no run can fit; runfolder.budget_short refuses a larger one
    below the run's code and interpreter, naming the boards that hold it); a note for one
    larger than any board profile's heap (checked as given)."""
    if budget is None:
        return
    from ..plan.memory import WORD_FIGURES
    from ..target.runner import boards, size_bytes
    b = parse_budget(budget)
    least = min(f['base_frozen'] for f in WORD_FIGURES.values())
    if b < 1024:        # (bytes where K was meant, 0: the planner's paragraph names boards)
        raise PrepareError(f'--budget {budget}: {b} byte{"s" * (b != 1)} is less than '
                           'MicroPython\'s '
                           f'interpreter takes alone (about {least // 1024} KB at the least), '
                           'before utrain\'s code (30 KB or more) and the model: no run fits '
                           'it (most runs need 64K or more): ' + BUDGET_HOW)
    most = max(boards().items(), key=lambda kv: size_bytes(kv[1]['heap']))
    if b > size_bytes(most[1]['heap']):
        log(f'--budget {budget}: more heap than any board profile has (the most: {most[0]}, '
            f'{most[1]["heap"]}); the plan is checked against it as given: --board NAME '
            'checks it against a known board\'s heap')


def _board_name(board, known=None) -> str:
    """The boards.json profile board names (runner.board_name: any case, pico = rp2040)."""
    from ..target.runner import board_name
    try:
        return board_name(board, known)
    except ValueError as e:
        raise PrepareError(str(e)) from None


def joined_samples(data, g):
    """(x, y) of data for graph g of several inputs, each sample's inputs joined in one
    row (dataset.load_inputs, as train.ds stores them): what --select's flash check
    prices."""
    from ..files.dataset import load_inputs
    from ..plan.runplan import data_inputs
    x, y = load_inputs(data, data_inputs(g))
    x, y = np.asarray(x), np.asarray(y)
    return x.reshape(len(x), -1), y


def _flash_fits(model_path, x, y, dtype, board, model_bytes, s, writes, also=None):
    """--select's flash check: a priced candidate's 'writes' (the trained shapes, or an
    int8 run's (layer table, prefix-cache table)) -> None, or why the board's flash cannot
    hold the samples x, y stored as dtype, the model and what its run writes: the flash
    pass prepare (check_flash) runs after the choice, for that candidate.  also: the
    dtype prepare stores them as where dtype overflows (uint8 where --dtype was not
    given, bytes_fit: IMU windows on a Pico's flash had every candidate refused, the
    classifier too, and --select auto trained the classifier alone where last:9 gained
    13 points)."""
    xy = (x.reshape(len(x), -1), y.reshape(len(y), -1))
    opt = dict(optimizer=s['optimizer'], momentum=s.get('momentum', 0.0))

    def refusal(w, dt=dtype):
        try:
            check_flash(model_path, xy, dt, board, model_bytes, dict(writes(w), **opt))
        except PrepareError as e:
            return str(e) if dt == also or also is None or refusal(w, also) else None
        return None
    return refusal


def board_profile(board, overrides: dict) -> dict:
    """boards/boards.json's profile for `board`; fills the settings it defaults (batch,
    stream = its stream_frozen) into overrides where the caller gave none."""
    from ..target.runner import boards
    profiles = boards()
    prof = profiles[_board_name(board, profiles)]
    if overrides.get('batch') is None:
        overrides['batch'] = prof['batch']
    if overrides.get('stream') is None:
        overrides['stream'] = bool(prof.get('stream_frozen'))
    return prof


def heap_limit(prof, budget, heap):
    """The heap a plan must fit (bytes) or None: the board profile's heap_budget is what
    model and training state may take once the code is loaded (the planner's data parts),
    its heap bounds the whole plan; budget bounds the whole plan too."""
    limit = board_limit(prof, heap) if prof else None
    if budget:
        limit = parse_budget(budget) if limit is None else min(limit, parse_budget(budget))
    return limit


def limit_source(board, prof) -> str:
    """' (board: heap ..., ... KB for model and training state)' for a refusal's message
    when a board profile bounds the plan, else ''."""
    return (f' ({board}: heap {prof["heap"]}, {int(prof["heap_budget"]) // 1024} KB for model '
            'and training state)') if prof else ''


def over_boards_note(model_path, summary, board, log):
    """--select without --board: the board profiles whose heap the chosen configuration's
    plan exceeds (heap.over_boards, plans_by_target), named in the log and in the
    summary's select block (select.over_boards), with --board's advice (its choice is
    made within that board's heap)."""
    over = summary['heap'].get('over_boards')
    if board or not over or 'select' not in summary:
        return
    summary['select']['over_boards'] = sorted(over)
    log(f'{model_path}: --select chose without --board: its plan exceeds the heap of '
        + ', '.join(f'{b} ({p // 1024} KB against {lim // 1024} KB)' for b, (p, lim) in sorted(over.items()))
        + '; --select with --board NAME chooses within that board\'s heap')


def run_planned(heap, limit) -> dict:
    """train.json's run.planned: the plan's total (bytes) when prepare checked it against
    a budget or board, so that a run out of memory does not advise what was done."""
    return {'planned': heap['total']} if limit(heap) is not None else {}


def settle(model_path, board, overrides: dict, progress=None, split_seed=0, output=None,
           log=print, data=None):
    """The settings pass: the board profile's defaults, the command line checked, the
    model read and checked in the file's op numbering, the output the loss reads first in
    its outputs (output: --output, inout.choose_output, else the first whose size
    data's targets fit; said where the model has several), its CIRCLE_TRAINING metadata
    under the command line.  Returns (graph as read, board profile or None, settings,
    train)."""
    from ..files.validate import check_settings, check_graph
    prof = board_profile(board, overrides) if board else None
    if overrides.get('schedule') is not None:      # 'cosine,warmup=100' -> its settings
        from ..files.validate import parse_schedule
        overrides.update(parse_schedule(overrides['schedule']))
    check_settings(dict(overrides, progress=progress, split_seed=split_seed))
    g = read_model(model_path)
    check_graph(g)             # the file's op numbering, before any rewrite
    for line in dropped_outputs(model_path, g):
        log(line)
    from ..files.dataset import targets_of
    y = targets_of(data) if data and output is None and len(g.outputs) > 1 else None
    try:
        note = choose_output(g, output, y)
    except ValueError as e:
        raise PrepareError(str(e)) from None
    if note:
        log(note)
    s = resolve_settings(g, overrides)
    check_settings(s)          # with the model's CIRCLE_TRAINING metadata too
    for line in unread_settings(model_path, overrides, s):
        log(line)
    return g, prof, s, s.pop('train')


# the optimizers that read each of these settings
READ_BY = {'momentum': ('sgd',), 'beta1': ('adam', 'adamw'), 'beta2': ('adam', 'adamw'),
           'eps': ('adam', 'adamw', 'rmsprop'), 'rho': ('rmsprop',)}


def unread_settings(model_path, given: dict, s: dict) -> list:
    """Lines saying which settings given on the command line the run does not read
    (--momentum to adam, --rho to sgd, --seed without --shuffle had been taken without a
    word, the run as if they had not been given)."""
    def listed(names):      # ('sgd'; 'adam and adamw'; 'adam, adamw and rmsprop')
        return ' and '.join([', '.join(names[:-1])] * (len(names) > 1) + [names[-1]])
    out = [f'{model_path}: --{k}: {s["optimizer"]} does not read it ({listed(by)} '
           f'do{"es" * (len(by) == 1)}): leave it out, or give --optimizer {by[0]}'
           for k, by in READ_BY.items()
           if given.get(k) is not None and s.get('optimizer') not in by]
    if given.get('seed') is not None and not s.get('shuffle'):
        out.append(f'{model_path}: --seed: the seed of --shuffle, which is not given (the '
                   'samples go in file order); add --shuffle for a seeded order')
    return out


def dropped_outputs(model_path, g) -> list:
    """Lines saying which outputs of an .onnx model the reader left out, each needing a
    node utrain cannot read (onnx_io: a stochastic policy's sampled action beside its
    value head), and that export keeps them."""
    return [f'{model_path}: output {name!r} is left out (utrain trains the others; export '
            f'writes the file with it, the trained weights in): {why}'
            for name, why in getattr(g, 'onnx_dropped', ())] + [
        f'{model_path}: input {name!r} is read only by outputs left out: the run takes no '
        'samples of it (evaluate gives ONNX Runtime zeros for it)'
        for name in getattr(g, 'onnx_unread', ())] + [
        f'{model_path}: weight {name!r} is computed in the graph from the initializer'
        f'{"s" * (len(inits) > 1)} {", ".join(repr(i) for i in inits)} by {", ".join(ops)} '
        '(e.g. F.normalize of a cosine classifier\'s weight): utrain computes it once and '
        'keeps it frozen, as export cannot write a trained value back through those ops; '
        'the other layers train (to train it, export the layer with its weight an '
        'initializer read directly)'
        for name, inits, ops in getattr(g, 'onnx_computed_frozen', ())] + [
        f'{model_path}: op {n} (CONCATENATION) ends the model in the two probabilities '
        f'(1 - p, p) of the sigmoid before it: utrain trains p, the probability of class 1 '
        f'(bce on class numbers 0 and 1); the exported model keeps both'
        for n in [getattr(g, 'two_class', None)] if n is not None] + [
        f'{model_path}: ' + (
            f'a QOperator model (onnxruntime quantize_static(quant_format=QOperator): its '
            f'{qop} integer ops, QLinearConv, QGemm, QLinearAdd..., read as the float op '
            'between its operands\' DequantizeLinear and its output\'s QuantizeLinear, as '
            'the QDQ format writes them)' if qop else
            'a QDQ model (onnxruntime quantize_static\'s default format)') +
        f': it trains dequantized, in float32: its {w} integer weights as their float '
        f'values, its {q} QuantizeLinear / DequantizeLinear pairs of activations left out (a '
        'pair clamping at 0 read as the ReLU the quantizer fused; the forward differs from '
        'ONNX Runtime\'s by their rounding); export writes the weights back at the file\'s '
        'scales, rounded' + (' (the int8 weights and int32 biases of the QOperator ops)'
                             if qop else '') + ' (a change under half a step is lost: '
        'export the float model instead where you have it, and quantize it again)'
        for q, w in [getattr(g, 'onnx_qdq', None) or (0, 0)] if (q or w)
        and not getattr(g, 'onnx_dynamic', 0)
        for qop in [getattr(g, 'onnx_qop', 0)]] + [
        f'{model_path}: a model of onnxruntime\'s quantize_dynamic: its {dyn} ConvInteger / '
        'MatMulInteger ops (their activations quantized at run time by '
        'DynamicQuantizeLinear) and quantized tables (a Gather of int8 / uint8 rows) read '
        'as the float Conv / MatMul of the activation and the weight\'s DequantizeLinear, '
        f'the Gather of the table\'s: it trains dequantized, in float32, its {w} integer '
        'weights as their float values (the forward differs from ONNX Runtime\'s by the '
        'activations\' rounding); export writes a moved weight back as the file\'s int8 / '
        'uint8 at a scale (and zero point) recomputed from it as quantize_dynamic computes '
        'them (per channel where the file\'s are), into the same integer ops; a weight that '
        'did not move keeps the file\'s bytes'
        for dyn in [getattr(g, 'onnx_dynamic', 0)] if dyn
        for _, w in [getattr(g, 'onnx_qdq', None) or (0, 0)]]


def check_budget(model_path, heap, prof, budget, board, source, s, train, ranks,
                 backend='fallback', rewrite=True, plan_opts=None):
    """The budget pass: PrepareError when the heap plan exceeds the budget or the board
    profile's heap, with the planner's advice (memory.fit_advice) on what would fit, in
    the numbering of source (the graph as read) as train and ranks are; each suggestion
    planned as plan_memory plans the run (plan_opts: its cache, fisher, bands and limit
    arguments: row bands where a plan exceeds the limit)."""
    from ..plan.memory import fit_advice
    limit = heap_limit(prof, budget, heap)
    if limit is None or heap['total'] <= limit:
        return

    def planned(tr, r, settings, cache=None, back=None):
        # (total, the limit it must fit: a frozen backend's code is off the heap); cache,
        # back: another --cache / --backend than the run's
        rg, _, _, _, _, p = select_rewrite_plan(source, tr, r, rewrite)
        if not p.params:
            return None
        opts = dict(plan_opts or {})
        if cache is not None:
            opts['cache'] = cache
        h = plan_memory(rg, p, settings, back or backend, board, **opts)
        return h['total'], heap_limit(prof, budget, h), (
            'the frozen early layers computed in row bands' if p.bands else '')
    advice = fit_advice(source, s, train, ranks, backend, limit, heap, planned)
    if budget is not None and limit == parse_budget(budget):
        short = budget_short(model_path, budget, heap, limit, advice)
        if short:
            raise PrepareError(short)
    flash, frozen = flash_alone(model_path, board, source)
    if flash:           # (no setting the advice names fits the board's flash; with utrain
        #                  frozen into the firmware its code is off the file system)
        advice = '\n'.join(a for a in advice.split('\n') if not a.strip().startswith(
            'would fit:') or frozen and 'utrain frozen in' in a) + '\n' + flash
    raise PrepareError(f'{model_path}: training needs about {heap["total"] // 1024} KB of heap '
                       f'({backend}), the budget is {limit // 1024} KB'
                       + limit_source(board, prof) + '.\n' + advice)


def flash_alone(model_path, board, g=None):
    """'  ...' saying that the model file and utrain's code alone overflow board's flash
    file system (boards.json flash_fs, littlefs blocks as runfolder.check_flash reckons
    them), so that no heap setting trains it there, '' where they fit; and whether the
    model alone fits (a firmware with utrain frozen in).  A heap refusal
    had advised Keras's 1.2 MB hard-disk MLP (ONNX) on --board pico '--batch 1 --train
    last:2 (about 117 KB)', and prepare given those flags refused: 'the model and code
    alone take about 1582 KB, more than the 1408K file system of rp2040'."""
    from ..target.runner import boards, on_flash, size_bytes
    from ..plan.memory import mpy_sizes
    fs = boards().get(board, {}).get('flash_fs') if board else None
    if not fs:
        return '', False
    size = float_bytes(g, model_path) if g is not None else os.path.getsize(model_path)
    need = on_flash([size] + list(mpy_sizes().values()) + [4096], board)
    if need <= size_bytes(fs):
        return '', False
    frozen = on_flash([size, 4096], board) <= size_bytes(fs)
    more = [f'{b} ({p["flash_fs"]})' for b, p in boards().items()
            if p.get('flash_fs') and size_bytes(p['flash_fs']) >= need]
    return (f'  no setting fits {board}'
            + ' with utrain\'s code on its file system' * frozen
            + f': the model and code alone take about {need // 1024} KB '
            f'of flash, more than its {fs} file system' + (
                f'; a board with more flash: {", ".join(more)}' if more else '')), frozen


def write_folder(out_dir, model_path, g, p, s, changed, sel=None, train_config=None,
                 trial=False):
    """The folder pass: the rewritten graph (when the rewrites changed it; not for a
    --select trial, which nothing exports), model.flat, weights.wof and train.tcfg (a
    selection, ranks or a training config given) in out_dir.
    Returns (files {role: name, None when not written}, {'flat_bytes': n[,
    'train_config': name or None]})."""
    from ..files.trainconfig import write_train_config
    os.makedirs(out_dir, exist_ok=True)
    files = dict(FILES)
    if changed and not trial:
        # the .wof indexes the rewritten graph: keep it beside, for export
        dst = os.path.join(out_dir, files['rewritten'])
        if os.path.exists(dst) and os.path.samefile(dst, model_path):
            raise PrepareError(f'{model_path}: prepare would overwrite it with the rewritten '
                               'graph; prepare into another folder')
        save_graph(file_graph(g), dst)     # (its inputs apart, every output)
    else:
        files['rewritten'] = None
    wrote = {'flat_bytes': write_flat(g, p, s, os.path.join(out_dir, files['model']))['bytes']}
    weights = {k: g.tensors[k].data for k in p.params}
    write_wof(os.path.join(out_dir, files['weights']), len(g.tensors), weights)
    tcfg = os.path.join(out_dir, 'train.tcfg')
    if sel:
        # the choice as onert-micro's training-config file, ops of the graph as given
        # (prepare --train-config reads it back); 1/4 and 1/8 are utrain's own codes
        write_train_config(tcfg, sel['ranks'], onert_only=False)
        wrote['train_config'] = 'train.tcfg'
    elif any(r for r in p.op_ranks.values()) or train_config:
        try:
            # (ops numbered as in the file, as --train-config reads them: the ops a
            # rewrite made of one, a grouped convolution's, have its number and rank)
            write_train_config(tcfg, {g.ops[i].number: r for i, r in p.op_ranks.items()})
            wrote['train_config'] = 'train.tcfg'
        except PrepareError:
            wrote['train_config'] = None    # a rank onert-micro has no code for
    return files, wrote


def describe(model_path, g, p, heap, info, perm, files, wrote, sel=None) -> dict:
    """prepare.json's summary of what the folder pass wrote for the rewritten graph g and
    its plan p (export reads 'rewritten' and 'quant' back)."""
    summary = {'model': os.path.abspath(model_path), 'flat_bytes': wrote['flat_bytes'],
               'trainable': {g.tensors[k].name: list(g.tensors[k].shape) for k in sorted(p.params)},
               'trainable_params': int(sum(g.tensors[k].data.size for k in p.params)),
               # constants that are no parameter (Tensor.frozen, which rewritten.circle does
               # not carry: fromfloat's int8 graph is read from it)
               'frozen_constants': sorted(t.name for t in g.tensors
                                          if t.frozen and t.data is not None),
               'frozen_params': int(sum(t.data.size for t in g.tensors
                                        if t.data is not None and t.index not in p.params
                                        and t.dtype == 'float32' and t.index in p.last_use)),
               'backward_ops': len(p.backward), 'saved_activations': len(p.saved),
               'heap': heap, 'ranks': {g.tensors[k].name: list(v) for k, v in p.ranks.items()},
               'rewritten': files['rewritten'], 'input_perm': perm,
               # band groups as [first op, last op, rows], ops numbered as in the file
               'bands': [[g.ops[lo].number, g.ops[hi - 1].number, r] for lo, hi, r in p.bands],
               'rewrites': {k: info[k] for k in ('dequantized', 'transposes', 'batchnorm')},
               'input_scale': info.get('input_scale', 0), 'quant': info['quant']}
    if files['rewritten']:      # each op of the rewritten file: its number in the user's
        summary['op_numbers'] = [op.number for op in file_graph(g).ops]
    # where each trained tensor is in the file (an unrolled WHILE's weights are in its body
    # subgraph): export writes them back into the model as the file has it
    if any(g.tensors[k].origin for k in p.params):
        summary['file_tensors'] = {str(k): list(g.tensors[k].origin) for k in sorted(p.params)
                                   if g.tensors[k].origin}
    if getattr(g, 'as_file', None):     # several inputs or outputs (runplan.one_input_output)
        summary.update(io_summary(g))
        # the .wof and model.flat number the joined input's tensors after the file's
        summary['device_tensors'] = len(g.tensors)
    if 'train_config' in wrote:
        summary['train_config'] = wrote['train_config']
    if sel:
        summary['select'] = {k: v for k, v in sel.items() if k in (
            'select', 'fallback', 'score', 'classifier_only', 'runners_up', 'bias_gain',
            'weight_gain', 'trials', 'short_list', 'failed', 'uncertain')}
        summary['select']['ranks'] = {str(i): RANK_NAMES[r] for i, r in sel['ranks'].items()}
        if 'select' in sel:     # the board's log names ops by their place in model.flat
            summary['select']['graph_ops'] = [op.number for op in g.ops]
    return summary


BATCH1 = 'batch1'       # the batch-1 copy of a model whose file fixes a batch (formats.batch)


FIXED_DIMS = 'fixed_dims.onnx'     # an .onnx model's copy with its open dimensions set


def _dims_of(x, dims):
    """dims (an input's shape, None where open) filled from x, its samples (one a row, or
    shaped): x of that rank, else one open dimension from the values a sample holds; None
    where they do not tell: x of that rank whose fixed dimensions are others (its values
    laid out again at that count had trained another sample: (3, 10) as (2, 15)), or an
    open one of 0."""
    want = list(dims[1:])
    if x.ndim - 1 == len(want):
        if all((w is None and n > 0) or w == n for w, n in zip(want, x.shape[1:])):
            return [1] + [int(n) for n in x.shape[1:]]
        return None
    known = int(np.prod([w for w in want if w is not None]))
    per = int(np.prod(x.shape[1:]))
    if want.count(None) == 1 and per % known == 0 and per // known > 0:
        return [1] + [per // known if w is None else w for w in want]
    return None


def _untold(data, what, name, dims):
    """The refusal of data whose samples do not set input name's open dimensions (dims,
    None where open): what they hold, what the input takes (the reader's own had said only
    that the dimension is open, and to give data)."""
    from ..files.dataset import DataError
    shape = '[' + ', '.join('?' if d is None else str(d) for d in dims[1:]) + ']'
    # (what to do: it had said what the input takes and stopped there)
    last = len(dims) in (3, 4) and dims[1] is not None and ' ' + str(dims[1]) + ']' in what
    return DataError(f'{data}: {what}; the model\'s input {name!r} takes samples of {shape} '
                     '(? known only at run time, set from the samples: at least 1; the others '
                     'as given): give samples of that shape' + (
                         f' (these hold the {dims[1]} channels last; the model takes them first: '
                         'x = numpy.moveaxis(x, -1, 1) before saving the .npz)' if last else '')
                     + ', or fix the input\'s dimensions in the file (onnx.tools.update_model_dims.'
                     'update_inputs_outputs_dims, or export it with them fixed)')


def _sample_dims(data, inputs, opens):
    """{input name: its dims filled from data's samples} for the open inputs opens
    ({name: dims, None where open}) among a model's inputs ([(name, dims)] in the file's
    order): one input, from x; several, from an .npz's array per input (named as the
    input or x0, x1, .. by its place, as load_inputs reads them), or from x joined where
    one open dimension is all it leaves unknown; None where the data cannot be read (its
    reader says why).  DataError where they are read and do not tell: an array of the
    input's rank whose fixed dimensions are others, no array for an open input."""
    from ..files import dataset as ds
    try:
        if len(inputs) == 1:
            x, _ = ds.load(data)
            x = np.asarray(x)
        else:
            with np.load(data, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
    except Exception:   # noqa: B902 - (prepare's own read says what is wrong with it)
        return None
    if len(inputs) == 1:
        got = _dims_of(x, inputs[0][1])
        if got is None and x.ndim - 1 == len(inputs[0][1]) - 1:
            raise _untold(data, f'its samples are {list(x.shape[1:])}', *inputs[0])
        return None if got is None else {inputs[0][0]: got}
    out = {}
    for j, (name, dims) in enumerate(inputs):
        k = next((k for k in (name, f'x{j}') if k in arrays), None)
        if name in opens and k is not None:
            a = np.asarray(arrays[k])
            out[name] = _dims_of(a, dims)
            if out[name] is None:
                raise _untold(data, f'array {k} holds samples of {list(a.shape[1:])}', name, dims)
    left = [n for n in opens if n not in out]
    if len(left) == 1 and 'x' in arrays and all(
            d is not None for n, dims in inputs if n != left[0] for d in dims[1:]):
        x = np.asarray(arrays['x'])
        rest = sum(int(np.prod(dims[1:])) for n, dims in inputs if n != left[0])
        per = int(np.prod(x.shape[1:])) - rest
        out[left[0]] = _dims_of(np.zeros((1, max(per, 0)), np.float32), opens[left[0]])
        if out[left[0]] is None:
            raise _untold(data, f'x holds {per + rest} values a sample, {rest} of them the '
                          'other inputs\'', left[0], opens[left[0]])
    if left and 'x' not in arrays:
        j = next(j for j, (n, _) in enumerate(inputs) if n == left[0])
        raise _untold(data, f'it has no array for the model\'s input {j} {left[0]!r}: name it '
                      f'{left[0]} or x{j} (the file has {", ".join(arrays)})', left[0], opens[left[0]])
    return out if len(out) == len(opens) and all(out.values()) else None


def dims_from_samples(model_path, data):
    """(the .onnx ModelProto of model_path with its inputs' dimensions known only at run
    time set as data's samples have them, {input name: (its dimensions as the file gives
    them, None where open; as set)}), or None: no data, not an .onnx file, no such input,
    or the samples do not tell (the reader's refusal then says how to fix the shape).
    prepare's copy (fixed_dims_copy) and evaluate's (infer)."""
    from ..formats.onnx_io import is_onnx, input_dims, with_dims, _onnx
    if not data or not is_onnx(model_path) or not os.path.isfile(os.fspath(model_path)):
        return None
    try:
        m = _onnx().load(os.fspath(model_path))
        inputs = input_dims(m)
        opens = {name: dims for name, dims in inputs if None in dims[1:]}     # (dynamic_axes)
    except Exception:   # noqa: B902 - (the reader says what is wrong with the file)
        return None
    if not opens:
        return None
    got = _sample_dims(data, inputs, opens)
    if got is None:
        return None
    return with_dims(m, got), {n: (opens[n], got[n]) for n in opens}


def fixed_dims_copy(model_path, out_dir, data, log=print):
    """(the model to prepare, {input: dims} or None): an .onnx model whose input has a
    dimension known only at run time (a PyTorch sequence model exported with
    dynamic_axes on its length) is copied into out_dir with the dimension the samples of
    data have (utrain trains a fixed shape), and prepare says so; export writes the
    trained weights into the file as it was, the dimension open."""
    fixed = dims_from_samples(model_path, data)
    if fixed is None:
        return model_path, None
    m, each = fixed
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, FIXED_DIMS)
    if os.path.exists(dst) and os.path.samefile(dst, model_path):
        raise PrepareError(f'{model_path}: prepare would overwrite it with its copy of fixed '
                           'dimensions; prepare into another folder')
    from ..formats.ir import atomic_write
    atomic_write(dst, m.SerializeToString())
    for name, (dims, got) in each.items():
        open_ = [j for j, d in enumerate(dims) if j and d is None]
        log(f'{model_path}: input {name!r} has dimension{"s" * (len(open_) > 1)} '
            f'{", ".join(map(str, open_))} known only at run time; it trains at '
            f'{", ".join(str(got[j]) for j in open_)}, as the samples of {data} have '
            f'{"them" if len(open_) > 1 else "it"} ({got}: {FIXED_DIMS} in the run folder); '
            'export writes the trained weights into the file as it is')
    return dst, {'model': os.path.abspath(model_path), 'copy': FIXED_DIMS,
                 'dims': {n: got for n, (_, got) in each.items()}}


def unbatched(model_path, out_dir, log=print):
    """(the model to prepare, its file's batch): a .tflite / .circle whose file fixes a
    batch of N > 1 (Keras's Input(batch_size=N)) is copied into out_dir with batch 1
    (formats.batch.set_batch), and prepare says so; a batch mixed with the data (a RESHAPE
    merging it into the features) is refused saying why."""
    from ..formats import batch as fb
    from ..formats.onnx_io import is_onnx
    if not os.path.isfile(model_path):
        return model_path, 1
    if is_onnx(model_path):     # (read at batch 1: onnx_io.load; export keeps the file's)
        try:
            from ..formats.onnx_io import fixed_batch, _onnx
            n = fixed_batch(_onnx().load(model_path))
        except Exception:   # noqa: B902 - (settle says what is wrong with the file)
            return model_path, 1
        if n > 1:
            log(f'{model_path}: its file fixes a batch of {n}; utrain trains a sample at a time '
                f'(--batch is the training batch): read with batch 1; export writes the trained '
                f'weights into the file, its batch of {n} kept')
        return model_path, 1
    try:
        g = read_model(model_path)
        n = fb.check_batch(g)
    except fb.BatchError as e:
        raise PrepareError(str(e)) from None
    except ValueError:
        return model_path, 1        # (settle says what is wrong with the file)
    if n == 1:
        return model_path, 1
    os.makedirs(out_dir, exist_ok=True)
    stem, ext = os.path.splitext(os.path.basename(model_path))
    dst = os.path.join(out_dir, f'{stem}.{BATCH1}{ext}')     # (earlier-N/ keeps its own)
    if os.path.exists(dst) and os.path.samefile(dst, model_path):
        raise PrepareError(f'{model_path}: prepare would overwrite it with its batch-1 copy; '
                           'prepare into another folder')
    fb.set_batch(model_path, dst, n, 1)
    log(f'{model_path}: its file fixes a batch of {n}; utrain trains a sample at a time '
        f'(--batch is the training batch): prepared from a copy with batch 1 ({dst}); '
        f'export writes the trained model with the batch of {n} again')
    return dst, n


def _batch1_prepare(model_path, out_dir, data=None, log=print, **kw):
    """_prepare on the model, or on its batch-1 copy when its file fixes a batch
    (unbatched); prepare.json then names the file's batch ("fixed_batch": export writes
    it back)."""
    src, n = unbatched(model_path, out_dir, log)
    src, fixed_dims = fixed_dims_copy(src, out_dir, data, log)
    try:
        r = _prepare(src, out_dir, data, log=log, **kw)
    except (PrepareError, ValueError) as e:
        if not fixed_dims or src not in str(e):
            raise
        # (a refusal of the copy with the dimensions the samples set, which a refusal
        # leaves no trace of: it had named that file alone, not the model or the samples)
        said = str(e).replace(src, f'{model_path} with the dimensions the samples of '
                              f'{data} set ({_dims_said(fixed_dims["dims"])})')
        damaged = ': the file may be damaged: export the model again'
        if damaged in said:
            # (the model read whole with the file's own dimensions: it is not damaged, its
            # layers after the input take one size only, a Flatten into a Gemm of fixed
            # width; the advice had been to export it again and report a utrain bug)
            said = said[:said.index(damaged)] + (
                ': the model\'s layers take other dimensions than these samples have (a '
                'Flatten or Reshape into a layer of fixed width fits one input size only): '
                'give samples of the size the model was made for, or fix the input\'s '
                'dimensions in the file to that size')
        e.args = (said,) + e.args[1:]
        raise
    if fixed_dims:
        _prepared_from_copy(out_dir, r, 'fixed_dims', fixed_dims, model_path)
    if n > 1:
        _prepared_from_copy(out_dir, r, 'fixed_batch', {
            'batch': n, 'model': os.path.abspath(model_path), 'copy': os.path.basename(src)},
            model_path)
    return r


def _dims_said(dims) -> str:
    """{input name: dims} as a refusal says it: 'seq [1, 2, 10], vec [1, 5]'."""
    return ', '.join(f'{n} {list(d)}' for n, d in dims.items())


def _prepared_from_copy(out_dir, r, key, value, model_path):
    """A prepare of a copy of model_path (its batch or its open dimensions set): summary r
    and out_dir's prepare.json name the copy (key: value) and the model as given, which
    export writes."""
    if not isinstance(r, dict):
        return
    r[key] = value
    sp = os.path.join(out_dir, 'prepare.json')
    if os.path.exists(sp):
        with open(sp) as f:
            d = json.load(f)
        d[key] = value
        d['model'] = r['model'] = os.path.abspath(model_path)   # (export's, as given)
        atomic_write(sp, (json.dumps(d, indent=1) + '\n').encode())


def prepare(model_path, out_dir, *args, **kw):
    """Prepare out_dir to train model_path (_prepare's arguments, which says what each
    does): written in a staging folder beside it that replaces it at the end
    (runfolder.Staged), so that a prepare stopped half way (Ctrl-C, a kill, an error)
    leaves the folder as it was or none; a second prepare or a run in the same folder
    meanwhile is refused, naming it.  A --select trial's scratch folder (trial) is
    written in place."""
    import inspect
    out_dir = os.fspath(out_dir)        # (a pathlib.Path as -o: the names mapped are str)
    a = inspect.signature(_prepare).bind(model_path, out_dir, *args, **kw).arguments
    if a.get('trial'):
        with light_gc():
            return _batch1_prepare(model_path, out_dir, *args, **kw)
    log = a.get('log', print)
    # (an input that is one of the folder's files would be replaced by the new one)
    check_outputs(out_dir, (model_path, a.get('data'), a.get('train_config')),
                  OUTPUTS + ('q8.json', 'q8.req', 'q8t.json'))
    too_long_to_stage(out_dir)
    out = os.path.normpath(out_dir)
    with Staged(out_dir, log) as stage, light_gc():
        def mapped(v):      # (the staging folder's name, in what the user reads: out_dir)
            if isinstance(v, str):
                return v.replace(stage, out) if stage != out else v
            if isinstance(v, dict):
                return {mapped(k): mapped(x) for k, x in v.items()}
            return type(v)(mapped(x) for x in v) if isinstance(v, (list, tuple)) else v
        try:
            # (inputs in out_dir are read where they are: the staging folder has copies)
            a.update(out_dir=stage, log=lambda *m: log(*map(mapped, m)))
            overrides = a.pop('overrides', {})
            r = mapped(_batch1_prepare(**a, **overrides))
        except (PrepareError, ValueError, OSError) as e:
            e.args = mapped(e.args)
            if isinstance(e, OSError) and e.filename:
                e.filename = mapped(e.filename)
            raise
    if a.get('bands') and isinstance(r, dict) and not r.get('bands') and not r.get('select'):
        banded = None       # (an int8 run's band groups are in its q8.json)
        if r.get('int8'):
            try:
                with open(os.path.join(out_dir, 'q8.json')) as f:
                    banded = json.load(f).get('groups')
            except (OSError, ValueError):
                banded = True
        if not banded:      # (it had been taken without a word)
            log(f'{model_path}: --bands {a["bands"]}: the run has no frozen layers that can run '
                'in row bands (convolutions, pools and elementwise ops below the trained ones, '
                'on rows of an image); nothing to change')
    return r


def _prepare(model_path, out_dir, data=None, test_split=0.0, split_seed=0, dtype=None,
            progress=None, rewrite=True, ranks=None, train_config=None, budget=None, board=None,
            backend='fallback', cache=False, select=None, select_layers=None, dequantize=False,
            bands=None, int8=None, log=print, trial=False, scale_input=True, output=None,
            **overrides):
    """Run the host passes, check the heap plan against the budget, write the folder.
    Returns a summary dict.  data: an .npz, .csv or folder of class image folders
    (dataset.load); dtype: how the samples are stored (float32, or uint8/int8 with a
    scale, 1/4 of the flash).  ``rewrite=False`` trains the graph exactly as the file has
    it (no exporter-output passes; kernel tests use it to run the ops they built).
    ranks: 'OP:RANK,...' or {op: rank code}; train_config: an onert-micro
    training-config file (its ops train with its ranks, the others are frozen); op
    indices are the graph's as given, like train's.  budget: bytes or '96K'; board: a
    boards/boards.json profile: its batch and stream_frozen are the defaults, its heap
    bounds the whole plan and its heap_budget the plan's data (all but code and
    interpreter).  select: 'auto' (contribution analysis on the host over data) or
    'board' (the board picks among candidates by Fisher potential; select_layers: how
    many besides the classifier) chooses the ranks within the budget (host_tools/prepare/select.py).  An int8 model
    trains as int8 (host_tools/prepare/quant.py) unless ``dequantize``: then in float32, dequantized.
    cache: train.py caches the input of the first trained op per sample (utrain.prefix)
    in its first epoch and runs later epochs from there; 'host': prepare writes that cache
    (host_tools.files.prefixcache), the board never runs the frozen prefix to train.
    bands: rows per band of the frozen chains the board computes a few rows at a time
    (host_tools/graph/bands.py); None: 1 where that lowers the heap plan, 0: never.
    int8: a float model trained in integers, calibrated on data (host_tools/prepare/fromfloat.py):
    True asks for it, False keeps float32, None lets prepare choose (with a board
    profile and no ulab, where the int8 path takes the settings).  trial: the folder of a
    --select trial (host_tools/prepare/select.py), which reads only model.flat,
    weights.wof, train.json and the datasets: no plans for the other boards in
    prepare.json's summary (heap.by_target) and no rewritten graph beside.  An int8 model
    whose int8 run fits the board or budget with no settings trains dequantized where
    that fits (and prepare says so), unless --select or --ranks chose for int8.  scale_input:
    a float run whose input is far larger than 1 on data trains it scaled by a power of
    two (inscale.scale_input); False keeps it as given (the int8 path calibrates).
    output: of a model with several outputs, the one the loss reads (its name or place:
    inout.choose_output; None: the first whose size data's targets fit); a model with
    several inputs has them joined into one (runplan.one_input_output) and data gives an
    array per input (dataset.load_inputs)."""
    call = dict(locals())       # (the arguments: an int8 run that does not fit, dequantized)
    # (none given: float32, or uint8 where float32 samples overflow the board's flash)
    dtype_given, dtype = dtype is not None, dtype or 'float32'
    if board:       # (its profile's own name: 'RP2040' and 'pico' are rp2040)
        call['board'] = board = _board_name(board)
    check_budget_given(budget, log)
    check_select_options(select, select_layers, ranks, train_config, overrides.get('train'))
    if bands is not None and bands < 0:
        raise PrepareError(f'--bands {bands}: ROWS is the output rows per band, 1 or more '
                           '(0: no row bands; leave it out: prepare chooses)')
    given = {k for k in ('stream', 'batch') if overrides.get(k) is not None}   # the user's
    source, prof, s, train = settle(model_path, board, overrides, progress, split_seed, output,
                                    log, data)
    given |= {k for k in ('lr', 'epochs') if overrides.get(k) is not None     # (run_defaults)
              or k in metadata_settings(source)}
    n_file = getattr(source, 'nfile', None) or len(source.ops)
    if isinstance(train, str) and train.startswith('last:') and train[5:].isdigit() and \
            int(train[5:]) > n_file:
        log(f'{model_path}: --train {train}: the file has {n_file} ops; it trains all of them '
            '(--train all)')
    if len(source.outputs) > 1:     # (the choice --select's trials make again)
        output = source.output_place
    from ..files.validate import softmax_of_one
    from ..files.dataset import class_labels, two_class_labels
    softmax_of_one(source)
    class_labels(source, data)
    two_class_labels(source, data)
    s = step_classes(source, loss_from_data(source, s, data, overrides, log), data, overrides,
                     log)
    if s['metric'] == 'accuracy' and s['loss'] == 'bce' and _outputs(source) > 1:
        raise PrepareError(f'{model_path}: --metric accuracy counts one class a sample (the '
                           f'largest output); bce on {_outputs(source)} outputs trains each as its '
                           'own yes/no (multi-label): leave --metric out (mae, the mean distance '
                           'of each output from its 0/1 target) or give --loss cce or scce')
    decays = s['schedule'] in ('linear', 'cosine') and not s['schedule_steps']
    if decays and not data:
        raise PrepareError(f'--schedule {s["schedule"]}: without --data prepare cannot count the '
                           'run\'s updates; give steps=N (the update the decay ends at)')
    as8 = quant.is_int8(source) or ((quant.float_ends(source) or quant.ids_beside_int8(source))
                                    and not quant.settings_refusal(s, source))
    # an int8 Keras Embedding on exact ids (a float32 or int32 input) trains as int8
    # (utrain.q8emb) with the settings int8 training takes; else dequantized (below)
    emb8 = not as8 and not dequantize and quant.embedding_ids(source) and not \
        quant.settings_refusal(s, source)
    as8 = as8 or emb8
    if as8 and int8 is False and not dequantize:    # (it had been taken without a word)
        log(f'{model_path}: --float32: the model is int8, so it trains in float32 dequantized, '
            'as --dequantize does (export --quantized writes it back as int8)')
        dequantize, as8 = True, False
    # the samples as given, read once here for the input's scale and --select's flash check
    # (a model with several inputs: they are joined after the rewrites, and not scaled)
    early = data and len(source.inputs) == 1 and (rewrite and scale_input or select and board)
    x, y = read_data(data, source.tensors[source.inputs[0]].shape) if early else (None, None)
    source.optimizer = s['optimizer']       # (Adam scales where inscale.adam_keeps_scale)
    if early and rewrite and scale_input:   # (read by inscale.scale_input)
        source.input_rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) \
            if x.size else None
        warn = quant.input_range_warning(source, data, x)
        if warn:
            log(warn)
    if data and len(source.inputs) > 1 and rewrite and scale_input:
        source.inputs_rms = inputs_rms(data, source)    # (each input scaled by its own)
    if data and len(source.inputs) > 1 and dtype != 'float32':
        source.inputs_stored = stored_parts(data, source, dtype)    # (each at its own scale)
    auto = None         # why an int8 model trains dequantized without --dequantize
    if as8 and not dequantize and quant.loss_refusal(s, source) and overrides.get('loss') is None \
            and 'loss' not in metadata_settings(source):
        # the loss nobody named (the data's, or the default) is one int8 training lacks for
        # this model (a sigmoid's bce, mse on probabilities): trained dequantized, as
        # --dequantize would
        auto = quant.loss_refusal(s, source)
    elif as8 and not (dequantize or train_config) and rewrite:
        # an op int8 training has no kernel for and the float path runs (ABS, ...) when
        # nobody named what trains: trained dequantized
        why = quant.op_refusal(source, train if overrides.get('train') is None and not (
            ranks or select) else 'none')
        auto = why if why and quant.float_takes(source, train) else None
    if as8 and not dequantize and quant.several_refusal(source):
        auto = quant.several_refusal(source)
    elif not dequantize and not emb8 and quant.embedding_entry(source) and not (
            as8 and quant.ids_beside_int8(source)):
        why = quant.embedding_ids(source) and quant.settings_refusal(s, source)
        auto = (why or (
                 'an int8 embedding (GATHER of an int8 table) whose ids the int8 path cannot '
                 'take exactly')) + (': its table and the layers after it train dequantized; '
                                     'export --quantized --data D writes the table back at a '
                                     'scale that holds its trained values') + \
            quant.embedding_ids_note(source)
    if auto:
        log(f'{model_path}: trains in float32, dequantized as --dequantize does: {auto}; '
            'export --quantized writes the trained model back as int8')
        dequantize, as8 = True, False
    # the samples --select's flash check prices: as read, or several inputs' joined
    fx, fy = (x, y) if early else joined_samples(data, source) if (
        select and board and data and len(source.inputs) > 1) else (None, None)
    if select and board and fx is not None:
        # --select's trials take minutes: samples the board's flash cannot hold even as
        # 8-bit values beside the model's weights as int8 are refused before they run
        check_flash(model_path, (fx.reshape(len(fx), -1), fy.reshape(len(fy), -1)), 'int8',
                    board, int8_bytes(source))
    if not (dequantize or train_config) and rewrite and as8:
        limit8 = lambda heap: heap_limit(prof, budget, heap)    # noqa: E731
        if select:              # chosen as int8 (host_tools/prepare/select.py choose_q8)
            from .select import choose_q8
            flash8 = _flash_fits(model_path, fx, fy, 'int8', board, int8_bytes(source), s,
                                 lambda w: dict(layers=w[0], cache=w[1])) \
                if board and fx is not None else None
            sel = choose_q8(select, model_path, source, data, s, limit8, test_split,
                            split_seed, board, cache, bands, select_layers, log,
                            prepare=_prepare, flash=flash8,
                            defaults=trial_defaults(given, model_path))
            ranks, train = sel['ranks'], 'none'
            cache = cache or sel.get('cache', False)
            if 'select' in sel:     # the board chooses among the union's configurations:
                s = dict(s, select=sel['select'])   # train.json's block (and its plan's pass)
                given = given | {'cache'}   # (its pass runs the whole net: no prefix cache)
        rk = ranks if isinstance(ranks, dict) else parse_ranks(ranks, len(source.ops))
        int8_unread(model_path, 'stream' in given, backend, dtype if dtype_given else None, log)
        try:
            summary = quant.prepare_q8(source, model_path, out_dir, s, train, data, test_split,
                                       split_seed, progress, cache, bands, board, limit8,
                                       limit_source(board, prof), log,
                                       given | ({'cache'} if cache else set()), rk)
        except quant.HeapRefusal as e:
            if select or ranks or e.int8_fits or not quant.float_takes(source, train):
                raise
            return dequantized_instead(call, e)
        summary = probe_written(out_dir, summary, given, log, model_path)
        if select:
            summary['select'] = {k: v for k, v in sel.items() if k in (
                'select', 'fallback', 'score', 'classifier_only', 'runners_up', 'bias_gain',
                'weight_gain', 'trials', 'note', 'graph_ops', 'failed', 'uncertain')}
            summary['select']['ranks'] = {str(i): RANK_NAMES[r] for i, r in sel['ranks'].items()}
            over_boards_note(model_path, summary, board, log)
        return summary
    if not (dequantize or ranks or train_config or select) and rewrite:
        # (prepare's own choice of int8: what it says of the int8 version, a layer's zero
        # bias, is said once that version trains; refused, only the choice is said, then
        # why float32 trains after all)
        held, refused = [], None
        try:
            q8 = from_float(model_path, out_dir, data, test_split, split_seed, progress, cache,
                            bands, board, backend, budget, prof, s, train, int8, given, overrides,
                            log if int8 else (lambda *m: held.append(m)),
                            source.input_rms if len(source.inputs) < 2 else
                            getattr(source, 'inputs_rms', None), output)
        except quant.HeapRefusal as e:
            if int8:            # (asked: refused, with the options int8 would fit with)
                raise
            refused = e
        finally:
            for m in held[:1] if refused else held:     # (refused: the choice alone)
                log(*m)
        if refused:
            # (prepare's own choice, refused before anything is written: float32 where
            # that fits, else both plans' refusals)
            return dequantized_instead(call, refused, float32=True)
        if q8:
            int8_unread(model_path, 'stream' in given, backend, dtype if dtype_given else None,
                        log)
            return probe_written(out_dir, q8, given, log, model_path)
    elif int8:
        raise PrepareError(f'{model_path}: --int8 does not go with --dequantize, --ranks, '
                           '--train-config, --select or --no-rewrite')
    limit = lambda heap: heap_limit(prof, budget, heap)     # noqa: E731 (the plan's bound)
    note = loss_on_logits(source, s)    # before --select's trials train on it
    if note:
        log(note)
    flash = _flash_fits(model_path, fx, fy, dtype, board, None, s, dict,
                        None if dtype_given else 'uint8') \
        if select and board and fx is not None else None
    sel = select_fitting(select, model_path, data, dict(s, output=output) if output is not None
                         else s, prof, budget, backend, rewrite,
                         test_split, split_seed, select_layers, log,
                         dict(board=board, cache=cache, bands=bands, limit=limit,
                              input_rms=source.input_rms, flash=flash),
                         dequantize and quant.is_int8(source), given) if select else None
    if sel:                     # the selection replaces --train, --ranks, --train-config
        ranks, train_config, train = sel['ranks'], None, 'none'
    chosen, chosen_rk = what_trains(source, train, ranks, train_config,
                                    overrides.get('train') is not None)
    off = off_output(source, chosen_rk)
    if off:                     # (named by --ranks or --train-config, not a count as last:N)
        raise PrepareError(f'{model_path}: ' + ('op %s feeds' if len(off) == 1 else 'ops %s feed')
                           % _span(off) + ' only outputs this run does not train (it trains '
                           f'output {source.output_place}): give --output the one '
                           'it feeds, or leave it out of --ranks / --train-config')
    whole = [i for i in chosen if i not in chosen_rk and any(     # ops with weights
        t >= 0 and source.tensors[t].data is not None
        and (source.tensors[t].data.dtype.kind == 'f' or source.tensors[t].data.dtype.itemsize == 1)
        for t in source.ops[i].inputs)]
    if ranks and not sel and overrides.get('train') is None and whole:
        log(f'--ranks with --train {train} (the default): '
            + ('op %s trains' if len(whole) == 1 else 'ops %s train') % _span(whole)
            + ' whole besides the ranked ones; --train none trains only the ranked ops')
    g, _, _, info, perm, p = select_rewrite_plan(source, chosen, chosen_rk, rewrite)
    if dequantize and not info.get('dequantized'):      # (it had been taken without a word)
        log(f'{model_path}: --dequantize: the model holds no int8 or uint8 tensors to '
            'dequantize; it trains in float32 as it is')
    if not p.params:
        from ..graph.passes import reach_hint
        skip = set(off_output(source, range(len(source.ops))))     # (not in the run)
        raise PrepareError(f'{model_path}: {NOTHING}' +
                           reach_hint([(op.number, op.name) for op in source.ops
                                       if op.index not in skip], len(source.ops), train)
                           + ((' (op %s feeds' if len(skip) == 1 else ' (ops %s feed')
                              % _span(sorted(source.ops[i].number for i in skip))
                              + ' only outputs this run does not train)' if skip else ''))
    for line in missing_biases(model_path, g, p):
        log(line)
    from ..graph.optable import normalization
    norm = [source.ops[i].number for i in sorted(chosen) if normalization(source.ops[i], source)]
    if norm:
        log(f'{model_path}: ' + ('op %s normalizes' if len(norm) == 1 else 'ops %s normalize')
            % _span(norm) + ' by constant statistics ((x - mean) x 1 / std, as Keras\'s '
            'Normalization layer writes it; Keras does not train them): the mean and std stay '
            'the file\'s')
    trained = {g.tensors[k].name for k in p.params}
    copied = sum(len(f) - 1 for f in info.get('unshared_names', ()) if trained & set(f))
    if copied:      # (of a constant a layer that trains reads, with another layer)
        log(f'{model_path}: {copied} weight or bias tensor{"s" * (copied > 1)} several layers '
            'read (the converter keeps one tensor for equal constants, such as zero biases) '
            f'{"are" if copied > 1 else "is"} copied: each layer trains its own, and export '
            'writes them as tensors of their own')
    if isinstance(info['input_scale'], dict):       # (several inputs: each its own)
        for key, sc in info['input_scale'].items():
            log(f'{model_path}: input {key!r}\'s root mean square is '
                f'{source.inputs_rms[key]:.4g} on {data}: it trains on it times {sc:g} '
                f'(a MUL after the inputs\' split, the weights it reaches x{1 / sc:g}: the same '
                f'model, whose SGD steps on them are {1 / sc ** 2:g}x smaller than on the input '
                'as given); export folds it back')
    elif info['input_scale']:
        sc = info['input_scale']
        log(f'{model_path}: its input\'s root mean square is {source.input_rms:.4g} on {data}: '
            f'it trains on the input times {sc:g} (a MUL before op {g.ops[0].number}, the '
            f'weights the input reaches x{1 / sc:g}: the same model, whose SGD steps on them '
            f'are {1 / sc ** 2:g}x smaller than on the input as given); export folds it back')
    fisher = bool(sel and 'select' in sel)      # the board selects (utrain/fisher.py)
    if s.get('stream') and not any(k >= 0 and g.tensors[k].data is not None and k not in
                                   p.params for op in g.ops for k in op.inputs):
        # (every constant trains: utrain.stream's code, tables and slot buffers, 4 KB on
        # a small MLP, had been planned and loaded for no weight, unsaid)
        if 'stream' in given:
            log(f'{model_path}: --stream: every weight of this run trains, none is frozen '
                'to stream from the model file; streaming does nothing here, so the run '
                'does not stream')
        s = dict(s, stream=False)
    # (8-bit samples: the board's input byte buffer, memory.sample_bytes)
    heap = plan_memory(g, p, dict(s, dtype=dtype), backend, board, cache, fisher, bands, limit)
    if cache or not data or fisher:     # (a cache given wins; the host's needs the samples)
        given.add('cache')
    heap, p, s, cache, chose = fit_options(model_path, g, p, dict(s, dtype=dtype), heap, cache,
                                           given, limit, dict(backend=backend, board=board,
                                                              fisher=fisher, bands=bands), log)
    s = {k: v for k, v in s.items() if k != 'dtype'}
    check_budget(model_path, heap, prof, budget, board, source, s, chosen, chosen_rk, backend,
                 rewrite, dict(cache=cache, fisher=fisher, bands=bands, limit=limit))
    if not trial:
        over = {}
        heap['by_target'] = plans_by_target(    # (the bands chosen: bands=0 keeps them)
            lambda t: plan_memory(g, p, dict(s, dtype=dtype), backend, t, cache, fisher, 0), over)
        if over:            # (boards whose heap the plan exceeds: over_boards_note)
            heap['over_boards'] = over
    shape, n_out = g.tensors[g.inputs[0]].shape, int(np.prod(g.tensors[g.outputs[0]].shape))
    xy = read_data(data, shape, n_out, perm, s['loss'], f'the model input {shape}'
                   + (' (its inputs joined)' if getattr(g, 'joined', None) else ''),
                   getattr(g, 'data_inputs', None), g.tensors[g.outputs[0]].shape)
    if xy is not None and s['loss'] == 'bce' and s.get('from_logits') and len(xy[1]) and \
            xy[1].max() > 1:
        # (bce from logits on a target above 1: -t z + log(1 + e^z) falls without end as z
        # grows; on a sigmoid's probabilities its clipping bounds it: a warning, below)
        from ..files.dataset import cross_entropy_range
        cross_entropy_range(np.asarray(xy[1]).reshape(len(xy[1]), -1), 'bce', data)
    for warn in (target_range_warning(data, g, s, xy and xy[1]),
                 one_class_warning(data, s, xy and xy[1], n_out),
                 same_inputs_warning(data, xy and xy[0])):
        if warn:
            log(warn)
    check_ids(model_path, g, xy, dtype)
    stored = xy is not None and dtype != 'float32' and getattr(g, 'joined', None)
    if stored:          # (each input's codes at its own scale: join_inputs's MUL, ADD)
        xy = (stored_codes(g, xy[0]), xy[1])
    writes = dict(shapes=[g.tensors[k].shape for k in p.params], optimizer=s['optimizer'],
                  momentum=s.get('momentum', 0.0),
                  cut=cut_bytes(g, p.params) if cache == 'host' else 0)
    try:
        check_flash(model_path, xy, dtype, board, float_bytes(g, model_path), writes)
    except PrepareError:
        if dtype_given or dtype != 'float32' or getattr(g, 'joined', None):
            raise
        dtype = bytes_fit(model_path, g, xy, board, writes, log)
        if dtype != 'float32':      # (planned again with its byte buffer, the bands kept)
            heap = dict(heap, **plan_memory(g, p, dict(s, dtype=dtype), backend, board, cache,
                                            fisher, 0))
    # (a split that leaves nothing to train: refused before writing)
    n_train = len(ds_split(len(xy[0]), test_split, split_seed)[0]) if xy is not None else None
    if not trial:
        s = run_defaults(s, given, n_train, log, model_path)
    check_outputs(out_dir, (model_path, data, train_config))
    if not trial:
        set_aside_earlier_run(out_dir, log)
    files, wrote = write_folder(out_dir, model_path, g, p, s, info['changed'], sel, train_config,
                                trial)
    summary = describe(model_path, g, p, heap, info, perm, files, wrote, sel)
    over_boards_note(model_path, summary, board, log)
    if auto:
        summary['dequantized_because'] = auto
    if chose:
        summary['chose'] = chose
    summary.update(write_data(out_dir, xy, files, s['loss'], test_split, split_seed, dtype,
                              *((1.0, 0.0) if stored else ()),
                              out_shape=g.tensors[g.outputs[0]].shape, where=data))
    if stored:
        summary['inputs_stored'] = {k: list(v) for k, v in g.inputs_stored.items()}
    summary.update(write_prefix_caches(out_dir, files, cache))
    if not trial and xy is not None and dtype == 'float32' and not stored and len(xy[0]):
        from .exportcheck import dead_relu
        from .select import layer_macs
        # (up to 32 samples spread over the data, fewer for a large model: about 5e7
        # multiply-adds, a second or two of utrain's float kernels on the host)
        n = max(4, min(32, int(5e7 // max(1, sum(layer_macs(g, op) for op in g.ops)))))
        pick = np.unique(np.linspace(0, len(xy[0]) - 1, min(n, len(xy[0]))).astype(int))
        warn = dead_relu(out_dir, g, p.params, np.asarray(xy[0])[pick], model_path)
        if warn:
            log(warn)
            summary['dead_relu'] = warn     # (an int8 run from this float one says it too)
    if not trial:
        from .select import step_macs, layer_macs
        # (a cached frozen prefix: the probe runs it once a sample, then the ops above)
        k = next((i for i, op in enumerate(g.ops) if set(op.inputs) & set(p.params)), 0) \
            if cache else 0
        pre = sum(layer_macs(g, op) for op in g.ops[:k])
        # (a held sample runs forward only: the ops above the prefix, once)
        lr = probe_lr(out_dir, dict(s, files=files), n_train, given, log, model_path,
                      step_macs(g, p) - pre, cache, pre,
                      fwd=sum(layer_macs(g, op) for op in g.ops[k:]))
        s = s if lr is None else dict(s, lr=lr)
    if decays:                  # the decay ends with the run: epochs x updates an epoch
        s['schedule_steps'] = s['epochs'] * -(-summary['train_samples'] // s['batch'])
    if s['schedule'] in ('linear', 'cosine') and s['schedule_steps'] <= s['warmup']:
        # (train.json written so, the board's check refused it: '"schedule_steps" must be
        # the update a cosine decay ends at, above "warmup"')
        raise PrepareError(
            f'--schedule {s["schedule"]},warmup={s["warmup"]}: the warmup does not end before '
            f'the decay does, at update {s["schedule_steps"]}'
            + (f' (steps={s["schedule_steps"]})' if not decays else
               f' (the whole run: {s["epochs"]} epochs of '
               f'{-(-summary["train_samples"] // s["batch"])} updates)')
            + ': give a warmup below it' + ('' if not decays else ', more --epochs,')
            + ' or steps=N above the warmup')
    warn = step_schedule_warning(s, summary.get('train_samples'))
    if warn:
        log(warn)
    check_decay(model_path, s)
    return write_run_config(out_dir, files, s, summary, progress,
                            {'select': sel['select']} if fisher else {},
                            on_nan='lower', lr_factor=0.5, max_retries=3,
                            cache='host' if cache == 'host' else bool(cache),
                            gc_every=heap['gc_every'], **run_planned(heap, limit),
                            **({'steps': heap['steps']} if heap.get('steps') else {}))


def check_decay(model_path, s):
    """A weight decay that overshoots: under sgd and adamw each step multiplies the weights
    by 1 - lr x weight_decay (the decay's share), which at lr x weight_decay >= 1 is 0 or
    less: they flip sign and, past 2, grow every step (--weight-decay 1e30 had been taken,
    and the run diverged).  Adam's and RMSprop's L2 decay is scaled by their step."""
    wd, lr = float(s.get('weight_decay') or 0.0), float(s['lr'])
    if wd and s['optimizer'] in ('sgd', 'adamw') and lr * wd >= 1:
        raise PrepareError(
            f'{model_path}: --weight-decay {wd:g} at lr {lr:g}: each {s["optimizer"]} step '
            f'multiplies the weights by 1 - lr x weight_decay = {1 - lr * wd:g}, which wipes '
            f'them out or flips them: give a weight decay below 1 / lr = {1 / lr:g} (0.0001 to '
            '0.01 is usual)')


def _input_parts(data, g):
    """(data key, data's array for it, one row a sample) of each input of graph g with
    several (read as prepare reads them: dataset.load_inputs)."""
    from ..files.dataset import load_inputs
    from ..plan.runplan import data_inputs
    ins = data_inputs(g)
    x = np.asarray(load_inputs(data, ins)[0], np.float64)
    x = x.reshape(len(x), -1)
    at = 0
    for _, shape, key in ins[0]:
        n = int(np.prod(shape[1:]))
        yield key, x[:, at:at + n]
        at += n


def inputs_rms(data, g) -> dict:
    """{input's data key: the root mean square of data's array for it} of graph g with
    several inputs, for inscale.scale_input and quant.relabel_input."""
    return {key: float(np.sqrt(np.mean(np.square(part))))
            for key, part in _input_parts(data, g) if part.size}


def bytes_fit(model_path, g, xy, board, writes, log) -> str:
    """'uint8' where samples stored as uint8 fit the board's flash that float32 ones
    overflow (--board without --dtype: an image folder of 240 RGB 20x20 pictures, 1532 KB
    as float32, over a Pico's 1408 KB), said; else uint8's refusal (the flash advice:
    fewer samples, a board with more flash; ids uint8 cannot hold)."""
    check_ids(model_path, g, xy, 'uint8')
    check_flash(model_path, xy, 'uint8', board, float_bytes(g, model_path), writes)
    from ..files.dataset import quantization
    scale, offset = quantization(xy[0], 'uint8')
    exact = scale == 1.0      # (integers 256 apart at most)
    x = np.asarray(xy[0], np.float64)
    lo, hi = np.percentile(x, [1, 99])
    if (hi - lo) / scale < 16:
        # (a few outlying values stretch the 255 steps: samples of N(0, 1) beside one
        # value of 1e6 were stored in one step of 3922, all but that one 0)
        k = int(np.unravel_index(np.argmax(np.abs(x - np.median(x))), x.shape)[0])
        raise PrepareError(
            f'{model_path}: as float32 the samples overflow the {board}\'s file system, and '
            f'as uint8 they would be lost: their range {x.min():.4g}..{x.max():.4g} (sample {k} '
            f'holds {x[k][np.argmax(np.abs(x[k] - np.median(x)))]:.4g}) is 255 steps of '
            f'{scale:.4g}, and 98% of the values lie in {max(1, int(np.ceil((hi - lo) / scale)))} '
            'of them: '
            'drop or clip the outlying samples, or give fewer samples (or a board with more '
            'flash)')
    log(f'{model_path}: the samples are stored as uint8, a quarter of the flash (as float32 '
        f'they overflow the {board}\'s file system): ' + (
            'exact, integers' if exact else 'value = q x scale + offset, to 1/255 of '
            'their range') + '; --dtype float32 keeps them whole (on a board with more flash)')
    return 'uint8'


def stored_parts(data, g, dtype) -> dict:
    """{input's data key: (scale, offset)} each input of graph g with several is stored at
    as --dtype dtype (uint8, int8): its own range's (dataset.quantization), where one
    scale for the joined samples left a narrow input a few of the 256 steps (a unit vector
    beside 0..255 pixels: 2).  inout.join_inputs gives each part its values back."""
    from ..files.dataset import quantization
    return {key: tuple(float(v) for v in quantization(part, dtype)) if part.size else (1.0, 0.0)
            for key, part in _input_parts(data, g)}


def stored_codes(g, x) -> np.ndarray:
    """Joined samples x of graph g (one_input_output's) as the codes each input is stored
    at (g.inputs_stored, stored_parts': dataset's rounding), as floats: the samples file
    holds them at scale 1, offset 0."""
    out, at = np.array(x, np.float32), 0
    for _, shape, key in g.data_inputs[0]:
        n = int(np.prod(shape[1:]))
        sc, off = g.inputs_stored.get(key, (1.0, 0.0))
        out[:, at:at + n] = np.round((np.asarray(x[:, at:at + n], np.float64) - off) / sc)
        at += n
    return out


def int8_unread(model_path, stream, backend, dtype, log):
    """Say which of the options given an int8 run does not read, and what it does instead
    (--stream, --backend other than fallback, --dtype other than int8 had been taken without
    a word)."""
    if stream:
        log(f'{model_path}: --stream: an int8 run always reads its frozen weights from '
            'weights.wof as each layer runs; nothing to change')
    if backend != 'fallback':
        log(f'{model_path}: --backend {backend}: an int8 run ' + '; '.join(
            (['computes with utrain\'s integer kernels, ulab or not (--dequantize trains in '
              'float32 with ulab)'] if 'ulab' in backend else []) +
            (['plans utrain\'s code as loaded from lib/ into the heap (a firmware with utrain '
              'frozen in needs less than planned)'] if 'frozen' in backend else [])))
    if dtype and dtype != 'int8':
        log(f'{model_path}: --dtype {dtype}: an int8 run stores its samples as int8 at the '
            'model input\'s scale and zero point (they are its input as they are)')


def refusal_with_fits(refusal, other, float32):
    """The int8 refusal's text with the settings the float32 (float32) or dequantized plan
    would fit with (other: that plan's refusal, its 'would fit:' lines), each with the flag
    that keeps the run off int8: Google's KWS CNN on esp32, int8 from float chosen by
    prepare, was refused 'nothing tried fits ... a board with more heap holds it' while
    --float32 --train last:4 --cache-on-host fits (92 KB; the float plan had said so, and
    its lines were dropped).  'nothing tried fits' then says it is int8's.  Returns (the
    refusal's text, ['would fit: FLAG ...' lines])"""
    fits = [a.strip() for a in str(other).split('\n') if a.strip().startswith('would fit:')]
    if not fits:
        return str(refusal), []
    flag = '--float32' if float32 else '--dequantize'
    lines = [('  as int8, nothing tried fits' + a[len('  nothing tried fits'):])
             if a.startswith('  nothing tried fits') else a for a in str(refusal).split('\n')]
    return '\n'.join(lines), [f'would fit: {flag} ' + a[len('would fit:'):].strip()
                               for a in fits]


def dequantized_instead(call, refusal, float32=False):
    """prepare(**call) again in float32, for a run the int8 heap plan refused with any
    settings (refusal, quant.HeapRefusal): an int8 model dequantized (an RNN's int8 layer
    table, a layer a gate and a step, can outgrow the float run), or (float32) a float
    model prepare itself chose to train as int8 (int8 code beside the trainer can outweigh
    what integers save on a small model).  Where that does not fit either, the int8
    refusal with the float plan's first line."""
    log, kw = call['log'], dict(call, **call['overrides'])
    kw.update(int8=False) if float32 else kw.update(dequantize=True)
    del kw['overrides']
    first = str(refusal).split('\n')[0].split(': ', 1)[1]
    try:
        summary = _prepare(**dict(kw, log=lambda *a: None))
    except PrepareError as e:
        why = str(e).split('\n')[0].split(': ', 1)[-1]
        if 'the whole run plans about' in why:      # (runfolder.budget_short's: its need)
            why = 'the whole run plans about ' + why.split('the whole run plans about ')[1]
        text, fits = refusal_with_fits(refusal, e, float32)
        raise PrepareError(f'{text}\n  ' + ('in float32 (--float32), ' if float32 else
                                            'dequantized (--dequantize), ') + why
                           + ''.join('\n  ' + f for f in fits)) from None
    advice = [a.strip() for a in str(refusal).split('\n')[2:] if a.strip()]
    # (why int8 is so large, either way: an int8 GRU file on an rp2040 trained dequantized
    # saying only 'needs about 465 KB'; its 363 layers, a loop unrolled, are 274 KB of it)
    most = ''.join(f'; {a[len("most of it: "):]}' for a in advice if a.startswith('most of it'))
    if float32:
        log(f'{call["model_path"]}: trains in float32 after all: as int8 it '
            + first.split('training as int8 ', 1)[-1].rstrip('.') + most
            + ''.join(f'; int8 {a}' for a in advice if a.startswith('would fit'))
            + ' (--int8 with those options trains it as int8)')
        return summary
    why = f'{first.rstrip(".")}{most}; dequantized it fits'
    log(f'{call["model_path"]}: trains in float32, dequantized as --dequantize does: {why}; '
        'export --quantized writes the trained model back as int8')
    summary['dequantized_because'] = why
    return summary


def from_float(model_path, out_dir, data, test_split, split_seed, progress, cache, bands,
               board, backend, budget, prof, s, train, int8, given, overrides, log, rms=None,
               output=None):
    """The int8-from-float pass (host_tools/prepare/fromfloat.py): where prepare trains the float
    model in integers (asked with int8=True, or chosen for a board without ulab), the
    int8 model calibrated on data's training samples, prepared on quant's int8 path, with
    the calibrated int8 model and its float graph beside the run for export.  Returns the
    summary, or None: the run stays float32.  rms: the input's root mean square (prepare's
    scale_input; quant.relabel_input).  output: of a model with several outputs, the trained
    one's place (each other output is calibrated too, at its own ranges: export writes them)."""
    from . import fromfloat
    try:
        yes, why = fromfloat.choose(int8, model_path, board, backend, data, s, cache)
        if not yes:
            return None
        kw = {k: v for k, v in overrides.items() if k not in ('stream', 'batch', 'train')}
        og, gf, n, rewritten = fromfloat.from_float(model_path, data, kw, train,
                                                    (test_split, split_seed), _prepare, rms,
                                                    output)
        og.optimizer = s['optimizer']       # (quant.relabel_input: inscale.adam_keeps_scale)
        if og.dead_relu:        # (the float prepare's, whose log is silent)
            log(og.dead_relu)
        if og.crushed and not int8:     # (prepare's own choice: float32 learns it)
            log(f'{model_path}: trains in float32 (as int8, {og.crushed[0]}; --int8 asks '
                'for it all the same)')
            return None
        for c in og.crushed:
            log(f'{model_path}: warning: --int8: {c}; without --int8 it trains in float32 '
                '(or bring its inputs to comparable ranges, e.g. in units)')
        quant.layers(copy.deepcopy(og), train)      # (what the int8 path refuses)
        why8 = quant.settings_refusal(s, og)    # (and with these settings: prepare_q8's
        if why8:        # refusal, the float path's run instead where prepare chose int8)
            raise ValueError(f'{model_path}: {why8}')
        frozen = None if int8 else quant.frozen_named(copy.deepcopy(og),
                                                      train if not s.get('ranks') else 'none')
        if frozen:      # (prepare's own choice: float32 trains them; a Keras decoder's
            # Conv2DTranspose stayed frozen on a Pico: test MAE 0.57 where float32 got 0.13)
            log(f'{model_path}: trains in float32 (as int8, {frozen}; --int8 asks for it '
                'all the same)')
            return None
    except (ValueError, PrepareError) as e:
        if NOTHING in str(e):      # (what trains, not int8: float32 refuses it alike)
            raise PrepareError(str(e)) from None
        if int8:
            why = quant.without_dequantize(str(e).replace(model_path + ': ', ''))
            if 'without --int8' not in why and UNSUPPORTED not in why:
                why += '; without --int8 it trains in float32'      # (not: float32 refuses it too)
            raise PrepareError(f'{model_path}: --int8 cannot train it as int8: {why}') from None
        if UNSUPPORTED in str(e):
            return None         # (the float path refuses it too, and says so)
        log(f'{model_path}: trains in float32 (int8 from float does not take it: '
            f'{quant.without_dequantize(str(e).replace(model_path + ": ", ""))})')
        return None
    log(f'{model_path}: prepare chose int8 training ({why}): an int8 version calibrated on '
        f'{n} training samples trains on the int8 path (integer forward, QAS updates); '
        'export writes the trained model as float32 again (--quantized: int8); --float32 '
        'keeps float32 training')
    r = quant.prepare_q8(og, model_path, out_dir, s, train, data, test_split, split_seed,
                         progress, cache, bands, board, lambda heap: heap_limit(prof, budget, heap),
                         limit_source(board, prof), log, given | ({'cache'} if cache else set()))
    save_graph(file_graph(og), os.path.join(out_dir, fromfloat.INT8_MODEL))
    if rewritten:               # (export writes the trained weights into that graph)
        save_graph(gf, os.path.join(out_dir, fromfloat.FLOAT_MODEL))
    r['from_float'] = {'why': why, 'samples': n, 'int8_model': fromfloat.INT8_MODEL,
                       'float_model': fromfloat.FLOAT_MODEL if rewritten else None}
    if rewritten and getattr(og, 'file_tensors', None):
        r['from_float']['file_tensors'] = og.file_tensors
    settings = r.pop('settings')
    atomic_write(os.path.join(out_dir, 'prepare.json'), (json.dumps(r, indent=1) + '\n').encode())
    r['settings'] = settings
    return r


# The memory options prepare may choose itself when --board or --budget bounds the plan
# (flags the user gave win), in the order it tries them: each costs something else.
OPTIONS = (
    ('stream', '--stream', 'the frozen weights stay in the model file and are read per op '
     '(flash reads each sample)'),
    ('cache', '--cache-on-host', 'prepare computes the frozen layers\' outputs for the '
     'samples it writes: the board never runs them (it trains on these samples only)'),
    ('batch', '--batch 1', 'each sample updates at once: no gradient sums held'),
)


def fit_options(model_path, g, p, s, heap, cache, given, limit, how, log=print):
    """The fit pass: where the plan exceeds limit(heap) (--board, --budget), the memory
    options the user left to prepare (OPTIONS not in given) that bring it within: each
    alone first, in OPTIONS' order, else all of them that lower the plan, then those the
    fit does not need dropped.  Row bands come with every plan (plan_memory).  Returns
    (heap, plan, settings, cache, [chosen flags]); nothing chosen when nothing fits
    (check_budget then refuses, with its advice)."""
    lim = limit(heap) if limit else None
    if lim is None or heap['total'] <= lim:
        return heap, p, s, cache, []
    memo = {}

    def fits(r):            # (a board's limit depends on the plan's code: limit(h))
        return r is not None and r[0]['total'] <= limit(r[0])

    def plan_with(names):
        key = tuple(sorted(names))
        if key not in memo:
            memo[key] = _plan_with(names)
        return memo[key]

    def _plan_with(names):
        s2 = dict(s)
        if 'stream' in names:
            s2['stream'] = True
        if 'batch' in names:
            s2['batch'] = 1
        c = 'host' if 'cache' in names else cache
        p2 = copy.deepcopy(p)
        try:
            h = plan_memory(g, p2, s2, cache=c, limit=limit, **how)
        except (ValueError, PrepareError):
            return None
        return h, p2, s2, c

    free = [name for name, _, _ in OPTIONS if name not in given and not (
        (name == 'stream' and s.get('stream')) or (name == 'batch' and int(s['batch']) == 1))]
    if 'cache' in free and not any(i > 0 for i in p.trainable_ops):
        free.remove('cache')            # nothing frozen below the first trained op
    best = None
    for name in free:
        r = plan_with([name])
        if fits(r):
            best = ([name], r)
            break
    if best is None and len(free) > 1:
        names = [n for n in free if (plan_with([n]) or [heap])[0]['total'] < heap['total']]
        r = plan_with(names)
        if fits(r):
            for n in list(names):                      # drop what the fit does not need
                r2 = plan_with([m for m in names if m != n])
                if len(names) > 1 and fits(r2):
                    names.remove(n)
                    r = r2
            best = (names, r)
    if best is None:
        return heap, p, s, cache, []
    names, (h, p2, s2, cache) = best
    flags = [flag for name, flag, _ in OPTIONS if name in names]
    log(f'{model_path}: the plan ({heap["total"] // 1024} KB) is over the '
        f'{limit(h) // 1024} KB limit; prepare chose ' + ' '.join(flags)
        + f' (about {h["total"] // 1024} KB): '
        + '; '.join(f'{flag}: {why}' for name, flag, why in OPTIONS if name in names)
        + ' (give the flag yourself to decide otherwise)')
    return h, p2, s2, cache, flags


def fit_alternatives(s, target, data, given):
    """[(settings, target) overrides] of the memory options fit_options may choose for a
    selection's choice (OPTIONS the user left to prepare: --stream, --cache-on-host, each
    alone and both; then --batch 1 with each of those, where the run's batch is larger):
    a candidate fits the budget with any of them (select.Pricer.fits), as a --train given
    by hand does; one that fits only at batch 1 has its trials at batch 1, as it trains
    (select.Trials.score; before, the selections never took batch 1 and missed what fits a
    board only there: hicnn's last:2 on rp2040, 4.8 points)."""
    free = []
    if 'stream' not in given and not s.get('stream'):
        free.append(({'stream': True}, {}))
    if 'cache' not in given and not target.get('cache') and data:
        free.append(({}, {'cache': 'host'}))
    if len(free) == 2:
        free.append(({'stream': True}, {'cache': 'host'}))
    if 'batch' not in given and int(s.get('batch') or 1) > 1:
        free += [(dict(so, batch=1), to) for so, to in [({}, {})] + free]
    return free


def select_fitting(mode, model_path, data, s, prof, budget, backend, rewrite, test_split,
                   split_seed, layers, log, target, dequantize, given):
    """run_select; where not even the classifier fits, again with each memory option the
    user left to prepare (OPTIONS, in their order) that fit_options would choose below:
    priced with the user's options only, a selection on a board whose classifier fits
    only with --cache-on-host trained the classifier alone, where layers fit beside it
    with that option (a held-out sensor net on esp32: 0.242 against half:11's 0.295).
    With --select board and the cache, the host's choice trains (the board's scoring
    pass would run the frozen layers the cache leaves out), as where the host's best fits
    only without the pass."""
    from . import select as sl
    if budget or (prof or {}).get('heap'):
        target = dict(target, options=fit_alternatives(s, target, data, given))
    sel = run_select(mode, model_path, data, s, prof, budget, backend, rewrite, test_split,
                     split_seed, layers, log, target, dequantize, given)
    nothing = lambda r: r.get('fallback', '').startswith('nothing fits')   # noqa: E731
    if not nothing(sel) or not (budget or prof.get('heap')):
        return sel
    order = sorted(OPTIONS, key=lambda o: mode == 'board' and o[0] == 'cache')
    for name, flag, _ in order:     # (the board scores only without the cache: it last)
        if name in given or (name == 'stream' and s.get('stream')) or (
                name == 'batch' and int(s['batch']) == 1) or (name == 'cache' and (
                target.get('cache') or not data)):
            continue
        s2 = dict(s, stream=True) if name == 'stream' else dict(s, batch=1) if (
            name == 'batch') else s
        t2 = dict(target, cache='host', options=()) if name == 'cache' else dict(
            target, options=())
        # the board's scoring pass runs the frozen layers: with the cache, the host's
        # choice (--select auto's) trains and the board does not score
        m2 = 'auto' if name == 'cache' else mode
        pr = sl.Pricer(model_path, s2, backend, rewrite, t2)
        if not pr.fits({sl.classifier(pr.g0, sl.layers(pr.g0)): 0},
                       lambda h: heap_limit(prof, budget, h), m2 == 'board'):
            continue
        log(f'select {mode}: with {flag} (prepare chooses it below) the classifier fits: '
            'the candidates are priced with it' + (
                '; the board\'s scoring pass would run the layers the cache leaves out, so '
                'the host chooses (as --select auto) and the board does not score'
                if m2 != mode else ''))
        return run_select(m2, model_path, data, s2, prof, budget, backend, rewrite,
                          test_split, split_seed, layers, log, t2, dequantize, given)
    return sel


def trial_defaults(given, model_path):
    """(settings, training samples) -> the settings --select's trials train with: those
    nobody gave (given: the names the user or the model's metadata set) as the run will
    train (run_defaults), said by prepare for the run, not for each trial."""
    return lambda s, n: run_defaults(s, given, n, lambda *m: None, model_path)


def run_select(mode, model_path, data, s, prof, budget, backend, rewrite, test_split,
               split_seed, layers, log, target=None, dequantize=False, given=frozenset()):
    """--select auto|board: host_tools/prepare/select.py chooses the ranks within the budget,
    pricing each candidate as plan_memory will plan the choice (target: its board, cache
    and bands arguments); its trials prepare their folders with prepare() (handed in:
    select imports nothing of this module; dequantize: an int8 model's float trials, as
    the run itself, --dequantize) and train the settings nobody gave (given: the names
    given) as the run will (trial_defaults)."""
    import functools
    from . import select as sl
    limit = lambda h: heap_limit(prof, budget, h)      # noqa: E731
    prep = functools.partial(_prepare, dequantize=True) if dequantize else _prepare
    defaults = trial_defaults(given, model_path)
    if mode == 'auto':
        res = sl.choose_auto(model_path, data, s, limit, backend, test_split, split_seed,
                             rewrite, log=log, target=target, prepare=prep, defaults=defaults)
    elif mode == 'board':
        res = sl.choose_board(model_path, s, limit, backend, rewrite, layers, log=log,
                              target=target, data=data, test_split=test_split,
                              split_seed=split_seed, prepare=prep, defaults=defaults)
    else:
        raise PrepareError(f'--select {mode!r}: expected auto or board')
    trials = res.pop('trial_runs', None)
    if trials:
        trials.close()              # its working folder (the proxy's folds, each trial)
    for line in sl.report(res):
        log(line)
    return res


def export_notes(r, g, summary, out_path) -> list:
    """What `export` says beyond what it wrote: the input layout the exported model takes
    when prepare transposed it (a PyTorch model through tico: NCHW -> NHWC), and an int8
    export's recalibration and measured cost (exportcheck.calibrated), or that there was none."""
    notes = []
    perm = summary.get('input_perm')
    if perm and not r.get('int8') and not r.get('requantized'):   # (those: the original's layout)
        shape = list(g.tensors[g.inputs[0]].shape)
        orig = [shape[i] for i in np.argsort(perm)]
        notes.append(f'note: {out_path} takes its input as NHWC {shape}, not {orig} as the '
                     f'original model: transpose your data, x.transpose({", ".join(map(str, perm))})')
    m = r.get('measured')
    if m:
        kept = (f'activation scales recalibrated on {m["samples"]} samples ({m["tensors"]} tensors)'
                if m['kept'] == 'calibrated' else 'the original activation scales')
        if 'error' in m:
            notes.append(f'note: written with {kept}; not measured: {m["error"]}')
        else:
            name = m['metric']
            got = m['calibrated'] if m['kept'] == 'calibrated' else m['int8']
            drop = m['float'] - got if name == 'accuracy' else got - m['float']
            line = (f'measured on {m["samples"]} samples: {name} {m["float"]:.4f} as trained '
                    f'(float), {m["int8"]:.4f} as int8 with the original activation scales, '
                    f'{m["calibrated"]:.4f} recalibrated; written with {kept}')
            notes.append(('warning: ' + line + f'; {name} {"drops" if name == "accuracy" else "rises"} '
                          f'by {drop:.4f}: train it as int8 instead (prepare without --dequantize) '
                          'or use the float export') if drop > 0.01 else line)
    elif r.get('requantized') and summary.get('file_tensors'):     # (a WHILE: no --data)
        notes.append('note: the int8 export keeps the original model\'s activation scales, which '
                     'training may have outgrown (its loops\' scales are not recalibrated: '
                     'a Keras layer with unroll=True, or prepare --int8 of the float model, '
                     'gives an int8 export at the trained ranges)')
    elif r.get('requantized'):
        notes.append('note: the int8 export keeps the original model\'s activation scales, which '
                     'training may have outgrown: export --data D recalibrates them on D\'s samples '
                     'and measures both')
    return notes


def input_columns(g, n) -> dict:
    """{tensor: (first, end)}: the columns of a sample (n values) each model input takes:
    the whole row, or where join_inputs put it (g.data_inputs' order)."""
    if not getattr(g, 'joined', None):
        return {g.inputs[0]: (0, n)}
    by_name, out, at = {t.name: t.index for t in g.tensors}, {}, 0
    for name, shape, _ in g.data_inputs[0]:
        w = int(np.prod(shape[1:]))
        out[by_name[name]] = (at, at + w)
        at += w
    return out


def check_ids(model_path, g, xy, dtype):
    """An embedding's ids (the input a GATHER reads) must reach the board exactly: the
    samples stored as dtype must give them back, integers all."""
    cols = input_columns(g, xy[0].shape[1]) if xy is not None else {}
    gathers = [op for op in g.ops if op.name == 'GATHER' and len(op.inputs) > 1
               and op.inputs[1] in cols]
    if not gathers:
        return
    for op in gathers:
        lo, hi = cols[op.inputs[1]]
        x = xy[0][:, lo:hi]
        if not np.all(x == np.round(x)):
            raise PrepareError(f'{model_path}: its input is an embedding\'s ids, and the data '
                               'holds values that are not integers: give the ids (token or '
                               'category numbers) as they are')
        n = g.tensors[op.inputs[0]].shape[0]
        first = -n if len(op.inputs) > 2 else 0
        bad = x[(x < first) | (x >= n)]
        if bad.size:
            raise PrepareError(f'{model_path}: op {op.number} GATHER reads rows of a {n}-row '
                               f'table by the input\'s ids, and the data holds id '
                               f'{bad.flat[0]:g} ({bad.size} outside {first}..{n - 1}); TFLite '
                               'stops at such an id, and so would the board: give ids '
                               'the table has')
    if dtype != 'float32':      # (several inputs: each stored at its own, stored_parts)
        from ..files.dataset import quantization
        for op in gathers:
            lo, hi = cols[op.inputs[1]]
            x = xy[0][:, lo:hi]
            if quantization(x, dtype)[0] != 1.0:
                raise PrepareError(
                    f'{model_path}: {"its input" if len(cols) == 1 else "an input"} is an '
                    f'embedding\'s ids, which span {int(x.min())}..{int(x.max())}: --dtype '
                    f'{dtype} holds 256 consecutive ids exactly, not these; use --dtype float32')


def file_weights(g, w):
    """Trained weights w of the rewritten graph g as the file's tensors: a grouped
    convolution's parts joined (groups.join_groups), an input scale folded back into the
    weights it reached (inscale.unscale_input)."""
    return unscale_input(g, join_groups(g, w)[0])[0]


def write_trained(base, out_path, g, w, identifier, ints=None, grown=False, ours=False):
    """out_path: model file base (read as g) with the trained weights w {tensor index:
    array}; where prepare split a grouped convolution (groups.split_groups) the groups
    are joined again into the file's grouped CONV_2D (groups.join_groups), an input
    scale is folded back (inscale.unscale_input), and an embedding's ids made ints again (embeddings.embedding_ids_back; ints: the original
    file's integer inputs {name: dtype}), and the graph is written anew (grown: g has
    tensors base has not), else base's bytes are kept but for the weights.  ours: base is
    the graph prepare rewrote (not the user's file): the SPLIT_Vs its rewrites made
    (slices_to_split) go out as STRIDED_SLICEs, which ONERT 0.1.0 computes right (its
    SPLIT_V's pieces are wrong: a tico TransformerEncoderLayer's export was 0.12 off
    torch under ONERT, the original file exact)."""
    from ..formats.circle_io import write_with_weights
    from ..graph.spellings import splits_to_slices
    w, joined = join_groups(g, w)
    w, scaled = unscale_input(g, w)
    scaled = drop_step_softmax(g) or scaled     # (the logits a step, as the file gave them)
    # the embeddings' ids as the file had them (an int input, or a CAST and Keras 3's
    # negative-id SELECT_V2): a float id no runtime gathers by
    joined += embedding_ids_back(g, ints)
    joined += splits_to_slices(g) if ours else 0
    if not (joined or scaled or grown):
        write_with_weights(base, out_path, w, identifier)
        return
    for k, arr in w.items():
        g.tensors[k].data = np.asarray(arr, g.tensors[k].dtype).reshape(g.tensors[k].shape)
    g.identifier = identifier or g.identifier
    save_graph(compact(g), out_path)


def write_in_place(model_path, out_path, g, w, where):
    """out_path: the model file as it is (a WHILE and its body subgraph: loops.unroll_loops
    trained it unrolled) with the trained weights w {tensor of the rewritten graph g: array}
    written where prepare found each ({str(tensor): [subgraph, tensor of the file]}: the
    body's weights into the body); how many, or None where a trained tensor has no place
    there (a rewrite made it): export then writes the rewritten graph."""
    from ..formats.circle_io import write_with_weights
    w = file_weights(g, w)
    orig, new = read_model(model_path), {}
    for k, arr in w.items():
        si, i = where.get(str(k)) or (None, None)
        sub = orig if si == 0 else (orig.subgraphs or {}).get(si)
        t = sub.tensors[i] if sub is not None and 0 <= i < len(sub.tensors) else None
        if t is None or t.data is None or t.dtype != 'float32' or \
                int(np.prod(t.shape)) != np.asarray(arr).size:
            return None
        new[(si, i)] = np.asarray(arr, np.float32).reshape(t.shape)
    write_with_weights(model_path, out_path, new, out_identifier(out_path, orig.identifier))
    return len(new)


def export_from_float(model_path, run_dir, wof_path, out_path, ff, summary, quantized):
    """export of a float model prepare trained as int8: the trained integers dequantized
    into the float model (its rewritten graph when prepare rewrote it), or with
    quantized the calibrated int8 model with the trained int8 weights."""
    from . import fromfloat
    from .quant import export as export_int8
    for name in (ff.get('int8_model'), ff.get('float_model') or ff.get('int8_model')):
        if name != os.path.basename(str(name)) or not os.path.exists(os.path.join(run_dir, name)):
            raise PrepareError(f'{os.path.join(run_dir, str(name))}: missing; prepare writes it '
                               f'beside {wof_path} for a float model trained as int8')
    if not wof_path.endswith('.wof'):
        raise PrepareError(f'{wof_path}: a float model trained as int8 exports from a .wof '
                           '(trained.wof), not a checkpoint')
    train = summary.get('train', 'all')
    output = (summary.get('output') or {}).get('index')     # (several: the trained one)
    if quantized:
        f = read_model(model_path)
        loops = 'WHILE' in {op.name for op in f.ops}
        dst = out_path if not loops else out_path + '.unrolled'
        export_int8(os.path.join(run_dir, ff['int8_model']), wof_path, dst, train, summary,
                    output, calibrated=True)
        if loops:       # (the trained int8 model put into the file's WHILE loops)
            from .loopq8 import write_int8_loops
            try:
                write_int8_loops(model_path, dst, out_path, out_identifier(out_path, f.identifier))
            finally:
                os.remove(dst)
        return {'model': model_path, 'tensors': len(summary.get('trainable') or {}),
                'clipped': 0, 'int8': True, 'notes': []}
    base = os.path.join(run_dir, ff['float_model']) if ff.get('float_model') else model_path
    g = read_model(base)
    biases = {}
    w = fromfloat.dequantized(os.path.join(run_dir, ff['int8_model']), wof_path, train,
                              len(g.tensors), summary, output, biases)
    for k, b in biases.items():     # (a layer without a bias trained one: it goes in)
        for op in g.ops:
            bp = fromfloat.POSITIONS.get(op.name, (0, 1, 2))[2]
            if op.name in fromfloat.WEIGHTED and op.inputs[1] == k and (
                    len(op.inputs) <= bp or op.inputs[bp] < 0):
                j = new_tensor(g, g.tensors[k].name + '/bias', b.shape, data=b)
                op.inputs[bp:] = [j]
                w[j] = b
    # an unrolled loop's model (a Keras RNN's WHILE): the file as it is, as the float
    # path's export writes it (it had written the unrolled graph)
    n = None if biases or not ff.get('file_tensors') else \
        write_in_place(model_path, out_path, g, w, ff['file_tensors'])
    if n is None:
        write_trained(base, out_path, g, w, out_identifier(out_path, g.identifier),
                      grown=bool(biases), ours=base != model_path)
    r = {'model': base if n is None else model_path, 'tensors': len(w) if n is None else n,
         'clipped': 0, 'dequantized_from_int8': True}
    r['notes'] = export_notes(r, g, summary, out_path)     # (an NCHW input taken NHWC)
    if n is None and ff.get('file_tensors'):
        why = ('the zero bias the int8 path gave a layer without one' if biases else
               'a trained tensor the rewrites made')
        r['notes'].append(f'{out_path}: the loop unrolled ({why} has no place in the loop\'s '
                          'body); --float32 training exports the loop as the file has it')
    return r


@light_gc()
def export(model_path, wof_path, out_path, quantized=False, data=None) -> dict:
    """_export; of a model whose file fixes a batch (prepare.json's "fixed_batch":
    prepare trained its batch-1 copy), from that copy, and the exported file with the
    file's batch again (formats.batch.set_batch), or batch 1 where that cannot be (said in
    the notes)."""
    run_dir = os.path.dirname(os.path.abspath(wof_path))
    fixed = dims = None
    try:
        with open(os.path.join(run_dir, 'prepare.json')) as f:
            d = json.load(f)
        fixed, dims = d.get('fixed_batch'), d.get('fixed_dims')
    except (OSError, ValueError, AttributeError):
        pass                        # (_export says what is wrong with it)
    copy = os.path.join(run_dir, FIXED_DIMS)
    if isinstance(dims, dict) and os.path.isfile(copy):
        # (an .onnx model with open dimensions: prepared from its copy with them set;
        # the exported file has the original's inputs, open as they were)
        r = _export(copy, wof_path, out_path, quantized, data, given=model_path)
        from ..formats.onnx_io import _onnx, is_onnx
        if is_onnx(out_path) and is_onnx(model_path):
            onnx = _onnx()
            m, orig = onnx.load(out_path), onnx.load(model_path, load_external_data=False)
            ins = {vi.name: vi for vi in orig.graph.input}
            for vi in m.graph.input:
                if vi.name in ins:
                    vi.CopyFrom(ins[vi.name])
            atomic_write(out_path, m.SerializeToString())
        r['model'] = model_path
        return r
    if not isinstance(fixed, dict) or not isinstance(fixed.get('batch'), int) or fixed['batch'] < 2:
        return _export(model_path, wof_path, out_path, quantized, data)
    from ..formats import batch as fb
    copy1 = os.path.join(run_dir, os.path.basename(str(fixed.get('copy') or '')))
    r = _export(copy1 if fixed.get('copy') and os.path.isfile(copy1) else model_path, wof_path,
                out_path, quantized, data, given=model_path)
    n = fixed['batch']
    from ..formats.onnx_io import is_onnx
    if is_onnx(out_path):
        return r
    try:
        fb.set_batch(out_path, out_path, 1, n)
        r['batch'] = n
        note = (f'{out_path}: written with the batch of {n} {model_path} fixes (trained a '
                'sample at a time)')
    except (fb.BatchError, ValueError) as e:
        r['batch'] = 1
        note = (f'{out_path}: written with batch 1 ({model_path} fixes a batch of {n}; '
                f'the trained graph cannot take it again: {e})')
    r.setdefault('notes', []).append(note)
    return r


def _export(model_path, wof_path, out_path, quantized=False, data=None, given=None) -> dict:
    """Merge trained weights (.wof, or the weights of a .ckpt checkpoint) into a model.  When prepare rewrote the model (the
    prepare.json beside the .wof says so), the weights index the rewritten graph
    (rewritten.circle beside it): float export writes that plain NHWC float32 graph; with
    ``quantized`` the weights are quantized again with the original tensors' scales and
    zero points (matched by tensor name) into a copy of the original quantized model.
    given: the model the user named, where model_path is the run folder's batch-1 copy of
    it (export of a file that fixes a batch): refused unless it is the model prepared."""
    from ..formats.circle_io import write_with_weights
    from ..files.wof import read_wof, read_checkpoint, MAGIC
    run_dir = os.path.dirname(os.path.abspath(wof_path))
    from ..formats.ir import device
    if device(wof_path):
        raise PrepareError(device(wof_path))
    try:
        with open(wof_path, 'rb') as f:
            head = f.read(2)
    except OSError:
        head = None                 # (said below: a folder, a missing file)
    if head is not None and (len(head) < 2 or int.from_bytes(head, 'little') != MAGIC):
        # (a train.log or test.ds had been 'not a .wof file (magic 28773, want 429)', or,
        # for a float model trained as int8, called a checkpoint)
        if str(wof_path).endswith('.wof.best'):     # (the advice had named it, as weights)
            raise PrepareError(f'{wof_path}: the record of the best epoch (its test loss and '
                               'metric, JSON), not weights: give ' + str(wof_path)[:-5] +
                               ', which holds those weights (or checkpoint.ckpt, the last '
                               'epoch saved)')
        raise PrepareError(f'{wof_path}: not trained weights (a .wof or .ckpt as `run` and '
                           '`pull` write them): give the run folder\'s trained.wof (its best '
                           'epoch) or checkpoint.ckpt (the last epoch saved)')
    summary = {}
    sp = os.path.join(run_dir, 'prepare.json')
    if os.path.exists(sp):
        try:
            with open(sp) as f:
                summary = json.load(f)
        except (OSError, ValueError) as e:
            raise PrepareError(f'{sp}: not readable JSON ({e})') from None
        if not isinstance(summary, dict):
            raise PrepareError(f'{sp}: not what prepare writes (a JSON object)')
    base = model_path
    rw_name = summary.get('rewritten')
    if rw_name is not None and (not isinstance(rw_name, str) or os.path.basename(rw_name) != rw_name
                                or rw_name in ('', '.', '..')):
        raise PrepareError(f'{sp}: "rewritten" {rw_name!r} must be a file name in {run_dir} '
                           '(no folders)')
    inputs = [model_path, wof_path, sp, os.path.join(run_dir, 'model.flat')]
    if rw_name:
        inputs.append(os.path.join(run_dir, rw_name))
    for p in inputs:
        if os.path.abspath(p) == os.path.abspath(out_path) or (
                os.path.exists(p) and os.path.exists(out_path) and os.path.samefile(p, out_path)):
            raise PrepareError(f'{out_path}: export would overwrite its own input {p}; '
                               'give -o another name')
    if os.path.isdir(out_path) or os.fspath(out_path).endswith(('/', os.sep)):
        # (a name ending in '/' of no folder there had been 'cannot write it (Not a
        # directory, 41583935488 bytes free there, 1184 bytes needed)')
        ext = os.path.splitext(model_path)[1] or '.circle'
        raise PrepareError(f'{out_path}: ' + ('is a folder' if os.path.isdir(out_path) else
                                              "names a folder (it ends in '/')")
                           + f'; give -o a file name, e.g. {os.path.join(out_path, "trained" + ext)}')
    not_a_model = _not_a_model(out_path)
    if not_a_model:
        raise PrepareError(f'{out_path}: {not_a_model}, not a model; export writes a model '
                           'file: name -o .circle, .tflite (or .onnx from an .onnx model)')
    from ..formats.onnx_io import is_onnx
    if is_onnx(out_path) and not is_onnx(model_path):
        raise PrepareError(f'{out_path}: an .onnx file is written from an .onnx model; '
                           f'{model_path} is not one: name the output .tflite or .circle')
    ff = summary.get('from_float')
    if summary.get('int8') and wof_path.endswith('.ckpt'):
        # (its weights' scales and growth live in the checkpoint's own blocks; read as a
        # .wof it had been 'holds 0 buffers, the model has 44 tensors')
        raise PrepareError(f'{wof_path}: an int8 run\'s checkpoint (its weights at scales '
                           'kept in its own blocks), which export does not read: export the '
                           'folder\'s trained.wof (the best epoch; with "keep_best": false under '
                           '"run" in train.json a run saves its last epoch there)')
    if data and not quantized:
        raise PrepareError(f'--data {data}: export reads samples only with --quantized (to '
                           'recalibrate the int8 model\'s activation scales and measure it); '
                           'add --quantized, or leave --data out')
    if data and summary.get('int8'):
        raise PrepareError(f'--data {data}: a model trained as int8 exports with the activation '
                           'scales its training kept; leave --data out')
    src = summary.get('model')
    if (given is not None or summary.get('int8') and ff) and isinstance(src, str) and \
            os.path.isfile(src) and os.path.isfile(given or model_path) and \
            not _same_file(src, given or model_path):
        # (the files come from the run folder, the model given left unread: a float model
        # trained as int8, or one whose file fixes a batch, written from its batch-1 copy)
        raise PrepareError(f'{given or model_path}: not the model {run_dir} was prepared from')
    if summary.get('int8') and ff:    # a float model trained as int8 (host_tools/prepare/fromfloat.py)
        return export_from_float(model_path, run_dir, wof_path, out_path, ff, summary, quantized)
    if summary.get('int8'):           # trained as int8: the int8 model, weights as trained
        from .quant import export as export_int8
        export_int8(model_path, wof_path, out_path, summary.get('train', 'all'),
                    {'sigmoid_loss': summary.get('sigmoid_loss'),    # (ops as the file's)
                     'regression': summary.get('regression')},
                    output=(summary.get('output') or {}).get('index'))
        return {'model': model_path, 'tensors': len(summary.get('trainable') or {}),
                'clipped': 0, 'int8': True, 'notes': []}
    if rw_name:
        rewritten = os.path.join(run_dir, rw_name)
        if not os.path.exists(rewritten):
            raise PrepareError(f'{rewritten}: missing; {wof_path} indexes that rewritten model')
        base = rewritten
    g = read_model(base)
    if base == model_path:
        # (a damaged model given, a cycle, an op whose output two ops write, a tensor of
        # no elements: its copy with the weights had been written, rc 0, a file no
        # runtime runs; prepare and evaluate refuse it so)
        from ..files.validate import runnable
        runnable(g)
    g.device_tensors = summary.get('device_tensors', 0)    # (a model's inputs joined)
    if wof_path.endswith('.ckpt'):
        # a sparse update's optimizer state covers its rank only: the prepared folder's
        # model.flat beside the checkpoint says which channels
        flat = os.path.join(run_dir, 'model.flat')
        ranks = None
        if os.path.exists(flat):
            from ..files.flatmodel import read_flat
            try:
                ranks = read_flat(flat)['ranks']
            except ValueError:
                pass                # not this model's folder: whole-tensor state
        w = read_checkpoint(wof_path, g, ranks)
    else:
        w = read_wof(wof_path, g)
    for k, arr in w.items():
        if not np.isfinite(arr).all():
            # (the board never saves such weights: a damaged or hand-made file, exported
            # as it was into a model that answers NaN)
            raise PrepareError(f'{wof_path}: tensor {k} ({g.tensors[k].name!r}) holds '
                               f'{int((~np.isfinite(arr)).sum())} NaN or Inf weights: the file '
                               'is damaged (a run never saves such weights); copy it again '
                               '(`pull` from a board), or export the run folder\'s ' + (
                                   'trained.wof (its best epoch)' if str(wof_path).endswith(
                                       '.ckpt') else 'checkpoint.ckpt (the last epoch saved)'))
    from ..formats.onnx_io import is_onnx, export_onnx
    if is_onnx(model_path) and not quantized:
        if is_onnx(out_path):                       # the ONNX model, initializers trained
            return export_onnx(model_path, g, file_weights(g, w), out_path)
        for k, arr in w.items():                    # the graph utrain trained, as circle
            g.tensors[k].data = np.asarray(arr, np.float32).reshape(g.tensors[k].shape)
        drop_step_softmax(g)
        save_graph(g, out_path)
        return {'model': base, 'tensors': len(w), 'clipped': 0}
    if not quantized and summary.get('file_tensors'):     # (an unrolled loop's model)
        n = write_in_place(model_path, out_path, g, w, summary['file_tensors'])
        if n is not None:
            return {'model': model_path, 'tensors': n, 'clipped': 0, 'notes': []}
    if not quantized:
        ints = {}
        if base != model_path:
            g0 = read_model(model_path)
            ints = {g0.tensors[k].name: g0.tensors[k].dtype for k in g0.inputs}
        write_trained(base, out_path, g, w, out_identifier(out_path, g.identifier), ints,
                      ours=base != model_path)
        r = {'model': base, 'tensors': len(w), 'clipped': 0}
        r['notes'] = export_notes(r, g, summary, out_path)
        return r
    if data and 'output' in summary:
        raise PrepareError(f'{model_path}: export --quantized --data recalibrates and measures '
                           'models with one input and one output, and this one has several; '
                           'leave --data out (the int8 export keeps the file\'s activation scales)')
    orig = read_model(model_path)
    by_name = {t.name: t for t in orig.tensors}
    w = file_weights(g, w)
    quant = summary.get('quant') or {}
    if not quant:       # (a float model trained in float32: no int8 file to write into)
        raise PrepareError(f'{model_path}: --quantized needs the quantized model prepare '
                           'started from (this one has no dequantized tensors); for an int8 '
                           'model of a float one, prepare it with --int8 and export that run '
                           'with --quantized')
    # (an unrolled loop's weights go back into its body subgraph: prepare's file_tensors)
    where, subs = summary.get('file_tensors') or {}, {0: orig, **(orig.subgraphs or {})}
    if where and data:
        raise PrepareError(f'--data {data}: export --quantized --data recalibrates models '
                           f'without loops, and {model_path} has a WHILE; leave --data out (the '
                           'int8 export keeps the file\'s activation scales)')
    new, clipped = {}, 0
    for k, arr in w.items():
        name = g.tensors[k].name
        si, i = where.get(str(k)) or (0, None)
        t = by_name.get(name) if i is None else (
            subs[si].tensors[i] if si in subs and 0 <= i < len(subs[si].tensors) else None)
        if t is None or t.data is None:
            raise PrepareError(f'{model_path}: has no constant tensor {name!r} to take the '
                               'trained weights; export the float model instead')
        if name in quant:
            q, c = quantize(arr, quant[name][1], quant[name][0])
            clipped += c
            new[(si, t.index)] = q.reshape(t.shape)
        elif t.dtype == 'float32':
            new[(si, t.index)] = arr.reshape(t.shape)
        else:
            raise PrepareError(f'{model_path}: tensor {name!r} is {t.dtype} without scales')
    write_with_weights(model_path, out_path, new, out_identifier(out_path, orig.identifier))
    r = {'model': model_path, 'tensors': len(new), 'clipped': clipped, 'requantized': True}
    if data:                # activation scales recalibrated on data, and measured
        from .exportcheck import calibrated
        try:
            r['measured'] = calibrated(run_dir, wof_path, out_path, data, g, w,
                                       summary.get('input_perm'))
        except BaseException:   # (data refused: no int8 model is left as if written)
            os.remove(out_path)
            raise
        if r['measured'].get('kept') == 'calibrated':
            r['clipped'] = 0        # (weight scales that fit the trained weights)
    r['notes'] = export_notes(r, g, summary, out_path)
    return r


# the files utrain and its data use, none of them a model: export's -o onto one of them
# (another run's weights.wof, a train.log) had written a model over it
NOT_MODELS = {'.wof': 'weights', '.ckpt': 'a checkpoint', '.best': 'a best-weights record',
              '.ds': 'samples', '.flat': 'a prepared model.flat', '.json': 'settings',
              '.log': 'a log', '.csv': 'a table', '.npz': 'data', '.npy': 'data',
              '.py': 'code', '.mpy': 'code', '.png': 'an image', '.tcfg': 'a training config',
              '.txt': 'text', '.md': 'text', '.jpg': 'an image', '.jpeg': 'an image',
              '.pdf': 'a document', '.svg': 'an image', '.h5': 'Keras, which export does not '
              'write', '.keras': 'Keras, which export does not write', '.pt': 'PyTorch, which '
              'export does not write', '.pth': 'PyTorch, which export does not write'}


def _not_a_model(path) -> str:
    """What export's -o path names when that is a kind of file that is not a model (by
    its extension, or for a file there the first bytes of a .wof, .ds or zip), else ''."""
    ext = os.path.splitext(path)[1].lower()
    if ext in NOT_MODELS:
        return f'a {ext} name ({NOT_MODELS[ext]})'
    try:
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError:
        return ''
    from ..files.wof import MAGIC
    if len(head) >= 2 and int.from_bytes(head[:2], 'little') == MAGIC:
        return 'an existing .wof or .ckpt file (weights)'
    if head == b'UTDS':
        return 'an existing .ds file (samples)'
    if head == b'PK\x03\x04':
        return 'an existing zip archive (an .npz of data?)'
    return ''


def _same_file(a, b) -> bool:
    """Are paths a and b one file, or two copies of one?"""
    if os.path.samefile(a, b):
        return True
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, 'rb') as f, open(b, 'rb') as h:
        return f.read() == h.read()


def _span(ops) -> str:
    """Op numbers as short ranges: [0, 1, 2, 5] -> '0-2, 5'."""
    out, i = [], 0
    while i < len(ops):
        j = i
        while j + 1 < len(ops) and ops[j + 1] == ops[j] + 1:
            j += 1
        out.append(str(ops[i]) if i == j else '%d-%d' % (ops[i], ops[j]))
        i = j + 1
    return ', '.join(out)
