# utrain: train on the board.  `mpremote run train.py` on a board, or
# `python -m host_tools run DIR` for the simulated board.  Settings come from
# train.json beside this file (a board has no command line); edit it to change
# epochs, learning rate, files.  The work is in utrain/run.py (precompiled .mpy).
from utrain.run import start

start()
