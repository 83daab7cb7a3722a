"""The Python package on bad input: Python values that do not fit a placeholder's dtype,
ragged lists, broken DLPack and array-interface producers, unparsable output names,
checkpoint paths and memory budgets get typed exceptions naming what was wrong, never a
silent wrap, pybind11's "Unable to cast" or a crash; the session and the pools stay usable
and hold no bytes afterwards. Interpreter exit with runs in flight, SIGINT under the
program's own signal settings, and many threads on one session, in subprocesses where the
process itself is under test. Part of the robustness catalogue (Note [the robustness
catalogue], tests/robustness/inputs_test.cpp)."""
import ctypes
import gc
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import loom



@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def host_bytes_in_use():
    gc.collect()
    return loom.memory.stats()["pool"]["bytes_in_use"]


def session_bytes_in_use(s):
    gc.collect()
    return sum(st["bytes_in_use"] for st in s.memory_stats().values())


INT_RANGES = {
    loom.int8: (-128, 127),
    loom.uint8: (0, 255),
    loom.int32: (-2**31, 2**31 - 1),
    loom.int64: (-2**63, 2**63 - 1),
}
NUMPY = {loom.int8: np.int8, loom.uint8: np.uint8, loom.int32: np.int32, loom.int64: np.int64,
         loom.float16: np.float16, loom.float32: np.float32, loom.float64: np.float64,
         loom.bool_: np.bool_}


def identity_session(dtype, shape=(None,)):
    g = loom.Graph()
    x = g.placeholder("x", dtype, list(shape))
    y = loom.ops.identity(x)
    return loom.Session(g), x, y


def check_usable(s, x, y, value, dtype):
    """A valid run after an error gives NumPy's answer, and nothing stays held."""
    got = np.asarray(s.run(y, {x: value}))
    np.testing.assert_array_equal(got, np.array(value, NUMPY[dtype]))
    del got
    assert session_bytes_in_use(s) == 0


# ---- 1. Python values fed to a placeholder -------------------------------------------------

@pytest.mark.parametrize("dtype, value", [
    (loom.uint8, 300), (loom.uint8, 256), (loom.uint8, -1), (loom.int8, 128),
    (loom.int8, -129), (loom.int32, 2**31), (loom.int32, 2**40), (loom.int32, -2**31 - 1),
    (loom.int64, 2**63), (loom.int64, 2**64), (loom.int64, -2**63 - 1),
])
def test_python_ints_that_do_not_fit_the_dtype_are_overflow_errors(dtype, value):
    s, x, y = identity_session(dtype)
    before = host_bytes_in_use()
    lo, hi = INT_RANGES[dtype]
    with pytest.raises(OverflowError) as info:
        s.run(y, {x: [1, value]})
    assert str(info.value) == (f"feed 'x': the Python int {value} (item [1]) does not fit "
                               f"{dtype.name} ({lo} to {hi})")
    s2, x2, y2 = identity_session(dtype, (2, 2))
    with pytest.raises(OverflowError, match=rf"feed 'x': the Python int {value} "
                                            rf"\(item \[1\]\[0\]\) does not fit"):
        s2.run(y2, {x2: [[0, 1], [value, 2]]})
    # A 0-d placeholder takes the number itself.
    s0, x0, y0 = identity_session(dtype, ())
    with pytest.raises(OverflowError, match=rf"feed 'x': the Python int {value} does not fit"):
        s0.run(y0, {x0: value})
    assert host_bytes_in_use() == before
    check_usable(s, x, y, [lo, hi, 0], dtype)


@pytest.mark.parametrize("dtype", list(INT_RANGES))
def test_the_whole_range_of_each_integer_dtype_is_fed_exactly(dtype):
    lo, hi = INT_RANGES[dtype]
    values = [lo, lo + 1, -1 if lo < 0 else 1, 0, hi - 1, hi, True, False,
              np.int64(min(hi, 100)), np.uint8(7)]
    s, x, y = identity_session(dtype)
    got = np.asarray(s.run(y, {x: values}))
    assert got.dtype == NUMPY[dtype]
    assert got.tolist() == [int(v) for v in values]


def test_numpy_integers_in_a_list_are_checked_as_python_ints():
    s, x, y = identity_session(loom.uint8)
    with pytest.raises(OverflowError, match=r"feed 'x': the Python int 300 \(item \[0\]\)"):
        s.run(y, {x: [np.int64(300)]})
    with pytest.raises(OverflowError, match="uint8"):
        s.run(y, {x: [np.array([1, 2**40])]})   # an array inside a list: read as its values


def test_numpy_scalars_are_numbers_too():
    s, x, y = identity_session(loom.int8, ())
    with pytest.raises(OverflowError, match="feed 'x': the Python int 200 does not fit int8"):
        s.run(y, {x: np.int64(200)})
    assert np.asarray(s.run(y, {x: np.float32(-3.9)})).tolist() == -3
    sf, xf, yf = identity_session(loom.float32, ())
    assert np.asarray(sf.run(yf, {xf: np.int64(7)})).tolist() == 7.0
    assert np.asarray(sf.run(yf, {xf: np.True_})).tolist() == 1.0


def test_misaligned_numpy_arrays_are_copied_or_refused():
    raw = np.zeros(4 * 5 + 1, np.uint8)
    a = np.frombuffer(raw.data, dtype=np.float32, count=5, offset=1)   # 1 byte off
    raw[1:21] = np.arange(5, dtype=np.float32).view(np.uint8)
    assert a.ctypes.data % 4 != 0
    t = loom.as_tensor(a)
    assert t.data_ptr % 4 == 0 and t.data_ptr != a.ctypes.data
    np.testing.assert_array_equal(np.asarray(t), np.arange(5, dtype=np.float32))
    with pytest.raises(TypeError, match="cannot be shared with loom without a copy"):
        loom.from_numpy(a)


def test_floats_into_integer_dtypes_truncate_as_numpy_or_fail():
    s, x, y = identity_session(loom.int32)
    values = [1.7, -1.7, 2.5, -0.5, 0.0, 2147483647.9, -2147483648.9]
    got = np.asarray(s.run(y, {x: values}))
    np.testing.assert_array_equal(got, np.array(values).astype(np.int32))   # toward zero
    for bad, error in [(2147483648.0, OverflowError), (-2147483649.0, OverflowError),
                       (math.inf, OverflowError), (-math.inf, OverflowError),
                       (1e300, OverflowError), (math.nan, ValueError)]:
        with pytest.raises(error) as info:
            s.run(y, {x: [0.0, bad]})
        assert "feed 'x'" in str(info.value) and "item [1]" in str(info.value)
        assert repr(bad) in str(info.value) and "int32" in str(info.value)
    s64, x64, y64 = identity_session(loom.int64)
    with pytest.raises(OverflowError, match="int64"):
        s64.run(y64, {x64: [9.3e18]})
    assert np.asarray(s64.run(y64, {x64: [-9.2e18]})).tolist() == [int(-9.2e18)]


def test_bool_takes_the_truth_of_every_number_as_numpy_does():
    s, x, y = identity_session(loom.bool_)
    values = [0, 1, 2, -3, 2**70, 0.0, 0.5, -0.0, math.nan, math.inf, True, False]
    got = np.asarray(s.run(y, {x: values}))
    assert got.tolist() == [bool(v) for v in values]
    np.testing.assert_array_equal(got, np.array([bool(v) for v in values]))


def test_floats_round_to_nearest_and_overflow_to_inf(rng):
    # float16 from a double is rounded once, as NumPy's double -> half cast: values next to
    # the midpoints between two halves would come out wrong if rounded through float32.
    halves = rng.integers(0, 0x7bff, 400).astype(np.uint16).view(np.float16)
    lo = halves.astype(np.float64)
    hi = np.nextafter(halves, np.float16(np.inf)).astype(np.float64)
    mid = (lo + hi) / 2
    values = np.concatenate([lo, mid, mid + mid * 2.0**-40, mid - mid * 2.0**-40,
                             rng.standard_normal(200) * 1000]).tolist()
    s, x, y = identity_session(loom.float16)
    got = np.asarray(s.run(y, {x: values}))
    np.testing.assert_array_equal(got.view(np.uint16), np.array(values, np.float16).view(np.uint16))
    for dtype, big in [(loom.float16, 65520.0), (loom.float32, 1e39), (loom.float16, 2**70)]:
        s, x, y = identity_session(dtype)
        got = np.asarray(s.run(y, {x: [big, -big, 1.5]}))
        assert got.tolist() == [math.inf, -math.inf, 1.5]
    # bfloat16: ties go to the even neighbour, everything else to the nearest.
    g = loom.Graph()
    xb = g.placeholder("x", loom.bfloat16, [None])
    back = loom.ops.cast(xb, to=loom.float32)
    s = loom.Session(g)
    base = (rng.integers(0x3f80, 0x4700, 300).astype(np.uint32) << 16).view(np.float32)
    step = (base.view(np.uint32) + (1 << 16)).view(np.float32).astype(np.float64) - base
    cases, want = [], []
    for b, d in zip(base.astype(np.float64), step):
        even = (int(np.float32(b).view(np.uint32)) >> 16) % 2 == 0
        for f, expect in [(0.25, b), (0.75, b + d), (0.5 + 2.0**-30, b + d),
                          (0.5, b if even else b + d)]:
            cases.append(b + f * d)
            want.append(expect)
    got = np.asarray(s.run(back, {xb: cases + [1e39, -1e39]}))
    np.testing.assert_array_equal(got, np.array(want + [math.inf, -math.inf], np.float32))
    with pytest.raises(OverflowError, match=r"feed 'x': a Python int of 1101 bits "
                                            r"\(item \[0\]\) is too large for any float"):
        s.run(back, {xb: [2**1100]})


@pytest.mark.parametrize("fed, item", [
    ([[1, 2], [3]], "item [1] has 1 item where 2"),
    ([[1, 2], 3], "item [1] is a int where a list of 2"),
    ([1, [2, 3]], "item [1] is a list of 2 where a number"),
    ([[[1], [2]], [[3], [4, 5]]], "item [1][1] has 2 items where 1"),
    (([1, 2], (3, 4, 5)), "item [1] has 3 items where 2"),
])
def test_ragged_lists_are_value_errors_naming_the_item(fed, item):
    s, x, y = identity_session(loom.int32, [None] * 2)
    before = host_bytes_in_use()
    with pytest.raises(ValueError) as info:
        s.run(y, {x: fed})
    assert "feed 'x'" in str(info.value) and "ragged" in str(info.value)
    assert item in str(info.value)
    assert host_bytes_in_use() == before
    check_usable(s, x, y, [[1, 2], [3, 4]], loom.int32)


def test_a_list_that_contains_itself_is_a_value_error():
    s, x, y = identity_session(loom.float32)
    loop = []
    loop.append(loop)
    with pytest.raises(ValueError, match="feed 'x': the lists nest deeper than 64 levels"):
        s.run(y, {x: loop})
    loop = [1.0]
    loop.append(loop)   # [1.0, [1.0, [...]]]: ragged at its second item
    with pytest.raises(ValueError, match=r"feed 'x': .*ragged: item \[1\] is a list of 2"):
        s.run(y, {x: loop})


def test_lists_of_the_wrong_shape_get_the_sessions_shape_error():
    s, x, y = identity_session(loom.float32, (2, 3))
    with pytest.raises(ValueError, match=r"feed 'x' has shape \[1, 3\] but node 'x'.*\[2,3\]|"
                                         r"feed 'x' has shape \[1, 3\]"):
        s.run(y, {x: [[1, 2, 3]]})
    with pytest.raises(ValueError, match=r"feed 'x' has shape \[\]"):
        s.run(y, {x: 1.0})
    check_usable(s, x, y, [[1, 2, 3], [4, 5, 6]], loom.float32)


@pytest.mark.parametrize("value, error, words", [
    ("abc", TypeError, ["feed 'x'", "str"]),
    (b"abc", TypeError, ["feed 'x'", "bytes"]),
    (None, TypeError, ["feed 'x'", "NoneType"]),
    (object(), TypeError, ["feed 'x'", "object"]),
    ({"a": 1}, TypeError, ["feed 'x'", "dict"]),
    ([1.0, "2"], TypeError, ["feed 'x'", "item [1] is a str, not a number"]),
    ([[1.0], [None]], TypeError, ["feed 'x'", "item [1][0] is a NoneType"]),
    ([1.0, 2j], TypeError, ["feed 'x'", "2j (item [1]) is a complex number"]),
    (1j, TypeError, ["feed 'x'", "complex128"]),
])
def test_values_that_are_not_numbers_are_type_errors_naming_the_feed_and_type(value, error,
                                                                               words):
    s, x, y = identity_session(loom.float32)
    with pytest.raises(error) as info:
        s.run(y, {x: value})
    for w in words:
        assert w in str(info.value)
    assert "Unable to cast" not in str(info.value)
    check_usable(s, x, y, [1.5, 2.5], loom.float32)


def test_feed_names_and_containers_are_checked_first():
    s, x, y = identity_session(loom.float32)
    with pytest.raises(KeyError, match="feed 'nope': no node named 'nope'"):
        s.run(y, {"nope": [1.0]})
    with pytest.raises(KeyError, match="feed 'nope'"):
        s.run(y, {"nope": "not even a number"})   # the name is checked before the value
    with pytest.raises(KeyError, match=r"feed 'x:1'.*1 output"):
        s.run(y, {"x:1": [1.0]})
    with pytest.raises(ValueError, match="feed 'x:one'.*not a tensor name"):
        s.run(y, {"x:one": [1.0]})
    with pytest.raises(TypeError, match="feeds is a list; expected a dict"):
        s.run(y, [1.0])
    with pytest.raises(TypeError, match="expected a fetch .* not a int"):
        s.run(5, {x: [1.0]})
    with pytest.raises(TypeError, match="a feed key is a loom.Output or a name, not a int"):
        s.run(y, {3: [1.0]})
    check_usable(s, x, y, [1.0], loom.float32)


def test_constants_and_tensors_of_a_dtype_follow_the_same_rules():
    g = loom.Graph()
    with pytest.raises(OverflowError, match=r"constant: the Python int 300 \(item \[1\]\) "
                                            r"does not fit uint8"):
        g.constant([1, 300], dtype=loom.uint8)
    with pytest.raises(OverflowError, match="variable init.*int8"):
        g.variable("v", init=[-200], dtype=loom.int8)
    with pytest.raises(OverflowError, match=r"Tensor\(data\): the Python int -1 does not fit"):
        loom.Tensor(-1, loom.uint8)
    with pytest.raises(ValueError, match=r"Tensor\(data\).*ragged"):
        loom.Tensor([[1], [2, 3]], loom.float32)
    t = loom.Tensor([[1, 2], [3, 250]], loom.uint8)
    np.testing.assert_array_equal(np.asarray(t), np.array([[1, 2], [3, 250]], np.uint8))
    c = loom.ops.cast(g.constant([1.5, -2.5], dtype=loom.bfloat16), to=loom.float32)
    got = loom.Session(g).run(c)
    assert np.asarray(got).tolist() == [1.5, -2.5]


# ---- 3. output names -----------------------------------------------------------------------

@pytest.mark.parametrize("name, error", [
    ("x:abc", ValueError), ("x:", ValueError), ("x:-1", ValueError), ("x:1.0", ValueError),
    ("x:99999999999", ValueError), ("x: 1", ValueError), ("x:0x1", ValueError),
    ("x:1", KeyError), ("nope:0", KeyError), ("nope", KeyError),
])
def test_output_names_that_do_not_parse_are_typed_errors(name, error):
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [2])
    with pytest.raises(error) as info:
        g.output(name)
    assert name in str(info.value)
    if error is ValueError:
        assert "is not a tensor name" in str(info.value)
    assert g.output("x:0").name == x.name == g.output("x").name


def test_placeholder_shapes_are_checked():
    g = loom.Graph()
    with pytest.raises(TypeError, match="placeholder shape: dimension 1 must be an int, not a str"):
        g.placeholder("x", loom.float32, [2, "3"])
    with pytest.raises(ValueError, match=r"node .y. \(placeholder\): attribute .shape. = \[-4\]: dimension 0 is -4"):
        g.placeholder("y", loom.float32, [-4])
    with pytest.raises(OverflowError, match="placeholder shape: dimension 0"):
        g.placeholder("z", loom.float32, [2**70])


# ---- 2. DLPack and array-interface producers -----------------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]

capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype = ctypes.py_object
capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
capsule_name = ctypes.pythonapi.PyCapsule_GetName
capsule_name.restype = ctypes.c_char_p
capsule_name.argtypes = [ctypes.py_object]


class Managed:
    """A float32 [2, 3] DLManagedTensor over memory of its own (ctypes), counting deleter
    calls; `spoil` edits the struct."""

    def __init__(self, spoil=None):
        self.memory = (ctypes.c_float * 8)(*range(8))
        self.shape = (ctypes.c_int64 * 2)(2, 3)
        self.strides = (ctypes.c_int64 * 2)(3, 1)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = ctypes.addressof(self.memory)
        t.device = DLDevice(1, 0)
        t.ndim = 2
        t.dtype = DLDataType(2, 32, 1)
        t.shape = self.shape
        t.strides = self.strides
        self.deleted = 0

        def deleter(_):
            self.deleted += 1
        self.deleter = DELETER(deleter)
        self.managed.deleter = self.deleter
        if spoil is not None:
            spoil(self.managed.dl_tensor)

    def capsule(self, name=b"dltensor"):
        return capsule_new(ctypes.addressof(self.managed), name, None)


def spoil_data(t):
    t.data = None


def spoil_shape(t):
    t.shape[0] = -3


def spoil_ndim(t):
    t.ndim = 1 << 20


def spoil_complex(t):
    t.dtype = DLDataType(5, 64, 1)


def spoil_int16(t):
    t.dtype = DLDataType(0, 16, 1)


def spoil_lanes(t):
    t.dtype = DLDataType(2, 32, 4)


def spoil_bits(t):
    t.dtype = DLDataType(2, 24, 1)


def spoil_stride_overflow(t):
    t.strides[0] = 2**62


def spoil_stride_below_zero(t):
    t.strides[0] = -(2**46)   # 2**48 bytes before the data: below address 0


def spoil_offset(t):
    t.byte_offset = 2


def spoil_offset_wrap(t):
    t.byte_offset = 2**64 - 4


def spoil_device(t):
    t.device = DLDevice(77, 0)


def spoil_device_id(t):
    t.device = DLDevice(1, -2)


BAD_TENSORS = [
    (spoil_data, "null data for 6 elements"),
    (spoil_shape, "dimension 0 is -3"),
    (spoil_ndim, "ndim 1048576"),
    (spoil_complex, "complex64"),
    (spoil_int16, "int16"),
    (spoil_lanes, "lanes"),
    (spoil_bits, "float24"),
    (spoil_stride_overflow, "64"),
    (spoil_stride_below_zero, "wraps around the address space"),
    (spoil_offset, "not aligned to the 4-byte elements"),
    (spoil_offset_wrap, "wraps around the address space"),
    (spoil_device, "77 is no DLPack device type"),
    (spoil_device_id, "negative device id -2"),
]


@pytest.mark.parametrize("spoil, words", BAD_TENSORS, ids=[f.__name__ for f, _ in BAD_TENSORS])
def test_malformed_dlpack_tensors_are_buffer_errors_and_stay_the_producers(spoil, words):
    m = Managed(spoil)
    capsule = m.capsule()
    with pytest.raises(BufferError) as info:
        loom.from_dlpack(capsule)
    assert words in str(info.value) and "in the capsule" in str(info.value)
    assert capsule_name(capsule) == b"dltensor"       # not consumed
    assert m.deleted == 0                              # still the producer's

    class Producer:
        def __dlpack__(self, stream=None):
            return m.capsule()

    with pytest.raises(BufferError, match="Producer.__dlpack__"):
        loom.from_dlpack(Producer())
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [2, 3])
    s = loom.Session(g)
    with pytest.raises(BufferError, match="feed 'x': .*" + re.escape(words)):
        s.run(x, {x: Producer()})
    assert m.deleted == 0


def test_a_valid_handmade_tensor_is_taken_and_given_back_once():
    m = Managed()
    t = loom.from_dlpack(m.capsule())
    np.testing.assert_array_equal(np.asarray(t), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert m.deleted == 0
    del t
    gc.collect()
    assert m.deleted == 1


def broken(dlpack=None, device=None):
    """An object whose __dlpack__ and __dlpack_device__ are the given functions."""
    ns = {}
    if dlpack is not None:
        ns["__dlpack__"] = dlpack
    if device is not None:
        ns["__dlpack_device__"] = device
    return type("Broken", (), ns)()


def numpy_capsule(*args, **kwargs):
    return np.arange(3, dtype=np.float32).__dlpack__()


def raises(error):
    def f(*args, **kwargs):
        raise error
    return f


@pytest.mark.parametrize("obj, error, words", [
    (broken(raises(RuntimeError("boom"))), BufferError,
     "Broken.__dlpack__() raised RuntimeError: boom"),
    (broken(raises(BufferError("no export"))), BufferError, "raised BufferError: no export"),
    (broken(lambda self, **kw: 42), TypeError, "Broken.__dlpack__() returned a int, not a DLPack"),
    (broken(lambda self, **kw: capsule_new(ctypes.addressof(ctypes.c_int(1)), b"other", None)),
     BufferError, "is named 'other', not a DLPack tensor"),
    (broken(lambda self, **kw: capsule_new(ctypes.addressof(ctypes.c_int(1)), None, None)),
     BufferError, "is unnamed, not a DLPack tensor"),
    (broken(numpy_capsule, raises(RuntimeError("where?"))), BufferError,
     "Broken.__dlpack_device__() raised RuntimeError: where?"),
    (broken(numpy_capsule, lambda self: [1, 0]), TypeError,
     "returned a list, not a (device_type, device_id) tuple"),
    (broken(numpy_capsule, lambda self: (1,)), TypeError, "a tuple of 1 items"),
    (broken(numpy_capsule, lambda self: (1, 0, 0)), TypeError, "a tuple of 3 items"),
    (broken(numpy_capsule, lambda self: ("cpu", 0)), TypeError, "its device_type is a str"),
    (broken(numpy_capsule, lambda self: (1, 0.0)), TypeError, "its device_id is a float"),
    (broken(numpy_capsule, lambda self: (99, 0)), BufferError, "99 is no DLPack device type"),
    (broken(numpy_capsule, lambda self: (10, 0)), BufferError, "the tensor is on rocm"),
    (broken(numpy_capsule, lambda self: (1, -1)), BufferError, "a negative device id"),
    (broken(numpy_capsule, lambda self: (2**40, 0)), BufferError, "device_type is out of range"),
    (broken(raises(TypeError("nope"))), TypeError,
     "raised TypeError with max_version=(1, 0) (nope) and without it (nope)"),
])
def test_broken_dlpack_producers_get_typed_errors_saying_what_they_returned(obj, error, words):
    with pytest.raises(error) as info:
        loom.from_dlpack(obj)
    assert words in str(info.value)
    assert "Unable to cast" not in str(info.value)
    if "raised RuntimeError" in words:
        assert isinstance(info.value.__cause__, RuntimeError)   # the producer's, chained


def test_an_already_used_capsule_from_a_producer_is_a_buffer_error():
    capsule = np.arange(3.0).__dlpack__()
    first = loom.from_dlpack(capsule)
    producer = broken(lambda self, **kw: capsule)
    with pytest.raises(BufferError, match="already consumed.*used_dltensor"):
        loom.from_dlpack(producer)
    np.testing.assert_array_equal(np.asarray(first), [0.0, 1.0, 2.0])


def test_producers_that_take_no_keywords_work_and_stream_is_required_for_gpu_memory():
    legacy = broken(lambda self: np.arange(4, dtype=np.int32).__dlpack__())
    np.testing.assert_array_equal(np.asarray(loom.from_dlpack(legacy)), [0, 1, 2, 3])
    versioned_only = broken(lambda self, *, max_version: np.arange(2.0).__dlpack__())
    np.testing.assert_array_equal(np.asarray(loom.from_dlpack(versioned_only)), [0.0, 1.0])
    gpu_without_stream = broken(lambda self: None, lambda self: (2, 0))
    with pytest.raises(TypeError, match=r"takes stream= and max_version=, or stream= alone"):
        loom.from_dlpack(gpu_without_stream, stream=7)   # no CUDA call before __dlpack__


def test_tensor_dlpack_arguments_are_checked():
    t = loom.Tensor(np.arange(3.0))
    for kwargs, error, words in [
        (dict(max_version="1.0"), TypeError, "max_version must be a (major, minor) tuple"),
        (dict(max_version=(1,)), TypeError, "max_version must be a (major, minor) tuple"),
        (dict(max_version=(1, "0")), TypeError, "max_version must be an int, not a str"),
        (dict(dl_device=[1, 0]), TypeError, "dl_device must be a (device_type, device_id)"),
        (dict(dl_device=(1, 2**40)), OverflowError, "dl_device"),
        (dict(copy="yes"), TypeError, "copy must be None, True or False"),
        (dict(stream=2**70), OverflowError, "stream"),
    ]:
        with pytest.raises(error) as info:
            t.__dlpack__(**kwargs)
        assert words in str(info.value) and "Unable to cast" not in str(info.value)
    with pytest.raises(OverflowError, match="from_dlpack: stream"):
        loom.from_dlpack(t, stream=2**70)


class Interface:
    def __init__(self, iface, buffer=None):
        self.__array_interface__ = iface
        self.keep = buffer


BASE = np.arange(6, dtype=np.float32)


def iface(**changes):
    d = dict(shape=(6,), typestr="<f4", data=(BASE.ctypes.data, False), version=3)
    d.update(changes)
    return {k: v for k, v in d.items() if v is not ...}


@pytest.mark.parametrize("d, error, words", [
    (iface(shape=...), ValueError, "has no 'shape'"),
    (iface(typestr=...), ValueError, "has no 'typestr'"),
    (iface(version=...), ValueError, "has no 'version'"),
    (iface(version=2), ValueError, "version 2 (loom reads version 3)"),
    (iface(version="3"), TypeError, "'version' is '3', not an int"),
    (iface(typestr=4), TypeError, "'typestr' is 4, not a str"),
    (iface(typestr="zz"), TypeError, "not understood"),
    (iface(typestr="<i2"), TypeError, "int16 has no loom dtype"),
    (iface(shape=(-6,)), ValueError, "dimension 0 is -6"),
    (iface(shape="ab"), TypeError, "'shape' is 'ab', not a tuple of ints"),
    (iface(shape=(2, "3")), TypeError, "not a tuple of ints"),
    (iface(shape=(2**40, 2**40)), ValueError, "element count of 'shape' overflows"),
    (iface(strides=(4, 4)), ValueError, "2 strides for 1 dimensions"),
    (iface(data=None), ValueError, "'data' is None (the object's own buffer) but a Interface "
                                   "has no buffer, so 6 elements have no memory"),
    (iface(data=(0, False)), ValueError, "a null pointer in 'data' for 6 elements"),
    (iface(data=(-5, False)), ValueError,
     "'data' holds the Python int -5 as its pointer, which is no address"),
    (iface(data=(1.5, False)), TypeError, "with an int pointer"),
    (iface(data=(BASE.ctypes.data,)), TypeError, "a (pointer, read_only) tuple"),
    (iface(data=(BASE.ctypes.data, "no")), TypeError, "with a bool read_only"),
    (iface(mask=np.zeros(6, bool)), TypeError, "masked arrays are not supported"),
    ([("shape", (6,))], TypeError, "is a list, not a dict"),
])
def test_malformed_array_interfaces_get_typed_errors(d, error, words):
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [6])
    s = loom.Session(g)
    for call, prefix in [(lambda o: loom.as_tensor(o), "as_tensor: "),
                         (lambda o: s.run(x, {x: o}), "feed 'x': ")]:
        with pytest.raises(error) as info:
            call(Interface(d))
        assert words in str(info.value) and str(info.value).startswith(prefix)
        assert "Unable to cast" not in str(info.value)
    np.testing.assert_array_equal(np.asarray(s.run(x, {x: Interface(iface())})), BASE)
    assert session_bytes_in_use(s) == 0


def test_array_interface_over_a_buffer_is_still_read_by_numpy():
    data = bytearray(np.arange(4, dtype=np.int32).tobytes())
    obj = Interface(dict(shape=(4,), typestr="<i4", data=data, version=3), data)
    np.testing.assert_array_equal(np.asarray(loom.as_tensor(obj)), [0, 1, 2, 3])


class CudaInterface:
    def __init__(self, **fields):
        d = dict(shape=(2, 3), typestr="<f4", data=(0x7F3A00000000, False), version=3)
        d.update(fields)
        self.__cuda_array_interface__ = d


@pytest.mark.parametrize("fields, error, words", [
    (dict(version="3"), TypeError, "'version' is '3', not an int"),
    (dict(shape=("a", 3)), TypeError, "not a tuple of ints"),
    (dict(shape=None), TypeError, "'shape' is None"),
    (dict(data=(1.5, False)), TypeError, "with an int pointer"),
    (dict(data=(2**70, False)), ValueError, "is no address"),
    (dict(data=[0x7F3A00000000, False]), TypeError, "a (pointer, read_only) tuple"),
    (dict(strides=(12, "4")), TypeError, "not a tuple of ints"),
    (dict(stream="s"), TypeError, "'stream' is 's', not an int"),
    (dict(typestr=None), TypeError, "'typestr' is None, not a str"),
    (dict(data=(0x7F3A00000001, False)), ValueError, "not aligned to the 4-byte elements"),
    (dict(strides=(-2**62, 4)), ValueError, "wraps around the address space"),
])
def test_malformed_cuda_array_interfaces_are_checked_before_any_cuda_call(fields, error, words):
    with pytest.raises(error) as info:
        loom.from_cuda_array_interface(CudaInterface(**fields))
    assert words in str(info.value) and "Unable to cast" not in str(info.value)


# ---- 7. checkpoints and memory budgets -----------------------------------------------------

def variable_session():
    g = loom.Graph()
    w = g.variable("w", init=np.arange(4, dtype=np.float32))
    x = g.placeholder("x", loom.float32, [4])
    y = x * w
    s = loom.Session(g)
    s.run(y, {x: np.zeros(4, np.float32)})
    held = session_bytes_in_use(s)   # the variable's block, nothing else
    assert held > 0
    return s, x, y, held


def check_session(s, x, y, held):
    got = np.asarray(s.run(y, {x: np.full(4, 2, np.float32)}))
    np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32) * 2)
    del got
    assert session_bytes_in_use(s) == held


def test_checkpoint_paths_get_os_errors_naming_the_path(tmp_path):
    s, x, y, held = variable_session()
    check_session(s, x, y, held)
    cases = [
        (lambda: s.save(str(tmp_path)), IsADirectoryError, str(tmp_path)),
        (lambda: s.save(tmp_path / "no" / "dir" / "c.safetensors"), FileNotFoundError,
         str(tmp_path / "no" / "dir")),
        (lambda: s.restore(str(tmp_path)), IsADirectoryError, str(tmp_path)),
        (lambda: s.restore(tmp_path / "missing.safetensors"), FileNotFoundError,
         "missing.safetensors"),
        (lambda: s.restore(""), FileNotFoundError, "does not exist"),
        (lambda: s.save(None), TypeError, "save: the path must be a str or an os.PathLike"),
        (lambda: s.restore(3), TypeError, "restore: the path must be a str or an os.PathLike"),
        (lambda: s.save(str(tmp_path / "c"), {"step": 1}), TypeError,
         "metadata must map str to str; it maps 'step' to a int"),
        (lambda: s.save(str(tmp_path / "c"), ["step"]), TypeError, "metadata must be a dict"),
    ]
    for call, error, words in cases:
        with pytest.raises(error) as info:
            call()
        assert words in str(info.value)
        check_session(s, x, y, held)
    # Files that are no checkpoint: ValueError naming the file (the parser's own message).
    for name, content in [("short", b"\x00" * 3), ("huge_header", b"\xff" * 16)]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match=name):
            s.restore(tmp_path / name)
        check_session(s, x, y, held)
    # pathlib paths work both ways.
    s.save(tmp_path / "ok.safetensors", {"step": "3"})
    assert s.restore(tmp_path / "ok.safetensors") == {"step": "3"}
    check_session(s, x, y, held)


def test_memory_budgets_are_checked_by_name():
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [4])
    y = loom.ops.exp(x)
    for limit, error, words in [(-1, ValueError, "memory_limit is -1"),
                                ("1GB", TypeError, "memory_limit must be an int"),
                                (True, TypeError, "memory_limit must be an int"),
                                (2**64, OverflowError, "memory_limit is 18446744073709551616")]:
        with pytest.raises(error, match=words):
            loom.Session(g, memory_limit=limit)
    # A budget too small for the run: MemoryError, and the session stays usable for runs
    # that fit, holding nothing afterwards.
    small = loom.Session(g, memory_limit=4096)
    big = loom.Graph()
    bx = big.placeholder("x", loom.float32, [1 << 16])
    by = bx * 2.0
    starved = loom.Session(big, memory_limit=4096)
    with pytest.raises(MemoryError, match="max_size"):
        starved.run(by, {bx: np.ones(1 << 16, np.float32)})
    assert session_bytes_in_use(starved) == 0
    np.testing.assert_allclose(np.asarray(small.run(y, {x: [0.0, 1.0, 2.0, 3.0]})),
                               np.exp(np.arange(4.0)), rtol=1e-6)
    assert session_bytes_in_use(small) == 0
    for limit in (None, 0):   # no limit
        assert np.asarray(loom.Session(g, memory_limit=limit).run(y, {x: [0.0] * 4})).sum() == 4


def test_host_pool_and_c_abi_sizes_are_checked_by_name():
    before = host_bytes_in_use()
    for kwargs, error, words in [
        (dict(max_size=0), ValueError, "max_size is 0"),
        (dict(max_size=-1), ValueError, "max_size is -1"),
        (dict(initial_size=-1), ValueError, "initial_size is -1"),
        (dict(growth_step="64M"), TypeError, "growth_step must be an int"),
        (dict(granularity=2.5), TypeError, "granularity must be an int"),
    ]:
        with pytest.raises(error, match=words):
            loom.memory.configure_host_pool(**kwargs)
    for call, error, words in [
        (lambda: loom.memory.allocate(-5), ValueError, "allocate: nbytes is -5"),
        (lambda: loom.memory.allocate(8, alignment=-64), ValueError, "allocate: alignment is -64"),
        (lambda: loom.memory.allocate("8"), TypeError, "allocate: nbytes must be an int"),
        (lambda: loom.memory.deallocate(0, -1), ValueError, "deallocate: nbytes is -1"),
    ]:
        with pytest.raises(error, match=words):
            call()
    p = loom.memory.allocate(64)
    loom.memory.deallocate(p, 64)
    assert host_bytes_in_use() == before


# ---- 6. many threads -----------------------------------------------------------------------

def dense_session(rng):
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [None, 16])
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    y = loom.ops.relu(x @ g.constant(w) + g.constant(b))
    return loom.Session(g, threads=2), x, y, w, b


def run_threads(target, n):
    errors = []
    barrier = threading.Barrier(n)

    def wrapped(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as e:   # noqa: B902 - reported below
            errors.append((i, e))
    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_one_session_from_eight_threads_with_different_feeds(rng):
    s, x, y, w, b = dense_session(rng)
    feeds = [rng.standard_normal((int(rng.integers(1, 40)), 16)).astype(np.float32)
             for _ in range(8 * 6)]

    def work(i):
        for k in range(6):
            v = feeds[i * 6 + k]
            fed = v if k % 2 == 0 else v.tolist()   # arrays and lists both
            got = np.asarray(s.run(y, {x: fed}))
            want = np.maximum(v.astype(np.float64) @ w + b, 0)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert run_threads(work, 8) == []
    assert session_bytes_in_use(s) == 0


def test_a_failing_run_in_one_thread_leaves_the_others_alone(rng):
    s, x, y, w, b = dense_session(rng)
    v = rng.standard_normal((5, 16)).astype(np.float32)
    want = np.maximum(v.astype(np.float64) @ w + b, 0)
    failures = []

    def work(i):
        for k in range(8):
            if i % 4 == 0:
                bad = [np.zeros((5, 15), np.float32), [[1.0] * 16, [2.0]], "nope",
                       [[2**2000] * 16]][k % 4]
                with pytest.raises((ValueError, TypeError, OverflowError)) as info:
                    s.run(y, {x: bad})
                assert "feed 'x'" in str(info.value)
                failures.append(type(info.value))
            else:
                np.testing.assert_allclose(np.asarray(s.run(y, {x: v})), want, rtol=1e-5,
                                           atol=1e-5)
    assert run_threads(work, 8) == []
    assert len(failures) == 16
    np.testing.assert_allclose(np.asarray(s.run(y, {x: v})), want, rtol=1e-5, atol=1e-5)
    assert session_bytes_in_use(s) == 0


# ---- 4 and 5. interpreter exit and signals (subprocesses) ----------------------------------

ENV = dict(os.environ)
ENV["PYTHONPATH"] = os.pathsep.join(
    [str(pathlib.Path(loom.__file__).resolve().parent.parent)] +
    ([ENV["PYTHONPATH"]] if ENV.get("PYTHONPATH") else []))

PRELUDE = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np
    import loom
    N = int(os.environ.get("N", "256"))
    STEPS = int(os.environ.get("STEPS", "100"))
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [N, N])
    h = x
    for _ in range(STEPS):
        h = loom.ops.tanh(h @ x)
    s = loom.Session(g, threads=2)
    xv = np.full((N, N), 1.0 / N, np.float32)

    def wait_for_a_run():
        while loom._loom._runs_in_flight() == 0:
            time.sleep(0.0005)
""")

CRASH_WORDS = ["Segmentation fault", "terminate called", "Fatal Python error", "Aborted",
               "core dumped", "Traceback"]


def run_script(tmp_path, body, *args, env=None):
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    e = dict(ENV)
    e.update(env or {})
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, env=e, timeout=300)


def reference_chain(n=256, steps=100):
    # x is 1/n everywhere, so every element of h @ x is the element of h: h = tanh(h).
    v = np.float32(1.0 / n)
    for _ in range(steps):
        v = np.tanh(v)
    return v


DAEMON_EXIT = """
    mode, delay = sys.argv[1], float(sys.argv[2])

    def work():
        while True:
            try:
                out = s.run(h, {x: xv})
                if mode == "hold":
                    kept.append(np.asarray(out))   # results alive at exit
            except loom.CancelledError:
                pass

    kept = []
    for _ in range(3):
        threading.Thread(target=work, daemon=True).start()
    wait_for_a_run()
    time.sleep(delay)
    print("main exits", flush=True)
    if mode == "exit":
        sys.exit(0)
"""


def test_exiting_with_daemon_threads_inside_runs_is_clean(tmp_path):
    # Runs in flight at exit, with results held or not, the main thread ending or calling
    # sys.exit, 24 times at different moments.
    delays = [0, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.012, 0.015,
              0.02, 0.025, 0.03, 0.04, 0.05, 0.07, 0.1, 0.0, 0.0015, 0.007, 0.035, 0.06]
    for i, delay in enumerate(delays):
        mode = ["loop", "hold", "exit"][i % 3]
        r = run_script(tmp_path, DAEMON_EXIT, mode, delay, env={"N": "128", "STEPS": "60"})
        assert r.returncode == 0, (mode, delay, r.returncode, r.stderr[-2000:])
        assert r.stdout.strip() == "main exits"
        for word in CRASH_WORDS:
            assert word not in r.stderr, (mode, delay, r.stderr[-2000:])


NON_DAEMON_EXIT = """
    def work():
        out = s.run(h, {x: xv})
        print("run finished", float(np.asarray(out)[0, 0]), flush=True)

    t = threading.Thread(target=work)   # not a daemon: Python waits for it
    t.start()
    wait_for_a_run()
    sys.exit(3)
"""


def test_sys_exit_waits_for_runs_on_non_daemon_threads(tmp_path):
    r = run_script(tmp_path, NON_DAEMON_EXIT)
    assert r.returncode == 3, r.stderr[-2000:]
    for word in CRASH_WORDS:
        assert word not in r.stderr
    line = r.stdout.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("run finished")
    assert float(line[0].split()[2]) == pytest.approx(float(reference_chain()), rel=1e-3)


SIGINT_SCRIPT = """
    mode = sys.argv[1]
    handled = []
    if mode == "ignore":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif mode == "handler":
        signal.signal(signal.SIGINT, lambda *a: handled.append(loom._loom._runs_in_flight()))
    sent = []

    def sender():
        wait_for_a_run()
        os.kill(os.getpid(), signal.SIGINT)
        sent.append(loom._loom._runs_in_flight())   # still running after the signal went

    threading.Thread(target=sender).start()
    try:
        out = s.run(h, {x: xv})
        print("completed", float(np.asarray(out)[0, 0]))
    except KeyboardInterrupt:
        print("interrupted")
    for _ in range(3):
        time.sleep(0.01)   # Python runs a pending handler here at the latest
    print("sent during the run", sent[0] >= 1)
    print("handler calls", handled)
    print("usable", float(np.asarray(s.run(x, {x: xv})).sum()))
"""


@pytest.mark.parametrize("mode", ["default", "ignore", "handler"])
def test_sigint_follows_the_programs_own_setting(tmp_path, mode):
    r = run_script(tmp_path, SIGINT_SCRIPT, mode)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[1] == "sent during the run True", r.stdout
    assert lines[3] == f"usable {float(256 * 256 / 256):.1f}"
    if mode == "default":
        # Python's default handler: loom cancels the run and raises KeyboardInterrupt.
        assert lines[0] == "interrupted"
        assert lines[2] == "handler calls []"
    else:
        # Ignored: the signal does nothing. The program's handler: the run is not cancelled,
        # and Python calls the handler once, after the run returned (nothing in flight then).
        assert lines[0].startswith("completed")
        assert float(lines[0].split()[1]) == pytest.approx(float(reference_chain()), rel=1e-3)
        assert lines[2] == ("handler calls []" if mode == "ignore" else "handler calls [0]")
