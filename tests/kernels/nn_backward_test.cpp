// The gradients of conv2d and the pooling ops against float64 references: dx and dw of
// conv2d as explicit sums over the forward's index map, the max pool's argmax rule, the
// average pool's spread; and the adjoint identity <f(x), dy> == <x, df*(dy)> (and
// <conv2d(x, w), dy> == <w, dw>) with loom's own forward ops, which ties each backward
// op to its forward. Strides, asymmetric padding, dilation, groups (depthwise too),
// overlapping windows, ties, every float dtype, non-contiguous inputs, empty tensors,
// shape attributes with unknown dimensions, and bad input at construction and at run time.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/graph.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::testing {
namespace {

using ints = std::vector<std::int64_t>;

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

// Expects f() to throw loom::node_error (a run-time failure) whose message holds `parts`.
void expect_node_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected loom::node_error";
  } catch (const node_error& e) {
    for (const auto& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
    }
  }
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

double abs_dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) s += std::fabs(a[i] * b[i]);
  return s;
}

// Expects got[i] within tol * scale[i] (+ a floor) of want[i].
void expect_scaled(const tensor& got, const shape& s, const std::vector<double>& want,
                   const std::vector<double>& scale, double tol) {
  ASSERT_EQ(to_string(got.shape()), to_string(s));
  const auto g = values(got);
  ASSERT_EQ(g.size(), want.size());
  int reported = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double allowed = tol * scale[i] + 1e-30;
    if (!(std::fabs(g[i] - want[i]) <= allowed) && reported++ < 8) {
      ADD_FAILURE() << "element " << i << ": got " << g[i] << ", expected " << want[i]
                    << " (allowed " << allowed << ")";
    }
  }
}

// ---- conv2d ------------------------------------------------------------------------------

struct conv_case {
  shape x;  // N, C, H, W
  shape w;  // O, C / groups, KH, KW
  ints strides{1, 1};
  ints padding{0, 0, 0, 0};
  ints dilations{1, 1};
  std::int64_t groups = 1;

  [[nodiscard]] ints pad4() const {
    return padding.size() == 2 ? ints{padding[0], padding[0], padding[1], padding[1]} : padding;
  }
  [[nodiscard]] shape y() const {
    const ints p = pad4();
    return {x[0], w[0], (x[2] + p[0] + p[1] - dilations[0] * (w[2] - 1) - 1) / strides[0] + 1,
            (x[3] + p[2] + p[3] - dilations[1] * (w[3] - 1) - 1) / strides[1] + 1};
  }
};

attr_map conv_attrs(const conv_case& c) {
  return {{"strides", c.strides},
          {"padding", c.padding},
          {"dilations", c.dilations},
          {"groups", c.groups}};
}

// Calls f(x_flat, w_flat, y_flat) for every term x * w of every output y of the forward
// convolution: the index map both gradients are sums over.
void for_each_term(const conv_case& c,
                   const std::function<void(std::size_t, std::size_t, std::size_t)>& f) {
  const ints p = c.pad4();
  const shape y = c.y();
  const std::int64_t ch = c.x[1], h = c.x[2], wd = c.x[3];
  const std::int64_t o = c.w[0], cg = c.w[1], kh = c.w[2], kw = c.w[3];
  const std::int64_t per_group = o / c.groups;
  for (std::int64_t b = 0; b < y[0]; ++b) {
    for (std::int64_t fo = 0; fo < o; ++fo) {
      for (std::int64_t oy = 0; oy < y[2]; ++oy) {
        for (std::int64_t ox = 0; ox < y[3]; ++ox) {
          const auto yi = static_cast<std::size_t>(((b * o + fo) * y[2] + oy) * y[3] + ox);
          for (std::int64_t ci = 0; ci < cg; ++ci) {
            for (std::int64_t i = 0; i < kh; ++i) {
              for (std::int64_t j = 0; j < kw; ++j) {
                const std::int64_t iy = oy * c.strides[0] - p[0] + i * c.dilations[0];
                const std::int64_t ix = ox * c.strides[1] - p[2] + j * c.dilations[1];
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                const std::int64_t xc = (fo / per_group) * cg + ci;
                f(static_cast<std::size_t>(((b * ch + xc) * h + iy) * wd + ix),
                  static_cast<std::size_t>(((fo * cg + ci) * kh + i) * kw + j), yi);
              }
            }
          }
        }
      }
    }
  }
}

double tolerance(dtype t) {
  switch (t) {
    case dtype::f64:
      return 1e-13;
    case dtype::f32:
      return 1e-5;
    case dtype::f16:
      return 2e-3;
    default:
      return 1e-2;
  }
}

// dx and dw of loom against the explicit sums, from random x, w, dy of type t.
void check_conv(const conv_case& c, dtype t, std::uint64_t seed = 1) {
  SCOPED_TRACE(::testing::Message() << to_string(t) << " x " << to_string(c.x) << " w "
                                    << to_string(c.w) << " groups " << c.groups);
  const tensor x = random(t, c.x, seed);
  const tensor w = random(t, c.w, seed + 1);
  const tensor dy = random(t, c.y(), seed + 2);
  const auto xv = values(x);
  const auto wv = values(w);
  const auto dyv = values(dy);
  std::vector<double> dx(xv.size(), 0.0), dx_scale(xv.size(), 0.0);
  std::vector<double> dw(wv.size(), 0.0), dw_scale(wv.size(), 0.0);
  for_each_term(c, [&](std::size_t xi, std::size_t wi, std::size_t yi) {
    dx[xi] += dyv[yi] * wv[wi];
    dx_scale[xi] += std::fabs(dyv[yi] * wv[wi]);
    dw[wi] += dyv[yi] * xv[xi];
    dw_scale[wi] += std::fabs(dyv[yi] * xv[xi]);
  });
  attr_map a = conv_attrs(c);
  a.emplace("input_shape", c.x);
  expect_scaled(run_op1("conv2d_backprop_input", {dy, w}, a), c.x, dx, dx_scale, tolerance(t));
  a = conv_attrs(c);
  a.emplace("filter_shape", c.w);
  expect_scaled(run_op1("conv2d_backprop_filter", {x, dy}, a), c.w, dw, dw_scale, tolerance(t));
}

TEST(NnBackward, ConvBasic) {
  for (const dtype t : float_types) {
    check_conv({.x = {1, 3, 5, 5}, .w = {2, 3, 3, 3}}, t);
    check_conv({.x = {2, 4, 7, 6}, .w = {5, 4, 2, 3}}, t);
  }
}

TEST(NnBackward, ConvStridesAndAsymmetricPadding) {
  for (const dtype t : float_types) {
    check_conv({.x = {2, 3, 9, 8}, .w = {4, 3, 3, 3}, .strides = {2, 2}, .padding = {1, 1}}, t);
    // Rows and columns no window reads (the stride skips past them): their dx is zero.
    check_conv({.x = {1, 2, 9, 8}, .w = {3, 2, 3, 2}, .strides = {2, 3}, .padding = {1, 0, 2, 1}},
               t);
    check_conv({.x = {1, 2, 4, 4}, .w = {3, 2, 5, 5}, .padding = {2, 2, 2, 2}}, t);
    check_conv({.x = {1, 1, 6, 6}, .w = {1, 1, 3, 3}, .strides = {3, 3}, .padding = {0, 2, 0, 2}},
               t);
  }
}

TEST(NnBackward, ConvDilation) {
  for (const dtype t : float_types) {
    check_conv({.x = {1, 2, 11, 10}, .w = {3, 2, 3, 3}, .dilations = {2, 2}}, t);
    check_conv({.x = {2, 3, 12, 9},
                .w = {4, 3, 3, 2},
                .strides = {2, 1},
                .padding = {2, 1, 0, 3},
                .dilations = {3, 2}},
               t);
  }
}

TEST(NnBackward, ConvGroups) {
  for (const dtype t : float_types) {
    check_conv({.x = {2, 4, 6, 6}, .w = {6, 2, 3, 3}, .padding = {1, 1}, .groups = 2}, t);
    // Depthwise, and depthwise with a channel multiplier of 2 and a stride.
    check_conv({.x = {2, 8, 7, 7}, .w = {8, 1, 3, 3}, .padding = {1, 1}, .groups = 8}, t);
    check_conv({.x = {1, 4, 7, 7}, .w = {8, 1, 3, 3}, .strides = {2, 2}, .groups = 4}, t);
  }
}

TEST(NnBackward, ConvOddSizesAndOneByOne) {
  for (const dtype t : float_types) {
    check_conv({.x = {1, 1, 1, 1}, .w = {1, 1, 1, 1}}, t);
    check_conv({.x = {3, 5, 7, 3}, .w = {7, 5, 1, 3}, .strides = {1, 2}, .padding = {0, 1, 1, 0}},
               t);
    check_conv({.x = {2, 16, 5, 5}, .w = {8, 16, 1, 1}}, t);
  }
}

TEST(NnBackward, ConvResNetLayers) {
  // Sizes where oneDNN takes its optimized paths for float32 and bfloat16.
  check_conv({.x = {2, 32, 14, 14}, .w = {32, 32, 3, 3}, .padding = {1, 1}}, dtype::f32);
  check_conv({.x = {1, 16, 14, 14}, .w = {32, 16, 3, 3}, .strides = {2, 2}, .padding = {1, 1}},
             dtype::bf16);
  check_conv({.x = {2, 32, 8, 8}, .w = {32, 1, 3, 3}, .padding = {1, 1}, .groups = 32}, dtype::f32);
  check_conv({.x = {1, 8, 10, 10}, .w = {8, 8, 3, 3}, .padding = {1, 1}}, dtype::f64);
}

// <conv2d(x, w), dy> == <x, dx> == <w, dw> in float64, with loom's conv2d: the gradients
// are the adjoints of the forward that loom actually computes.
TEST(NnBackward, ConvAdjointIdentity) {
  const std::vector<conv_case> cases{
      {.x = {2, 3, 9, 8}, .w = {4, 3, 3, 3}, .strides = {2, 2}, .padding = {1, 0, 2, 1}},
      {.x = {1, 6, 11, 10},
       .w = {4, 3, 3, 2},
       .strides = {1, 2},
       .padding = {2, 2},
       .dilations = {2, 3},
       .groups = 2},
      {.x = {3, 4, 5, 7}, .w = {4, 1, 3, 3}, .padding = {1, 1}, .groups = 4},
      {.x = {1, 2, 4, 4}, .w = {3, 2, 5, 5}, .padding = {2, 2, 2, 2}},
  };
  std::uint64_t seed = 10;
  for (const auto& c : cases) {
    SCOPED_TRACE(to_string(c.x) + " " + to_string(c.w));
    const tensor x = random(dtype::f64, c.x, seed++);
    const tensor w = random(dtype::f64, c.w, seed++);
    const tensor dy = random(dtype::f64, c.y(), seed++);
    const tensor y = run_op1("conv2d", {x, w}, conv_attrs(c));
    attr_map a = conv_attrs(c);
    a.emplace("input_shape", c.x);
    const tensor dx = run_op1("conv2d_backprop_input", {dy, w}, a);
    a = conv_attrs(c);
    a.emplace("filter_shape", c.w);
    const tensor dw = run_op1("conv2d_backprop_filter", {x, dy}, a);
    const double lhs = dot(values(y), values(dy));
    const double scale = abs_dot(values(y), values(dy)) + 1.0;
    EXPECT_NEAR(dot(values(x), values(dx)), lhs, 1e-12 * scale);
    EXPECT_NEAR(dot(values(w), values(dw)), lhs, 1e-12 * scale);
  }
}

TEST(NnBackward, ConvNonContiguousInputs) {
  for (const dtype t : float_types) {
    const conv_case c{.x = {2, 3, 6, 5}, .w = {4, 3, 3, 2}, .padding = {1, 1}};
    const tensor x = random(t, c.x, 5);
    const tensor w = random(t, c.w, 6);
    const tensor dy = random(t, c.y(), 7);
    attr_map ai = conv_attrs(c);
    ai.emplace("input_shape", c.x);
    attr_map af = conv_attrs(c);
    af.emplace("filter_shape", c.w);
    const double rt = rtol_for(t) * 4;
    const double at = atol_for(t) * 8;
    const tensor dx = run_op1("conv2d_backprop_input", {dy, w}, ai);
    expect_close(run_op1("conv2d_backprop_input", {non_contiguous(dy), non_contiguous(w)}, ai), c.x,
                 values(dx), rt, at);
    const tensor dw = run_op1("conv2d_backprop_filter", {x, dy}, af);
    expect_close(run_op1("conv2d_backprop_filter", {non_contiguous(x), non_contiguous(dy)}, af),
                 c.w, values(dw), rt, at);
  }
}

// Unknown N and C of input_shape come from dy and the filter; unknown O and C / groups of
// filter_shape from dy and the input.
TEST(NnBackward, ConvShapeAttrsWithUnknownDims) {
  const conv_case c{.x = {2, 4, 7, 6}, .w = {6, 2, 3, 3}, .strides = {2, 1}, .groups = 2};
  const tensor x = random(dtype::f64, c.x, 1);
  const tensor w = random(dtype::f64, c.w, 2);
  const tensor dy = random(dtype::f64, c.y(), 3);
  attr_map a = conv_attrs(c);
  a.emplace("input_shape", shape{-1, -1, 7, 6});
  const tensor dx = run_op1("conv2d_backprop_input", {dy, w}, a);
  a.insert_or_assign("input_shape", c.x);
  expect_close(dx, c.x, values(run_op1("conv2d_backprop_input", {dy, w}, a)), 0, 0);

  a = conv_attrs(c);
  a.emplace("filter_shape", shape{-1, -1, 3, 3});
  const tensor dw = run_op1("conv2d_backprop_filter", {x, dy}, a);
  a.insert_or_assign("filter_shape", c.w);
  expect_close(dw, c.w, values(run_op1("conv2d_backprop_filter", {x, dy}, a)), 0, 0);
}

TEST(NnBackward, ConvEmpty) {
  for (const dtype t : {dtype::f32, dtype::f64}) {
    // Empty batch: empty dx, zero dw (an empty sum).
    const tensor w = random(t, {2, 3, 3, 3}, 1);
    expect_close(run_op1("conv2d_backprop_input", {random(t, {0, 2, 3, 3}, 2), w},
                         {{"input_shape", shape{0, 3, 5, 5}}}),
                 {0, 3, 5, 5}, {});
    expect_close(
        run_op1("conv2d_backprop_filter", {random(t, {0, 3, 5, 5}, 3), random(t, {0, 2, 3, 3}, 4)},
                {{"filter_shape", shape{2, 3, 3, 3}}}),
        {2, 3, 3, 3}, std::vector<double>(54, 0.0), 0, 0);
    // No filters: nothing flows back to x; dw is empty.
    expect_close(
        run_op1("conv2d_backprop_input", {random(t, {1, 0, 3, 3}, 5), random(t, {0, 3, 3, 3}, 6)},
                {{"input_shape", shape{1, 3, 5, 5}}}),
        {1, 3, 5, 5}, std::vector<double>(75, 0.0), 0, 0);
    expect_close(
        run_op1("conv2d_backprop_filter", {random(t, {1, 3, 5, 5}, 7), random(t, {1, 0, 3, 3}, 8)},
                {{"filter_shape", shape{0, 3, 3, 3}}}),
        {0, 3, 3, 3}, {});
    // An empty image with padding: every window lies in the padding, dw is zero.
    expect_close(
        run_op1("conv2d_backprop_filter", {random(t, {1, 2, 0, 3}, 9), random(t, {1, 2, 2, 5}, 10)},
                {{"padding", {1, 1}}, {"filter_shape", shape{2, 2, 1, 1}}}),
        {2, 2, 1, 1}, std::vector<double>(4, 0.0), 0, 0);
  }
}

TEST(NnBackward, ConvBadInput) {
  const auto bwd_input = [](shape dys, shape ws, shape input_shape, attr_map attrs = {},
                            dtype wt = dtype::f32) {
    return [=] {
      attr_map a = attrs;
      a.emplace("input_shape", input_shape);
      run_op1("conv2d_backprop_input", {random(dtype::f32, dys, 1), random(wt, ws, 2)}, a);
    };
  };
  const auto bwd_filter = [](shape xs, shape dys, shape filter_shape, attr_map attrs = {}) {
    return [=] {
      attr_map a = attrs;
      a.emplace("filter_shape", filter_shape);
      run_op1("conv2d_backprop_filter", {random(dtype::f32, xs, 1), random(dtype::f32, dys, 2)}, a);
    };
  };
  // dy is not the forward output of input_shape and the filter.
  expect_invalid_argument(bwd_input({1, 2, 4, 4}, {2, 3, 3, 3}, {1, 3, 5, 5}),
                          {"under_test", "conv2d_backprop_input", "dy [1, 2, 4, 4]", "[1, 2, 3, 3]",
                           "input_shape [1, 3, 5, 5]"});
  expect_invalid_argument(bwd_input({2, 2, 3, 3}, {2, 3, 3, 3}, {1, 3, 5, 5}),
                          {"under_test", "dy [2, 2, 3, 3]"});
  expect_invalid_argument(bwd_input({1, 2, 3, 3}, {2, 3, 3, 3}, {1, 4, 5, 5}),
                          {"under_test", "input channels", "input_shape [1, 4, 5, 5]"});
  expect_invalid_argument(bwd_input({1, 2, 3, 3}, {2, 3, 3, 3}, {1, 3, 2, 2}),
                          {"under_test", "larger"});
  expect_invalid_argument(bwd_input({1, 2, 3, 3}, {2, 3, 3, 3}, {1, 3, 5}),
                          {"under_test", "input_shape", "rank 4"});
  expect_invalid_argument(bwd_input({1, 2, 3, 3}, {2, 3, 3, 3}, {1, 3, -2, 5}),
                          {"under_test", "input_shape", "dimension 2 is -2"});
  expect_invalid_argument(bwd_input({1, 2, 3}, {2, 3, 3, 3}, {1, 3, 5, 5}),
                          {"under_test", "dy", "rank 4"});
  expect_invalid_argument(bwd_input({1, 2, 3, 3}, {2, 3, 3}, {1, 3, 5, 5}),
                          {"under_test", "filter", "rank 4"});
  expect_invalid_argument(bwd_input({1, 2, 3, 3}, {2, 3, 3, 3}, {1, 3, 5, 5}, {}, dtype::f64),
                          {"under_test"});
  expect_invalid_argument(
      bwd_input({1, 2, 3, 3}, {2, 3, 3, 3}, {1, 3, 5, 5}, {{"strides", {0, 1}}}),
      {"under_test", "strides"});
  expect_invalid_argument(
      [] {
        run_op1("conv2d_backprop_input",
                {random(dtype::i32, {1, 2, 3, 3}, 1), random(dtype::i32, {2, 3, 3, 3}, 2)},
                {{"input_shape", shape{1, 3, 5, 5}}});
      },
      {"under_test", "int32"});

  expect_invalid_argument(bwd_filter({1, 3, 5, 5}, {1, 2, 4, 4}, {2, 3, 3, 3}),
                          {"under_test", "conv2d_backprop_filter", "dy [1, 2, 4, 4]",
                           "[1, 2, 3, 3]", "filter_shape [2, 3, 3, 3]"});
  expect_invalid_argument(bwd_filter({1, 3, 5, 5}, {1, 4, 3, 3}, {2, 3, 3, 3}),
                          {"under_test", "dy [1, 4, 3, 3]"});
  expect_invalid_argument(bwd_filter({1, 4, 5, 5}, {1, 2, 3, 3}, {2, 3, 3, 3}),
                          {"under_test", "filter takes 3 input channels"});
  expect_invalid_argument(bwd_filter({1, 4, 5, 5}, {1, 3, 3, 3}, {3, 2, 3, 3}, {{"groups", 2}}),
                          {"under_test", "output channels 3", "2 groups"});
  expect_invalid_argument(bwd_filter({1, 3, 5}, {1, 2, 3, 3}, {2, 3, 3, 3}),
                          {"under_test", "input", "rank 4"});
  expect_invalid_argument(bwd_filter({1, 3, 5, 5}, {1, 2, 3, 3}, {2, 3, 3}),
                          {"under_test", "filter_shape", "rank 4"});
}

// Shapes the graph did not know: the kernels check what arrives.
TEST(NnBackward, ConvRunTimeMismatch) {
  const shape unknown{-1, -1, -1, -1};
  expect_node_error(
      [&] {
        run_op_declared("conv2d_backprop_input",
                        {random(dtype::f32, {1, 2, 4, 4}, 1), random(dtype::f32, {2, 3, 3, 3}, 2)},
                        {unknown, unknown}, {{"input_shape", shape{1, 3, 5, 5}}});
      },
      {"under_test", "conv2d_backprop_input", "dy float32[1, 2, 4, 4]", "[1, 2, 3, 3]"});
  expect_node_error(
      [&] {
        run_op_declared("conv2d_backprop_filter",
                        {random(dtype::f32, {1, 3, 5, 5}, 1), random(dtype::f32, {1, 2, 3, 3}, 2)},
                        {unknown, unknown}, {{"filter_shape", shape{2, 4, 3, 3}}});
      },
      {"under_test", "conv2d_backprop_filter", "filter_shape [2, 4, 3, 3]"});
  // An unknown spatial dimension of input_shape: nothing at run time says what it was.
  expect_node_error(
      [&] {
        run_op_declared("conv2d_backprop_input",
                        {random(dtype::f32, {1, 2, 3, 3}, 1), random(dtype::f32, {2, 3, 3, 3}, 2)},
                        {unknown, unknown}, {{"input_shape", shape{1, 3, -1, 5}}});
      },
      {"under_test", "input_shape [1, 3, ?, 5]", "dimension 2 unknown"});
}

// ---- pooling -----------------------------------------------------------------------------

struct pool_case {
  shape x;
  ints kernel;
  ints strides{};  // empty: the kernel
  ints padding{0, 0, 0, 0};
  bool include_pad = false;

  [[nodiscard]] ints pad4() const {
    return padding.size() == 2 ? ints{padding[0], padding[0], padding[1], padding[1]} : padding;
  }
  [[nodiscard]] ints stride() const { return strides.empty() ? kernel : strides; }
  [[nodiscard]] shape y() const {
    const ints p = pad4();
    const ints s = stride();
    return {x[0], x[1], (x[2] + p[0] + p[1] - kernel[0]) / s[0] + 1,
            (x[3] + p[2] + p[3] - kernel[1]) / s[1] + 1};
  }
};

attr_map pool_attrs(bool max, const pool_case& c) {
  attr_map a{{"kernel", c.kernel}, {"strides", c.strides}, {"padding", c.padding}};
  if (!max) {
    a.emplace("count_include_pad", c.include_pad);
    a.emplace("input_shape", c.x);
  }
  return a;
}

// Calls f(y_flat, positions) with the flat positions of x inside each window, in
// row-major window order.
void for_each_window(const pool_case& c,
                     const std::function<void(std::size_t, const std::vector<std::size_t>&)>& f) {
  const ints p = c.pad4();
  const ints s = c.stride();
  const shape y = c.y();
  const std::int64_t h = c.x[2], w = c.x[3];
  for (std::int64_t plane = 0; plane < y[0] * y[1]; ++plane) {
    for (std::int64_t oy = 0; oy < y[2]; ++oy) {
      for (std::int64_t ox = 0; ox < y[3]; ++ox) {
        std::vector<std::size_t> at;
        for (std::int64_t i = 0; i < c.kernel[0]; ++i) {
          for (std::int64_t j = 0; j < c.kernel[1]; ++j) {
            const std::int64_t iy = oy * s[0] - p[0] + i;
            const std::int64_t ix = ox * s[1] - p[2] + j;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            at.push_back(static_cast<std::size_t>((plane * h + iy) * w + ix));
          }
        }
        f(static_cast<std::size_t>((plane * y[2] + oy) * y[3] + ox), at);
      }
    }
  }
}

// dx of max_pool2d: each window's dy to its first maximum.
std::vector<double> max_grad_reference(const pool_case& c, const std::vector<double>& xv,
                                       const std::vector<double>& dyv) {
  std::vector<double> dx(xv.size(), 0.0);
  for_each_window(c, [&](std::size_t yi, const std::vector<std::size_t>& at) {
    std::size_t best = at.front();
    for (const std::size_t k : at) {
      if (xv[k] > xv[best]) best = k;
    }
    dx[best] += dyv[yi];
  });
  return dx;
}

// dx of avg_pool2d: each window's dy / count to every position in it.
std::vector<double> avg_grad_reference(const pool_case& c, const std::vector<double>& dyv) {
  std::vector<double> dx(static_cast<std::size_t>(c.x.num_elements()), 0.0);
  for_each_window(c, [&](std::size_t yi, const std::vector<std::size_t>& at) {
    const auto count = c.include_pad ? static_cast<double>(c.kernel[0] * c.kernel[1])
                                     : static_cast<double>(at.size());
    for (const std::size_t k : at) dx[k] += dyv[yi] / count;
  });
  return dx;
}

const std::vector<pool_case>& pool_cases() {
  static const std::vector<pool_case> c{
      {.x = {2, 3, 8, 8}, .kernel = {2, 2}},
      // 2x2 stride 2 over odd sizes: the last row and column lie in no window (the
      // max gradient's tiled fast path must zero them).
      {.x = {1, 2, 7, 9}, .kernel = {2, 2}},
      // Overlapping windows (stride < kernel).
      {.x = {1, 2, 9, 7}, .kernel = {3, 3}, .strides = {2, 2}},
      {.x = {2, 2, 6, 7}, .kernel = {3, 2}, .strides = {1, 1}},
      {.x = {1, 2, 7, 7}, .kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1}},
      {.x = {1, 2, 7, 7},
       .kernel = {3, 3},
       .strides = {2, 2},
       .padding = {1, 1},
       .include_pad = true},
      {.x = {2, 1, 6, 9}, .kernel = {2, 3}, .strides = {1, 2}, .padding = {1, 0, 2, 1}},
      {.x = {2, 1, 6, 9},
       .kernel = {2, 3},
       .strides = {1, 2},
       .padding = {1, 0, 2, 1},
       .include_pad = true},
      {.x = {1, 3, 5, 5}, .kernel = {5, 5}},
      {.x = {1, 1, 4, 4}, .kernel = {1, 1}},
      {.x = {1, 1, 1, 1}, .kernel = {1, 1}},
      {.x = {2, 16, 14, 14}, .kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1}},
  };
  return c;
}

void check_pool(bool max, const pool_case& c, const tensor& x, const tensor& dy) {
  SCOPED_TRACE(::testing::Message()
               << (max ? "max " : "avg ") << x.describe() << " kernel " << c.kernel[0] << "x"
               << c.kernel[1] << (c.include_pad ? " include_pad" : ""));
  const dtype t = dy.type();
  if (max) {
    const tensor dx = run_op1("max_pool2d_grad", {x, dy}, pool_attrs(true, c));
    expect_close(dx, c.x, max_grad_reference(c, values(x), values(dy)), rtol_for(t), atol_for(t));
  } else {
    const tensor dx = run_op1("avg_pool2d_grad", {dy}, pool_attrs(false, c));
    expect_close(dx, c.x, avg_grad_reference(c, values(dy)), rtol_for(t), atol_for(t));
  }
}

TEST(NnBackward, MaxPoolGradAgainstReference) {
  for (const dtype t : float_types) {
    std::uint64_t seed = 1;
    for (const auto& c : pool_cases()) {
      check_pool(true, c, random(t, c.x, seed), random(t, c.y(), seed + 1));
      seed += 2;
    }
  }
}

TEST(NnBackward, AvgPoolGradAgainstReference) {
  for (const dtype t : float_types) {
    std::uint64_t seed = 1;
    for (const auto& c : pool_cases()) {
      check_pool(false, c, random(t, c.x, seed), random(t, c.y(), seed + 1));
      seed += 2;
    }
  }
}

// Ties: the first maximum in row-major window order takes the window's dy.
TEST(NnBackward, MaxPoolGradTies) {
  // All equal, 2x2 windows with stride 1 over 3x3: window (oy, ox) routes to (oy, ox).
  const pool_case c{.x = {1, 1, 3, 3}, .kernel = {2, 2}, .strides = {1, 1}};
  for (const dtype t : float_types) {
    const tensor x = make(t, c.x, std::vector<double>(9, 1.5));
    const tensor dy = make(t, {1, 1, 2, 2}, {1, 2, 4, 8});
    expect_close(run_op1("max_pool2d_grad", {x, dy}, pool_attrs(true, c)), c.x,
                 {1, 2, 0, 4, 8, 0, 0, 0, 0}, 0, 0);
  }
  // Ties in tiled 2x2 windows (the fast path), odd sizes.
  const pool_case tiled{.x = {2, 3, 7, 8}, .kernel = {2, 2}};
  for (const dtype t : float_types) {
    std::vector<double> v(static_cast<std::size_t>(tiled.x.num_elements()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 5) % 2);
    check_pool(true, tiled, make(t, tiled.x, v), random(t, tiled.y(), 5));
  }
  // Many ties from a few distinct values, overlapping windows, padding.
  const pool_case p{
      .x = {2, 3, 9, 8}, .kernel = {3, 3}, .strides = {2, 1}, .padding = {1, 2, 0, 1}};
  for (const dtype t : float_types) {
    std::vector<double> v(static_cast<std::size_t>(p.x.num_elements()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7) % 3);
    check_pool(true, p, make(t, p.x, v), random(t, p.y(), 4));
  }
}

// NaN and -inf in 2x2 stride-2 windows (the tiled, vectorized path for f32/f64; the general
// loop for f16/bf16), over widths that leave every vector remainder: both follow one rule,
// checked against it here: from -inf, a strictly greater element replaces the maximum
// (so NaN never does), and a window where nothing beats -inf routes to its first element.
TEST(NnBackward, MaxPoolGradNanAndInfinityWindows) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> palette{nan, -inf, 0.0, 1.0, 1.0, -1.0, nan, 2.0, -inf};
  for (std::int64_t w = 2; w <= 36; w += (w < 12 ? 1 : 5)) {
    const pool_case c{.x = {2, 2, 6, w}, .kernel = {2, 2}};
    std::vector<double> xv(static_cast<std::size_t>(c.x.num_elements()));
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = palette[(i * 7 + i / 5) % palette.size()];
    // Whole windows of NaN and of -inf in the first plane.
    const auto fill_window = [&](std::size_t first, double v) {
      const auto row = static_cast<std::size_t>(w);
      xv.at(first) = xv.at(first + 1) = xv.at(first + row) = xv.at(first + row + 1) = v;
    };
    fill_window(0, nan);
    if (w >= 4) fill_window(2, -inf);
    std::vector<double> dyv(static_cast<std::size_t>(c.y().num_elements()));
    for (std::size_t i = 0; i < dyv.size(); ++i) dyv[i] = static_cast<double>(i % 13) + 1.0;
    std::vector<double> want(xv.size(), 0.0);
    for_each_window(c, [&](std::size_t yi, const std::vector<std::size_t>& at) {
      double best = -inf;
      std::size_t winner = at.front();
      for (const std::size_t k : at) {
        if (xv[k] > best) {
          best = xv[k];
          winner = k;
        }
      }
      want[winner] += dyv[yi];
    });
    for (const dtype t : float_types) {
      SCOPED_TRACE(::testing::Message() << to_string(t) << " width " << w);
      const tensor dx =
          run_op1("max_pool2d_grad", {make(t, c.x, xv), make(t, c.y(), dyv)}, pool_attrs(true, c));
      expect_close(dx, c.x, want, 0, 0);
    }
  }
}

TEST(NnBackward, MaxPoolGradPaddingNeverWins) {
  // All values negative: a padded zero would take the dy if padding took part.
  const pool_case c{.x = {1, 1, 3, 3}, .kernel = {2, 2}, .strides = {2, 2}, .padding = {1, 1}};
  const tensor x = random(dtype::f32, c.x, 3, -5.0, -1.0);
  const tensor dy = make(dtype::f32, c.y(), {1, 1, 1, 1});
  const tensor dx = run_op1("max_pool2d_grad", {x, dy}, pool_attrs(true, c));
  double total = 0;
  for (const double v : values(dx)) total += v;
  EXPECT_EQ(total, 4.0);  // every window's dy landed inside the input
  check_pool(true, c, x, dy);
}

// Dilated taps can step over a one-row input: such a window holds padding alone, and its dy
// goes nowhere (dx stays zero; no write outside the input).
TEST(NnBackward, MaxPoolGradWindowOverPaddingAlone) {
  const tensor x = make(dtype::f32, {1, 1, 1, 3}, {1, 2, 3});
  const tensor dy = make(dtype::f32, {1, 1, 1, 3}, {1, 2, 4});
  const tensor dx = run_op1("max_pool2d_grad", {x, dy},
                            {{"kernel", ints{2, 1}},
                             {"strides", ints{1, 1}},
                             {"padding", ints{1, 1, 0, 0}},
                             {"dilations", ints{2, 1}}});
  expect_close(dx, {1, 1, 1, 3}, {0, 0, 0}, 0, 0);
}

// <pool(x), dy> == <x, dx> in float64 with loom's forward ops (max pooling is linear on
// the argmax pattern, so the identity holds for it too).
TEST(NnBackward, PoolAdjointIdentity) {
  std::uint64_t seed = 20;
  for (const auto& c : pool_cases()) {
    const tensor x = random(dtype::f64, c.x, seed++);
    const tensor dy = random(dtype::f64, c.y(), seed++);
    for (const bool max : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (max ? "max " : "avg ") << to_string(c.x));
      attr_map fwd{{"kernel", c.kernel}, {"strides", c.strides}, {"padding", c.padding}};
      if (!max) fwd.emplace("count_include_pad", c.include_pad);
      const tensor y = run_op1(max ? "max_pool2d" : "avg_pool2d", {x}, fwd);
      const tensor dx = max ? run_op1("max_pool2d_grad", {x, dy}, pool_attrs(true, c))
                            : run_op1("avg_pool2d_grad", {dy}, pool_attrs(false, c));
      const double lhs = dot(values(y), values(dy));
      EXPECT_NEAR(dot(values(x), values(dx)), lhs, 1e-12 * (abs_dot(values(y), values(dy)) + 1));
    }
  }
}

TEST(NnBackward, PoolGradNonContiguousInputs) {
  for (const dtype t : float_types) {
    const pool_case c{.x = {2, 3, 6, 7}, .kernel = {2, 3}, .strides = {1, 2}, .padding = {1, 1}};
    const tensor x = random(t, c.x, 9);
    const tensor dy = random(t, c.y(), 10);
    const tensor dx_max = run_op1("max_pool2d_grad", {x, dy}, pool_attrs(true, c));
    expect_close(
        run_op1("max_pool2d_grad", {non_contiguous(x), non_contiguous(dy)}, pool_attrs(true, c)),
        c.x, values(dx_max), 0, 0);
    const tensor dx_avg = run_op1("avg_pool2d_grad", {dy}, pool_attrs(false, c));
    expect_close(run_op1("avg_pool2d_grad", {non_contiguous(dy)}, pool_attrs(false, c)), c.x,
                 values(dx_avg), 0, 0);
  }
}

TEST(NnBackward, AvgPoolGradUnknownBatchAndChannels) {
  const pool_case c{.x = {2, 3, 7, 6}, .kernel = {3, 2}, .strides = {2, 2}, .padding = {1, 0}};
  const tensor dy = random(dtype::f64, c.y(), 1);
  attr_map a = pool_attrs(false, c);
  a.insert_or_assign("input_shape", shape{-1, -1, 7, 6});
  expect_close(run_op1("avg_pool2d_grad", {dy}, a), c.x, avg_grad_reference(c, values(dy)), 1e-12,
               1e-12);
}

TEST(NnBackward, PoolGradEmpty) {
  for (const dtype t : {dtype::f32, dtype::f64}) {
    const pool_case c{.x = {0, 3, 4, 4}, .kernel = {2, 2}};
    expect_close(
        run_op1("max_pool2d_grad", {random(t, c.x, 1), random(t, c.y(), 2)}, pool_attrs(true, c)),
        c.x, {});
    expect_close(run_op1("avg_pool2d_grad", {random(t, c.y(), 2)}, pool_attrs(false, c)), c.x, {});
    const pool_case d{.x = {2, 0, 4, 4}, .kernel = {2, 2}};
    expect_close(run_op1("avg_pool2d_grad", {random(t, d.y(), 2)}, pool_attrs(false, d)), d.x, {});
  }
}

TEST(NnBackward, PoolGradBadInput) {
  const attr_map k22{{"kernel", ints{2, 2}}};
  const auto max_grad = [](shape xs, shape dys, attr_map attrs, dtype dyt = dtype::f32) {
    return [=] {
      run_op1("max_pool2d_grad", {random(dtype::f32, xs, 1), random(dyt, dys, 2)}, attrs);
    };
  };
  const auto avg_grad = [](shape dys, shape input_shape, attr_map attrs) {
    return [=] {
      attr_map a = attrs;
      a.emplace("input_shape", input_shape);
      run_op1("avg_pool2d_grad", {random(dtype::f32, dys, 2)}, a);
    };
  };
  expect_invalid_argument(
      max_grad({1, 2, 4, 4}, {1, 2, 3, 2}, k22),
      {"under_test", "max_pool2d_grad", "dy [1, 2, 3, 2]", "[1, 2, 2, 2]", "input [1, 2, 4, 4]"});
  expect_invalid_argument(max_grad({1, 2, 4, 4}, {1, 3, 2, 2}, k22),
                          {"under_test", "dy [1, 3, 2, 2]"});
  expect_invalid_argument(max_grad({1, 2, 4}, {1, 2, 2, 2}, k22), {"under_test", "rank 4"});
  expect_invalid_argument(max_grad({1, 2, 4, 4}, {1, 2, 2}, k22), {"under_test", "dy", "rank 4"});
  expect_invalid_argument(max_grad({1, 2, 4, 4}, {1, 2, 2, 2}, k22, dtype::f64), {"under_test"});
  expect_invalid_argument(max_grad({1, 2, 4, 4}, {1, 2, 2, 2}, {}), {"under_test", "kernel"});
  expect_invalid_argument(
      max_grad({1, 1, 4, 4}, {1, 1, 2, 2}, {{"kernel", ints{2, 2}}, {"padding", ints{2, 2}}}),
      {"under_test", "padding", "smaller"});
  expect_invalid_argument(
      avg_grad({1, 2, 3, 2}, {1, 2, 4, 4}, k22),
      {"under_test", "avg_pool2d_grad", "dy [1, 2, 3, 2]", "input_shape [1, 2, 4, 4]"});
  expect_invalid_argument(avg_grad({1, 2, 2, 2}, {1, 2, 4}, k22),
                          {"under_test", "input_shape", "rank 4"});
  expect_invalid_argument(avg_grad({1, 2, 2, 2}, {1, 2, 0, 4}, {{"kernel", ints{1, 1}}}),
                          {"under_test", "empty"});
  expect_invalid_argument(avg_grad({1, 2, 2, 2}, {1, 2, 1, 1}, {{"kernel", ints{3, 3}}}),
                          {"under_test", "larger"});
  expect_invalid_argument(
      [] {
        run_op1("avg_pool2d_grad", {random(dtype::i32, {1, 1, 2, 2}, 1)},
                {{"kernel", ints{2, 2}}, {"input_shape", shape{1, 1, 4, 4}}});
      },
      {"under_test", "int32"});
}

TEST(NnBackward, PoolGradRunTimeMismatch) {
  const shape unknown{-1, -1, -1, -1};
  expect_node_error(
      [&] {
        run_op_declared("max_pool2d_grad",
                        {random(dtype::f32, {1, 2, 4, 4}, 1), random(dtype::f32, {1, 2, 3, 3}, 2)},
                        {unknown, unknown}, {{"kernel", ints{2, 2}}});
      },
      {"under_test", "max_pool2d_grad", "dy float32[1, 2, 3, 3]", "[1, 2, 2, 2]"});
  expect_node_error(
      [&] {
        run_op_declared("avg_pool2d_grad", {random(dtype::f32, {1, 2, 3, 3}, 1)}, {unknown},
                        {{"kernel", ints{2, 2}}, {"input_shape", shape{1, 2, 4, 4}}});
      },
      {"under_test", "avg_pool2d_grad", "dy float32[1, 2, 3, 3]", "[1, 2, 2, 2]"});
  expect_node_error(
      [&] {
        run_op_declared("avg_pool2d_grad", {random(dtype::f32, {1, 2, 2, 2}, 1)}, {unknown},
                        {{"kernel", ints{2, 2}}, {"input_shape", shape{1, 2, -1, 4}}});
      },
      {"under_test", "input_shape [1, 2, ?, 4]", "dimension 2 unknown"});
}

// The builders make the nodes the kernels above run (names, inputs, attributes).
TEST(NnBackward, Builders) {
  graph g;
  graph_builder b(g);
  const auto x = ops::placeholder(b, "x", dtype::f32, {-1, 4, 7, 6});
  const auto w = ops::placeholder(b, "w", dtype::f32, {6, 2, 3, 3});
  const ops::conv2d_options opt{.strides = {2, 1}, .padding = {1, 0, 0, 1}, .groups = 2};
  const auto y = ops::conv2d(x, w, opt);
  const auto dx = ops::conv2d_backprop_input(y, w, {-1, 4, 7, 6}, opt, {.name = "dx"});
  const auto dw = ops::conv2d_backprop_filter(x, y, {6, 2, 3, 3}, opt, {.name = "dw"});
  EXPECT_EQ(to_string(dx.type()), "float32[?, 4, 7, 6]");
  EXPECT_EQ(to_string(dw.type()), "float32[6, 2, 3, 3]");
  const ops::pool_options pool{
      .kernel = {3, 3}, .strides = {2, 2}, .padding = {1, 1}, .count_include_pad = true};
  const auto mp = ops::max_pool2d(x, pool);
  const auto ap = ops::avg_pool2d(x, pool);
  EXPECT_EQ(to_string(ops::max_pool2d_grad(x, mp, pool).type()), "float32[?, 4, 7, 6]");
  const auto ag = ops::avg_pool2d_grad(ap, {-1, 4, 7, 6}, pool, {.name = "ag"});
  EXPECT_EQ(to_string(ag.type()), "float32[?, 4, 7, 6]");
  EXPECT_TRUE(ag.producer().attr<bool>("count_include_pad"));
  EXPECT_EQ(dx.producer().attr<std::int64_t>("groups"), 2);
  EXPECT_EQ(to_string(dw.producer().attr<shape>("filter_shape")), "[6, 2, 3, 3]");
  // A gradient that does not fit its forward fails when the node is added.
  expect_invalid_argument(
      [&] {
        ops::conv2d_backprop_input(y, w, {-1, 4, 9, 6}, opt);
      },
      {"conv2d_backprop_input", "dy", "input_shape"});
}

}  // namespace
}  // namespace loom::testing
