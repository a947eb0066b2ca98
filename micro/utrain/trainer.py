# The training API, in the steps of ONERT's training session:
#   tr = Trainer('model.flat', 'weights.wof', lr=0.01)   # load model + weights
#   tr.set_input(x); tr.set_expected(y); tr.train_step()  # one sample
#   tr.train_epoch(Dataset('train.ds')); tr.evaluate(Dataset('test.ds'))
#   tr.save_checkpoint('checkpoint.ckpt'); tr.save_weights('trained.wof')
#   tr.predict(x)                                          # inference, current weights
# Reliability: a NaN/Inf loss or weight raises Diverged after restoring the last good
# state (the last checkpoint saved or loaded, else the initial weights); checkpoints
# hold the position inside the epoch, so a resumed run ends with the same weights.
import gc
from utrain.xnp import np, zeros, as2d, big_first
from utrain.model import Net, drop as _drop
from utrain.sink import Sums, Apply, state_shape, trained
from utrain.losses import loss as _loss, metric as _metric, LOSSES, METRICS
from utrain.optim import Optimizer, OPTIMIZERS
from utrain.data import epoch


def _wof():
    # utrain.wof is imported for a load or save and dropped after it (code is heap)
    import utrain.wof
    return utrain.wof


class Diverged(Exception):
    pass


def finite(v):
    return v - v == 0.0


def _gc_every(n):
    # MicroPython's gc.threshold(n): collect whenever n bytes were allocated since the
    # last collection (-1: only when the heap is full); returns the previous setting.
    # n = 0: half of what training collects at (utrain.run sets it from train.json: the
    # same in any heap, so the model loads alike in all of them), else 1/64 of the heap;
    # at least 1 KB (a few dozen collections load a large model on a board with
    # megabytes of PSRAM)
    try:
        old = gc.threshold()
        gc.threshold(n or max(1024, old >> 1 if old > 0 else (gc.mem_free() + gc.mem_alloc()) >> 6))
        return old
    except AttributeError:      # CPython
        return None


class Trainer:
    def __init__(self, model='model.flat', weights='weights.wof', keep=None, **settings):
        # Loading allocates many small objects that stay (the model's tables) between
        # temporaries that do not (file reads, unpacked records).  Collected only when
        # the heap is full, the temporaries leave a sieve of small holes between the
        # survivors that no array fits in later; collected every 1/64 of the heap, the
        # holes are refilled at once and the survivors pack together (docs/memory.md: the
        # digits CNN trains in 91 KB of heap instead of 106 KB).
        old = _gc_every(0)
        try:
            net = self.net = Net(model)
            self.weights_path = weights
            if weights:
                net.load_weights(weights)
            _drop('wof')             # Net and load_weights import it; needed again only for files
            if keep is not None:     # a board's own choice of what trains (utrain/fisher.py):
                if callable(keep):   # {tensor: window}, or a function of the net making it
                    keep = keep(net)
                    _drop('fisher')
                from utrain.chosen import restrict
                restrict(net, keep)
                _drop('chosen')
            self.cfg = dict(net.settings)
            self.epoch = self.pos = self.retries = 0
            self.sums = (0.0, 0.0)   # loss and metric sums of the epoch so far
            self.lr_scale = 1.0      # lowered after a divergence
            self.best = None         # (epoch, test loss, test metric) of the best weights
            self.good = None         # checkpoint holding the last good state
            # Ctrl-C exactness (run.py): commit = (pos, sums) at the last whole batch;
            # dirty while an update is under way (weights half updated); last = the
            # (loss, metric) of the last whole epoch.  Each is set with its partners in
            # one statement: no KeyboardInterrupt lands between stores without a jump.
            self.commit, self.dirty, self.last = (0, (0.0, 0.0)), False, None
            self.configure(**settings)
            # frozen-prefix cache (utrain.prefix): off unless asked (train.json's run.cache)
            self.cache, self.prefixes, self.cut_bufs = False, {}, None
        finally:
            if old is not None:
                _gc_every(old)
                gc.collect()

    def configure(self, **settings):
        """Change training settings (loss, optimizer, lr, batch, ...); optimizer
        state restarts when the optimizer kind changes."""
        c = self.cfg
        for k in settings:
            if k not in c:
                raise ValueError('unknown setting ' + k)
            c[k] = settings[k]
        if c['loss'] not in LOSSES or c['optimizer'] not in OPTIMIZERS or c['metric'] not in METRICS:
            raise ValueError('bad loss/optimizer/metric in settings')
        if int(c['batch']) < 1:
            raise ValueError('batch must be at least 1')
        net = self.net
        net.fuse_head(c['loss'], c['from_logits'])     # (the loss takes a final SOFTMAX whole)
        o = getattr(self, 'opt', None)
        if o is None or o.kind != c['optimizer']:
            o = self.opt = Optimizer(c['optimizer'])
        o.set(c, self.lr_scale)
        for k in big_first(net.trainable, net.shape):
            o.init(k, state_shape(net, k))
        # batch 1: each weight gradient updates its weight as soon as it is complete
        # (no gradient sums are kept); larger batches, and models with a weight used
        # by several ops (an unrolled RNN: each use must see the weight before the
        # update), sum them until apply()
        if int(c['batch']) == 1 and not net.shared():
            net.sink = Apply(net, o)
        else:
            if net.sink.now:
                net.sink = Sums(net)
            net.sink.alloc()
        self.x_shape = net.shape[net.inputs[0]]
        self.y_shape = (1, 1) if c['loss'] == 'scce' else net.shape[net.outputs[0]]
        self.pending = 0
        self.target = None
        self.lo = 0              # the first op a step runs (k when the prefix is cached)

    # -- one sample --------------------------------------------------------
    def set_input(self, x):
        self.net.set_input(as2d(x, self.x_shape))

    def set_expected(self, y):
        self.target = as2d(y, self.y_shape)

    def _out(self):
        c = self.cfg
        y = self.net.output()
        return y, _loss(c['loss'], y, self.target, c['from_logits'], self.net.head)

    def train_step(self):
        """Forward and backward on the sample set; updates the weights once
        `batch` samples have been accumulated.  Returns (loss, metric)."""
        c = self.cfg
        net = self.net
        net.forward(True, self.lo)
        y, (l, dy) = self._out()
        if not finite(l):
            self._diverged('loss is %s' % l)
        m = _metric(c['metric'], y, self.target, c['loss'], c['from_logits'])
        if net.sink.now:
            self.dirty = True           # weights change during the backward pass
            self.opt.begin()            # the sink steps the optimizer inside backward
            net.backward(dy)
            return l, m
        net.backward(dy)
        self.pending += 1
        if self.pending >= c['batch']:
            self.apply()
        return l, m

    def eval_step(self):
        c = self.cfg
        self.net.forward(False, self.lo)
        y, (l, dy) = self._out()
        return l, _metric(c['metric'], y, self.target, c['loss'], c['from_logits'])

    def apply(self):
        """Update the weights from the gradients summed since the last update."""
        if not self.pending:
            return
        net, opt = self.net, self.opt
        scale = 1.0 / self.pending if self.cfg['reduction'] == 'mean' else 1.0
        self.dirty = True
        opt.begin()
        acc = net.sink.acc
        for k in net.trainable:
            g = acc.get(k)
            if g is not None:
                opt.step(k, trained(net, k, net.t[k]), trained(net, k, g), scale)
        net.sink.zero()
        self.pending = 0

    def _check(self, what):
        # NaN/Inf weights (one sum per tensor; checked per epoch and before saves: the
        # loss, checked per sample, catches almost every case at once)
        for k in self.net.trainable:
            if not finite(np.sum(self.net.t[k])):
                self._diverged('weights of tensor %d are NaN/Inf%s' % (k, what))

    def _diverged(self, why):
        at = 'epoch %d sample %d' % (self.epoch + 1, self.pos + 1)
        self.restore()
        raise Diverged('%s at %s; restored %s' % (why, at, self.good or self.weights_path))

    def restore(self):
        """Back to the last good state: the last checkpoint saved or loaded, else the
        initial weights with fresh optimizer state.  lr_scale, retries and the best test
        result (that of the weights saved by validation-gated saving) are kept."""
        net = self.net
        self.dirty = True
        net.sink.zero()
        self.pending = 0
        keep = self.lr_scale, self.retries, self.best
        if self.good:
            self.load_checkpoint(self.good)
        else:
            net.load_weights(self.weights_path)
            _drop('wof')
            self.opt = None
            self.epoch = self.pos = 0
            self.sums = (0.0, 0.0)
        self.lr_scale, self.retries, self.best = keep
        self.configure()
        self.commit, self.dirty = (self.pos, self.sums), False

    def lower_lr(self, factor):
        self.lr_scale *= factor
        self.opt.lr = self.cfg['lr'] * self.lr_scale

    def better(self, tl, tm):
        """True (and recorded as the best) when the test (loss, metric) beats the best so
        far: the metric decides, the loss breaks ties; NaN never wins."""
        b = self.best
        if not (finite(tl) and finite(tm)):
            return False
        if b is not None:
            d = tm - b[2] if self.cfg['metric'] == 'accuracy' else b[2] - tm
            if d < 0 or (d == 0 and tl >= b[1]):
                return False
        self.best = (self.epoch, tl, tm)
        return True

    def predict(self, x):
        """Model output for input x with the current weights."""
        self.set_input(x)
        self.net.forward(False)
        return self.net.output()

    # -- datasets ----------------------------------------------------------
    def _pass(self, ds, train, idx=None, progress=None, i0=0, sums=(0.0, 0.0)):
        # samples i0.. of ds through train_step() (train) or eval_step(); mean (loss,
        # metric) over all n
        step = self.train_step if train else self.eval_step
        ds.check(self.x_shape, self.y_shape)
        net = self.net
        pf = self._prefix(ds)
        # a ready cache holds every sample's cut: the inputs are not read; a band group
        # that takes the input reads it a strip at a time (utrain.bands.Rows)
        x = None if pf and pf.done is None else 0
        rows = x is not None and net.bands and __import__('utrain.bands').bands.rows(net)
        x = None if x is None or rows else zeros(self.x_shape)
        y = zeros(self.y_shape)
        ls, ms = sums
        n = ds.n
        classes = net.shape[net.outputs[0]]
        classes = classes[0] * classes[1] if self.cfg['loss'] == 'scce' else 0
        for i in range(i0, n):
            j = idx[i] if idx else i
            ds.read(j, x, y)
            if not ((x is None or finite(np.sum(x))) and finite(np.sum(y))):
                raise ValueError('%s: sample %d holds NaN or Inf' % (ds.path, j))
            if classes and not (0 <= y[0, 0] < classes and y[0, 0] == int(y[0, 0])):
                raise ValueError('%s: sample %d has label %s, the model has %d classes'
                                 % (ds.path, j, y[0, 0], classes))
            self.target = y
            if x is None and not rows:
                pf.load(j)
            else:
                net.set_input(rows(ds, j) if rows else x)
                if pf:
                    net.forward(False, 0, pf.k)     # the prefix as inference, then cached
                    pf.save(j)
            self.lo = pf.k if pf else 0
            try:
                l, m = step()
            finally:
                self.lo = 0
            ls += l
            ms += m
            if progress:
                progress(i + 1, n, ls, ms)
        return ls / max(n, 1), ms / max(n, 1)

    def _prefix(self, ds):
        # ds's frozen-prefix cache when self.cache is set (utrain.prefix.get)
        if not self.cache:
            return None
        from utrain.prefix import get
        return get(self, ds)

    # train_epoch(ds, progress=None, ckpt=None, every=0): one pass over a Dataset from
    # sample `pos` on (after a resume); mean (loss, metric) over its samples;
    # progress(i, n, loss_sum, metric_sum) after each sample; with ckpt and every, a
    # checkpoint at the first batch boundary after every `every` samples.  The epoch's
    # bookkeeping is utrain.data.epoch, which the int8 trainer shares.
    train_epoch = epoch

    def evaluate(self, ds):
        """Mean (loss, metric) over a Dataset, weights unchanged."""
        return self._pass(ds, False)

    # -- files -------------------------------------------------------------
    def weights(self):
        """{tensor index: array} of the trainable weights (e.g. for federated averaging)."""
        t = self.net.t
        return dict((k, t[k]) for k in self.net.trainable)

    def save_weights(self, path='trained.wof'):
        self._check('; not saving ' + path)
        _wof().save_wof(path, len(self.net.t), self.weights())
        _drop('wof')

    def save_checkpoint(self, path='checkpoint.ckpt'):
        """Weights, optimizer state, counters and the position in the epoch (call it
        between batches: gradient sums of an incomplete batch are not saved)."""
        self._check('; not saving ' + path)
        _wof().save_state(self, path)
        _drop('wof')
        self.good = path

    def load_checkpoint(self, path='checkpoint.ckpt'):
        self.dirty = True            # until the whole state is in
        import utrain.ckread         # (loaded for this and dropped: utrain/ckread.py)
        utrain.ckread.load_state(self, path)
        _drop('ckread')
        _drop('wof')
        self.commit, self.dirty = (self.pos, self.sums), False
