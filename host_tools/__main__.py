import sys


def _settle():
    """At the process's exit (atexit: after the command, before CPython's teardown of the
    modules, numpy's and torch's, a tenth of a second and more), SIGINT ignored: that
    teardown first sets SIGINT back to the system's default, and a Ctrl-C then (a second
    press after 'stopped (Ctrl-C)', or one as the command ended) ended the process by the
    signal (exit -2 to its parent, no exit code) where it had said 'stopped' (130) or
    finished.  A Ctrl-C after the command's end leaves its exit code as it was."""
    import signal
    for _ in range(100):
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return
        except KeyboardInterrupt:   # (a Ctrl-C before the line above took effect)
            continue
        except (ValueError, OSError):   # (not the main thread: nothing to settle)
            return


def run():
    """`utrain` / `python -m host_tools`: the CLI, a Ctrl-C while it loads (numpy's and
    the readers' imports, 0.3 s and more) ending as one in a command does: it had ended
    in a KeyboardInterrupt traceback.  A Ctrl-C ends it with exit code 130 (_settle: never
    by the signal)."""
    import atexit
    atexit.unregister(_settle)
    atexit.register(_settle)        # (before the command's: called after theirs)
    try:
        from .cli import main
    except KeyboardInterrupt:
        print('\nstopped (Ctrl-C) while loading: nothing was done', file=sys.stderr)
        return 130
    try:
        return main()
    except KeyboardInterrupt:       # (one as main ended, past its own handling)
        print('\nstopped (Ctrl-C)', file=sys.stderr)
        return 130


if __name__ == '__main__':
    sys.exit(run())
