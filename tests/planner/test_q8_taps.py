"""The int8 planner prices utrain.q8asm's kept depthwise tap tables (ARM boards: rp2):
one table per (geometry, mode) the depthwise kernels are called with, in q8asm's 16
slots.  The reference: the geometries the device code itself passes (utrain.q8 under
CPython, the kernels wrapped to record their calls) on a depthwise model built here
(three 3x3 depthwise layers, two of one shape, one of stride 2), slotted by q8asm's
hash as q8asm.py writes it."""
import json
import os
import sys

import numpy as np

from repo import ROOT  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, 'micro'))

from host_tools.prepare import quant  # noqa: E402
from host_tools.plan import memory  # noqa: E402
from host_tools.formats.circle_build import CircleBuilder  # noqa: E402
from host_tools.formats.circle_io import read_model  # noqa: E402
from utrain import q8kern as K  # noqa: E402
from utrain.q8 import Q8Net  # noqa: E402

H, C, NCLS = 10, 4, 3


def build(path, seed=1):
    """x [10, 10, 4] -> DW 3x3 -> DW 3x3 (the same shape) -> DW 3x3 stride 2 -> MEAN -> FC,
    int8, per-channel weight scales."""
    rng = np.random.default_rng(seed)
    b = CircleBuilder(identifier=b'TFL3')
    q = lambda s_, z: {'scale': [s_], 'zero_point': [z]}  # noqa: E731
    x = x0 = b.tensor('x', [1, H, H, C], dtype='int8', quant=q(0.02, 3))
    s = 0.02
    for i, (st, h) in enumerate(((1, H), (1, H), (2, H // 2))):
        sw = rng.uniform(0.7, 1.3, C) * 0.004
        w = b.tensor(f'w{i}', (1, 3, 3, C), data=rng.integers(-127, 128, (1, 3, 3, C)).astype(np.int8),
                     quant={'scale': list(sw), 'zero_point': [0] * C, 'quantized_dimension': 3})
        bt = b.tensor(f'b{i}', [C], data=rng.integers(-300, 300, C).astype(np.int32),
                      quant={'scale': list(s * sw), 'zero_point': [0] * C})
        y = b.tensor(f'd{i}', [1, h, h, C], dtype='int8', quant=q(0.03 + 0.01 * i, -128))
        b.op('DEPTHWISE_CONV_2D', [x, w, bt], [y], padding='SAME', stride_w=st, stride_h=st,
             depth_multiplier=1, fused_activation_function='RELU')
        x, s = y, 0.03 + 0.01 * i
    m = b.tensor('m', [1, C], dtype='int8', quant=q(0.05, -128))
    b.op('MEAN', [x, b.tensor('axes', [2], data=np.array([1, 2], np.int32))], [m], keep_dims=False)
    wf = b.tensor('wf', (NCLS, C), data=rng.integers(-127, 128, (NCLS, C)).astype(np.int8),
                  quant={'scale': [0.01] * NCLS, 'zero_point': [0] * NCLS})
    bf = b.tensor('bf', [NCLS], data=np.zeros(NCLS, np.int32),
                  quant={'scale': [0.05 * 0.01] * NCLS, 'zero_point': [0] * NCLS})
    y = b.tensor('y', [1, NCLS], dtype='int8', quant=q(0.08, -2))
    b.op('FULLY_CONNECTED', [m, wf, bf], [y])
    b.inputs(x0)
    b.outputs(y)
    b.save(path)
    return path


def slot(g, mode):
    # utrain/q8asm.py _tab: the slot of geometry g and mode
    h = int(g[0] * 5 + g[1] * 3 + g[2] + g[8] * 7 + g[10] * 11) + mode
    return (h ^ (h >> 4)) & 15


def recorded_tables(tmp_path, monkeypatch, train):
    """{slot: words} of the tables q8asm would keep for one training step of the model
    built here, from the geometries the device code passes its depthwise kernels."""
    g = read_model(build(str(tmp_path / 'm.tflite')))
    quant.write(g, str(tmp_path), train, quant.meta(g, train, None, {}))
    with open(tmp_path / 'q8.json') as f:
        table = json.load(f)
    calls = []
    for name, mode in (('dwk', 0), ('ddk', 1), ('dgk', 2)):
        orig = getattr(K, name)
        pos = 3 if name == 'dwk' else 4 if name == 'dgk' else 3

        def rec(*a, orig=orig, mode=mode, pos=pos):
            calls.append((tuple(a[pos][:14]), mode))
            return orig(*a)
        monkeypatch.setattr(K, name, rec)
    net = Q8Net(table, str(tmp_path / 'weights.wof'))
    net.setup()
    rng = np.random.default_rng(0)
    net.step(bytearray(rng.integers(-128, 128, H * H * C).astype(np.int8).tobytes()), 1, 0.05)
    kept = {}
    for gm, mode in calls:
        if gm[3] == gm[2]:                          # multiplier 1: the table kernels
            kept.setdefault(slot(gm, mode), 24 + 5 * gm[4] * gm[5] + 15)
    return table, kept


def test_int8_plan_prices_the_depthwise_tap_tables_per_shape(tmp_path, monkeypatch):
    table, kept = recorded_tables(tmp_path, monkeypatch, 'all')
    # the two stride-1 layers share their forward table; 3 layers x (forward, weight
    # gradient) + the input gradient of the upper two: at least 4 distinct tables
    assert len(kept) >= 4
    expect = sum(16 + -(-4 * n // 16) * 16 for n in kept.values())   # 32-bit: 16 B blocks
    assert memory.q8_tap_tables(table, 4, 16) == expect
    s = dict(optimizer='sgd', batch=1)
    rp2 = memory.plan_heap_q8({'q8.json': table}, s, 'rp2040')
    assert rp2['parts']['depthwise tap tables (q8asm)'] == expect
    # not where q8asm is not staged (no ARM): an ESP32 plans none
    esp = memory.plan_heap_q8({'q8.json': table}, s, 'esp32')
    assert 'depthwise tap tables (q8asm)' not in esp['parts']
    # the plan difference: the tables and their share of the fragmentation allowance
    monkeypatch.setattr(memory, 'q8_tap_tables', lambda *a, **k: 0)
    without = memory.plan_heap_q8({'q8.json': table}, s, 'rp2040')
    assert abs(rp2['total'] - without['total'] - expect * (1 + memory.Q8_SLACK[4][1])) <= 1


def test_frozen_depthwise_layers_keep_forward_tables_only(tmp_path, monkeypatch):
    table, kept = recorded_tables(tmp_path, monkeypatch, 'last:1')
    # the FC alone trains: the depthwise layers run forward only, in row bands (q8bands:
    # a band's geometry each): one table per distinct band geometry
    assert kept and memory.q8_tap_tables(table, 4, 16) == sum(
        16 + -(-4 * n // 16) * 16 for n in kept.values())
