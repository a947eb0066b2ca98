"""TRANSPOSE_CONV (micro/utrain/op_tconv.py; issue 28: Keras Conv2DTranspose /
Conv1DTranspose, PyTorch ConvTranspose2d/1d through ONNX, tests/formats/test_onnx.py).

Forward against a float64 numpy reference written here (the scatter TFLite's reference
kernel does: input pixel (iy, ix) adds x . W[:, ky, kx, :] at output (iy*sh - pad_top + ky,
ix*sw - pad_left + kx)) and TFLite Micro, gradients against float64 central finite
differences on the device code, and the same under unix MicroPython (float32), with
tests/support/op_harness.py's models: x[1, 3] -> FC -> RESHAPE [1, H, W, I] ->
TRANSPOSE_CONV -> ... -> FC -> y, every FC and the op's weight and bias training, so the
first FC's weight gradient checks the op's input gradient element by element.  Then a
Keras-style conv autoencoder (the graph TF 2.21 writes: the output shape read at run time
by SHAPE -> STRIDED_SLICE -> PACK, no bias input) trains on unix MicroPython with MSE
against its own input and exports.
"""
import os

import numpy as np
import pytest

import op_harness as oh  # noqa: E402
from test_split_math_ops import tflm_infer  # noqa: E402

F32 = np.float32


def _same_pad(n, k, s):
    out = -(-n // s)
    return max((out - 1) * s + k - n, 0) // 2


def tconv_ref(x, w, b, s, pad, out_hw, act=None):
    """TFLite's TRANSPOSE_CONV in float64: x [1, H, W, I], w [O, KH, KW, I]."""
    _, H, W, _ = x.shape
    O, KH, KW, _ = w.shape
    OH, OW = out_hw
    pt, pl = (_same_pad(OH, KH, s[0]), _same_pad(OW, KW, s[1])) if pad == 'SAME' else (0, 0)
    y = np.zeros((1, OH, OW, O))
    for iy in range(H):
        for ix in range(W):
            for ky in range(KH):
                for kx in range(KW):
                    oy, ox = iy * s[0] - pt + ky, ix * s[1] - pl + kx
                    if 0 <= oy < OH and 0 <= ox < OW:
                        y[0, oy, ox] += w[:, ky, kx, :] @ x[0, iy, ix]
    if b is not None:
        y += b
    return np.maximum(y, 0) if act == 'RELU' else y


def _tconv(x_shape, O, k, s, pad, out_hw, bias=True, act='NONE', then_relu=False):
    """x_shape [1, H, W, I] -> TRANSPOSE_CONV (O channels, kernel k, stride s) to out_hw;
    then_relu: a RELU op after it (as Keras writes an activation after an unfused bias)."""
    def build(m):
        a = m.act_input(x_shape)
        I = x_shape[3]
        kh, kw = k
        w = m.const([O, kh, kw, I])
        ins = [m.tensor([4], oh.ints([1, out_hw[0], out_hw[1], O])), w, a]
        b = None
        if bias:
            ins.append(m.const([O]))
            b = m.val[ins[-1]]
        pre = tconv_ref(m.val[a], m.val[w], b, s, pad, out_hw)
        y = m.op('TRANSPOSE_CONV', ins, tconv_ref(m.val[a], m.val[w], b, s, pad, out_hw,
                                                    'RELU' if act == 'RELU' else None),
                 kinks=(0.0,) if act == 'RELU' else (), pre=pre, padding=pad,
                 stride_h=s[0], stride_w=s[1], fused_activation_function=act)
        if then_relu:
            y = m.op('RELU', [y], np.maximum(m.val[y], 0), kinks=(0.0,))
        return y
    return build


CASES = {
    # the autoencoder's upsampling: SAME, stride 2, 3x3 (an odd kernel: pad 0 on top)
    'same-s2-k3': _tconv([1, 2, 3, 2], 3, (3, 3), (2, 2), 'SAME', (4, 6)),
    # DCGAN's 4x4 stride 2 (pad 1), no bias, fused RELU
    'same-s2-k4-nobias-relu': _tconv([1, 2, 2, 3], 2, (4, 4), (2, 2), 'SAME', (4, 4),
                                     bias=False, act='RELU'),
    # VALID, strides and kernel differing per axis (Keras's 9x6 from 4x5)
    'valid-s2x1-k3x2': _tconv([1, 3, 4, 2], 3, (3, 2), (2, 1), 'VALID', (7, 5)),
    # stride 1 SAME: output the input's size (ulab's one-call-per-tap steps)
    'same-s1-k3': _tconv([1, 3, 4, 2], 2, (3, 3), (1, 1), 'SAME', (3, 4), then_relu=True),
    # one output channel (a decoder's last layer: ulab's single-channel steps), stride 3
    'same-s3-k5-1ch': _tconv([1, 2, 2, 3], 1, (5, 5), (3, 3), 'SAME', (6, 6)),
    # Conv1DTranspose as TFLite runs it: H = 1
    '1d-same-s2-k3': _tconv([1, 1, 5, 2], 3, (1, 3), (1, 2), 'SAME', (1, 10)),
    # an output larger than the VALID extent (Keras output_padding): zeros, then bias
    'valid-s2-k2-outpad': _tconv([1, 2, 2, 2], 2, (2, 2), (2, 2), 'VALID', (5, 5)),
}


def build(cid, where, seed):
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    for attempt in range(200):
        m = oh.Model(np.random.default_rng([seed, attempt]))
        y = CASES[cid](m)
        if m.ok:
            break
    y = m.finish(y, path)
    return oh.prepared(m, y, where)


@pytest.fixture(scope='module')
def device(tmp_path_factory):
    return oh.run_device(tmp_path_factory.mktemp('tconv_ops'), CASES, build, 9300)


def test_reference_is_the_input_gradient_of_a_convolution():
    """tconv_ref's scatter is the adjoint of the convolution with the same weight and
    TFLite's padding of the output's size: <conv(u), x> = <u, tconv(x)>, so the
    reference itself is not a copy of the device's walk."""
    rng = np.random.default_rng(0)
    for (H, W), (OH, OW), k, s, pad in (((2, 3), (4, 6), 3, 2, 'SAME'),
                                         ((3, 4), (7, 5), (3, 2), (2, 1), 'VALID')):
        k, s = (k, k) if isinstance(k, int) else k, (s, s) if isinstance(s, int) else s
        x, u = rng.normal(size=(1, H, W, 2)), rng.normal(size=(1, OH, OW, 3))
        w = rng.normal(size=(3, k[0], k[1], 2))
        pt = (_same_pad(OH, k[0], s[0]), _same_pad(OW, k[1], s[1])) if pad == 'SAME' else (0, 0)
        conv = np.zeros((1, H, W, 2))       # conv of u with w^T: [O->I], u's pixels read
        for iy in range(H):
            for ix in range(W):
                for ky in range(k[0]):
                    for kx in range(k[1]):
                        oy, ox = iy * s[0] - pt[0] + ky, ix * s[1] - pt[1] + kx
                        if 0 <= oy < OH and 0 <= ox < OW:
                            conv[0, iy, ix] += u[0, oy, ox] @ w[:, ky, kx, :]
        lhs = float((conv * x).sum())
        rhs = float((u * tconv_ref(x, w, None, s, pad, (OH, OW))).sum())
        assert abs(lhs - rhs) < 1e-9 * max(1.0, abs(lhs))


@pytest.mark.parametrize('cid', list(CASES))
def test_forward_and_gradients(device, cid):
    oh.check_case(device, cid, 1e-10, tflm_infer, 'TFLite Micro')


def test_ops_micropython_match_float64(device, tmp_path):
    """Each case under unix MicroPython (npfallback, or ulab when $MICROPYTHON has it),
    float32, against the float64 CPython run."""
    oh.check_micropython(device, CASES, tmp_path)


def test_grouped_weight_is_refused(tmp_path):
    """A weight whose channels are not the input's and output's is refused naming the
    file, the op and the layout TFLite writes."""
    from host_tools.graph.passes import PrepareError, plan
    from host_tools.formats.circle_io import read_model
    m = oh.Model(np.random.default_rng(0))
    a = m.act_input([1, 2, 2, 4])
    out = m.tensor([1, 4, 4, 2])
    m.b.op('TRANSPOSE_CONV', [m.tensor([4], oh.ints([1, 4, 4, 2])), m.const([2, 3, 3, 2]), a],
           [out], padding='SAME', stride_h=2, stride_w=2)
    m.b.outputs(out)
    path = str(tmp_path / 'g.circle')
    m.b.save(path)
    with pytest.raises(PrepareError) as e:
        plan(read_model(path))
    assert path in str(e.value) and 'op 2 TRANSPOSE_CONV' in str(e.value) and \
        '[out, kh, kw, in]' in str(e.value), str(e.value)


def test_keras_conv_autoencoder_trains_and_exports(tmp_path):
    """A conv autoencoder as TF 2.21 writes Keras's Conv2D(4, 3, strides=2, 'same',
    relu) -> Conv2DTranspose(1, 3, strides=2, 'same') (kerasgraphs.build_keras_autoencoder:
    the output shape made at run time, no bias input) prepares with MSE against its own
    input, trains on unix MicroPython (the loss falls) and exports: TFLite Micro on the
    export = utrain's trained forward."""
    from kerasgraphs import build_keras_autoencoder
    from test_rewrite import tflm_infer as tflm
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.target import runner
    src, forward = build_keras_autoencoder(tmp_path / 'ae.tflite')
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:8, 0:8]
    x = np.stack([np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 6.0)
                  for cy, cx in rng.uniform(1, 7, (24, 2))])[..., None].astype(F32)
    np.testing.assert_allclose(tflm(src, x).reshape(x.shape), forward(x.astype(np.float64)),
                               rtol=1e-4, atol=1e-5)
    np.savez(tmp_path / 'd.npz', x=x, y=x)
    out = tmp_path / 'run'
    prepare(src, str(out), data=str(tmp_path / 'd.npz'), test_split=0.25, loss='mse',
            optimizer='adam', lr=0.02, batch=4, epochs=4, int8=False, log=lambda *a: None)
    code, text = runner.run(str(out), python=runner.find_micropython() is None, stream=False)
    assert code == 0, text
    with open(out / 'train.log') as f:      # epoch, loss, mae, test_loss, ...
        losses = [float(r.split(',')[3]) for r in f.read().split()[1:]]
    assert losses[-1] < 0.5 * losses[0], losses
    dst = tmp_path / 'trained.tflite'
    export(src, str(out / 'trained.wof'), str(dst))
    after = tflm(dst, x).reshape(x.shape)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'trained.wof'), x,
                         [1, 8, 8, 1]).reshape(x.shape)
    np.testing.assert_allclose(got, after, rtol=1e-4, atol=1e-5)
    assert ((after - x) ** 2).mean() < 0.5 * ((forward(x.astype(np.float64)) - x) ** 2).mean()


def _tflm_int8(path, x):
    """TFLite Micro on an int8 model: x quantized at the input's scale, the output
    dequantized."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.formats.circle_io import read_model
    g = read_model(path)
    qi, qo = (g.tensors[k].quant for k in (g.inputs[0], g.outputs[0]))
    it = runtime.Interpreter.from_file(os.fspath(path))
    out = []
    for v in x:
        q = np.clip(np.round(v / qi['scale'][0]) + qi['zero_point'][0], -128, 127)
        it.set_input(q.astype(np.int8)[None], 0)
        it.invoke()
        out.append((np.array(it.get_output(0), np.float64) - qo['zero_point'][0]) * qo['scale'][0])
    return np.concatenate(out).reshape(x.shape), qo['scale'][0]


def test_int8_keras_autoencoder_trains_dequantized_and_exports_int8(tmp_path):
    """The int8 autoencoder (TRANSPOSE_CONV with per-channel weights on axis 0 and an int32
    bias at input x weight scale) trained in float32 with --dequantize (under Adam and a
    batch of 4 it trains as int8 without it: tests/int8/test_q8_tcv.py), and export --quantized --data writes it int8 again
    with the transposed convolution's weight and bias scaled as a conv's: TFLite Micro
    on the export is utrain's trained float forward within a few output steps."""
    from kerasgraphs import build_keras_autoencoder
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.target import runner
    rng = np.random.default_rng(4)
    yy, xx = np.mgrid[0:8, 0:8]
    x = np.stack([np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 6.0)
                  for cy, cx in rng.uniform(1, 7, (24, 2))])[..., None].astype(F32)
    src, forward = build_keras_autoencoder(tmp_path / 'ae8.tflite', int8_on=x)
    before, step = _tflm_int8(src, x)
    assert np.abs(before - forward(x)).max() < 4 * step
    np.savez(tmp_path / 'd.npz', x=x, y=x)
    out = tmp_path / 'run'
    said = []
    prepare(src, str(out), data=str(tmp_path / 'd.npz'), loss='mse', optimizer='adam',
            lr=0.02, batch=4, epochs=4, log=said.append, dequantize=True)
    assert not (out / 'q8.json').exists()          # (the float run's folder)
    code, text = runner.run(str(out), python=True, stream=False)
    assert code == 0, text
    dst = tmp_path / 'trained.tflite'
    export(src, str(out / 'trained.wof'), str(dst), quantized=True, data=str(tmp_path / 'd.npz'))
    after, step = _tflm_int8(dst, x)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'trained.wof'), x,
                         [1, 8, 8, 1]).reshape(x.shape)
    assert np.abs(after - got).max() < 4 * step, (np.abs(after - got).max(), step)
    assert ((after - x) ** 2).mean() < 0.5 * ((before - x) ** 2).mean()
