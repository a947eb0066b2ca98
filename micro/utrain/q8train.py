# run.py's trainer for an int8 model prepared to train as int8 (train.json names
# q8.json as its model): the same interface as utrain.trainer.Trainer for what run.py
# calls, over utrain.q8.  Samples come from a .ds stored as int8 with the model input's
# scale and zero point, so a sample's bytes are the model's input as they are.
# Losses: softmax cross-entropy on the dequantized logits, with a class label (scce) or
# class probabilities (cce); mse, mae and bce against float targets (utrain.q8reg).
# Optimizers: SGD with QAS (batch 1: each chunk of a layer's weight gradient applied as
# it is made; larger batches: int32 sums, updated at the
# batch's end), with momentum (int16 weight velocities: utrain.q8mom), and Adam on
# float32 masters of the trained layers (a rank's window of them; none for a layer whose
# bias alone trains).
# Checkpoints: onert-micro's layout (utrain.wof) with the trained layers' int8 weights and
# int32 biases as the weights, Adam's moments as m and v, then the resume block the float
# Trainer writes (position, sums, best, ...) and the int8 state: b'UTQ8', the rounding
# generator's state, each trained layer's float32 bias (and Adam master weights).
from struct import pack, unpack
from utrain.q8 import Q8Net
from utrain.data import epoch
from utrain import drop


class Q8Trainer:
    def __init__(self, model='q8.json', weights='weights.wof', keep=None, **settings):
        # (the layer table read and the settings checked by the net's load's module, which
        # the net drops once it is built: utrain.q8load)
        from utrain.q8load import trainer_cfg as check
        meta, c = check(model, keep, settings)
        check = None
        self.cfg = c
        if c['optimizer'] != 'sgd' or int(c['batch']) > 1:
            # the batch updates' code (Q8Net.setup loads it) before the net's buffers
            from utrain import q8batch  # noqa: F401
        self.x = bytearray(meta['nin'])     # (an image's: before the net's small objects)
        self.net = Q8Net(meta, c.get('base', weights), c['momentum'] if c['optimizer'] ==
                         'sgd' else 0.0, c['optimizer'] == 'adam', 0, int(c['batch']))
        self.weights_path = weights
        if c['momentum'] and c['optimizer'] == 'sgd':
            # momentum's code (Q8Net.setup loads it) before the set-up's: under it, the
            # set-up's hole had fallen between the velocities and the rest (microgestes, 32-bit)
            from utrain import q8mom  # noqa: F401
        # (the rest once the net is loaded: utrain.q8setup, loaded for it and dropped after)
        from utrain.q8setup import trainer
        trainer(self, weights)
        trainer = None
        drop('q8setup')

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
        ny = 1 if self.y is None else self.ncls
        if ds is not self.ds:           # (checked once per dataset: float steps are slow)
            m = self.net
            if (ds.x_len != len(self.x) or ds.y_len != ny or ds.rec != len(self.x) + 4 * ny
                    or abs(ds.xs - m.sx) > 1e-6 * m.sx
                    # (the offset is zx steps: a float32 board parses sx from q8.json
                    # within an ulp, which zx = -128 makes 128 ulps of sx)
                    or abs(ds.xo + m.zx * m.sx) > 1e-6 * m.sx * (1 + abs(m.zx))):
                raise ValueError('%s: an int8 model trains on int8 samples of %d values at '
                                 "its input's scale and zero point, with %s (prepare writes "
                                 'them)' % (ds.path, len(self.x), 'one label' if ny == 1 else
                                            '%d targets' % ny))
            self.ds = ds    # (its float32 targets are as stored: utrain.data.header)
        f = ds.f
        f.seek(ds.head + i * ds.rec)
        if f.readinto(self.x) != len(self.x):
            raise ValueError('%s: truncated' % ds.path)
        if self.y is not None:      # (float32 targets, as stored)
            self.y[:] = unpack('<%df' % ny, f.read(4 * ny))
            return self.y
        y = unpack('<f', f.read(4))[0]
        k = int(y)
        if not (0 <= k < self.ncls and k == y):
            raise ValueError('%s: sample %d has label %r, the model has %d classes'
                             % (ds.path, i, y, self.ncls))
        return k

    def train_step(self, t):
        net, c = self.net, self.cfg
        lr = c['lr'] * self.lr_scale
        if int(c['batch']) == 1 and c['optimizer'] == 'sgd':
            self.dirty = True               # weights change during the backward pass
            return net.step(self.x, t, lr)
        r = net.accum(self.x, t)
        self.pending += 1
        if self.pending >= int(c['batch']):
            self.apply()
        return r

    def apply(self):
        """Update the weights from the gradients summed since the last update."""
        if not self.pending:
            return
        c = self.cfg
        self.dirty = True
        self.net.apply(c['lr'] * self.lr_scale,
                       1.0 / self.pending if c['reduction'] == 'mean' else 1.0)
        self.pending = 0

    def _pass(self, ds, train, idx=None, progress=None, i0=0, sums=(0.0, 0.0)):
        net = self.net
        ls, ms = sums
        for i in range(i0, ds.n):
            t = self._read(ds, idx[i] if idx else i)
            if train:
                l, m = self.train_step(t)
                rr = net.rr
                if rr is not None and not self.pending and not (i + 1) % rr.every:
                    rr.check()
            else:
                l, m = net.loss(self.x, t)
            ls += l
            ms += m
            if progress:
                progress(i + 1, ds.n, ls, ms)
        n = max(ds.n, 1)
        return ls / n, ms / n

    def _check(self, what):
        pass            # (int8 weights and int32 biases are never NaN: utrain.data.epoch)

    train_epoch = epoch     # as Trainer.train_epoch (the bookkeeping: utrain.data.epoch)

    def evaluate(self, ds):
        return self._pass(ds, False)

    def _trained(self):
        return [L for L in self.net.layers if L.train]

    def moving(self):
        """The trained int8 weights (run.py's CRC of them, epoch to epoch: an epoch whose
        every update stayed under a weight step moved none; the int32 biases are left out,
        a unit of theirs moves the loss by nothing one reads)."""
        return [L.w for L in self._trained() if L.w is not None and L.whi > L.wlo]

    def save_weights(self, path='trained.wof'):
        """The trained layers' int8 weights and int32 biases, onert-micro's .wof layout
        (tensors indexed as in the model)."""
        from utrain.wof import save_wof
        blocks = {}
        rr = self.net.rr
        for L in self._trained():
            if L.whi > L.wlo:           # (a bias-only layer's weights never change)
                blocks[L.d['wt']] = self._wblock(L)
            blocks[L.d['bt']] = L.b if rr is None else rr.filed(self.net.layers.index(L), L.b)
        save_wof(path, self.net.meta['ntensors'], blocks)
        for x in self.net.ext:      # the scales they are at (trained.wof.q8s, .q8w)
            x.save(path)
        drop('wof')

    def _wblock(self, L):
        # L's weights as a .wof block: a partial layer's (pw) frozen rows copied from the
        # model's weights a scratch at a time around its window's
        if not L.pw:
            return L.w
        net = self.net
        a, b, e = L.wo, L.wo + len(L.w), L.d['wn']
        off = net.woff[L.d['wt']]

        def cp(i, j):
            def put(f):
                buf = net.wbuf
                k = i
                while k < j:
                    n = min(len(buf), j - k)
                    net._read(off + k, buf, n)
                    f.write(memoryview(buf)[:n])
                    k += n
            return (j - i, put)
        return [cp(0, a), L.w, cp(b, e)]

    def save_checkpoint(self, path='checkpoint.ckpt'):
        """Weights, optimizer state, counters and the position in the epoch (between
        batches: the sums of an unfinished batch are not saved)."""
        from utrain.wof import save_checkpoint, RESUME
        net = self.net
        w, m, v = {}, {}, {}
        b = self.best or (0, 0.0, 0.0)
        # the resume block, then the int8 state: the float arrays as they are (raw
        # little-endian float32), written one by one, never copied into one bytes
        tail = [pack(RESUME, b'UTRS', 1, self.best is not None, self.pos, self.sums[0],
                     self.sums[1], self.lr_scale, b[0], self.retries, b[1], b[2]),
                b'UTQ8', pack('<I', net.seed)]
        for L in self._trained():
            wt, bt = L.d['wt'], L.d['bt']
            if L.stale:
                L.set_bias()                # (SGD's integer bias update: bf from b)
            w[bt] = L.b
            if L.whi > L.wlo:
                w[wt] = self._wblock(L)
            tail.append(L.bf if L.be is None else L.be)    # (the bias held: float, or
            n = L.wr()[1]                                   # int32 and its fraction) - L.wr()[0]      # (a rank's window; none: the bias alone)
            if net.adam:
                if n:
                    m[wt], v[wt] = L.am, L.av
                m[bt], v[bt] = L.bm, L.bv
                tail.append(L.wm)
            elif net.mom:                   # SGD momentum's velocities
                if n and L.vw is not None:
                    m[wt] = L.vw
                if L.vb is not None:
                    m[bt] = L.vb
            if L.wf is not None:            # SGD: the weights' kept fractions (upek)
                tail.append(L.wf)
        for x in net.ext:                   # the ranges' and weight scales' exponents
            tail.append(x.TAG)
            tail += x.parts()
        save_checkpoint(path, net.meta['ntensors'], w, m, v, net.nstep, self.epoch, tail)
        drop('wof')
        self.good = path

    def load_checkpoint(self, path='checkpoint.ckpt'):
        # (utrain.q8resume, loaded for it and dropped after: a run that does not resume
        # never loads its code)
        from utrain.q8resume import load
        load(self, path)
        load = None
        drop('q8resume')
