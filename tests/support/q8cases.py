"""int8 runs (trained as int8) the heap planner is held to, shared by test_memory (the
64-bit unix MicroPython) and test_boards32 (a 32-bit build)."""
import os

import numpy as np

from repo import ROOT, no_keep_best  # noqa: E402
KERAS = os.path.join(ROOT, 'bench', 'zoo', 'keras')
# name: (model, its data (an .npz, or (sample shape, classes): random samples), prepare settings)
CASES = {
    'mlp-all-sgd': ('mlp_int8.tflite', 'mlp_data.npz', dict(train='all')),
    'mlp-all-adam-b4': ('mlp_int8.tflite', 'mlp_data.npz', dict(train='all', optimizer='adam',
                                                                batch=4)),
    'dscnn-last2': ('dscnn_kws_int8.tflite', 'dscnn_kws_data.npz', dict(train='last:2')),
    'dscnn-last2-cache': ('dscnn_kws_int8.tflite', 'dscnn_kws_data.npz',
                          dict(train='last:2', cache=True)),
    'mbv2-last2-cache': ('mobilenetv2_035_96_int8.tflite', ((96, 96, 3), 10),
                         dict(train='last:2', cache=True)),
    # the sparse update (issue 29): the classifier, a pointwise conv at 1/2 and the biases
    # of the three layers below it (on 1-bit masks), batch 1 sgd
    'dscnn-sparse': ('dscnn_kws_int8.tflite', 'dscnn_kws_data.npz',
                     dict(train='last:2', ranks={8: 2, 7: 1, 6: 1, 5: 1})),
    # SGD momentum: an int16 velocity a trained weight (utrain.q8mom), all of them, and
    # of the sparse scheme's window and classifier
    'mlp-all-sgdm': ('mlp_int8.tflite', 'mlp_data.npz', dict(train='all', momentum=0.9)),
    'dscnn-sparse-sgdm': ('dscnn_kws_int8.tflite', 'dscnn_kws_data.npz',
                          dict(train='last:2', ranks={8: 2, 7: 1, 6: 1, 5: 1}, momentum=0.9)),
    # the classifier, the last 1x1 conv (1280 x 112) at 1/8, the biases of the block
    # below it, with the prefix cache
    'mbv2-sparse-cache': ('mobilenetv2_035_96_int8.tflite', ((96, 96, 3), 10),
                          dict(train='last:2', ranks={65: 5, 64: 1, 63: 1, 62: 1}, cache=True)),
    # the classifier and the biases of the four layers below it (the last 1x1 conv's
    # weights read from flash a chunk at a time for the input gradient)
    'mbv2-biases-cache': ('mobilenetv2_035_96_int8.tflite', ((96, 96, 3), 10),
                          dict(train='last:2', ranks={65: 1, 64: 1, 63: 1, 62: 1}, cache=True)),
    # ... with SGD momentum (bias4 of bench/sparse.py: the classifier's 12,800 int16
    # velocities; the bias-only layers' float scales dropped at setup: 195.8 KB planned,
    # 191 KB needed on 32-bit unix, 204.5 / 200 before)
    'mbv2-biases-cache-sgdm': ('mobilenetv2_035_96_int8.tflite', ((96, 96, 3), 10),
                               dict(train='last:2', ranks={65: 1, 64: 1, 63: 1, 62: 1}, cache=True,
                                    momentum=0.9)),
}
# ... and one the tests leave to bench/memory.py --int8 (a 600 KB heap)
BENCH = dict(CASES, **{'dscnn-all': ('dscnn_kws_int8.tflite', 'dscnn_kws_data.npz',
                                     dict(train='all'))})


def prepared(prepare, case, tmp_path, **extra):
    """prepare's summary of case in tmp_path/o: 8 samples (6 train), one epoch, no
    validation-gated saving (the run ends saving its weights)."""
    model, data, kw = BENCH[case]
    small = str(tmp_path / 'd.npz')
    if isinstance(data, tuple):
        rng = np.random.default_rng(0)
        np.savez(small, x=rng.random((8,) + data[0], dtype=np.float32),
                 y=rng.integers(0, data[1], 8))
    else:
        with np.load(os.path.join(KERAS, data)) as z:
            np.savez(small, x=z['x'][:8], y=z['y'][:8])
    out = str(tmp_path / 'o')
    s = prepare(os.path.join(KERAS, model), out, data=small, loss='scce', epochs=1,
                test_split=0.25, log=lambda *a: None, **kw, **extra)
    no_keep_best(out)
    return out, s


def digits_cnn_int8(prepare, tmp_path, n, name='o'):
    """The digits CNN taken to int8 (per-channel conv and depthwise scales) in
    tmp_path/name, prepared on the first n digits: SGD batch 1, one epoch, lr 0.01."""
    d = np.load(os.path.join(ROOT, 'datasets', 'digits', 'digits.npz'))
    data = str(tmp_path / 'd.npz')
    np.savez(data, x=d['x'][:n], y=d['y'][:n])
    out = str(tmp_path / name)
    prepare(os.path.join(ROOT, 'datasets', 'digits', 'digits_cnn.circle'), out, data=data,
            loss='scce', optimizer='sgd', batch=1, epochs=1, lr=0.01, int8=True,
            log=lambda *a: None)
    return out


def assert_exported_logits_as_board(model, run_dir, net, x, tmp_path):
    """export --quantized of run_dir's trained.wof into model, cut before its last op (the
    softmax): TFLite Micro's int8 logits on the samples x are net's forward (a Q8Net that
    holds the trained weights), bit for bit."""
    from tflite_micro.python.tflite_micro import runtime
    from host_tools.formats.circle_io import read_model
    from host_tools.graph.inout import save_graph
    from host_tools.prepare.pipeline import export
    q = os.path.join(str(tmp_path), 'q.tflite')
    export(model, os.path.join(run_dir, 'trained.wof'), q, quantized=True)
    g = read_model(q)
    g.ops, g.outputs = g.ops[:-1], [g.ops[-2].outputs[0]]      # (the logits)
    cut = save_graph(g, os.path.join(str(tmp_path), 'cut.tflite'))
    it = runtime.Interpreter.from_file(cut)
    shape = [1] + list(g.tensors[g.inputs[0]].shape[1:])
    for v in x:
        xq = net.quantize_input(v.ravel().tolist())
        ours = np.frombuffer(bytes(net.forward(xq)), np.int8)
        it.set_input(np.frombuffer(bytes(xq), np.int8).reshape(shape), 0)
        it.invoke()
        assert np.array_equal(ours, it.get_output(0).ravel())


def tflm_agrees(path, net, xs, distinct=None):
    """utrain.q8's forward (the Q8Net net) of each int8 sample in xs is TFLite Micro's on
    the model file path, bit for bit; at least distinct of the outputs differ (all of them
    unless given, 0: no check).  Returns how many differ."""
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_file(path)
    shape = it.get_input_details(0)['shape']
    outs = set()
    for i, xq in enumerate(xs):
        got = np.frombuffer(bytes(net.forward(bytearray(np.asarray(xq, np.int8).tobytes()))),
                            np.int8)
        it.set_input(np.asarray(xq, np.int8).reshape(shape), 0)
        it.invoke()
        assert np.array_equal(got, it.get_output(0).ravel()), i
        outs.add(got.tobytes())
    assert len(outs) >= (len(xs) if distinct is None else distinct), len(outs)
    return len(outs)
