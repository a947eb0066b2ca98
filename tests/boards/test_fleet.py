"""Federated fleets on Flower (host_tools/boards/fleet.py): the digits MLP over 4 boards with a
by-class split learns (against centralized training on the same data), a board killed
mid-round is left out of that round only, the fleet resumes after its last saved round,
no board's flash holds another board's samples, and a board sends back exactly its
trainable tensors (a ranked tensor's training channels only)."""
import json
import os
import sys
import threading
import time

import numpy as np
import pytest

from repo import ROOT, set_train  # noqa: E402

pytest.importorskip('flwr')
from host_tools.boards import fleet as fl  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.files.dataset import read_dataset  # noqa: E402
from host_tools.plot import read_log, plot  # noqa: E402

MP = runner.find_micropython()
DIGITS = os.path.join(ROOT, 'datasets', 'digits')
MLP = os.path.join(DIGITS, 'digits_mlp.circle')


def digits(tmp_path, n=None, **kw):
    data = os.path.join(DIGITS, 'digits.npz')
    if n:
        with np.load(data) as z:
            data = str(tmp_path / 'digits_n.npz')
            np.savez(data, x=z['x'][:n], y=z['y'][:n])
    d = str(tmp_path / 'run')
    cfg = dict(loss='scce', optimizer='sgd', lr=0.05, batch=1, epochs=3, shuffle=True)
    cfg.update(kw)
    prepare(MLP, d, data=data, test_split=0.2, **cfg)
    return d


class Spy:
    """Records what each board's ClientApp sends back (wraps fleet.client_app)."""

    def __init__(self, monkeypatch):
        self.sent = []
        real = fl.client_app

        def wrapped(clients):
            app = real(clients)

            def call(msg, ctx):
                reply = app(msg, ctx)
                rec = reply.content['arrays']
                self.sent.append((clients[ctx.node_id].board.name,
                                  {k: rec[k].numpy() for k in rec.keys()},
                                  dict(reply.content['metrics'])))
                return reply
            return call
        monkeypatch.setattr(fl, 'client_app', wrapped)


@pytest.mark.slow
def test_by_class_fleet_learns_close_to_centralized(tmp_path, monkeypatch):
    """4 boards (host simulation: the maths), by-class split, 3 rounds of 3 local epochs:
    the global test accuracy rises by >= 0.3; centralized training on the same data for
    the same 9 epochs is the reference.  Boards send back exactly the trainable tensors."""
    d = digits(tmp_path)
    spy = Spy(monkeypatch)
    st = fl.fleet(d, boards=4, rounds=3, split_how='by-class', python=True, say=lambda s: None)
    acc = [h['test_accuracy'] for h in st['history']]
    assert [h['round'] for h in st['history']] == [0, 1, 2, 3]
    assert all(len(h['answered']) == 4 for h in st['history'][1:])
    assert all(h['samples'] == 1438 for h in st['history'][1:])
    # each board saw few classes
    _, y = read_dataset(os.path.join(d, 'train.ds'))
    shards = fl.split(y, 4, 'by-class', 0)
    assert all(len(np.unique(y[s, 0])) <= 4 for s in shards)
    # centralized: the same micro/ code on all the data, as many epochs
    set_train(d, epochs=9, run={'keep_best': False})
    code, _ = runner.run(d, python=True, stream=False)
    assert code == 0
    central = read_log(os.path.join(d, 'train.log'))['test_accuracy'][-1]
    print(f'\nby-class fleet test accuracy per round {acc}; centralized (9 epochs) {central:.4f}')
    assert acc[-1] >= acc[0] + 0.3, acc
    assert acc[-1] >= central - 0.3, (acc, central)
    # the global weights of the last round, saved as a .wof the device reader takes
    model = fl.Trainable(d)
    g = model.read(os.path.join(d, 'fleet', 'global.wof'))
    assert fl.evaluate(model, os.path.join(d, 'fleet', 'global.wof'),
                       os.path.join(d, 'test.ds'))[1] == pytest.approx(acc[-1])
    # what travelled back: exactly the trainable tensors, whole, with the sample count
    assert len(spy.sent) == 12
    want = {str(k): model.shapes[k] for k in model.ids}
    for name, parts, metrics in spy.sent:
        assert {k: v.shape for k, v in parts.items()} == want
        assert metrics['num-examples'] == len(shards[int(name[-1])])
    # FedAvg weighted by samples: the last round's global weights are the weighted mean
    last = spy.sent[-4:]
    n = np.array([m['num-examples'] for _, _, m in last], float)
    for k in want:
        mean = sum(w * p[k] for w, (_, p, _) in zip(n / n.sum(), last))
        assert np.allclose(g[int(k)], mean, atol=1e-6)
    # the CSV log and plot
    log = read_log(os.path.join(d, 'fleet', 'fleet.csv'))
    assert log['round'] == [0, 1, 2, 3] and log['test_accuracy'] == pytest.approx(acc, abs=1e-6)
    png = plot(os.path.join(d, 'fleet', 'fleet.csv'), str(tmp_path / 'fleet.png'))
    assert open(png, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_ranked_tensors_travel_as_their_channels(tmp_path, monkeypatch):
    """With --ranks only a tensor's training channels travel; the rest of the global
    weights stays the starting weights."""
    d = digits(tmp_path, n=300, epochs=1, ranks='0:1/2')
    model = fl.Trainable(d)
    assert model.ranks
    spy = Spy(monkeypatch)
    fl.fleet(d, boards=2, rounds=1, split_how='iid', python=True, say=lambda s: None)
    g = model.read(os.path.join(d, 'fleet', 'global.wof'))
    for _, parts, _ in spy.sent:
        for k in model.ids:
            full = model.shapes[k]
            if k in model.ranks:
                ax, lo, hi = model.ranks[k]
                assert parts[str(k)].shape == ((hi - lo, full[1]) if ax == 0 else (full[0], hi - lo))
                keep = np.ones(full, bool)
                keep[(slice(lo, hi), slice(None)) if ax == 0 else (slice(None), slice(lo, hi))] = False
                assert np.array_equal(g[k][keep], model.base[k][keep])
                assert not np.array_equal(g[k], model.base[k])
            else:
                assert parts[str(k)].shape == full


def test_split_shares_every_sample_once():
    y = np.repeat(np.arange(10), 30)[:, None].astype(np.float32)
    for how in ('iid', 'by-class', 'dirichlet:0.3'):
        parts = fl.split(y, 4, how, 1)
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(y))), how
    assert max(len(np.unique(y[p, 0])) for p in fl.split(y, 4, 'by-class', 1)) <= 4
    with pytest.raises(ValueError, match='dirichlet'):
        fl.split(y, 4, 'dirichlet:x')
    with pytest.raises(ValueError, match='expected iid'):
        fl.split(y, 4, 'byclass')


@pytest.mark.slow
@pytest.mark.skipif(not MP, reason='no MicroPython binary')
def test_simulated_boards_over_mpremote_kill_and_resume(tmp_path):
    """Unix MicroPython boards behind pseudo-terminals, driven with mpremote: a board
    killed mid-round is left out of that round (the others' round completes) and is back
    in the next; a second run resumes after the last saved round; each flash holds only
    its own shard."""
    d = digits(tmp_path, n=400, epochs=1)
    out = str(tmp_path / 'fleet')
    killed = []

    def kill_mid_round(board, rnd):
        if rnd == 1 and board.name == 'board1':
            log = os.path.join(board.flash, 'train.log')

            def watch():          # train.log appears when training has started
                t = time.time() + 60
                while not os.path.exists(log) and time.time() < t:
                    time.sleep(0.01)
                board.fake.proc.kill()
                killed.append(rnd)
            threading.Thread(target=watch, daemon=True).start()

    lines = []
    st = fl.fleet(d, boards=4, rounds=2, split_how='by-class', out=out, timeout=60,
                  on_train=kill_mid_round, say=lines.append)
    h = st['history']
    assert killed == [1]
    assert h[1]['answered'] == ['board0', 'board2', 'board3'], h[1]
    assert 'board1' in h[1]['failed'] and any('board1 left out of round 1' in s for s in lines)
    assert h[2]['answered'] == ['board0', 'board1', 'board2', 'board3'], h[2]
    assert h[1]['samples'] + 80 == h[2]['samples'] == 320    # board1 has 80 of 320
    # no board's flash holds another board's samples
    _, y = read_dataset(os.path.join(d, 'train.ds'))
    shards = fl.split(y, 4, 'by-class', 0)
    x_all, _ = read_dataset(os.path.join(d, 'train.ds'))
    for b in range(4):
        flash = os.path.join(out, 'flash', f'board{b}')
        ds = [n for n in os.listdir(flash) if n.endswith('.ds')]
        assert ds == ['train.ds'], ds
        x, _ = read_dataset(os.path.join(flash, 'train.ds'))
        assert np.array_equal(x, x_all[shards[b]])
        # nor does the host keep a copy of what it sent, or pull one back
        assert not [n for n in os.listdir(os.path.join(out, 'host', f'board{b}'))
                    if n.endswith('.ds')]
    # the fleet resumes after round 2 with the saved global weights
    saved = open(os.path.join(out, 'global.wof'), 'rb').read()
    lines = []
    st2 = fl.fleet(d, boards=4, rounds=3, split_how='by-class', out=out, timeout=60,
                   say=lines.append)
    assert any('resuming the fleet' in s and 'after round 2' in s for s in lines), lines
    assert [x['round'] for x in st2['history']] == [0, 1, 2, 3]
    assert st2['history'][:3] == json.loads(json.dumps(h))
    assert len(st2['history'][3]['answered']) == 4
    assert open(os.path.join(out, 'global.wof'), 'rb').read() != saved
    acc = [x['test_accuracy'] for x in st2['history']]
    assert acc[-1] > acc[0] + 0.2, acc
    # a fleet of other settings refuses the folder rather than mixing runs
    with pytest.raises(fl.FleetError, match='split'):
        fl.fleet(d, boards=4, rounds=4, split_how='iid', out=out, say=lines.append)


@pytest.mark.slow
@pytest.mark.skipif(not MP, reason='no MicroPython binary')
def test_ports_boards_train_on_the_data_they_hold(tmp_path):
    """`fleet --ports`: boards on serial ports keep the data they collected (named under
    files.train in their own train.json); the fleet copies code, model and weights only,
    and a board without data is refused with its name."""
    import subprocess
    from host_tools.boards.simboard import FakeBoard
    from host_tools.files.dataset import write_dataset
    d = digits(tmp_path, n=300, epochs=1)
    x, y = read_dataset(os.path.join(d, 'train.ds'))
    heap = runner.boards()['rp2040']['heap']
    flashes = [tmp_path / f'flash{i}' for i in range(3)]
    for i, f in enumerate(flashes[:2]):
        f.mkdir()
        idx = np.flatnonzero((y[:, 0] < 5) == (i == 0))           # board 0: digits 0-4
        write_dataset(str(f / 'mine.ds'), x[idx], y[idx], 'uint8')
        (f / 'train.json').write_text(json.dumps({'files': {'train': 'mine.ds'}}))
    flashes[2].mkdir()
    # the host's folder: model and settings without data, and a test set of its own
    bare = str(tmp_path / 'bare')
    prepare(MLP, bare, loss='scce', optimizer='sgd', lr=0.05, batch=1, epochs=1, shuffle=True)
    with FakeBoard(MP, str(flashes[0]), heap) as a, FakeBoard(MP, str(flashes[1]), heap) as b:
        out = str(tmp_path / 'fleet')
        r = subprocess.run([sys.executable, '-m', 'host_tools', 'fleet', bare, '--ports',
                            f'{a.port},{b.port}', '--resume', '--rounds', '1', '-o', out,
                            '--test', os.path.join(d, 'test.ds')],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert 'round 1: 2 boards answered (%d samples)' % len(y) in r.stdout, r.stdout
        for f in flashes[:2]:
            assert sorted(n for n in os.listdir(f) if n.endswith('.ds')) == ['mine.ds']
            assert json.loads((f / 'train.json').read_text())['files']['train'] == 'mine.ds'
        log = read_log(os.path.join(out, 'fleet.csv'))
        assert log['test_accuracy'][1] > log['test_accuracy'][0] + 0.2, log
    with FakeBoard(MP, str(flashes[2]), heap) as c:
        r = subprocess.run([sys.executable, '-m', 'host_tools', 'fleet', d, '--ports', c.port,
                            '--resume', '--rounds', '1', '-o', str(tmp_path / 'f2')],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and 'board0: no train.ds on the board' in r.stderr, r.stderr


def test_grid_leaves_out_a_board_that_does_not_answer_in_time():
    """DirectGrid: a ClientApp slower than the round's timeout is left out of the round
    (its late reply is dropped), a failing one replies with an Error; the others answer."""
    from flwr.app import ArrayRecord, Array, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    release = threading.Event()

    def app(msg, ctx):
        if ctx.node_id == 2:
            release.wait(10)
        if ctx.node_id == 3:
            raise RuntimeError('board3: mpremote run failed\nTraceback ...\nOSError: [Errno 5] EIO')
        w = msg.content['arrays']['0'].numpy() + ctx.node_id
        return Message(RecordDict({'arrays': ArrayRecord({'0': Array(w)}),
                                   'metrics': MetricRecord({'num-examples': ctx.node_id})}),
                       reply_to=msg)
    grid = fl.DirectGrid(app, [1, 2, 3, 4])
    strategy = fl.make_strategy('fedavg')
    arrays = ArrayRecord({'0': Array(np.zeros(3, np.float32))})
    t = time.time()
    replies = list(grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord(), grid),
                                         timeout=1.0))
    assert time.time() - t < 5
    ok = sorted(m.metadata.src_node_id for m in replies if not m.has_error())
    bad = [m for m in replies if m.has_error()]
    assert ok == [1, 4] and len(bad) == 1 and 'EIO' in bad[0].error.reason
    assert grid.failures[2] == 'no answer in 1 s' and 'board3' in grid.failures[3]
    new, metrics = strategy.aggregate_train(1, replies)
    assert np.allclose(new['0'].numpy(), (1 * 1 + 4 * 4) / 5)     # weighted by samples
    release.set()
    time.sleep(0.2)
    assert not grid.replies                                     # the late reply dropped
