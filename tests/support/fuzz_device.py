# Fuzz driver for the device readers; runs unchanged under unix MicroPython and CPython,
# all cases of one format in one process.  Usage:
#   fuzz_device.py FORMAT DIR COUNT SEED DATA_START
# FORMAT: flat | wof | ckpt | ds (files model.flat, weights.wof, checkpoint.ckpt, train.ds
# in DIR).  Each case mutates or truncates the valid file with a seeded xorshift PRNG,
# writes it to DIR/fuzz.bin and loads it with the reader a board uses.  Outcomes:
#   same    loaded, equal to the original
#   data    loaded, values differ, every changed byte at or after DATA_START or reserved
#           (a flipped data byte, undetectable without a checksum; -1: none allowed)
#   prefix  (ckpt) cut exactly where onert-micro's part ends: loads as onert-micro's
#           checkpoint, weights equal, utrain's resume position gone
#   clean   ValueError naming the file
#   bad     anything else (printed)
# Prints one line: RESULT {...counts...}.
import sys
from utrain.model import Net
from utrain.trainer import Trainer
from utrain.data import Dataset

fmt, where, count, seed, dstart = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
NAMES = {'flat': 'model.flat', 'wof': 'weights.wof', 'ckpt': 'checkpoint.ckpt', 'ds': 'train.ds'}
IGNORED = (3,) if fmt == 'wof' else ()  # the .wof header's reserved byte
src = where + '/' + NAMES[fmt]
tmp = where + '/fuzz.bin'
with open(src, 'rb') as f:
    orig = f.read()
state = [seed * 2654435761 & 0xFFFFFFFF or 1]


def rnd(n):
    s = state[0]
    s ^= (s << 13) & 0xFFFFFFFF
    s ^= s >> 17
    s ^= (s << 5) & 0xFFFFFFFF
    state[0] = s
    return s % n


def flat(a):
    return [float(v) for v in a.tolist()[0]] if a.shape[0] == 1 else [float(v) for r in a.tolist() for v in r]


def tensors(ts):
    return [None if a is None else flat(a) for a in ts]


def tables(d):
    return sorted((k, flat(d[k])) for k in d)


net = Net(where + '/model.flat')
tr = Trainer(where + '/model.flat', where + '/weights.wof') if fmt == 'ckpt' else None


def load(path):
    if fmt == 'flat':
        n = Net(path)
        return (n.shape, n.ops, n.bwd, n.settings, n.inputs, n.outputs, n.trainable, tensors(n.t))
    if fmt == 'wof':
        net.load_weights(path)
        return tensors([net.t[k] for k in net.trainable])
    if fmt == 'ckpt':
        tr.load_checkpoint(path)
        o = tr.opt
        return (tensors([tr.net.t[k] for k in tr.net.trainable]), tables(o.m), tables(o.v), o.t,
                tr.epoch, tr.pos, tr.sums, tr.lr_scale, tr.best)
    d = Dataset(path)
    try:
        from utrain.xnp import zeros
        xs, ys = zeros((1, d.x_len)), zeros((1, d.y_len))
        out = [d.n, d.x_len, d.y_len]
        for i in range(d.n):
            d.read(i, xs, ys)
            out.append(flat(xs) + flat(ys))
        return out
    finally:
        d.close()


ref = load(src)
counts = {'same': 0, 'data': 0, 'prefix': 0, 'clean': 0, 'bad': 0}
shown = 0
n = len(orig)
for case in range(count):
    b = bytearray(orig)
    kind = rnd(6)
    lo = n
    cut = False
    head = dstart if 0 < dstart < n else n
    if kind == 0:
        b = b[:rnd(n)]
        cut = True
    else:
        for _ in range(1 if kind < 4 else 2 + rnd(3)):
            p = rnd(head) if rnd(2) else rnd(n)
            if kind == 1 or kind >= 4:
                b[p] ^= 1 << rnd(8)
            elif kind == 2:
                b[p] = rnd(256)
            else:
                p -= p % 4
                v = (0, 0xFF, rnd(256))[rnd(3)]
                for i in range(p, min(p + 4, n)):
                    b[i] = v
        for i in range(n):     # first meaningful changed byte (a second flip may undo one)
            if b[i] != orig[i] and i not in IGNORED:
                lo = i
                break
    if bytes(b) == orig:
        counts['same'] += 1
        continue
    with open(tmp, 'wb') as f:
        f.write(b)
    try:
        got = load(tmp)
        if got == ref:
            what = 'same'
        elif fmt == 'ckpt' and cut and got[:5] == ref[:5]:
            what = 'prefix'
        elif 0 <= dstart <= lo and not cut:
            what = 'data'
        else:
            what = 'bad'
            err = 'silent wrong load'
    except ValueError as e:
        err = repr(e)
        what = 'clean' if tmp in str(e) else 'bad'
    except Exception as e:
        what = 'bad'
        err = repr(e)
    counts[what] += 1
    if what == 'bad' and shown < 5:
        shown += 1
        print('BAD case %d kind %d at %d len %d: %s' % (case, kind, lo, len(b), err))
print('RESULT', counts)
