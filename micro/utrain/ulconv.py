# op_conv's steps under ulab (utrain.xnp.conv_steps): a few array calls per kernel tap
# instead of a few per output row and tap (ulab's time goes in calls, not arithmetic).
# Stride-1 convs whose output is the input's size (SAME padding: MobileNet's and DS-CNN's
# 3x3 depthwise convs, every 1x1 conv) are done here, convs of one input channel (a
# first layer over MFCC frames or a mono image, any stride) in utrain.ulmono; the others return
# False and op_conv walks rows (utrain.convwalk).
# Kinds: 'Cf'/'Df' out=y, p=x, q=w;  'Cw'/'Dw' out=dW, p=dz, q=x;  'Cx'/'Dx' out=dx,
# p=dz, q=w.
from utrain.xnp import np, zeros, const
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


def steps(kind, out, p, q, o, walk, sw, spread):
    # stride 1, output the input's size: y and x share the pitch W, so tap (kh, kw) is
    # y[j] += x[j + d] . W_k over one run of j (the rows where the tap lands), with the
    # columns where it falls off the image zeroed in the product before it is added
    # Each output gets its taps in the walk's order: forward and dx are the walk's floats.
    H, W = int(o[_G_H]), int(o[_G_W])
    KW, dh, dw, pt, pl = int(o[_G_KW]), int(o[_G_DH]), int(o[_G_DW]), int(o[_G_PT]), int(o[_G_PL])
    f = kind[1]
    conv = kind < 'D'
    x = q if f == 'w' else p
    I = (out if f == 'x' else x).shape[1]
    if sw != 1 or int(o[_G_SH]) != 1 or int(o[_G_OH]) != H or int(o[_G_OW]) != W:
        if I != 1:
            return False
        from utrain.ulmono import mono     # (a model's first conv, loaded by it alone)
        mono(f, conv, out, p, q, x, o, sw)
        return True
    O = (out if f == 'f' else p).shape[1]
    M = 1 if conv else O // I
    t = out
    if M > 1:                       # depthwise multiplier: x spread to C*M channels
        if f == 'x':
            t = zeros((H * W, I * M))
        else:
            x = spread(x, M)
    # a tap's product is cut into pieces of at most _CH floats (at least a pixel): a 16x16x8
    # conv's 8 KB product in one piece cost 6 KB of smallest heap on 32-bit ulab (102 KB;
    # 96 at 512 floats), and the DS-CNN step 1.5x the instructions of the whole run at 128.
    # (An image row at least, the 1-D conv net's 192 x 32 dz piece, 24 KB, found no run in
    # a fragmented heap with 145 KB free on 32-bit ulab: 0.92x its plan, issue 28.)
    step = max(1, _CH // (I if conv and f == 'x' else O))
    for k in range(int(o[_G_KH]) * KW):
        dr = k // KW * dh - pt
        dc = k % KW * dw - pl
        d = dr * W + dc
        j0 = max(max(0, -dr) * W, -d)
        j1 = min(min(H, H - dr) * W, H * W - d)
        # output columns c whose input column c + dc is off the image (modulo W)
        off = range(-dc) if dc < 0 else range(-dc, 0)
        for a in range(j0, j1, step):
            b = min(a + step, j1)
            if f == 'x':
                v = np.dot(p[a:b], q[:, k * I:(k + 1) * I]) if conv else p[a:b] * q[k]
            elif f == 'f':
                v = np.dot(x[a + d:b + d], q[:, k * I:(k + 1) * I].T) if conv else x[a + d:b + d] * q[k]
            else:
                v = p[a:b].copy() if conv else p[a:b] * x[a + d:b + d]
            for c in off:           # zeroed in the product, rows e of v at that column
                e = (c - a) % W     # (ulab 6.12 writes row len(v) for v[len(v)::W] = 0)
                if e < b - a:
                    v[e::W] = 0.0
            if f == 'x':
                y = t[a + d:b + d]
                y += v
            elif f == 'f':
                y = t[a:b]
                y += v
            elif conv:
                y = t[:, k * I:(k + 1) * I]
                y += np.dot(v.T, x[a + d:b + d])
            else:
                y = t[k]
                y += np.sum(v, axis=0)
            v = None    # (bound while the next piece is made, it was a second live piece)
    if t is not out:
        for m in range(M):
            out += t[:, m::M]
    return True

