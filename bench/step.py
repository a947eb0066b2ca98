# Runs inside the measured interpreter (unix MicroPython, or CPython + numpy when the
# bench imports it), on a folder made by `prepare` plus bench.json.  setup() gives two
# callables doing n units of work each: utrain's training step (forward, backward,
# SGD update: batch 1) and the interpreter's own limit for the same multiply-adds, a
# bare loop accumulating a*b over array('f') (MicroPython without ulab) or the array
# library's dot on the same GEMM sizes (np.dot under CPython + numpy, ulab.numpy.dot
# under a MicroPython built with ulab).  Run as a script it alternates them in short rounds (same machine
# load), sums their CPU time and prints: RESULT <step us> <limit us> <step/limit> <n>
import json
from array import array
from utrain.trainer import Trainer
from utrain.data import Dataset
from utrain.xnp import np, zeros, BACKEND

try:
    from time import ticks_us, ticks_diff
except ImportError:
    from time import perf_counter

    def ticks_us():
        return int(perf_counter() * 1e6)

    def ticks_diff(a, b):
        return a - b


def cpu_us():
    # CPU time of this process (Linux schedstat, ns; tick-granular but unbiased, and
    # blind to the time other processes take the core), else wall-clock time
    try:
        f = open('/proc/self/schedstat')
        v = int(f.read().split()[0]) // 1000
        f.close()
        return v
    except (OSError, ValueError, IndexError):
        return ticks_us()


def bare_loop(loops, bufs):
    # loops: [(K, reps)]: reps dot products of length K, the plainest MicroPython loop
    for K, reps in loops:
        a, b = bufs[K]
        for r in range(reps):
            s = 0.0
            for t in range(K):
                s += a[t] * b[t]


def setup(folder, cfg, trainer=False):
    tr = Trainer(folder + '/model.flat', folder + '/weights.wof', batch=1, optimizer='sgd')
    ds = Dataset(folder + '/train.ds')
    xs, ys = [], []
    for i in range(min(ds.n, cfg.get('max_samples', ds.n))):   # a board holds a few
        x, y = zeros(tr.x_shape), zeros(tr.y_shape)
        ds.read(i, x, y)
        xs.append(x)
        ys.append(y)
    ds.close()
    net = tr.net

    def steps(n, j):
        for i in range(n):
            k = (j + i) % len(xs)
            net.set_input(xs[k])
            tr.target = ys[k]
            tr.train_step()

    if BACKEND in ('numpy', 'ulab'):
        arrs = [(zeros((m, k)) + 0.5, zeros((k, n)) + 0.25) for m, k, n in cfg['gemms']]
        dot = np.dot

        def limit(n, j):
            for i in range(n):
                for a, b in arrs:
                    dot(a, b)
    else:
        bufs = {}
        for K, reps in cfg['loops']:
            bufs[K] = (array('f', [0.5] * K), array('f', [0.25] * K))
        loops = cfg['loops']

        def limit(n, j):
            for i in range(n):
                bare_loop(loops, bufs)
    return (steps, limit, tr) if trainer else (steps, limit)


def timed(f, n, j=0, clock=ticks_us):
    t0 = clock()
    f(n, j)
    return ticks_diff(clock(), t0)


def main():
    with open('bench.json') as f:
        cfg = json.load(f)
    steps, limit = setup('.', cfg)
    one = max(timed(steps, 1), 1)            # also the warm-up
    # many short rounds, each n steps then the limit n times, so both see the same
    # machine; CPU time summed over all rounds
    n = max(1, min(cfg['max_steps'], int(cfg['round_us'] / 2 / one)))
    rounds = max(cfg['rounds'], min(500, int(cfg['budget_us'] / 2 / (n * one))))
    ts = tl = 0
    for r in range(rounds):
        ts += timed(steps, n, 1 + r * n, cpu_us)
        tl += timed(limit, n, 0, cpu_us)
    print('RESULT %.3f %.3f %.4f %d' % (ts / n / rounds, tl / n / rounds, ts / max(tl, 1), n))


if __name__ == '__main__':
    main()
