// The shape rules of the reduction family (reduce_*, argmax, softmax, log_softmax,
// softmax_cross_entropy): axis normalisation, a reduction's output shape and extents, and
// the argument checks. Written once, for the ops' shape inference (reduction_ops.cpp, when
// shapes are known) and for every backend's kernels at run time. Each check throws
// loom::invalid_argument with the message the node fails with; a kernel reports it through
// kernel_context::fail (common::apply_rule, src/kernel/common/apply_rule.hpp).
//
// Graph inference and kernels word two failures differently (inference may see aliases of
// an axis before the rank is known): `rule_caller` picks the wording.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/shape.hpp"

namespace loom::reduction_rules {

/// Who asks: graph inference or a kernel (the two word some messages differently).
enum class rule_caller { kernel, inference };

/// Wraps `axis` into [0, rank) of `s` (shape::normalize_axis). Throws
/// loom::invalid_argument "axis A is out of range for input of shape S", followed by
/// " (rank R)" for inference.
std::size_t normalize_axis(std::int64_t axis, const shape& s,
                           rule_caller caller = rule_caller::kernel);

/// The element counts of a shape around one axis: dims before it, along it, after it.
struct axis_split {
  std::int64_t outer = 1;
  std::int64_t n = 1;
  std::int64_t inner = 1;
};
/// Splits `s` (fully defined) around `axis` (in [0, rank)).
axis_split split_at(const shape& s, std::size_t axis);

// ---- reduce_* ------------------------------------------------------------------------------

/// The reductions over axes: sum, mean, max, min, prod; Σ|x| (l1), sqrt(Σx²) (l2), Σx²
/// (sum_square), log Σx (log_sum), log Σ exp(x) (log_sum_exp); any and all over bool.
enum class reduce_kind {
  sum,
  mean,
  max,
  min,
  prod,
  l1,
  l2,
  sum_square,
  log_sum,
  log_sum_exp,
  any,
  all
};

/// The op's name: "reduce_sum", "reduce_mean", ..., "reduce_any", "reduce_all".
const char* op_name(reduce_kind k) noexcept;

/// What reducing `axes` (empty: all) of an input of shape s gives.
struct reduce_geometry {
  /// For each input dim, 1 when it is reduced.
  std::vector<char> reduced;
  /// The output's shape: the kept dims, and 1 for each reduced dim under keepdims.
  shape output;
  /// Elements reduced into each output, and outputs (meaningful when s is fully defined).
  std::int64_t num_red = 1;
  std::int64_t num_out = 1;
};

/// The geometry of a reduction of `s` over `axes`. Throws loom::invalid_argument for an axis
/// out of range (normalize_axis) or one named twice: "axes name axis K twice (input of shape
/// S)" (kernel) or "axes A, B name axis K twice (input of shape S)" (inference).
reduce_geometry reduce_geometry_of(const shape& s, const std::vector<std::int64_t>& axes,
                                   bool keepdims, rule_caller caller = rule_caller::kernel);

/// Fails when a max or min reduces an empty axis: "reduce_max of an empty axis (axis K of
/// input shape S) has no identity". Sums, means and products of nothing are defined.
void check_identity(reduce_kind k, const reduce_geometry& g, const shape& s);

/// Fails unless reduce_sum of a `in` input may give `out`: `in` itself, or float32 for a
/// float16 or bfloat16 input (the sum, accumulated in float as always, stored without the
/// rounding to 16 bits: reduce_sum(cast(x, float32)) bit for bit, in half the reads).
void check_sum_output_type(dtype in, dtype out);

// ---- softmax, log_softmax, argmax ---------------------------------------------------------

/// An op along one axis of a fully known input: the axis, and the split around it.
struct along_axis {
  std::size_t axis = 0;
  axis_split split;
};
/// normalize_axis, then split_at.
along_axis along_axis_of(const shape& s, std::int64_t axis);

/// argmax's and argmin's output shape: `s` without dim `axis` (in [0, rank)), or with it as
/// 1 when `keepdims`.
shape argmax_output(const shape& s, std::size_t axis, bool keepdims = false);

/// Fails for an argmax (or `op`) along an empty axis: "argmax of an empty axis (axis K of
/// input shape S)".
void check_argmax_axis(const along_axis& a, const shape& s, const char* op = "argmax");

// ---- softmax_cross_entropy ----------------------------------------------------------------

/// Inference: the shapes of (loss, backprop) from logits [N, C] and labels [N], either
/// unknown; dims left unknown stay -1. Throws "logits must be [N, C], got shape S", "labels
/// must be [N], got shape S", or "labels of shape S do not match logits of shape T (N
/// differs)".
std::pair<shape, shape> xent_outputs(const std::optional<shape>& logits,
                                     const std::optional<shape>& labels);

/// Kernels: fails unless logits is [N, C] and labels [N]: "logits S must be [N, C] and labels
/// T must be [N]".
void check_xent_shapes(const shape& logits, const shape& labels);

}  // namespace loom::reduction_rules
