"""`pip install .`: the wheel holds what the installed `utrain` command needs at run time
(micro/, boards/boards.json, the demo's digits) and runs from it, away from the checkout;
pyproject.toml's pins are requirements.txt's."""
import os
import re
import subprocess
import sys
import zipfile

import pytest

from repo import ROOT  # noqa: E402


def pins(lines):
    out = {}
    for line in lines:
        line = line.split('#')[0].strip().strip('",')
        m = re.match(r'^([A-Za-z0-9_.\-]+)==(\S+)$', line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_pyproject_pins_match_requirements():
    import tomllib
    with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
        proj = tomllib.load(f)['project']
    with open(os.path.join(ROOT, 'requirements.txt')) as f:
        req = pins(f)
    declared = pins(proj['dependencies'] + sum(proj['optional-dependencies'].values(), []))
    assert declared, 'pyproject.toml pins nothing'
    for name, ver in declared.items():
        assert req.get(name) == ver, f'{name}: pyproject {ver}, requirements.txt {req.get(name)}'
    assert proj['scripts']['utrain'] == 'host_tools.__main__:run'


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp('wheel')
    p = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation',
                        '-q', ROOT, '-w', str(out)], capture_output=True, text=True)
    if p.returncode and ('No module named pip' in p.stderr or "invalid command 'bdist_wheel'"
                         in p.stderr or 'No module named setuptools' in p.stderr):
        # the venv's own build tools (the wheel is built without fetching setuptools)
        pytest.skip('this Python cannot build wheels offline: ' + p.stderr.strip()[-200:])
    assert p.returncode == 0, p.stderr
    [name] = [n for n in os.listdir(out) if n.endswith('.whl')]
    return os.path.join(out, name)


def test_wheel_ships_the_run_time_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    micro = sorted(n for n in os.listdir(os.path.join(ROOT, 'micro', 'utrain')) if n.endswith('.py'))
    for n in micro:
        assert 'host_tools/_files/micro/utrain/' + n in names
    for n in ('micro/train.py', 'micro/package.json', 'boards/boards.json',
              'datasets/digits/digits.npz', 'datasets/digits/digits_mlp.circle',
              'datasets/digits/digits_tico_cnn.circle'):
        assert 'host_tools/_files/' + n in names, n
    ep = next(n for n in names if n.endswith('entry_points.txt'))
    assert 'utrain = host_tools.__main__:run' in zipfile.ZipFile(wheel).read(ep).decode()


def test_installed_tool_runs_away_from_the_checkout(wheel, tmp_path):
    site = tmp_path / 'site'
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / 'work'
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    code = ('import host_tools.paths as p, host_tools.target.runner as r, host_tools.target.device as d;'
            'print(p.ROOT); print(r.MICRO); print(d.MICRO); print(sorted(r.boards())[0])')
    out = subprocess.run([sys.executable, '-c', code], cwd=work, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    shipped = str(site / 'host_tools' / '_files')
    assert out[:3] == [shipped, os.path.join(shipped, 'micro'), os.path.join(shipped, 'micro')]
    # a command that reads the device package and the demo's model from the wheel's copy
    p = subprocess.run([sys.executable, '-m', 'host_tools', 'inspect',
                        os.path.join(shipped, 'datasets', 'digits', 'digits_mlp.circle')],
                       cwd=work, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert 'FULLY_CONNECTED' in p.stdout
