"""utrain.npasm: xnp's float32 kernels (an FC's matmul, the fused SGD updates) in Thumb
assembler calling the RP2040 bootrom's float routines.  Their contract (every product and
sum rounded to float32, a sum from +0.0 term by term: tests/support/npasm_cases.py's
reference, under CPython) against ulab's own arithmetic on a unix MicroPython with float32
ulab, and the kernels against both on the emulated Pico, with ulab's arrays and with the
fallback's (stock firmware); a training step with and without them gives the same
weights there."""
import os
import shutil
import subprocess
import sys

import pytest

from repo import ROOT  # noqa: E402

from host_tools.boards import pico  # noqa: E402
from host_tools.target import runner  # noqa: E402

SCRIPT = os.path.join(ROOT, 'tests', 'support', 'npasm_cases.py')


def cases(text, kernel=None):
    """({impl: {case: digest}}, NPASM's flag); kernel (a dict) gets {case: the kernels
    took it}."""
    out, npasm = {}, None
    for line in text.splitlines():
        if line.startswith('CASE '):
            _, case, impl, dig = line.split()
            out.setdefault(impl, {})[case] = dig
        elif line.startswith('NPASM '):
            npasm = line.split()[1] == '1'
        elif line.startswith('KERNEL ') and kernel is not None:
            _, case, took = line.split()
            kernel[case] = took == '1'
    return out, npasm


def reference():
    r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ref = cases(r.stdout)[0]['ref']
    assert len(ref) == 15
    return ref


def float32_ulab():
    for var in ('UTRAIN_MP_ULAB', 'UTRAIN_MP32_ULAB'):
        exe = os.environ.get(var)
        if exe and os.path.exists(exe):
            r = subprocess.run([exe, '-c', 'from ulab import numpy as np;print(np.zeros(1).itemsize)'],
                               capture_output=True, text=True, timeout=60)
            if r.stdout.strip() == '4':
                return exe
    return None


def test_staged_only_for_rp2040(tmp_path):
    """npasm goes to armv6m boards (the RP2040) only: not to x64 nor to an armv7em board
    (an RP2350 has no such bootrom table)."""
    assert 'npasm.mpy' in os.listdir(runner.stage(str(tmp_path / 'a'), mpy=pico.MPY))
    for arch in (2, 7):          # x64, armv7emsp
        lib = runner.stage(str(tmp_path / str(arch)), mpy=(arch << 10) | 0x306)
        assert 'npasm.mpy' not in os.listdir(lib)


@pytest.mark.skipif(not float32_ulab(), reason='no float32 ulab build ($UTRAIN_MP_ULAB, '
                    '$UTRAIN_MP32_ULAB)')
def test_contract_is_ulabs_arithmetic_on_unix():
    """The kernels' contract is what ulab computes: np.dot (and a strided view of it),
    the row-by-row outer-product update, y += x * s; xnp there (no asm_thumb: npasm
    declines) is ulab's path."""
    r = subprocess.run([float32_ulab(), SCRIPT], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, MICROPYPATH=runner.MICRO))
    assert r.returncode == 0, r.stderr
    got, npasm = cases(r.stdout)
    assert npasm is False
    want = reference()
    assert got['own'] == want and got['xnp'] == want
    for name, dig in want.items():          # a strided view: the same numbers
        if name.endswith('_T'):
            assert dig == want[name[:-2]]


@pytest.mark.slow
@pytest.mark.pico
@pytest.mark.parametrize('ulab', [True, False], ids=['ulab', 'stock'])
def test_kernels_match_own_arithmetic_and_contract_on_pico(tmp_path, ulab):
    if not pico.available(ulab):
        pytest.skip('no %s Pico firmware' % ('ulab' if ulab else 'stock'))
    shutil.copy(SCRIPT, tmp_path)
    (tmp_path / 'train.json').write_text('{}')
    code, text = pico.run_folder(str(tmp_path), ulab=ulab, stream=False, script='npasm_cases.py')
    assert code == 0, text[-500:]
    took = {}
    got, npasm = cases(text, took)
    assert npasm is True                    # xnp took the kernels
    want = reference()
    assert got['xnp'] == want and got['own'] == want
    # the kernels took every case but the strided views (xnp's own functions do those;
    # a 1x1 transpose is dense)
    assert took == {c: not c.endswith('_T') or c == 'fwd_1x1x1_T' for c in want}, took


@pytest.mark.slow
@pytest.mark.pico
@pytest.mark.skipif(not (pico.available(True) and pico.available(False)),
                    reason='no ulab and stock Pico firmware ($UTRAIN_PICO_ULAB_FIRMWARE, '
                    '$UTRAIN_PICO_FIRMWARE)')
def test_training_steps_same_with_and_without_kernels_on_pico():
    """The digits MLP (float, SGD, batch 1): four steps from the same weights with npasm's
    kernels and with the backend's own arithmetic end bit for bit equal, on ulab's arrays
    and on the fallback's (bench/npasm_step.py's digests)."""
    from bench import kernels
    res = kernels.run_float(samples=4, rounds=0)
    for fw in ('ulab', 'stock'):
        r = res[fw]
        assert r['npasm'] and set(r['digest']) == {'on', 'off'}, (fw, r)
        assert r['digest']['on'] == r['digest']['off'], fw
