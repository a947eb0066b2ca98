"""Issue 28 (a newcomer's image folder): an image folder's pixels were always read as
0..1, and in its class sub-folders' order.  A Keras model with Rescaling(1/255) at its
input (the converter folds it into the first layer's weights) takes raw 0..255 pixels:
read as 0..1 it scored at chance, and its training started from nothing.  Samples that
come sorted by class (every image folder; a .csv sorted by label) were trained class by
class: SGD forgot the earlier classes (a Keras CNN: 0.96 accuracy on the samples while it
trained, 0.50 on all of them afterwards).  Now the pixels are read at the values the model
was trained on (its file says so, or it scores clearly best there) and train.ds holds
class-sorted samples in a seeded shuffle."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
from repo import ROOT  # noqa: E402,F401

from host_tools.cli import main  # noqa: E402
from host_tools.files import dataset as ds  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.infer import evaluate, image_pixels, pixel_values  # noqa: E402

H, O = 8, 3


def _fc(path, gain, bias=(0.5, 0.0, -0.5), scale_layer=None):
    """x [1, H, H, 1] -> (MUL by scale_layer) -> RESHAPE -> FULLY_CONNECTED (O): class c's
    logit sums its third of the image times gain (a pixel of 0..255 into gain 1/255: raw
    pixels, the Rescaling folded in), beside a bias that wins wherever the pixels are
    0..1 for such a model."""
    w = np.zeros((O, H * H), np.float32)
    for c in range(O):
        w[c, c * 3 * H:(c * 3 + 2) * H] = gain
    b = CircleBuilder(identifier=b'TFL3')
    x = inp = b.tensor('x', [1, H, H, 1])
    if scale_layer:
        inp = b.tensor('xs', [1, H, H, 1])
        b.op('MUL', [x, b.tensor('s', [1], data=np.float32([scale_layer]))], [inp],
             fused_activation_function='NONE')
    r = b.tensor('r', [1, H * H])
    b.op('RESHAPE', [inp, b.tensor('shape', [2], data=np.array([1, H * H], np.int32))], [r])
    y = b.tensor('y', [1, O])
    b.op('FULLY_CONNECTED', [r, b.tensor('w', [O, H * H], data=w),
                             b.tensor('b', [O], data=np.float32(bias))], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(os.fspath(path))


def _folder(root, n=10, seed=0):
    """Class folders c0, c1, c2 of 8x8 gray PNGs: the class's third of the image bright."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    for c in range(O):
        os.makedirs(os.path.join(root, f'c{c}'), exist_ok=True)
        for i in range(n):
            a = rng.integers(0, 100, (H, H)).astype(np.uint8)
            a[c * 3:c * 3 + 2] += 150
            Image.fromarray(a).save(os.path.join(root, f'c{c}', f'{i}.png'))
    return os.fspath(root)


def test_a_folded_rescaling_reads_raw_pixels(tmp_path, capsys):
    """A float model with the Rescaling folded in (no trace in the file): evaluate and
    prepare read the folder at 0..255, where it scores; a model trained on 0..1 stays at
    0..1."""
    data = _folder(tmp_path / 'imgs')
    raw = _fc(tmp_path / 'raw.tflite', 1 / 255)
    unit = _fc(tmp_path / 'unit.tflite', 1.0)
    assert evaluate(raw, data)['accuracy'] <= 0.4          # as read before: chance
    with image_pixels(raw, data):
        assert evaluate(raw, data)['accuracy'] == 1.0
    with image_pixels(unit, data):
        assert evaluate(unit, data)['accuracy'] == 1.0
    assert main(['evaluate', raw, data]) == 0
    out = capsys.readouterr()
    assert 'accuracy 1.0000' in out.out and 'pixels read as 0..255' in out.err, out
    assert main(['prepare', raw, data, '-o', str(tmp_path / 'run')]) == 0
    assert 'pixels read as 0..255' in capsys.readouterr().out
    x, _ = ds.read_dataset(str(tmp_path / 'run' / 'train.ds'))
    assert x.max() > 200


def test_the_file_says_the_pixels(tmp_path):
    """A Rescaling kept as a layer (MUL by 1/255) and an int8 input's range decide
    without scoring."""
    g = read_model(_fc(tmp_path / 'm.tflite', 1.0, scale_layer=1 / 255))
    assert pixel_values(g)[:2] == (1.0, 0.0)
    assert pixel_values(read_model(_fc(tmp_path / 'n.tflite', 1.0))) is None
    for scale, zero, want in ((1.0, -128, (1.0, 0.0)), (1 / 255, -128, (1 / 255, 0.0)),
                              (1 / 127.5, 0, (2 / 255, -1.0))):
        b = CircleBuilder(identifier=b'TFL3')
        x = b.tensor('x', [1, 4], dtype='int8', quant={'scale': [scale], 'zero_point': [zero]})
        y = b.tensor('y', [1, 4], dtype='int8', quant={'scale': [scale], 'zero_point': [zero]})
        b.op('RESHAPE', [x, b.tensor('s', [2], data=np.array([1, 4], np.int32))], [y])
        b.inputs(x)
        b.outputs(y)
        s, o, _ = pixel_values(read_model(b.save(str(tmp_path / 'q.tflite'))))
        assert np.isclose(s, want[0]) and o == want[1]


@pytest.mark.parametrize('order,shuffled', [('sorted', True), ('random', False),
                                            ('one-hot sorted', True)])
def test_class_sorted_samples_train_shuffled(tmp_path, order, shuffled):
    """train.ds holds class-sorted samples in a seeded shuffle (the same on every
    prepare), and samples in no class order as given."""
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(4), 30) if 'sorted' in order else rng.integers(0, 4, 120)
    x = (rng.standard_normal((120, 6)) + y[:, None]).astype(np.float32)
    yy = np.eye(4)[y] if 'one-hot' in order else y
    assert ds.sorted_by_class(yy) == shuffled
    got = []
    for k in range(2):
        tr, _, _, _, wrote = ds.write_samples(str(tmp_path), x, yy, 0.25, 7,
                                              names=(f'tr{k}.ds', f'te{k}.ds'))
        xt, yt = ds.read_dataset(wrote[f'tr{k}.ds'])
        np.testing.assert_array_equal(xt, x[tr])
        got.append(tr)
        assert bool(np.any(np.diff(tr) < 0)) == shuffled
    np.testing.assert_array_equal(got[0], got[1])


def test_sorted_by_class_leaves_other_targets():
    """Regression targets, a class a sample in random order, ids: never reordered."""
    r = np.random.default_rng(0)
    assert not ds.sorted_by_class(np.sort(r.standard_normal(50)))
    assert not ds.sorted_by_class(np.arange(50))
    assert not ds.sorted_by_class(np.zeros(50))
    assert ds.sorted_by_class(np.array([0] * 20 + [1] * 20))
    assert not ds.sorted_by_class(np.array([0, 1] * 20))


def test_select_reads_an_rgb_folder_as_the_model_takes_it(tmp_path):
    """--select's trials read the image folder in the model input's size and channels, as
    prepare does (they read it gray at its own size: 'fold0.npz: x has 400 values per
    sample, the model input takes 1200')."""
    from PIL import Image
    from kerasgraphs import build_raw_cnn
    from host_tools.prepare.pipeline import prepare
    rng = np.random.default_rng(0)
    K, P = 2, 3
    model = build_raw_cnn(tmp_path / 'm.tflite', (
        0.3 * rng.standard_normal((K, 3, 3, 3)), np.zeros(K), 0.3 * rng.standard_normal(
            (O, K * P * P)), np.zeros(O)), cin=3)
    for c in range(O):
        os.makedirs(tmp_path / 'imgs' / f'c{c}')
        for i in range(12):
            a = rng.integers(0, 100, (10, 10, 3)).astype(np.uint8)   # (resized to 8x8)
            a[c * 3:c * 3 + 3] += 150
            Image.fromarray(a).save(tmp_path / 'imgs' / f'c{c}' / f'{i}.png')
    s = prepare(model, str(tmp_path / 'run'), data=str(tmp_path / 'imgs'), select='auto',
                loss='scce', from_logits=True, log=lambda *a: None)
    assert s['select']['ranks']
