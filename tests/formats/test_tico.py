"""PyTorch parity through tico: a PyTorch CNN and a small MobileNet-style network are
converted with tico, prepared by host_tools (tico's layout transposes cancelled, frozen
BatchNorms folded, the NCHW input turned NHWC), trained by utrain under CPython and unix
MicroPython, and compared tensor by tensor with PyTorch training the same model on the
same samples in the same order (SGD, cross-entropy on logits, batch 1 and 4, one epoch).

BatchNorm: an exported model computes BatchNorm with its running statistics (tico refuses
train-mode BatchNorm), so the PyTorch reference fine-tunes with the BatchNorm modules in
eval mode.  A frozen conv+BatchNorm is folded into the conv.  Where the BatchNorm trains,
the graph keeps tico's MUL by s = gamma / sqrt(var + eps) and ADD of t = beta - mean * s,
and SGD on (s, t) is not SGD on (gamma, beta): the reference then trains the same
function in the same parametrisation, a per-channel x * s + t (Affine below).
"""
import copy
import os
import sys

import numpy as np
import pytest

from test_parity import MICROPYTHON, ROOT  # sys.path set up there  # noqa: F401
from host_tools.formats.circle_io import read_model
from host_tools.graph.optable import SPECS
from host_tools.prepare.pipeline import prepare
from host_tools.target.runner import run
from host_tools.files.wof import read_wof

torch = pytest.importorskip('torch')
tico = pytest.importorskip('tico')
nn = torch.nn

TOL = 1e-4                  # relative, per tensor
N = 8                       # samples: one epoch
LR = 0.1
MOVED = 3 * TOL           # a trained tensor moves at least this much (relative), and at
                          # least 100x its error


class Affine(nn.Module):
    """x * s + t per channel: an eval-mode BatchNorm2d as the exported graph trains it."""

    def __init__(self, bn):
        super().__init__()
        s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        self.s = nn.Parameter(s.detach().clone())
        self.t = nn.Parameter((bn.bias - bn.running_mean * s).detach().clone())

    def forward(self, x):
        return x * self.s[None, :, None, None] + self.t[None, :, None, None]


def _bn_init(model, seed):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                c = m.num_features
                m.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.rand(c, generator=g) - 0.5)
    return model


def cnn(bn_trains=False):
    """Conv-BN-ReLU-MaxPool-Conv-ReLU-AvgPool-Flatten-Linear on 1x8x8."""
    torch.manual_seed(1)
    return _bn_init(nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
        nn.Linear(6 * 2 * 2, 3)), 2)


def mobilenet(bn_trains=False):
    """Stem conv-BN-ReLU6, depthwise-separable block (dw 3x3 + pw 1x1, each -ReLU6, with
    BatchNorm when it trains too), global average pool, Linear; 3x8x8 input."""
    torch.manual_seed(3)
    block = [nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=not bn_trains)]
    block += [nn.BatchNorm2d(8)] if bn_trains else []
    block += [nn.ReLU6(), nn.Conv2d(8, 12, 1, bias=not bn_trains)]
    block += [nn.BatchNorm2d(12)] if bn_trains else []
    return _bn_init(nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
        *block, nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 4)), 4)


# case -> (model builder, input shape, classes, first trainable module index or None = all)
CASES = {
    'cnn-frozen-stem': (cnn, (1, 1, 8, 8), 3, 4),
    'mobilenet-frozen-stem': (mobilenet, (1, 3, 8, 8), 4, 3),
    'cnn-all-bn-trains': (cnn, (1, 1, 8, 8), 3, None),
    'mobilenet-all-bn-trains': (mobilenet, (1, 3, 8, 8), 4, None),
}


def data(shape, classes, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N,) + tuple(shape[1:])).astype(np.float32)
    return x, rng.integers(0, classes, N)


def torch_train(model, first, x, y, batch):
    """SGD on the eval-mode model (float64), modules from ``first`` on trainable (all when
    None, BatchNorms as Affine).  Returns the trained reference model."""
    ref = copy.deepcopy(model).double().eval()
    if first is None:
        for i, m in enumerate(ref):
            if isinstance(m, nn.BatchNorm2d):
                ref[i] = Affine(m)
            elif isinstance(m, nn.Conv2d) and m.bias is None:
                # tico writes a zero bias for bias=False, and the graph trains it
                m.bias = nn.Parameter(torch.zeros(m.out_channels, dtype=torch.float64))
    for i, m in enumerate(ref):
        for p in m.parameters():
            p.requires_grad_(first is None or i >= first)
    opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=LR)
    lossf = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x.astype(np.float64)), torch.from_numpy(y)
    for s in range(0, N, batch):
        opt.zero_grad()
        lossf(ref(xt[s:s + batch]), yt[s:s + batch]).backward()
        opt.step()
    return ref


def circle_layout(ref, x0):
    """The reference's parameters in the rewritten graph's order and layout: per trained
    layer (conv, depthwise, linear, affine) its weight and bias as the circle graph holds
    them (conv [O,KH,KW,I], depthwise [1,KH,KW,C], a Linear after a flatten of a CxHxW map
    with its columns in HWC order, affine s and t as [1,1,1,C])."""
    out = []
    h = torch.from_numpy(x0.astype(np.float64))
    prev_shape = None
    for i, m in enumerate(ref):
        if isinstance(m, nn.Conv2d):
            w = m.weight.detach().numpy()
            w = w.transpose(1, 2, 3, 0) if m.groups > 1 else w.transpose(0, 2, 3, 1)
            out.append((i, 'CONV', w, None if m.bias is None else m.bias.detach().numpy()))
        elif isinstance(m, nn.Linear):
            w = m.weight.detach().numpy()
            if prev_shape is not None and prev_shape[1] * prev_shape[2] > 1:
                c, hh, ww = prev_shape          # the map the Flatten before it flattened
                w = w[:, np.arange(c * hh * ww).reshape(c, hh, ww).transpose(1, 2, 0).ravel()]
            out.append((i, 'FC', w, m.bias.detach().numpy()))
        elif isinstance(m, Affine):
            c = m.s.shape[0]
            out.append((i, 'AFFINE', m.s.detach().numpy().reshape(1, 1, 1, c),
                        m.t.detach().numpy().reshape(1, 1, 1, c)))
        prev_shape = tuple(h.shape[1:]) if h.dim() == 4 else prev_shape
        with torch.no_grad():
            h = m(h)
    return out


def graph_params(g):
    """Per layer of the rewritten graph: (kind, weight tensor, bias tensor or -1); a MUL
    and the ADD after it are one affine."""
    out, ops = [], g.ops
    for i, op in enumerate(ops):
        if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D'):
            out.append(('CONV', op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else -1))
        elif op.name == 'FULLY_CONNECTED':
            out.append(('FC', op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else -1))
        elif op.name == 'MUL':
            k = [t for t in op.inputs if g.tensors[t].data is not None][0]
            add = ops[i + 1]
            b = [t for t in add.inputs if g.tensors[t].data is not None][0]
            out.append(('AFFINE', k, b))
    return out


def run_case(tmp_path, case, batch, backend):
    make, shape, classes, first = CASES[case]
    model = make(bn_trains=first is None).eval()
    src = os.fspath(tmp_path / 'model.circle')
    tico.convert(model, (torch.zeros(*shape),)).save(src)
    x, y = data(shape, classes)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    src_ops = [op.name for op in read_model(src).ops]
    if first is None:
        train = 'all'
    else:         # from the first trained layer of the tico graph (ONERT's last:N)
        n_layers = sum(isinstance(m, (nn.Conv2d, nn.Linear)) for m in model[:first])
        layer_ops = [i for i, n in enumerate(src_ops)
                     if n in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED')]
        train = f'last:{len(src_ops) - layer_ops[n_layers]}'
    d = tmp_path / 'run'
    s = prepare(src, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
                optimizer='sgd', lr=LR, batch=batch, epochs=1, train=train, shuffle=False)
    g = read_model(d / 'rewritten.circle')
    assert 'TRANSPOSE' not in [op.name for op in g.ops]
    assert s['input_perm'] == (None if shape[1] == 1 else [0, 2, 3, 1])
    code, text = run(os.fspath(d), python=(backend == 'cpython'), stream=False)
    assert code == 0, text
    got = read_wof(d / 'trained.wof', g)
    w0 = read_wof(d / 'weights.wof', g)
    ref = circle_layout(torch_train(model, first, x, y, batch), x[:1])
    layers = graph_params(g)
    assert len(layers) == len(ref), (layers, [r[1] for r in ref])
    trained = [(lp, r) for lp, r in zip(layers, ref)
               if first is None or r[0] >= first]
    checked, worst = 0, 0.0
    for (kind, kw, kb), (m, rkind, rw, rb) in trained:
        assert kind == rkind, (kind, rkind)
        for k, r in ((kw, rw), (kb, rb)):
            if r is None:
                continue
            assert k in got, f'{case}: {g.tensors[k].name} did not train'
            err = float(np.abs(got[k] - r).max() / np.abs(r).max())
            moved = float(np.abs(w0[k] - r).max() / np.abs(r).max())
            assert err <= TOL, f'{case}/{backend}/b{batch}: {g.tensors[k].name} rel err {err:.2e}'
            assert moved >= max(MOVED, 100 * err), \
                f'{case}: {g.tensors[k].name} barely moved ({moved:.1e}, err {err:.1e})'
            checked += 1
            worst = max(worst, err)
    assert checked >= 4
    print(f'{case} {backend} batch {batch}: {checked} tensors, max rel err {worst:.2e}')
    # exactly the trained layers' tensors are in trained.wof (the folded stem is not)
    assert sorted(got) == sorted(k for lp, _ in trained for k in lp[1:] if k >= 0)
    return checked


@pytest.mark.parametrize('batch', [1, 4])
@pytest.mark.parametrize('case', ['cnn-frozen-stem', 'mobilenet-frozen-stem'])
def test_tico_frozen_stem_matches_pytorch(tmp_path, case, batch):
    run_case(tmp_path, case, batch, 'cpython')


@pytest.mark.slow
@pytest.mark.skipif(MICROPYTHON is None, reason='unix micropython not found')
@pytest.mark.parametrize('case', ['cnn-frozen-stem', 'mobilenet-frozen-stem'])
def test_tico_frozen_stem_micropython(tmp_path, case):
    run_case(tmp_path, case, 4, 'micropython')


@pytest.mark.parametrize('batch', [1, 4])
@pytest.mark.parametrize('case', ['cnn-all-bn-trains', 'mobilenet-all-bn-trains'])
def test_tico_batchnorm_trains_matches_pytorch(tmp_path, case, batch):
    run_case(tmp_path, case, batch, 'cpython')


@pytest.mark.slow
@pytest.mark.skipif(MICROPYTHON is None, reason='unix micropython not found')
def test_tico_batchnorm_trains_micropython(tmp_path):
    run_case(tmp_path, 'mobilenet-all-bn-trains', 4, 'micropython')


# --------------------------------------------------------------------------- the CNN demo

def _cli(*args):
    import subprocess
    return subprocess.run([sys.executable, '-m', 'host_tools', *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_inspect_says_what_prepare_rewrites_and_what_trains():
    r = _cli('inspect', os.path.join(ROOT, 'datasets', 'digits', 'digits_tico_cnn.circle'))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.count('[removed by prepare]') == 3                  # tico's TRANSPOSEs
    assert 'folded into the layer before it when that is frozen' in out   # MUL, ADD
    assert 'ops after the rewrites' in out
    trains = sorted(n for n, sp in SPECS.items() if sp.params)
    assert 'ops that train here (weights): ' + ', '.join(trains) in out
    assert {'CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED'} <= set(trains)


@pytest.mark.slow
def test_cnn_demo_fine_tunes_the_tico_model(tmp_path):
    """`demo --model cnn` (CPython, one epoch): the model pre-trained on digits 0-5 learns
    all ten, and the exported model is the trained one."""
    out = os.fspath(tmp_path / 'cnn')
    r = _cli('demo', '--model', 'cnn', '--python', '--epochs', '1', '--out', out)
    assert r.returncode == 0, r.stdout + r.stderr
    from test_pipeline import read_log
    log = read_log(os.path.join(out, 'train.log'))
    assert log[0][4] < 0.7                      # before: the digits 6-9 are unknown
    assert log[-1][4] >= 0.88, log
    hits, n = r.stdout.split('test accuracy ')[-1].split('(')[1].split(')')[0].split('/')
    assert abs(int(hits) / int(n) - log[-1][4]) < 1e-6
