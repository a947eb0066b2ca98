"""Personalise an activity model on the board from windows the board recorded itself.

A watch's activity classifier (still, walk, run, stairs up, stairs down: 48 steps of
3-axis accelerometer at 25 Hz) was trained at the factory on people wearing it on the
right wrist.  This user wears it on the other wrist, turned round: gravity and the arm
swing fall on other axes and the factory model gets most windows wrong.  On the board,
the user holds a button for the activity they are doing; each window recorded meanwhile
is saved with that label by utrain.collect.Recorder (the data never leaves the board),
and utrain trains the model on them.  The windows are bench/imu_data.py's synthetic
ones (made from each activity's physics; docs/example-activity.md).

    python examples/activity.py [--fast] [--board rp2040]
"""
import os

import numpy as np

from common import args, train, export, evaluate, before_after, ROOT  # noqa: F401
from bench import imu_data
from host_tools.formats import refmodels
from host_tools.target import device
from host_tools.files import dataset as ds

CLASSES = imu_data.CLASSES[:5]
X_LEN = 3 * imu_data.L                       # accelerometer xyz, 48 steps


def accel(x):
    """The accelerometer's three axes of generate()'s 6-axis windows, one sample a row."""
    return np.ascontiguousarray(x[:, :3, :]).reshape(len(x), X_LEN).astype(np.float32)


def record_on_board(path, x, y, presses):
    """What the board does: each button press labels the windows recorded while it is
    held (Recorder: int8 at 4 g / 127, a quarter of float32's flash)."""
    Recorder = device.module('collect').Recorder        # the board's own code
    r = Recorder(path, X_LEN, 1, dtype=2, scale=imu_data.CLIP / 127)
    for label, rows in presses:
        for i in rows:
            assert y[i] == label
            r.add(x[i].tolist(), label)
    n = r.close() or r.n
    return n


def main():
    a = args(__doc__, 'activity')
    n_pop, n_user, epochs = (600, 150, 6) if a.fast else (2000, 300, 15)

    # the factory: an MLP trained on many people's windows (right wrist)
    x, y = imu_data.generate(n_pop, seed=1, classes=len(CLASSES))
    np.savez(os.path.join(a.out, 'population.npz'), x=accel(x), y=y)
    model = refmodels.mlp(os.path.join(a.out, 'activity.circle'), [X_LEN, 32, len(CLASSES)])
    print(f'== factory: train an MLP {X_LEN}-32-{len(CLASSES)} on {n_pop} windows (right wrist)')
    wof = train(model, os.path.join(a.out, 'factory'), a, data=os.path.join(a.out, 'population.npz'),
                test_split=0.2, loss='scce', optimizer='adam', lr=0.005, batch=4, epochs=epochs,
                shuffle=True, seed=0, host=True)
    factory = os.path.join(a.out, 'factory.circle')
    export(model, wof, factory)

    # this user: the other wrist; held-out windows to score on, and windows the board records
    ux, uy = imu_data.generate(2 * n_user, seed=2, classes=len(CLASSES))
    ux = accel(imu_data.placement(ux))
    test = os.path.join(a.out, 'user_test.ds')
    ds.write_dataset(test, ux[n_user:], uy[n_user:])
    # button presses: the user does each activity in turn, holding its button
    presses = [(c, np.flatnonzero(uy[:n_user] == c)) for c in range(len(CLASSES))]
    mine = os.path.join(a.out, 'mine.ds')
    if os.path.exists(mine):
        os.remove(mine)
    n = record_on_board(mine, ux, uy, presses)
    print(f'== on the board: {n} windows recorded under {len(presses)} button labels '
          f'({", ".join(CLASSES)})')

    before = evaluate(factory, test)
    wof = train(factory, os.path.join(a.out, 'personal'), a, files={'train': mine, 'test': test},
                loss='scce', optimizer='adam', lr=0.002, batch=4, epochs=epochs, shuffle=True, seed=0)
    personal = os.path.join(a.out, 'personal.circle')
    export(factory, wof, personal)
    before_after(f'this user\'s held-out windows ({len(ux) - n_user})', before, evaluate(personal, test))


if __name__ == '__main__':
    main()
