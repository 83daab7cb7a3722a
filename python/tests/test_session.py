"""Graphs and sessions from Python against NumPy: ops, gradients against float64 finite
differences, an optimizer step against the Adam formula, errors, the GIL released during
runs, Ctrl-C cancelling a run, checkpoints, memory statistics."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import loom


def test_ops_against_numpy(rng):
    g = loom.Graph()
    a = g.placeholder("a", loom.float32, [None, 4])
    b = g.placeholder("b", loom.float32, [4, 3])
    y = loom.ops.relu(a @ b + 0.5)
    z = loom.ops.softmax(y, axis=-1)
    c = loom.ops.concat([y, z], axis=1)
    s = loom.Session(g)
    av = rng.standard_normal((5, 4)).astype(np.float32)
    bv = rng.standard_normal((4, 3)).astype(np.float32)
    out_y, out_z, out_c = s.run([y, z, c], {a: av, b: bv})
    want_y = np.maximum(av.astype(np.float64) @ bv + 0.5, 0)
    e = np.exp(want_y - want_y.max(axis=1, keepdims=True))
    want_z = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(np.asarray(out_y), want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out_z), want_z, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out_c), np.concatenate([want_y, want_z], 1), rtol=1e-5, atol=1e-6)
    assert y.shape == (None, 3) and y.dtype == loom.float32
    # Fetch by name, feed by name, lists and scalars converted to the placeholder's dtype.
    got = s.run(y.name, {"a": av.tolist(), "b": bv})
    np.testing.assert_allclose(np.asarray(got), want_y, rtol=1e-5, atol=1e-6)


def test_gradients_against_finite_differences(rng):
    g = loom.Graph()
    x = g.placeholder("x", loom.float64, [3, 4])
    w = g.variable("w", init=rng.standard_normal((4, 2)))
    loss = loom.ops.reduce_sum(loom.ops.tanh(x @ w) * 3.0, axes=[0, 1])
    (dw,) = g.gradients(loss, [w])
    s = loom.Session(g)
    xv = rng.standard_normal((3, 4))
    wv = np.asarray(s.variable("w")).copy()
    got = np.asarray(s.run(dw, {x: xv}))

    def f(wm):
        return (np.tanh(xv @ wm) * 3.0).sum()

    num = np.zeros_like(wv)
    for i in np.ndindex(wv.shape):
        e = np.zeros_like(wv)
        e[i] = 1e-6
        num[i] = (f(wv + e) - f(wv - e)) / 2e-6
    np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-8)


def test_fused_adam_step_matches_the_formula(rng):
    g = loom.Graph()
    w0 = rng.standard_normal((8,)).astype(np.float32)
    w = g.variable("w", init=w0)
    target = g.placeholder("t", loom.float32, [8])
    diff = w - target
    loss = loom.ops.reduce_sum(diff * diff, axes=[0])
    (dw,) = g.gradients(loss, [w])
    lr = g.constant(np.float32(0.1))
    step = g.variable("step", init=np.int64(1))
    scale = g.constant(np.float32(1.0))
    name, norm, found_inf = g.fused_adam([w], [dw], lr, step, scale)
    s = loom.Session(g)
    tv = rng.standard_normal(8).astype(np.float32)
    out_norm, out_inf = s.run([norm, found_inf], {target: tv}, targets=[name])
    grad = 2 * (w0.astype(np.float64) - tv)
    np.testing.assert_allclose(float(np.asarray(out_norm)), np.linalg.norm(grad), rtol=1e-5)
    assert not bool(np.asarray(out_inf))
    m = 0.1 * grad
    v = 0.001 * grad * grad
    want = w0 - 0.1 * (m / 0.1) / (np.sqrt(v / 0.001) + 1e-8)
    np.testing.assert_allclose(np.asarray(s.variable("w")), want, rtol=1e-5, atol=1e-6)


def test_errors_are_python_exceptions(rng):
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [2, 3])
    y = loom.ops.exp(x)
    s = loom.Session(g)
    with pytest.raises(ValueError, match="x"):
        s.run(y, {x: np.zeros((3, 3), np.float32)})          # wrong shape
    with pytest.raises(ValueError):
        s.run(y, {x: np.zeros((2, 3), np.float64)})          # wrong dtype
    with pytest.raises(KeyError, match="nope"):
        s.run("nope:0", {x: np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError):
        g.op("matmul", [x, x])                               # inner dimensions
    with pytest.raises(TypeError, match="no attribute 'bogus'"):
        loom.ops.softmax(x, bogus=1)
    with pytest.raises(TypeError, match="expected int"):
        loom.ops.softmax(x, axis="one")
    with pytest.raises(AttributeError):
        loom.ops.not_an_op
    other = loom.Graph()
    ox = other.placeholder("x", loom.float32, [2, 3])
    with pytest.raises(ValueError, match="another graph"):
        g.op("add", [x, ox])
    # The session is still usable.
    out = s.run(y, {x: np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(np.asarray(out), np.ones((2, 3), np.float32))


def slow_graph(n=400, size=512):
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [size, size])
    h = x
    for _ in range(n):
        h = loom.ops.tanh(h @ x)
    return g, x, h


def test_gil_is_released_during_a_run():
    g, x, h = slow_graph(60)
    s = loom.Session(g, threads=1)
    xv = np.full((512, 512), 1e-3, np.float32)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    th = threading.Thread(target=ticker)
    th.start()
    try:
        t0 = time.perf_counter()
        s.run(h, {x: xv})
        t1 = time.perf_counter()
    finally:
        stop.set()
        th.join()
    during = [t for t in ticks if t0 < t < t1]
    assert t1 - t0 > 0.02
    assert len(during) >= 3, "another Python thread ran while the session ran"


def test_ctrl_c_cancels_a_run_and_the_session_stays_usable():
    g, x, h = slow_graph(2000)
    s = loom.Session(g)
    xv = np.full((512, 512), 1e-3, np.float32)
    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        s.run(h, {x: xv})
    elapsed = time.perf_counter() - t0
    timer.join()
    assert elapsed < 10, "the run stopped soon after the signal"
    small = loom.Graph()
    sx = small.placeholder("x", loom.float32, [2])
    sy = loom.ops.neg(sx)
    assert np.asarray(loom.Session(small).run(sy, {sx: np.ones(2, np.float32)})).tolist() == [-1, -1]
    assert np.asarray(s.run(x, {x: xv})).shape == (512, 512)


def test_results_outlive_the_session():
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [1000])
    y = loom.ops.neg(x)
    s = loom.Session(g)
    out = s.run(y, {x: np.ones(1000, np.float32)})
    a = np.asarray(out)
    del s, out
    import gc
    gc.collect()
    assert a.sum() == -1000


def test_checkpoint_round_trip(tmp_path, rng):
    g = loom.Graph()
    w = g.variable("w", init=rng.standard_normal((3, 2)).astype(np.float32))
    add = g.op("assign_add", [w, g.constant(np.ones((3, 2), np.float32))])
    s = loom.Session(g)
    s.run([], targets=[add])
    before = np.asarray(s.variable("w")).copy()
    s.save(str(tmp_path / "c.safetensors"), {"step": "1"})
    s.run([], targets=[add])
    meta = s.restore(str(tmp_path / "c.safetensors"))
    assert meta["step"] == "1"
    np.testing.assert_array_equal(np.asarray(s.variable("w")), before)
    with pytest.raises(Exception):
        s.restore(str(tmp_path / "missing.safetensors"))


def test_memory_statistics_and_devices():
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [1 << 16])
    y = loom.ops.exp(x)
    s = loom.Session(g, virtual_cpus=2, threads=2)
    assert [d["name"] for d in s.devices] == ["/device:CPU:0", "/device:CPU:1"]
    out = s.run(y, {x: np.zeros(1 << 16, np.float32)})
    stats = s.memory_stats()
    assert stats["/device:CPU:0"]["bytes_in_use"] >= (1 << 16) * 4   # the result is alive
    del out
    assert s.memory_stats()["/device:CPU:0"]["bytes_in_use"] < (1 << 16) * 4
    assert 0.0 <= stats["/device:CPU:0"]["fragmentation"] <= 1.0


def test_the_docs_example_trains(rng):
    # docs/interop.md's example, checked: a few fused Adam steps lower the loss.
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [64, 784])
    w = g.variable("w", init=rng.standard_normal((784, 10)).astype(np.float32) * 0.01)
    logits = x @ w
    labels = g.placeholder("labels", loom.int32, [64])
    per_example, _ = loom.ops.softmax_cross_entropy(logits, labels)
    loss = loom.ops.reduce_mean(per_example, axes=[0])
    (dw,) = g.gradients(loss, [w])
    lr, step, scale = g.constant(np.float32(1e-2)), g.variable("step", init=np.int64(1)), g.constant(np.float32(1))
    update, grad_norm, found_inf = g.fused_adam([w], [dw], lr, step, scale)
    bump = g.op("assign_add", [step, g.constant(np.int64(1))])
    s = loom.Session(g, threads=2)
    batch = rng.random((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    first = float(np.asarray(s.run(loss, {x: batch, labels: y}, targets=[update, bump])))
    for _ in range(20):
        last = float(np.asarray(s.run(loss, {x: batch, labels: y}, targets=[update, bump])))
    assert last < first
    with pytest.raises(TypeError, match="must be a loom.Output"):
        loom.ops.reduce_mean(loom.ops.softmax_cross_entropy(logits, labels), axes=[0])


def test_sum_of_float16_given_in_float32_as_numpy_dtype(rng):
    # np.sum(x, dtype=np.float32): loom's reduce_sum(x, output_type=float32) of a float16 x,
    # against float64 sums of the same float16 values; not rounded to float16.
    x16 = (rng.standard_normal((64, 300)) * 3).astype(np.float16)
    g = loom.Graph()
    x = g.placeholder("x", loom.float16, [64, 300])
    wide = loom.ops.reduce_sum(x, axes=[0], output_type=loom.float32)
    narrow = loom.ops.reduce_sum(x, axes=[0])
    cast_then_sum = loom.ops.reduce_sum(loom.ops.cast(x, to=loom.float32), axes=[0])
    assert wide.dtype == loom.float32 and narrow.dtype == loom.float16
    got, got16, want_bits = (np.asarray(v) for v in loom.Session(g).run([wide, narrow, cast_then_sum], {x: x16}))
    want = x16.astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    assert got.dtype == np.float32 and np.array_equal(got, want_bits)
    assert np.abs(got16.astype(np.float64) - want).max() > np.abs(got - want).max()
    with pytest.raises(ValueError, match="cannot give float16"):
        loom.ops.reduce_sum(g.placeholder("y", loom.float32, [3]), output_type=loom.float16)
