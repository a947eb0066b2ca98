# What an int8 run trains when the board chose it (prepare --select board on an int8
# model trained as int8: utrain.q8fish chooses).  prepare wrote the layer table of the
# candidates' union (every configuration's layers, each at its widest); restrict() makes
# it the chosen configuration's before utrain.q8.Q8Net reads it, with the flags
# host_tools/prepare/quant.py _mark_trained gives a table prepared for that
# configuration alone.  The union's memory plan holds for it (it trains a part of what
# the union trains).  The choice is kept beside the checkpoint (save, read): a resumed run
# trains the same layers.  Loaded by utrain.q8train only for a run the board chose.
import json


def restrict(meta, keep):
    """Train in layer table meta only keep's layers: keep {layer position: None (all
    its output channels), [lo, hi] (a window of them), [0, 0] (its bias alone)}; the
    union's other trained layers are frozen.  Returns meta."""
    ls = meta['layers']
    for i in keep:
        if not (0 <= i < len(ls) and ls[i].get('train')):
            raise ValueError('the board\'s choice names layer %d, which is not a candidate' % i)
    grow = 0
    for i in range(len(ls)):
        d = ls[i]
        if not d.get('train'):
            continue
        wide = d.pop('pw', 0)       # a wide layer's window rows alone held in RAM
        if i not in keep:
            for k in ('train', 'tw', 'wf', 'gw'):
                d.pop(k, None)
            if wide:
                d['sd'] = 1         # frozen: streamed a chunk of channels at a time
            # a frozen layer's biases and multipliers are read into the shared scratch
            # (quant.plan's qbuf: the union's frozen layers' alone)
            meta['qbuf'] = max(meta.get('qbuf') or 1, d.get('nc', d['nb']))
            continue
        w = keep[i]
        d.pop('gw', None)
        if w is None:
            d.pop('tw', None)
        else:
            d['tw'] = [w[0], w[1]]
        if w is not None and w[1] <= w[0]:      # the bias alone
            d.pop('wf', None)
            if wide:
                d['sd'] = 1
            continue
        if wide:
            d['pw'] = 1
        if (len(d['mul']) if 'mul' in d else d.get('nq', 1)) > 1:
            d['gw'] = 1             # per-channel scales grow (utrain.q8grow)
            grow = 1
    if grow:        # (as _mark_trained: a layer whose weights all train grows its scale too)
        for i in keep:
            if keep[i] is None:
                ls[i]['gw'] = 1
    for d in ls:    # a weight several layers read trains whole with its first (utrain.q8share)
        j = d.get('sh')
        if j is not None and ls[j].get('train') and 'tw' not in ls[j]:
            d['train'] = 1
            for k in ('gw', 'tw', 'sd'):
                d.pop(k, None)
        elif j is not None:
            for k in ('train', 'sh', 'gw', 'tw'):
                d.pop(k, None)
    return meta


def save(path, keep):
    """The choice, beside the checkpoint at path (read() reads it back)."""
    f = open(path + '.sel', 'w')
    try:
        f.write(json.dumps([[i, keep[i]] for i in keep]))
    finally:
        f.close()


def read(path, log=print):
    """The choice the run with the checkpoint at path trained with."""
    try:
        f = open(path + '.sel')
    except OSError:
        raise ValueError('%s.sel: missing: the board\'s choice of what trains is kept there '
                         '(prepare again, or start the run afresh)' % path)
    try:
        keep = {}
        for i, w in json.loads(f.read()):
            keep[i] = w
    finally:
        f.close()
    log('resuming the board\'s choice: layers %s' % ' '.join(
        '%d%s' % (i, '' if keep[i] is None else ':%d-%d' % (keep[i][0], keep[i][1]))
        for i in sorted(keep)))
    return keep
