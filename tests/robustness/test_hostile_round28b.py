"""Session 28's second hostile-input round (h65c): an .onnx scored where ONNX Runtime is
not installed, --output given as the file's place of an output, a binary (1 - p, p) head
given three classes, and the exit code after Ctrl-C.  Each had been refused with a
wrong or no way on, taken in a way the user did not ask, or ended otherwise than said."""
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from test_refusals import says  # noqa: E402


def _conv_onnx(path, seed=0):
    """A small NCHW ONNX classifier: Conv 2->3 3x3, Relu, Flatten, Gemm 48->3, Softmax."""
    r = np.random.default_rng(seed)
    x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, 3])
    inits = [helper.make_tensor('w', TensorProto.FLOAT, [3, 2, 3, 3],
                                r.standard_normal(54).astype(np.float32)),
             helper.make_tensor('b', TensorProto.FLOAT, [3], r.standard_normal(3).astype(np.float32)),
             helper.make_tensor('fw', TensorProto.FLOAT, [48, 3],
                                (r.standard_normal(144) * .2).astype(np.float32)),
             helper.make_tensor('fb', TensorProto.FLOAT, [3], np.zeros(3, np.float32))]
    nodes = [helper.make_node('Conv', ['x', 'w', 'b'], ['c'], pads=[1, 1, 1, 1]),
             helper.make_node('Relu', ['c'], ['r']),
             helper.make_node('Flatten', ['r'], ['f']),
             helper.make_node('Gemm', ['f', 'fw', 'fb'], ['g']),
             helper.make_node('Softmax', ['g'], ['y'], axis=1)]
    onnx.save(helper.make_model(helper.make_graph(nodes, 'g', [x], [y], inits),
                                opset_imports=[helper.make_opsetid('', 17)]), path)
    return os.fspath(path)


# ------------------------------------------------------------------ evaluate without ONNX Runtime
def test_evaluate_of_an_onnx_without_onnx_runtime_runs_utrains_own_forward(tmp_path,
                                                                           monkeypatch):
    """evaluate of an .onnx where onnxruntime is not installed was refused ('pip install
    onnxruntime') where a .circle no reference runtime runs falls back to utrain's own
    forward: utrain reads the .onnx itself, so it scores it so, saying which runtime did,
    the same score as ONNX Runtime's (the samples in the file's NCHW layout)."""
    from host_tools.prepare.infer import evaluate
    model = _conv_onnx(tmp_path / 'c.onnx')
    r = np.random.default_rng(1)
    np.savez(tmp_path / 'd.npz', x=r.standard_normal((10, 2, 4, 4)).astype(np.float32),
             y=np.arange(10) % 3)
    ref = evaluate(model, tmp_path / 'd.npz') if 'onnxruntime' in sys.modules or \
        __import__('importlib').util.find_spec('onnxruntime') else None
    monkeypatch.setitem(sys.modules, 'onnxruntime', None)      # (import raises ImportError)
    got = evaluate(model, tmp_path / 'd.npz')
    assert got['runtime'].startswith('utrain\'s own forward') and \
        'pip install onnxruntime' in got['runtime'], got
    if ref is not None:
        assert ref['runtime'] == 'ONNX Runtime'
        assert got['hits'] == ref['hits'] and abs(got['loss'] - ref['loss']) < 1e-4, (got, ref)
    code, err = says(['evaluate', model, tmp_path / 'd.npz'])
    assert code == 0, err


@pytest.mark.parametrize('classes', [3, 2])
def test_evaluate_of_an_skl2onnx_classifier_without_onnx_runtime(tmp_path, monkeypatch,
                                                                  classes):
    """The same for a model of several outputs (skl2onnx's MLPClassifier: a label output
    utrain leaves out, and the probabilities; a binary one's (1 - p, p)): scored on the
    output utrain trains, as ONNX Runtime scores it."""
    from host_tools.prepare.infer import evaluate
    model, x = _skl(tmp_path, 1 if classes == 2 else classes)
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(12) % 2)
    ref = evaluate(model, tmp_path / 'd.npz')
    monkeypatch.setitem(sys.modules, 'onnxruntime', None)
    got = evaluate(model, tmp_path / 'd.npz')
    assert got['runtime'].startswith('utrain\'s own forward') and ref['runtime'] == 'ONNX Runtime'
    assert got['hits'] == ref['hits'] and abs(got['loss'] - ref['loss']) < 1e-4 and \
        got['output'] == ref['output'], (got, ref)


# ------------------------------------------------------------------ --output as the file's place
def _skl(tmp_path, n):
    from test_onnx import _skl_mlp_classifier
    r = np.random.default_rng(0)
    model = os.fspath(tmp_path / 'skl.onnx')
    _skl_mlp_classifier(model, r.standard_normal((4, 5)).astype(np.float32),
                        r.standard_normal(5).astype(np.float32),
                        r.standard_normal((5, n)).astype(np.float32),
                        r.standard_normal(n).astype(np.float32))
    return model, r.standard_normal((12, 4)).astype(np.float32)


@pytest.mark.parametrize('classes', [3, 2])
def test_output_takes_the_files_place_of_an_output(tmp_path, classes):
    """skl2onnx's MLPClassifier lists output_label, then output_probability: --output 1
    (its place, as ONNX Runtime and Netron number it) was refused, the refusal listing
    '0 'probabilities''.  It is the probabilities utrain trains, and the listings say the
    file's place beside utrain's."""
    model, x = _skl(tmp_path, 1 if classes == 2 else classes)
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(12) % 2)
    code, err = says(['prepare', model, tmp_path / 'd.npz', '-o', tmp_path / 'r', '--lr',
                      '0.05', '--output', '1', '--epochs', '1'])
    assert code == 0, err
    code, err = says(['evaluate', model, tmp_path / 'd.npz', '--output', '1'])
    assert code == 0, err
    code, err = says(['evaluate', model, tmp_path / 'd.npz', '--output', '0'])
    assert code == 0, err       # (utrain's 0 stays what it was)
    code, err = says(['evaluate', model, tmp_path / 'd.npz', '--output', '2'])
    assert code == 2 and "(the file's output 1, 'output_probability')" in err, err


# ------------------------------------------------------------------ a binary head given 3 classes
@pytest.mark.parametrize('labels,advice', [
    ([0, 1, 2], 'a model of 3 classes ending in a softmax over 3 outputs'),
    ([1, 2], 'np.searchsorted([1, 2], y)')])
def test_a_two_class_head_given_other_labels_is_refused(tmp_path, labels, advice):
    """A model ending in Concat(1 - p, p) of a sigmoid (skl2onnx's binary MLPClassifier),
    which utrain trains as p with bce on labels 0 and 1 (its note says so), given labels
    0/1/2 or 1/2: mse was chosen (bce with --loss bce) with a warning that the sigmoid
    cannot reach them, and it trained.  Refused by prepare (nothing written) and evaluate,
    saying what to give."""
    model, x = _skl(tmp_path, 1)
    np.savez(tmp_path / 'd.npz', x=x, y=np.array(labels * 12)[:12])
    for extra in ([], ['--loss', 'bce']):
        code, err = says(['prepare', model, tmp_path / 'd.npz', '-o', tmp_path / 'r', '--lr',
                          '0.05', '--epochs', '1'] + extra)
        assert code == 2 and f'{tmp_path / "d.npz"}: labels ' in err and \
            'with bce on labels 0 and 1: give labels 0 and 1' in err and advice in err, err
        assert not (tmp_path / 'r').exists()
    code, err = says(['evaluate', model, tmp_path / 'd.npz'])
    assert code == 2 and 'give labels 0 and 1' in err, err
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(12) % 2)        # (0 and 1 train)
    code, err = says(['prepare', model, tmp_path / 'd.npz', '-o', tmp_path / 'r', '--lr',
                      '0.05', '--epochs', '1'])
    assert code == 0, err


# ------------------------------------------------------------------ exit 130, never by the signal
LATE = '''
import os, signal, sys, types
from host_tools import cli

# (a terminal's Ctrl-C raises KeyboardInterrupt: a shell without job control starts a
# background job with SIGINT ignored, which CPython then leaves ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)

class Late:         # (a Ctrl-C during CPython's teardown of the modules, as a second
    # press after 'stopped', or one as the command ends, comes)
    def __del__(self, kill=signal.raise_signal, sig=signal.SIGINT):
        kill(sig)

m = types.ModuleType('late')
m.late = Late()
sys.modules['late'] = m
if sys.argv[1] == 'stopped':        # (a Ctrl-C in the command too)
    def stop(a):        # (raised in this thread: os.kill may hand it to another, whose
        signal.raise_signal(signal.SIGINT)      # signal never wakes this one's sleep)
        import time
        time.sleep(5)
    cli.cmd_inspect = stop
from host_tools.__main__ import run
sys.argv = ['utrain', 'inspect', sys.argv[2]]
sys.exit(run())
'''


@pytest.mark.parametrize('case,code', [('stopped', 130), ('refused', 2)])
def test_a_ctrl_c_during_the_teardown_leaves_the_exit_code(tmp_path, case, code):
    """A SIGINT while CPython tears the modules down after the command (it sets SIGINT
    back to the system's default first): the process ended by the signal (-2 to its
    parent, no exit code) after printing 'stopped (Ctrl-C): ... did not finish', or after
    a refusal.  The exit code is the command's: 130 after a Ctrl-C, 2 after a refusal."""
    import subprocess
    from repo import ROOT
    (tmp_path / 'late.py').write_text(LATE)
    if case == 'stopped':
        from test_pipeline import small_mlp
        model = small_mlp(str(tmp_path / 'm.circle'))
    else:
        model = tmp_path / 'none.circle'
    r = subprocess.run([sys.executable, tmp_path / 'late.py', case, model], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == code and 'Traceback' not in r.stderr, (r.returncode, r.stderr)
    assert ('stopped (Ctrl-C): inspect did not finish' if case == 'stopped' else 'error: ') \
        in r.stderr, r.stderr
