"""Where the tool's own files are: micro/ (the board's code), boards/boards.json (the
board profiles) and datasets/digits (the demo's model and data).

In a checkout (and after `pip install -e .`) they sit beside host_tools/; a wheel
(`pip install .`) ships the same folders inside the package, under host_tools/_files/
(pyproject.toml maps them there), so the installed `utrain` command finds them too."""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def find_root(here=HERE) -> str:
    """The folder holding micro/, boards/ and datasets/: the checkout's root when
    host_tools/ lies in one, else the copy a wheel installed under host_tools/_files."""
    for root in (os.path.dirname(here), os.path.join(here, '_files')):
        if os.path.isfile(os.path.join(root, 'micro', 'utrain', '__init__.py')) and \
                os.path.isfile(os.path.join(root, 'boards', 'boards.json')):
            return root
    raise FileNotFoundError(
        f'{here}: neither a checkout (micro/ and boards/ beside host_tools/) nor an installed '
        'wheel (host_tools/_files/): reinstall utrain (pip install .) from the repository')


ROOT = find_root()
MICRO = os.path.join(ROOT, 'micro')
BOARDS = os.path.join(ROOT, 'boards', 'boards.json')
DIGITS = os.path.join(ROOT, 'datasets', 'digits')


def broken_link(path, loops_only=False) -> str | None:
    """'<path>: a symbolic link to T, which is not there' (or which leads back to itself)
    with what to do, for a path whose last part is a link that leads nowhere, else None.
    Such a path had been 'no such file' (of a file `ls` shows), 'no train.json here', or,
    as prepare's -o, 'OUT.preparing: a part of the path is a file'.  loops_only: None for
    a link to a path not there (prepare -o makes the folder it points at)."""
    import errno
    target = '?'
    try:
        path = os.fspath(path)
        if not os.path.islink(path) or os.path.exists(path):
            return None
        target = os.readlink(path)
        os.stat(path)
        return None
    except OSError as e:
        if not os.path.islink(path):
            return None
        loop = e.errno == errno.ELOOP
    except (TypeError, ValueError):
        return None
    if loops_only and not loop:
        return None
    return (f'{path}: a symbolic link to {target}, which ' +
            ('leads back to it (a loop of links)' if loop else 'is not there') +
            ': point the link at what it stands for, or give that path itself')
