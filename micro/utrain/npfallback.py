# Pure-Python stand-in for the subset of ulab.numpy used by utrain, for firmware
# without ulab.  Follows ulab built with ULAB_MAX_DIMS=2 and float32; runs unchanged
# on MicroPython and CPython.  An array is (storage, offset, shape, strides), so
# slices, .T and reshape of a dense array are views.  Deviations from ulab:
#  - dtypes are typecodes: float="f", bool=uint8="B" (one dtype); argmax(axis=)
#    gives an int16 ("h") array as ulab does.
#  - bool OP bool (+ - *) gives "B" (uint8 wrap-around); all other arithmetic,
#    unary -, abs() and where() give float arrays.
#  - reductions and 1-D dot return unrounded Python floats; frombuffer() copies.
#  - MicroPython needs MICROPY_PY_REVERSE_SPECIAL_METHODS for 2 * a and never
#    reflects comparisons: write a > 0, not 0 < a.
from array import array as _A
import math

_pf = float
_mx = max
_mn = min
_abs = abs

float = "f"
bool = "B"
uint8 = "B"
_SZ = {"f": 4, "B": 1, "h": 2}
_INF = _pf("inf")
_NAN = _pf("nan")
_E2 = "maximum number of dimensions is 2"
_EB = "operands could not be broadcast together"


def _new(t, n):
    # storage for n items, contents undefined.  array(t, bytearray) is fastest but
    # holds a second n-item buffer; array("f", range(n)) is sized once, so a big
    # result never needs two blocks at once on a small, fragmented heap
    if t == "f" and n > 64:
        return _A("f", range(n))
    return _A(t, bytearray(n * _SZ[t]))


def _cs(sh):
    return (sh[1], 1) if len(sh) == 2 else (1,)


def _shp(s):
    s = (s,) if isinstance(s, int) else tuple(s)
    if len(s) > 2:
        raise ValueError(_E2)
    return s


def _num(sh):
    return sh[0] * sh[1] if len(sh) == 2 else sh[0]


def _rc(a):
    # any array as 2-D: rows, cols, row stride, col stride
    s, t = a.shape, a.strides
    return (1, s[0], 0, t[0]) if len(s) == 1 else (s[0], s[1], t[0], t[1])


def _flat(sr, sc, R, C):
    # stride (1 or 0) walking all R*C elements in one pass, else None
    if (sc == 1 or C == 1) and (sr == C or R == 1):
        return 1
    if (sc == 0 or C == 1) and (sr == 0 or R == 1):
        return 0


def _dense(a):
    r, c, sr, sc = _rc(a)
    return _flat(sr, sc, r, c) == 1


def _sl(k, n):
    # slice -> start, count, step
    st = 1 if k.step is None else k.step
    if st == 0:
        raise ValueError("slice step cannot be zero")
    lo, hi = (0, n) if st > 0 else (-1, n - 1)
    b, e = k.start, k.stop
    b = (lo if st > 0 else hi) if b is None else (_mx(b + n, lo) if b < 0 else _mn(b, hi))
    e = (hi if st > 0 else lo) if e is None else (_mx(e + n, lo) if e < 0 else _mn(e, hi))
    c = (e - b + st - 1) // st if st > 0 else (b - e - st - 1) // -st
    return b, _mx(c, 0), st


def _key(a, k):
    # index key -> storage offset, shape, strides (shape () means one element)
    k = k if isinstance(k, tuple) else (k,)
    s, t = a.shape, a.strides
    if len(k) > len(s):
        raise IndexError("too many indices")
    o, sh, st = a._o, [], []
    for i in range(len(s)):
        x = k[i] if i < len(k) else None
        if x is None:
            sh.append(s[i])
            st.append(t[i])
        elif isinstance(x, int):
            x += s[i] if x < 0 else 0
            if not 0 <= x < s[i]:
                raise IndexError("index is out of bounds")
            o += x * t[i]
        else:
            b, c, e = _sl(x, s[i])
            o += b * t[i]
            sh.append(c)
            st.append(e * t[i])
    return o, tuple(sh), tuple(st)


class ndarray:
    __slots__ = ("_d", "_o", "shape", "strides", "dtype")

    def __init__(self, d, shape=None, strides=None, o=0, dtype=float):
        if shape is None:  # ndarray(obj) acts as array(obj)
            a = array(d, dtype)
            d, shape, strides = a._d, a.shape, a.strides
        self._d, self._o, self.shape, self.strides, self.dtype = d, o, shape, strides, dtype

    size = property(lambda s: _num(s.shape))
    itemsize = property(lambda s: _SZ[s.dtype])
    T = property(lambda s: s.transpose())
    __len__ = lambda s: s.shape[0]
    __repr__ = lambda s: "array(%r, dtype=%s)" % (s.tolist(), s.dtype)

    def transpose(self):
        s, t = self.shape, self.strides
        if len(s) == 2:
            s, t = (s[1], s[0]), (t[1], t[0])
        return ndarray(self._d, s, t, self._o, self.dtype)

    def copy(self):
        if _dense(self):
            d = self._d[self._o : self._o + self.size]
            return ndarray(d, self.shape, _cs(self.shape), 0, self.dtype)
        a = ndarray(_new(self.dtype, self.size), self.shape, _cs(self.shape), 0, self.dtype)
        _put(a, self)
        return a

    def flatten(self):
        a = self.copy()
        a.shape, a.strides = (a.size,), (1,)
        return a

    def reshape(self, shape):
        sh, n = _shp(shape), self.size
        m = -_num(sh)
        if -1 in sh and m:
            sh = tuple(n // m if x == -1 else x for x in sh)
        if _num(sh) != n:
            raise ValueError("cannot reshape array")
        a = self if _dense(self) else self.copy()  # ulab also copies a non-dense array
        return ndarray(a._d, sh, _cs(sh), a._o, a.dtype)

    def tolist(self):
        r, c, sr, sc = _rc(self)
        d, o = self._d, self._o
        l = [[d[o + i * sr + j * sc] for j in range(c)] for i in range(r)]
        return l if len(self.shape) == 2 else l[0]

    def tobytes(self):
        if not _dense(self):
            raise ValueError("tobytes can be invoked for dense arrays only")
        return bytearray(memoryview(self._d)[self._o : self._o + self.size])

    def __iter__(self):
        if len(self.shape) == 2:
            for i in range(self.shape[0]):
                yield self[i]
        else:
            d, o, s = self._d, self._o, self.strides[0]
            for i in range(self.shape[0]):
                yield d[o + i * s]

    def __getitem__(self, k):
        if type(k) is slice:  # x[a:b:c], the conv and pool row runs
            b, c, e = _sl(k, self.shape[0])
            t = self.strides
            if len(t) == 2:
                return ndarray(self._d, (c, self.shape[1]), (e * t[0], t[1]),
                               self._o + b * t[0], self.dtype)
            return ndarray(self._d, (c,), (e * t[0],), self._o + b * t[0], self.dtype)
        o, sh, st = _key(self, k)
        return ndarray(self._d, sh, st, o, self.dtype) if sh else self._d[o]

    def __setitem__(self, k, v):
        o, sh, st = _key(self, k)
        if sh:
            _put(ndarray(self._d, sh, st, o, self.dtype), v)
        else:
            self._d[o] = v if self.dtype == "f" else int(v)

    __add__ = __radd__ = lambda s, o: _op(s, o, _add)
    __sub__ = lambda s, o: _op(s, o, _sub)
    __rsub__ = lambda s, o: _op(o, s, _sub)
    __mul__ = __rmul__ = lambda s, o: _op(s, o, _mul)
    __truediv__ = lambda s, o: _op(s, o, _div, "f")
    __rtruediv__ = lambda s, o: _op(o, s, _div, "f")
    __iadd__ = lambda s, o: _iop(s, o, _add)
    __isub__ = lambda s, o: _iop(s, o, _sub)
    __imul__ = lambda s, o: _iop(s, o, _mul)
    __itruediv__ = lambda s, o: _iop(s, o, _div)
    __gt__ = lambda s, o: _op(s, o, _gt, "B")
    __lt__ = lambda s, o: _op(o, s, _gt, "B")
    __ge__ = lambda s, o: _op(s, o, _ge, "B")
    __le__ = lambda s, o: _op(o, s, _ge, "B")
    __eq__ = lambda s, o: _op(s, o, _eq, "B")
    __neg__ = lambda s: _op(s, -1.0, _mul, "f")
    __abs__ = lambda s: _map(_abs, s)


def _prep(x):
    # operand -> storage, offset, rows, cols, row stride, col stride, ndim, dtype
    if not isinstance(x, ndarray):
        if not isinstance(x, (list, tuple)):
            return _A("f", (x,)), 0, 1, 1, 0, 0, 0, "S"  # scalar, float32 as in ulab
        x = array(x)
    r, c, sr, sc = _rc(x)
    return x._d, x._o, r, c, sr, sc, len(x.shape), x.dtype


def _dim(m, n):
    if m == n or n == 1:
        return m
    if m == 1:
        return n
    raise ValueError(_EB)


def _run(k, O, p, so, R, C, A, a, sra, sca, B, b, srb, scb):
    fa, fb = _flat(sra, sca, R, C), _flat(srb, scb, R, C)
    if fa is not None and fb is not None and (so == C or R == 1):
        k(O, p, A, a, fa, B, b, fb, R * C)
    else:
        for i in range(R):
            k(O, p + i * so, A, a + i * sra, sca, B, b + i * srb, scb, C)


def _op(a, b, k, t=None):
    if type(a) is ndarray and a.dtype == "f" and a.strides == _cs(a.shape):
        # fast path, most calls of a training step: dense float array OP float scalar
        # or OP a dense float array of its shape
        sh = a.shape
        if type(b) is _pf:
            B, ob, sb = _A("f", (b,)), 0, 0
        elif type(b) is ndarray and b.shape == sh and b.dtype == "f" and b.strides == a.strides:
            B, ob, sb = b._d, b._o, 1
        else:
            B = None
        if B is not None:
            n = _num(sh)
            O = _new(t or "f", n)
            k(O, 0, a._d, a._o, 1, B, ob, sb, n)
            return ndarray(O, sh, a.strides, 0, t or "f")
    A, oa, ra, ca, sra, sca, na, ta = _prep(a)
    B, ob, rb, cb, srb, scb, nb, tb = _prep(b)
    R, C = _dim(ra, rb), _dim(ca, cb)
    O = _new(t or "f", R * C)
    sra, sca = (sra if ra == R else 0), (sca if ca == C else 0)
    _run(k, O, 0, C, R, C, A, oa, sra, sca, B, ob, srb if rb == R else 0, scb if cb == C else 0)
    sh = (R, C) if _mx(na, nb) == 2 else (C,)
    if t is None and ta == "B" and tb == "B":
        return ndarray(_A("B", [int(x) & 255 for x in O]), sh, _cs(sh), 0, "B")
    return ndarray(O, sh, _cs(sh), 0, t or "f")


def _iop(a, b, k):
    if a.dtype == "f" and a.strides == _cs(a.shape):  # fast path as in _op
        if type(b) is _pf:
            k(a._d, a._o, a._d, a._o, 1, _A("f", (b,)), 0, 0, _num(a.shape))
            return a
        if (type(b) is ndarray and b.shape == a.shape and b.dtype == "f"
                and b.strides == a.strides and (b._d is not a._d or b is a)):
            k(a._d, a._o, a._d, a._o, 1, b._d, b._o, 1, _num(a.shape))
            return a
    A, oa, ra, ca, sra, sca, na, ta = _prep(a)
    B, ob, rb, cb, srb, scb, nb, tb = _prep(b)
    if _dim(ra, rb) != ra or _dim(ca, cb) != ca:
        raise ValueError(_EB)
    if ta != "f" or (ca > 1 and sca != 1) or (B is A and b is not a):
        _put(a, _op(a, b, k))  # strided row, aliased operands or bool target
    else:
        srb, scb = (srb if rb == ra else 0), (scb if cb == ca else 0)
        _run(k, A, oa, sra, ra, ca, A, oa, sra, 1, B, ob, srb, scb)
    return a


def _put(a, v):
    # copy scalar or array-like v into the view a, broadcasting v to a's shape
    D, o = a._d, a._o
    r, c, sr, sc = _rc(a)
    if isinstance(v, _pf) and a.dtype == "f" and _flat(sr, sc, r, c) == 1:
        _fill(D, o, r * c, v)  # a[:] = 0.0, the per-update gradient reset
        return
    B, ob, rb, cb, srb, scb, nb, tb = _prep(v)
    if _dim(r, rb) != r or _dim(c, cb) != c:
        raise ValueError(_EB)
    if B is D:
        B, ob, rb, cb, srb, scb, nb, tb = _prep(v.copy())
    if a.dtype != "f" and tb in "fS":
        B = _A(a.dtype, [int(x) for x in B])
    srb, scb = (srb if rb == r else 0), (scb if cb == c else 0)
    for i in range(r):
        p, q = o + i * sr, ob + i * srb
        for j in range(c):
            D[p + j * sc] = B[q + j * scb]


def _map(f, a, out=None):
    if not isinstance(a, ndarray):
        if not isinstance(a, (list, tuple)):
            return f(a)
        a = array(a)
    if out is None:
        out = ndarray(_new("f", a.size), a.shape, _cs(a.shape), 0, "f")
    elif out.shape != a.shape or out.dtype != "f" or not _dense(out):
        raise ValueError("out must be a dense float array of the same shape")
    r, c, sr, sc = _rc(a)
    _mapk(f, a._d, a._o, sr, sc, r, c, out._d, out._o)
    return out


def _exp(x):
    return _INF if x > 88.72 else math.exp(x)  # MicroPython raises on overflow


def _log(x):
    return math.log(x) if x > 0 else (-_INF if x == 0 else _NAN)


def _sqrt(x):
    return math.sqrt(x) if x >= 0 else _NAN


def exp(a, out=None):
    return _map(_exp, a, out)


def log(a, out=None):
    return _map(_log, a, out)


def sqrt(a, out=None):
    return _map(_sqrt, a, out)


def tanh(a, out=None):
    return _map(math.tanh, a, out)


def zeros(shape, dtype=float):
    sh = _shp(shape)
    n = _num(sh)
    d = _new(dtype, n)
    if n > 64 and dtype == "f":
        _fill(d, 0, n, 0.0)
    return ndarray(d, sh, _cs(sh), 0, dtype)


empty = zeros


def full(shape, value, dtype=float):
    sh = _shp(shape)
    d, v = _new(dtype, _num(sh)), value if dtype == "f" else int(value)
    if dtype == "f":
        _fill(d, 0, len(d), _pf(v))
    else:
        for i in range(len(d)):
            d[i] = v
    return ndarray(d, sh, _cs(sh), 0, dtype)


def array(obj, dtype=float):
    if isinstance(obj, ndarray):
        if obj.dtype == dtype:
            return obj.copy()
        obj = obj.tolist()
    obj = obj if isinstance(obj, (list, tuple)) else list(obj)
    if not (obj and isinstance(obj[0], (list, tuple, ndarray))):
        d = _A(dtype, obj if dtype == "f" else [int(x) for x in obj])
        return ndarray(d, (len(obj),), (1,), 0, dtype)
    r, c = len(obj), len(obj[0])
    if c and isinstance(obj[0][0], (list, tuple, ndarray)):
        raise ValueError(_E2)
    d, k = _new(dtype, r * c), 0  # filled in place: no temporary list of r*c items
    for row in obj:
        if len(row) != c:
            raise ValueError("inhomogeneous shape")
        for x in row:
            d[k] = x if dtype == "f" else int(x)
            k += 1
    return ndarray(d, (r, c), (c, 1), 0, dtype)


def frombuffer(buf, dtype=float, count=-1, offset=0):
    # copies the data (ulab returns a view of buf)
    sz = _SZ[dtype]
    b = bytes(buf)[offset:]
    b = b if count < 0 else b[: count * sz]
    if len(b) % sz:
        raise ValueError("buffer size must be a multiple of element size")
    return ndarray(_A(dtype, b), (len(b) // sz,), (1,), 0, dtype)


def dot(a, b):
    if not (isinstance(a, ndarray) and isinstance(b, ndarray)):
        raise TypeError("arguments must be ndarrays")
    m, k, ar, ac = _rc(a)
    if len(b.shape) == 1:
        kb, n, br, bc = b.shape[0], 1, b.strides[0], 0
    else:
        (kb, n), (br, bc) = b.shape, b.strides
    if k != kb:
        raise ValueError("dimensions do not match")
    O = _new("f", m * n)
    s = _dotk(O, a._d, a._o, ar, ac, b._d, b._o, br, bc, m, n, k)
    na, nb = len(a.shape), len(b.shape)
    if na == 1 and nb == 1:
        return s  # unrounded, as the other reductions
    sh = (m, n) if na == 2 and nb == 2 else (m * n,)
    return ndarray(O, sh, _cs(sh), 0, "f")


# The hot loops live in utrain/npkern.py, precompiled to native code for the board.
try:
    from utrain.npkern import (
        NATIVE, _dotk, _axpyk, _outerk, _colsk, _fillk, _add, _mul, _sub, _div, _gt, _ge, _eq,
        _max, _min, _mapk, _wherek, _sum1, _arg1, _cfk, _cwk, _cxk, _dfxk, _dwk,
        _pfk, _pxk)
except ImportError:  # npfallback imported as a top-level module (tests)
    from npkern import (
        NATIVE, _dotk, _axpyk, _outerk, _colsk, _fillk, _add, _mul, _sub, _div, _gt, _ge, _eq,
        _max, _min, _mapk, _wherek, _sum1, _arg1, _cfk, _cwk, _cxk, _dfxk, _dwk,
        _pfk, _pxk)


_FB = _A("f", bytes(256))  # 64 copies of the last fill value


def _fill(D, p, n, v):
    # D[p:p+n] = v by block copies of 64 floats (memcpy, ~20x a per-item loop)
    if n < 16:
        return _fillk(D, p, n, v)
    if _FB[0] != v or _FB[63] != v:
        _fillk(_FB, 0, 64, v)
    mv = memoryview(D)
    while n >= 64:
        mv[p : p + 64] = _FB
        p += 64
        n -= 64
    if n:
        mv[p : p + n] = memoryview(_FB)[:n]


_CONV = {"Cf": _cfk, "Cw": _cwk, "Cx": _cxk, "Dw": _dwk}


def _conv_steps(kind, out, p, q, steps, sw):
    """Convolution steps in one pass (see the kernels above): kind "C" or "D" plus "f"
    (out=y, p=x, q=w), "w" (out=g, p=dz, q=x) or "x" (out=dx, p=dz, q=w).  Dense float
    arrays only; returns False (nothing done) otherwise.  Not ulab API: op_conv uses
    it through utrain.xnp.conv_steps on the fallback."""
    for a in (out, p, q):
        if a.dtype != "f" or len(a.shape) != 2 or a.strides != _cs(a.shape):
            return False
    w = out if kind[1] == "w" else q  # the weight-shaped array
    if kind[0] == "C":
        I = p.shape[1] if kind == "Cf" else (q.shape[1] if kind == "Cw" else out.shape[1])
        _CONV[kind](out._d, out._o, p._d, p._o, q._d, q._o, steps, I, w.shape[0], w.shape[1], sw)
    else:
        CM = w.shape[1]  # x's channels: C = CM / M
        C = q.shape[1] if kind == "Dw" else (p.shape[1] if kind == "Df" else out.shape[1])
        if kind == "Dw":
            _dwk(out._d, out._o, p._d, p._o, q._d, q._o, steps, CM, CM // C, sw)
        else:
            _dfxk(out._d, out._o, p._d, p._o, q._d, q._o, steps, CM, CM // C, sw, kind == "Dx")
    return True


def _maxpool_steps(steps, sw, y, x, dx=None, rem=None):
    """MAX_POOL_2D steps in one call: y = max over the steps of x (forward), or with dx
    and rem (the gradient not yet given out) the gradient, y then being the max.  Dense
    float arrays only; returns False (nothing done) otherwise.  Not ulab API: op_pool
    uses it through utrain.xnp.maxpool_steps on the fallback."""
    arrs = (y, x) if dx is None else (y, x, dx, rem)
    for a in arrs:
        if a.dtype != "f" or len(a.shape) != 2 or a.strides != _cs(a.shape):
            return False
    if dx is None:
        _pfk(y._d, y._o, x._d, x._o, steps, y.shape[1], sw)
    else:
        _pxk(dx._d, dx._o, rem._d, rem._o, x._d, x._o, y._d, y._o, steps, y.shape[1], sw)
    return True


def _line(a):
    # 1-D or one-row 2-D array -> storage, offset, length, stride
    r, c, sr, sc = _rc(a)
    if r != 1:
        raise ValueError(_EB)
    return a._d, a._o, c, sc


def _add_scaled(y, x, s):
    """y += x * s in place (same shapes, float y), one fused pass, no temporary.
    Not ulab API: utrain.xnp uses it for gradient sums and SGD steps."""
    if y.shape != x.shape or y.dtype != "f":
        raise ValueError(_EB)
    r, c, sr, sc = _rc(y)
    X, q, _, _, xr, xc, _, _ = _prep(x)
    fy, fx = _flat(sr, sc, r, c), _flat(xr, xc, r, c)
    if fy == 1 and fx == 1:
        _axpyk(y._d, y._o, 1, X, q, 1, r * c, s)
    else:
        for i in range(r):
            _axpyk(y._d, y._o + i * sr, sc, X, q + i * xr, xc, c, s)


def _add_outer(a, u, v):
    """a += outer(u, v) in place: a [m, n], u and v 1-D or one-row arrays of m and n
    values (the weight gradient of a one-row FC).  Not ulab API, see _add_scaled."""
    U, uo, m, us = _line(u)
    V, vo, n, vs = _line(v)
    r, c, sr, sc = _rc(a)
    if (r, c) != (m, n) or a.dtype != "f":
        raise ValueError(_EB)
    _outerk(a._d, a._o, sr, sc, m, n, U, uo, us, V, vo, vs)


def maximum(a, b):
    return _op(a, b, _max, "f")


def minimum(a, b):
    return _op(a, b, _min, "f")


def clip(a, lo, hi):
    return _op(_op(a, lo, _max, "f"), hi, _min, "f")


def where(cond, x, y):
    W, ow, rw, cw, srw, scw, nw, _ = _prep(cond)
    X, ox, rx, cx, srx, scx, nx, _ = _prep(x)
    Y, oy, ry, cy, sry, scy, ny, _ = _prep(y)
    R, C = _dim(_dim(rw, rx), ry), _dim(_dim(cw, cx), cy)
    srw, scw = (srw if rw == R else 0), (scw if cw == C else 0)
    srx, scx = (srx if rx == R else 0), (scx if cx == C else 0)
    sry, scy = (sry if ry == R else 0), (scy if cy == C else 0)
    O = _new("f", R * C)
    _wherek(O, R, C, W, ow, srw, scw, X, ox, srx, scx, Y, oy, sry, scy)
    sh = (R, C) if _mx(nw, nx, ny) == 2 else (C,)
    return ndarray(O, sh, _cs(sh), 0, "f")


def _red(a, axis, f, t="f"):
    if not isinstance(a, ndarray):
        a = array(a)
    if axis is None:
        a = a if _dense(a) else a.copy()
        return f(a._d, a._o, 1, a.size)
    r, c, sr, sc = _rc(a)
    d, o, nd = a._d, a._o, len(a.shape)
    axis += nd if axis < 0 else 0
    if not 0 <= axis < nd:
        raise ValueError("axis is out of bounds")
    if nd == 1:
        return f(d, o, sc, c)
    if axis == 0 and f is _sum1:
        v = _A(t, bytes(4 * c))
        _colsk(v, d, o, sr, sc, r, c)
        return ndarray(v, (c,), (1,), 0, t)
    if axis == 0:
        v = [f(d, o + j * sc, sr, r) for j in range(c)]
    else:
        v = [f(d, o + i * sr, sc, c) for i in range(r)]
    return ndarray(_A(t, v), (len(v),), (1,), 0, t)


def sum(a, axis=None):
    return _red(a, axis, _sum1)


def mean(a, axis=None):
    a = a if isinstance(a, ndarray) else array(a)
    return _red(a, axis, _sum1) / (a.size if axis is None else a.shape[axis])


def max(a, axis=None):
    return _red(a, axis, lambda d, o, s, n: _pf(_arg1(d, o, s, n, 1)[1]))


def min(a, axis=None):
    return _red(a, axis, lambda d, o, s, n: _pf(_arg1(d, o, s, n, 0)[1]))


def argmax(a, axis=None):
    return _red(a, axis, lambda d, o, s, n: (_arg1(d, o, s, n, 1)[0] - o) // s, "h")
