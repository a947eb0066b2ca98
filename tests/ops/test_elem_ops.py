"""ADD/SUB/MUL with broadcasting, PAD, CONCATENATION, TRANSPOSE, SQUEEZE, EXPAND_DIMS,
STRIDED_SLICE, HARD_SWISH, LEAKY_RELU (and the standalone activations on 4-D tensors):
forward against ONERT inference and a float64 numpy reference, gradients against float64
central finite differences on the device code (test_gradients.py's worker).

Each case is a circle model x[1, 3] -> FC -> RESHAPE to the op's input shape (one FC per
activation operand) -> OP (constants beside) -> RESHAPE [1, N] -> FC -> y.  Every FC and
every float constant operand of ADD/SUB/MUL but a scalar trains (a DIV's stays frozen), so the first FCs' weight gradients
(dW = dh^T x) check the op's input gradients element by element and the constants' own
gradients check the broadcast reductions.
"""
import os

import numpy as np
import pytest


import test_gradients as tg  # noqa: E402
import test_parity as tp  # noqa: E402
from op_harness import (F32, N_IN, Model, ints as _ints, prepared, run_device,  # noqa: E402
                        check_case, check_micropython)
from host_tools.formats.circle_io import tensor_data  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from onert_ref import onert_infer  # noqa: E402

KINKS = dict(tg.KINKS, HARD_SWISH=(-3.0, 3.0), LEAKY_RELU=(0.0,))
ACT_FN = dict(tg.ACT_FN,
              HARD_SWISH=lambda z: z * np.clip(z + 3.0, 0.0, 6.0) / 6.0,
              LEAKY_RELU=lambda z: np.where(z > 0, z, 0.25 * z),
              ELU=lambda z: np.where(z > 0, z, np.expm1(np.minimum(z, 0.0))))


# ---------------------------------------------------------------- the cases
def _binary(name, a_shape, b_shape, b_kind, act, const_first=False):
    """b_kind: 'act' (both operands activations) or 'const' (b a constant, trainable
    unless a scalar or a DIV's: optable._elem_roles)."""
    def build(m):
        a = m.act_input(a_shape)
        b = m.act_input(b_shape) if b_kind == 'act' else \
            m.const(b_shape, train=int(np.prod(b_shape)) > 1 and name != 'DIV')
        ins = [b, a] if const_first else [a, b]
        if name == 'DIV' and (b_kind == 'act' or const_first):
            # an activation divisor kept away from 0: + 4 (a frozen scalar), resampled
            four = m.tensor([], np.float32(4.0))
            ins[1] = m.op('ADD', [ins[1], four], m.val[ins[1]] + 4.0)
            m.ok = m.ok and np.abs(m.val[ins[1]]).min() > 0.5
        va, vb = m.val[ins[0]], m.val[ins[1]]
        z = {'ADD': va + vb, 'SUB': va - vb, 'MUL': va * vb, 'DIV': va / vb}[name]
        return m.op(name, ins, ACT_FN[act](z), KINKS.get(act, ()), pre=z,
                    fused_activation_function=act)
    return build


def _pad(shape, pads):
    def build(m):
        a = m.act_input(shape)
        p = m.tensor([len(pads), 2], _ints(pads))
        return m.op('PAD', [a, p], np.pad(m.val[a], pads))
    return build


def _concat(shapes, axis, const=()):
    def build(m):
        ins = [m.const(s, train=False) if i in const else m.act_input(s)   # frozen
               for i, s in enumerate(shapes)]
        return m.op('CONCATENATION', ins, np.concatenate([m.val[k] for k in ins], axis),
                    axis=axis)
    return build


def _concat_read_twice(shape, axis, order):
    """CONCATENATION of activations read more than once (a TILE rewritten as copies,
    Keras's Concatenate([d, e, d])): order names each input by the activation it reads."""
    def build(m):
        acts = {}
        for k in order:
            if k not in acts:
                acts[k] = m.act_input(shape)
        ins = [acts[k] for k in order]
        return m.op('CONCATENATION', ins, np.concatenate([m.val[k] for k in ins], axis),
                    axis=axis)
    return build


def _transpose(shape, perm):
    def build(m):
        a = m.act_input(shape)
        p = m.tensor([len(perm)], _ints(perm))
        return m.op('TRANSPOSE', [a, p], np.transpose(m.val[a], perm))
    return build


def _slice(shape, begin, end, strides, begin_mask=0, end_mask=0, shrink=0):
    def build(m):
        a = m.act_input(shape)
        ks = [m.tensor([len(v)], _ints(v)) for v in (begin, end, strides)]
        idx = tuple(b if shrink >> i & 1 else
                    slice(None if begin_mask >> i & 1 else b, None if end_mask >> i & 1 else e, s)
                    for i, (b, e, s) in enumerate(zip(begin, end, strides)))
        return m.op('STRIDED_SLICE', [a] + ks, m.val[a][idx], begin_mask=begin_mask,
                    end_mask=end_mask, shrink_axis_mask=shrink)
    return build


def _squeeze(shape, dims):
    def build(m):
        a = m.act_input(shape)
        return m.op('SQUEEZE', [a], np.squeeze(m.val[a], tuple(dims)), squeeze_dims=dims)
    return build


def _expand(shape, axis):
    def build(m):
        a = m.act_input(shape)
        ax = m.tensor([1], _ints([axis]))
        return m.op('EXPAND_DIMS', [a, ax], np.expand_dims(m.val[a], axis))
    return build


def _act(name, shape, **options):
    def build(m):
        a = m.act_input(shape)
        v = m.val[a]
        f = (lambda z: np.where(z > 0, z, options['alpha'] * z)) if name == 'LEAKY_RELU' \
            else ACT_FN[name]
        return m.op(name, [a], f(v), KINKS.get(name, ()), pre=v, **options)
    return build


S4 = [1, 2, 3, 4]
CASES = {}
_BCAST = [                                 # (a shape, b shape, b kind)
    ('same-act', S4, S4, 'act'),           # a residual add: both operands get gradients
    ('2d-act', [1, 6], [1, 6], 'act'),
    ('chan-const', S4, [4], 'const'),      # per-channel vector (a folded BatchNorm)
    ('chan4d-const', S4, [1, 1, 1, 4], 'const'),
    ('scalar-const', S4, [], 'const'),
    ('nchw-const', [1, 3, 2, 4], [1, 3, 1, 1], 'const'),   # TICO's per-channel constant
    ('nchw3d-const', [1, 3, 2, 4], [3, 1, 1], 'const'),
    ('same-const', [1, 3, 4], [1, 3, 4], 'const'),
    ('chan-act', S4, [1, 1, 1, 4], 'act'),  # broadcast activation: gradient summed
    ('one-act', S4, [1, 1, 1, 1], 'act'),
    ('tile-act', [1, 3, 2, 4], [1, 1, 2, 4], 'act'),
    ('nchw-act', [1, 3, 2, 4], [1, 3, 1, 1], 'act'),
    ('col-const', [1, 3, 2, 4], [1, 3, 2, 1], 'const'),
]
_ACTS = ['NONE', 'RELU', 'RELU6', 'NONE', 'RELU_N1_TO_1']
for _i, _op in enumerate(('ADD', 'SUB', 'MUL', 'DIV')):
    for _j, (_n, _a, _b, _k) in enumerate(_BCAST):
        _act_name = _ACTS[(_i + _j) % len(_ACTS)]
        CASES[f'{_op}-{_n}-{_act_name}'] = _binary(_op, _a, _b, _k, _act_name)
# one activation read twice by one MUL (SQUARED_DIFFERENCE rewritten: d * d)
CASES['MUL-square'] = lambda m: (lambda a: m.op('MUL', [a, a], m.val[a] * m.val[a]))(
    m.act_input(S4))
CASES['SUB-const-first-NONE'] = _binary('SUB', S4, [4], 'const', 'NONE', const_first=True)
CASES['MUL-const-first-RELU'] = _binary('MUL', [1, 3, 2, 4], [1, 3, 1, 1], 'const', 'RELU',
                                        const_first=True)
CASES['DIV-const-first-NONE'] = _binary('DIV', [1, 3, 2, 4], [1, 3, 1, 1], 'const', 'NONE',
                                        const_first=True)
CASES.update({
    'PAD-nhwc-spatial': _pad([1, 3, 2, 2], [[0, 0], [1, 0], [2, 1], [0, 0]]),
    'PAD-channels': _pad([1, 2, 2, 3], [[0, 0], [0, 0], [0, 0], [1, 2]]),
    'PAD-nchw-spatial': _pad([1, 2, 3, 2], [[0, 0], [0, 0], [1, 1], [1, 2]]),
    'PAD-all': _pad([1, 2, 2, 2], [[1, 0], [0, 1], [1, 1], [2, 0]]),
    'PAD-2d': _pad([1, 5], [[0, 0], [2, 1]]),
    'PAD-3d': _pad([1, 3, 4], [[0, 0], [1, 1], [0, 2]]),
    'CONCAT-last': _concat([[1, 2, 3, 2], [1, 2, 3, 3]], 3),
    'CONCAT-last-neg': _concat([[1, 3, 2], [1, 3, 1]], -1),
    'CONCAT-nchw-channels': _concat([[1, 2, 3, 2], [1, 1, 3, 2]], 1),
    'CONCAT-inner-spatial': _concat([[1, 2, 3, 2], [1, 2, 1, 2]], 2),
    'CONCAT-three-const': _concat([[1, 2, 2, 2], [1, 2, 2, 1], [1, 2, 2, 2]], 3, const=(1,)),
    'CONCAT-2d': _concat([[1, 3], [1, 4]], 1),
    # issue 28: any number of inputs (the flat model held 12: u8 option counts, and its
    # backward flags 14: a u16 bit per input), frozen ones among them
    'CONCAT-many': _concat([[1, 1, 2]] * 9 + [[1, 2, 2]] + [[1, 1, 2]] * 10, 1, const=(0, 7, 19)),
    'CONCAT-read-twice': _concat_read_twice([1, 2, 2, 2], 3, [0, 1, 0]),
    'CONCAT-5d-tile': _concat_read_twice([1, 2, 1, 2, 2], 2, [0, 0]),
    'TRANSPOSE-nhwc-nchw': _transpose(S4, [0, 3, 1, 2]),
    'TRANSPOSE-nchw-nhwc': _transpose(S4, [0, 2, 3, 1]),
    'TRANSPOSE-hw': _transpose(S4, [0, 2, 1, 3]),
    'TRANSPOSE-wc': _transpose(S4, [0, 1, 3, 2]),
    'TRANSPOSE-reverse': _transpose(S4, [3, 2, 1, 0]),
    'TRANSPOSE-mixed': _transpose([2, 3, 1, 4], [2, 0, 3, 1]),
    'TRANSPOSE-3d': _transpose([1, 3, 4], [0, 2, 1]),
    'TRANSPOSE-2d': _transpose([3, 4], [1, 0]),
    # issue 28: Keras's Permute((1, 3, 2, 4)) of a 5-D tensor keeps the batch axis in place
    'TRANSPOSE-5d-batch': _transpose([1, 2, 3, 2, 2], [0, 1, 3, 2, 4]),
    'SQUEEZE': _squeeze([1, 2, 1, 3], [2]),
    'EXPAND_DIMS': _expand([1, 2, 3], 2),
    'SLICE-strided': _slice([1, 4, 5, 3], [0, 1, 0, 0], [1, 4, 5, 2], [1, 2, 2, 1]),
    'SLICE-masks': _slice([1, 4, 3, 2], [0, 1, 1, 1], [1, 3, 3, 0], [1, 1, 1, 1],
                          begin_mask=0b1001, end_mask=0b1100),
    'SLICE-negative': _slice([1, 3, 4, 3], [0, -2, 0, 1], [1, 3, -1, 3], [1, 1, 2, 1]),
    'SLICE-nchw-rows': _slice([1, 3, 4, 2], [0, 1, 1, 0], [1, 3, 4, 2], [1, 1, 2, 1]),
    'SLICE-2d': _slice([1, 8], [0, 1], [1, 7], [1, 3]),
    'SLICE-shrink-row': _slice([1, 3, 4, 2], [0, 1, 0, 0], [1, 2, 4, 2], [1, 1, 1, 1], shrink=2),
    'SLICE-shrink-last': _slice([1, 3, 4, 3], [0, 0, 1, -2], [1, 3, 4, 0], [1, 1, 2, 1],
                                shrink=8),
    'HARD_SWISH': _act('HARD_SWISH', S4),
    'LEAKY_RELU': _act('LEAKY_RELU', S4, alpha=0.25),
})
for _name in ('RELU', 'RELU6', 'LOGISTIC', 'TANH', 'ELU'):
    CASES[f'{_name}-4d'] = _act(_name, S4)
# pre-activation scale per case (so RELU6 / HARD_SWISH / RELU_N1_TO_1 see every piece)
SCALE = {'RELU6': 6.0, 'HARD_SWISH': 5.0, 'RELU_N1_TO_1': 2.0}


def _scale(cid):
    return next((v for k, v in SCALE.items() if k in cid), 1.5)


def build(cid, where, seed):
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    for attempt in range(500):
        m = Model(np.random.default_rng([seed, attempt]), _scale(cid))
        y = m.finish(CASES[cid](m), path)
        if m.ok:
            break
    else:
        raise AssertionError(f'{cid}: no kink-free sample')
    return prepared(m, y, where)      # the ops as built


@pytest.fixture(scope='module')
def device(tmp_path_factory):
    """Build every case, run the device side once in test_gradients' float64 worker."""
    return run_device(tmp_path_factory.mktemp('elem_ops'), CASES, build, 7000)


NO_ONERT = {'HARD_SWISH'}    # onert 0.1.0: "Unsupported operation: HARD_SWISH"


def test_hard_swish_reference():
    torch = pytest.importorskip('torch')
    z = np.linspace(-5, 5, 101)
    np.testing.assert_allclose(ACT_FN['HARD_SWISH'](z),
                               torch.nn.functional.hardswish(torch.tensor(z)).numpy(),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('cid', list(CASES))
def test_forward_and_gradients(device, cid):
    # ONERT, float32, on the same model and input (it cannot load HARD_SWISH: there the
    # numpy reference is checked against PyTorch's in test_hard_swish_reference); every
    # FC and every constant operand trains; each gradient matches the differences
    check_case(device, cid, infer=None if cid in NO_ONERT else onert_infer)


# ---------------------------------------------------------------- MicroPython
def test_ops_micropython_match_float64(device, tmp_path):
    """Every case's forward and gradients under unix MicroPython (npfallback, or real ulab
    when $MICROPYTHON has it), float32, against the float64 CPython run above."""
    check_micropython(device, CASES, tmp_path)


def build_cnn_like(path, seed=3):
    """NHWC activations through most of these ops: a residual ADD, a folded-BatchNorm
    MUL/ADD with trainable constants, PAD, TRANSPOSE to NCHW and back with a per-channel
    [1,C,1,1] MUL, CONCATENATION (last and inner axis), STRIDED_SLICE, HARD_SWISH,
    LEAKY_RELU, SUB from a trainable constant."""
    m = Model(np.random.default_rng(seed))
    a = m.act_input([1, 3, 3, 4])
    s = m.const([4])
    z = m.op('MUL', [a, s], m.val[a] * m.val[s])
    sh = m.const([4])
    z = m.op('ADD', [z, sh], np.maximum(m.val[z] + m.val[sh], 0), fused_activation_function='RELU')
    z = m.op('ADD', [z, a], m.val[z] + m.val[a])                       # residual
    p = m.tensor([4, 2], _ints([[0, 0], [1, 0], [0, 1], [0, 0]]))
    z = m.op('PAD', [z, p], np.pad(m.val[z], [[0, 0], [1, 0], [0, 1], [0, 0]]))
    pm = m.tensor([4], _ints([0, 3, 1, 2]))
    n = m.op('TRANSPOSE', [z, pm], np.transpose(m.val[z], [0, 3, 1, 2]))
    c = m.const([1, 4, 1, 1])
    n = m.op('MUL', [n, c], m.val[n] * m.val[c])
    pm2 = m.tensor([4], _ints([0, 2, 3, 1]))
    z = m.op('TRANSPOSE', [n, pm2], np.transpose(m.val[n], [0, 2, 3, 1]))
    hs = m.op('HARD_SWISH', [z], ACT_FN['HARD_SWISH'](m.val[z]))
    lr = m.op('LEAKY_RELU', [z], ACT_FN['LEAKY_RELU'](m.val[z]), alpha=0.25)
    z = m.op('CONCATENATION', [hs, lr], np.concatenate([m.val[hs], m.val[lr]], 3), axis=3)
    ks = [m.tensor([4], _ints(v)) for v in ([0, 0, 1, 0], [1, 4, 4, 8], [1, 2, 2, 3])]
    z = m.op('STRIDED_SLICE', [z] + ks, m.val[z][:, 0:4:2, 1:4:2, 0:8:3])
    c = m.const([3])
    e = m.op('SUB', [c, z], m.val[c] - m.val[z])
    z = m.op('CONCATENATION', [e, z], np.concatenate([m.val[e], m.val[z]], 2), axis=2)
    m.finish(z, path)
    return path


def test_model_micropython_matches_cpython(tmp_path):
    """Training a model made of these ops: unix MicroPython (npfallback, or real ulab when
    $MICROPYTHON has it) ends with CPython numpy's weights."""
    model = build_cnn_like(str(tmp_path / 'cnn.circle'))
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, N_IN)).astype(F32)
    y = rng.standard_normal((4, 3)).astype(F32)
    got = {}
    backends = ['cpython'] + (['micropython'] if tp.MICROPYTHON else [])
    for backend in backends:
        d = tp.prepare_dir(model, tmp_path / backend, x, y, loss='mse', optimizer='sgd',
                           lr=0.05, batch=2, train='all', rewrite=False)  # ops as built
        tp.run_backend(d, backend)
        got[backend] = tensor_data(tp.export_trained(model, d, tmp_path / f'{backend}.circle'))
    w0 = tensor_data(model)
    trained = [k for k in w0 if w0[k].dtype == F32 and np.any(got['cpython'][k] != w0[k])]
    names = tp.const_names(model)
    # every float constant trained: FC weights and the MUL/ADD constants
    assert sorted(trained) == sorted(k for k in w0 if w0[k].dtype == F32), \
        [names[k] for k in w0 if k not in trained]
    if 'micropython' not in got:
        pytest.skip('unix micropython not found (CPython part passed)')
    for k in trained:
        err = tp.rel_err(got['micropython'][k], got['cpython'][k])
        assert err <= 1e-4, f'{names[k]}: MicroPython vs CPython rel err {err:.2e}'


# ---------------------------------------------------------------- refusals
def _refusal_model(kind, path):
    m = Model(np.random.default_rng(0))
    a = m.act_input([1, 2, 3, 4])
    if kind == 'ellipsis':
        ks = [m.tensor([4], _ints(v)) for v in ([0, 0, 0, 0], [1, 1, 3, 4], [1, 1, 1, 1])]
        out = m.tensor([1, 1, 3, 4])
        m.b.op('STRIDED_SLICE', [a] + ks, [out], ellipsis_mask=2)
    elif kind == 'perm':
        perm = m.tensor([4])                    # computed, not a constant
        out = m.tensor([1, 4, 2, 3])
        m.b.op('TRANSPOSE', [a, perm], [out])
        m.b.inputs(perm)
    elif kind == 'bcast':
        b = m.const([3])
        out = m.tensor([1, 2, 3, 4])
        m.b.op('ADD', [a, b], [out])
    m.b.outputs(out)
    m.b.save(path)


@pytest.mark.parametrize('kind, says', [('ellipsis', 'no ellipsis'), ('perm', 'must be a constant'),
                                        ('bcast', 'do not broadcast')])
def test_refused_with_file_and_op(tmp_path, kind, says):
    from host_tools.graph.passes import PrepareError, plan
    from host_tools.formats.circle_io import read_model
    path = str(tmp_path / 'bad.circle')
    _refusal_model(kind, path)
    with pytest.raises(PrepareError) as e:
        plan(read_model(path))
    assert path in str(e.value) and says in str(e.value) and 'op 2' in str(e.value)


# ---------------------------------------------------------------- a real exporter
def test_tico_export_forward_and_gradients(tmp_path):
    """PyTorch -> TICO circle with BatchNorm (exported as MUL/ADD by [1,C,1,1] constants,
    which train), hard-swish (exported as MUL/ADD/DIV by frozen scalars), a residual add,
    PAD, CONCATENATION on the NCHW channel axis, STRIDED_SLICE: utrain's forward and its
    gradients of the FC and of the BatchNorm constants against PyTorch autograd."""
    torch = pytest.importorskip('torch')
    tico = pytest.importorskip('tico')

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(4)
            self.fc = torch.nn.Linear(8 * 2 * 6, 3)

        def forward(self, x):
            y = torch.nn.functional.hardswish(self.bn(x)) + x
            y = torch.nn.functional.pad(y, (1, 0, 0, 1))
            z = torch.cat([y, torch.nn.functional.leaky_relu(y, 0.25)], 1)[:, :, 1:3, :]
            return self.fc(z.reshape(1, -1))

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        net.bn.running_mean.normal_()
        net.bn.running_var.uniform_(0.5, 2.0)
        net.bn.weight.normal_()
        net.bn.bias.normal_()
    net.eval()
    x = torch.randn(1, 4, 5, 5)
    path = str(tmp_path / 'm.circle')
    tico.convert(net, (x,)).save(path)
    prepare(path, str(tmp_path), loss='mse', train='all', rewrite=False)  # tico's graph as is
    tr = tp.new_trainer(tmp_path / 'model.flat', tmp_path / 'weights.wof')
    from host_tools.formats.circle_io import read_model
    g = read_model(path)
    assert {'MUL', 'ADD', 'DIV', 'PAD', 'CONCATENATION', 'STRIDED_SLICE'} <= {o.name for o in g.ops}
    tr.set_input(x.numpy())
    from utrain.sink import Sums
    tr.net.sink = Sums(tr.net)           # gradients summed, not applied
    tr.net.forward(True)
    y = np.array(tr.net.output(), dtype=np.float64)
    ref = net(x)
    np.testing.assert_allclose(y.ravel(), ref.detach().numpy().ravel(), rtol=1e-5, atol=1e-6)
    dy = np.array([[0.5, -1.0, 2.0]], np.float32)
    tr.net.backward(dy)
    (ref * torch.tensor(dy)).sum().backward()
    std = torch.sqrt(net.bn.running_var + net.bn.eps)
    want = {'fc_weight': net.fc.weight.grad, 'fc_bias': net.fc.bias.grad,
            # scale = w / std, shift = b - mean * scale: dL/dw = dL/dscale / std -
            # dL/dshift * mean / std, dL/db = dL/dshift
            'mul_const': net.bn.weight.grad * std + net.bn.bias.grad * net.bn.running_mean,
            'add_const': net.bn.bias.grad}
    got = {}
    for k in tr.net.trainable:
        name = next(s for s in want if s in g.tensors[k].name)
        got[name] = np.asarray(tr.net.sink.acc[k]).ravel()
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w.numpy().ravel(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_a_large_activation_leaves_its_input_to_its_other_readers(tmp_path):
    """op_act works in place on a clipping activation of more than _WHOLE values (no
    second array of its size): only where its input dies there.  A residual y = relu(x)
    + x over 5000 values read x clipped (h31p's finding: the input's minimum was 0.0
    after the op on 5000 values, -1.0 on 500)."""
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.select import micro
    n = 5000
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, n)).astype(np.float32) * 0.01
    b = CircleBuilder()
    x = x0 = b.tensor('x', [1, n])
    for name in ('RELU', 'RELU6', 'RELU_N1_TO_1'):
        r = b.tensor(f'r{name}', [1, n])
        b.op(name, [x], [r])
        s = b.tensor(f's{name}', [1, n])
        b.op('ADD', [r, x], [s])
        x = s
    y = b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [2, n], data=w), -1], [y])
    b.inputs(x0)
    b.outputs(y)
    path = str(tmp_path / 'm.circle')
    b.save(path)
    out = str(tmp_path / 'o')
    prepare(path, out, loss='mse', optimizer='sgd', lr=0.01, batch=1, train='all')
    net = micro('model').Net(os.path.join(out, 'model.flat'))
    net.load_weights(os.path.join(out, 'weights.wof'))
    v = rng.standard_normal((1, n)).astype(np.float32) * 4
    net.set_input(v.copy())
    net.forward(False)
    ref = v.astype(np.float64)
    for f in (lambda z: np.maximum(z, 0), lambda z: np.clip(z, 0, 6), lambda z: np.clip(z, -1, 1)):
        ref = f(ref) + ref
    np.testing.assert_allclose(np.asarray(net.output()).ravel(), (ref @ w.T).ravel(), rtol=1e-4)
