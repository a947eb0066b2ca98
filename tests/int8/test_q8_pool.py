"""Int8 MAX_POOL_2D / AVERAGE_POOL_2D (issue 16): small int8 models built here (conv ->
pool -> conv -> FC, per-channel weight scales), the pool's output and the logits against
TFLite Micro (VALID and SAME, stride 2, edge windows), the same integers and the same
training step under viper (unix MicroPython), a conv before a pool trained against a
float fake-quantized numpy reference, and the refusals."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.graph.inout import save_graph  # noqa: E402
from utrain import q8kern as K  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from test_q8 import _np_conv_taps, spy_updates  # noqa: E402

MP = runner.find_micropython()
H0, C0, C1, C2, NCLS = 9, 2, 4, 3, 4


def _pool_out(n, k, s, pad):
    return (n - k) // s + 1 if pad == 'VALID' else (n + s - 1) // s


def build(path, pool, k=2, s=2, pad='VALID', act='NONE', seed=0, zpool=None):
    """conv 3x3 SAME (RELU) -> pool k x k / s -> conv 3x3 SAME -> RESHAPE -> FC, int8 with
    per-channel weight scales, as a TFLite file (zpool: the pool output's zero point, to
    make one that differs from its input's)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa

    def conv(x, sx, O, I, y, sy, H, a='NONE', fc=False):
        fan = I if fc else 9 * I      # outputs of ~30 steps of sy from inputs of ~40
        sw = rng.uniform(0.7, 1.3, O) * 30 * sy / (fan ** 0.5 * 40 * sx * 73)
        wq = rng.integers(-127, 128, (O, I) if fc else (O, 3, 3, I)).astype(np.int8)
        w = b.tensor(f'w{y}', wq.shape, data=wq, quant={
            'scale': list(sw), 'zero_point': [0] * O, 'quantized_dimension': 0})
        bq = rng.integers(-300, 300, O).astype(np.int32)
        bt = b.tensor(f'b{y}', [O], data=bq, quant={'scale': list(sx * sw),
                                                    'zero_point': [0] * O})
        if fc:
            b.op('FULLY_CONNECTED', [x, w, bt], [y], fused_activation_function=a)
        else:
            b.op('CONV_2D', [x, w, bt], [y], padding='SAME', stride_w=1, stride_h=1,
                 fused_activation_function=a)

    sx, s1, s2, s3 = 0.02, 0.03, 0.05, 0.08
    z1 = -20
    x = b.tensor('x', [1, H0, H0, C0], dtype='int8', quant=q(sx, 3))
    c1 = b.tensor('c1', [1, H0, H0, C1], dtype='int8', quant=q(s1, z1))
    conv(x, sx, C1, C0, c1, s1, H0, 'RELU')
    P = _pool_out(H0, k, s, pad)
    p = b.tensor('p', [1, P, P, C1], dtype='int8',
                 quant=q(s1, z1 if zpool is None else zpool))
    b.op(pool, [c1], [p], padding=pad, stride_w=s, stride_h=s, filter_width=k,
         filter_height=k, fused_activation_function=act)
    c2 = b.tensor('c2', [1, P, P, C2], dtype='int8', quant=q(s2, 5))
    conv(p, s1, C2, C1, c2, s2, P)
    n = P * P * C2
    f = b.tensor('flat', [1, n], dtype='int8', quant=q(s2, 5))
    b.op('RESHAPE', [c2, b.tensor('shape', [2], data=np.array([1, n], np.int32))], [f],
         new_shape=[1, n])
    y = b.tensor('y', [1, NCLS], dtype='int8', quant=q(s3, -2))
    conv(f, s2, NCLS, n, y, s3, None, fc=True)
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return path


def _sample(seed):
    r = np.random.default_rng(100 + seed)
    return bytearray(r.integers(-128, 128, H0 * H0 * C0).astype(np.int8).tobytes())


def _tflm(path, xq, end=None, tmp=None):
    """TFLite Micro's output of the model (end: cut after op end, written in tmp)."""
    from tflite_micro.python.tflite_micro import runtime
    if end is not None:
        g = read_model(path)
        g.ops = g.ops[:end + 1]
        g.outputs = [g.ops[-1].outputs[0]]
        path = save_graph(g, os.path.join(tmp, 'cut.tflite'))
    it = runtime.Interpreter.from_file(path)
    it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(1, H0, H0, C0), 0)
    it.invoke()
    return it.get_output(0).ravel()


CASES = [('MAX_POOL_2D', 2, 2, 'VALID', 'NONE'), ('MAX_POOL_2D', 3, 2, 'SAME', 'RELU6'),
         ('AVERAGE_POOL_2D', 2, 2, 'VALID', 'NONE'), ('AVERAGE_POOL_2D', 3, 2, 'SAME', 'NONE'),
         ('AVERAGE_POOL_2D', 2, 2, 'SAME', 'RELU6')]


def _net(tmp_path, case, train='none', rows=None):
    path = build(str(tmp_path / 'm.tflite'), *case)
    g = read_model(path)
    m = quant.write(g, str(tmp_path), train,
                    None if rows is None else quant.meta(g, train, rows=rows))
    with open(tmp_path / 'q8.json') as f:
        mm = json.load(f)                   # as the board reads it (q8.req multipliers)
    return path, m, Q8Net(mm, str(tmp_path / 'weights.wof'))


@pytest.mark.parametrize('case', CASES)
def test_pool_forward_bit_exact_with_tflite_micro(tmp_path, case):
    # (unbanded: the pool's output read after the forward, its arena bytes not reused by
    # the band group's windows; banded pools: tests/int8/test_q8_bands_later.py)
    path, m, net = _net(tmp_path, case, rows=0)
    assert [d['k'] for d in m['layers']] == [quant.CONV, quant.KINDS[case[0]], quant.CONV,
                                             quant.FC]
    P = _pool_out(H0, case[1], case[2], case[3])
    assert m['layers'][1]['g'][10:12] == [P, P]
    for i in range(3):
        xq = _sample(i)
        logits = np.frombuffer(bytes(net.forward(xq)), np.int8)
        pool = np.frombuffer(bytes(net.layers[1].y), np.int8)
        assert np.array_equal(pool, _tflm(path, xq, 1, str(tmp_path))), i
        assert len(set(pool.tolist())) > 8                  # not a degenerate case
        assert np.array_equal(logits, _tflm(path, xq)), i


def test_pool_refusals(tmp_path):
    g = read_model(build(str(tmp_path / 'z.tflite'), 'MAX_POOL_2D', zpool=7))
    with pytest.raises(ValueError, match='MAX_POOL_2D op 1 has input scale.*need them equal'):
        quant.layers(g)


def _ref_update(net, m, xq, label, lr):
    """The float fake-quantized model's dL/dW of the trained first conv (numpy), as the
    int8 update lr dL/dW / s_W in 1/256 weight steps."""
    L = net.layers
    q = lambda b: np.frombuffer(bytes(b), np.int8).astype(np.float64)  # noqa
    D = m['layers']                         # (with the scales q8.json leaves out)
    acts = [(q(xq) - m['zx']) * m['sx']] + [(q(l.y) - l.zy) * d['sy'] for l, d in zip(L, D)]
    p = np.exp(acts[-1] - acts[-1].max())
    dy = p / p.sum()
    dy[label] -= 1
    for i in range(len(L) - 1, -1, -1):
        l, d = L[i], D[i]
        xin = acts[i]
        yq = q(l.y)
        H, Wd, I, O, KH, KW, sh, sw_, ph, pw, OH, OW = d['g'][:12] if 'g' in d else [0] * 12
        if l.k in quant.POOLS:
            lo, hi = l.lo if l.lo > -128 else -129, l.hi if l.hi < 127 else 128
            Z = (dy * ((yq > lo) & (yq < hi))).reshape(OH, OW, O)
            X = xin.reshape(H, Wd, I)
            dX = np.zeros_like(X)
            for oy in range(OH):
                for ox in range(OW):
                    taps = [(oy * sh - ph + ky, ox * sw_ - pw + kx) for ky in range(KH)
                        for kx in range(KW) if 0 <= oy * sh - ph + ky < H
                        and 0 <= ox * sw_ - pw + kx < Wd]
                    if l.k == quant.POOL_AVG:
                        for iy, ix in taps:
                            dX[iy, ix] += Z[oy, ox] / len(taps)
                    else:
                        for c in range(O):
                            iy, ix = max(taps, key=lambda t: (X[t[0], t[1], c],
                                                              -t[0], -t[1]))
                            dX[iy, ix, c] += Z[oy, ox, c]
            dy = dX.ravel()
            continue
        dz = dy * ((yq > l.lo) & (yq < l.hi))
        sw = np.array(d['sw'])
        wq = q(l.w)
        if l.k == quant.FC:
            dy = (wq.reshape(l.nout, -1) * sw[:, None]).T @ dz
            continue
        X = xin.reshape(H, Wd, I)
        Z = dz.reshape(OH, OW, O)
        Wf = wq.reshape(O, KH, KW, I) * sw[:, None, None, None]
        gW, dX = np.zeros_like(Wf), np.zeros_like(X)
        for oy, ox, ky, kx, iy, ix in _np_conv_taps(H, Wd, KH, KW, sh, sw_, ph, pw, OH, OW):
            gW[:, ky, kx, :] += np.outer(Z[oy, ox], X[iy, ix])
            dX[iy, ix] += Z[oy, ox] @ Wf[:, ky, kx, :]
        if i == 0:
            return lr * gW / sw[:, None, None, None] * 256
        dy = dX.ravel()


def _exact(L):
    # a convolution's weights with their fractions, in 1/256 steps (q8kern.upek)
    w = np.frombuffer(bytes(L.w), np.int8).astype(np.int64)
    return 256 * w - np.frombuffer(bytes(L.wf), np.int8).astype(np.int64)


@pytest.mark.parametrize('case', [CASES[0], CASES[3], CASES[4]])
def test_conv_before_pool_trains_as_float_reference(tmp_path, monkeypatch, case):
    """One int8 SGD step of the first conv (the pool, the second conv and the FC pass the
    gradient back): its update against the float gradient of the dequantized model with
    fake-quantized activations; a max pool's gradient goes to its window's max, an
    average pool's is spread over the window's valid inputs."""
    path, m, net = _net(tmp_path, case, train=[0])
    assert [d.get('back') for d in m['layers'][1:]] == [1, 1, 1]
    label, lr = 1, 0.01
    got = spy_updates(monkeypatch)
    errs = []
    for i in range(2):
        xq = _sample(i)
        net.forward(xq)
        want = _ref_update(net, m, xq, label, lr).ravel()
        L = net.layers[0]
        w0 = _exact(L)
        ge = np.array(L.ge)
        net.step(xq, label, lr)
        # the conv's weights (with their fractions: SGD moves a convolution exactly, in
        # 1/256 steps) moved by the update, but where a channel's scale grew (a weight
        # reached +-127: utrain.q8grow halved them)
        free = np.abs(np.frombuffer(bytes(L.w), np.int8)) < 127      # (not clamped)
        free &= np.repeat(np.array(L.ge) == ge, L.geo()[1])
        assert np.array_equal((_exact(L) - w0)[free], -got[-1][free]) and got[-1].any()
        errs.append(np.linalg.norm(got[-1] - want) / np.linalg.norm(want))
    assert max(errs) < 0.08, errs


def test_pool_kernels_edge_windows():
    """q8pool's pok / pbk on one channel by hand: SAME 3x3 / 2 over 4x4, corner windows of 4
    inputs; TFLite's rounding of negative averages, the max's first argmax."""
    from array import array
    from utrain import q8pool as K
    x = [1, 5, 5, 0, -3, 2, 0, 0, 7, -9, 4, 4, -7, -8, 1, 2]
    g = array('i', [4, 4, 1, 1, 3, 3, 2, 2, 0, 0, 2, 2, 1, 1])   # SAME pads 0 top: 1 bottom
    xb = bytearray(v & 255 for v in x)
    y = bytearray(4)
    K.pok(y, xb, g, -128, 127, 0)
    assert np.frombuffer(bytes(y), np.int8).tolist() == [7, 5, 7, 4]
    K.pok(y, xb, g, -128, 127, 1)
    # windows: rows 0-2 x cols 0-2 (9), rows 0-2 x cols 2-3 (6), rows 2-3 x 0-2 (6), 2-3 x 2-3
    w = [[1, 5, 5, -3, 2, 0, 7, -9, 4], [5, 0, 0, 0, 4, 4], [7, -9, 4, -7, -8, 1],
         [4, 4, 1, 2]]
    want = [int((s + len(v) // 2) / len(v)) if s > 0 else -int((len(v) // 2 - s) / len(v))
            for v in w for s in [sum(v)]]
    assert np.frombuffer(bytes(y), np.int8).tolist() == want == [1, 2, -2, 3]   # -12 / 6: -(3 + 12) // 6
    dx = array('i', [0] * 16)
    K.pok(y, xb, g, -128, 127, 0)
    K.pbk(dx, array('i', [10, -20, 30, 40]), xb, g, y, -129, 128, 0)
    want = [0] * 16
    want[8] += 10 + 30          # 7 at (2, 0): the max of windows 0 and 2
    want[2] += -20              # 5 at (0, 2)
    want[10] += 40              # 4 at (2, 2) before the tie at (2, 3): the first max
    assert list(dx) == want
    K.pbk(dx, array('i', [9, -6, 6, 8]), xb, g, y, -129, 128, 1)
    want = [0] * 16
    for o, (r, c) in enumerate([(0, 0), (0, 2), (2, 0), (2, 2)]):
        taps = [(iy, ix) for iy in range(r, min(r + 3, 4)) for ix in range(c, min(c + 3, 4))]
        v = [9, -6, 6, 8][o] * 9 / len(taps)
        for iy, ix in taps:
            want[iy * 4 + ix] += int(np.sign(v) * np.floor(abs(v) + 0.5))
    assert list(dx) == want


MP_RUN = '''
import json
from utrain.q8 import Q8Net
m = json.load(open('q8.json'))
net = Q8Net(m, 'weights.wof')
out = []
for i in range(2):
    x = bytearray(open('x%d.bin' % i, 'rb').read())
    out.append(list(net.forward(x)) + list(net.layers[1].y))
    net.step(x, 1, 0.01)
out.append(list(net.layers[0].w) + list(net.layers[0].b))
print(json.dumps(out))
'''


@pytest.mark.parametrize('case,env', [(CASES[1], 'MICROPYTHON'), (CASES[3], 'MICROPYTHON'),
                                      (CASES[3], 'UTRAIN_MP32')])
def test_viper_pool_forward_and_step_equal_cpython(tmp_path, case, env):
    """The viper kernels (unix MicroPython, 64-bit and $UTRAIN_MP32's 32-bit) give
    CPython's pool outputs, logits and the trained conv's weights and biases after two
    steps through the pool."""
    exe = MP if env == 'MICROPYTHON' else os.environ.get(env)
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip(f'no {env} binary')
    path, m, net = _net(tmp_path, case, train=[0])
    mpy = int(subprocess.run([exe, '-c', 'import sys;print(sys.implementation._mpy)'],
                             capture_output=True, text=True).stdout.split()[-1])
    runner.stage(str(tmp_path), mpy=mpy)
    want = []
    for i in range(2):
        x = _sample(i)
        (tmp_path / f'x{i}.bin').write_bytes(bytes(x))
        want.append(list(net.forward(x)) + list(net.layers[1].y))
        net.step(x, 1, 0.01)
    want.append(list(net.layers[0].w) + list(net.layers[0].b))
    (tmp_path / 'case.py').write_text(MP_RUN)
    r = subprocess.run([exe, 'case.py'], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, MICROPYPATH=':lib'), timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == want


@pytest.mark.parametrize('train,cache', [('all', False), ('last:3', True)])
def test_prepare_and_run_a_pool_model(tmp_path, train, cache):
    """prepare's int8 path and the run (CPython) on a conv -> max pool -> conv -> FC model:
    every conv and the FC trained through the pool, or the layers after it from the
    board's prefix cache (the pool frozen in the prefix); the training loss falls."""
    from host_tools.prepare.pipeline import prepare
    path = build(str(tmp_path / 'm.tflite'), *CASES[1])
    r = np.random.default_rng(4)
    n = 48
    y = r.integers(0, NCLS, n)
    c = r.standard_normal((NCLS, H0, H0, C0))
    x = (c[y] + 0.5 * r.standard_normal((n, H0, H0, C0))).astype(np.float32)
    np.savez(str(tmp_path / 'd.npz'), x=x, y=y)
    out = str(tmp_path / 'run')
    s = prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd',
                lr=0.01, epochs=3, train=train, cache=cache)
    assert s['int8'] and len(s['trainable']) == (6 if train == 'all' else 4)
    if cache:
        with open(os.path.join(out, 'q8.json')) as f:
            assert [d['k'] for d in json.load(f)['layers']] == [quant.CONV, quant.POOL_MAX]
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0, text
    loss = [float(v.split('loss ')[1].split()[0]) for v in text.splitlines()
            if v.startswith('epoch ')]
    assert len(loss) == 3 and loss[-1] < loss[0], text
