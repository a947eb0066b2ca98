# q8kern's multiply-add kernels in inline Thumb assembler, for ARM boards (host_tools
# stages this module only for armv6m/armv7m firmware; q8kern imports it when present and
# keeps its viper kernels as the reference: the same integers, in the same int32 sums).
# Thumb-1 only (the RP2040's Cortex-M0+): the byte loads with a register offset (ldrsb,
# ldr/str reg) that MicroPython's assembler does not spell are written with data().
# Three loops do the multiply-adds; viper code around them walks the geometry, one call
# per row of rows or more (an asm function takes 4 arguments: the rest go in a table,
# _P, offsets and addresses included, so no memoryview is made per call):
#   dot:  a[ao + r*O + o] = b[o] + sum_i<n (x[xo + r*xs + i] - c) * w[wo + o*n + i]
#   axpy: a[ao + r*as + j] += s[so + r*ss] * (x[xo + r*xs + j] - c)   (rows with s = 0 skipped),
#         for G groups whose a, x, s start ga, gx, gs further on ([9..12])
#   vmacs: a[ao + r*as + j] += (x[xo + r*xs + j] - c) * w[wo + r*ws + j] for each entry
#         (R, ao, xo, wo) of a table (a depthwise conv's taps, _T)
# (a int32, x w s int8; _P's words: R, n, O/as, c, xs, xo, wo/so, ao, ws/ss, then axpy's
# groups, scratch; dot's [13]: b's address, viper's int(ptr32(b))).  Also in assembler:
# rqk (_rq: TFLite's requantization), upk (the int8 update), the bias fill and zeroing.
import micropython
from array import array

_P = array('i', range(24))
_PB = bytearray(0)       # im2col rows (a conv's taps gathered per output pixel), grown on use
_PW = array('i', range(0))   # one pixel's int32 input gradient (a conv's cdk)
_T = array('i', range(16))   # vmacs's table
_Q = array('i', range(16))   # _rq's
_V = None                # q8kern's viper kernels (fallback for depthwise multipliers > 1)


@micropython.asm_thumb
def mac(r0, r1, r2):
    # the bare int8 multiply-add loop: sum_i<n a[i] * b[i]
    mov(r3, 0)
    sub(r2, 1)
    bmi(END)
    label(L)
    data(2, 0x5684)          # ldrsb r4, [r0, r2]
    data(2, 0x568D)          # ldrsb r5, [r1, r2]
    mul(r4, r5)
    add(r3, r3, r4)
    sub(r2, 1)
    bpl(L)
    label(END)
    mov(r0, r3)


@micropython.asm_thumb
def dot(r0, r1, r2, r3):
    mov(r7, r3)
    ldr(r4, [r7, 28])        # ao
    lsl(r4, r4, 2)
    add(r0, r0, r4)
    str(r0, [r7, 36])        # [9] a pointer
    ldr(r4, [r7, 20])
    add(r1, r1, r4)          # x + xo
    ldr(r4, [r7, 24])
    add(r2, r2, r4)          # w + wo
    str(r2, [r7, 44])        # [11] w base
    ldr(r3, [r7, 12])        # c
    ldr(r4, [r7, 8])
    cmp(r4, 0)
    ble(END)
    ldr(r4, [r7, 0])
    str(r4, [r7, 40])        # [10] rows left
    cmp(r4, 0)
    ble(END)
    label(ROW)
    ldr(r4, [r7, 8])
    str(r4, [r7, 48])        # [12] outputs left
    ldr(r4, [r7, 52])
    str(r4, [r7, 56])        # [14] bias pointer = [13] bias
    ldr(r2, [r7, 44])
    label(OUT)
    ldr(r6, [r7, 56])
    ldr(r0, [r6, 0])         # the sum starts at the bias
    add(r6, 4)
    str(r6, [r7, 56])
    ldr(r4, [r7, 4])
    sub(r4, 1)
    bmi(ODONE)
    label(MAC)
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    data(2, 0x5716)          # ldrsb r6, [r2, r4]
    sub(r5, r5, r3)
    mul(r5, r6)
    add(r0, r0, r5)
    sub(r4, 1)
    bpl(MAC)
    label(ODONE)
    ldr(r6, [r7, 36])
    str(r0, [r6, 0])
    add(r6, 4)
    str(r6, [r7, 36])
    ldr(r4, [r7, 4])
    add(r2, r2, r4)
    ldr(r4, [r7, 48])
    sub(r4, 1)
    str(r4, [r7, 48])
    bgt(OUT)
    ldr(r4, [r7, 16])
    add(r1, r1, r4)
    ldr(r4, [r7, 40])
    sub(r4, 1)
    str(r4, [r7, 40])
    bgt(ROW)
    label(END)


@micropython.asm_thumb
def axpy(r0, r1, r2, r3):
    # G groups of R rows: group g's a, x, s start ga (words), gx, gs further on
    mov(r7, r3)
    ldr(r4, [r7, 28])        # ao
    lsl(r4, r4, 2)
    add(r0, r0, r4)
    str(r0, [r7, 64])        # [16] the group's a
    ldr(r4, [r7, 20])
    add(r1, r1, r4)
    str(r1, [r7, 68])        # [17] the group's x
    ldr(r4, [r7, 24])
    add(r2, r2, r4)
    str(r2, [r7, 72])        # [18] the group's s
    ldr(r4, [r7, 36])
    str(r4, [r7, 60])        # [15] groups left
    cmp(r4, 0)
    bgt(GRP)
    b(END)
    label(GRP)
    ldr(r0, [r7, 64])
    ldr(r1, [r7, 68])
    ldr(r2, [r7, 72])
    str(r2, [r7, 56])        # [14] s pointer
    ldr(r4, [r7, 0])
    str(r4, [r7, 52])        # [13] rows left
    cmp(r4, 0)
    ble(GNEXT)
    label(ROW)
    ldr(r2, [r7, 56])
    ldrb(r2, [r2, 0])
    data(2, 0xB252)          # sxtb r2, r2
    cmp(r2, 0)
    beq(NEXT)
    ldr(r3, [r7, 12])        # c
    ldr(r4, [r7, 4])
    mov(r12, r7)
    sub(r4, 1)
    bmi(JDONE)
    label(J)
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    sub(r5, r5, r3)
    mul(r5, r2)
    lsl(r6, r4, 2)
    data(2, 0x5987)          # ldr r7, [r0, r6]
    add(r7, r7, r5)
    data(2, 0x5187)          # str r7, [r0, r6]
    sub(r4, 1)
    bpl(J)
    label(JDONE)
    mov(r7, r12)
    label(NEXT)
    ldr(r4, [r7, 8])         # as
    lsl(r4, r4, 2)
    add(r0, r0, r4)
    ldr(r4, [r7, 16])        # xs
    add(r1, r1, r4)
    ldr(r2, [r7, 56])
    ldr(r4, [r7, 32])        # ss
    add(r2, r2, r4)
    str(r2, [r7, 56])
    ldr(r4, [r7, 52])
    sub(r4, 1)
    str(r4, [r7, 52])
    bgt(ROW)
    label(GNEXT)
    ldr(r4, [r7, 40])        # ga
    lsl(r4, r4, 2)
    ldr(r0, [r7, 64])
    add(r0, r0, r4)
    str(r0, [r7, 64])
    ldr(r4, [r7, 44])        # gx
    ldr(r1, [r7, 68])
    add(r1, r1, r4)
    str(r1, [r7, 68])
    ldr(r4, [r7, 48])        # gs
    ldr(r2, [r7, 72])
    add(r2, r2, r4)
    str(r2, [r7, 72])
    ldr(r4, [r7, 60])
    sub(r4, 1)
    str(r4, [r7, 60])
    bgt(GRP)
    label(END)


@micropython.asm_thumb
def vmacs(r0, r1, r2, r3):
    # r3: the table t: [0] entries, [1] n, [2] as, [3] c, [4] xs, [5] ws, [6..11] scratch,
    # entries (R, ao, xo, wo) from t[16]
    mov(r7, r3)
    str(r0, [r7, 32])        # [8] a
    str(r1, [r7, 36])        # [9] x
    str(r2, [r7, 40])        # [10] w
    ldr(r4, [r7, 0])
    str(r4, [r7, 28])        # [7] entries left
    cmp(r4, 0)
    ble(END)
    mov(r4, r7)
    add(r4, 64)
    str(r4, [r7, 24])        # [6] entry pointer
    label(ENT)
    ldr(r6, [r7, 24])
    ldr(r4, [r6, 0])
    str(r4, [r7, 44])        # [11] rows left
    ldr(r0, [r6, 4])
    lsl(r0, r0, 2)
    ldr(r4, [r7, 32])
    add(r0, r0, r4)
    ldr(r1, [r6, 8])
    ldr(r4, [r7, 36])
    add(r1, r1, r4)
    ldr(r2, [r6, 12])
    ldr(r4, [r7, 40])
    add(r2, r2, r4)
    add(r6, 16)
    str(r6, [r7, 24])
    ldr(r3, [r7, 12])        # c
    ldr(r4, [r7, 44])
    cmp(r4, 0)
    ble(EDONE)
    label(ROW)
    ldr(r4, [r7, 4])
    mov(r12, r7)
    sub(r4, 1)
    bmi(JDONE)
    label(J)
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    data(2, 0x5716)          # ldrsb r6, [r2, r4]
    sub(r5, r5, r3)
    mul(r5, r6)
    lsl(r6, r4, 2)
    data(2, 0x5987)          # ldr r7, [r0, r6]
    add(r7, r7, r5)
    data(2, 0x5187)          # str r7, [r0, r6]
    sub(r4, 1)
    bpl(J)
    label(JDONE)
    mov(r7, r12)
    ldr(r4, [r7, 8])         # as
    lsl(r4, r4, 2)
    add(r0, r0, r4)
    ldr(r4, [r7, 16])        # xs
    add(r1, r1, r4)
    ldr(r4, [r7, 20])        # ws
    add(r2, r2, r4)
    ldr(r4, [r7, 44])
    sub(r4, 1)
    str(r4, [r7, 44])
    bgt(ROW)
    label(EDONE)
    ldr(r4, [r7, 28])
    sub(r4, 1)
    str(r4, [r7, 28])
    bgt(ENT)
    label(END)


@micropython.asm_thumb
def _rq(r0, r1, r2):
    # q8kern.rqk over the table r2 (_Q): [0] n, [1] c, [2] blk, [3] mul and [4] shf
    # addresses, [5] zp, [6] lo, [7] hi, [8] wide, [9..15] scratch; r0 the int32 sums,
    # r1 the output.  The 62-bit product |a| * m in 16-bit halves (adds with carry), the
    # nudge 2^30 (a >= 0) or 2^30 - 1, bits 31.. of it, the sign, then the rounding
    # division by 2^-shift: the integers rqk's 15-bit limbs give.
    mov(r7, r2)
    str(r0, [r7, 36])        # [9] sums pointer
    str(r1, [r7, 40])        # [10] output pointer
    ldr(r4, [r7, 0])
    str(r4, [r7, 44])        # [11] values left
    mov(r4, 0)
    str(r4, [r7, 48])        # [12] channel
    label(RUN)
    ldr(r4, [r7, 44])
    cmp(r4, 0)
    bgt(RUNGO)
    b(END)
    label(RUNGO)
    ldr(r5, [r7, 8])         # blk
    cmp(r4, r5)
    ble(RUNN)
    mov(r4, r5)
    label(RUNN)
    str(r4, [r7, 52])        # [13] left in this run (one channel)
    ldr(r5, [r7, 44])
    sub(r5, r5, r4)
    str(r5, [r7, 44])
    ldr(r5, [r7, 48])
    lsl(r5, r5, 2)
    ldr(r6, [r7, 12])
    data(2, 0x5976)          # ldr r6, [r6, r5]
    str(r6, [r7, 56])        # [14] m
    ldr(r6, [r7, 16])
    data(2, 0x5976)          # ldr r6, [r6, r5]
    str(r6, [r7, 60])        # [15] shift
    ldr(r5, [r7, 48])
    add(r5, 1)
    ldr(r6, [r7, 4])
    cmp(r5, r6)
    blt(CHN)
    mov(r5, 0)
    label(CHN)
    str(r5, [r7, 48])
    label(VAL)
    ldr(r0, [r7, 36])
    ldr(r1, [r0, 0])
    add(r0, 4)
    str(r0, [r7, 36])
    ldr(r6, [r7, 60])
    cmp(r6, 0)
    ble(NOLEFT)
    lsl(r1, r6)
    label(NOLEFT)
    mov(r0, 0)
    cmp(r1, 0)
    bge(POS)
    neg(r1, r1)
    mov(r0, 1)
    label(POS)
    mov(r12, r0)             # the sign
    ldr(r2, [r7, 56])        # m
    lsr(r3, r1, 16)          # ah
    lsl(r1, r1, 16)
    lsr(r1, r1, 16)          # al
    lsr(r4, r2, 16)          # mh
    lsl(r2, r2, 16)
    lsr(r2, r2, 16)          # ml
    mov(r5, r1)
    mul(r5, r2)              # lo = al ml
    mov(r6, r3)
    mul(r6, r2)              # ah ml
    mul(r1, r4)              # al mh
    add(r6, r6, r1)          # mid (< 2^32)
    mul(r3, r4)              # hi = ah mh
    lsl(r1, r6, 16)
    lsr(r6, r6, 16)
    add(r5, r5, r1)
    adc(r3, r6)
    mov(r1, 1)
    lsl(r1, r1, 30)
    sub(r1, r1, r0)          # the nudge
    mov(r2, 0)
    add(r5, r5, r1)
    adc(r3, r2)
    lsl(r3, r3, 1)
    lsr(r5, r5, 31)
    orr(r3, r5)              # bits 31..62
    cmp(r0, 0)
    beq(NN)
    neg(r3, r3)
    label(NN)
    ldr(r6, [r7, 60])
    cmp(r6, 0)
    bge(NODIV)
    neg(r6, r6)              # rounding division by 2^rs
    mov(r1, 1)
    lsl(r1, r6)
    sub(r1, 1)               # mask
    mov(r2, r3)
    and_(r2, r1)             # remainder
    lsr(r1, r1, 1)           # threshold, +1 below zero
    cmp(r3, 0)
    bge(TP)
    add(r1, 1)
    label(TP)
    asr(r3, r6)
    cmp(r2, r1)
    ble(NODIV)
    add(r3, 1)
    label(NODIV)
    ldr(r6, [r7, 32])
    ldr(r0, [r7, 40])
    cmp(r6, 0)
    beq(NARROW)
    str(r3, [r0, 0])
    add(r0, 4)
    b(STORED)
    label(NARROW)
    ldr(r6, [r7, 20])
    add(r3, r3, r6)          # + zp, clamped to [lo, hi]
    ldr(r6, [r7, 24])
    cmp(r3, r6)
    bge(G1)
    mov(r3, r6)
    label(G1)
    ldr(r6, [r7, 28])
    cmp(r3, r6)
    ble(G2)
    mov(r3, r6)
    label(G2)
    strb(r3, [r0, 0])
    add(r0, 1)
    label(STORED)
    str(r0, [r7, 40])
    ldr(r4, [r7, 52])
    sub(r4, 1)
    str(r4, [r7, 52])
    ble(VALD)
    b(VAL)
    label(VALD)
    b(RUN)
    label(END)


@micropython.asm_thumb
def upk(r0, r1, r2, r3):
    # q8kern.upk (w, d, n, seed): the stochastically rounded int8 update, the same LCG
    # draws in the same order; returns the generator's state
    mov(r7, 0x0D)
    lsl(r7, r7, 8)
    add(r7, 0xCD)
    mov(r5, 1)
    lsl(r5, r5, 16)
    add(r7, r7, r5)          # 69069
    cmp(r2, 0)
    ble(END)
    label(L)
    ldr(r4, [r1, 0])         # v
    cmp(r4, 0)
    beq(NEXT)
    mul(r3, r7)
    add(r3, 1)
    lsl(r3, r3, 2)
    lsr(r3, r3, 2)           # s = (s * 69069 + 1) & 0x3fffffff
    asr(r5, r4, 8)           # q = v >> 8
    lsl(r6, r4, 24)
    lsr(r6, r6, 24)          # v & 255
    lsl(r4, r3, 12)
    lsr(r4, r4, 24)          # (s >> 12) & 255
    cmp(r6, r4)
    ble(NOUP)
    add(r5, 1)
    label(NOUP)
    cmp(r5, 0)
    beq(NEXT)
    ldrb(r4, [r0, 0])
    data(2, 0xB264)          # sxtb r4, r4
    sub(r4, r4, r5)
    mov(r6, 127)
    cmp(r4, r6)
    ble(C1)
    mov(r4, r6)
    label(C1)
    neg(r6, r6)
    cmp(r4, r6)
    bge(C2)
    mov(r4, r6)
    label(C2)
    strb(r4, [r0, 0])
    label(NEXT)
    add(r0, 1)
    add(r1, 4)
    sub(r2, 1)
    bgt(L)
    label(END)
    mov(r0, r3)


@micropython.asm_thumb
def upmk(r0, r1, r2, r3):
    # q8kern.upmk (w, d, n, p): upk from unscaled sums, v = (d[i] * m + h) >> sh, p =
    # seed, m, sh, h, 69069; the same draws; returns the generator's state
    ldr(r7, [r3, 0])         # s
    cmp(r2, 0)
    ble(END)
    label(L)
    ldr(r4, [r1, 0])
    ldr(r5, [r3, 4])
    mul(r4, r5)              # d * m
    ldr(r5, [r3, 12])
    add(r4, r4, r5)
    ldr(r5, [r3, 8])
    asr(r4, r5)              # v = (d * m + h) >> sh
    cmp(r4, 0)
    beq(NEXT)
    ldr(r5, [r3, 16])
    mul(r7, r5)
    add(r7, 1)
    lsl(r7, r7, 2)
    lsr(r7, r7, 2)           # s = (s * 69069 + 1) & 0x3fffffff
    asr(r5, r4, 8)           # q = v >> 8
    lsl(r6, r4, 24)
    lsr(r6, r6, 24)          # v & 255
    lsl(r4, r7, 12)
    lsr(r4, r4, 24)          # (s >> 12) & 255
    cmp(r6, r4)
    ble(NOUP)
    add(r5, 1)
    label(NOUP)
    cmp(r5, 0)
    beq(NEXT)
    ldrb(r4, [r0, 0])
    data(2, 0xB264)          # sxtb r4, r4
    sub(r4, r4, r5)
    mov(r6, 127)
    cmp(r4, r6)
    ble(C1)
    mov(r4, r6)
    label(C1)
    neg(r6, r6)
    cmp(r4, r6)
    bge(C2)
    mov(r4, r6)
    label(C2)
    strb(r4, [r0, 0])
    label(NEXT)
    add(r0, 1)
    add(r1, 4)
    sub(r2, 1)
    bgt(L)
    label(END)
    mov(r0, r7)


def _buf(n):
    # the im2col rows, at least n bytes (kept: one per board, as big as the widest row)
    global _PB
    if len(_PB) < n:
        _PB = None
        _PB = bytearray(n)
    return _PB


def _wbuf(n):
    # one pixel's int32 input-gradient taps, at least n
    global _PW
    if len(_PW) < n:
        _PW = None
        _PW = array('i', range(n))
    return _PW


@micropython.asm_thumb
def _bias(r0, r1, r2, r3):
    # a[r*c + j] = b[j] for n rows: (a, b, n, c)
    cmp(r3, 0)
    ble(END)
    lsl(r3, r3, 2)
    label(ROW)
    sub(r2, 1)
    bmi(END)
    mov(r4, r3)
    label(J)
    sub(r4, 4)
    data(2, 0x590D)          # ldr r5, [r1, r4]
    data(2, 0x5105)          # str r5, [r0, r4]
    bne(J)
    add(r0, r0, r3)
    b(ROW)
    label(END)


@micropython.asm_thumb
def _zero(r0, r1):
    # a[i] = 0 for n int32 values: (a, n)
    mov(r2, 0)
    lsl(r1, r1, 2)
    label(J)
    sub(r1, 4)
    bmi(END)
    data(2, 0x5042)          # str r2, [r0, r1]
    b(J)
    label(END)


@micropython.viper
def _pointwise(g) -> int:
    # 1: a 1x1 conv, stride 1, no padding (its input rows are its im2col rows)
    pg = ptr32(g)
    if (pg[4] == 1 and pg[5] == 1 and pg[6] == 1 and pg[7] == 1 and pg[8] == 0
            and pg[9] == 0 and pg[11] == pg[1]):
        return 1
    return 0


@micropython.viper
def _gather(pb, x, xz: int, g, oy: int):
    # im2col of output row oy of a conv (g as q8kern.convk's): pb[ox*KK + (ky*KW+kx)*I + i]
    # = x[iy, ix, i], the zero point where the tap is padding (its term is then 0)
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; I = pg[2]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    d = ptr8(pb)
    px = ptr8(x)
    z = xz & 255
    q = 0
    for ox in range(OW):
        for ky in range(KH):
            iy = oy * sh - ph + ky * dh
            if iy < 0 or iy >= H:
                for t in range(KW * I):
                    d[q] = z
                    q += 1
                continue
            if dw == 1:                 # the row's taps inside the image: one span of x
                ix = ox * sw - pw_
                k0 = 0
                if ix < 0:
                    k0 = 0 - ix
                if k0 > KW:
                    k0 = KW
                k1 = W - ix
                if k1 > KW:
                    k1 = KW
                if k1 < k0:
                    k1 = k0
                e = q + k0 * I
                while q < e:
                    d[q] = z
                    q += 1
                xb = (iy * W + ix + k0) * I
                for t in range(xb, xb + (k1 - k0) * I):
                    d[q] = px[t]
                    q += 1
                e = q + (KW - k1) * I
                while q < e:
                    d[q] = z
                    q += 1
                continue
            for kx in range(KW):
                ix = ox * sw - pw_ + kx * dw
                if ix < 0 or ix >= W:
                    for t in range(I):
                        d[q] = z
                        q += 1
                    continue
                xb = (iy * W + ix) * I
                for t in range(xb, xb + I):
                    d[q] = px[t]
                    q += 1


@micropython.viper
def _scatter(dx, pw, g, oy: int, ox: int):
    # dx[iy, ix, i] += pw[(ky*KW+kx)*I + i] over the taps of output (oy, ox) in the input
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; I = pg[2]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]
    dh = pg[12]; dw = pg[13]
    pd = ptr32(dx)
    ps = ptr32(pw)
    for ky in range(KH):
        iy = oy * sh - ph + ky * dh
        if iy < 0 or iy >= H:
            continue
        for kx in range(KW):
            ix = ox * sw - pw_ + kx * dw
            if ix < 0 or ix >= W:
                continue
            xb = (iy * W + ix) * I
            q = (ky * KW + kx) * I - xb
            for t in range(xb, xb + I):
                pd[t] += ps[t + q]


@micropython.viper
def fck(acc, x, xo: int, xz: int, w, b, n: int, ni: int, no: int):
    p = ptr32(_P)
    p[13] = int(ptr32(b))
    p[0] = n; p[1] = ni; p[2] = no; p[3] = xz; p[4] = ni; p[5] = xo; p[6] = 0; p[7] = 0
    dot(acc, x, w, _P)


@micropython.viper
def convk(acc, x, xz: int, g, w, b):
    pg = ptr32(g)
    I = pg[2]; O = pg[3]; OH = pg[10]; OW = pg[11]
    KK = pg[4] * pg[5] * I
    p = ptr32(_P)
    p[13] = int(ptr32(b))
    p[1] = KK; p[2] = O; p[3] = xz; p[4] = KK; p[5] = 0; p[6] = 0
    if int(_pointwise(g)):
        p[0] = OH * OW; p[7] = 0
        dot(acc, x, w, _P)
        return
    pb = _buf(OW * KK)
    for oy in range(OH):
        _gather(pb, x, xz, g, oy)
        p[0] = OW; p[7] = oy * OW * O
        dot(acc, pb, w, _P)


@micropython.viper
def cgk(g, dz, x, xz: int, gm, lo: int, hi: int):
    pg = ptr32(gm)
    I = pg[2]; O = pg[3]; OH = pg[10]; OW = pg[11]
    KK = pg[4] * pg[5] * I
    p = ptr32(_P)
    p[0] = hi - lo; p[1] = KK; p[2] = KK; p[3] = xz; p[4] = 0; p[5] = 0; p[7] = 0; p[8] = 1
    p[10] = 0; p[11] = KK; p[12] = O          # a group per output pixel
    if int(_pointwise(gm)):
        p[9] = OH * OW; p[6] = lo
        axpy(g, x, dz, _P)
        return
    pb = _buf(OW * KK)
    p[9] = OW
    for oy in range(OH):
        _gather(pb, x, xz, gm, oy)
        p[6] = oy * OW * O + lo
        axpy(g, pb, dz, _P)


@micropython.viper
def cdk(dx, dz, w, gm):
    pg = ptr32(gm)
    I = pg[2]; O = pg[3]; OH = pg[10]; OW = pg[11]
    KK = pg[4] * pg[5] * I
    _zero(dx, pg[0] * pg[1] * I)
    p = ptr32(_P)
    p[0] = O; p[1] = KK; p[2] = 0; p[3] = 0; p[4] = KK; p[5] = 0; p[8] = 1
    if int(_pointwise(gm)):
        p[9] = OH * OW; p[10] = I; p[11] = 0; p[12] = O; p[6] = 0; p[7] = 0
        axpy(dx, w, dz, _P)
        return
    pw = _wbuf(KK)
    p[7] = 0; p[9] = 1
    for oy in range(OH):
        for ox in range(OW):
            _zero(pw, KK)
            p[6] = (oy * OW + ox) * O
            axpy(pw, w, dz, _P)
            _scatter(dx, pw, gm, oy, ox)


@micropython.viper
def gwk(g, dz, zo: int, x, xo: int, xz: int, lo: int, hi: int, ni: int):
    p = ptr32(_P)
    p[0] = hi - lo; p[1] = ni; p[2] = ni; p[3] = xz; p[4] = 0; p[5] = xo; p[6] = zo + lo
    p[7] = 0; p[8] = 1; p[9] = 1
    axpy(g, x, dz, _P)


@micropython.viper
def dxk(dx, dz, zo: int, w, no: int, ni: int):
    _zero(dx, ni)
    p = ptr32(_P)
    p[0] = no; p[1] = ni; p[2] = 0; p[3] = 0; p[4] = ni; p[5] = 0; p[6] = zo; p[7] = 0
    p[8] = 1; p[9] = 1
    axpy(dx, w, dz, _P)


def _table(n):
    # vmacs's table for n entries
    global _T
    if len(_T) < 16 + 4 * n:
        _T = None
        _T = array('i', range(16 + 4 * n))
    return _T


@micropython.viper
def _taps(a, x, w, g, xz: int, mode: int):
    # the depthwise kernels (multiplier 1), one vmacs call per few output rows oy: an entry
    # per tap (ky, kx) whose input row is inside the image, over the outputs ox whose input
    # column is inside it.  mode 0: forward (a: sums [OH, OW, C], x: input, w: weights);
    # 1: input gradient (a: dx [H, W, C], x: dz, w: weights);
    # 2: weight gradient (a: g [KH, KW, C], x: input, w: dz)
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; C = pg[2]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    cap = KH * KW                 # entries per call: whole rows, up to 64 (1 KB)
    if cap < 64:
        cap = 64 // cap * cap
    tb = _table(cap)
    t = ptr32(tb)
    t[1] = C; t[3] = xz
    if mode == 0:
        t[2] = C; t[4] = sw * C; t[5] = 0
    elif mode == 1:
        t[2] = sw * C; t[4] = C; t[5] = 0
    else:
        t[2] = 0; t[4] = sw * C; t[5] = C
    e = 16
    for oy in range(OH):
        if e + 4 * KH * KW > 16 + 4 * cap:
            t[0] = (e - 16) >> 2
            vmacs(a, x, w, tb)
            e = 16
        for ky in range(KH):
            iy = oy * sh - ph + ky * dh
            if iy < 0 or iy >= H:
                continue
            for kx in range(KW):
                off = kx * dw - pw_
                lo = 0
                while lo * sw + off < 0:
                    lo += 1
                hi = lo
                while hi < OW and hi * sw + off < W:
                    hi += 1
                if hi <= lo:
                    continue
                xi = (iy * W + lo * sw + off) * C     # the input's
                oi = (oy * OW + lo) * C                # the output's
                ti = (ky * KW + kx) * C                # the weight's
                t[e] = hi - lo
                if mode == 0:
                    t[e + 1] = oi; t[e + 2] = xi; t[e + 3] = ti
                elif mode == 1:
                    t[e + 1] = xi; t[e + 2] = oi; t[e + 3] = ti
                else:
                    t[e + 1] = ti; t[e + 2] = xi; t[e + 3] = oi
                e += 4
    t[0] = (e - 16) >> 2
    vmacs(a, x, w, tb)


@micropython.viper
def dwk(acc, x, xz: int, g, w, b):
    pg = ptr32(g)
    if pg[3] != pg[2]:
        _V[2](acc, x, xz, g, w, b)
        return
    _bias(acc, b, pg[10] * pg[11], pg[2])
    _taps(acc, x, w, g, xz, 0)


@micropython.viper
def ddk(dx, dz, w, gm):
    pg = ptr32(gm)
    if pg[3] != pg[2]:
        _V[7](dx, dz, w, gm)
        return
    _zero(dx, pg[0] * pg[1] * pg[2])
    _taps(dx, dz, w, gm, 0, 1)


@micropython.viper
def dgk(g, dz, x, xz: int, gm):
    pg = ptr32(gm)
    if pg[3] != pg[2]:
        _V[8](g, dz, x, xz, gm)
        return
    _taps(g, x, dz, gm, xz, 2)


@micropython.viper
def rqk(acc, n: int, c: int, blk: int, mul, shf, out, zp: int, lo: int, hi: int,
        wide: int):
    p = ptr32(_Q)
    p[0] = n; p[1] = c; p[2] = blk; p[3] = int(ptr32(mul)); p[4] = int(ptr32(shf))
    p[5] = zp; p[6] = lo; p[7] = hi; p[8] = wide
    _rq(acc, out, _Q)
