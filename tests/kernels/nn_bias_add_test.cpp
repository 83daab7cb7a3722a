// bias_add against a float64 loop: NHWC (last dimension) and NCHW (dimension 1) on ranks
// 2 to 5, numeric dtypes, non-contiguous input, in-place reuse of the input's buffer,
// empty tensors, and bad input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/kernel_test_support.hpp"
#include "loom/graph/graph.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::testing {
namespace {

std::vector<double> reference(const tensor& x, const tensor& bias, bool nchw) {
  const auto xv = values(x);
  const auto bv = values(bias);
  const shape& s = x.shape();
  const std::size_t axis = nchw ? 1 : s.rank() - 1;
  std::int64_t inner = 1;
  for (std::size_t i = axis + 1; i < s.rank(); ++i) inner *= s[i];
  std::vector<double> r(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const auto c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / inner) % s[axis]);
    r[i] = xv[i] + bv[c];
  }
  return r;
}

void check(const tensor& x, const tensor& bias, bool nchw) {
  SCOPED_TRACE(x.describe() + (nchw ? " NCHW" : " NHWC"));
  const tensor got = run_op1("bias_add", {x, bias}, {{"data_format", nchw ? "NCHW" : "NHWC"}});
  const dtype t = x.type();
  expect_close(got, x.shape(), reference(x, bias, nchw), rtol_for(t), atol_for(t));
}

TEST(NnBiasAdd, Nhwc) {
  for (const dtype t :
       {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64, dtype::i8}) {
    check(random(t, {4, 3}, 1), random(t, {3}, 2), false);
    check(random(t, {2, 3, 5, 7}, 3), random(t, {7}, 4), false);
    check(random(t, {2, 1, 3, 1, 6}, 5), random(t, {6}, 6), false);
    check(random(t, {300, 257}, 7), random(t, {257}, 8), false);
  }
}

TEST(NnBiasAdd, Nchw) {
  for (const dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::u8}) {
    const double lo = t == dtype::u8 ? 0.0 : -2.0;
    check(random(t, {2, 3, 4, 5}, 1, lo, 60), random(t, {3}, 2, lo, 60), true);
    check(random(t, {4, 3}, 3, lo, 60), random(t, {3}, 4, lo, 60), true);
    check(random(t, {2, 5, 7}, 5, lo, 60), random(t, {5}, 6, lo, 60), true);
    check(random(t, {8, 64, 30, 30}, 7, lo, 60), random(t, {64}, 8, lo, 60), true);
  }
}

TEST(NnBiasAdd, NonContiguousInput) {
  for (const dtype t : {dtype::f32, dtype::f64, dtype::bf16}) {
    check(non_contiguous(random(t, {3, 4, 5}, 1)), random(t, {5}, 2), false);
    check(non_contiguous(random(t, {2, 3, 4, 5}, 1)), random(t, {3}, 2), true);
    check(random(t, {3, 4}, 1), broadcast_view(random(t, {1}, 2), {4}), false);
  }
}

TEST(NnBiasAdd, WritesInPlaceIntoAnInputItAloneHolds) {
  graph g;
  node_spec px{
      .name = "x", .op = "placeholder", .attrs = {{"dtype", dtype::f32}, {"shape", shape{2, 3}}}};
  node_spec pb{
      .name = "b", .op = "placeholder", .attrs = {{"dtype", dtype::f32}, {"shape", shape{3}}}};
  const node_id xi = g.add_node(px).id;
  const node_id bi = g.add_node(pb).id;
  const node& n =
      g.add_node({.name = "under_test", .op = "bias_add", .inputs = {{xi, 0}, {bi, 0}}});
  auto kernel = kernel_registry::global()
                    .get(n, device_type::cpu)
                    .create(kernel_construction(n, test_device(), &g));
  std::vector<tensor> in{make(dtype::f32, {2, 3}, {1, 2, 3, 4, 5, 6}),
                         make(dtype::f32, {3}, {10, 20, 30})};
  const void* x_data = in[0].raw_data();
  std::vector<tensor> out(1);
  variable_store vars;
  kernel_context ctx(n, test_device(), in, out, &vars, nullptr);
  kernel->compute(ctx);
  EXPECT_EQ(out[0].raw_data(), x_data);
  expect_close(out[0], {2, 3}, {11, 22, 33, 14, 25, 36}, 0, 0);
}

TEST(NnBiasAdd, Empty) {
  expect_close(run_op1("bias_add", {random(dtype::f32, {0, 3}, 1), random(dtype::f32, {3}, 2)}),
               {0, 3}, {});
  expect_close(run_op1("bias_add", {random(dtype::f32, {2, 0}, 1), random(dtype::f32, {0}, 2)}),
               {2, 0}, {});
}

TEST(NnBiasAdd, BadInput) {
  const auto add = [](shape xs, shape bs, attr_map attrs = {}) {
    return [=] {
      run_op1("bias_add", {random(dtype::f32, xs, 1), random(dtype::f32, bs, 2)}, attrs);
    };
  };
  expect_invalid_argument(add({2, 3}, {4}), {"under_test", "[4]", "[2, 3]"});
  expect_invalid_argument(add({2, 3, 4}, {4}, {{"data_format", "NCHW"}}), {"under_test", "[4]", "3"});
  expect_invalid_argument(add({2, 3}, {3, 1}), {"under_test", "rank 1"});
  expect_invalid_argument(add({3}, {3}), {"under_test", "rank >= 2"});
  expect_invalid_argument(add({2, 3}, {3}, {{"data_format", "NDHWC"}}), {"under_test", "data_format"});
  expect_invalid_argument(
      [] {
        run_op1("bias_add", {random(dtype::boolean, {2, 2}, 1), random(dtype::boolean, {2}, 2)});
      },
      {"under_test", "bool"});
}

}  // namespace
}  // namespace loom::testing
