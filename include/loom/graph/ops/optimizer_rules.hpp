// The optimizer ops' rules: the checks of their hyper-parameters, scalar inputs and
// gradients, as pure functions over dtypes, shapes and values. Shape inference
// (src/graph/ops/optimizer_ops.cpp) and every backend's optimizer kernels call them, so a
// bad step fails alike everywhere; each throws loom::invalid_argument, which a kernel
// reports as its node_error (common::apply_rule, src/kernel/common/apply_rule.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"

namespace loom::optimizer_rules {

/// The storage types of parameters and gradients: float32, float16, bfloat16.
inline bool is_float_storage(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

/// SGD's Nesterov momentum needs momentum > 0 and dampening = 0.
void check_nesterov(bool nesterov, double momentum, double dampening);

/// At run time: input `index` (named `what`: "lr", "step", "grad_scale") holds one element
/// of dtype `want`.
void check_scalar_input(const tensor& t, const char* what, std::size_t index, dtype want);

/// The learning rate: finite and >= 0.
void check_lr(double lr, std::size_t index);

/// Adam's step: the 1-based step number.
void check_step(std::int64_t step, std::size_t index);

/// The loss scale of a fused step: finite and > 0.
void check_grad_scale(float scale, std::size_t index);

/// At run time: a gradient (named `name` in messages, e.g. "grads[0] (input 2)") has a
/// float storage type and its parameter's shape.
void check_grad(const tensor& grad, const std::string& name, const std::string& param,
                const shape& param_shape);

}  // namespace loom::optimizer_rules
