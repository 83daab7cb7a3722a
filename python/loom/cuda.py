"""loom.cuda: loom's GPU pools behind PyTorch, CuPy and Numba.

One pool per GPU for the whole process: loom's sessions and, through these plug-ins, every
other library allocate from it, each under a library name whose share the statistics keep
apart (loom.memory.stats(device="cuda:0", library="torch"); the pool's own figures are the
total of everyone):

    import loom.cuda
    loom.cuda.use_in_torch()      # before PyTorch's first CUDA allocation
    loom.cuda.use_in_cupy()
    loom.cuda.use_in_numba()      # before Numba makes its first context
    loom.memory.stats(device="cuda:0", library="cupy")["bytes_in_use"]

PyTorch, CuPy and Numba are imported only when a plug-in is asked for; without them, or
without a GPU, the plug-ins raise ImportError or RuntimeError saying what is missing.
docs/interop.md and docs/cuda.md have the long form.
"""
import contextlib as _contextlib
import ctypes as _ctypes
import importlib as _importlib

from . import _loom

_c = _loom._cuda
_memory = _loom.memory

#: The name each plug-in allocates under.
TORCH, CUPY, NUMBA = "torch", "cupy", "numba"

#: PyTorch's kernels assume cudaMalloc's 256-byte alignment; so do CuPy's and Numba's.
ALIGNMENT = 256


def is_built():
    """True when loom was built with its CUDA backend."""
    return _c.available()


def device_count():
    """GPUs this process can use (0 without CUDA, a driver or a GPU)."""
    return _c.device_count()


def is_available():
    """True when loom can use at least one GPU."""
    return _c.device_count() > 0


def library_path():
    """The shared object exporting loom_torch_malloc and loom_torch_free (the extension)."""
    return _loom.__file__


def _require(module, what):
    try:
        return _importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{what} needs the Python package '{module}', which cannot be "
                          f"imported here: {e}") from e


def _require_gpu(what):
    if not is_available():
        raise RuntimeError(f"{what}: loom sees no GPU: {_c.availability()}")


def trim(ordinal=0):
    """Hands the wholly free regions of GPU `ordinal`'s pool back to CUDA (memory released at
    run time); returns the bytes released, 0 when that pool was never made."""
    return _c.trim(ordinal)


def serve(ordinal):
    """Makes the process's pool of GPU `ordinal` serve the C ABI (the plug-ins call it)."""
    _c.serve_c_api(ordinal)


class Block:
    """A block of loom's pool for `device` ("cuda:0", "cpu:0"), counted for `library`,
    given back when the Block is collected (or by free(), once).

    `stream` (a cudaStream_t as an int, 0 for the default stream) is where the block is
    used: the pool hands it out ready for that stream and takes it back on it.
    """

    __slots__ = ("ptr", "size", "device", "library", "alignment", "stream", "__weakref__")

    def __init__(self, size, device, library, *, stream=0, alignment=ALIGNMENT):
        self.ptr = 0
        self.size = int(size)
        self.device = device
        self.library = library
        self.alignment = alignment
        self.stream = stream
        self.ptr = _memory.allocate(self.size, device=device, library=library,
                                    alignment=alignment, stream=stream)

    def free(self):
        """Gives the block back to the pool; later calls do nothing."""
        ptr, self.ptr = self.ptr, 0
        if ptr:
            _memory.deallocate(ptr, self.size, device=self.device, library=self.library,
                               alignment=self.alignment, stream=self.stream)

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001 - never raise from a finalizer (interpreter exit)
            pass

    def __int__(self):
        return self.ptr

    def __repr__(self):
        return (f"loom.cuda.Block({self.size} bytes at 0x{self.ptr:x} on {self.device} "
                f"for {self.library!r})")


# ---- PyTorch --------------------------------------------------------------------------------

def torch_allocator():
    """A torch.cuda.memory.CUDAPluggableAllocator over loom's pools (Note [torch allocator],
    python/src/cuda_bindings.cpp): PyTorch's GPU memory then comes from loom's pool of each
    GPU, counted under "torch". Needs PyTorch 2.0 or later."""
    torch = _require("torch", "loom.cuda.torch_allocator()")
    pluggable = getattr(getattr(torch.cuda, "memory", None), "CUDAPluggableAllocator", None)
    if pluggable is None:
        raise RuntimeError(f"loom.cuda.torch_allocator(): PyTorch {torch.__version__} has no "
                           "torch.cuda.memory.CUDAPluggableAllocator (PyTorch 2.0 added it)")
    return pluggable(library_path(), _c.torch_malloc, _c.torch_free)


def use_in_torch():
    """Makes loom's pools PyTorch's CUDA allocator (torch.cuda.memory.
    change_current_allocator), which PyTorch allows only before its first CUDA allocation.
    Returns the allocator."""
    torch = _require("torch", "loom.cuda.use_in_torch()")
    allocator = torch_allocator()
    _require_gpu("loom.cuda.use_in_torch()")
    torch.cuda.memory.change_current_allocator(allocator)
    return allocator


# ---- CuPy ---------------------------------------------------------------------------------

def cupy_allocator(library=CUPY):
    """A CuPy allocator (for cupy.cuda.set_allocator) over loom's pools: each allocation is a
    Block on CuPy's current device and stream, wrapped in cupy.cuda.UnownedMemory whose
    owner is the Block, so the block goes back to loom when CuPy drops the memory."""
    cupy = _require("cupy", "loom.cuda.cupy_allocator()")
    _require_gpu("loom.cuda.cupy_allocator()")
    served = set()

    def allocate(size):
        ordinal = cupy.cuda.runtime.getDevice()
        if ordinal not in served:
            serve(ordinal)
            served.add(ordinal)
        stream = cupy.cuda.get_current_stream().ptr
        block = Block(size, f"cuda:{ordinal}", library, stream=stream)
        memory = cupy.cuda.UnownedMemory(block.ptr, block.size, block, ordinal)
        return cupy.cuda.MemoryPointer(memory, 0)

    return allocate


def use_in_cupy():
    """cupy.cuda.set_allocator(cupy_allocator()); returns the allocator."""
    cupy = _require("cupy", "loom.cuda.use_in_cupy()")
    allocator = cupy_allocator()
    cupy.cuda.set_allocator(allocator)
    return allocator


# ---- Numba --------------------------------------------------------------------------------

_numba_manager = None


def _make_numba_manager():
    cuda = _require("numba.cuda", "loom.cuda.NumbaLoomMemoryManager")
    driver = _importlib.import_module("numba.cuda.cudadrv.driver")

    class NumbaLoomMemoryManager(cuda.GetIpcHandleMixin, cuda.HostOnlyCUDAMemoryManager):
        """Numba's External Memory Management plug-in (interface version 1) over loom's
        pools: device memory from loom's pool of the context's GPU, counted under "numba";
        pinned and mapped host memory stay Numba's own (HostOnlyCUDAMemoryManager)."""

        library = NUMBA

        def initialize(self):
            super().initialize()
            serve(self.context.device.id)

        def memalloc(self, size):
            ordinal = self.context.device.id
            block = Block(size, f"cuda:{ordinal}", self.library)
            # numba-cuda releases that always use NVIDIA's bindings no longer have the flag.
            nv_binding = hasattr(getattr(driver, "binding", None), "CUdeviceptr")
            if getattr(driver, "USE_NV_BINDING", nv_binding):
                pointer = driver.binding.CUdeviceptr(block.ptr)
            else:
                pointer = _ctypes.c_uint64(block.ptr)
            # Numba calls the finalizer when the last reference to the memory goes.
            return cuda.MemoryPointer(self.context, pointer, block.size,
                                      finalizer=block.free)

        def get_memory_info(self):
            free, total = _c.memory_info(self.context.device.id)
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory):
            return super().get_ipc_handle(memory)

        def reset(self):
            # loom's pool is the process's, shared with others: nothing of it is reset here.
            super().reset()

        @_contextlib.contextmanager
        def defer_cleanup(self):
            with super().defer_cleanup():
                yield

        @property
        def interface_version(self):
            return 1

    return NumbaLoomMemoryManager


def use_in_numba():
    """numba.cuda.set_memory_manager(NumbaLoomMemoryManager), before Numba makes its first
    context. Returns the class."""
    cuda = _require("numba.cuda", "loom.cuda.use_in_numba()")
    manager = __getattr__("NumbaLoomMemoryManager")
    cuda.set_memory_manager(manager)
    return manager


def __getattr__(name):
    # NumbaLoomMemoryManager subclasses Numba's classes, so it is made when first asked for.
    global _numba_manager
    if name == "NumbaLoomMemoryManager":
        if _numba_manager is None:
            _numba_manager = _make_numba_manager()
        return _numba_manager
    raise AttributeError(f"module 'loom.cuda' has no attribute {name!r}")


# ---- statistics ---------------------------------------------------------------------------

def memory_stats(device="cuda:0", library=None):
    """loom.memory.stats(device, library): the pool of `device` and each library's share, or
    one library's figures."""
    return _memory.stats(device=device, library=library)


__all__ = [
    "ALIGNMENT", "Block", "CUPY", "NUMBA", "TORCH", "cupy_allocator",
    "device_count", "is_available", "is_built", "library_path", "memory_stats", "serve",
    "torch_allocator", "use_in_cupy", "use_in_numba", "use_in_torch",
]
