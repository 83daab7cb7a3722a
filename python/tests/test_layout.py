"""AoS <-> SoA from Python: loom.deinterleave / loom.interleave against NumPy slicing and
stacking, and loom.Table.from_records / to_records against NumPy structured arrays (their
field views are the reference), for every dtype, several widths and lengths, strided
inputs, and bad input."""
import concurrent.futures

import numpy as np
import pytest
import torch

import loom

NUMPY_TYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.bool_]
LOOM_NAMES = {np.float32: "float32", np.float64: "float64", np.float16: "float16",
              np.int32: "int32", np.int64: "int64", np.int8: "int8", np.uint8: "uint8",
              np.bool_: "bool"}


def random_array(rng, shape, dt):
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def views(rng, n, k, dt):
    """[n, k] arrays of one content in several layouts: contiguous, transposed (columns
    contiguous), a strided slice of a bigger array, and reversed rows."""
    base = random_array(rng, (n, k), dt)
    yield "contiguous", base
    yield "transposed", np.ascontiguousarray(base.T).T
    big = random_array(rng, (2 * n + 1, 3 * k), dt)
    big[1::2, ::3] = base
    yield "strided", big[1::2, ::3]
    yield "reversed", np.ascontiguousarray(base[::-1])[::-1]


# ---- deinterleave / interleave --------------------------------------------------------------


@pytest.mark.parametrize("dt", NUMPY_TYPES)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [0, 1, 1000])
def test_deinterleave_matches_numpy_columns(rng, dt, k, n):
    for layout, x in views(rng, n, k, dt):
        cols = loom.deinterleave(x)
        assert len(cols) == k, layout
        for j, c in enumerate(cols):
            assert isinstance(c, loom.Tensor)
            assert c.shape == (n,) and c.dtype.name == LOOM_NAMES[dt] and c.is_contiguous
            np.testing.assert_array_equal(np.asarray(c), x[:, j], err_msg=layout)


@pytest.mark.parametrize("dt", NUMPY_TYPES)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [0, 1, 1000])
def test_interleave_matches_numpy_stack(rng, dt, k, n):
    cols = [random_array(rng, n, dt) for _ in range(k)]
    # strided columns too: every other element of a longer array
    strided = []
    for c in cols:
        longer = random_array(rng, 2 * n, dt)
        longer[::2] = c
        strided.append(longer[::2])
    for inputs in (cols, strided, [loom.from_numpy(c) for c in cols]):
        x = loom.interleave(inputs)
        assert x.shape == (n, k) and x.dtype.name == LOOM_NAMES[dt] and x.is_contiguous
        np.testing.assert_array_equal(np.asarray(x), np.stack(cols, axis=1).reshape(n, k))


@pytest.mark.parametrize("k", [1, 3, 4])
def test_bfloat16_through_torch(k):
    x = torch.randn(100, k).to(torch.bfloat16)
    cols = loom.deinterleave(loom.from_dlpack(x))
    for j, c in enumerate(cols):
        assert c.dtype == loom.bfloat16
        assert torch.equal(torch.from_dlpack(c), x[:, j])
    back = loom.interleave(cols)
    assert torch.equal(torch.from_dlpack(back), x)
    # a transposed view
    xt = torch.randn(k, 50).to(torch.bfloat16)
    cols = loom.deinterleave(loom.from_dlpack(xt.t()))
    for j, c in enumerate(cols):
        assert torch.equal(torch.from_dlpack(c), xt[j])


def test_round_trip_and_sources(rng):
    x = rng.standard_normal((333, 3)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(loom.interleave(loom.deinterleave(x))), x)
    # lists and loom tensors are taken as well
    cols = loom.deinterleave([[1, 2], [3, 4], [5, 6]])
    np.testing.assert_array_equal(np.asarray(cols[1]), [2, 4, 6])
    np.testing.assert_array_equal(np.asarray(loom.interleave([[1.0, 2.0], [3.0, 4.0]])),
                                  [[1.0, 3.0], [2.0, 4.0]])
    np.testing.assert_array_equal(np.asarray(loom.deinterleave(loom.Tensor(x))[2]), x[:, 2])


def test_large_inputs_from_threads(rng):
    # big enough that the GIL is released around the copies; several threads at once
    xs = [rng.standard_normal((200_000, 3)).astype(np.float32) for _ in range(4)]

    def work(x):
        cols = loom.deinterleave(x)
        back = loom.interleave(cols)
        return [np.asarray(c) for c in cols], np.asarray(back)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for x, (cols, back) in zip(xs, pool.map(work, xs)):
            for j in range(3):
                np.testing.assert_array_equal(cols[j], x[:, j])
            np.testing.assert_array_equal(back, x)


def test_layout_errors():
    with pytest.raises(ValueError, match="rank|2-D|\\[N, k\\]"):
        loom.deinterleave(np.zeros(5))
    with pytest.raises(ValueError):
        loom.deinterleave(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="column"):
        loom.interleave([])
    with pytest.raises(ValueError, match="column 1"):
        loom.interleave([np.zeros(3, np.float32), np.zeros(3, np.float64)])
    with pytest.raises(ValueError, match="column 2"):
        loom.interleave([np.zeros(3), np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="column 0"):
        loom.interleave([np.zeros((3, 1)), np.zeros(3)])
    with pytest.raises(TypeError, match="int16"):
        loom.interleave([np.zeros(3, np.int16)])
    with pytest.raises(TypeError):
        loom.interleave(5)


# ---- records --------------------------------------------------------------------------------


def record_dtype(types, align):
    return np.dtype([(f"f_{i}_{np.dtype(t).name}", t) for i, t in enumerate(types)], align=align)


def random_records(rng, n, dt):
    r = np.zeros(n, dt)
    for name in dt.names:
        r[name] = random_array(rng, n, dt.fields[name][0].type)
    return r


FIELD_SETS = [
    NUMPY_TYPES,                                          # every dtype
    [np.float64, np.float32, np.int32],                   # the header's example
    [np.int8, np.float64, np.bool_, np.int64, np.float16],  # padding under align=True
    [np.uint8],
]


@pytest.mark.parametrize("types", FIELD_SETS)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("n", [0, 1, 1000, 50_000])
def test_from_records_matches_numpy_fields(rng, types, align, n):
    dt = record_dtype(types, align)
    r = random_records(rng, n, dt)
    t = loom.Table.from_records(r)
    assert t.names == list(dt.names) and t.num_rows == n
    for name in dt.names:
        c = t[name]
        assert c.shape == (n,) and c.is_contiguous
        assert c.dtype.name == LOOM_NAMES[dt.fields[name][0].type]
        np.testing.assert_array_equal(np.asarray(c), r[name])


@pytest.mark.parametrize("align", [False, True])
def test_from_records_of_strided_and_multidimensional_arrays(rng, align):
    dt = record_dtype([np.float32, np.int64, np.bool_], align)
    r = random_records(rng, 301, dt)
    for view in (r[::3], r[::-1], r[::-2], r[5:6], r[:0], r[:300].reshape(20, 15),
                 r[:300].reshape(15, 20).T, np.asarray(r[7])):
        t = loom.Table.from_records(view)
        flat = np.asarray(view).reshape(-1)
        assert t.num_rows == flat.size
        for name in dt.names:
            np.testing.assert_array_equal(np.asarray(t[name]), flat[name])


def test_from_records_with_offsets_out_of_order_and_titles(rng):
    dt = np.dtype({"names": ["b", "a"], "formats": ["<i4", "<f8"], "offsets": [12, 0],
                   "titles": ["B title", None], "itemsize": 20})
    r = np.zeros(10, dt)
    r["a"] = rng.standard_normal(10)
    r["b"] = np.arange(10)
    t = loom.Table.from_records(r)
    assert t.names == ["b", "a"]
    np.testing.assert_array_equal(np.asarray(t["a"]), r["a"])
    np.testing.assert_array_equal(np.asarray(t["b"]), r["b"])


@pytest.mark.parametrize("types", FIELD_SETS)
@pytest.mark.parametrize("n", [0, 1, 1000, 50_000])
def test_to_records_is_numpys_packed_layout(rng, types, n):
    cols = {f"c{i}": random_array(rng, n, t) for i, t in enumerate(types)}
    r = loom.Table(cols).to_records()
    expected = np.dtype([(name, c.dtype) for name, c in cols.items()])
    assert r.dtype == expected and r.dtype.itemsize == sum(np.dtype(t).itemsize for t in types)
    assert r.shape == (n,) and r.flags.c_contiguous and r.flags.writeable
    for name, c in cols.items():
        np.testing.assert_array_equal(r[name], c)


@pytest.mark.parametrize("align", [False, True])
def test_record_round_trips(rng, align):
    dt = record_dtype(NUMPY_TYPES, align)
    r = random_records(rng, 777, dt)
    back = loom.Table.from_records(r).to_records()
    assert back.dtype == np.dtype([(name, dt.fields[name][0]) for name in dt.names])
    for name in dt.names:
        np.testing.assert_array_equal(back[name], r[name])
    if not align:
        assert back.tobytes() == r.tobytes()  # packed in, packed out: byte for byte
    t = loom.Table.from_records(back)
    for name in dt.names:
        np.testing.assert_array_equal(np.asarray(t[name]), r[name])


def test_to_records_of_empty_and_odd_tables():
    r = loom.Table({}).to_records()
    assert r.shape == (0,) and r.dtype.names in ((), None)
    r = loom.Table({"": np.arange(3, dtype=np.int8), "x": np.ones(3)}).to_records()
    assert r.dtype.itemsize == 9
    np.testing.assert_array_equal(r[r.dtype.names[0]], [0, 1, 2])
    np.testing.assert_array_equal(r["x"], [1.0, 1.0, 1.0])
    # columns that are strided views
    a = np.arange(20, dtype=np.int64)
    r = loom.Table({"even": a[::2], "rev": a[::-2]}).to_records()
    np.testing.assert_array_equal(r["even"], a[::2])
    np.testing.assert_array_equal(r["rev"], a[::-2])


def test_record_errors():
    with pytest.raises(TypeError, match="'s'.*int16"):
        loom.Table.from_records(np.zeros(3, [("x", "<f4"), ("s", "<i2")]))
    with pytest.raises(TypeError, match="'big'"):
        loom.Table.from_records(np.zeros(3, [("big", ">f4")]))
    with pytest.raises(TypeError, match="'name'"):
        loom.Table.from_records(np.zeros(3, [("name", "U4")]))
    with pytest.raises(TypeError, match="'o'"):
        loom.Table.from_records(np.zeros(3, [("o", object)]))
    with pytest.raises(TypeError, match="'u'.*uint32"):
        loom.Table.from_records(np.zeros(3, [("u", "<u4")]))
    with pytest.raises(TypeError, match="'p'.*nested"):
        loom.Table.from_records(np.zeros(3, [("t", "<f8"), ("p", "<f4", (3,))]))
    with pytest.raises(TypeError, match="'inner'.*nested"):
        loom.Table.from_records(np.zeros(3, [("inner", [("a", "<f4"), ("b", "<i4")])]))
    with pytest.raises(TypeError, match="structured"):
        loom.Table.from_records(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="structured"):
        loom.Table.from_records([(1, 2.0)])
    overlapping = np.dtype({"names": ["a", "b"], "formats": ["<i8", "<i4"], "offsets": [0, 4]})
    with pytest.raises(ValueError, match="overlap"):
        loom.Table.from_records(np.zeros(3, overlapping))
    bf16 = loom.from_dlpack(torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="'h'.*bfloat16"):
        loom.Table({"h": bf16}).to_records()
