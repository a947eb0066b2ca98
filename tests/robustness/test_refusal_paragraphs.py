"""Issue 28: refusals of a value no run can take are one paragraph saying what is wrong
and what to do.  --budget 0 / 1 / 1K / 20K (below the code and interpreter alone) had
printed the planner's whole report (its parts, 'nothing tried fits ...'), -5 and 'abc'
'(0 or more)'; a file that is not a training config given as --train-config said
'not an onert-micro training-config file (magic 20, want 29)'."""
import io
import os
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from host_tools.cli import main as cli  # noqa: E402
from test_pipeline import small_mlp, blobs  # noqa: E402


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp('para')
    return d, small_mlp(str(d / 'm.circle')), blobs(d, n=40)


def says(argv):
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = cli([str(a) for a in argv])
    return code, err.getvalue(), out.getvalue()


@pytest.mark.parametrize('budget', ['0', '1', '1K', '12K', '20K', '-5', 'abc', '-1K', '0.5'])
def test_an_absurd_budget_is_one_paragraph_saying_what_to_give(files, budget):
    d, m, data = files
    out = d / ('o' + budget)
    code, err, _ = says(['prepare', m, '-o', out, '--data', data, '--loss', 'scce',
                         '--budget=' + budget])
    assert code == 2 and 'Traceback' not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith('error: '), err
    assert f'--budget {budget}' in err and 'give --budget' in err, err
    assert '--board NAME' in err or '--board esp32' in err, err
    assert not os.path.exists(out), 'a refused prepare left a folder'


def test_a_budget_above_every_board_is_said(files):
    d, m, data = files
    code, err, out = says(['prepare', m, '-o', d / 'big', '--data', data, '--loss', 'scce',
                           '--budget', '100G'])
    assert code == 0
    assert '--budget 100G: more heap than any board profile has' in out + err


def _kinds(d, m, data):
    (d / 't.txt').write_text('op 1: all\n')
    (d / 't.json').write_text('{"ops": {"1": "all"}}')
    (d / 't.bin').write_bytes(bytes(range(128, 228)))
    (d / 't.empty').write_bytes(b'')
    tfl = d / 'm.tflite'
    raw = bytearray(open(m, 'rb').read())
    raw[4:8] = b'TFL3'
    tfl.write_bytes(bytes(raw))
    return {m: 'a circle model (.circle)', str(tfl): 'a TFLite model (.tflite)',
            data: 'a zip archive', d / 't.txt': 'text', d / 't.json': 'JSON text',
            d / 't.empty': 'it is empty', d / 't.bin': 'its first bytes are not one'}


def test_a_file_that_is_not_a_training_config_says_what_it_is_and_what_to_pass(files):
    d, m, data = files
    said = 0
    for f, kind in _kinds(d, m, data).items():
        code, err, _ = says(['prepare', m, '-o', d / 'tc', '--data', data, '--loss', 'scce',
                             '--train-config', f])
        assert code == 2 and 'Traceback' not in err, err
        assert 'magic' not in err and 'not a training-config (.tcfg) file' in err, err
        assert kind in err and '--train-config takes' in err and '--ranks' in err, (f, err)
        said += 1
    # a run folder's files given for it
    code, _, _ = says(['prepare', m, '-o', d / 'run', '--data', data, '--loss', 'scce'])
    assert code == 0
    for f, kind in (('weights.wof', "utrain's weights"), ('train.ds', "utrain's samples"),
                    ('model.flat', "utrain's board model")):
        code, err, _ = says(['prepare', m, '-o', d / 'tc', '--data', data, '--loss', 'scce',
                             '--train-config', d / 'run' / f])
        assert code == 2 and kind in err and 'magic' not in err, err


@pytest.mark.parametrize('name, profile', [('Pico 2', 'rp2350'), ('pico-2', 'rp2350'),
                                           ('esp32psram', 'esp32-psram'), ('ESP32 S3', 'esp32s3'),
                                           ('pico w', 'rp2040'), ('RPI-PICO2', 'rp2350')])
def test_a_board_spelled_with_other_separators_names_its_profile(name, profile):
    """'pico2' and 'esp32-s3' were known, 'Pico 2' and 'esp32psram' unknown boards."""
    from host_tools.target.runner import board_name
    assert board_name(name) == profile
    for bad in ('-', '', 'esp32-s3-psram', 'nrf52'):
        with pytest.raises(ValueError, match='unknown board'):
            board_name(bad)


def test_a_two_input_model_given_other_x_says_what_its_inputs_take(tmp_path):
    """evaluate had said numpy's 'cannot reshape array of size 0 into shape (48,3)' for an
    .npz whose x is one input's, and for a .csv of other rows; an .npz of no samples
    'not a readable .npz file (cannot reshape ...)'."""
    from test_several_io import build, samples
    two = build(tmp_path / 'two.tflite')
    img, meta, y = samples()
    cases = {'x.npz': dict(x=img, y=y), 'one.npz': dict(x=meta, y=y),
             'empty.npz': dict(img=img[:0], meta=meta[:0], y=y[:0])}
    for name, arrays in cases.items():
        np.savez(tmp_path / name, **arrays)
    np.savetxt(tmp_path / 'short.csv', np.c_[meta, y], delimiter=',')
    for name in ('x.npz', 'one.npz', 'short.csv', 'empty.npz'):
        for argv in (['evaluate', two, tmp_path / name],
                     ['prepare', two, '-o', tmp_path / 'o', '--data', tmp_path / name,
                      '--loss', 'scce', '--output', 'logits']):
            code, err, _ = says(argv)
            assert code == 2 and 'Traceback' not in err and 'reshape' not in err, err
            if name == 'empty.npz':
                assert 'holds no samples' in err, err
            elif argv[0] == 'evaluate' or name != 'short.csv':
                assert 'take 39 together' in err and 'img' in err and 'meta' in err, err


@pytest.mark.parametrize('extra, says_', [
    (['--rounds', '0'], '--rounds 0: the rounds in all, 1 or more'),
    (['--rounds=-1'], '--rounds -1: the rounds in all'),
    (['--epochs', '0'], '--epochs 0: local epochs per round, 1 or more'),
    (['--timeout', '0'], '--timeout 0: the seconds a board has'),
    (['--timeout=-1'], '--timeout -1'), (['--timeout', 'inf'], '--timeout inf'),
    (['--strategy', 'bogus'], "--strategy 'bogus': expected one of fedavg"),
    (['--split', 'dirichlet:inf'], 'dirichlet:A needs a number A > 0'),
    (['--test', 'DATA'], 'it reads as a zip archive'), (['--test', 'MODEL'], 'a circle model'),
    (['--ports', '/dev/null'], 'not both'), (['--resume'], 'leave --resume out')])
def test_fleet_settings_are_refused_before_any_board_is_set_up(files, extra, says_):
    """--rounds 0 had run no round and said 'no board answered in any round', --rounds -1
    raised IndexError once a fleet had run, --timeout 0 left every board out of every
    round, --epochs 0 trained train.json's epochs, --strategy, an .npz as --test and
    dirichlet:inf (numpy's RuntimeWarning) were refused after the boards were deployed."""
    pytest.importorskip('flwr')
    d, m, data = files
    run = d / 'fleetrun'
    if not run.exists():
        assert says(['prepare', m, '-o', run, '--data', data, '--loss', 'scce',
                     '--test-split', '0.25'])[0] == 0
    out = d / ('fl' + ''.join(c for c in ''.join(extra) if c.isalnum()))
    extra = [{'DATA': data, 'MODEL': m}.get(a, a) for a in extra]
    code, err, so = says(['fleet', run, '--boards', '2', '-o', out] + extra)
    assert code == 2 and 'Traceback' not in err and says_ in err, err
    assert 'deployed' not in so and not (out / 'flash').exists(), so


@pytest.mark.parametrize('extra, says_', [
    (['--select', 'auto', '--ranks', '0:all'], '--select auto chooses what trains, and --ranks'),
    (['--select', 'board', '--train', 'last:1'], 'leave out --train, or --select'),
    (['--select', 'auto', '--train-config', 'MODEL'], 'and --train-config says it too'),
    (['--select', 'board', '--select-layers=-1'], '--select-layers -1: 0 or more'),
    (['--select', 'auto', '--select-layers', '2'], 'give --select board, or leave'),
    (['--select-layers', '1'], 'give --select board')])
def test_select_with_what_it_replaces_is_refused(files, extra, says_):
    """--select had replaced --ranks, --train and --train-config saying nothing (a model
    given as --train-config was not even read); --select-layers -1 went into train.json,
    and --select-layers without --select board was dropped."""
    d, m, data = files
    out = d / 'sel'
    code, err, _ = says(['prepare', m, '-o', out, '--data', data, '--loss', 'scce',
                         '--board', 'pico'] + [m if a == 'MODEL' else a for a in extra])
    assert code == 2 and says_ in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(out)


def test_an_int8_run_below_its_code_is_one_paragraph_and_its_dequantized_need(tmp_path):
    """The int8 path's refusal of a budget below the code and interpreter had been the
    planner's report (planned parts, 'nothing tried fits'), twice: as int8 and
    dequantized."""
    from kerasgraphs import build_keras_int8_seq
    m, _, _ = build_keras_int8_seq(str(tmp_path / 'q.tflite'))
    rng = np.random.default_rng(0)
    from host_tools.formats.circle_io import read_model
    g = read_model(m)
    shape = g.tensors[g.inputs[0]].shape
    np.savez(tmp_path / 'd.npz', x=rng.normal(size=[40] + list(shape[1:])).astype(np.float32),
             y=rng.integers(0, 2, 40))
    code, err, _ = says(['prepare', m, '-o', tmp_path / 'o', '--data', tmp_path / 'd.npz',
                         '--loss', 'scce', '--budget', '20K'])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) <= 2, err
    assert '--budget 20K is less than the utrain code' in lines[0] and 'planned:' not in err


@pytest.fixture(scope='module')
def int8_runs(tmp_path_factory):
    """A keras int8 model trained dequantized and a float one trained as int8 (prepare
    --int8), each folder's trained.wof its starting weights."""
    import shutil
    from host_tools.prepare.pipeline import prepare
    from repo import ROOT
    d = tmp_path_factory.mktemp('exp')
    z = os.path.join(ROOT, 'bench', 'zoo', 'keras')
    q8, ft, data = (os.path.join(z, n) for n in ('mlp_int8.tflite', 'mlp_float.tflite',
                                                 'mlp_data.npz'))
    quiet = dict(log=lambda *a: None, loss='scce', epochs=1)
    prepare(q8, str(d / 'dq'), data=data, dequantize=True, **quiet)
    prepare(ft, str(d / 'ff'), data=data, int8=True, **quiet)
    for r in ('dq', 'ff'):
        shutil.copy(d / r / 'weights.wof', d / r / 'trained.wof')
    return d, q8, ft, data


def test_export_refuses_data_it_does_not_read_and_leaves_no_output_on_a_refusal(int8_runs, files):
    """export --quantized --data D that refuses D (missing, another model's samples) had
    written the int8 model first and left it; --data without --quantized, and with a
    float model trained as int8, was read by nothing, said nothing (a missing file too);
    a float model trained as int8 exported into any model given (its files are the run
    folder's), saying it was written into that one."""
    d, q8, ft, data = int8_runs
    _, m, blobs_npz = files
    for i, (argv, says_) in enumerate([
            ([q8, d / 'dq' / 'trained.wof', '--quantized', '--data', d / 'nope.npz'], 'no such'),
            ([q8, d / 'dq' / 'trained.wof', '--quantized', '--data', blobs_npz],
             'values per sample'),
            ([q8, d / 'dq' / 'trained.wof', '--data', data], 'only with --quantized'),
            ([ft, d / 'ff' / 'trained.wof', '--quantized', '--data', d / 'nope.npz'],
             'scales its training kept'),
            ([m, d / 'ff' / 'trained.wof', '--quantized'], 'not the model')]):
        out = d / ('o%d.tflite' % i)
        code, err, _ = says(['export'] + argv + ['-o', out])
        assert code == 2 and says_ in err and 'Traceback' not in err, (argv, err)
        assert not out.exists(), argv
    code, err, _ = says(['export', q8, d / 'dq' / 'trained.wof', '--quantized', '--data', data,
                         '-o', d / 'good.tflite'])
    assert code == 0 and (d / 'good.tflite').exists(), err


def test_int8_nothing_fits_names_what_is_over_the_budget():
    """Issue 28 (a real 224x224 int8 MobileNet from GitHub, --board esp32s3 --train last:3
    --cache): 'nothing tried fits: the code and interpreter alone take about 70 KB' of a
    1606 KB budget; the frozen prefix's int8 arena (1617 KB) was what did not fit.  The
    code and interpreter are named only where they take the budget."""
    from host_tools.plan.memory import short_of
    K = 1024
    big = {'total': 1997 * K, 'parts': {'code': 51 * K, 'interpreter': 19 * K,
                                        'activations (int8 arena) (prefix pass)': 1617 * K,
                                        'sums and scratch buffers (prefix pass)': 84 * K}}
    assert short_of(big, 1606 * K) == (
        'its largest part, activations (int8 arena) (prefix pass), takes about 1617 KB of '
        'the 1536 KB the budget leaves beside the code and interpreter')
    small = {'total': 140 * K, 'parts': {'code': 58 * K, 'interpreter': 23 * K,
                                         'activations (int8 arena)': 30 * K}}
    assert short_of(small, 100 * K) == 'the code and interpreter alone take about 81 KB'
    # (an unrolled int8 LSTM on an RP2040: the code and interpreter take over half, its
    # weights and layer table are what does not fit)
    rnn = {'total': 700 * K, 'parts': {'code': 100 * K, 'interpreter': 25 * K,
                                       'int8 weights': 300 * K, 'layer table': 264 * K}}
    assert short_of(rnn, 200 * K) == ('its largest part, int8 weights, takes about 300 KB of '
                                      'the 75 KB the budget leaves beside the code and '
                                      'interpreter')


def test_a_heap_refusal_names_no_setting_where_the_model_overflows_the_boards_flash(tmp_path):
    """A float model whose file and utrain's code alone overflow the board's flash file
    system (a 1.3 MB MLP on rp2040's 1408K): the heap refusal says no setting fits that
    board and names the boards with more flash, instead of advising '--batch 1 --train
    last:2' that prepare, given it, refuses for flash (Keras's 1.2 MB hard-disk MLP through
    ONNX on --board pico)."""
    from host_tools.formats.refmodels import mlp
    m = mlp(str(tmp_path / 'big.circle'), [640, 512, 3])
    assert 1200 * 1024 < os.path.getsize(m) < 1408 * 1024
    rng = np.random.default_rng(0)
    np.savez(tmp_path / 'd.npz', x=rng.standard_normal((8, 640)).astype(np.float32),
             y=rng.integers(0, 3, 8))
    code, err, _ = says(['prepare', m, '-o', tmp_path / 'o', '--data', tmp_path / 'd.npz',
                         '--board', 'rp2040', '--float32', '--lr', '0.01', '--epochs', '1'])
    assert code != 0 and 'training needs about' in err, err
    assert 'no setting fits rp2040' in err and 'rp2350 (3M)' in err, err
    assert not [v for v in err.split('\n') if v.strip().startswith('would fit:')
                and 'utrain frozen in' not in v], err


def test_the_flash_check_counts_the_weights_the_board_stores_not_the_files_size(tmp_path):
    """An ONNX model whose weights lie in an external .data file (torch.onnx's way for large
    models: the .onnx a few KB) stores its weights on the board all the same: prepare's
    flash check had reckoned the model at the .onnx file's size and prepared a 1.3 MB MLP
    for rp2040's 1408K file system, which deploy then refused (a GitHub CNN, 13 KB .onnx +
    1 MB model.onnx.data, on --board pico with the heap refusal's own advice)."""
    onnx = pytest.importorskip('onnx')
    from onnx import TensorProto as T, helper, numpy_helper
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.05, (640, 512)).astype(np.float32), 'w1')
    w2 = numpy_helper.from_array(rng.normal(0, 0.05, (512, 3)).astype(np.float32), 'w2')
    nodes = [helper.make_node('MatMul', ['x', 'w1'], ['h']), helper.make_node('Relu', ['h'], ['r']),
             helper.make_node('MatMul', ['r', 'w2'], ['z']),
             helper.make_node('Softmax', ['z'], ['y'], axis=-1)]
    g = helper.make_graph(nodes, 'g', [helper.make_tensor_value_info('x', T.FLOAT, [1, 640])],
                          [helper.make_tensor_value_info('y', T.FLOAT, [1, 3])], [w1, w2])
    m = str(tmp_path / 'm.onnx')
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), m,
                    save_as_external_data=True, all_tensors_to_one_file=True,
                    location='m.onnx.data', size_threshold=0)
    assert os.path.getsize(m) < 4096
    np.savez(tmp_path / 'd.npz', x=rng.standard_normal((8, 640)).astype(np.float32),
             y=rng.integers(0, 3, 8))
    common = ['prepare', m, '--data', tmp_path / 'd.npz', '--board', 'rp2040', '--lr', '0.01',
              '--epochs', '1']
    code, err, _ = says(common + ['-o', tmp_path / 'a', '--batch', '1', '--train', 'last:2',
                                  '--cache-on-host'])
    assert code != 0 and 'more than the 1408K file system of rp2040' in err, err
    assert not os.path.exists(tmp_path / 'a' / 'train.json')
    code, err, _ = says(common + ['-o', tmp_path / 'b'])
    assert code != 0 and 'no setting fits rp2040' in err, err


def test_the_flash_check_counts_the_prefix_cache_prepare_writes(tmp_path):
    """--cache-on-host writes train.ds.pfx (the frozen prefix's float32 output, a sample's
    cut: 8 KB for a 16x16x8 map), which the board holds beside the samples; prepare's flash
    check had left it out and prepared 150 samples whose caches alone (1.2 MB) overflow
    rp2040's 1408K.  Now refused, counting it, with how many samples fit; that many prepare."""
    from host_tools.formats.refmodels import small_cnn
    from host_tools.prepare.pipeline import prepare, PrepareError
    m = small_cnn(str(tmp_path / 'cnn.circle'), size=32, channels=8)
    rng = np.random.default_rng(0)

    def data(n):
        p = tmp_path / f'd{n}.npz'
        np.savez(p, x=rng.standard_normal((n, 32, 32, 1)).astype(np.float32),
                 y=rng.integers(0, 5, n))
        return str(p)
    kw = dict(board='rp2040', int8=False, cache='host', train='last:2', lr=0.01, epochs=1,
              log=lambda *a: None)
    with pytest.raises(PrepareError) as e:
        prepare(m, str(tmp_path / 'a'), data=data(150), **kw)
    msg = str(e.value)
    assert 'the prefix cache prepare writes' in msg and 'samples fit' in msg, msg
    n = int(msg.split('at most ')[1].split()[0])
    assert 40 < n < 150, msg
    s = prepare(m, str(tmp_path / 'b'), data=data(n), **kw)
    assert s['prefix_cache']['bytes'] > 8192 * n, s.get('prefix_cache')
