// Optimizer updates as graph nodes: per-tensor (apply_sgd, apply_adam, apply_adamw) and
// fused over many parameters of mixed precision (fused_sgd, fused_adam, fused_adamw).
//
// Every op updates `variable`s in place (copy-on-write when a read still holds the buffer)
// and keeps its state in the session's variable store under derived names, created on the
// first step: `<param>/momentum`, `<param>/adam_m`, `<param>/adam_v`, `<param>/master`.
// The learning rate is an f32 scalar tensor and Adam's step an i64 scalar (the 1-based step
// number used for bias correction), so schedules and step counting stay in the graph. The
// formulas are PyTorch's single-tensor ones, computed in f32 (docs/training.md,
// "Optimizers"); fused and per-tensor updates agree bitwise.
//
//   auto w = ops::variable(b, "w", init);
//   auto step = ops::placeholder(b, "step", dtype::i64, {});
//   auto lr = ops::scalar(b, 1e-3);
//   std::string update = ops::apply_adam(w, grad_w, lr, step);
//   session.run({{"step", step_tensor}}, {}, {update});
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "loom/graph/builder.hpp"

namespace loom::ops {

/// SGD's hyperparameters (PyTorch's names and defaults).
struct sgd_options {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  /// Nesterov momentum (needs momentum > 0 and dampening == 0).
  bool nesterov = false;
  /// The momentum buffer's dtype: f32 or bf16.
  dtype moment_dtype = dtype::f32;
  /// For f16/bf16 parameters: keep an f32 master copy (`<param>/master`) and update it, the
  /// parameter being its rounding. Without, the update is computed in f32 from the
  /// parameter and rounded back each step. Ignored for f32 parameters.
  bool master_weights = true;
};

/// Adam's and AdamW's hyperparameters (PyTorch's names and defaults).
struct adam_options {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Unset: 0 for Adam (an L2 term added to the gradient), 0.01 for AdamW (decoupled decay).
  std::optional<double> weight_decay;
  /// The moments' dtype: f32 or bf16.
  dtype moment_dtype = dtype::f32;
  /// As sgd_options::master_weights.
  bool master_weights = true;
};

/// What the fused ops add to the per-tensor ones.
struct fused_options {
  /// Clip the global L2 norm of the (unscaled) gradients to this; 0: no clipping.
  double max_grad_norm = 0.0;
  /// Check every gradient for inf/NaN before writing anything, and skip the whole step when
  /// one is found (what dynamic loss scaling needs). false: one read of the gradients
  /// fewer; grad_norm and found_inf are still reported but the step is not skipped.
  bool check_finite = true;
};

/// A fused update's outputs.
struct fused_update {
  /// The node's name (run it as a target, or fetch the outputs below).
  std::string name;
  /// f32 scalar: the global L2 norm of the unscaled gradients (grads / grad_scale), before
  /// clipping; inf or NaN when a gradient is.
  output grad_norm;
  /// bool scalar: some unscaled gradient is inf or NaN (with check_finite, nothing was
  /// updated: parameters, moments and masters are untouched).
  output found_inf;
};

/// param -= lr * (SGD direction). `param` must be a variable's output (f32, f16 or bf16),
/// `grad` of its shape (f32, f16 or bf16, may differ from the param's dtype), `lr` an f32
/// scalar. Returns the node's name (the node has no outputs: run it as a target). Throws
/// loom::invalid_argument when `param` is not a variable's output, or as graph::add_node
/// (dtypes, shapes, hyperparameters out of range).
std::string apply_sgd(output param, output grad, output lr, const sgd_options& options = {},
                      const node_options& o = {});
/// One Adam step on `param` (as apply_sgd); `step` is an i64 scalar, the 1-based step number.
std::string apply_adam(output param, output grad, output lr, output step,
                       const adam_options& options = {}, const node_options& o = {});
/// One AdamW step (decoupled weight decay, default 0.01).
std::string apply_adamw(output param, output grad, output lr, output step,
                        const adam_options& options = {}, const node_options& o = {});

/// One SGD step over every parameter in one node: params[k] (variables' outputs of any of
/// f32, f16, bf16, mixed freely) with grads[k] (f32, f16 or bf16, of params[k]'s shape).
/// Gradients are divided by `grad_scale` (an f32 scalar; 1 for none), optionally clipped,
/// and the step is skipped when one is inf/NaN (fused_options). Throws
/// loom::invalid_argument when the lists differ in length, a param is not a variable's
/// output, or as graph::add_node.
fused_update fused_sgd(const std::vector<output>& params, const std::vector<output>& grads,
                       output lr, output grad_scale, const sgd_options& options = {},
                       const fused_options& fused = {}, const node_options& o = {});
/// One Adam step over every parameter in one node (as fused_sgd).
fused_update fused_adam(const std::vector<output>& params, const std::vector<output>& grads,
                        output lr, output step, output grad_scale, const adam_options& options = {},
                        const fused_options& fused = {}, const node_options& o = {});
/// One AdamW step over every parameter in one node (as fused_sgd).
fused_update fused_adamw(const std::vector<output>& params, const std::vector<output>& grads,
                         output lr, output step, output grad_scale,
                         const adam_options& options = {}, const fused_options& fused = {},
                         const node_options& o = {});

}  // namespace loom::ops
