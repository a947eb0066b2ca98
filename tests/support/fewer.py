"""Fewer samples for a prepared run folder: a test that checks where a run trains (its heap,
its bytes), not how far it learns, keeps the first samples of train.ds and test.ds so the
board runs seconds, not minutes.  The records are kept as prepare wrote them (dtype,
scale), only the header's count changes."""
import json
import os
import struct

from host_tools.target.device import module

_COUNT = 8      # the header's sample count: a u32 after '<4sHBB' (utrain.data.header)


def keep_first(out, train, test=None):
    """Keep the first train samples of out's training set and test of its test set (all of
    it when None or when it holds fewer)."""
    data_mod = module('data')
    with open(os.path.join(out, 'train.json')) as f:
        files = json.load(f)['files']
    for key, n in (('train', train), ('test', test)):
        if n is None or not files.get(key):
            continue
        path = os.path.join(out, files[key])
        with open(path, 'rb') as f:
            data = f.read()
        _, head, xt, yt, count, xl, yl = data_mod.header(path, data[:data_mod.HEAD])[:7]
        rec = data_mod.TYPES[xt][0] * xl + data_mod.TYPES[yt][0] * yl
        assert len(data) == head + count * rec, path
        n = min(n, count)
        with open(path, 'wb') as f:
            f.write(data[:_COUNT] + struct.pack('<I', n) + data[_COUNT + 4:head + n * rec])
