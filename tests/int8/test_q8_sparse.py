"""The sparse update in the int8 engine (issue 29): layers whose bias alone trains (the
gradient passes through them on a 1-bit mask of their output), weights at a channel ratio
(--ranks OP:RANK on an int8 model), each weight-gradient chunk applied as it is made
(batch 1), SGD momentum.  A small int8 model built here (conv RELU -> depthwise RELU6 ->
pointwise conv RELU -> MEAN -> FC, per-channel weight scales): the int8 updates of a
sparse scheme against the float gradient of the dequantized model with fake-quantized
activations (numpy); the same bytes under viper (unix MicroPython) and CPython + numpy;
the plan's parts."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from utrain import q8kern as K  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from test_q8 import _np_conv_taps  # noqa: E402

MP = runner.find_micropython()
H0, C0, C1, C2, NCLS = 8, 3, 8, 16, 4
# --ranks of the schemes (op: rank code; ops 0 conv, 1 depthwise, 2 pointwise, 3 MEAN, 4 FC)
BIAS, HALF, QUARTER = 1, 2, 4
SCHEMES = {'bias-dw-pw-half': {0: BIAS, 1: BIAS, 2: HALF},
           'dw-quarter-pw-bias': {0: BIAS, 1: QUARTER, 2: BIAS}}


def build(path, seed=0, fc_tensor=False, dims=(H0, C0, C1, C2), ds=1):
    """The model, int8 with per-channel weight scales (fc_tensor: the FC's one per
    tensor, as TFLite's converter writes it), as a TFLite file (dims: input side, input,
    conv and pointwise channels; ds: the depthwise conv's stride)."""
    H0, C0, C1, C2 = dims
    H1 = (H0 + ds - 1) // ds
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa

    def layer(kind, x, sx, O, I, y, sy, k=3, act='NONE', st=1):
        fan = I if kind == 'fc' else k * k * (1 if kind == 'dw' else I)
        sw = rng.uniform(0.7, 1.3, O) * 30 * sy / (fan ** 0.5 * 40 * sx * 73)
        if kind == 'fc' and fc_tensor:
            sw = sw[:1]
        shape = {'fc': (O, I), 'conv': (O, k, k, I), 'dw': (1, k, k, O)}[kind]
        wq = rng.integers(-127, 128, shape).astype(np.int8)
        w = b.tensor(f'w{y}', shape, data=wq, quant={
            'scale': list(sw), 'zero_point': [0] * len(sw),
            'quantized_dimension': 3 if kind == 'dw' else 0})
        bt = b.tensor(f'b{y}', [O], data=rng.integers(-300, 300, O).astype(np.int32),
                      quant={'scale': list(np.resize(sx * sw, O)), 'zero_point': [0] * O})
        if kind == 'fc':
            b.op('FULLY_CONNECTED', [x, w, bt], [y], fused_activation_function=act)
        elif kind == 'conv':
            b.op('CONV_2D', [x, w, bt], [y], padding='SAME', stride_w=1, stride_h=1,
                 fused_activation_function=act)
        else:
            b.op('DEPTHWISE_CONV_2D', [x, w, bt], [y], padding='SAME', stride_w=st,
                 stride_h=st, depth_multiplier=1, fused_activation_function=act)

    sx, s1, s2, s3, s4, s5 = 0.02, 0.03, 0.04, 0.05, 0.05, 0.08
    x = b.tensor('x', [1, H0, H0, C0], dtype='int8', quant=q(sx, 3))
    c1 = b.tensor('c1', [1, H0, H0, C1], dtype='int8', quant=q(s1, -128))
    layer('conv', x, sx, C1, C0, c1, s1, 3, 'RELU')
    d1 = b.tensor('d1', [1, H1, H1, C1], dtype='int8', quant=q(s2, -128))
    layer('dw', c1, s1, C1, C1, d1, s2, 3, 'RELU6', ds)
    c2 = b.tensor('c2', [1, H1, H1, C2], dtype='int8', quant=q(s3, -128))
    layer('conv', d1, s2, C2, C1, c2, s3, 1, 'RELU')
    m = b.tensor('m', [1, C2], dtype='int8', quant=q(s4, -128))
    b.op('MEAN', [c2, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m],
         keep_dims=False)
    y = b.tensor('y', [1, NCLS], dtype='int8', quant=q(s5, -2))
    layer('fc', m, s4, NCLS, C2, y, s5)
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return path


def _sample(seed):
    r = np.random.default_rng(100 + seed)
    return bytearray(r.integers(-128, 128, H0 * H0 * C0).astype(np.int8).tobytes())


def _net(tmp_path, ranks, train='last:1', **kw):
    g = read_model(build(str(tmp_path / 'm.tflite'), **kw))
    m = quant.write(g, str(tmp_path), train, quant.meta(g, train, None, ranks))
    with open(tmp_path / 'q8.json') as f:
        mm = json.load(f)                   # as the board reads it
    return m, Q8Net(mm, str(tmp_path / 'weights.wof'))


def _acts(net, xq):
    """Each layer's int8 output of a forward pass, one layer at a time (a masked layer's
    output is not kept in the arena)."""
    out, x = [], xq
    for L in net.layers:
        x = L.forward(x)
        out.append(np.frombuffer(bytes(x), np.int8).astype(np.float64))
    return out


def _ref(net, m, xq, label):
    """dL/dW and dL/db of every weighted layer of the float model with the int8 model's
    dequantized weights and fake-quantized activations, the ReLU/clamp masks from the
    int8 outputs."""
    L, D = net.layers, m['layers']
    ys = _acts(net, xq)
    q = np.frombuffer(bytes(xq), np.int8).astype(np.float64)
    acts = [(q - m['zx']) * m['sx']] + [(y - l.zy) * d['sy'] for y, l, d in zip(ys, L, D)]
    p = np.exp(acts[-1] - acts[-1].max())
    dy = p / p.sum()
    dy[label] -= 1
    grads = {}
    for i in range(len(L) - 1, -1, -1):
        l, d = L[i], D[i]
        xin = acts[i]
        if l.k == quant.MEAN:
            dy = np.tile(dy / d['n'], d['n'])
            continue
        dz = dy * ((ys[i] > l.lo) & (ys[i] < l.hi))
        sw = np.array(d['sw'])
        wq = np.frombuffer(bytes(l.w), np.int8).astype(np.float64)
        if l.k == quant.FC:
            W = wq.reshape(l.nout, -1) * sw[:, None]
            grads[i] = (np.outer(dz, xin), dz)
            dy = W.T @ dz
            continue
        H, Wd, I, O, KH, KW, sh, sw_, ph, pw, OH, OW = d['g'][:12]
        X, Z = xin.reshape(H, Wd, I), dz.reshape(OH, OW, O)
        conv = l.k == quant.CONV
        Wf = wq.reshape(O, KH, KW, I) * sw[:, None, None, None] if conv else \
            wq.reshape(KH, KW, O) * sw
        gW, dX = np.zeros_like(Wf), np.zeros_like(X)
        for oy, ox, ky, kx, iy, ix in _np_conv_taps(H, Wd, KH, KW, sh, sw_, ph, pw, OH, OW):
            if conv:
                gW[:, ky, kx, :] += np.outer(Z[oy, ox], X[iy, ix])
                dX[iy, ix] += Z[oy, ox] @ Wf[:, ky, kx, :]
            else:
                gW[ky, kx] += Z[oy, ox] * X[iy, ix]
                dX[iy, ix] += Z[oy, ox] * Wf[ky, kx]
        grads[i] = (gW, Z.sum((0, 1)))
        dy = dX.ravel()
    return grads


def _spy(monkeypatch):
    """[(weight buffer, first weight, update)] of every q8kern.upk, upek (a convolution's
    exact update through its weights' fractions) and upmk call (1/256 steps; upek / upmk's
    d times m 2^-sh before its dither h: in 1/65536 steps at m 1, sh 8, Q8Net._dith)."""
    got = []
    real, realf, realm = K.upk, K.upek, K.upmk

    def keep(w, d, n, m=0, sh=0):
        base = w.obj if isinstance(w, memoryview) else w
        i0 = len(base) - len(w) if isinstance(w, memoryview) else 0
        u = np.array(d[:n], np.float64)
        got.append((base, i0, u * m * 2.0 ** (8 - sh) / 256 if m else u))

    def spy(w, d, n, seed):
        keep(w, d, n)
        return real(w, d, n, seed)

    def spyf(w, f, d, p):
        keep(w, d, p[0], p[1], p[2])
        return realf(w, f, d, p)

    def spym(w, d, n, p):
        keep(w, d, n, p[1], p[2])
        return realm(w, d, n, p)
    monkeypatch.setattr(K, 'upk', spy)
    monkeypatch.setattr(K, 'upek', spyf)
    monkeypatch.setattr(K, 'upmk', spym)
    return got


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize('scheme', sorted(SCHEMES))
def test_sparse_step_matches_float_reference(tmp_path, monkeypatch, scheme):
    """One batch-1 SGD step of a sparse scheme: the FC whole, the other layers' biases
    (a bias-only layer passes the gradient on its output's 1-bit mask) and a rank's window
    of weights (the rest unchanged) against the float fake-quantized gradient: weights by
    lr dL/dW / s_W in 1/256 weight steps (QAS), float biases by -lr dL/db."""
    ranks = SCHEMES[scheme]
    m, net = _net(tmp_path, ranks)
    L = net.layers
    # masks where no backward step reads the output: a bias-only layer's, the
    # pointwise conv's before MEAN; never the input of a layer whose weights train
    want_mask = {0: ranks[1] == BIAS, 1: ranks[2] == BIAS, 2: True, 4: False}
    assert {i: L[i].mk is not None for i in want_mask} == want_mask
    lr, label = 0.02, 1
    got = _spy(monkeypatch)
    errs = []
    for step in range(2):
        xq = _sample(step)
        want = _ref(net, m, xq, label)
        bf0 = {i: _held(L[i]) for i in want}
        w0 = {i: bytes(L[i].w) for i in want}
        sws = {i: np.array(L[i].d['sw']) for i in want}   # (before a scale grows: q8grow)
        del got[:]
        net.step(xq, label, lr)
        for i, (gW, gb) in want.items():
            lo, hi = L[i].d.get('tw', (0, L[i].nout if L[i].k == quant.FC else L[i].g[3]))
            oc = len(gb)
            blo, bhi = (lo, hi) if hi > lo else (0, oc)
            db = _held(L[i]) - bf0[i]
            assert np.all(db[:blo] == 0) and np.all(db[bhi:] == 0)
            errs.append((i, 'b', _rel(db[blo:bhi], -lr * gb[blo:bhi])))
            ups = [(i0, u) for base, i0, u in got if base is L[i].w]
            if hi <= lo:                  # the bias alone: the weights never move
                assert not ups and bytes(L[i].w) == w0[i], i
                continue
            sw = sws[i]
            if L[i].k == quant.DW:        # [KH, KW, C]: the window by channel
                (i0, u), = ups
                u = u.reshape(gW.shape)
                assert not u[..., :lo].any() and not u[..., hi:].any()
                errs.append((i, 'w', _rel(u[..., lo:hi], lr * gW[..., lo:hi] / sw[lo:hi] * 256)))
                continue
            row = gW[0].size
            u = np.concatenate([u for _, u in sorted(ups, key=lambda t: t[0])])
            assert sorted(ups, key=lambda t: t[0])[0][0] == lo * row and len(u) == (hi - lo) * row
            ws = lr * gW.reshape(oc, row)[lo:hi] / sw[lo:hi, None] * 256
            errs.append((i, 'w', _rel(u.reshape(hi - lo, row), ws)))
            w1 = np.frombuffer(bytes(L[i].w), np.int8).reshape(oc, row)
            w0a = np.frombuffer(w0[i], np.int8).reshape(oc, row)
            assert np.array_equal(np.delete(w1, np.s_[lo:hi], 0), np.delete(w0a, np.s_[lo:hi], 0))
    assert max(e for _, _, e in errs) < 0.06, errs


def _held(L):
    """The float biases layer L holds: its float bias, or where SGD steps the int32 bias
    in integers (L.be), the int32 bias less its fraction (1/256 steps) at the scales of
    the moment."""
    if L.be is None:
        return np.array(L.bf, np.float64)
    e = np.frombuffer(bytes(L.be), np.int8).astype(np.float64)
    return (np.array(L.b, np.float64) - e / 256) * L.d['sx'] * np.array(L.d['sw'], np.float64)


def _bstate(L):
    # the bytes of the bias state beside the int32 bias: float biases or fractions
    return bytes(L.bf if L.be is None else L.be)


def test_per_tensor_bias_alone_steps(tmp_path):
    """A per-tensor layer whose bias alone trains (an FC classifier at `bias`) steps its
    int32 bias as the float fake-quantized gradient says (-lr dL/db / (s_x s_W) bias
    steps, stochastically rounded; the int8 gradient within a few %), its weights
    unchanged."""
    m, net = _net(tmp_path, {0: BIAS, 1: BIAS, 2: BIAS, 4: BIAS}, fc_tensor=True)
    L = net.layers[4]
    assert len(L.d['sw']) == 1 and L.whi <= L.wlo
    lr, xq = 0.5, _sample(0)
    gb = _ref(net, m, xq, 1)[4][1]
    b0, w0 = np.array(L.b, np.float64), bytes(L.w)
    net.step(xq, 1, lr)
    want = -lr * gb / (L.d['sx'] * L.d['sw'][0])
    assert np.abs(want).min() > 10 and bytes(L.w) == w0
    assert _rel(np.array(L.b, np.float64) - b0, want) < 0.06


def test_chunked_update_equals_whole(tmp_path, monkeypatch):
    """A layer's weight gradient in chunks of output channels (no weight-sized buffer)
    applies the integers one whole buffer would: the same weights after two steps."""
    outs = []
    for chunk in (10 ** 6, 3):
        monkeypatch.setattr(quant, 'GCHUNK', chunk)
        d = tmp_path / str(chunk)
        d.mkdir()
        m, net = _net(d, {2: 0, 1: 0}, 'last:1')
        if chunk == 3:
            assert m['layers'][2].get('gc') == 1 and m['layers'][4].get('gc') == 1
        for s in range(2):
            net.step(_sample(s), 2, 0.05)
        outs.append([bytes(L.w) + bytes(L.b) for L in net.layers if L.train])
    assert outs[0] == outs[1]


def test_lowest_layer_weight_gradient_in_its_dead_gradient_buffer(tmp_path, monkeypatch):
    """The lowest trained layer (no input gradient to make) makes its weight gradient in
    the int32 output-gradient buffer its dz came from, dead by then, where more output
    channels fit than in the shared chunk (q8.json gc): fewer chunks, the same bytes."""
    monkeypatch.setattr(quant, 'GCHUNK', 3)
    real, kern = Q8Net._wgrad, K.cgk
    outs, calls = [], []
    for use in (False, True):
        n = [0]

        def cgk(*a):
            n[0] += 1
            return kern(*a)
        monkeypatch.setattr(K, 'cgk', cgk)
        if not use:
            monkeypatch.setattr(Q8Net, '_wgrad', lambda self, L, dz, sz, lr, g=None:
                                real(self, L, dz, sz, lr))
        else:
            monkeypatch.setattr(Q8Net, '_wgrad', real)
        d = tmp_path / str(use)
        d.mkdir()
        m, net = _net(d, {0: HALF, 1: BIAS, 2: BIAS})
        assert m['layers'][0].get('gc') == 1
        for s in range(2):
            net.step(_sample(s), 2, 0.05)
        outs.append([bytes(L.w) + bytes(L.b) + _bstate(L) for L in net.layers if L.train])
        calls.append(n[0])
    assert outs[0] == outs[1]
    assert calls[0] == 2 * 4 and calls[1] == 2, calls     # (conv 0's 4 channels at 1/2)


def test_dead_buffer_chunks_stay_within_the_kept_multipliers(tmp_path, monkeypatch):
    """The dead-buffer route above takes as many output channels a chunk as the buffer
    holds; a per-channel layer with more trained channels than it keeps multipliers for
    (q8load UMAX: a whole 1x1 conv of MobileNetV2's tail, 960 channels, trained by a
    --select trial) has a multiplier a chunk's channel only: the chunk wrote past them
    (IndexError 'array assignment index out of range', under MicroPython a viper write
    past the array).  Chunks now stay within them: the same bytes as the shared chunk."""
    from utrain import q8load
    monkeypatch.setattr(quant, 'GCHUNK', 3)
    monkeypatch.setattr(q8load, 'UMAX', 2)
    real = Q8Net._wgrad
    outs = []
    for use in (False, True):
        monkeypatch.setattr(Q8Net, '_wgrad', real if use else (
            lambda self, L, dz, sz, lr, g=None: real(self, L, dz, sz, lr)))
        d = tmp_path / str(use)
        d.mkdir()
        m, net = _net(d, {0: 0, 1: BIAS, 2: BIAS})
        L = net.layers[0]
        assert len(L.um) < L.whi - L.wlo and len(L.d['sw']) > 1
        for s in range(2):
            net.step(_sample(s), 2, 0.05)
        outs.append([bytes(L.w) + bytes(L.b) + _bstate(L) for L in net.layers if L.train])
    assert outs[0] == outs[1]


def _vel(L):
    return np.frombuffer(bytes(L.vw), np.int16).astype(np.float64)


def test_momentum_velocity(tmp_path, monkeypatch):
    """SGD momentum at batch 1: each update is mu times the previous one (its int16
    velocity, utrain.q8mom) plus this step's, in 1/256 weight steps."""
    m, net = _net(tmp_path, {}, 'last:1')
    net.setup('sgd', 1, momentum=0.5)
    got = _spy(monkeypatch)
    L = net.layers[4]
    x = _sample(0)
    net.step(x, 1, 0.05)
    v1 = _vel(L)
    assert np.array_equal(got[-1][2], v1) and v1.any()
    net.step(x, 1, 0.0)                   # no new gradient: the velocity halves
    assert np.abs(_vel(L) - 0.5 * v1).max() <= 1


@pytest.mark.parametrize('batch,mom', [(1, 0.9), (2, 0.9), (1, 0.0)])
def test_momentum_bias_only_layers_drop_their_float_scales(tmp_path, batch, mom):
    """SGD at batch 1 with momentum, or without where prepare asks ('ns': the plan over
    its limit): setup drops the float weight scales of each per-channel layer whose bias
    alone trains (its int32 bias stepped in integers; 7 KB of a MobileNetV2's bias-only
    layers, which kept bias4 + momentum off an RP2040 and, without momentum, 128x128
    w62), at batch 2 keeps them (the float bias step reads them; read again where the
    net's own setup dropped them); either way the net trains as one that kept them, bit
    for bit, and reloads its weights (best.py) after."""
    def run(keep):
        d = tmp_path / ('k' if keep else 'm')
        d.mkdir()
        g = read_model(build(str(d / 'm.tflite')))
        quant.write(g, str(d), 'last:1', quant.meta(g, 'last:1', None, SCHEMES['bias-dw-pw-half']))
        with open(d / 'q8.json') as f:
            t = json.load(f)
        if not mom:     # (without momentum where prepare asks: the plan over its limit)
            for x in t['layers']:
                x['ns'] = 1
        net = Q8Net(t, str(d / 'weights.wof'), mom)
        bias = [L for L in net.layers if L.train and L.whi <= L.wlo]
        assert len(bias) == 2 and all('bh' in L.d and L.d.get('fs') for L in bias)
        from array import array     # (the net's own setup() at batch 1 dropped them)
        sw = [net._req(L.d, array('f', [0.0] * L.d['nq']), 2) for L in bias]
        net.setup('sgd', batch, momentum=mom)
        held = [('sw' in L.d) for L in bias]
        if keep:
            for L, v in zip(bias, sw):
                L.d['sw'] = v
        for s in range(6):
            if batch == 1:
                net.step(_sample(s % 3), s % NCLS, 0.05)
            else:
                net.accum(_sample(s % 3), s % NCLS)
                if s % 2:
                    net.apply(0.05, 0.5)
        state = [bytes(L.w or b'') + bytes(L.b) + _bstate(L) + bytes(L.vw or b'') + bytes(L.vb or b'')
                 for L in net.layers if L.train]
        net.load_weights(str(d / 'weights.wof'))
        return held, state
    held, got = run(False)
    assert held == [batch > 1] * 2
    assert got == run(True)[1]


@pytest.mark.parametrize('scheme,mu', [('bias-dw-pw-half', 0.9), ('dw-quarter-pw-bias', 0.5)])
def test_momentum_velocities_follow_a_float_velocity(tmp_path, monkeypatch, scheme, mu):
    """The int16 velocities of every trained window against float SGD momentum fed the
    same per-step updates (v = mu v + d, w -= v): within the stochastic rounding's sum of
    mu^k (1 / (1 - mu) 1/256-steps) after 12 steps, and unbiased (the mean difference far
    below a step); the update each step applies is the velocity."""
    m, net = _net(tmp_path, SCHEMES[scheme], 'last:1')
    net.setup('sgd', 1, momentum=mu)
    real = net.M.vmk
    ref, seen = {}, []

    def spy(v, d, n, p):
        base = v.obj if isinstance(v, memoryview) else v
        j = (len(base) - len(v)) // 2 if isinstance(v, memoryview) else 0
        f = ref.setdefault(id(base), np.zeros(len(base) // 2))
        # (d in 1/65536 steps taken dithered to 1/256, p[4], p[5]: Q8Net._dith)
        f[j:j + n] = mu * f[j:j + n] + ((np.array(d[:n], np.int64) + p[4]) >> p[5])
        real(v, d, n, p)
        seen.append((np.array(d[:n], np.float64), np.frombuffer(bytes(v)[:2 * n], np.int16)))

    realh, halved = net.M.hk, []

    def spyh(v, n, st):         # (a weight scale doubled, utrain.q8grow: halved)
        base = v.obj if isinstance(v, memoryview) else v
        j = (len(base) - len(v)) // 2
        f = ref.setdefault(id(base), np.zeros(len(base) // 2))
        f[j:j + (n - 1) * st + 1:st] *= 0.5
        halved.append(n)
        realh(v, n, st)

    monkeypatch.setattr(net.M, 'vmk', spy)
    monkeypatch.setattr(net.M, 'hk', spyh)
    for s in range(12):
        net.step(_sample(s % 3), s % NCLS, 0.05)
    assert len(ref) == len([L for L in net.layers if L.train and L.whi > L.wlo]) >= 2
    for d, v in seen:
        assert np.array_equal(d, v)          # (what upek / upk apply)
    diffs = []
    for L in net.layers:
        if L.vw is not None and len(L.vw):
            f = ref[id(L.vw)]
            assert np.abs(f).max() < 32767
            diffs.append(_vel(L) - f)
    diff = np.concatenate(diffs)
    print(len(halved), 'halved', np.abs(diff).max())
    assert np.abs(diff).max() <= 1 / (1 - mu) and np.abs(diff).max() > 0
    assert abs(diff.mean()) < 0.2, diff.mean()


def test_int8_velocities_follow_a_float_velocity_and_resume(tmp_path, monkeypatch):
    """int8 momentum velocities (q8.json 'v8', prepare's choice where int16 ones are over
    the plan's limit: the MobileNetV2 classifier's 12.5 KB instead of 25): each step
    applies r = mu v + d exactly (the update the layer gets), and keeps r rounded
    stochastically to the layer's 2^e steps, e the least holding the largest |r| within
    127 (in the buffer's last byte).  Against float SGD-M fed the same updates: within
    the rounding's 2^e / (1 - mu) steps after 12 steps and unbiased; a checkpoint (the
    raw bytes, e with them) resumes to the same steps."""
    from utrain.q8train import Q8Trainer
    _net(tmp_path, SCHEMES['bias-dw-pw-half'])
    with open(tmp_path / 'q8.json') as f:
        t = json.load(f)
    fc = [i for i, d in enumerate(t['layers']) if d['k'] == quant.FC]
    for i in fc:
        t['layers'][i]['v8'] = 1
    with open(tmp_path / 'q8.json', 'w') as f:
        json.dump(t, f)
    monkeypatch.chdir(tmp_path)
    mu = 0.9
    # made with the net at their size, kept by setup (a second buffer made there found no
    # run long enough after the prefix pass: 229 KB against a 190 KB plan on 32-bit unix)
    net = Q8Net(t, 'weights.wof', mu)
    v0 = net.layers[fc[0]].vw
    net.setup('sgd', 1, momentum=mu)
    assert net.layers[fc[0]].vw is v0
    tr = Q8Trainer(optimizer='sgd', batch=1, momentum=mu)
    net = tr.net
    L = net.layers[fc[0]]
    n = L.whi * (L.d['wn'] // L.d['nb'])
    assert len(L.vw) == n + 1
    real = net.M.vma
    ref, gaps, es = np.zeros(n), [], []

    def spy(v, d, k, p):
        nonlocal ref
        if k == n:      # (d dithered to 1/256 steps, p[4], p[5]: Q8Net._dith)
            ref = mu * ref + ((np.array(d[:k], np.int64) + p[4]) >> p[5])
        real(v, d, k, p)
        if k == n:
            gaps.append(np.array(d[:k], np.float64) - ref)
    realsb = net.M.sb

    def spysb(v, k, st, sh):     # (a weight scale doubled, q8grow: a view, halved)
        if isinstance(v, memoryview):
            j = len(v.obj) - len(v)
            ref[j:j + (k - 1) * st + 1:st] *= 0.5
        realsb(v, k, st, sh)
    monkeypatch.setattr(net.M, 'vma', spy)
    monkeypatch.setattr(net.M, 'sb', spysb)
    for k in range(12):
        net.step(_sample(k % 3), k % NCLS, 0.05)
        es.append(L.vw[-1])
    v = np.frombuffer(bytes(L.vw[:-1]), np.int8).astype(np.float64) * 2 ** L.vw[-1]
    assert max(es) > 0 and len(gaps) == 12
    e = max(es)
    assert np.abs(ref).max() > 127      # (no int8 at e = 0 holds them: e grew)
    gap = np.concatenate(gaps)
    assert np.abs(gap).max() <= 2 ** e / (1 - mu) + 1 / (1 - mu), np.abs(gap).max()
    assert abs(gap.mean()) < 2 ** e / 8, gap.mean()
    assert np.abs(v - ref).max() <= 2 ** e / (1 - mu) + 2 ** e
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    tr.save_checkpoint('c.ckpt')
    tr2 = Q8Trainer(optimizer='sgd', batch=1, momentum=mu)
    tr2.load_checkpoint('c.ckpt')
    assert bytes(tr2.net.layers[fc[0]].vw) == bytes(L.vw)
    got = []
    for x in (tr, tr2):
        for k in range(3):
            x.net.step(_sample(k), 1, 0.05)
        got.append([bytes(M.w or b'') + bytes(M.b) + bytes(M.vw or b'') for M in x.net.layers
                    if M.train])
    assert got[0] == got[1]


def test_momentum_kernel_rounds_stochastically_and_holds_its_range():
    """q8mom.vmk (numpy, as CPython runs it) = its plain Python loop (the viper code
    under CPython) bit for bit, unbiased against float mu v + d, velocities with no new
    update decay to 0 (rounded to nearest, 0.9 * 4 stays 4), and |v| <= 32767."""
    from array import array
    from utrain import q8mom as M
    r = np.random.default_rng(3)
    n, mu = 4000, 0.9
    v0 = r.integers(-3000, 3000, n).astype(np.int16)
    v0[:200] = 32000
    v0[200:300] = r.integers(-6, 7, 100)
    d0 = r.integers(-400, 400, n).astype(np.int32)
    d0[:100] = 5000                     # past the int16 range
    d0[200:300] = 0
    out = []
    for k in (M.vmk, M.py_vmk):
        v, d = bytearray(v0.tobytes()), array('i', d0.tolist())
        p = array('i', [int(round(mu * 32768)), 777, 0, 0, 0, 0])
        k(v, d, n, p)
        out.append((bytes(v), list(d), p[1]))
    assert out[0] == out[1]
    got = np.frombuffer(out[0][0], np.int16).astype(np.float64)
    assert np.array_equal(got, out[0][1])
    exact = np.clip(mu * v0.astype(np.float64) + d0, -32767, 32767)
    assert np.abs(got - exact).max() < 1 + 1e-9 and got[:100].max() == 32767
    assert abs((got - exact)[300:].mean()) < 0.02
    v = bytearray(v0[200:300].tobytes())
    z = array('i', [0] * 100)
    p = array('i', [int(round(mu * 32768)), 5, 0, 0, 0, 0])
    for _ in range(150):
        M.vmk(v, z, 100, p)
        z = array('i', [0] * 100)
    assert not any(v)


def _data(path, n=12, seed=0):
    r = np.random.default_rng(seed)
    np.savez(path, x=r.uniform(-1, 1, (n, H0, H0, C0)).astype(np.float32),
             y=r.integers(0, NCLS, n))


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
@pytest.mark.parametrize('scheme,kw', [
    ('bias-dw-pw-half', dict()),
    ('dw-quarter-pw-bias', dict(momentum=0.9)),
    ('bias-dw-pw-half', dict(optimizer='adam', batch=3)),
    ('dw-quarter-pw-bias', dict(batch=2)),
    ('bias-dw-pw-half', dict(batch=2, momentum=0.9))])
def test_board_bytes_equal_host(tmp_path, scheme, kw):
    """A sparse int8 run on the board (unix MicroPython, viper) and on the host (CPython
    + numpy kernels) ends with the same trained.wof bytes."""
    model = build(str(tmp_path / 'm.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    outs = []
    for py in (False, True):
        d = str(tmp_path / ('py' if py else 'mp'))
        s = prepare(model, d, data=data, loss='scce', lr=0.05, epochs=1, train='last:1',
                    ranks=SCHEMES[scheme], log=lambda *a: None, **kw)
        assert s['int8'] and s['ranks']
        code, out = runner.run(d, python=py, stream=False)
        assert code == 0, out
        with open(os.path.join(d, 'trained.wof'), 'rb') as fh:
            outs.append(fh.read())
    assert outs[0] == outs[1]


MP32 = os.environ.get('UTRAIN_MP32')
needs_mp32 = pytest.mark.skipif(not (MP32 and os.path.exists(MP32)),
                                reason='$UTRAIN_MP32 names no 32-bit MicroPython build')


@needs_mp32
@pytest.mark.parametrize('scheme,kw', [
    ('bias-dw-pw-half', dict(optimizer='adam', batch=3)),
    ('dw-quarter-pw-bias', dict(batch=2, momentum=0.9))])
def test_board32_bytes_equal_host(tmp_path, monkeypatch, scheme, kw):
    """The same on a single-precision board (the 32-bit unix build, float32 as an
    RP2040's): the host simulation rounds the int8 path's float steps (Adam's masters and
    moments, float biases, gradient scales, q8.json's scales as MicroPython parses them)
    to float32 as the board does (UTRAIN_FLOAT=32, utrain.q8np.f32)."""
    monkeypatch.setenv('MICROPYTHON', MP32)
    monkeypatch.delenv('UTRAIN_FLOAT', raising=False)
    assert runner.host_float('unix') == 32 and runner.host_float('rp2040') == 32
    test_board_bytes_equal_host(tmp_path, scheme, kw)


@needs_mp32
def test_host_parses_floats_as_micropython32():
    """q8np.mp_float32 (MicroPython's float32 decimal parser on the host) against the
    32-bit build's json.loads, on texts where the nearest float32 is not what it reads."""
    from utrain.q8np import mp_float32
    r = np.random.default_rng(5)
    v = (r.uniform(0.5, 1, 400) * 2.0 ** r.integers(-30, 10, 400)).astype(np.float32)
    texts = [repr(float(x)) for x in v] + [str(x) for x in v] + [
        '%.*e' % (int(k), x) for k, x in zip(r.integers(1, 12, 400), r.uniform(-1, 1, 400) * 10.0 ** r.integers(-20, 20, 400))]
    prog = ('import json,struct,sys\nfor s in json.loads(sys.stdin.read()):\n'
            ' print(struct.pack("<f",json.loads(s)).hex())')
    out = __import__('subprocess').run([MP32, '-c', prog], input=json.dumps(texts),
                                       capture_output=True, text=True, timeout=60).stdout.split()
    assert len(out) == len(texts)
    got = [np.float32(mp_float32(t)).tobytes().hex() for t in texts]
    nearest = [np.float32(float(t)).tobytes().hex() for t in texts]
    assert got == out
    assert sum(a != b for a, b in zip(nearest, out)) > 20      # (the board's parse is not the nearest)


def test_host_float_follows_the_board_profile(tmp_path, monkeypatch):
    """run --python's float width: a board profile's 'float' (rp2040, esp32: 32); unix:
    the simulated MicroPython's (64 without one); an unknown board is refused."""
    monkeypatch.setenv('MICROPYTHON', '/nonexistent/micropython')
    monkeypatch.delenv('UTRAIN_FLOAT', raising=False)
    assert runner.host_float('rp2040') == 32 and runner.host_float('esp32') == 32
    assert runner.host_float('unix') == 64
    d = str(tmp_path)
    assert runner.command(d, board='esp32', python=True)[1]['UTRAIN_FLOAT'] == '32'
    assert runner.command(d, python=True)[1]['UTRAIN_FLOAT'] == '64'
    with pytest.raises(ValueError, match='unknown board'):
        runner.command(d, board='nope', python=True)


def test_plan_prices_masks_chunks_and_windows(tmp_path):
    """The plan of a sparse scheme: masks of 1 bit an output, a gradient chunk instead of
    weight-sized sums at batch 1, optimizer state for a rank's window only; a bias-only
    layer's output freed from the arena."""
    g = read_model(build(str(tmp_path / 'm.tflite')))
    s = {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0}
    full = quant.planned(g, s, 'last:5')[2]
    sparse = quant.planned(g, s, 'last:1', ranks=SCHEMES['bias-dw-pw-half'])
    m, heap = sparse[0], sparse[2]
    masked = [d['nout'] for d in m['layers'] if d.get('mask')]
    assert len(masked) == 2            # the bias-only conv's output (1024 values), the pointwise's
    from host_tools.plan.memory import target
    t = target(None)
    w, blk = t['word'], t['block']
    assert heap['parts']['output masks (1 bit an output)'] == sum(
        -(-4 * w // blk) * blk + -(-(n // 8) // blk) * blk for n in masked)
    assert heap['total'] < full['total']
    assert m['arena'] < quant.planned(g, s, 'last:5')[0]['arena']
    mom = quant.planned(g, dict(s, momentum=0.9), 'last:1', ranks=SCHEMES['bias-dw-pw-half'])[2]
    # plain SGD: an int8 fraction per weight of the pointwise conv's window (the FC's
    # updates round stochastically); momentum: beside them an int16 per trained weight
    # (the pointwise conv's window, the FC: utrain.q8mom) + an int32 or float a bias
    pw = m['layers'][2]
    assert pw.get('wf') and not m['layers'][4].get('wf')
    win = (pw['tw'][1] - pw['tw'][0]) * (pw['wn'] // pw['nb'])
    arr = lambda n: -(-4 * w // blk) * blk + -(-n // blk) * blk     # noqa: E731
    assert heap['parts']['optimizer state'] == arr(win)
    assert mom['parts']['optimizer state'] == arr(win)
    tr = [d for d in m['layers'] if d.get('train')]
    assert len(tr) == 4 and "momentum's velocities" not in heap['parts']
    assert mom['parts']["momentum's velocities"] == sum(arr(4 * d['nb']) for d in tr) + arr(
        2 * win) + arr(2 * NCLS * C2) + 2 * arr(0)


def _model_and_classes(tmp_path, n, monkeypatch=None):
    """The test model and an .npz of n samples whose class shows in their channels.
    With monkeypatch: a verified mean on one partition of the n samples (VALIDATIONS = n,
    not 360: 9 partitions of 40, 45 int8 trials a finalist, most of these tests' time);
    the tests here check how int8 candidates are priced and trained, not the number of
    validations, which test_select's test_a_small_proxy_verifies_on_as_many_validations_
    as_a_large_one checks."""
    if monkeypatch is not None:
        from host_tools.prepare import select as sl
        monkeypatch.setattr(sl, 'VALIDATIONS', n)
    model = build(str(tmp_path / 'm.tflite'))
    r = np.random.default_rng(1)
    y = r.integers(0, NCLS, n)
    x = r.uniform(-0.3, 0.3, (n, H0, H0, C0)) + (y[:, None, None, None] % 3 == np.arange(3)) * 0.6
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=x.astype(np.float32), y=y)
    return model, data


def test_int8_selection_keeps_to_what_the_boards_flash_holds(tmp_path, monkeypatch):
    """--select auto --board on an int8 model: a candidate whose checkpoints the board's
    flash cannot hold beside the samples and the model does not fit (Q8Pricer.fits: the
    flash pass prepare_q8 runs after the choice).  A board whose flash holds the
    classifier-only run's files and writes and not a block more: the choice fits it and
    prepare succeeds (it had chosen more and then been refused for the flash)."""
    model, data = _model_and_classes(tmp_path, 60, monkeypatch)
    seen = []
    real, profs = runner.flash_advice, runner.boards()
    monkeypatch.setattr(runner, 'flash_advice', lambda *a: seen.append(a) or real(*a))
    kw = dict(data=data, loss='scce', lr=0.05, epochs=1, board='rp2040', log=lambda *a: None)
    prepare(model, str(tmp_path / 'c'), train='none', ranks='4:all', **kw)
    _, total, _, _, _, _, writes = seen[-1]
    p = {k: dict(v) for k, v in profs.items()}
    p['rp2040']['flash_fs'] = '%dK' % ((total + writes[0]) // 1024)   # (not a block more)
    monkeypatch.setattr(runner, 'boards', lambda: p)
    sm = prepare(model, str(tmp_path / 'o'), select='auto', **kw)
    assert sm['int8'] and sm['select']['ranks'].get('4') == 'all', sm['select']
    # the pricer: a candidate the flash check refuses does not fit, whatever its heap
    from host_tools.prepare.select import Q8Pricer
    asked = []

    def flash(writes):
        layers, table = writes
        asked.append(sum(1 for d in layers if d.get('train')))
        return 'over the flash' if asked[-1] > 1 else None
    pr = Q8Pricer(model, {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0},
                  dict(board='rp2040', flash=flash))
    assert pr.fits({4: 0}, None) and not pr.fits({4: 0, 2: 0}, None) and asked == [1, 2]


def test_select_auto_on_int8_chooses_as_int8(tmp_path, monkeypatch):
    """--select auto on an int8 model: contribution analysis with int8 trials, each
    candidate priced by the int8 planner; the choice fits the budget and trains as int8
    (its ranks in q8.json); --select board says what it cannot take."""
    from host_tools.prepare.pipeline import PrepareError
    from host_tools.prepare.select import Q8Pricer
    model, data = _model_and_classes(tmp_path, 60, monkeypatch)
    s = {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0}
    pr = Q8Pricer(model, s)
    lo, hi = pr.price({4: 0})['heap'], pr.price({4: 0, 2: 0, 1: 0, 0: 0})['heap']
    budget = (lo + hi) // 2
    out = str(tmp_path / 'o')
    sm = prepare(model, out, data=data, loss='scce', lr=0.05, epochs=1, select='auto',
                 budget=budget, log=lambda *a: None)
    assert sm['int8'] and sm['select']['ranks']['4'] == 'all'
    assert sm['heap']['total'] <= budget
    chosen = {int(k): v for k, v in sm['select']['ranks'].items()}
    with open(os.path.join(out, 'train.json')) as f:      # (the table the run trains:
        table = json.load(f)['files']['model']              # q8t.json beside a --cache)
    with open(os.path.join(out, table)) as f:
        ls = {d['op']: d for d in json.load(f)['layers'] if 'op' in d}
    for op, rank in chosen.items():
        assert ls[op]['train'] == 1
        assert ls[op].get('tw') == ([0, 0] if rank == 'bias' else ls[op].get('tw'))
    # --select board trains as int8 (test_q8_board), but not without the proxy data the
    # int8 trials need, nor with --cache: refused, saying why and the commands that work
    # (and nothing written)
    for kw, why in ((dict(data=data, cache=True), '--cache'), ({}, 'no --data')):
        with pytest.raises(PrepareError) as e:
            prepare(model, str(tmp_path / 'b'), loss='scce', select='board', board='rp2040',
                    log=lambda *a: None, **kw)
        msg = str(e.value)
        assert msg.startswith(model + ': --select board on an int8 model trained as int8 '
                              f'does not take {why}')
        d = data if kw else 'FILE'
        assert f'`--select auto --data {d}' in msg and '`--dequantize`' in msg
        assert not os.path.exists(os.path.join(str(tmp_path / 'b'), 'q8.json'))
    # ... and what it says works: --dequantize keeps --select board (the float path)
    sb = prepare(model, str(tmp_path / 'f'), data=data, loss='scce', lr=0.05, epochs=1,
                 select='board', dequantize=True, budget=4 * budget, log=lambda *a: None)
    assert not sb.get('int8') and 'select' in sb


def test_select_on_int8_prices_with_the_cache_prepare_chooses(tmp_path, monkeypatch):
    """Issue 29 (a held-out int8 MobileNetV2 on rp2040: --select auto said "nothing fits,
    not even the classifier" and then prepare chose --cache, under which it fits): where
    the classifier fits only with --cache, the candidates are priced with it, prepare says
    so and the choice trains with it within the budget."""
    from host_tools.prepare.select import Q8Pricer
    model, data = _model_and_classes(tmp_path, 40, monkeypatch)
    s = {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0}
    plain = Q8Pricer(model, s).price({4: 0})['heap']
    cached = Q8Pricer(model, s, {'cache': True}).price({4: 0})['heap']
    assert cached < plain
    budget = (plain + cached) // 2
    lines = []
    sm = prepare(model, str(tmp_path / 'o'), data=data, loss='scce', lr=0.05, epochs=1,
                 select='auto', budget=budget, log=lines.append)
    assert any('select auto: with --cache (prepare chooses it below) the classifier fits'
               in ln for ln in lines), lines
    assert not any('nothing fits' in ln for ln in lines), lines
    assert sm['int8'] and sm['select']['ranks']['4'] == 'all'
    assert sm['heap']['total'] <= budget
    assert os.path.exists(tmp_path / 'o' / 'q8t.json')       # the board's prefix cache


def test_select_board_that_cannot_score_chooses_with_the_cache(tmp_path, monkeypatch):
    """Issue 29 (--select board on the int8 MobileNetV2-0.35 tail at 256K chose op 62 at
    1/4, 0.630, where op 62 at 1/2 tests 0.702: priced without the prefix cache it plans
    258 KB, 234 with it, and was never tried): where the board's scoring pass does not
    fit beside any configuration but the classifier, the board does not score, so the
    host chooses again as --select auto does, priced with the cache, says so, and the
    choice (one that fits only with the cache) trains with it within the budget."""
    from host_tools.prepare.select import Q8Pricer
    model, data = _model_and_classes(tmp_path, 40, monkeypatch)
    s = {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0}
    plain, cached = Q8Pricer(model, s), Q8Pricer(model, s, {'cache': True})
    two = {4: 0, 2: 0}
    # (between the classifier's plain plan and the two layers': those fit only with the
    # cache, the classifier without it)
    budget = (plain.price({4: 0})['heap'] + plain.price(two)['heap']) // 2
    assert cached.price(two)['heap'] <= budget
    assert plain.price({4: 0}, True)['heap'] > budget        # (the board cannot score)
    lines = []
    sm = prepare(model, str(tmp_path / 'o'), data=data, loss='scce', lr=0.05, epochs=1,
                 select='board', budget=budget, log=lines.append)
    assert any('the board does not score; chosen again with --cache' in ln for ln in lines), lines
    assert sm['int8'] and 'samples' not in sm['select']
    ranks = {int(k): v for k, v in sm['select']['ranks'].items()}
    assert ranks == {4: 'all', 2: 'all'}, ranks
    assert plain.price({i: 0 for i in ranks})['heap'] > budget >= sm['heap']['total']
    assert os.path.exists(tmp_path / 'o' / 'q8t.json')       # the board's prefix cache


def test_int8_candidates_fit_with_the_cache_prepare_chooses_for_them(tmp_path, monkeypatch):
    """Session 29 (the held-out int8 wine MLP at 116 KB: 1:1/2 plans 122 KB, 116 with the
    cache prepare --ranks chose for it, and was never a candidate): where the classifier
    fits without --cache, a candidate fits where it does with it (as the float path's
    memory options, session 28), and not under the board's scoring pass.  The pricer
    --select auto chooses with, caught before its trials."""
    from host_tools.prepare import select as sl
    model, data = _model_and_classes(tmp_path, 40)
    s = {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0}
    plain, cached = sl.Q8Pricer(model, s), sl.Q8Pricer(model, s, {'cache': True})
    two = {4: 0, 2: 0}
    budget = (plain.price({4: 0})['heap'] + plain.price(two)['heap']) // 2
    assert cached.price(two)['heap'] <= budget < plain.price(two)['heap']
    got = []

    def caught(*a, pricer=None, **kw):
        got.append(pricer)
        raise KeyboardInterrupt     # (no trials)
    monkeypatch.setattr(sl, 'choose_auto', caught)
    with pytest.raises(KeyboardInterrupt):
        prepare(model, str(tmp_path / 'o'), data=data, loss='scce', lr=0.05, epochs=1,
                select='auto', budget=budget, log=lambda *a: None)
    limit = lambda h: budget        # noqa: E731
    assert got[0].fits({4: 0}, limit) and got[0].fits(two, limit)
    assert not got[0].fits(two, limit, fisher=True)


def test_select_board_that_cannot_score_keeps_a_choice_the_cache_would_freeze(tmp_path,
                                                                             monkeypatch):
    """Session 29 (the int8 wine MLP at 116 KB, --select board: the host's best, 0:1/4 and
    the classifier, 0.917, left no room for the board's scoring pass; chosen again priced
    with the cache alone, which freezes op 0, the classifier alone trained, 0.648): the
    host's choice stands, priced with the cache only where it needs it.  The selection
    stubbed (no trials): it takes ranks R wherever its pricer says R fits."""
    from host_tools.prepare import select as sl
    model, data = _model_and_classes(tmp_path, 40)
    s = {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0}
    R = {0: 0, 4: 0}
    plain, cached = sl.Q8Pricer(model, s), sl.Q8Pricer(model, s, {'cache': True})
    budget = plain.price(R)['heap'] + 1024
    assert not cached.fits(R, lambda h: budget)

    def stub(*a, pricer=None, **kw):
        r = R if pricer.fits(R, lambda h: budget) else {4: 0}
        return {'ranks': r, 'score': 0.9, 'classifier_only': 0.5, 'measured_gain': 0.4,
                'predicted_gain': 0.4, 'price': pricer.price(r), 'runners_up': [],
                'bias_gain': [], 'weight_gain': {}, 'tried': [], 'trials': 0,
                'cached_trials': 0}
    monkeypatch.setattr(sl, 'choose_auto', stub)
    monkeypatch.setattr(sl, '_q8_short_list', lambda *a, **kw: None)   # (cannot score)
    sm = prepare(model, str(tmp_path / 'o'), data=data, loss='scce', lr=0.05, epochs=1,
                 select='board', budget=budget, log=lambda *a: None)
    assert {int(k): v for k, v in sm['select']['ranks'].items()} == {0: 'all', 4: 'all'}
    assert not os.path.exists(tmp_path / 'o' / 'q8t.json')      # (no prefix cache)


def _small_scratch(monkeypatch):
    """Plans with a 64-byte weight scratch: the pointwise conv's 128 weights stream."""
    d = list(quant.plan.__defaults__)
    d[1] = 64
    monkeypatch.setattr(quant.plan, '__defaults__', tuple(d))


def test_streamed_input_gradient_equals_held(tmp_path, monkeypatch):
    """A layer whose weights do not train and exceed the weight scratch is read a chunk of
    output channels at a time for its input gradient too (not held in RAM): the same
    integers as with its weights held."""
    outs = []
    for small in (False, True):
        if small:
            _small_scratch(monkeypatch)
        d = tmp_path / str(small)
        d.mkdir()
        m, net = _net(d, SCHEMES['dw-quarter-pw-bias'])
        L = net.layers[2]
        assert bool(m['layers'][2].get('sd')) == small and (L.w is None) == small
        if small:       # (its gradient a MEAN's row: its dz made a chunk at a time)
            assert len(net.dz) < L.nout
        for s in range(2):
            net.step(_sample(s), 3, 0.05)
        outs.append([bytes(L.b) + _bstate(L) for L in net.layers if L.train]
                    + [bytes(L.w) for L in net.layers if L.train and L.whi > L.wlo])
    assert outs[0] == outs[1]
    # a layer whose weights train (the pointwise conv at 1/2) keeps them in RAM
    m, net = _net(tmp_path / 'True', SCHEMES['bias-dw-pw-half'])
    assert not m['layers'][2].get('sd') and net.layers[2].w is not None


def _outputs_and_trained(net, n=3):
    """The outputs of n samples' forward passes, each before its step, and the trained
    bytes after them."""
    ys = []
    for s in range(n):
        ys.append(bytes(net.forward(_sample(s))))
        net.step(_sample(s), 3, 0.05)
    return ys + [bytes(L.b) + _bstate(L) for L in net.layers if L.train] + [
        bytes(L.w) for L in net.layers if L.train and L.whi > L.wlo]


def test_streamed_wide_chunks_equal_the_scratch_chunks(tmp_path, monkeypatch):
    """A streamed layer reads more output channels a chunk into a free input-gradient
    buffer (Q8Net.wide: its forward pass's weights, biases and multipliers; its input
    gradient's weights past the gradient being made): the same outputs and trained bytes
    as the weight scratch's chunks, in fewer chunks."""
    _small_scratch(monkeypatch)
    real, gbs = Q8Net.wide, Q8Net._gbs
    from utrain import q8sparse as S
    flk, shared = S.flk, []

    def spy_flk(dz, m, P):      # (the channels whose rows' shared part is taken once)
        flk(dz, m, P)
        shared.append(sum(1 for j in range(m) if dz[P * m + j]))
    monkeypatch.setattr(S, 'flk', spy_flk)
    # (input-gradient buffers twice as long: room past the pointwise conv's own input
    # gradient for its weights, as MobileNetV2's head has)
    monkeypatch.setattr(Q8Net, '_gbs', lambda self, m: gbs(self, 2 * m))
    outs = []
    for wide in (False, True):
        got = []

        def spy(self, *a):     # (at most 12 channels: two chunks, 12 + 4)
            got.append(min(real(self, *a), 12) if wide else 0)
            return got[-1]
        monkeypatch.setattr(Q8Net, 'wide', spy)
        d = tmp_path / str(wide)
        d.mkdir()
        m, net = _net(d, SCHEMES['dw-quarter-pw-bias'])
        L = net.layers[2]
        assert L.w is None          # (streamed)
        net.dz = bytearray(L.nout)  # (and a dz for all its channels, as MobileNetV2's is)
        outs.append(_outputs_and_trained(net))
        if wide:    # the forward's chunks (two passes a sample) and the input gradient's
            assert len([v for v in got if v > m['layers'][2]['nc']]) == 3 * 3, got
    assert outs[0] == outs[1]
    assert shared and sum(shared) > 0, shared   # (the wide run's chunks: some taken once)


def test_streamed_output_into_a_mean_in_the_gradient_buffer(tmp_path, monkeypatch):
    """A streamed conv whose output only a broadcasting MEAN reads (MobileNet's 1x1 head
    into its global pool: 20 KB of arena at 128x128) writes it in the input-gradient
    buffer, idle in a forward pass (quant.plan alias, 'yg'), not in the arena: a smaller
    arena, the same outputs and trained bytes as in the arena; the forward's weight chunks
    then stay in the scratch (Q8Net.wide's buffer is that one)."""
    _small_scratch(monkeypatch)
    real, gbs = Q8Net.wide, Q8Net._gbs      # (room for wide chunks of 12 + 4 channels, as
    monkeypatch.setattr(Q8Net, '_gbs', lambda self, m: gbs(self, 2 * m))   # in the test above)
    monkeypatch.setattr(Q8Net, 'wide', lambda self, *a: min(real(self, *a), 12))
    g = read_model(build(str(tmp_path / 'm.tflite')))
    outs, arena = [], []
    for alias in (False, True):
        d = tmp_path / str(alias)
        d.mkdir()
        m = quant.write(g, str(d), 'last:1', quant.meta(g, 'last:1', None,
                                                         SCHEMES['dw-quarter-pw-bias'], alias))
        assert bool(m['layers'][2].get('yg')) == alias and not m['layers'][1].get('yg')
        with open(d / 'q8.json') as f:
            net = Q8Net(json.load(f), str(d / 'weights.wof'))
        L = net.layers[2]
        assert L.w is None and (L.y.obj is net.gb[0]) == alias
        arena.append(len(net.arena))
        outs.append(_outputs_and_trained(net))
    assert outs[0] == outs[1]
    assert arena[1] <= arena[0] - H0 * H0 * C2, arena
    # the board's scoring pass reads that output in its backward pass: no alias under it
    s = dict(loss='scce', optimizer='sgd', lr=0.05, batch=1, epochs=1)
    for sel, want in ((None, 1), (True, None)):
        m, _, _ = quant.planned(g, dict(s, select=sel) if sel else s, 'none', False, 0, None,
                                SCHEMES['dw-quarter-pw-bias'])
        assert m['layers'][2].get('yg') == want
    # under a budget or board, only where the plan does not fit without it (the forward's
    # smaller chunks cost time)
    data = str(tmp_path / 'd.npz')
    _data(data)
    for budget, want in ((None, 1), ('4M', None)):
        d = str(tmp_path / str(budget))
        prepare(str(tmp_path / 'm.tflite'), d, data=data, loss='scce', lr=0.05, epochs=1,
                train='last:1', ranks=SCHEMES['dw-quarter-pw-bias'], budget=budget,
                log=lambda *a: None)
        with open(os.path.join(d, 'q8.json')) as f:
            assert json.load(f)['layers'][2].get('yg') == want


def test_unaliased_where_free_state_drops_fit(tmp_path, monkeypatch):
    """The alias ('yg') costs time (the streamed conv's forward in the scratch's smaller
    chunks: MobileNetV2 w62 on a Pico 322 ms a sample against 288), dropping the float
    scales no step reads ('ns') nothing (the same integers): under a limit the unaliased
    run with 'ns' is taken where it fits, the alias only where it does not."""
    _small_scratch(monkeypatch)
    g = read_model(build(str(tmp_path / 'm.tflite')))
    s = dict(loss='scce', optimizer='sgd', lr=0.05, batch=1, epochs=1, momentum=0)
    ranks = SCHEMES['dw-quarter-pw-bias']

    def pick(lim):
        m, t, h = quant.planned(g, s, 'last:1', False, 0, None, ranks)
        assert m['layers'][2].get('yg'), m['layers'][2]
        return h, quant.unaliased_if_it_fits(g, s, 'last:1', False, 0, None, lambda h: lim,
                                             m, t, h, ranks)
    h0 = quant.planned(g, s, 'last:1', False, 0, None, ranks, False)[2]['total']
    ha, (m, _, h) = pick(h0 - 1)       # (over by a byte: the alias fits, so does 'ns')
    assert ha['total'] <= h0 - 1
    assert not m['layers'][2].get('yg') and h['total'] <= h0 - 1, h
    assert [bool(d.get('ns')) for d in m['layers']] == [True, False, True, False, False]
    ha, (m, _, h) = pick(h['total'] - 1)    # ('ns' not enough: the alias)
    assert m['layers'][2].get('yg') and h is ha and not any(d.get('ns') for d in m['layers'])


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_board_bytes_equal_host_streamed(tmp_path, monkeypatch):
    """The same, streamed, on the board and the host."""
    _small_scratch(monkeypatch)
    test_board_bytes_equal_host(tmp_path, 'dw-quarter-pw-bias', {})


# train.py's run with the streamed layer's chunk sizes printed (Q8Net.wide's calls: in
# Layer.conv, the channels a forward chunk takes at per bytes a channel; in q8sparse.dxch,
# the input gradient's, a third call made only where dx is summed in the weight scratch)
_WIDE = """import gc
gc.threshold(2048)
from utrain import q8, q8sparse as S
_conv, _wide, _dxch = q8.Layer.conv, q8.Q8Net.wide, S.dxch
at = []
def conv(self, x, gm, y):
    at.append(self.w is None)
    _conv(self, x, gm, y)
    if at[0]:
        print('CONV', ' '.join([str(v) for v in at[1:]]))
    at.clear()
def wide(self, a, per, cap, nc):
    r = _wide(self, a, per, cap, nc)
    if at and at[0]:
        at.append((per, nc, r))
    return r
def dxch(*a):
    at.append(True)
    _dxch(*a)
    print('DXCH', ' '.join([str(v) for v in at[1:]]))
    at.clear()
q8.Layer.conv, q8.Q8Net.wide, S.dxch = conv, wide, dxch
from utrain.run import start
start()
"""


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_board_wide_chunks_in_the_weight_scratch_equal_host(tmp_path, monkeypatch):
    """The viper (and assembler) kernels' two chunk layouts of a streamed pointwise conv
    fed a MEAN's row (MobileNetV2's 1x1 head): in its forward pass a chunk's biases,
    multipliers and shifts in the idle weight scratch, the weights alone in the idle
    input-gradient buffer; in its input gradient, the gradient summed in the weight
    scratch, the whole gradient buffer taking weights. Rows of 32 weights (more than the
    12 bytes a channel of biases, multipliers and shifts) and an input gradient of 2x2x32
    (within a 1536-byte scratch; the conv's 2 KB of weights are not): both layouts taken
    on the board (unix MicroPython), the same trained.wof as on the host (CPython, where
    neither exists)."""
    d = list(quant.plan.__defaults__)
    d[1], d[2] = 1536, 384      # (weight scratch, sums: 96 channels of 2x2 sums)
    monkeypatch.setattr(quant.plan, '__defaults__', tuple(d))
    model = build(str(tmp_path / 'm.tflite'), dims=(4, 3, 32, 64), ds=2)
    r = np.random.default_rng(0)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=r.uniform(-1, 1, (6, 4, 4, 3)).astype(np.float32),
             y=r.integers(0, NCLS, 6))
    outs = []
    for py in (False, True):
        out = str(tmp_path / ('py' if py else 'mp'))
        # (a budget: the conv's output in the arena, not the gradient buffer, 'yg')
        prepare(model, out, data=data, loss='scce', lr=0.05, epochs=1, train='last:1',
                ranks=SCHEMES['dw-quarter-pw-bias'], budget='4M', log=lambda *a: None)
        with open(os.path.join(out, 'q8.json')) as f:
            pw = json.load(f)['layers'][2]
        assert pw.get('sd') and pw['nc'] == 48 and not pw.get('yg'), pw
        if py:
            code, log = runner.run(out, python=True, stream=False)
            assert code == 0, log
        else:
            import subprocess
            with open(os.path.join(out, 'wide.py'), 'w') as f:
                f.write(_WIDE)
            argv, env = runner.command(out)
            argv[-1] = 'wide.py'
            p = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True,
                               stdin=subprocess.PIPE, timeout=300)
            text = p.stdout
            assert p.returncode == 0 and 'utrain: end: ok' in text, text + p.stderr
        with open(os.path.join(out, 'trained.wof'), 'rb') as fh:
            outs.append(fh.read())
    assert outs[0] == outs[1]
    lines = text.splitlines()
    # forward: 63 channels a chunk at the 32 weight bytes alone (46 at 32 + 12: no more
    # than the scratch's 48, so the scratch's chunks)
    conv = [ln for ln in lines if ln.startswith('CONV ')]
    assert conv and all(ln == 'CONV (32, 48, 63)' for ln in conv), lines
    assert len(conv) == 6, lines      # (one forward pass a sample)
    # input gradient: none past dx in the gradient buffer (47 <= 48), 63 with all of it
    dx = [ln for ln in lines if ln.startswith('DXCH ')]
    assert len(dx) == 6 and all(ln == 'DXCH (32, 48, 0) (32, 48, 63) (32, 48, 63)'
                                for ln in dx), dx


def build_res(path, seed=0):
    """conv 3x3 RELU6 (8) -> [expand 1x1 RELU6 (16) -> depthwise 3x3 RELU6 -> project 1x1
    (8)] + the conv's output (ADD) -> MEAN -> FC: a MobileNetV2 block, int8."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa

    def layer(kind, x, sx, O, I, y, sy, k, act):
        fan = I if kind == 'fc' else k * k * (1 if kind == 'dw' else I)
        sw = rng.uniform(0.7, 1.3, O) * 30 * sy / (fan ** 0.5 * 40 * sx * 73)
        shape = {'fc': (O, I), 'conv': (O, k, k, I), 'dw': (1, k, k, O)}[kind]
        w = b.tensor(f'w{y}', shape, data=rng.integers(-127, 128, shape).astype(np.int8),
                     quant={'scale': list(sw), 'zero_point': [0] * O,
                            'quantized_dimension': 3 if kind == 'dw' else 0})
        bt = b.tensor(f'b{y}', [O], data=rng.integers(-300, 300, O).astype(np.int32),
                      quant={'scale': list(sx * sw), 'zero_point': [0] * O})
        name = {'fc': 'FULLY_CONNECTED', 'conv': 'CONV_2D', 'dw': 'DEPTHWISE_CONV_2D'}[kind]
        opts = {} if kind == 'fc' else dict(padding='SAME', stride_w=1, stride_h=1)
        if kind == 'dw':
            opts['depth_multiplier'] = 1
        b.op(name, [x, w, bt], [y], fused_activation_function=act, **opts)

    sx, s0, se, sd, sp, sa, sm, sy = 0.02, 0.03, 0.03, 0.04, 0.03, 0.04, 0.04, 0.08
    x = b.tensor('x', [1, H0, H0, C0], dtype='int8', quant=q(sx, 3))
    c0 = b.tensor('c0', [1, H0, H0, C1], dtype='int8', quant=q(s0, -128))
    layer('conv', x, sx, C1, C0, c0, s0, 3, 'RELU6')
    e = b.tensor('e', [1, H0, H0, C2], dtype='int8', quant=q(se, -128))
    layer('conv', c0, s0, C2, C1, e, se, 1, 'RELU6')
    d = b.tensor('d', [1, H0, H0, C2], dtype='int8', quant=q(sd, -128))
    layer('dw', e, se, C2, C2, d, sd, 3, 'RELU6')
    p = b.tensor('p', [1, H0, H0, C1], dtype='int8', quant=q(sp, 2))
    layer('conv', d, sd, C1, C2, p, sp, 1, 'NONE')
    a = b.tensor('a', [1, H0, H0, C1], dtype='int8', quant=q(sa, -20))
    b.op('ADD', [c0, p], [a], fused_activation_function='NONE')
    m = b.tensor('m', [1, C1], dtype='int8', quant=q(sm, -20))
    b.op('MEAN', [a, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m],
         keep_dims=False)
    y = b.tensor('y', [1, NCLS], dtype='int8', quant=q(sy, -2))
    layer('fc', m, sm, NCLS, C1, y, sy, 1, 'NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return path


def _ref_graph(net, m, xq, label):
    """As _ref over a graph (a residual ADD: its gradient to both inputs, summed where a
    tensor has two readers), from the int8 outputs of one forward pass."""
    L, D = net.layers, m['layers']
    q8 = lambda b: np.frombuffer(bytes(b), np.int8).astype(np.float64)  # noqa
    t = {m['xin']: bytes(xq)}
    for l, d in zip(L, D):
        ins = [t[k] for k in d['in']]
        t[d['out']] = bytes(l.forward(bytearray(ins[0]), *[bytearray(v) for v in ins[1:]]))
    scale = {m['xin']: (m['sx'], m['zx'])}
    scale.update({d['out']: (d['sy'], d['zy']) for d in D})
    act = {k: (q8(v) - scale[k][1]) * scale[k][0] for k, v in t.items()}
    lg = act[D[-1]['out']]
    p = np.exp(lg - lg.max())
    gy = {D[-1]['out']: p / p.sum() - np.eye(len(p))[label]}
    grads = {}
    for i in range(len(L) - 1, -1, -1):
        l, d = L[i], D[i]
        dy = gy.pop(d['out'])
        add = lambda k, v: gy.__setitem__(k, gy.get(k, 0) + v)  # noqa
        if l.k == quant.MEAN:
            add(d['in'][0], np.tile(dy / d['n'], d['n']))
            continue
        yq = q8(t[d['out']])
        dz = dy * ((yq > l.lo) & (yq < l.hi))
        if l.k == quant.ADD:
            add(d['in'][0], dz)
            add(d['in'][1], dz)
            continue
        xin = act[d['in'][0]]
        sw = np.array(d['sw'])
        wq = q8(l.w)
        if l.k == quant.FC:
            grads[i] = (np.outer(dz, xin), dz)
            add(d['in'][0], (wq.reshape(l.nout, -1) * sw[:, None]).T @ dz)
            continue
        H, Wd, I, O, KH, KW, sh, sw_, ph, pw, OH, OW = d['g'][:12]
        X, Z = xin.reshape(H, Wd, I), dz.reshape(OH, OW, O)
        conv = l.k == quant.CONV
        Wf = wq.reshape(O, KH, KW, I) * sw[:, None, None, None] if conv else \
            wq.reshape(KH, KW, O) * sw
        dX = np.zeros_like(X)
        for oy, ox, ky, kx, iy, ix in _np_conv_taps(H, Wd, KH, KW, sh, sw_, ph, pw, OH, OW):
            dX[iy, ix] += Z[oy, ox] @ Wf[:, ky, kx, :] if conv else Z[oy, ox] * Wf[ky, kx]
        grads[i] = (None, Z.sum((0, 1)))
        add(d['in'][0], dX.ravel())
    return grads


def test_split_table_lists_the_file_sizes_flat(tmp_path):
    """A split model's trained table (q8t.json, --cache) lists the .wof's tensor sizes
    as one flat list (tensor, bytes, ...), which Q8Net checks the file's header with, as
    it does an older table's pairs; a wrong size is refused."""
    from utrain.wof import FormatError
    g = read_model(build(str(tmp_path / 'm.tflite')))
    m = quant.meta(g, 'last:1', None, {1: BIAS, 2: HALF})
    pre, post = quant.split(g, m)
    quant.write(g, str(tmp_path), 'last:1', m, {'q8.json': pre, 'q8t.json': post})
    with open(tmp_path / 'q8t.json') as f:
        t = json.load(f)
    ws, wof = t['wsizes'], str(tmp_path / 'weights.wof')
    assert all(type(v) is int for v in ws) and len(ws) == 4 * sum('wt' in d for d in m['layers'])
    Q8Net(t, wof).close()
    Q8Net(dict(t, wsizes=[ws[j:j + 2] for j in range(0, len(ws), 2)]), wof).close()
    with pytest.raises(FormatError):
        Q8Net(dict(t, wsizes=ws[:-1] + [ws[-1] + 4]), wof)


def test_residual_add_passes_the_gradient_to_both_inputs(tmp_path):
    """Biases of every layer of a MobileNetV2 block and of the conv before it (the ADD's
    two readers of that conv's output: its gradient is the branch's plus the residual's)
    and the classifier: the float bias steps against the fake-quantized float model's
    gradient over the graph."""
    g = read_model(build_res(str(tmp_path / 'r.tflite')))
    ranks = {0: BIAS, 1: BIAS, 2: BIAS, 3: BIAS}
    m = quant.write(g, str(tmp_path), 'last:1', quant.meta(g, 'last:1', None, ranks))
    assert [d['k'] for d in m['layers']] == [quant.CONV, quant.CONV, quant.DW, quant.CONV,
                                             quant.ADD, quant.MEAN, quant.FC]
    assert m['layers'][4].get('mask') and m['layers'][4].get('back')
    with open(tmp_path / 'q8.json') as f:
        net = Q8Net(json.load(f), str(tmp_path / 'weights.wof'))
    L = net.layers
    errs = []
    for step in range(3):
        xq = _sample(step)
        want = _ref_graph(net, m, xq, step % NCLS)
        bf0 = {i: _held(L[i]) for i in want}
        net.step(xq, step % NCLS, 0.02)
        for i, (_, gb) in want.items():
            errs.append((step, i, _rel(_held(L[i]) - bf0[i], -0.02 * gb)))
    assert max(e for *_, e in errs) < 0.06, errs
    # without the residual's share the conv below the block is far off
    assert all(e < 0.06 for s, i, e in errs if i == 0)


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_residual_board_bytes_equal_host(tmp_path):
    """The residual block's biases and the expand conv at 1/2 with momentum, on the board
    (viper) and the host: the same trained.wof."""
    model = build_res(str(tmp_path / 'r.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    outs = []
    for py in (False, True):
        d = str(tmp_path / ('py' if py else 'mp'))
        prepare(model, d, data=data, loss='scce', lr=0.05, epochs=1, train='last:1',
                ranks={0: BIAS, 1: HALF, 2: BIAS, 3: BIAS}, momentum=0.9, log=lambda *a: None)
        code, out = runner.run(d, python=py, stream=False)
        assert code == 0, out
        with open(os.path.join(d, 'trained.wof'), 'rb') as fh:
            outs.append(fh.read())
    assert outs[0] == outs[1]


def test_dscnn_sparse_run_export_end_to_end(tmp_path):
    """The Keras DS-CNN, int8: its classifier, the last pointwise conv at 1/2 and the
    biases of the two layers below it trained as int8 (prepare, run, export); the
    exported model keeps every scale and layout, changes only what trained (the pointwise
    conv's other half and the bias-only layers' weights as they were), and TFLite Micro's
    logits on it are the trained net's."""
    from host_tools.prepare.pipeline import export
    from test_q8 import DSCNN, _cut_softmax
    from tflite_micro.python.tflite_micro import runtime
    z = np.load(DSCNN.replace('_int8.tflite', '_data.npz'))
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=z['x'][:24], y=z['y'][:24])
    out = str(tmp_path / 'o')
    s = prepare(DSCNN, out, data=data, loss='scce', lr=0.05, epochs=1, train='last:2',
                ranks='8:1/2,7:bias,6:bias', log=lambda *a: None)
    assert s['int8'] and s['ranks']
    code, log = runner.run(out, python=True, stream=False)
    assert code == 0, log
    dst = str(tmp_path / 'trained.tflite')
    export(DSCNN, os.path.join(out, 'trained.wof'), dst)
    g0, g1 = read_model(DSCNN), read_model(dst)
    ops = {op.index: op for op in g0.ops}
    w8, b7, w7 = ops[8].inputs[1], ops[7].inputs[2], ops[7].inputs[1]
    a0, a1 = g0.tensors[w8].data, g1.tensors[w8].data
    assert np.array_equal(a0[32:], a1[32:]) and not np.array_equal(a0[:32], a1[:32])
    assert np.array_equal(g0.tensors[w7].data, g1.tensors[w7].data)
    assert not np.array_equal(g0.tensors[b7].data, g1.tensors[b7].data)
    for t0, t1 in zip(g0.tensors, g1.tensors):
        assert t0.quant == t1.quant and t0.shape == t1.shape
    g, cut = _cut_softmax(dst, tmp_path)
    m = quant.write(g, str(tmp_path / 'again'), 'none')
    net = Q8Net(m, str(tmp_path / 'again' / 'weights.wof'))
    it = runtime.Interpreter.from_file(cut)
    for i in range(4):
        xq = net.quantize_input(z['x'][i].ravel().tolist())
        it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(g.tensors[g.inputs[0]].shape), 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(xq)), np.int8),
                              it.get_output(0).ravel())


def _window_state(net):
    # each trained layer's held weights, biases, float biases, momentum velocities
    return [bytes(L.w or b'') + bytes(L.b) + _bstate(L) + bytes(L.vw or b'')
            for L in net.layers if L.train]


def test_partial_window_equals_held(tmp_path, monkeypatch):
    """A rank's window of a layer wider than the weight scratch: its rows alone in RAM
    (pw), the frozen rows read from flash a chunk at a time for the forward pass and the
    input gradient: the same integers as with all its weights held."""
    outs = []
    for small in (False, True):
        if small:
            _small_scratch(monkeypatch)
        d = tmp_path / str(small)
        d.mkdir()
        m, net = _net(d, SCHEMES['bias-dw-pw-half'])
        net.setup('sgd', 1, momentum=0.5)
        L = net.layers[2]
        assert bool(m['layers'][2].get('pw')) == small
        lo, hi = m['layers'][2]['tw']
        row = m['layers'][2]['wn'] // m['layers'][2]['nb']
        assert len(L.w) == ((hi - lo) * row if small else m['layers'][2]['wn'])
        if not small:
            full0 = bytes(L.w)
        for s in range(3):
            net.step(_sample(s), 3, 0.05)
        if not small:
            assert bytes(L.w) != full0          # (the window moved)
            L.w = memoryview(L.w)[lo * row:hi * row]
        outs.append(_window_state(net))
    assert outs[0] == outs[1]


@pytest.mark.skipif(not MP, reason='no unix MicroPython')
def test_board_bytes_equal_host_partial(tmp_path, monkeypatch):
    """A partial layer's run on the board and the host writes the trained.wof (the frozen
    rows copied from weights.wof around the window's) that holding all its weights does."""
    model = build(str(tmp_path / 'm.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    outs = []
    for py, small in ((True, False), (True, True), (False, True)):
        if small:
            _small_scratch(monkeypatch)
        d = str(tmp_path / ('%s%s' % (py, small)))
        prepare(model, d, data=data, loss='scce', lr=0.05, epochs=1, train='last:1',
                ranks=SCHEMES['bias-dw-pw-half'], log=lambda *a: None)
        with open(os.path.join(d, 'q8.json')) as fh:
            assert bool(json.load(fh)['layers'][2].get('pw')) == small
        code, out = runner.run(d, python=py, stream=False)
        assert code == 0, out
        with open(os.path.join(d, 'trained.wof'), 'rb') as fh:
            outs.append(fh.read())
    assert outs[0] == outs[1] == outs[2]


def test_partial_window_checkpoint_round_trip(tmp_path, monkeypatch):
    """A partial layer's checkpoint holds its whole tensor (the frozen rows from
    weights.wof, the window's trained rows, as with all held); resuming reads back the
    window alone: the same state, with Adam's masters and moments."""
    from utrain.ckread import load_checkpoint
    from utrain.q8train import Q8Trainer
    saved = {}
    for small in (False, True):
        if small:
            _small_scratch(monkeypatch)
        d = tmp_path / str(small)
        d.mkdir()
        m, _ = _net(d, SCHEMES['bias-dw-pw-half'])
        monkeypatch.chdir(d)
        tr = Q8Trainer(optimizer='adam', batch=2)
        net = tr.net
        assert bool(net.layers[2].pw) == small
        for s in range(4):
            net.accum(_sample(s), 3)
            if s % 2:
                net.apply(0.01, 0.5)
        tr.save_checkpoint('c.ckpt')
        with open('c.ckpt', 'rb') as fh:
            saved[small] = fh.read()
        tr2 = Q8Trainer(optimizer='adam', batch=2)
        tr2.load_checkpoint('c.ckpt')
        got = [_window_state(t.net) + [bytes(L.wm) + bytes(L.am) + bytes(L.av)
                                       for L in t.net.layers if L.train] for t in (tr, tr2)]
        assert got[0] == got[1]
    assert saved[False] == saved[True]


def test_one_input_gradient_buffer(tmp_path, monkeypatch):
    """A backward pass without pools or an expanding MEAN keeps one int32 input-gradient
    buffer (a layer's int32 output gradient is dead once its int8 dz is made: the float
    reference of test_sparse_step_matches_float_reference holds with it); the plan counts
    one, a buffer of the largest input gradient less than two."""
    from utrain import q8load
    from host_tools.plan.memory import target
    m, net = _net(tmp_path, SCHEMES['bias-dw-pw-half'])
    assert not q8load.gtwo(m['layers']) and net.gb[0] is net.gb[1]
    # one bias-sum buffer the trained layers share; no dz rescaling for the lowest
    # trained layer (per-channel scales, but it passes no input gradient)
    tr = [L for L in net.layers if L.train]
    assert all(L.bs is net.bs for L in tr) and len(net.bs) == max(len(L.b) for L in tr)
    assert net.first == 0 and len(set(m['layers'][0]['sw'])) > 1
    assert net.layers[0].dxm is None and net.layers[1].dxm is not None
    # the weight-gradient chunk in the forward pass's sums buffer (free while it runs)
    assert net.gw is net.acc and len(net.acc) >= q8load.bufs(m['layers'])[2]
    g = read_model(build(str(tmp_path / 'm.tflite')))
    s = {'optimizer': 'sgd', 'batch': 1, 'momentum': 0.0}
    one = quant.planned(g, s, 'last:1', ranks=SCHEMES['bias-dw-pw-half'])[2]['parts']
    monkeypatch.setattr(q8load, 'gtwo', lambda ls: True)
    two = quant.planned(g, s, 'last:1', ranks=SCHEMES['bias-dw-pw-half'])[2]['parts']
    t = target(None)
    n = 4 * q8load.gin(m['layers'])
    arr = -(-4 * t['word'] // t['block']) * t['block'] + -(-n // t['block']) * t['block']
    k = 'gradient buffers (int8 dz, int32 sums)'
    assert two[k] - one[k] == arr


def test_broadcast_rescaling_made_when_used(tmp_path):
    """A per-channel layer whose gradient arrives as a MEAN's broadcast row makes its
    dz rescaling multipliers a scratch at a time when used (Layer.dxr), none held: the
    same integers as held multipliers give."""
    from utrain.q8 import _i32, qmul
    outs = []
    for held in (False, True):
        d = tmp_path / str(held)
        d.mkdir()
        m, net = _net(d, SCHEMES['dw-quarter-pw-bias'])
        L = net.layers[2]
        assert L.dxr == 1 and L.dxm is None and len(L.d['sw']) > len(net.qm)
        if held:
            sw = L.d['sw']
            c = len(sw)
            L.dxm, L.dxs = _i32(c), _i32(c)
            for o in range(c):
                L.dxm[o], L.dxs[o] = qmul(sw[o] / max(sw))
            L.dxr = 0
        for s in range(3):
            net.step(_sample(s), 3, 0.05)
        outs.append(_window_state(net))
    assert outs[0] == outs[1]


def test_fraction_update_is_exact():
    """q8kern.upek unscaled (SGD on a convolution's weights): the int8 weight and its int8
    fraction (the part of the updates not yet applied) hold 256 w - f = 256 w0 - (the sum
    of every update, in 1/256 steps) exactly,
    the fraction within [-128, 127], the weight within +-127 (clamped: the excess lost);
    the numpy kernel (CPython) and the plain Python one (the board's viper code) agree."""
    from array import array
    rng = np.random.default_rng(5)
    n = 301
    w0 = rng.integers(-60, 61, n)        # (the others never reach the clamp)
    w0[:4] = (127, -127, 120, -120)
    outs = []
    for upek in (K.upek, K.py_upek):
        w = bytearray(w0.astype(np.int8).tobytes())
        f = bytearray(n)
        tot = np.zeros(n, np.int64)
        r = np.random.default_rng(6)
        for step in range(40):
            d = r.integers(-200, 201, n) * (r.random(n) < 0.7)
            d[:4] = (3000, -3000, 5000, -5000)   # pushed past the clamp, then held there
            tot += d
            upek(w, f, array('i', d.tolist()), array('i', [n, 0, 0, 0]))
        wq = np.frombuffer(bytes(w), np.int8).astype(np.int64)
        fq = np.frombuffer(bytes(f), np.int8).astype(np.int64)
        free = slice(4, None)
        assert np.array_equal(256 * wq[free] - fq[free], 256 * w0[free] - tot[free])
        assert list(wq[:4]) == [-127, 127, -127, 127]
        outs.append(bytes(w) + bytes(f))
    assert outs[0] == outs[1]


def test_bias_fraction_update_is_exact():
    """q8kern.ubek (SGD's integer bias step): steps in 2^-(8 + j) bias steps, rounded half
    up to 1/256, go into the int32 bias and its int8 fraction so that 256 b - e =
    256 b0 - (the sum of the rounded steps) exactly, the fraction within [-128, 127], a
    bias pushed past +-(2^31 - 1) held there (a numpy reference)."""
    from array import array
    rng = np.random.default_rng(7)
    n, mx = 257, (1 << 31) - 1
    for j in (0, 3, 8):
        b0 = rng.integers(-5000, 5000, n)
        b0[:2] = (mx - 10, -mx + 10)
        b, e = array('i', b0.tolist()), bytearray(n)
        tot = np.zeros(n, np.int64)
        for step in range(30):
            d = rng.integers(-(1 << (j + 9)), 1 << (j + 9), n) * (rng.random(n) < 0.8)
            d[:2] = (-(1 << (j + 20)), 1 << (j + 20))     # past the int32 ends, held there
            tot += (d + ((1 << j) >> 1)) >> j
            K.ubek(b, e, array('i', d.tolist()), n, j)
        bq, eq = np.array(b, np.int64), np.frombuffer(bytes(e), np.int8).astype(np.int64)
        assert np.array_equal((256 * bq - eq)[2:], (256 * b0 - tot)[2:]), j
        assert list(bq[:2]) == [mx, -mx]


def test_integer_bias_step_matches_the_float_step(tmp_path):
    """SGD's per-channel bias step in integers (Q8Net._bias: one multiplier for the layer,
    a per-channel factor from q8.req, q8kern.ubek) moves the bias each layer holds (int32
    less its fraction) by the float step it replaced, -lr sz bs / (sx sw[o]) bias steps,
    each step to half of 1/256 of a bias step (the fraction's rounding) and a hair (the
    multipliers'); steps below half a bias step add up (the fraction keeps them); a doubled weight scale (q8grow) halves the
    channel's step; a step too large for int32 is clipped, its sign kept.  No float bias
    is held."""
    from array import array
    m, net = _net(tmp_path, SCHEMES['bias-dw-pw-half'])
    rng = np.random.default_rng(3)
    sz = 2.0 ** -14 * 8
    for i in (0, 1, 2):
        L = net.layers[i]
        assert L.be is not None and L.bf is None and 'bh' in L.d
        lo, hi, P = L.blo, L.bhi, L.opi()[1]
        sw = np.array(L.d['sw'], np.float64)[lo:hi]
        if i == 2:                          # a channel whose weight scale doubled
            L.ge[lo + 1] += 1
            L.d['sw'][lo + 1] *= 2.0
            sw[1] *= 2.0
        L.b[:] = array('i', rng.integers(-3000, 3000, len(L.b)).tolist())
        L.be[:] = rng.integers(0, 256, len(L.be)).astype(np.uint8).tobytes()

        def held():
            return 256 * np.array(L.b, np.float64)[lo:hi] - np.frombuffer(
                bytes(L.be), np.int8)[lo:hi]
        for lr, steps in ((0.02, 1), (2e-5, 40)):
            t0, want = held(), 0
            for _ in range(steps):
                bs = rng.integers(-128 * P, 128 * P + 1, hi - lo)
                want = want - 256 * lr * sz * bs / (L.d['sx'] * sw)
                net._bias(L, sz, lr, lo, hi, array('i', bs.tolist()))
            got = held() - t0
            assert np.abs(got - want).max() <= steps * (0.5 + 2 / 256) + 1e-6 * np.abs(
                want).max(), (i, lr)
            if steps > 1:       # (each step alone below half a bias step)
                assert np.abs(want).max() / steps < 128 and np.abs(got).max() > 256
        bs = rng.integers(-128 * P, 128 * P + 1, hi - lo)
        bs[0] = 128 * P
        t0 = held()
        net._bias(L, sz, 1e9, lo, hi, array('i', bs.tolist()))
        got = held() - t0
        assert np.all(np.sign(got) == -np.sign(bs)) and got[0] < -(1 << 20)


def test_integer_bias_momentum(tmp_path):
    """SGD momentum at batch 1 on a per-channel layer's integer bias: its velocity is
    int32 in 1/256 bias steps (no float bias, no float velocity), the float step within
    a 1/256 step; the bias held moves by exactly the velocity, and with no new gradient
    the velocity is mu times the last (q8kern.rqk's rounding)."""
    from array import array
    m, net = _net(tmp_path, SCHEMES['bias-dw-pw-half'])
    L = net.layers[0]
    sw = np.array(L.d['sw'], np.float64)    # (setup drops them: utrain.q8mom.setup)
    net.setup('sgd', 1, momentum=0.5)
    assert L.be is not None and L.bf is None and L.vb.typecode == 'i'
    lo, hi, P = L.blo, L.bhi, L.opi()[1]
    sw = sw[lo:hi]

    def held():
        return 256 * np.array(L.b, np.int64)[lo:hi] - np.frombuffer(bytes(L.be), np.int8)[lo:hi]
    bs = np.random.default_rng(4).integers(-128 * P, 128 * P + 1, hi - lo)
    sz, lr = 2.0 ** -11, 0.02
    t0 = held()
    net._bias(L, sz, lr, lo, hi, array('i', bs.tolist()))
    v1 = np.array(L.vb, np.int64)[lo:hi]
    assert np.abs(v1 - 256 * lr * sz * bs / (L.d['sx'] * sw)).max() <= 1 and np.abs(v1).max() > 256
    assert np.array_equal(held() - t0, -v1)
    t0 = held()
    net._bias(L, sz, lr, lo, hi, array('i', [0] * (hi - lo)))
    v2 = np.array(L.vb, np.int64)[lo:hi]
    assert np.abs(v2 - v1 / 2).max() <= 0.5 and np.array_equal(held() - t0, -v2)


@pytest.mark.parametrize('mom', [0.0, 0.5])
def test_sgd_checkpoint_keeps_the_weight_fractions(tmp_path, monkeypatch, mom):
    """SGD (batch 1, the pointwise conv at 1/2: its window's weights keep fractions, and
    the per-channel layers' int32 biases theirs; with momentum, the weights' int16
    velocities and the biases' int32 ones):
    a checkpoint holds the fractions, a resumed trainer has them, and its next steps
    equal the uninterrupted trainer's, weights and fractions."""
    from utrain.q8train import Q8Trainer
    _net(tmp_path, SCHEMES['bias-dw-pw-half'])
    monkeypatch.chdir(tmp_path)
    tr = Q8Trainer(optimizer='sgd', batch=1, momentum=mom)
    L = tr.net.layers[2]
    assert L.wf is not None and len(L.wf) == (L.whi - L.wlo) * (L.d['wn'] // L.d['nb'])
    for s in range(3):
        tr.net.step(_sample(s), 3, 0.01)
    assert any(L.wf)
    tr.save_checkpoint('c.ckpt')
    tr2 = Q8Trainer(optimizer='sgd', batch=1, momentum=mom)
    tr2.load_checkpoint('c.ckpt')
    assert bytes(tr2.net.layers[2].wf) == bytes(L.wf)
    # and the int32 biases' fractions (SGD's integer bias step)
    assert any(L.be) and [bytes(M.be) for M in tr2.net.layers if M.train and M.be] == [
        bytes(M.be) for M in tr.net.layers if M.train and M.be]
    for t in (tr, tr2):
        for s in range(3, 5):
            t.net.step(_sample(s), 1, 0.01)
    got = [[bytes(M.w) + bytes(M.b) + bytes(M.wf or b'') + bytes(M.be or b'')
            + bytes(M.vb or b'') + bytes(M.vw or b'') for M in t.net.layers if M.train]
           for t in (tr, tr2)]
    assert got[0] == got[1]


def test_momentum_refused_over_the_budget_names_what_to_drop(tmp_path):
    """SGD momentum over the heap budget (its int16 velocities, one a trained weight, a
    part of the plan): prepare refuses naming settings that fit:
    --momentum 0, and keeping momentum, the layers at a channel ratio training their
    biases alone (as the `--momentum` CLI spells them).  Within the budget it trains."""
    import subprocess
    from host_tools.prepare.pipeline import PrepareError
    model = build(str(tmp_path / 'm.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    kw = dict(data=data, loss='scce', lr=0.05, epochs=1, train='last:1', log=lambda *a: None)
    half = ','.join('%d:%s' % (k, {1: 'bias', 2: 'up', 4: '1/4'}[v])
                    for k, v in sorted(SCHEMES['bias-dw-pw-half'].items()))
    bias = half.replace('2:up', '2:bias')
    plan = {}
    for name, r, mom in (('sgd', half, 0.0), ('sgdm', half, 0.9), ('bias-sgdm', bias, 0.9)):
        s = prepare(model, str(tmp_path / name), ranks=r, momentum=mom, **kw)
        plan[name] = s['heap']['total']
        assert ("momentum's velocities" in s['heap']['parts']) == bool(mom)
    assert plan['sgd'] < plan['sgdm'] and plan['bias-sgdm'] < plan['sgdm']
    budget = max(plan['sgd'], plan['bias-sgdm']) + 512
    assert budget < plan['sgdm']
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'no'), ranks=half, momentum=0.9, budget=str(budget), **kw)
    msg = str(e.value)      # (the plan's parts of 1 KB or more: not this model's velocities)
    assert 'would fit: --momentum 0  (about' in msg, msg
    assert 'would fit: --ranks %s  (about' % bias in msg, msg
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'prepare', model, '-o',
                        str(tmp_path / 'cli'), '--data', data, '--loss', 'scce', '--train',
                        'last:1', '--ranks', bias, '--optimizer', 'sgd', '--momentum', '0.9',
                        '--budget', str(budget)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_momentum_over_the_limit_drops_weight_velocities_where_that_fits(tmp_path, monkeypatch):
    """SGD momentum whose int16 weight velocities take the plan over the budget (issue
    29: MobileNetV2 w62 + momentum, 281 KB against an RP2040's 236): prepare makes them
    int8 a layer at a time, the largest first ('v8'), then drops them from the lowest
    layer up ('nv': on w62 the gain is in the classifier's), until the plan fits, and
    says so naming the ops.  On the net a 'nv' layer has no velocity (its update goes
    straight to its weights, as plain SGD's), a 'v8' layer an int8 one; a checkpoint
    without those velocities resumes to the same steps."""
    model = build(str(tmp_path / 'm.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    kw = dict(data=data, loss='scce', lr=0.05, epochs=1, train='last:1',
              ranks='0:bias,1:bias,2:up', momentum=0.9)
    full = prepare(model, str(tmp_path / 'full'), log=lambda *a: None, **kw)['heap']
    assert 'no_velocity' not in json.load(open(tmp_path / 'full' / 'prepare.json'))
    budget, s, k = full['total'] - 64, None, 0
    while s is None or 'no_velocity' not in s:
        logs = []
        s = prepare(model, str(tmp_path / 'fit'), budget=str(budget), log=logs.append, **kw)
        assert s['heap']['total'] <= budget
        if k == 0:          # (the largest layer's int8, nothing dropped)
            said = [t for t in logs if 'int8 weight velocities instead of int16' in t]
            assert said and 'no weight velocities' not in said[0] and s['int8_velocity']
        budget, k = s['heap']['total'] - 64, k + 1
        assert k < 5
    assert s['heap']['parts']["momentum's velocities"] < full['parts']["momentum's velocities"]
    with open(tmp_path / 'fit' / 'q8.json') as f:
        m = json.load(f)
    ls = m['layers']
    nv = [i for i, d in enumerate(ls) if d.get('nv')]
    wt = [i for i, d in enumerate(ls) if d.get('train') and d.get('tw') != [0, 0]]
    assert nv == wt[:1] and ls[wt[-1]].get('v8')     # (the lowest first: the FC keeps int8)
    said = [t for t in logs if 'no weight velocities' in t]
    assert said and 'op %d keeps no weight velocities' % ls[nv[0]]['op'] in said[0], said
    assert len(s['no_velocity']) == 1
    from utrain.q8train import Q8Trainer
    monkeypatch.chdir(tmp_path / 'fit')
    tr = Q8Trainer(optimizer='sgd', batch=1, momentum=0.9)
    L = tr.net.layers
    assert [i for i in wt if L[i].vw is None] == nv
    assert len(L[wt[-1]].vw) == L[wt[-1]].whi * (ls[wt[-1]]['wn'] // ls[wt[-1]]['nb']) + 1
    stepped, real = [], tr.net.M.step
    monkeypatch.setattr(tr.net.M, 'step', lambda M, *a: (stepped.append(M), real(M, *a))[1])
    w0 = bytes(L[nv[0]].w)
    for k in range(2):
        tr.net.step(_sample(k), k % NCLS, 0.05)
    assert L[nv[0]] not in stepped and L[wt[-1]] in stepped and bytes(L[nv[0]].w) != w0
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path / 'fit')
    tr.save_checkpoint('c.ckpt')
    tr2 = Q8Trainer(optimizer='sgd', batch=1, momentum=0.9)
    tr2.load_checkpoint('c.ckpt')
    got = []
    for t in (tr, tr2):
        t.net.step(_sample(2), 1, 0.05)
        got.append([bytes(M.w or b'') + bytes(M.b) + bytes(M.wf or b'') + bytes(M.vb or b'')
                    + bytes(M.vw or b'') for M in t.net.layers if M.train])
    assert got[0] == got[1]


def test_sgd_over_the_limit_drops_weight_fractions_where_that_fits(tmp_path, monkeypatch):
    """SGD over the budget (issue 29: MobileNetV2 op 62 whole, 242 KB against an
    RP2040's 236; 128x128 w62, 249): prepare first drops the float weight scales of the
    bias-only layers (q8.json 'ns': no step reads them), then the convolutions' int8
    weight fractions ('wf', a byte a trained weight; op 62 whole's 18 KB), says so, and
    those weights step stochastically rounded (q8kern.upk, as an FC's) instead of
    through fractions (upek); the run trains."""
    model = build(str(tmp_path / 'm.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    kw = dict(data=data, loss='scce', lr=0.05, epochs=1, train='last:1', ranks='0:bias,1:bias,2:all')
    full = prepare(model, str(tmp_path / 'full'), log=lambda *a: None, **kw)['heap']
    with open(tmp_path / 'full' / 'q8.json') as f:
        t = json.load(f)['layers']
    wf = [i for i, d in enumerate(t) if d.get('wf') and d.get('train')]
    bias = [i for i, d in enumerate(t) if d.get('train') and d.get('tw') == [0, 0]]
    assert wf and len(bias) == 2 and not any(d.get('ns') for d in t)
    logs = []
    budget = full['total'] - 64
    s = prepare(model, str(tmp_path / 'fit'), budget=str(budget), log=logs.append, **kw)
    assert s['heap']['total'] <= budget < full['total']
    assert s['heap']['parts'].get('optimizer state', 0) < full['parts']['optimizer state']
    with open(tmp_path / 'fit' / 'q8.json') as f:
        m = json.load(f)
    gone = [i for i in wf if not m['layers'][i].get('wf')]
    assert gone and len(s['no_fractions']) == len(gone) and 'no_velocity' not in s
    said = [t for t in logs if 'int8 weight fractions' in t]
    assert len(said) == 1 and 'op %d keeps no' % m['layers'][gone[0]]['op'] in said[0], said
    net = Q8Net(m, str(tmp_path / 'fit' / 'weights.wof'))
    net.setup('sgd', 1)
    assert all(net.layers[i].wf is None for i in gone)
    ws, seen = {id(net.layers[i].w) for i in gone}, []
    real, realf = K.upk, K.upek

    def mine(w):
        return id(w.obj if isinstance(w, memoryview) else w) in ws
    monkeypatch.setattr(K, 'upk', lambda w, d, n, sd: (seen.append(('upk', mine(w))),
                                                       real(w, d, n, sd))[1])
    monkeypatch.setattr(K, 'upek', lambda w, f, d, p: (seen.append(('upek', mine(w))),
                                                       realf(w, f, d, p))[1])
    realm = K.upmk      # (upk's rounding from 1/65536 steps: Q8Net._dith)
    monkeypatch.setattr(K, 'upmk', lambda w, d, n, p: (seen.append(('upk', mine(w))),
                                                       realm(w, d, n, p))[1])
    net.step(_sample(0), 1, 0.05)
    assert ('upk', True) in seen and ('upek', True) not in seen, seen
    monkeypatch.undo()
    code, text = runner.run(str(tmp_path / 'fit'), python=True, stream=False)
    assert code == 0 and 'saved' in text, text


def test_selection_prices_a_choice_over_the_limit_as_prepare_writes_it(tmp_path):
    """--select's int8 pricer (select.Q8Pricer.fits): a rank assignment over the limit
    that fits once the SGD state prepare drops is gone (quant.state_where_it_fits: op 62
    whole on an RP2040, 242 -> 222 KB) fits, at that plan; one that does not, not."""
    from host_tools.prepare.select import Q8Pricer
    path = build(str(tmp_path / 'm.tflite'))
    s = dict(optimizer='sgd', batch=1, momentum=0.0, loss='scce', lr=0.05, epochs=1)
    ranks = {0: BIAS, 1: BIAS, 2: 0, 4: 0}       # (0: all channels)
    pr = Q8Pricer(path, s)
    full = pr.price(ranks)['heap']
    assert not pr.fits(dict(ranks), lambda h: full // 2)
    assert pr.fits(ranks, lambda h: full - 64)
    p = pr.price(ranks)
    assert p['heap'] <= full - 64 and p['dropped']['wf']


def test_weight_scratch_leaves_out_a_held_depthwise_layer(tmp_path):
    """The weight scratch (q8.json 'wbuf') holds a frozen depthwise layer's weights (read
    whole from flash), not one that trains or passes a gradient (its weights held in
    RAM: MCUNet's 5x5x576 op 35, a 14 KB scratch beside them, 260 -> 248 KB); a net
    with the smaller scratch trains as one with the larger, bit for bit."""
    g = read_model(build(str(tmp_path / 'm.tflite')))
    ranks = SCHEMES['bias-dw-pw-half']
    dw = [i for i, d in enumerate(quant.meta(g, 'last:1', None, ranks)['layers'])
          if d['k'] == quant.DW]
    assert len(dw) == 1
    nets = []
    for name in ('big', 'small'):
        m = quant.meta(g, 'last:1', None, ranks)
        m.update(quant.plan(m['layers'], 0, wbuf=16))
        wn = m['layers'][dw[0]]['wn']       # (the largest row of an FC's or conv's weights)
        assert m['wbuf'] < wn and m['wbuf'] == max(d['wn'] // d['nb'] for d in m['layers']
                                                   if d['k'] in (quant.FC, quant.CONV))
        if name == 'big':   # (as before: the same chunks, the scratch the DW's size)
            m['wbuf'] = wn
        d = tmp_path / name
        quant.write(g, str(d), 'last:1', m)
        with open(d / 'q8.json') as f:
            net = Q8Net(json.load(f), str(d / 'weights.wof'))
        net.setup('sgd', 1)
        for k in range(3):
            net.step(_sample(k), k % NCLS, 0.05)
        nets.append([bytes(L.w or b'') + bytes(L.b) for L in net.layers if L.train])
    assert nets[0] == nets[1]
    # a frozen depthwise layer (streamed) keeps it at its weights' size
    # (out of the band group meta chose: 'res' held its layers' weights in RAM)
    m = quant.meta(g, 'last:1', None, None)
    assert not m['layers'][dw[0]].get('train') and not m['layers'][dw[0]].get('back')
    for d in m['layers']:
        d.pop('res', None)
    assert quant.plan(m['layers'], 0, wbuf=16)['wbuf'] >= m['layers'][dw[0]]['wn']


def test_plan_over_the_limit_drops_the_bias_only_layers_scales_first(tmp_path):
    """SGD at batch 1 over the plan's limit: the float weight scales of the layers whose
    bias alone trains (no step reads them, the same integers: q8.json 'ns') go first,
    all at once, before any weight fractions or velocities (quant.state_where_it_fits;
    the net's side: test_momentum_bias_only_layers_drop_their_float_scales)."""
    from host_tools.plan.memory import plan_heap_q8
    g = read_model(build(str(tmp_path / 'm.tflite')))
    m = quant.meta(g, 'last:1', None, SCHEMES['bias-dw-pw-half'])
    assert not m.get('rr')
    s = dict(optimizer='sgd', batch=1, momentum=0.0, loss='scce', lr=0.05, epochs=1)
    h = plan_heap_q8(json.loads(json.dumps(quant.as_written(m)[0])), s, None)
    logs, h0 = [], h['total']
    m2, _, h2, dropped = quant.state_where_it_fits(g, s, None, lambda h: h0 - 8, m, None,
                                                   h, 'm.tflite', logs.append)
    bias = [i for i, d in enumerate(m['layers']) if d.get('tw') == [0, 0] and d.get('train')]
    assert len(bias) == 2 and [i for i, d in enumerate(m2['layers']) if d.get('ns')] == bias
    assert h2['total'] <= h0 - 8 and not any(dropped.values())
    assert h2['parts']['weights held in RAM'] < h['parts']['weights held in RAM']
    assert any(d.get('wf') for d in m2['layers'])
    assert len(logs) == 1 and 'float weight scales' in logs[0] and 'fractions' not in logs[0]


def test_last_n_over_the_budget_is_refused_naming_what_fits(tmp_path):
    """An int8 model with --train last:N (no --ranks) over the heap budget: prepare
    refuses, saying what the plan needs and what would fit (its advice compared the
    candidates' ranks, None, with prepare's {} for no --ranks and failed on None.items():
    held-out Keras int8 Conv1D net, --board rp2040 --train last:2)."""
    from host_tools.prepare.pipeline import PrepareError
    model = build(str(tmp_path / 'm.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    kw = dict(data=data, loss='scce', lr=0.05, epochs=1, log=lambda *a: None)
    small = prepare(model, str(tmp_path / 'one'), train='last:1', **kw)['heap']['total']
    many = 'last:%d' % (len(read_model(model).ops) - 1)
    big = prepare(model, str(tmp_path / 'many'), train=many, **kw)['heap']['total']
    assert small < big
    # (under its plan with --cache too: prepare chooses that where it fits, dropping
    # state it can do without under a limit: 0.2 KB of int8 weight fractions here)
    cached = prepare(model, str(tmp_path / 'c'), train=many, cache=True, **kw)['heap']['total']
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'no'), train=many, budget=str(min(small, cached) - 1024),
                **kw)
    msg = str(e.value)
    assert 'needs about %d KB' % (big // 1024) in msg, msg
    assert 'would fit:' in msg and '--train last:' in msg, msg


def test_advice_names_the_longest_last_n_of_a_kind(tmp_path):
    """The int8 budget advice lists a shorter --train last:N only where it is cheaper (at
    least 1 KB) than a longer one it lists with the same other flags: three last:N lines
    of one figure (the ops between train nothing, or too little to count) told the user
    nothing but to train less (a tico Conv1d net, --board esp32: last:5, 4 and 3 at 97
    KB; here a MobileNetV2 block at 130 KB: last:3, 2 and 1 at 120 KB)."""
    import re
    from host_tools.prepare.pipeline import PrepareError
    model = build_res(str(tmp_path / 'm.tflite'))
    data = str(tmp_path / 'd.npz')
    _data(data)
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'no'), data=data, loss='scce', lr=0.05, epochs=1,
                budget='130K', log=lambda *a: None)
    fits = re.findall(r'would fit: (.*?)--train last:(\d+)(.*?)  \(about (\d+) KB\)',
                      str(e.value))
    assert fits, str(e.value)
    best = {}
    for pre, k, post, kb in fits:
        key = pre + post
        if key in best:
            assert int(k) < best[key][0] and int(kb) < best[key][1], str(e.value)
        best[key] = (int(k), int(kb))


def test_int8_trials_train_the_settings_nobody_gave_as_the_run(tmp_path, monkeypatch):
    """--select on an int8 model: its int8 trials train the lr and epochs nobody gave as
    the run will (run_defaults: SGD 0.01 a sample times the batch, epochs to see about
    1000 samples, the trials' most 3), as the float trials do (test_select's
    test_trials_train_the_settings_nobody_gave_as_the_run)."""
    from host_tools.prepare import select as sl

    class Seen(Exception):
        pass
    seen, init = [], sl.Trials.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        seen.append((type(self).__name__, self.settings['lr'], self.epochs))
        raise Seen()
    monkeypatch.setattr(sl.Trials, '__init__', spy)
    model, data = _model_and_classes(tmp_path, 60, monkeypatch)
    with pytest.raises(Seen):
        prepare(model, str(tmp_path / 'o'), data=data, loss='scce', batch=2, select='auto',
                log=lambda *a: None)
    assert seen == [('Q8Trials', pytest.approx(0.02), 3)], seen
