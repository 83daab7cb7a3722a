"""loom: a device-aware tensor runtime.

    import numpy as np, loom
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [None, 3])
    y = loom.ops.relu(x * 2.0)
    s = loom.Session(g)
    print(np.asarray(s.run(y, {x: np.ones((2, 3), np.float32)})))

Tensors share memory with NumPy (numpy.asarray, loom.from_numpy) and PyTorch
(torch.from_dlpack, loom.from_dlpack) without copies; see docs/interop.md.
"""
import contextlib as _contextlib

from . import _loom
from ._loom import (  # noqa: F401
    CancelledError,
    Graph,
    NodeError,
    Output,
    Session,
    Table,
    Tensor,
    as_tensor,
    deinterleave,
    dtype,
    from_arrow,
    from_cuda_array_interface,
    from_dlpack,
    from_numpy,
    interleave,
    memory,
    op_def,
    op_names,
    train,
)
from ._loom import distributed  # noqa: F401  (the world and communicators: mpirun)
from ._loom import amp  # noqa: F401  (automatic mixed precision: loom.amp.enable(graph))
from . import ops  # noqa: F401
from . import cuda  # noqa: F401  (imports PyTorch, CuPy or Numba only when asked to)
from . import onnx  # noqa: F401  (ONNX import; NumPy only)

float32 = dtype.float32
float64 = dtype.float64
float16 = dtype.float16
bfloat16 = dtype.bfloat16
int32 = dtype.int32
int64 = dtype.int64
int8 = dtype.int8
uint8 = dtype.uint8
bool_ = getattr(dtype, "bool")


@_contextlib.contextmanager
def _device(self, name):
    """Nodes added in the block ask for device `name` unless they ask for another."""
    self._push_device(name)
    try:
        yield self
    finally:
        self._pop_device()


Graph.device = _device


def tensor(data, dtype=None):
    """A loom.Tensor holding a copy of data (anything numpy.asarray takes)."""
    return Tensor(data, dtype)


def asarray(obj):
    """A loom.Tensor of obj without a copy where one is possible: a loom.Tensor, NumPy
    arrays, objects with __dlpack__ (PyTorch, CuPy) or __cuda_array_interface__ (Numba);
    else of numpy.asarray(obj). (as_tensor under the array API's name.)"""
    return as_tensor(obj)


__all__ = [
    "CancelledError", "Graph", "NodeError", "Output", "Session", "Table", "Tensor", "as_tensor",
    "asarray", "cuda", "deinterleave", "dtype", "from_arrow", "from_cuda_array_interface",
    "from_dlpack", "from_numpy", "interleave", "memory", "op_def", "op_names", "ops", "tensor",
    "float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8", "bool_",
]
