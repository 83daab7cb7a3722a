// loss_scaler: dynamic loss scaling for float16 mixed precision, as PyTorch's GradScaler.
//
// float16 holds nothing below 6e-8 (5.96e-8, its smallest subnormal), and small gradients
// of a float16 product underflow to zero. So the loss is multiplied by a large scale before
// the gradients are taken, which scales every gradient by it; the fused optimizer divides
// them by it again (its grad_scale input, which divides) and, when any gradient is Inf or NaN
// (the scale was too large), skips the step (its found_inf output). After each step the
// scaler updates the scale: a skipped step multiplies it by `backoff`, and `growth_interval`
// steps in a row without one multiply it by `growth`. A run of skipped steps that does not
// end (`max_consecutive_skips`) is an error, not a silent stall: the gradients are not
// finite at any scale. bfloat16 has float32's range and needs no scaling.
//
// The scale lives on the host and is fed to each step (a scalar), so it costs nothing on a
// device and checkpoints can keep it in their metadata. Not thread-safe.
#pragma once

#include <cstdint>

namespace loom::train {

struct loss_scale_options {
  /// The first scale (GradScaler's 2^16).
  double initial = 65536.0;
  /// The factor after growth_interval steps without a skip (> 1).
  double growth = 2.0;
  std::int64_t growth_interval = 2000;
  /// The factor after a skipped step (in (0, 1)).
  double backoff = 0.5;
  /// This many skipped steps in a row throw loom::error (>= 1).
  std::int64_t max_consecutive_skips = 30;
};

class loss_scaler {
 public:
  /// Throws loom::invalid_argument naming the option for an initial scale that is not
  /// finite and > 0, growth <= 1, backoff outside (0, 1), or an interval or a skip limit < 1.
  explicit loss_scaler(loss_scale_options options = {});

  /// The scale the next step multiplies its loss by.
  [[nodiscard]] double scale() const noexcept { return scale_; }
  /// Restores a scale (from a checkpoint); throws loom::invalid_argument unless finite and > 0.
  void set_scale(double scale);

  /// After a step: `found_inf` (the optimizer skipped it) backs the scale off, a step without
  /// one counts towards growth. Throws loom::error when this is the
  /// max_consecutive_skips-th skipped step in a row, naming the count and the scale.
  void update(bool found_inf);

  /// Steps skipped so far, and in a row up to now.
  [[nodiscard]] std::int64_t skipped_steps() const noexcept { return skipped_; }
  [[nodiscard]] std::int64_t consecutive_skips() const noexcept { return consecutive_; }
  [[nodiscard]] const loss_scale_options& options() const noexcept { return options_; }

 private:
  loss_scale_options options_;
  double scale_;
  std::int64_t good_steps_ = 0;
  std::int64_t skipped_ = 0;
  std::int64_t consecutive_ = 0;
};

}  // namespace loom::train
