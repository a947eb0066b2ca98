"""A normalization by constant statistics, (x - mean) * (1 / std) or (x - mean) / std, as
Keras's Normalization layer (trainable=False there) and a PyTorch model's buffers export
it, stays the file's under --train all; a folded BatchNorm's MUL and ADD constants (its
trained gamma and beta) and the layers' weights train.  The float path had trained the
mean and 1 / std like weights (SGD steps on statistics of inputs in the tens).  A clip's
bounds (MAXIMUM / MINIMUM by constants) stay too."""
import os

import numpy as np

from kerasgraphs import build_keras_normalized
from host_tools.formats.circle_build import CircleBuilder
from host_tools.formats.circle_io import read_model
from host_tools.prepare.pipeline import prepare, export
from host_tools.target import runner

F32 = np.float32


def _sub_div_bn(path, F=4, H=5, O=3, seed=1):
    """x -> SUB(mean) -> DIV(std) -> MUL(gamma) -> ADD(beta) -> FC(H, relu) -> FC(O): a
    PyTorch-style normalization of buffers, then a BatchNorm folded as MUL and ADD."""
    r = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    t = {n: b.tensor(n, [1, k]) for n, k in (('x', F), ('s', F), ('d', F), ('m', F), ('a', F),
                                            ('h', H), ('y', O))}
    c = lambda n, v: b.tensor(n, list(v.shape), data=v.astype(F32))     # noqa: E731
    b.op('SUB', [t['x'], c('mean', r.uniform(5, 9, F))], [t['s']])
    b.op('DIV', [t['s'], c('std', r.uniform(2, 4, F))], [t['d']])
    b.op('MUL', [t['d'], c('gamma', r.uniform(0.5, 1.5, F))], [t['m']])
    b.op('ADD', [t['m'], c('beta', r.uniform(-0.2, 0.2, F))], [t['a']])
    b.op('FULLY_CONNECTED', [t['a'], c('w1', r.standard_normal((H, F)) * 0.5), c('b1', np.zeros(H))],
         [t['h']], fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [t['h'], c('w2', r.standard_normal((O, H)) * 0.5), c('b2', np.zeros(O))],
         [t['y']])
    b.inputs(t['x'])
    b.outputs(t['y'])
    return b.save(os.fspath(path))


def _data(tmp_path, x, n_out):
    y = (x @ np.random.default_rng(2).standard_normal((x.shape[1], n_out))).argmax(1)
    np.savez(tmp_path / 'd.npz', x=x.astype(F32), y=y)
    return str(tmp_path / 'd.npz')


def test_normalization_statistics_stay_and_the_rest_trains(tmp_path):
    cases = []
    src, _, make_x = build_keras_normalized(tmp_path / 'n.tflite')
    cases.append((src, make_x(48), {'mean', 'inv_std', 'mean_h', 'inv_std_h'}, {'w1', 'b1', 'w2', 'b2'}))
    src2 = _sub_div_bn(tmp_path / 'bn.tflite')
    x2 = np.random.default_rng(3).standard_normal((48, 4)) * 3 + 7
    cases.append((src2, x2, {'mean', 'std'}, {'gamma', 'beta', 'w1', 'b1', 'w2', 'b2'}))
    for k, (src, x, frozen, trained) in enumerate(cases):
        o = str(tmp_path / f'o{k}')
        said = []
        s = prepare(src, o, data=_data(tmp_path, x, 3), epochs=2, train='all', from_logits=True,
                    loss='scce', optimizer='sgd', lr=0.05, batch=1, int8=False, log=said.append)
        names = set(s['trainable'])
        assert names == trained, (src, names)
        assert any('normalize by constant statistics' in v and "stay the file's" in v
                   for v in said), said
        code, out = runner.run(o, python=True, stream=False)
        assert code == 0, out
        rows = [v.split(',') for v in open(os.path.join(o, 'train.log')).read().split()[1:]]
        assert len(rows) == 2 and all(np.isfinite(float(r[1])) for r in rows), rows
        out_model = str(tmp_path / f'out{k}.tflite')
        export(src, os.path.join(o, 'trained.wof'), out_model)
        g0, g1 = read_model(src), read_model(out_model)
        by = {t.name: t for t in g1.tensors}
        moved = set()
        for t in g0.tensors:
            if t.data is None or t.name not in by:
                continue
            if not np.array_equal(t.data, by[t.name].data):
                moved.add(t.name)
        assert moved == trained, (src, moved, frozen)


def _clipped(path, H=6, O=3, seed=4):
    """x -> FC(H) -> MINIMUM(hi) -> MAXIMUM(lo) -> FC(O), the bounds per channel
    (tf.clip_by_value by vectors, torch.clamp by tensors)."""
    r = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    t = {n: b.tensor(n, [1, k]) for n, k in (('x', 4), ('h', H), ('m', H), ('c', H), ('y', O))}
    c = lambda n, v: b.tensor(n, list(v.shape), data=v.astype(F32))     # noqa: E731
    b.op('FULLY_CONNECTED', [t['x'], c('w1', r.standard_normal((H, 4))), c('b1', np.zeros(H))], [t['h']])
    b.op('MINIMUM', [t['h'], c('hi', r.uniform(0.5, 1.5, H))], [t['m']])
    b.op('MAXIMUM', [t['m'], c('lo', r.uniform(-1.5, -0.5, H))], [t['c']])
    b.op('FULLY_CONNECTED', [t['c'], c('w2', r.standard_normal((O, H)) * 0.5), c('b2', np.zeros(O))], [t['y']])
    b.inputs(t['x'])
    b.outputs(t['y'])
    return b.save(os.fspath(path))


def test_a_clips_bounds_stay_and_the_layers_train(tmp_path):
    """A clip by per-channel constants trains its layers, not its bounds: the float path
    spells MAXIMUM(a, b) as b + RELU(a - b) with a copy of b, and had trained the two
    copies apart (the exported model then no clip at all)."""
    src = _clipped(tmp_path / 'c.tflite')
    x = np.random.default_rng(5).standard_normal((48, 4))
    o = str(tmp_path / 'o')
    s = prepare(src, o, data=_data(tmp_path, x, 3), epochs=2, train='all', from_logits=True,
                loss='scce', optimizer='sgd', lr=0.1, batch=1, int8=False, log=lambda *a: None)
    assert set(s['trainable']) == {'w1', 'b1', 'w2', 'b2'}, s['trainable']
    code, out = runner.run(o, python=True, stream=False)
    assert code == 0, out
    export(src, os.path.join(o, 'trained.wof'), str(tmp_path / 'out.tflite'))
    g0, g1 = read_model(src), read_model(str(tmp_path / 'out.tflite'))
    # (written as trained: the spelled form, each bound and its copy the file's)
    was = {t.name: t.data for t in g0.tensors if t.data is not None}
    bounds = [t for t in g1.tensors if t.data is not None and t.name.split('/')[0] in ('hi', 'lo')]
    assert len(bounds) >= 3, [t.name for t in g1.tensors]
    for t in bounds:
        assert np.array_equal(t.data, was[t.name.split('/')[0]]), t.name
    by = {t.name: t for t in g1.tensors}
    assert not np.array_equal(by['w1'].data, was['w1'])


def _fill_state(path, F=4, H=5, O=3, seed=4):
    """One unrolled LSTM step as Keras 3 writes it: the zero initial state a FILL (of a
    shape the host knows), read by the FC on h0 and by the MUL f * c0:
    x -> FC(W) -> a; h0 -> FC(R) -> r; a + r -> s; sigmoid(s) * c0 + tanh(s) -> c; FC -> y."""
    r = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    t = {n: b.tensor(n, [1, k]) for n, k in (('x', F), ('zeros', H), ('a', H), ('r', H), ('s', H),
                                            ('f', H), ('m', H), ('g', H), ('c', H), ('y', O))}
    c = lambda n, v: b.tensor(n, list(v.shape), data=v.astype(F32))     # noqa: E731
    b.op('FILL', [b.tensor('dims', [2], data=np.array([1, H], np.int32)),
                  b.tensor('zero', [], data=np.array(0.0, F32))], [t['zeros']])
    b.op('FULLY_CONNECTED', [t['x'], c('W', r.standard_normal((H, F))), c('b', r.standard_normal(H))], [t['a']])
    b.op('FULLY_CONNECTED', [t['zeros'], c('R', r.standard_normal((H, H))), -1], [t['r']])
    b.op('ADD', [t['a'], t['r']], [t['s']])
    b.op('LOGISTIC', [t['s']], [t['f']])
    b.op('MUL', [t['f'], t['zeros']], [t['m']])
    b.op('TANH', [t['s']], [t['g']])
    b.op('ADD', [t['m'], t['g']], [t['c']])
    b.op('FULLY_CONNECTED', [t['c'], c('w2', r.standard_normal((O, H))), c('b2', r.standard_normal(O))], [t['y']])
    b.inputs(t['x'])
    b.outputs(t['y'])
    b.save(path)
    return str(path)


def test_a_keras_recurrent_layers_filled_zero_state_stays_zero(tmp_path):
    """Issue 28 (session 18): a Keras LSTM or GRU (unroll=True) makes its zero initial state
    with a FILL, folded on the host into a constant that the first step's MUL (f * c0,
    z * h0) reads: the float path trained it as that MUL's weight (410 trainable
    parameters for Keras's 402; the converter's one h0 = c0 trained as both).  Keras does
    not train it: it stays zero, the layers' weights train.  (tico's constant initial
    state, a constant in the file, trains as docs/models.md says: test_zoo.)"""
    src = _fill_state(tmp_path / 'z.tflite')
    o = str(tmp_path / 'o')
    x = np.random.default_rng(3).standard_normal((48, 4))
    s = prepare(src, o, data=_data(tmp_path, x, 3), epochs=2, train='all', from_logits=True,
                loss='scce', optimizer='sgd', lr=0.05, batch=1, int8=False, log=lambda *a: None)
    assert set(s['trainable']) == {'W', 'b', 'R', 'w2', 'b2'}, s['trainable']
    code, out = runner.run(o, python=True, stream=False)
    assert code == 0, out
    rows = [v.split(',') for v in open(os.path.join(o, 'train.log')).read().split()[1:]]
    assert len(rows) == 2 and all(np.isfinite(float(r[1])) for r in rows), rows
