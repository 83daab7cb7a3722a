"""Exports the ONNX models that loom is checked and timed on, with PyTorch's own outputs.

    /usr/bin/python3 python/bench/onnx_models.py OUT_DIR [--models resnet18,...] [--all]
        [--image-size 224] [--seq-lens 16,7] [--max-params N] [--check-loom]

torch.onnx.export at opset 17, random weights (torch.manual_seed(0) before each model is
built), eval mode; nothing is downloaded. The default set:
  resnet18, mobilenet_v2   input "input" [batch, 3, S, S] (S = --image-size), output "output"
                           [batch, 1000]; the batch dimension is dynamic;
  transformer              torch.nn.TransformerEncoder of 4 TransformerEncoderLayer(d_model
                           256, nhead 8, dim_feedforward 1024, batch_first=True); input "src"
                           [batch, seq, 256], output "output"; batch and seq dynamic.
--all adds every classification model of torchvision.models (list_models), each at 224x224;
a model that fails to export is listed with the reason in the manifest's "failed" and on
stderr. --max-params skips (and lists) models with more parameters than N. --check-loom then
loads every exported model in loom and compares it with the references (max |loom - torch|
over max |torch|, at most 1e-4 to pass; loom's refusals name the ops).

For every model OUT_DIR gets NAME.onnx and, per reference case k, NAME.ref{k}.in.<input>.npy
(a seeded random input, batch 2) and NAME.ref{k}.out.<output>.npy (PyTorch's output for it,
under torch.no_grad); the transformer has one case per --seq-lens entry. OUT_DIR/models.json
is the manifest:
  {"torch_version", "torchvision_version", "opset",
   "models": [{"name", "file", "inputs": [{"name", "shape", "dtype"}], "outputs": [...],
               "dynamic_dims": {"<value>": {"<axis>": "<symbol>"}}, "params",
               "references": [{"inputs": {name: file}, "outputs": {name: file}}]}],
   "failed": [{"name", "error"}], "skipped": [{"name", "reason"}]}
Shapes name symbolic dimensions by their symbol ("batch", "seq").
"""
import argparse
import json
import os
import sys
import time
import traceback
import warnings

import numpy as np

OPSET = 17
DEFAULT_MODELS = ["resnet18", "mobilenet_v2", "transformer"]
REFERENCE_BATCH = 2


# The encoder stack: TransformerEncoderLayer(d_model, nhead, dim_feedforward), LAYERS deep.
D_MODEL, NHEAD, DIM_FEEDFORWARD, LAYERS = 256, 8, 1024, 4


def transformer_stack():
    """torch.nn.TransformerEncoder of LAYERS layers, batch_first."""
    import torch

    layer = torch.nn.TransformerEncoderLayer(d_model=D_MODEL, nhead=NHEAD,
                                             dim_feedforward=DIM_FEEDFORWARD, batch_first=True)
    # enable_nested_tensor only matters with a padding mask; off keeps one code path.
    return torch.nn.TransformerEncoder(layer, num_layers=LAYERS, enable_nested_tensor=False)


def model_spec(name, image_size, seq_lens):
    """(module, input name, reference input shapes, dynamic axes) for one model."""
    import torch
    import torchvision

    torch.manual_seed(0)
    if name == "transformer":
        module = transformer_stack()
        shapes = [(REFERENCE_BATCH, s, D_MODEL) for s in seq_lens]
        dynamic = {"src": {0: "batch", 1: "seq"}, "output": {0: "batch", 1: "seq"}}
        return module, "src", shapes, dynamic
    module = torchvision.models.get_model(name, weights=None)
    shapes = [(REFERENCE_BATCH, 3, image_size, image_size)]
    dynamic = {"input": {0: "batch"}, "output": {0: "batch"}}
    return module, "input", shapes, dynamic


def value_info(values):
    """[{name, shape, dtype}] of ONNX graph inputs or outputs (symbolic dims by name)."""
    import onnx

    out = []
    for v in values:
        t = v.type.tensor_type
        dims = []
        for d in t.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        out.append({"name": v.name, "shape": dims,
                    "dtype": onnx.TensorProto.DataType.Name(t.elem_type).lower()})
    return out


def export_one(name, out_dir, image_size, seq_lens, max_params):
    """Exports one model and its references; returns its manifest entry or a skip reason."""
    import onnx
    import torch

    module, input_name, shapes, dynamic = model_spec(name, image_size, seq_lens)
    module.eval()
    params = sum(p.numel() for p in module.parameters())
    if max_params is not None and params > max_params:
        return None, f"{params} parameters, more than --max-params {max_params}"
    path = os.path.join(out_dir, f"{name}.onnx")
    gen = torch.Generator().manual_seed(1)
    example = torch.randn(*shapes[0], generator=gen)
    # Exported with autograd on: under no_grad an eval-mode TransformerEncoderLayer takes
    # PyTorch's fused fast path (aten::_transformer_encoder_layer_fwd), which has no export.
    with warnings.catch_warnings():
        # The tracer's notes on Python values it records as constants (the attention's
        # scale, say): fixed by the model's configuration, not by the input.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(module, (example,), path, opset_version=OPSET,
                          input_names=[input_name], output_names=["output"],
                          dynamic_axes=dynamic, do_constant_folding=True)
    model = onnx.load(path, load_external_data=False)
    onnx.checker.check_model(path)
    references = []
    for k, shape in enumerate(shapes):
        x = example if k == 0 else torch.randn(*shape, generator=gen)
        with torch.no_grad():
            y = module(x)
        in_file = f"{name}.ref{k}.in.{input_name}.npy"
        out_file = f"{name}.ref{k}.out.output.npy"
        np.save(os.path.join(out_dir, in_file), x.numpy().astype(np.float32))
        np.save(os.path.join(out_dir, out_file), y.numpy().astype(np.float32))
        references.append({"inputs": {input_name: in_file}, "outputs": {"output": out_file}})
    entry = {
        "name": name,
        "file": f"{name}.onnx",
        "inputs": value_info(model.graph.input),
        "outputs": value_info(model.graph.output),
        "dynamic_dims": {v: {str(a): s for a, s in axes.items()} for v, axes in dynamic.items()},
        "params": params,
        "references": references,
    }
    return entry, None


def export(out_dir, names, image_size=224, seq_lens=(16, 7), max_params=None, log=sys.stderr):
    """Exports `names` into out_dir and writes out_dir/models.json; returns the manifest."""
    import torch
    import torchvision

    os.makedirs(out_dir, exist_ok=True)
    manifest = {"torch_version": torch.__version__, "torchvision_version": torchvision.__version__,
                "opset": OPSET, "models": [], "failed": [], "skipped": []}
    for name in names:
        t0 = time.perf_counter()
        try:
            entry, skipped = export_one(name, out_dir, image_size, seq_lens, max_params)
        except Exception as e:  # noqa: BLE001 -- every failure is reported, by model
            last = traceback.extract_tb(e.__traceback__)[-1]
            reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            reason += f" ({os.path.basename(last.filename)}:{last.lineno})"
            manifest["failed"].append({"name": name, "error": reason})
            print(f"onnx_models: {name} failed to export: {reason}", file=log)
            continue
        if skipped is not None:
            manifest["skipped"].append({"name": name, "reason": skipped})
            print(f"onnx_models: {name} skipped: {skipped}", file=log)
            continue
        manifest["models"].append(entry)
        print(f"onnx_models: {name} exported ({entry['params']} parameters, "
              f"{time.perf_counter() - t0:.1f} s)", file=log)
    with open(os.path.join(out_dir, "models.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def check_loom(out_dir, manifest, rtol=1e-4, log=sys.stderr):
    """Loads each exported model in loom and compares it with PyTorch's reference outputs.

    Sets entry["loom"] of each manifest entry: {"result": "pass" | "mismatch", "rel_err"}
    (max |loom - torch| over max |torch|, worst case; "vacuous" where PyTorch's output is
    all zeros, as a zero-initialized classifier head makes it, and loom's is within 1e-4), {"result": "refused", "ops",
    "error"} when loom refuses ops by name, or {"result": "error", "error"}."""
    import re

    import loom.onnx

    for entry in manifest["models"]:
        try:
            model = loom.onnx.load(os.path.join(out_dir, entry["file"]), threads=1)
            worst, vacuous = 0.0, False
            for ref in entry["references"]:
                feeds = {k: np.load(os.path.join(out_dir, f)) for k, f in ref["inputs"].items()}
                outputs = model.run(feeds)
                for name, y in zip(model.output_names, outputs):
                    expected = np.load(os.path.join(out_dir, ref["outputs"][name]))
                    err = float(np.abs(y.astype(np.float64) - expected).max())
                    scale = float(np.abs(expected).max())
                    # An all-zero reference (a zero-initialized head) proves nothing.
                    vacuous = vacuous or scale == 0.0
                    worst = max(worst, err / scale if scale > 0 else err)
            result = "pass" if worst <= rtol else "mismatch"
            entry["loom"] = {"result": "vacuous" if vacuous and result == "pass" else result,
                             "rel_err": worst}
        except Exception as e:  # noqa: BLE001 -- every failure is reported, by model
            text = " ".join(str(e).split())
            ops = re.findall(r"ai\.onnx (\w+) \(opset", text)
            entry["loom"] = {"result": "refused" if ops else "error", "ops": ops,
                             "error": f"{type(e).__name__}: {text[:400]}"}
        print(f"onnx_models: loom on {entry['name']}: {entry['loom']['result']}", file=log)
    with open(os.path.join(out_dir, "models.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def classification_models():
    """Every classification model of torchvision.models, by name."""
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma-separated: resnet18, mobilenet_v2, transformer or any "
                        "torchvision classification model")
    p.add_argument("--all", action="store_true",
                   help="also every classification model torchvision ships")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seq-lens", default="16,7",
                   help="sequence lengths of the transformer's reference cases")
    p.add_argument("--max-params", type=int, default=None)
    p.add_argument("--check-loom", action="store_true",
                   help="load each model in loom (PYTHONPATH=build/python) and compare its "
                        "outputs with PyTorch's: the manifest's \"loom\" entries")
    a = p.parse_args()
    names = [n for n in a.models.split(",") if n]
    if a.all:
        names += [n for n in classification_models() if n not in names]
    seq_lens = [int(s) for s in a.seq_lens.split(",") if s]
    manifest = export(a.out_dir, names, a.image_size, seq_lens, a.max_params)
    summary = {"exported": [m["name"] for m in manifest["models"]],
               "failed": manifest["failed"], "skipped": manifest["skipped"]}
    if a.check_loom:
        check_loom(a.out_dir, manifest)
        summary["loom"] = {m["name"]: m["loom"] for m in manifest["models"]}
    print(json.dumps(summary))
    return 1 if manifest["failed"] and not a.all else 0


if __name__ == "__main__":
    sys.exit(main())
