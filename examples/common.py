"""What the examples share: the checkout on sys.path, a prepare -> train -> export step,
and the before/after line.  Each example is a script: `python examples/NAME.py
[--fast] [--board B] [--out DIR]`."""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host_tools.target import runner                      # noqa: E402
from host_tools.prepare.infer import evaluate, describe    # noqa: E402,F401
from host_tools.prepare.pipeline import prepare, export     # noqa: E402


def args(doc, out, board=None):
    p = argparse.ArgumentParser(description=doc.split('\n\n')[0])
    p.add_argument('--fast', action='store_true', help='fewer samples and epochs (the tests)')
    p.add_argument('--board', default=board,
                   help='train on the simulated board with this profile\'s heap (unix '
                        'MicroPython) instead of the micro/ code under CPython'
                        + (f' (default {board})' if board else ''))
    p.add_argument('--out', default=os.path.join('build', 'examples', out), help='work folder')
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    return a


def train(model, folder, a, files=None, host=False, **settings):
    """prepare model into folder with settings, then (files: {role: path} copied in and
    named in train.json, e.g. {'train': 'mine.ds'} for data the board recorded) train it
    on the simulated board (--board) or under CPython (without it, or host: training
    that happens on the host anyway, as a factory's); returns the trained weights' path."""
    prepare(model, folder, **settings)
    if files:
        cfg_path = os.path.join(folder, 'train.json')
        with open(cfg_path) as f:
            cfg = json.load(f)
        for role, path in files.items():
            name = os.path.basename(path)
            if os.path.abspath(path) != os.path.abspath(os.path.join(folder, name)):
                with open(path, 'rb') as src, open(os.path.join(folder, name), 'wb') as dst:
                    dst.write(src.read())
            cfg['files'][role] = name
        with open(cfg_path, 'w') as f:
            json.dump(cfg, f, indent=1)
    board = a.board and not host
    code, text = runner.run(folder, board=a.board if board else 'unix', python=not board,
                            stream=False)
    last = [line for line in text.splitlines() if line.startswith('epoch ')]
    if code:
        raise SystemExit(f'{folder}: training failed:\n{text[-2000:]}')
    if last:
        print('   ' + last[-1])
    return os.path.join(folder, 'trained.wof')


def before_after(what, before, after):
    print(f'{what}:\n  before: {describe(before)}\n  after:  {describe(after)}')
