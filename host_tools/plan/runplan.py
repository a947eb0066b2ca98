"""What a run trains and its plan, on a copy of the graph as read: the select pass
(--train, --ranks, --train-config: what_trains), the exporter-output rewrites for it
(host_tools/graph/rewrite.py and the pass modules beside it), the backward plan (passes.plan) and the heap plan
(memory.plan_heap, with row bands and the board's Fisher pass).  prepare runs them once
for the run; --select prices each candidate with them (select.Pricer), the int8 path asks
whether the float path would take a model (quant.float_takes)."""
from __future__ import annotations

import copy

from ..graph.passes import parse_train, parse_ranks, plan as make_plan
from ..graph import rewrite as rw
from ..graph.inout import (compact, file_graph, io_name, join_inputs, keep_file_view, natural,
                           needed, prune_outputs, step_softmax)
from ..graph.transposes import hoist_input_transpose
from ..graph.inscale import scale_input
from ..graph.edit import trains_as


def rewrite_for_training(g, train, enabled=True):
    """Run the exporter-output passes (host_tools/graph/rewrite.py) on g in place.  ``train``
    is read on the graph as given (the ops `inspect` lists; ONERT's counting); the ops
    it selects keep their BatchNorm as separate, trainable MUL/ADD.  Returns (train as
    op indices of the rewritten graph, report dict, input permutation or None)."""
    keep = [g.ops[i] for i in sorted(parse_train(train, len(g.ops)))]
    if not enabled:
        info, perm = {'dequantized': 0, 'quant': {}, 'transposes': 0, 'batchnorm': 0,
                      'changed': False, 'input_perm': None, 'input_scale': 0}, None
    else:
        info = rw.rewrite(g, keep)
        perm = hoist_input_transpose(g)
        info['input_perm'] = perm
        info['input_scale'] = scale_input(g, {id(op) for op in keep})   # (g.input_rms: data)
        info['changed'] = info['changed'] or perm is not None or bool(info['input_scale'])
        if info['changed']:
            compact(g)
    if getattr(g, 'step_rows', False):      # (prepare.step_classes: rows of logits a step)
        step_softmax(g)
        info['changed'] = True
    one_input_output(g)
    ids = {id(op) for op in keep}
    return [op.index for op in g.ops if id(trains_as(op)) in ids], info, perm


def one_input_output(g):
    """A graph with several outputs or inputs, as the devices run it (graph/inout.py): only
    the ops the output the loss reads needs (choose_output put it first), its inputs
    joined into one; the file's view kept for the rewritten model export writes
    (inout.file_graph).  Tensors keep their numbers (the .wof's, the file's)."""
    if len(g.inputs) > 1 or len(g.outputs) > 1:
        every = natural(g, g.inputs)
        keep_file_view(g)
        prune_outputs(g)
        g.inputs = natural(g, g.inputs)
        if len(every) > 1:      # what a data file gives (dataset.load_inputs)
            # (x0, x1, ..: an input's place among the model's inputs, not among those the
            # trained output reads: an output that reads the second alone took x0)
            at = {k: i for i, k in enumerate(every)}
            keys = [io_name(g, k) for k in g.inputs]
            keys = [c if keys.count(c) == 1 else f'x{at[k]}' for k, c in zip(g.inputs, keys)]
            g.data_inputs = ([(g.tensors[k].name, list(g.tensors[k].shape), c)
                              for k, c in zip(g.inputs, keys)],
                             [io_name(g, k) for k in every if k not in g.inputs],
                             [at[k] for k in g.inputs],
                             [at[k] for k in every if k not in g.inputs])
        join_inputs(g)


def io_summary(g) -> dict:
    """prepare.json's 'output' (the one the loss reads, its place among the file's: export
    reads it) and 'inputs' of graph g with several (one_input_output's)."""
    f = file_graph(g)
    out = {'output': {'name': io_name(g, g.outputs[0]), 'tensor': g.tensors[g.outputs[0]].name,
                      'index': natural(f, f.outputs).index(g.outputs[0]),
                      'of': len(f.outputs)}}
    if getattr(g, 'data_inputs', None):
        out['inputs'] = [{'name': n, 'key': key, 'shape': sh} for n, sh, key in g.data_inputs[0]]
        out['inputs_unread'] = g.data_inputs[1]
    return out


def data_inputs(g):
    """What a data file gives for graph g as read (choose_output's output first):
    ([(name, shape, key)] of the inputs that output reads, [keys of the others], their
    places and the others' among the model's inputs), or None for a model with one input
    (dataset.load_inputs)."""
    if len(g.inputs) < 2:
        return None
    h = copy.deepcopy(g)
    one_input_output(h)
    return h.data_inputs


def what_trains(g, train, ranks=None, train_config=None, train_given=False):
    """The ranks pass: --train, --ranks ('OP:RANK,...' or {op: rank}) and --train-config
    on graph g as read -> (sorted op numbers that train, {op: rank}), in the file's
    numbering.  A training-config file's ops train with its ranks and, unless --train is
    given too (train_given), only they do."""
    from ..files.trainconfig import read_train_config
    rk = {}
    if train_config:
        rk.update(read_train_config(train_config, len(g.ops)))
        if not train_given:
            train = 'none'
    if isinstance(ranks, dict):
        rk.update(ranks)
    elif ranks:
        rk.update(parse_ranks(ranks, len(g.ops)))
    return sorted(parse_train(train, len(g.ops)) | set(rk)), rk


def off_output(g, ops) -> list:
    """Of op numbers ops (as read), those only outputs other than g.outputs[0] (the one the
    loss reads: inout.choose_output) need: one_input_output leaves them out of the run."""
    if len(g.outputs) < 2:
        return []
    keep = {id(op) for op in needed(g)[0]}
    return [i for i in sorted(ops) if id(g.ops[i]) not in keep]


def select_rewrite(source, train, ranks=None, rewrite=True):
    """The select and rewrite passes on a copy of the graph as read (source is not
    changed): train ('all', 'none', 'last:N' or op numbers) and ranks {op: rank} in the
    file's numbering.  Returns (rewritten graph, its trainable op indices, its ranks
    {op index: rank}, rewrite report, input permutation)."""
    g = copy.deepcopy(source)
    ranks = ranks or {}
    # ops with a rank train too: the rewrite keeps them (and their BatchNorm) as they are
    ranked = {id(g.ops[i]): r for i, r in ranks.items()}
    train = sorted(parse_train(train, len(g.ops)) | set(ranks))
    train, info, perm = rewrite_for_training(g, train, rewrite)
    rk = {op.index: ranked[id(trains_as(op))] for op in g.ops if id(trains_as(op)) in ranked}
    return g, train, rk, info, perm


def select_rewrite_plan(source, train, ranks, rewrite=True):
    """select_rewrite, then the plan pass (passes.plan): returns (rewritten graph, its
    trainable op indices, its ranks, rewrite report, input permutation, plan)."""
    g, train, rk, info, perm = select_rewrite(source, train, ranks, rewrite)
    return g, train, rk, info, perm, make_plan(g, train, rk)


def plan_memory(g, p, s, backend='fallback', board=None, cache=False, fisher=False,
                bands=None, limit=None) -> dict:
    """The heap-plan pass (memory.plan_heap) for the rewritten graph g and its plan p with
    settings s: cache 'host' plans the board from the first op that trains; fisher adds
    the board's selection pass (--select board).  bands: the row-band pass
    (host_tools/graph/bands.py) sets p.bands: rows per band (None: 1 where that lowers the
    plan, and where a limit is known (limit(heap): the board's heap or the budget, or
    None) only when the plan without them exceeds it: a band costs time, 1.5x on the
    fallback and 6x under ulab for the DS-CNN's frozen convs; 0: none; not with cache
    'host', where the board does not run the prefix)."""
    from .memory import plan_heap
    s = dict(s, cache=cache)
    if cache == 'host':         # the board runs from the first op that trains
        # (and no row bands: those a plan without the cache chose, which prepare's fit
        # pass copies to plan each memory option, are not the board's; they had planned
        # a held-out ResNet's --cache-on-host 5.6 KB over the same plan made afresh,
        # so the fit pass refused a --select choice that fits with it)
        p.bands = []
        from ..graph.optable import SPECS
        s['prefix'] = min(op.index for op in g.ops
                          if any(k in p.params for k in SPECS[op.name].inputs(op)))
    heap = plan_heap(g, p, s, backend, board)
    lim = limit(heap) if limit and not bands else None
    if bands != 0 and cache != 'host' and (lim is None or heap['total'] > lim):
        from ..graph.bands import choose
        from .memory import array_bytes, target
        tg = target(board)
        p.bands = choose(g, p, lambda n: array_bytes(n, backend.partition('-')[0], tg), bands or 1)
        if p.bands:
            banded = plan_heap(g, p, s, backend, board)
            if bands or banded['total'] < heap['total']:
                heap = banded
            else:
                p.bands = []
    if fisher:
        from .memory import add_fisher
        add_fisher(heap, g, p, backend, board)
    return heap
