# Optimizers: one update rule each, applied in place to a weight array w from
# its batch gradient g (already divided by the batch for reduction 'mean').
#   sgd:     v = momentum*v + g; w -= lr*v        (plain w -= lr*g without momentum)
#   adam:    TensorFlow/ONERT form: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
#            w -= lr*sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)
#   rmsprop: v = rho v + (1-rho) g^2; w -= lr * g / (sqrt(v) + eps)
#   adamw:   PyTorch's AdamW: w -= lr*wd*w (decoupled decay), then
#            w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
# weight_decay wd with sgd, adam and rmsprop is PyTorch's coupled L2: g += wd*w.
# lr is the base rate: a schedule (utrain/sched.py, imported only when one is set)
# scales it by update t's factor.
# State per weight: m (sgd momentum velocity or adam first moment), v (second moment).
# In-place updates use only += and -= (see xnp.py): m = b m + (1-b) g is m += (g-m)(1-b).
from utrain.xnp import np, zeros, add_scaled, add_outer, ROWWISE

OPTIMIZERS = ('sgd', 'adam', 'rmsprop', 'adamw')   # the flat model's codes, in order


class Optimizer:
    wd = 0.0        # weight decay
    sched = None    # or a schedule (utrain/sched.py)

    def __init__(self, kind='sgd', lr=0.01, momentum=0.0, beta1=0.9, beta2=0.999,
                 eps=1e-7, rho=0.9):
        if kind not in OPTIMIZERS:
            raise ValueError('unknown optimizer ' + kind)
        self.kind, self.lr, self.momentum = kind, lr, momentum
        self.beta1, self.beta2, self.eps, self.rho = beta1, beta2, eps, rho
        self.t = 0       # update count (adam bias correction, checkpoints)
        self.m = {}
        self.v = {}

    def set(self, c, scale=1.0):
        """Take the settings c (the trainer's: model.flat's and train.json's), lr times
        scale (lowered after a divergence)."""
        self.lr, self.momentum, self.beta1, self.beta2, self.eps, self.rho, self.wd, self.sched = (
            c['lr'] * scale, c['momentum'], c['beta1'], c['beta2'], c['eps'], c['rho'],
            c['weight_decay'], None)
        if c['warmup'] or c['schedule'] != 'constant':
            from utrain.sched import of
            self.sched = of(c)

    def init(self, k, shape):
        """Create whatever state weight tensor k lacks under the current settings
        (so turning SGD momentum on later adds its velocity, keeping the rest)."""
        if k not in self.m and ('adam' in self.kind or (self.kind == 'sgd' and self.momentum)):
            self.m[k] = zeros(shape)
        if k not in self.v and self.kind != 'sgd':
            self.v[k] = zeros(shape)

    def begin(self):
        """Call once per update, before step() on each weight."""
        self.t += 1
        t, lr, sc = self.t, self.lr, self.sched
        if sc:
            from utrain.sched import factor
            lr *= factor(t, sc)
        self._lr, self._eps = lr, self.eps
        if 'adam' in self.kind:
            c2 = (1.0 - self.beta2 ** t) ** 0.5
            self._lr_t = lr * c2 / (1.0 - self.beta1 ** t)
            if self.kind == 'adamw':    # PyTorch's eps, outside the bias-corrected root
                self._eps *= c2

    def step(self, k, w, g, scale=1.0):
        """Update w in place from the gradient sum g times scale (1/batch for 'mean'),
        a row at a time so temporaries stay one row long."""
        m = self.m.get(k)
        v = self.v.get(k)
        if m is None and self.kind == 'sgd' and not self.wd:
            add_scaled(w, g, -self._lr * scale)      # one fused pass (rows on ulab)
            return
        if w.shape[0] == 1 or not ROWWISE:
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
        (step_row): False, nothing done; the host (numpy) steps the whole product."""
        if self.kind != 'sgd' or self.wd or self.m.get(k) is not None:
            if ROWWISE:
                return False
            self.step(k, w, np.outer(u[0], v[0]))
            return True
        add_outer(w, u * -self._lr, v)
        return True

    def _row(self, w, g, m, v, scale):
        kind, lr, wd = self.kind, self._lr, self.wd
        if scale != 1.0:
            g = g * scale
        if wd:
            if kind == 'adamw':
                w -= w * (lr * wd)          # decoupled: before the step, off the gradient
            else:
                g = g + w * wd              # L2, as PyTorch's weight_decay
        if kind == 'sgd':
            if m is not None:
                m += m * (self.momentum - 1.0) + g
                g = m
            w -= g * lr
            return
        v += (g * g - v) * (1.0 - (self.rho if kind == 'rmsprop' else self.beta2))
        d = np.sqrt(v)
        d += self._eps
        if kind != 'rmsprop':
            m += (g - m) * (1.0 - self.beta1)
            w -= m * self._lr_t / d
        else:
            w -= g * lr / d
