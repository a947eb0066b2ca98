"""ONNX refusals lifted in session 32 (issue 28, 'no arbitrary limits where the model is
valid'): a model of onnxruntime's quantize_dynamic (DynamicQuantizeLinear, ConvInteger /
MatMulInteger, Cast, Mul by the scales' product) trains dequantized and exports into
its integer ops; nn.ConvTranspose3d (CONV_3D_TRANSPOSE) and a grouped nn.Conv3d train and
export into their weights.  Forward against ONNX Runtime, gradients against PyTorch
autograd, export re-run in ONNX Runtime."""
import os

import numpy as np
import pytest

torch = pytest.importorskip('torch')
nn = torch.nn
F32 = np.float32


class DynNet(nn.Module):
    """Conv + ReLU, MaxPool, Flatten, then x @ W + b twice (MatMul + Add: quantize_dynamic
    quantizes Conv and MatMul, not Gemm)."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(2, 4, 3, padding=1)
        self.w1 = nn.Parameter(torch.randn(36, 6) * 0.2)
        self.b1 = nn.Parameter(torch.randn(6) * 0.1)
        self.w2 = nn.Parameter(torch.randn(6, 3) * 0.4)
        self.b2 = nn.Parameter(torch.randn(3) * 0.1)

    def forward(self, x):
        h = torch.flatten(nn.functional.max_pool2d(torch.relu(self.c(x)), 2), 1)
        return torch.relu(h @ self.w1 + self.b1) @ self.w2 + self.b2


def _dequantized(q, w):
    """The float value of quantize_dynamic's weight w (its '_quantized' initializer) in
    q's initializers: (q - zero point) * scale, per tensor or per column (MatMul's)."""
    v, sc, zp = (q[w + k] for k in ('_quantized', '_scale', '_zero_point'))
    if sc.size > 1:
        sc, zp = sc.reshape(1, -1), zp.reshape(1, -1)
    return ((v.astype(np.float64) - zp) * sc).astype(F32)


@pytest.mark.parametrize('wtype,per_channel', [('QInt8', False), ('QUInt8', True)])
def test_quantize_dynamic_model_trains_dequantized_and_exports_its_integers(
        tmp_path, wtype, per_channel):
    """quantize_dynamic's model had been refused ('an op of a model quantized by
    onnxruntime.quantization that utrain does not read: quantize_dynamic's').  Its integer
    ops read as the float Conv / MatMul of the activation and the weight dequantized:
    prepare says so; utrain's forward is the float model's with the file's weights
    dequantized (PyTorch's, and ONNX Runtime's run of the quantized file within its
    activations' rounding), the gradients PyTorch autograd's; one epoch of SGD, exported,
    writes each moved weight in the file's type at a scale recomputed from it (per channel
    where the file's are), the ops as they were, and ONNX Runtime runs it as utrain's
    trained forward within that rounding."""
    ort = pytest.importorskip('onnxruntime')
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from host_tools.prepare.pipeline import prepare, export
    from host_tools.target.runner import run
    from test_parity import new_trainer
    from utrain.sink import Sums
    torch.manual_seed(4)
    net = DynNet().eval()
    fp = os.fspath(tmp_path / 'f.onnx')
    torch.onnx.export(net, (torch.zeros(1, 2, 6, 6),), fp, dynamo=False, input_names=['x'])
    src = os.fspath(tmp_path / 'q.onnx')
    quantize_dynamic(fp, src, weight_type=getattr(QuantType, wtype), per_channel=per_channel)
    qm = onnx.load(src)
    ops = [n.op_type for n in qm.graph.node]
    assert {'DynamicQuantizeLinear', 'ConvInteger', 'MatMulInteger'} <= set(ops), ops
    q = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    with torch.no_grad():      # (the float model with the file's weights dequantized)
        for name, p in net.named_parameters():
            if name + '_quantized' in q:
                p.copy_(torch.tensor(_dequantized(q, name).reshape(p.shape)))
    rng = np.random.default_rng(0)
    xs = rng.random((8, 2, 6, 6)).astype(F32)
    np.savez(tmp_path / 'd.npz', x=xs, y=rng.integers(0, 3, 8))
    said, out = [], tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
            from_logits=True, lr=0.5, epochs=1, backend='fallback',
            log=lambda *a, **k: said.append(' '.join(map(str, a))))
    assert any('quantize_dynamic' in s and 'dequantized' in s for s in said), said
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    tr.net.sink = Sums(tr.net)
    import json
    with open(out / 'prepare.json') as f:      # (the NCHW input read as NHWC)
        perm = json.load(f).get('input_perm') or [0, 1, 2, 3]
    x = xs[:1]
    tr.set_input(x.transpose(perm))
    tr.net.forward(True)
    y = np.array(tr.net.output(), np.float64).ravel()
    ref = net(torch.tensor(x))
    np.testing.assert_allclose(y, ref.detach().numpy().ravel(), rtol=1e-5, atol=1e-5)
    qs = ort.InferenceSession(src, providers=['CPUExecutionProvider'])
    assert np.abs(y - qs.run(None, {'x': x})[0].ravel()).max() < 0.05 * np.abs(y).max()
    dy = np.array([[0.5, -1.0, 2.0]], F32)
    tr.net.backward(dy)
    (ref * torch.tensor(dy)).sum().backward()
    params = list(net.parameters())
    assert len(tr.net.trainable) == len(params)
    for k in tr.net.trainable:
        g = np.asarray(tr.net.sink.acc[k]).ravel()
        assert any(np.allclose(np.sort(g), np.sort(p.grad.numpy().ravel()), rtol=1e-4,
                               atol=1e-6) for p in params if p.numel() == g.size), (k, g)
    run(os.fspath(out), python=True)
    dst = os.fspath(tmp_path / 'out.onnx')
    export(src, os.fspath(out / 'trained.wof'), dst)
    dm = onnx.load(dst)
    b = {t.name: numpy_helper.to_array(t) for t in dm.graph.initializer}
    assert [n.op_type for n in dm.graph.node] == ops
    assert all(b[n].dtype == q[n].dtype and b[n].shape == q[n].shape for n in q)
    moved = [n for n in q if n.endswith('_quantized') and not np.array_equal(q[n], b[n])]
    rescaled = [n for n in q if n.endswith('_scale') and not np.array_equal(q[n], b[n])]
    assert len(moved) == 3 and len(rescaled) == 3, (moved, rescaled)
    for n in moved:     # (the whole range at the new scale, as quantize_dynamic writes it)
        cols = b[n[:-len('_quantized')] + '_scale'].size > 1      # (MatMul's, per channel)
        assert cols == (per_channel and b[n].ndim == 2)
        v = b[n].reshape(-1, b[n].shape[-1]) if cols else b[n].reshape(-1, 1)
        assert np.all(np.abs(v).max(0) == 127) if wtype == 'QInt8' else \
            np.all((v.min(0) == 0) | (v.max(0) == 255)), (n, v)
    trained = new_trainer(out / 'model.flat', out / 'trained.wof')
    got = np.concatenate([ort.InferenceSession(dst, providers=['CPUExecutionProvider'])
                          .run(None, {'x': x[None]})[0] for x in xs])
    want = np.stack([np.array(trained.predict(np.ascontiguousarray(x[None].transpose(perm))),
                              np.float64).ravel() for x in xs])
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), (got, want)



class EmbAttn(nn.Module):
    """nn.Embedding, then attention over its rows (x W, softmax of that times the rows
    transposed, times the rows), a mean and x @ O: quantize_dynamic quantizes the table
    (a Gather of uint8 rows, read by a MatMulInteger and, through a Transpose, by a
    DequantizeLinear) and both weights."""

    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(10, 8)
        self.q = nn.Parameter(torch.randn(8, 8) * 0.3)
        self.o = nn.Parameter(torch.randn(8, 3) * 0.5)

    def forward(self, ids):
        h = self.e(ids)
        a = torch.softmax((h @ self.q) @ h.transpose(1, 2), -1)
        return (a @ h).mean(1) @ self.o


def test_quantize_dynamic_embedding_table_trains_dequantized_and_exports(tmp_path):
    """quantize_dynamic's quantized table (Gather of uint8 rows, kept integer through a
    Transpose to a MatMulInteger and DequantizeLinears) had been refused ('the table is
    uint8; utrain trains float tables'): it reads as the table's DequantizeLinear, the
    ops after it on floats.  utrain's forward is the float model's with the file's
    table and weights dequantized (PyTorch's), its gradients PyTorch autograd's; one
    epoch of SGD, exported, moves the uint8 table at a recomputed scale and zero point,
    and ONNX Runtime runs it as utrain runs the trained weights, within the rounding."""
    ort = pytest.importorskip('onnxruntime')
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from host_tools.prepare.pipeline import prepare, export
    from host_tools.target.runner import run
    from test_parity import new_trainer
    from utrain.sink import Sums
    torch.manual_seed(2)
    net = EmbAttn().eval()
    fp = os.fspath(tmp_path / 'f.onnx')
    torch.onnx.export(net, (torch.zeros(1, 5, dtype=torch.long),), fp, dynamo=False,
                      input_names=['ids'])
    src = os.fspath(tmp_path / 'q.onnx')
    quantize_dynamic(fp, src, weight_type=QuantType.QInt8)
    qm = onnx.load(src)
    ops = [n.op_type for n in qm.graph.node]
    q = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    assert q['e.weight_quantized'].dtype == np.uint8 and ops.count('MatMulInteger') == 2, ops
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.tensor(_dequantized(q, name).reshape(p.shape)))
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 10, (8, 5))
    np.savez(tmp_path / 'd.npz', x=xs, y=rng.integers(0, 3, 8))
    said, out = [], tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
            from_logits=True, lr=0.5, epochs=1, backend='fallback',
            log=lambda *a, **k: said.append(' '.join(map(str, a))))
    assert any('quantize_dynamic' in s for s in said), said
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    tr.net.sink = Sums(tr.net)
    x = xs[:1]
    tr.set_input(x.astype(F32))
    tr.net.forward(True)
    ref = net(torch.tensor(x))
    np.testing.assert_allclose(np.array(tr.net.output(), np.float64).ravel(),
                               ref.detach().numpy().ravel(), rtol=1e-5, atol=1e-5)
    dy = np.array([[0.5, -1.0, 2.0]], F32)
    tr.net.backward(dy)
    (ref * torch.tensor(dy)).sum().backward()
    params = list(net.parameters())
    assert len(tr.net.trainable) == len(params)
    for k in tr.net.trainable:
        g = np.asarray(tr.net.sink.acc[k]).ravel()
        # (a MatMul's weight as FULLY_CONNECTED's [out, in]: the same values, transposed)
        assert any(np.allclose(g, w.ravel(), rtol=1e-4, atol=1e-6)
                   for p in params if p.numel() == g.size
                   for w in (p.grad.numpy(), p.grad.numpy().T)), (k, g)
    run(os.fspath(out), python=True)
    dst = os.fspath(tmp_path / 'out.onnx')
    export(src, os.fspath(out / 'trained.wof'), dst)
    dm = onnx.load(dst)
    b = {t.name: numpy_helper.to_array(t) for t in dm.graph.initializer}
    assert [n.op_type for n in dm.graph.node] == ops
    assert all(b[n].dtype == q[n].dtype and b[n].shape == q[n].shape for n in q)
    moved = {n for n in q if not np.array_equal(q[n], b[n])}
    assert {'e.weight_quantized', 'e.weight_scale', 'q_quantized', 'o_quantized'} <= moved, moved
    trained = new_trainer(out / 'model.flat', out / 'trained.wof')
    got = np.concatenate([ort.InferenceSession(dst, providers=['CPUExecutionProvider'])
                          .run(None, {'ids': x[None]})[0] for x in xs])
    want = np.stack([np.array(trained.predict(x[None].astype(F32)), np.float64).ravel()
                     for x in xs])
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), (got, want)


@pytest.mark.parametrize('dtype,sym,axis', [(np.int8, True, None), (np.uint8, False, 1),
                                            (np.uint8, False, None), (np.int8, True, 0)])
def test_requantized_is_quantize_dynamics_weight(dtype, sym, axis):
    """export's _requantized of a moved weight is onnxruntime's own quantization of it
    (quant_utils.quantize_data, per tensor or per channel), the scheme read from the
    file's integers and zero point."""
    pytest.importorskip('onnxruntime')
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data
    from host_tools.formats.onnx_io import _requantized
    rng = np.random.default_rng(1)
    w0, w = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 4)) * 1.5 + 0.3
    qt = TensorProto.INT8 if dtype == np.int8 else TensorProto.UINT8

    def ort(v):
        if axis is None:
            zp, sc, q = quantize_data(v.astype(F32).ravel(), qt, sym)
            return q.reshape(v.shape), np.asarray(sc), np.asarray(zp)
        parts = [quantize_data(np.take(v, c, axis).astype(F32).ravel(), qt, sym)
                 for c in range(v.shape[axis])]
        q = np.stack([p[2].reshape(np.take(v, 0, axis).shape) for p in parts], axis)
        return q, np.array([p[1] for p in parts]), np.array([p[0] for p in parts])
    q0, _, zp0 = ort(w0)
    q, sc, zp = _requantized(w, q0.astype(dtype), zp0.astype(dtype), axis)
    wq, wsc, wzp = ort(w)
    np.testing.assert_array_equal(q, wq)
    np.testing.assert_allclose(sc, wsc.reshape(sc.shape), rtol=1e-6)
    np.testing.assert_array_equal(zp, wzp.reshape(zp.shape))


def _onnx_3d_trains_and_exports(tmp_path, conv, shape, taps):
    """conv (a 3-D torch layer) -> ReLU -> Flatten -> Linear through torch.onnx: utrain's
    forward is ONNX Runtime's, each depth tap's gradient (taps: its IR name -> the
    torch weight's slice as utrain lays it out) PyTorch autograd's, and export puts the
    taps back into the weight: ONNX Runtime runs the exported file as utrain runs the
    trained weights."""
    ort = pytest.importorskip('onnxruntime')
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import prepare, export
    from host_tools.target.runner import run
    from test_parity import new_trainer
    from utrain.sink import Sums
    n = conv(torch.zeros(shape)).numel()
    net = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(n, 2)).eval()
    src = os.fspath(tmp_path / 'c.onnx')
    torch.onnx.export(net, (torch.zeros(shape),), src, dynamo=False, input_names=['x'])
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(4,) + shape[1:]).astype(F32)
    np.savez(tmp_path / 'd.npz', x=xs, y=rng.normal(size=(4, 2)).astype(F32))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', train='all',
            lr=0.1, epochs=1, backend='fallback', log=lambda *a, **k: None)
    g = read_model(os.fspath(out / 'rewritten.circle'))
    names = {t.index: t.name for t in g.tensors}
    assert not {'CONV_3D', 'CONV_3D_TRANSPOSE'} & {o.name for o in g.ops}
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    tr.net.sink = Sums(tr.net)
    sess = ort.InferenceSession(src, providers=['CPUExecutionProvider'])
    x = xs[:1]
    tr.set_input(x.transpose(0, 2, 3, 4, 1))    # (prepare.json's input_perm: NDHWC)
    tr.net.forward(True)
    y = np.array(tr.net.output(), np.float64).ravel()
    np.testing.assert_allclose(y, sess.run(None, {'x': x})[0].ravel(), rtol=1e-5, atol=1e-5)
    dy = np.array([[0.7, -1.3]], F32)
    tr.net.backward(dy)
    (net(torch.tensor(x)) * torch.tensor(dy)).sum().backward()
    want = {'0.bias': conv.bias.grad.numpy(), '3.weight': net[3].weight.grad.numpy(),
            '3.bias': net[3].bias.grad.numpy()}
    want.update(taps(conv.weight.grad))
    got = {}
    for t in tr.net.trainable:
        v = np.asarray(tr.net.sink.acc[t], np.float64)
        base = names[t].split('/group')[0]      # (a grouped tap's parts: split_groups')
        got.setdefault(base, []).append(v)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for name, w in want.items():
        parts = got[name]
        if len(parts) == 1 and parts[0].shape[0] in (1, w.shape[0]):    # (in place, by rows;
            # a depthwise or grouped tap's parts are laid out otherwise: their values)
            np.testing.assert_allclose(parts[0].ravel(), w.ravel(), rtol=1e-4, atol=1e-6,
                                       err_msg=name)
            continue
        v = np.concatenate([p.reshape(-1, *w.shape[1:]) if p.size != w.size else p
                            for p in parts])
        np.testing.assert_allclose(np.sort(v.ravel()), np.sort(w.ravel()), rtol=1e-4,
                                   atol=1e-6, err_msg=name)
    run(os.fspath(out), python=True)
    dst = os.fspath(tmp_path / 'e.onnx')
    export(src, os.fspath(out / 'trained.wof'), dst)
    trained = new_trainer(out / 'model.flat', out / 'trained.wof')
    trained.set_input(x.transpose(0, 2, 3, 4, 1))
    trained.net.forward(False)
    np.testing.assert_allclose(
        ort.InferenceSession(dst, providers=['CPUExecutionProvider']).run(None, {'x': x})[0]
        .ravel(), np.array(trained.net.output(), np.float64).ravel(), rtol=1e-5, atol=1e-5)
    assert not np.allclose(sess.run(None, {'x': x})[0], np.array(trained.net.output()))


@pytest.mark.parametrize('k, stride, pad, opad', [(3, 1, 1, 0), ((2, 3, 2), (2, 1, 2), (0, 1, 1), 0),
                                                  ((1, 2, 2), (3, 2, 2), 0, (2, 1, 0))])
def test_a_conv_transpose3d_trains_as_transpose_convs_and_exports_into_its_weight(
        tmp_path, k, stride, pad, opad):
    """nn.ConvTranspose3d through torch.onnx (a ConvTranspose of three spatial dimensions)
    had been refused ('utrain runs 1-D and 2-D transposed convolutions only').  The reader
    writes TFLite's CONV_3D_TRANSPOSE between TRANSPOSEs (ONNX's pads' begin kept), which
    prepare spells as a TRANSPOSE_CONV per input frame and depth tap
    (spellings.conv3d_transpose_to_2d; frames no tap reaches, stride 3 over 1 tap, the
    bias alone; output_padding's trailing rows)."""
    torch.manual_seed(0)
    conv = nn.ConvTranspose3d(2, 3, k, stride=stride, padding=pad, output_padding=opad)
    # (weight [C, O, kd, kh, kw]: tap i is utrain's [O, kh, kw, C])
    _onnx_3d_trains_and_exports(tmp_path, conv, (1, 2, 2, 3, 3), lambda g: {
        f'0.weight/ttap{i}': g[:, :, i].numpy().transpose(1, 2, 3, 0)
        for i in range(conv.weight.shape[2])})


@pytest.mark.parametrize('cin, cout, groups', [(4, 6, 2), (3, 6, 3)])
def test_a_grouped_conv3d_trains_as_grouped_conv2ds_and_exports_into_its_weight(
        tmp_path, cin, cout, groups):
    """nn.Conv3d(groups > 1) through torch.onnx had been refused ('utrain takes group 1
    only'): each depth tap is a grouped CONV_2D (split into groups, or a depthwise one
    where a group is one channel) of the tap's [O, kh, kw, C / group] slice."""
    torch.manual_seed(0)
    conv = nn.Conv3d(cin, cout, (2, 3, 3), padding=(0, 1, 1), groups=groups)
    _onnx_3d_trains_and_exports(tmp_path, conv, (1, cin, 3, 4, 4), lambda g: {
        f'0.weight/tap{i}': g[:, :, i].numpy().transpose(0, 2, 3, 1)
        for i in range(conv.weight.shape[2])})


class PowAct(nn.Module):
    """x ** y of two activations (a positive base: softplus), 2 ** y and 0.5 ** y of a
    constant base (a Pow whose exponent is an activation)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.o = nn.Linear(4, 6), nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        base, e = nn.functional.softplus(self.a(x)) + 0.1, torch.tanh(self.b(x))
        return self.o(base ** e + torch.pow(2.0, e) + torch.pow(torch.tensor([0.5]), e))


def test_pow_of_an_activation_exponent_is_onnx_runtimes_and_autograds(tmp_path):
    """Pow of an activation exponent had been refused ('the exponent must be a constant'):
    x ** y is EXP(y LOG x), c ** y EXP(y ln c) (spellings._pow_of_activation): utrain's
    forward is ONNX Runtime's, the gradients (through the base and the exponent)
    PyTorch autograd's."""
    ort = pytest.importorskip('onnxruntime')
    import onnx
    from host_tools.prepare.pipeline import prepare
    from test_parity import new_trainer
    from utrain.sink import Sums
    torch.manual_seed(0)
    net = PowAct().eval()
    src = os.fspath(tmp_path / 'p.onnx')
    torch.onnx.export(net, (torch.zeros(1, 4),), src, dynamo=False, input_names=['x'])
    m = onnx.load(src)
    consts = {o for n in m.graph.node if n.op_type == 'Constant' for o in n.output} | \
        {t.name for t in m.graph.initializer}
    pows = [n for n in m.graph.node if n.op_type == 'Pow']
    assert len(pows) == 3 and not any(n.input[1] in consts for n in pows), pows
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), loss='mse', train='all', lr=0.1, log=lambda *a, **k: None)
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    tr.net.sink = Sums(tr.net)
    sess = ort.InferenceSession(src, providers=['CPUExecutionProvider'])
    for seed in (2, 3):
        x = np.random.default_rng(seed).normal(size=(1, 4)).astype(F32)
        tr.set_input(x)
        tr.net.forward(True)
        np.testing.assert_allclose(np.array(tr.net.output(), np.float64).ravel(),
                                   sess.run(None, {'x': x})[0].ravel(), rtol=1e-5, atol=1e-5)
    dy = np.array([[0.5, -1.0, 2.0]], F32)
    tr.net.backward(dy)
    (net(torch.tensor(x)) * torch.tensor(dy)).sum().backward()
    params = list(net.parameters())
    assert len(tr.net.trainable) == len(params)
    for k in tr.net.trainable:
        g = np.asarray(tr.net.sink.acc[k]).ravel()
        assert any(np.allclose(g, p.grad.numpy().ravel(), rtol=1e-4, atol=1e-6)
                   for p in params if p.numel() == g.size), (k, g)


def test_pow_of_an_activation_exponent_where_the_base_is_not_positive(tmp_path):
    """pow's own values where the base is 0 or below (ONNX Runtime's, TFLite's): x ** y
    of two activations is 0 or inf at x = 0 (y > 0, y < 0) as pow, NaN at x < 0 (pow's
    NaN for a fractional y; its finite value for a whole y has no gradient in y): utrain
    says NaN there, which stops a run as diverged.  A constant base of 0 or below is
    refused, saying why."""
    ort = pytest.importorskip('onnxruntime')
    import onnx
    from onnx import TensorProto as T, helper
    from host_tools.prepare.pipeline import prepare
    from host_tools.graph.passes import PrepareError
    from test_parity import new_trainer

    def model(path, base=None):
        ins = [helper.make_tensor_value_info('x', T.FLOAT, [1, 4])]
        inits = []
        if base is None:
            ins.append(helper.make_tensor_value_info('y', T.FLOAT, [1, 4]))
            nodes = [helper.make_node('Pow', ['x', 'y'], ['p'])]
        else:
            inits = [helper.make_tensor('c', T.FLOAT, [1], [base])]
            nodes = [helper.make_node('Pow', ['c', 'x'], ['p'])]
        nodes.append(helper.make_node('Mul', ['p', 'w'], ['out']))
        inits.append(helper.make_tensor('w', T.FLOAT, [4], [1.0, 2.0, 3.0, 4.0]))
        g = helper.make_graph(nodes, 'g', ins, [helper.make_tensor_value_info('out', T.FLOAT, [1, 4])],
                              inits)
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), path)
        return path
    src = model(os.fspath(tmp_path / 'xy.onnx'))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), loss='mse', train='all', lr=0.1, log=lambda *a, **k: None)
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    x = np.array([[0.0, 0.0, 2.0, -2.0]], F32)
    y = np.array([[1.5, -1.0, 0.5, 0.5]], F32)
    sess = ort.InferenceSession(src, providers=['CPUExecutionProvider'])
    want = sess.run(None, {'x': x, 'y': y})[0].ravel()
    tr.set_input(np.concatenate([x, y], 1).reshape(tr.x_shape))   # (the inputs joined)
    tr.net.forward(False)
    with np.errstate(all='ignore'):
        got = np.array(tr.net.output(), np.float64).ravel()
    np.testing.assert_allclose(got, want, rtol=1e-5)    # (0, inf, 2 ** 0.5 * 3, NaN)
    assert np.isnan(want[3]) and want[1] == np.inf and want[0] == 0
    for c in (0.0, -2.0):
        with pytest.raises(PrepareError, match=r'POW of a constant base .* above 0'):
            prepare(model(os.fspath(tmp_path / f'c{c}.onnx'), c), os.fspath(tmp_path / 'r2'),
                    loss='mse', lr=0.1, log=lambda *a, **k: None)


def test_quantize_dynamic_lstm_is_refused_saying_how_to_quantize_it(tmp_path):
    """quantize_dynamic's DynamicQuantizeLSTM (an ONNX Runtime contrib op) had been refused
    as 'operator domain com.microsoft is not supported': it says to keep the LSTM float
    (op_types_to_quantize), the MatMul beside it then training dequantized."""
    pytest.importorskip('onnxruntime')
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from host_tools.formats.circle_io import read_model
    from host_tools.formats.ir import ModelError

    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.r = nn.LSTM(3, 4, batch_first=True)
            self.o = nn.Parameter(torch.randn(4, 2))

        def forward(self, x):
            return self.r(x)[0][:, -1] @ self.o
    fp = os.fspath(tmp_path / 'f.onnx')
    torch.onnx.export(Seq().eval(), (torch.zeros(1, 5, 3),), fp, dynamo=False)
    src = os.fspath(tmp_path / 'q.onnx')
    quantize_dynamic(fp, src, weight_type=QuantType.QInt8)
    with pytest.raises(ModelError, match=r'DynamicQuantizeLSTM is an ONNX Runtime contrib op'
                                         r'.*op_types_to_quantize'):
        read_model(src)
    ok = os.fspath(tmp_path / 'k.onnx')
    quantize_dynamic(fp, ok, weight_type=QuantType.QInt8, op_types_to_quantize=['MatMul'])
    g = read_model(ok)
    assert g.onnx_dynamic == 1 and 'FULLY_CONNECTED' in {o.name for o in g.ops}
