"""Issue 28: an input far larger than 1 (0..255 pixels into a Conv2D whose Keras
Rescaling(1/255) the converter folded into the conv's weights; raw sensor units) made SGD
at its default lr diverge: a weight's step grows with its input, squared in the update's
effect.  prepare trains such a model on its input times a power of two s near 1 / rms (a
MUL before the model, the weights the input reaches divided by s: inscale.scale_input),
which is the model Keras trained, with the scale in a layer of its own; export folds s
back.  Checked against that model built with its scale as a layer (the reference: the
same run on it must give the same weights, folded), ONERT on the rewrite (the same outputs
as the file), and the file form's run (its loss does not come down)."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
from repo import ROOT  # noqa: E402,F401

from kerasgraphs import build_raw_cnn, raw_images  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.files.wof import read_wof  # noqa: E402
from host_tools.prepare.pipeline import export, prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402

# LR: the tests below check what prepare writes and says of an input's scale, not the
# lr: given, prepare's lr probe (host_tools/prepare/lrprobe.py, over half of each such
# prepare's seconds) does not run
LR = 0.01

H, C, K, O = 8, 4, 3, 3


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return (0.5 * rng.standard_normal((C, K, K, 1)), 0.1 * rng.standard_normal(C),
            0.3 * rng.standard_normal((O, C * 9)), 0.1 * rng.standard_normal(O))


def _build(path, scale_layer=None, seed=0, depthwise=False):
    """x [1, H, H, 1] -> (MUL by scale_layer) -> CONV_2D 3x3 RELU (or DEPTHWISE) ->
    MAX_POOL 2 -> RESHAPE -> FULLY_CONNECTED -> logits.  Without scale_layer the conv's
    weight has 1/256 folded in (what the converter writes for Rescaling(1/256))."""
    w, bc, wf, bf = _weights(seed)
    w = w / (256 * scale_layer) if scale_layer else w / 256      # (the same model)
    return build_raw_cnn(path, (w.transpose(3, 1, 2, 0) if depthwise else w, bc, wf, bf),
                         depthwise=depthwise, scale_layer=scale_layer)


def _data(tmp_path, n=48, seed=3):
    """0..255 images whose class is the brightest third of the image (top, middle, bottom)."""
    return raw_images(tmp_path / 'd.npz', n, seed, H, 1, O)


def _run(src, out, data, **kw):
    lines = []
    s = prepare(src, os.fspath(out), data=data, loss='scce', from_logits=True,
                optimizer='sgd', lr=0.01, batch=1, epochs=3, log=lines.append, **kw)
    code, text = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    losses = [float(ln.split(' loss ')[1].split()[0]) for ln in text.splitlines()
              if ln.startswith('epoch ')]
    return s, lines, losses


@pytest.mark.parametrize('depthwise', [False, True])
def test_folded_input_scale_trains_as_the_model_with_its_scale_layer(tmp_path, depthwise):
    data, x, _ = _data(tmp_path)
    src = _build(tmp_path / 'folded.tflite', depthwise=depthwise)
    ref = _build(tmp_path / 'layer.tflite', scale_layer=1 / 128, depthwise=depthwise)
    s, lines, losses = _run(src, tmp_path / 'a', data)
    assert s['rewritten'] and any('times 0.0078125' in ln and 'export folds it back' in ln
                                  for ln in lines), lines
    g = read_model(tmp_path / 'a' / s['rewritten'])
    assert [op.name for op in g.ops][:2] == ['MUL', 'DEPTHWISE_CONV_2D' if depthwise else 'CONV_2D']
    # ONERT: the rewritten model computes what the file does
    from onert_ref import onert_infer
    np.testing.assert_allclose(onert_infer(os.fspath(tmp_path / 'a' / s['rewritten']), x[:6]),
                               onert_infer(src, x[:6]), rtol=1e-5, atol=1e-5)
    # the model with its scale as a layer (not rewritten: its input reaches a MUL first),
    # the layer frozen, trains to the same weights; the export folds s back into the file's form
    r, rlines, rlosses = _run(ref, tmp_path / 'b', data, train='last:4')   # (not its MUL)
    assert not any('times' in ln for ln in rlines)
    np.testing.assert_allclose(losses, rlosses, rtol=1e-5)
    assert losses[-1] < 0.5 * losses[0], losses          # it learns (3 epochs, lr 0.01)
    export(src, os.fspath(tmp_path / 'a' / 'trained.wof'), os.fspath(tmp_path / 'a.tflite'))
    export(ref, os.fspath(tmp_path / 'b' / 'trained.wof'), os.fspath(tmp_path / 'b.tflite'))
    ga, gb = read_model(tmp_path / 'a.tflite'), read_model(tmp_path / 'b.tflite')
    assert [op.name for op in ga.ops] == [op.name for op in read_model(src).ops]
    wa = {t.name: t.data for t in ga.tensors if t.data is not None}
    wb = {t.name: t.data for t in gb.tensors if t.data is not None}
    np.testing.assert_allclose(wa['wc'] * 128, wb['wc'], rtol=1e-5, atol=1e-6)
    for n in ('bc', 'wf', 'bf'):
        np.testing.assert_allclose(wa[n], wb[n], rtol=1e-5, atol=1e-6)
    assert not np.allclose(wa['wc'], read_model(src).tensors[
        next(t.index for t in ga.tensors if t.name == 'wc')].data)
    np.testing.assert_allclose(onert_infer(os.fspath(tmp_path / 'a.tflite'), x[:6]),
                               onert_infer(os.fspath(tmp_path / 'b.tflite'), x[:6]),
                               rtol=1e-4, atol=1e-4)


def test_the_file_form_diverges_and_small_inputs_stay(tmp_path):
    """Without the scale (prepare's scale_input=False) the same run ends at chance; data near 1 (rms < 2^2.5) and a frozen first layer are left as given."""
    data, x, y = _data(tmp_path)
    src = _build(tmp_path / 'folded.tflite')
    s, _, losses = _run(src, tmp_path / 'a', data)
    _, _, raw = _run(src, tmp_path / 'raw', data, scale_input=False)
    # (the file form's first epoch blows up and its ReLUs die: it ends at chance, ln 3)
    assert losses[-1] < 0.5 * losses[0] and raw[-1] > max(2 * losses[-1], 0.9 * np.log(O)), \
        (losses, raw)
    # frozen conv: nothing to scale for
    s, lines, _ = _run(src, tmp_path / 'f', data, train='last:1')
    assert not any('times' in ln for ln in lines)
    # inputs of rms about 4: left
    np.savez(tmp_path / 'small.npz', x=x / 40, y=y)
    s, lines, _ = _run(src, tmp_path / 's', os.fspath(tmp_path / 'small.npz'))
    assert not any('times' in ln for ln in lines)
    assert json.load(open(tmp_path / 's' / 'prepare.json'))['rewritten'] is None
    # weights that x 1 / s would overflow float32: left as they are
    from host_tools.graph.inscale import scale_input
    g = read_model(src)
    g.tensors[g.ops[0].inputs[1]].data = np.full_like(g.tensors[g.ops[0].inputs[1]].data, 1e36)
    g.input_rms = 1000.0
    assert scale_input(g, {id(op) for op in g.ops}) == 0 and len(g.ops) == 4
    g.tensors[g.ops[0].inputs[1]].data[:] = 1e30
    assert scale_input(g, {id(op) for op in g.ops}) == 2 ** -10 and g.ops[0].name == 'MUL'
    # rp2040 (no ulab) trains a float model as int8 (fromfloat): calibrated on the input as
    # given, scaled as the float run by relabelling the int8 scales (quant.relabel_input;
    # tests/int8/test_q8_input_scale.py), saying so
    lines = []
    s = prepare(src, os.fspath(tmp_path / 'r'), data=data, board='rp2040', lr=LR,
                log=lines.append)
    assert s.get('int8') and s['input_scale'] == 1 / 128
    assert any('trains as int8 on the input times 0.0078125' in ln for ln in lines), lines


def test_an_int8_model_on_large_inputs_trains_as_int8_scaled(tmp_path):
    """An int8 model whose input the float run would scale trains as int8 on the input
    scaled as the float run's, by relabelling its scales (it trained dequantized before:
    QAS stepped the first layer 1 / s^2 times too far); on inputs near 1 nothing is
    relabelled."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
    from kerasgraphs import build_int8_unary
    path, _, _ = build_int8_unary(tmp_path / 'q.tflite', 'RELU', sx=1.0)
    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, 24)
    for name, x, scaled in (('big', rng.integers(-120, 120, (24, 6)), True),
                            ('small', rng.uniform(-3, 3, (24, 6)), False)):
        np.savez(tmp_path / f'{name}.npz', x=x.astype(np.float32), y=y)
        lines = []
        s = prepare(path, os.fspath(tmp_path / name), data=os.fspath(tmp_path / f'{name}.npz'),
                    lr=LR, log=lines.append)
        assert s.get('int8') and not s.get('dequantized_because'), s
        assert s['input_scale'] == (1 / 64 if scaled else 0)
        assert any('trains as int8 on the input times 0.015625' in ln for ln in lines) == scaled


def test_samples_beyond_an_int8_input_are_warned_of(tmp_path):
    """Issue 28: an Edge Impulse style int8 model of 0..1 inputs (scale 1/255, zero point
    -128) given raw 0..255 pixels trained on them (dequantized, scaled) saying nothing of
    the units, while its int8 form clips every such value to 1: prepare warns and says
    what to divide by; and 0..1 samples for a model of raw 0..255 pixels (a held-out Keras
    Rescaling(1/255) model as int8: one step of its input in all) what to multiply by.
    Samples within the input's range, and a model whose int8 input
    holds raw units (Rescaling folded: scale 1), are not warned of."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
    from kerasgraphs import build_int8_unary
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 24)
    unit, _, _ = build_int8_unary(tmp_path / 'unit.tflite', 'RELU', sx=1 / 255, zx=-128)
    raw, _, _ = build_int8_unary(tmp_path / 'raw.tflite', 'RELU', sx=1.0)
    pix, _, _ = build_int8_unary(tmp_path / 'pix.tflite', 'RELU', sx=1.0, zx=-128)
    for model, name, x, warned in ((unit, 'pixels', rng.integers(0, 256, (24, 6)), True),
                                   (unit, 'unit', rng.uniform(0, 1, (24, 6)), False),
                                   (raw, 'raw', rng.integers(-120, 120, (24, 6)), False),
                                   (pix, 'few', rng.uniform(0, 1, (24, 6)), True)):
        np.savez(tmp_path / f'{name}.npz', x=x.astype(np.float32), y=y)
        lines = []
        prepare(model, os.fspath(tmp_path / name), data=os.fspath(tmp_path / f'{name}.npz'),
                lr=LR, log=lines.append)
        said = [ln for ln in lines if ln.startswith('warning: ') and 'int8 input holds' in ln]
        assert bool(said) == warned, lines
        if warned and name == 'pixels':
            assert 'outside 0 to 1' in said[0] and 'give x / 255' in said[0], said
        if name == 'few':       # issue 28: the other way round (0..1 for a 0..255 model)
            assert 'span 0' in said[0] and 'give x * 255' in said[0], said


@pytest.mark.parametrize('folded', [False, True])
def test_adam_steps_the_first_layer_in_the_files_units(tmp_path, folded):
    """Adam's step is lr in each weight's own units whatever the gradient's size, so the
    input scale moves the first layer's step by s relative to its weights.  A model trained
    on the raw 0..255 input (its conv's weights of ordinary size, rms 0.03): Adam takes the
    input as given and its first step moves those weights by lr (lr sign(g), in the file's
    units), as Keras's Adam on the same model does; scaled by 1/128 it moved them lr/128
    (h39i: a +-100 input lost 27-54 points of accuracy under Adam).  The folded Rescaling
    form (weights / 256) still trains scaled: its step lr/128 in the file's units is lr in
    the units of the model Keras trained (with the scale in a layer of its own)."""
    data, _, _ = _data(tmp_path, n=1)
    w = _weights()
    w0 = w[0] / 256 if folded else w[0] / 16
    src = build_raw_cnn(tmp_path / 'm.tflite', (w0,) + w[1:])
    lr = 0.01
    s = prepare(src, os.fspath(tmp_path / 'a'), data=data, loss='scce', from_logits=True,
                optimizer='adam', lr=lr, batch=1, epochs=1, log=lambda *a: None)
    assert s['input_scale'] == (1 / 128 if folded else 0), s
    code, text = runner.run(os.fspath(tmp_path / 'a'), python=True, stream=False)
    assert code == 0, text
    export(src, os.fspath(tmp_path / 'a' / 'trained.wof'), os.fspath(tmp_path / 'e.tflite'))
    g = read_model(tmp_path / 'e.tflite')
    conv = next(op for op in g.ops if op.name == 'CONV_2D')
    step = np.abs(np.asarray(g.tensors[conv.inputs[1]].data, np.float64) -
                  np.asarray(read_model(src).tensors[conv.inputs[1]].data, np.float64))
    want = lr / 128 if folded else lr
    moved = step[step > 0.01 * want]
    assert moved.size > step.size // 2, step
    assert np.allclose(moved, want, rtol=0.05), (moved.min(), moved.max(), want)


def test_int8_codes_given_as_samples_are_told_apart(tmp_path):
    """Issue 28 (a newcomer with a Keras int8 file of int8 input): x saved as the int8 codes
    that TFLite's interpreter takes for that file was read as real values (every value
    outside the input's range), and the warning said to divide x by a unit's factor (29.5
    for a held-out 2-branch MLP): 70% accuracy where the codes dequantized give 82%.  The
    warning now says they look like the input's codes and gives the real values' formula,
    which, applied, leaves nothing to warn of; evaluate, which scored the codes silently,
    says the same."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
    from kerasgraphs import build_int8_unary
    rng = np.random.default_rng(6)
    y = rng.integers(0, 3, 24)
    sx, zx = 0.0418, -24
    model, _, _ = build_int8_unary(tmp_path / 'm.tflite', 'RELU', sx=sx, zx=zx)
    real = rng.uniform(-3, 4, (24, 6))
    codes = np.clip(np.round(real / sx + zx), -128, 127).astype(np.int8)
    for name, x, warned in (('codes', codes, True),
                            ('real', (codes.astype(np.float64) - zx) * sx, False)):
        np.savez(tmp_path / f'{name}.npz', x=x, y=y)
        lines = []
        prepare(model, os.fspath(tmp_path / name), data=os.fspath(tmp_path / f'{name}.npz'),
                lr=LR, log=lines.append)
        said = [ln for ln in lines if ln.startswith('warning: ') and 'int8 input holds' in ln]
        assert bool(said) == warned, lines
        if warned:
            assert "x looks like that input's int8 codes" in said[0], said
            assert '(x - (-24)) * 0.0418' in said[0] and 'give x /' not in said[0], said
        # evaluate read them as silently (it scored the codes as real values): it warns too
        from host_tools.prepare.infer import evaluate
        r = evaluate(model, os.fspath(tmp_path / f'{name}.npz'))
        assert ("x looks like that input's int8 codes" in (r.get('warning') or '')) == warned, r


@pytest.mark.parametrize('offset', [0.0, 1.0])
def test_a_relu_layer_off_on_every_sample_is_warned_of(tmp_path, offset):
    """The Arduino tutorial's gesture MLP from GitHub (xlxys/gesture-classifier-arduino),
    on its own repository's gestures normalised as its sketch does: all 50 first-layer
    ReLUs are 0 on every sample, so no gradient reaches that layer (nor any before it);
    every run kept its first weights and nothing said why.  prepare now warns, naming the
    op, when a ReLU at or after a trained layer is off on all the samples it looks at;
    samples that turn some units on are not warned of."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x, h, z, y = b.tensor('x', [1, 6]), b.tensor('h', [1, 8]), b.tensor('z', [1, 2]), \
        b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [8, 6], data=np.float32(
        np.abs(rng.standard_normal((8, 6))))), b.tensor('b1', [8], data=np.full(8, -3, np.float32))],
        [h], fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', [2, 8], data=np.float32(rng.standard_normal((2, 8)))),
                             b.tensor('b2', [2], data=np.zeros(2, np.float32))], [z])
    b.op('SOFTMAX', [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    model = b.save(os.fspath(tmp_path / 'm.tflite'))
    xs = np.float32(rng.uniform(0, 0.4, (40, 6)) + offset)   # (0..0.4: every unit below 0)
    np.savez(tmp_path / 'd.npz', x=xs, y=(xs[:, 0] > xs[:, 1]).astype(np.int64))
    said = []
    prepare(model, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'), lr=LR,
            log=said.append)
    warned = [m for m in said if 'ReLU outputs are 0' in m]
    if offset:
        assert not warned, said
    else:
        assert len(warned) == 1 and 'op 0 FULLY_CONNECTED: all 8 of its ReLU outputs' in \
            warned[0] and 'on the 32 training samples looked at' in warned[0], said
    # (trained as int8, as prepare chooses for a board without ulab: the float prepare it
    # calibrates on looks, its log silent; the warning had been lost there)
    said = []
    prepare(model, os.fspath(tmp_path / 'run8'), data=os.fspath(tmp_path / 'd.npz'), lr=LR,
            int8=True, log=said.append)
    assert len([m for m in said if 'ReLU outputs are 0' in m]) == (0 if offset else 1), said


def test_a_relu_with_a_path_around_it_is_not_warned_of(tmp_path):
    """Keras's UnitNormalization / tf.math.l2_normalize converts to MINIMUM(RSQRT(sum),
    1/sqrt(eps)), which prepare spells a - RELU(a - b): that RELU is 0 on every sample (the
    guard is never reached), and prepare warned that 'it and the layers before it will not
    learn', which they do (the gradient goes around it).  A dead ReLU is warned of only
    when no gradient path from the output reaches a trained tensor but through dead ones."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x, h, m, z, y = (b.tensor(n, [1, s]) for n, s in (('x', 6), ('h', 8), ('m', 8), ('z', 2), ('y', 2)))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [8, 6], data=np.float32(rng.standard_normal((8, 6)))),
                             b.tensor('b1', [8], data=np.zeros(8, np.float32))], [h])
    b.op('MINIMUM', [h, b.tensor('guard', [], data=np.float32(1e6))], [m])
    b.op('FULLY_CONNECTED', [m, b.tensor('w2', [2, 8], data=np.float32(rng.standard_normal((2, 8)))),
                             b.tensor('b2', [2], data=np.zeros(2, np.float32))], [z])
    b.op('SOFTMAX', [z], [y], beta=1.0)
    b.inputs(x)
    b.outputs(y)
    model = b.save(os.fspath(tmp_path / 'm.tflite'))
    xs = np.float32(rng.standard_normal((40, 6)))
    np.savez(tmp_path / 'd.npz', x=xs, y=(xs[:, 0] > xs[:, 1]).astype(np.int64))
    said = []
    prepare(model, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'), lr=LR,
            log=said.append)
    assert not [m for m in said if 'ReLU outputs are 0' in m], said
