"""LayerNorm in PyTorch: the peer that `loom bench`'s layer_norm suite measures in the same run.

    /usr/bin/python3 python/bench/layer_norm_torch.py --threads 2 --json [--repetitions 30]

F.layer_norm over the last dim of a [4096, 1024] f32 tensor (gamma and beta of [1024]),
with torch.set_num_threads(N):
  forward           y = F.layer_norm(x, (1024,), gamma, beta), nothing requiring grad;
  forward+backward  the same with x, gamma and beta requiring grad, then y.backward(dy)
                    (dx, dgamma, dbeta), the gradients reset to None before each step as
                    zero_grad(set_to_none=True) does.
Each figure is the median of --repetitions timed calls after --warmup untimed ones.
With --json it prints one JSON object: forward_ms, forward_backward_ms, torch_version,
threads, rows, cols, repetitions; when torch cannot be imported, {"error": "..."} (exit 2),
which bench/fusion/layer_norm_bench.cpp reports as "peer unavailable".
"""
import argparse
import json
import statistics
import sys
import time


def median_ms(fn, warmup, repetitions):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repetitions", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=1024)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # ImportError, or a broken install failing otherwise
        message = f"cannot import torch: {e}"
        print(json.dumps({"error": message}) if a.json else message)
        return 2

    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    shape = (a.rows, a.cols)
    x = torch.randn(shape, generator=gen)
    gamma = torch.rand(a.cols, generator=gen) + 0.5
    beta = torch.randn(a.cols, generator=gen)
    dy = torch.randn(shape, generator=gen)

    def forward():
        F.layer_norm(x, (a.cols,), gamma, beta, 1e-5)

    xr = x.clone().requires_grad_(True)
    gr = gamma.clone().requires_grad_(True)
    br = beta.clone().requires_grad_(True)

    def forward_backward():
        xr.grad = None
        gr.grad = None
        br.grad = None
        y = F.layer_norm(xr, (a.cols,), gr, br, 1e-5)
        y.backward(dy)

    result = {
        "forward_ms": median_ms(forward, a.warmup, a.repetitions),
        "forward_backward_ms": median_ms(forward_backward, a.warmup, a.repetitions),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": a.rows,
        "cols": a.cols,
        "repetitions": a.repetitions,
    }
    if a.json:
        print(json.dumps(result))
    else:
        print(f"PyTorch {result['torch_version']} F.layer_norm [{a.rows}, {a.cols}] f32, "
              f"{result['threads']} threads: forward {result['forward_ms']:.3f} ms, "
              f"forward+backward {result['forward_backward_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
