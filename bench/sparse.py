"""The table of sparse-update schemes of issue 29 on MobileNetV2-0.35 96x96 int8:
`python -m bench.sparse [--no-accuracy] [--no-heap] [--pico] [--schemes S] [--seeds 1,2]
[--model M]` (M: MODELS, the other int8 zoo models on the same task and their schemes);
`--grad-check STEPS` instead prints, step by step, the int8 trainer's update of op 62's
window (scheme w62) against the float gradient of the model with fake-quantized
activations (what QAS follows: lr dL/dW / s_W weight steps); `--split` splits the w62
scheme's int8/float gap: a float trainer (bench/fqtrain.py) with the int8 model's
quantization switched on a part at a time (the prefix cache's int8 features, the
activations, the trained weights' int8 grid), per seed.

The model: bench/zoo/keras/mobilenetv2_035_96_digits_int8.tflite (make_keras.py
`digits`: pre-trained on scikit-learn's digits 0-4, 8x8 upscaled to 96x96x3, held-out
100 %).  The task: the digits 5-9 it never saw (896 samples, a seeded order), SGD
batch 1 (--momentum MU: SGD-M), scce, TRAIN samples train, the rest test.

Schemes (SCHEMES; op numbers as `inspect` lists the file: 58-65 are the convolutions of
the last two blocks and the 1x1 head to 1280 channels, 67 the classifier): the
classifier alone; the bias of the 1x1 head + the classifier; the biases of the last 7
convolutions + the classifier (TTE's bias-only layers); the same + the weights of two
layers at channel ratios (the last project conv at 1/2, the head at 1/8); half of the
last block's 1x1 expand conv's weights (op 62) + the biases above it (w62: what --select
auto chose once the engine's heap was cut); full
fine-tuning of the last N ops (last:N); --select auto on the int8 tail within AUTO_BUDGET
(the tail's plan; the plan column prices the choice on the whole model).

Per scheme, columns:
  int8 path   whether `prepare` trains it as int8 (q8.json written; --ranks go with
              --train none: --train's default, all, would train every other op whole)
  plan        prepare's heap plan for the rp2040 profile (KB; the int8 plan when int8,
              else the float path's), and whether prepare --board rp2040 accepts it
  heap        the smallest heap (KB, bisection, 1 KB) in which the int8 run trains one
              epoch of 4 samples and evaluates 2 on the 32-bit unix build ($UTRAIN_MP32;
              --cache: the board runs the frozen prefix once per sample); TTE: 141 KB
  float, int8 test accuracy after EPOCHS epochs (the last), the float column the same
              scheme on the model dequantized (prepare --dequantize), the int8 column the
              int8 engine (CPython + numpy: the board's integers, q8np)
  Pico ms     with --pico (an int8 run over the rp2040 plan is prepared without --board
              and run anyway: what fits is timed, the cell says so): ms per image
              on the emulated Pico (real rp2 firmware in rp2040js; cycles = us x 125): the
              frozen prefix's int8 forward (the board's q8.json net, what --cache runs
              once per sample in epoch 1) and the training step from the cache (epoch 2
              of train.py on 2 samples), or why the run stopped; TTE's sparse update:
              373 ms per image on a 216 MHz Cortex-M7 with an FPU

The accuracy runs train a tail of the model: the ops from CUT on, whose input is the
int8 output of the frozen prefix (ops 0..CUT-1) as TFLite Micro computes it (the same
integers as the board's forward: tests/int8/test_zoo_int8.py), computed once and cached in
the temp folder.  Every scheme trains ops after CUT only, so the tail trains exactly as
the whole model would, at a fraction of the CPU.  The heap and Pico columns run the
whole model."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.graph.passes import PrepareError  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.graph.inout import save_graph  # noqa: E402
from bench.zoo.make_keras import digits_split  # noqa: E402

MODEL = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mobilenetv2_035_96_digits_int8.tflite')
TASK = (5, 6, 7, 8, 9)          # the digits the model never saw
TRAIN = 256                     # training samples of the task (the rest, 640, test)
EPOCHS = 4
LR = 0.01
MOMENTUM = 0.0                  # SGD momentum of every scheme (--momentum)
CUT = 50                        # the accuracy runs train the ops from here on
TMP = os.path.join(tempfile.gettempdir(), 'utrain-sparse-%d' % os.getuid())
CONVS7 = (58, 59, 60, 62, 63, 64, 65)       # the last 7 convolutions (2 blocks + head)
BIAS7 = {k: 'bias' for k in CONVS7}
AUTO_BUDGET = '256K'            # the auto scheme's budget (TTE's SRAM), on the tail's plan
# name: (what trains, --train, --ranks)
SCHEMES = [
    ('classifier', 'op 67 (FC)', 'last:2', None),
    ('bias1', 'bias of op 65 (1x1 head) + op 67', None, {65: 'bias', 67: 'all'}),
    ('bias7', 'biases of ops 58-65 (7 convs) + op 67', None, {**BIAS7, 67: 'all'}),
    ('sparse', 'bias7 + op 64 weights 1/2 + op 65 weights 1/8', None,
     {**BIAS7, 64: '1/2', 65: '1/8', 67: 'all'}),
    ('w62', "op 62's weights at 1/2 ('up') + biases of ops 63-65 + op 67 (what auto chose "
     "after the heap cut)", None, {62: 'up', 63: 'bias', 64: 'bias', 65: 'bias', 67: 'all'}),
    ('last:4', 'ops 65 (1x1 head, 1280) and 67 whole', 'last:4', None),
    ('last:5', 'ops 64, 65, 67 whole', 'last:5', None),
    ('last:8', 'ops 62-65, 67 whole', 'last:8', None),
    ('auto', '--select auto on the int8 tail, budget %s' % AUTO_BUDGET, None, 'auto'),
    ('bias4', 'biases of ops 62-65 + op 67', None, {62: 'bias', 63: 'bias', 64: 'bias',
                                                    65: 'bias', 67: 'all'}),
]
# the other int8 zoo models (--model), pre-trained as MODEL was (make_keras.py
# mobilenetv2_128_digits, mcunet_digits: the digits 0-4, upscaled to their input size), on
# the same task.  name: (file, input size, CUT, schemes).  mbv2-128 has the 96's op
# numbers; mcunet-96 (CUT 30: a tail of one frozen block): ops 34 (1x1, 96 -> 576), 35 (depthwise), 36 (1x1, 576 -> 160), 38
# the classifier (the zoo's mcunet_96_int8, fitted on synthetic images, gives features
# the digits do not move: 0.18 float, 0.00 int8 with the classifier alone)
MODELS = {
    'mbv2-96-digits': (MODEL, 96, CUT, SCHEMES),
    'mbv2-128': (os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mobilenetv2_035_128_digits_int8.tflite'),
                 128, CUT, [s for s in SCHEMES if s[0] in ('classifier', 'bias4', 'w62')]),
    'mcunet-96': (os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mcunet_96_digits_int8.tflite'), 96, 30, [
        ('classifier', 'op 38 (FC)', 'last:2', None),
        ('bias3', 'biases of ops 34-36 + op 38', None, {34: 'bias', 35: 'bias', 36: 'bias',
                                                       38: 'all'}),
        ('w36', "op 36's weights at 1/8 + biases of ops 34, 35 + op 38", None,
         {34: 'bias', 35: 'bias', 36: '1/8', 38: 'all'})]),
}
SIZE = 96


def task_split():
    return digits_split(TASK, size=SIZE)


def quiet(*a, **k):
    pass


def ranks_text(ranks, shift=0):
    return ','.join('%d:%s' % (k - shift, v) for k, v in sorted(ranks.items()))


def prefix_features(x):
    """The int8 output of ops 0..CUT-1 (TFLite Micro) for images x, cached on disk."""
    import hashlib      # (keyed by the file's bytes: two zoo files can share a size)
    with open(MODEL, 'rb') as f:
        h = hashlib.sha1(f.read()).hexdigest()[:12]
    path = os.path.join(TMP, 'prefix-%d-%d-%s.npz' % (CUT, len(x), h))
    if os.path.exists(path):
        return np.load(path)['q']
    from tflite_micro.python.tflite_micro import runtime
    g = read_model(MODEL)
    t = g.ops[CUT].inputs[0]
    g.ops, g.outputs = g.ops[:CUT], [t]
    os.makedirs(TMP, exist_ok=True)
    cut = os.path.join(TMP, 'head.tflite')
    save_graph(g, cut)
    it = runtime.Interpreter.from_file(cut)
    q = g.tensors[g.inputs[0]].quant
    s, z = q['scale'][0], q['zero_point'][0]
    out = []
    for v in x:
        it.set_input(np.clip(np.round(v / s) + z, -128, 127).astype(np.int8)[None], 0)
        it.invoke()
        out.append(it.get_output(0)[0].copy())
    out = np.array(out)
    np.savez(path + '.tmp.npz', q=out)
    os.replace(path + '.tmp.npz', path)
    return out


def tail_task(d):
    """The tail model (ops CUT.. of MODEL, input: the prefix's int8 output) and the task
    as its float inputs (the int8 values at that tensor's scale: prepare quantizes them
    back exactly) in folder d; returns (model path, data path, test split)."""
    x, y = task_split()
    q = prefix_features(x)
    g = read_model(MODEL)
    t = g.ops[CUT].inputs[0]
    qt = g.tensors[t].quant
    g.ops, g.inputs = g.ops[CUT:], [t]
    model = os.path.join(d, 'tail.tflite')
    save_graph(g, model)
    xf = ((q.astype(np.float32) - qt['zero_point'][0]) * np.float32(qt['scale'][0]))
    data = os.path.join(d, 'task.npz')
    np.savez(data, x=xf.astype(np.float32), y=y)
    return model, data, 1 - TRAIN / len(y)


def settings(train, ranks, shift=0, seed=1):
    kw = dict(loss='scce', optimizer='sgd', lr=LR, batch=1, shuffle=True, seed=seed)
    if MOMENTUM:        # (int8: int16 weight velocities, utrain.q8mom)
        kw['momentum'] = MOMENTUM
    if ranks:       # (--train's default, all, would train every other op whole too)
        kw.update(ranks=ranks_text(ranks, shift), train='none')
    else:
        kw['train'] = train
    return kw


def accuracy(model, data, split, train, ranks, kind, out, epochs=EPOCHS, seed=1):
    """Test accuracy of the last epoch, or a reason it did not run."""
    try:
        prepare(model, out, data=data, test_split=split, epochs=epochs, log=quiet, cache=True,
                dequantize=kind == 'float', **settings(train, ranks, CUT, seed))
    except PrepareError as e:
        return 'refused: ' + str(e).split('\n')[0][:60]
    if kind == 'int8' and not os.path.exists(os.path.join(out, 'q8.json')):
        return 'n/a until the engine lands'
    code, text = runner.run(out, python=True, stream=False)
    if code:
        return 'failed: ' + text.strip().splitlines()[-1][:60]
    acc = re.findall(r'^epoch \d+/\d+ .* test_accuracy ([0-9.]+)', text, re.M)
    return float(acc[-1])


def select_tail(model, data, split, out):
    """--select auto on the int8 tail within AUTO_BUDGET (the int8 trials, the int8
    planner): the chosen ranks in the whole model's op numbers, or a reason it did not run.
    The tail's plan leaves out the frozen prefix: plan_cell prices the choice on the whole
    model."""
    try:
        s = prepare(model, out, data=data, test_split=split, epochs=EPOCHS, log=quiet,
                    cache=True, select='auto', budget=AUTO_BUDGET,
                    **settings(None, None))
    except PrepareError as e:
        return 'refused: ' + str(e).split('\n')[0][:60]
    if 'select' not in s:
        return 'refused: no selection in the summary'
    return {int(k) + CUT: v for k, v in s['select']['ranks'].items()}


def small_task(d, n=6):
    x, y = task_split()
    data = os.path.join(d, 'small.npz')
    np.savez(data, x=x[:n], y=y[:n])
    return data


def board_folder(out, data, train, ranks, board=None, split=1 / 3, epochs=1):
    """prepare the whole model for a board run (--cache, keep_best off); the summary, or
    the refusal."""
    try:
        s = prepare(MODEL, out, data=data, test_split=split, epochs=epochs, cache=True,
                    board=board, log=quiet, **settings(train, ranks))
    except PrepareError as e:
        return str(e)
    with open(os.path.join(out, 'train.json')) as f:
        c = json.load(f)
    c['run']['keep_best'] = False       # trained.wof always written: memory.trains_in sees it
    with open(os.path.join(out, 'train.json'), 'w') as f:
        json.dump(c, f, indent=1)
    return s


def plan_cell(d, data, train, ranks):
    """(the rp2040 plan in KB, int8 or float path, what prepare --board rp2040 says)."""
    s = board_folder(os.path.join(d, 'plan'), data, train, ranks)
    if isinstance(s, str):
        return None, None, 'refused: ' + s.split('\n')[0][:80]
    int8 = os.path.exists(os.path.join(d, 'plan', 'q8.json'))
    kb = s['heap']['by_target']['rp2040'] // 1024
    r = board_folder(os.path.join(d, 'board'), data, train, ranks, board='rp2040')
    return kb, int8, ('accepts' if not isinstance(r, str) else 'refuses')


def heap_cell(d, data, train, ranks, exe):
    from host_tools.plan.memory import smallest_heap
    out = os.path.join(d, 'heap')
    s = board_folder(out, data, train, ranks)
    if isinstance(s, str) or not os.path.exists(os.path.join(out, 'q8.json')):
        return None
    os.environ['MICROPYTHON'] = exe
    hi = max(1024, s['heap']['by_target']['sim32'] * 5 // 4 // 1024) * 1024
    h = smallest_heap(out, lo=64 * 1024, hi=hi)
    return h // 1024 if h else 'over %d KB' % (hi // 1024)


FWD = """
import json, time, gc
from utrain.q8 import Q8Net
m = json.load(open('q8.json'))
net = Q8Net(m, 'weights.wof')
x = bytearray(open('x.bin', 'rb').read())
del m
gc.collect()
for i in range(2):
    t = time.ticks_us()
    net.forward(x)
    print('FWD_US', time.ticks_diff(time.ticks_us(), t))
"""


def pico_cell(d, train, ranks):
    """On the emulated Pico: (ms per image of the frozen prefix's int8 forward, the
    board's q8.json net alone, the second of two; the training step from the prefix
    cache, ms per sample of epoch 2 of train.py on 2 samples, or why it did not run)."""
    from host_tools.boards import pico
    out = os.path.join(d, 'pico')
    x, y = task_split()
    two = os.path.join(d, 'two.npz')
    np.savez(two, x=x[:2], y=y[:2])
    s = board_folder(out, two, train, ranks, board='rp2040', split=0.0, epochs=2)
    over = ''
    if isinstance(s, str):      # over the rp2040 plan: run anyway, to time what fits
        s = board_folder(out, two, train, ranks, split=0.0, epochs=2)
        over = 'over the plan (%d KB): ' % (s['heap']['by_target']['rp2040'] // 1024
                                           if isinstance(s, dict) else 0)
    if isinstance(s, str) or not os.path.exists(os.path.join(out, 'q8.json')):
        return None
    g = read_model(MODEL)
    q = g.tensors[g.inputs[0]].quant
    xq = np.clip(np.round(x[0] / q['scale'][0]) + q['zero_point'][0], -128, 127)
    with open(os.path.join(out, 'x.bin'), 'wb') as f:
        f.write(xq.astype(np.int8).tobytes())
    with open(os.path.join(out, 'fwd.py'), 'w') as f:
        f.write(FWD)
    code, text = pico.run_folder(out, stream=False, script='fwd.py')
    fwd = [int(v) / 1000 for v in re.findall(r'^FWD_US (\d+)', text, re.M)]
    fwd = '%.0f' % fwd[-1] if fwd else 'failed: ' + text.strip().splitlines()[-1][:50]
    code, text = pico.run_folder(out, stream=False)
    note = ''
    if code and [f for f in os.listdir(out) if f.endswith('.pfx')]:
        # the board made its prefix cache and stopped after it: again, from that cache
        end = [v for v in text.splitlines() if v.startswith('utrain: end:')]
        note = ' (2nd run, from the cache the 1st made; the 1st ended: %s)' % (
            (end or ['?'])[-1][13:])
        code, text = pico.run_folder(out, stream=False)
    t = [float(v) for v in re.findall(r'\(([0-9.]+) ms/sample', text)]
    end = [v for v in text.splitlines() if v.startswith('utrain: end:')]
    step = '%.1f' % t[-1] if not code and len(t) >= 2 else (end or ['failed'])[-1][13:]
    if code and t:      # epoch 1 trained from the cache, then the run stopped
        step = '%.1f (epoch 1; then %s)' % (t[0], step)
    return fwd, over + step + note


GRAD_SCHEME = {62: 'up', 63: 'bias', 64: 'bias', 65: 'bias', 67: 'all'}     # w62


def _taps(gm):
    """(output rows, input rows) index pairs per kernel tap (ky, kx) of geometry gm."""
    H, W, I, O, KH, KW, sh, sw, ph, pw, OH, OW = gm[:12]
    dh, dw = (gm[12], gm[13]) if len(gm) > 13 else (1, 1)
    for ky in range(KH):
        for kx in range(KW):
            o, x = [], []
            for oy in range(OH):
                for ox in range(OW):
                    iy, ix = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
                    if 0 <= iy < H and 0 <= ix < W:
                        o.append(oy * OW + ox)
                        x.append(iy * W + ix)
            yield ky, kx, np.array(o, int), np.array(x, int)


def float_grad(net, xq, label, full):
    """dL/dW of the first layer of int8 net (CONV_2D) in the float model with the int8
    model's weights and fake-quantized activations (its int8 outputs, masks from them),
    the loss softmax cross-entropy on the dequantized logits: the reference QAS follows.
    full(i): layer i's whole int8 weights."""
    from utrain import q8
    L = net.layers
    q = lambda b: np.frombuffer(bytes(b), np.int8).astype(np.float64)  # noqa: E731
    ys, x = [], xq
    for l in L:
        x = l.forward(x)
        ys.append(q(x))
    acts = [(q(xq) - L[0].zx) * L[0].d['sx']]
    for i, l in enumerate(L):
        s = l.d['sy'] if 'sy' in l.d else L[i + 1].d['sx']
        acts.append((ys[i] - l.zy) * s)
    p = np.exp(acts[-1] - acts[-1].max())
    dy = p / p.sum()
    dy[label] -= 1
    for i in range(len(L) - 1, -1, -1):
        l, d = L[i], L[i].d
        if l.k == q8.MEAN:
            dy = np.tile(dy / d['n'], d['n'])
            continue
        dz = dy * ((ys[i] > l.lo) & (ys[i] < l.hi))
        sw = np.array(d['sw'], np.float64)
        wq = full(i)
        if l.k == q8.FC:
            dy = (wq.reshape(l.nout, -1) * sw[:, None]).T @ dz
            continue
        gm = d['g']
        H, W, I, O, KH, KW = gm[:6]
        X, Z = acts[i].reshape(H * W, I), dz.reshape(-1, O)
        conv = l.k == q8.CONV
        Wf = (wq.reshape(O, KH, KW, I) * sw[:, None, None, None] if conv
              else wq.reshape(KH, KW, O) * sw)
        gW, dX = np.zeros_like(Wf), np.zeros_like(X)
        for ky, kx, o, xi in _taps(gm):
            if conv:
                gW[:, ky, kx, :] += Z[o].T @ X[xi]
                np.add.at(dX, xi, Z[o] @ Wf[:, ky, kx, :])
            else:
                np.add.at(dX, xi, Z[o] * Wf[ky, kx])
        if i == 0:
            return gW.reshape(O, -1)
        dy = dX.ravel()


def grad_check(steps, seed=1):
    """The int8 trainer's update of op 62's window (the w62 scheme, the tail, --cache)
    against LR x the fake-quantized float gradient / s_W in 1/256 weight steps, step by
    step over the task's first STEPS shuffled samples: one table row a step."""
    from utrain import q8kern
    from utrain.q8 import Q8Net
    from utrain import wof
    import io
    os.makedirs(TMP, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TMP) as d:
        model, data, split = tail_task(d)
        out = os.path.join(d, 'g')
        prepare(model, out, data=data, test_split=split, epochs=1, log=quiet, cache=True,
                **settings(None, GRAD_SCHEME, CUT, seed))
        rd = lambda f: json.load(open(os.path.join(out, f)))  # noqa: E731
        pre = Q8Net(rd('q8.json'), os.path.join(out, 'weights.wof'))
        net = Q8Net(rd('q8t.json'), os.path.join(out, 'weights.wof'))
        raw = open(os.path.join(out, 'weights.wof'), 'rb').read()
        t = rd('q8t.json')
        nb = [None] * t['ntensors']
        ws = t['wsizes']
        for j in range(0, len(ws), 2):
            nb[ws[j]] = ws[j + 1]
        offs = wof.read_table(io.BytesIO(raw), 'w', nb, nb)[0]

        def full(i):
            l = net.layers[i]
            if l.w is not None and not l.pw:
                return np.frombuffer(bytes(l.w), np.int8).astype(np.float64)
            o = offs[l.d['wt']]
            return np.frombuffer(raw[o:o + l.d['wn']], np.int8).astype(np.float64)
        got = []
        real = q8kern.upek

        def spy(w, f, u, p):
            got.append(np.array(u[:p[0]], np.float64))
            return real(w, f, u, p)
        q8kern.upek = spy
        L0 = net.layers[0]
        lo, hi = L0.d['tw']
        sw = np.array(L0.d['sw'], np.float64)[lo:hi, None]
        x, y = np.load(data)['x'], np.load(data)['y']
        order = np.random.default_rng(seed).permutation(TRAIN)
        print('| step | mean |update|, weight steps | int8 vs float: relative error | cosine | '
              'norm ratio |')
        print('|---|---|---|---|---|')
        try:
            for k in range(steps):
                j = int(order[k])
                h = bytearray(pre.forward(pre.quantize_input(x[j].ravel())))
                want = LR * float_grad(net, h, int(y[j]), full)[lo:hi] / sw * 256
                del got[:]
                net.step(h, int(y[j]), LR)
                u = np.concatenate(got).reshape(want.shape)
                print('| %d | %.3f | %.3f | %.4f | %.3f |' % (
                    k + 1, np.abs(want).mean() / 256, np.linalg.norm(u - want) /
                    np.linalg.norm(want), (u * want).sum() / np.linalg.norm(u) /
                    np.linalg.norm(want), np.linalg.norm(u) / np.linalg.norm(want)), flush=True)
        finally:
            q8kern.upek = real
            pre.close()
            net.close()


SPLIT = {      # mode: (what, the tail's input, fake-quantized activations, weights, clamp)
    'F': ('float (the float column, in numpy)', 'float', False, False, 127),
    'F8': ('float, from the int8 prefix cache', 'cache', False, False, 127),
    'Q': ('+ activations fake-quantized (int8 scales and clamps)', 'cache', True, False, 127),
    'QW': ('+ trained weights on their int8 grid (float masters, STE)', 'cache', True, True,
           127),
    'QWfc': ('Q + the classifier\'s weights alone on the grid', 'cache', True, {67 - CUT}, 127),
    'QW62': ('Q + op 62\'s weights alone on the grid', 'cache', True, {62 - CUT}, 127),
    'QWnc': ('QW, the grid not clamped at +-127', 'cache', True, True, 0),
}


def split_gap(seeds, modes=('F', 'F8', 'Q', 'QW')):
    """The w62 scheme's int8/float gap split into its causes: bench/fqtrain.py's float
    trainer of the tail (the same samples, order and learning rate as the float and int8
    columns) with the int8 model's quantization switched on a part at a time; one row a
    mode and seed, the test accuracy after each epoch.  The int8 column is the int8 run
    itself (the table's)."""
    from bench.fqtrain import FQNet
    from utrain.data import Dataset, order
    from utrain.q8 import Q8Net
    os.makedirs(TMP, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TMP) as d:
        model, data, split = tail_task(d)
        out = os.path.join(d, 's')
        prepare(model, out, data=data, test_split=split, epochs=EPOCHS, log=quiet, cache=True,
                **settings(None, GRAD_SCHEME, CUT, seeds[0]))
        g = read_model(model)
        t8 = json.load(open(os.path.join(out, 'q8t.json')))
        trains = {L['op']: tuple(L.get('tw', (0, L['nb']))) for L in t8['layers']
                  if L.get('train')}
        first = min(trains)
        pre = Q8Net(json.load(open(os.path.join(out, 'q8.json'))),
                    os.path.join(out, 'weights.wof'))

        def load(name):             # (the int8 samples prepare wrote, and their labels)
            ds = Dataset(os.path.join(out, name), buffers=False)
            X, Y = [], []
            for i in range(ds.n):
                ds.f.seek(ds.head + i * ds.rec)
                X.append(np.frombuffer(ds.f.read(ds.x_len), np.int8).astype(np.float64))
                Y.append(int(np.frombuffer(ds.f.read(4), np.float32)[0]))
            ds.close()
            return np.array(X) * ds.xs + ds.xo, np.array(Y), np.array(X)
        sets = [load('train.ds'), load('test.ds')]
        f0 = FQNet(g, trains)
        feats = {'float': [np.array([f0.forward(x, 0, stop=first) for x in s[0]]) for s in sets],
                 'cache': [np.array([(np.frombuffer(bytes(pre.forward(bytearray(
                     q.astype(np.int8).tobytes()))), np.int8) - t8['zx']) * t8['sx']
                     for q in s[2]]) for s in sets]}
        pre.close()
        print('| mode | what | seed | test accuracy after each epoch |')
        print('|---|---|---|---|')
        (_, ytr, _), (_, yte, _) = sets
        for m in modes:
            what, src, act, wq, clip = SPLIT[m]
            tr, te = feats[src]
            for seed in seeds:
                n = FQNet(g, trains, act=act, wq=wq, clip=clip)
                accs = []
                for ep in range(EPOCHS):
                    for i in order(len(ytr), seed, ep):
                        n.step(tr[i], int(ytr[i]), LR, start=first)
                    accs.append(np.mean([np.argmax(n.forward(x, first)) == y
                                         for x, y in zip(te, yte)]))
                print('| %s | %s | %d | %s |' % (m, what, seed, ' '.join('%.3f' % a
                                                                        for a in accs)),
                      flush=True)


def mean_cell(accs):
    """'mean (seed 1's / seed 2's ...)' of the accuracies, or the first reason one did not run."""
    bad = [v for v in accs if not isinstance(v, float)]
    if bad:
        return bad[0]
    if len(accs) == 1:
        return '%.3f' % accs[0]
    return '%.3f (%s)' % (sum(accs) / len(accs), ' / '.join('%.3f' % v for v in accs))


def main(argv=None):
    global LR, MOMENTUM, MODEL, SIZE, CUT, SCHEMES    # (--lr, --momentum, --model: the
    # functions above read them)
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--no-accuracy', action='store_true')
    ap.add_argument('--no-heap', action='store_true')
    ap.add_argument('--pico', action='store_true', help='time per image on the emulated Pico '
                    '(. /work/scratch/env.sh or $UTRAIN_PICO_FIRMWARE; slow: minutes a scheme)')
    ap.add_argument('--schemes', help='comma-separated names of SCHEMES (default all)')
    ap.add_argument('--epochs', type=int, default=EPOCHS)
    ap.add_argument('--lr', type=float, default=LR, help='SGD learning rate of every scheme')
    ap.add_argument('--momentum', type=float, default=0.0, help='SGD momentum of every scheme '
                    '(the Tiny Training Engine\'s optimizer: SGD-M)')
    ap.add_argument('--seeds', default='1', help='comma-separated shuffle seeds of the '
                    'accuracy runs (cells: the mean, then each seed\'s)')
    ap.add_argument('--grad-check', type=int, metavar='STEPS', help='instead of the table: '
                    'the int8 update of op 62\'s window (w62) against the fake-quantized '
                    'float gradient, step by step')
    ap.add_argument('--model', default='mbv2-96-digits', choices=sorted(MODELS),
                    help='the int8 zoo model (default: the digits-pre-trained MobileNetV2)')
    ap.add_argument('--split', action='store_true', help='instead of the table: the w62 '
                    "scheme's int8/float gap split by a float trainer with the int8 model's "
                    'quantization switched on a part at a time (bench/fqtrain.py)')
    ap.add_argument('--modes', help='with --split: comma-separated modes of SPLIT (default '
                    'F,F8,Q,QW; also QWfc, QW62, QWnc)')
    a = ap.parse_args(argv)
    MODEL, SIZE, CUT, SCHEMES = MODELS[a.model]
    seeds = [int(v) for v in a.seeds.split(',')]
    if a.split:
        sys.path.insert(0, runner.MICRO)
        return split_gap(seeds, *([a.modes.split(',')] if a.modes else []))
    if a.grad_check:
        sys.path.insert(0, runner.MICRO)
        return grad_check(a.grad_check, seeds[0])
    LR, MOMENTUM = a.lr, a.momentum
    names = a.schemes.split(',') if a.schemes else [s[0] for s in SCHEMES]
    exe = os.environ.get('UTRAIN_MP32')
    print(f'{a.model} ({os.path.basename(MODEL)}), fine-tuned on the digits 5-9: '
          f'{TRAIN} train, SGD lr {LR}' + (f' momentum {MOMENTUM}' if MOMENTUM else '')
          + f' batch 1, {a.epochs} epochs, seeds {a.seeds}; heap on '
          f'{exe or "no $UTRAIN_MP32: not measured"}')
    print('| scheme | what trains | int8 path today | plan rp2040 KB (path) | --board rp2040 | '
          'smallest heap KB, 32-bit | float acc | int8 acc | Pico ms/image: prefix / cached step |')
    print('|---|---|---|---|---|---|---|---|---|')
    os.makedirs(TMP, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TMP) as d:
        model, data, split = (None, None, None) if a.no_accuracy else tail_task(d)
        small = small_task(d)
        for name, what, train, ranks in SCHEMES:
            if name not in names:
                continue
            sd = os.path.join(d, name.replace(':', ''))
            os.makedirs(sd)
            if ranks == 'auto':     # chosen on the tail; prepare drops --train given --ranks
                ranks = None if a.no_accuracy else select_tail(model, data, split,
                                                               os.path.join(sd, 'select'))
                if not isinstance(ranks, dict):
                    print('| %s | %s: %s |' % (name, what, ranks or 'needs the accuracy runs'))
                    continue
                what = '%s: %s' % (what, ranks_text(ranks))
            kb, int8, board = plan_cell(sd, small, train, ranks)
            plan = '-' if kb is None else '%d (%s)' % (kb, 'int8' if int8 else 'float')
            heap = None
            if int8 and exe and not a.no_heap:
                heap = heap_cell(sd, small, train, ranks, exe)
            acc = {}
            for kind in ('float', 'int8'):
                acc[kind] = '-' if a.no_accuracy else mean_cell([accuracy(
                    model, data, split, train, ranks, kind, os.path.join(sd, kind + str(s)),
                    a.epochs, s) for s in seeds])
            p = pico_cell(sd, train, ranks) if a.pico and int8 else None
            na = 'n/a until the engine lands'
            cells = [name, what, 'yes' if int8 else 'no (float path)', plan, board,
                     heap if heap is not None else (na if not int8 else '-'),
                     *acc.values(),
                     '%s / %s' % p if p else '-']
            print('| ' + ' | '.join(str(c) for c in cells) + ' |', flush=True)


if __name__ == '__main__':
    main()
