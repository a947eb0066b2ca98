"""q8kern's multiply-add kernels in inline Thumb assembler (utrain.q8asm, staged for ARM
boards) against its viper kernels on the emulated Pico and against plain Python (q8kern
under CPython) and viper on unix MicroPython, on the cases of tests/q8kern_cases.py:
random data and edge cases; every output compared by digest."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from host_tools import pico, runner  # noqa: E402

SCRIPT = os.path.join(ROOT, 'tests', 'q8kern_cases.py')


def digests(text):
    out = {}
    for line in text.splitlines():
        if line.startswith('CASE '):
            _, case, impl, rest = line.split(' ', 3)
            out.setdefault(impl, {})[case] = rest
    return out


def plain_python():
    r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=runner.MICRO))
    assert r.returncode == 0, r.stderr
    return digests(r.stdout)['kern']


def test_stage_asm_only_for_arm(tmp_path):
    """q8asm is staged (as armv6m code) for the Pico and not for the unix port."""
    lib = runner.stage(str(tmp_path / 'a'), mpy=pico.MPY)
    assert 'q8asm.mpy' in os.listdir(lib)
    lib = runner.stage(str(tmp_path / 'b'), mpy=(2 << 10) | 0x306)       # x64
    assert 'q8asm.mpy' not in os.listdir(lib) and 'q8kern.mpy' in os.listdir(lib)


def test_viper_matches_plain_python(tmp_path):
    lib = runner.stage(str(tmp_path))
    assert 'q8asm.mpy' not in os.listdir(lib)
    shutil.copy(SCRIPT, tmp_path)
    r = subprocess.run([runner.micropython_binary(), 'q8kern_cases.py'], cwd=tmp_path,
                       env=dict(os.environ, MICROPYPATH=':lib'), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = digests(r.stdout)['kern']
    want = plain_python()
    assert len(want) == 30 and got == want


@pytest.mark.slow
@pytest.mark.pico
@pytest.mark.skipif(not pico.available(), reason='no emulated Pico firmware '
                    '($UTRAIN_PICO_FIRMWARE)')
def test_asm_matches_viper_and_python_on_pico(tmp_path):
    shutil.copy(SCRIPT, tmp_path)
    (tmp_path / 'train.json').write_text('{}')
    code, text = pico.run_folder(str(tmp_path), stream=False, script='q8kern_cases.py')
    assert code == 0, text[-500:]
    d = digests(text)
    want = plain_python()
    assert d['viper'] == want
    assert d['asm'] == want


def test_kernel_bench_quick_on_unix():
    """bench.kernels' table on unix MicroPython: every kernel timed (viper only)."""
    from bench import kernels
    rows = kernels.run_unix(quick=True)
    names = {n.split()[0] for n in rows}
    assert names == {'bare', 'fck', 'gwk', 'dxk', 'convk', 'cgk', 'cdk', 'dwk', 'ddk', 'dgk',
                     'rqk', 'upk'}
    assert all(m > 0 and ta == -1 for m, tv, ta in rows.values())
    assert '| convk 1x1 |' in kernels.table(rows, 'ns', 1000.0)
