"""ONERT as a test oracle (inference and training), plus float64 numpy references.

ONERT facts verified here against onert 0.1.0 (PyPI wheel) with the experiments in
``verify_onert_facts()`` (run ``python tests/support/onert_ref.py``; tests/formats/test_circle_io.py
re-checks the decisive ones). Model used: FC(8->16, RELU) - FC(16->4) - SOFTMAX unless
said otherwise.

(a) ``num_of_trainable_ops = N`` counts the last N operators of ANY kind in execution
    order, not only operators that own weights. With FC-RELU-FC-SOFTMAX (ops 0..3):
    N=1 -> nothing changes (only SOFTMAX is "trainable"), N=2 -> only the second FC
    (weights and bias) changes, N=3 -> still only the second FC (RELU has no weights),
    N=4 or -1 -> both FCs change, N=0 -> nothing. The updates of the trained layers are
    identical (1e-7) to the full-training numpy reference restricted to those layers:
    gradients still flow through the frozen ops.
(b) SGD, reduction 'mean' (SUM_OVER_BATCH_SIZE): ``w -= lr * sum_b(g_b) / batch``, with
    g_b the per-sample gradient. Matches the float64 numpy reference to ~1e-7 for CCE at
    batch 1 and 4 and for MSE (MSE's per-sample loss is the mean over the output
    elements: dL/dy = 2 (y - t) / (batch * n_out)), over two epochs.
(c) reduction 'sum' (SUM): the loss gradient is NOT divided by the batch size and SGD
    does not divide either: ``w -= lr * sum_b(g_b)``. For MSE the per-sample loss is
    still the mean over output elements (dL/dy = 2 (y - t) / n_out).
(d) Adam: TensorFlow form, ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    ``lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)``, ``w -= lr_t m / (sqrt(v) + eps)``, g the
    batch-mean gradient, t counting optimizer steps (batches) from 1 across epochs
    (3 epochs x 2 batches match to 3e-7; restarting t, m, v each epoch is off by 3e-2).
    The Python ``optimizer.Adam(beta1, beta2, epsilon)`` arguments are NOT passed to the
    runtime (``traininfo`` has only learning_rate/batch_size/loss/opt/num_of_trainable_ops):
    ONERT always uses its built-in defaults beta1 0.9, beta2 0.999, eps 1e-7. Evidence: with
    gradients ~1e-6 (tiny inputs) eps matters; the reference with eps=1e-7 matches to
    ~1e-7, eps=1e-8 is off by ~1e-4; passing Adam(epsilon=1e-3) to onert changes nothing.
(e) samples not a multiple of batch: the python DataLoader pads the LAST, incomplete batch
    with ``np.resize`` of that batch itself, i.e. it repeats the samples of the last batch
    (6 samples, batch 4 -> batches [0,1,2,3], [4,5,4,5]); it does not take samples from
    the start of the data set and does not drop the batch. (shared/formats.md's
    "repeating samples from the start" means: from the start of the last batch.)
    The padded batch counts as a full batch (divided by 4).
(f) CCE: with a model ending in SOFTMAX the outputs are taken as probabilities: loss
    ``-sum(t * log(max(y, 1e-20)))``, gradient ``-t / max(y, 1e-20)`` (divided by batch
    for 'mean'), fed through the SOFTMAX op's own backward -- NOT fused into ``p - t``:
    with a saturated softmax (bias [60,-60,0,0], target class 1, p_1 = 0 in float32) no
    weight changes at all, where ``p - t`` would move b2[1] by lr. A model WITHOUT a final
    SOFTMAX is treated as producing logits: ONERT applies softmax itself and the gradient
    at the outputs is ``softmax(z) - t`` (/batch for 'mean'); the ``-t/y`` hypothesis is
    off by 3e-2 there, the logits one matches to 1.5e-7. There is no from_logits option in
    the Python API.
Other ONERT 0.1.0 behaviour seen while building these models:

* the cpu FULLY_CONNECTED kernel refuses a fused TANH at run time ("Unsupported fused
  activation function"); fused NONE/RELU/RELU6 work;
* RESHAPE must have the int32 shape tensor as its second input (options alone: "Invalid
  number of input tensors"); circle_build adds it when given only ``new_shape``;
* a ``CIRCLE_TRAINING`` metadata entry that is not a valid training-info flatbuffer makes
  ONERT refuse to load the model, for inference too ("TrainingInfo buffer is not
  accessible");
* buffers stored by offset/size (not inline data) are not supported by its loader (crash);
* ``train_export_circle`` keeps the model's metadata.

Reference implementations: :func:`numpy_forward`, :func:`numpy_train` (float64; FC with
fused NONE/RELU/RELU6/TANH, RELU, RELU6, LOGISTIC, TANH, SOFTMAX, RESHAPE chains; CCE and
MSE; mean/sum; SGD/Adam; trainable_ops counted as in (a); batches padded as in (e)).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile

import numpy as np

from repo import ROOT as _ROOT  # noqa: E402
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from host_tools.formats.circle_io import Graph, read_model, tensor_data  # noqa: E402

__all__ = ["onert_infer", "onert_train", "numpy_forward", "numpy_train", "onert_batches",
           "trainable_op_indices", "verify_onert_facts"]

CCE_THRESHOLD = 1e-20      # cker's log_threshold<float>()


# --------------------------------------------------------------------------- ONERT

def onert_infer(circle_path, x: np.ndarray, output: int = 0) -> np.ndarray:
    """Run ONERT inference of a one-input model whose batch dim is 1: its output number
    ``output``.

    ``x`` carries a leading batch dimension; samples are run one at a time and the
    outputs stacked along axis 0."""
    import onert.infer

    x = np.asarray(x, dtype=np.float32)
    sess = onert.infer.session(os.fspath(circle_path))
    outs = [np.array(sess.infer([np.ascontiguousarray(x[i:i + 1])])[output], copy=True)
            for i in range(x.shape[0])]
    return np.concatenate(outs, axis=0)


def onert_train(circle_path, x, y, *, loss="cce", reduction="mean", optimizer="sgd", lr,
                batch, epochs=1, trainable_ops=-1, out_path) -> str:
    """Train with onert.experimental.train, data in the given order (no shuffling), and
    write the trained model to ``out_path``. Returns ``out_path``.

    Partial last batches are padded by ONERT's DataLoader (fact (e)). Adam uses ONERT's
    fixed beta1 0.9, beta2 0.999, eps 1e-7 (fact (d))."""
    from onert.experimental.train import DataLoader, losses, optimizer as opt_mod, session

    circle_path = os.path.abspath(os.fspath(circle_path))
    out_path = os.path.abspath(os.fspath(out_path))
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.float32)
    if loss == "cce":
        loss_obj = losses.CategoricalCrossentropy(reduction=reduction)
    elif loss == "mse":
        loss_obj = losses.MeanSquaredError(reduction=reduction)
    else:
        raise ValueError(f"loss must be 'cce' or 'mse', not {loss!r}")
    if optimizer == "sgd":
        opt = opt_mod.SGD(learning_rate=lr)
    elif optimizer == "adam":
        opt = opt_mod.Adam(learning_rate=lr)
    else:
        raise ValueError(f"optimizer must be 'sgd' or 'adam', not {optimizer!r}")
    opt.nums_trainable_ops = int(trainable_ops)

    with contextlib.redirect_stdout(io.StringIO()):
        sess = session(circle_path)
        sess.compile(optimizer=opt, loss=loss_obj, batch_size=int(batch))
        if epochs > 0:
            sess.train(DataLoader([x], [y], batch_size=int(batch)), epochs=int(epochs))

    # train_export_circle silently writes nothing for paths longer than 15 characters:
    # export to a short relative name inside a temporary working directory.
    tmpdir = tempfile.mkdtemp(prefix="onert_ref_")
    old_cwd = os.getcwd()
    try:
        os.chdir(tmpdir)
        sess.train_export_circle("o.circle")
        if not os.path.exists("o.circle"):
            raise RuntimeError("ONERT train_export_circle wrote no file")
        os.chdir(old_cwd)
        os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
        shutil.move(os.path.join(tmpdir, "o.circle"), out_path)
    finally:
        os.chdir(old_cwd)
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out_path


# --------------------------------------------------------------------------- numpy reference

def _graph(g) -> Graph:
    return g if isinstance(g, Graph) else read_model(g)


def _act(name, z):
    if name in (None, "NONE"):
        return z
    if name == "RELU":
        return np.maximum(z, 0.0)
    if name == "RELU6":
        return np.clip(z, 0.0, 6.0)
    if name == "TANH":
        return np.tanh(z)
    if name == "LOGISTIC":
        return 1.0 / (1.0 + np.exp(-z))
    raise NotImplementedError(f"activation {name}")


def _act_grad(name, out, d):
    if name in (None, "NONE"):
        return d
    if name == "RELU":
        return d * (out > 0)
    if name == "RELU6":
        return d * ((out > 0) & (out < 6))
    if name == "TANH":
        return d * (1.0 - out * out)
    if name == "LOGISTIC":
        return d * out * (1.0 - out)
    raise NotImplementedError(f"activation {name}")


def _batched_shape(shape, n):
    shape = list(shape)
    if shape and shape[0] == 1:
        shape[0] = n
    return tuple(shape)


def numpy_forward(graph, x, weights=None):
    """float64 forward pass; returns {tensor index: value} (leading dim = batch)."""
    g = _graph(graph)
    w = weights if weights is not None else {
        t.index: t.data.astype(np.float64) for t in g.tensors if t.data is not None}
    vals = dict(w)
    n = x.shape[0]
    vals[g.inputs[0]] = np.asarray(x, dtype=np.float64).reshape(
        _batched_shape(g.tensors[g.inputs[0]].shape, n))
    for op in g.ops:
        a = vals[op.inputs[0]]
        oshape = _batched_shape(g.tensors[op.outputs[0]].shape, n)
        if op.name == "FULLY_CONNECTED":
            W = vals[op.inputs[1]]
            z = a.reshape(-1, W.shape[1]) @ W.T
            if len(op.inputs) > 2 and op.inputs[2] >= 0:
                z = z + vals[op.inputs[2]]
            out = _act(op.options.get("fused_activation_function"), z)
        elif op.name in ("RELU", "RELU6", "TANH", "LOGISTIC"):
            out = _act(op.name, a)
        elif op.name == "SOFTMAX":
            z = a * op.options.get("beta", 1.0)
            z = np.exp(z - z.max(axis=-1, keepdims=True))
            out = z / z.sum(axis=-1, keepdims=True)
        elif op.name == "RESHAPE":
            out = a
        else:
            raise NotImplementedError(op.name)
        vals[op.outputs[0]] = out.reshape(oshape)
    return vals


def trainable_op_indices(graph, trainable_ops: int) -> set[int]:
    """Fact (a): -1 = all ops, N = the last N operators of any kind."""
    g = _graph(graph)
    n = len(g.ops)
    if trainable_ops < 0:
        return set(range(n))
    return set(range(max(0, n - trainable_ops), n))


def onert_batches(n_samples: int, batch: int) -> list[np.ndarray]:
    """Sample indices of each batch as ONERT's DataLoader forms them (fact (e))."""
    out = []
    for s in range(0, n_samples, batch):
        idx = np.arange(s, min(s + batch, n_samples))
        out.append(np.resize(idx, batch))
    return out


def _loss_grad(loss, reduction, yp, t, from_logits=False):
    n = yp.shape[0]
    flat = int(np.prod(yp.shape[1:]))
    if loss == "mse":
        red = n * flat if reduction == "mean" else flat
        return 2.0 * (yp - t) / red
    if loss == "cce":
        if from_logits:       # model without a final SOFTMAX: ONERT normalises itself
            z = np.exp(yp - yp.max(axis=-1, keepdims=True))
            gy = z / z.sum(axis=-1, keepdims=True) - t
        else:
            gy = -t / np.maximum(yp, CCE_THRESHOLD)
        return gy / n if reduction == "mean" else gy
    raise ValueError(loss)


def _backward(g, vals, gy, trainable):
    """Gradients of the constant inputs of the trainable ops: {tensor index: grad}."""
    grads: dict[int, np.ndarray] = {}
    d = {g.outputs[0]: gy}
    lowest = min(trainable) if trainable else len(g.ops)
    for op in reversed(g.ops):
        if op.index < lowest:
            break
        dout = d.pop(op.outputs[0])
        out = vals[op.outputs[0]]
        a = vals[op.inputs[0]]
        if op.name == "FULLY_CONNECTED":
            W = vals[op.inputs[1]]
            dz = _act_grad(op.options.get("fused_activation_function"),
                           out.reshape(-1, W.shape[0]), dout.reshape(-1, W.shape[0]))
            a2 = a.reshape(-1, W.shape[1])
            if op.index in trainable:
                grads[op.inputs[1]] = dz.T @ a2
                if len(op.inputs) > 2 and op.inputs[2] >= 0:
                    grads[op.inputs[2]] = dz.sum(axis=0)
            din = (dz @ W).reshape(a.shape)
        elif op.name in ("RELU", "RELU6", "TANH", "LOGISTIC"):
            din = _act_grad(op.name, out, dout)
        elif op.name == "SOFTMAX":
            beta = op.options.get("beta", 1.0)
            din = beta * out * (dout - (dout * out).sum(axis=-1, keepdims=True))
        elif op.name == "RESHAPE":
            din = dout.reshape(a.shape)
        else:
            raise NotImplementedError(op.name)
        d[op.inputs[0]] = din
    return grads


def numpy_train(graph, x, y, *, loss="cce", reduction="mean", optimizer="sgd", lr, batch,
                epochs=1, trainable_ops=-1, beta1=0.9, beta2=0.999, eps=1e-7,
                weights=None):
    """float64 reference of ONERT training (facts (a)-(f)); returns the constant tensors
    {tensor index: float64 array} after training (untrained ones unchanged)."""
    g = _graph(graph)
    w = weights if weights is not None else {
        t.index: t.data.astype(np.float64) for t in g.tensors if t.data is not None}
    w = {k: np.array(v, dtype=np.float64) for k, v in w.items()}
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    trainable = trainable_op_indices(g, trainable_ops)
    from_logits = g.ops[-1].name != "SOFTMAX"
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v2 = {k: np.zeros_like(v) for k, v in w.items()}
    step = 0
    for _ in range(epochs):
        for idx in onert_batches(x.shape[0], batch):
            vals = numpy_forward(g, x[idx], w)
            yp = vals[g.outputs[0]]
            gy = _loss_grad(loss, reduction, yp, y[idx].reshape(yp.shape), from_logits)
            grads = _backward(g, vals, gy, trainable)
            step += 1
            for k, gk in grads.items():
                if optimizer == "sgd":
                    w[k] = w[k] - lr * gk
                elif optimizer == "adam":
                    m[k] = beta1 * m[k] + (1 - beta1) * gk
                    v2[k] = beta2 * v2[k] + (1 - beta2) * gk * gk
                    lr_t = lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
                    w[k] = w[k] - lr_t * m[k] / (np.sqrt(v2[k]) + eps)
                else:
                    raise ValueError(optimizer)
    return w


# --------------------------------------------------------------------------- experiments

def build_mlp(path, *, n_in=8, n_hidden=16, n_out=4, softmax=True, seed=0,
              identifier=b"CIR0", hidden_act="RELU", standalone_relu=True):
    """FC-RELU-FC-SOFTMAX (RELU standalone unless standalone_relu=False: then fused)."""
    from host_tools.formats.circle_build import CircleBuilder

    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=identifier)
    x = b.tensor("x", [1, n_in])
    w1 = b.tensor("w1", [n_hidden, n_in],
                  data=(rng.standard_normal((n_hidden, n_in)) * 0.5).astype(np.float32))
    b1 = b.tensor("b1", [n_hidden], data=(rng.standard_normal(n_hidden) * 0.1).astype(np.float32))
    h = b.tensor("h", [1, n_hidden])
    w2 = b.tensor("w2", [n_out, n_hidden],
                  data=(rng.standard_normal((n_out, n_hidden)) * 0.5).astype(np.float32))
    b2 = b.tensor("b2", [n_out], data=(rng.standard_normal(n_out) * 0.1).astype(np.float32))
    z = b.tensor("z", [1, n_out])
    if standalone_relu:
        h0 = b.tensor("h0", [1, n_hidden])
        b.op("FULLY_CONNECTED", [x, w1, b1], [h0])
        b.op(hidden_act, [h0], [h])
    else:
        b.op("FULLY_CONNECTED", [x, w1, b1], [h], fused_activation_function=hidden_act)
    b.op("FULLY_CONNECTED", [h, w2, b2], [z])
    out = z
    if softmax:
        out = b.tensor("y", [1, n_out])
        b.op("SOFTMAX", [z], [out], beta=1.0)
    b.inputs(x)
    b.outputs(out)
    return b.save(path)


def _maxdiff(a: dict, b: dict, keys=None) -> float:
    keys = keys if keys is not None else a.keys()
    return max(float(np.abs(np.asarray(a[k], np.float64) - b[k]).max()) for k in keys)


def verify_onert_facts(workdir, verbose=True) -> dict:
    """Run the experiments behind facts (a)-(f); returns {name: measured number}."""
    res: dict = {}
    say = print if verbose else (lambda *a, **k: None)
    os.makedirs(workdir, exist_ok=True)
    p = build_mlp(os.path.join(workdir, "mlp.circle"))
    g = read_model(p)
    w0 = tensor_data(p)
    rng = np.random.default_rng(42)
    X = rng.standard_normal((8, 8)).astype(np.float32)
    Y = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 8)]
    out = os.path.join(workdir, "t.circle")

    # (a) trainable ops
    for n in (0, 1, 2, 3, 4, -1):
        wt = tensor_data(onert_train(p, X, Y, lr=0.1, batch=4, trainable_ops=n, out_path=out))
        changed = sorted(g.tensors[k].name for k in w0 if np.any(wt[k] != w0[k]))
        ref = numpy_train(g, X, Y, lr=0.1, batch=4, trainable_ops=n)
        res[f"a_changed_{n}"] = changed
        res[f"a_err_{n}"] = _maxdiff(wt, ref)
        say(f"(a) N={n:2d}: changed {changed}  max|onert-ref| {res[f'a_err_{n}']:.2e}")

    # (b)/(c) SGD, CCE and MSE, mean and sum, batch 1 and 4, 2 epochs
    for loss in ("cce", "mse"):
        for red in ("mean", "sum"):
            for bs in (1, 4):
                wt = tensor_data(onert_train(p, X, Y, loss=loss, reduction=red, lr=0.05,
                                             batch=bs, epochs=2, out_path=out))
                ref = numpy_train(g, X, Y, loss=loss, reduction=red, lr=0.05, batch=bs,
                                  epochs=2)
                alt = numpy_train(g, X, Y, loss=loss,
                                  reduction="mean" if red == "sum" else "sum",
                                  lr=0.05, batch=bs, epochs=2)
                e, ea = _maxdiff(wt, ref), _maxdiff(wt, alt)
                res[f"bc_{loss}_{red}_b{bs}"] = e
                res[f"bc_{loss}_{red}_b{bs}_other"] = ea
                say(f"(b/c) SGD {loss} {red:4s} batch {bs}: |onert-ref| {e:.2e}   "
                    f"(other reduction's formula: {ea:.2e})")

    # (d) Adam, eps: tiny inputs make gradients ~1e-6 so eps matters
    Xs = (X * 1e-5).astype(np.float32)
    wt = tensor_data(onert_train(p, Xs, Y, optimizer="adam", lr=0.01, batch=4, epochs=2,
                                 out_path=out))
    for eps in (1e-7, 1e-8, 1e-6):
        ref = numpy_train(g, Xs, Y, optimizer="adam", lr=0.01, batch=4, epochs=2, eps=eps)
        res[f"d_eps_{eps:g}"] = _maxdiff(wt, ref)
        say(f"(d) Adam tiny grads, reference eps={eps:g}: |onert-ref| {res[f'd_eps_{eps:g}']:.2e}")
    wt2 = tensor_data(onert_train(p, X, Y, optimizer="adam", lr=0.01, batch=4, epochs=3,
                                  out_path=out))
    ref = numpy_train(g, X, Y, optimizer="adam", lr=0.01, batch=4, epochs=3)
    res["d_adam_normal"] = _maxdiff(wt2, ref)
    say(f"(d) Adam normal data, 3 epochs: |onert-ref| {res['d_adam_normal']:.2e}")
    wr = None
    for _ in range(3):      # hypothesis: m, v and t restart every epoch
        wr = numpy_train(g, X, Y, optimizer="adam", lr=0.01, batch=4, epochs=1, weights=wr)
    res["d_reset_per_epoch"] = _maxdiff(wt2, wr)
    say(f"(d) Adam if t, m, v restarted each epoch: |onert-ref| {res['d_reset_per_epoch']:.2e}")
    # Python-level epsilon argument is ignored by the runtime
    from onert.experimental.train import DataLoader, losses, optimizer as om, session
    with contextlib.redirect_stdout(io.StringIO()):
        s = session(os.path.abspath(p))
        s.compile(optimizer=om.Adam(learning_rate=0.01, epsilon=1e-3), batch_size=4,
                  loss=losses.CategoricalCrossentropy())
        s.train(DataLoader([Xs], [Y], batch_size=4), epochs=2)
    cwd = os.getcwd()
    try:
        os.chdir(workdir)
        s.train_export_circle("e.circle")
    finally:
        os.chdir(cwd)
    we = tensor_data(os.path.join(workdir, "e.circle"))
    res["d_python_eps_ignored"] = _maxdiff(we, {k: v.astype(np.float64) for k, v in wt.items()})
    say(f"(d) Adam(epsilon=1e-3) vs default: max diff {res['d_python_eps_ignored']:.2e}")

    # (e) 6 samples, batch 4
    X6, Y6 = X[:6], Y[:6]
    wt = tensor_data(onert_train(p, X6, Y6, lr=0.1, batch=4, out_path=out))
    ref = numpy_train(g, X6, Y6, lr=0.1, batch=4)                 # [4,5,4,5]
    from_start = numpy_train(g, np.concatenate([X6, X6[:2]]), np.concatenate([Y6, Y6[:2]]),
                             lr=0.1, batch=4)                      # [4,5,0,1]
    dropped = numpy_train(g, X6[:4], Y6[:4], lr=0.1, batch=4)
    res["e_repeat_last"], res["e_from_start"], res["e_dropped"] = (
        _maxdiff(wt, ref), _maxdiff(wt, from_start), _maxdiff(wt, dropped))
    say(f"(e) 6 samples batch 4: last batch [4,5,4,5] {res['e_repeat_last']:.2e}, "
        f"[4,5,0,1] {res['e_from_start']:.2e}, dropped {res['e_dropped']:.2e}")

    # (f) CCE without SOFTMAX (outputs kept positive): -t/y on raw outputs
    p2 = build_mlp(os.path.join(workdir, "nosm.circle"), softmax=False, seed=3)
    g2 = read_model(p2)
    names = {t.name: t.index for t in g2.tensors}
    kw, kb = names["w2"], names["b2"]
    d2 = tensor_data(p2)
    from host_tools.formats.circle_io import write_with_weights
    # positive second-layer weights and bias: the outputs stay > 0 (RELU hidden layer)
    write_with_weights(p2, p2, {kw: np.abs(d2[kw]) * np.float32(0.1),
                                kb: np.abs(d2[kb]) + np.float32(1.0)})
    g2 = read_model(p2)
    wt = tensor_data(onert_train(p2, X, Y, lr=0.01, batch=4, out_path=out))
    ref = numpy_train(g2, X, Y, lr=0.01, batch=4)
    res["f_no_softmax_logits"] = _maxdiff(wt, ref)
    say(f"(f) CCE, model without SOFTMAX vs softmax(z)-t reference: "
        f"{res['f_no_softmax_logits']:.2e}")
    # saturated softmax: -t/max(y,1e-20) through the softmax backward gives ~0
    p3 = build_mlp(os.path.join(workdir, "sat.circle"))
    kb3 = {t.name: t.index for t in read_model(p3).tensors}["b2"]
    write_with_weights(p3, p3, {kb3: np.array([60, -60, 0, 0], np.float32)})
    Xz, Yz = np.zeros((1, 8), np.float32), np.array([[0, 1, 0, 0]], np.float32)
    wb = tensor_data(p3)[kb3]
    wa = tensor_data(onert_train(p3, Xz, Yz, lr=0.1, batch=1, out_path=out))[kb3]
    res["f_saturated_change"] = float(np.abs(wa - wb).max())
    say(f"(f) saturated softmax, b2 change {res['f_saturated_change']:.2e} "
        "(fused p - t would give 1e-1)")
    return res


if __name__ == "__main__":
    verify_onert_facts(tempfile.mkdtemp(prefix="onert_facts_"))
