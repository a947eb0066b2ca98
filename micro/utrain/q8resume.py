# utrain.q8train's resume from a checkpoint (Q8Trainer.load_checkpoint: "resume": true,
# utrain.once), imported for it and dropped after: code is heap on a board, and a run
# that does not resume never loads it.
from struct import pack, unpack, calcsize
from utrain.q8 import _i32, _f32
from utrain import drop


def load(tr, path='checkpoint.ckpt'):
    """Q8Trainer tr's weights, optimizer state, counters and position from checkpoint path."""
    from utrain.wof import openr, RESUME, FormatError
    from utrain.ckread import read_checkpoint
    tr.dirty = True            # until the whole state is in
    net = tr.net
    ls = tr._trained()
    n = net.meta['ntensors']
    sizes = [None] * n
    state = [None] * n
    nw = {}
    for L in ls:
        nw[L] = L.wr()[1] - L.wr()[0]
        sizes[L.d['wt']], sizes[L.d['bt']] = L.d['wn'] if nw[L] else None, 4 * L.d['nb']
        state[L.d['wt']], state[L.d['bt']] = (len(L.vw) if net.mom else 4 * nw[L]) if (
            L.vw is not None or not net.mom) else 0, 4 * L.d['nb'] if (
            L.vb is not None or not net.mom) else 0     # (none: 'nv', 'nbv')
    part = {}
    for L in ls:
        if L.pw:
            part[L.d['wt']] = (L.wo, len(L.w))
    with openr(path) as f:
        h = f.read(20)
        if len(h) == 20:    # (its m and v tables' offsets: the optimizer that saved it)
            mo, vo = unpack('<4xII', h[:12])
            if bool(mo) != bool(net.adam or net.mom and any(state)) or bool(vo) != net.adam:
                from utrain.ckread import _kind
                raise ValueError('%s: saved training with %s; train.json trains with %s'
                                 % (path, _kind(mo, vo), (
                                     'adam' if net.adam else 'sgd with momentum' if net.mom
                                     else 'sgd without momentum')))
        f.seek(0)
        w, m, v, step, epoch, extra = read_checkpoint(f, path, n, sizes, state, raw=True,
                                                      part=part)
    r = calcsize(RESUME)
    want = r + 8 + sum([(4 if L.be is None else 1) * L.d['nb'] + (4 * nw[L] if net.adam else 0)
                        + (nw[L] if L.wf is not None else 0) for L in ls])
    for x in net.ext:
        want += 4 + x.nstate()
    if (len(extra) != want or extra[:6] != pack('<4sH', b'UTRS', 1)
            or extra[r:r + 4] != b'UTQ8'):
        raise FormatError('%s: not a checkpoint of this int8 run (its trained layers and '
                          'optimizer %s)' % (path, tr.cfg['optimizer']))
    for L in ls:
        for k in (L.d['wt'], L.d['bt']):
            st = k == L.d['bt'] or nw[L]     # (state[k] 0: no velocity, 'nv' / 'nbv')
            if (st and k not in w) or (st and ((net.adam and (k not in m or k not in v))
                                      or (net.mom and k not in m and state[k]))):
                raise FormatError('%s: no state for tensor %d' % (path, k))
    _, _, has, pos, s0, s1, scale, be, retries, bl, bm = unpack(RESUME, extra[:r])
    net.seed = unpack('<I', extra[r + 4:r + 8])[0]
    o = r + 8
    for L in ls:
        wt, bt = L.d['wt'], L.d['bt']
        if nw[L]:
            L.w = bytearray(w[wt])
        L.b = _i32(0, w[bt])
        nb = L.d['nb']
        if L.be is not None:            # (the int32 bias's fraction, in place)
            L.be[:] = extra[o:o + nb]
        else:
            nb *= 4
            L.bf = _f32(0, extra[o:o + nb])
        L.sync = 0
        o += nb
        k = 4 * nw[L]
        if net.adam:
            L.am, L.av = (_f32(0, m[wt]), _f32(0, v[wt])) if k else (_f32(0), _f32(0))
            L.bm, L.bv = _f32(0, m[bt]), _f32(0, v[bt])
            L.wm = _f32(0, extra[o:o + k])
            o += k
        elif net.mom:
            L.vw = bytearray(m[wt]) if wt in m else L.vw     # (int16: q8mom)
            if bt in m:
                L.vb = (_f32 if L.be is None else _i32)(0, m[bt])
        if L.wf is not None:            # (in place: no second buffer of its size)
            L.wf[:] = extra[o:o + nw[L]]
            o += nw[L]
    for x in net.ext:           # the scales the saved weights and biases are at
        if extra[o:o + 4] != x.TAG:
            raise FormatError('%s: not a checkpoint of this int8 run' % path)
        x.put(extra[o + 4:o + 4 + x.nstate()])
        o += 4 + x.nstate()
    net.zero()
    net.nstep, tr.epoch = step, epoch
    tr.pos, tr.sums, tr.retries, tr.lr_scale = pos, (s0, s1), retries, scale
    tr.best = (be, bl, bm) if has else None
    tr.pending = 0
    tr.good = path
    tr.commit, tr.dirty = (tr.pos, tr.sums), False
    drop('ckread')              # (loaded for this: code is heap)
    drop('wof')
