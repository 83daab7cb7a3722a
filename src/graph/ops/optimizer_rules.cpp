// The optimizer ops' rules (include/loom/graph/ops/optimizer_rules.hpp).
#include "loom/graph/ops/optimizer_rules.hpp"

#include <fmt/format.h>

#include <cmath>
#include <string_view>

#include "loom/core/error.hpp"

namespace loom::optimizer_rules {

void check_nesterov(bool nesterov, double momentum, double dampening) {
  if (nesterov && (momentum <= 0.0 || dampening != 0.0)) {
    throw invalid_argument(
        fmt::format("nesterov momentum needs momentum > 0 and dampening = 0 (momentum = {}, "
                    "dampening = {})",
                    momentum, dampening));
  }
}

void check_scalar_input(const tensor& t, const char* what, std::size_t index, dtype want) {
  if (t.num_elements() != 1 || t.type() != want) {
    const std::string_view type = to_string(want);
    const bool vowel = std::string_view("aeiou").find(type.front()) != std::string_view::npos;
    throw invalid_argument(fmt::format("{} (input {}) must be {} {} scalar, got {}", what, index,
                                       vowel ? "an" : "a", type, t.describe()));
  }
}

void check_lr(double lr, std::size_t index) {
  if (!(lr >= 0.0) || !std::isfinite(lr)) {
    throw invalid_argument(fmt::format("lr (input {}) must be finite and >= 0, got {}", index, lr));
  }
}

void check_step(std::int64_t step, std::size_t index) {
  if (step < 1) {
    throw invalid_argument(
        fmt::format("step (input {}) is the 1-based step number; got {}", index, step));
  }
}

void check_grad_scale(float scale, std::size_t index) {
  if (!(scale > 0.0f) || !std::isfinite(scale)) {
    throw invalid_argument(
        fmt::format("grad_scale (input {}) must be finite and > 0, got {}", index, scale));
  }
}

void check_grad(const tensor& grad, const std::string& name, const std::string& param,
                const shape& param_shape) {
  if (!is_float_storage(grad.type())) {
    throw invalid_argument(fmt::format("{} is {}; gradients must be float32, float16 or bfloat16",
                                       name, grad.describe()));
  }
  if (grad.shape() != param_shape) {
    throw invalid_argument(fmt::format("{} has shape {} but parameter '{}' has shape {}", name,
                                       to_string(grad.shape()), param, to_string(param_shape)));
  }
}

}  // namespace loom::optimizer_rules
