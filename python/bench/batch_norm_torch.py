"""BatchNorm2d in PyTorch: the peer that `loom bench fusion --only batch_norm` measures in the
same run.

    /usr/bin/python3 python/bench/batch_norm_torch.py --threads 2 --shape 32,64,56,56 --json

torch.nn.BatchNorm2d(C) in train() mode on an [N, C, H, W] float32 batch (with
--channels-last, the same batch in torch.channels_last memory format), with
torch.set_num_threads(N):
  forward           y = bn(x) (batch statistics, running statistics updated), under no_grad;
  forward+backward  the same with x requiring grad, then y.backward(dy) (dx, dweight,
                    dbias), the gradients reset to None before each step.
Each figure is the median of --repetitions timed calls after --warmup untimed ones.
With --json it prints one JSON object: forward_ms, forward_backward_ms, torch_version,
threads, shape, channels_last; when torch cannot be imported, {"error": "..."} (exit 2).
"""
import argparse
import json

from layer_norm_torch import median_ms  # the median of timed calls after warm-up


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repetitions", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--shape", default="32,64,56,56")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install failing otherwise
        message = f"cannot import torch: {e}"
        print(json.dumps({"error": message}) if a.json else message)
        return 2
    torch.set_num_threads(a.threads)
    shape = [int(v) for v in a.shape.split(",")]
    gen = torch.Generator().manual_seed(0)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    x = (torch.randn(shape, generator=gen) * 2 + 1).contiguous(memory_format=fmt)
    dy = torch.randn(shape, generator=gen).contiguous(memory_format=fmt)
    bn = torch.nn.BatchNorm2d(shape[1]).train()

    def forward():
        with torch.no_grad():
            bn(x)

    xr = x.clone().requires_grad_(True)

    def forward_backward():
        xr.grad = None
        bn.weight.grad = None
        bn.bias.grad = None
        bn(xr).backward(dy)

    result = {
        "forward_ms": median_ms(forward, a.warmup, a.repetitions),
        "forward_backward_ms": median_ms(forward_backward, a.warmup, a.repetitions),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": shape,
        "channels_last": a.channels_last,
    }
    print(json.dumps(result) if a.json else result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
