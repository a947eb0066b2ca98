"""Tests for micro/utrain/npfallback.py, the pure-Python ulab.numpy subset.

battery() below runs three times: on npfallback under CPython, on npfallback
under unix MicroPython (its source is shipped to a subprocess) and on NumPy
float32 (through an adapter), which gives the expected values.  Inputs are
small multiples of 1/8, so sums and dot products are exact in float32 and
every comparison can use a 1e-6 relative tolerance.
"""

import inspect
import json
import math
import os
import subprocess
import sys
import types

import numpy
import pytest

from repo import ROOT  # noqa: E402
UTRAIN = os.path.join(ROOT, "micro", "utrain")
sys.path.insert(0, UTRAIN)
import npfallback as npf  # noqa: E402
from host_tools.target.runner import find_micropython  # noqa: E402


def battery(np, emit):
    # Must stay runnable by MicroPython: uses only the ulab subset.  Results go
    # straight to emit(name, value) so that they do not fragment a small heap.
    INF = float("inf")

    def J(x):
        if hasattr(x, "tolist"):
            x = x.tolist()
        if isinstance(x, (bytes, bytearray)):
            x = list(x)
        if isinstance(x, (list, tuple)):
            return [J(v) for v in x]
        x = float(x)
        if x != x:
            return "nan"
        if x == INF or x == -INF:
            return "inf" if x > 0 else "-inf"
        return x

    def rec(name, f):
        try:
            r = J(f())
        except Exception as e:
            r = "E:%s:%s" % (type(e).__name__, e)
        emit(name, r)

    def M(r, c, s=0):
        return np.array([[((i * c + j) * 7 + s) % 19 / 8 - 1 for j in range(c)] for i in range(r)])

    def P(r, c, s=0):
        return np.array([[((i * c + j) * 5 + s) % 13 / 4 + 0.25 for j in range(c)]
                         for i in range(r)])

    def V(n, s=0):
        return np.array([((j * 7 + s) % 17) / 8 - 1 for j in range(n)])

    def run(name, f, *args):
        # f mutates its argument(s); record the argument(s) afterwards
        f(*args)
        emit(name, J(list(args) if len(args) > 1 else args[0]))

    class Key:
        def __getitem__(self, k):
            return k

    K = Key()  # K[1:3, ::2] builds index keys: MicroPython cannot call the slice type
    A, B, Pp, v, w = M(3, 4), M(3, 4, 5), P(3, 4), V(4), V(4, 3)
    row, col, one = M(1, 4, 2), M(3, 1, 3), M(1, 1, 4)
    W, X = M(5, 3, 1), M(3, 5, 2)

    # creation
    rec("zeros1", lambda: np.zeros(3))
    rec("zeros2", lambda: np.zeros((2, 3)))
    rec("empty_shape", lambda: np.empty((2, 5)).shape)
    rec("full", lambda: np.full((2, 2), 1.5))
    rec("full1", lambda: np.full(3, 7))
    rec("array1", lambda: np.array([1, 2.5, -3]))
    rec("array2", lambda: np.array([[1, 2], [3, 4], [5, 6]]))
    rec("array_rows", lambda: np.array([V(3), V(3, 1)]))
    rec("array_f32", lambda: np.array([0.1, 1e-3, 3.3]))
    rec("array_gen", lambda: np.array(range(4)))

    def copy_indep():
        a = M(2, 3)
        c = np.array(a)
        d = a.copy()
        a[0, 0] = 99
        return [c, d, a]

    rec("array_copy", copy_indep)
    buf = np.array([1.5, -2, 3.25, 4]).tobytes()
    rec("tobytes", lambda: buf)
    rec("frombuffer", lambda: np.frombuffer(buf))
    rec("frombuffer_off", lambda: np.frombuffer(buf, dtype=np.float, count=2, offset=4))
    rec("props", lambda: [A.shape, A.size, len(A), A.T.shape, v.shape, v.size, len(v), A.itemsize])

    # indexing
    rec("ix_int", lambda: A[1])
    rec("ix_int2", lambda: [A[1, 2], A[-1, -1], v[2], v[-1]])
    rec("ix_col", lambda: A[:, 1])
    rec("ix_rows", lambda: A[1:3])
    rec("ix_step", lambda: A[::2, ::-1])
    rec("ix_colstep", lambda: A[:, 1:4:2])
    rec("ix_T", lambda: [A.T[1], A.T[:, 2], A.T[2, 1], A.transpose()])
    rec("ix_1d", lambda: [v[1:4:2], v[::-1], v[-3:], v[5:], v[:-1]])
    rec("ix_neg_step", lambda: [A[2:0:-1, 3:0:-2], A[::-2]])
    rec("iter", lambda: [[r.tolist() for r in A], list(v), [list(r) for r in A.T]])
    rec("tolist", lambda: [A.tolist(), v.tolist(), A.T.tolist()])
    rec("copy_views", lambda: [A.T.copy(), A[:, ::2].copy(), A.T.flatten(), A.flatten()])

    # setitem, also through views
    def set_basic(a):
        a[0, 0] = 2.5
        a[1] = 5
        a[:, 2] = V(3, 1)
        a[2, 1:3] = -1

    run("set_basic", set_basic, M(3, 4))
    run("set_block", lambda a: a.__setitem__(K[1:3, 1:3], 0), M(3, 4))
    run("set_bcast_row", lambda a: a.__setitem__(K[0:2], V(4, 2)), M(3, 4))
    run("set_bcast_row2", lambda a: a.__setitem__(K[:], M(1, 4, 3)), M(3, 4))
    run("set_step", lambda a: a.__setitem__(K[::2, ::2], M(2, 2, 1)), M(3, 4))
    run("set_T", lambda a: a.T.__setitem__(K[1:3], 9), M(3, 4))
    run("set_T_arr", lambda a: a.T.__setitem__(0, V(3, 5)), M(3, 4))
    run("set_colview", lambda a: a[:, ::2].__setitem__(1, 7), M(3, 4))
    run("set_1d", lambda a: a.__setitem__(K[1::2], np.array([8, 9])), V(5))
    run("set_1d_rev", lambda a: a.__setitem__(K[::-1], V(5, 3)), V(5))
    run("set_self_overlap", lambda a: a.__setitem__(K[1:], a[:-1]), V(5))

    # arithmetic and broadcasting
    for nm, f in (
        ("add", lambda a, b: a + b),
        ("sub", lambda a, b: a - b),
        ("mul", lambda a, b: a * b),
        ("div", lambda a, b: a / b),
    ):
        rec(nm + "_same", lambda: f(A, Pp))
        rec(nm + "_row", lambda: f(A, P(1, 4)))
        rec(nm + "_col", lambda: f(A, P(3, 1)))
        rec(nm + "_1d", lambda: f(A, P(1, 4)[0]))
        rec(nm + "_11", lambda: f(A, P(1, 1)))
        rec(nm + "_scalar", lambda: f(A, 1.5))
        rec(nm + "_iscalar", lambda: f(A, 3))
        rec(nm + "_rscalar", lambda: f(2.5, Pp))
        rec(nm + "_rowleft", lambda: f(row, Pp))
        rec(nm + "_colleft", lambda: f(col, Pp))
        rec(nm + "_outer", lambda: f(P(3, 1), P(1, 4)[0]))
        rec(nm + "_vv", lambda: f(v, P(1, 4)[0]))
        rec(nm + "_T", lambda: f(W.T, P(3, 5)))
        rec(nm + "_TT", lambda: f(W.T, X.T.T))
        rec(nm + "_stepview", lambda: f(A[:, ::2], Pp[::-1, 1::2]))
        rec(nm + "_colview", lambda: f(A[:, 1], Pp[:, 2]))
        rec(nm + "_bool", lambda: f(A > 0, Pp))
    rec("neg_abs", lambda: [-A, abs(A), -A.T, abs(v[::2])])
    rec("div_zero", lambda: [V(3) / 0, V(3) / np.array([0, 1, 0]), 1 / np.array([0.0, 2])])
    rec("lit_mix", lambda: 1 - A * 2 + A / 4 - 0.5)

    # comparisons
    for nm, f in (
        ("gt", lambda a, b: a > b),
        ("lt", lambda a, b: a < b),
        ("ge", lambda a, b: a >= b),
        ("le", lambda a, b: a <= b),
        ("eq", lambda a, b: a == b),
    ):
        rec(nm + "_scalar", lambda: f(A, 0.125))
        rec(nm + "_same", lambda: f(A, B))
        rec(nm + "_row", lambda: f(A, row))
        rec(nm + "_col", lambda: f(A, col))
        rec(nm + "_view", lambda: f(W.T, X))
    rec("mask_mul", lambda: [(A > 0) * A, A * (A > 0), (v > 0) * 2.0])

    # in-place, also through views and with broadcasting
    for nm, f in (
        ("iadd", lambda a, b: a.__iadd__(b)),
        ("isub", lambda a, b: a.__isub__(b)),
        ("imul", lambda a, b: a.__imul__(b)),
        ("idiv", lambda a, b: a.__itruediv__(b)),
    ):
        run(nm + "_same", lambda a: f(a, P(3, 4, 1)), M(3, 4))
        run(nm + "_row", lambda a: f(a, P(1, 4, 1)), M(3, 4))
        run(nm + "_1d", lambda a: f(a, P(1, 4, 2)[0]), M(3, 4))
        run(nm + "_col", lambda a: f(a, P(3, 1, 1)), M(3, 4))
        run(nm + "_scalar", lambda a: f(a, 2), M(3, 4))
        run(nm + "_T", lambda a: f(a.T, P(4, 3)), M(3, 4))
        run(nm + "_T_row", lambda a: f(a.T, P(1, 3)), M(3, 4))
        run(nm + "_rowview", lambda a: f(a[1], P(1, 4)[0]), M(3, 4))
        run(nm + "_blockview", lambda a: f(a[1:3, 1:3], P(2, 2)), M(3, 4))
        run(nm + "_stepview", lambda a: f(a[:, ::2], P(3, 1)), M(3, 4))
        run(nm + "_1dv", lambda a: f(a[::2], 4), V(7))
        run(nm + "_self", lambda a: f(a, a), P(3, 4))
        run(nm + "_overlap", lambda a: f(a[1:], a[:-1]), P(5, 1)[:, 0])
        run(nm + "_Tself", lambda a: f(a, a.T), P(3, 3))

    def iadd_seq(a):
        # only += and -= are always in place on MicroPython; *= and /= need
        # MICROPY_PY_ALL_INPLACE_SPECIAL_METHODS, else they rebind (a = a * b)
        b = a
        a += 1
        a -= a[0]
        return [b is a, a]

    rec("iop_identity", lambda: iadd_seq(M(2, 2)))

    # element-wise functions
    Q = P(3, 4)
    big = np.array([-200.0, 200, 0])
    rec("exp", lambda: [np.exp(A), np.exp(v), np.exp(A.T[::2]), np.exp(big)])
    rec("log", lambda: [np.log(Q), np.log(Q[:, 1]), np.log(np.array([0.0, 1, 2]))])
    rec("sqrt", lambda: [np.sqrt(Q), np.sqrt(Q.T), np.sqrt(np.array([0.0, 2, 9]))])
    rec("tanh", lambda: [np.tanh(A), np.tanh(v[::-1]), np.tanh(np.array([-30.0, 30]))])
    rec("fun_scalar", lambda: [np.exp(0.5), np.log(2.0), np.sqrt(2.0), np.tanh(0.5)])

    def outs():
        o = np.zeros((3, 4))
        r = np.exp(A, out=o)
        np.tanh(A.T.T, out=o)
        s = np.zeros(4)
        np.sqrt(Q[1], out=s)
        return [o, r, s]

    rec("fun_out", outs)
    mx, mn = np.maximum, np.minimum
    rec("maximum", lambda: [mx(A, 0), mx(A, B), mx(A, row), mx(0.25, A.T)])
    rec("minimum", lambda: [mn(A, 0), mn(A, B), mn(col, A), mn(v, 0.5)])
    rec("clip", lambda: [np.clip(A, -0.5, 0.5), np.clip(v, 0, 1), np.clip(A.T, -1, 0)])
    rec("where", lambda: [np.where(A > 0, A, 0), np.where(A > 0, 1, -1), np.where(v > 0, v, w)])
    wh = np.where
    rec("where_bcast", lambda: [wh(row > 0, A, B), wh(col > 0, A, 0.5), wh(A.T > 0, A.T, W[1:])])

    # reductions
    for nm in ("sum", "mean", "max", "min", "argmax"):
        f = getattr(np, nm)
        rec(nm + "_2d", lambda: [f(A), f(A, axis=0), f(A, axis=1), f(A, axis=-1)])
        rec(nm + "_1d", lambda: [f(v), f(v, axis=0), f(v[::-2])])
        rec(nm + "_view", lambda: [f(W.T), f(W.T, axis=0), f(W.T, axis=1), f(A[:, 1:3], axis=0)])

    # dot
    x64, W64 = M(1, 64, 3), M(32, 64, 1)
    rec("dot_vv", lambda: [np.dot(v, w), np.dot(v[::2], w[1::2])])
    rec("dot_mm", lambda: np.dot(A, M(4, 5, 2)))
    rec("dot_mv", lambda: np.dot(A, w))
    rec("dot_vm", lambda: np.dot(V(3), A))
    rec("dot_xWT", lambda: np.dot(x64, W64.T))
    rec("dot_WTx", lambda: np.dot(W.T, X.T))
    rec("dot_TT", lambda: np.dot(A.T, B))
    rec("dot_views", lambda: [np.dot(A[:, ::2], W[1:3]), np.dot(A[1], W[::-1][1:])])
    rec("dot_Tv", lambda: np.dot(W.T, V(5)))

    # arrays above the small-allocation threshold (64 items)
    G, H = M(12, 10, 1), P(12, 10, 2)
    rec("big_create", lambda: [np.zeros((12, 10)), np.zeros(100), np.full((9, 9), -2)])
    rec("big_ops", lambda: [G + H, G * 0.5, 1 - G, G / H, G > 0, np.maximum(G, 0), -G])
    rec("big_funs", lambda: [np.exp(G), np.tanh(G.T), np.where(G > 0, G, H), G.T.copy()])
    run("big_iops", lambda a: [a.__iadd__(H), a.__isub__(0.25), a.T.__imul__(H.T)], M(12, 10))

    # reshape, flatten
    def reshape_view():
        a = M(3, 4)
        r = a.reshape((2, 6))
        r[0, 0] = 42
        q = a.reshape(-1)
        q[11] = -42
        return [a, r.shape, a.reshape((4, -1)), a.reshape(12), a.reshape((12,)).shape]

    rec("reshape", reshape_view)

    def reshape_copy():
        a = M(3, 4)
        r = a.T.reshape((2, 6))
        r[0, 0] = 42
        return [a, r]

    rec("reshape_T", reshape_copy)
    rec("flatten", lambda: [A.flatten(), A.T.flatten(), v.flatten(), A[:, 1:3].flatten()])

    # errors (expected values are fixed, not from NumPy)
    rec("err_zeros3", lambda: np.zeros((2, 2, 2)))
    rec("err_array3", lambda: np.array([[[1.0, 2]], [[3, 4]]]))
    rec("err_reshape3", lambda: A.reshape((1, 2, 6)))
    rec("err_reshape_size", lambda: A.reshape((5, 2)))
    rec("err_bcast", lambda: A + M(3, 5))
    rec("err_bcast_1d", lambda: A + V(3))
    rec("err_bcast_T", lambda: A * A.T)
    rec("err_bcast_cmp", lambda: A > M(2, 4))
    rec("err_bcast_where", lambda: np.where(A > 0, A, W))
    rec("err_ibcast", lambda: row.__iadd__(A))
    rec("err_set_bcast", lambda: A.__setitem__(0, V(3)))
    rec("err_dot_mm", lambda: np.dot(A, A))
    rec("err_dot_vv", lambda: np.dot(v, V(3)))
    rec("err_dot_mv", lambda: np.dot(A, V(3)))
    rec("err_index", lambda: A[3])
    rec("err_index2", lambda: A[0, -5])
    rec("err_too_many", lambda: v[1, 2])


ERRORS = {
    "err_zeros3": "ValueError:maximum number of dimensions is 2",
    "err_array3": "ValueError:maximum number of dimensions is 2",
    "err_reshape3": "ValueError:maximum number of dimensions is 2",
    "err_reshape_size": "ValueError:cannot reshape array",
    "err_bcast": "ValueError:operands could not be broadcast together",
    "err_bcast_1d": "ValueError:operands could not be broadcast together",
    "err_bcast_T": "ValueError:operands could not be broadcast together",
    "err_bcast_cmp": "ValueError:operands could not be broadcast together",
    "err_bcast_where": "ValueError:operands could not be broadcast together",
    "err_ibcast": "ValueError:operands could not be broadcast together",
    "err_set_bcast": "ValueError:operands could not be broadcast together",
    "err_dot_mm": "ValueError:dimensions do not match",
    "err_dot_vv": "ValueError:dimensions do not match",
    "err_dot_mv": "ValueError:dimensions do not match",
    "err_index": "IndexError:",
    "err_index2": "IndexError:",
    "err_too_many": "IndexError:",
}


def _numpy_ref():
    f32 = numpy.float32
    ns = types.SimpleNamespace(
        float=f32,
        bool=numpy.bool_,
        uint8=numpy.uint8,
        ndarray=numpy.ndarray,
        zeros=lambda s, dtype=f32: numpy.zeros(s, dtype),
        empty=lambda s, dtype=f32: numpy.zeros(s, dtype),
        full=lambda s, v, dtype=f32: numpy.full(s, v, dtype),
        array=lambda o, dtype=f32: numpy.array(o, dtype),
        frombuffer=lambda b, dtype=f32, count=-1, offset=0: numpy.frombuffer(
            b, dtype, count, offset
        ).copy(),
    )
    for name in "dot exp log sqrt tanh maximum minimum clip where sum mean max min argmax".split():
        setattr(ns, name, getattr(numpy, name))
    with numpy.errstate(all="ignore"):
        return _collect(ns)


def _collect(np):
    r = {}
    battery(np, r.__setitem__)
    return r


REF = _numpy_ref()
CASES = sorted(REF)


def _check(name, got):
    if name in ERRORS:
        assert isinstance(got, str) and got.startswith("E:" + ERRORS[name]), got
        return
    exp = REF[name]
    assert not (isinstance(got, str) and got.startswith("E:")), got
    _same(exp, got, name)


def _same(exp, got, path):
    if isinstance(exp, list):
        assert isinstance(got, list) and len(got) == len(exp), (path, exp, got)
        for i, (e, g) in enumerate(zip(exp, got)):
            _same(e, g, "%s[%d]" % (path, i))
    elif isinstance(exp, str):  # nan / inf / -inf
        assert got == exp, (path, exp, got)
    else:
        assert isinstance(got, float), (path, exp, got)
        assert math.isclose(got, exp, rel_tol=1e-6, abs_tol=1e-7), (path, exp, got)


_CPY = None


def _cpython_results():
    global _CPY
    if _CPY is None:
        _CPY = _collect(npf)
    return _CPY


_MPY = {}


def _micropython_results():
    if "r" not in _MPY:
        exe = find_micropython()
        if not exe:
            _MPY["r"] = None
        else:
            src = "import sys, json\nsys.path.insert(0, %r)\nimport npfallback\n" % UTRAIN
            src += inspect.getsource(battery)
            src += "battery(npfallback, lambda k, v: print(json.dumps([k, v])))\n"
            cmd = [exe, "-X", "heapsize=1M", "-c", src]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            _MPY["r"] = p.stdout[-2000:] + p.stderr[-2000:]
            if p.returncode == 0:
                _MPY["r"] = dict(json.loads(line) for line in p.stdout.splitlines())
    if _MPY["r"] is None:
        pytest.skip("micropython binary not found")
    assert isinstance(_MPY["r"], dict), "micropython run failed: " + _MPY["r"]
    return _MPY["r"]


def test_battery_covers_cases():
    assert len(CASES) > 150
    assert set(ERRORS) <= set(CASES)
    assert set(_cpython_results()) == set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_cpython(name):
    _check(name, _cpython_results()[name])


@pytest.mark.parametrize("name", CASES)
def test_micropython(name):
    r = _micropython_results()
    assert name in r
    _check(name, r[name])


# Semantics checked directly under CPython (not comparable with NumPy).


def test_dtypes():
    assert (npf.float, npf.bool, npf.uint8) == ("f", "B", "B")
    a = npf.array([1, 2, 3])
    assert a.dtype == "f" and a.itemsize == 4 and a._d.typecode == "f"
    m = a > 1
    assert m.dtype == "B" and m.itemsize == 1 and m.tolist() == [0, 1, 1]
    assert (m * a).dtype == "f" and (m * 2).dtype == "f" and (m / m).dtype == "f"
    assert npf.argmax(npf.array([[1, 3], [4, 2]]), axis=1).tolist() == [1, 0]
    b = npf.array([1, 0, 1], dtype=npf.bool)
    assert (b + b).dtype == "B" and (b + b).tolist() == [2, 0, 2]  # uint8 as in ulab
    assert (b * b).tolist() == [1, 0, 1] and (b - b).tolist() == [0, 0, 0]
    assert npf.zeros(2, dtype=npf.uint8).tolist() == [0, 0]
    assert npf.ndarray([1, 2]).tolist() == [1.0, 2.0]


def test_views_share_storage():
    w = npf.array([[1, 2, 3], [4, 5, 6]])
    views = (w.T, w.transpose(), w[1], w[:, 1], w[::2, ::-1], w.reshape((3, 2)), w.reshape(-1))
    for v in views + (w[0:1],):
        assert v._d is w._d
    for c in (w.copy(), w.flatten(), npf.array(w), w.T.reshape(6), w.T.copy()):
        assert c._d is not w._d
    assert w.T.strides == (1, 3) and w[:, ::2].strides == (3, 2) and w[1]._o == 3
    assert isinstance(w[1, 2], float) and w[1, 2] == 6.0


def test_float32_rounding():
    a = npf.array([0.1, 1 / 3])
    assert a.tolist() == [float(numpy.float32(0.1)), float(numpy.float32(1 / 3))]
    a[0] = 0.2
    assert a[0] == float(numpy.float32(0.2))
    assert (a * 1.1).tolist() == (numpy.array(a.tolist(), numpy.float32) * 1.1).tolist()
    assert a.tobytes() == numpy.array(a.tolist(), numpy.float32).tobytes()


def test_scalar_functions_and_out():
    for f in (npf.exp, npf.log, npf.sqrt, npf.tanh):
        assert isinstance(f(2.0), float)
    a = npf.array([[1, 2], [3, 4]])
    o = npf.zeros((2, 2))
    assert npf.exp(a, out=o) is o
    assert npf.exp(a, out=a) is a and math.isclose(a[0, 0], math.e, rel_tol=1e-6)
    for bad in (npf.zeros(4), npf.zeros((2, 4))[:, ::2], npf.zeros((2, 2), dtype=npf.bool)):
        with pytest.raises(ValueError):
            npf.tanh(a, out=bad)
    assert npf.exp(1000.0) == math.inf and npf.log(0.0) == -math.inf


def test_frombuffer_copies_and_tobytes_dense_only():
    buf = bytearray(numpy.array([1, 2, 3], numpy.float32).tobytes())
    a = npf.frombuffer(buf)
    buf[0:4] = bytes(4)
    assert a.tolist() == [1.0, 2.0, 3.0]
    assert npf.frombuffer(bytes([1, 0, 1]), dtype=npf.uint8).tolist() == [1, 0, 1]
    with pytest.raises(ValueError):
        npf.frombuffer(b"12345")
    with pytest.raises(ValueError):
        npf.array([[1, 2], [3, 4]]).T.tobytes()
    assert isinstance(npf.zeros(2).tobytes(), bytearray)


def test_inplace_keeps_identity_and_bool_target():
    a = npf.zeros((2, 3))
    v = a.T
    ref = a
    a += 1
    v *= npf.array([[1, 2]])
    assert a is ref and a.tolist() == [[1, 1, 1], [2, 2, 2]]
    m = npf.array([0, 1, 1], dtype=npf.bool)
    m *= npf.array([1, 0, 1], dtype=npf.bool)
    assert m.dtype == "B" and m.tolist() == [0, 0, 1]
    m[0] = 1.0
    assert m.tolist() == [1, 0, 1]


# The fused in-place kernels utrain.xnp takes from the fallback (not ulab API), the
# full-slice fill and the fast paths of binary ops, against NumPy float32, under
# CPython and (with the native emitter, when it has one) under MicroPython.


def fused_cases(np, add_scaled, add_outer):
    def A(r, c, s=0):
        return np.array([[((i * c + j) * 7 + s) % 19 / 8 - 1 for j in range(c)] for i in range(r)])

    out = []
    w = A(3, 70)                        # > 64 items: block copies in fills
    add_scaled(w, A(3, 70, 5), -0.25)
    out.append(w.tolist())
    t = A(4, 3)                         # strided target and source (transposed views)
    v = t.T
    add_scaled(v, A(4, 3, 2).T, 0.5)
    out.append(t.tolist())
    r = A(1, 5)
    add_scaled(r[0], A(1, 5, 3)[0], 2.0)    # 1-D row views
    out.append(r.tolist())
    g = A(3, 4)
    add_outer(g, A(1, 3, 1), A(1, 4, 2))
    out.append(g.tolist())
    g = A(4, 3)
    add_outer(g.T, A(1, 3, 1)[0], A(2, 4, 2)[1])  # strided rows, 1-D vectors
    out.append(g.tolist())
    f = A(3, 70)
    f[:] = 0.0
    out.append(f.tolist())
    f[:] = 1.5
    out.append(f[2].tolist())
    f = A(4, 6)
    f[:, 1:4] = 2.0                     # not dense: the general path
    out.append(f.tolist())
    a, b = A(2, 5), A(2, 5, 4)
    out.append((a + 0.5).tolist())
    out.append((a * b).tolist())
    out.append((a - b).tolist())
    out.append((a > b).tolist())
    out.append((a.T * b.T).tolist())    # non-dense operands: the general path
    a += b
    out.append(a.tolist())
    a -= 0.25
    out.append(a.tolist())
    a -= a
    out.append(a.tolist())
    return out


def _numpy_fused():
    def add_scaled(y, x, s):
        y += x * numpy.float32(s)

    def add_outer(a, u, v):
        a += numpy.outer(u, v).astype(numpy.float32)

    class NP:
        @staticmethod
        def array(x):
            return numpy.array(x, dtype=numpy.float32)
    return fused_cases(NP, add_scaled, add_outer)


def _close(got, want):
    g, w = numpy.array(got, dtype=float), numpy.array(want, dtype=float)
    assert g.shape == w.shape
    numpy.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_fused_kernels_cpython():
    want = _numpy_fused()
    got = fused_cases(npf, npf._add_scaled, npf._add_outer)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _close(g, w)


def test_fused_kernels_micropython():
    exe = find_micropython()
    if not exe:
        pytest.skip("micropython binary not found")
    src = "import sys, json\nsys.path.insert(0, %r)\nimport npfallback\n" % UTRAIN
    src += inspect.getsource(fused_cases)
    src += ("print(json.dumps([npfallback.NATIVE, fused_cases(npfallback, "
            "npfallback._add_scaled, npfallback._add_outer)]))\n")
    p = subprocess.run([exe, "-X", "heapsize=1M", "-c", src], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    native, got = json.loads(p.stdout.splitlines()[-1])
    want = _numpy_fused()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _close(g, w)


# The fallback's one-call convolution and max-pool steps (npfallback._conv_steps and
# _maxpool_steps, used by op_conv and op_pool) against those ops' step-by-step array
# ops (checked against ONERT and finite differences in test_conv_ops.py), on strides,
# padding, dilation, multipliers and ties in the max.
CONV_SCRIPT = r'''
import json
from utrain import op_conv
from utrain.xnp import np, zeros, BACKEND


class RT:
    # a Net with a summing gradient sink (utrain.sink.Sums's grad(k, g) and grad(k))
    def __init__(self, t, shape):
        self.t, self.shape, self.acc, self.g = t, shape, {}, {}
        self.sink = self

    def grad(self, k, g=None, x=None):
        if k not in self.acc:
            self.acc[k] = zeros(self.shape[k])
        a = self.acc[k]
        if g is None:
            return a
        a += g

    def add_grad(self, k, d):
        self.g[k] = d


def val(i, n):
    return ((i * 7 + n) % 23) / 8.0 - 1.3


def arr(shape, s):
    a = zeros(shape)
    for i in range(shape[0]):
        for j in range(shape[1]):
            a[i, j] = val(i * shape[1] + j, s)
    return a


def run(fast, code, H, W, C, OC, K, s, d, pad, M, act):
    op_conv.conv_steps = fast or (lambda *a: False)     # declined: utrain.convwalk's rows
    OH = (H + 2 * pad - d * (K - 1) - 1) // s + 1
    OW = (W + 2 * pad - d * (K - 1) - 1) // s + 1
    if code == 4:
        OC = C * M
    o = (act, H, W, C, OH, OW, OC, K, K, s, s, d, d, pad, pad, M)
    wshape = (OC, K * K * C) if code == 3 else (K * K, OC)
    shape = [(H * W, C), wshape, (1, OC), (OH * OW, OC)]
    rt = RT([arr(shape[0], 1), arr(wshape, 2), arr((1, OC), 3), None], shape)
    op = (code, (0, 1, 2), (3,), o)
    op_conv.forward(rt, op)
    y = rt.t[3]
    op_conv.backward(rt, op, arr(shape[3], 4), 7)
    return [y.tolist(), rt.acc[1].tolist(), rt.acc[2].tolist(), rt.g[0].tolist()]


def pool(fast, H, W, C, K, s, pad, act):
    op_pool.maxpool_steps = fast
    OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
    o = (act, H, W, C, OH, OW, C, K, K, s, s, 1, 1, pad, pad)
    shape = [(H * W, C), (OH * OW, C)]
    x = arr(shape[0], 5)
    for i in range(0, H * W, 3):
        x[i, 0] = x[(i + 1) % (H * W), 0]          # ties: the first in scan order wins
    rt = RT([x, None], shape)
    op = (17, (0,), (1,), o)
    op_pool.forward(rt, op)
    y = rt.t[1]
    op_pool.backward(rt, op, arr(shape[1], 6), 1)
    return [y.tolist(), rt.g[0].tolist()]


from utrain import op_pool
pfast = op_pool.maxpool_steps
fast = op_conv.conv_steps
if fast is None:                # ulab: op_conv loads utrain.ulconv's steps
    from utrain.ulconv import steps as fast
out2 = [pool(pfast, *c) + pool(None, *c) for c in [(6, 6, 2, 2, 2, 0, 0), (7, 5, 3, 3, 2, 1, 1),
                                                   (5, 5, 2, 3, 1, 1, 3)]]
cases = [(3, 6, 5, 2, 3, 3, 1, 1, 0, 1, 1), (3, 7, 6, 3, 4, 3, 2, 1, 1, 1, 0),
         (3, 7, 7, 2, 3, 3, 1, 2, 2, 1, 3), (3, 5, 5, 4, 2, 1, 1, 1, 0, 1, 1),
         (4, 6, 5, 3, 0, 3, 1, 1, 1, 1, 1), (4, 7, 6, 2, 0, 3, 2, 1, 1, 2, 0),
         (4, 6, 6, 3, 0, 3, 1, 2, 2, 3, 1)]
out = [BACKEND, fast is not None]
for c in cases:
    out.append([run(fast, *c), run(None, *c)])
for p in out2:
    out.append([p[:2], p[2:]])
print(json.dumps(out))
'''


def _conv_results(argv, env):
    p = subprocess.run(argv, input=None, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("where", ["cpython", "numpy", "micropython"])
def test_conv_and_pool_steps_match_the_array_ops(where, tmp_path):
    script = tmp_path / "conv.py"
    script.write_text(CONV_SCRIPT)
    micro = os.path.join(ROOT, "micro")
    if where == "numpy":                # xnp's numpy conv_steps (a tap at a time)
        env = dict(os.environ, PYTHONPATH=micro)
        env.pop("UTRAIN_NP", None)
        r = _conv_results([sys.executable, str(script)], env)
        assert r[0] == "numpy" and r[1] is True
        for fast, slow in r[2:]:
            for a, b in zip(fast, slow):
                numpy.testing.assert_allclose(numpy.array(a), numpy.array(b), rtol=1e-5, atol=1e-5)
        return
    if where == "cpython":
        env = dict(os.environ, UTRAIN_NP="fallback", PYTHONPATH=micro)
        argv = [sys.executable, str(script)]
    else:
        exe = find_micropython()
        if not exe:
            pytest.skip("micropython binary not found")
        env = dict(os.environ, MICROPYPATH=micro)
        argv = [exe, "-X", "heapsize=4M", str(script)]
    r = _conv_results(argv, env)
    assert r[1] is True
    if r[0] == "ulab":                  # ulab's steps (utrain.ulconv) against convwalk's rows
        for fast, slow in r[2:]:
            for a, b in zip(fast, slow):
                numpy.testing.assert_allclose(numpy.array(a), numpy.array(b), rtol=2e-5, atol=2e-5)
        return
    assert len(r) == 2 + 7 + 3
    for fast, slow in r[2:]:
        for a, b in zip(fast, slow):
            _close(a, b)
