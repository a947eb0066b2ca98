# Dataset record files (docs/formats.md): samples are read one at a time into
# preallocated arrays, so a dataset larger than the heap still trains.  Values are
# stored as float32, uint8 or int8 (value = stored * scale + offset, from the header).
# Also an epoch over one: the sample order, the sums and position both trainers keep.
from struct import unpack
from array import array

MAGIC = b'UTDS'
VERSION = 2
HEAD = 48                  # version 2 header bytes (version 1: 32, float32 only)
# (bytes per value, array typecode) of dtype 0 float32, 1 uint8, 2 int8: one global, not
# two, so that epoch() below fits the module's globals table as it was (a 13th global
# grew it: 128 B of heap on 64-bit unix, measured)
TYPES = ((4, 'f'), (1, 'B'), (1, 'b'))


def header(path, h):
    """(version, header bytes, xt, yt, n, x_len, y_len, xs, xo, ys, yo) from the
    first bytes h of a dataset file; ValueError naming path otherwise."""
    if len(h) < 32:
        raise ValueError('%s: truncated dataset header' % path)
    magic, ver, xt, yt, n, xl, yl = unpack('<4sHBBIII', h[:20])
    if magic != MAGIC:
        raise ValueError('%s: not a utrain dataset (magic %r)' % (path, magic))
    if ver == 1:
        q, head = (1.0, 0.0, 1.0, 0.0), 32
    elif ver != VERSION:
        raise ValueError('%s: dataset version %d; this utrain reads versions 1 and %d: '
                         'rebuild it with `python -m host_tools dataset`' % (path, ver, VERSION))
    elif len(h) < HEAD:
        raise ValueError('%s: truncated dataset header' % path)
    else:
        q, head = unpack('<ffff', h[20:36]), HEAD
    for i in (0, 2):
        # value = stored * scale + offset: float32 as stored (scale 1, offset 0, as a
        # board reads it), bytes at a finite scale above 0 (a damaged 0 or NaN had
        # trained every sample the same, unsaid); dtypes 0-2 (version 1: 0)
        t, s, o = yt if i else xt, q[i], q[i + 1]
        # (a length below 1: n records of 0 bytes would pass the size check)
        if t > 2 or t and ver < 2 or (yl if i else xl) < 1 or not (
                s == 1 and o == 0 if t == 0 else s > 0 and s - s == 0 == o - o):
            raise ValueError('%s: damaged header: %s dtype %d, scale %r, offset %r, %d values'
                             % (path, 'xy'[i >> 1], t, s, o, yl if i else xl))
    return (ver, head, xt, yt, n, xl, yl) + q


class Dataset:
    def __init__(self, path, buffers=True):
        # buffers: False for a reader that takes the raw bytes itself (utrain.q8train)
        self.path = path
        try:
            f = self.f = open(path, 'rb')
        except OSError:
            raise ValueError('%s: cannot open (no such file?)' % path)
        (ver, self.head, xt, yt, n, xl, yl,
         self.xs, self.xo, self.ys, self.yo) = header(path, f.read(HEAD))
        self.n, self.x_len, self.y_len = n, xl, yl
        self.xbytes = TYPES[xt][0] * xl
        self.rec = self.xbytes + TYPES[yt][0] * yl
        f.seek(0, 2)
        if not n or f.tell() != self.head + n * self.rec:    # (0: a loss of 0 had been logged)
            raise ValueError('%s: %d bytes, expected %d for %d samples (at least 1)'
                             % (path, f.tell(), self.head + n * self.rec, n))
        # byte buffers for quantized values, allocated once (after the size check:
        # a corrupt header must not ask for a huge buffer); the inputs' at the first
        # read of one: a run whose inputs come from a prefix cache the host made
        # (train.ds.pfx) reads only targets here (a 64x64x3 uint8 sample's 12 KB had
        # been made anyway, unplanned: out of memory in the heap the plan gave)
        self.qx = None
        self.qt = TYPES[xt][1] if xt and buffers else None
        self.qy = array(TYPES[yt][1], bytes(yl)) if yt and buffers else None

    def xq(self):
        # the quantized inputs' byte buffer (None: float32 samples, or a raw reader)
        if self.qx is None and self.qt:
            self.qx = array(self.qt, bytes(self.x_len))
        return self.qx

    def check(self, x_shape, y_shape):
        if self.x_len != x_shape[0] * x_shape[1] or self.y_len != y_shape[0] * y_shape[1]:
            raise ValueError('%s: samples have %d inputs and %d targets; the model wants %d and %d'
                             % (self.path, self.x_len, self.y_len, x_shape[0] * x_shape[1],
                                y_shape[0] * y_shape[1]))

    def _get(self, a, q, s, o):
        # (utrain.xnp imported here, not with the module: an int8 run reads raw bytes and
        # never loads it, which without ulab is the numpy fallback's code)
        from utrain.xnp import readinto, decode
        f = self.f
        if q is None:
            readinto(f, a, self.path)
        else:
            if f.readinto(q) != len(q):
                raise ValueError('%s: truncated' % self.path)
            decode(q, a, s, o)

    def read(self, i, x, y):
        """Read sample i into the float arrays x and y (x None: only y)."""
        self.f.seek(self.head + i * self.rec + (self.xbytes if x is None else 0))
        if x is not None:
            self._get(x, self.xq(), self.xs, self.xo)
        self._get(y, self.qy, self.ys, self.yo)

    def close(self):
        self.f.close()


def order(n, seed, epoch):
    """Sample order for an epoch: None (file order) for seed None, else a seeded
    Fisher-Yates shuffle (xorshift32), identical under MicroPython and CPython,
    as a compact array (2 or 4 bytes a sample)."""
    if seed is None:
        return None
    idx = array('H' if n < 65536 else 'I', range(n))
    s = (seed * 2654435761 + epoch * 40503 + 1) & 0xFFFFFFFF or 1
    for i in range(n - 1, 0, -1):
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        j = s % (i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    return idx


# An epoch over a dataset, the bookkeeping both trainers share (utrain.trainer's float
# Trainer and utrain.q8train's Q8Trainer; here, in a module both load, because a module
# of its own would cost heap): the loss and metric sums, the position in the epoch, the
# commit point a Ctrl-C goes back to (utrain.once), the checkpoint every `every` samples.

def epoch(tr, ds, progress=None, ckpt=None, every=0):
    """Both trainers' train_epoch (tr: self): one pass over the Dataset ds through
    tr._pass(ds, True, ...) from sample tr.pos on (after a resume), then tr.apply() and
    tr._check(''); returns the mean (loss, metric) over its samples.  progress(i, n,
    loss_sum, metric_sum) is called after each sample; with ckpt and every, a checkpoint
    is saved at the first batch boundary after every `every` samples."""
    c = tr.cfg
    if tr.pos > ds.n:
        raise ValueError('%s: %d samples, but the checkpoint stopped at sample %d'
                         % (ds.path, ds.n, tr.pos))
    idx = order(ds.n, c['seed'] if c['shuffle'] else None, tr.epoch)
    last = tr.pos
    tr.commit, tr.dirty = (last, tr.sums), False

    def hook(i, n, ls, ms):
        nonlocal last
        s = ls, ms
        if tr.pending:
            tr.pos, tr.sums = i, s
        else:                    # a whole batch: its update and position together
            tr.pos, tr.sums, tr.commit, tr.dirty = i, s, (i, s), False
        if progress:
            progress(i, n, ls, ms)
        if every and ckpt and not tr.pending and i - last >= every and i < n:
            tr.save_checkpoint(ckpt)
            last = i

    r = tr._pass(ds, True, idx, hook, tr.pos, tr.sums)
    tr.apply()
    tr._check('')
    z = (0.0, 0.0)
    tr.epoch, tr.pos, tr.sums, tr.commit, tr.dirty, tr.last = (
        tr.epoch + 1, 0, z, (0, z), False, r)
    return r
