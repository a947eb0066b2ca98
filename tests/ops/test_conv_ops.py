"""CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D, AVERAGE_POOL_2D and MEAN (micro/utrain/
op_conv.py, op_pool.py) against independent references:

* forward: ONERT inference of the same circle model (onert_ref.onert_infer), float32;
* gradients: float64 central finite differences of the device code, run by
  tests/ops/test_gradients.py's worker (UTRAIN_NP=float64 subprocess) on every trainable
  element.  Each case is x -> CONV_2D 1x1 (trainable, "pre") -> op under test -> y with
  an MSE loss: the pre layer's weight gradients check the op's input gradient (DX), the
  op's own weight/bias gradients check DW/DB.  Inputs are resampled until every fused
  piecewise activation's pre-activation (read from ONERT running the model with the
  activation removed) keeps away from its kinks and visits each linear piece;
* training: utrain vs ONERT training (onert_ref.onert_train) on small CNNs, CPython and
  unix MicroPython (the fallback, or real ulab when $MICROPYTHON has it);
* the bundled digits CNN trains to a good accuracy under unix MicroPython.

ONERT 0.1.0 facts seen while building these models: inference refuses a fused TANH on
CONV_2D / DEPTHWISE_CONV_2D at run time, a CONV_2D without a bias input at load time
("optional input"), and MEAN over the last two axes of a 4-D tensor without keep_dims
(ShapeValidator); training accepts CONV_2D, DEPTHWISE_CONV_2D (stride, SAME/VALID, depth
multiplier, fused RELU/RELU6), MAX_POOL_2D, AVERAGE_POOL_2D and MEAN (H, W) and agrees
with utrain, but refuses dilation in both convolutions ("Unsupported dilation yet").
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

# test_parity puts the repository and micro/ on sys.path too
from test_parity import (MICRO, MICROPYTHON, ROOT, export_trained, new_trainer,  # noqa: E402
                         prepare_dir, read_log, rel_err, run_backend)
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model, tensor_data  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from onert_ref import onert_infer, onert_train  # noqa: E402
import test_gradients as tg  # noqa: E402

F32 = np.float32
FWD_TOL = 1e-5
TRAIN_TOL = 1e-4


# ---------------------------------------------------------------- model builder

def CONV(o, k=3, s=1, d=1, pad='SAME', act='NONE', bias=True, scale=None):
    return ('CONV_2D', dict(o=o, k=_pair(k), s=_pair(s), d=_pair(d), pad=pad, act=act,
                            bias=bias, scale=scale))


def DW(m=1, k=3, s=1, d=1, pad='SAME', act='NONE', scale=None):
    return ('DEPTHWISE_CONV_2D', dict(m=m, k=_pair(k), s=_pair(s), d=_pair(d), pad=pad,
                                      act=act, bias=True, scale=scale))


def MAXPOOL(k=2, s=2, pad='VALID', act='NONE'):
    return ('MAX_POOL_2D', dict(k=_pair(k), s=_pair(s), pad=pad, act=act))


def AVGPOOL(k=2, s=2, pad='VALID', act='NONE'):
    return ('AVERAGE_POOL_2D', dict(k=_pair(k), s=_pair(s), pad=pad, act=act))


def MEAN(axes, keep=True):
    return ('MEAN', dict(axes=list(axes), keep=keep))


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _out(n, k, s, d, pad):
    eff = (k - 1) * d + 1
    return -(-n // s) if pad == 'SAME' else -(-(n - eff + 1) // s)


def build(spec, rng, path, strip_act=False):
    """x[1,H,W,C] -> layers -> y; returns {name: tensor index} of the trainable tensors.
    strip_act: the same model and weights with every fused activation NONE (to read
    the pre-activations from ONERT)."""
    b = CircleBuilder()
    shape = list(spec['input'])
    cur = b.tensor('x', shape)
    b.inputs(cur)
    params = {}
    for i, (name, p) in enumerate(spec['layers']):
        act = 'NONE' if strip_act or not isinstance(p, dict) else p.get('act', 'NONE')
        H, W, C = shape[1:] if len(shape) == 4 else (None, None, None)
        if name in ('CONV_2D', 'DEPTHWISE_CONV_2D'):
            (kh, kw), (sh, sw), (dh, dw) = p['k'], p['s'], p['d']
            if name == 'CONV_2D':
                O, wshape, fan = p['o'], [p['o'], kh, kw, C], kh * kw * C
            else:
                O, wshape, fan = C * p['m'], [1, kh, kw, C * p['m']], kh * kw
            scale = p['scale'] or tg.SCALE[p['act']]
            w = b.tensor(f'op{i}.w', wshape,
                         data=(rng.normal(size=wshape) * scale / np.sqrt(fan)).astype(F32))
            params[w] = f'op{i}.w'
            ins = [cur, w]
            if p['bias']:
                bt = b.tensor(f'op{i}.b', [O], data=(rng.normal(size=O) * 0.3 * scale).astype(F32))
                params[bt] = f'op{i}.b'
                ins.append(bt)
            else:
                ins.append(-1)
            shape = [1, _out(H, kh, sh, dh, p['pad']), _out(W, kw, sw, dw, p['pad']), O]
            out = b.tensor(f'op{i}.y', shape)
            opts = dict(padding=p['pad'], stride_h=sh, stride_w=sw, dilation_h_factor=dh,
                        dilation_w_factor=dw, fused_activation_function=act)
            if name == 'DEPTHWISE_CONV_2D':
                opts['depth_multiplier'] = p['m']
            b.op(name, ins, [out], **opts)
        elif name in ('MAX_POOL_2D', 'AVERAGE_POOL_2D'):
            (kh, kw), (sh, sw) = p['k'], p['s']
            shape = [1, _out(H, kh, sh, 1, p['pad']), _out(W, kw, sw, 1, p['pad']), C]
            out = b.tensor(f'op{i}.y', shape)
            b.op(name, [cur], [out], padding=p['pad'], stride_h=sh, stride_w=sw,
                 filter_height=kh, filter_width=kw, fused_activation_function=act)
        elif name == 'MEAN':
            axes = b.tensor(f'op{i}.axes', [len(p['axes'])], data=np.array(p['axes'], np.int32))
            red = {a % len(shape) for a in p['axes']}
            shape = ([1 if j in red else n for j, n in enumerate(shape)] if p['keep'] else
                     [n for j, n in enumerate(shape) if j not in red])
            out = b.tensor(f'op{i}.y', shape)
            b.op('MEAN', [cur, axes], [out], keep_dims=p['keep'])
        elif name == 'RESHAPE':
            shape = list(p)
            out = b.tensor(f'op{i}.y', shape)
            b.op('RESHAPE', [cur], [out], new_shape=shape)
        elif name == 'FC':
            n_in = shape[-1]
            w = b.tensor(f'op{i}.w', [p, n_in], data=(rng.normal(size=(p, n_in)) /
                                                      np.sqrt(n_in)).astype(F32))
            bt = b.tensor(f'op{i}.b', [p], data=np.zeros(p, F32))
            params[w], params[bt] = f'op{i}.w', f'op{i}.b'
            shape = [1, p]
            out = b.tensor(f'op{i}.y', shape)
            b.op('FULLY_CONNECTED', [cur, w, bt], [out])
        elif name == 'SOFTMAX':
            out = b.tensor(f'op{i}.y', shape)
            b.op('SOFTMAX', [cur], [out], beta=1.0)
        else:
            raise AssertionError(name)
        cur = out
    b.outputs(cur)
    b.save(path)
    return params


def fused_acts(spec):
    return [p.get('act', 'NONE') for _, p in spec['layers'] if isinstance(p, dict)]


# ---------------------------------------------------------------- the op grid
# (id, input [1,H,W,C], op under test); each runs as x -> CONV 1x1 -> op -> y
OPS = [
    ('conv-k3-s1-same', [1, 5, 5, 2], CONV(3)),
    ('conv-k3-s2-same-relu-6x5', [1, 6, 5, 2], CONV(3, s=2, act='RELU')),
    ('conv-k3-s2-same-relu6-even', [1, 6, 6, 2], CONV(2, s=2, act='RELU6')),
    ('conv-k3-d2-valid-relu_n1', [1, 7, 7, 2], CONV(3, d=2, pad='VALID', act='RELU_N1_TO_1')),
    ('conv-k2x3-s2x1-valid-tanh', [1, 5, 6, 2], CONV(2, k=(2, 3), s=(2, 1), pad='VALID', act='TANH')),
    ('conv-k5-s3-d1x2-same-nobias', [1, 7, 8, 1], CONV(2, k=5, s=3, d=(1, 2), bias=False)),
    ('conv-k1-s1-valid', [1, 4, 4, 3], CONV(4, k=1, pad='VALID')),
    ('dw-k3-s1-same-relu', [1, 5, 5, 3], DW(1, act='RELU')),
    ('dw-k3-s2-same-m2', [1, 6, 5, 2], DW(2, s=2)),
    ('dw-k3-d2-valid-m3-tanh', [1, 7, 6, 2], DW(3, d=2, pad='VALID', act='TANH')),
    ('dw-k2-s2-valid-relu6', [1, 6, 6, 2], DW(1, k=2, s=2, pad='VALID', act='RELU6')),
    ('dw-k3x2-s1x2-same-m2-relu_n1', [1, 5, 6, 2], DW(2, k=(3, 2), s=(1, 2), act='RELU_N1_TO_1')),
    ('maxpool-k2-s2-valid', [1, 6, 6, 2], MAXPOOL(2, 2)),
    ('maxpool-k3-s2-same', [1, 5, 6, 2], MAXPOOL(3, 2, 'SAME')),
    ('maxpool-k3-s1-same-relu', [1, 4, 4, 2], MAXPOOL(3, 1, 'SAME', 'RELU')),
    ('maxpool-k2x3-s1x2-valid-relu6', [1, 5, 7, 2], MAXPOOL((2, 3), (1, 2), act='RELU6')),
    ('avgpool-k2-s2-valid', [1, 6, 6, 2], AVGPOOL(2, 2)),
    ('avgpool-k3-s2-same', [1, 5, 6, 2], AVGPOOL(3, 2, 'SAME')),
    ('avgpool-k3-s1-same-relu', [1, 4, 5, 2], AVGPOOL(3, 1, 'SAME', 'RELU')),
    ('avgpool-global', [1, 4, 5, 3], AVGPOOL((4, 5), 1)),
    ('mean-hw-keep', [1, 4, 5, 3], MEAN([1, 2])),
    ('mean-hw-drop', [1, 4, 5, 3], MEAN([1, 2], keep=False)),
    ('mean-last2-nchw', [1, 3, 4, 5], MEAN([2, 3])),          # TICO's NCHW global pool
    ('mean-last2-drop', [1, 3, 4, 5], MEAN([-2, -1], keep=False)),
    ('mean-w-only', [1, 4, 5, 3], MEAN([2])),
    ('mean-c-only', [1, 4, 5, 3], MEAN([3], keep=False)),
    ('mean-h-c-gapped', [1, 4, 5, 3], MEAN([1, 3])),          # axes not one run (was refused)
]
ONERT_REFUSES = {'mean-last2-drop': "ONERT's ShapeValidator refuses MEAN over the last two "
                                     "axes of a 4-D tensor without keep_dims"}
# pre-activation scales that let RELU6 / RELU_N1_TO_1 pools reach every piece
PRE_SCALE = {'RELU6': 5.0, 'RELU_N1_TO_1': 1.5}


def op_spec(shape, op):
    act = op[1].get('act', 'NONE')
    pre_scale = PRE_SCALE.get(act, 1.0) if op[0] in ('MAX_POOL_2D', 'AVERAGE_POOL_2D') else 1.0
    return {'input': shape, 'layers': [CONV(shape[3], k=1, pad='VALID', scale=pre_scale), op]}


def make_case(spec, seed, where):
    """Build the model with weights and an input whose fused piecewise activations
    keep off their kinks; returns (model path, x, params)."""
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    acts = [a for a in fused_acts(spec) if a in tg.KINKS]
    for attempt in range(200):
        rng = np.random.default_rng([seed, attempt])
        params = build(spec, rng, path)
        x = rng.normal(size=spec['input'])
        if not acts:
            return path, x, params
        bare = build(spec, np.random.default_rng([seed, attempt]), path[:-7] + '_bare.circle', strip_act=True)
        assert bare == params
        z = onert_infer(path[:-7] + '_bare.circle', x)
        if tg._pieces_ok(z, acts[0]):
            return path, x, params
    raise AssertionError(f'no kink-free sample for {spec}')


@pytest.fixture(scope='module')
def grid(tmp_path_factory):
    """Every op case built and prepared; the device side of all FD checks in one
    float64 subprocess (test_gradients.py's worker)."""
    base = tmp_path_factory.mktemp('conv_ops')
    job = {'models': {}, 'losses': {}, 'sgd': {}}
    cases = {}
    for n, (cid, shape, op) in enumerate(OPS):
        where = str(base / f'c{n}')
        spec = op_spec(shape, op)
        path, x, params = make_case(spec, n, where)
        prepare(path, where, loss='mse', train='all')
        t = np.random.default_rng(100 + n).normal(size=read_model(path).tensors[-1].shape)
        job['models'][cid] = {'flat': os.path.join(where, 'model.flat'),
                              'wof': os.path.join(where, 'weights.wof'),
                              'x': x.ravel().tolist(), 't': t.ravel().tolist()}
        cases[cid] = dict(path=path, where=where, x=x, params=params, act=op[1].get('act', 'NONE'),
                          bias=op[1].get('bias', True))
    job_path = str(base / 'job.json')
    with open(job_path, 'w') as f:
        json.dump(job, f)
    env = dict(os.environ, UTRAIN_NP='float64', PYTHONPATH=MICRO)
    r = subprocess.run([sys.executable, tg.__file__, job_path], env=env, capture_output=True,
                       text=True, timeout=600, cwd=str(base))
    assert r.returncode == 0, f'device worker failed:\n{r.stderr}'
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out['backend'] == 'numpy' and out['float'] == 'float64'
    return {'cases': cases, 'device': out['models']}


@pytest.mark.parametrize('cid', [c[0] for c in OPS])
def test_gradient_vs_finite_differences(grid, cid):
    res = grid['device'][cid]
    assert 'error' not in res, f'{cid}: device code raised\n{res["error"]}'
    case = grid['cases'][cid]
    assert res['dtypes'] == ['float64']
    assert res['x_untouched']
    np.testing.assert_allclose(res['y_infer'], res['y'], rtol=0, atol=0)
    assert sorted(int(k) for k in res['grads']) == sorted(case['params'])
    for k, g in res['grads'].items():
        name = case['params'][int(k)]
        tg._close(f'{cid}: d loss / d {name}', g['ana'], g['num'])
        assert np.any(np.asarray(g['ana']) != 0.0), f'{cid}: {name}: zero gradient'


@pytest.mark.parametrize('cid', [c[0] for c in OPS])
def test_forward_vs_onert(grid, cid):
    case = grid['cases'][cid]
    if case['act'] == 'TANH':
        pytest.skip('ONERT refuses a fused TANH at run time (FD and training checks cover it)')
    if cid in ONERT_REFUSES:
        pytest.skip(ONERT_REFUSES[cid])
    if not case['bias']:
        pytest.skip("ONERT's loader refuses a CONV_2D without bias (\"optional input\")")
    shape = read_model(case['path']).tensors[0].shape
    xs = np.random.default_rng(7).normal(size=[4] + shape[1:]).astype(F32)
    ref = onert_infer(case['path'], xs)
    tr = new_trainer(os.path.join(case['where'], 'model.flat'),
                     os.path.join(case['where'], 'weights.wof'))
    got = np.stack([np.array(tr.predict(xs[i].reshape(-1, shape[3])), np.float64, copy=True)
                    .reshape(ref.shape[1:]) for i in range(len(xs))])
    err = float(np.abs(got - ref).max())
    assert err <= FWD_TOL * max(1.0, float(np.abs(ref).max())), f'{cid}: max err {err:.3e}'


# ---------------------------------------------------------------- training parity
# small CNNs of ops ONERT trains; trained weights compared tensor by tensor
CNNS = {
    'conv-maxpool-dw-mean': {'input': [1, 6, 6, 2], 'layers': [
        CONV(4, act='RELU', scale=1.0), MAXPOOL(2, 2), DW(2, scale=1.0), MEAN([1, 2], keep=False),
        ('FC', 3), ('SOFTMAX', None)]},
    'conv-s2-avgpool-reshape': {'input': [1, 7, 7, 2], 'layers': [
        CONV(4, s=2, act='RELU', scale=1.0), AVGPOOL(2, 1, 'SAME'), ('RESHAPE', [1, 64]),
        ('FC', 3), ('SOFTMAX', None)]},
    'dw-s2-valid-conv-k2-maxpool-same': {'input': [1, 7, 6, 2], 'layers': [
        DW(2, s=2, pad='VALID', scale=1.0), CONV(3, k=2, act='RELU6', scale=1.0),
        MAXPOOL(3, 2, 'SAME'), ('RESHAPE', [1, 6]), ('FC', 3), ('SOFTMAX', None)]},
}
N_TRAIN = 16


def _cnn(tmp_path, cid, seed=0):
    spec = CNNS[cid]
    os.makedirs(tmp_path, exist_ok=True)
    path = str(tmp_path / 'cnn.circle')
    build(spec, np.random.default_rng(seed), path)
    rng = np.random.default_rng(seed + 1)
    x = rng.normal(size=[N_TRAIN] + spec['input'][1:]).astype(F32)
    y = np.eye(3, dtype=F32)[rng.integers(0, 3, N_TRAIN)]
    return path, x, y


def _parity(tmp_path, cid, backend, batch=2, lr=0.05, made=None):
    path, x, y = made or _cnn(tmp_path, cid)
    d = prepare_dir(path, tmp_path / 'run', x, y, loss='cce', optimizer='sgd', lr=lr,
                    batch=batch, train='all')
    run_backend(d, backend)
    got = tensor_data(export_trained(path, d, tmp_path / 'u.circle'))
    ref = tensor_data(onert_train(path, x, y, loss='cce', optimizer='sgd', lr=lr, batch=batch,
                                  out_path=str(tmp_path / 'o.circle')))
    w0 = tensor_data(path)
    names = {t.index: t.name for t in read_model(path).tensors}
    for k in w0:
        if w0[k].dtype != np.float32:
            continue
        err = rel_err(got[k], ref[k])
        moved = float(np.abs(ref[k].astype(np.float64) - w0[k]).max() / np.abs(ref[k]).max())
        assert err <= TRAIN_TOL, f'{cid}/{backend}: {names[k]}: rel err {err:.3e}'
        assert moved >= 100 * TRAIN_TOL, f'{cid}: {names[k]} barely moved ({moved:.2e})'


@pytest.mark.parametrize('cid', list(CNNS))
def test_cnn_training_matches_onert(tmp_path, cid):
    _parity(tmp_path, cid, 'cpython')


@pytest.mark.skipif(MICROPYTHON is None, reason='unix micropython not found')
def test_cnn_training_micropython_matches_onert_and_cpython(tmp_path):
    """All five ops in one model, trained under unix MicroPython (fallback, or real ulab
    when $MICROPYTHON has it) and under CPython: both equal ONERT's training."""
    cid = 'conv-maxpool-dw-mean'
    _parity(tmp_path / 'mp', cid, 'micropython')
    # AVERAGE_POOL_2D too, and MicroPython's weights against CPython's
    path, x, y = _cnn(tmp_path, 'conv-s2-avgpool-reshape')
    outs = {}
    for backend in ('cpython', 'micropython'):
        d = prepare_dir(path, tmp_path / backend, x[:8], y[:8], loss='cce', optimizer='adam',
                        lr=0.01, batch=2, train='all')
        run_backend(d, backend)
        outs[backend] = tensor_data(export_trained(path, d, tmp_path / f'{backend}.circle'))
    for k, w in outs['cpython'].items():
        if w.dtype == np.float32:
            assert rel_err(outs['micropython'][k], w) <= TRAIN_TOL, k


# ---------------------------------------------------------------- the digits CNN

DIGITS = os.path.join(ROOT, 'datasets', 'digits')


def test_digits_cnn_training_matches_onert(tmp_path):
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    x = z['x'][:24].reshape(24, 8, 8, 1).astype(F32)
    y = np.eye(10, dtype=F32)[z['y'][:24]]
    _parity(tmp_path, 'digits_cnn', 'cpython', batch=4, lr=0.05,
            made=(os.path.join(DIGITS, 'digits_cnn.circle'), x, y))


@pytest.mark.slow
@pytest.mark.skipif(MICROPYTHON is None, reason='unix micropython not found')
def test_digits_cnn_trains_under_micropython(tmp_path):
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    n = 400
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=z['x'][:n], y=z['y'][:n])
    out = str(tmp_path / 'run')
    prepare(os.path.join(DIGITS, 'digits_cnn.circle'), out, data=data, test_split=0.2,
            loss='scce', optimizer='adam', lr=0.02, batch=4, epochs=2, train='all')
    run_backend(out, 'micropython')
    log = read_log(os.path.join(out, 'train.log'))
    assert log[0][4] < 0.25, log                 # untrained: near chance
    assert log[-1][4] >= 0.85, log               # test accuracy after 2 epochs


@pytest.mark.slow
@pytest.mark.parametrize('python', [True, False], ids=['cpython', 'micropython'])
def test_large_frozen_conv_weights_stream_by_rows(tmp_path, python):
    """--stream: CONV_2D / DEPTHWISE_CONV_2D weights over 1024 floats are read a few rows
    at a time (utrain.convrows), forward and the input gradient through them (the first
    conv's bias trains below them): the weights training gives match the run with every
    weight in RAM (the input gradient sums output channels chunk by chunk)."""
    if not python and MICROPYTHON is None:
        pytest.skip('unix micropython not found')
    from host_tools.prepare.pipeline import prepare
    from host_tools.target.runner import run
    from host_tools.files.wof import read_wof
    spec = {'input': [1, 5, 5, 8], 'layers': [
        CONV(8, k=1, act='RELU', scale=1.0), CONV(160, k=1, act='RELU6', scale=1.0),
        DW(1, act='RELU', scale=1.0), CONV(8, k=1, scale=1.0), ('RESHAPE', [1, 200]),
        ('FC', 3), ('SOFTMAX', None)]}
    path = str(tmp_path / 'm.circle')
    build(spec, np.random.default_rng(3), path)
    rng = np.random.default_rng(4)
    np.savez(tmp_path / 'd.npz', x=rng.normal(size=(6, 5, 5, 8)).astype(F32),
             y=rng.integers(0, 3, 6))
    got = {}
    for st in (False, True):
        out = str(tmp_path / ('s' if st else 'r'))
        s = prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', lr=0.1, epochs=1,
                    optimizer='sgd', batch=1, train='last:2', ranks='0:bias', stream=st)
        assert s['trainable_params'] == 8 + 603
        code, text = run(out, python=python, stream=False)
        assert code == 0, text
        got[st] = read_wof(os.path.join(out, 'trained.wof'), read_model(path))
    w0 = read_wof(os.path.join(out, 'weights.wof'), read_model(path))
    for k in got[False]:
        np.testing.assert_allclose(got[True][k], got[False][k], rtol=1e-5, atol=1e-7)
        assert np.abs(got[True][k] - w0[k]).max() > 1e-4          # it trained
