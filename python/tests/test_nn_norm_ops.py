"""batch_norm, conv_transpose2d, resize and the norm reductions from Python (loom.ops, made
from the op registry), against PyTorch's functions of the same meaning: F.batch_norm in
inference mode, F.conv_transpose2d (padding as conv2d's [top, bottom, left, right]),
F.interpolate (nearest = ONNX asymmetric + floor; bilinear = half_pixel or align_corners),
torch.logsumexp and the p-norms, and pooling's ceil_mode and dilations."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import loom


def run1(g, y, feeds):
    return np.asarray(loom.Session(g).run(y, feeds))


def test_batch_norm_matches_torch_inference():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.1, 2.0, 3).astype(np.float32)
    g = loom.Graph()
    ins = [g.placeholder(n, "float32", list(v.shape)) for n, v in
           zip("xsbmv", (x, scale, bias, mean, var))]
    y = loom.ops.batch_norm(*ins, epsilon=1e-3)
    got = run1(g, y, dict(zip(ins, (x, scale, bias, mean, var))))
    want = F.batch_norm(torch.from_numpy(x), torch.from_numpy(mean), torch.from_numpy(var),
                        torch.from_numpy(scale), torch.from_numpy(bias), training=False, eps=1e-3)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride,pad,dil,groups,out_pad", [
    (1, 0, 1, 1, 0), (2, 1, 1, 1, 1), (3, 2, 2, 2, 2), (2, 0, 1, 4, 0)])
def test_conv_transpose2d_matches_torch(stride, pad, dil, groups, out_pad):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = rng.standard_normal((4, 6 // 2 if groups == 2 else 2, 3, 3)).astype(np.float32)
    g = loom.Graph()
    px = g.placeholder("x", "float32", list(x.shape))
    pw = g.placeholder("w", "float32", list(w.shape))
    y = loom.ops.conv_transpose2d(px, pw, strides=[stride, stride], padding=[pad, pad, pad, pad],
                                  dilations=[dil, dil], groups=groups,
                                  output_padding=[out_pad, out_pad])
    got = run1(g, y, {px: x, pw: w})
    want = F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride,
                              padding=pad, output_padding=out_pad, groups=groups, dilation=dil)
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size", [(8, 10), (3, 2), (5, 7)])
@pytest.mark.parametrize("how", ["nearest", "bilinear", "bilinear_align_corners"])
def test_resize_matches_torch_interpolate(size, how):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = loom.Graph()
    px = g.placeholder("x", "float32", list(x.shape))
    sizes = [2, 3, *size]
    if how == "nearest":
        y = loom.ops.resize(px, sizes=sizes, mode="nearest",
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        want = F.interpolate(torch.from_numpy(x), size=size, mode="nearest")
    elif how == "bilinear":
        y = loom.ops.resize(px, sizes=sizes, mode="linear",
                            coordinate_transformation_mode="pytorch_half_pixel")
        want = F.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=False)
    else:
        y = loom.ops.resize(px, sizes=sizes, mode="linear",
                            coordinate_transformation_mode="align_corners")
        want = F.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=True)
    np.testing.assert_allclose(run1(g, y, {px: x}), want.numpy(), rtol=1e-5, atol=1e-5)


def test_norm_reductions_match_torch():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 4, 5)) * 30).astype(np.float32)
    t = torch.from_numpy(x)
    g = loom.Graph()
    px = g.placeholder("x", "float32", list(x.shape))
    cases = [
        (loom.ops.reduce_log_sum_exp(px, axes=[1]), torch.logsumexp(t, dim=1)),
        (loom.ops.reduce_l1(px, axes=[0, 2], keepdims=True),
         t.abs().sum(dim=(0, 2), keepdim=True)),
        (loom.ops.reduce_l2(px, axes=[-1]), torch.linalg.vector_norm(t, dim=-1)),
        (loom.ops.reduce_sum_square(px), (t * t).sum()),
    ]
    for y, want in cases:
        np.testing.assert_allclose(run1(g, y, {px: x}), want.numpy(), rtol=1e-5, atol=1e-4)
    b = g.placeholder("b", "bool", [2, 3])
    bv = np.array([[True, False, True], [True, True, True]])
    np.testing.assert_array_equal(run1(g, loom.ops.reduce_all(b, axes=[1]), {b: bv}), [False, True])
    np.testing.assert_array_equal(run1(g, loom.ops.reduce_any(b, axes=[0]), {b: ~bv}),
                                  [False, True, False])


@pytest.mark.parametrize("k,s,p", [(3, 2, 0), (2, 2, 1), (3, 3, 1)])
def test_pooling_ceil_mode_matches_torch(k, s, p):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8, 7)).astype(np.float32)
    g = loom.Graph()
    px = g.placeholder("x", "float32", list(x.shape))
    attrs = dict(kernel=[k, k], strides=[s, s], padding=[p, p], ceil_mode=True)
    got_max = run1(g, loom.ops.max_pool2d(px, **attrs), {px: x})
    got_avg = run1(g, loom.ops.avg_pool2d(px, count_include_pad=False, **attrs), {px: x})
    t = torch.from_numpy(x)
    want_max = F.max_pool2d(t, k, s, p, ceil_mode=True)
    want_avg = F.avg_pool2d(t, k, s, p, ceil_mode=True, count_include_pad=False)
    np.testing.assert_allclose(got_max, want_max.numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(got_avg, want_avg.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_dilated_max_pool_matches_torch(ceil_mode):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    g = loom.Graph()
    px = g.placeholder("x", "float32", list(x.shape))
    y = loom.ops.max_pool2d(px, kernel=[3, 2], strides=[2, 2], padding=[1, 1],
                            dilations=[2, 3], ceil_mode=ceil_mode)
    want = F.max_pool2d(torch.from_numpy(x), (3, 2), (2, 2), (1, 1), dilation=(2, 3),
                        ceil_mode=ceil_mode)
    np.testing.assert_array_equal(run1(g, y, {px: x}), want.numpy())


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool_with_indices_matches_torch(ceil_mode):
    # PyTorch's indices count within each (n, c) plane; loom's within the whole input.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    g = loom.Graph()
    px = g.placeholder("x", "float32", list(x.shape))
    y, i = loom.ops.max_pool2d_with_indices(px, kernel=[3, 2], strides=[2, 2], padding=[1, 1],
                                            dilations=[2, 1], ceil_mode=ceil_mode)
    got_y, got_i = (np.asarray(v) for v in loom.Session(g).run([y, i], {px: x}))
    want_y, want_i = F.max_pool2d(torch.from_numpy(x), (3, 2), (2, 2), (1, 1), dilation=(2, 1),
                                  ceil_mode=ceil_mode, return_indices=True)
    planes = (np.arange(6) * 9 * 8).reshape(2, 3, 1, 1)
    np.testing.assert_array_equal(got_y, want_y.numpy())
    np.testing.assert_array_equal(got_i, want_i.numpy() + planes)
    assert got_i.dtype == np.int64
