"""The zoo bench (python -m bench.zoo) runs end to end in quick mode on a few of its models
and prints its table; the parity column is a real check (the untrained exports' outputs
against PyTorch / TFLite Micro), no timing is asserted."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # end to end throughout (tests/README.md)

from repo import ROOT  # noqa: E402


def test_zoo_quick_table():
    p = subprocess.run([sys.executable, '-m', 'bench.zoo', '--quick', '--no-mp', '--only',
                        'LayerNorm,MLP 16-32-16-4 int8'], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    from bench.zoo.__main__ import COLUMNS
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('|')]
    assert [c.strip() for c in lines[0].strip('|').split('|')] == COLUMNS
    rows = {}
    for ln in lines[2:]:
        cells = dict(zip(COLUMNS, (c.strip() for c in ln.strip('|').split('|'))))
        rows[cells['model']] = cells
    assert len(rows) == 2, rows
    for name, r in rows.items():
        assert not r['train'].startswith('n/a'), r
        int(r['params']), int(r['trained']), int(r['MACs'])
        float(r['Py us']), float(r['Py/dot'].rstrip('x'))
        # float exports match their framework to float32 rounding; the int8 file's
        # quantization error is a few output steps
        assert float(r['parity']) < (5e-2 if 'int8' in name else 1e-5), r
