// Reductions and the normalisations built on them: reduce_sum / mean / max / min / prod,
// reduce_l1 / l2 / sum_square / log_sum / log_sum_exp, reduce_any / all, softmax,
// log_softmax, softmax_cross_entropy and argmax; var, std and logsumexp, composed of them
// (layer_norm and the other normalisations, declared in loom/graph/ops/normalization.hpp,
// are included from here too).
//
// Axes follow NumPy: negative axes count from the end; an empty `axes` list reduces every
// axis. A duplicate or out-of-range axis is an error when the node is added (where the
// input's rank is known) or when it runs (where it is not). Every builder adds one node to
// `x`'s builder and throws what graph::add_node throws (loom::invalid_argument naming the
// node for mismatched dtypes, shapes or attributes).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/graph/builder.hpp"
#include "loom/graph/ops/normalization.hpp"

namespace loom::ops {

/// Σ over `axes` (all when empty); `keepdims` keeps reduced axes as size 1. Float inputs
/// accumulate in float with blocked summation carried in double (f64 in double), integers
/// in int64 (wrapping) and are stored back as T. An empty reduction gives 0.
output reduce_sum(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  const node_options& o = {});
/// As above, the sum given as `output_type`: x's dtype, or float32 for a float16 or bfloat16
/// x (NumPy's np.sum(x, dtype=np.float32)): reduce_sum(cast(x, float32)) bit for bit, reading
/// x once at its own width.
output reduce_sum(output x, std::vector<std::int64_t> axes, bool keepdims, dtype output_type,
                  const node_options& o = {});
/// The mean over `axes` (float types only). An empty reduction gives NaN.
output reduce_mean(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                   const node_options& o = {});
/// The maximum over `axes`; NaN propagates (NumPy's max). Reducing an empty axis fails at
/// run time (loom::node_error), as NumPy raises.
output reduce_max(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  const node_options& o = {});
/// The minimum over `axes`; as reduce_max.
output reduce_min(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  const node_options& o = {});
/// The product over `axes`. An empty reduction gives 1.
output reduce_prod(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                   const node_options& o = {});
/// Σ|x| over `axes` (ONNX ReduceL1); types and accumulation as reduce_sum. Empty: 0.
output reduce_l1(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                 const node_options& o = {});
/// sqrt(Σx²) over `axes` (ONNX ReduceL2; float types). Empty: 0.
output reduce_l2(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                 const node_options& o = {});
/// Σx² over `axes` (ONNX ReduceSumSquare); types and accumulation as reduce_sum. Empty: 0.
output reduce_sum_square(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                         const node_options& o = {});
/// log Σx over `axes` (ONNX ReduceLogSum; float types). Empty: -inf.
output reduce_log_sum(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                      const node_options& o = {});
/// log Σ exp(x) over `axes` (ONNX ReduceLogSumExp; float types), computed stably as
/// m + log Σ exp(x - m) with m the maximum (carried online): finite for any finite x, +inf
/// when an element is +inf, NaN when one is NaN. Empty: -inf.
output reduce_log_sum_exp(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                          const node_options& o = {});
/// Logical or over `axes` of a bool tensor (NumPy's any). Empty: false.
output reduce_any(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  const node_options& o = {});
/// Logical and over `axes` of a bool tensor (NumPy's all). Empty: true.
output reduce_all(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                  const node_options& o = {});

/// The variance over `axes` (all when empty): Σ(x - mean)² / (n - correction), n the
/// number of elements reduced (NumPy's var with ddof = correction; PyTorch's var). Float
/// types; built of reduce_mean, sub, mul and reduce_sum, so differentiable. x's shape must be
/// known along `axes`. n - correction <= 0 gives inf or NaN, as NumPy.
output var(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
           double correction = 0.0, const node_options& o = {});
/// sqrt(var(x, axes, keepdims, correction)).
output std(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
           double correction = 0.0, const node_options& o = {});
/// log Σ exp(x) over `axes`, stable (max-shifted): one reduce_log_sum_exp node.
output logsumexp(output x, std::vector<std::int64_t> axes = {}, bool keepdims = false,
                 const node_options& o = {});

/// exp(x - max) / Σ exp(x - max) along `axis` (float types); finite for any finite x.
output softmax(output x, std::int64_t axis = -1, const node_options& o = {});
/// x - max - log Σ exp(x - max) along `axis` (float types).
output log_softmax(output x, std::int64_t axis = -1, const node_options& o = {});

/// The outputs of softmax_cross_entropy.
struct softmax_cross_entropy_outputs {
  /// [N]: -log softmax(logits)[n, labels[n]].
  output loss;
  /// [N, C]: softmax(logits) - one_hot(labels), the gradient of loss w.r.t. logits.
  output backprop;
};
/// Sparse softmax cross-entropy, as TF's SparseSoftmaxCrossEntropyWithLogits: logits
/// [N, C] (float types), labels [N] (int32 or int64). A label outside [0, C) fails at run
/// time with a loom::node_error naming the row and the label.
softmax_cross_entropy_outputs softmax_cross_entropy(output logits, output labels,
                                                    const node_options& o = {});

/// The index of the maximum along `axis` (that axis removed), as `output_type` (int64 or
/// int32). Ties give the first index; a NaN wins (the first NaN), as NumPy. An empty axis
/// fails at run time.
output argmax(output x, std::int64_t axis = -1, dtype output_type = dtype::i64,
              const node_options& o = {});
/// argmax as ONNX ArgMax: `keepdims` keeps the axis as a dimension of size 1;
/// `select_last_index` gives the last index on ties (and the last NaN).
output argmax(output x, std::int64_t axis, dtype output_type, bool keepdims, bool select_last_index,
              const node_options& o = {});

/// The index of the minimum along `axis`, as argmax (ONNX ArgMin): ties give the first index
/// (the last with `select_last_index`); a NaN wins; `keepdims` keeps the axis as size 1.
output argmin(output x, std::int64_t axis = -1, dtype output_type = dtype::i64,
              bool keepdims = false, bool select_last_index = false, const node_options& o = {});

}  // namespace loom::ops
