""".onnx models in (host_tools/formats/onnx_io.py): PyTorch models exported by torch.onnx.export
(TorchScript exporter at opsets 13 and 17, BatchNorm kept; the dynamo exporter), read into
the graph IR, prepared, their untrained forward compared with ONNX Runtime's and
PyTorch's; trained under CPython and unix MicroPython; exported back to .onnx, whose
ONNX Runtime inference must equal utrain's forward with the trained weights."""
import json
import os
import warnings

import numpy as np
import pytest

from test_parity import BACKENDS, new_trainer  # sys.path set up there
from host_tools.formats.circle_io import ModelError, read_model
from host_tools.graph.passes import PrepareError
from host_tools.prepare.pipeline import export, prepare
from host_tools.target.runner import run

torch = pytest.importorskip('torch')
onnx = pytest.importorskip('onnx')
ort = pytest.importorskip('onnxruntime')
nn = torch.nn

FWD_TOL = 2e-6          # absolute, outputs of order 1


class ResCNN(nn.Module):
    """Conv-BN-ReLU, depthwise conv-BN-ReLU, 1x1 conv added back (residual), MaxPool,
    global average pool, Linear: 3x8x8 -> 4."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn2 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn1(self.c1(x)))
        y = y + self.c2(torch.relu(self.bn2(self.dw(y))))
        y = nn.functional.adaptive_avg_pool2d(self.pool(y), 1)
        return self.fc(torch.flatten(y, 1))


class Mixed(nn.Module):
    """A stride-2 padded conv (PAD + VALID), HardSwish, slices and a concat of channels,
    AvgPool, a flatten of a 2x2 map into a Linear (NHWC columns), LayerNorm, Softmax."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 6, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(6, 4, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(16, 5)
        self.ln = nn.LayerNorm(5)

    def forward(self, x):
        a = nn.functional.hardswish(self.c1(x))
        b = torch.sigmoid(self.c2(a))[:, :2]
        c = torch.cat([b, torch.tanh(a[:, 2:4])], 1)
        return torch.softmax(self.ln(self.fc(torch.flatten(self.pool(c), 1))), -1)


class SE(nn.Module):
    """Squeeze-and-excitation: a mean over H, W through two Linears scales the map's
    channels (a [N, C] vector reshaped to [N, C, 1, 1] times an NCHW map), a flatten
    whose shape is computed from Shape/Gather/Concat, and a BatchNorm1d on a vector."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(8, 4), nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.p = nn.AvgPool2d(2)
        self.out = nn.Linear(8 * 4 * 4, 3)

    def forward(self, x):
        y = torch.relu(self.c(x))
        w = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3))))))
        y = self.p(y * w.view(-1, 8, 1, 1))
        return self.out(y.reshape(y.shape[0], -1)) + self.bn(y.mean((2, 3)))[:, :3]


def pools():
    """Pools as PyTorch pads them: average counting the padding (PAD + VALID), max with
    padding (SAME), average in ceil mode (SAME), into a flatten of a 3x3 map."""
    return nn.Sequential(nn.Conv2d(2, 3, 1), nn.AvgPool2d(3, 1, 1), nn.MaxPool2d(3, 1, 1),
                         nn.AvgPool2d(3, 1, 1, count_include_pad=False),
                         nn.AvgPool2d(2, 2, ceil_mode=True), nn.Flatten(), nn.Linear(27, 3))


def mlp():
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 8), nn.GELU(),
                         nn.LayerNorm(8), nn.Linear(8, 3))


def softplus():
    # issue 28: Softplus and Mish were refused (no EXP / LOG on the device)
    return nn.Sequential(nn.Linear(10, 12), nn.Softplus(), nn.Linear(12, 8), nn.Mish(),
                         nn.Linear(8, 3))


def elus():
    # a GitHub CIFAR net (nn.SELU) was refused: 'cannot read ONNX op Selu'; nn.ELU(alpha)
    # other than 1, CELU and Softsign were refused too
    return nn.Sequential(nn.Linear(10, 12), nn.SELU(), nn.Linear(12, 8), nn.ELU(0.4),
                         nn.Linear(8, 8), nn.CELU(2.0), nn.Linear(8, 6), nn.Softsign(),
                         nn.Linear(6, 3))


def _seeded(model, seed):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)):
            with torch.no_grad():
                c = m.weight.shape[0]
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.rand(c, generator=g) - 0.5)
                if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                    m.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                    m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
    return model.eval()


def prelu():
    # PReLU was refused ("use LeakyReLU"): a slope per channel after a conv (NCHW [C, 1,
    # 1]), one slope after a Linear
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.PReLU(4), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 6), nn.PReLU(), nn.Linear(6, 3))


class Normalize(nn.Module):
    """F.normalize over a feature map's channels and over a vector (ReduceL2, refused
    before; Clip, Expand, Div)."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(2, 4, 3, padding=1)
        self.a, self.f = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):
        y = nn.functional.normalize(self.c(x), dim=1).mean((2, 3))
        return self.f(nn.functional.normalize(self.a(y), dim=-1))


def grouped():
    # group convolutions (1 < groups < channels: refused before, "utrain runs group 1
    # and depthwise convolutions"): split into groups by prepare, joined back on export
    return nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(6, 4, 3, padding=1, groups=2), nn.ReLU(),
                         nn.Conv2d(4, 6, 1, groups=2, bias=False), nn.Flatten(),
                         nn.Linear(6 * 4 * 4, 3))


def grouped1d():
    return nn.Sequential(nn.Conv1d(4, 6, 3, groups=2), nn.Tanh(), nn.Conv1d(6, 6, 3, groups=3),
                         nn.Flatten(), nn.Linear(6 * 6, 3))


def tconv():
    # a conv autoencoder's decoder (issue 28): ConvTranspose2d 3x3 stride 2 with PyTorch's
    # padding=1, output_padding=1 (TFLite's SAME pads otherwise: VALID to 9x9, sliced),
    # 4x4 stride 2 padding 1 (TFLite's SAME), and an unpadded one without bias
    return nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.ReLU(),
                         nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1),
                         nn.Tanh(), nn.ConvTranspose2d(3, 2, 4, stride=2, padding=1),
                         nn.ReLU(), nn.ConvTranspose2d(2, 2, (2, 3), stride=(1, 2), bias=False),
                         nn.Flatten(), nn.Linear(2 * 17 * 33, 3))


def tconv1d():
    return nn.Sequential(nn.Conv1d(4, 4, 3, stride=2), nn.ReLU(),
                         nn.ConvTranspose1d(4, 2, 5, stride=2, padding=2, output_padding=1),
                         nn.Flatten(), nn.Linear(2 * 8, 3))


# name -> (builder, input shape, exporter options)
MODELS = {
    'rescnn-13': (ResCNN, (3, 8, 8), dict(opset_version=13, dynamo=False)),
    'rescnn-17': (ResCNN, (3, 8, 8), dict(opset_version=17, dynamo=False)),
    'rescnn-dynamo': (ResCNN, (3, 8, 8), dict(dynamo=True)),
    'mixed-17': (Mixed, (2, 8, 8), dict(opset_version=17, dynamo=False)),
    'se-17': (SE, (3, 8, 8), dict(opset_version=17, dynamo=False)),
    'pools-17': (pools, (2, 5, 5), dict(opset_version=17, dynamo=False)),
    'mlp-13': (mlp, (10,), dict(opset_version=13, dynamo=False)),
    'mlp-17': (mlp, (10,), dict(opset_version=17, dynamo=False)),
    # (GELU as the dynamo exporter writes it below opset 20, x * (0.5 * (1 + erf(x /
    # sqrt 2))), was refused as 'Erf outside the GELU pattern')
    'mlp-dynamo-18': (mlp, (10,), dict(dynamo=True, opset_version=18)),
    'softplus-17': (softplus, (10,), dict(opset_version=17, dynamo=False)),
    'prelu-17': (prelu, (2, 4, 4), dict(opset_version=17, dynamo=False)),
    'normalize-17': (Normalize, (2, 4, 4), dict(opset_version=17, dynamo=False)),
    'grouped-17': (grouped, (2, 4, 4), dict(opset_version=17, dynamo=False)),
    'grouped1d-17': (grouped1d, (4, 10), dict(opset_version=17, dynamo=False)),
    'tconv-17': (tconv, (2, 8, 8), dict(opset_version=17, dynamo=False)),
    'tconv1d-17': (tconv1d, (4, 9), dict(opset_version=17, dynamo=False)),
}


def export_model(name, folder):
    make, shape, opts = MODELS[name]
    torch.manual_seed(0)
    model = _seeded(make(), 1)
    path = os.path.join(folder, name + '.onnx')
    if not os.path.exists(path):
        kw = dict(opts)
        if not kw.get('dynamo'):
            # do_constant_folding=False keeps BatchNormalization (eval-mode export
            # otherwise folds it into the conv); a symbolic batch as users export it
            kw.update(do_constant_folding=False, input_names=['x'], output_names=['y'],
                      dynamic_axes={'x': {0: 'batch'}, 'y': {0: 'batch'}})
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            try:
                torch.onnx.export(model, (torch.zeros((1,) + shape),), path, **kw)
            except Exception as e:              # the dynamo exporter's optional parts
                if kw.get('dynamo'):
                    pytest.skip(f'dynamo exporter unavailable: {e}')
                raise
    return model, path, shape


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return os.fspath(tmp_path_factory.mktemp('onnx'))


def ort_run(path, x):
    s = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    name = s.get_inputs()[0].name
    return np.stack([s.run(None, {name: x[i:i + 1]})[0].reshape(-1) for i in range(len(x))])


def utrain_run(run_dir, x, weights='weights.wof'):
    """utrain's forward (micro/ code under CPython) on samples given in the ONNX model's
    layout: prepare.json's input_perm says how the rewritten model takes them."""
    perm = json.load(open(os.path.join(run_dir, 'prepare.json')))['input_perm']
    tr = new_trainer(os.path.join(run_dir, 'model.flat'), os.path.join(run_dir, weights))
    out = []
    for i in range(len(x)):
        xi = x[i:i + 1]
        xi = xi.transpose(perm) if perm else xi
        out.append(np.array(tr.predict(np.ascontiguousarray(
            xi.reshape(-1, xi.shape[-1]), np.float32)), np.float64, copy=True).reshape(-1))
    return np.stack(out)


def samples(shape, n=8, classes=3, seed=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n,) + shape).astype(np.float32), rng.integers(0, classes, n)


@pytest.mark.parametrize('name', list(MODELS))
def test_forward_matches_ort_and_torch(name, folder, tmp_path):
    model, path, shape = export_model(name, folder)
    g = read_model(path)
    assert g.ops and all(op.name.isupper() for op in g.ops)
    x, y = samples(shape)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    s = prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
                optimizer='sgd', lr=0.1, epochs=1, log=lambda *a: None)
    if len(shape) == 3:         # the NCHW input became NHWC, data transposed by prepare
        assert s['input_perm'] == [0, 2, 3, 1]
        assert 'TRANSPOSE' not in [op.name for op in read_model(os.path.join(d, 'rewritten.circle')).ops]
    got = utrain_run(d, x)
    ref = ort_run(path, x)
    with torch.no_grad():
        tref = model(torch.from_numpy(x)).numpy().reshape(len(x), -1)
    assert np.abs(got - ref).max() < FWD_TOL, np.abs(got - ref).max()
    assert np.abs(got - tref).max() < 1e-5
    if 'rescnn-1' in name:      # BatchNorm kept by the exporter: trains as scale and shift
        ops = [op.name for op in read_model(os.path.join(d, 'rewritten.circle')).ops]
        assert ops.count('MUL') == 2 and ops.count('DEPTHWISE_CONV_2D') == 1


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name,train', [('rescnn-17', 'all'), ('rescnn-13', 'last:6'),
                                        ('mlp-17', 'all'), ('prelu-17', 'all'),
                                        ('grouped-17', 'all'), ('grouped1d-17', 'last:3'),
                                        ('tconv-17', 'all'), ('tconv1d-17', 'all')])
def test_train_and_export(name, train, backend, folder, tmp_path):
    """prepare, a short training run, export .onnx: ORT on the export equals utrain's
    forward with the trained weights; the frozen stem (last:6) has its BatchNorm folded
    into the conv for training while the .onnx keeps conv and BatchNorm as they were."""
    if backend == 'micropython' and name not in ('rescnn-17', 'tconv-17'):
        pytest.skip('one model on unix MicroPython keeps the suite fast')
    model, path, shape = export_model(name, folder)
    x, y = samples(shape, n=8)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='adam', lr=0.01, batch=2, epochs=2, train=train, shuffle=True, seed=3,
            log=lambda *a: None)
    code, text = run(d, python=(backend == 'cpython'), stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    r = export(path, os.path.join(d, 'trained.wof'), out)
    assert r['tensors'] > 0
    got = utrain_run(d, x, 'trained.wof')
    ref = ort_run(out, x)
    before = ort_run(path, x)
    assert np.abs(got - ref).max() < FWD_TOL, np.abs(got - ref).max()
    assert np.abs(ref - before).max() > 100 * FWD_TOL         # it trained
    # -o .circle: the graph utrain trained, as circle, with the trained weights
    circ = os.fspath(tmp_path / 'trained.circle')
    export(path, os.path.join(d, 'trained.wof'), circ)
    from host_tools.files.wof import read_wof
    gc_ = read_model(circ)
    w = read_wof(os.path.join(d, 'trained.wof'), gc_)
    assert w and all(np.array_equal(gc_.tensors[k].data.reshape(-1), a.reshape(-1))
                     for k, a in w.items())
    # same graph, initializers replaced
    a, b = onnx.load(path), onnx.load(out)
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    assert [t.name for t in a.graph.initializer] == [t.name for t in b.graph.initializer]
    if train != 'all':
        from onnx import numpy_helper
        ia = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer}
        ib = {t.name: numpy_helper.to_array(t) for t in b.graph.initializer}
        frozen, trained = ('c1', 'fc') if name.startswith('rescnn') else ('0', '4')
        assert np.array_equal(ia[frozen + '.weight'], ib[frozen + '.weight'])     # frozen stays
        assert not np.array_equal(ia[trained + '.weight'], ib[trained + '.weight'])
        if name.startswith('grouped1d'):   # last:3 reaches the grouped conv: each group moved
            moved = np.abs(ia['2.weight'] - ib['2.weight']).reshape(3, -1).max(1)
            assert moved.min() > 1e-4, moved


class GaussPolicy(nn.Module):
    """A Stable-Baselines3 SAC actor as its ONNX export reads (a real GitHub one): the
    deterministic action tanh(mu + zeros_like(mu) * exp(clamp(log_std))), the zeros a
    ConstantOfShape of mu's run-time shape."""

    def __init__(self):
        super().__init__()
        self.h, self.mu, self.ls = nn.Linear(4, 8), nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.h(x))
        mu = self.mu(h)
        return torch.tanh(mu + torch.zeros_like(mu) * self.ls(h).clamp(-2, 2).exp())


def test_a_fill_of_a_run_time_shape_is_no_parameter(tmp_path):
    """A real GitHub SB3 policy export trained, then export refused its 'trained tensor
    /actor/ConstantOfShape_output_0' (the zeros a MUL reads: no parameter, which export
    cannot write back): a constant made of no initializer is frozen; the run trains the
    layers, export writes them, ORT on the export = utrain's forward."""
    torch.manual_seed(0)
    path = os.fspath(tmp_path / 'p.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(GaussPolicy().eval(), (torch.zeros(1, 4),), path, opset_version=17,
                          dynamo=False, input_names=['x'], output_names=['y'],
                          dynamic_axes={'x': {0: 'batch'}, 'y': {0: 'batch'}})
    assert 'ConstantOfShape' in [n.op_type for n in onnx.load(path).graph.node]
    x, _ = samples((4,), n=16)
    y = np.random.default_rng(1).uniform(-0.9, 0.9, (16, 2)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    s = prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.05, epochs=2,
                log=lambda *a: None)
    assert s['trainable_params'] == (4 * 8 + 8) + 2 * (8 * 2 + 2)     # (not the zeros)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(path, os.path.join(d, 'trained.wof'), out)
    from onnx import numpy_helper
    ia = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    ib = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert not np.array_equal(ia['mu.weight'], ib['mu.weight'])
    assert np.abs(utrain_run(d, x, 'trained.wof') - ort_run(out, x)).max() < FWD_TOL


def _tiny(path, op, attrs=None, extra_inputs=()):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 4])
    w = helper.make_tensor('w', TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    nodes = [helper.make_node('MatMul', ['x', 'w'], ['h'], name='dense'),
             helper.make_node(op, ['h', *extra_inputs], ['y'], name='the_odd_one', **(attrs or {}))]
    m = helper.make_model(helper.make_graph(nodes, 'g', [x], [y], [w]),
                          opset_imports=[helper.make_opsetid('', 17)])
    onnx.save(m, path)
    return path


@pytest.mark.parametrize('op,attrs,ref', [
    ('Softsign', {}, lambda h: h / (1 + np.abs(h))),
    ('Selu', {'alpha': 1.5, 'gamma': 1.2}, lambda h: 1.2 * np.where(h > 0, h, 1.5 * np.expm1(h))),
    ('Elu', {'alpha': 0.3}, lambda h: np.where(h > 0, h, 0.3 * np.expm1(h))),
    ('Celu', {'alpha': 0.5}, lambda h: np.maximum(h, 0) + np.minimum(0, 0.5 * np.expm1(h / 0.5))),
    ('Cast', {'to': 1}, lambda h: h)])
def test_elu_family_and_softsign_nodes_run(tmp_path, op, attrs, ref):
    """ONNX Selu (a real GitHub CIFAR net), Elu of another alpha, Celu and Softsign (as
    tf2onnx writes it; torch writes Abs/Add/Div) were refused: each is spelled with the
    device's ELU, RELU, MUL, ADD, DIV, and utrain's forward = the ONNX definition.  A
    Cast to float32 of an activation (a GitHub SB3 policy's export) is nothing to do."""
    p = _tiny(os.fspath(tmp_path / 'a.onnx'), op, attrs)
    x = (np.random.default_rng(0).standard_normal((6, 4)) * 2).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=x)
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', epochs=1, log=lambda *a: None)
    np.testing.assert_allclose(utrain_run(d, x), ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_an_input_of_an_open_size_says_which_and_how_to_fix_it(tmp_path):
    """Issue 28 (a real tf2onnx export from GitHub: a Keras Normalization input of shape
    [unk, unk]): the refusal names the input's open dimensions and how to export it with
    them fixed, where it said 'has no static shape'."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info('features', TensorProto.FLOAT, ['unk__6', 'unk__7'])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, ['unk__6', 4])
    w = helper.make_tensor('w', TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    m = helper.make_model(helper.make_graph([helper.make_node('MatMul', ['features', 'w'], ['y'])],
                                            'g', [x], [y], [w]),
                          opset_imports=[helper.make_opsetid('', 13)])
    p = os.fspath(tmp_path / 'open.onnx')
    onnx.save(m, p)
    with pytest.raises(ModelError, match=r"open.onnx: input 'features' has shape \[1, unk__7\]: "
                       r'dimension 1 known only at run time.*export the model with it fixed'):
        read_model(p)


def test_unsupported_node_is_named(tmp_path):
    p = _tiny(os.fspath(tmp_path / 'cos.onnx'), 'Cos')
    with pytest.raises(ModelError) as e:
        read_model(p)
    msg = str(e.value)
    assert p in msg and 'the_odd_one' in msg and 'Cos' in msg and 'supported' in msg
    p = _tiny(os.fspath(tmp_path / 'clip.onnx'), 'Clip', {'min': 3.0, 'max': -2.0})
    with pytest.raises(ModelError, match=r'the_odd_one.*Clip to \[3.0, -2.0\]: an empty range'):
        read_model(p)
    # (an onnxruntime-quantized model, a real GitHub one: what to give utrain instead)
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info('y', TensorProto.INT32, [1, 4])
    w = helper.make_tensor('w', TensorProto.UINT8, [4, 4], np.eye(4, dtype=np.uint8).ravel())
    nodes = [helper.make_node('DynamicQuantizeLinear', ['x'], ['q', 's', 'z'], name='dq'),
             helper.make_node('MatMulInteger', ['q', 'w', 'z'], ['y'], name='mmi')]
    p = os.fspath(tmp_path / 'dq.onnx')
    onnx.save(helper.make_model(helper.make_graph(nodes, 'g', [x], [y], [w]),
                                opset_imports=[helper.make_opsetid('', 17)]), p)
    with pytest.raises(ModelError, match=r'dq \(DynamicQuantizeLinear\).*onnxruntime'
                       r'.quantization.*the float model from before quantizing'):
        read_model(p)
    bad = tmp_path / 'junk.onnx'
    bad.write_bytes(b'\x00not an onnx model')
    with pytest.raises(ModelError, match='junk.onnx'):
        read_model(bad)


def test_int8_refusal_of_an_onnx_model_names_the_format_not_the_loss(tmp_path):
    """--int8 on an .onnx model ending in a sigmoid, 0/1 targets (bce, the loss the int8
    path takes on a final sigmoid): refused because it is an .onnx model (export writes
    .onnx from float32 training only), saying how to get int8 training, not that bce's
    outputs are no sigmoid's; without --int8 it prepares in float32."""
    p = _tiny(os.fspath(tmp_path / 'sig.onnx'), 'Sigmoid')
    r = np.random.default_rng(0)
    data = os.fspath(tmp_path / 'd.npz')
    np.savez(data, x=r.standard_normal((16, 4)).astype(np.float32),
             y=(r.random((16, 4)) > 0.5).astype(np.float32))
    with pytest.raises(PrepareError) as e:
        prepare(p, os.fspath(tmp_path / 'q'), data=data, int8=True, log=lambda *a: None)
    msg = str(e.value)
    assert msg.count(p) == 1 and '.onnx model' in msg and 'tico' in msg, msg
    assert 'not a final sigmoid' not in msg, msg
    s = prepare(p, os.fspath(tmp_path / 'f'), data=data, log=lambda *a: None)
    assert not s.get('int8') and s['settings']['loss'] == 'bce'


def test_shape_subgraph_folds(tmp_path):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write a flatten
    with a dynamic batch: folded to a constant shape; the model is FC -> RESHAPE -> FC."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, ['n', 2, 3])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, ['n', 2])
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor('w', TensorProto.FLOAT, [3, 4], rng.standard_normal(12)),
             helper.make_tensor('w2', TensorProto.FLOAT, [8, 2], rng.standard_normal(16)),
             helper.make_tensor('zero', TensorProto.INT64, [], [0]),
             helper.make_tensor('minus1', TensorProto.INT64, [1], [-1])]
    nodes = [helper.make_node('MatMul', ['x', 'w'], ['h']),
             helper.make_node('Shape', ['h'], ['s']),
             helper.make_node('Gather', ['s', 'zero'], ['b']),
             helper.make_node('Unsqueeze', ['b', 'ax'], ['b1']),
             helper.make_node('Constant', [], ['ax'], value_ints=[0]),
             helper.make_node('Concat', ['b1', 'minus1'], ['shape'], axis=0),
             helper.make_node('Reshape', ['h', 'shape'], ['f']),
             helper.make_node('Dropout', ['f'], ['fd']),
             helper.make_node('Identity', ['fd'], ['fi']),
             helper.make_node('MatMul', ['fi', 'w2'], ['y'])]
    nodes.insert(3, nodes.pop(4))           # the Constant before its reader
    m = helper.make_model(helper.make_graph(nodes, 'g', [x], [y], inits),
                          opset_imports=[helper.make_opsetid('', 17)])
    p = os.fspath(tmp_path / 'shape.onnx')
    onnx.save(m, p)
    g = read_model(p)
    assert [op.name for op in g.ops] == ['FULLY_CONNECTED', 'RESHAPE', 'FULLY_CONNECTED']
    xs = rng.standard_normal((3, 2, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=rng.standard_normal((3, 2)).astype(np.float32))
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.1,
            epochs=1, log=lambda *a: None)
    assert np.abs(utrain_run(d, xs) - ort_run(p, xs)).max() < FWD_TOL


def test_nhwc_model_as_tf2onnx_writes_it(tmp_path):
    """A Keras-style graph (tf2onnx): NHWC input, Transpose to NCHW before the Conv and
    back before the flatten, MatMul + Add, Softmax: read without a transpose, the input
    stays NHWC (no permutation of the data), the output equals ORT's."""
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.default_rng(0)
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, ['n', 8, 8, 3])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, ['n', 4])
    f32 = lambda a: a.astype(np.float32)   # noqa: E731
    inits = [numpy_helper.from_array(f32(r.standard_normal((6, 3, 3, 3)) * 0.3), 'k'),
             numpy_helper.from_array(f32(r.standard_normal(6)), 'kb'),
             numpy_helper.from_array(f32(r.standard_normal((96, 4)) * 0.1), 'w'),
             numpy_helper.from_array(f32(r.standard_normal(4)), 'b'),
             numpy_helper.from_array(np.array([-1, 96], np.int64), 'shape')]
    nodes = [helper.make_node('Transpose', ['x'], ['xt'], perm=[0, 3, 1, 2]),
             helper.make_node('Conv', ['xt', 'k', 'kb'], ['c'], pads=[1, 1, 1, 1]),
             helper.make_node('Relu', ['c'], ['r']),
             helper.make_node('MaxPool', ['r'], ['p'], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node('Transpose', ['p'], ['pt'], perm=[0, 2, 3, 1]),
             helper.make_node('Reshape', ['pt', 'shape'], ['f']),
             helper.make_node('MatMul', ['f', 'w'], ['m']),
             helper.make_node('Add', ['m', 'b'], ['a']),
             helper.make_node('Softmax', ['a'], ['y'], axis=-1)]
    m = helper.make_model(helper.make_graph(nodes, 'keras', [x], [y], inits),
                          opset_imports=[helper.make_opsetid('', 13)])
    p = os.fspath(tmp_path / 'keras.onnx')
    onnx.save(m, p)
    assert [op.name for op in read_model(p).ops] == [    # read as NHWC: nothing to rewrite
        'CONV_2D', 'RELU', 'MAX_POOL_2D', 'RESHAPE', 'FULLY_CONNECTED', 'SOFTMAX']
    xs = r.standard_normal((4, 8, 8, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.arange(4) % 4)
    d = os.fspath(tmp_path / 'run')
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', optimizer='sgd',
                lr=0.1, epochs=1, log=lambda *a: None)
    assert s['input_perm'] is None and s['rewritten'] is None
    assert np.abs(utrain_run(d, xs) - ort_run(p, xs)).max() < FWD_TOL


def _zoo_export(name, tmp_path, **kw):
    """The zoo's PyTorch model name (bench/zoo/nets.py) exported to ONNX in tmp_path
    (torch.onnx.export keywords kw): (path, its input shape, classes)."""
    from bench.zoo import nets
    model, shape, classes = nets.build(name)
    path = os.fspath(tmp_path / (name + '.onnx'))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(model.eval(), (torch.zeros(shape),), path, opset_version=17,
                          dynamo=False, **kw)
    return path, shape, classes


def _forward_error_against_ort(path, shape, classes, tmp_path):
    """prepare path on 3 samples and return the largest difference between utrain's
    forward of the prepared model and ORT's on them."""
    x, y = samples(tuple(shape[1:]), n=3, classes=classes)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='sgd', lr=0.1, epochs=1, log=lambda *a: None)
    return np.abs(utrain_run(d, x) - ort_run(path, x)).max()


@pytest.mark.parametrize('name', ['dscnn', 'imu', 'resnet8', 'lnblock'])
def test_zoo_models_read_as_ort_runs_them(name, tmp_path):
    """The zoo's PyTorch models (bench/zoo/nets.py: DS-CNN, the IMU conv net, ResNet-8,
    the LayerNorm/GELU block; BatchNorm kept) exported to ONNX: utrain's forward of the
    prepared model equals ORT's."""
    path, shape, classes = _zoo_export(name, tmp_path, do_constant_folding=False)
    assert _forward_error_against_ort(path, shape, classes, tmp_path) < FWD_TOL


@pytest.mark.parametrize('name', ['lstm', 'gru'])
def test_zoo_rnns_read_as_ort_runs_them(name, tmp_path):
    """The zoo's keyword models (nn.LSTM / nn.GRU over 20 frames, the final state h_n
    into a Linear) exported as ONNX LSTM/GRU nodes: unrolled, the same outputs as ORT."""
    path, shape, classes = _zoo_export(name, tmp_path)
    ops = [op.name for op in read_model(path).ops]
    assert ops.count('FULLY_CONNECTED') == 20 + 2 and 'CONCATENATION' not in ops
    assert _forward_error_against_ort(path, shape, classes, tmp_path) < FWD_TOL


class SeqNet(nn.Module):
    """Two stacked GRU layers (two GRU nodes), the whole output sequence read (a mean
    over time: Y concatenated)."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 5, num_layers=2, batch_first=True)
        self.fc = nn.Linear(5, 2)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(torch.tanh(y).mean(1))


def test_stacked_gru_reading_the_whole_sequence(tmp_path):
    torch.manual_seed(0)
    model = SeqNet().eval()
    path = os.fspath(tmp_path / 'seq.onnx')
    _export_sensor('gru', model, (6, 3), path)
    ops = [op.name for op in read_model(path).ops]
    assert ops.count('CONCATENATION') == 2          # each layer's Y read whole
    x, y = samples((6, 3), n=3, classes=2)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='sgd', lr=0.1, epochs=1, log=lambda *a: None)
    assert np.abs(utrain_run(d, x) - ort_run(path, x)).max() < FWD_TOL


@pytest.mark.parametrize('model,shape,match', [
    (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Upsample(scale_factor=2, mode='bicubic')),
     (1, 6, 6), r"\(Resize\): mode cubic: utrain resizes with mode 'linear' \(bilinear\) or 'nearest'"),
    (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Upsample(scale_factor=1.6, mode='bilinear')),
     (1, 6, 6), r'\(Resize\): resizing \[1, 2, 4, 4\] to \[1, 2, 6, 6\] \(linear, coordinate_'
     r'transformation_mode half_pixel\): scales \[1.6, 1.6\] do not give whole sizes'),
    (lambda: nn.Sequential(nn.Conv2d(1, 2, 3), nn.Upsample(scale_factor=1.7)), (1, 6, 6),
     r'\(Resize\): resizing \[1, 2, 4, 4\] to \[1, 2, 6, 6\] \(nearest, coordinate_transformation_mode '
     r'asymmetric, nearest_mode floor\): picks source pixels no TFLite resize picks'),
    (lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2)),
     (1, 6, 6), r'\(ConvTranspose\): group 2 with 4 input channels and a weight of shape '
     r'\[4, 2, 2, 2\]: utrain runs ungrouped transposed convolutions'),
    (lambda: nn.Sequential(nn.Linear(4, 3), nn.LogSoftmax(0)), (4,),
     r'\(LogSoftmax\): log_softmax over axis 0 of shape \[1, 3\]: utrain takes the last'),
])
def test_refused_layer_is_named(model, shape, match, tmp_path):
    """What utrain cannot unroll or map is refused naming the file, the node, the
    attribute and what the model should use instead."""
    torch.manual_seed(0)
    path = os.fspath(tmp_path / 'm.onnx')
    _export_sensor('m', model().eval(), shape, path, fold=True)
    with pytest.raises(ModelError, match='m.onnx: node ' + r'\S+ ' + match):
        read_model(path)


class _Interp(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return nn.functional.interpolate(x, **self.kw)


@pytest.mark.parametrize('resize', [
    dict(scale_factor=2, mode='bilinear'),                       # align_corners=False
    dict(size=(7, 5), mode='bilinear', align_corners=True),
    dict(size=(3, 5), mode='bilinear'),                          # down one axis, up the other
    dict(scale_factor=1.5, mode='nearest'),                      # asymmetric, floor
    dict(size=(5, 3), mode='nearest'),
])
def test_bilinear_and_nearest_resizes_train(resize, tmp_path):
    """Issue 28: PyTorch's bilinear interpolate, and nearest by factors not whole, had
    been refused (Resize mode linear / 'resizes by integer factors only'): they run as
    TFLite's RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR (op_rsz) with the flags that take
    the same source pixels: utrain's forward = ONNX Runtime's, and every weight trains
    (the convolution under the resize among them)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), _Interp(**resize), nn.Conv2d(3, 2, 2),
                          nn.Flatten(), nn.LazyLinear(3))
    model(torch.zeros(1, 2, 6, 6))
    path = os.fspath(tmp_path / 'r.onnx')
    _export_sensor('r', model.eval(), (2, 6, 6), path, fold=True)
    assert {op.name for op in read_model(path).ops} & {'RESIZE_BILINEAR', 'RESIZE_NEAREST_NEIGHBOR'}
    x, y = samples((2, 6, 6), n=6)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='sgd', lr=0.05, epochs=1, train='all', log=lambda *a: None)
    np.testing.assert_allclose(utrain_run(d, x), ort_run(path, x), atol=FWD_TOL * 3)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    from host_tools.files.wof import read_wof
    g = read_model(os.path.join(d, json.load(open(os.path.join(d, 'prepare.json')))['rewritten'])
                   if json.load(open(os.path.join(d, 'prepare.json'))).get('rewritten') else path)
    before, after = read_wof(os.path.join(d, 'weights.wof'), g), read_wof(os.path.join(d, 'trained.wof'), g)
    assert all(np.abs(after[k] - before[k]).max() > 0 for k in before), \
        [g.tensors[k].name for k in before if not np.abs(after[k] - before[k]).max() > 0]


def test_rows_of_logits_a_step_are_not_scored_as_one_class(tmp_path):
    """Issue 28 (a held-out PyTorch Conv1d head, logits [N, 4, T] a class a step, given
    one class a sample: evaluate scored the argmax of all 4 x T values, accuracy 0.01):
    refused saying what to give; prepare refuses it too, and a class a step for it says to
    transpose the map to rows of classes (was "mse wants one target per output")."""
    from host_tools.files.dataset import DataError
    from host_tools.prepare.infer import InferError, evaluate
    torch.manual_seed(0)
    m = nn.Conv1d(3, 4, 1).eval()
    path = os.fspath(tmp_path / 'head.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(m, (torch.zeros(1, 3, 6),), path, opset_version=17, dynamo=False)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / 'd.npz', x=rng.standard_normal((8, 3, 6)).astype(np.float32),
             y=rng.integers(0, 4, 8))
    with pytest.raises(InferError, match='one class number a sample, and the model outputs '
                                         r'\[4, 6\]'):
        evaluate(path, os.fspath(tmp_path / 'd.npz'))
    with pytest.raises(DataError, match='one class number a sample'):
        prepare(path, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),
                log=lambda *a: None)
    # a class a step (N, T) for the classes-first map: told to transpose it in the model
    np.savez(tmp_path / 's.npz', x=rng.standard_normal((8, 3, 6)).astype(np.float32),
             y=rng.integers(0, 4, (8, 6)))
    with pytest.raises(DataError, match=r'rows of classes, \(6, 4\), and it is \(4, 6\): '
                                        'transpose it in the model'):
        prepare(path, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 's.npz'),
                log=lambda *a: None)


def test_model_ending_in_log_softmax_trains_its_logits(tmp_path):
    """PyTorch's classifier for NLLLoss ends in log_softmax: the logits it reads train
    with cross-entropy from logits (the same loss and gradient), the exported .onnx keeps
    the LogSoftmax, and ORT on it gives utrain's trained logits minus their logsumexp.  A
    log_softmax that is not the model's last op is refused, naming it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.LogSoftmax(dim=1))
    path = os.fspath(tmp_path / 'nll.onnx')
    _export_sensor('nll', model.eval(), (6,), path, fold=True)
    assert [op.name for op in read_model(path).ops][-1] == 'FULLY_CONNECTED'
    x, y = samples((6,), n=12)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    lines = []
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), optimizer='sgd', lr=0.5, epochs=3,
            log=lines.append)
    cfg = json.load(open(os.path.join(d, 'train.json')))
    assert cfg['loss'] == 'scce' and cfg['from_logits'], cfg
    assert any('LOG_SOFTMAX' in ln and 'logits' in ln for ln in lines), lines
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(path, os.path.join(d, 'trained.wof'), out)
    assert [n.op_type for n in onnx.load(out).graph.node][-1] == 'LogSoftmax'
    logits = utrain_run(d, x, 'trained.wof')
    m = logits.max(1, keepdims=True)
    ref = logits - (m + np.log(np.exp(logits - m).sum(1, keepdims=True)))
    got = ort_run(out, x)
    assert np.abs(got - ref).max() < 1e-5
    assert np.abs(got - ort_run(path, x)).max() > 1e-3           # it trained

    class Mid(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 4), nn.Linear(4, 3)

        def forward(self, x):
            return self.b(torch.log_softmax(self.a(x), dim=-1))
    p2 = os.fspath(tmp_path / 'mid.onnx')
    _export_sensor('mid', Mid().eval(), (6,), p2, fold=True)
    with pytest.raises(PrepareError, match=r'mid.onnx: op 1 is LOG_SOFTMAX'):
        prepare(p2, os.fspath(tmp_path / 'run2'), data=os.fspath(tmp_path / 'd.npz'),
                log=lambda *a: None)


# --------------------------------------------------------------------------- sensor / vision
# layers a PyTorch user writes that the reader maps onto the device's ops: Conv1d and the
# 1-D pools (2-D ops over a unit H axis), nearest upsampling (copies concatenated), GRU
# and LSTM nodes (unrolled, one weight tensor read by every step).

class Sensor1d(nn.Module):
    """Conv1d-ELU, MaxPool1d, a stride-2 Conv1d-ReLU, AvgPool1d, a mean over time, Linear."""

    def __init__(self, bn=False):
        super().__init__()
        self.c1 = nn.Conv1d(3, 8, 5, padding=2)
        self.bn = nn.BatchNorm1d(8) if bn else nn.Identity()
        self.c2 = nn.Conv1d(8, 6, 3, stride=2)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y = nn.functional.max_pool1d(nn.functional.elu(self.bn(self.c1(x))), 2)
        y = nn.functional.avg_pool1d(torch.relu(self.c2(y)), 2, ceil_mode=False)
        return self.fc(y.mean(-1))


class UpNet(nn.Module):
    """Conv-ReLU, max pool, nn.Upsample(2) nearest, a concat with the skip, conv, a 1-D
    F.interpolate by 3 on the flattened rows, mean, Linear (a small U-Net decoder step)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode='nearest')
        self.c2 = nn.Conv2d(8, 4, 3, padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        y = torch.relu(self.c2(torch.cat([a, self.up(nn.functional.max_pool2d(a, 2))], 1)))
        y = nn.functional.interpolate(y.flatten(2), scale_factor=3, mode='nearest')
        return self.fc(y.mean(-1))


class RNN(nn.Module):
    """nn.GRU / nn.LSTM batch_first, one layer, the last step's output into a Linear."""

    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(4, 6, batch_first=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y[:, -1])


class CRNN(nn.Module):
    """Samples [N, L, C] as a logger writes them, transposed into a Conv1d-ReLU, a max
    pool over time, permuted back into an nn.GRU, the last step into a Linear."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(3, 6, 3, padding='same')
        self.rnn = nn.GRU(6, 5, batch_first=True)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        y = nn.functional.max_pool1d(torch.relu(self.c(x.transpose(1, 2))), 2)
        o, _ = self.rnn(y.permute(0, 2, 1))
        return self.fc(o[:, -1])


RNNS = ('gru', 'lstm', 'crnn', 'bigru', 'bilstm', 'bilstm-hn')


class BiLSTMState(nn.Module):
    """A bidirectional LSTM's final states of both directions (h_n[-2], h_n[-1])."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 3, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        _, (h, c) = self.rnn(x)
        return self.fc(torch.cat([h[-2], h[-1]], 1))


class MHA(nn.Module):
    """nn.MultiheadAttention (2 heads, its packed in-projection) over a Linear's features
    of [T, F] steps, a residual, the mean over time, a Linear (issue 28)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.inp(x)
        a, _ = self.att(h, h, h, need_weights=False)
        return self.fc((h + a).mean(1))


class Attention(nn.Module):
    """Hand-written softmax(Q K^T / sqrt d) V over 2 heads ([B, H, T, d] views), an
    output projection added back, the mean over time, a Linear."""

    def __init__(self, H=2, d=3):
        super().__init__()
        self.H, self.d = H, d
        self.q, self.k, self.v = (nn.Linear(4, H * d) for _ in range(3))
        self.o, self.fc = nn.Linear(H * d, 4), nn.Linear(4, 3)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (f(x).view(B, T, self.H, self.d).transpose(1, 2) for f in (self.q, self.k, self.v))
        p = torch.softmax(q @ k.transpose(-1, -2) / self.d ** 0.5, -1)
        o = (p @ v).transpose(1, 2).reshape(B, T, self.H * self.d)
        return self.fc((x + self.o(o)).mean(1))


SENSOR = {
    'mha': (MHA, (6, 4)),
    'attention': (Attention, (5, 4)),
    'conv1d': (Sensor1d, (3, 16)),
    'conv1d-bn': (lambda: Sensor1d(bn=True), (3, 16)),
    'upsample': (UpNet, (1, 6, 6)),
    'gru': (lambda: RNN(nn.GRU), (5, 4)),
    'lstm': (lambda: RNN(nn.LSTM), (5, 4)),
    'crnn': (CRNN, (8, 3)),
    'bigru': (lambda: RNN(lambda i, h, **k: nn.GRU(i, h // 2, bidirectional=True, **k)), (5, 4)),
    'bilstm': (lambda: RNN(lambda i, h, **k: nn.LSTM(i, h // 2, bidirectional=True, **k)), (5, 4)),
    'bilstm-hn': (BiLSTMState, (5, 4)),
}


def _export_sensor(name, model, shape, path, fold=None):
    # BatchNorm kept (no constant folding); the RNNs and attention as users export them
    # (folding on: their weights are initializers in ONNX's gate order, not computed by
    # Slice/Concat; a Linear's on a rank-3 input not by a Transpose node)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(model, (torch.zeros((1,) + shape),), path, opset_version=17,
                          dynamo=False, input_names=['x'], output_names=['y'],
                          do_constant_folding=name in RNNS + ('mha', 'attention', 'attnpool') if fold is None
                          else fold)


@pytest.mark.parametrize('name,backend', [(n, 'cpython') for n in SENSOR] + [
    pytest.param(n, b.values[0], marks=b.marks) for n in ('conv1d', 'gru', 'attention')
    for b in BACKENDS[1:]])
def test_sensor_layers_step_as_torch(name, backend, tmp_path):
    """Read (no op refused), utrain's forward equals ONNX Runtime's and PyTorch's; one SGD
    step of a batch of 4 under CPython, exported back to .onnx, moves every initializer
    as PyTorch's autograd step moves it (W_hh of a GRU/LSTM included: the gradients of
    the unrolled steps sum into the one recurrent weight).  BatchNorm1d kept trains as
    scale and shift (not PyTorch's parametrization): forward and export only.  A
    Conv1d and a GRU model also step so on unix MicroPython."""
    from onnx import numpy_helper
    make, shape = SENSOR[name]
    torch.manual_seed(0)
    model = _seeded(make(), 1)
    path = os.fspath(tmp_path / (name + '.onnx'))
    _export_sensor(name, model, shape, path)
    x, y = samples(shape, n=4)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    lr = 0.5
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='sgd', lr=lr, batch=4, epochs=1, log=lambda *a: None)
    got = utrain_run(d, x)
    with torch.no_grad():
        tref = model(torch.from_numpy(x)).numpy()
    assert np.abs(got - ort_run(path, x)).max() < FWD_TOL
    assert np.abs(got - tref).max() < 1e-5
    code, text = run(d, python=backend == 'cpython', stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(path, os.path.join(d, 'trained.wof'), out)
    assert np.abs(utrain_run(d, x, 'trained.wof') - ort_run(out, x)).max() < FWD_TOL
    if name.endswith('-bn'):
        return
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()           # no dropout or BatchNorm here: train = eval
    nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    opt.step()
    ref = os.fspath(tmp_path / 'torch.onnx')
    _export_sensor(name, model.eval(), shape, ref)
    init = lambda p: {t.name: numpy_helper.to_array(t) for t in onnx.load(p).graph.initializer}  # noqa: E731
    before, mine, theirs = init(path), init(out), init(ref)
    assert mine.keys() == theirs.keys()
    for k in before:
        step_t = theirs[k] - before[k]
        if before[k].dtype.kind != 'f':
            continue
        assert np.abs(mine[k] - before[k] - step_t).max() < 2e-6 + 1e-4 * np.abs(step_t).max(), k
        if name in RNNS and k in [n.input[2] for n in onnx.load(path).graph.node
                                           if n.op_type in ('GRU', 'LSTM')]:
            assert np.abs(step_t).max() > 1e-3            # W_hh did get a gradient


class Misc2d(nn.Module):
    """A channel shuffle (a 5-D view and transpose), HardSigmoid, clamp to [0.1, 0.9],
    torch.maximum of two maps, amax and sum over H, W, adaptive max pool, softsign."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(2, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 4, 1)
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        y = self.c(x)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        y = torch.maximum(nn.functional.hardsigmoid(y).clamp(0.1, 0.9), torch.tanh(self.c2(y)))
        f = torch.cat([y.amax((2, 3)), 0.1 * y.sum((2, 3)),
                       torch.flatten(nn.functional.adaptive_max_pool2d(y, 1), 1)], 1)
        return self.fc(nn.functional.softsign(f))


class Misc1d(nn.Module):
    """A depthwise Conv1d, abs, AdaptiveMaxPool1d, an unsqueeze-expand-mean, -x."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(3, 6, 3, groups=3, padding=1)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y = nn.functional.adaptive_max_pool1d(torch.abs(self.c(x)), 1).flatten(1)
        return -self.fc(y.unsqueeze(-1).expand(-1, -1, 3).mean(-1))


class Norms1d(nn.Module):
    """InstanceNorm1d (affine), GroupNorm (an InstanceNormalization over [N, groups, -1]
    and the affine), a LayerNorm over the channels of a Conv1d's map (transposed to it
    and back), the mean and max over channels (a max over a middle axis) and over time."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv1d(3, 8, 3, padding=1), nn.Conv1d(8, 8, 3, padding=1)
        self.inorm = nn.InstanceNorm1d(8, affine=True)
        self.gn, self.ln = nn.GroupNorm(2, 8), nn.LayerNorm(8)
        self.fc = nn.Linear(8 + 2 * 10, 3)

    def forward(self, x):
        y = self.gn(self.c2(torch.relu(self.inorm(self.c1(x)))))
        y = torch.relu(self.ln(y.transpose(1, 2)).transpose(1, 2))
        return self.fc(torch.cat([y.mean(-1), y.mean(1), y.amax(1)], 1))


def _seeded_affine(model):
    g = torch.Generator().manual_seed(2)
    for m in model.modules():
        if isinstance(m, (nn.InstanceNorm1d, nn.GroupNorm)):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) - 0.5)
    return model


class AttnPool(nn.Module):
    """Attention pooling over time: a Linear scores each step of a Conv1d's map, a
    softmax over the steps (axis 1 of [N, T, 1], not the last: refused before, issue 28)
    weighs the sum; beside it the max over time, then a Linear."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv1d(3, 6, 3, padding=1)
        self.att, self.fc = nn.Linear(6, 1), nn.Linear(12, 3)

    def forward(self, x):
        h = nn.functional.leaky_relu(self.c(x), 0.1).transpose(1, 2)
        w = torch.softmax(self.att(h), dim=1)
        return self.fc(torch.cat([(h * w).sum(1), h.amax(1)], 1))


SENSOR.update({'misc2d': (Misc2d, (2, 6, 6)), 'misc1d': (Misc1d, (3, 12)),
               'norms1d': (lambda: _seeded_affine(Norms1d()), (3, 10)),
               'attnpool': (AttnPool, (3, 9)), 'elus': (elus, (10,))})


@pytest.mark.parametrize('name', ['misc2d', 'misc1d', 'norms1d', 'attnpool', 'elus'])
def test_more_layers_step_as_torch(name, tmp_path):
    test_sensor_layers_step_as_torch(name, 'cpython', tmp_path)


def _rnn_graph(path, op, lbr=0):
    """A GRU (layout 0 behind a Transpose, linear_before_reset lbr, the whole Y read,
    a constant nonzero initial h, sequence_lens of the full length) or an LSTM (layout
    lbr: 1 batch first, 0 behind a Transpose; constant nonzero h0 and c0, Y_h + Y_c
    read), written with onnx.helper: what other exporters write and PyTorch does not."""
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.default_rng(3)
    T, I, H = 4, 3, 5
    G = (3 if op == 'GRU' else 4) * H
    def f(*s):
        return numpy_helper.from_array((r.standard_normal(s) * 0.5).astype(np.float32),
                                       f'k{len(inits)}')
    inits = []
    for shp in ((1, G, I), (1, G, H), (1, 2 * G), (1, 1, H), (1, 1, H)):
        inits.append(f(*shp))
    W, R, B, h0, c0 = (t.name for t in inits)
    inits.append(numpy_helper.from_array(np.array([T], np.int32), 'lens'))
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, T, I])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 2])
    if op == 'GRU':
        inits += [numpy_helper.from_array(np.array([1, T * H], np.int64), 'flat'),
                  numpy_helper.from_array(np.float32(r.standard_normal((T * H, 2)) * 0.3), 'wo')]
        nodes = [helper.make_node('Transpose', ['x'], ['xt'], perm=[1, 0, 2]),
                 helper.make_node('GRU', ['xt', W, R, B, 'lens', h0], ['Y', ''], hidden_size=H,
                                  linear_before_reset=lbr, name='gru'),
                 helper.make_node('Reshape', ['Y', 'flat'], ['f']),
                 helper.make_node('MatMul', ['f', 'wo'], ['y'])]
    else:
        inits += [numpy_helper.from_array(np.array([1, H], np.int64), 'flat'),
                  numpy_helper.from_array(np.float32(r.standard_normal((H, 2)) * 0.3), 'wo')]
        nodes = [helper.make_node('Transpose', ['x'], ['xt'], perm=[1, 0, 2]),
                 helper.make_node('LSTM', ['x' if lbr else 'xt', W, R, B, '', h0, c0],
                                  ['', 'Yh', 'Yc'], hidden_size=H, layout=lbr, name='lstm'),
                 helper.make_node('Add', ['Yh', 'Yc'], ['s']),
                 helper.make_node('Reshape', ['s', 'flat'], ['f']),
                 helper.make_node('MatMul', ['f', 'wo'], ['y'])]
    m = helper.make_model(helper.make_graph(nodes, 'g', [x], [y], inits),
                          opset_imports=[helper.make_opsetid('', 17)])
    onnx.save(m, path)
    return (T, I)


def ref_run(path, x):
    """onnx's reference evaluator (ORT refuses layout=1 RNNs)."""
    from onnx.reference import ReferenceEvaluator
    r = ReferenceEvaluator(path)
    return np.stack([r.run(None, {'x': x[i:i + 1]})[0].reshape(-1) for i in range(len(x))])


@pytest.mark.parametrize('op,lbr', [('GRU', 0), ('GRU', 1), ('LSTM', 0), ('LSTM', 1)])
def test_rnn_nodes_other_exporters_write(op, lbr, tmp_path):
    """Forward = ORT's (onnx's reference evaluator for an LSTM with layout=1, checked
    against ORT on the same LSTM behind a Transpose); one Adam step exported back (W, R,
    B's two halves, the initial states that train as constants) = utrain's trained
    forward there."""
    path = os.fspath(tmp_path / 'rnn.onnx')
    shape = _rnn_graph(path, op, lbr)
    ort_run = globals()['ort_run']
    if op == 'LSTM' and lbr:
        ort_run = ref_run
        p0 = os.fspath(tmp_path / 'rnn0.onnx')
        _rnn_graph(p0, op, 0)
        x0 = samples(shape, n=2)[0]
        assert np.abs(ref_run(path, x0) - globals()['ort_run'](p0, x0)).max() < FWD_TOL
    x, _, after = _adam_round_trip(path, shape, tmp_path, 4, 2, 1, ort_run)
    assert np.abs(after - ort_run(path, x)).max() > 1e-3


def _adam_round_trip(path, shape, tmp_path, n, classes, epochs, runner):
    """prepare (forward = runner's on the file), a short Adam run, export .onnx: runner on
    the export = utrain's trained forward.  Returns (samples, exported path, its outputs)."""
    x, y = samples(shape, n=n, classes=classes)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='adam', lr=0.05, batch=2, epochs=epochs, log=lambda *a: None)
    assert np.abs(utrain_run(d, x) - runner(path, x)).max() < FWD_TOL
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(path, os.path.join(d, 'trained.wof'), out)
    after = runner(out, x)
    assert np.abs(utrain_run(d, x, 'trained.wof') - after).max() < FWD_TOL
    return x, out, after


def _matmul_graph(path):
    """MatMul nodes as other exporters write them (onnx.helper): two activations with the
    second's heads broadcast ([1, 2, 3, 4] times [1, 1, 4, 3]), an activation times a
    rank-3 constant ([1, 2, 3, 3] times [2, 3, 2]) and a rank-2 constant times an
    activation ([3, 3] times [1, 2, 3, 2]): BATCH_MATMUL, the constants trainable."""
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.default_rng(4)
    def c(name, *s, scale=0.5):
        return numpy_helper.from_array((r.standard_normal(s) * scale).astype(np.float32), name)
    def shape(name, s):
        return numpy_helper.from_array(np.array(s, np.int64), name)
    inits = [c('w1', 6, 24), c('w2', 6, 12), c('c3', 2, 3, 2), c('c2', 3, 3), c('wo', 12, 3),
             shape('s1', [1, 2, 3, 4]), shape('s2', [1, 1, 4, 3]), shape('flat', [1, 12])]
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 6])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 3])
    nodes = [helper.make_node('MatMul', ['x', 'w1'], ['h1']),
             helper.make_node('Reshape', ['h1', 's1'], ['a']),
             helper.make_node('MatMul', ['x', 'w2'], ['h2']),
             helper.make_node('Tanh', ['h2'], ['t2']),
             helper.make_node('Reshape', ['t2', 's2'], ['b']),
             helper.make_node('MatMul', ['a', 'b'], ['ab'], name='two_activations'),
             helper.make_node('MatMul', ['ab', 'c3'], ['abc'], name='rank3_constant'),
             helper.make_node('MatMul', ['c2', 'abc'], ['cabc'], name='constant_first'),
             helper.make_node('Reshape', ['cabc', 'flat'], ['f']),
             helper.make_node('MatMul', ['f', 'wo'], ['y'])]
    m = helper.make_model(helper.make_graph(nodes, 'g', [x], [y], inits),
                          opset_imports=[helper.make_opsetid('', 17)])
    onnx.save(m, path)
    return (6,)


def test_matmul_of_activations_and_batched_constants(tmp_path):
    """ONNX MatMul of two activations and by constants that are not 2-D weights reads
    as BATCH_MATMUL: forward = ORT's; a short training run exported back (the rank-3
    and the leading constant are initializers that trained) = utrain's trained forward
    under ORT."""
    from onnx import numpy_helper
    path = os.fspath(tmp_path / 'mm.onnx')
    shape = _matmul_graph(path)
    assert [op.name for op in read_model(path).ops].count('BATCH_MATMUL') == 3
    _, out, _ = _adam_round_trip(path, shape, tmp_path, 6, 3, 2, ort_run)
    init = lambda p: {t.name: numpy_helper.to_array(t) for t in onnx.load(p).graph.initializer}  # noqa: E731
    before, trained = init(path), init(out)
    for k in ('w1', 'w2', 'c3', 'c2', 'wo'):
        assert np.abs(trained[k] - before[k]).max() > 1e-3, k


def test_raw_pixel_input_trains_scaled_and_exports_folded(tmp_path):
    """Issue 28: a PyTorch CNN fed 0..255 pixels trains on them times 1/128 (its first
    conv's weights x128: inscale.scale_input, after the NCHW input's transpose is hoisted);
    the .onnx export folds the scale back: ORT on it = utrain's trained forward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(36, 3)).eval()
    with torch.no_grad():
        model[0].weight /= 255              # (trained on x / 255, the scale folded in)
    path = os.fspath(tmp_path / 'raw.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(model, (torch.zeros((1, 3, 8, 8)),), path, input_names=['x'],
                          output_names=['y'], dynamo=False)
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (16, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=rng.integers(0, 3, 16))
    d, lines = os.fspath(tmp_path / 'run'), []
    s = prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
                optimizer='sgd', lr=0.01, epochs=2, log=lines.append)
    assert s['input_perm'] == [0, 2, 3, 1]
    assert any('times 0.0078125' in ln for ln in lines), lines
    np.testing.assert_allclose(utrain_run(d, x[:4]), ort_run(path, x[:4]), rtol=1e-5, atol=1e-4)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(path, os.path.join(d, 'trained.wof'), out)
    got, ref = utrain_run(d, x, 'trained.wof'), ort_run(out, x)
    assert np.abs(got - ref).max() < 1e-4 * max(1.0, np.abs(ref).max()), np.abs(got - ref).max()
    assert np.abs(ref - ort_run(path, x)).max() > 1e-2           # it trained


def test_split_of_constants_folds_and_its_parts_train_back(tmp_path):
    """A Split whose input is a constant (a real GitHub LSTM autoencoder, torch 2.9's
    dynamo export: the initial states' zeros [2, 1, 64] split a layer each, opset 18's
    num_outputs) was refused ('cannot fold this op on constants'): it folds, a value an
    output; the parts of a weight split along its first axis train and export writes
    them back into the whole initializer (ORT on the export = utrain's trained forward)."""
    from onnx import TensorProto, helper
    r = np.random.default_rng(0)
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 3])
    w = r.standard_normal((2, 4, 3)).astype(np.float32)
    inits = [helper.make_tensor('w', TensorProto.FLOAT, [2, 4, 3], w.ravel()),
             helper.make_tensor('zeros', TensorProto.FLOAT, [2, 1, 3], np.zeros(6, np.float32)),
             helper.make_tensor('ax0', TensorProto.INT64, [1], [0])]
    nodes = [helper.make_node('Split', ['w'], ['w0', 'w1'], axis=0, num_outputs=2),
             helper.make_node('Squeeze', ['w0', 'ax0'], ['v0']),
             helper.make_node('Squeeze', ['w1', 'ax0'], ['v1']),
             helper.make_node('Split', ['zeros'], ['z0', 'z1'], axis=0, num_outputs=2),
             helper.make_node('Squeeze', ['z1', 'ax0'], ['h0']),
             helper.make_node('MatMul', ['x', 'v0'], ['a']),
             helper.make_node('Relu', ['x'], ['rx']),
             helper.make_node('MatMul', ['rx', 'v1'], ['b']),
             helper.make_node('Add', ['a', 'b'], ['s']),
             helper.make_node('Add', ['s', 'h0'], ['y'])]
    p = os.fspath(tmp_path / 'split.onnx')
    onnx.save(helper.make_model(helper.make_graph(nodes, 'g', [x], [y], inits),
                                opset_imports=[helper.make_opsetid('', 18)]), p)
    xs = r.standard_normal((12, 4)).astype(np.float32)
    ref = xs @ w[0] + np.maximum(xs, 0) @ w[1]
    np.savez(tmp_path / 'd.npz', x=xs, y=(ref + 0.5).astype(np.float32))
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.01,
            epochs=2, log=lambda *a: None)
    np.testing.assert_allclose(utrain_run(d, xs), ref, rtol=1e-5, atol=1e-5)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    from onnx import numpy_helper
    ib = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert not np.array_equal(ib['w'], w)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5


def _unrolled_rnn(path, T=3, F=2, H=4, seed=0):
    """An RNN unrolled in ops, as torch 2.9's dynamo exporter wrote a GitHub LSTM
    autoencoder: the initial state a zero initializer (torch.zeros in forward) split and
    squeezed, h = tanh(x_t Wx + (h Wh + b)) a step with Wh a Transpose node of the
    initializer (the first step's h0 Wh: a product of two constants, + b: b), the last h
    repeated a step each by Tile (x.repeat) into a Linear.  Returns (path, numpy
    forward)."""
    from onnx import TensorProto, helper
    r = np.random.default_rng(seed)
    wx, wh = (0.5 * r.standard_normal((F, H))).astype(np.float32), \
        (0.5 * r.standard_normal((H, H))).astype(np.float32)
    b, wo = (0.1 * r.standard_normal(H)).astype(np.float32), r.standard_normal((H, 1)).astype(np.float32)
    T_ = TensorProto
    inits = [helper.make_tensor('wx', T_.FLOAT, wx.shape, wx.ravel()),
             helper.make_tensor('whT', T_.FLOAT, wh.shape, wh.T.ravel()),
             helper.make_tensor('b', T_.FLOAT, b.shape, b.ravel()),
             helper.make_tensor('wo', T_.FLOAT, wo.shape, wo.ravel()),
             helper.make_tensor('zeros', T_.FLOAT, [2, 1, H], np.zeros(2 * H, np.float32)),
             helper.make_tensor('ax0', T_.INT64, [1], [0]),
             helper.make_tensor('ax1', T_.INT64, [1], [1]),
             helper.make_tensor('reps', T_.INT64, [3], [1, T, 1])]
    nodes = [helper.make_node('Split', ['zeros'], ['z0', 'z1'], axis=0, num_outputs=2),
             helper.make_node('Squeeze', ['z0', 'ax0'], ['h_0']),
             helper.make_node('Transpose', ['whT'], ['wh'], perm=[1, 0])]
    for t in range(T):
        inits.append(helper.make_tensor(f'i{t}', T_.INT64, [], [t]))
        nodes += [helper.make_node('Gather', ['x', f'i{t}'], [f'x{t}'], axis=1),
                  helper.make_node('MatMul', [f'x{t}', 'wx'], [f'a{t}']),
                  helper.make_node('MatMul', [f'h_{t}', 'wh'], [f'm{t}']),
                  helper.make_node('Add', [f'm{t}', 'b'], [f'r{t}']),
                  helper.make_node('Add', [f'a{t}', f'r{t}'], [f'p{t}']),
                  helper.make_node('Tanh', [f'p{t}'], [f'h_{t + 1}'])]
    nodes += [helper.make_node('Unsqueeze', [f'h_{T}', 'ax1'], ['u']),
              helper.make_node('Tile', ['u', 'reps'], ['rep']),
              helper.make_node('MatMul', ['rep', 'wo'], ['y'])]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T_.FLOAT, [1, T, F])],
                          [helper.make_tensor_value_info('y', T_.FLOAT, [1, T, 1])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 18)]), path)

    def forward(x):
        h = np.zeros((len(x), H))
        for t in range(T):
            h = np.tanh(x[:, t] @ wx + h @ wh + b)
        return np.repeat((h @ wo)[:, None], T, 1)
    return path, forward


def test_unrolled_rnn_with_a_zero_state_initializer_and_tile_trains(tmp_path):
    """The unrolled RNN above was refused twice over: its first step's h0 Wh ('cannot fold
    this op on constants': a zero state times a weight) and Tile (no reader); then Wh, a
    Transpose node's, was a computed tensor each step (trained apart, export refused) and
    step 0's 0 + b another.  The zero
    initializer read only to be split is a state, no parameter: a product with it folds
    to zeros (Wh's gradient through it is 0 as well), it never trains, and export leaves
    it zeros; Tile is m copies concatenated.  utrain's forward = numpy's; after training,
    ORT on the export = utrain's trained forward."""
    p, fwd = _unrolled_rnn(os.fspath(tmp_path / 'rnn.onnx'))
    r = np.random.default_rng(1)
    xs = r.standard_normal((12, 3, 2)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=(0.5 * fwd(xs) + 0.2).astype(np.float32))
    d = os.fspath(tmp_path / 'run')
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.01,
                epochs=2, log=lambda *a: None)
    np.testing.assert_allclose(utrain_run(d, xs).reshape(12, -1), fwd(xs).reshape(12, -1),
                               rtol=1e-5, atol=1e-5)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    from onnx import numpy_helper
    ib = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert not np.any(ib['zeros']) and not np.allclose(ib['whT'], numpy_helper.to_array(
        [t for t in onnx.load(p).graph.initializer if t.name == 'whT'][0]))
    assert sorted(s['trainable']) == ['b', 'wh', 'wo', 'wx'], s['trainable']   # (one each)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5


def _trained_and_exported(tmp_path, g, name, xs, y, lr, opset=17):
    """Graph g saved as tmp_path/name (opset), prepared on samples xs, y (mse, SGD, 2
    epochs), trained by the host simulation and exported to tmp_path/trained.onnx: (the
    model's path, the run folder, prepare's summary, the exported path)."""
    from onnx import helper
    p = os.fspath(tmp_path / name)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', opset)]), p)
    np.savez(tmp_path / 'd.npz', x=xs, y=y)
    d = os.fspath(tmp_path / 'run')
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=lr,
                epochs=2, log=lambda *a: None)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    return p, d, s, out


@pytest.mark.parametrize('own_bias', [False, True])
def test_tied_weight_trains_as_one_and_exports_as_trained(tmp_path, own_bias):
    """One initializer two Gemm nodes read (a Linear applied twice, tied weights: what an
    unrolled RNN's steps are too) was read as a tensor each; they trained apart and export
    wrote one of them back: ORT on the export was 1.9 off utrain's trained forward (with
    a bias each, prepare's copy per layer, and export refused it: 'comes from no
    initializer').  It is one tensor, trained by both reads, written back as trained."""
    from onnx import TensorProto as T, helper
    r = np.random.default_rng(0)
    w = (0.6 * r.standard_normal((4, 4))).astype(np.float32)
    inits = [helper.make_tensor('w', T.FLOAT, [4, 4], w.ravel()),
             helper.make_tensor('b', T.FLOAT, [4], np.full(4, 0.1, np.float32)),
             helper.make_tensor('b2', T.FLOAT, [4], np.full(4, -0.2, np.float32))]
    nodes = [helper.make_node('Gemm', ['x', 'w', 'b'], ['a'], transB=1),
             helper.make_node('Tanh', ['a'], ['h']),
             helper.make_node('Gemm', ['h', 'w', 'b2' if own_bias else 'b'], ['y'], transB=1)]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 4])], inits)
    xs = r.standard_normal((16, 4)).astype(np.float32)
    p, d, s, out = _trained_and_exported(tmp_path, g, 'tied.onnx', xs, np.roll(xs, 1, 1), 0.05)
    assert sorted(s['trainable']) == ['b'] + ['b2'] * own_bias + ['w'], s['trainable']
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5


@pytest.mark.parametrize('how', ['transpose', 'float16'])
def test_weight_transposed_by_a_node_exports(tmp_path, how):
    """A weight a Transpose node turns for a MatMul (torch's dynamo export keeps
    Transpose(weight) nodes), or a float16 initializer a Cast makes float32, was a tensor
    'computed from initializers': it trained, and export refused it, advising an export
    with constant folding.  The transpose or cast is a step export maps back (a float16
    initializer written back as float16): ORT on the export = utrain's trained forward."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(0)
    w = (0.6 * r.standard_normal((3, 4))).astype(np.float32)
    if how == 'transpose':
        init = numpy_helper.from_array(w, 'w')
        nodes = [helper.make_node('Transpose', ['w'], ['wt'], perm=[1, 0])]
    else:
        init = numpy_helper.from_array(w.T.astype(np.float16), 'w')
        nodes = [helper.make_node('Cast', ['w'], ['wt'], to=T.FLOAT)]
    nodes.append(helper.make_node('MatMul', ['x', 'wt'], ['y']))
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 3])], [init])
    xs = r.standard_normal((16, 4)).astype(np.float32)
    p, d, _, out = _trained_and_exported(tmp_path, g, 'tw.onnx', xs, xs[:, :3], 0.05)
    tol = 1e-5 if how == 'transpose' else 2e-3      # (written back as float16)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < tol
    assert np.abs(ort_run(out, xs) - ort_run(p, xs)).max() > 1e-2       # (it trained)
    assert onnx.load(out).graph.initializer[0].data_type == init.data_type


def test_weight_held_by_a_constant_node_trains_and_exports(tmp_path):
    """torch.onnx.export at opset 17 writes nn.LayerNorm(elementwise_affine=False) as a
    LayerNormalization whose scale and bias are Constant nodes' tensors (constant folding
    on, the default): they trained, and export refused them as 'computed from initializers
    (do_constant_folding=False)', the run's result lost.  A Constant node's float tensor
    is written back into the node as an initializer is: ORT on the export = utrain's
    trained forward."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(0)
    w = (0.6 * r.standard_normal((4, 3))).astype(np.float32)
    nodes = [helper.make_node('Constant', [], ['s'], value=numpy_helper.from_array(
                 np.ones(3, np.float32), 's')),
             helper.make_node('Constant', [], ['b'], value=numpy_helper.from_array(
                 np.zeros(3, np.float32), 'b')),
             helper.make_node('MatMul', ['x', 'w'], ['h']),
             helper.make_node('LayerNormalization', ['h', 's', 'b'], ['y'], axis=-1)]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 3])],
                          [numpy_helper.from_array(w, 'w')])
    xs = r.standard_normal((16, 4)).astype(np.float32)
    p, d, _, out = _trained_and_exported(tmp_path, g, 'ln.onnx', xs, xs[:, :3], 0.1)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5
    assert [n.op_type for n in onnx.load(out).graph.node] == [n.op_type for n in nodes]
    scale = numpy_helper.to_array(onnx.load(out).graph.node[0].attribute[0].t)
    assert np.abs(scale - 1).max() > 1e-3       # (the Constant node's scale trained)


def test_reflect_edge_and_wrap_pads_train_as_ort_runs_them(tmp_path):
    """torch's F.pad(mode='reflect' / 'replicate' / 'circular') exports Pad of mode
    reflect / edge / wrap, refused ('utrain pads with zeros').  Each padded axis is a
    Gather of the input's own elements (slices and a concatenation, which train): utrain's
    forward = ORT's, before and after training, and export writes the trained weights."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(0)
    def c(name, *sh):
        return numpy_helper.from_array((0.5 * r.standard_normal(sh)).astype(np.float32), name)
    def pads(name, v):
        return numpy_helper.from_array(np.array(v, np.int64), name)
    inits = [c('w', 3, 2, 3, 3), c('b', 3), c('wo', 3 * 8 * 12, 2),
             pads('p1', [0, 0, 1, 2, 0, 0, 2, 1]), pads('p2', [0, 0, 0, 1, 0, 0, 0, 2]),
             pads('p3', [0, 0, 2, 0, 0, 0, 1, 3]), pads('flat', [1, -1])]
    nodes = [helper.make_node('Pad', ['x', 'p1'], ['a'], mode='reflect'),
             helper.make_node('Conv', ['a', 'w', 'b'], ['h']),
             helper.make_node('Pad', ['h', 'p2'], ['e'], mode='edge'),
             helper.make_node('Pad', ['e', 'p3'], ['g'], mode='wrap'),
             helper.make_node('Reshape', ['g', 'flat'], ['f']),
             helper.make_node('MatMul', ['f', 'wo'], ['y'])]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 2, 4, 5])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 2])], inits)
    p = os.fspath(tmp_path / 'pads.onnx')
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 19)]), p)
    xs = r.standard_normal((8, 2, 4, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=r.standard_normal((8, 2)).astype(np.float32))
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.002,
            epochs=2, log=lambda *a: None)
    assert np.abs(utrain_run(d, xs) - ort_run(p, xs)).max() < 1e-4
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-4
    assert np.abs(ort_run(out, xs) - ort_run(p, xs)).max() > 1e-3       # (it trained)


def test_pools_with_pads_no_tflite_padding_is_run_as_ort_runs_them(tmp_path):
    """torch's AvgPool2d / MaxPool2d with ceil_mode=True or pads TFLite's SAME does not
    make (AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False) on 8 x 8)
    were refused ('pads differ from TFLite SAME and VALID padding').  They pool the map
    padded to the windows (a max pool: edge rows repeated, right for negative inputs too;
    an average pool: zeros, the sums divided by what each window counts): utrain's
    forward = ORT's, and it trains."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(0)
    pools = [('AveragePool', dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                  ceil_mode=1, count_include_pad=0)),
             ('AveragePool', dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1],
                                  ceil_mode=1, count_include_pad=1)),
             ('MaxPool', dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
             ('MaxPool', dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1]))]
    nodes, flat, n = [], [], 0
    for j, (op, at) in enumerate(pools):
        nodes.append(helper.make_node(op, ['x'], [f'p{j}'], **at))
        nodes.append(helper.make_node('Flatten', [f'p{j}'], [f'f{j}']))
        flat.append(f'f{j}')
    nodes += [helper.make_node('Concat', flat, ['f'], axis=1),
              helper.make_node('MatMul', ['f', 'w'], ['y'])]
    sizes = 2 * (16 + 16 + 16 + 9)      # (outputs of 7 x 7: 4, 4, 4 and 3 a side)
    w = numpy_helper.from_array((0.3 * r.standard_normal((sizes, 2))).astype(np.float32), 'w')
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 2, 7, 7])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 2])], [w])
    p = os.fspath(tmp_path / 'pools.onnx')
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]), p)
    xs = (r.standard_normal((8, 2, 7, 7)) - 1).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=r.standard_normal((8, 2)).astype(np.float32))
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.01,
            epochs=2, log=lambda *a: None)
    assert np.abs(utrain_run(d, xs) - ort_run(p, xs)).max() < 1e-4
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-4


def test_einsum_matrix_products_train_and_export(tmp_path):
    """torch.einsum in a model's forward (attention written 'bhid,bhjd->bhij', a weight
    applied 'bti,oi->bto') exports Einsum nodes, refused ('cannot read ONNX op Einsum').
    A two-operand Einsum that is a matrix product reads as transposes, reshapes and one
    MatMul: utrain's forward = ORT's, the weights in it train and export writes them back
    (a transposed one as the file holds it)."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(0)
    def c(name, *sh):
        return numpy_helper.from_array((0.5 * r.standard_normal(sh)).astype(np.float32), name)
    def ints(name, v):
        return numpy_helper.from_array(np.array(v, np.int64), name)
    inits = [c('wq', 6, 4), c('wk', 4, 6), c('wo', 3, 4), ints('heads', [1, 5, 2, 3]),
             ints('flat', [1, -1]), c('wc', 45, 2)]
    nodes = [helper.make_node('Einsum', ['x', 'wq'], ['q'], equation='bti,oi->bto'),
             helper.make_node('Einsum', ['x', 'wk'], ['k'], equation='bti,io->bto'),
             helper.make_node('Reshape', ['q', 'heads'], ['q4']),
             helper.make_node('Reshape', ['k', 'heads'], ['k4']),
             helper.make_node('Einsum', ['q4', 'k4'], ['s'], equation='bihd,bjhd->bhij'),
             helper.make_node('Softmax', ['s'], ['p'], axis=-1),
             helper.make_node('Einsum', ['p', 'k4'], ['v'], equation='bhij,bjhd->bihd'),
             helper.make_node('Reshape', ['v', 'flat'], ['f0']),
             helper.make_node('Einsum', ['x', 'wo'], ['u'], equation='btc,dc->btd'),
             helper.make_node('Reshape', ['u', 'flat'], ['f1']),
             helper.make_node('Concat', ['f0', 'f1'], ['f'], axis=1),
             helper.make_node('MatMul', ['f', 'wc'], ['y'])]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 5, 4])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 2])], inits)
    xs = r.standard_normal((8, 5, 4)).astype(np.float32)
    p, d, s, out = _trained_and_exported(tmp_path, g, 'einsum.onnx', xs,
                                         r.standard_normal((8, 2)).astype(np.float32), 0.02,
                                         opset=13)
    assert len(s['trainable']) == 4, s['trainable']        # (wq, wk, wo, wc)
    # (the file's weights, weights.wof: the forward before training)
    assert np.abs(utrain_run(d, xs) - ort_run(p, xs)).max() < 1e-4
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-4
    assert np.abs(ort_run(out, xs) - ort_run(p, xs)).max() > 1e-3       # (it trained)


def test_outputs_needing_unreadable_nodes_are_left_out(tmp_path):
    """A GitHub Stable-Baselines3 policy exported whole (its sampled action through
    RandomNormalLike, the log-probability of it, beside the value head) was refused at
    the random draw ('cannot fold this op on constants').  Outputs that need a node utrain
    cannot read (a random draw, a label's ArgMax) are left out, saying which and why, the
    nodes only they need too; the others train, export writes the whole file with the
    trained weights, and evaluate scores the output prepare trained (ORT makes them all).
    A model with no other output is refused with what to do."""
    from onnx import TensorProto as T, helper
    from host_tools.prepare.infer import evaluate
    r = np.random.default_rng(0)
    w, w2 = r.standard_normal((3, 4)).astype(np.float32), r.standard_normal((2, 4)).astype(np.float32)
    inits = [helper.make_tensor('w', T.FLOAT, [3, 4], w.ravel()),
             helper.make_tensor('w2', T.FLOAT, [2, 4], w2.ravel())]
    nodes = [helper.make_node('Gemm', ['x', 'w'], ['z'], transB=1),
             helper.make_node('Softmax', ['z'], ['probs'], axis=1),
             helper.make_node('ArgMax', ['probs'], ['label'], axis=1, keepdims=0),
             helper.make_node('Gemm', ['x', 'w2'], ['m'], transB=1),     # (only 'noisy' reads)
             helper.make_node('RandomNormalLike', ['m'], ['eps'], name='draw'),
             helper.make_node('Add', ['m', 'eps'], ['noisy'])]
    vi = helper.make_tensor_value_info
    outs = [vi('label', T.INT64, [1]), vi('noisy', T.FLOAT, [1, 2]), vi('probs', T.FLOAT, [1, 3])]
    p = os.fspath(tmp_path / 'pol.onnx')
    onnx.save(helper.make_model(helper.make_graph(nodes, 'g', [vi('x', T.FLOAT, [1, 4])], outs, inits),
                                opset_imports=[helper.make_opsetid('', 17)]), p)
    g = read_model(p)
    assert [g.tensors[k].name for k in g.outputs] == ['probs'] and len(g.ops) == 2
    xs = r.standard_normal((24, 4)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.argmax(xs[:, :3], 1))
    d, said = os.fspath(tmp_path / 'run'), []
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), optimizer='sgd', lr=0.05, epochs=2,
                log=said.append)
    text = '\n'.join(said)
    assert "output 'label' is left out" in text and 'ArgMax' in text, text
    assert "output 'noisy' is left out" in text and 'a random draw' in text, text
    assert sorted(s['trainable']) == ['w'], s['trainable']
    code, out = run(d, python=True, stream=False)
    assert code == 0, out
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    sess = ort.InferenceSession(out, providers=['CPUExecutionProvider'])
    assert [o.name for o in sess.get_outputs()] == ['label', 'noisy', 'probs']
    probs = np.concatenate([sess.run(['probs'], {'x': xs[i:i + 1]})[0] for i in range(24)])
    assert np.abs(utrain_run(d, xs, 'trained.wof') - probs).max() < 1e-5
    e = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    assert e['output'] == 'probs' and e['accuracy'] == np.mean(np.argmax(probs, 1) == np.argmax(xs[:, :3], 1))
    # (nothing else to train: refused, saying what to do)
    only = helper.make_graph(nodes[3:], 'g', [vi('x', T.FLOAT, [1, 4])], [outs[1]], inits[1:])
    onnx.save(helper.make_model(only, opset_imports=[helper.make_opsetid('', 17)]), p)
    with pytest.raises(ModelError, match=r'draw \(RandomNormalLike\).*a random draw.*'
                       r'deterministic action'):
        read_model(p)
    only = helper.make_graph(nodes[:3], 'g', [vi('x', T.FLOAT, [1, 4])], [outs[0]], inits[:1])
    onnx.save(helper.make_model(only, opset_imports=[helper.make_opsetid('', 17)]), p)
    with pytest.raises(ModelError, match=r'ArgMax.*picks a class number.*scores or probabilities'):
        read_model(p)


def test_refusals_of_onnx_files_say_what_to_do(tmp_path):
    """A GitHub model.onnx whose weights torch.onnx.export wrote to model.onnx.data (ONNX
    external data), copied without that file: refused as 'not a valid ONNX model
    (ValidationError: Data of TensorProto ... should be stored in ..., but it is not
    regular file)'; now it names the file and what to do (with the file beside it, it
    reads).  A scikit-learn model ('operator domain ai.onnx.ml is not supported'): that it
    is no neural network, and what to give utrain."""
    p = _tiny(os.fspath(tmp_path / 'tiny.onnx'), 'Relu')
    from onnx import numpy_helper
    m = onnx.load(p)
    for t in m.graph.initializer:       # (raw bytes: what goes to external data)
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
    d = tmp_path / 'sub'
    d.mkdir()
    onnx.save_model(m, os.fspath(d / 'm.onnx'), save_as_external_data=True,
                    all_tensors_to_one_file=True, location='m.onnx.data', size_threshold=0)
    assert read_model(os.fspath(d / 'm.onnx')).ops
    os.rename(d / 'm.onnx.data', tmp_path / 'elsewhere.data')
    with pytest.raises(ModelError, match=r"m.onnx: its weights are stored in a file of their "
                       r"own, 'm.onnx.data'.*put it beside the .onnx"):
        read_model(os.fspath(d / 'm.onnx'))
    # (a scikit-learn model through skl2onnx, two real GitHub ones: no neural network)
    from onnx import TensorProto as T, helper
    vi = helper.make_tensor_value_info
    node = helper.make_node('TreeEnsembleRegressor', ['x'], ['y'], domain='ai.onnx.ml',
                            n_targets=1, nodes_treeids=[0], nodes_nodeids=[0],
                            nodes_featureids=[0], nodes_values=[0.0], nodes_modes=['LEAF'],
                            nodes_truenodeids=[0], nodes_falsenodeids=[0],
                            target_treeids=[0], target_nodeids=[0], target_ids=[0],
                            target_weights=[1.0])
    p = os.fspath(tmp_path / 'trees.onnx')
    onnx.save(helper.make_model(helper.make_graph([node], 'g', [vi('x', T.FLOAT, [1, 4])],
                                                  [vi('y', T.FLOAT, [1, 1])]),
                                opset_imports=[helper.make_opsetid('', 17),
                                               helper.make_opsetid('ai.onnx.ml', 3)]), p)
    with pytest.raises(ModelError, match=r"TreeEnsembleRegressor is a classical machine-learning "
                       r"model's.*reads the linear models.*train a neural network on the same features"):
        read_model(p)


def _skl_mlp_classifier(path, W1, b1, W2, b2, zipmap=True):
    """An .onnx as skl2onnx 1.18 writes scikit-learn's MLPClassifier (the graph of two
    GitHub files): float_input [None, F] -> MatMul/Add/Relu -> MatMul/Add -> Softmax (of
    two classes: Sigmoid, then Concat(1 - p, p)), then output_label (ArgMax ->
    ArrayFeatureExtractor of the class labels -> Cast) and output_probability (ZipMap: a
    sequence of {class: probability} maps; zipmap=False: the probabilities).  The
    intercepts are [1, N], as skl2onnx writes them."""
    from onnx import TensorProto as T, helper, numpy_helper as nh
    C = max(2, W2.shape[1])
    inits = [nh.from_array(a, n) for a, n in ((W1, 'coefficient'), (b1[None], 'intercepts'),
                                             (W2, 'coefficient1'), (b2[None], 'intercepts1'))]
    inits += [nh.from_array(np.arange(C, dtype=np.int64), 'classes'),
              nh.from_array(np.array([-1], np.int64), 'shape_tensor'),
              nh.from_array(np.array(1, np.float32), 'unity')]
    nodes = [helper.make_node('Cast', ['float_input'], ['cast_input'], to=1),
             helper.make_node('MatMul', ['cast_input', 'coefficient'], ['mul_result']),
             helper.make_node('Add', ['mul_result', 'intercepts'], ['add_result']),
             helper.make_node('Relu', ['add_result'], ['next_activations']),
             helper.make_node('MatMul', ['next_activations', 'coefficient1'], ['mul_result1']),
             helper.make_node('Add', ['mul_result1', 'intercepts1'], ['add_result1']),
             *([helper.make_node('Softmax', ['add_result1'], ['probabilities'], axis=1)]
               if W2.shape[1] > 1 else
               [helper.make_node('Sigmoid', ['add_result1'], ['out_activations_result']),
                helper.make_node('Sub', ['unity', 'out_activations_result'],
                                 ['negative_class_proba']),
                helper.make_node('Concat', ['negative_class_proba', 'out_activations_result'],
                                 ['probabilities'], axis=1)]),
             helper.make_node('ArgMax', ['probabilities'], ['argmax_output'], axis=1),
             *([helper.make_node('ZipMap', ['probabilities'], ['output_probability'],
                                 domain='ai.onnx.ml', classlabels_int64s=list(range(C)))]
               if zipmap else []),
             helper.make_node('ArrayFeatureExtractor', ['classes', 'argmax_output'],
                              ['array_feature_extractor_result'], domain='ai.onnx.ml'),
             helper.make_node('Reshape', ['array_feature_extractor_result', 'shape_tensor'],
                              ['reshaped_result']),
             helper.make_node('Cast', ['reshaped_result'], ['output_label'], to=7)]
    vi = helper.make_tensor_value_info
    prob = helper.make_value_info('output_probability', helper.make_sequence_type_proto(
        helper.make_map_type_proto(T.INT64, helper.make_tensor_type_proto(T.FLOAT, None))))
    if not zipmap:
        prob = vi('probabilities', T.FLOAT, [None, C])
    g = helper.make_graph(nodes, 'mlp', [vi('float_input', T.FLOAT, [None, W1.shape[0]])],
                          [vi('output_label', T.INT64, [None]), prob], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 14),
                                                  helper.make_opsetid('ai.onnx.ml', 1)]), path)


def test_sklearn_mlp_classifier_through_skl2onnx_trains_its_probabilities(tmp_path):
    """Two GitHub MLPClassifier files converted by skl2onnx (its defaults: a label through
    ArgMax and the probabilities through ZipMap, both of the ai.onnx.ml domain) were refused
    at the ArgMax, though the refusal of ai.onnx.ml models itself tells the user to give
    utrain an MLPClassifier converted so.  ZipMap wraps the probabilities it reads in
    {class: p} maps: that tensor is the output trained (the label is left out, said);
    export writes the weights back with both outputs as they were, and evaluate scores the
    probabilities, which ONNX Runtime makes (an output of a copy: ORT had refused the
    name, 'Invalid output name')."""
    from host_tools.prepare.infer import evaluate
    r = np.random.default_rng(1)
    W1, b1 = r.standard_normal((6, 8)).astype(np.float32) * 0.5, np.zeros(8, np.float32)
    W2, b2 = r.standard_normal((8, 3)).astype(np.float32) * 0.5, np.zeros(3, np.float32)
    p = os.fspath(tmp_path / 'mlp.onnx')
    _skl_mlp_classifier(p, W1, b1, W2, b2)
    g = read_model(p)
    assert [g.tensors[k].name for k in g.outputs] == ['probabilities']
    assert [n for n, _ in g.onnx_dropped] == ['output_label']
    xs = r.standard_normal((48, 6)).astype(np.float32)
    y = np.argmax(xs[:, :3] - xs[:, 3:], 1)
    np.savez(tmp_path / 'd.npz', x=xs, y=y)
    e0 = evaluate(p, os.fspath(tmp_path / 'd.npz'))
    sess = ort.InferenceSession(p, providers=['CPUExecutionProvider'])
    maps = sess.run(['output_probability'], {'float_input': xs})[0]
    ref = np.array([[m[c] for c in range(3)] for m in maps])
    assert e0['output'] == 'probabilities' and e0['accuracy'] == np.mean(ref.argmax(1) == y)
    d = os.fspath(tmp_path / 'run')
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), optimizer='sgd', lr=0.1, epochs=3)
    assert sorted(s['trainable']) == ['coefficient', 'coefficient1', 'intercepts', 'intercepts1']
    code, out = run(d, python=True, stream=False)
    assert code == 0, out
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    sess = ort.InferenceSession(out, providers=['CPUExecutionProvider'])
    assert [o.name for o in sess.get_outputs()] == ['output_label', 'output_probability']
    lab, maps = sess.run(None, {'float_input': xs})
    probs = np.array([[m[c] for c in range(3)] for m in maps])
    assert np.abs(utrain_run(d, xs, 'trained.wof') - probs).max() < 1e-5
    assert np.array_equal(lab, probs.argmax(1))
    e = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    assert e['output'] == 'probabilities' and e['accuracy'] == np.mean(probs.argmax(1) == y)
    assert e['accuracy'] > e0['accuracy']


def test_two_class_sigmoid_head_trains_its_probability_with_bce(tmp_path):
    """skl2onnx writes a binary MLPClassifier (a GitHub stroke predictor) as Sigmoid ->
    Concat(1 - p, p).  That output had trained as logits (the CONCATENATION is no SOFTMAX):
    softmax(1 - p, p) never passes 0.73, its loss pushed every sample on (the reported loss
    was not the model's).  Now p trains with bce (fused: p - t at the sigmoid's input),
    the output layer's intercept too (an Add of one value, which had stayed frozen as a
    scalar), export writes the file whole (its ArgMax label agrees with p > 0.5), and evaluate
    scores p's binary cross-entropy under ONNX Runtime."""
    from host_tools.prepare.infer import evaluate
    r = np.random.default_rng(2)
    W1, b1 = r.standard_normal((6, 8)).astype(np.float32) * 0.5, np.zeros(8, np.float32)
    W2, b2 = r.standard_normal((8, 1)).astype(np.float32) * 0.5, np.zeros(1, np.float32)
    p = os.fspath(tmp_path / 'bin.onnx')
    _skl_mlp_classifier(p, W1, b1, W2, b2, zipmap=False)
    g = read_model(p)
    assert [g.tensors[k].name for k in g.outputs] == ['out_activations_result']
    assert [o.name for o in g.ops][-1] == 'LOGISTIC'
    xs = r.standard_normal((48, 6)).astype(np.float32)
    y = (xs[:, 0] - xs[:, 1] > 0).astype(np.int64)
    np.savez(tmp_path / 'd.npz', x=xs, y=y)
    d, said = os.fspath(tmp_path / 'run'), []
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), optimizer='sgd', lr=0.1, epochs=3,
                log=said.append)
    cfg = json.load(open(os.path.join(d, 'train.json')))
    assert cfg['loss'] == 'bce' and not cfg['from_logits'], cfg
    # (the one-unit output layer's intercept, an Add of one value after the MatMul, trains:
    # it had stayed frozen as a scalar)
    assert sorted(s['trainable']) == ['coefficient', 'coefficient1', 'intercepts',
                                      'intercepts1'], s['trainable']
    assert any('(1 - p, p)' in m and 'bce' in m for m in said), said
    code, out = run(d, python=True, stream=False)
    assert code == 0, out
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    sess = ort.InferenceSession(out, providers=['CPUExecutionProvider'])
    lab, probs = sess.run(None, {'float_input': xs})
    pu = utrain_run(d, xs, 'trained.wof')[:, 0]
    assert np.abs(probs[:, 1] - pu).max() < 1e-5 and np.abs(probs[:, 0] - (1 - pu)).max() < 1e-5
    assert np.array_equal(lab, (pu > 0.5).astype(np.int64))
    e = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    pc = np.clip(pu, 1e-7, 1 - 1e-7)
    assert e['accuracy'] == np.mean((pu > 0.5) == y) > 0.8, e
    bce = -np.mean(y * np.log(pc) + (1 - y) * np.log(1 - pc))
    assert e['loss_name'] == 'binary cross-entropy' and abs(e['loss'] - bce) < 1e-3, (e, bce)


def _skl_linear(path, op, attrs, n_in, outs, graph_outs, extra=(), scaler=None):
    """An .onnx file as skl2onnx writes a scikit-learn linear model: one ai.onnx.ml node
    (LinearRegressor, LinearClassifier; outputs outs) whose coefficients and intercepts
    are attributes, then the nodes extra; graph_outs {name: (type, shape)}, a batch open;
    scaler: (offset, scale) of a StandardScaler before it (a pipeline's Scaler node)."""
    from onnx import TensorProto as T, helper
    pre = [helper.make_node('Scaler', ['float_input'], ['variable1'], domain='ai.onnx.ml',
                            offset=list(scaler[0]), scale=list(scaler[1]))] if scaler else []
    node = helper.make_node(op, ['variable1' if scaler else 'float_input'], outs,
                            domain='ai.onnx.ml', **attrs)
    g = helper.make_graph(pre + [node] + list(extra), op,
                          [helper.make_tensor_value_info('float_input', T.FLOAT, [None, n_in])],
                          [helper.make_tensor_value_info(o, t, s)
                           for o, (t, s) in graph_outs.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 13),
                                                  helper.make_opsetid('ai.onnx.ml', 1)]), path)


@pytest.mark.parametrize('kind', ['regressor', 'scaled', 'multinomial', 'binary', 'scores'])
def test_sklearn_linear_models_through_skl2onnx_train(tmp_path, kind):
    """GitHub files of scikit-learn's LinearRegression and LogisticRegression converted by
    skl2onnx (one LinearRegressor / LinearClassifier node of the ai.onnx.ml domain, the
    weights its attributes) were refused as 'a classical machine-learning model, not a
    neural network's layer', though each is one dense layer.  Now they read as
    FULLY_CONNECTED (+ SOFTMAX for the multinomial, + sigmoid and (1 - p, p) for a binary
    model, whose two rows are one negated: p trains with bce), the label is left out
    (said), training improves them, export writes the trained weights back into the node's
    attributes (ORT on the export = utrain's trained forward), and evaluate scores them.
    A pipeline's StandardScaler (a Scaler node) before the model is frozen; a classifier
    of decision scores (post_transform NONE: LinearSVC, SGDClassifier) trains them as
    logits."""
    from onnx import TensorProto as T
    from host_tools.prepare.infer import evaluate
    r = np.random.default_rng(3)
    xs = r.standard_normal((60, 4)).astype(np.float32)
    p = os.fspath(tmp_path / 'lin.onnx')
    if kind in ('regressor', 'scaled'):
        y = (xs @ np.array([1.0, -2.0, 0.5, 0.0]) + 3.0).astype(np.float32).reshape(-1, 1)
        _skl_linear(p, 'LinearRegressor', dict(coefficients=[0.5, -1.0, 0.0, 0.3],
                                               intercepts=[1.0]), 4, ['variable'],
                    {'variable': (T.FLOAT, [None, 1])},
                    scaler=([0.1, -0.2, 0.0, 0.3], [1.5, 0.5, 1.0, 2.0]) if kind == 'scaled'
                    else None)
        out_name = 'variable'
    else:
        n = 2 if kind == 'binary' else 3
        y = (np.argmax(xs[:, :3], 1) if n == 3 else (xs[:, 0] > xs[:, 1])).astype(np.int64)
        W = (0.3 * r.standard_normal((n, 4))).astype(np.float32)
        b = np.zeros(n, np.float32)
        if n == 2:
            W[0], b[0] = -W[1], -b[1]
        attrs = dict(classlabels_ints=list(range(n)), coefficients=W.ravel().tolist(),
                     intercepts=b.tolist(), multi_class=int(n > 2),
                     post_transform={'binary': 'LOGISTIC', 'scores': 'NONE'}.get(kind,
                                                                                 'SOFTMAX'))
        from onnx import helper
        out_name = 'probabilities' if kind == 'multinomial' else 'probability_tensor'
        extra = [helper.make_node('Normalizer', ['probability_tensor'], ['probabilities'],
                                  domain='ai.onnx.ml', norm='L1')] if kind == 'multinomial' \
            else []
        _skl_linear(p, 'LinearClassifier', attrs, 4, ['label', 'probability_tensor'],
                    {'label': (T.INT64, [None]), out_name: (T.FLOAT, [None, n])}, extra)
    np.savez(tmp_path / 'd.npz', x=xs, y=y)
    g = read_model(p)
    if kind not in ('regressor', 'scaled'):
        assert [n for n, _ in g.onnx_dropped] == ['label']
    e0 = evaluate(p, os.fspath(tmp_path / 'd.npz'))
    d = os.fspath(tmp_path / 'run')
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), optimizer='sgd', lr=0.1, epochs=4)
    assert len(s['trainable']) == 2, s['trainable']
    if kind == 'binary':
        assert json.load(open(os.path.join(d, 'train.json')))['loss'] == 'bce'
    code, out = run(d, python=True, stream=False)
    assert code == 0, out
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    sess = ort.InferenceSession(out, providers=['CPUExecutionProvider'])
    got = sess.run([out_name], {'float_input': xs})[0]
    mine = utrain_run(d, xs, 'trained.wof')
    if kind == 'binary':
        assert np.abs(got[:, 1] - mine[:, 0]).max() < 1e-5
        assert np.abs(got[:, 0] - (1 - mine[:, 0])).max() < 1e-5
    else:
        assert np.abs(got - mine).max() < 1e-4
    e = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    if kind in ('regressor', 'scaled'):
        assert e['mae'] < 0.5 * e0['mae'], (e0, e)
    else:
        assert e['accuracy'] > e0['accuracy'] and e['accuracy'] > 0.8, (e0, e)


def test_sklearn_mlp_regressor_intercepts_are_its_layers_biases(tmp_path):
    """skl2onnx writes an MLP's layers as MatMul + Add of intercepts [1, N] (a GitHub
    MLPRegressor, bike demand): the reader fused only a bias of [N] into the layer, so
    prepare said the layers 'have no bias tensor: they train without one (the exported
    model has none either)', false (the Adds trained them apart, 4 more ops to run and
    plan).  An Add of [1, N] is the layer's bias now: nothing said, the FULLY_CONNECTED
    ops have their biases, and export writes them back in the file's [1, N]."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(4)
    W1, b1 = (0.5 * r.standard_normal((5, 8))).astype(np.float32), np.zeros((1, 8), np.float32)
    W2, b2 = (0.5 * r.standard_normal((8, 1))).astype(np.float32), np.ones((1, 1), np.float32)
    inits = [numpy_helper.from_array(v, n) for n, v in
             (('coefficient', W1), ('intercepts', b1), ('coefficient1', W2), ('intercepts1', b2))]
    nodes = [helper.make_node('MatMul', ['x', 'coefficient'], ['m']),
             helper.make_node('Add', ['m', 'intercepts'], ['a']),
             helper.make_node('Relu', ['a'], ['h']),
             helper.make_node('MatMul', ['h', 'coefficient1'], ['m1']),
             helper.make_node('Add', ['m1', 'intercepts1'], ['variable'])]
    p = os.fspath(tmp_path / 'mlpreg.onnx')
    onnx.save(helper.make_model(helper.make_graph(
        nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [None, 5])],
        [helper.make_tensor_value_info('variable', T.FLOAT, [None, 1])], inits),
        opset_imports=[helper.make_opsetid('', 13)]), p)
    g = read_model(p)
    assert [o.name for o in g.ops] == ['FULLY_CONNECTED', 'RELU', 'FULLY_CONNECTED']
    assert all(o.inputs[2] >= 0 for o in g.ops if o.name == 'FULLY_CONNECTED')
    xs = r.standard_normal((40, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.tanh(xs[:, :1] - xs[:, 1:2]))
    d, said = os.fspath(tmp_path / 'run'), []
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), optimizer='sgd', lr=0.05, epochs=2,
                log=said.append)
    assert not any('bias' in m for m in said), said
    assert sorted(s['trainable']) == ['coefficient', 'coefficient1', 'intercepts',
                                      'intercepts1'], s['trainable']
    code, out = run(d, python=True, stream=False)
    assert code == 0, out
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    m = onnx.load(out)
    assert {t.name: list(t.dims) for t in m.graph.initializer}['intercepts'] == [1, 8]
    sess = ort.InferenceSession(out, providers=['CPUExecutionProvider'])
    got = sess.run(None, {'x': xs})[0]
    assert np.abs(got - utrain_run(d, xs, 'trained.wof')).max() < 1e-5
    assert not np.array_equal(numpy_helper.to_array(
        {t.name: t for t in m.graph.initializer}['intercepts1']), b2)


def test_open_length_is_set_from_the_samples(tmp_path):
    """A GitHub PyTorch Conv1d seq2point model exported with dynamic_axes on its length
    (input [batch, 1, 'time']) was refused: utrain trains a fixed shape.  With --data,
    prepare trains a copy with the samples' length (and says so), export writes the
    trained weights into the file as it was (the length open: ORT runs it at another),
    and evaluate scores the original on the data; ORT on the export = utrain's trained
    forward.  Without data (inspect), the refusal says data would set it."""
    from onnx import TensorProto as T, helper, numpy_helper
    from host_tools.prepare.infer import evaluate
    r = np.random.default_rng(0)
    w1 = (0.4 * r.standard_normal((4, 2, 3))).astype(np.float32)
    w2 = (0.4 * r.standard_normal((1, 4, 3))).astype(np.float32)
    nodes = [helper.make_node('Conv', ['x', 'w1'], ['h'], pads=[1, 1], kernel_shape=[3]),
             helper.make_node('Relu', ['h'], ['a']),
             helper.make_node('Conv', ['a', 'w2'], ['y'], pads=[1, 1], kernel_shape=[3])]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, ['n', 2, 'time'])],
                          [helper.make_tensor_value_info('y', T.FLOAT, ['n', 1, 'time'])],
                          [numpy_helper.from_array(w1, 'w1'), numpy_helper.from_array(w2, 'w2')])
    p = os.fspath(tmp_path / 'seq.onnx')
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), p)
    with pytest.raises(ModelError, match=r'dimension 2 known only at run time.*prepare and '
                       r'evaluate with data set it'):
        read_model(p)
    xs = r.standard_normal((16, 2, 12)).astype(np.float32)
    ys = (0.5 * (xs[:, :1] + np.roll(xs[:, 1:], 1, 2))).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=ys)
    d, said = os.fspath(tmp_path / 'run'), []
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.02,
            epochs=2, log=said.append)
    assert any("input 'x' has dimension 2 known only at run time; it trains at 12" in m
               for m in said), said
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    dims = onnx.load(out).graph.input[0].type.tensor_type.shape.dim
    assert dims[2].dim_param == 'time'
    got = ort.InferenceSession(out, providers=['CPUExecutionProvider']).run(
        None, {'x': xs})[0].reshape(16, -1)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - got).max() < 1e-5
    before = evaluate(p, os.fspath(tmp_path / 'd.npz'))
    after = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    assert after['mae'] < before['mae']


def two_inputs_onnx(path, vec_open=False):
    """An .onnx of two inputs: seq [n, 2, time] (a Conv1d, pooled) and vec [n, 3] (or
    [n, k]), joined into a MatMul of 7; its weights drawn from default_rng(1)."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(1)
    nodes = [helper.make_node('Conv', ['seq', 'w1'], ['h'], pads=[1, 1], kernel_shape=[3]),
             helper.make_node('Relu', ['h'], ['a']),
             helper.make_node('GlobalAveragePool', ['a'], ['p']),
             helper.make_node('Flatten', ['p'], ['f']),
             helper.make_node('Concat', ['f', 'vec'], ['c'], axis=1),
             helper.make_node('MatMul', ['c', 'fc'], ['y'])]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, 'g', [vi('seq', T.FLOAT, ['n', 2, 'time']),
                                       vi('vec', T.FLOAT, ['n', 'k' if vec_open else 3])],
                          [vi('y', T.FLOAT, ['n', 1])],
                          [numpy_helper.from_array((0.4 * r.standard_normal((4, 2, 3))).astype(
                              np.float32), 'w1'),
                           numpy_helper.from_array((0.3 * r.standard_normal((7, 1))).astype(
                               np.float32), 'fc')])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), path)
    return os.fspath(path)


def test_open_lengths_of_several_inputs_are_set_from_their_arrays(tmp_path):
    """Issue 28 (open dimensions came from data for a model of one input only): a
    two-input model (a sequence of a run-time length and a fixed feature vector, joined
    after a global pool), given an .npz array per input, trains a copy at the samples'
    length and says so; an .npz with x0/x1 names sets it too; the export keeps the length
    open (ONNX Runtime runs it at another); evaluate scores the original on the data."""
    from host_tools.prepare.infer import evaluate
    r = np.random.default_rng(1)
    r.standard_normal(4 * 2 * 3 + 7)       # (the weights two_inputs_onnx draws)
    p = two_inputs_onnx(tmp_path / 'two.onnx')
    seq = r.standard_normal((24, 2, 10)).astype(np.float32)
    vec = r.standard_normal((24, 3)).astype(np.float32)
    ys = (seq.mean((1, 2)) + 0.5 * vec[:, :1].ravel())[:, None].astype(np.float32)
    np.savez(tmp_path / 'd.npz', seq=seq, vec=vec, y=ys)
    np.savez(tmp_path / 'd01.npz', x0=seq, x1=vec, y=ys)
    for data in ('d01.npz', 'd.npz'):
        d, said = os.fspath(tmp_path / ('run' + data)), []
        prepare(p, d, data=os.fspath(tmp_path / data), loss='mse', optimizer='adam', lr=0.01,
                epochs=3, log=said.append)
        assert any("input 'seq' has dimension 2 known only at run time; it trains at 10" in m
                   for m in said), said
        assert not any("input 'vec'" in m for m in said), said
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    assert onnx.load(out).graph.input[0].type.tensor_type.shape.dim[2].dim_param == 'time'
    ort.InferenceSession(out, providers=['CPUExecutionProvider']).run(
        None, {'seq': seq[:2, :, :7], 'vec': vec[:2]})
    before = evaluate(p, os.fspath(tmp_path / 'd.npz'))
    after = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    assert after['mae'] < before['mae']


def test_tied_conv_weight_keeps_its_batchnorms_apart(tmp_path):
    """One conv initializer two Conv nodes read (the same layer applied twice), each
    followed by a BatchNormalization of its own, frozen (--train last:1): a tied weight is
    one tensor (an ONNX initializer is one parameter), and folding each BatchNorm into it
    would scale it for the other conv too; they stay separate ops.  utrain's forward =
    ONNX Runtime's."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(0)
    C = 3
    w = (0.5 * r.standard_normal((C, C, 3, 3))).astype(np.float32)
    inits = [numpy_helper.from_array(w, 'w'),
             numpy_helper.from_array((0.1 * r.standard_normal(C)).astype(np.float32), 'b'),
             numpy_helper.from_array((0.3 * r.standard_normal((2, C))).astype(np.float32), 'fc')]
    for j in (1, 2):
        for n, v in (('s', 1 + 0.3 * r.standard_normal(C)), ('o', 0.2 * r.standard_normal(C)),
                     ('m', 0.1 * r.standard_normal(C)), ('v', 1 + 0.2 * r.random(C))):
            inits.append(numpy_helper.from_array(np.asarray(v, np.float32), f'{n}{j}'))
    nodes = [helper.make_node('Conv', ['x', 'w', 'b'], ['c1'], pads=[1, 1, 1, 1]),
             helper.make_node('BatchNormalization', ['c1', 's1', 'o1', 'm1', 'v1'], ['n1']),
             helper.make_node('Relu', ['n1'], ['a1']),
             helper.make_node('Conv', ['a1', 'w', 'b'], ['c2'], pads=[1, 1, 1, 1]),
             helper.make_node('BatchNormalization', ['c2', 's2', 'o2', 'm2', 'v2'], ['n2']),
             helper.make_node('GlobalAveragePool', ['n2'], ['g']),
             helper.make_node('Flatten', ['g'], ['f']),
             helper.make_node('Gemm', ['f', 'fc'], ['y'], transB=1)]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, C, 5, 5])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 2])], inits)
    p = os.fspath(tmp_path / 'tiedbn.onnx')
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), p)
    xs = r.standard_normal((6, C, 5, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=r.standard_normal((6, 2)).astype(np.float32))
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', train='last:1', lr=0.01,
            epochs=1, log=lambda *a: None)
    np.testing.assert_allclose(utrain_run(d, xs), ort_run(p, xs), rtol=1e-4, atol=1e-5)


def test_output_passing_an_input_through_is_left_out(tmp_path):
    """A Godot RL Agents policy as its exporter writes every one (a GitHub agent):
    inputs obs and state_ins, outputs output and state_outs = Identity(state_ins), a
    recurrent state's placeholder.  It was refused ("output 'state_outs' is the input");
    that output is left out and the input only it reads with it (said), the policy trains
    on samples of obs alone, export writes the whole file and evaluate feeds ONNX Runtime
    zeros for state_ins."""
    from onnx import TensorProto as T, helper, numpy_helper
    from host_tools.prepare.infer import evaluate
    r = np.random.default_rng(0)
    w = (0.5 * r.standard_normal((3, 6))).astype(np.float32)
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node('Gemm', ['obs', 'w'], ['output'], transB=1),
             helper.make_node('Identity', ['state_ins'], ['state_outs'])]
    g = helper.make_graph(nodes, 'g', [vi('obs', T.FLOAT, ['batch_size', 6]),
                                       vi('state_ins', T.FLOAT, ['batch_size'])],
                          [vi('output', T.FLOAT, ['batch_size', 3]),
                           vi('state_outs', T.FLOAT, ['batch_size'])],
                          [numpy_helper.from_array(w, 'w')])
    p = os.fspath(tmp_path / 'godot.onnx')
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), p)
    xs = r.standard_normal((20, 6)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.tanh(xs[:, :3]).astype(np.float32))
    d, said = os.fspath(tmp_path / 'run'), []
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.05,
            epochs=2, log=said.append)
    text = '\n'.join(said)
    assert "output 'state_outs' is left out" in text and "input 'state_ins' passed" in text, text
    assert "input 'state_ins' is read only by outputs left out" in text, text
    code, out = run(d, python=True, stream=False)
    assert code == 0, out
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    sess = ort.InferenceSession(out, providers=['CPUExecutionProvider'])
    got = np.concatenate([sess.run(['output'], {'obs': xs[i:i + 1], 'state_ins': np.zeros(1, np.float32)})[0]
                          for i in range(20)])
    assert np.abs(utrain_run(d, xs, 'trained.wof') - got).max() < 1e-5
    e = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    assert e['output'] == 'output' and abs(e['mae'] - np.abs(got - np.tanh(xs[:, :3])).mean()) < 1e-5


def test_a_string_attribute_not_utf8_is_refused_by_name(tmp_path):
    """Protobuf hands string attributes over as bytes; each handler decoded its own and a
    byte UTF-8 cannot hold was a UnicodeDecodeError traceback (a Pad mode here).  Read
    once as text (onnx_io._attrs), the refusal names the file, the node and the mode."""
    from onnx import helper
    p = _tiny(os.fspath(tmp_path / 'pad.onnx'), 'Pad', {'mode': b'refl\xffect'},
              extra_inputs=('pads',))
    m = onnx.load(p)
    m.graph.initializer.append(helper.make_tensor('pads', onnx.TensorProto.INT64, [4], [0, 1, 0, 1]))
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 6
    onnx.save(m, p)
    with pytest.raises(ModelError, match='pad.onnx: node the_odd_one.*mode refl\ufffdect: utrain pads with a constant, a reflection'):
        read_model(p)


def test_reciprocal_node_runs_and_passes_its_gradient(tmp_path):
    """torch.reciprocal (ONNX Reciprocal) had been refused ('cannot read ONNX op
    Reciprocal'): read as DIV of the constant 1 by x.  utrain's forward = 1 / h, the
    gradient of the MatMul's weight x^T (dy * -1 / h^2)."""
    from utrain.sink import Sums
    p = _tiny(os.fspath(tmp_path / 'r.onnx'), 'Reciprocal')
    rng = np.random.default_rng(0)
    x = (np.sign(rng.standard_normal((6, 4))) * (0.5 + rng.random((6, 4)))).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=x)
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', epochs=1, lr=0.01,
            log=lambda *a: None)
    np.testing.assert_allclose(utrain_run(d, x), 1 / x.astype(np.float64), rtol=1e-5, atol=1e-6)
    tr = new_trainer(os.path.join(d, 'model.flat'), os.path.join(d, 'weights.wof'))
    tr.net.sink = Sums(tr.net)
    tr.set_input(x[:1])
    tr.net.forward(True)
    dy = np.array([[0.5, -1.0, 2.0, 0.25]])
    tr.net.backward(dy.astype(np.float32))
    (k,) = tr.net.trainable
    h = x[0].astype(np.float64)
    want = np.outer(dy[0] * -1 / h ** 2, h)     # [out, in], as an FC's weight
    got = np.asarray(tr.net.sink.acc[k]).reshape(4, 4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_batchnorm1d_whose_stats_are_identities_of_its_params_exports(tmp_path):
    """torch.onnx writes a fresh BatchNorm1d (after a Linear: a Gemm, no conv to fold into)
    with running_var = Identity(weight) and running_mean = Identity(bias): equal
    initializers deduplicated.  Its scale and shift trained, and export refused them
    ('comes from no initializer'); written back, the Identity must not carry the trained
    weight into the variance: ORT on the export = utrain's trained forward."""
    from onnx import TensorProto as T, helper
    r = np.random.default_rng(0)
    w = (0.6 * r.standard_normal((6, 4))).astype(np.float32)
    w2 = (0.6 * r.standard_normal((3, 6))).astype(np.float32)
    inits = [helper.make_tensor('w', T.FLOAT, [6, 4], w.ravel()),
             helper.make_tensor('bn.weight', T.FLOAT, [6], np.ones(6, np.float32)),
             helper.make_tensor('bn.bias', T.FLOAT, [6], np.zeros(6, np.float32)),
             helper.make_tensor('w2', T.FLOAT, [3, 6], w2.ravel())]
    nodes = [helper.make_node('Identity', ['bn.weight'], ['bn.running_var']),
             helper.make_node('Identity', ['bn.bias'], ['bn.running_mean']),
             helper.make_node('Gemm', ['x', 'w'], ['a'], transB=1),
             helper.make_node('BatchNormalization', ['a', 'bn.weight', 'bn.bias', 'bn.running_mean',
                                                     'bn.running_var'], ['n'], name='bn'),
             helper.make_node('Tanh', ['n'], ['h']),
             helper.make_node('Gemm', ['h', 'w2'], ['y'], transB=1)]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 3])], inits)
    xs = r.standard_normal((16, 4)).astype(np.float32)
    p, d, s, out = _trained_and_exported(tmp_path, g, 'bn1d.onnx', xs, xs[:, :3] * 2, 0.1)
    assert any(n.endswith('bn_scale') for n in s['trainable']), s['trainable']
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5
    assert np.abs(ort_run(p, xs) - ort_run(out, xs)).max() > 1e-3        # (it trained)


def test_weight_normalized_in_the_graph_is_computed_once_and_frozen(tmp_path):
    """A cosine classifier: F.normalize(W) in the graph (ReduceL2, Clip, Expand, Div of the
    initializer W) before the MatMul.  prepare had refused it ('node (Clip): cannot fold
    this op on constants', nothing said of what to do); now the normalized weight is
    computed on the host and frozen (export cannot write a trained value back through a
    normalization), which prepare says; the encoder trains, and ORT on the export (W as
    it was) = utrain's trained forward."""
    from onnx import TensorProto as T, helper
    r = np.random.default_rng(0)
    e = (0.6 * r.standard_normal((5, 4))).astype(np.float32)
    W = r.standard_normal((3, 5)).astype(np.float32)
    inits = [helper.make_tensor('e', T.FLOAT, [5, 4], e.ravel()),
             helper.make_tensor('W', T.FLOAT, [3, 5], W.ravel()),
             helper.make_tensor('eps', T.FLOAT, [], [1e-12]),
             helper.make_tensor('shape', T.INT64, [2], [3, 5])]
    nodes = [helper.make_node('Gemm', ['x', 'e'], ['a'], transB=1),
             helper.make_node('Tanh', ['a'], ['h']),
             helper.make_node('ReduceL2', ['W'], ['n'], axes=[1], keepdims=1),
             helper.make_node('Clip', ['n', 'eps', ''], ['nc']),
             helper.make_node('Expand', ['nc', 'shape'], ['ne']),
             helper.make_node('Div', ['W', 'ne'], ['wn']),
             helper.make_node('Transpose', ['wn'], ['wt'], perm=[1, 0]),
             helper.make_node('MatMul', ['h', 'wt'], ['y'])]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 3])], inits)
    xs = r.standard_normal((16, 4)).astype(np.float32)
    said = []
    from onnx import helper as hp
    p = os.fspath(tmp_path / 'cos.onnx')
    onnx.save(hp.make_model(g, opset_imports=[hp.make_opsetid('', 13)]), p)
    np.savez(tmp_path / 'd.npz', x=xs, y=xs[:, :3])
    d = os.fspath(tmp_path / 'run')
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.1,
                epochs=2, log=lambda *a, **k: said.append(' '.join(map(str, a))))
    assert list(s['trainable']) == ['e'], s['trainable']
    assert any("computed in the graph from the initializer 'W'" in m and 'frozen' in m
               for m in said), said
    assert np.abs(utrain_run(d, xs) - ort_run(p, xs)).max() < FWD_TOL
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5
    assert np.abs(ort_run(p, xs) - ort_run(out, xs)).max() > 1e-3        # (e trained)


@pytest.mark.parametrize('axis,keep', [(1, 0), (2, 1)])
def test_reduce_log_sum_exp_runs_and_passes_its_gradient(tmp_path, axis, keep):
    """torch.logsumexp (ONNX ReduceLogSumExp) had been refused ('cannot read ONNX op
    ReduceLogSumExp'): read as max + log(sum(exp(x - max))).  Forward = numpy's (values
    whose exp overflows float32 among them), the weight's gradient = central differences."""
    from onnx import TensorProto as T, helper
    from utrain.sink import Sums
    r = np.random.default_rng(0)
    w = r.standard_normal((5, 5)).astype(np.float32)
    out = [1, 5] if axis == 1 and not keep else [1, 4, 1]
    nodes = [helper.make_node('MatMul', ['x', 'w'], ['h']),
             helper.make_node('ReduceLogSumExp', ['h'], ['y'], axes=[axis], keepdims=keep)]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 4, 5])],
                          [helper.make_tensor_value_info('y', T.FLOAT, out)],
                          [helper.make_tensor('w', T.FLOAT, [5, 5], w.ravel())])
    p = os.fspath(tmp_path / 'lse.onnx')
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]), p)
    x = r.standard_normal((4, 4, 5)).astype(np.float32)
    x[0] *= 40                                  # (exp of h beyond float32's range)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros([4] + out[1:], np.float32))
    d = os.fspath(tmp_path / 'run')
    # (scale_input off: the device's weight is the file's, the gradient comparable)
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.01, scale_input=False,
            log=lambda *a: None)

    def forward(xi, wv=w.astype(np.float64)):
        h = xi.astype(np.float64) @ wv
        m = h.max(axis - 1, keepdims=True)
        return (m + np.log(np.exp(h - m).sum(axis - 1, keepdims=True))).reshape(-1)
    np.testing.assert_allclose(utrain_run(d, x), np.stack([forward(xi) for xi in x]),
                               rtol=1e-5, atol=1e-4)
    tr = new_trainer(os.path.join(d, 'model.flat'), os.path.join(d, 'weights.wof'))
    tr.net.sink = Sums(tr.net)
    tr.set_input(x[1:2])
    tr.net.forward(True)
    dy = r.standard_normal(int(np.prod(out)))
    tr.net.backward(dy.reshape(tr.net.shape[tr.net.outputs[0]]).astype(np.float32))
    want = np.zeros((5, 5))
    for i in np.ndindex(5, 5):
        e = np.zeros((5, 5))
        e[i] = 1e-5
        want[i] = dy @ (forward(x[1], w + e) - forward(x[1], w - e)) / 2e-5
    (k,) = tr.net.trainable
    np.testing.assert_allclose(np.asarray(tr.net.sink.acc[k]).reshape(5, 5).T, want,
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('ctm,how', [('pytorch_half_pixel', 'scales'), ('half_pixel', 'scales'),
                                     ('align_corners', 'sizes')])
def test_linear_resize_of_a_1d_signal_runs(tmp_path, ctm, how):
    """F.interpolate(x, scale_factor=2, mode='linear') of [N, C, L] (ONNX Resize of a 3-D
    tensor) had been refused ("mode linear: utrain resizes with mode 'linear' (bilinear)
    or 'nearest'", of a linear resize): resized as the map [N, C, 1, L] along its width.
    utrain's forward = ONNX Runtime's, and the conv before it trains."""
    from onnx import TensorProto as T, helper
    r = np.random.default_rng(0)
    w = (0.5 * r.standard_normal((3, 2, 3))).astype(np.float32)
    inits = [helper.make_tensor('w', T.FLOAT, [3, 2, 3], w.ravel())]
    if how == 'scales':
        inits.append(helper.make_tensor('sc', T.FLOAT, [3], [1.0, 1.0, 2.0]))
        rin = ['h', '', 'sc']
    else:
        inits.append(helper.make_tensor('sz', T.INT64, [3], [1, 3, 13]))
        rin = ['h', '', '', 'sz']
    nodes = [helper.make_node('Conv', ['x', 'w'], ['h'], pads=[1, 1]),
             helper.make_node('Resize', rin, ['y'], mode='linear',
                              coordinate_transformation_mode=ctm)]
    L2 = 16 if how == 'scales' else 13
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 2, 8])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 3, L2])], inits)
    p = os.fspath(tmp_path / 'r.onnx')
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]), p)
    x = r.standard_normal((6, 2, 8)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((6, 3, L2), np.float32))
    d = os.fspath(tmp_path / 'run')
    s = prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.01, log=lambda *a: None)
    assert list(s['trainable']) == ['w'], s['trainable']
    np.testing.assert_allclose(utrain_run(d, x), ort_run(p, x).reshape(6, -1), rtol=1e-5,
                               atol=FWD_TOL)


@pytest.mark.parametrize('kind', ['tanh_bi', 'relu_2layers'])
def test_elman_rnn_node_trains_and_exports(tmp_path, kind):
    """nn.RNN (ONNX RNN: h = act(x W + h R + b), tanh or relu) had been refused ('cannot
    read ONNX op RNN'): unrolled as GRU and LSTM are.  utrain's forward = ONNX Runtime's,
    and ORT on the export = utrain's trained forward."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            bi = kind == 'tanh_bi'
            self.r = nn.RNN(3, 4, num_layers=1 if bi else 2, batch_first=True, bidirectional=bi,
                            nonlinearity='tanh' if bi else 'relu')
            self.o = nn.Linear(8 if bi else 4, 2)

        def forward(self, x):
            y, _ = self.r(x)
            return self.o(y[:, -1])
    p = os.fspath(tmp_path / 'rnn.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(Net().eval(), (torch.zeros(1, 5, 3),), p, opset_version=13,
                          input_names=['x'], output_names=['y'], dynamo=False)
    xs = np.random.default_rng(0).standard_normal((12, 5, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.random.default_rng(1).standard_normal((12, 2)))
    d = os.fspath(tmp_path / 'run')
    prepare(p, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.05,
            epochs=2, log=lambda *a: None)
    assert np.abs(utrain_run(d, xs) - ort_run(p, xs)).max() < 1e-5
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(p, os.path.join(d, 'trained.wof'), out)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5
    assert np.abs(ort_run(p, xs) - ort_run(out, xs)).max() > 1e-3


def _variadic_graph(op, n):
    """x [1, 4] -> MatMuls by w0, w1 ([4, 4]) and w2 ([4, 1], broadcast) -> op of the first
    n of them (n = 4: and the initializer c, [4] for Sum and Mean, a scalar clamp for Max
    and Min) -> y [1, 4]; returns (graph, the torch function of x and the weights)."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(1)
    ws = [(0.7 * r.standard_normal(s)).astype(np.float32) for s in ((4, 4), (4, 4), (4, 1))]
    c = np.array([0.3, -0.2, 0.1, 0.4] if op in ('Sum', 'Mean') else 0.05, np.float32)
    m = min(n, 3)
    inits = [numpy_helper.from_array(w, f'w{j}') for j, w in enumerate(ws[:m])] + \
        [numpy_helper.from_array(c, 'c')] * (n == 4)
    nodes = [helper.make_node('MatMul', ['x', f'w{j}'], [f'h{j}']) for j in range(m)]
    nodes.append(helper.make_node(op, [f'h{j}' for j in range(min(n, 3))] + ['c'] * (n == 4),
                                  ['y']))
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 4])], inits)

    def f(x, w):
        hs = [x @ v for v in w[:min(n, 3)]] + [torch.tensor(c, dtype=torch.float64)] * (n == 4)
        hs = torch.broadcast_tensors(*hs)
        if op in ('Sum', 'Mean'):
            s = sum(hs[1:], hs[0])
            return s / len(hs) if op == 'Mean' else s
        red = torch.maximum if op == 'Max' else torch.minimum
        s = hs[0]
        for h in hs[1:]:
            s = red(s, h)
        return s
    return g, ws, f


@pytest.mark.parametrize('n', [1, 3, 4])
@pytest.mark.parametrize('op', ['Sum', 'Mean', 'Max', 'Min'])
def test_variadic_sum_mean_max_min_run_train_and_export(op, n, tmp_path):
    """Issue 28: ONNX Sum had been refused ('cannot read ONNX op Sum'), Mean too, and Max or
    Min of other than two inputs ('3 operands: utrain takes the Max of two'); ONNX allows
    one to any number, broadcast.  Each is the first input or a chain of two-input ops
    (Mean: times 1 / n).  utrain's forward = ORT's, the weights' gradients = torch
    autograd's, and it trains and exports: ORT on the export = utrain's trained forward."""
    from utrain.sink import Sums
    g, ws, f = _variadic_graph(op, n)
    r = np.random.default_rng(2)
    xs = r.standard_normal((8, 4)).astype(np.float32)
    p, d, s, out = _trained_and_exported(tmp_path, g, 'v.onnx', xs, np.tanh(xs), 0.02)
    rw = json.load(open(os.path.join(d, 'prepare.json')))['rewritten']
    names = {t.index: t.name for t in read_model(os.path.join(d, rw) if rw else p).tensors}
    np.testing.assert_allclose(utrain_run(d, xs), ort_run(p, xs), rtol=1e-5, atol=1e-5)
    tr = new_trainer(os.path.join(d, 'model.flat'), os.path.join(d, 'weights.wof'))
    tr.net.sink = Sums(tr.net)
    tr.set_input(xs[:1])
    tr.net.forward(True)
    dy = np.array([[0.5, -1.0, 2.0, 0.25]])
    tr.net.backward(dy.astype(np.float32))
    wt = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in ws]
    (f(torch.tensor(xs[:1], dtype=torch.float64), wt) * torch.tensor(dy)).sum().backward()
    seen = set()
    for k in tr.net.trainable:
        nm = names[k]
        if nm not in ('w0', 'w1', 'w2'):
            continue
        want = wt[int(nm[1])].grad.numpy().T        # (an FC's weight: [out, in])
        got = np.asarray(tr.net.sink.acc[k], np.float64).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=nm)
        seen.add(nm)
    assert seen == {f'w{j}' for j in range(min(n, 3))}, seen
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(out, xs)).max() < 1e-5
    assert np.abs(ort_run(out, xs) - ort_run(p, xs)).max() > 1e-3        # (it trained)


@pytest.mark.parametrize('k, s, pads, opad', [
    ((3, 3), (2, 2), [0, 0, 1, 1], None),       # pads only at the end: 6 of the full 7
    ((3, 2), (2, 1), [0, 1, 2, 0], None),       # asymmetric
    ((3, 3), (2, 2), [0, 0, 2, 1], [1, 1]),     # output_padding, pads at the end
    ((3, 3), (2, 2), [1, 1, 1, 1], [1, 1]),     # PyTorch's padding=1, output_padding=1
])
def test_conv_transpose_writes_sizes_tflite_computes_alike(k, s, pads, opad, tmp_path):
    """A 2-D ConvTranspose with pads only at the end was written as a VALID TRANSPOSE_CONV
    to an output under the full size: utrain computes that, TFLite (TensorFlow's size
    rules: VALID out = the full size to s - 1 past it, SAME in = ceil(out / s)) computes
    such a graph differently.  Written as the 3-D reader's are (optable.tconv_form): a
    size TensorFlow allows, or VALID to the full size and a cut; the forward = ORT's, and
    it trains and exports."""
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(3)
    w = (0.5 * r.standard_normal((2, 3) + k)).astype(np.float32)
    attrs = dict(strides=list(s), pads=pads, **({'output_padding': opad} if opad else {}))
    full = [(3 - 1) * st + kk + (opad[j] if opad else 0) for j, (kk, st) in enumerate(zip(k, s))]
    out = [full[j] - pads[j] - pads[j + 2] for j in range(2)]
    g = helper.make_graph(
        [helper.make_node('ConvTranspose', ['x', 'w', 'b'], ['y'], **attrs)], 'g',
        [helper.make_tensor_value_info('x', T.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info('y', T.FLOAT, [1, 3] + out)],
        [numpy_helper.from_array(w, 'w'), numpy_helper.from_array(
            np.array([0.1, -0.2, 0.3], np.float32), 'b')])
    xs = r.standard_normal((6, 2, 3, 3)).astype(np.float32)
    y = (0.5 * r.standard_normal((6, 3 * out[0] * out[1]))).astype(np.float32)
    p, d, _, exp = _trained_and_exported(tmp_path, g, 'ct.onnx', xs, y, 0.02)
    rw = json.load(open(os.path.join(d, 'prepare.json')))['rewritten']
    rg = read_model(os.path.join(d, rw) if rw else p)
    convs = [op for op in rg.ops if op.name == 'TRANSPOSE_CONV']
    assert convs
    for op in convs:
        (_, hi, wi, _), (_, ho, wo, _) = (rg.tensors[op.inputs[2]].shape,
                                          rg.tensors[op.outputs[0]].shape)
        _, kh, kw, _ = rg.tensors[op.inputs[1]].shape
        for n, m, kk, st in ((hi, ho, kh, s[0]), (wi, wo, kw, s[1])):
            assert (-(-m // st) == n if op.options['padding'] == 'SAME' else
                    (n - 1) * st + kk <= m < (n - 1) * st + kk + st), (op.options, n, m)
    np.testing.assert_allclose(utrain_run(d, xs), ort_run(p, xs), rtol=1e-5, atol=1e-5)
    assert np.abs(utrain_run(d, xs, 'trained.wof') - ort_run(exp, xs)).max() < 1e-5
    assert np.abs(ort_run(exp, xs) - ort_run(p, xs)).max() > 1e-3        # (it trained)
