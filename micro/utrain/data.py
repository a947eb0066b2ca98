# Dataset record files (docs/formats.md): samples are read one at a time into
# preallocated arrays, so a dataset larger than the heap still trains.
from struct import unpack
from array import array
from utrain.xnp import readinto

MAGIC = b'UTDS'
VERSION = 1


class Dataset:
    def __init__(self, path):
        self.path = path
        try:
            f = self.f = open(path, 'rb')
        except OSError:
            raise ValueError('%s: cannot open (no such file?)' % path)
        h = f.read(32)
        if len(h) != 32:
            raise ValueError('%s: truncated dataset header' % path)
        magic, ver, xt, yt, n, xl, yl = unpack('<4sHBBIII', h[:20])
        if magic != MAGIC:
            raise ValueError('%s: not a utrain dataset (magic %r)' % (path, magic))
        if ver != VERSION or xt or yt:
            raise ValueError('%s: dataset version %d / dtypes %d,%d not supported' % (path, ver, xt, yt))
        self.n, self.x_len, self.y_len = n, xl, yl
        self.rec = 4 * (xl + yl)
        f.seek(0, 2)
        if f.tell() != 32 + n * self.rec:
            raise ValueError('%s: %d bytes, expected %d for %d samples' % (path, f.tell(), 32 + n * self.rec, n))

    def check(self, x_shape, y_shape):
        if self.x_len != x_shape[0] * x_shape[1] or self.y_len != y_shape[0] * y_shape[1]:
            raise ValueError('%s: samples have %d inputs and %d targets; the model wants %d and %d'
                             % (self.path, self.x_len, self.y_len, x_shape[0] * x_shape[1],
                                y_shape[0] * y_shape[1]))

    def read(self, i, x, y):
        """Read sample i into the arrays x and y."""
        f = self.f
        f.seek(32 + i * self.rec)
        readinto(f, x, self.path)
        readinto(f, y, self.path)

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
