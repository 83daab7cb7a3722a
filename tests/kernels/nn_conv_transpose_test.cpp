// conv_transpose2d (src/backends/cpu/nn_conv_backward.cpp) against a float64 scatter loop
// written here (ONNX ConvTranspose: every input element adds x · w into the output window
// it maps to), over strides, padding, dilations, groups, output_padding, every float dtype,
// non-contiguous inputs, empty batches, and bad input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "kernels/reduction_reference.hpp"

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

}  // namespace
}  // namespace loom::testing
