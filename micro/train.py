# utrain: train on the board.  `mpremote run train.py` on a board, or
# `python -m host_tools run DIR` for the simulated board.  Settings come from
# train.json beside this file (a board has no command line); edit it to change
# epochs, learning rate, files.  The work is in utrain/run.py (precompiled .mpy).
# The last line printed is "utrain: end: ok" or "utrain: end: <what stopped it>".
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
except MemoryError:         # not even utrain's code fits in this heap
    print('utrain: out of memory loading utrain\nutrain: end: out of memory loading the code')
    raise

start()
