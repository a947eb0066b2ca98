# The training API, in the steps of ONERT's training session:
#   tr = Trainer('model.flat', 'weights.wof', lr=0.01)   # load model + weights
#   tr.set_input(x); tr.set_expected(y); tr.train_step()  # one sample
#   tr.train_epoch(Dataset('train.ds')); tr.evaluate(Dataset('test.ds'))
#   tr.save_checkpoint('checkpoint.ckpt'); tr.save_weights('trained.wof')
#   tr.predict(x)                                          # inference, current weights
from utrain.xnp import zeros, as2d
from utrain.model import Net, LOSSES, OPTIMIZERS, METRICS, big_first
from utrain.losses import loss as _loss, metric as _metric
from utrain.optim import Optimizer
from utrain.data import order


def _wof():
    # utrain.wof is imported for a load or save and dropped after it (code is heap)
    import utrain.wof
    return utrain.wof


def _drop(name):
    import sys
    if sys.implementation.name != 'micropython':
        return          # a host has heap to spare, and keeps module identities
    import utrain
    sys.modules.pop('utrain.' + name, None)
    try:
        delattr(utrain, name)
    except AttributeError:
        pass


class Trainer:
    def __init__(self, model='model.flat', weights='weights.wof', **settings):
        net = self.net = Net(model)
        if weights:
            net.load_weights(weights)
            _drop('wof')
        self.cfg = dict(net.settings)
        self.epoch = 0
        self.configure(**settings)

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
        o = getattr(self, 'opt', None)
        if o is None or o.kind != c['optimizer']:
            o = self.opt = Optimizer(c['optimizer'])
        o.lr, o.momentum, o.beta1, o.beta2, o.eps, o.rho = (
            c['lr'], c['momentum'], c['beta1'], c['beta2'], c['eps'], c['rho'])
        for k in big_first(net.trainable, net.shape):
            o.init(k, net.state_shape(k))
        # batch 1: each weight gradient updates its weight as soon as it is complete
        # (no gradient sums are kept); larger batches sum them until apply()
        self.now = None
        if int(c['batch']) == 1:
            self.now = (self._upd, self._upd_row)
            net.acc.clear()
        else:                       # the sums now, before the heap fragments
            for k in big_first(net.trainable, net.shape):
                if k not in net.rank:
                    net.wgrad(k)
        self.x_shape = net.shape[net.inputs[0]]
        self.y_shape = (1, 1) if c['loss'] == 'scce' else net.shape[net.outputs[0]]
        self.pending = 0
        self.target = None

    # -- one sample --------------------------------------------------------
    def set_input(self, x):
        self.net.set_input(as2d(x, self.x_shape))

    def set_expected(self, y):
        self.target = as2d(y, self.y_shape)

    def _out(self):
        c = self.cfg
        y = self.net.output()
        return y, _loss(c['loss'], y, self.target, c['from_logits'])

    def train_step(self):
        """Forward and backward on the sample set; updates the weights once
        `batch` samples have been accumulated.  Returns (loss, metric)."""
        c = self.cfg
        net = self.net
        net.forward(True)
        y, (l, dy) = self._out()
        m = _metric(c['metric'], y, self.target, c['loss'], c['from_logits'])
        if self.now is not None:
            self.opt.begin()
            net.upd, net.upd_row = self.now
            try:
                net.backward(dy)
            finally:
                net.upd = net.upd_row = None
            return l, m
        net.backward(dy)
        self.pending += 1
        if self.pending >= c['batch']:
            self.apply()
        return l, m

    def _w(self, k):
        # the part of weight k that trains (a view)
        net = self.net
        w = net.t[k]
        r = net.rank.get(k)
        if r is None:
            return w
        return w[r[1]:r[2]] if r[0] == 0 else w[:, r[1]:r[2]]

    def _upd(self, k, g):
        self.opt.step(k, self._w(k), g)

    def _upd_row(self, k, r, g):
        self.opt.step_row(k, r, self._w(k)[r], g)

    def eval_step(self):
        c = self.cfg
        self.net.forward(False)
        y, (l, dy) = self._out()
        return l, _metric(c['metric'], y, self.target, c['loss'], c['from_logits'])

    def apply(self):
        """Update the weights from the gradients summed since the last update."""
        if not self.pending:
            return
        net, opt = self.net, self.opt
        scale = 1.0 / self.pending if self.cfg['reduction'] == 'mean' else 1.0
        opt.begin()
        for k in net.trainable:
            g = net.acc.get(k)
            if g is not None:
                opt.step(k, self._w(k), net.part(k, g), scale)
        net.zero_grads()
        self.pending = 0

    def predict(self, x):
        """Model output for input x with the current weights."""
        self.set_input(x)
        self.net.forward(False)
        return self.net.output()

    # -- datasets ----------------------------------------------------------
    def _pass(self, ds, step, idx=None, progress=None):
        # every sample of ds through step(); mean (loss, metric)
        ds.check(self.x_shape, self.y_shape)
        x, y = zeros(self.x_shape), zeros(self.y_shape)
        ls = ms = 0.0
        n = ds.n
        for i in range(n):
            ds.read(idx[i] if idx else i, x, y)
            self.net.set_input(x)
            self.target = y
            l, m = step()
            ls += l
            ms += m
            if progress:
                progress(i + 1, n, ls, ms)
        return ls / max(n, 1), ms / max(n, 1)

    def train_epoch(self, ds, progress=None):
        """One pass over a Dataset; returns mean (loss, metric) over its samples.
        progress(i, n, loss_sum, metric_sum) is called after each sample."""
        c = self.cfg
        idx = order(ds.n, c['seed'] if c['shuffle'] else None, self.epoch)
        r = self._pass(ds, self.train_step, idx, progress)
        self.apply()
        self.epoch += 1
        return r

    def evaluate(self, ds):
        """Mean (loss, metric) over a Dataset, weights unchanged."""
        return self._pass(ds, self.eval_step)

    # -- files -------------------------------------------------------------
    def weights(self):
        """{tensor index: array} of the trainable weights (e.g. for federated averaging)."""
        t = self.net.t
        return dict((k, t[k]) for k in self.net.trainable)

    def save_weights(self, path='trained.wof'):
        _wof().save_wof(path, len(self.net.t), self.weights())
        _drop('wof')

    def save_checkpoint(self, path='checkpoint.ckpt'):
        o = self.opt
        _wof().save_checkpoint(path, len(self.net.t), self.weights(), o.m, o.v, o.t, self.epoch)
        _drop('wof')

    def load_checkpoint(self, path='checkpoint.ckpt'):
        net = self.net
        shapes = [net.shape[k] if k in net.trainable else None for k in range(len(net.t))]
        state = [net.state_shape(k) if k in net.trainable else None for k in range(len(net.t))]
        w, m, v, step, epoch, extra = _wof().load_checkpoint(path, len(net.t), shapes, state)
        _drop('wof')
        for k in net.trainable:
            if k not in w:
                raise ValueError('%s: no weights for trainable tensor %d' % (path, k))
            net.t[k] = w[k]
        o = self.opt
        for k in m:
            if k in o.m:
                o.m[k] = m[k]
        for k in v:
            if k in o.v:
                o.v[k] = v[k]
        o.t, self.epoch = step, epoch
