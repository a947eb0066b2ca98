"""export --quantized of a model whose Keras recurrent layers are WHILE loops (cond and
body subgraphs; rewrite.unroll_loops trained them unrolled): the int8 model the run
trained (unrolled, one tensor a step: quant.export wrote it) put back into the file's
own structure, the WHILE, its cond and body, every float32 tensor int8 (int32 for the
biases) in place.

A body tensor is one tensor for every step, so it gets one scale and zero point: the
union of its steps' ranges in the trained model (the calibration measured each step
apart), and a loop value (h, c, the output buffer) the same on every side of the loop
(the WHILE's input and output, the body's, the cond's: TFLite's WHILE copies bytes);
RESHAPE, SLICE, GATHER, SPLIT and CONCATENATION keep their input's (TFLite's int8
kernels copy bytes), LOGISTIC and TANH give TFLite's fixed 1/256 and 1/128.  The
weights are the trained integers at their trained scales (one tensor for every step
already); a bias is the trained one, requantized at its input's scale x the weight's;
a FULLY_CONNECTED without a bias (Keras's cell) gets the zero int32 bias the int8 run
trained with (the mean over the steps, where each step trained its own)."""
import numpy as np

from ..formats.circle_io import (C, DTYPE_TO_TENSOR_TYPE, _aligned_buffer, quant_params, read_model,
                                 write_with_weights)
from ..graph.loops import body_name, union_find
from ..graph.qparams import quantize
from .fromfloat import FIXED_OUT

# ops whose int8 output is their input's bytes: one scale on both sides
_SAME = {'RESHAPE': (0,), 'SQUEEZE': (0,), 'EXPAND_DIMS': (0,), 'SLICE': (0,),
         'STRIDED_SLICE': (0,), 'GATHER': (0,), 'REVERSE_V2': (0,), 'TRANSPOSE': (0,),
         'SPLIT': (1,), 'SPLIT_V': (0,), 'CONCATENATION': None}
# what unrolling makes of a step's GATHER and the output buffer's SLICEs
_UNROLLED = {'SPLIT_V', 'STRIDED_SLICE', 'SLICE', 'RESHAPE', 'CONCATENATION'}
_WEIGHTED = ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D')


class LoopExportError(ValueError):
    """The trained int8 model has no faithful place in the WHILE file."""


def _refuse(path, why):
    raise LoopExportError(
        f'{path}: export --quantized cannot write its WHILE loops as int8 ({why}); export '
        'without --quantized writes the trained model as float32, or give the layer '
        'unroll=True and convert again for an int8 file of the unrolled layer')


def write_int8_loops(file_path, unrolled_path, out_path, identifier=None) -> int:
    """out_path: float model file_path (WHILE loops) as int8, its values those of the
    trained int8 model unrolled_path (quant.export's, of the graph prepare unrolled from
    it).  Returns how many tensors were made int8.  LoopExportError where it cannot be
    faithful (a tensor of the file the int8 model has no counterpart for, an op of the
    int8 model the file has no place for, a loop value two fixed scales meet)."""
    f = read_model(file_path)
    u = read_model(unrolled_path)
    subs = {0: f, **(f.subgraphs or {})}
    odd = sorted({op.name for op in u.ops} - {op.name for g in subs.values() for op in g.ops}
                 - _UNROLLED)
    if odd:
        _refuse(file_path, f'the int8 model has {", ".join(odd)}, which the file has no op for')
    by_name = {}
    for t in u.tensors:
        by_name.setdefault(t.name, []).append(t)
        if body_name(t.name):
            by_name.setdefault(('step', body_name(t.name)), []).append(t)

    def mates(si, t):
        """The trained model's tensors of file tensor t: the same name (subgraph 0, or a
        body's constant, one for every step), or each step's (name/tN)."""
        got = list(by_name.get(t.name, ()))
        if si and t.data is None:
            got = [v for v in got if v.data is None] + by_name.get(('step', t.name), [])
        return got

    # loop values and byte-copying ops: one scale for all their tensors (union-find)
    starts = []
    find, join = union_find()
    for si, g in subs.items():
        for op in g.ops:
            if op.name == 'WHILE':
                c, b = op.options['cond_subgraph_index'], op.options['body_subgraph_index']
                for j, k in enumerate(op.inputs):
                    for key in ((si, op.outputs[j]), (b, subs[b].inputs[j]),
                                (b, subs[b].outputs[j]), (c, subs[c].inputs[j])):
                        join((b, subs[b].inputs[j]), key)
                    if g.tensors[k].data is None:
                        join((si, k), (b, subs[b].inputs[j]))
                    elif g.tensors[k].dtype == 'float32':   # (a zero state, one tensor for
                        starts.append((si, op, j))          # h and c: one copy each, below)
            elif op.name in _SAME:
                ins = op.inputs if _SAME[op.name] is None else [op.inputs[i] for i in _SAME[op.name]]
                for k in ins + op.outputs:
                    if k >= 0 and g.tensors[k].dtype == 'float32':
                        join((si, ins[0]), (si, k))
    fixed = {(si, op.outputs[0]): FIXED_OUT[op.name] for si, g in subs.items() for op in g.ops
             if op.name in FIXED_OUT}
    weights = {(si, op.inputs[i]) for si, g in subs.items() for op in g.ops
               if op.name in _WEIGHTED for i in range(1, len(op.inputs)) if op.inputs[i] >= 0}
    classes = {}
    for si, g in subs.items():
        for t in g.tensors:
            if t.dtype == 'float32' and (si, t.index) not in weights:
                classes.setdefault(find((si, t.index)), []).append((si, t))
    quant = {}                      # (si, k) -> (scale, zero point) of an activation
    for members in classes.values():
        fx = {fixed[(si, t.index)] for si, t in members if (si, t.index) in fixed}
        if len(fx) > 1:
            _refuse(file_path, f'{members[0][1].name!r} would need two fixed scales')
        got = [v for si, t in members for v in mates(si, t) if v.dtype == 'int8' and v.quant]
        if fx:
            q = fx.pop()
        elif got:
            qs = {(float(v.quant['scale'][0]), int(v.quant['zero_point'][0])) for v in got}
            if len(qs) == 1:
                q = qs.pop()
            else:       # (a body tensor: every step's range in one scale)
                lo = min(min(0.0, (-128 - z) * s) for s, z in qs)
                hi = max(max(0.0, (127 - z) * s) for s, z in qs)
                s = float(np.float32((hi - lo) / 255))
                q = (s, int(np.clip(np.round(-128 - lo / s), -128, 127)))
        elif all(t.data is not None for _, t in members):
            continue                # (a constant of its own: a weight's, below)
        else:
            _refuse(file_path, f'tensor {members[0][1].name!r} has no counterpart in the '
                    'trained int8 model')
        for si, t in members:
            quant[(si, t.index)] = q
    new = {}                        # (si, k) -> (dtype, quant dict, data or None)
    for (si, k), (s, z) in quant.items():
        t = subs[si].tensors[k]
        q = {'scale': [s], 'zero_point': [z]}
        # (a loop's initial state: zeros, at its scale)
        new[(si, k)] = ('int8', q, None if t.data is None else quantize(t.data, q, np.int8)[0])
    inits = []                      # (si, op, j, data, quant): a loop's initial value
    for si, op, j in starts:
        b = op.options['body_subgraph_index']
        t = subs[si].tensors[op.inputs[j]]
        if (b, subs[b].inputs[j]) not in quant:
            _refuse(file_path, f'the loop value {t.name!r} has no scale in the trained int8 model')
        s, z = quant[(b, subs[b].inputs[j])]
        q = {'scale': [s], 'zero_point': [z]}
        data = quantize(t.data, q, np.int8)[0]
        inits.append((si, op, j, data, q))
        new.setdefault((si, t.index), ('int8', q, data))
    for si, g in subs.items():      # the other constants: the trained model's
        for t in g.tensors:
            if t.dtype != 'float32' or t.data is None or (si, t.index) in new:
                continue
            got = [v for v in by_name.get(t.name, ()) if v.data is not None and v.quant]
            if not got or any(v.dtype != got[0].dtype or v.quant != got[0].quant or
                               not np.array_equal(v.data, got[0].data) for v in got[1:]):
                _refuse(file_path, f'constant {t.name!r} has no single trained int8 tensor')
            v = got[0]
            if int(np.prod(v.shape)) != int(np.prod(t.shape)):
                _refuse(file_path, f'constant {t.name!r} is {t.shape} in the file, '
                        f'{v.shape} in the int8 model')
            new[(si, t.index)] = (v.dtype, dict(v.quant), np.asarray(v.data).reshape(t.shape))
    added = []                      # (si, op, bias data, quant): zero biases the run trained
    for si, g in subs.items():
        for op in g.ops:
            if op.name not in _WEIGHTED or len(op.inputs) < 2:
                continue
            w = new.get((si, op.inputs[1]))
            sx = quant.get((si, op.inputs[0]))
            if w is None or sx is None:
                _refuse(file_path, f'op {op.name} reading {g.tensors[op.inputs[1]].name!r} has no '
                        'int8 weight or input scale')
            sw = np.asarray(w[1]['scale'], np.float64)
            wname = g.tensors[op.inputs[1]].name
            bs = [u.tensors[o.inputs[2]] for o in u.ops if o.name == op.name and
                  len(o.inputs) > 2 and o.inputs[2] >= 0 and u.tensors[o.inputs[1]].name == wname]
            if not bs:
                continue            # (no bias in the int8 model either)
            vals = [np.asarray(b.data, np.float64).reshape(-1) *
                    np.asarray(b.quant['scale'], np.float64) for b in bs]
            val = np.mean(vals, axis=0)
            sb = sx[0] * sw
            q = {'scale': [float(np.float32(v)) for v in (sb if sb.size == val.size else
                                                          np.full(val.size, sb[0]))],
                 'zero_point': [0] * val.size, 'quantized_dimension': 0}
            if op.name == 'FULLY_CONNECTED' and sb.size == 1:
                q['scale'], q['zero_point'] = q['scale'][:1], [0]
            data = quantize(val, q, np.int32)[0]
            if len(op.inputs) > 2 and op.inputs[2] >= 0:
                new[(si, op.inputs[2])] = ('int32', q, data.reshape(g.tensors[op.inputs[2]].shape))
            else:
                added.append((si, op, data, q))

    def edit(model):
        def buffer(data):
            model.buffers.append(_aligned_buffer(np.ascontiguousarray(data).astype(
                data.dtype.newbyteorder('<')).tobytes()))
            return len(model.buffers) - 1
        for (si, k), (dtype, q, data) in new.items():
            t = model.subgraphs[si].tensors[k]
            t.type = DTYPE_TO_TENSOR_TYPE[dtype]
            t.quantization = quant_params(q)
            if data is not None:
                t.buffer = buffer(np.asarray(data))
        for si, op, j, data, q in inits:
            sg = model.subgraphs[si]
            t = C.Tensor.TensorT()
            old = sg.tensors[op.inputs[j]]
            t.shape, t.name = list(old.shape), (subs[si].tensors[op.inputs[j]].name + f'/{j}').encode()
            t.type, t.buffer, t.quantization = DTYPE_TO_TENSOR_TYPE['int8'], buffer(data), quant_params(q)
            sg.tensors.append(t)
            o = sg.operators[subs[si].ops.index(op)]
            o.inputs = [len(sg.tensors) - 1 if i == j else k for i, k in enumerate(o.inputs)]
        for si, op, data, q in added:
            sg = model.subgraphs[si]
            t = C.Tensor.TensorT()
            t.shape = [int(data.size)]
            t.type = DTYPE_TO_TENSOR_TYPE['int32']
            t.name = (subs[si].tensors[op.inputs[1]].name + '/bias').encode()
            t.buffer = buffer(data)
            t.quantization = quant_params(q)
            sg.tensors.append(t)
            o = sg.operators[op.index if hasattr(op, 'index') else subs[si].ops.index(op)]
            ins = list(o.inputs)
            o.inputs = (ins + [-1] * 3)[:2] + [len(sg.tensors) - 1] + ins[3:]
    write_with_weights(file_path, out_path, {}, identifier, edit=edit)
    return len(new) + len(added)
