"""The user's path end to end: inspect, prepare (and its errors), run on the simulated
board under unix MicroPython and CPython, export; the digits example's accuracy."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT, set_train  # noqa: E402

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
MP = runner.find_micropython()
needs_mp = pytest.mark.skipif(not MP, reason='no MicroPython binary')


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, '-m', 'host_tools', *args], cwd=cwd,
                          capture_output=True, text=True)


def small_mlp(path, n_in=6, hidden=8, n_out=3, seed=1, act='RELU', batch=1):
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    x = b.tensor('x', [batch, n_in])
    w1 = b.tensor('w1', [hidden, n_in], data=rng.normal(0, 0.5, (hidden, n_in)).astype(np.float32))
    b1 = b.tensor('b1', [hidden], data=np.zeros(hidden, np.float32))
    h = b.tensor('h', [batch, hidden])
    w2 = b.tensor('w2', [n_out, hidden], data=rng.normal(0, 0.5, (n_out, hidden)).astype(np.float32))
    b2 = b.tensor('b2', [n_out], data=np.zeros(n_out, np.float32))
    z = b.tensor('z', [batch, n_out])
    p = b.tensor('p', [batch, n_out])
    b.op('FULLY_CONNECTED', [x, w1, b1], [h], fused_activation_function=act)
    b.op('FULLY_CONNECTED', [h, w2, b2], [z])
    b.op('SOFTMAX', [z], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    b.save(path)
    return path


def blobs(tmp_path, n=40, n_in=6, n_out=3, seed=2):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_out, n)
    centers = rng.normal(0, 2, (n_out, n_in))
    x = (centers[y] + rng.normal(0, 0.5, (n, n_in))).astype(np.float32)
    path = str(tmp_path / 'blobs.npz')
    np.savez(path, x=x, y=y)
    return path


def read_log(path):
    with open(path) as f:
        rows = [line.strip().split(',') for line in f][1:]
    return [[float(v) if v else float('nan') for v in r] for r in rows]


def test_inspect_lists_ops_tensors_and_trainability():
    r = cli('inspect', os.path.join(DIGITS, 'digits_mlp.circle'))
    assert r.returncode == 0, r.stderr
    assert 'FULLY_CONNECTED' in r.stdout and 'trains (weight, bias)' in r.stdout
    assert 'SOFTMAX' in r.stdout and 'passes gradients' in r.stdout
    assert '[32, 64]' in r.stdout and 'parameters (float32 constants): 2410' in r.stdout


def test_prepare_writes_the_board_folder(tmp_path):
    out = tmp_path / 'p'
    r = cli('prepare', small_mlp(str(tmp_path / 'm.circle')), '-o', str(out),
            '--data', blobs(tmp_path), '--test-split', '0.25', '--loss', 'scce',
            '--optimizer', 'adam', '--lr', '0.01', '--batch', '2', '--epochs', '3')
    assert r.returncode == 0, r.stderr
    for name in ('model.flat', 'weights.wof', 'train.json', 'train.ds', 'test.ds'):
        assert (out / name).exists(), name
    cfg = json.loads((out / 'train.json').read_text())
    assert cfg['loss'] == 'scce' and cfg['optimizer'] == 'adam' and cfg['batch'] == 2
    assert cfg['epochs'] == 3 and abs(cfg['lr'] - 0.01) < 1e-9 and cfg['metric'] == 'accuracy'
    assert 'trainable' in r.stdout and '30 train, 10 test' in r.stdout


def test_prepare_takes_defaults_from_circle_training_metadata(tmp_path):
    from host_tools.formats.traininfo import build_traininfo
    path = small_mlp(str(tmp_path / 'm.circle'))
    from host_tools.formats.circle_io import read_model
    b = CircleBuilder()
    # rebuild the same model with metadata
    g = read_model(path)
    idx = {}
    for t in g.tensors:
        idx[t.index] = b.tensor(t.name, t.shape, data=t.data)
    for op in g.ops:
        b.op(op.name, [idx[k] for k in op.inputs], [idx[k] for k in op.outputs], **op.options)
    b.inputs(idx[g.inputs[0]])
    b.outputs(idx[g.outputs[0]])
    b.metadata('CIRCLE_TRAINING', build_traininfo(
        {'optimizer': 'adam', 'lr': 0.002, 'loss': 'cce', 'reduction': 'sum', 'epochs': 7,
         'batch': 5, 'trainable_ops': [1, 2]}))
    b.save(str(tmp_path / 'meta.circle'))
    s = prepare(str(tmp_path / 'meta.circle'), str(tmp_path / 'o'), lr=0.003)
    st = s['settings']
    assert (st['optimizer'], st['loss'], st['reduction'], st['epochs'], st['batch']) == \
        ('adam', 'cce', 'sum', 7, 5)
    assert abs(st['lr'] - 0.003) < 1e-9          # the command line wins
    assert sorted(s['trainable']) == ['b2', 'w2']   # ONERT: ops 1.. train


@pytest.mark.parametrize('case', ['unsupported', 'batch', 'dtype', 'missing', 'garbage',
                                  'data-shape', 'bad-train'])
def test_prepare_errors_name_the_problem(tmp_path, case):
    path = str(tmp_path / 'm.circle')
    args = []
    want = []
    if case == 'unsupported':
        b = CircleBuilder()
        x = b.tensor('x', [1, 4])
        y = b.tensor('y', [1, 4])
        z = b.tensor('z', [1, 4])
        b.op('RELU', [x], [y])
        b.op('SIN', [y], [z])
        b.inputs(x)
        b.outputs(z)
        b.save(path)
        want = ['op 1 is SIN', 'supported: ', 'FULLY_CONNECTED']
    elif case == 'batch':       # (a batch only a batch trains: tests/formats/test_fixed_batch.py)
        b = CircleBuilder()
        x = b.tensor('x', [4, 6])
        f = b.tensor('f', [1, 24])
        y = b.tensor('y', [1, 3])
        b.op('RESHAPE', [x], [f], new_shape=[1, 24])
        b.op('FULLY_CONNECTED', [f, b.tensor('w', [3, 24], data=np.ones((3, 24), np.float32)),
                                 -1], [y])
        b.inputs(x)
        b.outputs(y)
        b.save(path)
        want = ['op 0 (RESHAPE) gives tensor 1', '[1, 24] from [4, 6]', 'batch of 4 fixed in the '
                'file is part of the data', 'export the model with batch 1']
    elif case == 'dtype':
        b = CircleBuilder()
        x = b.tensor('x', [1, 4], dtype='int8')
        y = b.tensor('y', [1, 4], dtype='int8')
        b.op('RELU', [x], [y])
        b.inputs(x)
        b.outputs(y)
        b.save(path)
        want = ['tensor 0', 'int8', 'float32']
    elif case == 'missing':
        path = str(tmp_path / 'nope.circle')
        want = ['nope.circle']
    elif case == 'garbage':
        with open(path, 'wb') as f:
            f.write(b'\x10\x00\x00\x00XXXX' + bytes(100))
        want = ['m.circle', 'XXXX']
    elif case == 'data-shape':
        small_mlp(path)
        bad = str(tmp_path / 'bad.npz')
        np.savez(bad, x=np.zeros((5, 7), np.float32), y=np.zeros(5))
        args = ['--data', bad]
        want = ['bad.npz', '7 values per sample', '6']
    elif case == 'bad-train':
        small_mlp(path)
        args = ['--train', 'first:2']
        want = ['first:2', 'last:N']
    r = cli('prepare', path, '-o', str(tmp_path / 'out'), *args)
    assert r.returncode == 2
    assert 'Traceback' not in r.stderr
    for w in want:
        assert w in r.stderr, (w, r.stderr)


def test_cpython_run_trains_and_exports(tmp_path):
    model = small_mlp(str(tmp_path / 'm.circle'))
    out = str(tmp_path / 'p')
    prepare(model, out, data=blobs(tmp_path), test_split=0.25, loss='scce', optimizer='adam',
            lr=0.05, batch=2, epochs=5)
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0, text
    log = read_log(os.path.join(out, 'train.log'))
    assert len(log) == 6 and log[0][0] == 0
    assert log[-1][3] < 0.5 * log[0][3]            # test loss fell
    assert log[-1][4] >= 0.9                       # separable blobs
    for name in ('trained.wof', 'checkpoint.ckpt'):
        assert os.path.exists(os.path.join(out, name))
    r = cli('export', model, os.path.join(out, 'trained.wof'), '-o', str(tmp_path / 'e.circle'))
    assert r.returncode == 0, r.stderr
    from host_tools.formats.circle_io import tensor_data
    before, after = tensor_data(model), tensor_data(str(tmp_path / 'e.circle'))
    assert set(before) == set(after)
    assert all(not np.array_equal(before[k], after[k]) for k in before)


@needs_mp
def test_micropython_and_cpython_agree(tmp_path):
    model = small_mlp(str(tmp_path / 'm.circle'))
    logs = {}
    for name, py in (('mp', False), ('py', True)):
        out = str(tmp_path / name)
        prepare(model, out, data=blobs(tmp_path), test_split=0.25, loss='cce',
                optimizer='sgd', momentum=0.9, lr=0.05, batch=3, epochs=3, shuffle=True, seed=7)
        code, text = runner.run(out, board='rp2040', python=py, stream=False)
        assert code == 0, text
        logs[name] = np.array(read_log(os.path.join(out, 'train.log')))[:, 1:5]
    np.testing.assert_allclose(logs['mp'][1:], logs['py'][1:], rtol=1e-4)
    assert logs['py'][-1, 2] < logs['py'][0, 2]


def test_resume_from_checkpoint_continues(tmp_path):
    model = small_mlp(str(tmp_path / 'm.circle'))
    full, part = str(tmp_path / 'full'), str(tmp_path / 'part')
    for out, epochs in ((full, 4), (part, 2)):
        prepare(model, out, data=blobs(tmp_path), loss='scce', optimizer='adam', lr=0.02,
                batch=2, epochs=epochs)
        assert runner.run(out, python=True, stream=False)[0] == 0
    set_train(part, epochs=4, run={'resume': True})
    code, text = runner.run(part, python=True, stream=False)
    assert code == 0 and 'resumed from checkpoint.ckpt at epoch 2' in text, text
    a = open(os.path.join(full, 'trained.wof'), 'rb').read()
    b = open(os.path.join(part, 'trained.wof'), 'rb').read()
    assert a == b


@pytest.mark.slow
@needs_mp
def test_digits_example_reaches_90_percent_on_the_simulated_board(tmp_path):
    out = str(tmp_path / 'digits')
    # 2 epochs: 0.939 test accuracy (1 epoch: 0.905)
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'demo', '--out', out,
                        '--epochs', '2'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    log = read_log(os.path.join(out, 'train.log'))
    assert log[0][4] < 0.2                 # untrained: chance level
    assert log[-1][4] >= 0.90, log
    assert 'exported model under ONERT inference: test accuracy' in r.stdout
    hits, n = r.stdout.split('test accuracy ')[-1].split('(')[1].split(')')[0].split('/')
    assert abs(int(hits) / int(n) - log[-1][4]) < 1e-6   # the exported model is the trained one


def _has_ulab():
    if not MP:
        return False
    r = subprocess.run([MP, '-c', 'import ulab'], capture_output=True)
    return r.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _has_ulab(), reason='$MICROPYTHON has no ulab (build one with '
                    'ULAB_MAX_DIMS=2 and float32 to run this)')
def test_real_ulab_runs_the_same_code(tmp_path):
    """With real ulab the same micro/ code picks ulab and trains to CPython's losses."""
    model = small_mlp(str(tmp_path / 'm.circle'))
    logs = {}
    for name, py in (('ulab', False), ('py', True)):
        out = str(tmp_path / name)
        prepare(model, out, data=blobs(tmp_path), test_split=0.25, loss='scce',
                optimizer='adam', lr=0.02, batch=2, epochs=2)
        code, text = runner.run(out, board='esp32', python=py, stream=False)
        assert code == 0, text
        logs[name] = np.array(read_log(os.path.join(out, 'train.log')))[:, 1:5]
    r = subprocess.run([MP, '-c', 'from utrain import xnp; print(xnp.BACKEND, xnp.FSIZE)'],
                       capture_output=True, text=True, env=dict(os.environ, MICROPYPATH=os.path.join(ROOT, 'micro')))
    assert r.stdout.split() == ['ulab', '4'], r.stdout + r.stderr
    np.testing.assert_allclose(logs['ulab'][1:], logs['py'][1:], rtol=1e-4)


def test_a_loss_on_probabilities_over_logits_trains_from_logits(tmp_path):
    # digits_tico_cnn (PyTorch through tico) ends in FULLY_CONNECTED: its outputs are
    # logits.  Read as probabilities, scce's gradient -1/y is 1e20 at the first logit <= 0
    # and Adam went to NaN within 9 samples even at lr 1e-4; prepare says so and trains
    # from logits, as ONERT does for a model without a final SOFTMAX.
    said = []
    out = str(tmp_path / 'p')
    s = prepare(os.path.join(DIGITS, 'digits_tico_cnn.circle'), out,
                data=os.path.join(DIGITS, 'digits.npz'), test_split=0.2, loss='scce',
                optimizer='adam', lr=1e-3, epochs=1, log=said.append)
    assert s['settings']['from_logits'] is True
    assert any('FULLY_CONNECTED' in m and 'logits' in m for m in said), said
    with open(os.path.join(out, 'train.json')) as f:
        assert json.load(f)['from_logits'] is True
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0, text
    log = np.array(read_log(os.path.join(out, 'train.log')))
    assert np.isfinite(log[1:, 1:5]).all()          # row 0: before training
    assert log[-1][4] > log[0][4]                   # test accuracy rose


def test_a_model_ending_in_softmax_keeps_probabilities(tmp_path):
    said = []
    s = prepare(small_mlp(str(tmp_path / 'm.circle')), str(tmp_path / 'p'), loss='scce',
                log=said.append)
    assert s['settings']['from_logits'] is False and not said


def test_float_ops_without_bias_train_without_one(tmp_path):
    """Issue 28: FC, CONV_2D and DEPTHWISE_CONV_2D without a bias tensor (a Keras layer
    with use_bias=False) train on the float path, weights only; prepare says so per op,
    the run learns and the trained file holds the weights alone."""
    from host_tools.formats.circle_io import read_model
    from host_tools.graph.inout import save_graph
    from host_tools.files.wof import read_wof
    g = read_model(os.path.join(DIGITS, 'digits_cnn.circle'))
    weighted = [op for op in g.ops if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED')]
    assert len(weighted) == 3
    for op in weighted:
        op.inputs[2] = -1
    model = str(tmp_path / 'nobias.circle')
    save_graph(g, model)
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=z['x'][:300], y=z['y'][:300])
    said = []
    out = str(tmp_path / 'o')
    prepare(model, out, data=data, loss='scce', optimizer='adam', lr=0.01, epochs=2,
            test_split=0.2, log=said.append)
    notes = [s for s in said if 'have no bias tensor' in s]     # one line for them all
    assert len(notes) == 1, said
    listed = notes[0].split(': ops ')[1].split(' (')[0].split(', ')
    assert listed == [str(op.index) for op in weighted], said
    code, log = runner.run(out, python=True, stream=False)
    assert code == 0, log
    acc = [float(v.split('test_accuracy ')[1].split()[0]) for v in log.splitlines()
           if v.startswith('epoch ')]
    assert acc[-1] > 0.5, log
    w = read_wof(os.path.join(out, 'trained.wof'), read_model(model))
    assert sorted(w) == sorted(op.inputs[1] for op in weighted)


def test_a_bias_rank_on_an_op_without_bias(tmp_path):
    """A bias rank on an op with no bias tensor would train nothing there: --ranks OP:bias
    on it is refused naming the file, the op and what to give instead, and the fit
    advice's biases-only line ranks only the ops that have one (--train none: the others
    stay frozen) and is accepted as written, within the budget."""
    import re
    from host_tools.formats.circle_io import read_model
    from host_tools.graph.passes import PrepareError
    from host_tools.graph.inout import save_graph
    from host_tools.formats.refmodels import small_cnn
    m = small_cnn(str(tmp_path / 'cnn.circle'), size=12, classes=4)     # conv, pool, reshape, fc
    g = read_model(m)
    conv = [op for op in g.ops if op.name == 'CONV_2D'][0]
    fc = [op for op in g.ops if op.name == 'FULLY_CONNECTED'][0]
    conv.inputs[2] = -1
    model = str(tmp_path / 'nobias.circle')
    save_graph(g, model)
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'a'), loss='scce', train='none',
                ranks=f'{conv.index}:bias,{fc.index}:bias')
    msg = str(e.value)
    assert msg.startswith(model) and f'op {conv.index} CONV_2D has no bias' in msg
    assert 'another rank' in msg
    full = prepare(model, str(tmp_path / 'b'), loss='scce', batch=1, optimizer='sgd',
                   stream=True, log=lambda *a: None)['heap']['total']
    only = prepare(model, str(tmp_path / 'c'), loss='scce', batch=1, optimizer='sgd',
                   stream=True, train='none', ranks=f'{fc.index}:bias',
                   log=lambda *a: None)['heap']['total']
    assert only < full
    budget = (only + full) // 2             # the biases fit, the whole net does not
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'd'), loss='scce', batch=1, optimizer='sgd',
                stream=True, budget=budget, log=lambda *a: None)
    advice = [ln for ln in str(e.value).splitlines() if ':bias' in ln]
    assert advice, str(e.value)
    for ln in advice:
        assert f'{conv.index}:bias' not in ln and '--train none' in ln, ln
    ranks = re.search(r'--ranks (\S+)', advice[0]).group(1)
    s = prepare(model, str(tmp_path / 'e'), loss='scce', batch=1, optimizer='sgd',
                stream=True, budget=budget, train='none', ranks=ranks, log=lambda *a: None)
    assert s['heap']['total'] <= budget


def test_an_op_ranked_after_a_range_takes_its_own_rank_and_twice_is_refused():
    """--ranks last:N:RANK then OP:RANK: the op inside the range takes its own rank (later
    wins); one op named twice with two ranks is refused, the same rank twice is not."""
    from host_tools.graph.passes import parse_ranks, RANKS, PrepareError
    assert parse_ranks('last:3:bias,4:1/2', 6) == {3: RANKS['bias'], 4: RANKS['up'], 5: RANKS['bias']}
    assert parse_ranks('2:up,2:up', 6) == {2: RANKS['up']}
    with pytest.raises(PrepareError, match='op 2 is given twice'):
        parse_ranks('2:up,2:low', 6)


def test_train_last_n_short_of_the_last_layer_says_which_n_reaches_it(tmp_path):
    """--train last:1 on a model ending in SOFTMAX selects the SOFTMAX only (ONERT's
    counting): prepare says which last:N reaches the last layer with weights."""
    from host_tools.graph.passes import PrepareError
    m = small_mlp(str(tmp_path / 'm.circle'))         # FC, FC, SOFTMAX
    with pytest.raises(PrepareError, match=r'nothing to train .*last:2 reaches op 1 \(FULLY_CONNECTED\)'):
        prepare(m, str(tmp_path / 'o'), loss='scce', train='last:1')


def test_ranks_without_train_say_what_else_trains_whole(tmp_path):
    """--ranks alone takes --train's default (all) besides the ranked ops: prepare says
    which weighted ops train whole and how to train only the ranked ones, and with
    --train none only the ranked op trains and nothing is said."""
    from host_tools.formats.refmodels import small_cnn
    m = small_cnn(str(tmp_path / 'cnn.circle'), size=12, classes=4)     # conv, pool, reshape, fc
    said = []
    prepare(m, str(tmp_path / 'a'), loss='scce', ranks='3:bias', log=said.append)
    note = [s for s in said if s.startswith('--ranks')]
    assert len(note) == 1 and 'op 0 trains whole' in note[0] and '--train none' in note[0], said
    said = []
    prepare(m, str(tmp_path / 'b'), loss='scce', ranks='3:bias', train='none', log=said.append)
    assert not [s for s in said if s.startswith('--ranks')], said
