"""GATHER of an embedding table (op_emb, issue 28): Keras's Embedding as the TFLite
converter writes it (CAST of the float ids to int32, Keras 3's SELECT_V2(LESS(i, 0),
ADD(i, N), i) for negative ids, GATHER), and PyTorch's nn.Embedding as ONNX writes it
(Gather of an initializer by the int64 input).

Forward against TFLite Micro (the file without the int32 SELECT_V2 it cannot run) and a
numpy reference (negative ids), one SGD step against the numpy forward's differences for
every table entry (the rows no id picks do not move), a run on unix MicroPython and the
export under TFLite Micro / ONNX Runtime equal to utrain's trained forward."""
import os

import numpy as np
import pytest

from host_tools.formats.circle_build import CircleBuilder
from kerasgraphs import keras_ids

F32 = np.float32
N, D, L, O = 7, 3, 5, 2          # table rows, width, ids a sample, outputs


def build_keras_embedding(path, wrap=True, seed=0, ints=False, pool='MEAN', select='SELECT_V2'):
    """ids [1, L] (float; ints: int32, no CAST) -> CAST -> [LESS, ADD, SELECT_V2] ->
    GATHER [1, L, D] -> MEAN (or REDUCE_MAX) over L -> FULLY_CONNECTED [1, O], as TF 2.21
    writes Keras 3's Embedding + GlobalAveragePooling1D (GlobalMaxPooling1D) + Dense.
    Returns (path, forward(ids, **params) float64)."""
    rng = np.random.default_rng(seed)
    E = rng.normal(size=(N, D)).astype(F32)
    W = rng.normal(size=(O, D)).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('ids', [1, L], dtype='int32' if ints else 'float32')
    emb = b.tensor('emb', [N, D], data=E)
    w = b.tensor('w', [O, D], data=W)
    bias = b.tensor('b', [O], data=np.array([0.1, -0.2], F32))
    axis = b.tensor('axis', [1], data=np.array([1], np.int32))
    i = keras_ids(b, x, N, L, ints, wrap, select)
    g = b.tensor('gathered', [1, L, D])
    b.op('GATHER', [emb, i], [g], axis=0, batch_dims=0)
    m = b.tensor('mean', [1, D])
    b.op(pool, [g, axis], [m], keep_dims=False)
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [m, w, bias], [y], fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(ids, emb=E, w=W, b=np.array([0.1, -0.2])):
        ids = np.asarray(ids).reshape(-1, L).astype(int)
        e = np.asarray(emb, np.float64)[ids]
        return (e.mean(1) if pool == 'MEAN' else e.max(1)) @ np.asarray(w, np.float64).T + b
    return os.fspath(path), forward


def _ids(n, lo=0, seed=3):
    return np.random.default_rng(seed).integers(lo, N, (n, L)).astype(F32)


def test_forward_is_tflite_micros_and_negative_ids_read_from_the_end(tmp_path):
    """utrain's forward (the device code on the host) equals TFLite Micro and ONERT on
    the file without Keras 3's SELECT_V2 (neither has an int32 one), and the numpy reference
    on the file with it, negative ids among the samples (Keras: row id + N)."""
    from test_rewrite import tflm_infer
    from test_parity import new_trainer, utrain_predict
    from onert_ref import onert_infer
    from host_tools.prepare.pipeline import prepare
    x = _ids(12)
    for wrap in (False, True):
        src, forward = build_keras_embedding(tmp_path / f'e{wrap}.tflite', wrap)
        out = tmp_path / f'run{wrap}'
        np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((12, O), F32))
        s = prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse',
                    optimizer='sgd', lr=0.01, batch=1, epochs=1, log=lambda *a: None)
        assert s['rewritten'] is None           # (export writes into the file itself)
        tr = new_trainer(out / 'model.flat', out / 'weights.wof')
        xs = x if not wrap else np.concatenate([x, -_ids(6, 1)])
        got = utrain_predict(tr, xs, [1, L])
        np.testing.assert_allclose(got, forward(xs), rtol=1e-5, atol=1e-6)
        if not wrap:
            np.testing.assert_allclose(got, tflm_infer(src, x), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got, onert_infer(src, x), rtol=1e-5, atol=1e-6)


def test_a_fixed_batch_embeddings_select_v1_reads_negative_ids(tmp_path):
    """keras.Input((L,), batch_size=1, dtype='int32') -> Embedding (as a recurrent layer
    after it wants): the converter writes the negative-id select as SELECT (v1), which
    prepare had refused ('tensor 0 ... is int32; utrain trains float32 models').  Read
    as SELECT_V2's: utrain's forward is the numpy reference's, negative ids included."""
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import prepare
    src, forward = build_keras_embedding(tmp_path / 'e.tflite', ints=True, select='SELECT')
    x = _ids(8)
    np.savez(tmp_path / 'd.npz', x=x.astype(np.int32), y=np.zeros((8, O), F32))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse',
            optimizer='sgd', lr=0.01, batch=1, epochs=1, log=lambda *a: None)
    tr = new_trainer(out / 'model.flat', out / 'weights.wof')
    xs = np.concatenate([x, -_ids(4, 1)])
    np.testing.assert_allclose(utrain_predict(tr, xs, [1, L]), forward(xs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('bad, says', [(7.0, 'index 7.0 is not a row of its 7 (0..6, or -7..-1)'),
                                       (-8.0, 'index -8.0'), (2.5, 'index 2.5')])
def test_an_id_out_of_range_stops_naming_the_table_and_value(tmp_path, bad, says):
    """TFLite's GATHER errors on an id outside the table; the device stops with the table
    tensor, the value and the range (not a wrong row or an IndexError)."""
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import prepare
    src, _ = build_keras_embedding(tmp_path / 'e.tflite')
    np.savez(tmp_path / 'd.npz', x=_ids(4), y=np.zeros((4, O), F32))
    prepare(src, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'), loss='mse',
            log=lambda *a: None)
    tr = new_trainer(tmp_path / 'run' / 'model.flat', tmp_path / 'run' / 'weights.wof')
    x = _ids(1)
    x[0, 2] = bad
    with pytest.raises(ValueError) as e:
        utrain_predict(tr, x, [1, L])
    assert 'GATHER of table tensor 1' in str(e.value) and says in str(e.value), str(e.value)


def test_one_sgd_step_is_the_gradient_and_unused_rows_stay(tmp_path):
    """One SGD step (batch 1: the rows stepped in place) moves the table by -lr times the
    gradient the differences of the numpy forward give, every entry (the rows the sample
    does not pick: exactly zero), and the Dense weights alike."""
    from test_rewrite import _step_is_the_gradient
    src, forward = build_keras_embedding(tmp_path / 'e.tflite')
    x = np.array([[1, 4, 4, -1, 0]], F32)       # row 4 twice, -1 is row 6; 2, 3, 5 unused
    step = _step_is_the_gradient(src, forward, tmp_path, ('emb', 'w', 'b'), x)
    assert np.all(step['emb'][[2, 3, 5]] == 0) and np.all(step['emb'][[0, 1, 4, 6]] != 0)


def test_keras_embedding_trains_on_micropython_and_exports(tmp_path):
    """prepare, an Adam run at batch 3 on unix MicroPython (the table's gradient summed
    whole) and export: TFLite Micro on the exported file (without the SELECT_V2, as
    evaluate runs it) = utrain's trained forward, and the table moved."""
    from test_rewrite import tflm_infer
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.target import runner
    from host_tools.prepare.infer import predictor
    src, forward = build_keras_embedding(tmp_path / 'e.tflite')
    x = _ids(12)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 3).astype(np.int64))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='adam', lr=0.05, batch=3, epochs=2, log=lambda *a: None)
    code, text = runner.run(os.fspath(out), python=runner.find_micropython() is None, stream=False)
    assert code == 0, text
    dst = tmp_path / 'trained.tflite'
    export(src, os.fspath(out / 'trained.wof'), os.fspath(dst))
    run, who, _ = predictor(dst)
    after = run(x)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'trained.wof'), x, [1, L])
    np.testing.assert_allclose(got, after, rtol=1e-4, atol=1e-5, err_msg=who)
    assert np.abs(after - forward(x)).max() > 1e-2
    src2, _ = build_keras_embedding(tmp_path / 'plain.tflite', wrap=False)
    assert np.abs(tflm_infer(src2, x) - forward(x)).max() < 1e-5


def test_pytorch_embedding_onnx_trains_and_exports(tmp_path):
    """PyTorch's nn.Embedding -> mean -> Linear exported to ONNX (Gather of the
    initializer by the int64 input): ORT = utrain's forward; prepare, SGD at batch 1 on
    unix MicroPython, export: ORT on the export = utrain's trained forward, and only the
    rows the data picks moved (plain SGD)."""
    torch = pytest.importorskip('torch')
    import onnx
    from onnx import numpy_helper
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.prepare.infer import predictor
    from host_tools.target import runner
    torch.manual_seed(0)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e, self.fc = torch.nn.Embedding(N + 3, D), torch.nn.Linear(D, O)

        def forward(self, i):
            return self.fc(self.e(i).mean(1))
    src = os.fspath(tmp_path / 'e.onnx')
    torch.onnx.export(M().eval(), (torch.zeros(1, L, dtype=torch.long),), src, dynamo=False,
                      opset_version=17)
    x = _ids(10)                                # rows N..N+2 never used
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 3).astype(np.int64))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='sgd', lr=0.1, batch=1, epochs=2, log=lambda *a: None)
    run0, _, _ = predictor(src)
    got0 = utrain_predict(new_trainer(out / 'model.flat', out / 'weights.wof'), x, [1, L])
    np.testing.assert_allclose(got0, run0(x), rtol=1e-5, atol=1e-6)
    code, text = runner.run(os.fspath(out), python=runner.find_micropython() is None, stream=False)
    assert code == 0, text
    dst = tmp_path / 'trained.onnx'
    export(src, os.fspath(out / 'trained.wof'), os.fspath(dst))
    run, _, _ = predictor(dst)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'trained.wof'), x, [1, L])
    np.testing.assert_allclose(got, run(x), rtol=1e-4, atol=1e-5)
    t0, t1 = (numpy_helper.to_array(next(i for i in onnx.load(p).graph.initializer
                                         if i.name == 'e.weight')) for p in (src, dst))
    moved = np.abs(t1 - t0).max(1) > 0
    assert moved[:N].all() and not moved[N:].any()


@pytest.mark.parametrize('ints', [False, True])
def test_export_after_other_rewrites_gives_the_ids_back(tmp_path, ints):
    """Embedding -> GlobalMaxPooling1D (REDUCE_MAX, which prepare rewrites: a rewritten
    graph to export), float ids or an int32 input: the export reads int ids again (the
    input's own int32, or a CAST, and the negative-id SELECT_V2), the TF graph's ops as
    the file had them; evaluate's runtime on it = utrain's trained forward."""
    from test_parity import new_trainer, utrain_predict
    from test_rewrite import ops
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.prepare.infer import predictor
    src, forward = build_keras_embedding(tmp_path / 'e.tflite', ints=ints, pool='REDUCE_MAX')
    x = _ids(9)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 3).astype(np.int64))
    out = tmp_path / 'run'
    s = prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
                from_logits=True, optimizer='sgd', lr=0.2, batch=1, epochs=2, log=lambda *a: None)
    assert s['rewritten']
    from host_tools.target import runner
    code, text = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    dst = tmp_path / 'trained.tflite'
    export(src, os.fspath(out / 'trained.wof'), os.fspath(dst))
    g = read_model(dst)
    assert g.tensors[g.inputs[0]].dtype == ('int32' if ints else 'float32')
    assert ops(dst)[:4] == ['CAST'] * (not ints) + ['LESS', 'ADD', 'SELECT_V2'] + ['GATHER'] * ints
    run, who, _ = predictor(dst)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'trained.wof'), x, [1, L])
    np.testing.assert_allclose(got, run(x), rtol=1e-4, atol=1e-5, err_msg=who)
    assert np.abs(got - forward(x)).max() > 1e-2


def test_int8_embedding_trains_dequantized_and_exports_as_int8(tmp_path):
    """An int8 table (TFLite's GATHER copies its int8 values) trained dequantized
    (--dequantize; a batch of 2 trains as int8 without it: tests/int8/test_q8_emb.py); utrain's forward = TFLite Micro's on the int8 file (to an output
    step or two); after training, export --quantized --data gives the table its GATHER
    output's recalibrated scale (one scale: TFLite's GATHER keeps it), no value clipped,
    and TFLite Micro on it = utrain's trained float forward to the int8 steps."""
    from test_rewrite import tflm_infer
    from test_parity import new_trainer, utrain_predict
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.target import runner
    from kerasgraphs import build_int8_embedding
    # (float ids -> CAST -> GATHER of an int8 table -> MEAN -> FC -> DEQUANTIZE, without
    # Keras 3's negative-id SELECT_V2: TFLite Micro has no int32 one)
    src, _, so, _ = build_int8_embedding(tmp_path / 'q.tflite', N=N, D=D, L=L, O=O, wrap=False,
                                         st=0.004, zt=0, half=False, sw=(0.004, 0.008), wide=0)
    x = _ids(16)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 3).astype(np.int64))
    said = []
    out = tmp_path / 'run'
    s = prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce',
                from_logits=True, optimizer='sgd', lr=0.5, batch=2, epochs=3, log=said.append,
                dequantize=True)
    assert not (out / 'q8.json').exists()          # (the float run's folder)
    ref = tflm_infer(src, x)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'weights.wof'), x, [1, L])
    np.testing.assert_allclose(got, ref, atol=2.5 * so)
    code, text = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    dst = tmp_path / 'trained.tflite'
    r = export(src, os.fspath(out / 'trained.wof'), os.fspath(dst), quantized=True,
               data=os.fspath(tmp_path / 'd.npz'))
    assert r['clipped'] == 0
    g = read_model(dst)
    t = next(t for t in g.tensors if t.name == 'emb')
    gq = next(t for t in g.tensors if t.name == 'gathered').quant
    assert t.quant['scale'] == gq['scale'] and t.quant['scale'][0] > 0.004
    after = tflm_infer(dst, x)
    trained = utrain_predict(new_trainer(out / 'model.flat', out / 'trained.wof'), x, [1, L])
    assert np.abs(trained - got).max() > 0.05
    assert np.abs(after - trained).max() < 0.1 * np.abs(trained).max()


def build_keras_masked(path, seed=1, ints=False):
    """Keras's Embedding(mask_zero=True) + GlobalAveragePooling1D + Dense as TF 2.21
    writes it: NOT_EQUAL(ids, 0), EXPAND_DIMS, CAST to float, SUM (the count); CAST,
    GATHER, SELECT_V2(mask, rows, 0), SUM, DIV, FULLY_CONNECTED (ints: an int32 Input,
    compared and gathered by as it is).  Returns (path, forward(ids, **params) float64):
    the mean of the rows of the ids that are not 0."""
    rng = np.random.default_rng(seed)
    E = rng.normal(size=(N, D)).astype(F32)
    W = rng.normal(size=(O, D)).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('ids', [1, L], dtype='int32' if ints else 'float32')
    zero = b.tensor('zero', [], data=np.array(0, np.int32) if ints else np.array(0.0, F32))
    ax = b.tensor('ax', [1], data=np.array([1], np.int32))
    m = b.tensor('mask', [1, L], dtype='bool')
    b.op('NOT_EQUAL', [x, zero], [m])
    me = b.tensor('mask3', [1, L, 1], dtype='bool')
    b.op('EXPAND_DIMS', [m, b.tensor('dim', [], data=np.array(-1, np.int32))], [me])
    mf = b.tensor('maskf', [1, L, 1])
    b.op('CAST', [me], [mf])
    n = b.tensor('count', [1, 1])
    b.op('SUM', [mf, ax], [n], keep_dims=False)
    c = x
    if not ints:
        c = b.tensor('cast', [1, L], dtype='int32')
        b.op('CAST', [x], [c])
    emb = b.tensor('emb', [N, D], data=E)
    g = b.tensor('gathered', [1, L, D])
    b.op('GATHER', [emb, c], [g], axis=0, batch_dims=0)
    sel = b.tensor('kept', [1, L, D])
    b.op('SELECT_V2', [me, g, b.tensor('zeros', [], data=np.array(0.0, F32))], [sel])
    s = b.tensor('sum', [1, D])
    b.op('SUM', [sel, ax], [s], keep_dims=False)
    mean = b.tensor('mean', [1, D])
    b.op('DIV', [s, n], [mean], fused_activation_function='NONE')
    w = b.tensor('w', [O, D], data=W)
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [mean, w, b.tensor('b', [O], data=np.zeros(O, F32))], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(ids, emb=E, w=W, b=np.zeros(O)):
        ids = np.asarray(ids).reshape(-1, L).astype(int)
        keep = (ids != 0)[..., None]
        e = (np.asarray(emb, np.float64)[ids] * keep).sum(1) / keep.sum(1)
        return e @ np.asarray(w, np.float64).T + b
    return os.fspath(path), forward


@pytest.mark.parametrize('ints', [False, True])
def test_keras_mask_zero_trains(tmp_path, ints):
    """Embedding(mask_zero=True): the bool mask of ids != 0 is the device's NOT_EQUAL
    (embeddings.id_masks: its CASTs gone), its SELECT_V2 against zeros a MUL: utrain's
    forward = the masked mean (numpy) and evaluate's runtime (ONERT) on the file, and one
    SGD step = the differences of the numpy forward, the masked rows' (id 0's) gradient
    exactly 0.  ints: an int32 Input (Keras's Input(dtype='int32')), which had been
    refused (NOT_EQUAL of int32 ids)."""
    from test_rewrite import _step_is_the_gradient
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import prepare
    from host_tools.prepare.infer import predictor
    src, forward = build_keras_masked(tmp_path / 'm.tflite', ints=ints)
    x = _ids(10)
    x[:, 1] = 0
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((10, O), F32))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', log=lambda *a: None)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'weights.wof'), x, [1, L])
    np.testing.assert_allclose(got, forward(x), rtol=1e-5, atol=1e-6)
    run, who, _ = predictor(src)            # (TFLite Micro has no bool EXPAND_DIMS)
    np.testing.assert_allclose(got, run(x), rtol=1e-5, atol=1e-6, err_msg=who)
    # export writes the mask a bool again (a CAST to float after it), its constant the ids'
    # type: a runtime runs it (it had written a float NOT_EQUAL of int32 ids and a float)
    from host_tools.prepare.pipeline import export
    from host_tools.formats.circle_io import read_model
    dst = os.fspath(tmp_path / 'e.tflite')
    export(src, os.fspath(out / 'weights.wof'), dst)
    h = read_model(dst)
    ne = next(o for o in h.ops if o.name == 'NOT_EQUAL')
    assert h.tensors[ne.outputs[0]].dtype == 'bool' and \
        len({h.tensors[k].dtype for k in ne.inputs}) == 1, [h.tensors[k] for k in ne.inputs]
    run, who, _ = predictor(dst)
    np.testing.assert_allclose(got, run(x), rtol=1e-5, atol=1e-6, err_msg=who)
    (tmp_path / 's').mkdir()
    step = _step_is_the_gradient(src, forward, tmp_path / 's', ('emb', 'w'),
                                 np.array([[2, 0, 5, 2, 0]], F32))
    assert np.all(step['emb'][0] == 0) and np.all(step['emb'][[2, 5]] != 0)


@pytest.mark.parametrize('opt, batch', [('sgd', 1), ('adam', 1), ('adam', 2)])
def test_a_rank_trains_its_rows_only(tmp_path, opt, batch):
    """--ranks on the GATHER (the table's rows are its output channels): the rows in
    the rank move, the others stay bit for bit, whether the rows are stepped in place
    (SGD b1), summed whole and cut (Adam b1) or summed at the rank's rows (batch 2), on
    unix MicroPython."""
    from host_tools.files.wof import read_wof
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    src, _ = build_keras_embedding(tmp_path / 'e.tflite')
    x = _ids(8)
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, 0] > 3).astype(np.int64))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer=opt, lr=0.1, batch=batch, epochs=1, ranks='4:low', log=lambda *a: None)
    code, text = runner.run(os.fspath(out), python=runner.find_micropython() is None, stream=False)
    assert code == 0, text
    g = read_model(src)
    w0, w1 = read_wof(out / 'weights.wof', g), read_wof(out / 'trained.wof', g)
    k = next(t.index for t in g.tensors if t.name == 'emb')
    moved = np.abs(w1[k] - w0[k]).reshape(N, D).max(1) > 0
    assert not moved[:N // 2].any() and moved[N // 2:].all(), moved


@pytest.mark.parametrize('fix, says', [
    (lambda x: x.__setitem__((2, 3), 9.0), 'holds id 9 (1 outside -7..6)'),
    (lambda x: x.__setitem__((0, 0), 1.5), 'values that are not integers'),
    (lambda x: None, ''),
])
def test_prepare_checks_the_ids_in_the_data(tmp_path, fix, says):
    """The host refuses data whose ids the table has no row for (or that are not
    integers), naming the op, the id and the range, as TFLite's GATHER and the board
    would stop at it; ids in range (negatives from the end) prepare."""
    from host_tools.graph.passes import PrepareError
    from host_tools.prepare.pipeline import prepare
    src, _ = build_keras_embedding(tmp_path / 'e.tflite')
    x = _ids(4)
    x[1, 1] = -7.0
    fix(x)
    np.savez(tmp_path / 'd.npz', x=x, y=np.zeros((4, O), F32))
    go = lambda: prepare(src, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),  # noqa: E731
                         loss='mse', log=lambda *a: None)
    if not says:
        go()
        return
    with pytest.raises(PrepareError) as e:
        go()
    assert src in str(e.value) and says in str(e.value), str(e.value)
