"""int8 BATCH_MATMUL (a BIN layer with 'bo' 8: utrain.q8bmm, issue 28's attention), in a
graph built here: x [1, 8] -> FC -> a [2, 3, 4] and FC -> b [1, 2, 4]; s = a b^T
(adj_y, b's batch broadcast) [2, 3, 2]; t = s^T a (adj_x, a read twice) [2, 2, 4]; FC
-> logits [3].  The forward bit-exact with TFLite Micro on the file as written; the
first FC's update through both products (and the held gradient of a) against finite
differences of the float forward of the dequantized graph; the planner's
input-gradient buffers cover what the device allocates (the gradients to a and b are
larger than the products' outputs); the same integers under viper.  And a SOFTMAX
inside the graph (utrain.q8smx: attention's softmax(Q K^T)): bit-exact with TFLite Micro,
its gradient against finite differences."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from test_q8 import spy_updates  # noqa: E402
from test_q8_cat import MP, _step_against_fd, _viper_matches  # noqa: E402


def act_quant(acts, xs):
    """Each activation's int8 quantization ({'scale', 'zero_point'}) from its range over
    the inputs xs, 1.2x as wide (no clamps); acts(x): the activations, in order."""
    R = None
    for x in xs:
        vs = acts(x)
        R = R or [[0.0, 0.0] for _ in vs]
        for k, v in enumerate(vs):
            R[k] = [min(R[k][0], v.min()), max(R[k][1], v.max())]
    Q = []
    for lo, hi in R:
        lo, hi = lo * 1.2, hi * 1.2
        s = (hi - lo) / 255
        Q.append({'scale': [s], 'zero_point': [int(np.clip(round(-128 - lo / s), -128, 127))]})
    return Q


def build_int8_bmm(path, seed=0):
    """The graph above, every activation's scale and zero point from its range on random
    inputs (no clamps: a bit wider), per-tensor int8 weights, no biases.  Returns (path,
    float forward of the dequantized graph f(x [8], w1 [24, 8] or None) -> logits, w1's
    scale, x's scale)."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(seed)
    ws = [r.standard_normal(s) * k for s, k in (((24, 8), 0.15), ((8, 8), 0.15), ((3, 16), 0.3))]
    qw = [(np.abs(w).max() / 127, np.round(w / (np.abs(w).max() / 127)).astype(np.int8)) for w in ws]
    wq = [q * s for s, q in qw]
    sx = 0.02

    def fwd(x, w1=None):
        a = ((wq[0] if w1 is None else w1) @ x).reshape(2, 3, 4)
        b = (wq[1] @ x).reshape(1, 2, 4)
        s = a @ np.swapaxes(b, -1, -2)
        t = np.swapaxes(s, -1, -2) @ a
        return wq[2] @ t.reshape(16), (a, b, s, t)
    Q = act_quant(lambda x: (*fwd(x)[1], fwd(x)[0]), r.uniform(-2.5, 2.5, (64, 8)))
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 8], dtype='int8', quant={'scale': [sx], 'zero_point': [0]})
    w = [b.tensor(f'w{i}', q.shape, data=q, quant={'scale': [s], 'zero_point': [0]})
         for i, (s, q) in enumerate(qw)]
    fa = b.tensor('fa', [1, 24], dtype='int8', quant=Q[0])
    fb = b.tensor('fb', [1, 8], dtype='int8', quant=Q[1])
    a = b.tensor('a', [2, 3, 4], dtype='int8', quant=Q[0])
    bt = b.tensor('b', [1, 2, 4], dtype='int8', quant=Q[1])
    s = b.tensor('s', [2, 3, 2], dtype='int8', quant=Q[2])
    t = b.tensor('t', [2, 2, 4], dtype='int8', quant=Q[3])
    tf = b.tensor('tf', [1, 16], dtype='int8', quant=Q[3])
    y = b.tensor('y', [1, 3], dtype='int8', quant=Q[4])
    b.op('FULLY_CONNECTED', [x, w[0], -1], [fa])
    b.op('FULLY_CONNECTED', [x, w[1], -1], [fb])
    b.op('RESHAPE', [fa, b.tensor('sa', [3], data=np.array([2, 3, 4], np.int32))], [a])
    b.op('RESHAPE', [fb, b.tensor('sb', [3], data=np.array([1, 2, 4], np.int32))], [bt])
    b.op('BATCH_MATMUL', [a, bt], [s], adjoint_lhs=False, adjoint_rhs=True)
    b.op('BATCH_MATMUL', [s, a], [t], adjoint_lhs=True, adjoint_rhs=False)
    b.op('RESHAPE', [t, b.tensor('st', [2], data=np.array([1, 16], np.int32))], [tf])
    b.op('FULLY_CONNECTED', [tf, w[2], -1], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(path)), (lambda x, w1=None: fwd(x, w1)[0]), qw[0][0], sx


def _net(tmp_path, build=None):
    """The model build (build_int8_bmm's or build_int8_softmax's) prepared in tmp_path:
    (path, fwd, w1's scale, x's scale, q8.json)."""
    os.makedirs(tmp_path, exist_ok=True)
    path, fwd, sw, sx = (build or build_int8_bmm)(tmp_path / 'm.tflite')
    quant.write(quant.rewritten(read_model(path)), str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    return path, fwd, sw, sx, m


def _x(i):
    return np.random.default_rng(40 + i).integers(-125, 126, 8).astype(np.int8)


def test_forward_bit_exact_with_tflite_micro(tmp_path):
    from test_q8_bin import _tflm_matches
    path, _, _, _, m = _net(tmp_path)
    bm = [d for d in m['layers'] if d['k'] == quant.BIN]
    assert [d['bo'] for d in bm] == [8, 8]
    assert bm[0]['bm'] == [3, 4, 2, 4, 1, 1, 4] and bm[0]['bb'] == [0, 0, 12, 0]
    assert bm[1]['bm'] == [2, 3, 4, 1, 2, 4, 1] and bm[1]['gn'] == 24 > bm[1]['nout']
    _tflm_matches(path, m, tmp_path, [_x(i) for i in range(8)], 6)


def test_small_sums_buffer_chunks_the_same(tmp_path):
    """A sums buffer smaller than a product's output (12, 16 values): the same bytes."""
    from array import array
    _, _, _, _, m = _net(tmp_path)
    want = [bytes(Q8Net(m, str(tmp_path / 'weights.wof')).forward(bytearray(_x(i).tobytes())))
            for i in range(3)]
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    net.acc = array('i', [0] * 5)       # (what utrain.q8bmm chunks by)
    assert [bytes(net.forward(bytearray(_x(i).tobytes()))) for i in range(3)] == want


@pytest.mark.parametrize('made', ['products', 'softmax'])
def test_update_through_them_matches_finite_differences(tmp_path, monkeypatch, made):
    """The first FC's int8 update through both products (and a's held gradient), or
    through the softmax, against finite differences of the float forward."""
    got = spy_updates(monkeypatch)
    path, fwd, sw, sx, m = (_net if made == 'products' else _snet)(tmp_path)
    w0 = next(t for t in read_model(path).tensors if t.name == 'w0')
    wf = w0.data.astype(np.float64) * sw
    cos = []
    for i in range(5):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        xq = _x(i)
        up, ref, c = _step_against_fd(net, got, xq, i % 3, 0.01, sw, fwd,
                                      xq.astype(np.float64) * sx, wf, 1e-4)
        assert len(up) == wf.size
        cos.append(c)
        assert 0.5 < np.linalg.norm(up) / np.linalg.norm(ref) < 2, i
    assert min(cos) > 0.99 and np.mean(cos) > 0.995, cos


def test_plan_covers_the_input_gradient_buffers(tmp_path):
    """The gradients to a (24 values) and b (8) are larger than the products' outputs (12,
    16): q8load.gin (the planner's _gbuf size) holds them, and a step allocates no larger."""
    from utrain import q8load
    _, _, _, _, m = _net(tmp_path)
    ls = m['layers']
    assert q8load.gin(ls) >= 24 and q8load.gtwo(ls)
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    net.step(bytearray(_x(0).tobytes()), 1, 0.01)
    assert net.gb is not None and len(net.gb[0]) == q8load.gin(ls)


def test_bad_operands_refused_naming_the_file(tmp_path):
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    q = {'scale': [0.05], 'zero_point': [0]}
    x = b.tensor('x', [1, 2, 3], dtype='int8', quant=q)
    z = b.tensor('z', [1, 2, 2], dtype='int8', quant=q)
    b.op('BATCH_MATMUL', [x, x], [z])           # [2, 3] by [2, 3]: K 3 against 2
    b.inputs(x)
    b.outputs(z)
    p = b.save(str(tmp_path / 'bad.tflite'))
    with pytest.raises(ValueError, match=r'bad\.tflite: BATCH_MATMUL op 0: operands .* do not make'):
        quant.layers(quant.rewritten(read_model(p)), 'all')


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_viper_steps_as_the_host(tmp_path):
    """The products and the softmax: the same integers under viper as on the host."""
    _net(tmp_path)
    _viper_matches(tmp_path, tmp_path, [_x(i) for i in range(3)])
    _snet(tmp_path / 's')
    _viper_matches(tmp_path, tmp_path / 's', [_x(i) for i in range(3)])


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
@pytest.mark.parametrize('build,mod', [('bmm', 'q8bmm'), ('softmax', 'q8smx')])
def test_the_plan_bounds_the_heap_it_needs(tmp_path, build, mod):
    """prepare plans q8bmm (its code, its parameters, the input-gradient buffers 'gn'
    asks for) and q8smx (its code, its tables): the run trains in the planned heap on
    unix MicroPython, not in plan / 1.2; the modules the plan counts load them."""
    from test_q8_bin import plan_bounds_the_heap
    from host_tools.plan.memory import q8_modules
    path = globals()['build_int8_' + build](tmp_path / 'm.tflite')[0]
    x = np.random.default_rng(4).uniform(-2.4, 2.4, (6, 8)).astype(np.float32)
    plan_bounds_the_heap(tmp_path, path, x)
    with open(tmp_path / 'run' / 'q8.json') as f:
        assert mod in q8_modules(json.load(f))[1]


def build_int8_softmax(path, seed=1):
    """x [1, 8] -> FC -> [1, 24] -> RESHAPE [1, 4, 6] -> SOFTMAX over rows of 6 (inside
    the graph: scale 1/256, zero point -128, as TFLite writes it) -> RESHAPE [1, 24] ->
    FC -> logits [3].  Returns (path, float forward f(x [8], w1 or None), w1's scale, x's)."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(seed)
    ws = [r.standard_normal(s) * k for s, k in (((24, 8), 0.6), ((3, 24), 1.5))]
    qw = [(np.abs(w).max() / 127, np.round(w / (np.abs(w).max() / 127)).astype(np.int8)) for w in ws]
    wq = [q * s for s, q in qw]
    sx = 0.02

    def fwd(x, w1=None, both=False):
        h = ((wq[0] if w1 is None else w1) @ x).reshape(4, 6)
        e = np.exp(h - h.max(-1, keepdims=True))
        y = wq[1] @ (e / e.sum(-1, keepdims=True)).reshape(24)
        return (y, h) if both else y
    R = [[0.0, 0.0], [0.0, 0.0]]
    for x in r.uniform(-2.5, 2.5, (64, 8)):
        for k, v in enumerate(fwd(x, both=True)[::-1]):
            R[k] = [min(R[k][0], v.min()), max(R[k][1], v.max())]
    Q = []
    for lo, hi in R:
        s = (hi - lo) * 1.2 / 255
        Q.append({'scale': [s], 'zero_point': [int(np.clip(round(-128 - lo * 1.2 / s), -128, 127))]})
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 8], dtype='int8', quant={'scale': [sx], 'zero_point': [0]})
    w = [b.tensor(f'w{i}', q.shape, data=q, quant={'scale': [s], 'zero_point': [0]})
         for i, (s, q) in enumerate(qw)]
    ps = {'scale': [1 / 256], 'zero_point': [-128]}
    h = b.tensor('h', [1, 24], dtype='int8', quant=Q[0])
    h3 = b.tensor('h3', [1, 4, 6], dtype='int8', quant=Q[0])
    p3 = b.tensor('p3', [1, 4, 6], dtype='int8', quant=ps)
    p = b.tensor('p', [1, 24], dtype='int8', quant=ps)
    y = b.tensor('y', [1, 3], dtype='int8', quant=Q[1])
    b.op('FULLY_CONNECTED', [x, w[0], -1], [h])
    b.op('RESHAPE', [h, b.tensor('s3', [3], data=np.array([1, 4, 6], np.int32))], [h3])
    b.op('SOFTMAX', [h3], [p3], beta=1.0)
    b.op('RESHAPE', [p3, b.tensor('s2', [2], data=np.array([1, 24], np.int32))], [p])
    b.op('FULLY_CONNECTED', [p, w[1], -1], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(path)), fwd, qw[0][0], sx


def _snet(tmp_path):
    return _net(tmp_path, build_int8_softmax)


def test_softmax_inside_the_graph_bit_exact_with_tflite_micro(tmp_path):
    from test_q8_bin import _tflm_matches
    path, _, _, _, m = _snet(tmp_path)
    assert [d.get('sm') for d in m['layers'] if d['k'] == quant.LUT] == [6]
    _tflm_matches(path, m, tmp_path, [_x(i) for i in range(12)], 10)


def _softmax_reshape(path, out_shape, n=4, w=None):
    """int8 x [1, 6] -> FC -> [1, n] -> SOFTMAX -> RESHAPE to out_shape (a Keras Reshape
    after its Softmax)."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 6], dtype='int8', quant={'scale': [0.05], 'zero_point': [0]})
    h = b.tensor('h', [1, n], dtype='int8', quant={'scale': [0.1], 'zero_point': [3]})
    w = np.random.default_rng(0).integers(-60, 61, (n, 6)).astype(np.int8) if w is None else w
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [n, 6], data=w, quant={'scale': [0.01], 'zero_point': [0]}),
                             b.tensor('b', [n], data=np.zeros(n, np.int32),
                                      quant={'scale': [0.0005], 'zero_point': [0]})], [h])
    p = b.tensor('p', [1, n], dtype='int8', quant={'scale': [1 / 256], 'zero_point': [-128]})
    y = b.tensor('y', out_shape, dtype='int8', quant={'scale': [1 / 256], 'zero_point': [-128]})
    b.op('SOFTMAX', [h], [p], beta=1.0)
    b.op('RESHAPE', [p, b.tensor('s', [len(out_shape)], data=np.array(out_shape, np.int32))], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(path))


def test_a_final_softmax_behind_a_reshape_trains_as_int8(tmp_path):
    """The model's own SOFTMAX with a RESHAPE after it that keeps the rows (a Keras
    Reshape after its Softmax) is the loss's: it goes after the RESHAPE (had been refused:
    trained only dequantized), the FC trains as int8 (host simulation, the loss falls and
    the accuracy rises), and the export, SOFTMAX last, gives under TFLite Micro the
    softmax of the trained board's logits as the file's output shape.  A RESHAPE that
    joins the softmax's rows ([1, 2, 3] -> [1, 6]) is still refused naming the file and op."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.prepare.pipeline import prepare, export
    from host_tools.target.runner import run
    src = _softmax_reshape(tmp_path / 'end.tflite', [1, 1, 4], w=np.zeros((4, 6), np.int8))
    g = quant.rewritten(read_model(src))
    assert [(op.name, op.number) for op in g.ops] == [
        ('FULLY_CONNECTED', 0), ('RESHAPE', 2), ('SOFTMAX', 1)]
    r = np.random.default_rng(1)
    xs = r.uniform(-4, 4, (80, 6)).astype(np.float32)
    ys = np.argmax(xs[:, :4], 1)
    np.savez(tmp_path / 'd.npz', x=(xs / 0.05).round().clip(-128, 127).astype(np.int8), y=ys)
    lines = []
    s = prepare(src, str(tmp_path / 'run'), data=str(tmp_path / 'd.npz'), loss='scce',
                train='all', optimizer='sgd', lr=1.0, epochs=10, log=lines.append)
    assert s.get('int8') and not any('dequantiz' in ln for ln in lines), lines
    code, text = run(str(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    rows = [ln.split(',') for ln in open(tmp_path / 'run' / 'train.log').read().split()[1:]]
    assert float(rows[-1][1]) < 0.8 * float(rows[0][1]), rows
    out = str(tmp_path / 'trained.tflite')
    export(src, str(tmp_path / 'run' / 'trained.wof'), out)
    go = read_model(out)
    assert [op.name for op in go.ops] == ['FULLY_CONNECTED', 'RESHAPE', 'SOFTMAX']
    it0, it = (runtime.Interpreter.from_file(p) for p in (src, out))
    acc = []
    for i in (it0, it):
        hit = 0
        for x, y in zip(xs, ys):
            i.set_input((x / 0.05).round().clip(-128, 127).astype(np.int8).reshape(1, 6), 0)
            i.invoke()
            o = i.get_output(0)
            assert o.shape == (1, 1, 4)
            hit += int(np.argmax(o) == y)
        acc.append(hit / len(ys))
    assert acc[1] > acc[0] + 0.12, acc
    src = _softmax_reshape(tmp_path / 'rows.tflite', [1, 6], n=6)
    g = read_model(src)
    g.tensors[g.ops[1].outputs[0]].shape = [1, 2, 3]      # (softmax over rows of 3)
    g.tensors[g.ops[0].outputs[0]].shape = [1, 2, 3]
    from host_tools.graph.inout import save_graph
    save_graph(g, str(tmp_path / 'rows3.tflite'))
    with pytest.raises(ValueError, match=r'rows3\.tflite: SOFTMAX op 1 is the model.s last.*--dequantize'):
        quant.layers(quant.rewritten(read_model(str(tmp_path / 'rows3.tflite'))), 'all')
