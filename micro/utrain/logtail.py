# train.log's last row at a run's start (utrain/run.py), a module of its own loaded for
# the call: utrain.once is several times its size, and the hole a module loaded then
# leaves in the heap (after the net and the datasets) is where a banded run's strips
# had to fit.
import sys


def last_logged(files, resume, start):
    # The epoch of train.log's last whole row when resuming: a run cut off (power, a raw
    # SIGINT) after it logged an epoch but before that epoch's checkpoint resumes from the
    # checkpoint and trains that epoch again; its row is written once.  -1 when the last
    # line is a header (this run's, none of its rows yet), else -2 (no log, or not
    # resuming): a fresh run writes the header then, each run's rows under their own (an
    # earlier run's last row had been taken for a resumed second run's, its epoch 1 row
    # dropped), and says what it starts from where an earlier run's rows are there
    # (utrain.again).  A last row a power cut left short gets its line ended here, so the
    # rows this run appends stay rows of their own (plot leaves the short one out)
    path = files['log']
    try:
        with open(path, 'rb') as f:
            n = f.seek(0, 2)
            f.seek(max(0, n - 512))
            tail = f.read(512)      # (at most: a log that is a device, /dev/full, reads
            # without end: read whole, it had filled the heap, 'out of memory before training')
        if tail[-1:] not in (b'', b'\n'):
            with open(path, 'ab') as f:
                f.write(b'\n')
    except OSError:
        return -2
    rows = tail.split(b'\n')
    last = rows[-2] if len(rows) > 1 and rows[-1] == b'' else b''
    if last[:6] == b'epoch,':
        return -1
    if not resume:
        if last:            # (loaded for the call: its words are no heap otherwise)
            run = sys.modules['utrain.run']
            run.aux('again', 'say', files, start, last.split(b',')[0].decode())
        return -2
    try:
        return int(last.split(b',')[0])
    except ValueError:
        return -2
