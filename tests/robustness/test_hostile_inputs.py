"""Issue 13: a few hundred hostile inputs, as a careful user or an unlucky board hands
them over, on the board (train.py under unix MicroPython and CPython, all cases of an
interpreter in one process: tests/support/adversary_device.py) and on the host (prepare, export
and dataset through the CLI).  Each case ends as a clean refusal (an error naming the
file or setting), a correct success, a traceback, a hang, a destroyed file or a write
outside its folder; the last four must not happen.  The tally is printed."""
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.target import runner  # noqa: E402
from host_tools.cli import main as cli  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from test_pipeline import small_mlp, blobs  # noqa: E402

MP = runner.find_micropython()
DRIVER = os.path.join(ROOT, 'tests', 'support', 'adversary_device.py')
INPUTS = ('model.flat', 'weights.wof', 'train.ds', 'test.ds', 'train.py')
KINDS = ('cases', 'clean refusals', 'correct successes', 'tracebacks', 'hangs',
         'destroyed files', 'writes outside the folder', 'wrong outcome')


# --------------------------------------------------------------- the independent spec
ENUMS = {'loss': ('mse', 'mae', 'cce', 'scce', 'bce'), 'reduction': ('mean', 'sum'),
         'optimizer': ('sgd', 'adam', 'rmsprop'), 'metric': ('accuracy', 'mae'),
         'on_nan': ('lower', 'stop'), 'start': ('weights', 'best')}
BOOLS = ('from_logits', 'shuffle', 'stream', 'resume', 'keep_best')
INTS = {'batch': (1, 65535), 'epochs': (0, 65535), 'seed': (0, 2**32 - 1), 'progress': (0, 2**32 - 1),
        'checkpoint_every': (0, 2**32 - 1), 'max_retries': (0, 1000)}


def valid(k, v):
    """Whether train.json may hold v for k (README: what each setting means)."""
    num = type(v) in (int, float) and v == v and abs(v) != float('inf')
    if k in ENUMS:
        return v in ENUMS[k]
    if k in BOOLS:
        return type(v) is bool
    if k in INTS:
        return type(v) is int and INTS[k][0] <= v <= INTS[k][1]
    if k == 'lr':
        return num and v > 0
    if k in ('momentum', 'beta1', 'beta2', 'rho'):
        return num and 0 <= v < 1
    if k == 'eps':
        return num and 0 < v <= 1
    if k == 'lr_factor':
        return num and 0 < v <= 1
    if k == 'gc_every':     # bytes between collections, 0: only when the heap is full;
        return type(v) is int and 0 <= v < 2**32    # below 1024 a share, as folders held it
    if k == 'steps':        # the kernels' step modules (utrain module names), loaded with the code
        return type(v) is list and all(type(m) is str and '.' not in m for m in v)
    raise KeyError(k)


BAD = [None, '0.01', '3', [1], {}, True, False, -1, 0, 1, 1.5, 0.5, 2, 70000, 'no', 'adam', 2**40]
SETTINGS = ('loss', 'reduction', 'from_logits', 'optimizer', 'metric', 'shuffle', 'batch', 'epochs',
            'seed', 'lr', 'momentum', 'beta1', 'beta2', 'eps', 'rho')
RUN = ('resume', 'progress', 'checkpoint_every', 'keep_best', 'on_nan', 'lr_factor', 'max_retries',
       'start', 'gc_every', 'steps')


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp('adv')
    out = d / 'base'
    prepare(small_mlp(str(d / 'm.circle')), str(out), data=blobs(d, n=32), test_split=0.25,
            loss='scce', optimizer='sgd', lr=0.05, batch=2, epochs=1)
    runner.stage(str(out))
    os.remove(out / 'prepare.json')
    return out


def device_cases():
    """[(name, edit(cfg) or raw text, setup(folder) or None, expected)] with expected
    'ok' (trains), 'refuse' or 'resume' (goes on from the checkpoint)."""
    cases = []
    for k in SETTINGS:
        for i, v in enumerate(BAD):
            # (an lr valid but far too large trains, or diverges and stops saying to lower
            # it: a sure model's softmax no longer stops its gradient, test_saturated_head)
            want = 'refuse' if not valid(k, v) else 'ok or stop' if k == 'lr' and v > 1 else 'ok'
            cases.append(('set-%s-%d' % (k, i), {k: v}, None, want))
    for k in RUN:
        for i, v in enumerate(BAD):
            if k == 'resume' and v is True:
                continue
            cases.append(('run-%s-%d' % (k, i), {'run': {k: v}}, None, 'ok' if valid(k, v) else 'refuse'))
    cases += [('unknown-setting', {'learning_rate': 0.1}, None, 'refuse'),
              ('unknown-run', {'run': {'keep-best': True}}, None, 'refuse'),
              ('run-list', {'run': [1]}, None, 'refuse'),
              ('files-list', {'files': ['model.flat']}, None, 'refuse'),
              ('files-missing', {'files': None}, None, 'refuse'),
              ('top-list', '[1, 2]', None, 'refuse'), ('top-string', '"x"', None, 'refuse'),
              ('top-null', 'null', None, 'refuse'), ('top-number', '3', None, 'refuse'),
              ('bad-json', '{"lr": 0.1,', None, 'refuse'), ('empty-json', '', None, 'refuse'),
              ('nan-json', None, lambda d: _text(d, 'train.json', _cfg_text(d).replace('0.05', 'NaN')),
               'refuse')]
    # issue 28: nesting deep enough for the parser's recursion (CPython) or the printing
    # of the value refused (MicroPython): RuntimeError / RecursionError tracebacks before
    for depth in (50, 3000, 200000):
        cases.append(('deep-json-%d' % depth, None, lambda d, n=depth: _text(
            d, 'train.json', _cfg_text(d).rstrip()[:-1] + ', "lr": ' + '[' * n + ']' * n + '}'),
            'refuse'))
    names = ['../escape.wof', '/ABS', 'sub/x.wof', '', '.', '..', 'a\\b', 7, [], 'lib', 'nothing.here']
    for key in ('model', 'weights', 'train', 'test', 'out', 'checkpoint', 'log'):
        cases.append(('files-%s-absent' % key, {'files': {key: '__del__'}}, None,
                      'refuse' if key in ('model', 'weights', 'out') else 'notrain' if key == 'train'
                      else 'ok'))
        for i, n in enumerate(names):
            inp = key in ('model', 'weights', 'train', 'test')
            fine = not inp and n in ('lib', 'nothing.here')     # a new output file
            cases.append(('files-%s-%d' % (key, i), {'files': {key: n}}, None,
                          'ok' if fine else 'refuse'))
        if key in ('out', 'checkpoint', 'log'):
            for victim in INPUTS + ('train.json', 'checkpoint.ckpt', 'trained.wof', 'train.log'):
                if victim == {'out': 'trained.wof', 'checkpoint': 'checkpoint.ckpt',
                              'log': 'train.log'}[key]:
                    continue
                cases.append(('onto-%s-%s' % (key, victim), {'files': {key: victim}}, None, 'refuse'))
    for key in ('train', 'test'):
        cases.append(('files-%s-null' % key, {'files': {key: None}}, None,
                      'notrain' if key == 'train' else 'ok'))
    cases += [
        ('ds-huge-zero', None, lambda d: _ds_header(d, 'train.ds', 10**9, 0, 0), 'refuse'),
        ('ds-huge', None, lambda d: _ds_header(d, 'train.ds', 4 * 10**9, 6, 1), 'refuse'),
        ('ds-cut', None, lambda d: _cut(d, 'train.ds', 100), 'refuse'),
        ('ds-test-garbage', None, lambda d: _text(d, 'test.ds', 'hello'), 'refuse'),
        # issue 28: a .ds of no samples (a header alone) had trained, logging loss 0 and
        # accuracy 0 (a test.ds: keep-best judged the epochs on nothing)
        ('ds-empty', None, lambda d: _ds_empty(d, 'train.ds'), 'refuse'),
        ('ds-test-empty', None, lambda d: _ds_empty(d, 'test.ds'), 'refuse'),
        ('wof-garbage', None, lambda d: _text(d, 'weights.wof', 'x' * 50), 'refuse'),
        ('flat-cut', None, lambda d: _cut(d, 'model.flat', 60), 'refuse'),
        ('json-folder', None, lambda d: (os.remove(d / 'train.json'), os.mkdir(d / 'train.json')),
         'refuse'),
        ('json-missing', None, lambda d: os.remove(d / 'train.json'), 'refuse'),
        ('out-is-folder', None, lambda d: (os.remove(d / 'trained.wof'), os.mkdir(d / 'trained.wof')),
         'refuse'),
        ('ckpt-is-folder', None, lambda d: os.mkdir(d / 'checkpoint.ckpt'), 'refuse'),
        ('resume-no-ckpt', {'run': {'resume': True}}, None, 'ok'),
        ('resume-tmp-only', {'run': {'resume': True}}, lambda d: _ckpt_tmp(d, None), 'resume'),
        ('resume-tmp-cut', {'run': {'resume': True}}, lambda d: _ckpt_tmp(d, 150), 'refuse'),
        ('resume-ckpt-garbage', {'run': {'resume': True}}, lambda d: _text(d, 'checkpoint.ckpt', 'x' * 99),
         'refuse'),
    ]
    for f in ('trained.wof', 'checkpoint.ckpt', 'train.log', 'trained.wof.best'):
        # trained.wof: the untrained weights, without a record: the run must replace it
        cases.append(('full-%s' % f, None, lambda d, f=f: (
            _case(d, fail_write=f), os.remove(d / 'trained.wof.best'),
            shutil.copy(d / 'weights.wof', d / 'trained.wof')), 'refuse'))
    return cases


def _cfg_text(d):
    return (d / 'train.json').read_text()


def _text(d, name, text):
    (d / name).write_text(text)


def _cut(d, name, n):
    b = (d / name).read_bytes()
    (d / name).write_bytes(b[:n])


def _ds_header(d, name, n, xl, yl):
    b = bytearray((d / name).read_bytes())
    struct.pack_into('<III', b, 8, n, xl, yl)
    (d / name).write_bytes(bytes(b[:48]))


def _ds_empty(d, name):
    b = bytearray((d / name).read_bytes())
    struct.pack_into('<I', b, 8, 0)
    (d / name).write_bytes(bytes(b[:48]))


def _case(d, **spec):
    (d / 'case.json').write_text(json.dumps(spec))


CKPT = {}


def _ckpt_tmp(d, cut):
    # a finished save whose rename did not happen (power lost), or one cut short
    data = CKPT['data'] if cut is None else CKPT['data'][:cut]
    (d / 'checkpoint.ckpt.tmp').write_bytes(data)


def merge(cfg, edit):
    for k, v in edit.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict) and v:
            for kk, vv in v.items():
                if vv == '__del__':
                    cfg[k].pop(kk, None)
                else:
                    cfg[k][kk] = vv
        else:
            cfg[k] = v
    return cfg


def snapshot(top):
    out = {}
    for dp, dn, fn in os.walk(top):
        for f in fn:
            p = os.path.join(dp, f)
            with open(p, 'rb') as h:
                out[p] = h.read()
    return out


def build_cases(base, where):
    """Case folders under where/cases, a good trained.wof (with its record) in each;
    returns the case list and the prior good files."""
    if 'data' not in CKPT:                      # a mid-run checkpoint, made once
        t = where / 'ckptmaker'
        shutil.copytree(base, t, ignore=shutil.ignore_patterns('lib'))
        cfg = json.loads(_cfg_text(t))
        cfg['epochs'] = 1
        (t / 'train.json').write_text(json.dumps(cfg))
        r = subprocess.run([sys.executable, 'train.py'], cwd=t, capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, 'micro')))
        assert r.returncode == 0, r.stdout + r.stderr
        CKPT['data'] = (t / 'checkpoint.ckpt').read_bytes()
        CKPT['trained'] = (t / 'trained.wof').read_bytes()
        CKPT['record'] = (t / 'trained.wof.best').read_bytes()
    cases = device_cases()
    root = where / 'cases'
    root.mkdir()
    for name, edit, setup, _ in cases:
        d = root / name
        shutil.copytree(base, d, ignore=shutil.ignore_patterns('lib'))
        (d / 'trained.wof').write_bytes(CKPT['trained'])
        (d / 'trained.wof.best').write_bytes(CKPT['record'])
        if isinstance(edit, str):
            _text(d, 'train.json', edit)
        elif edit is not None:
            cfg = merge(json.loads(_cfg_text(d)), edit)
            _text(d, 'train.json', json.dumps(cfg))
        if setup:
            setup(d)
    return cases, root


def run_device(argv, env, root, cases):
    try:
        p = subprocess.run(argv + [DRIVER, str(root)] + [c[0] for c in cases], env=env,
                           capture_output=True, text=True, timeout=240)
        return p.stdout + p.stderr, False
    except subprocess.TimeoutExpired as e:
        return (e.stdout or b'').decode() if isinstance(e.stdout, bytes) else (e.stdout or ''), True


def classify_device(text, hung, root, cases, before, outside_before):
    tally = dict.fromkeys(KINDS, 0)
    shown = {}
    blocks = {}
    cur = None
    for line in text.splitlines():
        if line.startswith('@@CASE '):
            cur = line.split()[1]
            blocks[cur] = []
        elif line.startswith('@@END ') and cur:
            blocks[cur].append(line)
            cur = None
        elif cur:
            blocks[cur].append(line)
    bad = []
    for name, edit, setup, want in cases:
        tally['cases'] += 1
        out = blocks.get(name)
        d = root / name
        if out is None or not out[-1].startswith('@@END'):
            if any(l.startswith('@@TRACEBACK') for l in out or []):
                kind = 'tracebacks'
            else:
                kind = 'hangs' if hung else 'tracebacks'
        else:
            code = int(out[-1].split()[2])
            body = '\n'.join(out[:-1])
            if code == 99 or 'Traceback' in body:
                kind = 'tracebacks'
            elif code == 1 and 'utrain: error: ' in body:
                kind = 'clean refusals' if want == 'refuse' else 'wrong outcome'
                shown.setdefault(name.split('-')[0] + '-' + name.split('-')[1], body.strip().splitlines()[-1])
            elif code == 1 and want == 'ok or stop' and 'utrain: end: stopped: loss is nan' in body \
                    and 'lower "lr" in train.json' in body:
                kind = 'correct successes'
            elif code == 0 and want == 'notrain' and 'utrain: no training data in train.json' in body:
                kind = 'correct successes'
            elif code == 0 and ('holds the best weights' in body or 'saved trained.wof' in body):
                kind = 'correct successes' if want in ('ok', 'resume', 'ok or stop') else 'wrong outcome'
                if want == 'resume' and 'resumed from checkpoint.ckpt' not in body:
                    kind = 'wrong outcome'
            else:
                kind = 'wrong outcome'
        for f in INPUTS:
            if f in before[name] and not (d / f).is_file() or \
                    (d / f).is_file() and (d / f).read_bytes() != before[name].get(f):
                if f in before[name]:
                    kind = 'destroyed files'
        if (d / 'trained.wof').is_file():
            # the good weights there before: kept, or replaced by better ones (keep-best)
            if want == 'refuse' and (d / 'trained.wof').read_bytes() != before[name].get('trained.wof') \
                    and '  kept' not in '\n'.join(out or []):
                kind = 'destroyed files'
        elif not (d / 'trained.wof').is_dir():
            kind = 'destroyed files'
        tally[kind] += 1
        if kind not in ('clean refusals', 'correct successes'):
            bad.append((name, kind, want, '\n'.join(out or [])[-600:]))
    after = snapshot(root.parent / 'outside')
    tally['writes outside the folder'] += len(set(after) ^ set(outside_before))
    for p in os.listdir(root):
        if not (root / p).is_dir():
            tally['writes outside the folder'] += 1
            bad.append((p, 'writes outside the folder', '', ''))
    return tally, bad, shown


def table(rows):
    lines = ['| where | ' + ' | '.join(KINDS) + ' |', '|' + '---|' * (len(KINDS) + 1)]
    for name, t in rows:
        lines.append('| %s | ' % name + ' | '.join(str(t[k]) for k in KINDS) + ' |')
    return '\n'.join(lines)


def device_run(base, tmp_path, interp):
    (tmp_path / 'outside').mkdir()
    (tmp_path / 'outside' / 'keep.txt').write_text('precious')
    cases, root = build_cases(base, tmp_path)
    # an absolute name points into outside/: were it followed, the write would show there
    abs_target = str(tmp_path / 'outside' / 'abs.wof')
    for name, edit, _, _ in cases:
        if isinstance(edit, dict) and isinstance(edit.get('files'), dict) and '/ABS' in edit['files'].values():
            cfg = json.loads((root / name / 'train.json').read_text())
            for k, v in cfg['files'].items():
                if v == '/ABS':
                    cfg['files'][k] = abs_target
            (root / name / 'train.json').write_text(json.dumps(cfg))
    before = {c[0]: {f: (root / c[0] / f).read_bytes() for f in INPUTS + ('trained.wof',)
                     if (root / c[0] / f).is_file()} for c in cases}
    outside_before = snapshot(tmp_path / 'outside')
    if interp == 'micropython':
        shutil.copytree(base / 'lib', tmp_path / 'lib')
        argv = [MP, '-X', 'heapsize=' + runner.boards()['unix']['heap']]
        env = dict(os.environ, MICROPYPATH=str(tmp_path / 'lib'))
    else:
        argv = [sys.executable]
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, 'micro'))
    text, hung = run_device(argv, env, root, cases)
    return classify_device(text, hung, root, cases, before, outside_before)


DEV = {}


@pytest.mark.slow
@pytest.mark.skipif(not MP, reason='no MicroPython binary')
def test_board_cases_under_micropython(base, tmp_path):
    tally, bad, shown = device_run(base, tmp_path, 'micropython')
    DEV['unix MicroPython (train.py)'] = tally
    print('\n' + table([('unix MicroPython (train.py)', tally)]))
    for k, v in sorted(shown.items()):
        print('  %-24s %s' % (k, v))
    assert not bad, bad


@pytest.mark.slow
def test_board_cases_under_cpython(base, tmp_path):
    tally, bad, _ = device_run(base, tmp_path, 'cpython')
    DEV['CPython (train.py)'] = tally
    print('\n' + table([('CPython (train.py)', tally)]))
    for b in bad:
        print(b)
    assert not bad, bad


# ------------------------------------------------------------------ host
def graph(path, mutate):
    """small_mlp's graph built with one thing wrong."""
    rng = np.random.default_rng(1)
    b = CircleBuilder()
    spec = {'x': [1, 6], 'w1': [8, 6], 'b1': [8], 'h': [1, 8], 'w2': [3, 8], 'b2': [3], 'z': [1, 3], 'p': [1, 3]}
    data = {'w1': rng.normal(0, .5, (8, 6)), 'b1': np.zeros(8), 'w2': rng.normal(0, .5, (3, 8)), 'b2': np.zeros(3)}
    ops = [('FULLY_CONNECTED', ['x', 'w1', 'b1'], ['h']), ('FULLY_CONNECTED', ['h', 'w2', 'b2'], ['z']),
           ('SOFTMAX', ['z'], ['p'])]
    outs = ['p']
    mutate(spec, data, ops, outs) if mutate.__code__.co_argcount == 4 else mutate(spec, data, ops)
    t = {}
    for n, shape in spec.items():
        a = data.get(n)
        t[n] = b.tensor(n, shape, data=None if a is None else np.asarray(a, np.float32).reshape(
            [max(1, s) for s in shape] if a.size == np.prod([max(1, s) for s in shape]) else a.shape))
    for name, i, o in ops:
        kw = {'beta': 1.0} if name == 'SOFTMAX' else {}
        b.op(name, [t[k] for k in i], [t[k] for k in o], **kw)
    b.inputs(t['x'])
    b.outputs(*[t[k] for k in outs])
    b.save(path)
    return path


def _set(d, k, v):
    d[k] = v


GRAPHS = {
    'w1-shape': lambda s, d, o: (_set(s, 'w1', [8, 5]), _set(d, 'w1', np.ones((8, 5)))),
    'b1-shape': lambda s, d, o: (_set(s, 'b1', [7]), _set(d, 'b1', np.zeros(7))),
    'zero-dim': lambda s, d, o: _set(s, 'h', [1, 0]),
    'negative-dim': lambda s, d, o: _set(s, 'z', [1, -3]),
    'no-inputs': lambda s, d, o: o.__setitem__(2, ('SOFTMAX', [], ['p'])),
    'cycle': lambda s, d, o: o.reverse(),
    'writes-constant': lambda s, d, o: o.__setitem__(2, ('SOFTMAX', ['z'], ['b2'])),
    'two-writers': lambda s, d, o: o.__setitem__(1, ('FULLY_CONNECTED', ['h', 'w2', 'b2'], ['h'])),
    'nan-weights': lambda s, d, o: d['w2'].__setitem__((0, 0), np.nan),
    'inf-weights': lambda s, d, o: d['b1'].__setitem__(0, np.inf),
    'huge-activation': lambda s, d, o: (_set(s, 'x', [1, 2 * 10**9]), _set(s, 'w1', [8, 2 * 10**9]),
                                        d.pop('w1')),
    # issue 28: every pass read g.outputs[0] (an IndexError under --loss scce)
    'no-outputs': lambda s, d, o, outs: outs.clear(),
    'two-outputs': lambda s, d, o, outs: outs.append('z'),
}


def npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def npy_claiming(path, shape):
    """An .npz whose x header claims `shape` (float32) and holds 64 bytes."""
    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {'descr': '<f4', 'fortran_order': False, 'shape': shape})
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:
        z.writestr('x.npy', hdr.getvalue() + b'\0' * 64)
        b = io.BytesIO()
        np.save(b, np.zeros(4, np.int64))
        z.writestr('y.npy', b.getvalue())
    return path


def zip_bomb(path):
    """x: 300 MB of zeros in a few hundred KB (more than MAX_DATA_BYTES is refused
    from the header; this one is below it but its header does not match its y)."""
    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {'descr': '<f4', 'fortran_order': False,
                                               'shape': (2**31, 4)})
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:
        with z.open('x.npy', 'w', force_zip64=True) as f:
            f.write(hdr.getvalue())
            chunk = b'\0' * (1 << 22)
            for _ in range(8):
                f.write(chunk)
        b = io.BytesIO()
        np.save(b, np.zeros(4, np.int64))
        z.writestr('y.npy', b.getvalue())
    return path


def host_cases(tmp):
    model = small_mlp(str(tmp / 'm.circle'))
    good = blobs(tmp, n=24)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 6)).astype(np.float32)
    y = rng.integers(0, 3, 24)
    cases = []                  # (name, argv, expected, files that must survive)
    P = ['prepare', model, '--data', good, '--loss', 'scce']
    for flag, vals in (('--epochs', ['70000', '-1', '0']), ('--seed', ['-1', str(2**40), '5']),
                       ('--lr', ['nan', 'inf', '-0.1', '0', '1e400', '0.01']),
                       ('--batch', ['0', '70000', '2']), ('--momentum', ['1.5', 'nan', '0.9']),
                       ('--beta1', ['1', '-0.5']), ('--beta2', ['2']), ('--eps', ['0', 'nan']),
                       ('--rho', ['1.0']), ('--progress', ['-3', str(2**40)]),
                       ('--split-seed', ['-1']), ('--test-split', ['1.5', 'nan', '-0.2']),
                       # issue 28: inf was an OverflowError, '-5K' a negative heap, and
                       # '1MB' 1 byte (the B dropped, the M with it)
                       ('--budget', ['inf', 'nan', '--budget=-5K', '1MB'])):
        for v in vals:
            ok = (flag, v) in (('--epochs', '0'), ('--seed', '5'), ('--lr', '0.01'), ('--batch', '2'),
                               ('--momentum', '0.9'), ('--budget', '1MB'))
            if v.startswith(flag):
                cases.append(('prepare %s' % v, P + [v], 'refuse', flag))
                continue
            cases.append(('prepare %s %s' % (flag, v), P + [flag, v], 'ok' if ok else 'refuse', flag))
    datas = {
        'truncated.npz': lambda p: open(p, 'wb').write(open(good, 'rb').read()[:200]),
        'garbage.npz': lambda p: open(p, 'wb').write(b'PK\x03\x04' + b'\xff' * 300),
        'empty.npz': lambda p: open(p, 'wb').close(),
        'zero-d.npz': lambda p: npz(p, x=np.float32(1), y=np.int64(1)),
        'strings.npz': lambda p: npz(p, x=np.array(['a'] * 24), y=y),
        'bytes.npz': lambda p: npz(p, x=np.array([b'a'] * 24), y=y),
        'no-y.npz': lambda p: npz(p, x=x),
        'nan-x.npz': lambda p: npz(p, x=np.where(np.arange(144).reshape(24, 6) == 50, np.nan, x), y=y),
        'inf-x.npz': lambda p: npz(p, x=np.where(np.arange(144).reshape(24, 6) == 7, np.inf, x), y=y),
        'bad-labels.npz': lambda p: npz(p, x=x, y=y + 7),
        'float-labels.npz': lambda p: npz(p, x=x, y=y + 0.5),
        'mismatch.npz': lambda p: npz(p, x=x, y=y[:5]),
        'wrong-width.npz': lambda p: npz(p, x=x[:, :5], y=y),
        'claims-1e11.npz': lambda p: npy_claiming(p, (10**11, 6)),
        'claims-small.npz': lambda p: npy_claiming(p, (24, 6)),
        'bomb.npz': zip_bomb,
        'latin1.csv': lambda p: open(p, 'wb').write(b'1,2,3,4,5,6,\xe9\n' * 4),
        'huge-field.csv': lambda p: open(p, 'w').write('1,' + '9' * 300000 + '\n'),
        'words.csv': lambda p: open(p, 'w').write('a,b\n1,2\nx,y\n'),
        'ragged.csv': lambda p: open(p, 'w').write('1,2,3\n1,2\n'),
        'nan.csv': lambda p: open(p, 'w').write('\n'.join(','.join(['nan'] * 6 + ['1'])
                                                          for _ in range(4)) + '\n'),
        'missing.npz': None,
        'folder.npz': lambda p: os.mkdir(p),
    }
    for name, make in datas.items():
        p = str(tmp / name)
        if make:
            make(p)
        cases.append(('data %s' % name, ['prepare', model, '--data', p, '--loss', 'scce'], 'refuse', name))
    # issue 28: each refusal of labels says what is wrong with them and what to do
    labelled = {
        # classes numbered from -1 (no --loss: not class numbers, so mse, which wants 3 values)
        'from-minus-1.npz': (lambda p: npz(p, x=x, y=y - 1), [], 'number the classes from 0'),
        'text-labels.npz': (lambda p: npz(p, x=x, y=np.array(['cat', 'dog', 'cow'])[y]), [],
                            'np.unique(y, return_inverse=True)'),
        'x-only.npy': (lambda p: np.save(p, x), [], 'np.savez(path, x=x, y=y)'),
        'text-labels.csv': (lambda p: open(p, 'w').write('\n'.join(
            ','.join(['0.5'] * 6 + [('walk', 'run')[i % 2]]) for i in range(6)) + '\n'),
            [], "line 2: not a number in column 7 ('run'); labels must be class numbers"),
        # class numbers given to bce (one 0/1 target per output)
        'bce-on-classes.npz': (lambda p: npz(p, x=x, y=y), ['--loss', 'bce'],
                               'train with --loss scce'),
        'split-all.npz': (lambda p: npz(p, x=x, y=y), ['--test-split', '0.99'],
                          'leaves none to train on'),
    }
    for name, (make, more, mark) in labelled.items():
        p = str(tmp / name)
        make(p)
        cases.append(('data %s' % name, ['prepare', model, '--data', p] + more, 'refuse', mark))
    cases.append(('prepare --int8 --float32', P + ['--int8', '--float32'], 'refuse', 'not allowed'))
    # `dataset` runs prepare's samples pass: the same refusals
    cases.append(('dataset nan-x.npz', ['dataset', str(tmp / 'nan-x.npz'), '-o', str(tmp / 'nan-ds')],
                  'refuse', 'NaN'))
    imgs = tmp / 'imgs'
    from PIL import Image
    for c in ('a', 'b'):
        (imgs / c).mkdir(parents=True)
        Image.new('L', (8, 8)).save(imgs / c / '0.png')
    Image.new('L', (5000, 5000)).save(imgs / 'a' / 'bomb.png')
    (imgs / 'b' / 'junk.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 40)
    cases.append(('data image bomb', ['dataset', str(imgs), '-o', str(tmp / 'imgds')], 'refuse', 'bomb.png'))
    for name, mut in GRAPHS.items():
        p = graph(str(tmp / ('g-%s.circle' % name)), mut)
        if name == 'two-outputs':       # issue 28: its first output trains, --output names one
            cases.append(('graph two-outputs', ['prepare', p, '--loss', 'scce'], 'ok', None))
            cases.append(('graph two-outputs --output q', ['prepare', p, '--loss', 'scce',
                                                           '--output', 'q'], 'refuse',
                          "--output 'q': the model's outputs are 0 'p' [1, 3], 1 'z' [1, 3]"))
            continue
        cases.append(('graph %s' % name, ['prepare', p, '--loss', 'scce'], 'refuse', 'op '
                      if name not in ('zero-dim', 'negative-dim', 'nan-weights', 'inf-weights',
                                      'huge-activation', 'w1-shape', 'b1-shape', 'no-outputs')
                      else 'tensor' if 'outputs' not in name else 'at least one of each'))
    # issue 28: an OSError names its file and says what to do (not "[Errno 21] ...")
    cases.append(('prepare --train-config a folder', P + ['--train-config', str(tmp)], 'refuse',
                  'is a folder; give the path of a file'))
    cases.append(('prepare --train-config missing', P + ['--train-config', str(tmp / 'no.tcfg')],
                  'refuse', 'no.tcfg: no such file or folder; check the path'))
    log = tmp / 'train.log'
    log.write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'
                   '1,1.0,0.5,nan,nan,10,-1\n2,0.8,0.6,nan,nan,10,-1\n')
    cases.append(('plot to .log', ['plot', str(log), '-o', str(tmp / 'curves.log')], 'refuse',
                  'name the output .png'))
    cases.append(('plot a folder', ['plot', str(tmp), '-o', str(tmp / 'c.png')], 'refuse',
                  'is a folder'))
    cases.append(('plot ok', ['plot', str(log), '-o', str(tmp / 'c.png')], 'ok', None))
    (tmp / 'binary.log').write_bytes(bytes(range(256)) * 4)
    cases.append(('plot a binary file', ['plot', str(tmp / 'binary.log'), '-o', str(tmp / 'b.png')],
                  'refuse', 'binary.log: not a utrain train.log'))
    # one op given two ranks (which would train?), and a negative band height
    cases.append(('prepare an op ranked twice', P + ['--ranks', '0:up,0:low'], 'refuse', 'given twice'))
    cases.append(('prepare --bands -1', P + ['--bands', '-1'], 'refuse', '--bands -1'))
    # export: a prepared folder, then -o onto each input and a rewritten path outside
    run = tmp / 'run'
    prepare(model, str(run), data=good, loss='scce', epochs=1)
    shutil.copy(run / 'weights.wof', run / 'trained.wof')
    for victim in (model, str(run / 'trained.wof'), str(run / 'prepare.json'), str(run / 'model.flat')):
        cases.append(('export -o %s' % os.path.basename(victim),
                      ['export', model, str(run / 'trained.wof'), '-o', victim], 'refuse', '-o'))
    for i, rwn in enumerate(['../evil.circle', str(tmp / 'outside' / 'evil.circle'), 7]):
        r2 = tmp / ('run-rw%d' % i)
        shutil.copytree(run, r2)
        s = json.loads((r2 / 'prepare.json').read_text())
        s['rewritten'] = rwn
        (r2 / 'prepare.json').write_text(json.dumps(s))
        cases.append(('export rewritten %r' % (rwn,), ['export', model, str(r2 / 'trained.wof'), '-o',
                                                      str(r2 / 'out.circle')], 'refuse', 'rewritten'))
    cases.append(('export ok', ['export', model, str(run / 'trained.wof'), '-o', str(tmp / 'ok.circle')],
                  'ok', None))
    # issue 28: --limit -1 scored all but the last sample, --size abc was int()'s message
    cases.append(('export a folder as weights', ['export', model, str(run), '-o', str(tmp / 'w.circle')],
                  'refuse', 'give the weights file in it'))
    # (a train.log or .ds given as weights: 'not a .wof file (magic 28773, want 429)',
    # or for a float model trained as int8 'not a checkpoint')
    for f in ('train.ds', 'model.flat'):
        cases.append(('export %s as weights' % f, ['export', model, str(run / f), '-o',
                                                   str(tmp / 'w.circle')],
                      'refuse', 'not trained weights (a .wof or .ckpt as `run` and `pull` write '
                      "them): give the run folder's trained.wof"))
    cases.append(('evaluate --metric mae on labels', ['evaluate', model, good, '--metric', 'mae'],
                  'refuse', 'class labels score with --metric accuracy'))
    cases.append(('evaluate --limit -1', ['evaluate', model, good, '--limit', '-1'], 'refuse', '--limit'))
    cases.append(('dataset --size abc', ['dataset', good, '-o', str(tmp / 'dsz'), '--size', 'abc'],
                  'refuse', "--size 'abc': expected WxH"))
    cases.append(('run --emulate --heap inf', ['run', str(run), '--emulate', '--heap', 'inf'], 'refuse',
                  '--heap'))
    # issue 28: a circle model written as .onnx (a flatbuffer by that name), -o in a folder
    # that is not there (the refusal named export's temp file)
    cases.append(('export circle to .onnx', ['export', model, str(run / 'trained.wof'), '-o',
                                             str(tmp / 'x.onnx')], 'refuse', 'written from an .onnx model'))
    cases.append(('export into no folder', ['export', model, str(run / 'trained.wof'), '-o',
                                            str(tmp / 'nofolder' / 'x.circle')], 'refuse',
                  'nofolder: no such file or folder'))
    cases.append(('prepare onto its data', ['prepare', model, '-o', str(run), '--data',
                                            str(run / 'train.ds'), '--loss', 'scce'], 'refuse', 'train.ds'))
    # a loss on probabilities over a model that outputs logits (no SOFTMAX): prepare
    # trains from logits (read as probabilities, the gradient -1/y is 1e20 at the first
    # logit <= 0 and training goes to NaN at any lr)
    tico = os.path.join(ROOT, 'datasets', 'digits', 'digits_tico_cnn.circle')
    cases.append(('prepare scce on logits', ['prepare', tico, '--loss', 'scce', '--optimizer',
                                             'adam', '--lr', '1e-4'], 'ok', None))
    cases.append(('prepare scce from logits', ['prepare', tico, '--loss', 'scce', '--from-logits',
                                               '--optimizer', 'adam', '--lr', '1e-4'], 'ok', None))
    # the int8 path checks its outputs against its inputs as the float path does
    q8 = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mlp_int8.tflite')
    q8run = tmp / 'q8run'
    prepare(q8, str(q8run), data=os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mlp_data.npz'),
            loss='scce', optimizer='sgd')
    # an int8 run's weights given to the float model: the folder's model is named
    cases.append(('export int8 weights into a float model', ['export', model, str(q8run / 'weights.wof'),
                                                              '-o', str(tmp / 'f.circle')], 'refuse',
                  'prepared from %s, not %s' % (q8, model)))
    # issue 28: a plan nothing shrinks enough names the boards that hold it
    cases.append(('prepare --budget 10K', P + ['--budget', '10K'], 'refuse',
                  'a board with more heap holds it: --board esp32'))
    cases.append(('prepare int8 --budget 10K', ['prepare', q8, '--data', os.path.join(
        ROOT, 'bench', 'zoo', 'keras', 'mlp_data.npz'), '--loss', 'scce', '--budget', '10K'],
        'refuse', 'a board with more heap holds it: --board esp32'))
    cases.append(('prepare int8 onto its data', ['prepare', q8, '-o', str(q8run), '--data',
                                                 str(q8run / 'train.ds'), '--test-split', '0.5',
                                                 '--loss', 'scce', '--optimizer', 'sgd'],
                  'refuse', 'train.ds'))
    # issue 28: weights cut short, moved out of their folder, an int8 run's checkpoint:
    # each refusal says what to do ('holds 0 buffers, the model has 44 tensors' had been
    # an int8 checkpoint's, a moved .wof's the buffers against the file's tensors)
    (tmp / 'empty.ds').write_bytes((run / 'train.ds').read_bytes()[:8] + b'\0' * 4
                                   + (run / 'train.ds').read_bytes()[12:48])
    cases.append(('data empty.ds', ['prepare', model, '--data', str(tmp / 'empty.ds'), '--loss',
                                    'scce'], 'refuse', 'empty.ds: holds no samples'))
    cut = tmp / 'run-cut'
    shutil.copytree(run, cut)
    (cut / 'trained.wof').write_bytes((run / 'trained.wof').read_bytes()[:40])
    cases.append(('export a cut .wof', ['export', model, str(cut / 'trained.wof'), '-o',
                                        str(tmp / 'c.circle')], 'refuse',
                  "cut short or damaged (40 bytes): copy it again (`pull` from a board), or export "
                  "the run folder's checkpoint.ckpt"))
    q8cut = tmp / 'q8cut'
    shutil.copytree(q8run, q8cut)
    (q8cut / 'weights.wof').write_bytes((q8run / 'weights.wof').read_bytes()[:60])
    shutil.copy(q8run / 'weights.wof', q8cut / 'checkpoint.ckpt')
    cases.append(('export a cut int8 .wof', ['export', q8, str(q8cut / 'weights.wof'), '-o',
                                             str(tmp / 'c8.tflite')], 'refuse',
                  'cut short or damaged (60 bytes): copy it again (`pull` from a board), or run '
                  'the folder again with "resume": true'))
    cases.append(('export an int8 checkpoint', ['export', q8, str(q8cut / 'checkpoint.ckpt'), '-o',
                                                str(tmp / 'k8.tflite')], 'refuse',
                  "an int8 run's checkpoint (its weights at scales kept in its own blocks), which "
                  "export does not read: export the folder's trained.wof"))
    (tmp / 'moved').mkdir()
    shutil.copy(q8run / 'weights.wof', tmp / 'moved' / 'w.wof')
    cases.append(('export a .wof moved out of its folder', ['export', q8, str(tmp / 'moved' / 'w.wof'),
                                                           '-o', str(tmp / 'm8.tflite')], 'refuse',
                  'w.wof is not in a run folder (no prepare.json beside it)'))
    return cases


def test_host_cases(tmp_path):
    (tmp_path / 'outside').mkdir()
    cases = host_cases(tmp_path)
    tally = dict.fromkeys(KINDS, 0)
    bad, shown = [], {}
    for k, (name, argv, want, mark) in enumerate(cases):
        tally['cases'] += 1
        out = str(tmp_path / ('o%d' % k))
        if argv[0] == 'prepare' and '-o' not in argv:
            argv = argv + ['-o', out]
        keep = {p: open(p, 'rb').read() for p in argv if isinstance(p, str) and os.path.isfile(p)}
        outside = snapshot(tmp_path / 'outside')
        err, so = io.StringIO(), io.StringIO()
        try:
            with redirect_stderr(err), redirect_stdout(so):
                code = cli(argv)
        except SystemExit as e:           # argparse refusing a value it cannot parse
            code = e.code
        except BaseException as e:  # noqa: B902
            code, kind = None, 'tracebacks'
            err.write('%s: %s' % (type(e).__name__, e))
        msg = err.getvalue().strip()
        if code is None:
            kind = 'tracebacks'
        elif code == 0:
            kind = 'correct successes' if want == 'ok' else 'wrong outcome'
        elif code == 2 and want == 'refuse' and ('error: ' in msg or 'invalid' in msg) and \
                (mark is None or mark in msg or mark.strip() in msg):
            kind = 'clean refusals'
            shown[name] = msg.splitlines()[-1][:160]
        else:
            kind = 'wrong outcome'
        for p, b in keep.items():
            if not os.path.isfile(p) or open(p, 'rb').read() != b:
                kind = 'destroyed files'
        if snapshot(tmp_path / 'outside') != outside or os.path.exists(tmp_path / 'evil.circle'):
            kind = 'writes outside the folder'
        tally[kind] += 1
        if kind not in ('clean refusals', 'correct successes'):
            bad.append((name, kind, code, msg[-300:]))
    print('\n' + table([('host (prepare, dataset, export)', tally)]))
    for k, v in shown.items():
        print('  %-34s %s' % (k, v))
    assert not bad, bad[:8]
    assert tally['cases'] >= 70


# ------------------------------------------------------------------ keep-best across runs
def test_a_bad_learning_rate_cannot_make_trained_wof_worse(base, tmp_path):
    """A folder with good trained.wof, run again with a learning rate that wrecks the
    model: trained.wof ends at least as good (here: unchanged)."""
    d = tmp_path / 'k'
    shutil.copytree(base, d, ignore=shutil.ignore_patterns('lib'))
    cfg = json.loads(_cfg_text(d))
    cfg['epochs'] = 4
    _text(d, 'train.json', json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, 'micro'))
    r = subprocess.run([sys.executable, 'train.py'], cwd=d, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    sys.path.insert(0, os.path.join(ROOT, 'micro'))
    from utrain.trainer import Trainer
    from utrain.data import Dataset

    def score():
        tr = Trainer(str(d / 'model.flat'), str(d / 'trained.wof'))
        return tr.evaluate(Dataset(str(d / 'test.ds')))
    good = (d / 'trained.wof').read_bytes()
    before = score()
    cfg['lr'], cfg['epochs'] = 40.0, 3
    cfg['run']['on_nan'] = 'stop'
    _text(d, 'train.json', json.dumps(cfg))
    r = subprocess.run([sys.executable, 'train.py'], cwd=d, capture_output=True, text=True, env=env)
    assert r.returncode == 0 and 'Traceback' not in r.stdout + r.stderr, r.stdout + r.stderr
    after = score()
    print(before, after, r.stdout)
    assert after[1] >= before[1] and (after[1] > before[1] or after[0] <= before[0])
    assert 'replaced only by better weights' in r.stdout
    if after == before:
        assert (d / 'trained.wof').read_bytes() == good
    log = (d / 'train.log').read_text().splitlines()
    # appended, a header a run (session 32: each run's rows under their own)
    assert sum(l.startswith('epoch,') for l in log) == 2 and len(log) >= 2 + 5 + 4


# ------------------------------------------------------------------ heap, two runs at once
@pytest.mark.skipif(not MP, reason='no MicroPython binary')
def test_too_small_a_heap_for_the_code_is_said(base):
    env = dict(os.environ, MICROPYPATH=':lib')
    for kb in (8, 16, 40):
        r = subprocess.run([MP, '-X', 'heapsize=%dK' % kb, 'train.py'], cwd=base, env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and 'Traceback' not in r.stdout + r.stderr, (kb, r.stdout + r.stderr)
        assert 'utrain: out of memory loading the utrain code' in r.stdout, r.stdout


def test_a_second_run_of_one_folder_is_refused_and_a_killed_one_leaves_no_lock(base, tmp_path):
    """runner.run locks the folder (flock: the kernel drops it with the process)."""
    d = tmp_path / 'two'
    shutil.copytree(base, d)
    holder = subprocess.Popen([sys.executable, '-c', (
        'import sys, fcntl, os, time; sys.path.insert(0, %r); fd = os.open(%r, os.O_RDONLY); '
        'fcntl.flock(fd, fcntl.LOCK_EX); print("locked", flush=True); time.sleep(60)') % (ROOT, str(d))],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == 'locked'
    with pytest.raises(RuntimeError, match=r'a process \(pid %d\) is using this folder; wait'
                       % holder.pid):
        runner.run(str(d), python=True, stream=False)
    before = {f: (d / f).read_bytes() for f in INPUTS}
    holder.kill()                    # killed, like a run that crashed: no lock is left
    holder.wait()
    code, text = runner.run(str(d), python=True, stream=False)
    assert code == 0 and 'holds the best weights' in text, text
    assert all((d / f).read_bytes() == b for f, b in before.items() if f != 'train.py')


def test_host_run_passes_a_terminal_ctrl_c_on_as_the_byte(base, tmp_path):
    """SIGINT to `host_tools run` (a terminal's Ctrl-C): the run stops between samples,
    saves its checkpoint and says so; no traceback from either process.  The run starts
    with SIGINT's default action, as from a terminal: under a test suite started in the
    background (`cmd &` without job control) SIGINT is ignored, every child inherits
    that, and Python then never raises KeyboardInterrupt (the run, rightly, goes on)."""
    import signal
    d = tmp_path / 'term'
    shutil.copytree(base, d)
    cfg = json.loads(_cfg_text(d))
    cfg['epochs'] = 5000
    _text(d, 'train.json', json.dumps(cfg))
    p = subprocess.Popen([sys.executable, '-m', 'host_tools', 'run', str(d), '--python'], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith('epoch 2/'):
            p.send_signal(signal.SIGINT)
            break
    rest = p.communicate(timeout=120)[0]
    assert p.returncode == 130, ''.join(seen) + rest     # (stopped, not ended)
    assert 'interrupted in epoch' in rest and 'saved checkpoint.ckpt' in rest, rest
    assert 'Traceback' not in ''.join(seen) + rest
    assert json.loads(_cfg_text(d))['run']['resume'] is True


@pytest.mark.parametrize('int8', [False, True])
def test_refused_data_leaves_the_prepared_folder_as_it_was(tmp_path, int8):
    """prepare again into a prepared folder with data it refuses: every check (the data's
    too) runs before anything is written, so the folder keeps the earlier run's files."""
    keras = os.path.join(ROOT, 'bench', 'zoo', 'keras')
    if int8:
        model, good = os.path.join(keras, 'mlp_int8.tflite'), os.path.join(keras, 'mlp_data.npz')
        kw = dict(loss='scce', optimizer='sgd', lr=0.01)     # (given: no lr probe)
    else:
        model = os.path.join(ROOT, 'datasets', 'digits', 'digits_mlp.circle')
        good, kw = os.path.join(ROOT, 'datasets', 'digits', 'digits.npz'), dict(loss='scce')
    out = str(tmp_path / 'run')
    prepare(model, out, data=good, train='last:2', **kw)
    before = snapshot(out)
    bad = str(tmp_path / 'bad.npz')
    np.savez(bad, x=np.zeros((8, 5), np.float32), y=np.zeros(8))
    with pytest.raises(ValueError, match='values per sample'):
        prepare(model, out, data=bad, train='all', epochs=3, **kw)
    assert snapshot(out) == before


@pytest.mark.parametrize('int8', [False, True])
def test_preparing_a_folder_again_sets_the_earlier_run_aside(tmp_path, int8):
    """Issue 28: a folder prepared again (another model, another split) kept the earlier
    run's train.log, trained.wof, checkpoint.ckpt and test.ds: the new run appended its
    epochs under the old header (a regression's MAE in an 'accuracy' column, plot drawing
    both runs as one).  prepare moves a run's outputs into earlier-N/ and says so, drops
    samples it did not write this time, refuses a split that leaves nothing to train
    before writing anything, and refuses while a run holds the folder."""
    import fcntl
    model = small_mlp(str(tmp_path / 'm.circle'))
    data = blobs(tmp_path, n=24)
    out = str(tmp_path / 'run')
    kw = dict(loss='scce', optimizer='sgd', epochs=1, int8=int8, log=lambda *a: None)
    prepare(model, out, data=data, test_split=0.25, **kw)
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0, text
    left = {n: open(os.path.join(out, n), 'rb').read() for n in ('train.log', 'trained.wof')}
    a = str(tmp_path / 'a.circle')
    with redirect_stdout(io.StringIO()):
        assert cli(['export', model, os.path.join(out, 'trained.wof'), '-o', a]) == 0
    before = snapshot(out)
    with pytest.raises(ValueError, match='leaves none to train on'):
        prepare(model, out, data=data, test_split=0.99, **kw)
    assert snapshot(out) == before
    said = []
    z = np.load(data)
    reg = npz(str(tmp_path / 'reg.npz'), x=z['x'], y=np.eye(3, dtype=np.float32)[z['y']] * 0.5)
    prepare(model, out, data=reg, **dict(kw, loss='mse', int8=False, log=said.append))
    assert any('moved its train.log, trained.wof' in m and 'earlier-1' in m for m in said), said
    for n in ('train.log', 'trained.wof', 'checkpoint.ckpt', 'test.ds'):
        assert not os.path.exists(os.path.join(out, n)), n
    for n, b in left.items():
        assert open(os.path.join(out, 'earlier-1', n), 'rb').read() == b
    # the earlier run exports from earlier-1 as it did from the folder
    b = str(tmp_path / 'b.circle')
    with redirect_stdout(io.StringIO()):
        assert cli(['export', model, os.path.join(out, 'earlier-1', 'trained.wof'), '-o', b]) == 0
    assert open(a, 'rb').read() == open(b, 'rb').read()
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0, text
    log = open(os.path.join(out, 'train.log')).read().splitlines()
    assert log[0].startswith('epoch,loss,mae,') and len(log) == 2, log
    # run again: a run without a test split logs no epoch 0, and plot draws the last run
    # alone (it took both runs' rows as one curve)
    from host_tools.plot import read_log
    assert runner.run(out, python=True, stream=False)[0] == 0
    assert read_log(os.path.join(out, 'train.log'))['epoch'] == [1.0]
    fd = os.open(out, os.O_RDONLY)          # a run training there: refused, nothing moved
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        before = snapshot(out)
        with pytest.raises(ValueError, match=r'\(pid %d\) is using this folder' % os.getpid()):
            prepare(model, out, data=data, **kw)
        assert snapshot(out) == before
    finally:
        os.close(fd)


def test_a_run_that_ends_on_a_damaged_file_says_what_to_do(tmp_path):
    """Issue 28: the board says what is wrong with which file ('checkpoint.ckpt: not a
    version-1 checkpoint', 'train.ds: 300 bytes, expected ...'); `run` adds what to do
    (host side: the board's code stays lean)."""
    model = small_mlp(str(tmp_path / 'm.circle'))
    out = str(tmp_path / 'run')
    prepare(model, out, data=blobs(tmp_path, n=24), loss='scce', epochs=1, test_split=0.25,
            log=lambda *a: None)
    ds_bytes = open(os.path.join(out, 'train.ds'), 'rb').read()

    def run_says():
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = cli(['run', out, '--python'])
        return code, err.getvalue()
    cfg = json.loads(_cfg_text(tmp_path / 'run'))
    cfg['run']['resume'] = True
    _text(tmp_path / 'run', 'train.json', json.dumps(cfg))
    open(os.path.join(out, 'checkpoint.ckpt'), 'wb').write(b'\x17' * 64)
    code, err = run_says()
    assert code != 0 and 'checkpoint.ckpt cannot be resumed from; delete it' in err, err
    os.remove(os.path.join(out, 'checkpoint.ckpt'))
    open(os.path.join(out, 'train.ds'), 'wb').write(ds_bytes[:len(ds_bytes) // 2])
    code, err = run_says()
    assert code != 0 and 'train.ds is damaged or missing' in err and 'prepare the folder' in err, err
    open(os.path.join(out, 'train.ds'), 'wb').write(ds_bytes)
    os.remove(os.path.join(out, 'test.ds'))
    code, err = run_says()
    assert code != 0 and 'test.ds is damaged or missing' in err, err
    open(os.path.join(out, 'test.ds'), 'wb').write(b'')
    code, err = run_says()
    assert code != 0 and 'test.ds is damaged or missing' in err, err
    # a board's run, read by deploy --run: the same advice
    from host_tools.boards import board
    code, text = runner.run(out, python=True, stream=False)
    with pytest.raises(board.BoardError, match='test.ds is damaged.*deploy it again'):
        board.check_end(text, 'COM3')


def test_host_out_of_space_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    from host_tools.formats import circle_io
    out = tmp_path / 'p'
    model = small_mlp(str(tmp_path / 'm.circle'))
    data = blobs(tmp_path, n=24)
    assert cli(['prepare', model, '-o', str(out), '--data', data, '--loss', 'scce']) == 0
    old = (out / 'weights.wof').read_bytes()

    def full(fd):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(circle_io.os, 'fsync', full)
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = cli(['prepare', model, '-o', str(out), '--data', data, '--loss', 'scce', '--lr', '0.5'])
    monkeypatch.undo()
    msg = err.getvalue()
    assert code == 2 and 'model.flat: cannot write it (No space left on device' in msg, msg
    assert 'bytes free there' in msg and 'the previous file is kept' in msg, msg
    assert (out / 'weights.wof').read_bytes() == old
    assert not [f for f in os.listdir(out) if f.endswith('.tmp')]


@pytest.mark.parametrize('argv, says', [
    (['--budget', '-5K'], '--budget -5K: not a heap size'),
    (['--budget', '-1.5M'], '--budget -1.5M: not a heap size'),
    (['--lr', '-1e-3'], '--lr -0.001: must be a finite number > 0')])
def test_a_negative_value_after_its_option_is_judged_by_the_option(tmp_path, argv, says):
    """`--budget -5K` (space-separated): argparse took -5K for an option and said only
    'argument --budget: expected one argument' (issue 28's known gap); the value now
    reaches the option's own check, which says what it takes."""
    model = small_mlp(str(tmp_path / 'm.circle'))
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            code = cli(['prepare', model, '-o', str(tmp_path / 'run'), '--data',
                        blobs(tmp_path, n=12), '--loss', 'scce'] + argv)
        except SystemExit as e:
            code = e.code
    assert code == 2 and says in err.getvalue() and 'expected one argument' not in err.getvalue(), \
        err.getvalue()
    assert not os.path.exists(tmp_path / 'run' / 'train.json')


def test_data_read_to_choose_the_loss_is_judged_as_prepare_reads_it(tmp_path):
    """With no --loss, prepare reads the targets first to choose one: an empty .npz was
    a traceback there (EOFError: No data left in file) and True/False labels for a
    3-output model a refusal calling them 'class numbers 0 to 2' for mse.  The empty
    file is now refused by the data check (naming the file and what --data takes) and
    bool labels are the numbers 0 and 1 (scce chosen, as for 0/1 integers)."""
    model = small_mlp(str(tmp_path / 'm.circle'))
    open(tmp_path / 'empty.npz', 'wb').close()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 6)).astype(np.float32)
    np.savez(tmp_path / 'b.npz', x=x, y=rng.integers(0, 2, 24).astype(bool))
    for data, want in (('empty.npz', 'empty.npz: not a readable .npz file: the file is empty'), ('b.npz', None)):
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            code = cli(['prepare', model, '-o', str(tmp_path / ('run' + data)), '--data',
                        str(tmp_path / data)])
        if want:
            assert code == 2 and want in err.getvalue() and '.csv' in err.getvalue(), err.getvalue()
        else:
            assert code == 0, err.getvalue()
            tj = json.load(open(tmp_path / ('run' + data) / 'train.json'))
            assert 'scce' in json.dumps(tj), tj
