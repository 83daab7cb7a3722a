// The reduction builders composed of other ops (declared in loom/graph/ops/reduction.hpp):
// var, std and logsumexp. Their gradients are those of the ops they are built of.
#include <fmt/format.h>

#include <limits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/reduction_rules.hpp"
#include "loom/graph/ops/state.hpp"

namespace loom::ops {

output var(output x, std::vector<std::int64_t> axes, bool keepdims, double correction,
           const node_options& o) {
  const auto& s = x.type().shape;
  if (!s) throw invalid_argument("var needs x's rank to be known");
  // The count reduced (also checks the axes, as the reduction would).
  const auto g = reduction_rules::reduce_geometry_of(*s, axes, keepdims);
  std::int64_t n = 1;
  for (std::size_t k = 0; k < s->rank(); ++k) {
    if (!g.reduced[k]) continue;
    if ((*s)[k] < 0) {
      throw invalid_argument(
          fmt::format("var needs the reduced dimensions of x known, got shape {}", to_string(*s)));
    }
    n *= (*s)[k];
  }
  const output d = x - reduce_mean(x, axes, true);
  const double denom = static_cast<double>(n) - correction;
  // n - correction <= 0: the sum (0 or more) over nothing gives NaN or inf, as NumPy.
  const double scale = denom > 0.0 ? 1.0 / denom : std::numeric_limits<double>::infinity();
  return mul(reduce_sum(d * d, std::move(axes), keepdims), scalar(x.builder(), scale, x.dtype_of()),
             o);
}

output std(output x, std::vector<std::int64_t> axes, bool keepdims, double correction,
           const node_options& o) {
  return sqrt(var(x, std::move(axes), keepdims, correction), o);
}

output logsumexp(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce_log_sum_exp(x, std::move(axes), keepdims, o);
}

}  // namespace loom::ops
