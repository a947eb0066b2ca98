# The float32 kernels of utrain.npasm (the RP2040's Thumb assembler over its bootrom float
# routines) on cases built from random float32 bit patterns (zeros of both signs among
# them), printed as `CASE <name> <impl> <digest>` lines:
#   under CPython: impl 'ref', the kernels' contract written out: every product and sum
#     rounded to float32 (numpy float32 scalars), a sum from +0.0 term by term, an update
#     w + x*u element by element, no term skipped;
#   under MicroPython (ulab's arrays, or the fallback's without ulab): impl 'own', the
#     backend's own arithmetic (utrain.xnp's matmul / add_outer / add_scaled with npasm
#     off: ulab's np.dot and row-by-row `row += v * u[j]`, `y += x * s`; npfallback's
#     dot, _add_outer, _add_scaled), and impl 'xnp', the same calls with npasm's kernels
#     where xnp installed them (the line `NPASM 1` says so; `KERNEL <name> 1`: the kernels
#     took the case, 0: they handed it to xnp's own function).
# Weights updated in place hold no -0.0 (npasm keeps a -0.0 weight that a +0 update would
# make +0.0) and no case holds an inf or NaN (the bootrom's routines and the firmware's
# wrappers of them differ there).
import sys
from array import array

try:
    import numpy as np
    IMPL = 'ref'
except ImportError:
    from utrain.xnp import np
    IMPL = 'own'
try:
    from hashlib import sha256
except ImportError:
    from uhashlib import sha256
from binascii import hexlify

_seed = [12345]


def _rand():
    _seed[0] = (_seed[0] * 1103515245 + 12345) & 0x7FFFFFFF
    return _seed[0]


def floats(n, zeros=4, neg_zero=True):
    """n float32 values as array('f'): random mantissas, exponents 2^-7..2^7, random signs;
    about one in `zeros` is +0.0 (or -0.0)."""
    w = array('I', bytes(4 * n))
    for i in range(n):
        r = _rand()
        if zeros and r % zeros == 0:
            w[i] = 0x80000000 if neg_zero and r & 0x100 else 0
        else:
            e = 120 + (r >> 8) % 15
            w[i] = ((r >> 24) & 1) << 31 | e << 23 | (_rand() & 0x7FFFFF)
    return array('f', bytes(w))


def arr(v, shape):
    # a fresh float32 array of v's values (no list of boxed floats: a board's heap is small)
    if IMPL == 'ref':
        return np.frombuffer(bytes(v), dtype=np.float32).copy().reshape(shape)
    return np.frombuffer(bytearray(v), dtype=np.float).reshape(shape)


def digest(a):
    b = a.astype(np.float32).tobytes() if IMPL == 'ref' else a.tobytes()
    return hexlify(sha256(bytes(b)).digest()[:8]).decode()


# reference (CPython): the contract, one float32 operation at a time
def ref_matmul(a, b, bt):
    f = np.float32
    b = b.T if bt else b
    R, K = a.shape
    J = b.shape[1]
    y = np.zeros((R, J), np.float32)
    for r in range(R):
        for j in range(J):
            s = f(0.0)
            for k in range(K):
                s = f(s + f(a[r, k] * b[k, j]))
            y[r, j] = s
    return y


def ref_outer(w, u, v):
    f = np.float32
    for j in range(w.shape[0]):
        for i in range(w.shape[1]):
            w[j, i] = f(w[j, i] + f(v[0, i] * u[0, j]))


def ref_scaled(y, x, s):
    f = np.float32
    yf, xf = y.reshape(-1), x.reshape(-1)
    for i in range(yf.size):
        yf[i] = f(yf[i] + f(xf[i] * f(s)))


S = array('f', bytes(array('I', [0xBC23D70A])))[0]        # about -0.01, the same float32 everywhere
MATMUL = [('fwd_1x64x32', (1, 64), (32, 64), 1), ('fwd_3x20x7', (3, 20), (7, 20), 1),
          ('fwd_1x1x1', (1, 1), (1, 1), 1), ('dx_1x10x32', (1, 10), (10, 32), 0),
          ('dx_2x5x9', (2, 5), (5, 9), 0)]
OUTER = [('outer_32x64', 32, 64), ('outer_10x32', 10, 32), ('outer_3x1', 3, 1)]
SCALED = [('scaled_1x32', (1, 32)), ('scaled_4x8', (4, 8))]


def main():
    out = []
    if IMPL == 'own':
        from utrain import xnp
        import sys as _s
        K = _s.modules.get('utrain.npasm')
        out.append('NPASM %d' % (K is not None and xnp.matmul is K.__dict__.get(
            'matmul' if xnp.BACKEND == 'ulab' else 'fmatmul')))

        def each(f, name):      # [(impl, result of f())]: npasm off ('own'), then on
            r = []
            for impl in ('own', 'xnp'):
                if K is None:
                    r.append((impl, f()))
                    continue
                K.ON = impl == 'xnp'
                fell, own = [0], dict(K._F)     # did the kernels hand it back to xnp's own?

                def spy(g):
                    def h(*a):
                        fell[0] = 1
                        return g(*a)
                    return h
                for k in ('matmul', 'add_outer', 'add_scaled'):
                    K._F[k] = spy(own[k])
                r.append((impl, f()))
                K._F.update(own)
                if impl == 'xnp':
                    out.append('KERNEL %s %d' % (name, 1 - fell[0]))
            return r
    for name, sa, sb, bt in MATMUL:
        a = arr(floats(sa[0] * sa[1]), sa)
        b = arr(floats(sb[0] * sb[1]), sb)
        if IMPL == 'ref':
            out.append('CASE %s ref %s' % (name, digest(ref_matmul(a, b, bt))))
            # a strided view (the kernels decline it): the same numbers
            out.append('CASE %s_T ref %s' % (name, digest(ref_matmul(a, b, bt))))
            continue
        bT = b.transpose()
        for impl, y in each(lambda: xnp.matmul(a, b, bt), name):
            out.append('CASE %s %s %s' % (name, impl, digest(y)))
        for impl, y in each(lambda: xnp.matmul(a, bT, 1 - bt), name + '_T'):
            out.append('CASE %s_T %s %s' % (name, impl, digest(y)))
    for name, J, n in OUTER:
        w0 = floats(J * n, zeros=8, neg_zero=False)
        u, v = arr(floats(J), (1, J)), arr(floats(n), (1, n))
        if IMPL == 'ref':
            w = arr(w0, (J, n))
            ref_outer(w, u, v)
            out.append('CASE %s ref %s' % (name, digest(w)))
            continue

        def outer():
            w = arr(w0, (J, n))
            xnp.add_outer(w, u, v)
            return w
        for impl, w in each(outer, name):
            out.append('CASE %s %s %s' % (name, impl, digest(w)))
    for name, shape in SCALED:
        y0 = floats(shape[0] * shape[1], zeros=8, neg_zero=False)
        x = arr(floats(shape[0] * shape[1]), shape)
        if IMPL == 'ref':
            y = arr(y0, shape)
            ref_scaled(y, x, S)
            out.append('CASE %s ref %s' % (name, digest(y)))
            continue

        def scaled():
            y = arr(y0, shape)
            xnp.add_scaled(y, x, S)
            return y
        for impl, y in each(scaled, name):
            out.append('CASE %s %s %s' % (name, impl, digest(y)))
    for line in out:
        print(line)
    print('DONE', sys.implementation.name)


main()
