// Mixed-precision training: loss_scaler's rules (backoff, growth, the limit on skipped steps,
// its options), and loom::train with AMP: bfloat16 trains the MLP and the CNN to float32's
// test accuracy; float16 with loss scaling skips the steps whose gradients overflow (the
// fused update's found_inf) and backs the scale off until they do not; checkpoints hold
// float32 master weights and move between float32 and AMP runs.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "loom/core/error.hpp"
#include "loom/train/dataset.hpp"
#include "loom/train/loss_scaler.hpp"
#include "loom/train/trainer.hpp"
#include "train/train_test_support.hpp"

namespace loom::train {
namespace {

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  loss_scaler s({.initial = 1024,
                 .growth = 2,
                 .growth_interval = 3,
                 .backoff = 0.5,
                 .max_consecutive_skips = 4});
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped_steps(), 1);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);  // the third good step in a row
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.consecutive_skips(), 0);
  // A skip restarts the count towards growth.
  s.update(false);
  s.update(false);
  s.update(true);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);
}

TEST(LossScaler, TooManySkippedStepsInARowAreAnError) {
  loss_scaler s({.initial = 1e6,
                 .growth = 2,
                 .growth_interval = 10,
                 .backoff = 0.25,
                 .max_consecutive_skips = 3});
  s.update(true);
  s.update(true);
  try {
    s.update(true);
    FAIL() << "no error after 3 skipped steps in a row";
  } catch (const error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("3 steps in a row"), std::string::npos) << what;
    EXPECT_NE(what.find("1e+06"), std::string::npos) << what;
  }
}

TEST(LossScaler, BadOptionsNameTheOption) {
  auto message = [](loss_scale_options o) -> std::string {
    try {
      loss_scaler s(o);
    } catch (const invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({.initial = 0}).find("initial scale"), std::string::npos);
  EXPECT_NE(message({.initial = INFINITY}).find("initial scale"), std::string::npos);
  EXPECT_NE(message({.growth = 1}).find("growth factor"), std::string::npos);
  EXPECT_NE(message({.backoff = 1}).find("backoff"), std::string::npos);
  EXPECT_NE(message({.growth_interval = 0}).find("growth interval"), std::string::npos);
  EXPECT_NE(message({.max_consecutive_skips = 0}).find("in a row"), std::string::npos);
  loss_scaler s;
  EXPECT_THROW(s.set_scale(std::nan("")), invalid_argument);
  s.set_scale(8);
  EXPECT_EQ(s.scale(), 8);
}

// AMP in `t`, lowering even where this CPU only emulates it (CI machines differ).
train_options with_amp(train_options o, dtype t) {
  o.passes.amp.type = t;
  o.passes.amp.policy.allow_emulated = true;
  return o;
}

TEST(AmpTrain, Bfloat16ReachesFloat32sAccuracyOnTheMlpAndTheCnn) {
  {
    const auto [tr, te] = split(make_digits(3000, 11), 0.2, 11);
    const auto fp32 = train(tr, te, small_mlp());
    const auto bf16 = train(tr, te, with_amp(small_mlp(), dtype::bf16));
    EXPECT_GE(bf16.test_accuracy, fp32.test_accuracy - 0.01) << "mlp: fp32 " << fp32.test_accuracy;
    EXPECT_NE(bf16.epochs[1].loss, fp32.epochs[1].loss) << "the products ran in bfloat16";
    EXPECT_EQ(bf16.skipped_steps, 0);
    EXPECT_EQ(bf16.loss_scale, 0.0) << "bfloat16 needs no loss scaling";
  }
  {
    const auto [tr, te] = split(make_digits(1200, 12), 0.2, 12);
    train_options o = small_mlp();
    o.model = "cnn";
    const auto fp32 = train(tr, te, o);
    const auto bf16 = train(tr, te, with_amp(o, dtype::bf16));
    EXPECT_GE(bf16.test_accuracy, fp32.test_accuracy - 0.02) << "cnn: fp32 " << fp32.test_accuracy;
    EXPECT_GT(bf16.test_accuracy, 0.6) << "chance is 0.10";
  }
}

TEST(AmpTrain, Float16SkipsOverflowingStepsAndBacksTheScaleOff) {
  const auto [tr, te] = split(make_digits(3000, 21), 0.2, 21);
  train_options o = with_amp(small_mlp(), dtype::f16);
  o.hidden = {32};
  train_options plain = o;
  plain.passes.amp.type = dtype::f32;
  const auto fp32 = train(tr, te, plain);
  // Scaled gradients of ~1e8 * 0.003 overflow float16 (65504): the first steps must skip.
  o.loss_scale.initial = 1e8;
  ASSERT_TRUE(scales_loss(o));
  const auto report = train(tr, te, o);
  EXPECT_GE(report.skipped_steps, 2);
  EXPECT_LT(report.skipped_steps, 20);
  EXPECT_LT(report.loss_scale, 1e8);
  EXPECT_GT(report.loss_scale, 0.0);
  // The same model as float32's, short of the skipped steps (the first batches, where the
  // loss falls fastest): within 5 points after two epochs.
  EXPECT_GT(report.test_accuracy, fp32.test_accuracy - 0.05) << "fp32: " << fp32.test_accuracy;
  EXPECT_GT(report.test_accuracy, 0.6) << "chance is 0.10";
  ASSERT_EQ(report.epochs.size(), 2u);
  EXPECT_TRUE(std::isfinite(report.epochs[1].loss));
}

TEST(AmpTrain, AScaleThatNeverFitsStopsTrainingWithAClearError) {
  const auto [tr, te] = split(make_digits(400, 22), 0.2, 22);
  train_options o = with_amp(small_mlp(), dtype::f16);
  o.hidden = {16};
  o.epochs = 1;
  o.loss_scale.initial = 1e30;
  o.loss_scale.max_consecutive_skips = 3;
  try {
    (void)train(tr, te, o);
    FAIL() << "no error";
  } catch (const error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("epoch 1, step 3"), std::string::npos) << what;
    EXPECT_NE(what.find("3 steps in a row skipped"), std::string::npos) << what;
  }
  // Loss scaling needs the fused update.
  o.fused = false;
  EXPECT_THROW((void)train(tr, te, o), invalid_argument);
}

TEST(AmpTrain, CheckpointsMoveBetweenFloat32AndAmpRuns) {
  const auto [tr, te] = split(make_digits(600, 23), 0.2, 23);
  for (const dtype first : {dtype::f32, dtype::bf16, dtype::f16}) {
    for (const dtype then : {dtype::f32, dtype::bf16, dtype::f16}) {
      SCOPED_TRACE(fmt::format("{} then {}", to_string(first), to_string(then)));
      train_options o = with_amp(small_mlp(), first);
      o.hidden = {16};
      o.epochs = 1;
      o.checkpoint_dir = temp_dir("move");
      (void)train(tr, te, o);
      train_options r = with_amp(small_mlp(), then);
      r.hidden = {16};
      r.epochs = 2;
      r.checkpoint_dir = o.checkpoint_dir;
      r.resume = true;
      r.require_checkpoint = true;
      const auto resumed = train(tr, te, r);
      EXPECT_EQ(resumed.resumed_epoch, 1);
      ASSERT_EQ(resumed.epochs.size(), 1u);
      EXPECT_TRUE(std::isfinite(resumed.epochs[0].loss));
    }
  }
}

}  // namespace
}  // namespace loom::train
