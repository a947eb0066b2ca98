"""Session 28's hostile-input round (h64c): what h63b's round left (a checkpoint cut at
its counters, pull between folders of one model, a .q8w cut at a record boundary, plot's
default output, --stream with nothing frozen, "start": "best" of a float model trained as
int8), and the classes its own round found.  Each had been taken without a word, or
ended in a traceback; each now is refused naming the file and what to do, or said."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_pipeline import small_mlp  # noqa: E402
from test_refusals import files, says  # noqa: E402,F401  (a model, samples)
from test_onnx import two_inputs_onnx  # noqa: E402
from test_hostile_round27 import LOAD, q8, trained, int8_run, _board  # noqa: E402,F401

MP = runner.find_micropython()
WHERE = ['python'] + (['micropython'] if MP else [])
MICRO = os.path.join(ROOT, 'micro')


# ------------------------------------------------------------------ a checkpoint cut at its counters
@pytest.mark.parametrize('where', WHERE)
def test_a_checkpoint_cut_at_its_counters_is_refused(trained, tmp_path, where):
    """A utrain checkpoint cut exactly at the end of its counters (no resume block, no
    trailer) read as an onert-micro checkpoint: the run resumed at its epoch, at sample 0,
    with no best record, no lr scale, unsaid.  Its header now says utrain wrote it."""
    d = tmp_path / 'r'
    shutil.copytree(trained[0], d, ignore=shutil.ignore_patterns('lib'))
    b = (d / 'checkpoint.ckpt').read_bytes()
    cut = b[:struct.unpack_from('<I', b, 12)[0] + 8]
    (d / 'checkpoint.ckpt').write_bytes(cut)
    code, log = runner.run(os.fspath(d), python=where == 'python', stream=False)
    assert code == 1 and 'checkpoint.ckpt: cut short' in log, log
    assert 'cannot be resumed from' in runner.end_advice(os.fspath(d), log)
    assert (d / 'checkpoint.ckpt').read_bytes() == cut
    code, err = says(['export', trained[0].parent / 'm.circle', d / 'checkpoint.ckpt', '-o',
                      tmp_path / 'o.circle'])
    assert code == 2 and 'checkpoint.ckpt: cut short' in err and 'copy it again' in err, err


# ------------------------------------------------------------------ side files cut at a record
def _records(b):
    """The byte offsets where each record of a side_save file (tag, then u32 tensor, u32
    bytes, the bytes) starts, and its end."""
    o, out = 4, []
    while o < len(b):
        out.append(o)
        o += 8 + struct.unpack_from('<II', b, o)[1]
    return out + [o]


def _load(d, where):
    """What LOAD prints in run folder d, under CPython or MicroPython (where)."""
    (d / 'load.py').write_text(LOAD)
    argv, env = ([os.sys.executable], dict(os.environ, PYTHONPATH=MICRO)) if where == 'python' \
        else ([MP], dict(os.environ, MICROPYPATH=MICRO))
    r = subprocess.run(argv + ['load.py'], cwd=d, env=env, capture_output=True, text=True,
                       timeout=60)
    return r.stdout + r.stderr


@pytest.mark.parametrize('where', WHERE)
def test_a_q8w_cut_at_a_record_boundary_is_refused_by_host_and_board(int8_run, tmp_path, where):
    """trained.wof.q8w holding whole records for some layers but not the last: the board
    refused it, host `export --quantized` took it, writing the last layer's weights at its
    calibrated scale (not the doubled one it trained at), unsaid.  Both read it with
    utrain.q8kern.side_load now, which requires each layer the run grows."""
    d = tmp_path / 'r'
    shutil.copytree(int8_run, d, ignore=shutil.ignore_patterns('lib'))
    b = (d / 'trained.wof.q8w').read_bytes()
    at = _records(b)
    assert len(at) >= 3, at                 # (two layers' scales, or more)
    (d / 'trained.wof.q8w').write_bytes(b[:at[-2]])
    code, err = says(['export', int8_run.parent / 'm.circle', d / 'trained.wof', '-o',
                      tmp_path / 'o.circle', '--quantized'])
    assert code == 2 and 'trained.wof.q8w: not the weight scales of this model' in err and \
        'cut short' in err, err
    assert not (tmp_path / 'o.circle').exists()
    out = _load(d, where)
    assert 'REFUSED trained.wof.q8w: cut short' in out, out
    (d / 'trained.wof.q8w').write_bytes(b)        # (whole: both take it)
    code, err = says(['export', int8_run.parent / 'm.circle', d / 'trained.wof', '-o',
                      tmp_path / 'o.circle', '--quantized'])
    assert code == 0, err


@pytest.mark.parametrize('where', WHERE)
def test_a_q8a_holding_its_tag_alone_is_refused_by_host_and_board(tmp_path, where):
    """The other int8 side files (.q8a slopes, .q8c TRANSPOSE_CONV weights, .q8e embedding
    tables) cut at a record boundary, down to their tag: the board took each layer missing
    as untrained (its model's values), and export wrote those, both unsaid."""
    from kerasgraphs import build_int8_prelu_l2
    path, fwd, _, _ = build_int8_prelu_l2(tmp_path / 'm.tflite')
    x = np.random.default_rng(9).uniform(-4, 4, (12, 4, 5)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(12) % 3)
    d = tmp_path / 'run'
    prepare(path, os.fspath(d), data=os.fspath(tmp_path / 'd.npz'), loss='scce', lr=0.05,
            epochs=1, train='all', log=lambda *a: None)
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0, log
    b = (d / 'trained.wof.q8a').read_bytes()
    (d / 'trained.wof.q8a').write_bytes(b[:_records(b)[-2]])
    code, err = says(['export', path, d / 'trained.wof', '-o', tmp_path / 'o.tflite',
                      '--quantized'])
    assert code == 2 and 'trained.wof.q8a: not the trained PRELU slopes of this model' in err \
        and 'cut short' in err, err
    out = _load(d, where)
    assert 'REFUSED trained.wof.q8a: cut short' in out, out


# ------------------------------------------------------------------ plot's default, --stream
def test_plot_writes_its_default_beside_the_log(tmp_path, monkeypatch):
    """plot with no -o wrote curves.png into the working folder (one came into the
    repository; a second run's plot there replaced the first's)."""
    pytest.importorskip('matplotlib')
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'train.log').write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'
                                   '1,0.5,0.5,0.4,0.6,10,100\n2,0.4,0.6,0.3,0.7,10,100\n')
    here = tmp_path / 'here'
    here.mkdir()
    monkeypatch.chdir(here)
    code, err = says(['plot', run / 'train.log'])
    assert code == 0, err
    assert (run / 'curves.png').read_bytes()[:4] == b'\x89PNG' and os.listdir(here) == []


def test_stream_with_nothing_frozen_is_said_and_not_planned(files, tmp_path):
    """--stream on a model whose weights all train planned utrain.stream's code, tables
    and slot buffers (4 KB on this MLP) for no weight, and the run loaded them, unsaid."""
    d, model, data = files
    said = []
    s = prepare(model, os.fspath(tmp_path / 'r'), data=data, loss='scce', lr=0.05, epochs=1,
                stream=True, log=said.append)
    plain = prepare(model, os.fspath(tmp_path / 'p'), data=data, loss='scce', lr=0.05,
                    epochs=1, log=lambda *a: None)
    assert any('--stream: every weight of this run trains' in str(m) and 'streaming does '
               'nothing here' in str(m) for m in said), said
    assert s['heap']['total'] == plain['heap']['total'], (s['heap'], plain['heap'])
    assert not json.load(open(tmp_path / 'r' / 'train.json'))['run'].get('stream')


# ------------------------------------------------------------------ pull between folders of one model
def _hashing_board(monkeypatch, flash):
    """mpremote stood in for by a folder playing the board's flash, answering pull's
    listing with the sha256 of each file, as MicroPython's hashlib does."""
    import hashlib
    from host_tools.boards import board

    def fake(port, *args, resume=False, cwd=None, **kw):
        if args[0] == 'exec':
            return f'LS {sorted(os.listdir(flash))!r}\n' + ''.join(
                f'UTH {n} {hashlib.sha256((flash / n).read_bytes()).hexdigest()}\n'
                for n in os.listdir(flash) if (flash / n).is_file())
        for c in ' '.join(args).split(' + '):
            _, src, dst = c.split(' ')
            shutil.copy(os.path.join(flash, src[1:]), os.path.join(cwd, dst))
        return ''
    monkeypatch.setattr(board, 'mpremote', fake)
    return board


def test_pull_refuses_another_folder_of_the_same_model(files, trained, tmp_path, monkeypatch):
    """A board trained for folder A (the same model as B, other samples: tensors of the
    same sizes) pulled into B: A's trained.wof, checkpoint and log replaced B's, exit 0.
    The board's inputs are compared now (their sha256); B's own pull goes through."""
    d, model, data = files
    a = tmp_path / 'a'
    x = np.random.default_rng(5).normal(size=(24, 6))
    np.savez(tmp_path / 'other.npz', x=x, y=np.arange(24) % 3)
    prepare(model, os.fspath(a), data=os.fspath(tmp_path / 'other.npz'), loss='scce',
            optimizer='sgd', lr=0.05, epochs=2, test_split=0.25, log=lambda *a: None)
    code, log = runner.run(os.fspath(a), python=True, stream=False)
    assert code == 0, log
    b = tmp_path / 'b'
    shutil.copytree(trained[0], b, ignore=shutil.ignore_patterns('lib'))
    before = {n: (b / n).read_bytes() for n in os.listdir(b) if (b / n).is_file()}
    board = _hashing_board(monkeypatch, a)
    with pytest.raises(board.BoardError) as e:
        board.pull(os.fspath(b), 'COM3')
    assert "the board's train.ds is not the one in" in str(e.value) and \
        'are as they were: train this folder on the board' in str(e.value), str(e.value)
    assert {n: (b / n).read_bytes() for n in os.listdir(b) if (b / n).is_file()} == before
    board = _hashing_board(monkeypatch, trained[0])
    assert board.pull(os.fspath(b), 'COM3') == ['trained.wof', 'checkpoint.ckpt', 'train.log']


# ------------------------------------------------------------------ "start": "best" of an int8 run
START = '''
import json
from utrain.q8train import Q8Trainer
from utrain.data import Dataset
from utrain.config import read_config
c = json.load(open('train.json'))
c['run']['start'] = 'best'
json.dump(c, open('train.json', 'w'))
files, run, cfg, start, resume, sel = read_config('train.json')
tr = Q8Trainer(files['model'], start, **cfg)
print('START', tr.evaluate(Dataset('test.ds', False)))
tr = Q8Trainer(files['model'], files['weights'], **{
    k: v for k, v in cfg.items() if k != 'base'})
tr.net.load_weights('trained.wof')
print('BEST', tr.evaluate(Dataset('test.ds', False)))
'''


@pytest.fixture(scope='module')
def grown_run(files):
    """A float model trained as int8 with its first layer frozen, on inputs of about 50:
    its weight scales and ranges doubled as it trained (trained.wof.q8w, .q8s)."""
    d, model, _ = files
    x = np.random.default_rng(0).normal(0, 1, (24, 6)) * 50
    np.savez(d / 'big.npz', x=x, y=(x[:, 0] > 0).astype(int) + (x[:, 1] > 0))
    out = d / 'grown'
    prepare(model, os.fspath(out), data=os.fspath(d / 'big.npz'), loss='scce', lr=0.1,
            epochs=3, test_split=0.25, int8=True, train='last:2', log=lambda *a: None)
    code, log = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, log
    assert any((out / 'trained.wof.q8w').read_bytes()[12:]), 'no scale doubled'
    return out


@pytest.mark.parametrize('where', WHERE)
def test_start_best_of_an_int8_run_starts_from_the_best_weights(grown_run, tmp_path, where):
    """"start": "best" built an int8 run's net from trained.wof itself: its frozen layers
    read where trained.wof holds none, its doubled scales (.q8w, .q8s) taken as the
    calibrated ones: the run went on from other weights than the best (test loss 121.5
    where the best scored 136.6).  Now its starting weights, then trained.wof over them
    as load_weights reads it."""
    d = tmp_path / 'r'
    shutil.copytree(grown_run, d, ignore=shutil.ignore_patterns('lib'))
    (d / 'start.py').write_text(START)
    argv, env = ([os.sys.executable], dict(os.environ, PYTHONPATH=MICRO)) if where == 'python' \
        else ([MP], dict(os.environ, MICROPYPATH=MICRO))
    r = subprocess.run(argv + ['start.py'], cwd=d, env=env, capture_output=True, text=True,
                       timeout=60)
    got = {ln.split(' ', 1)[0]: ln.split(' ', 1)[1] for ln in r.stdout.splitlines()
           if ln.startswith(('START', 'BEST'))}
    assert 'START' in got and got['START'] == got['BEST'], r.stdout + r.stderr


# ------------------------------------------------------------------ open ONNX dimensions from .npz data
@pytest.mark.parametrize('case', ['3 channels for 2', 'length 0', 'wrong names', 'x0 x1 swapped',
                                  'x and named arrays', 'one input 3 channels'])
def test_open_onnx_dimensions_from_samples_that_do_not_fit_are_refused(tmp_path, case):
    """Samples that do not fit an .onnx input of a dimension known only at run time: an
    array of the input's rank with another fixed dimension (3 channels where it takes 2)
    had its values laid out again at that count and trained (as [2, 15]), unsaid; a
    length of 0 was refused naming fixed_dims.onnx, prepare's own copy (gone after); arrays
    named for no input, or x0 / x1 swapped, ended on 'dimension 2 known only at run time
    ... set it from the samples', which the user had given; an .npz with x and arrays named
    for the inputs trained on x, the named ones unread (they had set the length)."""
    r = np.random.default_rng(0)
    seq, vec, y = (r.standard_normal((12, 2, 10)), r.standard_normal((12, 3)),
                   r.standard_normal((12, 1)))
    arrays, want = {
        '3 channels for 2': (dict(seq=np.zeros((12, 3, 10)), vec=vec, y=y),
                             "array seq holds samples of [3, 10]; the model's input 'seq' "
                             'takes samples of [2, ?]'),
        'length 0': (dict(seq=np.zeros((12, 2, 0)), vec=vec, y=y),
                     'array seq holds samples of [2, 0]'),
        'wrong names': (dict(a=seq, b=vec, y=y), "no array for the model's input 0 'seq': "
                        'name it seq or x0 (the file has a, b, y)'),
        'x0 x1 swapped': (dict(x0=vec, x1=seq, y=y), 'array x0 holds samples of [3]'),
        'x and named arrays': (dict(x=np.zeros((12, 23)), seq=seq, vec=vec, y=y),
                               'holds x (the inputs\' values joined) and an array named for '
                               'an input (seq)'),
        'one input 3 channels': (dict(x=np.zeros((12, 3, 10)), y=y),
                                 "its samples are [3, 10]; the model's input 'seq' takes "
                                 'samples of [2, ?]')}[case]
    if case.startswith('one input'):
        import onnx
        from onnx import TensorProto as T, helper, numpy_helper
        nodes = [helper.make_node('Conv', ['seq', 'w1'], ['h'], pads=[1, 1], kernel_shape=[3]),
                 helper.make_node('GlobalAveragePool', ['h'], ['p']),
                 helper.make_node('Flatten', ['p'], ['y'])]
        g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info(
            'seq', T.FLOAT, ['n', 2, 'time'])], [helper.make_tensor_value_info('y', T.FLOAT, [
                'n', 1])], [numpy_helper.from_array(np.ones((1, 2, 3), np.float32), 'w1')])
        model = os.fspath(tmp_path / 'one.onnx')
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), model)
    else:
        model = two_inputs_onnx(tmp_path / 'two.onnx')
    np.savez(tmp_path / 'd.npz', **arrays)
    for argv in (['prepare', model, tmp_path / 'd.npz', '-o', tmp_path / 'r', '--loss', 'mse',
                  '--lr', '0.01'], ['evaluate', model, tmp_path / 'd.npz']):
        code, err = says(argv)
        assert code == 2 and f'{tmp_path / "d.npz"}: ' in err and want in err, err
        assert 'fixed_dims.onnx' not in err and not (tmp_path / 'r').exists(), err


def test_a_refusal_of_the_copy_the_samples_set_names_the_model_and_the_data(tmp_path):
    """vec's open width set to 5 by the samples, where the MatMul after takes 3: prepare's
    refusal named fixed_dims.onnx in the run folder, evaluate's a temporary copy, both gone
    after the refusal."""
    model = two_inputs_onnx(tmp_path / 'two.onnx', vec_open=True)
    r = np.random.default_rng(0)
    np.savez(tmp_path / 'd.npz', seq=r.standard_normal((12, 2, 10)),
             vec=r.standard_normal((12, 5)), y=r.standard_normal((12, 1)))
    for argv in (['prepare', model, tmp_path / 'd.npz', '-o', tmp_path / 'r', '--loss', 'mse',
                  '--lr', '0.01'], ['evaluate', model, tmp_path / 'd.npz']):
        code, err = says(argv)
        assert code == 2 and f'{model} with the dimensions the samples of {tmp_path / "d.npz"} ' \
            'set (seq [1, 2, 10], vec [1, 5])' in err and 'does not fit' in err, err
        assert 'fixed_dims.onnx' not in err and 'utrain-dims-' not in err, err


def test_evaluate_of_text_labels_names_the_file(tmp_path):
    """evaluate of a model of several outputs (skl2onnx's MLPClassifier: a label and the
    probabilities) on an .npz whose y holds text: numpy's 'could not convert string to
    float: np.str_('yes')', no file named; prepare said what to give."""
    from test_onnx import _skl_mlp_classifier
    r = np.random.default_rng(0)
    model = os.fspath(tmp_path / 'skl.onnx')
    _skl_mlp_classifier(model, r.standard_normal((4, 5)).astype(np.float32),
                        r.standard_normal(5).astype(np.float32),
                        r.standard_normal((5, 3)).astype(np.float32),
                        r.standard_normal(3).astype(np.float32))
    x = r.standard_normal((12, 4)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.where(x[:, 0] > 0, 'yes', 'no'))
    code, err = says(['evaluate', model, tmp_path / 'd.npz'])
    assert code == 2 and f'{tmp_path / "d.npz"}: array y holds <U3 values; it must hold ' \
        'numbers: give class numbers' in err, err


# ------------------------------------------------------------------ resume after train.json edits
@pytest.mark.parametrize('kind', ['float', 'int8'])
@pytest.mark.parametrize('where', WHERE)
def test_resuming_with_epochs_edited_below_the_checkpoints_says_so(trained, tmp_path, kind,
                                                                    where):
    """"epochs" edited down to the epoch a checkpoint has reached (or below), then resumed:
    the run ended 'ok' having trained nothing, unsaid."""
    from test_hostile_round27 import _edit
    d = tmp_path / 'r'
    shutil.copytree(trained[kind == 'int8'], d, ignore=shutil.ignore_patterns('lib'))
    _edit(d, epochs=1)
    code, log = runner.run(os.fspath(d), python=where == 'python', stream=False)
    assert code == 0 and 'resumed from checkpoint.ckpt at epoch 1, sample 0: nothing to train ' \
        '("epochs" 1)' in log, log


def test_an_int8_runs_loss_edited_is_advised_as_the_float_ones(trained, tmp_path):
    """An int8 run's "loss" edited from scce to mse: the advice said train.ds was damaged
    and to prepare the folder again (the float run's names the loss and sets it back)."""
    from test_hostile_round27 import _edit
    d = tmp_path / 'r'
    shutil.copytree(trained[1], d, ignore=shutil.ignore_patterns('lib'))
    _edit(d, loss='mse')
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    advice = runner.end_advice(os.fspath(d), log)
    assert code == 1 and 'train.json\'s "loss": "mse" takes 3: set "loss" in train.json' in \
        advice and 'damaged' not in advice, advice


@pytest.mark.parametrize('classes', [[1, 2, 3], [3, 7]])
def test_labels_that_are_an_onnx_classifiers_class_labels_are_refused(tmp_path, classes):
    """skl2onnx's MLPClassifier trained on labels 1, 2, 3 (or 3, 7) keeps them as its
    classes (ArgMax, then ArrayFeatureExtractor of them: its label output); utrain trains
    the probabilities, by place.  A y of those labels was refused as 'whole numbers 0 to
    2' (no word of the classes, or of what to give), and a binary head's 3 / 7 trained as
    targets of 3 and 7 for a probability (mse, a warning).  Places train as before."""
    import onnx
    from test_onnx import _skl_mlp_classifier
    r = np.random.default_rng(0)
    model = os.fspath(tmp_path / 'skl.onnx')
    C = len(classes)
    _skl_mlp_classifier(model, r.standard_normal((4, 5)).astype(np.float32),
                        r.standard_normal(5).astype(np.float32),
                        r.standard_normal((5, 1 if C == 2 else C)).astype(np.float32),
                        r.standard_normal(1 if C == 2 else C).astype(np.float32))
    m = onnx.load(model)
    for t in m.graph.initializer:
        if t.name == 'classes':
            t.CopyFrom(onnx.numpy_helper.from_array(np.array(classes, np.int64), 'classes'))
    onnx.save(m, model)
    x = r.standard_normal((12, 4)).astype(np.float32)
    np.savez(tmp_path / 'labels.npz', x=x, y=np.array(classes)[np.arange(12) % C])
    np.savez(tmp_path / 'places.npz', x=x, y=np.arange(12) % C)
    for argv in (['prepare', model, tmp_path / 'labels.npz', '-o', tmp_path / 'r', '--lr',
                  '0.05'], ['evaluate', model, tmp_path / 'labels.npz']):
        code, err = says(argv)
        assert code == 2 and f"labels.npz: its labels are the model's class labels {classes}" \
            in err and f'np.searchsorted({classes}, y)' in err, err
    assert not (tmp_path / 'r').exists()
    code, err = says(['prepare', model, tmp_path / 'places.npz', '-o', tmp_path / 'p', '--lr',
                      '0.05'])
    assert code == 0, err


# ------------------------------------------------------------------ samples whose inputs are all the same
@pytest.mark.parametrize('int8', [False, True])
def test_samples_whose_inputs_are_all_the_same_are_warned(files, tmp_path, int8):
    """x all zeros, or one sample repeated with other labels: the model cannot tell the
    samples apart (it learns the targets' frequencies); prepare, its lr probe and the run
    went on without a word."""
    d, model, _ = files
    for name, x in (('zeros', np.zeros((24, 6))), ('repeated', np.tile(np.arange(6.0), (24, 1))),
                    ('plain', np.random.default_rng(0).normal(size=(24, 6)))):
        np.savez(tmp_path / f'{name}.npz', x=x, y=np.arange(24) % 3)
        said = []
        prepare(model, os.fspath(tmp_path / f'r-{name}'), data=os.fspath(tmp_path / f'{name}.npz'),
                loss='scce', lr=0.05, epochs=1, int8=int8, log=said.append)
        warned = [m for m in map(str, said) if 'has the same inputs' in m]
        assert bool(warned) == (name != 'plain'), said
        if warned:
            assert f'{name}.npz: every one of its 24 samples has the same inputs' in warned[0], warned


# ------------------------------------------------------------------ Ctrl-C while the CLI loads
def test_ctrl_c_while_the_cli_loads_ends_without_a_traceback(monkeypatch, capsys):
    """SIGINT 0.3 s after `python -m host_tools prepare ...` started (numpy's and the
    readers' imports, then the parser) ended in a KeyboardInterrupt traceback; a Ctrl-C
    in a command has ended in 'stopped (Ctrl-C)' and exit 130."""
    import builtins
    from host_tools import cli
    from host_tools.__main__ import run
    real = builtins.__import__

    def ctrl_c(name, globals=None, locals=None, fromlist=(), level=0):
        if name == 'cli' and level == 1:
            raise KeyboardInterrupt
        return real(name, globals, locals, fromlist, level)
    monkeypatch.setattr(builtins, '__import__', ctrl_c)
    assert run() == 130
    monkeypatch.setattr(builtins, '__import__', real)

    def parser():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, 'parser', parser)
    assert cli.main(['inspect', 'x']) == 130
    err = capsys.readouterr().err
    assert err.count('stopped (Ctrl-C) while loading: nothing was done') == 2, err


def test_evaluate_of_an_int8_circle_advises_what_runs(int8_run, tmp_path):
    """export --quantized of a float .circle trained as int8, written as .circle: evaluate
    refused it saying to export 'into the original .tflite' (the original is a .circle);
    the advice is the export that TFLite Micro then runs."""
    model = int8_run.parent / 'm.circle'
    assert says(['export', model, int8_run / 'trained.wof', '-o', tmp_path / 'q.circle',
                 '--quantized'])[0] == 0
    code, err = says(['evaluate', tmp_path / 'q.circle', int8_run / 'train.ds'])
    assert code == 2 and 'export MODEL WEIGHTS -o NAME.tflite --quantized' in err, err
    assert says(['export', model, int8_run / 'trained.wof', '-o', tmp_path / 'q.tflite',
                 '--quantized'])[0] == 0
    code, err = says(['evaluate', tmp_path / 'q.tflite', int8_run / 'train.ds'])
    assert code == 0, err


@pytest.mark.parametrize('extra', [[], ['--float32'], ['--dequantize']])
def test_no_rewrite_on_an_int8_model_says_it_keeps_it_int8(q8, tmp_path, extra):
    """--no-rewrite on an int8 model (with --float32 or --dequantize too): refused as
    'prepare dequantizes int8 tensors that carry scales; this one has none', of an input
    that carries them: --no-rewrite is what kept it int8."""
    d, model, data = q8
    code, err = says(['prepare', model, data, '-o', tmp_path / 'r', '--loss', 'scce', '--lr',
                      '0.05', '--no-rewrite'] + extra)
    assert code == 2 and 'carry scales, as this one does, unless --no-rewrite: leave that out' \
        in err and 'has none' not in err, err


@pytest.mark.parametrize('classes', [3, 2])
def test_output_takes_the_files_name_of_a_zipmap_output(tmp_path, classes):
    """skl2onnx's MLPClassifier names its probabilities output_probability (a ZipMap of
    them), as ONNX Runtime lists it: --output output_probability was refused as none of
    the model's outputs ('probabilities', or a binary head's sigmoid), which utrain trains
    for it."""
    from test_onnx import _skl_mlp_classifier
    r = np.random.default_rng(0)
    model = os.fspath(tmp_path / 'skl.onnx')
    n = 1 if classes == 2 else classes
    _skl_mlp_classifier(model, r.standard_normal((4, 5)).astype(np.float32),
                        r.standard_normal(5).astype(np.float32),
                        r.standard_normal((5, n)).astype(np.float32),
                        r.standard_normal(n).astype(np.float32))
    x = r.standard_normal((12, 4)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(12) % 2)
    code, err = says(['prepare', model, tmp_path / 'd.npz', '-o', tmp_path / 'r', '--lr',
                      '0.05', '--output', 'output_probability'])
    assert code == 0, err
    code, err = says(['evaluate', model, tmp_path / 'd.npz', '--output', 'output_probability'])
    assert code == 0, err
