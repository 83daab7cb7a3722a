"""The Arrow PyCapsule protocol on loom.Table and loom.Tensor, checked from the consumer's
side through ctypes declarations of the C Data Interface written here (the specification's
C structs): formats, lengths, buffers (zero copy: the columns' own addresses), values read
back through ctypes against NumPy; import of arrays built here by hand, with release
callbacks that count their calls; capsule lifetimes; and every bad input."""
import ctypes
import gc
import weakref

import numpy as np
import pytest
import torch

import loom

# ---- the C Data Interface, as the specification declares it --------------------------------


class ArrowSchema(ctypes.Structure):
    pass


ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p),
    ("name", ctypes.c_char_p),
    ("metadata", ctypes.c_char_p),
    ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)),
    ("release", ctypes.c_void_p),  # void (*)(struct ArrowSchema*)
    ("private_data", ctypes.c_void_p),
]


class ArrowArray(ctypes.Structure):
    pass


ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", ctypes.c_void_p),  # void (*)(struct ArrowArray*)
    ("private_data", ctypes.c_void_p),
]

SCHEMA_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowSchema))
ARRAY_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArray))

SCHEMA_NAME = b"arrow_schema"
ARRAY_NAME = b"arrow_array"

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_pointer.restype = ctypes.c_void_p
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object


def schema_of(capsule):
    return ArrowSchema.from_address(_get_pointer(capsule, SCHEMA_NAME))


def array_of(capsule):
    return ArrowArray.from_address(_get_pointer(capsule, ARRAY_NAME))


def call_release(struct):
    """Calls a struct's release callback, as a consumer does."""
    kind = SCHEMA_RELEASE if isinstance(struct, ArrowSchema) else ARRAY_RELEASE
    kind(struct.release)(ctypes.pointer(struct))


# NumPy dtype -> (Arrow format, loom dtype name): the specification's format strings.
FORMATS = {
    np.int8: ("c", "int8"),
    np.uint8: ("C", "uint8"),
    np.int32: ("i", "int32"),
    np.int64: ("l", "int64"),
    np.float16: ("e", "float16"),
    np.float32: ("f", "float32"),
    np.float64: ("g", "float64"),
    np.bool_: ("b", "bool"),
}


def random_column(rng, n, dt):
    if dt == np.bool_:
        return rng.integers(0, 2, size=n).astype(np.bool_)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=n).astype(dt)
    return rng.standard_normal(n).astype(dt)


def read_values(array, dt, n):
    """The n values of a primitive ArrowArray (no nulls), read through ctypes."""
    dt = np.dtype(dt)
    data = array.buffers[1]
    if dt == np.bool_:
        raw = np.frombuffer(ctypes.string_at(data, (array.offset + n + 7) // 8), np.uint8)
        return np.unpackbits(raw, bitorder="little")[array.offset:array.offset + n].astype(bool)
    raw = ctypes.string_at(data + array.offset * dt.itemsize, n * dt.itemsize)
    return np.frombuffer(raw, dt)


# ---- a producer written here: hand-made structs with counting release callbacks ------------


class Producer:
    """An Arrow producer built with ctypes: a struct array of primitive children (or one
    primitive array), buffers owned by NumPy arrays held here, release callbacks that count
    their calls and set release to NULL, as the specification asks."""

    def __init__(self, columns, *, struct=True, length=None, offset=0, struct_null_count=0):
        # columns: list of dicts: name, format, data (ndarray), and optional null_count,
        # validity (ndarray of uint8 bits), offset, n_buffers, dictionary (bool)
        self.calls = {"schema": 0, "array": 0, "child_schema": 0, "child_array": 0}
        self.keep = []
        self.data = []  # the children's data buffers, in order
        self._schema_cb = SCHEMA_RELEASE(self._release_schema)
        self._array_cb = ARRAY_RELEASE(self._release_array)
        self._child_schema_cb = SCHEMA_RELEASE(self._release_child_schema)
        self._child_array_cb = ARRAY_RELEASE(self._release_child_array)
        self.child_schemas = [self._make_child_schema(c) for c in columns]
        self.child_arrays = [self._make_child_array(c) for c in columns]
        if not struct:
            (self.schema,), (self.array,) = self.child_schemas, self.child_arrays
            self.schema.release = self._addr(self._schema_cb)
            self.array.release = self._addr(self._array_cb)
            return
        n = len(columns)
        self.schema = ArrowSchema()
        self.schema.format = self._bytes("+s")
        self.schema.name = self._bytes("")
        self.schema.n_children = n
        sp = (ctypes.POINTER(ArrowSchema) * n)(*[ctypes.pointer(s) for s in self.child_schemas])
        self.keep.append(sp)
        self.schema.children = sp
        self.schema.release = self._addr(self._schema_cb)
        self.array = ArrowArray()
        if length is None:
            length = len(columns[0]["data"]) if columns else 0
        self.array.length = length
        self.array.null_count = struct_null_count
        self.array.offset = offset
        self.array.n_buffers = 1
        self.array.n_children = n
        bufs = (ctypes.c_void_p * 1)(None)
        self.keep.append(bufs)
        self.array.buffers = bufs
        ap = (ctypes.POINTER(ArrowArray) * n)(*[ctypes.pointer(a) for a in self.child_arrays])
        self.keep.append(ap)
        self.array.children = ap
        self.array.release = self._addr(self._array_cb)

    def _bytes(self, s):
        b = ctypes.create_string_buffer(s.encode())
        self.keep.append(b)
        return ctypes.cast(b, ctypes.c_char_p)

    @staticmethod
    def _addr(cb):
        return ctypes.cast(cb, ctypes.c_void_p).value

    def _make_child_schema(self, c):
        s = ArrowSchema()
        s.format = self._bytes(c["format"])
        s.name = self._bytes(c["name"])
        s.flags = 2 if "validity" in c else 0
        if c.get("dictionary"):
            d = ArrowSchema()
            d.format = self._bytes("u")
            d.release = self._addr(self._child_schema_cb)
            self.keep.append(d)
            s.dictionary = ctypes.pointer(d)
        s.release = self._addr(self._child_schema_cb)
        return s

    def _make_child_array(self, c):
        data = np.ascontiguousarray(c["data"])
        self.data.append(data)
        a = ArrowArray()
        a.length = c.get("length", len(data))
        a.null_count = c.get("null_count", 0)
        a.offset = c.get("offset", 0)
        a.n_buffers = c.get("n_buffers", 2)
        validity = c.get("validity")
        if validity is not None:
            validity = np.ascontiguousarray(validity, np.uint8)
            self.keep.append(validity)
        bufs = (ctypes.c_void_p * 2)(
            None if validity is None else validity.ctypes.data, data.ctypes.data)
        self.keep.append(bufs)
        a.buffers = bufs
        a.release = self._addr(self._child_array_cb)
        return a

    # Releases: count, release the children still held (not moved out), set release to NULL.
    def _release_schema(self, p):
        self.calls["schema"] += 1
        s = p.contents
        for i in range(s.n_children):
            if s.children[i].contents.release:
                self._release_child_schema(s.children[i])
        s.release = None

    def _release_array(self, p):
        self.calls["array"] += 1
        a = p.contents
        for i in range(a.n_children):
            if a.children[i].contents.release:
                self._release_child_array(a.children[i])
        a.release = None

    def _release_child_schema(self, p):
        self.calls["child_schema"] += 1
        p.contents.release = None

    def _release_child_array(self, p):
        self.calls["child_array"] += 1
        p.contents.release = None

    def capsules(self):
        """(schema, array) capsules pointing at the structs here, without destructors: the
        structs are this object's, and the tests check release by hand."""
        return (_capsule_new(ctypes.addressof(self.schema), SCHEMA_NAME, None),
                _capsule_new(ctypes.addressof(self.array), ARRAY_NAME, None))

    def release_all(self):
        """What a capsule destructor does to structs nobody consumed."""
        if self.schema.release:
            call_release(self.schema)
        if self.array.release:
            call_release(self.array)


class ThirdPartyTable:
    """An object that speaks only the PyCapsule protocol."""

    def __init__(self, producer):
        self.producer = producer

    def __arrow_c_array__(self, requested_schema=None):
        return self.producer.capsules()


def column(name, data, **kw):
    return dict(name=name, format=FORMATS[np.dtype(data.dtype).type][0], data=data, **kw)


# ---- export ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_table_export_is_zero_copy_and_reads_back_through_ctypes(rng, n):
    arrays = {f"c_{dt.__name__}": random_column(rng, n, dt) for dt in FORMATS}
    t = loom.Table(arrays)
    assert t.num_rows == n and len(t) == n and t.names == list(arrays)
    schema_capsule, array_capsule = t.__arrow_c_array__()
    schema, array = schema_of(schema_capsule), array_of(array_capsule)
    assert schema.format == b"+s" and schema.n_children == len(arrays)
    assert schema.release and array.release
    assert array.length == n and array.null_count == 0 and array.offset == 0
    assert array.n_buffers == 1 and array.n_children == len(arrays)
    assert array.buffers[0] is None  # no validity bitmap: no nulls
    for i, (name, a) in enumerate(arrays.items()):
        cs, ca = schema.children[i].contents, array.children[i].contents
        assert cs.name.decode() == name
        assert cs.format.decode() == FORMATS[a.dtype.type][0]
        assert cs.n_children == 0 and not cs.dictionary
        assert ca.length == n and ca.null_count == 0 and ca.offset == 0
        assert ca.n_buffers == 2 and ca.n_children == 0
        assert ca.buffers[0] is None
        assert ca.buffers[1]  # never NULL, even when empty
        if a.dtype != np.bool_ and n > 0:
            # zero copy: the column's own memory, which is the NumPy array's
            assert ca.buffers[1] == t[name].data_ptr == a.ctypes.data
        np.testing.assert_array_equal(read_values(ca, a.dtype, n), a)
    del schema, array, schema_capsule, array_capsule


@pytest.mark.parametrize("dt", list(FORMATS))
def test_tensor_export_reads_back_through_ctypes(rng, dt):
    a = random_column(rng, 100, dt)
    t = loom.from_numpy(a)
    for schema_capsule in (t.__arrow_c_schema__(), t.__arrow_c_array__()[0]):
        s = schema_of(schema_capsule)
        assert s.format.decode() == FORMATS[dt][0] and s.n_children == 0
    schema_capsule, array_capsule = t.__arrow_c_array__()
    arr = array_of(array_capsule)
    assert arr.length == 100 and arr.null_count == 0 and arr.n_buffers == 2
    if dt != np.bool_:
        assert arr.buffers[1] == a.ctypes.data
    np.testing.assert_array_equal(read_values(arr, dt, 100), a)


def test_strided_tensor_exports_a_dense_copy(rng):
    a = rng.standard_normal(20)
    t = loom.from_numpy(a[::3])
    arr = array_of(t.__arrow_c_array__()[1])
    assert arr.buffers[1] != a.ctypes.data
    np.testing.assert_array_equal(read_values(arr, np.float64, 7), a[::3])


def test_table_schema_capsule(rng):
    t = loom.Table({"x": np.arange(4, dtype=np.float32), "flag": np.array([1, 0, 1, 1], bool)})
    capsule = t.__arrow_c_schema__()
    s = schema_of(capsule)
    assert s.format == b"+s" and s.n_children == 2
    assert [s.children[i].contents.name for i in range(2)] == [b"x", b"flag"]
    assert [s.children[i].contents.format for i in range(2)] == [b"f", b"b"]


def test_requested_schema_is_ignored():
    t = loom.Table({"x": np.arange(3, dtype=np.int32)})
    other = loom.Table({"y": np.arange(3.0)}).__arrow_c_schema__()
    s, a = t.__arrow_c_array__(requested_schema=other)
    assert schema_of(s).children[0].contents.format == b"i"
    np.testing.assert_array_equal(np.asarray(loom.Table.from_arrow((s, a))["x"]), [0, 1, 2])
    s, a = loom.Tensor(np.arange(3.0)).__arrow_c_array__(other)
    assert schema_of(s).format == b"g"


# ---- lifetimes of exports -------------------------------------------------------------------


def test_unconsumed_capsules_release_the_export():
    a = np.arange(1000, dtype=np.float32)
    alive = weakref.ref(a)
    t = loom.Table({"a": a})
    capsules = t.__arrow_c_array__()
    schema_only = t.__arrow_c_schema__()
    del a, t
    gc.collect()
    assert alive() is not None  # the exported array holds the memory
    arr = array_of(capsules[1])
    np.testing.assert_array_equal(read_values(arr.children[0].contents, np.float32, 1000),
                                  np.arange(1000, dtype=np.float32))
    del arr, schema_only
    del capsules  # the destructors call release
    gc.collect()
    assert alive() is None


def test_tensor_capsules_release_the_export():
    a = np.arange(10, dtype=np.int64)
    alive = weakref.ref(a)
    capsules = loom.from_numpy(a).__arrow_c_array__()
    del a
    gc.collect()
    assert alive() is not None
    del capsules
    gc.collect()
    assert alive() is None


def test_consumer_that_moves_a_child_out_keeps_it_after_the_capsules_go():
    a = np.arange(5, dtype=np.int32)
    b = np.arange(5, dtype=np.float64)
    alive_a, alive_b = weakref.ref(a), weakref.ref(b)
    capsules = loom.Table({"a": a, "b": b}).__arrow_c_array__()
    del a, b
    parent = array_of(capsules[1])
    moved = ArrowArray.from_buffer_copy(parent.children[0].contents)  # move child 0 out
    parent.children[0].contents.release = None
    del parent
    del capsules  # releases the parent and child 1, not the moved child
    gc.collect()
    assert alive_b() is None and alive_a() is not None
    np.testing.assert_array_equal(read_values(moved, np.int32, 5), np.arange(5))
    call_release(moved)
    assert not moved.release
    gc.collect()
    assert alive_a() is None


def test_consumer_that_moves_the_whole_array_out():
    a = np.arange(3, dtype=np.float32)
    alive = weakref.ref(a)
    s, c = loom.from_numpy(a).__arrow_c_array__()
    del a
    original = array_of(c)
    moved = ArrowArray.from_buffer_copy(original)
    original.release = None
    del original, s, c  # the capsule frees the struct only
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(read_values(moved, np.float32, 3), [0, 1, 2])
    call_release(moved)
    gc.collect()
    assert alive() is None


# ---- import ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", list(FORMATS))
def test_round_trip_table_capsules_table(rng, dt):
    a = random_column(rng, 257, dt)
    t = loom.Table({"v": a, "i": np.arange(257, dtype=np.int64)})
    u = loom.Table.from_arrow(t)  # through __arrow_c_array__
    assert u.names == ["v", "i"] and u.num_rows == 257
    assert u["v"].dtype.name == FORMATS[dt][1]
    np.testing.assert_array_equal(np.asarray(u["v"]), a)
    np.testing.assert_array_equal(np.asarray(u["i"]), np.arange(257))
    assert u["i"].data_ptr == t["i"].data_ptr
    if dt != np.bool_:
        assert u["v"].data_ptr == t["v"].data_ptr == a.ctypes.data
    # and from explicit capsules
    w = loom.Table.from_arrow(t.__arrow_c_array__())
    assert w["i"].data_ptr == t["i"].data_ptr


@pytest.mark.parametrize("dt", list(FORMATS))
def test_round_trip_tensor(rng, dt):
    a = random_column(rng, 33, dt)
    t = loom.from_numpy(a)
    u = loom.from_arrow(t)
    assert u.shape == (33,) and u.dtype == t.dtype
    np.testing.assert_array_equal(np.asarray(u), a)
    if dt != np.bool_:
        assert u.data_ptr == a.ctypes.data
    v = loom.from_arrow(t.__arrow_c_array__())
    np.testing.assert_array_equal(np.asarray(v), a)


def test_imported_memory_outlives_the_exporting_table():
    a = np.arange(6, dtype=np.float32)
    alive = weakref.ref(a)
    u = loom.Table.from_arrow(loom.Table({"a": a}))
    del a
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(np.asarray(u["a"]), np.arange(6))
    del u
    gc.collect()
    assert alive() is None


def test_import_of_hand_made_arrays_shares_their_buffers_and_releases_once():
    x = np.arange(10, dtype=np.float32) * 0.5
    k = np.arange(10, dtype=np.int64) - 3
    p = Producer([column("x", x), column("k", k)])
    t = loom.Table.from_arrow(ThirdPartyTable(p))
    assert t.names == ["x", "k"]
    assert p.calls["schema"] == 1 and p.calls["child_schema"] == 2  # the schema, at once
    assert p.calls["array"] == 0 and not p.array.release  # moved into loom
    assert t["x"].data_ptr == p.data[0].ctypes.data
    assert t["k"].data_ptr == p.data[1].ctypes.data
    np.testing.assert_array_equal(np.asarray(t["x"]), x)
    np.testing.assert_array_equal(np.asarray(t["k"]), k)
    col = t["k"]
    del t
    gc.collect()
    assert p.calls["array"] == 0  # a column still shares the memory
    del col
    gc.collect()
    assert p.calls["array"] == 1 and p.calls["child_array"] == 2


def test_import_zero_copy_addresses_and_offsets():
    x = np.arange(10, dtype=np.float64)
    y = np.arange(12, dtype=np.int32)
    p = Producer([column("x", x), column("y", y, offset=2)], length=5, offset=3)
    xs, ys = p.data
    t = loom.Table.from_arrow(p.capsules())
    assert t.num_rows == 5
    # struct offset 3 applies to every child; child y has its own offset 2 as well
    assert t["x"].data_ptr == xs.ctypes.data + 3 * 8
    assert t["y"].data_ptr == ys.ctypes.data + 5 * 4
    np.testing.assert_array_equal(np.asarray(t["x"]), x[3:8])
    np.testing.assert_array_equal(np.asarray(t["y"]), y[5:10])
    del t
    gc.collect()
    assert p.calls["array"] == 1


def test_import_of_copied_columns_releases_at_once():
    flags = np.packbits(np.array([1, 0, 1, 1, 0], bool), bitorder="little")
    p = Producer([dict(name="f", format="b", data=flags, length=5)], length=5)
    t = loom.Table.from_arrow(p.capsules())
    assert p.calls["array"] == 1  # bool is unpacked into a copy: nothing left to share
    np.testing.assert_array_equal(np.asarray(t["f"]), [True, False, True, True, False])


def test_import_of_a_single_hand_made_array():
    v = np.arange(7, dtype=np.int8)
    p = Producer([column("", v, offset=1, length=4)], struct=False)
    t = loom.from_arrow(p.capsules())
    assert p.calls["schema"] == 1 and p.calls["array"] == 0
    np.testing.assert_array_equal(np.asarray(t), [1, 2, 3, 4])
    del t
    gc.collect()
    assert p.calls["array"] == 1


def test_all_valid_bitmap_with_unknown_null_count_imports():
    x = np.arange(9, dtype=np.float32)
    p = Producer([column("x", x, null_count=-1, validity=[0xFF, 0x01])])
    t = loom.Table.from_arrow(p.capsules())
    np.testing.assert_array_equal(np.asarray(t["x"]), x)


def test_empty_table_and_columns():
    t = loom.Table({})
    assert t.num_rows == 0 and t.num_columns == 0 and t.names == []
    u = loom.Table.from_arrow(t)
    assert u.num_columns == 0
    e = loom.Table({"a": np.zeros(0, np.float32)})
    u = loom.Table.from_arrow(e)
    assert u.num_rows == 0 and u["a"].shape == (0,)


# ---- bad input ------------------------------------------------------------------------------


def expect_untouched(p):
    """A failed import left both structs to their owner: nothing released yet."""
    assert p.calls == {"schema": 0, "array": 0, "child_schema": 0, "child_array": 0}
    assert p.schema.release and p.array.release
    p.release_all()
    assert p.calls["schema"] == 1 and p.calls["array"] == 1


@pytest.mark.parametrize("null_count", [1, -1])
def test_nulls_are_a_value_error_naming_the_column(null_count):
    x = np.arange(10, dtype=np.float32)
    validity = np.packbits(np.arange(10) != 6, bitorder="little")  # value 6 is null
    p = Producer([column("ok", x), column("speed", x, null_count=null_count,
                                          validity=validity)])
    with pytest.raises(ValueError, match=r"column 'speed'.*null"):
        loom.Table.from_arrow(p.capsules())
    expect_untouched(p)


def test_nulls_in_a_single_array_and_in_the_struct():
    validity = np.packbits(np.ones(4, bool), bitorder="little")
    p = Producer([column("", np.arange(4, dtype=np.int32), null_count=2, validity=validity)],
                 struct=False)
    with pytest.raises(ValueError, match="null"):
        loom.from_arrow(p.capsules())
    expect_untouched(p)
    p = Producer([column("a", np.arange(4, dtype=np.int32))], struct_null_count=1)
    with pytest.raises(ValueError, match="null"):
        loom.Table.from_arrow(p.capsules())
    expect_untouched(p)


@pytest.mark.parametrize("fmt, what", [("u", "utf8"), ("s", "int16"), ("L", "uint64"),
                                       ("tsu:", "timestamp"), ("+l", "list")])
def test_unsupported_formats_are_a_type_error(fmt, what):
    x = np.zeros(16, dtype=np.int64)
    p = Producer([column("good", x), dict(name="bad", format=fmt, data=x)])
    with pytest.raises(TypeError, match=rf"column 'bad'.*'{fmt}'"):
        loom.Table.from_arrow(p.capsules())
    expect_untouched(p)
    p = Producer([dict(name="", format=fmt, data=x)], struct=False)
    with pytest.raises(TypeError, match=f"'{fmt}'"):
        loom.from_arrow(p.capsules())
    expect_untouched(p)


def test_dictionary_encoded_is_a_type_error():
    p = Producer([dict(name="d", format="i", data=np.zeros(3, np.int32), dictionary=True)])
    with pytest.raises(TypeError, match="dictionary"):
        loom.Table.from_arrow(p.capsules())
    expect_untouched(p)


def test_struct_and_primitive_in_the_wrong_function():
    t = loom.Table({"a": np.arange(3.0)})
    s, a = t.__arrow_c_array__()
    with pytest.raises(TypeError, match=r"'\+s'.*Table.from_arrow"):
        loom.from_arrow((s, a))
    # the failure left the capsules whole: they still import
    u = loom.Table.from_arrow((s, a))
    np.testing.assert_array_equal(np.asarray(u["a"]), [0, 1, 2])
    with pytest.raises(TypeError, match="struct array"):
        loom.Table.from_arrow(loom.Tensor(np.arange(3.0)))


def test_consumed_capsules_cannot_be_imported_again():
    t = loom.Table({"a": np.arange(3.0)})
    capsules = t.__arrow_c_array__()
    loom.Table.from_arrow(capsules)
    with pytest.raises(BufferError, match="already consumed"):
        loom.Table.from_arrow(capsules)
    capsules = loom.Tensor(np.arange(3)).__arrow_c_array__()
    loom.from_arrow(capsules)
    with pytest.raises(BufferError, match="already consumed"):
        loom.from_arrow(capsules)


def test_wrong_capsules():
    t = loom.Table({"a": np.arange(3.0)})
    s, a = t.__arrow_c_array__()
    with pytest.raises(ValueError, match="arrow_schema"):
        loom.Table.from_arrow((a, s))  # swapped
    dl = loom.Tensor(np.arange(3.0)).__dlpack__()
    with pytest.raises(ValueError, match="dltensor"):
        loom.Table.from_arrow((s, dl))
    with pytest.raises(ValueError, match="arrow_array"):
        loom.from_arrow((s, s))
    with pytest.raises(TypeError, match="PyCapsule"):
        loom.Table.from_arrow((s, 5))
    with pytest.raises(TypeError, match="pair"):
        loom.Table.from_arrow((s,))
    with pytest.raises(TypeError, match="__arrow_c_array__"):
        loom.Table.from_arrow(np.arange(3))
    with pytest.raises(TypeError, match="__arrow_c_array__"):
        loom.from_arrow(42)

    class Broken:
        def __arrow_c_array__(self, requested_schema=None):
            return [s, a]

    with pytest.raises(TypeError, match="tuple"):
        loom.Table.from_arrow(Broken())
    # nothing was consumed by the failures
    assert loom.Table.from_arrow((s, a)).names == ["a"]


def test_export_errors():
    bf16 = loom.from_dlpack(torch.arange(4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16"):
        bf16.__arrow_c_array__()
    with pytest.raises(TypeError, match=r"column 'h'.*bfloat16"):
        loom.Table({"ok": np.arange(4.0), "h": bf16}).__arrow_c_array__()
    with pytest.raises(TypeError, match="bfloat16"):
        loom.Table({"h": bf16}).__arrow_c_schema__()
    with pytest.raises(ValueError, match="1-D"):
        loom.Tensor(np.zeros((2, 3))).__arrow_c_array__()
    with pytest.raises(ValueError, match="1-D"):
        loom.Tensor(np.float32(1)).__arrow_c_schema__()


def test_table_construction_errors():
    with pytest.raises(ValueError, match="'b'"):
        loom.Table({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="'m'"):
        loom.Table({"m": np.zeros((2, 2))})
    with pytest.raises(TypeError, match="mapping"):
        loom.Table([np.zeros(3)])
    with pytest.raises(TypeError, match="str"):
        loom.Table({1: np.zeros(3)})
    t = loom.Table({"a": np.zeros(3)})
    with pytest.raises(KeyError, match="nope"):
        t["nope"]
    assert "a" in t and "nope" not in t
    assert repr(t) == "loom.Table(3 rows; a: float64)"
