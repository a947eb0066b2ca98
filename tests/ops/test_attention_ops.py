"""BATCH_MATMUL (op_bmm) and the attention block around it (issue 28): Keras's
MultiHeadAttention and a hand-written softmax(Q K^T / sqrt d) V convert to BATCH_MATMUL of
two activations with adj_x / adj_y, batched over [batch, heads] with broadcasting.

Forward against a float64 numpy reference and TFLite Micro, gradients against float64
central finite differences on the device code, and the same under unix MicroPython
(float32), with tests/support/op_harness.py's models: x[1, 3] -> FC -> RESHAPE -> OP ... ->
FC -> y, every FC and every constant operand training, so the first FCs' weight
gradients check both operands' input gradients element by element.
"""
import os

import numpy as np
import pytest

import op_harness as oh  # noqa: E402
from test_split_math_ops import tflm_infer  # noqa: E402

F32 = np.float32


def _op(x, adj):
    return np.swapaxes(x, -1, -2) if adj else x


def _bmm(m, a, b, adj_x=False, adj_y=False):
    z = np.matmul(_op(m.val[a], adj_x), _op(m.val[b], adj_y))
    return m.op('BATCH_MATMUL', [a, b], z, adjoint_lhs=adj_x, adjoint_rhs=adj_y)


def _pair(a_shape, b_shape, adj_x=False, adj_y=False, const=None):
    """a [..] times b [..]; const 0 or 1: that operand a trainable constant."""
    def build(m):
        a = m.const(a_shape) if const == 0 else m.act_input(a_shape)
        b = m.const(b_shape) if const == 1 else m.act_input(b_shape)
        return _bmm(m, a, b, adj_x, adj_y)
    return build


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attention(T, H, d):
    """softmax(Q K^T / sqrt d) V over [1, H, T, d] heads, as TFLite writes it: BATCH_MATMUL
    adj_y, MUL by a scalar, SOFTMAX over the last axis of a rank-4 tensor, BATCH_MATMUL,
    TRANSPOSE [1, T, H, d], RESHAPE [1, T, H*d]."""
    def build(m):
        q, k, v = (m.act_input([1, H, T, d]) for _ in range(3))
        s = _bmm(m, q, k, adj_y=True)
        c = m.tensor([], F32(1.0 / np.sqrt(d)))
        s = m.op('MUL', [s, c], m.val[s] * float(F32(1.0 / np.sqrt(d))),
                 fused_activation_function='NONE')
        p = m.op('SOFTMAX', [s], _softmax(m.val[s]), beta=1.0)
        o = _bmm(m, p, v)
        perm = m.tensor([4], oh.ints([0, 2, 1, 3]))
        o = m.op('TRANSPOSE', [o, perm], m.val[o].transpose(0, 2, 1, 3))
        return m.reshape(o, [1, T, H * d])
    return build


CASES = {
    'QK-adj_y-heads': _pair([1, 2, 3, 4], [1, 2, 3, 4], adj_y=True),
    'PV-heads': _pair([1, 2, 3, 3], [1, 2, 3, 4]),
    'rank3-adj_x': _pair([1, 4, 3], [1, 4, 2], adj_x=True),
    'adj-both-batch2': _pair([2, 3, 2], [2, 4, 3], adj_x=True, adj_y=True),
    'one-matrix': _pair([1, 3, 4], [1, 4, 2]),
    'b-broadcast-heads': _pair([1, 2, 3, 4], [1, 1, 4, 2]),
    'a-broadcast-batch': _pair([1, 3, 4], [2, 3, 4, 2]),
    'cross-broadcast': _pair([2, 1, 3, 4], [1, 3, 4, 2], adj_y=False),
    'const-weight-rank2': _pair([1, 2, 3, 4], [4, 5], const=1),
    'const-first-adj_x': _pair([3, 2], [1, 2, 3, 4], adj_x=True, const=0),
    'attention-T4-H2-d3': _attention(4, 2, 3),
}


def build(cid, where, seed):
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, 'model.circle')
    m = oh.Model(np.random.default_rng(seed), 1.5)
    y = m.finish(CASES[cid](m), path)
    return oh.prepared(m, y, where)


@pytest.fixture(scope='module')
def device(tmp_path_factory):
    return oh.run_device(tmp_path_factory.mktemp('attention_ops'), CASES, build, 9300)


@pytest.mark.parametrize('cid', list(CASES))
def test_forward_and_gradients(device, cid):
    oh.check_case(device, cid, 1e-10, tflm_infer, 'TFLite Micro')


def test_ops_micropython_match_float64(device, tmp_path):
    """Each case under unix MicroPython (npfallback, or ulab when $MICROPYTHON has it),
    float32, against the float64 CPython run."""
    oh.check_micropython(device, CASES, tmp_path)


def test_keras_multi_head_attention_trains(tmp_path):
    """Issue 28 (a Keras MultiHeadAttention refused at BATCH_MATMUL): the converter's
    graph (kerasgraphs.build_keras_mha: FULLY_CONNECTED keep_num_dims, RESHAPE, TRANSPOSE,
    BATCH_MATMUL, MUL by a scalar, SOFTMAX over a rank-4 tensor's last axis, MEAN) runs as
    numpy and TFLite Micro do; one SGD step of prepare's run is -lr times the gradient the
    differences of the numpy forward give for every weight (the query's and key's reach
    the loss only through Q K^T; the key's bias not at all); prepare, a run on unix MicroPython and export: TFLite
    Micro on the exported .tflite = utrain's trained forward, and it moved."""
    from kerasgraphs import build_keras_mha
    from test_rewrite import _step_is_the_gradient, tflm_infer as tflm, ops
    from test_parity import new_trainer, utrain_predict
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.target import runner
    src, forward = build_keras_mha(tmp_path / 'mha.tflite')
    assert ops(src).count('BATCH_MATMUL') == 2
    x = np.random.default_rng(1).standard_normal((8, 5, 4)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(tflm(src, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    names = ('wq', 'bq', 'wk', 'wv', 'bv', 'wo', 'bo', 'w2', 'b2')
    (tmp_path / 'step').mkdir()
    step = _step_is_the_gradient(src, forward, tmp_path / 'step', names, x)
    # the key's bias adds q . bk to a whole row of scores, which the softmax takes away
    assert np.abs(step['bk']).max() < 1e-5
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(8) % 2)
    out = tmp_path / 'run'
    prepare(src, str(out), data=str(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='adam', lr=0.05, batch=2, epochs=2, log=lambda *a: None)
    code, text = runner.run(str(out), python=runner.find_micropython() is None, stream=False)
    assert code == 0, text
    dst = tmp_path / 'trained.tflite'
    export(src, str(out / 'trained.wof'), str(dst))
    after = tflm(dst, x).reshape(ref.shape)
    got = utrain_predict(new_trainer(out / 'model.flat', out / 'trained.wof'), x, [1, 5, 4])
    np.testing.assert_allclose(got, after, rtol=1e-4, atol=1e-5)
    assert np.abs(after - ref).max() > 1e-2


@pytest.mark.parametrize('kind, says', [
    ('runs', 'broadcast in 3 alternating runs'),
    ('inner', 'matrices have 4 columns, the second\'s 3 rows'),
])
def test_batch_matmul_refusals(tmp_path, kind, says):
    """A BATCH_MATMUL whose batch axes broadcast in more runs than the device's two
    blocks, or whose inner sizes differ, is refused naming the file, the op and what to
    do."""
    from host_tools.graph.passes import PrepareError, plan
    from host_tools.formats.circle_io import read_model
    m = oh.Model(np.random.default_rng(0))
    if kind == 'runs':
        a, b, y = m.act_input([2, 1, 2, 3, 4]), m.act_input([1, 2, 1, 4, 3]), [2, 2, 2, 3, 3]
    else:
        a, b, y = m.act_input([1, 2, 3, 4]), m.act_input([1, 2, 3, 4]), [1, 2, 3, 4]
    out = m.tensor(y)
    m.b.op('BATCH_MATMUL', [a, b], [out])
    m.b.outputs(out)
    path = str(tmp_path / f'{kind}.circle')
    m.b.save(path)
    with pytest.raises(PrepareError) as e:
        plan(read_model(path))
    assert path in str(e.value) and 'BATCH_MATMUL' in str(e.value) and says in str(e.value), str(e.value)
