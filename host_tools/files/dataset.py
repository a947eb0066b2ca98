"""Dataset record files for the device (layout in docs/formats.md) and converters to
them from .npz arrays, .csv tables and folders of images (one sub-folder per class)."""
from __future__ import annotations

import contextlib
import os

import numpy as np

from ..formats.circle_io import atomic_write
from ..target.device import module

# the format's reader and header writer are the board's (utrain.data, utrain.collect)
_data, _collect = module('data'), module('collect')
MAGIC, VERSION, HEAD = _data.MAGIC, _data.VERSION, _data.HEAD
DTYPES = {'float32': 0, 'uint8': 1, 'int8': 2}      # utrain.data.TYPES' order
NP = {0: '<f4', 1: 'u1', 2: 'i1'}
IMAGE_EXT = ('.png', '.jpg', '.jpeg', '.bmp', '.gif', '.pgm', '.ppm', '.tif', '.tiff', '.webp')


class DataError(ValueError):
    pass


MAX_FILE = 1 << 30          # CSV bytes read
MAX_PIXELS = 1 << 24        # pixels of one image (PIL's bomb limit is 89 M)


def load_npz(path):
    """(x, y) from an .npz holding arrays named x and y."""
    if not os.path.exists(path):
        from ..paths import broken_link
        raise DataError(broken_link(path) or f'{path}: no such file')
    try:
        with np.load(path, allow_pickle=False) as z:
            if 'x' not in z or 'y' not in z:
                several = 'y' in z and len(z.files) > 2     # (an array per input)
                raise DataError(f'{path}: needs arrays named x and y (has {", ".join(z.files)})'
                                + ('; an array per input is for a model with several inputs: '
                                   'prepare or evaluate it with that model' if several else
                                   # (X/Y, data/labels, np.savez's arr_0/arr_1: said how)
                                   ': save the samples as x and the labels as y, '
                                   'np.savez(path, x=samples, y=labels)'))
            x, y = z['x'], z['y']
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        from .validate import NPZ_AGAIN     # (had said what, not what to do)
        raise DataError(f'{path}: not a readable .npz file ({e}): {NPZ_AGAIN}') from None
    return _checked(path, x, y)


def _checked(path, x, y):
    # (bool arrays, numpy's y > t or a mask: the numbers 0 and 1; labels of True/False had
    # been refused as 'class numbers 0 to 3' for a 4-output model, the loss not inferred)
    x, y = (a.astype(np.uint8) if a.dtype == np.bool_ else a for a in (x, y))
    if len(x) != len(y):
        raise DataError(f'{path}: x has {len(x)} samples but y has {len(y)}: give one label '
                        '(a row of y) a sample, in the samples\' order')
    if len(x) == 0:
        raise DataError(f'{path}: holds no samples')
    for name, a in (('x', x), ('y', y)):
        if a.ndim > 1 and not a[0].size:
            # (`dataset` of an (N, 0) array: an IndexError or numpy's 'zero-size array to
            # reduction operation minimum' had escaped; prepare and evaluate said the model's)
            raise DataError(f'{path}: {name} has shape {a.shape}: no values a sample; '
                            f'save {name} with each sample\'s values ({name}.reshape(len({name}), '
                            '-1) of at least one column)')
    return x, y


def load_csv(path, label='last', inputs=None):
    """(x, y) from a CSV table of numbers: one sample a row, the label in the first or
    last column (label='first'|'last'), or the targets in as many columns there as a row
    holds beyond a model's inputs values (a regression of several outputs, a class a
    step); a header row of names is skipped."""
    import csv
    rows = []
    if os.path.getsize(path) > MAX_FILE:
        raise DataError(f'{path}: {os.path.getsize(path)} bytes; at most {MAX_FILE >> 20} MB of '
                        'CSV is read (convert a larger set to .npz)')
    k, lines, index = 0, [], False
    try:
        # (utf-8-sig: a spreadsheet's byte-order mark had been 'not a number ('\ufeff1')')
        with open(path, newline='', encoding='utf-8-sig') as f:
            for k, row in enumerate(csv.reader(f)):
                if not row or not ''.join(row).strip():
                    continue
                try:
                    rows.append([float(v) for v in row])
                    lines.append(k + 1)
                except ValueError:
                    sep = next((c for c in ';\t|' if len(row) == 1 and c in row[0]), None)
                    if (sep is None and len(row) == 1 and len(row[0].split()) > 1
                            and all(_number(v) for v in row[0].split())):
                        sep = ' '       # (had been 'not a number in column 1', of line 2)
                    semi = sep is None and len(row) > 1 and any(';' in v for v in row)
                    if sep or semi:     # (had been 'labels must be class numbers', of the whole row)
                        raise DataError(f'{path}: line {k + 1} is ' + (
                            f'one column of values separated by {sep!r} ({row[0][:40]!r})' if sep
                            else "values separated by ';' with decimal commas ("
                                 f"{','.join(row)[:40]!r})") + '; utrain reads comma-separated '
                                        "values" + ('' if sep else " with '.' as the decimal point")
                                        + ": save the table with ',' between columns "
                                        "(pandas: df.to_csv(path, sep=',', index=False)"
                                        + ('' if sep else "; read it with pd.read_csv(path, "
                                           "sep=';', decimal=',')") + ')') from None
                    if k == 0 and (not all(_number(v) or _number_like(v) or _missing(v)
                                           for v in row) or _frame_header(row)):
                        # (a name among them: a header.  A first row of numbers with a gap
                        # ('NA', an empty cell) or a number written otherwise ('\u22121.5',
                        # '1,5') had been taken for one and its sample dropped, unsaid)
                        index = not row[0].strip()     # (pandas' header over its index)
                        continue                       # header
                    j = next(j for j, v in enumerate(row) if not _number(v))
                    last = (j == len(row) - 1 if label == 'last' else j == 0) and len(row) > 1
                    if not row[j].strip():
                        # (a trailing comma's empty last column, or a gap: had been 'labels
                        # must be class numbers', of a column that holds no label)
                        raise DataError(f'{path}: line {k + 1}: column {j + 1} is empty' + (
                            ' (the line ends in a comma): remove the commas that end the lines'
                            if j == len(row) - 1 else ': fill it in, or drop the line')) from None
                    if _missing(row[j]):
                        raise DataError(f'{path}: line {k + 1}: column {j + 1} holds {row[j]!r}, '
                                        'a missing value: fill it in, or drop the line') from None
                    raise DataError(f'{path}: line {k + 1}: not a number in column {j + 1} '
                                    f'({row[j][:40]!r})' + (
                                        f'; {_number_like(row[j])}' if _number_like(row[j]) else
                                        '; labels must be class numbers 0, 1, ... (or '
                                        'target values): number the classes' if last else
                                        '; a CSV of numbers is expected' + (
                                            ' (a comment line? remove it)' if
                                            row[j].lstrip().startswith('#') else ''))) from None
    except UnicodeDecodeError as e:
        # (what to do had been left unsaid: 'a CSV of numbers is expected', of one saved
        # as Excel's 'Unicode Text' or in a Windows code page)
        with open(path, 'rb') as f:
            head = f.read(2)
        raise DataError(f'{path}: ' + (
            'UTF-16 text (Excel\'s "Unicode Text")' if head in (b'\xff\xfe', b'\xfe\xff') else
            f'not UTF-8 text near byte {e.start} (another encoding: Latin-1, a Windows code '
            'page)') + ': save it as UTF-8 ("CSV UTF-8" in Excel; pandas writes UTF-8: '
            "to_csv(path, index=False))") from None
    except csv.Error as e:
        raise DataError(f'{path}: line {k + 2}: not a readable CSV row ({e})') from None
    if not rows:
        raise DataError(f'{path}: holds no samples')
    if len(rows[0]) < 2:
        raise DataError(f'{path}: line {lines[0]} has 1 column; a row holds a sample\'s values and '
                        f'its label (in the {label} column), comma-separated')
    odd = next((i for i, r in enumerate(rows) if len(r) != len(rows[0])), None)
    if odd is not None:
        raise DataError(f'{path}: line {lines[odd]} has {len(rows[odd])} columns, line {lines[0]} '
                        f'{len(rows[0])}: every row holds a sample\'s values and its label (fill '
                        'or drop the short rows)')
    a = np.array(rows, dtype=np.float64)
    if index and len(a) > 2 and np.array_equal(a[:, 0], np.arange(len(a))):
        # (df.to_csv(path) keeps the frame's index: read as an input or a target, it had
        # been 'targets have 2 values per sample, the model outputs 3')
        raise DataError(f'{path}: column 1 holds the row numbers 0, 1, 2, ... under an '
                        'empty header cell: pandas\' index, not data; save the frame with '
                        'df.to_csv(path, index=False), or drop that column')
    k = a.shape[1] - inputs if inputs and a.shape[1] - inputs > 1 else 1
    if label == 'first':
        return _checked(path, a[:, k:], a[:, 0] if k == 1 else a[:, :k])
    return _checked(path, a[:, :-k], a[:, -1] if k == 1 else a[:, -k:])


def _number(v) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def _frame_header(row) -> bool:
    """pandas' header of a frame of integer column names saved with its index
    (df.to_csv(path)): ',0,1,2,...'."""
    return not row[0].strip() and [v.strip() for v in row[1:]] == [str(i) for i in
                                                                   range(len(row) - 1)]


_MISSING = ('', 'na', 'n/a', 'nan', 'null', 'none', '?', '-', '--', '#n/a')


def _missing(v) -> bool:
    """A spreadsheet's or pandas' mark of a missing value ('NA', 'N/A', 'null', '?', an
    empty cell)."""
    return v.strip().lower() in _MISSING


def _number_like(v) -> str:
    """What to write instead, for a cell that is a number written another way (a Unicode
    minus, a decimal comma, a percent sign), else ''."""
    t = v.strip()
    fixes = []
    for bad, what, good in (('\u2212', "'\u2212' (Unicode minus)", '-'),
                            ('\u2013', "'\u2013' (en dash)", '-'),
                            (',', 'a decimal comma', '.')):
        if bad in t:
            t, _ = t.replace(bad, good), fixes.append(f"{what}: write {good!r}")
    if t.endswith('%'):
        t, _ = t[:-1], fixes.append("a percent sign: write the number alone")
    return ('the number is written with ' + '; '.join(fixes)) if fixes and _number(t) else ''


def class_folders(path):
    """The class sub-folders of image folder path, sorted (their class numbers 0, 1, ...):
    its folders but hidden ones (.ipynb_checkpoints, a Mac's __MACOSX), which are no class
    (a notebook's checkpoints folder, sorted first, had become class 0 and moved every
    class's number up by one)."""
    return sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))
                  and not d.startswith('.') and d != '__MACOSX')


def _class_files(folder):
    """(image files, other files) under class folder folder, its sub-folders too (as
    Keras's image_dataset_from_directory reads them), in sorted order; hidden files and
    folders (a Mac's ._NAME beside each file, .DS_Store) left out."""
    images, other = [], []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
        for fn in sorted(files):
            if fn.startswith('.'):
                continue
            (images if fn.lower().endswith(IMAGE_EXT) else other).append(os.path.join(top, fn))
    return images, other


def _pixels(im, f, gray):
    """Image im (of file f) as 8-bit gray or RGB: 16-bit gray ones at their top 8 bits
    (PIL's convert clips them: a 16-bit PNG became all 255), 32-bit and float ones refused."""
    if im.mode.startswith('I;16') or (im.mode == 'I' and im.format == 'PNG'):
        from PIL import Image
        im = Image.fromarray((np.asarray(im, np.uint32) >> 8).astype(np.uint8), 'L')
    elif im.mode in ('I', 'F'):
        raise DataError(f'{f}: {"32-bit" if im.mode == "I" else "floating-point"} pixels; '
                        'utrain reads 8-bit (or 16-bit PNG) images: save it as an 8-bit PNG')
    return im.convert('L' if gray else 'RGB')


def load_images(path, size=None, gray=True):
    """(x, y, class names) from a folder with one sub-folder of images per class
    (class_folders: sorted names = class indices 0, 1, ...; a class's images in its
    sub-folders too); pixels as uint8, resized to size (w, h) when given, otherwise all
    images must share the first one's size."""
    from PIL import Image
    if any(os.path.isfile(os.path.join(path, n)) for n in ('train.json', 'prepare.json')):
        # (its lib/ and earlier-N/ had been read as classes of no images)
        raise DataError(f'{path}: a run folder (prepare wrote it), not a folder of images: give '
                        'its test.ds (the held-out samples) or train.ds, or the data it was '
                        'prepared from')
    classes = class_folders(path)
    if not classes:
        raise DataError(f'{path}: no class sub-folders (expected {path}/<class>/<image>): put '
                        'each class\'s images in a sub-folder of its own')
    if size and int(size[0]) * int(size[1]) > MAX_PIXELS:
        # (--size 100000x100000: each image resized to 10^10 pixels, the process killed
        # for its memory, no message)
        raise DataError(f'--size {size[0]}x{size[1]}: {int(size[0]) * int(size[1])} pixels an '
                        f'image; at most {MAX_PIXELS} are read: give the size the model takes, '
                        'e.g. 32x32')
    xs, ys = [], []
    for c, name in enumerate(classes):
        for f in _class_files(os.path.join(path, name))[0]:
            try:
                with Image.open(f) as im:
                    if im.width * im.height > MAX_PIXELS:
                        raise DataError(f'{f}: {im.width}x{im.height} pixels; at most '
                                        f'{MAX_PIXELS} are read (an image bomb?): make it smaller '
                                        'or move it out of the folder')
                    im = _pixels(im, f, gray)
                    if size:
                        im = im.resize(size)
                    a = np.asarray(im, dtype=np.uint8)
            except (OSError, ValueError, Image.DecompressionBombError, SyntaxError) as e:
                if isinstance(e, DataError):
                    raise
                raise DataError(f'{f}: not a readable image ({e}): move it out of the class '
                                'folder, or save it again as an image') from None
            if xs and a.shape != xs[0].shape:
                # (prepare has no --size: 'give --size WxH' was refused by it)
                raise DataError(f'{f}: {a.shape[1]}x{a.shape[0]} pixels, the first image is '
                                f'{xs[0].shape[1]}x{xs[0].shape[0]}: resize the images to one '
                                f'size (`python -m host_tools dataset {path} --size WxH -o DIR` '
                                'writes them resized into DIR/train.ds, which prepare takes; '
                                'evaluate and dataset take --size WxH)')
            xs.append(a)
            ys.append(c)
    if not xs:
        raise DataError(f'{path}: no images ({", ".join(IMAGE_EXT)}) in the class folders '
                        f'({", ".join(classes)})' + _not_images(path, classes))
    return np.stack(xs), np.array(ys), classes


def _not_images(path, classes) -> str:
    """What the class folders hold that is no image utrain reads (a suffix for a refusal)."""
    other = [f for c in classes for f in _class_files(os.path.join(path, c))[1]]
    if not other:
        return ': put each class\'s images in its folder'
    exts = sorted({os.path.splitext(f)[1].lower() or os.path.basename(f) for f in other})
    return (f': they hold {len(other)} other files ({", ".join(exts[:5])}); save the images '
            'in one of those formats')


def classes_fit(path, n_out) -> None:
    """Refuse (DataError) image folder path for a model of n_out outputs (a classifier:
    two or more) when it has more class folders than the model has classes, naming them
    (an empty one too: its number is taken; the refusal had been 'labels must be whole
    numbers 0 to 2 ... number the classes from 0', or for an empty last folder 'mse
    wants one target per output')."""
    if not n_out or n_out < 2 or not os.path.isdir(path):
        return
    classes = class_folders(path)
    if len(classes) <= n_out:
        return
    empty = [c for c in classes if not _class_files(os.path.join(path, c))[0]]
    names = ', '.join(c + (' (no images)' if c in empty else '') for c in classes[:8]) + (
        ', ...' if len(classes) > 8 else '')
    raise DataError(f'{path}: {len(classes)} class folders ({names}), and the model has '
                    f'{n_out} outputs: ' + (
                        f'move the empty folder{"s" * (len(empty) > 1)} out of it' if
                        len(classes) - len(empty) <= n_out else
                        f'keep {n_out} classes (each sub-folder, in sorted order, is a class), '
                        f'or give the model {len(classes)} outputs (a new last layer)'))


def labels(path, label='last', shape=None):
    """The targets of a data source as load gives them (shape: the model input's, whose
    values a .csv row holds before its targets), reading no more than they need: an
    image folder's are its class numbers (one of each here: the sub-folders, sorted, as
    load_images numbers them; no image is decoded), an .npz's its y alone."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return np.arange(len(class_folders(path)))
    if path.lower().endswith('.npz') and os.path.exists(path) and not _pipe(path):
        try:
            with np.load(path, allow_pickle=False) as z:
                y = z['y']
                return y.astype(np.uint8) if y.dtype == np.bool_ else y
        except Exception:       # noqa: B902 - empty (EOFError), damaged: load says what is wrong
            pass
    return load(path, label, shape=shape if path.lower().endswith('.csv') else None)[1]


# image folder (absolute path) -> (scale, offset): its 0..255 pixels read as pixel * scale
# + offset within pixels_as (the values the model was trained on: infer.image_pixels)
_PIXELS = {}


@contextlib.contextmanager
def pixels_as(path, scale, offset):
    """Within the block, load() reads the image folder at path with its pixels as
    pixel * scale + offset (elsewhere 0..1: pixel / 255)."""
    key = os.path.abspath(os.fspath(path))
    old = _PIXELS.get(key)
    _PIXELS[key] = (scale, offset)
    try:
        yield
    finally:
        if old is None:
            _PIXELS.pop(key, None)
        else:
            _PIXELS[key] = old


def _pipe(path) -> bool:
    import stat
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def load(path, label='last', size=None, shape=None):
    """(x, y) from an .npz, a .csv, a .ds record file or a folder of class
    sub-folders of images (pixels scaled to [0, 1], or as pixels_as says; for a model
    input of NHWC shape, in its size and channels, as its input takes them)."""
    path = os.fspath(path)
    from ..formats.ir import device
    if device(path):
        raise DataError(device(path))
    if not path.lower().endswith('.csv') and _pipe(path):
        # (a named pipe no process writes: open() had waited for one forever)
        raise DataError(f'{path}: a pipe (a FIFO), not a file: an .npz or .ds is read by '
                        'seeking in it; save the data as a file and give its path (a .csv may '
                        'come through a pipe)')
    if os.path.isdir(path):
        gray, nchw = True, False
        if shape is not None and len(shape) == 4 and (shape[3] in (1, 3) or shape[1] in (1, 3)):
            # (RGB images for an RGB model were read gray at their own size and refused:
            # 'x has 64 values per sample, the model input takes 192')
            nchw = shape[3] not in (1, 3)           # (an ONNX model as read: NCHW)
            c, h, w = shape[1:] if nchw else (shape[3], shape[1], shape[2])
            gray, size = c == 1, size or (int(w), int(h))
        x, y, _ = load_images(path, size, gray)
        if nchw and x.ndim == 4:
            x = x.transpose(0, 3, 1, 2)
        scale, offset = _PIXELS.get(os.path.abspath(path), (None, 0.0))
        if scale is None:
            return x.astype(np.float32) / 255.0, y
        return x.astype(np.float32) * np.float32(scale) + np.float32(offset), y
    if not os.path.exists(path):
        from ..paths import broken_link
        raise DataError(broken_link(path) or f'{path}: no such file or folder')
    if path.lower().endswith('.csv'):
        return load_csv(path, label, int(np.prod(shape[1:])) if shape is not None else None)
    if path.lower().endswith('.ds'):
        x, y = read_dataset(path)
        return x, (y[:, 0] if y.shape[1] == 1 else y)
    from .validate import check_npz, PrepareError
    try:
        check_npz(path)          # sizes and types from the headers, before loading
    except PrepareError as e:
        raise DataError(str(e)) from None
    return load_npz(path)


def quantization(x, dtype: str):
    """(scale, offset) mapping the stored dtype onto x's range: value = q * scale + offset."""
    lo, hi = float(np.min(x)), float(np.max(x))
    ints = dtype != 'float32' and hi - lo <= 255 and np.all(x == np.round(x))
    if dtype == 'uint8':
        if lo >= 0 and hi <= 255 and ints:
            return 1.0, 0.0                        # already bytes
        if ints:                                   # integers (ids) kept exact
            return 1.0, lo
        lo = min(lo, 0.0)
        return (hi - lo) / 255.0 or 1.0, lo
    if dtype == 'int8':
        if ints:
            return 1.0, 0.0 if lo >= -128 and hi <= 127 else lo + 128
        return max(abs(lo), abs(hi)) / 127.0 or 1.0, 0.0
    return 1.0, 0.0


def balance(y, classes=None) -> str:
    """Class balance of labels y (class indices or one-hot rows; classes: one-hot rows of
    that many, several a sample, a class a step) as one line."""
    y = np.asarray(y)
    if classes:
        y = y.reshape(-1, classes)
    if y.ndim == 2 and y.shape[1] > 1:
        y = y.argmax(axis=1)
    y = y.reshape(-1)
    if len(y) == 0 or np.any(y != np.round(y)):
        return 'targets are not class labels'
    vals, counts = np.unique(y.astype(int), return_counts=True)
    n = len(y)
    return ', '.join(f'{v}: {c} ({100 * c / n:.0f}%)' for v, c in zip(vals, counts))


def per_step(out_shape):
    """(T, C) when a model output of out_shape ([1, ..., C]) is a row of C values for each
    of T > 1 steps (a Dense or a Conv1D on a sequence, a class a step), else None."""
    d = [int(v) for v in (out_shape or [])[1:]]
    t = int(np.prod(d[:-1])) if len(d) > 1 else 1
    return (t, d[-1]) if t > 1 and d[-1] > 1 else None


def step_labels(y, out_shape) -> bool:
    """Are y a class number per step (N, T) for an output of T rows of C (per_step)?"""
    ps, y = per_step(out_shape), np.asarray(y)
    return bool(ps) and y.ndim >= 2 and len(y) > 0 and y[0].size == ps[0] and \
        np.issubdtype(y.dtype, np.number) and bool(np.all(y == np.round(y)))


def targets(y, loss: str, n_out: int, where: str, out_shape=None):
    """Expected data per sample as the device wants it: class index for scce, one-hot
    for cce given labels (a class number per step for an output of a row a step: one-hot
    per step), otherwise the output values."""
    y = np.asarray(y)
    classes_fit(where, n_out)        # (an image folder's labels: its class folders)
    labels = y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1 and n_out > 1)
    ps = per_step(out_shape)
    if ps and loss in ('scce', 'cce') and labels:
        raise DataError(f'{where}: one class number a sample, and the model outputs '
                        f'{list(out_shape)[1:]} a sample, rows of values (e.g. a class a step), '
                        f'not one: give y a class number a row, shape (N, {ps[0]}) for rows of '
                        f'{ps[1]}, or end the model in one row (pool over the steps before its '
                        'last layer)')
    d = [int(v) for v in (out_shape or [])[1:]]
    if loss in ('scce', 'cce') and labels and len(d) > 1 and d[-1] == 1 and np.prod(d) > 1:
        # (the board's cross-entropy takes the output's last axis as the classes, a row of
        # them a step: here rows of one value, and a class number over them failed on the
        # board in losses._onehot with IndexError at any heap, after prepare had taken the
        # outputs' count for the classes: h66c's Keras 1-D autoencoder, [1, 40, 1])
        n = int(np.prod(d))
        raise DataError(f'{where}: class numbers, and the model outputs {d} a sample: {n} rows '
                        f'of one value (its last axis, of 1, is the classes): end the model in '
                        f'one row of {n} (a Flatten or Reshape to [1, {n}]) for {n} classes, or '
                        'train the values with --loss mse')
    if ps and loss in ('scce', 'cce') and step_labels(y, out_shape):
        if loss == 'scce':
            raise DataError(f'{where}: a class number a step ({ps[0]} a sample): they train '
                            'with --loss cce (one-hot a step; scce takes one class a sample)')
        y = y.reshape(len(y), ps[0])
        _class_numbers(y.reshape(-1), ps[1], loss, where, ps[0])
        return np.eye(ps[1], dtype=np.float32)[y.astype(int)].reshape(len(y), -1)
    if loss == 'scce':
        if not labels:
            if y.ndim != 2 or y.shape[1] != n_out:
                # (it had said what scce wants, not what to give; of a .csv with a column
                # too many, an id, not that its columns after the inputs are the targets)
                raise DataError(f'{where}: y has shape {y.shape}; scce wants class labels: give '
                                f'y one class number (0 to {n_out - 1}) a sample, shape (N,), or '
                                f'{n_out} values a sample (one-hot), shape (N, {n_out})' + (
                                    f'; a .csv row holds the model\'s input values, then the '
                                    f'label: these rows have {y.shape[1] if y.ndim == 2 else 0} '
                                    'columns after the inputs (drop other columns, an id or a '
                                    'date; --label first or last says where the label is)'
                                    if str(where).lower().endswith('.csv') else ''))
            y = y.argmax(axis=1)
        y = y.reshape(-1)
        _class_numbers(y, n_out, loss, where)
        return y.astype(np.float32).reshape(-1, 1)
    if loss == 'cce' and labels:
        y = y.reshape(-1)
        _class_numbers(y, n_out, loss, where)
        return np.eye(n_out, dtype=np.float32)[y.astype(int)]
    y = y.reshape(len(y), -1).astype(np.float32)
    if y.shape[1] != n_out:
        hint = f'{loss} wants one target per output ({n_out} values a sample)'
        if y.shape[1] == 1 and n_out > 1 and np.all(y == np.round(y)) and \
                (y.min() < 0 or y.max() >= n_out):
            # class numbers the data-chosen scce passed over: say why
            hint = (f'as class numbers they would need to be whole numbers 0 to {n_out - 1}, '
                    f'and these run from {y.min():g} to {y.max():g}; number the classes from 0 '
                    f'(--loss scce), or give {loss} {n_out} values a sample')
        elif y.shape[1] == 1 and n_out > 1 and np.all(y == np.round(y)):
            hint = (f'these are class numbers 0 to {n_out - 1}, which train with --loss scce '
                    f'(or cce); {hint}')
        elif y.shape[1] == 1 and n_out > 1 and np.mean(y == np.round(y)) >= 0.9:
            # (a few that are not whole numbers kept the data-chosen scce away, unsaid)
            odd = y[:, 0] != np.round(y[:, 0])
            k = int(np.argmax(odd))
            hint = (f'as class numbers ({n_out} classes) they would need to be whole numbers, and '
                    f'{int(odd.sum())} of {len(y)} are not (sample {k} has {y[k, 0]:g}): fix '
                    f'those; or {hint}')
        d = [int(v) for v in (out_shape or [])[1:]]
        if len(d) == 2 and d[0] > 1 and y.shape[1] == d[1] != d[0] and np.all(y == np.round(y)):
            # (PyTorch's (N, C, T) map of a class a step: the classes come first)
            hint = (f'as a class a step ({d[1]} a sample) they need the model\'s output as rows '
                    f'of classes, ({d[1]}, {d[0]}), and it is ({d[0]}, {d[1]}): transpose it in '
                    'the model before its softmax (PyTorch: y.transpose(1, 2), then '
                    'torch.softmax(y, -1)); or ' + hint)
        if str(where).lower().endswith('.csv'):
            hint += (f'; a .csv row holds the input values, then the targets ({n_out} columns '
                     'a row after the inputs)')
        raise DataError(f'{where}: y has {y.shape[1]} values per sample, the model outputs '
                        f'{n_out}: {hint}')
    if loss in ('bce', 'cce') and len(y) and y.min() < 0:
        # (a cross-entropy of a negative target has no lowest value: training drives the
        # loss down without end, to Inf and NaN, at any lr)
        cross_entropy_range(y, loss, where)
    return y


def cross_entropy_range(y, loss: str, where: str) -> None:
    """DataError naming the first target y (one row a sample) outside 0..1 of a
    cross-entropy loss, and what to give instead."""
    out = (y < 0) | (y > 1)
    k = int(np.argmax(out.any(axis=1)))
    v = y[k][np.argmax(out[k])]
    raise DataError(f'{where}: {loss} takes targets from 0 to 1 (a probability an output), '
                    f'and sample {k} has {v:g} (the targets run from {y.min():g} to '
                    f'{y.max():g}): its loss has no lowest value there, and training drives it '
                    'to Inf and NaN; for class numbers use --loss scce, for values --loss mse or '
                    'mae, or scale the targets into 0..1')


def _class_numbers(y, n_out: int, loss: str, where: str, steps=1):
    """Refuse labels y (one a sample, or steps a sample in a row) that are not class
    numbers 0 .. n_out - 1, saying which are not and what to do."""
    bad = (y < 0) | (y >= n_out) | (y != np.round(y))
    if not np.any(bad):
        return
    k = int(np.argmax(bad))
    if steps > 1:
        raise DataError(f'{where}: labels must be whole numbers 0 to {n_out - 1} (the model has '
                        f'{n_out} classes a step); sample {k // steps} step {k % steps} has '
                        f'{y[k]:g} ({int(bad.sum())} of {len(y)} are outside): number the '
                        'classes from 0')
    if n_out < 2:
        raise DataError(f'{where}: {loss} takes one output per class and the model has '
                        f'{n_out}: a one-output (sigmoid) classifier trains with --loss bce on '
                        'labels 0 and 1')
    raise DataError(f'{where}: labels must be whole numbers 0 to {n_out - 1} (the model has '
                    f'{n_out} outputs); sample {k} has {y[k]:g} ({int(bad.sum())} of {len(y)} '
                    'are outside): number the classes from 0')


def pack_dataset(x, y, dtype='float32', scale=None, offset=None) -> bytes:
    """Version 2 records: x stored as dtype (float32|uint8|int8) with value = q * scale +
    offset (scale/offset chosen from x's range when not given), y as float32."""
    if dtype not in DTYPES:
        raise DataError(f'sample dtype {dtype!r}: expected one of {", ".join(DTYPES)}')
    code = DTYPES[dtype]
    x = np.asarray(x).reshape(len(x), -1)
    y = np.ascontiguousarray(y, dtype='<f4').reshape(len(y), -1)
    if scale is None:
        scale, offset = quantization(x, dtype)
    offset = offset or 0.0
    if code:
        info = np.iinfo(NP[code])
        q = np.clip(np.round((x.astype(np.float64) - offset) / scale), info.min, info.max)
        xb = q.astype(NP[code])
    else:
        scale, offset = 1.0, 0.0
        xb = x.astype('<f4')
    head = _collect.header_bytes(code, len(x), x.shape[1], y.shape[1], scale, offset)
    rec = np.empty((len(x), xb.itemsize * x.shape[1] + 4 * y.shape[1]), np.uint8)
    rec[:, :xb.itemsize * x.shape[1]] = np.ascontiguousarray(xb).view(np.uint8).reshape(len(x), -1)
    rec[:, xb.itemsize * x.shape[1]:] = y.view(np.uint8).reshape(len(y), -1)
    return head + rec.tobytes()


def write_dataset(path, x, y, dtype='float32', scale=None, offset=None) -> None:
    atomic_write(path, pack_dataset(x, y, dtype, scale, offset))


DS_AGAIN = ('write the file again (prepare, or `python -m host_tools dataset`), or copy it '
            'again from where it was written')


def _read(path, n=-1):
    try:
        with open(path, 'rb') as f:
            return f.read(n)
    except OSError as e:
        raise DataError(f'{path}: cannot read ({e.strerror})') from None


def header(path, data=None):
    """(version, header bytes, x dtype, y dtype, samples, x values, y values, x scale,
    x offset, y scale, y offset) of dataset file path (or of its bytes, data), read as
    the board reads it (utrain.data.header); DataError naming the file otherwise."""
    try:
        return _data.header(path, (_read(path, HEAD) if data is None else data)[:HEAD])
    except ValueError as e:     # (the board's own words, kept short: here what to do)
        if 'not a utrain dataset' in str(e):
            # (had said the magic, not what to do: a file of another kind named .ds, or
            # one whose first bytes are damaged)
            from ..formats.kinds import kind_of
            kind = kind_of(_read(path, 4096) if data is None else data[:4096])
            raise DataError(f'{path}: not a utrain dataset' + (
                f' (it reads as {kind}); give the data as its own kind, by its own name'
                if kind else f' (its first bytes are not a .ds file\'s): {DS_AGAIN}')) from None
        raise DataError(f'{e}: {DS_AGAIN}' if any(w in str(e) for w in (
            'damaged header', 'version', 'truncated')) else str(e)) from None


def record_bytes(h) -> int:
    """Bytes of one sample's record in a file of header h (header())."""
    return np.dtype(NP[h[2]]).itemsize * h[5] + np.dtype(NP[h[3]]).itemsize * h[6]


def read_dataset(path):
    """(x, y) as float32 arrays from a dataset file (version 1 or 2)."""
    data = _read(path)
    _, head, xt, yt, n, xl, yl, xs, xo, ys, yo = header(path, data)
    xd, yd = np.dtype(NP[xt]), np.dtype(NP[yt])
    rec = xd.itemsize * xl + yd.itemsize * yl
    if len(data) != head + n * rec:     # (had said what was wrong, not what to do)
        raise DataError(f'{path}: {len(data)} bytes, expected {head + n * rec} for {n} samples '
                        f'(cut short or damaged): {DS_AGAIN}')
    if not n:           # (prepare had failed on it: 'cannot reshape array of size 0')
        raise DataError(f'{path}: holds no samples')
    a = np.frombuffer(data, np.uint8, offset=head).reshape(n, rec)
    x = a[:, :xd.itemsize * xl].copy().view(xd).astype(np.float32) * np.float32(xs) + np.float32(xo)
    y = a[:, xd.itemsize * xl:].copy().view(yd).astype(np.float32) * np.float32(ys) + np.float32(yo)
    return x.astype(np.float32), y.astype(np.float32)


def write_samples(out_dir, x, y, test_split=0.0, seed=0, dtype='float32',
                  names=('train.ds', 'test.ds'), scale=None, offset=None, where=None,
                  given=True):
    """The samples pass of prepare and `dataset`: split x, y (one sample a row) into
    train and test, quantize both with one scale (from the whole of x, unless given: an
    int8 model's input scale) and write them into out_dir.  Returns (train rows, test
    rows, scale, offset, {name: path written}).  Class labels that come sorted (an image
    folder's class by class, a .csv sorted by label: sorted_by_class) are written to the
    train file in a seeded shuffle (the train rows returned in that order): trained in
    the file's order, each class in a block, SGD forgets the earlier ones.  where: the
    data's file, named in a refusal (samples a few outliers' step would make alike)."""
    tr, te = split(len(x), test_split, seed, given)
    if sorted_by_class(y[tr]):
        tr = np.random.default_rng(seed).permutation(tr)
    if scale is None:
        scale, offset = quantization(x, dtype)
        if dtype != 'float32':
            crushed(x, dtype, scale, offset, where or 'the samples')
    wrote, was = {}, {}
    try:
        for name, idx in zip(names, (tr, te)):
            if len(idx):
                p = os.path.join(out_dir, name)
                was[p] = _read(p) if os.path.isfile(p) else None
                write_dataset(p, x[idx], y[idx], dtype, scale, offset)
                wrote[name] = p
    except OSError:
        # (a test.ds the file system refused, full: the train.ds written before it had
        # stayed, beside 'nothing was written'; the folder is left as it was)
        for p in wrote.values():
            try:
                if was[p] is None:
                    os.remove(p)
                else:
                    atomic_write(p, was[p])
            except OSError:
                pass
        raise
    return tr, te, scale, offset, wrote


def crushed(x, dtype: str, scale: float, offset: float, where: str) -> None:
    """DataError where storing x (one sample a row) as dtype at scale and offset makes
    half or more of its distinct samples alike: a few values far outside the rest set a
    step the others all fall within (one 1e30 among values of about 1 had been stored,
    and trained on, as samples all the same, unsaid)."""
    if not np.float32(scale) >= np.finfo(np.float32).tiny:
        # (values within 1e-36 of each other: the header's float32 scale was 0 or
        # subnormal, and the files written were refused as a 'damaged header')
        raise DataError(f'{where}: the values run from '
                        f'{float(np.min(x)):.4g} to {float(np.max(x)):.4g}, a step of '
                        f'{scale:.4g} as {dtype}, smaller than float32 holds: scale the '
                        'data up, or store it as float32 (--dtype float32)')
    rows = np.asarray(x).reshape(len(x), -1)
    if len(rows) < 4:
        return
    info = np.iinfo(NP[DTYPES[dtype]])
    q = np.clip(np.round((rows.astype(np.float64) - (offset or 0.0)) / scale), info.min,
                info.max).astype(np.int16)
    n, m = len(np.unique(rows, axis=0)), len(np.unique(q, axis=0))
    if n < 4 or m * 2 > n:
        return
    k = int(np.argmax(np.abs(rows).max(axis=1)))
    v = rows[k][np.argmax(np.abs(rows[k]))]
    raise DataError(f'{where}: stored as {dtype} at one step of {scale:.4g} (the values run from '
                    f'{float(rows.min()):.4g} to {float(rows.max()):.4g}), {n - m} of its {n} '
                    f'distinct samples become alike (sample {k} holds {float(v):.4g}): a few '
                    'values far outside the rest set the step; drop or clip those samples, '
                    'or store them as float32 (--dtype float32)')


def sorted_by_class(y) -> bool:
    """Do class labels y (one a sample, or one-hot rows) come in runs, as sorted: fewer
    than a third of the changes of class a random order would have (and two classes or
    more)?  Targets that are not class labels: False."""
    y = np.asarray(y)
    if len(y) < 8:
        return False
    if y.ndim == 2 and y.shape[1] > 1:      # one-hot rows
        if not np.all((y == 0) | (y == 1)) or np.any(y.sum(axis=1) != 1):
            return False
        lab = y.argmax(axis=1)
    else:
        lab = y.reshape(len(y), -1)[:, 0]
    if np.any(lab != np.round(lab)) or len(np.unique(lab)) > len(lab) // 4:
        return False
    _, counts = np.unique(lab, return_counts=True)
    if len(counts) < 2:
        return False
    p = counts / len(lab)
    random_changes = (len(lab) - 1) * (1 - float(np.sum(p * p)))
    return int(np.sum(lab[1:] != lab[:-1])) < random_changes / 3


def targets_of(path):
    """A data file's targets (an .npz's y, read alone), or None where it cannot tell (the
    samples pass says what is wrong with the file)."""
    try:
        if os.fspath(path).lower().endswith('.npz'):
            with np.load(path, allow_pickle=False) as z:
                y = z['y'] if 'y' in z.files else None
            # (text labels: evaluate had ended on numpy's 'could not convert string to
            # float', no file named; the samples pass names it and what to give)
            return y if y is not None and y.dtype.kind in 'biuf' else None
        return load(path)[1]
    except (OSError, ValueError):        # (DataError too)
        return None


def load_inputs(path, inputs, label='last', size=None):
    """(x, y) for a model with several inputs (inputs: ([(tensor name, shape, key)] of
    those the trained output reads, in their maker's order; [keys of those it does not
    read]; the places among the model's inputs of each: runplan.one_input_output's
    g.data_inputs): an .npz gives y and an array per input, named by
    its key (inout.io_name: Keras's Input(name=...), the ONNX or circle input's name) or
    x0, x1, .. (its place among them), each sample's values joined in that order
    (inout.join_inputs); arrays for the inputs it does not read are left out.  An .npz
    with x, a .csv or a .ds holds the values joined already, one row a sample."""
    path = os.fspath(path)
    if not path.lower().endswith('.npz') or not os.path.isfile(path):
        return load(path, label, size)
    from .validate import check_npz, PrepareError
    try:
        check_npz(path)
        with np.load(path, allow_pickle=False) as z:
            files, (parts, others, at, others_at) = list(z.files), inputs    # (x0, x1: the
            # (an input named y: the .npz's y is the targets, the input's array is x{j}; y
            # had been read as that input, and an x, y file refused as 'which the model
            # takes is not clear')
            names = [f'{key} (or x{j}) {list(s[1:])}' if 'y' not in (key, n) else
                     f'x{j} {list(s[1:])}' for j, (n, s, key) in zip(at, parts)]
            if 'x' in z.files:
                both = [c for j, (n, _, key) in zip(at, parts) for c in (key, f'x{j}', n)
                        if c in files and c not in ('x', 'y')]
                if len(parts) > 1 and both:
                    # (x was read, the arrays named for the inputs left unread, unsaid,
                    # though an open dimension had been set from them)
                    raise DataError(f'{path}: holds x (the inputs\' values joined) and an array '
                                    f'named for an input ({both[0]}): which the model takes '
                                    f'is not clear; give y and an array per input '
                                    f'({", ".join(names)}), or x alone')
                x, y = load(path, label, size)
                total = sum(int(np.prod(s[1:], dtype=np.int64)) for _, s, _ in parts)
                got = int(np.prod(x.shape[1:], dtype=np.int64))
                if len(parts) > 1 and got != total:
                    raise DataError(f'{path}: x has {got} values a sample; the model\'s inputs '
                                    f'{", ".join(names)} take {total} together: give y and an '
                                    'array per input, named as those, or x with each sample\'s '
                                    f'{total} values joined in that order')
                return x, y
            unread = set(others) | {f'x{j}' for j in others_at}
            if 'y' not in files:
                raise DataError(f'{path}: needs an array y (the targets) beside one per model '
                                f'input: {", ".join(names)} (has {", ".join(files)})')
            xs, used = [], {'y'}
            for i, (name, shape, key) in zip(at, parts):
                k = next((c for c in (key, f'x{i}', name) if c in files and c != 'y'), None)
                if k is None:
                    raise DataError(f'{path}: has no array for the model\'s input {i} {key!r} '
                                    f'{list(shape[1:])} a sample: name it '
                                    f'{key + " or " if "y" not in (key, name) else ""}x{i} (the '
                                    f'model takes {", ".join(names)}; the file has '
                                    f'{", ".join(files)})')
                used.add(k)
                a = z[k]
                n = int(np.prod(shape[1:], dtype=np.int64))
                got = int(np.prod(a.shape[1:], dtype=np.int64)) if a.ndim else 0
                if got != n:
                    raise DataError(f'{path}: array {k} has {got} values a sample (shape '
                                    f'{list(a.shape)}); the model\'s input {key!r} takes {n} '
                                    f'({list(shape[1:])}): give {k} samples of {list(shape[1:])}, one row a sample, or the model '
                                    'these samples were made for')
                xs.append((k, a.reshape(len(a), n)))     # (n given: 0 samples reshape too)
            extra = [f for f in files if f not in used and f not in unread]
            if extra:
                raise DataError(f'{path}: array {extra[0]} is none of the model\'s inputs '
                                f'({", ".join(names)}) nor y: rename it to the input it is for, '
                                'or leave it out')
            y = z['y']
    except PrepareError as e:
        raise DataError(str(e)) from None
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f'{path}: not a readable .npz file ({e})') from None
    for k, a in xs:
        if len(a) != len(y):
            raise DataError(f'{path}: {k} has {len(a)} samples but y has {len(y)}: give each '
                            'input array and y one row a sample, in one order')
    return _checked(path, np.concatenate([a for _, a in xs], axis=1), y)


def read_samples(source, shape=None, perm=None, loss=None, n_out=None, where='the model input',
                 label='last', size=None, inputs=None, out_shape=None):
    """The read half of the samples pass (prepare, its int8 path, `dataset`): load source
    (load: label, size; inputs: a model's several, load_inputs), refuse NaN/Inf, lay each
    sample out as the model takes it (shape: its input's, when a model takes them; perm:
    that input transposed by the rewrites), the targets for loss with n_out outputs
    (out_shape: the output's, for a class a step).  Returns (x one sample a row, y)."""
    from .validate import check_values
    x, y = load(source, label=label, size=size, shape=shape) if not inputs else \
        load_inputs(source, inputs, label, size)
    check_values(source, x, y)
    if perm is not None:          # the model now takes its input transposed (NHWC)
        orig = [len(x)] + [shape[i] for i in np.argsort(perm)][1:]
        if x.size == int(np.prod(orig)) and not _laid_out(x, shape[1:], orig[1:]):
            x = x.reshape(orig).transpose(perm)
    elif shape is not None and channels_first(x, shape):
        # NCHW / NCL samples (PyTorch's order) for an NHWC / NLC model, as evaluate reads
        # them (a held-out Keras RGB CNN given (N, 3, 8, 8), a Conv1D given (N, 3, 20),
        # trained on scrambled samples)
        x = np.moveaxis(x, 1, -1)
    each = list(x.shape[1:])
    x = x.reshape(len(x), -1)
    if shape is not None and x.shape[1] != int(np.prod(shape)):
        n = int(np.prod(shape))
        side = int(round(n ** 0.5))
        # (the refusal had said what, not what to do: the samples or the model are the
        # other preparation's, or a .csv's columns were not the ones meant)
        csv = os.fspath(source).lower().endswith('.csv')
        raise DataError(f'{source}: x has {x.shape[1]} values per sample, {where} takes {n}' + (
            (f': its images are {x.shape[1]} pixels each; give images of {n} pixels' +
             (f' ({side}x{side} gray)' if side * side == n else '') + ' (`python -m '
             f'host_tools dataset {source} --size WxH -o DIR` resizes them into DIR/train.ds, '
             'which prepare takes)') if os.path.isdir(os.fspath(source)) else (
                f' (its samples are {each if not csv else [x.shape[1]]}, the model\'s input '
                f'{[int(d) for d in shape]} with the batch first): give samples of {n} values '
                'each, as the model was made for, or the model these samples were made for'
                + (f'; of a .csv, every column but the label\'s is a value (--label first or '
                   'last says which is the label; drop other columns, an id or a date, '
                   'first)' if csv else ''))))
    if loss is not None:
        y = targets(y, loss, n_out, source, out_shape)
    return x, y


def _laid_out(x, as_, not_) -> bool:
    """Has x samples of shape as_, which differs from not_ (the layouts can be told
    apart)?"""
    return x.ndim == len(as_) + 1 and tuple(x.shape[1:]) == tuple(as_) != tuple(not_)


def channels_first(x, shape) -> bool:
    """Are x's samples (N, C, H, W) or (N, C, L), channels first as PyTorch lays them
    out, for a model input of shape [1, H, W, C] or [1, L, C] (channels last), the two
    told apart by their sizes?"""
    shape = [int(d) for d in shape]
    return len(shape) in (3, 4) and _laid_out(x, shape[-1:] + shape[1:-1], shape[1:])


def samples(source, out_dir, test_split=0.0, seed=0, dtype='float32', label='last', size=None,
            given=True):
    """`dataset`'s samples pass: read_samples, then split and write (write_samples).
    Returns {'x', 'y', 'train', 'test' (rows), 'scale', 'offset', 'wrote'}."""
    from .locks import locked
    x, y = read_samples(source, label=label, size=size)
    scale, offset = quantization(x, dtype)
    if dtype != 'float32':      # (refused before the folder is made)
        crushed(x, dtype, scale, offset, source)
    os.makedirs(out_dir, exist_ok=True)
    # (a run training on the folder's train.ds, or a prepare writing it: not under them)
    fd = locked(out_dir, lambda who: f'{out_dir}: {who} is using this folder; wait for it '
                'to end (or stop it), or write the samples into another folder', DataError)
    try:
        tr, te, scale, offset, wrote = write_samples(out_dir, x, y, test_split, seed, dtype,
                                                     given=given,
                                                     scale=scale, offset=offset)
    finally:
        os.close(fd)
    return {'x': x, 'y': y, 'train': tr, 'test': te, 'scale': scale, 'offset': offset,
            'wrote': wrote}


def split(n: int, test_split: float, seed: int, given=False):
    """(train indices, test indices): a seeded shuffle, then the last fraction is test.
    given: the fraction is the user's (prepare's and `dataset`'s samples pass, not
    `dataset`'s default nor a trial's), refused if it holds out no sample."""
    if isinstance(test_split, (str, bytes, bool)) or not 0.0 <= test_split < 1.0:
        raise DataError(f'--test-split {test_split!r}: must be a number in [0, 1)')
    idx = np.random.default_rng(seed).permutation(n) if test_split else np.arange(n)
    n_test = int(round(n * test_split))
    if n and n_test >= n:
        raise DataError(f'--test-split {test_split:g} holds out all {n} samples and leaves none '
                        'to train on: give a smaller fraction (or more samples)')
    if n and test_split and not n_test and given:
        # (a fraction of a few samples that rounds to none: the run had gone on without
        # the test set asked for, its 'best' weights judged on nothing held out, unsaid)
        raise DataError(f'--test-split {test_split:g} of {n} samples holds out none '
                        f'({n * test_split:.2g} rounds to 0): give at least {1 / n:.2g} '
                        '(one sample), or --test-split 0 to hold out none')
    return np.sort(idx[:n - n_test]) if test_split else idx, np.sort(idx[n - n_test:])


def two_class_labels(g, data) -> None:
    """Refuse targets other than 0 and 1 (labels 0, 1, 2; 1 and 2; values outside 0 to 1)
    for a model ending in the two probabilities (1 - p, p) of one sigmoid (g.two_class:
    skl2onnx's binary MLPClassifier), which utrain trains as p with bce on labels 0 and 1:
    labels 0/1/2 had trained p as a regression to them (mse, a warning that it cannot
    reach them) though the model's note said bce on 0 and 1."""
    n = getattr(g, 'two_class', None)
    if n is None or not data:
        return
    y = targets_of(data)
    if y is None or not np.size(y) or (np.ndim(y) > 1 and np.shape(y)[1] > 1):
        return
    y = np.asarray(y, dtype=np.float64).ravel()
    if not np.all(np.isfinite(y)) or (y.min() >= 0 and y.max() <= 1):
        return
    labels = np.unique(y)
    whole = bool(np.all(labels == np.round(labels)))
    said = (f'labels {", ".join(f"{v:g}" for v in labels[:6])}' + (', ...' if len(labels) > 6
                                                                    else '')
            if whole else f'targets from {y.min():g} to {y.max():g}')
    instead = (f'labels 0 and 1 (np.searchsorted({[int(v) for v in labels]}, y))'
               if whole and len(labels) == 2 else 'labels 0 and 1 (class 1 against the others)')
    more = (f', or a model of {len(labels)} classes ending in a softmax over {len(labels)} '
            f'outputs (skl2onnx writes one for a classifier fitted on {len(labels)} classes)'
            if whole and len(labels) > 2 else '')
    raise DataError(f'{data}: {said}, and {g.path} ends in the two probabilities (1 - p, p) '
                    f'of one sigmoid (op {n}, CONCATENATION): a classifier of two classes, '
                    f'which trains as p, the probability of class 1, with bce on labels 0 and '
                    f'1: give {instead}{more}')


def class_labels(g, data) -> None:
    """Refuse data whose labels are an .onnx classifier's class labels (skl2onnx's
    classes, its label output's: [3, 7], [1, 2, 3]) where the probabilities utrain trains
    are by place 0, 1, ...: label 7 had trained as a target of 7 for the probability of
    class 1 (mse, warned), label 2 of classes [1, 2, 3] as class 3, unsaid.  Labels that
    are all places too (1 and 2 of those classes) are taken as places."""
    classes = getattr(g, 'onnx_classes', None)
    if not classes or not data:
        return
    y = targets_of(data)
    if y is None or (np.ndim(y) > 1 and np.shape(y)[1] > 1):
        return
    y = np.asarray(y, dtype=np.float64).ravel()
    if not len(y) or not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
        return
    at = {c: i for i, c in enumerate(classes)}
    labels = [int(v) for v in np.unique(y)]
    moved = [v for v in labels if v in at and at[v] != v]
    # (all of them the classes, one no place: labels 1 and 2 alone may be places too)
    if moved and all(v in at for v in labels) and not all(0 <= v < len(classes) for v in labels):
        raise DataError(
            f'{data}: its labels are the model\'s class labels {classes} (which its label '
            f'output gives), not their places 0 to {len(classes) - 1}, which the probabilities '
            f'it trains are in (label {moved[0]} is at place {at[moved[0]]}): give y as the '
            f'places (np.searchsorted({classes}, y))')
