"""The zoo's MobileNet family in PyTorch (issue 15), defined here (torchvision's wheel
cannot load its C ops beside CPU torch) and converted with tico:

  mbv2_96    MobileNetV2, width 0.35, 96x96x3 in, 10 classes (Sandler et al. 2018; the
             width-0.35 channel rounding of torchvision's _make_divisible: 16-8-8-16-24-32-
             56-112, head 1x1 conv to 1280 kept at full width, as the reference keeps it)
  mbv2_128   the same network at 128x128 (what TTE fine-tunes in about 150 KB of SRAM)
  mcunet     an MCUNet/ProxylessNAS-like net: inverted residual blocks with searched
             kernel sizes (3/5/7) and expansion ratios (3/4/6), no wide head (the last
             block's 160 channels feed the classifier), 96x96x3 in

ReLU6 activations, BatchNorm after every conv (folded into the conv by prepare when frozen),
residual adds where the block keeps shape.  Weights are PyTorch's default initialisation,
seeded; BatchNorm statistics and affine parameters are seeded non-trivial values (unit
statistics would hide a wrong fold).  Exported in eval mode (tico refuses train-mode
BatchNorm).  The circle files are about 1.6 MB each, so they are not committed: `build()`
writes them into a cache directory ($UTRAIN_ZOO_CACHE, else the system temp directory),
keyed by name and seed, and reuses them.

    python bench/zoo/mobilenet.py [--out DIR]     # writes the three .circle files
"""
from __future__ import annotations

import os
import tempfile

import torch
from torch import nn

try:
    from .make_keras import MCUNET_CFG
except ImportError:                     # run as a script: bench/zoo is sys.path[0]
    from make_keras import MCUNET_CFG


def _div8(v, d=8):
    # torchvision's _make_divisible: round to a multiple of 8, never below 90 % of v
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


def _cbr(i, o, k, s=1, groups=1, act=True):
    layers = [nn.Conv2d(i, o, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o)]
    return layers + [nn.ReLU6()] if act else layers


class InvertedResidual(nn.Module):
    def __init__(self, i, o, s, e, k=3):
        super().__init__()
        h = i * e
        layers = [] if e == 1 else _cbr(i, h, 1)
        layers += _cbr(h, h, k, s, groups=h) + _cbr(h, o, 1, act=False)
        self.conv = nn.Sequential(*layers)
        self.res = s == 1 and i == o

    def forward(self, x):
        y = self.conv(x)
        return x + y if self.res else y


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, stride s) of the paper's Table 2
    CFG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
           (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, width=0.35, classes=10, last=1280):
        super().__init__()
        c = _div8(32 * width)
        layers = _cbr(3, c, 3, 2)
        for t, ch, n, s in self.CFG:
            o = _div8(ch * width)
            for j in range(n):
                layers.append(InvertedResidual(c, o, s if j == 0 else 1, t))
                c = o
        last = _div8(last * max(1.0, width))
        layers += _cbr(c, last, 1)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class MCUNetLike(nn.Module):
    # (kernel, expansion, channels, stride): a ProxylessNAS/MCUNet-style searched stack,
    # the one make_keras.py's Keras MCUNet-like net is built from
    CFG = MCUNET_CFG

    def __init__(self, classes=10):
        super().__init__()
        c = 16
        layers = _cbr(3, c, 3, 2)
        for k, e, o, s in self.CFG:
            layers.append(InvertedResidual(c, o, s, e, k))
            c = o
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


# name -> (builder, input shape NCHW, classes)
NETS = {
    'mbv2_96': (lambda: MobileNetV2(0.35), (1, 3, 96, 96), 10),
    'mbv2_128': (lambda: MobileNetV2(0.35), (1, 3, 128, 128), 10),
    'mcunet': (lambda: MCUNetLike(), (1, 3, 96, 96), 10),
}


def _randomise_norms(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.running_mean.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
                m.bias.copy_((torch.rand(c, generator=g) - 0.5) * 0.2)
    return model.eval()


def model(name, seed=0):
    """(eval-mode PyTorch model, input shape, classes), seeded."""
    make, shape, classes = NETS[name]
    torch.manual_seed(seed)
    return _randomise_norms(make(), seed + 1), shape, classes


def cache_dir():
    d = os.environ.get('UTRAIN_ZOO_CACHE') or os.path.join(tempfile.gettempdir(),
                                                          'utrain-zoo-%d' % os.getuid())
    os.makedirs(d, exist_ok=True)
    return d


def build(name, seed=0, out=None):
    """The circle file of zoo model `name` (converted once with tico, then reused from
    the cache); returns (path, PyTorch model, input shape, classes)."""
    m, shape, classes = model(name, seed)
    path = os.path.join(out or cache_dir(), '%s-s%d.circle' % (name, seed))
    if not os.path.exists(path):
        import tico
        tmp = path + '.%d.tmp' % os.getpid()
        tico.convert(m, (torch.zeros(shape),)).save(tmp)
        os.replace(tmp, path)           # atomic: a concurrent build never sees half a file
    return path, m, shape, classes


def images(shape, n, seed=0, classes=10):
    """n seeded images [n, H, W, 3] (NHWC, as prepared models take them) in [0, 1] with
    labels: smooth random colour fields (a class-dependent mean colour plus noise), so
    the activations look like those of natural images rather than white noise."""
    import numpy as np
    rng = np.random.default_rng(seed)
    _, c, h, w = shape
    y = rng.integers(0, classes, n)
    base = rng.random((classes, 1, 1, c)).astype(np.float32)
    lo = rng.random((n, h // 8, w // 8, c)).astype(np.float32)
    x = np.repeat(np.repeat(lo, 8, 1), 8, 2)[:, :h, :w]
    x = 0.5 * x + 0.5 * base[y] + 0.05 * rng.standard_normal((n, h, w, c)).astype(np.float32)
    return np.clip(x, 0, 1).astype(np.float32), y.astype(np.int64)


def prepared(name, out, n=16, epochs=3, train='last:2', backend='ulab', **kw):
    """A run folder for zoo model `name`: n seeded images, SGD batch 1, frozen weights
    streamed; returns prepare's summary."""
    import numpy as np
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    from host_tools.prepare.pipeline import prepare
    path, _, shape, _ = build(name)
    x, y = images(shape, n)
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, 'data.npz')
    np.savez(data, x=x, y=y)
    kw.setdefault('stream', True)
    return prepare(path, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=epochs,
                   optimizer='sgd', batch=1, train=train, backend=backend, **kw)


def epoch_times(out, micropython, heap='8M'):
    """ms per sample of each epoch of train.py in out on `micropython` (utrain .mpy)."""
    import re
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    from host_tools.target import runner
    os.environ['MICROPYTHON'] = micropython     # staged for its .mpy version and native arch
    runner.stage(out)
    env = dict(os.environ, MICROPYPATH=':lib')
    r = subprocess.run([micropython, '-X', 'heapsize=' + heap, 'train.py'], cwd=out, env=env,
                       capture_output=True, text=True, timeout=3600)
    if r.returncode:
        raise RuntimeError(r.stdout + r.stderr)
    return [float(v) for v in re.findall(r'\(([0-9.]+) ms/sample', r.stdout)]


def bench_cache(micropythons, n=16):
    """Print, per model and build: epoch 1 (computes and caches the frozen prefix) against
    the later epochs (from the cache), ms per training sample."""
    print('| model | train | build | epoch 1 ms/sample | later epochs ms/sample | ratio |')
    print('|---|---|---|---|---|---|')
    for name in ('mbv2_96', 'mbv2_128', 'mcunet'):
        for label, mp in micropythons:
            out = os.path.join(tempfile.mkdtemp(), name)
            prepared(name, out, n=n, epochs=3, backend='ulab' if 'ulab' in label else 'fallback',
                     cache=True)
            t = epoch_times(out, mp)
            later = sum(t[1:]) / len(t[1:])
            print(f'| {name} | last:2 | {label} | {t[0]:.1f} | {later:.2f} | {t[0] / later:.0f} |',
                  flush=True)


KERAS_MBV2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'keras',
                          'mobilenetv2_035_96_float.tflite')


def _keras_folder(model, out, n, epochs, **kw):
    """prepare the Keras MobileNetV2 file model into out with its classifier training
    (last:2), n seeded images, a quarter held out; trained.wof always written (keep_best
    off) so a run that finishes is seen."""
    import json
    import numpy as np
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    from host_tools.prepare.pipeline import prepare
    x, y = images((1, 3, 96, 96), n)
    os.makedirs(out, exist_ok=True)
    data = os.path.join(out, 'data.npz')
    np.savez(data, x=x, y=y)
    s = prepare(model, out, data=data, loss='scce', lr=0.01, epochs=epochs, optimizer='sgd',
                batch=1, train='last:2', test_split=0.25, log=lambda *a: None, **kw)
    with open(os.path.join(out, 'train.json')) as f:
        c = json.load(f)
    c['run']['keep_best'] = False
    with open(os.path.join(out, 'train.json'), 'w') as f:
        json.dump(c, f, indent=1)
    return s


def keras_prepared(out, n, epochs, backend, bands=None):
    """A run folder for the Keras MobileNetV2-0.35 96x96 (float), the rest run on the
    board (--cache: the board computes the frozen prefix from its own samples in epoch
    1).  bands: prepare's --bands (None: its choice, 0: none)."""
    return _keras_folder(KERAS_MBV2, out, n, epochs, backend=backend, stream=True, cache=True,
                         bands=bands)


def bench_whole(micropythons, n=4):
    """Print, per build, the Keras MobileNetV2 run whole on the board without and with
    row bands: plan, smallest heap (bisection, 1 KB; one epoch of n samples, evaluation,
    checkpoint), and ms per training sample in epoch 1 and from the board's prefix cache."""
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    from host_tools.plan.memory import smallest_heap
    print('| build | row bands | plan KB | smallest heap KB | epoch 1 ms/sample | later ms/sample |')
    print('|---|---|---|---|---|---|')
    for label, mp in micropythons:
        os.environ['MICROPYTHON'] = mp
        backend = 'ulab' if 'ulab' in label else 'fallback'
        for bands in (0, None):
            out = os.path.join(tempfile.mkdtemp(), 'mbv2')
            s = keras_prepared(out, n, 1, backend, bands)
            plan = s['heap']['total']
            h = smallest_heap(out, lo=64 * 1024, hi=max(4096 * 1024, 2 * plan))
            t_out = os.path.join(tempfile.mkdtemp(), 'mbv2')
            keras_prepared(t_out, 16, 3, backend, bands)
            t = epoch_times(t_out, mp)
            later = sum(t[1:]) / len(t[1:])
            print(f'| {label} | {"none" if bands == 0 else s["bands"]} | {plan // 1024} | '
                  f'{h // 1024 if h else "-"} | {t[0]:.0f} | {later:.1f} |', flush=True)


KERAS_MBV2_INT8 = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'keras',
                               'mobilenetv2_035_96_int8.tflite')


def keras_int8_prepared(out, n, epochs, cache):
    """A run folder for the Keras MobileNetV2-0.35 96x96 int8 model training as int8, the
    rest run on the board (cache: once per sample into the board's own prefix cache,
    before training; else the whole model every step)."""
    return _keras_folder(KERAS_MBV2_INT8, out, n, epochs, cache=cache)


def bench_int8(micropythons, n=8, float_too=True):
    """Print, per build, the heap plan and the smallest heap (bisection, 1 KB; one epoch
    of n samples and the evaluation) of the Keras MobileNetV2 int8 model training its
    classifier as int8 (the board's prefix cache, and the whole model every step) beside
    the float path's (the float Keras model, row bands, as bench_whole), and their
    ratios."""
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    from host_tools.plan.memory import smallest_heap
    print('| build | int8, board prefix cache: plan / smallest KB | int8, whole model every '
          'step: plan / smallest KB | float, row bands: plan / smallest KB | '
          'float / int8 (cache) | plan / smallest (int8 cache, whole) |')
    print('|---|---|---|---|---|---|')
    for label, mp in micropythons:
        os.environ['MICROPYTHON'] = mp
        h, plan = {}, {}
        for kind in ('cache', 'whole', 'float'):
            if kind == 'float' and not float_too:
                continue
            out = os.path.join(tempfile.mkdtemp(), 'mbv2')
            if kind == 'float':
                s = keras_prepared(out, n, 1, 'ulab' if 'ulab' in label else 'fallback')
            else:
                s = keras_int8_prepared(out, n, 1, kind == 'cache')
            plan[kind] = s['heap']['total']
            h[kind] = smallest_heap(out, lo=64 * 1024, hi=2048 * 1024)
        kb = {k: '%d / %s' % (plan[k] // 1024, v // 1024 if v else '-') for k, v in h.items()}
        r = '%.2f' % (h['float'] / h['cache']) if h.get('float') and h['cache'] else '-'
        q = ', '.join('%.2f' % (plan[k] / h[k]) if h[k] else '-' for k in ('cache', 'whole'))
        print(f'| {label} | {kb["cache"]} | {kb["whole"]} | {kb.get("float", "-")} | {r} | {q} |',
              flush=True)


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', help='directory for the .circle files (default: the cache)')
    ap.add_argument('--bench', nargs='*', metavar='LABEL=MICROPYTHON',
                    help='time epoch 1 against later epochs (frozen-prefix cache) on these builds')
    ap.add_argument('--whole', nargs='*', metavar='LABEL=MICROPYTHON',
                    help='the Keras MobileNetV2 run whole on the board, without and with row '
                         'bands: plan, smallest heap, epoch times (a label with "ulab" plans '
                         'for ulab)')
    ap.add_argument('--int8', nargs='*', metavar='LABEL=MICROPYTHON',
                    help='the Keras MobileNetV2 int8 model training as int8: smallest heap '
                         'with the board prefix cache and whole, beside the float path')
    a = ap.parse_args()
    if a.int8 is not None:
        bench_int8([b.split('=', 1) for b in a.int8] or [('fallback', 'micropython')])
        return
    if a.whole is not None:
        bench_whole([b.split('=', 1) for b in a.whole] or [('fallback', 'micropython')])
        return
    if a.bench is not None:
        bench_cache([b.split('=', 1) for b in a.bench] or [('fallback', 'micropython')])
        return
    for name in NETS:
        path, m, _, _ = build(name, out=a.out)
        n = sum(p.numel() for p in m.parameters())
        print(f'{name}: {n} parameters -> {path} ({os.path.getsize(path)} bytes)')


if __name__ == '__main__':
    main()
