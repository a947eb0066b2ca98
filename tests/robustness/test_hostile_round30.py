"""Session 30's hostile-input round (h67e, 930 cases from a driver outside the repo): data,
models and paths of an unusual but real form. A CSV whose first row of numbers has a gap
or a number written another way, a table separated by spaces or by ';' with decimal
commas, or pandas' index column; arrays of no values a sample; values too close together
for a uint8 step; a test split that holds out none; --label or --size the data does not
read; a model input with no batch dimension; an .onnx of an opset ONNX Runtime does not
know, or with a constant output; weights exported into another model file; links that
lead nowhere; a named pipe as the data; a terminal that cannot print a name; -o the
tool's own board code, a '~' the shell left, or a name ending in '/'. Each had been
taken without a word (the first sample dropped as a header, no test set, a folder named
'~'), ended in a traceback or a hang, left files it then called damaged, or said what
was wrong and not what to do."""
import numpy as np
import pytest

from test_refusals import files, prepared, says  # noqa: E402,F401  (a model, samples)


def _rows(data, sep=',', cell=str):
    z = np.load(data)
    return '\n'.join(sep.join([cell(f'{v:.4f}') for v in xs] + [str(int(c))])
                     for xs, c in zip(z['x'], z['y'])) + '\n'


# ------------------------------------------------------------------ a CSV's first row
@pytest.mark.parametrize('gap, says_', [
    ('NA', "line 1: column 2 holds 'NA', a missing value: fill it in"),
    ('', 'line 1: column 2 is empty: fill it in'),
    ('\u22121.5', "line 1: not a number in column 2 ('\u22121.5'); the number is written with "
                  "'\u2212' (Unicode minus): write '-'"),
    ('"1,5"', "line 1: not a number in column 2 ('1,5'); the number is written with a decimal "
              "comma: write '.'"),
])
def test_a_first_row_of_numbers_with_a_gap_is_no_header(files, tmp_path, gap, says_):
    """A first row of numbers with one gap or one number written otherwise was taken for a
    header and dropped, unsaid (23 of 24 samples trained on and scored); the same cell on
    line 2 was refused.  It is refused on line 1, saying what to write."""
    d, model, data = files
    lines = _rows(data).split('\n')
    cells = lines[0].split(',')
    cells[1] = gap
    p = tmp_path / 'd.csv'
    p.write_text('\n'.join([','.join(cells)] + lines[1:]))
    for cmd in (['evaluate', model, p], ['dataset', p, '-o', tmp_path / 'ds']):
        code, err = says(cmd)
        assert code == 2 and f'{p}: {says_}' in err, err


@pytest.mark.parametrize('header', ['f0,f1,f2,f3,f4,f5,label', '0,1,2,3,4,5,label', ',a,b,c,d,e,y'])
def test_a_header_of_names_is_still_skipped(files, tmp_path, header):
    """pandas' header of a frame with integer column names ('0,1,...,label') is a header."""
    d, model, data = files
    p = tmp_path / 'h.csv'
    p.write_text(header + '\n' + _rows(data))
    code, err = says(['evaluate', model, p])
    assert code == 0, err


@pytest.mark.parametrize('sep, says_', [
    (' ', "line 1 is one column of values separated by ' '"),
    (';', "line 1 is values separated by ';' with decimal commas"),
])
def test_a_table_of_another_separator_says_how_to_save_it(files, tmp_path, sep, says_):
    """Spaces between the values, or ';' with decimal commas (a spreadsheet of a comma
    locale): line 1 was taken for a header, and line 2 was 'not a number in column 1 (...);
    a CSV of numbers is expected'."""
    d, model, data = files
    p = tmp_path / 'd.csv'
    p.write_text(_rows(data, sep, (lambda v: v.replace('.', ',')) if sep == ';' else str))
    code, err = says(['prepare', model, p, '-o', tmp_path / 'o', '--lr', '0.1'])
    assert code == 2 and f'{p}: {says_}' in err and "to_csv(path, sep=','" in err, err
    assert not (tmp_path / 'o').exists()


# ------------------------------------------------------------------ arrays dataset cannot store
@pytest.mark.parametrize('name', ['x', 'y'])
def test_dataset_of_an_array_of_no_values_a_sample_is_refused(files, tmp_path, name):
    """`dataset` of x or y of shape (N, 0): an IndexError traceback (y) or numpy's 'zero-size
    array to reduction operation minimum which has no identity' (x)."""
    d, model, data = files
    z = dict(np.load(data))
    z[name] = np.zeros((len(z['y']), 0), np.float32)
    p = tmp_path / 'e.npz'
    np.savez(p, **z)
    code, err = says(['dataset', p, '-o', tmp_path / 'ds'])
    assert code == 2 and f'{p}: {name} has shape (24, 0): no values a sample' in err, err


@pytest.mark.parametrize('cmd', ['dataset', 'prepare'])
def test_values_too_close_for_a_uint8_step_are_refused_before_writing(files, tmp_path, cmd):
    """Values within about 1e-36 of each other stored as uint8: the step float32 holds as 0
    was written into the header, and `dataset` then refused the train.ds it had just
    written ('damaged header: ... scale 0.0 ... write the file again'), leaving it."""
    d, model, data = files
    z = dict(np.load(data))
    z['x'] = np.full(z['x'].shape, 1e-44, np.float32)
    p = tmp_path / 'tiny.npz'
    np.savez(p, **z)
    out = tmp_path / 'o'
    argv = (['dataset', p, '-o', out] if cmd == 'dataset' else
            ['prepare', model, p, '-o', out, '--dtype', 'uint8', '--lr', '0.1'])
    code, err = says(argv)
    assert code == 2 and 'smaller than float32 holds' in err and '--dtype float32' in err, err
    assert not (out / 'train.ds').exists()


# ------------------------------------------------------------------ models
def _model(path, shape=(1, 6), w_rows=3):
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder()
    x = b.tensor('x', list(shape))
    w = b.tensor('w', [w_rows, 6], data=np.ones((w_rows, 6), np.float32))
    bias = b.tensor('b', [w_rows], data=np.zeros(w_rows, np.float32))
    z = b.tensor('z', [1, w_rows])
    p = b.tensor('p', [1, w_rows])
    b.op('FULLY_CONNECTED', [x, w, bias], [z])
    b.op('SOFTMAX', [z], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    return b.save(str(path))


@pytest.mark.parametrize('cmd', ['evaluate', 'prepare'])
def test_an_input_without_a_batch_dimension_says_how_to_export_it(files, tmp_path, cmd):
    """An input of shape [6] (no batch dimension): evaluate had ended in ONERT's words
    ('cannot run it (Session preparation failed: name 'Oner' is not defined): ...
    UserWarning: infer() called with input 0's shape=(1,)'), prepare in 'the batch
    dimension must be 1' and nothing of what to do."""
    d, _, data = files
    model = _model(tmp_path / 'flat.circle', shape=(6,))
    argv = (['evaluate', model, data] if cmd == 'evaluate' else
            ['prepare', model, data, '-o', tmp_path / 'o', '--lr', '0.1'])
    code, err = says(argv)
    assert code == 2 and "tensor 0 ('x') has shape [6]: no batch dimension" in err \
        and 'export it with a batch dimension' in err and 'Oner' not in err, err


def test_prepares_refusal_of_a_damaged_model_says_what_to_do(files, tmp_path):
    """A tensor of a 0 dimension: inspect and evaluate said 'the file is damaged ...: use the
    original (or export it again)', prepare only 'every dimension must be at least 1'."""
    d, _, data = files
    model = _model(tmp_path / 'zero.circle', w_rows=0)
    code, err = says(['prepare', model, data, '-o', tmp_path / 'o', '--lr', '0.1'])
    assert code == 2 and 'every dimension must be at least 1' in err \
        and 'use the original (or export it again)' in err, err


# ------------------------------------------------------------------ a test split of none
@pytest.mark.parametrize('cmd', ['prepare', 'dataset'])
def test_a_test_split_that_holds_out_no_sample_is_refused(files, tmp_path, cmd):
    """--test-split 0.01 of 24 samples: 0 test samples, and the run went on without the
    test set asked for ('data: 24 train, 0 test'), its best weights judged on nothing held
    out.  0.99 (none left to train on) had been refused; now this end is too."""
    d, model, data = files
    out = tmp_path / 'o'
    argv = (['prepare', model, data, '-o', out, '--lr', '0.1'] if cmd == 'prepare' else
            ['dataset', data, '-o', out]) + ['--test-split', '0.01']
    code, err = says(argv)
    assert code == 2 and '--test-split 0.01 of 24 samples holds out none' in err \
        and 'give at least 0.042' in err, err
    assert not (out / 'train.ds').exists()


# ------------------------------------------------------------------ options the data does not read
@pytest.mark.parametrize('cmd', ['evaluate', 'dataset'])
def test_a_data_option_the_data_does_not_read_is_said(files, tmp_path, cmd):
    """--label first (a .csv's label column) and --size (an image folder's) given with an
    .npz had been taken without a word, the data read as if they had not been given."""
    d, model, data = files
    argv = (['evaluate', model, data] if cmd == 'evaluate' else
            ['dataset', data, '-o', tmp_path / 'ds']) + ['--label', 'first', '--size', '8x8']
    code, err = says(argv)
    assert code == 0 and f'{data}: --label first: the label column of a .csv' in err \
        and f'{data}: --size:' in err and err.count('leave it out') == 2, err


# ------------------------------------------------------------------ export into another model
def test_export_into_another_model_of_the_same_shapes_is_said(files, prepared, tmp_path):
    """Weights of a folder prepared from one model file, exported into another of the same
    shapes (a second model, another version of it): written without a word, the weights
    the run did not train that other file's.  A copy of the file is the same model."""
    import shutil
    from test_pipeline import small_mlp
    d, model, data = files
    other = small_mlp(str(tmp_path / 'other.circle'), seed=5)
    code, err = says(['export', other, prepared / 'weights.wof', '-o', tmp_path / 'o.circle'])
    assert code == 0 and f'{prepared}/weights.wof was trained in a folder prepared from {model}, ' \
        f'a file that differs from {other}' in err and f'export into {model}' in err, err
    copy = tmp_path / 'copy.circle'
    shutil.copy(model, copy)
    code, err = says(['export', copy, prepared / 'weights.wof', '-o', tmp_path / 'c.circle'])
    assert code == 0 and 'warning' not in err, err


# ------------------------------------------------------------------ links that lead nowhere
@pytest.mark.parametrize('loop', [True, False])
@pytest.mark.parametrize('cmd', ['inspect', 'evaluate', 'dataset', 'plot', 'run', 'prepare -o'])
def test_a_link_that_leads_nowhere_is_said_to_be_one(files, tmp_path, cmd, loop):
    """A symbolic link to a file moved away, or links in a loop, had been 'no such file' (of
    a name `ls` shows), 'no train.json here; run prepare first', or for prepare's -o
    'OUT.preparing: a part of the path is a file, not a folder'.  (A -o link to a folder
    not there yet is made, as before.)"""
    import os
    d, model, data = files
    link = tmp_path / 'link'
    os.symlink(tmp_path / 'loop' if loop else tmp_path / 'gone', link)
    if loop:
        os.symlink(link, tmp_path / 'loop')
    argv = {'inspect': ['inspect', link], 'evaluate': ['evaluate', model, link],
            'dataset': ['dataset', link, '-o', tmp_path / 'o'], 'plot': ['plot', link],
            'run': ['run', link, '--python'],
            'prepare -o': ['prepare', model, data, '-o', link, '--lr', '0.1']}[cmd]
    code, err = says(argv)
    if cmd == 'prepare -o' and not loop:
        assert code == 0 and (tmp_path / 'gone' / 'train.json').exists(), err
        return
    assert code == 2 and f'{link}: a symbolic link to ' in err and ('leads back to it (a loop'
                                                                   if loop else 'is not there') \
        in err and 'point the link at' in err, err


# ------------------------------------------------------------------ a terminal of another encoding
def test_names_a_terminal_cannot_print_are_escaped_not_an_error(tmp_path):
    """A model whose tensor names are not ASCII, inspected where the terminal's encoding is
    ASCII (LANG=C, PYTHONIOENCODING=ascii): "error: 'ascii' codec can't encode characters
    in position 6-8", half the listing printed.  The name is printed escaped."""
    import os
    import subprocess
    import sys
    from repo import ROOT
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder()
    x = b.tensor('\u5165\u529b', [1, 3])
    p = b.tensor('\u2013p', [1, 3])
    b.op('SOFTMAX', [x], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    model = b.save(str(tmp_path / 'm.circle'))
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'inspect', model], cwd=ROOT,
                       capture_output=True, env=dict(os.environ, PYTHONIOENCODING='ascii'),
                       timeout=60)
    assert r.returncode == 0 and b'\\u5165\\u529b' in r.stdout and b'\\u2013p' in r.stdout, r.stderr


# ------------------------------------------------------------------ -o the tool's own code
@pytest.mark.parametrize('cmd', ['prepare', 'dataset'])
def test_output_into_the_boards_code_folder_is_refused(files, cmd):
    """-o micro (run from the checkout, meaning a folder of that name elsewhere): train.json,
    the model and the samples had been written among the board's code, which deploy copies
    onto every board."""
    import os
    from repo import ROOT
    d, model, data = files
    micro = os.path.join(ROOT, 'micro')
    before = sorted(os.listdir(micro))
    argv = (['prepare', model, data, '--lr', '0.1'] if cmd == 'prepare' else
            ['dataset', data]) + ['-o', micro]
    code, err = says(argv)
    assert code == 2 and "utrain's own board code" in err and 'into another folder' in err, err
    assert sorted(os.listdir(micro)) == before


@pytest.mark.parametrize('extra', [0, 5])
def test_an_output_name_its_staging_folder_cannot_have_is_named_as_given(files, tmp_path, extra):
    """-o of a 250-byte name (the file system takes 255): prepare stages the folder as
    NAME.preparing (260), and the refusal had named that folder, which the user never
    gave, 'too long; use a shorter path'; it names the one given and the most it may be.
    A name 5 bytes shorter is prepared."""
    import os
    d, model, data = files
    out = tmp_path / ('r' * (245 + extra))
    code, err = says(['prepare', model, data, '--lr', '0.1', '--epochs', '1', '-o', out])
    if extra:
        assert code == 2 and f'{out}: a name of 250 bytes' in err and 'at most 245' in err, err
        assert '.preparing: ' not in err and not os.path.exists(out), err
    else:
        assert code == 0 and os.path.isfile(out / 'train.json'), err


# ------------------------------------------------------------------ a named pipe as the data
@pytest.mark.parametrize('cmd', ['evaluate', 'prepare'])
def test_a_named_pipe_given_as_an_npz_is_refused_not_waited_on(files, tmp_path, cmd):
    """A FIFO named x.npz (mkfifo) that no process writes: open() waited for a writer, the
    command forever.  An .npz or .ds is read by seeking, so a pipe cannot be one."""
    import os
    import subprocess
    import sys
    from repo import ROOT
    d, model, _ = files
    p = tmp_path / 'x.npz'
    os.mkfifo(p)
    argv = {'evaluate': ['evaluate', model, p],
            'prepare': ['prepare', model, p, '-o', tmp_path / 'o', '--lr', '0.1']}[cmd]
    r = subprocess.run([sys.executable, '-m', 'host_tools'] + [str(a) for a in argv], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f'{p}: a pipe (a FIFO), not a file' in r.stderr, r.stderr


# ------------------------------------------------------------------ an .onnx ONNX Runtime cannot load
def test_an_onnx_of_an_opset_onnx_runtime_does_not_know_is_scored_by_utrains_forward(tmp_path):
    """A model stamped with an opset newer than the installed ONNX Runtime knows (a newer
    exporter), which prepare takes and the board trains: evaluate had refused it with
    ONNX Runtime's page of words ('ValidateOpsetForDomain(...) ONNX Runtime only
    *guarantees* support ...').  utrain's own forward scores it, as where ONNX Runtime
    is not installed, saying why; the score is ONNX Runtime's on the same model at a
    known opset."""
    pytest.importorskip('onnxruntime')
    import onnx
    from test_hostile_round28b import _conv_onnx
    ok = _conv_onnx(tmp_path / 'ok.onnx')
    m = onnx.load(ok)
    m.opset_import[0].version = 99
    new = tmp_path / 'new.onnx'
    onnx.save(m, new)
    r = np.random.default_rng(0)
    data = tmp_path / 'd.npz'
    np.savez(data, x=r.normal(size=(6, 2, 4, 4)).astype(np.float32), y=r.integers(0, 3, 6))
    import io
    from contextlib import redirect_stdout
    from host_tools.cli import main as cli
    outs = []
    for m_ in (new, ok):
        o = io.StringIO()
        with redirect_stdout(o):
            assert cli(['evaluate', str(m_), str(data)]) == 0
        outs.append(o.getvalue())
    assert "utrain's own forward" in outs[0] and 'cannot load the file' in outs[0] \
        and 'Opset 99' in outs[0], outs[0]
    assert outs[0].split(' [')[0].split(': ')[1] == outs[1].split(' [')[0].split(': ')[1], outs


# ------------------------------------------------------------------ a '~' the shell left
def test_a_tilde_the_shell_did_not_expand_is_the_home_folder(files, tmp_path, monkeypatch):
    """-o "~/run" (quoted, or from a script's settings): a folder named '~' had been made in
    the current one, the run in it, unsaid."""
    d, model, data = files
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'home').mkdir()
    code, err = says(['prepare', model, data, '-o', '~/run', '--lr', '0.1'])
    assert code == 0 and (tmp_path / 'home' / 'run' / 'train.json').exists(), err
    assert not (tmp_path / '~').exists()


# ------------------------------------------------------------------ an output named as a folder
@pytest.mark.parametrize('cmd', ['export', 'plot'])
def test_an_output_ending_in_a_slash_of_no_folder_says_to_give_a_file_name(prepared, files,
                                                                          tmp_path, cmd):
    """-o new/ (a folder not there): export had said 'cannot write it (Not a directory,
    41583935488 bytes free there, 1184 bytes needed)', plot matplotlib's "Format '' is not
    supported"."""
    d, model, _ = files
    out = str(tmp_path / 'new') + '/'
    log = tmp_path / 'train.log'
    log.write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'
                   '1,0.5,0.7,0.4,0.8,3,\n2,0.4,0.8,0.3,0.9,3,\n')
    argv = (['export', model, prepared / 'weights.wof', '-o', out] if cmd == 'export' else
            ['plot', log, '-o', out])
    code, err = says(argv)
    assert code == 2 and f"{out}: names a folder (it ends in '/')" in err \
        and 'a file name, e.g.' in err, err
    assert not (tmp_path / 'new').exists()


def test_an_onnx_output_that_is_a_constant_says_what_to_do(tmp_path):
    """An .onnx whose graph lists an initializer among its outputs had been refused with
    "output 'b' is a constant", nothing of what to do."""
    import onnx
    from onnx import helper, TensorProto
    from test_hostile_round28b import _conv_onnx
    m = onnx.load(_conv_onnx(tmp_path / 'c.onnx'))
    m.graph.output.append(helper.make_tensor_value_info('b', TensorProto.FLOAT, [3]))
    p = tmp_path / 'oc.onnx'
    onnx.save(m, p)
    code, err = says(['inspect', p])
    assert code == 2 and "output 'b' is a constant" in err and 'export the model without' \
        in err, err


def test_datasets_default_split_of_a_few_samples_is_no_refusal(tmp_path):
    """`dataset`'s own 0.2 (not given) of 2 samples holds out none, as before, unrefused."""
    p = tmp_path / 'two.npz'
    np.savez(p, x=np.ones((2, 6), np.float32), y=np.array([0, 1]))
    code, err = says(['dataset', p, '-o', tmp_path / 'o'])
    assert code == 0 and (tmp_path / 'o' / 'train.ds').exists(), err


@pytest.mark.parametrize('header', [',0,1,2,3,4,5,6', ',f0,f1,f2,f3,f4,f5,label'])
def test_a_frames_index_column_is_named_not_read_as_data(files, tmp_path, header):
    """df.to_csv(path) keeps pandas' index (an empty header cell, the rows numbered
    0, 1, 2, ...): read as a value of each sample it had been 'targets have 2 values per
    sample, the model outputs 3', and the header ',0,1,...' of a frame of integer column
    names (all numbers but its empty first cell) is a header too."""
    d, model, data = files
    rows = _rows(data).strip().split('\n')
    p = tmp_path / 'pd.csv'
    p.write_text(header + '\n' + '\n'.join(f'{i},{r}' for i, r in enumerate(rows)) + '\n')
    code, err = says(['evaluate', model, p])
    assert code == 2 and f"{p}: column 1 holds the row numbers 0, 1, 2" in err \
        and 'index=False' in err, err
