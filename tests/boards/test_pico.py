"""The user's workflow on the emulated Raspberry Pi Pico: the real MicroPython rp2 firmware
in rp2040js (host_tools/boards/pico.py).  Skipped without the firmware ($UTRAIN_PICO_FIRMWARE,
../shared/board-sim.md says how to build it); a few samples each, as the emulator runs
10-40 M RP2040 cycles per wall second."""
import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from repo import ROOT, set_train  # noqa: E402

from host_tools.boards import board, pico  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.files.wof import read_checkpoint, read_wof  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.pico,
              pytest.mark.skipif(not pico.available(), reason='no emulated Pico firmware '
                                 '($UTRAIN_PICO_FIRMWARE)')]
DIGITS = os.path.join(ROOT, 'datasets', 'digits')
MLP = os.path.join(DIGITS, 'digits_mlp.circle')


def digits(tmp_path, n):
    with np.load(os.path.join(DIGITS, 'digits.npz')) as z:
        x, y = z['x'][:n], z['y'][:n]
    path = str(tmp_path / 'd.npz')
    np.savez(path, x=x, y=y)
    return path


def prepared(tmp_path, name='run', n=20, **kw):
    out = str(tmp_path / name)
    # (float32: for --board rp2040 prepare would train the float model as int8)
    args = dict(data=digits(tmp_path, n), test_split=0.2, dtype='uint8', board='rp2040',
                loss='scce', optimizer='adam', lr=0.01, epochs=2, int8=False,
                log=lambda *a, **k: None)
    args.update(kw)
    prepare(MLP, out, **args)
    return out


def weights(d, name='checkpoint.ckpt'):
    """The last epoch's weights (trained.wof holds the best epoch's, maybe the first)."""
    g = read_model(MLP)
    path = os.path.join(d, name)
    return read_checkpoint(path, g) if name.endswith('.ckpt') else read_wof(path, g)


def close(a, b, tol):
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a) <= tol


def test_run_emulated_trains_like_unix(tmp_path):
    """`run --emulate` on stock firmware: the folder goes onto the board's flash, trains,
    and the results come back; the same folder on unix MicroPython ends within float
    rounding of it (the Pico computes in single precision in software, unix in double)."""
    d = prepared(tmp_path)
    u = str(tmp_path / 'unix')
    shutil.copytree(d, u)
    code, text = pico.run_folder(d, stream=False)
    assert code == 0, text[-500:]
    assert 'utrain: end: ok' in text
    for name in ('trained.wof', 'checkpoint.ckpt', 'train.log'):
        assert os.path.exists(os.path.join(d, name)), name
    if runner.find_micropython():
        code, utext = runner.run(u, board='rp2040', stream=False)
        assert code == 0, utext[-500:]
        assert close(weights(d), weights(u), 1e-4)
        # the loss lines agree to the printed digits
        pl = [x.split()[3] for x in text.splitlines() if x.startswith('epoch ')]
        ul = [x.split()[3] for x in utext.splitlines() if x.startswith('epoch ')]
        assert pl and np.allclose(np.float64(pl), np.float64(ul), atol=2e-4)


def test_heap_ballast_refuses_then_trains(tmp_path):
    """A ballast leaves the board the heap asked for: far too little ends with utrain's
    out-of-memory line (and exit status 1), the planned heap trains."""
    d = prepared(tmp_path, n=10, epochs=1)
    code, text = pico.run_folder(d, heap='20K', stream=False)
    assert code == 1 and 'utrain: end: ' in text and 'utrain: end: ok' not in text, text[-400:]
    assert 'memory' in text.split('utrain: end: ')[-1]
    with open(os.path.join(d, 'prepare.json')) as f:
        plan = json.load(f)['heap']['total']
    code, text = pico.run_folder(d, heap=plan, stream=False)
    assert code == 0, text[-400:]
    assert 'utrain: pico: free heap' in text


def mpremote(port, *args, cwd=None):
    return subprocess.run([sys.executable, '-m', 'mpremote', 'connect', port, *args],
                          cwd=cwd, capture_output=True, text=True, timeout=900)


def test_deploy_run_ctrl_c_resume_pull_export(tmp_path):
    """The README's "On a real board" on the emulated Pico: deploy, `mpremote run
    train.py`, a Ctrl-C over the serial line (checkpoint saved, resume set), the same
    command again goes on, pull, export.  Bit-identical to the same run uninterrupted on
    the emulated Pico; within float rounding of unix MicroPython."""
    d = prepared(tmp_path, n=20, epochs=2)
    set_train(d, run={'progress': 2})
    ref = str(tmp_path / 'ref')
    shutil.copytree(d, ref)
    # a board that has seen a deploy of utrain before (copying 41 modules over the
    # emulated USB takes minutes): deploy then copies only what changed
    files = {'lib/utrain/' + n: os.path.join(lib, n)
             for lib in [runner.stage(str(tmp_path / 'stage'), mpy=pico.MPY)]
             for n in os.listdir(lib)}
    with pico.PicoBoard(str(tmp_path / 'flash.bin'), files=files) as b:
        board.deploy(d, b.port, board='rp2040')
        p = subprocess.Popen([sys.executable, '-m', 'mpremote', 'connect', b.port, 'run',
                              'train.py'], cwd=d, stdout=subprocess.PIPE, text=True)
        lines = []
        for line in p.stdout:
            lines.append(line)
            if len(lines) > 2 and ' samples' in line and 'epoch' not in line.split()[0:1]:
                if not any('\x03' == x for x in lines):
                    b.write(b'\x03')          # the Ctrl-C byte, as over USB
                    lines.append('\x03')
        p.wait(900)
        first = ''.join(lines)
        assert 'utrain: end: interrupted' in first, first[-600:]
        r = mpremote(b.port, 'cat', 'train.json')
        assert json.loads(r.stdout[r.stdout.index('{'):])['run']['resume'] is True
        out = board.train(d, b.port)
        assert 'resum' in out.lower() and 'utrain: end: ok' in out
        board.pull(d, b.port)
    # uninterrupted, same arithmetic: the same bits
    code, text = pico.run_folder(ref, stream=False)
    assert code == 0, text[-400:]
    for name in ('trained.wof', 'checkpoint.ckpt'):
        with open(os.path.join(d, name), 'rb') as f1, open(os.path.join(ref, name), 'rb') as f2:
            assert f1.read() == f2.read(), name
    exported = str(tmp_path / 'trained.circle')
    from host_tools.prepare.pipeline import export
    export(MLP, os.path.join(d, 'trained.wof'), exported)
    g = read_model(exported)
    w = weights(d, 'trained.wof')
    for k, a in w.items():
        assert np.array_equal(np.asarray(g.tensors[k].data, np.float32).reshape(a.shape), a)


@pytest.mark.skipif(not pico.available(ulab=True), reason='no ulab Pico firmware '
                    '($UTRAIN_PICO_ULAB_FIRMWARE)')
def test_ulab_firmware_trains_like_stock(tmp_path):
    """The firmware with ulab takes utrain's ulab path on the chip; the weights end within
    float rounding of the stock firmware's."""
    d = prepared(tmp_path, n=10, epochs=1)
    s = str(tmp_path / 'stock')
    shutil.copytree(d, s)
    code, text = pico.run_folder(d, ulab=True, stream=False)
    assert code == 0, text[-400:]
    code, stext = pico.run_folder(s, stream=False)
    assert code == 0, stext[-400:]
    assert close(weights(d), weights(s), 1e-4)
