"""Regenerate the bundled digits example: digits.npz (the 1,797 8x8 digits that
scikit-learn bundles, pixels scaled to [0, 1]); train.ds and test.ds, the same samples
ready for a board (an 80/20 split, pixels stored losslessly as uint8 sixteenths, labels);
digits_mlp.circle, a 64-32-10 MLP (FULLY_CONNECTED+RELU, FULLY_CONNECTED, SOFTMAX); and
digits_cnn.circle, a small CNN on the 8x8x1 image (CONV_2D 3x3x8 RELU, MAX_POOL_2D 2,
DEPTHWISE_CONV_2D 3x3 x2 RELU, MAX_POOL_2D 2, RESHAPE, FULLY_CONNECTED, SOFTMAX), all with
seeded Glorot-uniform weights: the starting point a user would get from an untrained export.

    python datasets/digits/make.py
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402


def glorot(rng, n_out, n_in, shape=None):
    lim = np.sqrt(6.0 / (n_in + n_out))
    return rng.uniform(-lim, lim, size=shape or (n_out, n_in)).astype(np.float32)


def mlp(sizes, seed=0, name='mlp'):
    """An MLP circle model: FC+RELU layers, a last FC, then SOFTMAX."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(description=name)
    x = b.tensor('input', [1, sizes[0]])
    first = x
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = b.tensor(f'fc{i}/weight', [n_out, n_in], data=glorot(rng, n_out, n_in))
        bias = b.tensor(f'fc{i}/bias', [n_out], data=np.zeros(n_out, np.float32))
        y = b.tensor(f'fc{i}/out', [1, n_out])
        last = i == len(sizes) - 2
        b.op('FULLY_CONNECTED', [x, w, bias], [y],
             fused_activation_function='NONE' if last else 'RELU')
        x = y
    p = b.tensor('probabilities', [1, sizes[-1]])
    b.op('SOFTMAX', [x], [p], beta=1.0)
    b.inputs(first)
    b.outputs(p)
    return b


def cnn(seed=0, name='cnn'):
    """The digits CNN: [1,8,8,1] -> conv 3x3 x8 RELU -> maxpool 2 -> depthwise 3x3 x2
    RELU -> maxpool 2 -> [1,64] -> FC 10 -> SOFTMAX (circle layouts: conv [O,KH,KW,I],
    depthwise [1,KH,KW,C*M])."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(description=name)
    x = b.tensor('input', [1, 8, 8, 1])
    w = glorot(rng, 8 * 9, 9, (8, 3, 3, 1))            # fan out 3*3*8, fan in 3*3*1
    c1 = b.tensor('conv1/out', [1, 8, 8, 8])
    b.op('CONV_2D', [x, b.tensor('conv1/weight', [8, 3, 3, 1], data=w),
                     b.tensor('conv1/bias', [8], data=np.zeros(8, np.float32))], [c1],
         padding='SAME', stride_h=1, stride_w=1, fused_activation_function='RELU')
    p1 = b.tensor('pool1/out', [1, 4, 4, 8])
    b.op('MAX_POOL_2D', [c1], [p1], padding='VALID', stride_h=2, stride_w=2,
         filter_height=2, filter_width=2)
    w = glorot(rng, 18, 9, (1, 3, 3, 16))              # per channel: fan in 9, out 9*2
    c2 = b.tensor('dwconv2/out', [1, 4, 4, 16])
    b.op('DEPTHWISE_CONV_2D', [p1, b.tensor('dwconv2/weight', [1, 3, 3, 16], data=w),
                               b.tensor('dwconv2/bias', [16], data=np.zeros(16, np.float32))],
         [c2], padding='SAME', stride_h=1, stride_w=1, depth_multiplier=2,
         fused_activation_function='RELU')
    p2 = b.tensor('pool2/out', [1, 2, 2, 16])
    b.op('MAX_POOL_2D', [c2], [p2], padding='VALID', stride_h=2, stride_w=2,
         filter_height=2, filter_width=2)
    f = b.tensor('flatten/out', [1, 64])
    b.op('RESHAPE', [p2], [f], new_shape=[1, 64])
    z = b.tensor('fc/out', [1, 10])
    b.op('FULLY_CONNECTED', [f, b.tensor('fc/weight', [10, 64], data=glorot(rng, 10, 64)),
                             b.tensor('fc/bias', [10], data=np.zeros(10, np.float32))], [z])
    p = b.tensor('probabilities', [1, 10])
    b.op('SOFTMAX', [z], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    return b


def write_ready(x, y):
    """train.ds / test.ds as `prepare --test-split 0.2` splits them, stored as uint8."""
    from host_tools.files import dataset as ds
    tr, te = ds.split(len(x), 0.2, 0)
    for name, idx in (('train.ds', tr), ('test.ds', te)):
        ds.write_dataset(os.path.join(HERE, name), x[idx], y[idx], 'uint8', 1 / 16, 0.0)


def main():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    np.savez_compressed(os.path.join(HERE, 'digits.npz'), x=x, y=y)
    write_ready(x, y)
    mlp([64, 32, 10], seed=0, name='digits MLP 64-32-10 (utrain example)').save(
        os.path.join(HERE, 'digits_mlp.circle'))
    cnn(seed=0, name='digits CNN conv-pool-dwconv-pool-fc (utrain example)').save(
        os.path.join(HERE, 'digits_cnn.circle'))
    print('wrote digits.npz, digits_mlp.circle and digits_cnn.circle')


if __name__ == '__main__':
    main()
