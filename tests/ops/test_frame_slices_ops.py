"""Keras 3's TimeDistributed(Conv2D) on a [1, T, H, W, C] clip: the converter moves T first
(TRANSPOSE or RESHAPE to [T, 1, H, W, C]), slices each frame, runs the conv on it, PACKs
the frames' outputs [T, 1, ...] and slices them again.  prepare had refused the 5-D
tensor ('has shape [3, 1, 4, 4, 1]; utrain handles up to 4-D'): spellings.frame_slices
reads the frames from the tensor before the move and the PACK's inputs themselves.
Forward against float64 numpy, the shared conv weight's gradient against central
differences of it."""
import os

import numpy as np
import pytest

import test_parity as tp  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

T, H, C, K, O = 3, 4, 1, 2, 2


def _clip_model(path, move, seed=0):
    rng = np.random.default_rng(seed)
    Wc = rng.normal(size=(K, 3, 3, C)).astype(np.float32)
    W = rng.normal(size=(O, T * K)).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, H, H, C])
    m = b.tensor('moved', [T, 1, H, H, C])
    if move == 'TRANSPOSE':
        b.op('TRANSPOSE', [x, b.tensor('perm', [5], data=np.int32([1, 0, 2, 3, 4]))], [m])
    else:
        b.op('RESHAPE', [x, b.tensor('s0', [5], data=np.int32([T, 1, H, H, C]))], [m])
    wc = b.tensor('wc', [K, 3, 3, C], data=Wc)
    bc = b.tensor('bc', [K], data=np.zeros(K, np.float32))
    frames = []
    for t in range(T):
        f = b.tensor(f'f{t}', [1, H, H, C])
        b.op('STRIDED_SLICE', [m, b.tensor(f'b{t}', [5], data=np.int32([t, 0, 0, 0, 0])),
                               b.tensor(f'e{t}', [5], data=np.int32([t + 1, 1, H, H, C])),
                               b.tensor(f's{t}', [5], data=np.int32([1] * 5))], [f],
             shrink_axis_mask=1)
        c = b.tensor(f'c{t}', [1, H - 2, H - 2, K])
        b.op('CONV_2D', [f, wc, bc], [c], padding='VALID', stride_h=1, stride_w=1,
             fused_activation_function='RELU')
        frames.append(c)
    p = b.tensor('packed', [T, 1, H - 2, H - 2, K])
    b.op('PACK', frames, [p], axis=0, values_count=T)
    means = []
    for t in range(T):
        f = b.tensor(f'g{t}', [1, H - 2, H - 2, K])
        b.op('STRIDED_SLICE', [p, b.tensor(f'gb{t}', [5], data=np.int32([t, 0, 0, 0, 0])),
                               b.tensor(f'ge{t}', [5], data=np.int32([t + 1, 1, H - 2, H - 2, K])),
                               b.tensor(f'gs{t}', [5], data=np.int32([1] * 5))], [f],
             shrink_axis_mask=1)
        mt = b.tensor(f'm{t}', [1, K])
        b.op('MEAN', [f, b.tensor(f'ax{t}', [2], data=np.int32([1, 2]))], [mt], keep_dims=False)
        means.append(mt)
    cat = b.tensor('cat', [1, T * K])
    b.op('CONCATENATION', means, [cat], axis=1, fused_activation_function='NONE')
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [cat, b.tensor('w', [O, T * K], data=W), -1], [y],
         fused_activation_function='NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(os.fspath(path))

    def forward(xi, wc=Wc.astype(np.float64)):
        xi = xi.astype(np.float64).reshape(T, H, H, C)
        out = []
        for t in range(T):
            c = np.zeros((H - 2, H - 2, K))
            for i in range(H - 2):
                for j in range(H - 2):
                    c[i, j] = np.einsum('kabc,abc->k', wc, xi[t, i:i + 3, j:j + 3])
            out.append(np.maximum(c, 0).mean((0, 1)))
        return W.astype(np.float64) @ np.concatenate(out)
    return os.fspath(path), forward, Wc.astype(np.float64)


@pytest.mark.parametrize('move', ['TRANSPOSE', 'RESHAPE'])
def test_time_distributed_frames_forward_and_gradients(tmp_path, move):
    from utrain.sink import Sums
    src, forward, Wc = _clip_model(tmp_path / 'td.tflite', move)
    x = np.random.default_rng(1).normal(size=(4, 1, T, H, H, C)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x.reshape(4, T, H, H, C), y=np.zeros((4, O), np.float32))
    out = tmp_path / 'run'
    prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), loss='mse', lr=0.1,
            log=lambda *a, **k: None)
    tr = tp.new_trainer(out / 'model.flat', out / 'weights.wof')
    np.testing.assert_allclose(tp.utrain_predict(tr, x.reshape(4, -1), [1, T, H, H, C]),
                               np.stack([forward(xi) for xi in x]), rtol=1e-5, atol=1e-5)
    tr.net.sink = Sums(tr.net)
    tr.set_input(x[0])
    tr.net.forward(True)
    dy = np.array([0.5, -1.5])
    tr.net.backward(dy[None].astype(np.float32))
    want = np.zeros_like(Wc)
    for i in np.ndindex(*Wc.shape):
        e = np.zeros_like(Wc)
        e[i] = 1e-5
        want[i] = dy @ (forward(x[0], Wc + e) - forward(x[0], Wc - e)) / 2e-5
    g = read_model(os.fspath(out / 'rewritten.circle'))
    k = next(k for k in tr.net.trainable if g.tensors[k].shape == list(Wc.shape))
    np.testing.assert_allclose(np.asarray(tr.net.sink.acc[k]).reshape(Wc.shape), want,
                               rtol=1e-4, atol=1e-6)
