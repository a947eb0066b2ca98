"""The learning-rate probe: prepare's lr pass for a run whose lr nobody gave.

The default lr (0.01 a sample, runfolder.run_defaults) suits models whose layers see
inputs of about unit scale and a loss over few outputs.  A model made elsewhere meets
other samples: a Keras 64x64x3 CNN from GitHub (a 12544-wide dense layer, samples within
+-7) collapsed to the uniform guess at 0.01 on its first samples and stayed at chance
(0.29 of 4 classes, loss ln 4) where 0.001 reached 0.97; a Keras MobileNetV2 trained as
int8 the same (ln 3); a sigmoid a cell of an [18, 12] output (bce, the mean of 216)
barely moved at 0.01.  The probe trains the prepared run folder on the host (the
board's own code: utrain.trainer, or utrain.q8train for an int8 run) for one short pass
of a few training samples at the lr, judged by the loss on other training samples
(never the test split), and steps the lr by sqrt(10) down where that pass did harm, or
up where it barely moved (one step up where it lowered the loss: kept where clearly
lower still), and says what it chose.  A run that caches its frozen prefix
trains only the part above it on the prefix's outputs, and so does the probe; 8-23
training samples are judged on their own loss after the pass; a pass too costly (an
int8 run's budget its own: its trainer costs the host more a multiply-add) probes
fewer samples; where it cannot run it says so (docs/training.md)."""
import os
import shutil
import struct
import tempfile

import numpy as np

PASS = 64           # training samples of one probe pass
HELD = 32           # other training samples that judge it
LONG = 256          # ...or, where the samples and budget allow STEPS lrs of it, up to this
LONG_HELD = 64      # pass and this many held (from 2 x PASS + HELD training samples)
MIN_SAMPLES = 24    # fewer training samples than this: one pass over all of them...
FEW = 8             # ...judged on their own loss after it (at least FEW; fewer: no probe)
LEAST = 8           # a pass (and its held samples) shrunk to fit MACS: at least this many
CLEARLY = 0.7       # a lower lr wins where its held loss is below this share of the higher's
STEP = 10 ** 0.5    # each lr tried is the last over this (0.01, 0.0032, 0.001, ...)
STEPS = 6           # at most lr / STEP**STEPS...
FAR = 16            # ...or this many where every lr tried clearly raised the held loss
UP = 4              # at most lr * STEP**UP
UPDATES = 8         # going up takes a pass of at least this many updates
STILL = 0.97        # a held loss within this share of where it began (either way) barely moved
GROWS = 1.5         # going up, each step's drop in held loss this many times the last's
ABOVE = 0.7         # where the lr lowered the held loss, one step up wins where its pass
#                     leaves it below this share of the lr's
MACS = 24e9         # multiply-adds the probe may take in all (about 5-20 s of numpy)
MACS_Q8 = 1.2e9     # ...of an int8 run (about 10-20 s: utrain.q8train under CPython took 9-16
#                     ns a q8_macs multiply-add on DS-CNN and MobileNet tables, 3-4 times the
#                     float trainer's; at MACS a 224x224 int8 MobileNet's probe took 220 s)


def _held_loss(tr, ds, train, held):
    """Held-out mean loss (samples held of ds) after one pass over samples train (none:
    the loss as the model is) with trainer tr; inf where the pass diverged or the loss
    is not finite."""
    from .select import diverged
    n = ds.n
    if getattr(tr, 'cache', False):
        tr._prefix(ds)      # (a prefix cache of all n samples, before n is the pass's)
    try:
        if train:
            ds.n = len(train)           # (_pass runs samples 0..n-1 through idx)
            tr._pass(ds, True, train)
            tr.apply()
        ds.n = len(held)
        loss = tr._pass(ds, False, held)[0]
    except diverged():
        return float('inf')
    finally:
        ds.n = n
        close = getattr(tr.net, 'close', None)      # (an int8 net's open weight files)
        if close:
            close()
    return float(loss) if np.isfinite(loss) else float('inf')


def _first_lr(lr, start, loss):
    """The lr the probe's first pass takes: the run's (lr), or for an mse loss, lr / the
    held loss before any pass (start) on the probe's sqrt(10) steps, at most UP steps up:
    a regression's targets far from unit scale, whose error and last-layer weights each
    scale the gradients below them (each about sqrt(start)), down where they are large,
    up where small (a Keras Conv1D regression on targets within +-0.1, held loss 0.0015:
    from 0.01 the probe kept 0.01, test MAE 0.032, where 0.1 reached 0.026; the first
    lr now 1, and the probe steps down from its harm).  On held-out regressions
    (Keras Conv1D nets made for targets within +-100 and +-1e4, held losses 838 and
    3.5e7 before a pass; float and int8) the best of a decade grid was 1e-5 and 1e-10 /
    1e-9, where a probe stepping down from 0.01 took 3.2e-7 / 3.2e-5 (its short passes
    barely told them apart) and 0.01 (every lr to 1e-5 diverged) / 0.001 (a pass that
    lowered the loss by luck, and the run never beat its first weights); earlier ones
    agree: targets within +-10, +-1000 at 0.001, 1e-7, a VLP position net in mm
    (held loss ~3000) at 3.2e-6 to 1e-5."""
    import math
    if loss != 'mse' or not 0 < start < float('inf'):
        return lr
    return float('%.2g' % (lr * STEP ** min(UP, -round(2 * math.log10(start)))))


def updates_ok(p, cfg, own):
    """May the probe go above the lr?  Only where its pass of p samples held UPDATES
    updates (one update of a batch of 1000 barely moves the loss at any lr the run can
    take for ten epochs) and was judged on other samples (a higher lr fits the pass's own
    samples better)."""
    return p // max(1, int(cfg.get('batch', 1))) >= UPDATES and not own


def _uniform(tr):
    """A test of a held loss: is it the uniform guess of trainer tr's classifier (within
    1.5 % of ln C: scce or cce over C > 1 outputs)?  Always False for other losses."""
    import math
    c = 0
    if tr.cfg.get('loss') in ('scce', 'cce'):
        c = getattr(tr, 'ncls', 0) or 0
        if not c:
            r, k = tr.net.shape[tr.net.outputs[0]]
            c = r * k
    u = math.log(c) if c > 1 else 0.0
    return lambda loss: bool(u) and abs(loss - u) <= 0.015 * u


def _subset(path, idx, out):
    """Dataset file out: the samples idx of dataset file path, in that order."""
    from ..target.device import module
    ds = module('data').Dataset(path, False)
    try:
        f = ds.f
        f.seek(0)
        head = bytearray(f.read(ds.head))
        head[8:12] = struct.pack('<I', len(idx))
        with open(out, 'wb') as o:
            o.write(head)
            for j in idx:
                f.seek(ds.head + j * ds.rec)
                o.write(f.read(ds.rec))
    finally:
        ds.close()
    return out


def _trainer(out_dir, cfg, cache, idx, tmp):
    """A function of lr making a fresh trainer of run folder out_dir (train.json cfg),
    and a Dataset of its training samples idx (a copy in folder tmp, sample i of it
    sample idx[i]): the int8 trainer for an int8 layer table, with the settings as the run
    gives them (as select's int8 trials do).  The trained part only where the run caches
    its frozen prefix (cache: the float run's, or an int8 prefix table, files.prefix):
    the prefix computed once a sample as the board does (utrain.prefix, utrain.q8prefix),
    into tmp, never beside the run's own datasets."""
    from ..target.device import module
    files = {k: os.path.join(out_dir, v) for k, v in cfg['files'].items()
             if isinstance(v, str)}
    path = _subset(files['train'], idx, os.path.join(tmp, 'probe.ds'))
    if files['model'].endswith('.json'):
        Q8 = module('q8train').Q8Trainer
        if files.get('prefix'):
            path = module('q8prefix').make(dict(train=path, prefix=files['prefix'],
                                                weights=files['weights']))['train']
        s = {k: v for k, v in cfg.items() if k not in ('files', 'run', 'lr')}
        return (lambda lr: Q8(files['model'], files['weights'], lr=lr, **s),
                module('data').Dataset(path, False))
    Trainer = module('trainer').Trainer

    def make(lr):
        tr = Trainer(files['model'], files['weights'])
        tr.configure(lr=lr)
        tr.cache = bool(cache)      # (utrain.prefix: off where the model has no prefix)
        return tr
    return make, module('data').Dataset(path)


def _plan(n, macs, prefix_macs, budget=None, fwd=None):
    """The probe's samples and steps for n training samples and a step of macs
    multiply-adds (prefix_macs more a sample, once: a cached frozen prefix; fwd, a held
    sample's forward pass alone: None, a step's) within budget multiply-adds (None: MACS,
    float's; an int8 run's MACS_Q8): (pass, held, own, steps), own where the pass is
    judged on its own samples (fewer than MIN_SAMPLES: none to hold out), or a str: why
    it cannot run.  PASS and HELD, or from 2 x PASS + HELD samples a pass of LONG (LONG /
    2) judged on LONG_HELD where STEPS lrs of it fit the budget."""
    budget = budget or MACS
    fwd = macs if fwd is None else min(fwd, macs)
    own = n < MIN_SAMPLES
    p = n if own else min(PASS, n - HELD // 2)
    h = p if own else min(HELD, n - p)

    def steps(p, h):
        return min(STEPS, _lrs(p, h, own, macs, prefix_macs, budget, fwd))
    if not own and n >= 2 * PASS + HELD:
        # (a longer pass where the samples and budget take STEPS lrs of it: 64 samples
        # did not tell the lrs apart that five epochs did, a Keras Conv1D regression on
        # targets within +-100 raised its held loss at 1e-5 (957 from 838, SGD's first
        # steps) and fell clearly at 256 (184 where 3.2e-7 left 1305))
        for q in (LONG, LONG // 2):
            g = LONG_HELD if n - min(q, n - HELD) >= LONG_HELD else HELD
            q = min(q, n - g)
            if q > p and steps(q, g) >= STEPS:
                p, h = q, g
                break
    if steps(p, h) < 1:
        # fewer samples, not no probe: LEAST held (the pass's harm shows on few, and shows
        # the less the shorter the pass) and as long a pass as takes three lrs (down 10x);
        # a held sample costs its forward pass alone (fwd), a pass's sample a step
        h = p if own else min(h, LEAST)
        if own:
            a = int(budget // max(1, 3 * (macs + fwd) + prefix_macs))
        else:
            a = int((budget - h * (3 * fwd + prefix_macs)) // max(1, 3 * macs + prefix_macs))
        p = max(min(p, LEAST), min(p, a))
        h = p if own else h
    if steps(p, h) < 1:
        return (f'one pass of {p} samples and the loss on {h} would take about '
                f'{(p * macs + h * fwd) / 1e9:.3g} G multiply-adds an lr; it takes at most '
                f'{budget / 1e9:g} G, for two lrs at least')
    return p, h, own, steps(p, h)


def _lrs(p, h, own, macs, prefix_macs, budget, fwd=None):
    """How many lrs past the first a pass of p samples judged on h (own: the same ones)
    may try within budget multiply-adds (macs a step, prefix_macs a sample once, fwd a
    held sample's forward pass: None, a step's).  The held samples are only run forward
    (the held loss): charged a step each, a starved probe (an int8 run's MACS_Q8 on a
    large model) had a third of the pass it could take."""
    fwd = macs if fwd is None else fwd
    return int((budget - prefix_macs * (p if own else p + h))
               // max(1, macs * p + fwd * h)) - 1


def probe_lr(out_dir, cfg, n_train, given, log, model_path, macs, cache=False,
             prefix_macs=0, budget=None, fwd=None) -> float | None:
    """The lr the probe chooses for run folder out_dir (its train.json's cfg, the files
    and settings as written), or None to keep cfg's: where lr was given, the training
    samples are too few (it says so), or every lr tried diverges (the run's own on_nan
    halves it as it goes; a pass that diverged at the lr steps down: an analog-meter CNN
    from GitHub diverged at 0.01, and the run's halving left it at the uniform guess,
    where 0.0032 learns).  Where the pass at the lr left the held loss within STILL of
    where it began, up the steps while the drop from there grows GROWS times a step (as
    it does where the lr is too small to bend), keeping the least; where it clearly
    lowered the held loss, one step above it too (kept where its loss is below ABOVE x
    the lr's); else down until a loss is twice the least so far, keeping the largest lr
    within 1/CLEARLY of the least (a classifier's collapse to the uniform guess never,
    where another lr lowered the loss).  A pass before any (the start), the lr's, at
    most one above, then at most STEPS (UP up; FAR down while every lr did harm), within
    budget multiply-adds (None: MACS; an int8 run's:
    MACS_Q8): macs, a training step's (of the trained part where the run caches its
    frozen prefix: cache, the float run's setting, or an int8 prefix table; prefix_macs,
    the prefix's a sample, once); where a pass costs more, fewer samples (_plan)."""
    files = cfg['files']
    if 'lr' in given or n_train is None or not files.get('train'):
        return None
    lr0 = float(cfg['lr'])
    plan = _plan(n_train, macs, prefix_macs, budget, fwd) if n_train >= FEW else (
        f'{n_train} training sample{"s" * (n_train != 1)}, it needs {FEW}')
    if isinstance(plan, str):
        log(f'{model_path}: the lr probe did not run ({plan}): the run trains at lr '
            f'{lr0:g} as it is; --lr sets another')
        return None
    p, h, own, steps = plan
    order = [int(i) for i in np.random.default_rng(5).permutation(n_train)]
    idx = order[:p] if own else order[:p + h]
    tmp = tempfile.mkdtemp(prefix='utrain-lrprobe-')
    ds = None
    # (a pass that overflows is a result here, not numpy's RuntimeWarnings to print)
    quiet = np.errstate(all='ignore')
    quiet.__enter__()
    try:
        make, ds = _trainer(out_dir, cfg, cache or files.get('prefix'), idx, tmp)
        train = list(range(p))
        held = train if own else list(range(p, p + h))
        tr0 = make(lr0)
        flat = _uniform(tr0)
        start = _held_loss(tr0, ds, (), held)
        lr1 = _first_lr(lr0, start, cfg.get('loss'))     # (from here: the steps' centre)
        tried = [(lr1, _held_loss(make(lr1), ds, train, held))]
        # (where the lr clearly lowered the held loss, one step above it: a regression on
        # targets within +-0.1 learned at 0.01 to a test MAE of 0.034 where 0.1 reached
        # 0.027; kept only where its pass leaves the loss clearly lower still, ABOVE)
        above = None
        # (never past UP steps above the run's lr, where the first lr is already up)
        ups = UP - round(2 * np.log10(lr1 / lr0)) if lr1 > lr0 else UP
        if tried[0][1] < STILL * start and not flat(tried[0][1]) and updates_ok(p, cfg, own) \
                and ups > 0:
            above = (float('%.2g' % (lr1 * STEP)), None)
            above = (above[0], _held_loss(make(above[0]), ds, train, held))
        # (up only where the pass held UPDATES updates: one update of a batch of 1000
        # barely moves the loss at any lr the run can take for ten epochs; and never
        # judged on the pass's own samples: a higher lr fits those better)
        # (and never where the pass raised the loss by more: that is harm, down)
        up = STILL * start <= tried[0][1] <= start / STILL and updates_ok(p, cfg, own) \
            and ups > 0
        # (down past STEPS, to FAR within the budget, while every lr tried clearly
        # raised the held loss or diverged: an int8 regression
        # on targets in the thousands (a VLP position net, mm) raised it 10^3-10^8 times
        # from 0.01 to 0.00032, not in order of lr, and learned at 3.2e-6)
        # (and past the first that did not, one more: a lower one may lower it more)
        # (the pass above the lr is one of the budget's)
        far = min(FAR, _lrs(p, h, own, macs, prefix_macs, budget or MACS, fwd)
                  - bool(above))
        last = min(steps, far)
        for k in range(1, (min(steps, ups) if up else far) + 1):
            lr = float('%.2g' % (lr1 * STEP ** (k if up else -k)))
            tried.append((lr, _held_loss(make(lr), ds, train, held)))
            # (a classifier's pass that fell to the uniform guess from a start that was
            # not is no loss to stop at: down, as harm, until one lowers it otherwise;
            # and a pass that diverged at every lr so far is harm too: a Keras Conv1D
            # regression on targets within +-1e4 overflowed at 0.01 to 1e-5, where the
            # probe stopped, and learned at 1e-9 to 1e-10)
            least = min([l for _, l in tried if not flat(l) or flat(start)] or [float('inf')])
            harm = start / STILL < least
            last = max(steps, k + 2) if harm else last
            # (down: an lr that barely moved the loss where none tried lowered it ends
            # it: lower ones move it less, none clearly below: samples with nothing the
            # model can learn, such as random labels, where higher lrs did harm)
            # (an lr that diverged is harm: down, as a pass that raised the loss)
            if (not start - tried[-1][1] >= GROWS * (start - tried[-2][1]) if up
                    else k >= last or not harm and (
                        tried[-1][1] > 2 * least
                        or STILL * start <= least and tried[-1][1] <= start / STILL)):
                break
    finally:
        quiet.__exit__(None, None, None)
        if ds is not None:
            ds.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if above and above[1] < ABOVE * tried[0][1]:
        tried.insert(0, above)      # (its loss: the least, or within 1/CLEARLY of it)
    least = min(l for _, l in tried)
    if least == float('inf'):
        # (every lr tried diverged: the run's on_nan halving, three times from the lr,
        # cannot reach one that trains; a GitHub LSTM with ReLU cells on samples of another
        # scale overflowed at 0.01 to 1e-5 and the run stopped saying to lower the lr)
        log(f'{model_path}: warning: the lr probe found no lr that trains: one pass of {p} '
            f'samples diverged (overflowed to inf or NaN) at every lr tried, '
            f'{tried[0][0]:g} down to {tried[-1][0]:g}, from a held loss of {start:.3g} '
            'with the weights as given; the run will stop the same way.  Check that the '
            'samples are what the model was made for (their units and scale: the '
            'normalisation the model was trained with, applied to x), and the model\'s '
            'weights; --lr sets an lr to try (lower than those)')
        return None
    # (going down, a classifier's loss at the uniform guess, ln C, from a start that was
    # not, is a collapse, not a loss to keep within 1/CLEARLY of the least: a GitHub-like
    # CNN on samples at 50x its scale fell to ln 4 at 0.01-0.00032 and learned at 0.0001)
    # (and where the least is itself at the uniform guess, a collapse loses to an lr
    # whose pass lowered the loss otherwise: three int8 classifiers from GitHub fell to
    # exactly ln C at 0.01, below the lower lrs' losses, and their runs never moved again)
    fell = [] if up or flat(start) else [l for _, l in tried if flat(l)]
    if fell and not any(l < start for _, l in tried if l not in fell):
        fell = []
    least = min(l for _, l in tried if l not in fell)
    # (never an lr whose pass raised the held loss where another lowered it; where
    # none did, the least)
    best = next((lr for lr, l in tried if l not in fell and
                 l <= (least if up or least >= start else min(least / CLEARLY, start))),
                None)
    best = next(lr for lr, l in tried if l == least) if best is None else best
    if up and not least < STILL * start:
        best = lr1      # (up: only where a higher lr moved the held loss clearly)
    first = next(l for lr, l in tried if lr == lr1)     # (the first pass's)
    if best == lr0:
        return None
    why = ('was the best of those tried' if best == lr1 else 'barely moved the loss' if up else
           'lowered the loss, and one step above it clearly more' if best > lr1
           else 'diverged' if first == float('inf')
           else 'fell to the uniform guess' if first in fell
           else 'left a clearly higher loss')
    scaled = '' if lr1 == lr0 else (
        f' (mse from a held loss of {start:.3g} before any pass: the first lr {lr0:g} / '
        f'{start:.3g}' + (f', at most {STEP ** UP:.0f}x' if lr1 > lr0 and ups <= 0 else '')
        + ', targets far from unit scale scale the gradients, up or down)')
    on = (f'on those samples after it (only {n_train} training samples: none held out)'
          if own else 'on other training samples')
    # (a regression's targets in large units: SGD's steps grow with the error, down to an
    # lr that barely moves the model; a GitHub MLPRegressor of bike counts (mse 1.9e4)
    # went to 1e-07, test MAE 174 -> 161, where adam at 0.00032 reached 111)
    big = not up and cfg.get('optimizer', 'sgd') == 'sgd' and best <= lr0 * 1e-3 and (
        cfg.get('loss') == 'mse' and start >= 100 or cfg.get('loss') == 'mae' and start >= 10)
    log(f'{model_path}: lr {best:g}: at {lr1:g}{scaled} one pass of {p} samples {why} {on} '
        f'(before: {start:.3g}, '
        + ', '.join(f'lr {lr:g}: {l:.3g}' for lr, l in tried)
        + (f'; a {cfg["loss"]} of {start:.3g} before: targets in large units, whose '
           'gradients grow with them, take SGD down to an lr this small, where it barely '
           'moves: --optimizer adam, whose steps are of the lr\'s size whatever the units, '
           'trains them' if big else '' if up or best >= lr1 else
           '; as a model made for inputs of another scale can')
        + ('; none lowered it: the run may keep its first weights' if least >= start else '')
        + '); --lr sets another')
    return best


def probe_written(out_dir, summary, given, log, model_path) -> dict:
    """An int8 run folder as written (summary: prepare_q8's), its train.json's lr the
    probe's (summary's settings too); the macs from its layer tables (select.q8_macs:
    with a prefix table, files.prefix, the trained part's, the prefix's once a sample),
    within MACS_Q8: the int8 trainer's multiply-adds cost the host more."""
    import json
    from .select import q8_macs
    from .runfolder import atomic_write
    path = os.path.join(out_dir, 'train.json')
    with open(path) as f:
        cfg = json.load(f)
    macs, fwd = [], None
    for key in ('model', 'prefix'):
        if cfg['files'].get(key):
            with open(os.path.join(out_dir, cfg['files'][key])) as f:
                ls = json.load(f)['layers']
            macs.append(q8_macs(ls))
            fwd = q8_macs(ls, forward=True) if fwd is None else fwd
    lr = probe_lr(out_dir, cfg, summary.get('train_samples'), given, log, model_path,
                  *macs[:1], prefix_macs=sum(macs[1:]), budget=MACS_Q8, fwd=fwd)
    if lr is not None:
        cfg['lr'] = lr
        atomic_write(path, (json.dumps(cfg, indent=1) + '\n').encode())
        if isinstance(summary.get('settings'), dict):
            summary['settings']['lr'] = lr
    return summary
