"""Issue 28 (a model made elsewhere): a Keras 64x64x3 CNN from GitHub, fine-tuned on
samples within +-7, collapsed at the default lr (0.01) to the uniform guess on its first
samples and stayed at chance (0.29 of 4 classes, loss ln 4) where lr 0.001 reached 0.97.
prepare's lr probe (host_tools/prepare/lrprobe.py) trains one short pass at the lr and
lower ones on the host and keeps the largest that is not clearly beaten; an lr given,
or a model that learns at the default, keeps its lr."""
import csv
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
from repo import ROOT  # noqa: E402,F401

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402

H, C, K, D, O = 18, 3, 8, 32, 4


def _cnn(path, seed=0):
    """x [1, 18, 18, 3] -> CONV_2D 3x3x8 VALID RELU -> MAX_POOL 2 -> RESHAPE -> FC 32 RELU
    -> FC 4 -> SOFTMAX, He-initialised for inputs of unit scale."""
    rng = np.random.default_rng(seed)
    P = (H - 2) // 2
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, H, H, C])
    c, p = b.tensor('c', [1, H - 2, H - 2, K]), b.tensor('p', [1, P, P, K])
    r, h = b.tensor('r', [1, P * P * K]), b.tensor('h', [1, D])
    z, y = b.tensor('z', [1, O]), b.tensor('y', [1, O])
    w = lambda name, shape, fan: b.tensor(name, list(shape), data=np.float32(  # noqa: E731
        rng.standard_normal(shape) * (2 / fan) ** 0.5))
    zero = lambda name, n: b.tensor(name, [n], data=np.zeros(n, np.float32))  # noqa: E731
    b.op('CONV_2D', [x, w('wc', (K, 3, 3, C), 27), zero('bc', K)], [c], padding='VALID',
         stride_w=1, stride_h=1, fused_activation_function='RELU')
    b.op('MAX_POOL_2D', [c], [p], padding='VALID', stride_w=2, stride_h=2, filter_width=2,
         filter_height=2, fused_activation_function='NONE')
    b.op('RESHAPE', [p, b.tensor('shape', [2], data=np.array([1, P * P * K], np.int32))], [r])
    b.op('FULLY_CONNECTED', [r, w('w1', (D, P * P * K), P * P * K), zero('b1', D)], [h],
         fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, w('w2', (O, D), 2 * D), zero('b2', O)], [z])
    b.op('SOFTMAX', [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    return b.save(os.fspath(path))


def _data(path, scale, n=160):
    rng = np.random.default_rng(1)
    y = rng.integers(0, O, n)
    proto = rng.standard_normal((O, H, H, C))
    np.savez(path, x=np.float32(scale * (rng.standard_normal((n, H, H, C)) + proto[y])), y=y)
    return os.fspath(path)


def _best(run, column='test_accuracy', pick=max):
    """The run trained (run --python): its train.log's best figure of column."""
    code, text = runner.run(run, python=True, stream=False)
    assert code == 0, text
    with open(os.path.join(run, 'train.log')) as f:
        return pick(float(r[column]) for r in csv.DictReader(f) if r[column])


def _lr(run):
    with open(os.path.join(run, 'train.json')) as f:
        return json.load(f)['lr']


def test_inputs_of_another_scale_get_a_lower_lr_and_learn(tmp_path):
    """Samples at 4x the scale the model was made for: at lr 0.01 the run stays at chance
    (0.33 of 4 classes); the probe keeps 0.001, says why, and the run learns (1.00)."""
    model, data = _cnn(tmp_path / 'm.tflite'), _data(tmp_path / 'd.npz', 4.0)
    said = []
    prepare(model, str(tmp_path / 'run'), data=data, test_split=0.25, log=said.append)
    lr = _lr(str(tmp_path / 'run'))
    assert lr <= 0.0032, said
    assert any(f'lr {lr:g}: at 0.01' in m and '--lr sets another' in m for m in said), said
    assert _best(str(tmp_path / 'run')) >= 0.9
    prepare(model, str(tmp_path / 'given'), data=data, test_split=0.25, lr=0.01,
            log=lambda *a: None)
    assert _lr(str(tmp_path / 'given')) == 0.01            # given: kept (and it fails)
    assert _best(str(tmp_path / 'given')) <= 0.5


def test_a_pass_at_the_uniform_guess_is_a_collapse_not_a_low_loss(tmp_path):
    """Samples at 50x the model's scale: one pass at 0.01, 0.0032, 0.001 and 0.00032 leaves
    the held loss at ln 4 (the uniform guess, below the 11.7 it began at: the probe kept
    0.01 as within 1/0.7 of the least, and the run stays at chance); 0.0001 really
    learns.  A loss at ln C from a start that was not is a collapse: the probe keeps
    0.0001, says so, and the run learns."""
    said = []
    run = str(tmp_path / 'run')
    prepare(_cnn(tmp_path / 'm.tflite'), run, data=_data(tmp_path / 'd.npz', 50.0),
            test_split=0.25, log=said.append)
    assert _lr(run) <= 0.0001 and any('fell to the uniform guess' in m for m in said), said
    assert _best(run) >= 0.9


def _stand_in(monkeypatch, after, before, classes=0, scaled=False):
    """The probe's trainer replaced by a stand-in (mse; classes: scce over that many):
    after(lr) the held loss after a pass at lr, before the held loss before any pass; its
    steps from 0.01 (scaled: from where an mse loss of before puts the first lr)."""
    from host_tools.prepare import lrprobe
    if not scaled:
        monkeypatch.setattr(lrprobe, '_first_lr', lambda lr, start, loss: lr, raising=False)

    class Tr:
        cfg = {'loss': 'scce' if classes else 'mse'}
        ncls = classes

        def __init__(self, lr):
            self.lr = lr

    class Ds:
        def close(self):
            pass
    monkeypatch.setattr(lrprobe, '_trainer', lambda *a: (Tr, Ds()))
    monkeypatch.setattr(lrprobe, '_held_loss',
                        lambda tr, ds, train, held: after(tr.lr) if train else before)


@pytest.mark.parametrize('losses,want', [
    # (an analog-meter CNN from GitHub: its pass diverged at 0.01, and the probe kept 0.01,
    # whose run on_nan's halving left at the uniform guess; 0.0032 learns)
    ({0.01: float('inf'), 0.0032: 2.32, 0.001: 2.53, 0.00032: 3.94, 0.0001: 7.95}, 0.0032),
    # (every lr diverged: down to the floor, 1e-10, as harm; a Keras Conv1D regression on
    # targets within +-1e4 overflowed at 0.01 to 1e-5, where the probe had stopped, and
    # learned at 1e-9 to 1e-10)
    ({float('%.2g' % (0.01 * 10 ** (-k / 2))): float('inf') for k in range(17)}, None),
    ({**{float('%.2g' % (0.01 * 10 ** (-k / 2))): float('inf') for k in range(13)},
      3.2e-09: 9.0, 1e-09: 5.0, 3.2e-10: 6.0, 1e-10: 8.0}, 1e-09)])
def test_a_pass_that_diverges_steps_down(monkeypatch, losses, want):
    """The probe's choice from the held losses a pass leaves (a stand-in trainer): a pass
    that diverged at the lr is harm, down to the first lr that did not; only where every
    lr diverged is the lr kept.  That had been silent, and the run's on_nan then halved
    the lr three times and stopped saying to lower it (a GitHub Keras LSTM with ReLU cells,
    on samples of another scale, overflowed at every lr from 0.01 to 1e-5): it now says
    the probe found none that trains and what to check.  A pass that overflows prints no
    numpy RuntimeWarnings (they had come through to the user's terminal)."""
    import warnings
    from host_tools.prepare import lrprobe
    _stand_in(monkeypatch, lambda lr: (np.exp(np.float32(100)), losses[lr])[1],  # (an overflow)
              13.4)
    said = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        got = lrprobe.probe_lr('run', {'lr': 0.01, 'files': {'train': 'train.ds'}}, 180, set(),
                               said.append, 'm.tflite', 1e6)
    assert got == want, said
    assert len(said) == 1 and 'diverged' in said[0], said
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], caught
    if want is None:
        assert 'found no lr that trains' in said[0] and '0.01 down to 1e-10' in said[0] and \
            'what the model was made for' in said[0] and '--lr' in said[0], said


LN4 = float(np.log(4))


@pytest.mark.parametrize('losses,want', [
    # (Srikar55's int8 KWS CNN from GitHub, 4 classes: its pass fell to exactly ln 4 at
    # 0.01 from 6.04, below every lower lr's loss; the probe kept 0.01 and the run sat at
    # the uniform guess, one class, every epoch after the first)
    ({0.01: LN4, 0.0032: 2.07, 0.001: 1.43, 0.00032: 1.40, 0.0001: 1.7, 3.2e-05: 2.6,
      1e-05: 3.9}, 0.001),
    # (a collapse and a pass that raised the loss: down until one lowers it otherwise)
    ({0.01: LN4, 0.0032: 165.0, 0.001: 30.0, 0.00032: 3.0, 0.0001: 1.2, 3.2e-05: 2.0,
      1e-05: 3.5}, 0.0001),
    # (where nothing else lowered the loss, the collapse stays the least)
    ({0.01: LN4, 0.0032: 9.0, 0.001: 8.0, 0.00032: 7.0, 0.0001: 6.5, 3.2e-05: 6.2,
      1e-05: 6.1, 3.2e-06: 6.05, 1e-06: 6.04}, None)])
def test_a_collapse_to_the_uniform_guess_loses_to_an_lr_that_learns(monkeypatch, losses, want):
    """A classifier's pass whose held loss sits at the uniform guess (ln C: int8 logits
    all equal, no gradient left) from a start that was not is a collapse, even where it
    is the least loss: it loses to a lower lr whose pass lowered the loss otherwise, and
    the probe steps down past a raised loss until one does (a stand-in trainer, scce
    over 4 classes, held loss 6.04 before the pass)."""
    from host_tools.prepare import lrprobe
    _stand_in(monkeypatch, losses.__getitem__, 6.04, classes=4)
    said = []
    got = lrprobe.probe_lr('run', {'lr': 0.01, 'files': {'train': 'train.ds'}}, 400, set(),
                           said.append, 'm.tflite', 5e3, budget=lrprobe.MACS_Q8)
    assert got == want, said
    assert want is None or 'fell to the uniform guess' in said[0], said


@pytest.mark.parametrize('losses,want', [
    # (einstein8612/VLP-pico's int8 position net, targets in mm (0-2800), degraded LEDs:
    # main's probe stopped at the bump at 0.00032 and kept 0.001, whose run never beat
    # its first weights (test MAE 44.5); 3.2e-6 reached 25.6, the best of a 1e-2..1e-7 grid)
    ({0.01: 4.52e11, 0.0032: 4.7e11, 0.001: 9.36e9, 0.00032: 2.57e9, 0.0001: 1.2e6,
      3.2e-05: 8.94e5, 1e-05: 6.61e4, 3.2e-06: 2.45e3, 1e-06: 3.9e3}, 3.2e-06),
    # (every lr raised it, the lowest least: kept, and said; down to 1e-10: a Keras Conv1D
    # regression on targets within +-1e4 learned nothing at 1e-8 (test MAE 3777 at epoch
    # 0), 1119 at 1e-9 and 1055 at 1e-10, where the probe had stopped at 1e-8)
    ({0.01: 9e9, 0.0032: 8e9, 0.001: 7e9, 0.00032: 6e9, 0.0001: 5e9, 3.2e-05: 4e9,
      1e-05: 3e9, 3.2e-06: 2e9, 1e-06: 1e9, 3.2e-07: 9e8, 1e-07: 8e8, 3.2e-08: 7e8,
      1e-08: 6e8, 3.2e-09: 5e8, 1e-09: 4e8, 3.2e-10: 3e8, 1e-10: 2e8}, 1e-10),
    # (a float MLP's int8 version on targets within +-1000: the first lr below harm, 3.2e-7,
    # and one more, 1e-7, clearly lower: the grid's best, test MAE 59.6 to 3.2e-7's 112)
    ({0.01: 4.43e11, 0.0032: 3.85e11, 0.001: 3.85e11, 0.00032: 4.43e11, 0.0001: 3.4e9,
      3.2e-05: 1.04e10, 1e-05: 4.51e8, 3.2e-06: 1.8e7, 1e-06: 4.06e5 / 3.45e5 * 4730,
      3.2e-07: 2.16e5 / 3.45e5 * 4730, 1e-07: 8.52e4 / 3.45e5 * 4730}, 1e-07),
    # (a lower loss at 0.0032, a raised one at 0.01 within 1/CLEARLY of it: not 0.01)
    ({0.01: 5000.0, 0.0032: 3600.0, 0.001: 4000.0, 0.00032: 4500.0, 0.0001: 4700.0,
      3.2e-05: 4730.0, 1e-05: 4730.0}, 0.0032)])
def test_a_pass_that_raised_the_loss_at_every_lr_steps_further_down(monkeypatch, losses, want):
    """Where every lr tried clearly raised the held loss (not in order of lr: a regression
    on targets in the thousands, whose large last-layer weights scale every gradient
    below them), the probe steps down past STEPS (to FAR) until one does not, and never
    keeps an lr whose pass raised the loss where another lowered it (a stand-in trainer,
    held loss 4730 before the pass)."""
    from host_tools.prepare import lrprobe
    _stand_in(monkeypatch, losses.__getitem__, 4730.0)
    said = []
    got = lrprobe.probe_lr('run', {'lr': 0.01, 'files': {'train': 'train.ds'}}, 800, set(),
                           said.append, 'm.tflite', 5e3, budget=lrprobe.MACS_Q8)
    assert got == want, said
    assert ('none lowered it' in said[0]) == (want == 1e-10), said


@pytest.mark.parametrize('optimizer', ['sgd', 'adam'])
def test_targets_in_large_units_say_to_train_with_adam(monkeypatch, optimizer):
    """A GitHub MLPRegressor of bike rentals (counts to 3500, mse 1.9e4 before) diverged at
    every SGD lr down to 3.2e-6 and the probe kept 1e-08, saying 'as a model made for inputs
    of another scale can' (its inputs were standardised): the run kept its first weights.
    The targets' units are what SGD's steps grow with; adam's do not (test MAE 174 -> 111
    at 0.00032, where SGD at 1e-07 reached 161): the probe says so, for SGD only."""
    from host_tools.prepare import lrprobe
    inf = float('inf')
    losses = {0.01: inf, 0.0032: inf, 0.001: inf, 0.00032: inf, 0.0001: inf, 3.2e-05: 6.6e12,
              1e-05: 5.3e6, 3.2e-06: inf, 1e-06: 5.2e5, 3.2e-07: 2.1e5, 1e-07: 3.5e4,
              3.2e-08: 3.2e4, 1e-08: 2.5e4, 3.2e-09: 2.2e4, 1e-09: 2.0e4, 3.2e-10: 1.95e4,
              1e-10: 1.93e4}
    _stand_in(monkeypatch, losses.__getitem__, 1.91e4)
    said = []
    cfg = {'lr': 0.01, 'files': {'train': 'train.ds'}, 'loss': 'mse', 'optimizer': optimizer}
    assert lrprobe.probe_lr('run', cfg, 800, set(), said.append, 'm.onnx', 5e3,
                            budget=lrprobe.MACS_Q8) <= 1e-08    # (none lowered it)
    assert ('--optimizer adam' in said[0]) == (optimizer == 'sgd'), said
    assert ('inputs of another scale' in said[0]) == (optimizer == 'adam'), said


@pytest.mark.parametrize('before,losses,want', [
    # (a Keras Conv1D regression made for targets within +-100: from 0.01 the probe took
    # 3.2e-7, test MAE about 14 from 23.5, where 1e-5 reached 9.2; its trace from 1e-5)
    (838.0, {1e-05: 700.0, 3.2e-05: 1.1e3, 3.2e-06: 820.0, 1e-06: 830.0, 3.2e-07: 835.0,
             1e-07: 837.0, 3.2e-08: 838.0, 1e-08: 838.0}, 1e-05),
    # (the same made for +-1e4: every lr from 0.01 to 1e-5 diverged and the probe kept
    # 0.01; the grid's best 1e-10, test MAE 1055 from 3777; the first lr here 3.2e-10)
    (3.5e7, {3.2e-10: 2.0e7, 1e-09: 1.6e7, 1e-10: 2.5e7, 3.2e-11: 3.0e7, 1e-11: 3.3e7,
             3.2e-12: 3.4e7, 1e-12: 3.45e7, 3.2e-13: 3.5e7}, 3.2e-10),
    # (targets of unit scale: from 0.01, as before)
    (0.9, {0.01: 0.5, 0.032: 0.45, 0.0032: 0.6, 0.001: 0.8, 0.00032: 0.88, 0.0001: 0.9,
           3.2e-05: 0.9, 1e-05: 0.9}, None)])
def test_an_mse_loss_far_from_unit_scale_starts_at_its_own_lr(monkeypatch, before, losses,
                                                              want):
    """An mse loss whose held loss before any pass is above 1 (targets far from unit
    scale: their error and the last layer's weights each scale the gradients below) has
    its first pass at lr / that loss, on the probe's steps, and steps from there (a
    stand-in trainer)."""
    from host_tools.prepare import lrprobe
    _stand_in(monkeypatch, losses.__getitem__, before, scaled=True)
    said = []
    got = lrprobe.probe_lr('run', {'lr': 0.01, 'loss': 'mse', 'files': {'train': 'train.ds'}},
                           400, set(), said.append, 'm.tflite', 5e3, budget=lrprobe.MACS_Q8)
    assert got == want, said
    assert want is None or f'the first lr 0.01 / {before:.3g}' in said[0], said


def test_inputs_at_the_models_scale_keep_the_default(tmp_path):
    said = []
    prepare(_cnn(tmp_path / 'm.tflite'), str(tmp_path / 'run'),
            data=_data(tmp_path / 'd.npz', 1.0), test_split=0.25, log=said.append)
    assert _lr(str(tmp_path / 'run')) == 0.01 and not any(': lr ' in m for m in said), said


def test_an_lr_that_learns_is_tried_one_step_above(tmp_path):
    """Where the pass at the lr clearly lowered the held loss, the probe tries one step
    above it and keeps it where that pass left the loss clearly lower still (under
    ABOVE x): it had never gone up from an lr that learned (a Keras Conv1D regression on
    targets within +-0.1: test MAE 0.032 at 0.01, 0.026 at 0.1).  Samples at 0.3 of the
    model's scale: 0.032 (the run's test loss about 4x lower than at 0.01); at its scale
    0.01 stays (test_inputs_at_the_models_scale_keep_the_default: there 0.032 ends
    10x higher)."""
    model, data = _cnn(tmp_path / 'm.tflite'), _data(tmp_path / 'd.npz', 0.3)
    said = []
    run = str(tmp_path / 'run')
    prepare(model, run, data=data, test_split=0.25, log=said.append)
    assert _lr(run) == 0.032, said
    assert any('at 0.01 one pass of 64 samples lowered the loss, and one step above it '
               'clearly more' in m for m in said), said
    base = str(tmp_path / 'base')
    prepare(model, base, data=data, test_split=0.25, lr=0.01, log=lambda *a: None)
    assert _best(run, 'test_loss', min) < 0.5 * _best(base, 'test_loss', min)


def test_an_int8_run_is_probed_too(tmp_path):
    """The same model and samples trained as int8 (--int8: calibrated on them): at lr 0.01
    the int8 run stayed at 0.15; the probe runs the int8 trainer (utrain.q8train) and
    keeps 0.001 (0.97)."""
    said = []
    run = str(tmp_path / 'run')
    prepare(_cnn(tmp_path / 'm.tflite'), run, data=_data(tmp_path / 'd.npz', 4.0),
            test_split=0.25, int8=True, epochs=3, log=said.append)
    assert os.path.exists(os.path.join(run, 'q8.json'))
    assert _lr(run) <= 0.0032 and any(': lr ' in m for m in said), said
    assert _best(run) >= 0.9


def test_a_mean_over_many_outputs_gets_a_higher_lr(tmp_path):
    """bce over 12 sigmoids (a mean: each moves 1/12 as fast) barely moved at 0.01: the
    probe goes up while the held loss's drop grows, and the run learns."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x, z, p = b.tensor('x', [1, 5]), b.tensor('z', [1, 12]), b.tensor('p', [1, 12])
    w = rng.standard_normal((12, 5)).astype(np.float32)
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [12, 5], data=w),
                             b.tensor('b', [12], data=np.zeros(12, np.float32))], [z])
    b.op('LOGISTIC', [z], [p])
    b.inputs(x)
    b.outputs(p)
    model = b.save(str(tmp_path / 's.tflite'))
    xs = rng.standard_normal((96, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=(xs @ rng.standard_normal((5, 12)) > 0).astype(np.float32))
    said = []
    run = str(tmp_path / 'run')
    prepare(model, run, data=str(tmp_path / 'd.npz'), test_split=0.25, log=said.append)
    assert _lr(run) >= 0.1 and any('barely moved' in m for m in said), said
    code, text = runner.run(run, python=True, stream=False)
    losses = [float(ln.split('test_loss ')[1].split()[0]) for ln in text.splitlines()
              if ln.startswith('epoch ')]
    assert code == 0 and losses[-1] < 0.5 * losses[0], text


def test_an_int8_prefix_cache_run_is_probed_on_its_trained_part(tmp_path):
    """--cache on an int8 run: the board trains the layers above a frozen prefix on the
    prefix's outputs (q8t.json, utrain.q8prefix); the probe computes those outputs for
    its samples (a temporary copy, nothing left in the run folder) and trains the same
    part: at 0.01 one pass took the held loss from 5.5 to 32 (the run: 0.2 of 4
    classes), 0.0032 to 1.3."""
    said = []
    run = str(tmp_path / 'run')
    prepare(_cnn(tmp_path / 'm.tflite'), run, data=_data(tmp_path / 'd.npz', 4.0, 54),
            test_split=0.25, int8=True, cache=True, train='last:3', log=said.append)
    with open(os.path.join(run, 'train.json')) as f:
        assert json.load(f)['files']['model'] == 'q8t.json'
    assert not [f for f in os.listdir(run) if 'pfx' in f]
    assert _lr(run) <= 0.0032 and any(': lr ' in m and 'one pass of 24 samples' in m
                                      for m in said), said


@pytest.mark.parametrize('n, scale, lowered', [(16, 4.0, True), (16, 1.0, False)])
def test_a_few_samples_judge_one_pass_on_themselves(tmp_path, n, scale, lowered):
    """12 training samples (8-23: none to hold out): one pass over all of them, judged on
    their own loss after it, and only down; samples at the model's scale keep 0.01."""
    said = []
    run = str(tmp_path / 'run')
    prepare(_cnn(tmp_path / 'm.tflite'), run, data=_data(tmp_path / 'd.npz', scale, n),
            test_split=0.25, cache=True, train='last:3', log=said.append)
    assert not [f for f in os.listdir(run) if 'pfx' in f]      # (the probe's cache: gone)
    if lowered:
        assert _lr(run) <= 0.0032, said
        assert any('one pass of 12 samples' in m and 'none held out' in m for m in said), said
    else:
        assert _lr(run) == 0.01 and not any(': lr ' in m for m in said), said


def test_too_few_samples_or_too_costly_a_pass_say_so(tmp_path, monkeypatch):
    """6 training samples: no probe, and prepare says so and which lr the run takes.  A
    model whose pass costs more than the probe may take (here the budget cut to about
    100 training steps of this model, 160 K multiply-adds each) is probed on fewer
    samples (judged on 8: 24 where a held sample was charged a training step, more since
    it is charged its forward pass alone), and where even 8 cost too much, prepare says
    so."""
    from host_tools.prepare import lrprobe
    model, said = _cnn(tmp_path / 'm.tflite'), []
    prepare(model, str(tmp_path / 'few'), data=_data(tmp_path / 'few.npz', 4.0, 8),
            test_split=0.25, log=said.append)
    assert _lr(str(tmp_path / 'few')) == 0.01
    assert any('lr probe did not run (6 training samples, it needs 8)' in m
               and 'lr 0.01' in m for m in said), said
    data = _data(tmp_path / 'd.npz', 4.0)
    for macs, probed in ((16e6, True), (2.4e6, False)):
        monkeypatch.setattr(lrprobe, 'MACS', macs)
        said, run = [], str(tmp_path / f'big{macs:g}')
        prepare(model, run, data=data, test_split=0.25, log=said.append)
        if probed:
            import re
            n = [int(x) for m in said for x in re.findall(r'one pass of (\d+) samples', m)]
            assert _lr(run) <= 0.0032 and n and 24 < n[0] < 64, said
        else:
            assert _lr(run) == 0.01 and any('lr probe did not run (one pass of 8 samples'
                                            in m for m in said), said


def test_an_int8_probe_has_its_own_budget():
    """The int8 trainer (utrain.q8train under CPython) costs the host 9-16 ns a
    multiply-add on DS-CNN and MobileNet tables: a 224x224 int8 MobileNet's probe at the
    float budget took 220 s of a 307 s prepare.  A 30 M
    multiply-add step (an int8 MobileNetV2 0.35 at 96x96, trained whole) on 100 samples:
    the float probe takes its full pass, the int8 one fewer samples within MACS_Q8; a
    58 M one on 22 samples (too few to hold out) with its frozen prefix cached still
    probes, on fewer samples, and without the cache says why it cannot."""
    from host_tools.prepare import lrprobe as L
    assert L._plan(100, 30e6, 0) == (64, 32, False, L.STEPS)
    p, h, own, steps = L._plan(100, 30e6, 0, L.MACS_Q8)
    assert p < 64 and h <= L.LEAST and not own and steps >= 1
    assert (steps + 1) * (p + h) * 30e6 <= L.MACS_Q8
    p, h, own, steps = L._plan(22, 257e3, 58e6, L.MACS_Q8)
    assert L.LEAST <= p < 22 and own and steps >= 2
    assert (steps + 1) * 2 * p * 257e3 + p * 58e6 <= L.MACS_Q8
    assert 'it takes at most 1.2 G' in L._plan(22, 58e6, 0, L.MACS_Q8)


def _regression(tmp_path, scale, n=400, F=4, Hd=32):
    """x [1, 4] -> FC 32 RELU -> FC 1, trained on teacher A's targets at unit scale (full-
    batch Adam, numpy), its output layer then scaled to targets within +-scale (as a model
    made for those units), its hidden layer 4x smaller and the output 4x larger (the same
    function: hidden outputs of about unit square sum, as a Keras net's); the samples
    teacher B's (half A), n of them."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2 * n, F)).astype(np.float32)
    a = rng.standard_normal(F) / np.sqrt(F) * 1.5
    b = 0.5 * a + 0.5 * rng.standard_normal(F) / np.sqrt(F) * 1.5
    ps = [rng.standard_normal((Hd, F)) * np.sqrt(2 / F), np.zeros(Hd),
          rng.standard_normal((1, Hd)) * np.sqrt(1 / Hd), np.zeros(1)]
    m1, m2 = [np.zeros_like(q) for q in ps], [np.zeros_like(q) for q in ps]
    t = np.tanh(x[:n] @ a)[:, None]
    for i in range(1, 301):
        W1, b1, W2, b2 = ps
        z = x[:n] @ W1.T + b1
        h = np.maximum(z, 0)
        e = (h @ W2.T + b2 - t) * 2 / n
        gh = (e @ W2) * (z > 0)
        for q, g, u, v in zip(ps, [gh.T @ x[:n], gh.sum(0), e.T @ h, e.sum(0)], m1, m2):
            u *= 0.9
            u += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            q -= 0.01 * (u / (1 - 0.9 ** i)) / (np.sqrt(v / (1 - 0.999 ** i)) + 1e-7)
    W1, b1, W2, b2 = [np.float32(q) for q in ps]
    cb = CircleBuilder(identifier=b'TFL3')
    xi, hh, y = cb.tensor('x', [1, F]), cb.tensor('h', [1, Hd]), cb.tensor('y', [1, 1])
    cb.op('FULLY_CONNECTED', [xi, cb.tensor('w1', [Hd, F], data=W1 / 4),
                              cb.tensor('b1', [Hd], data=b1 / 4)], [hh],
          fused_activation_function='RELU')
    cb.op('FULLY_CONNECTED', [hh, cb.tensor('w2', [1, Hd], data=W2 * 4 * scale),
                              cb.tensor('b2', [1], data=b2 * scale)], [y])
    cb.inputs(xi)
    cb.outputs(y)
    np.savez(tmp_path / 'd.npz', x=x[n:],
             y=np.float32(scale * np.tanh(x[n:] @ b)).reshape(-1, 1))
    return cb.save(os.fspath(tmp_path / 'r.tflite')), os.fspath(tmp_path / 'd.npz')


@pytest.mark.parametrize('scale,lo,hi', [(0.1, 0.032, 0.32), (100.0, 3.2e-06, 1e-04)])
def test_a_regression_far_from_unit_scale_gets_an_lr_near_the_grids_best(tmp_path, scale,
                                                                         lo, hi):
    """The probe on a small regression whose targets are within +-0.1 or +-100 (320
    training samples, the run 5 epochs of SGD).  A fixed-lr grid (host, run --python, the
    best epoch's test MAE): +-0.1: 0.1 -> 0.0088, 0.032 -> 0.0107, 0.01 -> 0.0121, 0.32 ->
    0.0121, 1 -> 0.0155; +-100: 3.2e-5 -> 3.83, 1e-5 -> 7.47, 3.2e-6 -> 5.90, 1e-6 ->
    7.66, 3.2e-7 -> 7.95, 1e-4 -> 27.5 (it diverged, then halved).  main took 0.032 and
    1e-6: an mse loss below 1 started at the lr (the targets' small scale slows the
    layers below the last), and 64-sample passes (SGD's first steps at 3.2e-6 raised the
    held loss 3.6x).  Now lr / the held loss before any pass (at most 100x), and as long
    a pass as the samples and budget take (256): 0.1 and 3.2e-6 (the grid's second; its
    best, 3.2e-5, diverges in a pass of 256)."""
    model, data = _regression(tmp_path, scale)
    said = []
    prepare(model, str(tmp_path / 'run'), data=data, test_split=0.2, epochs=5,
            log=said.append)
    assert lo <= _lr(str(tmp_path / 'run')) <= hi, said
    assert any('one pass of 256 samples' in m for m in said), said


def test_a_cheap_pass_is_long():
    """A pass of 64 samples judged on 32 did not tell the lrs apart that five epochs did
    (a Keras Conv1D regression on targets within +-100: its held loss rose at 1e-5, 957
    from 838, and the probe took 3.2e-7, test MAE 14.1 where 1e-5 reached 9.2; a pass
    of 256 judged on 64: 231 from 1522 at 1e-5, 707 at 1e-6).  Where the samples and
    the budget take STEPS lrs of it, the pass is 256 samples (128 where 256 do not fit),
    judged on 64 (32 where fewer than 64 would be left); under 160 training samples or a
    costlier step keep 64 and 32."""
    from host_tools.prepare import lrprobe as L
    assert L._plan(320, 5e3, 0) == (256, 64, False, L.STEPS)
    assert L._plan(200, 5e3, 0) == (168, 32, False, L.STEPS)    # (all but 32)
    assert L._plan(150, 5e3, 0) == (64, 32, False, L.STEPS)
    assert L._plan(2000, 15e6, 0) == (128, 64, False, L.STEPS)  # (256: 4 lrs within MACS)
    assert L._plan(2000, 30e6, 0) == (64, 32, False, L.STEPS)
    p, h, own, steps = L._plan(320, 30e6, 0, L.MACS_Q8)  # (int8: its own budget, as before)
    assert p < 64 and h <= L.LEAST


def test_an_mse_loss_below_unit_scale_starts_above_the_lr(monkeypatch):
    """An mse loss whose held loss before any pass is below 1 starts at lr / that loss too
    (at most UP steps, 100x, above), and steps down from harm: a Keras Conv1D regression
    on targets within +-0.1 (held loss 0.00155) kept 0.01 from main's probe, whose step
    above (0.032) never left the loss below 0.7x 0.01's (test MAE 0.0323; the grid:
    0.032 -> 0.0301, 0.1 -> 0.0263).  Its held losses after a 256-sample pass (a
    stand-in trainer): 0.032 kept, said with the first lr's reason."""
    from host_tools.prepare import lrprobe
    losses = {1.0: float('inf'), 0.32: 0.0022, 0.1: 0.0033, 0.032: 0.001154,
              0.01: 0.001161, 0.0032: 0.001221, 0.001: 0.001326, 0.00032: 0.001438,
              0.0001: 0.001507, 3.2e-05: 0.001534, 1e-05: 0.001544}
    _stand_in(monkeypatch, losses.__getitem__, 0.00155, scaled=True)
    said = []
    got = lrprobe.probe_lr('run', {'lr': 0.01, 'loss': 'mse', 'files': {'train': 'train.ds'}},
                           320, set(), said.append, 'm.tflite', 5e3)
    assert got == 0.032, said
    assert 'at 1 (mse from a held loss of 0.00155' in said[0], said


def test_a_starved_probe_charges_its_held_samples_their_forward_pass_alone(tmp_path,
                                                                          monkeypatch):
    """Issue 28 (session 30): the held samples that judge a probe pass run forward only
    (the held loss), but the probe's budget charged each a training step, so a probe
    starved by its budget (an int8 run's MACS_Q8 on a large model) took a shorter pass
    than it could.  A budget of 100 training steps: the pass is longer than the one the
    old accounting (a held sample a step) leaves, and the pass and its held samples'
    forward passes still fit the budget for the lrs it tries."""
    from host_tools.prepare import lrprobe as L
    real, seen = L._plan, []

    def plan(n, macs, prefix_macs, budget=None, *a, **k):
        monkeypatch.setattr(L, 'MACS', 100 * macs)      # (a starved float probe)
        out = real(n, macs, prefix_macs, budget, *a, **k)
        seen.append((n, macs, prefix_macs, a, k, out))
        return out
    monkeypatch.setattr(L, '_plan', plan)
    model, data = _regression(tmp_path, 1.0, n=100)
    prepare(model, str(tmp_path / 'run'), data=data, test_split=0.2, epochs=1,
            log=lambda *a: None)
    (n, macs, pre, a, k, out), = seen
    old = real(n, macs, pre)        # (every held sample charged a training step)
    assert not isinstance(out, str) and not isinstance(old, str), (out, old)
    p, h, own, steps = out
    assert not own and p > old[0], (out, old)
    fwd = k.get('fwd', a[0] if a else macs)
    assert fwd < macs and (steps + 1) * (p * macs + h * fwd) + pre * (p + h) <= L.MACS, \
        (out, macs, fwd)
