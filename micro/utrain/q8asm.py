# q8kern's multiply-add kernels in inline Thumb assembler, for ARM boards (host_tools
# stages this module only for armv6m/armv7m firmware; q8kern imports it when present and
# keeps its viper kernels as the reference: the same integers, in the same int32 sums).
# Thumb-1 only (the RP2040's Cortex-M0+): the byte loads with a register offset (ldrsb,
# ldr/str reg) that MicroPython's assembler does not spell are written with data().
# Three loops do the multiply-adds, two a turn (vmacs four; dot2: dot over two rows at
# once, a weight loaded once for both); assembler and a little viper around them
# walk the geometry, one call per row of rows or more (an asm function takes 4 arguments:
# the rest go in a table, _P, offsets and addresses included, so no memoryview is made
# per call):
#   dot:  a[ao + r*O + o] = b[o] + sum_i<n (x[xo + r*xs + i] - c) * w[wo + o*n + i]
#   axpy: a[ao + r*as + j] += s[so + r*ss] * (x[xo + r*xs + j] - c)   (rows with s = 0 skipped),
#         for G groups whose a, x, s start ga, gx, gs further on ([9..12])
#   vmacs: a[ao + r*as + j] += (x[xo + r*xs + j] - c) * w[wo + r*ws + j] for each entry
#         (Y, R, ao, xo, wo) of a table: Y bands of R rows (a depthwise conv's taps, _T)
# (a int32, x w s int8; _P's words: R, n, O/as, c, xs, xo, wo/so, ao, ws/ss, then axpy's
# groups, scratch; dot's [13]: b's address, viper's int(ptr32(b))).  A conv's other
# shapes go through im2col rows of one output row (_gs gathers them, and adds their
# gradient back, col2im).  Sums wrap as int32 like the viper kernels': the same integers
# in any order.  A pointwise conv's rows go in threes through _dot3 (six sums, two
# output channels a turn, from an unsigned interleaved copy of the rows: _x3), and a
# streamed layer's input gradient through _da (two nonzero dz a turn).  Also in
# assembler: rqk (_rq: TFLite's requantization), upk (the int8 update; upek, with the
# rounding's error kept), stk, q8sparse's mask kernels, zeroing, and vmacs's fill of
# its sums first (the bias; zeros).
import micropython
from micropython import const
from array import array

_P = array('i', range(24))
_PB = bytearray(0)       # im2col rows (a conv's taps gathered per output pixel), grown on use
_PW = array('i', range(0))   # a run of pixels' int32 im2col-row gradients (cdk; <= 2 KB)
_T = array('i', range(24 + 5 * 9 + 9))   # vmacs's table (a 3x3 kernel's taps; grown on use)
_G = array('i', range(24))   # _gs's, _x3's and _dot3's
_ROWS = const(2048)      # _dots: bytes of input rows _x3 copies at a time (into _PB)
_Q = array('i', range(25))   # _rq's
_S = [None] * 16         # the depthwise kernels' tables per (geometry, mode) (_keep)
_V = None                # q8kern's viper dwk, ddk, dgk (for depthwise multipliers > 1), sumk


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
    lsr(r5, r4, 1)
    bcs(MAC)                 # n even: pairs from the top; odd: the last one first
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    data(2, 0x5716)          # ldrsb r6, [r2, r4]
    sub(r5, r5, r3)
    mul(r5, r6)
    add(r0, r0, r5)
    sub(r4, 1)
    bmi(ODONE)
    label(MAC)               # two multiply-adds a turn
    data(2, 0x570D)
    data(2, 0x5716)
    sub(r5, r5, r3)
    mul(r5, r6)
    add(r0, r0, r5)
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5716)
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
def dot2(r0, r1, r2, r3):
    # dot over pairs of rows: rows r and r + 1 of each output o at once, each weight
    # loaded once for both (3 loads for 2 multiply-adds, dot's 4; _P as dot's, [0] the
    # pairs; [15] r8 kept, [16] the pair's x, [17] o's weights).  r8 holds -c (added
    # with a high-register add: the inner loop uses all 8 low registers)
    mov(r7, r3)
    mov(r4, r8)
    str(r4, [r7, 60])        # [15] the caller's r8
    ldr(r4, [r7, 28])        # ao
    lsl(r4, r4, 2)
    add(r0, r0, r4)
    str(r0, [r7, 36])        # [9] a pointer (row r)
    ldr(r4, [r7, 20])
    add(r1, r1, r4)          # x + xo
    str(r1, [r7, 64])        # [16]
    ldr(r4, [r7, 24])
    add(r2, r2, r4)          # w + wo
    str(r2, [r7, 44])        # [11] w base
    ldr(r4, [r7, 12])
    neg(r4, r4)
    mov(r8, r4)              # -c
    ldr(r4, [r7, 8])
    cmp(r4, 0)
    ble(END)
    ldr(r4, [r7, 0])
    str(r4, [r7, 40])        # [10] pairs left
    cmp(r4, 0)
    ble(END)
    label(ROW)
    ldr(r4, [r7, 8])
    str(r4, [r7, 48])        # [12] outputs left
    ldr(r4, [r7, 52])
    str(r4, [r7, 56])        # [14] bias pointer = [13] bias
    ldr(r4, [r7, 44])
    str(r4, [r7, 68])        # [17] o's weights
    label(OUT)
    ldr(r6, [r7, 56])
    ldr(r0, [r6, 0])         # both sums start at the bias
    add(r6, 4)
    str(r6, [r7, 56])
    mov(r3, r0)
    ldr(r1, [r7, 64])        # row r
    ldr(r2, [r7, 68])
    ldr(r4, [r7, 4])         # n
    ldr(r5, [r7, 16])        # xs
    mov(r12, r7)
    add(r7, r1, r5)          # row r + 1
    sub(r4, 1)
    bmi(ODONE)
    lsr(r5, r4, 1)
    bcs(MAC)                 # n even: pairs of i from the top; odd: the last one first
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    data(2, 0x5716)          # ldrsb r6, [r2, r4]
    data(2, 0x4445)          # add r5, r8
    mul(r5, r6)
    add(r0, r0, r5)
    data(2, 0x573D)          # ldrsb r5, [r7, r4]
    data(2, 0x4445)
    mul(r5, r6)
    add(r3, r3, r5)
    sub(r4, 1)
    bmi(ODONE)
    label(MAC)               # i and i - 1 of both rows a turn
    data(2, 0x570D)
    data(2, 0x5716)
    data(2, 0x4445)
    mul(r5, r6)
    add(r0, r0, r5)
    data(2, 0x573D)
    data(2, 0x4445)
    mul(r5, r6)
    add(r3, r3, r5)
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5716)
    data(2, 0x4445)
    mul(r5, r6)
    add(r0, r0, r5)
    data(2, 0x573D)
    data(2, 0x4445)
    mul(r5, r6)
    add(r3, r3, r5)
    sub(r4, 1)
    bpl(MAC)
    label(ODONE)
    mov(r7, r12)
    ldr(r6, [r7, 36])
    str(r0, [r6, 0])         # row r's
    ldr(r4, [r7, 8])
    lsl(r4, r4, 2)
    add(r5, r6, r4)
    str(r3, [r5, 0])         # row r + 1's, O words on
    add(r6, 4)
    str(r6, [r7, 36])
    ldr(r2, [r7, 68])
    ldr(r4, [r7, 4])
    add(r2, r2, r4)
    str(r2, [r7, 68])
    ldr(r4, [r7, 48])
    sub(r4, 1)
    str(r4, [r7, 48])
    bgt(OUT)
    ldr(r6, [r7, 36])        # past row r + 1
    ldr(r4, [r7, 8])
    lsl(r4, r4, 2)
    add(r6, r6, r4)
    str(r6, [r7, 36])
    ldr(r1, [r7, 64])
    ldr(r4, [r7, 16])
    add(r1, r1, r4)
    add(r1, r1, r4)
    str(r1, [r7, 64])
    ldr(r4, [r7, 40])
    sub(r4, 1)
    str(r4, [r7, 40])
    bgt(ROW)
    label(END)
    ldr(r4, [r7, 60])
    mov(r8, r4)


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
    lsl(r6, r4, 2)
    add(r6, r6, r0)          # r6: &a[j]
    cmp(r3, 0)
    beq(Z)                   # c = 0 (gradients: x is w): the loop without the subtraction
    lsr(r5, r4, 1)
    bcs(JP)                  # n even: pairs from the top; odd: the last one first
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    sub(r5, r5, r3)
    mul(r5, r2)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 4)
    sub(r4, 1)
    bmi(JDONE)
    label(JP)
    sub(r6, 4)               # &a[j - 1]
    label(J)                 # two a turn: j and j - 1
    data(2, 0x570D)
    sub(r5, r5, r3)
    mul(r5, r2)
    ldr(r7, [r6, 4])
    add(r7, r7, r5)
    str(r7, [r6, 4])
    sub(r4, 1)
    data(2, 0x570D)
    sub(r5, r5, r3)
    mul(r5, r2)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 8)
    sub(r4, 1)
    bpl(J)
    b(JDONE)
    label(Z)
    lsr(r5, r4, 1)
    bcs(ZP)
    data(2, 0x570D)
    mul(r5, r2)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 4)
    sub(r4, 1)
    bmi(JDONE)
    label(ZP)
    sub(r6, 4)
    label(ZJ)
    data(2, 0x570D)
    mul(r5, r2)
    ldr(r7, [r6, 4])
    add(r7, r7, r5)
    str(r7, [r6, 4])
    sub(r4, 1)
    data(2, 0x570D)
    mul(r5, r2)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 8)
    sub(r4, 1)
    bpl(ZJ)
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
    # r3: the table t: [0] entries, [1] n, [2] as, [3] c, [4] xs, [5] ws (a row's steps;
    # a's in bytes), [6] ab, [7] xb, [8] wb (a band's), [9..19] scratch, entries (Y, R, ao, xo, wo) from
    # t[24]: Y bands of R rows each.  First, [22] > 0: a[r*n + j] = f[j] for [22] rows
    # r, f at the address [21] (a depthwise conv's bias), four words a turn when n is a
    # multiple of 4; [21] = 0: zeros; [23]: scratch
    mov(r7, r3)
    str(r0, [r7, 36])        # [9] a
    str(r1, [r7, 40])        # [10] x
    str(r2, [r7, 44])        # [11] w
    ldr(r2, [r7, 88])
    cmp(r2, 0)
    ble(FDONE)
    ldr(r3, [r7, 4])
    lsl(r3, r3, 2)           # a row's bytes
    mul(r2, r3)
    add(r2, r2, r0)          # a's end
    ldr(r1, [r7, 84])        # f
    cmp(r1, 0)
    beq(FZ0)                 # zeros
    add(r4, r1, r3)
    str(r4, [r7, 92])        # [23] f's end
    lsl(r4, r3, 28)
    bne(FW)                  # n not a multiple of 4: word by word
    mov(r12, r7)
    label(FQR)
    mov(r7, r12)
    ldr(r1, [r7, 84])
    ldr(r3, [r7, 92])
    label(FQ)
    data(2, 0xC9F0)          # ldmia r1!, {r4-r7}
    data(2, 0xC0F0)          # stmia r0!, {r4-r7}
    cmp(r1, r3)
    bcc(FQ)
    cmp(r0, r2)
    bcc(FQR)
    mov(r7, r12)
    b(FEND)
    label(FW)
    mov(r4, r3)
    label(FJ)
    sub(r4, 4)
    data(2, 0x590D)          # ldr r5, [r1, r4]
    data(2, 0x5105)          # str r5, [r0, r4]
    bne(FJ)
    add(r0, r0, r3)
    cmp(r0, r2)
    bcc(FW)
    b(FEND)
    label(FZ0)               # zeros, four words a store while 4 are left
    mov(r3, 0)
    mov(r4, 0)
    mov(r5, 0)
    mov(r6, 0)
    sub(r2, 16)
    label(FZ)
    cmp(r0, r2)
    bhi(FZT)
    data(2, 0xC078)          # stmia r0!, {r3, r4, r5, r6}
    b(FZ)
    label(FZT)
    add(r2, 16)
    label(FZ1)
    cmp(r0, r2)
    bcs(FEND)
    data(2, 0xC008)          # stmia r0!, {r3}
    b(FZ1)
    label(FEND)
    ldr(r0, [r7, 36])
    label(FDONE)
    ldr(r4, [r7, 0])
    str(r4, [r7, 52])        # [13] entries left
    cmp(r4, 0)
    bgt(GO)
    b(END)
    label(GO)
    mov(r4, r7)
    add(r4, 96)
    str(r4, [r7, 48])        # [12] entry pointer
    label(ENT)
    ldr(r6, [r7, 48])
    ldr(r4, [r6, 0])
    str(r4, [r7, 56])        # [14] bands left
    ldr(r4, [r6, 4])
    str(r4, [r7, 76])        # [19] rows a band
    ldr(r0, [r6, 8])
    lsl(r0, r0, 2)
    ldr(r4, [r7, 36])
    add(r0, r0, r4)
    str(r0, [r7, 64])        # [16] the band's a
    ldr(r1, [r6, 12])
    ldr(r4, [r7, 40])
    add(r1, r1, r4)
    str(r1, [r7, 68])        # [17] its x
    ldr(r2, [r6, 16])
    ldr(r4, [r7, 44])
    add(r2, r2, r4)
    str(r2, [r7, 72])        # [18] its w
    add(r6, 20)
    str(r6, [r7, 48])
    ldr(r3, [r7, 12])        # c
    ldr(r4, [r7, 56])
    cmp(r4, 0)
    bgt(BAND)
    b(EDONE)
    label(BAND)
    ldr(r4, [r7, 76])
    str(r4, [r7, 60])        # [15] rows left
    cmp(r4, 0)
    bgt(ROW)
    b(BDONE)
    label(ROW)
    ldr(r4, [r7, 4])
    mov(r12, r7)
    sub(r4, 1)
    bmi(JX)
    lsl(r6, r4, 2)
    add(r6, r6, r0)          # r6: &a[j]
    cmp(r3, 0)
    beq(ZL)                  # c = 0 (input gradients: x is dz): without the subtraction
    # j from the top: single ones until a multiple of 4 is left, then four a turn
    label(JL)
    add(r5, r4, 1)
    lsl(r5, r5, 30)          # values left a multiple of 4?
    beq(JQ)
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    data(2, 0x5717)          # ldrsb r7, [r2, r4]
    sub(r5, r5, r3)
    mul(r5, r7)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 4)
    sub(r4, 1)
    bmi(JX)
    b(JL)
    label(JQ)
    sub(r6, 12)              # &a[j - 3]
    label(J4)
    data(2, 0x570D)
    data(2, 0x5717)
    sub(r5, r5, r3)
    mul(r5, r7)
    ldr(r7, [r6, 12])
    add(r7, r7, r5)
    str(r7, [r6, 12])
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5717)
    sub(r5, r5, r3)
    mul(r5, r7)
    ldr(r7, [r6, 8])
    add(r7, r7, r5)
    str(r7, [r6, 8])
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5717)
    sub(r5, r5, r3)
    mul(r5, r7)
    ldr(r7, [r6, 4])
    add(r7, r7, r5)
    str(r7, [r6, 4])
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5717)
    sub(r5, r5, r3)
    mul(r5, r7)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 16)
    sub(r4, 1)
    bpl(J4)
    label(JX)
    b(JDONE)
    label(ZL)
    add(r5, r4, 1)
    lsl(r5, r5, 30)          # values left a multiple of 4?
    beq(ZQ)
    data(2, 0x570D)          # ldrsb r5, [r1, r4]
    data(2, 0x5717)          # ldrsb r7, [r2, r4]
    mul(r5, r7)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 4)
    sub(r4, 1)
    bmi(JDONE)
    b(ZL)
    label(ZQ)
    sub(r6, 12)              # &a[j - 3]
    label(Z4)
    data(2, 0x570D)
    data(2, 0x5717)
    mul(r5, r7)
    ldr(r7, [r6, 12])
    add(r7, r7, r5)
    str(r7, [r6, 12])
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5717)
    mul(r5, r7)
    ldr(r7, [r6, 8])
    add(r7, r7, r5)
    str(r7, [r6, 8])
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5717)
    mul(r5, r7)
    ldr(r7, [r6, 4])
    add(r7, r7, r5)
    str(r7, [r6, 4])
    sub(r4, 1)
    data(2, 0x570D)
    data(2, 0x5717)
    mul(r5, r7)
    ldr(r7, [r6, 0])
    add(r7, r7, r5)
    str(r7, [r6, 0])
    sub(r6, 16)
    sub(r4, 1)
    bpl(Z4)
    label(JDONE)
    mov(r7, r12)
    ldr(r4, [r7, 8])         # as (bytes)
    add(r0, r0, r4)
    ldr(r4, [r7, 16])        # xs
    add(r1, r1, r4)
    ldr(r4, [r7, 20])        # ws
    add(r2, r2, r4)
    ldr(r4, [r7, 60])
    sub(r4, 1)
    str(r4, [r7, 60])
    ble(BDONE)
    b(ROW)                   # (beyond a conditional branch's reach)
    label(BDONE)
    ldr(r4, [r7, 24])        # ab (bytes)
    ldr(r0, [r7, 64])
    add(r0, r0, r4)
    str(r0, [r7, 64])
    ldr(r4, [r7, 28])        # xb
    ldr(r1, [r7, 68])
    add(r1, r1, r4)
    str(r1, [r7, 68])
    ldr(r4, [r7, 32])        # wb
    ldr(r2, [r7, 72])
    add(r2, r2, r4)
    str(r2, [r7, 72])
    ldr(r4, [r7, 56])
    sub(r4, 1)
    str(r4, [r7, 56])
    ble(EDONE)
    b(BAND)
    label(EDONE)
    ldr(r4, [r7, 52])
    sub(r4, 1)
    str(r4, [r7, 52])
    ble(END)
    b(ENT)
    label(END)


@micropython.asm_thumb
def _rq(r0, r1, r2):
    # q8kern.rqk over the table r2 (_Q): [0] n, [1] c, [2] blk, [3] mul and [4] shf
    # addresses, [5] zp, [6] lo, [7] hi, [8] wide, [17] 1: channel by channel (blk 1,
    # value i's channel i mod c: its values c apart, its outputs [21] apart), else in
    # runs of blk (channel by run, cycling); r0 the int32 sums, r1 the output.  A run's
    # channel constants are made once ([18] left shift, [19], [20] the multiplier's
    # 16-bit halves, [22] right shift; [24] 2^30), then each value (~52 cycles; ~90-130
    # when a value's constants were looked up and a subroutine called for each; an int8
    # output of a <= 0 where [23] >= 0: lo, ~10): the 62-bit product |a| * m in
    # 16-bit halves (adds with carry), the nudge 2^30 (a >= 0) or 2^30 - 1, bits 31.. of
    # it (|x| < 2^31), the rounding division by 2^-shift on |x| (half up: ((2|x| >> e) +
    # 1) >> 1, unsigned; TFLite's half away from zero once the sign is put back): the
    # integers rqk's 15-bit limbs give.  r8 the run's end,
    # r9 / r10 the sums' / outputs' step, r11 lo, lr hi, r12 the output pointer;
    # [9]..[16] the walk's state
    mov(r7, r2)
    str(r0, [r7, 36])        # [9] sums
    str(r1, [r7, 40])        # [10] output
    mov(r4, r8)
    mov(r5, r9)
    mov(r6, r10)
    push({r4, r5, r6})
    mov(r4, r11)
    push({r4})
    mov(r4, 1)
    lsl(r4, r4, 30)
    str(r4, [r7, 96])        # [24] 2^30
    ldr(r4, [r7, 24])
    mov(r11, r4)             # lo
    ldr(r4, [r7, 28])
    data(2, 0x46A6)          # mov lr, r4: hi
    ldr(r4, [r7, 0])
    lsl(r4, r4, 2)
    add(r4, r4, r0)
    str(r4, [r7, 52])        # [13] the sums' end
    str(r0, [r7, 56])        # [14] the next run's sums (runs)
    str(r1, [r7, 60])        # [15] its output
    mov(r4, 0)
    str(r4, [r7, 44])        # [11] the next channel (channel by channel)
    str(r4, [r7, 48])        # [12] the run's channel (runs)
    mov(r5, 1)
    ldr(r4, [r7, 32])
    cmp(r4, 0)
    beq(OB)
    mov(r5, 4)
    label(OB)
    str(r5, [r7, 64])        # [16] bytes an output
    ldr(r4, [r7, 68])
    cmp(r4, 0)
    beq(SR)
    ldr(r4, [r7, 4])         # channel by channel: steps c values
    lsl(r6, r4, 2)
    mov(r9, r6)
    ldr(r4, [r7, 84])        # [21] the outputs' (c, or wide's rows)
    mul(r4, r5)
    mov(r10, r4)
    b(RUN)
    label(SR)
    mov(r6, 4)               # runs: steps one value
    mov(r9, r6)
    mov(r10, r5)
    label(RUN)
    ldr(r4, [r7, 68])
    cmp(r4, 0)
    beq(RR)
    ldr(r4, [r7, 44])        # channel r4: its values from sums + 4 r4 on, c apart
    ldr(r5, [r7, 4])
    cmp(r4, r5)
    blt(CG)
    b(FIN)
    label(CG)
    add(r5, r4, 1)
    str(r5, [r7, 44])
    lsl(r5, r4, 2)
    ldr(r0, [r7, 36])
    add(r0, r0, r5)
    ldr(r6, [r7, 52])
    cmp(r0, r6)
    bcs(RUN)                 # (a channel past the count: no value)
    mov(r8, r6)
    ldr(r5, [r7, 64])
    mul(r5, r4)
    ldr(r6, [r7, 40])
    add(r6, r6, r5)
    mov(r12, r6)
    b(SET)
    label(RR)
    ldr(r0, [r7, 56])        # the next run: blk values or the rest
    ldr(r6, [r7, 52])
    cmp(r0, r6)
    bcc(RG)
    b(FIN)
    label(RG)
    ldr(r5, [r7, 8])
    lsl(r5, r5, 2)
    add(r5, r0, r5)
    cmp(r5, r6)
    bls(RE)
    mov(r5, r6)
    label(RE)
    mov(r8, r5)
    str(r5, [r7, 56])
    ldr(r6, [r7, 60])
    mov(r12, r6)
    ldr(r4, [r7, 48])
    add(r5, r4, 1)           # the channel after this run's
    ldr(r6, [r7, 4])
    cmp(r5, r6)
    blt(RC)
    mov(r5, 0)
    label(RC)
    str(r5, [r7, 48])
    label(SET)               # channel r4's constants
    lsl(r4, r4, 2)
    ldr(r5, [r7, 12])
    data(2, 0x592D)          # ldr r5, [r5, r4]: m
    lsl(r6, r5, 16)
    lsr(r6, r6, 16)
    str(r6, [r7, 76])        # [19] m's low half
    lsr(r6, r5, 16)
    str(r6, [r7, 80])        # [20] its high half
    ldr(r5, [r7, 16])
    data(2, 0x592D)          # ldr r5, [r5, r4]: the shift
    mov(r6, 0)
    cmp(r5, 0)
    ble(L0)
    mov(r6, r5)
    label(L0)
    str(r6, [r7, 72])        # [18] left shift
    mov(r6, 0)
    cmp(r5, 0)
    bge(R0)
    neg(r6, r5)
    label(R0)
    str(r6, [r7, 88])        # [22] right shift
    ldr(r4, [r7, 32])
    cmp(r4, 0)
    beq(NL)
    b(WL)
    label(NL)                # int8 outputs
    ldr(r3, [r0, 0])
    data(2, 0x4448)          # add r0, r9
    ldr(r4, [r7, 72])
    lsl(r3, r4)
    cmp(r3, 0)
    bgt(NP)
    ldr(r4, [r7, 92])        # a <= 0 and [23] lo - zp >= 0: lo (no product), clamped
    cmp(r4, 0)
    blt(NP)
    mov(r4, r11)
    b(N2)
    label(NP)
    asr(r2, r3, 31)          # a's sign
    eor(r3, r2)
    sub(r3, r3, r2)          # |a|
    lsr(r4, r3, 16)          # ah
    data(2, 0xB29B)          # uxth r3, r3: al
    ldr(r5, [r7, 76])        # ml
    mov(r6, r5)
    mul(r5, r3)              # lo = al ml
    mul(r6, r4)              # ah ml
    ldr(r1, [r7, 80])        # mh
    mul(r3, r1)              # al mh
    mul(r4, r1)              # hi = ah mh
    add(r6, r6, r3)          # mid (< 2^32)
    lsl(r3, r6, 16)
    lsr(r6, r6, 16)
    add(r5, r5, r3)
    adc(r4, r6)
    ldr(r3, [r7, 96])
    add(r3, r3, r2)          # the nudge
    mov(r6, 0)
    add(r5, r5, r3)
    adc(r4, r6)
    lsl(r4, r4, 2)
    lsr(r5, r5, 31)
    lsl(r5, r5, 1)
    orr(r4, r5)              # 2 |x|, x: bits 31..62 (< 2^31)
    ldr(r5, [r7, 88])
    lsr(r4, r5)
    add(r4, 1)
    lsr(r4, r4, 1)           # ((2|x| >> e) + 1) >> 1: |x| / 2^e rounded half up
    eor(r4, r2)
    sub(r4, r4, r2)          # a's sign: TFLite's rounding, half away from zero
    ldr(r5, [r7, 20])
    add(r4, r4, r5)          # + zp, clamped to [lo, hi]
    data(2, 0x455C)          # cmp r4, r11
    bge(N2)
    mov(r4, r11)
    label(N2)
    data(2, 0x4574)          # cmp r4, lr
    ble(N3)
    data(2, 0x4674)          # mov r4, lr
    label(N3)
    mov(r1, r12)
    strb(r4, [r1, 0])
    data(2, 0x4451)          # add r1, r10
    mov(r12, r1)
    data(2, 0x4540)          # cmp r0, r8
    bcc(NL)
    b(NEXT)
    label(WL)                # int32 outputs
    ldr(r3, [r0, 0])
    data(2, 0x4448)          # add r0, r9
    ldr(r4, [r7, 72])
    lsl(r3, r4)
    asr(r2, r3, 31)
    eor(r3, r2)
    sub(r3, r3, r2)
    lsr(r4, r3, 16)
    data(2, 0xB29B)          # uxth r3, r3
    ldr(r5, [r7, 76])
    mov(r6, r5)
    mul(r5, r3)
    mul(r6, r4)
    ldr(r1, [r7, 80])
    mul(r3, r1)
    mul(r4, r1)
    add(r6, r6, r3)
    lsl(r3, r6, 16)
    lsr(r6, r6, 16)
    add(r5, r5, r3)
    adc(r4, r6)
    ldr(r3, [r7, 96])
    add(r3, r3, r2)
    mov(r6, 0)
    add(r5, r5, r3)
    adc(r4, r6)
    lsl(r4, r4, 2)
    lsr(r5, r5, 31)
    lsl(r5, r5, 1)
    orr(r4, r5)
    ldr(r5, [r7, 88])
    lsr(r4, r5)
    add(r4, 1)
    lsr(r4, r4, 1)
    eor(r4, r2)
    sub(r4, r4, r2)
    mov(r1, r12)
    str(r4, [r1, 0])
    data(2, 0x4451)          # add r1, r10
    mov(r12, r1)
    data(2, 0x4540)          # cmp r0, r8
    bcc(WL)
    label(NEXT)
    mov(r4, r12)
    str(r4, [r7, 60])        # (runs: the next run's output)
    b(RUN)
    label(FIN)
    pop({r4})
    mov(r11, r4)
    pop({r4, r5, r6})
    mov(r8, r4)
    mov(r9, r5)
    mov(r10, r6)


@micropython.asm_thumb
def _nz(r0, r1, r2):
    # out[i] = clamp(a[i] + zp, lo, hi) as bytes, in order (r0 a, r1 out, r2 _Q: [0] n,
    # [5] zp, [6] lo, [7] hi)
    ldr(r3, [r2, 0])
    cmp(r3, 0)
    ble(END)
    ldr(r4, [r2, 20])
    ldr(r5, [r2, 24])
    ldr(r6, [r2, 28])
    label(L)
    ldr(r7, [r0, 0])
    add(r0, 4)
    add(r7, r7, r4)
    cmp(r7, r5)
    bge(A)
    mov(r7, r5)
    label(A)
    cmp(r7, r6)
    ble(B)
    mov(r7, r6)
    label(B)
    strb(r7, [r1, 0])
    add(r1, 1)
    sub(r3, 1)
    bgt(L)
    label(END)


@micropython.asm_thumb
def _nr(r0, r1):
    # max |x[i]| over n int32 values (r0 x, r1 n; unsigned: -2^31's is 2^31, as on the
    # host); ~11 cycles a value for viper's ~100
    mov(r2, 0)
    cmp(r1, 0)
    ble(DONE)
    label(L)
    ldr(r3, [r0, 0])
    add(r0, 4)
    asr(r4, r3, 31)
    eor(r3, r4)
    sub(r3, r3, r4)
    cmp(r3, r2)
    bls(N)
    mov(r2, r3)
    label(N)
    sub(r1, 1)
    bgt(L)
    label(DONE)
    mov(r0, r2)


@micropython.viper
def nrk(x, n: int) -> int:
    # q8kern.nrk on _nr's loop
    m = int(_nr(x, n))
    k = 0
    while (m >> k) > 127:
        k += 1
    return k


@micropython.asm_thumb
def _ub(r0, r1, r2, r3):
    # q8kern.ubek (r0 b, r1 e, r2 d, r3 _Q: [0] n, [1] j, [2] 2^j / 2, [3] 2^31 - 1):
    # the same integers, ~30 cycles a bias for viper's ~260
    mov(r7, r3)
    ldr(r4, [r7, 0])
    cmp(r4, 0)
    ble(END)
    label(L)
    ldr(r4, [r2, 0])
    ldr(r5, [r7, 8])
    add(r4, r4, r5)
    ldr(r5, [r7, 4])
    asr(r4, r5)
    ldrb(r5, [r1, 0])
    data(2, 0xB26D)          # sxtb r5, r5
    add(r4, r4, r5)          # v
    mov(r5, r4)
    add(r5, 128)
    asr(r5, r5, 8)           # q
    lsl(r6, r5, 8)
    sub(r6, r4, r6)
    strb(r6, [r1, 0])        # the fraction kept
    cmp(r5, 0)
    beq(NX)
    ldr(r4, [r0, 0])         # u
    ldr(r6, [r7, 12])
    cmp(r5, 0)
    blt(NEG)
    sub(r6, r5, r6)          # q - mx
    cmp(r4, r6)
    bge(ST)
    mov(r4, r6)
    b(ST)
    label(NEG)
    add(r6, r6, r5)          # mx + q
    cmp(r4, r6)
    ble(ST)
    mov(r4, r6)
    label(ST)
    sub(r4, r4, r5)
    str(r4, [r0, 0])
    label(NX)
    add(r0, 4)
    add(r1, 1)
    add(r2, 4)
    ldr(r4, [r7, 0])
    sub(r4, 1)
    str(r4, [r7, 0])
    bgt(L)
    label(END)


@micropython.viper
def ubek(b, e, d, n: int, j: int):
    # q8kern.ubek on _ub's loop
    t = ptr32(_Q)
    t[0] = n
    t[1] = j
    t[2] = (1 << j) >> 1
    mx = 0x7fff
    t[3] = (mx << 16) | 0xffff
    _ub(b, e, d, _Q)


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


@micropython.asm_thumb
def upek(r0, r1, r2, r3):
    # q8kern.upek (w, e, d, p): the int8 update with the rounding's error kept, p = n, m,
    # sh, h (m 0: d as it is; else (d * m + h) >> sh)
    ldr(r7, [r3, 0])         # n
    cmp(r7, 0)
    ble(END)
    label(L)
    ldr(r4, [r2, 0])         # v = d[i]
    ldr(r5, [r3, 4])
    cmp(r5, 0)
    beq(SUM)
    mul(r4, r5)              # d * m
    ldr(r5, [r3, 12])
    add(r4, r4, r5)
    ldr(r5, [r3, 8])
    asr(r4, r5)              # v = (d * m + h) >> sh
    label(SUM)
    ldrb(r5, [r1, 0])
    data(2, 0xB26D)          # sxtb r5, r5: e[i]
    add(r4, r4, r5)          # t = v + e[i]
    mov(r5, r4)
    add(r5, 128)
    asr(r5, r5, 8)           # q = (t + 128) >> 8
    lsl(r6, r5, 8)
    sub(r6, r4, r6)
    strb(r6, [r1, 0])        # e[i] = t - (q << 8)
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
    add(r1, 1)
    add(r2, 4)
    sub(r7, 1)
    bgt(L)
    label(END)


@micropython.asm_thumb
def _mk(r0, r1, r2):
    # q8sparse.mkk's loop: bit i of m = 1 where lo < y[i] < hi, as u = y[i] - (lo + 1)
    # unsigned below hi - lo - 1; u signed at or above it (y at hi or above) counted. r2:
    # _Q, [9] y's end, [10] lo + 1, [11] hi - lo - 1; r8 (y's end) kept on the stack
    mov(r3, r8)
    push({r3})
    ldr(r3, [r2, 36])
    mov(r8, r3)
    ldr(r3, [r2, 40])
    ldr(r4, [r2, 44])
    mov(r5, 0)               # the count
    mov(r6, 0)               # the mask byte being made
    mov(r7, 1)               # its bit
    label(L)
    data(2, 0x4541)          # cmp r1, r8
    bcs(DONE)
    ldrb(r2, [r1, 0])
    add(r1, 1)
    data(2, 0xB252)          # sxtb r2, r2
    sub(r2, r2, r3)
    cmp(r2, r4)
    bcc(IN)
    blt(NEXT)
    add(r5, 1)
    b(NEXT)
    label(IN)
    orr(r6, r7)
    label(NEXT)
    lsl(r7, r7, 1)
    lsr(r2, r7, 8)
    beq(L)
    strb(r6, [r0, 0])
    add(r0, 1)
    mov(r6, 0)
    mov(r7, 1)
    b(L)
    label(DONE)
    cmp(r7, 1)
    beq(END)
    strb(r6, [r0, 0])        # the last, partial byte
    label(END)
    pop({r3})
    mov(r8, r3)
    mov(r0, r5)


@micropython.viper
def mkk(m, y, n: int, lo: int, hi: int) -> int:
    # q8sparse.mkk on _mk's loop (~15 cycles a value; viper's ~120 on the Cortex-M0+)
    p = ptr32(_Q)
    p[9] = int(ptr8(y)) + n; p[10] = lo + 1; p[11] = hi - lo - 1
    return int(_mk(m, y, _Q))


@micropython.asm_thumb
def _sm(r0, r1, r2, r3):
    # q8sparse.smc's loop: d[t] = int8 of x[q] / 2^k (half away from zero, +-127) where
    # bit i of mask m is set, else 0; P rows of c, i from o0 by O a row, q = i mod p.
    # r3: _Q, [9] k, [10] 2^k / 2, [11] p, [12] rows, [13] c, [14] O, [15] the row's i
    # (moves); r8 (a row's end in d) kept on the stack
    mov(r4, r8)
    push({r4})
    ldr(r4, [r3, 48])
    cmp(r4, 0)
    ble(END)
    label(ROW)
    ldr(r4, [r3, 60])        # i
    mov(r5, r4)              # q = i mod p
    ldr(r6, [r3, 44])
    label(MOD)
    cmp(r5, r6)
    blt(MODOK)
    sub(r5, r5, r6)
    b(MOD)
    label(MODOK)
    ldr(r6, [r3, 52])
    add(r6, r6, r0)
    mov(r8, r6)
    data(2, 0x4540)          # cmp r0, r8
    bcs(RNEXT)
    label(J)
    lsr(r6, r4, 3)
    data(2, 0x5D96)          # ldrb r6, [r2, r6]
    mov(r7, 7)
    and_(r7, r4)
    lsr(r6, r7)
    lsr(r6, r6, 1)           # bit i in the carry
    bcc(ZERO)
    lsl(r7, r5, 2)
    data(2, 0x59CF)          # ldr r7, [r1, r7]: x[q]
    ldr(r6, [r3, 40])        # 2^k / 2
    cmp(r7, 0)
    blt(NEG)
    add(r7, r7, r6)
    ldr(r6, [r3, 36])
    asr(r7, r6)
    b(CLAMP)
    label(NEG)
    sub(r7, r6, r7)
    ldr(r6, [r3, 36])
    asr(r7, r6)
    neg(r7, r7)
    label(CLAMP)
    cmp(r7, 127)
    ble(C1)
    mov(r7, 127)
    label(C1)
    mov(r6, r7)
    add(r6, 127)
    bpl(C2)
    mov(r7, 127)
    neg(r7, r7)
    label(C2)
    strb(r7, [r0, 0])
    b(NEXT)
    label(ZERO)
    mov(r7, 0)
    strb(r7, [r0, 0])
    label(NEXT)
    add(r0, 1)
    add(r4, 1)
    add(r5, 1)
    ldr(r6, [r3, 44])
    cmp(r5, r6)
    bne(NW)
    mov(r5, 0)
    label(NW)
    data(2, 0x4540)          # cmp r0, r8
    bcc(J)
    label(RNEXT)
    ldr(r4, [r3, 60])
    ldr(r6, [r3, 56])
    add(r4, r4, r6)
    str(r4, [r3, 60])
    ldr(r4, [r3, 48])
    sub(r4, 1)
    str(r4, [r3, 48])
    bgt(ROW)
    label(END)
    pop({r4})
    mov(r8, r4)


@micropython.viper
def smc(d, x, k: int, m, o0: int, c: int, O: int, P: int, p: int):
    # q8sparse.smc on _sm's loop
    t = ptr32(_Q)
    t[9] = k; t[10] = (1 << k) >> 1; t[11] = p; t[12] = P; t[13] = c; t[14] = O; t[15] = o0
    _sm(d, x, m, _Q)


@micropython.viper
def smk(d, x, n: int, k: int, m, p: int):
    # q8sparse.smk: smc's one row of n (q = i mod p; p 0: q = i)
    t = ptr32(_Q)
    t[9] = k; t[10] = (1 << k) >> 1; t[11] = p if p > 0 else n + 1; t[12] = 1; t[13] = n
    t[14] = n; t[15] = 0
    _sm(d, x, m, _Q)


@micropython.asm_thumb
def _sum(r0, r1, r2):
    # q8kern.sumk's loop: a[j] = sum_r<n x[r*c + j] - n*xz for j < c (int8 x); r2: _Q,
    # [9] n, [10] c, [11] n*xz (r12: _Q)
    mov(r12, r2)
    ldr(r4, [r2, 40])        # c: x's row step
    lsl(r3, r4, 2)
    add(r3, r3, r0)          # a's end
    cmp(r0, r3)
    bcs(END)
    label(COL)
    mov(r5, r12)
    ldr(r2, [r5, 36])        # n
    mov(r6, 0)
    mov(r7, r1)
    cmp(r2, 0)
    ble(CDONE)
    label(ROW)
    ldrb(r5, [r7, 0])
    data(2, 0xB26D)          # sxtb r5, r5
    add(r6, r6, r5)
    add(r7, r7, r4)
    sub(r2, 1)
    bgt(ROW)
    label(CDONE)
    mov(r5, r12)
    ldr(r5, [r5, 44])
    sub(r6, r6, r5)
    str(r6, [r0, 0])
    add(r0, 4)
    add(r1, 1)
    cmp(r0, r3)
    bcc(COL)
    label(END)


@micropython.viper
def sumk(acc, x, xz: int, n: int, c: int):
    # q8kern.sumk on _sum's loop
    p = ptr32(_Q)
    p[9] = n; p[10] = c; p[11] = n * xz
    _sum(acc, x, _Q)


def _buf(n):
    # the im2col rows, at least n bytes (kept: one per board, as big as the widest row)
    global _PB
    if len(_PB) < n:
        _PB = None
        _PB = bytearray(n)
    return _PB


def forget():
    # after a net's last call (utrain.q8 Q8Net.close): _P, _G and _Q hold the raw
    # addresses of the last kernels' buffers (a bias, the multipliers), which the
    # collector takes for pointers: a closed net's 5 KB sums and multipliers stayed,
    # in the middle of the heap the trainer loads into (the prefix pass pinned 15 KB on
    # the emulated Pico); zeroed, and the scratch grown on use dropped, with the
    # depthwise kernels' kept tables (vmacs's scratch in them: addresses too)
    global _PB, _PW, _T
    for t in (_P, _G, _Q, _T):
        for i in range(len(t)):
            t[i] = 0
    for i in range(len(_S)):
        _S[i] = None
    _PB = bytearray(0)
    _PW = array('i', range(0))
    if len(_T) > 24 + 5 * 9 + 9:
        _T = None
        _T = array('i', range(24 + 5 * 9 + 9))


def _wbuf(n):
    # cdk's int32 im2col-row gradients, at least n
    global _PW
    if len(_PW) < n:
        _PW = None
        _PW = array('i', range(n))
    return _PW


@micropython.asm_thumb
def _zero(r0, r1):
    # a[i] = 0 for n int32 values: (a, n), four words a store
    mov(r2, 0)
    mov(r3, 0)
    mov(r4, 0)
    mov(r5, 0)
    sub(r1, 4)
    bmi(TAIL)
    label(Q)
    data(2, 0xC03C)          # stmia r0!, {r2, r3, r4, r5}
    sub(r1, 4)
    bpl(Q)
    label(TAIL)
    add(r1, 4)               # 0..3 left
    ble(END)
    label(T)
    data(2, 0xC004)          # stmia r0!, {r2}
    sub(r1, 1)
    bgt(T)
    label(END)



@micropython.asm_thumb
def ack(r0, r1, r2):
    # q8kern.ack: a[i] += t for n int32 values (a, n, t)
    cmp(r1, 0)
    ble(END)
    label(L)
    ldr(r3, [r0, 0])
    add(r3, r3, r2)
    str(r3, [r0, 0])
    add(r0, 4)
    sub(r1, 1)
    bgt(L)
    label(END)


@micropython.asm_thumb
def gsk(r0, r1, r2, r3):
    # q8grow.gsk: s[i] -= e[o0 + i] for n int32 s, bytes e (s, e, o0, n)
    add(r1, r1, r2)
    cmp(r3, 0)
    ble(END)
    label(L)
    ldrb(r4, [r1, 0])
    ldr(r5, [r0, 0])
    sub(r5, r5, r4)
    str(r5, [r0, 0])
    add(r0, 4)
    add(r1, 1)
    sub(r3, 1)
    bgt(L)
    label(END)

@micropython.viper
def _pointwise(g) -> int:
    # 1: a 1x1 conv, stride 1, no padding (its input rows are its im2col rows)
    pg = ptr32(g)
    if (pg[4] == 1 and pg[5] == 1 and pg[6] == 1 and pg[7] == 1 and pg[8] == 0
            and pg[9] == 0 and pg[11] == pg[1]):
        return 1
    return 0


@micropython.asm_thumb
def _gs(r0, r1, r2):
    # a conv's walk over the taps of some output pixels of one output row, pixel by
    # pixel, tap row by tap row, kx by kx: r0 the im2col rows (KK per pixel), r1 the
    # image, r2 the table (_G): [0] pixels, [1] KW, [2] I, [3] z, [4] W, [5] sw, [6] ix
    # of the first pixel's kx = 0, [7] byte offset of its first tap row inside the image
    # (column 0), [8] tap rows inside, [9] elements before them, [10] after, [11] bytes
    # between tap rows, [12] e, [13] dw; scratch [14..18].  e = 0: gather (im2col: the
    # bytes, z for padding); e = 2: scatter (col2im: the int32 rows added into the image,
    # padding skipped)
    b(MAIN)
    label(FILL)              # r4 elements of padding
    ldr(r5, [r7, 48])
    cmp(r5, 0)
    bne(FSKIP)
    ldr(r5, [r7, 12])
    cmp(r4, 0)
    ble(FRET)
    label(FL)
    strb(r5, [r0, 0])
    add(r0, 1)
    sub(r4, 1)
    bgt(FL)
    label(FRET)
    bx(lr)
    label(FSKIP)
    lsl(r4, r4, 2)
    add(r0, r0, r4)
    bx(lr)
    label(COPY)              # r4 elements between r0 (the rows) and r6 (the image)
    ldr(r5, [r7, 48])
    cmp(r5, 0)
    bne(CADD)
    mov(r3, r4)
    b(CT)
    label(CL)
    data(2, 0x5D35)          # ldrb r5, [r6, r4]
    data(2, 0x5505)          # strb r5, [r0, r4]
    label(CT)
    sub(r4, 1)
    bpl(CL)
    add(r0, r0, r3)
    bx(lr)
    label(CADD)
    lsl(r4, r4, 2)
    mov(r3, r4)
    mov(r12, r2)
    b(AT)
    label(AL)
    data(2, 0x5905)          # ldr r5, [r0, r4]
    data(2, 0x5932)          # ldr r2, [r6, r4]
    add(r2, r2, r5)
    data(2, 0x5132)          # str r2, [r6, r4]
    label(AT)
    sub(r4, 4)
    bpl(AL)
    mov(r2, r12)
    add(r0, r0, r3)
    bx(lr)
    label(MAIN)
    mov(r7, r2)
    ldr(r4, [r7, 28])
    add(r1, r1, r4)          # the first tap row, column 0
    ldr(r4, [r7, 24])
    str(r4, [r7, 60])        # [15] ix
    ldr(r4, [r7, 0])
    str(r4, [r7, 56])        # [14] pixels left
    cmp(r4, 0)
    bgt(PIX)
    b(END)
    label(PIX)
    ldr(r4, [r7, 36])
    bl(FILL)                 # the tap rows above the image
    mov(r2, r1)
    ldr(r4, [r7, 32])
    str(r4, [r7, 64])        # [16] tap rows left
    cmp(r4, 0)
    ble(RDONE)
    label(ROW)
    ldr(r4, [r7, 60])
    str(r4, [r7, 72])        # [18] the tap's column
    ldr(r4, [r7, 4])
    str(r4, [r7, 68])        # [17] kx left
    label(KX)
    ldr(r3, [r7, 72])
    ldr(r4, [r7, 16])
    ldr(r5, [r7, 8])         # I
    cmp(r3, r4)
    bcs(PAD)                 # column < 0 or >= W (unsigned)
    mul(r3, r5)
    ldr(r6, [r7, 48])
    lsl(r3, r6)
    add(r6, r2, r3)
    mov(r4, r5)
    bl(COPY)
    b(KN)
    label(PAD)
    mov(r4, r5)
    bl(FILL)
    label(KN)
    ldr(r3, [r7, 72])
    ldr(r4, [r7, 52])        # dw
    add(r3, r3, r4)
    str(r3, [r7, 72])
    ldr(r4, [r7, 68])
    sub(r4, 1)
    str(r4, [r7, 68])
    bgt(KX)
    ldr(r4, [r7, 44])
    add(r2, r2, r4)          # the next tap row
    ldr(r4, [r7, 64])
    sub(r4, 1)
    str(r4, [r7, 64])
    bgt(ROW)
    label(RDONE)
    ldr(r4, [r7, 40])
    bl(FILL)                 # the tap rows below it
    ldr(r4, [r7, 60])
    ldr(r5, [r7, 20])
    add(r4, r4, r5)
    str(r4, [r7, 60])
    ldr(r4, [r7, 56])
    sub(r4, 1)
    str(r4, [r7, 56])
    bgt(PIX)
    label(END)


@micropython.viper
def _walk(a, x, g, oy: int, ox: int, m: int, z: int, e: int):
    # _gs over the m output pixels ox.. of output row oy of a conv (g as q8kern.convk's):
    # e = 0, a[p*KK + (ky*KW+kx)*I + i] = x[iy, ix, i] (z where the tap is padding);
    # e = 2, x[iy, ix, i] += a[p*KK + (ky*KW+kx)*I + i] (int32)
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; I = pg[2]; KH = pg[4]; KW = pg[5]
    iy = oy * pg[6] - pg[8]
    dh = pg[12]
    k0 = 0
    while k0 < KH and iy + k0 * dh < 0:
        k0 += 1
    k1 = k0
    while k1 < KH and iy + k1 * dh < H:
        k1 += 1
    t = ptr32(_G)
    t[0] = m; t[1] = KW; t[2] = I; t[3] = z; t[4] = W; t[5] = pg[7]
    t[6] = ox * pg[7] - pg[9]; t[7] = ((iy + k0 * dh) * W * I) << e; t[8] = k1 - k0
    t[9] = k0 * KW * I; t[10] = (KH - k1) * KW * I; t[11] = (W * I * dh) << e
    t[12] = e; t[13] = pg[13]
    _gs(a, x, _G)


@micropython.asm_thumb
def _x3(r0, r1, r2):
    # _dot3's input: the rows of positions in threes, interleaved, as unsigned bytes
    # (x + 128): d[g*3n + 3i + q] = x[(3g + q)*xs + i] ^ 0x80.  r2: _G, [0] rows (a
    # multiple of 3), [1] n, [2] xs, [3] q (0 on entry)
    mov(r7, r2)
    mov(r6, 0x80)
    ldr(r4, [r7, 0])
    cmp(r4, 0)
    ble(END)
    label(ROW)
    ldr(r4, [r7, 4])
    mov(r3, r0)
    mov(r2, 0)
    label(B)
    cmp(r2, r4)
    bge(BD)
    data(2, 0x5C8D)          # ldrb r5, [r1, r2]
    eor(r5, r6)
    strb(r5, [r3, 0])
    add(r3, 3)
    add(r2, 1)
    b(B)
    label(BD)
    ldr(r5, [r7, 8])
    add(r1, r1, r5)          # the next row
    ldr(r5, [r7, 12])
    add(r5, 1)
    cmp(r5, 3)
    blt(Q1)
    mov(r5, 0)
    lsl(r2, r4, 1)
    add(r2, r2, r4)
    sub(r2, 2)
    add(r0, r0, r2)          # the next three: 3n on from the first
    b(QD)
    label(Q1)
    add(r0, 1)
    label(QD)
    str(r5, [r7, 12])
    ldr(r4, [r7, 0])
    sub(r4, 1)
    str(r4, [r7, 0])
    bgt(ROW)
    label(END)


@micropython.asm_thumb
def _dot3(r0, r1, r2, r3):
    # dot over rows in threes, two output channels at a time: a[r*O + o] = b[o] +
    # sum_i (x[r, i] - c) * w[o*n + i] as sum_i u * w - (128 + c) * sum_i w, u = x + 128
    # the unsigned bytes _x3 interleaved (read with immediate offsets: no index), w
    # read signed (ldrsb) from two rows by one index; the six sums in r8..r12 and lr
    # (6 multiply-adds for 2 weight and 3 input loads, the third input multiplied into w0,
    # its last use: ~4.3 cycles a multiply-add, dot2's ~7; the weights' sums four a turn,
    # none for c = -128).  An odd last channel: both rows its own, stored twice at one
    # place.  r0 a, r1 the interleaved rows, r2 w, r3 the table (_G): [0] n, [1] O, [2] threes,
    # [3] 128 + c, [4] b's address; scratch [5..21] (r8..r11 kept in [17..20])
    mov(r7, r3)
    str(r0, [r7, 20])        # [5] a
    str(r1, [r7, 28])        # [7] the rows
    str(r2, [r7, 24])        # [6] w
    mov(r4, r8)
    str(r4, [r7, 68])
    mov(r4, r9)
    str(r4, [r7, 72])
    mov(r4, r10)
    str(r4, [r7, 76])
    mov(r4, r11)
    str(r4, [r7, 80])
    ldr(r4, [r7, 4])
    lsl(r4, r4, 2)
    str(r4, [r7, 84])        # [21] a row's bytes
    mov(r4, 0)
    str(r4, [r7, 32])        # [8] o
    label(OUT)
    ldr(r4, [r7, 32])
    ldr(r5, [r7, 4])
    cmp(r4, r5)
    blt(OGO)
    b(END)
    label(OGO)
    ldr(r6, [r7, 0])         # n
    mov(r3, r4)
    mul(r3, r6)
    ldr(r2, [r7, 24])
    add(r2, r2, r3)
    add(r2, r2, r6)          # the end of o's weights
    str(r2, [r7, 36])        # [9]
    add(r3, r4, 1)
    cmp(r3, r5)
    bge(ODD)
    add(r1, r2, r6)          # o + 1's
    mov(r5, 4)
    b(OSET)
    label(ODD)
    mov(r1, r2)              # o's again
    mov(r5, 0)
    label(OSET)
    str(r1, [r7, 40])        # [10]
    str(r5, [r7, 64])        # [16] the second channel's place: 4 bytes on, or the same
    neg(r3, r6)
    mov(r4, 0)
    mov(r5, 0)
    ldr(r0, [r7, 12])
    cmp(r0, 0)               # 128 + c = 0 (c = -128): u = x - c, no sums needed
    beq(SWD)
    cmp(r3, 0)
    beq(SWD)
    label(SW1)               # the weights' sums: one i at a time to a multiple of 4
    lsl(r0, r3, 30)
    beq(SW4)
    data(2, 0x56D0)          # ldrsb r0, [r2, r3]
    add(r4, r4, r0)
    data(2, 0x56C8)          # ldrsb r0, [r1, r3]
    add(r5, r5, r0)
    add(r3, 1)
    bne(SW1)
    b(SWD)
    label(SW4)               # then four a turn
    data(2, 0x56D0)          # ldrsb r0, [r2, r3]
    add(r4, r4, r0)
    data(2, 0x56C8)          # ldrsb r0, [r1, r3]
    add(r5, r5, r0)
    add(r3, 1)
    data(2, 0x56D0)
    add(r4, r4, r0)
    data(2, 0x56C8)
    add(r5, r5, r0)
    add(r3, 1)
    data(2, 0x56D0)
    add(r4, r4, r0)
    data(2, 0x56C8)
    add(r5, r5, r0)
    add(r3, 1)
    data(2, 0x56D0)
    add(r4, r4, r0)
    data(2, 0x56C8)
    add(r5, r5, r0)
    add(r3, 1)
    bne(SW4)
    label(SWD)
    ldr(r3, [r7, 12])        # 128 + c
    mul(r4, r3)
    mul(r5, r3)
    ldr(r0, [r7, 32])
    lsl(r0, r0, 2)
    ldr(r1, [r7, 16])
    add(r1, r1, r0)
    ldr(r0, [r1, 0])
    sub(r0, r0, r4)
    str(r0, [r7, 44])        # [11] o's start: b - (128 + c) * sum w
    ldr(r2, [r7, 64])
    data(2, 0x5888)          # ldr r0, [r1, r2]
    sub(r0, r0, r5)
    str(r0, [r7, 48])        # [12] the second's
    ldr(r4, [r7, 8])
    str(r4, [r7, 52])        # [13] threes left
    ldr(r4, [r7, 28])
    str(r4, [r7, 56])        # [14] their rows
    ldr(r4, [r7, 32])
    lsl(r4, r4, 2)
    ldr(r5, [r7, 20])
    add(r4, r4, r5)
    str(r4, [r7, 60])        # [15] &a[o] of the three's first row
    label(TRI)
    ldr(r4, [r7, 52])
    cmp(r4, 0)
    bgt(TGO)
    b(TDONE)
    label(TGO)
    ldr(r4, [r7, 44])
    mov(r8, r4)
    mov(r9, r4)
    mov(r10, r4)
    ldr(r4, [r7, 48])
    mov(r11, r4)
    mov(r12, r4)
    data(2, 0x46A6)          # mov lr, r4
    ldr(r0, [r7, 36])
    ldr(r1, [r7, 40])
    ldr(r3, [r7, 56])
    ldr(r2, [r7, 0])
    neg(r2, r2)              # i - n: up to 0
    push({r7})
    cmp(r2, 0)
    beq(IDONE)
    # one i at a time until a multiple of 4 are left, then four a turn
    label(I1)
    lsl(r7, r2, 30)
    beq(I4)
    data(2, 0x5684)          # ldrsb r4, [r0, r2]: w0
    data(2, 0x568D)          # ldrsb r5, [r1, r2]: w1
    ldrb(r6, [r3, 0])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B8)          # add r8, r7
    mul(r6, r5)
    data(2, 0x44B3)          # add r11, r6
    ldrb(r6, [r3, 1])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B9)          # add r9, r7
    mul(r6, r5)
    data(2, 0x44B4)          # add r12, r6
    ldrb(r6, [r3, 2])
    mul(r4, r6)              # w0's last use: x2 * w0 in r4
    data(2, 0x44A2)          # add r10, r4
    mul(r6, r5)
    data(2, 0x44B6)          # add lr, r6
    add(r3, 3)
    add(r2, 1)
    bne(I1)
    b(IDONE)
    label(I4)
    data(2, 0x5684)          # ldrsb r4, [r0, r2]: w0
    data(2, 0x568D)          # ldrsb r5, [r1, r2]: w1
    ldrb(r6, [r3, 0])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B8)          # add r8, r7
    mul(r6, r5)
    data(2, 0x44B3)          # add r11, r6
    ldrb(r6, [r3, 1])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B9)          # add r9, r7
    mul(r6, r5)
    data(2, 0x44B4)          # add r12, r6
    ldrb(r6, [r3, 2])
    mul(r4, r6)              # w0's last use: x2 * w0 in r4
    data(2, 0x44A2)          # add r10, r4
    mul(r6, r5)
    data(2, 0x44B6)          # add lr, r6
    add(r2, 1)
    data(2, 0x5684)
    data(2, 0x568D)
    ldrb(r6, [r3, 3])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B8)
    mul(r6, r5)
    data(2, 0x44B3)
    ldrb(r6, [r3, 4])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B9)
    mul(r6, r5)
    data(2, 0x44B4)
    ldrb(r6, [r3, 5])
    mul(r4, r6)
    data(2, 0x44A2)
    mul(r6, r5)
    data(2, 0x44B6)
    add(r2, 1)
    data(2, 0x5684)
    data(2, 0x568D)
    ldrb(r6, [r3, 6])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B8)
    mul(r6, r5)
    data(2, 0x44B3)
    ldrb(r6, [r3, 7])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B9)
    mul(r6, r5)
    data(2, 0x44B4)
    ldrb(r6, [r3, 8])
    mul(r4, r6)
    data(2, 0x44A2)
    mul(r6, r5)
    data(2, 0x44B6)
    add(r2, 1)
    data(2, 0x5684)
    data(2, 0x568D)
    ldrb(r6, [r3, 9])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B8)
    mul(r6, r5)
    data(2, 0x44B3)
    ldrb(r6, [r3, 10])
    mov(r7, r6)
    mul(r7, r4)
    data(2, 0x44B9)
    mul(r6, r5)
    data(2, 0x44B4)
    ldrb(r6, [r3, 11])
    mul(r4, r6)
    data(2, 0x44A2)
    mul(r6, r5)
    data(2, 0x44B6)
    add(r3, 12)
    add(r2, 1)
    bne(I4)
    label(IDONE)
    pop({r7})
    ldr(r0, [r7, 60])
    ldr(r1, [r7, 64])
    ldr(r2, [r7, 84])
    mov(r4, r8)
    str(r4, [r0, 0])
    mov(r4, r11)
    data(2, 0x5044)          # str r4, [r0, r1]
    add(r0, r0, r2)
    mov(r4, r9)
    str(r4, [r0, 0])
    mov(r4, r12)
    data(2, 0x5044)
    add(r0, r0, r2)
    mov(r4, r10)
    str(r4, [r0, 0])
    data(2, 0x4674)          # mov r4, lr
    data(2, 0x5044)
    add(r0, r0, r2)
    str(r0, [r7, 60])
    ldr(r4, [r7, 0])
    lsl(r5, r4, 1)
    add(r4, r4, r5)
    ldr(r5, [r7, 56])
    add(r5, r5, r4)
    str(r5, [r7, 56])        # the next three rows
    ldr(r4, [r7, 52])
    sub(r4, 1)
    str(r4, [r7, 52])
    b(TRI)
    label(TDONE)
    ldr(r4, [r7, 32])
    add(r4, 2)
    str(r4, [r7, 32])
    b(OUT)
    label(END)
    ldr(r4, [r7, 68])
    mov(r8, r4)
    ldr(r4, [r7, 72])
    mov(r9, r4)
    ldr(r4, [r7, 76])
    mov(r10, r4)
    ldr(r4, [r7, 80])
    mov(r11, r4)


@micropython.viper
def _dots(a, x, w, R: int):
    # dot over R rows (_P set as dot's but [0]): threes by _dot3 (from an interleaved
    # copy of their rows in _PB), the pair or row left by dot2 and dot
    p = ptr32(_P)
    G = R // 3
    if G > 0 and p[5] == 0 and p[6] == 0 and int(ptr8(x)) != int(ptr8(_PB)):
        n = p[1]
        xs = p[4]
        O = p[2]
        B = _ROWS // (3 * n)       # threes a turn: their copy within _ROWS bytes (one at least)
        if B < 1:
            B = 1
        if B > G:
            B = G
        pb = _buf(3 * B * n)
        xa = int(ptr8(x))
        aa = int(ptr32(a)) + 4 * p[7]
        t = ptr32(_G)
        R -= 3 * G
        while G > 0:
            g = B if B < G else G
            t[0] = 3 * g; t[1] = n; t[2] = xs; t[3] = 0
            _x3(pb, xa, _G)
            t[0] = n; t[1] = O; t[2] = g; t[3] = 128 + p[3]; t[4] = p[13]
            _dot3(aa, pb, w, _G)
            xa += 3 * g * xs
            aa += 12 * g * O
            G -= g
        p[5] = (xa - int(ptr8(x)))
        p[7] = (aa - int(ptr32(a))) >> 2
    if R > 1:
        p[0] = R >> 1
        dot2(a, x, w, _P)
    if R & 1:
        p[0] = 1
        p[5] = p[5] + (R - 1) * p[4]
        p[7] = p[7] + (R - 1) * p[2]
        dot(a, x, w, _P)


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
        p[7] = 0
        _dots(acc, x, w, OH * OW)
        return
    pb = _buf(OW * KK)
    for oy in range(OH):
        _walk(pb, x, g, oy, 0, OW, xz, 0)
        p[5] = 0; p[7] = oy * OW * O
        _dots(acc, pb, w, OW)


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
        _walk(pb, x, gm, oy, 0, OW, xz, 0)
        p[6] = oy * OW * O + lo
        axpy(g, pb, dz, _P)


@micropython.viper
def cdk(dx, dz, w, gm):
    # per run of up to m output pixels of a row: their int32 im2col rows' gradients
    # (the rows of w times dz, one group per pixel), then added into dx (col2im)
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
    m = 512 // KK             # pixels a run (2 KB of int32 rows), at least 1
    if m < 1:
        m = 1
    if m > OW:
        m = OW
    pw = _wbuf(m * KK)          # (q8.cdn's size: made with the net)
    p[7] = 0; p[10] = KK; p[11] = 0; p[12] = O
    for oy in range(OH):
        ox = 0
        while ox < OW:
            k = OW - ox
            if k > m:
                k = m
            _zero(pw, k * KK)
            p[6] = (oy * OW + ox) * O; p[9] = k
            axpy(pw, w, dz, _P)
            _walk(pw, dx, gm, oy, ox, k, 0, 2)
            ox += k


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


@micropython.asm_thumb
def _da(r0, r1, r2, r3):
    # q8sparse.dak: for each position, its nonzero dz two at a time: dx[i] += za *
    # wa[i] + zb * wb[i], each dx value loaded and stored once for two multiply-adds
    # (~6.5 cycles one; axpy's ~11 with its loop), a last odd one alone.  r3: _G, [0] P,
    # [1] m, [2] O, [3] I, [4] o0; scratch [5..14]
    mov(r7, r3)
    str(r0, [r7, 48])        # [12] dx
    str(r1, [r7, 52])        # [13] dz
    str(r2, [r7, 44])        # [11] w
    mov(r4, 0)
    str(r4, [r7, 20])        # [5] p
    label(POS)
    ldr(r4, [r7, 20])
    ldr(r5, [r7, 0])
    cmp(r4, r5)
    blt(PGO)
    b(END)
    label(PGO)
    ldr(r5, [r7, 8])
    mov(r6, r4)
    mul(r6, r5)
    ldr(r5, [r7, 16])
    add(r6, r6, r5)
    ldr(r5, [r7, 52])
    add(r6, r6, r5)
    str(r6, [r7, 24])        # [6] the next dz
    str(r6, [r7, 56])        # [14] the position's first
    ldr(r5, [r7, 4])
    add(r5, r5, r6)
    str(r5, [r7, 28])        # [7] its end
    ldr(r5, [r7, 12])
    mov(r6, r4)
    mul(r6, r5)
    lsl(r6, r6, 2)
    ldr(r5, [r7, 48])
    add(r6, r6, r5)
    str(r6, [r7, 32])        # [8] its dx
    add(r4, 1)
    str(r4, [r7, 20])
    mov(r4, 0)
    str(r4, [r7, 36])        # [9] a channel waiting (its weights' end), none
    label(SCAN)
    ldr(r6, [r7, 24])
    ldr(r5, [r7, 28])
    label(SC)
    cmp(r6, r5)
    bcs(SEND)
    ldrb(r4, [r6, 0])
    add(r6, 1)
    data(2, 0xB264)          # sxtb r4, r4
    cmp(r4, 0)
    beq(SC)
    str(r6, [r7, 24])
    ldr(r5, [r7, 56])
    sub(r5, r6, r5)          # j + 1
    ldr(r3, [r7, 12])
    mul(r5, r3)
    ldr(r3, [r7, 44])
    add(r5, r5, r3)          # the end of j's weights
    ldr(r3, [r7, 36])
    cmp(r3, 0)
    bne(PAIR)
    str(r5, [r7, 36])
    str(r4, [r7, 40])        # [10] its dz
    b(SCAN)
    label(PAIR)
    mov(r2, r3)
    mov(r3, r5)
    mov(r5, r4)
    ldr(r4, [r7, 40])
    mov(r6, 0)
    str(r6, [r7, 36])
    ldr(r0, [r7, 32])
    ldr(r1, [r7, 12])
    neg(r1, r1)              # i - I: up to 0
    push({r7})
    cmp(r1, 0)
    beq(PD)
    label(P1)
    lsl(r6, r1, 30)
    beq(P4)
    ldr(r6, [r0, 0])
    data(2, 0x5657)          # ldrsb r7, [r2, r1]
    mul(r7, r4)
    add(r6, r6, r7)
    data(2, 0x565F)          # ldrsb r7, [r3, r1]
    mul(r7, r5)
    add(r6, r6, r7)
    str(r6, [r0, 0])
    add(r0, 4)
    add(r1, 1)
    bne(P1)
    b(PD)
    label(P4)
    ldr(r6, [r0, 0])
    data(2, 0x5657)          # ldrsb r7, [r2, r1]
    mul(r7, r4)
    add(r6, r6, r7)
    data(2, 0x565F)          # ldrsb r7, [r3, r1]
    mul(r7, r5)
    add(r6, r6, r7)
    str(r6, [r0, 0])
    add(r1, 1)
    ldr(r6, [r0, 4])
    data(2, 0x5657)
    mul(r7, r4)
    add(r6, r6, r7)
    data(2, 0x565F)
    mul(r7, r5)
    add(r6, r6, r7)
    str(r6, [r0, 4])
    add(r1, 1)
    ldr(r6, [r0, 8])
    data(2, 0x5657)
    mul(r7, r4)
    add(r6, r6, r7)
    data(2, 0x565F)
    mul(r7, r5)
    add(r6, r6, r7)
    str(r6, [r0, 8])
    add(r1, 1)
    ldr(r6, [r0, 12])
    data(2, 0x5657)
    mul(r7, r4)
    add(r6, r6, r7)
    data(2, 0x565F)
    mul(r7, r5)
    add(r6, r6, r7)
    str(r6, [r0, 12])
    add(r0, 16)
    add(r1, 1)
    bne(P4)
    label(PD)
    pop({r7})
    b(SCAN)
    label(SEND)
    ldr(r2, [r7, 36])
    cmp(r2, 0)
    bne(SGO)
    b(POS)
    label(SGO)
    ldr(r4, [r7, 40])
    ldr(r0, [r7, 32])
    ldr(r1, [r7, 12])
    neg(r1, r1)
    push({r7})
    cmp(r1, 0)
    beq(SD)
    label(S1)
    ldr(r6, [r0, 0])
    data(2, 0x5657)          # ldrsb r7, [r2, r1]
    mul(r7, r4)
    add(r6, r6, r7)
    str(r6, [r0, 0])
    add(r0, 4)
    add(r1, 1)
    bne(S1)
    label(SD)
    pop({r7})
    b(POS)
    label(END)


@micropython.asm_thumb
def _st(r0, r1, r2):
    # q8kern.stk's loop: r0 y + yo, r1 src, r2 _G: [0] rows, [1] c, [2] ys
    ldr(r3, [r2, 0])
    cmp(r3, 0)
    ble(END)
    ldr(r6, [r2, 4])
    ldr(r7, [r2, 8])
    label(ROW)
    mov(r4, r6)
    b(T)
    label(J)
    data(2, 0x5D0D)          # ldrb r5, [r1, r4]
    data(2, 0x5505)          # strb r5, [r0, r4]
    label(T)
    sub(r4, 1)
    bpl(J)
    add(r1, r1, r6)
    add(r0, r0, r7)
    sub(r3, 1)
    bgt(ROW)
    label(END)


@micropython.viper
def stk(y, yo: int, ys: int, src, n: int, c: int):
    # q8kern.stk on _st's loop (~7 cycles a byte; viper's ~35)
    t = ptr32(_G)
    t[0] = n; t[1] = c; t[2] = ys
    _st(int(ptr8(y)) + yo, src, _G)


@micropython.asm_thumb
def _sb(r0, r1, r2, r3):
    # q8sparse.smb's loop: s[o] = the int8 of x[o] / 2^k (half away from zero, +-127)
    # times the set bits r*O + o (r < P) of mask m.  r0 s, r1 x, r2 m, r3 _G: [0] O, [1]
    # P, [2] k, [3] 2^k / 2; [4] o, [5] s (scratch); r12 O
    mov(r7, r3)
    str(r0, [r7, 20])
    ldr(r4, [r7, 0])
    mov(r12, r4)
    mov(r4, 0)
    str(r4, [r7, 16])
    label(OUT)
    ldr(r4, [r7, 16])        # o
    ldr(r5, [r7, 0])
    cmp(r4, r5)
    bge(END)
    mov(r5, 0)               # the count
    ldr(r6, [r7, 4])         # rows left
    cmp(r6, 0)
    ble(CD)
    label(C)
    lsr(r3, r4, 3)
    data(2, 0x5CD3)          # ldrb r3, [r2, r3]
    mov(r0, 7)
    and_(r0, r4)
    lsr(r3, r0)
    lsl(r3, r3, 31)
    lsr(r3, r3, 31)
    add(r5, r5, r3)
    data(2, 0x4464)          # add r4, r12
    sub(r6, 1)
    bne(C)
    label(CD)
    ldr(r4, [r7, 16])
    lsl(r3, r4, 2)
    add(r4, 1)
    str(r4, [r7, 16])
    mov(r0, 0)
    cmp(r5, 0)
    beq(ST)
    data(2, 0x58C8)          # ldr r0, [r1, r3]: x[o]
    ldr(r6, [r7, 12])        # 2^k / 2
    ldr(r4, [r7, 8])         # k
    cmp(r0, 0)
    blt(NEG)
    add(r0, r0, r6)
    asr(r0, r4)
    b(CL)
    label(NEG)
    sub(r0, r6, r0)
    asr(r0, r4)
    neg(r0, r0)
    label(CL)
    cmp(r0, 127)
    ble(C1)
    mov(r0, 127)
    label(C1)
    mov(r6, r0)
    add(r6, 127)
    bpl(C2)
    mov(r0, 127)
    neg(r0, r0)
    label(C2)
    mul(r0, r5)
    label(ST)
    ldr(r6, [r7, 20])
    data(2, 0x50F0)          # str r0, [r6, r3]
    b(OUT)
    label(END)


@micropython.viper
def smb(s, x, k: int, m, O: int, P: int):
    # q8sparse.smb on _sb's loop (~15 cycles a mask bit; viper's ~80)
    t = ptr32(_G)
    t[0] = O; t[1] = P; t[2] = k; t[3] = (1 << k) >> 1
    _sb(s, x, m, _G)


@micropython.viper
def dak(dx, dz, w, o0: int, m: int, O: int, P: int, I: int):
    # q8sparse.dak on _da's loop: dx[p*I + i] += sum_j dz[p*O + o0 + j] * w[j*I + i]
    t = ptr32(_G)
    t[0] = P; t[1] = m; t[2] = O; t[3] = I; t[4] = o0
    _da(dx, dz, w, _G)


@micropython.asm_thumb
def _fl(r0, r1, r2):
    # q8sparse.flk (dz, m, P > 0): a channel (column) at a time, its P bytes m apart
    # counted, the shared row's byte after them (P m on) set, the column flipped where
    # more than (P + 1) / 2 are nonzero (-e: the low byte of 0 - the byte)
    cmp(r1, 0)
    beq(END)
    add(r3, r0, r1)
    mov(r12, r3)             # the first row's end
    label(COL)
    mov(r3, r0)
    mov(r7, r2)
    mov(r4, 0)               # nonzero ones
    mov(r5, 0)               # their byte
    label(SC)
    ldrb(r6, [r3, 0])
    cmp(r6, 0)
    beq(Z)
    add(r4, 1)
    mov(r5, r6)
    label(Z)
    add(r3, r3, r1)
    sub(r7, 1)
    bne(SC)
    lsl(r4, r4, 1)
    add(r7, r2, 1)
    cmp(r4, r7)
    ble(KEEP)
    strb(r5, [r3, 0])        # the shared row: e
    neg(r5, r5)
    mov(r3, r0)
    mov(r7, r2)
    label(FL)
    ldrb(r6, [r3, 0])
    cmp(r6, 0)
    bne(F0)
    strb(r5, [r3, 0])
    b(FN)
    label(F0)
    mov(r6, 0)
    strb(r6, [r3, 0])
    label(FN)
    add(r3, r3, r1)
    sub(r7, 1)
    bne(FL)
    b(NX)
    label(KEEP)
    mov(r6, 0)
    strb(r6, [r3, 0])
    label(NX)
    add(r0, 1)
    data(2, 0x4560)          # cmp r0, r12
    bcc(COL)
    label(END)


@micropython.viper
def flk(dz, m: int, P: int):
    # q8sparse.flk on _fl's loop (~10 cycles a byte a pass; viper's ~80)
    if P > 0:
        _fl(dz, m, P)



@micropython.asm_thumb
def c7n(r0, r1, r2):
    # q8grow.c7n: the +-127 bytes (127, 129 unsigned) of r1[0] channels of r1[1] bytes,
    # r1[2] apart in a channel, channels r1[3] apart, from r0: each channel's count (at
    # most 255) into the bytes r2, returns the total (~11 cycles a byte; viper's ~90).
    # r1: an int32 table, [4] and [5] scratch
    mov(r7, r1)
    str(r2, [r7, 16])        # [4] the next count's place
    ldr(r2, [r7, 8])         # the stride in a channel
    mov(r6, 0)               # the total
    ldr(r3, [r7, 0])         # channels left
    label(CH)
    cmp(r3, 0)
    ble(END)
    str(r0, [r7, 20])        # [5] this channel's first
    ldr(r4, [r7, 4])         # bytes left
    mov(r1, 0)
    cmp(r4, 0)
    ble(BD)
    label(B)
    ldrb(r5, [r0, 0])
    add(r0, r0, r2)
    cmp(r5, 127)
    beq(HIT)
    cmp(r5, 129)
    bne(NX)
    label(HIT)
    add(r1, 1)
    label(NX)
    sub(r4, 1)
    bgt(B)
    label(BD)
    add(r6, r6, r1)
    cmp(r1, 255)
    ble(CAP)
    mov(r1, 255)
    label(CAP)
    ldr(r5, [r7, 16])
    strb(r1, [r5, 0])
    add(r5, 1)
    str(r5, [r7, 16])
    ldr(r0, [r7, 20])
    ldr(r5, [r7, 12])
    add(r0, r0, r5)
    sub(r3, 1)
    b(CH)
    label(END)
    mov(r0, r6)

def _table(n, kw):
    # vmacs's table for n entries, and _build's kx ranges (3 words per kx) after them
    global _T
    if len(_T) < 24 + 5 * n + 3 * kw:
        _T = None
        _T = array('i', range(24 + 5 * n + 3 * kw))
    return _T


def _keep(h, g, mode):
    # a copy of the table _build left in _T, kept in _S's slot h (16 slots, heap: ~340
    # bytes a table for a 3x3 kernel): [20] where the geometry g and the mode (what _tab
    # checks a hit against) follow the entries.  A slot taken: _T is used as is
    t = _T
    if _S[h] is not None:
        return t
    m = 24 + 5 * t[0]
    c = array('i', range(m + 15))
    for i in range(m):
        c[i] = t[i]
    for i in range(14):
        c[m + i] = g[i]
    c[m + 14] = mode
    c[20] = m
    _S[h] = c
    return c


@micropython.viper
def _tab(g, mode: int):
    # the depthwise kernels (multiplier 1) make one vmacs call: an entry per tap (ky, kx)
    # over the block of outputs (oy, ox) whose input is inside the image (bands oy, rows
    # ox, the channels contiguous).  mode 0: forward (a: sums [OH, OW, C], x: input,
    # w: weights); 1: input gradient (a: dx [H, W, C], x: dz, w: weights);
    # 2: weight gradient (a: g [KH, KW, C], x: input, w: dz).  A layer's shape does not
    # change between steps: the table of each (geometry, mode) is built once (_build)
    # and kept (_keep), looked up by a hash of the geometry's 14 words and checked.  The
    # kernel sets its [3] (the zero point) and vmacs's fill ([21], [22]).
    pg = ptr32(g)
    h = int(pg[0] * 5 + pg[1] * 3 + pg[2] + pg[8] * 7 + pg[10] * 11) + mode
    h = (h ^ (h >> 4)) & 15      # (the slot; a hit is checked on all 14 words)
    tb = _S[h]
    if tb:
        t = ptr32(tb)
        o = t[20]
        if int(t[o + 14]) == mode:
            i = 13
            while t[o + i] == pg[i]:
                i -= 1
                if i < 0:
                    return tb
    _build(g, mode)
    return _keep(h, g, mode)


@micropython.viper
def _build(g, mode: int):
    # _tab's table for geometry g and mode, in _T
    pg = ptr32(g)
    H = pg[0]; W = pg[1]; C = pg[2]; KH = pg[4]; KW = pg[5]
    sh = pg[6]; sw = pg[7]; ph = pg[8]; pw_ = pg[9]; OH = pg[10]; OW = pg[11]
    dh = pg[12]; dw = pg[13]
    tb = _T
    if KH * KW > 9 or KW > 3:
        tb = _table(KH * KW, KW)
    t = ptr32(tb)
    t[1] = C
    r = sw * C                   # steps of a row (ox) and a band (oy) in the image
    b = sh * W * C
    if mode == 0:                # (a's steps in bytes)
        t[2] = C * 4; t[4] = r; t[5] = 0; t[6] = OW * C * 4; t[7] = b; t[8] = 0
        io = 2; ix = 3; iw = 4   # where the output's, input's, weight's offsets go
    elif mode == 1:
        t[2] = r * 4; t[4] = C; t[5] = 0; t[6] = b * 4; t[7] = OW * C; t[8] = 0
        io = 3; ix = 2; iw = 4
    else:
        t[2] = 0; t[4] = r; t[5] = C; t[6] = 0; t[7] = b; t[8] = OW * C
        io = 4; ix = 3; iw = 2
    k = 24 + 5 * KH * KW         # the outputs ox whose input column is inside, per kx
    for kx in range(KW):
        off = kx * dw - pw_
        x0 = 0
        while x0 < OW and x0 * sw + off < 0:
            x0 += 1
        x1 = OW
        while x1 > x0 and (x1 - 1) * sw + off >= W:
            x1 -= 1
        t[k] = x0; t[k + 1] = x1 - x0; t[k + 2] = x0 * sw + off
        k += 3
    e = 24
    n = 0
    for ky in range(KH):
        off = ky * dh - ph
        y0 = 0
        while y0 < OH and y0 * sh + off < 0:
            y0 += 1
        y1 = OH
        while y1 > y0 and (y1 - 1) * sh + off >= H:
            y1 -= 1
        if y1 <= y0:
            continue
        k = 24 + 5 * KH * KW
        xb = (y0 * sh + off) * W
        ob = y0 * OW
        tw = ky * KW * C
        for kx in range(KW):
            if t[k + 1] > 0:
                t[e] = y1 - y0; t[e + 1] = t[k + 1]
                t[e + ix] = (xb + t[k + 2]) * C           # the input's
                t[e + io] = (ob + t[k]) * C               # the output's
                t[e + iw] = tw + kx * C                   # the weight's
                e += 5
                n += 1
            k += 3
    t[0] = n


@micropython.viper
def dwk(acc, x, xz: int, g, w, b):
    pg = ptr32(g)
    if pg[3] != pg[2]:
        _V[0](acc, x, xz, g, w, b)
        return
    tb = _tab(g, 0)
    t = ptr32(tb)
    t[3] = xz
    t[21] = int(ptr32(b))        # the sums start at the bias
    t[22] = pg[10] * pg[11]
    vmacs(acc, x, w, tb)


@micropython.viper
def ddk(dx, dz, w, gm):
    pg = ptr32(gm)
    if pg[3] != pg[2]:
        _V[1](dx, dz, w, gm)
        return
    tb = _tab(gm, 1)
    t = ptr32(tb)
    t[3] = 0
    t[21] = 0                    # dx starts at zeros
    t[22] = pg[0] * pg[1]
    vmacs(dx, dz, w, tb)


@micropython.viper
def dgk(g, dz, x, xz: int, gm):
    pg = ptr32(gm)
    if pg[3] != pg[2]:
        _V[2](g, dz, x, xz, gm)
        return
    tb = _tab(gm, 2)
    t = ptr32(tb)
    t[3] = xz
    t[22] = 0
    vmacs(g, x, dz, tb)


@micropython.viper
def rqk(acc, n: int, c: int, blk: int, mul, shf, out, zp: int, lo: int, hi: int,
        wide: int):
    p = ptr32(_Q)
    p[0] = n; p[1] = c; p[2] = blk; p[3] = int(ptr32(mul)); p[4] = int(ptr32(shf))
    p[5] = zp; p[6] = lo; p[7] = hi; p[8] = wide
    p[21] = c
    if wide > 1:        # (int8 outputs in rows wide apart)
        p[8] = 0
        p[21] = wide
    # [23] lo - zp >= 0: a sum <= 0 gives lo (a ReLU's: a positive multiplier's rounded
    # product of it is <= 0, zp + it <= lo), its product skipped (~40 cycles of ~52)
    p[23] = lo - zp
    a = int(ptr32(acc))
    o = int(ptr8(out))
    # one multiplier a value (blk 1), or one for all (c 1: a per-tensor scale, runs of any
    # blk): channel by channel, unless bytes written over sums not read yet (an int8
    # output inside the sums)
    p[17] = 1 if (blk == 1 or c == 1) and (wide or o >= a + 4 * n or o + n <= a) else 0
    if blk == 1 and p[17] == 0:
        # int8 outputs over the sums (a chunk's, q8.Layer.conv): channel by channel
        # into the sums themselves (int32), then the zero point, clamp and bytes in order
        # (each sum read before a byte lands on it): the same bytes as value by value,
        # whose channel constants were made again for each value (~130 cycles a value)
        p[8] = 1
        p[17] = 1
        _rq(acc, acc, _Q)
        p[8] = 0
        _nz(acc, out, _Q)
        return
    _rq(acc, out, _Q)
