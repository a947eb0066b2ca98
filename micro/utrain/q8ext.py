# utrain.q8's net set-up after its load (utrain.q8load, dropped first): the code training
# keeps that the net's table asks for loads here, once the load's code is collected (the
# two resident at once were the load's peak), and this module is dropped after it


def ext(self, q8g):
    """The band groups and the state that follows training kept beside the weights
    (self.ext: files, checkpoints, in this order) of Q8Net self."""
    # (utrain.q8's globals: it imports this module, which cannot import it back)
    EMB, TCV, qmul, _i32, _f32, _mults = [q8g[k] for k in (
        'EMB', 'TCV', 'qmul', '_i32', '_f32', '_mults')]
    meta, ls, X = self.meta, self.meta['layers'], self.X
    self.groups = {}
    if meta.get('groups'):
        from utrain.q8bands import Q8Group
        for lo, hi, rows in meta['groups']:
            self.groups[lo] = Q8Group(self, lo, hi, rows)
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
    self.ext = [x for x in (self.rr, self.wg, self.sl, self.sh) if x is not None]
    if EMB in X:                # (an embedding's table that trains: utrain.q8emb)
        X[EMB].ext(self, _i32, qmul)
    if any([d.get('xt') for d in ls]):  # TRANSPOSE_CONV weights that train (q8tcv: last)
        self.ext.append(X[TCV].Train(self, qmul, _mults))
