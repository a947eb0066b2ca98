# .wof weights and onert-micro checkpoints (layouts in docs/formats.md).
# Saves are atomic: write path + '.tmp', flush, close, then rename over path, so a
# cut save never destroys the last good file; a save cut between removing the old
# file and the rename (boards whose file system cannot rename over a file) is
# finished by the next reader (openr).  A checkpoint ends with utrain's trailer
# 'UTCK' + CRC32 of everything before it; onert-micro ignores bytes after the
# counters, and a checkpoint without the trailer (onert-micro's own) still loads.
from struct import pack, unpack
from array import array
import os
import gc
try:
    from binascii import crc32
except ImportError:  # a firmware without it: checksums are written as 0, not checked
    crc32 = None

MAGIC = 429
VERSION = 1
TAG = b'UTCK'


class FormatError(ValueError):
    pass


def openr(path):
    """open(path, 'rb'), finishing a save cut between remove and rename; errors name the file."""
    try:
        return open(path, 'rb')
    except OSError:
        pass
    try:
        os.rename(path + '.tmp', path)
        return open(path, 'rb')
    except OSError:
        raise FormatError('%s: cannot open (no such file?)' % path)


def exists(path):
    """Is there a file at path (after finishing an interrupted save of it)?"""
    try:
        openr(path).close()
        return True
    except FormatError:
        return False


def crc(f, start, end, c=0):
    """CRC32 of bytes [start, end) of f, read 256 bytes at a time (0 without binascii)."""
    if crc32 is None:
        return 0
    buf = bytearray(256)
    mv = memoryview(buf)
    f.seek(start)
    while start < end:
        k = f.readinto(mv[:min(256, end - start)])
        if not k:
            break
        c = crc32(mv[:k], c)
        start += k
    return c & 0xFFFFFFFF


def _size(f):
    f.seek(0, 2)
    n = f.tell()
    f.seek(0)
    return n


def _table(f, path, n, at, end, sizes):
    """Offset table of n entries at `at`; the present blocks (sizes[k] bytes each) must
    fill [table end, end) back to back, as the format packs them, in any order."""
    f.seek(at)
    b = f.read(4 * n)
    if len(b) != 4 * n:
        raise FormatError('%s: truncated offset table' % path)
    # one array, 4 B a tensor (an int8 net holds it all run), checked in offset order
    # without a list of span tuples: a 270-tensor model's load made 36 B of them a tensor
    offs = array('I', b)
    ks = []
    for k in range(n):
        if offs[k] == 0xFFFFFFFF:
            offs[k] = 0
        if offs[k]:
            if sizes[k] is None:
                raise FormatError('%s: has data for tensor %d, which takes none here' % (path, k))
            ks.append(k)
    ks.sort(key=lambda k: offs[k])
    pos = at + 4 * n
    for k in ks:
        o = offs[k]
        if o != pos:
            raise FormatError('%s: data of tensor %d at offset %d, expected %d: the blocks must '
                              'follow each other without gaps or overlaps' % (path, k, o, pos))
        pos += sizes[k]
    if pos != end:
        raise FormatError('%s: the data blocks end at offset %d, the file at %d (truncated, '
                          'or the offset table corrupt?)' % (path, pos, end))
    return offs


def _nbytes(shapes):
    return [None if s is None else 4 * s[0] * s[1] for s in shapes]


def read_table(f, path, shapes, nbytes=None):
    """Check a .wof header against the model's device shapes (one per tensor, None =
    must have no data; or nbytes, the bytes per tensor: int8 models) and return
    (offset per tensor, file size)."""
    size = _size(f)
    h = f.read(8)
    if len(h) != 8:
        raise FormatError('%s: truncated .wof header' % path)
    magic, ver, _, n = unpack('<HBBI', h)
    if magic != MAGIC:
        raise FormatError('%s: not a .wof file (magic %d, want %d)' % (path, magic, MAGIC))
    if ver != VERSION:
        raise FormatError('%s: .wof version %d, this utrain reads %d' % (path, ver, VERSION))
    if n != len(shapes):
        raise FormatError('%s: holds %d buffers, the model has %d tensors' % (path, n, len(shapes)))
    return _table(f, path, n, 8, size, nbytes or _nbytes(shapes)), size


# The save's reserve ([bytes, the block]: train.json run.save_reserve, prepare's plan of a
# save): one block held from before training cuts the heap in small pieces, freed just
# before a save opens its file and held again after the save: after a checkpoint, and
# after the best weights' save has written trained.wof, its side files and its record
# (utrain.best.save), not in between (re-held after trained.wof, the held block was a
# file's more for the files after it: the Esp32-Pen int8 CNN, prepared for esp32, needed
# 2 KB more on the 32-bit unix build, 4 KB on 64-bit).  After a collection the file's
# block (on a littlefs board 1.2 KB: its cache) lands in that hole by first fit; the
# emulated Pico's int8 runs had failed there, 11-14 KB free in holes of 39-70 blocks.
# Kept on the utrain package: this module is dropped between saves (its code is heap),
# the reserve is not (utrain.run holds it through aux(): a name bound to hold() kept
# this module's code live all run, a second copy loaded at each save)
import utrain
try:
    RES = utrain.wof_res
except AttributeError:
    RES = utrain.wof_res = []


def hold(n):
    RES[:] = [n, None]
    _again()


def _again():
    if RES and RES[1] is None:
        gc.collect()
        try:
            RES[1] = bytearray(RES[0])
        except MemoryError:     # (none: the next save finds what it finds)
            pass


def _create(tmp, mode):
    if RES and RES[1] is not None:
        RES[1] = None
        gc.collect()
    return open(tmp, mode)


def _replace(tmp, path):
    try:
        os.rename(tmp, path)
    except OSError:
        # a board's VFS may refuse to rename over an existing file; openr() finishes
        # the job if power fails between these two steps
        try:
            os.remove(path)
        except OSError:
            pass
        os.rename(tmp, path)


def _nb(a):
    if type(a) is list:     # pieces written in turn: buffers, or (bytes, writer(f))
        return sum([x[0] if type(x) is tuple else _nb(x) for x in a])
    if hasattr(a, 'size'):
        return 4 * a.size
    # (no bytes(a) copy to measure it: a board may lack the room)
    return len(a) if isinstance(a, (bytes, bytearray, memoryview)) else 4 * len(a)


def _write_block(f, arrays, n, start):
    # offset table then data, arrays: {tensor index: float array, or the raw bytes of
    # an int8 model's tensor (bytearray of int8, array('i') of int32), or a list of
    # pieces (a tensor partly held in RAM: utrain.q8train)}
    offs = array('I', bytes(4 * n))     # (not a list, its * arguments and their pack)
    pos = start + 4 * n
    for k in sorted(arrays):
        offs[k] = pos
        pos += _nb(arrays[k])
    f.write(offs)
    for k in sorted(arrays):
        a = arrays[k]
        if hasattr(a, 'size'):
            from utrain.xnp import write     # (float arrays: an int8 run loads no xnp)
            write(f, a)
        elif type(a) is list:
            for x in a:
                x[1](f) if type(x) is tuple else f.write(x)
        else:
            f.write(a)
    return pos


def write_wof(f, n, arrays):
    """A .wof of n tensors to the open file f, {tensor index: array}; the one writer
    (host_tools/files/wof.py packs its files with it)."""
    f.write(pack('<HBBI', MAGIC, VERSION, 0, n))
    _write_block(f, arrays, n, 8)


def save_wof(path, n, arrays):
    tmp = path + '.tmp'
    with _create(tmp, 'wb') as f:
        write_wof(f, n, arrays)
        f.flush()
    _replace(tmp, path)


def save_checkpoint(path, n, weights, m, v, step, epoch, extra=b''):
    """onert-micro checkpoint: weights, optional m and v tables, then the counters.
    `extra` (utrain's resume data: bytes, or a list of buffers written one after the
    other, never joined into a copy) follows the two counters, then the CRC trailer."""
    tmp = path + '.tmp'
    with _create(tmp, 'w+b') as f:
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
        for b in (extra if type(extra) is list else (extra,)):
            f.write(b)
        fp = getattr(utrain, 'fp', None)   # the model files' fingerprint block (utrain.config)
        if fp:
            f.write(fp)
        end = f.tell()
        f.seek(0)
        # (reserved byte 1: utrain's, a trailer follows; a file of it cut at the counters
        # had read as onert-micro's own, its resume block dropped; 2: and the fingerprint
        # block is the last before the trailer)
        f.write(pack('<HBBIIII', MAGIC, VERSION, 1 + bool(fp), mo, vo, pos, n))
        f.flush()
        c = crc(f, 0, end)  # read back what the file system holds
        c = crc32(TAG, c) & 0xFFFFFFFF if crc32 else 0
        f.seek(end)
        f.write(TAG + pack('<I', c))
        f.flush()
    _replace(tmp, path)
    _again()


# A Trainer's checkpoint: onert-micro's layout, then utrain's resume block (the position
# in the epoch, loss/metric sums, lr scale, best result, retries; docs/formats.md).  Here,
# not in trainer.py, because this module is loaded only for a save or load; reading a
# checkpoint back is utrain/ckread.py's (loaded only to resume or restore).
RESUME = '<4sHHIddfIIdd'


def save_state(tr, path):
    o = tr.opt
    b = tr.best or (0, 0.0, 0.0)
    extra = pack(RESUME, b'UTRS', 1, tr.best is not None, tr.pos, tr.sums[0], tr.sums[1],
                 tr.lr_scale, b[0], tr.retries, b[1], b[2])
    if o.sched:                 # the schedule, as this run set it (a resume continues it)
        extra += o.sched[6]
    extra += getattr(tr.net, 'select', b'')     # the board's choice (utrain/fisher.py)
    save_checkpoint(path, len(tr.net.t), tr.weights(), o.m, o.v, o.t, tr.epoch, extra)
