# Runs inside the measured interpreter (unix MicroPython, or CPython + numpy when the
# bench imports it), on a folder made by `prepare` plus bench.json.  setup() gives two
# callables doing n units of work each: utrain's training step (forward, backward,
# SGD update: batch 1) and the interpreter's own limit for the same multiply-adds, a
# bare loop accumulating a*b over array('f') (MicroPython) or np.dot on the same GEMM
# sizes (numpy).  Run as a script it alternates them in rounds (same machine load),
# keeps the best round of each and prints: RESULT <step us> <limit us> <steps/round>
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


def bare_loop(loops, bufs):
    # loops: [(K, reps)]: reps dot products of length K, the plainest MicroPython loop
    for K, reps in loops:
        a, b = bufs[K]
        for r in range(reps):
            s = 0.0
            for t in range(K):
                s += a[t] * b[t]


def setup(folder, cfg):
    tr = Trainer(folder + '/model.flat', folder + '/weights.wof', batch=1, optimizer='sgd')
    ds = Dataset(folder + '/train.ds')
    xs, ys = [], []
    for i in range(ds.n):
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

    if BACKEND == 'numpy':
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
    return steps, limit


def timed(f, n, j=0):
    t0 = ticks_us()
    f(n, j)
    return ticks_diff(ticks_us(), t0)


def main():
    with open('bench.json') as f:
        cfg = json.load(f)
    steps, limit = setup('.', cfg)
    rounds = cfg['rounds']
    one = max(timed(steps, 1), 1)            # also the warm-up
    n = max(1, min(cfg['max_steps'], int(cfg['budget_us'] / rounds / 2 / one)))
    best_s = best_l = None
    for r in range(rounds):
        ts = timed(steps, n, 1 + r * n)
        tl = timed(limit, n)
        best_s = ts if best_s is None or ts < best_s else best_s
        best_l = tl if best_l is None or tl < best_l else best_l
    print('RESULT %.3f %.3f %d' % (best_s / n, best_l / n, n))


if __name__ == '__main__':
    main()
