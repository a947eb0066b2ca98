"""The learning-rate probe: prepare's lr pass for a run whose lr nobody gave.

The default lr (0.01 a sample, runfolder.run_defaults) suits models whose layers see
inputs of about unit scale.  A model made elsewhere for inputs of another scale dies at
it: a Keras 64x64x3 CNN (a 12544-wide dense layer, samples within +-7) collapsed to the
uniform guess at 0.01 on its first samples and stayed at chance (0.29 of 4 classes,
loss ln 4), where 0.001 reached 0.97.  The probe trains the prepared run folder on the
host (the board's own code, utrain.trainer) for one short pass of a few training
samples at the lr and at a third of it (1/sqrt(10)), and so on down, and keeps the largest lr whose
loss on other training samples (never the test split) is not clearly beaten by a
smaller one.  It only ever lowers the lr, and says so."""
import os

import numpy as np

PASS = 64           # training samples of one probe pass
HELD = 32           # other training samples that judge it
MIN_SAMPLES = 24    # fewer training samples than this: no probe
CLEARLY = 0.7       # a lower lr wins where its held loss is below this share of the higher's
STEP = 10 ** 0.5    # each lr tried is the last over this (0.01, 0.0032, 0.001, ...)
STEPS = 6           # at most lr / STEP**STEPS
MACS = 24e9         # multiply-adds the probe may take in all (about 5-20 s of numpy):
                    # a model whose pass takes more than half probes no lower lr


def _held_loss(tr, ds, order, lr):
    """Held-out mean loss after one pass over order's first samples at lr (inf where
    the pass diverged or the loss is not finite)."""
    from .select import diverged
    p = min(PASS, len(order) - HELD // 2)
    held = [int(i) for i in order[p:p + HELD]]
    n = ds.n
    try:
        tr.configure(lr=lr)
        ds.n = p                        # (_pass runs samples 0..n-1 through idx)
        tr._pass(ds, True, [int(i) for i in order[:p]])
        tr.apply()
        ds.n = len(held)
        loss = tr._pass(ds, False, held)[0]
    except diverged():
        return float('inf')
    finally:
        ds.n = n
    return float(loss) if np.isfinite(loss) else float('inf')


def probe_lr(out_dir, files, s, n_train, given, log, model_path, gp) -> dict:
    """s with the lr the probe keeps (unchanged where lr was given, the run is int8 or
    reads a host-made cache, the training samples are too few, or the lr diverges at
    once: the run's own on_nan halves it as it goes).  Down the steps until a loss is
    twice the least so far (or STEPS, or MACS: a training step of gp, the graph and its
    training plan, takes select.step_macs); the largest lr within 1/CLEARLY of the least loss is kept."""
    if 'lr' in given or n_train is None or n_train < MIN_SAMPLES or not files.get('train') \
            or files.get('prefix'):
        return s
    from .select import step_macs
    steps = min(STEPS, int(MACS // max(1, step_macs(*gp) * (PASS + HELD))) - 1)
    if steps < 1:
        return s
    from ..target.device import module
    Trainer, Dataset = module('trainer').Trainer, module('data').Dataset
    flat, wof = (os.path.join(out_dir, files[k]) for k in ('model', 'weights'))
    ds = Dataset(os.path.join(out_dir, files['train']))
    order = np.random.default_rng(5).permutation(ds.n)
    lr0 = float(s['lr'])
    tried = []
    try:
        for k in range(steps + 1):
            lr = lr0 if not k else float('%.2g' % (lr0 / STEP ** k))
            tried.append((lr, _held_loss(Trainer(flat, wof), ds, order, lr)))
            least = min(l for _, l in tried)
            if tried[0][1] == float('inf') or tried[-1][1] > 2 * least:
                break
    finally:
        ds.close()
    least = min(l for _, l in tried)
    best = next(lr for lr, l in tried if l <= least / CLEARLY)
    if best == lr0 or tried[0][1] == float('inf'):
        return s
    log(f'{model_path}: lr {best:g}: at {lr0:g} one pass of {min(PASS, n_train)} samples left '
        'a clearly higher loss on other training samples ('
        + ', '.join(f'lr {lr:g}: {l:.3g}' for lr, l in tried)
        + '), as a model made for inputs of another scale can; --lr sets another')
    return dict(s, lr=best)
