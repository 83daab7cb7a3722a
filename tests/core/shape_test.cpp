// shape: inline and heap storage, copies and moves across the two, element counts,
// broadcasting and contiguous strides, each checked against a std::vector model.
#include "loom/core/shape.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"

namespace {

using loom::shape;

std::vector<std::int64_t> dims_of(std::size_t rank, std::int64_t base) {
  std::vector<std::int64_t> v(rank);
  std::iota(v.begin(), v.end(), base);
  return v;
}

// Ranks on both sides of the inline limit.
const std::vector<std::size_t> ranks = {0, 1, 2, shape::inline_rank - 1, shape::inline_rank,
                                        shape::inline_rank + 1, 9, 16};

TEST(Shape, HoldsItsDimsInlineAndOnTheHeap) {
  for (std::size_t r : ranks) {
    const auto v = dims_of(r, 2);
    const shape s(v);
    EXPECT_EQ(s.rank(), r);
    EXPECT_EQ(s.to_vector(), v);
    std::int64_t n = 1;
    for (auto d : v) n *= d;
    EXPECT_EQ(s.num_elements(), n) << "rank " << r;
  }
}

TEST(Shape, CopiesAndMovesBetweenEveryPairOfRanksAreIndependentValues) {
  for (std::size_t from : ranks) {
    for (std::size_t to : ranks) {
      const auto a = dims_of(from, 3);
      const auto b = dims_of(to, 7);
      // Copy assignment over an existing value, then mutate the source: the copy keeps a.
      shape src(a);
      shape dst(b);
      dst = src;
      EXPECT_EQ(dst.to_vector(), a) << from << " -> " << to;
      if (from > 0) {
        src[0] = -5;
        EXPECT_EQ(dst[0], a[0]) << "copy shares storage, " << from << " -> " << to;
      }
      // Copy construction.
      const shape copy(dst);
      EXPECT_EQ(copy, dst);
      // Move assignment leaves the source empty (rank 0) and the target with the value.
      shape moved(b);
      shape source(a);
      moved = std::move(source);
      EXPECT_EQ(moved.to_vector(), a);
      EXPECT_EQ(source.rank(), 0u);  // NOLINT(bugprone-use-after-move): documented state
      // Move construction.
      shape again(std::move(moved));
      EXPECT_EQ(again.to_vector(), a);
      // Self-assignment keeps the value.
      shape& self = again;
      again = self;
      EXPECT_EQ(again.to_vector(), a);
    }
  }
}

TEST(Shape, PushBackAndResizeCrossTheInlineLimitBothWays) {
  shape s;
  std::vector<std::int64_t> model;
  for (std::int64_t d = 1; d <= 12; ++d) {
    s.push_back(d);
    model.push_back(d);
    ASSERT_EQ(s.to_vector(), model);
  }
  s.resize(3);
  model.resize(3);
  EXPECT_EQ(s.to_vector(), model);
  s.resize(8, 4);
  model.resize(8, 4);
  EXPECT_EQ(s.to_vector(), model);
  s.resize(0);
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(s.num_elements(), 1);  // a scalar
}

TEST(Shape, FilledEqualityAndUnknownDimensions) {
  for (std::size_t r : ranks) {
    const shape f = shape::filled(r, 3);
    EXPECT_EQ(f.to_vector(), std::vector<std::int64_t>(r, 3));
  }
  EXPECT_EQ(shape({2, 3}), shape({2, 3}));
  EXPECT_FALSE(shape({2, 3}) == shape({3, 2}));
  EXPECT_FALSE(shape({2, 3}) == shape({2, 3, 1}));
  EXPECT_FALSE(shape(dims_of(9, 1)) == shape(dims_of(8, 1)));
  const shape partial{2, shape::unknown};
  EXPECT_FALSE(partial.is_fully_defined());
  EXPECT_EQ(partial.num_elements(), 0);
  EXPECT_TRUE(shape({2, 0}).is_fully_defined());
  EXPECT_EQ(shape({2, 0}).num_elements(), 0);
  EXPECT_EQ(loom::to_string(partial), "[2, ?]");
  EXPECT_EQ(loom::to_string(shape{}), "[]");
}

TEST(Shape, ContiguousStridesAreRowMajor) {
  EXPECT_EQ(loom::contiguous_strides(shape{2, 3, 4}).to_vector(),
            (std::vector<std::int64_t>{12, 4, 1}));
  EXPECT_EQ(loom::contiguous_strides(shape{}).rank(), 0u);
  // Dimensions of 0 do not zero the outer strides.
  EXPECT_EQ(loom::contiguous_strides(shape{2, 0, 3}).to_vector(),
            (std::vector<std::int64_t>{3, 3, 1}));
  const shape big(dims_of(8, 1));
  const shape st = loom::contiguous_strides(big);
  std::int64_t acc = 1;
  for (std::size_t i = big.rank(); i-- > 0;) {
    EXPECT_EQ(st[i], acc);
    acc *= big[i];
  }
}

TEST(Shape, BroadcastingFollowsNumPy) {
  EXPECT_EQ(loom::broadcast_shapes({2, 1, 4}, {3, 1}), (shape{2, 3, 4}));
  EXPECT_EQ(loom::broadcast_shapes({}, {5}), (shape{5}));
  EXPECT_EQ(loom::broadcast_shapes({0, 1}, {1, 3}), (shape{0, 3}));
  EXPECT_THROW((void)loom::broadcast_shapes({2, 3}, {4}), loom::invalid_argument);
  try {
    (void)loom::broadcast_shapes({2, 3}, {4});
  } catch (const loom::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[4]"), std::string::npos) << e.what();
  }
}

TEST(Shape, NormalizeAxisWrapsAndRejects) {
  const shape s{2, 3, 4};
  EXPECT_EQ(s.normalize_axis(-1), 2u);
  EXPECT_EQ(s.normalize_axis(0), 0u);
  EXPECT_THROW((void)s.normalize_axis(3), loom::invalid_argument);
  EXPECT_THROW((void)s.normalize_axis(-4), loom::invalid_argument);
}

TEST(Shape, RandomOperationSequencesMatchAVectorModel) {
  std::mt19937 rng(7);
  shape s;
  std::vector<std::int64_t> model;
  for (int step = 0; step < 5000; ++step) {
    switch (rng() % 5) {
      case 0:
        if (model.size() < 20) {
          const auto d = static_cast<std::int64_t>(rng() % 9);
          s.push_back(d);
          model.push_back(d);
        }
        break;
      case 1: {
        const std::size_t r = rng() % 14;
        s.resize(r, 2);
        model.resize(r, 2);
        break;
      }
      case 2: {
        const shape copy = s;
        s = copy;
        break;
      }
      case 3: {
        shape tmp(std::move(s));
        s = std::move(tmp);
        break;
      }
      default: {
        const auto other = dims_of(rng() % 12, 1);
        shape o(other);
        o = s;  // assignment into a shape of another rank
        s = o;
        break;
      }
    }
    ASSERT_EQ(s.to_vector(), model) << "step " << step;
  }
}

}  // namespace
