# Runs on the board (the emulated Pico) in a folder prepare made for an int8 run, SGD
# batch 1 (bench/fromfloat.py --profile): where a training sample's time goes.  Per sample,
# in the trainer's own calls: reading the sample (Q8Trainer._read), the forward pass and
# the loss with its gradient (Q8Net.loss), each layer's backward pass with its update
# (Q8Net._back), and the trainer's whole pass over the samples (Q8Trainer._pass: the
# same work plus the loop's bookkeeping).  Prints PROF <phase> <us per sample>.
import gc
import json
from time import ticks_us, ticks_diff
from utrain.q8train import Q8Trainer
from utrain.data import Dataset

with open('train.json') as f:
    cfg = json.load(f)
tr = Q8Trainer(cfg['files']['model'], cfg['files']['weights'], loss=cfg['loss'],
               optimizer='sgd', lr=cfg['lr'], batch=1)
net = tr.net
ds = Dataset(cfg['files']['train'], False)
n = ds.n
tot = {}


def add(k, a, b):
    tot[k] = tot.get(k, 0) + ticks_diff(b, a)


tr._read(ds, 0)
net.step(tr.x, 0, cfg['lr'])              # warm-up: buffers made on first use
tot = {}
gc.collect()
for i in range(n):
    a = ticks_us()
    t = tr._read(ds, i)
    b = ticks_us()
    loss, hit, g = net.loss(tr.x, t, True)
    c = ticks_us()
    add('read', a, b)
    add('forward, loss, softmax', b, c)
    s = 1.0 / 16384.0
    j = len(net.layers) - 1
    while j >= net.first:
        a = ticks_us()
        g, s = net._back(net.layers[j], g, s, cfg['lr'], j > net.first)
        add('backward + update, layer %d' % j, a, ticks_us())
        j -= 1
gc.collect()
a = ticks_us()
tr._pass(ds, True)
add('the trainer\'s pass', a, ticks_us())
for k in sorted(tot):
    print('PROF %s|%.1f' % (k, tot[k] / n))
