# utrain.q8's net load, Q8Net.__init__'s work: imported for it and dropped after (code
# is heap on a board: none of this runs again while the net trains; 6 KB on 32-bit)
from array import array
from utrain import q8kern as K


def build(self, meta, wof_path, mom, adam, batch, q8g):
    """Q8Net(meta, wof_path, ...)'s load into self (utrain.q8: its setup follows); q8g:
    utrain.q8's globals, its layer kinds and helpers (imported, an import circle)."""
    g = q8g.get
    Layer, qmul, _i32, _f32, _b8, _mults = [g(k) for k in (
        'Layer', 'qmul', '_i32', '_f32', '_b8', '_mults')]
    lowest, grads, chain, bufs, gwn, bsn, gin, cdn = [g(k) for k in (
        'lowest', 'grads', 'chain', 'bufs', 'gwn', 'bsn', 'gin', 'cdn')]
    held_bytes, held_at, trained_n, bcast = [g(k) for k in (
        'held_bytes', 'held_at', 'trained_n', 'bcast')]
    CAT, LUT, PMAX, PAVG, BIN, SLC, NRM, TCV, EMB = [g(k) for k in (
        'CAT', 'LUT', 'PMAX', 'PAVG', 'BIN', 'SLC', 'NRM', 'TCV', 'EMB')]
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
        if d['k'] == CAT and CAT not in X:
            from utrain import q8cat
            X[CAT] = q8cat
        elif d['k'] == LUT and LUT not in X:
            from utrain import q8lut
            X[LUT] = q8lut
        elif (d['k'] == PMAX or d['k'] == PAVG) and PMAX not in X:
            from utrain import q8pool
            X[PMAX] = q8pool
        elif d['k'] == BIN and BIN not in X:
            from utrain import q8bin
            X[BIN] = q8bin
        elif d['k'] == SLC and SLC not in X:
            from utrain import q8slc
            X[SLC] = q8slc
        elif d['k'] == NRM and NRM not in X:
            from utrain import q8nrm
            X[NRM] = q8nrm
        elif d['k'] == TCV and TCV not in X:
            from utrain import q8tcv
            X[TCV] = q8tcv
        elif d['k'] == EMB:
            from utrain import q8emb
            X[EMB] = q8emb
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
    self.groups = {}
    if meta.get('groups'):
        from utrain.q8bands import Q8Group
        for lo, hi, rows in meta['groups']:
            self.groups[lo] = Q8Group(self, lo, hi, rows)
    # scce's softmax table (_sce; host_tools/prepare/quant.py etab), 256 entries
    e = meta.get('etab')
    self.etab = None
    if e is not None:
        self.etab = _i32(256)
        for i in range(min(256, len(e))):    # (longer: q8range's, for doubled ranges)
            self.etab[i] = e[i]
    self.upm = array('i', [0, 0, 0, 0, 69069])      # upmk's seed, m, sh, h, LCG
    self.upe = array('i', [0, 0, 0, 0])              # upek's n, m, sh, h (m 0: none)
    self.bq = [0, 0, 0, 0]              # _ibias's multiplier, shift, j, its layer's id
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
    self.rr = None            # ranges that follow training (utrain.q8range: 'rr')
    if meta.get('rr'):
        from utrain.q8range import Ranges
        self.rr = Ranges(self, meta['rr'])
    self.wg = None            # weight scales that grow (utrain.q8grow: 'gw')
    if any([d.get('gw') and d.get('train') for d in ls]):
        from utrain.q8grow import Grow
        self.wg = Grow(self, qmul, _i32)
    self.sl = None            # PRELU slopes that train ('ta')
    if any([d.get('ta') for d in ls]):
        from utrain.q8slope import Slopes
        self.sl = Slopes(self, qmul, _f32)
    self.sh = None            # weights several layers read (utrain.q8share: 'sh')
    if any(['sh' in d for d in ls]):
        from utrain.q8share import Share
        self.sh = Share(self, qmul, _i32, _f32)
    # the state either keeps beside the weights (files, checkpoints: in this order)
    self.ext = [x for x in (self.rr, self.wg, self.sl, self.sh) if x is not None]
    if EMB in X:                # (an embedding's table that trains: utrain.q8emb)
        X[EMB].ext(self, _i32, qmul)
    if any([d.get('xt') for d in ls]):  # TRANSPOSE_CONV weights that train (q8tcv: last)
        self.ext.append(X[TCV].Train(self, qmul, _mults))
