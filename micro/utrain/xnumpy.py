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

def conv_taps(kind, out, p, q, o, walk, sw):
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




def _window(o, walk, sw, n):
    # [outputs, taps]: the x row each output reads at each kernel tap (column k = tap k,
    # as the weights' layout), n (a row past x's last) where the tap falls in the
    # padding; cached per options
    key = ('win',) + tuple(o)
    g = _taps.get(key)
    if g is None:
        g = np.full((int(o[4]) * int(o[5]), int(o[7]) * int(o[8])), n)   # OH*OW, KH*KW
        for k, xi, yi in _tap_rows(o, walk, sw):
            g[yi, k] = xi
        g = _taps[key] = g
        real = g[g < n]
        _taps[('once',) + tuple(o)] = len(np.unique(real)) == len(real)
    return g


def _padded(x, fill):
    # x with one more row of fill (what a padding tap reads)
    xp = np.empty((x.shape[0] + 1, x.shape[1]), dtype=x.dtype)
    xp[:-1] = x
    xp[-1] = fill
    return xp


def conv_steps(kind, out, p, q, o, walk, sw):
    """op_conv's walk(o) as one gather of every output's window (im2col, the padding a
    zero row) and one product: CONV_2D's y += X . W^T, dW += dz^T . X, dX = dz . W
    scattered back; DEPTHWISE_CONV_2D's the same per channel.  The sums over the taps
    are in another order than the board's row-and-tap walk (float rounding).  A walk
    over a strip of rows (utrain.bands' options) goes tap by tap (conv_taps)."""
    H, W, OH, OW = int(o[1]), int(o[2]), int(o[4]), int(o[5])
    xs = (p if kind[1] == 'f' else (q if kind[1] == 'w' else out)).shape[0]
    ys = (out if kind[1] == 'f' else p).shape[0]
    if xs != H * W or ys != OH * OW:
        return conv_taps(kind, out, p, q, o, walk, sw)
    n = H * W
    g = _window(o, walk, sw, n)
    R, K = g.shape
    if kind[0] == 'C':
        if kind == 'Cf':
            out += np.dot(_padded(p, 0.0)[g].reshape((R, -1)), q.T)
        elif kind == 'Cw':
            out += np.dot(p.T, _padded(q, 0.0)[g].reshape((R, -1)))
        else:
            d = np.zeros((n + 1, out.shape[1]), dtype=out.dtype)
            np.add.at(d, g, np.dot(p, q).reshape((R, K, -1)))
            out += d[:n]
        return True
    CM = out.shape[1] if kind != 'Dx' else q.shape[1]
    C = q.shape[1] if kind == 'Dw' else (p.shape[1] if kind == 'Df' else out.shape[1])
    M = CM // C
    if kind == 'Dx':
        d = np.zeros((n + 1, CM), dtype=out.dtype)
        np.add.at(d, g, p[:, None, :] * q[None, :, :])
        d = d[:n]
        out += d if M == 1 else d.reshape((n, C, M)).sum(axis=2)
        return True
    x = (p if kind == 'Df' else q)
    if M > 1:
        x = np.repeat(x, M, axis=1)
    xw = _padded(x, 0.0)[g]                     # [outputs, taps, C*M]
    if kind == 'Df':
        out += (xw * q[None, :, :]).sum(axis=1)
    else:
        out += (p[:, None, :] * xw).sum(axis=0)
    return True

def maxpool_steps(o, walk, sw, y, x, dx=None, rem=None):
    """op_pool's MAX_POOL_2D over walk(o) in one gather: y = max over each output's
    window of x, or with dx and rem (the gradient not yet given out) the gradient, y
    then being the max: each output's goes to the first pixel of its window (the walk's
    tap order) equal to the max.  The padding is a row of -3.4e38 (op_pool's start)."""
    n, c = x.shape
    g = _window(o, walk, sw, n)
    xw = _padded(x, -3.4e38)[g]                 # [outputs, taps, C]
    if dx is None:
        np.maximum(y, xw.max(axis=1), out=y)
        return True
    eq = xw == y[:, None, :]
    first = eq.argmax(axis=1)                   # the first tap at the max
    R, K = g.shape
    src = g.ravel()[(np.arange(R) * K)[:, None] + first]     # its x row, [outputs, C]
    give = np.where(eq.any(axis=1), rem, 0.0)
    idx = src * c + np.arange(c)
    d = np.zeros((n + 1) * c, dtype=dx.dtype)
    if _taps.get(('once',) + tuple(o)):         # windows apart: each x row in one only
        d[idx] = give
    else:
        np.add.at(d, idx, give)
    dx += d[:n * c].reshape((n, c))
    rem -= give
    return True
