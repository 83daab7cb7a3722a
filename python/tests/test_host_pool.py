"""loom.memory.configure_host_pool: a preallocated, bounded host pool; tensors of the old
pool stay valid; a request past max_size is a MemoryError and the pool stays usable.
Runs in its own process (the host pool is process-wide)."""
import subprocess
import sys
import textwrap


def test_configure_host_pool_in_a_fresh_process():
    code = textwrap.dedent("""
        import numpy as np, loom
        old = loom.Tensor(np.arange(10, dtype=np.float32))
        loom.memory.configure_host_pool(initial_size=1 << 20, growth_step=0, max_size=1 << 20)
        st = loom.memory.stats()["pool"]
        assert st["bytes_reserved"] == 1 << 20, st
        a = loom.Tensor(np.ones(1000, np.float32))
        assert loom.memory.stats()["pool"]["bytes_in_use"] >= 4000
        try:
            loom.Tensor(np.ones(1 << 20, np.float32))        # 4 MiB > 1 MiB
        except MemoryError as e:
            assert "cpu:0" in str(e), e
        else:
            raise AssertionError("no MemoryError")
        b = loom.Tensor(np.ones(1000, np.float32))            # still usable
        assert np.asarray(b).sum() == 1000
        assert np.asarray(old).tolist() == list(range(10))    # the old pool's tensor
        try:
            loom.memory.configure_host_pool(granularity=3)
        except ValueError:
            pass
        else:
            raise AssertionError("granularity 3 accepted")
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
