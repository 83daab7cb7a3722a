"""The array ops of the ONNX family (topk, strided_slice, dynamic_reshape, cumsum, argmin,
gather_elements, scatter_nd) through loom.ops, the registry's functions, against NumPy."""
import numpy as np

import loom
from loom import ops


def test_array_ops_against_numpy(rng):
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [3, 5])
    shp = g.placeholder("shp", loom.int64, [2])
    idx = g.placeholder("idx", loom.int64, [3, 2])
    vals, order = ops.topk(x, k=2, axis=-1)
    backwards = ops.strided_slice(x, starts=[-1], ends=[-(2**63)], steps=[-1], axes=[1])
    reshaped = ops.dynamic_reshape(x, shp)
    sums = ops.cumsum(x, axis=1, reverse=True)
    smallest = ops.argmin(x, axis=0, keepdims=True)
    picked = ops.gather_elements(x, idx, axis=1)
    s = loom.Session(g)
    xv = rng.random((3, 5)).astype(np.float32)
    iv = np.array([[0, -1], [4, 2], [-5, 3]], dtype=np.int64)
    out = s.run([vals, order, backwards, reshaped, sums, smallest, picked],
                {x: xv, shp: np.array([5, -1], dtype=np.int64), idx: iv})
    np.testing.assert_array_equal(out[0], -np.sort(-xv, axis=1)[:, :2])
    np.testing.assert_array_equal(out[1], np.argsort(-xv, axis=1, kind="stable")[:, :2])
    np.testing.assert_array_equal(out[2], xv[:, ::-1])
    np.testing.assert_array_equal(out[3], xv.reshape(5, 3))
    np.testing.assert_allclose(out[4], np.cumsum(xv[:, ::-1], axis=1)[:, ::-1], rtol=1e-6)
    np.testing.assert_array_equal(out[5], xv.argmin(axis=0)[None])
    np.testing.assert_array_equal(out[6], np.take_along_axis(xv, iv % 5, axis=1))
