"""The board's code as the host uses it: the op contract (utrain.opc), the file formats'
readers and constants (utrain.flat, utrain.wof, utrain.data) and the kernels, imported
from micro/utrain so that the host and the board share one definition of each.

The package is registered under its device name, ``utrain``, from its folder (no
sys.path entry: nothing else in micro/ becomes importable); a ``utrain`` already
imported (tests and the simulated board put micro/ on the path) is used as it is.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from .paths import MICRO


def package():
    """The utrain package (micro/utrain), imported once."""
    pkg = sys.modules.get('utrain')
    if pkg is None:
        where = os.path.join(MICRO, 'utrain')
        spec = importlib.util.spec_from_file_location(
            'utrain', os.path.join(where, '__init__.py'), submodule_search_locations=[where])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules['utrain'] = pkg
        spec.loader.exec_module(pkg)
    return pkg


def module(name: str):
    """Device module utrain.<name> (e.g. 'opc', 'flat', 'op_fc')."""
    package()
    return importlib.import_module('utrain.' + name)
