"""bench/ort.py runs end to end on a few samples and prints its table; when the
onnxruntime-training environment is there (not a project requirement: bench/ort.py
--help), ONNX Runtime's train losses equal utrain's to float rounding."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # end to end throughout (tests/README.md)

from repo import ROOT  # noqa: E402


def test_ort_bench_prints_the_table():
    p = subprocess.run([sys.executable, 'bench/ort.py', '--samples', '40', '--epochs', '2',
                        '--batches', '3', '--models', 'mlp', '--no-mp'], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [[c.strip() for c in ln.strip('|').split('|')] for ln in p.stdout.splitlines()
            if ln.startswith('|')]
    header, body = rows[0], rows[2:]
    assert header[:5] == ['model', 'batch', 'engine', 'loss e1', 'loss e2']
    engines = {r[2]: dict(zip(header, r)) for r in body}
    assert 'utrain Py' in engines and 'ORT' in engines
    ort = engines['ORT']
    if ort['loss e1'].startswith('skipped'):
        return
    py = engines['utrain Py']
    assert float(py['max loss diff']) < 1e-5
    assert abs(float(py['loss e2']) - float(ort['loss e2'])) < 1e-5
    assert float(py['loss e2']) < float(py['loss e1'])          # it trained
