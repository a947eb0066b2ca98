"""What exporters copy: constants several ops read made one each (unshare_constants),
tico's folded first RNN step tied back to b_hh (first_steps), a layer copied scaled by
beta (scaled_copies)."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import OP_CODES, Graph, Operator
from .edit import BINARY, NO_ACTIVATION, WEIGHT_OUT_AXIS, is_const, move_after, new_tensor, renumber


# The exporter-output passes in the order rewrite() runs them after dequantize:
# (report key, pass, whether it runs on an int8 graph that trains as int8).  The int8
# ones only fold what the host knows or change an op for one that computes the same
# integers (a max keeps its input's scale, a tile is copies, an unpack or slices a split
# of the same bytes); the others edit float constants or make float constants (NEG's -1).
def unshare_constants(g: Graph) -> int:
    """A constant tensor that ops of different layers read as a weight or bias gets a
    copy per layer: the TFLite converter keeps one tensor for equal constants (Keras's
    all-zero conv biases, equal weights), and trained as one they would move together,
    fewer parameters than the model has.  Readers are one layer applied again (a
    TimeDistributed's steps, an unrolled RNN's: utrain.q8share) where they are the same
    op reading the same constants (its options may differ: an RNN's first step fuses the
    activation the others apply after adding the recurrent term): those keep sharing.  The first
    group keeps the tensor, each other group reads a copy (appended: the tensors before
    keep their indices), frozen ones too (export writes the copies as tensors of their
    own).  Float and int8 graphs (an int8 copy keeps the scales).  An .onnx model's keep
    sharing: there an initializer several nodes read is one parameter of the model's maker
    (tied weights; the ONNX reader reads it as one tensor) and export writes one tensor
    back.  Returns the copies made."""
    from .optable import SPECS
    g.unshared = []     # (each tensor copied and its copies: still_shared counts them)
    if getattr(g, 'onnx_origin', None) is not None:
        return 0
    readers = {}
    for op in g.ops:
        spec = SPECS.get(op.name)
        if spec is None:
            continue
        for pos in spec.roles(op, g):
            k = op.inputs[pos] if pos < len(op.inputs) else -1
            if is_const(g, k):
                readers.setdefault(k, []).append((op, pos))
    made = 0
    for k, rs in readers.items():
        layers = {}
        for op, pos in rs:
            # (its weights and biases: a step that reads a constant as data, an unrolled
            # loop's first FC of its zero initial state, is the same layer)
            roles = SPECS[op.name].roles(op, g)
            key = (op.name, pos, tuple(i if is_const(g, i) and p in roles else -1
                                       for p, i in enumerate(op.inputs)))
            layers.setdefault(key, []).append(op)
        t = g.tensors[k]
        family = [t]
        for j, ops in enumerate(list(layers.values())[1:], 1):
            c = new_tensor(g, f'{t.name}/utrain_copy{j}', t.shape, t.data.copy(), like=k)
            for op in ops:
                op.inputs = [c if i == k else i for i in op.inputs]
            family.append(g.tensors[c])
            made += 1
        if len(family) > 1:
            g.unshared.append(family)
    return made


def still_shared(g: Graph) -> list:
    """The names of unshare_constants's tensors (a constant several layers read, and its
    copies) that ops still read once the passes have run, for each constant two or more
    of them are: a fold that replaces a layer's bias (a dilated convolution's zero bias,
    its ADD's bias moved in) leaves its copy read by nothing, and a constant one layer
    reads is no longer shared."""
    read = {id(g.tensors[k]) for op in g.ops for k in op.inputs if k >= 0}
    fams = [[t.name for t in f if id(t) in read] for f in getattr(g, 'unshared', ())]
    return [f for f in fams if len(f) > 1]


def _recurrent_fcs(g: Graph) -> list:
    """FULLY_CONNECTED ops whose weight and bias (constants) other FULLY_CONNECTED ops read
    too: one layer applied a step at a time (an unrolled RNN's hidden-to-hidden layer)."""
    by = {}
    for op in g.ops:
        b = op.inputs[2] if len(op.inputs) > 2 else -1
        if op.name == 'FULLY_CONNECTED' and is_const(g, op.inputs[1]) and \
                (b < 0 or is_const(g, b)) and not is_const(g, op.inputs[0]):
            by.setdefault((op.inputs[1], b), []).append(op)
    return [ops[0] for ops in by.values() if len(ops) > 1]


def _reaches(g: Graph, op: Operator, k: int) -> bool:
    """Does tensor k depend on op's outputs (g's ops are in order)?"""
    seen = set(op.outputs)
    for o in g.ops[g.ops.index(op) + 1:]:
        if seen.intersection(o.inputs):
            seen.update(o.outputs)
    return k in seen


def first_steps(g: Graph) -> int:
    """An unrolled RNN's first step as tico writes it (a PyTorch nn.GRU / nn.LSTM): with
    the initial state h0 = 0 the converter folds W_hh h0 + b_hh into constants, b_hh or
    its gate slices (GRU: b_hr, b_hz, b_hn; zeros for a layer without a bias), read by
    the step's ADD and MUL, and writes
    the zero state (GRU's h0 in h0 - n, LSTM's c0 in f * c0) as an all-zero constant.
    Trained as parameters of their own they would move apart from b_hh, and h0 would
    train where PyTorch holds it at 0.  So a constant that equals block j of n of a
    recurrent FULLY_CONNECTED's bias (the same layer a later step applies: _recurrent_fcs),
    read by an op the layer's input depends on, becomes piece j of that FC applied to a
    zero state (FC -> SPLIT -> RESHAPE): b_hh is one parameter again, trained by every
    step as PyTorch trains it, and export writes one tensor.  An all-zero constant read
    as a binary op's operand on the way to such a layer's input, of the state's size or
    of the layer's output (or a gate's part of it), is frozen (Tensor.frozen).  (A b_hh
    initialised to zeros is then frozen in step 0, where the later steps train it: its
    copies cannot be told from a zero state by value.)  Float graphs.  Returns how many
    constants."""
    fcs = _recurrent_fcs(g)
    if not fcs:
        return 0
    done, zero_state = 0, {}
    for op in list(g.ops):
        if op.name not in BINARY or len(op.inputs) != 2:
            continue
        for pos in (0, 1):
            k = op.inputs[pos]
            if not is_const(g, k) or is_const(g, op.inputs[1 - pos]) or \
                    g.tensors[k].dtype != 'float32' or g.tensors[k].frozen:
                continue
            c = np.asarray(g.tensors[k].data, np.float32).reshape(-1)
            for f in fcs:
                # (no bias, nn.GRU(bias=False): step 0's W_hh h0 folds to zeros, frozen)
                b = np.asarray(g.tensors[f.inputs[2]].data, np.float32).reshape(-1) \
                    if len(f.inputs) > 2 and f.inputs[2] >= 0 else np.zeros(0, np.float32)
                n, m = b.size // c.size, c.size
                if not c.any():
                    # the state (h0, c0: the FC's input size) or W_hh h0 (its output
                    # size, or a gate's part of it) of a layer without a bias
                    out = int(g.tensors[f.outputs[0]].shape[-1])
                    if (m == int(np.prod(g.tensors[f.inputs[0]].shape)) or out % m == 0) and \
                            _reaches(g, op, f.inputs[0]):
                        g.tensors[k].frozen = True      # (h0 / c0: no parameter)
                        done += 1
                        break
                    continue
                if not b.size or b.size % m or not _reaches(g, op, f.inputs[0]) or m == 1 and (
                        len(g.tensors[k].shape) != len(g.tensors[f.outputs[0]].shape) or
                        len(g.tensors[k].shape) < 2):
                    continue        # (a scalar 1 or 0.5 is no gate's bias: a 1-unit
                    # layer's has the state's rank)
                j = next((j for j in range(n) if np.array_equal(b[j * m:(j + 1) * m], c)), None)
                if j is None:
                    continue
                key = (id(f), n)
                if key not in zero_state:
                    zero_state[key] = _applied_to_zero(g, f, op, n)
                piece = zero_state[key][1][j]
                if list(g.tensors[piece].shape) != list(g.tensors[k].shape):
                    r = new_tensor(g, g.tensors[k].name + '/utrain_tied', g.tensors[k].shape,
                                   like=k)
                    shp = new_tensor(g, g.tensors[k].name + '/utrain_shape',
                                     [len(g.tensors[k].shape)],
                                     np.array(g.tensors[k].shape, np.int32))
                    g.ops.insert(g.ops.index(op), Operator(
                        -1, OP_CODES['RESHAPE'], 'RESHAPE', [piece, shp], [r],
                        {'new_shape': list(g.tensors[k].shape)}, src=op.src))
                    renumber(g)
                    piece = r
                op.inputs[pos] = piece
                done += 1
                break
    return done


def scaled_copies(g: Graph) -> int:
    """A FULLY_CONNECTED, CONV_2D or DEPTHWISE_CONV_2D whose weight and bias are another's
    of the same op, options and input times one positive number s (tico folds PyTorch's
    softplus(x, beta) beta * linear(x) into a second copy of the linear layer) ->
    MUL(that other's output, s), s frozen: trained as a copy it would move apart from the
    layer PyTorch trains.  Float graphs.  Returns how many."""
    done = 0
    for op in list(g.ops):
        if op.name not in WEIGHT_OUT_AXIS or len(op.inputs) < 3 or not all(
                is_const(g, k) for k in op.inputs[1:3]):
            continue
        w, b = (np.asarray(g.tensors[k].data, np.float64) for k in op.inputs[1:3])
        for o in g.ops:
            # (the copy is the one whose weight the converter wrote after: tico's
            # p_fc_weight_weight_fused after p_fc_weight)
            if o is op or o.name != op.name or o.inputs[0] != op.inputs[0] or \
                    o.inputs[1] > op.inputs[1] or \
                    len(o.inputs) != len(op.inputs) or o.options != op.options or \
                    not all(is_const(g, k) for k in o.inputs[1:3]) or \
                    list(g.tensors[o.outputs[0]].shape) != list(g.tensors[op.outputs[0]].shape):
                continue
            w0, b0 = (np.asarray(g.tensors[k].data, np.float64) for k in o.inputs[1:3])
            if w0.shape != w.shape or b0.shape != b.shape or not np.abs(w0).any():
                continue
            i = int(np.argmax(np.abs(w0)))
            s = w.reshape(-1)[i] / w0.reshape(-1)[i]
            if not s > 0 or s == 1 or not np.allclose(w, s * w0, rtol=1e-6, atol=0) or \
                    not np.allclose(b, s * b0, rtol=1e-6, atol=1e-30):
                continue
            if op.options.get('fused_activation_function', 'NONE') != 'NONE':
                continue
            k = new_tensor(g, g.tensors[op.outputs[0]].name + '/utrain_scale', [],
                           np.array(s, np.float32))
            g.tensors[k].frozen = True
            if g.ops.index(o) > g.ops.index(op):
                move_after(g, op, o)
            op.name, op.code, op.inputs = 'MUL', OP_CODES['MUL'], [o.outputs[0], k]
            op.options = dict(NO_ACTIVATION)
            done += 1
            break
    return done


def _applied_to_zero(g: Graph, f: Operator, before: Operator, n: int):
    """FC f (its weight and bias) applied to a frozen zero state, split in n along its
    last axis, inserted before op `before`: (FC op, [pieces])."""
    x, y = g.tensors[f.inputs[0]], g.tensors[f.outputs[0]]
    z = new_tensor(g, y.name + '/utrain_zero_state', x.shape, np.zeros(x.shape, np.float32))
    g.tensors[z].frozen = True
    out = new_tensor(g, y.name + '/utrain_first_step', y.shape, like=f.outputs[0])
    made = [Operator(-1, f.code, f.name, [z] + list(f.inputs[1:]), [out], dict(f.options),
                     src=f.src)]
    pieces = [out]
    if n > 1:
        shape = list(y.shape[:-1]) + [y.shape[-1] // n]
        pieces = [new_tensor(g, f'{y.name}/utrain_first_step{j}', shape, like=f.outputs[0])
                  for j in range(n)]
        axis = new_tensor(g, y.name + '/utrain_axis', [], np.array(len(y.shape) - 1, np.int32))
        made.append(Operator(-1, OP_CODES['SPLIT'], 'SPLIT', [axis, out], pieces,
                             {'num_splits': n}, src=f.src))
    at = g.ops.index(before)
    g.ops[at:at] = made
    renumber(g)
    return made[0], pieces
