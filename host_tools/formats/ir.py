"""The host's graph IR, shared by every model format (circle_io reads and writes circle and
TFLite files, onnx_io ONNX files, circle_build builds them) and by the passes above them:
Tensor, Operator and Graph (their fields: circle_io's docstring), the op vocabulary
(circle's builtin operator codes and names), ModelError and the file helpers the formats
share (check_path, atomic_write)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

from circle_schema.v0_10 import circle as C


# what to do about a model file cut short or damaged (a download or copy that stopped, a
# disk that filled): it had been said what was wrong with it, not what to do
AGAIN = ('; the file is cut short or damaged: copy or download it again, or convert it '
         'again from its source')


class ModelError(ValueError):
    """A model file that cannot be read or rewritten. ``str(e) == "<path>: <message>"``."""

    def __init__(self, path, message: str):
        self.path = str(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")


def _enum_names(cls) -> dict[int, str]:
    out: dict[int, str] = {}
    for k, v in vars(cls).items():
        if not k.startswith("_") and isinstance(v, int):
            out.setdefault(v, k)
    return out


OP_NAMES: dict[int, str] = _enum_names(C.BuiltinOperator.BuiltinOperator)
OP_CODES: dict[str, int] = {v: k for k, v in OP_NAMES.items()}


@dataclass
class Tensor:
    index: int
    name: str
    shape: list[int]
    dtype: str
    data: np.ndarray | None
    buffer: int
    quant: dict | None = None
    signature: list | None = None       # the file's shape_signature (-1: known at run time)
    # (place, name) of a graph input or output in the file's SignatureDef (Keras's order
    # and names: Input(name='image') is 'image', its first output 'output_0'), or None
    sig: tuple | None = None
    # a constant that is no parameter (a clip's bound, spellings.elementwise_forms): it
    # never trains, whatever op reads it
    frozen: bool = False
    # (subgraph, tensor) of the file where a rewrite moved this constant from its place
    # (loops.unroll_loops: a WHILE body's weights, and subgraph 0's beside them): export
    # writes the trained values there
    origin: tuple = None


@dataclass
class Operator:
    index: int
    code: int
    name: str
    inputs: list[int]
    outputs: list[int]
    options: dict = field(default_factory=dict)
    src: int = None             # its index in the user's file, kept through the rewrites

    @property
    def number(self) -> int:
        """The op's number as the user's file (and `inspect`, `--train last:N`) has it."""
        return self.index if self.src is None else self.src


@dataclass
class Graph:
    path: str
    identifier: bytes
    version: int
    description: str
    tensors: list[Tensor]
    ops: list[Operator]
    inputs: list[int]
    outputs: list[int]
    metadata: dict[str, bytes]
    n_subgraphs: int
    # the root mean square of the model's input over the run's samples: prepare sets it
    # from --data, inscale.scale_input reads it (None: no data); a model with several
    # inputs: each one's, {its data key (inout.io_name): rms}
    input_rms: float = None
    inputs_rms: dict = None
    optimizer: str = None      # prepare's (inscale.adam_keeps_scale: Adam scales the input or not)
    # the file's other subgraphs {index: Graph} (a WHILE's cond and body, named by its
    # cond_subgraph_index / body_subgraph_index options: loops.unroll_loops inlines them)
    subgraphs: dict = None


# ops that only reshape a tensor or change its type: the model's last activation is
# found past them (an int8 model with float outputs ends SOFTMAX -> DEQUANTIZE)
SHAPE_ONLY = ('RESHAPE', 'SQUEEZE', 'EXPAND_DIMS', 'QUANTIZE', 'DEQUANTIZE')


def final_op(g):
    """The op that makes graph g's output, past ops that only reshape it (RESHAPE, SQUEEZE,
    EXPAND_DIMS) or (de)quantize it: the model's last activation, or None."""
    k, op = g.outputs[0], None
    for _ in range(len(g.ops) + 1):         # (a damaged file's cycle ends the walk)
        op = next((o for o in g.ops if k in o.outputs), None)
        if op is None or op.name not in SHAPE_ONLY or not op.inputs:
            return op
        k = op.inputs[0]
    return op


def drop_final_log_softmax(g):
    """A model whose output is made by LOG_SOFTMAX (PyTorch's log_softmax for NLLLoss)
    trains the logits that op reads: cross-entropy from logits is the NLL of its
    log-probabilities, with the same gradient and the same argmax.  Removes the op from
    graph g (the model file keeps it: export writes the trained weights back into it) and
    records its number in g.log_softmax; a LOG_SOFTMAX anywhere else stays (refused)."""
    op = final_op(g) if len(g.outputs) == 1 else None   # (check_graph refuses the rest)
    if op is None or op.name != 'LOG_SOFTMAX' or len(op.inputs) != 1 or \
            len(op.outputs) != 1 or op.inputs[0] in g.inputs:
        return
    k = op.inputs[0]
    if sum(k in o.inputs for o in g.ops) > 1 or k in g.outputs:
        return
    for o in g.ops:                 # a RESHAPE after it reads the logits instead
        o.inputs = [k if i == op.outputs[0] else i for i in o.inputs]
    g.outputs = [k if i == op.outputs[0] else i for i in g.outputs]
    g.ops.remove(op)
    for i, o in enumerate(g.ops):
        o.index = i
    g.log_softmax = op.number


def drop_two_class_sigmoid(g):
    """A model whose output is CONCATENATION(1 - p, p) of p = LOGISTIC(z) [1, 1] (a binary
    scikit-learn MLPClassifier through skl2onnx: its 'probabilities') trains p, P(class
    1), with bce on z, as a model ending in the sigmoid does: read as logits, softmax(1 - p,
    p) never passes 0.73 and its loss pushes every sample's p on to 0 or 1, where the
    sigmoid's gradient dies.  Removes the SUB and the CONCATENATION from graph g (the file
    keeps them: export writes the trained weights back into it; evaluate scores p) and
    records the concatenation's number in g.two_class, its output's name in g.two_class_of
    (p is no value of a file that computes 1 - p and p in one node: evaluate reads that
    output's second column)."""
    if len(g.outputs) != 1 or not g.ops:
        return
    cat = g.ops[-1]
    if cat.name != 'CONCATENATION' or cat.outputs != g.outputs or len(cat.inputs) != 2:
        return
    a, p = cat.inputs
    made = {k: o for o in g.ops for k in o.outputs}
    sub, sig = made.get(a), made.get(p)
    if sub is None or sig is None or sub.name != 'SUB' or sig.name != 'LOGISTIC' or \
            len(sub.inputs) != 2 or sub.inputs[1] != p or \
            sub.options.get('fused_activation_function', 'NONE') != 'NONE' or \
            cat.options.get('fused_activation_function', 'NONE') != 'NONE':
        return
    one, tp = g.tensors[sub.inputs[0]], g.tensors[p]
    if one.data is None or np.size(one.data) != 1 or float(np.ravel(one.data)[0]) != 1.0 or \
            int(np.prod(tp.shape)) != 1 or tp.dtype != 'float32' or \
            sum(a in o.inputs for o in g.ops) != 1:
        return
    for o in g.ops:
        if o.src is None:
            o.src = o.index
    g.ops = [o for o in g.ops if o is not sub and o is not cat]
    for i, o in enumerate(g.ops):
        o.index = i
    names = getattr(g, 'output_names', None) or {}
    g.output_names = dict({g.tensors[cat.outputs[0]].name: p}, **{
        n: p if k == cat.outputs[0] else k for n, k in names.items()})   # (--output's)
    g.outputs = [p]
    g.two_class = cat.number
    g.two_class_of = g.tensors[cat.outputs[0]].name


def device(path) -> str | None:
    """What path is when it is a device (/dev/zero, a terminal), not a file or a pipe:
    read to its end, /dev/zero had filled the memory (a MemoryError's traceback) and a
    terminal waited forever; None otherwise."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return (f'{path}: is a device, not a file (read to its end, it has none): give the '
                'path of a file')
    return None


def check_path(path) -> str:
    """path as a str; ModelError when it is missing, a directory or a device."""
    path = os.fspath(path)
    if not os.path.exists(path):
        from ..paths import broken_link
        link = broken_link(path)
        raise ModelError(path, link[len(path) + 2:] if link else "no such file")
    if os.path.isdir(path):     # (it had said what, not what to do)
        raise ModelError(path, 'is a directory, not a model file: give the model file itself '
                         '(.circle, .tflite or .onnx)' + (
                             ', the one this folder was prepared from (prepare.json names it)'
                             if os.path.isfile(os.path.join(path, 'prepare.json')) else ''))
    if device(path):
        raise ModelError(path, "is a device, not a model file (read to its end, it has none): "
                         'give the model file itself (.circle, .tflite or .onnx)')
    return path


# fsync every file written (off for scratch folders nobody keeps: --select's trials)
FSYNC = True


def atomic_write(out_path, data: bytes) -> None:
    """Write ``data`` to a temp file next to ``out_path`` and os.replace it over."""
    out_path = os.fspath(out_path)
    folder = os.path.dirname(os.path.abspath(out_path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(out_path) + ".",
                                   suffix=".tmp")
    except OSError as e:        # the user's path, not the temp file's: -o in no folder, ...
        raise OSError(e.errno, e.strerror, out_path if os.path.isdir(folder) else folder) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if FSYNC:
                os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; give an ordinary file's mode
        os.replace(tmp, out_path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            # name the file, the space left and that nothing was replaced
            try:
                st = os.statvfs(folder)
                free = f', {st.f_bavail * st.f_frsize} bytes free there'
            except OSError:
                free = ''
            raise OSError(e.errno, f'{out_path}: cannot write it ({e.strerror}{free}, '
                          f'{len(data)} bytes needed); '
                          + ('the previous file is kept' if os.path.exists(out_path)
                             else 'nothing was written')) from None
        raise


# (a 3-D convolution: what to export instead)
CONV3D_HINT = ('utrain runs 1-D and 2-D convolutions: export the model with the frames '
               'stacked as a Conv2D\'s channels (an input of [H, W, frames x channels]), or '
               'fold the frames into H (a Conv2D over [frames x H, W, channels] whose kernel '
               'is one frame high)')
