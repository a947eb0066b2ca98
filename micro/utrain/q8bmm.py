# int8 BATCH_MATMUL (attention's Q K^T and P V: a BIN layer of utrain.q8 with 'bo' 8),
# loaded by utrain.q8bin only for a table that has one: forward and gradient side by side.
# q8.json (host_tools/prepare/quant.py _bmm_layer): 'bm' M, K, N, then a's strides along
# its rows and depth and b's along its depth and columns (adj_x / adj_y: transposed
# storage), 'bb' each output matrix's offsets into a and b (batch axes that broadcast:
# the same offset again), 'zi' the inputs' zero points, 'mul'/'shf' TFLite Micro's
# multiplier s_a s_b / s_y, 'ni' each input's values, 'lb' ceil(log2) of the terms each
# value of an input's gradient sums, 'si' the inputs' scales, 'kc' (and 'kp') a constant
# input's int8 values.
# The forward is TFLite Micro's batch_matmul.cc: sum_k (a - z_a)(b - z_b) in int32 per
# output, requantized, a chunk of outputs at a time in the shared sums buffer.  The
# gradient (g at scale s, 0 where the output sat at its clamp, shifted right first so
# that the sums stay within 31 bits): to a, g b^T (scale s s_b); to b, a^T g (s s_a);
# into the net's input-gradient buffers (both can be larger than the output: 'gn'
# plans them), the second held for its producer (utrain.q8hold).
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

from array import array
from utrain import q8kern as K


@micropython.viper
def mmk(d, u, v, p, i0: int, m: int, f: int):
    # outputs i0..i0+m-1 (row r, column c of a C-column matrix, row-major) of
    # sum_t (U[ou + r ur + t ut] - zu) (V[ov + c vc + t vt] - zv) over t < T, U int8 or
    # int32 (f & 1), V int8 or int32 (f & 2), into d[od + r dr + c dc] (int32), added
    # there (f & 4) or set; p (int32): C, T, ou, ur, ut, zu, ov, vc, vt, zv, od, dr, dc
    pp = ptr32(p)
    C = int(pp[0])
    T = int(pp[1])
    ou = int(pp[2])
    ur = int(pp[3])
    ut = int(pp[4])
    zu = int(pp[5])
    ov = int(pp[6])
    vc = int(pp[7])
    vt = int(pp[8])
    zv = int(pp[9])
    od = int(pp[10])
    dr = int(pp[11])
    dc = int(pp[12])
    u8 = ptr8(u)
    u32 = ptr32(u)
    v8 = ptr8(v)
    v32 = ptr32(v)
    pd = ptr32(d)
    r = i0 // C
    c = i0 - r * C
    for i in range(m):
        pu = ou + r * ur
        pv = ov + c * vc
        s = 0
        for t in range(T):
            if f & 1:
                a = int(u32[pu])
                h = a >> 16
                a = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (a & 0xffff)
            else:
                a = (int(u8[pu]) ^ 128) - 128 - zu
            if f & 2:
                b = int(v32[pv])
                h = b >> 16
                b = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (b & 0xffff)
            else:
                b = (int(v8[pv]) ^ 128) - 128 - zv
            s += a * b
            pu += ut
            pv += vt
        q = od + r * dr + c * dc
        if f & 4:
            w = int(pd[q])
            h = w >> 16
            s += ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (w & 0xffff)
        pd[q] = s
        c += 1
        if c >= C:
            c = 0
            r += 1


def ins(L, t):
    # the layer's two int8 inputs (a constant one from q8.json, made once)
    d = L.d
    a = L.ins
    if getattr(L, 'bp', None) is None:
        L.bp = array('i', [0] * 13)
        if 'kc' in d:
            L.kc = bytearray(array('b', d['kc']))     # (no list of N ints made)
    if 'kc' in d:
        return (L.kc, t[a[1]]) if d['kp'] == 0 else (t[a[0]], L.kc)
    return t[a[0]], t[a[1]]


def _set(p, *v):
    for i in range(13):
        p[i] = v[i]


def fwd(L, net, t):
    """The output of BATCH_MATMUL layer L from the net's tensors t (int8 bytes by index)."""
    d = L.d
    x1, x2 = ins(L, t)
    if L.back:
        L.x, L.x2 = x1, x2      # (the gradient reads both)
    z1, z2 = d['zi']
    M, Kd, N, ai, ak, bk, bj = d['bm']
    bb, p, y, acc = d['bb'], L.bp, L.y, net.acc
    A = len(acc)
    mv = memoryview
    for b in range(len(bb) // 2):
        o = b * M * N
        for i0 in range(0, M * N, A):
            c = A if i0 + A <= M * N else M * N - i0
            _set(p, N, Kd, bb[2 * b], ai, ak, z1, bb[2 * b + 1], bj, bk, z2, -i0, N, 1)
            mmk(acc, x1, x2, p, i0, c, 0)
            K.rqk(acc, c, 1, 1, L.mul, L.shf, mv(y)[o + i0:], L.zy, L.lo, L.hi, 0)
    return y


def back(L, net, g, s, bgk):
    """The gradients of BATCH_MATMUL layer L's inputs from g, its output's (int32, scale
    s): held for the second input when both take one, the first's returned (g, s).
    bgk: utrain.q8bin's (passed in: no import circle), g >> sh in place, 0 where the
    output sat at its clamp."""
    d = L.d
    n, gi, a = L.nout, L.gi, L.ins
    M, Kd, N, ai, ak, bk, bj = d['bm']
    bb, p, lb = d['bb'], L.bp, d['lb']
    z1, z2 = d['zi']
    sh = K.nrk(g, n) + 7 + 8 + (lb[0] if lb[0] > lb[1] else lb[1]) - 30    # (|g| < 2^(nb))
    sh = sh if sh > 0 else 0
    _set(p, 1, 1, 1, n, 0, 0, 0, 1, 0, 0, 0, 0, 0)     # (bgk's geometry: n values, in place)
    bgk(g, g, p, 0, g, 0, sh, 0, L.y, L.lo, L.hi, p, p)
    for i in range(len(gi) - 1, -1, -1):
        j = gi[i]
        nj = d['ni'][j]
        dst = net._gbuf(g, nj)
        K.zk(dst, nj)
        for b in range(len(bb) // 2):
            o = b * M * N
            if j == 0:          # g b^T: [M, N] by [K, N] into a's [M, K]
                _set(p, Kd, N, o, N, 1, 0, bb[2 * b + 1], bk, bj, z2, bb[2 * b], ai, ak)
                mmk(dst, g, L.x2, p, 0, M * Kd, 5)
            else:               # a^T g: [M, K] by [M, N] into b's [K, N]
                _set(p, N, M, bb[2 * b], ak, ai, z1, o, 1, N, 0, bb[2 * b + 1], bk, bj)
                mmk(dst, L.x, g, p, 0, Kd * N, 6)
        sj = s * (1 << sh) * d['si'][1 - j]
        if i:
            net.H.hold(a[j], dst, sj, nj)      # (utrain.q8hold: not a chain)
        else:
            return dst, sj
    return g, s                 # (no input takes one: both made below the trained layers)
