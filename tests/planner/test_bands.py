"""Row bands (micro/utrain/bands.py, host_tools/graph/bands.py): a frozen chain computed a few
rows at a time gives the forward pass the whole ops give, on MobileNet-like chains with
stride 2, odd sizes, explicit PADs, residual ADDs, ReLU6, dilation and depth
multipliers; the planner bounds the banded run's heap; training through the bands gives
the weights the unbanded run gives."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from repo import ROOT, no_keep_best  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.target import runner  # noqa: E402
from host_tools.plan.memory import trains_in  # noqa: E402

F32 = np.float32


def _builder(seed):
    """A CircleBuilder and its makers of random weights w(*shape) and biases bias(n)."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder()
    w = lambda *s: b.tensor('w%d' % len(b._tensors), list(s),   # noqa: E731
                            data=(rng.normal(size=s) / np.sqrt(np.prod(s[1:]))).astype(F32))
    bias = lambda n: b.tensor('b%d' % len(b._tensors), [n],   # noqa: E731
                              data=(rng.normal(size=n) * 0.1).astype(F32))
    return b, w, bias


def mbnet(path, H=23, W=21, c=6, seed=0, e=3, k=3, dil=1, mult=1, classes=4, pad=(0, 1, 0, 1)):
    """A MobileNetV2-like net: conv 3x3/2 SAME ReLU6; a block expand 1x1 - PAD - depthwise
    kxk/2 VALID - project 1x1; a residual block (expand, depthwise SAME with dilation and
    depth multiplier, project 1x1, ADD); MEAN; FULLY_CONNECTED."""
    b, w, bias = _builder(seed)
    x = b.tensor('x', [1, H, W, 3])
    b.inputs(x)

    def conv(x, shape, o, kk=1, s=1, padding='SAME', act='RELU6', d=1):
        h = (shape[1] + s - 1) // s if padding == 'SAME' else (shape[1] - d * (kk - 1) - 1) // s + 1
        ww = (shape[2] + s - 1) // s if padding == 'SAME' else (shape[2] - d * (kk - 1) - 1) // s + 1
        y = b.tensor('y%d' % len(b._tensors), [1, h, ww, o])
        b.op('CONV_2D', [x, w(o, kk, kk, shape[3]), bias(o)], [y], padding=padding, stride_h=s,
             stride_w=s, dilation_h_factor=d, dilation_w_factor=d, fused_activation_function=act)
        return y, [1, h, ww, o]

    def dw(x, shape, kk, s, padding, m=1, d=1):
        C = shape[3] * m
        h = (shape[1] + s - 1) // s if padding == 'SAME' else (shape[1] - d * (kk - 1) - 1) // s + 1
        ww = (shape[2] + s - 1) // s if padding == 'SAME' else (shape[2] - d * (kk - 1) - 1) // s + 1
        y = b.tensor('y%d' % len(b._tensors), [1, h, ww, C])
        b.op('DEPTHWISE_CONV_2D', [x, w(1, kk, kk, C), bias(C)], [y], padding=padding, stride_h=s,
             stride_w=s, dilation_h_factor=d, dilation_w_factor=d, depth_multiplier=m,
             fused_activation_function='RELU6')
        return y, [1, h, ww, C]

    y, s = conv(x, [1, H, W, 3], c, 3, 2)
    # block 1: expand, explicit PAD, depthwise stride 2 VALID, project
    y, s = conv(y, s, c * e)
    t, l, bo, r = pad
    p = b.tensor('p%d' % len(b._tensors), [1, s[1] + t + bo, s[2] + l + r, s[3]])
    b.op('PAD', [y, b.tensor('pads', [4, 2], data=np.array([[0, 0], [t, bo], [l, r], [0, 0]], np.int32))],
         [p])
    y, s = dw(p, [1, s[1] + t + bo, s[2] + l + r, s[3]], k, 2, 'VALID')
    y, s = conv(y, s, c, act='NONE')
    # block 2: residual
    z, s2 = conv(y, s, c * e // mult)
    z, s2 = dw(z, s2, 3, 1, 'SAME', m=mult, d=dil)
    z, s2 = conv(z, s2, c, act='NONE')
    a = b.tensor('add', s)
    b.op('ADD', [y, z], [a], fused_activation_function='NONE')
    m = b.tensor('mean', [1, s[3]])
    b.op('MEAN', [a, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m], keep_dims=False)
    o = b.tensor('logits', [1, classes])
    b.op('FULLY_CONNECTED', [m, w(classes, s[3]), bias(classes)], [o])
    b.outputs(o)
    b.save(path)
    return path


def _data(path, H, W, n=6, classes=4):
    rng = np.random.default_rng(1)
    np.savez(path, x=rng.random((n, H, W, 3)).astype(F32), y=np.arange(n) % classes)
    return path


def _prep(tmp, name, model, data, **kw):
    out = str(tmp / name)
    s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.05, epochs=1,
                optimizer='sgd', batch=1, train='last:1', stream=True, log=lambda *a: None, **kw)
    return out, s


def _forward(out, x, bands=True):
    from utrain.model import Net
    net = Net(os.path.join(out, 'model.flat'))
    net.load_weights(os.path.join(out, 'weights.wof'))     # else the classifier is zeros
    if bands is not True:
        net.bands = bands or None
    net.set_input(x.astype(F32).reshape(net.shape[net.inputs[0]]))
    net.forward()
    y = np.array(net.output())
    assert np.abs(y).max() > 1e-3 and np.ptp(y) > 1e-4, y    # informative logits
    return y


def _close(a, b):
    # float rounding only: numpy's BLAS may sum a strip's dot products in another order
    # than the whole image's (the boards' kernels do not: their weights match byte for
    # byte, see the training tests)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), np.abs(a - b).max()


CASES = {
    'odd sizes, stride 2': dict(H=23, W=21),
    'even, pad before': dict(H=16, W=18, pad=(1, 1, 1, 0)),
    'kernel 5, dilation 2': dict(H=19, W=17, k=5, dil=2),
    'depth multiplier 3': dict(H=15, W=13, mult=3, e=3),
}


@pytest.mark.parametrize('case', list(CASES))
@pytest.mark.parametrize('rows', [1, 2, 3])
def test_banded_forward_equals_whole_ops(tmp_path, case, rows):
    kw = CASES[case]
    model = mbnet(str(tmp_path / 'm.circle'), **kw)
    data = _data(str(tmp_path / 'd.npz'), kw['H'], kw['W'])
    out, s = _prep(tmp_path, 'o', model, data, bands=rows)
    from host_tools.files.flatmodel import read_flat
    f = read_flat(os.path.join(out, 'model.flat'))
    from utrain.model import Net
    net = Net(os.path.join(out, 'model.flat'))
    assert net.bands, 'no band group chosen'
    codes = {net.ops[i][0] for lo, (hi, r) in net.bands.items() for i in range(lo, hi)}
    assert {r for hi, r in net.bands.values()} == {rows} and {3, 4} <= codes, (net.bands, codes)
    assert f['ops'] == net.ops
    x = np.random.default_rng(2).random((kw['H'], kw['W'], 3))
    a, b = _forward(out, x), _forward(out, x, bands=False)
    _close(a, b)
    # the whole chain as one group, up to and with the residual ADD
    add = [i for i, op in enumerate(net.ops) if op[0] == 0][0]
    c = _forward(out, x, bands={0: (add + 1, rows)})
    _close(c, b)


def test_bands_take_the_pad_and_lower_the_plan(tmp_path):
    model = mbnet(str(tmp_path / 'm.circle'), H=31, W=29, c=8)
    data = _data(str(tmp_path / 'd.npz'), 31, 29)
    out, s = _prep(tmp_path, 'o', model, data, bands=1)
    from utrain.model import Net
    net = Net(os.path.join(out, 'model.flat'))
    inside = [i for lo, (hi, r) in net.bands.items() for i in range(lo, hi)]
    names = [net.ops[i][0] for i in inside]
    assert 34 in names and 4 in names, 'the PAD and the strided depthwise are not banded'
    # the plan with bands is below the plan without
    _, s0 = _prep(tmp_path, 'o0', model, data, bands=0)
    assert s['heap']['total'] < s0['heap']['total'], (s['heap']['total'], s0['heap']['total'])


def test_bands_by_default_only_when_the_budget_needs_them(tmp_path):
    """Bands cost time (6x under ulab for the DS-CNN's frozen convs), so with a known
    limit prepare bands only a plan that does not fit without them; with none, wherever
    they lower the plan."""
    model = mbnet(str(tmp_path / 'm.circle'), H=31, W=29, c=8)
    data = _data(str(tmp_path / 'd.npz'), 31, 29)
    _, free = _prep(tmp_path, 'free', model, data)
    _, whole = _prep(tmp_path, 'whole', model, data, bands=0)
    assert free['bands'] and free['heap']['total'] < whole['heap']['total']
    roomy = whole['heap']['total'] + 1024
    _, s = _prep(tmp_path, 'roomy', model, data, budget=str(roomy))
    assert not s['bands'] and s['heap']['total'] == whole['heap']['total']
    _, s = _prep(tmp_path, 'tight', model, data, budget=str(whole['heap']['total'] - 1024))
    assert s['bands'] == free['bands'] and s['heap']['total'] == free['heap']['total']


def _mp_trains(tmp_path, model, data, backend, heap_check, dtype='float32'):
    out, s = _prep(tmp_path, 'b', model, data, bands=1, cache=True, backend=backend, dtype=dtype)
    ref, s0 = _prep(tmp_path, 'u', model, data, bands=0, cache=True, backend=backend, dtype=dtype)
    assert s['bands'][0][0] == 0 and not s0['bands']     # the first group reads the samples
    for d in (out, ref):
        no_keep_best(d)
        runner.stage(d)
    plan = s['heap']['total']
    assert trains_in(ref, 4 * 1024 * 1024) and trains_in(out, plan), f'does not train in the planned {plan} B'
    with open(os.path.join(out, 'trained.wof'), 'rb') as a, open(os.path.join(ref, 'trained.wof'), 'rb') as b:
        assert a.read() == b.read(), 'banded training gave other weights than the whole ops'
    if heap_check:
        # the bands are what makes it fit: the unbanded run does not train in that heap
        assert not trains_in(ref, plan), (plan, s0['heap']['total'])
    return s, s0


@pytest.mark.slow
@pytest.mark.skipif(runner.find_micropython() is None, reason='no unix MicroPython')
def test_banded_run_trains_at_its_plan_on_micropython(tmp_path):
    """The small MobileNet-like net (48x48 input), classifier training with the frozen
    prefix cached by the board: the banded run trains in its planned heap, the run
    without bands does not, and both give the same weights byte for byte."""
    model = mbnet(str(tmp_path / 'm.circle'), H=48, W=48, c=8, e=6)
    data = _data(str(tmp_path / 'd.npz'), 48, 48, n=3)
    _mp_trains(tmp_path, model, data, 'fallback', heap_check=True)


@pytest.mark.slow
@pytest.mark.parametrize('var,backend', [('UTRAIN_MP32_ULAB', 'ulab'), ('UTRAIN_MP32', 'fallback')])
def test_banded_run_trains_at_its_plan_on_32bit(tmp_path, monkeypatch, var, backend):
    if not os.environ.get(var):
        pytest.skip(f'{var} not set')
    monkeypatch.setenv('MICROPYTHON', os.environ[var])
    model = mbnet(str(tmp_path / 'm.circle'), H=48, W=48, c=8, e=6)
    data = _data(str(tmp_path / 'd.npz'), 48, 48, n=3)
    _mp_trains(tmp_path, model, data, backend, heap_check=True)


@pytest.mark.skipif(not os.environ.get('UTRAIN_MP32_ULAB'), reason='UTRAIN_MP32_ULAB not set')
def test_banded_cached_run_trains_at_its_plan_from_folders_of_any_path_length(
        tmp_path, monkeypatch):
    """Issue 28, 32-bit ulab: the 48x48 MobileNet-like net, bands, stream and cache,
    trains in its plan from whatever folder it is copied to.  The unix port keeps the
    script's folder (sys.path[0]) in the heap, so the folder's path length shifts
    everything after it by a block or two.  Made inside the first sample, among its band
    buffers, the stream's slot buffers and the second group's tables stayed where that
    sample's strips had been; the later samples' 4.5 KB strips then missed by a block in
    folders of some lengths (the need went from 123 KB to 127.6 KB, over the 127 KB
    plan, for paths of 58-76 characters, the pytest folder among them)."""
    import tempfile
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    model = mbnet(str(tmp_path / 'm.circle'), H=48, W=48, c=8, e=6)
    data = _data(str(tmp_path / 'd.npz'), 48, 48, n=3)
    out, s = _prep(tmp_path, 'b', model, data, bands=1, cache=True, backend='ulab')
    assert s['bands'] and s['bands'][0][0] == 0, s['bands']
    no_keep_best(out)
    runner.stage(out)
    monkeypatch.setattr(runner, 'stage', lambda *a, **k: None)    # (copied with the folder)
    plan = s['heap']['total']
    base = os.path.realpath(tempfile.mkdtemp())    # short: the lengths below start low
    failed = []
    try:
        for n in range(36, 100, 8):
            pad = n - len(base) - 3                 # base/<pad>/b is n characters long
            if pad < 1:
                continue
            d = os.path.join(base, 'x' * pad, 'b')
            shutil.copytree(out, d)
            if not trains_in(d, plan):
                failed.append(n)
            shutil.rmtree(os.path.dirname(d))
    finally:
        shutil.rmtree(base)
    assert not failed, f'does not train in its plan ({plan} B) from folders of path lengths {failed}'


@pytest.mark.slow
@pytest.mark.skipif(runner.find_micropython() is None, reason='no unix MicroPython')
def test_banded_run_reads_quantized_samples_by_strips(tmp_path):
    """Samples stored as uint8 (prepare --dtype uint8): the first band group decodes
    the input strip by strip, and training gives the unbanded run's weights."""
    model = mbnet(str(tmp_path / 'm.circle'), H=20, W=18)
    data = _data(str(tmp_path / 'd.npz'), 20, 18, n=3)
    _mp_trains(tmp_path, model, data, 'fallback', heap_check=False, dtype='uint8')
    if os.environ.get('UTRAIN_MP32_ULAB'):
        os.environ['MICROPYTHON'], old = os.environ['UTRAIN_MP32_ULAB'], os.environ.get('MICROPYTHON')
        try:
            shutil.rmtree(str(tmp_path / 'b')), shutil.rmtree(str(tmp_path / 'u'))
            _mp_trains(tmp_path, model, data, 'ulab', heap_check=False, dtype='uint8')
        finally:
            if old is None:
                del os.environ['MICROPYTHON']
            else:
                os.environ['MICROPYTHON'] = old


def test_keras_mobilenetv2_banded_forward_equals_whole_ops(tmp_path):
    """The zoo's Keras MobileNetV2-0.35 96x96 (float), classifier training: prepare
    bands its frozen high-resolution blocks, the board's forward pass gives the logits
    the whole ops give, and the plan falls from about 3 MB to under an RP2350's 400 KB."""
    model = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mobilenetv2_035_96_float.tflite')
    data = _data(str(tmp_path / 'd.npz'), 96, 96, n=2, classes=10)
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', lr=0.01, epochs=1, optimizer='sgd', batch=1,
                train='last:2', stream=True, cache=True, backend='ulab', board='rp2350',
                log=lambda *a: None)
    assert s['bands'] and s['bands'][0][0] == 0, s['bands']
    assert s['heap']['total'] < 400 * 1024, s['heap']['total']
    x = np.random.default_rng(3).random((96, 96, 3))
    a, b = _forward(out, x), _forward(out, x, bands=False)
    _close(a, b)



def _run_as(out, script, heap):
    """The staged run in out with train.py's place taken by script (its text), in heap
    bytes, stdin an open pipe as memory.trains_in gives it: its stdout (it must end ok)."""
    import subprocess
    with open(os.path.join(out, 'probe.py'), 'w') as f:
        f.write(script)
    argv, env = runner.command(out)
    argv[argv.index('-X') + 1] = 'heapsize=%d' % heap
    argv[-1] = 'probe.py'
    keep, w = os.pipe()
    try:
        r = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, stdin=keep,
                           timeout=600)
    finally:
        os.close(keep)
        os.close(w)
    assert 'utrain: end: ok' in r.stdout, r.stdout[-2000:]
    return r.stdout


_LOADS = '''import gc
gc.threshold(2048)
import sys
import utrain.bands as B
_plan, _run = B.Group.plan, B.Group.run
def plan(self):
    print('PLAN', self.lo, len(sys.modules))     # (before any group's buffers)
    return _plan(self)
def run(self, free):
    _run(self, free)
    print('RAN', self.lo, len(sys.modules))
B.Group.plan, B.Group.run = plan, run
from utrain.run import start
start()
'''


@pytest.mark.skipif(not os.environ.get('UTRAIN_MP32_ULAB'), reason='UTRAIN_MP32_ULAB not set')
def test_no_code_loads_after_the_first_band_groups_buffers(tmp_path, monkeypatch):
    """32-bit ulab: the conv steps' code the band's kernels import at their first call
    (utrain.ulconv, convwalk, ulmono) is loaded before the first group's buffers, not
    among them: loaded among them it stays where the first sample's buffers were and
    cuts the run the later samples' buffers need (the Keras DS-CNN, --ranks 10:low: its
    32 KB group output failed at sample 2 with 76 KB free, ulconv's, ulmono's and
    convwalk's code in the middle of it; plan 229 KB, need 236)."""
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    # two groups, a 3-channel input (convwalk) and a 1-channel one (ulmono)
    for ch in (3, 1):
        model, data = _conv_net(tmp_path, ch, 48, 6, 3)
        out = str(tmp_path / ('b%d' % ch))
        s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.05, epochs=1,
                    optimizer='sgd', batch=1, train='last:1', bands=1, backend='ulab',
                    log=lambda *a: None)
        assert s['bands'], s
        no_keep_best(out)
        runner.stage(out)
        stdout = _run_as(out, _LOADS, 2 * s['heap']['total'])
        lines = [line.split() for line in stdout.splitlines() if line[:4] in ('PLAN', 'RAN ')]
        # (every group is made and planned at the first group's run, before its buffers)
        assert [w for w, _, _ in lines].count('RAN') == 3 * len(s['bands']), stdout[-2000:]
        first = int(lines[0][2])
        assert all(int(n) == first for _, _, n in lines), (ch, lines)


def _conv_net(tmp_path, ch, size, e, n):
    """(model, data): mbnet on size x size x 3 (expansion e), or for ch 1 mono on 24x10x1;
    n random samples."""
    if ch == 3:
        return (mbnet(str(tmp_path / 'm.circle'), H=size, W=size, c=8, e=e),
                _data(str(tmp_path / 'd.npz'), size, size, n=n))
    data = str(tmp_path / 'd1.npz')
    rng = np.random.default_rng(1)
    np.savez(data, x=rng.random((n, 24, 10, 1)).astype(F32), y=np.arange(n) % 4)
    return mono(str(tmp_path / 'mono.circle')), data


def mono(path, seed=0):
    """A DS-CNN-like net on a one-channel 24x10 input: conv 6x4/2 SAME ReLU, depthwise 3x3
    SAME ReLU, conv 1x1 ReLU, MEAN, FULLY_CONNECTED (4 classes)."""
    b, w, bias = _builder(seed)
    x = b.tensor('x', [1, 24, 10, 1])
    b.inputs(x)
    y0 = b.tensor('y0', [1, 12, 5, 16])
    b.op('CONV_2D', [x, w(16, 6, 4, 1), bias(16)], [y0], padding='SAME', stride_h=2, stride_w=2,
         fused_activation_function='RELU')
    y1 = b.tensor('y1', [1, 12, 5, 16])
    b.op('DEPTHWISE_CONV_2D', [y0, w(1, 3, 3, 16), bias(16)], [y1], padding='SAME', stride_h=1,
         stride_w=1, depth_multiplier=1, fused_activation_function='RELU')
    y2 = b.tensor('y2', [1, 12, 5, 16])
    b.op('CONV_2D', [y1, w(16, 1, 1, 16), bias(16)], [y2], padding='SAME', stride_h=1, stride_w=1,
         fused_activation_function='RELU')
    m = b.tensor('mean', [1, 16])
    b.op('MEAN', [y2, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m], keep_dims=False)
    o = b.tensor('logits', [1, 4])
    b.op('FULLY_CONNECTED', [m, w(4, 16), bias(4)], [o])
    b.outputs(o)
    b.save(path)
    return path


_STEPS = '''import gc
gc.threshold(2048)
import sys
import utrain.trainer as T
_ts = T.Trainer.train_step
def ts(self):
    print('STEP', len(sys.modules))
    r = _ts(self)
    print('STEP', len(sys.modules))
    return r
T.Trainer.train_step = ts
from utrain.run import start
start()
'''


@pytest.mark.skipif(not os.environ.get('UTRAIN_MP32_ULAB'), reason='UTRAIN_MP32_ULAB not set')
def test_no_code_loads_once_training_starts(tmp_path, monkeypatch):
    """32-bit ulab, whole nets without bands, Adam batch 4: the conv steps' modules
    (utrain.ulconv with convwalk for a strided conv of 3 channels, ulmono for one of 1)
    come in with the code (train.json's run.steps, the planner's list), none at a conv's
    first call: imported there, inside the first sample, their code stayed where that
    sample's arrays had been and cut the runs the later samples need (the held-out
    ho_cnn5bn, 24x24x3 BN CNN, Adam b4: 349 KB needed, 338 planned).  Each trains in its
    plan."""
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    for ch, want in ((3, 'convwalk'), (1, 'ulmono')):
        model, data = _conv_net(tmp_path, ch, 24, 4, 4)
        out = str(tmp_path / ('w%d' % ch))
        s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=1,
                    optimizer='adam', batch=4, bands=0, backend='ulab', log=lambda *a: None)
        assert not s.get('bands') and want in s['heap']['steps'], s['heap']['steps']
        with open(os.path.join(out, 'train.json')) as f:
            assert json.load(f)['run']['steps'] == s['heap']['steps']
        no_keep_best(out)
        runner.stage(out)
        stdout = _run_as(out, _STEPS, 2 * s['heap']['total'])
        counts = [int(line.split()[1]) for line in stdout.splitlines() if line[:5] == 'STEP ']
        assert len(counts) == 2 * 4 and len(set(counts)) == 1, (ch, counts)
        assert trains_in(out, s['heap']['total'])


def test_a_budget_the_cache_meets_is_not_refused_for_the_bands_of_a_plan_without_it(tmp_path):
    """Issue 28 (session 28, a held-out ResNet on rp2040's defaults: --select auto's
    choice fit with --cache-on-host, and prepare refused it 5.6 KB over).  Prepare's fit
    pass plans each memory option on a copy of the plan without it, which had chosen row
    bands for the budget; bands are not chosen with the cache (the board does not run
    the prefix), but those copied were planned: a budget the cache alone meets was
    refused.  Here the net's last layer planned with --cache-on-host given fits the
    budget: prepare chooses the cache and plans what that prepare plans."""
    model = mbnet(str(tmp_path / 'm.circle'), H=31, W=29, c=8)
    data = _data(str(tmp_path / 'd.npz'), 31, 29)
    _, banded = _prep(tmp_path, 'f', model, data)
    _, cached = _prep(tmp_path, 'c', model, data, cache='host')
    assert banded['bands'] and cached['heap']['total'] < banded['heap']['total'] - 4096
    _, s = _prep(tmp_path, 'b', model, data, budget=str(cached['heap']['total'] + 256))
    assert s['chose'] == ['--cache-on-host'] and not s['bands'], s['chose']
    assert s['heap']['total'] == cached['heap']['total']
