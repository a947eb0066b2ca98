# utrain: train on the board.  `mpremote run train.py` on a board, or
# `python -m host_tools run DIR` for the simulated board.  Settings come from
# train.json beside this file (a board has no command line); edit it to change
# epochs, learning rate, files.
import gc
import json
import sys
from utrain.trainer import Trainer
from utrain.data import Dataset

try:
    from time import ticks_ms, ticks_diff
except ImportError:  # CPython
    from time import time

    def ticks_ms():
        return int(time() * 1000)

    def ticks_diff(a, b):
        return a - b


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


def exists(path):
    try:
        open(path).close()
        return True
    except OSError:
        return False


def mark_resume(cfg_path):
    # set run.resume in train.json, replacing the file atomically
    from utrain.wof import _replace
    with open(cfg_path) as f:
        d = json.load(f)
    d.setdefault('run', {})['resume'] = True
    with open(cfg_path + '.tmp', 'w') as f:
        json.dump(d, f)
    _replace(cfg_path + '.tmp', cfg_path)


def main(cfg_path='train.json'):
    with open(cfg_path) as f:
        cfg = json.load(f)
    files = cfg.pop('files')
    run = cfg.pop('run', {})
    tr = Trainer(files['model'], files['weights'], **cfg)
    c = tr.cfg
    ckpt = files.get('checkpoint')
    if run.get('resume') and ckpt and exists(ckpt):
        tr.load_checkpoint(ckpt)
        print('resumed from %s at epoch %d' % (ckpt, tr.epoch))
    if not files.get('train'):
        print('utrain: no training data in %s: prepare the model with --data' % cfg_path)
        return
    train = Dataset(files['train'])
    test = Dataset(files['test']) if files.get('test') else None
    metric = c['metric']
    log = open(files.get('log', 'train.log'), 'a' if tr.epoch else 'w')
    if not tr.epoch:
        log.write('epoch,loss,%s,test_loss,test_%s,ms,free_heap\n' % (metric, metric))
    print('utrain: %d train samples, %d test, %s/%s lr %g batch %d, %d epochs, free heap %d'
          % (train.n, test.n if test else 0, c['loss'], c['optimizer'], c['lr'], c['batch'],
             c['epochs'], heap()))
    if test and not tr.epoch:
        tl, tm = tr.evaluate(test)
        print('before training: test_loss %.4f test_%s %.4f' % (tl, metric, tm))
        log.write('0,,,%.6f,%.6f,0,%d\n' % (tl, tm, heap()))
    every = run.get('progress', 0)
    t = [ticks_ms()]

    def progress(i, n, ls, ms):
        if every and i % every == 0:
            dt = ticks_diff(ticks_ms(), t[0])
            print('  %d/%d loss %.4f %s %.4f  %.1f samples/s free %d'
                  % (i, n, ls / i, metric, ms / i, 1000 * i / max(dt, 1), heap()))
            flush()

    try:
        while tr.epoch < c['epochs']:
            t0 = t[0] = ticks_ms()
            l, m = tr.train_epoch(train, progress)
            dt = ticks_diff(ticks_ms(), t0)
            tl = tm = float('nan')
            if test:
                tl, tm = tr.evaluate(test)
            free = heap()
            print('epoch %d/%d loss %.4f %s %.4f test_loss %.4f test_%s %.4f  %d ms '
                  '(%.2f ms/sample, %.1f samples/s) free %d'
                  % (tr.epoch, c['epochs'], l, metric, m, tl, metric, tm, dt,
                     dt / max(train.n, 1), 1000 * train.n / max(dt, 1), free))
            flush()
            log.write('%d,%.6f,%.6f,%.6f,%.6f,%d,%d\n' % (tr.epoch, l, m, tl, tm, dt, free))
            log.flush()
            if ckpt:
                tr.save_checkpoint(ckpt)
    except KeyboardInterrupt:
        # Ctrl-C: keep the updates this epoch made, drop a half-summed batch; train.py
        # resumes from here when train.json says "resume": true (the interrupted epoch
        # starts again from its first sample)
        log.close()
        if ckpt:
            tr.net.zero_grads()
            tr.pending = 0
            tr.save_checkpoint(ckpt)
            if not run.get('resume'):
                mark_resume(cfg_path)
            print('interrupted in epoch %d: saved %s; run train.py again to go on '
                  '(%s now says "resume": true)' % (tr.epoch + 1, ckpt, cfg_path))
        else:
            print('interrupted in epoch %d (no checkpoint file configured)' % (tr.epoch + 1))
        flush()
        return
    log.close()
    tr.save_weights(files['out'])
    print('saved %s' % files['out'])
    try:
        gc.collect()
        print('heap in use after training %d B' % gc.mem_alloc())
    except AttributeError:
        pass


main()
