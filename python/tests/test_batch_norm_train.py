"""Batch normalisation in training from Python (loom.ops.batch_norm_train and its gradient)
against torch.nn.BatchNorm1d/2d in train() and eval() modes: y, the running statistics over
several steps, dx, dscale and dbias; NCHW and NHWC; a bfloat16 x with float32 parameters;
and loom.train(batch_norm=True)."""
import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")


def bn_graph(shape, channels, fmt="NCHW", dtype="float32", param_dtype="float32", momentum=0.1,
             eps=1e-5):
    g = loom.Graph()
    x = g.placeholder("x", dtype, list(shape))
    dy = g.placeholder("dy", dtype, list(shape))
    pd = np.float32 if param_dtype == "float32" else np.float64
    scale = g.variable("scale", np.linspace(0.5, 1.5, channels).astype(pd))
    bias = g.variable("bias", np.linspace(-0.2, 0.3, channels).astype(pd))
    rm = g.variable("running_mean", np.zeros(channels, pd))
    rv = g.variable("running_var", np.ones(channels, pd))
    y, mean, invstd = loom.ops.batch_norm_train(x, scale, bias, rm, rv, momentum=momentum,
                                                epsilon=eps, data_format=fmt)
    loss = loom.ops.reduce_sum(loom.ops.mul(y, dy), axes=[])
    dx, dscale, dbias = g.gradients(loss, [x, scale, bias])
    # batch_norm (inference) takes parameters of x's dtype.
    evaluated = (loom.ops.batch_norm(x, scale, bias, rm, rv, epsilon=eps, data_format=fmt)
                 if dtype == param_dtype else None)
    return g, dict(x=x, dy=dy, y=y, dx=dx, dscale=dscale, dbias=dbias, eval=evaluated, rm=rm,
                   rv=rv)


def torch_bn(channels, rank, momentum=0.1, eps=1e-5, dtype=torch.float32):
    m = (torch.nn.BatchNorm1d if rank <= 3 else torch.nn.BatchNorm2d if rank == 4
         else torch.nn.BatchNorm3d)(channels, momentum=momentum, eps=eps)
    with torch.no_grad():
        m.weight.copy_(torch.linspace(0.5, 1.5, channels))
        m.bias.copy_(torch.linspace(-0.2, 0.3, channels))
    return m.to(dtype)


@pytest.mark.parametrize("shape", [(32, 16), (4, 6, 10), (8, 5, 7, 9), (2, 3, 4, 5, 6)])
def test_training_and_eval_match_torch(shape):
    rng = np.random.default_rng(len(shape))
    c = shape[1]
    g, n = bn_graph(shape, c, momentum=0.2)
    s = loom.Session(g)
    m = torch_bn(c, len(shape), momentum=0.2)
    for step in range(3):
        x = (rng.standard_normal(shape) * (1 + step) + step).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        y, dx, dscale, dbias = s.run([n["y"], n["dx"], n["dscale"], n["dbias"]],
                                     {n["x"]: x, n["dy"]: dy})
        m.train()
        xt = torch.from_numpy(x).requires_grad_()
        yt = m(xt)
        yt.backward(torch.from_numpy(dy))
        np.testing.assert_allclose(np.asarray(y), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(dx), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(dscale), m.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(dbias), m.bias.grad.numpy(), rtol=1e-4, atol=1e-4)
        m.weight.grad = None
        m.bias.grad = None
        rm, rv = s.run([n["rm"], n["rv"]], {})
        np.testing.assert_allclose(np.asarray(rm), m.running_mean.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(rv), m.running_var.numpy(), rtol=1e-5, atol=1e-6)
    # eval(): the running statistics.
    m.eval()
    x = rng.standard_normal(shape).astype(np.float32)
    got = np.asarray(s.run(n["eval"], {n["x"]: x}))
    np.testing.assert_allclose(got, m(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_channels_last_matches_torch_on_the_transposed_batch():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 7, 5, 4)) * 3 + 2).astype(np.float32)  # NHWC, C = 4
    dy = rng.standard_normal(x.shape).astype(np.float32)
    g, n = bn_graph(x.shape, 4, fmt="NHWC")
    y, dx, dscale = loom.Session(g).run([n["y"], n["dx"], n["dscale"]], {n["x"]: x, n["dy"]: dy})
    m = torch_bn(4, 4).train()
    xt = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).requires_grad_()
    m(xt).backward(torch.from_numpy(dy.transpose(0, 3, 1, 2).copy()))
    want = m(xt.detach()).detach().numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dx), xt.grad.numpy().transpose(0, 2, 3, 1),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dscale), m.weight.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_bfloat16_input_keeps_float32_statistics():
    # x in bfloat16, scale/bias/running statistics in float32: the statistics are float32,
    # y is x's bfloat16; against PyTorch in float32 on the same (bfloat16-rounded) values.
    rng = np.random.default_rng(4)
    xb = torch.from_numpy((rng.standard_normal((8, 6, 5, 5)) * 2 + 100).astype(np.float32))
    xb = xb.to(torch.bfloat16)
    dy = torch.from_numpy(rng.standard_normal((8, 6, 5, 5)).astype(np.float32)).to(torch.bfloat16)
    g, n = bn_graph(xb.shape, 6, dtype="bfloat16")
    s = loom.Session(g)
    y, dx = s.run([n["y"], n["dx"]], {n["x"]: xb, n["dy"]: dy})
    y = torch.from_dlpack(y)
    assert y.dtype == torch.bfloat16
    m = torch_bn(6, 4).train()
    xt = xb.float().requires_grad_()
    yt = m(xt)
    yt.backward(dy.float())
    # One bfloat16 rounding of y (|y| < 5: 2^-6 steps at most, half of one off).
    np.testing.assert_allclose(y.float().numpy(), yt.detach().numpy(), rtol=0, atol=2 ** -5)
    np.testing.assert_allclose(torch.from_dlpack(dx).float().numpy(), xt.grad.numpy(),
                               rtol=2 ** -7, atol=2 ** -6)
    # The running mean near 100 kept in float32 (bfloat16 would round 100 ± 0.5).
    np.testing.assert_allclose(np.asarray(s.run(n["rm"], {})), m.running_mean.numpy(),
                               rtol=1e-6, atol=1e-5)


def test_errors_name_the_node():
    g = loom.Graph()
    x = g.placeholder("x", "float32", [4, 3])
    v = g.variable("v", np.ones(4, np.float32))
    with pytest.raises(ValueError, match="scale of shape \\[4\\] must be \\[C\\] = \\[3\\]"):
        loom.ops.batch_norm_train(x, v, v, v, v, name="bn1")
    x1 = g.placeholder("x1", "float32", [1, 4])
    y, _, _ = loom.ops.batch_norm_train(x1, v, v, v, v, name="bn2")
    with pytest.raises(Exception, match="bn2.*more than 1 value per channel"):
        loom.Session(g).run(y, {x1: np.ones((1, 4), np.float32)})


def test_train_with_batch_norm_learns():
    r = loom.train(model="cnn", batch_norm=True, epochs=1, examples=3000, batch=64, threads=1)
    assert "bn" in r["model"]
    assert r["test_accuracy"] > 0.6
