"""Pre-train the zoo's DS-CNN with utrain (no TensorFlow) and quantize it to int8:
`python -m bench.zoo.pretrain_dscnn` rewrites bench/zoo/keras/dscnn_kws_int8.tflite.

Why: the Keras DS-CNN of make_keras.py (8 epochs, BatchNormalization's moving statistics
barely warmed up) exports at chance accuracy even on its own training data (6 % on
dscnn_kws_data.npz, float and int8 alike) and its int8 activations carry almost nothing
after the third block (a sample's MEAN output differs from another's by ~2 int8 steps),
so no fine-tuning task on it is learnable.  Here the float model
(dscnn_kws_float.tflite, BN folded) trains every layer on make_keras.py's data_kws
(noise 0.7, 512 samples, Adam) with utrain's own float trainer, then is quantized as the
TFLite converter does it, into the int8 model's graph (same ops, tensors and layout):
weights symmetric per output channel (CONV_2D, DEPTHWISE_CONV_2D) or per tensor (FC),
int32 biases at s_x * s_W, activations asymmetric from their min/max over the
calibration samples (TFLite Micro runs the float graph to measure them), the final
SOFTMAX's output kept at 1/256."""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

KERAS = os.path.join(ROOT, 'bench', 'zoo', 'keras')


def data_kws(n, seed, noise=0.7):
    # make_keras.py's data_kws templates (seed 1) with new noise draws
    t = np.random.default_rng(1).standard_normal((12, 49, 10)).astype(np.float32)
    r = np.random.default_rng(seed)
    y = r.integers(0, 12, n)
    x = t[y] + noise * r.standard_normal((n, 49, 10))
    return x[..., None].astype(np.float32), y


def _act_q(lo, hi):
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    s = (hi - lo) / 255.0 or 1.0
    z = int(np.clip(round(-128 - lo / s), -128, 127))
    return s, z


def quantize_into(fpath, qpath, out, x):
    """The float graph fpath's weights quantized into qpath's int8 graph (same ops),
    activation ranges measured on samples x; written to out."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.formats.circle_io import read_model
    from host_tools.graph.inout import save_graph
    gf, gq = read_model(fpath), read_model(qpath)
    assert [o.name for o in gf.ops] == [o.name for o in gq.ops]
    ranges = {}
    with tempfile.TemporaryDirectory() as d:
        for i, op in enumerate(gf.ops[:-1]):          # every output but the softmax's
            g = read_model(fpath)
            k = g.ops[i].outputs[0]
            g.ops, g.outputs = g.ops[:i + 1], [k]
            p = os.path.join(d, 'cut.tflite')
            save_graph(g, p)
            it = runtime.Interpreter.from_file(p)
            v = []
            for s in x:
                it.set_input(s[None], 0)
                it.invoke()
                v.append(it.get_output(0).ravel().copy())
            v = np.array(v)
            ranges[i] = (v.min(), v.max())
    aq = {gq.inputs[0]: _act_q(x.min(), x.max())}
    for i, op in enumerate(gq.ops[:-1]):
        aq[op.outputs[0]] = _act_q(*ranges[i])
    for k, (s, z) in aq.items():
        t = gq.tensors[k]
        t.quant = dict(t.quant, scale=[s], zero_point=[z])
    for opf, opq in zip(gf.ops, gq.ops):
        if opq.name not in ('CONV_2D', 'DEPTHWISE_CONV_2D', 'FULLY_CONNECTED'):
            continue
        w = gf.tensors[opf.inputs[1]].data.astype(np.float64)
        b = gf.tensors[opf.inputs[2]].data.astype(np.float64)
        tw, tb = gq.tensors[opq.inputs[1]], gq.tensors[opq.inputs[2]]
        sx = aq[opq.inputs[0]][0]
        if opq.name == 'FULLY_CONNECTED':
            sw = np.array([np.abs(w).max() / 127.0])
            wq = np.round(w / sw[0])
        else:
            ax = 3 if opq.name == 'DEPTHWISE_CONV_2D' else 0
            wm = np.moveaxis(w, ax, 0).reshape(w.shape[ax], -1)
            sw = np.maximum(np.abs(wm).max(1), 1e-12) / 127.0
            shape = [1] * w.ndim
            shape[ax] = -1
            wq = np.round(w / sw.reshape(shape))
        tw.data = np.clip(wq, -127, 127).astype(np.int8).reshape(tw.shape)
        tw.quant = dict(tw.quant, scale=[float(v) for v in sw], zero_point=[0] * len(sw))
        bs = sx * sw if len(sw) > 1 else np.full(len(b), sx * sw[0])
        tb.data = np.round(b / bs).astype(np.int32).reshape(tb.shape)
        tb.quant = dict(tb.quant, scale=[float(v) for v in (bs if len(sw) > 1 else bs[:1])],
                        zero_point=[0] * (len(sw) if len(sw) > 1 else 1))
    save_graph(gq, out)
    return out


def accuracy(path, x, y):
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(path)
    q = it.get_input_details(0)['quantization_parameters']
    hit = 0
    for s, c in zip(x, y):
        if len(q['scales']):
            s = np.clip(np.round(s / q['scales'][0]) + q['zero_points'][0], -128, 127).astype(np.int8)
        it.set_input(s[None], 0)
        it.invoke()
        hit += int(it.get_output(0).argmax() == c)
    return hit / len(y)


def main(epochs=8, out=None):
    from host_tools.target import runner
    from host_tools.prepare.pipeline import prepare, export
    fpath = os.path.join(KERAS, 'dscnn_kws_float.tflite')
    qpath = os.path.join(KERAS, 'dscnn_kws_int8.tflite')
    out = out or qpath
    with tempfile.TemporaryDirectory() as d:
        x, y = data_kws(512, 11)
        np.savez(os.path.join(d, 'pre.npz'), x=x, y=y)
        run = os.path.join(d, 'run')
        prepare(fpath, run, data=os.path.join(d, 'pre.npz'), test_split=0.25, loss='scce',
                optimizer='adam', lr=0.003, batch=8, epochs=epochs, train='all')
        code, text = runner.run(run, python=True, stream=False)
        if code:
            raise RuntimeError(text.strip().splitlines()[-1])
        trained = os.path.join(d, 'float.tflite')
        export(fpath, os.path.join(run, 'trained.wof'), trained)
        quantize_into(trained, qpath, out, x[:128])
        xt, yt = data_kws(256, 12)
        print('float %.3f, int8 %.3f test accuracy (noise 0.7, 256 new samples)'
              % (accuracy(trained, xt, yt), accuracy(out, xt, yt)))
    return out


if __name__ == '__main__':
    main()
