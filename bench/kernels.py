"""The int8 kernel table (issue 33): `python -m bench.kernels [--pico] [--quick]`.

Cycles (or microseconds) per multiply-add of each q8kern kernel (FC forward, its weight
and input gradients; conv and depthwise conv forward, weight and input gradients, at a
few shapes) and of the bare int8 multiply-add loops, timed by bench/kernels_board.py on
the board itself: unix MicroPython (viper; x86 ratios) and, with --pico, the emulated
Raspberry Pi Pico (the real rp2 firmware in rp2040js, host_tools/boards/pico.py; its clock is
the chip's: cycles = us x 125), where q8kern's kernels are q8asm's inline Thumb
assembler and q8kern.vk() loads the viper ones beside them.  Columns: per multiply-add,
the viper kernel and (Pico) the assembler one, each over its bare loop (viper over the
bare viper loop, asm over the bare asm loop): the issue's bound is asm/bare <= 2."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from host_tools.target import runner  # noqa: E402

# shapes: FC (inputs, outputs); conv (H, W, I, O, K, stride, pad); depthwise (H, W, C, K,
# stride, pad).  1x1: DS-CNN's pointwise convs (its input rows are the im2col rows);
# 3x3: a small CNN's; 10x4-like first conv of one input channel (I = 1); depthwise 'c64':
# 64 channels, 5 columns as the DS-CNN keyword model's (25x5x64), 4 of its rows
CFG = {'fc': [64, 32], 'bare': 16384, 'min_us': 20000,
       'conv': {'1x1': [5, 5, 32, 32, 1, 1, 1, 0], '3x3': [6, 6, 8, 16, 3, 3, 1, 1],
                'i1': [13, 10, 1, 64, 10, 4, 2, 1]},
       'dw': {'3x3': [6, 6, 32, 3, 1, 1], '3x3s2': [8, 8, 16, 3, 2, 1],
              'c64': [4, 5, 64, 3, 1, 1]}}
QUICK = dict(CFG, min_us=2000)


def _folder(out, quick, only=None):
    with open(os.path.join(out, 'kbench.json'), 'w') as f:
        json.dump(dict(QUICK if quick else CFG, only=only or ''), f)
    shutil.copy(os.path.join(ROOT, 'bench', 'kernels_board.py'), out)
    with open(os.path.join(out, 'train.json'), 'w') as f:     # (run_folder's marker)
        f.write('{}')


def _parse(text):
    if 'Traceback' in text:
        raise RuntimeError(text.strip()[-600:])
    rows = {}
    for line in text.splitlines():
        if line.startswith('KERN '):
            _, name, macs, tv, ta = line.split()
            rows[name.replace(':', ' ')] = (int(macs), float(tv), float(ta))
    if 'bare' not in rows:
        raise RuntimeError(text.strip()[-400:])
    return rows


def run_unix(quick, binary=None, only=None):
    binary = binary or runner.micropython_binary()
    with tempfile.TemporaryDirectory() as out:
        _folder(out, quick, only)
        mpy = subprocess.run([binary, '-c', 'import sys;print(sys.implementation._mpy)'],
                             capture_output=True, text=True, timeout=60).stdout.split()[-1]
        runner.stage(out, mpy=int(mpy))
        r = subprocess.run([binary, '-X', 'heapsize=2M', 'kernels_board.py'], cwd=out,
                           env=dict(os.environ, MICROPYPATH=':lib'), capture_output=True,
                           text=True, timeout=1800)
        return _parse(r.stdout + r.stderr)


def run_pico(quick, only=None):
    from host_tools.boards import pico
    with tempfile.TemporaryDirectory() as out:
        _folder(out, quick, only)
        code, text = pico.run_folder(out, stream=False, script='kernels_board.py')
        return _parse(text)


# --steps: (label, model: a Keras int8 stem of bench/zoo/keras or 'cnn4k' (cnn4k() below),
# --train, row bands: None as quant.meta plans them, 0 none)
STEPS = [('DS-CNN KWS last:2, unbanded (rp2040 plan)', 'dscnn_kws', 'last:2', 0),
         ('DS-CNN KWS last:2, banded', 'dscnn_kws', 'last:2', None),
         ('32x32x3 CNN, 4 K parameters, all', 'cnn4k', 'all', 0)]


def cnn4k(path, seed=0):
    """An int8 32x32x3 CNN of 3,882 parameters: conv 3x3/2 3->8, 8->16, 16->16 (SAME,
    RELU), average pool 4x4, FC 16->10; per-channel weight scales, random weights."""
    from host_tools.formats.circle_build import CircleBuilder
    import numpy as np
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa: E731

    def layer(x, sx, O, I, y, sy, k, act):
        fan = I * max(k, 1) ** 2
        sw = rng.uniform(0.7, 1.3, O) * 30 * sy / (fan ** 0.5 * 40 * sx * 73)
        shape = (O, I) if k == 0 else (O, k, k, I)
        wq = rng.integers(-127, 128, shape).astype(np.int8)
        w = b.tensor('w%d' % y, wq.shape, data=wq, quant={
            'scale': list(sw), 'zero_point': [0] * O, 'quantized_dimension': 0})
        bq = rng.integers(-300, 300, O).astype(np.int32)
        bt = b.tensor('b%d' % y, [O], data=bq, quant={'scale': list(sx * sw),
                                                     'zero_point': [0] * O})
        if k == 0:
            b.op('FULLY_CONNECTED', [x, w, bt], [y], fused_activation_function=act)
        else:
            b.op('CONV_2D', [x, w, bt], [y], padding='SAME', stride_w=2, stride_h=2,
                 fused_activation_function=act)

    x = b.tensor('x', [1, 32, 32, 3], dtype='int8', quant=q(0.02, 3))
    c1 = b.tensor('c1', [1, 16, 16, 8], dtype='int8', quant=q(0.03, -20))
    layer(x, 0.02, 8, 3, c1, 0.03, 3, 'RELU')
    c2 = b.tensor('c2', [1, 8, 8, 16], dtype='int8', quant=q(0.04, -30))
    layer(c1, 0.03, 16, 8, c2, 0.04, 3, 'RELU')
    c3 = b.tensor('c3', [1, 4, 4, 16], dtype='int8', quant=q(0.05, -40))
    layer(c2, 0.04, 16, 16, c3, 0.05, 3, 'RELU')
    p = b.tensor('p', [1, 1, 1, 16], dtype='int8', quant=q(0.05, -40))
    b.op('AVERAGE_POOL_2D', [c3], [p], padding='VALID', stride_w=4, stride_h=4,
         filter_width=4, filter_height=4, fused_activation_function='NONE')
    f = b.tensor('flat', [1, 16], dtype='int8', quant=q(0.05, -40))
    b.op('RESHAPE', [p, b.tensor('shape', [2], data=np.array([1, 16], np.int32))], [f],
         new_shape=[1, 16])
    y = b.tensor('y', [1, 10], dtype='int8', quant=q(0.08, -2))
    layer(f, 0.05, 10, 16, y, 0.08, 0, 'NONE')
    b.inputs(x)
    b.outputs(y)
    b.save(path)
    return path


def step_macs(g, m):
    """Multiply-adds of one int8 training step: every conv/FC's forward, a trained
    layer's weight gradient and the input gradients from the last layer down to the
    first trained one's output."""
    from host_tools.prepare.select import layer_macs
    mac = [layer_macs(g, g.ops[lay['op']]) if g.ops[lay['op']].name in (
        'CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED') else 0 for lay in m['layers']]
    tr = [i for i, lay in enumerate(m['layers']) if lay.get('train')]
    n = sum(mac)
    if tr:
        n += sum(mac[i] for i in tr) + sum(mac[tr[0] + 1:])
    return n


def run_steps(samples=3):
    """[(label, MACs, cycles per step, bare cycles per MAC)] on the emulated Pico."""
    import numpy as np
    from host_tools.boards import pico
    from host_tools.prepare import quant
    from host_tools.formats.circle_io import read_model
    from host_tools.files.wof import write_wof
    keras = os.path.join(ROOT, 'bench', 'zoo', 'keras')
    out_rows = []
    for label, stem, train, rows in STEPS:
        with tempfile.TemporaryDirectory() as out:
            if stem == 'cnn4k':
                g = read_model(cnn4k(os.path.join(out, 'cnn4k.tflite')))
                rng = np.random.default_rng(1)
                q = rng.integers(-128, 128, (samples + 1, 32 * 32 * 3)).astype(np.int8)
                ys = rng.integers(0, 10, samples + 1)
            else:
                g = read_model(os.path.join(keras, stem + '_int8.tflite'))
                d = np.load(os.path.join(keras, stem + '_data.npz'))
                (sx,), (zx,) = quant._q(g.tensors[g.inputs[0]])
                x = d['x'][:samples + 1]
                q = np.clip(np.round(x.reshape(len(x), -1) / sx) + zx, -128, 127).astype(np.int8)
                ys = d['y'][:samples + 1]
            m = quant.meta(g, train, rows=rows)
            with open(os.path.join(out, 'q8.json'), 'w') as f:
                json.dump(m, f)
            write_wof(os.path.join(out, 'q8.wof'), len(g.tensors), quant.wof_arrays(g, m),
                      keep_dtype=True)
            with open(os.path.join(out, 'q8x.bin'), 'wb') as f:
                for i in range(len(q)):
                    f.write(q[i].tobytes() + bytes([int(ys[i])]))
            with open(os.path.join(out, 'train.json'), 'w') as f:
                f.write('{}')
            shutil.copy(os.path.join(ROOT, 'bench', 'kernels_step.py'), out)
            code, text = pico.run_folder(out, stream=False, script='kernels_step.py')
        line = [v for v in text.splitlines() if v.startswith('STEP ')]
        if code or not line:
            raise RuntimeError(text.strip()[-400:])
        _, cyc, bare = line[0].split()
        out_rows.append((label, step_macs(g, m), int(cyc), float(bare)))
    return out_rows


def steps_table(rows):
    out = ['| model | MACs/step | Mcyc/step | ms at 125 MHz | MACs x bare, Mcyc | /(MACs x bare) |',
           '|---|---|---|---|---|---|']
    for label, macs, cyc, bare in rows:
        out.append('| %s | %d | %.1f | %.0f | %.1f | %.2fx |' % (
            label, macs, cyc / 1e6, cyc / 125e3, macs * bare / 1e6, cyc / (macs * bare)))
    return '\n'.join(out)


def run_float(samples=8, stock=True, rounds=2):
    """The digits MLP (float, SGD batch 1) on the emulated Pico, ulab and stock firmware
    (bench/npasm_step.py): {firmware: {'npasm', 'kern': {name: (MACs, npasm cyc, own
    cyc)}, 'step': {mode: cycles}, 'digest': {mode: hex}}}; mode 'on'/'off': npasm's
    kernels / the backend's own arithmetic (ulab's, the fallback's), alternated in one
    run ('one': a firmware without npasm); rounds 0: the digests only, nothing timed."""
    import numpy as np
    from host_tools.boards import pico
    from host_tools.formats.circle_io import read_model
    from host_tools.prepare.pipeline import prepare
    from bench import models
    path = os.path.join(models.DIGITS, 'digits_mlp.circle')
    g = read_model(path)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        x, y = models.data(g, path, samples)
        np.savez(os.path.join(tmp, 'd.npz'), x=x, y=y)
        d = os.path.join(tmp, 'run')
        prepare(path, d, data=os.path.join(tmp, 'd.npz'), loss='scce', optimizer='sgd',
                lr=0.01, batch=1, epochs=1, train='all', bands=0, int8=False,
                log=lambda *a, **k: None)
        w = models.work(g, 'all')
        with open(os.path.join(d, 'bench.json'), 'w') as f:
            json.dump({'max_samples': samples, 'steps': 4, 'rounds': rounds, 'gemms': w['gemms'],
                       'loops': w['loops']}, f)
        for n in ('step.py', 'npasm_step.py'):
            shutil.copy(os.path.join(ROOT, 'bench', n), d)
        for fw, ulab in (('ulab', True), ('stock', False)):
            if not pico.available(ulab) or not (ulab or stock):
                continue
            code, text = pico.run_folder(d, ulab=ulab, stream=False, script='npasm_step.py')
            if code or 'DIGEST ' not in text:
                raise RuntimeError(text.strip()[-600:])
            r = {'kern': {}, 'step': {}, 'digest': {}, 'macs': w['macs']}
            for line in text.splitlines():
                p = line.split()
                if p and p[0] == 'NPASM':
                    r['npasm'] = p[1] == '1'
                elif p and p[0] == 'FKERN':
                    r['kern'][p[1]] = (int(p[2]), int(p[3]), int(p[4]))
                elif p and p[0] == 'STEP':
                    r['step'][p[1]] = int(p[2])
                elif p and p[0] == 'DIGEST':
                    r['digest'][p[1]] = p[2]
            out[fw] = r
    return out


def float_table(res):
    """Markdown: npasm's kernels per multiply-add against the backend's own (ulab's, the
    fallback's), and the digits MLP's step per firmware and mode."""
    out = ['| firmware | kernel (dense data) | MACs/call | npasm cyc/MAC | own cyc/MAC | own/npasm |',
           '|---|---|---|---|---|---|']
    for fw, r in res.items():
        k = r['kern']
        call = k.get('call_overhead', (0, 0, 0))
        for name, (m, ta, tu) in k.items():
            if m:
                a, u = (ta - call[1]) / m, (tu - call[2]) / m
                out.append('| %s | %s | %d | %.1f | %.1f | %.2fx |' % (fw, name, m, a, u, u / a))
    out += ['', '| firmware | step | Mcyc/step | ms at 125 MHz | /(npasm step) | weights |',
            '|---|---|---|---|---|---|']
    for fw, r in res.items():
        base = r['step'].get('on')
        for mode, cyc in r['step'].items():
            label = {'on': 'npasm kernels', 'off': 'own arithmetic', 'one': 'no npasm'}[mode]
            same = ''
            if mode == 'off' and r['digest'].get('on'):
                same = 'identical' if r['digest']['on'] == r['digest']['off'] else 'DIFFER'
            out.append('| %s | %s | %.2f | %.1f | %s | %s |' % (
                fw, label, cyc / 1e6, cyc / 125e3, '%.2fx' % (cyc / base) if base else '-', same))
    return '\n'.join(out)


def table(rows, unit, scale):
    """Markdown rows: per multiply-add in unit (us x scale), viper, asm, and each over
    its bare loop."""
    bm, bv, ba = rows['bare']
    bv, ba = bv * scale / bm, (ba * scale / bm if ba > 0 else None)
    head = ('kernel', 'MACs/call', f'viper {unit}/MAC', 'viper/bare', f'asm {unit}/MAC',
            'asm/bare', 'viper/asm')
    out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, (m, tv, ta) in rows.items():
        v = tv * scale / m
        a = ta * scale / m if ta > 0 else None
        out.append('| %s | %d | %.1f | %.2f | %s | %s | %s |' % (
            name, m, v, v / bv, '%.1f' % a if a else '-', '%.2f' % (a / ba) if a else '-',
            '%.1f' % (v / a) if a else '-'))
    return '\n'.join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python -m bench.kernels')
    ap.add_argument('--pico', action='store_true', help='also on the emulated Pico '
                    '($UTRAIN_PICO_FIRMWARE)')
    ap.add_argument('--no-unix', action='store_true')
    ap.add_argument('--quick', action='store_true')
    ap.add_argument('--steps', action='store_true', help='whole int8 training steps on the '
                    'emulated Pico against their multiply-adds times the bare loop')
    ap.add_argument('--float', action='store_true', help='the float kernels (utrain.npasm: '
                    "Thumb assembler over the RP2040 bootrom's float routines) and the digits "
                    'MLP float step on the emulated Pico, ulab and stock firmware')
    ap.add_argument('--only', default='', help='only the kernel rows whose name contains '
                    'this text (e.g. 3x3s2: the stride-2 depthwise ones); the bare loop always')
    a = ap.parse_args(argv)
    if not a.no_unix:
        print('unix MicroPython (%s), ns per multiply-add:' % os.path.basename(
            runner.micropython_binary()))
        print(table(run_unix(a.quick, only=a.only), 'ns', 1000.0))
    if a.pico:
        print('\nemulated Pico (RP2040 at 125 MHz, real rp2 firmware), cycles per multiply-add:')
        print(table(run_pico(a.quick, only=a.only), 'cyc', 125.0))
    if a.float:
        print('\nemulated Pico, float32 kernels and the digits MLP float step (SGD batch 1):')
        print(float_table(run_float()))
    if a.steps:
        print('\nemulated Pico, int8 training steps (SGD batch 1), cycles per sample:')
        print(steps_table(run_steps()))


if __name__ == '__main__':
    main()
