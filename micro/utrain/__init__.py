import sys


def drop(name):
    # forget module utrain.<name> so its code leaves the heap (code is heap on a
    # board); the next import loads it again.  (Here: every module can import it
    # without an import circle, and checking train.json loads no model code.)  A
    # host has heap to spare, and keeps module identities.  (The package's globals
    # are its attributes: utrain.<name> goes with them.)
    if sys.implementation.name == 'micropython':
        sys.modules.pop('utrain.' + name, None)
        globals().pop(name, None)
