"""The Python API as NumPy and PyTorch users expect it: Python numbers beside an Output follow
PyTorch's promotion (checked against torch), `/` is true division, unknown dtypes are
TypeErrors, split takes sizes alone, a Session says when a node came after it, and Adam
counts its own steps when given none (checked against a float64 Adam in NumPy)."""
import numpy as np
import pytest
import torch

import loom


def run1(s, y, feeds):
    return np.asarray(s.run(y, feeds))


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8", "uint8", "bool", "float16", "float32"])
@pytest.mark.parametrize("number", [2, 2.5, -3, True])
@pytest.mark.parametrize("op", ["add", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv"])
def test_python_numbers_promote_as_in_pytorch(dtype, number, op):
    values = np.array([1, 2, 3], dtype=dtype)
    if op in ("sub", "rsub") and (dtype == "bool" or isinstance(number, bool)):
        pytest.skip("PyTorch refuses subtraction with bools")
    if dtype == "bool" and isinstance(number, bool) and op not in ("truediv", "rtruediv"):
        pytest.skip("loom has no arithmetic on bools (a ValueError naming the op)")
    if dtype == "uint8" and number == -3:
        pytest.skip("out of uint8's range: an error (tested below)")
    if op == "rtruediv" and dtype == "bool":
        values = np.array([True, True, True])
    g = loom.Graph()
    x = g.placeholder("x", dtype, [3])
    t = torch.from_numpy(values)
    fn = {
        "add": lambda a: a + number, "sub": lambda a: a - number, "rsub": lambda a: number - a,
        "mul": lambda a: a * number, "rmul": lambda a: number * a,
        "truediv": lambda a: a / number, "rtruediv": lambda a: number / a,
    }[op]
    want = fn(t)
    y = fn(x)
    got = run1(loom.Session(g), y, {x: values})
    assert str(y.dtype.name) == str(want.dtype).replace("torch.", ""), (y.dtype, want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.numpy().astype(np.float64), rtol=1e-3)


def test_python_ints_that_do_not_fit_are_errors():
    g = loom.Graph()
    x = g.placeholder("x", loom.int32, [3])
    u = g.placeholder("u", loom.uint8, [3])
    with pytest.raises(OverflowError, match="does not fit int32"):
        x + 2**40
    with pytest.raises(OverflowError, match="does not fit uint8"):
        u * 300
    with pytest.raises(TypeError, match="unsupported operand"):
        x + "1"


def test_unknown_dtypes_are_type_errors():
    g = loom.Graph()
    with pytest.raises(TypeError, match="complex64"):
        g.placeholder("c", "complex64", [1])
    with pytest.raises(TypeError):
        g.placeholder("c", np.complex64, [1])
    with pytest.raises(TypeError):
        g.variable("v", dtype="float128", shape=[1])


def test_split_takes_sizes_alone():
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [2, 5])
    a, b = loom.ops.split(x, sizes=[2, 3], axis=1)
    v = np.arange(10, dtype=np.float32).reshape(2, 5)
    got = loom.Session(g).run([a, b], {x: v})
    np.testing.assert_array_equal(np.asarray(got[0]), v[:, :2])
    np.testing.assert_array_equal(np.asarray(got[1]), v[:, 2:])


def test_a_session_says_when_a_node_came_after_it():
    g = loom.Graph()
    x = g.placeholder("x", loom.float32, [2])
    s = loom.Session(g)
    y = loom.ops.exp(x, name="exp")
    with pytest.raises(KeyError, match="added to the Graph after this Session was made"):
        s.run(y, {x: np.zeros(2, np.float32)})
    np.testing.assert_allclose(run1(loom.Session(g), y, {x: np.zeros(2, np.float32)}), [1, 1])
    with pytest.raises(KeyError, match="no node named 'nothing'"):
        s.run("nothing")


def adam_reference(w, grads, lr=0.1, b1=0.9, b2=0.999, eps=1e-8):
    w = w.astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return w


@pytest.mark.parametrize("fused", [True, False])
def test_adam_counts_its_own_steps(rng, fused):
    g = loom.Graph()
    w0 = rng.standard_normal(6).astype(np.float32)
    w = g.variable("w", init=w0)
    target = g.placeholder("t", loom.float32, [6])
    diff = w - target
    loss = loom.ops.reduce_sum(diff * diff, axes=[0])
    (dw,) = g.gradients(loss, [w])
    lr = g.constant(np.float32(0.1))
    update = g.fused_adam([w], [dw], lr)[0] if fused else g.apply_adam(w, dw, lr)
    s = loom.Session(g)
    targets = [rng.standard_normal(6).astype(np.float32) for _ in range(4)]
    grads = []
    for tv in targets:
        current = np.asarray(s.variable("w")).astype(np.float64)
        grads.append(2 * (current - tv))
        s.run(loss, {target: tv}, targets=[update])
    np.testing.assert_allclose(np.asarray(s.variable("w")), adam_reference(w0, grads), rtol=1e-4,
                               atol=1e-5)
    assert int(np.asarray(s.variable("adam_step"))) == 5  # the next step's number


def test_a_skipped_fused_step_is_not_counted():
    g = loom.Graph()
    w = g.variable("w", init=np.ones(3, np.float32))
    grad = g.placeholder("grad", loom.float32, [3])
    update, _, found_inf = g.fused_adam([w], [grad], g.constant(np.float32(0.1)))
    s = loom.Session(g)
    s.run(found_inf, {grad: np.ones(3, np.float32)}, targets=[update])
    assert bool(np.asarray(s.run(found_inf, {grad: np.array([1, np.inf, 1], np.float32)},
                                 targets=[update])))
    assert int(np.asarray(s.variable("adam_step"))) == 2


def test_sgd_takes_the_keywords_of_its_op():
    g = loom.Graph()
    w = g.variable("w", init=np.ones(3, np.float32))
    grad = g.placeholder("grad", loom.float32, [3])
    lr = g.constant(np.float32(0.5))
    name = g.apply_sgd(w, grad, lr, momentum=0.9, moment_dtype=loom.bfloat16, master_weights=False)
    s = loom.Session(g)
    s.run(grad, {grad: np.ones(3, np.float32)}, targets=[name])
    np.testing.assert_allclose(np.asarray(s.variable("w")), [0.5, 0.5, 0.5])
    update, norm, _ = g.fused_sgd([w], [grad], lr, momentum=0.9, moment_dtype=loom.float32)
    assert isinstance(update, str) and norm.dtype == loom.float32
