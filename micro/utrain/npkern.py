# The fallback's hot loops (dot, fused in-place updates, fills, elementwise maps,
# reductions, the convolution and max-pool walks), used by utrain/npfallback.py.
# Written for MicroPython's native emitter: host_tools precompiles this module with
# `mpy-cross -march=<the board's arch>` (runner.stage, deploy), so a board loads machine
# code and spends no heap compiling it; for a board without a native emitter the
# decorators are stripped and it is plain bytecode.  Under CPython they are no-ops.
import math

try:
    import micropython
    NATIVE = True
except ImportError:  # CPython
    NATIVE = False

    class micropython:
        @staticmethod
        def native(f):
            return f

_INF = float("inf")
_NAN = float("nan")

@micropython.native
def _dotk(O, A, ao, ar, ac, B, bo, br, bc, m, n, k):
    q = 0
    s = 0.0
    for i in range(m):
        pa = ao + i * ar
        pe = pa + k * ac
        for j in range(n):
            u = bo + j * bc
            s = 0.0
            if k == 1:  # outer products (a conv tap with one input channel)
                s = A[pa] * B[u]
            elif ac == 1 and br == 1:
                u -= pa
                for t in range(pa, pe):
                    s += A[t] * B[t + u]
            elif k:
                for t in range(pa, pe, ac):
                    s += A[t] * B[u]
                    u += br
            O[q] = s
            q += 1
    return s


@micropython.native
def _axpyk(D, p, sd, X, q, sx, n, s):
    if sd == 1 and sx == 1:
        q -= p
        for t in range(p, p + n):
            D[t] += X[t + q] * s
    else:
        for t in range(n):
            D[p] += X[q] * s
            p += sd
            q += sx


@micropython.native
def _outerk(D, p, sr, sc, m, n, U, uo, us, V, vo, vs):
    for i in range(m):
        s = U[uo + i * us]
        q = p + i * sr
        if sc == 1 and vs == 1:
            w = vo - q
            for t in range(q, q + n):
                D[t] += V[t + w] * s
        else:
            w = vo
            for t in range(n):
                D[q] += V[w] * s
                q += sc
                w += vs


@micropython.native
def _colsk(v, d, o, sr, sc, r, c):
    # v[j] = sum over rows of column j, each summed unrounded as _sum1 does
    for j in range(c):
        x = 0.0
        p = o + j * sc
        for i in range(r):
            x += d[p]
            p += sr
        v[j] = x


@micropython.native
def _fillk(D, p, n, v):
    for t in range(p, p + n):
        D[t] = v

# Kernels: o[p + j] = A[a + j*sa] OP B[b + j*sb], j < n.  Unit and zero (scalar)
# strides get their own loops; commutative ops swap to put the unit stride first.
@micropython.native
def _add(o, p, A, a, sa, B, b, sb, n):
    if sa == 0 and sb == 1:
        A, a, sa, B, b, sb = B, b, sb, A, a, sa
    if o is A and p == a and sa == 1 and 0 <= sb <= 1:  # in place, the hot update path
        if sb:
            b -= a
            for j in range(a, a + n):
                A[j] += B[j + b]
        else:
            s = B[b]
            for j in range(a, a + n):
                A[j] += s
    elif sa == 1 and sb == 1:
        for j in range(n):
            o[p + j] = A[a + j] + B[b + j]
    elif sa == 1 and sb == 0:
        s = B[b]
        for j in range(n):
            o[p + j] = A[a + j] + s
    else:
        for j in range(n):
            o[p + j] = A[a + j * sa] + B[b + j * sb]


@micropython.native
def _mul(o, p, A, a, sa, B, b, sb, n):
    if sa == 0 and sb == 1:
        A, a, sa, B, b, sb = B, b, sb, A, a, sa
    if sa == 1 and sb == 1:
        for j in range(n):
            o[p + j] = A[a + j] * B[b + j]
    elif sa == 1 and sb == 0:
        s = B[b]
        for j in range(n):
            o[p + j] = A[a + j] * s
    else:
        for j in range(n):
            o[p + j] = A[a + j * sa] * B[b + j * sb]


@micropython.native
def _sub(o, p, A, a, sa, B, b, sb, n):
    if o is A and p == a and sa == 1 and 0 <= sb <= 1:  # in place, the hot update path
        if sb:
            b -= a
            for j in range(a, a + n):
                A[j] -= B[j + b]
        else:
            s = B[b]
            for j in range(a, a + n):
                A[j] -= s
    elif sa == 1 and sb == 1:
        for j in range(n):
            o[p + j] = A[a + j] - B[b + j]
    elif sa == 1 and sb == 0:
        s = B[b]
        for j in range(n):
            o[p + j] = A[a + j] - s
    elif sa == 0 and sb == 1:
        s = A[a]
        for j in range(n):
            o[p + j] = s - B[b + j]
    else:
        for j in range(n):
            o[p + j] = A[a + j * sa] - B[b + j * sb]


@micropython.native
def _div(o, p, A, a, sa, B, b, sb, n):
    try:
        if sa == 1 and sb == 1:
            for j in range(n):
                o[p + j] = A[a + j] / B[b + j]
        elif sa == 1 and sb == 0:
            s = B[b]
            for j in range(n):
                o[p + j] = A[a + j] / s
        elif sa == 0 and sb == 1:
            s = A[a]
            for j in range(n):
                o[p + j] = s / B[b + j]
        else:
            for j in range(n):
                o[p + j] = A[a + j * sa] / B[b + j * sb]
    except ZeroDivisionError:  # finish from element j with IEEE inf/nan, as ulab
        for j in range(j, n):
            x, y = A[a + j * sa], B[b + j * sb]
            if y:
                o[p + j] = x / y
            elif x == 0 or x != x:
                o[p + j] = _NAN
            else:
                o[p + j] = math.copysign(_INF, x) * math.copysign(1.0, y)


@micropython.native
def _gt(o, p, A, a, sa, B, b, sb, n):
    if sa == 1 and sb == 0:
        s = B[b]
        for j in range(n):
            o[p + j] = A[a + j] > s
    elif sa == 0 and sb == 1:
        s = A[a]
        for j in range(n):
            o[p + j] = s > B[b + j]
    else:
        for j in range(n):
            o[p + j] = A[a + j * sa] > B[b + j * sb]


@micropython.native
def _ge(o, p, A, a, sa, B, b, sb, n):
    if sa == 1 and sb == 0:
        s = B[b]
        for j in range(n):
            o[p + j] = A[a + j] >= s
    elif sa == 0 and sb == 1:
        s = A[a]
        for j in range(n):
            o[p + j] = s >= B[b + j]
    else:
        for j in range(n):
            o[p + j] = A[a + j * sa] >= B[b + j * sb]


@micropython.native
def _eq(o, p, A, a, sa, B, b, sb, n):
    if sa == 0 and sb == 1:
        A, a, sa, B, b, sb = B, b, sb, A, a, sa
    for j in range(n):
        o[p + j] = A[a + j * sa] == B[b + j * sb]


@micropython.native
def _max(o, p, A, a, sa, B, b, sb, n):
    if sa == 0 and sb == 1:
        A, a, sa, B, b, sb = B, b, sb, A, a, sa
    if sa == 1 and sb == 0:
        s = B[b]
        for j in range(n):
            x = A[a + j]
            o[p + j] = x if x > s else s
    else:
        for j in range(n):
            x, y = A[a + j * sa], B[b + j * sb]
            o[p + j] = x if x > y else y


@micropython.native
def _min(o, p, A, a, sa, B, b, sb, n):
    if sa == 0 and sb == 1:
        A, a, sa, B, b, sb = B, b, sb, A, a, sa
    if sa == 1 and sb == 0:
        s = B[b]
        for j in range(n):
            x = A[a + j]
            o[p + j] = x if x < s else s
    else:
        for j in range(n):
            x, y = A[a + j * sa], B[b + j * sb]
            o[p + j] = x if x < y else y

@micropython.native
def _mapk(f, d, o, sr, sc, r, c, D, q):
    for i in range(r):
        p = o + i * sr
        for j in range(c):
            D[q] = f(d[p + j * sc])
            q += 1


@micropython.native
def _wherek(O, R, C, W, ow, srw, scw, X, ox, srx, scx, Y, oy, sry, scy):
    q = 0
    for i in range(R):
        pw, px, py = ow + i * srw, ox + i * srx, oy + i * sry
        for j in range(C):
            O[q] = X[px + j * scx] if W[pw + j * scw] else Y[py + j * scy]
            q += 1


# Reductions of one line of storage: start o, stride s, n items.
@micropython.native
def _sum1(d, o, s, n):
    x = 0.0
    for k in range(o, o + n * s, s):
        x += d[k]
    return x


@micropython.native
def _arg1(d, o, s, n, mx):
    if n == 0:
        raise ValueError("attempt to get (arg)min/(arg)max of empty sequence")
    b, m = o, d[o]
    for k in range(o + s, o + n * s, s):
        x = d[k]
        if (x > m) if mx else (x < m):
            b, m = k, x
    return b, m

# Convolution steps (op_conv's walk: tap k, first x row, first y row, count; x rows
# step by sw) done in one call instead of a few small array ops per step.  C: CONV_2D
# with I input channels and weights [O, KK*I]; D: DEPTHWISE_CONV_2D, multiplier M,
# weights [KK, C*M], output channel j reading input channel j // M.
# f: y += x . w_k^T;  w: g_k += dz^T . x;  x: dx += dz . w_k.
@micropython.native
def _cfk(Y, yo, X, xo, Wt, wo, steps, I, O, KI, sw):
    for k, xr, yr, n in steps:
        for r in range(n):
            xb = xo + (xr + r * sw) * I
            yb = yo + (yr + r) * O
            wb = wo + k * I - xb
            for oc in range(O):
                s = 0.0
                for t in range(xb, xb + I):
                    s += X[t] * Wt[t + wb]
                Y[yb + oc] += s
                wb += KI


@micropython.native
def _cwk(G, go, Z, zo, X, xo, steps, I, O, KI, sw):
    for k, xr, yr, n in steps:
        for oc in range(O):
            gb = go + oc * KI + k * I
            for ic in range(I):
                s = 0.0
                z = zo + yr * O + oc
                x = xo + xr * I + ic
                for r in range(n):
                    s += Z[z] * X[x]
                    z += O
                    x += sw * I
                G[gb + ic] += s


@micropython.native
def _cxk(D, do, Z, zo, Wt, wo, steps, I, O, KI, sw):
    for k, xr, yr, n in steps:
        for r in range(n):
            db = do + (xr + r * sw) * I
            zb = zo + (yr + r) * O
            for ic in range(I):
                s = 0.0
                w = wo + k * I + ic
                for z in range(zb, zb + O):
                    s += Z[z] * Wt[w]
                    w += KI
                D[db + ic] += s


@micropython.native
def _dfxk(O, oo, P, po, Wt, wo, steps, CM, M, sw, back):
    # forward (O=y, P=x): y[., j] += x[., j // M] * w_k[j]; input gradient (back, O=dx,
    # P=dz): dx[., j // M] += dz[., j] * w_k[j]
    C = CM // M
    for k, xr, yr, n in steps:
        wb = wo + k * CM
        for r in range(n):
            xb = (xr + r * sw) * C
            yb = (yr + r) * CM
            ob, pb = (oo + xb, po + yb) if back else (oo + yb, po + xb)
            if M == 1:
                for j in range(CM):
                    O[ob + j] += P[pb + j] * Wt[wb + j]
            elif back:
                for j in range(CM):
                    O[ob + j // M] += P[pb + j] * Wt[wb + j]
            else:
                for j in range(CM):
                    O[ob + j] += P[pb + j // M] * Wt[wb + j]


@micropython.native
def _dwk(G, go, Z, zo, X, xo, steps, CM, M, sw):
    C = CM // M
    for k, xr, yr, n in steps:
        for j in range(CM):
            s = 0.0
            z = zo + yr * CM + j
            x = xo + xr * C + j // M
            for r in range(n):
                s += Z[z] * X[x]
                z += CM
                x += sw * C
            G[go + k * CM + j] += s


@micropython.native
def _pfk(Y, yo, X, xo, steps, C, sw):
    # max pool forward: y = maximum(y, x) per step, as maximum() picks (y if y > x else x)
    for k, xr, yr, n in steps:
        for r in range(n):
            xb = xo + (xr + r * sw) * C
            yb = yo + (yr + r) * C - xb
            for t in range(xb, xb + C):
                v = X[t]
                if not Y[t + yb] > v:
                    Y[t + yb] = v


@micropython.native
def _pxk(D, do, R, ro, X, xo, Mx, mo, steps, C, sw):
    # max pool gradient: the remaining gradient r of an output goes to the first pixel
    # (scan order) equal to the max m: hit = r where x == m; r -= hit; dx += hit
    for k, xr, yr, n in steps:
        for r in range(n):
            xb = (xr + r * sw) * C
            yb = (yr + r) * C
            for j in range(C):
                if X[xo + xb + j] == Mx[mo + yb + j]:
                    h = R[ro + yb + j]
                    R[ro + yb + j] -= h
                    D[do + xb + j] += h
