"""Teach an image classifier classes it never saw, from a few examples each.

The classifier is a small PyTorch CNN converted with tico (datasets/digits/make_tico.py:
conv + BatchNorm, depthwise conv, classifier; ten outputs), trained at the factory on
the digits 0-5 only, of the 8x8 digit images scikit-learn bundles (datasets/digits/
digits.npz).  The user wants 6-9 recognised too and has a few labelled images of each
digit.  The frozen conv + BatchNorm stays as it is (prepare folds the BatchNorm into
it); the depthwise conv and the classifier train on the board (docs/example-new-classes.md).

    python examples/new_classes.py [--fast] [--board rp2040]
"""
import os

import numpy as np

from common import args, train, export, evaluate, before_after, ROOT
from host_tools.formats.circle_io import read_model

MODEL = os.path.join(ROOT, 'datasets', 'digits', 'digits_tico_cnn.circle')
DIGITS = os.path.join(ROOT, 'datasets', 'digits', 'digits.npz')


def main():
    a = args(__doc__, 'new_classes')
    per_class, epochs = (10, 3) if a.fast else (25, 6)
    z = np.load(DIGITS)
    x, y = z['x'].reshape(-1, 1, 8, 8).astype(np.float32), z['y'].astype(int)   # NCHW, as PyTorch
    rng = np.random.default_rng(0)
    # a few labelled images of every digit (the new ones and, so they are not forgotten,
    # the old ones); everything else is held out
    shots = np.concatenate([rng.choice(np.flatnonzero(y == c), per_class, replace=False)
                            for c in range(10)])
    held = np.setdiff1d(np.arange(len(y)), shots)
    np.savez(os.path.join(a.out, 'shots.npz'), x=x[shots], y=y[shots])
    test = os.path.join(a.out, 'held_out.npz')
    np.savez(test, x=x[held], y=y[held])
    new = os.path.join(a.out, 'held_out_new.npz')
    np.savez(new, x=x[held][y[held] >= 6], y=y[held][y[held] >= 6])

    before, before_new = evaluate(MODEL, test), evaluate(MODEL, new)
    ops = [op.name for op in read_model(MODEL).ops]
    first = ops.index('DEPTHWISE_CONV_2D')          # it and everything after it train
    print(f'== on the board: train the depthwise conv and the classifier on {len(shots)} '
          f'images ({per_class} a digit)')
    wof = train(MODEL, os.path.join(a.out, 'cnn'), a, data=os.path.join(a.out, 'shots.npz'),
                loss='scce', from_logits=True, optimizer='adam', lr=0.005, batch=4,
                epochs=epochs, train=f'last:{len(ops) - first}', shuffle=True, seed=0)
    tuned = os.path.join(a.out, 'digits_all.circle')
    export(MODEL, wof, tuned)
    before_after(f'held-out images, all digits ({len(held)})', before, evaluate(tuned, test))
    before_after('held-out images of the new digits 6-9', before_new, evaluate(tuned, new))


if __name__ == '__main__':
    main()
