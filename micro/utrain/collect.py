# Device data collection: append labelled samples (from a sensor, say) to a dataset
# file on the board, so personal data never leaves it; train on it with Dataset.
#   from utrain.collect import Recorder
#   r = Recorder('mine.ds', 64, 1, dtype=1, scale=1 / 255)  # create, or append to it
#   r.add(values, label)     # x_len numbers; a class index or y_len target numbers
#   r.close()
# dtype: 0 float32, 1 uint8, 2 int8 (stored = round((value - offset) / scale), clipped).
# Targets are stored as float32.  The sample count in the header is updated after each
# record, so a cut write loses at most the sample being written.
from struct import pack
from array import array
from utrain.data import MAGIC, VERSION, HEAD, TYPES, header

LIMITS = (None, (0, 255), (-128, 127))
N_AT = 8                    # offset of the header's u32 sample count


def header_bytes(x_dtype, n, x_len, y_len, xs=1.0, xo=0.0, ys=1.0, yo=0.0):
    """The HEAD bytes of a version-2 dataset file: the one header writer, used by the
    host's converters too (utrain.data.header reads it)."""
    h = pack('<4sHBBIIIffff', MAGIC, VERSION, x_dtype, 0, n, x_len, y_len, xs, xo, ys, yo)
    return h + bytes(HEAD - len(h))


def finite(v):
    # a number, not NaN or Inf (a bool is a number: 0 or 1)
    try:
        return v - v == 0
    except TypeError:
        return False


class Recorder:
    def __init__(self, path, x_len, y_len=1, dtype=0, scale=1.0, offset=0.0):
        self.path = path
        try:
            f = open(path, 'r+b')
        except OSError:
            f = None
        if f is None:
            if dtype not in (0, 1, 2):
                raise ValueError('%s: dtype must be 0 (float32), 1 (uint8) or 2 (int8)' % path)
            if not (scale > 0 and finite(scale) and finite(offset)) or not dtype and (
                    scale != 1 or offset):
                # (a float32 file's scale had been written and read by the host, not the board)
                raise ValueError('%s: scale %r, offset %r: ' % (path, scale, offset) + (
                    'dtype 0 stores float32 values as they are: leave scale and offset out'
                    if not dtype else 'give a finite scale above 0 and a finite offset'))
            f = open(path, 'w+b')
            f.write(header_bytes(dtype, 0, x_len, y_len, scale, offset))
            n = 0
        else:
            ver, head, dtype, yt, n, xl, yl, scale, offset, _, _ = header(path, f.read(HEAD))
            if ver != VERSION or yt or (xl, yl) != (x_len, y_len):
                f.close()
                raise ValueError('%s: holds %d inputs + %d targets (version %d); cannot append '
                                 '%d + %d' % (path, xl, yl, ver, x_len, y_len))
        self.f, self.n, self.x_len, self.y_len = f, n, x_len, y_len
        self.dtype, self.scale, self.offset = dtype, scale, offset
        self.qx = array(TYPES[dtype][1], bytes(TYPES[dtype][0] * x_len))
        self.qy = array('f', bytes(4 * y_len))

    def add(self, x, y):
        """Append one sample: x (x_len numbers), y (a number or y_len numbers)."""
        if hasattr(x, 'flatten'):
            x = x.flatten()
        if len(x) != self.x_len:
            raise ValueError('%s: sample has %d values, expected %d' % (self.path, len(x), self.x_len))
        q, lim, s, o = self.qx, LIMITS[self.dtype], self.scale, self.offset
        for j in range(self.x_len):
            v = x[j]
            if not finite(v):   # (stored, it made the whole file one training refuses)
                raise ValueError('%s: sample value %d is %r, not a finite number; not recorded'
                                 % (self.path, j, v))
            if lim:
                v = int(round((v - o) / s))
                v = lim[0] if v < lim[0] else lim[1] if v > lim[1] else v
            q[j] = v
        if isinstance(y, (int, float)):
            y = (y,)
        try:
            n = -1 if type(y) is str else len(y)
        except TypeError:
            n = -1
        if n < 0:
            raise ValueError('%s: target %r: give a number (a class index) or %d numbers'
                             % (self.path, y, self.y_len))
        if n != self.y_len:
            raise ValueError('%s: target has %d values, expected %d' % (self.path, len(y), self.y_len))
        for j in range(self.y_len):
            if not finite(y[j]):
                raise ValueError('%s: target %r, not finite numbers; not recorded' % (self.path, y))
        for j in range(self.y_len):
            self.qy[j] = y[j]
        f = self.f
        f.seek(HEAD + self.n * (TYPES[self.dtype][0] * self.x_len + 4 * self.y_len))
        f.write(q)
        f.write(self.qy)
        self.n += 1
        f.seek(N_AT)
        f.write(pack('<I', self.n))
        f.flush()
        return self.n

    def close(self):
        self.f.close()
