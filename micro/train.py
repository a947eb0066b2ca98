# utrain: train on the board.  `mpremote run train.py` on a board, or
# `python -m host_tools run DIR` for the simulated board.  Settings come from
# train.json beside this file (a board has no command line); edit it to change
# epochs, learning rate, files.  The work is in utrain/run.py (precompiled .mpy).
# (Kept small: a board compiles this file in its heap.)
import gc
try:
    from utrain.run import start
    start()
except MemoryError:
    import sys
    sys.modules.clear()         # the code loaded so far is garbage now
    gc.collect()
    print('utrain: out of memory loading the utrain code (%d B free after it): use .mpy '
          '(the default), freeze it (boards/freeze.md) or a bigger heap' % gc.mem_free())
    raise SystemExit(1)
