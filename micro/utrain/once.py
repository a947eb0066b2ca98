# The parts of a run that happen once, loaded only then and dropped after (code is
# heap; utrain/run.py is what stays loaded while training): reading and checking
# train.json (utrain/config.py), the best weights' record and resuming at start, and a
# run that ends badly: a Ctrl-C, a file-system error, out of memory.
import gc
import json
import sys
from utrain.run import STATE, SaveError, INTR, ctrl_c, saving, epoch_end, flush, heap, drop


ERRNO = {28: 'no space left on the file system', 21: 'it is a folder', 2: 'no such file or folder',
         13: 'permission denied', 30: 'read-only file system', 5: 'input/output error'}




def resume(tr, ckpt):
    # the checkpoint read into trainer tr, and where it goes on ("epochs" edited down to
    # the checkpoint's: the run had ended 'ok', unsaid)
    tr.load_checkpoint(ckpt)
    n = tr.cfg['epochs']
    print('resumed from %s at epoch %d, sample %d%s' % (ckpt, tr.epoch, tr.pos, (
        ': nothing to train ("epochs" %d)' % n) * (tr.epoch >= n)))


def fs_error(name, e):
    """What to say about OSError e while writing file `name`."""
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
    return ('cannot write %s: %s (OSError %s%s); the previous %s is kept'
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
                tr.net.sink.zero()           # drop a half-summed batch
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


def oom(e, at):
    if ctrl_c(e):              # while loading: nothing was written yet
        print('utrain: interrupted before training started; nothing was written')
        return 'interrupted'
    # whatever is on flash is the last good state: saves are atomic and none ran now
    at = ('after epoch %d (its evaluation, save or log)' % at[0] if at[2] else
          'at epoch %d sample %d' % (at[0] + 1, at[1] + 1)) if at else 'before training' if (
        at is False) else e.args[0] if e.args and str(e.args[0])[:3] == 'in ' else 'loading the model'
    free = heap()
    used = getattr(gc, 'mem_alloc', heap)()
    p = STATE.get('planned')
    print('utrain: out of memory %s (heap %d B: %d B free, %d B in use once the trainer is '
          'dropped). The files on flash keep the last saved weights. To fit: prepare %s '
          '--budget %dK plans the heap and names settings that fit (docs/memory.md): '
          'batch 1, sgd without momentum, --stream, --ranks, --train last:N; precompiled .mpy '
          'code, or a board with more heap.'
          % (at, free + used, free, used, 'planned this run at %d KB, %s: prepare again with a '
             'budget below this heap, e.g.' % (p // 1024, 'more than this heap' if p > free + used
                                                else 'short of what it took here') if p else 'with',
             (free + used) * (9 if p else 10) // 10240))
    return 'out of memory ' + at


def unexpected(e):
    # an exception utrain does not expect: its traceback, and the end line's words
    try:
        sys.print_exception(e)
    except AttributeError:    # CPython
        import traceback
        traceback.print_exception(e)
    return 'error: %s: %s' % (type(e).__name__, e)


def finished(tr, out, keep, metric, why):
    # run.main's last line: where the weights are
    b = tr.best
    if keep and b:
        r = STATE['s'].get('rec')      # (trained.wof's result before this run: epoch 0)
        print('%s holds the best weights: %s, test_%s %.4f' % (
            out, 'epoch %d' % b[0] if b[0] or not r or r[1:] != b[1:] else
            'still those it held before this run (none of its epochs beat them)', metric, b[2]))
    else:
        print('saved %s%s' % (out, ' (the last good weights, restored)' if why else ''))


def no_step(cfg_path, m):
    # run.main's refusal of a "run.steps" name that is no module
    return '%s: "run.steps" names "%s", which is no utrain module' % (cfg_path, m)
