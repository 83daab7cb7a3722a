"""DLPack and the array interface between loom, NumPy and PyTorch: zero copy (a write
through one side is seen on the other), lifetimes whichever side goes first, capsule
protocol (names, consumption, deleters), every dtype, layouts, and bad input."""
import ctypes
import gc
import sys

import numpy as np
import pytest
import torch

import loom

NUMPY_TYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.bool_]


def random_array(rng, shape, dt):
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -100), min(info.max, 100), size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


@pytest.mark.parametrize("dt", NUMPY_TYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4), (2, 0, 3), (2, 3, 4)])
def test_numpy_round_trip_shares_memory(rng, dt, shape):
    a = random_array(rng, shape, dt)
    t = loom.from_numpy(a)
    assert t.shape == a.shape
    assert t.dtype.name == {np.float32: "float32", np.float64: "float64", np.float16: "float16",
                            np.int32: "int32", np.int64: "int64", np.int8: "int8",
                            np.uint8: "uint8", np.bool_: "bool"}[dt]
    b = np.asarray(t)            # __array_interface__
    # NumPy 1.24 and PyTorch 1.13 predate DLPack's bool type (kDLBool, DLPack 0.8): bool
    # goes to them through the array interface, and between loom tensors through DLPack.
    c = np.from_dlpack(t) if dt != np.bool_ else np.asarray(loom.from_dlpack(t.__dlpack__()))
    for view in (b, c):
        assert view.dtype == a.dtype and view.shape == a.shape
        np.testing.assert_array_equal(view, a)
    if a.size:
        assert b.__array_interface__["data"][0] == a.__array_interface__["data"][0]
        a.flat[0] = a.flat[-1]
        assert b.flat[0] == a.flat[-1] and c.flat[0] == a.flat[-1]


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                torch.int32, torch.int64, torch.int8, torch.uint8])
def test_torch_round_trip_shares_memory(dt):
    x = (torch.arange(24) % 7).to(dt).reshape(2, 3, 4)
    t = loom.from_dlpack(x)
    assert t.shape == (2, 3, 4)
    assert t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr()
    assert torch.equal(y, x)
    x[0, 0, 0] = 5
    assert y[0, 0, 0].item() == 5


def test_loom_numpy_torch_loom_round_trip(rng):
    a = rng.standard_normal((5, 6)).astype(np.float32)
    t1 = loom.Tensor(a)                    # a copy, in loom's pool
    n = np.asarray(t1)
    tt = torch.from_numpy(n)
    t2 = loom.from_dlpack(tt)
    assert t2.data_ptr == t1.data_ptr
    n[2, 3] = 42.0
    assert np.asarray(t2)[2, 3] == 42.0


def test_strided_views_keep_their_layout(rng):
    a = rng.standard_normal((6, 8)).astype(np.float32)
    for view in (a.T, a[::2, 1::3], a[::-1], a[:, ::-2]):
        t = loom.from_numpy(view)
        assert t.shape == view.shape
        np.testing.assert_array_equal(np.asarray(t), view)
        np.testing.assert_array_equal(np.from_dlpack(t), view)
        np.testing.assert_array_equal(torch.from_dlpack(loom.from_numpy(np.ascontiguousarray(view))).numpy(), view)
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()
    t = loom.from_dlpack(x)
    assert t.strides == (1, 6)
    assert torch.equal(torch.from_dlpack(t), x)


def test_memory_outlives_either_side():
    x = torch.arange(10, dtype=torch.float32)
    t = loom.from_dlpack(x)
    del x
    gc.collect()
    np.testing.assert_array_equal(np.asarray(t), np.arange(10, dtype=np.float32))
    t2 = loom.Tensor(np.arange(4, dtype=np.float64))
    y = torch.from_dlpack(t2)
    z = np.from_dlpack(t2)
    del t2
    gc.collect()
    assert y.tolist() == [0.0, 1.0, 2.0, 3.0]
    np.testing.assert_array_equal(z, [0, 1, 2, 3])


def test_capsule_protocol_names_consumption_and_deleters():
    t = loom.Tensor(np.arange(3, dtype=np.float32))
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype = ctypes.c_char_p
    name.argtypes = [ctypes.py_object]
    legacy = t.__dlpack__()
    assert name(legacy) == b"dltensor"
    versioned = t.__dlpack__(max_version=(1, 0))
    assert name(versioned) == b"dltensor_versioned"
    before = len(loom.memory.outstanding_loans())
    a = loom.from_dlpack(versioned)
    assert name(versioned) == b"used_dltensor_versioned"
    with pytest.raises(BufferError, match="already consumed"):
        loom.from_dlpack(versioned)
    # A capsule nobody consumed gives its memory back when dropped.
    assert len(loom.memory.outstanding_loans()) == before
    del legacy
    gc.collect()
    assert len(loom.memory.outstanding_loans()) == before - 1
    del a, versioned
    gc.collect()
    assert len(loom.memory.outstanding_loans()) == before - 2


def test_loans_name_memory_lent_until_given_back():
    t = loom.Tensor(np.zeros(1000, np.float32))
    base = len(loom.memory.outstanding_loans())
    y = torch.from_dlpack(t)
    loans = loom.memory.outstanding_loans()
    assert len(loans) == base + 1
    assert loans[-1]["pointer"] == t.data_ptr and loans[-1]["bytes"] >= 4000
    assert "DLPack" in loans[-1]["borrower"]
    del y
    gc.collect()
    assert len(loom.memory.outstanding_loans()) == base


def test_dlpack_keyword_arguments():
    t = loom.Tensor(np.arange(4, dtype=np.int64))
    assert t.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))
    copied = loom.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=True))
    assert copied.data_ptr != t.data_ptr
    np.testing.assert_array_equal(np.asarray(copied), [0, 1, 2, 3])
    same = loom.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=False, dl_device=(1, 0)))
    assert same.data_ptr == t.data_ptr


def test_read_only_arrays_stay_read_only():
    a = np.arange(6, dtype=np.float32)
    a.setflags(write=False)
    t = loom.from_numpy(a)
    assert t.readonly
    b = np.asarray(t)
    assert not b.flags.writeable
    with pytest.raises(ValueError):
        b[0] = 1.0
    # A read-only import exported through DLPack 1.x carries the flag; a session never
    # writes it in place.
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [6])
    y = loom.ops.neg(x)
    out = loom.Session(g).run(y, {x: t})
    np.testing.assert_array_equal(a, np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(out), -a)


def test_bad_input_gets_clear_errors():
    with pytest.raises(TypeError, match="__dlpack__"):
        loom.from_dlpack(object())
    with pytest.raises(TypeError):
        loom.from_numpy(np.zeros(3, np.complex64))
    with pytest.raises(BufferError, match="int16"):       # as NumPy's from_dlpack says
        loom.from_dlpack(torch.zeros(3, dtype=torch.int16))
    with pytest.raises(TypeError, match="bfloat16"):
        np.asarray(loom.from_dlpack(torch.zeros(3, dtype=torch.bfloat16)))
    # A capsule of another kind.
    other = ctypes.pythonapi.PyCapsule_New
    other.restype = ctypes.py_object
    other.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    with pytest.raises(BufferError, match="not a DLPack tensor"):
        loom.from_dlpack(other(ctypes.addressof(ctypes.c_int(1)), b"something_else", None))
    with pytest.raises(TypeError):
        loom.Tensor([object()])
    with pytest.raises(TypeError, match="0-d"):
        len(loom.Tensor(np.float32(1.0)))


def test_non_native_byte_order_and_odd_strides_are_copied(rng):
    a = rng.standard_normal(5).astype(">f4")
    t = loom.as_tensor(a)
    np.testing.assert_array_equal(np.asarray(t), a.astype("<f4"))
    rec = np.zeros(4, dtype=[("a", "<f4"), ("b", "<i1")])   # strides of 5 bytes
    rec["a"] = [1, 2, 3, 4]
    t = loom.as_tensor(rec["a"])
    np.testing.assert_array_equal(np.asarray(t), [1, 2, 3, 4])
    with pytest.raises(TypeError):
        loom.from_numpy(rec["a"])  # cannot be shared without a copy


def test_random_shapes_and_strides(rng):
    for _ in range(50):
        ndim = int(rng.integers(0, 5))
        shape = tuple(int(s) for s in rng.integers(0, 5, size=ndim))
        base = rng.standard_normal(tuple(s * 2 + 1 for s in shape)).astype(np.float32)
        slices = tuple(slice(None, None, int(rng.choice([1, 2, -1]))) for _ in shape)
        view = base[slices][tuple(slice(0, s) for s in shape)]
        t = loom.as_tensor(view)
        np.testing.assert_array_equal(np.asarray(t), view)
        np.testing.assert_array_equal(torch.from_dlpack(loom.as_tensor(np.ascontiguousarray(view))).numpy(), view)
        np.testing.assert_array_equal(np.from_dlpack(t), view)


def test_refcounts_of_shared_arrays():
    a = np.arange(100, dtype=np.float32)
    before = sys.getrefcount(a)
    t = loom.from_numpy(a)
    assert sys.getrefcount(a) == before + 1      # the tensor's buffer holds the array
    del t
    gc.collect()
    assert sys.getrefcount(a) == before
