# The host simulation's (CPython + numpy) fused updates and convolution walk, for
# utrain.xnp.  A module of its own so that a board never loads this code: every
# function of an imported module takes heap there, whether it runs or not.
import numpy as np


def add_scaled(y, x, s):
    """y += x * s in place (same shapes)."""
    y += x * s

_taps = {}

def _tap_rows(o, walk, sw):
    # op_conv's walk of options o grouped by tap: [(k, x rows, y rows)] as index
    # arrays (cached: the walk of an op never changes; keyed by the option values, which
    # the flat reader gives as a float32 array)
    o = tuple(o)
    g = _taps.get(o)
    if g is None:
        rows = {}
        for k, xr, yr, n in walk(o):
            xi, yi = rows.setdefault(k, ([], []))
            xi.extend(range(xr, xr + (n - 1) * sw + 1, sw))
            yi.extend(range(yr, yr + n))
        g = _taps[o] = [(k, np.array(xi), np.array(yi)) for k, (xi, yi) in rows.items()]
    return g

def conv_steps(kind, out, p, q, o, walk, sw, spread):
    """op_conv's walk(o) (stride sw) with numpy: one gather and product per kernel tap,
    not per output row and tap (within a tap each x and y row occurs once)."""
    taps = _tap_rows(o, walk, sw)
    if kind[0] == 'C':
        I = q.shape[1] if kind == 'Cw' else (p.shape[1] if kind == 'Cf' else out.shape[1])
        for k, xi, yi in taps:
            if kind == 'Cf':
                out[yi] += np.dot(p[xi], q[:, k * I:(k + 1) * I].T)
            elif kind == 'Cw':
                out[:, k * I:(k + 1) * I] += np.dot(p[yi].T, q[xi])
            else:
                out[xi] += np.dot(p[yi], q[:, k * I:(k + 1) * I])
        return True
    CM = out.shape[1] if kind != 'Dx' else q.shape[1]
    C = q.shape[1] if kind == 'Dw' else (p.shape[1] if kind == 'Df' else out.shape[1])
    M = CM // C
    if kind == 'Dx':
        o = out if M == 1 else np.zeros((out.shape[0], CM), dtype=out.dtype)
        for k, xi, yi in taps:
            o[xi] += p[yi] * q[k]
        if M > 1:
            out += o.reshape((out.shape[0], C, M)).sum(axis=2)
        return True
    x = (p if kind == 'Df' else q)
    if M > 1:
        x = np.repeat(x, M, axis=1)
    for k, xi, yi in taps:
        if kind == 'Df':
            out[yi] += x[xi] * q[k]
        else:
            out[k] += np.sum(p[yi] * x[xi], axis=0)
    return True

def add_outer(a, u, v):
    """a += outer(u, v) in place: a [m, n], u and v 1-D or one-row, m and n long."""
    a += np.outer(u, v)
