# Runs on the emulated Pico in a folder made by bench/kernels.py --steps: the bare int8
# multiply-add loop of this firmware (first: its buffers are freed before the net loads),
# then one int8 training step of q8.json (utrain.q8, SGD batch 1) per sample after a
# warm-up step; prints
#   STEP <cycles per step> <bare loop cycles per multiply-add>
import gc
import json
from time import ticks_us, ticks_diff
from utrain import q8kern as K

if K.ASM:
    from utrain.q8asm import mac
else:
    def mac(a, b, n):
        K.mack(a, b, n, 1)
N = 8192
a, b = bytearray(N), bytearray(bytes(range(256)) * (N // 256))


def loop(n):
    # cycles of 8 calls of the bare loop over n multiply-adds
    mac(a, b, n)
    t0 = ticks_us()
    for i in range(8):
        mac(a, b, n)
    return ticks_diff(ticks_us(), t0) * 125


bare = (loop(N) - loop(0)) / 8 / N          # (the calls taken off)
a = b = None
gc.collect()
from utrain.q8 import Q8Net   # noqa: E402

with open('q8.json') as f:
    net = Q8Net(json.load(f), 'q8.wof')
n = net.meta['nin']
with open('q8x.bin', 'rb') as f:
    raw = f.read()
xs = [bytearray(raw[i:i + n]) for i in range(0, len(raw), n + 1)]
ys = [raw[i + n] for i in range(0, len(raw), n + 1)]
net.step(xs[0], ys[0], 0.01)
gc.collect()
t0 = ticks_us()
for i in range(1, len(xs)):
    net.step(xs[i], ys[i], 0.01)
print('STEP %d %.2f' % (ticks_diff(ticks_us(), t0) * 125 // (len(xs) - 1), bare))
