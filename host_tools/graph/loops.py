"""Loops: a WHILE whose trip count the host knows (a Keras LSTM, GRU, SimpleRNN or
Bidirectional layer not unroll=True) unrolled, its body inlined once a step with
counters and buffer slices folded, the body's weights one tensor each; a REVERSE_V2 as
slices.  Both run before dequantize."""
from __future__ import annotations

import re

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator, Tensor
from .edit import (const_ints, is_const, make_reshape, new_tensor, producer, renumber, replace_op,
                   reversal_ops, slice_op)
from .shapes import host_value, integer_type


def reverse_to_concat(g: Graph) -> int:
    """REVERSE_V2 of an activation along one axis (Keras's Bidirectional: the backward
    layer reads the sequence reversed) -> a STRIDED_SLICE of each index along it and a
    CONCATENATION of them in reverse order: the same values through ops that train (an
    unrolled backward layer's steps read the slices themselves: unroll_loops, and
    slices_to_split makes them one SPLIT_V).  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name != 'REVERSE_V2' or len(op.inputs) != 2 or is_const(g, op.inputs[0]) or \
                not is_const(g, op.inputs[1]) or len(const_ints(g, op.inputs[1])) != 1:
            continue
        x, y = op.inputs[0], op.outputs[0]
        a = const_ints(g, op.inputs[1])[0] % len(g.tensors[x].shape)
        replace_op(g, op, reversal_ops(g, x, y, a, g.tensors[y].name + '/', op.src))
        done += 1
    return done


# ops that only move values: computed on the host over constants, whatever their dtype
_MOVES = {'RESHAPE', 'SQUEEZE', 'EXPAND_DIMS', 'CONCATENATION', 'GATHER', 'STRIDED_SLICE',
          'SLICE', 'PACK'}


_CONTROL = ('WHILE', 'IF', 'CALL', 'CALL_ONCE')


# most steps unroll_loops makes of one WHILE (a loop that does not stop on the host)
MAX_STEPS = 4096


# what a loop that cannot unroll is told to do
UNROLL_HINT = ('give the recurrent layer unroll=True (Keras; a fixed sequence length) and '
               'convert again, or export the model to ONNX')


def _loop_value(g: Graph, op: Operator):
    """The host's value of op's output over constant inputs (integer and boolean
    arithmetic, comparisons, shape ops, and data moves of any dtype), else None."""
    if not op.inputs or not all(is_const(g, k) for k in op.inputs if k >= 0):
        return None
    out = g.tensors[op.outputs[0]] if len(op.outputs) == 1 else None
    if out is None or not (integer_type(out.dtype) or out.dtype == 'bool' or op.name in _MOVES):
        return None
    try:
        return host_value(g, op)
    except (ValueError, IndexError, TypeError):
        return None


def _zeros(g: Graph, k: int) -> bool:
    """Tensor k is float zeros (a recurrent layer's initial state), a constant or the
    DEQUANTIZE of one (a float16 file's, dequantized after the loops unroll)."""
    if k >= 0 and not is_const(g, k):
        p = producer(g, k)
        if p is None or p.name != 'DEQUANTIZE' or g.tensors[p.inputs[0]].quant:
            return False
        k = p.inputs[0]
    return is_const(g, k) and g.tensors[k].dtype in ('float32', 'float16') and \
        not np.any(g.tensors[k].data)


def unroll_loops(g: Graph, int8=False) -> int:
    """A WHILE whose trip count the host knows (TFLiteConverter's Keras LSTM, GRU,
    SimpleRNN and Bidirectional layers that are not unroll=True: the cond compares two
    counters with the sequence length) -> its body inlined into the graph once a step,
    the loop-carried tensors wired through: the plain unrolled RNN Keras's unroll=True
    writes.  Each step's integer arithmetic (counters, the shapes of the output buffer's
    slices) folds to constants, so the step's GATHER of the sequence becomes a slice, and
    the output buffer's SLICEs of a CONCATENATION are its parts (empty ones dropped); a
    zero initial state folds away as Keras's unrolled layer has it.  The body's
    constants (the cell's weights) are one tensor each, read by every step (one
    parameter, trained by all of them); each constant's Tensor.origin is its (subgraph,
    tensor) in the file (export writes the trained values back there).  Refuses a loop
    whose condition needs a value computed at run time, and for int8 training (int8) a
    quantized body (the int8 path writes trained weights into subgraph 0 only).  Returns
    how many WHILEs."""
    done = 0
    for op in list(g.ops):
        if op.name != 'WHILE':
            continue
        subs = g.subgraphs or {}
        cond = subs.get(op.options.get('cond_subgraph_index'))
        body = subs.get(op.options.get('body_subgraph_index'))
        if cond is None or body is None or not (
                len(cond.inputs) == len(body.inputs) == len(body.outputs) == len(op.inputs)
                == len(op.outputs)) or len(cond.outputs) != 1:
            raise ValueError(f'{g.path}: op {op.number} WHILE: its cond and body subgraphs do '
                             'not take and give its loop values; the file is damaged')
        for t in g.tensors:         # (where export finds each weight in the file: the
            if t.data is not None and t.origin is None and t.buffer > 0:    # file's own)
                t.origin = (0, t.index)
        q = next((t for t in body.tensors if t.data is None and t.quant and
                  t.dtype in ('int8', 'uint8', 'int16')), None)
        flex = next((o for o in list(g.ops) + list(body.ops) if o.name == 'CUSTOM' and
                     (o.options.get('custom_code') or '').startswith('Flex')), None)
        if int8 and q is not None and flex is None:     # (a Flex op: validation refuses it,
            raise ValueError(f'{g.path}: op {op.number} WHILE: its body is quantized ({q.name} is '
                             f'{q.dtype}), and utrain trains an unrolled loop in float: prepare '
                             '--dequantize trains it so (export writes the float model), or '
                             + UNROLL_HINT)
        made, shared, cur = [], {}, list(op.inputs)
        for step in range(MAX_STEPS + 1):
            if not _goes_on(g, op, cond, cur, step):
                break
            if step == MAX_STEPS:
                raise ValueError(f'{g.path}: op {op.number} WHILE runs more than {MAX_STEPS} '
                                 'steps; ' + UNROLL_HINT)
            cur = _step(g, op, body, cur, step, shared, made)
        out = dict(zip(op.outputs, cur))
        for o in made:              # (--train and --ranks name the WHILE: its steps train)
            o.trains_with = op
        replace_op(g, op, made)
        for o in g.ops:
            o.inputs = [out.get(k, k) for k in o.inputs]
        g.outputs = [out.get(k, k) for k in g.outputs]
        _drop_dead(g, made, op.inputs)
        # a loop value whose shape the file gave as one step's (Keras's LSTM with
        # return_sequences: the TensorArray of every step, [1, 1, 32] in the file for
        # [50, 1, 32]): the ops after it take their shapes from it again
        grown = {k for w, k in out.items() if list(g.tensors[w].shape) != list(g.tensors[k].shape)}
        if grown:
            from .shapes import _propagate_shapes
            _propagate_shapes(g, grown)
        done += 1
    if done:
        _in_order(g)
    if done and not any(op.name in _CONTROL for op in g.ops):
        g.n_subgraphs = 1           # (validate: nothing runs another subgraph now)
    return done


def step_name(name: str, t: int) -> str:
    """The name of body tensor `name`'s copy in unrolled step t."""
    return f'{name}/t{t}'


def body_name(name: str):
    """The body tensor's name of an unrolled step's tensor (step_name's), else None."""
    m = re.fullmatch(r'(.+)/t\d+', name)
    return m.group(1) if m else None


def union_find():
    """(find, join) over hashable keys: the classes that share one scale (a body
    tensor's steps, a loop value's sides)."""
    up = {}

    def find(a):
        while up.get(a, a) != a:
            a = up[a]
        return a

    def join(a, b):
        a, b = find(a), find(b)
        if a != b:
            up[a] = b
    return find, join


def _in_order(g: Graph) -> None:
    """g.ops reordered so that each op comes after the ops that make its inputs, the
    file's order kept where it holds: a step's slice of the sequence that a later
    REVERSE_V2 of the file had taken (_take reuses it: a Bidirectional layer whose
    forward loop comes first) had been read before it was made."""
    import heapq
    made = {k: i for i, op in enumerate(g.ops) for k in op.outputs}
    need = [{made[k] for k in op.inputs if k in made and made[k] != i}
            for i, op in enumerate(g.ops)]
    if all(max(n, default=-1) < i for i, n in enumerate(need)):
        return
    users = [[] for _ in g.ops]
    for i, n in enumerate(need):
        for j in n:
            users[j].append(i)
    left = [len(n) for n in need]
    ready = [i for i, n in enumerate(left) if not n]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            left[u] -= 1
            if not left[u]:
                heapq.heappush(ready, u)
    if len(order) == len(g.ops):        # (a cycle stays as it was: validate says so)
        g.ops = [g.ops[i] for i in order]
        renumber(g)


def _goes_on(g: Graph, op: Operator, cond: Graph, cur, step) -> bool:
    """The WHILE's condition on the loop values cur, computed on the host."""
    val = {k: g.tensors[c].data for k, c in zip(cond.inputs, cur) if is_const(g, c)}
    for c in cond.ops:
        h = Graph(g.path, g.identifier, 0, '', [], [], [], [], {}, 1)
        for k in c.inputs + c.outputs:
            if k >= 0:
                t = cond.tensors[k]
                data = val.get(k, t.data)
                h.tensors.append(Tensor(len(h.tensors), t.name, t.shape, t.dtype, data, -1))
        ix = {k: i for i, k in enumerate(c.inputs + c.outputs) if k >= 0}
        hop = Operator(0, c.code, c.name, [ix[k] if k >= 0 else -1 for k in c.inputs],
                       [ix[k] for k in c.outputs], c.options)
        v = _loop_value(h, hop) if len(c.outputs) == 1 else None
        if v is None:
            late = [cond.tensors[k].name for k in c.inputs if k >= 0 and val.get(
                k, cond.tensors[k].data) is None]
            raise ValueError(
                f'{g.path}: op {op.number} WHILE: its trip count is not known before it runs '
                f'(its condition\'s {c.name} reads {", ".join(late) or "values"} computed at '
                f'run time{", at step " + str(step) if step else ""}), so utrain cannot unroll it; '
                + UNROLL_HINT)
        val[c.outputs[0]] = np.asarray(v)
    return bool(np.all(val[cond.outputs[0]]))


def _step(g: Graph, op: Operator, body: Graph, cur, t, shared, made):
    """One step of WHILE op's body appended to made (ops over g's tensors, simplified as
    they come: _simplified), reading the loop values cur; returns the next ones."""
    m = dict(zip(body.inputs, cur))

    def get(k):
        if k < 0 or k in m:
            return m.get(k, -1)
        bt = body.tensors[k]
        if bt.data is None:
            raise ValueError(f'{g.path}: op {op.number} WHILE: its body reads tensor {k} '
                             f'({bt.name}) before any op writes it; the file is damaged')
        if k not in shared:         # (one tensor for every step: a weight trains as one)
            shared[k] = new_tensor(g, bt.name, bt.shape, bt.data.copy())
            g.tensors[shared[k]].quant = dict(bt.quant) if bt.quant else None
            g.tensors[shared[k]].origin = (op.options['body_subgraph_index'], k)
        return shared[k]

    for b in body.ops:
        if b.name in _CONTROL:
            raise ValueError(f'{g.path}: op {op.number} WHILE: its body holds a {b.name} '
                             '(nested control flow), which utrain does not unroll; ' + UNROLL_HINT)
        if b.outputs and all(k in shared for k in b.outputs):
            m.update((k, shared[k]) for k in b.outputs)     # (computed at the first step)
            continue
        # an op of the body's constants alone (float16 weights' DEQUANTIZE) computes the
        # same at every step: once, its result read by all (one parameter still)
        same = all(k < 0 or k not in body.inputs and (k in shared or body.tensors[k].data
                                                        is not None) for k in b.inputs)
        ins = [get(k) for k in b.inputs]
        outs = []
        for k in b.outputs:
            bt = body.tensors[k]
            outs.append(new_tensor(g, step_name(bt.name, t), bt.shape, dtype=bt.dtype))
            g.tensors[outs[-1]].quant = dict(bt.quant) if bt.quant else None
        new = Operator(-1, b.code, b.name, ins, outs, dict(b.options), src=op.src)
        for k, v in zip(b.outputs, _simplified(g, new, made)):
            m[k] = v
            if same:
                shared[k] = v
    return [get(k) for k in body.outputs]


def _producer_in(g: Graph, made, k):
    return next((o for o in reversed(made) if k in o.outputs), None) or producer(g, k)


def _simplified(g: Graph, op: Operator, made) -> list:
    """op (its outputs fresh tensors) as the step needs it: its value where the host
    knows it (a constant), an input it passes on unchanged, the parts of a buffer it
    slices, or op itself (appended to made).  Returns its outputs' tensors."""
    y = op.outputs[0]
    v = _loop_value(g, op) if len(op.outputs) == 1 else None
    if v is not None:
        t, v = g.tensors[y], np.asarray(v)
        if op.name not in ('SLICE', 'CONCATENATION'):     # (their shapes vary by step)
            v = v.reshape(t.shape) if v.size == int(np.prod(t.shape)) else None
    if v is not None:
        t.data = np.array(v, dtype=t.dtype)        # (a 0-d counter stays 0-d)
        t.shape = list(t.data.shape)
        return [y]
    x = op.inputs[0] if op.inputs else -1
    if op.name == 'MUL' and any(_zeros(g, k) for k in op.inputs) or \
            op.name == 'FULLY_CONNECTED' and _zeros(g, x) and (
                len(op.inputs) < 3 or op.inputs[2] < 0):
        # (a zero initial state: its terms are zero; the weights read no gradient there)
        g.tensors[y].data = np.zeros(g.tensors[y].shape, np.float32)
        return [y]
    if op.name in ('ADD', 'SUB') and op.options.get('fused_activation_function',
                                                    'NONE') == 'NONE':
        for a, b in ((0, 1), (1, 0)) if op.name == 'ADD' else ((0, 1),):
            if _zeros(g, op.inputs[b]) and g.tensors[op.inputs[a]].shape == g.tensors[y].shape:
                return [op.inputs[a]]
    if op.name == 'SLICE' and all(is_const(g, k) for k in op.inputs[1:3]):
        X = list(g.tensors[x].shape)
        b, n = const_ints(g, op.inputs[1]), const_ints(g, op.inputs[2])
        k = x
        for d in range(len(X)):
            e = X[d] if n[d] < 0 else b[d] + n[d]
            if (b[d], e) != (0, X[d]):
                k = _take(g, k, d, b[d], e, made, g.tensors[y].name)
        return [k]
    if op.name == 'GATHER' and is_const(g, op.inputs[1]) and not is_const(g, x) and \
            g.tensors[op.inputs[1]].data.ndim == 0 and not op.options.get('batch_dims'):
        X = list(g.tensors[x].shape)
        a = int(op.options.get('axis', 0)) % len(X)
        i = int(g.tensors[op.inputs[1]].data) % X[a]
        k = _take(g, x, a, i, i + 1, made, g.tensors[y].name)
        shape = X[:a] + X[a + 1:]
        g.tensors[y].shape = shape
        rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [k], [y], {}, src=op.src)
        make_reshape(g, rs, shape)
        made.append(rs)
        return [y]
    if op.name == 'CONCATENATION':
        a = int(op.options.get('axis', 0))
        a %= max(len(g.tensors[x].shape), 1)
        parts = []
        for k in op.inputs:
            p = _producer_in(g, made, k)
            if p is not None and p.name == 'CONCATENATION' and p.options.get('axis', 0) % \
                    len(g.tensors[k].shape) == a and p.options.get(
                        'fused_activation_function', 'NONE') == 'NONE':
                parts += p.inputs
            else:
                parts.append(k)
        parts = [k for k in parts if int(np.prod(g.tensors[k].shape))] or parts[:1]
        shape = list(g.tensors[parts[0]].shape)
        shape[a] = sum(g.tensors[k].shape[a] for k in parts)
        if len(parts) == 1 and op.options.get('fused_activation_function', 'NONE') == 'NONE':
            return parts
        g.tensors[y].shape = shape
        op.inputs = parts
    made.append(op)
    return op.outputs


def _take(g: Graph, x: int, a: int, b: int, e: int, made, name) -> int:
    """A tensor of x[b:e] along axis a (all of the other axes): x itself, a constant,
    the parts of the CONCATENATION that made x (those it spans, themselves taken), or a
    STRIDED_SLICE appended to made."""
    X = list(g.tensors[x].shape)
    b, e = max(b, 0), min(e, X[a])
    if (b, e) == (0, X[a]):
        return x
    shape = X[:a] + [max(e - b, 0)] + X[a + 1:]
    if is_const(g, x) or e <= b:
        data = np.asarray(g.tensors[x].data).reshape(X)[(slice(None),) * a + (slice(b, e),)] \
            if is_const(g, x) else np.zeros(shape, np.float32)
        return new_tensor(g, f'{name}/part', shape, data.astype(g.tensors[x].dtype))
    p = _producer_in(g, made, x)
    if p is not None and p.name == 'CONCATENATION' and p.options.get('axis', 0) % len(X) == a \
            and p.options.get('fused_activation_function', 'NONE') == 'NONE':
        got, at = [], 0
        for k in p.inputs:
            n = g.tensors[k].shape[a]
            if at < e and at + n > b:
                got.append(_take(g, k, a, b - at, e - at, made, name))
            at += n
        if len(got) == 1:
            return got[0]
        y = new_tensor(g, f'{name}/parts', shape, like=x)
        made.append(Operator(-1, OP_CODES['CONCATENATION'], 'CONCATENATION', got, [y],
                             {'axis': a, 'fused_activation_function': 'NONE'}, src=p.src))
        return y
    begin, end = [0] * len(X), list(X)
    begin[a], end[a] = b, e
    for o in g.ops + made:          # (the same slice taken before: Bidirectional's two loops)
        if o.name == 'STRIDED_SLICE' and o.inputs[0] == x and not any(o.options.values()) and \
                [const_ints(g, k) for k in o.inputs[1:4]] == [begin, end, [1] * len(X)]:
            return o.outputs[0]
    y = new_tensor(g, f'{name}/slice', shape, like=x)
    made.append(slice_op(g, x, y, f'{name}/slice', begin, end, [1] * len(X), None))
    return y


def _drop_dead(g: Graph, made, fed):
    """The ops of made nothing reads (the loop's counters, the buffers of steps before
    the last) taken out of g, and the ops that fed the loop (fed: tensors the WHILE read)
    that nothing reads now (reverse_to_concat's CONCATENATION, whose slices the steps
    read instead), and so on up."""
    made, fed = {id(o) for o in made}, set(fed)
    while True:
        read = set(g.outputs)
        for o in g.ops:
            read.update(o.inputs)
        dead = [o for o in g.ops if not read & set(o.outputs) and (
            id(o) in made or fed & set(o.outputs))]
        if not dead:
            break
        for o in dead:
            g.ops.remove(o)
            fed.update(o.inputs)
    renumber(g)
