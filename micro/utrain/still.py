# Whether an epoch moved a trained weight (run.epoch_end's, loaded for the call and
# dropped: its code is not held through training): a CRC32 of the trained weights an
# epoch, one C pass, nothing a step.


def stamp(tr):
    # a CRC32 of the trained weights, None where it cannot be had (no
    # binascii.crc32, no weights)
    try:
        from binascii import crc32
        c = None
        if hasattr(tr, 'moving'):       # (Q8Trainer's: its trained int8 weights)
            ws = tr.moving()
        else:                           # (Trainer's trainable tensors; npfallback's _d)
            t = tr.net.t
            ws = [getattr(t[k], '_d', t[k]) for k in tr.net.trainable]
        for a in ws:
            c = crc32(a, c or 0)
        return c
    except (ImportError, TypeError, ValueError):
        return None


def moved(tr, S, files, kept):
    # the epoch line's words after its figures: kept (None: not better than the best so
    # far, said here: epoch 0 of S['rec'] is the out file as it was before this run, not
    # an epoch of it), then '  (no weight moved)' where this epoch's stamp is the last
    # one's (S['crc']: a redo after a Ctrl-C compares with the epoch before), and the
    # first time a line with what to do (raw: an int8 run, whose weights move by whole
    # steps)
    b, r, raw = tr.best, S['rec'], files['model'].endswith('.json')
    if kept is None:
        kept = '  (not better than %s)' % ('epoch %d' % b[0] if b[0] or not r or b[1:] != r[1:]
                                           else files['out'] + ' as it was before this run'
                                           ) if b else '  (not kept)'
    h = stamp(tr)
    said = ''
    if h is not None and S.get('crc') == (tr.epoch - 1, h):
        said = '  (no weight moved)'
        if not S.get('still'):
            S['still'] = 1
            print('utrain: epoch %d moved no trained weight: %s at lr %g; raise "lr" in '
                  'train.json, or %s' % (
                      tr.epoch, 'each update stayed under an int8 weight step' if raw else
                      "the gradients were zero or below float32's resolution",
                      tr.cfg['lr'] * tr.lr_scale, 'prepare with --float32 (an int8 file: '
                      '--dequantize) to train in float' if raw else 'check what trains and '
                      'the samples'))
    S['crc'] = (tr.epoch, h)
    return kept + said
