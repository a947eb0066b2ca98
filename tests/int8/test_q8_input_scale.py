"""Int8 runs on raw-range inputs (0..255 pixels into a conv whose Keras Rescaling(1/255)
the converter folded into its weights): the float path trains such a model on its input
times s (inscale.scale_input: SGD on the file's form diverges); the int8 path does the same
by relabelling scales (quant.relabel_input: the layers the input reaches read it at s x
their input scale and hold their weights at 1/s x theirs, the same integers), so QAS steps
them as the float scaled run does, where before they stepped 1/s^2 times too far (or the
model trained dequantized, much slower on a board).  Checked against the float scaled run
(float kernels: the reference), on unix MicroPython (viper) against the host, and by TFLite
Micro on the export."""
import json
import os

import numpy as np
import pytest

from repo import no_keep_best, board_and_host_runs
from kerasgraphs import build_raw_cnn, raw_images
from host_tools.formats.circle_io import read_model
from host_tools.prepare import fromfloat
from host_tools.prepare.pipeline import export, prepare
from host_tools.target import runner

MP = runner.find_micropython()
H, C, O = 8, 3, 3              # image H x H x C, O classes


def _weights(seed=0, depthwise=False):
    r = np.random.default_rng(seed)
    K = 2 * C if depthwise else 4
    return (0.4 * r.standard_normal((1, 3, 3, K) if depthwise else (K, 3, 3, C)) / 255,
            0.1 * r.standard_normal(K), 0.3 * r.standard_normal((O, K * 9)),
            0.1 * r.standard_normal(O))


def _build(path, w=None, depthwise=False):
    """x [1, H, H, C] (0..255) -> CONV_2D 3x3 RELU (weights with 1/255 folded in: Keras's
    Rescaling as the converter writes it; or DEPTHWISE_CONV_2D, multiplier 2) -> MAX_POOL 2
    -> RESHAPE -> FULLY_CONNECTED -> logits.  w: (conv weight, bias, FC weight, bias)."""
    return build_raw_cnn(path, w or _weights(0, depthwise), C, depthwise)


def _data(tmp_path, n=60, seed=3):
    return raw_images(tmp_path / 'd.npz', n, seed, H, C, O)[0]


def _named(path):
    return {t.name: np.asarray(t.data, np.float64) for t in read_model(path).tensors
            if t.data is not None and t.name in ('wc', 'bc', 'wf', 'bf')}


def _dequantized(path):
    """(conv weight, bias, FC weight, bias) of int8 model path, dequantized."""
    g = read_model(path)
    out = []
    for name in ('wc', 'bc', 'wf', 'bf'):
        t = next(t for t in g.tensors if t.name == name)
        s = np.asarray(t.quant['scale'], np.float64)
        ax = t.quant.get('quantized_dimension', 0)
        out.append(np.asarray(t.data, np.float64) * (
            s.reshape([-1 if i == ax else 1 for i in range(t.data.ndim)]) if s.size > 1 else s))
    return out


@pytest.mark.parametrize('depthwise,opt', [(False, 'sgd'), (True, 'sgd'), (False, 'adam')])
def test_int8_step_is_the_float_scaled_runs_step(tmp_path, depthwise, opt):
    """One SGD (or Adam) step on one 0..255 sample: the int8 run (a float model calibrated
    as int8, --int8) moves the conv's weights as the float run of the same weights (the
    int8 model's, dequantized) on the input times 1/128 does, within the int8 forward's
    rounding and half a weight step; as given (no relabelling) the SGD step is 16384
    times larger (Adam's 128): the conv's weights jump to the clamp."""
    src = _build(tmp_path / 'a.tflite', depthwise=depthwise)
    data = _data(tmp_path, n=1)
    kw = dict(loss='scce', from_logits=True, optimizer=opt, lr=0.3 if opt == 'sgd' else 0.15,
              batch=1, epochs=1)
    lines = []
    s = prepare(src, os.fspath(tmp_path / 'q'), data=data, int8=True, log=lines.append, **kw)
    assert s['int8'] and s['input_scale'] == 1 / 128, s
    said = [ln for ln in lines if 'trains as int8 on the input times 0.0078125' in ln]
    assert len(said) == 1 and 'op 0 reads it' in said[0] and 'model file keeps' in said[0], lines
    no_keep_best(tmp_path / 'q')
    code, out = runner.run(os.fspath(tmp_path / 'q'), python=True, stream=False)
    assert code == 0, out
    w0 = _dequantized(tmp_path / 'q' / fromfloat.INT8_MODEL)
    export(src, os.fspath(tmp_path / 'q' / 'trained.wof'), os.fspath(tmp_path / 'q8.tflite'))
    got = _named(tmp_path / 'q8.tflite')
    # the reference: the float path (float kernels) on the int8 model's own weights, scaled
    ref_src = _build(tmp_path / 'b.tflite', w0, depthwise=depthwise)
    r = prepare(ref_src, os.fspath(tmp_path / 'f'), data=data, log=lambda *a: None, **kw)
    assert not r.get('int8') and r['input_scale'] == 1 / 128
    no_keep_best(tmp_path / 'f')
    code, out = runner.run(os.fspath(tmp_path / 'f'), python=True, stream=False)
    assert code == 0, out
    export(ref_src, os.fspath(tmp_path / 'f' / 'trained.wof'), os.fspath(tmp_path / 'f.tflite'))
    want = _named(tmp_path / 'f.tflite')
    g8 = read_model(tmp_path / 'q' / fromfloat.INT8_MODEL)
    sw = np.asarray(next(t for t in g8.tensors if t.name == 'wc').quant['scale'])
    sw = sw.reshape([-1 if i == (3 if depthwise else 0) else 1 for i in range(4)])
    d8, df = (got['wc'] - w0[0]) / sw, (want['wc'] - w0[0]) / sw     # in weight steps
    assert np.abs(df).max() > 8, np.abs(df).max()       # (a step of many weight steps)
    err = np.abs(d8 - df)
    assert err.max() <= 0.5 + 0.1 * np.abs(df).max(), (err.max(), np.abs(df).max())
    assert np.dot(d8.ravel(), df.ravel()) / np.linalg.norm(d8) / np.linalg.norm(df) > 0.99
    for name, w in zip(('bc', 'wf', 'bf'), w0[1:]):     # the layers after it step alike too
        a, b = got[name] - w, want[name] - w
        if opt == 'sgd':
            assert np.abs(a - b).max() <= 0.1 * np.abs(b).max() + 1e-4, (name, a, b)
        else:       # (Adam's first step: +-lr where the gradient is not 0, whose sign the
            # int8 forward's rounding can flip where it is near 0)
            assert np.mean(np.sign(a) == np.sign(b)) > 0.8, (name, a, b)
    # without the relabelling (the input's rms unread: scale_input=False), QAS steps the
    # conv 1 / s^2 = 16384 times too far: its weights jump to the clamp at +-127 (their
    # scale doubled there, q8grow): 4.7-8x the float step on average (the int8 step
    # above: within 0.9-1.3 weight steps of the float step, whose largest is 20-50)
    s = prepare(src, os.fspath(tmp_path / 'n'), data=data, int8=True, scale_input=False,
                log=lambda *a: None, **kw)
    assert s['int8'] and not s['input_scale']
    no_keep_best(tmp_path / 'n')
    code, out = runner.run(os.fspath(tmp_path / 'n'), python=True, stream=False)
    assert code == 0, out
    export(src, os.fspath(tmp_path / 'n' / 'trained.wof'), os.fspath(tmp_path / 'n.tflite'))
    dn = (_named(tmp_path / 'n.tflite')['wc'] - w0[0]) / sw
    assert np.abs(dn).mean() > 3 * np.abs(df).mean(), (np.abs(dn).mean(), np.abs(df).mean())


def _int8_model(tmp_path, data, depthwise=False):
    """A full-integer int8 model of _build's (calibrated on data's 0..255 samples by
    prepare --int8: its input at scale ~1, the conv's weights at the folded 1/255)."""
    src = _build(tmp_path / 'float.tflite', depthwise=depthwise)
    prepare(src, os.fspath(tmp_path / 'cal'), data=data, int8=True, epochs=1,
            log=lambda *a: None, loss='scce', from_logits=True)
    g = read_model(tmp_path / 'cal' / fromfloat.INT8_MODEL)
    assert g.tensors[g.inputs[0]].dtype == 'int8' and g.tensors[g.inputs[0]].quant['scale'][0] > 0.5
    return os.fspath(tmp_path / 'cal' / fromfloat.INT8_MODEL)


def _losses_accs(text):
    rows = [v for v in text.splitlines() if v.startswith('epoch ')]
    return ([float(v.split(' loss ')[1].split()[0]) for v in rows],
            [float(v.split('test_accuracy ')[1].split()[0]) for v in rows])


def test_int8_model_on_raw_inputs_trains_as_int8_and_exports(tmp_path):
    """An int8 model on 0..255 samples trains as int8 (it trained dequantized before:
    much slower on a board), saying so; its loss falls and its test accuracy rises at
    prepare's defaults (as given, unrelabelled, the same run does not learn); export
    writes the trained int8 model at the file's scales, whose TFLite Micro accuracy on the
    run's test samples is the run's."""
    data = _data(tmp_path, n=240, seed=5)
    q8 = _int8_model(tmp_path, data)
    runs = {}
    for sc in (True, False):
        lines, out = [], os.fspath(tmp_path / f'r{sc}')
        s = prepare(q8, out, data=data, test_split=0.25, epochs=4, loss='scce',
                    from_logits=True, scale_input=sc, log=lines.append)
        assert s['int8'] and not s.get('dequantized_because'), s
        assert bool(s['input_scale']) == sc and any('trains as int8 on the input times' in ln
                                                    for ln in lines) == sc, lines
        no_keep_best(out)
        code, text = runner.run(out, python=True, stream=False)
        assert code == 0, text
        runs[sc] = _losses_accs(text) + (text,)
    (loss, acc, text), (loss0, acc0, _) = runs[True], runs[False]
    before = float(text.split('before training:')[1].split('test_accuracy ')[1].split()[0])
    assert loss[-1] < 0.5 * loss[0] and acc[-1] >= before + 0.3 and acc[-1] > 0.8, text
    assert loss0[-1] > 2 * loss[-1] and acc0[-1] < acc[-1] - 0.2, (runs[False][:2], loss, acc)
    pytest.importorskip('tflite_micro')
    from host_tools.prepare.infer import evaluate
    q = os.fspath(tmp_path / 'trained.tflite')
    export(q8, os.fspath(tmp_path / 'rTrue' / 'trained.wof'), q, quantized=True)
    g, g0 = read_model(q), read_model(q8)
    for t, t0 in zip(g.tensors, g0.tensors):    # the file's scales, trained integers
        if t is g.tensors[g.outputs[0]]:        # (but the logits': their range doubles as
            r = t.quant['scale'][0] / t0.quant['scale'][0]      # training grows them)
            assert r in (1, 2, 4, 8), r
            continue
        assert (t.quant or {}).get('scale') == (t0.quant or {}).get('scale'), t.name
    assert not np.array_equal(g.tensors[g.ops[0].inputs[1]].data,
                              g0.tensors[g0.ops[0].inputs[1]].data)
    ev = evaluate(q, os.fspath(tmp_path / 'rTrue' / 'test.ds'))
    assert ev['runtime'] == 'TFLite Micro' and abs(ev['accuracy'] - acc[-1]) < 1e-9, (ev, acc)


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('depthwise', [False, True])
def test_relabelled_int8_run_is_the_hosts_on_micropython(tmp_path, depthwise):
    """The relabelled int8 run (its scales from q8.json and q8.req, parsed as the board
    parses them) on unix MicroPython (viper kernels): the host's trained bytes and log,
    SGD at batch 1 and Adam at batch 4 (q8batch: the float masters at the relabelled
    weight scales)."""
    data = _data(tmp_path, n=40, seed=6)
    q8 = _int8_model(tmp_path, data, depthwise)
    for kw in (dict(optimizer='sgd', batch=1), dict(optimizer='adam', lr=0.005, batch=4)):
        out = tmp_path / f'm{kw["batch"]}'
        s = prepare(q8, os.fspath(out), data=data, test_split=0.25, epochs=2, loss='scce',
                    from_logits=True, log=lambda *a: None, **kw)
        assert s['int8'] and s['input_scale'] == 1 / 128
        (wb, _, lb), (wh, _, lh) = board_and_host_runs(out, 'train.json')
        assert wb == wh and lb == lh, kw


def test_an_int8_files_logits_follow_training(tmp_path, monkeypatch):
    """An int8 file whose first layer's outputs are large (a Keras Dense on 0..255 pixels,
    no Rescaling: its ReLUs at up to ~400) fine-tuned on classes it was not trained for:
    the first SGD steps on its logits' weights take the logits far past the converter's
    range, where they all clip and a clipped logit passes no gradient.  Its logits' range
    doubles as they grow (q8range, as a float model's calibrated as int8 does), and the
    run learns; held at the file's range (as int8 files were: only narrow logits
    followed) it stays at chance.  export --quantized writes the doubled scale: TFLite
    Micro's accuracy on the test samples is the run's."""
    from host_tools.prepare import quant
    data = _data(tmp_path, n=240, seed=5)
    wc, bc, wf, bf = _weights(0)
    src = _build(tmp_path / 'float.tflite', (wc * 50, bc * 50, wf / 12.5, bf))
    prepare(src, os.fspath(tmp_path / 'cal'), data=data, int8=True, epochs=1,
            log=lambda *a: None, loss='scce', from_logits=True)
    q8 = os.fspath(tmp_path / 'cal' / fromfloat.INT8_MODEL)
    d = np.load(data)                   # (new classes: the labels moved by one)
    np.savez(tmp_path / 'p.npz', x=d['x'], y=(d['y'] + 1) % O)
    widen = quant._widen_logits
    accs = {}
    for follow in (True, False):
        if not follow:
            def held(g):
                widen(g)
                g.follow_logits = 0
            monkeypatch.setattr(quant, '_widen_logits', held)
        out = os.fspath(tmp_path / f'r{follow}')
        # (lr given: the probe would choose one at which the logits do not clip)
        prepare(q8, out, data=os.fspath(tmp_path / 'p.npz'), test_split=0.25, epochs=3,
                loss='scce', from_logits=True, lr=0.01, log=lambda *a: None)
        with open(os.path.join(out, 'q8.json')) as f:
            assert ('rr' in json.load(f)) == follow
        no_keep_best(out)
        code, text = runner.run(out, python=True, stream=False)
        assert code == 0, text
        accs[follow] = _losses_accs(text)[1]
    assert accs[True][-1] > 0.9 and accs[False][-1] < 0.5, accs
    pytest.importorskip('tflite_micro')
    from host_tools.prepare.infer import evaluate
    monkeypatch.setattr(quant, '_widen_logits', widen)
    q = os.fspath(tmp_path / 'trained.tflite')
    export(q8, os.fspath(tmp_path / 'rTrue' / 'trained.wof'), q, quantized=True)
    g, g0 = read_model(q), read_model(q8)
    assert g.tensors[g.outputs[0]].quant['scale'][0] >= 2 * g0.tensors[g0.outputs[0]].quant['scale'][0]
    ev = evaluate(q, os.fspath(tmp_path / 'rTrue' / 'test.ds'))
    assert ev['runtime'] == 'TFLite Micro' and abs(ev['accuracy'] - accs[True][-1]) < 1e-9, (ev, accs)


def test_an_int8_files_trained_ranges_follow_training_under_adam(tmp_path, monkeypatch):
    """An int8 file calibrated as TensorFlow's converter calibrates (at the measured
    ranges, no headroom: fromfloat.HEADROOM 1) fine-tuned under Adam on a task its
    depthwise layer must learn anew (the images transposed): Adam grows that layer's
    outputs past the file's range at once, where they clip and a clipped value passes no
    gradient.  Its range doubles as they grow (q8range's 'rr' names it, as a float
    model's calibrated as int8 does), and the int8 run's loss tracks the dequantized run's
    epoch by epoch; with the logits' range alone following (as int8 files had) it ended
    3.4x the dequantized run's (the converter's depthwise Keras file under Adam at lr 0.01:
    10 points of accuracy under --dequantize over 7 seeds, 1 point with its ranges
    following)."""
    monkeypatch.setattr(fromfloat, 'HEADROOM', 1.0)
    data = _data(tmp_path, n=240, seed=5)
    q8 = _int8_model(tmp_path, data, depthwise=True)
    d = np.load(data)
    np.savez(tmp_path / 't.npz', x=np.swapaxes(d['x'], 1, 2), y=d['y'])
    losses = {}
    for deq in (False, True):
        out = os.fspath(tmp_path / f'r{deq}')
        s = prepare(q8, out, data=os.fspath(tmp_path / 't.npz'), test_split=0.25, epochs=4,
                    loss='scce', from_logits=True, optimizer='adam', lr=0.01, dequantize=deq,
                    log=lambda *a: None)
        assert bool(s.get('int8')) != deq, s
        if not deq:
            with open(os.path.join(out, 'q8.json')) as f:
                m = json.load(f)
            assert [(m['layers'][p]['k'], cs) for p, cs, _ in m['rr'][2]] == [
                (2, [2]), (0, [])], m['rr']     # (DEPTHWISE_CONV_2D read by the FC; the logits)
        no_keep_best(out)
        code, text = runner.run(out, python=True, stream=False)
        assert code == 0, text
        losses[deq] = _losses_accs(text)[0]
        if not deq:
            with open(os.path.join(out, 'trained.wof.q8s')) as f:
                assert json.load(f)[0] > 0      # (the depthwise layer's range doubled)
    q, f = losses[False], losses[True]
    assert all(abs(a - b) <= 0.25 * b for a, b in zip(q[1:], f[1:])), losses
