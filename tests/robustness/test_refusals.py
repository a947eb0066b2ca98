"""Issue 28 (last bullet): every refusal says what to do, none is a traceback, a crash
or a run's progress lost.  Classes a hostile-input driver found (a few hundred damaged
models, data files, flags and signals; the driver lives outside the repo):
- a model whose op reads a tensor nothing writes (its constant's buffer index damaged) or
  whose options are another op's table: ONERT / TFLite Micro crashed the process
  (segmentation fault, no message) under `evaluate`; `inspect` raised IndexError;
- a train.log whose header is damaged: KeyError in `plot`;
- an .npz whose y is 0-d, with no --loss: TypeError choosing the loss;
- a CSV separated by ';' or tabs ('labels must be class numbers' of the whole row), a
  byte-order mark (the first sample dropped as a header), rows of other lengths (no line
  named);
- a value argparse cannot parse ("invalid int value: '1.5'", under 30 lines of usage);
- --train none with no --ranks (no hint what to give);
- SIGTERM / SIGHUP to `run` (kill, a timeout, a closed terminal): the host died, the
  board trained on unfollowed and the run's progress was lost."""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.cli import main as cli  # noqa: E402
from circle_schema.v0_10 import circle as C  # noqa: E402
from host_tools.formats.circle_io import _unpack, pack_model, options_class_for  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_pipeline import small_mlp, blobs  # noqa: E402
from test_hostile_inputs import graph  # noqa: E402


def says(argv):
    """(exit code, stderr) of the CLI in this process; an exception escapes (a traceback)."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            code = cli([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp('refusals')
    return d, small_mlp(str(d / 'm.circle')), blobs(d, n=24)


@pytest.fixture(scope='module')
def prepared(files):
    """A folder prepare wrote (test split, one epoch) with a train.log header: the tests
    that change it take a copy."""
    d, model, data = files
    out = d / 'prepared'
    prepare(model, str(out), data=data, loss='scce', epochs=1, test_split=0.25,
            log=lambda *a: None)
    (out / 'train.log').write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n')
    return out


def _options_of_add(src, dst):
    """src with its SOFTMAX's options AddOptions (a bit flipped in the union's type)."""
    raw = open(src, 'rb').read()
    m = _unpack(src, raw)
    op = m.subgraphs[0].operators[2]
    op.builtinOptionsType, op.builtinOptions = options_class_for('ADD')[1], C.AddOptions.AddOptionsT()
    open(dst, 'wb').write(pack_model(m, raw[4:8]))
    return dst


def _options_gone(src, dst):
    """src with its SOFTMAX's options table gone (the union's type byte zeroed)."""
    raw = open(src, 'rb').read()
    m = _unpack(src, raw)
    op = m.subgraphs[0].operators[2]
    op.builtinOptionsType, op.builtinOptions = 0, None
    open(dst, 'wb').write(pack_model(m, raw[4:8]))
    return dst


DAMAGED = {
    # b2's buffer index moved onto an empty buffer: op 1 reads a tensor nothing writes
    'constant-gone': (lambda d: graph(str(d / 'gone.circle'), lambda s, w, o: w.pop('b2')),
                      "reads tensor 5 ('b2'), which is neither a constant, a graph input nor "
                      'written by an op'),
    'options-of-another-op': (lambda d: _options_of_add(small_mlp(str(d / 'o.circle')),
                                                        str(d / 'opts.circle')),
                              'operator 2 (SOFTMAX): its options are AddOptions, SOFTMAX takes '
                              'SoftmaxOptions: the file is damaged'),
    'options-gone': (lambda d: _options_gone(small_mlp(str(d / 'g.circle')), str(d / 'gone2.circle')),
                     'operator 2 (SOFTMAX): its SoftmaxOptions are missing: the file is damaged'),
}


@pytest.mark.parametrize('damage', sorted(DAMAGED))
@pytest.mark.parametrize('cmd', ['evaluate', 'inspect'])
def test_a_damaged_model_is_refused_before_a_runtime_reads_it(files, damage, cmd):
    d, _, data = files
    make, want = DAMAGED[damage]
    model = make(d)
    argv = [cmd, model] + ([data] if cmd == 'evaluate' else [])
    if cmd == 'evaluate':       # (a segmentation fault: its own process)
        r = subprocess.run([sys.executable, '-m', 'host_tools'] + argv, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        code, err = r.returncode, r.stderr
    else:
        code, err = says(argv)
    assert code == 2 and want in err and 'Traceback' not in err, (code, err)
    assert 'use the original (or export it again)' in err, err


@pytest.mark.parametrize('header', ['epoch,loss,accuracy,test_loss,test_accuraby,ms,free_heap',
                                    'epoch,loss,accuracy,test_loss,test_loss,ms,free_heap',
                                    'epoch,lose,accuracy,test_loss,test_accuracy,ms,free_heap'])
def test_a_log_with_a_damaged_header_is_refused_by_plot(tmp_path, header):
    log = tmp_path / 'train.log'
    log.write_text(header + '\n1,1.0,0.5,0.9,0.4,10,-1\n2,0.8,0.6,0.7,0.5,10,-1\n')
    code, err = says(['plot', log, '-o', tmp_path / 'c.png'])
    assert code == 2 and 'train.log: not a utrain train.log' in err and 'give the train.log' in err, err
    assert not (tmp_path / 'c.png').exists()


def test_0d_labels_with_no_loss_are_refused_naming_the_file(files, tmp_path):
    d, model, _ = files
    np.savez(tmp_path / 'y0.npz', x=np.zeros((24, 6), np.float32), y=np.int64(1))
    code, err = says(['prepare', model, '-o', tmp_path / 'run', '--data', tmp_path / 'y0.npz'])
    assert code == 2 and 'y0.npz: array y is a single value (0-d)' in err, err
    assert not (tmp_path / 'run' / 'train.json').exists()


ROW = '0.1,0.2,0.3,0.4,0.5,0.6,{}\n'


@pytest.mark.parametrize('name, text, want', [
    ('semi.csv', ROW.replace(',', ';').format(1) * 4,
     "line 1 is one column of values separated by ';'"),
    ('tab.csv', 'a\tb\n' + ROW.replace(',', '\t').format(1) * 4,
     "line 1 is one column of values separated by '\\t'"),
    ('ragged.csv', ROW.format(1) * 3 + '0.1,0.2,1\n', 'line 4 has 3 columns, line 1 7'),
    ('one.csv', '1\n2\n', 'line 1 has 1 column; a row holds'),
])
def test_a_csv_refusal_names_the_line_and_what_to_do(files, tmp_path, name, text, want):
    _, model, _ = files
    (tmp_path / name).write_text(text)
    code, err = says(['evaluate', model, tmp_path / name])
    assert code == 2 and want in err and 'Traceback' not in err, err


def test_a_byte_order_mark_does_not_drop_the_first_sample(tmp_path):
    from host_tools.files.dataset import load_csv
    p = tmp_path / 'bom.csv'
    p.write_bytes(b'\xef\xbb\xbf' + ''.join(ROW.format(k % 3) for k in range(4)).encode())
    x, y = load_csv(str(p))
    assert x.shape == (4, 6) and list(y) == [0, 1, 2, 0]


@pytest.mark.parametrize('flag, value, want', [
    ('--batch', '1.5', "argument --batch: '1.5' is not a whole number; give one such as 8"),
    ('--epochs', 'abc', "argument --epochs: 'abc' is not a whole number"),
    ('--lr', 'fast', "argument --lr: 'fast' is not a number; give one such as 0.01"),
    ('--dtype', 'float64', "invalid choice: 'float64'"),
])
def test_an_unparsable_value_is_one_paragraph_saying_what_the_option_takes(files, tmp_path, flag,
                                                                           value, want):
    _, model, data = files
    code, err = says(['prepare', model, '-o', tmp_path / 'r', '--data', data, flag, value])
    assert code == 2 and want in err and '--help` lists the options' in err, err
    assert 'usage:' not in err and len(err.strip().splitlines()) == 1, err


def test_a_whole_number_written_as_a_float_is_taken(files, tmp_path):
    _, model, data = files
    code, err = says(['prepare', model, '-o', tmp_path / 'r', '--data', data, '--loss', 'scce',
                      '--seed', '1e3', '--epochs', '2.0'])
    assert code == 0, err
    cfg = json.loads((tmp_path / 'r' / 'train.json').read_text())
    assert cfg['seed'] == 1000 and cfg['epochs'] == 2, cfg


def test_train_none_without_ranks_says_what_to_give(files, tmp_path):
    _, model, data = files
    code, err = says(['prepare', model, '-o', tmp_path / 'r', '--data', data, '--loss', 'scce',
                      '--train', 'none'])
    assert code == 2 and 'nothing to train' in err and 'give --train all' in err, err


@pytest.mark.parametrize('sig', [signal.SIGTERM])
def test_a_run_told_to_stop_saves_its_checkpoint_and_resumes(files, tmp_path, sig):
    """`kill` (SIGTERM) or a closed terminal (SIGHUP) stops `run` as Ctrl-C does: the board
    saves its checkpoint and train.json says resume (the host had died with -15, the board
    left training unfollowed, nothing saved to resume from)."""
    d, model, _ = files
    out = tmp_path / 'run'
    prepare(model, str(out), data=blobs(tmp_path, n=60), loss='scce', epochs=5000,
            test_split=0.25, log=lambda *a: None)
    p = subprocess.Popen([sys.executable, '-m', 'host_tools', 'run', str(out), '--python'], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith('epoch 2/'):
            p.send_signal(sig)
            break
    rest = p.communicate(timeout=120)[0]
    text = ''.join(seen) + rest
    assert p.returncode == 130 and 'Traceback' not in text, text
    assert 'again to go on from there' in rest, rest
    assert 'interrupted in epoch' in rest and 'saved checkpoint.ckpt' in rest, rest
    assert json.loads((out / 'train.json').read_text())['run']['resume'] is True
    # the folder's lock went with the run: a next run starts (and resumes)
    cfg = json.loads((out / 'train.json').read_text())
    cfg['epochs'] = 6
    (out / 'train.json').write_text(json.dumps(cfg))
    code, text = runner.run(str(out), python=True, stream=False)
    assert code == 0 and 'resumed from checkpoint.ckpt' in text, text


def _onnx_model(path, damage):
    """x [1, 4] -> Gemm w -> Concat (h, h) -> y [1, 8], one thing damaged."""
    import onnx
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 8])
    shape = [4] if damage == 'weight-dims' else [4, 4]
    w = helper.make_tensor('w', TensorProto.FLOAT, shape, np.eye(4, dtype=np.float32).ravel()[
        :int(np.prod(shape))])
    cat = {} if damage == 'required-attribute-gone' else {'axis': 1}
    nodes = [helper.make_node('Gemm', ['x', 'w'], ['h'], name='dense'),
             helper.make_node('Concat', ['hh' if damage == 'reads-nothing' else 'h', 'h'],
                              ['y2' if damage == 'output-undefined' else 'y'], name='join', **cat)]
    m = helper.make_model(helper.make_graph(nodes, 'g', [x], [y], [w]),
                          opset_imports=[helper.make_opsetid('', 17)])
    raw = m.SerializeToString()
    if damage == 'name-not-text':
        raw = raw.replace(b'dense', b'\xffense')
    open(path, 'wb').write(raw)
    return path


ONNX_DAMAGE = {
    'reads-nothing': "node 1 (Concat 'join') reads 'hh', which no graph input, initializer or "
                     'earlier node defines',
    'required-attribute-gone': "node 1 ('Concat'): Required attribute 'axis' is missing",
    'output-undefined': "the graph output 'y' is defined by no node",
    'name-not-text': "node 0 ('Gemm'): a name that is not UTF-8 text",
    'weight-dims': 'node dense (Gemm) cannot be read (',
}


@pytest.mark.parametrize('damage', sorted(ONNX_DAMAGE))
def test_a_damaged_onnx_model_is_refused_naming_the_node(tmp_path, damage):
    """A byte changed in an .onnx file (a name, an attribute, a weight's dims): the reader
    had raised KeyError / TypeError / IndexError."""
    model = _onnx_model(str(tmp_path / 'm.onnx'), damage)
    code, err = says(['inspect', model])
    assert code == 2 and ONNX_DAMAGE[damage] in err and 'export the model again' in err, err


def test_a_reader_that_stops_reading_is_no_error(files):
    """`inspect model | head -1`: the CLI ends quietly (it said 'error: [Errno 32] Broken
    pipe' and Python's 'Exception ignored' lines)."""
    _, model, _ = files
    p = subprocess.Popen([sys.executable, '-m', 'host_tools', 'inspect', str(model)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert err == '' and p.returncode in (0, 141), (p.returncode, err)


@pytest.mark.parametrize('edit, want', [
    ({'seed': 1.0}, 'what to do: change train.json in '),
    ('train.log', 'what to do: move the folder train.log out of '),
])
def test_a_setting_the_board_refuses_is_not_called_a_damaged_file(prepared, tmp_path, edit, want):
    """The board names what is wrong with a setting of train.json (or a folder in the way
    of a file it writes); `run` had added 'train.json is damaged or missing ...; prepare
    the folder again', which would throw away the user's settings for a typo."""
    out = tmp_path / 'run'
    shutil.copytree(prepared, out)
    os.remove(out / 'train.log')
    if isinstance(edit, str):
        (out / edit).mkdir()
    else:
        cfg = json.loads((out / 'train.json').read_text())
        for k, v in edit.items():
            cfg[k] = dict(cfg[k], **v) if isinstance(v, dict) else v
        (out / 'train.json').write_text(json.dumps(cfg))
    code, err = says(['run', out, '--python'])
    assert code != 0 and want in err and 'damaged' not in err, err


def test_export_told_to_stop_half_way_leaves_no_partial_file(files, prepared, tmp_path):
    """SIGTERM while export writes (here: as it syncs the file to disk): it stops as on
    Ctrl-C, its temporary file removed and the output not made, and says SIGTERM stopped
    it; it had died on the signal, leaving .o.circle.*.tmp beside the output."""
    d, model, data = files
    run = tmp_path / 'run'
    shutil.copytree(prepared, run)
    shutil.copy(run / 'weights.wof', run / 'trained.wof')
    out = tmp_path / 'out'
    out.mkdir()
    code = ('import os, signal, sys\n'
            'from host_tools.formats import ir\n'
            'ir.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGTERM)\n'
            'from host_tools.cli import main\n'
            'sys.exit(main(sys.argv[1:]))\n')
    r = subprocess.run([sys.executable, '-c', code, 'export', str(model), str(run / 'trained.wof'),
                        '-o', str(out / 'o.circle')], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 130 and 'export did not finish' in r.stderr, (r.returncode, r.stderr)
    # (named for what stopped it: it had said 'stopped (Ctrl-C)' for a kill's SIGTERM)
    assert 'stopped (SIGTERM)' in r.stderr, r.stderr
    assert 'Traceback' not in r.stderr and os.listdir(out) == [], os.listdir(out)


@pytest.mark.parametrize('slot', ['data.npz', 'train.json', 'weights.wof', 'train.ds', 'train.log'])
def test_a_file_given_as_the_model_is_named_for_what_it_is(files, prepared, slot):
    """The data, or a run folder's file, given where the model goes: 'unknown file
    identifier b'-\\x00\\x00\\x00' (expected b'CIR0' ...)' had said neither what the file
    is nor what to give; `run` given a file of the folder had said 'no train.json here'."""
    d, model, data = files
    out = prepared
    f = data if slot == 'data.npz' else out / slot
    kind = {'data.npz': 'a zip archive (an .npz of data?)', 'train.json': 'JSON text',
            'weights.wof': "utrain's weights", 'train.ds': "utrain's samples", 'train.log': 'text'}
    code, err = says(['inspect', f])
    assert code == 2 and f'not a model: it reads as {kind[slot]}' in err, err
    assert 'give the model file (.circle, .tflite or .onnx) here' in err, err
    if slot != 'data.npz':
        code, err = says(['run', f])
        assert code == 2 and f'a file; give the folder prepare wrote (its -o), {out}' in err, err


@pytest.mark.parametrize('suffix', ['.onnx', '.tflite'])
def test_a_git_lfs_pointer_or_a_placeholder_given_as_the_model_says_so(tmp_path, suffix):
    """A model file of a repository stored with Git LFS, cloned without it, is a 3-line
    text pointer; a GitHub repository's mnist-8.onnx was a line of placeholder text.  As
    .onnx both had been 'not a valid ONNX model (DecodeError: Error parsing message with
    type 'onnx.ModelProto')', as .tflite the pointer 'it reads as text': neither said what
    the file is or how to get the model.  Now the pointer is named, with its size and how
    to fetch it, and a text .onnx reads as text, as a .tflite does."""
    lfs = tmp_path / ('m' + suffix)
    lfs.write_text('version https://git-lfs.github.com/spec/v1\noid sha256:' + '4d' * 32 +
                   '\nsize 1688196\n')
    code, err = says(['inspect', lfs])
    assert code == 2 and 'it reads as a Git LFS pointer, not the model (its 1688196 bytes' in err
    assert 'git lfs pull' in err and 'Traceback' not in err, err
    code, err = says(['prepare', lfs, '-o', tmp_path / 'run', '--lr', '0.01'])
    assert code == 2 and 'Git LFS pointer' in err, err
    txt = tmp_path / ('t' + suffix)
    txt.write_text('Real ONNX model would go here...\n')
    code, err = says(['inspect', txt])
    assert code == 2 and 'not a model: it reads as text' in err, err
    assert 'give the model file (.circle, .tflite or .onnx) here' in err, err


def test_starting_weights_of_nan_are_refused_before_the_board_trains_on_them(prepared, tmp_path):
    """A .wof has no checksum over its values: a damaged float (NaN) in weights.wof had
    trained to 'loss is nan at epoch 1 sample 1', the learning rate lowered three times,
    'stopped', with nothing said of the file."""
    out = tmp_path / 'run'
    shutil.copytree(prepared, out)
    b = bytearray((out / 'weights.wof').read_bytes())
    b[-8:-4] = b'\xff\xff\xff\x7f'
    (out / 'weights.wof').write_bytes(bytes(b))
    code, err = says(['run', out, '--python'])
    assert code == 2 and 'weights.wof: 1 of its weights are NaN or Inf: the file is damaged' in err, err


def test_prepare_takes_the_data_positionally_as_evaluate_does(files, tmp_path):
    """`prepare MODEL DATA -o OUT` (as `evaluate MODEL DATA`): it had said only
    'unrecognized arguments: DATA'; two different data files are refused, naming both."""
    d, model, data = files
    code, err = says(['prepare', model, data, '-o', tmp_path / 'a', '--loss', 'scce'])
    assert code == 0, err
    code, err = says(['prepare', model, '--data', data, '-o', tmp_path / 'b', '--loss', 'scce'])
    assert code == 0, err
    for f in ('train.ds', 'train.json'):
        assert open(tmp_path / 'a' / f, 'rb').read() == open(tmp_path / 'b' / f, 'rb').read()
    other = str(d / 'other.npz')
    shutil.copy(data, other)
    code, err = says(['prepare', model, data, '--data', other, '-o', tmp_path / 'c'])
    assert code == 2 and 'two data files' in err and other in err and data in err
    assert not (tmp_path / 'c').exists()


def test_export_takes_the_file_to_write_positionally(files, tmp_path):
    """`export MODEL WEIGHTS OUT` (a new user's first try, as `prepare MODEL DATA`): it
    had said '-o/--output is required'; the same file as with -o; two different files to
    write are refused naming both, none at all says what to give."""
    d, model, data = files
    code, err = says(['prepare', model, data, '-o', tmp_path / 'a', '--loss', 'scce'])
    assert code == 0, err
    w = str(tmp_path / 'a' / 'weights.wof')
    ext = os.path.splitext(model)[1]
    code, err = says(['export', model, w, tmp_path / f'p{ext}'])
    assert code == 0, err
    code, err = says(['export', model, w, '-o', tmp_path / f'o{ext}'])
    assert code == 0, err
    assert open(tmp_path / f'p{ext}', 'rb').read() == open(tmp_path / f'o{ext}', 'rb').read()
    code, err = says(['export', model, w, tmp_path / f'x{ext}', '-o', tmp_path / f'y{ext}'])
    assert code == 2 and 'two files to write' in err and f'x{ext}' in err and f'y{ext}' in err
    assert not (tmp_path / f'x{ext}').exists() and not (tmp_path / f'y{ext}').exists()
    code, err = says(['export', model, w])
    assert code == 2 and 'give the model file to write, e.g. -o trained' in err, err


def test_an_unknown_setting_is_refused_at_prepare(files, tmp_path):
    """prepare(..., float32=True) from Python (the command line's --float32 is int8=False)
    was written into train.json, and the run refused it on the board; now prepare refuses
    it, naming it and the settings, and writes nothing."""
    from host_tools.graph.passes import PrepareError
    d, model, data = files
    with pytest.raises(PrepareError, match="'float32' is none of its settings.*lr"):
        prepare(model, str(tmp_path / 'r'), data=data, float32=True, log=lambda *a: None)
    assert not (tmp_path / 'r').exists()


@pytest.mark.parametrize('name, custom, want', [
    ('CUSTOM', 'FlexTensorListReserve', r'op 0 is CUSTOM \(FlexTensorListReserve\), which utrain '
     r'cannot .*SELECT_TF_OPS.*TFLite Micro cannot run either.*unroll=True'),
    ('CUSTOM8', 'FlexTensorListReserve', r'op 0 is CUSTOM \(FlexTensorListReserve\), which utrain '
     r'cannot .*SELECT_TF_OPS.*TFLite Micro cannot run either.*unroll=True'),
    ('CUSTOM', 'TFLite_Detection_PostProcess', r'op 0 is CUSTOM \(TFLite_Detection_PostProcess\)'
     r'.*only its own runtime implements.*supported: ADD'),
    ('UNIDIRECTIONAL_SEQUENCE_RNN', None, r'op 0 is UNIDIRECTIONAL_SEQUENCE_RNN \(a recurrent '
     r'layer as one fused op\).*unroll=True')])
def test_an_op_utrain_lacks_is_refused_with_what_to_convert_instead(tmp_path, name, custom, want):
    """Issue 28 (real Keras files from GitHub: LSTM fall detectors and activity nets
    converted with SELECT_TF_OPS): a CUSTOM op is named with its custom code, and a Flex
    op (a TensorFlow op the converter kept) or a fused recurrent op says how to convert
    the layer to ops utrain trains, not only the list of supported ops."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.graph.passes import PrepareError
    from host_tools.prepare.pipeline import prepare
    b = CircleBuilder(identifier=b'TFL3')
    # (CUSTOM8: in an int8 model, whose int8 path named it 'not supported by int8 training'
    # with no word of Flex: a real GitHub int8 GRU file)
    q = {'dtype': 'int8', 'quant': {'scale': [0.05], 'zero_point': [0]}} if name == 'CUSTOM8' else {}
    x, y = b.tensor('x', [1, 4], **q), b.tensor('y', [1, 4], **q)
    b.op(name.rstrip('8'), [x], [y], **({'custom_code': custom} if custom else {}))
    b.inputs(x)
    b.outputs(y)
    path = str(tmp_path / 'm.tflite')
    b.save(path)
    with pytest.raises(PrepareError, match=want):
        prepare(path, str(tmp_path / 'o'), log=lambda *a: None)
