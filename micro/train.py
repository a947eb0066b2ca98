# utrain: train on the board.  `mpremote run train.py` on a board, or
# `python -m host_tools run DIR` for the simulated board.  Settings come from
# train.json beside this file (a board has no command line); edit it to change
# epochs, learning rate, files.  The work is in utrain/run.py (precompiled .mpy).
# (Kept small: a board compiles this file in its heap.)  The last line printed is
# "utrain: end: ok" or "utrain: end: <what stopped it>" (host_tools/boards/board.py reads it).
import gc
try:
    # collect every 2 KB while the code loads: loading each module leaves temporaries
    # (file buffers, the reader's) between what stays; collected only when the heap is
    # full they leave a sieve no array fits in (the emulated Cortex-M0 trained the digits
    # MLP in 121 KB instead of 181 KB, docs/memory.md)
    gc.threshold(2048)
except AttributeError:      # CPython
    pass
try:
    from utrain.run import start
    start()
except KeyboardInterrupt:   # a Ctrl-C (SIGINT) before utrain.run takes them over
    print('utrain: interrupted while starting (the saved files are as they were); run '
          'train.py again to train\nutrain: end: interrupted')
except MemoryError as e:
    if e.args and 'locked' in e.args[0]:    # a Ctrl-C inside the collector (utrain/run.py)
        print('utrain: end: interrupted')
        raise SystemExit(0)
    import sys
    sys.modules.clear()         # the code loaded so far is garbage now
    gc.collect()
    print('utrain: out of memory loading the utrain code (%d B free after it): use .mpy '
          '(the default), freeze it (boards/freeze.md) or a bigger heap\n'
          'utrain: end: out of memory loading the code' % gc.mem_free())
    raise SystemExit(1)
