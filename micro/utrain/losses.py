# Losses: value and gradient side by side, per sample.  y is the model output,
# t the expected data, both 2-D (1, C); for scce t holds the class index.
# Reduction over a batch (mean or sum) is applied by the trainer.
from utrain.xnp import np
from utrain.op_act import softmax

EPS = 1e-7
LOSSES = ('mse', 'mae', 'cce', 'scce', 'bce')   # the flat model's codes, in order
METRICS = ('accuracy', 'mae')


def _n(y):
    return y.shape[0] * y.shape[1]


def _onehot(y, t):
    oh = y * 0.0
    oh[0, int(t[0, 0])] = 1.0
    return oh


def loss(kind, y, t, from_logits=False, fused=False):
    """Return (loss value, dL/dy) for one sample.  fused: y is the probabilities of
    the model's final SOFTMAX (cce, scce) or LOGISTIC (bce) and the gradient is the one
    of the logits that op reads, p - t (Net.fuse_head): whole where the probabilities
    round to 0 or 1 (a float32 sigmoid is 1.0 from a logit of 17 on), where the chain
    rule through the op's y (1 - y) gave 0 and a confident model never learned."""
    if kind == 'mse':
        d = y - t
        return np.sum(d * d) / _n(y), d * (2.0 / _n(y))
    if kind == 'mae':
        d = y - t
        return np.sum(abs(d)) / _n(y), np.where(d > 0.0, 1.0, np.where(d < 0.0, -1.0, 0.0)) / _n(y)
    if kind == 'scce':
        t = _onehot(y, t)
        kind = 'cce'
    if kind == 'cce':
        if from_logits:
            p = softmax(y)
            return -np.sum(t * np.log(np.clip(p, 1e-30, 1.0))), p - t
        # probabilities (the model ends in SOFTMAX): -sum t log y; gradient as ONERT's
        v = -np.sum(t * np.log(np.clip(y, EPS, 1.0)))
        return v, (y - t if fused else -t / np.maximum(y, 1e-20))
    if kind == 'bce':
        n = _n(y)
        if from_logits:
            # stable: max(z,0) - z t + log(1 + exp(-|z|)); grad sigmoid(z) - t
            a = abs(y)
            v = np.sum(np.maximum(y, 0.0) - y * t + np.log(np.exp(-a) + 1.0)) / n
            e = np.exp(-y)
            e += 1.0
            return v, (1.0 / e - t) / n
        p = np.clip(y, EPS, 1.0 - EPS)
        v = -np.sum(t * np.log(p) + (1.0 - t) * np.log(1.0 - p)) / n
        return v, ((y - t) if fused else (p - t) / (p * (1.0 - p))) / n
    raise ValueError('unknown loss ' + kind)


def metric(kind, y, t, loss_kind, from_logits=False):
    """Per-sample metric: accuracy (1.0 or 0.0) or mean absolute error."""
    if kind == 'mae':
        return np.sum(abs(y - t)) / _n(y)
    if y.size == 1:  # binary: threshold the probability or the logit
        cut = 0.0 if from_logits else 0.5
        return 1.0 if (y[0, 0] > cut) == (t[0, 0] > 0.5) else 0.0
    want = int(t[0, 0]) if loss_kind == 'scce' else int(np.argmax(t))
    return 1.0 if int(np.argmax(y)) == want else 0.0
