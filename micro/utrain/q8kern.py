# int8 kernels for training int8 models (utrain.q8): integer forward with int32
# accumulators and TFLite Micro's requantization, the weight-gradient outer products,
# the input-gradient products and the stochastically rounded int8 update.
# Written for MicroPython's viper emitter (unboxed machine ints, ptr8/ptr32): host_tools
# precompiles it with `mpy-cross -march=<arch>` like npkern.  Under CPython the
# decorators and pointer casts are no-ops and the same code computes the same integers:
# every intermediate value stays within 31 bits, so 32-bit and 64-bit boards agree.
# Storage: int8 tensors in bytearrays (two's complement bytes, onert-micro's layout),
# int32 tensors in array('i').  ptr8 reads 0..255 (sign-extended here); ptr32 reads
# zero-extend on 64-bit ports, so an int32 value that matters is read through _s32's
# two-halves sign extension (sums written back need none: they wrap alike).
# (the decorator and casts: utrain.q8viper's; q8sparse, q8cat, q8lut, q8pool and q8grow
# take them from here; side_save / side_load, plain Python: the files of int8 state
# beside trained.wof that q8grow and q8slope keep)
from utrain.q8viper import micropython, VIPER
if not VIPER:
    from utrain.q8viper import ptr8, ptr16, ptr32


@micropython.viper
def dwk(acc, x, xz: int, g, w, b):
    # DEPTHWISE_CONV_2D, batch 1, input [H, W, C], weights [1, KH, KW, C*M], output
    # channel j reads input channel j // M; g as convk's with I = C and O = C*M.
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; C = pg[2]; CM = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    M = CM // C
    pa = ptr32(acc)
    px = ptr8(x)
    xc = 128 + xz        # (x ^ 128) - xc = x - xz for the int8 byte x
    pw = ptr8(w)
    pb = ptr32(b)
    q = 0
    for oy in range(OH):
        for ox in range(OW):
            for j in range(CM):
                v = int(pb[j])
                h = v >> 16
                pa[q + j] = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
            for ky in range(KH):
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= H:
                    continue
                for kx in range(KW):
                    ix = ox * sw - pw_ + kx * dw
                    if ix < 0 or ix >= W:
                        continue
                    xb = (iy * W + ix) * C
                    wb = (ky * KW + kx) * CM
                    for j in range(CM):
                        pa[q + j] += ((int(px[xb + j // M]) ^ 128) - xc) * (
                            (int(pw[wb + j]) ^ 128) - 128)
            q += CM


@micropython.viper
def mink(a, n: int) -> int:
    # the index of the least of n positive float32 values a (a layer's weight scales):
    # their bits order as ints, so none is boxed, where min() of a float array boxes
    # each value (heap, a step: Q8Net's update checks)
    p = ptr32(a)
    j = 0
    m = p[0]
    for i in range(1, n):
        v = p[i]
        if v < m:
            m = v
            j = i
    return j


@micropython.viper
def lcg(s: int) -> int:
    # the rounding generator's next state, (69069 s + 1) mod 2^30 (upk's): in machine
    # ints (in Python, a 32-bit port's product is a long int, heap a draw)
    return (s * 69069 + 1) & 0x3fffffff


@micropython.viper
def sumk(acc, x, xz: int, n: int, c: int):
    # acc[j] = sum over the n rows of column j of x [n, c] minus the zero point
    # (MEAN over H, W; AVERAGE_POOL's window sums take the same loop per window)
    pa = ptr32(acc)
    px = ptr8(x)
    xc = 128 + xz        # (x ^ 128) - xc = x - xz for the int8 byte x
    for j in range(c):
        s = 0
        t = j
        for r in range(n):
            s += (int(px[t]) ^ 128) - xc
            t += c
        pa[j] = s


@micropython.viper
def shk(d, x, n: int, k: int, y, lo: int, hi: int):
    # d[i] = int8 of x[i] / 2^k (int32 x, rounded half away from zero, clamped to
    # +-127), and 0 where the forward output y[i] (int8) sat at its clamp lo or hi
    # (the fused activation's and the int8 range's gradient; lo=-129, hi=128: no mask)
    pd = ptr8(d)
    px = ptr32(x)
    py = ptr8(y)
    h2 = (1 << k) >> 1
    for i in range(n):
        t = (int(py[i]) ^ 128) - 128
        if t <= lo or t >= hi:
            pd[i] = 0
            continue
        v = int(px[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        if v < 0:
            r = 0 - ((h2 - v) >> k)
        else:
            r = (v + h2) >> k
        if r > 127:
            r = 127
        if r < -127:
            r = -127
        pd[i] = r & 255


@micropython.viper
def rpk(d, z, n: int, c: int, k: int):
    # d[r*c + j] = z[j] >> k for n rows (an int32 gradient broadcast over rows, MEAN's)
    pd = ptr32(d)
    pz = ptr32(z)
    q = 0
    for r in range(n):
        for j in range(c):
            v = int(pz[j])
            h = v >> 16
            pd[q] = (((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)) >> k
            q += 1


@micropython.viper
def sfk(y, n: int, T, g, r):
    # scce's softmax over n int8 logits y: g[i] = T[max - y[i]] (T: 2^14 exp(-s_y d)),
    # r = their sum, the first largest logit's index, that logit
    py = ptr8(y)
    pt = ptr32(T)
    pg = ptr32(g)
    pr = ptr32(r)
    m = -129
    am = 0
    for i in range(n):
        v = (int(py[i]) ^ 128) - 128
        if v > m:
            m = v
            am = i
    t = 0
    for i in range(n):
        e = int(pt[m + 128 - (int(py[i]) ^ 128)])
        pg[i] = e
        t += e
    pr[0] = t
    pr[1] = am
    pr[2] = m


@micropython.viper
def sgk(g, n: int, f: int):
    # g[i] = (g[i] * f + 2^13) >> 14 (f = 2^28 // sum: sfk's terms as 2^14 probabilities)
    pg = ptr32(g)
    for i in range(n):
        pg[i] = (int(pg[i]) * f + 8192) >> 14


@micropython.viper
def ubk(b, d, n: int, seed: int) -> int:
    # int32 bias update: b[i] -= d[i] / 256 rounded stochastically (upk's draws, no int8
    # clamp; held within +-(2^31 - 1)); returns the generator's state
    pb = ptr32(b)
    pd = ptr32(d)
    s = seed
    mx = 0x7fff
    mx = (mx << 16) | 0xffff              # 2^31 - 1 (a constant that big is an object)
    for i in range(n):
        v = int(pd[i])
        h = v >> 16
        v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
        if v == 0:
            continue
        s = (s * 69069 + 1) & 0x3fffffff
        q = v >> 8
        if (v & 255) > ((s >> 12) & 255):
            q += 1
        if q == 0:
            continue
        u = int(pb[i])
        h = u >> 16
        u = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (u & 0xffff)
        if q > 0:
            if u < q - mx:
                u = q - mx
        elif u > mx + q:
            u = mx + q
        pb[i] = u - q
    return s


@micropython.viper
def zk(a, n: int):
    # a[i] = 0 for the first n int32 values
    p = ptr32(a)
    for i in range(n):
        p[i] = 0


@micropython.viper
def mack(a, b, n: int, reps: int) -> int:
    # the bare viper int8 multiply-add loop (bench/int8.py's reference)
    pa = ptr8(a)
    pb = ptr8(b)
    s = 0
    for r in range(reps):
        for t in range(n):
            s += ((int(pa[t]) ^ 128) - 128) * ((int(pb[t]) ^ 128) - 128)
    return s


@micropython.viper
def ddk(dx, dz, w, gm):
    # input gradient of DEPTHWISE_CONV_2D (gm as dwk's): dx[iy, ix, c] = sum over the
    # outputs, taps and multiplier m that read it of dz[oy, ox, c*M+m] * w[ky, kx, c*M+m]
    pg = ptr32(gm)
    H = pg[0]; W = pg[1]; C = pg[2]; CM = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    M = CM // C
    pd = ptr32(dx)
    pz = ptr8(dz)
    pw = ptr8(w)
    for t in range(H * W * C):
        pd[t] = 0
    q = 0
    for oy in range(OH):
        for ox in range(OW):
            for ky in range(KH):
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= H:
                    continue
                for kx in range(KW):
                    ix = ox * sw - pw_ + kx * dw
                    if ix < 0 or ix >= W:
                        continue
                    xb = (iy * W + ix) * C
                    wb = (ky * KW + kx) * CM
                    for j in range(CM):
                        pd[xb + j // M] += ((int(pz[q + j]) ^ 128) - 128) * (
                            (int(pw[wb + j]) ^ 128) - 128)
            q += CM


@micropython.viper
def dgk(g, dz, x, xz: int, gm):
    # weight gradient of DEPTHWISE_CONV_2D (gm as dwk's), weights [KH, KW, C*M]:
    # g[ky, kx, j] += sum over outputs dz[oy, ox, j] * (x[iy, ix, j // M] - xz)
    pg = ptr32(gm)
    H = pg[0]; W = pg[1]; C = pg[2]; CM = pg[3]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    M = CM // C
    pd = ptr32(g)
    pz = ptr8(dz)
    px = ptr8(x)
    xc = 128 + xz        # (x ^ 128) - xc = x - xz for the int8 byte x
    q = 0
    for oy in range(OH):
        for ox in range(OW):
            for ky in range(KH):
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= H:
                    continue
                for kx in range(KW):
                    ix = ox * sw - pw_ + kx * dw
                    if ix < 0 or ix >= W:
                        continue
                    xb = (iy * W + ix) * C
                    wb = (ky * KW + kx) * CM
                    for j in range(CM):
                        pd[wb + j] += ((int(pz[q + j]) ^ 128) - 128) * (
                            (int(px[xb + j // M]) ^ 128) - xc)
            q += CM


@micropython.viper
def cpk(a, d, n: int):
    # a[i] = d[i] for n int32 values (a conv's geometry table into the one a call reads:
    # one call instead of n Python steps of thousands of cycles each on a Cortex-M0+)
    pa = ptr32(a)
    pd = ptr32(d)
    for i in range(n):
        pa[i] = pd[i]


@micropython.viper
def adk(a, d, n: int):
    # a[i] += d[i] for n int32 values (a batch's gradient sums; ADD's raw sum)
    pa = ptr32(a)
    pd = ptr32(d)
    for i in range(n):
        pa[i] += pd[i]


# ---- forward of big int8 models (MobileNetV2-like): residual ADD, channel chunks ----

@micropython.viper
def stk(y, yo: int, ys: int, src, n: int, c: int):
    # y[yo + p*ys + j] = src[p*c + j] for n rows p of c bytes: a chunk of output channels
    # (requantized contiguously) put in place in an [n, ys] int8 tensor
    py = ptr8(y)
    ps = ptr8(src)
    q = 0
    for p in range(n):
        b = yo + p * ys
        for j in range(c):
            py[b + j] = ps[q]
            q += 1


@micropython.viper
def exk(a, x, n: int, z: int, sh: int):
    # a[i] = (x[i] - z) << sh: int8 x minus its zero point, as int32 (ADD's shifted input)
    pa = ptr32(a)
    px = ptr8(x)
    xc = 128 + z
    for i in range(n):
        pa[i] = ((int(px[i]) ^ 128) - xc) << sh


def side_save(path, tag, items):
    # the int8 state kept beside trained.wof (q8grow's .q8w, q8slope's .q8a) at path: the
    # 4-byte tag, then per (tensor, bytes) item u32 the tensor, u32 its bytes, the bytes
    from struct import pack
    from utrain.wof import _replace
    with open(path + '.tmp', 'wb') as f:
        f.write(tag)
        for k, b in items:
            f.write(pack('<II', k, len(b)))
            f.write(b)
    _replace(path + '.tmp', path)


def side_load(path, tag, want):
    # {tensor: bytes} of a side_save file (none there: {}); want {tensor: bytes} the run
    # holds, each of which a file there must hold (cut at a record, a layer's had fallen
    # back to the model's values, unsaid; host_tools/prepare/quant.py reads them so too)
    from struct import unpack
    from utrain.wof import exists
    got = {}
    if exists(path):
        with open(path, 'rb') as f:
            ok = f.read(4) == tag
            while ok:
                h = f.read(8)
                if not h:
                    break
                ok = len(h) == 8
                if ok:
                    k, n = unpack('<II', h)
                    got[k] = v = f.read(n)
                    ok = len(v) == n
            for k in want:
                ok = ok and len(got.get(k, '')) == want[k]
        if not ok:      # (cut short: its scales had been taken as none doubled, unsaid)
            raise ValueError("%s: cut short, or not utrain's; copy it with %s again (pull)"
                             % (path, path[:path.rfind('.')]))
    return got


# ARM boards: the multiply-adds, the requantization, the int8 updates and sumk in inline Thumb
# assembler (utrain.q8asm, staged by host_tools for armv6m/armv7m firmware only); their
# viper versions are utrain.q8vk's, loaded here only where no q8asm is staged (a run on
# an ARM board never loads them: 8.5 KB of armv6m code; vk() does, for the tests and
# benches that compare both).  q8asm calls the viper depthwise kernels above for a
# depthwise multiplier > 1.
try:
    from utrain import q8asm as _A
except (ImportError, SyntaxError):
    _A = None
ASM = _A is not None
if _A is None:
    from utrain.q8vk import fck, convk, rqk, gwk, dxk, cgk, upk, upmk, upek, cdk, nrk, ubek, ack
else:
    _A._V = (dwk, ddk, dgk, sumk, stk)
    fck, convk, dwk, gwk, dxk, cgk, cdk, ddk, dgk, rqk, upk, upmk, upek, sumk, stk = (
        _A.fck, _A.convk, _A.dwk, _A.gwk, _A.dxk, _A.cgk, _A.cdk, _A.ddk, _A.dgk, _A.rqk,
        _A.upk, _A.upmk, _A.upek, _A.sumk, _A.stk)
    nrk, ubek, ack = _A.nrk, _A.ubek, _A.ack
    zk = _A._zero

if not VIPER:
    import sys
    if sys.implementation.name != 'micropython':    # CPython: the heavy loops in numpy
        try:
            from utrain.q8np import install
            install(globals())
        except ImportError:     # (no numpy: the plain Python loops)
            pass


def vk():
    """{name: viper kernel} of the kernels q8asm replaced on this board (loads
    utrain.q8vk): the reference the tests and benches compare the assembler ones with."""
    from utrain import q8vk as V
    d = {'dwk': _A._V[0], 'ddk': _A._V[1], 'dgk': _A._V[2], 'sumk': _A._V[3], 'stk': _A._V[4]}
    for n in ('fck', 'convk', 'gwk', 'dxk', 'cgk', 'cdk', 'rqk', 'upk', 'upmk', 'upek', 'nrk',
              'ubek', 'flk', 'ack'):
        d[n] = getattr(V, n)
    return d
