"""Embedding lookups: a GATHER of a table by integer ids made one op (ids wrapped
for negatives unwrapped), back for export, and id masks."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator
from .edit import (NO_ACTIVATION, bypass, const_ints, consumers, is_const, new_tensor, producer,
                   remove_op, replace_op, spell)


def _only_reader(g: Graph, k: int, op: Operator) -> bool:
    return k not in g.outputs and consumers(g, k) == [op]


def _wrapped_index(g: Graph, k: int, n: int):
    """c where tensor k is SELECT_V2(LESS(c, 0), ADD(c, n), c): Keras 3's Embedding
    reading a negative id from the table's end (its n rows), else None.  SELECT (v1)
    alike: the converter writes it where the batch is fixed (keras.Input(batch_size=1),
    as a recurrent layer after the Embedding wants), and it had been refused ('tensor 0
    is int32')."""
    sel = producer(g, k)
    if sel is None or sel.name not in ('SELECT', 'SELECT_V2') or len(sel.inputs) != 3:
        return None
    m, a, c = sel.inputs
    less, add = producer(g, m), producer(g, a)
    if less is None or add is None or less.name != 'LESS' or add.name != 'ADD' \
            or less.inputs[0] != c or const_ints(g, less.inputs[1]) != [0] \
            or add.inputs[0] != c or const_ints(g, add.inputs[1]) != [n] \
            or not _only_reader(g, m, sel) or not _only_reader(g, a, sel):
        return None
    return c


def _tables(g: Graph):
    """The GATHERs of a constant 2-D table's rows (axis 0): embeddings."""
    return [op for op in g.ops if op.name == 'GATHER' and not int(op.options.get('axis', 0))
            and not op.options.get('batch_dims') and is_const(g, op.inputs[0])
            and len(g.tensors[op.inputs[0]].shape) == 2]


def unwrap_ids(g: Graph, keep=True) -> int:
    """Keras 3's Embedding reads a negative id from the table's end: SELECT_V2(LESS(i, 0),
    ADD(i, N), i) before its GATHER.  The GATHER reads i itself, and (keep) the ADD's
    constant N as a third input, which says so (circle's GATHER has no such option;
    optable reads it); without keep a negative id is out of range, as TFLite's GATHER
    alone has it (evaluate's runtimes have no int32 SELECT_V2).  Returns how many."""
    done = 0
    for op in _tables(g):
        sel = producer(g, op.inputs[1])
        c = _wrapped_index(g, op.inputs[1], g.tensors[op.inputs[0]].shape[0])
        if c is None or not _only_reader(g, op.inputs[1], op):
            continue
        less, add = producer(g, sel.inputs[0]), producer(g, sel.inputs[1])
        op.inputs[1:] = [c] + [add.inputs[1]] * keep
        for o in (sel, less, add):
            remove_op(g, o)
        done += 1
    return done


def embedding_gathers(g: Graph) -> int:
    """A GATHER of a constant float table's rows (axis 0) by ids from the model's input
    (an embedding) reads the input itself: Keras 3's negative-id SELECT_V2 goes
    (unwrap_ids), then Keras's CAST of the float input to int32; an int32 or int64 model
    input read only as ids becomes float32 here (the data are floats holding the ids:
    the device checks they are integers).  No tensor is made, so the file's numbering
    holds and the pass alone leaves no rewritten graph to export: the trained table goes
    into the file as it is (rewrite() does not count it as a change).  Returns how many."""
    done = unwrap_ids(g)
    for op in _tables(g):
        k = op.inputs[1]
        cast = producer(g, k)
        if cast is not None and cast.name == 'CAST' and _only_reader(g, k, op) \
                and g.tensors[cast.inputs[0]].dtype == 'float32':
            op.inputs[1] = cast.inputs[0]
            remove_op(g, cast)
            done += 1
        k = op.inputs[1]
        if k in g.inputs and g.tensors[k].dtype in ('int32', 'int64') and all(
                r.name == 'GATHER' and r.inputs.index(k) == 1 or _masks_ids(g, r, k)
                for r in consumers(g, k)):
            g.tensors[k].dtype = 'float32'
            done += 1
    return done


def _masks_ids(g: Graph, r: Operator, k: int) -> bool:
    """r compares the ids k with a constant (Keras's mask_zero: NOT_EQUAL(ids, 0))."""
    return r.name in _MASKS and len(r.inputs) == 2 and k in r.inputs and \
        all(u == k or is_const(g, u) for u in r.inputs)


def embedding_ids_back(g: Graph, int_inputs=None) -> int:
    """For export of a rewritten graph: each GATHER that embedding_gathers made read float
    ids reads int32 ones again, as the file had them: the model input's own type where
    int_inputs {input name: dtype} says it was an integer, else a CAST of the float
    input; a third input N (Keras 3's negative ids) becomes SELECT_V2(LESS(i, 0),
    ADD(i, N), i) again; the comparisons id_masks made float are bool again
    (masks_back).  Returns how many."""
    done = 0
    for op in _tables(g):
        k = op.inputs[1]
        if g.tensors[k].dtype != 'float32':
            continue
        name, shape, made = g.tensors[k].name, g.tensors[k].shape, []

        def step(op_name, ins, dtype='int32', **opts):
            out = new_tensor(g, f'{name}/{op_name.lower()}', shape, dtype=dtype)
            made.append(Operator(-1, OP_CODES[op_name], op_name, ins, [out], opts, src=op.src))
            return out
        if k in g.inputs and (int_inputs or {}).get(name) in ('int32', 'int64'):
            g.tensors[k].dtype = int_inputs[name]
            i = k
        else:
            i = step('CAST', [k])
        if len(op.inputs) > 2:
            zero = new_tensor(g, f'{name}/zero', [], np.array(0, np.int32))
            i = step('SELECT_V2', [step('LESS', [i, zero], 'bool'),
                                   step('ADD', [i, op.inputs[2]], fused_activation_function='NONE'),
                                   i])
        op.inputs = op.inputs[:1] + [i]
        replace_op(g, op, made + [op])
        done += 1
    return done + masks_back(g)


_MASKS = ('LESS', 'GREATER', 'GREATER_EQUAL', 'LESS_EQUAL', 'EQUAL', 'NOT_EQUAL')


def id_masks(g: Graph) -> int:
    """A comparison's bool mask as the device holds it, a 1.0 / 0.0 float (utrain.op_elem):
    Keras's Embedding(mask_zero=True) NOT_EQUAL(ids, 0), tf.cast(x > c, tf.float32).
    Where every reader of the mask (through EXPAND_DIMS / RESHAPE) is a CAST to float32
    or a SELECT_V2 of it against zeros, the CASTs go and the select is a MUL by it (the
    rows' gradient times the mask, the select's); an integer constant operand is read
    as a float32 one (the ids are floats here: embedding_gathers).  The comparison stays
    an op: no gradient passes it (an id mask had been spelled min(|x - c|, 1) in RELUs,
    which is no mask of a float x between integers and passed x a gradient).  Returns
    how many."""
    done = 0
    for op in list(g.ops):
        if op.name not in _MASKS or len(op.inputs) != 2 or \
                g.tensors[op.outputs[0]].dtype != 'bool':
            continue
        if any(g.tensors[k].dtype not in ('float32', 'int32', 'int64') for k in op.inputs) or \
                any(g.tensors[k].dtype != 'float32' and not is_const(g, k) for k in op.inputs):
            continue
        bools, readers, todo = [op.outputs[0]], [], [op.outputs[0]]
        while todo:
            for r in consumers(g, todo.pop()):
                if r.name in ('EXPAND_DIMS', 'RESHAPE') and r.inputs[0] in bools:
                    bools.append(r.outputs[0])
                    todo.append(r.outputs[0])
                readers.append(r)
        ok = all(r.name in ('EXPAND_DIMS', 'RESHAPE') or
                 r.name == 'CAST' and g.tensors[r.outputs[0]].dtype == 'float32' or
                 r.name == 'SELECT_V2' and r.inputs[0] in bools and r.inputs[1] not in bools
                 and is_const(g, r.inputs[2]) and not np.any(g.tensors[r.inputs[2]].data)
                 for r in readers)
        if not ok or any(k in g.outputs for k in bools) or \
                not any(r.name in ('CAST', 'SELECT_V2') for r in readers):
            continue
        for k in bools:
            g.tensors[k].dtype = 'float32'
        for p, k in enumerate(op.inputs):
            t = g.tensors[k]
            if t.dtype != 'float32':
                op.inputs[p] = new_tensor(g, t.name + '/as_float', list(t.shape),
                                          np.asarray(t.data, np.float32).reshape(t.shape))
        for r in readers:
            if r.name == 'CAST':
                bypass(g, r, r.inputs[0], r.outputs[0])
            elif r.name == 'SELECT_V2':
                r.name, r.code = 'MUL', OP_CODES['MUL']
                r.inputs, r.options = [r.inputs[1], r.inputs[0]], dict(NO_ACTIVATION)
        done += 1
    return done


def masks_back(g: Graph) -> int:
    """For export: each comparison whose mask id_masks made a float32 tensor (the device's
    1.0 / 0.0) writes a bool again, CAST to float32 after it (a runtime's comparisons
    write bool), and a constant operand takes the other operand's type (an int32 ids
    input again: embedding_ids_back).  Returns how many."""
    done = 0
    for op in list(g.ops):
        y = op.outputs[0] if op.name in _MASKS and op.outputs else None
        if y is None or g.tensors[y].dtype != 'float32':
            continue
        live = [g.tensors[k].dtype for k in op.inputs if not is_const(g, k)]
        for p, k in enumerate(op.inputs):
            t = g.tensors[k]
            if is_const(g, k) and live and t.dtype != live[0]:
                op.inputs[p] = new_tensor(g, t.name + '/as_' + live[0], list(t.shape),
                                          np.asarray(t.data).astype(live[0]))
        b = new_tensor(g, g.tensors[y].name + '/bool', list(g.tensors[y].shape), dtype='bool')
        op.outputs = [b]
        cast = Operator(-1, OP_CODES['CAST'], 'CAST', [b], [y], {}, src=op.src)
        g.ops.insert(g.ops.index(op) + 1, cast)
        done += 1
    return done
