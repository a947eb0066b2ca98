"""Int8 training (issue 16): q8kern's integers against TFLite Micro's reference kernels
and a big-integer requantization, the same integers under viper (64-bit unix
MicroPython, $UTRAIN_MP32) and CPython, QAS updates against a float reference with fake
quantization, prepare/run/export of an int8 model end to end."""
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT, set_train  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.graph import optable  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare, export, PrepareError  # noqa: E402
from host_tools.graph.inout import save_graph  # noqa: E402
from utrain import q8kern as K  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402

KERAS = os.path.join(ROOT, 'bench', 'zoo', 'keras')
MLP = os.path.join(KERAS, 'mlp_int8.tflite')
DSCNN = os.path.join(KERAS, 'dscnn_kws_int8.tflite')
MP = runner.find_micropython()


def tflm_mbqm(x, m, shift):
    """TFLite's MultiplyByQuantizedMultiplier with Python integers (double rounding)."""
    left, right = max(shift, 0), max(-shift, 0)
    a = x * (1 << left)
    ab = a * m
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    t = ab + nudge
    hi = abs(t) >> 31
    hi = hi if t >= 0 else -hi                     # C division truncates toward zero
    mask = (1 << right) - 1
    rem = hi & mask
    thr = (mask >> 1) + (1 if hi < 0 else 0)
    return (hi >> right) + (1 if rem > thr else 0)


def requant_cases(n=3000, seed=0):
    r = random.Random(seed)
    acc = [r.randint(-(1 << 31) + 1, (1 << 31) - 1) >> r.randint(0, 30) for _ in range(n)]
    acc[:6] = [0, 1, -1, (1 << 31) - 1, -(1 << 31) + 1, -(1 << 20)]
    mul = [r.randint(1 << 30, (1 << 31) - 1) for _ in range(7)] + [1 << 30, (1 << 31) - 1, 12345]
    shf = [r.randint(-31, 0) for _ in range(len(mul) - 1)] + [1]
    return acc, mul, shf


def test_requantize_matches_tflite_integers():
    from array import array
    acc, mul, shf = requant_cases()
    c = len(mul)
    out = array('i', [0] * len(acc))
    K.rqk(array('i', acc), len(acc), c, 1, array('i', mul), array('i', shf), out, 0, 0, 0, 1)
    want = []
    for i, a in enumerate(acc):
        m, s = mul[i % c], shf[i % c]
        if s > 0 and abs(a) >= 1 << (31 - s):
            a = a >> 8                         # TFLite needs x * 2^left to fit in int32
            acc[i] = a
        want.append(tflm_mbqm(a, m, s))
    out = array('i', [0] * len(acc))
    K.rqk(array('i', acc), len(acc), c, 1, array('i', mul), array('i', shf), out, 0, 0, 0, 1)
    assert list(out) == want


def _mp_script(tmp_path, body):
    p = tmp_path / 'case.py'
    p.write_text(body)
    return str(p)


MP_REQ = '''
from array import array
import json
from utrain import q8kern as K
d = json.load(open('cases.json'))
acc, mul, shf = d
out = array('i', [0] * len(acc))
K.rqk(array('i', acc), len(acc), len(mul), 1, array('i', mul), array('i', shf), out, 0, 0, 0, 1)
o8 = bytearray(len(acc))
K.rqk(array('i', acc), len(acc), len(mul), 1, array('i', mul), array('i', shf), o8, -5, -100, 90, 0)
print(json.dumps([list(out), list(o8)]))
'''


@pytest.mark.parametrize('env', ['MICROPYTHON', 'UTRAIN_MP32'])
def test_viper_requantize_same_integers(tmp_path, env):
    """The viper kernel on a 64-bit and a 32-bit port computes CPython's integers."""
    from array import array
    exe = MP if env == 'MICROPYTHON' else os.environ.get(env)
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip(f'no {env} binary')
    mpy = int(subprocess.run([exe, '-c', 'import sys;print(sys.implementation._mpy)'],
                             capture_output=True, text=True).stdout.split()[-1])
    runner.stage(str(tmp_path), mpy=mpy)
    acc, mul, shf = requant_cases(seed=1)
    shf[-1] = 0
    (tmp_path / 'cases.json').write_text(json.dumps([acc, mul, shf]))
    r = subprocess.run([exe, _mp_script(tmp_path, MP_REQ)], cwd=tmp_path, capture_output=True,
                       text=True, env=dict(os.environ, MICROPYPATH=':lib'), timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    out = array('i', [0] * len(acc))
    K.rqk(array('i', acc), len(acc), len(mul), 1, array('i', mul), array('i', shf), out, 0, 0, 0, 1)
    o8 = bytearray(len(acc))
    K.rqk(array('i', acc), len(acc), len(mul), 1, array('i', mul), array('i', shf), o8, -5, -100,
          90, 0)
    assert got[0] == list(out)
    assert got[1] == list(o8)


def _cut_softmax(path, tmp_path):
    g = read_model(path)
    assert g.ops[-1].name == 'SOFTMAX'
    logits = g.ops[-2].outputs[0]
    g.ops = g.ops[:-1]
    g.outputs = [logits]
    out = str(tmp_path / 'cut.tflite')
    save_graph(g, out)
    return g, out


def spy_updates(monkeypatch):
    """The list of the requantized weight updates (float64, 1/256 weight steps) of
    q8kern.upk and upmk (an FC layer's at batch 1: its unscaled sums times p's multiplier)
    and upek (exact through the weights' fractions: a convolution's; p's multiplier as upmk's),
    one per layer (the calls of one layer's chunks, on views of one weight buffer,
    joined), in the order the step applies them; the kernels still run."""
    got = []
    real_upk, real_upmk, real_upek = K.upk, K.upmk, K.upek
    last = [None]

    def keep(w, a):
        base = w.obj if isinstance(w, memoryview) else w
        if got and last[0] is base and base is not w:    # (a later chunk: a view)
            got[-1] = np.concatenate([got[-1], a])
        else:
            got.append(a)
        last[0] = base

    def spy(w, d, n, seed):
        keep(w, np.array(d[:n], dtype=np.float64))
        return real_upk(w, d, n, seed)

    def spy_m(w, d, n, p):
        keep(w, np.array([(int(v) * p[1] + p[3]) >> p[2] for v in d[:n]], np.float64))
        return real_upmk(w, d, n, p)

    def spy_f(w, f, d, p):
        n, m = p[0], p[1]
        keep(w, np.array([(int(v) * m + p[3]) >> p[2] if m else int(v) for v in d[:n]],
                         np.float64))
        return real_upek(w, f, d, p)

    monkeypatch.setattr(K, 'upk', spy)
    monkeypatch.setattr(K, 'upmk', spy_m)
    monkeypatch.setattr(K, 'upek', spy_f)
    return got


@pytest.mark.parametrize('path,n', [(MLP, 16), (DSCNN, 2)])
def test_forward_bit_exact_with_tflite_micro(tmp_path, path, n, data=None):
    from tflite_micro.python.tflite_micro import runtime
    g, cut = _cut_softmax(path, tmp_path)
    m = quant.write(g, str(tmp_path), 'none')
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(cut)
    x = np.load(data or path.replace('_int8.tflite', '_data.npz'))['x']
    shape = g.tensors[g.inputs[0]].shape
    for i in range(n):
        xq = net.quantize_input(x[i].ravel().tolist())
        ours = np.frombuffer(bytes(net.forward(xq)), np.int8)
        it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(shape), 0)
        it.invoke()
        assert np.array_equal(ours, it.get_output(0).ravel()), i


def test_qas_update_matches_float_reference(tmp_path, monkeypatch):
    """One SGD step of the int8 MLP: the int8 update of each layer against the float
    gradient of the dequantized model with fake-quantized activations (numpy), as
    lr * dL/dW / s_W in weight steps (QAS)."""
    g = read_model(MLP)
    m = quant.write(g, str(tmp_path), 'all')
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    x = np.load(MLP.replace('_int8.tflite', '_data.npz'))['x'][3]
    xq = net.quantize_input(x.tolist())
    label, lr = 1, 0.05
    # float reference on the dequantized tensors
    deq = lambda b, L: (np.frombuffer(bytes(b), np.int8).astype(np.float64) - L.zy) * L.d['sy']  # noqa
    net.forward(xq)
    acts = [(np.frombuffer(bytes(xq), np.int8).astype(np.float64) - m['zx']) * m['sx']]
    acts += [deq(L.y, L) for L in net.layers]
    W = [np.frombuffer(bytes(L.w), np.int8).reshape(L.nout, -1) * L.d['sw'][0] for L in net.layers]
    logits = acts[-1]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    dz = p.copy()
    dz[label] -= 1
    want = [None] * 3
    for i in (2, 1, 0):
        L = net.layers[i]
        yq = np.frombuffer(bytes(L.y), np.int8)
        dz = dz * ((yq > L.lo) & (yq < L.hi))
        want[i] = lr * np.outer(dz, acts[i]) / L.d['sw'][0] * 256
        dz = W[i].T @ dz
    got = spy_updates(monkeypatch)
    net.step(xq, label, lr)
    for i in range(3):
        g_i = got[2 - i].reshape(want[i].shape)
        err = np.linalg.norm(g_i - want[i]) / np.linalg.norm(want[i])
        assert err < 0.05, (i, err)


def _task(path, n=240, seed=3):
    # a learnable relabelling of the model's own synthetic data (fine-tuning task)
    rng = np.random.default_rng(0)
    c = rng.standard_normal((4, 16)) * 1.5
    r = np.random.default_rng(seed)
    y = r.integers(0, 4, n)
    x = (c[y] + 2.0 * r.standard_normal((n, 16))).astype(np.float32)
    np.savez(path, x=x, y=np.array([2, 0, 3, 1])[y])


def test_prepare_run_export_int8(tmp_path):
    data = str(tmp_path / 'task.npz')
    _task(data)
    q = str(tmp_path / 'q8')
    s = prepare(MLP, q, data=data, test_split=0.25, loss='scce', optimizer='sgd', lr=0.02,
                epochs=2)
    assert s['int8'] and os.path.exists(os.path.join(q, 'q8.json'))
    f = str(tmp_path / 'f32')
    prepare(MLP, f, data=data, test_split=0.25, loss='scce', optimizer='sgd', lr=0.02, epochs=2,
            dequantize=True)
    sq, sf = (os.path.getsize(os.path.join(d, 'weights.wof')) for d in (q, f))
    assert sq < 0.3 * sf                  # int8 weights (int32 biases) vs float32
    code, out = runner.run(q, python=True, stream=False)
    assert code == 0, out
    assert 'test_accuracy' in out
    acc = [float(v.split('test_accuracy ')[1].split()[0]) for v in out.splitlines()
           if v.startswith('epoch ')]
    assert acc[-1] > 0.6, out             # from 0.05 before: the relabelling is learnt
    dst = str(tmp_path / 'trained.tflite')
    export(MLP, os.path.join(q, 'trained.wof'), dst)
    g0, g1 = read_model(MLP), read_model(dst)
    m = quant.meta(g0, 'all')
    w = quant.read_q8_wof(os.path.join(q, 'trained.wof'), g0, m)
    assert len(w) == 6
    # (an activation range the run doubled, trained.wof.q8s: its consumer's int32 biases,
    # which trained.wof keeps at the calibrated scale, exported at the doubled one)
    with open(os.path.join(q, 'q8.json')) as f:
        t8 = json.load(f)
    with open(os.path.join(q, 'trained.wof.q8s')) as f:
        up = {t8['layers'][c]['bt']: e for (_, cs, _), e in zip(t8['rr'][2], json.load(f))
              for c in cs}
    for k, a in w.items():
        if up.get(k):
            a = (a.astype(np.int64) + (1 << (up[k] - 1))) >> up[k]
        t0, t1 = g0.tensors[k], g1.tensors[k]
        assert t1.dtype == t0.dtype and t1.shape == t0.shape
        # (scales: the model's, x 2^k where a trained channel's grew: utrain.q8grow)
        r = np.log2(np.asarray(t1.quant['scale']) / np.asarray(t0.quant['scale']))
        assert np.array_equal(r, np.round(r)) and r.min() >= 0
        assert dict(t1.quant, scale=0) == dict(t0.quant, scale=0)
        assert np.array_equal(t1.data, a)
        assert not np.array_equal(t1.data, t0.data)
    # TFLite Micro runs the exported model; its logits are the trained net's
    from tflite_micro.python.tflite_micro import runtime
    g, cut = _cut_softmax(dst, tmp_path)
    m1 = quant.write(g, str(tmp_path / 'again'), 'none')
    net = Q8Net(m1, str(tmp_path / 'again' / 'weights.wof'))
    it = runtime.Interpreter.from_file(cut)
    x = np.load(data)['x']
    for i in range(8):
        xq = net.quantize_input(x[i].tolist())
        it.set_input(np.frombuffer(bytes(xq), np.int8)[None], 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(xq)), np.int8),
                              it.get_output(0).ravel())


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_viper_run_equals_cpython_run(tmp_path):
    """The int8 training run under unix MicroPython (viper kernels) and CPython (the
    same code as plain Python) ends with the same bytes."""
    data = str(tmp_path / 'task.npz')
    _task(data, 120)
    outs = []
    for py in (False, True):
        d = str(tmp_path / ('py' if py else 'mp'))
        prepare(MLP, d, data=data, loss='scce', optimizer='sgd', lr=0.02,
                epochs=1)
        code, out = runner.run(d, python=py, stream=False)
        assert code == 0, out
        with open(os.path.join(d, 'trained.wof'), 'rb') as fh:
            outs.append(fh.read())
    assert outs[0] == outs[1]


def test_int8_settings_and_ops_refused(tmp_path):
    with pytest.raises(PrepareError, match='int8 training takes'):
        prepare(MLP, str(tmp_path / 'a'), loss='scce', optimizer='adam', momentum=0.9)
    with pytest.raises(PrepareError, match='--loss bce on a model ending in SOFTMAX.*--dequantize'):
        prepare(MLP, str(tmp_path / 'a'), loss='bce', optimizer='sgd')
    s = prepare(DSCNN, str(tmp_path / 'b'), loss='scce', optimizer='sgd', train='all')
    assert len(s['trainable']) == 20      # every conv, depthwise conv and the dense layer
    s = prepare(DSCNN, str(tmp_path / 'c'), loss='scce', optimizer='sgd', train='last:4')
    assert len(s['trainable']) == 4       # the last pointwise conv and the dense layer


@pytest.mark.slow
@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_bench_int8_quick():
    from bench import int8
    rows = int8.main(['--quick', '--models', 'mlp'])
    name, build, f, q, ratio, fc, fc_bare = rows[0]
    # (--quick times a few ms of float and int8 steps: CPU time is tick-granular, so 0 is
    # possible for either on a loaded machine: float read 0 us with the suite running)
    assert name == 'mlp' and f >= 0 and q >= 0 and fc > 0 and fc_bare > 0


def _np_conv_taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW):
    # (oy, ox, ky, kx, iy, ix) of every tap that reads the input
    for oy in range(OH):
        for ox in range(OW):
            for ky in range(KH):
                for kx in range(KW):
                    iy, ix = oy * sh - ph + ky, ox * sw - pw + kx
                    if 0 <= iy < H and 0 <= ix < W:
                        yield oy, ox, ky, kx, iy, ix


@pytest.mark.parametrize('kind,geo', [('conv', (5, 4, 3, 4, 3, 2, 2, 1, 'SAME')),
                                      ('conv', (6, 5, 2, 3, 1, 1, 1, 1, 'VALID')),
                                      ('dw', (5, 4, 3, 6, 3, 3, 1, 1, 'SAME')),
                                      ('dw', (6, 6, 2, 2, 3, 3, 2, 2, 'SAME'))])
def test_conv_dw_gradients_match_numpy(kind, geo):
    """cdk/ddk (input gradient) and cgk/dgk (weight gradient) against numpy sums over
    the taps that read each input, padding and stride included; DW with multiplier 2."""
    from array import array
    H, W, I, O, KH, KW, sh, sw, pad = geo
    OH, ph = optable.out_pad(H, KH, sh, 1, pad, 'test')
    OW, pw = optable.out_pad(W, KW, sw, 1, pad, 'test')
    gm = array('i', [H, W, I, O, KH, KW, sh, sw, ph, pw, OH, OW, 1, 1])
    r = np.random.default_rng(hash(geo) % 1000)
    x = r.integers(-128, 128, (H, W, I)).astype(np.int8)
    dz = r.integers(-127, 128, (OH, OW, O)).astype(np.int8)
    xz = 5
    M = O // I
    if kind == 'conv':
        w = r.integers(-127, 128, (O, KH, KW, I)).astype(np.int8)
    else:
        w = r.integers(-127, 128, (KH, KW, O)).astype(np.int8)
    dx_want = np.zeros((H, W, I), np.int64)
    gw_want = np.zeros(w.shape, np.int64)
    xs = x.astype(np.int64) - xz
    for oy, ox, ky, kx, iy, ix in _np_conv_taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW):
        z = dz[oy, ox].astype(np.int64)
        if kind == 'conv':
            dx_want[iy, ix] += z @ w[:, ky, kx, :].astype(np.int64)
            gw_want[:, ky, kx, :] += np.outer(z, xs[iy, ix])
        else:
            dx_want[iy, ix] += (z * w[ky, kx].astype(np.int64)).reshape(I, M).sum(1)
            gw_want[ky, kx] += z * np.repeat(xs[iy, ix], M)
    dx = array('i', [7] * (H * W * I))
    gw = array('i', [0] * w.size)
    b8 = lambda a: bytearray(a.tobytes())  # noqa
    if kind == 'conv':
        K.cdk(dx, b8(dz), b8(w), gm)
        K.cgk(gw, b8(dz), b8(x), xz, gm, 0, O)
    else:
        K.ddk(dx, b8(dz), b8(w), gm)
        K.dgk(gw, b8(dz), b8(x), xz, gm)
    assert list(dx) == dx_want.ravel().tolist()
    assert list(gw) == gw_want.ravel().tolist()


def test_dscnn_gradients_through_conv_dw_match_float_reference(tmp_path, monkeypatch):
    """One SGD step of the int8 DS-CNN with its last two blocks' DW and pointwise convs,
    MEAN and dense training: each layer's int8 update against the float gradient of the
    dequantized model with fake-quantized activations (numpy), lr * dL/dW / s_W in weight
    steps (QAS): the input gradients of FC, MEAN, CONV_2D and DEPTHWISE_CONV_2D carry it."""
    g = read_model(DSCNN)
    m = quant.write(g, str(tmp_path), 'last:7')
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    x = np.load(DSCNN.replace('_int8.tflite', '_data.npz'))['x'][5]
    xq = net.quantize_input(x.ravel().tolist())
    label, lr = 3, 0.01
    net.forward(xq)
    L = net.layers
    q = lambda b: np.frombuffer(bytes(b), np.int8).astype(np.float64)  # noqa
    acts = [(q(xq) - m['zx']) * m['sx']] + [(q(l.y) - l.zy) * l.d['sy'] for l in L]
    logits = acts[-1]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    dy = p
    dy[label] -= 1
    want = {}
    for i in range(len(L) - 1, 4, -1):
        l, d = L[i], L[i].d
        xin = acts[i]
        if l.k == quant.MEAN:
            dy = np.tile(dy / d['n'], d['n'])
            continue
        yq = q(l.y)
        dz = dy * ((yq > l.lo) & (yq < l.hi))
        sw = np.array(d['sw'])
        wq = q(l.w)
        if l.k == quant.FC:
            W = wq.reshape(l.nout, -1) * sw[:, None]
            gW, dy = np.outer(dz, xin), W.T @ dz
            want[i] = lr * gW / sw[:, None] * 256
            continue
        H, Wd, I, O, KH, KW, sh, sw_, ph, pw, OH, OW = d['g'][:12]
        X = xin.reshape(H, Wd, I)
        Z = dz.reshape(OH, OW, O)
        if l.k == quant.CONV:
            Wf = wq.reshape(O, KH, KW, I) * sw[:, None, None, None]
        else:
            Wf = wq.reshape(KH, KW, O) * sw
        gW, dX = np.zeros_like(Wf), np.zeros_like(X)
        for oy, ox, ky, kx, iy, ix in _np_conv_taps(H, Wd, KH, KW, sh, sw_, ph, pw, OH, OW):
            if l.k == quant.CONV:
                gW[:, ky, kx, :] += np.outer(Z[oy, ox], X[iy, ix])
                dX[iy, ix] += Z[oy, ox] @ Wf[:, ky, kx, :]
            else:
                gW[ky, kx] += Z[oy, ox] * X[iy, ix]
                dX[iy, ix] += Z[oy, ox] * Wf[ky, kx]
        want[i] = lr * (gW / (sw[:, None, None, None] if l.k == quant.CONV else sw)) * 256
        dy = dX.ravel()
    got = spy_updates(monkeypatch)
    net.step(xq, label, lr)
    trained = sorted(want, reverse=True)
    assert [L[i].k for i in trained] == [quant.FC, quant.CONV, quant.DW, quant.CONV, quant.DW]
    for j, i in enumerate(trained):
        err = np.linalg.norm(got[j] - want[i].ravel()) / np.linalg.norm(want[i])
        assert err < 0.05, (i, err)


def _mlp_net(tmp_path, train='all'):
    g = read_model(MLP)
    m = quant.write(g, str(tmp_path), train)
    xs = np.load(MLP.replace('_int8.tflite', '_data.npz'))['x'][:3]
    return m, (lambda: Q8Net(m, str(tmp_path / 'weights.wof'))), xs


def test_batch_sums_equal_mean_of_single_steps(tmp_path, monkeypatch):
    """SGD at batch 3: the update applied at the batch's end (int32 sums in weight steps
    at q8batch.unit's unit) against the mean of the three batch-1 updates from the same weights."""
    m, make, xs = _mlp_net(tmp_path)
    labels, lr = [1, 3, 0], 0.05
    got = spy_updates(monkeypatch)
    single = []
    for x, y in zip(xs, labels):
        net = make()
        net.step(net.quantize_input(x.tolist()), y, lr)
        single.append(got[:])
        got.clear()
    net = make()
    net.setup('sgd', 3)
    b0 = [list(L.b) for L in net.layers]
    for x, y in zip(xs, labels):
        net.accum(net.quantize_input(x.tolist()), y)
    assert not got                        # no update before the batch's end
    net.apply(lr, 1 / 3)
    assert len(got) == 3
    for j in range(3):                    # layer order: first to last
        want = sum(s[2 - j] for s in single) / 3
        err = np.linalg.norm(got[j] - want) / np.linalg.norm(want)
        assert err < 0.02, (j, err)
    assert all(list(L.b) != b for L, b in zip(net.layers, b0))
    assert all(not any(L.ga) for L in net.layers)       # sums zeroed


def test_adam_first_step_on_float_masters(tmp_path):
    """Adam's first update (TensorFlow's form, as utrain.optim) moves each float32 master
    weight by lr * g / (|g| + eps / sqrt(1 - beta2)), g the batch's mean gradient dL/dW
    from the int32 sums (in 2^-gk[0] of dL/dW: q8batch.unit); the int8 weights are the
    masters requantized."""
    m, make, xs = _mlp_net(tmp_path)
    net = make()
    net.setup('adam', 2)
    L = net.layers[1]
    sw = L.d['sw'][0]
    w0 = np.array(L.wm, np.float64)
    assert np.allclose(w0, np.frombuffer(bytes(L.w), np.int8) * sw, rtol=1e-6)
    for x, y in zip(xs[:2], [2, 1]):
        net.accum(net.quantize_input(x.tolist()), y)
    g = np.array(L.ga, np.float64)
    u = 2.0 ** -L.gk[0]
    lr = 0.003
    net.apply(lr, 0.5)
    step = np.array(L.wm, np.float64) - w0
    nz = g != 0
    assert nz.sum() > 100
    gf = g * u * 0.5
    want = -lr * gf[nz] / (np.abs(gf[nz]) + 1e-7 / np.sqrt(1 - 0.999))
    assert np.allclose(step[nz], want, rtol=1e-3, atol=1e-8)
    assert np.all(step[~nz] == 0)
    q = np.clip(np.round(np.array(L.wm, np.float64) / sw), -127, 127)
    assert np.array_equal(np.frombuffer(bytes(L.w), np.int8), q)


def test_adam_steps_a_relabelled_layer_as_the_layer(tmp_path):
    """Adam on a layer whose scales are relabelled (its input scale 2^-10 times, its
    weight scales 2^10 times: the same integers, as quant.relabel_input writes for an
    input far larger than 1) takes the layer's own first step in the relabelled units:
    every master weight whose gradient is not 0 moves by lr (TensorFlow's first step) the
    way the plain layer's moves (less where its gradient, 2^10 times smaller, nears eps).
    Adam divides each weight's step by its own gradient's
    size; its sums had SGD's unit, 1/4096 weight steps, 2^20 finer here: every gradient
    rounded to 0 and the layer never moved (a Keras Conv1D on raw accelerometer units,
    relabelled 2^-9, under Adam at lr 0.01 died in 1 of 3 runs)."""
    m, make, xs = _mlp_net(tmp_path)
    lr, steps = 0.003, []
    for k in (0, 10):
        for d in m['layers'][:1]:
            d['sx'], d['sw'] = d['sx'] * 2.0 ** -k, [v * 2.0 ** k for v in d['sw']]
        net = make()
        net.setup('adam', 2)
        L = net.layers[0]
        w0 = np.array(L.wm, np.float64)
        for x, y in zip(xs[:2], [2, 1]):
            net.accum(net.quantize_input(x.tolist()), y)
        net.apply(lr, 0.5)
        steps.append(np.array(L.wm, np.float64) - w0)
        for d in m['layers'][:1]:
            d['sx'], d['sw'] = d['sx'] * 2.0 ** k, [v * 2.0 ** -k for v in d['sw']]
    a, b = steps
    nz = a != 0
    assert nz.mean() > 0.5 and np.allclose(np.abs(a[nz]), lr, rtol=0.02), a
    # (the relabelled gradients are 2^10 times smaller against Adam's eps: those near it
    # step less, as the float scaled run's do)
    assert np.array_equal(np.sign(b), np.sign(a)) and np.all(np.abs(b) <= 1.001 * lr)
    assert np.mean(np.abs(b[np.abs(a) > 0.9 * lr]) > 0.5 * lr) > 0.9, (np.abs(b).max(), np.mean(b == 0))


@pytest.mark.parametrize('mom', [0.0, 0.9])
def test_sgd_batch_sums_in_weight_steps_of_any_size(tmp_path, mom):
    """SGD (and momentum) at batch 2 on the DS-CNN's last blocks (per-channel CONV_2D and
    DEPTHWISE_CONV_2D, MEAN, FC) relabelled (each trained layer's weight scales 2^-10
    times, its input's scale 2^10 times its output's: the same integers and logits, the
    same model; dL/dW / s_W, the weight steps SGD takes, 2^20 times as many, as a large
    input range with small weights has) at lr 2^-20 moves every weight by the integers
    the plain model moves by at lr.  The sums were in 1/4096 weight steps
    at any size: here they overflowed int32 (an OverflowError on the host, a silent wrap
    on a 32-bit board).  At lr 1 the steps, 2^23 weight steps and more, are past any
    weight's range, and their 1/256 steps past int32: each weight whose step is goes to
    the end of the int8 range against its gradient's sign (no wrapped sum flips it)."""
    g = read_model(DSCNN)
    xs = np.load(DSCNN.replace('_int8.tflite', '_data.npz'))['x'][3:5]
    got = []
    for k, lr in ((0, 0.01), (10, 0.01 * 2.0 ** -20), (10, 1.0)):
        m = quant.write(g, str(tmp_path / str(len(got))), 'last:7')
        e = 0                   # (the output's relabelling: 2^e, from the logits down)
        for d in m['layers'][:4:-1]:
            d.pop('gw', None)   # (no weight scale doubles: q8grow)
            f = e + (k if d.get('train') else 0)
            d['sy'], d['sx'] = d['sy'] * 2.0 ** e, d['sx'] * 2.0 ** f
            if d.get('train'):
                d['sw'] = [v * 2.0 ** -k for v in d['sw']]
            e = f
        net = Q8Net(m, str(tmp_path / str(len(got)) / 'weights.wof'))
        net.setup('sgd', 2, momentum=mom)
        for x, y in zip(xs, (3, 7)):
            net.accum(net.quantize_input(x.ravel().tolist()), y)
        tr = [L for L in net.layers if L.train]
        assert len(tr) == 5
        # (the sums' unit: 2^-gk[0] weight steps; 1/4096 before)
        steps = [np.array(L.ga, np.float64) * (2.0 ** -L.gk[0] if L.gk else 1 / 4096) * lr * 0.5
                 for L in tr]
        w0 = [np.frombuffer(bytes(L.w), np.int8).astype(int) for L in tr]
        net.apply(lr, 0.5)
        assert net.wg is None
        got.append([np.frombuffer(bytes(L.w), np.int8).astype(int) for L in tr])
    moved = sum([int((a != b).sum()) for a, b in zip(got[0], w0)])
    assert moved > 100
    for a, b in zip(got[0], got[1]):
        assert np.array_equal(a, b)
    big = 0
    for w, st, w0 in zip(got[2], steps, w0):
        far = np.abs(st) > 300
        big += far.sum()
        # (to the end of the range; momentum's velocity holds 128 steps at most)
        sg, w0f = np.sign(st[far]).astype(int), w0[far]
        ok = (w[far] == -127 * sg) | ((mom > 0) & ((w[far] - w0f) * sg <= -127))
        assert ok.all(), (w[far] * sg, w0f * sg)
    assert big > 100


def test_cce_one_hot_equals_scce(tmp_path):
    """scce's softmax in integers (a table of 2^14 exp, the gradient at scale 2^-14) is
    cce's float softmax on a one-hot target within that resolution (cce: utrain.q8reg's,
    which the trainer puts in the net's loss's place)."""
    from types import SimpleNamespace
    from utrain.q8reg import use
    m, make, xs = _mlp_net(tmp_path)
    net = make()
    use(SimpleNamespace(net=net, cfg={'loss': 'cce', 'metric': 'accuracy'}))
    for x in xs[:3]:
        xq = net.quantize_input(x.tolist())
        a = type(net).loss(net, xq, 2, True)
        b = net.loss(xq, [0.0, 0.0, 1.0, 0.0], True)
        assert a[1] == b[1] and abs(a[0] - b[0]) < 1e-3
        assert np.allclose(np.array(a[2], np.float64) / 16384, b[2], atol=3 / 16384)


@pytest.mark.slow
@pytest.mark.parametrize('opt,batch,kw', [
    ('sgd', 1, {}), ('adam', 3, {}),
    # the sparse update (issue 29): momentum's velocities, Adam's state of a window only
    ('sgd', 1, dict(momentum=0.9, ranks='0:1/2,1:bias')), ('adam', 3, dict(ranks='1:bias'))])
def test_ctrl_c_resume_int8_bit_identical(tmp_path, opt, batch, kw):
    """Ctrl-C at random moments of an int8 run (unix MicroPython when there, else
    CPython) and train.py again with resume: trained.wof, its record, the checkpoint
    (int8 weights, float biases and masters, position) and the log equal an
    uninterrupted run's bit for bit."""
    from test_ctrl_c import interrupted_runs
    data = str(tmp_path / 'task.npz')
    _task(data, 320)            # a run long enough that a Ctrl-C lands in it on a busy machine
    base = tmp_path / 'base'
    prepare(MLP, str(base), data=data, test_split=0.25, loss='scce', optimizer=opt,
            lr=0.02 if opt == 'sgd' else 0.003, batch=batch, epochs=3, shuffle=True, seed=7,
            **kw)
    set_train(base, run={'checkpoint_every': 20})
    runner.stage(str(base))
    tally = interrupted_runs(base, tmp_path, not MP, 4, 3)
    print(opt, batch, tally)
    assert tally['identical'] == 4 and tally['tracebacks'] == 0 and tally['restarts'] > 0


def test_prepare_says_when_an_int8_model_trains_in_float(tmp_path):
    """--ranks trains an int8 model as int8 (issue 29: the sparse update) and prepare
    names the window; --dequantize trains it in float and says what int8 would take."""
    data = str(tmp_path / 'task.npz')
    _task(data)
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'prepare', MLP, '-o',
                        str(tmp_path / 'o'), '--data', data, '--loss', 'scce',
                        '--ranks', '2:1/2'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'int8 model training as int8' in r.stdout, r.stdout
    assert 'sparse update (output channels lo:hi' in r.stdout and ' 0:' in r.stdout, r.stdout
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'prepare', MLP, '-o',
                        str(tmp_path / 'f'), '--data', data, '--loss', 'scce',
                        '--ranks', '2:1/2', '--dequantize'], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert 'int8 model dequantized: 11 tensors, trains in float32' in r.stdout, r.stdout


def _drop_biases(path, tmp_path, ops):
    """path with the bias of each op in ops removed (input 2 = -1, as a Keras layer with
    use_bias=False exports it)."""
    g = read_model(path)
    for i in ops:
        assert g.ops[i].name in ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D')
        g.ops[i].inputs[2] = -1
    out = str(tmp_path / ('nobias_' + os.path.basename(path)))
    save_graph(g, out)
    return out


@pytest.mark.parametrize('path,ops,n', [(MLP, 'fc', 16), (DSCNN, 'first-last', 2)])
def test_an_op_without_bias_runs_as_tflite_micro_runs_it(tmp_path, path, ops, n):
    """Issue 28: an int8 weighted op without a bias tensor (refused before) gets a zero
    int32 bias at TFLite's bias scale: the forward pass is TFLite Micro's on the bias-less
    model, bit for bit."""
    g0 = read_model(path)
    w = [op.index for op in g0.ops if op.name in ('FULLY_CONNECTED', 'CONV_2D', 'DEPTHWISE_CONV_2D')]
    nobias = _drop_biases(path, tmp_path, w if ops == 'fc' else [w[0], w[-1]])
    test_forward_bit_exact_with_tflite_micro(tmp_path, nobias, n,
                                             path.replace('_int8.tflite', '_data.npz'))


def test_prepare_run_export_int8_without_biases(tmp_path):
    """The MLP without any bias: prepare says each op trains with a zero bias, the run
    learns, export writes the trained biases into the model and TFLite Micro runs it as
    the trained net does."""
    nobias = _drop_biases(MLP, tmp_path, [op.index for op in read_model(MLP).ops
                                          if op.name == 'FULLY_CONNECTED'])
    data = str(tmp_path / 'task.npz')
    _task(data)
    q = str(tmp_path / 'q8')
    said = []
    prepare(nobias, q, data=data, test_split=0.25, loss='scce', optimizer='sgd', lr=0.02,
            epochs=2, log=said.append)
    notes = [s for s in said if 'has no bias tensor' in s]
    assert len(notes) == 3 and all('zero int32 bias' in s and s.startswith(nobias) for s in notes), said
    code, out = runner.run(q, python=True, stream=False)
    assert code == 0, out
    acc = [float(v.split('test_accuracy ')[1].split()[0]) for v in out.splitlines()
           if v.startswith('epoch ')]
    assert acc[-1] > 0.6, out
    dst = str(tmp_path / 'trained.tflite')
    export(nobias, os.path.join(q, 'trained.wof'), dst)
    g1 = read_model(dst)
    fcs = [op for op in g1.ops if op.name == 'FULLY_CONNECTED']
    assert all(op.inputs[2] >= 0 and g1.tensors[op.inputs[2]].dtype == 'int32' for op in fcs)
    assert any(np.any(g1.tensors[op.inputs[2]].data) for op in fcs)    # trained
    from tflite_micro.python.tflite_micro import runtime
    g, cut = _cut_softmax(dst, tmp_path)
    m1 = quant.write(g, str(tmp_path / 'again'), 'none')
    net = Q8Net(m1, str(tmp_path / 'again' / 'weights.wof'))
    it = runtime.Interpreter.from_file(cut)
    x = np.load(data)['x']
    for i in range(8):
        xq = net.quantize_input(x[i].tolist())
        it.set_input(np.frombuffer(bytes(xq), np.int8)[None], 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(xq)), np.int8),
                              it.get_output(0).ravel())
