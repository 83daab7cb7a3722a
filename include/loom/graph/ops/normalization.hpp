// The normalization family: layer_norm (its gradient, layer_norm_grad, is emitted by the
// gradient code). The axis follows NumPy (negative counts from the end); an out-of-range
// axis or mismatched gamma / beta is an error when the node is added (where shapes are
// known) or when it runs. The builder adds one node to `x`'s builder and throws what
// graph::add_node throws.
#pragma once

#include <cstdint>

#include "loom/graph/builder.hpp"

namespace loom::ops {

/// The outputs of layer_norm.
struct layer_norm_outputs {
  /// (x - mean) · rstd · gamma + beta, shaped as x.
  output y;
  /// The mean over dims [axis, rank), of shape x.shape[:axis].
  output mean;
  /// 1 / sqrt(biased variance + epsilon), of shape x.shape[:axis].
  output rstd;
};
/// Layer normalisation over dims [axis, rank) of x; gamma and beta have shape
/// x.shape[axis:]. Float types; f16/bf16 compute in float. mean and rstd (dtype T) are what
/// the gradient needs.
layer_norm_outputs layer_norm(output x, output gamma, output beta, std::int64_t axis = -1,
                              double epsilon = 1e-5, const node_options& o = {});

}  // namespace loom::ops
