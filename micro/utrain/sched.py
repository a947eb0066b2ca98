# Learning-rate schedules (docs/training.md), imported only by runs that set one.
# A schedule is a tuple (kind: a SCHEDULES index, warmup, total, step_size, gamma,
# floor, its checkpoint block): update t (1, 2, ...) uses lr * factor(t, sched).  Warm-up: update s = t-1 < warmup
# takes (s+1)/(warmup+1) (PyTorch's LinearLR from 1/(warmup+1)); after it, u = s - warmup:
# constant 1; linear 1 + (floor-1) u/(total-warmup); step gamma^(u // step_size); cosine
# floor + (1-floor)(1+cos(pi u/(total-warmup)))/2; linear and cosine stay at floor from
# total on (prepare sets total to the run's updates, epochs x updates an epoch, unless
# told otherwise).  The checkpoint keeps the tuple (utrain/wof.py).
from math import cos, pi
from struct import pack, unpack, calcsize

SCHEDULES = ('constant', 'linear', 'step', 'cosine')
BLOCK = '<4sHBBIIIdd'   # the checkpoint's UTLR block: version 1, kind, 0, then as sched


def of(c):
    """The schedule of settings c (train.json's), or None for a constant rate."""
    if c['schedule'] == 'constant' and not c['warmup']:
        return None
    if c['schedule'] in ('linear', 'cosine') and c['schedule_steps'] <= c['warmup']:
        raise ValueError('a %s schedule needs schedule_steps (the update its decay ends at) '
                         'above warmup' % c['schedule'])
    sc = (SCHEDULES.index(c['schedule']), c['warmup'], c['schedule_steps'], c['step_size'],
          c['gamma'], c['min_lr'])
    return sc + (pack(BLOCK, b'UTLR', 1, sc[0], 0, *sc[1:]),)


def factor(t, sched):
    kind, warmup, total, step_size, gamma, floor, _ = sched
    s = t - 1
    if s < warmup:
        return (s + 1) / (warmup + 1)
    if not kind:
        return 1.0
    u = s - warmup
    if kind == 2:
        return gamma ** (u // step_size)
    d = total - warmup
    if u >= d:
        return floor
    if kind == 3:
        return floor + (1.0 - floor) * (1.0 + cos(pi * u / d)) / 2
    return 1.0 + (floor - 1.0) * u / d


def unblock(extra, n, path):
    """(schedule, extra without it) for the UTLR block at extra[n:]."""
    k = calcsize(BLOCK)
    if len(extra) < n + k or extra[n + 4:n + 6] != pack('<H', 1):
        raise ValueError('%s: unknown schedule block' % path)
    b = unpack(BLOCK, extra[n:n + k])
    return (b[2],) + b[4:] + (extra[n:n + k],), extra[:n] + extra[n + k:]
