"""Who is writing a run folder: the staging folder a prepare writes (OUT.preparing) and
who holds a folder's lock.  Low in the layers: prepare (prepare/runfolder.py, which takes
the locks) and a run (target/runner.py, which refuses a folder a prepare is writing) both
read it."""
from __future__ import annotations

import os

PREPARING = '.preparing'
PID_FILE = 'PREPARING'      # in OUT.preparing: the pid of the prepare writing it


def staging_folder(out_dir) -> str:
    """The staging folder of a prepare into out_dir: OUT.preparing beside it."""
    return os.path.normpath(out_dir) + PREPARING


def holder(path) -> str:
    """Who holds a lock on path (a folder): 'prepare (pid N)', 'a run (pid N)', ... from
    /proc/locks (Linux), or the staging folder's pid file; '' when nothing says."""
    pid = None
    try:
        ino = os.stat(path).st_ino
        with open('/proc/locks') as f:
            for line in f:
                w = line.split()
                if 'FLOCK' in w and '->' not in w and len(w) > w.index('FLOCK') + 4 \
                        and w[w.index('FLOCK') + 4].rsplit(':', 1)[-1] == str(ino):
                    pid = int(w[w.index('FLOCK') + 3])
                    break
    except (OSError, ValueError):
        pass
    if pid is None:
        try:
            with open(os.path.join(path, PID_FILE)) as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return ''
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            argv = f.read().decode(errors='replace').split('\0')
    except OSError:
        argv = []
    what = ('a prepare' if 'prepare' in argv else 'a run' if 'run' in argv or 'train.py' in
            argv else 'a deploy' if 'deploy' in argv else 'a fleet' if 'fleet' in argv
            else 'a process')
    return f'{what} (pid {pid})'


def locked(path, refusal, error=RuntimeError, anon='another process') -> int:
    """An fd of path (a folder) holding its lock (flock: the kernel drops it with the
    process, killed or not), or error(refusal(who holds it: anon where no process is
    named)): prepare, a run, `dataset` and `deploy` each hold a folder so while they
    write it."""
    import fcntl
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        who = holder(path)
        os.close(fd)
        raise error(refusal(who or anon)) from None
    return fd


def not_written_yet(path) -> str | None:
    """What to say of a run's output that is not there (trained.wof, checkpoint.ckpt,
    train.log, as export or plot read them) in a prepared folder: the run in it has not
    saved it yet (it trains now: wait), or the folder has not been run; None when path is
    no missing file of a prepared folder.  (It had been '...: cannot read (No such file or
    directory)' or '...: no such file', with a run training in the folder.)"""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(path) or not os.path.isfile(os.path.join(folder, 'train.json')):
        return None
    who = holder(folder)
    if who:
        return (f'{path}: not written yet: {who} is ' + ('training' if who.startswith('a run')
                                                          else 'working') + f' in {folder} and '
                'has not saved it yet; try again once an epoch has ended (or when it ends)')
    return (f'{path}: not there: {folder} has not been trained (or its run stopped before '
            f'saving it): run it first (`run {folder}`)')
