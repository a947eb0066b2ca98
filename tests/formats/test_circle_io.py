"""Tests of host_tools.formats.circle_io / circle_build and of the ONERT facts in onert_ref."""

import os

import numpy as np
import pytest


from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import (OP_NAMES, ModelError, Graph, pack_model, read_model,
                                          tensor_data, write_with_weights)
from circle_schema.v0_10 import circle as C  # noqa: E402
import onert_ref as R  # noqa: E402

RNG = np.random.default_rng(1234)


def _f32(*shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _mlp_builder(identifier=b"CIR0"):
    b = CircleBuilder(identifier=identifier)
    x = b.tensor("x", [1, 8])
    w1 = b.tensor("w1", [16, 8], data=_f32(16, 8))
    b1 = b.tensor("b1", [16], data=_f32(16, scale=0.1))
    h = b.tensor("h", [1, 16])
    w2 = b.tensor("w2", [4, 16], data=_f32(4, 16))
    b2 = b.tensor("b2", [4], data=_f32(4, scale=0.1))
    z = b.tensor("z", [1, 4])
    y = b.tensor("y", [1, 4])
    b.op("FULLY_CONNECTED", [x, w1, b1], [h], fused_activation_function="RELU")
    b.op("FULLY_CONNECTED", [h, w2, b2], [z], keep_num_dims=False)
    b.op("SOFTMAX", [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    b.metadata("utrain_note", b"\x00\x01\x02any-bytes")
    return b


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    b = _mlp_builder()
    return b, b.save(str(d / "mlp.circle"))


def _graph_summary(g: Graph):
    return ([(t.index, t.name, t.shape, t.dtype, t.buffer, t.quant,
              None if t.data is None else t.data.tobytes()) for t in g.tensors],
            [(o.index, o.code, o.name, o.inputs, o.outputs, o.options) for o in g.ops],
            g.inputs, g.outputs, g.metadata, g.version, g.description, g.n_subgraphs)


# --------------------------------------------------------------------------- round trips

def test_build_read_roundtrip(mlp):
    b, path = mlp
    g = read_model(path)
    assert g.identifier == b"CIR0" and g.path == path and g.n_subgraphs == 1
    assert g.version == 3 and g.description == "utrain circle_build"
    assert [t.name for t in g.tensors] == ["x", "w1", "b1", "h", "w2", "b2", "z", "y"]
    assert [t.shape for t in g.tensors] == [[1, 8], [16, 8], [16], [1, 16], [4, 16], [4],
                                            [1, 4], [1, 4]]
    assert all(t.dtype == "float32" for t in g.tensors)
    assert [t.data is None for t in g.tensors] == [True, False, False, True, False, False,
                                                   True, True]
    assert all(t.buffer == 0 for t in g.tensors if t.data is None)
    consts = [t.buffer for t in g.tensors if t.data is not None]
    assert len(set(consts)) == 4 and 0 not in consts
    src = {t.name: b._buffers[t.buffer].data for t in g.tensors if t.data is not None}
    for t in g.tensors:
        if t.data is not None:
            assert t.data.dtype == np.float32 and list(t.data.shape) == t.shape
            assert t.data.tobytes() == src[t.name].tobytes()
    assert [o.name for o in g.ops] == ["FULLY_CONNECTED", "FULLY_CONNECTED", "SOFTMAX"]
    assert [o.code for o in g.ops] == [9, 9, 25]
    assert g.ops[0].inputs == [0, 1, 2] and g.ops[0].outputs == [3]
    assert g.ops[0].options["fused_activation_function"] == "RELU"
    assert g.ops[0].options["keep_num_dims"] is False
    assert g.ops[0].options["weights_format"] == "DEFAULT"
    assert g.ops[1].options["fused_activation_function"] == "NONE"
    assert g.ops[2].options == {"beta": 1.0}
    assert g.inputs == [0] and g.outputs == [7]
    assert g.metadata == {"utrain_note": b"\x00\x01\x02any-bytes"}
    td = tensor_data(path)
    assert sorted(td) == [1, 2, 4, 5]
    # buffers are 16-byte aligned in the file
    raw = open(path, "rb").read()
    for k, arr in td.items():
        off = raw.find(arr.tobytes())
        assert off > 0 and off % 16 == 0


def test_dtypes_quant_options_roundtrip(tmp_path):
    b = CircleBuilder()
    x = b.tensor("x", [1, 4, 4, 2])
    arrays = {
        "i8": (np.arange(-8, 8, dtype=np.int8).reshape(4, 4), {"scale": [0.5],
               "zero_point": [3], "quantized_dimension": 0}),
        "u8": (np.arange(6, dtype=np.uint8).reshape(2, 3), None),
        "i16": (np.array([-300, 7], dtype=np.int16), None),
        "i32": (np.array([1, 8], dtype=np.int32), None),
        "i64": (np.array([[2**40]], dtype=np.int64), None),
        "f16": (np.array([1.5, -2], dtype=np.float16), None),
        "f64": (np.array([np.pi], dtype=np.float64), None),
        "bool": (np.array([True, False, True]), None),
        "perchan": (np.ones((3, 2), np.int8), {"scale": [0.1, 0.2, 0.3],
                                                 "zero_point": [0, 0, 0],
                                                 "quantized_dimension": 0}),
    }
    idx = {k: b.tensor(k, list(a.shape), data=a, quant=q) for k, (a, q) in arrays.items()}
    act = b.tensor("act", [1, 4, 4, 2], dtype=np.int8,
                   quant={"scale": [0.25], "zero_point": [-1]})
    y = b.tensor("y", [1, 2, 2, 3])
    wc = b.tensor("wc", [3, 3, 3, 2], data=_f32(3, 3, 3, 2))
    b.op("CONV_2D", [x, wc, -1], [y], padding="VALID", stride_w=2, stride_h=2,
         fused_activation_function="RELU6")
    r = b.tensor("r", [1, 12])
    b.op("RESHAPE", [y, idx["i32"]], [r], new_shape=[1, 12])
    p = b.tensor("p", [1, 2, 2, 2])
    b.op("MAX_POOL_2D", [x], [p], padding="SAME", filter_width=2, filter_height=2,
         stride_w=2, stride_h=2)
    m = b.tensor("m", [1, 2])
    b.op("MEAN", [x, idx["i32"]], [m], keep_dims=False)
    b.op("INSTANCE_NORM", [x, -1, -1], [act], epsilon=1e-5)
    b.inputs(x)
    b.outputs(r, p, m)
    path = b.save(str(tmp_path / "types.circle"))
    g = read_model(path)
    for k, (a, q) in arrays.items():
        t = g.tensors[idx[k]]
        assert t.dtype == a.dtype.name, k
        assert t.data.dtype == a.dtype and np.array_equal(t.data, a), k
        if q is None:
            assert t.quant is None
        else:
            assert t.quant["scale"] == pytest.approx(q["scale"])
            assert t.quant["zero_point"] == q["zero_point"]
            assert t.quant["quantized_dimension"] == q["quantized_dimension"]
    ta = g.tensors[act]
    assert ta.dtype == "int8" and ta.data is None
    assert ta.quant == {"scale": [0.25], "zero_point": [-1], "quantized_dimension": 0}
    conv, resh, pool, mean, inorm = g.ops
    assert conv.name == "CONV_2D" and conv.inputs == [x, wc, -1]
    assert conv.options["padding"] == "VALID" and conv.options["stride_w"] == 2
    assert conv.options["stride_h"] == 2 and conv.options["dilation_w_factor"] == 1
    assert conv.options["fused_activation_function"] == "RELU6"
    assert resh.options == {"new_shape": [1, 12]}
    assert pool.options["filter_width"] == 2 and pool.options["padding"] == "SAME"
    assert mean.options == {"keep_dims": False}
    assert inorm.code == -2 and inorm.name == "INSTANCE_NORM"
    assert inorm.options["epsilon"] == pytest.approx(1e-5)
    assert g.outputs == [r, p, m]


def test_tfl3_reads_same(tmp_path):
    state = RNG.bit_generator.state
    pc = _mlp_builder(b"CIR0").save(str(tmp_path / "a.circle"))
    RNG.bit_generator.state = state
    pt = _mlp_builder(b"TFL3").save(str(tmp_path / "a.tflite"))
    gc, gt = read_model(pc), read_model(pt)
    assert gc.identifier == b"CIR0" and gt.identifier == b"TFL3"
    assert _graph_summary(gc) == _graph_summary(gt)
    x = _f32(3, 8)
    np.testing.assert_allclose(R.onert_infer(pt, x), R.onert_infer(pc, x), atol=1e-6)


def test_repack_unchanged_is_identical(mlp, tmp_path):
    _, path = mlp
    out = str(tmp_path / "copy.circle")
    write_with_weights(path, out, {})
    assert _graph_summary(read_model(out)) == _graph_summary(read_model(path))


# --------------------------------------------------------------------------- ONERT loads builder output

def _act_model(path, kind):
    """x[1,6] -> FC(5, fused or NONE) -> [standalone op] ; returns path."""
    b = CircleBuilder()
    x = b.tensor("x", [1, 6])
    w = b.tensor("w", [5, 6], data=_f32(5, 6, scale=1.0))
    bias = b.tensor("b", [5], data=_f32(5, scale=0.3))
    h = b.tensor("h", [1, 5])
    fused = kind[len("FC_"):] if kind.startswith("FC_") else "NONE"
    b.op("FULLY_CONNECTED", [x, w, bias], [h], fused_activation_function=fused)
    out = h
    if not kind.startswith("FC_"):
        if kind == "RESHAPE":
            out = b.tensor("y", [1, 5, 1])
            b.op("RESHAPE", [h], [out], new_shape=[1, 5, 1])
        elif kind == "RESHAPE_T":
            shp = b.tensor("shape", [3], data=np.array([1, 1, 5], np.int32))
            out = b.tensor("y", [1, 1, 5])
            b.op("RESHAPE", [h, shp], [out], new_shape=[1, 1, 5])
        else:
            out = b.tensor("y", [1, 5])
            b.op(kind, [h], [out], **({"beta": 1.0} if kind == "SOFTMAX" else {}))
    b.inputs(x)
    b.outputs(out)
    return b.save(path)


@pytest.mark.parametrize("kind", ["FC_NONE", "FC_RELU", "FC_RELU6", "FC_TANH", "RELU",
                                  "RELU6", "LOGISTIC", "TANH", "SOFTMAX", "RESHAPE",
                                  "RESHAPE_T"])
def test_onert_runs_builder_models(tmp_path, kind):
    path = _act_model(str(tmp_path / "m.circle"), kind)
    g = read_model(path)
    if kind == "FC_TANH":
        # the file is right (reads back as TANH) but ONERT's cpu FULLY_CONNECTED kernel
        # refuses a fused TANH at run time ("Unsupported fused activation function")
        assert g.ops[0].options["fused_activation_function"] == "TANH"
        from onert.native.libnnfw_api_pybind.exception import OnertError
        with pytest.raises(OnertError):
            R.onert_infer(path, _f32(1, 6))
        return
    if kind == "RESHAPE":     # builder added the int32 shape tensor ONERT requires
        assert len(g.ops[1].inputs) == 2
        np.testing.assert_array_equal(g.tensors[g.ops[1].inputs[1]].data, [1, 5, 1])
    x = _f32(3, 6, scale=3.0)       # large enough to reach RELU6's clip
    got = R.onert_infer(path, x)
    ref = R.numpy_forward(g, x)[g.outputs[0]]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_onert_runs_mlp(mlp):
    _, path = mlp
    g = read_model(path)
    x = _f32(4, 8)
    np.testing.assert_allclose(R.onert_infer(path, x), R.numpy_forward(g, x)[7], atol=1e-6)


# --------------------------------------------------------------------------- write_with_weights

def test_write_with_weights(mlp, tmp_path):
    _, path = mlp
    before = open(path, "rb").read()
    g = read_model(path)
    new_w1 = _f32(16, 8)
    new_b2 = np.array([5, 0, 0, 0], np.float32)
    out = str(tmp_path / "new.circle")
    write_with_weights(path, out, {1: new_w1, 5: new_b2})
    assert open(path, "rb").read() == before
    g2 = read_model(out)
    assert g2.identifier == b"CIR0" and g2.metadata == g.metadata
    np.testing.assert_array_equal(g2.tensors[1].data, new_w1)
    np.testing.assert_array_equal(g2.tensors[5].data, new_b2)
    for k in (2, 4):
        np.testing.assert_array_equal(g2.tensors[k].data, g.tensors[k].data)
    assert [o.options for o in g2.ops] == [o.options for o in g.ops]
    assert [(t.name, t.shape, t.dtype, t.buffer) for t in g2.tensors] == \
        [(t.name, t.shape, t.dtype, t.buffer) for t in g.tensors]
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    # ONERT sees the new weights
    x = _f32(3, 8)
    w = {t.index: t.data.astype(np.float64) for t in g.tensors if t.data is not None}
    w[1], w[5] = new_w1.astype(np.float64), new_b2.astype(np.float64)
    ref = R.numpy_forward(g, x, w)[7]
    got = R.onert_infer(out, x)
    np.testing.assert_allclose(got, ref, atol=1e-6)
    assert np.abs(got - R.onert_infer(path, x)).max() > 1e-2
    # in place, TFL3 identifier kept
    pt = _mlp_builder(b"TFL3").save(str(tmp_path / "m.tflite"))
    write_with_weights(pt, pt, {4: np.zeros((4, 16), np.float32)})
    gt = read_model(pt)
    assert gt.identifier == b"TFL3" and not gt.tensors[4].data.any()


def test_write_with_weights_shared_buffer(tmp_path):
    b = CircleBuilder()
    x = b.tensor("x", [1, 4])
    wa = b.tensor("wa", [4, 4], data=np.eye(4, dtype=np.float32))
    h = b.tensor("h", [1, 4])
    wb = b.tensor("wb", [4, 4], data=np.eye(4, dtype=np.float32))
    y = b.tensor("y", [1, 4])
    b.op("FULLY_CONNECTED", [x, wa, -1], [h])
    b.op("FULLY_CONNECTED", [h, wb, -1], [y])
    b.inputs(x)
    b.outputs(y)
    m = b.model()
    m.subgraphs[0].tensors[wb].buffer = m.subgraphs[0].tensors[wa].buffer
    src = str(tmp_path / "shared.circle")
    with open(src, "wb") as f:
        f.write(pack_model(m, b"CIR0"))
    g = read_model(src)
    assert g.tensors[wa].buffer == g.tensors[wb].buffer
    out = str(tmp_path / "out.circle")
    write_with_weights(src, out, {wb: 2 * np.eye(4, dtype=np.float32)})
    g2 = read_model(out)
    assert g2.tensors[wa].buffer == g.tensors[wa].buffer
    assert g2.tensors[wb].buffer not in (0, g.tensors[wa].buffer)
    np.testing.assert_array_equal(g2.tensors[wa].data, np.eye(4))
    np.testing.assert_array_equal(g2.tensors[wb].data, 2 * np.eye(4))
    x = _f32(2, 4)
    np.testing.assert_allclose(R.onert_infer(out, x), 2 * x, atol=1e-6)


def test_write_with_weights_errors(mlp, tmp_path):
    _, path = mlp
    out = str(tmp_path / "bad.circle")
    cases = [({1: np.zeros((16, 8), np.float64)}, "float64"),
             ({1: np.zeros((8, 16), np.float32)}, "shape"),
             ({0: np.zeros((1, 8), np.float32)}, "no constant data"),
             ({99: np.zeros(1, np.float32)}, "does not exist")]
    for new, words in cases:
        with pytest.raises(ModelError, match=words):
            write_with_weights(path, out, new)
    assert os.listdir(tmp_path) == []
    with pytest.raises(ModelError, match="no such file"):
        write_with_weights(str(tmp_path / "nope.circle"), out, {})


def test_external_buffers(tmp_path):
    state = RNG.bit_generator.state
    b = _mlp_builder()
    inline = b.save(str(tmp_path / "in.circle"))
    ext = b.save(str(tmp_path / "ext.circle"), external_data=True)
    raw = open(ext, "rb").read()
    ge = read_model(ext)
    assert _graph_summary(ge) == _graph_summary(read_model(inline))
    # the data really lives after the flatbuffer, referred to by offset/size
    mt = C.Model.ModelT.InitFromPackedBuf(raw, 0)
    b1 = mt.buffers[ge.tensors[1].buffer]
    assert b1.data is None and b1.offset > 1 and b1.offset % 16 == 0 and b1.size == 16 * 8 * 4
    assert raw[b1.offset:b1.offset + b1.size] == ge.tensors[1].data.tobytes()
    # a cut through the external data is reported
    cut = str(tmp_path / "cut.circle")
    open(cut, "wb").write(raw[:-40])
    with pytest.raises(ModelError, match="beyond the end of the file"):
        read_model(cut)
    # rewriting inlines the buffers (ONERT 0.1.0 only reads inline data)
    out = str(tmp_path / "w.circle")
    write_with_weights(ext, out, {2: np.ones(16, np.float32)})
    go = read_model(out)
    assert go.tensors[2].data.sum() == 16 and go.metadata == ge.metadata
    np.testing.assert_array_equal(go.tensors[1].data, ge.tensors[1].data)
    RNG.bit_generator.state = state


# --------------------------------------------------------------------------- errors

def test_error_missing_and_small(tmp_path):
    p = str(tmp_path / "missing.circle")
    with pytest.raises(ModelError) as e:
        read_model(p)
    assert str(e.value) == f"{p}: no such file"
    assert isinstance(e.value, ValueError)
    with pytest.raises(ModelError, match="directory"):
        read_model(str(tmp_path))
    empty = tmp_path / "empty.circle"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="empty"):
        read_model(str(empty))
    small = tmp_path / "small.circle"
    small.write_bytes(b"\x10\x00CIR")
    with pytest.raises(ModelError, match="too small"):
        read_model(str(small))


def test_error_wrong_identifier(mlp, tmp_path):
    _, path = mlp
    raw = bytearray(open(path, "rb").read())
    raw[4:8] = b"ONNX"
    p = tmp_path / "wrong.circle"
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelError) as e:
        read_model(str(p))
    msg = str(e.value)
    assert msg.startswith(str(p) + ": ") and "b'ONNX'" in msg
    assert "CIR0" in msg and "TFL3" in msg
    p.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    with pytest.raises(ModelError, match="identifier"):
        read_model(str(p))


def test_error_truncated(mlp, tmp_path):
    _, path = mlp
    raw = open(path, "rb").read()
    p = tmp_path / "trunc.circle"
    cuts = sorted(set([8, 9, 12, 16, 24, 40, 64, 100, len(raw) // 3, len(raw) // 2,
                       len(raw) - 100, len(raw) - 17, len(raw) - 4, len(raw) - 1]
                      + list(range(8, len(raw), 13))))
    for cut in cuts:
        p.write_bytes(raw[:cut])
        with pytest.raises(ModelError) as e:
            read_model(str(p))
        assert str(e.value).startswith(str(p) + ": ")


def test_error_garbage(tmp_path):
    rng = np.random.default_rng(7)
    p = tmp_path / "garbage.circle"
    for i in range(200):
        body = bytearray(rng.integers(0, 256, int(rng.integers(8, 400)),
                                      dtype=np.uint8).tobytes())
        if i % 2:
            body[4:8] = b"CIR0" if i % 4 == 1 else b"TFL3"
        p.write_bytes(bytes(body))
        with pytest.raises(ModelError):
            read_model(str(p))


def test_error_bit_flips_never_escape(mlp, tmp_path):
    """Corrupt bytes of a valid model: either it still reads, or ModelError."""
    _, path = mlp
    raw = open(path, "rb").read()
    p = tmp_path / "flip.circle"
    for i in range(0, len(raw), 3):
        b = bytearray(raw)
        b[i] ^= 0xA5
        p.write_bytes(bytes(b))
        try:
            read_model(str(p))
        except ModelError:
            pass


def _modified(tmp_path, fn):
    m = _mlp_builder().model()
    fn(m)
    p = str(tmp_path / "mod.circle")
    with open(p, "wb") as f:
        f.write(pack_model(m, b"CIR0"))
    return p


@pytest.mark.parametrize("change, words", [
    (lambda m: setattr(m.subgraphs[0].tensors[1], "buffer", 99), "buffer 99"),
    (lambda m: setattr(m.subgraphs[0].operators[0], "inputs", [0, 1, 42]), "index 42"),
    (lambda m: setattr(m.subgraphs[0].operators[1], "outputs", [-1]), "index -1"),
    (lambda m: setattr(m.subgraphs[0], "outputs", [8]), "output tensor index 8"),
    (lambda m: setattr(m.subgraphs[0].operators[0], "opcodeIndex", 5), "opcode index 5"),
    (lambda m: setattr(m, "subgraphs", []), "no subgraphs"),
    (lambda m: setattr(m.subgraphs[0].tensors[1], "shape", [16, 9]), "needs 576"),
    (lambda m: setattr(m.subgraphs[0].tensors[2], "type", 4), "shape \\[16\\] of int64 needs 128"),
])
def test_error_inconsistent(tmp_path, change, words):
    p = _modified(tmp_path, change)
    with pytest.raises(ModelError, match=words):
        read_model(p)


@pytest.mark.parametrize("builtin, deprecated, code", [
    (0, 9, 9),          # old file: only the deprecated field
    (9, 9, 9),
    (150, 127, 150),    # code above 127: placeholder in the deprecated field
    (-2, 127, -2),      # circle extension op, placeholder
    (-2, -2, -2),       # circle extension op as ONE's exporter writes it
    (0, -3, -3),        # old circle file with the extension code in the int8 field
])
def test_operator_code_rule(tmp_path, builtin, deprecated, code):
    def change(m):
        oc = m.operatorCodes[0]
        oc.builtinCode, oc.deprecatedBuiltinCode = builtin, deprecated
        for op in m.subgraphs[0].operators:     # (no FC's options on another op: damaged)
            if op.opcodeIndex == 0 and code != 9:
                op.builtinOptionsType, op.builtinOptions = 0, None
    g = read_model(_modified(tmp_path, change))
    assert g.ops[0].code == code
    assert g.ops[0].name == OP_NAMES.get(code, f"UNKNOWN_{code}")


# --------------------------------------------------------------------------- ONERT facts

def test_onert_facts(tmp_path):
    r = R.verify_onert_facts(str(tmp_path), verbose=False)
    # (a) last N ops of any kind: FC-RELU-FC-SOFTMAX
    assert r["a_changed_0"] == [] and r["a_changed_1"] == []
    assert r["a_changed_2"] == ["b2", "w2"] and r["a_changed_3"] == ["b2", "w2"]
    assert r["a_changed_4"] == r["a_changed_-1"] == ["b1", "b2", "w1", "w2"]
    assert max(r[f"a_err_{n}"] for n in (0, 1, 2, 3, 4, -1)) < 1e-6
    # (b), (c) SGD mean / sum, CCE and MSE, batch 1 and 4
    for loss in ("cce", "mse"):
        for red in ("mean", "sum"):
            assert r[f"bc_{loss}_{red}_b1"] < 1e-6 and r[f"bc_{loss}_{red}_b4"] < 1e-6
            assert r[f"bc_{loss}_{red}_b4_other"] > 1e-3
    # (d) Adam TF form with eps 1e-7; the Python epsilon argument is ignored
    assert r["d_eps_1e-07"] < 1e-6 and r["d_adam_normal"] < 1e-6
    assert r["d_eps_1e-08"] > 1e-3 and r["d_eps_1e-06"] > 1e-3
    assert r["d_python_eps_ignored"] == 0.0 and r["d_reset_per_epoch"] > 1e-3
    # (e) last incomplete batch padded with its own samples
    assert r["e_repeat_last"] < 1e-6
    assert r["e_from_start"] > 1e-3 and r["e_dropped"] > 1e-3
    # (f) CCE: -t/y through SOFTMAX's backward; logits when there is no SOFTMAX
    assert r["f_no_softmax_logits"] < 1e-6
    assert r["f_saturated_change"] == 0.0


def test_onert_train_long_out_path(mlp, tmp_path):
    _, path = mlp
    deep = tmp_path / "a_rather_long_directory_name" / "sub"
    out = str(deep / "trained_model_with_long_name.circle")
    x = _f32(4, 8)
    y = np.eye(4, dtype=np.float32)[[0, 1, 2, 3]]
    assert R.onert_train(path, x, y, lr=0.1, batch=2, out_path=out) == out
    g, w = read_model(path), tensor_data(out)
    ref = R.numpy_train(g, x, y, lr=0.1, batch=2)
    assert max(np.abs(w[k] - ref[k]).max() for k in ref) < 1e-6
    assert read_model(out).metadata == g.metadata


def test_graph_deepcopy_is_independent(mlp):
    """A deep copy of a graph (the --select trials copy one twice a prepare, and
    read_model hands out copies of the graphs it keeps): nothing shared with the
    original, what the original shares still shared (two tensors of one buffer), fields
    set besides the dataclass's copied too."""
    import copy
    g = read_model(mlp[1])
    g.tensors[2].quant = {"scale": np.ones(3, np.float32)}
    g.extra = [1, 2]                    # a field set besides the dataclass's
    g.tensors[5].data = g.tensors[1].data
    mine = copy.deepcopy(g)
    assert mine.tensors[5].data is mine.tensors[1].data
    for a, b in zip(mine.tensors + mine.ops, g.tensors + g.ops):
        for k, v in vars(a).items():
            if isinstance(v, (list, dict, np.ndarray)):
                assert v is not getattr(b, k)
    assert mine.extra == [1, 2] and mine.extra is not g.extra
