# The engine that runs a flattened model (docs/flat-model.md): forward, and backward over
# the host-derived backward list; kernels hand weight gradients to self.sink
# (utrain.sink).  The file's reader is utrain.flat, imported only while a model loads;
# with --stream frozen weights stay in the file and are read just before the op that
# needs them (utrain.stream).
from utrain.xnp import zeros, readinto
from utrain import drop  # noqa: F401  (utrain.model.drop: trainer, prefix)
import gc

# gc.threshold() (MicroPython): training's bytes between collections (run.gc_every), -1
# when none; CPython has none (int() is 0)
_thr = getattr(gc, 'threshold', int)


class Net:
    """A loaded model: tensors t[k], their 2-D shapes, ops, and the backward list."""

    def __init__(self, path):
        self.path = path
        from utrain import wof, flat
        with wof.openr(path) as f:
            flat.load(self, f, path, wof)
        drop('flat')
        # the activations a training forward pass keeps for the backward pass (freed
        # after it, so the next sample starts on a heap without them scattered over it)
        tr = set(k for ks in self.free_train for k in ks)
        self.saved = [k for ks in self.free_infer for k in ks if k not in tr]
        self.g = {}
        # the tensors that die at the op running (free[i]): a kernel may work in place
        # on those inputs only (utrain.op_act)
        self.dead = ()
        # where the kernels hand weight gradients (utrain.sink): sums, unless the
        # Trainer installs another
        from utrain.sink import Sums
        self.sink = Sums(self)

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

    def forward(self, train=False, lo=0, hi=None):
        # ops lo..hi-1 (the frozen-prefix cache runs a sample's prefix and the rest apart)
        t = self.t
        free = self.free_train if train else self.free_infer
        ops, mods, st, bands = self.ops, self.mods, self.stream, self.bands
        i, hi = lo, len(ops) if hi is None else hi
        # Collected at op boundaries too: before an op, once the outputs of the ops since
        # the last collection (its own counted) reach gc_every's bytes.  A threshold alone
        # collects wherever the step's count of bytes falls, which moves with gc_every:
        # the smallest heap that trained a streamed 1-D depthwise net on 32-bit ulab went
        # from 130 to 165 KB and back as gc_every went over 1-12 KB (docs/memory.md,
        # session 29); collected here, it was 128-133 KB at every gc_every up to 8 KB.
        every, made, shape = _thr(), 0, self.shape
        while i < hi:
            if bands and i in bands:    # a frozen chain a few rows at a time
                from utrain.bands import run
                i = run(self, i, free)
                continue
            if st:
                st.fetch(i)
            # the last sample's output goes before this one's is made (not beside it)
            o = ops[i][2][0]
            t[o] = None
            if every > 0:
                r, c = shape[o]
                made += r * c << 2
                if made >= every:
                    gc.collect()
                    made = 0
            self.dead = free[i]
            mods[i].forward(self, ops[i])
            if st:
                st.drop(i)
            for k in free[i]:
                t[k] = None
            i += 1
        self.dead = ()

    # fuse_head(kind, from_logits): whether loss kind on probabilities takes the model's
    # final op whole (self.fin, flat.load's: a final SOFTMAX for cce and scce, LOGISTIC
    # for bce); then the loss's gradient (losses.loss fused: p - t) is that op's input's
    # (self.sk), and backward starts after it (self.head 1)
    def fuse_head(self, kind, from_logits):
        f = self.fin
        self.head = h = int(f is not None and not from_logits and kind in f[1])
        self.sk = f[0] if h else self.outputs[0]
        return h

    def backward(self, dy):
        """Run the backward list from dL/d(output); weight gradients go to self.sink."""
        g, sink = self.g, self.sink
        g[self.sk] = dy
        ops, mods, st = self.ops, self.mods, self.stream
        bwd = self.bwd
        for j in range(self.head, len(bwd)):
            oi, fl = bwd[j]
            op = ops[oi]
            outs = op[2]
            d = g.pop(outs[0], None)
            # a multi-output op (SPLIT) runs when any of its outputs has a gradient
            if d is not None or len(outs) > 1 and any(k in g for k in outs):
                if st:
                    st.fetch(oi)
                mods[oi].backward(self, op, d, fl)
                if st:
                    st.drop(oi)
                sink.end()
        g.clear()
        t = self.t
        for k in self.saved:
            t[k] = None

    def add_grad(self, k, d):
        """Gradient arriving at activation tensor k (summed over its consumers)."""
        old = self.g.get(k)
        self.g[k] = d if old is None else old + d

    def shared(self):
        """Whether a trainable tensor feeds more than one op (the weights of an
        unrolled LSTM or GRU, read by every time step)."""
        seen, tr = set(), set(self.trainable)
        for op in self.ops:
            for k in op[1]:
                if k in tr:
                    if k in seen:
                        return True
                    seen.add(k)
        return False
