# utrain: train on the board.  `mpremote run train.py` on a board, or
# `python -m host_tools run DIR` for the simulated board.  Settings come from
# train.json beside this file (a board has no command line); edit it to change
# epochs, learning rate, files.  The work is in utrain/run.py (precompiled .mpy).
import sys
import gc
try:
    from utrain.run import start
except MemoryError:
    sys.modules.clear()         # the modules loaded so far are garbage now
    gc.collect()
    print('utrain: out of memory loading the utrain code (%d B of heap free after it): deploy '
          'it precompiled (.mpy, the default), freeze it into the firmware (boards/freeze.md) '
          'or use a board with more heap' % gc.mem_free())
    raise SystemExit(1)
except ImportError as e:
    print('utrain: cannot load the utrain package (%s): deploy it with '
          '`python -m host_tools deploy` (it goes to /lib/utrain)' % e)
    raise SystemExit(1)
start()
