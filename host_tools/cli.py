"""python -m host_tools {inspect,prepare,run,export,demo,dataset,deploy,pull,plot,fleet} ..."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _status(op, g):
    from .optable import SPECS
    spec = SPECS.get(op.name)
    if spec is None:
        return 'NOT SUPPORTED'
    roles = spec.roles(op, g)
    if roles:
        return 'trains (' + ', '.join(roles.values()) + ')'
    return 'passes gradients'


def _op_line(g, op, how):
    opts = ', '.join(f'{k}={v}' for k, v in op.options.items()
                     if k in ('fused_activation_function', 'beta', 'keep_num_dims'))
    return (f'  {op.number:3d} {op.name:17s} {list(op.inputs)} -> {list(op.outputs)}'
            f'  {opts}  [{how}]')


def cmd_inspect(a):
    from .circle_io import read_model
    from .optable import SPECS, SUPPORTED
    from .prepare import select_rewrite
    g = read_model(a.model)
    print(f'{a.model}: {g.identifier.decode()} v{g.version}, {len(g.ops)} ops, '
          f'{len(g.tensors)} tensors, inputs {list(g.inputs)}, outputs {list(g.outputs)}')
    if g.description:
        print(f'description: {g.description}')
    if g.metadata:
        print(f'metadata: {", ".join(g.metadata)}')
    # what prepare's rewrite pass makes of it: training everything (BatchNorm kept) ...
    h, _, _, info, perm = select_rewrite(g, 'all')
    kept = {op.number for op in h.ops}
    # ... and with frozen layers (BatchNorm folded)
    f, _, _, finfo, _ = select_rewrite(g, 'none')
    folded = finfo['batchnorm']
    fkept = {op.number for op in f.ops}
    print('\nops (as in the file; --train last:N counts these):')
    for op in g.ops:
        how = _status(op, g) if op.number in kept else 'removed by prepare'
        if op.number in kept and op.number not in fkept:
            how += '; folded into the layer before it when that is frozen'
        print(_op_line(g, op, how))
    if info['changed'] or perm:
        print(f'\nprepare rewrites it: {info["dequantized"]} tensors dequantized, '
              f'{info["transposes"]} layout transpose rewrites'
              + (f', input {perm} (the model takes NHWC data)' if perm else '')
              + (f', {folded} BatchNorm MUL/ADD folded into frozen layers' if folded else ''))
        print('ops after the rewrites (everything trainable; ops numbered as in the file, '
              'tensors as in the rewritten.circle prepare writes):')
        for op in h.ops:
            print(_op_line(h, op, _status(op, h)))
    print('\ntensors:')
    total = 0
    for t in g.tensors:
        n = int(np.prod(t.shape)) if t.shape else 1
        const = 'const' if t.data is not None else ''
        if t.data is not None and t.dtype == 'float32':
            total += n
        print(f'  {t.index:3d} {t.name[:40]:40s} {str(list(t.shape)):18s} {t.dtype:8s} {const:5s}'
              f' {n if const else ""}')
    print(f'\nparameters (float32 constants): {total}')
    trains = sorted(n for n in SUPPORTED if SPECS[n].params)   # callable: ADD/SUB/MUL/DIV's constant
    print(f'ops that train here (weights): {", ".join(trains)}')
    print(f'ops gradients pass through: {", ".join(n for n in SUPPORTED if n not in trains)}')
    bad = [op for op in h.ops if op.name not in SPECS]
    if bad:
        print('not trainable here: ' + ', '.join(f'op {op.number} {op.name}' for op in bad))
        if all(op.name in SPECS for op in f.ops):
            print('(all of them fold away when their layers stay frozen: train the layers '
                  'after them, e.g. --train last:N)')
            return 0
        return 1
    return 0


def cmd_prepare(a):
    from .prepare import prepare
    s = prepare(a.model, a.out, data=a.data, test_split=a.test_split, split_seed=a.split_seed,
                dtype=a.dtype, progress=a.progress,
                loss=a.loss, reduction=a.reduction, from_logits=a.from_logits,
                optimizer=a.optimizer, lr=a.lr, momentum=a.momentum, beta1=a.beta1,
                beta2=a.beta2, eps=a.eps, rho=a.rho, batch=a.batch, epochs=a.epochs,
                metric=a.metric, shuffle=a.shuffle, seed=a.seed, train=a.train,
                ranks=a.ranks, train_config=a.train_config, stream=a.stream,
                budget=a.budget, board=a.board, backend=a.backend, rewrite=not a.no_rewrite,
                cache=a.cache, select=a.select, select_layers=a.select_layers,
                dequantize=a.dequantize, bands=a.bands)
    st = s['settings']
    if s.get('int8'):
        print(f'prepared {a.out}: int8 model training as int8 (q8.json, int8 weights.wof), '
              f'{s["trainable_params"]} trainable parameters; --dequantize trains it in float')
        print('  trains: ' + ', '.join(f'{k} {v}' for k, v in s['trainable'].items()))
        print(f'  {st["loss"]}, {st["optimizer"]} lr {st["lr"]:g}, {st["epochs"]} epochs')
        if 'train_samples' in s:
            print(f'  data: {s["train_samples"]} train, {s["test_samples"]} test samples '
                  'stored as int8 at the model input\'s scale')
        print_heap(s['heap'])
        return 0
    print(f'prepared {a.out}: {s["flat_bytes"]} B flattened model, '
          f'{s["trainable_params"]} trainable + {s["frozen_params"]} frozen parameters, '
          f'{s["backward_ops"]} backward ops, {s["saved_activations"]} saved activations')
    print('  trains: ' + ', '.join(f'{k} {v}' for k, v in s['trainable'].items()))
    print(f'  {st["loss"]} ({st["reduction"]}{", from logits" if st["from_logits"] else ""}), '
          f'{st["optimizer"]} lr {st["lr"]:g}, batch {st["batch"]}, {st["epochs"]} epochs, '
          f'metric {st["metric"]}')
    if 'train_samples' in s:
        print(f'  data: {s["train_samples"]} train, {s["test_samples"]} test samples '
              f'stored as {s["dtype"]}')
        if s.get('balance'):
            print(f'  train classes: {s["balance"]}')
    if s['ranks']:
        print('  sparse update (output channels lo:hi): ' + ', '.join(
            f'{k} {lo}:{hi}' for k, (ax, lo, hi) in s['ranks'].items()))
    if s.get('train_config'):
        print(f'  onert-micro training config: {s["train_config"]}')
    if s.get('rewrites', {}).get('dequantized'):
        print(f'  int8 model dequantized: {s["rewrites"]["dequantized"]} tensors, trains in '
              'float32 (export --quantized writes it as int8 again)'
              + ('' if a.dequantize else '; as int8 it trains with --train, without --ranks, '
                 '--train-config or --select'))
    if s.get('bands'):
        print('  row bands (ops computed a few rows at a time): ' + ', '.join(
            f'ops {lo}..{last} ({r} row{"s" if r > 1 else ""})' for lo, last, r in s['bands']))
    print_heap(s['heap'], f'  [{"stream frozen weights" if st.get("stream") else "frozen weights in RAM"}]')
    return 0


def print_heap(h, note=''):
    print(f'  heap plan ({h["backend"]}, for {h["target"]}): {h["total"] // 1024} KB' + note)
    for k, v in h['parts'].items():
        if v:
            print(f'    {k:48s} {v / 1024:7.1f} KB')


def cmd_run(a):
    from .runner import run
    code, _ = run(a.dir, board=a.board, python=a.python, source=a.source)
    return code


def cmd_export(a):
    from .prepare import export
    r = export(a.model, a.weights, a.output, quantized=a.quantized)
    print(f'wrote {a.output}: {r["tensors"]} tensors from {a.weights} into {r["model"]}'
          + (f' (re-quantized; {r["clipped"]} values clipped to the type range)'
             if a.quantized else '') + (' (int8, as trained)' if r.get('int8') else ''))
    return 0


def cmd_dataset(a):
    """Convert .npz / .csv / image folders to train.ds and test.ds."""
    from . import dataset as ds
    size = tuple(int(v) for v in a.size.lower().split('x')) if a.size else None
    d = ds.samples(a.source, a.out, a.test_split, a.split_seed, a.dtype, label=a.label, size=size)
    x, y, tr, te, paths = d['x'], d['y'], d['train'], d['test'], d['wrote']
    scale, offset = d['scale'], d['offset']
    wrote = [f'{paths[n]} ({len(idx)} samples, {os.path.getsize(paths[n])} B)'
             for n, idx in (('train.ds', tr), ('test.ds', te)) if n in paths]
    print(f'{a.source}: {len(x)} samples of {x.shape[1]} values, stored as {a.dtype}'
          + (f' (value = q * {scale:g} + {offset:g})' if a.dtype != 'float32' else ''))
    if a.dtype != 'float32':
        xq, _ = ds.read_dataset(os.path.join(a.out, 'train.ds'))
        print(f'  largest quantization error {float(abs(xq - x[tr]).max()):.4g}')
    print('  wrote ' + ', '.join(wrote))
    print(f'  classes (train): {ds.balance(y[tr])}')
    if len(te):
        print(f'  classes (test): {ds.balance(y[te])}')
    return 0


def cmd_deploy(a):
    from .board import deploy
    deploy(a.dir, a.port, board=a.board, source=a.source, run=a.run, resume=a.resume)
    return 0


def cmd_pull(a):
    from .board import pull
    pull(a.dir, a.port, resume=a.resume)
    return 0


def cmd_fleet(a):
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise RuntimeError('fleet runs on Flower: pip install flwr (the version in '
                           'requirements.txt)') from None
    from .fleet import fleet, FleetError
    ports = [p for p in a.ports.split(',') if p] if a.ports else None
    if not ports and not a.boards:
        raise ValueError('fleet: give --boards N (simulated boards) or --ports P1,P2,...')
    try:
        st = fleet(a.dir, boards=a.boards, rounds=a.rounds, split_how=a.split, seed=a.seed,
                   ports=ports, python=a.python, board=a.board, out=a.out,
                   strategy=a.strategy, epochs=a.epochs, timeout=a.timeout, resume=a.resume, test=a.test)
    except FleetError as e:
        raise RuntimeError(str(e)) from None
    last = st['history'][-1]
    if not any(h['answered'] for h in st['history'][1:]):
        print('error: no board answered in any round', file=sys.stderr)
        return 1
    print(f'fleet done: round {last["round"]}, global weights in '
          f'{os.path.join(a.out or os.path.join(a.dir, "fleet"), "global.wof")}')
    return 0


def cmd_plot(a):
    from .plot import plot
    print(f'wrote {plot(a.log, a.output)}')
    return 0


DEMOS = {
    # the bundled digits MLP, trained from scratch
    'mlp': dict(model='digits_mlp.circle', loss='scce', optimizer='adam', lr=0.005, batch=4,
                epochs=5),
    # a PyTorch CNN converted with tico (datasets/digits/make_tico.py), pre-trained on the
    # digits 0-5: the frozen conv + BatchNorm features are kept, the depthwise conv and
    # the classifier learn all ten digits (transfer learning)
    'cnn': dict(model='digits_tico_cnn.circle', loss='scce', from_logits=True,
                optimizer='adam', lr=0.005, batch=4, epochs=2, train_from='DEPTHWISE_CONV_2D'),
}


def cmd_demo(a):
    """A bundled digits example end to end on the simulated board."""
    from .runner import run
    from .prepare import prepare, export
    from .circle_io import read_model
    from . import dataset as ds
    cfg = dict(DEMOS[a.model])
    model = os.path.join(ROOT, 'datasets', 'digits', cfg.pop('model'))
    data = os.path.join(ROOT, 'datasets', 'digits', 'digits.npz')
    out = a.out or os.path.join('build', 'digits' if a.model == 'mlp' else 'digits_cnn')
    first = cfg.pop('train_from', None)
    epochs = cfg.pop('epochs')
    epochs = epochs if a.epochs is None else a.epochs
    if first:
        ops = [op.name for op in read_model(model).ops]
        cfg['train'] = f'last:{len(ops) - ops.index(first)}'
    print(f'== prepare {os.path.relpath(model)} with {os.path.relpath(data)}')
    s = prepare(model, out, data=data, test_split=0.2, epochs=epochs, **cfg)
    r = s['rewrites']
    if s['rewritten']:
        print(f'   rewritten for training: {r["transposes"]} layout transpose rewrites, '
              f'{r["batchnorm"]} BatchNorm ops folded; trains '
              + ', '.join(s['trainable']))
    print(f'== train on the simulated {a.board} board ({"CPython" if a.python else "unix MicroPython"})')
    code, text = run(out, board=a.board, python=a.python)
    if code:
        return code
    exported = os.path.join(out, f'digits_{a.model}_trained.circle')
    export(model, os.path.join(out, 'trained.wof'), exported)
    print(f'== exported {exported}')
    x, y = ds.read_dataset(os.path.join(out, 'test.ds'))
    try:
        import onert
    except ImportError:
        return 0
    g = read_model(exported)
    shape = [1] + list(g.tensors[g.inputs[0]].shape[1:])
    sess = onert.infer.session(exported)
    hits = sum(int(np.argmax(sess.infer([x[i].reshape(shape)])[0])) == int(y[i, 0])
               for i in range(len(x)))
    print(f'exported model under ONERT inference: test accuracy {hits / len(x):.4f} '
          f'({hits}/{len(x)})')
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog='python -m host_tools',
                                description='utrain host tools: prepare circle/tflite models '
                                            'for training on MicroPython boards.')
    sub = p.add_subparsers(dest='cmd', required=True)
    q = sub.add_parser('inspect', help='list ops, tensors, parameters and what can train')
    q.add_argument('model')
    q.set_defaults(fn=cmd_inspect)

    q = sub.add_parser('prepare', help='write the flattened model, .wof, settings and data')
    q.add_argument('model')
    q.add_argument('-o', '--out', required=True, help='output folder')
    q.add_argument('--data', help='.npz with arrays x and y')
    q.add_argument('--test-split', type=float, default=0.0, help='fraction held out for test')
    q.add_argument('--split-seed', type=int, default=0)
    q.add_argument('--loss', choices=['mse', 'mae', 'cce', 'scce', 'bce'])
    q.add_argument('--reduction', choices=['mean', 'sum'])
    q.add_argument('--from-logits', action='store_true', default=None)
    q.add_argument('--optimizer', choices=['sgd', 'adam', 'rmsprop'])
    q.add_argument('--lr', type=float)
    q.add_argument('--momentum', type=float, help='SGD momentum')
    q.add_argument('--beta1', type=float)
    q.add_argument('--beta2', type=float)
    q.add_argument('--eps', type=float)
    q.add_argument('--rho', type=float, help='RMSProp decay')
    q.add_argument('--batch', type=int, help='samples whose gradients sum into one update')
    q.add_argument('--epochs', type=int)
    q.add_argument('--metric', choices=['accuracy', 'mae'])
    q.add_argument('--shuffle', action='store_true', default=None, help='seeded shuffle per epoch')
    q.add_argument('--seed', type=int)
    q.add_argument('--train', help='all | none | last:N (ONERT num_of_trainable_ops)')
    q.add_argument('--dtype', choices=['float32', 'uint8', 'int8'], default='float32',
                   help='how samples are stored in train.ds/test.ds (uint8/int8: 1/4 the flash)')
    q.add_argument('--board', help='a boards/boards.json profile: its batch and stream_frozen are '
                   'the defaults, its heap and heap_budget the heap budget')
    q.add_argument('--progress', type=int, help='print a progress line every N samples '
                   '(default: about 4 per epoch; 0: none)')
    q.add_argument('--ranks', help='sparse update, OP:RANK,... with RANK all | bias | 1/2 | '
                   '1/4 | 1/8 | up | low (output channels) and OP an op index or last:N')
    q.add_argument('--train-config', help="onert-micro training-config file: its ops train "
                   'with its ranks, the others are frozen')
    q.add_argument('--cache', dest='cache', action='store_const', const=True, default=False,
                   help='compute the frozen layers below the first trained one once per sample '
                        '(first epoch) into a cache file beside the dataset, not every epoch')
    q.add_argument('--cache-on-host', dest='cache', action='store_const', const='host',
                   help='compute that cache here, for the datasets prepare writes: the board '
                        'trains without running (or holding) the frozen layers')
    q.add_argument('--bands', type=int, metavar='ROWS',
                   help='compute the frozen high-resolution layers ROWS output rows at a time '
                        '(row bands, docs/memory.md; default: 1 where that lowers the heap '
                        'plan and, with --board or --budget, only when the plan does not fit '
                        'without them: they cost time; 0: never)')
    q.add_argument('--select', choices=['auto', 'board'],
                   help='choose what trains within --budget/--board: auto (short trials on '
                        '--data, the host picks) or board (the board picks by Fisher potential '
                        'from its own samples, among configurations the host short-listed on '
                        '--data when given); writes the ranks and train.tcfg')
    q.add_argument('--select-layers', type=int,
                   help='--select board without host priors: layers the board trains besides '
                        'the classifier, its best by TinyTrain\'s score')
    q.add_argument('--stream', action='store_true', default=None,
                   help='leave frozen weights in the model file, read per op (saves heap)')
    q.add_argument('--budget', help='heap budget, e.g. 96K: refuse a run the planner says '
                   'will not fit, and say what would')
    q.add_argument('--backend', choices=['fallback', 'ulab', 'fallback-frozen', 'ulab-frozen'],
                   default='fallback',
                   help='what the board runs, for the heap plan: utrain\'s pure-MicroPython '
                        'arrays or ulab; -frozen: utrain frozen into the firmware '
                        '(boards/freeze.md), its code off the heap')
    q.add_argument('--no-rewrite', action='store_true',
                   help='train the graph as the file has it (no transpose cancelling, '
                        'BatchNorm folding or dequantizing)')
    q.add_argument('--dequantize', action='store_true',
                   help='an int8 model: train it in float32, dequantized (by default it '
                        'trains as int8: int8 weights, integer forward, QAS updates)')
    q.set_defaults(fn=cmd_prepare)

    q = sub.add_parser('run', help='train a prepared folder on the simulated board')
    q.add_argument('dir')
    q.add_argument('--board', default='unix', help='a profile in boards/boards.json: '
                   'unix, esp32, esp32-psram, esp32s3, rp2040, rp2350 (heap size)')
    q.add_argument('--python', action='store_true', help='CPython + numpy instead of MicroPython')
    q.add_argument('--source', action='store_true', help='run micro/ as .py, not .mpy')
    q.set_defaults(fn=cmd_run)

    q = sub.add_parser('export', help='merge trained .wof (or .ckpt) weights into a circle model')
    q.add_argument('model')
    q.add_argument('weights')
    q.add_argument('-o', '--output', required=True)
    q.add_argument('--quantized', action='store_true',
                   help='quantize the trained weights with the original model\'s scales')
    q.set_defaults(fn=cmd_export)

    q = sub.add_parser('dataset', help='convert .npz, .csv or an image folder to .ds record files')
    q.add_argument('source', help='x/y .npz, a .csv (label in the last column), or a folder '
                                  'with one sub-folder of images per class')
    q.add_argument('-o', '--out', required=True, help='output folder for train.ds, test.ds')
    q.add_argument('--dtype', choices=['float32', 'uint8', 'int8'], default='uint8')
    q.add_argument('--test-split', type=float, default=0.2)
    q.add_argument('--split-seed', type=int, default=0)
    q.add_argument('--label', choices=['first', 'last'], default='last', help='CSV label column')
    q.add_argument('--size', help='images: resize to WxH')
    q.set_defaults(fn=cmd_dataset)

    for name, hlp in (('deploy', 'copy micro/ and a prepared folder to a board with mpremote'),
                      ('pull', 'copy trained.wof, the checkpoint and train.log back from a board')):
        q = sub.add_parser(name, help=hlp)
        q.add_argument('dir')
        q.add_argument('--port', required=True, help='serial port (/dev/ttyACM0, COM3) or an '
                                                     'mpremote shortcut (a0, u0)')
        q.add_argument('--resume', action='store_true',
                       help='no soft reset first (unix MicroPython behind a pty)')
        if name == 'deploy':
            q.add_argument('--board', help='profile in boards/boards.json: checks flash space')
            q.add_argument('--source', action='store_true', help='copy .py, not .mpy')
            q.add_argument('--run', action='store_true', help='then mpremote run train.py')
        q.set_defaults(fn=cmd_deploy if name == 'deploy' else cmd_pull)

    q = sub.add_parser('fleet', help='federated training of a fleet of boards on Flower')
    q.add_argument('dir', help='a prepared folder (prepare --data --test-split): model, '
                   'starting weights, local training settings, the host\'s test split')
    q.add_argument('--boards', type=int, help='simulated boards (unix MicroPython on a pty), '
                   'each with its own shard of the folder\'s training data')
    q.add_argument('--ports', help='real boards P1,P2,... each training on the data it holds')
    q.add_argument('--resume', action='store_true',
                   help='--ports: no soft reset first (unix MicroPython behind a pty)')
    q.add_argument('--rounds', type=int, default=3, help='rounds in all (a rerun resumes '
                   'after the last saved round)')
    q.add_argument('--split', default='iid', help='simulated boards: iid | by-class | '
                   'dirichlet:A')
    q.add_argument('--seed', type=int, default=0, help='seed of the split')
    q.add_argument('--epochs', type=int, help='local epochs per round (default: train.json)')
    q.add_argument('--strategy', default='fedavg', help='Flower strategy: fedavg (weighted '
                   'by samples), fedavgm, fedadam, fedyogi, fedadagrad, fedmedian, fedtrimmedavg')
    q.add_argument('--timeout', type=float, default=600.0,
                   help='seconds a board has per round before it is left out of it')
    q.add_argument('--test', help='the host\'s test .ds for the global model (default: the '
                   'folder\'s test split)')
    q.add_argument('--board', default='rp2040', help='simulated boards\' heap profile')
    q.add_argument('--python', action='store_true',
                   help='simulated boards run the micro/ code under CPython + numpy')
    q.add_argument('-o', '--out', help='fleet folder (default DIR/fleet): global.wof, '
                   'fleet.csv, fleet.json')
    q.set_defaults(fn=cmd_fleet)

    q = sub.add_parser('plot', help='loss and metric per epoch from train.log as a PNG')
    q.add_argument('log')
    q.add_argument('-o', '--output', default='curves.png')
    q.set_defaults(fn=cmd_plot)

    q = sub.add_parser('demo', help='a bundled digits example: prepare, train, export')
    q.add_argument('--model', choices=sorted(DEMOS), default='mlp',
                   help='mlp: the MLP from scratch; cnn: a PyTorch CNN (via tico) fine-tuned')
    q.add_argument('--out', help='folder (default build/digits or build/digits_cnn)')
    q.add_argument('--board', default='rp2040')
    q.add_argument('--epochs', type=int, help='default 5 (mlp), 2 (cnn)')
    q.add_argument('--python', action='store_true')
    q.set_defaults(fn=cmd_demo)

    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        from .validate import os_error_text
        print(f'error: {os_error_text(e) if isinstance(e, OSError) else e}', file=sys.stderr)
        return 2
