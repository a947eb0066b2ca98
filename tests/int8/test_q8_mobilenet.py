"""Int8 forward of big models (issue 16's memory target): the Keras MobileNetV2-0.35 96x96
int8 model's logits against TFLite Micro (residual ADDs, PADs folded into convolutions,
the early layers in row bands, frozen weights streamed from the .wof, activations in a
planned arena), TFLite's int8 ADD against its integer formula, the same integers under
viper (unix MicroPython), and the run training at its measured heap on the 32-bit
build ($UTRAIN_MP32 / $UTRAIN_MP32_ULAB)."""
import json
import os
import random
import sys
from array import array

import numpy as np
import pytest

from repo import ROOT, no_keep_best, staged_run  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.graph.inout import save_graph  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402

MNV2 = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mobilenetv2_035_96_int8.tflite')
MP = runner.find_micropython()


def _cut(tmp_path, end=None):
    """The model up to op `end` (None: the logits, before the SOFTMAX) as a file."""
    g = read_model(MNV2)
    g.ops = g.ops[:end + 1] if end is not None else g.ops[:-1]
    g.outputs = [g.ops[-1].outputs[0]]
    out = str(tmp_path / 'cut.tflite')
    save_graph(g, out)
    return g, out


def _sample(seed=0):
    return (np.random.default_rng(seed).random((96, 96, 3)) * 2 - 1).astype(np.float32)


def _tflm(path, xq):
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(path)
    it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(1, 96, 96, 3), 0)
    it.invoke()
    return it.get_output(0).ravel()


def _net(g, folder, train='none', rows=None):
    m = quant.meta(g, train, rows=rows)
    quant.write(g, str(folder), train, m)
    with open(os.path.join(folder, 'q8.json')) as f:
        mm = json.load(f)                 # as the board reads it (multipliers in q8.req)
    return mm, Q8Net(mm, str(folder / 'weights.wof'))


def test_mobilenet_logits_bit_exact_with_tflite_micro(tmp_path):
    """The whole int8 MobileNetV2 as planned (a row-band group, the rest whole in the
    arena, frozen weights read per layer / channel chunk): TFLite Micro's logits."""
    g, cut = _cut(tmp_path)
    m, net = _net(g, tmp_path, 'last:2')
    assert m['groups'] and m['req'] and any(d.get('nc') for d in m['layers'])
    xq = net.quantize_input(_sample().ravel().tolist())
    ours = np.frombuffer(bytes(net.forward(xq)), np.int8)
    assert np.array_equal(ours, _tflm(cut, xq))


def test_plan_shares_the_arena_and_bands_lower_it():
    g = read_model(MNV2)
    whole = quant.meta(g, 'last:2', rows=0)
    banded = quant.meta(g, 'last:2')
    # every activation whole at once would be far more than the arena: tensors share it
    total = sum(d['nout'] for d in whole['layers'])
    assert whole['arena'] < total / 3
    # the planned arena is at least the largest op's input plus output
    big = max(d['nout'] + sum(n for k, o, n in whole['at'] if k in d['in']) for d in
              whole['layers'])
    assert whole['arena'] >= big
    assert banded['arena'] < whole['arena'] / 3


def tflite_add(x1, x2, z1, z2, s1, s2, zo, so, lo=-128, hi=127):
    """TFLite's reference int8 ADD (add.cc / reference_integer_ops::AddElementwise) with
    Python integers and doubles."""
    from test_q8 import tflm_mbqm
    tm = 2 * max(s1, s2)
    m1 = quant.quantize_multiplier(s1 / tm)
    m2 = quant.quantize_multiplier(s2 / tm)
    mo = quant.quantize_multiplier(tm / ((1 << 20) * so))
    out = []
    for a, b in zip(x1, x2):
        r = tflm_mbqm((a - z1) << 20, *m1) + tflm_mbqm((b - z2) << 20, *m2)
        out.append(min(hi, max(lo, tflm_mbqm(r, *mo) + zo)))
    return out


def test_add_matches_tflite_integers(tmp_path):
    from utrain.q8 import Layer
    r = random.Random(2)
    for case in range(6):
        n = 300
        x1 = [r.randint(-128, 127) for _ in range(n)]
        x2 = [r.randint(-128, 127) for _ in range(n)]
        z1, z2, zo = r.randint(-128, 127), r.randint(-128, 127), r.randint(-128, 127)
        s1, s2 = 10 ** r.uniform(-4, -1), 10 ** r.uniform(-4, -1)
        so = (s1 + s2) * r.uniform(0.3, 2)
        tm = 2 * max(s1, s2)
        ms = [quant.quantize_multiplier(v) for v in (s1 / tm, s2 / tm, tm / ((1 << 20) * so))]
        d = {'k': 4, 'nout': n, 'zx': z1, 'z2': z2, 'zy': zo, 'lo': -128, 'hi': 127,
             'mul': [m for m, _ in ms], 'shf': [e for _, e in ms], 'in': [0, 1], 'out': 2}
        L = Layer(d, None, None, array('i', [0] * 64))     # chunks of 32: several calls
        b1 = bytearray(v & 255 for v in x1)
        b2 = bytearray(v & 255 for v in x2)
        got = np.frombuffer(bytes(L.forward(b1, b2)), np.int8).tolist()
        assert got == tflite_add(x1, x2, z1, z2, s1, s2, zo, so), case


MP_FWD = '''
import json
from utrain.q8 import Q8Net
x = bytearray(open('x.bin', 'rb').read())
for d in ('banded', 'whole'):
    m = json.load(open(d + '/q8.json'))
    net = Q8Net(m, d + '/weights.wof')
    print('OUT', bytes(net.forward(x)).hex())
'''


@pytest.mark.parametrize('env', ['MICROPYTHON', 'UTRAIN_MP32'])
def test_viper_forward_bit_exact_with_tflite_micro(tmp_path, env):
    """The MobileNetV2 forward under viper (64-bit unix MicroPython, the 32-bit build),
    as planned (row bands) and with every tensor whole in the arena: TFLite Micro's
    logits."""
    exe = MP if env == 'MICROPYTHON' else os.environ.get(env)
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip(f'no {env} binary')
    g, cut = _cut(tmp_path)
    for name, rows in (('banded', None), ('whole', 0)):
        os.makedirs(tmp_path / name)
        m = quant.meta(g, 'none', rows=rows)
        assert bool(m['groups']) == (rows is None)
        quant.write(g, str(tmp_path / name), 'none', m)
    sx, zx = m['sx'], m['zx']
    xq = np.clip(np.round(_sample(3).ravel() / sx) + zx, -128, 127).astype(np.int8)
    (tmp_path / 'x.bin').write_bytes(xq.tobytes())
    (tmp_path / 'case.py').write_text(MP_FWD)
    r = staged_run(exe, tmp_path, 'case.py')
    assert r.returncode == 0, r.stderr
    want = _tflm(cut, xq.tobytes()).tobytes().hex()
    assert [v.split()[1] for v in r.stdout.splitlines() if v.startswith('OUT ')] == [want] * 2


def _prepared(folder, cache, n=6):
    from bench.zoo.mobilenet import images
    from host_tools.prepare.pipeline import prepare
    x, y = images((1, 3, 96, 96), n)
    os.makedirs(folder, exist_ok=True)
    data = os.path.join(folder, 'data.npz')
    np.savez(data, x=x, y=y)
    prepare(MNV2, folder, data=data, loss='scce', optimizer='sgd', lr=0.01, epochs=1, batch=1,
            train='last:2', test_split=0.25, cache=cache, log=lambda *a: None)
    no_keep_best(folder)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_board_prefix_cache_trains_as_the_whole_model(tmp_path):
    """prepare --cache: the board runs the frozen prefix once per sample into .q8.pfx
    datasets and trains the classifier from them; the trained weights are the bytes of
    the run that computes the whole model every step, and the cache holds the classifier's
    input as TFLite Micro computes it."""
    outs = []
    for cache in (True, False):
        d = _prepared(str(tmp_path / ('c' if cache else 'w')), cache)
        code, out = runner.run(d, stream=False)
        assert code == 0, out
        with open(os.path.join(d, 'trained.wof'), 'rb') as f:
            outs.append(f.read())
    assert outs[0] == outs[1]
    c = str(tmp_path / 'c')
    with open(os.path.join(c, 'train.json')) as f:
        assert json.load(f)['files']['prefix'] == 'q8.json'
    from utrain.data import Dataset
    src = Dataset(os.path.join(c, 'test.ds'), False)
    got = Dataset(os.path.join(c, 'test.ds.q8.pfx'))
    assert got.n == src.n and got.x_len == 1280
    src.f.seek(src.head)
    x = src.f.read(src.x_len)
    got.f.seek(got.head)
    _, mean = _cut(tmp_path, 66)            # TFLite Micro up to the MEAN: the cached input
    assert got.f.read(1280) == _tflm(mean, x).tobytes()
    src.f.close(), got.f.close()


@pytest.mark.slow
@pytest.mark.parametrize('env,heap', [('UTRAIN_MP32_ULAB', 168), ('UTRAIN_MP32', 168)])
def test_int8_mobilenet_trains_within_an_rp2040_heap(tmp_path, monkeypatch, env, heap):
    """Issue 16's memory target: the Keras MobileNetV2-0.35 96x96 int8 model with its
    classifier training (the board computing the frozen prefix from its own samples)
    trains one epoch and evaluates in the heap measured on the 32-bit build (KB, under
    an RP2040's 190)."""
    exe = os.environ.get(env)
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip(f'no {env} binary')
    from host_tools.plan.memory import trains_in
    monkeypatch.setenv('MICROPYTHON', exe)
    d = _prepared(str(tmp_path / 'run'), True)
    runner.stage(d)
    assert trains_in(d, heap * 1024)


def test_int8_cache_on_host_refused(tmp_path):
    from host_tools.prepare.pipeline import prepare, PrepareError
    with pytest.raises(PrepareError, match='made by the board'):
        prepare(MNV2, str(tmp_path / 'h'), loss='scce', optimizer='sgd', train='last:2',
                cache='host')


def test_band_steps_do_not_recurse_a_layer_deep(tmp_path, monkeypatch):
    """A band group's step pulls its inputs' rows through a stack, not a call a layer
    deep (bands.Group._need): the 128x128 model's prefix group of 21 layers passed the
    Pico's recursion limit (RuntimeError on the stock firmware).  MobileNetV2's 17-layer
    group's steps nest no _need in another (each of its layers took one), its logits
    TFLite Micro's.  (Counted at _need itself, not against sys.getrecursionlimit: the
    kernels' numpy calls below it take frames of their own.)"""
    from utrain import bands
    g, cut = _cut(tmp_path)
    m, net = _net(g, tmp_path, 'last:2', rows=1)
    assert m['groups'] and m['groups'][0][1] >= 15, m['groups']
    xq = net.quantize_input(_sample(1).ravel().tolist())
    need, depth = bands.Group._need, [0, 0]

    def counted(self, *a):
        depth[0] += 1
        depth[1] = max(depth[1], depth[0])
        try:
            return need(self, *a)
        finally:
            depth[0] -= 1
    monkeypatch.setattr(bands.Group, '_need', counted)
    ours = np.frombuffer(bytes(net.forward(xq)), np.int8)
    assert depth[1] == 1, depth
    assert np.array_equal(ours, _tflm(cut, xq))
