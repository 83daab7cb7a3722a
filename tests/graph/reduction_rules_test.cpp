// The reduction family's rules (loom/graph/ops/reduction_rules.hpp) on their own: axis
// normalisation, reduce_* output shapes and extents (keepdims, negative and repeated axes,
// empty axes meaning all, zero-size dims), argmax and softmax_cross_entropy shapes, and the
// exact messages of every check, as inference and the kernels word them.
#include "loom/graph/ops/reduction_rules.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "rules_test_support.hpp"

namespace loom {
namespace {

using ints = std::vector<std::int64_t>;
using flags = std::vector<char>;
using rules_test::message_of;
namespace rules = reduction_rules;
constexpr auto inference = rules::rule_caller::inference;
constexpr std::int64_t u = shape::unknown;

TEST(ReductionRules, NormalizeAxisWrapsNegativeAxes) {
  const shape s({2, 3, 4});
  EXPECT_EQ(rules::normalize_axis(0, s), 0u);
  EXPECT_EQ(rules::normalize_axis(2, s), 2u);
  EXPECT_EQ(rules::normalize_axis(-1, s), 2u);
  EXPECT_EQ(rules::normalize_axis(-3, s), 0u);
  EXPECT_EQ(rules::normalize_axis(-3, s, inference), 0u);
}

TEST(ReductionRules, NormalizeAxisRejectsAxesOutOfRangeOnBothSides) {
  const shape s({2, 3, 4});
  EXPECT_EQ(message_of([&] { return rules::normalize_axis(3, s); }),
            "axis 3 is out of range for input of shape [2, 3, 4]");
  EXPECT_EQ(message_of([&] { return rules::normalize_axis(-4, s); }),
            "axis -4 is out of range for input of shape [2, 3, 4]");
  EXPECT_EQ(message_of([&] { return rules::normalize_axis(3, s, inference); }),
            "axis 3 is out of range for input of shape [2, 3, 4] (rank 3)");
  EXPECT_EQ(message_of([&] { return rules::normalize_axis(-4, s, inference); }),
            "axis -4 is out of range for input of shape [2, 3, 4] (rank 3)");
  // A scalar has no axis at all.
  EXPECT_EQ(message_of([] { return rules::normalize_axis(0, shape{}); }),
            "axis 0 is out of range for input of shape []");
  EXPECT_EQ(message_of([] { return rules::normalize_axis(-1, shape{}, inference); }),
            "axis -1 is out of range for input of shape [] (rank 0)");
}

TEST(ReductionRules, SplitAtCountsOuterAlongAndInner) {
  const shape s({2, 3, 4});
  const auto first = rules::split_at(s, 0);
  EXPECT_EQ(first.outer, 1);
  EXPECT_EQ(first.n, 2);
  EXPECT_EQ(first.inner, 12);
  const auto middle = rules::split_at(s, 1);
  EXPECT_EQ(middle.outer, 2);
  EXPECT_EQ(middle.n, 3);
  EXPECT_EQ(middle.inner, 4);
  const auto last = rules::split_at(s, 2);
  EXPECT_EQ(last.outer, 6);
  EXPECT_EQ(last.n, 4);
  EXPECT_EQ(last.inner, 1);
  const auto empty = rules::split_at(shape({2, 0, 5}), 2);
  EXPECT_EQ(empty.outer, 0);
  EXPECT_EQ(empty.n, 5);
  EXPECT_EQ(empty.inner, 1);
}

TEST(ReductionRules, OpNames) {
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::sum), "reduce_sum");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::mean), "reduce_mean");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::max), "reduce_max");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::min), "reduce_min");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::prod), "reduce_prod");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::l1), "reduce_l1");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::l2), "reduce_l2");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::sum_square), "reduce_sum_square");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::log_sum), "reduce_log_sum");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::log_sum_exp), "reduce_log_sum_exp");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::any), "reduce_any");
  EXPECT_STREQ(rules::op_name(rules::reduce_kind::all), "reduce_all");
}

TEST(ReductionRules, ReduceOneAxisWithAndWithoutKeepdims) {
  // numpy.sum(x, axis=1, keepdims=...) for x of shape (2, 3, 4).
  const auto g = rules::reduce_geometry_of(shape({2, 3, 4}), {1}, false);
  EXPECT_EQ(g.reduced, flags({0, 1, 0}));
  EXPECT_EQ(g.output, shape({2, 4}));
  EXPECT_EQ(g.num_red, 3);
  EXPECT_EQ(g.num_out, 8);
  const auto k = rules::reduce_geometry_of(shape({2, 3, 4}), {1}, true);
  EXPECT_EQ(k.output, shape({2, 1, 4}));
  EXPECT_EQ(k.num_red, 3);
  EXPECT_EQ(k.num_out, 8);
}

TEST(ReductionRules, ReduceNegativeAxesInAnyOrder) {
  // numpy.sum(x, axis=(-1, 0)) for x of shape (2, 3, 4): shape (3,), or (1, 3, 1) kept.
  const auto g = rules::reduce_geometry_of(shape({2, 3, 4}), {-1, 0}, false);
  EXPECT_EQ(g.reduced, flags({1, 0, 1}));
  EXPECT_EQ(g.output, shape({3}));
  EXPECT_EQ(g.num_red, 8);
  EXPECT_EQ(g.num_out, 3);
  EXPECT_EQ(rules::reduce_geometry_of(shape({2, 3, 4}), {-1, 0}, true).output, shape({1, 3, 1}));
  // -rank and rank - 1 are the first and last axes.
  EXPECT_EQ(rules::reduce_geometry_of(shape({2, 3, 4}), {-3, 2}, false).output, shape({3}));
}

TEST(ReductionRules, EmptyAxesReduceEverything) {
  const auto g = rules::reduce_geometry_of(shape({2, 3, 4}), {}, false);
  EXPECT_EQ(g.reduced, flags({1, 1, 1}));
  EXPECT_EQ(g.output, shape{});
  EXPECT_EQ(g.num_red, 24);
  EXPECT_EQ(g.num_out, 1);
  EXPECT_EQ(rules::reduce_geometry_of(shape({2, 3, 4}), {}, true).output, shape({1, 1, 1}));
  // Naming every axis is the same reduction.
  EXPECT_EQ(rules::reduce_geometry_of(shape({2, 3, 4}), {0, 1, 2}, false).output, shape{});
}

TEST(ReductionRules, ReduceAScalar) {
  const auto g = rules::reduce_geometry_of(shape{}, {}, false);
  EXPECT_TRUE(g.reduced.empty());
  EXPECT_EQ(g.output, shape{});
  EXPECT_EQ(g.num_red, 1);
  EXPECT_EQ(g.num_out, 1);
  EXPECT_EQ(rules::reduce_geometry_of(shape{}, {}, true).output, shape{});
  EXPECT_EQ(message_of([] { return rules::reduce_geometry_of(shape{}, {0}, false); }),
            "axis 0 is out of range for input of shape []");
}

TEST(ReductionRules, ReduceZeroSizeDims) {
  // Reducing the empty axis: 3 outputs of nothing each; keeping it: no outputs.
  const auto over_empty = rules::reduce_geometry_of(shape({0, 3}), {0}, false);
  EXPECT_EQ(over_empty.output, shape({3}));
  EXPECT_EQ(over_empty.num_red, 0);
  EXPECT_EQ(over_empty.num_out, 3);
  const auto keep_empty = rules::reduce_geometry_of(shape({0, 3}), {1}, true);
  EXPECT_EQ(keep_empty.output, shape({0, 1}));
  EXPECT_EQ(keep_empty.num_red, 3);
  EXPECT_EQ(keep_empty.num_out, 0);
}

TEST(ReductionRules, ReduceKeepsUnknownDimsAtInference) {
  EXPECT_EQ(rules::reduce_geometry_of(shape({u, 3}), {1}, false, inference).output, shape({u}));
  EXPECT_EQ(rules::reduce_geometry_of(shape({u, 3}), {-1}, true, inference).output, shape({u, 1}));
}

TEST(ReductionRules, ReduceRejectsOutOfRangeAndRepeatedAxes) {
  const shape s({2, 3, 4});
  EXPECT_EQ(message_of([&] {
              return rules::reduce_geometry_of(s, {0, 3}, false);
            }),
            "axis 3 is out of range for input of shape [2, 3, 4]");
  EXPECT_EQ(message_of([&] { return rules::reduce_geometry_of(s, {-4}, true, inference); }),
            "axis -4 is out of range for input of shape [2, 3, 4] (rank 3)");
  // 1 and -2 are the same axis of a rank-3 input.
  EXPECT_EQ(message_of([&] {
              return rules::reduce_geometry_of(s, {1, -2}, false);
            }),
            "axes name axis 1 twice (input of shape [2, 3, 4])");
  EXPECT_EQ(message_of([&] {
              return rules::reduce_geometry_of(s, {1, -2}, false, inference);
            }),
            "axes 1, -2 name axis 1 twice (input of shape [2, 3, 4])");
  EXPECT_EQ(message_of([&] {
              return rules::reduce_geometry_of(s, {2, 2}, true);
            }),
            "axes name axis 2 twice (input of shape [2, 3, 4])");
}

TEST(ReductionRules, MaxAndMinOfNothingHaveNoIdentity) {
  const shape s({0, 3});
  const auto over_empty = rules::reduce_geometry_of(s, {0}, false);
  EXPECT_EQ(message_of([&] { rules::check_identity(rules::reduce_kind::max, over_empty, s); }),
            "reduce_max of an empty axis (axis 0 of input shape [0, 3]) has no identity");
  // All axes of [2, 0]: the empty one is named.
  const shape t({2, 0});
  const auto all = rules::reduce_geometry_of(t, {}, true);
  EXPECT_EQ(message_of([&] { rules::check_identity(rules::reduce_kind::min, all, t); }),
            "reduce_min of an empty axis (axis 1 of input shape [2, 0]) has no identity");
  // Sums, means and products of nothing are defined; a max along a non-empty axis of an
  // empty input (numpy.max(numpy.zeros((0, 3)), axis=1)) is too.
  for (auto k : {rules::reduce_kind::sum, rules::reduce_kind::mean, rules::reduce_kind::prod}) {
    EXPECT_NO_THROW(rules::check_identity(k, over_empty, s)) << rules::op_name(k);
  }
  EXPECT_NO_THROW(
      rules::check_identity(rules::reduce_kind::max, rules::reduce_geometry_of(s, {1}, false), s));
}

TEST(ReductionRules, AlongAxisAndArgmax) {
  const auto a = rules::along_axis_of(shape({2, 3, 4}), -1);
  EXPECT_EQ(a.axis, 2u);
  EXPECT_EQ(a.split.outer, 6);
  EXPECT_EQ(a.split.n, 4);
  EXPECT_EQ(a.split.inner, 1);
  EXPECT_EQ(rules::along_axis_of(shape({2, 3, 4}), -3).axis, 0u);
  EXPECT_EQ(message_of([] {
              return rules::along_axis_of(shape({2, 3}), 2);
            }),
            "axis 2 is out of range for input of shape [2, 3]");
  EXPECT_EQ(message_of([] {
              return rules::along_axis_of(shape({2, 3}), -3);
            }),
            "axis -3 is out of range for input of shape [2, 3]");

  // numpy.argmax(x, axis=1) drops the axis; a vector's argmax is a scalar.
  EXPECT_EQ(rules::argmax_output(shape({2, 3, 4}), 1), shape({2, 4}));
  EXPECT_EQ(rules::argmax_output(shape({5}), 0), shape{});

  const shape empty({2, 0});
  EXPECT_EQ(message_of([&] { rules::check_argmax_axis(rules::along_axis_of(empty, 1), empty); }),
            "argmax of an empty axis (axis 1 of input shape [2, 0])");
  const shape no_rows({0, 3});
  EXPECT_NO_THROW(rules::check_argmax_axis(rules::along_axis_of(no_rows, 1), no_rows));
}

TEST(ReductionRules, CrossEntropyOutputsAtInference) {
  using opt = std::optional<shape>;
  const auto [loss, backprop] = rules::xent_outputs(opt(shape({4, 10})), opt(shape({4})));
  EXPECT_EQ(loss, shape({4}));
  EXPECT_EQ(backprop, shape({4, 10}));

  const auto unknown = rules::xent_outputs(std::nullopt, std::nullopt);
  EXPECT_EQ(unknown.first, shape({u}));
  EXPECT_EQ(unknown.second, shape({u, u}));
  // N comes from whichever input knows it.
  const auto from_labels = rules::xent_outputs(std::nullopt, opt(shape({4})));
  EXPECT_EQ(from_labels.first, shape({4}));
  EXPECT_EQ(from_labels.second, shape({4, u}));
  EXPECT_EQ(rules::xent_outputs(opt(shape({u, 10})), opt(shape({4}))).second, shape({4, 10}));
  EXPECT_EQ(rules::xent_outputs(opt(shape({4, 10})), opt(shape({u}))).first, shape({4}));

  EXPECT_EQ(message_of([] { return rules::xent_outputs(opt(shape({4})), std::nullopt); }),
            "logits must be [N, C], got shape [4]");
  // The logits are checked first.
  EXPECT_EQ(message_of([] {
              return rules::xent_outputs(opt(shape({4})), opt(shape({4, 1})));
            }),
            "logits must be [N, C], got shape [4]");
  EXPECT_EQ(message_of([] { return rules::xent_outputs(std::nullopt, opt(shape{})); }),
            "labels must be [N], got shape []");
  EXPECT_EQ(message_of([] {
              return rules::xent_outputs(opt(shape({4, 10})), opt(shape({3})));
            }),
            "labels of shape [3] do not match logits of shape [4, 10] (N differs)");
}

TEST(ReductionRules, CrossEntropyShapesInKernels) {
  EXPECT_NO_THROW(rules::check_xent_shapes(shape({2, 3}), shape({2})));
  EXPECT_NO_THROW(rules::check_xent_shapes(shape({0, 3}), shape({0})));
  EXPECT_EQ(message_of([] {
              rules::check_xent_shapes(shape({2, 3}), shape({3}));
            }),
            "logits [2, 3] must be [N, C] and labels [3] must be [N]");
  EXPECT_EQ(message_of([] {
              rules::check_xent_shapes(shape({2, 3, 1}), shape({2}));
            }),
            "logits [2, 3, 1] must be [N, C] and labels [2] must be [N]");
  EXPECT_EQ(message_of([] {
              rules::check_xent_shapes(shape({2, 3}), shape({2, 1}));
            }),
            "logits [2, 3] must be [N, C] and labels [2, 1] must be [N]");
}

}  // namespace
}  // namespace loom
