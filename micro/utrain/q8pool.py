# MAX_POOL_2D and AVERAGE_POOL_2D of int8 tensors (utrain.q8 layer kinds PMAX, PAVG; input
# and output share scale and zero point), loaded only by a layer table that has a pool
# (code is heap on a board: 3 KB of native code on an RP2040 that MobileNetV2 never
# runs): forward and gradient side by side.  Viper code like q8kern (host_tools
# compiles it for the board's architecture).
# the viper decorator and, under CPython (or decorators stripped), the pointer casts:
# q8kern's
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32


@micropython.viper
def pok(y, x, g, lo: int, hi: int, avg: int):
    # int8 pool of x [H, W, C] into y [OH, OW, C] as TFLite Micro's reference kernels
    # (g as convk's, I = O = C; padded taps excluded): avg 0, the window's max; avg 1,
    # the int32 sum of its n valid inputs, (s > 0 ? (s + n/2)/n : (s - n/2)/n) in C's
    # truncating division; then clamped to [lo, hi]
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; C = pg[2]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    py = ptr8(y)
    px = ptr8(x)
    q = 0
    for oy in range(OH):
        y0 = oy * sh - ph
        a0 = 0
        if y0 < 0:
            a0 = 0 - y0
        a1 = KH
        if H - y0 < KH:
            a1 = H - y0
        for ox in range(OW):
            x0 = ox * sw - pw_
            b0 = 0
            if x0 < 0:
                b0 = 0 - x0
            b1 = KW
            if W - x0 < KW:
                b1 = W - x0
            n = (a1 - a0) * (b1 - b0)
            for c in range(C):
                s = 0
                m = -128
                for ky in range(a0, a1):
                    t = ((y0 + ky) * W + x0 + b0) * C + c
                    for kx in range(b0, b1):
                        v = (int(px[t]) ^ 128) - 128
                        s += v
                        if v > m:
                            m = v
                        t += C
                if avg:
                    if n <= 0:
                        m = 0
                    elif s > 0:
                        m = (s + (n >> 1)) // n
                    else:
                        m = 0 - (((n >> 1) - s) // n)
                if m < lo:
                    m = lo
                if m > hi:
                    m = hi
                py[q] = m & 255
                q += 1


@micropython.viper
def pbk(dx, gz, x, g, y, lo: int, hi: int, avg: int):
    # input gradient of a pool (pok's geometry) from the int32 output gradient gz:
    # dx [H, W, C] zeroed, then per output not at an activation clamp (y <= lo or
    # y >= hi: lo=-129, hi=128 for none): avg 0, dx[the first max of the window in scan
    # order] += gz; avg 1, dx[each valid input] += gz * KH*KW / n rounded half away from
    # zero (the caller's scale is s / (KH*KW): gz exactly for a whole window)
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; C = pg[2]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    pd = ptr32(dx)
    pz = ptr32(gz)
    px = ptr8(x)
    py = ptr8(y)
    KK = KH * KW
    for t in range(H * W * C):
        pd[t] = 0
    q = 0
    for oy in range(OH):
        y0 = oy * sh - ph
        a0 = 0
        if y0 < 0:
            a0 = 0 - y0
        a1 = KH
        if H - y0 < KH:
            a1 = H - y0
        for ox in range(OW):
            x0 = ox * sw - pw_
            b0 = 0
            if x0 < 0:
                b0 = 0 - x0
            b1 = KW
            if W - x0 < KW:
                b1 = W - x0
            n = (a1 - a0) * (b1 - b0)
            for c in range(C):
                u = (int(py[q]) ^ 128) - 128
                v = int(pz[q])
                h = v >> 16
                v = ((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)
                q += 1
                if u <= lo or u >= hi or v == 0 or n <= 0:
                    continue
                if avg:
                    if n != KK:
                        if v > 0:
                            v = (v * KK + (n >> 1)) // n
                        else:
                            v = 0 - (((0 - v) * KK + (n >> 1)) // n)
                    for ky in range(a0, a1):
                        t = ((y0 + ky) * W + x0 + b0) * C + c
                        for kx in range(b0, b1):
                            pd[t] += v
                            t += C
                    continue
                m = -129
                at = 0
                for ky in range(a0, a1):
                    t = ((y0 + ky) * W + x0 + b0) * C + c
                    for kx in range(b0, b1):
                        w = (int(px[t]) ^ 128) - 128
                        if w > m:
                            m = w
                            at = t
                        t += C
                pd[at] += v
