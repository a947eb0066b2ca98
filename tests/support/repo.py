"""Where the checkout is, for the tests and their helpers (tests/conftest.py puts this
folder on sys.path; a helper run as a script finds it beside itself)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICRO = os.path.join(ROOT, 'micro')


def no_keep_best(folder):
    """A prepared folder's run ends saving its weights (no validation-gated keeping):
    train.json's run.keep_best set to False."""
    import json
    p = os.path.join(folder, 'train.json')
    with open(p) as f:
        cfg = json.load(f)
    cfg['run']['keep_best'] = False
    with open(p, 'w') as f:
        json.dump(cfg, f)
