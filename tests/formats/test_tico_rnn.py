"""PyTorch recurrent layers and softplus through tico (issue 28), against PyTorch itself.

tico unrolls nn.GRU / nn.LSTM a step at a time and folds the first step, where the
state is 0: W_hh h0 + b_hh becomes constant copies of b_hh (GRU: its three gate slices;
LSTM: all of it) and the zero state a constant (GRU's h0 in h0 - n, LSTM's c0 in f * c0).
prepare ties the copies back to b_hh and freezes the zero state (copies.first_steps), so
one SGD step of utrain is PyTorch's: checked here on the trained model's outputs (the
change of each output over one step, relative to the largest change), with the models and
their tico files made by the tests.  Softplus and Mish come from tico as a
GREATER / SELECT_V2 of beta * x against the threshold (spellings.selects_to_relu), and
softplus with beta != 1 as a second, beta-scaled copy of the layer before it
(copies.scaled_copies).  ONERT cannot run tico's GRU graph: `evaluate` scores it with
utrain's own forward and says so.
"""
import copy
import os

import numpy as np
import pytest

from test_parity import MICROPYTHON  # noqa: F401  (sys.path set up by conftest)
from host_tools.formats.circle_io import read_model
from host_tools.prepare.pipeline import prepare
from host_tools.target.device import module
from host_tools.target.runner import run

torch = pytest.importorskip('torch')
tico = pytest.importorskip('tico')
nn = torch.nn

B, LR = 4, 0.1
TOL = 1e-4          # relative to the largest output change of the step (measured ~1e-6)


class Rnn(nn.Module):
    """nn.GRU / nn.LSTM (batch_first), its outputs averaged over time, Linear(h, 3)."""

    def __init__(self, kind, hidden, layers, bias=True):
        super().__init__()
        self.rnn = getattr(nn, kind)(4, hidden, num_layers=layers, batch_first=True, bias=bias)
        self.fc = nn.Linear(hidden, 3)

    def forward(self, x):
        return self.fc(self.rnn(x)[0].mean(dim=1))


class Act(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc, self.act, self.fc2 = nn.Linear(4, 6), act, nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc(x)))


def _made(tmp_path, model, shape, scale=1.0):
    """model's tico file and B samples (regression targets) in tmp_path."""
    src = os.fspath(tmp_path / 'model.circle')
    tico.convert(copy.deepcopy(model).eval(), (torch.zeros(*shape),)).save(src)
    rng = np.random.default_rng(1)
    x = (scale * rng.standard_normal((B,) + tuple(shape[1:]))).astype(np.float32)
    y = rng.standard_normal((B, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    return src, x, y


def _utrain_outputs(d, x, weights):
    tr = module('trainer').Trainer(os.path.join(d, 'model.flat'), os.path.join(d, weights))
    return np.stack([np.asarray(tr.predict(xi[None].reshape(tr.x_shape)), np.float64).ravel()
                     for xi in x])


def one_step(tmp_path, model, shape, backend='cpython', scale=1.0):
    """(relative error of utrain's output change over one SGD step against PyTorch's,
    PyTorch's largest change, forward error, run folder, PyTorch model after the step)."""
    torch.manual_seed(0)
    src, x, y = _made(tmp_path, model, shape, scale)
    d = os.fspath(tmp_path / 'run')
    prepare(src, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=LR,
            batch=B, epochs=1, train='all', shuffle=False, log=lambda *a, **k: None,
            scale_input=False)      # (SGD on the file's own first-layer weights)
    code, text = run(d, python=(backend == 'cpython'), stream=False)
    assert code == 0, text
    u0, u1 = _utrain_outputs(d, x, 'weights.wof'), _utrain_outputs(d, x, 'trained.wof')
    ref = copy.deepcopy(model).double()
    xt = torch.from_numpy(x.astype(np.float64))
    with torch.no_grad():
        t0 = ref(xt).numpy()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    nn.MSELoss()(ref(xt), torch.from_numpy(y.astype(np.float64))).backward()
    opt.step()
    with torch.no_grad():
        t1 = ref(xt).numpy()
    dt = t1 - t0
    return (float(np.abs((u1 - u0) - dt).max() / np.abs(dt).max()), float(np.abs(dt).max()),
            float(np.abs(u0 - t0).max()), d, ref)


@pytest.mark.parametrize('kind,hidden,layers,bias', [
    ('GRU', 8, 1, True), ('LSTM', 6, 1, True), ('GRU', 6, 1, False),
    # (two layers; no bias: step 0's W_hh h0 is zeros)
    pytest.param('GRU', 5, 2, True, marks=pytest.mark.slow),
    pytest.param('LSTM', 3, 2, True, marks=pytest.mark.slow),
    pytest.param('LSTM', 4, 1, False, marks=pytest.mark.slow)])
def test_rnn_one_sgd_step_is_pytorchs(tmp_path, kind, hidden, layers, bias):
    torch.manual_seed(0)
    model = Rnn(kind, hidden, layers, bias)
    err, moved, fwd, d, ref = one_step(tmp_path, model, (1, 5, 4))
    assert fwd < 1e-5
    assert moved > 1e-2
    assert err < TOL, f'{kind} {hidden}x{layers}: one step {err:.2e} off PyTorch\'s'
    g = read_model(os.path.join(d, 'rewritten.circle'))
    names = [t.name for t in g.tensors]
    # b_hh trained as one tensor: no copy of it is left in the graph prepare trains
    assert all(g.tensors[k].data is None or 'utrain_copy' not in g.tensors[k].name
               for op in g.ops for k in op.inputs if k >= 0), names


@pytest.mark.slow
@pytest.mark.skipif(MICROPYTHON is None, reason='unix micropython not found')
def test_gru_one_sgd_step_micropython(tmp_path):
    torch.manual_seed(0)
    err, moved, _, _, _ = one_step(tmp_path, Rnn('GRU', 8, 1), (1, 5, 4), 'micropython')
    assert moved > 1e-2 and err < TOL, err


@pytest.mark.parametrize('act', ['Softplus()', 'Mish()', 'Softplus(beta=3.0)',
                                 'Softplus(beta=0.5)'])
def test_softplus_one_sgd_step_is_pytorchs(tmp_path, act):
    """Inputs of scale 4: the layer's outputs reach past 0 on both sides (softplus's
    curve, not its straight part, carries the gradient)."""
    torch.manual_seed(0)
    err, moved, fwd, _, _ = one_step(tmp_path, Act(eval('nn.' + act)), (1, 4), scale=4.0)
    assert fwd < 1e-5
    assert moved > 1e-2
    assert err < TOL, f'{act}: one step {err:.2e} off PyTorch\'s'


def test_softplus_past_its_threshold_is_the_identity(tmp_path):
    """Inputs of scale 40: much of the layer's output lies past softplus's threshold (20),
    where PyTorch's softplus is x and its gradient 1 (the SELECT_V2's other branch)."""
    torch.manual_seed(0)
    err, moved, fwd, _, _ = one_step(tmp_path, Act(nn.Softplus()), (1, 4), scale=40.0)
    assert fwd < 1e-4 * moved
    assert err < TOL, err


def test_evaluate_scores_tico_gru_with_utrains_forward(tmp_path, capfd):
    """ONERT cannot run tico's GRU graph ('Reshape: 2nd param is not compatible'): evaluate
    scores it with utrain's own forward, names that runtime, and its score is PyTorch's;
    ONERT's own print of its failure is not left on the terminal (it had printed 'Error
    during model prepare : ...' above a score that was fine)."""
    from host_tools.prepare.infer import evaluate
    torch.manual_seed(0)
    model = Rnn('GRU', 12, 1)
    src, x, y = _made(tmp_path, model, (1, 5, 4))
    capfd.readouterr()
    r = evaluate(src, os.fspath(tmp_path / 'd.npz'), metric='mae')
    assert r['runtime'].startswith("utrain's own forward"), r['runtime']
    assert 'rror' not in capfd.readouterr().err
    with torch.no_grad():
        t = model.double()(torch.from_numpy(x.astype(np.float64))).numpy()
    assert abs(r['mae'] - float(np.mean(np.abs(t - y)))) < 1e-6
    assert abs(r['loss'] - float(np.mean((t - y) ** 2))) < 1e-6


def test_utrains_forward_takes_samples_in_the_files_layout(tmp_path):
    """evaluate's last resort takes the samples as the file's input has them (a tico CNN:
    NCHW) and lays them out as prepare's graph takes them (NHWC)."""
    from host_tools.prepare.infer import utrain_predictor
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                      nn.Linear(4 * 5 * 6, 3)).eval()
    src = os.fspath(tmp_path / 'cnn.circle')
    tico.convert(m, (torch.zeros(1, 3, 5, 6),)).save(src)
    x = np.random.default_rng(0).standard_normal((3, 3, 5, 6)).astype(np.float32)
    with torch.no_grad():
        want = m(torch.from_numpy(x)).numpy()
    assert np.abs(utrain_predictor(src)(x) - want).max() < 1e-5
