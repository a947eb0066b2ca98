# utrain.q8's net load, Q8Net.__init__'s work: imported for it and dropped after (code
# is heap on a board: none of this runs again while the net trains; 6 KB on 32-bit), with
# what only the load reads: a Layer's set-up (layer), the table's sizes (trained_n ...
# bcast: host_tools/plan/memory.py plans with them too), and the int8 trainer's read of
# its table and check of its settings before it (trainer_cfg: utrain.q8train)
from array import array
from utrain import q8kern as K
# the int8 trainer's (utrain.q8train)
LOSSES = ('scce', 'cce', 'mse', 'mae', 'bce')
OPTIMIZERS = ('sgd', 'adam')
# utrain.q8's layer kinds (q8 imports this module, which cannot import it back)
_FC = 0    # q8.FC
_CONV = 1  # q8.CONV
_DW = 2    # q8.DW
_MEAN = 3  # q8.MEAN
_ADD = 4   # q8.ADD
_PMAX = 5  # q8.PMAX
_PAVG = 6  # q8.PAVG
_CAT = 7   # q8.CAT
_LUT = 8   # q8.LUT
_BIN = 9   # q8.BIN
_SLC = 10  # q8.SLC
_NRM = 11  # q8.NRM
_TCV = 12  # q8.TCV
_EMB = 13  # q8.EMB
UMAX = 256           # the most channels a layer keeps update multipliers of (umn)


def trainer_cfg(model, keep, settings):
    """(layer table, settings) of Q8Trainer(model, keep=keep, **settings): q8.json read and
    checked, the board's choice applied (keep), the settings with their defaults, checked
    (before the net's load: none of it runs again)."""
    import json
    with open(model) as f:
        try:
            meta = json.load(f)
        except (ValueError, RuntimeError):      # (too deep: RuntimeError)
            meta = None
    if type(meta) is not dict or meta.get('format') != 'utrain-q8':
        raise ValueError('%s: not a utrain int8 layer table' % model)
    if keep is not None:    # prepare --select board: the board's choice (utrain.q8fish)
        if callable(keep):  # (its scoring pass's table)
            meta = keep(meta)
        else:
            from utrain.q8keep import restrict
            meta = restrict(meta, keep)
    c = {'loss': 'scce', 'optimizer': 'sgd', 'metric': 'accuracy', 'lr': 0.01,
         'batch': 1, 'epochs': 1, 'shuffle': False, 'seed': 0, 'momentum': 0.0,
         'reduction': 'mean', 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-7}
    c.update(settings)
    if (c['loss'] not in LOSSES or c['optimizer'] not in OPTIMIZERS or int(c['batch']) < 1
            or (c['momentum'] and c['optimizer'] != 'sgd')):
        raise ValueError('train.json: int8 training takes loss %s, optimizer sgd (with or '
                         'without momentum) or adam, batch 1 or more (prepare --dequantize '
                         'trains the model in float with any)' % ' '.join(LOSSES))
    return meta, c


def build(self, meta, wof_path, mom, adam, batch, q8g):
    """Q8Net(meta, wof_path, ...)'s load into self (utrain.q8: utrain.q8ext and setup follow,
    once this module is dropped)."""
    # (q8g: utrain.q8's globals, its helpers: it imports this module)
    Layer, qmul, _i32, _f32, _b8 = [q8g[k] for k in ('Layer', 'qmul', '_i32', '_f32', '_b8')]
    from utrain import wof
    self.meta = meta
    ls = meta['layers']
    nb = [None] * meta['ntensors']
    for d in ls:
        if 'wt' in d:
            nb[d['wt']] = d['wn']
            nb[d['bt']] = 4 * d['nb']
    # (a part of the model: the file holds all) tensor, bytes, ... (or pairs: a table
    # written before they were one flat list)
    ws = meta.get('wsizes', ())
    if ws and type(ws[0]) is list:
        ws = [v for p in ws for v in p]
    for j in range(0, len(ws), 2):
        nb[ws[j]] = ws[j + 1]
    # a graph whose backward walk holds gradients (a residual ADD's other input, a
    # CONCATENATION's inputs, a tensor read twice: not a chain): that walk's code
    # (utrain.q8hold), loaded before the net's buffers, not among them
    first = lowest(ls)
    ga = grads(ls, first)
    Hold = None
    if not chain(ls, ga):
        from utrain.q8hold import Holds as Hold
    self.f = f = wof.openr(wof_path)
    self.woff = wof.read_table(f, wof_path, nb, nb)[0]
    req = meta.get('req')
    if req:
        i = wof_path.rfind('/')
        self.rf = wof.openr((wof_path[:i + 1] if i >= 0 else '') + req)
        # and a second handle for the shifts (quant): a chunk's multipliers and shifts
        # lie nq words apart, and one handle's reads alternating between them missed
        # littlefs's cache each time (~200 us a read on the emulated Pico, ~140 reads
        # a MobileNetV2 w62 step); each handle now reads on from where it stopped
        self.rs = wof.openr((wof_path[:i + 1] if i >= 0 else '') + req)
        n = meta.get('reqb')
        if n is not None and wof._size(self.rf) != n:
            # (cut short, it had divided by zero at the first step, or trained on garbage)
            raise wof.FormatError('%s: %d bytes, the layer table says %d (cut short, or '
                                  "another preparation's): copy it again, or prepare the "
                                  'folder again' % (req, wof._size(self.rf), n))
    # utrain.wof's code leaves the heap before the net's buffers (needed again only
    # for files: a save, a checkpoint, load_weights import it and drop it after)
    wof = None
    from utrain import drop
    drop('wof')
    # activations: one int8 arena at the offsets the host planned (q8.json 'at':
    # tensor, offset, bytes), or (a table without a plan) one buffer per layer
    import gc
    gc.collect()
    self.arena = bytearray(meta.get('arena', 0))
    self.t = t = {}
    am = memoryview(self.arena)
    for k, o, n in meta.get('at', ()):
        t[k] = am[o:o + n]
    for d in ls:                # constant activations (a recurrent layer's zero state)
        for k, v in d.get('kt', ()):
            t[k] = bytearray([q & 255 for q in v])
    acc = self.acc = _i32(meta.get('acc') or max([d['nout'] for d in ls]))
    self.acc8 = _b8(acc)
    # streamed layers' scratch: a chunk of weights, one layer's biases and multipliers
    ws = meta.get('wbuf', 0)
    self.wbuf = bytearray(ws) if ws else None
    cmax = meta.get('qbuf') or max([d.get('nb', 1) for d in ls])
    self.qb, self.qm, self.qs = _i32(cmax), _i32(cmax), _i32(cmax)
    self.qq = (self.qm, self.qs)    # (kept: a pair made a call is heap)
    self.ck = [0] * 5              # (Layer._chunk's: likewise)
    self.gs = _i32(14)
    # the backward pass's shared buffers, before the layers: a layer's int8 output
    # gradient (and its per-channel rescaled copy for the input gradient), a chunk of
    # a trained layer's weight gradient (no weight-sized one: each chunk is applied,
    # or added to the batch's sums, as soon as it exists)
    # the weights held in RAM first, the largest first: one wide layer's (a MobileNet's
    # last 1x1 conv: 143 KB) found no run long enough once the smaller buffers and the
    # layers' objects were among the prefix pass's holes
    held = {}
    for i in sorted([i for i in range(len(ls)) if 'wt' in ls[i] and not ls[i].get('sd') and ls[i].get(
            'sh', i) == i and (
            ls[i].get('train') or ls[i].get('back') or ls[i].get('res') or not ws)],
            key=lambda i: -ls[i]['wn']):
        held[i] = bytearray(held_bytes(ls[i]))
    # q8asm's conv input-gradient rows (cdk), with them: made at the first backward
    # they found no run of 2 KB among a sample's holes (the emulated Pico: a Keras
    # Conv1D int8 file at SGD batch 1 0.96x its plan)
    n = cdn(ls) if K.ASM else 0
    if n:
        K._A._wbuf(n)
    # the trained weights' int32 sums (Adam, a batch > 1 (adam, batch: the trainer's);
    # a weight several trained layers read at any batch: utrain.q8share, its uses add
    # into them) and Adam's master and moments, with them, where they are larger than
    # the load's holes (1 KB: 256 weights): made in setup, after an unrolled
    # recurrence's hundreds of small layer objects, they found no run long enough
    # (32-bit, 48 units: SGD at batch 1 0.85x its plan, momentum 0.78x, Adam at batch
    # 4 0.87x; TimeDistributed steps at SGD batch 4 0.985x); small ones stay in setup,
    # after the load's garbage is collected (made here, among it, a graph's 27 small
    # FCs' Adam arrays did not fit their plan); setup takes them as its own
    sums = {}
    for i in sorted([i for i in range(len(ls)) if ls[i].get('sh', i) == i and (
            'sh' in ls[i] and trained_n(ls[i]) or (adam or batch > 1) and trained_n(ls[i]) >= 256)],
                    key=lambda i: -trained_n(ls[i])):
        n = trained_n(ls[i])
        sums[i] = [_i32(n)] + ([_f32(n), _f32(n), _f32(n)] if adam else [])
    # SGD's weight fractions beside them (made late, in setup, a window's 18 KB found
    # no run long enough after a prefix pass); Adam's setup drops them
    frac = {}
    # (none for an alias of a shared weight: it reads its owner's, utrain.q8share; made
    # and dropped by setup, an unrolled recurrence's aliases' fractions and velocities
    # were holes through the load: 5 of 4.6 KB, momentum at 0.99x its plan, 32-bit)
    for i in sorted([i for i in range(len(ls)) if ls[i].get('wf') and trained_n(ls[i])
                     and ls[i].get('sh', i) == i],
                    key=lambda i: -trained_n(ls[i])):
        frac[i] = bytearray(trained_n(ls[i]))
    # and SGD momentum's int16 weight velocities (mom: the trainer's; utrain.q8mom's
    # format, 2 bytes a weight, zeros; made here: made in setup, after the layers, a
    # classifier's found no run long enough after a prefix pass, MobileNetV2 needed
    # 81 KB more than without; q8mom itself loads in setup: its load's temporaries
    # here cut the run the velocities take)
    vel = {}
    if mom:
        for i in sorted([i for i in range(len(ls)) if trained_n(ls[i]) and not ls[i].get('nv')
                         and ls[i].get('sh', i) == i],
                        key=lambda i: -trained_n(ls[i])):
            nt = trained_n(ls[i])       # (int8 ones and their exponent: 'v8')
            vel[i] = bytearray(nt + 1 if ls[i].get('v8') else 2 * nt)
    # a graph's held gradients, one buffer a slot (the walk planned once: its
    # temporaries between the buffers fragment a board's heap)
    self.H = H = Hold(self, ls, ga, qmul, _i32) if Hold else None
    sz = H.sz if H else ()
    nz, nz2, ng, nk = bufs(ls, sz)
    # (a weight-gradient chunk in the sums buffer where it fits: the forward pass's,
    # free while the backward pass runs; gwn)
    self.gw = _i32(ng) if gwn(ng, len(acc)) else acc
    self.bs = _i32(bsn(ls))         # bias sums
    # the int32 input-gradient buffers with them, the largest first (made late, in
    # the first backward pass, they found no run long enough in a heap the layers had
    # fragmented): one, unless a pool or a MEAN makes its input's gradient from g
    m = self.gm = gin(ls, sz)
    self.g2 = gtwo(ls)
    self.gb = self._gbs(m) if m and any(
        d.get('train') or d.get('back') for d in ls[first + 1:]) else None
    for d in ls:    # a streamed conv's output only a broadcasting MEAN reads: in the
        if d.get('yg'):     # input-gradient buffer, idle in a forward pass (quant.plan)
            t[d['out']] = _b8(self.gb[0])
    self.dz, self.dz2 = bytearray(nz), bytearray(nz2)
    self.S = None
    if any(d.get('mask') or d.get('sd') for d in ls):
        from utrain import q8sparse
        self.S = q8sparse
    # pools and the kinds from CAT on: forward and gradient in a module of their own,
    # loaded only by a table that has one (utrain.q8pool, q8cat, q8lut, q8bin, q8slc,
    # q8nrm, q8tcv, q8emb)
    self.X = X = {}
    for d in ls:
        if d['k'] == _CAT and _CAT not in X:
            from utrain import q8cat
            X[_CAT] = q8cat
        elif d['k'] == _LUT and _LUT not in X:
            from utrain import q8lut
            X[_LUT] = q8lut
        elif (d['k'] == _PMAX or d['k'] == _PAVG) and _PMAX not in X:
            from utrain import q8pool
            X[_PMAX] = q8pool
        elif d['k'] == _BIN and _BIN not in X:
            from utrain import q8bin
            X[_BIN] = q8bin
        elif d['k'] == _SLC and _SLC not in X:
            from utrain import q8slc
            X[_SLC] = q8slc
        elif d['k'] == _NRM and _NRM not in X:
            from utrain import q8nrm
            X[_NRM] = q8nrm
        elif d['k'] == _TCV and _TCV not in X:
            from utrain import q8tcv
            X[_TCV] = q8tcv
        elif d['k'] == _EMB:
            from utrain import q8emb
            X[_EMB] = q8emb
    # the trained layers first: their big buffers (weights, gradient sums) find
    # room before the frozen layers' many small objects fragment the heap
    self.layers = lay = [None] * len(ls)
    for i in range(1, len(ls)):
        if bcast(ls, i):
            ls[i - 1]['bx'] = 1     # (its gradient: one broadcast row; Layer.dxr)
    order = sorted([i for i in range(len(ls)) if ls[i].get('train')], key=lambda i: (-ls[i].get('nb', 0), i))
    order += [i for i in range(len(ls)) if not ls[i].get('train')]
    for i in order:
        d = ls[i]
        w = b = None
        if i in held:
            w = self._read(self.woff[d['wt']] + held_at(d), held.pop(i))
        elif d.get('sh', i) != i:       # (its first use's: built first)
            w = lay[d['sh']].w
        if w is not None or (d.get('sd') and d.get('train')):   # (sd: the bias trains)
            b = self._read(self.woff[d['bt']], _i32(d['nb']))
        if d.get('fs') and 'sw' not in d:     # its weight scales (float32, in q8.req)
            d['sw'] = self._req(d, _f32(d['nq']), 2)
        L = lay[i] = Layer(d, w, b, acc, t.get(d.get('out')), self)
        if i in frac:
            L.wf = frac.pop(i)
        if i in sums:
            L.ga = sums[i][0]
            if adam:
                L.wm, L.am, L.av = sums[i][1:]
        if i in vel:
            L.vw = vel.pop(i)
        if w is not None and L.mul is None:
            L.mul, L.shf = self._req(d, _i32(d['nq'])), self._req(d, _i32(d['nq']), 1)
        t[d.get('out')] = L.y
    self.sy, self.zy = meta['sy'], meta['zy']
    self.sx, self.zx = meta['sx'], meta['zx']
    self.xin = meta.get('xin', 0)
    self.src = None             # (file, offset) of the sample, read by strips
    self.seed = 12345
    self.first = first
    # scce's softmax table (Q8Net.loss; host_tools/prepare/quant.py etab), 256 entries
    e = meta.get('etab')
    self.etab = None
    if e is not None:
        self.etab = _i32(256)
        for i in range(min(256, len(e))):    # (longer: q8range's, for doubled ranges)
            self.etab[i] = e[i]
    self.upm = array('i', [0, 0, 0, 0, 69069])      # upmk's seed, m, sh, h, LCG
    self.upe = array('i', [0, 0, 0, 0])              # upek's n, m, sh, h (m 0: none)
    self.bq = [0, 0, 0, None]           # _ibias's multiplier, shift, j, its layer
    self.wc = [None, None, None, None]  # _wide's last two buffers and their pairs
    self.smr = array('i', [0, 0, 0])                 # sfk's sum, argmax, max
    self.g0 = _i32(len(self.layers[-1].y) if ls else 0)
    self.bc = 0               # the period of the gradient _back passes down (0: none)
    for i in range(len(ls)):
        if bcast(ls, i):
            lay[i].bc = 1
        if ga[i]:
            lay[i].gi = ga[i]
    ga = None
    self.sink = self          # run.py's Ctrl-C handler calls tr.net.sink.zero()


def layer(self, d, w, b, acc, y, net, q8g):
    # Layer(d, w, b, acc, y, net): its set-up (utrain.q8 Layer.__init__; q8g: q8's globals)
    qmul, _i32 = q8g['qmul'], q8g['_i32']
    self.k = k = d['k']
    self.d = d
    if w is not None:
        self.w = w                  # int8 bytearray (None: MEAN, ADD, or streamed)
    if b is not None:
        self.b = b                  # int32 array
    self.nout = d['nout']
    self.zx, self.zy = d['zx'], d['zy']
    self.lo, self.hi = d['lo'], d['hi']
    if 'mul' in d:                  # (else in q8.req)
        self.mul = array('i', d['mul'])
        self.shf = array('i', d['shf'])
        self.c = len(d['mul'])      # 1: per-tensor scales
    elif d.get('nq', 1) > 1:
        self.c = d['nq']
    self.acc = acc                  # int32 sums, one buffer shared by all layers
    self.net = net
    self.y = bytearray(self.nout) if y is None else y
    self.ins = d.get('in')
    if 'g' in d:
        self.g = array('i', d['g'])
        # the geometry of one call (rows, channels): one array all layers share
        self.gs = net.gs if net is not None else array('i', d['g'])
    if k == _ADD:                         # the multipliers of input 2 and the sum
        self.m2 = memoryview(self.mul)[1:]
        self.s2 = memoryview(self.shf)[1:]
        self.m3 = memoryview(self.mul)[2:]
        self.s3 = memoryview(self.shf)[2:]
    if d.get('train', 0):
        self.train = 1
    if self.train or d.get('back', 0):
        self.back = 1             # passes a gradient (CONV, DW, FC, MEAN, pools)
    if d.get('back') and k < _MEAN:
        # (passes its input a gradient: the lowest trained layer, no 'back', passes
        # none and needs no rescaling; its int8 output gradient: the net's shared dz)
        sw = d['sw']
        m = self.swm = max(sw)      # (kept: max of a float32 array boxes each value)
        # per-channel weight scales: the input gradient's dz is rescaled by
        # sw[o] / max(sw) first (rqk's multipliers; none when per-tensor)
        if min(sw) != m and d.get('bx'):
            # its gradient arrives as one broadcast row (a MEAN's): the multipliers
            # read from q8.req a scratch at a time when used, not held (_dx)
            self.dxr = 1
        elif min(sw) != m:
            # (filled in place: lists of a wide layer's multipliers, boxed on a board,
            # were a transient peak of tens of KB while the model loads)
            c = len(sw)
            self.dxm, self.dxs = _i32(c), _i32(c)
            for o in range(c):
                self.dxm[o], self.dxs[o] = qmul(sw[o] / m)
    if d.get('mask', 0):
        # the output's 1-bit mask (q8sparse.mkk): y is not kept for the backward
        self.mk = bytearray((self.nout + 7) >> 3)
    if self.train:
        oc = len(b)
        # the output channels whose weights train (tw: a rank's window; [0, 0]: the
        # bias alone) and whose biases do (the window, or all of a bias-only layer's)
        self.wlo, self.whi = d.get('tw', (0, oc))
        self.blo, self.bhi = (self.wlo, self.whi) if self.whi > self.wlo else (0, oc)
        if d.get('pw'):
            self.pw, self.wo = 1, self.wlo * (d['wn'] // oc)
        if 'bh' not in d:       # (else made in Q8Net.setup where an optimizer needs it)
            self.set_bias()
        # backward buffers, allocated once (a board's heap fragments on per-step ones):
        # per-channel update multipliers (weights that train: a gradient chunk's
        # channels, _mults); the bias sums (a layer's live only in its _back) and the
        # weight gradient's chunk: the net's, shared (Q8Net.bs, Q8Net.gw)
        if umn(d):
            self.um, self.us = _i32(umn(d)), _i32(umn(d))
        self.bs = net.bs if net is not None else _i32(oc)


def trained_n(d):
    """Weights of trained layer d that train (Layer.wr: a rank's rows, a depthwise layer's
    all, none when the bias alone trains) (host_tools/plan/memory.py plans them with this)."""
    if not d.get('train'):
        return 0
    lo, hi = d.get('tw', (0, d['nb']))
    if hi <= lo:
        return 0
    return d['wn'] if d['k'] == _DW else (hi - lo) * (d['wn'] // d['nb'])


def umn(d):
    """The update multipliers trained layer d keeps (_mults: one a channel of its
    window, kept from step to step, where it has per-channel scales and at most UMAX
    channels train, else of a gradient chunk; a depthwise layer's all; one for the bias
    step of a per-tensor layer whose bias alone trains, _bias) (host_tools/plan/memory.py
    plans them with this)."""
    oc = d['nb']
    lo, hi = d.get('tw', (0, oc))
    nq = d['nq'] if 'nq' in d else len(d['sw'])
    if hi <= lo:
        return 1 if nq == 1 else 0
    if d['k'] == _DW:
        return oc
    return hi - lo if nq > 1 and hi - lo <= UMAX else min(d.get('gc', oc), hi - lo)


def held_bytes(d):
    """Bytes of layer d's weights held in RAM: a partial layer's (pw) window rows, else
    all (host_tools/plan/memory.py plans them with this)."""
    if d.get('pw'):
        lo, hi = d['tw']
        return (hi - lo) * (d['wn'] // d['nb'])
    return d['wn']


def held_at(d):
    # the offset of layer d's held weights in its tensor (a partial layer's window)
    return d['tw'][0] * (d['wn'] // d['nb']) if d.get('pw') else 0


def cdn(ls):
    """The int32 buffer q8asm's cdk takes for the input gradients of table ls's CONVs (a
    run of output pixels' im2col rows, about 2 KB at most): the largest over the convs
    the backward pass asks an input gradient of that are not pointwise; 0 for none."""
    n = 0
    for i in range(lowest(ls) + 1, len(ls)):
        d = ls[i]
        g = d.get('g')
        if d['k'] != _CONV or not d.get('back') or d.get('sd') or (
                g[4] == 1 and g[5] == 1 and g[6] == 1 and g[7] == 1 and g[8] == 0 and g[9] == 0
                and g[11] == g[1]):
            continue
        kk = g[4] * g[5] * g[2]
        n = max(n, min(max(512 // kk, 1), g[11]) * kk)
    return n


def lowest(ls):
    """The lowest layer of table ls the backward pass reaches: the first trained one, or
    a GATHER whose table trains ('eg': utrain.q8emb)."""
    return min([i for i in range(len(ls)) if ls[i].get('train') or ls[i].get('eg')] or [len(ls)])


def grads(ls, first):
    """Per layer, the positions in its inputs that the backward pass gives a gradient:
    those a layer from the first trained one (first) on made, once each (none below it,
    none for the first trained layer); () for most, one pass over the table."""
    made = set()
    out = []
    for i in range(len(ls)):
        d = ls[i]
        gi = ()
        if i > first and d.get('back'):
            ins = d['in']
            gi = tuple(j for j in range(len(ins)) if ins[j] in made and (
                d['k'] == _CAT or ins[j] not in ins[:j]))
        out.append(gi)
        if i >= first:
            made.add(d['out'])
    return out


def chain(ls, ga):
    """Is the backward walk of layer table ls a chain (ga: grads(ls, first)): from the
    loss down, each layer that a gradient reaches hands it to the next layer down alone,
    until one hands none?  Else Q8Net loads utrain.q8hold, whose walk holds the
    gradients of tensors that are not next (host_tools/plan/memory.py plans with this)."""
    c = ls[-1]['out'] if ls else None
    i = len(ls) - 1
    while c is not None:
        gi = ga[i]
        if ls[i]['out'] != c or len(gi) > 1:
            return False
        c = ls[i]['in'][gi[0]] if gi else None
        i -= 1
    return True


def bufs(ls, hz=()):
    """(int8 output-gradient bytes, its per-channel copy's, int32 weight-gradient chunk
    values, the held int32 gradients' values) of layer table ls: Q8Net's shared
    backward buffers (host_tools/plan/memory.py plans them with this); hz: the held
    gradients' slot sizes (utrain.q8hold.holds; none for a chain)."""
    first = lowest(ls)
    nz = nz2 = ng = 0
    nk = sum(hz)
    for i in range(len(ls)):
        d = ls[i]
        if not (d.get('train') or d.get('back')) or d['k'] >= _MEAN:
            continue
        nz = max(nz, dzn(ls, i))
        if i > first and (d.get('pc') or d.get('gw')) and d.get('train') and d.get(
                'tw', (0, 1))[1] > d.get('tw', (0, 1))[0]:
            # (its weights train: dz stays for their gradient; gw: scales equal at first
            # become per-channel when a channel's grow, utrain.q8grow)
            nz2 = max(nz2, d['nout'])
        if d.get('train'):
            oc = d['nb']
            lo, hi = d.get('tw', (0, oc))
            if hi > lo:
                row = d['wn'] // oc if d['k'] != _DW else 0
                ng = max(ng, d['wn'] if d['k'] == _DW else min(d.get('gc', oc), hi - lo) * row)
    return nz, nz2, ng, nk


def gwn(ng, A):
    """The int32 values of the weight-gradient chunk buffer (ng: its largest chunk, bufs)
    beside the A sums of the forward pass: none where the sums buffer holds it (no
    backward kernel reads the sums; a row-fed layer keeps its row there, and trains no
    weights) (host_tools/plan/memory.py plans it with this)."""
    return 0 if ng <= A else ng


def rowfed(ls, i):
    """Is layer i of table ls streamed (its frozen weights read from flash a chunk of
    output channels at a time) and fed a MEAN's broadcast row: its dz made, and its
    bias stepped, a chunk at a time (Q8Net._chunks)?"""
    return bool(ls[i].get('sd')) and i + 1 < len(ls) and bcast(ls, i + 1)


def dzn(ls, i):
    """The int8 output-gradient bytes layer i of table ls makes at once: its output's, or
    a row-fed layer's a chunk of output channels' (its positions x the chunk's channels)."""
    d = ls[i]
    if rowfed(ls, i):
        gm = d.get('g')
        O, P = (d['nout'], 1) if d['k'] == _FC else (gm[3], gm[10] * gm[11])
        return P * min(d.get('nc', O), O)
    return d['nout']


def bsn(ls):
    """The bias sums one buffer holds for every trained layer of table ls (each layer's
    live only in its backward step): a layer's output channels, a row-fed one's chunk."""
    return max([min(d.get('nc', d['nb']), d['nb']) if rowfed(ls, i) else d['nb']
                for i, d in enumerate(ls) if d.get('train')] or [0])


def gin(ls, hz=()):
    """The most values an input gradient of layer table ls has (hz: as bufs): the size
    of _gbuf's two buffers (host_tools/plan/memory.py plans them with this)."""
    m = max(hz or [0])      # (a held one joins the chain there)
    for i in range(len(ls)):
        d = ls[i]
        if d.get('back'):       # (a layer's own input-gradient need: q8bin, q8slc's 'gn')
            m = max(m, d.get('gn', 0))
        if (d.get('train') or d.get('back')) and d['k'] != _ADD and d['k'] < _CAT:
            # (an ADD, a CAT, a LUT: in place)
            k = d['k']
            m = max(m, d['nin'] if k == _FC else (0 if bcast(ls, i) else d['n'] * d['nout'])
                    if k == _MEAN else d['g'][0] * d['g'][1] * d['g'][2])
    return m


def gtwo(ls):
    """Does the backward pass of layer table ls need two input-gradient buffers: a pool,
    a BIN that broadcasts, an SLC that gathers or resizes or a TCV ('gx', 'rz'), or a MEAN whose
    gradient is not read broadcast, above the lowest trained layer (its
    input's gradient is made from its output's, both int32)?  Else one
    (host_tools/plan/memory.py plans them with this)."""
    first = lowest(ls)
    for i in range(first + 1, len(ls)):
        d = ls[i]
        if d.get('back') and (d['k'] == _PMAX or d['k'] == _PAVG or (d['k'] == _BIN and d.get('gn')) or (
                'gx' in d or 'rz' in d) or (
                d['k'] == _MEAN and not bcast(ls, i))):
            return True
    return False


def bcast(ls, i):
    """Does layer i, a MEAN, pass its gradient down as one row the layer below reads
    broadcast (that layer keeps a mask: q8sparse.smk), not as a tensor of its input's size?"""
    d = ls[i]
    e = ls[i - 1]
    return (i > 0 and d['k'] == _MEAN and bool(d.get('back')) and e['k'] < _MEAN and bool(e.get('mask'))
            and e['out'] == d['in'][0] and sum(1 for x in ls if e['out'] in x['in']) == 1)
