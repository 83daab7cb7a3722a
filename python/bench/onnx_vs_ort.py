"""loom against ONNX Runtime and PyTorch eager on the same ONNX models, in the same run.

    /usr/bin/python3 python/bench/onnx_vs_ort.py [--models-dir DIR] [--models a,b]
        [--batches 1,32] [--threads 1,2] [--seq-len 128] [--image-size 224]
        [--warmup 3] [--iters 20] [--iters-batched 5] [--json OUT.json]

For each model x batch x threads it times:
  ort    bench/onnx/ort_bench.js on the same .onnx file (onnxruntime-node, intraOpNumThreads=T,
         interOpNumThreads=1, sequential, graph optimization "all"); run `npm ci
         --ignore-scripts` in bench/onnx first;
  torch  the PyTorch module the file was exported from (same seed, so the same weights),
         torch.set_num_threads(T), eval mode, torch.no_grad();
  loom   loom.onnx.load(path, threads=T, input_shapes={input: its shape}).run(feeds) (as
         `loom bench onnx`: imported for the shape it runs at); the column stays empty, marked
         "unavailable", while this build of loom has no loom.onnx.load.
Each figure is the median latency of --iters timed runs (--iters-batched for batch > 1) after
--warmup untimed ones, on a seeded random float32 input; throughput is batch / median.
The models come from python/bench/onnx_models.py (exported into --models-dir when its
models.json is missing or lacks one; default build-onnx/models). The transformer runs at
--seq-len; the image models at the size they were exported at.
Ratios: loom/ORT = ORT median / loom median (> 1 means loom is faster); loom/torch likewise.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import onnx_models  # noqa: E402
from layer_norm_torch import median_ms  # noqa: E402  (median of timed calls after warm-up)

NODE_SCRIPT = os.path.join(ROOT, "bench", "onnx", "ort_bench.js")


def input_shape(entry, batch, seq_len):
    """The concrete shape of the model's first input at this batch (and sequence length)."""
    dims = list(entry["inputs"][0]["shape"])
    dims[0] = batch
    return [seq_len if isinstance(d, str) or d is None else d for d in dims]


def time_ort(path, entry, shape, threads, warmup, iters, node):
    name = entry["inputs"][0]["name"]
    cmd = [node, NODE_SCRIPT, path, "--batch", str(shape[0]), "--threads", str(threads),
           "--warmup", str(warmup), "--iters", str(iters), "--input", name,
           "--shape", f"{name}={','.join(str(d) for d in shape)}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ort_bench.js failed: {r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def time_torch(name, x, threads, warmup, iters, image_size):
    import torch

    module, _, _, _ = onnx_models.model_spec(name, image_size, [x.shape[1]])
    module.eval()
    torch.set_num_threads(threads)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        return median_ms(lambda: module(xt), warmup, iters)


def loom_loader():
    """loom.onnx.load, or None with the reason it is unavailable."""
    try:
        import loom.onnx as lo
    except Exception as e:  # noqa: BLE001 -- any failure to import means "no column"
        return None, f"import loom.onnx: {type(e).__name__}: {e}"
    if not hasattr(lo, "load"):
        return None, "loom.onnx has no load()"
    return lo.load, None


def time_loom(load, path, entry, x, threads, warmup, iters):
    # Imported for the input's shape (as ONNX Runtime plans for the shapes it is fed): the
    # shape computations fold and the fusions that need exact shapes apply.
    name = entry["inputs"][0]["name"]
    model = load(path, threads=threads, input_shapes={name: list(x.shape)})
    feeds = {name: x}
    return median_ms(lambda: model.run(feeds), warmup, iters)


def ensure_models(models_dir, names, image_size):
    manifest_path = os.path.join(models_dir, "models.json")
    have = {}
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            have = {m["name"]: m for m in json.load(f)["models"]}
    missing = [n for n in names if n not in have]
    if missing:
        manifest = onnx_models.export(models_dir, names, image_size=image_size)
        have = {m["name"]: m for m in manifest["models"]}
        failed = [n for n in names if n not in have]
        if failed:
            raise SystemExit(f"onnx_vs_ort: could not export {failed}: {manifest['failed']}")
    return have


def fmt(v, spec):
    """v formatted by spec, or a dash as wide as spec says."""
    width = int(spec.split(".")[0])
    return f"{'-':>{width}}" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models-dir", default=os.path.join(ROOT, "build-onnx", "models"))
    p.add_argument("--models", default=",".join(onnx_models.DEFAULT_MODELS))
    p.add_argument("--batches", default="1,32")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--iters-batched", type=int, default=5)
    p.add_argument("--node", default="node")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", dest="json_out")
    a = p.parse_args()

    if not os.path.isdir(os.path.join(os.path.dirname(NODE_SCRIPT), "node_modules",
                                      "onnxruntime-node")):
        raise SystemExit("onnx_vs_ort: ONNX Runtime is not installed: run "
                         "`npm ci --ignore-scripts` in bench/onnx")
    names = [n for n in a.models.split(",") if n]
    entries = ensure_models(a.models_dir, names, a.image_size)
    load, loom_missing = loom_loader()
    rng = np.random.default_rng(0)
    rows = []
    for name in names:
        entry = entries[name]
        path = os.path.join(a.models_dir, entry["file"])
        for batch in [int(b) for b in a.batches.split(",")]:
            shape = input_shape(entry, batch, a.seq_len)
            x = rng.standard_normal(shape, dtype=np.float32)
            iters = a.iters if batch == 1 else a.iters_batched
            for threads in [int(t) for t in a.threads.split(",")]:
                ort = time_ort(path, entry, shape, threads, a.warmup, iters, a.node)
                row = {"model": name, "batch": batch, "threads": threads, "shape": shape,
                       "iters": iters, "ort_version": ort["ort_version"],
                       "ort_ms": ort["latency_ms"]["p50"], "ort_latency_ms": ort["latency_ms"],
                       "torch_ms": None, "loom_ms": None, "loom_error": loom_missing}
                if not a.no_torch:
                    row["torch_ms"] = time_torch(name, x, threads, a.warmup, iters, a.image_size)
                if load is not None:
                    try:
                        row["loom_ms"] = time_loom(load, path, entry, x, threads, a.warmup, iters)
                    except Exception as e:  # noqa: BLE001 -- reported in the row
                        row["loom_error"] = f"{type(e).__name__}: {e}"
                for k in ("ort", "torch", "loom"):
                    ms = row[f"{k}_ms"]
                    row[f"{k}_samples_per_s"] = None if ms is None else batch * 1e3 / ms
                row["loom_vs_ort"] = (row["ort_ms"] / row["loom_ms"]) if row["loom_ms"] else None
                row["loom_vs_torch"] = (row["torch_ms"] / row["loom_ms"]
                                        if row["loom_ms"] and row["torch_ms"] else None)
                rows.append(row)
                print(f"onnx_vs_ort: {name} batch {batch} threads {threads} done", file=sys.stderr)

    import torch

    header = (f"{'model':<14}{'batch':>6}{'thr':>4}{'ORT ms':>10}{'torch ms':>10}{'loom ms':>10}"
              f"{'ORT/s':>10}{'loom/s':>10}{'loom/ORT':>10}{'loom/torch':>11}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:<14}{r['batch']:>6}{r['threads']:>4}{fmt(r['ort_ms'], '10.2f')}"
              f"{fmt(r['torch_ms'], '10.2f')}{fmt(r['loom_ms'], '10.2f')}"
              f"{fmt(r['ort_samples_per_s'], '10.1f')}{fmt(r['loom_samples_per_s'], '10.1f')}"
              f"{fmt(r['loom_vs_ort'], '10.2f')}{fmt(r['loom_vs_torch'], '11.2f')}")
    if load is None:
        print(f"loom column: unavailable ({loom_missing})")
    result = {"ort_version": rows[0]["ort_version"] if rows else None,
              "torch_version": torch.__version__, "seq_len": a.seq_len,
              "loom_available": load is not None, "rows": rows}
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
