"""Every script in examples/ runs (--fast) and training improves what it says it does:
the after accuracy on held-out data beats the before accuracy."""
import os
import re
import subprocess
import sys

import pytest

from host_tools.target.runner import find_micropython

from repo import ROOT  # noqa: E402
EXAMPLES = sorted(n for n in os.listdir(os.path.join(ROOT, 'examples'))
                  if n.endswith('.py') and n != 'common.py')
pytest.importorskip('onert')


def test_every_example_has_a_page():
    for name in EXAMPLES:
        page = os.path.join(ROOT, 'docs', 'example-' + name[:-3].replace('_', '-') + '.md')
        assert os.path.exists(page), page
        with open(page) as f:
            assert f'examples/{name}' in f.read()


@pytest.mark.slow
@pytest.mark.parametrize('name', EXAMPLES)
def test_example_prints_before_and_after(name, tmp_path):
    if name == 'keywords.py':
        pytest.importorskip('tflite_micro')
        if not find_micropython():
            pytest.skip('trains int8 on the simulated board: no MicroPython binary')
    r = subprocess.run([sys.executable, os.path.join('examples', name), '--fast',
                        '--out', str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    acc = [float(v) for _, v in re.findall(r'(before|after): +accuracy ([0-9.]+)', r.stdout)]
    assert len(acc) >= 2 and len(acc) % 2 == 0, r.stdout
    for before, after in zip(acc[::2], acc[1::2]):
        assert after > before + 0.1, r.stdout
