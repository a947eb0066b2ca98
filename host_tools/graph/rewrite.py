"""Graph rewrites for exporter output, run by `prepare` before validation: this module
runs them in order (LOOP_PASSES, then dequantize, then PASSES); the passes live by theme
in the modules beside it, over the primitives of graph/edit.py: loops, qparams
(dequantize), transposes, biases (BatchNorm, bias ADDs), copies (shared constants, tico's
first steps and scaled copies), spellings (ops utrain lacks spelled with ops it has),
shapes, embeddings, groups; inout (inputs, outputs, compact, save_graph) and inscale
(the input scale) are run by the run plan, not here.

Each pass is a small function over the circle_io Graph IR that edits the graph in place
and returns how many changes it made:

* unroll_loops        a WHILE whose trip count the host knows (a Keras LSTM, GRU,
                      SimpleRNN or Bidirectional layer that is not unroll=True) -> its
                      body inlined once a step, counters and buffer slices folded, the
                      body's weights one tensor each (Tensor.origin: where export writes
                      them); reverse_to_concat before it makes a REVERSE_V2 slices.  Both
                      run before dequantize.
* dequantize          int8/uint8/int16 (and int32 bias) tensors with quantization
                      parameters -> float32 (constants dequantized with their scales and
                      zero points), QUANTIZE/DEQUANTIZE ops dropped.
* cancel_transposes   the layout TRANSPOSEs that tico puts around NHWC kernels: sinks each
                      TRANSPOSE through elementwise ops (permuting broadcast constants),
                      reductions (remapping axes) and other transposes (composing), turns a
                      transpose that only moves size-1 dims into a RESHAPE, folds a
                      TRANSPOSE-RESHAPE-FULLY_CONNECTED flatten into the FC's weight columns
                      (not where export writes that weight back into the file),
                      merges transposes of one tensor by one perm, hoists one
                      TRANSPOSE out of a binary op whose inputs are all transposed by
                      the same perm (a residual ADD of two NCHW branches), merges
                      RESHAPE chains and deletes identities.  A transpose that cannot
                      be cancelled stays (a TRANSPOSE kernel runs it).
* fold_batchnorm      a MUL/ADD/SUB/DIV by a per-channel constant after CONV_2D,
                      DEPTHWISE_CONV_2D or FULLY_CONNECTED (tico's eval-mode BatchNorm2d)
                      folded into the layer's weight and bias, for frozen layers only.
* first_steps         tico's folded first RNN step (nn.GRU / nn.LSTM): copies of b_hh
                      -> the recurrent FC applied to a frozen zero state (tied to b_hh);
                      the zero state's constants frozen.
* scaled_copies       a layer tico copied scaled by beta (softplus's beta * linear(x))
                      -> MUL(the layer's output, beta).
* slices_to_split     STRIDED_SLICEs tiling one activation along one axis (an unrolled
                      RNN's time steps) -> one SPLIT_V.
* slice_to_strided    SLICE by constant begin and size (tico's padded
                      nn.ConvTranspose2d crops with one) -> STRIDED_SLICE, strides 1.
* fold_shapes         shape arithmetic the host knows (SHAPE of a tensor, and STRIDED_SLICE,
                      PACK, CONCATENATION, GATHER, CAST, RESHAPE, ADD/SUB/MUL/..., REDUCE_PROD/SUM of
                      integer constants: Keras's Reshape/Flatten with a dynamic batch)
                      computed once into constants.
* unit_reductions     a reduction over size-1 axes only -> a RESHAPE.
* conv3d_to_conv2d    a float CONV_3D -> a CONV_2D per output frame and depth tap (the
                      frames STRIDED_SLICEs, the taps' weights constants read by every
                      frame), ADDed, joined along H and RESHAPEd to the 5-D output.
* conv3d_transpose_to_2d  a float CONV_3D_TRANSPOSE -> a TRANSPOSE_CONV per input frame and
                      depth tap, summed into the output frame they reach, joined the same.
* mirror_pads         a MIRROR_PAD (REFLECT, SYMMETRIC; ONNX's edge) -> a GATHER of the
                      input's rows per padded axis, which gathers_to_slices makes slices
                      and a CONCATENATION (float and int8).
* depth_to_space      a DEPTH_TO_SPACE (a pixel shuffle; ONNX's CRD too) or SPACE_TO_DEPTH
                      -> per row offset a STRIDED_SLICE and a RESHAPE, CONCATENATED,
                      RESHAPEd (float and int8).
* padv2_to_pad        a float PADV2 (a constant value c) -> SUB c, PAD, ADD c.
* reduce_min_to_max   REDUCE_MIN that a max pool computes -> MUL by -1, REDUCE_MAX, MUL
                      by -1 (min(x) = -max(-x)), which the next pass makes a pool.
* reduce_max_to_pool  REDUCE_MAX over one run of axes (a global max pool) -> a
                      MAX_POOL_2D whose window is the reduced axes (RESHAPEs around it
                      where the input is not NHWC with H and W reduced).
* split_groups        a grouped CONV_2D (weight [O, kh, kw, I/G]) -> SPLIT -> a CONV_2D
                      per group -> CONCATENATION (one channel per group: a
                      DEPTHWISE_CONV_2D); join_groups undoes it for export.

Tensors are never renumbered by the passes (new ones are appended; dead ones stay unused
until inout.compact), and surviving Operator objects keep their identity, so a set of
trainable ops chosen on the original graph carries over.  inout.save_graph writes the
result as a circle file.
"""
from __future__ import annotations

from ..formats.circle_io import Graph
from .qparams import dequantize
from .shapes import fold_shapes
from .transposes import cancel_transposes
from .biases import conv_bias_adds, fc_bias_adds, fold_batchnorm, separable_biases
from .spellings import (constant_masks, cumsums_to_fc, frame_slices, gapped_means,
                        conv3d_to_conv2d, conv3d_transpose_to_2d, depth_to_space, padv2_to_pad, dilated_convs, elementwise_forms,
                        gathers_to_slices, mirror_pads, pack_to_concat,
                        reduce_max_to_pool, reduce_min_to_max, resize_to_concat, reversed_slices, unit_reductions, selects_to_relu, slice_to_strided,
                        slices_to_split, tile_to_concat, unpack_to_split)
from .embeddings import embedding_gathers, id_masks
from .groups import split_groups
from .loops import reverse_to_concat, unroll_loops
from .copies import first_steps, scaled_copies, still_shared, unshare_constants


# (run before dequantize: a loop's body is dequantized with the rest)
LOOP_PASSES = (('reversals', reverse_to_concat, True), ('loops', unroll_loops, True))
PASSES = (('unshared', unshare_constants, True), ('first_steps', first_steps, False),
          ('scaled_copies', scaled_copies, False),
          ('shapes', fold_shapes, True), ('conv3d', conv3d_to_conv2d, False),
          ('conv3d_transpose', conv3d_transpose_to_2d, False),
          ('mirrors', mirror_pads, True), ('depth_space', depth_to_space, True),
          ('pads', padv2_to_pad, False),
          ('frames', frame_slices, False), ('takes', gathers_to_slices, True),
          ('slices', slice_to_strided, True), ('reversed_slices', reversed_slices, False),
          ('embeddings', embedding_gathers, True),
          ('masks', id_masks, False), ('unpacks', unpack_to_split, True),
          ('packs', pack_to_concat, True), ('tiles', tile_to_concat, True),
          ('resizes', resize_to_concat, True), ('selects', selects_to_relu, False),
          ('const_masks', constant_masks, False), ('cumsums', cumsums_to_fc, False),
          ('elementwise', elementwise_forms, False), ('fc_biases', fc_bias_adds, False),
          ('transposes', cancel_transposes, True), ('batchnorm', fold_batchnorm, False),
          ('splits', slices_to_split, True), ('unit_reductions', unit_reductions, True),
          ('gapped_means', gapped_means, False),
          ('min_reductions', reduce_min_to_max, False), ('max_pools', reduce_max_to_pool, True),
          ('dilations', dilated_convs, True), ('conv_biases', conv_bias_adds, False),
          ('separable_biases', separable_biases, False),
          ('groups', split_groups, True))


def rewrite(g: Graph, keep=(), int8=False) -> dict:
    """All passes in order on g (in place).  ``keep``: Operator objects of the original
    graph that train (their BatchNorm stays separate).  int8: g trains as int8 (its
    tensors stay quantized): only the passes PASSES marks for it.  Returns
    {'dequantized': n tensors, 'quant': {...}, 'transposes': n, 'batchnorm': n, ...}."""
    # (a WHILE's body unrolled first: its float16 weights' DEQUANTIZEs are dequantized too)
    loops = {name: fn(g, int8=int8) if fn is unroll_loops else fn(g) for name, fn, _ in LOOP_PASSES}
    n, f16 = len(g.ops), any(t.dtype == 'float16' for t in g.tensors)
    quant = {} if int8 else dequantize(g)
    # (a float16 file's weights: float32 without scales to keep, its DEQUANTIZEs gone)
    moved = not int8 and (f16 or len(g.ops) != n)
    info = {'dequantized': len(quant), 'quant': quant, **loops}
    g.dequantized = bool(quant)     # (export --quantized writes weights back by name)
    for name, fn, on_int8 in PASSES:
        if int8 and not on_int8:
            info[name] = 0
            continue
        info[name] = (fn(g, keep={id(op) for op in keep}) if name in ('batchnorm', 'conv_biases')
                      else fn(g))
    if info['unshared']:    # (copies a later fold left unread are not counted)
        info['unshared_names'] = still_shared(g)
        info['unshared'] = sum(len(f) - 1 for f in info['unshared_names'])
    info['changed'] = bool(quant) or moved or any(info[name] for name, _, _ in PASSES + LOOP_PASSES
                                                  if name != 'embeddings')
    info['splits'] += info.pop('unpacks')       # (an UNPACK becomes a SPLIT)
    return info
