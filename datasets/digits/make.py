"""Regenerate the bundled digits example: digits.npz (the 1,797 8x8 digits that
scikit-learn bundles, pixels scaled to [0, 1]); train.ds and test.ds, the same samples
ready for a board (an 80/20 split, pixels stored losslessly as uint8 sixteenths, labels);
and digits_mlp.circle, a 64-32-10 MLP
(FULLY_CONNECTED+RELU, FULLY_CONNECTED, SOFTMAX) with seeded Glorot-uniform weights,
the starting point a user would get from an untrained export.

    python datasets/digits/make.py
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from host_tools.circle_build import CircleBuilder  # noqa: E402


def glorot(rng, n_out, n_in):
    lim = np.sqrt(6.0 / (n_in + n_out))
    return rng.uniform(-lim, lim, size=(n_out, n_in)).astype(np.float32)


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


def write_ready(x, y):
    """train.ds / test.ds as `prepare --test-split 0.2` splits them, stored as uint8."""
    from host_tools import dataset as ds
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
    print('wrote digits.npz and digits_mlp.circle')


if __name__ == '__main__':
    main()
