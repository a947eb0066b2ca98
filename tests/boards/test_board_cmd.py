"""`utrain board`: the simulated board it starts answers mpremote until Ctrl-C; `--check`
reads a board's firmware, .mpy, ulab, heap and file system and names the profile."""
import os
import signal
import subprocess
import sys

import pytest

from host_tools.boards import board, simboard
from host_tools.target import runner
from host_tools.target.runner import find_micropython

from repo import ROOT  # noqa: E402
needs_mp = pytest.mark.skipif(not find_micropython(), reason='no MicroPython binary')


@pytest.mark.parametrize('answer, name', [
    (dict(platform='rp2', machine='Raspberry Pi Pico W with RP2040', free=180_000), 'rp2040'),
    (dict(platform='rp2', machine='Raspberry Pi Pico2 with RP2350', free=450_000), 'rp2350'),
    (dict(platform='esp32', machine='Generic ESP32 module with ESP32', free=100_000), 'esp32'),
    (dict(platform='esp32', machine='Generic ESP32 module with SPIRAM with ESP32',
          free=4_000_000), 'esp32-psram'),
    (dict(platform='esp32', machine='ESP32S3 module with ESP32S3', free=2_000_000), 'esp32s3'),
    (dict(platform='linux', machine='linux [GCC 12] version', free=900_000), 'unix'),
    # no profile for the platform: the largest profile heap at most its free heap (esp32's
    # 100K fits in 150 KB, rp2040's 236K does not)
    (dict(platform='samd', machine='Adafruit Feather M4', free=150_000), 'esp32'),
])
def test_profile_names(answer, name):
    got, why = board.profile_for(dict(answer, alloc=0))
    assert got == name, why


@needs_mp
def test_check_reads_the_simulated_board(tmp_path):
    b = simboard.start('rp2040', flash=str(tmp_path))
    try:
        d = board.check(b.port, resume=True)
    finally:
        b.close()
    assert d['platform'] == 'linux' and d['ulab'] is None
    assert d['arch'] == 'x64' and d['mpy_version'] == 6
    total = d['free'] + d['alloc']
    heap = runner.size_bytes(runner.boards()['rp2040']['heap'])
    assert heap - 10 * 1024 <= total <= heap            # -X heapsize= the profile's
    assert d['fs_free'] > 0
    lines = board.check_report(d)
    assert any(line.startswith('profile: --board unix') for line in lines)
    assert any(line.startswith('ulab: no') for line in lines)
    assert lines[0].startswith('firmware: MicroPython 1.')


@needs_mp
def test_board_command_serves_until_ctrl_c(tmp_path):
    p = subprocess.Popen([sys.executable, '-m', 'host_tools', 'board', '--flash', str(tmp_path)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        assert first.startswith('simulated unix board on '), first + p.stderr.read()
        port = first.split(' on ')[1].split()[0]
        out = board.mpremote(port, 'exec', "f=open('hello.txt','w');f.write('hi');f.close()",
                             resume=True, timeout=60)
        assert (tmp_path / 'hello.txt').read_text() == 'hi', out
        # a soft reset ends unix MicroPython: the command powers it on again, same flash
        with pytest.raises(board.BoardError):
            board.mpremote(port, 'exec', 'print(1)', timeout=60)
        for _ in range(4):
            line = p.stdout.readline()
            if line.startswith('simulated unix board on '):
                break
        port = line.split(' on ')[1].split()[0]
        out = board.mpremote(port, 'exec', "print(open('hello.txt').read())", resume=True,
                             timeout=60)
        assert 'hi' in out
    finally:
        p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert 'board stopped' in rest


@needs_mp
def test_board_command_stops_on_sigterm_and_takes_its_board_along(tmp_path):
    p = subprocess.Popen([sys.executable, '-m', 'host_tools', 'board', '--flash', str(tmp_path)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    assert first.startswith('simulated unix board on '), first
    kids = subprocess.run(['pgrep', '-P', str(p.pid)], capture_output=True, text=True).stdout.split()
    assert kids                                  # its MicroPython
    p.send_signal(signal.SIGTERM)
    rest, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert 'board stopped' in rest
    for pid in kids:
        assert not os.path.exists(f'/proc/{pid}') or \
            open(f'/proc/{pid}/stat').read().split()[2] == 'Z'
