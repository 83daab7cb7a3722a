// The normalization builders composed of other differentiable ops (declared in
// loom/graph/ops/normalization.hpp): batch_norm_training, group_norm, instance_norm and
// rms_norm. Their gradients are those of the ops they are built of.
#include <fmt/format.h>

#include <numeric>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/graph/ops/reduction.hpp"

namespace loom::ops {
namespace {

using ints = std::vector<std::int64_t>;

// x's shape, which `what` needs known; at least `min_rank` dims.
const shape& known_shape(output x, const char* what, std::size_t min_rank) {
  const auto& s = x.type().shape;
  if (!s) throw invalid_argument(fmt::format("{} needs x's rank to be known", what));
  if (s->rank() < min_rank) {
    throw invalid_argument(fmt::format("{} needs x of rank >= {} ([N, C, ...]), got shape {}",
                                       what, min_rank, to_string(*s)));
  }
  return *s;
}

// The axes [from, rank).
ints axes_from(std::size_t from, std::size_t rank) {
  ints a(rank - from);
  std::iota(a.begin(), a.end(), static_cast<std::int64_t>(from));
  return a;
}

// A [C] vector reshaped to [1, C, 1, ...] of rank `rank`, to broadcast over NCHW-style x.
output per_channel(output v, std::size_t rank) {
  ints s(rank, 1);
  s[1] = -1;
  return reshape(v, s);
}

// (x - mean) / sqrt(var + epsilon) over `axes` (kept), the biased variance.
output standardize(output x, const ints& axes, double epsilon) {
  const output mean = reduce_mean(x, axes, true);
  const output d = x - mean;
  const output var = reduce_mean(d * d, axes, true);
  return d * rsqrt(var + epsilon);
}

}  // namespace

output batch_norm_training(output x, output scale, output bias, double epsilon,
                           const node_options& o) {
  const std::size_t rank = known_shape(x, "batch_norm_training", 2).rank();
  ints axes{0};
  for (std::size_t k = 2; k < rank; ++k) axes.push_back(static_cast<std::int64_t>(k));
  const output xhat = standardize(x, axes, epsilon);
  return add(xhat * per_channel(scale, rank), per_channel(bias, rank), o);
}

output group_norm(output x, output scale, output bias, std::int64_t groups, double epsilon,
                  const node_options& o) {
  const shape& s = known_shape(x, "group_norm", 2);
  std::int64_t spatial = 1;
  for (std::size_t k = 2; k < s.rank(); ++k) spatial *= s[k];
  const std::int64_t c = s[1];
  if (c < 0 || spatial < 0) {
    throw invalid_argument(fmt::format(
        "group_norm needs x's dimensions known except the batch, got shape {}", to_string(s)));
  }
  if (groups < 1 || c % groups != 0) {
    throw invalid_argument(fmt::format("group_norm: groups {} must be >= 1 and divide the {} "
                                       "channels of x (shape {})",
                                       groups, c, to_string(s)));
  }
  const output g = reshape(x, {-1, groups, c / groups * spatial});
  ints back = s.to_vector();
  back[0] = -1;
  const output xhat = reshape(standardize(g, {2}, epsilon), back);
  return add(xhat * per_channel(scale, s.rank()), per_channel(bias, s.rank()), o);
}

output instance_norm(output x, output scale, output bias, double epsilon,
                     const node_options& o) {
  const std::size_t rank = known_shape(x, "instance_norm", 3).rank();
  const output xhat = standardize(x, axes_from(2, rank), epsilon);
  return add(xhat * per_channel(scale, rank), per_channel(bias, rank), o);
}

output rms_norm(output x, output scale, std::int64_t axis, double epsilon,
                const node_options& o) {
  const shape& s = known_shape(x, "rms_norm", 1);
  const auto r = static_cast<std::int64_t>(s.rank());
  if (axis < -r || axis >= r) {
    throw invalid_argument(fmt::format("rms_norm: axis {} is out of range for x of shape {}",
                                       axis, to_string(s)));
  }
  const output ms = reduce_mean(x * x, axes_from(s.normalize_axis(axis), s.rank()), true);
  return mul(x * rsqrt(ms + epsilon), scale, o);
}

}  // namespace loom::ops
