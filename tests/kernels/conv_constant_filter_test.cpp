// A convolution whose filter is a `const` node keeps the filter reordered into oneDNN's
// layout across runs (Note [constant reorders]): its answers are bit for bit those of the
// same convolution with the filter fed at run time, run after run, for new inputs too.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/ops/nn.hpp"
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

}  // namespace
}  // namespace loom::testing
