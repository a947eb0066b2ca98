"""Dataset records (version 2: float32/uint8/int8 samples with scale and offset),
converters from real .npz, .csv and image files, the device reader (MicroPython and
CPython read the same values as the host), on-device collection, and the plot command."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.files import dataset as ds  # noqa: E402
from host_tools.target import runner  # noqa: E402

MP = runner.find_micropython()
MICRO = os.path.join(ROOT, 'micro')
PY_BACKENDS = [('python', sys.executable)] + ([('micropython', MP)] if MP else [])


def cli(*args):
    return subprocess.run([sys.executable, '-m', 'host_tools', *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def device(exe, code, cwd):
    """Run code with micro/ importable under MicroPython or CPython; stdout."""
    env = dict(os.environ, MICROPYPATH=MICRO, PYTHONPATH=MICRO)
    r = subprocess.run([exe, '-c', code], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


READ_ALL = '''
from utrain.data import Dataset
from utrain.xnp import zeros
d = Dataset(%r)
x, y = zeros((1, d.x_len)), zeros((1, d.y_len))
for i in range(d.n):
    d.read(i, x, y)
    print(' '.join(repr(float(v)) for v in list(x[0]) + list(y[0])))
'''


def device_read(exe, path):
    out = device(exe, READ_ALL % os.path.basename(path), os.path.dirname(path))
    return np.array([[float(v) for v in line.split()] for line in out.strip().splitlines()])


@pytest.mark.parametrize('dtype,tol', [('float32', 0.0), ('uint8', 0.5 / 255), ('int8', 0.5 / 127)])
def test_quantized_records_round_trip_on_host_and_device(tmp_path, dtype, tol):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (7, 5)).astype(np.float32)
    y = rng.integers(0, 3, 7)
    path = str(tmp_path / f'{dtype}.ds')
    ds.write_dataset(path, x, y, dtype)
    size = {'float32': 4, 'uint8': 1, 'int8': 1}[dtype]
    assert os.path.getsize(path) == ds.HEAD + 7 * (5 * size + 4)
    hx, hy = ds.read_dataset(path)
    span = 2.0                                    # range of x
    assert np.abs(hx - x).max() <= tol * span + 1e-6 and np.array_equal(hy[:, 0], y)
    for name, exe in PY_BACKENDS:
        got = device_read(exe, path)
        np.testing.assert_allclose(got[:, :5], hx, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got[:, 5], y)


def test_version_1_files_still_read_and_unknown_versions_are_named(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    v1 = struct.pack('<4sHBBIII', b'UTDS', 1, 0, 0, 3, 2, 1).ljust(32, b'\0')
    v1 += np.concatenate([x, np.ones((3, 1), np.float32)], 1).tobytes()
    (tmp_path / 'v1.ds').write_bytes(v1)
    hx, _ = ds.read_dataset(str(tmp_path / 'v1.ds'))
    np.testing.assert_array_equal(hx, x)
    for name, exe in PY_BACKENDS:
        np.testing.assert_array_equal(device_read(exe, str(tmp_path / 'v1.ds'))[:, :2], x)
    v3 = bytearray(ds.pack_dataset(x, np.ones(3)))
    v3[4] = 3
    (tmp_path / 'v3.ds').write_bytes(bytes(v3))
    with pytest.raises(ds.DataError, match='v3.ds: dataset version 3'):
        ds.read_dataset(str(tmp_path / 'v3.ds'))
    env = dict(os.environ, MICROPYPATH=MICRO, PYTHONPATH=MICRO)
    for name, exe in PY_BACKENDS:
        r = subprocess.run([exe, '-c', "from utrain.data import Dataset; Dataset('v3.ds')"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
        assert 'v3.ds: dataset version 3' in r.stdout + r.stderr and 'host_tools dataset' in r.stdout + r.stderr


def test_csv_converter_with_header_label_column_and_balance(tmp_path):
    src = tmp_path / 'sensor.csv'
    rows = ['label,a,b,c'] + [f'{i % 3},{i * 0.5},{-i},{i % 2}' for i in range(30)]
    src.write_text('\n'.join(rows) + '\n')
    out = tmp_path / 'out'
    r = cli('dataset', str(src), '-o', str(out), '--label', 'first', '--test-split', '0.2',
            '--dtype', 'int8')
    assert r.returncode == 0, r.stderr
    assert '30 samples of 3 values, stored as int8' in r.stdout
    xtr, ytr = ds.read_dataset(str(out / 'train.ds'))
    xte, yte = ds.read_dataset(str(out / 'test.ds'))
    assert len(xtr) == 24 and len(xte) == 6
    for part, yy in (('train', ytr), ('test', yte)):
        counts = [int((yy[:, 0] == c).sum()) for c in range(3)]
        want = ', '.join(f'{c}: {k} ({100 * k / len(yy):.0f}%)' for c, k in enumerate(counts) if k)
        assert f'classes ({part}): {want}' in r.stdout, r.stdout
    assert sorted(np.concatenate([ytr, yte])[:, 0].tolist()) == sorted(i % 3 for i in range(30))
    full = np.array([[i * 0.5, -i, i % 2] for i in range(30)])
    got = np.concatenate([xtr, xte])
    scale = 29 / 127
    for row in got:                         # every converted row is one of the source rows
        assert np.abs(full - row).max(axis=1).min() <= scale / 2 + 1e-5
    bad = tmp_path / 'bad.csv'
    bad.write_text('1,2,3\n4,x,6\n')
    r = cli('dataset', str(bad), '-o', str(out))
    assert r.returncode == 2 and 'bad.csv: line 2: not a number' in r.stderr


def test_image_folder_converter(tmp_path):
    from PIL import Image
    src = tmp_path / 'imgs'
    rng = np.random.default_rng(1)
    pix = {}
    for c, name in enumerate(['cat', 'dog']):
        (src / name).mkdir(parents=True)
        for k in range(3 + c):
            a = rng.integers(0, 256, (6, 4), dtype=np.uint8)
            pix[(name, k)] = a
            Image.fromarray(a, 'L').save(src / name / f'{k}.png')
    (src / 'dog' / 'notes.txt').write_text('not an image')
    out = tmp_path / 'out'
    r = cli('dataset', str(src), '-o', str(out), '--test-split', '0')
    assert r.returncode == 0, r.stderr
    assert '7 samples of 24 values, stored as uint8' in r.stdout
    assert 'classes (train): 0: 3 (43%), 1: 4 (57%)' in r.stdout
    x, y = ds.read_dataset(str(out / 'train.ds'))
    want = np.stack([pix[('cat', k)] for k in range(3)] + [pix[('dog', k)] for k in range(4)])
    np.testing.assert_allclose(x, want.reshape(7, -1) / 255.0, atol=1e-6)   # exact bytes
    assert y[:, 0].tolist() == [0, 0, 0, 1, 1, 1, 1]
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(src / 'cat' / 'odd.png')
    r = cli('dataset', str(src), '-o', str(out))
    assert r.returncode == 2 and 'odd.png: 5x5 pixels' in r.stderr and '--size' in r.stderr
    r = cli('dataset', str(src), '-o', str(out), '--size', '4x6')
    assert r.returncode == 0, r.stderr


def test_npz_converter_and_prepare_store_uint8(tmp_path):
    src = os.path.join(ROOT, 'datasets', 'digits', 'digits.npz')
    out = tmp_path / 'out'
    r = cli('dataset', src, '-o', str(out))
    assert r.returncode == 0, r.stderr
    assert '1797 samples of 64 values, stored as uint8' in r.stdout
    assert 'largest quantization error' in r.stdout
    x, _ = ds.read_dataset(str(out / 'train.ds'))
    assert os.path.getsize(out / 'train.ds') == ds.HEAD + len(x) * (64 + 4)
    with np.load(src) as z:                    # pixels/16 with scale 1/255: off by < 1/510
        assert np.abs(np.sort(x.ravel()) - np.sort(z['x'][:len(x)].ravel())).max() < 0.5


COLLECT = '''
from utrain.collect import Recorder
r = Recorder('mine.ds', 3, 1, dtype=1, scale=0.1)
r.add([0.0, 1.0, 25.5], 2)
r.add((0.3, 0.44, 99.0), 0)
r.close()
r = Recorder('mine.ds', 3, 1)            # appends: the layout comes from the file
print(r.add([0.5, 0.5, 0.5], 1))
r.close()
try:
    Recorder('mine.ds', 4, 1)
except ValueError as e:
    print('ERR', e)
'''


@pytest.mark.parametrize('name,exe', PY_BACKENDS)
def test_collect_appends_samples_on_the_device(tmp_path, name, exe):
    out = device(exe, COLLECT, str(tmp_path))
    assert out.splitlines()[0] == '3'
    assert 'ERR mine.ds: holds 3 inputs + 1 targets' in out
    x, y = ds.read_dataset(str(tmp_path / 'mine.ds'))
    np.testing.assert_allclose(x, [[0, 1, 25.5], [0.3, 0.4, 25.5], [0.5, 0.5, 0.5]], atol=1e-6)
    assert y[:, 0].tolist() == [2, 0, 1]
    np.testing.assert_allclose(device_read(exe, str(tmp_path / 'mine.ds'))[:, :3], x, atol=1e-6)


def test_plot_writes_a_png_and_names_a_bad_log(tmp_path):
    log = tmp_path / 'train.log'
    log.write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'
                   '0,,,2.3,0.1,0,90000\n1,1.0,0.6,0.9,0.7,500,85000\n'
                   '2,0.5,0.8,0.6,0.8,480,85000\n')
    png = tmp_path / 'c.png'
    r = cli('plot', str(log), '-o', str(png))
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n'
    w, h = struct.unpack('>II', data[16:24])
    assert (w, h) == (1000, 400)
    # -o a folder (or a name without an ending): matplotlib wrote '<folder>.png' beside
    # it and plot said it wrote '<folder>': the file is named for the log in the folder
    (tmp_path / 'plots').mkdir()
    for o, want in (('plots', tmp_path / 'plots' / 'train.png'), ('curves', tmp_path / 'curves.png')):
        r = cli('plot', str(log), '-o', str(tmp_path / o))
        assert r.returncode == 0 and f'wrote {want}' in r.stdout, r.stdout + r.stderr
        assert want.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert not (tmp_path / 'plots.png').exists()
    # train.log is appended to: plot reads the last run, whose epochs start again (at 1
    # without a test split), a resumed run's going on
    from host_tools.plot import read_log
    head = 'epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n'
    rows = lambda *es: ''.join('%d,1,0.5,nan,nan,1,1\n' % e for e in es)    # noqa: E731
    for epochs, last in (((1, 2, 1, 2, 3), [1, 2, 3]), ((0, 1, 2, 0, 1), [0, 1]),
                         ((0, 1, 2, 3, 4), [0, 1, 2, 3, 4]), ((1, 2, 3, 2), [2])):
        log.write_text(head + rows(*epochs))
        assert read_log(str(log))['epoch'] == last, epochs
    log.write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n1,0.5,oops,1,1,1,1\n')
    r = cli('plot', str(log), '-o', str(png))
    assert r.returncode == 2 and "train.log: line 2: accuracy 'oops' is not a number" in r.stderr


def test_a_log_row_cut_short_is_left_out_and_said(tmp_path):
    """Issue 28: a board that lost power while writing a train.log row leaves it cut
    short; the next run appends its rows after the piece (a merged 9-column row).  plot
    had refused the whole log ('line 2 has 9 columns, expected 7'); now the damaged row is
    left out, said, and the last run plotted."""
    from host_tools.plot import read_log
    log = tmp_path / 'train.log'
    log.write_text('epoch,loss,accuracy,test_loss,test_accuracy,ms,free_heap\n0,,0,'
                   ',,1.38,0.40,0,\n1,1.2,0.41,0.93,0.62,59,\n'
                   '0,,,1.3,0.5,0,9\n1,1.1,0.6,0.8,0.7,62,9\n2,1.0,0.7,0.7,0.8,60,9\n')
    notes = []
    c = read_log(str(log), notes)
    assert c['epoch'] == [0, 1, 2] and c['test_accuracy'] == [0.5, 0.7, 0.8]
    assert notes == [f'{log}: line 2 has 9 columns, expected 7: left out (a row cut short, e.g. '
                     'a board that lost power while writing it); the other rows are plotted']
    r = cli('plot', str(log), '-o', str(tmp_path / 'c.png'))
    assert r.returncode == 0 and 'line 2 has 9 columns, expected 7: left out' in r.stderr, r.stderr
    assert (tmp_path / 'c.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_the_digits_example_ships_ready_for_a_board():
    """datasets/digits/{train,test}.ds are digits.npz split as prepare splits it, stored
    losslessly as uint8, and prepare takes them as --data."""
    d = os.path.join(ROOT, 'datasets', 'digits')
    with np.load(os.path.join(d, 'digits.npz')) as z:
        x, y = z['x'], z['y']
    tr, te = ds.split(len(x), 0.2, 0)
    for name, idx in (('train.ds', tr), ('test.ds', te)):
        path = os.path.join(d, name)
        hx, hy = ds.read_dataset(path)
        np.testing.assert_array_equal(hx, x[idx])
        np.testing.assert_array_equal(hy[:, 0], y[idx])
        assert os.path.getsize(path) == ds.HEAD + len(idx) * (64 + 4)
    lx, ly = ds.load(os.path.join(d, 'train.ds'))
    np.testing.assert_array_equal(ly, y[tr])


def test_4d_samples_in_the_other_layout_are_laid_out_as_the_model_takes_them(tmp_path):
    """Issue 28: a held-out Keras RGB CNN (NHWC) given (N, 3, 8, 8) samples trained on
    them read as NHWC (scrambled pixels), where evaluate transposed them; an ONNX model
    (prepare transposes its NCHW input) given NHWC samples likewise.  4-D samples whose
    layout can be told apart are laid out as the model takes them; flat ones as given."""
    rng = np.random.default_rng(0)
    nhwc = rng.random((5, 4, 6, 3)).astype(np.float32)
    want = nhwc.reshape(5, -1)
    y = np.arange(5) % 2
    paths = {}
    for name, x in (('nhwc', nhwc), ('nchw', nhwc.transpose(0, 3, 1, 2)),
                    ('flat', nhwc.reshape(5, -1))):
        paths[name] = str(tmp_path / (name + '.npz'))
        np.savez(paths[name], x=x, y=y)
    # an NHWC model (Keras): both 4-D layouts give its samples; flat ones are its own order
    for name in paths:
        x, _ = ds.read_samples(paths[name], [1, 4, 6, 3])
        np.testing.assert_array_equal(x, want, err_msg=name)
    # an NCHW model whose input prepare transposed to NHWC (perm): flat samples are NCHW
    flat_nchw = str(tmp_path / 'flat_nchw.npz')
    np.savez(flat_nchw, x=nhwc.transpose(0, 3, 1, 2).reshape(5, -1), y=y)
    for p in (paths['nhwc'], paths['nchw'], flat_nchw):
        x, _ = ds.read_samples(p, [1, 4, 6, 3], perm=[0, 2, 3, 1])
        np.testing.assert_array_equal(x, want, err_msg=p)


def _rgb_cnn(path, size=6, c=3, classes=3):
    """An NHWC size x size x c input -> CONV_2D 3x3 VALID (4, RELU) -> RESHAPE -> FC -> SOFTMAX."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(0)
    b = CircleBuilder()
    x = b.tensor('input', [1, size, size, c])
    o = size - 2
    h = b.tensor('conv/out', [1, o, o, 4])
    b.op('CONV_2D', [x, b.tensor('conv/w', [4, 3, 3, c], data=rng.normal(0, .3, (4, 3, 3, c)).astype(np.float32)),
                     b.tensor('conv/b', [4], data=np.zeros(4, np.float32))], [h],
         padding='VALID', stride_w=1, stride_h=1, fused_activation_function='RELU')
    n = o * o * 4
    f = b.tensor('flat', [1, n])
    b.op('RESHAPE', [h, b.tensor('flat/shape', [2], data=np.array([1, n], np.int32))], [f])
    z, p = b.tensor('fc/out', [1, classes]), b.tensor('probs', [1, classes])
    b.op('FULLY_CONNECTED', [f, b.tensor('fc/w', [classes, n], data=rng.normal(0, .2, (classes, n)).astype(np.float32)),
                             b.tensor('fc/b', [classes], data=np.zeros(classes, np.float32))], [z])
    b.op('SOFTMAX', [z], [p], beta=1.0)
    b.inputs(x)
    b.outputs(p)
    return b.save(path)


@pytest.mark.parametrize('int8', [False, True])
def test_prepare_lays_nchw_samples_out_for_an_nhwc_model(tmp_path, int8):
    """The float path and the int8 path (a float model trained as int8: calibrated, then
    its samples at the int8 input's scale) store the same samples for NCHW and NHWC x."""
    from host_tools.prepare.pipeline import prepare
    model = _rgb_cnn(str(tmp_path / 'rgb.circle'))
    x = np.random.default_rng(1).random((24, 6, 6, 3)).astype(np.float32)
    y = np.arange(24) % 3
    got = {}
    for name, xs in (('nhwc', x), ('nchw', x.transpose(0, 3, 1, 2))):
        np.savez(tmp_path / (name + '.npz'), x=xs, y=y)
        out = tmp_path / name
        prepare(model, str(out), data=str(tmp_path / (name + '.npz')), loss='scce', int8=int8,
                lr=0.01, log=lambda *a: None)       # (lr given: no lr probe, most of the time)
        assert (out / 'q8.json').exists() == int8
        got[name] = ds.read_dataset(str(out / 'train.ds'))[0]
    np.testing.assert_array_equal(got['nchw'], got['nhwc'])
    if not int8:
        np.testing.assert_array_equal(got['nhwc'], x.reshape(24, -1))


def test_an_image_folder_is_read_in_the_model_inputs_size_and_channels(tmp_path):
    """Issue 28: a folder of RGB images for an RGB model was read gray at the images' own
    size and refused ('x has 64 values per sample, the model input takes 192'): read for
    a model, images take its input's size and channels (RGB for 3, gray for 1), as PIL
    resizes them; evaluate reads them the same way."""
    from PIL import Image
    from host_tools.prepare.pipeline import prepare
    rng = np.random.default_rng(3)
    want = []
    for c in ('a', 'b', 'c'):
        (tmp_path / 'imgs' / c).mkdir(parents=True)
        for i, side in enumerate((6, 10)):
            im = Image.fromarray(rng.integers(0, 256, (side, side, 3)).astype(np.uint8))
            im.save(tmp_path / 'imgs' / c / f'{i}.png')
            want.append(np.asarray(im.resize((6, 6)), np.float32).reshape(-1) / 255)
    model = _rgb_cnn(str(tmp_path / 'rgb.circle'))
    prepare(model, str(tmp_path / 'o'), data=str(tmp_path / 'imgs'), loss='scce',
            log=lambda *a: None)
    x, y = ds.read_dataset(str(tmp_path / 'o' / 'train.ds'))
    np.testing.assert_allclose(x, np.array(want), atol=1e-6)
    assert y[:, 0].tolist() == [0, 0, 1, 1, 2, 2]
    gray, _ = ds.load(str(tmp_path / 'imgs'), shape=[1, 6, 6, 1])
    assert gray.shape == (6, 6, 6)
    from host_tools.prepare import infer
    pytest.importorskip('onert')
    assert infer.evaluate(model, str(tmp_path / 'imgs'))['n'] == 6
