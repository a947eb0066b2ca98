import sys


def drop(name):
    # forget module utrain.<name> so its code leaves the heap (code is heap on a
    # board); the next import loads it again.  (Here: every module can import it
    # without an import circle, and checking train.json loads no model code.)
    if sys.implementation.name != 'micropython':
        return          # a host has heap to spare, and keeps module identities
    sys.modules.pop('utrain.' + name, None)
    try:
        delattr(sys.modules['utrain'], name)
    except (AttributeError, KeyError):
        pass
