# The set of tensors the board chose to train (prepare --select board: utrain/fisher.py
# scores the candidates), applied to a Trainer's net and kept in its checkpoint so that a
# resumed run trains the same set.  Apart from fisher.py: a resumed run and the Trainer
# load only this (fisher.py's scoring code is loaded once, before the Trainer, and dropped).
from struct import pack, unpack, calcsize
from utrain.xnp import const

# the op contract (utrain/opc.py), as private consts: folded at compile time, no heap
_DW = const(2)
_DB = const(4)
_FULLY_CONNECTED = const(9)
_CONV_2D = const(3)
_DEPTHWISE_CONV_2D = const(4)
WEIGHTED = (_FULLY_CONNECTED, _CONV_2D, _DEPTHWISE_CONV_2D)
TAG = b'UTSL'
ENTRY = '<HBBHH'        # tensor, axis (2: whole), 0, lo, hi


def restrict(net, keep):
    """Train only the tensors in keep ({tensor: (axis, lo, hi) or None}): the others
    are frozen, the backward list loses their gradients (and the ops before the first
    that trains).  Call it before the Trainer makes optimizer state (Trainer(keep=))."""
    for k in keep:
        if k not in net.trainable:
            raise ValueError('selection names tensor %d, which is not a candidate' % k)
    net.trainable = [k for k in net.trainable if k in keep]
    for k in list(net.rank):
        if keep.get(k) is None:
            del net.rank[k]
    for k in keep:
        if keep[k]:
            net.rank[k] = keep[k]
    first = min(i for i in range(len(net.ops)) if any(k in keep for k in net.ops[i][1]))
    bwd = []
    for oi, fl in net.bwd:
        if oi < first:
            continue
        # an entry without flag bits stays: it passes a gradient all the same (an ADD's
        # second input goes by net.gin: a residual whose skip branch is frozen)
        keep0 = not fl
        code, ins = net.ops[oi][0], net.ops[oi][1]
        if code in WEIGHTED:
            if len(ins) < 2 or ins[1] not in keep:
                fl &= ~_DW
            if len(ins) < 3 or ins[2] not in keep:
                fl &= ~_DB
        elif not any(k in keep for k in ins):
            fl &= ~(_DW | _DB)
        if oi == first:
            fl &= _DW | _DB           # nothing before it trains
        if fl or keep0:
            bwd.append((oi, fl))
    net.bwd = bwd
    net.select = blob(keep)


def blob(keep):
    out = [TAG, pack('<H', len(keep))]
    for k in sorted(keep):
        r = keep[k] or (2, 0, 0)
        out.append(pack(ENTRY, k, r[0], 0, r[1], r[2]))
    return b''.join(out)


def unblob(b, path):
    n = unpack('<H', b[4:6])[0] if len(b) >= 6 and b[:4] == TAG else -1
    e = calcsize(ENTRY)
    if n < 0 or len(b) != 6 + n * e:
        raise ValueError('%s: bad board-selection block' % path)
    keep = {}
    for j in range(n):
        k, ax, _, lo, hi = unpack(ENTRY, b[6 + j * e:6 + (j + 1) * e])
        keep[k] = None if ax == 2 else (ax, lo, hi)
    return keep


def read(path, log=print):
    """The set the checkpoint at path was trained with (its selection block)."""
    from utrain import wof
    with wof.openr(path) as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(0)
        h = f.read(20)
        hv = unpack('<HBBIIII', h) if len(h) == 20 else (0,) * 7
        ut, oo = hv[2], hv[5]
        end = size
        if size >= 28:
            f.seek(size - 8)
            if f.read(4) == wof.TAG:
                end = size - 8
        if ut == 2:             # (the model's fingerprint block before the trailer: wof)
            end -= 8
        n = calcsize(wof.RESUME)
        if not 20 < oo < oo + 8 + n <= end:
            raise ValueError('%s: no board-selection block (prepared without --select board?)'
                             % path)
        f.seek(oo + 8)
        b = f.read(end - oo - 8)
    if b[n:n + 4] == b'UTLR':     # (the run's schedule block before it: utrain.sched)
        from utrain.sched import unblock
        b = unblock(b, n, path)[1]
    keep = unblob(b[n:], path)
    log('board selection from %s: tensors %s' % (path, ', '.join(
        '%d' % k + (' %d:%d' % (keep[k][1], keep[k][2]) if keep[k] else '') for k in sorted(keep))))
    return keep
