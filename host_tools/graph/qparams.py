"""Quantized tensors: quantize/dequantize with a tensor's scales and zero points, and
dequantize, the pass that makes an int8/uint8/int16 graph float32."""
from __future__ import annotations

import numpy as np

from ..formats.circle_io import Graph
from .edit import QUANT_TYPES, bypass, remove_op


def _qparams(quant, ndim):
    """(scale, zero point) as float64 arrays broadcasting over a tensor of ``ndim`` dims
    (per-axis along quantized_dimension)."""
    scale = np.asarray(quant['scale'], np.float64)
    zp = np.asarray(quant.get('zero_point') or [0] * len(scale), np.float64)
    if scale.size > 1:
        shp = [1] * ndim
        shp[quant.get('quantized_dimension', 0)] = scale.size
        scale, zp = scale.reshape(shp), zp.reshape(shp)
    return scale, zp


def _dequant(data, quant):
    q = np.asarray(data, np.float64)
    scale, zp = _qparams(quant, q.ndim)
    return ((q - zp) * scale).astype(np.float32)


def quantize(data, quant, dtype):
    """float array -> integers of ``dtype`` with the tensor's scale(s) and zero point(s),
    rounded to nearest and clipped to the type's range; returns (array, n clipped)."""
    x = np.asarray(data, np.float64)
    scale, zp = _qparams(quant, x.ndim)
    q = np.round(x / scale) + zp
    info = np.iinfo(np.dtype(dtype))
    clipped = int(((q < info.min) | (q > info.max)).sum())
    return np.clip(q, info.min, info.max).astype(dtype), clipped


def dequantize(g: Graph) -> dict:
    """Quantized tensors -> float32 in place; QUANTIZE/DEQUANTIZE ops removed.  Returns
    {tensor name: (original dtype, quant params)} for re-quantizing on export."""
    origin = {}
    for t in g.tensors:
        if t.dtype == 'float16' and t.data is not None:
            t.data, t.dtype = t.data.astype(np.float32), 'float32'
            continue
        if t.dtype not in QUANT_TYPES or not t.quant or not t.quant.get('scale'):
            continue
        origin[t.name] = (t.dtype, dict(t.quant))
        if t.data is not None:
            t.data = _dequant(t.data, t.quant)
        t.dtype, t.quant = 'float32', None
    for op in list(g.ops):
        if op.name in ('QUANTIZE', 'DEQUANTIZE') and op in g.ops:
            a, b = op.inputs[0], op.outputs[0]
            if g.tensors[a].dtype == g.tensors[b].dtype == 'float32':
                if a in g.inputs and b not in g.outputs:
                    # the model's input becomes float: drop the op, readers take the input
                    for o in g.ops:
                        o.inputs = [a if k == b else k for k in o.inputs]
                    remove_op(g, op)
                else:
                    bypass(g, op, a, b)
    return origin
