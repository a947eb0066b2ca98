# ulab's steps for a conv of one input channel (utrain.ulconv hands them over): a first
# layer over MFCC frames or a mono image, at any stride and padding.  Imported only by
# a model that has one.
from utrain.xnp import np, const
_G_H = const(1)
_G_W = const(2)
_G_OH = const(4)
_G_OW = const(5)
_G_KH = const(7)
_G_KW = const(8)
_G_SH = const(9)
_G_DH = const(11)
_G_DW = const(12)
_G_PT = const(13)
_G_PL = const(14)
_CH = const(512)


def _span(n_out, n_in, s, off):
    # the outputs o in [a, b) whose input o * s + off lies in [0, n_in)
    a = max(0, (-off + s - 1) // s)
    return a, max(a, min(n_out, (n_in - 1 - off) // s + 1))


def mono(f, conv, out, p, q, x, o, sw):
    # one input channel (a first conv on a mono image or MFCC frames), any stride: the
    # image is 2-D [H, W], so a tap's input for every output is one strided 2-D view
    # and its product one dot of [pixels, 1] by [1, O] written into y seen as [OH, OW*O]
    # (a tap's product is taken a band of output rows at a time, at most _CH floats or
    # one row: the plan's temporaries, not an output-sized array)
    H, W, OH, OW = int(o[_G_H]), int(o[_G_W]), int(o[_G_OH]), int(o[_G_OW])
    KH, KW, sh = int(o[_G_KH]), int(o[_G_KW]), int(o[_G_SH])
    dh, dw, pt, pl = int(o[_G_DH]), int(o[_G_DW]), int(o[_G_PT]), int(o[_G_PL])
    O = (out if f == 'f' else p).shape[1]
    x2 = (out if f == 'x' else x).reshape((H, W))
    z2 = (out if f == 'f' else p).reshape((OH, OW * O))
    R = max(1, _CH // (OW * O))
    for kh in range(KH):
        a0, b0 = _span(OH, H, sh, kh * dh - pt)
        for a in range(a0, b0, R):
            b = min(a + R, b0)
            for kw in range(KW):
                c, e = _span(OW, W, sw, kw * dw - pl)
                if c == e:
                    continue
                k = kh * KW + kw
                r0, c0 = a * sh + kh * dh - pt, c * sw + kw * dw - pl
                xv = x2[r0:r0 + (b - a - 1) * sh + 1:sh, c0:c0 + (e - c - 1) * sw + 1:sw]
                zv = z2[a:b, c * O:e * O]
                n = (b - a) * (e - c)
                if f == 'f':
                    wk = q[:, k:k + 1].T if conv else q[k:k + 1]
                    zv += np.dot(xv.flatten().reshape((n, 1)), wk).reshape((b - a, (e - c) * O))
                elif f == 'x':
                    wk = q[:, k:k + 1] if conv else q[k:k + 1].T
                    xv += np.dot(zv.copy().reshape((n, O)), wk).reshape((b - a, e - c))
                elif conv:
                    g = out[:, k:k + 1]
                    g += np.dot(zv.copy().reshape((n, O)).T, xv.flatten().reshape((n, 1)))
                else:
                    g = out[k:k + 1]
                    g += np.dot(xv.flatten().reshape((1, n)), zv.copy().reshape((n, O)))
