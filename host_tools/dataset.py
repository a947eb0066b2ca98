"""Dataset record files for the device (layout in docs/formats.md) from .npz arrays."""
from __future__ import annotations

import os
import struct

import numpy as np

from .circle_io import atomic_write

MAGIC = b'UTDS'
VERSION = 1


class DataError(ValueError):
    pass


def load_npz(path):
    """(x, y) from an .npz holding arrays named x and y."""
    if not os.path.exists(path):
        raise DataError(f'{path}: no such file')
    try:
        with np.load(path, allow_pickle=False) as z:
            if 'x' not in z or 'y' not in z:
                raise DataError(f'{path}: needs arrays named x and y (has {", ".join(z.files)})')
            x, y = z['x'], z['y']
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f'{path}: not a readable .npz file ({e})') from None
    if len(x) != len(y):
        raise DataError(f'{path}: x has {len(x)} samples but y has {len(y)}')
    if len(x) == 0:
        raise DataError(f'{path}: holds no samples')
    return x, y


def targets(y, loss: str, n_out: int, where: str):
    """Expected data per sample as the device wants it: class index for scce, one-hot
    for cce given labels, otherwise the output values."""
    y = np.asarray(y)
    labels = y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1 and n_out > 1)
    if loss == 'scce':
        if not labels:
            if y.ndim != 2 or y.shape[1] != n_out:
                raise DataError(f'{where}: y has shape {y.shape}; scce wants class labels')
            y = y.argmax(axis=1)
        y = y.reshape(-1)
        if np.any(y < 0) or np.any(y >= n_out) or np.any(y != np.round(y)):
            raise DataError(f'{where}: labels must be integers in [0, {n_out})')
        return y.astype(np.float32).reshape(-1, 1)
    if loss == 'cce' and labels:
        y = y.reshape(-1)
        if np.any(y < 0) or np.any(y >= n_out) or np.any(y != np.round(y)):
            raise DataError(f'{where}: labels must be integers in [0, {n_out})')
        return np.eye(n_out, dtype=np.float32)[y.astype(int)]
    y = y.reshape(len(y), -1).astype(np.float32)
    if y.shape[1] != n_out:
        raise DataError(f'{where}: y has {y.shape[1]} values per sample, the model outputs {n_out}')
    return y


def pack_dataset(x, y) -> bytes:
    x = np.ascontiguousarray(x, dtype='<f4').reshape(len(x), -1)
    y = np.ascontiguousarray(y, dtype='<f4').reshape(len(y), -1)
    head = struct.pack('<4sHBBIII', MAGIC, VERSION, 0, 0, len(x), x.shape[1], y.shape[1])
    head += b'\0' * (32 - len(head))
    return head + np.concatenate([x, y], axis=1).tobytes()


def write_dataset(path, x, y) -> None:
    atomic_write(path, pack_dataset(x, y))


def read_dataset(path):
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError as e:
        raise DataError(f'{path}: cannot read ({e.strerror})') from None
    if len(data) < 32:
        raise DataError(f'{path}: truncated dataset header ({len(data)} bytes)')
    magic, ver, xt, yt, n, xl, yl = struct.unpack_from('<4sHBBIII', data)
    if magic != MAGIC or ver != VERSION or xt or yt:
        raise DataError(f'{path}: not a version-{VERSION} float32 utrain dataset')
    if len(data) != 32 + 4 * n * (xl + yl):
        raise DataError(f'{path}: {len(data)} bytes, expected {32 + 4 * n * (xl + yl)} '
                        f'for {n} samples (truncated?)')
    a = np.frombuffer(data, '<f4', offset=32).reshape(n, xl + yl)
    return a[:, :xl].copy(), a[:, xl:].copy()


def split(n: int, test_split: float, seed: int):
    """(train indices, test indices): a seeded shuffle, then the last fraction is test."""
    if not 0.0 <= test_split < 1.0:
        raise DataError(f'--test-split {test_split}: must be in [0, 1)')
    idx = np.random.default_rng(seed).permutation(n) if test_split else np.arange(n)
    n_test = int(round(n * test_split))
    return np.sort(idx[:n - n_test]) if test_split else idx, np.sort(idx[n - n_test:])
