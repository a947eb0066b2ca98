"""`fleet`: federated training of a fleet of boards on Flower (flwr).

One host-side Flower ClientApp stands for each board (no Flower client runs on a
microcontroller): it writes the global trainable weights as the board's weights .wof,
lets the board train its local epochs with train.py, and returns the board's trained
tensors and its sample count.  A Flower ServerApp aggregates them (FedAvg weighted by
samples by default), evaluates the global model on the host's test split, and saves the
global weights (global.wof, atomic) and the round's figures (fleet.csv) after every
round; a later run resumes after the last saved round.

What travels: only the trainable tensors, and of a tensor with a sparse rank (prepare
--ranks) only its training channels lo:hi (the rest never changes anywhere).  What the
host pulls from a board: its trained .wof and train.log, never its samples.

Boards: simulated (unix MicroPython behind a pseudo-terminal, driven with mpremote like
a serial board, each with only its own shard of the training data on its own flash
folder), the host simulation (CPython + numpy running the same micro/ code in a folder,
for the maths), or real boards on serial ports, each with the data it collected.

Flower's simulation engine needs Ray; the ServerApp and ClientApps here run in one
process through a small Grid (DirectGrid) that hands each message to its board's
ClientApp on a thread of its own, so boards train in parallel and a board that fails or
does not answer in time is left out of that round only."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import uuid

import numpy as np

from ..files import flatmodel
from . import board as bd
from ..target import runner
from ..formats.circle_io import atomic_write
from ..target.device import module
from ..files.wof import write_wof

devwof = module('wof')

STRATEGIES = ('fedavg', 'fedavgm', 'fedadam', 'fedyogi', 'fedadagrad', 'fedmedian',
              'fedtrimmedavg')


def log_head(metric):
    """fleet.csv's header; the metric named as train.json names it (accuracy, or mae for
    a regression), as train.log names it (plot reads either)."""
    return ['round', 'loss', metric, 'test_loss', 'test_' + metric, 'boards', 'samples']


class FleetError(RuntimeError):
    pass


# ---------------------------------------------------------------- the trainable tensors

class Trainable:
    """The trainable tensors of a prepared folder: which tensors, their device shapes,
    their ranks, and the starting weights (the parts outside a rank's channels)."""

    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, 'train.json')) as f:
            self.cfg = json.load(f)
        files = self.cfg['files']
        self.model = os.path.join(d, files['model'])
        fl = flatmodel.read_flat(self.model)
        self.n = len(fl['shapes'])
        self.ids = list(fl['trainable'])
        self.shapes = [tuple(s) if k in self.ids else None for k, s in enumerate(fl['shapes'])]
        self.ranks = dict(fl['ranks'])
        self.base = self.read(os.path.join(d, files['weights']))

    def read(self, path):
        """{tensor: (rows, cols) float32} from a .wof of this model (error names path)."""
        try:
            with open(path, 'rb') as f:
                data = f.read()
        except OSError as e:
            raise FleetError(f'{path}: cannot read ({e.strerror})') from None
        f = io.BytesIO(data)
        try:
            offs, _ = devwof.read_table(f, path, self.shapes)
        except devwof.FormatError as e:
            raise FleetError(f'{e} (model {self.model})') from None
        out = {}
        for k in self.ids:
            r, c = self.shapes[k]
            out[k] = np.frombuffer(data, '<f4', r * c, offs[k]).reshape(r, c).copy()
        return out

    def write(self, path, arrays):
        write_wof(path, self.n, arrays)

    def _part(self, k):
        ax, lo, hi = self.ranks.get(k, (0, 0, self.shapes[k][0]))
        return (slice(lo, hi), slice(None)) if ax == 0 else (slice(None), slice(lo, hi))

    def travel(self, arrays):
        """What goes over the wire: {str(tensor): the part that trains} (whole tensors,
        a ranked tensor's training channels)."""
        return {str(k): np.ascontiguousarray(arrays[k][self._part(k)]) for k in self.ids}

    def merge(self, parts):
        """Full weights from travelled parts (the rest from the starting weights)."""
        keys = sorted(parts, key=int)
        if keys != [str(k) for k in self.ids]:
            raise FleetError(f'weights for tensors {keys}, the model trains {self.ids}')
        out = {}
        for k in self.ids:
            a = self.base[k].copy()
            p = np.asarray(parts[str(k)], np.float32)
            if a[self._part(k)].shape != p.shape:
                raise FleetError(f'tensor {k}: {p.shape} travelled, expected {a[self._part(k)].shape}')
            a[self._part(k)] = p
            out[k] = a
        return out


# ---------------------------------------------------------------- data shards

def _ds_header(path):
    from ..files.dataset import read_dataset, header, record_bytes
    x, y = read_dataset(path)                     # validates the file
    with open(path, 'rb') as f:
        data = f.read()
    h = header(path, data)
    return data, h[1], record_bytes(h), h[4], y


def labels(y):
    return (np.argmax(y, 1) if y.shape[1] > 1 else y[:, 0]).astype(int)


def split(y, boards, how='iid', seed=0):
    """Sample indices per board: iid (a seeded shuffle cut in equal parts), by-class
    (samples sorted by class and cut in contiguous parts: each board sees few classes)
    or dirichlet:A (per class, shares drawn from Dirichlet(A); small A, skewed boards)."""
    n = len(y)
    lab = labels(y)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    if boards < 1 or boards > n:
        raise ValueError(f'--boards {boards}: need 1 to {n} (the training samples)')
    if how == 'iid':
        parts = np.array_split(perm, boards)
    elif how == 'by-class':
        order = perm[np.argsort(lab[perm], kind='stable')]
        parts = np.array_split(order, boards)
    elif how.startswith('dirichlet:'):
        try:
            alpha = float(how.split(':', 1)[1])
            assert alpha > 0
        except (ValueError, AssertionError):
            raise ValueError(f'--split {how}: dirichlet:A needs a number A > 0') from None
        parts = [[] for _ in range(boards)]
        for c in np.unique(lab):
            idx = perm[lab[perm] == c]
            cuts = (np.cumsum(rng.dirichlet([alpha] * boards))[:-1] * len(idx)).astype(int)
            for b, part in enumerate(np.split(idx, cuts)):
                parts[b].extend(part.tolist())
        pos = np.empty(n, int)
        pos[perm] = np.arange(n)                 # each board's samples in shuffled order
        parts = [np.asarray(p, int)[np.argsort(pos[np.asarray(p, int)])] for p in parts]
    else:
        raise ValueError(f'--split {how!r}: expected iid, by-class or dirichlet:A')
    parts = [np.asarray(p, int) for p in parts]
    empty = [b for b, p in enumerate(parts) if not len(p)]
    if empty:
        raise ValueError(f'--split {how}: board(s) {empty} would get no samples')
    return parts


def write_shard(src, idx, dst):
    """The records idx of dataset src as a dataset file dst (same dtype and scaling)."""
    data, head, rec, n, _ = _ds_header(src)
    h = bytearray(data[:head])
    struct.pack_into('<I', h, 8, len(idx))
    body = np.frombuffer(data, np.uint8, n * rec, head).reshape(n, rec)[np.asarray(idx, int)]
    atomic_write(dst, bytes(h) + body.tobytes())


# ---------------------------------------------------------------- boards

class PortBoard:
    """A board on a serial port (or a simulated one behind a pty), driven with mpremote."""
    kind = 'port'

    def __init__(self, name, port, resume=False):
        self.name, self.port, self.resume = name, port, resume

    def _mp(self, *args, cwd=None, timeout=60):
        return bd.mpremote(self.port, *args, resume=self.resume, cwd=cwd, timeout=timeout)

    def ready(self):
        pass

    def deploy(self, staging):
        bd.deploy(staging, self.port, resume=self.resume)

    def has(self, name):
        out = self._mp('exec', "import os\ntry:\n os.stat(%r);print('HAS 1')\nexcept OSError:\n"
                       " print('HAS 0')" % name)
        return 'HAS 1' in out

    def read_text(self, name):
        """A small text file of the board (its train.json), or None."""
        if not self.has(name):
            return None
        return self._mp('exec', 'print(open(%r).read())' % name)

    def put(self, staging, names, remove=()):
        rm = ''.join("try: os.remove(%r)\nexcept OSError: pass\n" % n for n in remove)
        self._mp('exec', 'import os\n' + rm, '+', 'cp', *names, ':./', cwd=staging)

    def exchange(self, staging, put, remove, get, timeout):
        """One round on the board in one mpremote session: remove the old results, copy
        put from staging, run train.py, copy get back into staging; returns its output."""
        rm = ''.join("try: os.remove(%r)\nexcept OSError: pass\n" % n for n in remove)
        args = ['exec', 'import os\n' + rm, '+', 'cp', *put, ':./', '+',
                'run', os.path.join(runner.MICRO, 'train.py')]
        for n in get:
            args += ['+', 'cp', ':' + n, n]
        return self._mp(*args, cwd=staging, timeout=timeout)

    def close(self):
        pass


class SimBoard(PortBoard):
    """unix MicroPython with its flash folder, on a pseudo-terminal (simboard.FakeBoard);
    a board that died (killed, or exited on a soft reset) is powered on again."""
    kind = 'sim'

    def __init__(self, name, flash, heap):
        os.makedirs(flash, exist_ok=True)
        self.flash, self.heap, self.fake = flash, heap, None
        super().__init__(name, None, resume=True)
        self.ready()

    def ready(self):
        from .simboard import FakeBoard
        if self.fake is None or not self.fake.alive():
            if self.fake is not None:
                self.fake.close()
            self.fake = FakeBoard(runner.micropython_binary(), self.flash, heap=self.heap,
                                  hang_up=True)
            self.port = self.fake.port

    def close(self):
        if self.fake is not None:
            self.fake.close()


class PyBoard:
    """The host simulation: the same micro/ code under CPython + numpy in a folder."""
    kind = 'python'

    def __init__(self, name, flash):
        os.makedirs(flash, exist_ok=True)
        self.name, self.flash = name, flash

    def ready(self):
        pass

    def deploy(self, staging):
        files = json.load(open(os.path.join(staging, 'train.json')))['files']
        for n in ['train.json'] + bd.board_inputs(staging, files):
            shutil.copy(os.path.join(staging, n), self.flash)

    def has(self, name):
        return os.path.exists(os.path.join(self.flash, name))

    def read_text(self, name):
        p = os.path.join(self.flash, name)
        return open(p).read() if os.path.exists(p) else None

    def put(self, staging, names, remove=()):
        for n in remove:
            if os.path.exists(os.path.join(self.flash, n)):
                os.remove(os.path.join(self.flash, n))
        for n in names:
            shutil.copy(os.path.join(staging, n), self.flash)

    def exchange(self, staging, put, remove, get, timeout):
        self.put(staging, put, remove)
        out = self._train(timeout)
        for n in get:
            shutil.copy(os.path.join(self.flash, n), staging)
        return out

    def _train(self, timeout):
        argv, env = runner.command(self.flash, python=True)
        try:
            p = subprocess.run(argv, cwd=self.flash, env=env, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise bd.BoardError(f'{self.name}: no answer in {timeout:g} s') from None
        if p.returncode:
            raise bd.BoardError(f'{self.name}: train.py failed: {(p.stdout + p.stderr)[-300:]}')
        return p.stdout

    def close(self):
        pass


# ---------------------------------------------------------------- one board's ClientApp

class BoardClient:
    """What one board's ClientApp does with a train message."""

    def __init__(self, model, board, staging, timeout, on_train=None):
        self.model, self.board, self.staging = model, board, staging
        self.timeout, self.on_train = timeout, on_train
        self.lock = threading.Lock()
        os.makedirs(staging, exist_ok=True)

    def setup(self, shard=None):
        """Copy the code, model, weights and settings onto the board; a simulated board
        also gets its shard (as if it had collected it); a real board keeps its own data
        file (files.train in its train.json, else train.ds)."""
        cfg = json.loads(json.dumps(self.model.cfg))
        files = cfg['files']
        files.update(test=None, rewritten=None)
        for k in ('model', 'weights'):
            shutil.copy(os.path.join(self.model.dir, files[k]), self.staging)
        cfg['run'].update(resume=False, keep_best=False)
        if shard is not None:
            files['train'] = 'train.ds'
            write_shard(os.path.join(self.model.dir, self.model.cfg['files']['train']), shard,
                        os.path.join(self.staging, 'train.ds'))
        else:
            own = self.board.read_text('train.json')
            try:
                files['train'] = (json.loads(own)['files'].get('train') if own else None) or 'train.ds'
            except (ValueError, KeyError, TypeError):
                raise FleetError(f'{self.board.name}: its train.json is not readable JSON') from None
        data = files['train']
        if shard is not None:
            # deploy copies the code, model, weights, settings and the board's shard
            self._write_cfg(cfg)
            self.board.deploy(self.staging)
            os.remove(os.path.join(self.staging, 'train.ds'))   # the host keeps no copy
        else:
            # a real board: the code, model and weights; its samples stay as they are
            files['train'] = None
            self._write_cfg(cfg)
            self.board.deploy(self.staging)
            files['train'] = data
            self._write_cfg(cfg)
            self.board.put(self.staging, ['train.json'])
        if shard is None and not self.board.has(data):
            raise FleetError(f'{self.board.name}: no {data} on the board: collect data there '
                             '(utrain.collect) or copy your data file, then name it under '
                             'files.train in the board\'s train.json')
        self.cfg = cfg

    def _write_cfg(self, cfg):
        atomic_write(os.path.join(self.staging, 'train.json'), json.dumps(cfg, indent=1).encode())

    def train(self, parts, server_round, epochs=None):
        """Global parts in, (the board's trained parts, samples, loss, metric) out."""
        with self.lock:
            files = self.cfg['files']
            self.board.ready()
            self.model.write(os.path.join(self.staging, files['weights']), self.model.merge(parts))
            cfg = dict(self.cfg)
            if epochs:
                cfg['epochs'] = int(epochs)
            self._write_cfg(cfg)
            for n in (files['out'], files['log']):
                if os.path.exists(os.path.join(self.staging, n)):
                    os.remove(os.path.join(self.staging, n))
            if self.on_train:
                self.on_train(self.board, server_round)
            # only the trained weights and the log come back, never samples
            out = self.board.exchange(self.staging, ['train.json', files['weights']],
                                      [files['out'], files['log'], files['checkpoint']],
                                      [files['out'], files['log']], self.timeout)
            n = None
            for line in out.splitlines():
                if line.startswith('utrain: ') and ' train samples' in line:
                    n = int(line.split()[1])
                if line.startswith('utrain: error') or line.startswith('utrain: out of memory') \
                        or line.startswith('utrain: stopped') or line.startswith('utrain: no training'):
                    raise FleetError(f'{self.board.name}: {line.strip()}')
            if not n:
                raise FleetError(f'{self.board.name}: train.py printed no sample count '
                                 f'({out.strip()[-200:]!r})')
            w = self.model.read(os.path.join(self.staging, files['out']))
            with open(os.path.join(self.staging, files['log'])) as f:
                rows = [r for r in csv.reader(f) if r]
            # (each run's rows follow a header of their own: a header last is no epoch's)
            last = rows[-1] if len(rows) > 1 and rows[-1][0] != 'epoch' else None
            loss = float(last[1]) if last and last[1] else float('nan')
            metric = float(last[2]) if last and last[2] else float('nan')
            return self.model.travel(w), n, loss, metric


def client_app(clients):
    """The Flower ClientApp of the fleet: routes a message to its board's client."""
    from flwr.app import ArrayRecord, Array, MetricRecord, RecordDict, Message
    from flwr.clientapp import ClientApp
    app = ClientApp()

    @app.train()
    def train(msg, context):
        c = clients[context.node_id]
        rec = msg.content['arrays']
        parts = {k: rec[k].numpy() for k in rec.keys()}
        conf = msg.content.get('config', {})
        sent, n, loss, metric = c.train(parts, conf.get('server-round', 0),
                                        conf.get('local-epochs'))
        return Message(RecordDict({
            'arrays': ArrayRecord({k: Array(v) for k, v in sent.items()}),
            'metrics': MetricRecord({'num-examples': n, 'train_loss': loss,
                                     'train_metric': metric})}), reply_to=msg)
    return app


class DirectGrid:
    """A Flower Grid in one process: each message runs its node's ClientApp on a thread;
    send_and_receive returns the replies in by the timeout (a failed ClientApp replies
    with an Error message, as the SuperLink would)."""

    def __new__(cls, *a, **k):
        from flwr.serverapp import Grid

        class _Grid(Grid):
            def __init__(self, app, node_ids):
                from flwr.app import Context, RecordDict
                self.app, self.nodes = app, list(node_ids)
                self.contexts = {n: Context(run_id=1, node_id=n, node_config={},
                                            state=RecordDict(), run_config={}) for n in self.nodes}
                self.replies, self.cv = {}, threading.Condition()
                self.failures, self.waiting = {}, {}      # node -> reason; message -> node

            def set_run(self, run):
                self._run = run

            @property
            def run(self):
                return getattr(self, '_run', None)

            def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
                from flwr.app import Message
                return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                               ttl=ttl, group_id=group_id)

            def get_node_ids(self):
                return list(self.nodes)

            def _serve(self, msg):
                from flwr.app import Message, Error
                try:
                    reply = self.app(msg, self.contexts[msg.metadata.dst_node_id])
                except Exception as e:          # the board's failure, reported to the server
                    lines = str(e).strip().splitlines() or ['']
                    reason = f'{type(e).__name__}: {lines[0]}' + (
                        f' ... {lines[-1].strip()}' if len(lines) > 1 else '')
                    self.failures[msg.metadata.dst_node_id] = reason
                    reply = Message(Error(code=1, reason=reason), reply_to=msg)
                with self.cv:
                    if self.waiting.pop(msg.metadata.message_id, None) is not None:
                        self.replies[msg.metadata.message_id] = reply   # else too late
                    self.cv.notify_all()

            def push_messages(self, messages):
                ids = []
                for msg in messages:
                    msg.metadata.__dict__['_message_id'] = str(uuid.uuid4())
                    ids.append(msg.metadata.message_id)
                    with self.cv:
                        self.waiting[msg.metadata.message_id] = msg.metadata.dst_node_id
                    threading.Thread(target=self._serve, args=(msg,), daemon=True).start()
                return ids

            def pull_messages(self, message_ids):
                with self.cv:
                    return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

            def send_and_receive(self, messages, *, timeout=None):
                want = set(self.push_messages(messages))
                end = None if timeout is None else time.time() + timeout
                got = []
                with self.cv:
                    while want:
                        for i in [i for i in want if i in self.replies]:
                            got.append(self.replies.pop(i))
                            want.discard(i)
                        if not want:
                            break
                        left = None if end is None else end - time.time()
                        if left is not None and left <= 0:
                            break
                        self.cv.wait(left)
                    for i in want:               # late: dropped when it comes
                        node = self.waiting.pop(i, None)
                        if node is not None:
                            self.failures.setdefault(node, f'no answer in {timeout:g} s')
                return got

        return _Grid(*a, **k)


# ---------------------------------------------------------------- the ServerApp

def make_strategy(name):
    import logging
    from flwr.serverapp import strategy as st
    logging.getLogger('flwr').setLevel(logging.ERROR)   # the fleet prints its own lines
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1,
                  min_available_nodes=1)
    classes = {'fedavg': st.FedAvg, 'fedavgm': st.FedAvgM, 'fedadam': st.FedAdam,
               'fedyogi': st.FedYogi, 'fedadagrad': st.FedAdagrad, 'fedmedian': st.FedMedian,
               'fedtrimmedavg': st.FedTrimmedAvg}
    if name not in classes:
        raise ValueError(f'--strategy {name!r}: expected one of {", ".join(classes)}')
    return classes[name](**common)


def evaluate(model, weights_path, test_path):
    """(loss, metric) of weights on the host's test split, with utrain's own code under
    CPython (the board's forward pass)."""
    Trainer = module('trainer').Trainer
    Dataset = module('data').Dataset
    tr = Trainer(model.model, weights_path)
    ds = Dataset(test_path)
    try:
        return tr.evaluate(ds)
    finally:
        ds.close()


class Fleet:
    """A fleet run in folder out for the prepared folder d."""

    def __init__(self, d, out=None, strategy='fedavg', epochs=None, timeout=600.0, test=None):
        self.model = Trainable(d)
        self.dir = d
        self.out = out or os.path.join(d, 'fleet')
        os.makedirs(self.out, exist_ok=True)
        self.strategy, self.epochs, self.timeout = strategy, epochs, timeout
        self.state_path = os.path.join(self.out, 'fleet.json')
        self.wof = os.path.join(self.out, 'global.wof')
        self.csv = os.path.join(self.out, 'fleet.csv')
        self.clients = {}
        if test is None:
            test = self.model.cfg['files'].get('test')
            test = os.path.join(d, test) if test else None
        if test and not os.path.exists(test):
            raise FleetError(f'{test}: no such test file')
        self.test = test
        self.metric = self.model.cfg.get('metric', 'accuracy')   # history keys, CSV, console

    def load_state(self, settings):
        if not os.path.exists(self.state_path):
            return {'settings': settings, 'history': []}
        try:
            with open(self.state_path) as f:
                st = json.load(f)
            old = st['settings']
            st['history']
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise FleetError(f'{self.state_path}: not a fleet state file ({e}); move it away '
                             'to start a new fleet') from None
        diff = [k for k in settings if old.get(k) != settings[k]]
        if diff:
            raise FleetError(f'{self.state_path}: this fleet ran with ' + ', '.join(
                f'{k}={old.get(k)!r}' for k in diff) + ', not ' + ', '.join(
                f'{k}={settings[k]!r}' for k in diff) + '; use another --out to start a new one')
        return st

    def save(self, st, parts):
        """The round's global weights (atomic), then its state and CSV log."""
        self.model.write(self.wof, self.model.merge(parts))
        atomic_write(self.state_path, json.dumps(st, indent=1).encode())
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator='\n')
        head = log_head(self.metric)
        w.writerow(head)
        for h in st['history']:
            w.writerow([h['round']] + ['' if h.get(k) is None else '%.6f' % h[k] for k in head[1:5]]
                       + [len(h['answered']), h['samples']])
        atomic_write(self.csv, buf.getvalue().encode())

    def run(self, boards, rounds, shards=None, settings=None, on_train=None, say=print):
        """Set the boards up, then train rounds up to `rounds` (resuming after the last
        saved round).  boards: board objects; shards: sample indices per board for
        simulated boards (None: each board has its own data)."""
        from flwr.app import ArrayRecord, Array, ConfigRecord
        from flwr.serverapp import ServerApp
        from flwr.supercore.task_identity import TaskIdentity
        from flwr.common.constant import SUPERLINK_NODE_ID
        settings = dict(settings or {}, boards=len(boards), strategy=self.strategy)
        st = self.load_state(settings)
        done = len(st['history']) - 1 if st['history'] else -1
        if done >= 0:
            if not os.path.exists(self.wof):
                raise FleetError(f'{self.wof}: missing, though {self.state_path} has round {done}')
            start = self.model.travel(self.model.read(self.wof))
            say(f'resuming the fleet in {self.out} after round {done}')
        else:
            start = self.model.travel(self.model.base)
        if done >= rounds:
            say(f'{self.out}: {done} rounds done already (--rounds {rounds})')
            return st
        errors = {}

        def setup(i, b):
            try:
                self.clients[i + 1].setup(None if shards is None else shards[i])
            except Exception as e:      # noqa: BLE001 (reported with the board's name)
                errors[b.name] = f'{type(e).__name__}: {e}'
        threads = []
        for i, b in enumerate(boards):     # boards are set up side by side
            self.clients[i + 1] = BoardClient(self.model, b, os.path.join(self.out, 'host', b.name),
                                              self.timeout, on_train)
            say(f'setting up {b.name} ({b.kind})' + (f': {len(shards[i])} samples' if shards else ''))
            threads.append(threading.Thread(target=setup, args=(i, b)))
            threads[-1].start()
        for t in threads:
            t.join()
        if errors:
            raise FleetError('setting up the boards failed: ' + '; '.join(
                f'{k}: {v}' for k, v in sorted(errors.items())))
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
        grid = DirectGrid(client_app(self.clients), self.clients)
        server = ServerApp()
        fleet = self

        @server.main()
        def main(grid, context):
            strategy = make_strategy(fleet.strategy)
            arrays = ArrayRecord({k: Array(v) for k, v in start.items()})
            if done < 0:
                fleet.record(st, 0, arrays, [], 0, None, None, 0.0, say)
            for rnd in range(max(done, 0) + 1, rounds + 1):
                t0 = time.time()
                conf = ConfigRecord({'local-epochs': int(fleet.epochs or 0)})
                msgs = strategy.configure_train(rnd, arrays, conf, grid)
                grid.failures.clear()
                replies = list(grid.send_and_receive(msgs, timeout=fleet.timeout))
                ok = [m for m in replies if not m.has_error()]
                new, metrics = strategy.aggregate_train(rnd, replies)
                if new is not None:
                    arrays = new
                answered = sorted(fleet.clients[m.metadata.src_node_id].board.name for m in ok)
                samples = sum(int(m.content['metrics']['num-examples']) for m in ok)
                loss = metrics['train_loss'] if metrics is not None else None
                acc = metrics['train_metric'] if metrics is not None else None
                fails = {fleet.clients[n].board.name: r for n, r in grid.failures.items()
                         if n in fleet.clients}
                for name in sorted(set(b.board.name for b in fleet.clients.values())
                                   - set(answered) - set(fails)):
                    fails[name] = 'no answer in time'
                fleet.record(st, rnd, arrays, answered, samples, loss, acc, time.time() - t0,
                             say, fails)

        from flwr.app import Context, RecordDict
        server(grid, Context(run_id=1, node_id=SUPERLINK_NODE_ID, node_config={},
                             state=RecordDict(), run_config={}))
        return st

    def record(self, st, rnd, arrays, answered, samples, loss, acc, secs, say, fails=None):
        parts = {k: arrays[k].numpy() for k in arrays.keys()}
        tl = ta = None
        if self.test:
            tmp = os.path.join(self.out, 'eval.wof')
            self.model.write(tmp, self.model.merge(parts))
            tl, ta = (float(v) for v in evaluate(self.model, tmp, self.test))
            os.remove(tmp)
        m = self.metric
        h = dict(round=rnd, answered=answered, samples=samples, loss=loss, test_loss=tl,
                 seconds=round(secs, 2), failed=fails or {}, **{m: acc, 'test_' + m: ta})
        st['history'].append(h)
        self.save(st, parts)
        if rnd == 0:
            say(f'round 0 (starting weights): test_loss {tl:.4f} test_{m} {ta:.4f}'
                if self.test else 'round 0: starting weights')
        else:
            say(f'round {rnd}: {len(answered)} boards answered ({samples} samples), local loss '
                + (f'{loss:.4f}' if loss is not None else '-')
                + (f', global test_loss {tl:.4f} test_{m} {ta:.4f}' if self.test else '')
                + f'  {secs:.1f} s; saved {self.wof}')
            for name, why in sorted((fails or {}).items()):
                say(f'  {name} left out of round {rnd}: {why}')


def check_settings(rounds, epochs, timeout, strategy, test, split_how='iid', seed=0):
    """The fleet's settings, before any board is set up (each refusal had come after the
    boards were deployed, or not at all: --rounds 0 ran none and said 'no board answered
    in any round', --rounds -1 raised IndexError, --timeout 0 left every board out)."""
    import math
    if rounds is None or rounds < 1:
        raise FleetError(f'--rounds {rounds}: the rounds in all, 1 or more (a rerun resumes '
                         'after the last saved round: give more than it has run)')
    if epochs is not None and epochs < 1:
        raise FleetError(f'--epochs {epochs}: local epochs per round, 1 or more (leave it out '
                         'for train.json\'s)')
    if not (timeout > 0 and math.isfinite(timeout)):
        raise FleetError(f'--timeout {timeout:g}: the seconds a board has per round, more than '
                         '0 (600 unless given)')
    if strategy not in STRATEGIES:
        raise FleetError(f'--strategy {strategy!r}: expected one of {", ".join(STRATEGIES)}')
    if split_how.startswith('dirichlet:'):
        try:
            alpha = float(split_how.split(':', 1)[1])
        except ValueError:
            alpha = -1.0
        if not (alpha > 0 and math.isfinite(alpha)):
            raise FleetError(f'--split {split_how}: dirichlet:A needs a number A > 0 (small A: '
                             'boards of few classes; large A: near iid)')
    if seed is not None and seed < 0:       # (numpy's 'expected non-negative integer')
        raise FleetError(f'--seed {seed}: the seed of the split, a whole number 0 or more')
    if test and os.path.isdir(test):        # (had been 'cannot open (no such file?)')
        raise FleetError(f'{test}: is a folder; --test takes a .ds file in it (as prepare '
                         'writes test.ds)')
    if test and os.path.isfile(test):
        from ..formats.kinds import kind_of
        from ..files.dataset import MAGIC
        with open(test, 'rb') as f:
            head = f.read(4096)
        if head[:len(MAGIC)] != MAGIC:
            kind = kind_of(head)
            raise FleetError(f'{test}: not a utrain dataset (.ds)' + (
                f': it reads as {kind}' if kind else '') + '; --test takes a .ds file, as '
                'prepare writes test.ds (`python -m host_tools dataset FILE -o DIR` converts an '
                '.npz or .csv to one)')


def fleet(d, boards=None, rounds=3, split_how='iid', seed=0, ports=None, python=False,
          board='rp2040', out=None, strategy='fedavg', epochs=None, timeout=600.0,
          on_train=None, say=print, resume=False, test=None):
    """The `fleet` command: returns the fleet state (settings and per-round history).
    test: the host's test .ds for the global model (default: the folder's test split)."""
    check_settings(rounds, epochs, timeout, strategy, test, split_how, seed)
    if not os.path.isfile(os.path.join(d, 'train.json')):
        # (as `run` says it; had been '.../train.json: no such file or folder; check the
        # path', a fleet/ folder made in it first)
        raise FleetError(f'{d}: no train.json here; run `prepare` first (fleet takes the '
                         'folder it wrote)')
    f = Fleet(d, out, strategy, epochs, timeout, test)
    settings = dict(split=split_how, seed=seed, epochs=epochs)
    made = []
    try:
        if ports:
            made = [PortBoard(f'board{i}', p, resume) for i, p in enumerate(ports)]
            shards = None
            settings['ports'] = list(ports)
        else:
            train = f.model.cfg['files'].get('train')
            if not train or not os.path.exists(os.path.join(d, train)):
                raise FleetError(f'{d}: no training data to share out (prepare --data)')
            _, _, _, _, y = _ds_header(os.path.join(d, train))
            shards = split(y, boards, split_how, seed)
            settings['sim'] = 'python' if python else board
            heap, note = (None, None) if python else runner.sim_heap(d, board)
            if note:
                say(note)
            heap = heap and str(heap)
            for i in range(boards):
                flash = os.path.join(f.out, 'flash', f'board{i}')
                made.append(PyBoard(f'board{i}', flash) if python else
                            SimBoard(f'board{i}', flash, heap))
        return f.run(made, rounds, shards, settings, on_train, say)
    finally:
        for b in made:
            b.close()
