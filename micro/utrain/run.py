# What train.py runs (kept here so a board loads it precompiled as .mpy instead of
# compiling it in its heap): check train.json (utrain/config.py), load the prepared
# files it names, evaluate, train epoch by epoch with progress lines, a CSV log,
# checkpoints, validation-gated saving of the best weights across runs (utrain/best.py),
# divergence recovery, Ctrl-C, file-system and out-of-memory handling (README).
import gc
import sys
from utrain import drop

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


def free(what=' free '):
    # ' free N' for a line, '' where there is no heap to tell (CPython)
    h = heap()
    return '' if h < 0 else '%s%d' % (what, h)


def flush():
    # a serial terminal (or mpremote) shows the line now, not when a buffer fills
    try:
        sys.stdout.flush()
    except AttributeError:
        pass




def aux(mod, fn, *a):
    # utrain.<mod>.<fn>(*a), the module loaded for the call and dropped after: held by
    # no name, its code leaves the heap (code is heap on a board)
    __import__('utrain.' + mod)
    try:
        return getattr(getattr(sys.modules['utrain'], mod), fn)(*a)
    finally:
        drop(mod)


def saving(name, fn, *a):
    """fn(*a), a save of file `name`; an OSError becomes SaveError saying which file,
    why, how much space is left and that the previous file is kept (utrain/once.py)."""
    try:
        return fn(*a)
    except OSError as e:
        raise SaveError(aux('once', 'fs_error', name, e))


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
        self.p = self.k = None
        try:
            from micropython import kbd_intr
            kbd_intr(-1)
            self.k = kbd_intr
        except ImportError:
            pass
        try:
            import select
            self.p = select.poll()
            self.p.register(sys.stdin, 1)      # POLLIN
        except Exception:
            self.p = None

    def check(self):
        if self.p and self.p.poll(0):
            try:
                c = sys.stdin.read(1)
            except Exception:
                c = ''
            if c == '\x03':
                raise KeyboardInterrupt
            if not c:                  # stdin at its end (a pipe closed, /dev/null)
                self.p = None

    def close(self):
        if self.k:
            self.k(3)


END = 'utrain: end: '     # + 'ok' or what stopped the run: host_tools/boards/board.py reads it


def main(cfg_path='train.json'):
    """Train as train.json says; returns None when the run ended well, else what
    stopped it (for the end line)."""
    files, run, cfg, start, resume, sel = aux('config', 'read_config', cfg_path)
    STATE['planned'] = run.get('planned')   # (prepare's heap plan, for an out-of-memory end)
    chosen = None
    raw = files['model'].endswith('.json')  # an int8 model training as int8 (utrain.q8)
    # an int8 run reads train.log's last epoch while the heap is empty: utrain.once's
    # code, loaded after the net and the datasets, was its load's peak (the held-out small
    # CNN --int8 --cache --train last:2: 108.5 -> 104.4 KB on 64-bit unix).  (A float run
    # reads it there still: a ulab conv net, Adam b4, laid out otherwise, needed 3 % more)
    logged = raw and aux('logtail', 'last_logged', files, resume, start)
    if sel:                 # prepare --select board: the board chooses what trains
        if resume:
            chosen = aux('q8keep' if raw else 'chosen', 'read', files['checkpoint'])
        else:               # on a net of its own, all garbage before the Trainer loads
            chosen = aux('q8fish' if raw else 'fisher', 'choose_on', files['model'], start,
                         files['train'], sel, cfg)
            if raw and files.get('checkpoint'):     # (the float one: in the checkpoint)
                aux('q8keep', 'save', files['checkpoint'], chosen)
        sel = None          # (its configurations: not held while training)
    # the trainer's code loads after train.json's check, into the space the check's code
    # and the JSON parse left (collected first): loaded before it, that space would stay
    # holes between the names the check interned, too small for the arrays to come
    gc.collect()
    if files.get('prefix'):
        # an int8 run's frozen prefix, once per sample (utrain.q8prefix), before the
        # trainer's code loads: the pass needs none of it (loaded first, q8train's code
        # was 6 KB of the pass's peak: the int8 MobileNetV2's classifier run needed 175
        # KB on 32-bit unix, now 169), and its code and buffers are garbage after it;
        # its net loads and the trainer's code loads as train.py's code did (collected
        # every 2 KB), its samples run as training does (run.gc_every)
        aux('q8prefix', 'make', files, None, run.get('gc_every', 0))
        gc.collect()
        gc_every(2048)
    STATE['code'] = 1       # (set before: under a MemoryError it could not be)
    if run.get('save_reserve'):
        # held before the net's load cuts the heap up (utrain.wof), after the prefix pass
        # (a phase the plan prices without the save)
        aux('wof', 'hold', run['save_reserve'])
    if raw:         # (utrain.q8: no float trainer code; it reads a sample's bytes itself)
        from utrain.q8train import Q8Trainer as T
    else:
        from utrain.trainer import Trainer as T
    from utrain.data import Dataset
    for m in run.get('steps', ()):  # the kernels' step modules (prepare names them): with the
        try:                        # code, not where a step's arrays were (docs/memory.md)
            __import__('utrain.' + m)
        except ImportError as e:    # (a name edited in: an ImportError's traceback had ended it)
            if m not in str(e):
                raise
            raise ValueError(aux('once', 'no_step', cfg_path, m))
    del STATE['code']
    gc.collect()
    # the code is in (train.py collected every 2 KB while it loaded, so that its
    # temporaries left no sieve); training collects as prepare chose (the Trainer sets
    # its own threshold while it loads the model)
    gc_every(run.get('gc_every', 0))
    out = files['out']
    tr = STATE['tr'] = T(files['model'], start, keep=chosen, **cfg)
    chosen = None
    tr.cache = run.get('cache', False)      # the frozen-prefix cache (docs/memory.md)
    c = tr.cfg
    metric = c['metric']
    ckpt = files.get('checkpoint')
    if resume:
        aux('once', 'resume', tr, ckpt)
    test = Dataset(files['test'], not raw) if files.get('test') else None
    keep = run.get('keep_best', False) and test   # validation-gated saving
    rec = None
    if keep:                 # trained.wof's test result, kept across runs
        rec = saving(out + '.best', aux, 'best', 'known', tr, out, test)
    train = Dataset(files['train'], not raw)
    if not raw:     # (samples of another model, found after train.log's row 0 was written)
        train.check(tr.x_shape, tr.y_shape)
    if tr.cache == 'host':      # prepare made the prefix caches: the prefix's tables go
        from utrain.prefix import drop
        drop(tr, (train, test))
    fresh = not (tr.epoch or tr.pos)
    S = STATE['s'] = {'saved': tr.best[0] if tr.best else -1, 'ended': tr.epoch, 'rec': rec,
                      'logged': logged if raw else aux('logtail', 'last_logged', files, resume, start),
                      't0': ticks_ms()}
    log = STATE['log'] = saving(files['log'], open, files['log'], 'a')
    try:
        why = run_epochs(tr, files, run, train, test, keep, rec, fresh)
    except INTR as e:
        if ctrl_c(e):
            aux('once', 'interrupted', tr, files, test, keep, train.n, cfg_path)
            return 'interrupted'
        raise
    log.close()
    if not (keep and tr.best):
        saving(out, tr.save_weights, out)
    aux('once', 'finished', tr, out, keep, metric, why)     # (its words: not held)
    return why


class _Never(Exception):
    pass


def run_epochs(tr, files, run, train, test, keep, rec, fresh):
    # (the int8 trainer loads no float trainer code and never diverges)
    Diverged = getattr(sys.modules.get('utrain.trainer'), 'Diverged', _Never)
    c, log, S = tr.cfg, STATE['log'], STATE['s']
    metric, out, ckpt = c['metric'], files['out'], files.get('checkpoint')
    if fresh and S['logged'] != -1:    # a header a run (utrain.logtail.last_logged)
        saving(files['log'], log.write, 'epoch,loss,%s,test_loss,test_%s,ms,free_heap\n' % (metric, metric))
    print('utrain: %d train samples, %d test, %s/%s lr %g batch %d, %d epochs%s'
          % (train.n, test.n if test else 0, c['loss'], c['optimizer'], c['lr'], c['batch'],
             c['epochs'], free(', free heap ')))
    if test and fresh:
        tl, tm = tr.evaluate(test)
        print('before training: test_loss %.4f test_%s %.4f' % (tl, metric, tm))
        saving(files['log'], log.write, '0,,,%.6f,%.6f,0,%s\n' % (tl, tm, free('')))
        if keep and tr.better(tl, tm):
            save_best(tr, files, test)
    S['crc'] = (tr.epoch, aux('still', 'stamp', tr))
    every = run.get('progress', 0)
    t = [ticks_ms(), tr.pos]
    why = None

    keys = STATE['keys']

    def progress(i, n, ls, ms):
        keys.check()                 # a Ctrl-C waiting: stop here, between samples
        if every and i % every == 0:
            dt = ticks_diff(ticks_ms(), t[0])
            k = max(i - t[1], 1)           # samples run since the epoch (or resume) began
            # eta: the samples left in the run at this epoch's pace (evaluation not counted)
            print('  %d/%d loss %.4f %s %.4f  %.1f samples/s eta %ds%s'
                  % (i, n, ls / i, metric, ms / i, 1000 * k / max(dt, 1),
                     dt * (n - i + n * (c['epochs'] - tr.epoch - 1)) // k // 1000, free()))
            flush()

    while tr.epoch < c['epochs']:
        S['t0'] = t[0] = ticks_ms()
        S['p0'] = t[1] = tr.pos
        try:
            saving(ckpt, tr.train_epoch, train, progress, ckpt, run.get('checkpoint_every', 0))
        except Diverged as e:
            if run.get('on_nan', 'lower') != 'lower' or tr.retries >= run.get('max_retries', 3):
                # (the weights kept are the last good ones: no NaN saved or logged)
                why = ('stopped: %s; lower "lr" in train.json (%g) and run again%s'
                       % (e, c['lr'], ' with "resume": true' if tr.good else ''))
                print('utrain: ' + why)
                break
            tr.retries += 1
            tr.lower_lr(run.get('lr_factor', 0.5))
            print('utrain: %s; going on with lr %g' % (e, tr.opt.lr))
            S['ended'] = tr.epoch
            continue
        epoch_end(tr, files, test, keep, train.n)   # (tr.last: the epoch's mean loss, metric)
    return why


def save_best(tr, files, test):
    # trained.wof, then its record; both saves can be redone after a Ctrl-C
    aux('best', 'save', tr, files['out'], test)


def epoch_end(tr, files, test, keep, n):
    """Evaluate, keep the best, log and checkpoint the epoch just trained.  Redone whole
    after a Ctrl-C inside it (every step is a save that can be redone, the log line is
    written once)."""
    S, log, c = STATE['s'], STATE['log'], tr.cfg
    l, m = tr.last
    dt = ticks_diff(ticks_ms(), S['t0'])
    k = max(n - S.get('p0', 0), 1)     # the samples this run trained of the epoch (a resume: fewer)
    metric = c['metric']
    tl = tm = float('nan')
    if test:
        tl, tm = tr.evaluate(test)
    fr = free('')
    kept = ''
    if keep:
        if S['saved'] == tr.epoch or tr.best and tr.best[0] == tr.epoch or tr.better(tl, tm):
            if S['saved'] != tr.epoch:      # (a Ctrl-C may have cut this save: redone)
                save_best(tr, files, test)
            kept = '  kept'
        else:
            kept = None     # (not better than what: utrain.still says)
    kept = aux('still', 'moved', tr, S, files, kept)
    if S['logged'] != tr.epoch:
        left = c['epochs'] - tr.epoch
        # (no test set: no test figures, rather than 'test_loss nan'; the log's fields empty)
        tt = ' test_loss %.4f test_%s %.4f' % (tl, metric, tm) if test else ''
        print('epoch %d/%d loss %.4f %s %.4f%s  %d ms '
              '(%.2f ms/sample, %.1f samples/s%s)%s%s%s'
              % (tr.epoch, c['epochs'], l, metric, m, tt, dt, dt / k,
                 1000 * k / max(dt, 1), '' if k == n else ' over %d samples' % k,
                 ' free ' + fr if fr else '', ' eta %ds run' % (dt * n // k * left // 1000)
                 if left else '', kept))
        flush()
        saving(files['log'], log.write, '%d,%.6f,%.6f,%s,%d,%s\n' % (
            tr.epoch, l, m, '%.6f,%.6f' % (tl, tm) if test else ',', dt, fr))
        S['logged'] = tr.epoch
    saving(files['log'], log.flush)
    if files.get('checkpoint'):
        saving(files['checkpoint'], tr.save_checkpoint, files['checkpoint'])
    S['ended'] = tr.epoch


def gc_every(n):
    # Collect whenever n bytes were allocated since the last collection (0: only when the
    # heap is full).  A training step frees and remakes its activations and temporaries;
    # collected only when the heap is full, the large ones end up beyond small survivors
    # and the heap fragments until one no longer fits (a 16x16 CNN on 32-bit ulab trained
    # in 110 KB but not in 111-121 KB).  n is bytes, not a share of this heap: the
    # collections then fall at the same allocations in every heap, which lays the step
    # out alike in all of them and makes the smallest heap that trains the edge above
    # which all train (a share of the heap moved them with its size: that CNN trained
    # in 96 and 102 KB but not in 98 or 100).  train.json's run.gc_every sets n: prepare
    # writes the model's (an eighth of its largest activation, at least 4 KB) where
    # activations are large next to the plan, else 0; utrain.model collects at op
    # boundaries too, once the outputs made reach n (docs/memory.md).  The Trainer sets
    # its own while it loads the model.  (Below 1024, a folder prepared before:
    # utrain.config makes it the bytes it was.)
    try:
        gc.threshold(n or -1)
    except AttributeError:      # CPython
        pass


def start(cfg_path='train.json'):
    keys = STATE['keys'] = Keys()
    if sys.implementation.name != 'micropython':    # (nothing loaded on a board)
        try:        # (CPython's numpy: a NaN/Inf is the trainer's to report, not a warning's)
            import numpy
            numpy.seterr(all='ignore')
        except ImportError:
            pass
    try:
        why = main(cfg_path)
    except INTR as e:             # a Ctrl-C while loading, or out of memory
        if 'code' in STATE:
            raise                 # loading the code: train.py says so
        tr = STATE.pop('tr', None)   # dropped before loading what says so
        # (an epoch trained whose end, its evaluation, save or log, had not finished: after
        # it, not 'at epoch N+1 sample 1'; the trainer made, no epoch begun (p0): False,
        # before training: its datasets, the best record, the log, the first evaluation)
        S = STATE.get('s') or {}
        at = tr and 'p0' in S and (tr.epoch, tr.pos, S.get('ended', tr.epoch) != tr.epoch and not tr.pos)
        tr = None
        gc.collect()
        why = aux('once', 'oom', e, at)
    except (ValueError, SaveError) as e:   # a bad file or setting, a full file system: named
        why = 'error: %s' % e
        print('utrain: ' + why)
    except Exception as e:        # what utrain does not expect: its traceback, then the end line
        why = aux('once', 'unexpected', e)
    finally:
        keys.close()
    end(why)


def end(why):
    # The run's last line says how it ended: a serial line carries no exit status
    # (`mpremote run` exits 0 whatever the script did), so the host reads this line
    # (host_tools/boards/board.py).  A command line (unix MicroPython, CPython) also gets it as
    # the exit status (a Ctrl-C is the user's stop, not a failure); on a board a
    # SystemExit would soft-reset it (unix -i: exit).
    print(END + (why or 'ok'))
    flush()
    if why and why != 'interrupted' and sys.argv and sys.argv[0]:
        raise SystemExit(1)
