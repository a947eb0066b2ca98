"""Issue 28: a prepare stopped half way (Ctrl-C, SIGTERM, SIGKILL, an error while it
writes) leaves the folder as it was, or none: it writes in OUT.preparing beside it and
replaces OUT at the end (runfolder.Staged); it had rewritten model.flat and weights.wof
under the earlier train.json, a folder `run` took for a good one.  Two prepares, or a
prepare and a run, in one folder: the second is refused naming the folder and the other
process's pid (it had written into the first's files); a lock left by a killed prepare
blocks nothing and its staging folder is removed, said so."""
import io
import os
import signal
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from repo import ROOT  # noqa: E402

from host_tools.cli import main as cli  # noqa: E402
from host_tools.graph.passes import PrepareError  # noqa: E402
from host_tools.prepare import pipeline  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from test_pipeline import small_mlp, blobs  # noqa: E402

KW = dict(test_split=0.25, loss='scce', epochs=1, log=lambda *a: None)


def snapshot(d):
    return {os.path.relpath(os.path.join(r, f), d): open(os.path.join(r, f), 'rb').read()
            for r, _, fs in os.walk(d) for f in fs}


@pytest.fixture
def folder(tmp_path):
    """A prepared folder that has run, and a second model (other sizes) to prepare into it."""
    a, b = small_mlp(str(tmp_path / 'a.circle')), small_mlp(str(tmp_path / 'b.circle'), hidden=5)
    data = blobs(tmp_path, n=40)
    out = str(tmp_path / 'out')
    prepare(a, out, data=data, **KW)
    assert runner.run(out, python=True, stream=False)[0] == 0
    return out, b, data


@pytest.mark.parametrize('stop', [KeyboardInterrupt, MemoryError])
@pytest.mark.parametrize('where', ['write_data', 'write_run_config'])
def test_a_prepare_stopped_half_way_leaves_the_folder_as_it_was(folder, monkeypatch, stop, where):
    out, b, data = folder
    before = snapshot(out)

    def stopped(*a, **k):
        raise stop()
    monkeypatch.setattr(pipeline, where, stopped)
    with pytest.raises(stop):
        prepare(b, out, data=data, **KW)
    assert snapshot(out) == before
    assert not os.path.exists(out + '.preparing')
    monkeypatch.undo()
    # a fresh folder: nothing at all
    with monkeypatch.context() as m:
        m.setattr(pipeline, where, stopped)
        with pytest.raises(stop):
            prepare(b, out + '2', data=data, **KW)
    assert not os.path.exists(out + '2') and not os.path.exists(out + '2.preparing')


HOLD = r'''
import os, signal, sys, time
sys.path.insert(0, %r)
from host_tools.prepare import pipeline
def held(*a, **k):
    print('writing', flush=True)
    time.sleep(60)
pipeline.write_run_config = held
pipeline.prepare(%r, %r, data=%r, test_split=0.25, loss='scce', log=lambda *a: None)
'''


def holding_prepare(model, out, data):
    """A prepare (its argv says so, as the CLI's does) stopped inside its last write."""
    p = subprocess.Popen([sys.executable, '-c', HOLD % (ROOT, model, out, data), 'prepare'],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == 'writing'
    return p


def test_a_second_prepare_or_a_run_is_refused_naming_the_first_and_a_killed_one_blocks_nothing(
        folder):
    out, b, data = folder
    before = snapshot(out)
    p = holding_prepare(b, out, data)
    try:
        with pytest.raises(PrepareError) as e:
            prepare(b, out, data=data, **KW)
        assert f'{out}: a prepare (pid {p.pid})' in str(e.value), e.value
        assert 'wait for it to end' in str(e.value)
        with pytest.raises(RuntimeError, match=rf'a prepare \(pid {p.pid}\) is preparing'):
            runner.run(out, python=True, stream=False)
        err = io.StringIO()
        with redirect_stderr(err), redirect_stdout(io.StringIO()):
            assert cli(['prepare', b, '-o', out, '--data', data]) == 2
        assert f'pid {p.pid}' in err.getvalue() and 'Traceback' not in err.getvalue()
    finally:
        p.kill()                # (SIGKILL: no clean-up runs, its lock goes with it)
        p.wait()
    assert snapshot(out) == before and os.path.isdir(out + '.preparing')
    said = []
    prepare(b, out, data=data, **dict(KW, log=said.append))
    assert not os.path.exists(out + '.preparing')
    assert any(out + '.preparing: removed' in s and f'pid {p.pid}' in s for s in said), said
    assert runner.run(out, python=True, stream=False)[0] == 0


def test_a_fresh_folder_being_prepared_is_refused_to_a_run_and_a_prepare(tmp_path):
    m, data = small_mlp(str(tmp_path / 'm.circle')), blobs(tmp_path, n=40)
    out = str(tmp_path / 'new')
    p = holding_prepare(m, out, data)
    try:
        assert not os.path.exists(out)
        with pytest.raises(RuntimeError, match='is preparing this folder'):
            runner.run(out, python=True, stream=False)
        with pytest.raises(PrepareError, match=rf'pid {p.pid}'):
            prepare(m, out, data=data, **KW)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()
    # SIGTERM without the CLI's handler ends it as SIGKILL does; nothing in out
    assert not os.path.exists(out)
    prepare(m, out, data=data, **KW)
    assert os.path.isfile(os.path.join(out, 'train.json'))


def test_sigterm_to_the_cli_prepare_removes_its_staging_folder(tmp_path):
    m, data = small_mlp(str(tmp_path / 'm.circle')), blobs(tmp_path, n=40)
    out = str(tmp_path / 'o')
    code = ('import sys, time; sys.path.insert(0, %r); from host_tools.prepare import pipeline\n'
            'def held(*a, **k):\n    print("writing", flush=True); time.sleep(60)\n'
            'pipeline.write_run_config = held\n'
            'from host_tools.cli import main; sys.exit(main(sys.argv[1:]))') % ROOT
    p = subprocess.Popen([sys.executable, '-c', code, 'prepare', m, '-o', out, '--data', data,
                          '--loss', 'scce'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    while p.stdout.readline().strip() != 'writing':
        pass
    time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and 'Traceback' not in err and 'prepare did not finish' in err, err
    assert not os.path.exists(out) and not os.path.exists(out + '.preparing')


def test_a_linked_folder_and_the_current_one(tmp_path, monkeypatch):
    """-o a symbolic link to a folder: the folder it names is replaced, the link kept (the
    swap had replaced the link by a folder, the folder it named left stale); -o the
    folder prepare runs in (or one it is inside): written in place, the shell's folder
    not swapped away under it."""
    m, data = small_mlp(str(tmp_path / 'm.circle')), blobs(tmp_path, n=40)
    real, link = tmp_path / 'real', tmp_path / 'link'
    real.mkdir()
    link.symlink_to(real)
    prepare(m, str(link), data=data, **KW)
    assert link.is_symlink() and (real / 'train.json').is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['blobs.npz', 'link', 'm.circle', 'real']
    here = tmp_path / 'here'
    (here / 'sub').mkdir(parents=True)
    for cwd, out in ((here, '.'), (here / 'sub', '..')):
        monkeypatch.chdir(cwd)
        ino = os.stat('.').st_ino
        prepare(m, out, data=data, **KW)
        assert os.stat('.').st_ino == ino and (here / 'train.json').is_file()
        assert not os.path.exists(str(here) + '.preparing')


def test_a_folder_of_other_files_is_written_in_place_not_copied(tmp_path, monkeypatch):
    """-o a folder that holds other files than a preparation's (a home folder, a project):
    staging would copy it whole; prepare writes there as before, the files left as they
    are.  A run folder's sub-folders (earlier-N/) are linked into the staging folder, not
    copied."""
    m, data = small_mlp(str(tmp_path / 'm.circle')), blobs(tmp_path, n=40)
    proj = tmp_path / 'proj'
    (proj / 'photos').mkdir(parents=True)
    (proj / 'notes.txt').write_text('mine')
    (proj / 'photos' / 'a.jpg').write_bytes(b'\xff\xd8\xff' + bytes(100))
    copied = []
    import shutil as sh
    real = sh.copytree
    monkeypatch.setattr(sh, 'copytree', lambda *a, **k: copied.append(a) or real(*a, **k))
    prepare(m, str(proj), data=data, **KW)
    assert copied == [] and (proj / 'train.json').is_file()
    assert (proj / 'notes.txt').read_text() == 'mine' and (proj / 'photos' / 'a.jpg').is_file()


def test_an_int8_runs_files_beside_trained_wof_go_with_it_to_earlier_n(tmp_path):
    """A folder prepared again sets its earlier run aside in earlier-N: an int8 run's
    trained.wof.q8s / .q8w (its ranges, weight scales) stayed behind, beside the new
    preparation, and earlier-N/trained.wof exported without them."""
    from repo import ROOT
    z = os.path.join(ROOT, 'bench', 'zoo', 'keras')
    ft, data = os.path.join(z, 'mlp_float.tflite'), os.path.join(z, 'mlp_data.npz')
    out = str(tmp_path / 'o')
    kw = dict(data=data, int8=True, test_split=0.2, loss='scce', epochs=2, lr=0.01,
              log=lambda *a: None)       # (lr given: no lr probe, most of the time)
    prepare(ft, out, **kw)
    assert runner.run(out, python=True, stream=False)[0] == 0
    side = sorted(n for n in os.listdir(out) if n.startswith('trained.wof.q8'))
    assert side, os.listdir(out)
    a = str(tmp_path / 'a.tflite')
    pipeline.export(ft, os.path.join(out, 'trained.wof'), a)
    before = {n: open(os.path.join(out, n), 'rb').read() for n in side}
    prepare(ft, out, **kw)
    assert not [n for n in os.listdir(out) if n.startswith('trained.wof')]
    assert {n: open(os.path.join(out, 'earlier-1', n), 'rb').read() for n in side} == before
    b = str(tmp_path / 'b.tflite')
    pipeline.export(ft, os.path.join(out, 'earlier-1', 'trained.wof'), b)
    assert open(a, 'rb').read() == open(b, 'rb').read()
