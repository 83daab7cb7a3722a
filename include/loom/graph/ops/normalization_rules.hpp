// The shape rules of the normalization family (layer_norm, layer_norm_grad, the batch_norm
// ops): the split of x at the normalised axis and the checks on gamma, beta, mean and rstd;
// batch normalisation's channel split, the checks on its per-channel vectors and on the
// packed statistics that sync_batch_norm exchanges. Written once, for the
// ops' shape inference (normalization_ops.cpp) and for every backend's kernels at run time;
// each check throws loom::invalid_argument with the message the node fails with (a kernel
// reports it through common::apply_rule in src/kernel/common/apply_rule.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

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

/// batch_norm's x seen as [outer, channels, inner]: the dims before the channel axis, the
/// channels, and the product of the dims after it. Channels first ("NCHW", axis 1):
/// [N, C, H·W]; channels last ("NHWC", axis rank - 1): [N·H·W, C, 1]; rank 2: [N, C, 1].
struct batch_norm_geometry {
  std::int64_t outer = 1;
  std::int64_t channels = 0;
  std::int64_t inner = 1;
  /// The values each channel's statistics are taken over: outer · inner.
  [[nodiscard]] std::int64_t count() const noexcept { return outer * inner; }
};

/// The names of batch_norm's per-channel inputs, in input order (inputs 1 to 4).
inline constexpr std::array<const char*, 4> batch_norm_param_names = {"scale", "bias", "mean",
                                                                      "var"};

/// The channel axis of a batch normalisation's x of rank `rank`: 1 for data_format "NCHW"
/// (channels first, [N, C, ...]), rank - 1 for "NHWC" (channels last, [N, ..., C]); the two
/// agree for rank 2. Throws loom::invalid_argument for another data_format ("data_format
/// 'X' is not NCHW or NHWC").
std::size_t batch_norm_channel_axis(const std::string& data_format, std::size_t rank);

/// The geometry of batch_norm's x with its per-channel vectors (`params`, named by `names`
/// in messages; a null pointer is a vector not known yet or not there). Dimensions may be
/// -1 (unknown, at inference): they fit anything, and the counts they enter are then
/// meaningless. Throws loom::invalid_argument: "x must have rank >= 2 ([N, C, ...]), got
/// shape S", or "scale of shape S must be [C] = [c] (x is X)" (likewise the others).
batch_norm_geometry batch_norm_geometry_of(
    const shape& x, const std::array<const shape*, 4>& params, std::size_t channel_axis = 1,
    const std::array<const char*, 4>& names = batch_norm_param_names);

// ---- batch_norm in training, and synchronized across ranks (sync_batch_norm) ---------------
//
// Note [packed batch statistics]
// sync_batch_norm exchanges each rank's statistics in one collective per layer, packed in one
// vector of the statistics type (float32; float64 for float64 x):
//  - forward, batch_norm_stats: [1, 2C + 1] = (count, mean[C], m2[C]), m2 the sum of squared
//    deviations from the rank's mean; all_gather stacks the ranks' rows into [R, 2C + 1],
//    which every rank merges in rank order (Chan et al.'s parallel update), so the ranks
//    agree bit for bit and unequal (even empty) batches are exact;
//  - backward, batch_norm_grad_reduce: [2C + 1] = (Σ dy[C], Σ dy (x - mean)[C], count),
//    summed over the ranks by all_reduce.

/// The width of a packed statistics row for `channels` channels: 2C + 1 (-1 when unknown).
[[nodiscard]] inline std::int64_t batch_norm_packed_width(std::int64_t channels) noexcept {
  return channels < 0 ? -1 : 2 * channels + 1;
}

/// Checks `what` (named in the message), packed statistics of `channels` channels (Note
/// [packed batch statistics]): [R, 2C + 1] for any R when `stacked`, else [2C + 1]. Throws
/// loom::invalid_argument "what of shape S must be [R, W] (the ranks' packed (count, mean,
/// m2) of C channels)" or "what of shape S must be [W] (...)".
void check_batch_norm_packed(const shape& s, std::int64_t channels, bool stacked,
                             const char* what);

/// Checks dy against x for the gradients: "dy of shape D does not match x of shape X".
void check_batch_norm_dy(const shape& dy, const shape& x);

}  // namespace loom::normalization_rules
