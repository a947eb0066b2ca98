"""Int8 models as Keras 3's converter writes them (issue 28), built here: the int8 path
runs the float path's rewrites that apply (the run-time batch of a Reshape folded, a
global REDUCE_MAX as a max pool) and names ops by the file's numbers; CONCATENATION of
any number of inputs (one read twice) and a PAD read by a pool are one layer kind
(utrain.q8cat). The forward against TFLite Micro on the file as written, the inputs at
another scale against a float forward of the dequantized graph, the conv's update
through every one of them against finite differences of that float forward, and the
same integers under viper (unix MicroPython)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from kerasgraphs import build_keras_int8_cat  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from q8cases import tflm_agrees  # noqa: E402
from test_q8 import spy_updates  # noqa: E402

L = 10


def _net(tmp_path, differ=False, train='all'):
    path, fwd, sw = build_keras_int8_cat(tmp_path / 'k.tflite', differ=differ)
    g = quant.rewritten(read_model(path))
    quant.write(g, str(tmp_path), train)
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)                    # as the board reads it
    return path, fwd, sw, m, Q8Net(m, str(tmp_path / 'weights.wof'))


def _x(seed):
    r = np.random.default_rng(50 + seed)
    return r.integers(-100, 100, (L, 3)).astype(np.int8)


def _outs(net, xq):
    """Each layer's int8 output as it was made (the arena reuses a dead tensor's bytes)."""
    from utrain.q8 import ADD, CAT
    t = net.t
    t[net.xin] = bytearray(xq.tobytes())
    outs = []
    for L in net.layers:
        if L.k >= CAT:
            y = net.X[L.k].fwd(L, net, t)
        elif L.k == ADD:
            y = L.forward(t[L.ins[0]], t[L.ins[1]])
        else:
            y = L.forward(t[L.ins[0]])
        outs.append(np.frombuffer(bytes(y), np.int8).astype(np.float64))
    return outs


def test_rewrites_and_file_numbers(tmp_path):
    path, _, _, m, _ = _net(tmp_path)
    assert [d['k'] for d in m['layers']] == [quant.CONV, quant.CAT, quant.POOL_MAX, quant.CAT,
                                             quant.MEAN, quant.POOL_MAX, quant.CAT, quant.FC]
    assert m['layers'][1].get('fill') and not m['layers'][3].get('fill')   # the PAD's border
    assert len(m['layers'][6]['in']) == 3 and m['layers'][6]['in'][0] == m['layers'][6]['in'][2]
    g = quant.rewritten(read_model(path))
    # --train and --ranks count the file's ops: op 4 is the conv, op 11 the FC
    ls = quant.layers(g, [4])
    assert [d['k'] for d in ls if d.get('train')] == [quant.CONV]
    ls = quant.layers(quant.rewritten(read_model(path)), 'last:1')
    assert [d['k'] for d in ls if d.get('train')] == [quant.FC]
    with pytest.raises(ValueError, match=r'k\.tflite: --ranks names op 7 \(CONCATENATION\)'):
        quant.layers(quant.rewritten(read_model(path)), 'none', {7: 1})


def test_a_conv_output_shape_the_file_got_wrong_is_named(tmp_path):
    """A conv whose output shape in the file does not follow from its input and geometry
    (a converter's static shape after a shape read at run time: a held-out int8
    UpSampling2D -> Conv2D crashed the int8 kernels with 'buffer is smaller than requested
    size') is refused naming the file, the op and both shapes."""
    path, _, _ = build_keras_int8_cat(tmp_path / 'k.tflite')
    g = read_model(path)
    conv = next(op for op in g.ops if op.name == 'CONV_2D')
    y = g.tensors[conv.outputs[0]]
    y.shape = [1, y.shape[1], y.shape[2] + 2, y.shape[3]]
    with pytest.raises(ValueError, match=r'k\.tflite: op 4 CONV_2D: the file gives its output '
                                         r'shape \[1, .* its geometry give'):
        quant.rewritten(g)


def test_forward_bit_exact_with_tflite_micro(tmp_path):
    path, _, _, m, net = _net(tmp_path)
    tflm_agrees(path, net, [_x(i) for i in range(6)])


def test_requantized_inputs_against_the_float_graph(tmp_path):
    """The MEAN at another scale and zero point than the CONCATENATION that reads it:
    requantized to the output's, within a step of the float forward's value."""
    path, fwd, _, m, net = _net(tmp_path, differ=True)
    cat = m['layers'][6]
    assert cat['mul'][0] and not cat['mul'][1] and cat.get('cl')
    for i in range(4):
        xq = _x(i)
        o = _outs(net, xq)
        h, m1 = o[6], o[4]
        # each copy of the MEAN: its own int8 value requantized, within a step
        want = np.clip(np.round((m1 + 100) * 0.5) - 128, -128, 127)
        assert np.abs(h[:8] - want).max() <= 1 and np.abs(h[16:] - want).max() <= 1
        assert np.array_equal(h[8:16], o[5])
        assert len(set(want.tolist())) > 3          # (not all at a clamp)


@pytest.mark.parametrize('differ', [False, True])
def test_conv_update_through_cat_pad_pools_matches_finite_differences(tmp_path, monkeypatch,
                                                                      differ):
    """The conv's int8 update (lr dL/dW / s_W in 1/256 steps, through the FC, the
    three-input CONCATENATION with its input read twice, the MEAN and the max, the
    channel CONCATENATION, the pool and the PAD) against finite differences of the
    float forward of the dequantized graph."""
    got = spy_updates(monkeypatch)
    path, fwd, sw, m, net = _net(tmp_path, differ)
    lr = 0.01
    cos = []
    w0 = next(t for t in read_model(path).tensors if t.name == 'w')
    wf = w0.data.astype(np.float64) * sw[:, None, None, None]
    for i in range(4):
        xq, label = _x(i), i % 3
        # (the scales the update is in: a channel's doubles where its weights reach
        # +-127, utrain.q8grow)
        swn = np.array([L for L in net.layers if L.train][0].d['sw'], np.float64)
        conv, ref, c = _step_against_fd(net, got, xq, label, lr, swn.repeat(9), fwd,
                                        xq.astype(np.float64) * 0.05, wf, 1e-4)
        cos.append(c)
        assert 0.6 < np.linalg.norm(conv) / np.linalg.norm(ref) < 1.6
    assert min(cos) > 0.85 and np.mean(cos) > 0.95, cos      # (int8 rounding, ties)



def _fd_grad(fwd, xf, w, label, eps):
    """The gradient of the softmax cross-entropy of fwd(xf, w) at label with respect to w,
    by central differences of step eps, flattened (the float reference of an update)."""
    def loss(v):
        z = fwd(xf, v)
        z = z - z.max()
        return np.log(np.exp(z).sum()) - z[label]
    num = np.zeros_like(w)
    for k in np.ndindex(w.shape):
        e = np.zeros_like(w)
        e[k] = eps
        num[k] = (loss(w + e) - loss(w - e)) / (2 * eps)
    return num.reshape(-1)


def _step_against_fd(net, got, xq, label, lr, scale, fwd, xf, wf, eps):
    """One SGD step of net on int8 sample xq (got: spy_updates' list): the lowest trained
    layer's update in float (the spied int8 update, in 1/256 steps, times its weight
    scale: what w loses, applied last) and its float reference, lr times the finite
    differences (_fd_grad) of fwd at xf, wf; with their cosine."""
    got.clear()
    net.step(bytearray(xq.tobytes()), label, lr)
    upd = got[-1] / 256.0 * scale
    ref = lr * _fd_grad(fwd, xf, wf, label, eps)
    return upd, ref, float(upd @ ref / (np.linalg.norm(upd) * np.linalg.norm(ref) + 1e-30))


MP = runner.find_micropython()


def _viper_matches(tmp_path, d, xs, lr=0.02):
    """Three SGD steps of the whole model in folder d (q8.json, weights.wof) under viper
    end with the host's weights and biases."""
    with open(d / 'q8.json') as f:
        net = Q8Net(json.load(f), str(d / 'weights.wof'))
    for i, xq in enumerate(xs):
        net.step(bytearray(xq.tobytes()), i % 3, lr)
    want = [bytes(L.w) for L in net.layers if L.w is not None] + [
        list(L.b) for L in net.layers if L.b is not None]
    runner.stage(str(tmp_path / 'st'))
    code = f"""
import sys, json
sys.path.insert(0, {str(tmp_path / 'st' / 'lib')!r})
from utrain.q8 import Q8Net
m = json.load(open({str(d / 'q8.json')!r}))
net = Q8Net(m, {str(d / 'weights.wof')!r})
for i, x in enumerate({[bytes(x.tobytes()) for x in xs]!r}):
    net.step(bytearray(x), i % 3, {lr!r})
print(repr([bytes(L.w) for L in net.layers if L.w is not None] + [list(L.b) for L in net.layers if L.b is not None]))
"""
    out = subprocess.run([MP, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert eval(out.stdout.strip().splitlines()[-1]) == want


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
def test_viper_steps_as_the_host(tmp_path):
    """CAT (requantizing, repeated input, PAD's fill), the held gradients, a LUT
    (LOGISTIC, HARD_SWISH, LOG): the same integers under viper as on the host."""
    from kerasgraphs import build_int8_unary
    _net(tmp_path, differ=True)
    _viper_matches(tmp_path, tmp_path, [_x(i) for i in range(3)])
    r = np.random.default_rng(7)
    for name in ('LOGISTIC', 'HARD_SWISH', 'LOG'):      # (LOG: a derivative scale 'ds')
        d = tmp_path / name
        path, _, _ = build_int8_unary(tmp_path / f'{name}.tflite', name)
        quant.write(quant.rewritten(read_model(path)), str(d), 'all')
        _viper_matches(tmp_path, d, [r.integers(-127, 128, 6).astype(np.int8) for _ in range(3)])


def test_narrow_logits_widen_and_follow_training(tmp_path):
    """Logits a converter calibrated at +-0.26 (a model that had barely learnt): the
    int8 path widens them to +-quant.WIDE_LOGITS (a softmax at +-0.26 can never grow
    confident, and their clamp stops the gradient), lets their range double as they grow
    (q8range's 'rr', the logits alone), computes the same logits on the wider grid, and
    export writes the wider scale; a model's logits at +-12.8 stay as they are."""
    from host_tools.prepare.pipeline import export
    path, fwd, _ = build_keras_int8_cat(tmp_path / 'n.tflite', sy=0.002)
    g0 = read_model(path)
    g = quant.rewritten(g0)
    y = g.tensors[g.outputs[0]]
    assert y.quant['scale'] == [2 * quant.WIDE_LOGITS / 255] and y.quant['zero_point'] == [0]
    assert g0.tensors[g0.outputs[0]].quant['scale'][0] == pytest.approx(0.002)     # (the file's, as read)
    m = quant.meta(g, 'all')
    assert [e[:2] for e in m['rr'][2]] == [[len(m['layers']) - 1, []]]
    net = Q8Net(json.loads(json.dumps(quant.as_written(m)[0]['q8.json'])), _wof(tmp_path, g, m))
    for i in range(3):
        xq = _x(i)
        got = np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8) * (8 / 255)
        ref = fwd(xq.astype(np.float64) * 0.05)
        assert np.abs(ref).max() < 0.26 and np.abs(got - ref).max() <= 0.04, (got, ref)
    # export writes the widened scale (TFLite Micro runs the result)
    run = tmp_path / 'run'
    from host_tools.prepare.pipeline import prepare
    r = np.random.default_rng(3)
    np.savez(tmp_path / 'd.npz', x=r.uniform(-4, 4, (8, L, 3)).astype(np.float32),
             y=r.integers(0, 3, 8))
    prepare(path, str(run), data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd',
            lr=0.01, epochs=1, log=lambda *a: None)
    export(path, str(run / 'weights.wof'), str(tmp_path / 'out.tflite'))
    ge = read_model(str(tmp_path / 'out.tflite'))
    assert ge.tensors[ge.outputs[0]].quant['scale'][0] == pytest.approx(8 / 255)
    # wide logits stay
    path2, _, _ = build_keras_int8_cat(tmp_path / 'w.tflite')
    g2 = quant.rewritten(read_model(path2))
    assert g2.tensors[g2.outputs[0]].quant['scale'][0] == pytest.approx(0.1)


@pytest.mark.parametrize('sy,zy', [(0.1, 0), (0.05, -128), (0.08, 90), (0.1, 127)])
def test_wide_logits_keep_their_range_and_follow_training(tmp_path, sy, zy):
    """Wide logits keep the file's range where it reaches both sides of 0 by at least
    quant.ONE_SIDED of its span: the int8 forward is TFLite Micro's to the bit (a Keras
    Conv1D's at [-136, 0] were once taken as narrow, made +-4 and every one clipped);
    on one side of 0 (here [0, 12.75] and [-25.5, 0]) they get as much room on the other
    (zero point 0), the forward TFLite Micro's within the new scale's rounding: a range
    doubles around 0 (q8range), so a logit past 0 clipped at every width and passed no
    gradient, and scce's logits drift freely (a shift of all of them is the same
    softmax): that Conv1D under Adam crossed 0 in 4 epochs, its logits' range doubled 7
    times and the run stayed at chance.  Any logits' range doubles as training grows
    them (q8range's 'rr', the logits alone): a converter calibrated them on its own data,
    and a fine-tuning step that takes them past it clipped them (a Keras MLP on 0..255
    pixels at +-300 stopped at chance after its first SGD step)."""
    from tflite_micro.python.tflite_micro import runtime
    path, _, _ = build_keras_int8_cat(tmp_path / 'w.tflite', sy=sy, zy=zy)
    g = quant.rewritten(read_model(path))
    y = g.tensors[g.outputs[0]]
    lo, hi = sy * (-128 - zy), sy * (127 - zy)
    one = min(-lo, hi) < quant.ONE_SIDED * (hi - lo)
    s2, z2 = (2 * max(-lo, hi) / 255, 0) if one else (sy, zy)
    assert y.quant['scale'][0] == pytest.approx(s2) and y.quant['zero_point'] == [z2]
    m = quant.meta(g, 'all')
    assert [e[:2] for e in m['rr'][2]] == [[len(m['layers']) - 1, []]]
    net = Q8Net(json.loads(json.dumps(quant.as_written(m)[0]['q8.json'])), _wof(tmp_path, g, m))
    it = runtime.Interpreter.from_file(path)
    outs, n_in = [], 0
    for i in range(4):
        xq = _x(i)
        got = np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8)
        it.set_input(xq.reshape(1, L, 3), 0)
        it.invoke()
        ref = it.get_output(0).ravel()
        if not one:
            assert np.array_equal(got, ref), (got, ref)
        else:           # (where TFLite's are not at the file's clamps)
            inside = (ref > -128) & (ref < 127)
            d = np.abs((got.astype(float) - z2) * s2 - (ref.astype(float) - zy) * sy)
            assert np.all(d[inside] <= (s2 + sy) / 2 + 1e-9), d
            n_in += inside.sum()
        outs.append(got)
    assert len(np.unique(outs)) > 3, outs       # (not all at a clamp)
    assert not one or n_in >= 3
    # the net's range after doublings (as training grows the logits) reaches both sides
    for k in range(3):
        net.rr._scale(0, 1, 1)
        s, z = net.layers[-1].d['sy'], net.layers[-1].zy
        assert s * (-128 - z) < -0.1 * s * 255 and s * (127 - z) > 0.1 * s * 255


def _wof(tmp_path, g, m):
    d = tmp_path / 'q'
    quant.write(g, str(d), 'all', m)
    return str(d / 'weights.wof')


def test_dense_on_a_sequence_and_its_average(tmp_path, monkeypatch):
    """Keras's Dense on [1, T, C] (an FC over each step: a 1x1 convolution) and
    GlobalAveragePooling1D (MEAN over axis 1 of a 3-D tensor): the forward bit-exact with
    TFLite Micro, the first layer's update against finite differences of the float
    graph."""
    from kerasgraphs import build_keras_int8_seq
    path, fwd, s1 = build_keras_int8_seq(tmp_path / 's.tflite')
    g = quant.rewritten(read_model(path))
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert [d['k'] for d in m['layers']] == [quant.CONV, quant.MEAN, quant.FC]
    assert m['layers'][0]['g'][:4] == [1, 7, 5, 6] and m['layers'][1]['n'] == 7
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    r = np.random.default_rng(9)
    xs = [r.integers(-90, 90, (7, 5)).astype(np.int8) for _ in range(4)]
    tflm_agrees(path, net, xs, 0)
    got = spy_updates(monkeypatch)
    w0 = next(t for t in g.tensors if t.name == 'w1').data.astype(np.float64) * s1
    for i, xq in enumerate(xs):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        upd, ref, cos = _step_against_fd(net, got, xq, i % 3, 0.01, s1, fwd,
                                         xq.astype(np.float64) * 0.05, w0, 1e-4)
        assert cos > 0.9 and 0.6 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.6, cos


UNARY = ['LOGISTIC', 'TANH', 'HARD_SWISH', 'RELU', 'RELU6', 'LEAKY_RELU', 'ELU', 'GELU',
         'QUANTIZE', 'EXP', 'LOG', 'RSQRT', 'SQRT']
TFLM_EXACT = ('RELU', 'RELU6', 'QUANTIZE')     # (TFLite Micro's own requantization)


@pytest.mark.parametrize('name', UNARY)
def test_elementwise_op_forward_and_gradient(tmp_path, monkeypatch, name):
    """A standalone elementwise op (utrain.q8lut: a table of the 256 int8 inputs): its
    output against TFLite Micro (the same integers for the requantizing ones, within a
    step for the others, computed there in fixed point), or, where TFLite Micro has no
    int8 kernel, the float function; the first FC's update through it against finite
    differences of the float graph."""
    from kerasgraphs import build_int8_unary, UNARY_OUT
    path, fwd, s1 = build_int8_unary(tmp_path / 'u.tflite', name)
    g = quant.rewritten(read_model(path))
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert [d['k'] for d in m['layers']] == [quant.FC, quant.LUT, quant.FC]
    r = np.random.default_rng(4)
    xs = [r.integers(-127, 128, 6).astype(np.int8) for _ in range(12)]
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    outs = [_outs(net, xq) for xq in xs]
    h = np.concatenate([o[0] for o in outs])
    a = np.concatenate([o[1] for o in outs])
    assert len(set(h.tolist())) > 40
    try:
        from tflite_micro.python.tflite_micro import runtime
        import copy
        from host_tools.graph.inout import save_graph
        g0 = read_model(path)
        gc = copy.deepcopy(g0)
        gc.ops, gc.outputs = gc.ops[:2], [gc.ops[1].outputs[0]]
        it = runtime.Interpreter.from_file(save_graph(gc, str(tmp_path / 'cut.tflite')))
        ref = []
        for xq in xs:
            it.set_input(xq.reshape(1, 6), 0)
            it.invoke()
            ref.append(it.get_output(0).ravel().astype(np.float64))
        ref = np.concatenate(ref)
    except RuntimeError:                 # (no int8 kernel of it in TFLite Micro)
        so, zo = UNARY_OUT[name]
        ref = None
        if name in quant.LUT_F32:       # (TFLite's table, float32: within a step of float64's)
            want = np.clip(np.round(fwd.f(h * 0.04) / so) + zo, -128, 127)
            assert np.abs(a - want).max() <= 1 and (a == want).mean() > 0.95
            if name == 'LOG':           # log 0 = -inf: the lowest code, as TFLite's table
                assert (h <= 0).sum() > 10 and (a[h <= 0] == -128).all()
        elif name == 'SQRT':            # (TFLite's: float32, truncated; a negative input,
            want = np.clip(np.floor(fwd.f(h * 0.04) / so) + zo, -128, 127)   # which it
            assert np.abs(a - want).max() <= 1 and (a == want).mean() > 0.95  # refuses, 0)
            assert (h < 0).sum() > 10 and (a[h <= 0] == zo).all()
        else:
            f = quant.UNARY[name][0]
            want = np.clip(np.round(f((h - 0) * 0.04, {}) / so) + zo, -128, 127)
            assert np.abs(a - want).max() <= 0
    if ref is not None:
        tol = 0 if name in TFLM_EXACT else 1
        assert np.abs(a - ref).max() <= tol, (name, np.abs(a - ref).max())
    got = spy_updates(monkeypatch)
    g8 = read_model(path)
    w0 = next(t for t in g8.tensors if t.name == 'w1').data.astype(np.float64) * s1
    cos = []
    for i, xq in enumerate(xs[:6]):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        upd, ref, c = _step_against_fd(net, got, xq, i % 3, 0.01, s1, fwd,
                                       xq.astype(np.float64) * 0.05, w0, 1e-5)
        if np.linalg.norm(ref) < 1e-9:
            continue
        cos.append(c)
    assert len(cos) >= 4 and min(cos) > 0.9 and np.mean(cos) > 0.97, cos


def test_rsqrt_table_against_tflite_micro(tmp_path, name='RSQRT'):
    """int8 RSQRT (a held-out Keras int8 LayerNormalization was refused at it) as a
    q8lut table: on the positive inputs TFLite Micro computes (it refuses the
    others), its fixed-point kernel and the table differ by at most a code, at under 1%
    of inputs; 12 scale pairs."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(5)
    q = np.arange(-127, 128)
    n = same = 0
    for i in range(12):
        sx, sy, zy = float(r.uniform(0.001, 0.05)), float(r.uniform(0.005, 0.3)), int(r.integers(-128, 0))
        b = CircleBuilder(identifier=b'TFL3')
        x = b.tensor('x', [1, len(q)], dtype='int8', quant={'scale': [sx], 'zero_point': [-128]})
        y = b.tensor('y', [1, len(q)], dtype='int8', quant={'scale': [sy], 'zero_point': [zy]})
        b.op(name, [x], [y])
        b.inputs(x)
        b.outputs(y)
        it = runtime.Interpreter.from_file(b.save(str(tmp_path / f'{i}.tflite')))
        it.set_input(q.astype(np.int8).reshape(1, -1), 0)
        it.invoke()
        ref = it.get_output(0).ravel().astype(int)
        d = dict(sx=sx, zx=-128, sy=sy, zy=zy)
        quant._lut_layer(None, type('Op', (), {'name': name, 'options': {}})(), d)
        t = np.asarray(d['t'])[q + 128]
        assert np.abs(t - ref).max() <= 1
        n, same = n + len(q), same + int((t == ref).sum())
    assert same > 0.99 * n, (same, n)


# TFLite's int8 SQRT (TF 2.21's interpreter; TFLite Micro has none) of the inputs zx..127
# at scales (sx, zx, sy, zy), its output codes as hex (it refuses negative inputs)
SQRT_TFLITE = {(0.02, -128, 0.01, -128): (
    '808e94989c9fa2a5a8aaacaeb0b2b4b6b8babbbdbfc0c2c3c5c6c8c9cacccdced0d1d2d3d4d6d7d8d9dadbdc'
    'dddedfe0e1e2e4e4e5e6e7e8e9eaebecedeeeff0f1f2f2f3f4f5f6f7f7f8f9fafbfcfcfdfeff000001020303'
    '04050606070809090a0b0c0c0d0e0e0f1010111212131414151616171818191a1a1b1c1c1d1e1e1f20202121'
    '222323242425262627272829292a2a2b2c2c2d2d2e2e2f3030313132323334343535363637373838393a3a3b'
    '3b3c3c3d3d3e3e3f3f40404141424243434444454546464748484849494a4a4b4b4c4c4d4d4e4e4f4f505051'
    '5152525353545455555656565757585859595a5a5b5b5b5c5c5d5d5e5e5f5f6060606161'),
    (0.0371, -20, 0.013, -100): (
    '9caab0b5b9bdc0c3c5c8cacdcfd1d3d5d7d9dadcdedfe1e3e4e6e7e8eaebedeeeff1f2f3f4f6f7f8f9fafcfd'
    'feff000102030405060708090a0b0c0d0e0f10111213141516171718191a1b1c1d1e1e1f2021222223242526'
    '262728292a2a2b2c2d2d2e2f30303132333334353536373838393a3a3b3c3c3d3e3e3f404041424243444445'
    '4646474848494a4a4b4b4c4d4d4e4f4f')}


def test_sqrt_table_is_tflites_int8_sqrt():
    """int8 SQRT (the converter writes it for tf.math.sqrt; int8 training had refused it)
    as a q8lut table: TFLite's int8 kernel (elementwise.cc: float32 sqrt, the quotient by
    the output scale truncated, not rounded) code for code on every input it takes
    (rounded to the nearest, half of them differed by one); a negative input, which it
    refuses, gives sqrt 0's code.  Its derivative 1 / (2 sqrt x) against central finite
    differences of sqrt, and at 0 the chord to the next code, 1 / sqrt(sx); 0 below."""
    for (sx, zx, sy, zy), h in SQRT_TFLITE.items():
        d = dict(sx=sx, zx=zx, sy=sy, zy=zy)
        quant._lut_layer(None, type('Op', (), {'name': 'SQRT', 'options': {}})(), d)
        t = np.asarray(d['t'])
        assert np.array_equal(t[zx + 128:], np.frombuffer(bytes.fromhex(h), np.int8))
        assert (t[:zx + 128] == zy).all()
        dt = np.asarray(d['dt']) * d.get('ds', 1.0) / 16384
        x = (np.arange(-128, 128) - zx) * sx
        e = 1e-6 * sx
        fd = (np.sqrt(np.maximum(x + e, 0)) - np.sqrt(np.maximum(x - e, 0))) / (2 * e)
        inside = (x > 0) & (t < 127)
        assert inside.sum() > 60
        assert np.allclose(dt[inside], fd[inside], rtol=2e-3, atol=2 * d.get('ds', 1.0) / 16384)
        assert dt[zx + 128] == pytest.approx(1 / np.sqrt(sx), rel=1e-3) and not dt[:zx + 128].any()


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_int8_sqrt_file_trains_as_int8_on_micropython(tmp_path):
    """An int8 FC RELU -> SQRT -> FC (Keras's tf.math.sqrt, full-integer) had trained in
    float32, dequantized ("op 1 (SQRT) is not supported by int8 training"): it trains as
    int8 (the SQRT a q8lut table), on unix MicroPython (viper) to CPython's trained.wof,
    and export --quantized keeps it int8 with the trained weights."""
    from test_outside_models import build_int8_sqrt
    from test_q8_reg import trained_on_both
    from host_tools.prepare.pipeline import prepare, export
    src, fwd = build_int8_sqrt(tmp_path / 'sq.tflite')
    x = np.random.default_rng(1).uniform(-2, 2, (48, 6)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=fwd(x.astype(np.float64)).argmax(1))
    said = []
    d = str(tmp_path / 'r')
    s = prepare(src, d, data=str(tmp_path / 'd.npz'), epochs=2, loss='scce', lr=0.02,
                test_split=0.25, log=said.append)
    assert s['int8'] and not any('dequantiz' in v for v in said), said
    with open(os.path.join(d, 'q8.json')) as f:
        assert [v['k'] for v in json.load(f)['layers']] == [quant.FC, quant.LUT, quant.FC]
    tl = trained_on_both(d, tmp_path)
    assert tl[-1] < tl[0], tl
    q = str(tmp_path / 'q.tflite')
    export(src, os.path.join(d, 'trained.wof'), q, quantized=True)
    g0, g = read_model(src), read_model(q)
    assert [op.name for op in g.ops] == ['FULLY_CONNECTED', 'SQRT', 'FULLY_CONNECTED']
    assert g.tensors[g.ops[1].inputs[0]].dtype == 'int8'
    assert not np.array_equal(g.tensors[g.ops[0].inputs[1]].data, g0.tensors[g0.ops[0].inputs[1]].data)


def test_squeeze_and_expand_dims_are_their_inputs_bytes(tmp_path):
    """SQUEEZE / EXPAND_DIMS of an int8 tensor make no layer (their output is their
    input's bytes), as RESHAPE; one that changes the scale is refused naming the op."""
    from host_tools.formats.circle_build import CircleBuilder
    from tflite_micro.python.tflite_micro import runtime

    def build(path, s_mid):
        r = np.random.default_rng(1)
        b = CircleBuilder(identifier=b'TFL3')
        q = lambda s, z: {'scale': [s], 'zero_point': [z]}     # noqa: E731
        x = b.tensor('x', [1, 1, 6], dtype='int8', quant=q(0.05, 0))
        s = b.tensor('s', [1, 6], dtype='int8', quant=q(s_mid, 0))
        b.op('SQUEEZE', [x], [s], squeeze_dims=[1])
        e = b.tensor('e', [1, 1, 6], dtype='int8', quant=q(s_mid, 0))
        b.op('EXPAND_DIMS', [s, b.tensor('ax', [1], data=np.array([1], np.int32))], [e])
        w = r.integers(-127, 128, (3, 6)).astype(np.int8)
        y = b.tensor('y', [1, 3], dtype='int8', quant=q(0.1, 0))
        b.op('FULLY_CONNECTED', [e, b.tensor('w', w.shape, data=w, quant=q(0.01, 0)), -1], [y])
        b.inputs(x)
        b.outputs(y)
        return b.save(str(path))
    p = build(tmp_path / 'a.tflite', 0.05)
    g = quant.rewritten(read_model(p))
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert [d['k'] for d in m['layers']] == [quant.FC] and m['layers'][0]['in'] == [g.inputs[0]]
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(p)
    xq = np.arange(-60, 60, 20).astype(np.int8)
    it.set_input(xq.reshape(1, 1, 6), 0)
    it.invoke()
    assert np.array_equal(np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8),
                          it.get_output(0).ravel())
    bad = quant.rewritten(read_model(build(tmp_path / 'b.tflite', 0.07)))
    with pytest.raises(ValueError, match=r'b\.tflite: SQUEEZE op 0 changes the scale'):
        quant.layers(bad, 'all')


def test_float32_board_takes_samples_of_an_input_at_zero_point_minus_128(tmp_path,
                                                                        monkeypatch):
    """An input quantized for [0, 1] data (zero point -128, the common Keras case): a
    float32 board parses q8.json's scale within an ulp, which the zero point makes 128
    ulps of the samples' offset; the dataset check took that for samples at another
    scale and refused train.ds on every 32-bit board (seen on the 32-bit unix build)."""
    import struct
    from kerasgraphs import build_int8_unary
    from host_tools.prepare.pipeline import prepare
    from utrain import data
    from utrain.q8train import Q8Trainer
    sx = float(np.float32(0.00666480278596282))
    path, _, _ = build_int8_unary(tmp_path / 'z.tflite', 'RELU', sx=sx, zx=-128)
    r = np.random.default_rng(0)
    np.savez(tmp_path / 'd.npz', x=r.uniform(0, 1.7, (6, 6)).astype(np.float32),
             y=r.integers(0, 3, 6))
    run = tmp_path / 'run'
    prepare(path, str(run), data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd',
            lr=0.01, epochs=1, log=lambda *a: None)
    monkeypatch.chdir(run)
    tr = Q8Trainer()
    up = struct.unpack('<f', struct.pack('<i', struct.unpack('<i', struct.pack('<f', sx))[0] + 1))[0]
    tr.net.sx = up                      # (the scale a float32 board's parser may give)
    tr._read(data.Dataset('train.ds'), 0)
    tr.ds = None
    tr.net.sx = sx * 1.001              # samples at another scale are still refused
    with pytest.raises(ValueError, match='int8 samples of 6 values'):
        tr._read(data.Dataset('train.ds'), 0)


def test_nested_residual_adds_and_branches_pass_their_gradient(tmp_path, monkeypatch):
    """Add() of three branches of one input (ADD reading an ADD: nested, refused before)
    and two heads of the sum concatenated: the sum's gradient is both heads', each
    branch's the sum's; the first branch's update against finite differences of the
    float graph, and viper = host."""
    from kerasgraphs import build_int8_branches
    path, fwd, s1 = build_int8_branches(tmp_path / 'b.tflite')
    g = quant.rewritten(read_model(path))
    quant.write(g, str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    assert [d['k'] for d in m['layers']].count(quant.ADD) == 2
    r = np.random.default_rng(5)
    xs = [r.integers(-120, 120, 5).astype(np.int8) for _ in range(6)]
    got = spy_updates(monkeypatch)
    w0 = next(t for t in g.tensors if t.name == 'w0').data.astype(np.float64) * s1
    cos = []
    for i, xq in enumerate(xs):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        upd, ref, c = _step_against_fd(net, got, xq, i % 3, 0.01, s1, fwd,   # (the first
                                       xq.astype(np.float64) * 0.05, w0, 1e-5)  # branch)
        if np.linalg.norm(ref) < 1e-9:
            continue
        cos.append(c)
        assert 0.6 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.6
    assert len(cos) >= 4 and min(cos) > 0.97, cos
    if MP is not None:
        _viper_matches(tmp_path, tmp_path, xs[:3])


def test_select_names_the_files_ops_of_a_rewritten_int8_model(tmp_path):
    """--select auto on an int8 model: its candidates and classifier are the file's op
    numbers (the int8 pricer reads the rewritten graph; an index of it named op 10, a
    CONCATENATION in the file, as the classifier, and prepare refused the choice)."""
    from host_tools.prepare import select
    path, _, _ = build_keras_int8_cat(tmp_path / 'k.tflite')
    g = quant.rewritten(read_model(path))
    cands = select.layers(g)
    assert [i for i, _ in cands] == [4, 11]
    assert select.classifier(g, cands) == 11
    pr = select.Q8Pricer(path, {'batch': 1, 'optimizer': 'sgd', 'loss': 'scce', 'momentum': 0.0})
    assert pr.price({11: 0})['heap'] and pr.price({4: 1, 11: 0})['heap']


def _logits_as_tflite_micro(path, net, xs, tmp_path):
    """net's int8 logits on the int8 samples xs are TFLite Micro's on path cut before its
    SOFTMAX, bit for bit; returns how many differ."""
    from test_q8 import _cut_softmax
    return tflm_agrees(_cut_softmax(path, tmp_path)[1], net, xs, 0)


def test_grouped_convolutions_as_tflite_micro_runs_them(tmp_path):
    """Issue 28 (a held-out full-integer Keras Conv2D(groups=2), refused): int8 grouped
    CONV_2Ds become SPLIT -> a CONV_2D per group (its rows of the per-channel scales with
    its weights) -> CONCATENATION, one input channel per group a DEPTHWISE_CONV_2D; the
    forward is TFLite Micro's on the file, bit for bit.  Trained as int8 and exported,
    the file's ops and tensors come back (the groups joined), the weights moved, and
    TFLite Micro runs the export as utrain runs those weights.  Trained dequantized,
    `export --quantized` writes the groups into the file's int8 tensors too."""
    from kerasgraphs import build_keras_grouped
    from host_tools.prepare.pipeline import export, prepare
    path, _ = build_keras_grouped(tmp_path / 'g.tflite', int8=True)
    g0 = read_model(path)
    assert '4 FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D layers can train' in \
        quant.inspect_lines(g0)[1]          # (the file's: a conv's groups are one)
    g = quant.rewritten(g0)
    assert [op.name for op in g.ops] == ['SPLIT', 'CONV_2D', 'CONV_2D', 'CONCATENATION',
                                         'DEPTHWISE_CONV_2D', 'SPLIT', 'CONV_2D', 'CONV_2D',
                                         'CONV_2D', 'CONCATENATION', 'MEAN', 'FULLY_CONNECTED',
                                         'SOFTMAX']
    from host_tools.prepare.select import layers
    assert [i for i, _ in layers(g)] == [0, 1, 2, 4]      # --select's candidates: the file's
    quant.write(g, str(tmp_path / 'w'), 'all')
    with open(tmp_path / 'w' / 'q8.json') as f:
        net = Q8Net(json.load(f), str(tmp_path / 'w' / 'weights.wof'))
    r = np.random.default_rng(7)
    xs = [r.integers(-90, 90, (5, 5, 4)).astype(np.int8) for _ in range(6)]
    assert _logits_as_tflite_micro(path, net, xs, tmp_path) == 6

    x = r.integers(-90, 90, (48, 5, 5, 4)).astype(np.float32) * 0.03
    np.savez(tmp_path / 'd.npz', x=x, y=(x[:, :, :, 0].mean((1, 2)) > 0).astype(np.int64))
    state = {t.name: (t.shape, t.dtype, t.data) for t in g0.tensors if t.data is not None}
    for how in ('int8', 'dequantized'):
        out = str(tmp_path / how)
        prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd', lr=0.05,
                epochs=1, train='all', dequantize=how != 'int8', log=lambda *a: None)
        code, text = runner.run(out, python=True, stream=False)
        assert code == 0, text
        dst = str(tmp_path / f'{how}.tflite')
        export(path, os.path.join(out, 'trained.wof'), dst, quantized=how != 'int8')
        e = read_model(dst)
        assert [op.name for op in e.ops] == [op.name for op in g0.ops]
        got = {t.name: t for t in e.tensors if t.data is not None}
        # (trained as int8, the conv without a bias trained a zero one: quant.zero_bias)
        assert {k: (t.shape, t.dtype) for k, t in got.items()} == dict(
            {k: v[:2] for k, v in state.items()},
            **({'w3/zero_bias': ([6], 'int32')} if how == 'int8' else {}))
        for k in ('w1', 'w2', 'w3'):
            assert not np.array_equal(got[k].data, state[k][2]), (how, k)
        ge = quant.rewritten(e)
        quant.write(ge, str(tmp_path / how / 'again'), 'none')
        with open(tmp_path / how / 'again' / 'q8.json') as f:
            net = Q8Net(json.load(f), str(tmp_path / how / 'again' / 'weights.wof'))
        assert _logits_as_tflite_micro(dst, net, xs, tmp_path) == 6
