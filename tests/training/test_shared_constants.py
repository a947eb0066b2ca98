"""A constant tensor layers share only because the converter keeps one tensor for equal
constants (the TFLite converter gave a Keras residual CNN's five all-zero conv biases one
tensor; equal weights too): each layer trains its own copy (copies.unshare_constants),
the trainable parameters are the model's, and export writes the copies as tensors of
their own.  A layer applied again (the same op over the same constants) keeps sharing.
Models built here as the converter writes them."""
import os

import numpy as np
import pytest

from test_parity import new_trainer  # sys.path set up there
from host_tools.formats.circle_build import CircleBuilder
from host_tools.formats.circle_io import read_model
from host_tools.prepare.pipeline import export, prepare
from host_tools.target.runner import run

F, H, O = 4, 5, 3


def f32(a):
    return np.asarray(a, np.float32)


def build(path, seed=0):
    """x [1,F] -> FC(w1, z) RELU -> FC(ws, z) RELU -> FC(ws, b3) RELU -> FC(w4, b4):
    z, an all-zero bias, read by the first two (their weights differ); ws, one weight,
    read by the middle two (their biases differ)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, F])
    z = b.tensor('zero_bias', [H], data=f32(np.zeros(H)))
    ws = b.tensor('ws', [H, H], data=f32(0.5 * rng.standard_normal((H, H))))
    t = x
    for i, (w, bias, act) in enumerate([
            (b.tensor('w1', [H, F], data=f32(0.5 * rng.standard_normal((H, F)))), z, 'RELU'),
            (ws, z, 'RELU'),
            (ws, b.tensor('b3', [H], data=f32(0.1 * rng.standard_normal(H))), 'RELU'),
            (b.tensor('w4', [O, H], data=f32(0.5 * rng.standard_normal((O, H)))),
             b.tensor('b4', [O], data=f32(np.zeros(O) + 0.1)), 'NONE')]):
        y = b.tensor(f'h{i}' if i < 3 else 'logits', [1, O if i == 3 else H])
        b.op('FULLY_CONNECTED', [t, w, bias], [y], fused_activation_function=act)
        t = y
    b.inputs(x)
    b.outputs(t)
    return b.save(os.fspath(path))


def samples(n=48, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, F)).astype(np.float32)
    return x, np.argmax(x[:, :O], 1)


def _fc_params(g):
    """[(weight, bias) tensor indices] of g's FULLY_CONNECTED ops, in order."""
    return [(op.inputs[1], op.inputs[2]) for op in g.ops if op.name == 'FULLY_CONNECTED']


def test_each_layer_trains_its_own_copy_and_export_writes_them(tmp_path):
    src = build(tmp_path / 'm.tflite')
    x, y = samples()
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    out = tmp_path / 'run'
    s = prepare(os.fspath(src), os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
                from_logits=True, optimizer='adam', lr=0.02, epochs=3, log=lambda *a: None)
    # the model's parameters, each layer's own: not 2 x H and H x H fewer
    assert s['trainable_params'] == H * F + H + 2 * (H * H + H) + O * H + O
    assert len(s['trainable']) == 8, s['trainable']
    code, text = run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    tr = new_trainer(out / 'model.flat', out / 'trained.wof')
    exported = tmp_path / 'trained.tflite'
    export(os.fspath(src), os.fspath(out / 'trained.wof'), os.fspath(exported))
    g0, g1 = read_model(src), read_model(exported)
    pairs = _fc_params(g1)
    assert len({k for p in pairs for k in p}) == 8         # no tensor read by two layers
    d0 = {t.name: t.data for t in g0.tensors if t.data is not None}
    (w1, z1), (wa, z2), (wb, b3), _ = [tuple(g1.tensors[k].data for k in p) for p in pairs]
    # each copy moved its own way from the one tensor the file had
    np.testing.assert_array_equal(d0['zero_bias'], 0)
    assert np.abs(z1).max() > 1e-3 and np.abs(z2).max() > 1e-3
    assert np.abs(z1 - z2).max() > 1e-3
    assert np.abs(wa - d0['ws']).max() > 1e-3 and np.abs(wb - d0['ws']).max() > 1e-3
    assert np.abs(wa - wb).max() > 1e-3
    # the exported file computes what utrain's trained model computes (ONERT)
    import onert.infer
    sess = onert.infer.session(os.fspath(exported))
    for row in x[:8]:
        ref = np.array(sess.infer([np.ascontiguousarray(row[None])])[0], np.float64).reshape(-1)
        got = np.array(tr.predict(row[None]), np.float64).reshape(-1)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_a_layer_applied_again_keeps_sharing(tmp_path):
    """The same op over the same weight and bias (a TimeDistributed's steps) is one layer:
    no copies; another op reading the bias gets its own."""
    from host_tools.graph.copies import unshare_constants
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, H])
    w = b.tensor('w', [H, H], data=f32(np.eye(H)))
    z = b.tensor('z', [H], data=f32(np.zeros(H)))
    h1, h2, h3 = (b.tensor(n, [1, H]) for n in ('h1', 'h2', 'h3'))
    b.op('FULLY_CONNECTED', [x, w, z], [h1], fused_activation_function='NONE')
    b.op('FULLY_CONNECTED', [h1, w, z], [h2], fused_activation_function='NONE')
    b.op('FULLY_CONNECTED', [h2, b.tensor('w3', [H, H], data=f32(np.eye(H))), z], [h3],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(h3)
    g = read_model(b.save(os.fspath(tmp_path / 'm.tflite')))
    n = len(g.tensors)
    assert unshare_constants(g) == 1
    p = _fc_params(g)
    assert p[0] == p[1] and p[2][1] == n and p[2][0] != p[0][0]
    assert g.tensors[n].name == 'z/utrain_copy1'


def build_int8(path, seed=0):
    """The int8 form: x [1,F] -> FC(w1, b1) RELU -> FC(ws, b2) RELU -> FC(ws, b3) -> logits,
    ws one int8 tensor (one scale) the last two read, their biases their own."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa: E731
    x = b.tensor('x', [1, F], dtype='int8', quant=q(0.03, 0))
    sw = 0.01
    ws = b.tensor('ws', [H, H], data=rng.integers(-127, 128, (H, H)).astype(np.int8),
                  quant={'scale': [sw] * H, 'zero_point': [0] * H, 'quantized_dimension': 0})
    w1 = b.tensor('w1', [H, F], data=rng.integers(-127, 128, (H, F)).astype(np.int8),
                  quant={'scale': [sw] * H, 'zero_point': [0] * H, 'quantized_dimension': 0})
    t, st = x, 0.03
    for i, (w, n, sy, zy, act) in enumerate([(w1, H, 0.05, -128, 'RELU'), (ws, H, 0.05, -128, 'RELU'),
                                             (ws, H, 0.08, -2, 'NONE')]):
        bt = b.tensor(f'b{i}', [n], data=rng.integers(-300, 300, n).astype(np.int32),
                      quant={'scale': [st * sw] * n, 'zero_point': [0] * n})
        y = b.tensor(f'h{i}', [1, n], dtype='int8', quant=q(sy, zy))
        b.op('FULLY_CONNECTED', [t, w, bt], [y], fused_activation_function=act)
        t, st = y, sy
    b.inputs(x)
    b.outputs(t)
    return b.save(os.fspath(path))


def test_int8_layers_train_their_own_copy_of_one_weight(tmp_path):
    """An int8 weight two layers read with biases of their own trains as two (no shared
    weight, utrain.q8share, summing their gradients), and export --quantized writes two."""
    import json
    src = build_int8(tmp_path / 'm.tflite')
    rng = np.random.default_rng(2)
    x = rng.standard_normal((24, F)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.argmax(x[:, :H], 1))
    out = tmp_path / 'run'
    s = prepare(os.fspath(src), os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
                lr=0.05, epochs=2, log=lambda *a: None)
    assert s.get('int8')
    assert s['trainable_params'] == H * F + H + 2 * (H * H + H)
    with open(out / 'q8.json') as f:
        ls = json.load(f)['layers']
    assert not any('sh' in d for d in ls) and len({d['wt'] for d in ls}) == 3
    code, text = run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    exported = tmp_path / 'trained.tflite'
    export(os.fspath(src), os.fspath(out / 'trained.wof'), os.fspath(exported), quantized=True)
    g0, g1 = read_model(src), read_model(exported)
    pairs = _fc_params(g1)
    assert len({w for w, _ in pairs}) == 3
    ws0 = next(t.data for t in g0.tensors if t.name == 'ws')
    wa, wb = (g1.tensors[p[0]].data for p in pairs[1:])
    assert (wa != ws0).any() and (wb != ws0).any() and (wa != wb).any()
    assert g1.tensors[pairs[2][0]].quant['scale'] == g1.tensors[pairs[1][0]].quant['scale']


def test_the_copy_count_leaves_out_copies_a_fold_left_unread_and_frozen_ones(tmp_path):
    """Issue 28: a dilated Conv1D's zero bias shared with a Dense's: the fold that moves
    its ADD's bias into the conv leaves the conv's zeros read by nothing, so nothing is
    shared any more; prepare had logged '1 weight or bias tensors ... are copied'.  The
    residual-style graph above: two shared constants, 2 copies, both trained (said);
    with only the last layer trained none of them trains (not said)."""
    from kerasgraphs import build_keras_dilated_shared_zero
    from host_tools.cli import main as cli
    import io
    from contextlib import redirect_stdout
    m = build_keras_dilated_shared_zero(tmp_path / 'dil.tflite')
    rng = np.random.default_rng(1)
    data = str(tmp_path / 'dil.npz')
    np.savez(data, x=rng.normal(size=(24, 13, 2)).astype(np.float32), y=rng.integers(0, 3, 24))

    def said(model, npz, **kw):
        lines = []
        prepare(model, str(tmp_path / 'o'), data=npz, loss='scce', log=lines.append, **kw)
        return [s for s in lines if 'copied' in s]
    assert said(m, data) == []
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(['inspect', m]) == 0
    assert 'copies of a constant' not in out.getvalue()
    g = build(tmp_path / 'res.tflite')
    x, y = samples()
    np.savez(tmp_path / 'res.npz', x=x, y=y)
    assert len(said(g, str(tmp_path / 'res.npz'))) == 1 and \
        '2 weight or bias tensors' in said(g, str(tmp_path / 'res.npz'))[0]
    assert said(g, str(tmp_path / 'res.npz'), train='last:1') == []
