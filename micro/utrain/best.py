# The best weights across runs: validation-gated saving replaces trained.wof only with
# weights that beat it on the test set, also when a later run (a reboot into training,
# the next night's personalisation) starts from other weights.  Beside trained.wof, its
# record trained.wof.best (JSON, docs/formats.md) holds its test loss and metric with
# the CRC32 and size of trained.wof and of the test set it was measured on; a record
# that does not match them (an older utrain, another test set, a save cut between the
# two files) is not trusted: trained.wof is evaluated again.  Loaded only when needed.
import json
from struct import pack, unpack
from binascii import hexlify, unhexlify
from utrain.wof import openr, crc, exists, _replace, FormatError, _again


def stamp(path):
    """[size, CRC32] of a file (CRC 0 on a firmware without binascii)."""
    with openr(path) as f:
        f.seek(0, 2)
        n = f.tell()
        return [n, crc(f, 0, n)]


def write(out, best, metric, test):
    d = {'epoch': best[0], 'test_loss': float(best[1]), 'test_metric': float(best[2]), 'metric': metric,
         'weights': stamp(out), 'test': stamp(test.path),
         'exact': hexlify(pack('<dd', best[1], best[2])).decode()}   # the doubles, bit for bit
    tmp = out + '.best.tmp'
    with open(tmp, 'w') as f:
        json.dump(d, f)
    _replace(tmp, out + '.best')


def save(tr, out, test):
    """trained.wof, then its record; each atomic, each can be redone."""
    from utrain.run import saving, STATE
    saving(out, tr.save_weights, out)
    saving(out + '.best', write, out, tr.best, tr.cfg['metric'], test)
    STATE['s']['saved'] = tr.best[0]
    _again()        # (the save's reserve, after all its files: utrain.wof)


def read(out, metric, test):
    """(0, test loss, test metric) from out's record, None when it does not match."""
    try:
        with open(out + '.best') as f:
            d = json.load(f)
        if d['metric'] == metric and d['weights'] == stamp(out) and d['test'] == stamp(test.path):
            return (0,) + unpack('<dd', unhexlify(d['exact']))
    except (OSError, ValueError, KeyError, TypeError, IndexError, RuntimeError):
        pass
    return None


def known(tr, out, test):
    """The test (loss, metric) of the weights in `out` as (0, loss, metric): epoch 0, i.e.
    what this run has to beat; from the record, else by evaluating them (the trainer's
    weights are loaded again after).  None when there is no readable `out`.  It becomes
    tr.best unless a resumed checkpoint holds the same result (with its own epoch)."""
    r = result(tr, out, test)
    if r and not (tr.best and tr.best[1:] == r[1:]):
        tr.best = r
    if r:
        print('%s so far: test_loss %.4f test_%s %.4f; replaced only by better weights'
              % (out, r[1], tr.cfg['metric'], r[2]))
    return r


def back(tr):
    # the weights the trainer had: the resumed checkpoint's, else the starting ones
    if tr.good:
        tr.load_checkpoint(tr.good)
    else:
        tr.net.load_weights(tr.weights_path)


def result(tr, out, test):
    metric = tr.cfg['metric']
    r = read(out, metric, test)
    if r or not exists(out):
        return r
    net = tr.net
    try:
        net.load_weights(out)
    except FormatError as e:
        print('utrain: %s is not used as the best weights so far: %s' % (out, e))
        back(tr)
        return None
    tl, tm = tr.evaluate(test)
    back(tr)
    if not (tl - tl == 0 and tm - tm == 0):
        return None
    write(out, (0, tl, tm), metric, test)
    return (0, tl, tm)
