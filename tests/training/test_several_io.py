"""Issue 28: models with several inputs or outputs (a Keras functional model taking an
image and a sensor vector, an auxiliary second output; a PyTorch module with two forward
arguments).  prepare trains the output the loss reads (--output, default the file's first;
the ops only the others need leave the run), joins the inputs into the one the boards
read (inout.join_inputs: a SPLIT_V and RESHAPEs, planned like any op), and reads an
array per input from the data file; export writes the trained weights into the file,
which keeps every input and output.  Checked against ONERT (circle/tflite) and ONNX
Runtime on the file and on the export, with a training run on unix MicroPython."""
import json
import os
import warnings

import numpy as np
import pytest

from test_parity import BACKENDS, new_trainer  # sys.path set up there
from host_tools.formats.circle_build import CircleBuilder
from host_tools.formats.circle_io import read_model
from host_tools.graph.passes import PrepareError
from host_tools.prepare.pipeline import export, prepare
from host_tools.target.runner import run

H, M, O, A = 6, 3, 3, 2
f32 = lambda a: np.asarray(a, np.float32)      # noqa: E731


def build(path, shared=False, seed=0, out_order=('aux', 'logits'), m=M):
    """img [1,H,H,1] -> CONV_2D 3x3 RELU -> RESHAPE; CONCATENATION with meta [1,M] ->
    FULLY_CONNECTED -> logits [1,O].  aux [1,A]: a FULLY_CONNECTED of meta alone (its
    own branch), or of the concatenation (shared: the trunk is shared); out_order
    ('logits',): no aux."""
    M = m
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    img = b.tensor('serving_default_img:0', [1, H, H, 1])
    meta = b.tensor('serving_default_meta:0', [1, M])
    c = b.tensor('c', [1, H - 2, H - 2, 2])
    b.op('CONV_2D', [img, b.tensor('wc', [2, 3, 3, 1], data=f32(0.5 * rng.standard_normal((2, 3, 3, 1)))),
                     b.tensor('bc', [2], data=f32([0.1, 0.1]))], [c],
         padding='VALID', stride_w=1, stride_h=1, fused_activation_function='RELU')
    n = (H - 2) * (H - 2) * 2
    r = b.tensor('r', [1, n])
    b.op('RESHAPE', [c, b.tensor('shape', [2], data=np.array([1, n], np.int32))], [r])
    cat = b.tensor('cat', [1, n + M])
    b.op('CONCATENATION', [r, meta], [cat], axis=1, fused_activation_function='NONE')
    y = b.tensor('logits', [1, O])
    b.op('FULLY_CONNECTED', [cat, b.tensor('wf', [O, n + M], data=f32(0.2 * rng.standard_normal((O, n + M)))),
                             b.tensor('bf', [O], data=f32(np.zeros(O)))], [y])
    aux = b.tensor('aux', [1, A]) if 'aux' in out_order else None
    src, k = (cat, n + M) if shared else (meta, M)
    if aux is not None:
        b.op('FULLY_CONNECTED', [src, b.tensor('wa', [A, k], data=f32(rng.standard_normal((A, k)))),
                                 b.tensor('ba', [A], data=f32(np.zeros(A)))], [aux])
    b.inputs(img, meta)
    b.outputs(*[{'aux': aux, 'logits': y}[o] for o in out_order])
    return b.save(os.fspath(path))


def samples(n=48, seed=1, m=M):
    """The class is the argmax of meta's first 3, and marks a row of the image too."""
    rng = np.random.default_rng(seed)
    img = rng.random((n, H, H, 1)).astype(np.float32)
    meta = rng.standard_normal((n, m)).astype(np.float32)
    y = np.argmax(meta[:, :3], 1)
    img[np.arange(n), y, 0, 0] += 2
    return img, meta, y


def onert_outputs(path, img, meta):
    """ONERT on the file: every output, per sample, in the file's order."""
    import onert.infer
    sess = onert.infer.session(os.fspath(path))
    outs = [[np.array(o, np.float64).reshape(-1) for o in
             sess.infer([np.ascontiguousarray(img[i:i + 1]), np.ascontiguousarray(meta[i:i + 1])])]
            for i in range(len(img))]
    return [np.stack([s[j] for s in outs]) for j in range(len(outs[0]))]


def utrain_outputs(run_dir, x, weights='weights.wof'):
    """utrain's forward (micro/ under CPython) on the joined samples (x: one a row)."""
    tr = new_trainer(os.path.join(run_dir, 'model.flat'), os.path.join(run_dir, weights))
    return np.stack([np.array(tr.predict(np.ascontiguousarray(x[i:i + 1], np.float32)),
                              np.float64).reshape(-1) for i in range(len(x))])


def _prepare(src, d, data, lines=None, **kw):
    kw = dict(dict(loss='scce', from_logits=True, optimizer='adam', lr=0.01, epochs=4), **kw)
    return prepare(os.fspath(src), os.fspath(d), data=os.fspath(data),
                   log=(lines.append if lines is not None else lambda *a: None), **kw)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('shared', [False, True])
def test_two_inputs_two_outputs_train_and_export(tmp_path, backend, shared):
    src = build(tmp_path / 'two.tflite', shared)
    img, meta, y = samples()
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    lines = []
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', lines, output='logits')
    # which output trains, how to choose another; the aux branch leaves the run
    assert any("training output 1 'logits'" in ln and "0 'aux'" in ln and '--output' in ln
               for ln in lines), lines
    assert s['output'] == {'name': 'logits', 'tensor': 'logits', 'index': 1, 'of': 2}
    assert [i['key'] for i in s['inputs']] == ['img', 'meta']
    assert set(s['trainable']) == {'wc', 'bc', 'wf', 'bf'}
    assert s['frozen_params'] == 0      # (the aux weights are not on the board)
    # utrain's forward on the joined samples is ONERT's on the file's two inputs
    x = np.concatenate([img.reshape(len(img), -1), meta], 1)
    ref = onert_outputs(src, img, meta)
    got = utrain_outputs(tmp_path / 'run', x)
    assert np.abs(got - ref[1]).max() < 1e-5
    code, text = run(os.fspath(tmp_path / 'run'), python=(backend == 'cpython'), stream=False)
    assert code == 0, text
    losses = [float(ln.split(' loss ')[1].split()[0]) for ln in text.splitlines()
              if ln.startswith('epoch ')]
    assert losses[-1] < 0.6 * losses[0], losses
    out = tmp_path / 'trained.tflite'
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), os.fspath(out))
    g0, g1 = read_model(src), read_model(out)
    assert [g1.tensors[k].name for k in g1.inputs] == [g0.tensors[k].name for k in g0.inputs]
    assert [g1.tensors[k].name for k in g1.outputs] == ['aux', 'logits']
    assert [op.name for op in g1.ops] == [op.name for op in g0.ops]
    w0 = {t.name: t.data for t in g0.tensors if t.data is not None}
    w1 = {t.name: t.data for t in g1.tensors if t.data is not None}
    np.testing.assert_array_equal(w0['wa'], w1['wa'])          # not trained
    assert not np.allclose(w0['wf'], w1['wf'])
    after = onert_outputs(out, img, meta)
    assert np.abs(utrain_outputs(tmp_path / 'run', x, 'trained.wof') - after[1]).max() < 1e-5
    # evaluate scores the trained output on the data's arrays, as ONERT computes it
    from host_tools.prepare.infer import evaluate
    r = evaluate(os.fspath(out), os.fspath(tmp_path / 'd.npz'))
    assert r['output'] == 'logits' and r['runtime'] == 'ONERT'
    assert r['accuracy'] == np.mean(after[1].argmax(1) == y) > np.mean(ref[1].argmax(1) == y)
    if shared:      # the aux output reads the trained trunk: it changes with it
        assert np.abs(after[0] - ref[0]).max() > 1e-3
    else:           # its own branch: as it was
        np.testing.assert_allclose(after[0], ref[0], rtol=1e-6, atol=1e-6)


def test_the_other_output_trains_and_data_keys(tmp_path):
    """--output aux (by index) trains the meta branch alone: the image is not read (its
    array may be left out); x0/x1 name the inputs by place; an .npz whose x holds the
    values joined works as well."""
    src = build(tmp_path / 'two.tflite')
    img, meta, y = samples()
    t = (meta[:, :A] > 0).astype(np.float32)
    np.savez(tmp_path / 'aux.npz', meta=meta, y=t)
    s = _prepare(src, tmp_path / 'a', tmp_path / 'aux.npz', output=0, loss='mse',
                 from_logits=False, optimizer='sgd', lr=0.1)
    assert s['output']['name'] == 'aux' and set(s['trainable']) == {'wa', 'ba'}
    assert s['inputs'] == [{'name': 'serving_default_meta:0', 'key': 'meta', 'shape': [1, M]}]
    assert s['inputs_unread'] == ['img']
    np.savez(tmp_path / 'both.npz', img=img, meta=meta, y=t)   # (the unread one: left out)
    _prepare(src, tmp_path / 'b', tmp_path / 'both.npz', output='aux', loss='mse')
    ref = onert_outputs(src, img, meta)[0]
    assert np.abs(utrain_outputs(tmp_path / 'a', meta) - ref).max() < 1e-5
    code, text = run(os.fspath(tmp_path / 'a'), python=True, stream=False)
    assert code == 0, text
    export(src, os.fspath(tmp_path / 'a' / 'trained.wof'), os.fspath(tmp_path / 'a.tflite'))
    after = onert_outputs(tmp_path / 'a.tflite', img, meta)
    np.testing.assert_allclose(after[1], onert_outputs(src, img, meta)[1], rtol=1e-6, atol=1e-6)
    assert np.abs(after[0] - t).mean() < np.abs(ref - t).mean()
    # the keys by place, and the values joined as x: the same samples
    np.savez(tmp_path / 'x01.npz', x0=img, x1=meta, y=y)
    x = np.concatenate([img.reshape(len(img), -1), meta], 1)
    np.savez(tmp_path / 'x.npz', x=x, y=y)
    for name in ('x01', 'x'):
        _prepare(src, tmp_path / name, tmp_path / f'{name}.npz', output='logits')
        with open(tmp_path / name / 'train.ds', 'rb') as f, open(tmp_path / 'x01' / 'train.ds', 'rb') as h:
            assert f.read() == h.read()
    # by place among the model's inputs, not among those the output reads: aux reads the
    # second alone, which is x1 (it took x0, the image, and refused it for its size, or
    # read it where the sizes matched); x0 is then an unread input's array
    np.savez(tmp_path / 'aux01.npz', x0=img, x1=meta, y=t)
    _prepare(src, tmp_path / 'aux01', tmp_path / 'aux01.npz', output='aux', loss='mse')
    with open(tmp_path / 'aux01' / 'train.ds', 'rb') as f, open(tmp_path / 'b' / 'train.ds', 'rb') as h:
        assert f.read() == h.read()


@pytest.mark.parametrize('arrays,says', [
    (lambda img, meta, y: dict(img=img, y=y), ["no array for the model's input 1 'meta'",
                                               'name it meta or x1']),
    (lambda img, meta, y: dict(img=img, meta=meta, extra=meta, y=y),
     ["array extra is none of the model's inputs", 'img (or x0) [6, 6, 1]']),
    (lambda img, meta, y: dict(img=img, meta=meta[:, :2], y=y),
     ['array meta has 2 values a sample', "input 'meta' takes 3"]),
    (lambda img, meta, y: dict(img=img[:5], meta=meta, y=y), ['img has 5 samples but y has']),
    (lambda img, meta, y: dict(img=img, meta=meta), ['needs an array y']),
])
def test_data_errors_name_the_file_and_array(tmp_path, arrays, says):
    src = build(tmp_path / 'two.tflite')
    img, meta, y = samples(12)
    data = tmp_path / 'bad.npz'
    np.savez(data, **arrays(img, meta, y))
    with pytest.raises(Exception) as e:
        _prepare(src, tmp_path / 'r', data, output='logits')
    assert str(data) in str(e.value) and all(w in str(e.value) for w in says), str(e.value)


def test_inspect_says_what_runs(tmp_path, capsys):
    """inspect: the output prepare trains by default, the ops only the other needs, the
    inputs joined and the arrays the data gives."""
    from host_tools.cli import main
    main(['inspect', build(tmp_path / 'two.tflite', out_order=('logits', 'aux'))])
    said = capsys.readouterr().out
    assert "training output 0 'logits' [1, 3], the first" in said
    assert said.count('only the other outputs need it') == 1, said    # the aux FC
    assert ('its 2 inputs are joined into one [1, 39] (SPLIT_V, RESHAPE): --data gives an array '
            'per input, named img (or x0) [6, 6, 1], meta (or x1) [3]') in said


def test_default_output_fits_the_data_and_follows_the_signature(tmp_path):
    """Without --output: the first output (in the SignatureDef's order: Keras's, which the
    converter may list otherwise) whose size the targets fit, said so."""
    from host_tools.graph.inout import choose_output, save_graph
    src = build(tmp_path / 'two.tflite')
    img, meta, y = samples(12)
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)          # labels 0..2: logits
    lines = []
    s = _prepare(src, tmp_path / 'r', tmp_path / 'd.npz', lines)
    assert s['output']['name'] == 'logits' and any(
        "output 1 'logits' [1, 3], the first whose size the data's targets fit" in ln for ln in lines)
    np.savez(tmp_path / 'v.npz', img=img, meta=meta, y=meta[:, :A])   # 2 values: aux
    s = _prepare(src, tmp_path / 'v', tmp_path / 'v.npz', loss='mse', from_logits=False)
    assert s['output']['name'] == 'aux'
    g = read_model(src)
    for place, (k, name) in enumerate(zip(g.outputs[::-1], ('output_0', 'output_1'))):
        g.tensors[k].sig = (place, name)       # a Keras file: logits is its first output
    for place, (k, name) in enumerate(zip(g.inputs, ('img', 'meta'))):
        g.tensors[k].sig = (place, name)
    save_graph(g, tmp_path / 'sig.tflite')   # (its SignatureDef written and read back)
    g = read_model(tmp_path / 'sig.tflite')
    assert [g.tensors[k].sig for k in g.outputs] == [(1, 'output_1'), (0, 'output_0')]
    assert "training output 0 'output_0' [1, 3], the first (" in choose_output(g)
    assert g.tensors[g.outputs[0]].name == 'logits' and g.output_at == 1
    choose_output(g, 'output_1')
    assert g.tensors[g.outputs[0]].name == 'aux'


def test_unknown_output_is_refused(tmp_path):
    src = build(tmp_path / 'two.tflite')
    img, meta, y = samples(12)
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    with pytest.raises(PrepareError, match=r"--output 'nope'.*0 'aux' \[1, 2\], 1 'logits' \[1, 3\]"):
        _prepare(src, tmp_path / 'r', tmp_path / 'd.npz', output='nope')


@pytest.mark.parametrize('shared', [False, True])
def test_float_model_of_two_outputs_trains_as_int8_each_output_at_its_scale(tmp_path, shared):
    """--int8 on a float model of two outputs (was refused: the calibration ran only the
    trained output's ops): the aux output's ops, which leave the run, are calibrated too,
    at their own ranges (an int8 scale of about its range / 255, not the logits'); trained
    (host simulation), the float export scores better under ONERT, and the --quantized
    export keeps both outputs: its logits score as well under TFLite Micro, and its aux
    output (meta alone, or the shared concatenation: trained) is the float export's within
    a few of its int8 steps.  A board without ulab chooses int8 for it too."""
    pytest.importorskip('tflite_micro')
    import onert.infer
    src = build(tmp_path / 'two.tflite', shared)
    img, meta, y = samples(60)
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', int8=True, optimizer='sgd',
                 lr=0.005, epochs=5, test_split=0.25, output='logits')
    assert s['int8'] and s['from_float'] and s['output']['name'] == 'logits'
    g8 = read_model(os.fspath(tmp_path / 'run' / 'int8.circle'))
    sa = g8.tensors[g8.outputs[0]].quant['scale'][0]       # (the file's order: aux first)
    aux0 = onert_outputs(src, img, meta)[0]
    assert 1.5 * np.ptp(aux0) / 255 < sa < 2.2 * np.ptp(aux0) / 255, (sa, np.ptp(aux0))
    code, text = run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    out, q = tmp_path / 'trained.tflite', tmp_path / 'q.tflite'
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), os.fspath(out))
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), os.fspath(q), quantized=True)
    sess = [onert.infer.session(os.fspath(p)) for p in (src, out)]
    acc = [np.mean([np.argmax(np.asarray(se.infer([img[i:i + 1], meta[i:i + 1]])[1])) == y[i]
                    for i in range(len(y))]) for se in sess]
    assert acc[1] > acc[0] + 0.2, acc
    gq = read_model(os.fspath(q))
    assert [gq.tensors[k].name for k in gq.outputs] == ['aux', 'logits']
    (si,), (zi,) = (gq.tensors[gq.inputs[0]].quant[k] for k in ('scale', 'zero_point'))
    (sm,), (zm,) = (gq.tensors[gq.inputs[1]].quant[k] for k in ('scale', 'zero_point'))
    got = _tflm_outputs(q, [_codes(img, si, zi), _codes(meta, sm, zm)])
    assert np.mean(got[1].argmax(1) == y) > acc[0] + 0.2
    (sq,), (zq,) = (gq.tensors[gq.outputs[0]].quant[k] for k in ('scale', 'zero_point'))
    aux = onert_outputs(out, img, meta)[0]
    assert np.abs((got[0].astype(np.float64) - zq) * sq - aux).max() < 4 * sq + 0.02 * np.ptp(aux)
    # a board without ulab, where a float model trains as int8: int8 (was float32, said so)
    lines = []
    s = _prepare(src, tmp_path / 'b', tmp_path / 'd.npz', lines, output=1, board='rp2040')
    assert s.get('int8') and s['from_float'], lines


def test_the_other_output_is_calibrated_on_the_training_rows_only(tmp_path):
    """--int8 with --test-split on a float model of two inputs and two outputs: the aux
    output (meta alone) is calibrated on the training rows, as the trained one is (it had
    been the file's first rows, test rows among them): held-out rows with meta 40 times
    larger leave its int8 scale at the training rows' range."""
    from host_tools.files.dataset import split
    src = build(tmp_path / 'two.tflite')
    img, meta, y = samples(60)
    tr, te = split(len(y), 0.25, 0)
    meta[te] *= 40
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', int8=True, optimizer='sgd',
                 epochs=1, test_split=0.25, output='logits')
    assert s['int8'] and s['from_float']
    g8 = read_model(os.fspath(tmp_path / 'run' / 'int8.circle'))
    sa = g8.tensors[g8.outputs[0]].quant['scale'][0]       # (the file's order: aux first)
    aux = onert_outputs(src, img[tr], meta[tr])[0]
    assert np.ptp(aux) / 255 <= sa < 2.2 * np.ptp(aux) / 255, (sa, np.ptp(aux))


def test_float_model_of_two_inputs_trains_as_int8_each_at_its_scale(tmp_path):
    """--int8 on a float model of two inputs (pixels 0..3 beside a sensor vector of +-60):
    each input calibrated at its own int8 scale (one scale for both would leave the pixels
    a few codes), the joined input each one's codes; the board's forward is TFLite
    Micro's on the calibrated int8 model (int8.circle, its inputs apart) fed each input's
    codes, bit for bit; trained (host simulation), export writes the float model (ONERT:
    better than before) and --quantized the int8 one with both inputs at their scales."""
    pytest.importorskip('tflite_micro')
    import onert.infer
    src = build(tmp_path / 'one.tflite', out_order=('logits',))
    img, meta, y = samples(60)
    img, meta = 1.5 * img, 20 * meta
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    lines = []
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', lines, int8=True, optimizer='sgd',
                 lr=0.005, epochs=5, test_split=0.25)
    assert s['int8'] and s['from_float'] and [i['key'] for i in s['inputs']] == ['img', 'meta']
    g8 = read_model(os.fspath(tmp_path / 'run' / 'int8.circle'))
    (si,), (zi,) = (g8.tensors[g8.inputs[0]].quant[k] for k in ('scale', 'zero_point'))
    (sm,), (zm,) = (g8.tensors[g8.inputs[1]].quant[k] for k in ('scale', 'zero_point'))
    assert [g8.tensors[k].name for k in g8.inputs] == ['serving_default_img:0',
                                                       'serving_default_meta:0']
    assert si == pytest.approx((img.max() - min(img.min(), 0)) / 255, rel=0.2)
    # (meta's at least its range: the CONCATENATION that reads it ties it to its output's)
    assert sm >= 0.99 * (meta.max() - meta.min()) / 255 and sm > 10 * si, (si, sm)
    codes = [_codes(img, si, zi), _codes(meta, sm, zm)]
    ref = _tflm_outputs(tmp_path / 'run' / 'int8.circle', codes)[0]
    net = _q8_net(tmp_path / 'run')
    got = np.stack([np.frombuffer(bytes(net.forward(bytearray(
        np.concatenate([c[i].ravel() for c in codes]).tobytes()))), np.int8)
        for i in range(len(y))])
    net.close()
    np.testing.assert_array_equal(got, ref)
    assert len({tuple(r) for r in got}) > 10
    code, text = run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    out = tmp_path / 'trained.tflite'
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), os.fspath(out))
    sess = [onert.infer.session(os.fspath(p)) for p in (src, out)]
    acc = [np.mean([np.argmax(np.asarray(se.infer([img[i:i + 1], meta[i:i + 1]])[0])) == y[i]
                    for i in range(len(y))]) for se in sess]
    assert acc[1] > acc[0] + 0.2, acc
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), os.fspath(tmp_path / 'q.tflite'),
           quantized=True)
    gq = read_model(os.fspath(tmp_path / 'q.tflite'))
    assert [(gq.tensors[k].dtype, gq.tensors[k].quant['scale']) for k in gq.inputs] == \
        [('int8', [si]), ('int8', [sm])]
    assert np.mean(_tflm_outputs(tmp_path / 'q.tflite', codes)[0].argmax(1) == y) > acc[0] + 0.2


def test_ranks_on_an_op_only_another_output_needs_are_refused(tmp_path):
    """--ranks naming an op only the outputs that do not train need (it would leave the
    run: prune_outputs) is refused, naming the op and what to do, where it was dropped
    silently; an op the trained output needs takes its rank."""
    src = build(tmp_path / 'two.tflite')     # ops: 0 CONV, 1 RESHAPE, 2 CAT, 3 FC logits, 4 FC aux
    img, meta, y = samples(12)
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    with pytest.raises(PrepareError, match=r'op 4 feeds only outputs this run does not train '
                       r'\(it trains output 1\): give --output'):
        _prepare(src, tmp_path / 'r', tmp_path / 'd.npz', output='logits', ranks='4:up', epochs=1)
    s = _prepare(src, tmp_path / 'ok', tmp_path / 'd.npz', output='logits', ranks='3:low', epochs=1)
    assert s['heap']['total'] > 0
    np.savez(tmp_path / 'a.npz', img=img, meta=meta, y=np.eye(A, dtype=np.float32)[y % A])
    with pytest.raises(PrepareError, match=r'op 3 feeds only outputs'):
        _prepare(src, tmp_path / 'a', tmp_path / 'a.npz', output='aux', loss='mse', ranks='3:up',
                 epochs=1)


@pytest.mark.slow
@pytest.mark.parametrize('wide', [False, True])
def test_plan_counts_the_joined_input(tmp_path, wide):
    """The heap plan holds the joined input and its parts: on unix MicroPython the run
    trains in the planned heap and not in 1/1.3 of it (as tests/planner/test_memory.py
    bounds one-input models), with a second input of 3 values or of 1500 (the joined
    input and its part then 12 KB of the plan); the plan is the one --budget and --board
    read."""
    from test_parity import MICROPYTHON
    import subprocess
    from host_tools.plan.memory import trains_in
    from host_tools.target import runner
    if MICROPYTHON is None:
        pytest.skip('unix micropython not found')
    ulab = subprocess.run([MICROPYTHON, '-c', 'import ulab'], capture_output=True).returncode == 0
    m = 1500 if wide else M
    src = build(tmp_path / 'two.tflite', m=m)
    img, meta, y = samples(12, m=m)
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    out = os.fspath(tmp_path / 'r')
    s = _prepare(src, out, tmp_path / 'd.npz', output='logits', optimizer='sgd', epochs=1,
                 backend='ulab' if ulab else 'fallback')
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), \
        f'trains in {int(plan / 1.3)} B, the plan ({plan} B) is over 1.3x the need'
    with pytest.raises(PrepareError, match='training needs about'):
        _prepare(src, tmp_path / 'r2', tmp_path / 'd.npz', output='logits', budget=str(plan - 64))


def _two(torch):
    class Two(torch.nn.Module):
        """forward(img NCHW, meta) -> (logits, aux of meta alone)."""
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(2, 3, 3)
            self.fc = torch.nn.Linear(3 * 4 * 4 + 4, 3)
            self.aux = torch.nn.Linear(4, 2)

        def forward(self, img, meta):
            z = torch.cat([torch.relu(self.c(img)).flatten(1), meta], 1)
            return self.fc(z), self.aux(meta)
    torch.manual_seed(0)
    return Two().eval()


def _torch_data(tmp_path, n=40):
    """d.npz for _two's module (NCHW images): the class is meta's argmax, marked in img."""
    rng = np.random.default_rng(1)
    img = rng.random((n, 2, 6, 6)).astype(np.float32)
    meta = rng.standard_normal((n, 4)).astype(np.float32)
    y = np.argmax(meta[:, :3], 1)
    img[np.arange(n), 0, y, 0] += 2
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    return img, meta, y


def test_torch_two_arguments_tico(tmp_path):
    """The same module through tico (a circle file): its arrays are named after forward's
    arguments; utrain's forward is ONERT's, and the export keeps both outputs."""
    torch = pytest.importorskip('torch')
    tico = pytest.importorskip('tico')
    path = os.fspath(tmp_path / 'two.circle')
    tico.convert(_two(torch), (torch.zeros(1, 2, 6, 6), torch.zeros(1, 4))).save(path)
    img, meta, y = _torch_data(tmp_path)
    s = _prepare(path, tmp_path / 'run', tmp_path / 'd.npz')
    assert [i['key'] for i in s['inputs']] == ['img', 'meta'] and s['output']['index'] == 0
    x = np.concatenate([img.reshape(len(img), -1), meta], 1)
    before = onert_outputs(path, img, meta)
    assert np.abs(utrain_outputs(tmp_path / 'run', x) - before[0]).max() < 1e-5
    code, text = run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.circle')
    export(path, os.fspath(tmp_path / 'run' / 'trained.wof'), out)
    after = onert_outputs(out, img, meta)
    assert np.abs(utrain_outputs(tmp_path / 'run', x, 'trained.wof') - after[0]).max() < 1e-5
    assert np.mean(after[0].argmax(1) == y) > np.mean(before[0].argmax(1) == y)
    np.testing.assert_allclose(after[1], before[1], rtol=1e-6, atol=1e-6)


def test_torch_two_arguments_onnx(tmp_path):
    """A PyTorch module with two forward arguments and two results, exported to ONNX:
    utrain's forward is ONNX Runtime's; trained, the export's logits are utrain's and its
    aux output is the file's."""
    torch = pytest.importorskip('torch')
    ort = pytest.importorskip('onnxruntime')

    path = os.fspath(tmp_path / 'two.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(_two(torch), (torch.zeros(1, 2, 6, 6), torch.zeros(1, 4)), path,
                          input_names=['img', 'meta'], output_names=['logits', 'aux'],
                          dynamo=False)
    img, meta, y = _torch_data(tmp_path)
    lines = []
    s = _prepare(path, tmp_path / 'run', tmp_path / 'd.npz', lines)
    assert s['output']['name'] == 'logits' and any("0 'logits'" in ln for ln in lines)

    def ort_run(p):
        sess = ort.InferenceSession(p, providers=['CPUExecutionProvider'])
        return [np.stack([sess.run(None, {'img': img[i:i + 1], 'meta': meta[i:i + 1]})[j].reshape(-1)
                          for i in range(len(img))]) for j in range(2)]
    x = np.concatenate([img.reshape(len(img), -1), meta], 1)    # (the model's NCHW layout)
    before = ort_run(path)
    assert np.abs(utrain_outputs(tmp_path / 'run', x) - before[0]).max() < 1e-5
    code, text = run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.onnx')
    export(path, os.fspath(tmp_path / 'run' / 'trained.wof'), out)
    after = ort_run(out)
    assert np.abs(utrain_outputs(tmp_path / 'run', x, 'trained.wof') - after[0]).max() < 1e-5
    assert np.abs(after[0] - before[0]).max() > 1e-3
    np.testing.assert_array_equal(after[1], before[1])
    with open(tmp_path / 'run' / 'prepare.json') as f:
        assert json.load(f)['inputs'][1] == {'name': 'meta', 'key': 'meta', 'shape': [1, 4]}


@pytest.mark.parametrize('dtype', ['uint8', 'int8'])
def test_8bit_samples_store_each_input_at_its_own_scale(tmp_path, dtype):
    """--dtype uint8 / int8 stores each input at its own range's scale and offset (one
    scale for the joined samples, 0..255 pixels beside a unit sensor vector, had left the
    vector 6 of the 256 steps): the samples file holds each input's codes, and a MUL (an
    ADD) after the inputs' split gives its values back; utrain's forward on the stored
    codes is ONERT's on those values, which are within half a step of each input's own
    range; it trains, and export writes the file's ops (none of the split's)."""
    from host_tools.files.dataset import quantization, read_samples
    src = build(tmp_path / 'two.tflite')
    img, meta, y = samples()
    img = 255 * img
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    s = _prepare(src, tmp_path / 'r', tmp_path / 'd.npz', output='logits', dtype=dtype,
                 optimizer='sgd', lr=0.01)
    want = {'img': quantization(img, dtype), 'meta': quantization(meta, dtype)}
    assert s['inputs_stored'] == {k: list(v) for k, v in want.items()}
    codes, _ = read_samples(os.fspath(tmp_path / 'r' / 'train.ds'))
    assert codes.shape[1] == H * H + M and np.all(codes == np.round(codes))
    (si, oi), (sm, om) = want['img'], want['meta']
    vi, vm = codes[:, :H * H] * si + oi, codes[:, H * H:] * sm + om
    # (the training split's rows: each input within half of its own step)
    rows = [np.flatnonzero(np.all(np.abs(meta - r) <= sm / 2 + 1e-6, 1)) for r in vm]
    assert all(len(r) == 1 for r in rows) and np.ptp(meta) / sm > 200
    np.testing.assert_allclose(vi, img[[r[0] for r in rows]].reshape(len(rows), -1),
                               atol=si / 2 + 1e-4)
    ref = onert_outputs(src, f32(vi).reshape(-1, H, H, 1), f32(vm))
    np.testing.assert_allclose(utrain_outputs(tmp_path / 'r', codes), ref[1], rtol=1e-4,
                               atol=1e-4)
    code, text = run(os.fspath(tmp_path / 'r'), python=True, stream=False)
    assert code == 0, text
    out = tmp_path / 'trained.tflite'
    export(src, os.fspath(tmp_path / 'r' / 'trained.wof'), os.fspath(out))
    assert [op.name for op in read_model(out).ops] == [op.name for op in read_model(src).ops]


def _build_int8(path, seed=0, A_=4, B=3, scales=(0.05, 0.05), float_ends=False, third=False,
                sw=0.02):
    """Full-integer int8: a [1, A_] and b [1, B] (scales: theirs; b's zero point -3)
    each -> an FC of its own (at one scale, as TFLite Micro's CONCATENATION needs) ->
    CONCATENATION -> FC -> logits [1, O]; aux [1, 2] an FC of b.  Weights per-tensor
    int8, biases int32.  float_ends: float inputs and outputs (a QUANTIZE each, a
    DEQUANTIZE each: the converter's default); third: a third input c [1, 2, 3] at scale
    0.3, zero point 5, flattened (RESHAPE) into an FC of its own.  sw: the weights' scale."""
    rng = np.random.default_rng(seed)
    q = lambda s, z=0: {'scale': [float(s)], 'zero_point': [int(z)], 'quantized_dimension': 0}  # noqa: E731
    sa, sv = scales
    b = CircleBuilder(identifier=b'TFL3')
    f = '_q' if float_ends else ''      # (the int8 ends' names: the float ends take theirs)
    a = b.tensor('a' + f, [1, A_], dtype='int8', quant=q(sa))
    v = b.tensor('v' + f, [1, B], dtype='int8', quant=q(sv, -3))
    ins, parts = [a, v], [a, v]
    if third:
        c = b.tensor('c' + f, [1, 2, 3], dtype='int8', quant=q(0.3, 5))
        ins, parts = ins + [c], parts + [c]
    if float_ends:
        ins = []
        for k, (name, shape) in zip(parts[:2] + ([c] if third else []),
                                    [('a', [1, A_]), ('v', [1, B])] + ([('c', [1, 2, 3])] if third else [])):
            ins.append(b.tensor(name, shape))
            b.op('QUANTIZE', [ins[-1]], [k])
    if third:
        cf = b.tensor('c_flat', [1, 6], dtype='int8', quant=q(0.3, 5))
        b.op('RESHAPE', [c, b.tensor('c_shape', [2], data=np.array([1, 6], np.int32))], [cf])
        parts[2] = cf

    def fc(name, x, n_in, n_out, so, sx):
        w = np.clip(np.round(rng.standard_normal((n_out, n_in)) * 20), -127, 127).astype(np.int8)
        y = b.tensor(name + (f if name in ('logits', 'aux') else ''), [1, n_out], dtype='int8',
                     quant=q(so))
        b.op('FULLY_CONNECTED', [x, b.tensor(name + '_w', [n_out, n_in], data=w, quant=q(sw)),
                                 b.tensor(name + '_b', [n_out], data=np.zeros(n_out, np.int32),
                                          quant=q(sx * sw))], [y],
             fused_activation_function='NONE')
        return y
    sc = 0.05
    hs = [fc(f'h{i}', k, m, 4, sc, sx)
          for i, (k, m, sx) in enumerate(zip(parts, [A_, B, 6], [sa, sv, 0.3]))]
    cat = b.tensor('cat', [1, 4 * len(hs)], dtype='int8', quant=q(sc))
    b.op('CONCATENATION', hs, [cat], axis=1, fused_activation_function='NONE')
    outs = [fc('logits', cat, 4 * len(hs), O, 0.1, sc), fc('aux', v, B, 2, 0.1, sv)]
    if float_ends:
        for i, k in enumerate(list(outs)):
            outs[i] = b.tensor(('logits', 'aux')[i], [1, (O, 2)[i]])
            b.op('DEQUANTIZE', [k], [outs[i]])
    b.inputs(*ins)
    b.outputs(*outs)
    return b.save(os.fspath(path))


def _int8_data(tmp_path, n=90, third=False):
    rng = np.random.default_rng(2)
    a = rng.uniform(-2, 2, (n, 4)).astype(np.float32)
    v = rng.uniform(-6, 6, (n, 3)).astype(np.float32)
    arrays = dict(a=a, v=v, y=np.argmax(v, 1))
    if third:
        arrays['c'] = rng.uniform(-3, 3, (n, 2, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', **arrays)
    return arrays


def _q8_net(run_dir):
    import sys
    from repo import ROOT
    sys.path.insert(0, os.path.join(ROOT, 'micro'))
    from utrain.q8 import Q8Net
    with open(os.path.join(run_dir, 'q8.json')) as f:
        return Q8Net(json.load(f), os.path.join(run_dir, 'weights.wof'))


def _tflm_outputs(path, feeds):
    """TFLite Micro on the file: every output per sample (the file's order) for feeds,
    one array per file input (its dtype: int8 codes or floats)."""
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(os.fspath(path))
    outs = []
    for i in range(len(feeds[0])):
        for j, f in enumerate(feeds):
            it.set_input(f[i:i + 1], j)
        it.invoke()
        outs.append([it.get_output(j).ravel().copy() for j in range(len(read_model(path).outputs))])
    return [np.stack([o[j] for o in outs]) for j in range(len(outs[0]))]


def _codes(x, s, z):
    return np.clip(np.round(np.asarray(x, np.float64) / s) + z, -128, 127).astype(np.int8)


@pytest.mark.parametrize('float_ends,third', [(False, False), (True, False), (False, True),
                                              (True, True)])
def test_int8_model_trains_as_int8_and_exports_int8(tmp_path, float_ends, third):
    """A full-integer int8 model with two (three) inputs at scales of their own and two
    outputs (int8 at either end, or the converter's float ends: a QUANTIZE per input, a
    DEQUANTIZE per output) trains as int8: the inputs joined as each one's int8 codes
    (the joined input's SPLIT_V copies bytes), the board's forward TFLite Micro's on the
    file bit for bit; trained on the host simulation of the board, the export keeps every
    input and output with its type and quantization (and the float ends), the aux
    output's own weights, and scores better under TFLite Micro."""
    pytest.importorskip('tflite_micro')
    from host_tools.prepare.infer import evaluate
    src = _build_int8(tmp_path / 'q.tflite', scales=(0.02, 0.06), float_ends=float_ends,
                      third=third)
    d = _int8_data(tmp_path, third=third)
    lines = []
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', lines, output='logits', epochs=6)
    assert s.get('int8') and not any('dequantized' in ln for ln in lines), lines
    assert s['output']['index'] == 0 and [i['key'] for i in s['inputs']] == \
        ['a', 'v'] + (['c'] if third else [])
    # the board's forward (before training) on the joined codes: TFLite Micro's on the file
    qs = [(0.02, 0), (0.06, -3)] + ([(0.3, 5)] if third else [])
    names = ['a', 'v'] + (['c'] if third else [])
    codes = [_codes(d[k], *sq) for k, sq in zip(names, qs)]
    feeds = [d[k] if float_ends else c for k, c in zip(names, codes)]
    ref = _tflm_outputs(src, feeds)
    net = _q8_net(tmp_path / 'run')
    joined = np.concatenate([c.reshape(len(c), -1) for c in codes], 1)
    got = np.stack([np.frombuffer(bytes(net.forward(bytearray(r.tobytes()))), np.int8)
                    for r in joined])
    net.close()
    want = ref[0] if not float_ends else _codes(ref[0], 0.1, 0)
    np.testing.assert_array_equal(got, want)
    assert len({tuple(r) for r in got}) > 10
    code, text = run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.tflite')
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), out, quantized=True)
    g0, g1 = read_model(src), read_model(out)
    io = lambda g: [(g.tensors[k].name, g.tensors[k].dtype, g.tensors[k].quant and  # noqa: E731
                     (g.tensors[k].quant.get('scale'), g.tensors[k].quant.get('zero_point')))
                    for k in g.inputs + g.outputs]
    # (every input and the aux output as they were; the logits' range may have doubled
    # as training grew them, utrain.q8range)
    assert [e[:2] for e in io(g1)] == [e[:2] for e in io(g0)]
    assert [e for e in io(g1) if e[0] != 'logits'] == [e for e in io(g0) if e[0] != 'logits']
    assert [op.name for op in g1.ops] == [op.name for op in g0.ops]
    w0 = {t.name: t.data for t in g0.tensors if t.data is not None}
    w1 = {t.name: t.data for t in g1.tensors if t.data is not None}
    np.testing.assert_array_equal(w0['aux_w'], w1['aux_w'])
    assert not np.array_equal(w0['logits_w'], w1['logits_w'])
    after = _tflm_outputs(out, feeds)
    np.testing.assert_array_equal(after[1], ref[1])     # (the aux output: its own branch)
    before = evaluate(src, os.fspath(tmp_path / 'd.npz'))
    after = evaluate(out, os.fspath(tmp_path / 'd.npz'))
    assert before['runtime'] == after['runtime'] == 'TFLite Micro' and after['output'] == 'logits'
    assert after['accuracy'] > before['accuracy'] + 0.2, (before, after)


@pytest.mark.slow
def test_select_chooses_among_the_trained_outputs_layers(tmp_path, monkeypatch):
    """--select's candidates are the layers the trained output needs: its classifier is
    that output's last layer, not the other output's (the aux FC, the file's last op)."""
    from host_tools.graph.inout import choose_output
    from host_tools.prepare import select as sl
    # verified means on one partition of the 48 samples, not 8 (VALIDATIONS, 360: its own
    # test is test_select's test_a_small_proxy_verifies_on_as_many_validations_as_a_large_one)
    monkeypatch.setattr(sl, 'VALIDATIONS', 48)
    src = build(tmp_path / 'two.tflite')
    g = read_model(src)
    choose_output(g, 'logits')
    assert sl.classifier(g, sl.layers(g)) == 3 and 4 not in [i for i, _ in sl.layers(g)]
    img, meta, y = samples()
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    lines = []
    s = _prepare(src, tmp_path / 'r', tmp_path / 'd.npz', lines, output='logits', select='auto',
                 board='rp2040')
    assert any('before the classifier (op 3)' in ln for ln in lines), lines
    assert set(s['trainable']) <= {'wc', 'bc', 'wf', 'bf'} and 'wf' in s['trainable']
    code, text = run(os.fspath(tmp_path / 'r'), python=True, stream=False)
    assert code == 0, text


def _build_embedding(path, seed=0):
    """ids [1, 2] int32 -> GATHER of a [5, 3] table -> RESHAPE [1, 6]; CONCATENATION
    with feat [1, 2] -> FULLY_CONNECTED -> logits [1, 3]."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    ids = b.tensor('ids', [1, 2], dtype='int32')
    feat = b.tensor('feat', [1, 2])
    e = b.tensor('e', [1, 2, 3])
    b.op('GATHER', [b.tensor('table', [5, 3], data=f32(rng.standard_normal((5, 3)))), ids], [e],
         axis=0)
    r = b.tensor('r', [1, 6])
    b.op('RESHAPE', [e, b.tensor('shape', [2], data=np.array([1, 6], np.int32))], [r])
    cat = b.tensor('cat', [1, 8])
    b.op('CONCATENATION', [r, feat], [cat], axis=1, fused_activation_function='NONE')
    y = b.tensor('logits', [1, O])
    b.op('FULLY_CONNECTED', [cat, b.tensor('w', [O, 8], data=f32(0.3 * rng.standard_normal((O, 8)))),
                             b.tensor('bias', [O], data=f32(np.zeros(O)))], [y])
    b.inputs(ids, feat)
    b.outputs(y)
    return b.save(os.fspath(path))


def test_embedding_ids_beside_features(tmp_path):
    """An embedding's ids beside float features: the table trains, utrain's forward is
    ONERT's; 8-bit samples store the ids exactly (each input at its own scale; one scale
    for both had been refused); ids outside the table are refused, naming the op."""
    src = _build_embedding(tmp_path / 'emb.tflite')
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 5, (40, 2))
    feat = rng.standard_normal((40, 2)).astype(np.float32)
    y = ids[:, 0] % 3
    np.savez(tmp_path / 'd.npz', ids=ids, feat=feat, y=y)
    s = _prepare(src, tmp_path / 'r', tmp_path / 'd.npz')
    assert 'table' in s['trainable']
    import onert.infer
    sess = onert.infer.session(src)
    ref = np.stack([np.asarray(sess.infer([ids[i:i + 1].astype(np.int32), feat[i:i + 1]])[0]).ravel()
                    for i in range(10)])
    got = utrain_outputs(tmp_path / 'r', np.concatenate([ids, feat], 1)[:10].astype(np.float32))
    assert np.abs(got - ref).max() < 1e-5
    code, text = run(os.fspath(tmp_path / 'r'), python=True, stream=False)
    assert code == 0, text
    # 8-bit samples: the ids at their own scale (exact: 1, offset 0), not the features'
    s = _prepare(src, tmp_path / 'u', tmp_path / 'd.npz', dtype='uint8')
    assert s['inputs_stored']['ids'] == [1.0, 0.0]
    from host_tools.files.dataset import read_samples
    codes, _ = read_samples(os.fspath(tmp_path / 'u' / 'train.ds'))
    np.testing.assert_array_equal(np.sort(np.unique(codes[:, :2])), np.arange(5))
    np.savez(tmp_path / 'bad.npz', ids=ids + 3, feat=feat, y=y)
    with pytest.raises(PrepareError, match='op 0 GATHER reads rows of a 5-row table.*outside 0..4'):
        _prepare(src, tmp_path / 'b', tmp_path / 'bad.npz')


def _build_int8_ids(path, seed=0, n=6):
    """Full-integer int8 with int32 ids beside an int8 feature input (Keras's Embedding
    beside a sensor input, as the converter writes it): ids [1, 2] int32 -> GATHER of an
    int8 [n, 3] table -> RESHAPE [1, 6]; feat [1, 3] int8 -> FC -> [1, 4];
    CONCATENATION (one scale) -> FC -> logits [1, O]."""
    rng = np.random.default_rng(seed)
    q = lambda s, z=0: {'scale': [float(s)], 'zero_point': [int(z)], 'quantized_dimension': 0}  # noqa: E731
    sc, sf, sw = 0.05, 0.04, 0.02
    b = CircleBuilder(identifier=b'TFL3')
    ids = b.tensor('ids', [1, 2], dtype='int32')
    feat = b.tensor('feat', [1, 3], dtype='int8', quant=q(sf, 4))
    e = b.tensor('e', [1, 2, 3], dtype='int8', quant=q(sc))
    table = rng.integers(-100, 101, (n, 3)).astype(np.int8)
    b.op('GATHER', [b.tensor('table', [n, 3], data=table, quant=q(sc)), ids], [e], axis=0)
    r = b.tensor('r', [1, 6], dtype='int8', quant=q(sc))
    b.op('RESHAPE', [e, b.tensor('shape', [2], data=np.array([1, 6], np.int32))], [r])

    def fc(name, x, n_in, n_out, so, sx):
        w = np.clip(np.round(rng.standard_normal((n_out, n_in)) * 30), -127, 127).astype(np.int8)
        y = b.tensor(name, [1, n_out], dtype='int8', quant=q(so))
        b.op('FULLY_CONNECTED', [x, b.tensor(name + '_w', [n_out, n_in], data=w, quant=q(sw)),
                                 b.tensor(name + '_b', [n_out], data=np.zeros(n_out, np.int32),
                                          quant=q(sx * sw))], [y], fused_activation_function='NONE')
        return y
    h = fc('h', feat, 3, 4, sc, sf)
    cat = b.tensor('cat', [1, 10], dtype='int8', quant=q(sc))
    b.op('CONCATENATION', [r, h], [cat], axis=1, fused_activation_function='NONE')
    y = fc('logits', cat, 10, O, 0.4, sc)
    b.inputs(ids, feat)
    b.outputs(y)
    return b.save(os.fspath(path))


@pytest.mark.parametrize('n', [6, 300])
def test_int8_embedding_ids_beside_int8_features_train_as_int8(tmp_path, n):
    """Issue 28: an int8 file taking int32 ids (an int8 Embedding's) beside an int8 input
    trains as int8 (it trained dequantized): the joined input holds each id's byte (scale
    1, zero point -128, as utrain.q8emb reads ids), two bytes low first for a table of more
    than 256 rows (session 14: was dequantized), and the features' codes; the board's
    forward is TFLite Micro's on the file bit for bit; trained (host), export --quantized
    keeps the int32 ids and the int8 input and scores better under TFLite Micro; an id
    outside the table is refused naming it."""
    pytest.importorskip('tflite_micro')
    src = _build_int8_ids(tmp_path / 'q.tflite', n=n)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, n, (90, 2))
    feat = rng.uniform(-4, 4, (90, 3)).astype(np.float32)
    y = np.where(feat[:, 0] > 2, 2, ids[:, 0] % 2)
    ib = 1 if n <= 256 else 2
    byte = ids if ib == 1 else np.stack([ids & 255, ids >> 8], -1).reshape(len(ids), -1)
    np.savez(tmp_path / 'd.npz', ids=ids, feat=feat, y=y)
    lines = []
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', lines, optimizer='sgd', lr=0.02,
                 epochs=8, train='all')
    assert s.get('int8') and not any('dequantized' in ln or 'widen' in ln for ln in lines), lines
    codes = [ids.astype(np.int32), _codes(feat, 0.04, 4)]
    ref = _tflm_outputs(src, codes)[0]
    net = _q8_net(tmp_path / 'run')
    got = np.stack([np.frombuffer(bytes(net.forward(bytearray(np.concatenate(
        [(byte[i] - 128).astype(np.int8), codes[1][i]]).tobytes()))), np.int8) for i in range(len(y))])
    net.close()
    np.testing.assert_array_equal(got, ref)
    assert json.load(open(tmp_path / 'run' / 'q8.json'))['nin'] == 2 * ib + 3
    code, text = run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.tflite')
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), out, quantized=True)
    g1 = read_model(out)
    assert [(g1.tensors[k].name, g1.tensors[k].dtype) for k in g1.inputs] == [('ids', 'int32'),
                                                                              ('feat', 'int8')]
    acc = [np.mean(_tflm_outputs(p, codes)[0].argmax(1) == y) for p in (src, out)]
    assert acc[1] > acc[0] + 0.2, acc
    bad = ids.copy()
    bad[5, 1] = n
    np.savez(tmp_path / 'bad.npz', ids=bad, feat=feat, y=y)
    with pytest.raises(PrepareError, match=rf'id {n} is not a row of the embedding\'s {n}'):
        _prepare(src, tmp_path / 'b', tmp_path / 'bad.npz', optimizer='sgd')


def test_each_input_is_scaled_by_its_own_rms(tmp_path):
    """Issue 28: a float model with several inputs trains each input far larger than 1
    (here 0..255 pixels beside a unit sensor vector) on it times its own power of two
    (inscale.scale_input per input: a MUL after the inputs' split, the weights it reaches
    divided by it), the other as given: the same function (utrain's forward on the joined
    samples is ONERT's on the file), and export folds the scale back (ONERT on the export
    is utrain's trained forward)."""
    src = build(tmp_path / 'two.tflite')
    img, meta, y = samples()
    img = 255 * img
    np.savez(tmp_path / 'd.npz', img=img, meta=meta, y=y)
    lines = []
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', lines, output='logits',
                 optimizer='sgd', lr=0.01)
    rms = float(np.sqrt(np.mean(np.square(img.astype(np.float64)))))
    assert s['input_scale'] == {'img': 2.0 ** -round(np.log2(rms))}, s['input_scale']
    assert not [ln for ln in lines if 'widen' in ln], lines
    assert [ln for ln in lines if 'root mean square' in ln] == [
        ln for ln in lines if f"input 'img''s root mean square is {rms:.4g}" in ln]
    x = np.concatenate([img.reshape(len(img), -1), meta], 1)
    ref = onert_outputs(src, img, meta)
    np.testing.assert_allclose(utrain_outputs(tmp_path / 'run', x), ref[1], rtol=1e-4, atol=1e-4)
    code, text = run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    out = tmp_path / 'trained.tflite'
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), os.fspath(out))
    g0, g1 = read_model(src), read_model(out)
    assert [op.name for op in g1.ops] == [op.name for op in g0.ops]     # (no MUL left)
    after = onert_outputs(out, img, meta)
    np.testing.assert_allclose(utrain_outputs(tmp_path / 'run', x, 'trained.wof'), after[1],
                               rtol=1e-4, atol=1e-4)
    assert np.mean(after[1].argmax(1) == y) > np.mean(ref[1].argmax(1) == y)
    np.testing.assert_allclose(after[0], ref[0], rtol=1e-6, atol=1e-6)     # (aux: its own)


def test_int8_joined_inputs_are_relabelled_by_their_own_rms(tmp_path):
    """An int8 file's input far larger than 1 beside one that is not: the layer that reads
    the large one trains on it times its own power of two (quant.relabel_input on its
    part of the joined input: its 'sx' times s, its weight scales / s, the same integers
    forward: TFLite Micro's on the file, bit for bit); the other's layer as the file has it."""
    pytest.importorskip('tflite_micro')
    src = _build_int8(tmp_path / 'q.tflite', scales=(1.0, 0.06), sw=0.001)   # (no clipping:
    rng = np.random.default_rng(4)                                          # no recalibration)
    a = rng.uniform(-100, 100, (60, 4)).astype(np.float32)
    v = rng.uniform(-6, 6, (60, 3)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', a=a, v=v, y=np.argmax(v, 1))
    lines = []
    # (SGD: Adam takes an input as given where its weights are of ordinary size,
    # inscale.adam_keeps_scale; here 0.001 x integers to 127 reading +-100)
    s = _prepare(src, tmp_path / 'run', tmp_path / 'd.npz', lines, output='logits', epochs=1,
                 optimizer='sgd')
    sa = 2.0 ** -round(np.log2(np.sqrt(np.mean(np.square(a.astype(np.float64))))))
    assert s['int8'] and s['input_scale'] == {'a': sa}, s['input_scale']
    assert not [ln for ln in lines if 'widen' in ln], lines
    assert [ln for ln in lines if 'root mean square' in ln] == [
        ln for ln in lines if "input 'a''s root mean square" in ln and f'times {sa:g}' in ln]
    with open(tmp_path / 'run' / 'q8.json') as f:
        ls = {d['out']: d for d in json.load(f)['layers']}
    g = read_model(src)
    by = {g.tensors[k].name: k for k in range(len(g.tensors))}
    assert ls[by['h0']]['sx'] == pytest.approx(1.0 * sa) and ls[by['h1']]['sx'] == pytest.approx(0.06)
    codes = [_codes(a, 1.0, 0), _codes(v, 0.06, -3)]
    ref = _tflm_outputs(src, codes)
    net = _q8_net(tmp_path / 'run')
    got = np.stack([np.frombuffer(bytes(net.forward(bytearray(np.concatenate(r).tobytes()))), np.int8)
                    for r in zip(*codes)])
    net.close()
    np.testing.assert_array_equal(got, ref[0])


@pytest.mark.parametrize('kind', ['uint8', 'int8'])
def test_evaluate_scores_a_runs_samples_stored_per_input_as_the_board_does(tmp_path, kind):
    """A run's test.ds of a model with several inputs holds each input's codes at its own
    scale (--dtype uint8: prepare.json's inputs_stored; an int8 model: each input's int8
    codes): `evaluate` on it scores the values, as the board's forward decodes them (its
    cross-entropy before training = evaluate's on the file, the board's SPLIT_V and MUL
    or its int8 bytes against ONERT / TFLite Micro on the values); it had scored the
    codes as values (issue 28: a Keras two-input int8 model's own test.ds 0.70 against
    0.90; the float one's cross-entropy 8.2 against 0.47)."""
    import re
    from host_tools.prepare.infer import evaluate
    if kind == 'int8':
        pytest.importorskip('tflite_micro')
        src = _build_int8(tmp_path / 'q.tflite', scales=(0.02, 0.06), sw=0.002)
        _int8_data(tmp_path)
        kw = {}
    else:
        src = build(tmp_path / 'two.tflite')
        img, meta, y = samples()
        np.savez(tmp_path / 'd.npz', img=img, meta=4 * meta, y=y)
        kw = dict(dtype='uint8')
    s = _prepare(src, tmp_path / 'r', tmp_path / 'd.npz', output='logits', epochs=1,
                 test_split=0.3, **kw)
    assert bool(s.get('int8')) == (kind == 'int8')
    code, text = run(os.fspath(tmp_path / 'r'), python=True, stream=False)
    assert code == 0, text
    board = float(re.search(r'before training: test_loss ([0-9.]+)', text).group(1))
    r = evaluate(src, os.fspath(tmp_path / 'r' / 'test.ds'), output='logits')
    assert abs(r['loss'] - board) < 2e-3 * max(1.0, board), (r, board)


def test_x0_x1_follow_the_files_inputs_not_the_signatures_sorted_names(tmp_path):
    """A SignatureDef lists its keys sorted by name, the file's inputs in Keras's order
    (TF 2.21's converter on keras.Model([zeta, alpha]): inputs zeta, alpha; signature
    alpha, zeta).  Issue 28 (a real int8 Keras file from GitHub with inputs wave_input
    [200, 1] and feat_input [7]): x0 and x1 were read in the signature's order, and its
    samples refused ('array x0 has 200 values a sample; the model's input 'feat_input'
    takes 7'); now x0 is the file's first input, and each input's own name works too."""
    from host_tools.graph.inout import save_graph
    g = read_model(build(tmp_path / 'two.tflite', out_order=('logits',)))
    img_k, meta_k = g.inputs
    g.tensors[img_k].sig, g.tensors[meta_k].sig = (1, 'zimg'), (0, 'ameta')   # (sorted)
    g.tensors[g.outputs[0]].sig = (0, 'output_0')
    save_graph(g, tmp_path / 'sig.tflite')
    img, meta, y = samples(12)
    np.savez(tmp_path / 'p.npz', x0=img, x1=meta, y=y)
    np.savez(tmp_path / 'n.npz', zimg=img, ameta=meta, y=y)
    for data in ('p', 'n'):
        s = _prepare(str(tmp_path / 'sig.tflite'), tmp_path / data, tmp_path / f'{data}.npz')
        assert s['train_samples'] == 12, s
