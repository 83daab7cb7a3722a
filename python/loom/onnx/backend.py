"""loom as an ONNX backend (onnx.backend.base.Backend), for ONNX's backend test runner.

    import onnx, numpy as np
    from loom.onnx.backend import Backend
    rep = Backend.prepare(onnx.load("model.onnx"), "CPU")
    (y,) = rep.run([np.ones((1, 3, 224, 224), np.float32)])

prepare() checks the model with ONNX's checker and imports it with loom.onnx.load; the
returned BackendRep's run(inputs) takes the graph inputs in graph order (a list or tuple, one
array for a one-input model) or by name (a dict) and returns the outputs in graph-output
order, as a tuple that also answers to output names. run_node() wraps one NodeProto in a
model and runs that. Devices: "CPU" always; "CUDA" / "CUDA:k" where loom has that CUDA device
and its loom.onnx.load takes a device.
is_compatible() is False for a model that uses an op outside loom.onnx.supported_ops().
"""
import inspect

import numpy as np
import onnx
import onnx.mapping
import onnx.shape_inference
from onnx import helper
from onnx.backend.base import Backend as _OnnxBackend
from onnx.backend.base import BackendRep as _OnnxBackendRep
from onnx.backend.base import Device, DeviceType, namedtupledict


def _loom_onnx():
    # Imported when first used: loom.onnx itself loads this module on first use (Backend).
    from loom import onnx as loom_onnx

    return loom_onnx


def _loom_device(device):
    """loom's name for an ONNX backend device string ("CPU" -> "cpu", "CUDA:1" -> "cuda:1")."""
    d = Device(device)
    if d.type == DeviceType.CPU:
        return "cpu"
    return f"cuda:{d.device_id}"


def _tensor_type(dtype):
    """ONNX's TensorProto data type for a NumPy dtype."""
    return onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[np.dtype(dtype)]


def graph_op_types(graph):
    """Every (domain, op_type) used in `graph`, subgraphs (If, Loop, Scan bodies) included."""
    found = set()
    for node in graph.node:
        found.add((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found |= graph_op_types(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    found |= graph_op_types(g)
    return found


def unsupported_ops(model, supported=None):
    """The ops of `model` loom does not import, sorted, by name ("Loop", "ai.onnx.ml:Scaler")."""
    if supported is None:
        supported = _loom_onnx().supported_ops()
    supported = set(supported)
    missing = set()
    for domain, op in graph_op_types(model.graph):
        if domain == "":
            if op not in supported:
                missing.add(op)
        else:
            missing.add(f"{domain}:{op}")
    return sorted(missing)


class BackendRep(_OnnxBackendRep):
    """An imported model: run(inputs) returns its outputs in graph-output order.

    A model with graph inputs whose values loom's import needs (a Reshape's shape, the axes
    of an Unsqueeze, fed at run time: loom.onnx.InputValueRequired) is imported at run time
    instead, each run, with those inputs' values given as constants (load's input_values)."""

    def __init__(self, model, graph_inputs, output_names, load=None, needed=()):
        self.model = model
        # The graph inputs that are fed (ONNX models of IR version < 4 also list the
        # initializers among the inputs; those are not fed).
        self.input_names = list(graph_inputs)
        self.output_names = list(output_names)
        # Where the import waits for values: load(input_values) and the inputs it needs.
        self._load = load
        self._needed = list(needed)

    def run(self, inputs, **kwargs):
        """The outputs for `inputs`: a dict by input name, or the fed inputs in graph order."""
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise ValueError(f"{len(inputs)} inputs given, the model takes "
                                 f"{len(self.input_names)} ({', '.join(self.input_names)})")
            feeds = dict(zip(self.input_names, inputs))
        model = self.model
        if model is None:
            model = self._import_with_values(feeds)
            feeds = {k: v for k, v in feeds.items() if k not in self._needed}
        outputs = model.run(feeds)
        return namedtupledict("Outputs", self.output_names)(*outputs)

    def _import_with_values(self, feeds):
        lo = _loom_onnx()
        while True:
            missing = [n for n in self._needed if n not in feeds]
            if missing:
                raise ValueError(f"the model needs the values of inputs {', '.join(missing)}")
            try:
                return self._load({n: feeds[n] for n in self._needed})
            except lo.InputValueRequired as e:
                if e.args[1] in self._needed:
                    raise
                self._needed.append(e.args[1])


class Backend(_OnnxBackend):
    """ONNX's backend interface over loom.onnx.load."""

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs):
        return cls.supports_device(device) and not unsupported_ops(model)

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        """Checks `model` (a ModelProto or its bytes) and imports it for `device`.

        kwargs: threads (loom.onnx.load's intra-op thread count)."""
        if isinstance(model, (bytes, bytearray)):
            model = onnx.load_model_from_string(bytes(model))
        super().prepare(model, device, **kwargs)
        lo = _loom_onnx()
        options = {"threads": kwargs.get("threads")}
        if Device(device).type != DeviceType.CPU:
            options["device"] = _loom_device(device)
        data = model.SerializeToString()
        initializers = {t.name for t in model.graph.initializer}
        fed = [i.name for i in model.graph.input if i.name not in initializers]
        outputs = [o.name for o in model.graph.output]
        try:
            return BackendRep(lo.load(data, **options), fed, outputs)
        except lo.InputValueRequired as e:
            return BackendRep(None, fed, outputs, needed=[e.args[1]],
                              load=lambda values: lo.load(data, input_values=values, **options))

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        """Runs one node on `inputs` (arrays for its present inputs, in order).

        outputs_info: (numpy dtype, shape) per output, when known; kwargs: opset_version."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        present = [n for n in node.input if n != ""]
        if isinstance(inputs, dict):
            arrays = [np.asarray(inputs[n]) for n in present]
        else:
            arrays = [np.asarray(x) for x in inputs]
        if len(arrays) != len(present):
            raise ValueError(f"node {node.name or node.op_type} has {len(present)} inputs, "
                             f"{len(arrays)} given")
        graph_inputs = [
            helper.make_tensor_value_info(n, _tensor_type(a.dtype), a.shape)
            for n, a in zip(present, arrays)]
        opset = kwargs.get("opset_version", min(onnx.defs.onnx_opset_version(), 17))
        opsets = [helper.make_operatorsetid("", opset)]
        outputs = [n for n in node.output if n != ""]
        if outputs_info is not None and len(outputs_info) >= len(outputs):
            graph_outputs = [helper.make_tensor_value_info(n, _tensor_type(dtype), shape)
                             for n, (dtype, shape) in zip(outputs, outputs_info)]
        else:
            # ONNX's shape inference types the outputs (a model's outputs must have types).
            probe = helper.make_model(
                helper.make_graph([node], "probe", graph_inputs, []), opset_imports=opsets)
            inferred = {v.name: v for v in
                        onnx.shape_inference.infer_shapes(probe).graph.value_info}
            untyped = [n for n in outputs if n not in inferred]
            if untyped:
                raise ValueError(f"node {node.name or node.op_type}: ONNX's shape inference "
                                 f"gives no type for {', '.join(untyped)}; pass outputs_info")
            graph_outputs = [inferred[n] for n in outputs]
        graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        model = helper.make_model(graph, opset_imports=opsets)
        return cls.prepare(model, device).run(arrays)

    @classmethod
    def supports_device(cls, device):
        try:
            d = Device(device)
        except (AttributeError, ValueError):
            return False
        if d.type == DeviceType.CPU:
            return True
        from loom import cuda

        # A model is put on a GPU by load(device=...), where this loom's load takes one.
        takes_device = "device" in inspect.signature(_loom_onnx().load).parameters
        return takes_device and cuda.is_available() and d.device_id < cuda.device_count()


prepare = Backend.prepare
run_model = Backend.run_model
run_node = Backend.run_node
supports_device = Backend.supports_device
