"""Session 26's hostile-input round (h62b): classes of bad input the earlier rounds
(test_hostile_inputs, test_refusals, test_hostile_new_paths...) did not throw, each of
which had ended in a traceback, a process killed for its memory, a silent success on
data the board stores as Inf, advice to remove the user's model file, or a file of
another run written over.  Each now ends in one refusal naming the file or option, what
is wrong and what to do, with nothing written."""
import fcntl
import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
from PIL import Image

from repo import ROOT  # noqa: E402

from host_tools.cli import main as cli  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_pipeline import small_mlp  # noqa: E402
from test_refusals import says, files  # noqa: E402,F401  (the CLI's words; a model, samples)

MP = runner.find_micropython()


@pytest.fixture(scope='module')
def runs(files):
    """Two prepared folders of two models (hidden 8 and 5), each with a trained.wof."""
    d, model, data = files
    other = small_mlp(str(d / 'm5.circle'), hidden=5)
    out = []
    for m, name in ((model, 'a'), (other, 'b')):
        prepare(m, str(d / name), data=data, loss='scce', lr=0.05, epochs=1, test_split=0.25,
                log=lambda *a: None)
        shutil.copy(d / name / 'weights.wof', d / name / 'trained.wof')
        out.append(d / name)
    return out


# ------------------------------------------------------------------ data beyond float32
def _big(d):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 6))
    x[5, 2] = 1e300                     # finite in float64, Inf once stored as float32
    np.savez(d / 'big.npz', x=x, y=rng.integers(0, 3, 24))
    (d / 'big.csv').write_text('1e39,2,3,4,5,6,1\n' * 4 + '1,2,3,4,5,6,0\n')
    return d / 'big.npz', d / 'big.csv'


@pytest.mark.parametrize('cmd', ['prepare npz', 'prepare csv', 'evaluate', 'dataset uint8'])
def test_values_float32_cannot_hold_are_refused_naming_the_sample(files, cmd):
    """A float64 1e300 (or '1e39' in a .csv) passed the NaN/Inf check: prepare wrote it
    into train.ds as Inf, evaluate scored 'cross-entropy nan', and `dataset` (uint8) was
    an OverflowError's traceback packing the header."""
    d, model, _ = files
    npz, csv = _big(d)
    out = d / ('o-' + cmd.replace(' ', '-'))
    argv = {'prepare npz': ['prepare', model, npz, '-o', out, '--loss', 'scce', '--lr', '0.05'],
            'prepare csv': ['prepare', model, csv, '-o', out, '--loss', 'scce', '--lr', '0.05'],
            'evaluate': ['evaluate', model, npz],
            'dataset uint8': ['dataset', npz, '-o', out]}[cmd]
    code, err = says(argv)
    sample = 0 if 'csv' in cmd else 5
    assert code == 2 and f'x of sample {sample} holds' in err and 'more than float32 holds' in err, err
    assert 'scale the data into range' in err and 'Traceback' not in err, err
    assert not out.exists()


# ------------------------------------------------------------------ a file where a folder goes
@pytest.mark.parametrize('cmd', ['prepare', 'dataset', 'demo'])
def test_a_folder_asked_where_a_file_is_says_so_and_not_to_remove_it(files, cmd):
    """`prepare -o model.circle/run` (and `demo --out`, `board --flash`, `fleet -o` alike)
    said 'model.circle: exists already; give a path that does not, or remove it': advice
    to remove the user's model; `dataset -o model.circle` too."""
    d, model, data = files
    before = open(model, 'rb').read()
    inside = os.path.join(model, 'run')
    argv = {'prepare': ['prepare', model, data, '-o', inside, '--loss', 'scce', '--lr', '0.05'],
            'dataset': ['dataset', data, '-o', model],
            'demo': ['demo', '--out', inside, '--epochs', '1']}[cmd]
    code, err = says(argv)
    assert code == 2 and 'remove it' not in err, err
    assert 'is a file' in err and 'a folder' in err, err
    assert open(model, 'rb').read() == before


# ------------------------------------------------------------------ settings float32 loses
@pytest.mark.parametrize('flag, value, holds', [
    ('--lr', '1e-50', "a board's float (32 bits) holds it as 0"),
    ('--beta2', '0.99999999', "a board's float (32 bits) holds it as 1"),
    ('--eps', '1e-50', "a board's float (32 bits) holds it as 0"),
    ('--momentum', '0.999999999', "a board's float (32 bits) holds it as 1"),
    ('--lr', '1e-39', "below 1.18e-38, the smallest value a board's float (32 bits) holds exactly")])
def test_a_setting_a_boards_float_rounds_out_of_range_is_refused(files, flag, value, holds):
    """model.flat stores the settings as float32, and a board's float is 32 bits: --lr
    1e-50 trained at 0, --beta2 0.99999999 at 1 (Adam's 1 - beta2 ** t a division by 0);
    prepare wrote both.  Below float32's normal range (1e-39) MicroPython's float32 build
    reads another value (6.4e-39)."""
    d, model, data = files
    out = d / ('f32' + flag + value)
    opt = ['--optimizer', 'adam'] if flag in ('--beta2', '--eps') else []
    code, err = says(['prepare', model, data, '-o', out, '--loss', 'scce'] + opt
                     + (['--lr', '0.05'] if flag != '--lr' else []) + [flag, value])
    assert code == 2 and f'{flag} {value}' in err and holds in err, err
    assert not out.exists()


# ------------------------------------------------------------------ export
def test_export_refuses_nan_weights_and_leaves_no_model(files, runs, tmp_path):
    """A .wof holding NaN (damaged; the board never saves one) was exported as it was,
    into a model that answers NaN."""
    _, model, _ = files
    run = tmp_path / 'nan'
    shutil.copytree(runs[0], run)
    raw = bytearray((run / 'trained.wof').read_bytes())
    raw[-4:] = np.float32(np.nan).tobytes()
    (run / 'trained.wof').write_bytes(bytes(raw))
    out = tmp_path / 'x.circle'
    code, err = says(['export', model, run / 'trained.wof', '-o', out])
    assert code == 2 and 'holds 1 NaN or Inf weights: the file is damaged' in err, err
    assert "export the run folder's checkpoint.ckpt (the last epoch saved)" in err and \
        not out.exists()


@pytest.mark.parametrize('target', ['other-weights', 'wof-by-another-name', 'log', 'text',
                                    'keras'])
def test_export_does_not_write_a_model_over_a_file_that_is_none(files, runs, tmp_path, target):
    """export -o another run's weights.wof wrote a circle model over it (export refused
    only its own inputs); -o out.txt or model.h5 wrote a circle file by that name."""
    _, model, _ = files
    path = {'other-weights': runs[1] / 'weights.wof', 'wof-by-another-name': tmp_path / 'w.bin',
            'log': tmp_path / 'train.log', 'text': tmp_path / 'out.txt',
            'keras': tmp_path / 'model.h5'}[target]
    if target == 'wof-by-another-name':
        shutil.copy(runs[1] / 'weights.wof', path)
    before = path.read_bytes() if path.exists() else None
    code, err = says(['export', model, runs[0] / 'trained.wof', '-o', path])
    assert code == 2 and 'not a model; export writes a model file' in err, err
    assert (path.read_bytes() if path.exists() else None) == before


# ------------------------------------------------------------------ images resized
@pytest.mark.parametrize('cmd', ['evaluate', 'dataset'])
def test_a_resize_beyond_the_pixels_read_is_refused_before_resizing(files, cmd):
    """--size 100000x100000 resized every image to 10^10 pixels: the process was killed
    for its memory, with no message.  (Here just past the limit, which main resized.)"""
    d, model, _ = files
    imgs = d / 'imgs'
    if not imgs.exists():
        for c in 'ab':
            (imgs / c).mkdir(parents=True)
            Image.new('L', (2, 3)).save(imgs / c / '0.png')
    argv = {'evaluate': ['evaluate', model, imgs], 'dataset': ['dataset', imgs, '-o', d / 'big']}[cmd]
    code, err = says(argv + ['--size', '4097x4096'])
    assert code == 2 and '--size 4097x4096: 16781312 pixels an image' in err, err
    assert 'give the size the model takes' in err and not (d / 'big').exists()


# ------------------------------------------------------------------ dataset's -o
def test_dataset_writes_neither_over_its_input_nor_into_a_folder_in_use(files, runs):
    """`dataset run/train.ds -o run` wrote a re-split uint8 copy of train.ds over itself
    (and its test part into test.ds); `dataset -o` a folder a run was training in wrote
    its train.ds under it."""
    _, _, data = files
    run = runs[0]
    before = {n: (run / n).read_bytes() for n in ('train.ds', 'test.ds')}
    code, err = says(['dataset', run / 'train.ds', '-o', run])
    assert code == 2 and 'dataset writes train.ds in' in err and 'which is this input' in err, err
    held = run.parent / 'held'              # (a run folder itself is refused as one:
    held.mkdir(exist_ok=True)               # test_hostile_round27)
    fd = os.open(held, os.O_RDONLY)         # a run holding the folder
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = subprocess.run([sys.executable, '-m', 'host_tools', 'dataset', data, '-o', str(held)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        os.close(fd)
    assert r.returncode == 2 and 'is using this folder; wait for it' in r.stderr, r.stderr
    assert not (held / 'train.ds').exists()
    assert {n: (run / n).read_bytes() for n in before} == before


# ------------------------------------------------------------------ options left unread
def test_evaluate_output_of_a_one_output_model_is_judged(files):
    """--output 5 of a model with one output was left unread (prepare refuses it)."""
    _, model, data = files
    code, err = says(['evaluate', model, data, '--output', '5'])
    assert code == 2 and "--output '5': the model's outputs are 0 'p'" in err, err
    assert says(['evaluate', model, data, '--output', 'p'])[0] == 0


def test_run_options_of_the_emulated_pico_without_emulate_are_refused(runs):
    """run --heap 100K / --ulab without --emulate trained at --board's heap, unsaid."""
    code, err = says(['run', runs[0], '--heap', '100K', '--ulab', '--python'])
    assert code == 2 and 'run --heap --ulab: only with --emulate' in err, err
    assert not (runs[0] / 'train.log').exists()


@pytest.mark.parametrize('loss, times, offset', [('bce', 2, 0), ('cce', 1, -0.5), ('bce', 1, -0.5)])
def test_cross_entropy_targets_with_no_lowest_loss_are_refused(files, loss, times, offset):
    """bce from logits on targets above 1 (one-hot rows times 2, a model ending in
    SOFTMAX: prepare trains it from logits), or bce / cce on a negative target: a loss
    with no lowest value, driven to -Inf and NaN at any lr; prepare wrote the folder.
    (Targets above 1 for a sigmoid's probabilities stay a warning: test_default_loss.)"""
    d, model, _ = files
    rng = np.random.default_rng(1)
    y = np.eye(3)[rng.integers(0, 3, 24)] * times + offset
    np.savez(d / 'yt.npz', x=rng.normal(size=(24, 6)), y=y)
    out = d / ('yt%s%g%g' % (loss, times, offset))
    code, err = says(['prepare', model, d / 'yt.npz', '-o', out, '--loss', loss, '--lr', '0.05'])
    assert code == 2 and f'{loss} takes targets from 0 to 1' in err, err
    assert 'has %g' % (2 if times == 2 else offset) in err and 'no lowest value' in err, err
    assert not out.exists()


# ------------------------------------------------------------------ the run folder
WHERE = ['python'] + (['micropython'] if MP else [])


def _run(folder, where):
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = cli(['run', str(folder)] + (['--python'] if where == 'python' else []))
    return code, err.getvalue()


@pytest.mark.parametrize('where', WHERE)
def test_steps_naming_no_module_is_refused_as_a_setting(runs, tmp_path, where):
    """run.steps ["nonexistent"] in train.json passed the check (a list of names) and
    ended in an ImportError's traceback."""
    d = tmp_path / 'steps'
    shutil.copytree(runs[0], d)
    cfg = json.loads((d / 'train.json').read_text())
    cfg['run']['steps'] = ['nonexistent']
    (d / 'train.json').write_text(json.dumps(cfg))
    code, log = runner.run(str(d), python=where == 'python', stream=False)
    assert code == 1 and 'utrain: error: train.json: "run.steps" names "nonexistent", which is ' \
        'no utrain module' in log and 'Traceback' not in log, log
    assert 'change train.json in' in runner.end_advice(str(d), log)


@pytest.mark.parametrize('where', WHERE)
def test_starting_from_a_damaged_best_says_what_to_do(runs, tmp_path, where):
    """"start": "best" from a trained.wof cut short (or another model's) ended on
    'trained.wof: truncated .wof header' with nothing to do."""
    d = tmp_path / 'best'
    shutil.copytree(runs[0], d)
    (d / 'trained.wof').write_bytes(b'')
    cfg = json.loads((d / 'train.json').read_text())
    cfg['run']['start'] = 'best'
    (d / 'train.json').write_text(json.dumps(cfg))
    code, err = _run(d, where)
    assert code == 1 and 'what to do: trained.wof in' in err, err
    assert 'delete it (or set "start": "weights"' in err, err


def test_a_model_flat_from_another_run_is_named_with_weights_wof(runs, tmp_path):
    """model.flat copied from another preparation: the run blamed weights.wof alone
    ('damaged or missing')."""
    d = tmp_path / 'swap'
    shutil.copytree(runs[0], d)
    shutil.copy(runs[1] / 'model.flat', d / 'model.flat')
    code, err = _run(d, 'python')
    assert code == 1 and 'model.flat and weights.wof come from different preparations' in err, err


def test_deploy_refuses_starting_weights_of_nan_as_run_does(runs, tmp_path):
    """`run` refuses a weights.wof holding NaN before the board trains on it; `deploy`
    copied it, and the board trained to 'loss is nan ... lower "lr"', saying nothing of
    the file.  (Refused before the port is opened: no board needed.)"""
    d = tmp_path / 'nanw'
    shutil.copytree(runs[0], d)
    raw = bytearray((d / 'weights.wof').read_bytes())
    raw[-4:] = np.float32(np.nan).tobytes()
    (d / 'weights.wof').write_bytes(bytes(raw))
    code, err = says(['deploy', d, '--port', str(tmp_path / 'no-such-port'), '--run'])
    assert code == 2 and 'weights.wof: 1 of its weights are NaN or Inf: the file is damaged' in err, err


def _onnx_gemm(path, w, batch='N'):
    onnx = pytest.importorskip('onnx')
    pytest.importorskip('onnxruntime')
    from onnx import helper, numpy_helper, TensorProto
    g = helper.make_graph(
        [helper.make_node('Gemm', ['x', 'W', 'B'], ['z']), helper.make_node('Softmax', ['z'], ['p'], axis=1)],
        'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [batch, 6])],
        [helper.make_tensor_value_info('p', TensorProto.FLOAT, [batch, 3])],
        initializer=[numpy_helper.from_array(w, 'W'), numpy_helper.from_array(np.zeros(3, np.float32), 'B')])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)]), str(path))
    return path


@pytest.mark.parametrize('case', ['nan-weights', 'batch-0'])
def test_evaluate_judges_an_onnx_model_as_it_judges_a_circle_one(files, tmp_path, case):
    """An .onnx model went to ONNX Runtime unchecked: weights of NaN were scored
    ('cross-entropy of the softmax nan') where inspect and prepare refuse them, and a
    batch of 0 fixed in the file was InvalidArgument's traceback."""
    _, _, data = files
    w = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    if case == 'nan-weights':
        w[2, 1] = np.nan
    model = _onnx_gemm(tmp_path / 'm.onnx', w, batch=0 if case == 'batch-0' else 'N')
    code, err = says(['evaluate', model, data])
    assert 'Traceback' not in err, err
    if case == 'nan-weights':
        assert code == 2 and "'W') holds NaN or Inf weights; the file is damaged" in err, err
    else:
        # (as prepare trains it, a sample at a time: utrain's own forward scores it, saying
        # why and what to export; it had been refused with ONNX Runtime's words alone)
        r = subprocess.run([sys.executable, '-m', 'host_tools', 'evaluate', str(model), str(data)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "utrain's own forward" in r.stdout, r.stdout + r.stderr
        assert "fixes input x's batch at 0" in r.stdout and 'a batch of 1' in r.stdout, r.stdout


@pytest.mark.parametrize('where', WHERE)
def test_a_save_the_file_system_refuses_says_what_is_in_its_way(runs, tmp_path, where):
    """A folder where a save writes (checkpoint.ckpt.tmp): the board said 'cannot write
    checkpoint.ckpt: it is a folder', and `run` added 'checkpoint.ckpt cannot be resumed
    from; delete it', of a checkpoint that was not there (for a full file system, of a
    good one)."""
    d = tmp_path / 'tmpdir'
    shutil.copytree(runs[0], d)
    (d / 'checkpoint.ckpt.tmp').mkdir()
    code, err = _run(d, where)
    assert code == 1 and 'delete it' not in err, err
    assert 'what to do: checkpoint.ckpt could not be saved in' in err and \
        'move the folder by that name (checkpoint.ckpt, or checkpoint.ckpt.tmp' in err, err


RECORD = '''
import sys
from utrain.collect import Recorder
from utrain.data import Dataset
path = sys.argv[-1]
for dt in (0, 1):
    r = Recorder(path + str(dt), 3, 1, dtype=dt, scale=1 / 255 if dt else 1.0)
    r.add([0.1, 0.2, 0.3], 1)
    for x, y in (([float('nan'), 0, 0], 0), ([0, float('inf'), 0], 0), ([0, 0, 0], float('nan')),
                 ([0, 0, 0], 'cat'), ([0, 0, 0], None)):
        try:
            r.add(x, y)
            print('RECORDED', dt, x, y)
        except ValueError as e:
            print('REFUSED', e)
    r.add([0.3, 0.2, 0.1], 2)
    r.close()
    print('SAMPLES', Dataset(path + str(dt)).n)
'''


@pytest.mark.parametrize('where', WHERE)
def test_the_recorder_refuses_a_sample_no_training_would_take(tmp_path, where):
    """Recorder.add stored a NaN or Inf value (a sensor's) in a float .ds, which made the
    whole file one the run refuses ('train.ds is damaged'); uint8 raised numpy's or
    MicroPython's "can't convert NaN to int" without the file; a label 'cat' was 'target
    has 3 values'.  Each is now refused naming the file, and the file keeps the others."""
    script = tmp_path / 'rec.py'
    script.write_text(RECORD)
    micro = os.path.join(ROOT, 'micro')
    if where == 'python':
        argv, env = [sys.executable], dict(os.environ, PYTHONPATH=micro)
    else:
        argv, env = [MP], dict(os.environ, MICROPYPATH=micro)
    r = subprocess.run(argv + [str(script), str(tmp_path / 'mine.ds')], env=env,
                       capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and 'Traceback' not in out and 'RECORDED' not in out, out
    assert out.count('REFUSED ' + str(tmp_path / 'mine.ds')) == 10, out
    assert 'not a finite number; not recorded' in out and "target 'cat'" in out, out
    assert out.count('SAMPLES 2') == 2, out


@pytest.mark.parametrize('keys', [('X', 'Y'), ('arr_0', 'arr_1'), ('data', 'labels')])
def test_an_npz_of_other_names_says_how_to_save_it(files, keys):
    """An .npz of X/Y, data/labels or np.savez's positional arr_0/arr_1 was told 'needs
    arrays named x and y (has ...)', not how to write them so."""
    d, model, _ = files
    rng = np.random.default_rng(0)
    np.savez(d / 'keys.npz', **{keys[0]: rng.normal(size=(8, 6)), keys[1]: rng.integers(0, 3, 8)})
    code, err = says(['prepare', model, d / 'keys.npz', '-o', d / 'keys', '--loss', 'scce',
                      '--lr', '0.05'])
    assert code == 2 and f'(has {keys[0]}, {keys[1]})' in err, err
    assert 'np.savez(path, x=samples, y=labels)' in err and not (d / 'keys').exists(), err


def test_deploy_does_not_stage_code_under_a_run_of_the_folder(runs, tmp_path):
    """`deploy DIR` while `run DIR` trained (two terminals): deploy staged lib/utrain anew
    under the run, which imports its modules as it goes, and the run ended in 'ImportError:
    no module named utrain.once' (found with a simulated board).  deploy now takes the
    folder's lock as prepare, a run and `dataset` do: refused naming the run, before the
    port is opened; and a run started during a deploy is refused naming it."""
    d = tmp_path / 'held'
    shutil.copytree(runs[0], d)
    fd = os.open(d, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = subprocess.run([sys.executable, '-m', 'host_tools', 'deploy', str(d), '--port',
                            str(tmp_path / 'no-such-port')], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    finally:
        os.close(fd)
    assert r.returncode == 2 and 'is using this folder; wait for it to end (or stop it), then ' \
        'deploy' in r.stderr, r.stderr
    assert not (d / 'lib').exists()


def test_a_pull_cut_short_leaves_the_folders_files_as_they_were(runs, tmp_path, monkeypatch):
    """pull copied the board's files over the folder's one by one: a pull cut short
    (Ctrl-C, a cable pulled) after the first left a new trained.wof beside the old record
    (trained.wof.best) and checkpoint, or a file cut short.  (mpremote stood in for: it
    writes the first file as asked, then the copy is interrupted.)"""
    from host_tools.boards import board
    d = tmp_path / 'pulled'
    shutil.copytree(runs[0], d)
    for n in ('trained.wof.best', 'checkpoint.ckpt', 'train.log'):
        (d / n).write_bytes(b'old ' + n.encode())
    before = {n: (d / n).read_bytes() for n in os.listdir(d)}

    def fake(port, *args, resume=False, cwd=None, **kw):
        if args[0] == 'exec':
            return "LS ['trained.wof', 'trained.wof.best', 'checkpoint.ckpt', 'train.log']\n"
        dst = os.path.join(cwd, args[2])
        with open(dst, 'wb') as f:
            f.write(b'new, cut sh')
        raise KeyboardInterrupt
    monkeypatch.setattr(board, 'mpremote', fake)
    with pytest.raises(KeyboardInterrupt):
        board.pull(str(d), 'COM3')
    assert {n: (d / n).read_bytes() for n in os.listdir(d)} == before


def test_a_plot_stopped_half_way_keeps_the_last_one(tmp_path, monkeypatch):
    """plot wrote the PNG in place: stopped half way (Ctrl-C, a full disk) it left a
    file cut short where the last good plot was.  (savefig stood in for: it writes a
    part, then is interrupted.)"""
    pytest.importorskip('matplotlib')
    from matplotlib.figure import Figure
    log = tmp_path / 'train.log'
    log.write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'
                   '1,0.5,0.5,0.4,0.6,10,100\n2,0.4,0.6,0.3,0.7,10,100\n')
    out = tmp_path / 'curves.png'
    out.write_bytes(b'the last good plot')

    def cut(self, fname, **kw):     # (a path or a file object, as savefig takes)
        if isinstance(fname, (str, os.PathLike)):
            with open(fname, 'wb') as f:
                f.write(b'\x89PNG cut sh')
        else:
            fname.write(b'\x89PNG cut sh')
        raise KeyboardInterrupt
    monkeypatch.setattr(Figure, 'savefig', cut)
    code, err = says(['plot', log, '-o', out])
    assert code == 130 and out.read_bytes() == b'the last good plot', err
    assert sorted(os.listdir(tmp_path)) == ['curves.png', 'train.log']


DEVICE = '''
import io, json, sys, traceback
from contextlib import redirect_stderr, redirect_stdout
from host_tools.cli import main
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = main(argv)
    except BaseException as e:
        code, err = 'traceback', io.StringIO(type(e).__name__)
    print(json.dumps([code, err.getvalue()]), flush=True)
'''


def test_a_device_given_as_a_file_is_refused_not_read_to_its_end(files, tmp_path):
    """/dev/zero as the model, the data, export's weights, plot's log or --train-config was
    read to its end: the memory filled, a MemoryError's traceback (under a memory limit;
    without one the machine's memory), where a terminal given so would wait forever.
    (All five in one process of their own, under a 2 GB address-space limit.)"""
    import resource
    _, model, data = files
    z = '/dev/zero'
    cases = [['inspect', z],
             ['prepare', model, z, '-o', tmp_path / 'o', '--loss', 'scce', '--lr', '0.05'],
             ['export', model, z, '-o', tmp_path / 'x.circle'],
             ['plot', z, '-o', tmp_path / 'c.png'],
             ['prepare', model, data, '-o', tmp_path / 'o', '--loss', 'scce', '--lr', '0.05',
              '--train-config', z]]

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    r = subprocess.run([sys.executable, '-c', DEVICE, json.dumps([[str(a) for a in c] for c in cases])],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    said = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(said) == len(cases), r.stdout + r.stderr[-600:]
    for argv, (code, err) in zip(cases, said):
        assert code == 2 and '/dev/zero: is a device, not a' in err, (argv[0], code, err)


@pytest.mark.parametrize('cmd', ['evaluate', 'prepare'])
def test_a_run_folder_given_as_data_says_which_file_in_it_to_give(files, runs, tmp_path, cmd):
    """A run folder given as the data was read as a folder of images: its lib/ (and
    earlier-N/) became classes, 'no images in the class folders (lib): put each class's
    images in its folder'."""
    _, model, _ = files
    d = tmp_path / 'run'
    shutil.copytree(runs[0], d)
    (d / 'lib' / 'utrain').mkdir(parents=True)
    argv = {'evaluate': ['evaluate', model, d],
            'prepare': ['prepare', model, d, '-o', tmp_path / 'o', '--loss', 'scce', '--lr', '0.05']}[cmd]
    code, err = says(argv)
    assert code == 2 and 'a run folder (prepare wrote it), not a folder of images: give its ' \
        'test.ds' in err, err


def test_a_last_n_past_the_files_ops_says_it_trains_all_of_them(tmp_path):
    """--train last:999 on a 3-op model trained everything without a word."""
    from host_tools.prepare.pipeline import prepare as prep
    said = []
    digits = os.path.join(ROOT, 'datasets', 'digits')
    s = prep(os.path.join(digits, 'digits_mlp.circle'), os.fspath(tmp_path / 'r'),
             data=os.path.join(digits, 'digits.npz'), train='last:999', lr=0.01, epochs=1,
             log=said.append)
    assert s['trainable_params'] == 2410
    assert any('last:999: the file has 3 ops; it trains all of them' in m for m in said), said


@pytest.mark.parametrize('optimizer', ['sgd', 'adamw'])
def test_a_weight_decay_that_overshoots_is_refused_naming_the_bound(tmp_path, optimizer):
    """--weight-decay 1e30 had been taken: each sgd / adamw step multiplies the weights by
    1 - lr x weight_decay, here far below 0, and the run diverged."""
    from host_tools.prepare.pipeline import prepare as prep
    from host_tools.graph.passes import PrepareError
    digits = os.path.join(ROOT, 'datasets', 'digits')
    kw = dict(data=os.path.join(digits, 'digits.npz'), lr=0.01, epochs=1, optimizer=optimizer,
              log=lambda *a: None)
    with pytest.raises(PrepareError, match=r'--weight-decay 1e\+30 at lr 0\.01: .*below 1 / lr = 100'):
        prep(os.path.join(digits, 'digits_mlp.circle'), os.fspath(tmp_path / 'r'),
             weight_decay=1e30, **kw)
    assert not os.path.exists(tmp_path / 'r')
    s = prep(os.path.join(digits, 'digits_mlp.circle'), os.fspath(tmp_path / 'r'),
             weight_decay=0.01, **kw)
    assert s['settings']['weight_decay'] == 0.01


def test_dequantize_on_a_float_model_says_it_has_nothing_to_do(tmp_path):
    """--dequantize on a float model had been taken without a word; on an int8 one it
    dequantizes (no note)."""
    from host_tools.prepare.pipeline import prepare as prep
    from kerasgraphs import build_int8_unary
    digits = os.path.join(ROOT, 'datasets', 'digits')
    said = []
    prep(os.path.join(digits, 'digits_mlp.circle'), os.fspath(tmp_path / 'f'),
         data=os.path.join(digits, 'digits.npz'), dequantize=True, lr=0.01, epochs=1,
         log=said.append)
    assert any('--dequantize: the model holds no int8' in m for m in said), said
    q8 = build_int8_unary(os.fspath(tmp_path / 'q.tflite'), 'TANH')[0]
    x = np.random.default_rng(0).normal(0, 1, (24, 6)).astype(np.float32)
    np.savez(tmp_path / 'q.npz', x=x, y=(x[:, 0] > 0).astype(np.int64))
    said = []
    prep(q8, os.fspath(tmp_path / 'q'), data=os.fspath(tmp_path / 'q.npz'), dequantize=True,
         loss='scce', lr=0.01, epochs=1, log=said.append)
    assert not any('--dequantize: the model holds no' in m for m in said), said
