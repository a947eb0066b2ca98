"""onert-micro's training-config file: which ops train and how much of each (rank).
Layout (docs/formats.md): u16 magic 29, u8 version 1, u8 reserved, u32 n,
u16[n] op indices, u8[n] ranks (0 ALL, 1 ONLY_BIAS, 2 UP_1_2_PART, 3 LOWER_1_2_PART).
utrain's own ranks 4 (first 1/4 of the output channels) and 5 (first 1/8) have no
onert-micro code: a file holding them is refused by onert-micro, so write_train_config
refuses them unless told otherwise."""
from __future__ import annotations

import struct

from ..formats.circle_io import atomic_write
from ..formats.kinds import kind_of
from ..graph.passes import PrepareError, RANK_NAMES

MAGIC = 29
VERSION = 1
ONERT_RANKS = (0, 1, 2, 3)


def read_train_config(path, n_ops: int) -> dict:
    """-> {op index: rank code}."""
    from ..formats.ir import device
    if device(path):
        raise PrepareError(device(path))
    with open(path, 'rb') as f:
        data = f.read()
    head = struct.unpack_from('<HBBI', data) if len(data) >= 8 else None
    n = head[3] if head else 0
    if data[:2] != struct.pack('<H', MAGIC) and (kind_of(data) or len(data) >= 8 or not data):
        # (another file given for it: a model, the data, a run folder's, text)
        kind = kind_of(data)
        raise PrepareError(f'{path}: not a training-config (.tcfg) file: '
                           + ('it is empty' if not data else f'it reads as {kind}' if kind else
                              'its first bytes are not one\'s') + '. '
                           '--train-config takes onert-micro\'s training-config file (which ops '
                           'train, how much of each), as onert-micro\'s tools and prepare '
                           '--select (train.tcfg in its folder) write it; to say what trains '
                           'without one: --train (all, last:N, ...) or --ranks OP:RANK,...')
    problem = (f'truncated training-config header ({len(data)} bytes)' if head is None
               else f'not an onert-micro training-config file (magic {head[0]}, want {MAGIC})'
               if head[0] != MAGIC
               else f'training-config version {head[1]}, utrain reads {VERSION}' if head[1] != VERSION
               else f'{len(data)} bytes, expected {8 + 3 * n} for {n} ops' if len(data) != 8 + 3 * n
               else None)
    if problem:
        raise PrepareError(f'{path}: {problem}: a damaged or cut-short training-config file; '
                           'write it again (prepare --select writes one as train.tcfg), or say '
                           'what trains with --train or --ranks OP:RANK,...')
    ops = struct.unpack_from(f'<{n}H', data, 8)
    ranks = data[8 + 2 * n:]
    out = {}
    for i, r in zip(ops, ranks):
        if i >= n_ops:
            raise PrepareError(f'{path}: lists op {i}, the model has {n_ops} ops')
        if r not in RANK_NAMES:
            raise PrepareError(f'{path}: op {i} has unknown rank {r}')
        if i in out:
            raise PrepareError(f'{path}: op {i} listed twice')
        out[i] = r
    return out


def write_train_config(path, ranks: dict, onert_only=True):
    """Write {op index: rank code} (sorted by op)."""
    bad = {i: RANK_NAMES[r] for i, r in ranks.items() if r not in ONERT_RANKS}
    if bad and onert_only:
        raise PrepareError(f'{path}: ranks {bad} have no onert-micro training-config code')
    ops = sorted(ranks)
    atomic_write(path, struct.pack(f'<HBBI{len(ops)}H', MAGIC, VERSION, 0, len(ops), *ops)
                 + bytes(ranks[i] for i in ops))
