"""Memory: the heap planner against the simulated board, budget refusal, sparse update
(ranks, onert-micro's training-config file), frozen weights streamed from the model
file, batch-1 immediate updates.

"Measured" here is what a board sees: whether training finishes under `-X heapsize`.
The planner's figure must train (estimate >= the smallest heap that trains) and its
figure / 1.3 must not (estimate <= 1.3 x that smallest heap): two runs per case, no
bisection (bench/memory.py bisects).  micropython.mem_peak() is no measure on this port:
it never subtracts blocks the garbage collector frees.
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402

from host_tools.target import runner  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.files.flatmodel import read_flat  # noqa: E402
from host_tools.plan.memory import trains_in  # noqa: E402
from host_tools.graph.passes import PrepareError, plan as make_plan  # noqa: E402
from host_tools.prepare.pipeline import prepare  # noqa: E402
from host_tools.formats.refmodels import mlp, mobilenet_head  # noqa: E402
import q8cases  # noqa: E402
from host_tools.files.trainconfig import read_train_config, write_train_config  # noqa: E402
from host_tools.files.wof import read_wof  # noqa: E402

DIGITS = os.path.join(ROOT, 'datasets', 'digits')
MP = runner.find_micropython()
needs_mp = pytest.mark.skipif(not MP, reason='no MicroPython binary')


def backend():
    if not MP:
        return 'fallback'
    r = subprocess.run([MP, '-c', 'import ulab'], capture_output=True)
    return 'ulab' if r.returncode == 0 else 'fallback'


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    z = np.load(os.path.join(DIGITS, 'digits.npz'))
    path = str(tmp_path_factory.mktemp('d') / 'd.npz')
    np.savez(path, x=z['x'][:12], y=z['y'][:12])
    return path


@pytest.fixture(scope='module')
def head(tmp_path_factory):
    return mobilenet_head(str(tmp_path_factory.mktemp('m') / 'head.circle'))


DIGITS_MLP = os.path.join(DIGITS, 'digits_mlp.circle')
# (model, settings): the reference models and rank settings the planner is held to
CASES = {
    'digits-sgd-b4': ('digits', dict(optimizer='sgd', batch=4)),
    'digits-adam-b1': ('digits', dict(optimizer='adam', batch=1)),
    # (the load's holes on the 64-bit fallback: it failed loading the model at its plan
    # from a folder with a long path, 0.997x; Adam b1 trained with 0.3 % to spare)
    'digits-sgd-b1': ('digits', dict(optimizer='sgd', batch=1)),
    'digits-adam-b4-half': ('digits', dict(optimizer='adam', batch=4, ranks='0:1/2,1:bias')),
    'head-last2-stream': ('head', dict(optimizer='sgd', batch=1, train='last:2', stream=True)),
    'head-bias-quarter-stream': ('head', dict(optimizer='adam', batch=1, train='none',
                                              ranks='2:bias,3:1/4', stream=True)),
    # issue 28's sweep: the prefix cache's module, imported mid-run (0.96-1.0x before)
    'digits-last2-host-cache': ('digits', dict(optimizer='sgd', batch=1, train='last:2',
                                               cache='host')),
    'digits-last2-board-cache': ('digits', dict(optimizer='sgd', batch=1, train='last:2',
                                                cache=True)),
}


@pytest.mark.slow
@needs_mp
@pytest.mark.parametrize('case', list(CASES))
def test_planner_bounds_the_smallest_heap(tmp_path, data, head, case):
    which, kw = CASES[case]
    model = DIGITS_MLP if which == 'digits' else head
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', lr=0.01, epochs=1, backend=backend(), **kw)
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'{case}: does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), \
        f'{case}: trains in {int(plan / 1.3)} B, the plan ({plan} B) is over 1.3x the need'


# issue 28's sweep: a convolution's peak on the fallback (its native loops write into the
# output: one activation array, no per-tap product), and the loss's arrays and the
# optimizer's row temporaries, which come after the forward pass, not on top of its
# peak: a 16x16 CNN was planned 1.21x (64-bit) and 1.32x (32-bit) its smallest heap
CONV_CASES = {
    'last2-stream': dict(optimizer='sgd', batch=1, train='last:2', stream=True),
    'all-sgd-b1': dict(optimizer='sgd', batch=1, train='all'),
}


# ... and under ulab (32-bit, $UTRAIN_MP32_ULAB; skipped without): its conv steps
# (utrain.ulconv) add a tap's product a piece of rows at a time, planned as three
# output-sized products: the sweep's 16x16 CNN 1.25-1.32x, this one 1.21-1.25x; and at
# batch 1 the classifier's optimizer rows were planned on top of the conv's backward
CONV_BUILDS = [pytest.param(None, id='default'),
               pytest.param('UTRAIN_MP32_ULAB', id='32-ulab', marks=pytest.mark.skipif(
                   not os.path.exists(os.environ.get('UTRAIN_MP32_ULAB') or '/-'),
                   reason='$UTRAIN_MP32_ULAB names no build'))]


@pytest.mark.slow
@needs_mp
@pytest.mark.parametrize('build', CONV_BUILDS)
@pytest.mark.parametrize('case', list(CONV_CASES))
def test_a_conv_peak_is_planned_within_1_2x(tmp_path, monkeypatch, case, build):
    """A CNN this test makes (20x20 input, 6 channels: not the sweep's 16x16 x 8) trains
    in its plan and not in plan / 1.2, on the default MicroPython's arrays and on a
    32-bit build with ulab."""
    from host_tools.formats.refmodels import small_cnn
    arrays = backend()
    if build:
        monkeypatch.setenv('MICROPYTHON', os.environ[build])
        arrays = 'ulab'
    model = small_cnn(str(tmp_path / 'cnn.circle'), seed=3, size=20, channels=6, classes=4)
    rng = np.random.default_rng(3)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((8, 20, 20, 1)).astype(np.float32), y=rng.integers(0, 4, 8))
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', lr=0.01, epochs=1, log=lambda *a: None,
                backend=arrays, **CONV_CASES[case])
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'{case}: does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), \
        f'{case}: trains in {int(plan / 1.2)} B, the plan ({plan} B) is over 1.2x the need'


BUILDS_32 = [pytest.param(b, arrays, id=b.lower(), marks=pytest.mark.skipif(
    not os.path.exists(os.environ.get(b) or '/-'), reason=f'${b} names no build'))
    for b, arrays in (('UTRAIN_MP32', 'fallback'), ('UTRAIN_MP32_ULAB', 'ulab'))]


@pytest.mark.slow
@pytest.mark.parametrize('build, arrays', BUILDS_32)
def test_the_batch_end_step_is_not_planned_on_top_of_the_backward_peak(tmp_path, monkeypatch,
                                                                       build, arrays):
    """Adam at batch 4 steps the weights after the backward pass has returned (Trainer.apply):
    its row temporaries (six of the FC's 1152-wide rows) are a phase of their own, not on
    top of the conv's backward peak.  A 24x24 CNN this test makes, 8 channels, trains in its
    plan and not in plan / 1.2 (32-bit: 1.06x its smallest heap on both builds, 1.18-1.19x
    with the two summed; the held-out Keras conv + FC net of issue 28's session-23 sweep,
    Adam b4, 1.21-1.22x).  The bound was 1.15x until session 29: with gc_every the model's
    (4 KB, not the plan's 8.5 / 7.9 KB) and collections at op boundaries the needs fell
    from 250.5 / 231.0 KB to 232.0 / 219.0 KB (mpu32 / mpu32-ulab), 1.15x / 1.13x."""
    from host_tools.formats.refmodels import small_cnn
    monkeypatch.setenv('MICROPYTHON', os.environ[build])
    model = small_cnn(str(tmp_path / 'cnn.circle'), size=24, channels=8)
    rng = np.random.default_rng(0)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((8, 24, 24, 1)).astype(np.float32), y=rng.integers(0, 5, 8))
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=1,
                log=lambda *a: None, backend=arrays, optimizer='adam', batch=4, train='all')
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), \
        f'trains in {int(plan / 1.2)} B, the plan ({plan} B) is over 1.2x the need'


# issue 28 (session 15): a net whose arrays are all under 200 B on 32-bit ulab: the load
# needs 9 KB beyond the data held there, as the 32-bit fallback, which the 32-bit bases
# hold already; a 10 KB floor on top planned a held-out 8-6-3 MLP 1.20-1.23x its need
@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.environ.get('UTRAIN_MP32_ULAB') or '/-'),
                    reason='$UTRAIN_MP32_ULAB names no build')
def test_a_tiny_mlp_is_planned_within_1_15x_on_32_bit_ulab(tmp_path, monkeypatch):
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    model = mlp(str(tmp_path / 'm.circle'), [5, 7, 4], seed=4)
    rng = np.random.default_rng(4)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((8, 5)).astype(np.float32), y=rng.integers(0, 4, 8))
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', lr=0.01, epochs=1, log=lambda *a: None,
                backend='ulab', optimizer='sgd', batch=1)
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.15)), \
        f'trains in {int(plan / 1.15)} B, the plan ({plan} B) is over 1.15x the need'


@pytest.mark.slow
@needs_mp
@pytest.mark.parametrize('build', CONV_BUILDS)
def test_a_transposed_conv_autoencoder_is_planned_within_1_25x(tmp_path, monkeypatch, build):
    """A Keras-style conv autoencoder (24x24, Conv2D(8) stride 2 -> Conv2DTranspose(1)
    stride 2, MSE against its input; op_tconv's weight in its convolution's layout and that
    layout's gradient are OpSpec.wtemp's) trains in its plan and not in plan / 1.25.  (A
    held-out Keras one, 24x24 with two of each, was planned 1.08-1.17x its smallest heap,
    64-bit and 32-bit, fallback and ulab.)"""
    from kerasgraphs import build_keras_autoencoder
    arrays = backend()
    if build:
        monkeypatch.setenv('MICROPYTHON', os.environ[build])
        arrays = 'ulab'
    model, _ = build_keras_autoencoder(tmp_path / 'ae.tflite', size=24, channels=8)
    x = np.random.default_rng(3).uniform(0, 1, (6, 24, 24, 1)).astype(np.float32)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=x, y=x)
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='mse', lr=0.01, epochs=1, optimizer='sgd', batch=1,
                int8=False, log=lambda *a: None, backend=arrays)
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.25)), \
        f'trains in {int(plan / 1.25)} B, the plan ({plan} B) is over 1.25x the need'


def _nchw_block(path, size=24, ch=8, classes=4, seed=0):
    """tico's layout around an NHWC conv, as in its ResNet-8: the conv's output (1 input
    channel -> ch, RELU) TRANSPOSEd to NCHW, a per-channel MUL (broadcast blocks), a
    residual ADD with a fused RELU (more than op_act's _WHOLE values: clipped in chunks),
    TRANSPOSEd back; then a PAD and a CONCATENATION of the padded map with itself (an
    array twice as long as any before it), MEAN, FULLY_CONNECTED."""
    from host_tools.formats.circle_build import CircleBuilder
    rng = np.random.default_rng(seed)
    b = CircleBuilder(description='utrain test: NCHW block')
    S, C = size, ch

    def const(name, shape, data):
        return b.tensor(name, list(shape), data=data)

    def op(name, ins, shape, **opts):
        out = b.tensor(f'{name.lower()}{len(made)}', shape)
        made.append(b.op(name, ins, [out], **opts))
        return out

    made = []

    x = b.tensor('x', [1, S, S, 1])
    a = op('CONV_2D', [x, const('w', [C, 3, 3, 1], rng.normal(0, 0.3, (C, 3, 3, 1)).astype(np.float32)),
                       const('wb', [C], np.zeros(C, np.float32))], [1, S, S, C],
           padding='SAME', stride_w=1, stride_h=1, fused_activation_function='RELU')
    t = op('TRANSPOSE', [a, const('nchw', [4], np.array([0, 3, 1, 2], np.int32))], [1, C, S, S])
    m = op('MUL', [t, const('k', [1, C, 1, 1], rng.normal(1, 0.1, (1, C, 1, 1)).astype(np.float32))],
           [1, C, S, S])
    r = op('ADD', [m, t], [1, C, S, S], fused_activation_function='RELU')
    u = op('TRANSPOSE', [r, const('nhwc', [4], np.array([0, 2, 3, 1], np.int32))], [1, S, S, C])
    p = op('PAD', [u, const('pads', [4, 2], np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))],
           [1, S + 2, S + 2, C])
    c = op('CONCATENATION', [p, p], [1, S + 2, S + 2, 2 * C], axis=3)
    g = op('MEAN', [c, const('axes', [2], np.array([1, 2], np.int32))], [1, 2 * C])
    z = op('FULLY_CONNECTED', [g, const('fw', [classes, 2 * C], rng.normal(0, 0.3, (classes, 2 * C)).astype(np.float32)),
                               const('fb', [classes], np.zeros(classes, np.float32))], [1, classes])
    b.inputs(x)
    b.outputs(z)
    b.save(path)
    return path


@pytest.mark.skipif(not os.path.exists(os.environ.get('UTRAIN_MP32_ULAB') or '/-'),
                    reason='$UTRAIN_MP32_ULAB names no build')
def test_copy_and_elementwise_ops_are_planned_as_they_allocate(tmp_path, monkeypatch):
    """A tico-style NCHW block this test makes (24x24x8 maps: TRANSPOSE, a broadcast MUL,
    a residual ADD + RELU, PAD, a CONCATENATION twice as wide), its frozen part run
    forward only (the classifier trains), trains on 32-bit ulab in its plan and not in
    plan / 1.3.  The copy and element-wise ops had been planned with two output-sized
    temporaries and an input-sized one each, which their kernels never make (this
    graph: 251 KB planned, the ResNet-8's streamed cell 1.74x its need); planned as
    what they make alone, without the fresh run the CONCATENATION's output needs beside
    the smaller maps' holes, it fails in its plan (158 KB; it trains at 150 and 162 KB,
    fails at 154-160 and 171 KB, trains from 174 KB up)."""
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    model = _nchw_block(str(tmp_path / 'blk.circle'))
    rng = np.random.default_rng(1)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((4, 24, 24, 1)).astype(np.float32), y=rng.integers(0, 4, 4))
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=1,
                log=lambda *a: None, backend='ulab', optimizer='sgd', batch=1, train='last:2',
                bands=0, rewrite=False)     # (the rewrites now cancel the two TRANSPOSEs)
    from host_tools.graph.optable import SPECS
    codes = [op[0] for op in read_flat(os.path.join(out, 'model.flat'))['ops']]
    assert codes.count(SPECS['TRANSPOSE'].code) == 2 and SPECS['CONCATENATION'].code in codes
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), \
        f'trains in {int(plan / 1.3)} B, the plan ({plan} B) is over 1.3x the need'


def test_streamed_conv_rows_code_only_for_a_weight_read_by_rows(tmp_path):
    """utrain.convrows loads only where a streamed frozen conv weight is larger than
    utrain.stream's CHUNK (op_conv reads it rows at a time): a 3x3 conv of 8 channels
    (72 floats) plans no convrows code, one of 120 channels (1,080 floats) plans it, in
    place of the ulab steps that conv then never runs (train.json's run.steps: the code
    planned is the code loaded)."""
    from host_tools.formats.refmodels import small_cnn
    from host_tools.plan.memory import WORD_FIGURES, mpy_sizes
    from host_tools.target.device import module
    rng = np.random.default_rng(4)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((4, 8, 8, 1)).astype(np.float32), y=rng.integers(0, 3, 4))
    code = {}
    for ch in (8, 120):
        assert (ch * 9 > module('stream').CHUNK) == (ch == 120)
        model = small_cnn(str(tmp_path / f'c{ch}.circle'), seed=4, size=8, channels=ch, classes=3)
        s = prepare(model, str(tmp_path / f'o{ch}'), data=data, loss='scce', lr=0.01, epochs=1,
                    log=lambda *a: None, backend='ulab', board='rp2350', bands=0, optimizer='sgd',
                    batch=1, train='last:2', stream=True)
        code[ch] = s['heap']['parts']['code'], s['heap']['steps']
        with open(str(tmp_path / f'o{ch}' / 'train.json')) as f:
            assert json.load(f)['run'].get('steps', []) == s['heap']['steps']
    assert 'convrows' in code[120][1] and 'convrows' not in code[8][1], code
    sizes = mpy_sizes()
    steps = sum(sizes[m] for m in code[120][1]) - sum(sizes[m] for m in code[8][1])
    assert abs(code[120][0] - code[8][0] - WORD_FIGURES[4]['code'] * steps) <= 1


@pytest.mark.slow
@needs_mp
@pytest.mark.parametrize('case', list(q8cases.CASES))
def test_int8_planner_bounds_the_smallest_heap(tmp_path, case):
    """An int8 model trained as int8: prepare plans its heap (memory.plan_heap_q8), the
    run trains there and not in plan / 1.3."""
    out, s = q8cases.prepared(prepare, case, tmp_path)
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'{case}: does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), \
        f'{case}: trains in {int(plan / 1.3)} B, the plan ({plan} B) is over 1.3x the need'


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.environ.get('UTRAIN_MP32_ULAB') or '/-'),
                    reason='$UTRAIN_MP32_ULAB names no build')
@pytest.mark.parametrize('opt', [dict(), dict(optimizer='adam', batch=4)], ids=['sgd-b1', 'adam-b4'])
def test_an_int8_residual_cnn_trains_in_its_plan_on_32_bit(tmp_path, monkeypatch, opt):
    """An int8 residual CNN (SeparableConv2D + Add, as Keras's converter writes it; the
    held-out hr_rescnn_int8) trained whole as int8 on the 32-bit ulab build: it trains in
    its plan and not in plan / 1.2.  It needed 0.88x its plan with Adam at batch 4 (the
    trained layers' Adam arrays made among Adam's fill garbage and the load's, before
    q8train collected it) and 0.98x with SGD (the input buffer made last, in holes)."""
    from kerasgraphs import build_int8_rescnn
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    model = build_int8_rescnn(str(tmp_path / 'res.tflite'))
    _int8_trains_in_its_plan(tmp_path, model, (24, 24, 3), 5, opt)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.environ.get('UTRAIN_MP32') or '/-'),
                    reason='$UTRAIN_MP32 names no build')
@pytest.mark.parametrize('opt', [dict(optimizer='adam', batch=4), dict(optimizer='sgd', batch=1),
                                 dict(optimizer='sgd', batch=1, momentum=0.9),
                                 dict(optimizer='sgd', batch=4)],
                         ids=['adam-b4', 'sgd-b1', 'momentum-b1', 'sgd-b4'])
@pytest.mark.parametrize('shape', [dict(T=12, C=8, F=16), dict(T=6, C=8, F=48),
                                   dict(kind='td', T=8, C=16, F=24)], ids=['f16', 'f48', 'td'])
def test_an_int8_shared_weight_trains_in_its_plan_on_32_bit(tmp_path, monkeypatch, opt, shape):
    """An int8 model whose weights several layers read (an unrolled recurrence, as Keras's
    converter writes one; utrain.q8share) trained whole on the 32-bit build: it trains in
    its plan and not in plan / 1.2.  With Adam at batch 4 it needed 1.28x its plan (the
    issue 28 int8 sweep: a tico GRU --int8, 1.16x): Q8Net.setup made each alias's own
    gradient sums and Adam arrays, all held until the share linked the owner's in their
    place.  Then, 48 units wide: 0.85x its plan at SGD batch 1, 0.78x with momentum, 0.87x
    with Adam (12 steps of 16: 0.97x, 0.96x): the owner's int32 sums and Adam arrays made
    in setup, after the steps' hundreds of small layer objects, found no run long enough
    among the load's holes, and the load made the aliases' SGD fractions and momentum
    velocities (holes once setup dropped them); now made with the held weights.  A
    TimeDistributed(Dense) of 8 steps at SGD batch 4: 0.985x (its classifier's batch sums,
    2.3 KB, made in setup)."""
    from kerasgraphs import build_int8_shared
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32'])
    shape = dict(shape)
    model = build_int8_shared(str(tmp_path / 'rnn.tflite'), shape.pop('kind', 'rnn'), O=3, **shape)[0]
    _int8_trains_in_its_plan(tmp_path, model, (shape['T'], shape['C']), 3, opt)


@pytest.mark.slow
@pytest.mark.parametrize('build', ['64-bit', '32-bit'])
def test_an_int8_prefix_pass_is_planned_within_its_need(tmp_path, monkeypatch, build):
    """--cache on an int8 model whose frozen prefix pass (utrain.q8prefix: its own net,
    before the trainer loads) sets the heap: the run trains in the plan and not in
    plan / 1.2, on the 64-bit and the 32-bit unix builds.  The Keras DS-CNN's last two
    layers (4 random samples, as bench/sweep.py's cell) planned 1.25x and 1.21x their
    need: the pass was planned with the interpreter's share that only training holds.  A
    residual CNN on 64x64 images built here, whose pass loads the band code, trains in its
    plan (with 6 KB taken off on 32-bit it had 0.5 KB to spare)."""
    from kerasgraphs import build_int8_rescnn
    if build == '32-bit':
        if not os.path.exists(os.environ.get('UTRAIN_MP32') or '/-'):
            pytest.skip('$UTRAIN_MP32 names no build')
        monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32'])
    rng = np.random.default_rng(0)
    for name, model, shape, classes, limit in (
            ('the DS-CNN', os.path.join(q8cases.KERAS, 'dscnn_kws_int8.tflite'), (49, 10, 1), 12, 1.2),
            ('the residual CNN', None, (64, 64, 3), 5, None)):
        model = model or build_int8_rescnn(str(tmp_path / 'res.tflite'), H=64, C=8, D=16)
        data = str(tmp_path / 'd.npz')
        np.savez(data, x=rng.standard_normal((4,) + shape).astype(np.float32),
                 y=rng.integers(0, classes, 4))
        out = str(tmp_path / name.split()[-1])
        s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=1,
                    train='last:2', cache=True, log=lambda *a: None)
        plan = s['heap']['total']
        assert s.get('int8') and any(k.endswith('(prefix pass)') for k in s['heap']['parts']), \
            s['heap']['parts']
        runner.stage(out)
        assert trains_in(out, plan), f'{name} does not train in the planned {plan} B'
        assert not limit or not trains_in(out, int(plan / limit)), \
            f'{name} trains in {int(plan / limit)} B, the plan ({plan} B) is over {limit}x the need'


def _int8_trains_in_its_plan(tmp_path, model, shape, classes, opt):
    """int8 model prepared as int8, trained whole on 8 random samples of shape with
    settings opt: it trains in its plan on $MICROPYTHON and not in plan / 1.2."""
    rng = np.random.default_rng(1)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((8,) + shape).astype(np.float32),
             y=rng.integers(0, classes, 8))
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', epochs=1, train='all', log=lambda *a: None, **opt)
    assert s.get('int8'), s.get('int8')
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), \
        f'trains in {int(plan / 1.2)} B, the plan ({plan} B) is over 1.2x the need'


def test_int8_budget_refusal_says_what_would_fit(tmp_path):
    """--budget on an int8 run: refused over it, naming the file, the plan and settings
    whose plan fits; nothing written.  Within it, prepare prints the plan."""
    model, data = (os.path.join(q8cases.KERAS, f) for f in q8cases.CASES['mlp-all-adam-b4'][:2])
    out = tmp_path / 'o'
    args = ['prepare', model, '-o', str(out), '--data', data, '--loss', 'scce', '--train', 'all']
    fits = prepare(model, str(tmp_path / 'sgd'), data=data, loss='scce', train='all',
                   lr=0.01)['heap']     # (lr given: no lr probe; the plan is the same)
    assert fits['parts']['layer table (q8.json parsed)'] > 0
    budget = fits['total'] + 1024
    r = subprocess.run([sys.executable, '-m', 'host_tools', *args, '--optimizer', 'adam',
                        '--batch', '4', '--budget', str(budget)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f'{model}: training as int8 needs about' in r.stderr, r.stderr
    assert f'the budget is {budget // 1024} KB' in r.stderr and 'optimizer state' in r.stderr
    assert 'would fit: --batch 1 --optimizer sgd' in r.stderr, r.stderr
    assert not out.exists()
    r = subprocess.run([sys.executable, '-m', 'host_tools', *args, '--budget', str(budget)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'heap plan (fallback, for ' in r.stdout and 'layer table (q8.json parsed)' in r.stdout
    r = subprocess.run([sys.executable, '-m', 'host_tools', *args, '--board', 'rp2040'],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and 'for rp2040: 32-bit' in r.stdout, r.stdout + r.stderr


def test_an_int8_budget_chooses_the_prefix_cache(tmp_path):
    """Issue 28, the int8 path: over --budget, prepare chooses --cache (the frozen layers
    on a net of their own, once per sample) where that fits and the user did not set it,
    says so, and the run trains in the plan."""
    model, data = (os.path.join(q8cases.KERAS, f) for f in q8cases.CASES['dscnn-last2'][:2])
    kw = dict(data=data, loss='scce', train='last:2', lr=0.01, log=lambda *a: None)  # (no lr probe)
    whole = prepare(model, str(tmp_path / 'a'), **kw)['heap']['total']
    cached = prepare(model, str(tmp_path / 'b'), cache=True, **kw)['heap']['total']
    budget = cached + 1024
    assert whole > budget
    said = []
    s = prepare(model, str(tmp_path / 'c'), budget=budget, **dict(kw, log=said.append))
    assert s['heap']['total'] == cached and any('prepare chose --cache' in m for m in said), said
    files = json.load(open(tmp_path / 'c' / 'train.json'))['files']
    assert files['model'] == 'q8t.json' and files['prefix'] == 'q8.json', files


def test_int8_row_bands_only_where_they_lower_the_plan(tmp_path):
    """prepare's int8 path chose the band group that made the arena smallest, though the
    band group keeps its weights in RAM: the DS-CNN last:2 for rp2040 planned 161 KB banded
    where 125 KB unbanded (and a banded step costs 1.8x on a Pico).  Left to prepare, bands
    never plan above no bands; --bands 1 still bands."""
    model, data = (os.path.join(q8cases.KERAS, f) for f in q8cases.CASES['dscnn-last2'][:2])
    kw = dict(data=data, loss='scce', train='last:2', board='rp2040', lr=0.01,  # (no lr probe)
              log=lambda *a: None)
    plans = {}
    for b in (None, 0, 1):
        out = tmp_path / str(b)
        plans[b] = prepare(model, str(out), bands=b, **kw)['heap']['total']
        groups = json.load(open(out / 'q8.json'))['groups']
        assert bool(groups) == (b == 1) or b is None
    assert plans[None] <= plans[0] < plans[1]


TARGETS = {
    # the issue's two 96 KB targets (an ESP32 without PSRAM), code included
    'head-last2-stream': lambda head: (head, dict(optimizer='sgd', batch=1, train='last:2',
                                                  stream=True)),
    'digits-cnn-full': lambda head: (os.path.join(DIGITS, 'digits_cnn.circle'),
                                     dict(optimizer='sgd', batch=1)),
}


@pytest.mark.slow
@needs_mp
@pytest.mark.parametrize('target', list(TARGETS))
def test_targets_train_within_96k_on_ulab(tmp_path, data, head, target):
    """The ~132k-parameter head with its last layer trained and frozen weights streamed,
    and the digits CNN trained whole: the planner admits both under --budget 96K with
    ulab, and a ulab MicroPython trains them in 96 KB of heap (the fallback's code
    takes ~25 KB more)."""
    model, kw = TARGETS[target](head)
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', lr=0.01, budget='96K', backend='ulab', **kw)
    if target.startswith('head'):
        assert s['trainable_params'] + s['frozen_params'] > 100_000
    if backend() == 'ulab':
        runner.stage(out)
        assert trains_in(out, 96 * 1024)


def test_budget_refusal_says_what_would_fit(tmp_path):
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'prepare', DIGITS_MLP, '-o',
                        str(tmp_path / 'o'), '--loss', 'scce', '--optimizer', 'adam',
                        '--batch', '4', '--budget', '96K', '--backend', 'ulab'],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert 'training needs about' in r.stderr and 'the budget is 96 KB' in r.stderr
    assert 'would fit: --batch 1 --optimizer sgd' in r.stderr
    assert not (tmp_path / 'o' / 'model.flat').exists()
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'prepare', DIGITS_MLP, '-o',
                        str(tmp_path / 'o'), '--loss', 'scce', '--board', 'rp2040'],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'heap plan (fallback' in r.stdout and 'code' in r.stdout


def test_fit_advice_that_drops_the_ranks_says_so(tmp_path):
    """A suggestion that trains the last N ops instead of the given ranks (or biases only
    where there are none) names what replaces them: '--ranks' with a value, or 'without
    --ranks', never a bare '--ranks' (it had printed '--train last:1 --ranks  --cache-on-host').
    The planner stub fits only last:N candidates: every line is one."""
    from host_tools.plan.memory import fit_advice
    g = read_model(mlp(str(tmp_path / 'm.circle'), [6, 8, 8, 4]))
    s = {'batch': 1, 'optimizer': 'sgd', 'momentum': 0.0, 'stream': False, 'cache': False}
    heap = {'parts': {'code': 40960}}
    text = fit_advice(g, s, [], {1: 2}, 'fallback', 30000, heap,
                      lambda tr, rk, s, c, b: 20000 if str(tr).startswith('last:') else 90000)
    fits = [ln for ln in text.splitlines() if 'would fit' in ln]
    assert fits and all('--train last:' in ln and 'without --ranks' in ln for ln in fits), text
    import re
    assert not any(re.search(r'--ranks\s+(--|\(|$)', ln.replace('without --ranks', ''))
                   for ln in fits), text


def test_ranks_prune_the_backward_graph(tmp_path):
    path = mlp(str(tmp_path / 'm.circle'), [6, 8, 8, 4])
    g = read_model(path)
    # ops: 0 FC, 1 FC, 2 FC, 3 SOFTMAX.  Bias only on op 1: no weight gradient, no saved
    # input there, and nothing below op 1 runs backward
    p = make_plan(g, 'none', {1: 1, 2: 4})
    bwd = dict(p.backward)
    assert sorted(bwd) == [1, 2, 3]
    assert bwd[1] == 4                          # DB only (no DX: op 0 is frozen)
    assert bwd[2] == 1 | 2 | 4                  # DX (op 1's bias needs it), DW, DB
    w2, b2 = g.ops[2].inputs[1], g.ops[2].inputs[2]
    assert p.ranks == {w2: (0, 0, 1), b2: (1, 0, 1)}     # 1/4 of 4 channels
    assert g.ops[1].inputs[0] not in p.saved and g.ops[2].inputs[0] in p.saved
    assert set(p.params) == {g.ops[1].inputs[2], w2, b2}
    lo = make_plan(g, 'none', {2: 3})            # LOWER_1_2_PART: channels 2..3
    assert lo.ranks[w2] == (0, 2, 4)


def test_training_config_file_round_trip_and_errors(tmp_path):
    p = str(tmp_path / 'a.tcfg')
    write_train_config(p, {3: 0, 1: 1, 2: 2})
    raw = open(p, 'rb').read()
    assert raw == struct.pack('<HBBI3H3B', 29, 1, 0, 3, 1, 2, 3, 1, 2, 0)
    assert read_train_config(p, 4) == {1: 1, 2: 2, 3: 0}
    with pytest.raises(PrepareError, match='op 3, the model has 3 ops'):
        read_train_config(p, 3)
    with pytest.raises(PrepareError, match='no onert-micro'):
        write_train_config(p, {0: 4})
    for bad, msg in [(raw[:5], 'truncated'),
                     (b'\x1e' + raw[1:], 'not a training-config .*first bytes'),
                     (raw[:-1], 'expected 17'), (raw[:-1] + b'\x09', 'unknown rank')]:
        open(p, 'wb').write(bad)
        with pytest.raises(PrepareError, match=msg):
            read_train_config(p, 4)


def _ref_sparse_sgd(g, x, y, lr, lo, hi, bias_only=False):
    """float64 numpy: SGD batch 1 on the last FC (rows lo:hi of W and b) of an FC stack
    ending in SOFTMAX with scce loss; everything else frozen."""
    fcs = [op for op in g.ops if op.name == 'FULLY_CONNECTED']
    W = [g.tensors[op.inputs[1]].data.astype(np.float64) for op in fcs]
    B = [g.tensors[op.inputs[2]].data.astype(np.float64) for op in fcs]
    for xi, yi in zip(x, y):
        h = xi.astype(np.float64)
        for i in range(len(fcs) - 1):
            h = np.maximum(W[i] @ h + B[i], 0)
        z = W[-1] @ h + B[-1]
        p = np.exp(z - z.max())
        p /= p.sum()
        dz = p.copy()
        dz[int(yi)] -= 1.0
        if not bias_only:
            W[-1][lo:hi] -= lr * np.outer(dz, h)[lo:hi]
        B[-1][lo:hi] -= lr * dz[lo:hi]
    return W[-1], B[-1]


@pytest.mark.parametrize('where', ['python', 'micropython'])
@pytest.mark.parametrize('rank', ['1/2', 'low', '1/4', 'bias'])
def test_sparse_update_trains_exactly_its_channels(tmp_path, rank, where):
    if where == 'micropython' and not MP:
        pytest.skip('no MicroPython')
    path = mlp(str(tmp_path / 'm.circle'), [6, 8, 8], seed=3)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(10, 6)).astype(np.float32)
    y = rng.integers(0, 8, 10)
    np.savez(str(tmp_path / 'd.npz'), x=x, y=y)
    out = str(tmp_path / 'o')
    s = prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer='sgd',
                lr=0.1, batch=1, epochs=1, train='none', ranks='1:' + rank, stream=True)
    code, text = runner.run(out, python=where == 'python', stream=False)
    assert code == 0, text
    g = read_model(path)
    w_name, b_name = 'w1', 'b1'
    trained = {g.tensors[k].name: v for k, v in read_wof(os.path.join(out, 'trained.wof'), g).items()}
    lo, hi = {'1/2': (0, 4), 'low': (4, 8), '1/4': (0, 2), 'bias': (0, 8)}[rank]
    w0 = g.tensors[g.ops[1].inputs[1]].data
    b0 = g.tensors[g.ops[1].inputs[2]].data
    w_ref, b_ref = _ref_sparse_sgd(g, x, y, 0.1, lo, hi, rank == 'bias')
    b = trained[b_name]
    np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=1e-5)
    assert np.array_equal(b[:lo], b0[:lo]) and np.array_equal(b[hi:], b0[hi:])
    if rank == 'bias':
        assert w_name not in trained and s['trainable'] == {'b1': [8]}
        assert s['train_config'] == 'train.tcfg'
        assert read_train_config(os.path.join(out, 'train.tcfg'), 3) == {1: 1}
        return
    w = trained[w_name]
    np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=1e-5)
    frozen = np.ones(8, bool)
    frozen[lo:hi] = False
    assert np.array_equal(w[frozen], w0[frozen]), 'frozen rows changed'
    assert not np.allclose(w[lo:hi], w0[lo:hi])


def test_training_config_file_selects_ops_and_ranks(tmp_path):
    path = mlp(str(tmp_path / 'm.circle'), [6, 8, 8, 4])
    cfg = str(tmp_path / 'c.tcfg')
    write_train_config(cfg, {2: 3, 1: 1})
    s = prepare(path, str(tmp_path / 'o'), train_config=cfg)
    assert sorted(s['trainable']) == ['b1', 'b2', 'w2']
    assert s['ranks'] == {'w2': [0, 2, 4], 'b2': [1, 2, 4]}
    f = read_flat(str(tmp_path / 'o' / 'model.flat'))
    g = read_model(path)
    assert f['ranks'] == {g.ops[2].inputs[1]: (0, 2, 4), g.ops[2].inputs[2]: (1, 2, 4)}
    # the folder carries the config it trained with, byte for byte
    assert open(str(tmp_path / 'o' / 'train.tcfg'), 'rb').read() == open(cfg, 'rb').read()


@pytest.mark.slow
@needs_mp
def test_streaming_and_batch1_updates_change_no_bit(tmp_path, data, head):
    """Frozen weights streamed from the model file and updates applied as each gradient
    completes give the same weights, bit for bit, as RAM-held weights and summed
    gradients (batch 1 through the batch-N path: reduction sum over one sample)."""
    outs = {}
    for name, kw in [('ram', {}), ('stream', dict(stream=True))]:
        out = str(tmp_path / name)
        prepare(head, out, data=data, loss='scce', optimizer='adam', lr=0.01, batch=1,
                epochs=1, train='last:3', ranks='2:1/2', **kw)
        code, text = runner.run(out, stream=False)
        assert code == 0, text
        outs[name] = open(os.path.join(out, 'trained.wof'), 'rb').read()
    assert outs['ram'] == outs['stream']


@pytest.mark.parametrize('model', ['mlp', 'cnn'])
def test_batch1_immediate_update_equals_summed_update(tmp_path, model):
    """CPython: Trainer's batch-1 path (updates inside backward) against the same
    samples through Net.backward's gradient sums and one optimizer step each, with a
    sparse rank on the first layer (FC, or conv laid out [O, KH*KW*I])."""
    if model == 'mlp':
        path, n_in, n_cls = mlp(str(tmp_path / 'm.circle'), [5, 7, 3], seed=9), 5, 3
    else:
        path, n_in, n_cls = os.path.join(DIGITS, 'digits_cnn.circle'), 64, 10
    out = str(tmp_path / 'o')
    prepare(path, out, loss='scce', optimizer='adam', lr=0.05, batch=1, ranks='0:1/4')
    code = """
import sys, json
sys.path.insert(0, %r)
import numpy as np
from utrain.trainer import Trainer
a = Trainer('model.flat', 'weights.wof')
b = Trainer('model.flat', 'weights.wof')
from utrain.sink import Sums
b.net.sink = Sums(b.net)     # sum gradients, update in apply()
w0 = {k: a.net.t[k].copy() for k in a.net.trainable}
rng = np.random.default_rng(1)
for i in range(6):
    x = rng.normal(size=(1, %d)).astype(np.float32)
    y = np.array([[float(i %% %d)]], np.float32)
    for t in (a, b):
        t.set_input(x); t.set_expected(y); t.train_step()
k0 = a.net.trainable[0]
r = a.net.rank.get(k0)
# numpy: a float64 loss gradient times a float32 row stays float64 until the update,
# where the summed path rounds it into its float32 sum first (ulps, Adam amplifies)
print(json.dumps([bool(np.allclose(a.net.t[k], b.net.t[k], rtol=1e-5, atol=1e-6)) for k in a.net.trainable]
                 + [all(not np.array_equal(a.net.t[k], w0[k]) for k in a.net.trainable)]
                 + [r is not None and bool(np.array_equal(a.net.t[k0][r[2]:], w0[k0][r[2]:]))]
                 + [len(a.net.sink.acc), len(b.net.sink.acc)]))
""" % (os.path.join(ROOT, 'micro'), n_in, n_cls)
    r = subprocess.run([sys.executable, '-c', code], cwd=out, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert all(res[:-2]), res            # equal, all changed, frozen rows kept
    assert res[-2] == 0 and res[-1] > 0  # batch 1 keeps no gradient sums


def test_ranked_checkpoint_resumes_and_exports(tmp_path):
    """A sparse update's checkpoint holds Adam state for the training channels only
    (state=): the trainer loads it back, and `export` of the .ckpt reads it with the
    folder's rank table, giving the weights trained.wof holds."""
    path = mlp(str(tmp_path / 'm.circle'), [6, 8, 4], seed=5)
    rng = np.random.default_rng(2)
    np.savez(str(tmp_path / 'd.npz'), x=rng.normal(size=(8, 6)).astype(np.float32),
             y=rng.integers(0, 4, 8))
    out = str(tmp_path / 'o')
    prepare(path, out, data=str(tmp_path / 'd.npz'), loss='scce', optimizer='adam', lr=0.05,
            batch=1, epochs=1, ranks='0:1/4')
    code, text = runner.run(out, python=True, stream=False)
    assert code == 0, text
    ckpt = os.path.join(out, 'checkpoint.ckpt')
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'export', path, ckpt, '-o',
                        str(tmp_path / 'x.circle')], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    g = read_model(path)
    want = read_wof(os.path.join(out, 'trained.wof'), g)
    got = read_model(str(tmp_path / 'x.circle'))
    for k, a in want.items():
        assert np.array_equal(got.tensors[k].data, a)
    code = """
import sys
sys.path.insert(0, %r)
from utrain.trainer import Trainer
t = Trainer('model.flat', 'weights.wof')
t.load_checkpoint('checkpoint.ckpt')
k = t.net.trainable[0]
print(t.opt.m[k].shape, t.net.shape[k], t.epoch)
""" % os.path.join(ROOT, 'micro')
    r = subprocess.run([sys.executable, '-c', code], cwd=out, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ['(2,', '6)', '(8,', '6)', '1']


def test_the_plan_is_for_the_board_given(tmp_path):
    """Issue 14: --board plans for that board (32-bit words and 16 B GC blocks on rp2040
    and esp32; rp2040 loads npkern's and npasm's armv6m native code into its heap, esp32
    keeps npkern's in IRAM), without one for the simulated board in use; prepare says
    which."""
    from host_tools.plan import memory
    rp, esp = memory.target('rp2040'), memory.target('esp32')
    assert (rp['word'], rp['block'], rp['native'], rp['arch']) == (4, 16, 'heap', 'armv6m')
    assert (esp['word'], esp['native']) == (4, 'outside')
    assert memory.target()['word'] == runner.simulator_word()
    assert memory.array_bytes(1, 'ulab', rp) < memory.array_bytes(1, 'ulab')
    g = read_model(DIGITS_MLP)
    p = make_plan(g, [0, 1], {})
    s = dict(optimizer='adam', batch=4)
    plans = {b: memory.plan_heap(g, p, s, 'fallback', b) for b in ('rp2040', 'esp32')}
    native = memory.native_mpy_size('armv6m')
    assert native > 10_000
    # (and the RP2040's float kernels, npasm, beside it)
    assert plans['rp2040']['parts']['code'] - plans['esp32']['parts']['code'] == \
        native + memory.native_mpy_size('armv6m', 'npasm') - memory.WORD_FIGURES[4]['native']
    ulab = memory.plan_heap(g, p, s, 'ulab', 'rp2040')
    assert ulab['parts']['code'] < plans['rp2040']['parts']['code'] - native
    # a 32-bit board holds the same arrays in less heap than the 64-bit unix port
    big = memory.plan_heap(g, p, s, 'ulab', memory.Target(word=8, block=32, native='outside',
                                                           arch=None, fs='os', name='64'))
    assert ulab['parts']['optimizer state'] < big['parts']['optimizer state']
    r = subprocess.run([sys.executable, '-m', 'host_tools', 'prepare', DIGITS_MLP, '-o',
                        str(tmp_path / 'o'), '--loss', 'scce', '--board', 'rp2040'],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'heap plan (fallback, for rp2040: 32-bit, 16 B GC blocks, native code in the heap' in r.stdout
    with pytest.raises(ValueError, match="unknown board 'esp8266'"):
        memory.target('esp8266')


def test_budget_advice_counts_ops_as_the_file_does(tmp_path):
    """Each 'would fit' of the budget advice, given back to prepare as the user would
    type it (--train last:N and --ranks OP:R in the file's numbering, which `inspect`
    prints), plans the heap the advice promised.  digits_tico_cnn.circle loses and
    merges ops in the rewrites, so counting the rewritten graph would name other ops."""
    model = os.path.join(DIGITS, 'digits_tico_cnn.circle')
    assert len(read_model(model).ops) == 12
    with pytest.raises(PrepareError) as e:
        prepare(model, str(tmp_path / 'o'), loss='scce', from_logits=True, optimizer='adam',
                batch=4, budget='100K', backend='ulab')
    fits = advice_keeps_its_word(tmp_path, e, model, dict(optimizer='adam', batch=4),
                                 loss='scce', from_logits=True, backend='ulab', budget='100K')
    assert any('--train last:' in f for f in fits), str(e.value)
    # a shorter last:N is suggested only when it saves memory (1 KB or more) over a longer
    # one with the same other flags: never one that trains less for as much heap
    import re
    lasts = {}
    for flags, kb in re.findall(r'would fit: (.*)  \(about (\d+) KB\)', str(e.value)):
        m = re.search(r'--train last:(\d+)', flags)
        if m:
            lasts.setdefault(flags.replace(m.group(0), ''), []).append((int(m.group(1)), int(kb)))
    for group in lasts.values():
        group.sort(reverse=True)
        assert all(b[1] < a[1] for a, b in zip(group, group[1:])), str(e.value)


def advice_keeps_its_word(tmp_path, e, model, given, **kw):
    """Each 'would fit' of the refusal e, given back to prepare as the user would type it
    over the settings given, plans the heap it promised, within the limit, with no option
    prepare chose beside those the advice named, and with the frozen layers in row bands
    exactly where the advice said so; the suggestions."""
    import re
    fits = re.findall(r'would fit: (.*)  \(about (\d+) KB\)(.*)', str(e.value))
    assert fits, str(e.value)
    for flags, kb, note in fits:
        got = dict(given)
        args = flags.split()
        for i, a in enumerate(args):
            if a == '--batch':
                got['batch'] = int(args[i + 1])
            elif a == '--optimizer':
                got['optimizer'] = args[i + 1]
            elif a == '--momentum':
                got['momentum'] = float(args[i + 1])
            elif a == '--stream':
                got['stream'] = True
            elif a == '--train':
                got['train'] = args[i + 1]
            elif a == '--ranks':
                got['ranks'] = args[i + 1]
            elif a == 'without':        # (without --ranks)
                got.pop('ranks', None)
            elif a in ('--cache', '--cache-on-host'):
                got['cache'] = True if a == '--cache' else 'host'
            elif a == '--backend':
                got['backend'] = args[i + 1]
        out = tmp_path / 'p'
        s = prepare(model, str(out), **dict(kw, **got))     # (over the limit: refused)
        assert s['heap']['total'] // 1024 == int(kb), (flags, s['heap']['total'], str(e.value))
        assert not s.get('chose'), (flags, s['chose'])
        tables = [json.load(open(out / f)) for f in ('q8.json', 'q8t.json') if (out / f).exists()]
        banded = bool(s.get('bands')) or any(t.get('groups') for t in tables)
        assert banded == ('row bands' in note), (flags, note, banded)
    return [f for f, _, _ in fits]


def _advice_cases(tmp_path):
    """Small models over a budget or a board's heap, float and int8, whose refusals advise
    several kinds of settings (stream, host cache, bands, batch 1, last:N, the board's
    cache, a firmware), as (model, the settings prepare was given, the limits)."""
    from test_bands import mbnet
    from test_q8_sparse import build, build_res
    rng = np.random.default_rng(0)
    d48 = str(tmp_path / 'd48.npz')
    np.savez(d48, x=rng.random((6, 48, 48, 3)).astype(np.float32), y=np.arange(6) % 4)
    fl = mbnet(str(tmp_path / 'mb.circle'), H=48, W=48, c=8)
    head = mlp(str(tmp_path / 'head.circle'), [64, 512, 160, 96, 10])
    dh = str(tmp_path / 'dh.npz')
    np.savez(dh, x=rng.random((6, 64)).astype(np.float32), y=np.arange(6) % 10)
    q8 = build(str(tmp_path / 'q8.tflite'), dims=(40, 3, 16, 32), ds=2)
    d40 = str(tmp_path / 'd40.npz')
    np.savez(d40, x=rng.uniform(-1, 1, (6, 40, 40, 3)).astype(np.float32), y=np.arange(6) % 4)
    res = build_res(str(tmp_path / 'res.tflite'))
    d8 = str(tmp_path / 'd8.npz')
    np.savez(d8, x=rng.uniform(-1, 1, (6, 8, 8, 3)).astype(np.float32), y=np.arange(6) % 4)
    big = dict(train='all', optimizer='adam', batch=4)
    return {
        'float-mbnet-last1': (fl, dict(data=d48, from_logits=True, train='last:1'),
                              [dict(budget='100K')]),
        'float-mbnet-all': (fl, dict(data=d48, from_logits=True, **big),
                            [dict(budget='150K'), dict(board='rp2040', int8=False)]),
        'float-mlp': (head, dict(data=dh, **big), [dict(budget='200K'),
                                                   dict(board='esp32', int8=False)]),
        'float-as-int8': (fl, dict(data=d48, from_logits=True, train='all', int8=True),
                          [dict(budget='150K'), dict(board='esp32')]),
        'int8-conv': (q8, dict(data=d40, **big), [dict(budget='160K'), dict(board='rp2040')]),
        'int8-conv-momentum': (q8, dict(data=d40, **dict(big, optimizer='sgd', momentum=0.9)),
                               [dict(budget='200K')]),
        'int8-residual': (res, dict(data=d8, **big), [dict(budget='150K'), dict(board='esp32')]),
    }


ADVICE_CASES = ['float-mbnet-last1', 'float-mbnet-all', 'float-mlp', 'float-as-int8', 'int8-conv',
                'int8-conv-momentum', 'int8-residual']


@pytest.mark.parametrize('case', ADVICE_CASES)
def test_every_fit_advice_plans_what_it_said(tmp_path, case):
    """The advice of a refusal over --budget or --board and prepare with the flags it
    names are one computation: each suggestion, given, plans the figure it quoted, fits,
    needs no option prepare adds, and has row bands exactly where it said so.  The int8
    advice had priced the prefix pass in row bands where prepare then drops the bands
    (they are not needed to fit): an Edge Impulse MobileNetV1 96 on rp2040 was advised
    --batch 1 --cache --train last:4 at 163 KB and prepare planned 227 KB; here an int8
    conv net's --cache --train last:2 at 126 KB planned 138 KB."""
    model, given, limits = _advice_cases(tmp_path)[case]
    kw = dict(loss='scce', lr=0.05, epochs=1, log=lambda *a: None)   # (lr: no probe)
    for limit in limits:
        with pytest.raises(PrepareError) as e:
            prepare(model, str(tmp_path / 'o'), **kw, **given, **limit)
        advice_keeps_its_word(tmp_path, e, model, given, **kw, **limit)


def test_budget_advice_plans_row_bands_as_prepare_does(tmp_path):
    """The DS-CNN's classifier at 230 KB: its plan (276 KB) fits with --stream only
    because prepare then runs the frozen convolutions in row bands (196 KB; 299 without
    them); the advice planned --stream without bands and said nothing fits."""
    model = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'dscnn_kws_float.tflite')
    # (lr given: prepare's lr probe, nearly all of this test's seconds, does not run; the
    # plans and the advice do not depend on the lr)
    kw = dict(data=os.path.join(ROOT, 'bench', 'zoo', 'keras', 'dscnn_kws_data.npz'),
              loss='scce', budget='230K', lr=0.01)
    with pytest.raises(PrepareError) as e:      # (--stream off given and no --data for a
        prepare(model, str(tmp_path / 'o'), train='last:2', stream=False,   # host cache:
                **dict(kw, data=None))                                        # refused)
    fits = advice_keeps_its_word(tmp_path, e, model, dict(train='last:2', stream=False), **kw)
    assert fits[0] == '--stream', fits
    # not given, prepare chooses it (issue 28), planned as the advice said
    s = prepare(model, str(tmp_path / 'c'), train='last:2', log=lambda *a: None, **kw)
    assert s['chose'] == ['--stream'] and s['bands'], s['chose']


def test_a_ranked_conv_weight_is_summed_whole_at_batch_above_1(tmp_path):
    # op_conv adds its weight gradient tap by tap into a whole-shaped sum (WGRAD_WHOLE,
    # Sums.alloc), ranked or not: the planner counted it at the rank's size
    cnn = os.path.join(DIGITS, 'digits_cnn.circle')
    sums = {}
    for rank in ('1/2', 'all'):
        s = prepare(cnn, str(tmp_path / rank.replace('/', '_')), loss='scce', batch=4,
                    train='none', ranks='0:%s,5:bias' % rank)
        sums[rank] = s['heap']['parts']['gradient sums']
    assert sums['1/2'] == sums['all'] > 0


@pytest.mark.parametrize('where', ['python', 'micropython'])
def test_a_depthwise_rank_trains_exactly_its_channels(tmp_path, data, where):
    # a depthwise weight is [taps, C*M] on the device: a rank cuts its columns.  With only
    # that op training, SGD and one sample, the ranked run's channels equal the whole
    # run's (the gradient is taken before any update) and the others keep their values
    if where == 'micropython' and not MP:
        pytest.skip('no MicroPython')
    cnn = os.path.join(DIGITS, 'digits_cnn.circle')     # op 2: DEPTHWISE_CONV_2D, 8 -> 16
    z = np.load(data)
    np.savez(str(tmp_path / 'one.npz'), x=z['x'][:1], y=z['y'][:1])
    g = read_model(cnn)
    w_k, b_k = g.ops[2].inputs[1], g.ops[2].inputs[2]
    got = {}
    for rank in ('all', '1/2', '1/4'):
        out = str(tmp_path / rank.replace('/', '_'))
        prepare(cnn, out, data=str(tmp_path / 'one.npz'), loss='scce', optimizer='sgd', lr=0.5,
                batch=1, epochs=1, train='none', ranks='2:' + rank)
        code, text = runner.run(out, python=where == 'python', stream=False)
        assert code == 0, text
        got[rank] = read_wof(os.path.join(out, 'trained.wof'), g)
    w0, b0 = g.tensors[w_k].data.reshape(-1, 16), g.tensors[b_k].data
    full_w, full_b = got['all'][w_k].reshape(-1, 16), got['all'][b_k]
    assert not np.allclose(full_w, w0)
    for rank, hi in (('1/2', 8), ('1/4', 4)):
        w, b = got[rank][w_k].reshape(-1, 16), got[rank][b_k]
        np.testing.assert_allclose(w[:, :hi], full_w[:, :hi], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b[:hi], full_b[:hi], rtol=1e-5, atol=1e-7)
        assert np.array_equal(w[:, hi:], w0[:, hi:]) and np.array_equal(b[hi:], b0[hi:])


@pytest.mark.slow
@needs_mp
def test_a_channel_window_is_not_a_prefix_start(tmp_path):
    """Issue 28: plan_heap named the prefix cache's first op and a ranked tensor's channel
    window start both `lo`, so a `low` rank (channels [O/2, O)) was planned as if the
    board ran from op O/2 on (the digits CNN's classifier: 104.8 KB planned, 112.6 KB
    needed), and an `up` rank (window start 0) dropped a host-made prefix cache from the
    plan.  Which half of the channels trains moves no byte: `up` and `low` of an even
    number of channels plan the same heap, with and without a host cache, and the run
    trains in the plan of `low`."""
    model = str(tmp_path / 'cnn.circle')
    from host_tools.formats.refmodels import small_cnn
    small_cnn(model, size=12, channels=6, classes=6)
    rng = np.random.default_rng(1)
    npz = str(tmp_path / 'd.npz')
    np.savez(npz, x=rng.normal(size=(6, 12, 12, 1)).astype(np.float32), y=np.arange(6))
    plans = {}
    for cache in (False, 'host'):
        for rank in ('up', 'low'):
            for op in (0, 3):           # the conv's and the classifier's output channels
                out = str(tmp_path / f'{rank}{op}{cache}')
                s = prepare(model, out, data=npz, loss='scce', optimizer='adam', batch=1,
                            epochs=1, train='none', ranks=f'{op}:{rank}', cache=cache)
                plans[cache, rank, op] = s['heap']['total']
        assert plans[cache, 'up', 3] == plans[cache, 'low', 3], plans
        assert plans[cache, 'up', 0] == plans[cache, 'low', 0], plans
    runner.stage(out)                   # the host cache's run, classifier's low half
    assert trains_in(out, plans['host', 'low', 3])
    out = str(tmp_path / 'low3False')
    runner.stage(out)
    assert trains_in(out, plans[False, 'low', 3])


@pytest.mark.slow
def test_a_budget_chooses_the_memory_options_that_fit(tmp_path, data, head):
    """Issue 28: with --budget (or --board) prepare chooses the memory options the user
    left to it until the plan fits: --stream for frozen weights in RAM, --cache-on-host
    for a frozen prefix, --batch 1 for gradient sums; it says which and why, the run
    trains in the plan, and a flag the user gave wins (then it refuses, with advice)."""
    def prep(name, model, **kw):
        said = []
        s = prepare(model, str(tmp_path / name), data=data, loss='scce', epochs=1,
                    log=said.append, **kw)
        return s, [m for m in said if 'prepare chose' in m]

    # frozen weights in RAM (the head's first two layers): --stream
    whole, _ = prep('a', head, train='last:2', optimizer='sgd', batch=1)
    streamed, _ = prep('b', head, train='last:2', optimizer='sgd', batch=1, stream=True)
    budget = streamed['heap']['total'] + 2048
    assert whole['heap']['total'] > budget
    s, said = prep('c', head, train='last:2', optimizer='sgd', batch=1, budget=budget)
    assert s['chose'] == ['--stream'] and s['settings']['stream'], said
    assert len(said) == 1 and '--stream' in said[0] and 'frozen weights' in said[0], said
    assert s['heap']['total'] == streamed['heap']['total'] <= budget
    runner.stage(str(tmp_path / 'c'))
    assert trains_in(str(tmp_path / 'c'), s['heap']['total'])
    with pytest.raises(PrepareError, match='would fit: --stream'):
        prep('d', head, train='last:2', optimizer='sgd', batch=1, budget=budget, stream=False)
    # gradient sums of a batch: --batch 1 (streaming lowers nothing when all trains)
    b4, _ = prep('e', DIGITS_MLP, optimizer='adam', batch=4)
    b1, _ = prep('f', DIGITS_MLP, optimizer='adam', batch=1)
    budget = b1['heap']['total'] + 1024
    assert b4['heap']['total'] > budget
    s, said = prep('g', DIGITS_MLP, optimizer='adam', budget=budget, board='unix')
    assert s['chose'] == ['--batch 1'] and s['settings']['batch'] == 1, said
    with pytest.raises(PrepareError):
        prep('h', DIGITS_MLP, optimizer='adam', batch=4, budget=budget)
    # a frozen prefix's activations (a 32x32 conv's output): --cache-on-host
    cnn = str(tmp_path / 'cnn.circle')
    from host_tools.formats.refmodels import small_cnn
    small_cnn(cnn, size=32, channels=16, classes=4)
    rng = np.random.default_rng(0)
    img = str(tmp_path / 'img.npz')
    np.savez(img, x=rng.normal(size=(8, 32, 32, 1)).astype(np.float32), y=np.arange(8) % 4)
    kw = dict(data=img, loss='scce', epochs=1, train='last:2', optimizer='sgd', batch=1,
              stream=True, bands=0)
    full = prepare(cnn, str(tmp_path / 'i'), **kw)
    host = prepare(cnn, str(tmp_path / 'j'), cache='host', **kw)
    budget = host['heap']['total'] + 1024
    assert full['heap']['total'] > budget
    said = []
    s = prepare(cnn, str(tmp_path / 'k'), budget=budget, log=said.append, **kw)
    assert s['chose'] == ['--cache-on-host'] and s.get('prefix_cache'), said
    runner.stage(str(tmp_path / 'k'))
    assert trains_in(str(tmp_path / 'k'), s['heap']['total'])


@needs_mp
def test_trains_in_gives_the_run_an_open_stdin(tmp_path, monkeypatch):
    """The smallest-heap measurement runs train.py with stdin an open pipe with nothing
    on it, as `run` and a board's serial line do, however the measuring process was
    started: at its end (/dev/null) utrain.run's Ctrl-C poll reads it and goes, and the
    heap is laid out otherwise (issue 28's sweep: a DS-CNN's need moved by 25 KB)."""
    (tmp_path / 'train.json').write_text('{"run": {}}')
    (tmp_path / 'probe.py').write_text(
        'import select, sys\np = select.poll()\np.register(sys.stdin, 1)\n'
        'print("saved " if not p.poll(0) else "stdin at its end")\n')
    monkeypatch.setattr(runner, 'command', lambda out: ([MP, '-X', 'heapsize=1', 'probe.py'],
                                                         dict(os.environ)))
    null = os.open(os.devnull, os.O_RDONLY)
    saved = os.dup(0)
    os.dup2(null, 0)            # the measuring process's own stdin at its end
    try:
        assert trains_in(str(tmp_path), 256 * 1024)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(null)


def test_a_reshape_saved_with_its_input_is_planned_once(tmp_path):
    """A RESHAPE's output is a view of its input (utrain.op_shape, both array backends):
    the 12x12 CNN this test makes saves the pooled output for the pool's gradient and,
    reshaped, for the classifier's: one array and a view's header, not two arrays."""
    from host_tools.formats.refmodels import small_cnn
    from host_tools.plan.memory import array_bytes, sim_target
    model = small_cnn(str(tmp_path / 'c.circle'), seed=5, size=12, channels=4, classes=3)
    rng = np.random.default_rng(5)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((4, 12, 12, 1)).astype(np.float32), y=rng.integers(0, 3, 4))
    for arrays in ('fallback', 'ulab'):
        s = prepare(model, str(tmp_path / arrays), data=data, loss='scce', lr=0.01, epochs=1,
                    log=lambda *a: None, backend=arrays, optimizer='sgd', batch=1, train='all')
        t = sim_target(8 if '64-bit' in s['heap']['target'] else 4)
        A = lambda n: array_bytes(n, arrays, t)     # noqa: E731
        # the sample (the conv's weight gradient), the conv's output (its fused RELU; the
        # pool's input), the pool's output (its own gradient), its reshaped view (the FC's)
        # and the softmax's output
        assert s['heap']['parts']['saved activations'] == A(144) + A(144 * 4) + A(36 * 4) + A(0) + A(3)


def test_the_biases_only_advice_is_the_same_on_every_firmware(tmp_path):
    """The fit advice's biases-only candidate (each op that has a bias trains it alone,
    --train none where some weighted op has none) is planned for this firmware and, when
    nothing fits, for firmwares with ulab or utrain frozen in: the same --train and
    --ranks on every one (memory.biases_only; the two lists once built it apart)."""
    from host_tools.formats.circle_io import read_model
    from host_tools.graph.inout import save_graph
    from host_tools.formats.refmodels import small_cnn
    from host_tools.plan.memory import fit_advice
    g = read_model(small_cnn(str(tmp_path / 'c.circle'), size=12, classes=4))
    conv = [op for op in g.ops if op.name == 'CONV_2D'][0]
    fc = [op for op in g.ops if op.name == 'FULLY_CONNECTED'][0]
    conv.inputs[2] = -1                 # a conv without a bias (Keras's use_bias=False)
    save_graph(g, str(tmp_path / 'nobias.circle'))
    g = read_model(str(tmp_path / 'nobias.circle'))
    asked = []

    def planned(tr, rk, settings, cache, backend):
        asked.append((tr, rk, cache, backend))
        return None                     # nothing fits: every firmware is tried
    heap = {'parts': {'code': 40 << 10, 'interpreter': 17 << 10}}
    for ranks in ({}, {fc.index: 4}):
        asked.clear()
        fit_advice(g, dict(batch=4, optimizer='adam'), {conv.index, fc.index}, ranks,
                   'fallback', 1024, heap, planned)
        only = {b: (tr, rk) for tr, rk, c, b in asked
                if c == 'host' and rk and set(rk.values()) == {1}}
        assert set(only) == {'fallback', 'ulab', 'fallback-frozen', 'ulab-frozen'}, asked
        assert all(v == ('none', {fc.index: 1}) for v in only.values()), only


# issue 28's sweep (mpu32-ulab = 32-bit unix MicroPython with ulab; Pico ulab = the rp2
# firmware with ulab in rp2040js): the 16x16 CNN's smallest heaps, last op trained, SGD
# batch 1, 8 random samples, one epoch (bisected at 1.5 % of the plan)
STREAMED_NEEDS = {'sim32': 81872, 'rp2040': 89 * 1024}


def test_streaming_is_planned_as_the_build_holds_it(tmp_path):
    """Streaming's own heap beside its code and slot buffers is its open file and chunk
    generator: 32 B and 80-150 B on a 32-bit unix build, a littlefs board's file cache
    besides.  Planned at 1 KB on both, the 16x16 CNN streamed was 2.6 KB above the same
    net with its frozen conv held and ranked (1.22x against 1.19x; their needs equal within
    the bisection's step).  Each plan stays at least the need measured on its build."""
    from host_tools.formats.refmodels import small_cnn
    model = small_cnn(str(tmp_path / 'c.circle'))
    rng = np.random.default_rng(0)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((8, 16, 16, 1)).astype(np.float32), y=rng.integers(0, 5, 8))
    plans = {}
    for name, kw in (('stream', dict(train='last:2', stream=True)),
                     ('held', dict(train='none', ranks='3:up'))):
        s = prepare(model, str(tmp_path / name), data=data, loss='scce', from_logits=True,
                    lr=0.01, epochs=1, log=lambda *a: None, backend='ulab', optimizer='sgd',
                    batch=1, **kw)
        plans[name] = s['heap']['by_target']
    for t, need in STREAMED_NEEDS.items():
        assert plans['stream'][t] >= need, (t, plans['stream'][t], need)
    # the stream module's code (1.3 KB) and its buffers' share, not 2.6 KB more (a unix
    # build); a littlefs board's open file besides
    assert plans['stream']['sim32'] - plans['held']['sim32'] < 2048, plans
    assert plans['stream']['rp2040'] - plans['stream']['sim32'] > \
        plans['held']['rp2040'] - plans['held']['sim32'] + 512, plans


# what an int8 net's load of weights.wof holds for a model of n tensors (utrain.q8 Q8Net:
# the sizes list it checks the table against, then the offset table it keeps), after a
# collection, for each n in NS
_WOF_MEM = r"""
import gc
from utrain import wof
for n in NS:
    wof.save_wof('t%d.wof' % n, n, {k: bytearray(8) for k in range(0, n, 3)})
for n in NS:
    nb = f = offs = None
    gc.collect()
    a0 = gc.mem_alloc()
    nb = [None] * n
    for k in range(0, n, 3):
        nb[k] = 8
    f = wof.openr('t%d.wof' % n)
    offs = wof.read_table(f, 't.wof', nb, nb)[0]
    f.close()
    f = None
    gc.collect()
    print(n, gc.mem_alloc() - a0, offs[3] - offs[0])
"""


@needs_mp
def test_the_int8_plan_counts_what_the_weights_load_holds_a_tensor(tmp_path):
    """Issue 28: an int8 net keeps weights.wof's offset table, an entry a tensor of the
    whole model (q8t.json's net too), and holds the list of sizes it is checked against
    while its buffers are made; the PyTorch MobileNetV2 w62 file's 270 tensors needed 751 B
    over a 32-bit plan that counted neither.  plan_heap_q8's net (_q8_net) grows with the
    table's tensor count: its part for them bounds what the board's load holds (measured
    on the unix builds: $MICROPYTHON's and, when set, $UTRAIN_MP32's), within 1.2x."""
    from host_tools.plan.memory import _q8_net, sim_target
    builds = [MP] + [os.environ[v] for v in ('UTRAIN_MP32',) if os.path.exists(os.environ.get(v) or '/-')]
    NS = (4, 30, 300, 630)     # (the first: imports and first-call allocations)
    lut = {'k': 0, 'zx': 0, 'zy': 0, 'lo': -128, 'hi': 127, 'nout': 8, 'in': [0], 'out': 1}
    script = tmp_path / 'wofmem.py'
    script.write_text('NS = %r\n' % (NS,) + _WOF_MEM)
    for mp in builds:
        r = subprocess.run([mp, '-X', 'heapsize=1M', str(script)], cwd=tmp_path,
                           env=dict(os.environ, MICROPYPATH=runner.MICRO), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        held = {int(n): int(h) for n, h, step in (line.split() for line in r.stdout.split('\n') if line)}
        assert {int(line.split()[2]) for line in r.stdout.split('\n') if line} == {8}     # (read back)
        w = 8 if held[630] - held[30] > 600 * 11 else 4      # (the build's word: 12 B a tensor or 8)
        t = sim_target(w)
        for n in NS[1:]:
            table = {'ntensors': n, 'nin': 8, 'layers': [dict(lut, t=list(range(-128, 128)))]}
            parts = _q8_net(table, {}, w, t['block'], trains=False)
            plan = sum(v for k, v in parts.items() if 'offset table' in k)
            # (a block of the measure is the collector's: a stale word on the C stack)
            assert held[n] - t['block'] <= plan <= 1.2 * held[n], (mp, n, held[n], plan)


# The activation kernels (utrain/op_act.py) measured on a 32-bit build with ulab: the
# heap a kernel allocates forward and backward with the collector off (every array it
# makes, live or garbage) on a 16 x 128 input, against the planner's figures for the op
# (OpSpec fwd, bwd: output- and input-sized arrays); 1 KB besides for the small objects
# (boxed floats, argument tuples).  HARD_SWISH had been planned 4 arrays each way (it
# makes 5 forward, 5 and two byte masks backward: a held-out Keras hard_swish CNN, SGD
# b1, failed in its backward 4 KB under its plan on 32-bit ulab and Adam b4 trained 0.5 %
# under its plan on the 32-bit fallback), ELU 4 forward (and a mask), SOFTMAX 3 backward
# (it makes 4).
_ACT_MEM = r'''
import gc
from utrain.xnp import np
import utrain.op_act as A
R, C = 16, 128
class RT:
    def __init__(s):
        s.t, s.dead = {}, (0,)
    def add_grad(s, k, g):
        s.g = g
for code, opts in CASES:
    for rep in (0, 1):      # (the first: imports and first-call allocations)
        rt = RT()
        x = np.zeros((R, C))
        for i in range(R):
            for j in range(C):
                x[i, j] = ((i * C + j) % 17 - 8) * 0.7
        rt.t[0] = x
        op = (code, (0,), (1,), opts)
        dy = np.zeros((R, C)) + 0.5
        gc.collect()
        gc.disable()
        a0 = gc.mem_alloc()
        A.forward(rt, op)
        a1 = gc.mem_alloc()
        A.backward(rt, op, dy, 1)
        a2 = gc.mem_alloc()
        gc.enable()
    print(code, a1 - a0, a2 - a1)
'''


@pytest.mark.skipif(not os.path.exists(os.environ.get('UTRAIN_MP32_ULAB') or '/-'),
                    reason='$UTRAIN_MP32_ULAB names no build')
def test_activation_temporaries_are_planned_as_allocated(tmp_path):
    from types import SimpleNamespace
    from host_tools.graph.optable import SPECS
    from host_tools.plan.memory import array_bytes, sim_target
    opts = {'LEAKY_RELU': (0.25,), 'SOFTMAX': (1.0,)}
    names = sorted(n for n, s in SPECS.items() if s.kernel == 'op_act')
    assert 'HARD_SWISH' in names and 'ELU' in names and 'SOFTMAX' in names
    cases = [(SPECS[n].code, opts.get(n, ())) for n in names]
    script = tmp_path / 'actmem.py'
    script.write_text('CASES = %r\n' % (cases,) + _ACT_MEM)
    r = subprocess.run([os.environ['UTRAIN_MP32_ULAB'], '-X', 'heapsize=4M', str(script)],
                       env=dict(os.environ, MICROPYPATH=runner.MICRO), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    got = {int(c): (int(f), int(b)) for c, f, b in (line.split() for line in r.stdout.split('\n') if line)}
    A = array_bytes(16 * 128, 'ulab', sim_target(4))
    # (an op's own backward figures, bwd_of: on a [16, 128] activation, the pieces' floats in one array)
    t = SimpleNamespace(shape=(16, 128))
    op, g = SimpleNamespace(inputs=[0], outputs=[0], options={}), SimpleNamespace(tensors=[t])
    bad = []
    for n in names:
        s = SPECS[n]
        op.name = n
        fwd, bwd = got[s.code]
        fo, fi, fc = s.fwd_of(op, g, 'ulab') if s.fwd_of else s.fwd + (0,)
        plan_f = (1 + fo + fi) * A + (array_bytes(fc, 'ulab', sim_target(4)) if fc else 0) + 1024
        bo, bi, pc = s.bwd_of(op, g, 'ulab')[:3] if s.bwd_of else s.bwd + (0,)
        plan_b = (bo + bi) * A + (array_bytes(pc, 'ulab', sim_target(4)) if pc else 0) + 1024     # (each passes its gradient on)
        if fwd > plan_f or bwd > plan_b:
            bad.append(f'{n}: forward {fwd} B (planned {plan_f}), backward {bwd} B (planned {plan_b})')
    assert not bad, '\n'.join(bad)


def _conv_mean_fc(b, r, x, src, q, channels, classes, path, half=False):
    """The nets' tail after their first map src: conv 3x3 stride 2 to 2 x channels (RELU),
    x 0.5 (half), MEAN over the q x q positions, FC to classes; saved to path."""
    d = b.tensor('d', [1, q, q, 2 * channels])
    b.op('CONV_2D', [src, b.tensor('w2', [2 * channels, 3, 3, channels],
                                   data=r.normal(0, 0.2, (2 * channels, 3, 3, channels)).astype(np.float32)),
                     b.tensor('b2', [2 * channels], data=np.zeros(2 * channels, np.float32))], [d],
         padding='SAME', stride_w=2, stride_h=2, fused_activation_function='RELU')
    if half:
        e = b.tensor('e', [1, q, q, 2 * channels])
        b.op('MUL', [d, b.tensor('s', [], data=np.array(0.5, np.float32))], [e])
        d = e
    m = b.tensor('m', [1, 2 * channels])
    b.op('MEAN', [d, b.tensor('ax', [2], data=np.array([1, 2], np.int32))], [m], keep_dims=False)
    y = b.tensor('y', [1, classes])
    b.op('FULLY_CONNECTED', [m, b.tensor('fw', [classes, 2 * channels],
                                         data=r.normal(0, 0.4, (classes, 2 * channels)).astype(np.float32)),
                             b.tensor('fb', [classes], data=np.zeros(classes, np.float32))], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(path)


def _prepared_on(build, monkeypatch, tmp_path, make, shape=(28, 28, 1), classes=4, n=8,
                 **kw):
    """(prepare's summary, the folder) of the net make(path) on n random samples of shape
    (classes labels) for the 32-bit build $build (skipped without it), its arrays the
    build's."""
    if not os.path.exists(os.environ.get(build) or '/-'):
        pytest.skip(f'${build} names no build')
    monkeypatch.setenv('MICROPYTHON', os.environ[build])
    model = make(str(tmp_path / 'm.circle'))
    rng = np.random.default_rng(3)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((n,) + tuple(shape)).astype(np.float32),
             y=rng.integers(0, classes, n))
    out = str(tmp_path / 'o')
    return prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=1,
                   log=lambda *a: None, backend='ulab' if build.endswith('ULAB') else 'fallback',
                   **kw), out


def _hswish_cnn(path, size=28, channels=8, classes=4):
    """A conv (stride 2, channels) -> HARD_SWISH -> conv (stride 2) -> MUL -> MEAN -> FC net
    (the held-out ho_hswish's layout at another size and width)."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(5)
    b = CircleBuilder(description='utrain test: hard_swish CNN')
    h, q = size // 2, size // 4
    x = b.tensor('x', [1, size, size, 1])
    c = b.tensor('c', [1, h, h, channels])
    b.op('CONV_2D', [x, b.tensor('w1', [channels, 3, 3, 1], data=r.normal(0, 0.4, (channels, 3, 3, 1)).astype(np.float32)),
                     b.tensor('b1', [channels], data=np.zeros(channels, np.float32))], [c],
         padding='SAME', stride_w=2, stride_h=2)
    a = b.tensor('a', [1, h, h, channels])
    b.op('HARD_SWISH', [c], [a])
    return _conv_mean_fc(b, r, x, a, q, channels, classes, path, half=True)


# issue 28: HARD_SWISH's forward makes five arrays, but in a run that collects every
# gc_every bytes (fewer than one of them) each is made after a collection, so the dead
# ones are gone (OpSpec.fwd_live); planned as made, the held-out ho_hswish (32-bit ulab),
# frozen up to the activation (streamed, ranked), was 1.20-1.22x its need (now
# 1.14-1.15); trained whole, its backward (planned as made) is the peak
HSWISH_CASES = {
    'last2-stream': dict(optimizer='sgd', batch=1, train='last:2', stream=True),
    'ranks-up': dict(optimizer='sgd', batch=1, train='none', ranks='5:up'),
    'all-sgd-b1': dict(optimizer='sgd', batch=1, train='all'),
}


@pytest.mark.slow
@pytest.mark.parametrize('build', ['UTRAIN_MP32_ULAB', 'UTRAIN_MP32'])
@pytest.mark.parametrize('case', list(HSWISH_CASES))
def test_a_frozen_hard_swish_is_planned_within_1_2x(tmp_path, monkeypatch, case, build):
    """A hard_swish CNN this test makes (28x28, 8 channels), trained above its activation
    (its peak HARD_SWISH's forward) and whole (through its backward), each planned at the
    arrays it holds at once: it trains in its plan and not in plan / 1.2 (32-bit builds,
    with and without ulab)."""
    s, out = _prepared_on(build, monkeypatch, tmp_path, _hswish_cnn, **HSWISH_CASES[case])
    plan = s['heap']['total']
    assert s['heap']['gc_every'] <= 4 * 14 * 14 * 8      # (collected before each of them)
    runner.stage(out)
    assert trains_in(out, plan), f'{case}: does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), \
        f'{case}: trains in {int(plan / 1.2)} B, the plan ({plan} B) is over 1.2x the need'


def _relu_cnn(path, size=28, channels=8, classes=4, dw=True):
    """A conv (1 -> channels, stride 1, no activation; dw: a depthwise one of multiplier
    channels, as a PyTorch Conv2d(1, channels) comes through ONNX) -> standalone RELU ->
    MAX_POOL 2 -> conv (stride 2, RELU) -> MEAN -> FC net, whose first map is the largest."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(6)
    b = CircleBuilder(description='utrain test: standalone RELU CNN')
    h, q = size // 2, size // 4
    x = b.tensor('x', [1, size, size, 1])
    c = b.tensor('c', [1, size, size, channels])
    shape = [1, 3, 3, channels] if dw else [channels, 3, 3, 1]
    b.op('DEPTHWISE_CONV_2D' if dw else 'CONV_2D',
         [x, b.tensor('w1', shape, data=r.normal(0, 0.4, shape).astype(np.float32)),
          b.tensor('b1', [channels], data=np.zeros(channels, np.float32))], [c],
         padding='SAME', **(dict(depth_multiplier=channels) if dw else {}))
    a = b.tensor('a', [1, size, size, channels])
    b.op('RELU', [c], [a])
    p = b.tensor('p', [1, h, h, channels])
    b.op('MAX_POOL_2D', [a], [p], padding='VALID', stride_w=2, stride_h=2, filter_width=2,
         filter_height=2)
    return _conv_mean_fc(b, r, x, p, q, channels, classes, path)


@pytest.mark.slow
@pytest.mark.parametrize('first,build', [('depthwise', 'UTRAIN_MP32_ULAB'), ('depthwise', 'UTRAIN_MP32'),
                                         ('conv', 'UTRAIN_MP32_ULAB')])
def test_a_relu_on_its_dying_input_and_a_max_pool_are_planned_as_they_allocate(
        tmp_path, monkeypatch, first, build):
    """utrain.op_act clips a large input in place where it dies at a standalone RELU
    (rt.dead): the output is no array of its own; op_pool's max pool makes a row's
    np.maximum at a time (under ulab, and its copy; the fallback's native steps none), not
    two output-sized arrays.  A CNN this test makes (28x28, a frozen 1 -> 8 conv, a RELU on
    its 25 KB map, a 2x2 max pool, the last two ops trained) trains in its plan and not in
    plan / 1.15 (issue 28, session 26: the held-out ONNX conv net of that layout was
    1.31-1.35x its need on 32-bit ulab, frozen below its last two ops: the RELU planned a
    copy of the map; now 1.06-1.08x.  Here: 1.36x on main on 32-bit ulab, 1.07 now; the
    1-channel CONV_2D 1.37 -> 1.09; on the 32-bit fallback, the pool's two maps, 1.31 -> 1.10)."""
    s, out = _prepared_on(build, monkeypatch, tmp_path,
                          lambda p: _relu_cnn(p, dw=first == 'depthwise'),
                          optimizer='sgd', batch=1, train='last:2')
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.15)), \
        f'trains in {int(plan / 1.15)} B, the plan ({plan} B) is over 1.15x the need'


def test_trains_in_makes_every_run_a_first_run(tmp_path, monkeypatch):
    """Each smallest-heap run starts from the folder as prepare left it: the log,
    checkpoint and trained weights an earlier run wrote are gone (with train.log there a
    run skips its header and lays the heap out otherwise: the Keras DS-CNN, --ranks
    10:low on 32-bit ulab, trained in 220 KB after a run and needed 241-244 KB as a first
    run), and the files prepare wrote stay."""
    files = dict(model='model.flat', weights='weights.wof', train='train.ds', test=None,
                 checkpoint='checkpoint.ckpt', out='trained.wof', log='train.log')
    (tmp_path / 'train.json').write_text(json.dumps({'files': files, 'run': {}}))
    for f in ('model.flat', 'weights.wof', 'train.ds', 'train.log', 'checkpoint.ckpt',
              'checkpoint.ckpt.tmp', 'trained.wof', 'trained.wof.best'):
        (tmp_path / f).write_text('x')
    (tmp_path / 'probe.py').write_text(
        'import os\nprint("saved " + " ".join(sorted(f for f in os.listdir(".") if f != "probe.py")))\n')
    monkeypatch.setattr(runner, 'command', lambda out: ([MP, '-X', 'heapsize=1', 'probe.py'],
                                                         dict(os.environ)))
    assert trains_in(str(tmp_path), 256 * 1024)
    assert sorted(os.listdir(tmp_path)) == ['model.flat', 'probe.py', 'train.ds', 'train.json',
                                            'weights.wof']


def test_the_emulated_picos_runs_are_each_a_first_run(tmp_path, monkeypatch):
    """The emulated Pico's smallest-heap runs (boards/pico.py smallest_heap, bench/sweep.py
    --pico) copy back what the board wrote: each run starts without the log, checkpoint,
    trained weights and board-made prefix cache of the run before, as trains_in's do
    (the int8 sweep of session 20 had bisected every Pico cell with them there)."""
    from host_tools.boards import pico
    sys.path.insert(0, ROOT)
    from bench.sweep import pico_trains
    files = dict(model='q8.json', weights='weights.wof', train='train.ds', test=None,
                 checkpoint='checkpoint.ckpt', out='trained.wof', log='train.log')
    (tmp_path / 'train.json').write_text(json.dumps({'files': files, 'run': {}}))
    for f in ('q8.json', 'weights.wof', 'train.ds'):
        (tmp_path / f).write_text('x')
    seen = []

    def run_folder(d, ulab=False, heap=None, stream=True, timeout=None):
        seen.append(sorted(os.listdir(d)))
        for f in ('train.log', 'checkpoint.ckpt', 'trained.wof', 'train.ds.pfx'):
            (tmp_path / f).write_text('x')     # (what a run copies back)
        return (0 if heap >= 100 * 1024 else 1), ''
    monkeypatch.setattr(pico, 'run_folder', run_folder)
    monkeypatch.setattr(pico, 'gc_total', lambda ulab=False: (240 * 1024, 236 * 1024))
    got = pico.smallest_heap(str(tmp_path), lo=64 * 1024, hi=200 * 1024, step=4096)
    assert 100 * 1024 <= got <= 100 * 1024 + 2 * 4096, got
    trains, _ = pico_trains(False)
    assert trains(str(tmp_path), 120 * 1024) and not trains(str(tmp_path), 90 * 1024)
    first = ['q8.json', 'train.ds', 'train.json', 'weights.wof']
    assert len(seen) > 3 and all(s == first for s in seen), seen


_BWD_MEM = r'''
import gc
from utrain.xnp import zeros
import utrain.op_conv as C
import utrain.op_elem as E
import utrain.op_shape as S
class Sink:
    def __init__(s, shape):
        s.shape = shape
    def grad(s, k, g=None):
        if g is None:
            return zeros(s.shape[k])
class RT:
    def __init__(s, shape, gin):
        s.shape, s.t, s.g, s.gin, s.dead = shape, {}, {}, gin, ()
        s.sink = Sink(shape)
        s.base = s.peak = 0
    def add_grad(s, k, d):
        old = s.g.get(k)
        s.g[k] = d if old is None else old + d
        gc.collect()        # (what the op holds as it hands a gradient on)
        s.peak = max(s.peak, gc.mem_alloc() - s.base)
for name, kind, op, prior, flags in CASES:
    M = C if kind == 'C' else E if kind == 'E' else S
    for rep in (0, 1):      # (the first: imports and first-call allocations)
        rt = RT(SHAPES, tuple(op[1][1:]) if kind in 'ES' else ())
        for k in op[1]:
            if k >= 0:
                rt.t[k] = zeros(SHAPES[k]) + 0.5
        M.forward(rt, op)
        dy = zeros(SHAPES[op[2][0]]) + 0.25
        if prior:       # a second reader of the input gave its gradient first
            rt.g[op[1][0]] = zeros(SHAPES[op[1][0]])
        gc.collect()
        rt.base = gc.mem_alloc()
        M.backward(rt, op, dy, flags)
    print(name, rt.peak)
'''


def _residual_block(path, size=12, ch=8):
    """conv (NONE) -> conv (RELU) -> depthwise (NONE) -> ADD (RELU) of the first conv's
    output and the depthwise's, and an ADD without activation of the same two, squeezed."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(4)
    b = CircleBuilder(description='utrain test: residual block')
    s = [1, size, size, ch]
    x = b.tensor('x', s)
    t = [b.tensor(n, s) for n in ('c1', 'c2', 'd3', 'a4', 'a5')] + [b.tensor('q6', s[1:])]

    def w(n, shape):
        return b.tensor(n, shape, data=r.normal(0, 0.3, shape).astype(np.float32))
    one = dict(padding='SAME', stride_w=1, stride_h=1)
    b.op('CONV_2D', [x, w('w1', [ch, 3, 3, ch]), w('b1', [ch])], [t[0]], **one)
    b.op('CONV_2D', [t[0], w('w2', [ch, 3, 3, ch]), w('b2', [ch])], [t[1]],
         fused_activation_function='RELU', **one)
    b.op('DEPTHWISE_CONV_2D', [t[1], w('w3', [1, 3, 3, ch]), w('b3', [ch])], [t[2]],
         depth_multiplier=1, **one)
    b.op('ADD', [t[0], t[2]], [t[3]], fused_activation_function='RELU')
    b.op('ADD', [t[0], t[2]], [t[4]])
    b.op('SQUEEZE', [t[4]], [t[5]], squeeze_dims=[0])
    b.inputs(x)
    b.outputs(t[3], t[5])
    return b.save(path)


@needs_mp
def test_conv_and_residual_backward_are_planned_as_they_allocate(tmp_path):
    """The backward of a conv and of a residual ADD holds what the planner counts for it
    (bwd_temps, with a sum where the input's gradient meets one already in flight) as it
    hands its gradient on (after a collection: the arrays still referenced, on the
    fallback's arrays), and not an array more: a conv without activation holds only dx
    (and old + dx where a second reader gave its gradient first), an ADD hands dz on as
    both operands' gradients (the planner had two output- and two input-sized arrays for
    each, and the skip's gradient as one more: the held-out residual CNN 1.2x on 32-bit),
    a SQUEEZE (as EXPAND_DIMS) hands dy on reshaped (planned as four arrays: a Keras
    Conv1D net 1.2x)."""
    from types import SimpleNamespace
    from host_tools.graph.optable import SPECS
    from host_tools.graph.passes import device_shapes
    from host_tools.plan.memory import array_bytes, sim_target, bwd_temps
    g = read_model(_residual_block(str(tmp_path / 'res.circle')))
    shapes = device_shapes(g)
    word = runner.simulator_word()
    A = lambda n: array_bytes(n, 'fallback', sim_target(word))     # noqa: E731
    r = SimpleNamespace(g=g, arrays='fallback', A=A, s={})     # (_Run's: no --stream)
    # (name, op, a gradient of its input in flight, flags: DX | DW | DB, or DX for ADD)
    cases = [('conv', 0, False, 7), ('conv-second-reader', 0, True, 7), ('conv-relu', 1, False, 7),
             ('depthwise', 2, False, 7), ('add-relu', 3, False, 1), ('add', 4, False, 1),
             ('add-second-reader', 4, True, 1), ('squeeze', 5, False, 1)]
    ops = []
    for name, i, prior, flags in cases:
        op = g.ops[i]
        spec = SPECS[op.name]
        ops.append((name, {'op_conv': 'C', 'op_elem': 'E'}.get(spec.kernel, 'S'),
                    (spec.code, tuple(spec.inputs(op)), tuple(op.outputs),
                     tuple(float(v) for v in spec.options(op, g))), prior, flags))
    script = tmp_path / 'bwdmem.py'
    script.write_text('CASES = %r\nSHAPES = %r\n' % (ops, {k: tuple(s) for k, s in enumerate(shapes)})
                      + _BWD_MEM)
    res = subprocess.run([MP, '-X', 'heapsize=4M', str(script)],
                         env=dict(os.environ, MICROPYPATH=runner.MICRO, UTRAIN_NP='fallback'),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = {n: int(v) for n, v in (line.split() for line in res.stdout.split('\n') if line)}
    bad = []
    for name, i, prior, flags in cases:
        op = g.ops[i]
        spec = SPECS[op.name]
        bo, bi, pc, passed = bwd_temps(r, spec, op)
        n_out = int(np.prod(g.tensors[op.outputs[0]].shape))
        n_in = int(np.prod(g.tensors[op.inputs[0]].shape))
        skip = A(n_in) if spec.kernel == 'op_elem' and 1 not in passed else 0     # (ADD's second operand)
        plan = bo * A(n_out) + bi * A(n_in) + pc + skip + A(n_in) * prior
        if not got[name] <= plan + 1024 or not plan <= got[name] + A(n_in) // 2:
            bad.append(f'{name}: holds {got[name]} B handing its gradient on, planned {plan} B')
    assert not bad, '\n'.join(bad)


_ACT_NEW = r'''
import gc
from utrain.xnp import zeros
import utrain.npfallback as F
import utrain.op_act as M
N = [0, 0]      # bytes of the arrays' storage made (their temporaries too), arrays made
new = F._new
def _new(t, n):     # (the fallback's float loops box each value they read: garbage aside)
    b = gc.mem_alloc()
    gc.disable()
    a = new(t, n)
    N[0] += gc.mem_alloc() - b
    N[1] += 1
    gc.enable()
    return a
F._new = _new
class RT:
    def __init__(s):
        s.t, s.shape, s.g, s.dead = {}, SHAPES, {}, ()
    def add_grad(s, k, d):
        s.g[k] = d
for name, OP in OPS:
    for rep in (0, 1):      # (the first: imports and first-call allocations)
        rt = RT()
        rt.t[0] = zeros(SHAPES[0]) - 0.5
        rt.t[0][0] = 0.75       # (some values above 0 and 6)
        rt.t[0][1] = 7.0
        dy = zeros(SHAPES[1]) + 0.25
        N[0] = N[1] = 0
        M.forward(rt, OP)
        fwd = tuple(N)
        N[0] = N[1] = 0
        M.backward(rt, OP, dy, 1)
        bwd = tuple(N)
    print(name, *(fwd + bwd))
'''


def _copy_ops(path, h=12, ch=8):
    """x [1, h, h, ch] -> PAD, TRANSPOSE (inner and last axis moved), STRIDED_SLICE,
    CONCATENATION (last axis, an outer axis), ELU, RELU, RELU6, RELU_N1_TO_1."""
    from host_tools.formats.circle_build import CircleBuilder
    b = CircleBuilder(description='utrain test: copy ops')
    x = b.tensor('x', [1, h, h, ch])
    outs = []

    def op(name, shape, ins, consts=(), **options):
        ks = [b.tensor(f'k{len(outs)}_{j}', np.shape(v), data=np.array(v, np.int32))
              for j, v in enumerate(consts)]
        outs.append(b.tensor(f'y{len(outs)}', shape))
        b.op(name, ins + ks, [outs[-1]], **options)
        return outs[-1]
    op('PAD', [1, h + 2, h + 1, ch], [x], [[[0, 0], [1, 1], [0, 1], [0, 0]]])
    t = op('TRANSPOSE', [1, h, h, ch], [x], [[0, 2, 1, 3]])
    op('TRANSPOSE', [1, ch, h, h], [x], [[0, 3, 1, 2]])
    op('STRIDED_SLICE', [1, h // 2, h // 2, ch], [x], [[0, 0, 0, 0], [1, h, h, ch], [1, 2, 2, 1]])
    op('CONCATENATION', [1, h, h, 2 * ch], [x, t], axis=3)
    op('CONCATENATION', [1, 2 * h, h, ch], [x, t], axis=1)
    for name in ('ELU', 'RELU', 'RELU6', 'RELU_N1_TO_1'):
        op(name, [1, h, h, ch], [x])
    b.inputs(x)
    b.outputs(*outs)
    return b.save(path)


@needs_mp
def test_copy_ops_and_activations_are_planned_as_they_allocate(tmp_path):
    """PAD, TRANSPOSE, STRIDED_SLICE and CONCATENATION's backward hold each input's
    gradient (zeroed, dy's blocks copied in) as they hand it on, and no output-sized
    array (planned as two output- and two input-sized arrays: a PAD 4.5x what it holds);
    ELU makes forward a byte mask and four arrays, its output one of them, and backward
    a mask and three (exp's boxed floats aside: fallback arrays, gc.mem_alloc with the
    collector off; planned forward an array more than the mask: the held-out Conv1D +
    ELU net's peak, 1.17x its smallest 32-bit heap); a standalone RELU np.maximum's
    output, RELU6 and RELU_N1_TO_1 np.clip's two arrays, and backward a mask and where's
    result (two each for the clipping ones) (planned as four arrays forward and four
    backward: a RELU after a PReLU rewrite, the held-out PReLU CNN's ranked cells 1.22x
    on 32-bit)."""
    from types import SimpleNamespace
    from host_tools.graph.optable import SPECS
    from host_tools.graph.passes import device_shapes
    from host_tools.plan.memory import array_bytes, sim_target, bwd_temps, fwd_temps
    g = read_model(_copy_ops(str(tmp_path / 'copy.circle')))
    shapes = {k: tuple(s) for k, s in enumerate(device_shapes(g))}
    A = lambda n: array_bytes(n, 'fallback', sim_target(runner.simulator_word()))  # noqa: E731
    r = SimpleNamespace(g=g, arrays='fallback', A=A, every=0)
    env = dict(os.environ, MICROPYPATH=runner.MICRO, UTRAIN_NP='fallback')
    size = lambda k: int(np.prod(g.tensors[k].shape))      # noqa: E731
    ops = [(f'{op.index}-{op.name}', SPECS[op.name], op) for op in g.ops]
    cases = [(n, 'S', (s.code, tuple(s.inputs(op)), tuple(op.outputs),
                       tuple(float(v) for v in s.options(op, g))), False, 1)
             for n, s, op in ops if s.kernel == 'op_shape']
    script = tmp_path / 'bwdmem.py'
    script.write_text('CASES = %r\nSHAPES = %r\n' % (cases, shapes) + _BWD_MEM)
    res = subprocess.run([MP, '-X', 'heapsize=4M', str(script)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = {n: int(v) for n, v in (line.split() for line in res.stdout.split('\n') if line)}
    bad = []
    for name, spec, op in ops:
        if spec.kernel != 'op_shape':
            continue
        bo, bi, pc, _ = bwd_temps(r, spec, op)
        more = sum(A(size(k)) for k in op.inputs[1:]) if op.name == 'CONCATENATION' else 0
        plan = bo * A(size(op.outputs[0])) + bi * A(size(op.inputs[0])) + pc + more
        if not got[name] <= plan + 1024 or not plan <= got[name] + A(size(op.inputs[0])) // 2:
            bad.append(f'{name}: holds {got[name]} B handing its gradients on, planned {plan} B')
    acts = [(name, spec, op) for name, spec, op in ops if spec.kernel == 'op_act']
    script = tmp_path / 'actmem.py'
    script.write_text('OPS = %r\nSHAPES = %r\n' % (
        [(name, (spec.code, (0,), (1,), ())) for name, spec, op in acts],
        {0: shapes[g.inputs[0]], 1: shapes[g.inputs[0]]}) + _ACT_NEW)
    res = subprocess.run([MP, '-X', 'heapsize=4M', str(script)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = {ln.split()[0]: [int(v) for v in ln.split()[1:]] for ln in res.stdout.split('\n') if ln}
    n = A(size(g.inputs[0]))
    for name, spec, op in acts:
        v = got[name]
        fwd, bwd = (v[0] + v[1] * A(0), v[2] + v[3] * A(0))     # (each array's overhead too)
        fo, fi, pc = fwd_temps(r, spec, op)
        bo, bi, bpc, _ = bwd_temps(r, spec, op)
        for what, dev, plan in (('forward', fwd, (1 + fo + fi) * n + pc),
                                ('backward', bwd, (bo + bi) * n + bpc)):
            if not dev <= plan + 1024 or not plan <= dev + n // 2:
                bad.append(f'{name} {what}: allocates {dev} B, planned {plan} B')
    assert not bad, '\n'.join(bad)



_FREES = r'''
import gc
from utrain import flat
class Net:
    outputs = ()
n = 360         # (an unrolled GRU's ops: each frees its input, every other one saved)
kinds = bytearray(n)
sflags = bytearray([flat.SAVE, 0] * (n // 2))
last = list(range(1, n + 1))
last[-1] = flat.NO_USE
net = Net()
def frees(room):        # (does the call succeed with room bytes of the heap free?)
    gc.collect()
    b, m = [], 1 << 16          # (a ballast in pieces: the free heap is not one run)
    while m >= 16:
        while gc.mem_free() - m - 32 > room:
            try:
                b.append(bytearray(m))
            except MemoryError:
                break
        m //= 2
    try:
        flat._frees(net, kinds, sflags, last, n, n)
        return True
    except MemoryError:
        return False
    finally:
        b = net.free_infer = net.free_train = None
        gc.collect()
gc.collect()
base = gc.mem_alloc()
flat._frees(net, kinds, sflags, last, n, n)
gc.collect()
kept = gc.mem_alloc() - base
net.free_infer = net.free_train = None
lo, hi = 0, 8 * kept
while hi - lo > 64:
    mid = (lo + hi) // 2
    if frees(mid):
        hi = mid
    else:
        lo = mid
print(kept, hi)
'''


@needs_mp
def test_the_load_frees_lists_need_little_more_than_they_keep(tmp_path):
    """utrain.flat._frees (the per-op tuples of what dies there) needs no more free heap
    while it runs than about what it keeps: it held a dict of lists an op (two) while it
    made them, the load's largest transient, which stood over a ranked unrolled GRU's
    whole plan (the held-out hq_gru2 --ranks on 32-bit ulab failed loading its model
    in 121 KB, planned 117 KB; 116 KB now).  The free heap it needs bisected (64 B) under
    a ballast (in pieces) that leaves that much: 64-bit unix, 360 ops, 17 KB kept, 49 KB
    needed now (the lists made whole, beside garbage tuples), 95 KB with the dicts."""
    script = tmp_path / 'frees.py'
    script.write_text(_FREES)
    r = subprocess.run([MP, '-X', 'heapsize=512K', str(script)], capture_output=True, text=True,
                       env=dict(os.environ, MICROPYPATH=runner.MICRO, UTRAIN_NP='fallback'),
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    kept, need = (int(v) for v in r.stdout.split())
    assert need <= 4 * kept, (kept, need)



_WGRAD_MEM = r'''
import gc
from utrain.xnp import zeros
import utrain.op_conv as C
from utrain.sink import Apply
from utrain.optim import Optimizer
class Net:
    def __init__(s):
        s.shape, s.rank = SHAPES, {}
class RT:
    def __init__(s):
        s.shape, s.t, s.g, s.dead = SHAPES, {}, {}, ()
        s.net = Net()
        s.net.t = s.t
        o = Optimizer('sgd', 0.01)
        o.begin()
        s.sink = Apply(s.net, o)
    def add_grad(s, k, d):
        s.g[k] = d
rt = RT()
for k in OP[1]:
    rt.t[k] = zeros(SHAPES[k])
    rt.t[k][:] = 0.5        # (in place: no setup peak above the run's)
dy = zeros(SHAPES[OP[2][0]])
dy[:] = 0.25
C.backward(rt, OP, dy, 0)   # (imports and first-call allocations)
gc.collect()
if RUN:
    C.backward(rt, OP, dy, 2)
    rt.sink.end()
print('ok')
'''


@pytest.mark.parametrize('build', [
    pytest.param('UTRAIN_MP32', id='32'),
    pytest.param('UTRAIN_MP32_ULAB', id='32-ulab')])
def test_a_1x1_conv_weight_gradient_is_planned_as_it_allocates(tmp_path, build):
    """At SGD batch 1 a trained 1x1 conv's weight gradient and its step need one
    weight-sized array on the fallback (the sink's sum, which the step adds into the
    weight in place: xnp.add_scaled) and two under ulab (and utrain.ulconv's
    np.dot(dz.T, x) of [O, I] a tap: the whole gradient again for a 1x1 conv), within
    the planner's step_wsum (which keeps two on both: docs/memory.md, session 14 h43p).
    Measured as the smallest heap that runs the weight gradient and step less the one
    that stops before them (bisected on the 32-bit builds).  (Counting one under ulab,
    h42p's patch, would miss the product.)"""
    from types import SimpleNamespace
    from host_tools.formats.circle_build import CircleBuilder
    from host_tools.graph.optable import SPECS
    from host_tools.graph.passes import device_shapes
    from host_tools.plan.memory import array_bytes, sim_target, step_wsum
    mp = os.environ.get(build)
    if not mp or not os.path.exists(mp):
        pytest.skip('$%s names no build' % build)
    arrays = 'ulab' if 'ULAB' in build else 'fallback'
    n, px = 256, 16             # (a weight far above the imports' transient peak)
    r = np.random.default_rng(5)
    b = CircleBuilder(description='utrain test: a 1x1 conv')
    x, y = b.tensor('x', [1, 4, 4, n]), b.tensor('y', [1, 4, 4, n])
    w = b.tensor('w', [n, 1, 1, n], data=r.normal(0, 0.3, (n, 1, 1, n)).astype(np.float32))
    b.op('CONV_2D', [x, w], [y], padding='SAME', stride_w=1, stride_h=1)
    b.inputs(x)
    b.outputs(y)
    g = read_model(b.save(str(tmp_path / 'c.circle')))
    op, spec = g.ops[0], SPECS['CONV_2D']
    OP = (spec.code, tuple(spec.inputs(op)), tuple(op.outputs), tuple(float(v) for v in spec.options(op, g)))
    head = 'OP = %r\nSHAPES = %r\n' % (OP, {k: tuple(s) for k, s in enumerate(device_shapes(g))})

    def runs(run, heap):
        script = tmp_path / ('wgrad%d.py' % run)
        script.write_text(head + 'RUN = %d\n' % run + _WGRAD_MEM)
        res = subprocess.run([mp, '-X', 'heapsize=%d' % heap, str(script)],
                             env=dict(os.environ, MICROPYPATH=runner.MICRO, UTRAIN_NP=arrays),
                             capture_output=True, text=True, timeout=300)
        return res.stdout.strip() == 'ok'

    def smallest(run, lo=64 * 1024, hi=2048 * 1024):
        assert runs(run, hi) and not runs(run, lo)
        while hi - lo > 2048:
            m = (lo + hi) // 2
            lo, hi = (lo, m) if runs(run, m) else (m, hi)
        return hi
    need = smallest(1) - smallest(0)
    A = lambda k: array_bytes(k, arrays, sim_target(4))     # noqa: E731
    plan = step_wsum(SimpleNamespace(arrays=arrays, s=dict(optimizer='sgd', batch=1)), A(n * n))
    piece = A(px * n)           # (ulab: the copy of dz the product is made from)
    assert need <= plan + piece + 8192, (need, plan)
    assert need >= A(n * n) * (2 if arrays == 'ulab' else 1) - 8192, need      # (what it holds)


def test_advice_bisects_the_longest_last_n():
    """fit_advice finds the longest --train last:N that fits by bisection: it planned
    every N from the top (an ONNX GRU unrolled into 395 ops, 2 s a plan: prepare --board
    pico ran past half an hour); a plan that trains nothing (too few ops) asks for more."""
    from types import SimpleNamespace
    from host_tools.plan.memory import fit_advice, longest_last
    calls = []

    def cost(t):
        n = int(t.split(':')[1])
        calls.append(n)
        return None if n < 5 else 1000 * n

    assert longest_last(400, cost, 123456) == 'last:123' and len(calls) <= 10
    calls.clear()
    assert longest_last(400, cost, 4000) is None and len(calls) <= 10
    g = SimpleNamespace(ops=[SimpleNamespace(name='NONE_SUCH', inputs=[], outputs=[])] * 400)

    def planned(tr, rk, s, cache, backend):
        calls.append(tr)
        return 1000 * int(tr.split(':')[1]) + 500 * (cache != 'host') \
            if isinstance(tr, str) and tr.startswith('last:') else 10 ** 9
    calls.clear()
    heap = {'total': 10 ** 9, 'parts': {'code': 1, 'interpreter': 1}}
    text = fit_advice(g, {'batch': 1, 'optimizer': 'sgd', 'stream': True, 'cache': False},
                      [0], {}, 'fallback', 150000, heap, planned)
    assert '--train last:149 ' in text and '--train last:150 --cache-on-host' in text, text
    assert len(calls) < 60, len(calls)


def _c1d_prepared(tmp_path, arrays, act='RELU', **kw):
    """(the staged run folder, its plan): kerasgraphs' 1-D conv net (192 x 8 -> 16 -> 32,
    its convs' fused activation act) on 4 random samples, SGD with kw's settings."""
    from kerasgraphs import build_conv1d_stack
    model = build_conv1d_stack(tmp_path / 'c1d.tflite', act=act)
    rng = np.random.default_rng(0)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((4, 1, 192, 8)).astype(np.float32), y=rng.integers(0, 4, 4))
    out = str(tmp_path / 'o')
    s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=1,
                log=lambda *a: None, backend=arrays, optimizer='sgd', **kw)
    runner.stage(out)
    return out, s['heap']['total']

@pytest.mark.slow
@pytest.mark.parametrize('build, arrays', BUILDS_32)
def test_a_conv_streamed_by_rows_is_planned_as_convrows_runs_it(tmp_path, monkeypatch, build, arrays):
    """A frozen conv weight streamed by rows (--stream: utrain.convrows, either array
    backend) makes an [OW, m] product per step (m: the stream chunk's output channels)
    and its fused RELU in place on a large output: not ulab's whole-output pieces, nor a
    whole-output activation array.  A 1-D conv net this test makes (192 x 8 -> 16 -> 32,
    the last two ops trained, SGD b4) trains in its plan and not in plan / 1.25 on both
    32-bit builds (bisected over 8 samples: 1.19-1.20x its smallest heap; 1.41x on the
    fallback and 1.78x on ulab with the backend's figures; the zoo IMU net's streamed cell,
    SGD b4 on 32-bit ulab, 1.21x).  It fails on main."""
    monkeypatch.setenv('MICROPYTHON', os.environ[build])
    out, plan = _c1d_prepared(tmp_path, arrays, batch=4, train='last:2', stream=True)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.25)), \
        f'trains in {int(plan / 1.25)} B, the plan ({plan} B) is over 1.25x the need'


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.environ.get('UTRAIN_MP32_ULAB') or '/-'),
                    reason='$UTRAIN_MP32_ULAB names no build')
@pytest.mark.parametrize('kw', [dict(train='none', ranks='3:up'), dict(train='all')],
                         ids=['ranked', 'whole'])
def test_a_1d_conv_net_without_activations_is_planned_within_1_2x(tmp_path, monkeypatch, kw):
    """The 1-D conv net of the tests above without activations (192 x 8 -> 16 -> 32,
    NONE), SGD b1 on 32-bit ulab; trains in its plan, not in plan / 1.2.
    ranked (--ranks 3:up, the classifier's upper half: the forward pass is the peak):
    its second conv makes its 24 KB output and 2 KB pieces of a tap's product, no
    activation array (op_act.act returns y for NONE), and its output needs no run beyond
    the one 2 KB hole the first conv's pieces left (fresh_run).  Planned as an
    output-sized activation array and 22 KB of fresh run it was 1.45-1.55x its smallest
    heap (issue 28's held-out sweep: c1d_none, c1d192; 1.67x here on main; measured once,
    bisected over 8 samples: 127 KB planned, 113 KB needed, 1.12x).
    whole (the backward pass is the peak): MEAN's gradient was zeros(x) + d (a second
    24 KB array, the first garbage at once), which cut the heap the conv's dx and weight
    gradient come into next (bisected over these 4 samples: main planned 195 KB and it
    needed 158 KB, 1.23x); made in place it needs 135 KB, planned 158 KB (1.17x)."""
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    out, plan = _c1d_prepared(tmp_path, 'ulab', act='NONE', batch=1, **kw)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), \
        f'trains in {int(plan / 1.2)} B, the plan ({plan} B) is over 1.2x the need'


def test_a_freed_hole_takes_one_of_the_arrays_an_op_makes():
    """fresh_run: the arrays an op makes go into the holes the pass has freed one to a
    hole, largest first; an array longer than its hole needs the part beyond it.  ONNX
    c2's RELU6 (two 3.4 KB arrays) after a 1 -> 6 depthwise that freed a 3.4 KB spread
    copy and a 2 KB piece failed on 32-bit ulab with 17 KB free: one largest hole for
    every array had planned no run for the second (its forward peak then planned at the
    depthwise, 1.01x the need where bands followed)."""
    from host_tools.plan.memory import fresh_run
    assert fresh_run([3504, 3504], [3504, 2096]) == 3504 - 2096
    assert fresh_run([3504, 3504], []) == 0                  # (nothing freed: one run)
    assert fresh_run([1000, 0], [2096, 3504]) == 0
    # (arrays past the holes go where the free heap is one run: nothing beyond themselves)
    assert fresh_run([5000, 4000, 3000], [3504]) == 5000 - 3504
    # an exact GELU's 11 output-sized arrays after a LayerNorm's holes, 6 of their size and
    # 7 small: one array may run on from a small hole below the free heap; the others skip
    # theirs, which is all they leave behind (charged the part beyond each small hole, the
    # zoo's LayerNorm + GELU block trained last:2 on 32-bit was planned 1.3x its need)
    assert fresh_run([3184] * 11, [3184] * 6 + [144] * 7) == (3184 - 144) + 4 * 144
    # never more than the holes: a 1-D conv's 15 KB output after one 2 KB piece's hole
    # leaves that hole behind at worst (13 KB planned: issue 28's 1-D nets 1.3-1.55x)
    assert fresh_run([15408, 2096], [2096]) == 2096
    assert fresh_run([42000], [18000, 18000]) == 42000 - 18000


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.environ.get('UTRAIN_MP32_ULAB') or '/-'),
                    reason='$UTRAIN_MP32_ULAB names no build')
def test_a_1d_conv_net_trained_whole_trains_in_its_plan_on_32_bit_ulab(tmp_path, monkeypatch):
    """The held-out 1-D conv net of the streamed-conv test (192 x 8 -> 16 -> 32, RELU)
    trained whole at SGD b1 on 32-bit ulab: planned 256 KB, it fails its first sample's
    backward pass at 256-266 KB (ulconv's dW step making a 24 KB copy of dz's piece with
    145 KB free once the trainer is dropped) and trains from 270 KB (bisected over 8
    samples: 0.92-0.95x).  Found by session 24's held-out sweep.  ulconv's pieces are
    now _CH floats, not an image row at least (its dz copies 2 KB, not 24 KB), and
    its dW step holds one tap's [O, I] product, not a second weight (memory.step_wsum): 220 KB planned, 193 KB needed (1.14x; 0.92x on main)."""
    monkeypatch.setenv('MICROPYTHON', os.environ['UTRAIN_MP32_ULAB'])
    out, plan = _c1d_prepared(tmp_path, 'ulab', batch=1, train='all')
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.25)), \
        f'trains in {int(plan / 1.25)} B, the plan ({plan} B) is over 1.25x the need'


def _dws1d(path, n=64, c=32, m=48, classes=6):
    """A 1-D depthwise-separable net on [1, 1, n, 4] (the held-out dws1d_wide's layout):
    conv 4 -> c k3 (RELU), depthwise k5 (RELU), 1x1 conv c -> m (RELU), depthwise x2
    k3, a standalone RELU on its 2m-channel map, MEAN, FC."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(7)
    b = CircleBuilder(description='utrain test: 1-D depthwise-separable net')

    def w(name, shape):
        return b.tensor(name, list(shape), data=r.normal(0, 0.3, shape).astype(np.float32))

    def z(name, k):
        return b.tensor(name, [k], data=np.zeros(k, np.float32))
    x = b.tensor('x', [1, 1, n, 4])
    t = x
    layers = [('CONV_2D', (c, 1, 3, 4), 0, 'RELU'), ('DEPTHWISE_CONV_2D', (1, 1, 5, c), 1, 'RELU'),
              ('CONV_2D', (m, 1, 1, c), 0, 'RELU'), ('DEPTHWISE_CONV_2D', (1, 1, 3, 2 * m), 2, 'NONE')]
    for i, (kind, shape, mult, act) in enumerate(layers):
        o = shape[0] if kind == 'CONV_2D' else shape[-1]
        y = b.tensor(f't{i}', [1, 1, n, o])
        b.op(kind, [t, w(f'w{i}', shape), z(f'b{i}', o)], [y], padding='SAME',
             fused_activation_function=act, **(dict(depth_multiplier=mult) if mult else {}))
        t = y
    a = b.tensor('a', [1, 1, n, 2 * m])
    b.op('RELU', [t], [a])
    mm = b.tensor('mm', [1, 2 * m])
    b.op('MEAN', [a, b.tensor('ax', [2], data=np.array([1, 2], np.int32))], [mm], keep_dims=False)
    y = b.tensor('y', [1, classes])
    b.op('FULLY_CONNECTED', [mm, w('fw', (classes, 2 * m)), z('fb', classes)], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(path)


def _dws1d_on_32bit(tmp_path, monkeypatch, **kw):
    """(plan, folder) of _dws1d on 4 random samples for the 32-bit fallback build
    ($UTRAIN_MP32; skipped without it), staged."""
    s, out = _prepared_on('UTRAIN_MP32', monkeypatch, tmp_path, _dws1d, shape=(1, 64, 4),
                          classes=6, n=4, **kw)
    runner.stage(out)
    return s['heap']['total'], out


def test_the_backward_pass_is_planned_against_the_holes_it_finds(tmp_path, monkeypatch):
    """The backward pass's new arrays (a RELU's np.where gradient, a conv's dx) go where
    the passes have freed arrays, between the saved activations: an array longer than
    every such hole needs a run of its own (memory.backward_run).  _dws1d trained whole at
    SGD b1 on the 32-bit fallback: main planned 218 KB and it needs 222 KB (its
    RELU's 24 KB gradient failed with 77 KB free, as the held-out dws1d_wide's did:
    0.97x, issue 28 session 26); it trains in its plan now (1.04x)."""
    plan, out = _dws1d_on_32bit(tmp_path, monkeypatch, optimizer='sgd', batch=1)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), f'the plan ({plan} B) is over 1.2x the need'


def test_the_fallback_depthwise_forward_makes_no_input_sized_array(tmp_path, monkeypatch):
    """The fallback's depthwise forward (npfallback's native steps, any multiplier)
    writes into its output: no input-sized spread copy.  _dws1d's last two ops streamed
    at SGD b1 on the 32-bit fallback: main planned 165 KB for a 131 KB need (1.26x, the
    held-out dws1d_wide's streamed and ranked cells 1.23-1.26x); 1.12x after it.  Since
    the arena (session 28) the plan is 151 KB and the need moves with run.gc_every (the
    plan / 32) and the code's size: 121.8 KB (1.24x) and 130.0 KB (1.16x) a 151 B smaller
    run.mpy apart, so the bound here is 1.3x, which an input-sized array would break."""
    plan, out = _dws1d_on_32bit(tmp_path, monkeypatch, optimizer='sgd', batch=1, train='last:2',
                                stream=True)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.3)), f'the plan ({plan} B) is over 1.3x the need'


def test_a_fused_activations_output_is_planned_above_its_kernels_array(tmp_path, monkeypatch):
    """A conv with a fused RELU on a small output makes its kernel's array first and the
    RELU's result (np.maximum, the op's output) after it; the kernel's array dies, and
    the next op's arrays go into its hole (memory.op_need lays the output last).  Planned
    output first, _dws1d's three convs left holes under their outputs that the board had
    filled, and its 24 KB depthwise output was planned above a 16 KB hole: its last two
    ops streamed on the 32-bit fallback planned 148 KB for a 120 KB need (1.23x, main;
    the board's arrays traced with uctypes.addressof, session 30), 139 KB now."""
    plan, out = _dws1d_on_32bit(tmp_path, monkeypatch, optimizer='sgd', batch=1, train='last:2',
                                stream=True)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), f'the plan ({plan} B) is over 1.2x the need'


def test_gc_every_is_the_models_not_the_plans(tmp_path):
    """run.gc_every follows the model alone (memory.gc_bytes: 1/8 of its largest
    activation, on a 1 KB grid, at least 4 KB): _dws1d trained whole and its last two
    ops streamed have plans 60 KB apart and collect alike.  It had been 1/32 of the plan,
    and the need followed it byte for byte (session 29: _dws1d's streamed need on the
    32-bit fallback went between 118 and 136 KB over gc_every 1-9 KB)."""
    model = _dws1d(str(tmp_path / 'm.circle'))
    rng = np.random.default_rng(3)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((4, 1, 64, 4)).astype(np.float32),
             y=rng.integers(0, 6, 4))
    got = []
    for i, kw in enumerate((dict(train='all'), dict(train='last:2', stream=True))):
        out = str(tmp_path / str(i))
        s = prepare(model, out, data=data, loss='scce', from_logits=True, lr=0.01, epochs=1,
                    log=lambda *a: None, optimizer='sgd', batch=1, **kw)
        with open(os.path.join(out, 'train.json')) as f:
            got.append((s['heap']['total'], json.load(f)['run']['gc_every']))
    (p1, g1), (p2, g2) = got
    assert p1 - p2 > 32 * 1024
    assert g1 == g2 == 4 * 1024, got       # (its largest activation: 64 x 96 floats, 24 KB)


def test_the_need_stays_as_gc_every_moves(tmp_path, monkeypatch):
    """The run collects at op boundaries too, once the outputs made reach gc_every's bytes
    (utrain/model.py), so that the smallest heap that trains is the model's, not where a
    count of bytes happened to fall.  _dws1d's last two ops streamed on the 32-bit
    fallback: its need went 118.4, 126.7, 118.4, 126.7, 127.6 KB at gc_every 1.5, 2, 3,
    3.5, 4 KB on main (and 127.1 KB at the plan's 4717 B); 118.6-120 KB at each of them
    with the op-boundary collections (session 29), so all train in 123 KB.  (Its own
    gc_every is 4 KB: gc_bytes.)"""
    plan, out = _dws1d_on_32bit(tmp_path, monkeypatch, optimizer='sgd', batch=1, train='last:2',
                                stream=True)
    path = os.path.join(out, 'train.json')
    with open(path) as f:
        cfg = json.load(f)
    failed = []
    for every in (2048, 3584, 4096, 4608):
        cfg['run']['gc_every'] = every
        with open(path, 'w') as f:
            json.dump(cfg, f)
        if not trains_in(out, 123 * 1024):
            failed.append(every)
    assert not failed, f'does not train in 123 KB at gc_every {failed}'


def test_the_arena_lays_arrays_out_first_fit_and_merges_freed_neighbours():
    """memory.Arena: each array's data at the lowest address a free run takes it (its
    header made apart), a freed array merged with free neighbours; fresh() the free
    blocks below the highest live array.  The held-out concat-skip net's forward on the
    32-bit fallback: two 16 KB maps (a conv's output, its RELU's), the conv's freed below
    the RELU's; the PAD's 20.7 KB output fits in neither hole and goes above the RELU's,
    leaving the 16 KB hole under it (a list of hole sizes had taken 4.4 KB of run beyond
    that hole, as if it lay under the free heap)."""
    from host_tools.plan.memory import Arena
    a = Arena(header=112)
    a.alloc(16496, 'conv')
    a.alloc(16496, 'relu')
    a.free('conv')
    assert a.holes() == [16496] and a.fresh() == 16384
    a.alloc(20848, 'pad')
    assert a.at['pad'][0] == 2 * 16384 and a.fresh() == 16384
    # freed neighbours merge: two 8 KB holes side by side take a 16 KB array
    b = Arena(header=112)
    for k in 'abc':
        b.alloc(8304, k)
    b.free('a')
    b.free('b')
    assert b.holes() == [16496]
    b.alloc(16496, 'd')
    assert b.at['d'][0] == 0 and b.fresh() == 0


def _catnet(path, n=16, c=8):
    """The held-out concat-skip net's layout (NHWC): conv 2 -> c 3x3 and RELU, conv c -> c
    3x3 and RELU, the two joined (CONCATENATION), 1x1 conv and RELU, PAD 1, 3x3 conv
    stride 2 and RELU, MEAN, the input's MEAN joined to it, FC to 3 classes."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(7)
    b = CircleBuilder(description='utrain test: concat-skip net')

    def conv(name, t, shape, out, **kw):
        y = b.tensor(name, out)
        b.op('CONV_2D', [t, b.tensor(name + 'w', list(shape), data=r.normal(0, 0.3, shape).astype(np.float32)),
                         b.tensor(name + 'b', [shape[0]], data=np.zeros(shape[0], np.float32))], [y], **kw)
        z = b.tensor(name + 'r', out)
        b.op('RELU', [y], [z])
        return z

    def mean(name, t, k):
        y = b.tensor(name, [1, k])
        b.op('MEAN', [t, b.tensor(name + 'ax', [2], data=np.array([1, 2], np.int32))], [y], keep_dims=False)
        return y
    x = b.tensor('x', [1, n, n, 2])
    a = conv('c1', x, (c, 3, 3, 2), [1, n, n, c], padding='SAME')
    cat = b.tensor('cat', [1, n, n, 2 * c])
    b.op('CONCATENATION', [a, conv('c2', a, (c, 3, 3, c), [1, n, n, c], padding='SAME')], [cat], axis=3)
    d = conv('c3', cat, (2 * c, 1, 1, 2 * c), [1, n, n, 2 * c], padding='VALID')
    p = b.tensor('p', [1, n + 2, n + 2, 2 * c])
    b.op('PAD', [d, b.tensor('pp', [4, 2], data=np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))], [p])
    e = conv('c4', p, (2 * c, 3, 3, 2 * c), [1, n // 2, n // 2, 2 * c], padding='VALID', stride_w=2, stride_h=2)
    f = b.tensor('f', [1, 2 * c + 2])
    b.op('CONCATENATION', [mean('m1', e, 2 * c), mean('m2', x, 2)], [f], axis=1)
    y = b.tensor('y', [1, 3])
    b.op('FULLY_CONNECTED', [f, b.tensor('fw', [3, 2 * c + 2], data=r.normal(0, 0.3, (3, 2 * c + 2)).astype(np.float32)),
                             b.tensor('fb', [3], data=np.zeros(3, np.float32))], [y])
    b.inputs(x)
    b.outputs(y)
    return b.save(path)


def test_a_hole_under_a_live_array_takes_no_larger_one(tmp_path, monkeypatch):
    """_catnet, its classifier's upper half (--ranks 13:up) at SGD b1 on the 32-bit
    fallback: the 1x1 conv's 16 KB output is freed below its RELU's, and the PAD's
    20.7 KB output fits in no hole: it goes above the RELU's array, the 16 KB hole left
    under it (memory.Arena).  main planned 4.4 KB of run beyond that hole, as if it lay
    under the free heap: 145 KB, and it fails there (the held-out concat-skip net's
    streamed and ranked cells 0.986x, issue 28 session 27); now 151 KB, 1.2x no more."""
    s, out = _prepared_on('UTRAIN_MP32', monkeypatch, tmp_path, _catnet, shape=(16, 16, 2),
                          classes=3, n=4, optimizer='sgd', batch=1, train='none', ranks='13:up')
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), f'the plan ({plan} B) is over 1.2x the need'


def test_freed_neighbours_are_planned_as_one_hole(tmp_path, monkeypatch):
    """_dws1d's last two ops from the board's own prefix cache (--cache) at SGD b1 on
    32-bit ulab: its 1x1 conv's and depthwise's freed 8 KB maps lie side by side and
    the board takes them as one hole (memory.Arena merges them).  main planned each
    apart, the depthwise x2's 24 KB output and spread copy charged 20 KB of run beyond
    them: 169 KB, and it trains in plan / 1.2 (the held-out 1-D depthwise-separable
    net's cell 1.224x, issue 28 session 27); now 163 KB, trained in and not in / 1.2."""
    s, out = _prepared_on('UTRAIN_MP32_ULAB', monkeypatch, tmp_path, _dws1d, shape=(1, 64, 4),
                          classes=6, n=4, optimizer='sgd', batch=1, train='last:2', cache=True)
    plan = s['heap']['total']
    runner.stage(out)
    assert trains_in(out, plan), f'does not train in the planned {plan} B'
    assert not trains_in(out, int(plan / 1.2)), f'the plan ({plan} B) is over 1.2x the need'


def test_an_8bit_datasets_input_byte_buffer_is_planned(tmp_path):
    """utrain.data.Dataset.xq makes a byte buffer of one sample's inputs at the first
    input read of a uint8 / int8 dataset and keeps it all run: planned (memory.sample_bytes;
    main planned uint8 samples as float32 ones)."""
    rng = np.random.default_rng(0)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.integers(0, 255, (4, 8, 8, 1)).astype(np.float32),
             y=rng.integers(0, 10, 4))
    plans = {}
    for dt in ('float32', 'uint8'):
        s = prepare(os.path.join(DIGITS, 'digits_cnn.circle'), str(tmp_path / dt), data=data,
                    loss='scce', lr=0.01, epochs=1, dtype=dt, optimizer='sgd', batch=1,
                    log=lambda *a: None, backend='fallback')
        plans[dt] = s['heap']
    assert plans['uint8']['parts']['8-bit input buffer'] >= 64
    assert plans['uint8']['total'] >= plans['float32']['total'] + 64
    assert '8-bit input buffer' not in plans['float32']['parts']


def _conv1d_views(path, views=True, n=64, c=16, classes=4):
    """A Keras Conv1D's layout on [1, 1, n, 3]: conv 3 -> c k5 (RELU: saves its output),
    with views the RESHAPE to [1, n, c] and EXPAND_DIMS back Keras puts around a Conv1D,
    a 1x2 max pool (saves its input: the last view), MEAN, FC."""
    from host_tools.formats.circle_build import CircleBuilder
    r = np.random.default_rng(4)
    b = CircleBuilder(description='utrain test: Conv1D views')

    def w(name, shape):
        return b.tensor(name, list(shape), data=r.normal(0, 0.3, shape).astype(np.float32))
    x = b.tensor('x', [1, 1, n, 3])
    y = b.tensor('y0', [1, 1, n, c])
    b.op('CONV_2D', [x, w('w0', (c, 1, 5, 3)), w('b0', (c,))], [y], padding='SAME',
         fused_activation_function='RELU')
    if views:
        v = b.tensor('v0', [1, n, c])
        b.op('RESHAPE', [y, b.tensor('s0', [3], data=np.array([1, n, c], np.int32))], [v],
             new_shape=[1, n, c])
        y = b.tensor('v1', [1, 1, n, c])
        b.op('EXPAND_DIMS', [v, b.tensor('ax1', [], data=np.array(1, np.int32))], [y])
    p = b.tensor('p', [1, 1, n // 2, c])
    b.op('MAX_POOL_2D', [y], [p], padding='VALID', stride_w=2, stride_h=1, filter_width=2,
         filter_height=1)
    mm = b.tensor('mm', [1, c])
    b.op('MEAN', [p, b.tensor('ax', [2], data=np.array([1, 2], np.int32))], [mm], keep_dims=False)
    o = b.tensor('o', [1, classes])
    b.op('FULLY_CONNECTED', [mm, w('fw', (classes, c)), w('fb', (classes,))], [o])
    b.inputs(x)
    b.outputs(o)
    return b.save(path)


def test_a_saved_view_of_a_view_is_planned_as_one_array(tmp_path):
    """A reshape's output shares its input's floats (utrain.op_shape), and so does a
    reshape of that (held_views): the conv saves its RELU output and the max pool its
    input, the same floats under two reshapes, planned once.  Counted twice, a
    Keras Conv1D net's saved maps (RESHAPE then EXPAND_DIMS between its convs) stood
    6.2 KB over in its SGD b1 plan on the 32-bit fallback (124 KB planned, 102 KB
    needed: 1.22x, session 30); main planned the net with the views a whole map (4 KB)
    above the same net without them."""
    rng = np.random.default_rng(3)
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=rng.standard_normal((4, 1, 64, 3)).astype(np.float32),
             y=rng.integers(0, 4, 4))
    saved = {}
    for views in (False, True):
        model = _conv1d_views(str(tmp_path / f'm{views}.circle'), views=views)
        s = prepare(model, str(tmp_path / f'o{views}'), data=data, loss='scce',
                    from_logits=True, lr=0.01, epochs=1, log=lambda *a: None,
                    optimizer='sgd', batch=1)
        saved[views] = s['heap']['parts']['saved activations']
    # (the views' array headers only: 4 KB more on main, the map again)
    assert saved[True] - saved[False] < 512, saved
