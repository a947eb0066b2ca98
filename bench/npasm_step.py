# Runs on the emulated Pico in a prepared float run folder (bench/kernels.py --float; the
# digits MLP, SGD batch 1) plus bench.json (bench/step.py's).  Prints
#   NPASM <1: utrain.npasm's kernels installed (the RP2040), else 0>
#   FKERN <name> <MACs> <cycles, npasm> <cycles, own>   one call of each kernel on dense
#         data (no zeros to skip) and of the backend's own operation (ulab's arithmetic,
#         or the fallback's native loops) on the same shapes
#   STEP <mode> <cycles per training step>   mode 'on' (npasm's kernels) and 'off' (xnp's
#         own functions), alternated in the same run; 'one' without npasm
#   DIGEST <mode> <sha256 of the weights after the same steps from the same start>
import gc
import json
from time import ticks_us, ticks_diff
from step import setup
import sys
from utrain import xnp
from utrain.xnp import np, BACKEND
npasm = sys.modules.get('utrain.npasm')         # installed by xnp (the RP2040)
if npasm is not None and not npasm._F:
    npasm = None
try:
    from hashlib import sha256
except ImportError:
    sha256 = None

print('NPASM %d' % (npasm is not None))


def cycles(f, n=2):
    f()             # (also the warm-up)
    gc.collect()
    t0 = ticks_us()
    for i in range(n):
        f()
    return ticks_diff(ticks_us(), t0) * 125 // n


def kernels():
    def full(shape, v):
        a = np.zeros(shape)
        a += v
        return a
    x, w = full((1, 64), 0.5), full((32, 64), 0.25)
    dz, w2 = full((1, 10), 0.5), full((10, 32), 0.25)
    u = full((1, 32), -0.001)
    a1, b1 = full((1, 2048), 0.5), full((2048, 1), 0.25)   # one long sum: the bare loop
    K = npasm._F
    rows = (('matmul_fwd_1x64x32', 2048, lambda: xnp.matmul(x, w, 1),
             lambda: K['matmul'](x, w, 1)),
            ('matmul_dx_1x10x32', 320, lambda: xnp.matmul(dz, w2),
             lambda: K['matmul'](dz, w2)),
            ('add_outer_32x64', 2048, lambda: xnp.add_outer(w, u, x),
             lambda: K['add_outer'](w, u, x)),
            ('add_scaled_32', 32, lambda: xnp.add_scaled(u, u, -0.01),
             lambda: K['add_scaled'](u, u, -0.01)),
            ('dot_1x2048x1', 2048, lambda: xnp.matmul(a1, b1), lambda: K['matmul'](a1, b1)),
            ('call_overhead', 0, lambda: None, lambda: None))
    for name, macs, fa, fu in rows:
        print('FKERN %s %d %d %d' % (name, macs, cycles(fa), cycles(fu)))


def digest(net):
    h = sha256()
    for k in net.trainable:
        h.update(net.t[k].tobytes() if BACKEND == 'ulab' else bytes(net.t[k]._d))
    return ''.join('%02x' % b for b in h.digest()[:8])


def main():
    cfg = json.load(open('bench.json'))
    timed = cfg.get('rounds', 2)     # 0: the digests only (tests/training/test_npasm.py)
    if npasm is not None and timed:
        kernels()
    steps, limit, tr = setup('.', cfg, True)
    n = cfg.get('steps', 4)
    modes = ('on', 'off') if npasm is not None else ('one',)
    for m in modes:                 # the same steps from the same weights, each way
        if npasm is not None:
            npasm.ON = m == 'on'
        tr.net.load_weights('weights.wof')
        steps(n, 0)
        if sha256:
            print('DIGEST %s %s' % (m, digest(tr.net)))
    tot = {}
    for r in range(timed):
        for m in modes:
            if npasm is not None:
                npasm.ON = m == 'on'
            gc.collect()
            t0 = ticks_us()
            steps(n, r * n)
            tot[m] = tot.get(m, 0) + ticks_diff(ticks_us(), t0)
    for m in tot:
        print('STEP %s %d' % (m, tot[m] * 125 // (n * timed)))
    if npasm is not None:
        npasm.ON = True


main()
