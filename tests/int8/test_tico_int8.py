"""A PyTorch net quantized to full-integer int8 (bench/zoo/torch_int8.py: int8 per-channel
weights, int8 activations, the form of torch.ao's PT2E convert) and converted by tico 0.3
trains as int8: tico leaves the biases float32 (it quantizes biases of uint8 and int16
inputs only), prepare rounds them to int32 at s_x * s_W as TFLite's converter does; a
PyTorch NCHW net's TRANSPOSE before its global MEAN is sunk through it (rewrite's
cancel_transposes, now run on int8 graphs).  utrain's int8 forward against independent
runtimes: ONERT 0.1.0 (it has no int8 MEAN, FULLY_CONNECTED, TRANSPOSE or RELU6: the
NHWC net's features, cut before its MEAN) and TFLite Micro (the whole file, its biases
as int32), bit for bit."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.graph.inout import save_graph  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402

torch = pytest.importorskip('torch')
pytest.importorskip('tico')
pytest.importorskip('torch.ao.quantization.fx._decomposed')   # quantized_decomposed ops
nn = torch.nn


def _net(seed=0):
    """conv-BN-ReLU6 /2, an inverted residual block with its ADD, a 5x5 depthwise one at
    stride 2, a classifier: the zoo nets' parts (bench/zoo/mobilenet.py), 16x16x3 in."""
    from bench.zoo.mobilenet import InvertedResidual, _cbr, _randomise_norms

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(*_cbr(3, 8, 3, 2), InvertedResidual(8, 8, 1, 3),
                                          InvertedResidual(8, 16, 2, 2, 5))
            self.classifier = nn.Linear(16, 4)

        def forward(self, x):
            return self.classifier(self.features(x).mean((2, 3)))
    torch.manual_seed(seed)
    return _randomise_norms(Tiny(), seed + 1)


def _int32_biases(g):
    """g with each float32 bias of an int8 op as int32 at s_x * s_W (what TFLite Micro and
    ONERT's int8 kernels read; prepare does the same, quant.zero_bias)."""
    for op in g.ops:
        if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED'):
            b = g.tensors[op.inputs[2]]
            sc = g.tensors[op.inputs[0]].quant['scale'][0] * \
                np.asarray(g.tensors[op.inputs[1]].quant['scale'], np.float64)
            b.data = np.round(np.asarray(b.data, np.float64) / sc).astype(np.int32)
            b.dtype = 'int32'
            b.quant = {'scale': sc.tolist(), 'zero_point': [0] * len(sc),
                       'quantized_dimension': 0}
    return g


def _utrain(g, d, monkeypatch):
    """utrain's int8 net of g as the board reads it; the logits at the file's scale
    (rewritten() widens narrow logits for training: not what a forward check wants)."""
    monkeypatch.setattr(quant, '_widen_logits', lambda g: None)
    g = quant.rewritten(g)
    m = quant.meta(g, 'last:2')
    quant.write(g, str(d), 'last:2', m)
    with open(os.path.join(d, 'q8.json')) as f:
        return Q8Net(json.load(f), os.path.join(d, 'weights.wof'))


def _same(net, run, shape, n=4):
    outs = set()
    for seed in range(n):
        x = np.random.default_rng(seed).random(shape, dtype=np.float32)
        xq = net.quantize_input(x.ravel().tolist())
        want = np.asarray(run(np.frombuffer(bytes(xq), np.int8).reshape(shape))).ravel()
        got = np.frombuffer(bytes(net.forward(xq)), np.int8)
        assert np.array_equal(got, want), (seed, got, want)
        outs.add(tuple(want.tolist()))
    assert len(outs) > 1                    # outputs that depend on the input


def _tflm(path):
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(path)

    def run(x):
        it.set_input(x, 0)
        it.invoke()
        return it.get_output(0)
    return run


@pytest.fixture(scope='module')
def nhwc(tmp_path_factory):
    from bench.zoo import torch_int8
    path = str(tmp_path_factory.mktemp('tico8') / 'tiny_nhwc.circle')
    torch_int8.convert(torch_int8.NHWC(_net()).eval(), torch.rand(32, 16, 16, 3), path)
    return path


def test_tico_int8_file_is_what_prepare_reads(nhwc):
    """The class the loader handles: int8 activations and per-channel int8 weights, float32
    biases; every activation fused into its conv (torch_int8.fuse_acts)."""
    g = read_model(nhwc)
    ws = [op for op in g.ops if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED')]
    assert len(ws) == 8 and not any(op.name in ('RELU6', 'TRANSPOSE') for op in g.ops)
    assert {g.tensors[op.inputs[2]].dtype for op in ws} == {'float32'}
    assert {g.tensors[op.inputs[1]].dtype for op in ws} == {'int8'}
    assert all(len(g.tensors[op.inputs[1]].quant['scale']) > 1 for op in ws)
    d = quant.meta(quant.rewritten(g), 'all')
    assert sum(bool(x.get('train')) for x in d['layers']) == 8


def test_tico_int8_features_bit_exact_with_onert(nhwc, tmp_path, monkeypatch):
    onert = pytest.importorskip('onert.infer')
    g = read_model(nhwc)
    k = next(i for i, op in enumerate(g.ops) if op.name == 'MEAN')
    g.outputs, g.ops = [g.ops[k].inputs[0]], g.ops[:k]
    cut = str(tmp_path / 'cut.circle')
    save_graph(_int32_biases(g), cut)
    net = _utrain(read_model(cut), tmp_path, monkeypatch)
    sess = onert.session(cut)
    _same(net, lambda x: sess.infer([x])[0], g.tensors[g.inputs[0]].shape)


def test_tico_int8_logits_bit_exact_with_tflite_micro(nhwc, tmp_path, monkeypatch):
    pytest.importorskip('tflite_micro')
    g = read_model(nhwc)
    ref = str(tmp_path / 'ref.tflite')
    save_graph(_int32_biases(read_model(nhwc)), ref)
    _same(_utrain(g, tmp_path, monkeypatch), _tflm(ref), g.tensors[g.inputs[0]].shape)


def test_tico_int8_nchw_transpose_mean(tmp_path, monkeypatch):
    """The PyTorch net as it is (NCHW input, x.mean((2, 3))): tico writes a TRANSPOSE to
    NHWC first and one back to NCHW before the MEAN over axes 2 and 3, which int8 training
    refused ('reduces the leading axes'); sunk through the MEAN it is one over H and W.
    The first, on the model input, leaves the board's graph (quant._hoist_input_transpose):
    the board takes the samples as NHWC (prepare lays them out on the host, input_perm),
    and export puts it back: the trained file takes NCHW as the user's did."""
    pytest.importorskip('tflite_micro')
    from bench.zoo import torch_int8
    from host_tools.prepare.pipeline import export, prepare
    from host_tools.target import runner
    from host_tools.files.dataset import read_dataset
    path = str(tmp_path / 'tiny_nchw.circle')
    torch_int8.convert(_net(1), torch.rand(32, 3, 16, 16), path)
    g = read_model(path)
    assert [op.name for op in g.ops].count('TRANSPOSE') == 2 and g.ops[-2].name == 'MEAN'
    assert g.ops[0].name == 'TRANSPOSE' and g.ops[0].inputs[0] == g.inputs[0]
    r = quant.rewritten(g)
    assert 'MEAN' in [op.name for op in r.ops] and 'TRANSPOSE' not in [op.name for op in r.ops]
    assert r.input_perm == [0, 2, 3, 1] and r.tensors[r.inputs[0]].shape == [1, 16, 16, 3]
    ref = str(tmp_path / 'ref.tflite')
    save_graph(_int32_biases(read_model(path)), ref)
    net, run = _utrain(g, tmp_path, monkeypatch), _tflm(ref)
    # the board's net on the NHWC samples = TFLite Micro on the file's NCHW ones
    _same(net, lambda x: run(x.reshape(1, 16, 16, 3).transpose(0, 3, 1, 2).copy()),
          [1, 16, 16, 3])
    # prepare, train on the host, export: NCHW data in, NHWC samples on the board, NCHW out
    rng = np.random.default_rng(0)
    x = rng.random((6, 3, 16, 16), dtype=np.float32)
    np.savez(tmp_path / 'd.npz', x=x, y=np.arange(6) % 4)
    d = str(tmp_path / 'run')
    s = prepare(path, d, data=str(tmp_path / 'd.npz'), train='last:2', epochs=1, batch=2,
                lr=0.05, log=lambda *a: None)
    assert s['int8'] and s['input_perm'] == [0, 2, 3, 1]
    xs, _ = read_dataset(os.path.join(d, 'train.ds'))        # (dequantized)
    sc, zp = r.tensors[r.inputs[0]].quant['scale'][0], r.tensors[r.inputs[0]].quant['zero_point'][0]
    want = (np.clip(np.round(x.transpose(0, 2, 3, 1) / sc) + zp, -128, 127) - zp) * sc
    assert np.allclose(np.asarray(xs).reshape(6, -1), want.reshape(6, -1), atol=sc / 4, rtol=0)
    code, out = runner.run(d, python=True, stream=False)
    assert code == 0, out
    ex = str(tmp_path / 'trained.tflite')
    export(path, os.path.join(d, 'trained.wof'), ex)
    e = read_model(ex)
    assert e.tensors[e.inputs[0]].shape == [1, 3, 16, 16] and e.ops[0].name == 'TRANSPOSE'
    assert not np.array_equal(np.asarray(e.tensors[e.ops[-1].inputs[1]].data),
                              np.asarray(_int32_biases(read_model(path)).tensors[
                                  e.ops[-1].inputs[1]].data))      # (the classifier trained)
    # evaluate of the trained file on the run's NHWC train.ds (input_perm: laid back) = on
    # the user's NCHW data
    from host_tools.prepare.infer import evaluate
    a, b = evaluate(ex, os.path.join(d, 'train.ds')), evaluate(ex, str(tmp_path / 'd.npz'))
    assert a['loss'] == pytest.approx(b['loss'], abs=1e-6) and a['transposed'], (a, b)
    # the trained file on TFLite Micro, NCHW in = utrain's board net of it, NHWC in
    run = _tflm(ex)
    _same(_utrain(read_model(ex), tmp_path / 'ex', monkeypatch),
          lambda v: run(v.reshape(1, 16, 16, 3).transpose(0, 3, 1, 2).copy()), [1, 16, 16, 3])


def test_zoo_table_row_of_a_tico_int8_net(tmp_path, monkeypatch):
    """A PyTorch int8 row of `python -m bench.zoo` (source 'torch_int8': the zoo nets
    through torch_int8.build) on the small net: made into the zoo cache once, its parity
    the int8 file's own quantization error against TFLite Micro running it (its float
    biases made int32, torch_int8.int32_biases), a plan for the dequantized training."""
    pytest.importorskip('tflite_micro')
    import argparse
    from bench.zoo import mobilenet, torch_int8
    from bench.zoo import __main__ as zoo
    monkeypatch.setenv('UTRAIN_ZOO_CACHE', str(tmp_path / 'cache'))
    monkeypatch.setitem(mobilenet.NETS, 'tiny', (_net, (1, 3, 16, 16), 4))
    monkeypatch.setitem(torch_int8.SIZE, 'tiny', 16)
    a = argparse.Namespace(rounds=1, budget=0.01, max_steps=2, no_mp=True, quick=True,
                           measure=False, boards=False, pico=False, heap='16M')
    row = zoo.measure('tiny int8 (PyTorch)', 'torch_int8', 'tiny', 2, str(tmp_path), a)
    assert os.path.exists(tmp_path / 'cache' / 'tiny-s0_int8.circle')
    ref = read_model(str(tmp_path / 'tiny_ref.tflite'))
    assert 'float32' not in {ref.tensors[op.inputs[2]].dtype for op in ref.ops
                             if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED')}
    assert row['train'] == 'last:3' and row['trained'] == (16 * 16 + 16) + (16 * 4 + 4), row  # project, FC
    assert all(int(k) > 0 for k in row['plan KB'].split(' / ')), row
    # utrain's dequantized float forward against the int8 file on TFLite Micro: a few
    # output steps of quantization error, not zero (TFLite Micro ran the int8 kernels)
    assert 1e-4 < float(row['parity']) < 5e-2, row
    assert row['ONERT'] == 'n/a (int8 file)'
