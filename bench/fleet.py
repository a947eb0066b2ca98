"""Federated fleets against centralized training: the digits MLP on N boards (Flower
FedAvg weighted by samples), global test accuracy per round for each split, beside
centralized training on the same training data for as many epochs (rounds x local
epochs), all in one run.  Boards run the micro/ code under CPython + numpy (the host
simulation: the same maths as unix MicroPython, which gives the same figures; --mp runs
them as unix MicroPython boards over mpremote instead, much slower).

    python bench/fleet.py [--boards 4] [--rounds 3] [--epochs 3] [--splits iid,by-class,dirichlet:0.3]
"""
import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.boards import fleet as fl  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.plot import read_log  # noqa: E402

DIGITS = os.path.join(ROOT, 'datasets', 'digits')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--boards', type=int, default=4)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--epochs', type=int, default=3, help='local epochs per round')
    p.add_argument('--splits', default='iid,by-class,dirichlet:0.3')
    p.add_argument('--optimizer', default='sgd')
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--mp', action='store_true', help='unix MicroPython boards over mpremote')
    a = p.parse_args(argv)
    cfg = dict(loss='scce', optimizer=a.optimizer, lr=a.lr, batch=a.batch, shuffle=True,
               epochs=a.epochs)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, 'base')
        prepare(os.path.join(DIGITS, 'digits_mlp.circle'), base,
                data=os.path.join(DIGITS, 'digits.npz'), test_split=0.2, **cfg)
        for how in a.splits.split(','):
            st = fl.fleet(base, boards=a.boards, rounds=a.rounds, split_how=how,
                          python=not a.mp, out=os.path.join(tmp, 'fleet-' + how.replace(':', '')),
                          say=lambda s: None)
            rows[f'fleet {how}'] = [h['test_accuracy'] for h in st['history']]
        # centralized: all the training data on one board, rounds x epochs epochs,
        # the test accuracy read at the same points (every `epochs` epochs)
        with open(os.path.join(base, 'train.json')) as f:
            c = json.load(f)
        c['epochs'] = a.rounds * a.epochs
        c['run']['keep_best'] = False
        with open(os.path.join(base, 'train.json'), 'w') as f:
            json.dump(c, f)
        code, text = runner.run(base, python=not a.mp, stream=False)
        if code:
            raise SystemExit(text)
        log = read_log(os.path.join(base, 'train.log'))['test_accuracy']
        rows['centralized'] = [log[r * a.epochs] for r in range(a.rounds + 1)]
    print(f'digits MLP, {a.boards} boards, {a.optimizer} lr {a.lr:g} batch {a.batch}, '
          f'{a.epochs} local epochs a round; global test accuracy (host test split, 359 '
          f'samples) after each round; centralized: after as many epochs')
    head = ['run'] + [f'round {r}' for r in range(a.rounds + 1)]
    print('| ' + ' | '.join(head) + ' |')
    print('|' + '---|' * len(head))
    for name, acc in rows.items():
        print(f'| {name} | ' + ' | '.join(f'{v:.3f}' for v in acc) + ' |')


if __name__ == '__main__':
    main()
