"""Session 32's hostile-input round (h69c; its driver lived outside the repo, the cases and
counts are in the final report), with issue 28's "nothing leaves a wrong log": a folder run
again, a checkpoint of another model of the same shapes, an ONNX model's input shapes and
the data's, paths of odd characters, read-only and symlinked folders, files cut short at
every offset class, junk in the environment.  Each class here had ended in a traceback,
been taken without a word, left a wrong log, or said what was wrong and not what to do."""
import json
import os
import shutil
import subprocess

import pytest

from host_tools.target import runner  # noqa: E402
from repo import set_train  # noqa: E402
from test_refusals import files, prepared, says  # noqa: E402,F401  (a model, samples)


def _copy(prepared, tmp_path, name='r'):
    d = tmp_path / name
    shutil.copytree(prepared, d)
    return d


def _rows(d):
    return (d / 'train.log').read_text().splitlines()


# ------------------------------------------------------------------ a folder run again
def test_a_folder_run_again_says_what_it_starts_from_and_logs_under_its_own_header(prepared, tmp_path):
    """A second `run` of a folder that trained had said '(not better than epoch 0)' and
    'trained.wof holds the best weights: epoch 0' of the first run's weights (continuing
    from them, or starting over?) and appended its epochs 0, 1 to the first run's rows
    under the one header.  It says it starts again from weights.wof, how to go on from
    the earlier run instead, and its rows follow a header of their own."""
    d = _copy(prepared, tmp_path)
    code, first = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0 and 'holds an earlier run' not in first, first
    code, text = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0, text
    assert ('train.log holds an earlier run (to epoch 1): this run starts again at epoch 0 '
            'from weights.wof (the prepared weights)') in text, text
    assert '"resume": true under "run" in train.json with "epochs" raised' in text, text
    assert 'epoch 0' not in text.split('holds an earlier run')[1].replace('at epoch 0', ''), text
    rows = _rows(d)
    heads = [i for i, r in enumerate(rows) if r.startswith('epoch,')]
    assert len(heads) == 2 and [r.split(',')[0] for r in rows[heads[1] + 1:]] == ['0', '1'], rows
    assert [r.split(',')[0] for r in rows[1:heads[1]]] == ['0', '1'], rows


def test_a_best_kept_from_before_the_run_is_not_called_epoch_0(prepared, tmp_path):
    """Run again with the earlier run's weights unbeaten: the end line said 'holds the
    best weights: epoch 0', an epoch of neither run."""
    d = _copy(prepared, tmp_path)
    assert runner.run(os.fspath(d), python=True, stream=False)[0] == 0
    set_train(d, lr=1e-9)       # (this run moves nothing: the earlier weights stay best)
    code, text = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0 and 'holds the best weights: epoch 0' not in text, text
    assert 'holds the best weights: still those it held before this run' in text, text


def test_a_resumed_second_run_logs_its_first_epoch(prepared, tmp_path):
    """A folder trained (one epoch, no test split), run again and stopped at its first
    sample (a Ctrl-C: the checkpoint at epoch 0, sample 1), then resumed: the resume took
    the first run's last row (epoch 1) for its own, and its epoch 1 was neither printed
    nor logged."""
    d = _copy(prepared, tmp_path)
    os.remove(d / 'test.ds')
    j = json.loads((d / 'train.json').read_text())
    j['files']['test'] = None
    j['run']['keep_best'] = False
    (d / 'train.json').write_text(json.dumps(j))
    assert runner.run(os.fspath(d), python=True, stream=False)[0] == 0
    argv, env = runner.command(os.fspath(d), python=True)
    r = subprocess.run(argv, cwd=d, env=env, input='\x03', capture_output=True, text=True, timeout=60)
    assert 'interrupted in epoch 1 at sample' in r.stdout, r.stdout + r.stderr
    code, text = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0 and 'epoch 1/1 loss' in text, text
    rows = _rows(d)
    assert rows[-1].startswith('1,') and rows[-2].startswith('epoch,'), rows


def test_plot_draws_the_run_under_the_last_header(tmp_path):
    """Runs logged under headers of their own: plot drew a run stopped after its
    evaluation (epoch 0) joined to the next one's epoch 1, as one run."""
    from host_tools.plot import read_log
    h = 'epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'
    log = tmp_path / 'train.log'
    log.write_text(h + '0,,,0.9,0.5,0,\n' + h + '1,0.5,0.7,,,3,\n2,0.4,0.8,,,3,\n')
    assert read_log(str(log))['epoch'] == [1, 2]


# ------------------------------------------------------------------ another model's checkpoint
@pytest.fixture(scope='module')
def twin(files, tmp_path_factory):
    """A folder prepared like `prepared` from another model of the same shapes (other
    weights), trained: its checkpoint fits `prepared`'s tensors byte for byte."""
    from host_tools.prepare.pipeline import prepare
    from test_pipeline import small_mlp
    d, _, data = files
    t = tmp_path_factory.mktemp('twin')
    out = t / 'twin'
    prepare(small_mlp(str(t / 'm3.circle'), seed=3), str(out), data=data, loss='scce',
            epochs=1, test_split=0.25, log=lambda *a: None)
    assert runner.run(os.fspath(out), python=True, stream=False)[0] == 0
    return out


def test_a_checkpoint_of_another_model_of_the_same_shapes_is_refused(prepared, twin, tmp_path):
    """A checkpoint copied in from a folder prepared from another model whose tensors have
    the same sizes resumed without a word: the other model's weights trained on under this
    one's name.  The checkpoint carries the fingerprint of the model files prepare wrote
    (train.json's run.fingerprint); the board refuses another's, naming the file and what
    to do."""
    d = _copy(prepared, tmp_path)
    shutil.copy(twin / 'checkpoint.ckpt', d / 'checkpoint.ckpt')
    set_train(d, epochs=2, run={'resume': True})
    before = (d / 'train.log').read_bytes()
    code, text = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 1 and 'checkpoint.ckpt: a checkpoint of another model (fingerprint ' in text, text
    assert 'delete it, or set "resume": false under "run" in train.json' in text, text
    assert runner.end_advice(os.fspath(d), text).startswith(
        f'what to do: {d / "checkpoint.ckpt"} was saved training another model'), text
    assert (d / 'train.log').read_bytes() == before


def test_the_folders_own_checkpoint_resumes_and_an_old_one_resumes_with_a_note(prepared, tmp_path):
    """The folder's own checkpoint resumes as before; one saved before checkpoints had a
    fingerprint (a folder trained by an older utrain) resumes too, saying it was not
    checked."""
    d = _copy(prepared, tmp_path)
    assert runner.run(os.fspath(d), python=True, stream=False)[0] == 0
    raw = (d / 'checkpoint.ckpt').read_bytes()
    assert raw[3] == 2 and raw[-16:-12] == b'UTFP', raw[-16:]
    set_train(d, epochs=2, run={'resume': True})
    code, text = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0 and 'resumed from checkpoint.ckpt at epoch 1' in text and 'fingerprint' not in text, text
    e = _copy(prepared, tmp_path, 'old')        # (a checkpoint as a utrain before (32) wrote it)
    j = json.loads((e / 'train.json').read_text())
    fp = j['run'].pop('fingerprint')
    (e / 'train.json').write_text(json.dumps(j))
    assert runner.run(os.fspath(e), python=True, stream=False)[0] == 0
    assert (e / 'checkpoint.ckpt').read_bytes()[3] == 1
    j['run'].update(fingerprint=fp, resume=True)
    j['epochs'] = 2
    (e / 'train.json').write_text(json.dumps(j))
    code, text = runner.run(os.fspath(e), python=True, stream=False)
    assert code == 0 and 'checkpoint.ckpt has no model fingerprint' in text, text
    assert 'epoch 2/2 loss' in text, text


def test_export_reads_a_checkpoint_with_a_fingerprint(files, prepared, tmp_path):
    """export MODEL checkpoint.ckpt reads the weights of a checkpoint with the block."""
    d0, model, _ = files
    d = _copy(prepared, tmp_path)
    assert runner.run(os.fspath(d), python=True, stream=False)[0] == 0
    code, err = says(['export', model, d / 'checkpoint.ckpt', '-o', tmp_path / 'x.circle'])
    assert code == 0 and (tmp_path / 'x.circle').exists(), err


# ------------------------------------------------------------------ ONNX input shapes and data
def _onnx(path, inputs, conv=False):
    """An .onnx model: per input (name, dims; None open) a MatMul to 3 outputs, added; conv:
    one input [N, 3, H, W] through Conv(4, 3x3), Flatten, Gemm of the width 8x8 gives."""
    import numpy as np
    import onnx
    from onnx import TensorProto as T, helper, numpy_helper
    r = np.random.default_rng(1)
    inits, nodes = [], []
    if conv:
        inits = [numpy_helper.from_array(r.standard_normal((4, 3, 3, 3)).astype('f') * .1, 'w'),
                 numpy_helper.from_array(r.standard_normal((3, 144)).astype('f') * .1, 'g')]
        nodes = [helper.make_node('Conv', ['x', 'w'], ['c'], kernel_shape=[3, 3]),
                 helper.make_node('Flatten', ['c'], ['f']),
                 helper.make_node('Gemm', ['f', 'g'], ['o'], transB=1)]
    else:
        outs = []
        for k, (name, dims) in enumerate(inputs):
            inits.append(numpy_helper.from_array(
                r.standard_normal((dims[-1], 3)).astype('f') * .3, f'w{k}'))
            nodes.append(helper.make_node('MatMul', [name, f'w{k}'], [f'm{k}']))
            outs.append(f'm{k}')
        nodes.append(helper.make_node('Add', outs, ['o']) if len(outs) == 2 else
                     helper.make_node('Identity', outs, ['o']))
    nodes.append(helper.make_node('Softmax', ['o'], ['out'], axis=-1))
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info(n, T.FLOAT, [
        d if d is not None else f'd{j}' for j, d in enumerate(dims)]) for n, dims in inputs],
        [helper.make_tensor_value_info('out', T.FLOAT, [1, 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def _npz(path, **arrays):
    import numpy as np
    np.savez(path, **{k: np.asarray(v, np.float32 if k != 'y' else np.int64) for k, v in arrays.items()})
    return path


def _x(*shape):
    import numpy as np
    return np.random.default_rng(2).standard_normal(shape)


Y = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]


def test_data_of_another_width_says_what_to_give(tmp_path):
    """'d.npz: x has 5 values per sample, the model input takes 6' had said what and
    stopped; a .csv with an id column, 'y has shape (12, 2); scce wants class labels'."""
    m = _onnx(tmp_path / 'm.onnx', [('x', [1, 6])])
    code, err = says(['prepare', m, _npz(tmp_path / 'd.npz', x=_x(12, 5), y=Y), '-o',
                      tmp_path / 'o', '--lr', '0.1'])
    assert code == 2 and 'x has 5 values per sample' in err, err
    assert "(its samples are [5], the model's input [1, 6] with the batch first): give samples " \
           'of 6 values each' in err, err
    csv = tmp_path / 'd.csv'
    csv.write_text(''.join(f'{i},{",".join(["0.5"] * 6)},{i % 3}\n' for i in range(12)))
    code, err = says(['prepare', m, csv, '-o', tmp_path / 'o', '--lr', '0.1', '--loss', 'scce'])
    assert code == 2 and 'these rows have 2 columns after the inputs (drop other columns' in err, err
    assert not (tmp_path / 'o').exists()


def test_channels_last_samples_for_an_open_channels_first_input_say_how_to_move_them(tmp_path):
    """An ONNX input [N, 3, h, w] (h, w open) given [N, 8, 8, 3] images: the refusal said
    what the input takes, not that the channels are last nor what to do."""
    m = _onnx(tmp_path / 'c.onnx', [('x', [None, 3, None, None])], conv=True)
    code, err = says(['prepare', m, _npz(tmp_path / 'd.npz', x=_x(12, 8, 8, 3), y=Y), '-o',
                      tmp_path / 'o', '--lr', '0.1'])
    assert code == 2 and "takes samples of [3, ?, ?]" in err, err
    assert 'x = numpy.moveaxis(x, -1, 1)' in err and 'update_inputs_outputs_dims' in err, err


def test_samples_whose_open_dimensions_the_layers_do_not_take_are_not_called_a_damaged_file(tmp_path):
    """An ONNX CNN with open h, w whose Flatten feeds a Gemm of one width, given 10x10
    images (the model was made for 8x8): 'node Gemm cannot be read (IndexError ...): the
    file may be damaged: export the model again (if it is not, report this ...: a utrain
    bug)' of a good file."""
    m = _onnx(tmp_path / 'c.onnx', [('x', [None, 3, None, None])], conv=True)
    code, err = says(['prepare', m, _npz(tmp_path / 'd.npz', x=_x(12, 3, 10, 10), y=Y), '-o',
                      tmp_path / 'o', '--lr', '0.1'])
    assert code == 2 and 'may be damaged' not in err and 'utrain bug' not in err, err
    assert "the model's layers take other dimensions than these samples have" in err, err
    code, err = says(['prepare', m, _npz(tmp_path / 'e.npz', x=_x(12, 3, 8, 8), y=Y), '-o',
                      tmp_path / 'o', '--lr', '0.1'])
    assert code == 0, err


def test_an_input_named_y_takes_its_array_not_the_targets(tmp_path):
    """A model with inputs x and y: the .npz's y (the targets) had been read as input y
    ('array y has 1 values a sample; the model's input 'y' takes 4'), so no file could
    give it, and x, x1, y was refused as 'holds x and an array named for an input (y)'."""
    m = _onnx(tmp_path / 'two.onnx', [('x', [1, 6]), ('y', [1, 4])])
    ok = _npz(tmp_path / 'ok.npz', x0=_x(12, 6), x1=_x(12, 4), y=Y)
    code, err = says(['prepare', m, ok, '-o', tmp_path / 'o', '--lr', '0.1'])
    assert code == 0, err
    bad = _npz(tmp_path / 'bad.npz', x0=_x(12, 6), x1=_x(12, 5), y=Y)
    code, err = says(['prepare', m, bad, '-o', tmp_path / 'p', '--lr', '0.1'])
    assert code == 2 and "array x1 has 5 values a sample" in err and 'give x1 samples of [4]' in err, err
    joined = _npz(tmp_path / 'j.npz', x=_x(12, 10), y=Y)
    code, err = says(['prepare', m, joined, '-o', tmp_path / 'q', '--lr', '0.1'])
    assert code == 0, err


# ------------------------------------------------------------------ symbolic links in a run folder
def test_a_log_linked_to_train_json_is_refused_before_it_is_appended_to(prepared, tmp_path):
    """train.log a symbolic link to the folder's train.json: the run appended its rows to
    train.json (the next run: 'train.json: not valid JSON')."""
    d = _copy(prepared, tmp_path)
    os.remove(d / 'train.log')
    (d / 'train.log').symlink_to('train.json')
    before = (d / 'train.json').read_bytes()
    code, err = says(['run', d, '--python'])
    assert code == 2 and 'train.log: a symbolic link to ' in err and 'which the run reads' in err, err
    assert 'remove the link (the run makes the file)' in err, err
    assert (d / 'train.json').read_bytes() == before


def test_a_log_that_is_a_device_is_refused_and_read_no_further_than_its_tail(prepared, tmp_path):
    """train.log a link to /dev/full: the board read the log's tail whole, which on a
    device has no end: MicroPython's 'out of memory before training' of a 1 MB heap, and
    CPython filled the machine's memory until the kernel killed it.  The host refuses the
    link; the board reads at most 512 bytes of a log and says the write failed."""
    import resource
    import sys
    if not os.path.exists('/dev/full'):
        pytest.skip('no /dev/full')
    d = _copy(prepared, tmp_path)
    os.remove(d / 'train.log')
    (d / 'train.log').symlink_to('/dev/full')
    code, err = says(['run', d, '--python'])
    assert code == 2 and 'train.log: a symbolic link to /dev/full, no regular file' in err, err
    argv, env = runner.command(os.fspath(d), python=True)

    def cap():      # (main's read had no end: bounded here, so the test cannot take the machine)
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    r = subprocess.run(argv, cwd=d, env=env, capture_output=True, text=True, timeout=60,
                       preexec_fn=cap)
    assert 'cannot write train.log: no space left on the file system' in r.stdout, r.stdout + r.stderr[-500:]
    assert 'Traceback' not in r.stdout + r.stderr and 'out of memory' not in r.stdout, r.stdout


def test_run_replaces_a_linked_train_py_and_lib_not_writing_through_them(prepared, tmp_path):
    """train.py a symbolic link: run copied utrain's train.py through it (over the file it
    named, elsewhere); to /dev/null, the board ran nothing and the run ended 0 without a
    line.  lib a link to a missing folder: 'lib/utrain: no such file or folder'."""
    d = _copy(prepared, tmp_path)
    other = tmp_path / 'mine.py'
    other.write_text('print("mine")\n')
    (d / 'train.py').symlink_to(other)
    (d / 'lib').symlink_to(tmp_path / 'nowhere')
    runner.stage(os.fspath(d), source=True)     # (what run stages, as .py: no mpy-cross)
    assert other.read_text() == 'print("mine")\n' and not (d / 'train.py').is_symlink()
    assert (d / 'lib' / 'utrain' / 'run.py').is_file() and not (d / 'lib').is_symlink()
    code, text = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 0 and 'utrain: end: ok' in text, text
    e = _copy(prepared, tmp_path, 'n')
    (e / 'train.py').symlink_to('/dev/null')
    code, text = runner.run(os.fspath(e), python=True, stream=False)
    assert code == 0 and 'utrain: end: ok' in text, text


def test_a_model_given_as_a_folder_says_to_give_the_file(prepared, tmp_path):
    """prepare / inspect given a folder (a link to one) for the model: 'is a directory,
    not a model file', and nothing to do."""
    code, err = says(['inspect', prepared])
    assert code == 2 and 'is a directory, not a model file: give the model file itself' in err, err
    assert 'prepare.json names it' in err, err


# ------------------------------------------------------------------ numbers at the ends (train.json)
def test_a_whole_number_beyond_a_float_is_refused_as_a_number_setting(prepared, tmp_path):
    """"lr": 1 and 400 zeros (JSON's whole number): CPython's OverflowError traceback in
    the optimizer; a board took it as inf and stopped on a NaN, 'lower "lr" (inf)'."""
    d = _copy(prepared, tmp_path)
    j = json.loads((d / 'train.json').read_text())
    j['lr'] = 10 ** 400
    (d / 'train.json').write_text(json.dumps(j))
    code, text = runner.run(os.fspath(d), python=True, stream=False)
    assert code == 1 and 'Traceback' not in text and '"lr" must be a number > 0 (got 1000' in text, text


# ------------------------------------------------------------------ files cut short
@pytest.mark.parametrize('cut', [0, 1, 2, 3])
def test_an_npz_cut_in_its_first_bytes_is_called_cut_short(files, tmp_path, cut):
    """An .npz cut within its zip's 4-byte start: 'P' and 'PK' had been 'it reads as text,
    not an .npz (a CSV? ...)', 'PK\\x03' 'not a readable .npz file (File is not a zip
    file)', and an empty one said what data is, not to save it again."""
    d, model, data = files
    p = tmp_path / 'd.npz'
    p.write_bytes(open(data, 'rb').read()[:cut])
    code, err = says(['prepare', model, p, '-o', tmp_path / 'o', '--lr', '0.1'])
    assert code == 2 and 'a CSV?' not in err and 'save it again (np.savez(path, x=x, y=y))' in err, err


@pytest.mark.parametrize('name, cut', [('trained.wof', 186), ('checkpoint.ckpt', -4)])
def test_weights_cut_short_outside_a_run_folder_are_called_cut_short(files, prepared, tmp_path, name, cut):
    """export MODEL w.wof of a file cut short, not in a run folder: 'the data blocks end at
    offset 372, the file at 186 (truncated ...): w.wof is not in a run folder ..., so it was
    read against the model as given; export it from the folder it was trained in', as if
    its model were the question."""
    d0, model, _ = files
    d = _copy(prepared, tmp_path)
    assert runner.run(os.fspath(d), python=True, stream=False)[0] == 0
    p = tmp_path / ('w' + os.path.splitext(name)[1])
    p.write_bytes((d / name).read_bytes()[:cut])
    code, err = says(['export', model, p, '-o', tmp_path / 'x.circle'])
    assert code == 2 and 'the file is cut short or damaged' in err and 'copy it again' in err, err
    assert 'is not in a run folder' not in err, err


# ------------------------------------------------------------------ commands beside a run
def test_export_and_plot_of_a_run_not_saved_yet_say_so(files, prepared, tmp_path):
    """export / plot of a folder whose run has not saved trained.wof or train.log yet (it is
    training, or was never run): '...: cannot read (No such file or directory)' and
    '...: no such file', with nothing to do."""
    import sys
    import time
    d0, model, _ = files
    d = _copy(prepared, tmp_path)
    os.remove(d / 'train.log')
    code, err = says(['export', model, d / 'trained.wof', '-o', tmp_path / 'x.circle'])
    assert code == 2 and f'has not been trained (or its run stopped before saving it): run it first (`run {d}`)' in err, err
    code, err = says(['plot', d / 'train.log', '-o', tmp_path / 'c.png'])
    assert code == 2 and 'has not been trained' in err, err
    hold = ('import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); '
            'fcntl.flock(fd, fcntl.LOCK_EX); print(1, flush=True); time.sleep(30)')
    p = subprocess.Popen([sys.executable, '-c', hold, str(d), 'run'], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == '1'
        code, err = says(['export', model, d / 'trained.wof', '-o', tmp_path / 'x.circle'])
        assert code == 2 and f'not written yet: a run (pid {p.pid}) is training in' in err, err
        assert 'try again once an epoch has ended' in err, err
    finally:
        p.kill()
        p.wait()


# ------------------------------------------------------------------ junk in the environment
def _cli(argv, **env):
    import sys
    from repo import ROOT
    e = dict(os.environ, PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, '-m', 'host_tools'] + [str(a) for a in argv], env=e,
                          capture_output=True, text=True, timeout=120)


def test_plot_under_a_junk_mplbackend_plots(prepared, tmp_path):
    """$MPLBACKEND=junk: "error: Key backend: 'junk' is not a valid value for backend;
    supported values are [...]", naming no variable; plot writes with Agg whatever it says."""
    log = tmp_path / 'train.log'
    log.write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n1,0.5,0.7,,,3,\n')
    r = _cli(['plot', log, '-o', tmp_path / 'c.png'], MPLBACKEND='junk')
    assert r.returncode == 0 and (tmp_path / 'c.png').exists(), r.stderr


def test_run_closes_its_pipes(prepared, tmp_path):
    """`run` left the board's stdout and stdin pipes open: PYTHONWARNINGS=error (a CI's
    setting) turned each into 'Exception ignored ... ResourceWarning: unclosed file' and a
    traceback after the run."""
    d = _copy(prepared, tmp_path)
    r = _cli(['run', d, '--python'], PYTHONWARNINGS='error')
    assert r.returncode == 0 and 'utrain: end: ok' in r.stdout, r.stdout + r.stderr
    assert 'ResourceWarning' not in r.stderr and 'Traceback' not in r.stderr, r.stderr


def test_a_pico_firmware_variable_naming_a_device_says_what_to_set(prepared, tmp_path, monkeypatch):
    """$UTRAIN_PICO_FIRMWARE=/dev/null: '...: no such file' of a file that is there, and
    nothing to do."""
    monkeypatch.setenv('UTRAIN_PICO_FIRMWARE', '/dev/null')
    code, err = says(['run', _copy(prepared, tmp_path), '--emulate'])
    assert code == 2 and '$UTRAIN_PICO_FIRMWARE=/dev/null: not a file: set $UTRAIN_PICO_FIRMWARE' in err, err


# ------------------------------------------------------------------ read-only and full file systems
def _in_mount(tmp_path, script, size=None):
    """script (sh) in a private mount namespace with a tmpfs at $MP (of size, if given):
    (exit code, output); skipped where mounting needs a root this test does not have."""
    import sys
    from repo import ROOT
    if not shutil.which('unshare') or os.geteuid() != 0:
        pytest.skip('needs root and unshare to mount a small tmpfs')
    mp = tmp_path / 'mnt'
    mp.mkdir()
    pre = f'MP={mp}; HT="{sys.executable} -m host_tools"; mount -t tmpfs ' + (
        f'-o size={size} ' if size else '') + 'tmpfs $MP || exit 77; '
    r = subprocess.run(['unshare', '-m', 'sh', '-c', pre + script], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    if r.returncode == 77:
        pytest.skip('cannot mount a tmpfs here: ' + r.stderr)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize('python', [False, True])
def test_a_run_folder_on_a_read_only_file_system_says_to_copy_it(prepared, tmp_path, python):
    """run of a trained folder on a read-only file system: 'error: xnumpy.mpy: on a
    read-only file system; write elsewhere', a bare file name (the staged code's removal)
    and nothing about what run writes there."""
    d = _copy(prepared, tmp_path)
    (d / 'lib' / 'utrain').mkdir(parents=True, exist_ok=True)
    (d / 'lib' / 'utrain' / 'xnumpy.mpy').write_bytes(b'M')
    code, out = _in_mount(tmp_path, f'cp -r {d} $MP/r && mount -o remount,ro $MP && $HT run $MP/r'
                          + ' --python' * python)
    assert code == 2 and '/r: cannot be written (Read-only file system): run copies train.py' in out, out
    assert 'copy the folder to a writable place and run the copy' in out, out


def test_dataset_on_a_full_file_system_leaves_nothing_half_written(files, tmp_path):
    """dataset -o on a file system with room for train.ds and not test.ds: train.ds stayed
    beside '...test.ds: cannot write it (No space left on device ...); nothing was
    written'."""
    d, model, data = files
    code, out = _in_mount(tmp_path, f'$HT dataset {data} -o $MP/ds; echo LS; ls $MP/ds', size='4k')
    assert 'test.ds: cannot write it (No space left on device' in out, out
    assert not [ln for ln in out.split('LS')[-1].splitlines() if ln.endswith('.ds')], out


def test_pull_refuses_a_board_checkpoint_of_another_model(prepared, twin, tmp_path):
    """pull's check of what the board sends took a checkpoint of another model of the same
    tensor sizes (trailer, checksum and tensor count all right) over the folder's."""
    from host_tools.boards.board import pulled_refusal
    d = _copy(prepared, tmp_path)
    files = json.loads((d / 'train.json').read_text())['files']
    why = pulled_refusal(str(d), files, 'checkpoint', str(twin / 'checkpoint.ckpt'))
    assert why and why.startswith("is another model's (fingerprint "), why
    assert runner.run(os.fspath(d), python=True, stream=False)[0] == 0
    assert pulled_refusal(str(d), files, 'checkpoint', str(d / 'checkpoint.ckpt')) is None
