"""The peers, each a callable that trains n samples (batch 1, SGD): PyTorch eager on
the same graph and weights (one thread), and ONERT training on the same model file."""
from __future__ import annotations

import contextlib
import io

import numpy as np


class Unsupported(Exception):
    pass


# ------------------------------------------------------------------ PyTorch eager

def _same_pad(n, k, s):
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def torch_model(g, train):
    """A function x -> y running graph g in torch (NHWC kept as in circle; convs
    permute to NCHW around the call), and the list of parameters that train."""
    import torch
    import torch.nn.functional as F
    from bench.models import trained_params
    trainable = trained_params(g, train)
    params = {}
    for t in g.tensors:
        if t.data is not None and t.dtype == 'float32':
            params[t.index] = torch.nn.Parameter(torch.tensor(np.array(t.data, np.float32)),
                                                 requires_grad=t.index in trainable)
    acts = {'NONE': lambda v: v, 'RELU': F.relu, 'RELU6': lambda v: F.hardtanh(v, 0.0, 6.0),
            'RELU_N1_TO_1': lambda v: F.hardtanh(v, -1.0, 1.0), 'TANH': torch.tanh}

    def conv(op, v, depthwise):
        o = op.options
        w = params[op.inputs[1]]
        if depthwise:
            w = w.permute(3, 0, 1, 2)                  # [1,KH,KW,C*M] -> [C*M,1,KH,KW]
        else:
            w = w.permute(0, 3, 1, 2)                  # [O,KH,KW,I] -> [O,I,KH,KW]
        v = v.permute(0, 3, 1, 2)
        sh, sw = o.get('stride_h', 1), o.get('stride_w', 1)
        if o.get('padding') == 'SAME':
            ph = _same_pad(v.shape[2], w.shape[2], sh)
            pw = _same_pad(v.shape[3], w.shape[3], sw)
            v = F.pad(v, (pw[0], pw[1], ph[0], ph[1]))
        b = params.get(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
        v = F.conv2d(v, w, b, (sh, sw), groups=v.shape[1] if depthwise else 1)
        return acts[o.get('fused_activation_function', 'NONE')](v.permute(0, 2, 3, 1))

    def forward(x):
        vals = {g.inputs[0]: x}
        for op in g.ops:
            a = vals.get(op.inputs[0]) if op.inputs else None
            o = op.options
            n = op.name
            if n == 'FULLY_CONNECTED':
                w = params[op.inputs[1]]
                b = params.get(op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
                v = acts[o.get('fused_activation_function', 'NONE')](
                    F.linear(a.reshape(-1, w.shape[1]), w, b))
            elif n == 'CONV_2D':
                v = conv(op, a, False)
            elif n == 'DEPTHWISE_CONV_2D':
                v = conv(op, a, True)
            elif n == 'MEAN':
                axes = [int(i) for i in np.asarray(g.tensors[op.inputs[1]].data).ravel()]
                v = a.mean(dim=axes, keepdim=bool(o.get('keep_dims')))
            elif n in ('MAX_POOL_2D', 'AVERAGE_POOL_2D'):
                k, s = (o['filter_height'], o['filter_width']), (o['stride_h'], o['stride_w'])
                if o.get('padding') == 'SAME':
                    raise Unsupported(f'{n} SAME in the torch peer')
                f = F.max_pool2d if n == 'MAX_POOL_2D' else F.avg_pool2d
                v = acts[o.get('fused_activation_function', 'NONE')](
                    f(a.permute(0, 3, 1, 2), k, s).permute(0, 2, 3, 1))
            elif n == 'SOFTMAX':
                v = torch.softmax(a * o.get('beta', 1.0), dim=-1)
            elif n in ('RELU', 'RELU6', 'RELU_N1_TO_1', 'TANH'):
                v = acts[n](a)
            elif n == 'LOGISTIC':
                v = torch.sigmoid(a)
            elif n == 'RESHAPE':
                v = a.reshape(list(g.tensors[op.outputs[0]].shape))
            elif n in ('ADD', 'MUL', 'SUB'):
                bb = vals.get(op.inputs[1], params.get(op.inputs[1]))
                if bb is None:
                    bb = torch.tensor(g.tensors[op.inputs[1]].data)
                v = {'ADD': torch.add, 'MUL': torch.mul, 'SUB': torch.sub}[n](a, bb)
                v = acts[o.get('fused_activation_function', 'NONE')](v)
            else:
                raise Unsupported(f'op {n} not in the torch peer')
            vals[op.outputs[0]] = v
        return vals[g.outputs[0]]

    return forward, [p for p in params.values() if p.requires_grad]


def torch_trainer(g, train, x, y, classifier, lr=0.01):
    """Callable(n, j): n SGD steps of batch 1 from sample j on, in torch eager."""
    import torch
    torch.set_num_threads(1)
    forward, ps = torch_model(g, train)
    opt = torch.optim.SGD(ps, lr=lr)
    shape = [1] + list(g.tensors[g.inputs[0]].shape[1:])
    xs = [torch.tensor(x[i]).reshape(shape) for i in range(len(x))]
    if classifier:
        ys = [torch.tensor([int(v)]) for v in np.asarray(y).ravel()]
    else:
        ys = [torch.tensor(np.asarray(y[i], np.float32)).reshape(1, -1) for i in range(len(y))]

    def steps(n, j):
        for i in range(n):
            k = (j + i) % len(xs)
            opt.zero_grad()
            out = forward(xs[k]).reshape(1, -1)
            if classifier:       # the model ends in SOFTMAX: cross-entropy on probabilities
                loss = torch.nn.functional.nll_loss(torch.log(out.clamp_min(1e-7)), ys[k])
            else:
                loss = torch.nn.functional.mse_loss(out, ys[k])
            loss.backward()
            opt.step()
    steps(2, 0)                                         # warm up
    return steps


# ------------------------------------------------------------------ ONERT

def onert_trainer(path, g, n_ops_trained, x, y, classifier, lr=0.01):
    """Callable(n, j): ONERT trains n samples (one epoch of a DataLoader, batch 1)."""
    from onert.experimental.train import DataLoader, losses, optimizer, session
    n_out = int(np.prod(g.tensors[g.outputs[0]].shape))
    x = np.ascontiguousarray(x.reshape([len(x)] + list(g.tensors[g.inputs[0]].shape[1:])),
                             np.float32)
    if classifier:
        t = np.zeros((len(x), n_out), np.float32)
        t[np.arange(len(x)), np.asarray(y).ravel().astype(int)] = 1.0
    else:
        t = np.ascontiguousarray(np.asarray(y, np.float32).reshape(len(x), n_out))
    t = t.reshape([len(x)] + list(g.tensors[g.outputs[0]].shape[1:]))
    opt = optimizer.SGD(learning_rate=lr)
    opt.nums_trainable_ops = int(n_ops_trained)
    loss = losses.CategoricalCrossentropy() if classifier else losses.MeanSquaredError()
    with contextlib.redirect_stdout(io.StringIO()):
        sess = session(path)
        sess.compile(optimizer=opt, loss=loss, batch_size=1)
    loaders = {}

    def steps(n, j):
        if n not in loaders:
            idx = np.arange(n) % len(x)
            loaders[n] = (x[idx], t[idx])
        xs, ts = loaders[n]
        with contextlib.redirect_stdout(io.StringIO()):
            sess.train(DataLoader([xs], [ts], batch_size=1), epochs=1)
    steps(2, 0)
    return steps
