// conv2d against a float64 loop: strides, asymmetric and symmetric padding, dilation,
// groups (depthwise too), 1x1 filters, a ResNet-style layer, every float dtype,
// non-contiguous inputs, empty tensors; bad input at construction and at run time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/graph.hpp"
#include "loom/kernel/kernel_registry.hpp"

namespace loom::testing {
namespace {

struct conv_case {
  shape x;  // N, C, H, W
  shape w;  // O, C / groups, KH, KW
  std::vector<std::int64_t> strides{1, 1};
  std::vector<std::int64_t> padding{0, 0, 0, 0};
  std::vector<std::int64_t> dilations{1, 1};
  std::int64_t groups = 1;
};

attr_map attrs_of(const conv_case& c) {
  return {{"strides", c.strides},
          {"padding", c.padding},
          {"dilations", c.dilations},
          {"groups", c.groups}};
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

tensor transposed(const tensor& t, std::vector<std::int64_t> perm) {
  return run_op1("transpose", {t}, {{"perm", std::move(perm)}});
}

void expect_same_bits(const tensor& a, const tensor& b) {
  ASSERT_EQ(to_string(a.shape()), to_string(b.shape()));
  ASSERT_EQ(a.type(), b.type());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
}

// data_format "NHWC": the same numbers as NCHW, channels last. Bit for bit, since oneDNN is
// asked for the same primitive (format_tag::any) and the reference loop runs on the NCHW
// copy; here against the NCHW kernel's own answer.
void check_nhwc(const conv_case& c, const tensor& x, const tensor& w, const tensor& nchw) {
  attr_map a = attrs_of(c);
  a.emplace("data_format", std::string("NHWC"));
  const tensor got = run_op1("conv2d", {transposed(x, {0, 2, 3, 1}), w}, a);
  const shape& s = nchw.shape();
  ASSERT_EQ(to_string(got.shape()), to_string(shape{s[0], s[2], s[3], s[1]}));
  expect_same_bits(transposed(got, {0, 3, 1, 2}), nchw);
}

void check_with(const conv_case& c, const tensor& x, const tensor& w) {
  SCOPED_TRACE("x " + x.describe() + ", w " + w.describe());
  const tensor got = run_op1("conv2d", {x, w}, attrs_of(c));
  {
    SCOPED_TRACE("NHWC");
    check_nhwc(c, x, w, got);
  }
  const conv2d_reference want = conv2d_float64(x, w, c.strides, c.padding, c.dilations, c.groups);
  ASSERT_EQ(to_string(got.shape()), to_string(want.s));
  const auto g = values(got);
  int reported = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = tolerance(x.type()) * want.magnitude[i] + 1e-30;
    if (!(std::fabs(g[i] - want.value[i]) <= tol) && reported++ < 8) {
      ADD_FAILURE() << "element " << i << ": got " << g[i] << ", expected " << want.value[i];
    }
  }
}

void check(const conv_case& c, dtype t = dtype::f32, std::uint64_t seed = 1) {
  check_with(c, random(t, c.x, seed), random(t, c.w, seed + 1));
}

constexpr dtype float_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

TEST(NnConv, Basic) {
  for (const dtype t : float_types) {
    check({.x = {1, 3, 5, 5}, .w = {2, 3, 3, 3}}, t);
    check({.x = {2, 4, 7, 6}, .w = {5, 4, 2, 3}}, t);
  }
}

TEST(NnConv, StridesAndPadding) {
  for (const dtype t : float_types) {
    check({.x = {2, 3, 9, 8}, .w = {4, 3, 3, 3}, .strides = {2, 2}, .padding = {1, 1}}, t);
    check({.x = {1, 2, 9, 8}, .w = {3, 2, 3, 2}, .strides = {2, 3}, .padding = {1, 0, 2, 1}}, t);
    check({.x = {1, 2, 4, 4}, .w = {3, 2, 5, 5}, .padding = {2, 2, 2, 2}}, t);
    check({.x = {1, 1, 6, 6}, .w = {1, 1, 3, 3}, .strides = {3, 3}, .padding = {0, 2, 0, 2}}, t);
  }
}

TEST(NnConv, Dilation) {
  for (const dtype t : float_types) {
    check({.x = {1, 2, 11, 10}, .w = {3, 2, 3, 3}, .dilations = {2, 2}}, t);
    check({.x = {2, 3, 12, 9},
           .w = {4, 3, 3, 2},
           .strides = {2, 1},
           .padding = {2, 2},
           .dilations = {3, 2}},
          t);
  }
}

TEST(NnConv, Groups) {
  for (const dtype t : float_types) {
    check({.x = {2, 4, 6, 6}, .w = {6, 2, 3, 3}, .padding = {1, 1}, .groups = 2}, t);
    // Depthwise, and depthwise with a channel multiplier of 2.
    check({.x = {2, 8, 7, 7}, .w = {8, 1, 3, 3}, .padding = {1, 1}, .groups = 8}, t);
    check({.x = {1, 4, 7, 7}, .w = {8, 1, 3, 3}, .strides = {2, 2}, .groups = 4}, t);
  }
}

TEST(NnConv, OneByOne) {
  for (const dtype t : float_types) {
    check({.x = {2, 16, 5, 5}, .w = {8, 16, 1, 1}}, t);
    check({.x = {1, 8, 6, 6}, .w = {4, 8, 1, 1}, .strides = {2, 2}}, t);
  }
}

TEST(NnConv, ResNetLayer) {
  check({.x = {2, 32, 14, 14}, .w = {32, 32, 3, 3}, .padding = {1, 1}}, dtype::f32);
  check({.x = {1, 16, 14, 14}, .w = {32, 16, 3, 3}, .strides = {2, 2}, .padding = {1, 1}},
        dtype::bf16);
  check({.x = {1, 8, 10, 10}, .w = {8, 8, 3, 3}, .padding = {1, 1}}, dtype::f64);
}

TEST(NnConv, NonContiguousInputs) {
  for (const dtype t : float_types) {
    const conv_case c{.x = {2, 3, 6, 5}, .w = {4, 3, 3, 2}, .padding = {1, 1}};
    const tensor x = random(t, c.x, 5);
    const tensor w = random(t, c.w, 6);
    check_with(c, non_contiguous(x), w);
    check_with(c, x, non_contiguous(w));
  }
}

TEST(NnConv, Empty) {
  for (const dtype t : {dtype::f32, dtype::f64}) {
    expect_close(run_op1("conv2d", {random(t, {0, 3, 5, 5}, 1), random(t, {2, 3, 3, 3}, 2)}),
                 {0, 2, 3, 3}, {});
    expect_close(run_op1("conv2d", {random(t, {1, 3, 5, 5}, 1), random(t, {0, 3, 3, 3}, 2)}),
                 {1, 0, 3, 3}, {});
    // An empty image with padding: every window lies in the padding.
    expect_close(run_op1("conv2d", {random(t, {1, 2, 0, 3}, 1), random(t, {2, 2, 1, 1}, 2)},
                         {{"padding", {1, 1}}}),
                 {1, 2, 2, 5}, std::vector<double>(20, 0.0), 0, 0);
    // No input channels: every output is an empty sum.
    expect_close(run_op1("conv2d", {random(t, {1, 0, 4, 4}, 1), random(t, {2, 0, 3, 3}, 2)}),
                 {1, 2, 2, 2}, std::vector<double>(8, 0.0), 0, 0);
    // The same in NHWC.
    const attr_map nhwc{{"data_format", std::string("NHWC")}};
    expect_close(run_op1("conv2d", {random(t, {0, 5, 5, 3}, 1), random(t, {2, 3, 3, 3}, 2)}, nhwc),
                 {0, 3, 3, 2}, {});
    expect_close(run_op1("conv2d", {random(t, {1, 4, 4, 0}, 1), random(t, {2, 0, 3, 3}, 2)}, nhwc),
                 {1, 2, 2, 2}, std::vector<double>(8, 0.0), 0, 0);
  }
}

TEST(NnConv, BadInput) {
  const auto conv = [](shape xs, shape ws, attr_map attrs = {}) {
    return [=] {
      run_op1("conv2d", {random(dtype::f32, xs, 1), random(dtype::f32, ws, 2)}, attrs);
    };
  };
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 4, 3, 3}), {"under_test", "[1, 3, 5, 5]", "[2, 4, 3, 3]"});
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 1, 3, 3}, {{"groups", 2}}), {"under_test", "3", "groups"});
  expect_invalid_argument(conv({1, 4, 5, 5}, {3, 2, 3, 3}, {{"groups", 2}}),
                 {"under_test", "output channels"});
  expect_invalid_argument(conv({1, 3, 2, 2}, {2, 3, 3, 3}), {"under_test", "larger"});
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 3, 3, 3}, {{"dilations", {3, 3}}}), {"under_test"});
  expect_invalid_argument(conv({1, 3, 5}, {2, 3, 3, 3}), {"under_test", "rank 4"});
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 3, 3}), {"under_test", "rank 4"});
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 3, 3, 3}, {{"strides", {0, 1}}}),
                 {"under_test", "strides"});
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 3, 3, 3}, {{"padding", {1, 1, 1}}}),
                 {"under_test", "padding"});
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 3, 3, 3}, {{"padding", {-1, 0}}}),
                 {"under_test", "padding"});
  expect_invalid_argument(conv({1, 3, 5, 5}, {2, 3, 3, 3}, {{"groups", 0}}), {"under_test", "groups"});
  expect_invalid_argument(
      [] {
        run_op1("conv2d",
                {random(dtype::f32, {1, 3, 5, 5}, 1), random(dtype::f64, {2, 3, 3, 3}, 2)});
      },
      {"under_test"});
  // NHWC: the channels are the last dimension; the messages name the shapes as given.
  const attr_map nhwc{{"data_format", std::string("NHWC")}};
  expect_invalid_argument(conv({1, 5, 5, 3}, {2, 4, 3, 3}, nhwc),
                          {"under_test", "[1, 5, 5, 3]", "4 input channels", "3 channels"});
  expect_invalid_argument(conv({1, 5, 5}, {2, 3, 3, 3}, nhwc), {"under_test", "NHWC", "rank 4"});
  expect_invalid_argument(conv({1, 5, 5, 3}, {2, 3, 3, 3}, {{"data_format", std::string("NWHC")}}),
                          {"under_test", "data_format", "NHWC"});
}

// Shapes the graph did not know: the kernel checks what arrives.
TEST(NnConv, RunTimeMismatch) {
  graph g;
  node_spec px{.name = "x",
               .op = "placeholder",
               .attrs = {{"dtype", dtype::f32}, {"shape", shape{-1, -1, -1, -1}}}};
  node_spec pw{.name = "w",
               .op = "placeholder",
               .attrs = {{"dtype", dtype::f32}, {"shape", shape{-1, -1, -1, -1}}}};
  const node_id xi = g.add_node(px).id;
  const node_id wi = g.add_node(pw).id;
  const node& n = g.add_node({.name = "under_test", .op = "conv2d", .inputs = {{xi, 0}, {wi, 0}}});
  auto kernel = kernel_registry::global()
                    .get(n, device_type::cpu)
                    .create(kernel_construction(n, test_device(), &g));
  std::vector<tensor> in{random(dtype::f32, {1, 3, 5, 5}, 1), random(dtype::f32, {2, 4, 3, 3}, 2)};
  std::vector<tensor> out(1);
  kernel_context ctx(n, test_device(), in, out, nullptr, nullptr);
  try {
    kernel->compute(ctx);
    ADD_FAILURE() << "expected loom::node_error";
  } catch (const node_error& e) {
    EXPECT_NE(std::string(e.what()).find("under_test"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::testing
