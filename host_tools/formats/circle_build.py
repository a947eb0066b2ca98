"""A small builder of circle / TFLite test and example models (object API).

    b = CircleBuilder(identifier=b'CIR0')
    x = b.tensor('x', [1, 64])                      # activation / input (float32)
    w = b.tensor('w', [32, 64], data=w_array)       # constant, own buffer, dtype of data
    y = b.tensor('y', [1, 32])
    b.op('FULLY_CONNECTED', [x, w, bias], [y], fused_activation_function='RELU')
    b.inputs(x); b.outputs(y); b.metadata('CIRCLE_TRAINING', blob)
    data = b.build(); b.save(path)

Options: the builtin options table is found from the op name (FULLY_CONNECTED ->
FullyConnectedOptions, MAX_POOL_2D -> Pool2DOptions, MEAN -> ReducerOptions, ...); the
keyword arguments are snake_case names of its fields, enums given by name ('RELU',
'SAME', ...) or value. Ops that have an options table always get one (converters do
so), filled with the schema defaults, except stride_w/stride_h which default to 1.
Buffer 0 is the empty sentinel; non-constant tensors use it. RESHAPE given only its
data input and ``new_shape=`` also gets a constant int32 shape tensor as second input,
as converters write it (ONERT refuses a RESHAPE without it).
"""

from __future__ import annotations

import copy
import os

import numpy as np

from circle_schema.v0_10 import circle as C

from .circle_io import (DTYPE_TO_TENSOR_TYPE, OP_CODES, _ENUM_FIELDS, _ENUM_FIELDS_BY_TABLE,
                        _aligned_buffer, _camel_to_snake, atomic_write, enum_value,
                        options_class_for, pack_model, quant_params)

__all__ = ["CircleBuilder"]

_PLACEHOLDER_FOR_GREATER_OP_CODES = 127


def _np_of(tensor_type: int):
    """The numpy dtype of a circle tensor type."""
    return np.dtype(next(n for n, v in DTYPE_TO_TENSOR_TYPE.items() if v == tensor_type))


def _options_object(table: str):
    mod = getattr(C, table)
    return getattr(mod, table + "T")()


class CircleBuilder:
    def __init__(self, identifier: bytes = b"CIR0", description: str = "utrain circle_build",
                 version: int = 3):
        if identifier not in (b"CIR0", b"TFL3"):
            raise ValueError(f"identifier must be b'CIR0' or b'TFL3', not {identifier!r}")
        self.identifier = identifier
        self.description = description
        self.version = version
        self._tensors: list = []
        self._buffers: list = [_aligned_buffer(None)]      # buffer 0: empty sentinel
        self._ops: list = []
        self._opcodes: list = []
        self._opcode_index: dict[tuple[int, str], int] = {}
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._metadata: list = []

    # ---------------------------------------------------------------- tensors
    def tensor(self, name: str, shape, data=None, dtype=None, quant: dict | None = None,
               signature=None) -> int:
        """Add a tensor; returns its index. With ``data`` it is a constant with its own
        buffer (dtype of the data unless ``dtype`` given; float32 for Python lists).
        ``signature``: the shape with -1 where a dimension is known only at run time
        (as converters write a batch left open)."""
        shape = [int(s) for s in shape]
        if data is not None:
            if dtype is None:
                dtype = data.dtype if isinstance(data, np.ndarray) else np.float32
            arr = np.asarray(data, dtype=np.dtype(dtype))
            if arr.size != int(np.prod(shape)):
                raise ValueError(f"tensor {name!r}: data has {arr.size} elements, shape "
                                 f"{shape} needs {int(np.prod(shape))}")
            arr = np.ascontiguousarray(arr.reshape(shape),
                                       dtype=arr.dtype.newbyteorder("<"))
            self._buffers.append(_aligned_buffer(arr.tobytes()))
            buffer = len(self._buffers) - 1
        else:
            buffer = 0
        dname = np.dtype(dtype).name if dtype is not None else "float32"
        if dname not in DTYPE_TO_TENSOR_TYPE:
            raise ValueError(f"tensor {name!r}: unsupported dtype {dname}")
        t = C.Tensor.TensorT()
        t.name = name
        t.shape = shape
        t.type = DTYPE_TO_TENSOR_TYPE[dname]
        t.buffer = buffer
        if signature is not None:
            t.shapeSignature = [int(s) for s in signature]
        if quant is not None:
            t.quantization = quant_params(quant)
        self._tensors.append(t)
        return len(self._tensors) - 1

    def sparse(self, k: int, values, traversal_order, block_map, dim_metadata) -> None:
        """Constant tensor k stored in TFLite's sparse format (as
        tf.lite.Optimize.EXPERIMENTAL_SPARSITY writes it): its buffer the values walked,
        dim_metadata a (format, dense_size, array_segments, array_indices) per level,
        format 'DENSE' or 'SPARSE_CSR' (the index arrays int32)."""
        t = self._tensors[k]
        arr = np.asarray(values, _np_of(t.type)).astype(_np_of(t.type).newbyteorder("<"))
        self._buffers[t.buffer] = _aligned_buffer(arr.tobytes())
        sp = C.SparsityParameters.SparsityParametersT()
        sp.traversalOrder, sp.blockMap = list(traversal_order), list(block_map)
        sp.dimMetadata = []
        for fmt, size, seg, ind in dim_metadata:
            d = C.DimensionMetadata.DimensionMetadataT()
            d.format = getattr(C.DimensionType.DimensionType, fmt)
            d.denseSize = int(size)
            for attr, v in (('arraySegments', seg), ('arrayIndices', ind)):
                if v is not None:
                    vec = C.Int32Vector.Int32VectorT()
                    vec.values = [int(i) for i in v]
                    setattr(d, attr, vec)
                    setattr(d, attr + 'Type', C.SparseIndexVector.SparseIndexVector.Int32Vector)
            sp.dimMetadata.append(d)
        t.sparsity = sp

    # ---------------------------------------------------------------- operators
    def _opcode(self, code: int, custom_code: str | None = None) -> int:
        key = (code, custom_code or "")
        if key not in self._opcode_index:
            oc = C.OperatorCode.OperatorCodeT()
            oc.builtinCode = code
            # as ONE's exporter (luci) does: codes below 127, negative circle extension
            # codes included, also go into the int8 deprecated field (ONERT's loader reads
            # that field whenever builtin_code < 127); larger codes get the placeholder 127.
            oc.deprecatedBuiltinCode = code if code < _PLACEHOLDER_FOR_GREATER_OP_CODES \
                else _PLACEHOLDER_FOR_GREATER_OP_CODES
            oc.version = 1
            if custom_code:
                oc.customCode = custom_code
            self._opcodes.append(oc)
            self._opcode_index[key] = len(self._opcodes) - 1
        return self._opcode_index[key]

    def op(self, name, inputs, outputs, **options) -> int:
        """Add an operator (name from BuiltinOperator, or its int code); returns its index."""
        if isinstance(name, str):
            if name.upper() not in OP_CODES:
                raise ValueError(f"unknown operator {name!r}")
            code, name = OP_CODES[name.upper()], name.upper()
        else:
            code = int(name)
            name = next(k for k, v in OP_CODES.items() if v == code)
        nt = len(self._tensors)
        for i in list(inputs) + list(outputs):
            if not -1 <= int(i) < nt:
                raise ValueError(f"{name}: tensor index {i} out of range ({nt} tensors)")
        inputs = [int(i) for i in inputs]
        if name == "RESHAPE" and len(inputs) == 1 and options.get("new_shape") is not None:
            # ONERT (like TFLite's converter output) wants the shape as a second input
            shp = [int(s) for s in options["new_shape"]]
            inputs.append(self.tensor(f"{self._tensors[inputs[0]].name}/shape", [len(shp)],
                                      data=np.array(shp, np.int32)))
        o = C.Operator.OperatorT()
        custom_code = options.pop("custom_code", None)
        custom_options = options.pop("custom_options", None)
        o.opcodeIndex = self._opcode(code, custom_code)
        o.inputs = [int(i) for i in inputs]
        o.outputs = [int(i) for i in outputs]
        if custom_options is not None:
            o.customOptions = list(bytes(custom_options))
        found = options_class_for(name)
        if found is None:
            if options:
                raise ValueError(f"{name} has no options table; got {sorted(options)}")
        else:
            table, union_code, which = found
            obj = _options_object(table)
            fields = {_camel_to_snake(a): a for a in vars(obj)}
            for a in ("strideW", "strideH", "strideD"):
                if hasattr(obj, a):
                    setattr(obj, a, 1)
            for key, value in options.items():
                if key not in fields:
                    raise ValueError(f"{name}: {table} has no field {key!r}; fields: "
                                     f"{sorted(fields)}")
                attr = fields[key]
                enum_cls = _ENUM_FIELDS_BY_TABLE.get((table, attr)) or _ENUM_FIELDS.get(attr)
                if enum_cls is not None and not isinstance(value, bool):
                    value = enum_value(enum_cls, value)
                elif isinstance(value, np.ndarray):
                    value = value.tolist()
                elif isinstance(value, tuple):
                    value = list(value)
                setattr(obj, attr, value)
            if which == 1:
                o.builtinOptionsType, o.builtinOptions = union_code, obj
            else:
                o.builtinOptions2Type, o.builtinOptions2 = union_code, obj
        self._ops.append(o)
        return len(self._ops) - 1

    def inputs(self, *idx) -> None:
        self._inputs.extend(int(i) for i in idx)

    def outputs(self, *idx) -> None:
        self._outputs.extend(int(i) for i in idx)

    def signature(self, inputs, outputs, key='serving_default') -> None:
        """A SignatureDef of subgraph 0: inputs and outputs [(name, tensor index)] (a
        Keras model's names, which TFLite's get_signature_runner reads)."""
        def maps(pairs):
            out = []
            for name, k in pairs:
                t = C.TensorMap.TensorMapT()
                t.name, t.tensorIndex = name, int(k)
                out.append(t)
            return out
        sd = C.SignatureDef.SignatureDefT()
        sd.signatureKey, sd.inputs, sd.outputs = key, maps(inputs), maps(outputs)
        self._signatures = [sd]

    def metadata(self, name: str, data: bytes) -> None:
        self._buffers.append(_aligned_buffer(bytes(data)))
        m = C.Metadata.MetadataT()
        m.name = name
        m.buffer = len(self._buffers) - 1
        self._metadata.append(m)

    def subgraph(self, sub: "CircleBuilder", name: str = "body") -> int:
        """Add the tensors, ops, inputs and outputs of builder ``sub`` as another subgraph
        of this model (a WHILE's cond or body, which the op's cond_subgraph_index /
        body_subgraph_index name); its constants get buffers of this model.  Returns
        the subgraph's index."""
        base = len(self._buffers) - 1
        self._buffers += sub._buffers[1:]
        sg = C.SubGraph.SubGraphT()
        sg.tensors = []
        for t in sub._tensors:
            c = copy.copy(t)
            c.buffer = t.buffer + base if t.buffer else 0
            sg.tensors.append(c)
        sg.operators = []
        for o in sub._ops:
            c = copy.copy(o)
            oc = sub._opcodes[o.opcodeIndex]
            c.opcodeIndex = self._opcode(oc.builtinCode, oc.customCode)
            sg.operators.append(c)
        sg.inputs, sg.outputs, sg.name = list(sub._inputs), list(sub._outputs), name
        self._subgraphs = getattr(self, '_subgraphs', []) + [sg]
        return len(self._subgraphs)

    # ---------------------------------------------------------------- output
    def model(self):
        """The object-API ModelT."""
        sg = C.SubGraph.SubGraphT()
        sg.tensors = list(self._tensors)
        sg.operators = list(self._ops)
        sg.inputs = list(self._inputs)
        sg.outputs = list(self._outputs)
        sg.name = "main"
        m = C.Model.ModelT()
        m.version = self.version
        m.description = self.description
        m.operatorCodes = list(self._opcodes)
        m.subgraphs = [sg] + list(getattr(self, '_subgraphs', []))
        m.buffers = list(self._buffers)
        m.metadata = list(self._metadata) or None
        m.signatureDefs = list(getattr(self, '_signatures', None) or []) or None
        return m

    def build(self, external_data: bool = False) -> bytes:
        """Serialized model. ``external_data=True`` writes the buffers' bytes after the
        flatbuffer (16-byte aligned) and refers to them by offset/size, as TFLite's and
        circle's writers do for models over 2 GB."""
        if not external_data:
            return pack_model(self.model(), self.identifier)
        payloads = [None if b.data is None or len(b.data) == 0 else bytes(b.data)
                    for b in self._buffers]

        def pack(offsets):
            m = self.model()
            bufs = []
            for payload, off in zip(payloads, offsets):
                nb = _aligned_buffer(None)
                if payload is not None:
                    nb.offset, nb.size = off, len(payload)
                bufs.append(nb)
            m.buffers = bufs
            return pack_model(m, self.identifier)

        placeholder = pack([1 << 40] * len(payloads))     # same layout, final size
        pos = (len(placeholder) + 15) // 16 * 16
        offsets, blob = [], bytearray(pos - len(placeholder))
        for payload in payloads:
            offsets.append(pos if payload is not None else 0)
            if payload is not None:
                pad = (-len(payload)) % 16
                blob += payload + bytes(pad)
                pos += len(payload) + pad
        head = pack(offsets)
        assert len(head) == len(placeholder), "flatbuffer layout changed between passes"
        return head + bytes(blob)

    def save(self, path, external_data: bool = False) -> str:
        path = os.fspath(path)
        atomic_write(path, self.build(external_data=external_data))
        return path
