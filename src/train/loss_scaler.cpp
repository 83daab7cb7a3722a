#include "loom/train/loss_scaler.hpp"

#include <fmt/format.h>

#include <cmath>

#include "loom/core/error.hpp"

namespace loom::train {

loss_scaler::loss_scaler(loss_scale_options options) : options_(options), scale_(options.initial) {
  const auto& o = options_;
  if (!(std::isfinite(o.initial) && o.initial > 0)) {
    throw invalid_argument(
        fmt::format("loss scaling: the initial scale {} must be finite and > 0", o.initial));
  }
  if (!(std::isfinite(o.growth) && o.growth > 1)) {
    throw invalid_argument(
        fmt::format("loss scaling: the growth factor {} must be finite and > 1", o.growth));
  }
  if (!(o.backoff > 0 && o.backoff < 1)) {
    throw invalid_argument(
        fmt::format("loss scaling: the backoff factor {} must be in (0, 1)", o.backoff));
  }
  if (o.growth_interval < 1) {
    throw invalid_argument(
        fmt::format("loss scaling: the growth interval {} must be >= 1 step", o.growth_interval));
  }
  if (o.max_consecutive_skips < 1) {
    throw invalid_argument(
        fmt::format("loss scaling: the limit of skipped steps in a row {} must be >= 1",
                    o.max_consecutive_skips));
  }
}

void loss_scaler::set_scale(double scale) {
  if (!(std::isfinite(scale) && scale > 0)) {
    throw invalid_argument(
        fmt::format("loss scaling: a scale of {} (it must be finite and > 0)", scale));
  }
  scale_ = scale;
  good_steps_ = 0;
}

void loss_scaler::update(bool found_inf) {
  if (!found_inf) {
    consecutive_ = 0;
    if (++good_steps_ == options_.growth_interval) {
      good_steps_ = 0;
      // Growth stops where the scale would no longer be a finite float32 (the fed scalar).
      const double grown = scale_ * options_.growth;
      if (grown <= 3.0e38) scale_ = grown;
    }
    return;
  }
  ++skipped_;
  ++consecutive_;
  good_steps_ = 0;
  const double failed = scale_;
  scale_ *= options_.backoff;
  if (consecutive_ >= options_.max_consecutive_skips) {
    throw error(fmt::format(
        "loss scaling: {} steps in a row skipped for Inf or NaN gradients (the scale backed off "
        "from {:g} to {:g}): the gradients are not finite at any scale; lower the learning rate "
        "or check the data and the model",
        consecutive_, failed / std::pow(options_.backoff, static_cast<double>(consecutive_ - 1)),
        failed));
  }
}

}  // namespace loom::train
