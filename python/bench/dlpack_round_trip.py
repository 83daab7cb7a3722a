"""DLPack round trips from Python, loom against PyTorch in the same run.

    PYTHONPATH=build/python python3 python/bench/dlpack_round_trip.py [--json]

Times loom.from_dlpack(t.__dlpack__()) for a loom tensor against PyTorch's own
torch.from_dlpack(x.__dlpack__()) (the peer: about 0.75 us here), both for a 1 KB
float32 tensor; also the object forms (from_dlpack(t), which asks for __dlpack_device__
and a versioned capsule first). Medians of 15 repetitions; the target is loom / PyTorch
<= 1.
"""
import json
import statistics
import sys
import timeit

import numpy as np
import torch

import loom

REPETITIONS = 15
NUMBER = 20000


def median_us(fn):
    fn()
    times = timeit.repeat(fn, number=NUMBER, repeat=REPETITIONS)
    return statistics.median(times) / NUMBER * 1e6


def main():
    t = loom.Tensor(np.zeros(256, np.float32))
    x = torch.zeros(256)
    rows = {
        "capsule": (median_us(lambda: loom.from_dlpack(t.__dlpack__())),
                    median_us(lambda: torch.from_dlpack(x.__dlpack__()))),
        "object": (median_us(lambda: loom.from_dlpack(t)), median_us(lambda: torch.from_dlpack(x))),
    }
    if "--json" in sys.argv:
        print(json.dumps({k: {"loom_us": a, "torch_us": b, "ratio": a / b} for k, (a, b) in rows.items()},
                         indent=2))
        return
    print(f"dlpack round trip from Python, 1 KB float32, median of {REPETITIONS} x {NUMBER}")
    for name, (a, b) in rows.items():
        verdict = "met" if a <= b else "NOT met"
        print(f"  {name:<8} loom {a:6.3f} us   torch {b:6.3f} us   loom/torch {a / b:5.2f}   "
              f"target <= 1: {verdict}")


if __name__ == "__main__":
    main()
