"""Issue 28 (a newcomer's first run): at prepare's defaults (SGD lr 0.01, one epoch) a
model met a board's batch (4 on a Pico, 8 on an ESP32-S3) with a quarter or an eighth of
the steps at the same size, and a small data set with one pass: five Keras models made
outside the project barely moved (0.33-0.57 test accuracy before and after), a tico CNN
fine-tuned at the Pico's batch fell from 0.92 to 0.74 where batch 1 reached 0.99.  Now
the settings nobody gave follow the run: SGD's lr is 0.01 a sample (times the batch) and
the epochs see about a thousand samples (at most ten)."""
import csv
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
from repo import ROOT  # noqa: E402,F401

from host_tools.files.flatmodel import DEFAULTS  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.prepare.runfolder import MOST_EPOCHS, SEEN, run_defaults  # noqa: E402
from host_tools.target import runner  # noqa: E402

F, O = 10, 3


def _settings(**kw):
    return dict(DEFAULTS, **kw)


@pytest.mark.parametrize('kw,given,n,lr,epochs', [
    (dict(batch=4), set(), 90, 0.04, MOST_EPOCHS),
    (dict(batch=8), set(), 480, 0.08, -(-SEEN // 480)),
    (dict(batch=1), set(), 5000, 0.01, 1),
    (dict(batch=4), {'lr', 'epochs'}, 90, 0.01, 1),             # given: kept
    (dict(batch=4, optimizer='adam'), set(), 90, 0.01, MOST_EPOCHS),   # Adam: per batch already
    (dict(batch=4, reduction='sum'), set(), 90, 0.01, MOST_EPOCHS),    # sum: grows with the batch
    (dict(batch=4), set(), None, 0.04, 1),                      # no data: one epoch
])
def test_run_defaults(kw, given, n, lr, epochs):
    said = []
    s = run_defaults(_settings(**kw), given, n, said.append, 'm.tflite')
    assert np.isclose(s['lr'], lr) and s['epochs'] == epochs, s
    assert bool(said) == (s['lr'] != DEFAULTS['lr'] or s['epochs'] != DEFAULTS['epochs'])


def _mlp(path, seed=0):
    """x [1, F] -> FC 16 RELU -> FC O (logits), at random: the task is new to it."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, F])
    h = b.tensor('h', [1, 16])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [16, F], data=np.float32(
        rng.standard_normal((16, F)) / F ** 0.5)), b.tensor('b1', [16], data=np.zeros(16, np.float32))],
        [h], fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', [O, 16], data=np.float32(
        rng.standard_normal((O, 16)) / 4)), b.tensor('b2', [O], data=np.zeros(O, np.float32))],
        [y], fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    return b.save(os.fspath(path))


def test_a_boards_defaults_learn(tmp_path):
    """--board esp32s3 (batch 8) at the defaults on 120 samples: the run learns the task
    (one epoch at lr 0.01 did not: 11 steps at a sample's size), and prepare said what it
    chose; --lr and --epochs given stay."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((160, F)).astype(np.float32)
    y = x[:, :O].argmax(axis=1)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    model = _mlp(tmp_path / 'm.tflite')
    said = []
    prepare(model, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), test_split=0.25,
            board='esp32s3', int8=False, loss='scce', from_logits=True, log=said.append)
    with open(tmp_path / 'run' / 'train.json') as f:
        cfg = json.load(f)
    assert cfg['batch'] == 8 and np.isclose(cfg['lr'], 0.08) and cfg['epochs'] == 9, cfg
    assert any('lr 0.08' in m and '9 epochs' in m for m in said), said
    code, text = runner.run(str(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    with open(tmp_path / 'run' / 'train.log') as f:
        log = list(csv.DictReader(f))
    before, after = float(log[0]['test_accuracy']), max(float(r['test_accuracy']) for r in log)
    assert after >= before + 0.3 and after >= 0.75, (before, after)
    prepare(model, str(tmp_path / 'given'), data=str(tmp_path / 'd.npz'), test_split=0.25,
            board='esp32s3', int8=False, loss='scce', from_logits=True, lr=0.01, epochs=1,
            log=lambda *a: None)
    with open(tmp_path / 'given' / 'train.json') as f:
        cfg = json.load(f)
    assert cfg['lr'] == 0.01 and cfg['epochs'] == 1


def test_a_run_without_a_test_split_prints_no_test_figures(tmp_path):
    """Without a test split the epoch line said 'test_loss nan test_accuracy nan' and the
    log held nan: now the line has no test figures and the log's cells are empty (as
    epoch 0's training cells), which the plot reads."""
    from host_tools.plot import read_log
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=x[:, :O].argmax(axis=1))
    prepare(_mlp(tmp_path / 'm.tflite'), str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'),
            loss='scce', from_logits=True, epochs=2, log=lambda *a: None)
    code, text = runner.run(str(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    lines = [ln for ln in text.splitlines() if ln.startswith('epoch ')]
    assert len(lines) == 2 and not any('test_' in ln or 'nan' in ln for ln in lines), text
    with open(tmp_path / 'run' / 'train.log') as f:
        rows = list(csv.DictReader(f))
    assert [r['test_loss'] for r in rows] == ['', ''] and all(r['loss'] for r in rows), rows
    got = read_log(str(tmp_path / 'run' / 'train.log'))
    assert len(got['loss']) == 2


def test_board_stores_samples_as_uint8_where_float32_overflows(tmp_path):
    """--board pico without --dtype: 320 RGB 20x20 samples, about 1.5 MB as float32, over
    its 1408 KB file system: prepare stores them as uint8 (exact: 0..255 integers) and
    says so, where it refused ('--dtype uint8 stores the samples in a quarter'); --dtype
    float32 given is refused as before."""
    from kerasgraphs import build_raw_cnn
    from host_tools.graph.passes import PrepareError
    rng = np.random.default_rng(0)
    K, P = 2, 9
    model = build_raw_cnn(tmp_path / 'm.tflite', (
        0.01 * rng.standard_normal((K, 3, 3, 3)), np.zeros(K),
        0.1 * rng.standard_normal((O, K * P * P)), np.zeros(O)), cin=3)
    x = rng.integers(0, 256, (320, 20, 20, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=rng.integers(0, O, 320))
    said = []
    kw = dict(data=str(tmp_path / 'd.npz'), board='pico', int8=False, loss='scce',
              from_logits=True, train='last:1')
    s = prepare(model, str(tmp_path / 'run'), log=said.append, **kw)
    assert s['dtype'] == 'uint8' and any('stored as uint8' in m and 'exact' in m for m in said)
    from host_tools.files.dataset import read_dataset
    xs, _ = read_dataset(str(tmp_path / 'run' / 'train.ds'))
    assert np.array_equal(xs, x.reshape(len(x), -1))      # (exact, in the data's order)
    with pytest.raises(PrepareError, match='--dtype uint8 stores the samples in a quarter'):
        prepare(model, str(tmp_path / 'f32'), dtype='float32', log=lambda *a: None, **kw)


def _one_epoch_run(tmp_path):
    """(run folder, utrain.run) of a one-epoch MLP run with a test split, prepared."""
    import importlib
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=x[:, :O].argmax(axis=1))
    d = tmp_path / 'run'
    prepare(_mlp(tmp_path / 'm.tflite'), str(d), data=str(tmp_path / 'd.npz'),
            test_split=0.25, loss='scce', from_logits=True, epochs=1, log=lambda *a: None)
    sys.path.insert(0, os.path.join(ROOT, 'micro'))
    return d, importlib.import_module('utrain.run')


def test_out_of_memory_in_an_epochs_end_says_after_that_epoch(tmp_path, capsys, monkeypatch):
    """A run out of memory in the save after its one epoch said 'out of memory at epoch 2
    sample 1' (the position after the epoch counter moved on); now 'after epoch 1'."""
    d, run = _one_epoch_run(tmp_path)
    ends = []
    monkeypatch.setattr(run, 'end', ends.append)

    keep = run.save_best

    def full(tr, *a):       # (the save of the weights before training goes through)
        if tr.epoch:
            raise MemoryError('memory allocation failed')
        return keep(tr, *a)
    monkeypatch.setattr(run, 'save_best', full)
    monkeypatch.chdir(d)
    run.start('train.json')
    assert ends and ends[0].startswith('out of memory after epoch 1'), (ends, capsys.readouterr().out)


def test_out_of_memory_while_loading_the_data_says_before_training(tmp_path, capsys, monkeypatch):
    """A run out of memory after its trainer was made but before its first epoch began
    (the datasets, the best weights' record, train.log: the Esp32-Pen int8 CNN failed
    reading train.log's tail) said 'out of memory at epoch 1 sample 1'; now 'before
    training'."""
    d, run = _one_epoch_run(tmp_path)
    import importlib
    data = importlib.import_module('utrain.data')
    ends = []
    monkeypatch.setattr(run, 'end', ends.append)
    keep = data.Dataset

    def full(path, *a):     # (the test set loads; the training set does not)
        if path.endswith('train.ds'):
            raise MemoryError('memory allocation failed')
        return keep(path, *a)
    monkeypatch.setattr(data, 'Dataset', full)
    monkeypatch.chdir(d)
    run.STATE.clear()       # (a run before this one in the process left its state)
    run.start('train.json')
    assert ends and ends[0] == 'out of memory before training', (ends, capsys.readouterr().out)
