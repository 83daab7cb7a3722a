// The normalization family: layer_norm (its gradient, layer_norm_grad, is emitted by the
// gradient code), batch_norm (inference) and batch_norm_train / sync_batch_norm (training,
// with running statistics), ops of their own; batch_norm_training (statistics only, no
// running ones), group_norm, instance_norm and rms_norm, built of existing differentiable
// ops (their gradients come from those ops'). The axis follows NumPy (negative counts from the end); an out-of-range
// axis or mismatched gamma / beta is an error when the node is added (where shapes are
// known) or when it runs. The builders add nodes to `x`'s builder and throw what
// graph::add_node throws.
#pragma once

#include <cstdint>
#include <string>

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

/// Inference-mode batch normalisation over channel dimension 1 (ONNX BatchNormalization,
/// inference): y = (x - mean) / sqrt(var + epsilon) · scale + bias, computed per channel
/// as y = x · a + b with a = scale / sqrt(var + epsilon), b = bias - mean · a. x has rank
/// >= 2 ([N, C, ...]); scale, bias, mean and var are [C]. Float types (f16/bf16 compute in
/// float). Differentiable with respect to all five inputs. Throws loom::invalid_argument
/// naming the node for x of rank below 2 or a vector that is not [C].
output batch_norm(output x, output scale, output bias, output mean, output var,
                  double epsilon = 1e-5, const node_options& o = {});

/// Batch normalisation's settings.
struct batch_norm_options {
  double epsilon = 1e-5;
  /// Training: running = (1 - momentum) · running + momentum · batch statistic (PyTorch's
  /// rule; the running variance takes the unbiased batch variance). In [0, 1].
  double momentum = 0.1;
  /// "NCHW": channels at dim 1 ([N, C, ...]); "NHWC": channels last ([N, ..., C]).
  std::string data_format = "NCHW";
};

/// batch_norm (inference) with its options (epsilon, data_format; momentum is not used):
/// the running statistics of a training graph's batch_norm_train, for evaluation.
output batch_norm(output x, output scale, output bias, output mean, output var,
                  const batch_norm_options& b, const node_options& o = {});

/// The outputs of batch_norm_train and sync_batch_norm.
struct batch_norm_train_outputs {
  /// (x - mean) · invstd · scale + bias, shaped as x (dtype T).
  output y;
  /// The batch's mean per channel [C], and 1 / sqrt(biased variance + epsilon): what the
  /// gradient reads. float32 (float64 for a float64 x) whatever x's dtype.
  output mean;
  output invstd;
};

/// Training-mode batch normalisation (PyTorch's BatchNorm in train(); docs/training.md, "Batch
/// normalisation"): per channel, the mean and biased variance of the batch (every dim but the
/// channels') in one pass, numerically stable (Welford / Chan: no E[x²] - E[x]²), in float32
/// for 16-bit x; y normalised, scaled and shifted; and, in the same node, the running
/// statistics updated in place: running_mean and running_var must be variables (of [C]):
/// running = (1 - momentum) running + momentum · batch statistic, the variance unbiased
/// (n / (n - 1)). x [N, C, ...] ("NCHW") or [N, ..., C] ("NHWC"), rank >= 2; scale, bias
/// and the running statistics [C] of x's dtype, or float32 for a 16-bit x. Its gradient is
/// one batch_norm_train_grad node (dx, dscale, dbias). The kernel fails, naming the node,
/// when a channel has fewer than 2 values (as PyTorch does). Throws loom::invalid_argument
/// naming the node for a vector that is not [C] or dtypes that do not fit.
batch_norm_train_outputs batch_norm_train(output x, output scale, output bias,
                                          output running_mean, output running_var,
                                          const batch_norm_options& b = {},
                                          const node_options& o = {});

/// batch_norm_train whose statistics are those of every rank's batch together (PyTorch's
/// SyncBatchNorm): batch_norm_stats (this rank's count, mean and m2 per channel, packed),
/// one all_gather over `group` (a communicator registered with
/// loom::distributed::register_group), and a sync_batch_norm node that merges the ranks'
/// statistics in rank order (exact for unequal batches, an empty one included) and
/// normalises. Its gradient all-reduces (Σ dy, Σ dy (x - mean)) in one collective; dscale
/// and dbias are this rank's (data-parallel training averages them over the ranks as every
/// gradient). With one rank it equals batch_norm_train. The nodes are named o.name (or a
/// fresh "sync_batch_norm") with "/stats" and "/gather" added.
batch_norm_train_outputs sync_batch_norm(output x, output scale, output bias,
                                         output running_mean, output running_var,
                                         const std::string& group = "world",
                                         const batch_norm_options& b = {},
                                         const node_options& o = {});

/// Training-mode batch normalisation composed of other ops, without running statistics: the
/// statistics are the batch's, the mean and the biased variance over every dimension but 1:
/// y = (x - mean) / sqrt(var + epsilon) · scale + bias, scale and bias [C]. Built of
/// reduce_mean, sub, mul, rsqrt...; x's rank must be known. batch_norm_train is the fused op.
output batch_norm_training(output x, output scale, output bias, double epsilon = 1e-5,
                           const node_options& o = {});

/// Group normalisation (PyTorch's GroupNorm): x [N, C, ...] with C split into `groups`
/// groups of C / groups channels, each (n, group) normalised by its mean and biased
/// variance over its channels and spatial dims, then scaled and shifted per channel by
/// scale and bias [C]. x's shape must be known except N; throws loom::invalid_argument when
/// groups does not divide C.
output group_norm(output x, output scale, output bias, std::int64_t groups,
                  double epsilon = 1e-5, const node_options& o = {});

/// Instance normalisation (ONNX InstanceNormalization): each (n, c) of x [N, C, ...]
/// normalised by its mean and biased variance over the spatial dims, then
/// · scale[c] + bias[c]. x's rank must be known (>= 3).
output instance_norm(output x, output scale, output bias, double epsilon = 1e-5,
                     const node_options& o = {});

/// RMS normalisation over dims [axis, rank): y = x / sqrt(mean(x²) + epsilon) · scale,
/// scale of shape x.shape[axis:]. x's rank must be known.
output rms_norm(output x, output scale, std::int64_t axis = -1, double epsilon = 1e-5,
                const node_options& o = {});

}  // namespace loom::ops
