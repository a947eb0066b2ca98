"""utrain (or python -m host_tools) {inspect,prepare,run,export,demo,dataset,deploy,pull,plot,fleet,
evaluate,board} ..."""
from __future__ import annotations

import argparse
import os
import signal
import sys

import numpy as np

from .paths import DIGITS


def _board(text):
    """--board's argparse type: the boards.json profile named (any case, or a board's
    name for it: pico), else the error naming the known ones."""
    from .target.runner import board_name
    try:
        return board_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _status(op, g):
    from .graph.optable import SPECS
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
    from .formats.circle_io import read_model
    from .graph.optable import SPECS, SUPPORTED
    from .plan.runplan import select_rewrite
    from .files.validate import runnable
    g = read_model(a.model)
    runnable(g)     # (the rewrite passes below index what it names: an IndexError had escaped)
    print(f'{a.model}: {g.identifier.decode()} v{g.version}, {len(g.ops)} ops, '
          f'{len(g.tensors)} tensors, inputs {list(g.inputs)}, outputs {list(g.outputs)}')
    if g.description:
        print(f'description: {g.description}')
    if g.metadata:
        print(f'metadata: {", ".join(g.metadata)}')
    from .graph.inout import choose_output, join_ops, needed
    from .prepare.pipeline import dropped_outputs
    for line in dropped_outputs(a.model, g):
        print(line.replace(f'{a.model}: ', '', 1))
    note = choose_output(g)      # (several outputs: the one prepare trains by default)
    if note:
        print(note.replace(f'{a.model}: ', '', 1))
    # what prepare's rewrite pass makes of it: training everything (BatchNorm kept) ...
    h, _, _, info, perm = select_rewrite(g, 'all')
    joins = join_ops(h)          # (several inputs: joined into one)
    kept = {op.number for op in h.ops if id(op) not in joins}
    other = ({op.number for op in g.ops} - {op.number for op in needed(g)[0]}
             if len(g.outputs) > 1 else set())
    # ... and with frozen layers (BatchNorm folded)
    f, _, _, finfo, _ = select_rewrite(g, 'none')
    folded = finfo['batchnorm']
    fkept = {op.number for op in f.ops}
    print('\nops (as in the file; --train last:N counts these):')
    now = {}                    # the file's op number -> the ops prepare makes of it
    for op in h.ops:
        if id(op) not in joins:
            now.setdefault(op.number, []).append(op)
    for op in g.ops:
        how = _status(op, g) if op.number in kept else \
            'only the other outputs need it: not in the run' if op.number in other else \
            'removed by prepare'
        made = now.get(op.number, [])
        if [m.name for m in made] not in ([], [op.name]):      # rewritten
            names = []
            for m in made:
                if m.name not in names:
                    names.append(m.name)
            # (the status of the op that trains: a grouped conv's CONV_2Ds, not its
            # CONCATENATION)
            st = [_status(m, h) for m in made]
            how = f'prepare makes it {" + ".join(names)}: ' + next(
                (t for t in st if t.startswith('trains')), st[-1])
        if op.number in kept and op.number not in fkept:
            how += '; folded into the layer before it when that is frozen'
        print(_op_line(g, op, how))
    if joins:
        print(f'\nits {len(h.data_inputs[0])} inputs are joined into one '
              f'{h.tensors[h.inputs[0]].shape} (SPLIT_V, RESHAPE): --data gives an array per '
              'input, named ' + ', '.join(f'{key} (or x{i}) {sh[1:]}' for i, (_, sh, key)
                                          in zip(h.data_inputs[2], h.data_inputs[0])))
    if info['changed'] or perm or joins:
        print(f'\n{"with --dequantize " if info["dequantized"] else ""}prepare rewrites it: '
              f'{info["dequantized"]} tensors dequantized, '
              f'{info["transposes"]} layout transpose rewrites'
              + (f', input {perm} (the model takes NHWC data)' if perm else '')
              + (f', {folded} BatchNorm MUL/ADD folded into frozen layers' if folded else '')
              + (f', {info["unshared"]} copies of a constant several layers read (each its own)'
                 if info.get('unshared') else ''))
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
    from .prepare.quant import is_int8, float_ends, inspect_lines
    if is_int8(g) or float_ends(g):
        print('\n' + '\n'.join(inspect_lines(g)))
    else:
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
        try:                # (what prepare says of the first it cannot take: what to do)
            from .graph.passes import validate
            h.n_subgraphs = g.n_subgraphs
            validate(h)
        except ValueError as e:
            print(str(e).split(': ', 1)[-1])
        return 1
    return 0


def cmd_prepare(a):
    from .prepare.pipeline import prepare
    # the options' names are prepare()'s keywords: every one passes through as given
    if a.data_file:     # (the data given positionally, as evaluate takes it)
        if a.data and os.path.abspath(a.data) != os.path.abspath(a.data_file):
            print(f'error: two data files, {a.data_file} and --data {a.data}: give one',
                  file=sys.stderr)
            return 2
        a.data = a.data_file
    kw = {k: v for k, v in vars(a).items()
          if k not in ('cmd', 'fn', 'model', 'out', 'no_rewrite', 'data_file')}
    from .prepare.infer import image_pixels
    with image_pixels(a.model, a.data, print):     # (an image folder: the model's pixel values)
        s = prepare(a.model, a.out, rewrite=not a.no_rewrite, **kw)
    st = s['settings']
    if s.get('from_float'):
        print(f'prepared {a.out}: float model training as int8 (calibrated on '
              f'{s["from_float"]["samples"]} samples: int8.circle, q8.json, int8 weights.wof), '
              f'{s["trainable_params"]} trainable parameters; --float32 trains it in float32')
    elif s.get('int8'):
        print(f'prepared {a.out}: int8 model training as int8 (q8.json, int8 weights.wof), '
              f'{s["trainable_params"]} trainable parameters; --dequantize trains it in float')
    if s.get('int8'):
        print('  trains: ' + ', '.join(f'{k} {v}' for k, v in s['trainable'].items()))
        if s.get('ranks'):
            print('  sparse update (output channels lo:hi whose weights train; 0:0 the bias '
                  'alone): ' + ', '.join(f'{k} {lo}:{hi}' for k, (lo, hi) in s['ranks'].items()))
        print(f'  {st["loss"]}, {st["optimizer"]} lr {st["lr"]:g}, {st["epochs"]} epochs')
        if 'train_samples' in s:
            print(f'  data: {s["train_samples"]} train, {s["test_samples"]} test samples '
                  'stored as int8 at ' + ('each input\'s own scale (joined)' if s.get('inputs')
                                          else 'the model input\'s scale')
                  + (', in a seeded shuffle (they came sorted by class)' if s.get('shuffled')
                     else ''))
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
              f'stored as {s["dtype"]}' + (', in a seeded shuffle (they came sorted by class: '
                                          'trained in that order, each class in a block, the '
                                          'earlier ones are forgotten)' if s.get('shuffled') else ''))
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
              + ('' if a.dequantize or s.get('dequantized_because') else
                 '; as int8 it trains with --train, --ranks and --select, without --train-config'))
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
    if h.get('over_boards'):    # (plans_by_target: each board's plan against its limit)
        print('  over the heap of: ' + ', '.join(f'{b} ({p // 1024} KB planned, {lim // 1024} KB)'
                                                 for b, (p, lim) in sorted(h['over_boards'].items())))


def cmd_run(a):
    if a.emulate:
        from .boards.pico import run_folder
        from .target.runner import size_bytes
        try:
            size_bytes(a.heap or 0)
        except ValueError:
            raise ValueError(f'--heap {a.heap!r}: expected a size in bytes, e.g. 120K') from None
        if a.board not in ('unix', 'rp2040') or a.python or a.source:
            raise SystemExit('run --emulate: the emulated board is an RP2040 (a Raspberry Pi '
                             'Pico) running .mpy code; drop --board/--python/--source')
        code, text = run_folder(a.dir, ulab=a.ulab, heap=a.heap)
    else:
        given = [f for f, v in (('--heap', a.heap), ('--ulab', a.ulab)) if v]
        if given:       # (left unread: a run at --board's heap, without ulab, unsaid)
            raise ValueError(f'run {" ".join(given)}: only with --emulate (the emulated Pico); '
                             'without it the run is on the simulated board of --board\'s '
                             'profile (boards/boards.json): add --emulate, or leave '
                             f'{" and ".join(given)} out')
        from .target.runner import run
        code, text = run(a.dir, board=a.board, python=a.python, source=a.source)
    from .target.runner import end_advice, STOPPED
    if code == STOPPED and not a.emulate:
        on = 'go on from there' if 'again to go on' in text else 'start over' \
            if 'again to start over' in text else None
        print(f'stopped before the run\'s end (exit code {STOPPED})'
              + (f': `run {a.dir}` again to {on}' if on else ''), file=sys.stderr)
        return code
    advice = end_advice(a.dir, text) if code else None
    if advice:
        print(advice, file=sys.stderr)
    return code


def cmd_export(a):
    from .prepare.pipeline import export
    if a.out_file:      # (the file to write given positionally, as a new user tries first)
        if a.output and os.path.abspath(a.output) != os.path.abspath(a.out_file):
            print(f'error: two files to write, {a.out_file} and -o {a.output}: give one',
                  file=sys.stderr)
            return 2
        a.output = a.out_file
    if not a.output:
        print(f'error: export {a.model} {a.weights}: give the model file to write, e.g. '
              f'-o trained{os.path.splitext(a.model)[1] or ".circle"}', file=sys.stderr)
        return 2
    try:
        r = export(a.model, a.weights, a.output, quantized=a.quantized, data=a.data)
    except ValueError as e:
        raise ValueError(str(e) + _prepared_from(a.model, a.weights)) from None
    print(f'wrote {a.output}: {r["tensors"]} tensors from {a.weights} into {r["model"]}'
          + (f' (re-quantized; {r["clipped"]} values clipped to the type range)'
             if a.quantized and not r.get('int8') else '')
          + (' (int8, as trained)' if r.get('int8') else '')
          + (' (float32, dequantized from its int8 training)' if r.get('dequantized_from_int8')
             else ''))
    notes = r.get('notes')
    print('\n'.join(notes) if notes else '', end='\n' if notes else '')
    other = _other_model(a)
    if other:
        print(f'warning: {other}', file=sys.stderr)
    return 0


def _prepared_source(weights):
    """The model file the weights' folder was prepared from (its prepare.json's model), or
    None."""
    import json
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(weights)), 'prepare.json')) as f:
            src = json.load(f).get('model')
    except (OSError, ValueError, AttributeError):
        return None
    return src if isinstance(src, str) else None


def _prepared_from(model, weights) -> str:
    """export's refusal when the weights' folder was prepared from another model file
    (its prepare.json's model): which one (a float model given an int8 run's weights was
    told 'int8 training needs int8 activations')."""
    src = _prepared_source(weights)
    if src is None:
        return ''
    import filecmp
    # (a copy of that file, the folders moved or copied elsewhere, had been called another
    # model: 'export into that model', of the model given)
    same = (os.path.samefile(src, model) or filecmp.cmp(src, model, shallow=False)) \
        if os.path.isfile(src) and os.path.isfile(model) \
        else os.path.basename(src) == os.path.basename(model)
    return '' if same else (f'\n  {weights} was trained in a folder prepared from {src}, not '
                            f'{model}: export into that model')


def _other_model(a) -> str | None:
    """export's warning when it wrote the weights into a model file other than (and not a
    copy of) the one their folder was prepared from: the weights the run did not train
    are that file's.  (Another model of the same shapes had been written into, unsaid.)"""
    import filecmp
    src = _prepared_source(a.weights)
    if src is None or not (os.path.isfile(src) and os.path.isfile(a.model)) or \
            filecmp.cmp(src, a.model, shallow=False):
        return None
    return (f'{a.weights} was trained in a folder prepared from {src}, a file that differs '
            f'from {a.model}: {a.output} holds {a.model}\'s weights where the run trained '
            f'none; export into {src} unless that is what you meant')


def cmd_dataset(a):
    """Convert .npz / .csv / image folders to train.ds and test.ds."""
    from .files import dataset as ds
    from .prepare.runfolder import check_outputs, PrepareError
    # (-o the folder of the .ds it reads, a run's: its train.ds had been written over with
    # a re-split copy of itself; -o in an image folder: a class of its own next time)
    check_outputs(a.out, [None, a.source], names=('train.ds', 'test.ds'), cmd='dataset')
    if any(os.path.isfile(os.path.join(a.out, n)) for n in ('model.flat', 'q8.json')):
        # (a run's samples had been replaced, unsaid, by ones of another scale or width,
        # without the input scaling prepare folds into them)
        raise PrepareError(f'{a.out}: a run folder (prepare wrote it): its train.ds and test.ds '
                           'are the samples its model was prepared on; to train it on these, '
                           f'prepare it again with them (prepare MODEL {a.source} -o {a.out}), or '
                           'give dataset -o another folder')
    from .files.validate import check_settings
    # (--split-seed -1 had been numpy's 'expected non-negative integer', naming no option)
    check_settings({'split_seed': a.split_seed})
    size = _pixels(a.size)
    for line in _unread_data_options(a, a.source):
        print(f'warning: {line}', file=sys.stderr)
    d = ds.samples(a.source, a.out, 0.2 if a.test_split is None else a.test_split, a.split_seed,
                   a.dtype, label=a.label, size=size, given=a.test_split is not None)
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
    from .boards.board import deploy
    deploy(a.dir, a.port, board=a.board, source=a.source, run=a.run, resume=a.resume)
    return 0


def cmd_pull(a):
    from .boards.board import pull
    pull(a.dir, a.port, resume=a.resume)
    return 0


def cmd_fleet(a):
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise RuntimeError('fleet runs on Flower: pip install flwr (the version in '
                           'requirements.txt)') from None
    from .boards.fleet import fleet, FleetError
    ports = [p for p in a.ports.split(',') if p] if a.ports else None
    if not ports and not a.boards:
        raise ValueError('fleet: give --boards N (simulated boards) or --ports P1,P2,...')
    if ports and a.boards:          # (the ports had been taken, --boards dropped unsaid)
        raise ValueError('fleet: give --boards N (simulated boards) or --ports P1,P2,... (real '
                         'boards), not both')
    if a.resume and not ports:
        raise ValueError('fleet --resume: for --ports (boards not soft-reset first); '
                         'simulated boards (--boards) start as set up: leave --resume out')
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
    notes = []
    # (beside the log it draws: the working folder's curves.png had been written over by
    # the plot of whichever run came last, and one had come into the repository)
    out = plot(a.log, a.output or os.path.join(os.path.dirname(a.log), 'curves.png'), notes)
    for n in notes:
        print(n, file=sys.stderr)
    print(f'wrote {out}')
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
    from .target.runner import run
    from .prepare.pipeline import prepare, export
    from .formats.circle_io import read_model
    from .files import dataset as ds
    cfg = dict(DEMOS[a.model])
    model = os.path.join(DIGITS, cfg.pop('model'))
    data = os.path.join(DIGITS, 'digits.npz')
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
    try:
        import onert  # noqa: F401
    except ImportError:
        return 0
    from .prepare.infer import evaluate
    r = evaluate(exported, os.path.join(out, 'test.ds'))
    print(f'exported model under ONERT inference: test accuracy {r["accuracy"]:.4f} '
          f'({r["hits"]}/{r["n"]})')
    return 0


def cmd_board(a):
    """A simulated serial board until Ctrl-C, or (--check PORT) a real board's facts."""
    if a.check:
        from .boards.board import check, check_report
        print(f'{a.check}:')
        for line in check_report(check(a.check, resume=a.resume)):
            print('  ' + line)
        return 0
    import signal
    import time
    from .boards.simboard import start

    def stop(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)     # `kill`, or a script's SIGINT-less background job
    signal.signal(signal.SIGINT, stop)      # Ctrl-C, even where the shell started it ignoring it
    b = start(a.board, emulate=a.emulate, flash=a.flash, ulab=a.ulab)
    flash = a.flash or getattr(b, 'flash', None)

    def say():
        print(f'simulated {a.board} board on {b.port}' + (f' (its flash: {flash})' if flash else ''))
        print(f'  {_prog()} deploy DIR --port {b.port} --resume --run     '
              f'(then: {_prog()} pull DIR --port {b.port} --resume)')
        print('  --resume: no soft reset, which would end unix MicroPython; Ctrl-C stops the board',
              flush=True)
    say()
    try:
        while True:
            time.sleep(0.5)
            if not getattr(b, 'alive', lambda: True)():
                b.close()
                print('the board stopped (a soft reset ends unix MicroPython: give mpremote '
                      '`resume`, deploy and pull --resume); powered on again, same flash',
                      flush=True)
                b = start(a.board, emulate=a.emulate, flash=flash, ulab=a.ulab)
                say()
    except KeyboardInterrupt:
        b.close()
        print('board stopped')
    return 0


def _pixels(size):
    """--size WxH as (w, h), None when not given; ValueError naming --size."""
    if not size:
        return None
    try:
        w, h = (int(v) for v in size.lower().split('x'))
        if w > 0 and h > 0:
            return w, h
    except ValueError:
        pass
    raise ValueError(f'--size {size!r}: expected WxH in pixels, e.g. 32x32')


def _unread_data_options(a, data):
    """Lines saying which of --label (a .csv's) and --size (an image folder's) the data
    does not read: `evaluate x.npz --label first` and `dataset x.npz --size 8x8` had been
    taken without a word, the data read as if they had not been given."""
    out = []
    csv = str(data).lower().endswith('.csv')
    if a.label == 'first' and not csv:
        out.append(f'{data}: --label first: the label column of a .csv; this data is not one '
                   '(an .npz\'s labels are its array y, a .ds holds them apart): leave it out')
    if a.size and not os.path.isdir(data):
        out.append(f'{data}: --size: the size the images of a folder of class folders are '
                   'resized to; this data is no such folder: leave it out')
    return out


def cmd_evaluate(a):
    """Score a model file on labelled data, on the host (before/after training)."""
    from .prepare.infer import evaluate, describe, image_pixels
    if a.limit is not None and a.limit < 1:     # (-1 scored all but the last, 0 all)
        raise ValueError(f'--limit {a.limit}: score at least 1 sample (leave it out for all)')
    for line in _unread_data_options(a, a.data):
        print(f'warning: {line}', file=sys.stderr)
    with image_pixels(a.model, a.data, lambda m: print(m, file=sys.stderr)):
        r = evaluate(a.model, a.data, nchw=a.nchw, metric=a.metric, label=a.label,
                     size=_pixels(a.size), limit=a.limit, output=a.output)
    if r.get('warning'):
        print(r['warning'], file=sys.stderr)
    print(f'{a.model} on {a.data}: {describe(r)}')
    return 0


def _prog():
    """How the user called the tool: `utrain` (the installed command) or `python -m host_tools`."""
    return 'utrain' if os.path.basename(sys.argv[0] or '') == 'utrain' else 'python -m host_tools'


def _args_inspect(sub):
    """`inspect`'s arguments."""
    q = sub.add_parser('inspect', help='list ops, tensors, parameters and what can train')
    q.add_argument('model', help='.circle, .tflite or .onnx file')
    q.set_defaults(fn=cmd_inspect)


def _args_prepare(sub):
    """`prepare`'s arguments."""
    q = sub.add_parser('prepare', help='write the flattened model, .wof, settings and data',
                       description='Settings the command line leaves out come from the model\'s '
                                   'CIRCLE_TRAINING metadata when it has some.')
    q.add_argument('model', help='float32 (or int8) .circle or .tflite file, or an .onnx '
                   'file (docs/onnx.md)')
    q.add_argument('data_file', nargs='?', metavar='DATA',
                   help='the data, as --data takes it (`prepare MODEL DATA -o OUT` as '
                        '`evaluate MODEL DATA`)')
    q.add_argument('-o', '--out', required=True, help='output folder')
    q.add_argument('--data', help='.npz (arrays x and y: class labels or target vectors), .csv '
                   '(one sample a row, the label in the last column; several targets: the '
                   'columns after the input\'s values), a folder with one '
                   'sub-folder of images per class, or a .ds record file; a model with '
                   'several inputs: an .npz with y and an array per input, named after it '
                   '(Keras\'s Input name) or x0, x1, ... in the model\'s order')
    q.add_argument('--output', metavar='NAME|INDEX',
                   help='a model with several outputs: the one the loss reads (default: the '
                        'first, in Keras\'s order, whose size the data\'s targets fit; the ops '
                        'only the others need are left out of the run, export keeps them)')
    q.add_argument('--test-split', type=number, default=0.0, help='fraction held out for test')
    q.add_argument('--split-seed', type=whole, default=0, help='seed of the test split\'s draw')
    _args_settings(q)
    _args_what_and_where(q)
    q.set_defaults(fn=cmd_prepare)


def _args_settings(q):
    """prepare's training settings: loss, optimizer and its recipe, batch, epochs, metric,
    shuffle."""
    q.add_argument('--loss', choices=['mse', 'mae', 'cce', 'scce', 'bce'],
                   help='default: the model\'s training metadata, else scce when --data holds one '
                        'class number per sample for a model with several outputs, cce when it holds '
                        'one-hot rows (one value per output) or a class a step (N, T) for a '
                        'model whose output is a softmax row a step (T x C; metric mae, evaluate '
                        'counts the steps), bce when it holds 0s and 1s for a '
                        'model ending in a sigmoid, else mse (an int8 model trains as int8 with '
                        'scce, cce, mse, mae or bce: a final sigmoid its loss\'s). '
                        'cce and scce without --from-logits expect probabilities (a model ending '
                        'in SOFTMAX), bce one ending in LOGISTIC; on a model that ends otherwise '
                        '(e.g. PyTorch through tico) prepare says so and trains from logits')
    q.add_argument('--reduction', choices=['mean', 'sum'], help='of the loss over a sample\'s '
                   'outputs (ONERT\'s loss reduction)')
    q.add_argument('--from-logits', action='store_true', default=None,
                   help='the model outputs logits, not probabilities (cce, scce, bce)')
    q.add_argument('--optimizer', choices=['sgd', 'adam', 'rmsprop', 'adamw'],
                   help='sgd (--momentum), adam (TensorFlow/ONERT form: --beta1, --beta2, --eps), '
                        'rmsprop (--rho, --eps) or adamw (PyTorch\'s AdamW)')
    q.add_argument('--weight-decay', type=number, help="adamw: decoupled; sgd, adam, rmsprop: "
                   "L2 added to the gradient (PyTorch's weight_decay)")
    q.add_argument('--schedule', help='learning rate: constant | linear | step | cosine, then '
                   ',warmup=N ,steps=N ,step_size=N ,gamma=F ,min_lr=F (docs/training.md)')
    q.add_argument('--lr', type=number, help='learning rate (default: the model\'s training '
                   'metadata, else 0.01, with SGD at batch B 0.01 x B: 0.01 a sample; with samples, '
                   'a short host probe may step it down or up and says so: docs/training.md)')
    q.add_argument('--momentum', type=number, help='SGD momentum')
    q.add_argument('--beta1', type=number, help='Adam')
    q.add_argument('--beta2', type=number, help='Adam')
    q.add_argument('--eps', type=number, help='Adam, RMSProp')
    q.add_argument('--rho', type=number, help='RMSProp decay')
    q.add_argument('--batch', type=whole, help='samples whose gradients sum into one update (a last '
                   'incomplete batch updates with the mean over the samples it has, where ONERT '
                   'pads it by repeating them)')
    q.add_argument('--epochs', type=whole, help='epochs to train (default: the model\'s '
                   'training metadata, else enough to see about 1000 samples, 1 to 10)')
    q.add_argument('--metric', choices=['accuracy', 'mae'],
                   help='printed and logged per epoch; default: accuracy for cce, scce and bce '
                        'on one output, else mae (bce on several outputs is multi-label)')
    q.add_argument('--shuffle', action='store_true', default=None, help='seeded shuffle per epoch')
    q.add_argument('--seed', type=whole, help='seed of --shuffle (reproducible; file order without it)')


def _args_what_and_where(q):
    """prepare's choice of what trains, how samples are stored, and the board and its
    memory (budget, streaming, caches, bands, --select, the backend, rewrites)."""
    q.add_argument('--train', help='all | none | last:N (ONERT\'s num_of_trainable_ops: the last N '
                   'operators of any kind, counted in the file as given)')
    q.add_argument('--dtype', choices=['float32', 'uint8', 'int8'],
                   help='how samples are stored in train.ds/test.ds (uint8/int8: 1/4 the flash; '
                   'default float32, with --board uint8 where float32 overflows its file system)')
    q.add_argument('--board', type=_board, help='a boards/boards.json profile: its batch and stream_frozen are '
                   'the defaults, its heap and heap_budget the heap budget')
    q.add_argument('--progress', type=whole, help='print a progress line every N samples '
                   '(default: about 4 per epoch; 0: none)')
    q.add_argument('--ranks', help='sparse update, OP:RANK,... with RANK all | bias | 1/2 | '
                   '1/4 | 1/8 | up | low (output channels) and OP an op index or last:N '
                   '(an int8 model trains them as int8: docs/int8.md)')
    q.add_argument('--train-config', help="onert-micro training-config file: its ops train "
                   'with its ranks, the others are frozen')
    q.add_argument('--cache', dest='cache', action='store_const', const=True, default=False,
                   help='compute the frozen layers below the first trained one once per sample '
                        '(first epoch) into a cache file beside the dataset, not every epoch')
    q.add_argument('--cache-on-host', dest='cache', action='store_const', const='host',
                   help='compute that cache here, for the datasets prepare writes: the board '
                        'trains without running (or holding) the frozen layers')
    q.add_argument('--bands', type=whole, metavar='ROWS',
                   help='compute the frozen high-resolution layers ROWS output rows at a time '
                        '(row bands, docs/memory.md; default: 1 where that lowers the heap '
                        'plan and, with --board or --budget, only when the plan does not fit '
                        'without them: they cost time; 0: never)')
    q.add_argument('--select', choices=['auto', 'board'],
                   help='choose what trains within --budget/--board: auto (short trials on '
                        '--data, the host picks) or board (the board picks by Fisher potential '
                        'from its own samples, among configurations the host short-listed on '
                        '--data when given); writes the ranks and train.tcfg.  An int8 model: '
                        'auto chooses as int8 (int8 trials and plans)')
    q.add_argument('--select-layers', type=whole,
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
    q8 = q.add_mutually_exclusive_group()     # (both: which did the user mean?)
    q8.add_argument('--int8', dest='int8', action='store_const', const=True, default=None,
                   help='a float model: train an int8 version calibrated on --data in integers '
                        '(integer forward, QAS updates; export writes float32 again, or int8 '
                        'with --quantized); prepare chooses it itself for a --board without '
                        'ulab (--backend fallback) where the settings allow (docs/int8.md)')
    q8.add_argument('--float32', dest='int8', action='store_const', const=False,
                   help='a float model: keep float32 training where prepare would choose --int8')


def _args_run(sub):
    """`run`'s arguments."""
    q = sub.add_parser('run', help='train a prepared folder on the simulated board')
    q.add_argument('dir', help='a folder prepare wrote')
    q.add_argument('--board', type=_board, default='unix', help='a profile in boards/boards.json: '
                   'unix, esp32, esp32-psram, esp32s3, rp2040, rp2350 (heap size)')
    q.add_argument('--python', action='store_true', help='CPython + numpy instead of MicroPython')
    q.add_argument('--source', action='store_true', help='run micro/ as .py, not .mpy')
    q.add_argument('--emulate', action='store_true',
                   help='train on an emulated Raspberry Pi Pico: the real MicroPython rp2 '
                        'firmware ($UTRAIN_PICO_FIRMWARE) in rp2040js, times in RP2040 cycles')
    q.add_argument('--ulab', action='store_true',
                   help='with --emulate: the firmware with ulab ($UTRAIN_PICO_ULAB_FIRMWARE)')
    q.add_argument('--heap', help='with --emulate: leave only this much heap free (e.g. 120K) '
                                  'with a ballast, to find the smallest heap that trains')
    q.set_defaults(fn=cmd_run)


def _args_export(sub):
    """`export`'s arguments."""
    q = sub.add_parser('export', help='merge trained .wof (or .ckpt) weights into the model (circle, tflite or onnx)')
    q.add_argument('model', help='the model given to prepare')
    q.add_argument('weights', help='trained.wof, checkpoint.ckpt or a fleet\'s global.wof')
    q.add_argument('out_file', nargs='?', metavar='OUT', help='the model file to write (or -o)')
    q.add_argument('-o', '--output',
                   help='the model file to write: .circle writes a circle file, .tflite a TFLite '
                   'one (the file identifier), .onnx (from an .onnx model) the ONNX graph')
    q.add_argument('--quantized', action='store_true',
                   help='an int8 model trained with --dequantize: the trained weights quantized '
                   'again into a copy of the original int8 model; a float model trained as int8 '
                   '(prepare --int8): the int8 model prepare calibrated, with the trained weights')
    q.add_argument('--data', help='with --quantized: samples (as prepare --data takes) on which '
                   'to recalibrate the activation scales and measure the int8 export against the '
                   'float weights it came from (the better of original and recalibrated is kept)')
    q.set_defaults(fn=cmd_export)


def _args_dataset(sub):
    """`dataset`'s arguments."""
    q = sub.add_parser('dataset', help='convert .npz, .csv or an image folder to .ds record files')
    q.add_argument('source', help='x/y .npz, a .csv (label in the last column), or a folder '
                                  'with one sub-folder of images per class')
    q.add_argument('-o', '--out', required=True, help='output folder for train.ds, test.ds')
    q.add_argument('--dtype', choices=['float32', 'uint8', 'int8'], default='uint8',
                   help='how samples are stored (value = q * scale + offset, from the header)')
    q.add_argument('--test-split', type=number, help='fraction held out for test (default 0.2)')
    q.add_argument('--split-seed', type=whole, default=0, help='seed of the test split\'s draw')
    q.add_argument('--label', choices=['first', 'last'], default='last', help='CSV label column')
    q.add_argument('--size', help='images: resize to WxH')
    q.set_defaults(fn=cmd_dataset)


def _args_deploy_pull(sub):
    """deploy and pull: copy to and from a board."""
    for name, hlp in (('deploy', 'copy micro/ and a prepared folder to a board with mpremote'),
                      ('pull', 'copy trained.wof, the checkpoint and train.log back from a board')):
        q = sub.add_parser(name, help=hlp)
        q.add_argument('dir', help='the prepared folder')
        q.add_argument('--port', required=True, help='serial port (/dev/ttyACM0, COM3) or an '
                                                     'mpremote shortcut (a0, u0)')
        q.add_argument('--resume', action='store_true',
                       help='no soft reset first (unix MicroPython behind a pty)')
        if name == 'deploy':
            q.add_argument('--board', type=_board, help='profile in boards/boards.json: checks flash space')
            q.add_argument('--source', action='store_true', help='copy .py, not .mpy')
            q.add_argument('--run', action='store_true', help='then mpremote run train.py')
        q.set_defaults(fn=cmd_deploy if name == 'deploy' else cmd_pull)


def _args_fleet(sub):
    """`fleet`'s arguments."""
    q = sub.add_parser('fleet', help='federated training of a fleet of boards on Flower')
    q.add_argument('dir', help='a prepared folder (prepare --data --test-split): model, '
                   'starting weights, local training settings, the host\'s test split')
    q.add_argument('--boards', type=whole, help='simulated boards (unix MicroPython on a pty), '
                   'each with its own shard of the folder\'s training data')
    q.add_argument('--ports', help='real boards P1,P2,... each training on the data it holds')
    q.add_argument('--resume', action='store_true',
                   help='--ports: no soft reset first (unix MicroPython behind a pty)')
    q.add_argument('--rounds', type=whole, default=3, help='rounds in all (a rerun resumes '
                   'after the last saved round)')
    q.add_argument('--split', default='iid', help='simulated boards: iid | by-class | '
                   'dirichlet:A')
    q.add_argument('--seed', type=whole, default=0, help='seed of the split')
    q.add_argument('--epochs', type=whole, help='local epochs per round (default: train.json)')
    q.add_argument('--strategy', default='fedavg', help='Flower strategy: fedavg (weighted '
                   'by samples), fedavgm, fedadam, fedyogi, fedadagrad, fedmedian, fedtrimmedavg')
    q.add_argument('--timeout', type=number, default=600.0,
                   help='seconds a board has per round before it is left out of it')
    q.add_argument('--test', help='the host\'s test .ds for the global model (default: the '
                   'folder\'s test split)')
    q.add_argument('--board', type=_board, default='rp2040', help='simulated boards\' heap profile')
    q.add_argument('--python', action='store_true',
                   help='simulated boards run the micro/ code under CPython + numpy')
    q.add_argument('-o', '--out', help='fleet folder (default DIR/fleet): global.wof, '
                   'fleet.csv, fleet.json')
    q.set_defaults(fn=cmd_fleet)


def _args_plot(sub):
    """`plot`'s arguments."""
    q = sub.add_parser('plot', help='loss and metric per epoch from train.log as a PNG')
    q.add_argument('log', help='train.log, or a fleet\'s fleet.csv')
    q.add_argument('-o', '--output', help='the PNG to write (default: curves.png beside the log)')
    q.set_defaults(fn=cmd_plot)


def _args_demo(sub):
    """`demo`'s arguments."""
    q = sub.add_parser('demo', help='a bundled digits example: prepare, train, export')
    q.add_argument('--model', choices=sorted(DEMOS), default='mlp',
                   help='mlp: the MLP from scratch; cnn: a PyTorch CNN (via tico) fine-tuned')
    q.add_argument('--out', help='folder (default build/digits or build/digits_cnn)')
    q.add_argument('--board', type=_board, default='rp2040', help='the simulated board\'s profile')
    q.add_argument('--epochs', type=whole, help='default 5 (mlp), 2 (cnn)')
    q.add_argument('--python', action='store_true', help='CPython + numpy instead of MicroPython')
    q.set_defaults(fn=cmd_demo)


def _args_evaluate(sub):
    """`evaluate`'s arguments."""
    q = sub.add_parser('evaluate', help='accuracy (classifier) or MAE/MSE (regression) of a '
                       'model file on labelled data, on the host: compare before and after')
    q.add_argument('model', help='.circle or .tflite (float: ONERT; int8 .tflite: TFLite Micro) '
                   'or .onnx (ONNX Runtime), the original or what export wrote')
    q.add_argument('data', help='.npz (x, y), .csv (label in the last column; several targets: '
                   'the columns after the input\'s values), .ds or a folder '
                   'of class sub-folders of images, as prepare reads them')
    q.add_argument('--metric', choices=['accuracy', 'mae'],
                   help='default: accuracy when y holds class labels and the model has several '
                        'outputs, or labels 0 and 1 and it has one output in 0..1 (a sigmoid), '
                        'else MAE (and MSE)')
    q.add_argument('--nchw', action='store_true',
                   help='flat samples (.csv, .ds) are NCHW or NCL (as PyTorch takes them) and '
                        'the model takes NHWC or NLC (tico models once prepared/exported); 4-D '
                        'and 3-D .npz arrays in that order are recognised without it')
    q.add_argument('--label', choices=['first', 'last'], default='last', help='CSV label column')
    q.add_argument('--size', help='images: resize to WxH')
    q.add_argument('--limit', type=whole, help='score only the first N samples')
    q.add_argument('--output', metavar='NAME|INDEX', help='a model with several outputs: the '
                   'one scored (default: as prepare chooses, the first whose size the targets '
                   'fit); several inputs: an .npz with an array per input, as prepare reads it')
    q.set_defaults(fn=cmd_evaluate)


def _args_board(sub):
    """`board`'s arguments."""
    q = sub.add_parser('board', help='a simulated board on a serial port (deploy, pull, fleet '
                       '--ports try against it) until Ctrl-C; --check PORT: what a real board has')
    q.add_argument('--board', type=_board, default='unix', help='simulated: the boards.json profile whose '
                   'heap it gets (default unix: 1 MB)')
    q.add_argument('--flash', help='simulated: the folder that plays its file system (kept; '
                   'default a new temporary folder)')
    q.add_argument('--emulate', action='store_true',
                   help='simulated: an emulated Raspberry Pi Pico (the real MicroPython rp2 '
                        'firmware, $UTRAIN_PICO_FIRMWARE, in rp2040js) instead of unix '
                        'MicroPython; its flash is kept in the --flash folder')
    q.add_argument('--ulab', action='store_true',
                   help='with --emulate: the firmware with ulab ($UTRAIN_PICO_ULAB_FIRMWARE)')
    q.add_argument('--check', metavar='PORT', help='a real board: firmware, .mpy version and '
                   'arch, ulab, free heap and file system, and the --board profile to use')
    q.add_argument('--resume', action='store_true',
                   help='--check: no soft reset first (a simulated board)')
    q.set_defaults(fn=cmd_board)


def whole(v):
    """argparse type of a count, seed or size: a whole number ('1e3' and '8.0' too); a
    refusal that says what the option takes (argparse's was "invalid int value: 'abc'")."""
    try:
        return int(v)
    except ValueError:
        pass
    try:
        f = float(v)
    except ValueError:
        f = None
    if f is not None and f == f and abs(f) != float('inf') and f == int(f):
        if abs(f) >= 2 ** 64:   # (1e308 had been echoed back by its check as 309 digits)
            raise argparse.ArgumentTypeError(
                f'{v!r} is beyond any count, seed or size (none takes 2^64 or more); give '
                'one such as 8')
        return int(f)
    raise argparse.ArgumentTypeError(f'{v!r} is not a whole number; give one such as 8')


def number(v):
    """argparse type of a rate, fraction or time: a number (its range is the option's
    own check); a refusal that says what the option takes."""
    try:
        return float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{v!r} is not a number; give one such as 0.01 or '
                                         '1e-3') from None


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its refusals one paragraph: what is wrong and where the options
    are listed (argparse printed its usage, 30 lines for prepare, above the error)."""

    def error(self, message):
        self.exit(2, f'{self.prog}: error: {message}; `{self.prog} --help` lists the options\n')


def parser(prog=None):
    """The command line: every subcommand and option (docgen writes docs/options.md
    from it).  prog: the name in usage lines (default: as invoked, `utrain` for the
    installed command, else `python -m host_tools`)."""
    prog = prog or _prog()
    p = _Parser(prog=prog, description='utrain host tools: prepare circle/tflite models '
                                       'for training on MicroPython boards.')
    sub = p.add_subparsers(dest='cmd', required=True)
    for add in (_args_inspect, _args_prepare, _args_run, _args_export, _args_dataset,
                _args_deploy_pull, _args_fleet, _args_plot, _args_demo, _args_evaluate,
                _args_board):
        add(sub)       # one function a subcommand
    return p


def _negatives_joined(p, argv):
    """argv with an option that takes a value followed by one that starts with '-' and a
    digit, or is -inf or -nan (`--budget -5K`, `--lr -1e-3`, `--lr -inf`) joined as `--budget=-5K`: argparse reads such a
    value as an option and says only 'expected one argument'; joined, the option's own
    check says what is wrong with it."""
    import re
    acts = {}
    for sub in p._subparsers._group_actions[0].choices.values() if p._subparsers else ():
        acts.update(sub._option_string_actions)
    acts.update(p._option_string_actions)
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        act = acts.get(a)
        if act is not None and act.nargs is None and act.option_strings and \
                i + 1 < len(argv) and re.match(r'-([0-9.]|(inf|infinity|nan)$)', argv[i + 1], re.I):
            out.append(f'{a}={argv[i + 1]}')
            i += 2
            continue
        out.append(a)
        i += 1
    return out


# the paths a command takes (attribute, as its usage names it)
_PATHS = (('model', 'the model'), ('data_file', 'DATA'), ('data', 'the data'), ('dir', 'the folder'),
          ('log', 'the log'), ('weights', 'the weights file'), ('source', 'the source'),
          ('out', '-o'), ('out_file', 'OUT'), ('train_config', '--train-config'), ('test', '--test'))


def _ctrl_c_within(e) -> bool:
    """Whether exception e was raised because of a KeyboardInterrupt (its cause or context)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def main(argv=None):
    for stream in (sys.stdout, sys.stderr):
        # (a terminal or pipe whose encoding cannot hold a model's tensor name or a path,
        # LANG=C, PYTHONIOENCODING=ascii: the command had stopped half way with 'error:
        # 'ascii' codec can't encode characters in position 6-8'; such a character is
        # printed as its escape, \u2013)
        try:
            stream.reconfigure(errors='backslashreplace')
        except (AttributeError, ValueError, OSError):
            pass
    try:        # (a Ctrl-C here, before a command runs, had ended in a traceback)
        p = parser()
        argv = _negatives_joined(p, list(sys.argv[1:] if argv is None else argv))
        a = p.parse_args(argv)
        # a path given as '' (an unset shell variable: -o "$OUT") had been ': no such file
        # or folder', ': no train.json here' or, for --data, no data at all, unsaid
        empty = next((n for k, n in _PATHS if getattr(a, k, None) == ''), None)
        if empty:
            print(f'error: {empty} given as \'\' (an empty path): give its path', file=sys.stderr)
            return 2
        for k in [k for k, _ in _PATHS] + ['output']:
            # (a '~' the shell did not expand: quoted, `-o "~/run"`, or from a script's
            # config: a folder named '~' had been made in the current one, unsaid)
            v = getattr(a, k, None)
            if isinstance(v, str) and v.startswith('~') and not os.path.lexists(v):
                setattr(a, k, os.path.expanduser(v))
        from .target.runner import stop_signals
        from .target.device import light_gc
    except KeyboardInterrupt:
        print('\nstopped (Ctrl-C) while loading: nothing was done', file=sys.stderr)
        return 130
    saved = stop_signals()
    try:
        with light_gc():
            return a.fn(a)
    except KeyboardInterrupt:
        # (a Ctrl-C the command did not take itself: deploy --run's second one, which
        # leaves the board training unfollowed; prepare, export, evaluate half way; a
        # SIGTERM or SIGHUP is one too: the files half written are removed)
        from .target.runner import stopped_by
        print(f'\nstopped ({stopped_by()}): {a.cmd} did not finish' + (
            '; the board trains on unfollowed: `pull` once it ends (its train.log says when)'
            if a.cmd == 'deploy' and getattr(a, 'run', False) else ''), file=sys.stderr)
        return 130
    except BrokenPipeError:
        # (`inspect model | head`: the reader has what it wanted; it had been 'error:
        # [Errno 32] Broken pipe' and, at exit, Python's 'Exception ignored' lines)
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):       # (stdout not a file: a test's StringIO)
            pass
        return 141
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        if _ctrl_c_within(e):
            # (a Ctrl-C while a module loaded half way through a command: Python wraps it,
            # 'error: Error calling __set_name__ on 'cached_property' instance ...', exit 2)
            print(f'\nstopped (Ctrl-C): {a.cmd} did not finish', file=sys.stderr)
            return 130
        from .files.validate import os_error_text
        where = next((getattr(a, k) for k in ('out', 'output', 'out_file', 'dir', 'flash')
                      if getattr(a, k, None)), None)
        print(f'error: {os_error_text(e, where) if isinstance(e, OSError) else e}',
              file=sys.stderr)
        return 2
    finally:
        for sig, h in saved.items():
            signal.signal(sig, h)
