"""Row bands for an int8 model whose frozen convolutions do not start at the input
(issue 28): a Teachable Machine / Model Maker MobileNet begins with the Rescaling layer's
MUL and ADD of scalar constants, which no band group computed, and prepare planned no
bands at all (a 224x224 file's prefix pass was refused on an ESP32-S3).  Those frozen
ops are now LUT layers (quant._tabulate_frozen), which band groups run, and the planner
bands each run of band kinds wherever it starts (quant._bands: after a MUL by a
per-channel constant, which stays a BIN layer); the banded forward is the unbanded one's
bytes and TFLite Micro's, on the host and under unix MicroPython."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT, staged_run  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from kerasgraphs import build_int8_rescaled_mbv2  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402

MP = runner.find_micropython()


def _tflm(path, xq, H):
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(path)
    it.set_input(xq.reshape(1, H, H, 3), 0)
    it.invoke()
    return it.get_output(0).ravel().tobytes()


def _tables(g, folder, rows):
    """{name: folder} of the model's q8 tables written as planned with bands (rows None:
    chosen, n: n rows a band) and without (0)."""
    out = {}
    for name, r in (('banded', rows), ('whole', 0)):
        d = os.path.join(folder, name)
        os.makedirs(d, exist_ok=True)
        m = quant.meta(g, 'last:1', rows=r)
        quant.write(g, d, 'last:1', m)
        out[name] = d
    return out


def _samples(H, n=3):
    # images of different brightness (uniform noise alone averages out at the MEAN)
    rng = np.random.default_rng(H)
    return [np.clip(rng.normal(-90 + 180 * i / max(1, n - 1), 50, H * H * 3), -128,
                    127).astype(np.int8) for i in range(n)]


@pytest.mark.parametrize('H,rows,kw', [
    (32, None, {}), (48, None, dict(mul=-2.0, add=1.0)), (24, 2, dict(C=8, E=6)),
    (40, 1, dict(D=8)), (40, None, dict(pool=('MAX_POOL_2D', 3, 1, 'SAME'))),
    (48, None, dict(pool=('AVERAGE_POOL_2D', 3, 2, 'SAME'), C=16, E=6)),
    (40, 2, dict(pool=('MAX_POOL_2D', 2, 2, 'VALID'), C=24, E=6)),
    (32, None, dict(per_channel=True)), (40, 1, dict(per_channel=True, mul=-2.0, add=1.0)),
    (32, None, dict(sub=True)), (24, 2, dict(sub=True, mul=-2.0, add=1.0, C=12)),
    (44, 1, dict(pool=('AVERAGE_POOL_2D', 3, 2, 'VALID'), C=16, E=6))])
def test_bands_after_the_rescaling_are_exact(tmp_path, H, rows, kw):
    """The Rescaling's two elementwise layers (LUTs; a per-channel MUL stays a BIN) and
    the convolutions after them (and a max or average pool, padded or not) in row bands
    (a group from layer 0, or 1 after the BIN, as chosen or at --bands n): a smaller
    arena, and the forward's bytes are the unbanded table's and TFLite Micro's."""
    path = build_int8_rescaled_mbv2(str(tmp_path / 'm.tflite'), H=H, **kw)
    g = read_model(path)
    dirs = _tables(g, str(tmp_path), rows)
    ms = {k: json.load(open(os.path.join(d, 'q8.json'))) for k, d in dirs.items()}
    lo = 1 if kw.get('per_channel') else 0
    assert ms['banded']['groups'] and ms['banded']['groups'][0][0] == lo, ms['banded']['groups']
    assert [d['k'] for d in ms['banded']['layers'][:2]] == [quant.BIN if lo else quant.LUT,
                                                            quant.LUT]
    assert not ms['whole']['groups']
    assert ms['banded']['arena'] < ms['whole']['arena']
    if 'pool' in kw:        # (layer 3: the pool, inside a group)
        assert ms['banded']['layers'][3]['k'] in (quant.POOL_MAX, quant.POOL_AVG)
        assert any(lo <= 3 < hi for lo, hi, _ in ms['banded']['groups']), ms['banded']['groups']
    nets = {k: Q8Net(ms[k], os.path.join(d, 'weights.wof')) for k, d in dirs.items()}
    outs = set()
    for x in _samples(H):
        ys = [bytes(nets[k].forward(bytearray(x.tobytes()))) for k in ('banded', 'whole')]
        assert ys[0] == ys[1] == _tflm(path, x, H)
        outs.add(ys[0])
    assert len(outs) > 1          # (the logits depend on the sample)
    for n in nets.values():
        n.close()


MP_FWD = '''
import json
from utrain.q8 import Q8Net
for d in ('banded', 'whole'):
    m = json.load(open(d + '/q8.json'))
    net = Q8Net(m, d + '/weights.wof')
    for i in range(%d):
        x = bytearray(open('x%%d.bin' %% i, 'rb').read())
        print('OUT', d, bytes(net.forward(x)).hex())
    net.close()
'''


@pytest.mark.parametrize('env', ['MICROPYTHON', 'UTRAIN_MP32'])
@pytest.mark.parametrize('H,kw', [(32, {}), (48, dict(pool=('AVERAGE_POOL_2D', 3, 2, 'SAME'),
                                                      C=16, E=6))])
def test_bands_after_the_rescaling_under_micropython(tmp_path, env, H, kw):
    """The same on unix MicroPython (viper's kernels; 64-bit and the 32-bit build): the
    banded table's logits are the unbanded one's and TFLite Micro's."""
    exe = MP if env == 'MICROPYTHON' else os.environ.get(env)
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip(f'no {env} binary')
    path = build_int8_rescaled_mbv2(str(tmp_path / 'm.tflite'), H=H, seed=4, **kw)
    g = read_model(path)
    dirs = _tables(g, str(tmp_path), None)
    assert json.load(open(os.path.join(dirs['banded'], 'q8.json')))['groups'][0][0] == 0
    xs = _samples(H, 2)
    for i, x in enumerate(xs):
        (tmp_path / f'x{i}.bin').write_bytes(x.tobytes())
    (tmp_path / 'case.py').write_text(MP_FWD % len(xs))
    r = staged_run(exe, tmp_path, 'case.py', '1M', 120)
    assert r.returncode == 0, r.stderr
    got = [v.split()[1:] for v in r.stdout.splitlines() if v.startswith('OUT ')]
    want = [_tflm(path, x, H).hex() for x in xs]
    assert got == [['banded', w] for w in want] + [['whole', w] for w in want]


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_budget_chooses_the_bands_and_the_cached_run_trains_as_unbanded(tmp_path):
    """prepare --cache under a budget the unbanded prefix pass does not fit: the prefix's
    table is banded from layer 0 (prepare says so; the board reads each sample a strip of
    rows at a time), and the board's run (its prefix pass banded) trains the classifier
    to the bytes of the unbanded run."""
    from host_tools.prepare.pipeline import prepare
    H = 64
    path = build_int8_rescaled_mbv2(str(tmp_path / 'm.tflite'), H=H, C=16, E=6, seed=2)
    x = np.stack([np.clip(v.astype(np.float32) + 128, 0, 255) / 255 for v in _samples(H, 6)])
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=x.reshape(6, H, H, 3), y=np.arange(6) % 3)
    kw = dict(data=data, loss='scce', optimizer='sgd', lr=0.05, epochs=2, batch=1,
              train='last:1', test_split=0.34, cache=True)
    whole = prepare(path, str(tmp_path / 'w'), bands=0, log=lambda *a: None, **kw)
    free = prepare(path, str(tmp_path / 'f'), log=lambda *a: None, **kw)
    assert free['heap']['total'] < whole['heap']['total'] - 40 * 1024
    said = []
    budget = (free['heap']['total'] + whole['heap']['total']) // 2
    prepare(path, str(tmp_path / 'b'), budget=budget, log=said.append, **kw)
    assert any('row bands' in s for s in said), said
    groups = json.load(open(tmp_path / 'b' / 'q8.json'))['groups']
    assert groups and groups[0][0] == 0
    assert not json.load(open(tmp_path / 'w' / 'q8.json'))['groups']
    outs = []
    for d in ('b', 'w'):
        code, out = runner.run(str(tmp_path / d), stream=False)
        assert code == 0, out
        outs.append((tmp_path / d / 'trained.wof').read_bytes())
    assert outs[0] == outs[1]
