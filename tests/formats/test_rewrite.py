"""The exporter-output passes (host_tools/graph/rewrite.py and its pass modules), each checked by equivalence: the
rewritten graph, written back to circle, gives ONERT the same outputs as the original on
random inputs.  Models come from tico (PyTorch -> circle) as it really emits them, and
from circle_build for the shapes tico does not produce (MEAN without keep_dims, a
constant first operand, SUB/DIV, transposes that cannot cancel, int8 models).

What tico 0.3.0 (torch 2.13) emits, module by module (eval mode; input NCHW):
  Conv2d, C_in>1   TRANSPOSE(0,2,3,1) CONV_2D TRANSPOSE(0,3,1,2)    (bias=False: zero bias)
  Conv2d, C_in=1   RESHAPE([1,H,W,1]) CONV_2D TRANSPOSE(0,3,1,2)
  BatchNorm2d      MUL [1,C,1,1], ADD [1,C,1,1] (the ADD is left out when the shift is 0;
                   a following ReLU/ReLU6 is fused into the last of them)
  ReLU / ReLU6     RELU / RELU6 (NCHW, after the conv's TRANSPOSE), or fused as above
  MaxPool2d / AvgPool2d   MAX_POOL_2D / AVERAGE_POOL_2D, NHWC, no transposes around them
  AdaptiveAvgPool2d(1)    MEAN axes [-1,-2] keep_dims (NCHW)
  Flatten          RESHAPE [1, C*H*W] of the NCHW map
  Linear           FULLY_CONNECTED (keep_num_dims true)
  depthwise Conv2d (groups=C)  TRANSPOSE DEPTHWISE_CONV_2D [1,3,3,C] TRANSPOSE
  train mode       BatchNorm2d is refused (_native_batch_norm_legit_functional is not
                   supported); models without BatchNorm export as in eval mode.
"""
import os
import re
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.graph import rewrite as rw  # noqa: E402
from host_tools.graph.inout import compact, save_graph
from host_tools.graph.transposes import hoist_input_transpose
from host_tools.graph.qparams import quantize
from host_tools.graph.spellings import splits_to_slices
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from onert_ref import onert_infer  # noqa: E402
from stepcheck import step_is_the_gradient as _step_is_the_gradient  # noqa: E402
from kerasgraphs import (build_keras_shapes, build_keras_rnn, build_keras_upsample,  # noqa: E402
                         build_keras_layernorm)

torch = pytest.importorskip('torch')
nn = torch.nn


def _same_as_torch(m, dst, perm, shape=(4, 3, 8, 8)):
    """ONERT on the rewritten model dst (its input laid out by perm) = PyTorch module m on
    samples of shape (NCHW); returns the samples."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    got = onert_infer(dst, np.ascontiguousarray(x.transpose(perm)))
    assert np.abs(ref).max() > 1e-2
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    return x


def tico_convert(model, shape, path, seed=0):
    import tico
    torch.manual_seed(seed)
    for m in model.modules():          # non-trivial BatchNorm statistics and affine
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)
    model.eval()
    tico.convert(model, (torch.randn(*shape),)).save(os.fspath(path))
    return os.fspath(path)


def ops(path_or_graph):
    g = read_model(path_or_graph) if isinstance(path_or_graph, (str, os.PathLike)) else path_or_graph
    return [op.name for op in g.ops]


def rewritten(src, dst, keep=(), hoist=False):
    """Run the passes on src and write the result to dst; returns (dst, info, perm)."""
    g = read_model(src)
    keep_ops = [g.ops[i] for i in keep]
    info = rw.rewrite(g, keep_ops)
    perm = hoist_input_transpose(g) if hoist else None
    compact(g)
    save_graph(g, dst)
    return os.fspath(dst), info, perm


def assert_same_outputs(src, dst, perm=None, n=6, seed=1, tol=1e-5):
    g = read_model(src)
    shape = g.tensors[g.inputs[0]].shape
    x = np.random.default_rng(seed).standard_normal([n] + shape[1:]).astype(np.float32)
    ref = onert_infer(src, x)
    xd = x if perm is None else np.ascontiguousarray(x.transpose(perm))
    got = onert_infer(dst, xd)
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max())
    assert err <= tol * max(1.0, float(np.abs(ref).max())), f'max err {err:.3e}'
    assert float(np.abs(ref).max()) > 1e-3          # the comparison is not of zeros
    return err


# --------------------------------------------------------------------------- tico's output

def test_tico_cnn_from_the_issue(tmp_path):
    """Conv2d(1,4,3,p=1)-BatchNorm2d-ReLU-MaxPool2d-depthwise-ReLU6-AdaptiveAvgPool2d(1)-
    Flatten-Linear, default BatchNorm init, eval: exactly the ops listed in the issue, and
    after the passes a plain NHWC graph without any TRANSPOSE."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.ReLU6(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()
    import tico
    src = os.fspath(tmp_path / 'cnn.circle')
    tico.convert(m, (torch.randn(1, 1, 8, 8),)).save(src)
    assert ops(src) == ['RESHAPE', 'CONV_2D', 'TRANSPOSE', 'MUL', 'TRANSPOSE', 'MAX_POOL_2D',
                        'DEPTHWISE_CONV_2D', 'TRANSPOSE', 'RELU6', 'MEAN', 'RESHAPE',
                        'FULLY_CONNECTED']
    dst, info, _ = rewritten(src, tmp_path / 'nhwc.circle')
    g = read_model(dst)
    assert ops(g) == ['RESHAPE', 'CONV_2D', 'MAX_POOL_2D', 'DEPTHWISE_CONV_2D', 'RELU6',
                      'MEAN', 'RESHAPE', 'FULLY_CONNECTED']
    assert g.ops[1].options['fused_activation_function'] == 'RELU'     # the MUL's
    mean = g.ops[5]
    assert sorted(g.tensors[mean.inputs[1]].data.tolist()) == [1, 2]
    assert info['batchnorm'] == 1
    assert_same_outputs(src, dst)
    # the PyTorch model agrees too (the oracle sees the same function)
    x = np.random.default_rng(3).standard_normal((4, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    assert np.abs(onert_infer(dst, x) - ref).max() <= 1e-5


TICO_MODELS = {
    'conv3': (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)), (1, 3, 8, 8)),
    'conv-nobias-bn-relu': (lambda: nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False),
                                                  nn.BatchNorm2d(4), nn.ReLU()), (1, 3, 8, 8)),
    'conv-relu6-avgpool': (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU6(),
                                                 nn.AvgPool2d(2)), (1, 3, 8, 8)),
    'conv-flatten-linear': (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(),
                                                  nn.Linear(144, 5)), (1, 3, 8, 8)),
    'bn-alone': (lambda: nn.Sequential(nn.BatchNorm2d(3), nn.Conv2d(3, 2, 1)), (1, 3, 8, 8)),
    'mobilenet-block': (lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6(),
        nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)), (1, 3, 16, 16)),
}


@pytest.mark.parametrize('name', list(TICO_MODELS))
def test_tico_models_rewrite_equivalent(tmp_path, name):
    make, shape = TICO_MODELS[name]
    src = tico_convert(make(), shape, tmp_path / 'src.circle')
    assert 'TRANSPOSE' in ops(src)
    dst, info, perm = rewritten(src, tmp_path / 'dst.circle', hoist=True)
    g = read_model(dst)
    # no TRANSPOSE left, except one making an NCHW model output (conv3 ends in the conv)
    assert [op.name for op in g.ops if op.name == 'TRANSPOSE' and
            op.outputs[0] not in g.outputs] == [], ops(g)
    assert perm == [0, 2, 3, 1]             # NCHW input with C > 1 -> the model takes NHWC
    assert read_model(dst).tensors[read_model(dst).inputs[0]].shape == \
        [shape[0], shape[2], shape[3], shape[1]]
    assert_same_outputs(src, dst, perm=perm)
    # every BatchNorm folded (nothing trains), except one with no layer before it
    assert not {'MUL', 'ADD'} & set(ops(dst)) or name == 'bn-alone'


def test_batchnorm_kept_where_the_layer_trains(tmp_path):
    make, shape = TICO_MODELS['mobilenet-block']
    src = tico_convert(make(), shape, tmp_path / 'src.circle')
    names = ops(src)
    # train the pointwise conv (last CONV_2D) and what follows
    last_conv = max(i for i, n in enumerate(names) if n == 'CONV_2D')
    keep = range(last_conv, len(names))
    dst, info, perm = rewritten(src, tmp_path / 'dst.circle', keep=keep, hoist=True)
    after = ops(dst)
    assert 'TRANSPOSE' not in after
    assert info['batchnorm'] == 4           # dw and first conv: MUL+ADD each folded
    assert after.count('MUL') == 1 and after.count('ADD') == 1
    i = after.index('MUL')
    assert after[i - 1] == 'CONV_2D' and after[i + 1] == 'ADD'
    assert_same_outputs(src, dst, perm=perm)


class _Gate(nn.Module):
    """relu(a(x) * b(x)) - x: a MUL and a SUB of two NCHW maps (x read by three ops)."""

    def __init__(self, c):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.a(x) * self.b(x)) - x


def test_tico_residual_blocks_lose_their_transposes(tmp_path):
    """Issue 28: ResNet-8's blocks as tico exports them (bench/zoo/nets.py: an identity
    and a strided 1x1-conv shortcut, BatchNorm, a fused-ReLU residual ADD) and a gate
    (MUL and SUB of two NCHW branches): each conv is wrapped in TRANSPOSEs, and the
    binary ops read two transposed maps.  After the passes no TRANSPOSE is left (the
    input's moves into the input); ONERT on the rewrite = PyTorch; prepare trains it:
    the gradient reaches every conv."""
    from bench.zoo.nets import Residual, _cbr
    torch.manual_seed(0)
    m = nn.Sequential(Residual(3, 8, 2), _Gate(8),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    src = tico_convert(m, (1, 3, 8, 8), tmp_path / 'res.circle')
    before = ops(src)
    assert before.count('TRANSPOSE') == 10 and before.count('ADD') >= 2, before
    dst, info, perm = rewritten(src, tmp_path / 'nhwc.circle', hoist=True)
    after = ops(dst)
    assert 'TRANSPOSE' not in after and perm == [0, 2, 3, 1], after
    assert after.count('ADD') == 1 and after.count('MUL') == after.count('SUB') == 1, after
    _same_as_torch(m, dst, perm)

    xs = np.random.default_rng(2).standard_normal((8, 3, 8, 8)).astype(np.float32)
    s, moved = _trained_names(src, tmp_path, xs, np.arange(8) % 3, loss='scce',
                              from_logits=True)
    g = read_model(tmp_path / 'run' / s['rewritten'])
    assert 'TRANSPOSE' not in ops(g)
    convs = {g.tensors[op.inputs[1]].name for op in g.ops if op.name == 'CONV_2D'}
    assert len(convs) == 5 and convs <= moved, (convs, moved)


class _SiluNCL(nn.Module):
    """PyTorch 1-D and 2-D conv heads as a new user writes them: a dilated Conv1d, a
    strided Conv1d, SiLU (x * sigmoid(x): LOGISTIC and MUL both read the NCL map) and
    x.mean(-1); or a Conv2d, SiLU and x.mean((2, 3))."""

    def __init__(self, two_d):
        super().__init__()
        conv = nn.Conv2d if two_d else nn.Conv1d
        self.c1 = conv(3, 6, 3, dilation=2, padding=2)
        self.c2 = conv(6, 8, 3, stride=2)
        self.fc = nn.Linear(8, 3)
        self.axes = (2, 3) if two_d else -1

    def forward(self, x):
        h = nn.functional.silu(self.c2(torch.relu(self.c1(x))))
        return self.fc(h.mean(dim=self.axes))


@pytest.mark.parametrize('two_d', [False, True])
def test_tico_silu_and_mean_of_an_ncl_map_lose_their_transposes(tmp_path, two_d):
    """Issue 28 (a new user's Conv1d): tico ends each conv in a TRANSPOSE back to NCL
    (NCHW), a Conv1d's through a RESHAPE dropping the width of 1, and SiLU reads the
    map twice; the transpose had stayed (the sink took one reader and no reshape), so
    the MEAN reduced the last axis of [1, C, L], which int8 training refuses (`prepare
    --int8` and a board without ulab: 'reduces axes [2] of [1, 8, 14]').  After the
    passes no TRANSPOSE follows a conv, ONERT on the rewrite = PyTorch, and the float
    model trains as int8."""
    from host_tools.prepare.pipeline import prepare
    torch.manual_seed(0)
    m = _SiluNCL(two_d).eval()
    shape = (1, 3, 12, 12) if two_d else (1, 3, 32)
    src = tico_convert(m, shape, tmp_path / 'src.circle')
    dst, info, perm = rewritten(src, tmp_path / 'dst.circle', hoist=True)
    g = read_model(dst)
    convs = [i for i, op in enumerate(g.ops) if op.name == 'CONV_2D']
    assert 'TRANSPOSE' not in ops(g)[convs[0]:], ops(g)
    x = np.random.default_rng(3).standard_normal((4,) + shape[1:]).astype(np.float32)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    got = onert_infer(dst, x if perm is None else np.ascontiguousarray(x.transpose(perm)))
    assert np.abs(ref).max() > 1e-2
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    xs = np.random.default_rng(2).standard_normal((16,) + shape[1:]).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=np.arange(16) % 3)
    s = prepare(src, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),
                epochs=1, int8=True, log=lambda *a: None)
    assert s['int8'] is True


class _Grouped(nn.Module):
    """Grouped Conv2d (groups 2, then 4), Hardswish (x * relu6(x + 3) / 6: ADD and MUL
    read the map), ReLU, AdaptiveAvgPool2d(1), flatten, Linear; 4x8x8 NCHW."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(4, 8, 3, padding=1, groups=2)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=4)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.c2(nn.functional.hardswish(self.c1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


def test_tico_grouped_convs_lose_their_transposes_and_train_as_int8(tmp_path):
    """Issue 28: tico writes a grouped Conv2d as a STRIDED_SLICE of the NCHW map per
    group, each wrapped in TRANSPOSEs around its CONV_2D, and a CONCATENATION on the
    channel axis: 14 TRANSPOSEs stayed in the run and the MEAN reduced NCHW's [2, 3],
    refused by --int8.  After the passes no TRANSPOSE is left (the input takes NHWC),
    ONERT on the rewrite = PyTorch; the model (trained in torch on separable data)
    trains as int8 with the samples laid out NHWC: its int8 accuracy before training is
    PyTorch's (a wrong layout had scored chance)."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    torch.manual_seed(0)
    m = _Grouped()
    rng = np.random.default_rng(4)
    protos = rng.standard_normal((3, 4, 8, 8))
    y = np.arange(48) % 3
    x = (protos[y] + 1.5 * rng.standard_normal((48, 4, 8, 8))).astype(np.float32)
    opt = torch.optim.Adam(m.parameters(), lr=0.02)
    for _ in range(40):
        opt.zero_grad()
        nn.functional.cross_entropy(m(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    src = tico_convert(m, (1, 4, 8, 8), tmp_path / 'src.circle')
    assert ops(src).count('TRANSPOSE') >= 12, ops(src)
    dst, info, perm = rewritten(src, tmp_path / 'dst.circle', hoist=True)
    assert 'TRANSPOSE' not in ops(dst) and perm == [0, 2, 3, 1], ops(dst)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    g = read_model(dst)
    splits_to_slices(g)          # (ONERT 0.1.0's SPLIT_V pieces are wrong: evaluate's way)
    got = onert_infer(save_graph(g, tmp_path / 'onert.circle'),
                      np.ascontiguousarray(x.transpose(perm)))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    acc = float((ref.argmax(1) == y).mean())
    assert acc > 0.8, acc
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    s = prepare(src, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),
                test_split=0.5, epochs=1, int8=True, log=lambda *a: None)
    assert s['int8'] is True and s['input_perm'] == [0, 2, 3, 1]
    code, text = runner.run(os.fspath(tmp_path / 'run'), python=True, stream=False)
    assert code == 0, text
    before = float(re.search(r'before training: .*test_accuracy ([0-9.]+)', text).group(1))
    assert before >= acc - 0.15, (before, acc, text)


class _SE(nn.Module):
    """A squeeze-excite block (MobileNetV3's): h * sigmoid(fc(relu(fc(h.mean((2, 3))))))
    [:, :, None, None], the NCHW map read by a MEAN and by the MUL with a [1, C, 1, 1]."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.f1, self.f2, self.fc = nn.Linear(8, 4), nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        w = torch.sigmoid(self.f2(torch.relu(self.f1(h.mean(dim=(2, 3))))))
        return self.fc((h * w[:, :, None, None]).mean(dim=(2, 3)))


def test_tico_squeeze_excite_loses_its_transposes(tmp_path):
    """Issue 28: the MUL of a transposed map by a [1, C, 1, 1] activation (not a
    constant) had stopped the sink, so a TRANSPOSE stayed and the MEANs reduced NCHW's
    [2, 3] (refused by --int8).  The vector is the same values as [1, 1, 1, C] (a
    RESHAPE); no TRANSPOSE is left, ONERT on the rewrite = PyTorch, --int8 prepares."""
    from host_tools.prepare.pipeline import prepare
    torch.manual_seed(0)
    m = _SE().eval()
    src = tico_convert(m, (1, 3, 8, 8), tmp_path / 'src.circle')
    dst, info, perm = rewritten(src, tmp_path / 'dst.circle', hoist=True)
    assert 'TRANSPOSE' not in ops(dst) and perm == [0, 2, 3, 1], ops(dst)
    x = _same_as_torch(m, dst, perm)
    np.savez(tmp_path / 'd.npz', x=np.concatenate([x] * 4), y=np.arange(16) % 3)
    s = prepare(src, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),
                epochs=1, int8=True, log=lambda *a: None)
    assert s['int8'] is True


# --------------------------------------------------------------------------- built graphs

def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _perm_const(b, name, p):
    return b.tensor(name, [len(p)], data=np.array(p, np.int32))


def build_nchw_chain(path, keep_dims=True, const_first=False, seed=0):
    """x NHWC -> CONV -> TRANSPOSE(NCHW) -> SUB const -> MUL const(first operand?) ->
    LOGISTIC -> MEAN([2,3]) -> (RESHAPE) -> FC."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    x = b.tensor('x', [1, 6, 6, 2])
    w = b.tensor('w', [3, 3, 3, 2], data=_rand(rng, 3, 3, 3, 2))
    bias = b.tensor('b', [3], data=_rand(rng, 3))
    c = b.tensor('c', [1, 6, 6, 3])
    b.op('CONV_2D', [x, w, bias], [c], padding='SAME')
    t = b.tensor('t', [1, 3, 6, 6])
    b.op('TRANSPOSE', [c, _perm_const(b, 'p', [0, 3, 1, 2])], [t])
    s = b.tensor('s', [1, 3, 6, 6])
    b.op('SUB', [t, b.tensor('k1', [3, 1, 1], data=_rand(rng, 3, 1, 1))], [s])
    m = b.tensor('m', [1, 3, 6, 6])
    k2 = b.tensor('k2', [1, 3, 1, 1], data=_rand(rng, 1, 3, 1, 1))
    b.op('MUL', [k2, s] if const_first else [s, k2], [m])
    lg = b.tensor('lg', [1, 3, 6, 6])
    b.op('LOGISTIC', [m], [lg])
    # negative axes as tico writes them (ONERT refuses them without keep_dims)
    axes = b.tensor('axes', [2], data=np.array([-1, 2] if keep_dims else [2, 3], np.int32))
    if keep_dims:
        mean = b.tensor('mean', [1, 3, 1, 1])
        b.op('MEAN', [lg, axes], [mean], keep_dims=True)
        flat = b.tensor('flat', [1, 3])
        b.op('RESHAPE', [mean], [flat], new_shape=[1, 3])
    else:
        flat = b.tensor('mean', [1, 3])
        b.op('MEAN', [lg, axes], [flat], keep_dims=False)
    y = b.tensor('y', [1, 2])
    b.op('FULLY_CONNECTED', [flat, b.tensor('fw', [2, 3], data=_rand(rng, 2, 3)),
                             b.tensor('fb', [2], data=_rand(rng, 2))], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(path)


@pytest.mark.parametrize('keep_dims', [True, False])
@pytest.mark.parametrize('const_first', [False, True])
def test_sink_through_elementwise_and_mean(tmp_path, keep_dims, const_first):
    src = build_nchw_chain(tmp_path / 's.circle', keep_dims, const_first)
    dst, info, _ = rewritten(src, tmp_path / 'd.circle')
    assert 'TRANSPOSE' not in ops(dst) and info['transposes'] >= 4
    # SUB and MUL end up right after the conv: folded into it
    assert ops(dst) == ['CONV_2D', 'LOGISTIC', 'MEAN'] + ['RESHAPE'] * keep_dims + \
        ['FULLY_CONNECTED']
    # ONERT refuses MEAN without keep_dims on the NCHW map ("ShapeValidator failed"):
    # the reference is then the same function with keep_dims and a RESHAPE
    ref = src if keep_dims else build_nchw_chain(tmp_path / 'r.circle', True, const_first)
    assert_same_outputs(ref, dst)


def test_flatten_folded_into_fc_and_stuck_transpose_stays(tmp_path):
    """TRANSPOSE -> RESHAPE -> FC becomes RESHAPE -> FC with permuted columns; a
    TRANSPOSE feeding a conv (not layout-agnostic) stays, and the graph stays correct."""
    rng = np.random.default_rng(4)
    b = CircleBuilder()
    x = b.tensor('x', [1, 4, 5, 2])
    t0 = b.tensor('t0', [1, 5, 4, 2])
    b.op('TRANSPOSE', [x, _perm_const(b, 'p0', [0, 2, 1, 3])], [t0])
    c = b.tensor('c', [1, 5, 4, 3])
    b.op('CONV_2D', [t0, b.tensor('w', [3, 1, 1, 2], data=_rand(rng, 3, 1, 1, 2)),
                     b.tensor('cb', [3], data=_rand(rng, 3))], [c])
    t = b.tensor('t', [1, 3, 5, 4])
    b.op('TRANSPOSE', [c, _perm_const(b, 'p', [0, 3, 1, 2])], [t])
    f = b.tensor('f', [1, 60])
    b.op('RESHAPE', [t], [f], new_shape=[1, 60])
    y = b.tensor('y', [1, 4])
    b.op('FULLY_CONNECTED', [f, b.tensor('fw', [4, 60], data=_rand(rng, 4, 60)),
                             b.tensor('fb', [4], data=_rand(rng, 4))], [y])
    b.inputs(x)
    b.outputs(y)
    src = b.save(tmp_path / 's.circle')
    dst, info, _ = rewritten(src, tmp_path / 'd.circle')
    assert ops(dst) == ['TRANSPOSE', 'CONV_2D', 'RESHAPE', 'FULLY_CONNECTED']
    assert_same_outputs(src, dst)


def test_transpose_pair_and_output_transpose(tmp_path):
    """Two transposes composing to the identity vanish; a graph ending in RELU after a
    transpose keeps its output (the transpose sinks to the end and stays)."""
    b = CircleBuilder()
    x = b.tensor('x', [1, 2, 3, 4])
    a = b.tensor('a', [1, 4, 2, 3])
    b.op('TRANSPOSE', [x, _perm_const(b, 'p1', [0, 3, 1, 2])], [a])
    r = b.tensor('r', [1, 4, 2, 3])
    b.op('RELU', [a], [r])
    c = b.tensor('c', [1, 2, 3, 4])
    b.op('TRANSPOSE', [r, _perm_const(b, 'p2', [0, 2, 3, 1])], [c])
    d = b.tensor('d', [1, 2, 3, 4])
    b.op('TANH', [c], [d])
    e = b.tensor('e', [1, 3, 2, 4])
    b.op('TRANSPOSE', [d, _perm_const(b, 'p3', [0, 2, 1, 3])], [e])
    y = b.tensor('y', [1, 3, 2, 4])
    b.op('RELU6', [e], [y])
    b.inputs(x)
    b.outputs(y)
    src = b.save(tmp_path / 's.circle')
    dst, _, _ = rewritten(src, tmp_path / 'd.circle')
    assert ops(dst) == ['RELU', 'TANH', 'RELU6', 'TRANSPOSE']
    assert_same_outputs(src, dst)


@pytest.mark.parametrize('layer', ['CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED'])
def test_fold_batchnorm_mul_div_add_sub(tmp_path, layer):
    rng = np.random.default_rng(7)
    b = CircleBuilder()
    if layer == 'FULLY_CONNECTED':
        x = b.tensor('x', [1, 5])
        w = b.tensor('w', [4, 5], data=_rand(rng, 4, 5))
        shape = [1, 4]
    elif layer == 'CONV_2D':
        x = b.tensor('x', [1, 5, 5, 2])
        w = b.tensor('w', [4, 3, 3, 2], data=_rand(rng, 4, 3, 3, 2))
        shape = [1, 5, 5, 4]
    else:
        x = b.tensor('x', [1, 5, 5, 2])
        w = b.tensor('w', [1, 3, 3, 4], data=_rand(rng, 1, 3, 3, 4))
        shape = [1, 5, 5, 4]
    h = b.tensor('h', shape)
    opts = {'padding': 'SAME'} if layer != 'FULLY_CONNECTED' else {}
    if layer == 'DEPTHWISE_CONV_2D':
        opts['depth_multiplier'] = 2
    # FC without bias: the ADD makes one (ONERT's conv kernels need a bias input)
    bias = -1 if layer == 'FULLY_CONNECTED' else b.tensor('b', [4], data=_rand(rng, 4))
    b.op(layer, [x, w, bias], [h], **opts)
    cur = h
    for i, opn in enumerate(['MUL', 'ADD', 'DIV', 'SUB']):
        k = rng.uniform(0.5, 2, 4).astype(np.float32).reshape([1] * (len(shape) - 1) + [4])
        nxt = b.tensor(f'o{i}', shape)
        b.op(opn, [cur, b.tensor(f'k{i}', k.shape, data=k)], [nxt],
             fused_activation_function='RELU' if opn == 'SUB' else 'NONE')
        cur = nxt
    b.inputs(x)
    b.outputs(cur)
    src = b.save(tmp_path / 's.circle')
    dst, info, _ = rewritten(src, tmp_path / 'd.circle')
    assert ops(dst) == [layer] and info['batchnorm'] == 4
    assert read_model(dst).ops[0].options['fused_activation_function'] == 'RELU'
    assert_same_outputs(src, dst)
    # kept when the layer trains: nothing folds, the graph is unchanged
    dst2, info2, _ = rewritten(src, tmp_path / 'k.circle', keep=[0])
    assert info2['batchnorm'] == 0 and ops(dst2) == ops(src)


# --------------------------------------------------------------------------- quantized

def build_int8_mlp(path, seed=0, identifier=b'TFL3'):
    """float input -> QUANTIZE -> int8 FC(RELU) -> int8 FC -> DEQUANTIZE -> float output:
    a TFLite-Micro-style full-integer model (per-channel weight scales, int32 biases),
    activation ranges calibrated on inputs in [-1.5, 1.5] as a converter does."""
    rng = np.random.default_rng(seed)
    w1 = rng.integers(-127, 128, (8, 6)).astype(np.int8)
    s1 = rng.uniform(0.002, 0.006, 8)
    sx, zx = 3.0 / 255, 0
    b1 = rng.integers(-2000, 2000, 8).astype(np.int32)
    w2 = rng.integers(-127, 128, (3, 8)).astype(np.int8)
    s2 = 0.004
    calib = rng.uniform(-1.5, 1.5, (512, 6))
    hf = np.maximum(calib @ (w1 * s1[:, None]).T + b1 * s1 * sx, 0)
    sh, zh = 1.5 * hf.max() / 255, -128            # headroom: no clipping in the test
    b2 = rng.integers(-500, 500, 3).astype(np.int32)
    of = hf @ (w2 * s2).T + b2 * s2 * sh
    so = 1.5 * (of.max() - of.min()) / 255
    zo = int(round(-128 - 1.25 * of.min() / so))
    b = CircleBuilder(identifier=identifier)
    x = b.tensor('x', [1, 6])
    xq = b.tensor('xq', [1, 6], dtype=np.int8, quant={'scale': [sx], 'zero_point': [zx]})
    b.op('QUANTIZE', [x], [xq])
    tw1 = b.tensor('w1', [8, 6], data=w1, quant={'scale': list(s1), 'zero_point': [0] * 8,
                                                  'quantized_dimension': 0})
    tb1 = b.tensor('b1', [8], data=b1, quant={'scale': list(s1 * sx), 'zero_point': [0] * 8})
    h = b.tensor('h', [1, 8], dtype=np.int8, quant={'scale': [sh], 'zero_point': [zh]})
    b.op('FULLY_CONNECTED', [xq, tw1, tb1], [h], fused_activation_function='RELU')
    tw2 = b.tensor('w2', [3, 8], data=w2, quant={'scale': [s2], 'zero_point': [0]})
    tb2 = b.tensor('b2', [3], data=b2, quant={'scale': [s2 * sh], 'zero_point': [0]})
    oq = b.tensor('oq', [1, 3], dtype=np.int8, quant={'scale': [so], 'zero_point': [zo]})
    b.op('FULLY_CONNECTED', [h, tw2, tb2], [oq])
    y = b.tensor('y', [1, 3])
    b.op('DEQUANTIZE', [oq], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return os.fspath(path), so


def tflm_infer(path, x):
    from tflite_micro.python.tflite_micro import runtime
    interp = runtime.Interpreter.from_file(os.fspath(path))
    out = []
    for i in range(len(x)):
        interp.set_input(np.ascontiguousarray(x[i:i + 1], np.float32), 0)
        interp.invoke()
        out.append(np.array(interp.get_output(0), np.float64))
    return np.concatenate(out)


def test_dequantize_int8_model(tmp_path):
    src, step = build_int8_mlp(tmp_path / 'q.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'f.circle')
    g = read_model(dst)
    assert ops(g) == ['FULLY_CONNECTED', 'FULLY_CONNECTED']
    assert all(t.dtype in ('float32', 'int32') for t in g.tensors)
    assert all(t.dtype == 'float32' for t in g.tensors if t.data is None)
    assert info['dequantized'] == 7           # 4 constants, 3 activations
    x = np.random.default_rng(5).uniform(-1.5, 1.5, (16, 6)).astype(np.float32)
    ref = tflm_infer(src, x)                   # the int8 model as TFLite Micro runs it
    got = onert_infer(dst, x)
    # the float graph differs only by the activations' rounding: a few output steps
    assert np.abs(got - ref).max() <= 2 * step, (np.abs(got - ref).max(), step)
    assert np.abs(ref).max() > 0.2
    # the weights are exactly the dequantized integers, and quantize back to them
    q = read_model(src)
    for name in ('w1', 'b1', 'w2', 'b2'):
        tq = next(t for t in q.tensors if t.name == name)
        tf = next(t for t in g.tensors if t.name == name)
        back, clipped = quantize(tf.data, tq.quant, tq.dtype)
        assert clipped == 0 and np.array_equal(back, tq.data)


def test_int8_model_trains_and_exports_requantized(tmp_path):
    """prepare dequantizes the int8 model; training matches ONERT training of the
    dequantized float graph; `export --quantized` writes the original int8 model with the
    trained weights quantized again, which TFLite Micro runs to the float export's
    outputs within a few quantization steps."""
    import subprocess
    from host_tools.formats.circle_io import tensor_data
    from host_tools.prepare.pipeline import prepare
    from host_tools.target.runner import run
    from onert_ref import onert_train
    src, step = build_int8_mlp(tmp_path / 'q.tflite')
    rng = np.random.default_rng(9)
    x = rng.uniform(-1.2, 1.2, (32, 6)).astype(np.float32)
    y = np.tanh(x[:, :3] - x[:, 3:]).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = tmp_path / 'run'
    s = prepare(src, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd',
                lr=0.05, batch=4, epochs=1, train='last:2', dequantize=True)  # ops of the int8 model: Q FC FC DQ
    assert s['rewrites']['dequantized'] == 7 and (d / 'rewritten.circle').exists()
    code, text = run(os.fspath(d), python=True, stream=False)
    assert code == 0, text
    fl = os.fspath(d / 'rewritten.circle')
    ref = tensor_data(onert_train(fl, x, y, loss='mse', lr=0.05, batch=4, trainable_ops=1,
                                  out_path=tmp_path / 'o.circle'))
    w0 = tensor_data(fl)
    env = dict(os.environ, PYTHONPATH=ROOT)
    outs = {}
    for flag in ('', '--quantized'):
        out = os.fspath(tmp_path / f'e{flag}.tflite')
        p = subprocess.run([sys.executable, '-m', 'host_tools', 'export', src,
                            os.fspath(d / 'trained.wof'), '-o', out] + ([flag] if flag else []),
                           cwd=ROOT, env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
        outs[flag] = out
    got = tensor_data(outs[''])
    g = read_model(fl)
    trained = [t.index for t in g.tensors if t.name in ('w2', 'b2')]
    for k in trained:
        err = np.abs(got[k] - ref[k]).max() / np.abs(ref[k]).max()
        moved = np.abs(ref[k] - w0[k]).max() / np.abs(ref[k]).max()
        assert err <= 1e-4 and moved >= 1e-2, (g.tensors[k].name, err, moved)
    q = read_model(outs['--quantized'])
    assert [t.dtype for t in q.tensors] == [t.dtype for t in read_model(src).tensors]
    xt = rng.uniform(-1.2, 1.2, (16, 6)).astype(np.float32)
    yq = tflm_infer(outs['--quantized'], xt)
    yf = onert_infer(outs[''], xt)
    assert np.abs(yq - yf).max() <= 3 * step
    assert np.abs(yq - tflm_infer(src, xt)).max() > 3 * step     # it did change


def test_int8_flatten_of_a_transposed_map_exports_requantized_as_trained(tmp_path):
    """An int8 model whose conv map is flattened through a TRANSPOSE (a PyTorch CNN
    converted NHWC: TRANSPOSE to NCHW, RESHAPE, FC) trains dequantized; `export
    --quantized` writes the trained weights by name into the int8 file, whose TRANSPOSE
    is still there: the FC's weight must go back in the file's column order.
    cancel_transposes had folded the TRANSPOSE into that weight in place (its columns
    permuted, under its own name), and the exported int8 model answered another model's
    outputs (off by many output steps from the trained float export)."""
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.target.runner import run
    rng = np.random.default_rng(3)
    H, W, C, O = 2, 3, 4, 3
    wc, w2 = 0.5 * _rand(rng, C, 1, 1, C), 0.3 * _rand(rng, O, C * H * W)
    x = rng.uniform(-1.2, 1.2, (64, H, W, C)).astype(np.float32)
    sx, swc, s2 = 1.2 / 127, np.abs(wc).max() / 127, np.abs(w2).max() / 127
    qc, q2 = np.round(wc / swc).astype(np.int8), np.round(w2 / s2).astype(np.int8)
    c = x @ (qc[:, 0, 0, :] * swc).T
    o = c.transpose(0, 3, 1, 2).reshape(len(x), -1) @ (q2 * s2).T
    sc, so = 1.5 * np.abs(c).max() / 127, 1.5 * np.abs(o).max() / 127
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s: {'scale': [float(s)], 'zero_point': [0]}     # noqa: E731
    xf, xq = b.tensor('x', [1, H, W, C]), b.tensor('xq', [1, H, W, C], dtype=np.int8, quant=q(sx))
    b.op('QUANTIZE', [xf], [xq])
    ct = b.tensor('c', [1, H, W, C], dtype=np.int8, quant=q(sc))
    b.op('CONV_2D', [xq, b.tensor('wc', [C, 1, 1, C], data=qc, quant=q(swc)),
                     b.tensor('bc', [C], data=np.zeros(C, np.int32), quant=q(sx * swc))], [ct],
         padding='VALID', stride_w=1, stride_h=1, fused_activation_function='NONE')
    t = b.tensor('t', [1, C, H, W], dtype=np.int8, quant=q(sc))
    b.op('TRANSPOSE', [ct, _perm_const(b, 'perm', [0, 3, 1, 2])], [t])
    f = b.tensor('f', [1, C * H * W], dtype=np.int8, quant=q(sc))
    b.op('RESHAPE', [t, _perm_const(b, 'shape', [1, C * H * W])], [f], new_shape=[1, C * H * W])
    oq = b.tensor('oq', [1, O], dtype=np.int8, quant=q(so))
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', [O, C * H * W], data=q2, quant=q(s2)),
                             b.tensor('b2', [O], data=np.zeros(O, np.int32), quant=q(sc * s2))],
         [oq])
    y = b.tensor('y', [1, O])
    b.op('DEQUANTIZE', [oq], [y])
    b.inputs(xf)
    b.outputs(y)
    src = b.save(tmp_path / 'q.tflite')
    np.savez(tmp_path / 'd.npz', x=x[:16], y=np.tanh(o[:16] + 0.5).astype(np.float32))
    d = os.fspath(tmp_path / 'run')
    prepare(src, d, data=os.fspath(tmp_path / 'd.npz'), loss='mse', optimizer='sgd', lr=0.1,
            batch=4, epochs=2, train='all', dequantize=True, log=lambda *a: None)
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    outs = {}
    for quantized in (False, True):
        outs[quantized] = os.fspath(tmp_path / f'e{int(quantized)}.tflite')
        export(src, os.path.join(d, 'trained.wof'), outs[quantized], quantized=quantized)
    xt = x[16:32]
    yq, yf = tflm_infer(outs[True], xt), onert_infer(outs[False], xt)
    assert np.abs(yq - tflm_infer(src, xt)).max() > 4 * so          # (it trained)
    assert np.abs(yq - yf).max() <= 4 * so, (np.abs(yq - yf).max(), so)


def test_prepare_names_ops_as_the_file_numbers_them(tmp_path):
    """The rewrites drop a transpose pair ahead of an op utrain cannot train: prepare's
    error names that op by its number in the file (as `inspect` lists it), not by its
    place in the rewritten graph."""
    from host_tools.graph.passes import PrepareError
    from host_tools.prepare.pipeline import prepare
    b = CircleBuilder()
    x = b.tensor('x', [1, 2, 3, 4])
    b.inputs(x)
    p1 = b.tensor('p1', [4], data=np.array([0, 3, 1, 2], np.int32))
    p2 = b.tensor('p2', [4], data=np.array([0, 2, 3, 1], np.int32))
    t1 = b.tensor('t1', [1, 4, 2, 3])
    t2 = b.tensor('t2', [1, 2, 3, 4])
    r = b.tensor('r', [1, 2, 3, 4])
    b.op('TRANSPOSE', [x, p1], [t1])
    b.op('TRANSPOSE', [t1, p2], [t2])
    b.op('SIN', [t2], [r])
    b.outputs(r)
    path = b.save(str(tmp_path / 'm.circle'))
    with pytest.raises(PrepareError, match=r'op 2 is SIN'):
        prepare(path, str(tmp_path / 'o'), loss='mse')


def _trained_names(src, tmp_path, xs, y, **kw):
    """prepare src on samples xs, y (every op training unless kw's train says, SGD, one
    epoch), run it on the host and return (prepare's summary, the names of the weights
    that moved)."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    from host_tools.files.wof import read_wof
    os.makedirs(tmp_path, exist_ok=True)
    np.savez(tmp_path / 'd.npz', x=xs, y=y)
    out = tmp_path / 'run'
    s = prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), epochs=1, lr=0.05,
                optimizer='sgd', log=lambda *a: None, **dict(dict(train='all'), **kw))
    code, text = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    g = read_model(out / s['rewritten'] if s['rewritten'] else src)    # (None: as it was)
    before, after = read_wof(out / 'weights.wof', g), read_wof(out / 'trained.wof', g)
    return s, {g.tensors[k].name for k in before if not np.array_equal(before[k], after[k])}


@pytest.mark.parametrize('three_d', [False, True])
def test_keras_dynamic_reshape_and_global_max_pool(tmp_path, three_d):
    """fold_shapes computes the run-time shape chain once (no SHAPE / PACK left: utrain
    has no kernels for them) and reduce_max_to_pool turns the global max into a
    MAX_POOL_2D (with RESHAPEs where the reduced axes are not NHWC's H and W); ONERT
    gives the rewritten model the outputs of the model's definition (numpy), and prepare
    trains it: the gradient reaches the conv under the max."""
    src, forward = build_keras_shapes(tmp_path / 'k.tflite', three_d)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert info['shapes'] == 3 and info['max_pools'] == 1
    names = ops(dst)
    assert 'SHAPE' not in names and 'PACK' not in names and 'REDUCE_MAX' not in names
    assert 'MAX_POOL_2D' in names
    x = np.random.default_rng(1).standard_normal((5, 12, 3)).astype(np.float32)
    got = onert_infer(dst, x)
    ref = forward(x.astype(np.float64))
    assert np.abs(ref).max() > 1e-2
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)

    xs = np.random.default_rng(2).standard_normal((16, 12, 3)).astype(np.float32)
    s, moved = _trained_names(src, tmp_path, xs, np.arange(16) % 3, loss='scce', from_logits=True)
    assert s['trainable_params'] == 5 * 9 + 5 + 15
    assert len(moved) == 3         # the conv's weight and bias under the max, the FC


def test_tf_run_time_reshape_and_a_norm_of_one_value(tmp_path):
    """A real GitHub embedding net was refused: its tf.reshape(h, [batch, -1]) works the
    -1 out at run time (EQUAL, WHERE, SPARSE_TO_DENSE: boolean and data-shaped values
    fold_shapes did not compute), the reshape's file shape is a guess ([1, 1] for
    [1, N]), and a REDUCE_MAX of the norm's one value has no kernel.  Now the chain
    folds (WHERE's value gives its shape), the reshape and what follows get their true
    shapes, and the REDUCE_MAX is a SQUEEZE; ONERT on the rewrite = numpy; prepare picks
    the first output (its size is known at run time only, so the file's [1, 1] does not
    rule it out) and trains the Dense under both outputs."""
    from kerasgraphs import build_tf_norm
    src, forward = build_tf_norm(tmp_path / 'n.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert not {'SHAPE', 'EQUAL', 'WHERE', 'SPARSE_TO_DENSE', 'CAST', 'REDUCE_MAX'} & set(ops(dst))
    assert info['unit_reductions'] == 1
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    g = read_model(dst)
    assert [g.tensors[k].shape for k in g.outputs] == [[1, 8], [1, 8]]
    np.testing.assert_allclose(onert_infer(dst, x, output=1).reshape(ref.shape), ref,
                               rtol=1e-4, atol=1e-5)
    xs = np.random.default_rng(2).standard_normal((16, 6)).astype(np.float32)
    y = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    for out in (None, 1):
        s, moved = _trained_names(src, tmp_path / f'o{out}', xs, y, loss='mse', output=out)
        assert moved == {'w', 'b'}
        assert s['output']['name'] == ('r' if out is None else 'y'), s['output']


def test_keras_unrolled_rnn_zero_state_and_unpack(tmp_path, capsys):
    """Keras 3's unrolled recurrent layer: the zero initial state FILLed to a run-time
    shape folds to a constant and UNPACK becomes SPLIT + RESHAPEs (no FILL, UNPACK or
    SHAPE left: utrain has no kernels for them); ONERT on the rewritten model gives the
    model's definition (numpy); prepare trains it and the recurrent weight, shared by
    every step, moves."""
    src, forward = build_keras_rnn(tmp_path / 'rnn.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    names = ops(dst)
    assert not {'FILL', 'UNPACK', 'SHAPE', 'PACK'} & set(names) and 'SPLIT' in names
    x = np.random.default_rng(1).standard_normal((6, 5, 3)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    from host_tools.cli import main          # inspect says what prepare makes of each op
    main(['inspect', src])
    said = capsys.readouterr().out
    assert 'NOT SUPPORTED' not in said and 'prepare makes it SPLIT + RESHAPE' in said, said

    xs = np.random.default_rng(2).standard_normal((16, 5, 3)).astype(np.float32)
    s, moved = _trained_names(src, tmp_path, xs, np.arange(16) % 3, loss='scce', from_logits=True)
    assert s['trainable_params'] == 4 * 3 + 4 + 4 * 4 + 3 * 4 + 3
    assert moved == {'wx', 'bx', 'wh', 'wo', 'bo'}


@pytest.mark.parametrize('tail', ['flatten', 'conv', 'crop'])
def test_keras_upsampling_tile_and_a_shape_the_file_got_wrong(tmp_path, tail):
    """Keras 3's UpSampling2D: TILE of a 5-D [1, H, 1, W, C] becomes a CONCATENATION of
    copies (no TILE left; 5-D with a leading 1 runs as 4-D), and the RESHAPE to a shape
    computed at run time gets the folded shape on its output where the file's static one
    is wrong, and so does every op after it whose file shape follows the wrong one (a
    held-out Keras UpSampling2D -> Conv2D was refused: "CONV_2D: output is 1x10, VALID
    padding gives 10x10"); ONERT on the rewrite = numpy, prepare trains it (the conv under
    the tiles moves: the gradient of both copies reaches it).  'crop': a Cropping2D after
    it (a STRIDED_SLICE, its file shape wrong too) was refused: "slicing [1, 8, 12, 6]
    gives [1, 6, 10, 6], the output is [1, 1, 10, 6]" (issue 28)."""
    src, forward = build_keras_upsample(tmp_path / 'up.tflite', tail=tail)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    names = ops(dst)
    assert 'TILE' not in names and 'SHAPE' not in names and info['tiles'] == 1
    x = np.random.default_rng(1).standard_normal((6, 3, 4, 1)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)

    xs = np.random.default_rng(2).standard_normal((16, 3, 4, 1)).astype(np.float32)
    _, moved = _trained_names(src, tmp_path, xs, np.arange(16) % 3, loss='scce', from_logits=True)
    assert moved == {'w', 'bc', 'wf', 'bf'} | ({'w2', 'b2'} if tail != 'flatten' else set())


@pytest.mark.parametrize('tail', ['up', 'conv-out'])
def test_keras_upsampling_at_the_output_gets_its_run_time_shape(tmp_path, tail):
    """A decoder ending in Keras 3's UpSampling2D (or UpSampling2D -> Conv2D): the graph
    output's file shape is the converter's wrong [1, 1, W, C] (signature [-1, -1, W, C]),
    and prepare refused a held-out Keras decoder trained with mse on [n, 8, 8, 1]
    targets ("op 13 CONV_2D: output is 1x8, VALID padding gives 8x8"): an output whose
    signature leaves the dimensions to run time takes the folded shape like an inner
    tensor.  ONERT on the rewrite = numpy; it trains (mse on targets of the true shape)."""
    src, forward = build_keras_upsample(tmp_path / 'up.tflite', tail=tail)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    g = read_model(dst)
    x = np.random.default_rng(1).standard_normal((6, 3, 4, 1)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    assert g.tensors[g.outputs[0]].shape == [1] + list(ref.shape[1:])
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)

    xs = np.random.default_rng(2).standard_normal((16, 3, 4, 1)).astype(np.float32)
    y = (forward(xs.astype(np.float64)) * 0.5 + 0.1).astype(np.float32)
    _, moved = _trained_names(src, tmp_path, xs, y, loss='mse')
    assert moved == {'w', 'bc'} | ({'w2', 'b2'} if tail == 'conv-out' else set())


def test_nearest_resize_by_whole_factors_becomes_copies(tmp_path):
    """RESIZE_NEAREST_NEIGHBOR by 2 and 3 (Keras 2's UpSampling2D, Resizing(nearest), tico's
    nn.Upsample; refused before) becomes RESHAPE + CONCATENATION of copies + RESHAPE per
    axis; ONERT on the rewrite = numpy, and the conv under it trains (both convs move)."""
    from kerasgraphs import build_keras_resize
    src, forward = build_keras_resize(tmp_path / 'rs.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert 'RESIZE_NEAREST_NEIGHBOR' not in ops(dst) and info['resizes'] == 1
    x = np.random.default_rng(1).standard_normal((6, 3, 2, 1)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    xs = np.random.default_rng(2).standard_normal((16, 3, 2, 1)).astype(np.float32)
    _, moved = _trained_names(src, tmp_path, xs, np.arange(16) % 3, loss='scce', from_logits=True)
    assert moved == {'w', 'bc', 'w2', 'b2', 'wf', 'bf'}


def test_keras_layernorm_neg_squared_difference_and_elu(tmp_path):
    """Keras 3's LayerNormalization after an ELU Dense: NEG becomes a MUL by -1 and
    SQUARED_DIFFERENCE a SUB and a MUL of the difference by itself (no NEG or
    SQUARED_DIFFERENCE left); ONERT on the rewrite = numpy, prepare trains every weight,
    gamma and beta among them."""
    src, forward = build_keras_layernorm(tmp_path / 'ln.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    names = ops(dst)
    assert not {'NEG', 'SQUARED_DIFFERENCE'} & set(names) and info['elementwise'] == 2
    assert 'ELU' in names
    x = np.random.default_rng(1).standard_normal((6, 6)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)

    xs = np.random.default_rng(2).standard_normal((16, 6)).astype(np.float32)
    _, moved = _trained_names(src, tmp_path, xs, np.random.default_rng(3).standard_normal((16, 2)),
                              loss='mse')
    assert moved == {'w1', 'b1', 'gamma', 'beta', 'w2', 'b2'}


def test_prelu_maximum_minimum_and_l2_normalization_train(tmp_path):
    """Issue 28 (held-out Keras PReLU, Maximum and UnitNormalization models, refused at
    PRELU, MAXIMUM and L2_NORMALIZATION): the rewrite writes them with ops that train
    (RELU, SUB, MUL, ADD, MEAN, RSQRT), none of the four left; ONERT on the rewrite =
    numpy; one SGD step on one sample moves each weight by -lr times the gradient the
    differences of the numpy forward give (PReLU's slopes among them)."""
    from kerasgraphs import build_keras_gates
    src, forward = build_keras_gates(tmp_path / 'g.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert not {'PRELU', 'MAXIMUM', 'MINIMUM', 'L2_NORMALIZATION'} & set(ops(dst))
    assert info['elementwise'] == 4
    x = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    step = _step_is_the_gradient(src, forward, tmp_path, ('w1', 'alpha', 'w3'), x, 'alpha')
    assert {'b1', 'w2', 'b2', 'b3'} <= set(step)


@pytest.mark.parametrize('circle', [False, True])
def test_slice_becomes_a_strided_slice_and_trains(tmp_path, circle):
    """SLICE by constant begin and size (a held-out tico nn.ConvTranspose2d(padding=1) was
    refused: "op 4 is SLICE, which utrain cannot run or train through yet") becomes a
    STRIDED_SLICE; ONERT on the rewrite = numpy; one SGD step on one sample moves the
    weights on both sides of it by -lr times the gradient the differences of the numpy
    forward give, and export writes them back."""
    from kerasgraphs import build_sliced
    src, forward = build_sliced(tmp_path / ('s.circle' if circle else 's.tflite'), circle=circle)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert 'SLICE' not in ops(dst) and 'STRIDED_SLICE' in ops(dst) and info['slices'] == 1
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(src, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'w2'), x, exported=True)


def test_the_export_of_a_split_prepare_made_runs_right_under_onert(tmp_path):
    """STRIDED_SLICEs cutting one activation into pieces (q, k, v of one projection)
    train as one SPLIT_V, and export wrote that SPLIT_V into the trained model, whose
    pieces ONERT 0.1.0 computes wrongly (a tico TransformerEncoderLayer's export: 0.74 off
    utrain's forward under ONERT; here 19): the export has STRIDED_SLICEs again, and ONERT
    on it = numpy's forward with the exported (trained) weights."""
    from kerasgraphs import build_sliced_heads
    from host_tools.prepare.pipeline import export
    src, forward = build_sliced_heads(tmp_path / 'h.tflite')
    g = read_model(src)
    assert rw.rewrite(g)['splits'] == 1
    xs = np.random.default_rng(2).standard_normal((16, 5)).astype(np.float32)
    _, moved = _trained_names(src, tmp_path, xs, np.random.default_rng(3).standard_normal((16, 2)),
                              loss='mse')
    assert moved == {'w1', 'b1', 'w2', 'b2'}
    out = os.fspath(tmp_path / 'e.tflite')
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), out)
    w = {t.name: t.data.astype(np.float64) for t in read_model(out).tensors
         if t.name in ('w1', 'b1', 'w2', 'b2')}
    x = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    ref = forward(x.astype(np.float64), **w)
    np.testing.assert_allclose(onert_infer(out, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
    assert 'SPLIT_V' not in ops(out)


def test_abs_square_and_sum_train(tmp_path):
    """ABS, SQUARE and SUM (refused before) become 2 * RELU(x) - x, MUL(x, x) and n *
    MEAN; ONERT on the rewrite = numpy, and a step is the gradient (by differences)."""
    from kerasgraphs import build_keras_abs_square_sum
    src, forward = build_keras_abs_square_sum(tmp_path / 'a.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert not {'ABS', 'SQUARE', 'SUM'} & set(ops(dst)) and info['elementwise'] == 3
    x = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'w3'), x)


def _named(g, name):
    return next(k for k, t in enumerate(g.tensors) if t.name == name)


def test_keras_dilated_convolutions_become_dilated_ops(tmp_path):
    """Issue 28 (a held-out Keras TCN: dilated causal Conv1D, refused at SPACE_TO_BATCH_ND):
    the converter's SPACE_TO_BATCH_ND -> VALID conv -> BATCH_TO_SPACE_ND becomes the conv
    with its dilation on the padded input (the paddings less the crops), for a Conv1D and
    a DepthwiseConv2D, crops included; ONERT on the rewrite = the dilated convolutions by
    their definition (numpy); prepare trains it: both convolutions' weights move."""
    from kerasgraphs import build_keras_dilated
    src, forward = build_keras_dilated(tmp_path / 'dil.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert info['dilations'] == 2
    names = ops(dst)
    assert 'SPACE_TO_BATCH_ND' not in names and 'BATCH_TO_SPACE_ND' not in names
    g = read_model(dst)
    dil = sorted((op.options['dilation_h_factor'], op.options['dilation_w_factor'])
                 for op in g.ops if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D'))
    assert dil == [(1, 2), (2, 2)], dil
    x = np.random.default_rng(1).standard_normal((4, 13, 2)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)

    xs = np.random.default_rng(2).standard_normal((12, 13, 2)).astype(np.float32)
    _, moved = _trained_names(src, tmp_path, xs, np.arange(12) % 3, loss='scce', from_logits=True)
    assert {'w1', 'wd'} <= moved, moved


def test_dilated_conv_trains_the_keras_bias_not_the_converters_zero_one(tmp_path):
    """Issue 28 (a Keras causal Conv1D with dilation_rate, as TFLite's converter writes
    it: a zero bias in the blocked CONV_2D, Keras's bias in an ADD after
    BATCH_TO_SPACE_ND): the layer trains one bias, Keras's (prepare had trained both:
    3 parameters more than Keras's count), which export writes back to the ADD's
    constant (the rewrite's values: the test above)."""
    from kerasgraphs import build_keras_dilated
    from host_tools.prepare.pipeline import export
    src, _ = build_keras_dilated(tmp_path / 'dil.tflite', O=3, C=2, H=5, K=4)
    g = read_model(src)
    keras = sum(g.tensors[k].data.size for k in range(len(g.tensors))
                if g.tensors[k].name in ('w1', 'b1', 'wm', 'bm', 'wd', 'zd', 'wf', 'bf'))
    xs = np.random.default_rng(2).standard_normal((12, 13, 2)).astype(np.float32)
    s, moved = _trained_names(src, tmp_path, xs, np.arange(12) % 3, loss='scce', from_logits=True)
    assert s['trainable_params'] == keras, (s['trainable_params'], keras, s['trainable'])
    assert 'b1' in moved and not any(n.startswith('z1') for n in s['trainable']), (moved, s['trainable'])
    out = tmp_path / 'trained.tflite'
    export(src, os.fspath(tmp_path / 'run' / 'trained.wof'), os.fspath(out))
    b1 = read_model(src).tensors
    b1 = next(t.data for t in b1 if t.name == 'b1')
    nb1 = next(t.data for t in read_model(out).tensors if t.name == 'b1')
    assert not np.array_equal(b1, nb1)


def test_tflite_ending_in_log_softmax_trains_its_logits(tmp_path):
    """A .tflite classifier ending in LOG_SOFTMAX (Keras's log_softmax activation) trains
    the logits it reads with cross-entropy from logits; the export keeps the op, so the
    runtime on it gives the trained logits minus their logsumexp."""
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.prepare.infer import predictor
    from host_tools.target.runner import run
    rng = np.random.default_rng(0)
    w1, b1, w2, b2 = 0.5 * rng.standard_normal((6, 4)), rng.standard_normal(6), \
        rng.standard_normal((3, 6)), rng.standard_normal(3)
    b = CircleBuilder(identifier=b'TFL3')
    x, h, z, y = (b.tensor(n, s) for n, s in (('x', [1, 4]), ('h', [1, 6]), ('z', [1, 3]),
                                              ('y', [1, 3])))
    f32 = lambda a: a.astype(np.float32)    # noqa: E731
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [6, 4], data=f32(w1)),
                             b.tensor('b1', [6], data=f32(b1))], [h], fused_activation_function='RELU')
    b.op('FULLY_CONNECTED', [h, b.tensor('w2', [3, 6], data=f32(w2)),
                             b.tensor('b2', [3], data=f32(b2))], [z])
    b.op('LOG_SOFTMAX', [z], [y])
    b.inputs(x)
    b.outputs(y)
    src = os.fspath(tmp_path / 'ls.tflite')
    b.save(src)
    xs = rng.standard_normal((30, 4)).astype(np.float32)
    np.savez(tmp_path / 'd.npz', x=xs, y=rng.integers(0, 3, 30))
    d = os.fspath(tmp_path / 'run')
    lines = []
    prepare(src, d, data=os.fspath(tmp_path / 'd.npz'), optimizer='sgd', lr=0.2, epochs=2,
            log=lines.append)
    assert any('op 2 (LOG_SOFTMAX) ends the model' in ln for ln in lines), lines
    code, text = run(d, python=True, stream=False)
    assert code == 0, text
    out = os.fspath(tmp_path / 'trained.tflite')
    export(src, os.path.join(d, 'trained.wof'), out)
    g = read_model(out)
    tw = {g.tensors[k].name: g.tensors[k].data.astype(np.float64) for k in range(len(g.tensors))
          if g.tensors[k].data is not None}
    logits = np.maximum(xs @ tw['w1'].T + tw['b1'], 0) @ tw['w2'].T + tw['b2']
    assert not np.allclose(tw['w2'], w2, atol=1e-4)                 # it trained
    got = predictor(out)[0](xs)
    m = logits.max(1, keepdims=True)
    want = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_keras_timedistributed_pack_trains(tmp_path):
    """Issue 28 (a held-out Keras TimeDistributed(Dense), refused at PACK): a PACK of
    activations becomes a RESHAPE opening the axis per input and a CONCATENATION along
    it; ONERT on the rewrite = numpy, and one SGD step moves the weight the steps share
    by -lr times the gradient the differences give (the steps' gradients summed)."""
    from kerasgraphs import build_keras_timedistributed
    src, forward = build_keras_timedistributed(tmp_path / 'td.tflite')
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert 'PACK' not in ops(dst) and info['packs'] == 1
    x = np.random.default_rng(1).standard_normal((6, 4, 3)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'w2'), x)


def test_input_of_run_time_length_is_refused_saying_what_to_do(tmp_path):
    """A Keras model of Input((None, F)) (a Conv1D over sequences of any length) is
    written with length 1 in the file's shape and -1 in its signature: refused naming the
    input and its signature, and how to export it (not a conv's shape error later)."""
    from host_tools.files.validate import check_graph
    from host_tools.graph.passes import PrepareError
    rng = np.random.default_rng(0)
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, 1, 3], signature=[-1, -1, 3])
    y = b.tensor('y', [1, 1, 2], signature=[-1, -1, 2])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [2, 3], data=rng.standard_normal((2, 3)).astype(np.float32)),
                             -1], [y], keep_num_dims=True)
    b.inputs(x)
    b.outputs(y)
    p = os.fspath(tmp_path / 'v.tflite')
    b.save(p)
    with pytest.raises(PrepareError, match=r"v.tflite: the input tensor 0 \('x'\) has a length "
                       r'known only at run time \(dimension 1 of shape signature \[-1, -1, 3\]'
                       r'.*keras.Input\(\(T, F\)\)'):
        check_graph(read_model(p))
    b = CircleBuilder(identifier=b'TFL3')           # the batch alone open: fine
    x = b.tensor('x', [1, 4, 3], signature=[-1, 4, 3])
    y = b.tensor('y', [1, 4, 2], signature=[-1, 4, 2])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [2, 3], data=rng.standard_normal((2, 3)).astype(np.float32)),
                             -1], [y], keep_num_dims=True)
    b.inputs(x)
    b.outputs(y)
    b.save(p)
    check_graph(read_model(p))
    b = CircleBuilder(identifier=b'TFL3')           # Input(batch_size=8): said, not the data's size
    x = b.tensor('x', [8, 4, 3])
    y = b.tensor('y', [8, 4, 2])
    b.op('FULLY_CONNECTED', [x, b.tensor('w', [2, 3], data=rng.standard_normal((2, 3)).astype(np.float32)),
                             -1], [y], keep_num_dims=True)
    b.inputs(x)
    b.outputs(y)
    b.save(p)
    with pytest.raises(PrepareError, match=r"v.tflite: the input tensor 0 \('x'\) has shape \[8, 4, 3\]: "
                       r'a batch of 8 fixed in the file.*export it with batch 1'):
        check_graph(read_model(p))


def test_grouped_convolutions_split_train_and_export_joined(tmp_path):
    """Issue 28 (a held-out Keras Conv2D(groups=2), refused: "weight ... of shape [8, 3,
    3, 4] does not fit input ... [1, 8, 8, 8]"): a grouped CONV_2D becomes SPLIT -> a
    CONV_2D per group -> CONCATENATION, one input channel per group a DEPTHWISE_CONV_2D;
    TFLite Micro on the file and on the rewrite = the numpy definition; one SGD
    step is the gradient by differences, read from the exported model, which has the
    file's ops and tensors again (the groups joined) and which TFLite Micro runs to
    utrain's forward with the trained weights; --train last:N counts the file's ops
    (every group of the conv it reaches trains)."""
    from kerasgraphs import build_keras_grouped
    from test_parity import new_trainer
    src, forward = build_keras_grouped(tmp_path / 'g.tflite')
    x = np.random.default_rng(1).uniform(-2, 2, (6, 5, 5, 4)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(tflm_infer(src, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert info['groups'] == 3
    assert ops(dst) == ['SPLIT', 'CONV_2D', 'CONV_2D', 'CONCATENATION', 'DEPTHWISE_CONV_2D',
                        'SPLIT', 'CONV_2D', 'CONV_2D', 'CONV_2D', 'CONCATENATION', 'MEAN',
                        'FULLY_CONNECTED']
    # (TFLite Micro: ONERT loads no CONV_2D without a bias, w3's)
    np.testing.assert_allclose(tflm_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)

    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'b1', 'w2', 'b2', 'w3', 'wf'), x,
                          exported=True)
    e = read_model(tmp_path / 'e.tflite')
    g0 = read_model(src)
    assert ops(e) == ops(g0)
    assert {t.name: t.shape for t in e.tensors if t.data is not None} == \
        {t.name: t.shape for t in g0.tensors if t.data is not None}
    tr = new_trainer(os.fspath(tmp_path / 'run' / 'model.flat'),
                     os.fspath(tmp_path / 'run' / 'trained.wof'))
    ours = np.stack([np.array(tr.predict(np.ascontiguousarray(xi.reshape(-1, 4))), np.float64)
                     .reshape(-1) for xi in x])
    np.testing.assert_allclose(tflm_infer(tmp_path / 'e.tflite', x), ours, rtol=1e-4, atol=1e-5)

    # last:3 reaches the third conv (op 2): its three groups train, the others stay
    s, moved = _trained_names(src, tmp_path / 'l3', x, np.zeros((6, 2), np.float32),
                              loss='mse', train='last:3')
    assert moved == {'w3/group0of3', 'w3/group1of3', 'w3/group2of3', 'wf', 'bf'}, moved
    # a rank of the file's op: each group's channels by that rank (a depthwise's the
    # op's), and train.tcfg numbers the ops as the file does
    from host_tools.files.trainconfig import read_train_config
    from host_tools.prepare.pipeline import prepare
    s = prepare(src, os.fspath(tmp_path / 'rk'), data=os.fspath(tmp_path / 'l3' / 'd.npz'),
                loss='mse', ranks='0:up,1:low', train='none', log=lambda *a: None)
    assert s['ranks'] == {'w1/group0of2': [0, 0, 1], 'b1/group0of2': [1, 0, 1],
                          'w1/group1of2': [0, 0, 1], 'b1/group1of2': [1, 0, 1],
                          'w2/groups6': [1, 6, 12], 'b2': [1, 6, 12]}
    assert read_train_config(os.fspath(tmp_path / 'rk' / 'train.tcfg'), 5) == {0: 2, 1: 3}


@pytest.mark.parametrize('c,w', [(6, [4, 3, 3, 4]), (4, [3, 3, 3, 2])])
def test_conv_weight_that_fits_no_grouping_is_refused(tmp_path, c, w):
    """A CONV_2D weight whose channels divide neither the input's (6 by 4) nor whose
    outputs divide among the groups (3 outputs, 2 groups) is refused naming the file,
    the op, both shapes and what fits."""
    from host_tools.graph.passes import PrepareError
    from host_tools.prepare.pipeline import prepare
    b = CircleBuilder()
    x = b.tensor('x', [1, 4, 4, c])
    y = b.tensor('y', [1, 4, 4, w[0]])
    b.op('CONV_2D', [x, b.tensor('w', w, data=np.ones(w, np.float32)), -1], [y], padding='SAME')
    b.inputs(x)
    b.outputs(y)
    path = b.save(str(tmp_path / 'm.circle'))
    with pytest.raises(PrepareError, match=r'm\.circle: op 0 \(CONV_2D\): weight .* of shape '
                       + re.escape(f'{w}') + r'.*CONV_2D wants \[out, h, w, '
                       + f'{c}' + r'\], or \[out, h, w, ' + f'{c}' + r' / groups\] with out a '
                       'multiple of groups'):
        prepare(path, str(tmp_path / 'o'), loss='mse')


def _build_selu(path, seed=0, F=5, H=6, O=2, cond='GREATER', c=0.0, jump=0.0):
    """What Keras 3 writes for a selu activation, built here: Dense -> GREATER(h, c) ->
    SELECT_V2(scale * h, scale * alpha * (exp(h) - 1)) -> Dense (c shifts the break: then
    the lower branch is moved by its value at c, so the two meet there; LESS swaps them)."""
    rng = np.random.default_rng(seed)
    w1, b1 = 0.8 * rng.standard_normal((H, F)), rng.standard_normal(H)
    w2, b2 = rng.standard_normal((O, H)), rng.standard_normal(O)
    sc, al = 1.0507, 1.6733
    lift = sc * c - sc * al * (np.exp(c) - 1) + jump
    f32 = lambda a: np.asarray(a, np.float32)      # noqa: E731
    b = CircleBuilder(identifier=b'TFL3')
    x, h, m, a, e, e1, bb, bl, y, out = (b.tensor(n, s) for n, s in (
        ('x', [1, F]), ('h', [1, H]), ('m', [1, H]), ('a', [1, H]), ('e', [1, H]),
        ('e1', [1, H]), ('bb', [1, H]), ('bl', [1, H]), ('y', [1, H]), ('out', [1, O])))
    b.op('FULLY_CONNECTED', [x, b.tensor('w1', [H, F], data=f32(w1)), b.tensor('b1', [H], data=f32(b1))], [h])
    b.op(cond, [h, b.tensor('c', [], data=f32(c))], [m])
    b.op('MUL', [h, b.tensor('sc', [], data=f32(sc))], [a])
    b.op('EXP', [h], [e])
    b.op('SUB', [e, b.tensor('one', [], data=f32(1.0))], [e1])
    b.op('MUL', [e1, b.tensor('sa', [], data=f32(sc * al))], [bb])
    b.op('ADD', [bb, b.tensor('lift', [], data=f32(lift))], [bl])
    b.op('SELECT_V2', [m, a, bl] if cond == 'GREATER' else [m, bl, a], [y])
    b.op('FULLY_CONNECTED', [y, b.tensor('w2', [O, H], data=f32(w2)), b.tensor('b2', [O], data=f32(b2))], [out])
    b.inputs(x)
    b.outputs(out)
    b.save(path)

    def forward(xs, w1=w1, w2=w2):
        hh = xs @ w1.T + b1
        return np.where(hh > c, sc * hh, sc * al * (np.exp(hh) - 1) + lift) @ w2.T + b2
    return os.fspath(path), forward


@pytest.mark.parametrize('cond,c', [('GREATER', 0.0), ('LESS', 0.4)])
def test_selu_select_becomes_relu_sides(cond, c, tmp_path):
    """Issue 28 (a held-out Keras selu, refused at GREATER): SELECT_V2 of x > c between two
    branches that meet at c becomes each branch on its side of c (RELU) summed, less their
    value at c; ONERT on the rewrite = numpy, one SGD step = finite differences."""
    src, forward = _build_selu(tmp_path / 's.tflite', cond=cond, c=c)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert not {'SELECT_V2', 'GREATER', 'LESS'} & set(ops(dst)) and info['selects'] == 1
    x = np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(onert_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'w2'), x)
    # branches that do not meet at c (a step): no sum of the two sides is it: kept (refused)
    src, _ = _build_selu(tmp_path / 'j.tflite', cond=cond, c=c, jump=0.5)
    _, info, _ = rewritten(src, tmp_path / 'j.circle')
    assert info['selects'] == 0


def build_takes(path, seed=0, T=6, C=5):
    """x [1, T, C] -> GATHER channels [4, 0, 2, 2, 3] (axis 2: keras.ops.take / tf.gather;
    runs, a repeat) -> FC w1, GATHER step 3 (a scalar index, axis 1) -> FC w2, ADD, and
    SPLIT_V of x on the time axis [2, 4] -> FC w3 of the second piece, FC w4 of the
    first.  Returns (path,
    numpy forward)."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(seed)
    w1, w2, w3, w4 = (rng.standard_normal(s).astype(np.float32) * 0.3
                      for s in ((2, T * C), (2, C), (2, 4 * C), (2, 2 * C)))
    idx = [4, 0, 2, 2, 3]
    b = CircleBuilder(identifier=b'TFL3')
    x = b.tensor('x', [1, T, C])
    g1, f1, g2, y1, y2 = (b.tensor(n, s) for n, s in (('g1', [1, T, 5]), ('f1', [1, T * 5]), ('g2', [1, C]),
                                                    ('y1', [1, 2]), ('y2', [1, 2])))
    b.op('GATHER', [x, b.tensor('i1', [5], data=np.int32(idx))], [g1], axis=2)
    b.op('RESHAPE', [g1, b.tensor('s1', [2], data=np.int32([1, T * 5]))], [f1])
    b.op('FULLY_CONNECTED', [f1, b.tensor('w1', [2, T * C], data=w1), -1], [y1])
    b.op('GATHER', [x, b.tensor('i2', [], data=np.array(3, np.int32))], [g2], axis=1)
    b.op('FULLY_CONNECTED', [g2, b.tensor('w2', [2, C], data=w2), -1], [y2])
    p0, p1, f3, y3, s12, y = (b.tensor(n, s) for n, s in (('p0', [1, 2, C]), ('p1', [1, 4, C]), ('f3', [1, 4 * C]),
                                                        ('y3', [1, 2]), ('s12', [1, 2]), ('y', [1, 2])))
    b.op('SPLIT_V', [x, b.tensor('sz', [2], data=np.int32([2, 4])), b.tensor('ax', [], data=np.array(1, np.int32))],
         [p0, p1], num_splits=2)
    b.op('RESHAPE', [p1, b.tensor('s3', [2], data=np.int32([1, 4 * C]))], [f3])
    b.op('FULLY_CONNECTED', [f3, b.tensor('w3', [2, 4 * C], data=w3), -1], [y3])
    f4, y4, s123 = b.tensor('f4', [1, 2 * C]), b.tensor('y4', [1, 2]), b.tensor('s123', [1, 2])
    b.op('RESHAPE', [p0, b.tensor('s4', [2], data=np.int32([1, 2 * C]))], [f4])
    b.op('FULLY_CONNECTED', [f4, b.tensor('w4', [2, 2 * C], data=w4), -1], [y4])
    b.op('ADD', [y1, y2], [s12])
    b.op('ADD', [s12, y3], [s123])
    b.op('ADD', [s123, y4], [y])
    b.inputs(x)
    b.outputs(y)
    b.save(path)

    def forward(xs, w1=w1, w2=w2, w3=w3, w4=w4):
        return (xs[:, :, idx].reshape(len(xs), -1) @ np.asarray(w1, np.float64).T
                + xs[:, :2].reshape(len(xs), -1) @ np.asarray(w4, np.float64).T
                + xs[:, 3] @ np.asarray(w2, np.float64).T
                + xs[:, 2:].reshape(len(xs), -1) @ np.asarray(w3, np.float64).T)
    return os.fspath(path), forward


def test_constant_gathers_along_an_axis_train_as_slices(tmp_path):
    """Held-out Keras keras.ops.take(x, [0, 2], axis=2) (tf.gather of channels) had been
    refused: 'a gather along axis 2 ... is not supported' (float) / 'int8 training
    gathers the rows of a constant 2-D int8 table' (int8).  A GATHER of an activation by
    constant indices is a STRIDED_SLICE per run of evenly spaced indices (and a
    CONCATENATION): TFLite Micro on the file and on the rewrite = numpy; one SGD
    step = the gradient by differences (an index taken twice sums its gradients).
    evaluate = numpy too: ONERT 0.1.0 gives other values for a SPLIT_V's pieces, evaluate
    scores its pieces as slices."""
    pytest.importorskip('tflite_micro')
    from host_tools.prepare.infer import predictor
    src, forward = build_takes(tmp_path / 't.tflite')
    x = np.random.default_rng(1).standard_normal((5, 6, 5)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    np.testing.assert_allclose(tflm_infer(src, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert info['takes'] == 2 and 'GATHER' not in ops(dst), ops(dst)
    np.testing.assert_allclose(tflm_infer(dst, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    run, _, _ = predictor(src)
    np.testing.assert_allclose(run(x), ref, rtol=1e-4, atol=1e-5)
    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'w2', 'w3', 'w4'), x)


def test_a_dense_on_a_sequence_gets_its_bias_add_as_the_fc_bias(tmp_path):
    """Keras 3's Dense on a 3-D input: RESHAPE -> FULLY_CONNECTED without a bias ->
    RESHAPE [1, T, N] -> ADD of the bias.  `--int8` had refused such a float model
    ("constant ... is not the weight or bias of a FULLY_CONNECTED"); the ADD becomes the
    FC's bias (its RELU the FC's): TFLite Micro on the file and on the rewrite = numpy,
    one SGD step = the gradient by differences (the bias too), and the int8 graph of the
    rewrite is made."""
    pytest.importorskip('tflite_micro')
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.prepare.fromfloat import int8_graph
    rng = np.random.default_rng(3)
    T, K, N = 4, 3, 5
    w1, bias, w2 = (rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((N, K), (N,), (2, T * N)))
    b = CircleBuilder(identifier=b'TFL3')
    x, r, h, h3, a, f, y = (b.tensor(n, s) for n, s in (('x', [1, T, K]), ('r', [T, K]), ('h', [T, N]),
                                                       ('h3', [1, T, N]), ('a', [1, T, N]), ('f', [1, T * N]),
                                                       ('y', [1, 2])))
    b.op('RESHAPE', [x, b.tensor('s0', [2], data=np.int32([T, K]))], [r])
    b.op('FULLY_CONNECTED', [r, b.tensor('w1', [N, K], data=w1), -1], [h])
    b.op('RESHAPE', [h, b.tensor('s1', [3], data=np.int32([1, T, N]))], [h3])
    b.op('ADD', [h3, b.tensor('bias', [N], data=bias)], [a], fused_activation_function='RELU')
    b.op('RESHAPE', [a, b.tensor('s2', [2], data=np.int32([1, T * N]))], [f])
    b.op('FULLY_CONNECTED', [f, b.tensor('w2', [2, T * N], data=w2), -1], [y])
    b.inputs(x)
    b.outputs(y)
    src = b.save(str(tmp_path / 'd.tflite'))

    def forward(xs, w1=w1, bias=bias, w2=w2):
        z = np.maximum(xs @ np.asarray(w1, np.float64).T + np.asarray(bias, np.float64), 0)
        return z.reshape(len(xs), -1) @ np.asarray(w2, np.float64).T
    xs = rng.standard_normal((5, T, K)).astype(np.float32)
    ref = forward(xs.astype(np.float64))
    np.testing.assert_allclose(tflm_infer(src, xs).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert info['fc_biases'] == 1 and 'ADD' not in ops(dst), ops(dst)
    np.testing.assert_allclose(tflm_infer(dst, xs).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    int8_graph(read_model(dst))
    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'bias', 'w2'), xs)


@pytest.mark.parametrize('zero', [True, False])
def test_separable_conv_trains_no_depthwise_bias(tmp_path, zero):
    """Issue 28: Keras's SeparableConv1D/2D, as TFLite's converter writes it, is a
    DEPTHWISE_CONV_2D with a zero bias (Keras's depthwise step has none) -> a 1x1
    CONV_2D with the layer's bias; prepare had trained the zero bias too (a
    SeparableConv2D on 8 channels: 8 parameters more than Keras's count).  It stays
    frozen, the rest trains (both kernels and the pointwise bias move) and the forward
    is numpy's; a depthwise bias that is not zero (not the converter's) still trains."""
    rng = np.random.default_rng(0)
    H, C, P, O = 5, 3, 4, 2
    wd, wp = rng.standard_normal((1, 3, 3, C)).astype(np.float32), \
        rng.standard_normal((P, 1, 1, C)).astype(np.float32)
    bd = np.zeros(C, np.float32) if zero else rng.standard_normal(C).astype(np.float32)
    bp, wf = rng.standard_normal(P).astype(np.float32), \
        (0.3 * rng.standard_normal((O, 9 * P))).astype(np.float32)
    b = CircleBuilder(identifier=b'TFL3')
    x, d, c, f, y = (b.tensor(n, s) for n, s in (('x', [1, H, H, C]), ('d', [1, 3, 3, C]),
                                                ('c', [1, 3, 3, P]), ('f', [1, 9 * P]),
                                                ('y', [1, O])))
    b.op('DEPTHWISE_CONV_2D', [x, b.tensor('wd', wd.shape, data=wd), b.tensor('bd', [C], data=bd)],
         [d], padding='VALID', depth_multiplier=1)
    b.op('CONV_2D', [d, b.tensor('wp', wp.shape, data=wp), b.tensor('bp', [P], data=bp)], [c],
         padding='VALID', fused_activation_function='RELU')
    b.op('RESHAPE', [c], [f], new_shape=[1, 9 * P])
    b.op('FULLY_CONNECTED', [f, b.tensor('wf', wf.shape, data=wf),
                             b.tensor('bf', [O], data=np.zeros(O, np.float32))], [y])
    b.inputs(x)
    b.outputs(y)
    src = b.save(os.fspath(tmp_path / 'sep.tflite'))
    xs = rng.standard_normal((12, H, H, C)).astype(np.float32)
    win = np.stack([np.stack([xs[:, i:i + 3, j:j + 3] for j in range(3)], 3) for i in range(3)], 3)
    z = np.einsum('nabijc,ijc->nabc', win, wd[0]) + bd
    ref = (np.maximum(np.einsum('nabc,pc->nabp', z, wp[:, 0, 0]) + bp, 0).reshape(12, -1) @ wf.T)
    np.testing.assert_allclose(onert_infer(src, xs).reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
    s, moved = _trained_names(src, tmp_path, xs, np.arange(12) % 2, loss='scce', from_logits=True)
    keras = wd.size + wp.size + bp.size + wf.size + O + (0 if zero else C)
    assert s['trainable_params'] == keras, (s['trainable_params'], keras, s['trainable'])
    assert ('bd' in s['trainable']) == (not zero) and {'wd', 'wp', 'bp', 'wf'} <= moved, moved


def test_a_trained_batchnorm_shift_stays_an_add_without_its_layer(tmp_path):
    """Issue 28 (session 20, a tico-converted 1-D CNN: conv without bias, BatchNorm as MUL
    and ADD): --ranks / --select training the BatchNorm's ADD alone (its MUL and its conv
    frozen) folded the MUL into the conv (as it should) and then the ADD into the conv's
    zero bias (conv_bias_adds, which did not look at what trains): the configuration
    trained the classifier alone, and --select board's short list failed on the op
    gone.  Kept, the ADD stays a trainable op; not kept, it folds as before."""
    rng = np.random.default_rng(3)
    b = CircleBuilder()
    x = b.tensor('x', [1, 5, 5, 2])
    w = b.tensor('w', [4, 3, 3, 2], data=_rand(rng, 4, 3, 3, 2))
    h, m, y = b.tensor('h', [1, 5, 5, 4]), b.tensor('m', [1, 5, 5, 4]), b.tensor('y', [1, 5, 5, 4])
    b.op('CONV_2D', [x, w, b.tensor('b', [4], data=np.zeros(4, np.float32))], [h],
         padding='SAME')
    for i, (opn, src, dst) in enumerate((('MUL', h, m), ('ADD', m, y))):
        k = rng.uniform(0.5, 2, 4).astype(np.float32).reshape(1, 1, 1, 4)
        b.op(opn, [src, b.tensor(f'k{i}', k.shape, data=k)], [dst])
    b.inputs(x)
    b.outputs(y)
    src = b.save(tmp_path / 's.circle')
    dst, _, _ = rewritten(src, tmp_path / 'k.circle', keep=[2])
    assert ops(dst) == ['CONV_2D', 'ADD']
    assert_same_outputs(src, dst)
    dst, _, _ = rewritten(src, tmp_path / 'd.circle')
    assert ops(dst) == ['CONV_2D']
    assert_same_outputs(src, dst)


def test_a_prelu_of_one_shared_slope_trains_it(tmp_path):
    """Issue 28: PyTorch's nn.PReLU() (its default, one slope shared by every unit) as
    torch.onnx writes it (PRelu, slope [1]): the slope is a parameter PyTorch trains, but
    prepare froze it as a scalar constant ("1 frozen parameter", nothing said) while a
    per-channel slope trained.  One SGD step on one sample moves the slope, and the
    layers on both sides, by -lr times the gradient the differences of the numpy forward
    give, and export writes the trained slope into the ONNX file."""
    onnx = pytest.importorskip('onnx')
    from onnx import TensorProto, helper, numpy_helper
    r = np.random.default_rng(4)
    w1 = (r.standard_normal((3, 5)) * 0.8).astype(np.float32)
    b1 = (r.standard_normal(5) * 0.3).astype(np.float32)
    w2 = (r.standard_normal((5, 2)) * 0.6).astype(np.float32)
    slope = np.array([0.25], np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, 'w1'), (b1, 'b1'), (w2, 'w2'),
                                                        (slope, 'slope'))]
    nodes = [helper.make_node('MatMul', ['x', 'w1'], ['h']), helper.make_node('Add', ['h', 'b1'], ['hb']),
             helper.make_node('PRelu', ['hb', 'slope'], ['p']), helper.make_node('MatMul', ['p', 'w2'], ['y'])]
    m = helper.make_model(helper.make_graph(
        nodes, 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, ['n', 3])],
        [helper.make_tensor_value_info('y', TensorProto.FLOAT, ['n', 2])], inits),
        opset_imports=[helper.make_opsetid('', 13)])
    src = os.fspath(tmp_path / 'prelu1.onnx')
    onnx.save(m, src)

    def forward(x, w1=w1.T, b1=b1, slope=slope, w2=w2.T):     # (read as FC weights [out, in])
        h = x @ w1.T + b1
        return np.where(h >= 0, h, slope * h) @ w2.T
    x = r.standard_normal((8, 3)).astype(np.float32)
    step = _step_is_the_gradient(src, forward, tmp_path, ('slope', 'w1', 'w2'), x, 'slope',
                                 exported=True)
    assert abs(float(step['slope'][0])) > 1e-3


@pytest.mark.parametrize('kind', ['tflite-1', 'tflite-2', 'onnx-flip', 'onnx-2'])
def test_a_reversing_slice_trains(tmp_path, kind):
    """Issue 28: a STRIDED_SLICE with a negative stride (Keras's x[:, ::-1] of a Lambda;
    torch.flip, which torch.onnx writes as Slice steps -1 from -1 to -INT64_MAX) was
    refused: "stride -1 (utrain slices with positive strides)" / "step -1: utrain slices
    with positive steps".  Now it becomes a forward slice and a reversal (slices and a
    CONCATENATION): ONERT / ONNX Runtime on the file = numpy = ONERT on the rewrite; one
    SGD step moves the weights on both sides by -lr times the gradient the differences of
    the numpy forward give, and export writes them back.  x [1, F] -> FC -> [1, T, H]
    -> reversed time (every step, or every second from the last) -> FC(O)."""
    F, T, H, O = 4, 5, 3, 2
    r = np.random.default_rng(2)
    w1, b1 = r.standard_normal((T * H, F)).astype(np.float32), r.standard_normal(T * H).astype(np.float32)
    step = -1 if kind.endswith('-1') or kind.endswith('flip') else -2
    picks = list(range(T))[::step]
    w2 = r.standard_normal((O, len(picks) * H)).astype(np.float32)
    b2 = r.standard_normal(O).astype(np.float32)
    if kind.startswith('tflite'):
        src = os.fspath(tmp_path / 'rev.tflite')
        b = CircleBuilder(identifier=b'TFL3')
        x, h, m, s, f, y = (b.tensor(n, k) for n, k in (
            ('x', [1, F]), ('h', [1, T * H]), ('m', [1, T, H]), ('s', [1, len(picks), H]),
            ('f', [1, len(picks) * H]), ('y', [1, O])))
        b.op('FULLY_CONNECTED', [x, b.tensor('w1', w1.shape, data=w1), b.tensor('b1', [T * H], data=b1)],
             [h], fused_activation_function='RELU')
        b.op('RESHAPE', [h], [m], new_shape=[1, T, H])
        b.op('STRIDED_SLICE', [m, b.tensor('sb', [3], data=np.array([0, -1, 0], np.int32)),
                               b.tensor('se', [3], data=np.array([0, 0, 0], np.int32)),
                               b.tensor('ss', [3], data=np.array([1, step, 1], np.int32))], [s],
             begin_mask=5, end_mask=7)       # (as TF writes x[:, ::step])
        b.op('RESHAPE', [s], [f], new_shape=[1, len(picks) * H])
        b.op('FULLY_CONNECTED', [f, b.tensor('w2', w2.shape, data=w2), b.tensor('b2', [O], data=b2)], [y])
        b.inputs(x)
        b.outputs(y)
        b.save(src)
    else:
        onnx = pytest.importorskip('onnx')
        from onnx import TensorProto, helper, numpy_helper
        src = os.fspath(tmp_path / 'rev.onnx')
        big = -(2 ** 63 - 1)
        inits = [numpy_helper.from_array(a, n) for a, n in (
            (w1.T.copy(), 'w1'), (b1, 'b1'), (w2.T.copy(), 'w2'), (b2, 'b2'),
            (np.array([1, T, H], np.int64), 'shape'), (np.array([1, len(picks) * H], np.int64), 'flat'),
            (np.array([-1], np.int64), 'st'), (np.array([big], np.int64), 'en'),
            (np.array([1], np.int64), 'ax'), (np.array([step], np.int64), 'sp'))]
        nodes = [helper.make_node('Gemm', ['x', 'w1', 'b1'], ['h']), helper.make_node('Relu', ['h'], ['hr']),
                 helper.make_node('Reshape', ['hr', 'shape'], ['m']),
                 helper.make_node('Slice', ['m', 'st', 'en', 'ax', 'sp'], ['s']),
                 helper.make_node('Reshape', ['s', 'flat'], ['f']),
                 helper.make_node('Gemm', ['f', 'w2', 'b2'], ['y'])]
        onnx.save(helper.make_model(helper.make_graph(
            nodes, 'g', [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1, F])],
            [helper.make_tensor_value_info('y', TensorProto.FLOAT, [1, O])], inits),
            opset_imports=[helper.make_opsetid('', 13)]), src)

    def forward(xs, w1=w1, w2=w2):
        hs = np.maximum(xs @ w1.T + b1, 0).reshape(len(xs), T, H)[:, ::step]
        return hs.reshape(len(xs), -1) @ w2.T + b2
    x = r.standard_normal((6, F)).astype(np.float32)
    ref = forward(x.astype(np.float64))
    if kind.startswith('tflite'):
        np.testing.assert_allclose(onert_infer(src, x).reshape(ref.shape), ref, rtol=1e-4, atol=1e-5)
    else:
        ort = pytest.importorskip('onnxruntime')
        sess = ort.InferenceSession(src, providers=['CPUExecutionProvider'])
        got = np.concatenate([sess.run(None, {'x': x[i:i + 1]})[0] for i in range(len(x))])
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    dst, info, _ = rewritten(src, tmp_path / 'r.circle')
    assert info['reversed_slices'] == 1 and 'CONCATENATION' in ops(dst)
    _step_is_the_gradient(src, forward, tmp_path, ('w1', 'w2'), x, exported=True)
    # utrain's forward (the board's code under CPython; ONERT 0.1.0 gives other values for
    # the SPLIT_V prepare makes of the slices: spellings.splits_to_slices) = numpy
    from test_parity import new_trainer
    tr = new_trainer(os.fspath(tmp_path / 'run' / 'model.flat'), os.fspath(tmp_path / 'run' / 'weights.wof'))
    got = np.stack([np.array(tr.predict(x[i:i + 1]), np.float64).reshape(-1) for i in range(len(x))])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
