"""What a file given as a model is when it is none: its first bytes read as the files a
user has beside one (data, a run folder's, images, a Git LFS pointer, text).  One place
for every reader (circle_io, onnx_io, trainconfig, fleet), below all of them."""


def kind_of(raw: bytes) -> str | None:
    """What a file given as a model is, by its first bytes (the files a user has beside
    one: data, a run folder's, images), or None."""
    if not raw:             # (an empty file reads as no kind, not as text)
        return None
    head = raw[:4]
    kinds = {b'PK\x03\x04': 'a zip archive (an .npz of data?)', b'\x89PNG': 'a PNG image',
             b'UTDS': "utrain's samples (a .ds file)", b'UTFM': "utrain's board model (model.flat, "
             "which prepare writes from the model)", b'UTPC': "utrain's prefix cache"}
    if head in kinds:
        return kinds[head]
    if head == b'\x93NUM':       # (np.save's: one array, where an .npz holds x and y)
        return 'a NumPy array (.npy: one array)'
    if head[:3] == b'\xff\xd8\xff':
        return 'a JPEG image'
    if raw[4:8] in (b'CIR0', b'TFL3'):
        return 'a circle model (.circle)' if raw[4:8] == b'CIR0' else 'a TFLite model (.tflite)'
    if raw[:4] == b'\x1d\x00\x01\x00':       # (files/trainconfig.py's MAGIC 29, VERSION 1)
        return "onert-micro's training config (a .tcfg file)"
    from ..target.device import module
    if int.from_bytes(head[:2], 'little') == module('wof').MAGIC:      # (.wof and .ckpt)
        return "utrain's weights (a .wof or .ckpt file)"
    if b'\0' in raw[:4096]:
        return None
    try:
        text = raw[:4096].decode('utf-8')
    except UnicodeDecodeError as e:
        if e.start < min(len(raw), 4096) - 3:       # (not a character cut at 4096)
            return None
        text = raw[:e.start].decode('utf-8')
    if text.startswith('version https://git-lfs.github.com/spec/'):
        # (a file of a repository stored with Git LFS, cloned or downloaded without it)
        size = next((ln.split()[1] for ln in text.splitlines()[1:]
                     if ln.startswith('size ') and len(ln.split()) == 2), None)
        return ('a Git LFS pointer, not the model' + (f' (its {size} bytes are' if size else
                                                      ' (it is') + ' on the repository\'s LFS '
                'server): in the clone, `git lfs install` and `git lfs pull` fetch it; or '
                'download the file itself (GitHub: the file\'s Download button)')
    if any(c < ' ' and c not in '\t\n\r\f' for c in text):
        return None         # (control bytes: an ONNX protobuf cut short had 'read as text')
    return 'JSON text' if text.lstrip()[:1] in ('{', '[') else 'text'
