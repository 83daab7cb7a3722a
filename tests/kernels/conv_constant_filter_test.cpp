// A convolution whose filter is a `const` node keeps the filter reordered into oneDNN's
// layout across runs (Note [constant reorders]): its answers are bit for bit those of the
// same convolution with the filter fed at run time, run after run, for new inputs too. The
// 3x3 layers that run Winograd's algorithm for a constant filter (Note [Winograd
// convolutions] in src/backends/cpu/nn_conv.cpp) instead match a float64 convolution within
// float32's tolerance, with or without the graph passes and channels first or last, bit for
// bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "loom/graph/ops/state.hpp"
#include "loom/runtime/session.hpp"

namespace loom::testing {
namespace {

void expect_same_bits(const tensor& a, const tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
}

void check(const shape& xs, const shape& ws, std::int64_t groups, dtype t) {
  SCOPED_TRACE(to_string(xs) + " * " + to_string(ws));
  const tensor w = random(t, ws, 7);
  ops::conv2d_options o{.strides = {1, 1}, .padding = {1, 1, 1, 1}, .dilations = {1, 1}, .groups = groups};
  graph constant_graph;
  {
    graph_builder b(constant_graph);
    auto x = ops::placeholder(b, "x", t, xs);
    (void)ops::conv2d(x, ops::constant(b, w, {.name = "w", .device = {}}), o, {.name = "y", .device = {}});
  }
  graph fed_graph;
  {
    graph_builder b(fed_graph);
    auto x = ops::placeholder(b, "x", t, xs);
    auto wp = ops::placeholder(b, "w", t, ws);
    (void)ops::conv2d(x, wp, o, {.name = "y", .device = {}});
  }
  session_options so;
  so.passes.enabled = false;  // the const stays a const input of the conv
  session with_constant(std::move(constant_graph), so);
  session fed(std::move(fed_graph), so);
  for (std::uint64_t seed : {1U, 2U, 3U}) {
    const tensor x = random(t, xs, seed);
    const auto a = with_constant.run({{"x", x}}, {"y"});
    const auto b = fed.run({{"x", x}, {"w", w}}, {"y"});
    expect_same_bits(a.at(0), b.at(0));
  }
}

TEST(ConvConstantFilter, SameBitsAsAFedFilterRunAfterRun) {
  check({2, 16, 9, 9}, {32, 16, 3, 3}, 1, dtype::f32);
  check({1, 32, 7, 7}, {32, 1, 3, 3}, 32, dtype::f32);  // depthwise
  check({1, 8, 5, 5}, {8, 4, 3, 3}, 2, dtype::bf16);
}

TEST(ConvConstantFilter, WinogradLayersMatchFloat64AndThePassesKeepTheirBits) {
  // 64 channels in and out, 3x3, stride 1: a resnet layer, Winograd's for a constant filter.
  const shape xs{2, 64, 14, 14};
  const shape ws{64, 64, 3, 3};
  const tensor w = random(dtype::f32, ws, 11, -0.2, 0.2);
  const ops::conv2d_options o{.strides = {1, 1}, .padding = {1, 1, 1, 1}, .dilations = {1, 1}, .groups = 1};
  const auto make = [&](bool constant) {
    graph g;
    graph_builder b(g);
    auto x = ops::placeholder(b, "x", dtype::f32, xs);
    auto filter = constant ? ops::constant(b, w, {.name = "w", .device = {}})
                           : ops::placeholder(b, "w", dtype::f32, ws);
    (void)ops::relu(ops::conv2d(x, filter, o, {.name = "y", .device = {}}), {.name = "r", .device = {}});
    return g;
  };
  // The same layer channels last: the kernel computes it in the same blocks.
  graph nhwc_graph;
  {
    graph_builder b(nhwc_graph);
    ops::conv2d_options on = o;
    on.data_format = "NHWC";
    auto x = ops::transpose(ops::placeholder(b, "x", dtype::f32, xs), {0, 2, 3, 1});
    auto y = ops::conv2d(x, ops::constant(b, w, {.name = "w", .device = {}}), on);
    (void)ops::transpose(y, {0, 3, 1, 2}, {.name = "y", .device = {}});
  }
  session_options bare;
  bare.passes.enabled = false;
  session plain(make(true), bare);
  session nhwc(std::move(nhwc_graph), bare);
  session passes(make(true), session_options{});
  session fed(make(false), bare);
  for (std::uint64_t seed : {1U, 2U}) {
    SCOPED_TRACE(seed);
    const tensor x = random(dtype::f32, xs, seed);
    const auto a = plain.run({{"x", x}}, {"y", "r"});
    const auto b = passes.run({{"x", x}}, {"r"});  // the relu fused into the convolution
    const auto c = fed.run({{"x", x}, {"w", w}}, {"y"});
    expect_same_bits(a.at(1), b.at(0));
    expect_same_bits(a.at(0), nhwc.run({{"x", x}}, {"y"}).at(0));
    const conv2d_reference want = conv2d_float64(x, w, o.strides, o.padding, o.dilations, o.groups);
    const auto got = values(a.at(0));
    const auto direct = values(c.at(0));
    int reported = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      // float32's tolerance of conv2d's own tests (tests/kernels/nn_conv_test.cpp).
      const double tol = 1e-5 * want.magnitude[i];
      if (!(std::fabs(got[i] - want.value[i]) <= tol && std::fabs(direct[i] - want.value[i]) <= tol) &&
          reported++ < 8) {
        ADD_FAILURE() << "element " << i << ": constant filter " << got[i] << ", fed filter "
                      << direct[i] << ", float64 " << want.value[i];
      }
    }
    // Where oneDNN computes in channel blocks (AVX-512) it has Winograd's kernels: the
    // constant filter's sums are then not the direct kernel's.
    if (nn_rules::cpu_computes_in_channel_blocks()) {
      EXPECT_NE(std::memcmp(a.at(0).raw_data(), c.at(0).raw_data(), a.at(0).nbytes()), 0);
    }
  }
}

}  // namespace
}  // namespace loom::testing
