# The backward walk of an int8 layer table that is not a chain (issue 28: a tensor read
# by several layers, nested residual ADDs, a CONCATENATION's or a broadcasting binary op's
# inputs): the gradients of
# tensors that are not next in the chain wait in held int32 buffers, one a slot (a slot
# is free again once the tensor's producer takes its gradient), and join the chain at
# their producer, at the larger of the two scales.  Loaded by utrain.q8 only for a table
# whose walk holds a gradient (q8.chain): a chain (an MLP, MobileNetV2's sparse schemes)
# hands each layer's input gradient to the layer below and loads none of this (code is
# heap on a board).  host_tools/plan/memory.py plans the slots with holds().
from utrain import q8kern as K

_ADD = 4    # q8.ADD
_CAT = 7    # q8.CAT


class Holds:
    def __init__(self, net, ls, ga, qmul, i32):
        # (ga: q8.grads(ls); qmul, i32: utrain.q8's, which imports this: no import circle)
        self.net, self.qmul = net, qmul
        self.hs, self.sz = holds(ls, ga)
        # one buffer a slot, made with the net's shared buffers (the walk planned once:
        # its temporaries between the buffers fragment a board's heap)
        self.hb = [i32(n) for n in self.sz]
        self.pend = {}
        self.tn = tn = {}           # each tensor's values (its gradient's size)
        for d in ls:
            tn[d['out']] = d['nout']

    def walk(self, g, s, lr):
        """Q8Net._run's backward pass from the loss gradient g (int32, scale s): g is the
        gradient of tensor c (mostly the output of the next layer down); the gradients of
        other tensors wait in the held buffers (pend: tensor -> scale) for their producer
        and join the chain there (holds() plans the same walk)."""
        net, pend = self.net, self.pend
        ls = net.layers
        pend.clear()
        i = len(ls) - 1
        c = ls[i].d['out']
        while i >= net.first:
            L = ls[i]
            o = L.d['out']
            if c is not None and c != o:        # not this layer's: held for its producer
                self.hold(c, g, s, self.tn[c])
                c = None
            if o in pend:
                t = pend.pop(o)
                h, n = self.hb[self.hs[o]], self.tn[o]
                if c is None:       # (into a gradient buffer: the held one is free again)
                    g, s, c = net._gbuf(None, n), t, o
                    K.cpk(g, h, n)
                else:
                    s = self._scale(h, t, g, s, n)
                    K.adk(g, h, n)
            if c != o:                  # no gradient reaches this layer
                i -= 1
                continue
            gi = L.gi
            g, s = net._back(L, g, s, lr, len(gi) > 0)
            c = L.ins[gi[0]] if gi else None
            i -= 1

    def _scale(self, h, t, g, s, n):
        # g (scale s) or h (scale t), n values each, brought to the larger of the two
        # scales in place; returns it
        net = self.net
        m, e = net.qm, net.qs
        if t > s:
            m[0], e[0] = self.qmul(s / t)
            K.rqk(g, n, 1, n, m, e, g, 0, 0, 0, 1)
            return t
        if t < s:
            m[0], e[0] = self.qmul(t / s)
            K.rqk(h, n, 1, n, m, e, h, 0, 0, 0, 1)
        return s

    def hold(self, k, g, s, n, cp=None):
        """Hold the gradient of tensor k (g at scale s, n values; cp: the slice of g that
        is k's, utrain.q8cat's rows, length, stride, offset) for k's producer, added to
        what k already holds at the larger scale.  Returns g's scale (raised where the
        held one's was larger)."""
        h = self.hb[self.hs[k]]
        t = self.pend.get(k)
        if t is not None:
            s = self._scale(h, t, g, s, n if cp is None or t > s else self.tn[k])
        self.pend[k] = s
        if cp is None:
            (K.cpk if t is None else K.adk)(h, g, n)
        else:
            self.net.X[_CAT].gak(h, g, cp[0], cp[1], cp[2], cp[3], t is not None)
        return s


def holds(ls, ga):
    """({tensor: slot}, [slot values]) of layer table ls (ga: q8.grads(ls)): the held int32 gradients of
    Holds.walk (a residual ADD's other input, the inputs of a CONCATENATION after its
    first, the chain's tensor when the next layer down is not its producer), each in a
    slot of the largest it holds, free again once its producer takes it
    (host_tools/plan/memory.py plans them with this; none for a chain, q8.chain)."""
    first = min([i for i in range(len(ls)) if ls[i].get('train') or ls[i].get('eg')] or [len(ls)])   # q8.lowest
    n = {}
    for d in ls:
        n[d['out']] = d['nout']
    slot, size, free, pend = {}, [], [], {}

    def put(k):
        if k in pend:
            return
        j = free.pop() if free else len(size)
        if j == len(size):
            size.append(0)
        pend[k] = slot[k] = j
        if n[k] > size[j]:
            size[j] = n[k]
    c = ls[-1]['out'] if ls else None
    for i in range(len(ls) - 1, first - 1, -1):
        d = ls[i]
        o = d['out']
        if c is not None and c != o:
            put(c)
            c = None
        if o in pend:
            free.append(pend.pop(o))
            c = o
        if c != o:
            continue
        gi = ga[i]
        c = d['in'][gi[0]] if gi else None
        if d['k'] == _ADD and len(gi) > 1 and d['in'][0] != d['in'][1]:
            put(d['in'][gi[1]])
        elif d['k'] >= _CAT:            # (CAT, BIN: every input after the first)
            for j in gi[1:]:
                put(d['in'][j])
    return slot, size
