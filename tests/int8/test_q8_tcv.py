"""Int8 TRANSPOSE_CONV (issue 29: utrain.q8tcv, Keras's Conv2DTranspose): the forward
bit for bit TFLite Micro's (per-channel and per-tensor weights, SAME and VALID, strides
1-3, with and without a bias, a fused RELU), the gradient it passes down against PyTorch's
float gradient of the dequantized model, the autoencoder's int8 run on unix MicroPython
(viper) equal to CPython's and exported as int8."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from utrain import q8reg  # noqa: E402
from kerasgraphs import build_keras_autoencoder  # noqa: E402

MP = runner.find_micropython()


def _q(scale, zero=0, dim=0):
    s = [float(v) for v in np.ravel(scale)]
    return {'scale': s, 'zero_point': [int(zero)] * len(s), 'quantized_dimension': dim}


def build_tconv(path, seed=0, H=3, W=4, O=3, I=2, K=3, s=2, padding='SAME', per_channel=True,
                bias=True, relu=False):
    """An int8 model of one TRANSPOSE_CONV: x [1, H, W, O] (scale 0.05, zero point 3) ->
    weights [I, K, K, O] (per output channel or one scale) -> y [1, H2, W2, I], as
    TFLite's converter writes Conv2DTranspose (inputs: output shape, weights, x, bias)."""
    r = np.random.default_rng(seed)
    H2 = H * s if padding == 'SAME' else (H - 1) * s + K
    W2 = W * s if padding == 'SAME' else (W - 1) * s + K
    sw = r.uniform(0.005, 0.02, I) if per_channel else np.full(1, 0.01)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, H, W, O], dtype=np.int8, quant=_q(0.05, 3))
    shp = b.tensor('shape', [4], data=np.array([1, H2, W2, I], np.int32))
    w = b.tensor('w', [I, K, K, O], data=r.integers(-127, 128, (I, K, K, O)).astype(np.int8),
                 quant=_q(sw))
    ins = [shp, w, x]
    if bias:
        bs = 0.05 * sw if per_channel else np.full(I, 0.05 * 0.01)
        ins.append(b.tensor('b', [I], data=r.integers(-3000, 3000, I).astype(np.int32),
                            quant=_q(bs)))
    y = b.tensor('y', [1, H2, W2, I], dtype=np.int8, quant=_q(0.08 if relu else 0.15, -128 if relu else -5))
    b.op('TRANSPOSE_CONV', ins, [y], padding=padding, stride_h=s, stride_w=s,
         fused_activation_function='RELU' if relu else 'NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))
    return os.fspath(path)


def _bit_exact(path, folder, n=6, seed=1):
    from tflite_micro.python.tflite_micro import runtime
    g = quant.rewritten(read_model(path))
    m = quant.write(g, folder, 'none')
    net = Q8Net(m, os.path.join(folder, 'weights.wof'))
    it = runtime.Interpreter.from_file(path)
    shape = g.tensors[g.inputs[0]].shape
    r = np.random.default_rng(seed)
    for _ in range(n):
        q = r.integers(-128, 128, int(np.prod(shape))).astype(np.int8)
        ours = np.frombuffer(bytes(net.forward(bytearray(q.tobytes()))), np.int8)
        it.set_input(q.reshape(shape), 0)
        it.invoke()
        ref = it.get_output(0).ravel()
        assert np.array_equal(ours, ref), (ours[:12], ref[:12])
        assert len(np.unique(ours)) > 8         # (not a clamp everywhere)


@pytest.mark.parametrize('kw', [dict(), dict(per_channel=False), dict(padding='VALID'),
                                dict(s=1, K=2, padding='SAME'), dict(s=3, K=3, H=2, W=2),
                                dict(bias=False, relu=True), dict(I=5, O=1, K=4, padding='VALID')])
def test_forward_bit_exact_with_tflite_micro(tmp_path, kw):
    _bit_exact(build_tconv(tmp_path / 't.tflite', **kw), str(tmp_path), seed=len(kw))


def test_autoencoder_forward_bit_exact(tmp_path):
    xs = np.random.default_rng(0).random((8, 8, 8, 1)).astype(np.float32)
    path, _ = build_keras_autoencoder(tmp_path / 'ae.tflite', int8_on=xs)
    _bit_exact(path, str(tmp_path))


def _autoencoder(tmp_path, channels=4):
    os.makedirs(tmp_path, exist_ok=True)
    xs = np.random.default_rng(0).random((16, 8, 8, 1)).astype(np.float32)
    path, _ = build_keras_autoencoder(tmp_path / 'ae.tflite', int8_on=xs, channels=channels)
    g = quant.rewritten(read_model(path))
    m = quant.write(g, str(tmp_path), 'all')
    assert [d['k'] for d in m['layers']] == [quant.CONV, quant.TCV] and m['layers'][1]['xt']
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    tr = type('T', (), {})()
    tr.net, tr.cfg = net, {'loss': 'mse', 'metric': 'mae'}
    q8reg.use(tr)
    return path, xs, m, net


def _torch_grads(torch, path, m, net, x):
    """(int8 sample, float target, dL/dW and dL/db of the TRANSPOSE_CONV, dL/dW of the
    conv) of image x by PyTorch on the dequantized autoencoder as net holds it now (its
    activations fake-quantized on the int8 grid), mse against 0.7 x + 0.2."""
    F = torch.nn.functional
    gf = read_model(path)
    conv, tc = gf.ops[0], gf.ops[-1]
    shape = gf.tensors[tc.inputs[1]].shape

    def fq(v, d):
        # v on d's int8 output grid, clamped (the gradient passes where it is inside:
        # fake quantization, as the int8 forward rounds and clamps)
        s, z = d['sy'], d['zy']
        q = (torch.round(v / s) + z).clamp(-128, 127)
        return v.clamp((-128 - z) * s, (127 - z) * s) + ((q - z) * s - v).detach()
    xq = net.quantize_input(x.ravel().tolist())
    xf = (np.frombuffer(bytes(xq), np.int8).astype(np.float64) - m['zx']) * m['sx']
    t = np.clip(x.ravel() * 0.7 + 0.2, 0, 1)
    L, L0 = net.layers[1], net.layers[0]      # (the weights as the last step left them)
    sw = np.asarray(L.d['sw'])
    tw = np.frombuffer(bytes(L.tw), np.int8).astype(np.float64).reshape(shape) * sw.reshape(-1, 1, 1, 1)
    tb = np.array(L.tb, np.float64) * m['layers'][1]['sx'] * sw
    sw0 = np.asarray(L0.d['sw'])
    cw = torch.tensor(np.frombuffer(bytes(L0.w), np.int8).reshape(gf.tensors[conv.inputs[1]].shape)
                      * sw0.reshape(-1, 1, 1, 1), requires_grad=True)
    cb = np.array(L0.b, np.float64) * m['sx'] * sw0
    twt = torch.tensor(tw, requires_grad=True)
    tbt = torch.tensor(tb, requires_grad=True)
    h = fq(F.conv2d(F.pad(torch.tensor(xf.reshape(1, 8, 8, 1)).permute(0, 3, 1, 2), (0, 1, 0, 1)),
                    cw.permute(0, 3, 1, 2), torch.tensor(cb), stride=2).relu(), m['layers'][0])
    # (TFLite's SAME: the convolution 8 -> 4 pads 0 above, 1 below: the transposed
    # one's 9 x 9 cropped to its first 8 rows and columns)
    y = fq(F.conv_transpose2d(h, twt.permute(3, 0, 1, 2), tbt, stride=2)[:, :, :8, :8],
           m['layers'][1])
    loss = ((y.permute(0, 2, 3, 1).reshape(-1) - torch.tensor(t)) ** 2).mean()
    loss.backward()
    assert abs(net.loss(xq, t.tolist())[0] - loss.item()) < 0.1 * loss.item()
    return xq, t, twt.grad.numpy(), tbt.grad.numpy(), cw.grad.numpy()


def _close(a, w, tol=0.05):
    cos = float((a * w).sum() / np.linalg.norm(a) / np.linalg.norm(w))
    assert cos > 0.99 and abs(np.linalg.norm(a) / np.linalg.norm(w) - 1) < tol, cos


def test_gradient_through_it_against_pytorch(tmp_path, monkeypatch):
    """The autoencoder (CONV_2D stride 2, RELU -> TRANSPOSE_CONV stride 2), mse, SGD
    steps: the TRANSPOSE_CONV's and the conv's int8 updates (1/256 weight steps, before
    their stochastic rounding) against lr dL/dW / s_W of the dequantized model in PyTorch
    (its activations fake-quantized on the int8 grid): cosine > 0.99, norms
    within 5 %; its bias moves by lr dL/db / (s_x s_W) bias steps within 2 %."""
    torch = pytest.importorskip('torch')
    from test_q8 import spy_updates
    path, xs, m, net = _autoencoder(tmp_path)
    got = spy_updates(monkeypatch)
    L = net.layers[1]
    sw = np.asarray(L.d['sw'])
    for i in (3, 7):
        b0 = np.array(L.tb, np.float64)
        xq, t, dtw, dtb, dcw = _torch_grads(torch, path, m, net, xs[i])
        want = [0.02 * dtw / sw.reshape(-1, 1, 1, 1) * 256,
                0.02 * dcw / np.asarray(net.layers[0].d['sw']).reshape(-1, 1, 1, 1) * 256]
        del got[:]
        net.step(xq, t.tolist(), 0.02)
        for a, w in zip(got, want):     # (the TRANSPOSE_CONV's update first: backward order)
            _close(a.reshape(w.shape), w)
        db = b0 - np.array(L.tb, np.float64)
        wb = 0.02 * dtb / (m['layers'][1]['sx'] * sw)
        assert np.allclose(db, wb, rtol=0.02, atol=1), (db, wb)


def test_batch_adam_and_momentum_against_pytorch(tmp_path):
    """Its weights and bias under a batch > 1, Adam and momentum, as a CONV_2D's (q8batch's
    and q8mom's state and updates, Q8Net._put / _bias): a sample's batch sums (q8batch.unit
    weight steps) are dL/dW / s_W of PyTorch's fake-quantized model (cosine > 0.99, norm
    within 5 %), the bias's dL/db within 2 %; Adam's first step moves each float32 master
    by -lr sign(dL/dW), the int8 weights its master requantized, and the bias's master
    by -lr sign(dL/db); momentum's first velocities are the SGD step (1/256 steps), its
    float bias velocities lr dL/db, and the second step moves the weights by 0.9 of the
    first velocity and the second update."""
    torch = pytest.importorskip('torch')
    path, xs, m, net = _autoencoder(tmp_path / 'b')
    net.setup('sgd', batch=4)
    L = net.layers[1]
    sw = np.asarray(L.d['sw']).reshape(-1, 1, 1, 1)
    xq, t, dtw, dtb, dcw = _torch_grads(torch, path, m, net, xs[3])
    net.accum(xq, t.tolist())
    _close(np.array(L.ga, np.float64).reshape(dtw.shape) * 2.0 ** -L.gk[0], dtw / sw)
    assert np.allclose(np.array(L.ba), dtb, rtol=0.02, atol=1e-6), (list(L.ba), dtb)
    w0 = bytes(L.tw)
    net.apply(0.05, 0.25)
    assert bytes(L.tw) != w0 and not any(L.ga)

    path, xs, m, net = _autoencoder(tmp_path / 'a')
    net.setup('adam')
    L = net.layers[1]
    wm0, bf0 = np.array(L.wm), np.array(L.bf)
    assert np.allclose(wm0, np.frombuffer(bytes(L.tw), np.int8) * np.repeat(sw.ravel(), len(wm0) // len(sw)))
    xq, t, dtw, dtb, dcw = _torch_grads(torch, path, m, net, xs[3])
    net.accum(xq, t.tolist())
    net.apply(0.001, 1.0)
    dw, g = np.array(L.wm) - wm0, dtw.ravel()
    big = np.abs(g) > 1e-2 * np.abs(g).max()
    assert big.sum() > 20 and np.mean(np.isclose(dw[big], -0.001 * np.sign(g[big]), rtol=0.05)) > 0.95
    assert np.allclose(np.array(L.bf) - bf0, -0.001 * np.sign(dtb), rtol=0.05)
    assert np.array_equal(np.frombuffer(bytes(L.tw), np.int8),
                          np.clip(np.round(np.array(L.wm) / np.repeat(sw.ravel(), len(wm0) // len(sw))), -127, 127))

    path, xs, m, net = _autoencoder(tmp_path / 'm')
    net.setup('sgd', momentum=0.9)
    L = net.layers[1]
    bf0 = np.array(L.bf)
    xq, t, dtw, dtb, dcw = _torch_grads(torch, path, m, net, xs[3])
    net.step(xq, t.tolist(), 0.02)
    v1 = np.frombuffer(bytes(L.vw), np.int16).astype(np.float64)
    _close(v1.reshape(dtw.shape), 0.02 * dtw / sw * 256)
    assert np.allclose(np.array(L.vb), 0.02 * dtb, rtol=0.02, atol=1e-7)
    assert np.allclose(bf0 - np.array(L.bf), 0.02 * dtb, rtol=0.02, atol=1e-7)
    xq, t, dtw, dtb, dcw = _torch_grads(torch, path, m, net, xs[7])
    net.step(xq, t.tolist(), 0.02)
    v2 = np.frombuffer(bytes(L.vw), np.int16).astype(np.float64)
    _close(v2 - 0.9 * v1, (0.02 * dtw / sw * 256).ravel(), 0.1)


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('kw', [dict(optimizer='sgd', lr=0.05), dict(optimizer='adam', lr=0.01),
                                dict(optimizer='sgd', lr=0.02, momentum=0.9, batch=4)])
def test_autoencoder_trains_as_int8_on_micropython(tmp_path, kw):
    """prepare trains the int8 autoencoder as int8 with mse (the conv below the
    TRANSPOSE_CONV trains through it), under SGD, Adam and momentum at batch 4; unix
    MicroPython (viper) lowers the test loss and ends with CPython's trained.wof and
    TRANSPOSE_CONV weights (.q8c, moved); export --quantized runs in TFLite Micro as the
    board's net."""
    from test_q8_reg import trained_on_both, assert_export_runs_as_trained
    r = np.random.default_rng(2)
    xs = r.random((48, 8, 8, 1)).astype(np.float32)
    path, _ = build_keras_autoencoder(tmp_path / 'ae.tflite', int8_on=xs)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.clip(xs * 0.7 + 0.2, 0, 1).reshape(48, -1))
    d = str(tmp_path / 'mp')
    s = prepare(path, d, data=str(tmp_path / 'd.npz'), loss='mse', epochs=3, test_split=0.25,
                train='all', log=lambda *a: None, **kw)
    assert s['int8']
    tl = trained_on_both(d, tmp_path)
    assert tl[-1] < 0.8 * tl[0], tl
    with open(os.path.join(d, 'trained.wof.q8c'), 'rb') as f:
        assert f.read()[12:12 + 36] != read_model(path).tensors[4].data.tobytes()
    assert_export_runs_as_trained(path, d, xs[:4], tmp_path)


def test_prepare_says_what_of_it_trains(tmp_path):
    """Its weights train as int8 where a layer below it trains (the default --train all
    of the autoencoder: the conv and it), under Adam, momentum and a batch > 1 too;
    --train naming it alone is refused, saying why and --dequantize."""
    from host_tools.prepare.pipeline import PrepareError
    xs = np.random.default_rng(0).random((20, 8, 8, 1)).astype(np.float32)
    path, _ = build_keras_autoencoder(tmp_path / 'ae.tflite', int8_on=xs)
    np.savez(tmp_path / 'd.npz', x=xs, y=xs.reshape(20, -1))
    data = str(tmp_path / 'd.npz')
    said = []
    s = prepare(path, str(tmp_path / 'b'), data=data, loss='mse', log=said.append)
    assert s['int8'] and not any('TRANSPOSE_CONV' in v for v in said), said
    assert sorted(s['trainable']) == ['conv.b', 'conv.w', 'tconv.b', 'tconv.w']
    assert s['trainable_params'] == 4 * 9 + 4 + 36 + 1
    with open(tmp_path / 'b' / 'q8.json') as f:
        assert [d.get('xt') for d in json.load(f)['layers']] == [None, 1]
    for kw in (dict(optimizer='adam'), dict(momentum=0.9), dict(batch=4)):
        said = []
        s = prepare(path, str(tmp_path / 'e'), data=data, loss='mse', log=said.append, **kw)
        assert s['int8'] and 'tconv.w' in s['trainable'] and not any(
            'dequantiz' in v for v in said), said
    said = []
    with pytest.raises(PrepareError, match=r'nothing to train as int8.*--dequantize'):
        prepare(path, str(tmp_path / 'c'), data=data, loss='mse', train='last:1', log=said.append)
    assert any('op 4 (TRANSPOSE_CONV): int8 training trains its weights only where a layer '
               'below it trains' in v for v in said), said


def test_a_float_model_whose_transpose_conv_int8_would_freeze_trains_in_float32(tmp_path):
    """prepare's own int8 choice for a float model on a board without ulab: where int8
    training would leave a TRANSPOSE_CONV that --train names frozen (nothing trains below
    it: a held-out Keras decoder starting with Conv2DTranspose trained on a Pico to test
    MAE 0.57 where float32 reached 0.13; --train last:1 of the autoencoder was refused,
    "nothing to train as int8"), it trains in float32 and says why; --int8 still asks
    for int8, and the default --train all (the conv below trains) stays int8."""
    xs = np.random.default_rng(0).random((20, 8, 8, 1)).astype(np.float32)
    path, _ = build_keras_autoencoder(tmp_path / 'ae.tflite')
    np.savez(tmp_path / 'd.npz', x=xs, y=xs.reshape(20, -1))
    data = str(tmp_path / 'd.npz')
    said = []
    s = prepare(path, str(tmp_path / 'a'), data=data, loss='mse', board='rp2040',
                train='last:1', log=said.append)
    assert not s.get('int8') and sorted(s['trainable']) == ['tconv.w']
    assert any('trains in float32 (as int8, op 4 (TRANSPOSE_CONV): int8 training trains its '
               'weights only where a layer below it trains' in v and '--int8 asks' in v
               for v in said), said
    s = prepare(path, str(tmp_path / 'b'), data=data, loss='mse', board='rp2040',
                log=lambda *a: None)
    assert s['int8'] and 'tconv.w' in s['trainable']


@pytest.mark.slow
@pytest.mark.parametrize('kw', [dict(optimizer='sgd', lr=0.05),
                                dict(optimizer='adam', lr=0.01, batch=4),
                                dict(optimizer='sgd', lr=0.02, momentum=0.9)])
def test_ctrl_c_resume_with_it_training_bit_identical(tmp_path, kw):
    """Ctrl-C at random moments and train.py again with resume: trained.wof, its weights
    and bias (trained.wof.q8c, the checkpoint's ext state: with Adam's masters and
    moments, momentum's velocities) and the log equal an uninterrupted run's bit for bit."""
    from repo import set_train
    from test_ctrl_c import interrupted_runs
    r = np.random.default_rng(3)
    xs = r.random((400, 8, 8, 1)).astype(np.float32)
    path, _ = build_keras_autoencoder(tmp_path / 'ae.tflite', int8_on=xs[:32])
    np.savez(tmp_path / 'd.npz', x=xs, y=np.clip(xs * 0.7 + 0.2, 0, 1).reshape(400, -1))
    base = tmp_path / 'base'
    prepare(path, str(base), data=str(tmp_path / 'd.npz'), test_split=0.25, loss='mse',
            epochs=3, shuffle=True, seed=7, train='all', log=lambda *a: None, **kw)
    set_train(base, run={'checkpoint_every': 20})
    runner.stage(str(base))
    tally = interrupted_runs(base, tmp_path, not MP, 4, 5)
    assert tally['identical'] == 4 and tally['tracebacks'] == 0 and tally['restarts'] > 0, tally
    with open(tmp_path / 'whole' / 'trained.wof.q8c', 'rb') as f:
        got = f.read()
    assert got[:4] == b'UTTC' and read_model(path).tensors[4].name == 'tconv.w' and \
        got[12:12 + 36] != read_model(path).tensors[4].data.tobytes()     # (it trained)


def test_float_autoencoder_trains_as_int8_for_a_board_without_ulab(tmp_path):
    """A float Conv2D -> Conv2DTranspose autoencoder (mse) prepared for --board rp2040
    without ulab trains as int8 (fromfloat: its TRANSPOSE_CONV calibrated as the others,
    its weights and the zero bias it gets training, here at the run's batch 4: their float
    sums applied at the batch's end); the test loss lowers (CPython: the board's
    integers) and export writes float32 with the TRANSPOSE_CONV's trained weights (its
    trained.wof.q8c dequantized)."""
    from host_tools.prepare.pipeline import export
    p, _ = build_keras_autoencoder(tmp_path / 'ae.tflite')
    x = np.random.default_rng(0).random((160, 8, 8, 1)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.clip(x * 0.7 + 0.2, 0, 1).reshape(160, -1))
    d = str(tmp_path / 'o')
    said = []
    s = prepare(p, d, data=str(tmp_path / 'd.npz'), loss='mse', board='rp2040', epochs=3,
                lr=0.05, test_split=0.25, log=said.append)
    assert s.get('int8') and 'tconv.w' in s['trainable'], (said, s.get('trainable'))
    assert s['settings']['batch'] > 1
    code, out = runner.run(d, python=True, stream=False)
    assert code == 0, out
    tl = [float(v.split('test_loss ')[1].split()[0]) for v in out.splitlines() if 'test_loss' in v]
    assert tl[-1] < 0.5 * tl[0], out
    export(p, os.path.join(d, 'trained.wof'), str(tmp_path / 'f.tflite'))
    g0, g1 = read_model(p), read_model(str(tmp_path / 'f.tflite'))
    g8 = read_model(os.path.join(d, 'int8.circle'))
    k = next(t.index for t in g0.tensors if t.name == 'tconv.w')
    m = quant.meta(g8, 'all')
    quant.tconved(g8, m, os.path.join(d, 'trained.wof'))
    want = g8.tensors[k].data * np.asarray(g8.tensors[k].quant['scale'], np.float64).reshape(-1, 1, 1, 1)
    assert g1.tensors[k].dtype == 'float32' and np.allclose(g1.tensors[k].data, want, atol=1e-7)
    assert not np.allclose(g1.tensors[k].data, g0.tensors[k].data, atol=1e-3)

