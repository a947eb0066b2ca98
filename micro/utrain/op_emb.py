# GATHER (36) of a table's rows: an embedding (Keras Embedding, PyTorch nn.Embedding as
# ONNX Gather).  Inputs: the table W [N, D] (trainable) and the indices x (the model's
# input: token ids, category codes, as floats holding integers), the output
# y[j] = W[x[j]], [len(x), D] on the device.  Options (utrain.opc): GA_N the table's rows,
# GA_WRAP (1: an index in -N..-1 reads row index + N, as Keras's Embedding and ONNX
# Gather do; 0: it is out of range, as TFLite's GATHER).  An index that is not an
# integer or not a row stops the run with a ValueError naming the table tensor, the
# value and the range (TFLite's GATHER errors too).
# Backward: dW[x[j]] += dy[j] (a scatter-add: only the rows used get a gradient); no
# gradient to the indices (they are data, not a function of weights).  Plain SGD at
# batch 1 steps each used row in place (no table-sized array); other rules and batch > 1
# add into the sink's gradient array (WGRAD_WHOLE; under a rank (rows lo..hi) the
# rows outside it are left out).
# Saved for backward: x.  Temporaries: the output; the index list.
from utrain.xnp import zeros, const
_GA_N = const(0)
_GA_WRAP = const(1)
_DW = const(2)

WGRAD_WHOLE = True


def _rows(rt, op):
    # the table rows op's indices pick, checked
    code, ins, outs, o = op
    n, wrap, out = int(o[_GA_N]), o[_GA_WRAP], []
    for v in rt.t[ins[1]].flatten():
        i = int(v)
        r = i + n if i < 0 and wrap else i
        if i != v or not 0 <= r < n:
            raise ValueError('GATHER of table tensor %d: index %s is not a row of its %d '
                             '(0..%d%s); give the model ids in that range'
                             % (ins[0], v, n, n - 1, ', or -%d..-1' % n if wrap else ''))
        out.append(r)
    return out


def forward(rt, op):
    code, ins, outs, o = op
    w = rt.t[ins[0]]
    y = zeros(rt.shape[outs[0]])
    for j, i in enumerate(_rows(rt, op)):
        y[j] = w[i]
    rt.t[outs[0]] = y


def backward(rt, op, dy, flags):
    if not flags & _DW:
        return
    k = op[1][0]
    rows = _rows(rt, op)
    s = rt.sink
    opt = getattr(s, 'opt', None)
    if s.now and opt.kind == 'sgd' and not opt.wd and k not in opt.m:
        w = rt.t[k]
        r = rt.rank.get(k)
        lo, hi = (r[1], r[2]) if r else (0, w.shape[0])
        for j, i in enumerate(rows):
            if lo <= i < hi:
                opt.step(k, w[i:i + 1], dy[j:j + 1])
        return
    a = s.grad(k)
    # whole (Apply cuts it to a rank after the op), or only a rank's rows (Sums.alloc
    # finds a WGRAD_WHOLE weight at input 1, this table is input 0)
    r = rt.rank.get(k)
    lo = r[1] if r and a.shape[0] != rt.shape[k][0] else 0
    for j, i in enumerate(rows):
        if 0 <= i - lo < a.shape[0]:
            r = a[i - lo]
            r += dy[j]
