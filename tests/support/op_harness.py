"""The op-test harness test_elem_ops and test_split_math_ops share: a circle model built op by op
with the float64 value of every tensor (Model: x[1, 3] -> FC -> RESHAPE -> OP ... -> FC ->
y, every FC training), prepared as built, run once through test_gradients' float64
device worker (run_device), checked against the reference, ONERT or TFLite Micro and
finite differences (check_case), and again under unix MicroPython (check_micropython)."""
import json
import os
import subprocess
import sys

import numpy as np


import test_gradients as tg  # noqa: E402
import test_parity as tp  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from onert_ref import onert_infer  # noqa: E402

F32 = np.float32
N_IN = 3


def pieces_ok(z, kinks):
    # tg._pieces_ok with explicit kinks: away from each, every linear piece visited
    z = np.asarray(z).ravel()
    if not kinks:
        return True
    if min(np.min(np.abs(z - k)) for k in kinks) < tg.KINK_MARGIN:
        return False
    edges = (-np.inf,) + tuple(kinks) + (np.inf,)
    return all(np.any((z > lo) & (z < hi)) for lo, hi in zip(edges[:-1], edges[1:]))


class Model:
    """CircleBuilder plus the float64 value of every tensor (the numpy reference)."""

    def __init__(self, rng, scale=1.5):
        self.b, self.rng, self.val, self.params, self.ok = CircleBuilder(), rng, {}, {}, True
        self.n = 0
        self.scale = scale
        x = self.b.tensor('x', [1, N_IN])
        self.val[x] = rng.normal(size=(1, N_IN)).astype(F32).astype(np.float64)
        self.b.inputs(x)
        self.x = x

    def _name(self, s):
        self.n += 1
        return f'{s}{self.n}'

    def tensor(self, shape, value=None, train=False):
        if value is None:
            k = self.b.tensor(self._name('t'), list(shape))
        else:
            data = np.asarray(value)
            k = self.b.tensor(self._name('c'), list(shape), data=data)
            self.val[k] = data.astype(np.float64).reshape(shape)
            if train:
                self.params[k] = f'{k}'
        return k

    def const(self, shape, train=True):
        v = self.rng.normal(size=shape)
        v += np.sign(v) * 0.2                  # keep MUL's constants away from 0
        return self.tensor(shape, v.astype(F32), train=train)

    def reshape(self, src, shape):
        out = self.tensor(shape)
        self.b.op('RESHAPE', [src], [out], new_shape=list(shape))
        self.val[out] = self.val[src].reshape(shape)
        return out

    def fc(self, src, units, scale=None):
        """FC over the flattened src, then [1, units] (trainable W and b)."""
        n = self.val[src].size
        if list(self.val[src].shape) != [1, n]:
            src = self.reshape(src, [1, n])
        s = self.scale if scale is None else scale
        W = (self.rng.normal(size=(units, n)) * s / np.sqrt(n)).astype(F32)
        B = (self.rng.normal(size=units) * 0.3 * s).astype(F32)
        w = self.tensor([units, n], W, train=True)
        bt = self.tensor([units], B, train=True)
        out = self.tensor([1, units])
        self.b.op('FULLY_CONNECTED', [src, w, bt], [out])
        self.val[out] = self.val[src] @ W.T.astype(np.float64) + B
        return out

    def act_input(self, shape):
        """An activation of the given shape computed from x (FC + RESHAPE)."""
        h = self.fc(self.x, int(np.prod(shape)))
        return self.reshape(h, shape)

    def op(self, name, ins, value, kinks=(), pre=None, **options):
        """Add op name on tensors ins whose float64 output is value; pre: the values the
        piecewise parts see (must keep off the kinks)."""
        out = self.tensor(value.shape)
        self.b.op(name, ins, [out], **options)
        self.val[out] = value
        if not pieces_ok(value if pre is None else pre, kinks):
            self.ok = False
        return out

    def finish(self, src, path):
        y = self.fc(src, 3, scale=1.0)
        self.b.outputs(y)
        self.b.save(path)
        return y


def ints(v):
    return np.asarray(v, np.int32)


def prepared(m, y, where, rewrite=False):
    """Model m, finished at y in where/model.circle, prepared as built (the ops as made,
    no rewrites; rewrite: an op prepare spells with others) with noisy targets: (the
    worker's job, what the checks need)."""
    t = m.val[y] + m.rng.normal(0.0, 0.5, m.val[y].shape)
    prepare(os.path.join(where, 'model.circle'), where, loss='mse', train='all', rewrite=rewrite)
    job = {'flat': os.path.join(where, 'model.flat'), 'wof': os.path.join(where, 'weights.wof'),
           'x': m.val[m.x].ravel().tolist(), 't': t.ravel().tolist()}
    path = os.path.join(where, 'model.circle')
    return job, {'path': path, 'x': m.val[m.x], 'y_ref': m.val[y], 'params': m.params}


def run_device(base, cases, build, seed0):
    """Build every case (build(cid, folder, seed) -> (job, host)) and run the device side
    once in test_gradients' float64 worker."""
    job = {'models': {}, 'losses': {}, 'sgd': {}}
    host = {}
    for n, cid in enumerate(cases):
        job['models'][cid], host[cid] = build(cid, str(base / f'm{n}'), seed0 + n)
    job_path = str(base / 'job.json')
    with open(job_path, 'w') as f:
        json.dump(job, f)
    env = dict(os.environ, UTRAIN_NP='float64', PYTHONPATH=tg.MICRO)
    r = subprocess.run([sys.executable, tg.__file__, job_path], env=env, capture_output=True,
                       text=True, timeout=600, cwd=str(base))
    assert r.returncode == 0, f'device worker failed:\n{r.stderr}'
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out['backend'] == 'numpy' and out['float'] == 'float64'
    out['host'] = host
    out['job'] = job_path
    return out


def check_case(device, cid, rtol=1e-10, infer=onert_infer, who='ONERT'):
    """One case's forward against the float64 reference (rtol) and infer (ONERT or
    TFLite Micro, float32; None: none runs the op), its gradients against the
    differences; every FC and every constant operand trains."""
    res = device['models'][cid]
    assert 'error' not in res, f'{cid}: device code raised\n{res["error"]}'
    made = device['host'][cid]
    y = np.asarray(res['y'])
    np.testing.assert_allclose(y, made['y_ref'].reshape(y.shape), rtol=rtol, atol=rtol * 1e-2)
    np.testing.assert_array_equal(res['y_infer'], res['y'])
    if infer is not None:
        ref = infer(made['path'], made['x'].astype(F32)).reshape(y.shape)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref).max()),
                                   err_msg=f'{cid}: utrain forward vs {who}')
    assert sorted(int(k) for k in res['grads']) == sorted(made['params'])
    for k, g in res['grads'].items():
        tg._close(f'{cid}: d loss / d tensor {k}', g['ana'], g['num'])
        assert np.any(np.asarray(g['ana']) != 0.0), f'{cid}: tensor {k}: zero gradient'


MP_GRADS = """\
import json
from utrain.trainer import Trainer
from utrain.sink import Sums
from utrain import losses
with open('job.json') as f:
    job = json.load(f)
for cid, c in job['models'].items():
    tr = Trainer(c['flat'], c['wof'])
    tr.set_input(c['x'])
    tr.set_expected(c['t'])
    net = tr.net
    net.sink = Sums(net)                # gradients summed, not applied
    net.forward(True)
    y = net.output()
    l, dy = losses.loss(tr.cfg['loss'], y, tr.target, tr.cfg['from_logits'])
    net.backward(dy)
    g = {}
    for k in net.trainable:
        g[str(k)] = [float(v) for row in net.sink.acc[k].tolist() for v in row]
    print('OUT ' + json.dumps([cid, [float(v) for v in y.tolist()[0]], g]))
"""


def check_micropython(device, cases, tmp_path):
    """Every case's forward and gradients under unix MicroPython (npfallback, or real ulab
    when $MICROPYTHON has it), float32, against the float64 CPython run (run_device)."""
    import pytest
    if tp.MICROPYTHON is None:
        pytest.skip('unix micropython not found')
    base = os.path.dirname(device['job'])
    (tmp_path / 'grads.py').write_text(MP_GRADS)
    p = subprocess.run([tp.MICROPYTHON, '-X', 'heapsize=16M', str(tmp_path / 'grads.py')],
                       cwd=base, env=dict(os.environ, MICROPYPATH=tg.MICRO),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    got = [json.loads(ln[4:]) for ln in p.stdout.splitlines() if ln.startswith('OUT ')]
    assert sorted(c for c, _, _ in got) == sorted(cases)
    for cid, y, grads in got:
        res = device['models'][cid]
        pairs = [('y', y, res['y'])] + [(k, g, res['grads'][k]['ana']) for k, g in grads.items()]
        assert sorted(grads) == sorted(res['grads'])
        for what, a, b in pairs:
            b = np.asarray(b, np.float64).ravel()
            err = np.abs(np.asarray(a) - b).max() / max(np.abs(b).max(), 1e-6)
            assert err <= 1e-4, f'{cid}: {what}: MicroPython vs float64 rel err {err:.2e}'
