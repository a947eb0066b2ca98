"""ONNX spellings lifted in session 30 (issue 28): Equal, Not, Less / Greater (a
comparison's 1.0 / 0.0 mask, no gradient), Where (SELECT_V2), ReduceMin (-max(-x)), a
QDQ model (onnxruntime quantize_static's default format: trains dequantized, export
writes the weights back at the file's scales) and evaluate of a model of several inputs
where onnxruntime is not installed.  Each had been refused ('cannot read ONNX op', 'pip
install onnxruntime').  Forward against ONNX Runtime, gradients against PyTorch autograd."""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip('torch')
nn = torch.nn
F32 = np.float32


class Masks(nn.Module):
    """torch.where(h != 0, h, h / 4) of RELU(h) (Equal, Not, Where), a (h > c).float()
    mask (Greater, Cast), torch.where(h <= c, tanh(h), h) (LessOrEqual) and torch.amin
    over time (ReduceMin)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)                                       # [1, T, 6]
        r = torch.relu(h)
        u = torch.where(r != 0, h, h / 4)
        v = u * (h > 0.3).float() + torch.where(h <= -0.2, torch.tanh(h), h)
        return self.b(torch.amin(v, dim=1))


def _onnx(net, path, *shapes, names=None):
    torch.onnx.export(net.eval(), tuple(torch.zeros(s) for s in shapes), os.fspath(path),
                      dynamo=False, input_names=names)
    return os.fspath(path)


def _qdq(fp, xs, path, **kw):
    """onnxruntime's quantize_static of the float model fp (one input 'x'), calibrated on
    the samples xs, in its default QDQ format, written to path."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{'x': x[None]} for x in xs])

        def get_next(self):
            return next(self.it, None)
    quantize_static(fp, os.fspath(path), Reader(), **kw)
    return os.fspath(path)


def _trainer(path, out, **kw):
    from host_tools.prepare.pipeline import prepare
    from test_parity import new_trainer
    prepare(path, os.fspath(out), loss='mse', train='all', lr=0.1, log=lambda *a, **k: None, **kw)
    return new_trainer(out / 'model.flat', out / 'weights.wof')


def _agrees(net, src, out, x, dy, atol=1e-6):
    """utrain's forward of x (a torch tensor) on the prepared src (folder out) is ONNX
    Runtime's, and its gradients for dy PyTorch autograd's: every trainable tensor one of
    net's parameters (matched by size)."""
    ort = pytest.importorskip('onnxruntime')
    tr = _trainer(src, out)
    from utrain.sink import Sums        # (on the path once _trainer imported test_parity)
    tr.net.sink = Sums(tr.net)
    sess = ort.InferenceSession(src, providers=['CPUExecutionProvider'])
    import json
    with open(out / 'prepare.json') as f:      # (an NCHW input read as NHWC: input_perm)
        perm = json.load(f).get('input_perm')
    tr.set_input(x.numpy().transpose(perm) if perm else x.numpy())
    tr.net.forward(True)
    y = np.array(tr.net.output(), np.float64).ravel()
    np.testing.assert_allclose(y, sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
                               .ravel(), rtol=1e-5, atol=max(atol, 1e-6))
    tr.net.backward(dy)
    (net(x) * torch.tensor(dy)).sum().backward()
    params = list(net.parameters())
    assert len(tr.net.trainable) == len(params)
    for k in tr.net.trainable:
        g = np.asarray(tr.net.sink.acc[k]).ravel()
        # (a Conv2d weight as utrain lays it out: [O, kh, kw, C])
        assert any(np.allclose(g, (p.grad.permute(0, 2, 3, 1) if p.dim() == 4 else p.grad)
                               .numpy().ravel(), rtol=1e-4, atol=atol)
                   for p in params if p.numel() == g.size), (k, g)


def test_masks_and_min_forward_is_onnx_runtimes_and_gradients_autograds(tmp_path):
    pytest.importorskip('onnxruntime')
    import onnx
    torch.manual_seed(0)
    net = Masks()
    src = _onnx(net, tmp_path / 'm.onnx', (1, 5, 4))
    ops = {n.op_type for n in onnx.load(src).graph.node}
    assert {'Equal', 'Not', 'Where', 'Greater', 'LessOrEqual', 'ReduceMin'} <= ops, ops
    x = torch.tensor(np.random.default_rng(2).normal(size=(1, 5, 4)).astype(F32))
    h = net.a(x)
    assert (h == h.amin(1, keepdim=True)).sum() and (h > 0.3).any() and (h <= -0.2).any()
    _agrees(net, src, tmp_path / 'run', x, np.array([[0.5, -1.0, 2.0]], F32))


def test_qdq_model_trains_dequantized_and_exports_at_its_scales(tmp_path):
    """A QDQ model: prepare says it trains dequantized; utrain's forward is ONNX
    Runtime's on the float model with the QDQ file's weights (its activations'
    QuantizeLinear/DequantizeLinear pairs left out); one epoch of SGD, exported, is the trained weights rounded at
    the file's scales, which ONNX Runtime runs."""
    ort = pytest.importorskip('onnxruntime')
    import onnx
    from onnx import numpy_helper
    from host_tools.prepare.pipeline import prepare, export
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 3))
    fp = _onnx(net, tmp_path / 'f.onnx', (1, 2, 6, 6), names=['x'])
    rng = np.random.default_rng(0)
    xs = rng.random((12, 2, 6, 6)).astype(F32)

    src = _qdq(fp, xs, tmp_path / 'q.onnx', per_channel=True)
    assert 'QuantizeLinear' in {n.op_type for n in onnx.load(src).graph.node}
    np.savez(tmp_path / 'd.npz', x=xs, y=rng.integers(0, 3, 12))
    said = []
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
            from_logits=True, lr=0.5, epochs=1, log=lambda *a, **k: said.append(' '.join(map(str, a))))
    assert any('QDQ model' in s and 'dequantized' in s for s in said), said
    from host_tools.prepare.infer import utrain_predictor
    got = utrain_predictor(src)(xs)         # (the board's code, the file's NCHW samples)
    # (ONNX Runtime's run of the float file with the weights the QDQ file's, dequantized:
    # the activations' pairs round, the QDQ file's own run differs by that)
    q = {t.name: numpy_helper.to_array(t) for t in onnx.load(src).graph.initializer}
    f = onnx.load(fp)
    for t in f.graph.initializer:
        w = q[t.name + '_quantized']
        sc, zp = (q[t.name + k] for k in ('_scale', '_zero_point')) if t.name + '_scale' in q \
            else (q[t.name + '_quantized' + k] for k in ('_scale', '_zero_point'))
        shape = [-1] + [1] * (w.ndim - 1)
        t.CopyFrom(numpy_helper.from_array(
            ((w - zp.reshape(shape).astype(np.float64)) * sc.reshape(shape)).astype(F32), t.name))
    fs = ort.InferenceSession(f.SerializeToString(), providers=['CPUExecutionProvider'])
    ref = np.concatenate([fs.run(None, {'x': x[None]})[0] for x in xs])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # one epoch of SGD, exported: each weight the trained value rounded at its scale
    from host_tools.target.runner import run
    run(os.fspath(out), python=True)
    dst = os.fspath(tmp_path / 'out.onnx')
    export(src, os.fspath(out / 'trained.wof'), dst)
    a = {t.name: numpy_helper.to_array(t) for t in onnx.load(src).graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in onnx.load(dst).graph.initializer}
    moved = [n for n in a if a[n].dtype == np.int8 and not np.array_equal(a[n], b[n])]
    assert moved and all(b[n].dtype == a[n].dtype for n in a), moved
    ort.InferenceSession(dst, providers=['CPUExecutionProvider']).run(None, {'x': xs[:1]})


def test_evaluate_of_several_onnx_inputs_without_onnx_runtime(tmp_path, monkeypatch):
    """A model of two inputs (a sequence and a feature vector): evaluate where onnxruntime
    is not installed scores utrain's own forward, the inputs joined as prepare joins them,
    as ONNX Runtime scores it (it had been refused: pip install onnxruntime)."""
    from host_tools.prepare.infer import evaluate

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.f, self.o = nn.Conv1d(3, 4, 3), nn.Linear(2, 4), nn.Linear(8, 3)

        def forward(self, a, b):
            return self.o(torch.cat([self.c(a).mean(-1), torch.relu(self.f(b))], 1))
    torch.manual_seed(0)
    src = _onnx(Two(), tmp_path / 't.onnx', (1, 3, 8), (1, 2), names=['seq', 'feat'])
    r = np.random.default_rng(1)
    np.savez(tmp_path / 'd.npz', seq=r.normal(size=(10, 3, 8)).astype(F32),
             feat=r.normal(size=(10, 2)).astype(F32), y=np.arange(10) % 3)
    ref = evaluate(src, tmp_path / 'd.npz')
    monkeypatch.setitem(sys.modules, 'onnxruntime', None)      # (import raises ImportError)
    got = evaluate(src, tmp_path / 'd.npz')
    assert ref['runtime'] == 'ONNX Runtime' and got['runtime'].startswith('utrain\'s own'), got
    assert got['hits'] == ref['hits'] and abs(got['loss'] - ref['loss']) < 1e-5, (got, ref)


@pytest.mark.parametrize('k, stride, pad', [(3, 1, 1), ((2, 3, 2), (2, 1, 2), (1, 0, 1)),
                                             (2, 1, 0)])
def test_a_conv3d_trains_as_conv2ds_and_exports_into_its_weight(tmp_path, k, stride, pad):
    """nn.Conv3d through torch.onnx (a Conv of three spatial dimensions) had been refused
    ('utrain runs 1-D and 2-D convolutions').  The reader writes TFLite's CONV_3D between
    TRANSPOSEs (ONNX's pads kept), which prepare spells as Keras Conv3D's are
    (spellings.conv3d_to_conv2d: a CONV_2D per output frame and depth tap): utrain's
    forward is ONNX Runtime's, each depth tap's gradient PyTorch autograd's of that slice
    of the weight, and export puts the taps back into the Conv's weight (ONNX Runtime
    runs the exported file as utrain runs the trained weights)."""
    from test_onnx_dynamic_3d import _onnx_3d_trains_and_exports
    torch.manual_seed(0)
    conv = nn.Conv3d(2, 3, k, stride=stride, padding=pad)
    # (weight [O, C, kd, kh, kw]: tap i is utrain's [O, kh, kw, C])
    _onnx_3d_trains_and_exports(tmp_path, conv, (1, 2, 4, 5, 5), lambda g: {
        f'0.weight/tap{i}': g[:, :, i].numpy().transpose(0, 2, 3, 1)
        for i in range(conv.weight.shape[2])})


def test_qdq_model_with_a_quantized_constant_operand(tmp_path):
    """quantize_static quantizes a Mul's constant too (0.1 * h: a Constant node, its
    QuantizeLinear / DequantizeLinear pair folded to the rounded value); the pair of a
    constant whose range starts at 0 had been read as a Relu of it, which no constant
    folding takes ('cannot fold this op on constants')."""
    pytest.importorskip('onnxruntime')
    from host_tools.prepare.infer import utrain_predictor

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(torch.where(h != 0, h, 0.1 * self.a(x)))
    torch.manual_seed(0)
    fp = _onnx(Net(), tmp_path / 'f.onnx', (1, 4), names=['x'])
    xs = np.random.default_rng(0).normal(size=(16, 4)).astype(F32)

    src = _qdq(fp, xs, tmp_path / 'q.onnx')
    import onnxruntime as ort
    sess = ort.InferenceSession(src, providers=['CPUExecutionProvider'])
    ref = np.concatenate([sess.run(None, {'x': x[None]})[0] for x in xs])
    got = utrain_predictor(src)(xs)
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max(), (got, ref)


class QopNet(nn.Module):
    """Conv + ReLU, MaxPool, Flatten, Linear + ReLU, a residual Add, Sigmoid, Mul, and a
    LeakyReLU + global average pool branch joined by cat: quantize_static's QOperator
    format writes QLinearConv, QGemm, QLinearAdd, QLinearSigmoid, QLinearMul,
    QLinearLeakyRelu, QLinearGlobalAveragePool and QLinearConcat for them."""

    def __init__(self):
        super().__init__()
        self.c, self.c2 = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(2, 3, 3)
        self.a, self.b, self.o = nn.Linear(36, 6), nn.Linear(6, 6), nn.Linear(9, 3)

    def forward(self, x):
        h = torch.relu(self.a(torch.flatten(nn.functional.max_pool2d(torch.relu(self.c(x)), 2), 1)))
        g = torch.sigmoid(h + self.b(h)) * h
        k = nn.functional.adaptive_avg_pool2d(nn.functional.leaky_relu(self.c2(x), 0.1), 1)
        return self.o(torch.cat([g, k.flatten(1)], 1))


def test_qoperator_model_trains_dequantized_and_exports_into_its_integer_ops(tmp_path):
    """A QOperator model (quantize_static(quant_format=QOperator), per channel) had been
    refused ('whose integer ops utrain does not run').  Its ops read as the QDQ format's
    float op between DequantizeLinear and QuantizeLinear: prepare says it trains
    dequantized; utrain's forward is ONNX Runtime's on the float model whose weights are
    the QOperator file's dequantized (an int32 bias at the product of its operands'
    scales), the gradients PyTorch autograd's of that model; one epoch of SGD, exported,
    moves the QOperator file's int8 weights and int32 biases, which ONNX Runtime runs."""
    ort = pytest.importorskip('onnxruntime')
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantFormat
    from host_tools.prepare.pipeline import prepare, export
    from host_tools.target.runner import run
    from test_parity import new_trainer
    from utrain.sink import Sums
    torch.manual_seed(3)
    net = QopNet().eval()
    fp = _onnx(net, tmp_path / 'f.onnx', (1, 2, 6, 6), names=['x'])
    rng = np.random.default_rng(0)
    xs = rng.random((12, 2, 6, 6)).astype(F32)
    src = _qdq(fp, xs, tmp_path / 'q.onnx', per_channel=True, quant_format=QuantFormat.QOperator)
    qm = onnx.load(src)
    have = {n.op_type for n in qm.graph.node}
    assert {'QLinearConv', 'QGemm', 'QLinearAdd', 'QLinearSigmoid', 'QLinearMul',
            'QLinearLeakyRelu', 'QLinearGlobalAveragePool', 'QLinearConcat', 'MaxPool'} <= have, have
    # the float model with the QOperator file's weights, dequantized (the reference)
    q = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in qm.graph.initializer}
    deq = {}
    for n in qm.graph.node:
        if n.op_type in ('QLinearConv', 'QGemm'):
            w, ws, wz = (q[v] for v in n.input[3:6])
            shape = [-1] + [1] * (w.ndim - 1)
            deq[n.input[3]] = (w - wz.reshape(shape)) * ws.reshape(shape)
            deq[n.input[8 if n.op_type == 'QLinearConv' else 6]] = \
                q[n.input[8 if n.op_type == 'QLinearConv' else 6]] * q[n.input[1]] * ws
    assert len(deq) == 10
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.tensor(deq[name + '_quantized'].reshape(p.shape)))
    f = onnx.load(fp)
    for t in f.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(deq[t.name + '_quantized'].astype(F32), t.name))
    fs = ort.InferenceSession(f.SerializeToString(), providers=['CPUExecutionProvider'])

    np.savez(tmp_path / 'd.npz', x=xs, y=rng.integers(0, 3, 12))
    said, out = [], tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
            from_logits=True, lr=0.5, epochs=1, backend='fallback',
            log=lambda *a, **k: said.append(' '.join(map(str, a))))
    assert any('QOperator model' in s and 'dequantized' in s for s in said), said
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    tr.net.sink = Sums(tr.net)
    x = xs[:1]
    tr.set_input(x)
    tr.net.forward(True)
    y = np.array(tr.net.output(), np.float64).ravel()
    np.testing.assert_allclose(y, fs.run(None, {'x': x})[0].ravel(), rtol=1e-5, atol=1e-5)
    dy = np.array([[0.5, -1.0, 2.0]], F32)
    tr.net.backward(dy)
    (net(torch.tensor(x)) * torch.tensor(dy)).sum().backward()
    params = list(net.parameters())
    assert len(tr.net.trainable) == len(params)
    for k in tr.net.trainable:
        g = np.asarray(tr.net.sink.acc[k]).ravel()
        want = [p.grad.numpy() for p in params if p.numel() == g.size]
        # (a conv weight as [O, kh, kw, C], the first Linear's columns in NHWC order)
        assert any(np.allclose(np.sort(g), np.sort(w.ravel()), rtol=1e-4, atol=1e-6)
                   for w in want), (k, g)
    run(os.fspath(out), python=True)
    dst = os.fspath(tmp_path / 'out.onnx')
    export(src, os.fspath(out / 'trained.wof'), dst)
    a = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in onnx.load(dst).graph.initializer}
    moved = [n for n in a if a[n].dtype in (np.int8, np.int32) and not np.array_equal(a[n], b[n])]
    assert len(moved) == 10 and all(b[n].dtype == a[n].dtype for n in a), moved
    assert [n.op_type for n in onnx.load(dst).graph.node] == [n.op_type for n in qm.graph.node]
    ort.InferenceSession(dst, providers=['CPUExecutionProvider']).run(None, {'x': xs[:1]})


def test_pow_of_any_constant_exponent_is_onnx_runtimes_and_autograds(tmp_path):
    """x ** e of a constant e other than 2 and 0.5 had been refused ('utrain has x**2
    and x**0.5 only'): h ** 3, (|h| + 0.5) ** 1.5, (h h + 1) ** -2 and (relu(h) + 1) **
    0.25 (MULs, a DIV of 1, EXP(e LOG x): spellings._pow_steps): utrain's forward is ONNX
    Runtime's, the gradients PyTorch autograd's."""
    pytest.importorskip('onnxruntime')
    import onnx

    class Powers(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

        def forward(self, x):
            h = self.a(x)
            return self.b(h ** 3 + (h.abs() + 0.5) ** 1.5 + (h * h + 1.0) ** -2
                          + (torch.relu(h) + 1.0) ** 0.25)
    torch.manual_seed(0)
    net = Powers()
    src = _onnx(net, tmp_path / 'p.onnx', (1, 4))
    pows = [n for n in onnx.load(src).graph.node if n.op_type == 'Pow']
    assert len(pows) == 4, [n.op_type for n in onnx.load(src).graph.node]
    x = torch.tensor(np.random.default_rng(2).normal(size=(1, 4)).astype(F32))
    _agrees(net, src, tmp_path / 'run', x, np.array([[0.5, -1.0, 2.0]], F32), atol=1e-5)


def test_round_floor_ceil_are_onnx_runtimes_and_pass_no_gradient(tmp_path):
    """torch.round, torch.floor, torch.ceil and torch.sign through torch.onnx (Round,
    Floor, Ceil, Sign)
    had been refused as ops utrain cannot read: forward ONNX Runtime's (Round half to
    even), gradients PyTorch autograd's (none through the steps: h trains through the
    other terms)."""
    pytest.importorskip('onnxruntime')

    class Steps(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

        def forward(self, x):
            h = self.a(x) * 3.0
            return self.b(torch.round(h) * h + torch.floor(h) - torch.ceil(h * 0.5) * 2.0 + h
                          + torch.sign(h) * h)
    torch.manual_seed(0)
    net = Steps()
    src = _onnx(net, tmp_path / 's.onnx', (1, 4))
    import onnx
    assert {'Round', 'Floor', 'Ceil', 'Sign'} <= {n.op_type for n in onnx.load(src).graph.node}
    x = torch.tensor(np.random.default_rng(3).normal(size=(1, 4)).astype(F32))
    _agrees(net, src, tmp_path / 'run', x, np.array([[0.5, -1.0, 2.0]], F32))


def test_reflect_edge_valued_and_negative_pads_are_onnx_runtimes_and_autograds(tmp_path):
    """F.pad(mode='reflect') (ReflectionPad: ONNX Pad mode reflect, TFLite's MIRROR_PAD),
    mode='replicate' (Pad mode edge), F.pad(value=c) of a nonzero c (PADV2) and negative
    pads (a crop) had been refused ('utrain pads with zeros', 'negative pads (crops) are
    not supported'): rows mirrored or repeated by slices and a concatenation
    (spellings.mirror_pads), SUB c, PAD, ADD c (spellings.padv2_to_pad), a STRIDED_SLICE; forward ONNX Runtime's, gradients
    PyTorch autograd's."""
    pytest.importorskip('onnxruntime')
    F = nn.functional

    class Pads(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.e = nn.Conv2d(2, 3, 3), nn.Conv2d(2, 2, 3)
            self.o = nn.Linear(3 + 2 * 8 + 2 + 2 * 4 * 3, 3)

        def forward(self, x):
            h = self.c(F.pad(x, (2, 1, 1, 1), mode='reflect')).mean((2, 3))       # [1, 3]
            s = F.pad(x[:, :, 0, :], (1, 2), value=0.5)                         # [1, 2, 8]
            e = self.e(F.pad(x, (1, 1, 2, 0), mode='replicate')).mean((2, 3))   # [1, 2]
            c = F.pad(x, (-1, -1, 0, -1))                                        # [1, 2, 4, 3]
            return self.o(torch.cat([h, s.flatten(1), e, c.flatten(1)], 1))
    torch.manual_seed(0)
    net = Pads()
    src = _onnx(net, tmp_path / 'p.onnx', (1, 2, 5, 5))
    import onnx
    modes = sorted(_attrs_of(n).get('mode', 'constant') for n in onnx.load(src).graph.node
                   if n.op_type == 'Pad')
    assert modes == ['constant', 'constant', 'edge', 'reflect'], modes
    x = torch.tensor(np.random.default_rng(4).normal(size=(1, 2, 5, 5)).astype(F32))
    _agrees(net, src, tmp_path / 'run', x, np.array([[0.5, -1.0, 2.0]], F32))


def _attrs_of(node):
    from host_tools.formats.onnx_io import _attrs
    return _attrs(node)


def test_a_concat_with_constants_is_onnx_runtimes_and_autograds(tmp_path):
    """torch.cat of activations with constants (CoordConv's coordinate channels on a
    feature map, a fixed vector beside features) had been refused ('concatenating
    constants with activations is not supported'): the constants laid out as the
    activations, frozen; forward ONNX Runtime's, gradients PyTorch autograd's."""
    pytest.importorskip('onnxruntime')

    class Coords(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.a, self.o = nn.Conv2d(4, 3, 3), nn.Linear(3, 5), nn.Linear(7, 3)
            yy, xx = torch.meshgrid(torch.linspace(-1, 1, 5), torch.linspace(-1, 1, 5),
                                    indexing='ij')
            self.register_buffer('xy', torch.stack([yy, xx])[None])
            self.register_buffer('k', torch.tensor([[0.5, -2.0]]))

        def forward(self, x):
            h = torch.relu(self.c(torch.cat([x, self.xy], 1))).mean((2, 3))
            return self.o(torch.cat([self.k, torch.tanh(self.a(h))], 1))
    torch.manual_seed(0)
    net = Coords()
    src = _onnx(net, tmp_path / 'c.onnx', (1, 2, 5, 5))
    x = torch.tensor(np.random.default_rng(5).normal(size=(1, 2, 5, 5)).astype(F32))
    _agrees(net, src, tmp_path / 'run', x, np.array([[0.5, -1.0, 2.0]], F32))


@pytest.mark.parametrize('mode', ['CRD', 'DCR'])
def test_a_pixel_shuffle_is_onnx_runtimes_and_autograds(tmp_path, mode):
    """nn.PixelShuffle (ONNX DepthToSpace, mode CRD) and DepthToSpace mode DCR (TFLite's
    order: the exported node's mode changed, the PyTorch reference its reshapes) had been
    refused as ops utrain cannot read: slices of the channels, concatenations and
    RESHAPEs (spellings.depth_to_space); forward ONNX Runtime's, gradients PyTorch
    autograd's."""
    pytest.importorskip('onnxruntime')
    import onnx
    from onnx import helper

    class Shuffle(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.d, self.o = nn.Conv2d(2, 8, 1), nn.Conv2d(2, 3, 3), nn.Linear(3, 3)
            self.mode = 'CRD'

        def forward(self, x):
            h = self.c(x)                                       # [1, 8, 3, 2]
            if self.mode == 'CRD':
                s = nn.functional.pixel_shuffle(h, 2)           # [1, 2, 6, 4]
            else:       # (DCR: channel (i*2 + j)*2 + c)
                s = h.reshape(1, 2, 2, 2, 3, 2).permute(0, 3, 4, 1, 5, 2).reshape(1, 2, 6, 4)
            return self.o(torch.tanh(self.d(s)).mean((2, 3)))
    torch.manual_seed(0)
    net = Shuffle()
    src = _onnx(net, tmp_path / 's.onnx', (1, 2, 3, 2))
    m = onnx.load(src)
    node = next(n for n in m.graph.node if n.op_type == 'DepthToSpace')
    assert _attrs_of(node).get('mode') == 'CRD'
    if mode == 'DCR':
        net.mode = 'DCR'
        kept = [t for t in node.attribute if t.name != 'mode']
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute('mode', 'DCR')])
        onnx.save(m, src)
    x = torch.tensor(np.random.default_rng(6).normal(size=(1, 2, 3, 2)).astype(F32))
    _agrees(net, src, tmp_path / 'run', x, np.array([[0.5, -1.0, 2.0]], F32))
