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

def conv_taps(kind, out, p, q, o, walk, sw, spread=None):
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


def _window(o, walk, sw):
    # (g, n, disjoint) of options o, cached: g [outputs, taps] the x row each output
    # reads at each kernel tap (column k = tap k, as the weights' layout), n = H*W (a
    # row past x's last) where the tap falls in the padding; disjoint: no x row is in
    # two windows.  Keyed by o's bytes (a tuple of the option floats hashes 20x slower)
    key = o.tobytes() if hasattr(o, 'tobytes') else ('win',) + tuple(o)
    r = _taps.get(key)
    if r is None:
        n = int(o[1]) * int(o[2])                                   # H*W
        g = np.full((int(o[4]) * int(o[5]), int(o[7]) * int(o[8])), n)   # OH*OW, KH*KW
        for k, xi, yi in _tap_rows(o, walk, sw):
            g[yi, k] = xi
        real = g[g < n]
        r = _taps[key] = (g, n, len(np.unique(real)) == len(real))
    return r


def _padded(x, fill):
    # x with one more row of fill (what a padding tap reads)
    xp = np.empty((x.shape[0] + 1, x.shape[1]), dtype=x.dtype)
    xp[:-1] = x
    xp[-1] = fill
    return xp


def _scatter(g, n, disjoint, v):
    # [n, C]: the sum of v [outputs, taps, C] into the x rows g names (the padding's
    # row n dropped); where no x row is in two windows a plain store does it
    d = np.zeros((n + 1, v.shape[2]), dtype=v.dtype)
    if disjoint:
        d[g] = v
    else:
        np.add.at(d, g, v)
    return d[:n]


def conv_steps(kind, out, p, q, o, walk, sw, spread=None):
    """op_conv's walk(o) as one gather of every output's window (im2col, the padding a
    zero row) and one product: CONV_2D's y += X . W^T, dW += dz^T . X, dX = dz . W
    scattered back; DEPTHWISE_CONV_2D's the same per channel.  The sums over the taps
    are in another order than the board's row-and-tap walk (float rounding).  A walk
    over a strip of rows (utrain.bands' options) goes tap by tap (conv_taps)."""
    g, n, disjoint = _window(o, walk, sw)
    R, K = g.shape
    if (p if kind[1] == 'f' else (q if kind[1] == 'w' else out)).shape[0] != n or \
            (out if kind[1] == 'f' else p).shape[0] != R:
        return conv_taps(kind, out, p, q, o, walk, sw)
    if kind[0] == 'C':
        if kind == 'Cf':
            out += np.dot(_padded(p, 0.0)[g].reshape((R, -1)), q.T)
        elif kind == 'Cw':
            out += np.dot(p.T, _padded(q, 0.0)[g].reshape((R, -1)))
        else:
            out += _scatter(g, n, disjoint, np.dot(p, q).reshape((R, K, -1)))
        return True
    CM = out.shape[1] if kind != 'Dx' else q.shape[1]
    C = q.shape[1] if kind == 'Dw' else (p.shape[1] if kind == 'Df' else out.shape[1])
    M = CM // C
    if kind == 'Dx':
        d = _scatter(g, n, disjoint, p[:, None, :] * q[None, :, :])
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
    g, n, disjoint = _window(o, walk, sw)
    c = x.shape[1]
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
    if disjoint:                                # each x row in one window only
        d[idx] = give
    else:
        np.add.at(d, idx, give)
    dx += d[:n * c].reshape((n, c))
    rem -= give
    return True
