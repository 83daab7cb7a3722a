// conv_transpose2d (src/backends/cpu/nn_conv_backward.cpp) against a float64 scatter loop
// written here (ONNX ConvTranspose: every input element adds x · w into the output window
// it maps to), over strides, padding, dilations, groups, output_padding, every float dtype,
// non-contiguous inputs, empty batches; conv1d and the global pooling builders; and bad input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/builder_run_support.hpp"
#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

using reduction::expect_error;
using ints = std::vector<std::int64_t>;

struct ct_case {
  shape x;  // [N, C_in, H, W]
  shape w;  // [C_in, C_out / groups, kH, kW]
  ints strides{1, 1};
  ints padding{0, 0, 0, 0};  // top, bottom, left, right
  ints dilations{1, 1};
  std::int64_t groups = 1;
  ints output_padding{0, 0};
};

// y[n, g·cog + oc, i·sh - top + ki·dh, j·sw - left + kj·dw] += x[n, ci, i, j] · w[ci, oc, ki, kj]
// for ci in group g (ONNX's definition), positions outside the output dropped.
std::vector<double> scatter_reference(const ct_case& c, const std::vector<double>& x,
                                      const std::vector<double>& w, shape& out) {
  const std::int64_t n = c.x[0], ci = c.x[1], h = c.x[2], wd = c.x[3];
  const std::int64_t cog = c.w[1], kh = c.w[2], kw = c.w[3];
  const std::int64_t co = cog * c.groups;
  const std::int64_t cig = ci / c.groups;
  const std::int64_t oh = (h - 1) * c.strides[0] - c.padding[0] - c.padding[1] +
                          c.dilations[0] * (kh - 1) + 1 + c.output_padding[0];
  const std::int64_t ow = (wd - 1) * c.strides[1] - c.padding[2] - c.padding[3] +
                          c.dilations[1] * (kw - 1) + 1 + c.output_padding[1];
  out = shape{n, co, oh, ow};
  std::vector<double> y(static_cast<std::size_t>(out.num_elements()), 0.0);
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t i_c = 0; i_c < ci; ++i_c) {
      const std::int64_t g = i_c / cig;
      for (std::int64_t i = 0; i < h; ++i) {
        for (std::int64_t j = 0; j < wd; ++j) {
          const double xv = x[static_cast<std::size_t>(((b * ci + i_c) * h + i) * wd + j)];
          for (std::int64_t oc = 0; oc < cog; ++oc) {
            for (std::int64_t ki = 0; ki < kh; ++ki) {
              for (std::int64_t kj = 0; kj < kw; ++kj) {
                const std::int64_t y_i = i * c.strides[0] - c.padding[0] + ki * c.dilations[0];
                const std::int64_t y_j = j * c.strides[1] - c.padding[2] + kj * c.dilations[1];
                if (y_i < 0 || y_i >= oh || y_j < 0 || y_j >= ow) continue;
                const double wv = w[static_cast<std::size_t>(((i_c * cog + oc) * kh + ki) * kw + kj)];
                y[static_cast<std::size_t>(((b * co + g * cog + oc) * oh + y_i) * ow + y_j)] +=
                    xv * wv;
              }
            }
          }
        }
      }
    }
  }
  return y;
}

attr_map attrs_of(const ct_case& c) {
  return {{"strides", c.strides},
          {"padding", c.padding},
          {"dilations", c.dilations},
          {"groups", c.groups},
          {"output_padding", c.output_padding}};
}

const std::vector<ct_case>& cases() {
  static const std::vector<ct_case> all = {
      {{1, 1, 3, 3}, {1, 2, 3, 3}},                                     // ONNX's basic example
      {{2, 3, 4, 5}, {3, 2, 3, 3}, {2, 2}},                             // stride 2
      {{1, 2, 3, 3}, {2, 3, 3, 3}, {3, 2}, {1, 1, 1, 1}, {1, 1}, 1, {1, 1}},  // pads, out pad
      {{2, 4, 3, 4}, {4, 1, 2, 3}, {2, 1}, {0, 1, 1, 0}, {2, 1}, 2},  // groups, dilation, asym
      {{1, 6, 4, 4}, {6, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 6, {1, 0}},  // depthwise
      {{1, 2, 5, 2}, {2, 4, 1, 1}, {1, 3}},                             // 1x1 window
      {{3, 2, 2, 3}, {2, 1, 4, 2}, {3, 3}, {2, 0, 0, 1}, {1, 2}, 1, {2, 2}},
  };
  return all;
}

TEST(ConvTranspose2dTest, MatchesTheScatterLoopForEveryDtype) {
  std::uint64_t seed = 1;
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    for (const ct_case& c : cases()) {
      SCOPED_TRACE(::testing::Message() << to_string(t) << " x " << to_string(c.x) << " w "
                                        << to_string(c.w) << " groups " << c.groups);
      const tensor x = random(t, c.x, seed++, -1.0, 1.0);
      const tensor w = random(t, c.w, seed++, -1.0, 1.0);
      shape out;
      const auto want = scatter_reference(c, values(x), values(w), out);
      const tensor y = run_op1("conv_transpose2d", {x, w}, attrs_of(c));
      const double tol = t == dtype::f64 ? 1e-12 : (t == dtype::f32 ? 1e-5 : 3e-2);
      expect_close(y, out, want, tol, tol);
    }
  }
}

TEST(ConvTranspose2dTest, DefaultsNonContiguousAndEmptyBatch) {
  const ct_case c{{2, 3, 4, 4}, {3, 2, 3, 3}};
  const tensor x = random(dtype::f32, c.x, 5);
  const tensor w = random(dtype::f32, c.w, 6);
  shape out;
  const auto want = scatter_reference(c, values(x), values(w), out);
  expect_close(run_op1("conv_transpose2d", {x, w}), out, want, 1e-5, 1e-5);
  expect_close(run_op1("conv_transpose2d", {non_contiguous(x), non_contiguous(w)}), out,
               scatter_reference(c, values(non_contiguous(x)), values(non_contiguous(w)), out),
               1e-5, 1e-5);
  // Padding given as [h, w] is symmetric, as conv2d's.
  ct_case p = c;
  p.padding = {1, 1, 2, 2};
  p.strides = {2, 2};
  const auto want_p = scatter_reference(p, values(x), values(w), out);
  expect_close(run_op1("conv_transpose2d", {x, w},
                       {{"padding", ints{1, 2}}, {"strides", ints{2, 2}}}),
               out, want_p, 1e-5, 1e-5);
  const tensor y0 = run_op1("conv_transpose2d", {make(dtype::f32, {0, 3, 4, 4}, {}), w});
  EXPECT_EQ(y0.shape(), (shape{0, 2, 6, 6}));
}

TEST(ConvTranspose2dTest, BadInputIsATypedError) {
  const tensor x = random(dtype::f32, {1, 4, 3, 3}, 1);
  expect_error<invalid_argument>(
      [&] { (void)run_op("conv_transpose2d", {x, random(dtype::f32, {3, 2, 3, 3}, 2)}); },
      {"under_test", "4 channels", "dimension 0 is 3"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("conv_transpose2d", {x, random(dtype::f32, {4, 2, 3, 3}, 2)},
                     {{"groups", std::int64_t{3}}});
      },
      {"under_test", "do not divide into 3 groups"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("conv_transpose2d", {x, random(dtype::f32, {4, 2, 3, 3}, 2)},
                     {{"output_padding", ints{1, 0}}});
      },
      {"under_test", "output_padding [1, 0] must be smaller than the strides [1, 1]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("conv_transpose2d", {x, random(dtype::f32, {4, 2, 1, 1}, 2)},
                     {{"padding", ints{2, 2}}});
      },
      {"under_test", "leaves no output"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("conv_transpose2d",
                     {random(dtype::f32, {4, 3, 3}, 1), random(dtype::f32, {4, 2, 3, 3}, 2)});
      },
      {"under_test", "rank 4", "[4, 3, 3]"});
  expect_error<invalid_argument>(
      [&] {
        (void)run_op("conv_transpose2d",
                     {random(dtype::i32, {1, 4, 3, 3}, 1), random(dtype::i32, {4, 2, 3, 3}, 2)});
      },
      {"under_test", "int32"});
  // At run time (unknown dims at inference): the kernel's rule names the tensors.
  expect_error<node_error>(
      [&] {
        (void)run_op_declared("conv_transpose2d", {x, random(dtype::f32, {3, 2, 3, 3}, 2)},
                              {shape{-1, -1, -1, -1}, shape{-1, -1, -1, -1}});
      },
      {"under_test", "conv_transpose2d", "float32[1, 4, 3, 3] on cpu:0"});
}

// ---- conv1d, global pooling, depth_to_space (builders) ------------------------------------

TEST(Conv1dTest, MatchesADirectLoop) {
  const std::int64_t n = 2, c = 4, l = 9, o = 6, k = 3, groups = 2;
  const std::int64_t stride = 2, dil = 2, pl = 2, pr = 1;
  const tensor x = random(dtype::f64, {n, c, l}, 1);
  const tensor w = random(dtype::f64, {o, c / groups, k}, 2);
  const auto xv = values(x);
  const auto wv = values(w);
  const std::int64_t ol = (l + pl + pr - dil * (k - 1) - 1) / stride + 1;
  std::vector<double> want(static_cast<std::size_t>(n * o * ol), 0.0);
  for (std::int64_t b = 0; b < n; ++b) {
    for (std::int64_t f = 0; f < o; ++f) {
      const std::int64_t g = f / (o / groups);
      for (std::int64_t p = 0; p < ol; ++p) {
        double acc = 0.0;
        for (std::int64_t cc = 0; cc < c / groups; ++cc) {
          for (std::int64_t t = 0; t < k; ++t) {
            const std::int64_t i = p * stride - pl + t * dil;
            if (i < 0 || i >= l) continue;
            acc += xv[static_cast<std::size_t>((b * c + g * (c / groups) + cc) * l + i)] *
                   wv[static_cast<std::size_t>((f * (c / groups) + cc) * k + t)];
          }
        }
        want[static_cast<std::size_t>((b * o + f) * ol + p)] = acc;
      }
    }
  }
  const tensor y = run_builder({x, w}, [&](const std::vector<output>& in) {
    return ops::conv1d(in[0], in[1], stride, {pl, pr}, dil, groups);
  });
  expect_close(y, {n, o, ol}, want, 1e-12, 1e-12);
}

TEST(GlobalPoolTest, MeanAndMaxOverTheSpatialDims) {
  const tensor x = random(dtype::f32, {2, 3, 4, 5}, 3);
  const auto xv = values(x);
  std::vector<double> mean(6, 0.0), mx(6, -1e300);
  for (std::size_t i = 0; i < xv.size(); ++i) {
    mean[i / 20] += xv[i] / 20.0;
    mx[i / 20] = std::max(mx[i / 20], xv[i]);
  }
  expect_close(run_builder({x}, [](const std::vector<output>& in) {
                 return ops::global_avg_pool(in[0]);
               }),
               {2, 3, 1, 1}, mean, 1e-6, 1e-6);
  expect_close(run_builder({x}, [](const std::vector<output>& in) {
                 return ops::global_max_pool(in[0]);
               }),
               {2, 3, 1, 1}, mx, 0, 0);
  graph g;
  graph_builder b(g);
  expect_error<invalid_argument>(
      [&] { (void)ops::global_avg_pool(ops::placeholder(b, "v", dtype::f32, {2, 3})); },
      {"global_avg_pool", "rank >= 3"});
}

TEST(DepthToSpaceTest, BothModesAndTheInverseAgainstOnnxIndexFormulas) {
  const std::int64_t n = 2, c = 8, h = 3, w = 2, b = 2, cb = c / (b * b);
  const tensor x = random(dtype::f32, {n, c, h, w}, 4);
  const auto xv = values(x);
  for (const std::string mode : {"DCR", "CRD"}) {
    SCOPED_TRACE(mode);
    std::vector<double> want(xv.size());
    for (std::int64_t q = 0; q < n; ++q) {
      for (std::int64_t k = 0; k < cb; ++k) {
        for (std::int64_t y = 0; y < h * b; ++y) {
          for (std::int64_t z = 0; z < w * b; ++z) {
            const std::int64_t i = y % b, j = z % b;
            const std::int64_t src_c = mode == "DCR" ? (i * b + j) * cb + k : k * b * b + i * b + j;
            want[static_cast<std::size_t>(((q * cb + k) * h * b + y) * w * b + z)] =
                xv[static_cast<std::size_t>(((q * c + src_c) * h + y / b) * w + z / b)];
          }
        }
      }
    }
    expect_close(run_builder({x}, [&](const std::vector<output>& in) {
                   return ops::depth_to_space(in[0], b, mode);
                 }),
                 {n, cb, h * b, w * b}, want, 0, 0);
  }
  // space_to_depth undoes depth_to_space "DCR".
  const tensor back = run_builder({x}, [&](const std::vector<output>& in) {
    return ops::space_to_depth(ops::depth_to_space(in[0], b), b);
  });
  expect_close(back, x.shape(), xv, 0, 0);
  graph g;
  graph_builder gb(g);
  const auto p = ops::placeholder(gb, "p", dtype::f32, {1, 6, 4, 4});
  expect_error<invalid_argument>([&] { (void)ops::depth_to_space(p, 2); },
                                 {"depth_to_space", "blocksize 2", "6 channels"});
  expect_error<invalid_argument>([&] { (void)ops::depth_to_space(p, 1, "XYZ"); }, {"mode"});
  expect_error<invalid_argument>([&] { (void)ops::space_to_depth(p, 3); },
                                 {"space_to_depth", "blocksize 3"});
}

}  // namespace
}  // namespace loom::testing
