// The normalization family's rules (loom/graph/ops/normalization_rules.hpp) on their own:
// layer_norm's split of x at the axis into leading and normalised dims (torch's
// normalized_shape = x.shape[axis:]), and the exact messages of the checks on the axis,
// gamma, beta, dy, mean and rstd.
#include "loom/graph/ops/normalization_rules.hpp"

#include <gtest/gtest.h>

#include <string>

#include "loom/core/error.hpp"
#include "rules_test_support.hpp"

namespace loom {
namespace {

using rules_test::message_of;
namespace rules = normalization_rules;
constexpr auto inference = reduction_rules::rule_caller::inference;
constexpr std::int64_t u = shape::unknown;

TEST(NormalizationRules, SplitsXAtTheAxis) {
  const shape x({2, 3, 4});
  const auto mid = rules::layer_norm_geometry_of(x, 1);
  EXPECT_EQ(mid.axis, 1u);
  EXPECT_EQ(mid.lead, shape({2}));
  EXPECT_EQ(mid.normalized, shape({3, 4}));
  EXPECT_EQ(mid.rows, 2);
  EXPECT_EQ(mid.n, 12);

  const auto last = rules::layer_norm_geometry_of(x, -1);
  EXPECT_EQ(last.axis, 2u);
  EXPECT_EQ(last.lead, shape({2, 3}));
  EXPECT_EQ(last.normalized, shape({4}));
  EXPECT_EQ(last.rows, 6);
  EXPECT_EQ(last.n, 4);

  // -rank: everything is normalised, one row.
  const auto all = rules::layer_norm_geometry_of(x, -3);
  EXPECT_EQ(all.axis, 0u);
  EXPECT_EQ(all.lead, shape{});
  EXPECT_EQ(all.normalized, shape({2, 3, 4}));
  EXPECT_EQ(all.rows, 1);
  EXPECT_EQ(all.n, 24);
}

TEST(NormalizationRules, ZeroSizeAndUnknownDims) {
  const auto no_rows = rules::layer_norm_geometry_of(shape({0, 5}), 1);
  EXPECT_EQ(no_rows.lead, shape({0}));
  EXPECT_EQ(no_rows.rows, 0);
  EXPECT_EQ(no_rows.n, 5);
  const auto unknown = rules::layer_norm_geometry_of(shape({u, 4}), -1, inference);
  EXPECT_EQ(unknown.lead, shape({u}));
  EXPECT_EQ(unknown.normalized, shape({4}));
}

TEST(NormalizationRules, RejectsAnAxisOutOfRange) {
  const shape x({2, 3, 4});
  EXPECT_EQ(message_of([&] { return rules::layer_norm_geometry_of(x, 3); }),
            "axis 3 is out of range for input of shape [2, 3, 4]");
  EXPECT_EQ(message_of([&] { return rules::layer_norm_geometry_of(x, -4); }),
            "axis -4 is out of range for input of shape [2, 3, 4]");
  EXPECT_EQ(message_of([&] { return rules::layer_norm_geometry_of(x, 3, inference); }),
            "axis 3 is out of range for input of shape [2, 3, 4] (rank 3)");
  EXPECT_EQ(message_of([] { return rules::layer_norm_geometry_of(shape{}, 0); }),
            "axis 0 is out of range for input of shape []");
}

TEST(NormalizationRules, GammaAndBetaAreTheNormalisedShape) {
  const shape x({2, 3, 4});
  const auto g = rules::layer_norm_geometry_of(x, 2);
  EXPECT_NO_THROW(rules::check_layer_norm_params(g, x, shape({4}), shape({4})));
  EXPECT_EQ(message_of([&] { rules::check_layer_norm_params(g, x, shape({5}), shape({4})); }),
            "gamma [5] and beta [4] must both have shape x.shape[2:] = [4] (x is [2, 3, 4])");
  EXPECT_EQ(message_of([&] {
              rules::check_layer_norm_params(g, x, shape({4}), shape({1, 4}));
            }),
            "gamma [4] and beta [1, 4] must both have shape x.shape[2:] = [4] (x is [2, 3, 4])");
  const auto two = rules::layer_norm_geometry_of(x, -2);
  EXPECT_NO_THROW(rules::check_layer_norm_params(two, x, shape({3, 4}), shape({3, 4})));
  EXPECT_EQ(message_of([&] { rules::check_layer_norm_params(two, x, shape({4}), shape({4})); }),
            "gamma [4] and beta [4] must both have shape x.shape[1:] = [3, 4] (x is [2, 3, 4])");
}

TEST(NormalizationRules, GradArgumentsCheckedInOrder) {
  const shape x({2, 3, 4});
  const auto g = rules::layer_norm_geometry_of(x, 2);
  const shape lead({2, 3});
  EXPECT_NO_THROW(rules::check_layer_norm_grad_args(g, x, x, shape({4}), lead, lead));

  const auto fails = [&](const shape& dy, const shape& gamma, const shape& mean,
                         const shape& rstd) {
    return message_of([&] { rules::check_layer_norm_grad_args(g, x, dy, gamma, mean, rstd); });
  };
  EXPECT_EQ(fails(shape({2, 3, 5}), shape({4}), lead, lead),
            "dy of shape [2, 3, 5] does not match x of shape [2, 3, 4]");
  // dy before gamma, gamma before mean and rstd.
  EXPECT_EQ(fails(shape({2, 3, 5}), shape({3}), shape({6}), lead),
            "dy of shape [2, 3, 5] does not match x of shape [2, 3, 4]");
  EXPECT_EQ(fails(x, shape({3}), shape({6}), lead),
            "gamma of shape [3] does not match x.shape[2:] = [4] (x is [2, 3, 4])");
  EXPECT_EQ(fails(x, shape({4}), lead, shape({6})),
            "mean [2, 3] and rstd [6] must both have shape x.shape[:2] = [2, 3] (x is [2, 3, 4])");
  EXPECT_EQ(fails(x, shape({4}), shape({2, 3, 1}), lead),
            "mean [2, 3, 1] and rstd [2, 3] must both have shape x.shape[:2] = [2, 3] (x is "
            "[2, 3, 4])");

  // Axis 0: mean and rstd are scalars.
  const auto all = rules::layer_norm_geometry_of(x, 0);
  EXPECT_NO_THROW(rules::check_layer_norm_grad_args(all, x, x, x, shape{}, shape{}));
}

TEST(NormalizationRules, BatchNormSplitsAtTheChannelsAndChecksTheVectors) {
  const shape x({2, 3, 4, 5});
  const shape c({3});
  const auto g = rules::batch_norm_geometry_of(x, {&c, &c, &c, &c});
  EXPECT_EQ(g.outer, 2);
  EXPECT_EQ(g.channels, 3);
  EXPECT_EQ(g.inner, 20);
  const auto r2 = rules::batch_norm_geometry_of(shape({6, 3}), {&c, nullptr, &c, nullptr});
  EXPECT_EQ(r2.outer, 6);
  EXPECT_EQ(r2.inner, 1);
  // Unknown dims fit anything.
  const shape unknown({u});
  EXPECT_NO_THROW((void)rules::batch_norm_geometry_of(shape({u, u, 4}), {&c, &unknown, &c, &c}));
  EXPECT_EQ(message_of([&] { (void)rules::batch_norm_geometry_of(shape({3}), {&c, &c, &c, &c}); }),
            "x must have rank >= 2 ([N, C, ...]), got shape [3]");
  const shape four({4});
  EXPECT_EQ(message_of([&] {
              (void)rules::batch_norm_geometry_of(x, {&c, &c, &c, &four});
            }),
            "var of shape [4] must be [C] = [3] (x is [2, 3, 4, 5])");
  const shape matrix({3, 1});
  EXPECT_EQ(message_of([&] {
              (void)rules::batch_norm_geometry_of(x, {nullptr, &matrix, &c, &c});
            }),
            "bias of shape [3, 1] must be [C] = [3] (x is [2, 3, 4, 5])");
}

}  // namespace
}  // namespace loom
