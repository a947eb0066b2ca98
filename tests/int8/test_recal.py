"""The trained layers' output ranges recalibrated on the fine-tuning data (issue 29,
host_tools/prepare/recal.py): prepare widens a range that clips on the training samples,
the widened model computes what the model did where nothing clipped, export replays the
widening (TFLite Micro = the board's int8 net with the trained weights, bit for bit), and
a range that does not clip is left as the file has it."""
import json
import os
import sys

import numpy as np
import pytest

from repo import ROOT
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.formats.circle_io import read_model  # noqa: E402
from host_tools.graph.inout import save_graph  # noqa: E402
from host_tools.prepare import quant, recal  # noqa: E402
from host_tools.prepare.pipeline import prepare, export  # noqa: E402
from host_tools.target import runner  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402

MLP = os.path.join(ROOT, 'bench', 'zoo', 'keras', 'mlp_int8.tflite')


def _task(path, gain, n=160):
    # a relabelling of the model's own kind of data (as tests/int8/test_q8.py's), its
    # inputs times gain (large: the logits leave the range calibrated on the original)
    rng = np.random.default_rng(0)
    c = rng.standard_normal((4, 16)) * 1.5
    r = np.random.default_rng(3)
    y = r.integers(0, 4, n)
    x = ((c[y] + 2.0 * r.standard_normal((n, 16))) * gain).astype(np.float32)
    np.savez(path, x=x, y=np.array([2, 0, 3, 1])[y])
    return x


def _clipped(g, x, train='last:2'):
    # the fraction of the logits at -128 or 127 over samples x (the int8 forward)
    m = quant.meta(g, train)
    import tempfile
    from host_tools.files import wof as hwof
    with tempfile.TemporaryDirectory() as d:
        w = os.path.join(d, 'w.wof')
        hwof.write_wof(w, len(g.tensors), quant.wof_arrays(g, m), keep_dtype=True)
        net = Q8Net(m, w)
        ys = [np.frombuffer(bytes(net.forward(net.quantize_input(v.tolist()))), np.int8)
              for v in x]
        net.close()
    ys = np.array(ys)
    return ((ys == -128) | (ys == 127)).mean(), ys, m


def test_a_clipping_trained_range_widens_and_export_replays_it(tmp_path):
    data = str(tmp_path / 'task.npz')
    x = _task(data, 6.0)
    q = str(tmp_path / 'q8')
    said = []
    prepare(MLP, q, data=data, test_split=0.25, loss='scce', optimizer='sgd', lr=0.01,
            epochs=1, train='last:2', log=said.append)
    steps = json.loads(open(os.path.join(q, recal.FILE)).read())
    g0 = read_model(MLP)
    logits = g0.ops[-2].outputs[0]
    assert [logits, 0] in steps, steps                  # both ends clipped: both widen
    assert any('range widened' in str(v) for v in said), said
    before, y0, m0 = _clipped(g0, x)
    g1 = read_model(MLP)
    recal.replay(g1, q)
    after, y1, m1 = _clipped(g1, x)
    assert before > 4 * recal.CLIP and after < before / 2, (before, after)
    # where the model's logits did not clip, the widened ones are the same values to a
    # step of the wider scale
    ok = (y0 > -128) & (y0 < 127)
    f0 = (y0.astype(float) - m0['zy']) * m0['sy']
    f1 = (y1.astype(float) - m1['zy']) * m1['sy']
    assert np.abs(f1 - f0)[ok].max() <= 1.01 * m1['sy']
    # train, export: TFLite Micro runs the exported model as the board's net runs it
    pytest.importorskip('tflite_micro')
    from tflite_micro.python.tflite_micro import runtime
    code, out = runner.run(q, python=True, stream=False)
    assert code == 0, out
    dst = str(tmp_path / 'trained.tflite')
    export(MLP, os.path.join(q, 'trained.wof'), dst)
    g = read_model(dst)
    g.ops, g.outputs = g.ops[:-1], [g.ops[-2].outputs[0]]
    save_graph(g, str(tmp_path / 'cut.tflite'))
    it = runtime.Interpreter.from_file(str(tmp_path / 'cut.tflite'))
    net = Q8Net(json.loads(open(os.path.join(q, 'q8.json')).read()),
                os.path.join(q, 'weights.wof'))
    net.load_weights(os.path.join(q, 'trained.wof'))
    for v in x[:8]:
        xq = net.quantize_input(v.tolist())
        it.set_input(np.frombuffer(bytes(xq), np.int8)[None], 0)
        it.invoke()
        assert np.array_equal(np.frombuffer(bytes(net.forward(xq)), np.int8),
                              it.get_output(0).ravel())


def test_a_range_that_does_not_clip_stays(tmp_path):
    """The task the model's ranges fit: nothing widened, no q8cal.json (a stale one from an
    earlier prepare into the folder removed)."""
    data = str(tmp_path / 'task.npz')
    _task(data, 0.5)
    q = str(tmp_path / 'q8')
    os.makedirs(q)
    open(os.path.join(q, recal.FILE), 'w').write('[[1, 0]]')
    prepare(MLP, q, data=data, test_split=0.25, loss='scce', optimizer='sgd', lr=0.01,
            epochs=1, train='last:2', log=lambda *a: None)
    assert not os.path.exists(os.path.join(q, recal.FILE))


def test_a_widened_range_takes_a_maximum_and_minimum_with_it(tmp_path):
    """A MAXIMUM's or MINIMUM's inputs and output share one scale (TFLite's kernel
    compares the int8 values): widening one input's range widens the other input and
    the output with it (the int8 path refused the model after prepare widened a clipping
    conv under a Keras maxout), and a constant input's values are quantized again at the
    wider scale (within half its step of what they were); the widened model computes what
    TFLite Micro computes on it."""
    from kerasgraphs import build_int8_sqd_minmax
    path, _, _, _ = build_int8_sqd_minmax(tmp_path / 's.tflite')
    g = quant.rewritten(read_model(path))
    ix = {t.name: i for i, t in enumerate(g.tensors)}
    k0 = g.tensors[ix['k']].data.astype(np.float64)
    recal.widen(g, ix['ow1'], -1)           # (MAXIMUM's first input)
    recal.widen(g, ix['d'], 1)              # (MINIMUM's: its other input a constant)

    def q(name):
        t = g.tensors[ix[name]].quant
        return float(t['scale'][0]), int(t['zero_point'][0])
    assert q('ow1') == q('ow3') == q('m') and q('m')[1] == 66     # (was 0.03, 5: the low end moved)
    assert q('d') == q('k') == q('n') and q('n')[1] == -128      # (was 0.05, -128)
    assert np.isclose(q('m')[0], 0.06) and np.isclose(q('n')[0], 0.1) and q('ow2')[1] == -3
    k1 = g.tensors[ix['k']].data.astype(np.float64)
    assert np.abs((k1 + 128) * 0.1 - (k0 + 128) * 0.05).max() <= 0.05 + 1e-9
    r = np.random.default_rng(2)
    _tflm_is_the_net(tmp_path, g, r.integers(-120, 121, (4, 1, 4, 5)))


def _tflm_is_the_net(tmp_path, g, xs):
    """Graph g written as a model and prepared as int8: the board's int8 net and TFLite
    Micro on it give the same int8 outputs for each of xs (int8 samples); returns them."""
    from tflite_micro.python.tflite_micro import runtime
    p = save_graph(g, str(tmp_path / 'wide.tflite'))
    quant.write(quant.rewritten(read_model(p)), str(tmp_path), 'all')
    with open(tmp_path / 'q8.json') as f:
        m = json.load(f)
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    it = runtime.Interpreter.from_file(p)
    out = []
    for xq in xs:
        xq = xq.astype(np.int8)
        it.set_input(xq, 0)
        it.invoke()
        out.append(it.get_output(0).ravel().copy())
        assert np.array_equal(np.frombuffer(bytes(net.forward(bytearray(xq.tobytes()))), np.int8),
                              out[-1])
    net.close()
    return out


@pytest.mark.parametrize('apart', [False, True])
def test_a_widened_range_takes_a_select_with_it(tmp_path, apart):
    """tf.where(h > 0.25, h, 0.3 h - 0.1) in an int8 file: SELECT_V2 copies its value
    inputs' codes, so widening h's range (its Dense clipping on the training samples)
    widens the other branch and the output with it; before, the output kept its scale and
    read h's halved codes (the function above 0.25 became about h / 2 + c: h40m's
    held-out where model trained 4-6 points under --dequantize).  The widened model
    computes the file's function within a few output steps (its
    float forward), and the board's int8 net is TFLite Micro's on it, bit for bit."""
    from kerasgraphs import build_int8_where
    path = str(tmp_path / 'w.tflite')
    _, fwd, _, sx = build_int8_where(path, apart=apart)
    g = quant.rewritten(read_model(path))
    ix = {t.name: i for i, t in enumerate(g.tensors)}
    recal.widen(g, ix['h'], 1)

    def q(name):
        t = g.tensors[ix[name]].quant
        return float(t['scale'][0]), int(t['zero_point'][0])
    assert np.isclose(q('h')[0], 0.06) and np.isclose(q('s')[0], 2 * (0.025 if apart else 0.03))
    assert np.isclose(q('b')[0], 2 * (0.02 if apart else 0.03)) and q('r') == q('s')
    assert np.isclose(q('m')[0], 0.012)         # (the MUL's output: requantized, not tied)
    xs = np.random.default_rng(5).integers(-60, 61, (12, 1, 6, 5))
    got = _tflm_is_the_net(tmp_path, g, xs)
    worst = max(float(np.abs(y.astype(np.float64) * 0.1 - fwd(xq[0] * sx).ravel()).max())
                for xq, y in zip(xs, got))
    assert worst < 0.3, worst       # (3 output steps: 0.06-0.08 here; untied 0.9-1.2)


def test_a_range_widening_cannot_stop_stays_as_the_file_has_it(tmp_path):
    """Keras's UnitNormalization / Dot(normalize=True) as int8: the RSQRT of a norm near 0
    clips at 127 (the MINIMUM after it caps it there anyway) on samples whose vector is
    about 0.  prepare widened its range 256x, clipping as much, and every other value of it
    then was a step of 0 (a held-out siamese model's cosines all 0, its output constant).
    A range that 2^MAXK times wider clips over half as much is kept as the file has it,
    saying so; the int8 forward is then the file's on the other samples."""
    from kerasgraphs import build_int8_unitnorm
    p, fwd, _, _ = build_int8_unitnorm(tmp_path / 'u.tflite')
    g = read_model(p)
    named = {t.name: t for t in g.tensors}
    w1 = named['w1'].data * 0.0029
    b1 = named['b1'].data * (0.0242 * 0.0029)
    x0 = np.linalg.lstsq(w1, -b1, rcond=None)[0]        # (the Dense's output about 0)
    r = np.random.default_rng(0)
    x = r.standard_normal((64, 16))
    x[::4] = x0 + 0.001 * r.standard_normal((16, 16))
    np.savez(tmp_path / 'u.npz', x=x.astype(np.float32), y=r.integers(0, 4, 64))
    q, said = str(tmp_path / 'q8'), []
    prepare(p, q, data=str(tmp_path / 'u.npz'), loss='scce', from_logits=True,
            optimizer='sgd', lr=0.01, epochs=1, log=said.append)
    rsqrt = named['r'].index
    steps = json.loads(open(os.path.join(q, recal.FILE)).read()) \
        if os.path.exists(os.path.join(q, recal.FILE)) else []
    assert rsqrt not in [t for t, _ in steps], steps
    assert any('op 5 RSQRT' in m and "kept at the file's range" in m for m in said), said
    net = Q8Net(json.loads(open(os.path.join(q, 'q8.json')).read()), os.path.join(q, 'weights.wof'))
    got = np.array([(np.frombuffer(bytes(net.forward(net.quantize_input(v.tolist()))), np.int8)
                     .astype(float) + 5) * 0.0233 for v in x[1::4]])
    want = np.array([fwd(v) for v in x[1::4]])
    assert np.abs(got - want).max() < 0.25, np.abs(got - want).max()
