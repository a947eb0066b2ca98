# The one module through which utrain does array math.
# Real ulab (2-D, float32 on boards) when the firmware has it; numpy under CPython
# (the host simulation); otherwise utrain.npfallback, a pure-MicroPython copy of
# exactly the ulab subset utrain uses.  Kernels use only that subset:
#   zeros full array dot exp log sqrt tanh maximum minimum clip where sum mean max
#   min argmax, + - * / (and in-place), comparisons, abs, slicing views, .T,
#   reshape, copy, tolist, shape.
# In-place arithmetic on arrays is limited to += and -= (and slice assignment):
# MicroPython calls __iadd__/__isub__ of a Python class (MICROPY_PY_ALL_SPECIAL_METHODS,
# on in ESP32/RP2040/unix builds) but not __imul__/__itruediv__, so with the fallback
# `a *= s` would silently rebind `a` to a new array instead of updating it.
# Besides it, this module adds the float32 file I/O kernels never do themselves.
try:
    from micropython import const      # kernels name the op contract with private consts
except ImportError:
    def const(x):
        return x
try:
    from ulab import numpy as np
    BACKEND = 'ulab'
    FLOAT = np.float
except ImportError:
    np = None
    try:
        from os import getenv
        _want = getenv('UTRAIN_NP')
    except ImportError:
        _want = None
    if _want != 'fallback':
        try:
            import numpy as np
        except ImportError:
            np = None
    if np is None:
        from utrain import npfallback as np
        BACKEND = 'fallback'
        FLOAT = np.float
        _a = _b = np.zeros(1)
        _b += 1.0
        if _a[0] != 1.0:
            raise ImportError('utrain: this MicroPython lacks __iadd__ (MICROPY_PY_ALL_SPECIAL_METHODS)')
    else:
        BACKEND = 'numpy'
        FLOAT = np.float64 if _want == 'float64' else np.float32
from array import array

# bytes per element of a float array in this backend
if BACKEND == 'numpy':
    FSIZE = np.dtype(FLOAT).itemsize
elif BACKEND == 'ulab':
    FSIZE = np.zeros(1).itemsize
else:
    FSIZE = 4


# Fused in-place updates, the hot loops of a training step.  The fallback does each in
# one pass without temporaries; numpy and ulab use their own arithmetic, ulab one row
# at a time so a temporary is never weight-sized on a board's heap.
# conv_steps(kind, out, p, q, o, walk, sw, spread): op_conv's walk(o) (stride sw) done in one call
# (see npfallback._conv_steps), by the fallback's native loops or by numpy in one gather;
# None under ulab: op_conv then loads utrain.ulconv (a few array calls per kernel tap);
# maxpool_steps(o, walk, sw, y, x[, dx, rem]): op_pool's max-pool walk in one call (the
# fallback's native loops, numpy's one gather).  None where a backend has none.
# ROWWISE: optimizer steps go a weight row at a time (a board's temporaries stay one row
# long); the host (numpy) steps whole arrays, the same arithmetic per element.
conv_steps = maxpool_steps = None
ROWWISE = BACKEND != 'numpy'
if BACKEND == 'fallback':
    add_scaled = np._add_scaled
    add_outer = np._add_outer

    def maxpool_steps(o, walk, sw, y, x, dx=None, rem=None):
        return np._maxpool_steps(walk(o), sw, y, x, dx, rem)

    def conv_steps(kind, out, p, q, o, walk, sw, spread):
        return np._conv_steps(kind, out, p, q, walk(o), sw)
elif BACKEND == 'numpy':
    from utrain.xnumpy import add_scaled, add_outer, conv_steps, maxpool_steps
else:
    def add_scaled(y, x, s):
        if len(y.shape) == 2 and y.shape[0] > 1:
            for i in range(y.shape[0]):
                r = y[i]
                r += x[i] * s
        else:
            y += x * s

    def add_outer(a, u, v):
        u = u[0] if len(u.shape) == 2 else u
        v = v[0] if len(v.shape) == 2 else v
        for j in range(a.shape[0]):
            row = a[j]
            row += v * u[j]


def zeros(shape):
    return np.zeros(shape, dtype=FLOAT)


def matmul(a, b, bt=0):
    # a . b of 2-D arrays (a . b^T when bt: an FC's weight as it is stored)
    return np.dot(a, b.T if bt else b)


from sys import platform as _pf
if BACKEND != 'numpy' and _pf == 'rp2':
    try:        # the RP2040: matmul and the fused updates in Thumb assembler (npasm)
        from utrain.npasm import install
        install(globals())
    except (ImportError, SyntaxError):     # (an RP2350; a port without asm_thumb)
        pass


def buffer(n):
    """Storage for up to n floats, for view(); reused by streamed constants."""
    if BACKEND == 'fallback':
        return np.zeros(n)._d
    return bytearray(FSIZE * n)


def view(buf, shape):
    """A float array of shape over the start of buffer(n) storage (no copy)."""
    n = shape[0] * shape[1]
    if BACKEND == 'fallback':
        return np.ndarray(buf, shape, (shape[1], 1), 0, FLOAT)
    return np.frombuffer(buf, dtype=FLOAT, count=n).reshape(shape)


def _raw(a):
    # writable buffer over a's float32 storage, or None when a needs conversion
    if FSIZE != 4:
        return None
    if BACKEND == 'numpy':
        return memoryview(a).cast('B')
    if BACKEND == 'ulab':
        return a.tobytes()          # ulab: shares memory with the array
    d, o, n = a._d, a._o, a.size
    if o == 0 and len(d) == n:
        return d
    if len(a.shape) == 2 and a.strides == (a.shape[1], 1):   # dense, in a larger storage
        return memoryview(d)[o:o + n]
    return None


def readinto(f, a, name='file'):
    """Fill the contiguous float array a from little-endian float32 bytes of f."""
    raw = _raw(a)
    n = a.size
    if raw is not None:
        got = f.readinto(raw)
        if got != 4 * n:
            raise ValueError('%s: truncated (wanted %d bytes, got %d)' % (name, 4 * n, got or 0))
        return a
    # conversion path (float64 numpy or a float64 ulab build): 64 values at a time
    flat = a.reshape((n,))
    buf = array('f', bytes(256))
    i = 0
    while i < n:
        k = min(64, n - i)
        mv = memoryview(buf)[:k] if k < 64 else buf
        got = f.readinto(mv)
        if got != 4 * k:
            raise ValueError('%s: truncated' % name)
        for j in range(k):
            flat[i + j] = buf[j]
        i += k
    return a


def decode(q, a, s, o):
    """Fill the contiguous float array a with q * s + o, q an array('B') or
    array('b') of a.size quantized values (no temporaries on the device)."""
    if BACKEND == 'numpy':
        a.reshape(-1)[:] = np.asarray(q) * s + o
        return a
    d = a._d if BACKEND == 'fallback' and a._o == 0 and len(a._d) == a.size else a.reshape((a.size,))
    for j in range(len(q)):
        d[j] = q[j] * s + o
    return a


def write(f, a):
    """Write the float array a to f as little-endian float32 bytes."""
    if FSIZE == 4 and BACKEND != 'numpy':
        if BACKEND == 'ulab':
            f.write(a.tobytes())
        else:
            c = a if (a._o == 0 and len(a._d) == a.size) else a.copy()
            f.write(c._d)
        return
    if BACKEND == 'numpy':
        f.write(np.ascontiguousarray(a, dtype='<f4').tobytes())
        return
    flat = a.flatten()
    n = flat.size
    i = 0
    while i < n:
        k = min(64, n - i)
        f.write(array('f', [flat[i + j] for j in range(k)]))
        i += k


def as2d(x, shape):
    """x (an array, list or tuple of numbers) as a float array of the 2-D shape."""
    if not isinstance(x, (list, tuple)):
        if x.shape == shape:
            return x
        return x.reshape(shape)
    a = np.array(x, dtype=FLOAT)
    if len(a.shape) != 2 or a.shape != shape:
        a = a.reshape(shape)
    return a


def big_first(ks, shape):
    """Tensor indices ks, the largest array first (allocate those while the heap has
    long free runs)."""
    return sorted(ks, key=lambda k: -shape[k][0] * shape[k][1])
