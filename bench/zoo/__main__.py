"""python -m bench.zoo [--quick] [--only NAME] [--no-mp] [--budget S] [--measure] [--boards]:
the model zoo
(issue 15) as one table, every figure measured in this run:

  model       the zoo model and where it comes from: PyTorch (bench/zoo/nets.py, tico;
              int8: bench/zoo/torch_int8.py's quantizer, tico, made once into the zoo
              cache) or Keras (bench/zoo/keras/*.tflite, made by bench/zoo/make_keras.py)
  train       what trains: all, or last:N = the last two layers with weights and what
              follows them (ONERT's count of ops in the file)
  params      float parameters of the model (int8 ones counted once dequantized)
  trained     the parameters that train
  MACs        multiply-adds of one training step (forward + backward), from the graph
  plan KB     the planner's heap for that training (SGD, batch 1), pure-MicroPython
              fallback / ulab
  heap KB     (--measure) the smallest -X heapsize in which that run trains (one epoch of
              8 samples, evaluation, checkpoint; bisection to 1 KB, code as .mpy), on the
              fallback MicroPython / the ulab one ($UTRAIN_MP_ULAB); plans up to 2 MB
  Py us       CPython + numpy running utrain's micro/ code, per training sample;
  Py/dot      that over bare np.dot on the same GEMM sizes, same process (the ratio form)
  MP us       unix MicroPython ($MICROPYTHON or the runner's), utrain .mpy, fallback;
  MP/loop     that over a bare MicroPython loop doing the same multiply-adds
  parity      max |utrain - framework| / max |framework| of the untrained, exported
              model's outputs on 8 samples: utrain's forward (host simulation, float32)
              against PyTorch eval (tico models), Keras's own output (float .tflite) or
              TFLite Micro running the int8 file (int8: the error is the int8 model's
              quantization, utrain runs it dequantized)
  ONERT       the same against ONERT running the exported file (n/a where it cannot)
  plan32 KB   (--boards) prepared short of memory (--stream --cache, row bands where they
              lower the plan: 'b'), planned for a 32-bit board, fallback / ulab
  heap32 KB   the smallest heap that trains it (3 samples, 2 epochs, evaluation,
              checkpoint) on 32-bit unix MicroPython ($UTRAIN_MP32) / with ulab
              ($UTRAIN_MP32_ULAB), code as .mpy
  ep1 ms, ep2 ms, ep1/ep2   time per sample of epoch 1 (the board runs the frozen
              prefix and caches its output) and epoch 2 (from the cache), 32-bit ulab
  Pico Mcyc, Pico/loop, Pico-ulab Mcyc, Pico-ulab/dot   (--pico) RP2040 cycles per
              training step on the emulated Pico, stock firmware and ulab, against the
              bare loop / ulab dot on the chip (python -m bench --help)

Timing alternates utrain and its bare limit in short rounds (bench/__main__.py's
side_by_side and step.py), CPU time, so other processes on a busy machine stay out.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for p in (ROOT, os.path.join(ROOT, 'micro'), os.path.join(ROOT, 'tests', 'formats'), os.path.join(ROOT, 'tests', 'support')):
    if p not in sys.path:
        sys.path.insert(0, p)
os.environ.pop('UTRAIN_NP', None)

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.graph.passes import PrepareError  # noqa: E402
from bench import models  # noqa: E402
from bench.__main__ import side_by_side, micropython_step, err, table, pico_columns  # noqa: E402

KERAS = os.path.join(ROOT, 'bench', 'zoo', 'keras')
N = 8                       # parity samples
COLUMNS = ['model', 'train', 'params', 'trained', 'MACs', 'plan KB', 'heap KB', 'Py us',
           'Py/dot', 'MP us', 'MP/loop', 'parity', 'ONERT']

BOARD_COLUMNS = ['plan32 KB', 'heap32 KB', 'ep1 ms', 'ep2 ms', 'ep1/ep2']
PICO_COLUMNS = ['Pico Mcyc', 'Pico/loop', 'Pico-ulab Mcyc', 'Pico-ulab/dot']
# (name, source, which, layers that train: None = all)
ZOO = [
    ('DS-CNN KWS 49x10 (PyTorch)', 'tico', 'dscnn', 2),
    ('IMU 1-D conv 6x128 (PyTorch)', 'tico', 'imu', None),
    ('ResNet-8 32x32 (PyTorch)', 'tico', 'resnet8', 2),
    ('LSTM KWS 20x10 (PyTorch)', 'tico', 'lstm', None),
    ('GRU KWS 20x10 (PyTorch)', 'tico', 'gru', None),
    ('LayerNorm+GELU block 8x16 (PyTorch)', 'tico', 'lnblock', None),
    ('MLP 16-32-16-4 (Keras)', 'keras', 'mlp_float', None),
    ('MLP 16-32-16-4 int8 (Keras)', 'keras', 'mlp_int8', None),
    ('DS-CNN KWS 49x10 (Keras)', 'keras', 'dscnn_kws_float', 2),
    ('DS-CNN KWS 49x10 int8 (Keras)', 'keras', 'dscnn_kws_int8', 2),
    ('MobileNetV2-0.35 96x96 (Keras)', 'keras', 'mobilenetv2_035_96_float', 2),
    ('MobileNetV2-0.35 96x96 int8 (Keras)', 'keras', 'mobilenetv2_035_96_int8', 2),
    ('MobileNetV2-0.35 96x96 int8 (PyTorch)', 'torch_int8', 'mbv2_96', 2),
    ('MobileNetV2-0.35 128x128 int8 (PyTorch)', 'torch_int8', 'mbv2_128', 2),
    ('MCUNet-like 96x96 int8 (PyTorch)', 'torch_int8', 'mcunet', 2),
]
BIG = ('resnet8', 'mobilenetv2', 'mbv2', 'mcunet')          # --quick leaves these out of MicroPython timing


def last_layers(g, n):
    """--train last:N that trains the last n ops with weights and everything after."""
    if n is None:
        return 'all'
    w = [op.index for op in g.ops if op.name in models.WEIGHTED]
    return 'last:%d' % (len(g.ops) - w[-n])


def keras_data(which):
    """(x [N, ...] float, Keras's outputs or None) for a Keras zoo file."""
    sys.path.insert(0, os.path.join(ROOT, 'bench', 'zoo'))
    import make_keras
    stem = which.rsplit('_', 1)[0]
    z = np.load(os.path.join(KERAS, stem + '_data.npz'))
    if 'x' in z:
        x = z['x']
    else:
        gen = {'mobilenetv2_035_96': make_keras.data_image}[stem]
        x = gen()[0]
    return x[:N].astype(np.float32), z['keras_out'][:N]


def tflm(path, x, g):
    """TFLite Micro's float outputs for x (int8 files: quantized in, dequantized out)."""
    from test_rewrite import tflm_infer
    qi = g.tensors[g.inputs[0]].quant
    qo = g.tensors[g.outputs[0]].quant
    if g.tensors[g.inputs[0]].dtype == 'int8':
        s, z = qi['scale'][0], (qi.get('zero_point') or [0])[0]
        q = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)
        from tflite_micro.python.tflite_micro import runtime
        it = runtime.Interpreter.from_file(path)
        out = []
        for i in range(len(q)):
            it.set_input(q[i:i + 1], 0)
            it.invoke()
            out.append(np.array(it.get_output(0), np.float64))
        s, z = qo['scale'][0], (qo.get('zero_point') or [0])[0]
        return (np.concatenate(out) - z) * s
    return tflm_infer(path, x)


def rel(a, b):
    a, b = np.asarray(a, np.float64).reshape(len(b), -1), np.asarray(b, np.float64).reshape(len(b), -1)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def utrain_forward(out, s, x):
    from utrain.trainer import Trainer
    tr = Trainer(os.path.join(out, 'model.flat'), os.path.join(out, 'weights.wof'))
    ys = []
    for xi in x:
        xi = xi[None]
        if s['input_perm'] is not None:
            xi = xi.transpose(s['input_perm'])
        tr.set_input(np.ascontiguousarray(xi))
        tr.net.forward(False)
        ys.append(np.array(tr.net.output(), np.float64).ravel())
    return np.stack(ys)


def measure(name, source, which, layers, tmp, a):
    row = {'model': name}
    out = os.path.join(tmp, which)
    if source == 'tico':
        import torch
        from bench.zoo import nets
        path = os.path.join(tmp, which + '.circle')
        m, shape, classes = nets.export(which, path)
        x = np.random.default_rng(3).standard_normal((N,) + tuple(shape[1:])).astype(np.float32)
        with torch.no_grad():
            ref = m(torch.from_numpy(x)).numpy()
    elif source == 'torch_int8':
        from bench.zoo import torch_int8
        from bench.zoo.make_keras import data_image
        path = torch_int8.build(which)
        x = data_image(N, seed=5, size=torch_int8.SIZE[which])[0]
        ref = tflm(torch_int8.int32_biases(path, os.path.join(tmp, which + '_ref.tflite')),
                   x, read_model(path))
    else:
        path = os.path.join(KERAS, which + '.tflite')
        x, ref = keras_data(which)
    g = read_model(path)
    train = last_layers(g, layers)
    row['train'] = train
    classifier = models.is_classifier(g)
    n_out = int(np.prod(g.tensors[g.outputs[0]].shape))
    y = np.random.default_rng(4).integers(0, n_out, N) if classifier else \
        np.random.default_rng(4).standard_normal((N, n_out)).astype(np.float32)
    npz = os.path.join(tmp, which + '.npz')
    np.savez(npz, x=x, y=y)
    # an int8 file trains dequantized here (float32, the zoo's other rows' engine; the
    # int8 engine is issue 16's bench)
    kw = dict(data=npz, loss='scce' if classifier else 'mse', optimizer='sgd', lr=0.01, batch=1,
              epochs=1, train=train, dequantize=True)
    s = prepare(path, out, backend='ulab', **kw)
    plan_ulab = s['heap']['total']
    s = prepare(path, out, **kw)
    row['params'] = s['trainable_params'] + s['frozen_params']
    row['trained'] = s['trainable_params']
    row['plan KB'] = '%d / %d' % (s['heap']['total'] // 1024, plan_ulab // 1024)
    w = models.work(g, train)
    row['MACs'] = w['macs']
    row['heap KB'] = measured_heaps(out, s['heap']['total']) if a.measure else 'skipped'
    if a.boards:
        board_rows(row, path, train, classifier, x, y, tmp, which)
    y_ut = utrain_forward(out, s, x)
    if source == 'keras' and which.endswith('int8'):
        ref = tflm(path, x, g)
    row['parity'] = '%.1e' % rel(y_ut, ref)
    if which.endswith('int8') or source == 'torch_int8':
        row['ONERT'] = 'n/a (int8 file)'
    else:
        try:
            from onert_ref import onert_infer
            row['ONERT'] = '%.1e' % rel(y_ut, onert_infer(path, x))
        except Exception as e:  # noqa: BLE001  (a row says why, the table goes on)
            row['ONERT'] = 'n/a (' + err(e)[:40] + ')'
    cfg = {'rounds': a.rounds, 'budget_us': int(a.budget * 1e6), 'round_us': 20000,
           'max_steps': a.max_steps, 'gemms': w['gemms'], 'loops': w['loops']}
    from bench import step
    best, ratio = side_by_side(dict(zip(('Py', 'dot'), step.setup(out, cfg))), a.budget, a.rounds)
    row['Py us'], row['Py/dot'] = best['Py'], ratio('Py', 'dot')
    if a.no_mp or (a.quick and any(b in which for b in BIG)):
        row['MP us'] = row['MP/loop'] = 'skipped'
    else:
        try:
            row['MP us'], row['MP/loop'] = micropython_step(out, cfg, heap=a.heap)
        except Exception as e:  # noqa: BLE001
            row['MP us'] = row['MP/loop'] = 'n/a (' + err(e)[:40] + ')'
    if a.pico:
        pico_columns(row, out, cfg, a)
    return row


BUILDS32 = (('stock', 'UTRAIN_MP32', 'fallback'), ('ulab', 'UTRAIN_MP32_ULAB', 'ulab'))


def with_micropython(binary, f, *args, **kw):
    old = os.environ.get('MICROPYTHON')
    os.environ['MICROPYTHON'] = binary
    try:
        return f(*args, **kw)
    finally:
        if old is None:
            os.environ.pop('MICROPYTHON')
        else:
            os.environ['MICROPYTHON'] = old


def board_rows(row, path, train, classifier, x, y, tmp, which):
    """The 32-bit columns (--boards): prepared as a user short of memory would (frozen
    weights streamed, the frozen prefix cached by the board in epoch 1, row bands where
    they lower the plan), planned for a 32-bit board, the smallest heap that trains (3
    samples, 2 epochs, evaluation, checkpoint) on the 32-bit builds of
    ../shared/board-sim.md, and the time per sample of epoch 1 (the board computes the
    prefix) against epoch 2 (from the cache) on the 32-bit ulab build (else stock)."""
    import re
    from host_tools.target import runner
    from host_tools.plan.memory import smallest_heap
    npz = os.path.join(tmp, which + '_b.npz')
    np.savez(npz, x=x[:4], y=y[:4])
    plans, heaps, times = [], [], None
    for label, var, backend in BUILDS32:
        binary = os.environ.get(var)
        best = None
        for bands in (0, 1):            # the lower plan, as prepare's default with no limit
            out = os.path.join(tmp, '%s_%s_%d' % (which, label, bands))
            try:
                s = prepare(path, out, data=npz, test_split=0.25,
                            loss='scce' if classifier else 'mse', optimizer='sgd', lr=0.01,
                            batch=1, epochs=2, train=train, dequantize=True, stream=True,
                            cache=True, bands=bands, board='esp32-psram', backend=backend,
                            log=lambda *a: None)
            except PrepareError:        # (over the board's 4 MB without bands)
                continue
            if best is None or s['heap']['total'] < best[1]['heap']['total']:
                best = (out, s)
        out, s = best
        import json
        with open(os.path.join(out, 'train.json')) as f:
            c = json.load(f)
        c['run']['keep_best'] = False       # every run saves (trains_in looks for it)
        with open(os.path.join(out, 'train.json'), 'w') as f:
            json.dump(c, f)
        plans.append('%d%s' % (s['heap']['total'] // 1024, 'b' if s.get('bands') else ''))
        if not binary or not os.path.exists(binary):
            heaps.append('-')
            continue
        h = with_micropython(binary, smallest_heap, out, hi=4096 * 1024)
        heaps.append('%d' % (h // 1024) if h else 'fails')
        if h:
            argv, env = with_micropython(binary, runner.command, out)
            argv[argv.index('-X') + 1] = 'heapsize=%d' % (4096 * 1024)
            for f in os.listdir(out):
                if '.pfx' in f:
                    os.remove(os.path.join(out, f))
            import subprocess
            r = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=3600)
            ms = [float(v) for v in re.findall(r'^epoch \d+/\d+ .*?\(([\d.]+) ms/sample', r.stdout, re.M)]
            if len(ms) >= 2 and s['frozen_params']:     # (nothing frozen: nothing cached)
                times = (label, ms[0], ms[1])
    row['plan32 KB'] = ' / '.join(plans)
    row['heap32 KB'] = ' / '.join(heaps)
    if times:
        row['ep1 ms'], row['ep2 ms'] = '%.1f (%s)' % (times[1], times[0]), '%.1f' % times[2]
        row['ep1/ep2'] = '%.1fx' % (times[1] / max(times[2], 1e-3))


def measured_heaps(out, plan):
    """'fallback KB / ulab KB': the smallest heaps that train the prepared run."""
    from host_tools.target import runner
    from host_tools.plan.memory import smallest_heap
    if plan > 2048 * 1024:
        return 'n/a (plan > 2 MB)'
    got = []
    for binary in (runner.micropython_binary(), os.environ.get('UTRAIN_MP_ULAB')):
        if not binary:
            got.append('-')
            continue
        old = os.environ.get('MICROPYTHON')
        os.environ['MICROPYTHON'] = binary
        try:
            h = smallest_heap(out, hi=4096 * 1024)
        finally:
            if old is None:
                os.environ.pop('MICROPYTHON')
            else:
                os.environ['MICROPYTHON'] = old
        got.append('%d' % (h // 1024) if h else 'fails')
    return ' / '.join(got)


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.zoo', description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--quick', action='store_true', help='CI smoke run: tiny budgets, the big '
                    'models not timed under MicroPython')
    ap.add_argument('--budget', type=float, default=1.0, help='CPU seconds per engine and row')
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--max-steps', type=int, default=500)
    ap.add_argument('--heap', default='16M', help='MicroPython heap for the timing runs')
    ap.add_argument('--no-mp', action='store_true', help='no MicroPython timing')
    ap.add_argument('--measure', action='store_true', help='also measure the smallest heap')
    ap.add_argument('--boards', action='store_true', help='the 32-bit columns: plan, smallest '
                    'heap on $UTRAIN_MP32 / $UTRAIN_MP32_ULAB, epoch 1 vs 2 time with the '
                    'prefix cached')
    ap.add_argument('--only', help='models whose name or file contains this (comma-separated: any)')
    ap.add_argument('--pico', action='store_true', help='RP2040 cycles per training step on '
                    'the emulated Pico, stock and ulab firmware (python -m bench --help)')
    ap.add_argument('--pico-max', type=float, default=1.5,
                    help='G cycles: emulate no step estimated above this (default 1.5)')
    a = ap.parse_args(argv)
    if a.quick:
        a.budget, a.rounds, a.max_steps = 0.05, 1, 2
    tmp = tempfile.mkdtemp(prefix='utrain_zoo_')
    rows = []
    try:
        for name, source, which, layers in ZOO:
            if a.only and not any(o.strip().lower() in (name + which).lower()
                                  for o in a.only.split(',')):
                continue
            try:
                rows.append(measure(name, source, which, layers, tmp, a))
            except Exception as e:  # noqa: BLE001
                rows.append({'model': name, 'train': 'n/a (' + err(e) + ')'})
            print('  measured ' + name, file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print('the zoo, untrained exports: training step SGD batch 1, time per sample')
    print(table(rows, COLUMNS + (BOARD_COLUMNS if a.boards else [])
                + (PICO_COLUMNS if a.pico else [])))
    return 0


if __name__ == '__main__':
    sys.exit(main())
