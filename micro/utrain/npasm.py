# xnp's float32 kernels in inline Thumb assembler for the RP2040 (host_tools stages this
# module for armv6m firmware only; xnp installs it under ulab when it imports): an FC
# layer's matrix products and the fused SGD updates, each multiply and add done by the
# chip's bootrom float routines (its 'SF' table's fmul and fadd: IEEE float32, correctly
# rounded, as the firmware's own float arithmetic and ulab's), called straight from the
# loops: about 140 cycles a multiply-add on the chip, against ulab's 245 plus ~30 K a call.
#   _dot: y[r, j] = sum_k<K a[r, k] * b[j*bj + k*bk]   (bj, bk in bytes; a's rows 4K apart)
#   _upd: w[j, i] += x[i] * u[j]                        (i < n, j < J)
# The same float32 operations in the same order as ulab's dot (a sum from +0.0, term by
# term) and its `row += v * u[j]`, so the results are ulab's bit for bit; terms and
# rows whose multiplier is +-0 are skipped (a ReLU's zeros): a sum from +0.0 is the same
# without them, and so is a weight, but for the sign of a weight that is -0.0 (and an
# inf or NaN that a zero would have turned into NaN).  xnp's own functions stay the
# fallback for what the kernels do not take (strided views, other dtypes, other shapes).
# _P (int32 words): 0 K or n, 1 J, 2 bj, 3 bk, 4 fadd, 5 fmul, 6 R, 7 a's row bytes,
# 8.. scratch (cleared after each call: a stale address would keep an array alive for
# the garbage collector, which scans this table).
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
ON = True                   # False: xnp's own functions do everything (bench/npasm_step.py)


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
    ldr(r4, [r3, 12])
    mov(r10, r4)             # bk
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


# The wrappers take what the kernels can: dense float32 ulab arrays (tobytes() raises
# ValueError on a strided view; another dtype has another byte length).  A Python call
# costs some 5 K cycles on the chip, so their checks are inline.
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
    if not ON or k != K or len(ab) != 4 * R * K or len(bb) != 4 * K * J:
        return _F['matmul'](a, b, bt)
    y = _F['zeros']((R, J))      # (ulab's own: float)
    P = _P
    P[0], P[1], P[6], P[7] = K, J, R, 4 * K
    if bt:
        P[2], P[3] = 4 * K, 4
    else:
        P[2], P[3] = 4, 4 * J
    _dot(y, ab, bb, P)
    return y


def add_outer(a, u, v):
    try:
        ab, ub, vb = a.tobytes(), u.tobytes(), v.tobytes()
        J, n = a.shape
    except (AttributeError, ValueError):
        return _F['add_outer'](a, u, v)
    if not ON or len(ab) != 4 * J * n or len(ub) != 4 * J or len(vb) != 4 * n:
        return _F['add_outer'](a, u, v)
    P = _P
    P[0], P[1] = n, J
    _upd(ab, vb, ub, P)


def add_scaled(y, x, s):
    try:
        yb, xb = y.tobytes(), x.tobytes()
        n = len(yb)
    except (AttributeError, ValueError):
        return _F['add_scaled'](y, x, s)
    if not ON or n != 4 * y.size or len(xb) != n:
        return _F['add_scaled'](y, x, s)
    _U[0] = s
    P = _P
    P[0], P[1] = n >> 2, 1
    _upd(yb, xb, _U, P)


def install(g):
    """Put the kernels in xnp's namespace g (its add_outer, add_scaled and matmul stay
    the fallback)."""
    for k in ('matmul', 'add_outer', 'add_scaled'):
        _F[k] = g[k]
    _F['zeros'] = g['np'].zeros
    g['matmul'], g['add_outer'], g['add_scaled'] = matmul, add_outer, add_scaled
