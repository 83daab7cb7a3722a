// concat, split, slice: values against index-arithmetic references, every dtype, empty /
// rank 1..5 / non-contiguous inputs, views where split promises them, and errors at
// construction and at run time.
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

// ---- concat ----------------------------------------------------------------------------

void check_concat(const std::vector<tensor>& inputs, std::int64_t axis) {
  std::vector<std::pair<doubles, ints>> parts;
  for (const auto& t : inputs) parts.emplace_back(values(t), t.shape().to_vector());
  const auto rank = static_cast<std::int64_t>(inputs[0].rank());
  ints expected_shape;
  const doubles expected =
      concat(parts, static_cast<std::size_t>(axis < 0 ? axis + rank : axis), &expected_shape);
  SCOPED_TRACE(::testing::Message() << "concat of " << inputs.size() << " along " << axis
                                    << ", first " << inputs[0].describe());
  const tensor out = run_op1("concat", inputs, {{"axis", axis}});
  expect_exact(out, expected_shape, expected);
}

TEST(Concat, EveryAxisOfRanksOneToFive) {
  std::mt19937_64 rng(40);
  std::uniform_int_distribution<std::int64_t> dim(1, 4);
  for (std::size_t rank = 1; rank <= 5; ++rank) {
    for (std::size_t ax = 0; ax < rank; ++ax) {
      ints base(rank);
      for (auto& d : base) d = dim(rng);
      std::vector<tensor> inputs;
      for (int k = 0; k < 3; ++k) {
        ints s = base;
        s[ax] = dim(rng);
        inputs.push_back(random(dtype::f32, to_shape(s), rng()));
      }
      check_concat(inputs, static_cast<std::int64_t>(ax));
      check_concat(inputs, static_cast<std::int64_t>(ax) - static_cast<std::int64_t>(rank));
    }
  }
}

TEST(Concat, EveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    check_concat({random(t, {2, 3}, 41), random(t, {2, 5}, 42)}, 1);
    check_concat({random(t, {2, 3}, 43), random(t, {1, 3}, 44), random(t, {4, 3}, 45)}, 0);
    check_concat({random(t, {7}, 46), random(t, {2}, 47)}, 0);
  }
}

TEST(Concat, EmptyPiecesSingleInputAndNonContiguous) {
  check_concat({random(dtype::f32, {2, 0}, 48), random(dtype::f32, {2, 3}, 49),
                random(dtype::f32, {2, 0}, 50)},
               1);
  check_concat({random(dtype::i32, {0, 3}, 51), random(dtype::i32, {0, 3}, 52)}, 0);
  check_concat({random(dtype::i32, {0, 3}, 53), random(dtype::i32, {0, 2}, 54)}, 1);

  const tensor one = random(dtype::f64, {3, 4}, 55);
  const tensor same = run_op1("concat", {one}, {{"axis", 1}});
  expect_exact(same, {3, 4}, values(one));

  for (dtype t : {dtype::f32, dtype::f16, dtype::u8}) {
    SCOPED_TRACE(to_string(t));
    const tensor a = non_contiguous(random(t, {3, 4, 5}, 56));
    const tensor b = random(t, {3, 4, 2}, 57);
    const tensor c = non_contiguous(random(t, {3, 4, 3}, 58));
    check_concat({a, b, c}, 2);
    check_concat({a, non_contiguous(random(t, {3, 2, 5}, 59))}, 1);
    check_concat({a, random(t, {1, 4, 5}, 60)}, 0);
    check_concat({non_contiguous(random(t, {4, 5}, 61))}, 0);
  }
  check_concat({every_other(random(dtype::i64, {5}, 62)), random(dtype::i64, {3}, 63)}, 0);
  check_concat(
      {broadcast_view(random(dtype::f32, {1, 3}, 64), {4, 3}), random(dtype::f32, {4, 2}, 65)}, 1);
}

TEST(Concat, LargeEnoughToRunOnSeveralThreads) {
  check_concat({random(dtype::f32, {600, 300}, 66), random(dtype::f32, {600, 200}, 67)}, 1);
  check_concat({random(dtype::f32, {300, 600}, 68), random(dtype::f32, {500, 600}, 69)}, 0);
  check_concat({random(dtype::u8, {200, 3, 400}, 70), random(dtype::u8, {200, 5, 400}, 71)}, 1);
}

TEST(Concat, ConstructionErrorsNameTheInput) {
  const tensor a = random(dtype::f32, {2, 3}, 72);
  expect_invalid(
      [&] {
        run_op1("concat", {a, random(dtype::f32, {3, 4}, 73)}, {{"axis", 1}});
      },
      "input 1 has shape [3, 4] but input 0 has [2, 3]");
  expect_invalid(
      [&] {
        run_op1("concat", {a, a, random(dtype::f32, {2, 3, 1}, 74)});
      },
      "input 2 has shape [2, 3, 1]");
  expect_invalid([&] { run_op1("concat", {a, random(dtype::i32, {2, 3}, 75)}); }, "int32");
  expect_invalid([&] { run_op1("concat", {a, a}, {{"axis", 2}}); }, "out of range");
  const tensor s = make(dtype::f32, {}, {1});
  expect_invalid([&] { run_op1("concat", {s, s}); }, "scalars");
  expect_invalid([&] { run_op1("concat", {}, {{"T", dtype::f32}}); }, "must be >= 1");
}

TEST(Concat, RunTimeMismatchIsANodeError) {
  const tensor a = random(dtype::f32, {2, 3}, 76);
  const tensor b = random(dtype::f32, {3, 3}, 77);
  expect_node_error(
      [&] {
        run_declared("concat", {a, b}, {shape{-1, -1}, shape{-1, -1}}, {{"axis", 1}});
      },
      "input 1 is float32[3, 3]");
  const auto ok = run_declared("concat", {a, b}, {shape{-1, -1}, shape{-1, 3}});
  std::vector<std::pair<doubles, ints>> parts{{values(a), {2, 3}}, {values(b), {3, 3}}};
  expect_exact(ok.at(0), {5, 3}, concat(parts, 0, nullptr));
}

// ---- split -----------------------------------------------------------------------------

void check_split(const tensor& x, std::int64_t axis, const ints& sizes, attr_map attrs) {
  const ints s = x.shape().to_vector();
  const auto ax =
      static_cast<std::size_t>(axis < 0 ? axis + static_cast<std::int64_t>(s.size()) : axis);
  attrs["axis"] = axis;
  const auto outs = run_op("split", {x}, attrs);
  ASSERT_EQ(outs.size(), sizes.size());
  ints begin(s.size(), 0);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    ints size = s;
    size[ax] = sizes[k];
    SCOPED_TRACE(::testing::Message() << "piece " << k << " of " << x.describe());
    expect_exact(outs[k], size, slice(values(x), s, begin, size));
    begin[ax] += sizes[k];
  }
}

TEST(Split, EqualPiecesAlongEveryAxisForEveryDtype) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    const tensor x = random(t, {4, 6, 2}, 80);
    check_split(x, 0, {2, 2}, {{"num_splits", 2}});
    check_split(x, 1, {2, 2, 2}, {{"num_splits", 3}});
    check_split(x, -1, {1, 1}, {{"num_splits", 2}});
    check_split(x, 1, {6}, {{"num_splits", 1}});
  }
}

TEST(Split, SizesWithTheRestAndEmptyPieces) {
  const tensor x = random(dtype::f32, {3, 10}, 81);
  check_split(x, 1, {2, 0, 5, 3}, {{"num_splits", 4}, {"sizes", ints{2, 0, 5, 3}}});
  check_split(x, 1, {4, 6}, {{"num_splits", 2}, {"sizes", ints{4, -1}}});
  check_split(x, 0, {0, 3}, {{"num_splits", 2}, {"sizes", ints{-1, 3}}});
  const tensor e = random(dtype::i32, {0, 4}, 82);
  check_split(e, 1, {2, 2}, {{"num_splits", 2}});
  check_split(e, 0, {0, 0, 0}, {{"num_splits", 3}});
  const tensor r5 = random(dtype::i64, {2, 3, 2, 4, 3}, 83);
  check_split(r5, 3, {1, 3}, {{"num_splits", 2}, {"sizes", ints{1, 3}}});
  check_split(r5, -5, {1, 1}, {{"num_splits", 2}});
}

TEST(Split, PiecesOfDenseBlocksAreViewsOthersAreCopies) {
  const tensor x = random(dtype::f32, {6, 4}, 84);
  const auto rows = run_op("split", {x}, {{"num_splits", 3}, {"axis", 0}});
  for (std::size_t k = 0; k < rows.size(); ++k) {
    EXPECT_TRUE(rows[k].buf() == x.buf()) << "piece " << k;
    EXPECT_TRUE(rows[k].is_contiguous());
    EXPECT_EQ(rows[k].raw_data(), static_cast<float*>(x.raw_data()) + 8 * k);
  }
  const auto cols = run_op("split", {x}, {{"num_splits", 2}, {"axis", 1}});
  for (const auto& c : cols) {
    EXPECT_FALSE(c.buf() == x.buf());
    EXPECT_TRUE(c.is_contiguous());
  }
  // Leading dims of 1 do not break the block: still views.
  const tensor y = random(dtype::f32, {1, 6, 4}, 85);
  for (const auto& p : run_op("split", {y}, {{"num_splits", 2}, {"axis", 1}})) {
    EXPECT_TRUE(p.buf() == y.buf());
  }
}

TEST(Split, NonContiguousInputs) {
  for (dtype t : {dtype::f64, dtype::bf16, dtype::boolean}) {
    SCOPED_TRACE(to_string(t));
    const tensor x = non_contiguous(random(t, {4, 6, 8}, 86));
    check_split(x, 0, {2, 2}, {{"num_splits", 2}});
    check_split(x, 1, {3, 3}, {{"num_splits", 2}});
    check_split(x, 2, {1, 7}, {{"num_splits", 2}, {"sizes", ints{1, -1}}});
  }
  check_split(every_other(random(dtype::i8, {9}, 87)), 0, {3, 3, 3}, {{"num_splits", 3}});
}

TEST(Split, Errors) {
  const tensor x = random(dtype::f32, {4, 6}, 88);
  expect_invalid(
      [&] {
        run_op("split", {x}, {{"num_splits", 4}, {"axis", 1}});
      },
      "does not split into 4 equal pieces");
  expect_invalid(
      [&] {
        run_op("split", {x}, {{"num_splits", 2}, {"sizes", ints{2, 3}}, {"axis", 1}});
      },
      "do not add up");
  expect_invalid(
      [&] {
        run_op("split", {x}, {{"num_splits", 2}, {"sizes", ints{7, -1}}, {"axis", 1}});
      },
      "do not add up");
  expect_invalid(
      [&] {
        run_op("split", {x}, {{"num_splits", 3}, {"sizes", ints{2, 4}}});
      },
      "num_splits is 3");
  expect_invalid(
      [&] {
        run_op("split", {x}, {{"num_splits", 2}, {"sizes", ints{-1, -1}}});
      },
      "at most one");
  expect_invalid([&] { run_op("split", {x}, {{"num_splits", 0}}); }, "num_splits");
  expect_invalid([&] { run_op("split", {x}, {{"num_splits", 2}, {"axis", 2}}); }, "out of range");
  expect_invalid([&] { run_op("split", {x}); }, "num_splits");
  expect_invalid(
      [&] {
        run_op("split", {make(dtype::f32, {}, {1})}, {{"num_splits", 1}});
      },
      "scalar");
  expect_node_error(
      [&] {
        run_declared("split", {x}, {shape{-1, -1}}, {{"num_splits", 4}, {"axis", 1}});
      },
      "does not split into 4 equal pieces");
  expect_node_error(
      [&] {
        run_declared("split", {x}, {shape{-1, -1}},
                     {{"num_splits", 2}, {"sizes", ints{1, 2}}, {"axis", 1}});
      },
      "do not add up");
}

// ---- slice -----------------------------------------------------------------------------

void check_slice(const tensor& x, const ints& begin, const ints& size) {
  const ints s = x.shape().to_vector();
  ints resolved = size;
  for (std::size_t d = 0; d < s.size(); ++d) {
    if (resolved[d] < 0) resolved[d] = s[d] - begin[d];
  }
  SCOPED_TRACE(::testing::Message() << x.describe() << " begin " << to_string(shape(begin))
                                    << " size " << to_string(shape(size)));
  const tensor out = run_op1("slice", {x}, {{"begin", begin}, {"size", size}});
  expect_exact(out, resolved, slice(values(x), s, begin, resolved));
  EXPECT_TRUE(out.is_contiguous());
  if (out.num_elements() > 0) {
    EXPECT_FALSE(out.buf() == x.buf()) << "slice copies";
  }
}

TEST(Slice, RandomBlocksOfRanksOneToFive) {
  std::mt19937_64 rng(90);
  for (std::size_t rank = 1; rank <= 5; ++rank) {
    for (int trial = 0; trial < 12; ++trial) {
      ints s(rank);
      for (auto& d : s) d = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
      ints begin(rank);
      ints size(rank);
      for (std::size_t d = 0; d < rank; ++d) {
        begin[d] = std::uniform_int_distribution<std::int64_t>(0, s[d])(rng);
        size[d] = std::uniform_int_distribution<std::int64_t>(-1, s[d] - begin[d])(rng);
      }
      check_slice(random(dtype::f32, to_shape(s), rng()), begin, size);
    }
  }
}

TEST(Slice, EveryDtypeScalarsEmptyAndNonContiguous) {
  for (dtype t : all_dtypes()) {
    SCOPED_TRACE(to_string(t));
    check_slice(random(t, {5, 7}, 91), {1, 2}, {3, -1});
    check_slice(non_contiguous(random(t, {4, 5, 6}, 92)), {1, 0, 2}, {2, -1, 3});
  }
  const tensor s = make(dtype::f32, {}, {9});
  const tensor out = run_op1("slice", {s}, {{"begin", ints{}}, {"size", ints{}}});
  expect_exact(out, {}, {9});
  check_slice(random(dtype::f32, {4, 3}, 93), {4, 0}, {0, 3});
  check_slice(random(dtype::f32, {4, 3}, 94), {2, 1}, {-1, 0});
  check_slice(random(dtype::f32, {0, 3}, 95), {0, 1}, {-1, 2});
  check_slice(every_other(random(dtype::u8, {12}, 96)), {3}, {5});
  check_slice(broadcast_view(random(dtype::i32, {1, 6}, 97), {5, 6}), {1, 2}, {3, 3});
  check_slice(random(dtype::f32, {500, 400}, 98), {3, 7}, {490, 390});
}

TEST(Slice, Errors) {
  const tensor x = random(dtype::f32, {4, 5}, 99);
  expect_invalid(
      [&] {
        run_op1("slice", {x}, {{"begin", ints{1, 2}}, {"size", ints{4, 1}}});
      },
      "reaches outside");
  expect_invalid(
      [&] {
        run_op1("slice", {x}, {{"begin", ints{0, 6}}, {"size", ints{0, -1}}});
      },
      "dimension 1");
  expect_invalid([&] { run_op1("slice", {x}, {{"begin", ints{0}}, {"size", ints{1}}}); }, "rank-2");
  expect_invalid(
      [&] {
        run_op1("slice", {x}, {{"begin", ints{0, 0}}, {"size", ints{1}}});
      },
      "differ in length");
  expect_invalid(
      [&] {
        run_op1("slice", {x}, {{"begin", ints{-1, 0}}, {"size", ints{1, 1}}});
      },
      "below 0");
  expect_invalid(
      [&] {
        run_op1("slice", {x}, {{"begin", ints{0, 0}}, {"size", ints{1, -2}}});
      },
      "below -1");
  expect_node_error(
      [&] {
        run_declared("slice", {x}, {shape{-1, -1}}, {{"begin", ints{3, 0}}, {"size", ints{2, 1}}});
      },
      "reaches outside");
}

// ---- builders --------------------------------------------------------------------------

TEST(ArrayJoinBuilders, InferOutputTypes) {
  graph g;
  graph_builder b(g);
  auto x = ops::placeholder(b, "x", dtype::f32, {-1, 6});
  auto y = ops::placeholder(b, "y", dtype::f32, {2, -1});
  auto c = ops::concat({x, y}, 0, {.name = "c"});
  EXPECT_EQ(to_string(c.type()), "float32[?, 6]");
  EXPECT_EQ(g.get("c").attr<std::int64_t>("N"), 2);
  auto z = ops::placeholder(b, "z", dtype::f32, {3, 6});
  EXPECT_EQ(to_string(ops::concat({z, y, z}, 0).type()), "float32[8, 6]");
  EXPECT_EQ(to_string(ops::concat({z, z}, -1).type()), "float32[3, 12]");

  auto parts = ops::split(z, 3, 1);
  ASSERT_EQ(parts.size(), 3u);
  for (const auto& p : parts) EXPECT_EQ(to_string(p.type()), "float32[3, 2]");
  EXPECT_EQ(parts[2].name(), parts[0].producer().name + ":2");
  auto uneven = ops::split_sizes(z, {1, -1, 2}, 1);
  ASSERT_EQ(uneven.size(), 3u);
  EXPECT_EQ(to_string(uneven[1].type()), "float32[3, 3]");
  auto open = ops::split(x, 2, 0);
  EXPECT_EQ(to_string(open[0].type()), "float32[?, 6]");

  auto s = ops::slice(z, {1, 2}, {-1, 3});
  EXPECT_EQ(to_string(s.type()), "float32[2, 3]");
  EXPECT_EQ(to_string(ops::slice(x, {1, 2}, {-1, 3}).type()), "float32[?, 3]");

  EXPECT_THROW(ops::concat({}), invalid_argument);
  EXPECT_THROW(ops::split(z, 4, 1), invalid_argument);
  EXPECT_THROW(ops::slice(z, {0, 0}, {4, 1}), invalid_argument);
}

}  // namespace
}  // namespace loom::testing
