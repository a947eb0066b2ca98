# Runs inside the measured interpreter (unix MicroPython without ulab, or the emulated
# board), in a folder made by bench/int8.py: the float model prepared by `prepare
# --dequantize` (model.flat, weights.wof, train.ds) and the int8 one (q8.json, q8.wof,
# q8x.bin: the same samples quantized, one label byte after each).  Alternates in short
# rounds, CPU time summed: the float training step (utrain's Trainer, SGD, batch 1), the
# int8 training step (utrain.q8, SGD + QAS, batch 1), q8kern's FC multiply-add loop and
# the bare int8 loop over as many multiply-adds (viper; inline assembler on an ARM board,
# whose kernels are utrain.q8asm's).  Prints
# RESULT <float us> <int8 us> <fc mac us> <bare mac us> (float -1: out of memory)
import gc
import json
from array import array
from step import setup, timed, cpu_us
from utrain import q8kern as K
from utrain.q8 import Q8Net


def main():
    with open('bench.json') as f:
        cfg = json.load(f)
    with open('q8.json') as f:
        net = Q8Net(json.load(f), 'q8.wof')
    n_in = net.meta['nin']
    with open('q8x.bin', 'rb') as f:
        raw = f.read()
    rec = n_in + 1
    xs = [bytearray(raw[i:i + n_in]) for i in range(0, len(raw), rec)]
    ys = [raw[i + n_in] for i in range(0, len(raw), rec)]
    lr = cfg['lr']

    def qsteps(n, j):
        for i in range(n):
            k = (j + i) % len(xs)
            net.step(xs[k], ys[k], lr)

    ni, no = cfg['mac_shape']
    x = bytearray(range(ni))
    w = bytearray((i * 7) & 255 for i in range(ni * no))
    w2 = bytearray((i * 5) & 255 for i in range(ni * no))
    b = array('i', [0] * no)
    acc = array('i', [0] * no)

    def fc(n, j):
        for i in range(n):
            K.fck(acc, x, 0, 3, w, b, 1, ni, no)

    def bare(n, j):
        for i in range(n):
            K.mack(w, w2, ni * no, 1)

    if K.ASM:                    # an ARM board: the kernels' own code is q8asm's
        from utrain.q8asm import mac

        def bare(n, j):
            for i in range(n):
                mac(w, w2, ni * no)

    # the float model last: the int8 net (its step's buffers made by one step) and the
    # buffers above get the heap first
    qsteps(1, 0)
    try:
        fsteps, _ = setup('.', cfg)
    except MemoryError:          # the float model does not fit this board's heap
        fsteps = None
    if fsteps is not None:
        try:
            timed(fsteps, 1)
        except MemoryError:
            fsteps = None
    gc.collect()                 # a float model that did not fit leaves its heap
    fns = (fsteps or (lambda n, j: None), qsteps, fc, bare)
    one = [max(timed(f, 1), 1) for f in fns]        # also the warm-up
    tot = [0] * 4
    rounds = cfg['rounds']
    ns = [max(1, int(cfg['round_us'] / o)) for o in one]
    for r in range(rounds):
        for i in range(4):
            tot[i] += timed(fns[i], ns[i], r * ns[i], cpu_us)
    r = [tot[i] / ns[i] / rounds for i in range(4)]
    if fsteps is None:
        r[0] = -1                # out of memory
    print('RESULT %.2f %.2f %.2f %.2f' % tuple(r))


if __name__ == '__main__':
    main()
