# Reading an onert-micro checkpoint back (layout in docs/formats.md; utrain/wof.py writes
# it).  A module of its own, loaded only to resume or to restore the last good state and
# dropped after: the checkpoint save that runs every epoch carries no reader code (code is
# heap on a board; the planner counts this module inside the per-sample working set, which
# is free between samples, when it loads).
from struct import pack, unpack, calcsize
import utrain
from utrain.wof import (openr, crc, crc32, _size, _table, _nbytes, FormatError, MAGIC,
                        VERSION, TAG, RESUME)


def load_checkpoint(path, n, shapes, state=None):
    """Return (weights, m, v, step, epoch, extra); each table {k: array}.
    shapes[k]: weight k's shape (None: k does not train); state[k]: its m and v
    shape when that differs (a sparse update keeps state for some channels only)."""
    with openr(path) as f:
        return read_checkpoint(f, path, n, shapes, state)


def read_checkpoint(f, path, n, shapes, state=None, raw=False, part=None):
    # raw: shapes and state are byte sizes and the tables hold bytes (utrain.q8train);
    # part: {tensor: (first byte, bytes)}, the part of a weight to read (a window's rows)
    size = _size(f)
    h = f.read(20)
    if len(h) != 20:
        raise FormatError('%s: truncated checkpoint header' % path)
    magic, ver, ut, mo, vo, oo, nb = unpack('<HBBIIII', h)
    if magic != MAGIC or ver != VERSION:
        raise FormatError('%s: not a version-1 checkpoint (magic %d, version %d)' % (path, magic, ver))
    if nb != n:
        raise FormatError('%s: holds %d buffers, the model has %d tensors' % (path, nb, n))
    end = size
    t = b''
    if size >= 28:
        f.seek(size - 8)
        t = f.read(8)
    if t[:4] == TAG:
        end = size - 8
        if crc32:
            c = crc32(TAG, crc(f, 0, end))
            if c & 0xFFFFFFFF != unpack('<I', t[4:])[0]:
                raise FormatError('%s: checksum mismatch (corrupt or cut short)' % path)
    if not 20 + 4 * n <= oo <= end - 8:
        raise FormatError('%s: counters offset %d out of range (truncated?)' % (path, oo))
    if end == size and (ut or end > oo + 8):     # (ut: utrain wrote it, with a trailer)
        raise FormatError('%s: cut short (%d bytes after the counters, no utrain trailer)'
                          % (path, end - oo - 8))
    sizes = shapes if raw else _nbytes(shapes)
    ssizes = (state if raw else _nbytes(state)) if state else sizes
    out = []
    bounds = [20] + [a for a in (mo, vo) if a] + [oo]
    for i in range(1, len(bounds)):
        if bounds[i] < bounds[i - 1] + 4 * n:
            raise FormatError('%s: table offsets %d, %d, %d out of order or range' % (path, mo, vo, oo))
    from utrain.xnp import readinto, zeros
    for at, sh, sz in ((20, shapes, sizes), (mo, state or shapes, ssizes),
                       (vo, state or shapes, ssizes)):
        tab = {}
        if at:
            offs = _table(f, path, n, at, bounds[bounds.index(at) + 1], sz)
            for k in range(n):
                if offs[k]:
                    p = part.get(k) if part and at == 20 else None
                    f.seek(offs[k] + (p[0] if p else 0))
                    tab[k] = f.read(p[1] if p else sz[k]) if raw else readinto(
                        f, zeros(sh[k]), path)
        out.append(tab)
    f.seek(oo)
    step, epoch = unpack('<II', f.read(8))
    extra = f.read(end - oo - 8) if end > oo + 8 else b''
    want = getattr(utrain, 'fp', None)      # (this run's block: utrain.config)
    if ut == 2:         # the last block: the model files' fingerprint (utrain.wof)
        fp = extra[-8:]
        if fp[:4] != b'UTFP':
            raise FormatError('%s: its fingerprint block is missing (damaged)' % path)
        extra = extra[:-8]
        if want and fp != want:
            # (a checkpoint of another model of the same tensor sizes, copied in from
            # another folder: it had resumed without a word)
            raise FormatError('%s: a checkpoint of another model (fingerprint %08x; this '
                              "folder's model files: %08x): delete it, or set \"resume\": "
                              'false under "run" in train.json, to train from the start'
                              % (path, unpack('<I', fp[4:])[0], unpack('<I', want[4:])[0]))
    elif want:
        print('utrain: %s has no model fingerprint (saved by a utrain before (32)): '
              "resumed without checking it is this folder's model's" % path)
    return out[0], out[1], out[2], step, epoch, extra


def _kind(m, v):
    # the optimizer whose state tables (utrain.optim's m, v) a checkpoint holds
    return 'adam or adamw' if m and v else 'sgd with momentum' if m else 'rmsprop' if v \
        else 'sgd without momentum'


def load_state(tr, path):
    net = tr.net
    shapes = [net.shape[k] if k in net.trainable else None for k in range(len(net.t))]
    from utrain.sink import state_shape
    state = [state_shape(net, k) if k in net.trainable else None for k in range(len(net.t))]
    w, m, v, step, epoch, extra = load_checkpoint(path, len(net.t), shapes, state)
    pos, sums, scale, best, retries = 0, (0.0, 0.0), 1.0, None, 0
    if extra:
        n = calcsize(RESUME)
        if len(extra) < n or extra[:6] != pack('<4sH', b'UTRS', 1):
            raise ValueError('%s: unknown data after the counters' % path)
        if extra[n:n + 4] == b'UTLR':     # the run's schedule: the checkpoint's
            from utrain.sched import unblock
            tr.opt.sched, extra = unblock(extra, n, path)
        if extra[n:] != getattr(net, 'select', b''):
            raise ValueError('%s: trained another selection of tensors than this run '
                             '(prepare --select board: Trainer(keep=utrain.chosen.read(path)))' % path)
        _, _, has, pos, ls, ms, scale, be, retries, bl, bm = unpack(RESUME, extra[:n])
        sums = (ls, ms)
        best = (be, bl, bm) if has else None
    for k in net.trainable:
        if k not in w:
            raise ValueError('%s: no weights for trainable tensor %d' % (path, k))
        net.t[k] = w[k]
    o = tr.opt
    if bool(m) != bool(o.m) or bool(v) != bool(o.v):
        # train.json's optimizer (or sgd's momentum) edited since the save: its state had
        # been taken as the other's, or dropped, unsaid (the host says what to do)
        raise ValueError('%s: saved training with %s; train.json trains with %s' % (
            path, _kind(m, v), o.kind + (' with' if o.m else ' without') * (
                o.kind == 'sgd') + ' momentum' * (o.kind == 'sgd')))
    for k in m:
        if k in o.m:
            o.m[k] = m[k]
    for k in v:
        if k in o.v:
            o.v[k] = v[k]
    o.t, tr.epoch = step, epoch
    tr.pos, tr.sums, tr.best, tr.retries, tr.good = pos, sums, best, retries, path
    tr.lr_scale = scale
    o.lr = tr.cfg['lr'] * scale
