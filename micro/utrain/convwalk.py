# op_conv's steps one output row and kernel tap at a time (op_conv.walk): for one output
# row and tap the input pixels are a strided run of x's rows, so each step is one np.dot
# or product on views -- no im2col of the image.  Run where the backend's own steps
# (utrain.xnp.conv_steps) decline: ulab's strided and VALID convs (utrain.ulconv takes
# the stride-1 SAME ones), the fallback's non-dense arrays.  Imported only then.
# Kinds as conv_steps: 'Cf'/'Df' out=y, p=x, q=w;  'Cw'/'Dw' out=dW, p=dz, q=x;
# 'Cx'/'Dx' out=dx, p=dz, q=w.  Depthwise with multiplier M: x spread to C*M channels
# (op_conv.spread, handed in with op_conv.walk).
from utrain.xnp import np, zeros


def steps(kind, out, p, q, o, walk, sw, spread):
    f = kind[1]
    x = q if f == 'w' else p
    I = (out if f == 'x' else x).shape[1]
    if kind[0] == 'C':
        for k, xr, yr, n in walk(o):
            e = xr + (n - 1) * sw + 1
            if f == 'f':
                v = out[yr:yr + n]
                v += np.dot(p[xr:e:sw], q[:, k * I:(k + 1) * I].T)
            elif f == 'w':
                v = out[:, k * I:(k + 1) * I]
                v += np.dot(p[yr:yr + n].T, q[xr:e:sw])
            else:
                v = out[xr:e:sw]
                v += np.dot(p[yr:yr + n], q[:, k * I:(k + 1) * I])
        return True
    M = (out if f == 'f' else p).shape[1] // I
    t = out
    if f != 'x':
        x = spread(x, M)
    elif M > 1:
        t = zeros((out.shape[0], I * M))
    for k, xr, yr, n in walk(o):
        e = xr + (n - 1) * sw + 1
        if f == 'f':
            v = out[yr:yr + n]
            v += x[xr:e:sw] * q[k]
        elif f == 'w':
            v = out[k]
            v += np.sum(p[yr:yr + n] * x[xr:e:sw], axis=0)
        else:
            v = t[xr:e:sw]
            v += p[yr:yr + n] * q[k]
    if t is not out:
        for m in range(M):
            out += t[:, m::M]
    return True
