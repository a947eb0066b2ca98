# xnp's float32 kernels in inline Thumb assembler for the RP2040 (host_tools stages this
# module for armv6m firmware only; xnp installs it when it imports, for ulab's arrays and
# for the fallback's): an FC layer's matrix products and the fused SGD updates, each
# multiply and add done by the chip's bootrom float routines (its 'SF' table's fmul and
# fadd: IEEE float32, correctly rounded, as the firmware's own float arithmetic, ulab's
# and npfallback's), called straight from the loops: about 142 cycles a multiply-add on
# the chip, against ulab's 245 plus ~30 K a call (bench.kernels --float).
#   _dot: y[r, j] = sum_k<K a[r, k] * b[j*bj + k*bk]   (b (J, K) when bt: bj = K, bk = 1;
#         else (K, J): bj = 1, bk = J; a (R, K) and y (R, J) dense)
#   _upd: w[j, i] += x[i] * u[j]                        (i < n, j < J)
# The same float32 operations in the same order as ulab's dot (a sum from +0.0, term by
# term) and its `row += v * u[j]`, so the results are ulab's bit for bit (with finite
# numbers: the bootrom's routines make no NaN, where the firmware's wrappers of them
# do); terms and rows whose multiplier is +-0 are skipped (a ReLU's zeros): a sum from
# +0.0 is the same without them, and so is a weight, but for the sign of a weight that
# is -0.0.  xnp's own functions stay the fallback for what the kernels do not take
# (strided views, other dtypes and shapes; npasm.ON = False: all of it).
# _P (int32 words): 0 K or n, 1 J, 2 bt (then bj), 4 fadd, 5 fmul, 6 R, 7.. scratch
# (addresses cleared after each call: a stale one would keep an array alive for the
# garbage collector, which scans this table).
import micropython
import sys
from array import array

if sys.platform != 'rp2':
    raise ImportError('utrain.npasm: RP2040 only')
from machine import mem16, mem32    # noqa: E402
if mem32[0x10] & 0xFFFFFF != 0x01754D:     # 'Mu', 1: RP2040's bootrom (RP2350's says 2)
    raise ImportError('utrain.npasm: RP2040 only')


def _rom(code):
    # the bootrom's data table (halfword pointer at 0x16): (code, halfword value) pairs
    t = mem16[0x16]
    while mem16[t]:
        if mem16[t] == code:
            return mem16[t + 2]
        t += 4
    raise ImportError('utrain.npasm: no bootrom float table')


_sf = _rom(0x4653)          # 'SF'
_P = array('i', range(16))
_P[4], _P[5] = mem32[_sf], mem32[_sf + 8]       # fadd, fmul (Thumb addresses)
_U = array('f', [0.0])      # add_scaled's multiplier
_F = {}                     # xnp's own functions (install)
ON = True                   # False: xnp's own functions do it all (bench/npasm_step.py)


@micropython.asm_thumb
def _dot(r0, r1, r2, r3):
    mov(r4, r8)
    mov(r5, r9)
    mov(r6, r10)
    mov(r7, r11)
    push({r4, r5, r6, r7})
    mov(r11, r3)
    str(r0, [r3, 32])        # [8] y
    str(r1, [r3, 36])        # [9] a's row
    str(r2, [r3, 40])        # [10] b
    ldr(r4, [r3, 16])
    mov(r8, r4)              # fadd
    ldr(r4, [r3, 20])
    mov(r9, r4)              # fmul
    ldr(r5, [r3, 0])
    lsl(r5, r5, 2)           # 4K
    str(r5, [r3, 28])        # [7] a's row bytes
    mov(r6, 4)
    ldr(r4, [r3, 8])         # bt: b is (J, K): bj = 4K, bk = 4; else (K, J): bj = 4, bk = 4J
    cmp(r4, 0)
    beq(NT)
    str(r5, [r3, 8])
    mov(r10, r6)
    b(BS)
    label(NT)
    str(r6, [r3, 8])
    ldr(r4, [r3, 4])
    lsl(r4, r4, 2)
    mov(r10, r4)
    label(BS)
    ldr(r4, [r3, 4])
    cmp(r4, 0)
    ble(END)
    ldr(r4, [r3, 24])
    str(r4, [r3, 48])        # [12] rows left
    cmp(r4, 0)
    ble(END)
    label(ROW)
    mov(r3, r11)
    ldr(r4, [r3, 40])
    str(r4, [r3, 56])        # [14] this output's b
    ldr(r4, [r3, 4])
    str(r4, [r3, 44])        # [11] outputs left
    label(OUT)
    mov(r3, r11)
    ldr(r5, [r3, 56])
    ldr(r4, [r3, 8])
    add(r4, r4, r5)
    str(r4, [r3, 56])        # the next output's b
    ldr(r4, [r3, 36])        # r4: a's term
    ldr(r7, [r3, 0])
    lsl(r7, r7, 2)
    add(r7, r7, r4)          # r7: the row's end
    mov(r6, 0)               # r6: the sum, +0.0
    cmp(r4, r7)
    beq(ODONE)
    label(L)
    ldr(r0, [r4, 0])
    add(r4, 4)
    lsl(r1, r0, 1)
    beq(SKIP)                # a term of +-0
    ldr(r1, [r5, 0])
    data(2, 0x47C8)          # blx r9: r0 = a * b
    mov(r1, r6)
    data(2, 0x47C0)          # blx r8: r0 = r0 + sum
    mov(r6, r0)
    label(SKIP)
    data(2, 0x4455)          # add r5, r10
    cmp(r4, r7)
    bne(L)
    label(ODONE)
    mov(r3, r11)
    ldr(r0, [r3, 32])
    str(r6, [r0, 0])
    add(r0, 4)
    str(r0, [r3, 32])
    ldr(r4, [r3, 44])
    sub(r4, 1)
    str(r4, [r3, 44])
    bgt(OUT)
    ldr(r4, [r3, 36])
    ldr(r5, [r3, 28])
    add(r4, r4, r5)
    str(r4, [r3, 36])        # a's next row
    ldr(r4, [r3, 48])
    sub(r4, 1)
    str(r4, [r3, 48])
    bgt(ROW)
    label(END)
    mov(r3, r11)
    mov(r0, 0)
    str(r0, [r3, 32])
    str(r0, [r3, 36])
    str(r0, [r3, 40])
    str(r0, [r3, 56])
    pop({r4, r5, r6, r7})
    mov(r8, r4)
    mov(r9, r5)
    mov(r10, r6)
    mov(r11, r7)


@micropython.asm_thumb
def _upd(r0, r1, r2, r3):
    mov(r4, r8)
    mov(r5, r9)
    mov(r6, r10)
    mov(r7, r11)
    push({r4, r5, r6, r7})
    mov(r11, r3)
    str(r0, [r3, 32])        # [8] w's row
    str(r1, [r3, 36])        # [9] x
    str(r2, [r3, 40])        # [10] u[j]
    ldr(r4, [r3, 16])
    mov(r8, r4)              # fadd
    ldr(r4, [r3, 20])
    mov(r9, r4)              # fmul
    ldr(r4, [r3, 4])
    str(r4, [r3, 44])        # [11] rows left
    cmp(r4, 0)
    ble(END)
    label(ROW)
    mov(r3, r11)
    ldr(r2, [r3, 40])
    ldr(r6, [r2, 0])         # r6: u[j]
    add(r2, 4)
    str(r2, [r3, 40])
    ldr(r4, [r3, 32])        # r4: w[j, i]
    ldr(r0, [r3, 0])
    lsl(r0, r0, 2)
    add(r1, r4, r0)
    str(r1, [r3, 32])        # the next row
    lsl(r1, r6, 1)
    beq(RNEXT)               # u[j] = +-0: the row stays
    ldr(r5, [r3, 36])        # r5: x[i]
    add(r7, r5, r0)          # r7: x's end
    cmp(r5, r7)
    beq(RNEXT)
    label(L)
    ldr(r0, [r5, 0])
    add(r5, 4)
    lsl(r1, r0, 1)
    beq(SKIP)                # x[i] = +-0
    mov(r1, r6)
    data(2, 0x47C8)          # blx r9: r0 = x * u
    ldr(r1, [r4, 0])
    data(2, 0x47C0)          # blx r8: r0 = r0 + w
    str(r0, [r4, 0])
    label(SKIP)
    add(r4, 4)
    cmp(r5, r7)
    bne(L)
    label(RNEXT)
    mov(r3, r11)
    ldr(r0, [r3, 44])
    sub(r0, 1)
    str(r0, [r3, 44])
    bgt(ROW)
    label(END)
    mov(r3, r11)
    mov(r0, 0)
    str(r0, [r3, 32])
    str(r0, [r3, 36])
    str(r0, [r3, 40])
    pop({r4, r5, r6, r7})
    mov(r8, r4)
    mov(r9, r5)
    mov(r10, r6)
    mov(r11, r7)


# The wrappers take what the kernels can: dense float32 arrays (ulab: tobytes() raises
# ValueError on a strided view, and itemsize 4 is ulab's float, it has no other 4-byte
# dtype; npfallback: its strides and dtype 'f').  A Python operation costs 1-5 K cycles
# on the chip, so the checks are few.
def _mm(ab, bb, R, K, J, bt):
    y = _F['zeros']((R, J))      # (the backend's own: float)
    P = _P
    P[0], P[1], P[2], P[6] = K, J, bt, R
    _dot(y if _F['ulab'] else y._d, ab, bb, P)
    return y


def matmul(a, b, bt=0):
    try:
        ab, bb = a.tobytes(), b.tobytes()
        R, K = a.shape
        if bt:
            J, k = b.shape
        else:
            k, J = b.shape
    except (AttributeError, ValueError):
        return _F['matmul'](a, b, bt)
    if not ON or k != K or a.itemsize != 4 or b.itemsize != 4:
        return _F['matmul'](a, b, bt)
    return _mm(ab, bb, R, K, J, bt)


def add_outer(a, u, v):
    try:
        ab, ub, vb = a.tobytes(), u.tobytes(), v.tobytes()
        J, n = a.shape
    except (AttributeError, ValueError):
        return _F['add_outer'](a, u, v)
    if (not ON or u.size != J or v.size != n or a.itemsize != 4 or u.itemsize != 4
            or v.itemsize != 4):
        return _F['add_outer'](a, u, v)
    P = _P
    P[0], P[1] = n, J
    _upd(ab, vb, ub, P)


def add_scaled(y, x, s):
    try:
        yb, xb = y.tobytes(), x.tobytes()
    except (AttributeError, ValueError):
        return _F['add_scaled'](y, x, s)
    n = y.size
    if not ON or x.size != n or y.itemsize != 4 or x.itemsize != 4:
        return _F['add_scaled'](y, x, s)
    _sc(yb, xb, n, s)


def _sc(yb, xb, n, s):
    _U[0] = s
    P = _P
    P[0], P[1] = n, 1
    _upd(yb, xb, _U, P)


# the fallback's arrays (stock firmware): npfallback.ndarray, storage _d from offset _o;
# its properties and helpers are Python calls (5-10 K cycles each there), so inline
def _fb(a):
    # a's storage from its first value when a is a dense float array, else None
    s, t = a.shape, a.strides
    if a.dtype != 'f' or t[-1] != 1 and s[-1] != 1 or len(s) == 2 and t[0] != s[1] and s[0] != 1:
        return None
    return a._d if a._o == 0 else memoryview(a._d)[a._o:]


def _row(a, n):
    # a is n values in one row: (n,) or (1, n)
    s = a.shape
    return s[-1] == n and (len(s) == 1 or s[0] == 1)


def fmatmul(a, b, bt=0):
    ab, bb = _fb(a), _fb(b)
    if ON and ab is not None and bb is not None and len(a.shape) == 2 == len(b.shape):
        R, K = a.shape
        J, k = b.shape if bt else (b.shape[1], b.shape[0])
        if k == K:
            return _mm(ab, bb, R, K, J, bt)
    return _F['matmul'](a, b, bt)


def fadd_outer(a, u, v):
    ab, ub, vb = _fb(a), _fb(u), _fb(v)
    if ON and ab is not None and ub is not None and vb is not None and len(a.shape) == 2:
        J, n = a.shape
        if _row(u, J) and _row(v, n):
            P = _P
            P[0], P[1] = n, J
            _upd(ab, vb, ub, P)
            return
    _F['add_outer'](a, u, v)


def fadd_scaled(y, x, s):
    yb, xb = _fb(y), _fb(x)
    sh = y.shape
    if ON and yb is not None and xb is not None and sh == x.shape:
        return _sc(yb, xb, sh[0] * sh[1] if len(sh) == 2 else sh[0], s)
    _F['add_scaled'](y, x, s)


def install(g):
    """Put the kernels in xnp's namespace g (ulab's or the fallback's arrays); its own
    add_outer, add_scaled and matmul stay the fallback."""
    for k in ('matmul', 'add_outer', 'add_scaled'):
        _F[k] = g[k]
    np = g['np']
    _F['zeros'], _F['ulab'] = np.zeros, g['BACKEND'] == 'ulab'
    if _F['ulab']:
        g['matmul'], g['add_outer'], g['add_scaled'] = matmul, add_outer, add_scaled
    else:
        g['matmul'], g['add_outer'], g['add_scaled'] = fmatmul, fadd_outer, fadd_scaled
