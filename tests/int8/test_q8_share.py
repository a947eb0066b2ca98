"""A weight tensor several layers read (Keras's TimeDistributed(Dense) steps, an unrolled
SimpleRNN / GRU / LSTM's steps; issue 28) trains as int8 (utrain.q8share: q8.json 'sh'):
one int8 tensor and scale, the gradients of its uses summed in int32, one update a step
after the last use's gradient.  In models built here as Keras's converter writes them:
the forward bit-exact with TFLite Micro; a step's updates against finite differences of
the dequantized float graph; the same model with a copy of the weight a layer (the
unshared model) moves its copies by the same summed update; batch sums and Adam;
checkpoints and viper as the host; prepare trains it as int8 on unix MicroPython, plans
it and export writes the one shared tensor back."""
import json
import os
import re
import sys

import numpy as np
import pytest

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from kerasgraphs import build_int8_shared  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402
from test_q8 import spy_updates  # noqa: E402
from test_q8_cat import MP, _fd_grad, _viper_matches  # noqa: E402
from test_q8_bin import _tflm_matches, plan_bounds_the_heap, trains_and_exports  # noqa: E402

T, C = 4, 3
CASES = [(k, pc) for k in ('td', 'rnn') for pc in (False, True)]
BIAS = [('td', True), ('td', False), ('rnn', True)]


def _table(d, path, train='all'):
    g = quant.rewritten(read_model(path))
    quant.write(g, str(d), train)
    with open(os.path.join(d, 'q8.json')) as f:
        return g, json.load(f)


def _x(r):
    return r.integers(-120, 121, (T, C)).astype(np.int8)


def _uses(net, g):
    """{weight name: how many layers read it} (a copy's name without its step)."""
    out = {}
    for L in net.layers:
        if L.w is not None:
            k = g.tensors[L.d['wt']].name[:2]
            out[k] = out.get(k, 0) + 1
    return out


def _named(net, g, got):
    """{weight name: its spied update}: spy_updates' list (one per layer, in the order
    applied) keyed by the weight tensor each update moved, a copy's name without its
    step (w10, w11 ... -> w1: the copies' updates summed)."""
    by = {}
    for L in net.layers:
        if L.w is not None:
            by.setdefault(id(L.w), g.tensors[L.d['wt']].name[:2])
    out = {}
    for w, a in got:
        k = by[w]
        out[k] = out.get(k, 0) + a
    return out


@pytest.fixture
def spy(monkeypatch):
    """spy_updates with each update's weight buffer: [(id, 1/256 steps)]."""
    from utrain import q8kern as K
    got = spy_updates(monkeypatch)
    seen = []
    for name in ('upk', 'upmk', 'upek'):
        f = getattr(K, name)

        def wrap(w, *a, _f=f):
            seen.append(id(w.obj if isinstance(w, memoryview) else w))
            return _f(w, *a)
        monkeypatch.setattr(K, name, wrap)

    class S:
        def clear(self):
            got.clear()
            seen.clear()

        def pairs(self):
            assert len(got) == len(seen)        # (one call a layer here: no chunks)
            return list(zip(seen, got))
    return S()


@pytest.mark.parametrize('kind,pc,bias', [c + (True,) for c in CASES] + [('td', False, False)])
def test_forward_bit_exact_with_tflite_micro(tmp_path, kind, pc, bias):
    """The steps' layers read one weight buffer (the recurrent FC's inputs at a scale a
    step; per-channel weight scales with pc; without a bias tensor) and the logits are
    TFLite Micro's."""
    path = build_int8_shared(tmp_path / 'm.tflite', kind, pc=pc, bias=bias)[0]
    _, m = _table(tmp_path, path)
    sh = [d.get('sh') for d in m['layers'] if d['k'] == quant.FC]
    assert sh == ([4] * T + [None] if kind == 'td' else [4, 4, 6, 4, 6, 4, 6, None]), sh
    net = Q8Net(m, str(tmp_path / 'weights.wof'))
    ws = {id(L.w) for L in net.layers if L.w is not None}
    assert len(ws) == (2 if kind == 'td' else 3)            # (one buffer a weight tensor)
    # one bias where the steps read inputs at one scale (b1, bx; a zero bias where the
    # file has none, quant.zero_bias); the recurrent FC's inputs differ: one a step
    bs = [L.d['bt'] for L in net.layers if L.sh is not None]
    assert len(set(bs)) == (1 if kind == 'td' else 1 + (T - 1)), bs
    assert all(L.b is net.layers[L.d['sh']].b for L in net.layers if L.sb)
    r = np.random.default_rng(1)
    _tflm_matches(path, m, tmp_path, [r.integers(-128, 128, (T, C)).astype(np.int8)
                                      for _ in range(30)], 12)


@pytest.mark.parametrize('kind,pc', CASES)
def test_one_update_the_summed_gradient(tmp_path, spy, kind, pc):
    """SGD batch 1: each shared weight moves once a step, by lr times the finite
    differences of the dequantized float graph (the sum over its uses: cosine > 0.98 on
    five of six samples, norm within 25 %), and the unshared model (a copy a layer, the same values) moves its
    copies by updates that sum to it (each rounded apart to 1/256 step, with a dither:
    within a 1/256 step each, the shared one's and every copy's)."""
    path, fwd, ss, sx = build_int8_shared(tmp_path / 's.tflite', kind, pc=pc)
    pcp = build_int8_shared(tmp_path / 'c.tflite', kind, copies=True, pc=pc)[0]
    g, m = _table(tmp_path / 's', path)
    gc, mc = _table(tmp_path / 'c', pcp)
    assert not any('sh' in d for d in mc['layers'])
    r = np.random.default_rng(3)
    cs = {}
    for i in range(6):
        xq = _x(r)
        net = Q8Net(m, str(tmp_path / 's' / 'weights.wof'))
        spy.clear()
        net.step(bytearray(xq.tobytes()), i % 3, 0.01)
        assert len(spy.pairs()) == len(ss)                  # (one update a weight)
        us = _named(net, g, spy.pairs())
        netc = Q8Net(mc, str(tmp_path / 'c' / 'weights.wof'))
        spy.clear()
        netc.step(bytearray(xq.tobytes()), i % 3, 0.01)
        uc = _named(netc, gc, spy.pairs())
        for k in ss:
            s = np.asarray(ss[k], np.float64).reshape(-1, 1)
            w = next(t for t in g.tensors if t.name == k).data
            upd = us[k].reshape(w.shape) / 256.0 * s
            ref = 0.01 * _fd_grad(lambda x, v: fwd(x, {k: v}), xq.astype(np.float64) * sx,
                                  w.astype(np.float64) * s, i % 3, 1e-5).reshape(w.shape)
            cos = float((upd * ref).sum() / (np.linalg.norm(upd) * np.linalg.norm(ref)))
            cs.setdefault(k, []).append(cos)
            assert 0.8 < np.linalg.norm(upd) / np.linalg.norm(ref) < 1.25, (k, i)
            assert np.abs(us[k] - uc[k]).max() < _uses(netc, gc)[k] + 1, (k, i)
            assert np.abs(us[k]).max() > 5
    for k in cs:
        # (one sample of the six may differ more: the int8 model's own gradient, e.g. a
        # Dense step's pre-activation at 0.002, under half an output step, is a ReLU
        # output at zero in int8, which passes no gradient, and positive in float)
        assert sorted(cs[k])[1] > 0.98 and min(cs[k]) > 0.85, (k, cs[k])


@pytest.mark.parametrize('kind', ['td', 'rnn'])
def test_batch_sums_and_adam_move_the_one_tensor(tmp_path, spy, kind):
    """SGD at batch 2 (accum, apply): the shared weight's update is the unshared model's
    copies' summed (within a 1/256 step a copy and one: each rounded with a dither); Adam updates the one tensor once a batch (its master
    and moments: the first use's) and the layers keep reading one buffer."""
    path = build_int8_shared(tmp_path / 's.tflite', kind)[0]
    pcp = build_int8_shared(tmp_path / 'c.tflite', kind, copies=True)[0]
    g, m = _table(tmp_path / 's', path)
    gc, mc = _table(tmp_path / 'c', pcp)
    r = np.random.default_rng(4)
    xs = [_x(r) for _ in range(2)]
    ups = []
    for gg, mm, d in ((g, m, 's'), (gc, mc, 'c')):
        net = Q8Net(mm, str(tmp_path / d / 'weights.wof'))
        net.setup('sgd', 2)
        spy.clear()
        for i, xq in enumerate(xs):
            net.accum(bytearray(xq.tobytes()), i)
        net.apply(0.01, 0.5)
        ups.append(_named(net, gg, spy.pairs()))
    uses = _uses(net, gc)
    for k in ups[0]:
        assert np.abs(ups[0][k] - ups[1][k]).max() < uses[k] + 1, k
        assert np.abs(ups[0][k]).max() > 3, k
    net = Q8Net(m, str(tmp_path / 's' / 'weights.wof'))
    net.setup('adam', 1)
    sh = [L for L in net.layers if L.sh is not None]
    w0 = bytes(sh[0].w)
    for i, xq in enumerate(xs):
        net.accum(bytearray(xq.tobytes()), i)
        net.apply(0.01, 1.0)
    assert bytes(sh[0].w) != w0 and all(L.w is O.w and L.wm is O.wm and L.am is O.am for L in sh
                                        for O in [net.layers[L.d['sh']]])


@pytest.mark.parametrize('kind,pc', CASES)
def test_updates_add_no_default_attributes_to_layers(tmp_path, kind, pc, monkeypatch):
    """The updates (a shared weight's summed uses at SGD batch 1, a batch's sums, Adam)
    write no instance attribute that only repeats its class default (Layer.uk = None):
    on a board each new one grows a layer's dict mid-run, the old one a hole (the int8
    rnn cell's smallest heap rose 162.8 -> 168.4 KB on 64-bit unix MicroPython when
    q8batch.unit did so on each use; 164.4 without)."""
    from utrain.q8 import Layer
    path = build_int8_shared(tmp_path / 's.tflite', kind, pc=pc)[0]
    _, m = _table(tmp_path, path)
    r = np.random.default_rng(2)
    xs = [bytearray(_x(r).tobytes()) for _ in range(4)]
    for opt, b in (('sgd', 1), ('sgd', 2), ('adam', 2)):
        net = Q8Net(m, str(tmp_path / 'weights.wof'))
        net.setup(opt, b)
        new = []

        def put(L, k, v, _new=new):     # (a new attribute that only repeats the class's)
            if k not in L.__dict__ and v is None and getattr(Layer, k, 0) is None:
                _new.append(k)
            object.__setattr__(L, k, v)
        monkeypatch.setattr(Layer, '__setattr__', put, raising=False)
        for i, x in enumerate(xs):
            if opt == 'sgd' and b == 1:
                net.step(x, i % 3, 0.01)
            else:
                net.accum(x, i % 3)
                if i % b == b - 1:
                    net.apply(0.01, 1.0 / b)
        monkeypatch.undo()
        assert not new, (opt, b, new)


def test_checkpoint_resume_keeps_one_tensor(tmp_path):
    """A checkpoint of a run with a shared weight resumes to the same weights and state
    bit for bit, the layers reading one buffer again (its state: the first use's)."""
    from utrain.q8train import Q8Trainer
    path = build_int8_shared(tmp_path / 's.tflite', 'rnn')[0]
    _, m = _table(tmp_path, path)
    r = np.random.default_rng(5)
    xs = [_x(r) for _ in range(6)]

    def trainer():
        return Q8Trainer(str(tmp_path / 'q8.json'), str(tmp_path / 'weights.wof'), momentum=0.9)
    a = trainer()
    for i, xq in enumerate(xs[:3]):
        a.net.step(bytearray(xq.tobytes()), i % 3, 0.02)
    a.save_checkpoint(str(tmp_path / 'c.ckpt'))
    b = trainer()
    b.load_checkpoint(str(tmp_path / 'c.ckpt'))
    for t in (a, b):
        for i, xq in enumerate(xs[3:]):
            t.net.step(bytearray(xq.tobytes()), i % 3, 0.02)
    for La, Lb in zip(a.net.layers, b.net.layers):
        if La.w is not None:
            assert bytes(La.w) == bytes(Lb.w) and list(La.b) == list(Lb.b)
    for L in b.net.layers:
        if L.sh is not None:
            O = b.net.layers[L.d['sh']]
            assert L.w is O.w and L.vw is O.vw and L.ga is O.ga


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
@pytest.mark.parametrize('kind', ['td', 'rnn'])
def test_viper_steps_as_the_host(tmp_path, kind):
    """Three SGD steps under viper end with the host's weights and biases."""
    _table(tmp_path, build_int8_shared(tmp_path / 'm.tflite', kind, pc=True)[0])
    r = np.random.default_rng(6)
    _viper_matches(tmp_path, tmp_path, [_x(r) for _ in range(3)])


@pytest.mark.skipif(MP is None, reason='no unix MicroPython')
@pytest.mark.parametrize('kind,bias', BIAS)
def test_prepare_trains_it_as_int8_on_micropython_and_exports(tmp_path, kind, bias):
    """prepare takes the model as int8 (nobody naming what trains, and --train all), unix
    MicroPython trains it as the host does, the loss falls, export writes one weight
    tensor whose logits under TFLite Micro are the board's; the run fits its plan."""
    from host_tools.prepare.pipeline import prepare
    path, fwd, _, _ = build_int8_shared(tmp_path / 'm.tflite', kind, bias=bias)
    x = np.random.default_rng(7).uniform(-2.4, 2.4, (60, T, C)).astype(np.float32)
    s = trains_and_exports(tmp_path, path, x, fwd)
    assert os.path.exists(tmp_path / 'run' / 'q8.json') and not s.get('dequantized_because')
    s2 = prepare(path, str(tmp_path / 'auto'), data=str(tmp_path / 'd.npz'), log=lambda *a: None)
    assert s2.get('int8') and not s2.get('dequantized_because'), s2
    q = read_model(str(tmp_path / 'q.tflite'))
    assert len([op for op in q.ops if op.name == 'FULLY_CONNECTED']) == len(
        [op for op in read_model(path).ops if op.name == 'FULLY_CONNECTED'])
    ws = {op.inputs[1] for op in q.ops if op.name == 'FULLY_CONNECTED'}
    assert len(ws) == (2 if kind == 'td' else 3)
    if kind == 'td':        # (its steps' one bias: b1, or one zero bias written in)
        assert len({op.inputs[2] for op in q.ops if op.inputs[1] in ws and op.inputs[2] >= 0
                    and op.outputs[0] != q.outputs[0]}) == 1
    (tmp_path / 'p').mkdir()
    plan_bounds_the_heap(tmp_path / 'p', path, x[:12])


def test_ranks_on_a_shared_weight_refused(tmp_path):
    """--ranks on a layer whose weight others read: refused naming them and what to do."""
    path = build_int8_shared(tmp_path / 'm.tflite', 'td')[0]
    g = quant.rewritten(read_model(path))
    n = next(op.number for op in g.ops if op.name == 'FULLY_CONNECTED')
    with pytest.raises(ValueError, match=r'm\.tflite: --ranks names op \d+, whose weight tensor '
                                         r'ops .* read .*trains a shared weight whole'):
        quant.layers(g, 'none', {n: 2})


def test_the_boards_choice_trains_a_shared_weight_whole(tmp_path):
    """--select board's restriction of the union's table (utrain.q8keep): a choice that
    names the first use of a shared weight trains all its uses; one that leaves it out
    freezes them all (no 'sh' left: no q8share)."""
    import copy
    from utrain.q8keep import restrict
    _, m = _table(tmp_path, build_int8_shared(tmp_path / 'm.tflite', 'td', pc=True)[0])
    ls = m['layers']
    uses = [i for i, d in enumerate(ls) if 'sh' in d]
    last = len(ls) - 1
    a = restrict(copy.deepcopy(m), {uses[0]: None, last: None})['layers']
    assert [bool(a[i].get('train')) for i in uses] == [True] * T
    assert not any(a[i].get('gw') for i in uses)
    b = restrict(copy.deepcopy(m), {last: None})['layers']
    assert not any(b[i].get('train') or 'sh' in b[i] for i in uses)
    net = Q8Net(restrict(copy.deepcopy(m), {last: None}), str(tmp_path / 'weights.wof'))
    assert net.sh is None


def test_an_int8_run_over_the_budget_trains_dequantized_where_that_fits(tmp_path):
    """An int8 model whose int8 run the budget refuses with any settings (its layer
    table: a layer a step, as an unrolled RNN's; even --train last:1 --cache) but whose
    dequantized run fits trains dequantized, and prepare says why; where neither fits,
    the refusal names both plans (where other int8 settings fit, the refusal names them:
    test_memory's test_int8_budget_refusal_says_what_would_fit)."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.graph.passes import PrepareError
    path, _, _, _ = build_int8_shared(tmp_path / 'm.tflite', 'rnn', T=8)
    rng = np.random.default_rng(3)
    np.savez(tmp_path / 'd.npz', x=rng.uniform(-2, 2, (24, 8, C)).astype(np.float32),
             y=rng.integers(0, 3, 24))
    d, none = str(tmp_path / 'd.npz'), lambda *a: None
    p8 = prepare(path, str(tmp_path / 'i'), data=d, log=none, train='last:1',
                 cache=True)['heap']['total']
    pf = prepare(path, str(tmp_path / 'f'), data=d, log=none, dequantize=True)['heap']['total']
    assert p8 > pf, (p8, pf)
    lines = []
    s = prepare(path, str(tmp_path / 'b'), data=d, log=lines.append, budget=(p8 + pf) // 2)
    assert not s.get('int8') and 'dequantized it fits' in s['dequantized_because'], s
    assert any('trains in float32, dequantized' in ln and 'as int8 needs' in ln for ln in lines)
    # (and what makes int8 so large: its layers, a loop's steps each (issue 28: an int8 GRU
    # file on an rp2040 said only its 465 KB, of which its 363 layers were 274 KB))
    assert re.search(r'\d+ int8 layers [^;]*their table and layer objects \d+ KB[^;]*; '
                     r'dequantized it fits', s['dequantized_because']), s
    with pytest.raises(PrepareError, match=r'(?s)as int8 needs.*dequantized \(--dequantize\)'):
        prepare(path, str(tmp_path / 'n'), data=d, log=none, budget=pf - 2048)
    # (a budget under what the code and interpreter take alone: one paragraph that still
    # names the int8 plan and the dequantized one)
    with pytest.raises(PrepareError, match=r'(?s)code and MicroPython interpreter.*plans about '
                                           r'.*dequantized \(--dequantize\)'):
        prepare(path, str(tmp_path / 'n'), data=d, log=none, budget=pf // 2)


def test_luts_of_the_same_tables_share_one_copy():
    """An unrolled RNN's gates at each step (a LUT layer a step): those whose tables are
    the same bytes get one offset in q8.req (quant.as_written) and one copy of their
    outputs on the board (utrain.q8lut.tables), the others their own; the derivatives
    are read from q8.req when the gradient is made, into one array the net's LUT layers
    share, and scale the gradient as the table's lists do; the plan prices that."""
    import io
    from array import array
    from types import SimpleNamespace
    from utrain import q8lut
    from host_tools.plan.memory import _q8_net
    r = np.random.default_rng(3)
    t = r.integers(-128, 128, 256).tolist()
    dt = r.integers(-3000, 30000, 256).tolist()
    lut = lambda tt, i: {'k': quant.LUT, 'zx': 0, 'zy': 0, 'lo': -128, 'hi': 127,   # noqa: E731
                         'nout': 8, 'in': [i], 'out': i + 1, 't': list(tt), 'dt': dt}
    m = {'ntensors': 5, 'nin': 8, 'layers': [lut(t, 0), lut(t[::-1], 1), lut(t, 2), lut(t, 3)]}
    outs, req = quant.as_written(m)
    lts = [d['lt'] for d in outs['q8.json']['layers']]
    assert lts[0] == lts[2] == lts[3] != lts[1] and len(req) == 2 * 768, lts
    net = SimpleNamespace(rf=io.BytesIO(bytes(req)))
    Ls = [SimpleNamespace(d=d, net=net, tt=None, back=1, nout=8, ins=[0], y=bytearray(8))
          for d in outs['q8.json']['layers']]
    x = bytearray(r.integers(0, 256, 8).astype(np.uint8).tobytes())
    for L in Ls:
        q8lut.fwd(L, net, [x])
    assert Ls[0].tt is Ls[2].tt is Ls[3].tt and Ls[1].tt is not Ls[0].tt
    assert list(Ls[0].tt) == [v & 255 for v in t] and list(Ls[1].tt) == [v & 255 for v in t[::-1]]
    # the gradient: as a layer whose tables are q8.json's lists (no q8.req) makes it
    ref = SimpleNamespace(d=m['layers'][0], net=None, tt=None, back=1, nout=8, ins=[0],
                          y=bytearray(8))
    q8lut.fwd(ref, None, [x])
    assert ref.y == Ls[0].y
    for L in Ls[:2]:
        g = array('i', r.integers(-40000, 40000, 8).tolist())
        want, s = q8lut.back(ref if L is Ls[0] else SimpleNamespace(
            d=m['layers'][1], x=x, nout=8, dt=array('h', dt)), None, array('i', g), 0.5)
        got, s2 = q8lut.back(L, net, array('i', g), 0.5)
        assert list(got) == list(want) and s2 == s and any(got)
    one = dict(outs['q8.json'], layers=outs['q8.json']['layers'][:1])
    two = dict(outs['q8.json'], layers=outs['q8.json']['layers'][:2])
    four = outs['q8.json']
    o = [_q8_net(x, {'optimizer': 'sgd', 'batch': 1}, 4, 16, trains=False)['layer objects']
         for x in (one, two, four)]
    # (the second table: its outputs alone; the third and fourth: none)
    assert o[1] - o[0] == 256 + 16 + 256 and o[2] - o[1] == 2 * 256, o
