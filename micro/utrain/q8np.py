# The host simulation's (CPython + numpy) versions of q8kern's heavy loops: the same
# integers, computed with numpy.  Under CPython q8kern's viper kernels run as plain Python
# byte loops (an int8 DS-CNN step took 150x the simulated board's time, 70% of it in
# convk); install() puts these in their place.  A module of its own so that a board never
# loads this code (q8kern imports it only under CPython).
import numpy as np

I32 = np.int32
I64 = np.int64


def _i8(b, n):
    return np.frombuffer(b, np.int8, n)


def _i32(a, n):
    return np.frombuffer(a, I32, n)


def _geo(g):
    return [int(v) for v in np.frombuffer(g, I32, 14)]


def _taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw):
    # per tap (ky, kx): the slices of the input padded by (ph, pw) at the top/left (and
    # enough at the bottom/right) that the tap reads for every output, and that padding
    Hp = max(H + ph, (OH - 1) * sh + (KH - 1) * dh + 1)
    Wp = max(W + pw, (OW - 1) * sw + (KW - 1) * dw + 1)
    taps = [(slice(ky * dh, ky * dh + (OH - 1) * sh + 1, sh),
             slice(kx * dw, kx * dw + (OW - 1) * sw + 1, sw)) for ky in range(KH) for kx in range(KW)]
    return taps, Hp, Wp


def _padded(x, xz, H, W, C, ph, pw, Hp, Wp):
    # x - xz as int64 [Hp, Wp, C], zero where a tap is padding (TFLite's input offset)
    p = np.zeros((Hp, Wp, C), I64)
    p[ph:ph + H, pw:pw + W] = _i8(x, H * W * C).reshape(H, W, C).astype(I64) - xz
    return p


def _patches(x, xz, gm):
    H, W, I, O, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw = gm
    taps, Hp, Wp = _taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw)
    p = _padded(x, xz, H, W, I, ph, pw, Hp, Wp)
    return np.stack([p[a, b] for a, b in taps], 2).reshape(OH * OW, KH * KW * I)


def _add(dst, n, v):
    # dst[:n] += v (int32, wrapping as the board's sums do)
    d = _i32(dst, n)
    d[:] = (d.astype(I64) + v.reshape(-1)).astype(I32)


def convk(acc, x, xz, g, w, b):
    gm = _geo(g)
    O, KH, KW, I, OH, OW = gm[3], gm[4], gm[5], gm[2], gm[10], gm[11]
    wm = _i8(w, O * KH * KW * I).reshape(O, -1).astype(I64)
    y = _patches(x, xz, gm) @ wm.T + _i32(b, O)
    _i32(acc, OH * OW * O)[:] = y.reshape(-1).astype(I32)


def dwk(acc, x, xz, g, w, b):
    H, W, C, CM, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw = _geo(g)
    taps, Hp, Wp = _taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw)
    p = np.repeat(_padded(x, xz, H, W, C, ph, pw, Hp, Wp), CM // C, 2)
    wm = _i8(w, KH * KW * CM).reshape(KH * KW, CM).astype(I64)
    y = np.broadcast_to(_i32(b, CM).astype(I64), (OH, OW, CM)).copy()
    for t, (a, c) in enumerate(taps):
        y += p[a, c] * wm[t]
    _i32(acc, OH * OW * CM)[:] = y.reshape(-1).astype(I32)


def cgk(g, dz, x, xz, gm, lo, hi):
    gm = _geo(gm)
    O, OH, OW = gm[3], gm[10], gm[11]
    z = _i8(dz, OH * OW * O).reshape(OH * OW, O)[:, lo:hi].astype(I64)
    gw = z.T @ _patches(x, xz, gm)
    _add(g, gw.size, gw)


def cdk(dx, dz, w, gm):
    H, W, I, O, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw = _geo(gm)
    taps, Hp, Wp = _taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw)
    z = _i8(dz, OH * OW * O).reshape(OH * OW, O).astype(I64)
    c = (z @ _i8(w, O * KH * KW * I).reshape(O, -1).astype(I64)).reshape(OH, OW, KH * KW, I)
    p = np.zeros((Hp, Wp, I), I64)
    for t, (a, b) in enumerate(taps):
        p[a, b] += c[:, :, t]
    _i32(dx, H * W * I)[:] = p[ph:ph + H, pw:pw + W].reshape(-1).astype(I32)


def ddk(dx, dz, w, gm):
    H, W, C, CM, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw = _geo(gm)
    taps, Hp, Wp = _taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw)
    z = _i8(dz, OH * OW * CM).reshape(OH, OW, CM).astype(I64)
    wm = _i8(w, KH * KW * CM).reshape(KH * KW, CM).astype(I64)
    p = np.zeros((Hp, Wp, CM), I64)
    for t, (a, b) in enumerate(taps):
        p[a, b] += z * wm[t]
    p = p.reshape(Hp, Wp, C, CM // C).sum(3)
    _i32(dx, H * W * C)[:] = p[ph:ph + H, pw:pw + W].reshape(-1).astype(I32)


def dgk(g, dz, x, xz, gm):
    H, W, C, CM, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw = _geo(gm)
    taps, Hp, Wp = _taps(H, W, KH, KW, sh, sw, ph, pw, OH, OW, dh, dw)
    p = np.repeat(_padded(x, xz, H, W, C, ph, pw, Hp, Wp), CM // C, 2)
    z = _i8(dz, OH * OW * CM).reshape(OH, OW, CM).astype(I64)
    gw = np.stack([(z * p[a, b]).sum((0, 1)) for a, b in taps])
    _add(g, KH * KW * CM, gw)


def rqk(acc, n, c, blk, mul, shf, out, zp, lo, hi, wide):
    # TFLite Micro's MultiplyByQuantizedMultiplier, as q8kern.rqk computes it
    ch = (np.arange(n) // blk) % c
    a = _i32(acc, n).astype(I64)
    m = _i32(mul, c).astype(I64)[ch]
    s = _i32(shf, c).astype(I64)[ch]
    a = np.where(s > 0, a << np.maximum(s, 0), a)
    # (a right shift past 31 leaves |r| < 2^31 at 0, as the board's kernels give; numpy's
    # int64 1 << 64 would make the rounding mask -1 and round a 0 up to 1)
    rs = np.minimum(np.where(s > 0, 0, -s), 32)
    neg = a < 0
    r = (np.abs(a) * m + np.where(neg, (1 << 30) - 1, 1 << 30)) >> 31
    r = np.where(neg, -r, r)
    k = (np.ones(n, I64) << rs) - 1
    r = (r >> rs) + ((r & k) > (k >> 1) + (r < 0))
    if wide == 1:
        _i32(out, n)[:] = r.astype(I32)
    elif wide > 1:      # (blk 1: value r*c + j to out[r*wide + j])
        i = np.arange(n)
        np.frombuffer(out, np.int8)[i // c * wide + i % c] = np.clip(r + zp, lo, hi).astype(np.int8)
    else:
        np.frombuffer(out, np.int8, n)[:] = np.clip(r + zp, lo, hi).astype(np.int8)


def shk(d, x, n, k, y, lo, hi):
    v = _i32(x, n).astype(I64)
    h2 = (1 << k) >> 1
    r = np.where(v < 0, -((h2 - v) >> k), (v + h2) >> k)
    t = _i8(y, n)
    r = np.where((t <= lo) | (t >= hi), 0, np.clip(r, -127, 127))
    np.frombuffer(d, np.int8, n)[:] = r.astype(np.int8)


def nrk(x, n):
    # the least k with max |x[i]| >> k <= 127 (as q8kern.nrk)
    m = int(np.abs(_i32(x, n).astype(I64)).max()) if n else 0
    return max(0, m.bit_length() - 7)


def zk(a, n):
    _i32(a, n)[:] = 0


def adk(a, d, n):
    _add(a, n, _i32(d, n).astype(I64))


def fck(acc, x, xo, xz, w, b, n, ni, no):
    # FULLY_CONNECTED over n rows, as q8kern.fck (int32 sums: within 31 bits)
    xs = _i8(memoryview(x)[xo:], n * ni).reshape(n, ni).astype(I64) - xz
    s = xs @ _i8(w, no * ni).reshape(no, ni).astype(I64).T + _i32(b, no).astype(I64)
    _i32(acc, n * no)[:] = s.reshape(-1).astype(I32)


def gwk(g, dz, zo, x, xo, xz, lo, hi, ni):
    # an FC layer's weight-gradient sums, as q8kern.gwk
    z = _i8(memoryview(dz)[zo + lo:], hi - lo).astype(I64)
    xs = _i8(memoryview(x)[xo:], ni).astype(I64) - xz
    a = _i32(g, (hi - lo) * ni)
    a[:] = (a.astype(I64) + np.outer(z, xs).reshape(-1)).astype(I32)


def dxk(dx, dz, zo, w, no, ni):
    # an FC layer's input gradient, as q8kern.dxk
    z = _i8(memoryview(dz)[zo:], no).astype(I64)
    _i32(dx, ni)[:] = (z @ _i8(w, no * ni).reshape(no, ni).astype(I64)).astype(I32)


def _lcg(seed, k):
    # the k states after seed of q8kern's generator s = (s * 69069 + 1) mod 2^30: a^j s0 +
    # (1 + a + ... + a^(j-1)) in uint64 (wrapping mod 2^64, a multiple of 2^30)
    a = np.cumprod(np.full(k, 69069, np.uint64))
    c = np.cumsum(np.concatenate((np.ones(1, np.uint64), a[:-1])))
    return ((a * np.uint64(seed) + c) & np.uint64(0x3fffffff)).astype(I64)


def upmk(w, d, n, p):
    # the int8 update from unscaled sums, as q8kern.upmk: the same draws, in order, one
    # per nonzero scaled value
    s0, m, sh, h = (int(v) for v in np.frombuffer(p, I32, 4))
    v = (_i32(d, n).astype(I64) * m + h) >> sh
    nz = np.nonzero(v)[0]
    if not len(nz):
        return s0
    s = _lcg(s0, len(nz))
    vv = v[nz]
    q = (vv >> 8) + ((vv & 255) > ((s >> 12) & 255))
    wq = np.frombuffer(w, np.int8, n)
    up = nz[q != 0]
    wq[up] = np.clip(wq[up].astype(I64) - q[q != 0], -127, 127).astype(np.int8)
    return int(s[-1])


def upek(w, e, d, p):
    # q8kern.upek: the int8 update with the rounding's error kept
    n, m, sh, h = (int(v) for v in np.frombuffer(p, I32, 4))
    v = _i32(d, n).astype(I64)
    if m:
        v = (v * m + h) >> sh
    v = v + _i8(e, n)
    q = (v + 128) >> 8
    np.frombuffer(e, np.int8, n)[:] = (v - (q << 8)).astype(np.int8)
    wq = np.frombuffer(w, np.int8, n)
    up = q != 0         # (a weight with no step is left as it is: a -128 is not clipped)
    wq[up] = np.clip(wq[up].astype(I64) - q[up], -127, 127).astype(np.int8)


def vmk(v, d, n, p):
    # q8mom.vmk: v = mu v (stochastically rounded, the same draws in order) + (d + h) >>
    # sh (p[4], p[5]), held within +-32767, written to v (int16) and d
    if n <= 0:
        return
    pp = np.frombuffer(p, I32, 6)
    m, s0 = int(pp[0]), int(pp[1])
    vv = np.frombuffer(v, np.int16, n)
    t = vv.astype(I64) * m
    q = np.zeros(n, I64)
    nz = np.nonzero(t)[0]
    if len(nz):
        s = _lcg(s0, len(nz))
        tt = t[nz]
        q[nz] = (tt >> 15) + ((tt & 0x7fff) > ((s >> 12) & 0x7fff))
        pp[1] = s[-1]
    r = np.clip(q + ((_i32(d, n).astype(I64) + int(pp[4])) >> int(pp[5])), -32767, 32767)
    vv[:] = r.astype(np.int16)
    _i32(d, n)[:] = r.astype(I32)


def c7n(w, t, c):
    # q8grow.c7n: each channel's +-127 weights (capped at 255 in c), their total
    N, n, st, cs = t[0], t[1], t[2], t[3]
    if N <= 0 or n <= 0:
        c[:max(N, 0)] = bytes(max(N, 0))
        return 0
    a = np.frombuffer(w, np.uint8, (N - 1) * cs + (n - 1) * st + 1)
    v = np.lib.stride_tricks.as_strided(a, (N, n), (cs, st))
    m = np.count_nonzero((v == 127) | (v == 129), axis=1)
    np.frombuffer(c, np.uint8, N)[:] = np.minimum(m, 255)
    return int(m.sum())


def hvk(w, e, n, st, he):
    # q8grow.hvk: the int8 weights (and their fractions) halved
    if n <= 0:
        return
    k = (n - 1) * st + 1
    wq = np.frombuffer(w, np.int8, k)
    q = wq[::st].astype(I64)
    f = np.frombuffer(e, np.int8, k)[::st].astype(I64) if he else 0
    t = ((q << 8) - f) >> 1
    q2 = (t + 127) >> 8
    if he:
        np.frombuffer(e, np.int8, k)[::st] = ((q2 << 8) - t).astype(np.int8)
    wq[::st] = q2.astype(np.int8)


def install(g, names=('convk', 'dwk', 'cgk', 'cdk', 'ddk', 'dgk', 'rqk', 'shk', 'nrk', 'fck',
                       'gwk', 'dxk', 'upmk', 'upek', 'zk', 'adk')):
    """Put these kernels in place of module globals g's (q8kern's; names: another
    module's, as q8grow's c7n and hvk), keeping the plain Python ones as py_<name>."""
    for name in names:
        g['py_' + name] = g[name]
        g[name] = globals()[name]
    if g.get('__name__') == 'utrain.q8kern':
        from os import getenv
        if getenv('UTRAIN_FLOAT') == '32':
            f32()


F32 = np.float32


def _apply32(apply):
    def apply32(net, lr, scale, qmul):
        net.b1, net.b2, net.eps, net.mom = F32(net.b1), F32(net.b2), F32(net.eps), F32(net.mom)
        apply(net, F32(lr), F32(scale), qmul)
    return apply32


class _Q8Batch32(type(np)):
    """utrain.q8batch whose apply is f32's (a module's class: q8batch may be importing
    q8kern, so not yet holding apply, when q8kern calls install)."""
    @property
    def apply(self):
        return _apply32(self.__dict__['apply'])


def mp_float32(t):
    """The float32 MicroPython reads from the decimal text t (py/parsenum.c's
    mp_parse_float_internal, MICROPY_FLOAT_FORMAT_IMPL_APPROX, every single-precision port's
    default): at most about 9 digits in a uint32, (float) of it, times 2^e in the exponent
    bits, then / 5^-e (-10 <= e < 0) or * powf(5, e): not always the nearest float32 (an
    ulp off for about 15% of 8-digit values), and so a board's q8.json scales."""
    neg = t[:1] == '-'
    t = t[1:] if t[:1] in '+-' else t
    MAX = 0x19999998
    man = ex = tzi = tzf = ev = 0
    at = 0      # 0 integer part, 1 fraction, 2 exponent
    eneg = False
    i = 0
    while i < len(t):
        c = t[i]
        i += 1
        if c.isdigit():
            d = ord(c) - 48
            if at == 2:
                if ev < (0x7fffffff // 2 - 9) // 10:
                    ev = 10 * ev + d
            elif d == 0 or man >= MAX:
                if at == 0:
                    tzi += 1
                else:
                    tzf += 1
            else:
                for part, dd in [(0, 0)] * tzi + [(1, 0)] * tzf + [(at, d)]:
                    if man < MAX:       # (accept_digit)
                        ex -= part == 1
                        man = 10 * man + dd
                    else:
                        ex += part == 0
                tzi = tzf = 0
        elif at == 0 and c == '.':
            at = 1
        elif at != 2 and c in 'eE':
            at = 2
            if t[i:i + 1] in ('+', '-'):
                eneg = t[i] == '-'
                i += 1
    e = (-ev if eneg else ev) + ex + tzi
    r = F32(man)
    if e and man:
        u = np.array([r], np.float32).view(np.uint32)
        b = int(u[0])
        u[0] = (b & 0x807fffff) | ((((b >> 23) & 255) + e) & 255) << 23
        r = u.view(np.float32)[0]
        r = r / F32(5) ** F32(-e) if -10 <= e < 0 else r * F32(5) ** F32(e)
    return -r if neg else r


def _libm():
    """(exp, log) as the board's float32 libm computes them: the C library's expf and
    logf (glibc's on the unix builds: the same bits on the 32-bit build, where the nearest
    float32 of math.exp / math.log is an ulp off now and then), numpy float32; math's own
    where C has none; out of logf's domain, math's error as a board's math.log raises."""
    import math
    try:
        import ctypes
        import ctypes.util
        m = ctypes.CDLL(ctypes.util.find_library('m'))
        ef, lf = m.expf, m.logf
        for f in (ef, lf):
            f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
    except (OSError, AttributeError, TypeError):
        ef = lf = None

    def exp(x):
        return F32(ef(x) if ef else math.exp(x))

    def log(x, *b):
        return F32(lf(x)) if lf and not b and x > 0 else F32(math.log(x, *b))
    return exp, log


def _code32(c):
    """Code object c with its float constants as a 32-bit board holds them: mpy-cross
    (a float64 compiler) writes each, folded, as decimal text (1.0 / 16384.0 as
    '6.103515625e-05'), which the board's parser reads (mp_float32: 2^-14 an ulp low)."""
    k = tuple(mp_float32(repr(v)) if type(v) is float else _code32(v) if type(v) is type(c)
              else v for v in c.co_consts)
    return c.replace(co_consts=k)


_DONE = set()


def _consts():
    """Every function of the utrain modules imported so far, once, with _code32's
    constants (a module still importing: the functions it has defined so far)."""
    import sys
    for n, m in list(sys.modules.items()):
        if not n.startswith('utrain.') or n == 'utrain.q8np' or m is None:
            continue
        for o in list(vars(m).values()):
            for f in ([o] + list(vars(o).values()) if isinstance(o, type) else [o]):
                f = getattr(f, '__func__', f)
                c = getattr(f, '__code__', None)
                if c is not None and id(f) not in _DONE and getattr(f, '__module__', '') == n:
                    _DONE.add(id(f))
                    f.__code__ = _code32(c)


class _Every:
    """An import hook: _consts() after each utrain module's import (an importing module's
    later functions are fixed at the next)."""
    def find_spec(self, name, path=None, target=None):
        if not name.startswith('utrain.'):
            return None
        import sys
        from importlib.util import find_spec
        i = sys.meta_path.index(self)
        sys.meta_path.remove(self)
        try:
            spec = find_spec(name)
        finally:
            sys.meta_path.insert(i, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(m):
            run(m)
            _consts()
        spec.loader.exec_module = exec_module
        return spec


class _Json:
    """utrain.q8train's json: q8.json's numbers with a fraction as float32, as a 32-bit
    board parses them (its layer scales then multiply in float32)."""
    @staticmethod
    def load(f):
        import json
        return json.load(f, parse_float=mp_float32)


class _After:
    """An import hook: fix(module) once module `name` (not yet imported) has run."""
    def __init__(self, name, fix):
        self.name, self.fix = name, fix

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import sys
        from importlib.util import find_spec
        sys.meta_path.remove(self)
        spec = find_spec(name)
        run, fix = spec.loader.exec_module, self.fix

        def exec_module(m):
            run(m)
            fix(m)
        spec.loader.exec_module = exec_module
        return spec


def _a32():
    """array.array whose float32 ('f') arrays give their values as numpy float32 (the
    other typecodes: the plain arrays): a product of two of them, or of one and a float
    scale, is float32's as on the board."""
    import array as A
    base = getattr(A.array, 'base', A.array)

    class A32(base):
        def __new__(cls, tc, *a):
            return base.__new__(cls if tc == 'f' else base, tc, *a)

        def __getitem__(self, i):
            v = base.__getitem__(self, i)
            return F32(v) if type(v) is float else v

        def __iter__(self):
            for v in base.__iter__(self):
                yield F32(v)
    A32.base = base
    return A32


def f32():
    """A 32-bit-float board's float steps (UTRAIN_FLOAT=32: host_tools' runner sets it
    for a board whose floats are single precision; q8kern's install calls this under
    CPython).  The int8 path's floats come from three places, each made numpy float32
    here: float32 arrays' values (this process's array.array: _a32), q8.json's numbers
    (utrain.q8train's json: _Json, MicroPython's parser, mp_float32) and the scalars
    utrain.q8batch.apply takes (lr, 1/batch, Adam's betas and epsilon, momentum); utrain.q8's
    exp and log (the loss, cce's gradient) are the C library's expf and logf (_libm).  An
    operation with a float32 operand rounds to float32 as the board's does (numpy's NEP 50;
    IEEE: + - * / and sqrt correctly rounded, math.sqrt's float64 result rounded at its
    next operation), so Adam's masters and moments, the float biases, the gradients'
    scales and the update multipliers' floats step as on the board, bit for bit; a
    float64 board (the 64-bit unix port) keeps Python's floats.  (pow: b ** t is the
    libm's powf on both, as the unix ports'; a board's own libm may differ in the last
    bit.  A float32 array read through a memoryview still gives Python floats.)"""
    import sys
    import array
    if not hasattr(array.array, 'base'):    # (every float32 array made from here on; the
        array.array = A = _a32()            # utrain modules that took the plain class)
        for n, m in list(sys.modules.items()):
            if n.startswith('utrain') and getattr(m, 'array', None) is A.base:
                m.array = A

    def batch(m):           # (its class: whether it has run yet or not)
        m.__class__ = _Q8Batch32

    def train(m):           # (importing utrain.q8, whose q8kern called install: its json
        m.json = _Json      # is bound, its first line)

    def q8(m):              # (its loss's and softmax's; bound before it imports q8kern)
        m.exp, m.log = _libm()
    for name, fix in (('utrain.q8batch', batch), ('utrain.q8train', train), ('utrain.q8', q8)):
        m = sys.modules.get(name)   # (not imported here: q8batch imports q8kern)
        if m is not None:
            fix(m)
        else:
            sys.meta_path.insert(0, _After(name, fix))
    sys.meta_path.insert(0, _Every())
    _consts()


def mkk(m, y, n, lo, hi):
    t = _i8(y, n)
    bits = np.packbits(((t > lo) & (t < hi)).astype(np.uint8), bitorder='little')
    np.frombuffer(m, np.uint8, len(bits))[:] = bits
    return int(np.sum(t >= hi))


def smk(d, x, n, k, m, p):
    v = np.tile(_i32(x, p).astype(I64), n // p) if p else _i32(x, n).astype(I64)
    h2 = (1 << k) >> 1
    r = np.where(v < 0, -((h2 - v) >> k), (v + h2) >> k)
    on = np.unpackbits(np.frombuffer(m, np.uint8, (n + 7) // 8), count=n, bitorder='little')
    r = np.where(on.astype(bool), np.clip(r, -127, 127), 0)
    np.frombuffer(d, np.int8, n)[:] = r.astype(np.int8)


def smc(d, x, k, m, o0, c, O, P, p):
    i = (np.arange(P)[:, None] * O + o0 + np.arange(c)[None, :]).reshape(-1)
    v = _i32(x, p).astype(I64)[i % p]
    h2 = (1 << k) >> 1
    r = np.where(v < 0, -((h2 - v) >> k), (v + h2) >> k)
    on = np.unpackbits(np.frombuffer(m, np.uint8, (P * O + 7) // 8), count=P * O,
                       bitorder='little')[i]
    r = np.where(on.astype(bool), np.clip(r, -127, 127), 0)
    np.frombuffer(d, np.int8, P * c)[:] = r.astype(np.int8)


def smb(s, x, k, m, O, P):
    v = _i32(x, O).astype(I64)
    h2 = (1 << k) >> 1
    r = np.clip(np.where(v < 0, -((h2 - v) >> k), (v + h2) >> k), -127, 127)
    on = np.unpackbits(np.frombuffer(m, np.uint8, (P * O + 7) // 8), count=P * O,
                       bitorder='little').reshape(P, O)
    _i32(s, O)[:] = r * on.sum(0)


def dak(dx, dz, w, o0, m, O, P, I):
    z = np.frombuffer(dz, np.int8, P * O).reshape(P, O)[:, o0:o0 + m].astype(I64)
    _add(dx, P * I, z @ _i8(w, m * I).reshape(m, I).astype(I64))


def mzk(g, n, m):
    on = np.unpackbits(np.frombuffer(m, np.uint8, (n + 7) // 8), count=n, bitorder='little')
    a = _i32(g, n)
    a[on == 0] = 0


def install_sparse(g):
    """As install, for utrain.q8sparse's kernels."""
    install(g, ('mkk', 'smk', 'smc', 'smb', 'dak', 'mzk'))
