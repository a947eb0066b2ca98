"""Fewer samples for a prepared run folder: a test that checks where a run trains (its heap,
its bytes), not how far it learns, keeps the first samples of train.ds and test.ds so the
board runs seconds, not minutes.  The records are kept as prepare wrote them (dtype,
scale), only the header's count changes."""
import json
import os
import struct

# dataset header: '<4sHBBIII...' (utrain.data.header): the count is the u32 at byte 8
_COUNT = 8
_SIZE = {0: 4, 1: 1, 2: 1}      # float32, uint8, int8


def keep_first(out, train, test=None):
    """Keep the first train samples of out's training set and test of its test set (all of
    it when None or when it holds fewer)."""
    with open(os.path.join(out, 'train.json')) as f:
        files = json.load(f)['files']
    for key, n in (('train', train), ('test', test)):
        if n is None or not files.get(key):
            continue
        path = os.path.join(out, files[key])
        with open(path, 'rb') as f:
            data = f.read()
        _, ver, xt, yt, count, xl, yl = struct.unpack('<4sHBBIII', data[:20])
        head = 32 if ver == 1 else 48      # (utrain.data.HEAD)
        rec = _SIZE[xt] * xl + _SIZE[yt] * yl
        assert len(data) == head + count * rec, path
        n = min(n, count)
        with open(path, 'wb') as f:
            f.write(data[:_COUNT] + struct.pack('<I', n) + data[_COUNT + 4:head + n * rec])
