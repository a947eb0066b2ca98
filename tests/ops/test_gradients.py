"""Gradient checks: every op's and every loss's analytic gradient on the device code
(micro/utrain) against central finite differences, in float64.

Each op case is a small circle model with trainable FULLY_CONNECTED layers before and
after the op under test (x -> FC -> OP -> FC -> y), built with CircleBuilder, prepared
by host_tools.prepare and loaded by utrain.trainer.Trainer exactly as a board would.
The gradient of the loss w.r.t. every element of every trainable tensor from
Net.backward (summed by utrain.sink.Sums) is compared with (L(w + eps) - L(w - eps)) / 2 eps.

The device code picks its float type from UTRAIN_NP when utrain.xnp is first imported,
so the device side runs in one subprocess (this file run as a script, UTRAIN_NP=float64,
PYTHONPATH=micro) whatever else this pytest process has imported; it gets a JSON job and
answers with JSON.  Models, inputs and numpy reference forwards are made here; inputs
are resampled until no ReLU / ReLU6 / ReLU_N1_TO_1 pre-activation is near a kink (and
every linear piece is visited), so the finite differences are valid.
"""
import json
import math
import os
import subprocess
import sys
import traceback

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MICRO = os.path.join(ROOT, 'micro')

EPS = 1e-6            # finite-difference step
RTOL, ATOL = 1e-6, 1e-8
KINK_MARGIN = 1e-2    # pre-activations kept this far from any kink (FD moves them < 1e-5)


# ====================================================================== device side
# (runs in the subprocess: numpy + utrain only)

def _device_loss(tr, x, t):
    """Forward (training mode) + loss on one sample; returns (loss, y, dy)."""
    tr.set_input(x.copy())
    tr.set_expected(t)
    tr.net.forward(True)
    y, (l, dy) = tr._out()      # (the trainer's: a final SOFTMAX / LOGISTIC the loss takes whole)
    return float(l), y, dy


def _fd_weights(tr, x, t):
    """Central differences of the loss w.r.t. every trainable element."""
    net = tr.net
    num = {}
    for k in net.trainable:
        w = net.t[k]
        g = np.zeros(w.shape)
        for idx in np.ndindex(*w.shape):
            old = w[idx]
            w[idx] = old + EPS
            lp = _device_loss(tr, x, t)[0]
            w[idx] = old - EPS
            lm = _device_loss(tr, x, t)[0]
            w[idx] = old
            g[idx] = (lp - lm) / (2 * EPS)
        num[k] = g
    return num


def _analytic_weights(tr, x, t):
    net = tr.net
    from utrain.sink import Sums
    old, net.sink = net.sink, Sums(net)      # gradients summed, not applied
    sums = net.sink
    l, y, dy = _device_loss(tr, x, t)
    y = y.copy()
    net.backward(dy)
    ana = {}
    for k in net.trainable:
        a = sums.acc.get(k)
        ana[k] = np.zeros(net.shape[k]) if a is None else a.copy()
    net.sink = old
    return l, y, ana


def _w_model(c):
    from utrain.trainer import Trainer
    tr = Trainer(c['flat'], c['wof'])
    net = tr.net
    x = np.array(c['x'], dtype=np.float64).reshape(tr.x_shape)
    t = np.array(c['t'], dtype=np.float64).reshape(tr.y_shape)
    x_keep = x.copy()
    l, y, ana = _analytic_weights(tr, x, t)
    num = _fd_weights(tr, x, t)
    tr.set_input(x.copy())
    net.forward(False)
    y_infer = net.output().copy()
    dtypes = sorted({str(net.t[k].dtype) for k in net.trainable} | {str(y.dtype)} |
                    {str(a.dtype) for a in ana.values()})
    return {'loss': l, 'y': y.tolist(), 'y_infer': y_infer.tolist(), 'dtypes': dtypes,
            'cfg': {k: tr.cfg[k] for k in ('loss', 'from_logits')},
            'x_untouched': bool(np.array_equal(x, x_keep)),
            'grads': {str(k): {'ana': ana[k].tolist(), 'num': num[k].tolist()}
                      for k in net.trainable}}


def _w_loss(c):
    from utrain import losses
    y = np.array(c['y'], dtype=np.float64)
    t = np.array(c['t'], dtype=np.float64)
    l, g = losses.loss(c['kind'], y, t, c['from_logits'])
    num = np.zeros(y.shape)
    for idx in np.ndindex(*y.shape):
        yp = y.copy()
        yp[idx] += EPS
        ym = y.copy()
        ym[idx] -= EPS
        num[idx] = (float(losses.loss(c['kind'], yp, t, c['from_logits'])[0]) -
                    float(losses.loss(c['kind'], ym, t, c['from_logits'])[0])) / (2 * EPS)
    return {'loss': float(l), 'ana': np.asarray(g, dtype=np.float64).reshape(y.shape).tolist(),
            'num': num.tolist(), 'dtype': str(np.asarray(g).dtype)}


def _w_sgd(c):
    from utrain.trainer import Trainer
    samples = []
    probe = Trainer(c['flat'], c['wof'])
    for xs, ts in zip(c['xs'], c['ts']):
        x = np.array(xs, dtype=np.float64).reshape(probe.x_shape)
        t = np.array(ts, dtype=np.float64).reshape(probe.y_shape)
        _, _, ana = _analytic_weights(probe, x, t)
        samples.append((x, t, ana, _fd_weights(probe, x, t)))
    tr = Trainer(c['flat'], c['wof'])
    net = tr.net
    w0 = {k: net.t[k].copy() for k in net.trainable}
    after = []
    for x, t, _, _ in samples:
        tr.set_input(x.copy())
        tr.set_expected(t)
        tr.train_step()
        after.append({str(k): net.t[k].tolist() for k in net.trainable})
    acc = net.sink.acc
    left = {str(k): (0.0 if acc.get(k) is None else float(np.max(np.abs(acc[k]))))
            for k in net.trainable}
    return {'cfg': {k: tr.cfg[k] for k in ('batch', 'lr', 'reduction', 'optimizer')},
            'pending': tr.pending, 'w0': {str(k): v.tolist() for k, v in w0.items()},
            'ana': [{str(k): s[2][k].tolist() for k in net.trainable} for s in samples],
            'num': [{str(k): s[3][k].tolist() for k in net.trainable} for s in samples],
            'after': after, 'acc_left': left}


def _worker(job_path):
    sys.path.insert(0, MICRO)
    from utrain import xnp
    with open(job_path) as f:
        job = json.load(f)
    out = {'backend': xnp.BACKEND, 'float': np.dtype(xnp.FLOAT).name}
    for section, fn in (('models', _w_model), ('losses', _w_loss), ('sgd', _w_sgd)):
        res = out[section] = {}
        for cid, c in job[section].items():
            try:
                res[cid] = fn(c)
            except Exception:
                res[cid] = {'error': traceback.format_exc()}
    print(json.dumps(out))


if __name__ == '__main__':
    _worker(sys.argv[1])
    sys.exit(0)


# ====================================================================== host side

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402

F32 = np.float32
# kinks and the linear pieces each piecewise activation has
KINKS = {'RELU': (0.0,), 'RELU6': (0.0, 6.0), 'RELU_N1_TO_1': (-1.0, 1.0)}
# default weight scale of an FC layer (pre-activation std for unit-variance input)
SCALE = {'NONE': 1.0, 'RELU': 1.5, 'RELU6': 6.0, 'RELU_N1_TO_1': 2.0, 'TANH': 1.5}
ACT_FN = {
    'NONE': lambda z: z,
    'RELU': lambda z: np.maximum(z, 0.0),
    'RELU6': lambda z: np.clip(z, 0.0, 6.0),
    'RELU_N1_TO_1': lambda z: np.clip(z, -1.0, 1.0),
    'TANH': np.tanh,
    'LOGISTIC': lambda z: 1.0 / (1.0 + np.exp(-z)),
}


def _softmax(z, beta):
    e = np.exp(beta * (z - z.max(axis=-1, keepdims=True)))
    return e / e.sum(axis=-1, keepdims=True)


def FC(units, act='NONE', bias=True, rows=False, scale=None):
    """bias: True, False (input -1) or 'absent' (a 2-input FULLY_CONNECTED);
    rows: W is [units, last dim] applied per row (keep_num_dims), else the input is
    flattened to [1, all]."""
    return ('FC', units, act, bias, rows, SCALE[act] if scale is None else scale)


def ACT(name):
    return ('ACT', name)


def SOFTMAX(beta):
    return ('SOFTMAX', beta)


def RESHAPE(*shape):
    return ('RESHAPE', list(shape))


def _pieces_ok(z, act):
    """z keeps away from act's kinks and visits each of its linear pieces."""
    kinks = KINKS.get(act)
    if kinks is None:
        return True
    z = np.asarray(z).ravel()
    if min(np.min(np.abs(z - k)) for k in kinks) < KINK_MARGIN:
        return False
    edges = (-np.inf,) + kinks + (np.inf,)
    return all(np.any((z > lo) & (z < hi)) for lo, hi in zip(edges[:-1], edges[1:]))


def _try_model(spec, rng, path):
    """Build spec's model with rng's weights and input; None when some kinked
    pre-activation is too close to a kink or misses a piece."""
    b = CircleBuilder()
    shape = list(spec['input'])
    val = rng.normal(size=shape)
    x0 = val.copy()
    cur = b.tensor('x', shape)
    b.inputs(cur)
    params = {}
    for i, layer in enumerate(spec['layers']):
        kind = layer[0]
        if kind == 'FC':
            _, units, act, bias, rows, scale = layer
            n_in = shape[-1] if rows else int(np.prod(shape[1:]))
            W = (rng.normal(size=(units, n_in)) * scale / math.sqrt(n_in)).astype(F32)
            w = b.tensor(f'fc{i}.w', [units, n_in], data=W)
            params[w] = f'fc{i}.w'
            ins = [cur, w]
            z = val.reshape(-1, n_in) @ W.T.astype(np.float64)
            if bias is True:
                B = (rng.normal(size=units) * 0.5 * scale).astype(F32)
                bt = b.tensor(f'fc{i}.b', [units], data=B)
                params[bt] = f'fc{i}.b'
                ins.append(bt)
                z = z + B
            elif bias is False:
                ins.append(-1)
            if not _pieces_ok(z, act):
                return None
            shape = shape[:-1] + [units] if rows else [1, units]
            val = ACT_FN[act](z).reshape(shape)
            out = b.tensor(f'fc{i}.y', shape)
            b.op('FULLY_CONNECTED', ins, [out], fused_activation_function=act,
                 keep_num_dims=bool(rows))
        elif kind == 'ACT':
            if not _pieces_ok(val, layer[1]):
                return None
            val = ACT_FN[layer[1]](val)
            out = b.tensor(f'{layer[1].lower()}{i}.y', shape)
            b.op(layer[1], [cur], [out])
        elif kind == 'SOFTMAX':
            val = _softmax(val, layer[1])
            out = b.tensor(f'softmax{i}.y', shape)
            b.op('SOFTMAX', [cur], [out], beta=layer[1])
        elif kind == 'RESHAPE':
            shape = list(layer[1])
            val = val.reshape(shape)
            out = b.tensor(f'reshape{i}.y', shape)
            b.op('RESHAPE', [cur], [out], new_shape=shape)
        else:
            raise AssertionError(kind)
        cur = out
    b.outputs(cur)
    target = spec.get('target', 'reg')
    n_out = shape[-1]
    if target == 'reg':
        t = val + rng.normal(0.0, 0.5, val.shape)
    elif target == 'mae':     # residuals well away from 0
        t = val + rng.choice([-1.0, 1.0], val.shape) * rng.uniform(0.2, 1.0, val.shape)
    elif target == 'dist':    # a probability distribution (soft labels)
        t = rng.dirichlet(np.ones(n_out)).reshape(val.shape)
    elif target == 'class':
        t = np.array([[rng.integers(n_out)]], dtype=np.float64)
    elif target == 'binary':
        t = rng.integers(0, 2, val.shape).astype(np.float64)
        t.flat[0], t.flat[-1] = 0.0, 1.0   # both labels when there are two outputs or more
    else:
        raise AssertionError(target)
    b.save(path)
    return {'x': x0, 'y_ref': val, 't': t, 'params': params}


def build_case(spec, seed, where):
    """Build + prepare; returns the job entry for the worker and the host-side facts."""
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    for attempt in range(500):
        made = _try_model(spec, np.random.default_rng([seed, attempt]), path)
        if made is not None:
            break
    else:
        raise AssertionError(f'no kink-free sample for {spec}')
    settings = dict(loss=spec.get('loss', 'mse'), from_logits=spec.get('from_logits', False),
                    train='all')
    settings.update(spec.get('settings', {}))
    prepare(path, where, **settings)
    job = {'flat': os.path.join(where, 'model.flat'), 'wof': os.path.join(where, 'weights.wof'),
           'x': made['x'].ravel().tolist(), 't': made['t'].ravel().tolist()}
    return job, made


# ---------------------------------------------------------------- the cases
FUSED = ['NONE', 'RELU', 'RELU6', 'TANH', 'RELU_N1_TO_1']
OP_CASES = {}
for _act in FUSED:
    for _bias in (True, False):
        for _inp, _shape in (('2d', [1, 6]), ('4d', [1, 2, 2, 3])):
            # the activation fused into an FC whose input gradient is not needed (fc0) and
            # into one whose input gradient flows on (fc1)
            OP_CASES[f'FC-{_act}-{"bias" if _bias else "nobias"}-{_inp}'] = {
                'input': _shape,
                'layers': [FC(8, _act, _bias), FC(6, _act, _bias), FC(3)]}
OP_CASES['FC-RELU-2inputs'] = {        # a FULLY_CONNECTED with no bias input at all
    'input': [1, 6], 'layers': [FC(8, 'RELU', 'absent'), FC(3, 'NONE', 'absent')]}
for _name, _op in (('RELU', ACT('RELU')), ('RELU6', ACT('RELU6')),
                   ('RELU_N1_TO_1', ACT('RELU_N1_TO_1')), ('LOGISTIC', ACT('LOGISTIC')),
                   ('TANH', ACT('TANH')), ('SOFTMAX-beta1', SOFTMAX(1.0)),
                   ('SOFTMAX-beta2', SOFTMAX(2.0))):
    _pre = {'RELU6': 6.0, 'RELU_N1_TO_1': 2.0}.get(_name, 1.5)
    OP_CASES[f'{_name}-2d'] = {
        'input': [1, 6], 'layers': [FC(8, scale=_pre), _op, FC(4)]}
    # per-row on a [1, 3, 4] activation (3 device rows), then a per-row FC
    OP_CASES[f'{_name}-rows'] = {
        'input': [1, 6], 'layers': [FC(12, scale=_pre), RESHAPE(1, 3, 4), _op,
                                    FC(5, rows=True), RESHAPE(1, 15), FC(2)]}
OP_CASES.update({
    'RESHAPE-rows': {'input': [1, 6],
                     'layers': [FC(12), RESHAPE(1, 3, 4), FC(5, rows=True)]},
    'RESHAPE-flatten': {'input': [1, 6],
                        'layers': [FC(12, 'TANH'), RESHAPE(1, 3, 4), FC(5)]},
    'RESHAPE-input': {'input': [1, 12],
                      'layers': [RESHAPE(1, 3, 4), FC(5, 'TANH', rows=True), RESHAPE(1, 15),
                                 FC(3)]},
    'RESHAPE-4d': {'input': [1, 6],
                   'layers': [FC(12), RESHAPE(1, 2, 2, 3), FC(4, 'RELU', rows=True),
                              RESHAPE(1, 16), FC(2)]},
})

E2E_CASES = {
    'cce-SOFTMAX': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(4), SOFTMAX(1.0)],
                    'loss': 'cce', 'target': 'dist'},
    'cce-SOFTMAX-beta2': {'input': [1, 6], 'layers': [FC(8, 'TANH'), FC(4), SOFTMAX(2.0)],
                          'loss': 'cce', 'target': 'dist'},
    'cce-logits': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(4)],
                   'loss': 'cce', 'from_logits': True, 'target': 'dist'},
    'scce-SOFTMAX': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(4), SOFTMAX(1.0)],
                     'loss': 'scce', 'target': 'class'},
    'scce-logits': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(4)],
                    'loss': 'scce', 'from_logits': True, 'target': 'class'},
    'bce-LOGISTIC': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(3), ACT('LOGISTIC')],
                     'loss': 'bce', 'target': 'binary'},
    'bce-LOGISTIC-1out': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(1), ACT('LOGISTIC')],
                          'loss': 'bce', 'target': 'binary'},
    'bce-logits': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(3)],
                   'loss': 'bce', 'from_logits': True, 'target': 'binary'},
    'mae': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(3)], 'loss': 'mae', 'target': 'mae'},
}

SGD_CASES = {
    f'sgd-batch2-{red}': {'input': [1, 6], 'layers': [FC(8, 'RELU'), FC(3)],
                          'settings': {'batch': 2, 'lr': 0.125, 'reduction': red,
                                       'optimizer': 'sgd'}}
    for red in ('mean', 'sum')}


def _loss_cases():
    rng = np.random.default_rng(7)
    C = 5
    y = rng.normal(size=(1, C))
    probs = rng.uniform(0.05, 0.95, (1, C))
    dist = rng.dirichlet(np.ones(C)).reshape(1, C)
    soft = rng.uniform(0.0, 1.0, (1, 4))
    binary = np.array([[0.0, 1.0, 1.0, 0.0]])
    logits = np.array([[-6.0, -0.3, 0.2, 4.5]])
    return {
        'mse': ('mse', y, y + rng.normal(size=(1, C)), False),
        'mae': ('mae', y, y + rng.choice([-1, 1], (1, C)) * rng.uniform(0.2, 1, (1, C)), False),
        'cce-probs': ('cce', probs, dist, False),
        'cce-probs-onehot': ('cce', probs, np.eye(C)[[3]], False),
        'cce-logits': ('cce', y, dist, True),
        'scce-probs': ('scce', probs, np.array([[2.0]]), False),
        'scce-logits': ('scce', y, np.array([[4.0]]), True),
        'bce-probs': ('bce', rng.uniform(0.05, 0.95, (1, 4)), binary, False),
        'bce-probs-soft': ('bce', rng.uniform(0.05, 0.95, (1, 4)), soft, False),
        'bce-probs-1out': ('bce', np.array([[0.3]]), np.array([[1.0]]), False),
        'bce-logits': ('bce', logits, binary, True),
        'bce-logits-soft': ('bce', logits, soft, True),
    }


LOSS_CASES = _loss_cases()


def _ref_loss_value(kind, y, t, from_logits):
    """The value each loss should have (Keras definitions, per-sample, mean over outputs
    for mse/mae/bce, sum over classes for cce)."""
    if kind == 'mse':
        return np.mean((y - t) ** 2)
    if kind == 'mae':
        return np.mean(np.abs(y - t))
    if kind == 'scce':
        t = np.eye(y.shape[1])[[int(t[0, 0])]]
        kind = 'cce'
    if kind == 'cce':
        p = _softmax(y, 1.0) if from_logits else y
        return -np.sum(t * np.log(p))
    if kind == 'bce':
        p = 1.0 / (1.0 + np.exp(-y)) if from_logits else y
        return -np.mean(t * np.log(p) + (1 - t) * np.log(1 - p))
    raise AssertionError(kind)


# ---------------------------------------------------------------- the worker run
@pytest.fixture(scope='module')
def device(tmp_path_factory):
    """Build every model, run the device side once in a float64 subprocess."""
    base = tmp_path_factory.mktemp('gradients')
    job = {'models': {}, 'losses': {}, 'sgd': {}}
    host = {}
    for n, (cid, spec) in enumerate(list(OP_CASES.items()) + list(E2E_CASES.items())):
        entry, made = build_case(spec, n, str(base / f'm{n}'))
        job['models'][cid] = entry
        host[cid] = made
    for n, (cid, spec) in enumerate(SGD_CASES.items()):
        entry, made = build_case(spec, 1000 + n, str(base / f's{n}'))
        rng = np.random.default_rng(5000 + n)
        x2 = rng.normal(size=made['x'].shape)     # second sample (no kink check needed:
        t2 = made['t'] + rng.normal(size=made['t'].shape)   # FD tolerance is loose there)
        entry['xs'] = [entry.pop('x'), x2.ravel().tolist()]
        entry['ts'] = [entry.pop('t'), t2.ravel().tolist()]
        job['sgd'][cid] = entry
        host[cid] = made
    for cid, (kind, y, t, fl) in LOSS_CASES.items():
        job['losses'][cid] = {'kind': kind, 'y': y.tolist(), 't': t.tolist(), 'from_logits': fl}
    job_path = str(base / 'job.json')
    with open(job_path, 'w') as f:
        json.dump(job, f)
    env = dict(os.environ, UTRAIN_NP='float64', PYTHONPATH=MICRO)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), job_path], env=env,
                       capture_output=True, text=True, timeout=300, cwd=str(base))
    assert r.returncode == 0, f'device worker failed:\n{r.stderr}'
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out['host'] = host
    return out


def _close(name, ana, num, rtol=RTOL, atol=ATOL):
    ana, num = np.asarray(ana, dtype=np.float64), np.asarray(num, dtype=np.float64)
    assert ana.shape == num.shape, f'{name}: shape {ana.shape} vs {num.shape}'
    err = np.abs(ana - num)
    bad = ~(err <= atol + rtol * np.abs(num))        # a NaN is bad too
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, np.inf, err - rtol * np.abs(num)))),
                             err.shape)
        raise AssertionError(
            f'{name}: {int(bad.sum())} of {bad.size} gradient elements differ from central '
            f'differences; worst at {i}: backward {ana[i]!r}, finite difference {num[i]!r}'
            f'\nbackward:\n{ana}\nfinite differences:\n{num}')


def _check_model(device, cid):
    res = device['models'][cid]
    assert 'error' not in res, f'{cid}: device code raised\n{res["error"]}'
    made = device['host'][cid]
    assert res['dtypes'] == ['float64'], f'not computed in float64: {res["dtypes"]}'
    # the forward pass matches the numpy reference, in training and inference mode
    y_ref = made['y_ref'].reshape(np.shape(res['y']))
    np.testing.assert_allclose(res['y'], y_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res['y_infer'], res['y'], rtol=0, atol=0)
    assert res['x_untouched'], 'the input array was modified by forward/backward'
    # every FC weight and bias of the model is trainable, and nothing else
    assert sorted(int(k) for k in res['grads']) == sorted(made['params'])
    for k, g in res['grads'].items():
        _close(f'{cid}: d loss / d {made["params"][int(k)]}', g['ana'], g['num'])
        assert np.any(np.asarray(g['ana']) != 0.0), f'{made["params"][int(k)]}: zero gradient'


def test_device_runs_float64(device):
    assert device['backend'] == 'numpy' and device['float'] == 'float64'


@pytest.mark.parametrize('cid', list(OP_CASES))
def test_op_gradient(device, cid):
    _check_model(device, cid)


@pytest.mark.parametrize('cid', list(LOSS_CASES))
def test_loss_gradient(device, cid):
    res = device['losses'][cid]
    assert 'error' not in res, f'{cid}: losses.loss raised\n{res["error"]}'
    assert res['dtype'] == 'float64'
    kind, y, t, fl = LOSS_CASES[cid]
    assert res['loss'] == pytest.approx(_ref_loss_value(kind, y, t, fl), rel=1e-12, abs=1e-14)
    _close(f'{cid}: d loss / d y', res['ana'], res['num'])


@pytest.mark.parametrize('cid', list(E2E_CASES))
def test_loss_end_to_end(device, cid):
    res = device['models'][cid]
    assert 'error' not in res, f'{cid}: device code raised\n{res["error"]}'
    spec = E2E_CASES[cid]
    assert res['cfg'] == {'loss': spec['loss'], 'from_logits': spec.get('from_logits', False)}
    _check_model(device, cid)
    made = device['host'][cid]
    y = np.asarray(res['y'])
    t = made['t'].reshape((1, 1) if spec['loss'] == 'scce' else y.shape)
    assert res['loss'] == pytest.approx(
        _ref_loss_value(spec['loss'], y, t, spec.get('from_logits', False)), rel=1e-12)


@pytest.mark.parametrize('cid', list(SGD_CASES))
def test_sgd_batch2_update(device, cid):
    res = device['sgd'][cid]
    assert 'error' not in res, f'{cid}: device code raised\n{res["error"]}'
    red = SGD_CASES[cid]['settings']['reduction']
    assert res['cfg'] == {'batch': 2, 'lr': 0.125, 'reduction': red, 'optimizer': 'sgd'}
    lr, scale = 0.125, (0.5 if red == 'mean' else 1.0)
    names = device['host'][cid]['params']
    assert sorted(int(k) for k in res['w0']) == sorted(names)
    for k, w0 in res['w0'].items():
        name = names[int(k)]
        w0 = np.asarray(w0)
        # the per-sample gradients themselves are right
        for s in range(2):
            _close(f'{cid}: sample {s} d loss / d {name}', res['ana'][s][k], res['num'][s][k])
        # no update after the first sample of the batch
        np.testing.assert_array_equal(res['after'][0][k], w0, err_msg=f'{name} changed mid-batch')
        # after the second: w - lr * (g1 + g2) * scale, scale 1/2 for 'mean'
        g = np.asarray(res['ana'][0][k]) + np.asarray(res['ana'][1][k])
        np.testing.assert_allclose(res['after'][1][k], w0 - lr * scale * g, rtol=1e-13,
                                   atol=1e-15, err_msg=name)
        gfd = np.asarray(res['num'][0][k]) + np.asarray(res['num'][1][k])
        np.testing.assert_allclose(np.asarray(res['after'][1][k]) - w0, -lr * scale * gfd,
                                   rtol=1e-6, atol=1e-9, err_msg=name)
        assert np.any(np.asarray(res['after'][1][k]) != w0), f'{name} not updated'
    assert res['pending'] == 0
    assert all(v == 0.0 for v in res['acc_left'].values()), 'gradient sums not reset'
