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

TEST(ArrayRules, DynamicReshapeFollowsOnnxReshape) {
  EXPECT_EQ(rules::dynamic_reshape_shape({0, -1}, shape{2, 3, 4}, false, x), shape({2, 12}));
  EXPECT_EQ(rules::dynamic_reshape_shape({3, 0}, shape{0, 3}, true, x), shape({3, 0}));
  EXPECT_EQ(message_of([] {
              return rules::dynamic_reshape_shape({4, 2}, shape{2, 3}, false, x);
            }),
            "cannot reshape X (6 elements) to [4, 2]: the target holds 8 elements");
  EXPECT_EQ(
      message_of([] {
        return rules::dynamic_reshape_shape({0, -1}, shape{0, 3}, true, x);
      }),
      "cannot reshape X (0 elements) to [0, -1]: with allowzero, 0 and -1 cannot both appear");
  EXPECT_EQ(rules::dynamic_reshape_shape({-1, 0}, shape{0, 3}, false, x), shape({0, 3}));
  EXPECT_EQ(message_of([] {
              return rules::dynamic_reshape_shape({-1, 0}, shape{3, 0}, false, x);
            }),
            "cannot reshape X (0 elements) to [-1, 0]: the -1 cannot be inferred when the other "
            "entries hold 0 elements");
  EXPECT_EQ(message_of([] {
              return rules::dynamic_reshape_shape({4, -1}, shape{2, 3}, false, x);
            }),
            "cannot reshape X (6 elements) to [4, -1]: the other entries hold 4 elements, which "
            "do not divide 6");
}

TEST(ArrayRules, ExpandBroadcastsBothWays) {
  EXPECT_EQ(rules::expand_shape(shape{3, 1}, {2, 1, 6}, x), shape({2, 3, 6}));
  EXPECT_EQ(rules::expand_shape(shape{-1, 4}, {5, 1}, x), shape({5, 4}));
  EXPECT_EQ(rules::expand_shape(shape{-1, 4}, {1, 1}, x), shape({-1, 4}));
  EXPECT_EQ(message_of([] {
              return rules::expand_shape(shape{3, 4}, {2, 4}, x);
            }),
            "cannot expand X to [2, 4]: dimension 0 of the result would be both 3 and 2");
  EXPECT_EQ(rules::expand_grad_axes(shape{3, 1}, shape{2, 3, 6}, x), ints({0, 2}));
}

TEST(ArrayRules, TileFlipAndStridedSlice) {
  EXPECT_EQ(rules::tile_shape(shape{2, -1}, {3, 2}, x), shape({6, -1}));
  EXPECT_EQ(message_of([] {
              return rules::tile_shape(shape{2}, {3, 2}, x);
            }),
            "multiples [3, 2] has 2 entries for the rank-1 input X");
  EXPECT_EQ(rules::flip_dims(3, {-1}, x), std::vector<bool>({false, false, true}));
  EXPECT_EQ(rules::flip_dims(2, {}, x), std::vector<bool>({true, true}));
  const auto g =
      rules::strided_slice_shape(shape{20, 10, 5}, {20, 10, 4}, {0, 0, 1}, {}, {-1, -3, -2}, x);
  EXPECT_EQ(g.out, shape({19, 3, 2}));
  EXPECT_EQ(g.start, ints({19, 9, 4}));
  EXPECT_EQ(g.step, ints({-1, -3, -2}));
  EXPECT_EQ(rules::strided_slice_shape(shape{-1, 4}, {1}, {3}, {0}, {}, x).out, shape({-1, 4}));
  EXPECT_EQ(message_of([] { return rules::strided_slice_shape(shape{4}, {0}, {2}, {}, {0}, x); }),
            "steps [0] has a 0 (for axis 0) for X");
}

}  // namespace
}  // namespace loom
