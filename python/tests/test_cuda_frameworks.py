"""loom's CUDA backend with the real frameworks on a real GPU: zero-copy exchange with CuPy and
Numba both ways (DLPack and the CUDA array interface, several dtypes, strided views, writes
seen across), the stream handshake with a slow producer on a CuPy stream, a session computing
on cuda:0 against NumPy and exporting to PyTorch, loom's pool behind PyTorch's allocator for a
small training loop (in a fresh process), out of memory on the GPU as a typed error, and bad
input on the GPU refused as on the CPU.

Every test skips, saying why, without a GPU loom can use or without the framework it needs;
PyTorch, CuPy and Numba are imported only inside the tests that need them.
"""
import gc
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import loom
import loom.cuda

GPU = loom.cuda.is_available()


def _why_no_gpu():
    if GPU:
        return ""
    try:
        return loom.cuda._c.availability() or "no GPU"
    except Exception as e:  # noqa: BLE001 - only for the skip reason
        return f"no GPU ({e})"


needs_gpu = pytest.mark.skipif(not GPU, reason=f"needs a GPU loom can use: {_why_no_gpu()}")
pytestmark = needs_gpu

# What a host copy of a GPU result may be placed on (CPU devices use pinned memory when a GPU
# is present, docs/cuda.md).
HOST_DEVICES = ("cpu:0", "cuda_host:0")

# The dtypes loom's DLPack and CUDA array interface carry that CuPy and Numba have too
# (bfloat16 is loom's and PyTorch's only), with loom's name for each.
DTYPES = {
    "float32": loom.float32,
    "float64": loom.float64,
    "float16": loom.float16,
    "int8": loom.int8,
    "int32": loom.int32,
    "int64": loom.int64,
    "uint8": loom.uint8,
    "bool": loom.bool_,
}

# A spin on the GPU clock: a producer that is still busy when the consumer looks.
SPIN_SOURCE = r"""
extern "C" __global__ void loom_test_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""
# About 0.1 s at the clocks of an H100 (1.1 to 2 GHz): long next to the microseconds the host
# takes between the launch and the check, short for the test's GPU time.
SPIN_CYCLES = 200_000_000


# ---- helpers --------------------------------------------------------------------------------

def _cupy():
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CuPy without a usable CUDA: skip, saying so
        pytest.skip(f"CuPy cannot use CUDA here: {e}")
    if count < 1:
        pytest.skip("CuPy sees no GPU")
    return cupy


def _numba_cuda():
    pytest.importorskip("numba")
    cuda = pytest.importorskip("numba.cuda")
    if not cuda.is_available():
        pytest.skip("Numba sees no usable GPU")
    return cuda


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"PyTorch {torch.__version__} has no usable CUDA")
    return torch


def _values(dtype, shape, salt=0):
    """Host values of `dtype` that every dtype holds exactly; `salt` changes them all."""
    n = math.prod(shape)
    i = np.arange(n)
    if dtype == "bool":
        return ((i + salt) % 3 == 0).reshape(shape)
    return ((i * 7 + salt) % 100 + 1).astype(dtype).reshape(shape)


def _element_strides(byte_strides, itemsize):
    assert all(s % itemsize == 0 for s in byte_strides)
    return tuple(s // itemsize for s in byte_strides)


def _host(t):
    """A NumPy view of a loom tensor known to be in host memory (never a GPU pointer)."""
    assert t.device in HOST_DEVICES, f"expected a host tensor, got one on {t.device}"
    return np.asarray(t)


class _CAIOnly:
    """Shows only obj's __cuda_array_interface__ (and keeps obj alive), so that a consumer
    that prefers DLPack must take the CUDA array interface."""

    def __init__(self, obj):
        self.obj = obj

    @property
    def __cuda_array_interface__(self):
        return self.obj.__cuda_array_interface__


def _squares_on_gpu(xv):
    """x * x computed by a loom session on cuda:0; the fetched tensor stays on the GPU."""
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, list(xv.shape))
    y = loom.ops.mul(x, x, device="cuda:0", name="square")
    out = loom.Session(g).run(y, {x: xv})
    assert out.device == "cuda:0", f"the square was computed on {out.device}"
    return out


def _relative_error(got, want):
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


# ---- 1. CuPy both ways, zero copy -----------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_cupy_arrays_and_loom_tensors_share_memory_both_ways(dtype):
    cupy = _cupy()
    host = _values(dtype, (6, 10))
    a = cupy.asarray(host)
    ptr = a.data.ptr
    imports = {
        "from_dlpack": loom.from_dlpack(a),
        "from_cuda_array_interface": loom.from_cuda_array_interface(a),
        "asarray": loom.asarray(a),
    }
    for how, t in imports.items():
        assert t.device == "cuda:0", how
        assert t.data_ptr == ptr, how
        assert t.dtype == DTYPES[dtype], how
        assert t.shape == (6, 10), how
        assert t.strides == (10, 1), how
        assert t.is_contiguous, how
        # loom -> CuPy: DLPack and the CUDA array interface, without copies.
        for back in (cupy.from_dlpack(t), cupy.asarray(t), cupy.asarray(_CAIOnly(t))):
            assert back.data.ptr == ptr, how
            assert back.dtype == host.dtype and back.shape == host.shape, how
            np.testing.assert_array_equal(back.get(), host, err_msg=how)

    t = imports["from_dlpack"]
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3 and cai["data"] == (ptr, False)
    assert cai["typestr"] == host.dtype.str and cai["shape"] == (6, 10)
    view = cupy.from_dlpack(t)
    # A write through CuPy's original array is seen through loom's tensor, and back.
    other = _values(dtype, (6, 10), salt=5)
    assert not np.array_equal(other, host)
    a.set(other)
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(view.get(), other)
    np.testing.assert_array_equal(cupy.asarray(_CAIOnly(imports["from_cuda_array_interface"]))
                                  .get(), other)
    view.set(host)
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(a.get(), host)


@pytest.mark.parametrize("make_view, element_strides", [
    (lambda a: a.T, (1, 10)),
    (lambda a: a[1:, ::3], (10, 3)),
    (lambda a: a[::-1], (-10, 1)),
], ids=["transposed", "sliced", "reversed"])
def test_cupy_strided_views_keep_their_layout_in_loom(make_view, element_strides):
    cupy = _cupy()
    host = _values("float32", (6, 10))
    a = cupy.asarray(host)
    v = make_view(a)
    want = make_view(host)
    assert _element_strides(v.strides, v.itemsize) == element_strides
    # Negative strides travel through the CUDA array interface (byte strides, signed). CuPy
    # 14's DLPack export turns them into unsigned quotients (-40 bytes / 4 -> 2**62 - 10, seen
    # on an H200), which loom refuses by name; DLPack is checked with the other views.
    dlpack = min(element_strides) >= 0
    importers = [("from_cuda_array_interface", loom.from_cuda_array_interface)]
    if dlpack:
        importers.append(("from_dlpack", loom.from_dlpack))
    for how, importer in importers:
        t = importer(v)
        assert t.data_ptr == v.data.ptr, how  # element 0, wherever it is
        assert t.shape == v.shape, how
        assert t.strides == element_strides, how
        assert not t.is_contiguous, how
        if dlpack:
            back = cupy.from_dlpack(t)
            assert back.data.ptr == v.data.ptr, how
            assert _element_strides(back.strides, back.itemsize) == element_strides, how
            np.testing.assert_array_equal(back.get(), want, err_msg=how)
        cai = t.__cuda_array_interface__
        assert cai["strides"] == tuple(s * 4 for s in element_strides), how
        np.testing.assert_array_equal(cupy.asarray(_CAIOnly(t)).get(), want, err_msg=how)


def test_cupy_shares_a_loom_session_result_on_the_gpu():
    cupy = _cupy()
    xv = (np.arange(24, dtype=np.float32) - 7.0).reshape(4, 6)
    out = _squares_on_gpu(xv)
    for how, c in (("from_dlpack", cupy.from_dlpack(out)), ("asarray", cupy.asarray(out)),
                   ("cuda_array_interface", cupy.asarray(_CAIOnly(out)))):
        assert c.data.ptr == out.data_ptr, how
        assert c.shape == (4, 6) and c.dtype == np.float32, how
        np.testing.assert_array_equal(c.get(), xv * xv, err_msg=how)
    # A write through CuPy is seen by a second consumer of loom's tensor.
    c = cupy.from_dlpack(out)
    c.set(np.full((4, 6), -1.5, np.float32))
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(cupy.asarray(_CAIOnly(out)).get(), np.full((4, 6), -1.5))


# ---- 2. Numba both ways -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES))
def test_numba_device_arrays_and_loom_tensors_share_memory_both_ways(dtype):
    cuda = _numba_cuda()
    host = _values(dtype, (6, 10))
    d = cuda.to_device(host)
    ptr = d.__cuda_array_interface__["data"][0]
    imports = {"from_cuda_array_interface": loom.from_cuda_array_interface(d),
               "asarray": loom.asarray(d)}
    if hasattr(d, "__dlpack__"):
        imports["from_dlpack"] = loom.from_dlpack(d)
    for how, t in imports.items():
        assert t.device == "cuda:0", how
        assert t.data_ptr == ptr, how
        assert t.dtype == DTYPES[dtype], how
        assert t.shape == (6, 10) and t.strides == (10, 1), how

    t = imports["from_cuda_array_interface"]
    views = {"as_cuda_array": cuda.as_cuda_array(t)}
    if hasattr(cuda, "from_dlpack"):
        views["from_dlpack"] = cuda.from_dlpack(t)
    for how, v in views.items():
        assert v.__cuda_array_interface__["data"][0] == ptr, how
        assert v.shape == (6, 10) and v.dtype == host.dtype, how
        np.testing.assert_array_equal(v.copy_to_host(), host, err_msg=how)

    # A write through Numba's array is seen through loom's tensor, and back.
    v = views["as_cuda_array"]
    other = _values(dtype, (6, 10), salt=5)
    assert not np.array_equal(other, host)
    d.copy_to_device(other)
    cuda.synchronize()
    np.testing.assert_array_equal(v.copy_to_host(), other)
    v.copy_to_device(host)
    cuda.synchronize()
    np.testing.assert_array_equal(d.copy_to_host(), host)


def test_numba_strided_views_keep_their_layout_in_loom():
    cuda = _numba_cuda()
    host = _values("float32", (6, 10))
    d = cuda.to_device(host)
    v = d[1:, ::3]
    t = loom.from_cuda_array_interface(v)
    assert t.data_ptr == v.__cuda_array_interface__["data"][0]
    assert t.shape == (5, 4) and t.strides == (10, 3) and not t.is_contiguous
    back = cuda.as_cuda_array(t)
    assert back.__cuda_array_interface__["data"][0] == t.data_ptr
    assert back.strides == (40, 12)
    np.testing.assert_array_equal(back.copy_to_host(), host[1:, ::3])


def test_numba_shares_a_loom_session_result_on_the_gpu():
    cuda = _numba_cuda()
    xv = (np.arange(24, dtype=np.float32) - 7.0).reshape(4, 6)
    out = _squares_on_gpu(xv)
    v = cuda.as_cuda_array(out)
    assert v.__cuda_array_interface__["data"][0] == out.data_ptr
    np.testing.assert_array_equal(v.copy_to_host(), xv * xv)
    v.copy_to_device(np.zeros((4, 6), np.float32))
    cuda.synchronize()
    np.testing.assert_array_equal(cuda.as_cuda_array(out).copy_to_host(), np.zeros((4, 6)))


# ---- 3. the stream handshake with a slow producer on a CuPy stream --------------------------

def test_imports_wait_for_a_slow_producer_on_a_cupy_stream():
    cupy = _cupy()
    spin = cupy.RawKernel(SPIN_SOURCE, "loom_test_spin")
    n = 1 << 20
    warm = cupy.empty(n, cupy.float32)
    warm.fill(0.5)  # compiles the fill kernel now, not while the producer spins
    spin((1,), (1,), (np.int64(0),))  # compiles and loads the spin kernel
    cupy.cuda.Device().synchronize()
    producer = cupy.cuda.Stream(non_blocking=True)
    consumer = cupy.cuda.Stream(non_blocking=True)

    def fresh():
        a = cupy.zeros(n, cupy.float32)
        cupy.cuda.Device().synchronize()
        return a

    def produce(a, value):
        """On the producer stream (the caller's `with producer`): spin, then write."""
        spin((1,), (1,), (np.int64(SPIN_CYCLES),))
        a.fill(value)

    def all_equal(c, value):
        h = c.get()
        return float(h.min()) == value and float(h.max()) == value

    # DLPack without a stream: CuPy orders its stream before loom's interop stream, which loom
    # waits for on the host, so the producer's work is done when the import returns.
    a = fresh()
    with producer:
        produce(a, 1.0)
        t = loom.from_dlpack(a)
        assert producer.done, "from_dlpack returned before the producer's writes were done"
    assert t.__cuda_array_interface__["stream"] is None  # ready for every stream
    assert all_equal(cupy.from_dlpack(t), 1.0)

    # DLPack with the consumer's stream: no wait on the host; the consumer's stream waits.
    a = fresh()
    with producer:
        produce(a, 2.0)
        t = loom.from_dlpack(a, stream=consumer.ptr)
        assert not producer.done, "from_dlpack(stream=...) waited on the host"
    assert t.__cuda_array_interface__["stream"] == consumer.ptr
    with consumer:
        copy = cupy.from_dlpack(t).copy()  # queued on the consumer stream
    consumer.synchronize()
    assert all_equal(copy, 2.0), "the consumer's stream read before the producer wrote"

    # The CUDA array interface without a stream: loom waits for CuPy's "stream" on the host.
    a = fresh()
    with producer:
        produce(a, 3.0)
        assert a.__cuda_array_interface__["stream"] == producer.ptr
        t = loom.from_cuda_array_interface(a)
        assert producer.done, "from_cuda_array_interface returned before the producer was done"
    assert all_equal(cupy.asarray(_CAIOnly(t)), 3.0)

    # The CUDA array interface with the consumer's stream: an event, no wait on the host.
    a = fresh()
    with producer:
        produce(a, 4.0)
        t = loom.from_cuda_array_interface(a, stream=consumer.ptr)
        assert not producer.done, "from_cuda_array_interface(stream=...) waited on the host"
    assert t.__cuda_array_interface__["stream"] == consumer.ptr
    with consumer:
        copy = cupy.asarray(_CAIOnly(t)).copy()
    consumer.synchronize()
    assert all_equal(copy, 4.0), "the consumer's stream read before the producer wrote"


# ---- 4. a session on cuda:0 against NumPy, and its result in PyTorch --------------------------

def _matmul_add_reduce_graph():
    g = loom.Graph()
    a = g.placeholder("a", loom.float32, [64, 128])
    b = g.placeholder("b", loom.float32, [128, 32])
    c = g.placeholder("c", loom.float32, [32])
    mm = loom.ops.matmul(a, b, device="cuda:0", name="mm")
    z = loom.ops.add(mm, c, device="cuda:0", name="z")
    r = loom.ops.reduce_sum(z, axes=[0], device="cuda:0", name="r")
    # Copies to the host, made by loom (the partitioner's d2h transfer).
    z_host = loom.ops.identity(z, device="cpu:0", name="z_host")
    r_host = loom.ops.identity(r, device="cpu:0", name="r_host")
    return g, (a, b, c), (z, r, z_host, r_host)


def _matmul_add_reduce_inputs():
    rng = np.random.default_rng(2024)
    return (rng.standard_normal((64, 128)).astype(np.float32),
            rng.standard_normal((128, 32)).astype(np.float32),
            rng.standard_normal(32).astype(np.float32))


def test_session_matmul_add_reduce_on_gpu_matches_numpy():
    g, (a, b, c), fetches = _matmul_add_reduce_graph()
    av, bv, cv = _matmul_add_reduce_inputs()
    z, r, z_host, r_host = loom.Session(g).run(list(fetches), {a: av, b: bv, c: cv})
    assert z.device == "cuda:0" and r.device == "cuda:0"
    assert z.shape == (64, 32) and r.shape == (32,)
    assert z.dtype == loom.float32 and r.dtype == loom.float32
    want_z = av.astype(np.float64) @ bv.astype(np.float64) + cv.astype(np.float64)
    want_r = want_z.sum(axis=0)
    got_z, got_r = _host(z_host), _host(r_host)
    # cuBLAS with FP32 compute (no TF32): about sqrt(K) * 2^-24 relative, in norm.
    assert _relative_error(got_z, want_z) < 1e-5
    assert _relative_error(got_r, want_r) < 1e-5
    np.testing.assert_allclose(got_z, want_z, rtol=1e-4, atol=1e-4 * np.abs(want_z).max())
    np.testing.assert_allclose(got_r, want_r, rtol=1e-4, atol=1e-4 * np.abs(want_r).max())
    # The GPU tensor is ordered on its device's compute stream (docs/cuda.md), not on none.
    stream = z.__cuda_array_interface__["stream"]
    assert isinstance(stream, int) and stream > 2, stream


def test_session_gpu_result_goes_to_torch_without_a_copy():
    torch = _torch_cuda()
    g, (a, b, c), fetches = _matmul_add_reduce_graph()
    av, bv, cv = _matmul_add_reduce_inputs()
    z, r, z_host, r_host = loom.Session(g).run(list(fetches), {a: av, b: bv, c: cv})
    for t, host in ((z, z_host), (r, r_host)):
        x = torch.from_dlpack(t)
        assert x.is_cuda and x.device.index == 0
        assert x.data_ptr() == t.data_ptr
        assert tuple(x.shape) == t.shape and x.dtype == torch.float32
        assert torch.equal(x.cpu(), torch.from_numpy(_host(host).copy()))


# ---- 5. loom's pool behind PyTorch for a training loop, in a fresh process -----------------

TRAINING_SCRIPT = textwrap.dedent("""
    import gc
    import torch
    import loom, loom.cuda

    loom.cuda.use_in_torch()  # before PyTorch's first CUDA allocation
    torch.manual_seed(0)
    cpu = torch.Generator().manual_seed(0)
    dev = torch.device("cuda:0")

    def torch_share():
        return loom.memory.stats(device="cuda:0", library="torch")

    x = torch.randn(512, 16, generator=cpu).to(dev)
    w = torch.randn(16, 1, generator=cpu).to(dev)
    y = torch.tanh(x @ w / 4) * 4 + 0.01 * torch.randn(512, 1, generator=cpu).to(dev)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    during = pool = None
    for step in range(50):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if step == 25:  # activations, gradients, Adam's state: all PyTorch's, all loom's
            during = torch_share()
            pool = loom.memory.stats(device="cuda:0")
        opt.step()
        losses.append(loss.item())

    assert losses[-1] < losses[0] / 5, ("the loss did not fall", losses[0], losses[-1])
    assert during["bytes_in_use"] > 0 and during["allocations_in_use"] > 0, during
    assert during["peak_bytes_in_use"] >= during["bytes_in_use"], during
    assert during["num_allocs"] > 0, during
    # The pool's figures are everyone's: at least PyTorch's share, which it lists.
    assert pool["pool"]["bytes_in_use"] >= during["bytes_in_use"], (pool, during)
    assert pool["libraries"]["torch"]["bytes_in_use"] == during["bytes_in_use"], (pool, during)
    assert pool["pool"]["peak_bytes_in_use"] >= during["peak_bytes_in_use"], (pool, during)

    # PyTorch asks loom for exactly what a tensor needs.
    before = torch_share()["bytes_in_use"]
    probe = torch.empty(1 << 20, dtype=torch.float32, device=dev)
    assert torch_share()["bytes_in_use"] == before + (4 << 20), (before, torch_share())
    del probe
    assert torch_share()["bytes_in_use"] == before, (before, torch_share())

    del model, opt, loss, x, w, y
    gc.collect()
    torch.cuda.synchronize()
    # cuBLAS's workspaces are PyTorch allocations too, kept per handle and stream until
    # cleared.
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.synchronize()
    gc.collect()
    after = torch_share()
    assert after["bytes_in_use"] == 0, ("PyTorch's share did not return to 0", after)
    assert after["allocations_in_use"] == 0, after
    assert after["peak_bytes_in_use"] >= during["bytes_in_use"], (after, during)
    assert after["num_deallocs"] == after["num_allocs"], after
""")


def test_torch_trains_an_mlp_on_loom_pool_in_a_fresh_process():
    torch = _torch_cuda()
    if not hasattr(getattr(torch.cuda, "memory", None), "CUDAPluggableAllocator"):
        pytest.skip(f"PyTorch {torch.__version__} has no CUDAPluggableAllocator")
    env = dict(os.environ)
    # The child imports this very loom package, wherever pytest found it.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(loom.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    result = subprocess.run([sys.executable, "-c", TRAINING_SCRIPT], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, (
        f"the training process failed (exit {result.returncode}):\n{result.stderr}")
    assert result.stdout == "", f"the training process printed:\n{result.stdout}"


# ---- 6. out of memory on the GPU is a typed error ------------------------------------------

def test_gpu_out_of_memory_is_a_memory_error_naming_the_pool_and_recovers():
    loom.cuda.serve(0)  # the process's pool of cuda:0 behind loom.memory.allocate
    _, total = loom.cuda._c.memory_info(0)
    too_big = 2 * total + (1 << 30)  # more than the card has, under the pool's chunk limit
    huge = 1 << 50                   # past the largest chunk a pool can hold
    before = loom.memory.stats(device="cuda:0")["pool"]
    with pytest.raises(MemoryError) as plain:
        loom.memory.allocate(too_big, device="cuda:0")
    with pytest.raises(MemoryError) as counted:
        loom.memory.allocate(huge, device="cuda:0", library="py.oom")
    for info, size in ((plain, too_big), (counted, huge)):
        message = str(info.value)
        assert "cuda:0" in message, message                   # the device's pool
        assert str(size) in message, message                  # the request
        assert "fragmentation" in message, message            # the pool's report
        assert "largest free block" in message, message
    after = loom.memory.stats(device="cuda:0")["pool"]
    assert after["num_failed_allocs"] == before["num_failed_allocs"] + 2, (before, after)
    assert after["bytes_in_use"] == before["bytes_in_use"], (before, after)

    # The pool still serves: a normal block, counted and given back.
    p = loom.memory.allocate(1 << 20, device="cuda:0", library="py.after_oom")
    assert p % 64 == 0
    assert loom.memory.stats(device="cuda:0", library="py.after_oom")["bytes_in_use"] == 1 << 20
    loom.memory.deallocate(p, 1 << 20, device="cuda:0", library="py.after_oom")
    assert loom.memory.stats(device="cuda:0", library="py.after_oom")["bytes_in_use"] == 0

    # And a session still runs on cuda:0.
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [1000])
    y = loom.ops.exp(x, device="cuda:0", name="e")
    y_host = loom.ops.identity(y, device="cpu:0", name="e_host")
    xv = np.linspace(-5, 5, 1000, dtype=np.float32)
    yt, yh = loom.Session(g).run([y, y_host], {x: xv})
    assert yt.device == "cuda:0"
    np.testing.assert_allclose(_host(yh), np.exp(xv.astype(np.float64)), rtol=1e-5)


def test_trim_gives_a_freed_region_back_to_cuda():
    loom.cuda.serve(0)
    pool = loom.memory.stats(device="cuda:0")["pool"]
    # More than all the pool's free bytes together, so it takes a region of its own for it.
    size = max(256 << 20, (pool["free_bytes"] + (64 << 20)) // 256 * 256)
    p = loom.memory.allocate(size, device="cuda:0", library="py.trim")
    grown = loom.memory.stats(device="cuda:0")["pool"]
    assert grown["bytes_reserved"] >= pool["bytes_reserved"] + size, (pool, grown)
    loom.memory.deallocate(p, size, device="cuda:0", library="py.trim")
    released = loom.cuda.trim(0)
    assert released >= size, (released, size)
    trimmed = loom.memory.stats(device="cuda:0")["pool"]
    assert trimmed["bytes_reserved"] == grown["bytes_reserved"] - released, (grown, trimmed)


# ---- 7. bad input on the GPU is refused as on the CPU ----------------------------------------

def _without_devices(message):
    return re.sub(r"(/device:)?(cuda_host|cuda|cpu|CUDA_HOST|CUDA|CPU):\d+", "<device>", message)


def _failure(device, op, a_shape, b_shape):
    g = loom.Graph()
    a = g.placeholder("a", loom.float32, [None] * len(a_shape))
    b = g.placeholder("b", loom.float32, [None] * len(b_shape))
    y = g.op(op, [a, b], name="bad", device=device)  # shapes known only when fed
    s = loom.Session(g)
    with pytest.raises(Exception) as info:
        s.run(y, {a: np.ones(a_shape, np.float32), b: np.ones(b_shape, np.float32)})
    return info.value


@pytest.mark.parametrize("op, a_shape, b_shape, words", [
    ("matmul", (2, 3), (4, 5), ["inner dimensions differ", "[2, 3]", "[4, 5]", "K = 3",
                                "K = 4"]),
    ("add", (2, 3), (4,), ["do not broadcast", "[2, 3]", "[4]"]),
])
def test_bad_shapes_on_the_gpu_are_refused_as_on_the_cpu(op, a_shape, b_shape, words):
    on_gpu = _failure("cuda:0", op, a_shape, b_shape)
    on_cpu = _failure("cpu:0", op, a_shape, b_shape)
    assert isinstance(on_cpu, loom.NodeError), repr(on_cpu)
    assert type(on_gpu) is type(on_cpu), (repr(on_gpu), repr(on_cpu))
    gpu_message, cpu_message = str(on_gpu), str(on_cpu)
    assert "CUDA:0" in gpu_message.upper(), gpu_message  # it did run on the GPU
    assert f"'bad' ({op})" in gpu_message, gpu_message
    for w in words:
        assert w in gpu_message, (w, gpu_message)
    assert _without_devices(gpu_message) == _without_devices(cpu_message), (gpu_message,
                                                                             cpu_message)
    gc.collect()


def test_gpu_results_are_read_on_the_host_through_the_session():
    xv = (np.arange(12, dtype=np.float32) - 4.0).reshape(3, 4)
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, list(xv.shape))
    y = loom.ops.mul(x, x, device="cuda:0", name="square")
    s = loom.Session(g)
    out = s.run(y, {x: xv})
    assert out.device == "cuda:0"
    # NumPy would read a device address on the host: refused by name, not a crash.
    with pytest.raises(TypeError, match="cuda:0"):
        np.asarray(out)
    host = s.host_value(out)
    assert host.device.startswith("cpu")
    np.testing.assert_array_equal(np.asarray(host), xv * xv)
    assert s.host_value(host).data_ptr == host.data_ptr  # host memory: itself
