"""Training recipes (micro/utrain/optim.py): AdamW, weight decay for SGD, learning-rate
schedules, against PyTorch's AdamW/SGD and lr_scheduler stepped once per update; a
prepared run (prepare --optimizer adamw --weight-decay --schedule) trained by utrain
against PyTorch training the same model on the same batches over several epochs; the
schedule kept in the checkpoint, so a resumed run ends with the uninterrupted run's
weights bit for bit even when train.json changed the schedule's settings."""
import json
import os
import warnings

import numpy as np
import pytest

from test_parity import BACKENDS, new_trainer  # sys.path set up there
from host_tools.formats.circle_io import read_model
from host_tools.graph.passes import PrepareError
from host_tools.prepare.pipeline import prepare
from host_tools.target.runner import run
from host_tools.files.wof import read_wof

torch = pytest.importorskip('torch')
L = torch.optim.lr_scheduler
SCHEDULES = ('constant', 'linear', 'step', 'cosine')
LR, WARM, STEPS, STEP, GAMMA, FLOOR = 0.05, 4, 30, 7, 0.5, 0.1


def torch_sched(opt, kind, warmup, total):
    """PyTorch's schedulers for utrain's (kind, warmup, total): LinearLR warm-up from
    1/(warmup+1), then LinearLR to FLOOR, StepLR or CosineAnnealingLR to FLOOR * lr."""
    dec = {'constant': lambda: L.ConstantLR(opt, 1.0, 0),
           'linear': lambda: L.LinearLR(opt, 1.0, FLOOR, total - warmup),
           'step': lambda: L.StepLR(opt, STEP, GAMMA),
           'cosine': lambda: L.CosineAnnealingLR(opt, total - warmup, eta_min=FLOOR * LR)}[kind]
    if not warmup:
        return dec()
    return L.SequentialLR(opt, [L.LinearLR(opt, 1 / (warmup + 1), 1.0, warmup), dec()], [warmup])


CASES = [('adamw', dict(weight_decay=0.1, eps=1e-8), torch.optim.AdamW),
         ('sgd', dict(weight_decay=0.05), torch.optim.SGD),
         ('sgd', dict(weight_decay=0.05, momentum=0.9), torch.optim.SGD)]


@pytest.mark.parametrize('kind', SCHEDULES)
@pytest.mark.parametrize('warmup', [0, WARM])
@pytest.mark.parametrize('case', range(len(CASES)))
def test_update_rule_matches_pytorch(kind, warmup, case):
    from utrain.optim import Optimizer
    name, kw, cls = CASES[case]
    rng = np.random.default_rng(case)
    w0 = rng.standard_normal((3, 5))
    grads = rng.standard_normal((STEPS, 3, 5))
    o = Optimizer(name, lr=LR, momentum=kw.get('momentum', 0.0), eps=kw.get('eps', 1e-7))
    o.wd = kw['weight_decay']
    o.sched = (SCHEDULES.index(kind), warmup, STEPS, STEP, GAMMA, FLOOR, b'') \
        if kind != 'constant' or warmup else None
    w = w0.copy()
    o.init(0, w.shape)
    p = torch.nn.Parameter(torch.tensor(w0))
    opt = cls([p], lr=LR, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        sc = torch_sched(opt, kind, warmup, STEPS)
    lrs = []
    for g in grads:
        o.begin()
        lrs.append((o._lr, opt.param_groups[0]['lr']))
        o.step(0, w, g.copy())
        p.grad = torch.tensor(g)
        opt.step()
        sc.step()
    lrs = np.array(lrs)
    assert np.allclose(lrs[:, 0], lrs[:, 1], rtol=1e-12, atol=0), lrs
    assert len(set(np.round(lrs[:, 0], 12))) > (1 if kind != 'constant' or warmup else 0)
    # optimizer state is float32 on the device: agreement to float32 rounding
    ref = p.detach().numpy()
    assert np.abs(w - ref).max() < 1e-6 * max(1.0, np.abs(ref).max())
    assert np.abs(w - w0).max() > 1e-2


def test_schedule_option_parsing(tmp_path):
    from host_tools.files.validate import parse_schedule
    assert parse_schedule('cosine,warmup=10,min_lr=0.1') == {
        'schedule': 'cosine', 'warmup': 10, 'min_lr': 0.1}
    assert parse_schedule('step,step_size=100,gamma=0.5,steps=900')['schedule_steps'] == 900
    for bad in ('cosin', 'cosine,warm=3', 'step,step_size=x'):
        with pytest.raises(PrepareError, match='--schedule'):
            parse_schedule(bad)


def _mlp_onnx(folder):
    nn = torch.nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)).double().eval()
    path = os.path.join(folder, 'mlp.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        torch.onnx.export(m.float(), (torch.zeros(1, 6),), path, opset_version=17,
                          dynamo=False)
    return m.double(), path


N, BATCH, EPOCHS = 10, 4, 3          # 3 updates an epoch, the last of 2 samples


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('recipe', [
    ('adamw', 'cosine,warmup=2,min_lr=0.1', dict(weight_decay=0.05, eps=1e-8)),
    ('sgd', 'linear,warmup=3', dict(weight_decay=0.01, momentum=0.5)),
    ('sgd', 'step,step_size=2,gamma=0.5', dict(weight_decay=0.02))])
def test_prepared_run_matches_pytorch(recipe, backend, tmp_path):
    pytest.importorskip('onnx')
    opt_name, spec, kw = recipe
    model, path = _mlp_onnx(os.fspath(tmp_path))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, 6)).astype(np.float32)
    y = rng.integers(0, 3, N)
    np.savez(tmp_path / 'd.npz', x=x, y=y)
    d = os.fspath(tmp_path / 'run')
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer=opt_name, lr=LR, batch=BATCH, epochs=EPOCHS, schedule=spec,
            weight_decay=kw['weight_decay'], momentum=kw.get('momentum'), eps=kw.get('eps'),
            log=lambda *a: None)
    cfg = json.load(open(os.path.join(d, 'train.json')))
    assert cfg['optimizer'] == opt_name and cfg['weight_decay'] == kw['weight_decay']
    code, text = run(d, python=(backend == 'cpython'), stream=False)
    assert code == 0, text
    g = read_model(path)
    got = read_wof(os.path.join(d, 'trained.wof'), g)
    # PyTorch: the same batches (file order), mean cross-entropy, scheduler per update
    from host_tools.files.validate import parse_schedule
    sp = parse_schedule(spec)
    cls = torch.optim.AdamW if opt_name == 'adamw' else torch.optim.SGD
    opt = cls(model.parameters(), lr=LR, **kw)
    total = EPOCHS * -(-N // BATCH)
    dec = {'linear': lambda: L.LinearLR(opt, 1.0, sp.get('min_lr', 0.0), total - sp.get('warmup', 0)),
           'step': lambda: L.StepLR(opt, sp.get('step_size', 1), sp.get('gamma', 0.1)),
           'cosine': lambda: L.CosineAnnealingLR(opt, total - sp.get('warmup', 0),
                                                 eta_min=sp.get('min_lr', 0.0) * LR)}[sp['schedule']]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        w = sp.get('warmup', 0)
        sc = L.SequentialLR(opt, [L.LinearLR(opt, 1 / (w + 1), 1.0, w), dec()], [w]) if w else dec()
        xt, yt = torch.from_numpy(x.astype(np.float64)), torch.from_numpy(y)
        for _ in range(EPOCHS):
            for s in range(0, N, BATCH):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xt[s:s + BATCH]), yt[s:s + BATCH]).backward()
                opt.step()
                sc.step()
    ref = {name: p.detach().numpy() for name, p in model.named_parameters()}
    names = {t.index: t.name for t in g.tensors}
    checked = 0
    for k, arr in got.items():
        want = ref[names[k]]
        if want.ndim == 1:
            want = want.reshape(arr.shape)
        assert np.abs(arr - want).max() < 2e-5 * max(1.0, np.abs(want).max()), names[k]
        checked += 1
    assert checked == 4


def test_resume_continues_the_schedule_exactly(tmp_path):
    """Two epochs, a checkpoint in the middle of the second, a new Trainer given other
    schedule settings (and more epochs) resuming from it: the checkpoint's schedule goes
    on, and the weights equal the uninterrupted run's bit for bit."""
    from utrain.data import Dataset
    pytest.importorskip('onnx')
    _, path = _mlp_onnx(os.fspath(tmp_path))
    rng = np.random.default_rng(2)
    np.savez(tmp_path / 'd.npz', x=rng.standard_normal((N, 6)).astype(np.float32),
             y=rng.integers(0, 3, N))
    d = os.fspath(tmp_path / 'run')
    prepare(path, d, data=os.fspath(tmp_path / 'd.npz'), loss='scce', from_logits=True,
            optimizer='adamw', lr=LR, batch=2, epochs=3, schedule='cosine,warmup=3',
            weight_decay=0.1, shuffle=True, seed=4, log=lambda *a: None)
    cfg = json.load(open(os.path.join(d, 'train.json')))
    settings = {k: cfg[k] for k in ('weight_decay', 'schedule', 'warmup', 'schedule_steps',
                                    'step_size', 'gamma', 'min_lr')}
    ds = Dataset(os.path.join(d, 'train.ds'))
    a = new_trainer(os.path.join(d, 'model.flat'), os.path.join(d, 'weights.wof'))
    a.configure(**settings)
    for _ in range(3):
        a.train_epoch(ds)
    b = new_trainer(os.path.join(d, 'model.flat'), os.path.join(d, 'weights.wof'))
    b.configure(**settings)
    b.train_epoch(ds)
    ck = os.path.join(d, 'mid.ckpt')
    b.train_epoch(ds, ckpt=ck, every=4)          # saved after 4, then 8 samples of epoch 2
    c = new_trainer(os.path.join(d, 'model.flat'), os.path.join(d, 'weights.wof'))
    c.configure(**dict(settings, schedule='linear', warmup=0, epochs=7))
    c.load_checkpoint(ck)
    assert c.pos == 8 and c.epoch == 1
    assert c.opt.sched == a.opt.sched and a.opt.sched[0] == SCHEDULES.index('cosine')
    assert a.opt.sched[2] == 3 * 5                   # 3 epochs of 5 updates
    c.train_epoch(ds)
    c.train_epoch(ds)
    for k in a.net.trainable:
        assert np.array_equal(np.asarray(a.net.t[k]), np.asarray(c.net.t[k])), k



def test_a_step_schedule_that_stops_the_first_epoch_is_warned_of(tmp_path):
    """Issue 28 (a held-out run with --schedule step,step_size=2,gamma=0.5 as PyTorch's
    StepLR is given, in epochs: step_size counts updates, lr x 0.5^14 after 28 updates,
    and from the second epoch on the test loss stood still at 1.4170): prepare warns,
    saying that step_size counts updates and what gives every 2 epochs; a run whose lr
    keeps a thousandth after its first epoch is not warned of."""
    pytest.importorskip('onnx')
    _, path = _mlp_onnx(os.fspath(tmp_path))
    rng = np.random.default_rng(1)
    np.savez(tmp_path / 'd.npz', x=rng.standard_normal((N, 6)).astype(np.float32),
             y=rng.integers(0, 3, N))
    for spec, warned in (('step,step_size=2,gamma=0.1', True), ('step,step_size=10,gamma=0.1', False),
                         ('step,step_size=2,gamma=0.5', False), ('cosine', False)):
        said = []
        prepare(path, os.fspath(tmp_path / 'run'), data=os.fspath(tmp_path / 'd.npz'),
                loss='scce', from_logits=True, optimizer='sgd', lr=LR, batch=1, epochs=2,
                schedule=spec, log=said.append)
        w = [m for m in said if m.startswith('warning: --schedule step')]
        assert bool(w) == warned, (spec, said)
        if warned:      # 10 updates an epoch: 0.1 ** 5 after it
            assert 'lr x 1e-05 after the first epoch' in w[0] and 'step_size=20' in w[0], w


@pytest.mark.parametrize('recipe', [dict(weight_decay=0.01), dict(schedule='cosine'),
                                    dict(schedule='constant,warmup=5')])
def test_int8_training_refuses_recipes(recipe, tmp_path):
    """The int8 path (q8train) has neither: prepare says so and what to do."""
    from q8cases import KERAS
    path = os.path.join(KERAS, 'mlp_int8.tflite')
    with np.load(os.path.join(KERAS, 'mlp_data.npz')) as z:
        np.savez(tmp_path / 'd.npz', x=z['x'][:8], y=z['y'][:8])
    with pytest.raises(PrepareError, match='--dequantize'):
        prepare(path, os.fspath(tmp_path / 'o'), data=os.fspath(tmp_path / 'd.npz'),
                loss='scce', log=lambda *a: None, **recipe)
    s = prepare(path, os.fspath(tmp_path / 'f'), data=os.fspath(tmp_path / 'd.npz'),
                loss='scce', dequantize=True, log=lambda *a: None, **recipe)
    assert not s.get('int8')
