"""Shares memory with NumPy and PyTorch both ways, without copies: the same address on both
sides, writes on one side seen on the other, and a loom graph run on borrowed memory whose
result NumPy and PyTorch then read in place.

    python3 examples/python/zero_copy.py
"""
import numpy as np
import torch

import loom


def address(a):
    return a.__array_interface__["data"][0]


# NumPy -> loom: from_numpy borrows the array's buffer.
a = np.arange(12, dtype=np.float32).reshape(3, 4)
t = loom.from_numpy(a)
assert t.data_ptr == address(a)
a[0, 0] = 100.0
assert np.asarray(t)[0, 0] == 100.0  # loom sees NumPy's write

# loom -> NumPy: np.asarray wraps loom's memory.
back = np.asarray(t)
assert address(back) == t.data_ptr

# PyTorch -> loom and loom -> PyTorch through DLPack.
x = torch.linspace(-1, 1, 8)
lx = loom.from_dlpack(x)
assert lx.data_ptr == x.data_ptr()
tx = torch.from_dlpack(lx)
assert tx.data_ptr() == x.data_ptr()
x[3] = 42.0
assert torch.from_dlpack(lx)[3].item() == 42.0

# A graph run on PyTorch's memory; its result read in place by NumPy and PyTorch.
g = loom.Graph()
inp = g.placeholder("x", loom.float32, [None])
y = loom.ops.relu(inp * 2.0 - 1.0)
s = loom.Session(g)
out = s.run(y, {inp: x})  # the feed is x's memory, not a copy
as_numpy, as_torch = np.asarray(out), torch.from_dlpack(out)
assert address(as_numpy) == out.data_ptr == as_torch.data_ptr()
want = np.maximum(x.numpy() * 2 - 1, 0)
np.testing.assert_array_equal(as_numpy, want)
assert torch.equal(as_torch, torch.from_numpy(want))
print("NumPy and PyTorch share loom's memory both ways:", as_numpy.tolist())
