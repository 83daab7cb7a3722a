// The shape rules of the normalization family (layer_norm, layer_norm_grad, batch_norm): the
// split of x at the normalised axis and the checks on gamma, beta, mean and rstd; batch_norm's
// channel split and the checks on its per-channel vectors. Written once, for the
// ops' shape inference (normalization_ops.cpp) and for every backend's kernels at run time;
// each check throws loom::invalid_argument with the message the node fails with (a kernel
// reports it through common::apply_rule in src/kernel/common/apply_rule.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "loom/core/shape.hpp"
#include "loom/graph/ops/reduction_rules.hpp"

namespace loom::normalization_rules {

/// x seen as [rows, n]: the leading dims [0, axis) and the normalised dims [axis, rank).
struct layer_norm_geometry {
  std::size_t axis = 0;
  shape lead;
  shape normalized;
  /// Element counts of lead and normalized (meaningful when x is fully defined).
  std::int64_t rows = 1;
  std::int64_t n = 1;
};

/// The geometry of a layer_norm of x over [axis, rank). Throws loom::invalid_argument for an
/// axis out of range (reduction_rules::normalize_axis, worded for `caller`).
layer_norm_geometry layer_norm_geometry_of(
    const shape& x, std::int64_t axis,
    reduction_rules::rule_caller caller = reduction_rules::rule_caller::kernel);

/// Kernels of layer_norm: fails unless gamma and beta are both x.shape[axis:]: "gamma G and
/// beta B must both have shape x.shape[A:] = N (x is X)".
void check_layer_norm_params(const layer_norm_geometry& g, const shape& x, const shape& gamma,
                             const shape& beta);

/// Kernels of layer_norm_grad: fails unless dy is x's shape ("dy of shape D does not match x
/// of shape X"), gamma is x.shape[axis:] ("gamma of shape G does not match x.shape[A:] = N (x
/// is X)"), and mean and rstd are x.shape[:axis] ("mean M and rstd R must both have shape
/// x.shape[:A] = L (x is X)"), checked in that order.
void check_layer_norm_grad_args(const layer_norm_geometry& g, const shape& x, const shape& dy,
                                const shape& gamma, const shape& mean, const shape& rstd);

// ---- batch_norm ----------------------------------------------------------------------------

/// batch_norm's x seen as [outer, channels, inner]: dim 0, dim 1 (the channels) and the
/// product of the dims after it (1 for rank 2).
struct batch_norm_geometry {
  std::int64_t outer = 1;
  std::int64_t channels = 0;
  std::int64_t inner = 1;
};

/// The names of batch_norm's per-channel inputs, in input order (inputs 1 to 4).
inline constexpr std::array<const char*, 4> batch_norm_param_names = {"scale", "bias", "mean",
                                                                      "var"};

/// The geometry of batch_norm's x with its four per-channel vectors (scale, bias, mean, var;
/// a null pointer is a shape not known yet). Dimensions may be -1 (unknown, at inference):
/// they fit anything, and the counts they enter are then meaningless. Throws
/// loom::invalid_argument: "x must have rank >= 2 ([N, C, ...]), got shape S", or "scale of
/// shape S must be [C] = [c] (x is X)" (likewise bias, mean, var).
batch_norm_geometry batch_norm_geometry_of(const shape& x,
                                           const std::array<const shape*, 4>& params);

}  // namespace loom::normalization_rules
