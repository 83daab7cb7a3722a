// Automatic mixed precision (AMP): which nodes of a graph compute in bfloat16 or float16.
//
// The `amp` pass (src/passes/amp.cpp, Note [automatic mixed precision]) lowers the nodes
// whose op the policy lists (matrix products and convolutions, forward and backward) to the
// low precision: their float32 inputs are cast to it (one cast per tensor, shared by every
// lowered reader, so a weight is cast once for its forward and backward products), they
// compute in it (oneDNN and cuBLAS accumulate in float32), and their results are cast back
// to float32 for every reader that is not lowered itself. Everything else (reductions,
// softmax and its cross-entropy, layer_norm, exp and log, losses, the optimizer) stays
// float32, as PyTorch's autocast keeps it. Variables stay float32: they are the master
// weights, and a fused optimizer reads the 16-bit gradients directly.
//
// Turned on per session (session_options::passes.amp), by `loom train --amp bf16|fp16`, or in
// Python by loom.amp.enable(graph, ...). Unlike every other pass, it changes answers (by the
// rounding of the low precision), which is what it is asked for.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "loom/core/dtype.hpp"

namespace loom::passes {

struct pass_record;

/// Which ops compute in the low precision (autocast's op lists), and exceptions per node.
struct amp_policy {
  /// Ops whose float32 nodes compute in the low precision.
  std::vector<std::string> lower;
  /// Ops that stay float32 (the log says so for each of their nodes): reductions, softmax,
  /// normalisations, exp/log, losses, the optimizers.
  std::vector<std::string> keep_float32;
  /// Ops that compute in their inputs' precision (autocast's pass-through ops): a node of
  /// one is lowered when every float input it has comes out of a lowered node, so a chain
  /// of convolution, relu and max-pool (and its gradients) stays in 16 bits with no cast
  /// in between; with any float32 input it stays float32.
  std::vector<std::string> follow;
  /// Per node name: true lowers it (whatever its op's list), false keeps it float32.
  std::map<std::string, bool> nodes;
  /// Lower nodes even where the device's kernels only emulate the low precision
  /// (kernel_def::emulated; by default such nodes stay float32 and the log says why).
  bool allow_emulated = false;
};

/// The default policy: lower = matmul, fused_matmul, conv2d, fused_conv2d,
/// conv2d_backprop_input, conv2d_backprop_filter, conv_transpose2d; keep_float32 = the
/// numerically sensitive ops; follow = relu, pooling, their gradients, shape and layout
/// ops, and add/sub/mul/maximum/minimum/bias_add (docs/training.md, "Mixed precision").
[[nodiscard]] amp_policy default_amp_policy();

struct amp_options {
  /// float32: AMP off. bfloat16 or float16: the low precision.
  dtype type = dtype::f32;
  amp_policy policy = default_amp_policy();

  [[nodiscard]] bool enabled() const noexcept { return type != dtype::f32; }
};

/// Throws loom::invalid_argument for a type other than float32, bfloat16 and float16, and
/// for a policy that names an op the op registry does not know (naming it and the list).
void validate(const amp_options& options);

/// What the amp pass did to a plan, from the passes' log: how many nodes it lowered, and
/// the first reason it gave for keeping a product float32 other than the policy's word (a
/// missing or emulated kernel), for a summary line.
struct amp_summary {
  std::size_t lowered = 0;
  std::string kept_reason;
};
[[nodiscard]] amp_summary summarize_amp(const std::vector<pass_record>& log);

/// "bf16" / "bfloat16" -> bfloat16, "fp16" / "float16" / "f16" -> float16, "fp32" / "float32"
/// / "off" / "" -> float32 (off); anything else: loom::invalid_argument naming it.
[[nodiscard]] dtype amp_type_from_name(const std::string& name);

}  // namespace loom::passes
