"""`plot`: loss and metric per epoch, train and test, from a train.log CSV (or per round
from a fleet's fleet.csv)."""
from __future__ import annotations

import csv
import math
import os


def _header(h):
    """Whether h is the header train.log / fleet.csv start with (a damaged one, e.g.
    'test_accuraby', is not: its columns are what plot draws)."""
    return (len(h) == 7 and h[0] in ('epoch', 'round') and h[1] == 'loss' and h[2]
            and h[3] == 'test_loss' and h[4] == 'test_' + h[2] and len(set(h)) == 7)


def read_log(path, notes=None):
    """{column: [values]} from train.log (epoch,loss,<metric>,test_loss,test_<metric>,
    ms,free_heap: the last run, where the epochs start again) or a fleet.csv
    (round,loss,<metric>,test_loss,test_<metric>,boards,samples); empty or nan cells are
    None; ValueError naming path when malformed.  A damaged row (a board that lost power
    while writing it: the next run's row appended to its piece) is left out, said in
    notes (a list) when given; only rows all damaged are refused."""
    if not os.path.exists(path):
        from .paths import broken_link
        from .files.locks import not_written_yet
        raise FileNotFoundError(broken_link(path) or not_written_yet(path) or f'{path}: no such file')
    from .formats.ir import device
    if device(path):
        raise ValueError(device(path))
    try:
        with open(path, newline='', encoding='utf-8-sig') as f:   # (a BOM: a log saved
            # by a Windows editor had been 'not a utrain train.log')
            rows = list(csv.reader(f))
    except UnicodeDecodeError:
        rows = []           # (a binary file: not a log)
    if not rows and os.path.isfile(path) and not os.path.getsize(path):
        # (a run stopped before it wrote its header, or a board's log pulled then: it had
        # been 'not a utrain train.log', of the run's own)
        raise ValueError(f'{path}: empty: the run logged nothing yet; plot it once the run has '
                         'logged an epoch (a board\'s: `pull` it again then)')
    if not rows or not _header(rows[0]):
        raise ValueError(f'{path}: not a utrain train.log (header epoch,loss,metric,...): give '
                         'the train.log that `run` or `pull` wrote, or a fleet\'s fleet.csv')
    head = rows[0]
    cols = {h: [] for h in head}
    damaged, cut, runs = [], False, [0]
    for k, r in enumerate(rows[1:], 2):
        if not r or r == head:      # (a header again: a run's start, or a board's earlier log
            runs.append(len(cols[head[0]]))     # cut short)
            continue
        if len(r) != len(head):
            damaged.append(f'line {k} has {len(r)} columns, expected {len(head)}')
            cut = k == len(rows) and len(r) < len(head)     # (the last row, cut short)
            continue
        try:
            xs = [float(v) if v else None for v in r]
        except ValueError:
            from .files.dataset import _number
            h, v = next((h, v) for h, v in zip(head, r) if v and not _number(v))
            damaged.append(f'line {k}: {h} {v!r} is not a number')
            continue
        far = next(((h, v) for h, v, x in zip(head, r, xs) if x is not None and (
            math.isfinite(x) and abs(x) > 3.5e38 or h == head[0] and not (
                x == int(x) and 0 <= x <= 0xFFFFFFFF))), None) if all(
            x is None or not math.isinf(x) for x in xs[:1]) else (head[0], r[0])
        if far:
            # (beyond what a board logs, float32 values and whole epochs: matplotlib's
            # 'arange: cannot compute length' had ended the plot, naming no file)
            damaged.append(f'line {k}: {far[0]} {far[1]} is beyond what a run logs')
            continue
        for h, x in zip(head, xs):
            cols[h].append(None if x is None or math.isnan(x) else x)
    cut_only = len(damaged) == 1 and cut      # (the first epoch's row cut by a power loss)
    if damaged and not cols[head[0]] and not cut_only:
        raise ValueError(f'{path}: {damaged[0]}: not a utrain train.log (header epoch,loss,'
                         'metric,...): give the train.log that `run` or `pull` wrote')
    if damaged and notes is not None:
        notes.append(f'{path}: {damaged[0]}' + (f' (and {len(damaged) - 1} more rows)'
                                                if len(damaged) > 1 else '')
                     + ': left out (a row cut short, e.g. a board that lost power while '
                       'writing it); the other rows are plotted')
    if not cols[head[0]]:       # (had said what, not what to do)
        raise ValueError(f'{path}: no {head[0]}s logged yet' + (
            f' ({damaged[0]}: a row cut short)' if damaged else '') + (
            '; plot it once the run has logged an epoch (a board\'s: `pull` it again then)'
            if head[0] == 'epoch' else '; plot it once the fleet has run a round'))
    if head[0] != 'epoch':
        return cols
    # train.log is appended to: each fresh run starts again (at epoch 0, or 1 when it has
    # no test split to score before training; a resumed run goes on) under a header of its
    # own (a log of before (32): where the epochs start again): the last run counts
    ep = cols['epoch']
    last = max([i for i, e in enumerate(ep) if i == 0 or e is None or ep[i - 1] is None
                or e <= ep[i - 1]] + [i for i in runs if i < len(ep)])
    return {h: v[last:] for h, v in cols.items()}


def plot(log, out, notes=None):
    """Write log's curves (read_log; notes: a list its notes go to) to out; returns the
    file written."""
    # (plot writes a file with Agg: a $MPLBACKEND matplotlib does not know had ended the
    # plot in "Key backend: 'junk' is not a valid value for backend", naming no variable)
    if os.environ.get('MPLBACKEND', '').lower() not in ('', 'agg'):
        os.environ.pop('MPLBACKEND')
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    c = read_log(log, notes)
    if os.path.isdir(out):      # (matplotlib wrote '<folder>.png' beside it, said '<folder>')
        out = os.path.join(out, os.path.splitext(os.path.basename(log))[0] + '.png')
    elif os.fspath(out).endswith(('/', os.sep)):
        # (had been matplotlib's "Format '' is not supported", naming no file)
        raise ValueError(f"{out}: names a folder (it ends in '/') that is not there: make it, "
                         f"or give a file name, e.g. {os.path.join(out, 'curves.png')}")
    elif not os.path.splitext(out)[1]:
        out += '.png'           # (what matplotlib writes for a name without an ending)
    fmt = os.path.splitext(out)[1][1:].lower()
    kinds = plt.figure().canvas.get_supported_filetypes()
    plt.close('all')
    if fmt and fmt not in kinds:
        raise ValueError(f'{out}: a plot cannot be written as .{fmt}; name the output .png '
                         f'(or one of .{", .".join(sorted(kinds))})')
    names = list(c)
    metric = names[2]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what in zip(axes, ('loss', metric)):
        for col, label, style in ((what, 'train', 'o-'), ('test_' + what, 'test', 's--')):
            pts = [(e, v) for e, v in zip(c[names[0]], c[col]) if v is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xlabel(names[0])
        ax.set_ylabel(what)
        ax.set_title(what)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(os.path.basename(os.path.dirname(os.path.abspath(log))) + '/' + os.path.basename(log))
    fig.tight_layout()
    # (written whole beside it, then renamed: a plot stopped half way (Ctrl-C, a full
    # disk) had left a PNG cut short where the last good one was)
    import io
    from .formats.ir import atomic_write
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=100, format=fmt)
    finally:
        plt.close(fig)
    atomic_write(out, buf.getvalue())
    return out
