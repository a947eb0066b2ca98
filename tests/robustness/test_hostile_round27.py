"""Session 27's hostile-input round (h63b): the classes h62b left, and the ones its own
round found.  Each had been taken without a word (an option an int8 run does not read, a
.ds header whose scale the host and the board read differently, an optimizer edited
between a run and its resume); each now is refused naming the file and what to do, or
said with what happens instead."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.files.dataset import read_dataset, write_dataset, DataError  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_pipeline import small_mlp  # noqa: E402
from test_refusals import files  # noqa: E402,F401  (a model, samples)

MP = runner.find_micropython()
WHERE = ['python'] + (['micropython'] if MP else [])
MICRO = os.path.join(ROOT, 'micro')


@pytest.fixture(scope='module')
def q8(tmp_path_factory):
    """A small int8 model (FC, TANH, FC) and 24 samples for it."""
    from kerasgraphs import build_int8_unary
    d = tmp_path_factory.mktemp('q8')
    model = build_int8_unary(os.fspath(d / 'q.tflite'), 'TANH')[0]
    x = np.random.default_rng(0).normal(0, 1, (24, 6)).astype(np.float32)
    np.savez(d / 'q.npz', x=x, y=(x[:, 0] > 0).astype(np.int64))
    return d, model, os.fspath(d / 'q.npz')


# ------------------------------------------------------------------ options an int8 run does not read
@pytest.mark.parametrize('opt', [dict(int8=False), dict(stream=True), dict(backend='ulab'),
                                 dict(backend='fallback-frozen'), dict(dtype='float32'),
                                 dict(bands=2)])
def test_an_option_an_int8_run_does_not_read_is_said_or_honoured(q8, tmp_path, opt):
    """--float32 on an int8 model, --stream, --backend ulab / -frozen, --dtype float32 and
    --bands (on a model with nothing to band) with an int8 run had been taken without a
    word; --float32 now trains it in float32 (dequantized), the others say what the run
    does instead."""
    d, model, data = q8
    said = []
    s = prepare(model, os.fspath(tmp_path / 'r'), data=data, loss='scce', lr=0.01, epochs=1,
                log=said.append, **opt)
    text = '\n'.join(map(str, said))
    want = {'int8': '--float32: the model is int8, so it trains in float32 dequantized',
            'stream': '--stream: an int8 run always reads its frozen weights from weights.wof',
            'backend': f'--backend {opt.get("backend")}: an int8 run ',
            'dtype': '--dtype float32: an int8 run stores its samples as int8',
            'bands': '--bands 2: the run has no frozen layers that can run in row bands'}[
        next(iter(opt))]
    assert want in text, text
    assert bool(s.get('int8')) == ('int8' not in opt), s.get('int8')
    if opt.get('backend') == 'ulab':
        assert 'ulab or not' in text and 'frozen in' not in text, text


def test_bands_on_a_float_model_with_nothing_to_band_is_said(files, tmp_path):
    d, model, data = files
    said = []
    prepare(model, os.fspath(tmp_path / 'r'), data=data, loss='scce', lr=0.05, epochs=1,
            bands=2, log=said.append)
    assert any('--bands 2: the run has no frozen layers' in str(m) for m in said), said


# ------------------------------------------------------------------ .ds header scales
def _ds(path, dtype, at=None, value=None):
    x = np.random.default_rng(1).normal(0, 1, (5, 3)).astype(np.float32)
    write_dataset(path, x, np.arange(5) % 2, dtype)
    if at is not None:
        b = bytearray(open(path, 'rb').read())
        b[at:at + 4] = struct.pack('<f', value)
        open(path, 'wb').write(bytes(b))
    return x


DAMAGE = [('uint8', 20, 0.0, 'x dtype 1, scale 0.0'),
          ('uint8', 20, float('nan'), 'x dtype 1, scale nan'),
          ('int8', 20, -1.0, 'x dtype 2, scale -1.0'), ('uint8', 24, float('inf'), 'offset inf'),
          ('float32', 20, 2.0, 'x dtype 0, scale 2.0, offset 0.0'),
          ('float32', 28, 2.0, 'y dtype 0, scale 2.0, offset 0.0'),
          ('float32', 32, 1.0, 'y dtype 0, scale 1.0, offset 1.0')]

READ = '''
import sys
from utrain.data import Dataset
try:
    Dataset(sys.argv[-1])
    print('READ')
except ValueError as e:
    print('REFUSED', e)
'''


@pytest.mark.parametrize('dtype,at,value,want', DAMAGE)
def test_a_ds_header_scale_the_board_and_host_read_differently_is_refused_by_both(
        tmp_path, dtype, at, value, want):
    """A uint8 .ds whose scale was damaged to 0 trained on every sample as its offset,
    unsaid; a float32 .ds with a y (or x) scale other than 1 was scaled by the host's
    reader and evaluate, and read as stored by the board.  Both readers (utrain.data's
    header, which the host's read_dataset calls, under CPython and MicroPython) now
    refuse it naming the file."""
    p = os.fspath(tmp_path / 'train.ds')
    _ds(p, dtype, at, value)
    with pytest.raises(DataError, match='damaged header: .*' + want.replace('.', r'\.')
                       + '.*write the file again'):
        read_dataset(p)
    script = tmp_path / 'read.py'
    script.write_text(READ)
    for argv, env in [([os.sys.executable], dict(os.environ, PYTHONPATH=MICRO))] + (
            [([MP], dict(os.environ, MICROPYPATH=MICRO))] if MP else []):
        r = subprocess.run(argv + [str(script), p], env=env, capture_output=True, text=True,
                           timeout=60)
        assert f'REFUSED {p}: damaged header' in r.stdout, (argv, r.stdout + r.stderr)


def test_good_quantized_headers_read_alike_on_host_and_board(tmp_path):
    """The scales and offsets prepare writes are read, and read the same."""
    for dtype in ('float32', 'uint8', 'int8'):
        p = os.fspath(tmp_path / f'{dtype}.ds')
        x = _ds(p, dtype)
        hx, hy = read_dataset(p)
        assert np.allclose(hx, x, atol=0.02) and list(hy[:, 0]) == [0, 1, 0, 1, 0]


RECORD = '''
import sys
from utrain.collect import Recorder
for kw in (dict(dtype=0, scale=0.5), dict(dtype=0, offset=1.0), dict(dtype=1, scale=0.0),
           dict(dtype=2, scale=float('nan'))):
    try:
        Recorder(sys.argv[-1] + str(len(kw)) + str(kw['dtype']), 3, 1, **kw)
        print('MADE', kw)
    except ValueError as e:
        print('REFUSED', e)
'''


@pytest.mark.parametrize('where', WHERE)
def test_the_recorder_refuses_a_scale_its_readers_would_refuse(tmp_path, where):
    """Recorder(dtype=0, scale=1/255) wrote a float32 file whose scale the host applied
    and the board did not."""
    script = tmp_path / 'rec.py'
    script.write_text(RECORD)
    argv, env = ([os.sys.executable], dict(os.environ, PYTHONPATH=MICRO)) if where == 'python' \
        else ([MP], dict(os.environ, MICROPYPATH=MICRO))
    r = subprocess.run(argv + [str(script), str(tmp_path / 'mine.ds')], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.count('REFUSED') == 4 and 'MADE' not in r.stdout, r.stdout + r.stderr
    assert r.stdout.count('dtype 0 stores float32 values as they are') == 2, r.stdout


# ------------------------------------------------------------------ resume with another optimizer
@pytest.fixture(scope='module')
def trained(files, q8):
    """A float folder (sgd) and an int8 one (sgd, momentum 0.9), each run for one of its two
    epochs: a checkpoint to resume from."""
    d, model, data = files
    _, m8, data8 = q8
    out = []
    for name, m, dt, kw in (('f', model, data, dict(optimizer='sgd', lr=0.05)),
                            ('q', m8, data8, dict(optimizer='sgd', momentum=0.9, lr=0.01))):
        folder = d / ('resume-' + name)
        prepare(m, os.fspath(folder), data=dt, loss='scce', epochs=2, test_split=0.25,
                log=lambda *a: None, **kw)
        _edit(folder, epochs=1)
        code, log = runner.run(os.fspath(folder), python=True, stream=False)
        assert code == 0, log
        _edit(folder, epochs=2, run=dict(resume=True))
        out.append(folder)
    return out


def _edit(folder, run=None, **kw):
    p = os.path.join(folder, 'train.json')
    c = json.load(open(p))
    c.update(kw)
    c['run'].update(run or {})
    open(p, 'w').write(json.dumps(c))


@pytest.mark.parametrize('case', ['float sgd -> adam', 'float sgd -> sgd momentum',
                                  'int8 momentum -> sgd', 'int8 momentum -> adam'])
@pytest.mark.parametrize('where', WHERE)
def test_resuming_under_another_optimizer_is_refused_saying_both_ways_on(trained, tmp_path,
                                                                          case, where):
    """train.json's optimizer edited between a run and its resume: the float run took the
    checkpoint's state as the new optimizer's (or dropped it) without a word; the int8 run
    dropped SGD's velocity, or ended on 'the blocks must follow each other' (a checkpoint
    called damaged)."""
    src = trained[0 if case.startswith('float') else 1]
    d = tmp_path / 'r'
    shutil.copytree(src, d, ignore=shutil.ignore_patterns('lib'))
    new = case.split('-> ')[1]
    _edit(d, optimizer=new.split()[0], momentum=0.9 if 'momentum' in new else 0.0)
    ckpt = (d / 'checkpoint.ckpt').read_bytes()
    code, log = runner.run(os.fspath(d), python=where == 'python', stream=False)
    was = 'sgd without momentum' if case.startswith('float') else 'sgd with momentum'
    now = {'adam': 'adam', 'sgd momentum': 'sgd with momentum', 'sgd': 'sgd without momentum'}[new]
    assert code == 1 and f'checkpoint.ckpt: saved training with {was}; train.json trains ' \
        f'with {now}' in log, log
    advice = runner.end_advice(os.fspath(d), log)
    assert f'back to {was}, as the checkpoint trained' in advice and '"start": "best"' in \
        advice, advice
    assert (d / 'checkpoint.ckpt').read_bytes() == ckpt


def test_resuming_under_the_same_optimizer_with_other_rates_goes_on(trained, tmp_path):
    """lr, momentum's value and adam <-> adamw keep the same state: resumed as before."""
    d = tmp_path / 'r'
    shutil.copytree(trained[0], d, ignore=shutil.ignore_patterns('lib'))
    _edit(d, lr=0.02)
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0 and 'resumed from checkpoint.ckpt at epoch 1' in log, log


# ------------------------------------------------------------------ h63b's own round
def test_dataset_does_not_replace_a_run_folders_samples(files, tmp_path):
    """`dataset new.npz -o RUN` (or -o a link to it) wrote its train.ds and test.ds over the
    ones RUN was prepared on, unsaid: of another width the run then called its own
    folder damaged, and without the input scaling prepare folds into them."""
    from test_refusals import says
    d, model, data = files
    run = tmp_path / 'run'
    prepare(model, os.fspath(run), data=data, loss='scce', lr=0.05, epochs=1, test_split=0.25,
            log=lambda *a: None)
    before = {n: (run / n).read_bytes() for n in ('train.ds', 'test.ds')}
    np.savez(tmp_path / 'x4.npz', x=np.zeros((10, 4)), y=np.arange(10) % 3)
    os.symlink(run, tmp_path / 'link')
    for out in (run, tmp_path / 'link'):
        code, err = says(['dataset', tmp_path / 'x4.npz', '-o', out])
        assert code == 2 and 'a run folder (prepare wrote it): its train.ds and test.ds are ' \
            'the samples its model was prepared on' in err and 'prepare it again' in err, err
    assert {n: (run / n).read_bytes() for n in before} == before


def test_samples_whose_sum_float32_cannot_hold_are_refused(files, tmp_path):
    """Values float32 holds (3.4e38) whose sum it does not: prepare wrote them, and the
    board refused its train.ds as 'holds NaN or Inf', telling to prepare the folder again."""
    from test_refusals import says
    d, model, _ = files
    np.savez(tmp_path / 'max.npz', x=np.full((8, 6), 3.4e38, np.float32), y=np.arange(8) % 3)
    code, err = says(['prepare', model, tmp_path / 'max.npz', '-o', tmp_path / 'o', '--loss',
                      'scce', '--lr', '0.05'])
    assert code == 2 and 'x of sample 0 sums to 2.04e+39 in magnitude' in err and \
        'scale the data down' in err, err
    assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('cmd', ['prepare', 'dataset'])
@pytest.mark.parametrize('dtype', ['uint8', 'int8'])
def test_samples_one_outlier_makes_alike_as_bytes_are_refused(files, tmp_path, cmd, dtype):
    """One value of 1e30 among values of about 1: stored as uint8 / int8 at the step it
    sets, the other samples all became the same bytes, and trained so, unsaid.  Sparse,
    binary and ordinary samples are stored as before."""
    from test_refusals import says
    d, model, _ = files
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 6))
    sparse = np.where(rng.random((24, 6)) < 0.9, 0, rng.integers(0, 256, (24, 6))).astype(float)
    for name, xx, ok in (('out', np.where(np.arange(24)[:, None] == 5, 1e30, x), False),
                         ('plain', x, True), ('sparse', sparse, True),
                         ('binary', (x > 0).astype(float), True)):
        np.savez(tmp_path / f'{name}.npz', x=xx, y=np.arange(24) % 3)
        out = tmp_path / f'o-{name}'
        argv = ['prepare', model, tmp_path / f'{name}.npz', '-o', out, '--loss', 'scce', '--lr',
                '0.05', '--dtype', dtype] if cmd == 'prepare' else \
            ['dataset', tmp_path / f'{name}.npz', '-o', out, '--dtype', dtype]
        code, err = says(argv)
        if ok:
            assert code == 0, (name, err)
        else:
            assert code == 2 and f'{name}.npz: stored as {dtype} at one step of' in err and \
                '(sample 5 holds 1e+30)' in err and '--dtype float32' in err, err
            assert not out.exists()


# ------------------------------------------------------------------ int8 side files cut short
@pytest.fixture(scope='module')
def int8_run(files):
    """A float model trained as int8 (--int8) for an epoch: q8.req, trained.wof and the
    scales beside it (.q8s: ranges doubled, .q8w: weight scales)."""
    d, model, data = files
    out = d / 'int8-run'
    prepare(model, os.fspath(out), data=data, loss='scce', lr=0.01, epochs=1, test_split=0.25,
            int8=True, log=lambda *a: None)
    code, log = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0 and (out / 'trained.wof.q8s').exists() and \
        (out / 'trained.wof.q8w').exists(), log
    return out


LOAD = '''
from utrain.q8train import Q8Trainer
try:
    tr = Q8Trainer('q8.json', 'weights.wof')
    tr.net.load_weights('trained.wof')
    print('LOADED')
except ValueError as e:
    print('REFUSED', e)
'''


@pytest.mark.parametrize('name,cut', [('q8.req', 1), ('q8.req', 'half'), ('trained.wof.q8s', 1),
                                      ('trained.wof.q8w', 1), ('trained.wof.q8w', 'tag')])
@pytest.mark.parametrize('where', WHERE)
def test_int8_side_files_cut_short_are_refused_naming_them(int8_run, tmp_path, name, cut, where):
    """q8.req cut short had divided by zero in the first step (a traceback) or trained on
    multipliers of 0; trained.wof.q8s cut short ended on 'syntax error in JSON' (no file
    named), and .q8w cut short (or holding its tag alone) was taken as no scale doubled,
    the weights then read at other scales than they were saved at, unsaid."""
    d = tmp_path / 'r'
    shutil.copytree(int8_run, d, ignore=shutil.ignore_patterns('lib'))
    (d / 'load.py').write_text(LOAD)
    data = (d / name).read_bytes()
    (d / name).write_bytes(data[:4] if cut == 'tag' else data[:len(data) // 2] if cut == 'half'
                           else data[:-cut])
    argv, env = ([os.sys.executable], dict(os.environ, PYTHONPATH=MICRO)) if where == 'python' \
        else ([MP], dict(os.environ, MICROPYPATH=MICRO))
    r = subprocess.run(argv + ['load.py'], cwd=d, env=env, capture_output=True, text=True,
                       timeout=60)
    assert f'REFUSED {name}:' in r.stdout and ('copy it' in r.stdout or 'copy both' in
                                                r.stdout), r.stdout + r.stderr
    if name == 'trained.wof.q8w' and cut == 'tag':
        from test_refusals import says
        code, err = says(['export', int8_run.parent / 'm.circle', d / 'trained.wof', '-o',
                          tmp_path / 'o.circle', '--quantized'])
        assert code == 2 and 'trained.wof.q8w: not the weight scales' in err and 'cut short' \
            in err, err


# ------------------------------------------------------------------ pull of what is not this run's
def _board(monkeypatch, flash):
    """mpremote stood in for by a folder playing the board's flash (ls, cp :a b)."""
    from host_tools.boards import board

    def fake(port, *args, resume=False, cwd=None, **kw):
        if args[0] == 'exec':
            return f'LS {sorted(os.listdir(flash))!r}\n'
        cmds = ' '.join(args).split(' + ')
        for c in cmds:
            _, src, dst = c.split(' ')
            shutil.copy(os.path.join(flash, src[1:]), os.path.join(cwd, dst))
        return ''
    monkeypatch.setattr(board, 'mpremote', fake)
    return board


@pytest.mark.parametrize('case', ['another model', 'trained.wof cut short',
                                  'checkpoint cut short', 'train.log empty', 'own'])
def test_pull_refuses_files_that_are_not_this_runs(files, trained, tmp_path, monkeypatch, case):
    """pull copied whatever the board held over the folder's files: another model's
    results (a board trained for another folder, or not yet for this one), a trained.wof
    or checkpoint cut short on the board, an empty train.log: each replaced good files,
    unsaid (found with a simulated board)."""
    d, model, data = files
    run = trained[0]                                # (trained sgd for an epoch: its files)
    flash = tmp_path / 'flash'
    if case == 'another model':
        other = tmp_path / 'other'
        prepare(small_mlp(os.fspath(tmp_path / 'm5.circle'), hidden=5), os.fspath(other),
                data=data, loss='scce', lr=0.05, epochs=1, test_split=0.25, log=lambda *a: None)
        code, log = runner.run(os.fspath(other), python=True, stream=False)
        assert code == 0, log
        shutil.copytree(other, flash)
    else:
        shutil.copytree(run, flash)
    cut = {'trained.wof cut short': 'trained.wof', 'checkpoint cut short': 'checkpoint.ckpt'}
    if case in cut:
        b = (flash / cut[case]).read_bytes()
        (flash / cut[case]).write_bytes(b[:len(b) - 9])
    if case == 'train.log empty':
        (flash / 'train.log').write_bytes(b'')
    d2 = tmp_path / 'mine'
    shutil.copytree(run, d2, ignore=shutil.ignore_patterns('lib'))
    before = {n: (d2 / n).read_bytes() for n in os.listdir(d2) if (d2 / n).is_file()}
    board = _board(monkeypatch, flash)
    if case == 'own':
        assert board.pull(os.fspath(d2), 'COM3') == ['trained.wof', 'checkpoint.ckpt',
                                                     'train.log']
        return
    with pytest.raises(board.BoardError) as e:
        board.pull(os.fspath(d2), 'COM3')
    want = {'another model': "the board's trained.wof is not weights of this folder's model",
            'trained.wof cut short': "the board's trained.wof is not weights of this folder's",
            'checkpoint cut short': "the board's checkpoint.ckpt is cut short",
            'train.log empty': "the board's train.log is not a train.log"}[case]
    assert want in str(e.value) and 'are as they were: train this folder on the board' in \
        str(e.value), str(e.value)
    assert {n: (d2 / n).read_bytes() for n in os.listdir(d2) if (d2 / n).is_file()} == before


def test_export_does_not_advise_a_record_as_weights(files, trained, tmp_path):
    """export's refusals advised 'give trained.wof.best or checkpoint.ckpt', and then
    refused trained.wof.best (the best epoch's JSON record) as 'not trained weights'."""
    from test_refusals import says
    d, model, _ = files
    code, err = says(['export', model, trained[0] / 'trained.wof.best', '-o', tmp_path / 'o.circle'])
    assert code == 2 and 'the record of the best epoch' in err and \
        f'give {trained[0] / "trained.wof"}, which holds those weights' in err, err
    code, err = says(['export', model, trained[0] / 'train.log', '-o', tmp_path / 'o.circle'])
    assert code == 2 and 'not trained weights' in err and 'trained.wof.best' not in err, err


@pytest.mark.parametrize('loss', [None, 'bce', 'mse'])
def test_a_softmax_over_one_value_is_refused(tmp_path, loss):
    """Dense(1, activation='softmax'): its output is 1 for every input; bce took that 1 as
    a logit, mse (chosen for labels 0/1) as the answer, and each run trained nothing,
    unsaid."""
    from test_refusals import says
    m = small_mlp(os.fspath(tmp_path / 'm1.circle'), n_out=1)
    x = np.random.default_rng(0).normal(size=(12, 6))
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 0).astype(float))
    code, err = says(['prepare', m, tmp_path / 'd.npz', '-o', tmp_path / 'o', '--lr', '0.05']
                     + (['--loss', loss] if loss else []))
    assert code == 2 and 'op 2 (SOFTMAX) normalises 1 value: its output is 1 for every input' \
        in err and "Dense(1, activation='sigmoid')" in err, err
    assert not (tmp_path / 'o').exists()
