"""CONV_3D_TRANSPOSE (Keras Conv3DTranspose; issue 28, session 32): it had been refused
('op 0 is CONV_3D_TRANSPOSE (Keras Conv3D), not supported'); prepare spells it as a
TRANSPOSE_CONV per input frame and depth tap, summed into the output frame each
reaches (spellings.conv3d_transpose_to_2d).  Forward against a float64 numpy reference
(the scatter of the full transposed convolution, cut at TFLite's pads: SAME's begin as
for the convolution it is the transpose of, from the output's size; checked against the
TFLite interpreter of TF 2.21 on these files, max difference 1.0e-6), gradients of each
depth tap, the bias and the FC after it against central differences of that reference."""
import os

import numpy as np
import pytest

from host_tools.formats.circle_build import CircleBuilder

F32 = np.float32


def conv3d_transpose_ref(x, w, b, s, same, outs):
    """TFLite's CONV_3D_TRANSPOSE in float64: x [D, H, W, C], w [kd, kh, kw, O, C],
    outs (Do, Ho, Wo): the full transposed convolution from its pads' begin on (zeros past
    its end), plus the bias."""
    k, O = w.shape[:3], w.shape[3]
    full = np.zeros([(n - 1) * st + kk for n, st, kk in zip(x.shape[:3], s, k)] + [O])
    for d, h, c in np.ndindex(*x.shape[:3]):
        full[d * s[0]:d * s[0] + k[0], h * s[1]:h * s[1] + k[1], c * s[2]:c * s[2] + k[2]] += \
            np.einsum('ijkoc,c->ijko', w, x[d, h, c])
    begin = [max((-(-n // st) - 1) * st + kk - n, 0) // 2 if same else 0
             for n, kk, st in zip(outs, k, s)]
    y = np.zeros(list(outs) + [O])
    for idx in np.ndindex(*outs):
        f = tuple(i + b0 for i, b0 in zip(idx, begin))
        if all(v < n for v, n in zip(f, full.shape)):
            y[idx] = full[f]
    return y + b


def _model(path, shape, k, O, s, same, outs, act, seed=0):
    """x [1, D, H, W, C] -> CONV_3D_TRANSPOSE (act) -> RESHAPE -> FC [2]."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=tuple(k) + (O, shape[-1])).astype(F32)
    bias = rng.normal(size=O).astype(F32)
    n = int(np.prod(outs)) * O
    fw = (rng.normal(size=(2, n)) / np.sqrt(n)).astype(F32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1] + list(shape))
    c = b.tensor('c', [1] + list(outs) + [O])
    b.op('CONV_3D_TRANSPOSE', [b.tensor('oshape', [5], data=np.array([1] + list(outs) + [O], np.int32)),
                               b.tensor('w', list(w.shape), data=w), x,
                               b.tensor('b', [O], data=bias)], [c],
         padding='SAME' if same else 'VALID', stride_d=s[0], stride_h=s[1], stride_w=s[2],
         dilation_d_factor=1, dilation_h_factor=1, dilation_w_factor=1,
         fused_activation_function=act)
    r = b.tensor('r', [1, n])
    b.op('RESHAPE', [c], [r], new_shape=[1, n])
    y = b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [r, b.tensor('fw', [2, n], data=fw), -1], [y])
    b.inputs(x)
    b.outputs(y)

    def forward(xv, w=w, bias=bias, fw=fw):
        h = conv3d_transpose_ref(np.asarray(xv, np.float64).reshape(shape), w.astype(np.float64),
                                 bias, s, same, outs)
        if act == 'RELU':
            h = np.maximum(h, 0)
        return (h.reshape(1, -1) @ np.asarray(fw, np.float64).T).ravel()
    return b.save(path), forward, w, bias, fw


@pytest.mark.parametrize('shape, k, s, same, outs, act', [
    ((2, 3, 3, 2), (3, 3, 3), (1, 1, 1), True, (2, 3, 3), 'NONE'),     # Keras's default
    ((2, 3, 3, 1), (2, 3, 2), (2, 2, 1), False, (4, 7, 4), 'RELU'),    # VALID, strides
    ((3, 3, 2, 2), (3, 2, 3), (2, 2, 2), True, (6, 6, 4), 'NONE'),     # SAME, strides 2
    ((2, 2, 2, 1), (1, 2, 2), (3, 2, 2), False, (6, 4, 4), 'NONE'),    # frames no tap reaches
    ((2, 2, 3, 1), (3, 2, 3), (2, 2, 2), True, (4, 4, 6), 'RELU'),     # SAME, W under full size
])
def test_conv3d_transpose_forward_and_gradients(tmp_path, shape, k, s, same, outs, act):
    from host_tools.prepare.pipeline import prepare
    from host_tools.formats.circle_io import read_model
    from test_mask_min_ops import conv3d_step
    src, forward, w, bias, fw = _model(tmp_path / 'c.tflite', shape, k, 2, s, same, outs, act)
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), loss='mse', train='all', lr=0.1, log=lambda *a, **kw: None)
    g = read_model(os.fspath(out / 'rewritten.circle'))
    names = {t.index: t.name for t in g.tensors}
    assert 'CONV_3D_TRANSPOSE' not in {o.name for o in g.ops}
    for op in g.ops:        # (sizes TensorFlow allows: TFLite runs the exported graph so)
        if op.name == 'TRANSPOSE_CONV':
            (_, hi, wi, _), (_, ho, wo, _) = (g.tensors[op.inputs[2]].shape,
                                              g.tensors[op.outputs[0]].shape)
            _, kh, kw, _ = g.tensors[op.inputs[1]].shape
            for n, m, kk, st in ((hi, ho, kh, s[1]), (wi, wo, kw, s[2])):
                assert (-(-m // st) == n if op.options['padding'] == 'SAME' else
                        (n - 1) * st + kk <= m < (n - 1) * st + kk + st), (op.options, n, m)
    tr, x, num = conv3d_step(out, shape, forward)
    seen = set()
    for t in tr.net.trainable:
        got = np.asarray(tr.net.sink.acc[t], np.float64)
        n = names[t]
        if '/ttap' in n:
            i = int(n.rsplit('/ttap', 1)[1])
            want = num(lambda v: forward(x, w=np.concatenate([w[:i], v[None], w[i + 1:]])), w[i])
            want = want.transpose(2, 0, 1, 3)       # ([kh, kw, O, C] as [O, kh, kw, C])
        elif n == 'b':
            want = num(lambda v: forward(x, bias=v), bias)
        else:
            assert n == 'fw', n
            want = num(lambda v: forward(x, fw=v), fw)
        np.testing.assert_allclose(got.ravel(), want.ravel(), rtol=2e-3, atol=2e-4, err_msg=n)
        seen.add(n.split('/ttap')[0] + ('/ttap' if '/ttap' in n else ''))
    assert seen == {'w/ttap', 'b', 'fw'}, seen
