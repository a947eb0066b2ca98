# What train.py runs (kept here so a board loads it precompiled as .mpy instead of
# compiling it in its heap): load the prepared files named by train.json, evaluate,
# train epoch by epoch with progress lines, a CSV log, checkpoints, validation-gated
# saving, divergence recovery, Ctrl-C and out-of-memory handling (README).
import gc
import json
import sys
from utrain.trainer import Trainer, Diverged
from utrain.model import drop
from utrain.data import Dataset

try:
    from time import ticks_ms, ticks_diff
except ImportError:  # CPython
    from time import time

    def ticks_ms():
        return int(time() * 1000)

    def ticks_diff(a, b):
        return a - b


def exists(path):
    # utrain.wof's: it first finishes a save a power cut left as path + '.tmp'; the
    # module is dropped again after (it stays off the heap between saves)
    from utrain import wof
    try:
        return wof.exists(path)
    finally:
        drop('wof')


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


def mark_resume(cfg_path):
    # set run.resume in train.json, replacing the file atomically
    from utrain.wof import _replace
    with open(cfg_path) as f:
        d = json.load(f)
    d.setdefault('run', {})['resume'] = True
    with open(cfg_path + '.tmp', 'w') as f:
        json.dump(d, f)
    _replace(cfg_path + '.tmp', cfg_path)


STATE = {}
END = 'utrain: end: '     # + 'ok' or what stopped the run: host_tools/board.py reads it


def main(cfg_path='train.json'):
    with open(cfg_path) as f:
        cfg = json.load(f)
    files = cfg.pop('files')
    run = cfg.pop('run', {})
    if 'gc_every' in run:
        gc_every(run['gc_every'])
    sel = cfg.pop('select', None)
    ckpt = files.get('checkpoint')
    resume = run.get('resume') and ckpt and exists(ckpt)
    keep = None
    if sel:                 # prepare --select board: the board chooses what trains
        from utrain import fisher
        if resume:
            keep = fisher.read(ckpt)
        elif files.get('train'):
            keep = fisher.Chooser(files['train'], sel, cfg)     # on the Trainer's net
        fisher = None
    gc.collect()            # the JSON parse's garbage gone before the big arrays come
    tr = STATE['tr'] = Trainer(files['model'], files['weights'], keep=keep, **cfg)
    keep = None             # (a Chooser holds utrain.fisher's code)
    c = tr.cfg
    if resume:
        tr.load_checkpoint(ckpt)
        print('resumed from %s at epoch %d' % (ckpt, tr.epoch) + (', sample %d' % tr.pos if tr.pos else ''))
    if not files.get('train'):
        return 'no training data in %s: prepare the model with --data' % cfg_path
    train = Dataset(files['train'])
    test = Dataset(files['test']) if files.get('test') else None
    metric = c['metric']
    fresh = not (tr.epoch or tr.pos)
    keep = run.get('keep_best') and test   # validation-gated saving
    log = open(files.get('log', 'train.log'), 'w' if fresh else 'a')
    if fresh:
        log.write('epoch,loss,%s,test_loss,test_%s,ms,free_heap\n' % (metric, metric))
    print('utrain: %d train samples, %d test, %s/%s lr %g batch %d, %d epochs, free heap %d'
          % (train.n, test.n if test else 0, c['loss'], c['optimizer'], c['lr'], c['batch'],
             c['epochs'], heap()))
    if test and fresh:
        tl, tm = tr.evaluate(test)
        print('before training: test_loss %.4f test_%s %.4f' % (tl, metric, tm))
        log.write('0,,,%.6f,%.6f,0,%d\n' % (tl, tm, heap()))
        if keep and tr.better(tl, tm):
            tr.save_weights(files['out'])
    every = run.get('progress', 0)
    t = [ticks_ms(), tr.pos]
    why = None

    def progress(i, n, ls, ms):
        if every and i % every == 0:
            dt = ticks_diff(ticks_ms(), t[0])
            print('  %d/%d loss %.4f %s %.4f  %.1f samples/s free %d'
                  % (i, n, ls / i, metric, ms / i, 1000 * (i - t[1]) / max(dt, 1), heap()))
            flush()

    try:
        while tr.epoch < c['epochs']:
            t0 = t[0] = ticks_ms()
            t[1] = tr.pos
            try:
                l, m = tr.train_epoch(train, progress, ckpt, run.get('checkpoint_every', 0))
            except Diverged as e:
                if run.get('on_nan', 'lower') != 'lower' or tr.retries >= run.get('max_retries', 3):
                    why = 'stopped: %s' % e
                    print('utrain: ' + why)
                    break
                tr.retries += 1
                tr.lower_lr(run.get('lr_factor', 0.5))
                print('utrain: %s; going on with lr %g' % (e, tr.opt.lr))
                continue
            dt = ticks_diff(ticks_ms(), t0)
            tl = tm = float('nan')
            if test:
                tl, tm = tr.evaluate(test)
            free = heap()
            kept = ''
            if keep:
                if tr.better(tl, tm):
                    tr.save_weights(files['out'])
                    kept = '  kept'
                else:
                    kept = '  (not better than epoch %d)' % tr.best[0] if tr.best else '  (not kept)'
            print('epoch %d/%d loss %.4f %s %.4f test_loss %.4f test_%s %.4f  %d ms '
                  '(%.2f ms/sample, %.1f samples/s) free %d%s'
                  % (tr.epoch, c['epochs'], l, metric, m, tl, metric, tm, dt,
                     dt / max(train.n, 1), 1000 * train.n / max(dt, 1), free, kept))
            flush()
            log.write('%d,%.6f,%.6f,%.6f,%.6f,%d,%d\n' % (tr.epoch, l, m, tl, tm, dt, free))
            log.flush()
            if ckpt:
                tr.save_checkpoint(ckpt)
    except KeyboardInterrupt:
        return interrupted(tr, log, ckpt, run, cfg_path)
    log.close()
    if keep and tr.best:
        print('%s holds the best weights: epoch %d, test_%s %.4f' % (files['out'], tr.best[0], metric, tr.best[2]))
    else:
        tr.save_weights(files['out'])
        print('saved %s' % files['out'])
    try:
        gc.collect()
        print('heap in use after training %d B' % gc.mem_alloc())
    except AttributeError:
        pass
    return why


def interrupted(tr, log, ckpt, run, cfg_path):
    # Ctrl-C: drop a half-summed batch and save where its first sample is, so
    # train.py resumes there when train.json says "resume": true
    log.close()
    if ckpt:
        tr.net.sink.zero()
        tr.pos -= min(tr.pending, tr.pos)
        tr.pending = 0
        tr.save_checkpoint(ckpt)
        if not run.get('resume'):
            mark_resume(cfg_path)
        print('interrupted in epoch %d at sample %d: saved %s; run train.py again to go on '
              '(%s now says "resume": true)' % (tr.epoch + 1, tr.pos, ckpt, cfg_path))
    else:
        print('interrupted in epoch %d (no checkpoint file configured)' % (tr.epoch + 1))
    return 'interrupted'


def gc_every(n):
    # Collect whenever 1/n of the heap was allocated since the last collection (n = 0:
    # only when the heap is full).  A training step frees and remakes its activations
    # and temporaries; collected only when the heap is full, the large ones end up beyond
    # small survivors and the heap fragments until one no longer fits (a 16x16 CNN on
    # 32-bit ulab trained in 110 KB but not in 111-121 KB; collected every 1/32 of the
    # heap, in any heap from 93 KB up; it costs time, docs/memory.md).  train.json's
    # run.gc_every sets n: prepare writes 32 where activations are large next to the
    # heap, else 0 (it costs time).  The Trainer sets its own while loading.
    try:
        gc.threshold(((gc.mem_free() + gc.mem_alloc()) // n) if n else -1)
    except AttributeError:      # CPython
        pass


def start(cfg_path='train.json'):
    # the imports are done (train.py collected every 2 KB while they loaded)
    gc_every(0)
    try:
        why = main(cfg_path)
    except ValueError as e:   # a bad file or setting: the message names it
        why = 'error: %s' % e
        print('utrain: ' + why)
    except MemoryError:
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
        why = 'out of memory ' + at
    end(why)


def end(why):
    # The run's last line says how it ended: a serial line carries no exit status
    # (`mpremote run` exits 0 whatever the script did), so the host reads this line
    # (host_tools/board.py).  A command line (unix MicroPython, CPython) also gets it as
    # the exit status; on a board a SystemExit would soft-reset it (unix -i: exit).
    print(END + (why or 'ok'))
    flush()
    if why and sys.argv and sys.argv[0]:
        raise SystemExit(1)
