// gather and one_hot: values against index-arithmetic references, every dtype, int32 and
// int64 indices, empty / scalar / rank 1..5 / non-contiguous inputs, and errors at
// construction and at run time (bad indices name the position and the value).
#include <gtest/gtest.h>

#include <random>

#include "kernels/array_reference.hpp"
#include "kernels/kernel_test_support.hpp"
#include "loom/graph/builder.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::testing {
namespace {

using namespace array_ref;

ints random_indices(std::int64_t n, std::int64_t limit, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  ints v(static_cast<std::size_t>(n));
  for (auto& x : v) x = std::uniform_int_distribution<std::int64_t>(0, limit - 1)(rng);
  return v;
}

// ---- gather ----------------------------------------------------------------------------

void check_gather(const tensor& params, const ints& indices, const ints& is, std::int64_t axis,
                  dtype index_type = dtype::i32) {
  const ints ps = params.shape().to_vector();
  const auto ax =
      static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(ps.size()) : axis);
  ints expected_shape;
  const doubles expected = gather(values(params), ps, indices, is, ax, &expected_shape);
  SCOPED_TRACE(::testing::Message() << "params " << params.describe() << " indices "
                                    << to_string(shape(is)) << " axis " << axis);
  const tensor out =
      run_op1("gather", {params, index_tensor(index_type, is, indices)}, {{"axis", axis}});
  expect_exact(out, expected_shape, expected);
}

TEST(Gather, EveryDtypeWithBothIndexTypes) {
  for (dtype t : all_dtypes()) {
    for (dtype it : {dtype::i32, dtype::i64}) {
      SCOPED_TRACE(std::string(to_string(t)) + " / " + to_string(it));
      const tensor p = random(t, {5, 3}, 100);
      check_gather(p, {4, 0, 0, 2, 1}, {5}, 0, it);
      check_gather(p, {2, 1, 2, 0}, {2, 2}, 1, it);
      check_gather(p, {3}, {}, 0, it);
    }
  }
}

TEST(Gather, EveryAxisOfRanksOneToFive) {
  std::mt19937_64 rng(101);
  for (std::size_t rank = 1; rank <= 5; ++rank) {
    ints ps(rank);
    for (auto& d : ps) d = std::uniform_int_distribution<std::int64_t>(1, 4)(rng);
    const tensor p = random(dtype::f32, to_shape(ps), rng());
    for (std::size_t ax = 0; ax < rank; ++ax) {
      for (const ints& is : {ints{}, ints{3}, ints{2, 3}}) {
        const ints idx = random_indices(count(is), ps[ax], rng());
        check_gather(p, idx, is, static_cast<std::int64_t>(ax));
        check_gather(p, idx, is, static_cast<std::int64_t>(ax) - static_cast<std::int64_t>(rank),
                     dtype::i64);
      }
    }
  }
}

TEST(Gather, EmptyNonContiguousAndLarge) {
  const tensor p = random(dtype::f64, {4, 3}, 102);
  check_gather(p, {}, {0}, 0);
  check_gather(p, {}, {2, 0}, 1);
  check_gather(random(dtype::f32, {0, 3}, 103), {1, 2}, {2}, 1);
  for (dtype t : {dtype::f16, dtype::i8, dtype::f32}) {
    SCOPED_TRACE(to_string(t));
    const tensor nc = non_contiguous(random(t, {3, 6, 5}, 104));
    check_gather(nc, {5, 0, 5, 2}, {4}, 1);
    check_gather(nc, {4, 4, 0}, {3}, 2);
  }
  const tensor indices_view = every_other(index_tensor(dtype::i64, {4}, {2, 0, 3, 1}));
  const tensor v = random(dtype::i32, {4, 2}, 105);
  const tensor out = run_op1("gather", {v, indices_view});
  expect_exact(out, {4, 2}, gather(values(v), {4, 2}, {2, 0, 3, 1}, {4}, 0, nullptr));
  // Rows of many bytes (memcpy path) and single elements (inner == 1), on several threads.
  const tensor big = random(dtype::f32, {1000, 64}, 106);
  check_gather(big, random_indices(5000, 1000, 107), {5000}, 0);
  check_gather(big, random_indices(3000, 64, 108), {100, 30}, 1, dtype::i64);
}

TEST(Gather, BadIndicesAreNodeErrorsNamingPositionAndValue) {
  const tensor p = random(dtype::f32, {4, 3}, 109);
  expect_node_error(
      [&] {
        run_op1("gather", {p, index_tensor(dtype::i32, {3}, {0, -1, 2})});
      },
      "indices[1] = -1");
  expect_node_error(
      [&] {
        run_op1("gather", {p, index_tensor(dtype::i64, {2, 2}, {0, 1, 2, 4})});
      },
      "indices[1, 1] = 4");
  expect_node_error(
      [&] {
        run_op1("gather", {p, index_tensor(dtype::i64, {2}, {0, 3})}, {{"axis", 1}});
      },
      "indices[1] = 3");
  expect_node_error(
      [&] {
        run_op1("gather", {random(dtype::f32, {0, 2}, 110), index_tensor(dtype::i32, {1}, {0})});
      },
      "out of range");
}

TEST(Gather, WrapNegativeCountsFromTheEnd) {
  for (dtype t : {dtype::f32, dtype::bf16, dtype::i64, dtype::boolean}) {
    for (dtype it : {dtype::i32, dtype::i64}) {
      SCOPED_TRACE(std::string(to_string(t)) + " / " + to_string(it));
      const tensor p = random(t, {4, 3}, 111);
      const ints negative{-1, 0, -4, 3, -3};
      ints wrapped;
      for (auto v : negative) wrapped.push_back(v < 0 ? v + 3 : v);
      // Along axis 1 (n = 3): -4 is out of range, so use the in-range ones there.
      const ints along1{-1, 0, -3, 2, -2};
      ints along1_wrapped;
      for (auto v : along1) along1_wrapped.push_back(v < 0 ? v + 3 : v);
      ints shape_out;
      const doubles want = gather(values(p), {4, 3}, along1_wrapped, {5}, 1, &shape_out);
      expect_exact(run_op1("gather", {p, index_tensor(it, {5}, along1)},
                           {{"axis", 1}, {"wrap_negative", true}}),
                   shape_out, want);
      ints rows{-1, -4, 2};
      const doubles want0 = gather(values(p), {4, 3}, {3, 0, 2}, {3}, 0, &shape_out);
      expect_exact(run_op1("gather", {p, index_tensor(it, {3}, rows)}, {{"wrap_negative", true}}),
                   shape_out, want0);
    }
  }
  const tensor p = random(dtype::f32, {4, 3}, 112);
  expect_node_error(
      [&] {
        run_op1("gather", {p, index_tensor(dtype::i64, {2}, {-5, 0})}, {{"wrap_negative", true}});
      },
      "indices[0] = -5");
}

TEST(Gather, ConstructionErrors) {
  const tensor p = random(dtype::f32, {4, 3}, 111);
  expect_invalid([&] { run_op1("gather", {p, make(dtype::f32, {1}, {0})}); }, "Tindices");
  expect_invalid(
      [&] {
        run_op1("gather", {p, index_tensor(dtype::i32, {1}, {0})}, {{"axis", 2}});
      },
      "out of range");
  expect_invalid(
      [&] {
        run_op1("gather", {make(dtype::f32, {}, {1}), index_tensor(dtype::i32, {1}, {0})});
      },
      "rank >= 1");
}

// ---- one_hot ---------------------------------------------------------------------------

void check_one_hot(const ints& indices, const ints& is, std::int64_t depth, std::int64_t axis,
                   dtype t = dtype::f32, double on = 1.0, double off = 0.0,
                   dtype index_type = dtype::i64) {
  const auto ax =
      static_cast<std::size_t>(axis == -1 ? static_cast<std::int64_t>(is.size()) : axis);
  ints expected_shape;
  const doubles expected = one_hot(indices, is, depth, on, off, ax, &expected_shape);
  SCOPED_TRACE(::testing::Message() << to_string(t) << " indices " << to_string(shape(is))
                                    << " depth " << depth << " axis " << axis);
  const tensor out = run_op1(
      "one_hot", {index_tensor(index_type, is, indices)},
      {{"depth", depth}, {"axis", axis}, {"dtype", t}, {"on_value", on}, {"off_value", off}});
  EXPECT_EQ(out.type(), t);
  expect_exact(out, expected_shape, expected);
}

TEST(OneHot, EveryDtypeAndAxis) {
  const ints idx{0, 3, 1, 2, 2, 0};
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const double on = t == dtype::boolean ? 1.0 : 5.0;
    const double off = t == dtype::boolean || t == dtype::u8 ? 0.0 : -2.0;
    for (std::int64_t axis : {-1, 0, 1, 2}) check_one_hot(idx, {2, 3}, 4, axis, t, on, off);
  }
  check_one_hot({1, 0, 2}, {3}, 3, -1, dtype::f32, 1.0, 0.0, dtype::i32);
  check_one_hot({1, 0, 2, 4}, {2, 1, 2}, 5, 1, dtype::bf16, 0.5, 0.25, dtype::i32);
}

TEST(OneHot, OutOfRangeIndicesGiveAllOffRows) {
  check_one_hot({0, -1, 3, 7, 2}, {5}, 3, -1);
  check_one_hot({-5, 1, 100, 0}, {2, 2}, 2, 0, dtype::i32, 9.0, 1.0, dtype::i32);
  // An index equal to depth last: a kernel that let it through would write past the end
  // (which the sanitizer build catches) or into the next row.
  check_one_hot({0, 2, 3}, {3}, 3, -1);
  check_one_hot({1, 4}, {1, 2}, 4, 0);
  check_one_hot({3, 0, 1, 3}, {2, 2}, 3, 1);
  // Explicit check of one row, independent of the reference.
  const tensor out = run_op1("one_hot", {index_tensor(dtype::i32, {2}, {-1, 1})}, {{"depth", 3}});
  expect_exact(out, {2, 3}, {0, 0, 0, 0, 1, 0});
}

TEST(OneHot, ScalarEmptyZeroDepthAndLarge) {
  check_one_hot({2}, {}, 4, -1);
  check_one_hot({2}, {}, 4, 0);
  check_one_hot({}, {0}, 4, -1);
  check_one_hot({}, {3, 0}, 2, 1);
  check_one_hot({0, 1}, {2}, 0, -1);
  check_one_hot(random_indices(20000, 12, 120), {20000}, 10, -1, dtype::f16);
  check_one_hot(random_indices(6000, 30, 121), {60, 100}, 30, 1, dtype::i64);
  const tensor nc = non_contiguous(index_tensor(dtype::i64, {2, 3}, {0, 1, 2, 2, 1, 0}));
  const tensor out = run_op1("one_hot", {nc}, {{"depth", 3}});
  const auto v = values(nc);
  expect_exact(out, {2, 3, 3}, one_hot(ints(v.begin(), v.end()), {2, 3}, 3, 1.0, 0.0, 2, nullptr));
}

TEST(OneHot, ConstructionErrors) {
  const tensor idx = index_tensor(dtype::i32, {3}, {0, 1, 2});
  expect_invalid([&] { run_op1("one_hot", {idx}, {{"depth", 3}, {"axis", 2}}); }, "outside");
  expect_invalid([&] { run_op1("one_hot", {idx}, {{"depth", 3}, {"axis", -2}}); }, "outside");
  expect_invalid([&] { run_op1("one_hot", {idx}, {{"depth", -1}}); }, "depth");
  expect_invalid([&] { run_op1("one_hot", {idx}); }, "depth");
  expect_invalid(
      [&] {
        run_op1("one_hot", {make(dtype::u8, {1}, {0})}, {{"depth", 3}});
      },
      "Tindices");
}

// ---- builders --------------------------------------------------------------------------

TEST(ArrayIndexBuilders, InferOutputTypes) {
  graph g;
  graph_builder b(g);
  auto p = ops::placeholder(b, "p", dtype::bf16, {10, -1, 4});
  auto i = ops::placeholder(b, "i", dtype::i64, {2, 3});
  EXPECT_EQ(to_string(ops::gather(p, i).type()), "bfloat16[2, 3, ?, 4]");
  EXPECT_EQ(to_string(ops::gather(p, i, -1).type()), "bfloat16[10, ?, 2, 3]");
  auto oh = ops::one_hot(i, 7);
  EXPECT_EQ(to_string(oh.type()), "float32[2, 3, 7]");
  EXPECT_EQ(to_string(ops::one_hot(i, 7, dtype::u8, 1, 0, 0).type()), "uint8[7, 2, 3]");
  EXPECT_EQ(to_string(ops::one_hot(i, 7, dtype::f64, 1, 0, 1).type()), "float64[2, 7, 3]");
  EXPECT_THROW(ops::gather(p, p), invalid_argument);
  EXPECT_THROW(ops::gather(p, i, 3), invalid_argument);
  EXPECT_THROW(ops::one_hot(i, 7, dtype::f32, 1, 0, 3), invalid_argument);
}

}  // namespace
}  // namespace loom::testing
