# The frozen-prefix cache (docs/memory.md).  When no op below k trains (k: the first op
# with a trainable input) and the samples are not augmented, the tensors ops 0..k-1 hand
# to ops k.. (the cut) are the same every epoch.  The first pass over a dataset computes
# them as inference and writes them to <dataset>.pfx next to it; later passes read a
# sample's cut from there and run ops k.. only.
# File: header '<4sHHIIII' (magic, version, k, cut tensors, samples, dataset bytes,
# model bytes), per cut tensor '<III' (id, rows, cols), then per sample the cut's
# float32 values in that order.  Written to <path>.tmp and renamed once every sample is
# in (a pass cut short leaves no partial cache); a file that does not match the model
# and dataset (header, size) is rebuilt, never trusted.
from struct import pack
from utrain.xnp import zeros, readinto, write

MAGIC = b'UTPC'
VERSION = 1


def cut(net):
    """(k, [tensor ids]) of net's frozen prefix; k = 0 when there is none."""
    tr = net.trainable
    ops = net.ops
    k = 0
    while k < len(ops) and not any(t in tr for t in ops[k][1]):
        k += 1
    if k == len(ops):
        return 0, []
    made = set(net.inputs)
    for i in range(k):
        made.update(ops[i][2])
    ts = []
    for i in range(k, len(ops)):
        for t in ops[i][1]:
            if t in made and t not in ts:
                ts.append(t)
    return k, ts


def _size(path):
    import os
    return os.stat(path)[6]


def header(net, ds, k, ts):
    """The cache file's header for Dataset ds through net cut at op k into tensors ts."""
    sh = net.shape
    h = pack('<4sHHIIII', MAGIC, VERSION, k, len(ts), ds.n, _size(ds.path), _size(net.path))
    for t in ts:
        h += pack('<III', t, sh[t][0], sh[t][1])
    return h


class Prefix:
    """The cut of every sample of one dataset: ready (read) or being filled."""

    def __init__(self, net, ds, k, ts, bufs):
        self.net, self.k, self.ts, self.bufs = net, k, ts, bufs
        self.path = ds.path + '.pfx'
        sh = net.shape
        h = header(net, ds, k, ts)
        self.head = len(h)
        self.rec = 4 * sum(sh[t][0] * sh[t][1] for t in ts)
        self.n = ds.n
        self.note = None
        self.f = self.done = None
        try:
            f = open(self.path, 'rb')
        except OSError:
            f = None
        if f is not None:
            why = None
            if f.read(len(h)) != h:
                why = 'made for another model, dataset or cut'
            else:
                f.seek(0, 2)
                if f.tell() != self.head + self.n * self.rec:
                    why = '%d bytes, expected %d' % (f.tell(), self.head + self.n * self.rec)
            if why is None:
                self.f = f
                return
            f.close()
            self.note = '%s: %s; computing it again' % (self.path, why)
        self._start(h)

    def _start(self, h):
        self.f = open(self.path + '.tmp', 'wb')
        self.f.write(h)
        self.todo = self.n
        self.done = bytearray(self.n)

    def load(self, j):
        """Sample j's cut into the net's tensors (a ready cache)."""
        f, t = self.f, self.net.t
        f.seek(self.head + j * self.rec)
        for i in range(len(self.ts)):
            t[self.ts[i]] = readinto(f, self.bufs[i], self.path)

    def save(self, j):
        """The net's cut tensors as sample j's (filling); the file is complete, renamed
        and read from then on once every sample is in."""
        if self.done[j]:
            return
        f, t = self.f, self.net.t
        f.seek(self.head + j * self.rec)
        for k in self.ts:
            write(f, t[k])
        self.done[j] = 1
        self.todo -= 1
        if not self.todo:
            f.close()
            from utrain.wof import _replace
            from utrain.model import drop
            _replace(self.path + '.tmp', self.path)
            drop('wof')
            self.f = open(self.path, 'rb')
            self.done = None

    def close(self):
        if self.f is not None:
            self.f.close()
            self.f = None


def get(tr, ds):
    """Trainer tr's cache for Dataset ds (made at first use), or None when the model has
    no frozen prefix (tr.cache then goes off); the cut's buffers are shared by every
    dataset's cache."""
    pf = tr.prefixes.get(ds.path)
    if pf is None:
        net = tr.net
        k, ts = cut(net)
        if not k:
            tr.cache = False
            return None
        if tr.cut_bufs is None:
            tr.cut_bufs = [zeros(net.shape[t]) for t in ts]
        pf = tr.prefixes[ds.path] = Prefix(net, ds, k, ts, tr.cut_bufs)
        if pf.note:
            print('utrain: ' + pf.note)
    return pf


def drop(tr, datasets):
    """When every dataset's cache is ready (made by prepare --cache-on-host), the frozen
    prefix's op tables and the kernels only it uses leave the heap (about 1 KB per conv
    op).  Ops below k cannot run after this: Trainer.predict() needs them.  Returns k,
    or 0 (nothing dropped)."""
    import gc
    from utrain.model import drop as drop_module
    pfs = [tr._prefix(d) for d in datasets if d]
    if not pfs or [p for p in pfs if p is None or p.done is not None]:
        return 0
    net = tr.net
    k = pfs[0].k
    keep = [m.__name__ for m in net.mods[k:]]
    gone = []
    for i in range(k):
        n = net.mods[i].__name__
        if n not in keep and n not in gone:
            gone.append(n)
        net.ops[i] = net.mods[i] = None
        net.free_infer[i] = net.free_train[i] = ()
        if net.stream:
            net.stream.ops[i] = ()
    for n in gone:
        drop_module(n.split('.')[-1])
    gc.collect()
    return k
