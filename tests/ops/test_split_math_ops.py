"""The ops real exporters emit for LSTM, GRU, LayerNorm and GELU (issue 15): SPLIT, SPLIT_V
(op_split), RSQRT, SQRT, EXP, LOG, GELU (op_math).  Forward against a float64 numpy reference and
ONERT (where it runs the op), gradients against float64 central finite differences on the
device code, and the same under unix MicroPython (float32), with tests/support/op_harness.py's
models: x[1, 3] -> FC -> RESHAPE -> OP -> ... -> FC -> y, every FC training, so the
first FC's weight gradient checks the op's input gradient element by element.

SPLIT's cases leave some outputs unused or use only a later one: the op then runs
backward for a gradient its first output does not have (Net.backward's multi-output
rule), and the unused part's gradient is zero.
"""
import math
import os
import sys

import numpy as np
import pytest


import op_harness as oh  # noqa: E402
import test_gradients as tg  # noqa: E402
from onert_ref import onert_infer  # noqa: E402

F32 = np.float32
_erf = np.vectorize(math.erf)


def gelu_ref(z, approx=False):
    if approx:
        return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z ** 3)))
    return 0.5 * z * (1.0 + _erf(z / np.sqrt(2.0)))


def _split(shape, axis, sizes, use, v=False):
    """SPLIT (or SPLIT_V with sizes) of an activation; the outputs in `use` (in that
    order) are concatenated along the split axis and go on to the last FC."""
    def build(m):
        a = m.act_input(shape)
        val = m.val[a]
        cuts = np.cumsum(sizes)[:-1]
        parts = np.split(val, cuts, axis)
        outs = [m.tensor(p.shape) for p in parts]
        ax = m.tensor([], oh.ints(axis))
        if v:
            sz = m.tensor([len(sizes)], oh.ints(sizes))
            m.b.op('SPLIT_V', [a, sz, ax], outs, num_splits=len(sizes))
        else:
            m.b.op('SPLIT', [ax, a], outs, num_splits=len(sizes))
        for k, p in zip(outs, parts):
            m.val[k] = p
        if len(use) == 1:
            return outs[use[0]]
        return m.op('CONCATENATION', [outs[i] for i in use],
                    np.concatenate([parts[i] for i in use], axis), axis=axis)
    return build


def _positive(m, shape):
    # an activation kept positive: a * a + 0.5 (MUL of the activation with itself)
    a = m.act_input(shape)
    sq = m.op('MUL', [a, a], m.val[a] ** 2)
    half = m.tensor([], np.float32(0.5))
    return m.op('ADD', [sq, half], m.val[sq] + 0.5)


def _unary(name, shape):
    def build(m):
        if name in ('RSQRT', 'SQRT', 'LOG'):
            a = _positive(m, shape)
            v = m.val[a]
            return m.op(name, [a], {'RSQRT': 1.0 / np.sqrt(v), 'SQRT': np.sqrt(v),
                                    'LOG': np.log(v)}[name])
        if name == 'EXP':
            a = m.act_input(shape)
            return m.op(name, [a], np.exp(m.val[a]))
        a = m.act_input(shape)
        approx = name == 'GELU-tanh'
        return m.op('GELU', [a], gelu_ref(m.val[a], approx), approximate=approx)
    return build


CASES = {
    'SPLIT-last-3': _split([1, 2, 3, 6], 3, [2, 2, 2], use=[2, 0]),       # part 1 unused
    'SPLIT-rows-2-second-only': _split([1, 4, 3, 2], 1, [2, 2], use=[1]),  # first unused
    'SPLIT-gates-4': _split([1, 1, 12], -1, [3, 3, 3, 3], use=[0, 1, 2, 3]),
    'SPLIT-2d-neg-axis': _split([1, 8], -1, [4, 4], use=[1, 0]),
    'SPLIT-outer-blocks': _split([1, 2, 4, 3], 2, [2, 2], use=[1, 0]),      # rows, outer 2
    'SPLIT_V-outer-blocks': _split([1, 3, 5, 2], -2, [1, 3, 1], use=[2, 1], v=True),
    'SPLIT_V-last': _split([1, 3, 7], 2, [2, 4, 1], use=[0, 1, 2], v=True),
    'SPLIT_V-axis1-ends': _split([1, 5, 2, 3], 1, [1, 3, 1], use=[2, 0], v=True),
    'RSQRT': _unary('RSQRT', [1, 2, 3]),
    'SQRT': _unary('SQRT', [1, 2, 3]),
    'EXP': _unary('EXP', [1, 2, 3]),
    'LOG': _unary('LOG', [1, 2, 3]),
    'GELU': _unary('GELU', [1, 2, 3, 4]),
    'GELU-tanh': _unary('GELU-tanh', [1, 2, 3, 4]),
}
# forward tolerance against the float64 reference: GELU's erf is a quintic approximation
# (|error| < 1.5e-7), everything else is exact arithmetic
FWD_RTOL = {'GELU': 2e-6}
# onert 0.1.0 computes SPLIT_V wrong (its outputs differ from TFLite Micro's and numpy's
# by O(1) on these cases; SPLIT is right): these run on TFLite Micro instead
NO_ONERT = {'SPLIT_V-last', 'SPLIT_V-axis1-ends', 'SPLIT_V-outer-blocks'}


def tflm_infer(circle_path, x):
    """TFLite Micro's output for a circle model of builtin ops the two schemas share
    (the file identifier CIR0 read as TFL3)."""
    from test_rewrite import tflm_infer as run
    with open(circle_path, 'rb') as f:
        b = bytearray(f.read())
    assert b[4:8] == b'CIR0'
    b[4:8] = b'TFL3'
    path = circle_path + '.tflite'
    with open(path, 'wb') as f:
        f.write(b)
    return run(path, x)


def build(cid, where, seed):
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    m = oh.Model(np.random.default_rng(seed), 2.0 if 'GELU' in cid else 1.5)
    y = m.finish(CASES[cid](m), path)
    return oh.prepared(m, y, where)


@pytest.fixture(scope='module')
def device(tmp_path_factory):
    return oh.run_device(tmp_path_factory.mktemp('zoo_ops'), CASES, build, 9100)


def test_gelu_reference_is_pytorchs():
    torch = pytest.importorskip('torch')
    z = np.linspace(-6, 6, 241)
    for approx in (False, True):
        want = torch.nn.functional.gelu(torch.tensor(z), approximate='tanh' if approx else 'none')
        np.testing.assert_allclose(gelu_ref(z, approx), want.numpy(), rtol=1e-12, atol=1e-12)


def test_gelu_kernel_accuracy():
    """op_math's GELU (quintic erf) against the exact one over [-8, 8], and its gradient
    against PyTorch's exact derivative: float32-level agreement."""
    torch = pytest.importorskip('torch')
    sys.path.insert(0, tg.MICRO)
    from utrain import op_math
    z = np.linspace(-8, 8, 1601).reshape(1, -1)
    for approx in (0, 1):
        zt = torch.tensor(z, requires_grad=True)
        y = torch.nn.functional.gelu(zt, approximate='tanh' if approx else 'none')
        y.sum().backward()
        got = np.asarray(op_math.gelu(z.astype(F32), approx), np.float64)
        np.testing.assert_allclose(got, y.detach().numpy(), rtol=0, atol=3e-7 * 8)
        got = np.asarray(op_math.gelu_grad(z.astype(F32), approx), np.float64)
        np.testing.assert_allclose(got, zt.grad.numpy(), rtol=0, atol=2e-6)


@pytest.mark.parametrize('cid', list(CASES))
def test_forward_and_gradients(device, cid):
    rtol = FWD_RTOL.get(cid.split('-')[0], 1e-10) if cid != 'GELU-tanh' else 1e-10
    run, who = (tflm_infer, 'TFLite Micro') if cid in NO_ONERT else (onert_infer, 'ONERT')
    oh.check_case(device, cid, rtol, run, who)


def test_ops_micropython_match_float64(device, tmp_path):
    """Each case under unix MicroPython (npfallback, or ulab when $MICROPYTHON has it),
    float32, against the float64 CPython run."""
    oh.check_micropython(device, CASES, tmp_path)


def test_split_refusals(tmp_path):
    """A SPLIT whose axis is computed, or whose outputs do not tile the input, is refused
    naming the file and the op."""
    from host_tools.graph.passes import PrepareError, plan
    from host_tools.formats.circle_io import read_model
    for kind in ('axis', 'sizes'):
        m = oh.Model(np.random.default_rng(0))
        a = m.act_input([1, 2, 6])
        outs = [m.tensor([1, 2, 3]), m.tensor([1, 2, 2 if kind == 'sizes' else 3])]
        if kind == 'axis':
            ax = m.tensor([])
            m.b.inputs(ax)
            m.b.op('SPLIT', [ax, a], outs, num_splits=2)
        else:
            ax = m.tensor([1], oh.ints([2]))
            sz = m.tensor([2], oh.ints([3, 2]))
            m.b.op('SPLIT_V', [a, sz, ax], outs, num_splits=2)
        m.b.outputs(outs[0])
        path = str(tmp_path / f'{kind}.circle')
        m.b.save(path)
        with pytest.raises(PrepareError) as e:
            plan(read_model(path))
        assert path in str(e.value) and 'op 2 SPLIT' in str(e.value), str(e.value)
