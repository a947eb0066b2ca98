"""Reading and rewriting circle (``CIR0``) and TFLite (``TFL3``) model files.

Both formats share the flatbuffers table layout for everything utrain needs, so both
are parsed with ONE's own bindings, ``circle_schema.v0_10`` (object API).

IR (host_tools/formats/ir.py; subgraph 0, ``n_subgraphs`` tells how many there are and
``subgraphs`` holds the others, {index: Graph}, which a WHILE op's options name):

* :class:`Tensor`   index, name, shape, dtype (numpy dtype name, or a clear name for
  types numpy lacks: 'bfloat16', 'int4', 'uint4', 'string', 'resource', 'variant',
  'ggml_q4_0', ..., 'mxfp4', 'mxint8'), data (constant data or None), buffer, quant.
* :class:`Operator` index, code, name, inputs (-1 = absent optional), outputs, options
  (fields of the builtin options table, snake_case, enums as names; for CUSTOM ops also
  ``custom_code`` (str) and ``custom_options`` (bytes)).
* :class:`Graph`    path, identifier, version, description, tensors, ops, inputs,
  outputs, metadata (name -> bytes), n_subgraphs.

Data of types numpy cannot represent is returned as raw ``uint8`` bytes (1-D) except
bfloat16, which is returned as ``uint16`` words reshaped to the tensor shape.

Buffers may hold their bytes inline (``data``) or, as large-model writers do, at
``offset``/``size`` in the file (offset > 1); both are read. Note that ONERT 0.1.0's
loader only looks at inline ``data`` (a model with offset buffers crashes it);
:func:`write_with_weights` always writes inline buffers (16-byte aligned).

Every problem with a file is reported as :class:`ModelError` (a ``ValueError`` whose
text is ``"<path>: <message>"``); exceptions raised by the flatbuffers runtime on
truncated or corrupt input are caught and rephrased.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import flatbuffers
import numpy as np

from circle_schema.v0_10 import circle as C

from .kinds import kind_of
from .ir import (AGAIN, OP_CODES, OP_NAMES, Graph, ModelError, Operator, Tensor, _enum_names,
                 atomic_write, check_path, drop_final_log_softmax,
                 drop_two_class_sigmoid)

__all__ = [
    "ModelError", "Tensor", "Operator", "Graph", "read_model", "write_with_weights",
    "tensor_data", "OP_NAMES", "OP_CODES", "TENSOR_TYPE_NAMES", "DTYPE_TO_TENSOR_TYPE",
    "options_class_for", "options_to_dict", "enum_value", "KNOWN_IDENTIFIERS",
]

KNOWN_IDENTIFIERS = (b"CIR0", b"TFL3")
_MIN_SIZE = 8                      # root offset (4) + file identifier (4)
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127


# --------------------------------------------------------------------------- tables

TENSOR_TYPE_NAMES: dict[int, str] = {
    code: name.lower() for code, name in _enum_names(C.TensorType.TensorType).items()
}
TENSOR_TYPE_NAMES[C.TensorType.TensorType.BOOL] = "bool"
TENSOR_TYPE_NAMES[C.TensorType.TensorType.STRING] = "string"
# numpy dtype for each type numpy can represent exactly
_NUMPY_DTYPES = {
    name: np.dtype(name) for name in (
        "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
        "uint16", "uint32", "uint64", "bool", "complex64", "complex128")
}
DTYPE_TO_TENSOR_TYPE: dict[str, int] = {
    name: code for code, name in TENSOR_TYPE_NAMES.items()}

_BUILTIN_OPTIONS_NAMES = _enum_names(C.BuiltinOptions.BuiltinOptions)
_BUILTIN_OPTIONS2_NAMES = _enum_names(C.BuiltinOptions2.BuiltinOptions2)

# enum-typed option fields (object-API attribute name -> enum class); per options table
# where one field name means different enums.
_ENUM_FIELDS: dict[str, Any] = {
    "fusedActivationFunction": C.ActivationFunctionType.ActivationFunctionType,
    "padding": C.Padding.Padding,
    "weightsFormat": C.FullyConnectedOptionsWeightsFormat.FullyConnectedOptionsWeightsFormat,
    "quantizedBiasType": C.TensorType.TensorType,
    "idxOutType": C.TensorType.TensorType,
    "inDataType": C.TensorType.TensorType,
    "outDataType": C.TensorType.TensorType,
    "outType": C.TensorType.TensorType,
    "outputType": C.TensorType.TensorType,
    "keyDtype": C.TensorType.TensorType,
    "valueDtype": C.TensorType.TensorType,
    "kernelType": C.LSTMKernelType.LSTMKernelType,
    "combiner": C.CombinerType.CombinerType,
    "reduceFunction": C.ReduceWindowFunction.ReduceWindowFunction,
    "algorithm": C.RngAlgorithm.RngAlgorithm,
    "compareType": C.StablehloComparisonType.StablehloComparisonType,
    "comparisonDirection": C.StablehloComparisonDirection.StablehloComparisonDirection,
    "compositeAttributesFormat": C.CustomOptionsFormat.CustomOptionsFormat,
}
_ENUM_FIELDS_BY_TABLE: dict[tuple[str, str], Any] = {
    ("LSHProjectionOptions", "type"): C.LSHProjectionType.LSHProjectionType,
    ("MirrorPadOptions", "mode"): C.MirrorPadMode.MirrorPadMode,
    ("RoPEOptions", "mode"): C.RoPEMode.RoPEMode,
}
_ENUM_NAME_CACHE: dict[Any, dict[int, str]] = {}


def _enum_for(table: str, attr: str, value) -> Any:
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return _ENUM_FIELDS_BY_TABLE.get((table, attr)) or _ENUM_FIELDS.get(attr)


def enum_value(enum_cls, value) -> int:
    """Enum name (case-insensitive) or int -> int value of ``enum_cls``."""
    if isinstance(value, str):
        v = getattr(enum_cls, value.upper(), None)
        if v is None:
            for k, kv in vars(enum_cls).items():
                if k.lower() == value.lower():
                    v = kv
        if not isinstance(v, int):
            raise ValueError(f"{value!r} is not a value of {enum_cls.__name__}: "
                             f"{sorted(_enum_names(enum_cls).values())}")
        return v
    return int(value)


def _camel_to_snake(name: str) -> str:
    s = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return v.item()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if hasattr(v, "__dict__") and not isinstance(v, type):
        return {_camel_to_snake(k): _plain(x) for k, x in vars(v).items()}
    return v


def options_to_dict(table: str, obj) -> dict:
    """Object-API options object -> {snake_case field: python value, enums as names}."""
    out = {}
    if obj is None:
        return out
    for attr, v in vars(obj).items():
        enum_cls = _enum_for(table, attr, v)
        if enum_cls is not None:
            names = _ENUM_NAME_CACHE.setdefault(enum_cls, _enum_names(enum_cls))
            v = names.get(v, v)
        else:
            v = _plain(v)
        out[_camel_to_snake(attr)] = v
    return out


# op name -> options table name, where the name is not simply the op name in CamelCase
_OPTIONS_OVERRIDES = {
    "AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions", "REDUCE_PROD": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions", "REDUCE_ALL": "ReducerOptions",
    "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions",
    "L2_NORMALIZATION": "L2NormOptions", "LOCAL_RESPONSE_NORMALIZATION":
    "LocalResponseNormalizationOptions", "LSH_PROJECTION": "LSHProjectionOptions",
    "SVDF": "SVDFOptions", "RNN": "RNNOptions", "LSTM": "LSTMOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    "EMBEDDING_LOOKUP_SPARSE": "EmbeddingLookupSparseOptions",
    "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
    "CONCATENATION": "ConcatenationOptions", "SELECT_V2": "SelectV2Options",
    "ARG_MAX": "ArgMaxOptions", "ARG_MIN": "ArgMinOptions",
    "CALL": "CallOptions", "SKIP_GRAM": "SkipGramOptions",
    "FAKE_QUANT": "FakeQuantOptions", "GELU": "GeluOptions",
    "CONV_3D_TRANSPOSE": "Conv3DOptions",
}


# ops whose options are another op's table (not named after them)
_OPTIONS_SHARED = {"CONV_3D_TRANSPOSE"}
# ops whose options hold what they compute (activation, axis, window, beta): every
# converter writes them (none of 871 models here lacks one; RESHAPE, TRANSPOSE, TILE...
# often have none); ONERT reads them unchecked (a segmentation fault on a file whose
# options type byte was zeroed)
_OPTIONS_NEEDED = {"SOFTMAX", "FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D",
                   "TRANSPOSE_CONV", "AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D",
                   "CONCATENATION", "ADD", "SUB", "MUL", "DIV", "MEAN", "SUM", "REDUCE_MAX",
                   "REDUCE_MIN", "REDUCE_PROD", "STRIDED_SLICE", "PACK", "UNPACK", "SPLIT",
                   "SPLIT_V", "GATHER", "LEAKY_RELU", "BATCH_MATMUL"}


def options_class_for(op_name: str) -> tuple[str, int, int] | None:
    """Op name -> (options table name, BuiltinOptions union value, which union: 1 or 2)."""
    want = _OPTIONS_OVERRIDES.get(op_name)
    if want is None:
        want = "".join(p.capitalize() for p in op_name.split("_")) + "Options"
    key = want.lower()
    for table, names in ((1, _BUILTIN_OPTIONS_NAMES), (2, _BUILTIN_OPTIONS2_NAMES)):
        for code, name in names.items():
            if code and name.lower() == key:
                return name, code, table
    return None


# --------------------------------------------------------------------------- parsing

class _CheckedBytes(bytes):
    """bytes whose slices fail when they run past the end (the flatbuffers runtime reads
    strings by slicing, which would otherwise silently return short strings)."""

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop = key.start, key.stop
            if (start is not None and start < 0) or (stop is not None and stop > len(self)):
                raise IndexError("read past the end of the buffer")
        return bytes.__getitem__(self, key)


def _reads_as_onnx(raw: bytes) -> bool:
    """Do these bytes parse as an ONNX model with a graph (onnx installed)?"""
    try:
        import onnx
        m = onnx.ModelProto()
        m.ParseFromString(raw)
        return bool(m.graph.node) and m.ir_version > 0
    except Exception:       # (not installed, or not protobuf: DecodeError, ...)
        return False


def _read_bytes(path) -> bytes:
    path = check_path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ModelError(path, f"cannot read: {e.strerror or e}") from e
    if not raw:
        raise ModelError(path, "file is empty" + AGAIN)
    if len(raw) < _MIN_SIZE:
        raise ModelError(path, f"file is too small to be a model ({len(raw)} bytes)" + AGAIN)
    ident = raw[4:8]
    if ident not in KNOWN_IDENTIFIERS:
        kind = kind_of(raw)
        if kind is None and _reads_as_onnx(raw):
            # (an .onnx saved under a .circle/.tflite name had been 'unknown file
            # identifier': it is a model, its name says another kind)
            suffix = os.path.splitext(path)[1] or 'with no suffix'
            raise ModelError(path, f"an ONNX model named {suffix}: utrain reads a file by its "
                                   "name's suffix; name it .onnx")
        raise ModelError(path, (f"not a model: it reads as {kind}" if kind else
                                f"unknown file identifier {ident!r} (expected b'CIR0' for circle or "
                                "b'TFL3' for TFLite)")
                         + "; give the model file (.circle, .tflite or .onnx) here")
    return raw


def _unpack(path, raw: bytes) -> "C.Model.ModelT":
    buf = _CheckedBytes(raw)
    try:
        root = flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0)
        if not 8 <= root < len(buf):
            raise IndexError("root table offset out of range")
        model = C.Model.ModelT.InitFromPackedBuf(buf, 0)
    except Exception as e:  # flatbuffers raises IndexError, struct.error, ValueError...
        raise ModelError(path, "not a valid flatbuffer model (truncated or corrupt: "
                               f"{type(e).__name__}: {e})" + AGAIN) from None
    return model


def _buffer_bytes(path, raw: bytes, model, bi: int, what: str) -> bytes | None:
    """Bytes of buffer ``bi`` (inline data or offset/size into the file); None if empty."""
    bufs = model.buffers or []
    if not 0 <= bi < len(bufs):
        raise ModelError(path, f"{what} refers to buffer {bi}, but the model has "
                               f"{len(bufs)} buffers" + AGAIN)
    b = bufs[bi]
    if b is None:
        return None
    if b.offset is not None and b.offset > 1:
        off, size = int(b.offset), int(b.size or 0)
        if off + size > len(raw):
            raise ModelError(path, f"buffer {bi} (offset {off}, size {size}) lies beyond "
                                   f"the end of the file ({len(raw)} bytes)" + AGAIN)
        return raw[off:off + size]
    if b.data is None or len(b.data) == 0:
        return None
    d = b.data
    return d.tobytes() if isinstance(d, np.ndarray) else bytes(d)


def _tensor_data(path, ti: int, t, dtype: str, shape: list[int], payload: bytes):
    # (the name decoded: it had been shown as b'w1')
    name = t.name.decode("utf-8", "replace") if isinstance(t.name, bytes) else (t.name or "")
    n = int(np.prod(shape, dtype=object)) if shape else 1
    if dtype in _NUMPY_DTYPES:
        npdt = _NUMPY_DTYPES[dtype]
        if len(payload) != n * npdt.itemsize:
            raise ModelError(path, f"tensor {ti} ({name!r}): constant data has "
                                   f"{len(payload)} bytes, but shape {shape} of "
                                   f"{dtype} needs {n * npdt.itemsize}" + AGAIN)
        return np.frombuffer(payload, dtype=npdt.newbyteorder("<")).astype(
            npdt, copy=True).reshape(shape)
    if dtype == "bfloat16":
        if len(payload) != 2 * n:
            raise ModelError(path, f"tensor {ti} ({name!r}): constant data has "
                                   f"{len(payload)} bytes, but shape {shape} of "
                                   f"bfloat16 needs {2 * n}" + AGAIN)
        return np.frombuffer(payload, dtype="<u2").astype(np.uint16).reshape(shape)
    return np.frombuffer(payload, dtype=np.uint8).copy()


def _index_vector(v):
    """The values of a SparseIndexVector (Int32Vector, Uint16Vector or Uint8Vector)."""
    vals = getattr(v, 'values', None) if v is not None else None
    return np.zeros(0, np.int64) if vals is None else np.asarray(vals, np.int64).reshape(-1)


def _densify(path, what: str, sp, dtype: str, shape: list[int], payload: bytes) -> np.ndarray:
    """The dense array of shape a sparse tensor's values (payload) and its
    SparsityParameters sp stand for, as TFLite's sparsity format converter (DENSIFY)
    makes it: the n dims of shape, of which block_map's are blocked, are n + k levels
    walked in traversal_order (the original dims first, then the k block dims), level i
    described by dim_metadata[i]: DENSE (its dense_size positions each) or SPARSE_CSR
    (of the entry the levels above reached, the indices array_indices[array_segments[p]
    : array_segments[p + 1]]); the payload holds one value per position walked to the
    end, in that order, every other element 0."""
    n = len(shape)
    order = [int(v) for v in (sp.traversalOrder if sp.traversalOrder is not None else range(n))]
    bmap = [int(v) for v in (sp.blockMap if sp.blockMap is not None else [])]
    dims, k = list(sp.dimMetadata or []), len(bmap)

    def bad(why):
        return ModelError(path, f"{what} is a sparse tensor whose sparsity parameters cannot "
                                f"be read ({why}): the file is damaged; convert the model again")
    if dtype not in _NUMPY_DTYPES:
        raise bad(f"values of type {dtype}")
    if len(order) != n + k or len(dims) != n + k or sorted(order[:n]) != list(range(n)) or \
            sorted(order[n:]) != list(range(n, n + k)) or any(not 0 <= b < n for b in bmap):
        raise bad(f"traversal_order {order}, block_map {bmap}, {len(dims)} dim_metadata for "
                  f"shape {shape}")
    bs = [int(dims[order[n + b]].denseSize or 0) for b in range(k)]
    if any(b < 1 or shape[d] % b for b, d in zip(bs, bmap)):
        raise bad(f"blocks {bs} of dims {bmap} do not divide shape {shape}")
    prev = np.zeros(1, np.int64)            # the entry of each position walked so far
    idx = np.zeros((1, 0), np.int64)        # its index at each level
    for dm in dims:
        if int(dm.format or 0) == 0:        # DENSE
            m = int(dm.denseSize or 0)
            prev = (prev[:, None] * m + np.arange(m)).reshape(-1)
            idx = np.concatenate([np.repeat(idx, m, axis=0),
                                  np.tile(np.arange(m), len(idx))[:, None]], axis=1)
            continue
        seg, ind = _index_vector(dm.arraySegments), _index_vector(dm.arrayIndices)
        if len(prev) and (prev.max() + 1 >= len(seg) or seg[-1] > len(ind) or
                          np.any(np.diff(seg) < 0)):
            raise bad(f"array_segments of {len(seg)} for {prev.max() + 2} entries, "
                      f"{len(ind)} indices")
        lo, hi = seg[prev], seg[prev + 1]
        pos = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)] or [np.zeros(0, np.int64)])
        idx = np.concatenate([np.repeat(idx, hi - lo, axis=0), ind[pos][:, None]], axis=1)
        prev = pos
    npdt = _NUMPY_DTYPES[dtype]
    if len(payload) != len(prev) * npdt.itemsize:
        raise bad(f"{len(payload)} bytes of values for {len(prev)} positions")
    vals = np.frombuffer(payload, dtype=npdt.newbyteorder("<")).astype(npdt)
    at = [None] * n
    for lv in range(n):
        at[order[lv]] = idx[:, lv]
    for lv in range(n, n + k):
        b = order[lv] - n
        at[bmap[b]] = at[bmap[b]] * bs[b] + idx[:, lv]
    if any(np.any(a < 0) or np.any(a >= s) for a, s in zip(at, shape)):
        raise bad(f"an index beyond shape {shape}")
    dense = np.zeros(shape, npdt)
    dense[tuple(at)] = vals
    return dense


def _op_code(oc) -> int:
    """max(builtin_code, deprecated_builtin_code), except for circle extension ops
    (negative codes): their builtin_code is negative and the int8 deprecated field holds
    either the placeholder 127 or (as ONE's exporter writes it) the same negative code;
    files from before the builtin_code field have only the deprecated field."""
    b = int(oc.builtinCode or 0)
    d = int(oc.deprecatedBuiltinCode or 0)
    if b < 0:
        return b
    if b == 0 and d < 0:
        return d
    return max(b, d)


def _quant_dict(q) -> dict | None:
    if q is None:
        return None
    scale = _plain(q.scale) if q.scale is not None else []
    zp = _plain(q.zeroPoint) if q.zeroPoint is not None else []
    if not scale and not zp:
        return None
    return {"scale": [float(s) for s in scale], "zero_point": [int(z) for z in zp],
            "quantized_dimension": int(q.quantizedDimension or 0)}


# ops of a file whose weights are resource variables (TensorFlow's, read at run time)
_RESOURCE_OPS = ('VAR_HANDLE', 'READ_VARIABLE', 'ASSIGN_VARIABLE')


def _subgraph(path, raw: bytes, model, si: int):
    """Subgraph si of the file: (tensors, ops, inputs, outputs), indices checked; the
    messages of a subgraph past the first name it."""
    sg = model.subgraphs[si]
    at = f"subgraph {si}: " if si else ""
    tensors_t = sg.tensors or []
    nt = len(tensors_t)
    tensors: list[Tensor] = []
    for ti, t in enumerate(tensors_t):
        ttype = int(t.type or 0)
        dtype = TENSOR_TYPE_NAMES.get(ttype)
        if dtype is None:
            raise ModelError(path, f"{at}tensor {ti}: unknown tensor type {ttype}" + AGAIN)
        shape = [int(s) for s in (t.shape if t.shape is not None else [])]
        name = t.name.decode("utf-8", "replace") if isinstance(t.name, bytes) else (t.name or "")
        bi = int(t.buffer or 0)
        payload = _buffer_bytes(path, raw, model, bi, f"{at}tensor {ti} ({name!r})")
        data = None
        if payload is not None and getattr(t, 'sparsity', None) is not None:
            # (TFLite's sparse format: tf.lite.Optimize.EXPERIMENTAL_SPARSITY's weights,
            # read by a DENSIFY op): the dense tensor, which the model computes with
            data = _densify(path, f"{at}tensor {ti} ({name!r})", t.sparsity, dtype, shape, payload)
        elif payload is not None:
            data = _tensor_data(path, ti, t, dtype, shape, payload)
        sig = [int(d) for d in t.shapeSignature] if t.shapeSignature is not None else None
        tensors.append(Tensor(ti, name, shape, dtype, data, bi, _quant_dict(t.quantization),
                              sig if sig and len(sig) == len(shape) else None))

    opcodes = model.operatorCodes or []
    ops: list[Operator] = []
    for oi, o in enumerate(sg.operators or []):
        ci = int(o.opcodeIndex or 0)
        if not 0 <= ci < len(opcodes):
            raise ModelError(path, f"{at}operator {oi}: opcode index {ci} out of range "
                                   f"({len(opcodes)} operator codes)" + AGAIN)
        oc = opcodes[ci]
        code = _op_code(oc)
        name = OP_NAMES.get(code, f"UNKNOWN_{code}")
        ins = [int(i) for i in (o.inputs if o.inputs is not None else [])]
        outs = [int(i) for i in (o.outputs if o.outputs is not None else [])]
        for kind, lst, lo in (("input", ins, -1), ("output", outs, 0)):
            for i in lst:
                if not lo <= i < nt:
                    raise ModelError(path, f"{at}operator {oi} ({name}): {kind} tensor index "
                                           f"{i} out of range ({nt} tensors)" + AGAIN)
        options: dict = {}
        if not o.builtinOptionsType and name in _OPTIONS_NEEDED:
            raise ModelError(path, f"{at}operator {oi} ({name}): its {options_class_for(name)[0]} "
                                   "are missing: the file is damaged; use the original (or export "
                                   "it again)")
        want = options_class_for(name) if o.builtinOptionsType else None
        if want and want[2] == 1 and want[1] != o.builtinOptionsType and \
                name not in _OPTIONS_SHARED:
            # (ONERT and TFLite Micro read the options as the op's own table: a segmentation
            # fault, no message, on a file with one bit flipped there)
            raise ModelError(path, f"{at}operator {oi} ({name}): its options are "
                                   f"{_BUILTIN_OPTIONS_NAMES.get(o.builtinOptionsType, o.builtinOptionsType)}"
                                   f", {name} takes {want[0]}: the file is damaged; use the "
                                   "original (or export it again)")
        if o.builtinOptionsType:
            table = _BUILTIN_OPTIONS_NAMES.get(o.builtinOptionsType, "")
            options.update(options_to_dict(table, o.builtinOptions))
        if getattr(o, "builtinOptions2Type", 0):
            table = _BUILTIN_OPTIONS2_NAMES.get(o.builtinOptions2Type, "")
            options.update(options_to_dict(table, o.builtinOptions2))
        if name == "CUSTOM":
            cc = oc.customCode
            options["custom_code"] = cc.decode("utf-8", "replace") if isinstance(
                cc, bytes) else (cc or "")
            co = o.customOptions
            options["custom_options"] = bytes(np.asarray(co, dtype=np.uint8)) \
                if co is not None else b""
        for key in ("cond_subgraph_index", "body_subgraph_index", "then_subgraph_index",
                    "else_subgraph_index", "subgraph", "init_subgraph_index"):
            v = options.get(key)        # (WHILE, IF, CALL, CALL_ONCE: the subgraphs they run)
            if isinstance(v, int) and not 0 < v < len(model.subgraphs):
                raise ModelError(path, f"{at}operator {oi} ({name}): its {key} {v} is not a "
                                       f"subgraph of the file ({len(model.subgraphs)} subgraphs)"
                                 + AGAIN)
        ops.append(Operator(oi, code, name, ins, outs, options, src=oi))

    gin = [int(i) for i in (sg.inputs if sg.inputs is not None else [])]
    gout = [int(i) for i in (sg.outputs if sg.outputs is not None else [])]
    for kind, lst in (("input", gin), ("output", gout)):
        for i in lst:
            if not 0 <= i < nt:
                raise ModelError(path, f"{at}subgraph {kind} tensor index {i} out of range "
                                       f"({nt} tensors)" + AGAIN)
    return tensors, ops, gin, gout


def _graph_from(path, raw: bytes, model) -> Graph:
    if not model.subgraphs:
        raise ModelError(path, "model has no subgraphs" + AGAIN)
    tensors, ops, gin, gout = _subgraph(path, raw, model, 0)

    var = next((op for op in ops if op.name in _RESOURCE_OPS), None)
    if var is not None:     # (every command would fail on it later, inspect with a traceback)
        raise ModelError(path, f"op {var.index} is {var.name}: the model's weights are resource "
                               "variables the file reads at run time, not constants in it "
                               "(TFLiteConverter.from_concrete_functions([f], model) writes "
                               "them so); convert again with "
                               "TFLiteConverter.from_keras_model(model), or "
                               "from_concrete_functions([f]) without the model")

    for sd in (model.signatureDefs or [])[:1]:     # (Keras's names and order of its inputs
        if int(sd.subgraphIndex or 0) != 0:        # and outputs)
            continue
        for maps, lst in ((sd.inputs, gin), (sd.outputs, gout)):
            for place, tm in enumerate(maps or []):
                k = int(tm.tensorIndex or 0)
                nm = tm.name.decode("utf-8", "replace") if isinstance(tm.name, bytes) else tm.name
                if k in lst and nm:
                    tensors[k].sig = (place, nm)

    metadata: dict[str, bytes] = {}
    for m in model.metadata or []:
        mname = m.name.decode("utf-8", "replace") if isinstance(m.name, bytes) else (m.name or "")
        payload = _buffer_bytes(path, raw, model, int(m.buffer or 0), f"metadata {mname!r}")
        metadata[mname] = payload or b""

    desc = model.description
    desc = desc.decode("utf-8", "replace") if isinstance(desc, bytes) else (desc or "")
    g = Graph(path=os.fspath(path), identifier=bytes(raw[4:8]),
              version=int(model.version or 0), description=desc, tensors=tensors,
              ops=ops, inputs=gin, outputs=gout, metadata=metadata,
              n_subgraphs=len(model.subgraphs))
    g.subgraphs = {si: Graph(path=g.path, identifier=g.identifier, version=g.version,
                             description='', tensors=t, ops=o, inputs=i, outputs=u,
                             metadata={}, n_subgraphs=1)
                   for si in range(1, len(model.subgraphs))
                   for t, o, i, u in [_subgraph(path, raw, model, si)]}
    return g


_READ = {}      # the last few circle files read: {(path, size, mtime): Graph}


def _quantize_shapes(g: Graph) -> None:
    """A QUANTIZE or DEQUANTIZE output the file gives no shape ([]) for a tensor of some
    (a quantization-aware-trained Keras model converted without quantizing: a weight's
    fake-quant pair, QUANTIZE of the constant [2, 8] -> [] -> DEQUANTIZE -> [] read as
    the FULLY_CONNECTED's weight, which prepare refused as not fitting) has its input's
    shape, as the runtime gives it."""
    for op in g.ops:
        if op.name in ('QUANTIZE', 'DEQUANTIZE') and op.inputs and op.outputs and \
                min(op.inputs[0], op.outputs[0]) >= 0:
            x, y = g.tensors[op.inputs[0]], g.tensors[op.outputs[0]]
            if not y.shape and x.shape:
                y.shape = list(x.shape)


def _fold_densify(g: Graph) -> None:
    """A DENSIFY of a constant (a sparse weight, which the reader made dense: _densify)
    is taken out of g, its readers reading the constant; the other ops keep their
    numbers in the file (Operator.src)."""
    gone = [op for op in g.ops if op.name == 'DENSIFY' and len(op.inputs) == 1 and
            len(op.outputs) == 1 and g.tensors[op.inputs[0]].data is not None and
            op.outputs[0] not in g.outputs]
    for op in gone:
        for o in g.ops:
            o.inputs = [op.inputs[0] if i == op.outputs[0] else i for i in o.inputs]
        g.ops.remove(op)
    for i, o in enumerate(g.ops if gone else ()):
        o.src = o.number
        o.index = i


def read_model(path) -> Graph:
    """Read subgraph 0 of a circle or TFLite model file, or an .onnx model translated into
    the same IR (host_tools/formats/onnx_io.py). Raises :class:`ModelError`.  A circle
    file read again unchanged (size and time; --select's trials prepare one model dozens
    of times) is a copy of the graph read before (a twentieth of the time)."""
    from .onnx_io import is_onnx, read_onnx
    if is_onnx(path):
        g = read_onnx(path)
        drop_final_log_softmax(g)
        drop_two_class_sigmoid(g)
        return g
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key in _READ:
        return copy.deepcopy(_READ[key])
    raw = _read_bytes(path)
    model = _unpack(path, raw)
    g = _graph_from(path, raw, model)
    for sub in [g] + list((g.subgraphs or {}).values()):
        _fold_densify(sub)
    _quantize_shapes(g)
    drop_final_log_softmax(g)
    drop_two_class_sigmoid(g)
    if key is not None:
        if len(_READ) >= 4:
            _READ.pop(next(iter(_READ)))
        _READ[key] = copy.deepcopy(g)
    return g


def tensor_data(path) -> dict[int, np.ndarray]:
    """All constant tensors of subgraph 0: {tensor index: data}."""
    return {t.index: t.data for t in read_model(path).tensors if t.data is not None}


# --------------------------------------------------------------------------- writing

class _AlignedBufferT(C.Buffer.BufferT):
    """BufferT whose data vector is 16-byte aligned, as TFLite's converter writes it."""

    def Pack(self, builder):
        data = None
        if self.data is not None:
            payload = self.data.tobytes() if isinstance(self.data, np.ndarray) else bytes(self.data)
            builder.StartVector(1, len(payload), 16)
            builder.head = builder.head - len(payload)
            builder.Bytes[builder.head:builder.head + len(payload)] = payload
            builder.vectorNumElems = len(payload)
            data = builder.EndVector()
        C.Buffer.BufferStart(builder)
        if data is not None:
            C.Buffer.BufferAddData(builder, data)
        if self.offset:
            C.Buffer.BufferAddOffset(builder, self.offset)
        if self.size:
            C.Buffer.BufferAddSize(builder, self.size)
        return C.Buffer.BufferEnd(builder)


def quant_params(quant: dict):
    """circle's QuantizationParameters of a tensor's quant {'scale', 'zero_point',
    'quantized_dimension'} (as Tensor.quant holds it)."""
    q = C.QuantizationParameters.QuantizationParametersT()
    q.scale = [float(s) for s in quant.get("scale", [])]
    q.zeroPoint = [int(z) for z in quant.get("zero_point", [])]
    q.quantizedDimension = int(quant.get("quantized_dimension", 0))
    return q


def _aligned_buffer(data: bytes | None) -> _AlignedBufferT:
    b = _AlignedBufferT()
    b.data = None if data is None else np.frombuffer(bytes(data), dtype=np.uint8)
    return b


def pack_model(model, identifier: bytes) -> bytes:
    """Serialize an object-API ModelT (buffers packed 16-byte aligned)."""
    model.buffers = [b if isinstance(b, _AlignedBufferT) else _rebox(b)
                     for b in (model.buffers or [])]
    size_hint = 1024 + sum(len(b.data) if b.data is not None else 0 for b in model.buffers)
    builder = flatbuffers.Builder(size_hint)
    root = model.Pack(builder)
    builder.Finish(root, file_identifier=identifier)
    return bytes(builder.Output())


def _rebox(b) -> _AlignedBufferT:
    nb = _AlignedBufferT()
    if b is not None:
        nb.data, nb.offset, nb.size = b.data, b.offset, b.size
    return nb


def _dense_in_file(model, si: int, k: int) -> None:
    """Sparse tensor k of subgraph si, given dense data, made a dense tensor of the model
    object: its sparsity parameters gone, and a DENSIFY reading it taken out (its readers
    read k), as TFLite's DENSIFY runs on sparse tensors only."""
    sg = model.subgraphs[si]
    sg.tensors[k].sparsity = None
    codes = [_op_code(oc) for oc in model.operatorCodes or []]
    for o in list(sg.operators or []):
        ins = [int(i) for i in (o.inputs if o.inputs is not None else [])]
        if codes[int(o.opcodeIndex or 0)] != OP_CODES['DENSIFY'] or ins != [k]:
            continue
        y = int(o.outputs[0])
        sg.operators.remove(o)
        for r in sg.operators:
            if r.inputs is not None:
                r.inputs = [k if int(i) == y else int(i) for i in r.inputs]
        if sg.outputs is not None:
            sg.outputs = [k if int(i) == y else int(i) for i in sg.outputs]


def write_with_weights(src_path, out_path, new_data: dict[int, np.ndarray],
                       identifier: bytes | None = None, edit=None) -> None:
    """Copy ``src_path`` to ``out_path`` with the constant data of tensors replaced.

    ``new_data`` maps tensor index (subgraph 0) -> array of the tensor's dtype and shape.
    Everything else (identifier unless given: b'CIR0' or b'TFL3', metadata, other
    buffers, options) is kept. Buffers
    given by offset/size are stored inline in the copy. A buffer shared with another
    tensor (or with metadata) is not touched: the tensor gets a new buffer.
    """
    raw = _read_bytes(src_path)
    model = _unpack(src_path, raw)
    graph = _graph_from(src_path, raw, model)  # validates indices and sizes

    # materialise offset/size buffers: their offsets would not survive repacking
    bufs = []
    for bi, b in enumerate(model.buffers or []):
        nb = _AlignedBufferT()
        if b is not None:
            payload = _buffer_bytes(src_path, raw, model, bi, f"buffer {bi}")
            if payload is not None or (b.data is not None):
                nb.data = np.frombuffer(payload or b"", dtype=np.uint8)
        bufs.append(nb)
    model.buffers = bufs

    users: dict[int, int] = {}
    for sg in model.subgraphs:
        for t in sg.tensors or []:
            users[int(t.buffer or 0)] = users.get(int(t.buffer or 0), 0) + 1
    for m in model.metadata or []:
        users[int(m.buffer or 0)] = users.get(int(m.buffer or 0), 0) + 1

    for key, arr in new_data.items():
        si, k = (int(key[0]), int(key[1])) if isinstance(key, tuple) else (0, int(key))
        sub = graph if si == 0 else (graph.subgraphs or {}).get(si)
        if sub is None:
            raise ModelError(src_path, f"subgraph {si} does not exist "
                                       f"({graph.n_subgraphs} subgraphs)")
        if not 0 <= k < len(sub.tensors):
            raise ModelError(src_path, f"tensor {k} does not exist "
                                       f"({len(sub.tensors)} tensors)")
        t = sub.tensors[k]
        if t.data is None:
            raise ModelError(src_path, f"tensor {k} ({t.name!r}) has no constant data "
                                       "to replace")
        arr = np.asarray(arr)
        if t.dtype not in _NUMPY_DTYPES and t.dtype != "bfloat16":
            raise ModelError(src_path, f"tensor {k} ({t.name!r}): replacing data of "
                                       f"type {t.dtype} is not supported")
        want_dt = np.dtype(np.uint16) if t.dtype == "bfloat16" else _NUMPY_DTYPES[t.dtype]
        if arr.dtype != want_dt:
            raise ModelError(src_path, f"tensor {k} ({t.name!r}): new data is {arr.dtype}, "
                                       f"the tensor is {t.dtype}")
        if list(arr.shape) != list(t.shape):
            raise ModelError(src_path, f"tensor {k} ({t.name!r}): new data has shape "
                                       f"{list(arr.shape)}, the tensor has {t.shape}")
        payload = np.ascontiguousarray(arr, dtype=want_dt.newbyteorder("<")).tobytes()
        bi = t.buffer
        if bi == 0 or users.get(bi, 0) > 1:
            users[bi] -= 1
            model.buffers.append(_aligned_buffer(payload))
            bi = len(model.buffers) - 1
            users[bi] = 1
            model.subgraphs[si].tensors[k].buffer = bi
        else:
            model.buffers[bi] = _aligned_buffer(payload)
        if model.subgraphs[si].tensors[k].sparsity is not None:
            _dense_in_file(model, si, k)

    if edit is not None:        # (formats.batch: tensor shapes and RESHAPE options)
        edit(model)
    data = pack_model(model, identifier or bytes(raw[4:8]))
    atomic_write(out_path, data)
