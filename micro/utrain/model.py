# The engine that runs a flattened model (docs/flat-model.md): forward, backward over
# the host-derived backward list, weight-gradient sums.  The file's reader is
# utrain.flat, imported only while a model loads; with --stream frozen weights stay
# in the file and are read just before the op that needs them (utrain.stream).
from utrain.xnp import zeros, readinto


def drop(name):
    # forget module utrain.<name> so its code leaves the heap (code is heap on a
    # board); the next import loads it again
    import sys
    if sys.implementation.name != 'micropython':
        return          # a host has heap to spare, and keeps module identities
    import utrain
    sys.modules.pop('utrain.' + name, None)
    try:
        delattr(utrain, name)
    except AttributeError:
        pass


def big_first(ks, shape):
    return sorted(ks, key=lambda k: -shape[k][0] * shape[k][1])


class Net:
    """A loaded model: tensors t[k], their 2-D shapes, ops, and the backward list."""

    def __init__(self, path):
        self.path = path
        from utrain import wof, flat
        with wof.openr(path) as f:
            flat.load(self, f, path, wof)
        drop('flat')
        self.acc = {}
        self.g = {}
        # batch 1: the Trainer's upd(k, g) / upd_row(k, r, g) apply each gradient at
        # once (g in state_shape(k) / row r of it) instead of summing it;
        # upd_outer(k, u, v) applies outer(u, v) (True) when k's optimizer step allows
        self.upd = self.upd_row = self.upd_outer = None

    def load_weights(self, path):
        """Load the trainable tensors from a .wof file (onert-micro layout)."""
        from utrain import wof
        with wof.openr(path) as f:
            offs, size = wof.read_table(f, path, self.shape)
            for k in self.trainable:
                o = offs[k]
                if o == 0:
                    raise wof.FormatError('%s: no data for trainable tensor %d' % (path, k))
                f.seek(o)
                if self.t[k] is None:
                    self.t[k] = zeros(self.shape[k])
                readinto(f, self.t[k], path)

    def set_input(self, x, i=0):
        self.t[self.inputs[i]] = x

    def output(self, i=0):
        return self.t[self.outputs[i]]

    def forward(self, train=False):
        t = self.t
        free = self.free_train if train else self.free_infer
        ops, mods, st = self.ops, self.mods, self.stream
        for i in range(len(ops)):
            if st:
                st.fetch(i)
            # the last sample's output goes before this one's is made (not beside it)
            t[ops[i][2][0]] = None
            mods[i].forward(self, ops[i])
            if st:
                st.drop(i)
            for k in free[i]:
                t[k] = None

    def backward(self, dy):
        """Run the backward list from dL/d(output); adds into the weight-gradient sums."""
        g = self.g
        g[self.outputs[0]] = dy
        ops, mods, st = self.ops, self.mods, self.stream
        for oi, fl in self.bwd:
            op = ops[oi]
            d = g.pop(op[2][0], None)
            if d is not None:
                if st:
                    st.fetch(oi)
                mods[oi].backward(self, op, d, fl)
                if st:
                    st.drop(oi)
                if self.upd is not None and self.acc:
                    self._flush()
        g.clear()

    def _flush(self):
        # batch 1: apply the weight gradients a kernel summed into acc, then free them
        acc = self.acc
        for k in acc:
            self.upd(k, self.part(k, acc[k]))
        acc.clear()

    def add_grad(self, k, d):
        """Gradient arriving at activation tensor k (summed over its consumers)."""
        old = self.g.get(k)
        self.g[k] = d if old is None else old + d

    def wgrad(self, k):
        """The gradient sum of weight tensor k, whole (created on first use).  Under a
        rank only its training channels are applied (part())."""
        a = self.acc.get(k)
        if a is None:
            a = self.acc[k] = zeros(self.shape[k])
        return a

    def alloc_grads(self):
        """Every gradient sum now (batch > 1), largest first, before the heap fragments:
        a sum made lazily in the first backward pass may find no run long enough.  A
        kernel with WGRAD_WHOLE (op_conv) sums its weight whole, the others only a
        rank's training channels."""
        whole = set(self.ops[i][1][1] for i in range(len(self.ops))
                    if getattr(self.mods[i], 'WGRAD_WHOLE', False))
        for k in big_first(self.trainable, self.shape):
            if k in whole:
                self.wgrad(k)
            else:
                self.wgrad_rows(k)

    def wgrad_rows(self, k):
        """k's gradient sum in state_shape(k): only its training channels (for
        kernels that compute just those, like op_fc)."""
        a = self.acc.get(k)
        if a is None:
            a = self.acc[k] = zeros(self.state_shape(k))
        return a

    def part(self, k, a):
        """a (k's whole shape or already state_shape(k)) cut to k's training channels."""
        r = self.rank.get(k)
        if r is None or a.shape != self.shape[k]:
            return a
        ax, lo, hi = r
        return a[lo:hi] if ax == 0 else a[:, lo:hi]

    def state_shape(self, k):
        """Shape of k's gradient and optimizer state: the whole tensor, or its
        training output channels (rank)."""
        r = self.rank.get(k)
        if r is None:
            return self.shape[k]
        ax, lo, hi = r
        return (hi - lo, self.shape[k][1]) if ax == 0 else (self.shape[k][0], hi - lo)

    def rows(self, k):
        """The rows lo:hi of weight k that train (its output channels)."""
        r = self.rank.get(k)
        if r is None or r[0]:
            return 0, self.shape[k][0]
        return r[1], r[2]

    def add_wgrad(self, k, d):
        """Weight gradient d (whole tensor shape) of k: applied at once (batch 1)
        or added into its sum, restricted to k's training channels."""
        if len(d.shape) == 1:                   # a bias sum over rows: (n,) -> (1, n)
            d = d.reshape((1, d.shape[0]))
        d = self.part(k, d)
        if self.upd is not None:
            self.upd(k, d)
            return
        a = self.wgrad_rows(k)
        a += d

    def zero_grads(self):
        for a in self.acc.values():
            a[:] = 0.0
