# RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR of int8 [H, W, C] maps (utrain.q8 layer
# kind SLC with 'rz', handed over by utrain.q8slc, loaded only then): forward and
# gradient side by side.  Per output row and column q8.json holds four int32s: the
# input row's (column's) offset lo and hi in bytes and the weights a of lo, b of hi,
# each + 4096 ('ry' OH rows, 'rx' OW columns: host_tools/prepare/quant.py
# _resize_layer).  Bilinear: TFLite Micro's ResizeBilinearInteger, weights in 1/1024
# (a + b = 1024; b < 0 left of the first half-pixel centre), the sum of the four
# products over 2^20 rounded half away from zero; nearest: a = 1, b = 0, lo = hi: a
# copy of codes.  The scale and zero point do not change (weights sum to one).
# 'rz' is [OH, OW, C, k, rb, ty, tx]: k the rounding shift (20 or 0); the gradient (the
# transposed interpolation: dx[lo] += a a' g ...) uses the weights >> ty (rows), >> tx
# (columns), rounded, so that g keeps about 14 bits (a bilinear x3's weights in 1/1024
# would leave it 6); rb the bits of the largest sum of those weights one input element
# gets, which bounds the int32 sums.
from utrain.q8kern import micropython, VIPER
if not VIPER:
    from utrain.q8kern import ptr8, ptr32

from array import array
from utrain import q8kern as K


@micropython.viper
def rzk(y, x, ry, rx, gm, d: int):
    # forward (d 0): int8 y [OH, OW, C] from int8 x; gradient (d 1): int32 y (x's
    # shape, zeroed) += the transposed weights >> ty, tx times int32 x >> sh.
    # gm: OH, OW, C, k, sh, ty, tx
    pm = ptr32(gm)
    OH = int(pm[0])
    OW = int(pm[1])
    C = int(pm[2])
    k = int(pm[3])
    sh = int(pm[4])
    ty = int(pm[5]) if d else 0
    tx = int(pm[6]) if d else 0
    r = (1 << k) >> 1
    hy = (1 << ty) >> 1
    hx = (1 << tx) >> 1
    py = ptr8(y)
    px = ptr8(x)
    qy = ptr32(y)
    qx = ptr32(x)
    pr = ptr32(ry)
    pc = ptr32(rx)
    i = 0
    for oy in range(OH):
        r0 = int(pr[4 * oy])
        r1 = int(pr[4 * oy + 1])
        ay = (int(pr[4 * oy + 2]) - 4096 + hy) >> ty
        by = (int(pr[4 * oy + 3]) - 4096 + hy) >> ty
        for ox in range(OW):
            c0 = int(pc[4 * ox])
            c1 = int(pc[4 * ox + 1])
            ax = (int(pc[4 * ox + 2]) - 4096 + hx) >> tx
            bx = (int(pc[4 * ox + 3]) - 4096 + hx) >> tx
            w0 = ay * ax
            w1 = by * ax
            w2 = ay * bx
            w3 = by * bx
            p0 = r0 + c0
            p1 = r1 + c0
            p2 = r0 + c1
            p3 = r1 + c1
            for c in range(C):
                if d:
                    v = int(qx[i])
                    h = v >> 16         # (ptr32 reads zero-extend on 64-bit ports)
                    v = (((((h & 0xffff) ^ 0x8000) - 0x8000) << 16) | (v & 0xffff)) >> sh
                    qy[p0 + c] += v * w0
                    qy[p1 + c] += v * w1
                    qy[p2 + c] += v * w2
                    qy[p3 + c] += v * w3
                else:
                    s = (w0 * ((int(px[p0 + c]) ^ 128) - 128) + w1 * ((int(px[p1 + c]) ^ 128) - 128)
                         + w2 * ((int(px[p2 + c]) ^ 128) - 128) + w3 * ((int(px[p3 + c]) ^ 128) - 128))
                    if s < 0:
                        s = 0 - ((r - s) >> k)
                    else:
                        s = (s + r) >> k
                    py[i] = s & 255
                i += 1


def _gm(L):
    if getattr(L, 'ry', None) is None:
        d = L.d
        L.ry = array('i', d['ry'])
        L.rx = array('i', d['rx'])
        L.gm = array('i', d['rz'])
    return L.gm


def fwd(L, net, t):
    """The output of resize layer L from the net's tensors t (int8 bytes by tensor index)."""
    gm = _gm(L)
    rzk(L.y, t[L.ins[0]], L.ry, L.rx, gm, 0)
    return L.y


def back(L, net, g, s):
    """The gradient of resize layer L's input from g, its output's (int32, scale s): into
    the net's other buffer (q8.gtwo), at scale s 2^sh / 2^(k - ty - tx)."""
    gm = _gm(L)
    d = L.d
    n = d['gn']
    dx = net._gbuf(g, n)
    K.zk(dx, n)
    sh = K.nrk(g, L.nout) + 7 - 30 + d['rz'][4]     # (|g >> sh| 2^rb < 2^30)
    sh = sh if sh > 0 else 0
    gm[4] = sh
    rzk(dx, g, L.ry, L.rx, gm, 1)
    return dx, s * (1 << sh) / (1 << (gm[3] - gm[5] - gm[6]))
