"""The board's code as the host uses it: the op contract (utrain.opc), the file formats'
readers and constants (utrain.flat, utrain.wof, utrain.data) and the kernels, imported
from micro/utrain so that the host and the board share one definition of each.

The package is registered under its device name, ``utrain``, from its folder (no
sys.path entry: nothing else in micro/ becomes importable); a ``utrain`` already
imported (tests and the simulated board put micro/ on the path) is used as it is.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import os
import sys

from ..paths import MICRO


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


@contextlib.contextmanager
def board_steps():
    """The host simulation (numpy) stepping as a board does, restored on exit: optimizer
    updates a weight row at a time and max pools and convolutions walked a tap at a time
    (utrain/xnumpy.py's conv_taps), where the host's fast path steps whole arrays and
    takes every window in one gather.  What the host ran before that path, for
    bench/trials.py's side-by-side times and the tests that the two agree."""
    optim, op_pool, op_conv = module('optim'), module('op_pool'), module('op_conv')
    saved = optim.ROWWISE, op_pool.maxpool_steps, op_conv.conv_steps
    optim.ROWWISE, op_pool.maxpool_steps = True, None
    op_conv.conv_steps = module('xnumpy').conv_taps
    try:
        yield
    finally:
        optim.ROWWISE, op_pool.maxpool_steps, op_conv.conv_steps = saved


@contextlib.contextmanager
def light_gc():
    """The device code's gc.collect() as the host runs it (restored on exit): a collection
    of the youngest generation.  On a board gc.collect() keeps the heap whole between a
    step's arrays; under CPython reference counting has freed those already, and a full
    collection walks every object the process holds: with torch imported about 0.25 s a
    call, 26 calls in an int8 model's lr probe (a tiny model's prepare took 11 s, 1 s
    with this).  Nested uses keep the outer one's."""
    real = gc.collect
    if getattr(real, 'light', False):
        yield
        return

    def collect(generation=0):
        return real(generation)
    collect.light = True
    gc.collect = collect
    try:
        yield
    finally:
        gc.collect = real
