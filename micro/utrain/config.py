# train.json, checked whole before anything is loaded or written (imported by run.py
# for that and dropped after: code is heap).  check(cfg, path) raises ValueError
#   train.json: "lr" must be a number > 0 (got "0.01")
# for the first thing wrong: a type, a missing key, a value out of range, an unknown
# name, a file name that is not a plain file of the run folder (no '/', '..'), an
# input file that is missing or a folder, an output that is also an input.
import os
import json

SETTINGS = ('loss', 'reduction', 'from_logits', 'optimizer', 'metric', 'shuffle', 'batch',
            'epochs', 'seed', 'lr', 'momentum', 'beta1', 'beta2', 'eps', 'rho', 'stream',
            'weight_decay', 'schedule', 'warmup', 'schedule_steps', 'step_size', 'gamma',
            'min_lr')
ENUMS = {'loss': ('mse', 'mae', 'cce', 'scce', 'bce'), 'reduction': ('mean', 'sum'),
         'optimizer': ('sgd', 'adam', 'rmsprop', 'adamw'), 'metric': ('accuracy', 'mae'),
         'on_nan': ('lower', 'stop'), 'start': ('weights', 'best'),
         'schedule': ('constant', 'linear', 'step', 'cosine')}
BOOLS = ('from_logits', 'shuffle', 'stream', 'resume', 'keep_best')
# integers: (lowest, highest) as model.flat and the checkpoint store them
INTS = {'batch': (1, 65535), 'epochs': (0, 65535), 'seed': (0, 0xFFFFFFFF),
        'progress': (0, 0xFFFFFFFF), 'checkpoint_every': (0, 0xFFFFFFFF), 'max_retries': (0, 1000),
        'gc_every': (0, 0xFFFFFFFF), 'planned': (0, 0xFFFFFFFF), 'save_reserve': (0, 0xFFFF),
        'warmup': (0, 0xFFFFFFFF), 'schedule_steps': (0, 0xFFFFFFFF), 'step_size': (1, 0xFFFFFFFF),
        'fingerprint': (0, 0xFFFFFFFF)}
# numbers: (lowest, highest, lowest excluded, highest excluded)
NUMS = {'lr': (0, None, 1, 0), 'momentum': (0, 1, 0, 1), 'beta1': (0, 1, 0, 1),
        'beta2': (0, 1, 0, 1), 'eps': (0, 1, 1, 0), 'rho': (0, 1, 0, 1), 'lr_factor': (0, 1, 1, 0),
        'weight_decay': (0, None, 0, 0), 'gamma': (0, 1, 1, 0), 'min_lr': (0, 1, 0, 0)}
RUN = ('resume', 'progress', 'checkpoint_every', 'keep_best', 'on_nan', 'lr_factor',
       'max_retries', 'start', 'cache', 'gc_every', 'planned', 'save_reserve', 'steps',
       'fingerprint')
INPUTS = ('model', 'weights', 'train', 'test', 'quant', 'prefix')   # int8: q8.req, q8.json
OUTPUTS = ('out', 'checkpoint', 'log')
FILES = INPUTS + OUTPUTS + ('rewritten',)    # rewritten: the host's export reads it
NEEDED = ('model', 'weights', 'out')
# select: prepare --select board's block (utrain/fisher.py): samples scored, layers trained
# besides the classifier, the share of the classifier's potential a layer must reach;
# with the host's priors, configs [[gain, heap, [[tensor, axis, width, lo], ...]], ...] and
# proxy [[op, share], ...] (lists, read by utrain/fisher.py)
SELECT = {'samples': (1, 0xFFFF), 'layers': (0, 0xFFFF)}


def shown(v):
    try:
        import json
        s = json.dumps(v)
    except Exception:
        try:
            s = repr(v)
        except Exception:           # nested too deeply for either (RuntimeError)
            s = '[' * 36
    return s if len(s) < 40 else s[:36] + '...'


def bad(path, key, want, v):
    return ValueError('%s: "%s" must be %s (got %s)' % (path, key, want, shown(v)))


def isdir(p):
    try:
        return os.stat(p)[0] & 0x4000 != 0
    except OSError:
        return False


def isfile(p):
    try:
        return os.stat(p)[0] & 0x8000 != 0
    except OSError:
        return False


def number(v):
    # not bool, not NaN or Inf, nor a whole number beyond a float's (JSON's 1 and 400
    # zeros had been an OverflowError's traceback under CPython, inf on a board)
    return type(v) in (int, float) and v - v == 0 and -1.7e308 < v < 1.7e308


def check_value(path, k, v):
    if k == 'cache':            # the frozen-prefix cache: made by the board, by prepare, none
        if type(v) is not bool and v != 'host':
            raise bad(path, k, 'true, false or "host"', v)
    elif k == 'steps':          # the kernels' step modules utrain.run loads with the code
        if type(v) is not list or [m for m in v if type(m) is not str or '.' in m]:
            raise bad(path, k, 'a list of utrain module names, as prepare writes it', v)
    elif k in ENUMS:
        if v not in ENUMS[k] or type(v) is not str:
            raise bad(path, k, 'one of ' + ', '.join(ENUMS[k]), v)
    elif k in BOOLS:
        if type(v) is not bool:
            raise bad(path, k, 'true or false', v)
    elif k in INTS:
        lo, hi = INTS[k]
        if type(v) is not int or not lo <= v <= hi:
            raise bad(path, k, 'a whole number from %d to %d' % (lo, hi), v)
    elif k in NUMS:
        lo, hi, xlo, xhi = NUMS[k]
        if not (number(v) and (lo < v if xlo else lo <= v)
                and (hi is None or (v < hi if xhi else v <= hi))):
            raise bad(path, k, 'a number %s %g%s' % ('>' if xlo else '>=', lo, '' if hi is None
                      else (' and < %g' % hi) if xhi else (' and <= %g' % hi)), v)


def plain(path, key, name):
    if type(name) is not str or not name or '/' in name or '\\' in name or name in ('.', '..') \
            or '\0' in name or ':' in name:
        raise bad(path, 'files.' + key, 'a plain file name in the run folder (no folders)', name)


def settings(cfg, run, path):
    # the training settings and run.*, each and together (the host's prepare checks what
    # it writes with this too: host_tools/prepare/runfolder.py)
    for k in cfg:
        if k not in SETTINGS and k not in ('files', 'run', 'select'):
            raise ValueError('%s: unknown setting "%s" (known: %s, files, run, select)'
                             % (path, k, ', '.join(SETTINGS)))
        if k in SETTINGS:
            check_value(path, k, cfg[k])
    if cfg.get('schedule') in ('linear', 'cosine') and cfg.get('schedule_steps', 0) <= cfg.get('warmup', 0):
        raise bad(path, 'schedule_steps', 'the update a %s decay ends at, above "warmup"'
                  % cfg['schedule'], cfg.get('schedule_steps', 0))
    wd, lr = cfg.get('weight_decay', 0), cfg.get('lr')
    if wd and lr and cfg.get('optimizer') in ('sgd', 'adamw') and wd * lr >= 1:
        # (as prepare refuses it: each step multiplies the weights by 1 - lr x weight_decay;
        # the run had diverged and its stop said to lower "lr")
        raise bad(path, 'weight_decay', 'below 1 / "lr" = %g under %s (0.0001 to 0.01 is usual)'
                  % (1 / lr, cfg['optimizer']), wd)
    for k in run:
        if k not in RUN:
            raise ValueError('%s: unknown setting "run.%s" (known: %s)' % (path, k, ', '.join(RUN)))
        check_value(path, k, run[k])


def check(cfg, path='train.json'):
    """Validate the parsed train.json; returns (files, run, settings) or raises ValueError."""
    if type(cfg) is not dict:
        raise ValueError('%s: must be a JSON object {...} (got %s)' % (path, shown(cfg)))
    files = cfg.get('files')
    if type(files) is not dict:
        raise bad(path, 'files', 'an object naming the model, weights and output files', files)
    run = cfg.get('run', {})
    if type(run) is not dict:
        raise bad(path, 'run', 'an object', run)
    settings(cfg, run, path)
    sel = cfg.get('select')
    if sel is not None:
        if type(sel) is not dict:
            raise bad(path, 'select', 'an object (samples, layers, share)', sel)
        for k in sel:
            if k in SELECT:
                lo, hi = SELECT[k]
                if type(sel[k]) is not int or not lo <= sel[k] <= hi:
                    raise bad(path, 'select.' + k, 'a whole number from %d to %d' % (lo, hi), sel[k])
            elif k == 'share':
                if not (number(sel[k]) and 0 <= sel[k] <= 1):
                    raise bad(path, 'select.share', 'a number >= 0 and <= 1', sel[k])
            elif k in ('configs', 'proxy'):
                if type(sel[k]) is not list:
                    raise bad(path, 'select.' + k, 'a list (written by prepare --select board)', sel[k])
            else:
                raise ValueError('%s: unknown setting "select.%s" (known: samples, layers, share, '
                                 'configs, proxy)' % (path, k))
    for k in files:
        if k not in FILES:
            raise ValueError('%s: unknown file "files.%s" (known: %s)' % (path, k, ', '.join(FILES)))
        if files[k] is not None:
            plain(path, k, files[k])
    if files.get('log') is None:    # (null had been a TypeError in utrain.once)
        files['log'] = 'train.log'
    for k in NEEDED:
        if files.get(k) is None:
            raise bad(path, 'files.' + k, 'a file name', files.get(k))
    for k in INPUTS:
        p = files.get(k)
        if p is not None and not isfile(p):
            raise ValueError('%s: files.%s "%s" %s' % (path, k, p, 'is a folder, not a file'
                             if isdir(p) else 'does not exist'))
    # outputs: distinct from every input, each other, this file and code; each written as
    # name + '.tmp' then renamed, so no name may be another's '.tmp' either
    base = path.split('/')[-1]
    taken = {}
    for k in INPUTS + ('rewritten',):
        if files.get(k):
            taken[files[k]] = 'files.' + k
    taken[base] = 'the settings file'
    for k in OUTPUTS:
        o = files.get(k)
        if not o:
            continue
        for n in (o, o + '.tmp', o + '.best', o + '.lock'):
            for t in list(taken):
                if n == t or n == t + '.tmp' or n + '.tmp' == t:
                    raise ValueError('%s: files.%s "%s" would overwrite %s "%s"; give it its own name'
                                     % (path, k, o, taken[t], t))
        if o.endswith('.py') or o.endswith('.mpy'):
            raise ValueError('%s: files.%s "%s" would overwrite code' % (path, k, o))
        if isdir(o):
            raise ValueError('%s: files.%s "%s" is a folder, not a file' % (path, k, o))
        taken[o] = 'files.' + k
    return files, run, dict((k, cfg[k]) for k in cfg if k in SETTINGS), sel


def exists(p):
    # as utrain.wof.openr: a save cut between removing the old file and the rename is
    # finished (wof's code is not loaded here: code loaded now would split the heap)
    if isfile(p):
        return True
    try:
        os.rename(p + '.tmp', p)
        return isfile(p)
    except OSError:
        return False


def read_config(cfg_path):
    """train.json read and checked: (files, run, settings, weights to start from,
    whether to resume), or ValueError naming what is wrong."""
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except OSError as e:
        code = e.args[0] if e.args else 0
        raise ValueError('%s: cannot read it (%s): run train.py in the folder prepare wrote'
                         % (cfg_path, 'no such file' if code == 2 else 'it is a folder'
                            if code == 21 else 'OSError %s' % code))
    except ValueError as e:
        # (MicroPython's UnicodeError has no text)
        raise ValueError('%s: not valid JSON (%s)' % (cfg_path, str(e) or 'not UTF-8: save it as UTF-8'))
    except (RuntimeError, MemoryError) as e:  # (CPython's RecursionError is a RuntimeError)
        if isinstance(e, MemoryError) and e.args and 'locked' in e.args[0]:
            raise                   # a Ctrl-C (utrain.run.ctrl_c)
        raise ValueError('%s: nested too deeply or too large to read here: use the '
                         'train.json prepare wrote (prepare again to make one)' % cfg_path)
    files, run, cfg, sel = check(cfg, cfg_path)
    import utrain           # the fingerprint block every checkpoint of this run carries, and
    fp = run.get('fingerprint')     # a resumed one must (utrain.wof, utrain.ckread)
    utrain.fp = None if fp is None else b'UTFP' + fp.to_bytes(4, 'little')
    n = run.get('gc_every', 0)
    if 0 < n < 1024:        # a folder prepared before (32): 1/n of the heap, as it trained then
        try:
            import gc
            run['gc_every'] = (gc.mem_free() + gc.mem_alloc()) // n
        except AttributeError:      # CPython
            pass
    if not files.get('train'):
        print('utrain: no training data in %s: prepare the model with --data' % cfg_path)
        raise SystemExit(0)
    ckpt, out = files.get('checkpoint'), files['out']
    resume = run.get('resume') and ckpt and exists(ckpt)
    start = files['weights']
    if run.get('start') == 'best' and not resume and exists(out):
        start = out           # a nightly run goes on from its best weights
        print('starting from the best weights so far, %s' % out)
        if files['model'][-5:] == '.json':
            # (an int8 run's trained layers alone, at the scales its side files name:
            # loaded over its starting weights; built from out, its frozen layers had been
            # read where out has none, its doubled scales taken as calibrated)
            cfg['base'] = files['weights']
    if run.get('resume') and ckpt and not resume:
        print('utrain: "resume" is set but there is no %s: starting from %s' % (ckpt, start))
    return files, run, cfg, start, resume, sel
