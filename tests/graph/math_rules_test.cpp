// The element-wise ops' rules (loom/graph/ops/math_rules.hpp) on their own: broadcast output
// shapes as numpy.broadcast_shapes gives them (0 and 1 dims, rank differences, unknown dims
// at inference), the generators' defined-shape check and range's length as numpy.arange's,
// with the exact message of each failure.
#include "loom/graph/ops/math_rules.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>

#include "loom/core/error.hpp"
#include "rules_test_support.hpp"

namespace loom {
namespace {

using rules_test::message_of;
namespace rules = math_rules;
constexpr std::int64_t u = shape::unknown;

shape broadcast(const shape& a, const shape& b) {
  return rules::broadcast_shape({&a, &b});
}

TEST(MathRules, BroadcastLikeNumpy) {
  EXPECT_EQ(rules::broadcast_shape({}), shape{});
  const shape scalar;
  EXPECT_EQ(rules::broadcast_shape({&scalar}), shape{});
  EXPECT_EQ(broadcast(shape{}, shape({2, 3})), shape({2, 3}));
  EXPECT_EQ(broadcast(shape({2, 3}), shape({3})), shape({2, 3}));
  EXPECT_EQ(broadcast(shape({4, 1, 3}), shape({2, 1})), shape({4, 2, 3}));
  EXPECT_EQ(broadcast(shape({1}), shape({5, 1, 7})), shape({5, 1, 7}));
  // 0 broadcasts against 1 and itself only.
  EXPECT_EQ(broadcast(shape({0}), shape({1})), shape({0}));
  EXPECT_EQ(broadcast(shape({2, 0}), shape({1, 1, 1})), shape({1, 2, 0}));
  EXPECT_EQ(broadcast(shape({5, 1}), shape({1, 0})), shape({5, 0}));
  EXPECT_EQ(broadcast(shape({0}), shape({0})), shape({0}));

  const shape a({2, 1}), b({1, 3}), c({4, 1, 1});
  EXPECT_EQ(rules::broadcast_shape({&a, &b, &c}), shape({4, 2, 3}));
}

TEST(MathRules, BroadcastFailureNamesTheShapes) {
  EXPECT_EQ(message_of([] {
              return broadcast(shape({2, 3}), shape({4}));
            }),
            "shapes [2, 3] and [4] do not broadcast (dimension 1: 3 vs 4)");
  EXPECT_EQ(message_of([] { return broadcast(shape({0}), shape({2})); }),
            "shapes [0] and [2] do not broadcast (dimension 0: 0 vs 2)");
  // The dimension is counted in the output's rank.
  EXPECT_EQ(message_of([] {
              return broadcast(shape({3}), shape({2, 4}));
            }),
            "shapes [3] and [2, 4] do not broadcast (dimension 1: 3 vs 4)");
  // Folded left to right: the first shape named is what the earlier inputs broadcast to.
  const shape a({2, 1}), b({1, 3}), c({2});
  EXPECT_EQ(message_of([&] {
              return rules::broadcast_shape({&a, &b, &c});
            }),
            "shapes [2, 3] and [2] do not broadcast (dimension 1: 3 vs 2)");
}

TEST(MathRules, BroadcastUnknownDims) {
  // An unknown dim against a known one other than 1 takes it; against 1 it stays unknown.
  EXPECT_EQ(broadcast(shape({u, 3}), shape({2, 1})), shape({2, 3}));
  EXPECT_EQ(broadcast(shape({u}), shape({1})), shape({u}));
  EXPECT_EQ(broadcast(shape({u}), shape({u})), shape({u}));
  EXPECT_EQ(broadcast(shape({3}), shape({u, u})), shape({u, 3}));
}

TEST(MathRules, BroadcastOfShapesThatMayBeUnknown) {
  using opt = std::optional<shape>;
  const auto of = [](std::initializer_list<const opt*> in) {
    return rules::broadcast_shape(std::span<const opt* const>(in.begin(), in.size()));
  };
  const opt a(shape({2, 1})), b(shape({3})), none, c(shape({2}));
  EXPECT_EQ(of({&a, &b}), opt(shape({2, 3})));
  EXPECT_EQ(of({}), opt(shape{}));
  EXPECT_EQ(of({&a, &none}), std::nullopt);
  // Known shapes before the first unknown one must broadcast; after it, nothing is checked.
  EXPECT_EQ(message_of([&] {
              return of({&b, &c, &none});
            }),
            "shapes [3] and [2] do not broadcast (dimension 0: 3 vs 2)");
  EXPECT_EQ(of({&none, &b, &c}), std::nullopt);
}

TEST(MathRules, GeneratorShapesMustBeDefined) {
  EXPECT_NO_THROW(rules::check_defined_shape(shape{}));
  EXPECT_NO_THROW(rules::check_defined_shape(shape({0, 3})));
  EXPECT_EQ(message_of([] {
              rules::check_defined_shape(shape({2, u}));
            }),
            "shape [2, ?] must be fully defined");
}

TEST(MathRules, RangeLengthLikeNumpyArange) {
  EXPECT_EQ(rules::range_length(0, 5, 1), 5);     // arange(0, 5, 1)
  EXPECT_EQ(rules::range_length(0, 5, 2), 3);     // [0, 2, 4]
  EXPECT_EQ(rules::range_length(5, 0, -1), 5);    // [5, 4, 3, 2, 1]
  EXPECT_EQ(rules::range_length(0, 1, 0.3), 4);   // [0, 0.3, 0.6, 0.9]
  EXPECT_EQ(rules::range_length(-3, 3, 1.5), 4);  // [-3, -1.5, 0, 1.5]
  EXPECT_EQ(rules::range_length(0, 0.5, 1), 1);   // [0]
  EXPECT_EQ(rules::range_length(1, 1, 1), 0);     // empty
  EXPECT_EQ(rules::range_length(5, 0, 1), 0);     // empty, not negative
  EXPECT_EQ(rules::range_length(0, 5, -1), 0);    // empty
  EXPECT_EQ(rules::range_length(0, 281474976710656.0, 1), std::int64_t{1} << 48);
}

TEST(MathRules, RangeLengthFailures) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(message_of([] { return rules::range_length(0, 5, 0); }), "range: delta must not be 0");
  EXPECT_EQ(message_of([&] { return rules::range_length(0, inf, 1); }),
            "range(0, inf, 1) has no finite length");
  EXPECT_EQ(message_of([] { return rules::range_length(0, std::nan(""), 1); }),
            "range(0, nan, 1) has no finite length");
  EXPECT_EQ(message_of([] { return rules::range_length(0, 1e15, 1); }),
            "range(0, 1000000000000000, 1) has 1000000000000000 elements, too many to allocate");
}

}  // namespace
}  // namespace loom
