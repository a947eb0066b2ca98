"""The .wof weight-only format of onert-micro (docs/formats.md), host side."""
from __future__ import annotations

import struct

import numpy as np

from .circle_io import Graph, atomic_write

MAGIC = 429
VERSION = 1


def pack_wof(n_tensors: int, arrays: dict) -> bytes:
    """.wof bytes for {tensor index: float32 array}; absent tensors get offset 0."""
    offs = [0] * n_tensors
    pos = 8 + 4 * n_tensors
    blobs = []
    for k in sorted(arrays):
        if not 0 <= k < n_tensors:
            raise ValueError(f'tensor {k} out of range for {n_tensors} tensors')
        blob = np.ascontiguousarray(arrays[k], dtype='<f4').tobytes()
        offs[k] = pos
        pos += len(blob)
        blobs.append(blob)
    return struct.pack(f'<HBBI{n_tensors}I', MAGIC, VERSION, 0, n_tensors, *offs) + b''.join(blobs)


def write_wof(path, n_tensors: int, arrays: dict) -> None:
    atomic_write(path, pack_wof(n_tensors, arrays))


def read_wof(path, g: Graph) -> dict:
    """{tensor index: array shaped like the model's tensor} from a .wof for graph g."""
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f'{path}: cannot read ({e.strerror})') from None
    if len(data) < 8:
        raise ValueError(f'{path}: truncated .wof header ({len(data)} bytes)')
    magic, ver, _, n = struct.unpack_from('<HBBI', data)
    if magic != MAGIC:
        raise ValueError(f'{path}: not a .wof file (magic {magic}, want {MAGIC})')
    if ver != VERSION:
        raise ValueError(f'{path}: .wof version {ver}, expected {VERSION}')
    if n != len(g.tensors):
        raise ValueError(f'{path}: holds {n} buffers but {g.path} has {len(g.tensors)} tensors')
    if len(data) < 8 + 4 * n:
        raise ValueError(f'{path}: truncated offset table')
    offs = struct.unpack_from(f'<{n}I', data, 8)
    out = {}
    for k, off in enumerate(offs):
        if off in (0, 0xFFFFFFFF):
            continue
        t = g.tensors[k]
        if t.dtype != 'float32':
            raise ValueError(f'{path}: has data for tensor {k} ({t.name}), which is {t.dtype}')
        count = int(np.prod(t.shape)) if t.shape else 1
        if off < 8 + 4 * n or off + 4 * count > len(data):
            raise ValueError(f'{path}: data of tensor {k} ({t.name}, {count} floats at offset '
                             f'{off}) runs outside the file ({len(data)} bytes)')
        out[k] = np.frombuffer(data, '<f4', count, off).reshape(t.shape).astype(np.float32)
    return out
