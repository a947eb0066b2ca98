# The frozen prefix of an int8 run, computed on the board once per sample (prepare
# --cache on an int8 model): train.json names the prefix's layer table (files.prefix,
# the layers below the first trained one, q8.json) and the trained part's (files.model,
# q8t.json, whose input is the prefix's output).  Before the trainer loads, make() runs
# the prefix over every sample of train.ds and test.ds into a dataset file beside each
# (NAME.q8.pfx: the prefix's int8 output at its scale and zero point, the same labels)
# and points files.train / files.test at them; then the prefix's tables, arena and code
# are dropped, and training holds only the trained layers.  The board's samples never
# leave it.  A band group that takes the sample reads it a strip of rows at a time.
import sys
from struct import pack
_had = list(sys.modules)            # (what the run had loaded: kept)
from utrain.q8 import Q8Net  # noqa: E402

SUFFIX = '.q8.pfx'


PASS = 'in the frozen prefix pass'     # (utrain.once's out-of-memory line says where)


def make(files, log=None, every=None):
    # every: utrain.run.gc_every's n while the pass runs (None: as it was)
    try:
        return _make(files, log, every)
    except MemoryError as e:
        if e.args and 'locked' in e.args[0]:    # a Ctrl-C (utrain.run ctrl_c)
            raise
    import gc
    gc.collect()                # (the pass's objects: garbage now)
    raise MemoryError(PASS)


def _make(files, log=None, every=None):
    import json
    from utrain.data import Dataset
    from utrain.wof import openr
    # the names first: nothing the run keeps is allocated among the prefix's buffers
    # (a string left between them would split the freed space the trainer needs)
    todo = []
    for key in ('train', 'test'):
        p = files.get(key)
        if p:
            files[key] = p + SUFFIX
            todo.append((p, files[key]))
    with open(files['prefix']) as f:
        try:
            meta = json.load(f)
        except (ValueError, RuntimeError):          # (too deep: RuntimeError)
            meta = None
    if type(meta) is not dict:
        raise ValueError('%s: not a utrain int8 layer table (prepare again)' % files['prefix'])
    if meta.get('groups'):
        # the band code (dropped at the end) and the names it interns (never freed) before
        # the prefix's arrays, not among them: freed, those leave one run the trainer's
        # arrays fit in, not holes between survivors
        from utrain import q8bands  # noqa: F401
    net = None
    for p, out in todo:
        ds = Dataset(p, False)
        n, nin, ny = ds.n, meta['nin'], meta['nclass']
        want = ds.head + ds.n * (ny + ds.rec - ds.xbytes)
        try:
            with openr(out) as f:
                if f.seek(0, 2) == want:
                    ds.f.close()
                    continue            # made by an earlier run on these samples
        except ValueError:
            pass
        if ds.x_len != nin or ds.xbytes != nin:
            raise ValueError('%s: the int8 prefix takes int8 samples of %d values' % (p, nin))
        if net is None:
            net = Q8Net(meta, files['weights'], 0.0, 0, 0)    # (forward only: no set-up)
            if every is not None:   # (loaded as the code was: the samples as training runs)
                from utrain.run import gc_every
                gc_every(every)
        src = ds.f
        src.seek(0)
        h = bytearray(src.read(ds.head))
        # the cached samples: int8 (dtype 2) of the prefix's output at its scale and zero point
        h[6] = 2
        h[12:16] = pack('<I', ny)
        h[20:28] = pack('<ff', meta['sy'], -meta['zy'] * meta['sy'])
        lab = bytearray(ds.rec - ds.xbytes)
        strips = net.strips()
        x = None if strips else bytearray(nin)
        with open(out + '.tmp', 'wb') as f:
            f.write(h)
            for i in range(n):
                at = ds.head + i * ds.rec
                if strips:
                    net.src = (src, at)
                else:
                    src.seek(at)
                    src.readinto(x)
                y = net.forward(x)
                src.seek(at + ds.xbytes)
                src.readinto(lab)
                f.write(y)
                f.write(lab)
                if log:
                    log(i + 1, n)
        src.close()
        import os
        try:
            os.remove(out)
        except OSError:
            pass
        os.rename(out + '.tmp', out)
    if net is not None:
        net.close()
    from utrain.run import drop
    for m in list(sys.modules):     # what only the prefix used (bands, q8bands): dropped
        if m.startswith('utrain.') and m not in _had and m[7:] != 'wof':
            drop(m[7:])
    return files
