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
up where it barely moved, and says what it chose."""
import os

import numpy as np

PASS = 64           # training samples of one probe pass
HELD = 32           # other training samples that judge it
MIN_SAMPLES = 24    # fewer training samples than this: no probe
CLEARLY = 0.7       # a lower lr wins where its held loss is below this share of the higher's
STEP = 10 ** 0.5    # each lr tried is the last over this (0.01, 0.0032, 0.001, ...)
STEPS = 6           # at most lr / STEP**STEPS
UP = 4              # at most lr * STEP**UP
UPDATES = 8         # going up takes a pass of at least this many updates
STILL = 0.97        # a held loss above this share of where it began barely moved
GROWS = 1.5         # going up, each step's drop in held loss this many times the last's
MACS = 24e9         # multiply-adds the probe may take in all (about 5-20 s of numpy):
                    # a model whose pass takes more than half is not probed


def _held_loss(tr, ds, train, held):
    """Held-out mean loss (samples held of ds) after one pass over samples train (none:
    the loss as the model is) with trainer tr; inf where the pass diverged or the loss
    is not finite."""
    from .select import diverged
    n = ds.n
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


def _trainer(out_dir, cfg):
    """A function of lr making a fresh trainer of run folder out_dir (train.json cfg),
    and its training Dataset: the int8 trainer for an int8 layer table, with the
    settings as the run gives them (as select's int8 trials do)."""
    from ..target.device import module
    files = {k: os.path.join(out_dir, v) for k, v in cfg['files'].items()
             if isinstance(v, str)}
    if files['model'].endswith('.json'):
        Q8 = module('q8train').Q8Trainer
        s = {k: v for k, v in cfg.items() if k not in ('files', 'run', 'lr')}
        return (lambda lr: Q8(files['model'], files['weights'], lr=lr, **s),
                module('data').Dataset(files['train'], False))
    Trainer = module('trainer').Trainer

    def make(lr):
        tr = Trainer(files['model'], files['weights'])
        tr.configure(lr=lr)
        return tr
    return make, module('data').Dataset(files['train'])


def probe_lr(out_dir, cfg, n_train, given, log, model_path, macs) -> float | None:
    """The lr the probe chooses for run folder out_dir (its train.json's cfg, the files
    and settings as written), or None to keep cfg's: where lr was given, the run reads a
    host-made cache, the training samples are too few, or the lr diverges at once (the
    run's own on_nan halves it as it goes).  Where the pass at the lr left the held loss
    within STILL of where it began, up the steps while the drop from there grows GROWS
    times a step (as it does where the lr is too small to bend), keeping the least; else
    down until a loss is twice the least so far, keeping the largest lr within 1/CLEARLY
    of the least.  At most STEPS (UP up), or MACS: macs, a training step's multiply-adds."""
    files = cfg['files']
    if 'lr' in given or n_train is None or n_train < MIN_SAMPLES or not files.get('train') \
            or files.get('prefix'):
        return None
    steps = min(STEPS, int(MACS // max(1, macs * (PASS + HELD))) - 1)
    if steps < 1:
        return None
    make, ds = _trainer(out_dir, cfg)
    order = [int(i) for i in np.random.default_rng(5).permutation(ds.n)]
    p = min(PASS, ds.n - HELD // 2)
    train, held = order[:p], order[p:p + HELD]
    lr0 = float(cfg['lr'])
    try:
        start = _held_loss(make(lr0), ds, (), held)
        tried = [(lr0, _held_loss(make(lr0), ds, train, held))]
        # (up only where the pass held UPDATES updates: one update of a batch of 1000
        # barely moves the loss at any lr the run can take for ten epochs)
        updates = p // max(1, int(cfg.get('batch', 1)))
        up = STILL * start <= tried[0][1] < float('inf') and updates >= UPDATES
        for k in range(1, min(steps, UP if up else steps) + 1):
            lr = float('%.2g' % (lr0 * STEP ** (k if up else -k)))
            tried.append((lr, _held_loss(make(lr), ds, train, held)))
            least = min(l for _, l in tried)
            if tried[0][1] == float('inf') or (
                    not start - tried[-1][1] >= GROWS * (start - tried[-2][1]) if up
                    else tried[-1][1] > 2 * least):
                break
    finally:
        ds.close()
    least = min(l for _, l in tried)
    best = next(lr for lr, l in tried if l <= (least if up else least / CLEARLY))
    if best == lr0 or tried[0][1] == float('inf') or up and not least < STILL * start:
        return None     # (up: only where a higher lr moved the held loss clearly)
    why = ('barely moved the loss' if up else 'left a clearly higher loss')
    log(f'{model_path}: lr {best:g}: at {lr0:g} one pass of {p} samples {why} '
        f'on other training samples (before: {start:.3g}, '
        + ', '.join(f'lr {lr:g}: {l:.3g}' for lr, l in tried)
        + ('' if up else '; as a model made for inputs of another scale can')
        + '); --lr sets another')
    return best


def probe_written(out_dir, summary, given, log, model_path) -> dict:
    """An int8 run folder as written (summary: prepare_q8's), its train.json's lr the
    probe's (summary's settings too); the macs from its layer table (select.q8_macs)."""
    import json
    from .select import q8_macs
    from .runfolder import atomic_write
    path = os.path.join(out_dir, 'train.json')
    with open(path) as f:
        cfg = json.load(f)
    with open(os.path.join(out_dir, cfg['files']['model'])) as f:
        macs = q8_macs(json.load(f)['layers'])
    lr = probe_lr(out_dir, cfg, summary.get('train_samples'), given, log, model_path, macs)
    if lr is not None:
        cfg['lr'] = lr
        atomic_write(path, (json.dumps(cfg, indent=1) + '\n').encode())
        if isinstance(summary.get('settings'), dict):
            summary['settings']['lr'] = lr
    return summary
