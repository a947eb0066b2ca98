# run.py's trainer for an int8 model prepared to train as int8 (train.json names
# q8.json as its model): the same interface as utrain.trainer.Trainer for what run.py
# calls, over utrain.q8.  Samples come from a .ds stored as int8 with the model input's
# scale and zero point, so a sample's bytes are the model's input as they are.
# Loss: softmax cross-entropy on the dequantized logits (scce); SGD with QAS, batch 1.
import json
from struct import unpack
from utrain.q8 import Q8Net
from utrain.data import order


class Q8Trainer:
    def __init__(self, model='q8.json', weights='weights.wof', keep=None, **settings):
        if keep is not None:
            raise ValueError('%s: an int8 model trains the layers prepare chose '
                             '(prepare --dequantize for --select board)' % model)
        with open(model) as f:
            meta = json.load(f)
        if meta.get('format') != 'utrain-q8':
            raise ValueError('%s: not a utrain int8 layer table' % model)
        self.net = Q8Net(meta, weights)
        c = self.cfg = {'loss': 'scce', 'optimizer': 'sgd', 'metric': 'accuracy', 'lr': 0.01,
                        'batch': 1, 'epochs': 1, 'shuffle': False, 'seed': 0}
        c.update(settings)
        if c['loss'] != 'scce' or c['optimizer'] != 'sgd' or int(c['batch']) != 1:
            raise ValueError('train.json: int8 training takes loss scce, optimizer sgd, batch 1 '
                             '(prepare --dequantize trains the model in float with any)')
        self.epoch = self.pos = self.retries = self.pending = 0
        self.lr_scale = 1.0
        self.best = None
        self.last = None          # (mean loss, metric) of the last epoch trained (run.py)
        self.x = bytearray(meta['nin'])
        self.ncls = meta['nclass']

    def lower_lr(self, factor):
        self.lr_scale *= factor

    def better(self, tl, tm):
        b = self.best
        if tl != tl or tm != tm:
            return False
        if b is not None and (tm < b[2] or (tm == b[2] and tl >= b[1])):
            return False
        self.best = (self.epoch, tl, tm)
        return True

    def _read(self, ds, i):
        m = self.net
        if (ds.x_len != len(self.x) or ds.y_len != 1 or ds.rec != len(self.x) + 4
                or abs(ds.xs - m.sx) > 1e-6 * m.sx or abs(ds.xo + m.zx * m.sx) > 1e-6 * m.sx):
            raise ValueError('%s: an int8 model trains on int8 samples of %d values at its '
                             "input's scale and zero point, with one label (prepare writes "
                             'them)' % (ds.path, len(self.x)))
        f = ds.f
        f.seek(ds.head + i * ds.rec)
        if f.readinto(self.x) != len(self.x):
            raise ValueError('%s: truncated' % ds.path)
        y = unpack('<f', f.read(4))[0] * ds.ys + ds.yo
        k = int(y)
        if not (0 <= k < self.ncls and k == y):
            raise ValueError('%s: sample %d has label %r, the model has %d classes'
                             % (ds.path, i, y, self.ncls))
        return k

    def _pass(self, ds, train, idx=None, progress=None, i0=0):
        net = self.net
        ls = ms = 0.0
        lr = self.cfg['lr'] * self.lr_scale
        for i in range(i0, ds.n):
            k = self._read(ds, idx[i] if idx else i)
            if train:
                l, m = net.step(self.x, k, lr)
            else:
                l, m = net.loss(self.x, k)
            ls += l
            ms += m
            if progress:
                progress(i + 1, ds.n, ls, ms)
        n = max(ds.n, 1)
        return ls / n, ms / n

    def train_epoch(self, ds, progress=None, ckpt=None, every=0):
        c = self.cfg
        idx = order(ds.n, c['seed'] if c['shuffle'] else None, self.epoch)

        def hook(i, n, ls, ms):
            self.pos = i
            if progress:
                progress(i, n, ls, ms)

        r = self.last = self._pass(ds, True, idx, hook)
        self.epoch += 1
        self.pos = 0
        return r

    def evaluate(self, ds):
        return self._pass(ds, False)

    def save_weights(self, path='trained.wof'):
        """The trained layers' int8 weights and int32 biases, onert-micro's .wof layout
        (tensors indexed as in the model)."""
        from utrain.wof import save_wof
        blocks = {}
        for L in self.net.layers:
            if L.train:
                blocks[L.d['wt']] = L.w
                blocks[L.d['bt']] = L.b
        save_wof(path, self.net.meta['ntensors'], blocks)
