# What train.py runs (kept here so a board loads it precompiled as .mpy instead of
# compiling it in its heap): check train.json (utrain/config.py), load the prepared
# files it names, evaluate, train epoch by epoch with progress lines, a CSV log,
# checkpoints, validation-gated saving of the best weights across runs (utrain/best.py),
# divergence recovery, Ctrl-C, file-system and out-of-memory handling (README).
import gc
import json
import sys
from utrain.trainer import Trainer, Diverged
from utrain.data import Dataset
from utrain.model import drop

try:
    from time import ticks_ms, ticks_diff
except ImportError:  # CPython
    from time import time

    def ticks_ms():
        return int(time() * 1000)

    def ticks_diff(a, b):
        return a - b


class SaveError(Exception):
    pass


def heap():
    try:
        gc.collect()
        return gc.mem_free()
    except AttributeError:
        return -1


def flush():
    # a serial terminal (or mpremote) shows the line now, not when a buffer fills
    try:
        sys.stdout.flush()
    except AttributeError:
        pass


ERRNO = {28: 'no space left on the file system', 21: 'it is a folder', 2: 'no such file or folder',
         13: 'permission denied', 30: 'read-only file system', 5: 'input/output error'}


def saving(name, fn, *a):
    """fn(*a), a save of file `name`; an OSError becomes SaveError saying which file,
    why, how much space is left and that the previous file is kept."""
    try:
        return fn(*a)
    except OSError as e:
        import os
        code = e.args[0] if e.args and type(e.args[0]) is int else getattr(e, 'errno', 0)
        try:
            os.remove(name + '.tmp')       # what the cut save left: free its space
        except OSError:
            pass
        free = ''
        try:
            s = os.statvfs('.')
            free = ', %d bytes free' % (s[0] * s[4])
        except (OSError, AttributeError):
            pass
        raise SaveError('cannot write %s: %s (OSError %s%s); the previous %s is kept'
                        % (name, ERRNO.get(code, 'file system error'), code, free, name))


def mark_resume(cfg_path):
    # set run.resume in train.json, replacing the file atomically
    from utrain.wof import _replace
    with open(cfg_path) as f:
        d = json.load(f)
    if d.setdefault('run', {}).get('resume') is True:
        return
    d['run']['resume'] = True
    with open(cfg_path + '.tmp', 'w') as f:
        json.dump(d, f)
    _replace(cfg_path + '.tmp', cfg_path)


def size(path):
    import os
    try:
        return os.stat(path)[6]
    except OSError:
        return 0


def exists(path):
    # finishes a save cut between removing the old file and the rename (utrain.wof.openr)
    from utrain.wof import exists as ex
    return ex(path)


STATE = {}
# unix MicroPython raises KeyboardInterrupt from a system call that SIGINT cut short;
# when that call was a file's close() in the garbage collector (heap locked), what
# arrives is "MemoryError: memory allocation failed, heap is locked": a Ctrl-C as well
# (utrain never locks the heap itself)
INTR = (KeyboardInterrupt, MemoryError)


def ctrl_c(e):
    # (str(e) would allocate: with the heap locked that fails too)
    return isinstance(e, KeyboardInterrupt) or bool(e.args) and 'locked' in e.args[0]


class Keys:
    """Ctrl-C at safe points.  While training, micropython.kbd_intr(-1) stops the
    UART interrupt (or unix's SIGINT handler) from raising KeyboardInterrupt at any
    moment, half way through an update; the Ctrl-C byte then waits on stdin, and
    check(), called between samples, raises KeyboardInterrupt when one is there.
    (On unix a SIGINT then ends the process like a power cut; `host_tools run` passes
    a terminal's Ctrl-C on as the byte.)"""

    def __init__(self):
        self.p = self.mp = None
        try:
            import micropython
            micropython.kbd_intr(-1)
            self.mp = micropython
        except (ImportError, AttributeError):
            pass
        try:
            import select
            self.p = select.poll()
            self.p.register(sys.stdin, select.POLLIN)
        except (ImportError, AttributeError, OSError, ValueError, TypeError):
            self.p = None

    def check(self):
        p = self.p
        if p is None or not p.poll(0):
            return
        try:
            c = sys.stdin.read(1)
        except (OSError, ValueError):
            c = ''
        if c == '\x03':
            raise KeyboardInterrupt
        if not c:                      # stdin at its end (a pipe closed, /dev/null)
            self.p = None

    def close(self):
        if self.mp:
            self.mp.kbd_intr(3)


def read_config(cfg_path):
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except OSError as e:
        code = e.args[0] if e.args else 0
        raise ValueError('%s: cannot read it (%s): run train.py in the folder prepare wrote'
                         % (cfg_path, ERRNO.get(code, 'OSError %s' % code)))
    except ValueError as e:
        raise ValueError('%s: not valid JSON (%s)' % (cfg_path, e))
    from utrain.config import check
    r = check(cfg, cfg_path)
    drop('config')
    return r


def main(cfg_path='train.json'):
    files, run, cfg = read_config(cfg_path)
    gc.collect()            # the JSON parse's garbage gone before the big arrays come
    out = files['out']
    ckpt = files.get('checkpoint')
    resume = run.get('resume') and ckpt and exists(ckpt)
    start = files['weights']
    if run.get('start') == 'best' and not resume and exists(out):
        start = out           # a nightly run goes on from its best weights
    tr = STATE['tr'] = Trainer(files['model'], start, **cfg)
    c = tr.cfg
    test = Dataset(files['test']) if files.get('test') else None
    metric = c['metric']
    keep = run.get('keep_best', False) and test   # validation-gated saving
    rec = None
    if keep:
        import utrain.best as best
        rec = saving(out + '.best', best.known, tr, out, test)   # trained.wof's result, kept across runs
        drop('best')
    if resume:
        tr.load_checkpoint(ckpt)
        print('resumed from %s at epoch %d' % (ckpt, tr.epoch) + (', sample %d' % tr.pos if tr.pos else ''))
    elif run.get('resume') and ckpt:
        print('utrain: "resume" is set but there is no %s: starting from %s' % (ckpt, start))
    if rec and not (tr.best and tr.best[1:] == rec[1:]):
        tr.best = rec
    if start != files['weights']:
        print('starting from the best weights so far, %s' % start)
    if not files.get('train'):
        print('utrain: no training data in %s: prepare the model with --data' % cfg_path)
        return
    train = Dataset(files['train'])
    fresh = not (tr.epoch or tr.pos)
    S = STATE['s'] = {'saved': tr.best[0] if tr.best else -1, 'ended': tr.epoch, 'logged': -1,
                      't0': ticks_ms()}
    log = STATE['log'] = saving(files['log'], open, files['log'], 'a')
    try:
        run_epochs(tr, files, run, train, test, keep, rec, fresh)
    except INTR as e:
        if ctrl_c(e):
            return interrupted(tr, files, test, keep, train.n, cfg_path)
        raise
    log.close()
    if keep and tr.best:
        print('%s holds the best weights: epoch %d, test_%s %.4f' % (out, tr.best[0], metric, tr.best[2]))
    else:
        saving(out, tr.save_weights, out)
        print('saved %s' % out)
    try:
        gc.collect()
        print('heap in use after training %d B' % gc.mem_alloc())
    except AttributeError:
        pass


def run_epochs(tr, files, run, train, test, keep, rec, fresh):
    c, log, S = tr.cfg, STATE['log'], STATE['s']
    metric, out, ckpt = c['metric'], files['out'], files.get('checkpoint')
    if fresh and size(files['log']) == 0:
        saving(files['log'], log.write, 'epoch,loss,%s,test_loss,test_%s,ms,free_heap\n' % (metric, metric))
    print('utrain: %d train samples, %d test, %s/%s lr %g batch %d, %d epochs, free heap %d'
          % (train.n, test.n if test else 0, c['loss'], c['optimizer'], c['lr'], c['batch'],
             c['epochs'], heap()))
    if rec:
        print('%s so far: test_loss %.4f test_%s %.4f; replaced only by better weights'
              % (out, rec[1], metric, rec[2]))
    if test and fresh:
        tl, tm = tr.evaluate(test)
        print('before training: test_loss %.4f test_%s %.4f' % (tl, metric, tm))
        saving(files['log'], log.write, '0,,,%.6f,%.6f,0,%d\n' % (tl, tm, heap()))
        if keep and tr.better(tl, tm):
            save_best(tr, files, test)
    every = run.get('progress', 0)
    t = [ticks_ms(), tr.pos]

    keys = STATE['keys']

    def progress(i, n, ls, ms):
        keys.check()                 # a Ctrl-C waiting: stop here, between samples
        if every and i % every == 0:
            dt = ticks_diff(ticks_ms(), t[0])
            print('  %d/%d loss %.4f %s %.4f  %.1f samples/s free %d'
                  % (i, n, ls / i, metric, ms / i, 1000 * (i - t[1]) / max(dt, 1), heap()))
            flush()

    while tr.epoch < c['epochs']:
        S['t0'] = t[0] = ticks_ms()
        t[1] = tr.pos
        try:
            saving(ckpt, tr.train_epoch, train, progress, ckpt, run.get('checkpoint_every', 0))
        except Diverged as e:
            if run.get('on_nan', 'lower') != 'lower' or tr.retries >= run.get('max_retries', 3):
                print('utrain: stopped: %s' % e)
                break
            tr.retries += 1
            tr.lower_lr(run.get('lr_factor', 0.5))
            print('utrain: %s; going on with lr %g' % (e, tr.opt.lr))
            S['ended'] = tr.epoch
            continue
        epoch_end(tr, files, test, keep, train.n)   # (tr.last: the epoch's mean loss, metric)


def save_best(tr, files, test):
    # trained.wof, then its record (utrain/best.py); both saves can be redone after a Ctrl-C
    out = files['out']
    saving(out, tr.save_weights, out)
    import utrain.best as best
    saving(out + '.best', best.write, out, tr.best, tr.cfg['metric'], test)
    drop('best')
    STATE['s']['saved'] = tr.best[0]


def epoch_end(tr, files, test, keep, n):
    """Evaluate, keep the best, log and checkpoint the epoch just trained.  Redone whole
    after a Ctrl-C inside it (every step is a save that can be redone, the log line is
    written once)."""
    S, log, c = STATE['s'], STATE['log'], tr.cfg
    l, m = tr.last
    dt = ticks_diff(ticks_ms(), S['t0'])
    metric = c['metric']
    tl = tm = float('nan')
    if test:
        tl, tm = tr.evaluate(test)
    free = heap()
    kept = ''
    if keep:
        if S['saved'] == tr.epoch or tr.best and tr.best[0] == tr.epoch or tr.better(tl, tm):
            if S['saved'] != tr.epoch:      # (a Ctrl-C may have cut this save: redone)
                save_best(tr, files, test)
            kept = '  kept'
        else:
            kept = '  (not better than epoch %d)' % tr.best[0] if tr.best else '  (not kept)'
    if S['logged'] != tr.epoch:
        print('epoch %d/%d loss %.4f %s %.4f test_loss %.4f test_%s %.4f  %d ms '
              '(%.2f ms/sample, %.1f samples/s) free %d%s'
              % (tr.epoch, c['epochs'], l, metric, m, tl, metric, tm, dt,
                 dt / max(n, 1), 1000 * n / max(dt, 1), free, kept))
        flush()
        saving(files['log'], log.write, '%d,%.6f,%.6f,%.6f,%.6f,%d,%d\n' % (tr.epoch, l, m, tl, tm, dt, free))
        S['logged'] = tr.epoch
    saving(files['log'], log.flush)
    if files.get('checkpoint'):
        saving(files['checkpoint'], tr.save_checkpoint, files['checkpoint'])
    S['ended'] = tr.epoch


def interrupted(tr, files, test, keep, n, cfg_path):
    # Ctrl-C: the state at the last whole batch (Trainer.commit) is saved, and train.json
    # marked "resume": true; resume then ends bit for bit as an uninterrupted run would.
    # A Ctrl-C during an update (Trainer.dirty) leaves the checkpoint of the last save,
    # which is whole.  Every step here can be redone, so more Ctrl-Cs only repeat it.
    ckpt = files.get('checkpoint')
    S = STATE['s']
    msg = 'interrupted in epoch %d (no checkpoint file configured)' % (tr.epoch + 1)
    for _ in range(20):
        try:
            if not ckpt:
                break
            if tr.dirty:
                if tr.good:
                    mark_resume(cfg_path)
                    msg = ('interrupted in epoch %d during an update: %s keeps its last save; run '
                           'train.py again to go on from there (%s now says "resume": true)'
                           % (tr.epoch + 1, ckpt, cfg_path))
                else:
                    msg = ('interrupted in epoch %d during an update, before the first checkpoint: '
                           'run train.py again to start over' % (tr.epoch + 1))
                break
            if tr.epoch > S['ended']:     # the epoch is trained, its saves not all done
                epoch_end(tr, files, test, keep, n)    # finish the epoch's saves first
            else:
                tr.net.zero_grads()          # drop a half-summed batch
                tr.pending = 0
                tr.pos, tr.sums = tr.commit
                saving(ckpt, tr.save_checkpoint, ckpt)
            saving(cfg_path, mark_resume, cfg_path)
            msg = ('interrupted in epoch %d at sample %d: saved %s; run train.py again to go on '
                   '(%s now says "resume": true)' % (tr.epoch + 1, tr.pos, ckpt, cfg_path))
            break
        except INTR as e:
            if not ctrl_c(e):
                raise
            msg = 'interrupted again while saving: %s keeps its last whole save' % ckpt
    try:
        STATE['log'].close()
    except (OSError,) + INTR:
        pass
    print(msg)
    flush()


def start(cfg_path='train.json'):
    keys = STATE['keys'] = Keys()
    try:
        main(cfg_path)
    except KeyboardInterrupt:     # while loading: nothing was written yet
        print('utrain: interrupted before training started; nothing was written')
        raise SystemExit(1)
    except MemoryError as e:
        if ctrl_c(e):
            print('utrain: interrupted before training started; nothing was written')
            raise SystemExit(1)
        oom()
    except (ValueError, SaveError) as e:   # a bad file or setting, a full file system: named
        print('utrain: error: %s' % e)
        raise SystemExit(1)
    finally:
        keys.close()


def oom():
    # whatever is on flash is the last good state: saves are atomic and none ran now
    tr = STATE.pop('tr', None)
    at = 'at epoch %d sample %d' % (tr.epoch + 1, tr.pos + 1) if tr else 'loading the model'
    tr = None
    free = heap()
    used = getattr(gc, 'mem_alloc', heap)()
    print('utrain: out of memory %s (heap %d B: %d B free, %d B in use once the trainer is '
          'dropped). The files on flash keep the last saved weights. To fit: prepare --budget '
          '%dK (or --board B) plans the heap and names settings that fit (docs/memory.md): '
          'batch 1, sgd without momentum, --stream, --ranks, --train last:N; precompiled .mpy '
          'code, or a board with more heap.' % (at, free + used, free, used, (free + used) // 1024))
    raise SystemExit(1)
