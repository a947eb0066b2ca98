# Optimizers: one update rule each, applied in place to a weight array w from
# its batch gradient g (already divided by the batch for reduction 'mean').
#   sgd:     v = momentum*v + g; w -= lr*v        (plain w -= lr*g without momentum)
#   adam:    TensorFlow/ONERT form: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
#            w -= lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)
#   rmsprop: v = rho v + (1-rho) g^2; w -= lr * g / (sqrt(v) + eps)
# State per weight: m (sgd momentum velocity or adam first moment), v (second moment).
# In-place updates use only += and -= (see xnp.py): m = b m + (1-b) g is m += (g-m)(1-b).
from utrain.xnp import np, zeros, add_scaled, add_outer

OPTIMIZERS = ('sgd', 'adam', 'rmsprop')   # the flat model's codes, in order


class Optimizer:
    def __init__(self, kind='sgd', lr=0.01, momentum=0.0, beta1=0.9, beta2=0.999,
                 eps=1e-7, rho=0.9):
        if kind not in OPTIMIZERS:
            raise ValueError('unknown optimizer ' + kind)
        self.kind, self.lr, self.momentum = kind, lr, momentum
        self.beta1, self.beta2, self.eps, self.rho = beta1, beta2, eps, rho
        self.t = 0       # update count (adam bias correction, checkpoints)
        self.m = {}
        self.v = {}

    def init(self, k, shape):
        """Create whatever state weight tensor k lacks under the current settings
        (so turning SGD momentum on later adds its velocity, keeping the rest)."""
        if k not in self.m and (self.kind == 'adam' or (self.kind == 'sgd' and self.momentum)):
            self.m[k] = zeros(shape)
        if k not in self.v and self.kind in ('adam', 'rmsprop'):
            self.v[k] = zeros(shape)

    def begin(self):
        """Call once per update, before step() on each weight."""
        self.t += 1
        if self.kind == 'adam':
            b1, b2, t = self.beta1, self.beta2, self.t
            self._lr_t = self.lr * (1.0 - b2 ** t) ** 0.5 / (1.0 - b1 ** t)

    def step(self, k, w, g, scale=1.0):
        """Update w in place from the gradient sum g times scale (1/batch for 'mean'),
        a row at a time so temporaries stay one row long."""
        m = self.m.get(k)
        v = self.v.get(k)
        if m is None and self.kind == 'sgd':
            add_scaled(w, g, -self.lr * scale)       # one fused pass (rows on ulab)
            return
        if w.shape[0] == 1:
            self._row(w, g, m, v, scale)
            return
        for r in range(w.shape[0]):
            self._row(w[r], g[r], m[r] if m is not None else None,
                      v[r] if v is not None else None, scale)

    def step_row(self, k, r, w, g):
        """Update row r of k's state and the weight row w from its gradient g."""
        m = self.m.get(k)
        v = self.v.get(k)
        self._row(w, g, m[r] if m is not None else None, v[r] if v is not None else None, 1.0)

    def step_outer(self, k, w, u, v):
        """Batch 1, gradient outer(u, v) (a one-row FC's dW): plain SGD adds it times -lr
        into w in one pass (add_outer) and returns True; other rules need its rows
        (step_row): False, nothing done."""
        if self.kind != 'sgd' or self.m.get(k) is not None:
            return False
        add_outer(w, u * -self.lr, v)
        return True

    def _row(self, w, g, m, v, scale):
        kind = self.kind
        if kind == 'sgd':
            if m is not None:
                m += m * (self.momentum - 1.0) + g * scale
                w -= m * self.lr
            else:
                w -= g * (self.lr * scale)
            return
        if scale != 1.0:
            g = g * scale
        v += (g * g - v) * (1.0 - (self.beta2 if kind == 'adam' else self.rho))
        d = np.sqrt(v)
        d += self.eps
        if kind == 'adam':
            m += (g - m) * (1.0 - self.beta1)
            w -= m * self._lr_t / d
        else:
            w -= g * self.lr / d
