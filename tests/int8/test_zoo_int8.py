"""The int8 zoo models made by bench/zoo/make_keras.py for issue 29 (MobileNetV2-0.35 at
128x128, the MCUNet/ProxylessNAS-like net with 3/5/7 kernels, MobileNetV2-0.35 96x96
pre-trained on the digits 0-4) load, plan, and their int8 forward as utrain runs it
(row bands, streamed frozen weights, residual ADDs, SAME padding at stride 2) gives
TFLite Micro's logits bit for bit."""
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

KERAS = os.path.join(ROOT, 'bench', 'zoo', 'keras')
MODELS = ['mobilenetv2_035_128_int8.tflite', 'mcunet_96_int8.tflite',
          'mobilenetv2_035_96_digits_int8.tflite']


def _logits(path, tmp_path):
    """The graph without its final SOFTMAX, and that cut as a file for TFLite Micro."""
    g = read_model(path)
    assert g.ops[-1].name == 'SOFTMAX'
    g.ops = g.ops[:-1]
    g.outputs = [g.ops[-1].outputs[0]]
    out = str(tmp_path / 'cut.tflite')
    save_graph(g, out)
    return g, out


@pytest.mark.parametrize('name', MODELS)
def test_zoo_int8_forward_bit_exact_with_tflite_micro(tmp_path, name):
    from tflite_micro.python.tflite_micro import runtime
    g, cut = _logits(os.path.join(KERAS, name), tmp_path)
    shape = g.tensors[g.inputs[0]].shape
    m = quant.meta(g, 'last:2')
    quant.write(g, str(tmp_path), 'last:2', m)
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)                    # as the board reads it
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(cut)
    for seed in (0, 1):
        x = np.random.default_rng(seed).random(shape, dtype=np.float32) * 2 - 1
        xq = net.quantize_input(x.ravel().tolist())
        it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(shape), 0)
        it.invoke()
        want = it.get_output(0).ravel()
        got = np.frombuffer(bytes(net.forward(xq)), np.int8)
        assert np.array_equal(got, want), (name, seed)
        assert len(set(want.tolist())) > 1         # logits that tell the classes apart


def test_zoo_mcunet_has_the_searched_kernels():
    """The MCUNet-like file holds depthwise convolutions of each kernel size 3, 5 and 7,
    expansion 1x1 convolutions and residual ADDs (what makes it not a MobileNetV2)."""
    g = read_model(os.path.join(KERAS, 'mcunet_96_int8.tflite'))
    ks = {tuple(g.tensors[o.inputs[1]].shape[1:3]) for o in g.ops
          if o.name == 'DEPTHWISE_CONV_2D'}
    assert ks == {(3, 3), (5, 5), (7, 7)}
    assert sum(o.name == 'ADD' for o in g.ops) >= 2
