"""The PyTorch zoo nets (bench/zoo/mobilenet.py) as full-integer int8 circle files (issue 29):
a minimal post-training quantizer of the form torch.ao's PT2E convert writes (int8 weights
per output channel read through quantized_decomposed.dequantize_per_channel; quantize /
dequantize_per_tensor pairs, int8 asymmetric, on the input and every op's output; a
conv followed by ReLU6 observed after the activation; a pool at its input's scale, as
TFLite requires), BatchNorm folded first, calibrated (min/max) on make_keras.data_image,
the synthetic images the Keras int8 files are calibrated on; converted by tico 0.3, which
folds the pairs into circle quantization parameters.  torch 2.13 has no PT2E quantizer
(it moved to torchao) and tico's own PTQ wrappers (wrapq) cover Linear/Conv/LayerNorm
modules of language models, not ReLU6, residual adds or pooling: hence this one.

What tico writes and what then happens to it:
* biases stay float32 (tico quantizes a bias for uint8 and int16 inputs only): prepare
  rounds them to int32 at s_x * s_W (quant.zero_bias), as TFLite's converter does;
* each ReLU6 is an op of its own: fuse_acts() folds it into the conv before it (TFLite's
  int8 form: one requantization to the activation's scale; ONERT 0.1.0 has no int8 RELU6);
* the net takes NHWC input and averages over H and W of NHWC (permutes in front and
  before the mean: tico's transposes then cancel; ONERT has no int8 TRANSPOSE), the
  MEAN Keras's nets end with (an AVERAGE_POOL_2D's gradient is an int32 map: the
  PyTorch MobileNetV2 planned 130 KB of gradient buffers for w62 with one, 25 with MEAN).

    python -m bench.zoo.torch_int8 [--out DIR] [NAMES]   # mbv2_96 mbv2_128 mcunet
    python -m bench.zoo.torch_int8 --out DIR --digits 12 mbv2_96   # + digits()' pre-trained file

writes <name>_int8.circle (0.5-0.6 MB each: not committed, as the float tico files; build()
caches them as mobilenet.build does) and prints their size.
"""
from __future__ import annotations

import copy
import operator
import os

import numpy as np
import torch
from torch import nn

try:
    from . import mobilenet
    from .make_keras import data_image
except ImportError:                     # run as a script: bench/zoo is sys.path[0]
    import mobilenet
    from make_keras import data_image

ACTS = (nn.ReLU6, nn.ReLU)


def _qd():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the ops)
    return torch.ops.quantized_decomposed


def fold_bn(model):
    """A copy of model (eval) with each BatchNorm2d that follows a Conv2d in a Sequential
    folded into it."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    m = copy.deepcopy(model).eval()

    def walk(mod):
        names = list(mod._modules)
        for i, n in enumerate(names):
            c = mod._modules[n]
            prev = mod._modules[names[i - 1]] if i else None
            if isinstance(c, nn.BatchNorm2d) and isinstance(prev, nn.Conv2d):
                mod._modules[names[i - 1]] = fuse_conv_bn_eval(prev, c)
                mod._modules[n] = nn.Identity()
            else:
                walk(c)
    walk(m)
    return m


class Observer(nn.Module):
    """min/max while calibrating; then the Q/DQ pair of an int8 asymmetric tensor."""

    def __init__(self):
        super().__init__()
        self.lo = self.hi = self.qp = None

    def forward(self, x):
        if self.qp is None:
            self.lo = float(x.min()) if self.lo is None else min(self.lo, float(x.min()))
            self.hi = float(x.max()) if self.hi is None else max(self.hi, float(x.max()))
            return x
        Q, (s, z) = _qd(), self.qp
        return Q.dequantize_per_tensor(Q.quantize_per_tensor(x, s, z, -128, 127, torch.int8),
                                       s, z, -128, 127, torch.int8)

    def freeze(self):
        lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
        s = max((hi - lo) / 255.0, 1e-8)
        self.qp = (s, int(max(-128, min(127, round(-128 - lo / s)))))


class QWeight(nn.Module):
    """A Conv2d / Linear with int8 weights per output channel (symmetric, +-127, zero
    point 0) read through dequantize_per_channel; the bias float (tico keeps it so)."""

    def __init__(self, mod):
        super().__init__()
        w = mod.weight.detach()
        s = w.abs().flatten(1).amax(1).clamp(min=1e-12) / 127.0
        q = torch.round(w / s.view(-1, *[1] * (w.dim() - 1))).clamp(-127, 127)
        self.register_buffer('wq', q.to(torch.int8))
        self.register_buffer('ws', s.float())
        self.register_buffer('wz', torch.zeros(len(s), dtype=torch.int64))
        self.bias = None if mod.bias is None else nn.Parameter(mod.bias.detach().clone())
        self.kw = None
        if isinstance(mod, nn.Conv2d):
            self.kw = dict(stride=mod.stride, padding=mod.padding, dilation=mod.dilation,
                           groups=mod.groups)

    def forward(self, x):
        w = _qd().dequantize_per_channel(self.wq, self.ws, self.wz, 0, -128, 127, torch.int8)
        if self.kw is None:
            return nn.functional.linear(x, w, self.bias)
        return nn.functional.conv2d(x, w, self.bias, **self.kw)


def quantize(model, calib, batch=8):
    """model (eval) as its fake-quantized Q/DQ form, calibrated on calib (a tensor of
    inputs): what tico.convert turns into an int8 circle."""
    import torch.fx as fx
    g = fx.symbolic_trace(fold_bn(model))
    mods = dict(g.named_modules())
    obs, shared = [], {}

    def observe(node):
        name = 'obs%d' % len(obs)
        obs.append(name)
        g.add_submodule(name, Observer())
        with g.graph.inserting_after(node):
            o = g.graph.call_module(name, (node,))
        node.replace_all_uses_with(o, delete_user_cb=lambda u: u is not o)
        return name

    def kind(node):
        return type(mods.get(node.target)) if node.op == 'call_module' else None

    for node in list(g.graph.nodes):
        k = kind(node)
        if node.op == 'placeholder' or k in ACTS:
            observe(node)
        elif k in (nn.Conv2d, nn.Linear):
            us = list(node.users)
            if not (len(us) == 1 and kind(us[0]) in ACTS):     # else observed after it
                observe(node)
        elif (node.op == 'call_function' and node.target in (operator.add, torch.add)) or \
                (node.op == 'call_method' and node.target in ('add', 'mean')):
            observe(node)
        elif node.op == 'call_function' and node.target in (nn.functional.avg_pool2d,
                                                            nn.functional.max_pool2d):
            src = node.args[0]
            while kind(src) is nn.Identity:
                src = src.args[0]
            name = observe(node)
            if src.op == 'call_module' and src.target in obs:
                shared[name] = src.target           # a pool keeps its input's scale
        elif node.op == 'call_function' or node.op == 'call_method':
            if node.target not in ('flatten', 'permute', 'view', 'reshape', torch.flatten):
                raise ValueError(f'torch_int8.quantize: no rule for {node.op} {node.target}')
    g.recompile()
    with torch.no_grad():
        for i in range(0, len(calib), batch):
            g(calib[i:i + batch])
    for name in obs:
        g.get_submodule(name).freeze()
    for name in sorted(shared, key=obs.index):
        g.get_submodule(name).qp = g.get_submodule(shared[name]).qp
    for name, mod in list(g.named_modules()):
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            parent, _, leaf = name.rpartition('.')
            setattr(g.get_submodule(parent) if parent else g, leaf, QWeight(mod))
    return g.eval()


class NHWC(nn.Module):
    """A zoo net (features, classifier) on NHWC input, the mean over H and W of NHWC."""

    def __init__(self, m):
        super().__init__()
        self.features, self.classifier = m.features, m.classifier

    def forward(self, x):
        # (a MEAN over H and W of NHWC, as Keras's: its gradient is a broadcast row, where
        # an AVERAGE_POOL_2D's is an int32 map; the permute cancels tico's own)
        y = self.features(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1).mean((1, 2))
        return self.classifier(y)


def fuse_acts(path, out=None):
    """CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED read only by a RELU / RELU6 become the
    op with that fused activation, writing the activation's output (its scale) in place.
    Returns how many."""
    from host_tools.formats.circle_io import read_model
    from host_tools.graph.inout import save_graph
    from host_tools.graph.edit import consumers, remove_op
    g = read_model(path)
    n = 0
    for op in list(g.ops):
        if op.name not in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED') or \
                (op.options or {}).get('fused_activation_function', 'NONE') != 'NONE':
            continue
        cs = consumers(g, op.outputs[0])
        if len(cs) != 1 or cs[0].name not in ('RELU', 'RELU6') or op.outputs[0] in g.outputs:
            continue
        op.options = dict(op.options, fused_activation_function=cs[0].name)
        op.outputs = [cs[0].outputs[0]]
        remove_op(g, cs[0])
        n += 1
    save_graph(g, out or path)
    return n


def convert(model, calib, path):
    """model (eval, NHWC input) quantized on calib, converted by tico, activations fused,
    written to path."""
    import tico
    qm = quantize(model, torch.as_tensor(calib))
    tmp = path + '.%d.tmp.circle' % os.getpid()
    tico.convert(qm, (torch.as_tensor(calib[:1]),)).save(tmp)
    fuse_acts(tmp)
    os.replace(tmp, path)
    return qm


def int32_biases(path, out):
    """A copy of int8 file path at out with each float32 bias rounded to int32 at
    s_x * s_W (quant.zero_bias: what prepare does, TFLite's converter's rule): the form
    TFLite Micro's int8 kernels read (the zoo table's reference).  Returns out."""
    from host_tools.formats.circle_io import read_model
    from host_tools.graph.inout import save_graph
    from host_tools.prepare.quant import zero_bias
    g = read_model(path)
    for op in g.ops:
        if op.name in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED') and \
                len(op.inputs) > 2 and op.inputs[2] >= 0 and \
                g.tensors[op.inputs[2]].dtype == 'float32':
            zero_bias(g, op, g.tensors[op.inputs[0]].quant['scale'][0],
                      list(g.tensors[op.inputs[1]].quant['scale']), g.tensors[op.inputs[2]])
    save_graph(g, out)
    return out


SIZE = {'mbv2_96': 96, 'mbv2_128': 128, 'mcunet': 96}


def build(name, seed=0, out=None, n_calib=32):
    """<name>_int8.circle of zoo net name (seeded as mobilenet.model), calibrated on
    n_calib of make_keras.data_image at its size (the Keras int8 files' data); made once
    into the cache (mobilenet.cache_dir) or out.  Returns its path."""
    path = os.path.join(out or mobilenet.cache_dir(), '%s-s%d_int8.circle' % (name, seed))
    if not os.path.exists(path):
        m, shape, _ = mobilenet.model(name, seed)
        x, _ = data_image(n_calib, size=SIZE[name])
        convert(NHWC(m).eval(), x, path)
    return path


def digits(out=None, epochs=12, seed=0, log=print):
    """The PyTorch MobileNetV2-0.35 96x96 (mobilenet.model('mbv2_96', seed)) pre-trained on
    scikit-learn's digits 0-4 as make_keras.py `digits` pre-trains the Keras file (8x8
    upscaled to 96x96x3 in [-1, 1], the last fifth held out, Adam 0.003, batch 32,
    BatchNorm momentum 0.1 = Keras's 0.9, on CPU, one thread: the same bytes each time),
    then quantized by convert() calibrated on the first 64 training digits (as make_keras
    calibrates the Keras digits file): mbv2_96-digits-s<seed>_int8.circle, made once into
    the cache (mobilenet.cache_dir) or out.  issue 29's bench.sparse task on it (digits
    5-9) is session 15's h45z table.  Returns its path."""
    from .make_keras import digits_split, PRETRAIN
    path = os.path.join(out or mobilenet.cache_dir(), 'mbv2_96-digits-s%d_int8.circle' % seed)
    if os.path.exists(path):
        return path
    torch.set_num_threads(1)
    x, y = digits_split(PRETRAIN)
    k = len(y) * 4 // 5
    m, _, _ = mobilenet.model('mbv2_96', seed)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.momentum = 0.1
    net = NHWC(m)
    opt = torch.optim.Adam(net.parameters(), 0.003)
    torch.manual_seed(seed)
    X, Y = torch.from_numpy(x[:k]), torch.from_numpy(y[:k].astype(np.int64))
    for ep in range(epochs):
        net.train()
        order, tot = torch.randperm(len(Y)), 0.0
        for i in range(0, len(Y), 32):
            b = order[i:i + 32]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(X[b]), Y[b])
            loss.backward()
            opt.step()
            tot += float(loss) * len(b)
        log('digits 0-4 epoch %d/%d loss %.4f' % (ep + 1, epochs, tot / len(Y)))
    net.eval()
    with torch.no_grad():
        p = torch.cat([net(torch.from_numpy(x[i:i + 64])) for i in range(k, len(y), 64)])
    log('held-out digits 0-4 (float): %.3f' % float((p.argmax(1).numpy() == y[k:]).mean()))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    convert(net, x[:64], path)
    return path


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('names', nargs='*', default=list(SIZE))
    ap.add_argument('--out', default=None)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--digits', type=int, default=0, metavar='EPOCHS',
                    help='also the MobileNetV2 96x96 pre-trained on digits 0-4 for EPOCHS '
                    '(12 as session 15: ~3 minutes on one CPU thread): digits()')
    a = ap.parse_args(argv)
    if a.digits:
        p = digits(a.out, a.digits, a.seed)
        print(p, '%.0f KB' % (os.path.getsize(p) / 1024))
    for n in a.names:
        p = build(n, a.seed, a.out)
        print(p, '%.0f KB' % (os.path.getsize(p) / 1024))


if __name__ == '__main__':
    main()
