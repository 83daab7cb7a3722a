"""loom's host pool as NumPy's allocator (NEP 49): arrays draw from it, statistics tell
NumPy's share from loom's, uninstalling is safe with arrays from the pool still alive."""
import gc

import numpy as np

import loom


def test_install_uninstall_and_statistics():
    assert not loom.memory.numpy_allocator_installed()
    before = loom.memory.stats()["numpy"]
    assert loom.memory.install_numpy_allocator() is True
    assert loom.memory.install_numpy_allocator() is False
    try:
        big = np.ones(1 << 20, np.float64)      # 8 MiB from loom's pool
        during = loom.memory.stats()
        assert during["numpy"]["bytes_in_use"] - before["bytes_in_use"] >= 8 << 20
        assert during["pool"]["bytes_in_use"] >= during["numpy"]["bytes_in_use"]
        z = np.zeros((100, 100))                 # calloc
        assert z.sum() == 0
        grown = np.resize(np.arange(10), 1000)    # new array; realloc paths inside NumPy
        assert grown[999] == 9
        t = loom.Tensor(np.arange(5, dtype=np.float32))  # loom's own, same pool
        assert loom.memory.stats()["loom"]["bytes_in_use"] > 0
    finally:
        assert loom.memory.uninstall_numpy_allocator() is True
    assert not loom.memory.numpy_allocator_installed()
    # Arrays from loom's pool outlive the handler's installation.
    big[:] = 2.0
    assert big.sum() == 2.0 * (1 << 20)
    in_use = loom.memory.stats()["numpy"]["bytes_in_use"]
    del big, z, grown
    gc.collect()
    assert loom.memory.stats()["numpy"]["bytes_in_use"] <= in_use - (8 << 20)
    np.testing.assert_array_equal(np.asarray(t), np.arange(5, dtype=np.float32))
    assert loom.memory.uninstall_numpy_allocator() is False
