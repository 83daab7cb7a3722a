"""Every op of loom's registry as a function of Outputs.

    loom.ops.relu(x)                      # g.op("relu", [x])
    loom.ops.matmul(a, b, transpose_b=True)
    loom.ops.concat([a, b], axis=1)       # list inputs as a list
    loom.ops.zeros(graph=g, shape=[2, 3], dtype=loom.float32)   # ops without inputs
    loom.ops.split(x, sizes=[1, 2], axis=1)   # num_splits follows from sizes

The functions are made from the registry (loom.op_def(name)) when first asked for, so
ops added to loom appear here without a wrapper to write. Attributes are keywords; name=
and device= set the node's name and device.
"""
from . import _loom


def _graph_of(inputs):
    for x in inputs:
        if isinstance(x, _loom.Output):
            return x.graph
        if isinstance(x, (list, tuple)):
            g = _graph_of(x)
            if g is not None:
                return g
    return None


def _make(op):
    definition = _loom.op_def(op)
    input_args = definition["inputs"]

    def function(*inputs, graph=None, name=None, device=None, **attrs):
        if len(inputs) > len(input_args):
            raise TypeError(f"{op} takes {len(input_args)} inputs, got {len(inputs)}")
        flat = []
        for arg, value in zip(input_args, inputs):
            values = value if arg["list"] else [value]
            if arg["list"] and not isinstance(value, (list, tuple)):
                raise TypeError(f"{op}: input '{arg['name']}' is a list of Outputs")
            for v in values:
                if not isinstance(v, _loom.Output):
                    raise TypeError(f"{op}: input '{arg['name']}' must be a loom.Output, "
                                    f"not a {type(v).__name__}")
            flat.extend(values)
        g = graph if graph is not None else _graph_of(flat)
        if g is None:
            raise TypeError(f"{op}: no input Output to take the graph from; pass graph=")
        return g.op(op, flat, name=name, device=device, **attrs)

    function.__name__ = op
    function.__qualname__ = op
    function.__doc__ = (definition["summary"] or op) + "\n\nInputs: " + (
        ", ".join(a["name"] + ("[]" if a["list"] else "") for a in input_args) or "none"
    ) + "\nAttributes: " + (", ".join(
        f"{a['name']} ({a['type']}{', required' if a['required'] else ''})"
        for a in definition["attrs"]) or "none")
    return function


_names = set(_loom.op_names())


def __getattr__(name):
    if name in _names:
        function = _make(name)
        globals()[name] = function
        return function
    raise AttributeError(f"loom has no op '{name}'")


def __dir__():
    return sorted(_names)
