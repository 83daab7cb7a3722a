"""ONNX models in loom.

    model = loom.onnx.load("resnet18.onnx", threads=2)
    (logits,) = model.run({"input": x})          # NumPy arrays or PyTorch tensors
    model.graph, model.session                    # the loom Graph and Session underneath

The model is read by loom's C++ import (ONNX's own library: checker, version converter);
see docs/onnx.md for what is imported and how. Bad models raise loom's errors: ValueError
(a file that does not parse, a model ONNX's checker refuses, a node whose inputs do not
fit), TypeError (ops, opsets or data types loom does not import: one error listing them
all), KeyError (a missing external data file).
"""
import os

import numpy as np

from .. import _loom
from .. import Session

_onnx = _loom._onnx

InputValueRequired = _onnx.InputValueRequired
"""TypeError raised when the import needs a graph input's value (a Reshape's shape fed at
run time): args are (message, input name); load again with input_values={name: value}."""

min_opset = _onnx.min_opset
max_opset = _onnx.max_opset


def supported_ops():
    """The ONNX op types of the default domain loom imports, sorted."""
    return list(_onnx.supported_ops())


def _as_feed(name, value):
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch.Tensor
        value = value.detach()
        if value.device.type != "cpu":
            value = value.cpu()
        return np.require(value.numpy(), requirements="C")  # 0-d stays 0-d
    return value


class Model:
    """An imported ONNX model with a Session to run it.

    input_names / output_names are the model's ONNX names; inputs / outputs describe them
    (dtype, shape with -1 for symbolic dimensions, the symbolic names)."""

    def __init__(self, info, *, threads=None, passes=True, soft_placement=False):
        self.graph = info["graph"]
        self.inputs = info["inputs"]
        self.outputs = info["outputs"]
        self.opset = info["opset"]
        self.file_opset = info["file_opset"]
        self.producer = info["producer"]
        self.variables = info["variables"]
        self.rewrites = info["rewrites"]
        self.input_names = [v["name"] for v in self.inputs]
        self.output_names = [v["name"] for v in self.outputs]
        self._tensor = {v["name"]: v["tensor"] for v in self.inputs + self.outputs}
        self.session = Session(self.graph, threads=threads or 0, passes=passes,
                               soft_placement=soft_placement)

    def tensor_name(self, name):
        """The loom tensor holding ONNX input or output `name` (names not in the model
        pass through, so any loom tensor can be fetched)."""
        return self._tensor.get(name, name)

    def run(self, feeds, outputs=None):
        """Runs the model: feeds maps input names to arrays (NumPy, PyTorch, anything
        NumPy can read); returns a list of NumPy arrays, one per name in `outputs`
        (default: every model output, in order)."""
        if not isinstance(feeds, dict):
            raise TypeError(f"feeds must be a dict of input name to array, not a {type(feeds).__name__}")
        names = self.output_names if outputs is None else list(outputs)
        loom_feeds = {self.tensor_name(k): _as_feed(k, v) for k, v in feeds.items()}
        fetches = [self.tensor_name(n) for n in names]
        results = self.session.run(fetches, loom_feeds)
        if not isinstance(results, list):
            results = [results]
        return [np.asarray(self.session.host_value(r)) for r in results]

    def __call__(self, *args, **kwargs):
        """model(x) or model(input=x): the outputs, as run()."""
        feeds = dict(zip(self.input_names, args))
        feeds.update(kwargs)
        return self.run(feeds)


def load(source, *, threads=None, device=None, passes=True, initializers_as_variables=False,
         input_shapes=None, input_values=None, check=True, fuse_patterns=True,
         external_data_dir=None):
    """Imports an ONNX model: a path, the bytes of a ModelProto, or an onnx.ModelProto.

    threads: CPU threads of the session (default: every core). device ("cuda:0", "cpu")
    asks every node for that device; nodes without a kernel there run where they can (soft
    placement). input_shapes fixes symbolic
    dimensions ({"input": [1, 3, 224, 224]}) so shape computations fold at import;
    input_values gives graph inputs values (they become constants, no longer fed), which
    the import needs for inputs that decide shapes (InputValueRequired names them).
    initializers_as_variables makes float initializers trainable variables. fuse_patterns
    (default on) folds BatchNormalization into the Conv or Gemm before it and imports GELU
    written in pieces as loom's gelu (Model.rewrites lists what it did)."""
    if hasattr(source, "SerializeToString"):  # an onnx.ModelProto
        source = source.SerializeToString()
    elif isinstance(source, os.PathLike):
        source = os.fspath(source)
    info = _onnx.import_model(
        source,
        initializers_as_variables=initializers_as_variables,
        input_shapes={k: [int(d) for d in v] for k, v in (input_shapes or {}).items()},
        input_values={k: _as_feed(k, v) for k, v in (input_values or {}).items()},
        check=check,
        fuse_patterns=fuse_patterns,
        external_data_dir="" if external_data_dir is None else os.fspath(external_data_dir),
        device="" if device is None else str(device),
    )
    return Model(info, threads=threads, passes=passes, soft_placement=device is not None)


def __getattr__(name):
    # loom.onnx.Backend (onnx.backend.base.Backend, loom.onnx.backend) on first use, so that
    # importing loom.onnx does not need ONNX's Python package.
    if name == "Backend":
        from .backend import Backend

        return Backend
    raise AttributeError(f"module 'loom.onnx' has no attribute '{name}'")
