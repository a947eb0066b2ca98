"""LSTM, GRU and a LayerNorm/GELU block from PyTorch, through tico, prepare, train and
export end to end, and train like PyTorch: same weights, same samples in the same order,
SGD on cross-entropy of logits, one epoch of 8 samples at batch 1 and 4; every trained
tensor compared with the PyTorch reference (float64), under CPython and unix MicroPython.

tico unrolls an RNN over its time steps: the input projection is one FULLY_CONNECTED over
all steps, each later step one FULLY_CONNECTED of the state by W_hh (the same weight
tensor in every step: utrain sums its gradient over the steps before one update), then
SPLIT into the gates, LOGISTIC/TANH, MUL, ADD (SUB for the GRU).  Step 0 has no state: tico
folds W_hh h0 + b_hh into a constant (= b_hh) and keeps the zero initial state c0 (LSTM)
or h0 (GRU) as a constant operand of a MUL or SUB.  prepare ties those copies back to b_hh
(copies.first_steps: step 0 reads the recurrent FULLY_CONNECTED applied to a frozen zero
state) and freezes the zero state, so the graph trains exactly nn.LSTM's / nn.GRU's
parameters, b_hh's gradient summed over every step as PyTorch sums it (until session 20
the copies trained apart, a step-0 bias and an initial state of their own; the reference
here still finds them in the file, by value, to check tico's folding is as described).
The LayerNorm block's graph (MEAN, SUB, MUL, RSQRT, ADD, GELU) has exactly PyTorch's
parameters.
"""
import os

import numpy as np
import pytest

from test_parity import MICROPYTHON  # sys.path set up there  # noqa: F401
from host_tools.formats.circle_io import read_model
from host_tools.prepare.pipeline import prepare
from host_tools.target.runner import run
from host_tools.files.wof import read_wof

torch = pytest.importorskip('torch')
tico = pytest.importorskip('tico')
nn = torch.nn

from bench.zoo import nets  # noqa: E402

pytestmark = pytest.mark.slow   # end to end throughout (tests/README.md)

N, LR = 8, 0.2
TOL = 1e-4                  # relative, per tensor (float32 utrain vs float64 PyTorch)
T, F, H, C = 5, 4, 6, 3     # time steps, features, hidden units, classes


def small(kind):
    torch.manual_seed(11)
    if kind == 'lnblock':
        return nets._randomise_norms(nets.LNBlock(dim=6, hidden=8, classes=C), 3), (1, 4, 6)
    cell = nn.LSTM if kind == 'lstm' else nn.GRU
    m = nets.RNNKWS(cell, feat=F, hidden=H, classes=C).eval()
    with torch.no_grad():       # biases well away from zero and from each other
        for p in (m.rnn.bias_ih_l0, m.rnn.bias_hh_l0):
            p.uniform_(-0.8, 0.8)
    return m, (1, T, F)


def _param(g, name):
    ks = [k for k, t in enumerate(g.tensors) if t.name == name]
    assert len(ks) == 1, (name, ks)
    return ks[0]


class Ref:
    """The exported graph's function in float64 PyTorch, its parameters keyed by the
    circle tensor each one is."""

    def __init__(self, kind, model, g):
        self.kind, self.model = kind, model
        self.p = {}                                  # tensor index -> torch parameter
        if kind == 'lnblock':
            self.net = _double(model)
            for name, prm in self.net.named_parameters():
                self.p[_param(g, 'tico::p_' + name.replace('.', '_'))] = prm
            return
        self.W = {}
        for short, mod, name in (('wih', 'rnn', 'weight_ih_l0'), ('whh', 'rnn', 'weight_hh_l0'),
                                 ('bih', 'rnn', 'bias_ih_l0'), ('bhh', 'rnn', 'bias_hh_l0'),
                                 ('wfc', 'fc', 'weight'), ('bfc', 'fc', 'bias')):
            k = _param(g, f'tico::p_{mod}_{name}')
            self.p[k] = self.W[short] = _leaf(getattr(getattr(model, mod), name))
        bhh = model.rnn.bias_hh_l0.detach().double().numpy()
        # step 0's folded constants, told apart by value: b_hh (or its gate slices), zeros
        self.step0 = {}
        for k, t in enumerate(g.tensors):
            if t.data is None or 'tico::p_' in t.name or t.dtype != 'float32' or t.data.size < 2:
                continue
            v = t.data.astype(np.float64).ravel()
            if not v.any():
                role = 'c0' if kind == 'lstm' else 'h0'
            elif kind == 'lstm' and np.allclose(v, bhh, rtol=1e-6, atol=1e-7):
                role = 'b0'
            else:
                role = next(r for i, r in enumerate(('b0r', 'b0z', 'b0n'))
                            if np.allclose(v, bhh[i * H:(i + 1) * H], rtol=1e-6, atol=1e-7))
            assert role not in self.step0, role
            self.step0[role] = k
        assert sorted(self.step0) == (['b0', 'c0'] if kind == 'lstm' else ['b0n', 'b0r', 'b0z', 'h0'])

    def __call__(self, x):                           # x [B, ...] -> logits [B, C]
        if self.kind == 'lnblock':
            return self.net(x)
        return torch.cat([self._rnn(xi) for xi in x])

    def _rnn(self, x):                               # x [T, F] -> [1, C]
        W = self.W
        # step 0 as nn.LSTM / nn.GRU computes it: b_hh itself (its gate slices), a zero state
        s = {'b0': W['bhh'], 'c0': torch.zeros(H, dtype=torch.float64),
             'h0': torch.zeros(H, dtype=torch.float64)}
        s.update(zip(('b0r', 'b0z', 'b0n'), W['bhh'].split(H)))
        gx = x @ W['wih'].T + W['bih']
        sig = torch.sigmoid
        if self.kind == 'lstm':
            for t in range(T):
                gt = gx[t] + (s['b0'] if t == 0 else h @ W['whh'].T + W['bhh'])
                i, f, gg, o = gt.split(H)
                c = sig(f) * (s['c0'] if t == 0 else c) + sig(i) * torch.tanh(gg)
                h = sig(o) * torch.tanh(c)
        else:
            h = s['h0']
            for t in range(T):
                xr, xz, xn = gx[t].split(H)
                if t == 0:
                    hr, hz, hn = s['b0r'], s['b0z'], s['b0n']
                else:
                    hr, hz, hn = (h @ W['whh'].T + W['bhh']).split(H)
                r, z = sig(xr + hr), sig(xz + hz)
                n = torch.tanh(xn + r * hn)
                h = n + z * (h - n)
        return (h @ W['wfc'].T + W['bfc'])[None]


def _leaf(t):
    return t.detach().clone().double().requires_grad_(True)


def _double(model):
    import copy
    return copy.deepcopy(model).double().eval()


def data(shape, seed=5):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((N,) + tuple(shape[1:])).astype(np.float32),
            rng.integers(0, C, N))


def torch_train(ref, x, y, batch):
    params = list(ref.p.values())
    opt = torch.optim.SGD(params, lr=LR)
    lossf = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x.astype(np.float64)), torch.from_numpy(y)
    for s in range(0, N, batch):
        opt.zero_grad()
        lossf(ref(xt[s:s + batch]), yt[s:s + batch]).backward()
        opt.step()
    return {k: p.detach().numpy() for k, p in ref.p.items()}


def run_case(tmp_path, kind, batch, backend):
    model, shape = small(kind)
    src = os.fspath(tmp_path / 'model.circle')
    tico.convert(model, (torch.zeros(*shape),)).save(src)
    g = read_model(src)
    ops = {op.name for op in g.ops}
    assert ({'SPLIT', 'LOGISTIC', 'TANH', 'MUL'} if kind != 'lnblock'
            else {'MEAN', 'RSQRT', 'GELU'}) <= ops, ops
    x, y = data(shape)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    ref = Ref(kind, model, g)
    with torch.no_grad():        # the reference's function is the PyTorch model's
        xt = torch.from_numpy(x.astype(np.float64))
        want = _double(model)(xt).numpy()
        np.testing.assert_allclose(ref(xt).numpy(), want, rtol=1e-5, atol=1e-6)
    d = tmp_path / 'run'
    s = prepare(src, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
                optimizer='sgd', lr=LR, batch=batch, epochs=1, train='all', shuffle=False)
    gg = read_model(d / s['rewritten']) if s['rewritten'] else g
    code, text = run(os.fspath(d), python=(backend == 'cpython'), stream=False)
    assert code == 0, text
    got = read_wof(d / 'trained.wof', gg)
    w0 = read_wof(d / 'weights.wof', gg)
    names = {k: gg.tensors[k].name for k in got}
    want = torch_train(ref, x, y, batch)
    # every trainable tensor of the graph is a reference parameter, and the reverse
    by_name = {g.tensors[k].name: v for k, v in want.items()}
    assert sorted(names.values()) == sorted(by_name), (sorted(names.values()), sorted(by_name))
    worst, far = 0.0, 0
    for k, name in names.items():
        r = by_name[name].reshape(got[k].shape)
        err = float(np.abs(got[k] - r).max() / np.abs(r).max())
        moved = float(np.abs(w0[k] - r).max() / np.abs(r).max())
        assert err <= TOL, f'{kind}/{backend}/b{batch}: {name} rel err {err:.2e}'
        assert moved >= 10 * err, f'{kind}: {name} moved {moved:.1e}, error {err:.1e}'
        far += moved >= max(3 * TOL, 100 * err)
        worst = max(worst, err)
    assert far >= len(names) - 1, f'{kind}: only {far} of {len(names)} tensors moved clearly'
    print(f'{kind} {backend} batch {batch}: {len(names)} tensors, max rel err {worst:.2e}')
    # and the trained weights export back into the circle model
    from test_parity import export_trained
    from host_tools.formats.circle_io import tensor_data
    out = tensor_data(export_trained(src, d, tmp_path / 'trained.circle'))
    for k, name in names.items():
        k0 = _param(g, name)
        np.testing.assert_array_equal(out[k0].reshape(got[k].shape), got[k])


@pytest.mark.parametrize('batch', [1, 4])
@pytest.mark.parametrize('kind', ['lstm', 'gru', 'lnblock'])
def test_zoo_trains_like_pytorch(tmp_path, kind, batch):
    run_case(tmp_path, kind, batch, 'cpython')


@pytest.mark.skipif(MICROPYTHON is None, reason='unix micropython not found')
@pytest.mark.parametrize('kind', ['lstm', 'gru', 'lnblock'])
def test_zoo_trains_like_pytorch_micropython(tmp_path, kind):
    run_case(tmp_path, kind, 1, 'micropython')
