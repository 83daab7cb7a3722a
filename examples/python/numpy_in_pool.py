"""Puts NumPy's allocations into loom's host pool (NEP 49) and prints the pool's figures per
library: NumPy's share, loom's own, and the pool holding both.

    python3 examples/python/numpy_in_pool.py
"""
import numpy as np

import loom

loom.memory.install_numpy_allocator()
try:
    before = loom.memory.stats()["numpy"]["bytes_in_use"]
    arrays = [np.ones((256, 1024), np.float32) for _ in range(4)]  # 4 x 1 MiB
    during = loom.memory.stats()
    print(f"{'':8} {'bytes in use':>14} {'allocations':>12}")
    for library in ("numpy", "loom", "pool"):
        st = during[library]
        print(f"{library:8} {st['bytes_in_use']:>14,} {st['allocations_in_use']:>12}")
    grown = during["numpy"]["bytes_in_use"] - before
    assert grown >= 4 * arrays[0].nbytes, grown
    assert during["pool"]["bytes_in_use"] >= during["numpy"]["bytes_in_use"]
    assert sum(float(a.sum()) for a in arrays) == 4 * 256 * 1024
    del arrays
    after = loom.memory.stats()["numpy"]["bytes_in_use"]
    assert after <= before, (before, after)  # freed back into the pool
    print(f"NumPy's 4 MiB came from loom's pool and went back to it ({after:,} bytes left in use)")
finally:
    loom.memory.uninstall_numpy_allocator()
