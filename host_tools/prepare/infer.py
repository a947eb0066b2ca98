"""Inference on the host, to score a model on held-out data: `evaluate` (and the demo's
check of the model it exported).  The model runs in a reference runtime, not utrain's
code, so the score of an exported model says what the board's training did to it:

  float circle / tflite   ONERT (onert.infer, the runtime the circle format is for); a
                          float .tflite ONERT cannot run (ops it lacks) under TFLite Micro
  int8 tflite             TFLite Micro's interpreter (the int8 kernels a board runs;
                          ONERT 0.1.0 has no int8 FULLY_CONNECTED or MEAN): samples
                          quantized with the input's scale, outputs dequantized
  onnx                    ONNX Runtime (inference), samples in the model's own layout
  a float model none of   utrain's own forward (utrain_predictor: the board's code under
  these runs              CPython; evaluate names it as the runtime): tico's GRU; an .onnx
                          of one input where ONNX Runtime is not installed

predictor(path) returns a function from samples (one per row of the first axis, laid out
as the model's input) to outputs (float64, one row per sample)."""
from __future__ import annotations

import contextlib
import os

import numpy as np

from ..formats.circle_io import read_model
from ..target.device import light_gc


class InferError(ValueError):
    pass


class NoRuntime(InferError):
    """The runtime a model file runs under is not installed (ONNX Runtime), or cannot
    load the file (an opset newer than it knows); runtime: the name of what scores it
    instead (utrain's own forward), and why."""
    runtime = None


def _q(t):
    q = t.quant or {}
    return float((q.get('scale') or [1.0])[0]), int((q.get('zero_point') or [0])[0])


def _read_runnable(path):
    """The graph of the model file at path, refused (InferError) when no runtime can run
    it: ONERT and TFLite Micro are native code that crashes the process (a segmentation
    fault, no message) on a file whose op reads a tensor nothing writes; or when utrain
    would not run it as the file has it (a batch fixed in the file: validate.fixed_batch)."""
    from ..files.validate import fixed_batch, runnable
    from ..graph.passes import no_batch
    g = read_model(path)
    try:
        runnable(g)
    except ValueError as e:
        raise InferError(str(e)) from None
    for k in g.inputs:      # (a batch fixed in the file: ONERT's 'cannot run it' said nothing of it)
        why = no_batch(g, k) or fixed_batch(g, g.tensors[k])
        if why:
            raise InferError(why)
    return g


def unbatched(path):
    """(path, None), or for a file that fixes a batch of N > 1 (formats.batch) a copy with
    batch 1 in a temporary folder: (its path, the folder, kept while it runs); InferError
    where the batch is mixed with the data."""
    import tempfile
    from ..formats import batch as fb
    try:
        n = fb.check_batch(read_model(path))
    except fb.BatchError as e:
        raise InferError(str(e)) from None
    except ValueError:
        return path, None           # (_read_runnable says what is wrong with it)
    if n == 1:
        return path, None
    keep = tempfile.TemporaryDirectory(prefix='utrain-eval-')
    dst = os.path.join(keep.name, 'batch1' + os.path.splitext(os.fspath(path))[1])
    fb.set_batch(path, dst, n, 1)
    return dst, keep


def _onert_session(path):
    import onert.infer
    try:
        return onert.infer.session(os.fspath(path))
    except Exception as e:      # onert raises its own types
        raise InferError(f'{path}: ONERT cannot load it ({e})') from None


def _shapes_folded(g):
    """A copy of g whose run-time shape arithmetic (Keras 3's SHAPE -> STRIDED_SLICE ->
    PACK -> RESHAPE) is folded, whose global REDUCE_MAX is a MAX_POOL_2D and whose
    grouped CONV_2D is split into groups, as prepare rewrites them, and whose float
    HARD_SWISH is spelled in ADD / RELU6 / MUL (the same values), and whose WHILE of a
    fixed trip count is unrolled (loops.unroll_loops):
    ONERT 0.1.0 fails on some such graphs at run time, and gives NaN for a grouped
    convolution; Keras 3's Embedding reads its ids without the int32 SELECT_V2 neither
    runtime has (the same values for ids 0..N-1; a negative one is out of range there).
    None when nothing changes."""
    import copy
    from ..graph.inout import compact
    from ..graph.spellings import (dilated_convs, gathers_to_slices, hard_swish_expanded,
                                   reduce_max_to_pool, resize_to_concat, splits_to_slices,
                                   tile_to_concat)
    from ..graph.shapes import fold_shapes
    from ..graph.loops import reverse_to_concat, unroll_loops
    from ..graph.groups import split_groups
    from ..graph.embeddings import unwrap_ids
    h = copy.deepcopy(g)
    try:            # (ONERT 0.1.0 runs a Bidirectional layer's two WHILEs wrongly: 0.38 off)
        loops = reverse_to_concat(h) + unroll_loops(h) if h.n_subgraphs > 1 else 0
    except ValueError:      # (a trip count known at run time: ONERT runs the WHILE)
        h, loops = copy.deepcopy(g), 0
    if not (loops + fold_shapes(h) + reduce_max_to_pool(h) + split_groups(h)
            + unwrap_ids(h, keep=False) + dilated_convs(h) + tile_to_concat(h)
            + resize_to_concat(h) + hard_swish_expanded(h) + gathers_to_slices(h)
            + splits_to_slices(h)):
        return None
    compact(h)
    return h


def onert_predictor(path, g):
    """ONERT on the file, or on its graph with the shape arithmetic folded on the host
    (written to a temporary file) when it has some: ONERT 0.1.0 cannot run a graph whose
    shapes are computed at run time ("num_elements() cannot calculate when any dimension
    is unspecified")."""
    try:
        import onert.infer  # noqa: F401
    except ImportError:
        raise InferError(f'{path}: running a float model on the host needs ONERT: '
                         'pip install onert (the version in requirements.txt)') from None
    import tempfile
    shape = [1] + [int(d) for d in g.tensors[g.inputs[0]].shape[1:]]
    h, keep, src = _shapes_folded(g), None, path
    if h is not None:
        from ..graph.inout import save_graph
        keep = tempfile.TemporaryDirectory(prefix='utrain-eval-')
        src = save_graph(h, os.path.join(keep.name, 'model' + os.path.splitext(path)[1]))
    sess = _onert_session(src)

    def run(x, _keep=keep):
        try:
            return np.stack([np.asarray(sess.infer([np.ascontiguousarray(xi, np.float32).reshape(shape)])[0],
                                        np.float64).ravel() for xi in x])
        except Exception as e:      # onert raises its own types
            raise InferError(f'{path}: ONERT loads it but cannot run it ({e})') from None
    run.folded = keep is not None
    return run


def _tflm(path):
    """TFLite Micro's interpreter of the .tflite file path."""
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError:
        raise InferError(f'{path}: an int8 model runs on the host under TFLite Micro: pip install '
                         'tflite-micro (the version in requirements.txt)') from None
    sig = _crashes(runtime.Interpreter.from_file, os.fspath(path))
    if sig:
        raise InferError(f'{path}: TFLite Micro, which scores an int8 .tflite here, crashed '
                         f'loading it ({sig}, saying nothing): one of its int8 kernels cannot '
                         "take a layer of this model (TensorFlow Lite's tf.lite.Interpreter "
                         'can score it); utrain trains and exports it all the same')
    return _tflm_named(runtime.Interpreter.from_file, os.fspath(path))


def _crashes(fn, *a):
    """The signal's name when fn(*a) kills the process (TFLite Micro aborts in some int8
    kernels' prepare, no message: a Keras Softmax over two axes' SUB of a tensor from
    itself), tried in a forked child; else None (where there is no fork: None)."""
    if not hasattr(os, 'fork'):
        return None
    import signal
    pid = os.fork()
    if pid == 0:                    # (the child: its C++ log and any error go nowhere)
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 2)
            fn(*a)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status):
        return None
    n = os.WTERMSIG(status)
    try:
        return signal.Signals(n).name
    except ValueError:
        return f'signal {n}'


@contextlib.contextmanager
def _c_stderr():
    """A context whose process-level stderr (file descriptor 2, where the runtimes' C++
    code prints) goes to a list it gives, read as lines at the context's end: a runtime
    tried first and given up on (ONERT's 'Error during model prepare : Mean: unsupported
    data type', before TFLite Micro scored the model) says nothing to the user then."""
    import tempfile
    said = []
    with tempfile.TemporaryFile() as err:
        fd = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(fd, 2)
            os.close(fd)
            err.seek(0)
            said.extend(err.read().decode(errors='replace').splitlines())


def _tflm_named(fn, *a):
    """fn(*a), which calls TFLite Micro; where that fails, an InferError naming the op
    TFLite Micro's log names (on the process's stderr only, read here): an op it has no
    kernel for (GELU), or the node whose kernel failed (an int8 SQRT, and why)."""
    import re
    try:
        with _c_stderr() as said:
            return fn(*a)
    except RuntimeError as e:
        ops = sorted({m.group(1) for v in said for m in [re.search(
            r"find op for builtin opcode '(\w+)'", v)] if m})
        if ops:
            raise InferError(f'TFLite Micro has no kernel for {", ".join(ops)} ({e})') from None
        for i, v in enumerate(said):
            m = re.search(r'Node (\w+) \(number (\d+)\) failed to (\w+)', v)
            if m:
                why = f': {said[i - 1].strip()}' if i else ''
                raise InferError(f"TFLite Micro's {m.group(1)} kernel failed to "
                                 f'{m.group(3)}{why}') from None
        raise


def _as_input(t, v):
    """Values v as TFLite Micro takes them for input tensor t: an int8 / uint8 one's at its
    scale and zero point, else in its type (int32 / int64: an embedding's ids, as floats
    in the data)."""
    if t.dtype in ('int8', 'uint8'):
        (sc, z), (lo, hi) = _q(t), (-128, 127) if t.dtype == 'int8' else (0, 255)
        return np.clip(np.round(v / sc) + z, lo, hi).astype(t.dtype)
    return v.astype(np.float32 if t.dtype == 'float16' else t.dtype)


def _as_output(t, y):
    """Output tensor t's values y (float64) as reals: an int8 / uint8 one's dequantized."""
    return (y - _q(t)[1]) * _q(t)[0] if t.dtype in ('int8', 'uint8') else y


def tflm_predictor(path, g):
    it = _tflm(path)
    tin, tout = g.tensors[g.inputs[0]], g.tensors[g.outputs[0]]
    shape = [1] + [int(d) for d in tin.shape[1:]]

    def run(x):
        out = []
        for xi in x:
            it.set_input(_as_input(tin, np.asarray(xi, np.float64).reshape(shape)), 0)
            it.invoke()
            out.append(_as_output(tout, np.asarray(it.get_output(0), np.float64).ravel()))
        return np.stack(out)
    return run


def _tflm_folded(path, g, probe):
    """TFLite Micro on the file's graph as _shapes_folded makes it (the same values, in
    the form utrain trains and `export` writes: TFLite Micro has no int8 kernel for an
    int8 Keras Embedding's int32 SELECT_V2 or UpSampling2D's TILE, and its
    SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND around a dilated convolution give other values
    than TensorFlow's, NaN on a float file), else on the file as it is."""
    h, first = _shapes_folded(g), None
    if h is not None:
        import tempfile
        from ..graph.inout import save_graph
        keep = tempfile.TemporaryDirectory(prefix='utrain-eval-')
        try:
            run = tflm_predictor(save_graph(h, os.path.join(keep.name, 'model.tflite')), h)
            _tflm_named(run, probe)
            run.keep = keep
            return run
        except Exception as e:  # noqa: B902 - TFLite Micro's own types: the file as it is
            keep.cleanup()
            first = e if isinstance(e, InferError) else None
    try:
        run = tflm_predictor(path, g)
        _tflm_named(run, probe)
    except Exception:   # noqa: B902 - the folded graph's missing kernel is the one that
        if first:       # counts (the file's shape ops, REDUCE_PROD, fold away)
            raise first from None
        raise
    return run


def onnx_predictor(path):
    """ONNX Runtime (inference) on an .onnx model; the samples in the model's own input
    layout (NCHW for a PyTorch export), one at a time as the others run them."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise NoRuntime(f'{path}: an ONNX model runs on the host under ONNX Runtime: pip '
                         'install onnxruntime (the version in requirements.txt)') from None
    try:
        sess = ort.InferenceSession(os.fspath(path), providers=['CPUExecutionProvider'])
    except Exception as e:      # onnxruntime raises its own types
        # (a model of an opset newer than the installed ONNX Runtime knows, one that the
        # board trains, had been refused with ONNX Runtime's page of words: utrain's own
        # forward scores it, as where ONNX Runtime is not installed; its words, kept short
        # to their end, say why)
        why = ' '.join(str(e).split())
        why = why if len(why) <= 300 else '...' + why[-300:]
        err = NoRuntime(f'{path}: ONNX Runtime {ort.__version__} cannot load it ({why})')
        err.runtime = ('utrain\'s own forward (the board\'s code under CPython and numpy; '
                       f'ONNX Runtime {ort.__version__}, the reference runtime, cannot load the '
                       f'file: {why}' + ('; a newer onnxruntime may' if 'opset' in why else '')
                       + ')')
        raise err from None
    inp = sess.get_inputs()[0]
    if inp.shape and inp.shape[0] == 0:
        # (a file that fixes its batch at 0 samples, which prepare trains a sample at a
        # time: ONNX Runtime runs no sample of it, and evaluate had been refused with its
        # InvalidArgument words, saying nothing to do)
        err = NoRuntime(f'{path}: its input {inp.name} fixes a batch of 0 samples, which '
                        'ONNX Runtime runs none of')
        err.runtime = ('utrain\'s own forward (the board\'s code under CPython and numpy; the '
                       f'file fixes input {inp.name}\'s batch at 0, which ONNX Runtime runs no '
                       'sample of: export it with a batch of 1 or a dynamic one to score it '
                       'there)')
        raise err
    shape = [1] + [d if isinstance(d, int) else -1 for d in inp.shape[1:]]
    # an embedding's int64 / int32 ids come as floats in the data
    dt = {'tensor(int64)': np.int64, 'tensor(int32)': np.int32}.get(inp.type, np.float32)

    b = inp.shape[0] if isinstance(inp.shape[0], int) and inp.shape[0] > 1 else 1

    def ran(feed):
        try:
            return sess.run(None, feed)
        except Exception as e:      # noqa: B902 - onnxruntime raises its own types
            # (a batch of 0 fixed in the file: InvalidArgument's traceback had escaped)
            raise InferError(f'{path}: ONNX Runtime cannot run it on a sample of shape '
                             f'{list(next(iter(feed.values())).shape)} ('
                             + ' '.join(str(e).split())[:300] + ')') from None

    def run(x):
        if b > 1:       # (a batch fixed in the file: b samples a run, the last padded)
            x = np.asarray(x, np.float32).reshape([len(x)] + shape[1:])
            out = []
            for i in range(0, len(x), b):
                xi = x[i:i + b]
                xi = np.concatenate([xi, np.zeros((b - len(xi),) + xi.shape[1:], xi.dtype)])
                o = np.asarray(ran({inp.name: xi.astype(dt)})[0], np.float64)
                out.append(o.reshape(b, -1)[:min(b, len(x) - i)])
            return np.concatenate(out)
        return np.stack([np.asarray(ran({inp.name: np.ascontiguousarray(
            xi, np.float32).reshape(shape).astype(dt)})[0], np.float64).ravel() for xi in x])
    run.shape = shape       # (an image folder is read in its size and channels)
    run.out_shape = [1] + [d if isinstance(d, int) else -1 for d in sess.get_outputs()[0].shape[1:]]
    return run


def predictor(path, read=None):
    """(run, runtime name, graph or None) for the model file at path (read: its graph, as
    read_model read it already)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InferError(f'{path}: no such model file')
    if path.lower().endswith('.onnx'):
        try:
            run, missing = onnx_predictor(path), None
        except NoRuntime as e:
            run, missing = None, e
        # (refused as inspect and prepare refuse it: weights of NaN had been scored
        # 'cross-entropy nan'; a graph utrain does not read is ONNX Runtime's alone)
        from ..files.validate import runnable
        g = read
        if g is None:
            try:
                g = read_model(path)
            except ValueError as e:
                if missing is not None and missing.runtime:
                    # (neither reads it: the reader's words say what it is, what to do)
                    raise InferError(str(e)) from None
        if g is None and missing:
            raise missing
        if g is not None:
            try:
                runnable(g)
            except ValueError as e:
                raise InferError(str(e)) from None
        if missing:
            return _onnx_own_forward(path, g, missing), missing.runtime or _OWN_ONNX, None
        return run, 'ONNX Runtime', None
    g = _read_runnable(path)
    integer = any(g.tensors[i].dtype in ('int8', 'uint8') for i in list(g.inputs) + list(g.outputs))
    if integer and g.identifier != b'TFL3':
        raise InferError(_INT8_CIRCLE % path)
    probe = np.zeros([1] + [int(d) for d in g.tensors[g.inputs[0]].shape[1:]], np.float32)
    if integer:
        try:
            return _tflm_folded(path, g, probe), 'TFLite Micro', g
        except Exception as e:  # noqa: B902 - an int8 op it has no kernel for (SQRT)
            why = f'TFLite Micro cannot run it: {_first_line(e)}'
            return _rewritten_predictor(path, g, InferError(f'{path}: {why}'), True, why)
    try:
        with _c_stderr() as said:   # (ONERT's own print of why it fails: in e, not on stderr)
            run = onert_predictor(path, g)
            run(probe)
    except InferError as e:
        why = next((v.strip() for v in said if v.strip()), '')
        if why and why not in str(e):
            e = InferError(f'{e}: {why}')
        if g.identifier != b'TFL3':
            return _last_resort(path, g, e, probe)
        try:            # TFLite Micro runs float .tflite files too (ONERT 0.1.0 lacks ops)
            run = _tflm_folded(path, g, probe)
        except Exception:   # noqa: B902 - TFLite Micro cannot either (a float16 file's
            # DEQUANTIZE): the graph as prepare rewrites it, else ONERT's reason
            return _last_resort(path, g, e, probe, dequantized=any(
                t.dtype in ('float16', 'int8', 'uint8') for t in g.tensors))
        return run, 'TFLite Micro: ONERT cannot run it', g
    return run, 'ONERT' + (' on its graph as prepare rewrites it (shape ops folded, groups '
                           'split, embedding ids read directly, loops unrolled)' if run.folded
                           else ''), g


def _first_line(e) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[-1]


def _last_resort(path, g, why, probe, dequantized=False):
    """_rewritten_predictor, else (a float model no reference runtime here runs, as ONERT
    0.1.0 cannot run tico's GRU: 'Reshape: 2nd param is not compatible') utrain's own
    forward (utrain_predictor); the refusal why when neither runs it."""
    try:
        return _rewritten_predictor(path, g, why, dequantized)
    except InferError:
        pass
    try:
        run = utrain_predictor(path)
        run(probe)
    except Exception:       # noqa: B902 - prepare refuses it, or utrain cannot run it: the
        raise why from None     # runtime's own reason stands
    return run, ('utrain\'s own forward (the board\'s code under CPython and numpy; no '
                 'reference runtime here runs it: ' + _first_line(why) + ')'), g


_OWN_ONNX = ('utrain\'s own forward (the board\'s code under CPython and numpy; ONNX Runtime, '
             'the reference runtime, is not installed: pip install onnxruntime to score it '
             'there)')


def _onnx_own_forward(path, g, missing, output=None):
    """utrain_predictor of an .onnx model utrain reads (graph g) where ONNX Runtime is not
    installed (missing: its refusal, which stands when utrain cannot run it either), as a
    .circle ONERT cannot run falls back to it: samples in the file's own layout, as
    onnx_predictor takes them."""
    shape = [1] + [int(d) for d in g.tensors[g.inputs[0]].shape[1:]]
    try:
        run = utrain_predictor(path, output)
        run(np.zeros(shape, np.float32))
    except Exception as e:      # noqa: B902 - prepare refuses it, or utrain cannot run it
        raise InferError(f'{missing}; utrain\'s own forward cannot run it either: '
                         f'{_first_line(e)}') from None
    run.shape = shape
    if g.outputs:
        run.out_shape = [1] + [int(d) for d in g.tensors[g.outputs[0]].shape[1:]]
    return run


def _onnx_own_several(path, g, missing):
    """several_predictor's run(feeds, i) of an .onnx of several inputs under utrain's own
    forward (ONNX Runtime not installed; missing: its refusal, which stands when utrain
    cannot run it either): the inputs the output reads joined in their order, as prepare
    joins them (runplan.one_input_output), each in the file's own layout."""
    from ..graph.inout import io_name
    from ..plan.runplan import data_inputs
    names = [n for n, _, _ in data_inputs(g)[0]]
    try:
        run = utrain_predictor(path, io_name(g, g.outputs[0]) if len(g.outputs) > 1 else None)
        run(np.zeros((1, sum(int(np.prod(s[1:])) for _, s, _ in data_inputs(g)[0])),
                     np.float32))
    except Exception as e:      # noqa: B902 - prepare refuses it, or utrain cannot run it
        raise InferError(f'{missing}; utrain\'s own forward cannot run it either: '
                         f'{_first_line(e)}') from None

    def joined(feeds, i):
        return run(np.concatenate([np.asarray(feeds[n][i:i + 1], np.float32).reshape(1, -1)
                                   for n in names], 1))[0]
    joined.keep = run.keep
    return joined


def utrain_predictor(path, output=None):
    """utrain's forward of the model file at path: the folder `prepare` would write (no
    data, the input unscaled) read by utrain.trainer.Trainer under CPython and numpy,
    one sample at a time, as the board predicts.  For a float model no reference runtime
    here runs (or an .onnx where ONNX Runtime is not installed): the score then says what
    utrain computes, not an independent runtime.  output: --output, of a model of several."""
    import tempfile
    from .pipeline import prepare
    from ..target.device import module
    keep = tempfile.TemporaryDirectory(prefix='utrain-eval-')
    s = prepare(path, keep.name, scale_input=False, log=lambda *a, **k: None,
                **({'output': output} if output is not None else {}))
    perm = s.get('input_perm')
    tr = module('trainer').Trainer(os.path.join(keep.name, 'model.flat'),
                                   os.path.join(keep.name, 'weights.wof'))

    def run(x):
        out = []
        for xi in np.asarray(x, np.float32):
            xi = xi[None]
            if perm:
                xi = np.transpose(xi, perm)
            out.append(np.asarray(tr.predict(np.ascontiguousarray(xi).reshape(tr.x_shape)),
                                  np.float64).ravel())
        return np.stack(out)
    run.keep, run.folded = keep, False
    return run


def _rewritten_predictor(path, g, why, dequantized=False, reason=None):
    """(run, runtime, graph) of ONERT on the graph as prepare rewrites it (layout
    transposes cancelled, NHWC input; weights dequantized to float32), for a file no
    runtime here runs as it is (a tico ResNet block: 'Session preparation failed'; a
    float16 .tflite's DEQUANTIZE; an int8 op TFLite Micro has no kernel for, the model
    then scored in float as `prepare --dequantize` trains it); the refusal why when that
    fails too."""
    import tempfile
    from ..graph.inout import save_graph
    from ..plan.runplan import select_rewrite
    try:
        h = select_rewrite(g, 'none')[0]
        keep = tempfile.TemporaryDirectory(prefix='utrain-eval-')
        with _c_stderr():
            run = onert_predictor(save_graph(h, os.path.join(keep.name, 'model.circle')), h)
            run(np.zeros([1] + [int(d) for d in h.tensors[h.inputs[0]].shape[1:]], np.float32))
    except Exception:       # noqa: B902 - the file's own reason stands
        raise why from None
    run.keep = keep
    return run, 'ONERT on its graph as prepare rewrites it' + (
        ', dequantized to float32' if dequantized else '') + ' (the file as it is: ' + (
        reason or str(why).split('(', 1)[-1].rstrip(')')) + ')', h


def layout(x, shape, nchw=False, where='the data'):
    """x (samples on the first axis) laid out as a model input of shape [1, ...]: as it
    is when its values per sample match; transposed NCHW -> NHWC when x is 4-D with the
    model's dimensions in that order, or flat and nchw says it is."""
    shape = [int(d) for d in shape]
    want = int(np.prod(shape[1:]))
    if x.reshape(len(x), -1).shape[1] != want:
        raise InferError(f'{where}: {x.reshape(len(x), -1).shape[1]} values per sample, the model '
                         f'input {shape} takes {want}')
    from ..files.dataset import channels_first
    if (nchw and len(shape) in (3, 4)) or channels_first(x, shape):
        return np.moveaxis(x.reshape([len(x), shape[-1]] + shape[1:-1]), 1, -1), True
    return x.reshape([len(x)] + shape[1:]), False


def is_classifier(y, n_out):
    """Class labels (one per sample) or one-hot rows against n_out > 1 outputs."""
    y = np.asarray(y)
    if n_out < 2:
        return False
    if y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1):
        return bool(np.all(y == np.round(y)) and y.min() >= 0 and y.max() < n_out)
    return y.ndim == 2 and y.shape[1] == n_out and bool(np.all((y == 0) | (y == 1))) \
        and bool(np.all(y.sum(axis=1) == 1))


def step_scores(out, y):
    """scores() of outputs out (N, T, C: rows of C a step, dataset.per_step) against a
    class number a step (y (N, T)) or one-hot rows a step (y (N, T * C), a run's .ds): the
    steps right and the cross-entropy summed over a sample's steps (the board's cce
    loss); None for other outputs or targets."""
    from ..files.dataset import per_step, step_labels
    out, y = np.asarray(out, np.float64), np.asarray(y)
    ps = per_step([1] + list(out.shape[1:]))
    if not ps or not len(y) or not np.issubdtype(y.dtype, np.number):
        return None
    t, c = ps
    if y.size == len(y):
        raise InferError(f'one class number a sample, and the model outputs '
                         f'{list(out.shape[1:])} a sample, rows of {c} (e.g. a class a step): '
                         f'give a class number a row, shape (N, {t}), or --metric mae on targets '
                         'of its shape')
    if step_labels(y, [1] + list(out.shape[1:])) and y.min() >= 0 and y.max() < c:
        lab = y.reshape(len(y), t).astype(int)
    elif y[0].size == t * c and np.all((y == 0) | (y == 1)) and \
            np.all(y.reshape(len(y), t, c).sum(-1) == 1):
        lab = y.reshape(len(y), t, c).argmax(-1)
    else:
        return None
    p = out.reshape(len(out), t, c)
    probs = np.all(p >= 0) and np.allclose(p.sum(-1), 1, atol=0.05)
    if not probs:
        p = np.exp(p - p.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    hits = int(np.sum(p.argmax(-1) == lab))
    picked = np.take_along_axis(p, lab[..., None], -1)
    return {'metric': 'accuracy', 'accuracy': hits / lab.size, 'hits': hits, 'n': lab.size,
            'loss': float(-np.log(np.maximum(picked, 1e-12)).sum() / len(lab)),
            'loss_name': f'cross-entropy{"" if probs else " of the softmax"} a sample (the '
                         f'sum of its {t} steps\'; accuracy counts the steps)'}


def scores(out, y, metric=None):
    """{'metric', value, 'loss', ...} of outputs out against targets y: accuracy and the
    cross-entropy (of the outputs as probabilities when they are, else of their softmax)
    for a classifier, MSE and MAE otherwise.  metric: 'accuracy' | 'mae' forces one."""
    if metric in (None, 'accuracy'):
        r = step_scores(out, y)
        if r:
            return r
    out = np.asarray(out, np.float64).reshape(len(out), -1)
    y = np.asarray(y)
    n_out = out.shape[1]
    cls = is_classifier(y, n_out) if metric is None else metric == 'accuracy'
    if metric is None and n_out == 1 and y.size == len(y) and np.all((y == 0) | (y == 1)) \
            and np.all((out >= 0) & (out <= 1)):
        cls = True          # one probability (a sigmoid) against labels 0 and 1: binary
    if cls and n_out == 1:      # one probability (a LOGISTIC output): class 1 above 0.5
        lab = y.reshape(-1)
        if not np.all((lab == 0) | (lab == 1)):
            raise InferError('accuracy of a one-output model needs labels 0 and 1')
        p = np.clip(out[:, 0], 1e-12, 1 - 1e-12)
        hits = int(np.sum((p > 0.5) == (lab == 1)))
        loss = float(-np.mean(lab * np.log(p) + (1 - lab) * np.log(1 - p)))
        return {'metric': 'accuracy', 'accuracy': hits / len(lab), 'hits': hits, 'n': len(lab),
                'loss': loss, 'loss_name': 'binary cross-entropy'}
    if cls:
        if not is_classifier(y, n_out):
            raise InferError(f'accuracy needs class labels in [0, {n_out}) or one-hot rows')
        lab = (y.argmax(axis=1) if y.ndim == 2 and y.shape[1] > 1 else y.reshape(-1)).astype(int)
        hits = int(np.sum(out.argmax(axis=1) == lab))
        probs = np.all(out >= 0) and np.allclose(out.sum(axis=1), 1, atol=0.05)   # int8: 1/256 steps
        p = out if probs else np.exp(out - out.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        loss = float(-np.mean(np.log(np.maximum(p[np.arange(len(lab)), lab], 1e-12))))
        return {'metric': 'accuracy', 'accuracy': hits / len(lab), 'hits': hits, 'n': len(lab),
                'loss': loss, 'loss_name': 'cross-entropy' + ('' if probs else ' of the softmax')}
    t = y.reshape(len(y), -1).astype(np.float64)
    if t.shape[1] != n_out:
        whole = t.shape[1] == 1 and n_out > 1 and np.all(t == np.round(t))
        raise InferError(f'targets have {t.shape[1]} values per sample, the model outputs {n_out}'
                         + ('; class labels score with --metric accuracy' if t.shape[1] == 1 and
                            is_classifier(y, n_out) else
                            f'; as class numbers they would need to be whole numbers 0 to '
                            f'{n_out - 1}, and these run from {t.min():g} to {t.max():g}: number '
                            'the classes from 0, as the model\'s outputs are' if whole else
                            f': give {n_out} target values a sample'))
    d = out - t
    return {'metric': 'mae', 'mae': float(np.mean(np.abs(d))), 'n': len(t),
            'loss': float(np.mean(d * d)), 'loss_name': 'mse'}


_ORT_TYPES = {'tensor(float)': np.float32, 'tensor(double)': np.float64,
              'tensor(int64)': np.int64, 'tensor(int32)': np.int32, 'tensor(bool)': np.bool_,
              'tensor(float16)': np.float16}


def several_predictor(path, g):
    """(run(feeds, i) -> output g.outputs[0] (choose_output's) of sample i, runtime name)
    for a model with several inputs or outputs: feeds {input tensor name: samples in its
    shape} for every input of the file's.  ONNX Runtime for .onnx, TFLite Micro for an
    int8 .tflite (its float ends too), else ONERT (on the graph with its shape arithmetic folded, as
    onert_predictor runs it)."""
    ins, k = [g.tensors[j] for j in g.file_inputs], g.tensors[g.outputs[0]]
    if os.fspath(path).lower().endswith('.onnx'):
        try:
            onnx_predictor(path)            # (ONNX Runtime installed and loads it)
        except NoRuntime as e:
            if len(ins) != 1:       # (utrain's run takes the inputs the output reads joined)
                return _onnx_own_several(path, g, e), _OWN_ONNX
            # (skl2onnx's classifiers: the probabilities beside a label output utrain
            # leaves out) utrain's own forward of the output chosen, as predictor's
            run = _onnx_own_forward(path, g, e, output=getattr(g, 'output_place', None))
            t = ins[0]
            return (lambda feeds, i: run(feeds[t.name][i:i + 1])), e.runtime or _OWN_ONNX
        import onnxruntime as ort
        sess = ort.InferenceSession(os.fspath(path), providers=['CPUExecutionProvider'])
        name, col = k.name, None
        if name not in {o.name for o in sess.get_outputs()}:
            # (the tensor a ZipMap output of skl2onnx's MLPClassifier wraps in {class: p}
            # maps: made an output of a copy ORT runs)
            import onnx
            m = onnx.load(os.fspath(path))
            if name not in {v for n in m.graph.node for v in n.output} and \
                    getattr(g, 'two_class_of', None):
                # (p of a binary LinearClassifier, which makes (1 - p, p) in one node)
                name, col = g.two_class_of, slice(1, 2)
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
            sess = ort.InferenceSession(m.SerializeToString(), providers=['CPUExecutionProvider'])
        # (an input only outputs the reader left out read, a Godot RL policy's state_ins:
        # zeros of its type, a sample's shape)
        zeros = {x.name: np.zeros([d if isinstance(d, int) and d > 0 else 1 for d in x.shape],
                                  _ORT_TYPES.get(x.type, np.float32))
                 for x in sess.get_inputs() if x.name not in {t.name for t in ins}}
        def run(feeds, i):
            o = sess.run([name], dict(zeros, **{t.name: feeds[t.name][i:i + 1] for t in ins}))[0]
            return o if col is None else np.asarray(o)[..., col]
        return run, 'ONNX Runtime'
    from .quant import float_ends       # (a full-int8 file with float ends: int8 inside)
    if any(t.dtype in ('int8', 'uint8') for t in ins + [k]) or float_ends(g):
        if g.identifier != b'TFL3':
            raise InferError(_INT8_CIRCLE % path)
        it = _tflm(path)

        def run(feeds, i):
            for n, t in enumerate(ins):
                it.set_input(_as_input(t, feeds[t.name][i:i + 1]), n)
            it.invoke()
            return _as_output(k, np.asarray(it.get_output(g.output_at), np.float64))
        return run, 'TFLite Micro'
    h, src, keep = _shapes_folded(g), path, None
    if any(t.dtype == 'float16' for t in g.tensors):
        # (a float16-quantized file: ONERT cannot load its DEQUANTIZEs of float16 weights;
        # the weights as float32, as prepare reads them, the same values)
        import copy
        from ..graph.qparams import dequantize
        from ..graph.inout import compact
        h = copy.deepcopy(h if h is not None else g)
        dequantize(h)
        compact(h)
    if h is not None:
        import tempfile
        from ..graph.inout import save_graph
        o, i = h.outputs, g.output_at       # (the file's order again: choose_output's undone)
        h.outputs = o[1:i + 1] + o[:1] + o[i + 1:]
        keep = tempfile.TemporaryDirectory(prefix='utrain-eval-')
        src = save_graph(h, os.path.join(keep.name, 'model' + os.path.splitext(path)[1]))
    sess = _onert_session(src)

    def run(feeds, i, _keep=keep):
        try:
            return sess.infer([np.ascontiguousarray(feeds[t.name][i:i + 1]) for t in ins])[
                g.output_at]
        except Exception as e:      # onert raises its own types
            raise InferError(f'{path}: ONERT loads it but cannot run it ({e})') from None
    return run, 'ONERT'


# (it had said to export into 'the original .tflite', where the original was a .circle,
# or nothing: export writes an int8 model as .tflite whatever the original's format)
_INT8_CIRCLE = ('%s: an int8 circle model: the host runtimes here run int8 models as .tflite '
                'only: export the trained weights as one (export MODEL WEIGHTS -o NAME.tflite '
                '--quantized, from a float model too), or evaluate the float model')


@light_gc()
def evaluate_several(model, data, output=None, label='last', size=None, limit=None):
    """evaluate() of a model with several inputs or outputs: the output prepare trains
    (output: --output; inout.choose_output) on the data's array per input
    (dataset.load_inputs), each in the model's own layout.  Returns (outputs, targets,
    the output's name, runtime name)."""
    from ..files import dataset as ds
    from ..graph.inout import choose_output, io_name
    from ..plan.runplan import data_inputs
    g = _read_runnable(model)
    g.file_inputs = list(g.inputs)
    try:
        choose_output(g, output, ds.targets_of(data) if output is None else None)
    except ValueError as e:
        raise InferError(str(e)) from None
    ins = data_inputs(g)
    x, y = ds.load_inputs(data, ins, label, size) if ins else ds.load(data, label, size)
    if limit:
        x, y = x[:limit], y[:limit]
    x = _stored_parts(data, x, ins)
    _judged(data, x, y)
    t0 = g.tensors[g.inputs[0]]
    parts = ins[0] if ins else [(t0.name, t0.shape, '')]
    feeds, at = {}, 0
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    total = sum(int(np.prod(shape[1:])) for _, shape, _ in parts)
    if x.shape[1] != total:     # (a .csv or .ds of other rows: the .npz's are checked)
        raise InferError(f'{data}: {x.shape[1]} values a sample; the model\'s inputs '
                         + ', '.join(f'{k or n} {list(sh[1:])}' for n, sh, k in parts)
                         + f' take {total} together, in that order')
    for name, shape, _ in parts:
        n = int(np.prod(shape[1:]))
        feeds[name] = x[:, at:at + n].reshape([len(x)] + list(shape[1:]))
        at += n
    for k in g.file_inputs:         # (inputs the output does not read; ids as the file's ints)
        t = g.tensors[k]
        feeds.setdefault(t.name, np.zeros([len(x)] + list(t.shape[1:]), np.float32))
        if t.dtype in ('int32', 'int64'):
            feeds[t.name] = np.round(feeds[t.name]).astype(t.dtype)
    run, runtime = several_predictor(model, g)
    out = np.stack([np.asarray(run(feeds, i), np.float64).ravel() for i in range(len(x))])
    return out, y, io_name(g, g.outputs[0]), runtime


def _fixed_dims(model, data):
    """A context giving the path of a copy of .onnx model with its input's dimensions
    known only at run time set as data's samples have them (prepare's fixed_dims_copy),
    or None where it has none, or they cannot be told."""
    import shutil
    import tempfile
    from .pipeline import dims_from_samples, _dims_said
    fixed = dims_from_samples(model, data)
    if fixed is None:
        return None

    @contextlib.contextmanager
    def copy():
        d = tempfile.mkdtemp(prefix='utrain-dims-')
        try:
            path = os.path.join(d, os.path.basename(os.fspath(model)))
            with open(path, 'wb') as f:
                f.write(fixed[0].SerializeToString())
            try:
                yield path
            except Exception as e:      # noqa: B902 - (a refusal of the copy, which is
                # gone after: named as the model with the dimensions the samples set)
                if e.args and isinstance(e.args[0], str) and path in e.args[0]:
                    dims = _dims_said({n: got for n, (_, got) in fixed[1].items()})
                    e.args = (e.args[0].replace(path, f'{model} with the dimensions the '
                                                f'samples of {data} set ({dims})'),) + e.args[1:]
                raise
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return copy()


@light_gc()
def evaluate(model, data, nchw=False, metric=None, label='last', size=None, limit=None,
             output=None):
    """Score model (a file) on data (.npz, .csv, .ds or a folder of class folders, read as
    prepare reads them): scores() plus 'runtime', 'transposed' (and 'output': the output
    scored, of a model with several, evaluate_several's).  output: --output."""
    from ..files import dataset as ds
    keep = None
    if os.path.exists(os.fspath(model)) and not os.fspath(model).lower().endswith('.onnx'):
        model, keep = unbatched(model)      # (a batch fixed in the file: run at batch 1)
    fixed = _fixed_dims(model, data)
    if fixed is not None:       # (an .onnx input open at run time: the data's size)
        with fixed as path:
            return evaluate(path, data, nchw, metric, label, size, limit, output)
    if os.path.exists(os.fspath(model)):
        h = read_model(model)
        from ..files.dataset import class_labels, two_class_labels
        class_labels(h, data)
        two_class_labels(h, data)
        # (an .onnx model's outputs the reader left out: ORT still makes them, the output
        # scored is the one prepare trains)
        if len(h.inputs) > 1 or len(h.outputs) > 1 or getattr(h, 'onnx_dropped', None):
            out, y, name, runtime = evaluate_several(model, data, output, label, size, limit)
            r = _scored(data, out, y, metric)
            r.update(runtime=runtime, transposed=False, output=name)
            return r
        if output is not None and output != '':
            # (a model of one output: --output 5 had been left unread, 'p' or 0 is it)
            from ..graph.inout import choose_output
            choose_output(h, output)
    run, runtime, g = predictor(model, h if os.path.exists(os.fspath(model)) else None)
    shape = getattr(run, 'shape', None) if g is None else g.tensors[g.inputs[0]].shape
    x, y = ds.load(data, label=label, size=size, shape=shape)
    if limit:
        x, y = x[:limit], y[:limit]
    _judged(data, x, y)
    x = _ids_judged(model, g, data, x)
    warn = _range_warning(g, model, data, x)
    transposed = False
    x = _prepared_ids(data, x, shape)
    back = _prepared_layout(model, data, shape)
    if back is not None:        # a run's test.ds, for the model it was prepared from
        x, transposed = back(np.asarray(x)), 'the run\'s samples laid out back in the model\'s order'
    elif g is not None:
        x, transposed = layout(np.asarray(x, np.float32), g.tensors[g.inputs[0]].shape, nchw, data)
    out = run(x)
    oshape = g.tensors[g.outputs[0]].shape if g is not None and g.outputs else \
        getattr(run, 'out_shape', None)     # (rows of a class a step: step_scores)
    if oshape is not None and out.size == len(out) * int(np.prod(oshape[1:])):
        out = out.reshape([len(out)] + [int(d) for d in oshape[1:]])
    r = _scored(data, out, y, metric)
    r.update(runtime=runtime, transposed=transposed)
    if warn:
        r['warning'] = warn
    return r


def _range_warning(g, model, data, x):
    """prepare's warning (quant.input_range_warning) for samples x of an int8 model that
    mostly lie outside what its int8 input holds (issue 28: a Keras int8-input file scored
    on the int8 codes TFLite's interpreter takes, read as real values, 70% where the real
    values score 82%, and nothing said), or None."""
    from . import quant
    if g is None or not len(g.inputs):
        return None
    try:
        if not getattr(g, 'path', None):
            g.path = os.fspath(model)
        return quant.input_range_warning(g, data, np.asarray(x, np.float64))
    except Exception:   # noqa: B902 - a warning only: never stops the scoring
        return None


def _judged(data, x, y):
    """Samples evaluate read from data, judged as prepare judges them: none, or NaN / Inf
    in them (an accuracy 'of nan' had been printed), refused naming the file."""
    from ..files.validate import check_values
    if not len(x):
        raise InferError(f'{data}: no samples')
    check_values(data, x, y)


def _ids_judged(model, g, data, x):
    """Samples x with the ids an embedding (a GATHER of a table's rows by the model's
    input) reads judged as prepare judges them (pipeline.check_ids): an id outside the
    table refused naming the data (evaluate had scored such data: ONERT read some row for
    id 45 of a 30-row table where prepare, TFLite and the board stop); and Keras's
    negative ids (a row from the table's end: the board wraps them, and so does the
    file's SELECT_V2, which the graph evaluate runs lacks: a score that changed from run
    to run, 0.98 or 0.77) wrapped here.  Returns x."""
    if g is None or len(g.inputs) != 1 or not any(op.name == 'GATHER' for op in g.ops):
        return x
    import copy
    from ..graph.embeddings import embedding_gathers
    from .pipeline import PrepareError, check_ids, input_columns
    h = copy.deepcopy(g)
    embedding_gathers(h)
    x = np.asarray(x)
    flat = x.reshape(len(x), -1)
    try:
        check_ids(model, h, (flat.astype(np.float64), None), 'float32')
    except PrepareError as e:
        raise InferError(f'{data}: {e}') from None
    cols = input_columns(h, flat.shape[1])
    wrapped = [op for op in h.ops if op.name == 'GATHER' and len(op.inputs) > 2
               and op.inputs[1] in cols]
    if wrapped and (flat < 0).any():
        flat = flat.copy()
        for op in wrapped:
            lo, hi = cols[op.inputs[1]]
            part = flat[:, lo:hi]
            part[part < 0] += h.tensors[op.inputs[0]].shape[0]
        x = flat.reshape(x.shape)
    return x


def _scored(data, out, y, metric):
    """scores(), its refusals of the targets naming the data file they came from."""
    from ..files import dataset as ds
    try:
        ds.classes_fit(os.fspath(data), int(np.prod(np.shape(out)[1:])))
        return scores(out, y, metric)
    except ds.DataError as e:
        raise InferError(str(e)) from None
    except InferError as e:
        if str(e).startswith(os.fspath(data)):
            raise
        raise InferError(f'{data}: {e}') from None


def _prepared_ids(data, x, shape):
    """Samples x of a .ds that prepare wrote for an int8 embedding of more than 256 rows
    (q8.json beside it: 'ib' 2, each id two bytes, low first, as utrain.q8emb reads
    them) as the ids a model takes, else x as it is (it had been refused: '20 values per
    sample, the model input takes 10')."""
    import json
    if not os.fspath(data).lower().endswith('.ds') or shape is None:
        return x
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(data)), 'q8.json')) as f:
            two = any(d.get('ib') == 2 for d in json.load(f)['layers'])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return x
    x = np.asarray(x)
    if not two or x.ndim != 2 or x.shape[1] != 2 * int(np.prod(shape[1:])):
        return x
    return x[:, 0::2] + 256 * x[:, 1::2]


def _stored_parts(data, x, ins):
    """Joined samples x of a .ds that prepare wrote for a model with several inputs, each
    input stored at its own scale (prepare.json's 'inputs_stored' {data key: (scale,
    offset)}: --dtype uint8/int8, or an int8 model's inputs at their int8 scales; the file
    holds the codes at scale 1), as values: code * scale + offset per input, else x as
    it is (the codes had been scored as values: an int8 two-input model's own test.ds
    0.70 against 0.90 on the same samples as floats)."""
    import json
    if not os.fspath(data).lower().endswith('.ds') or not ins:
        return x
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(data)), 'prepare.json')) as f:
            stored = json.load(f).get('inputs_stored') or {}
    except (OSError, ValueError, AttributeError):
        return x
    if not stored:
        return x
    out, at = np.array(x, np.float64).reshape(len(x), -1), 0
    for _, shape, key in ins[0]:
        n = int(np.prod(shape[1:]))
        if key in stored:
            sc, off = (float(v) for v in stored[key])
            out[:, at:at + n] = out[:, at:at + n] * sc + off
        at += n
    return out if at == out.shape[1] else x


def _prepared_layout(model, data, shape):
    """For a .ds that prepare wrote (a prepare.json beside it) for a model whose input
    it transposed (an ONNX or tico model's NCHW input taken NHWC: input_perm), scored on
    a model that takes the input as that model does (the original file, or an .onnx
    export): a function laying its flat samples out so, else None.  (The samples are
    stored as the rewritten graph takes them; read in the file's order they were
    scrambled: an ONNX Conv1d scored 0.24 on its own run's test.ds against 0.92.)"""
    import json
    if not os.fspath(data).lower().endswith('.ds') or shape is None:
        return None
    sp = os.path.join(os.path.dirname(os.path.abspath(data)), 'prepare.json')
    try:
        with open(sp) as f:
            summary = json.load(f)
        perm, src = summary.get('input_perm'), summary.get('model')
    except (OSError, ValueError, AttributeError):
        return None
    shape = [int(d) for d in shape]
    if not perm or sorted(perm) != list(range(len(shape))) or not isinstance(src, str):
        return None
    moved = [shape[i] for i in perm]
    try:
        h = read_model(src)
        src_shape = [int(d) for d in h.tensors[h.inputs[0]].shape]
    except Exception:   # noqa: B902 - the model it came from is gone: as the data is
        return None
    # (a predictor running the graph as prepare rewrote it takes the stored order)
    if src_shape != shape or moved == shape:
        return None
    inv = list(np.argsort(perm))
    return lambda x: x.reshape([len(x)] + moved[1:]).transpose(inv).reshape(len(x), -1)


def describe(r) -> str:
    """One line of evaluate()'s result."""
    if r['metric'] == 'accuracy':
        s = f'accuracy {r["accuracy"]:.4f} ({r["hits"]}/{r["n"]}), {r["loss_name"]} {r["loss"]:.4f}'
    else:
        s = f'MAE {r["mae"]:.4g}, MSE {r["loss"]:.4g} ({r["n"]} samples)'
    t = r['transposed']
    return s + f' [{r["runtime"]}' + (f'; {t}' if isinstance(t, str) else
                                      '; channels-first (NCHW) data transposed to channels-last (NHWC)'
                                      if t else '') \
        + (f'; output {r["output"]!r}' if r.get('output') else '') + ']'


# a float model rescales raw 0..255 pixels itself where its input meets a multiplier of
# 1/255 or 1/127.5 (Keras's Rescaling(1/255), Rescaling(1/127.5, offset=-1); x / 255 in
# PyTorch): a factor in this range, through the layout ops below
_PIXEL_FACTOR = (0.5 / 255, 2.5 / 255)
_LAYOUT = ('RESHAPE', 'TRANSPOSE', 'SQUEEZE', 'EXPAND_DIMS')


def pixel_values(g):
    """How an image folder's 0..255 pixels become graph g's input values, as its file
    says: (scale, offset, why), or None where it does not say.  An int8 model says it in
    its input's range (quant.int8_input_range): past 20 raw pixels, below -0.5 pixels at
    -1..1, else 0..1 (Edge Impulse, a converter calibrated on 0..1 images); a float model
    takes raw pixels where it rescales them itself (a Rescaling layer at its input the
    converter kept), else None (a Rescaling folded into the first layer's weights leaves
    no trace: the data says, image_pixels)."""
    from . import quant
    from ..graph.edit import consumers, is_const
    r = quant.int8_input_range(g)
    if r is not None:
        _, _, lo, hi = r
        why = f'the model\'s int8 input holds {lo:.3g}..{hi:.3g}'
        if hi > 20:
            return 1.0, 0.0, why
        return (2 / 255, -1.0, why) if lo < -0.5 else (1 / 255, 0.0, why)
    todo = [g.inputs[0]]
    while todo:
        for op in consumers(g, todo.pop()):
            if op.name in _LAYOUT:
                todo.extend(op.outputs)
                continue
            c = [i for i in op.inputs if is_const(g, i)]
            if op.name not in ('MUL', 'DIV') or len(op.inputs) != 2 or len(c) != 1 or (
                    op.name == 'DIV' and c[0] != op.inputs[1]):
                continue
            v = np.asarray(g.tensors[c[0]].data, np.float64)
            if v.size != 1 or not v.item():
                continue
            f = v.item() if op.name == 'MUL' else 1 / v.item()
            if _PIXEL_FACTOR[0] <= f <= _PIXEL_FACTOR[1]:
                return 1.0, 0.0, f'the model multiplies its input by {f:.3g} (Rescaling)'
    return None


# the pixel values a model may have been trained on: (scale, offset, name)
_PIXEL_RANGES = ((1 / 255, 0.0, '0..1'), (1.0, 0.0, '0..255'), (2 / 255, -1.0, '-1..1'))


def image_pixels(model, data, log=None):
    """A context (dataset.pixels_as) in which the image folder data is read with its
    pixels at the values model was trained on: as the model's file says them
    (pixel_values: an int8 input's range, a Rescaling at the input), else the
    range of 0..1, 0..255 and -1..1 at which the model scores the folder's images best,
    by a clear margin over 0..1 (a Keras Rescaling(1/255) folded into the first conv by
    the converter: 0..1 images scored at chance); 0..1 where none is clearly better (a
    new head, new classes).  Not an image folder, or a model no runtime here runs: as
    before.  log: told which, and why."""
    import contextlib
    from ..files import dataset as ds
    data = os.fspath(data) if data is not None else None
    if not data or not os.path.isdir(data):
        return contextlib.nullcontext()
    try:
        g = read_model(model)
    except (ValueError, OSError):
        return contextlib.nullcontext()     # (prepare or evaluate says what is wrong)
    try:
        said = pixel_values(g)
        if said is None:
            said = _scored_pixels(model, data, g)
    except ds.DataError:
        said = None
    except (InferError, ValueError, OSError) as e:
        said = (1 / 255, 0.0, f'the model cannot be scored here: {_first_line(e)}')
    if said is None:        # (a folder the samples pass refuses, saying why: no line here
        return contextlib.nullcontext()     # on how it was read, as it is not)
    scale, offset, why = said
    name = next((n for s, o, n in _PIXEL_RANGES if np.isclose(s, scale) and o == offset),
                f'x {scale:.3g} + {offset:.3g}')
    if log:
        log(f'{data}: pixels read as {name} ({why})')
    return ds.pixels_as(data, scale, offset)


def _scored_pixels(model, data, g, most=120):
    """(scale, offset, why) of _PIXEL_RANGES at which model (graph g) scores the image
    folder data best (up to `most` images, spread over the classes), by a margin of 3
    standard errors and 5 points of accuracy (a classifier; else a third less MAE) over
    0..1; None for a folder the model cannot take (DataError: one it cannot read), which
    the samples pass refuses."""
    import tempfile
    from ..files import dataset as ds
    shape = g.tensors[g.inputs[0]].shape
    x, y = ds.load(data, shape=shape)
    ds.classes_fit(data, int(np.prod(g.tensors[g.outputs[0]].shape[1:])))
    if int(np.prod(x.shape[1:])) != int(np.prod(shape[1:])):
        return None         # (images of another size than the model takes)
    pick = np.unique(np.linspace(0, len(x) - 1, min(most, len(x))).astype(int))
    x, y = np.asarray(x)[pick] * np.float32(255), np.asarray(y)[pick]
    got = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale, offset, name in _PIXEL_RANGES:
            f = os.path.join(tmp, 'x.npz')
            np.savez(f, x=(x * np.float32(scale) + np.float32(offset)).astype(np.float32), y=y)
            try:
                got.append((evaluate(model, f), scale, offset, name))
            except InferError:
                return 1 / 255, 0.0, 'its outputs do not score these labels'
    base = got[0][0]
    if base['metric'] == 'accuracy':
        p = base['accuracy']
        need = max(0.05, 3 * np.sqrt(max(p * (1 - p), 0.05) / len(y)))
        best = max(got, key=lambda r: r[0]['accuracy'])
        if best[0]['accuracy'] - p >= need:
            return best[1], best[2], (f'the model scores {best[0]["accuracy"]:.2f} of these '
                                      f'images at {best[3]}, {p:.2f} at 0..1')
        return 1 / 255, 0.0, f'no range scores clearly better than 0..1 ({p:.2f})'
    best = min(got, key=lambda r: r[0]['mae'])
    if best[0]['mae'] < base['mae'] * 2 / 3:
        return best[1], best[2], (f'the model\'s MAE on these images is {best[0]["mae"]:.3g} at '
                                  f'{best[3]}, {base["mae"]:.3g} at 0..1')
    return 1 / 255, 0.0, 'no range scores clearly better than 0..1'
