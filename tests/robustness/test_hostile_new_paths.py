"""Session 23's hostile-input round on the paths session 22 added (an image folder read at
the model's pixel values, class-sorted samples shuffled, --board storing uint8, the run's
defaults), as an unlucky user hits them: each ends in a clear refusal naming the file and
what to do, or reads the data as the user meant; nothing is lost."""
import os
import sys

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'training'))
from repo import ROOT  # noqa: E402,F401

from host_tools.cli import main  # noqa: E402
from host_tools.files import dataset as ds  # noqa: E402
from test_image_pixels import _fc, _folder, H  # noqa: E402


def _flat(path, n):
    """x [1, n] -> FULLY_CONNECTED (3): a model that takes an image folder at its images'
    own size, flattened."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(identifier=b'TFL3')
    x, y = b.tensor('x', [1, n]), b.tensor('y', [1, 3])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [3, n], data=np.ones((3, n), np.float32)),
                             b.tensor('b', [3], data=np.zeros(3, np.float32))], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(str(path))


def _err(capsys):
    out = capsys.readouterr()
    assert 'Traceback' not in out.out + out.err, out
    return out.err


def test_a_16_bit_png_is_read_at_its_top_8_bits(tmp_path):
    """A 16-bit gray PNG (a scientific camera's, a depth map) was clipped to 255 by PIL's
    convert: every pixel over 255 of 65535 white, the class signal gone."""
    rng = np.random.default_rng(0)
    a = (rng.integers(0, 256, (H, H)) * 257).astype(np.uint16)
    os.makedirs(tmp_path / 'd' / 'c0')
    Image.fromarray(a).save(tmp_path / 'd' / 'c0' / '0.png')
    assert Image.open(tmp_path / 'd' / 'c0' / '0.png').mode.startswith('I;16')
    x, y, _ = ds.load_images(str(tmp_path / 'd'))
    np.testing.assert_array_equal(x[0], a >> 8)


def test_hidden_files_and_folders_are_no_images_nor_classes(tmp_path):
    """A Mac's ._NAME files and .DS_Store were read as images and refused ('not a readable
    image'); a notebook's .ipynb_checkpoints folder was class 0, every class's number one
    up (a 3-class folder for a 3-output model: 'labels must be 0 to 2').  A class's images
    in sub-folders of its folder are its (as Keras reads them): they had been left out."""
    data = _folder(tmp_path / 'imgs')
    (tmp_path / 'imgs' / 'c0' / '._0.png').write_bytes(b'\0\5\26\7\0\2\0\0Mac OS X')
    (tmp_path / 'imgs' / 'c1' / '.DS_Store').write_bytes(b'\0\0\0\1Bud1')
    os.makedirs(tmp_path / 'imgs' / '.ipynb_checkpoints')
    os.makedirs(tmp_path / 'imgs' / 'c2' / 'more')
    os.replace(tmp_path / 'imgs' / 'c2' / '0.png', tmp_path / 'imgs' / 'c2' / 'more' / '0.png')
    x, y, classes = ds.load_images(data)
    assert classes == ['c0', 'c1', 'c2'] and np.bincount(y).tolist() == [10, 10, 10]
    assert list(ds.labels(data)) == [0, 1, 2]


@pytest.mark.parametrize('case', ['empty', 'more'])
def test_more_class_folders_than_outputs_are_named(tmp_path, capsys, case):
    """An empty class folder after the others (made for a class not yet photographed), or
    a fourth class, for a 3-output model: prepare said 'mse wants one target per output'
    or 'number the classes from 0', and evaluate the same, which an image folder's user
    cannot do; now the class folders are named and what to do said."""
    data = _folder(tmp_path / 'imgs')
    model = _fc(tmp_path / 'm.tflite', 1 / 255)
    os.makedirs(tmp_path / 'imgs' / 'c3')
    if case == 'more':
        Image.fromarray(np.zeros((H, H), np.uint8)).save(tmp_path / 'imgs' / 'c3' / '0.png')
    say = 'c3 (no images)' if case == 'empty' else 'give the model 4 outputs'
    assert main(['prepare', model, data, '-o', str(tmp_path / 'run')]) == 2
    err = _err(capsys)
    assert '4 class folders (c0, c1, c2, c3' in err and say in err, err
    assert not os.path.exists(tmp_path / 'run')
    assert main(['evaluate', model, data]) == 2
    err = _err(capsys)
    assert '4 class folders' in err and say in err, err


@pytest.mark.parametrize('bad', [b'', b'hello', b'\x89PNG\r\n\x1a\n garbage'])
def test_an_unreadable_image_says_what_to_do(tmp_path, capsys, bad):
    """A zero-byte, a text or a cut PNG: named, and what to do said."""
    data = _folder(tmp_path / 'imgs', n=3)
    (tmp_path / 'imgs' / 'c1' / 'x.png').write_bytes(bad)
    assert main(['prepare', _fc(tmp_path / 'm.tflite', 1 / 255), data, '-o',
                 str(tmp_path / 'run')]) == 2
    err = _err(capsys)
    assert 'c1/x.png: not a readable image' in err and 'move it out of the class folder' in err


def test_a_batch_larger_than_the_samples_takes_the_lr_of_those_there_are(tmp_path, capsys):
    """--batch 1000 on 30 samples without --lr: SGD's default of 0.01 a sample made lr 10
    (x 1000), for one update of the mean over 30 samples an epoch: 0.33 a sample, 33 times
    the rule's; now 0.3, said."""
    import json
    data = _folder(tmp_path / 'imgs')
    assert main(['prepare', _fc(tmp_path / 'm.tflite', 1 / 255), data, '-o',
                 str(tmp_path / 'run'), '--batch', '1000']) == 0
    out = capsys.readouterr().out
    with open(tmp_path / 'run' / 'train.json') as f:
        assert json.load(f)['lr'] == pytest.approx(0.3)
    assert 'lr 0.3 (0.01 a sample, at batch 1000, one update of all 30 samples' in out, out


def test_board_does_not_store_as_uint8_samples_it_would_crush(tmp_path, capsys):
    """--board pico without --dtype stored samples that overflow its flash as float32 as
    uint8: standardised samples beside one outlying value of 1e6 went into steps of 3922,
    every other value stored as 0 (said as 'to 1/255 of their range'); now refused,
    naming the sample and what to do, and nothing is written."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'support'))
    from kerasgraphs import build_raw_cnn
    rng = np.random.default_rng(0)
    K, P, O = 2, 9, 3
    model = build_raw_cnn(tmp_path / 'm.tflite', (
        0.01 * rng.standard_normal((K, 3, 3, 3)), np.zeros(K),
        0.1 * rng.standard_normal((O, K * P * P)), np.zeros(O)), cin=3)
    x = rng.standard_normal((320, 20, 20, 3)).astype(np.float32)
    y = rng.integers(0, O, 320)
    np.savez(tmp_path / 'ok.npz', x=x, y=y)
    x[7, 3, 3, 1] = 1e6
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    argv = ['--board', 'pico', '--float32', '--train', 'last:1']
    assert main(['prepare', model, str(tmp_path / 'd.npz'), '-o', str(tmp_path / 'run')] + argv) == 2
    err = _err(capsys)
    assert 'as uint8 they would be lost' in err and 'sample 7 holds 1e+06' in err, err
    assert 'drop or clip the outlying samples' in err and not os.path.exists(tmp_path / 'run')
    assert main(['prepare', model, str(tmp_path / 'ok.npz'), '-o', str(tmp_path / 'run')] + argv) == 0
    assert 'stored as uint8' in capsys.readouterr().out


def test_a_hand_edited_train_json_is_blamed_not_the_files_it_names(tmp_path, capsys):
    """train.json edited by hand, then `run` (and a resume after Ctrl-C): a "loss" the
    samples' targets do not fit, a checkpoint of other samples, two files given one name
    each said '<file> is damaged or missing; prepare the folder again' of a sound file."""
    import json
    from host_tools.target import runner
    data = _folder(tmp_path / 'imgs')
    run = tmp_path / 'run'
    assert main(['prepare', _fc(tmp_path / 'm.tflite', 1 / 255), data, '-o', str(run),
                 '--epochs', '1']) == 0
    capsys.readouterr()
    cfg = json.loads((run / 'train.json').read_text())
    (run / 'train.json').write_text(json.dumps(dict(cfg, loss='mse')))
    assert main(['run', str(run), '--python']) != 0
    out = capsys.readouterr()
    said = out.out + out.err
    assert 'Traceback' not in said and 'damaged' not in said, said
    assert 'train.ds holds 1 target a sample (a class number: "loss": "scce")' in said
    assert 'set "loss" in train.json' in said, said
    for what, says in (
            ('train.json: files.log "model.flat" would overwrite files.model "model.flat"; '
             'give it its own name', 'change train.json'),
            ('test.ds: 600 samples, but the checkpoint stopped at sample 2130',
             'the checkpoint in')):
        advice = runner.end_advice(str(run), 'utrain: end: error: ' + what)
        assert says in advice and 'damaged' not in advice, advice


def test_a_folder_the_model_cannot_take_gets_no_pixels_line(tmp_path, capsys):
    """A folder the samples pass refuses (an unreadable image, images of another size than
    a flat-input model takes) had a line first on how its pixels were read ('pixels read
    as 0..1 (the model cannot be scored here: <the refusal>)', or '(its outputs do not
    score these labels)'), which they were not; the size refusal says what to do."""
    data = _folder(tmp_path / 'imgs', n=3)
    model = _fc(tmp_path / 'm.tflite', 1 / 255)
    (tmp_path / 'imgs' / 'c1' / 'x.png').write_bytes(b'')
    for cmd in (['prepare', model, data, '-o', str(tmp_path / 'run')], ['evaluate', model, data]):
        assert main(cmd) == 2
        out = capsys.readouterr()
        assert 'pixels read' not in out.out + out.err and 'x.png' in out.err, out
    os.remove(tmp_path / 'imgs' / 'c1' / 'x.png')
    flat = _flat(tmp_path / 'flat.tflite', 16)
    assert main(['prepare', flat, data, '-o', str(tmp_path / 'run')]) == 2
    out = capsys.readouterr()
    assert 'pixels read' not in out.out + out.err, out
    assert 'its images are 64 pixels each; give images of 16 pixels (4x4 gray)' in out.err
    assert '--size WxH' in out.err, out.err


def test_one_class_alone_is_warned_of(tmp_path, capsys):
    """An image folder of one class sub-folder for a 3-class model was prepared, trained
    and scored 1.00 (every sample that class), saying nothing."""
    import shutil
    data = _folder(tmp_path / 'imgs', n=4)
    for c in ('c1', 'c2'):
        shutil.rmtree(tmp_path / 'imgs' / c)
    assert main(['prepare', _fc(tmp_path / 'm.tflite', 1 / 255), data, '-o',
                 str(tmp_path / 'run')]) == 0
    out = capsys.readouterr().out
    assert 'every sample is class 0' in out and 'give samples of the other classes' in out, out


def test_a_few_labels_that_are_no_class_numbers_are_named(tmp_path, capsys):
    """One label of 1.5 among 40 class numbers kept the data-chosen scce away and the
    refusal said only 'mse wants one target per output (3 values a sample)'."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 40).astype(np.float64)
    y[3] = 1.5
    np.savez(tmp_path / 'd.npz', x=rng.integers(0, 120, (40, H, H, 1)).astype(np.float32), y=y)
    assert main(['prepare', _fc(tmp_path / 'm.tflite', 1 / 255), str(tmp_path / 'd.npz'), '-o',
                 str(tmp_path / 'run')]) == 2
    err = _err(capsys)
    assert '1 of 40 are not (sample 3 has 1.5)' in err, err


def test_prepare_into_the_image_folder_is_refused(tmp_path, capsys):
    """-o the image folder itself (or a folder in it): prepare wrote its files among the
    class folders, and the run's lib/ and a later prepare's earlier-1/ became classes of
    it; now refused before anything is written."""
    data = _folder(tmp_path / 'imgs', n=3)
    model = _fc(tmp_path / 'm.tflite', 1 / 255)
    for out in (data, os.path.join(data, 'c0', 'run')):
        assert main(['prepare', model, data, '-o', out]) == 2
        assert 'prepare into a folder outside it' in _err(capsys)
    assert sorted(os.listdir(data)) == ['c0', 'c1', 'c2']
    assert sorted(os.listdir(os.path.join(data, 'c0'))) == ['0.png', '1.png', '2.png']


def test_images_of_mixed_sizes_for_a_flat_model_say_how_to_resize(tmp_path, capsys):
    """A flat-input model (the folder read at its images' own size) given images of two
    sizes: prepare said 'give --size WxH', an option it does not have."""
    data = _folder(tmp_path / 'imgs', n=3)
    Image.fromarray(np.zeros((10, 12), np.uint8)).save(tmp_path / 'imgs' / 'c2' / 'big.png')
    flat = _flat(tmp_path / 'flat.tflite', 64)
    assert main(['prepare', flat, data, '-o', str(tmp_path / 'run')]) == 2
    err = _err(capsys)
    assert 'big.png: 12x10 pixels, the first image is 8x8' in err, err
    assert f'dataset {data} --size WxH -o DIR' in err, err


@pytest.mark.parametrize('key', ['lr', 'momentum', 'test_split'])
def test_a_setting_given_from_python_as_text_is_refused(tmp_path, key):
    """prepare(..., lr='0.1') from Python (a value read from a config file as text) ended
    in a TypeError's traceback ('<=' not supported between 'str' and 'int'); the
    unknown-setting check of session 22 let it through."""
    from host_tools.files.dataset import DataError
    from host_tools.graph.passes import PrepareError
    from host_tools.prepare.pipeline import prepare
    with pytest.raises((PrepareError, DataError), match="'0.1'.*must be a number"):
        prepare(_fc(tmp_path / 'm.tflite', 1 / 255), str(tmp_path / 'run'),
                data=_folder(tmp_path / 'imgs', n=3), log=lambda *a: None, **{key: '0.1'})
    assert not os.path.exists(tmp_path / 'run')
