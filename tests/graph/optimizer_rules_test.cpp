// The optimizer ops' rules (loom/graph/ops/optimizer_rules.hpp) on their own: which dtypes
// store parameters, and the exact messages of the checks on Nesterov momentum, the scalar
// inputs (lr, step, grad_scale) and the gradients.
#include "loom/graph/ops/optimizer_rules.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "loom/core/error.hpp"
#include "rules_test_support.hpp"

namespace loom {
namespace {

using rules_test::host_tensor;
using rules_test::message_of;
namespace rules = optimizer_rules;

TEST(OptimizerRules, FloatStorageTypes) {
  EXPECT_TRUE(rules::is_float_storage(dtype::f32));
  EXPECT_TRUE(rules::is_float_storage(dtype::f16));
  EXPECT_TRUE(rules::is_float_storage(dtype::bf16));
  EXPECT_FALSE(rules::is_float_storage(dtype::f64));
  EXPECT_FALSE(rules::is_float_storage(dtype::i32));
  EXPECT_FALSE(rules::is_float_storage(dtype::boolean));
}

TEST(OptimizerRules, NesterovNeedsMomentumAndNoDampening) {
  EXPECT_NO_THROW(rules::check_nesterov(false, 0.0, 0.5));
  EXPECT_NO_THROW(rules::check_nesterov(true, 0.9, 0.0));
  EXPECT_EQ(message_of([] { rules::check_nesterov(true, 0.0, 0.0); }),
            "nesterov momentum needs momentum > 0 and dampening = 0 (momentum = 0, "
            "dampening = 0)");
  EXPECT_EQ(message_of([] { rules::check_nesterov(true, 0.9, 0.1); }),
            "nesterov momentum needs momentum > 0 and dampening = 0 (momentum = 0.9, "
            "dampening = 0.1)");
  EXPECT_EQ(message_of([] { rules::check_nesterov(true, -0.5, 0.0); }),
            "nesterov momentum needs momentum > 0 and dampening = 0 (momentum = -0.5, "
            "dampening = 0)");
}

TEST(OptimizerRules, ScalarInputsHoldOneElementOfTheirDtype) {
  EXPECT_NO_THROW(rules::check_scalar_input(host_tensor(dtype::f32, shape{}), "lr", 2, dtype::f32));
  EXPECT_NO_THROW(
      rules::check_scalar_input(host_tensor(dtype::f32, shape({1})), "lr", 2, dtype::f32));
  EXPECT_EQ(message_of([] {
              rules::check_scalar_input(host_tensor(dtype::f32, shape({2})), "lr", 2, dtype::f32);
            }),
            "lr (input 2) must be a float32 scalar, got float32[2] on cpu:0");
  EXPECT_EQ(message_of([] {
              rules::check_scalar_input(host_tensor(dtype::f32, shape({0})), "lr", 2, dtype::f32);
            }),
            "lr (input 2) must be a float32 scalar, got float32[0] on cpu:0");
  // "an" before a vowel.
  EXPECT_EQ(message_of([] {
              rules::check_scalar_input(host_tensor(dtype::f32, shape{}), "step", 3, dtype::i64);
            }),
            "step (input 3) must be an int64 scalar, got float32[] on cpu:0");
}

TEST(OptimizerRules, LearningRateStepAndGradScale) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  EXPECT_NO_THROW(rules::check_lr(0.0, 2));
  EXPECT_NO_THROW(rules::check_lr(0.1, 2));
  EXPECT_EQ(message_of([] { rules::check_lr(-1.0, 2); }),
            "lr (input 2) must be finite and >= 0, got -1");
  EXPECT_EQ(message_of([] { rules::check_lr(std::nan(""), 2); }),
            "lr (input 2) must be finite and >= 0, got nan");
  EXPECT_EQ(message_of([&] { rules::check_lr(inf, 2); }),
            "lr (input 2) must be finite and >= 0, got inf");

  EXPECT_NO_THROW(rules::check_step(1, 3));
  EXPECT_EQ(message_of([] { rules::check_step(0, 3); }),
            "step (input 3) is the 1-based step number; got 0");
  EXPECT_EQ(message_of([] { rules::check_step(-5, 3); }),
            "step (input 3) is the 1-based step number; got -5");

  EXPECT_NO_THROW(rules::check_grad_scale(1024.0f, 4));
  EXPECT_EQ(message_of([] { rules::check_grad_scale(0.0f, 4); }),
            "grad_scale (input 4) must be finite and > 0, got 0");
  EXPECT_EQ(message_of([] { rules::check_grad_scale(-2.5f, 4); }),
            "grad_scale (input 4) must be finite and > 0, got -2.5");
  EXPECT_EQ(message_of([] { rules::check_grad_scale(std::numeric_limits<float>::infinity(), 4); }),
            "grad_scale (input 4) must be finite and > 0, got inf");
  EXPECT_EQ(message_of([] { rules::check_grad_scale(std::nanf(""), 4); }),
            "grad_scale (input 4) must be finite and > 0, got nan");
}

TEST(OptimizerRules, GradientsAreFloatAndOfTheParameterShape) {
  const shape w({3, 4});
  EXPECT_NO_THROW(rules::check_grad(host_tensor(dtype::f32, w), "grad (input 1)", "w", w));
  EXPECT_NO_THROW(rules::check_grad(host_tensor(dtype::f16, w), "grad (input 1)", "w", w));
  EXPECT_NO_THROW(rules::check_grad(host_tensor(dtype::bf16, w), "grad (input 1)", "w", w));
  EXPECT_EQ(message_of([] {
              rules::check_grad(host_tensor(dtype::f32, shape({3, 4})), "grads[0] (input 1)", "w",
                                shape({4, 3}));
            }),
            "grads[0] (input 1) has shape [3, 4] but parameter 'w' has shape [4, 3]");
  // The dtype is checked before the shape.
  EXPECT_EQ(message_of([] {
              rules::check_grad(host_tensor(dtype::i64, shape({4})), "grads[0] (input 1)", "w",
                                shape({3}));
            }),
            "grads[0] (input 1) is int64[4] on cpu:0; gradients must be float32, "
            "float16 or bfloat16");
  EXPECT_EQ(
      message_of([&] { rules::check_grad(host_tensor(dtype::f64, w), "grad (input 1)", "w", w); }),
      "grad (input 1) is float64[3, 4] on cpu:0; gradients must be float32, "
      "float16 or bfloat16");
}

}  // namespace
}  // namespace loom
