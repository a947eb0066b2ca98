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


def assert_same_logs(a, b):
    """train.log rows a (a board's) and b (the host's, as board_and_host_runs reads them)
    the same: the header and the row count equal, each figure to the last printed digit (a
    32-bit board prints its float32 values through MicroPython's own formatter, a digit
    off exact for some)."""
    assert a[0] == b[0] and len(a) == len(b), (a, b)
    for ra, rb in zip(a[1:], b[1:]):
        assert len(ra) == len(rb) and all(
            u == v or (u and v and abs(float(u) - float(v)) <= 1.5e-6) for u, v in zip(ra, rb)), (ra, rb)


def board_and_host_runs(folder, extra, read=lambda f: f.read()):
    """The prepared folder run on the board (unix MicroPython) and on the host (CPython),
    each on a copy of it: [(trained.wof bytes, the file extra as read(binary file) gives
    it, train.log's rows)] for the board, then the host."""
    import shutil
    from host_tools.target import runner
    outs = []
    for py in (False, True):
        d = str(folder) + ('py' if py else 'mp')
        shutil.copytree(folder, d)
        code, out = runner.run(d, python=py, stream=False)
        assert code == 0, out
        with open(os.path.join(d, 'train.log')) as f:
            log = [v.split(',')[1:5] for v in f.read().splitlines()]
        with open(os.path.join(d, 'trained.wof'), 'rb') as f:
            wof = f.read()
        with open(os.path.join(d, extra), 'rb') as f:
            outs.append((wof, read(f), log))
    return outs


def staged_run(exe, folder, script, heap='2M', timeout=300):
    """Run script (a file in folder) on the unix MicroPython exe with utrain staged in
    folder/lib for that build's .mpy version; the CompletedProcess (text)."""
    import subprocess
    from host_tools.target import runner
    mpy = int(subprocess.run([exe, '-c', 'import sys;print(sys.implementation._mpy)'],
                             capture_output=True, text=True).stdout.split()[-1])
    runner.stage(str(folder), mpy=mpy)
    return subprocess.run([exe, '-X', f'heapsize={heap}', script], cwd=folder,
                          capture_output=True, text=True,
                          env=dict(os.environ, MICROPYPATH=':lib'), timeout=timeout)
