"""The bench runs end to end (quick mode) and prints its one table with every column and
every reference model; no timing is asserted (benchmarks are tables, not tests)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from host_tools.runner import find_micropython  # noqa: E402


def test_bench_quick_prints_the_table():
    p = subprocess.run([sys.executable, '-m', 'bench', '--quick'], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    from bench.__main__ import COLUMNS
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('|')]
    header = [c.strip() for c in lines[0].strip('|').split('|')]
    assert header == COLUMNS
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip('|').split('|')]
        assert len(cells) == len(COLUMNS)
        rows[(cells[0], cells[1])] = dict(zip(COLUMNS, cells))
    names = {m for m, _ in rows}
    assert {'sine MLP 1-16-16-1', 'digits MLP 64-32-10', 'digits CNN',
            'DS-CNN 49x10 KWS'} <= names
    full = rows[('digits MLP 64-32-10', 'full')]
    sparse = [r for (m, u), r in rows.items() if m == 'digits MLP 64-32-10' and u != 'full']
    assert sparse and sparse[0]['update'].startswith('sparse last:')
    # the MLP rows are measured by every engine the machine has (ratios are numbers)
    assert full['MACs'] == '5056'               # 3 x 64*32 + 2 x 32*10 (no dx of layer 0)
    for col in ('Py us', 'Py/dot', 'torch us', 'Py/torch', 'ONERT us', 'Py/ONERT'):
        float(full[col].rstrip('x'))
    if find_micropython():
        float(full['MP/loop'].rstrip('x'))
        float(full['MP/Py'].rstrip('x'))
    # models with ops utrain lacks say which op, the peers still run
    for (m, u), r in rows.items():
        if r['Py us'].startswith('n/a'):
            assert 'not supported' in r['Py us'] or 'not there' in r['MP us']
