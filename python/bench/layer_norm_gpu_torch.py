"""LayerNorm on the GPU: loom's fused kernels against PyTorch's, on the same GPU, same run.

    /usr/bin/python3 python/bench/layer_norm_gpu_torch.py --loom build/loom [--repetitions 50]

Runs `loom bench cuda --only layer_norm --json` (forward and forward+backward on a
[4096, 1024] f32 tensor, CUDA-event medians) and times torch.nn.functional.layer_norm on
cuda:0 the same way (forward; forward+backward with x, gamma, beta requiring grad and dy
given), then prints both and the ratios (torch time / loom time: > 1 means loom is faster).
Exits 2 saying why when there is no GPU, or PyTorch has no CUDA.
"""
import argparse
import json
import statistics
import subprocess
import sys


def torch_times(rows, cols, repetitions):
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        raise RuntimeError(f"PyTorch {torch.__version__} has no CUDA device")
    dev = torch.device("cuda:0")
    x = torch.randn(rows, cols, device=dev)
    gamma = torch.randn(cols, device=dev)
    beta = torch.randn(cols, device=dev)
    dy = torch.randn(rows, cols, device=dev)

    def timed(fn):
        for _ in range(5):
            fn()
        samples = []
        for _ in range(repetitions):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop))
        return statistics.median(samples)

    def forward():
        F.layer_norm(x, (cols,), gamma, beta)

    xg = x.clone().requires_grad_(True)
    gg = gamma.clone().requires_grad_(True)
    bg = beta.clone().requires_grad_(True)

    def forward_backward():
        xg.grad = gg.grad = bg.grad = None
        F.layer_norm(xg, (cols,), gg, bg).backward(dy)

    with torch.no_grad():
        fwd = timed(forward)
    return fwd, timed(forward_backward), torch.__version__, torch.cuda.get_device_name(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--repetitions", type=int, default=50)
    args = ap.parse_args()
    out = subprocess.run([args.loom, "bench", "cuda", "--only", "layer_norm", "--json",
                          "--repetitions", str(args.repetitions)],
                         check=True, capture_output=True, text=True)
    loom = json.loads(out.stdout)["layer_norm"]
    if not loom.get("available"):
        print(f"loom: no GPU ({loom.get('reason')})")
        return 2
    try:
        rows, cols = loom["shape"]
        t_fwd, t_fb, version, name = torch_times(rows, cols, args.repetitions)
    except Exception as e:  # no torch, or torch without CUDA
        print(f"PyTorch peer unavailable: {e}")
        return 2
    print(f"LayerNorm {rows}x{cols} f32 on {name}, PyTorch {version}")
    print(f"  forward:          loom {loom['forward_ms']:.4f} ms, torch {t_fwd:.4f} ms, "
          f"torch/loom {t_fwd / loom['forward_ms']:.2f}x")
    print(f"  forward+backward: loom {loom['forward_backward_ms']:.4f} ms, torch {t_fb:.4f} ms, "
          f"torch/loom {t_fb / loom['forward_backward_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
