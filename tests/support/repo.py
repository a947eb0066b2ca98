"""Where the checkout is, for the tests and their helpers (tests/conftest.py puts this
folder on sys.path; a helper run as a script finds it beside itself)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICRO = os.path.join(ROOT, 'micro')


def set_train(folder, run=None, **keys):
    """Edit a prepared folder's train.json as a user would: top-level keys (epochs=3) and
    keys of its run block (run={'resume': True}); returns the new config."""
    import json
    p = os.path.join(str(folder), 'train.json')
    with open(p) as f:
        cfg = json.load(f)
    cfg.update(keys)
    cfg['run'].update(run or {})
    with open(p, 'w') as f:
        json.dump(cfg, f)
    return cfg


def no_keep_best(folder):
    """A prepared folder's run ends saving its weights (no validation-gated keeping)."""
    set_train(folder, run={'keep_best': False})
