"""loom's GPU figures beside PyTorch's on the same GPU, in the same run.

    python3 python/bench/cuda_vs_torch.py --loom build-gpu/loom [--loom-json bench.json]
                                          [--json peers.json] [--quick]
    python3 python/bench/cuda_vs_torch.py --table bench.json peers.json

Takes `loom bench cuda --json` (runs it, or reads --loom-json when the caller ran it) and
measures PyTorch on the same cases with CUDA events (medians):
  - allocation: PyTorch's caching allocator (torch.cuda.caching_allocator_alloc/delete, and
    torch.empty + del) against loom's pool reached the same way from Python (the extension's
    loom_torch_malloc/loom_torch_free through ctypes: the calls PyTorch's pluggable allocator
    makes), for the sizes of loom's pool bench;
  - FusedAdam: torch.optim.Adam(fused=True) and (foreach=True) on the fused_adam cases of
    loom's bench (same tensor counts, sizes and parameter dtypes; PyTorch keeps bf16 moments
    for bf16 parameters where loom keeps f32 ones, so PyTorch moves fewer bytes there);
  - LayerNorm: torch.nn.functional.layer_norm forward and forward+backward on loom's shape;
  - the device-to-device copy bandwidth as PyTorch measures it (a check of loom's peer);
  - training throughput of `loom train`'s MLP (784-512-512-10, batch 128, Adam) against the
    same model trained by PyTorch's eager loop on the GPU (loom's figure from the summary of
    a `loom train` log given with --loom-train-log).
Prints a table (loom, PyTorch, ratio = PyTorch time / loom time: > 1 means loom is faster)
and writes the numbers as JSON. Exits 2 saying why when there is no GPU or no CUDA PyTorch.
"""
import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time

MiB = 1 << 20
# loom's pool bench sizes (bench/cuda/pool_gpu_bench.cpp).
POOL_SIZES = {
    "256 B": [256],
    "1 MiB": [MiB],
    "64 MiB": [64 * MiB],
    "mixed 256 B..16 MiB": [256, 4096, 65536, MiB, 3 * MiB, 16 * MiB, 1024, 8 * MiB],
}


def cuda_timed(torch, fn, repetitions, warmup=3, batch=1):
    """Median milliseconds of one fn() call, CUDA events around `batch` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repetitions):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / batch)
    return statistics.median(samples)


def host_timed_ns(fn, sizes, pairs, repetitions):
    """Median nanoseconds of one allocate+free pair (host clock; the calls do not wait)."""
    samples = []
    for r in range(repetitions + 1):
        t0 = time.perf_counter_ns()
        for i in range(pairs):
            fn(sizes[i % len(sizes)])
        if r > 0:
            samples.append((time.perf_counter_ns() - t0) / pairs)
    return statistics.median(samples)


def allocation_peers(torch, quick, repetitions):
    import loom.cuda

    stream = torch.cuda.current_stream().cuda_stream
    lib = ctypes.CDLL(loom.cuda.library_path())
    lib.loom_torch_malloc.restype = ctypes.c_void_p
    lib.loom_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.loom_torch_free.restype = None
    lib.loom_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                    ctypes.c_void_p]
    malloc, free = lib.loom_torch_malloc, lib.loom_torch_free

    def loom_pair(n):
        p = malloc(n, 0, stream)
        free(p, n, 0, stream)

    def torch_raw_pair(n):
        p = torch.cuda.caching_allocator_alloc(n, 0, stream)
        torch.cuda.caching_allocator_delete(p)

    def torch_empty_pair(n):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        del t

    pairs = 2000 if quick else 20000
    rows = []
    for name, sizes in POOL_SIZES.items():
        loom_ns = host_timed_ns(loom_pair, sizes, pairs, repetitions)
        raw_ns = host_timed_ns(torch_raw_pair, sizes, pairs, repetitions)
        empty_ns = host_timed_ns(torch_empty_pair, sizes, pairs, repetitions)
        rows.append({"case": f"allocate+free {name}", "loom_python_ns": loom_ns,
                     "torch_caching_allocator_ns": raw_ns, "torch_empty_ns": empty_ns})
    torch.cuda.synchronize()
    return rows


def adam_peers(torch, loom_rows, repetitions):
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    out = []
    for row in loom_rows:
        p = row.get("params") or {}
        if not p or p.get("check_finite"):
            continue
        n, per, dt = p["tensors"], p["elements"], dtypes[p["param_dtype"]]
        g = torch.Generator(device="cuda").manual_seed(1)
        params = [torch.rand(per, device="cuda", generator=g, dtype=torch.float32).to(dt) * 2 - 1
                  for _ in range(n)]
        params = [x.requires_grad_(True) for x in params]
        for x in params:
            x.grad = (torch.rand(per, device="cuda", generator=g) * 2 - 1).to(dt)
        result = {"case": row["name"], "loom_ms": row["loom_ms"]}
        for mode in ("fused", "foreach"):
            opt = torch.optim.Adam(params, lr=1e-4, **{mode: True})
            result[f"torch_{mode}_ms"] = cuda_timed(torch, opt.step, repetitions, batch=10)
            del opt
        out.append(result)
        del params
        torch.cuda.empty_cache()
    return out


def layer_norm_peer(torch, loom_ln, repetitions):
    import torch.nn.functional as F

    rows, cols = loom_ln["shape"]
    x = torch.randn(rows, cols, device="cuda")
    gamma = torch.randn(cols, device="cuda")
    beta = torch.randn(cols, device="cuda")
    dy = torch.randn(rows, cols, device="cuda")
    with torch.no_grad():
        fwd = cuda_timed(torch, lambda: F.layer_norm(x, (cols,), gamma, beta), repetitions,
                         batch=10)
    xg, gg, bg = (t.clone().requires_grad_(True) for t in (x, gamma, beta))

    def forward_backward():
        xg.grad = gg.grad = bg.grad = None
        F.layer_norm(xg, (cols,), gg, bg).backward(dy)

    fb = cuda_timed(torch, forward_backward, repetitions, batch=10)
    return {"case": f"layer_norm {rows}x{cols} f32", "loom_forward_ms": loom_ln["forward_ms"],
            "torch_forward_ms": fwd, "loom_forward_backward_ms": loom_ln["forward_backward_ms"],
            "torch_forward_backward_ms": fb,
            # bytes: forward reads x (and gamma, beta) and writes y; backward reads x, dy and
            # writes dx (with the saved statistics, which are small).
            "forward_bytes": 2 * rows * cols * 4, "forward_backward_bytes": 5 * rows * cols * 4}


def copy_peer(torch, repetitions):
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = cuda_timed(torch, lambda: b.copy_(a), repetitions, batch=5)
    return {"case": "device-to-device copy 1 GiB", "torch_ms": ms,
            "gb_per_s_read_plus_write": 2 * n / (ms * 1e-3) / 1e9}


def train_peer(torch, steps):
    """Samples per second of PyTorch's eager training loop for loom train's MLP."""
    from torch import nn

    batch = 128
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(steps, batch, 784, device="cuda")
    y = torch.randint(0, 10, (steps, batch), device="cuda")

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[i]), y[i]).backward()
        opt.step()

    for i in range(10):
        step(i)
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()
        samples.append(steps * batch / (time.perf_counter() - t0))
    return {"case": "MLP 784-512-512-10 training, batch 128, Adam",
            "torch_samples_per_s": statistics.median(samples)}


def loom_train_throughput(path):
    """samples/s from the summary of a `loom train` log, or None."""
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if parts[:1] == ["throughput"] and len(parts) > 1:
                    return float(parts[1])
    except (OSError, ValueError):
        pass
    return None


def measure(args):
    if args.loom_json:
        with open(args.loom_json) as f:
            bench = json.load(f)
    else:
        cmd = [args.loom, "bench", "cuda", "--json"] + (["--quick"] if args.quick else [])
        bench = json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                          text=True).stdout)
    try:
        import torch
    except ImportError as e:
        print(f"PyTorch peers: PyTorch is not installed ({e})")
        return None, 2
    if not torch.cuda.is_available():
        print(f"PyTorch peers: PyTorch {torch.__version__} sees no CUDA device")
        return None, 2
    reps = 5 if args.quick else 20
    peers = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
             "torch_cuda": torch.version.cuda}
    peers["copy"] = copy_peer(torch, reps)
    try:
        import loom.cuda  # noqa: F401
        peers["allocation"] = allocation_peers(torch, args.quick, 5 if args.quick else 10)
    except ImportError as e:
        peers["allocation_error"] = f"the loom package is not importable: {e}"
    if bench.get("fused_adam", {}).get("available"):
        peers["fused_adam"] = adam_peers(torch, bench["fused_adam"]["rows"], reps)
    if bench.get("layer_norm", {}).get("available"):
        peers["layer_norm"] = layer_norm_peer(torch, bench["layer_norm"], reps)
    peers["train"] = train_peer(torch, 20 if args.quick else 100)
    if args.loom_train_log:
        peers["train"]["loom_samples_per_s"] = loom_train_throughput(args.loom_train_log)
    return (bench, peers), 0


def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def table(bench, peers):
    """The short table of every figure with its peer (text)."""
    lines = []
    add = lines.append
    if peers:
        add(f"PyTorch {peers.get('torch')} (CUDA {peers.get('torch_cuda')}) on {peers.get('device')}")
    add(f"{'figure':<46} {'loom':>12} {'peer':>12} {'ratio':>8} {'target':>8}  peer")
    for part in ("pool", "matmul", "fused_adam"):
        section = bench.get(part, {})
        if not section.get("available"):
            add(f"{part:<46} not run: {section.get('reason', 'absent')}")
            continue
        for r in section["rows"]:
            unit = r["rate_unit"]
            target = f">={r['target']:.2f}" if r["target"] else "-"
            flag = "" if not r["target"] or r["met"] else "  BELOW"
            add(f"{r['name'][:46]:<46} {r['loom_rate']:>8.4g} {unit[:3]:<3} "
                f"{r['peer_rate']:>8.4g} {unit[:3]:<3} {r['ratio']:>8.3g} {target:>8}  "
                f"{r['peer']}{flag}")
    ln = bench.get("layer_norm", {})
    if ln.get("available"):
        add(f"{'layer_norm fwd / fwd+bwd (ms)':<46} {ln['forward_ms']:>8.4f} ms  "
            f"{ln['forward_backward_ms']:.4f} ms (loom)")
    if not peers:
        return "\n".join(lines)
    add("")
    add(f"{'PyTorch on the same GPU':<46} {'loom':>12} {'torch':>12} {'torch/loom':>10}")
    copy = peers.get("copy")
    if copy:
        add(f"{'D2D copy, read+write GB/s (torch)':<46} {'':>12} {copy['gb_per_s_read_plus_write']:>12.1f}")
    for a in peers.get("allocation", []):
        add(f"{a['case'] + ' (ns, from Python)':<46} {a['loom_python_ns']:>12.0f} "
            f"{a['torch_caching_allocator_ns']:>12.0f} "
            f"{ratio(a['torch_caching_allocator_ns'], a['loom_python_ns']):>10}  caching_allocator_alloc")
        add(f"{'':<46} {'':>12} {a['torch_empty_ns']:>12.0f} "
            f"{ratio(a['torch_empty_ns'], a['loom_python_ns']):>10}  torch.empty + del")
    for a in peers.get("fused_adam", []):
        add(f"{a['case'] + ' (ms)':<46} {a['loom_ms']:>12.4f} {a['torch_fused_ms']:>12.4f} "
            f"{ratio(a['torch_fused_ms'], a['loom_ms']):>10}  Adam(fused=True)")
        add(f"{'':<46} {'':>12} {a['torch_foreach_ms']:>12.4f} "
            f"{ratio(a['torch_foreach_ms'], a['loom_ms']):>10}  Adam(foreach=True)")
    ln = peers.get("layer_norm")
    if ln:
        add(f"{ln['case'] + ' forward (ms)':<46} {ln['loom_forward_ms']:>12.4f} "
            f"{ln['torch_forward_ms']:>12.4f} {ratio(ln['torch_forward_ms'], ln['loom_forward_ms']):>10}"
            "  F.layer_norm (target >= 1.0)")
        add(f"{ln['case'] + ' fwd+bwd (ms)':<46} {ln['loom_forward_backward_ms']:>12.4f} "
            f"{ln['torch_forward_backward_ms']:>12.4f} "
            f"{ratio(ln['torch_forward_backward_ms'], ln['loom_forward_backward_ms']):>10}"
            "  F.layer_norm + backward (target >= 1.0)")
        if copy:
            bw = copy["gb_per_s_read_plus_write"]
            for key in ("forward", "forward_backward"):
                gbs = ln[f"{key}_bytes"] / (ln[f"loom_{key}_ms"] * 1e-3) / 1e9
                add(f"{'  loom ' + key + ' as a fraction of copy BW':<46} {gbs / bw:>12.2f}")
    tr = peers.get("train")
    if tr:
        loom_sps = tr.get("loom_samples_per_s")
        add(f"{'MLP training (samples/s)':<46} {loom_sps or 0:>12.0f} "
            f"{tr['torch_samples_per_s']:>12.0f} {ratio(loom_sps, tr['torch_samples_per_s']):>10}"
            "  loom/torch: eager nn.Sequential + Adam")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default="build/loom")
    ap.add_argument("--loom-json", help="`loom bench cuda --json` output to use")
    ap.add_argument("--json", help="write the PyTorch measurements here")
    ap.add_argument("--loom-train-log", help="a `loom train` log whose throughput to compare")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--table", nargs=2, metavar=("BENCH_JSON", "PEERS_JSON"),
                    help="only print the table of two earlier outputs")
    args = ap.parse_args()
    if args.table:
        def load(path):
            try:
                with open(path) as f:
                    return json.load(f)
            except (OSError, ValueError):
                return {}
        print(table(load(args.table[0]), load(args.table[1])))
        return 0
    result, rc = measure(args)
    if result is None:
        return rc
    bench, peers = result
    if args.json:
        with open(args.json, "w") as f:
            json.dump(peers, f, indent=2)
    print(table(bench, peers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
