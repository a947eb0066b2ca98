# Losses of an int8 model on float targets, loaded only by a run that trains with one
# (utrain.q8train): the loss on the dequantized output y = s_y (q - z_y) against the
# targets t, and its gradient dL/dy in floats, which Q8Net._run quantizes to int32 at
# scale 2^-20.
# cce: softmax cross-entropy on y against class probabilities t, gradient
# softmax(y) sum(t) - t; the metric accuracy (the largest logit the most probable class's).
# mse: sum (y - t)^2 / n, gradient 2 (y - t) / n; mae: sum |y - t| / n, sign(y - t) / n;
# the metric the mean absolute error, as the float trainer's.
# bce: y the logits (prepare leaves a final LOGISTIC to the loss, as a final SOFTMAX to
# scce's: host_tools/prepare/quant.py sigmoid_end), sum max(y, 0) - y t + log(1 + e^-|y|)
# / n, gradient (sigmoid(y) - t) / n; the metric the float trainer's accuracy (one
# output: y > 0 against t > 0.5; several: the largest logit the largest target's).
from math import exp, log

_GMAX = 1024.0         # |dL/dy| held within 2^30 of the int32 gradient at scale 2^-20


def use(tr):
    """Give trainer tr (a utrain.q8train.Q8Trainer) its loss on float targets: its net's in
    place of the softmax loss, and a test metric (mae) that is better lower (bce: the
    accuracy unless the run's metric is mae, the mean |sigmoid(y) - t|)."""
    net = tr.net
    kind = tr.cfg['loss']
    sq = kind == 'mse'
    mae = tr.cfg['metric'] == 'mae'

    def cce(x, t, grad=False):
        lg = net.logits(x)
        m = max(lg)
        e = [exp(v - m) for v in lg]
        s = sum(e)
        lt = log(s)
        ls = st = 0.0
        for i in range(len(t)):
            if t[i]:
                ls -= t[i] * (lg[i] - m - lt)
                st += t[i]
        c = t.index(max(t))
        hit = 1 if lg[c] == m and lg.index(m) == c else 0
        if not grad:
            return ls, hit
        dl = [v * st / s for v in e]
        for i in range(len(dl)):
            dl[i] -= t[i]
        return ls, hit, dl

    def bce(x, t, grad=False):
        y = net.logits(x)
        n = len(y)
        ls = ae = 0.0
        hit = ((y[0] > 0.0) == (t[0] > 0.5)) if n == 1 else y.index(max(y)) == t.index(max(t))
        for i in range(n):
            v = y[i]
            e = exp(-abs(v))
            ls += (v if v > 0.0 else 0.0) - v * t[i] + log(1.0 + e)
            d = (1.0 if v >= 0.0 else e) / (1.0 + e) - t[i]     # sigmoid(v) - t
            ae += abs(d)
            y[i] = d / n
        ls /= n
        m = ae / n if mae else (1 if hit else 0)
        return (ls, m, y) if grad else (ls, m)

    def loss(x, t, grad=False):
        y = net.logits(x)
        n = len(y)
        ls = ae = 0.0
        for i in range(n):
            d = y[i] - t[i]
            y[i] = d
            ae += abs(d)
            ls += d * d if sq else abs(d)
        ls /= n
        ae /= n
        if not grad:
            return ls, ae
        for i in range(n):
            d = y[i]
            d = 2.0 * d / n if sq else (1.0 if d > 0 else -1.0 if d < 0 else 0.0) / n
            y[i] = _GMAX if d > _GMAX else -_GMAX if d < -_GMAX else d
        return ls, ae, y

    net.loss = cce if kind == 'cce' else bce if kind == 'bce' else loss
    if not mae:
        return

    def better(tl, tm):
        b = tr.best
        if tl != tl or tm != tm or (b is not None and (tm > b[2] or (tm == b[2] and tl >= b[1]))):
            return False
        tr.best = (tr.epoch, tl, tm)
        return True
    tr.better = better
