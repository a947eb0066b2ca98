"""The frozen-prefix cache made on the host (`prepare --cache host`): prepare runs the
frozen layers below the first trained op over its own datasets (utrain's micro code under
CPython, float32) and writes train.ds.pfx / test.ds.pfx exactly as the board's first
epoch would (utrain.prefix).  The board then never runs those layers to train or
evaluate: its heap holds only the trained part.  Predicting new samples still runs the
whole model on the board."""
from __future__ import annotations

import os


def write_caches(out_dir, files) -> dict | None:
    """Write the prefix cache of each dataset in out_dir; returns {'op': k, 'tensors':
    [...], 'bytes': total} or None when the model has no frozen prefix."""
    from ..target.device import module
    Trainer = module('trainer').Trainer
    Dataset = module('data').Dataset
    zeros = module('xnp').zeros
    cut = module('prefix').cut
    tr = Trainer(os.path.join(out_dir, files['model']), os.path.join(out_dir, files['weights']))
    k, ts = cut(tr.net)
    if not k:
        return None
    tr.cache = True
    total = 0
    for name in (files['train'], files['test']):
        if not name:
            continue
        d = Dataset(os.path.join(out_dir, name))
        try:
            pf = tr._prefix(d)
            x, y = zeros(tr.x_shape), zeros(tr.y_shape)
            for j in range(d.n):
                d.read(j, x, y)
                tr.net.set_input(x)
                tr.net.forward(False, 0, k)
                pf.save(j)
            pf.close()
        finally:
            d.close()
        total += os.path.getsize(pf.path)
    return {'op': k, 'tensors': ts, 'bytes': total}
