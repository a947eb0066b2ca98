# Runs on the measured board (the emulated Pico, or unix MicroPython) in a folder made by
# bench/kernels.py, with lib/utrain staged for it: times q8kern's int8 kernels and the bare
# multiply-add loops, and prints one line per kernel:
#   KERN <name> <multiply-adds per call> <us per call: viper> <us per call: asm or -1>
# (asm: utrain.q8asm's kernel where the board has it; the viper one is then q8kern.vk()'s)
import gc
import json
from array import array
from time import ticks_us, ticks_diff
from utrain import q8kern as K

with open('kbench.json') as f:
    CFG = json.load(f)
ASM = K.ASM
if ASM:
    from utrain import q8asm as A
V = K.vk() if ASM else None


def rnd(n, seed):
    b = bytearray(n)
    s = seed
    for i in range(n):
        s = (s * 1103515245 + 12345) & 0x7fffffff
        b[i] = (s >> 16) & 255
    return b


def timed(f, min_us):
    # us per call of f, over calls lasting at least min_us (a garbage collection first:
    # none falls inside the timed calls, which allocate nothing)
    f()
    n = 1
    while True:
        gc.collect()
        t0 = ticks_us()
        for i in range(n):
            f()
        t = ticks_diff(ticks_us(), t0)
        if t >= min_us or n >= 1 << 12:
            return t / n
        n *= 4 if t < min_us // 8 else 2


def geo(H, W, I, O, KH, KW, s, p):
    OH = (H + 2 * p - KH) // s + 1
    OW = (W + 2 * p - KW) // s + 1
    return array('i', [H, W, I, O, KH, KW, s, s, p, p, OH, OW, 1, 1])


def taps(g):
    # valid (output, tap) pairs of geometry g
    H, W, KH, KW, s, p, OH, OW = g[0], g[1], g[4], g[5], g[6], g[8], g[10], g[11]
    n = 0
    for oy in range(OH):
        for ox in range(OW):
            for ky in range(KH):
                for kx in range(KW):
                    iy, ix = oy * s - p + ky, ox * s - p + kx
                    if 0 <= iy < H and 0 <= ix < W:
                        n += 1
    return n


def cases():
    out = []
    ni, no = CFG['fc']
    x = rnd(ni, 1)
    w = rnd(ni * no, 2)
    b = array('i', range(no))
    acc = array('i', range(no))
    dz = rnd(no, 3)
    g = array('i', range(ni * no))
    dx = array('i', range(ni))
    out.append(('fck', ni * no, lambda k: k(acc, x, 0, 3, w, b, 1, ni, no)))
    out.append(('gwk', ni * no, lambda k: k(g, dz, 0, x, 0, 3, 0, no, ni)))
    out.append(('dxk', ni * no, lambda k: k(dx, dz, 0, w, no, ni)))
    # per value (the "MACs" column counts values): requantizing int32 sums to int8 with
    # per-channel multipliers (a layer's activations), and the stochastic int8 update
    nv = 2048
    sums = array('i', [((i * 7919) % 200001) - 100000 for i in range(nv)])
    mul = array('i', [(1 << 30) + i * 9973 for i in range(64)])
    shf = array('i', [-8 - (i % 5) for i in range(64)])
    y8 = bytearray(nv)
    out.append(('rqk', nv, lambda k: k(sums, nv, 64, 1, mul, shf, y8, -3, -128, 127, 0)))
    wq = rnd(nv, 12)
    out.append(('upk', nv, lambda k: k(wq, sums, nv, 12345)))
    for name, c in sorted(CFG['conv'].items()):
        cg = geo(*c)
        H, W, I, O, KH, KW, OH, OW = cg[0], cg[1], cg[2], cg[3], cg[4], cg[5], cg[10], cg[11]
        m = taps(cg) * I * O
        cx = rnd(H * W * I, 4)
        cw = rnd(O * KH * KW * I, 5)
        cb = array('i', range(O))
        ca = array('i', range(OH * OW * O))
        cz = rnd(OH * OW * O, 6)
        cgw = array('i', range(O * KH * KW * I))
        cdx = array('i', range(H * W * I))
        out.append(('convk ' + name, m, lambda k, ca=ca, cx=cx, cg=cg, cw=cw, cb=cb:
                    k(ca, cx, -5, cg, cw, cb)))
        out.append(('cgk ' + name, m, lambda k, cgw=cgw, cz=cz, cx=cx, cg=cg, O=O:
                    k(cgw, cz, cx, -5, cg, 0, O)))
        out.append(('cdk ' + name, m, lambda k, cdx=cdx, cz=cz, cw=cw, cg=cg: k(cdx, cz, cw, cg)))
    for name, c in sorted(CFG['dw'].items()):
        H, W, C, KH, s, p = c
        dg = geo(H, W, C, C, KH, KH, s, p)
        OH, OW = dg[10], dg[11]
        m = taps(dg) * C
        dx_ = rnd(H * W * C, 7)
        dw = rnd(KH * KH * C, 8)
        db = array('i', range(C))
        da = array('i', range(OH * OW * C))
        dd = rnd(OH * OW * C, 9)
        dgw = array('i', range(KH * KH * C))
        ddx = array('i', range(H * W * C))
        out.append(('dwk ' + name, m, lambda k, da=da, dx_=dx_, dg=dg, dw=dw, db=db:
                    k(da, dx_, 3, dg, dw, db)))
        out.append(('ddk ' + name, m, lambda k, ddx=ddx, dd=dd, dw=dw, dg=dg: k(ddx, dd, dw, dg)))
        out.append(('dgk ' + name, m, lambda k, dgw=dgw, dd=dd, dx_=dx_, dg=dg:
                    k(dgw, dd, dx_, 3, dg)))
    return out


# do-nothing functions of each arity (no *args, no defaults: either costs more per call)
NOPS = {4: lambda a, b, c, d: None, 5: lambda a, b, c, d, e: None,
        6: lambda a, b, c, d, e, f: None, 7: lambda a, b, c, d, e, f, g: None,
        9: lambda a, b, c, d, e, f, g, h, i: None,
        11: lambda a, b, c, d, e, f, g, h, i, j, k: None}


def arity(f):
    n = []
    f(lambda *a: n.append(len(a)))
    return n[0]


def main():
    mu = CFG['min_us']
    n = CFG['bare']
    a, c = rnd(n, 10), rnd(n, 11)
    nop = NOPS[4]
    h = timed(lambda: nop(a, c, n, 1), mu)
    print('KERN bare %d %.1f %.1f' % (n, timed(lambda: K.mack(a, c, n, 1), mu) - h,
                                      timed(lambda: A.mac(a, c, n), mu) - h if ASM else -1))
    for name, macs, f in cases():
        if CFG.get('only', '') not in name:
            continue
        base = name.split()[0]
        kv = V[base] if ASM else getattr(K, base)
        ka = getattr(K, base)
        # the harness's own calls (f, its lambda, a function of as many arguments that
        # does nothing) are taken off: what is left is the kernel's call and work
        nop = NOPS[arity(f)]
        h = timed(lambda: f(nop), mu)
        tv = timed(lambda: f(kv), mu) - h
        ta = timed(lambda: f(ka), mu) - h if ASM else -1
        print('KERN %s %d %.1f %.1f' % (name.replace(' ', ':'), macs, tv, ta))


main()
