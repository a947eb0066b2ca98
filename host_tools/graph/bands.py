"""Row bands: which frozen chains the board computes a few rows at a time (issue 15).

The device side is micro/utrain/bands.py (a Group runs ops lo..hi-1 band by band, its
inner tensors as windows of rows).  This pass picks the groups: within the frozen prefix
(the ops below the first one with a trainable input; none trains, none keeps an
activation for the backward pass), a run of CONV_2D, DEPTHWISE_CONV_2D, PAD (rows and
columns only) and same-shape ADD ops is split into groups at the points where its
activations meet the rest of the graph, so that the largest of (a group's windows, the
tensors it hands on, its kernels' strip temporaries) and (a plain op's working set) is
the least; ties go to fewer groups (each band calls every op of its group once).
group_cost() is what the heap planner (host_tools/plan/memory.py) charges for a group: the
window sizes come from the device's own schedule (Group.plan) run on a stand-in of the
prepared model.
"""
from __future__ import annotations

import types

from ..target.device import module
from .optable import SPECS

BANDABLE = ('CONV_2D', 'DEPTHWISE_CONV_2D', 'PAD', 'ADD')


def stand_in(g, plan):
    """The few tables of a loaded Net that utrain.bands.Group reads, from the graph."""
    from .passes import device_shapes
    ops = [(SPECS[op.name].code, tuple(SPECS[op.name].inputs(op)), tuple(op.outputs),
            list(SPECS[op.name].options(op, g))) for op in g.ops]
    free = [[] for _ in g.ops]
    for k, i in plan.last_use.items():
        if g.tensors[k].data is None and k not in g.outputs and k not in g.inputs:
            free[i].append(k)
    return types.SimpleNamespace(ops=ops, shape=device_shapes(g), free_infer=free,
                                 t=[None] * len(g.tensors), stream=None, inputs=tuple(g.inputs))


def _bandable(g, plan, op):
    if op.name not in BANDABLE or op.index in plan.trainable_ops:
        return False
    if any(k in plan.saved for k in op.inputs + op.outputs if k >= 0):
        return False
    if any(i == op.index for i, _ in plan.backward):
        return False
    acts = [k for k in op.inputs if k >= 0 and g.tensors[k].data is None]
    shp = [g.tensors[k].shape for k in acts + list(op.outputs)]
    if any(len(s) != 4 or s[0] != 1 for s in shp):
        return False
    if op.name == 'ADD':
        return len(acts) == 2 and shp[0] == shp[1] == shp[2]
    if op.name == 'PAD':
        p = g.tensors[op.inputs[1]].data
        if p is None:
            return False
        p = [int(v) for v in p.reshape(-1)]
        return len(p) == 8 and p[0] == p[1] == p[6] == p[7] == 0 and min(p) >= 0
    return len(acts) == 1 and acts[0] == op.inputs[0]


def prefix_end(g, plan) -> int:
    """k: the first op with a trainable input (the frozen prefix is ops 0..k-1)."""
    for op in g.ops:
        if any(k in plan.params for k in op.inputs):
            return op.index
    return len(g.ops)


def group_cost(net, lo, hi, rows, A):
    """(bytes, kernel calls) of band group lo..hi-1: its windows and whole outputs held
    at once plus the largest strip temporaries of one op (A: bytes of an n-float
    array); None when the ops do not form a group."""
    G = module('bands').Group
    if not _NAMES:
        _NAMES.update((s.code, n) for n, s in SPECS.items())
    try:
        grp = G(net, lo, hi, rows)
    except (ValueError, KeyError):
        return None
    cap = grp.plan()
    sh = net.shape
    held = sum(A(cap[k] * grp.dims[k][1] * sh[k][1]) for k in grp.win)
    held += sum(A(sh[k][0] * sh[k][1]) for k in grp.outs)
    # the model's input read a strip at a time (utrain.bands.Rows) when only it reads it
    held += sum(A(grp.span[k] * grp.dims[k][1] * sh[k][1]) for k in grp.span if k in net.inputs)
    temp = 0
    for i, n in grp.step.items():
        code, ins, outs, o = net.ops[i]
        spec = SPECS[_NAMES[code]]
        fo, fi = spec.fwd
        k = outs[0]
        s, pt, reach = grp.rule[i]
        x = grp.acts[i][0]
        n_in = min(grp.dims[x][0], (n - 1) * s + reach)
        # the kernel's output strip and its temporaries, as the planner charges a whole op
        temp = max(temp, (1 + fo) * A(n * grp.dims[k][1] * sh[k][1])
                   + fi * A(n_in * grp.dims[x][1] * sh[x][1]))
    calls = (hi - lo) * -(-max(grp.dims[k][0] for k in grp.outs) // rows)
    return held + temp, calls


_NAMES = {}


def choose(g, plan, A, rows=1, op_cost=None):
    """[(lo, hi, rows)]: the band groups for g's frozen prefix (see the module doc).
    op_cost(i): the planner's working set of plain op i (None: output + input sizes)."""
    k = prefix_end(g, plan)
    net = stand_in(g, plan)
    sh = net.shape
    size = lambda t: A(sh[t][0] * sh[t][1])      # noqa: E731
    made = {t: -1 for t in g.inputs}
    for op in g.ops:
        made.update((t, op.index) for t in op.outputs)

    def carried(i):
        # activations made before op i that op i or a later op reads (the planner's
        # live set there; the sample's buffer is charged apart)
        return sum(size(t) for t, at in made.items()
                   if 0 <= at < i and plan.last_use.get(t, -1) >= i)

    if op_cost is None:
        def op_cost(i):     # as the planner charges a plain op
            op = g.ops[i]
            fo, fi = SPECS[op.name].fwd
            ins = [t for t in op.inputs if t >= 0 and g.tensors[t].data is None]
            return (carried(i) + (1 + fo) * size(op.outputs[0])
                    + fi * max([size(t) for t in ins] or [0]))
    groups = []
    i = 0
    while i < k:
        if not _bandable(g, plan, g.ops[i]):
            i += 1
            continue
        j = i
        while j < k and _bandable(g, plan, g.ops[j]):
            j += 1
        groups += _split(g, net, i, j, rows, A, op_cost, carried)
        i = j
    return groups


def _split(g, net, a, b, rows, A, op_cost, carried):
    # best partition of ops a..b-1 into groups and plain ops: least (max cost, calls)
    best = {a: (0, 0, [])}
    for j in range(a + 1, b + 1):
        c = best[j - 1]
        cand = (max(c[0], op_cost(j - 1)), c[1] + 1, c[2])
        for i in range(a, j - 1):
            if i not in best:
                continue
            gc = group_cost(net, i, j, rows, A)
            if gc is None:
                continue
            p = best[i]
            v = (max(p[0], carried(i) + gc[0]), p[1] + gc[1], p[2] + [(i, j, rows)])
            if (v[0], v[1]) < (cand[0], cand[1]):
                cand = v
        best[j] = cand
    return best[b][2]
