"""The loss when neither --loss nor the model's CIRCLE_TRAINING metadata names one: the
data decides (pipeline.loss_from_data).  One class number per sample for a model with
several outputs trains with scce, one-hot rows with cce, float and int8 alike, and says
so; 0/1 targets of a model that ends in a sigmoid train with bce; other targets with one
value per output keep the default (mse); a loss the user gives is never replaced.  An
int8 model whose loss nobody named is one int8 training lacks trains dequantized."""
import json
import os

import numpy as np
import pytest

from host_tools.files.dataset import DataError
from host_tools.graph.passes import PrepareError
from host_tools.prepare.pipeline import prepare
from tests.support.kerasgraphs import build_int8_branches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, 'datasets', 'digits', 'digits_mlp.circle')     # 64 in, 10 out


def _npz(path, y, n=12, shape=(64,)):
    rng = np.random.default_rng(1)
    np.savez(path, x=rng.standard_normal((n,) + shape).astype(np.float32), y=y)
    return str(path)


def _run(tmp_path, model, data, **kw):
    said = []
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, log=lambda *m: said.append(' '.join(map(str, m))), **kw)
    with open(os.path.join(out, 'train.json')) as f:
        text = f.read()
    return s, text, said


@pytest.mark.parametrize('labels', ['int', 'float', 'column'])
def test_class_numbers_train_with_scce_and_say_so(tmp_path, labels):
    y = np.random.default_rng(2).integers(0, 10, 12)
    y = {'int': y, 'float': y.astype(np.float32), 'column': y.reshape(-1, 1)}[labels]
    s, text, said = _run(tmp_path, MLP, _npz(tmp_path / 'd.npz', y))
    assert '"loss": "scce"' in text
    assert any(m.startswith('loss: scce') and 'd.npz' in m and '--loss' in m for m in said), said


def test_one_value_per_output_keeps_mse(tmp_path):
    y = np.random.default_rng(2).standard_normal((12, 10)).astype(np.float32)
    s, text, said = _run(tmp_path, MLP, _npz(tmp_path / 'd.npz', y))
    assert '"loss": "mse"' in text
    assert not any(m.startswith('loss:') for m in said)


def test_one_hot_rows_train_with_cce_and_multi_hot_keeps_mse(tmp_path):
    """Issue 28 (a held-out Keras softmax classifier fitted on one-hot targets: prepared
    without --loss it trained them as a regression, mse with an mae metric)."""
    y = np.eye(10, dtype=np.float32)[np.random.default_rng(2).integers(0, 10, 12)]
    s, text, said = _run(tmp_path, MLP, _npz(tmp_path / 'd.npz', y))
    assert '"loss": "cce"' in text and '"metric": "accuracy"' in text
    assert any(m.startswith('loss: cce') and 'one-hot' in m for m in said), said
    y[:, 0] = 1                     # two classes in some rows: not one-hot
    s, text, said = _run(tmp_path, MLP, _npz(tmp_path / 'e.npz', y))
    assert '"loss": "mse"' in text and not any(m.startswith('loss:') for m in said)


def test_a_given_loss_is_kept_and_checked(tmp_path):
    y = np.random.default_rng(2).integers(0, 10, 12)
    with pytest.raises(ValueError, match='values per sample'):
        _run(tmp_path, MLP, _npz(tmp_path / 'd.npz', y), loss='mse')
    s, text, said = _run(tmp_path, MLP, _npz(tmp_path / 'd.npz', y), loss='cce')
    assert '"loss": "cce"' in text and not any(m.startswith('loss:') for m in said)


def test_labels_out_of_range_are_not_classes(tmp_path):
    """Labels beyond the outputs are no class numbers for this model: mse stays, and its
    samples pass says what is wrong with the targets."""
    y = np.arange(12) + 10
    with pytest.raises((ValueError, PrepareError), match='values per sample'):
        _run(tmp_path, MLP, _npz(tmp_path / 'd.npz', y))


@pytest.mark.parametrize('targets', ['classes', 'one-hot'])
def test_an_int8_model_trains_as_int8_without_a_loss_given(tmp_path, targets):
    """int8 training takes scce or cce only: a Keras int8 classifier given labelled samples
    and nothing else had been refused ("int8 training takes --loss scce or cce")."""
    model = str(tmp_path / 'm.tflite')
    build_int8_branches(model)
    from host_tools.formats.circle_io import read_model
    g = read_model(model)
    shape = tuple(g.tensors[g.inputs[0]].shape[1:])
    n_out = int(np.prod(g.tensors[g.outputs[0]].shape))
    y = np.random.default_rng(3).integers(0, n_out, 12)
    loss = 'scce'
    if targets == 'one-hot':
        y, loss = np.eye(n_out, dtype=np.float32)[y], 'cce'
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'd.npz', y, shape=shape))
    assert 'q8.json' in text, text
    assert any(m.startswith(f'loss: {loss} ') for m in said), said


def test_an_image_folder_is_class_numbers(tmp_path):
    """A folder of class sub-folders of images (dataset.load_images: sorted names are the
    classes 0, 1, ...): its targets are class numbers, read from the folder names."""
    from PIL import Image
    rng = np.random.default_rng(4)
    for c in ('cat', 'dog', 'owl'):
        (tmp_path / 'img' / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (8, 8)).astype(np.uint8)).save(
                tmp_path / 'img' / c / f'{i}.png')
    s, text, said = _run(tmp_path, MLP, str(tmp_path / 'img'))
    assert '"loss": "scce"' in text and s['train_samples'] == 9
    assert any(m.startswith('loss: scce') for m in said), said


def _sigmoid_model(path, n_out=1, F=5, rows=0):
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x, z, p = b.tensor('x', [1, F]), b.tensor('z', [1, n_out]), b.tensor('p', [1, n_out])
    w = rng.standard_normal((n_out, F)).astype(np.float32)
    b.op('FULLY_CONNECTED', [x, b.tensor('w', w.shape, data=w),
                             b.tensor('b', [n_out], data=np.zeros(n_out, np.float32))], [z])
    b.op('LOGISTIC', [z], [p])
    if rows:            # [1, rows, n_out / rows]: a sigmoid a cell, as a Keras Reshape after it
        r = b.tensor('r', [1, rows, n_out // rows])
        b.op('RESHAPE', [p, b.tensor('shape', [3], data=np.array([1, rows, n_out // rows],
                                                                 np.int32))], [r])
        p = r
    b.inputs(x)
    b.outputs(p)
    return b.save(str(path))


def test_zero_one_targets_of_sigmoid_rows_train_with_bce(tmp_path):
    """Issue 28 (a Keras file from GitHub ending Dense(216, sigmoid) -> Reshape((18, 12)),
    0/1 targets of shape (N, 18, 12): prepared without --loss it trained mse, where the
    targets of one sigmoid output a sample took bce): bce a cell, and a run learns."""
    from host_tools.target import runner
    model = _sigmoid_model(tmp_path / 's.tflite', 12, rows=3)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((96, 5)).astype(np.float32)
    y = (x @ rng.standard_normal((5, 12)) > 0).astype(np.float32).reshape(96, 3, 4)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    s, text, said = _run(tmp_path, model, str(tmp_path / 'd.npz'), test_split=0.25)
    assert '"loss": "bce"' in text and '"metric": "mae"' in text
    assert any(m.startswith('loss: bce') and '12 sigmoid outputs' in m for m in said), said
    code, out = runner.run(str(tmp_path / 'o'), python=True, stream=False)
    assert code == 0, out
    losses = [float(ln.split('test_loss ')[1].split()[0]) for ln in out.splitlines()
              if ln.startswith('epoch ')]
    assert losses[-1] < 0.8 * losses[0], out


@pytest.mark.parametrize('n_out', [1, 3])
def test_zero_one_targets_of_a_sigmoid_train_with_bce(tmp_path, n_out):
    """Issue 28 (a held-out Keras binary classifier, Dense(1, sigmoid), fitted with
    binary_crossentropy: prepared without --loss it trained as a regression, mse with an
    mae metric): one 0/1 target per sigmoid output (multi-label with 3) is bce with an
    accuracy metric; real-valued targets keep mse."""
    model = _sigmoid_model(tmp_path / 's.tflite', n_out)
    y = np.random.default_rng(2).integers(0, 2, (12, n_out)).astype(np.float32)
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'd.npz', y.reshape(12, -1) if n_out > 1
                                             else y.reshape(-1), shape=(5,)))
    # multi-label: the board's accuracy (the largest output's class) means nothing there
    metric = 'accuracy' if n_out == 1 else 'mae'
    assert '"loss": "bce"' in text and '"metric": "%s"' % metric in text
    assert any(m.startswith('loss: bce') and 'sigmoid' in m for m in said), said
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'e.npz', y * 0.5 + 0.1, shape=(5,)))
    assert '"loss": "mse"' in text
    if n_out > 1:
        with pytest.raises(PrepareError, match='leave --metric out'):
            _run(tmp_path, model, _npz(tmp_path / 'd.npz', y, shape=(5,)), metric='accuracy')


@pytest.mark.parametrize('loss', [None, 'mse', 'bce'])
def test_targets_a_sigmoid_cannot_reach_are_said(tmp_path, loss):
    """Issue 28 (a held-out Keras Dense(1, sigmoid) model given class numbers 0..4:
    prepared, it trained mse towards targets its output can never reach, saying nothing):
    targets outside 0..1 of a model ending in a sigmoid are warned of, saying what to
    give; targets it can reach are not."""
    model = _sigmoid_model(tmp_path / 's.tflite')
    y = np.random.default_rng(2).integers(0, 5, 12).astype(np.float32)
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'd.npz', y, shape=(5,)), loss=loss)
    assert any(m.startswith('warning: ') and 'outputs stay in 0 to 1' in m and '0/1 targets' in m
               for m in said), said
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'd.npz', np.minimum(y, 1), shape=(5,)),
                         loss=loss)
    assert '"loss": "%s"' % (loss or 'bce') in text
    assert not any('outputs stay in 0 to 1' in m for m in said), said


def test_class_losses_on_one_output_say_bce(tmp_path):
    model = _sigmoid_model(tmp_path / 's.tflite')
    y = np.random.default_rng(2).integers(0, 2, 12)
    with pytest.raises(DataError, match='trains with --loss bce'):
        _run(tmp_path, model, _npz(tmp_path / 'd.npz', y, shape=(5,)), loss='scce')


def test_an_int8_regression_trains_as_int8(tmp_path):
    """An int8 model with real-valued targets and no --loss (mse) had been refused ("int8
    training takes --loss scce or cce"), then trained dequantized: it trains as int8 now
    (utrain.q8reg), and so with --loss mse given on the command line."""
    model = str(tmp_path / 'm.tflite')
    build_int8_branches(model)
    from host_tools.formats.circle_io import read_model
    g = read_model(model)
    shape = tuple(g.tensors[g.inputs[0]].shape[1:])
    n_out = int(np.prod(g.tensors[g.outputs[0]].shape))
    y = np.random.default_rng(3).standard_normal((12, n_out)).astype(np.float32)
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'd.npz', y, shape=shape))
    assert 'q8.json' in text and '"loss": "mse"' in text
    assert not any('dequantized' in m for m in said), said
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'd.npz', y, shape=shape), loss='mse')
    assert 'q8.json' in text and not any('dequantized' in m for m in said), said


def _per_step_model(path, T=5, C=3, K=4, softmax=True, packed=False):
    """Keras's Dense(K, activation='softmax') on a sequence [T, C] as the converter writes
    it (FULLY_CONNECTED keeping the steps, SOFTMAX over each step's row), or its logits;
    packed: TimeDistributed(Dense(K, activation='softmax')) as the converter unrolls it
    (each step sliced, its FC and SOFTMAX, PACKed [T, 1, K], RESHAPEd [1, T, K]).
    Returns (path, w, b)."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x, z = b.tensor('x', [1, T, C]), b.tensor('z', [1, T, K])
    w, bias = rng.standard_normal((K, C)).astype(np.float32), rng.standard_normal(K).astype(np.float32)
    if packed:
        wt, bt, rows = b.tensor('w', w.shape, data=w), b.tensor('b', [K], data=bias), []
        for t in range(T):
            xt, zt, pt = (b.tensor(f'{n}{t}', [1, m]) for n, m in (('x', C), ('z', K), ('p', K)))
            b.op('STRIDED_SLICE', [x] + [b.tensor(f'{n}{t}', [3], data=np.int32(v)) for n, v in (
                ('sb', [0, t, 0]), ('se', [1, t + 1, C]), ('ss', [1, 1, 1]))], [xt],
                shrink_axis_mask=2)
            b.op('FULLY_CONNECTED', [xt, wt, bt], [zt])
            b.op('SOFTMAX', [zt], [pt], beta=1.0)
            rows.append(pt)
        pk, p = b.tensor('packed', [T, 1, K]), b.tensor('p', [1, T, K])
        b.op('PACK', rows, [pk], axis=0, values_count=T)
        b.op('RESHAPE', [pk, b.tensor('shape', [3], data=np.int32([1, T, K]))], [p])
        b.inputs(x)
        b.outputs(p)
        return b.save(str(path)), w, bias
    b.op('FULLY_CONNECTED', [x, b.tensor('w', w.shape, data=w), b.tensor('b', [K], data=bias)],
         [z], keep_num_dims=True)
    if softmax:
        p = b.tensor('p', [1, T, K])
        b.op('SOFTMAX', [z], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p if softmax else z)
    return b.save(str(path)), w, bias


def test_a_class_a_step_trains_cce_per_step(tmp_path):
    """Issue 28 (a held-out Keras Conv1D + Dense(4, softmax) on each of 24 steps given a
    class a step, (N, 24): refused "mse wants one target per output"; given one class a
    sample it trained scce over all 96 outputs as one row, saying nothing, and evaluate
    scored the argmax of all 96): a class a step trains cce one-hot a step with metric mae
    (said), one SGD step moves w by -lr x the summed steps' cross-entropy gradient
    (numpy), evaluate counts the steps right and its cross-entropy is the board's loss;
    one class a sample, scce, --metric accuracy and a model ending in logits are refused
    saying what to do."""
    from host_tools.prepare.infer import evaluate
    from host_tools.prepare.pipeline import export
    from host_tools.target import runner
    from host_tools.formats.circle_io import read_model
    T, C, K = 5, 3, 4
    model, w, bias = _per_step_model(tmp_path / 'p.tflite', T, C, K)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, T, C)).astype(np.float32)
    y = rng.integers(0, K, (1, T))
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    out, lr = tmp_path / 'run', 0.1
    said = []
    s = prepare(model, str(out), data=str(tmp_path / 'd.npz'), optimizer='sgd', lr=lr, batch=1,
                epochs=1, log=lambda *m: said.append(' '.join(map(str, m))))
    text = open(out / 'train.json').read()
    assert '"loss": "cce"' in text and '"metric": "mae"' in text
    assert any(m.startswith('loss: cce') and 'a class number a step' in m for m in said), said
    code, log = runner.run(str(out), python=True, stream=False)
    assert code == 0, log
    export(model, str(out / 'trained.wof'), str(tmp_path / 'e.tflite'))
    got = {t.name: t.data for t in read_model(str(tmp_path / 'e.tflite')).tensors if t.data is not None}
    z = x[0].astype(np.float64) @ w.T + bias
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = p - np.eye(K)[y[0]]                    # d(sum of the steps' CE)/dz, row by row
    np.testing.assert_allclose(got['w'], w - lr * dz.T @ x[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got['b'], bias - lr * dz.sum(0), rtol=1e-4, atol=1e-5)
    # evaluate: steps right, the summed cross-entropy; on the numpy forward's numbers
    np.savez(tmp_path / 'm.npz', x=np.repeat(x, 3, 0), y=np.repeat(y, 3, 0))
    r = evaluate(model, str(tmp_path / 'm.npz'))
    assert r['n'] == 3 * T and r['hits'] == 3 * int(np.sum(p.argmax(1) == y[0]))
    assert abs(r['loss'] + np.log(p[np.arange(T), y[0]]).sum()) < 1e-4
    with pytest.raises(DataError, match=r'one class number a sample.*shape \(N, 5\)'):
        _run(tmp_path, model, _npz(tmp_path / 'o.npz', rng.integers(0, K, 12), shape=(T, C)))
    from host_tools.prepare.infer import InferError
    with pytest.raises(InferError, match=r'one class number a sample.*shape \(N, 5\)'):
        evaluate(model, str(tmp_path / 'o.npz'))       # (it scored the argmax of all 20)
    with pytest.raises(DataError, match='train with --loss cce'):
        _run(tmp_path, model, str(tmp_path / 'd.npz'), loss='scce')
    with pytest.raises(PrepareError, match='leave it out'):
        _run(tmp_path, model, str(tmp_path / 'd.npz'), metric='accuracy')
    # one-hot a step (N, T, K) alike; the int8 path (a softmax over all outputs) declines
    oh = np.eye(K, dtype=np.float32)[rng.integers(0, K, (12, T))]
    s, text, said = _run(tmp_path, model, _npz(tmp_path / 'h.npz', oh, shape=(T, C)))
    assert '"loss": "cce"' in text and '"metric": "mae"' in text, said
    from host_tools.prepare.quant import loss_refusal
    assert 'a class a step' in loss_refusal({'loss': 'cce'}, read_model(model))


def test_a_class_a_step_on_packed_softmax_rows_is_no_logits(tmp_path):
    """Keras's TimeDistributed(Dense(K, activation='softmax')) ends the model in PACK and
    RESHAPE of each step's SOFTMAX: the output is probabilities, but prepare took it for
    logits and put a softmax over each row after it (the softmax of probabilities: loss
    10.984 for the true 10.985 on a round-32 sequence labeller, a weaker gradient).  One
    SGD step is numpy's summed per-step cross-entropy gradient of the one softmax."""
    from host_tools.prepare.pipeline import export
    from host_tools.target import runner
    from host_tools.formats.circle_io import read_model
    T, C, K = 5, 3, 4
    model, w, bias = _per_step_model(tmp_path / 'k.tflite', T, C, K, packed=True)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, T, C)).astype(np.float32)
    y = rng.integers(0, K, (1, T))
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    out, lr, said = tmp_path / 'run', 0.1, []
    prepare(model, str(out), data=str(tmp_path / 'd.npz'), optimizer='sgd', lr=lr, batch=1,
            epochs=1, log=lambda *m: said.append(' '.join(map(str, m))))
    assert not any('softmax over each row' in m or 'as logits' in m for m in said), said
    cfg = json.loads(open(out / 'train.json').read())
    assert cfg['loss'] == 'cce' and cfg['from_logits'] is False
    code, log = runner.run(str(out), python=True, stream=False)
    assert code == 0, log
    export(model, str(out / 'trained.wof'), str(tmp_path / 'e.tflite'))
    got = {t.name: t.data for t in read_model(str(tmp_path / 'e.tflite')).tensors
           if t.data is not None}
    z = x[0].astype(np.float64) @ w.T + bias
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = p - np.eye(K)[y[0]]
    np.testing.assert_allclose(got['w'], w - lr * dz.T @ x[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got['b'], bias - lr * dz.sum(0), rtol=1e-4, atol=1e-5)


def test_a_class_a_step_on_rows_of_logits_trains_a_softmax_a_row(tmp_path):
    """Session 13 left it refused ('are logits: a class a step trains with cce on a softmax
    over each row; end the model in one'): a model ending in rows of logits a step (a
    Dense or Conv1d head without its softmax) trains with a SOFTMAX over each row put
    after it for the run (the board's cross-entropy from logits would normalise all T x K
    values as one row), said; one SGD step is numpy's summed per-step cross-entropy
    gradient, and export writes the model as it was (the FC alone, giving logits), which
    evaluate scores as the board did."""
    from host_tools.prepare.infer import evaluate
    from host_tools.prepare.pipeline import export
    from host_tools.target import runner
    from host_tools.formats.circle_io import read_model
    T, C, K = 5, 3, 4
    model, w, bias = _per_step_model(tmp_path / 'l.tflite', T, C, K, softmax=False)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, T, C)).astype(np.float32)
    y = rng.integers(0, K, (1, T))
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    out, lr, said = tmp_path / 'run', 0.1, []
    prepare(model, str(out), data=str(tmp_path / 'd.npz'), optimizer='sgd', lr=lr, batch=1,
            epochs=1, log=lambda *m: said.append(' '.join(map(str, m))))
    assert any('a class a step for 5 rows of 4 logits: trains with a softmax over each row' in m
               for m in said), said
    cfg = json.loads(open(out / 'train.json').read())
    assert cfg['loss'] == 'cce' and cfg['from_logits'] is False
    code, log = runner.run(str(out), python=True, stream=False)
    assert code == 0, log
    export(model, str(out / 'trained.wof'), str(tmp_path / 'e.tflite'))
    h = read_model(str(tmp_path / 'e.tflite'))
    assert [op.name for op in h.ops] == ['FULLY_CONNECTED'] and h.tensors[h.outputs[0]].name == 'z'
    got = {t.name: t.data for t in h.tensors if t.data is not None}
    z = x[0].astype(np.float64) @ w.T + bias
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    dz = p - np.eye(K)[y[0]]
    np.testing.assert_allclose(got['w'], w - lr * dz.T @ x[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got['b'], bias - lr * dz.sum(0), rtol=1e-4, atol=1e-5)
    r = evaluate(model, str(tmp_path / 'd.npz'))
    assert abs(r['loss'] + np.log(p[np.arange(T), y[0]]).sum()) < 1e-4
    with pytest.raises(DataError, match='train with --loss cce'):
        _run(tmp_path, model, str(tmp_path / 'd.npz'), loss='scce')


def test_a_csv_row_holds_as_many_targets_as_follow_the_inputs(tmp_path):
    """Issue 28 (a held-out 2-output Keras regression given its samples as a .csv, x then
    both targets: only the last column was read, refused "y has 1 values per sample, the
    model outputs 2" with nothing a .csv could do): the columns after the model input's
    values are the targets (10 for the digits MLP's 10 outputs: mse; a class a step for
    a softmax row a step: cce); one label column is as before; a .csv short of targets is
    told how a row is laid out."""
    from host_tools.files.dataset import read_dataset
    rng = np.random.default_rng(6)
    x = rng.standard_normal((12, 64))
    for name, y, loss in (('ten', rng.standard_normal((12, 10)), 'mse'),
                          ('one', rng.integers(0, 10, (12, 1)), 'scce')):
        np.savetxt(tmp_path / f'{name}.csv', np.concatenate([x, y], 1), delimiter=',')
        s, text, said = _run(tmp_path, MLP, str(tmp_path / f'{name}.csv'))
        assert f'"loss": "{loss}"' in text, said
        got = read_dataset(str(tmp_path / 'o' / 'train.ds'))[1]
        np.testing.assert_allclose(got, y if loss == 'mse' else y.reshape(-1, 1), rtol=1e-6)
    T, C, K = 5, 3, 4
    model, _, _ = _per_step_model(tmp_path / 'p.tflite', T, C, K)
    ys = rng.integers(0, K, (12, T))
    np.savetxt(tmp_path / 'steps.csv', np.concatenate([rng.standard_normal((12, T * C)), ys], 1),
               delimiter=',')
    s, text, said = _run(tmp_path, model, str(tmp_path / 'steps.csv'))
    assert '"loss": "cce"' in text and '"metric": "mae"' in text, said
    got = read_dataset(str(tmp_path / 'o' / 'train.ds'))[1]
    np.testing.assert_array_equal(got.reshape(12, T, K).argmax(-1), ys)
    np.savetxt(tmp_path / 'short.csv', np.concatenate([x, rng.standard_normal((12, 1))], 1),
               delimiter=',')
    with pytest.raises(DataError, match=r'a .csv row holds the input values, then the targets '
                                        r'\(10 columns'):
        _run(tmp_path, MLP, str(tmp_path / 'short.csv'), loss='mse')


def test_class_numbers_for_rows_of_one_value_are_refused(tmp_path):
    """An output of rows of one value ([1, T, 1], a Keras 1-D autoencoder's) has one
    class a row on the board (its cross-entropy takes the last axis), and prepare had
    taken its T values for T classes: class numbers 0..T-1 were packed, and the run
    failed in losses._onehot with IndexError at any heap (the planner sweep read it as a
    need beyond 1.5x the plan).  Refused, saying what to do; mse trains it."""
    from host_tools.formats.circle_build import CircleBuilder
    T = 6
    b = CircleBuilder(description='utrain test: rows of one value')
    x = b.tensor('x', [1, 4])
    z = b.tensor('z', [1, T])
    w = np.random.default_rng(0).standard_normal((T, 4)).astype(np.float32)
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [T, 4], data=w),
                             b.tensor('b', [T], data=np.zeros(T, np.float32))], [z])
    o = b.tensor('o', [1, T, 1])
    b.op('RESHAPE', [z, b.tensor('s', [3], data=np.array([1, T, 1], np.int32))], [o],
         new_shape=[1, T, 1])
    b.inputs(x)
    b.outputs(o)
    model = b.save(str(tmp_path / 'm.circle'))
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((8, 4)).astype(np.float32)
    np.savez(tmp_path / 'c.npz', x=xs, y=rng.integers(0, T, 8))
    for loss in ('scce', 'cce'):
        with pytest.raises(DataError, match=r'6 rows of one value.*Reshape to \[1, 6\]'):
            prepare(model, str(tmp_path / loss), data=str(tmp_path / 'c.npz'), loss=loss,
                    lr=0.01, log=lambda *m: None)
    np.savez(tmp_path / 'v.npz', x=xs, y=rng.standard_normal((8, T, 1)).astype(np.float32))
    prepare(model, str(tmp_path / 'mse'), data=str(tmp_path / 'v.npz'), loss='mse', lr=0.01,
            log=lambda *m: None)
