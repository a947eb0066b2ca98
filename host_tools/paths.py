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
