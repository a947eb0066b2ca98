"""A graph's inputs and outputs: which output the loss reads, several inputs joined into
one, a step softmax, outputs pruned, the file's view of them, and the graph compacted
and saved as a circle file."""
from __future__ import annotations

import copy
import dataclasses

import re

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator
from .edit import make_reshape, new_tensor, remove_op, renumber


# the name ending of the SOFTMAX prepare puts after a float model's rows of logits a step
# (step_softmax): export takes it out again (drop_step_softmax)
STEP_SOFTMAX = '/utrain_step_softmax'


def step_softmax(g: Graph) -> int:
    """Append a SOFTMAX over each row of float graph g's output (rows of logits, a class
    a step: the board's cross-entropy takes probabilities a row, and from logits it would
    normalise all the rows as one); the output is its result.  Returns the op's number
    (the op making the logits': --train last:N counts the file's ops)."""
    k = g.outputs[0]
    made = next((op for op in g.ops if k in op.outputs), None)
    t = g.tensors[k]
    p = new_tensor(g, t.name + STEP_SOFTMAX, t.shape)
    g.tensors[p].sig, t.sig = t.sig, None
    g.ops.append(Operator(len(g.ops), OP_CODES['SOFTMAX'], 'SOFTMAX', [k], [p], {'beta': 1.0},
                          src=made.number if made is not None else None))
    g.outputs[0] = p
    return g.ops[-1].number


def drop_step_softmax(g: Graph) -> bool:
    """Take step_softmax's op out of graph g (export: the model gives its logits as the
    file did); whether there was one."""
    op = next((o for o in g.ops if o.name == 'SOFTMAX' and
               g.tensors[o.outputs[0]].name.endswith(STEP_SOFTMAX)), None)
    if op is None:
        return False
    g.outputs = [op.inputs[0] if k == op.outputs[0] else k for k in g.outputs]
    g.tensors[op.inputs[0]].sig = g.tensors[op.outputs[0]].sig
    remove_op(g, op)
    return True


def compact(g: Graph) -> Graph:
    """Drop tensors nothing reads or writes; renumber the rest in order."""
    used = set(g.inputs) | set(g.outputs)
    for op in g.ops:
        used.update(k for k in op.inputs + op.outputs if k >= 0)
    order = sorted(used)
    new = {k: i for i, k in enumerate(order)}
    new[-1] = -1
    tensors = []
    for k in order:
        t = g.tensors[k]
        t.index = new[k]
        tensors.append(t)
    g.tensors = tensors
    for op in g.ops:
        op.inputs = [new[k] for k in op.inputs]
        op.outputs = [new[k] for k in op.outputs]
    g.inputs = [new[k] for k in g.inputs]
    g.outputs = [new[k] for k in g.outputs]
    renumber(g)
    return g


def save_graph(g: Graph, path) -> str:
    """Write the Graph as a circle (or TFLite, after g.identifier) file."""
    from ..formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=g.identifier, description=g.description or 'utrain rewrite',
                      version=g.version or 3)
    for t in g.tensors:
        if t.data is not None:
            b.tensor(t.name, t.shape, data=t.data, dtype=t.data.dtype, quant=t.quant)
        else:
            b.tensor(t.name, t.shape, dtype=t.dtype, quant=t.quant)
    for op in g.ops:
        opts = {k: v for k, v in op.options.items() if v is not None}
        b.op(op.name, op.inputs, op.outputs, **opts)
    b.inputs(*g.inputs)
    b.outputs(*g.outputs)
    io = [natural(g, ks) for ks in (g.inputs, g.outputs)]
    if all(g.tensors[k].sig for ks in io for k in ks):      # (the file's SignatureDef)
        b.signature(*[[(g.tensors[k].sig[1], k) for k in ks] for ks in io])
    for name, blob in g.metadata.items():
        b.metadata(name, blob)
    return b.save(path)


def input_key(name: str) -> str:
    """The data file's array name for a model input named name: TFLite's
    'serving_default_' prefix and ':0' suffix dropped (Keras's Input(name='meta') is
    'serving_default_meta:0' in the .tflite file: 'meta'), tico's 'tico::' namespace
    too (forward(self, img, vec): 'tico::img' is 'img')."""
    import re
    n = re.sub(r':\d+$', '', str(name)).rsplit('::', 1)[-1]
    return n[len('serving_default_'):] if n.startswith('serving_default_') else n


def io_name(g: Graph, k: int) -> str:
    """A graph input's or output's name as its maker knows it: the SignatureDef's (Keras's
    Input name, 'output_0' for its first output), else input_key of the tensor's."""
    t = g.tensors[k]
    return t.sig[1] if t.sig else input_key(t.name)


def natural(g: Graph, ks) -> list:
    """Graph inputs or outputs ks in their maker's order: a Keras model's outputs by the
    N of the SignatureDef's output_N (the converter may list them otherwise), else as the
    file lists them.  (A SignatureDef lists its keys sorted by name: a Keras model's
    inputs by their Input names, where the file's inputs keep Keras's order: TF 2.21's
    converter on keras.Model([zeta, alpha]) writes inputs zeta, alpha and the signature
    alpha, zeta.)"""
    ks = list(ks)
    sig = [g.tensors[k].sig for k in ks]
    if ks and all(s and re.fullmatch(r'output_\d+', s[1]) for s in sig):
        return sorted(ks, key=lambda k: int(g.tensors[k].sig[1][7:]))
    return ks


def _fits(n: int, y) -> bool:
    """Whether targets y (one row a sample) suit an output of n values: class labels
    0..C-1 a classifier of C or more, a vector of n values an output of n."""
    y = np.asarray(y)
    if y.ndim == 0 or not len(y):
        return False
    y = y.reshape(len(y), -1)
    if y.shape[1] > 1:
        return y.shape[1] == n
    v = y[:, 0].astype(np.float64)
    if np.all(v == np.round(v)) and v.min() >= 0:       # labels (0/1: bce's too)
        return (n == 1 and v.max() <= 1) or (n > 1 and n > v.max())
    return n == 1


def _file_of(g: Graph, k: int):
    """(place, name) of output tensor k among the file's outputs (an .onnx's
    g.file_outputs, those utrain leaves out too: skl2onnx's output_label before
    output_probability), or None."""
    alias = getattr(g, 'output_names', None) or {}
    return next(((p, n) for p, n in enumerate(getattr(g, 'file_outputs', None) or ())
                 if alias.get(n) == k or (n not in alias and n == g.tensors[k].name)), None)


def _file_said(g: Graph, k: int, j: int) -> str:
    """' (the file's output P, NAME)' for output tensor k, utrain's output j, where the
    file numbers or names it otherwise; else ''."""
    f = _file_of(g, k)
    if f is None or (f[0] == j and f[1] == io_name(g, k)):
        return ''
    return f' (the file\'s output {f[0]}, {f[1]!r})'


def _file_place(g: Graph, order, i: int, desc):
    """utrain's place of the output --output's number i picks: i itself where utrain has
    an output i (the listings name the file's place beside it where that differs); else
    the file's output i (ONNX Runtime's and Netron's numbering, the outputs utrain leaves
    out counted: skl2onnx's output_probability is its output 1), refused where that is one
    utrain leaves out (why, and what to give)."""
    files = getattr(g, 'file_outputs', None)
    if 0 <= i < len(order) or not files or not 0 <= i < len(files):
        return i
    name = files[i]
    k = next((k for k in order if (_file_of(g, k) or (None, None))[1] == name), None)
    if k is None:
        why = dict(getattr(g, 'onnx_dropped', None) or ()).get(name, 'utrain does not train it')
        raise ValueError(f'{g.path}: --output {i}: the file\'s output {i}, {name!r}, is left '
                         f'out ({why}); the outputs utrain trains are '
                         + ', '.join(desc(j) for j in range(len(order)))
                         + ': give one\'s place or name')
    return order.index(k)


def choose_output(g: Graph, which=None, y=None):
    """The output the loss reads, of a model with several, goes first in g.outputs (where
    every pass reads it); g.output_at is its place in the file's outputs (prune_outputs
    leaves the others out of the graph that trains, export keeps them).  which: its
    place in natural order, or its name (io_name's, or the tensor's); None: the first in
    natural order whose size suits the data's targets y (every output's when y is None
    or none does).  Returns a line saying which output trains and how to choose
    another, or None for a model with one output."""
    outs, order = list(g.outputs), natural(g, g.outputs)
    desc = lambda j: f'{j} {io_name(g, order[j])!r} {list(g.tensors[order[j]].shape)}' \
        + _file_said(g, order[j], j)  # noqa: E731
    how = ''
    if which is None or which == '':
        # (an output whose size the file knows only at run time, -1s past the batch in its
        # signature, may fit: its shape here is the converter's guess, [1, 1] for [1, 64])
        fit = [j for j, k in enumerate(order)
               if y is not None and (_fits(int(np.prod(g.tensors[k].shape)), y) or
                                     -1 in list(g.tensors[k].signature or [])[1:])]
        i = fit[0] if fit else 0
        how = (', the first whose size the data\'s targets fit' if fit and len(fit) < len(order)
               else ', the first')
    else:
        w = str(which)
        alias = getattr(g, 'output_names', None) or {}      # (the file's: a ZipMap's)
        named = [j for j, k in enumerate(order) if w in (io_name(g, k), g.tensors[k].name)
                 or alias.get(w) == k]
        i = int(w) if w.lstrip('-').isdigit() else named[0] if len(named) == 1 else None
        if i is not None and w.lstrip('-').isdigit():
            i = _file_place(g, order, i, desc)
        if i is None or not 0 <= i < len(order):
            if len(named) > 1:
                raise ValueError(f'{g.path}: --output {which!r} names outputs '
                                 + ', '.join(desc(j) for j in named) + '; give its place')
            raise ValueError(f'{g.path}: --output {which!r}: the model\'s outputs are '
                             + ', '.join(desc(j) for j in range(len(order)))
                             + '; give one\'s place or name')
    k = order[i]
    g.output_at, g.output_place = outs.index(k), i
    g.outputs = [k] + [o for o in outs if o != k]
    if len(outs) == 1:
        return None
    return (f'{g.path}: has {len(outs)} outputs; training output {desc(i)}{how} (the loss '
            'reads it; --output NAME|INDEX chooses another: '
            + ', '.join(desc(j) for j in range(len(order)) if j != i)
            + '); the ops only the others need are left out of the run, and export keeps '
            'them, their weights as trained where they share them')


def needed(g: Graph):
    """(the ops g.outputs[0] needs, in order; the tensors they read or make)."""
    need = {g.outputs[0]}
    keep = []
    for op in reversed(g.ops):
        if any(k in need for k in op.outputs):
            keep.append(op)
            need.update(k for k in op.inputs if k >= 0)
    return keep[::-1], need


def prune_outputs(g: Graph) -> int:
    """Only g.outputs[0] (choose_output's) is kept: the ops it does not need leave g, and
    the inputs it does not read leave g.inputs; tensors keep their numbers.  Returns how
    many ops left."""
    if len(g.outputs) < 2:
        return 0
    keep, need = needed(g)
    n = len(g.ops) - len(keep)
    g.ops = keep
    renumber(g)
    g.outputs = g.outputs[:1]
    g.inputs = [k for k in g.inputs if k in need] or g.inputs[:1]
    return n


JOINED = 'utrain_inputs'


def join_inputs(g: Graph):
    """A graph with several inputs takes them as one [1, n] input, JOINED (the inputs'
    values one after the other, each flattened, in their maker's order (natural): what a
    data file's arrays become, dataset.load_inputs): a SPLIT_V of it into each input's values, and a
    RESHAPE of each to its input's shape; the devices run one input as before.  Tensors
    are appended (the others keep their numbers).  Int8 inputs (the int8 path) keep
    their scales and zero points: the joined input is each one's int8 codes one after
    the other (at scale 1, zero point 0: the SPLIT_V copies bytes, and each part is its
    input at its own scale; quant.prepare_q8 quantizes each part's samples so).  Float
    inputs stored as 8-bit samples (g.inputs_stored {data key: (scale, offset)}, --dtype:
    each input's own, pipeline.stored_parts) take their part as the stored codes and a MUL
    by its scale (an ADD of its offset) after the SPLIT_V gives the input's values.  Sets
    and returns g.joined, [(name, shape)] of the inputs joined, or None for a graph with
    one input."""
    if len(g.inputs) < 2:
        return None
    g.inputs = natural(g, g.inputs)
    parts = [(g.tensors[k].name, [int(d) for d in g.tensors[k].shape]) for k in g.inputs]
    sizes = [int(np.prod(s[1:], dtype=np.int64)) for _, s in parts]
    ib = getattr(g, 'ids_ib', 1)
    for i, k in enumerate(g.inputs):
        if ib > 1 and k in getattr(g, 'ids_q8', ()):
            # (an int8 embedding's ids of 2 bytes each, quant._ids_inputs: the part is
            # the ids tensor itself, [1, 2 n] bytes as utrain.q8emb reads them; export
            # gives it its file_shape back)
            t = g.tensors[k]
            t.file_shape, t.shape = list(t.shape), [1, sizes[i] * ib]
            sizes[i] *= ib
    q8 = all(g.tensors[k].dtype == 'int8' and (g.tensors[k].quant or {}).get('scale')
             for k in g.inputs)
    src = g.ops[0].src if g.ops else None
    x = new_tensor(g, JOINED, [1, sum(sizes)], dtype='int8' if q8 else None)
    if q8:
        g.tensors[x].quant = {'scale': [1.0], 'zero_point': [0]}
    sz = new_tensor(g, JOINED + '/sizes', [len(sizes)], np.array(sizes, np.int32))
    ax = new_tensor(g, JOINED + '/axis', [], np.array(1, np.int32))
    made, outs = [], []
    for k, n in zip(g.inputs, sizes):
        if list(g.tensors[k].shape) == [1, n]:
            outs.append(k)          # (a [1, n] input is its part as it is)
            continue
        outs.append(new_tensor(g, g.tensors[k].name + '/joined_part', [1, n],
                               like=k if q8 else None))
        rs = Operator(-1, OP_CODES['RESHAPE'], 'RESHAPE', [outs[-1]], [k], {}, src=src)
        make_reshape(g, rs, list(g.tensors[k].shape))
        made.append(rs)
    split = Operator(-1, OP_CODES['SPLIT_V'], 'SPLIT_V', [x, sz, ax], outs,
                     {'num_splits': len(outs)}, src=src)
    stored = getattr(g, 'inputs_stored', None) or {}
    keys = {n: key for n, _, key in (getattr(g, 'data_inputs', None) or ((),))[0]}
    for i, (k, (name, _)) in enumerate(zip(g.inputs, parts)):
        sc, off = stored.get(keys.get(name), (1.0, 0.0)) if not q8 else (1.0, 0.0)
        for what, c, op in (('offset', off, 'ADD'), ('scale', sc, 'MUL')):  # (code sc + off)
            if c == (1.0 if op == 'MUL' else 0.0):
                continue
            raw = new_tensor(g, f'{name}/stored_{what}d', [1, sizes[i]])
            made.insert(0, Operator(-1, OP_CODES[op], op, [raw, new_tensor(
                g, f'{name}/stored_{what}', [1], np.array([c], np.float32))], [outs[i]],
                {'fused_activation_function': 'NONE'}, src=src))
            outs[i] = raw       # (the SPLIT_V's own list: it writes the stored codes)
    g.ops[0:0] = [split] + made
    renumber(g)
    for k in g.inputs if not q8 else ():
        g.tensors[k].dtype = 'float32'
    g.inputs = [x]
    g.joined = parts
    return parts


def join_ops(g: Graph) -> set:
    """ids of the ops join_inputs made in g (none where it joined nothing)."""
    if not getattr(g, 'joined', None):
        return set()
    split = next(op for op in g.ops if g.inputs[0] in op.inputs)
    out, todo = {id(split)}, list(split.outputs)
    while todo:         # (an 8-bit part's MUL, ADD: join_inputs's stored codes; the RESHAPE)
        k = todo.pop()
        for op in g.ops:
            if k in op.inputs and (op.name == 'RESHAPE' or op.name in ('MUL', 'ADD') and
                                   g.tensors[op.inputs[1]].name.rsplit('/', 1)[-1] in
                                   ('stored_scale', 'stored_offset')):
                out.add(id(op))
                todo += op.outputs if op.name != 'RESHAPE' else ()
    return out


def keep_file_view(g: Graph):
    """Before prune_outputs and join_inputs: what file_graph gives back (g's tensors as
    they are numbered now, its ops, its inputs and the file's outputs in its order)."""
    o, i = list(g.outputs), getattr(g, 'output_at', 0)
    g.as_file = (len(g.tensors), copy.deepcopy(g.ops), list(g.inputs), o[1:i + 1] + o[:1] + o[i + 1:])


def file_graph(g: Graph) -> Graph:
    """g as the file has it (keep_file_view's): its inputs apart and every output, for
    the rewritten model export writes the trained weights into; g itself when nothing
    was joined or left out."""
    v = getattr(g, 'as_file', None)
    if v is None or (len(v[2]) == len(g.inputs) and len(v[3]) == len(g.outputs)):
        return g
    n, ops, ins, outs = v
    return dataclasses.replace(g, tensors=g.tensors[:n], ops=copy.deepcopy(ops), inputs=ins,
                               outputs=outs)

