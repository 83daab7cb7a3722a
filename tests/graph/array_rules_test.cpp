// The array ops' rules (loom/graph/ops/array_rules.hpp) on their own: the shapes, geometry
// and messages that inference and every backend's kernels share.
#include "loom/graph/ops/array_rules.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "rules_test_support.hpp"

namespace loom {
namespace {

using ints = std::vector<std::int64_t>;
namespace rules = array_rules;
using rules_test::message_of;

const rules::text_fn x = [] { return std::string("X"); };

TEST(ArrayRules, WrapAxisAndExpandDimsPosition) {
  EXPECT_EQ(rules::wrap_axis(-1, 3, x), 2u);
  EXPECT_EQ(message_of([] { return rules::wrap_axis(3, 3, x); }),
            "axis 3 is outside [-3, 3) for X");
  EXPECT_EQ(rules::expand_dims_position(-1, 2, x), 2u);
  EXPECT_EQ(message_of([] { return rules::expand_dims_position(4, 2, x); }),
            "axis 4 is outside [-3, 2] for X");
}

TEST(ArrayRules, ReshapeResolvesItsUnknownDimension) {
  EXPECT_EQ(rules::reshape_shape({2, -1}, 6, x), shape({2, 3}));
  EXPECT_EQ(message_of([] {
              return rules::reshape_shape({4, -1}, 6, x);
            }),
            "cannot reshape X (6 elements) to [4, -1]");
  EXPECT_EQ(message_of([] {
              return rules::reshape_shape({0, -1}, 0, x);
            }),
            "cannot reshape X (0 elements) to [0, -1]");
}

TEST(ArrayRules, SqueezeAndTranspose) {
  EXPECT_EQ(rules::squeezed_dims(shape({1, 3, 1}), {}, x), std::vector<bool>({true, false, true}));
  EXPECT_EQ(message_of([] {
              return rules::squeezed_dims(shape({1, 3}), {1}, x);
            }),
            "cannot squeeze dimension 1 of X: its size is 3, not 1");
  EXPECT_EQ(rules::transpose_perm({}, 3, x), ints({2, 1, 0}));
  EXPECT_EQ(message_of([] {
              return rules::transpose_perm({1, 0}, 3, x);
            }),
            "perm [1, 0] has 2 entries for the rank-3 input X");
}

TEST(ArrayRules, ConcatSplitSlicePad) {
  const rules::texts_fn in = [](std::size_t i) { return "in" + std::to_string(i); };
  const auto c = rules::concat_shape({shape({2, 3}), shape({2, 1})}, -1, in);
  EXPECT_EQ(c.out, shape({2, 4}));
  EXPECT_EQ(c.axis, 1u);
  EXPECT_EQ(message_of([&] {
              return rules::concat_shape({shape({2, 3}), shape({3, 1})}, 1, in);
            }),
            "input 1 is in1 but input 0 is in0: only dimension 1 may differ");
  EXPECT_EQ(message_of([&] { return rules::concat_shape({shape{}}, 0, in); }),
            "cannot concatenate scalars (input 0 is in0)");

  EXPECT_EQ(rules::split_sizes(6, 0, 3, {}, x), ints({2, 2, 2}));
  EXPECT_EQ(rules::split_sizes(6, 0, 2, {1, -1}, x), ints({1, 5}));
  EXPECT_EQ(message_of([] { return rules::split_sizes(7, 1, 2, {}, x); }),
            "dimension 1 of X (size 7) does not split into 2 equal pieces");
  EXPECT_EQ(message_of([] {
              return rules::split_sizes(3, 0, 2, {2, 2}, x);
            }),
            "sizes [2, 2] do not add up to dimension 0 of X (size 3)");
  EXPECT_EQ(message_of([] { return rules::split_axis(0, 0, x); }), "cannot split a scalar (X)");

  EXPECT_EQ(rules::slice_shape({1, 0}, {-1, 2}, shape({4, -1}), x), shape({3, 2}));
  EXPECT_EQ(message_of([] { return rules::slice_shape({3}, {2}, shape({4}), x); }),
            "begin [3] size [2] reaches outside X in dimension 0 (5 > 4)");
  EXPECT_EQ(message_of([] {
              return rules::slice_shape({0}, {1}, shape({4, 4}), x);
            }),
            "begin [0] and size [1] do not have the rank of X");

  EXPECT_EQ(rules::pad_shape(shape({2, -1}), {1, 0, 2, 2}, x), shape({3, -1}));
  EXPECT_EQ(message_of([] {
              return rules::pad_shape(shape({2}), {1, 0, 2, 2}, x);
            }),
            "paddings [1, 0, 2, 2] has 4 entries for the rank-1 input X: it needs 2 per dimension");
}

TEST(ArrayRules, GatherGatherGradOneHotBroadcast) {
  const auto g = rules::gather_shape(shape({2, 5, 3}), shape({4}), 1, x);
  EXPECT_EQ(g.out, shape({2, 4, 3}));
  EXPECT_EQ(g.outer, 2);
  EXPECT_EQ(g.n, 5);
  EXPECT_EQ(g.inner, 3);
  EXPECT_EQ(message_of([] { return rules::gather_shape(shape{}, shape({1}), 0, x); }),
            "params must have rank >= 1, got X");

  const rules::text_fn idx = [] { return std::string("I"); };
  const auto gg = rules::gather_grad_shape(shape({-1, 5}), 1, shape({2, 4}), shape({4}), x, idx);
  EXPECT_EQ(gg.out, shape({2, 5}));
  EXPECT_EQ(gg.n, 5);
  EXPECT_EQ(message_of([&] {
              return rules::gather_grad_shape(shape({2, 5}), 1, shape({3, 4}), shape({4}), x, idx);
            }),
            "dy X is not gather's output for params_shape [2, 5], indices I and axis 1");

  const auto h = rules::one_hot_shape(shape({2, 3}), 4, 1, x);
  EXPECT_EQ(h.out, shape({2, 4, 3}));
  EXPECT_EQ(h.prefix, 2);
  EXPECT_EQ(h.suffix, 3);
  EXPECT_EQ(message_of([] { return rules::one_hot_shape(shape({2}), 4, 2, x); }),
            "axis 2 is outside [-1, 1] for indices X");

  EXPECT_NO_THROW(rules::check_broadcast(shape({1, 3}), shape({2, 1, 3}), x));
  EXPECT_EQ(message_of([] {
              rules::check_broadcast(shape({2, 3}), shape({4, 3}), x);
              return 0;
            }),
            "cannot broadcast X to [4, 3]: dimension 0 is 2, not 1 or 4");
}

}  // namespace
}  // namespace loom
