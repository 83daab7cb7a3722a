"""Graph passes from Python: results with the passes on equal results with them off and
NumPy's; the log says what was fused and refused; options are checked."""
import numpy as np
import pytest

import loom


def chain(g):
    x = g.placeholder("x", loom.float32, [64, 33])
    b = g.placeholder("b", loom.float32, [33])
    y = loom.ops.tanh(loom.ops.relu(x * 2.0 + b) - x)
    return x, b, y


def test_fused_results_match_unfused_and_numpy(rng):
    g = loom.Graph()
    x, b, y = chain(g)
    xv = rng.standard_normal((64, 33)).astype(np.float32)
    bv = rng.standard_normal(33).astype(np.float32)
    on = loom.Session(g)
    off = loom.Session(g, passes=False)
    got = np.asarray(on.run(y, {x: xv, b: bv}))
    ref = np.asarray(off.run(y, {x: xv, b: bv}))
    want = np.tanh(np.maximum(xv.astype(np.float64) * 2 + bv, 0) - xv)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    log = on.explain_passes(y, {x: xv, b: bv})
    fused = [r for r in log if r["pass"] == "elementwise_fusion" and r["kind"] == "rewrite"]
    assert len(fused) == 1
    assert "fused_elementwise" in fused[0]["result"] and "tanh" in fused[0]["result"]
    assert off.explain_passes(y, [x, b]) == []


def test_disabled_passes_and_bad_names():
    g = loom.Graph()
    x, b, y = chain(g)
    s = loom.Session(g, disabled_passes=["elementwise_fusion"])
    assert not [r for r in s.explain_passes(y, ["x", "b"]) if r["pass"] == "elementwise_fusion"]
    with pytest.raises(ValueError, match="no_such_pass"):
        loom.Session(g, disabled_passes=["no_such_pass"])
