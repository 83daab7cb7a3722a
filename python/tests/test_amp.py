"""Automatic mixed precision from Python: loom.amp.enable on a Graph against PyTorch's CPU
autocast (torch.autocast("cpu", dtype=torch.bfloat16)) on the same weights and inputs, a
float16 training step with loom.amp.LossScaler skipping an overflow, the policy's checks,
and loom.train(amp=...)."""
import numpy as np
import pytest

import loom

torch = pytest.importorskip("torch")

# Lower where this CPU only emulates a precision too: the answers are the same, and the
# tests must not depend on the machine's instructions.
EMULATED = {"allow_emulated": True}


def mlp(g, rng, batch=32, features=48, hidden=64, classes=10):
    x = g.placeholder("x", loom.float32, [batch, features])
    w1v = (rng.standard_normal((features, hidden)) * 0.2).astype(np.float32)
    b1v = (rng.standard_normal(hidden) * 0.1).astype(np.float32)
    w2v = (rng.standard_normal((hidden, classes)) * 0.2).astype(np.float32)
    w1 = g.variable("w1", w1v)
    b1 = g.variable("b1", b1v)
    w2 = g.variable("w2", w2v)
    h = loom.ops.relu(loom.ops.bias_add(loom.ops.matmul(x, w1), b1))
    logits = loom.ops.matmul(h, w2, name="logits")
    return x, logits, (w1v, b1v, w2v), (w1, b1, w2)


def test_forward_matches_pytorch_cpu_autocast(rng):
    g = loom.Graph()
    x, logits, (w1v, b1v, w2v), _ = mlp(g, rng)
    xv = rng.standard_normal((32, 48)).astype(np.float32)
    loom.amp.enable(g, dtype="bf16", policy=EMULATED)
    got = np.asarray(loom.Session(g).run(logits, {x: xv}))
    assert got.dtype == np.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.relu(torch.from_numpy(xv) @ torch.from_numpy(w1v) + torch.from_numpy(b1v))
        want = (h @ torch.from_numpy(w2v)).float().numpy()
    plain = np.asarray(loom.Session(loom.amp.disable(g)).run(logits, {x: xv}))
    # Both round the products' inputs and results to bfloat16 (8 bits of mantissa); they
    # differ where float32 sums land either side of a rounding step, and autocast adds the
    # bias in bfloat16 where loom adds it in float32: a few bfloat16 steps at most.
    scale = np.abs(plain).max()
    assert np.abs(got - want).max() <= 0.03 * scale
    # And both are further from float32 than from each other's rounding noise.
    assert np.abs(got - plain).max() > 1e-4


def test_enable_disable_and_the_log(rng):
    g = loom.Graph()
    x, logits, _, _ = mlp(g, rng)
    assert loom.amp.options(g)["dtype"] == "float32"
    loom.amp.enable(g, policy=EMULATED)
    assert loom.amp.options(g)["dtype"] == "bfloat16"
    log = loom.Session(g).explain_passes(logits, [x])
    lowered = [r for r in log if r["pass"] == "amp" and r["kind"] == "rewrite"]
    assert len(lowered) == 2 and all("bfloat16" in r["result"] for r in lowered)
    loom.amp.disable(g)
    assert not [r for r in loom.Session(g).explain_passes(logits, [x]) if r["pass"] == "amp"]
    policy = loom.amp.default_policy()
    assert "matmul" in policy["lower"] and "softmax" in policy["keep_float32"]


def test_bad_policies_name_what_is_wrong(rng):
    g = loom.Graph()
    mlp(g, rng)
    with pytest.raises(ValueError, match="'matmull', which is not an op"):
        loom.amp.enable(g, policy={"lower": ["matmull"]})
    loom.amp.enable(g, policy={"nodes": {"no_such_node": True}})
    log = loom.Session(g).explain_passes("logits", ["x"])
    assert any(r["nodes"] == ["no_such_node"] and "does not have" in r["reason"] for r in log)
    loom.amp.disable(g)
    with pytest.raises(ValueError, match="unknown policy key 'lowr'"):
        loom.amp.enable(g, policy={"lowr": []})
    with pytest.raises(ValueError, match="unknown precision 'int8'"):
        loom.amp.enable(g, dtype="int8")
    assert loom.amp.options(g)["dtype"] == "float32", "a refused call changes nothing"


def test_float16_step_with_a_loss_scaler_skips_an_overflow(rng):
    g = loom.Graph()
    x, logits, _, params = mlp(g, rng)
    labels = g.placeholder("labels", loom.int32, [32])
    loss = loom.ops.reduce_mean(loom.ops.softmax_cross_entropy(logits, labels)[0], axes=[0])
    scale = g.placeholder("scale", loom.float32, [])
    grads = g.gradients(loss * scale, list(params))
    update, _, found_inf = g.fused_adam(list(params), grads, g.constant(np.float32(1e-2)),
                                        grad_scale=scale)
    loom.amp.enable(g, dtype="fp16", policy=EMULATED)
    s = loom.Session(g)
    scaler = loom.amp.LossScaler(initial=1e9, growth_interval=1000)
    xv = rng.standard_normal((32, 48)).astype(np.float32)
    lv = (np.arange(32) % 10).astype(np.int32)
    w_before = np.asarray(s.run("w1")).copy()
    losses, skips = [], []
    for _ in range(25):
        feeds = {x: xv, labels: lv, scale: np.float32(scaler.scale)}
        out = s.run([loss, found_inf], feeds, [update])
        inf = bool(np.asarray(out[1]))
        skips.append(inf)
        if inf and len(skips) == 1:
            # The skipped step left the master weights as they were.
            np.testing.assert_array_equal(np.asarray(s.run("w1")), w_before)
        scaler.update(inf)
        losses.append(float(np.asarray(out[0])))
    assert skips[0], "1e9 times the gradients overflows float16"
    assert not all(skips) and scaler.skipped_steps >= 1
    assert scaler.scale < 1e9
    assert np.asarray(s.run("w1")).dtype == np.float32
    taken = [l for l, k in zip(losses, skips) if not k]
    assert taken[-1] < taken[0]


def test_loss_scaler_rules():
    s = loom.amp.LossScaler(initial=8.0, growth_interval=2, max_consecutive_skips=2)
    s.update(False)
    s.update(False)
    assert s.scale == 16.0
    s.update(True)
    assert s.scale == 8.0 and s.skipped_steps == 1
    with pytest.raises(RuntimeError, match="2 steps in a row"):
        s.update(True)
    with pytest.raises(ValueError, match="backoff"):
        loom.amp.LossScaler(backoff=2.0)


def test_train_with_bf16_amp():
    opts = dict(model="mlp", hidden=[64], epochs=2, batch=32, lr=3e-3, examples=2400, threads=1)
    report = loom.train(amp="bf16", **opts)
    plain = loom.train(**opts)
    assert report["test_accuracy"] > plain["test_accuracy"] - 0.02
    assert report["loss_scale"] == 0.0
    with pytest.raises(ValueError, match="unknown precision"):
        loom.train(model="mlp", hidden=[32], epochs=1, batch=32, examples=800, amp="fp8")


def _loss_curves(rng, steps=40, batch=64, features=64, hidden=128, classes=10):
    """Loss curves of one MLP, the same init and batches, trained with Adam by loom (float32
    and bfloat16 AMP) and PyTorch (float32 and CPU autocast bfloat16)."""
    centers = rng.standard_normal((classes, features)).astype(np.float32)
    labels = rng.integers(0, classes, size=(steps, batch)).astype(np.int32)
    xs = (centers[labels] + 1.5 * rng.standard_normal((steps, batch, features))).astype(np.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, classes))
    init = [p.detach().numpy().copy() for p in model.parameters()]

    def torch_curve(autocast):
        m = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, classes))
        with torch.no_grad():
            for p, v in zip(m.parameters(), init):
                p.copy_(torch.from_numpy(v))
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        out = []
        for k in range(steps):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = m(torch.from_numpy(xs[k]))
            loss = torch.nn.functional.cross_entropy(logits.float(), torch.from_numpy(labels[k]).long())
            loss.backward()
            opt.step()
            out.append(loss.item())
        return np.array(out)

    def loom_curve(amp):
        g = loom.Graph()
        x = g.placeholder("x", loom.float32, [batch, features])
        y = g.placeholder("y", loom.int32, [batch])
        # PyTorch keeps Linear weights as [out, in]: loom's products take [in, out].
        w1 = g.variable("w1", np.ascontiguousarray(init[0].T))
        b1 = g.variable("b1", init[1])
        w2 = g.variable("w2", np.ascontiguousarray(init[2].T))
        b2 = g.variable("b2", init[3])
        h = loom.ops.relu(loom.ops.bias_add(loom.ops.matmul(x, w1), b1))
        logits = loom.ops.bias_add(loom.ops.matmul(h, w2), b2)
        loss = loom.ops.reduce_mean(loom.ops.softmax_cross_entropy(logits, y)[0], axes=[0])
        params = [w1, b1, w2, b2]
        update, _, _ = g.fused_adam(params, g.gradients(loss, params), g.constant(np.float32(1e-3)))
        if amp:
            loom.amp.enable(g, dtype="bf16", policy=EMULATED)
        s = loom.Session(g)
        return np.array([float(np.asarray(s.run(loss, {x: xs[k], y: labels[k]}, [update])))
                         for k in range(steps)])

    return loom_curve(False), loom_curve(True), torch_curve(False), torch_curve(True)


def test_loss_curve_follows_pytorch_cpu_autocast(rng):
    loom32, loom16, torch32, torch16 = _loss_curves(rng)
    # float32 against float32: the same math up to summation order.
    np.testing.assert_allclose(loom32, torch32, rtol=1e-3, atol=1e-4)
    # bfloat16 against bfloat16: both round every product's inputs and results to 8 bits of
    # mantissa (a relative 2^-9 each), but not the same values in the same order (autocast
    # adds the bias in bfloat16, loom in float32), so the two curves differ by about as much
    # as either differs from float32; each loss stays within 2% of the other's, and the
    # curves fall alike.
    np.testing.assert_allclose(loom16, torch16, rtol=0.02)
    gap16 = np.abs(loom16 - torch16).max()
    gap_amp = max(np.abs(loom16 - loom32).max(), np.abs(torch16 - torch32).max())
    assert gap16 <= 2 * gap_amp + 1e-3
    assert loom16[-5:].mean() < 0.8 * loom16[:5].mean()
