# .wof weights and onert-micro checkpoints (layouts in docs/formats.md).
# Saves are atomic: write path + '.tmp', flush, then rename over path, so a cut
# save never destroys the last good file.
from struct import pack, unpack
from utrain.xnp import write, readinto, zeros
import os

MAGIC = 429
VERSION = 1


class FormatError(ValueError):
    pass


def _size(f):
    f.seek(0, 2)
    n = f.tell()
    f.seek(0)
    return n


def _table(f, path, n, at, size):
    f.seek(at)
    b = f.read(4 * n)
    if len(b) != 4 * n:
        raise FormatError('%s: truncated offset table' % path)
    offs = list(unpack('<%dI' % n, b))
    for i in range(n):
        if offs[i] == 0xFFFFFFFF:
            offs[i] = 0
        elif offs[i] and not (at + 4 * n <= offs[i] <= size):
            raise FormatError('%s: offset of tensor %d (%d) out of range' % (path, i, offs[i]))
    return offs


def read_table(f, path, n_tensors):
    """Check a .wof header and return (offset per tensor, file size)."""
    size = _size(f)
    h = f.read(8)
    if len(h) != 8:
        raise FormatError('%s: truncated .wof header' % path)
    magic, ver, _, n = unpack('<HBBI', h)
    if magic != MAGIC:
        raise FormatError('%s: not a .wof file (magic %d, want %d)' % (path, magic, MAGIC))
    if ver != VERSION:
        raise FormatError('%s: .wof version %d, this utrain reads %d' % (path, ver, VERSION))
    if n != n_tensors:
        raise FormatError('%s: holds %d buffers, the model has %d tensors' % (path, n, n_tensors))
    return _table(f, path, n, 8, size), size


def _replace(tmp, path):
    try:
        os.rename(tmp, path)
    except OSError:
        # a board's VFS may refuse to rename over an existing file
        try:
            os.remove(path)
        except OSError:
            pass
        os.rename(tmp, path)


def _write_block(f, arrays, n, start):
    # offset table then data, arrays: {tensor index: array}
    offs = [0] * n
    pos = start + 4 * n
    for k in sorted(arrays):
        offs[k] = pos
        pos += 4 * arrays[k].size
    f.write(pack('<%dI' % n, *offs))
    for k in sorted(arrays):
        write(f, arrays[k])
    return pos


def save_wof(path, n, arrays):
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(pack('<HBBI', MAGIC, VERSION, 0, n))
        _write_block(f, arrays, n, 8)
        f.flush()
    _replace(tmp, path)


def save_checkpoint(path, n, weights, m, v, step, epoch, extra=b''):
    """onert-micro checkpoint: weights, optional m and v tables, then the counters.
    `extra` (utrain's own resume data) follows the two counters."""
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(b'\0' * 20)
        pos = _write_block(f, weights, n, 20)
        mo = vo = 0
        if m:
            mo = pos
            pos = _write_block(f, m, n, pos)
        if v:
            vo = pos
            pos = _write_block(f, v, n, pos)
        f.write(pack('<II', step, epoch))
        f.write(extra)
        f.seek(0)
        f.write(pack('<HBBIIII', MAGIC, VERSION, 0, mo, vo, pos, n))
        f.flush()
    _replace(tmp, path)


def load_checkpoint(path, n, shapes, state=None):
    """Return (weights, m, v, step, epoch, extra); each table {k: array}.
    shapes[k]: weight k's shape (None: k does not train); state[k]: its m and v
    shape when that differs (a sparse update keeps state for some channels only)."""
    with open(path, 'rb') as f:
        size = _size(f)
        h = f.read(20)
        if len(h) != 20:
            raise FormatError('%s: truncated checkpoint header' % path)
        magic, ver, _, mo, vo, oo, nb = unpack('<HBBIIII', h)
        if magic != MAGIC or ver != VERSION:
            raise FormatError('%s: not a version-1 checkpoint (magic %d, version %d)' % (path, magic, ver))
        if nb != n:
            raise FormatError('%s: holds %d buffers, the model has %d tensors' % (path, nb, n))
        if not 20 + 4 * n <= oo <= size - 8:
            raise FormatError('%s: counters offset %d out of range' % (path, oo))
        out = []
        for at, sh in ((20, shapes), (mo, state or shapes), (vo, state or shapes)):
            tab = {}
            if at:
                if not 20 <= at <= oo:
                    raise FormatError('%s: table offset %d out of range' % (path, at))
                offs = _table(f, path, n, at, size)
                for k in range(n):
                    if offs[k]:
                        if sh[k] is None:
                            raise FormatError('%s: has data for tensor %d, which does not train' % (path, k))
                        r, c = sh[k]
                        if offs[k] + 4 * r * c > oo:
                            raise FormatError('%s: data of tensor %d runs past its table' % (path, k))
                        f.seek(offs[k])
                        tab[k] = readinto(f, zeros((r, c)), path)
            out.append(tab)
        f.seek(oo)
        step, epoch = unpack('<II', f.read(8))
        extra = f.read()
    return out[0], out[1], out[2], step, epoch, extra
