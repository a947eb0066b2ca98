"""The .wof weight-only format of onert-micro (docs/formats.md), host side, and reading
the weights back out of a device checkpoint.  Validation is the device reader's
(micro/utrain/wof.py), run on the bytes, so host and board accept the same files."""
from __future__ import annotations

import io
import os

import numpy as np

from ..formats.circle_io import Graph, atomic_write
from ..target.device import module

dev = module('wof')
ckread = module('ckread')

MAGIC = dev.MAGIC
VERSION = dev.VERSION


def pack_wof(n_tensors: int, arrays: dict, keep_dtype: bool = False) -> bytes:
    """.wof bytes for {tensor index: float32 array} (keep_dtype: each array's own dtype,
    little-endian: an int8 model's int8 weights as int8 bytes, int32 biases); absent
    tensors get offset 0."""
    for k in arrays:
        if not 0 <= k < n_tensors:
            raise ValueError(f'tensor {k} out of range for {n_tensors} tensors')
    f = io.BytesIO()
    if keep_dtype:      # raw bytes: the device writer stores them as they are
        blocks = {k: np.ascontiguousarray(a, np.asarray(a).dtype.newbyteorder('<')).tobytes()
                  for k, a in arrays.items()}
    else:
        blocks = {k: np.asarray(a, np.float32) for k, a in arrays.items()}
    dev.write_wof(f, n_tensors, blocks)
    return f.getvalue()


def write_wof(path, n_tensors: int, arrays: dict, keep_dtype: bool = False) -> None:
    atomic_write(path, pack_wof(n_tensors, arrays, keep_dtype))


def _shapes(g: Graph):
    # the device reader's sizes: float32 tensors may carry data, others may not; a model
    # whose inputs prepare joined has its joined input's tensors after g's, without data
    # (g.device_tensors: export sets it from prepare.json)
    return [(1, int(np.prod(t.shape)) if t.shape else 1) if t.dtype == 'float32' else None
            for t in g.tensors] + [None] * (getattr(g, 'device_tensors', 0) - len(g.tensors))


def _read(path) -> bytes:
    try:
        with open(path, 'rb') as f:
            return f.read()
    except OSError as e:
        if os.path.isdir(path):         # a prepared folder given for its weights
            raise ValueError(f'{path}: is a folder; give the weights file in it (trained.wof, '
                             'or checkpoint.ckpt)') from None
        from .locks import not_written_yet
        raise ValueError(not_written_yet(path) or f'{path}: cannot read ({e.strerror})') from None


def _shaped(g: Graph, arrays: dict) -> dict:
    return {k: np.asarray(a, np.float32).reshape(g.tensors[k].shape) for k, a in arrays.items()}


def read_wof(path, g: Graph) -> dict:
    """{tensor index: array shaped like the model's tensor} from a .wof for graph g."""
    f = io.BytesIO(_read(path))
    shapes = _shapes(g)
    try:
        offs, _ = dev.read_table(f, path, shapes)
    except dev.FormatError as e:
        raise ValueError(f'{e} (model {g.path}){_what_to_do(path, e)}') from None
    out = {}
    for k, off in enumerate(offs):
        if off:
            f.seek(off)
            out[k] = np.frombuffer(f.read(4 * shapes[k][1]), '<f4')
    return _shaped(g, out)


def read_checkpoint(path, g: Graph, ranks=None) -> dict:
    """The weights of a device checkpoint (onert-micro layout) for graph g, like read_wof.
    ranks: the model's rank table {tensor: (axis, lo, hi)} (read_flat), when its optimizer
    state covers only some output channels."""
    data = _read(path)
    shapes = _shapes(g)
    state = None
    if ranks:
        from ..graph.passes import device_shapes
        dev_shapes = device_shapes(g)
        state = list(shapes)
        for k, (ax, lo, hi) in ranks.items():
            r, c = dev_shapes[k]
            state[k] = (1, (hi - lo) * (c if ax == 0 else r))
    try:
        w = ckread.read_checkpoint(io.BytesIO(data), path, len(shapes), shapes, state)[0]
    except dev.FormatError as e:
        raise ValueError(f'{e} (model {g.path}){_what_to_do(path, e)}') from None
    return _shaped(g, w)


def _what_to_do(path, e, int8=False) -> str:
    """What to do about weights file path that the device reader refused (e): one
    moved out of its run folder (its tensors are the rewritten model's that the folder's
    prepare.json names), or one cut short or damaged (a copy or pull interrupted)."""
    folder = os.path.dirname(os.path.abspath(path))
    cut = any(w in str(e) for w in ('truncated', 'cut short', 'checksum mismatch'))
    if not os.path.exists(os.path.join(folder, 'prepare.json')) and cut:
        # (a file cut short outside a run folder had been told only to be exported from
        # the folder it was trained in, as if its model were the question)
        return (f': the file is cut short or damaged ({os.path.getsize(path)} bytes): copy it '
                'again (`pull` from a board), or export the run folder\'s own copy')
    if not os.path.exists(os.path.join(folder, 'prepare.json')):
        return (f': {os.path.basename(path)} is not in a run folder (no prepare.json beside '
                'it), so it was read against the model as given; export it from the folder '
                'it was trained in, whose prepare.json says which model its tensors are')
    if 'buffers, the model has' in str(e):
        return (f': {os.path.basename(path)} was not trained from this model; export it into '
                'the model its folder was prepared from')
    if 'must follow each other' in str(e):
        # (its offset table whole, blocks of other sizes than the model's: a file of another
        # model, copied into this folder; had been 'the file is cut short or damaged')
        return (f': {os.path.basename(path)} holds tensors of other sizes than this model\'s: '
                'it is of another model (copied in from another run folder?): export it from the '
                'folder it was trained in, into the model that folder was prepared from; if it is '
                'this folder\'s own, it is damaged: copy it again (`pull` from a board)')
    other = 'export the run folder\'s ' + ('trained.wof (the best epoch)' if str(path).endswith(
        '.ckpt') else 'checkpoint.ckpt (the last epoch saved)')
    if int8:        # (an int8 run's checkpoint is not exported: run it on to trained.wof)
        other = ('run the folder again with "resume": true under "run" in train.json (it goes '
                 'on from checkpoint.ckpt and saves trained.wof)')
    return (f': the file is cut short or damaged ({os.path.getsize(path)} bytes): copy it '
            f'again (`pull` from a board), or {other}')

