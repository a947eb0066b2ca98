"""Tests for host_tools.formats.traininfo (CIRCLE_TRAINING metadata reader/writer).

The independent check: a circle model carrying our CIRCLE_TRAINING metadata
is opened by ONERT (onert.experimental.train.session) and its train_info must
reflect what we wrote.
"""

import random
import subprocess
import sys
import textwrap

import flatbuffers
import numpy as np
import pytest

from host_tools.formats.traininfo import build_traininfo, parse_traininfo

SETTINGS = [
    {'version': 0, 'optimizer': 'sgd', 'lr': 0.01, 'loss': 'mse',
     'reduction': 'mean', 'epochs': 0, 'batch': 0, 'trainable_ops': []},
    {'version': 1, 'optimizer': 'adam', 'lr': 0.001, 'beta1': 0.9,
     'beta2': 0.999, 'eps': 1e-07, 'loss': 'cce', 'from_logits': True,
     'reduction': 'sum', 'epochs': 5, 'batch': 32, 'trainable_ops': [0, 1]},
    {'version': 0, 'optimizer': 'sgd', 'lr': 0.125, 'loss': 'scce',
     'from_logits': False, 'reduction': 'mean', 'epochs': 100, 'batch': 1,
     'trainable_ops': [3, 4, 5, 6, 7]},
    {'version': 7, 'optimizer': 'adam', 'lr': 0.5, 'beta1': 0.0,
     'beta2': 0.25, 'eps': 0.0, 'loss': 'scce', 'from_logits': True,
     'reduction': 'sum', 'epochs': 2 ** 31 - 1, 'batch': 64,
     'trainable_ops': list(range(40))},
]


# ---------------------------------------------------------------- round trip

@pytest.mark.parametrize('settings', SETTINGS)
def test_round_trip(settings):
    buf = build_traininfo(settings)
    assert buf[4:8] == b'CTR0'
    assert parse_traininfo(buf) == settings
    # and the re-encoding is stable
    assert build_traininfo(parse_traininfo(buf)) == buf


def test_defaults_filled_in():
    got = parse_traininfo(build_traininfo({'optimizer': 'adam', 'lr': 0.002}))
    assert got == {'version': 0, 'optimizer': 'adam', 'lr': 0.002,
                   'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-07,
                   'loss': 'scce', 'from_logits': False, 'reduction': 'mean',
                   'epochs': 0, 'batch': 0, 'trainable_ops': []}


def test_ctr1_variant_has_no_trainable_ops():
    s = {'optimizer': 'sgd', 'lr': 0.25, 'loss': 'cce', 'batch': 4}
    buf = build_traininfo(s, file_identifier=b'CTR1')
    assert buf[4:8] == b'CTR1'
    got = parse_traininfo(buf)
    assert 'trainable_ops' not in got
    assert got['lr'] == 0.25 and got['batch'] == 4 and got['loss'] == 'cce'
    with pytest.raises(ValueError, match='trainable_ops'):
        build_traininfo(dict(s, trainable_ops=[0]), file_identifier=b'CTR1')


def test_empty_root_table_gives_schema_defaults():
    b = flatbuffers.Builder(32)
    b.StartObject(11)
    b.Finish(b.EndObject(), file_identifier=b'CTR0')
    got = parse_traininfo(bytes(b.Output()))
    # no options tables -> no lr / from_logits
    assert got == {'version': 0, 'optimizer': 'sgd', 'loss': 'scce',
                   'reduction': 'mean', 'epochs': 0, 'batch': 0,
                   'trainable_ops': []}


@pytest.mark.parametrize('bad, msg', [
    ({'lr': 0.1}, 'optimizer is required'),
    ({'optimizer': 'sgd'}, 'lr is required'),
    ({'optimizer': 'rmsprop', 'lr': 0.1}, 'unknown optimizer'),
    ({'optimizer': 'sgd', 'lr': 0.1, 'loss': 'huber'}, 'unknown loss'),
    ({'optimizer': 'sgd', 'lr': 0.1, 'reduction': 'avg'}, 'unknown reduction'),
    ({'optimizer': 'sgd', 'lr': 0.1, 'beta1': 0.9}, 'only apply to adam'),
    ({'optimizer': 'sgd', 'lr': 0.1, 'batch': 2 ** 31}, 'out of range'),
    ({'optimizer': 'sgd', 'lr': 1e39}, 'float32'),
    ({'optimizer': 'sgd', 'lr': 0.1, 'typo': 1}, 'unknown settings'),
])
def test_build_rejects_bad_settings(bad, msg):
    with pytest.raises(ValueError, match=msg):
        build_traininfo(bad)


# ------------------------------------------------------------ malformed input

def _raises_named(buf, where='CIRCLE_TRAINING'):
    with pytest.raises(ValueError) as ei:
        parse_traininfo(buf, where)
    assert str(ei.value).startswith(where), str(ei.value)
    return str(ei.value)


@pytest.mark.parametrize('settings', SETTINGS)
def test_every_truncation_is_rejected(settings):
    buf = build_traininfo(settings)
    for n in range(len(buf)):
        msg = _raises_named(buf[:n], 'model.circle:CIRCLE_TRAINING')
        assert 'truncated' in msg


def test_wrong_identifier():
    buf = bytearray(build_traininfo(SETTINGS[1]))
    buf[4:8] = b'CIR0'
    assert 'identifier' in _raises_named(bytes(buf), 'x.circle')


def test_random_bytes():
    rng = random.Random(1234)
    for size in (0, 3, 8, 16, 64, 300):
        for _ in range(20):
            _raises_named(bytes(rng.randrange(256) for _ in range(size)), 'rnd')


def test_random_bytes_with_right_identifier():
    # past the identifier check: garbage offsets must still give ValueError
    rng = random.Random(99)
    ok = 0
    for _ in range(500):
        size = rng.randrange(8, 80)
        buf = bytearray(rng.randrange(256) for _ in range(size))
        buf[4:8] = b'CTR0'
        try:
            parse_traininfo(bytes(buf), 'fuzz')
            ok += 1
        except ValueError as e:
            assert str(e).startswith('fuzz')
    assert ok < 500


def test_corrupted_bytes_never_escape_as_other_errors():
    good = build_traininfo(SETTINGS[1])
    rng = random.Random(7)
    for _ in range(1000):
        buf = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(8, len(buf))] = rng.randrange(256)
        try:
            parse_traininfo(bytes(buf), 'flip')
        except ValueError as e:
            assert str(e).startswith('flip')


def _raw_root(optimizer=None, opt_type=None, lossfn=None, loss_type=None,
              reduction=None):
    """A ModelTraining written field by field, to plant bad enum values."""
    b = flatbuffers.Builder(64)
    b.StartObject(1)
    b.PrependFloat32Slot(0, 0.1, 0.0)
    opt = b.EndObject()
    b.StartObject(11)
    b.PrependUOffsetTRelativeSlot(3, opt, 0)
    for slot, v in ((1, optimizer), (4, lossfn), (9, reduction)):
        if v is not None:
            b.PrependInt8Slot(slot, v, 0)
    for slot, v in ((2, opt_type), (5, loss_type)):
        if v is not None:
            b.PrependUint8Slot(slot, v, 0)
    b.Finish(b.EndObject(), file_identifier=b'CTR0')
    return bytes(b.Output())


@pytest.mark.parametrize('kw, msg', [
    ({'optimizer': 2, 'opt_type': 1}, 'unknown Optimizer value 2'),
    ({'optimizer': -1, 'opt_type': 1}, 'unknown Optimizer value -1'),
    ({'opt_type': 3}, 'unknown OptimizerOptions type 3'),
    ({'optimizer': 1, 'opt_type': 1}, 'optimizer is ADAM but optimizer options are SGDOptions'),
    ({'opt_type': 1, 'lossfn': 3}, 'unknown LossFn value 3'),
    ({'opt_type': 1, 'loss_type': 9}, 'unknown LossFnOptions type 9'),
    ({'opt_type': 1, 'loss_type': 3}, 'lossfn_opt_type is MeanSquaredErrorOptions but the options table is missing'),
    ({'opt_type': 1, 'reduction': 2}, 'unknown LossReductionType value 2'),
])
def test_unknown_enum_values(kw, msg):
    assert msg in _raises_named(_raw_root(**kw), 'enums')


def test_raw_root_sanity():
    assert parse_traininfo(_raw_root(opt_type=1))['lr'] == 0.1


# ------------------------------------------------ ONERT reads our metadata

def _tiny_model(traininfo=None):
    """FULLY_CONNECTED(4->3) + SOFTMAX circle model, optional CIRCLE_TRAINING."""
    pytest.importorskip('circle_schema')
    from circle_schema.v0_10.circle.Buffer import BufferT
    from circle_schema.v0_10.circle.BuiltinOptions import BuiltinOptions
    from circle_schema.v0_10.circle.FullyConnectedOptions import FullyConnectedOptionsT
    from circle_schema.v0_10.circle.Metadata import MetadataT
    from circle_schema.v0_10.circle.Model import ModelT
    from circle_schema.v0_10.circle.Operator import OperatorT
    from circle_schema.v0_10.circle.OperatorCode import OperatorCodeT
    from circle_schema.v0_10.circle.SoftmaxOptions import SoftmaxOptionsT
    from circle_schema.v0_10.circle.SubGraph import SubGraphT
    from circle_schema.v0_10.circle.Tensor import TensorT

    def buffer(data=None):
        b = BufferT()
        if data is not None:
            b.data = np.frombuffer(data, np.uint8).copy()
        return b

    def tensor(name, shape, buf):
        t = TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), 0, buf  # FLOAT32
        return t

    def opcode(code):
        oc = OperatorCodeT()
        oc.builtinCode = oc.deprecatedBuiltinCode = code
        oc.version = 1
        return oc

    w = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    m = ModelT()
    m.version = 0
    m.operatorCodes = [opcode(9), opcode(25)]  # FULLY_CONNECTED, SOFTMAX
    m.buffers = [buffer(), buffer(), buffer(w.tobytes()),
                 buffer(np.zeros(3, np.float32).tobytes()), buffer(), buffer()]
    sg = SubGraphT()
    sg.name = 'main'
    sg.tensors = [tensor('x', [1, 4], 1), tensor('w', [3, 4], 2),
                  tensor('b', [3], 3), tensor('fc', [1, 3], 4),
                  tensor('y', [1, 3], 5)]
    sg.inputs, sg.outputs = [0], [4]
    fc = OperatorT()
    fc.opcodeIndex, fc.inputs, fc.outputs = 0, [0, 1, 2], [3]
    fc.builtinOptionsType = BuiltinOptions.FullyConnectedOptions
    fc.builtinOptions = FullyConnectedOptionsT()
    sm = OperatorT()
    sm.opcodeIndex, sm.inputs, sm.outputs = 1, [3], [4]
    sm.builtinOptionsType = BuiltinOptions.SoftmaxOptions
    sm.builtinOptions = SoftmaxOptionsT()
    sm.builtinOptions.beta = 1.0
    sg.operators = [fc, sm]
    m.subgraphs = [sg]
    if traininfo is not None:
        m.buffers.append(buffer(traininfo))
        md = MetadataT()
        md.name, md.buffer = 'CIRCLE_TRAINING', len(m.buffers) - 1
        m.metadata = [md]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b'CIR0')
    return bytes(b.Output())


def _onert_train_info(tmp_path, traininfo):
    pytest.importorskip('onert')
    from onert.experimental.train import session
    path = tmp_path / 'tiny.circle'
    path.write_bytes(_tiny_model(traininfo))
    ti = session(str(path)).train_info
    return {'lr': ti.learning_rate, 'batch': ti.batch_size,
            'loss': ti.loss_info.loss.name, 'reduction': ti.loss_info.reduction_type.name,
            'opt': ti.opt.name, 'num_of_trainable_ops': ti.num_of_trainable_ops}



def test_onert_without_metadata_uses_its_defaults(tmp_path):
    # the control: what ONERT reports when no CIRCLE_TRAINING is present
    got = _onert_train_info(tmp_path, None)
    assert got == {'lr': 0.0, 'batch': 0, 'loss': 'UNDEFINED',
                   'reduction': 'UNDEFINED', 'opt': 'UNDEFINED',
                   'num_of_trainable_ops': 0}


# ONERT's loader rejects SPARSE_CATEGORICAL_CROSSENTROPY ("not supported yet"),
# and ignores epochs / from_logits / Adam betas (not exposed by train_info).
# num_of_trainable_ops: -1 = all ops, N = last N ops, 0 = none.
@pytest.mark.parametrize('settings, expected', [
    ({'optimizer': 'adam', 'lr': 0.25, 'loss': 'cce', 'reduction': 'sum',
      'epochs': 5, 'batch': 8, 'trainable_ops': [0, 1]},
     {'lr': 0.25, 'batch': 8, 'loss': 'CATEGORICAL_CROSSENTROPY',
      'reduction': 'SUM', 'opt': 'ADAM', 'num_of_trainable_ops': -1}),
    ({'optimizer': 'sgd', 'lr': 0.0625, 'loss': 'mse', 'reduction': 'mean',
      'batch': 3, 'trainable_ops': [1]},
     {'lr': 0.0625, 'batch': 3, 'loss': 'MEAN_SQUARED_ERROR',
      'reduction': 'SUM_OVER_BATCH_SIZE', 'opt': 'SGD', 'num_of_trainable_ops': 1}),
    ({'optimizer': 'adam', 'lr': 0.01, 'loss': 'mse', 'reduction': 'sum',
      'batch': 16},
     {'lr': pytest.approx(0.01), 'batch': 16, 'loss': 'MEAN_SQUARED_ERROR',
      'reduction': 'SUM', 'opt': 'ADAM', 'num_of_trainable_ops': 0}),
])
def test_onert_reads_our_metadata(tmp_path, settings, expected):
    ti = build_traininfo(settings)
    # our own reader agrees with the bytes we put in the model
    assert {k: v for k, v in parse_traininfo(ti).items() if k in settings} == settings
    assert _onert_train_info(tmp_path, ti) == expected


def _onert_load_in_subprocess(tmp_path, traininfo):
    """Load in a child process so a runtime abort cannot take pytest down."""
    pytest.importorskip('onert')
    path = tmp_path / 'm.circle'
    path.write_bytes(_tiny_model(traininfo))
    code = textwrap.dedent('''
        import sys
        from onert.experimental.train import session
        try:
            session(sys.argv[1])
        except Exception as e:
            print('REFUSED', type(e).__name__, e)
        else:
            print('LOADED')
    ''')
    return subprocess.run([sys.executable, '-c', code, str(path)],
                          capture_output=True, text=True, timeout=60)


def test_onert_rejects_wrong_identifier(tmp_path):
    # ONERT verifies the CTR0 identifier: the CTR1 variant is refused, which
    # shows the sessions above really read (and verified) our buffer.
    ti = build_traininfo({'optimizer': 'sgd', 'lr': 0.5, 'loss': 'mse', 'batch': 2},
                         file_identifier=b'CTR1')
    r = _onert_load_in_subprocess(tmp_path, ti)
    assert 'REFUSED' in r.stdout, (r.stdout, r.stderr)
    assert 'TrainingInfo buffer is not accessible' in r.stderr


def test_onert_refuses_scce(tmp_path):
    # a valid buffer, but this ONERT's loader does not support SCCE yet
    ti = build_traininfo({'optimizer': 'sgd', 'lr': 0.5, 'loss': 'scce', 'batch': 2})
    r = _onert_load_in_subprocess(tmp_path, ti)
    assert 'REFUSED' in r.stdout, (r.stdout, r.stderr)
    assert 'sparse_categorical_crossentropy' in r.stderr
