import sys


def run():
    """`utrain` / `python -m host_tools`: the CLI, a Ctrl-C while it loads (numpy's and
    the readers' imports, 0.3 s and more) ending as one in a command does: it had ended
    in a KeyboardInterrupt traceback."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        print('\nstopped (Ctrl-C) while loading: nothing was done', file=sys.stderr)
        return 130
    return main()


if __name__ == '__main__':
    sys.exit(run())
