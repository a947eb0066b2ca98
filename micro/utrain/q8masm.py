# SGD momentum's int16 velocity step (utrain.q8mom's vmk) in inline Thumb assembler, for
# ARM boards (host_tools stages it for armv6m/armv7m firmware alone; q8mom imports it
# when q8asm is there and keeps its viper vmk as the reference, q8mom.V): the same
# integers, ~60 cycles a velocity on the emulated Pico (its call included) for viper's
# ~260.  Loaded only with --momentum.
import micropython
from array import array

# mu, state, n, the LCG's a, clamps, d's dither h and shift sh
_T = array('i', [0, 0, 0, 69069, 32767, 65535, 0, 0])


@micropython.asm_thumb
def _vm(r0, r1, r2):
    # r0 v (int16), r1 d (int32), r2 _T.  v[i] = clamp(mu v + d[i]) (+-32767), d[i] =
    # v[i]; mu v = (v mu) >> 15, plus 1 when its low 15 bits exceed bits 12..26 of the
    # LCG's next state (s = (69069 s + 1) mod 2^30, drawn when v mu != 0).  d[i] is
    # taken as (d[i] + h) >> sh, then clamped to +-65535 before the add (|mu v| <= 2^15:
    # the same result, no int32 wrap)
    ldr(r3, [r2, 8])         # n
    cmp(r3, 0)
    ble(END)
    mov(r12, r2)
    ldr(r5, [r2, 4])         # s
    label(LOOP)
    ldrh(r4, [r0, 0])
    lsl(r4, r4, 16)
    asr(r4, r4, 16)          # v (signed)
    mov(r7, r12)
    ldr(r6, [r7, 0])
    mul(r4, r6)              # t = v mu, |t| <= 2^30
    mov(r6, 0)               # q
    cmp(r4, 0)
    beq(ADD)
    ldr(r6, [r7, 12])
    mul(r5, r6)
    add(r5, 1)
    lsl(r5, r5, 2)
    lsr(r5, r5, 2)           # s = (69069 s + 1) mod 2^30
    lsl(r7, r5, 5)
    lsr(r7, r7, 17)          # (s >> 12) & 0x7fff
    lsl(r6, r4, 17)
    lsr(r6, r6, 17)          # t & 0x7fff
    asr(r4, r4, 15)
    cmp(r6, r7)
    ble(KEEP)
    add(r4, 1)
    label(KEEP)
    mov(r6, r4)
    label(ADD)
    ldr(r4, [r1, 0])         # d[i]
    ldr(r7, [r2, 24])
    add(r4, r4, r7)
    ldr(r7, [r2, 28])
    asr(r4, r7)              # (d[i] + h) >> sh
    mov(r7, r12)
    ldr(r7, [r7, 20])        # 65535
    cmp(r4, r7)
    ble(C1)
    mov(r4, r7)
    label(C1)
    neg(r7, r7)
    cmp(r4, r7)
    bge(C2)
    mov(r4, r7)
    label(C2)
    add(r4, r4, r6)
    mov(r7, r12)
    ldr(r7, [r7, 16])        # 32767
    cmp(r4, r7)
    ble(C3)
    mov(r4, r7)
    label(C3)
    neg(r7, r7)
    cmp(r4, r7)
    bge(C4)
    mov(r4, r7)
    label(C4)
    strh(r4, [r0, 0])
    str(r4, [r1, 0])
    add(r0, 2)
    add(r1, 4)
    sub(r3, 1)
    bgt(LOOP)
    mov(r7, r12)
    str(r5, [r7, 4])
    label(END)


def vmk(v, d, n, p):
    # q8mom.vmk: p[0] mu as round(mu 2^15), p[1] the generator's state (left there),
    # p[4], p[5] d's dither and shift
    t = _T
    t[0], t[1], t[2] = p[0], p[1], n
    t[6], t[7] = p[4], p[5]
    _vm(v, d, t)
    p[1] = t[1]
