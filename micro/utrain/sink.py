# Gradient sinks: kernels compute weight gradients and hand each to the net's sink with
# one call, rt.sink.grad(k, ...), without knowing what happens to it:
#   grad(k, g)      g is k's gradient (k's shape, its training channels, or a bias's
#                   (n,) row sum)
#   grad(k, u, x)   k's gradient is u^T . x (u [rows, out], x [rows, in], as an FC's dW);
#                   for one row it is an outer product, never materialised
#   grad(k)         returns an array of k's whole shape for the kernel to add k's
#                   gradient into in place (op_conv, tap by tap; its WGRAD_WHOLE)
# Sums (batch > 1, and a bare Net) adds them into per-weight sums that the Trainer
# applies once a batch is complete; Apply (batch 1) steps the optimizer at once, a row at
# a time for a one-row product (plain SGD: one add_outer straight into the weights), so
# no weight-sized gradient exists.  Under a rank (sparse update) only k's training
# channels get a gradient (trained()).
from utrain.xnp import np, zeros, add_outer, big_first


def state_shape(net, k):
    """Shape of k's gradient and optimizer state: the whole tensor, or its training
    output channels (rank)."""
    r = net.rank.get(k)
    if r is None:
        return net.shape[k]
    ax, lo, hi = r
    return (hi - lo, net.shape[k][1]) if ax == 0 else (net.shape[k][0], hi - lo)


def trained(net, k, a):
    """a (k's whole shape, or already state_shape(k)) cut to k's training channels."""
    r = net.rank.get(k)
    if r is None or a.shape != net.shape[k]:
        return a
    ax, lo, hi = r
    return a[lo:hi] if ax == 0 else a[:, lo:hi]


def _rows(net, k):
    # the rows lo:hi of weight k that train (its output channels)
    r = net.rank.get(k)
    if r is None or r[0]:
        return 0, net.shape[k][0]
    return r[1], r[2]


def _dense(net, k, u, x):
    # u^T . x for k's training rows only
    lo, hi = _rows(net, k)
    return np.dot((u[:, lo:hi] if hi - lo < u.shape[1] else u).T, x)


def _cut(net, k, g):
    if len(g.shape) == 1:                   # a bias sum over rows: (n,) -> (1, n)
        g = g.reshape((1, g.shape[0]))
    return trained(net, k, g)


class Sums:
    now = False             # gradients wait for Trainer.apply()

    def __init__(self, net):
        self.net = net
        self.acc = {}

    def _sum(self, k, whole=False):
        a = self.acc.get(k)
        if a is None:
            a = self.acc[k] = zeros(self.net.shape[k] if whole else state_shape(self.net, k))
        return a

    def grad(self, k, g=None, x=None):
        net = self.net
        if g is None:
            return self._sum(k, True)
        if x is None:
            a = self._sum(k)
            a += _cut(net, k, g)
        elif x.shape[0] == 1:
            lo, hi = _rows(net, k)
            add_outer(self._sum(k), g[:, lo:hi], x)
        else:
            a = self._sum(k)
            a += _dense(net, k, g, x)

    def end(self):
        pass

    def alloc(self):
        """Every sum now, largest first, before the heap fragments: a sum made lazily in
        the first backward pass may find no run long enough.  A kernel with WGRAD_WHOLE
        (op_conv) sums its weight whole, the others only a rank's training channels."""
        net = self.net
        whole = set(net.ops[i][1][1] for i in range(len(net.ops))
                    if getattr(net.mods[i], 'WGRAD_WHOLE', False))
        for k in big_first(net.trainable, net.shape):
            self._sum(k, k in whole)

    def zero(self):
        for a in self.acc.values():
            a[:] = 0.0


class Apply:
    now = True              # each gradient updates its weight as soon as it is complete

    def __init__(self, net, opt):
        self.net, self.opt = net, opt
        self.acc = {}       # grad(k) arrays of the op running, applied by end()

    def _w(self, k):
        return trained(self.net, k, self.net.t[k])

    def grad(self, k, g=None, x=None):
        net, opt = self.net, self.opt
        if g is None:
            a = self.acc[k] = zeros(net.shape[k])
            return a
        if x is None:
            opt.step(k, self._w(k), _cut(net, k, g))
        elif x.shape[0] == 1:
            lo, hi = _rows(net, k)
            w = self._w(k)
            if not opt.step_outer(k, w, g[:, lo:hi], x):
                x = x[0]
                for j in range(lo, hi):
                    opt.step_row(k, j - lo, w[j - lo], x * g[0, j])
        else:
            opt.step(k, self._w(k), _dense(net, k, g, x))

    def end(self):
        acc = self.acc
        if acc:
            for k in acc:
                self.opt.step(k, self._w(k), trained(self.net, k, acc[k]))
            acc.clear()

    def zero(self):
        self.acc.clear()
