"""loom.onnx.load on models built with onnx.helper: results against float64 NumPy/PyTorch
references, the import's rewrites, values the import needs, and bad models."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
from onnx import TensorProto, helper  # noqa: E402

import loom  # noqa: E402


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, array):
    array = np.asarray(array)
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(array.dtype)
                              if hasattr(helper, "np_dtype_to_tensor_dtype")
                              else onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[array.dtype],
                              array.shape, array.flatten())


def test_conv_batch_norm_is_folded_and_matches_float64():
    rng = np.random.RandomState(0)
    w = rng.randn(4, 3, 3, 3).astype(np.float32)
    b = rng.randn(4).astype(np.float32)
    scale, bias = rng.rand(4).astype(np.float32) + 0.5, rng.randn(4).astype(np.float32)
    mean, var = rng.randn(4).astype(np.float32), rng.rand(4).astype(np.float32) + 0.5
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], name="bn", epsilon=1e-3)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 9, 9])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 5, 5])],
                       [tensor("w", w), tensor("b", b), tensor("s", scale), tensor("bb", bias),
                        tensor("m", mean), tensor("v", var)])
    m = loom.onnx.load(model)
    assert m.rewrites == ["folded BatchNormalization 'bn' into Conv 'conv'"]
    x = rng.randn(2, 3, 9, 9).astype(np.float32)
    (y,) = m.run({"x": x})
    c = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                                   torch.from_numpy(b).double(), stride=2, padding=1)
    ref = torch.nn.functional.batch_norm(c, torch.from_numpy(mean).double(), torch.from_numpy(var).double(),
                                         torch.from_numpy(scale).double(), torch.from_numpy(bias).double(),
                                         training=False, eps=float(np.float32(1e-3))).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    # The same without the rewrite.
    (y2,) = loom.onnx.load(model, fuse_patterns=False).run({"x": x})
    np.testing.assert_allclose(y2, ref, rtol=1e-4, atol=1e-4)


def test_a_reshape_fed_its_shape_runs_with_it():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    m = loom.onnx.load(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for target in [(3, -1), (0, 6), (12, 1)]:
        (y,) = m.run({"x": x, "shape": np.array(target, np.int64)})
        np.testing.assert_array_equal(y, x.reshape(tuple(2 if t == 0 else t for t in target)))


def test_values_the_import_needs_are_named_and_can_be_given():
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="unsqueeze")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                               helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, 3])])
    with pytest.raises(loom.onnx.InputValueRequired) as e:
        loom.onnx.load(model)
    assert e.value.args[1] == "axes"
    assert isinstance(e.value, TypeError)
    m = loom.onnx.load(model, input_values={"axes": np.array([1], np.int64)})
    assert m.input_names == ["x"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = m.run({"x": torch.from_numpy(x)})
    np.testing.assert_array_equal(y, x[:, None, :])


def test_symbolic_dimensions_stay_dynamic_through_shape_computations():
    # Reshape(x, Concat(Shape(x)[0], -1)): a dynamic batch, the rest flattened.
    i0 = tensor("i0", np.array([0], np.int64))
    minus1 = tensor("minus1", np.array([-1], np.int64))
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "i0"], ["n"], name="batch"),
             helper.make_node("Concat", ["n", "minus1"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="flatten")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "f"])], [i0, minus1])
    m = loom.onnx.load(model)
    for shape in [(1, 3, 4), (5, 2, 4)]:
        x = np.random.RandomState(1).randn(*shape).astype(np.float32)
        (y,) = m.run({"x": x})
        np.testing.assert_array_equal(y, x.reshape(shape[0], -1))


def test_unsupported_ops_are_listed_in_one_error():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("NonMaxSuppression", ["a", "a"], ["b"], name="nms1"),
             helper.make_node("Custom", ["b"], ["y"], name="c1", domain="com.example")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model.opset_import.append(helper.make_opsetid("com.example", 3))
    with pytest.raises(TypeError) as e:
        loom.onnx.load(model, check=False)
    text = str(e.value)
    assert "ai.onnx NonMaxSuppression (opset 17): 1 node 'nms1'" in text
    assert "com.example Custom (opset 3): 1 node 'c1'" in text


def test_bad_bytes_and_feeds_are_typed_errors_and_the_model_goes_on():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    data = model.SerializeToString()
    with pytest.raises(ValueError):
        loom.onnx.load(b"\x08\x07garbage" + data[:5])
    m = loom.onnx.load(data)
    with pytest.raises(ValueError, match="expects float32"):
        m.run({"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(ValueError):
        m.run({"x": np.zeros((2, 3), np.float64)})
    (y,) = m.run({"x": np.array([[-1, 0, 2]], np.float32)})
    np.testing.assert_array_equal(y, [[0, 0, 2]])


def test_supported_ops_cover_the_common_model_ops():
    ops = set(loom.onnx.supported_ops())
    for op in ["Conv", "Gemm", "MatMul", "Relu", "MaxPool", "GlobalAveragePool", "Flatten",
               "Reshape", "Shape", "Gather", "Concat", "Softmax", "LayerNormalization",
               "BatchNormalization", "Clip", "Add", "Transpose", "Slice", "Unsqueeze"]:
        assert op in ops, op


def test_training_dropout_draws_a_new_mask_each_run_and_its_mask_output_matches():
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], name="drop", seed=3)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64]),
                        helper.make_tensor_value_info("mask", TensorProto.BOOL, [64, 64])],
                       [tensor("ratio", np.array(0.25, np.float32)), tensor("training", np.array(True))])
    m = loom.onnx.load(model)
    x = np.random.RandomState(1).rand(64, 64).astype(np.float32) + 1.0
    runs = [m.run({"x": x}) for _ in range(3)]
    for y, mask in runs:
        assert mask.dtype == np.bool_
        np.testing.assert_allclose(y, np.where(mask, x / np.float32(0.75), 0), rtol=1e-6)
        assert abs(mask.mean() - 0.75) < 0.03  # 4096 draws: the standard error is below 0.007
    assert not np.array_equal(runs[0][1], runs[1][1])
    # A new model repeats the sequence: the masks come from the seed.
    np.testing.assert_array_equal(loom.onnx.load(model).run({"x": x})[1], runs[0][1])


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[1, 0, 1, 0, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 2, 2], strides=[2, 1, 2], dilations=[1, 2, 1], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 2, 3], strides=[1, 2, 1], pads=[1, 0, 1, 1, 1, 0],
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2], ceil_mode=1)),
])
def test_3d_pooling_runs_as_two_2d_pools_and_matches_pytorch(op, attrs):
    nodes = [helper.make_node(op, ["x"], ["y"], name="pool", **attrs)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 5, 7, 6])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d", "e"])])
    x = np.random.RandomState(2).randn(2, 3, 5, 7, 6).astype(np.float32)
    (y,) = loom.onnx.load(model).run({"x": x})
    k, s, p = attrs["kernel_shape"], attrs["strides"], attrs.get("pads", [0] * 6)
    # PyTorch pads symmetrically: pad explicitly (-inf for max, 0 and a count for average).
    t = torch.from_numpy(x).double()
    pad = (p[2], p[5], p[1], p[4], p[0], p[3])
    ceil = bool(attrs.get("ceil_mode", 0))
    if op == "MaxPool":
        ref = torch.nn.functional.max_pool3d(torch.nn.functional.pad(t, pad, value=-np.inf), k, s,
                                             dilation=attrs.get("dilations", 1), ceil_mode=ceil)
    else:
        total = torch.nn.functional.avg_pool3d(torch.nn.functional.pad(t, pad), k, s, ceil_mode=ceil,
                                               divisor_override=1)
        # The count: padded elements count with count_include_pad, the input's always.
        inside = torch.nn.functional.pad(torch.ones_like(t), pad, value=float(attrs.get("count_include_pad", 0)))
        count = torch.nn.functional.avg_pool3d(inside, k, s, ceil_mode=ceil, divisor_override=1)
        ref = total / count
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n,c,o,dhw,k,s,d,p,op,g,bias", [
    (1, 1, 2, (3, 4, 5), (3, 3, 3), [1, 1, 1], [1, 1, 1], [0] * 6, [0, 0, 0], 1, True),
    (2, 3, 4, (4, 5, 3), (3, 2, 3), [2, 1, 2], [1, 1, 1], [1, 0, 1, 1, 0, 1], [1, 0, 1], 1, True),
    (2, 4, 6, (3, 3, 4), (2, 3, 2), [3, 2, 1], [2, 1, 2], [0, 1, 0, 2, 1, 1], [0, 1, 0], 2, True),
    (1, 2, 2, (5, 2, 2), (1, 1, 1), [2, 2, 2], [1, 1, 1], [0] * 6, [1, 1, 1], 1, False),
    (3, 2, 3, (2, 3, 3), (4, 2, 2), [1, 3, 1], [1, 1, 2], [2, 0, 0, 1, 0, 1], [0, 2, 0], 1, True),
])
def test_3d_conv_transpose_runs_as_2d_ones_and_matches_pytorch(n, c, o, dhw, k, s, d, p, op, g, bias):
    rng = np.random.default_rng(len(dhw) + sum(k) + sum(p))
    x = rng.standard_normal((n, c, *dhw)).astype(np.float32)
    w = rng.standard_normal((c, o // g, *k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    inits = [tensor("w", w)] + ([tensor("b", b)] if bias else [])
    node = helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["y"], name="deconv",
                            strides=s, dilations=d, pads=p, output_padding=op, group=g)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", c, *dhw])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", o, "d", "h", "w"])], inits)
    (y,) = loom.onnx.load(model).run({"x": x})
    # PyTorch's padding is symmetric: pad nothing, then cut ONNX's begins and ends.
    full = torch.nn.functional.conv_transpose3d(
        torch.from_numpy(x).double(), torch.from_numpy(w).double(),
        torch.from_numpy(b).double() if bias else None, stride=s, output_padding=op, groups=g,
        dilation=d).numpy()
    ref = full[:, :, p[0]:full.shape[2] - p[3], p[1]:full.shape[3] - p[4], p[2]:full.shape[4] - p[5]]
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_3d_conv_transpose_needs_its_spatial_size_at_import():
    w = np.ones((1, 1, 2, 2, 2), np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv")
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1, "d", 3, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1, "a", 4, 4])], [tensor("w", w)])
    with pytest.raises(Exception, match="deconv.*3-D ConvTranspose needs the input's channels and spatial size"):
        loom.onnx.load(model)
