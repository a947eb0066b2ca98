"""q8kern's multiply-add kernels in inline Thumb assembler (utrain.q8asm, staged for ARM
boards) against its viper kernels on the emulated Pico and against plain Python (q8kern
under CPython) and viper on unix MicroPython, on the cases of tests/support/q8kern_cases.py:
random data and edge cases; every output compared by digest."""
import os
import shutil
import subprocess
import sys

import pytest

from repo import ROOT  # noqa: E402

from host_tools.boards import pico  # noqa: E402
from host_tools.target import runner  # noqa: E402

SCRIPT = os.path.join(ROOT, 'tests', 'support', 'q8kern_cases.py')


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
    """q8asm (and q8masm, q8mom's) is staged (as armv6m code) for the Pico and not for the
    unix port."""
    lib = runner.stage(str(tmp_path / 'a'), mpy=pico.MPY)
    assert 'q8asm.mpy' in os.listdir(lib) and 'q8masm.mpy' in os.listdir(lib)
    lib = runner.stage(str(tmp_path / 'b'), mpy=(2 << 10) | 0x306)       # x64
    assert 'q8asm.mpy' not in os.listdir(lib) and 'q8kern.mpy' in os.listdir(lib)
    assert 'q8masm.mpy' not in os.listdir(lib)


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
    assert len(want) == 184 and got == want


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


STEPS = '''
import json
from utrain.q8 import Q8Net
net = Q8Net(json.load(open('q8.json')), 'q8.wof')
n = net.meta['nin']
raw = open('q8x.bin', 'rb').read()
for i in range(0, len(raw), n + 1):
    net.step(bytearray(raw[i:i + n]), raw[i + n], 0.01)
for l in net.layers:
    if getattr(l, 'w', None) is not None:
        print('W', bytes(l.w).hex(), ' '.join(str(v) for v in l.b))
'''


@pytest.mark.slow
@pytest.mark.pico
@pytest.mark.skipif(not pico.available(), reason='no emulated Pico firmware '
                    '($UTRAIN_PICO_FIRMWARE)')
def test_cnn_trains_to_the_same_int8_weights_on_pico_as_viper(tmp_path):
    """A whole int8 CNN made here (bench.kernels.cnn4k: three padded stride-2 3x3 convs,
    a pool and an FC, every layer trained), two SGD steps: the Pico's weights and biases
    (assembler kernels) are the unix viper run's, byte for byte."""
    import json
    import numpy as np
    from bench.kernels import cnn4k
    from host_tools.prepare import quant
    from host_tools.formats.circle_io import read_model
    from host_tools.files.wof import write_wof
    g = read_model(cnn4k(str(tmp_path / 'cnn.tflite'), seed=3))
    m = quant.meta(g, 'all', rows=0)
    d = tmp_path / 'pico'
    d.mkdir()
    (d / 'q8.json').write_text(json.dumps(m))
    write_wof(str(d / 'q8.wof'), len(g.tensors), quant.wof_arrays(g, m), keep_dtype=True)
    rng = np.random.default_rng(5)
    q = rng.integers(-128, 128, (2, 32 * 32 * 3)).astype(np.int8)
    (d / 'q8x.bin').write_bytes(b''.join(q[i].tobytes() + bytes([3 * i + 1]) for i in range(2)))
    (d / 'steps.py').write_text(STEPS)
    (d / 'train.json').write_text('{}')
    u = tmp_path / 'unix'
    shutil.copytree(d, u)
    code, text = pico.run_folder(str(d), stream=False, script='steps.py')
    assert code == 0, text[-500:]
    runner.stage(str(u))
    r = subprocess.run([runner.micropython_binary(), '-X', 'heapsize=4M', 'steps.py'], cwd=u,
                       env=dict(os.environ, MICROPYPATH=':lib'), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    want = [v for v in r.stdout.splitlines() if v.startswith('W ')]
    assert len(want) == 4
    assert [v for v in text.splitlines() if v.startswith('W ')] == want
