# CONV_2D and DEPTHWISE_CONV_2D (utrain.op_conv) with a frozen weight streamed from the
# model file a few rows at a time (rt.stream.chunks, op_conv.ROWS): CONV_2D's rows are
# output channels ([O, KH*KW*I]), DEPTHWISE_CONV_2D's are taps ([KH*KW, C*M]).  The same
# walk as op_conv, once per chunk; forward and the input gradient (a frozen weight has
# no gradient of its own).  Imported only by a model that streams such a weight.
from utrain.xnp import np, zeros, const
# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_CONV_2D = const(3)
_G_C = const(3)
_G_SW = const(10)
_G_MULT = const(15)


def steps(rt, op, a, b, back, walk, spread):
    # the steps with the weight streamed by rows: forward a = y, b = x; back: a = dx
    # (a frozen weight has no gradient), b = dz; walk and spread: op_conv's
    code, ins, outs, o = op
    sw = int(o[_G_SW])
    if code == _CONV_2D:
        I = int(o[_G_C])
        for r0, wc in rt.stream.chunks(ins[1]):
            m = wc.shape[0]
            for k, xr, yr, n in walk(o):
                wk = wc[:, k * I:(k + 1) * I]
                if back:
                    v = a[xr:xr + (n - 1) * sw + 1:sw]
                    v += np.dot(b[yr:yr + n, r0:r0 + m], wk)
                else:
                    v = a[yr:yr + n, r0:r0 + m]
                    v += np.dot(b[xr:xr + (n - 1) * sw + 1:sw], wk.T)
        return
    M = int(o[_G_MULT])
    xm = zeros((a.shape[0], a.shape[1] * M)) if back and M > 1 else a
    if not back:
        b = spread(b, M)
    for r0, wc in rt.stream.chunks(ins[1]):
        m = wc.shape[0]
        for k, xr, yr, n in walk(o):
            if r0 <= k < r0 + m:
                if back:
                    v = xm[xr:xr + (n - 1) * sw + 1:sw]
                    v += b[yr:yr + n] * wc[k - r0]
                else:
                    v = a[yr:yr + n]
                    v += b[xr:xr + (n - 1) * sw + 1:sw] * wc[k - r0]
    if xm is not a:
        for j in range(M):
            a += xm[:, j::M]
