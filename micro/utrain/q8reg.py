# Regression losses of an int8 model (mse, mae: utrain.losses' per sample), loaded only by
# a run that trains with one (utrain.q8train): the loss on the dequantized output
# y = s_y (q - z_y) against the float targets t, and its gradient dL/dy in floats, which
# Q8Net._run quantizes to int32 at cce's scale 2^-20 as it does cce's.  The metric is
# the mean absolute error, as the float trainer's.
# mse: sum (y - t)^2 / n, gradient 2 (y - t) / n; mae: sum |y - t| / n, sign(y - t) / n.
_GMAX = 1024.0         # |dL/dy| held within 2^30 of the int32 gradient at scale 2^-20


def use(tr):
    """Give trainer tr (a utrain.q8train.Q8Trainer) its regression loss: its net's in
    place of the softmax loss, and a test metric (mae) that is better lower."""
    net = tr.net
    sq = tr.cfg['loss'] == 'mse'

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

    net.loss = loss
    if tr.cfg['metric'] == 'accuracy':
        return

    def better(tl, tm):
        b = tr.best
        if tl != tl or tm != tm or (b is not None and (tm > b[2] or (tm == b[2] and tl >= b[1]))):
            return False
        tr.best = (tr.epoch, tl, tm)
        return True
    tr.better = better
