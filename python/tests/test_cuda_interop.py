"""GPU interop: per-library statistics of loom's pools (on cpu:0 here, where every machine
has a pool), the C ABI and PyTorch's allocator functions exported from the extension, the
plug-ins' glue against stand-ins for CuPy and Numba, DLPack and the CUDA array interface for
tensors on GPUs (imports need no CUDA call, so fake device addresses serve where nothing
reads them), and, with a GPU and CUDA-enabled PyTorch, the real thing."""
import ctypes
import gc
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import torch

import loom
import loom.cuda

GPU = loom.cuda.is_available()
TORCH_GPU = GPU and torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not TORCH_GPU, reason="needs a GPU and CUDA-enabled PyTorch")

# An address nobody dereferences, 256-byte aligned like cudaMalloc's.
FAKE_ADDRESS = 0x7F3A00000000


def lib():
    return ctypes.CDLL(loom.cuda.library_path())


# ---- per-library statistics (cpu:0) --------------------------------------------------------

def test_each_library_counts_its_own_blocks_and_the_pool_counts_all():
    gc.collect()  # no tensor of an earlier test goes back to the pool meanwhile
    before = loom.memory.stats()
    a = loom.memory.allocate(1000, library="py.torch")
    b = loom.memory.allocate(24, library="py.torch", alignment=256)
    c = loom.memory.allocate(3000, library="py.cupy")
    assert b % 256 == 0
    torch_share = loom.memory.stats(library="py.torch")
    assert torch_share["bytes_in_use"] == 1024
    assert torch_share["num_allocs"] == 2
    assert torch_share["allocations_in_use"] == 2
    assert torch_share["peak_bytes_in_use"] == 1024
    assert loom.memory.stats(device="cpu:0", library="py.cupy")["bytes_in_use"] == 3000
    during = loom.memory.stats()
    assert during["pool"]["bytes_in_use"] == before["pool"]["bytes_in_use"] + 4024
    assert during["libraries"]["py.torch"]["bytes_in_use"] == 1024
    assert during["libraries"]["py.cupy"]["bytes_in_use"] == 3000
    # loom's own share is the pool less every library's: unchanged by these.
    assert during["loom"]["bytes_in_use"] == before["loom"]["bytes_in_use"]
    assert "py.torch" in loom.memory.libraries()

    loom.memory.deallocate(a, 1000, library="py.torch")
    after_one = loom.memory.stats(library="py.torch")
    assert after_one["bytes_in_use"] == 24
    assert after_one["peak_bytes_in_use"] == 1024
    assert after_one["num_deallocs"] == 1
    loom.memory.deallocate(b, 24, library="py.torch", alignment=256)
    loom.memory.deallocate(c, 3000, library="py.cupy")
    assert loom.memory.stats()["pool"]["bytes_in_use"] == before["pool"]["bytes_in_use"]
    assert loom.memory.stats(library="py.cupy")["allocations_in_use"] == 0


def test_statistics_errors_and_unknown_libraries():
    assert loom.memory.stats(library="py.never")["bytes_in_use"] == 0
    assert loom.memory.stats(library="py.never")["num_allocs"] == 0
    with pytest.raises(ValueError, match="empty"):
        loom.memory.stats(library="")
    with pytest.raises(ValueError, match="longer than 63"):
        loom.memory.allocate(8, library="x" * 64)
    with pytest.raises(KeyError, match="cuda_managed:9"):
        loom.memory.stats(device="cuda_managed:9")
    with pytest.raises(KeyError):
        loom.memory.allocate(8, device="cuda_managed:9", library="py.x")
    with pytest.raises(ValueError):
        loom.memory.stats(device="tpu:0")
    with pytest.raises(ValueError):
        loom.memory.allocate(8, alignment=3)
    with pytest.raises(MemoryError):
        loom.memory.allocate(1 << 63)
    p = loom.memory.allocate(64, library="py.owner")
    with pytest.raises(ValueError, match="py.stranger"):
        loom.memory.deallocate(p, 64, library="py.stranger")
    assert loom.memory.stats(library="py.owner")["bytes_in_use"] == 64  # not freed
    loom.memory.deallocate(p, 64, library="py.owner")
    # NumPy's share is a library too.
    assert set(loom.memory.stats(library="numpy")) >= {"bytes_in_use", "num_allocs"}


class LoomDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


def test_the_c_abi_of_the_extension_is_the_same_registry():
    c = lib()
    c.loom_allocate_for.restype = ctypes.c_void_p
    c.loom_allocate_for.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                    LoomDevice, ctypes.c_void_p]
    c.loom_deallocate_for.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_size_t, LoomDevice, ctypes.c_void_p]
    cpu = LoomDevice(1, 0)
    p = c.loom_allocate_for(b"py.ctypes", 4096, 0, cpu, None)
    assert p
    ctypes.memset(p, 0x5A, 4096)
    assert loom.memory.stats(library="py.ctypes")["bytes_in_use"] == 4096
    c.loom_deallocate_for(b"py.ctypes", p, 4096, 0, cpu, None)
    assert loom.memory.stats(library="py.ctypes")["bytes_in_use"] == 0


def test_torch_allocator_functions_are_exported():
    c = lib()
    c.loom_torch_malloc.restype = ctypes.c_void_p
    c.loom_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    c.loom_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                  ctypes.c_void_p]
    assert c.loom_torch_malloc(-1, 0, None) is None  # a negative size is refused
    c.loom_torch_free(None, 0, 0, None)              # NULL does nothing
    if not GPU:
        assert c.loom_torch_malloc(1024, 0, None) is None  # no GPU: NULL, never an exception
    assert loom._loom._cuda.torch_malloc == "loom_torch_malloc"


def test_blocks_free_themselves():
    before = loom.memory.stats(library="py.block")["bytes_in_use"]
    block = loom.cuda.Block(5000, "cpu:0", "py.block", alignment=128)
    assert int(block) % 128 == 0
    ctypes.memset(block.ptr, 1, 5000)
    assert loom.memory.stats(library="py.block")["bytes_in_use"] == before + 5000
    del block
    gc.collect()
    assert loom.memory.stats(library="py.block")["bytes_in_use"] == before
    other = loom.cuda.Block(10, "cpu:0", "py.block")
    other.free()
    other.free()  # once only
    assert loom.memory.stats(library="py.block")["num_deallocs"] == 2
    with pytest.raises(ValueError):
        loom.cuda.Block(10, "cpu:0", "")


# ---- plug-ins without their libraries ------------------------------------------------------

def test_torch_allocator_needs_a_pytorch_that_has_pluggable_allocators():
    if hasattr(torch.cuda, "memory") and hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        pytest.skip("this PyTorch has CUDAPluggableAllocator")
    with pytest.raises(RuntimeError, match="CUDAPluggableAllocator"):
        loom.cuda.torch_allocator()
    with pytest.raises(RuntimeError, match="PyTorch 2.0"):
        loom.cuda.use_in_torch()


@pytest.mark.parametrize("package, call", [
    ("cupy", lambda: loom.cuda.cupy_allocator()),
    ("cupy", lambda: loom.cuda.use_in_cupy()),
    ("numba.cuda", lambda: loom.cuda.use_in_numba()),
    ("numba.cuda", lambda: loom.cuda.NumbaLoomMemoryManager),
])
def test_plugins_say_which_package_is_missing(monkeypatch, package, call):
    monkeypatch.setattr(loom.cuda, "_numba_manager", None)
    monkeypatch.setitem(sys.modules, package.split(".")[0], None)  # makes the import fail
    with pytest.raises(ImportError, match=f"'{package}'"):
        call()


def test_unknown_attributes_are_attribute_errors():
    with pytest.raises(AttributeError, match="no_such"):
        loom.cuda.no_such  # noqa: B018


# ---- the plug-ins' glue, against stand-ins (allocating on cpu:0) ----------------------------

class _HostBlock(loom.cuda.Block):
    """A Block that takes "cuda:N" to mean cpu:0, so the glue runs without a GPU."""

    __slots__ = ()

    def __init__(self, size, device, library, **kwargs):
        assert device.startswith("cuda:")
        super().__init__(size, "cpu:0", library, **{**kwargs, "stream": 0})


def test_cupy_allocator_glue(monkeypatch):
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace()
    calls = {}

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    cupy.cuda.UnownedMemory = UnownedMemory
    cupy.cuda.MemoryPointer = MemoryPointer
    cupy.cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0)
    cupy.cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=777)
    cupy.cuda.set_allocator = lambda f: calls.setdefault("allocator", f)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(loom.cuda, "is_available", lambda: True)
    monkeypatch.setattr(loom.cuda, "serve", lambda ordinal: calls.setdefault("served", ordinal))
    seen = {}

    class RecordingBlock(_HostBlock):
        __slots__ = ()

        def __init__(self, size, device, library, **kwargs):
            seen.update(device=device, library=library, stream=kwargs.get("stream"))
            super().__init__(size, device, library, **kwargs)

    monkeypatch.setattr(loom.cuda, "Block", RecordingBlock)
    allocate = loom.cuda.use_in_cupy()
    assert calls["allocator"] is allocate
    before = loom.memory.stats(library="cupy")["bytes_in_use"]
    pointer = allocate(12345)
    assert seen == {"device": "cuda:0", "library": "cupy", "stream": 777}
    assert calls["served"] == 0
    assert pointer.ptr == pointer.mem.owner.ptr and pointer.mem.size == 12345
    assert loom.memory.stats(library="cupy")["bytes_in_use"] == before + 12345
    del pointer  # CuPy drops its memory: the block goes back to loom
    gc.collect()
    assert loom.memory.stats(library="cupy")["bytes_in_use"] == before


def test_numba_memory_manager_glue(monkeypatch):
    numba = types.ModuleType("numba")
    cuda = types.ModuleType("numba.cuda")
    cudadrv = types.ModuleType("numba.cuda.cudadrv")
    driver = types.ModuleType("numba.cuda.cudadrv.driver")
    driver.USE_NV_BINDING = False
    events = []

    class HostOnlyCUDAMemoryManager:
        def __init__(self, *args, **kwargs):
            self.context = kwargs.pop("context")

        def initialize(self):
            events.append("host initialize")

        def reset(self):
            events.append("host reset")

        def defer_cleanup(self):
            import contextlib

            @contextlib.contextmanager
            def deferred():
                events.append("host defer")
                yield
            return deferred()

    class GetIpcHandleMixin:
        def get_ipc_handle(self, memory):
            return ("ipc", memory)

    class MemoryPointer:
        def __init__(self, context, pointer, size, finalizer=None):
            self.context, self.device_pointer, self.size = context, pointer, size
            self.finalizer = finalizer

        def free(self):
            self.finalizer()

    cuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager
    cuda.GetIpcHandleMixin = GetIpcHandleMixin
    cuda.MemoryPointer = MemoryPointer
    cuda.MemoryInfo = lambda free, total: (free, total)
    cuda.set_memory_manager = lambda cls: events.append(("set", cls))
    numba.cuda = cuda
    for name, module in [("numba", numba), ("numba.cuda", cuda), ("numba.cuda.cudadrv", cudadrv),
                         ("numba.cuda.cudadrv.driver", driver)]:
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(loom.cuda, "_numba_manager", None)
    monkeypatch.setattr(loom.cuda, "Block", _HostBlock)
    monkeypatch.setattr(loom.cuda, "serve", lambda ordinal: events.append(("serve", ordinal)))

    manager_class = loom.cuda.use_in_numba()
    assert events[-1] == ("set", manager_class)
    assert loom.cuda.NumbaLoomMemoryManager is manager_class
    # Numba first makes one with no context, to read the interface version.
    assert manager_class(context=None).interface_version == 1
    context = types.SimpleNamespace(device=types.SimpleNamespace(id=0))
    manager = manager_class(context=context)
    manager.initialize()
    assert events[-2:] == ["host initialize", ("serve", 0)]
    before = loom.memory.stats(library="numba")["bytes_in_use"]
    memory = manager.memalloc(4096)
    assert memory.size == 4096 and memory.context is context
    assert isinstance(memory.device_pointer, ctypes.c_uint64) and memory.device_pointer.value
    assert loom.memory.stats(library="numba")["bytes_in_use"] == before + 4096
    assert manager.get_ipc_handle(memory) == ("ipc", memory)
    memory.free()  # Numba runs the finalizer when the memory's last reference goes
    assert loom.memory.stats(library="numba")["bytes_in_use"] == before
    with manager.defer_cleanup():
        assert events[-1] == "host defer"
    manager.reset()
    assert events[-1] == "host reset"


# ---- DLPack and the CUDA array interface for GPU memory (no CUDA call needed) -------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]


class FakeGpuProducer:
    """A DLPack producer of a float32 [2, 3] tensor at FAKE_ADDRESS on (device_type, id),
    following the protocol: records the arguments of __dlpack__ and counts deleter calls."""

    def __init__(self, device_type=2, device_id=0):
        self.device = (device_type, device_id)
        self.calls = []
        self.deleted = 0
        self.shape = (ctypes.c_int64 * 2)(2, 3)
        self.managed = _DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = FAKE_ADDRESS
        t.device = _DLDevice(device_type, device_id)
        t.ndim = 2
        t.dtype = _DLDataType(2, 32, 1)
        t.shape = self.shape
        t.strides = None

        def deleter(_):
            self.deleted += 1
        self.deleter = _DELETER(deleter)
        self.managed.deleter = self.deleter

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):  # a DLPack 0.x producer: no max_version
        self.calls.append(stream)
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)


def test_dlpack_import_of_gpu_memory_with_a_stream_needs_no_cuda_call():
    producer = FakeGpuProducer(2, 0)
    t = loom.from_dlpack(producer, stream=0x5000)
    assert producer.calls == [0x5000]  # the producer orders its work before our stream
    assert t.device == "cuda:0"
    assert t.shape == (2, 3) and t.dtype == loom.float32
    assert t.data_ptr == FAKE_ADDRESS
    assert t.__dlpack_device__() == (2, 0)
    # The CUDA array interface reports the stream the buffer is ordered on.
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (2, 3) and cai["typestr"] == "<f4"
    assert cai["data"] == (FAKE_ADDRESS, False)
    assert cai["strides"] is None
    assert cai["stream"] == 0x5000
    assert not hasattr(loom.Tensor(np.zeros(2)), "__cuda_array_interface__")
    # Export: -1 asks for no synchronisation (no CUDA call).
    capsule = t.__dlpack__(stream=-1)
    back = loom.from_dlpack(capsule)
    assert back.device == "cuda:0" and back.data_ptr == FAKE_ADDRESS
    with pytest.raises(BufferError, match="ambiguous"):
        t.__dlpack__(stream=0)
    with pytest.raises(BufferError, match="-3"):
        t.__dlpack__(stream=-3)
    with pytest.raises(BufferError, match="copies host memory only"):
        t.__dlpack__(stream=-1, copy=True)
    with pytest.raises(BufferError, match=r"\(2, 0\) only"):
        t.__dlpack__(stream=-1, dl_device=(2, 1))
    with pytest.raises(TypeError, match="stream"):
        t.__dlpack__(stream="fast")
    del t, back, capsule
    gc.collect()
    assert producer.deleted == 1


def test_managed_and_pinned_imports_keep_their_kind():
    managed = loom.from_dlpack(FakeGpuProducer(13, 1), stream=2)
    assert managed.device == "cuda_managed:1"
    assert managed.__dlpack_device__() == (13, 1)
    pinned_producer = FakeGpuProducer(3, 0)
    pinned = loom.from_dlpack(pinned_producer)  # host memory: no stream, no CUDA call
    assert pinned_producer.calls == [None]
    assert pinned.device == "cuda_host:0"
    assert not hasattr(pinned, "__cuda_array_interface__")


def test_dlpack_import_refuses_other_devices_and_bad_streams():
    with pytest.raises(BufferError, match="ROCm|\\(10, 0\\)"):
        loom.from_dlpack(FakeGpuProducer(10, 0))
    with pytest.raises(ValueError, match="no CUDA stream"):
        loom.from_dlpack(FakeGpuProducer(2, 0), stream=0)
    with pytest.raises(TypeError, match="stream"):
        loom.from_dlpack(FakeGpuProducer(2, 0), stream=1.5)
    t = loom.Tensor(np.arange(3.0))
    assert t.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.asarray(loom.from_dlpack(t.__dlpack__(stream=-1))),
                                  [0.0, 1.0, 2.0])


def test_trim_releases_nothing_before_a_pool_exists():
    if loom.cuda.is_available():
        pytest.skip("checks the path without a GPU pool")
    assert loom.cuda.trim() == 0
    assert loom.cuda.trim(3) == 0


@pytest.mark.skipif(GPU, reason="checks the errors without a GPU")
def test_without_a_gpu_the_cuda_calls_fail_clearly():
    producer = FakeGpuProducer(2, 0)
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        loom.from_dlpack(producer)  # loom's interop stream needs CUDA
    assert producer.calls == []       # nothing was asked of the producer
    t = loom.from_dlpack(producer, stream=7)
    with pytest.raises((TypeError, RuntimeError)):
        t.__dlpack__(stream=1)  # the handshake needs CUDA
    with pytest.raises((TypeError, RuntimeError)):
        loom.from_cuda_array_interface(t)  # where the pointer lives needs CUDA


# ---- the CUDA array interface: what is checked before any CUDA call ------------------------

class Interface:
    def __init__(self, **fields):
        self.__cuda_array_interface__ = fields


def good(**changes):
    fields = dict(shape=(2, 3), typestr="<f4", data=(FAKE_ADDRESS, False), version=3,
                  strides=None, stream=None)
    fields.update(changes)
    return Interface(**fields)


@pytest.mark.parametrize("obj, error, match", [
    (good(version=4), ValueError, "version 4"),
    (good(typestr=">f4"), TypeError, "big-endian"),
    (good(typestr="<c8"), TypeError, "no loom dtype"),
    (good(typestr="f"), TypeError, "not a typestr"),
    (good(strides=(12, 3)), ValueError, "multiple of the item size"),
    (good(strides=(4,)), ValueError, "1 strides for 2 dimensions"),
    (good(shape=(2, -1)), ValueError, "dimension 1 is -1"),
    (good(data=(0, False)), ValueError, "null pointer"),
    (good(stream=0), ValueError, "stream 0 is disallowed"),
    (good(stream=-4), ValueError, "no CUDA stream"),
    (good(mask=object()), TypeError, "masked"),
    (Interface(shape=(2,), typestr="<f4", version=3), ValueError, "no 'data'"),
    (Interface(shape=(2,), typestr="<f4", data=(FAKE_ADDRESS, False)), ValueError, "'version'"),
    (types.SimpleNamespace(__cuda_array_interface__=[1, 2]), TypeError, "not a dict"),
    (object(), TypeError, "no __cuda_array_interface__"),
])
def test_cuda_array_interface_import_checks_everything_first(obj, error, match):
    with pytest.raises(error, match=match):
        loom.from_cuda_array_interface(obj)


def test_cuda_array_interface_stream_argument_is_checked():
    with pytest.raises(ValueError, match="no CUDA stream"):
        loom.from_cuda_array_interface(good(), stream=0)


def test_asarray_takes_what_as_tensor_takes():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = loom.asarray(a)
    assert t.data_ptr == a.ctypes.data
    assert loom.asarray(t) is not None and loom.asarray(t).data_ptr == t.data_ptr
    x = torch.arange(4, dtype=torch.int64)
    assert loom.asarray(x).data_ptr == x.data_ptr()


# ---- with a GPU -----------------------------------------------------------------------------

@needs_gpu
def test_torch_gpu_tensors_round_trip_without_copies():
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    t = loom.from_dlpack(x)
    assert t.device == "cuda:0" and t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr()
    x[1, 2] = -5.0
    torch.cuda.synchronize()
    assert y[1, 2].item() == -5.0
    # Through the CUDA array interface both ways.
    z = torch.as_tensor(t, device="cuda")
    assert z.data_ptr() == x.data_ptr()
    u = loom.from_cuda_array_interface(x)
    assert u.data_ptr == x.data_ptr() and u.shape == (3, 4)
    assert torch.equal(torch.from_dlpack(u).cpu(), x.cpu())
    # A transposed view keeps its strides.
    v = loom.from_dlpack(x.t())
    assert v.strides == (1, 4)
    assert torch.equal(torch.from_dlpack(v).cpu(), x.t().cpu())


@needs_gpu
def test_import_waits_for_the_producers_stream():
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # a few hundred ms of GPU time
        x.fill_(7.0)
        t = loom.from_dlpack(x)  # PyTorch orders side before loom's stream; loom waits
    assert side.query()          # so the producer's work is done
    assert torch.from_dlpack(t)[-1].item() == 7.0


@needs_gpu
def test_export_makes_the_consumers_stream_wait():
    x = torch.ones(1 << 20, device="cuda")
    t = loom.from_dlpack(x)
    consumer = torch.cuda.Stream()
    capsule = t.__dlpack__(stream=consumer.cuda_stream)
    back = loom.from_dlpack(capsule, stream=consumer.cuda_stream)
    assert back.data_ptr == x.data_ptr()
    assert back.__cuda_array_interface__["stream"] == consumer.cuda_stream


@needs_gpu
def test_torch_allocates_from_loom_pool_in_a_fresh_process():
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        pytest.skip("this PyTorch has no CUDAPluggableAllocator")
    script = textwrap.dedent("""
        import torch, loom, loom.cuda
        loom.cuda.use_in_torch()
        x = torch.ones(1 << 20, device="cuda")
        s = loom.memory.stats(device="cuda:0", library="torch")
        assert s["bytes_in_use"] >= 4 << 20, s
        assert loom.memory.stats(device="cuda:0")["pool"]["bytes_in_use"] >= 4 << 20
        assert float(x.sum()) == 1 << 20
        del x
        torch.cuda.synchronize()
        assert loom.memory.stats(device="cuda:0", library="torch")["bytes_in_use"] == 0
    """)
    subprocess.run([sys.executable, "-c", script], check=True)


@needs_gpu
def test_cupy_and_numba_when_installed():
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        allocate = loom.cuda.cupy_allocator()
        pointer = allocate(1 << 20)
        assert loom.memory.stats(device="cuda:0", library="cupy")["bytes_in_use"] >= 1 << 20
        del pointer
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        if cupy is None:
            pytest.skip("neither CuPy nor Numba is installed")
        return
    script = textwrap.dedent("""
        import numpy as np, loom, loom.cuda
        from numba import cuda
        loom.cuda.use_in_numba()
        d = cuda.to_device(np.arange(1 << 18, dtype=np.float32))
        s = loom.memory.stats(device="cuda:0", library="numba")
        assert s["bytes_in_use"] >= 1 << 20, s
        t = loom.from_cuda_array_interface(d)
        assert t.data_ptr == d.__cuda_array_interface__["data"][0]
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
