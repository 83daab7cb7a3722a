"""loom.onnx.backend: ONNX's backend interface over loom.onnx.load (prepare, run, run_node,
supports_device, is_compatible) on small hand-built models, against NumPy."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
lo = pytest.importorskip("loom.onnx")
if not hasattr(lo, "load"):
    pytest.skip("loom.onnx has no load()", allow_module_level=True)
from onnx import TensorProto, helper  # noqa: E402

from loom.onnx import backend  # noqa: E402
from loom.onnx.backend import Backend  # noqa: E402


def two_output_model():
    """s = a + b, p = relu(a) * b, listed as outputs (p, s): not in node order."""
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "b"], ["p"], name="mul")]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])


@pytest.fixture
def ab(rng):
    return (rng.standard_normal((2, 3)).astype(np.float32),
            rng.standard_normal((2, 3)).astype(np.float32))


def test_outputs_in_graph_output_order(ab):
    a, b = ab
    rep = Backend.prepare(two_output_model(), "CPU")
    p, s = rep.run([a, b])
    np.testing.assert_allclose(p, np.maximum(a, 0) * b, rtol=1e-6)
    np.testing.assert_allclose(s, a + b, rtol=1e-6)


def test_run_by_name_and_outputs_by_name(ab):
    a, b = ab
    out = Backend.prepare(two_output_model().SerializeToString(), "CPU").run({"b": b, "a": a})
    np.testing.assert_allclose(out["s"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["p"], out[0])


def test_run_model(ab):
    a, b = ab
    p, s = Backend.run_model(two_output_model(), [a, b])
    np.testing.assert_allclose(s, a + b, rtol=1e-6)


def test_too_many_inputs(ab):
    rep = Backend.prepare(two_output_model(), "CPU")
    with pytest.raises(ValueError, match="3 inputs given"):
        rep.run([ab[0], ab[1], ab[0]])


def test_run_node(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    (y,) = Backend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    (z,) = Backend.run_node(helper.make_node("Sub", ["x", "w"], ["z"]), [x, x[:1]],
                            outputs_info=[(np.float32, (3, 4))], opset_version=14)
    np.testing.assert_allclose(z, x - x[:1], rtol=1e-6)


def test_run_node_checks_the_node():
    # ONNX's checker refuses a node of an op it does not know, before loom sees it.
    with pytest.raises(Exception, match="NoSuchOp"):
        Backend.run_node(helper.make_node("NoSuchOp", ["x"], ["y"]), [np.ones(2, np.float32)])


def test_checker_refuses_a_broken_model():
    model = two_output_model()
    model.graph.node[0].input[1] = "undefined_value"
    with pytest.raises(Exception, match="undefined_value"):
        Backend.prepare(model, "CPU")


def test_supports_device():
    assert Backend.supports_device("CPU")
    assert not Backend.supports_device("FPGA")


def test_unsupported_ops_by_name():
    model = two_output_model()
    assert backend.unsupported_ops(model, supported=["Add", "Relu", "Mul"]) == []
    assert backend.unsupported_ops(model, supported=["Add"]) == ["Mul", "Relu"]
    model.graph.node.append(helper.make_node("Scaler", ["s"], ["t"], domain="ai.onnx.ml"))
    assert backend.unsupported_ops(model, supported=["Add", "Relu", "Mul"]) == ["ai.onnx.ml:Scaler"]


def test_subgraph_ops_are_counted():
    branch = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "then", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["y2"])], "else", [],
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=other)
    graph = helper.make_graph([node], "g", [], [])
    assert backend.graph_op_types(graph) == {("", "If"), ("", "Neg"), ("", "Abs")}


def test_is_compatible_follows_supported_ops():
    supported = set(lo.supported_ops())
    model = two_output_model()
    assert Backend.is_compatible(model) == ({"Add", "Relu", "Mul"} <= supported)
    model.graph.node.append(helper.make_node("NoSuchOp", ["s"], ["t"]))
    assert not Backend.is_compatible(model)


def test_backend_is_exported_by_loom_onnx():
    assert lo.Backend is Backend


def test_inputs_that_decide_shapes_are_taken_at_run_time(rng):
    # The axes of an Unsqueeze fed as a graph input: each run imports with that value.
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["d0", "d1", "d2"])])
    rep = Backend.prepare(helper.make_model(graph, opset_imports=[
        helper.make_operatorsetid("", 13)]), "CPU")
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for axis in (0, 2, -1):
        (y,) = rep.run([x, np.array([axis], np.int64)])
        np.testing.assert_array_equal(y, np.expand_dims(x, axis))
