"""Training throughput, loom against PyTorch measured in the same run on the same machine.

    PYTHONPATH=build/python python3 python/bench/train_vs_torch.py [--loom build/loom] [--json]

loom train's two models, batch 128, Adam, cross-entropy, on random data:
  MLP 784-512-512-10, at 1 and 2 threads;
  CNN conv3x3 32, relu, max-pool 2, conv3x3 64, relu, max-pool 2, fc 10 on 1x28x28.
PyTorch runs its eager training loop (zero_grad, forward, backward, Adam step) with
torch.set_num_threads(t); loom's figures come from `loom bench train --only models --json`,
run from here right after. Medians of 5 timed runs of 50 steps each (after 10 warm-up steps).
The target is loom / PyTorch >= 1.5.

With --amp: mixed precision instead, at 2 threads: PyTorch's CPU autocast
(torch.autocast("cpu", dtype=torch.bfloat16) around the forward pass, the loss in float32)
against float32 PyTorch, and loom's `loom bench train --only amp --json` (bfloat16 AMP
against float32 loom), in one table.

Mind the peer's BLAS: Debian's python3-torch is built with BLAS_INFO=generic and links the
system libblas.so.3, which is the netlib reference BLAS unless an optimized one (OpenBLAS)
is installed as the alternative. Its nn.Linear then runs reference loops (about 1,200
samples/s for the MLP here, against the quoted 24,000 for an MKL build), so the MLP rows
are printed with a warning and the quoted figure stays the MLP's peer. Convolutions run on
oneDNN (MKL-DNN) in that build too, so the CNN rows are a fair same-run comparison.
"""
import argparse
import json
import statistics
import subprocess
import time

import torch
from torch import nn

BATCH = 128


def mlp():
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 10))


def torch_samples_per_second(make, shape, threads, steps=50, runs=5, autocast=False):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand((BATCH,) + shape)
    y = torch.randint(0, 10, (BATCH,))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = loss_fn(logits.float(), y)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        rates.append(steps * BATCH / (time.perf_counter() - t0))
    return statistics.median(rates)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--loom", default="build/loom")
    p.add_argument("--json", action="store_true")
    p.add_argument("--amp", action="store_true", help="bfloat16 mixed precision against float32")
    a = p.parse_args()
    if a.amp:
        return amp_main(a)
    rows = [
        ("mlp 784-512-512-10", 1, torch_samples_per_second(mlp, (784,), 1)),
        ("mlp 784-512-512-10", 2, torch_samples_per_second(mlp, (784,), 2)),
        ("cnn conv32-pool-conv64-pool-fc10", 1, torch_samples_per_second(cnn, (1, 28, 28), 1)),
        ("cnn conv32-pool-conv64-pool-fc10", 2, torch_samples_per_second(cnn, (1, 28, 28), 2)),
    ]
    out = subprocess.run([a.loom, "bench", "train", "--only", "models", "--json"],
                         capture_output=True, text=True, check=True)
    loom_rows = json.loads(out.stdout)["models"]["rows"]
    loom_rate = {(r["model"], r["threads"]): r["samples_per_second"] for r in loom_rows}
    results = []
    for model, threads, torch_rate in rows:
        mine = loom_rate.get((model, threads))
        results.append({"model": model, "threads": threads, "torch_samples_per_second": torch_rate,
                        "loom_samples_per_second": mine,
                        "ratio": mine / torch_rate if mine else None,
                        "peer_uses_generic_blas": "BLAS_INFO=generic" in torch.__config__.show()
                        and model.startswith("mlp")})
    if a.json:
        print(json.dumps({"torch": torch.__version__, "rows": results}, indent=2))
        return
    config = torch.__config__.show()
    generic_blas = "BLAS_INFO=generic" in config
    print(f"training throughput, batch {BATCH}, Adam: loom vs PyTorch {torch.__version__} "
          f"(same run, medians)")
    if generic_blas:
        print("  note: this PyTorch uses the system's generic BLAS (netlib's reference BLAS unless "
              "OpenBLAS is installed): its MLP rows measure that BLAS, not PyTorch")
    for r in results:
        if r["loom_samples_per_second"] is None:
            print(f"  {r['model']:<34} {r['threads']} threads  torch {r['torch_samples_per_second']:8.0f}"
                  f"   loom: not measured at this thread count")
            continue
        verdict = "met" if r["ratio"] >= 1.5 else "NOT met"
        print(f"  {r['model']:<34} {r['threads']} threads  loom {r['loom_samples_per_second']:8.0f}"
              f"   torch {r['torch_samples_per_second']:8.0f}   ratio {r['ratio']:5.2f}"
              f"   target >= 1.5: {verdict}")


def amp_main(a):
    models = [("mlp 784-512-512-10", mlp, (784,)), ("cnn conv32-pool-conv64-pool-fc10", cnn, (1, 28, 28))]
    out = subprocess.run([a.loom, "bench", "train", "--only", "amp", "--json"],
                         capture_output=True, text=True, check=True)
    loom_rows = {r["model"]: r for r in json.loads(out.stdout)["amp"]["rows"]}
    results = []
    for name, make, shape in models:
        t32 = torch_samples_per_second(make, shape, 2)
        t16 = torch_samples_per_second(make, shape, 2, autocast=True)
        mine = loom_rows[name]
        results.append({"model": name, "threads": 2,
                        "loom_fp32": mine["fp32_samples_per_second"],
                        "loom_amp": mine["amp_samples_per_second"],
                        "loom_speedup": mine["speedup"],
                        "loom_fp32_peak_bytes": mine["fp32_peak_bytes"],
                        "loom_amp_peak_bytes": mine["amp_peak_bytes"],
                        "torch_fp32": t32, "torch_amp": t16, "torch_speedup": t16 / t32,
                        "loom_amp_over_torch_amp": mine["amp_samples_per_second"] / t16})
    if a.json:
        print(json.dumps({"torch": torch.__version__, "amp": "bfloat16", "rows": results}, indent=2))
        return
    print(f"bfloat16 mixed precision, batch {BATCH}, Adam, 2 threads: loom vs PyTorch "
          f"{torch.__version__} CPU autocast (same run, medians, samples/s)")
    for r in results:
        print(f"  {r['model']:<34} loom fp32 {r['loom_fp32']:8.0f}  amp {r['loom_amp']:8.0f} "
              f"({r['loom_speedup']:4.2f}x)   torch fp32 {r['torch_fp32']:8.0f}  autocast "
              f"{r['torch_amp']:8.0f} ({r['torch_speedup']:4.2f}x)   loom amp / torch autocast "
              f"{r['loom_amp_over_torch_amp']:5.2f}")


if __name__ == "__main__":
    main()
