"""One SGD step of a prepared run against finite differences of a numpy forward
(tests/formats/test_rewrite.py, tests/formats/test_while.py)."""
import os

import numpy as np

from host_tools.formats.circle_io import read_model


def _every_tensor(path):
    """The tensors of every subgraph of the model file at path."""
    g = read_model(path)
    return g.tensors + [t for s in (g.subgraphs or {}).values() for t in s.tensors]


def step_is_the_gradient(src, forward, tmp_path, names, x, sensitive=None, exported=False):
    """One SGD step of prepare's run (mse, batch 1, host) on one sample of x moves each
    weight in names by -lr times the gradient the differences of the numpy forward give;
    sensitive: a weight the sample must reach (the first such sample is used); exported:
    the step read from the model `export` writes (src's tensors, by name, in any of its
    subgraphs: a WHILE body's weights), not from the run's weights."""
    from host_tools.prepare.pipeline import prepare
    from host_tools.target import runner
    from host_tools.files.wof import read_wof
    t = np.array([[0.3, -0.7]])

    def loss(x1, **p):
        return float(((forward(x1.astype(np.float64), **p) - t) ** 2).mean())

    def numeric(x1, name, v):
        num = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            d = np.zeros_like(v)
            d[i] = 1e-5
            num[i] = (loss(x1, **{name: v + d}) - loss(x1, **{name: v - d})) / 2e-5
        return num
    x1 = x[:1]
    if sensitive:
        v0 = next(t_.data for t_ in read_model(src).tensors if t_.name == sensitive)
        x1 = next(x[i:i + 1] for i in range(len(x))
                  if np.abs(numeric(x[i:i + 1], sensitive, v0.astype(np.float64))).max() > 1e-3)
    np.savez(tmp_path / 'd.npz', x=x1, y=t.astype(np.float32))
    out, lr = tmp_path / 'run', 0.01
    s = prepare(src, os.fspath(out), data=os.fspath(tmp_path / 'd.npz'), epochs=1, lr=lr,
                optimizer='sgd', batch=1, train='all', loss='mse', log=lambda *a: None)
    code, text = runner.run(os.fspath(out), python=True, stream=False)
    assert code == 0, text
    if exported:
        from host_tools.prepare.pipeline import export
        e = os.fspath(tmp_path / ('e' + os.path.splitext(src)[1]))
        export(src, os.fspath(out / 'trained.wof'), e)
        before = {t.name: t.data for t in _every_tensor(src) if t.data is not None}
        step = {t.name: (t.data - before[t.name]) / -lr for t in _every_tensor(e)
                if t.name in before and t.data.dtype.kind == 'f'}
    else:
        g = read_model(out / s['rewritten'] if s['rewritten'] else src)    # (None: as it was)
        w0, after = read_wof(out / 'weights.wof', g), read_wof(out / 'trained.wof', g)
        step = {g.tensors[k].name: (after[k] - w0[k]) / -lr for k in w0}
        before = {g.tensors[k].name: a for k, a in w0.items()}
    for name in names:
        assert name in step, (name, sorted(step))
        num = numeric(x1, name, before[name].astype(np.float64))
        np.testing.assert_allclose(step[name], num, rtol=2e-2, atol=2e-4, err_msg=name)
        assert np.abs(num).max() > 1e-3, name
    return step
