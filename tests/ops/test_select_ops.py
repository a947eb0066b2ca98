"""Comparisons (LESS, GREATER, GREATER_EQUAL, LESS_EQUAL: a 1.0 / 0.0 mask, no gradient)
and SELECT / SELECT_V2 (c ? a : b; a and b get the gradient where they were taken), as
tico writes torch's Softplus (its threshold branch: x > threshold ? x : log1p(exp(x))),
Mish (whose softplus is the same), Threshold (x <= t ? value : x) and torch.where:
utrain's forward and gradients against PyTorch autograd and float64 central finite
differences of the device's own forward, then prepare + run + export end to end.
Issue 28: these models were refused (GREATER / SELECT_V2 unsupported)."""
import os

import numpy as np
import pytest

import test_parity as tp  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402


def _nets(torch):
    nn = torch.nn

    class Where(nn.Module):              # a mask from one activation, picking another
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

        def forward(self, x):
            h = self.a(x)
            return self.b(torch.where(h > 0.2, h, torch.tanh(h)))

    class Picks(nn.Module):              # a select whose untaken side is inf or NaN
        def __init__(self, f, scale=1.0):
            super().__init__()
            self.a, self.b, self.f = nn.Linear(6, 8), nn.Linear(8, 3), f
            with torch.no_grad():          # (outputs of order 1: float32 keeps digits)
                self.a.weight.mul_(scale)
                self.b.weight.div_(scale)

        def forward(self, x):
            return self.b(self.f(self.a(x)))

    big = 1000.0       # |x W| beyond 88 (float32's EXP overflows) and 709 (float64's)
    return {
        'softplus': nn.Sequential(nn.Linear(6, 8), nn.Softplus(), nn.Linear(8, 3)),
        # (a threshold some values cross: the x branch is taken for those)
        'softplus_t': nn.Sequential(nn.Linear(6, 8), nn.Softplus(threshold=0.5),
                                    nn.Linear(8, 3)),
        'mish': nn.Sequential(nn.Linear(6, 8), nn.Mish(), nn.Linear(8, 3)),
        'threshold': nn.Sequential(nn.Linear(6, 8), nn.Threshold(0.1, 2.0), nn.Linear(8, 3)),
        'where': Where(),
        # issue 28: EXP of the untaken side overflows (0 * inf = NaN in its gradient)
        'softplus_big': Picks(nn.Softplus(), big),
        'mish_big': Picks(nn.Mish(), big),
        # SQRT / RSQRT of the untaken side's negatives: NaN (torch's own gradient is NaN
        # there: checked by finite differences only)
        'sqrt': Picks(lambda h: torch.where(h > 0, torch.sqrt(h), h)),
        'rsqrt': Picks(lambda h: torch.where(h > 0.1, torch.rsqrt(h), h)),
    }


def _convert(name, tmp_path):
    torch = pytest.importorskip('torch')
    tico = pytest.importorskip('tico')
    torch.manual_seed(1)
    net = _nets(torch)[name].eval()
    path = str(tmp_path / (name + '.circle'))
    tico.convert(net, (torch.zeros(1, 6),)).save(path)
    return torch, net, path


@pytest.mark.parametrize('name', ['softplus', 'softplus_t', 'mish', 'threshold', 'where',
                                  'softplus_big', 'mish_big'])
def test_tico_select_forward_and_gradients_match_torch(name, tmp_path):
    torch, net, path = _convert(name, tmp_path)
    ops = {o.name for o in read_model(path).ops}
    assert ops & {'SELECT', 'SELECT_V2'} and ops & {'GREATER', 'LESS_EQUAL'}, ops
    prepare(path, str(tmp_path), loss='mse', train='all', rewrite=False)
    tr = tp.new_trainer(tmp_path / 'model.flat', tmp_path / 'weights.wof')
    from utrain.sink import Sums
    tr.net.sink = Sums(tr.net)           # gradients summed, not applied
    g = read_model(path)
    x = torch.tensor([[1.5, -2.0, 0.7, 3.0, -0.4, 1.1]])
    tr.set_input(x.numpy())
    tr.net.forward(True)
    ref = net(x)
    y = np.array(tr.net.output(), dtype=np.float64)
    np.testing.assert_allclose(y.ravel(), ref.detach().numpy().ravel(), rtol=1e-5, atol=1e-6)
    h = net[0](x) if isinstance(net, torch.nn.Sequential) else net.a(x)
    if name == 'softplus_t':             # both branches taken
        assert (h > 0.5).any() and (h <= 0.5).any()
    if name.endswith('_big'):            # EXP overflows where the select takes x
        assert (h > 88.8).any() and (h < 0).any()
    dy = np.array([[0.5, -1.0, 2.0]], np.float32)
    tr.net.backward(dy)
    (ref * torch.tensor(dy)).sum().backward()
    params = dict(net.named_parameters())
    assert len(tr.net.trainable) == len(params)
    for k in tr.net.trainable:
        t = g.tensors[k]
        want = next(p for n, p in params.items()
                    if tuple(p.shape) == tuple(t.shape) and np.allclose(
                        p.detach().numpy(), t.data.reshape(p.shape)))
        np.testing.assert_allclose(np.asarray(tr.net.sink.acc[k]).ravel(),
                                   want.grad.numpy().ravel(), rtol=1e-4, atol=1e-6,
                                   err_msg=f'{name}: {t.name}')


def _build(tmp_path):
    """Each net through tico, prepared as converted, for op_harness's float64 worker
    (finite differences of the device's forward) and the MicroPython run."""
    torch = pytest.importorskip('torch')
    pytest.importorskip('tico')

    def build(cid, where, seed):
        os.makedirs(where, exist_ok=True)
        _, net, path = _convert(cid, tmp_path)
        os.replace(path, os.path.join(where, 'model.circle'))
        path = os.path.join(where, 'model.circle')
        prepare(path, where, loss='mse', train='all', rewrite=False)
        rng = np.random.default_rng(seed)
        x = rng.normal(0.0, 1.5, (1, 6)).astype(np.float32)
        y = net(torch.tensor(x)).detach().numpy().astype(np.float64)
        g = read_model(path)
        params = sorted(k for o in g.ops if o.name == 'FULLY_CONNECTED' for k in o.inputs[1:3])
        job = {'flat': os.path.join(where, 'model.flat'), 'wof': os.path.join(where, 'weights.wof'),
               'x': x.ravel().tolist(), 't': (y + rng.normal(0, 0.5, y.shape)).ravel().tolist()}
        return job, {'path': path, 'x': x, 'y_ref': y, 'params': params}
    return build


CASES = ['softplus_t', 'mish', 'threshold', 'where', 'softplus_big', 'mish_big', 'sqrt', 'rsqrt']


def test_select_gradients_by_finite_differences_and_on_micropython(tmp_path):
    """The device code's gradients against float64 central differences of its own forward
    (CPython+numpy), the forward against ONERT, then the same under unix MicroPython
    (npfallback; ulab where $MICROPYTHON has it) against the float64 run."""
    from op_harness import check_case, check_micropython, run_device
    device = run_device(tmp_path, CASES, _build(tmp_path), 7)
    for cid in CASES:
        check_case(device, cid, rtol=1e-5)
    check_micropython(device, CASES, tmp_path)


def test_softplus_classifier_prepare_run_export(tmp_path):
    """A tico Softplus(beta=2, threshold=1) classifier (PyTorch's function jumps at x = 0.5:
    prepare keeps the select, spellings.selects_to_relu declines it) through the CLI as a
    user runs it: prepare (rewrites on), run on the simulated board, export; the exported
    circle under ONERT gives utrain's trained forward and scores better than the original."""
    import subprocess
    import sys
    torch = pytest.importorskip('torch')
    tico = pytest.importorskip('tico')
    from onert_ref import onert_infer
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (120, 6)).astype(np.float32)
    y = np.argmax(x @ rng.normal(0, 1, (6, 3)), 1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Softplus(beta=2.0, threshold=1.0),
                              torch.nn.Linear(16, 3)).eval()
    model, data, out = (str(tmp_path / n) for n in ('sp.circle', 'sp.npz', 'run'))
    tico.convert(net, (torch.zeros(1, 6),)).save(model)
    np.savez(data, x=x, y=y)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def cli(*args):
        p = subprocess.run([sys.executable, '-m', 'host_tools', *args], cwd=root,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return p.stdout
    cli('prepare', model, data, '-o', out, '--epochs', '4')
    ops = {o.name for o in read_model(os.path.join(out, 'rewritten.circle')).ops}
    assert {'GREATER', 'SELECT_V2'} <= ops, ops
    cli('run', out)
    trained = str(tmp_path / 'trained.circle')
    cli('export', model, os.path.join(out, 'trained.wof'), '-o', trained)
    tr = tp.new_trainer(os.path.join(out, 'model.flat'), os.path.join(out, 'trained.wof'))
    ref = onert_infer(trained, x[:8])
    for i in range(8):
        tr.set_input(x[i:i + 1])
        tr.net.forward(False)
        np.testing.assert_allclose(np.asarray(tr.net.output(), np.float64).ravel(),
                                   ref[i].ravel(), rtol=1e-4, atol=1e-5)
    acc = [float(cli('evaluate', m, data).split('accuracy ')[1].split()[0]) for m in (model, trained)]
    assert acc[1] > acc[0] + 0.3, acc


# ------------------------------------------------------------------ a constant condition
def _causal_scores(path, T=4, O=3, seed=0):
    """Keras's MultiHeadAttention(use_causal_mask=True) as TFLiteConverter writes its mask:
    x [1, T*T] -> FC -> RESHAPE [1, T, T] (the scores); SHAPE of them -> FILL(true) ->
    LOGICAL_AND with the lower triangle (a bool constant) -> SELECT_V2(mask, scores, -1e9)
    -> SOFTMAX -> RESHAPE [1, T*T] -> FC -> y.  Returns (path, W1, W2, tri)."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(seed)
    W1 = rng.normal(size=(T * T, T * T)).astype(np.float32) * 0.5
    W2 = rng.normal(size=(O, T * T)).astype(np.float32)
    tri = np.tril(np.ones((1, 1, T, T), bool))
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T * T])
    h = b.tensor('h', [1, T * T])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [T * T, T * T], data=W1), -1], [h],
         fused_activation_function='NONE')
    s = b.tensor('scores', [1, 1, T, T])
    b.op('RESHAPE', [h, b.tensor('s_shape', [4], data=np.array([1, 1, T, T], np.int32))], [s])
    shp = b.tensor('shape', [4], dtype='int32')
    b.op('SHAPE', [s], [shp])
    ones = b.tensor('ones_like', [1, 1, T, T], dtype='bool')
    b.op('FILL', [shp, b.tensor('true', [], data=np.array(True))], [ones])
    mask = b.tensor('LogicalAnd', [1, 1, T, T], dtype='bool')
    b.op('LOGICAL_AND', [ones, b.tensor('tri', [1, 1, T, T], data=tri)], [mask])
    sel = b.tensor('sel', [1, 1, T, T])
    b.op('SELECT_V2', [mask, s, b.tensor('neg', [], data=np.array(-1e9, np.float32))], [sel])
    p = b.tensor('p', [1, 1, T, T])
    b.op('SOFTMAX', [sel], [p], beta=1.0)
    pf = b.tensor('pf', [1, T * T])
    b.op('RESHAPE', [p, b.tensor('p_shape', [2], data=np.array([1, T * T], np.int32))], [pf])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [pf, b.tensor('w2', [O, T * T], data=W2), -1], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path), W1, W2, tri[0, 0]


def test_select_by_a_constant_bool_mask_trains(tmp_path):
    """A select whose condition is a bool constant once the shape arithmetic is folded (a
    causal attention mask: FILL of true AND the triangle) is read as a 1.0 / 0.0 float mask
    (spellings.constant_masks): prepare had refused the folded bool tensor ('utrain trains
    float32 models').  utrain's forward and gradients are a float64 numpy reference's (TFLite
    Micro cannot run a FILL of a shape read at run time): the masked scores get none."""
    from host_tools.prepare.pipeline import prepare
    from utrain.sink import Sums
    T = 4
    src, W1, W2, tri = _causal_scores(tmp_path / 'causal.tflite', T)
    x = np.random.default_rng(1).normal(size=(6, T * T)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((6, 3), np.float32))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.1,
            log=lambda *a, **k: None)
    tr = tp.new_trainer(out / 'model.flat', out / 'weights.wof')
    got = tp.utrain_predict(tr, x, [1, T * T])

    def probs(xi):
        s = (W1.astype(np.float64) @ xi.astype(np.float64)).reshape(T, T)
        e = np.where(tri, np.exp(s - np.where(tri, s, -np.inf).max(1, keepdims=True)), 0.0)
        return e / e.sum(1, keepdims=True)
    ref = np.stack([W2.astype(np.float64) @ probs(xi).reshape(-1) for xi in x])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # gradients of one sample (dL/dy = dy)
    tr.net.sink = Sums(tr.net)
    tr.set_input(x[:1])
    tr.net.forward(True)
    dy = np.array([[0.5, -1.0, 2.0]])
    tr.net.backward(dy.astype(np.float32))
    p = probs(x[0])
    dp = (W2.T.astype(np.float64) @ dy[0]).reshape(T, T)
    ds = p * (dp - (dp * p).sum(1, keepdims=True))
    want = {(T * T, T * T): np.outer(ds.reshape(-1), x[0]), (3, T * T): np.outer(dy[0], p.reshape(-1))}
    g = read_model(os.fspath(out / 'rewritten.circle'))
    got = {tuple(g.tensors[k].shape): np.asarray(tr.net.sink.acc[k]).reshape(g.tensors[k].shape)
           for k in tr.net.trainable if len(g.tensors[k].shape) == 2}
    assert set(got) == set(want), got.keys()
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6, err_msg=str(k))
    assert not got[(T * T, T * T)].reshape(T, T, T * T)[~tri].any()     # masked: none
