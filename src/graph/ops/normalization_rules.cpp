// The normalization family's shape rules (include/loom/graph/ops/normalization_rules.hpp).
#include "loom/graph/ops/normalization_rules.hpp"

#include <fmt/format.h>

#include "loom/core/error.hpp"

namespace loom::normalization_rules {

layer_norm_geometry layer_norm_geometry_of(const shape& x, std::int64_t axis,
                                           reduction_rules::rule_caller caller) {
  layer_norm_geometry g;
  g.axis = reduction_rules::normalize_axis(axis, x, caller);
  for (std::size_t k = 0; k < x.rank(); ++k) (k < g.axis ? g.lead : g.normalized).push_back(x[k]);
  g.rows = g.lead.num_elements();
  g.n = g.normalized.num_elements();
  return g;
}

void check_layer_norm_params(const layer_norm_geometry& g, const shape& x, const shape& gamma,
                             const shape& beta) {
  if (gamma != g.normalized || beta != g.normalized) {
    throw invalid_argument(
        fmt::format("gamma {} and beta {} must both have shape x.shape[{}:] = {} (x is {})",
                    to_string(gamma), to_string(beta), g.axis, to_string(g.normalized),
                    to_string(x)));
  }
}

void check_layer_norm_grad_args(const layer_norm_geometry& g, const shape& x, const shape& dy,
                                const shape& gamma, const shape& mean, const shape& rstd) {
  if (dy != x) {
    throw invalid_argument(
        fmt::format("dy of shape {} does not match x of shape {}", to_string(dy), to_string(x)));
  }
  if (gamma != g.normalized) {
    throw invalid_argument(fmt::format("gamma of shape {} does not match x.shape[{}:] = {} (x is {})",
                                       to_string(gamma), g.axis, to_string(g.normalized),
                                       to_string(x)));
  }
  if (mean != g.lead || rstd != g.lead) {
    throw invalid_argument(
        fmt::format("mean {} and rstd {} must both have shape x.shape[:{}] = {} (x is {})",
                    to_string(mean), to_string(rstd), g.axis, to_string(g.lead), to_string(x)));
  }
}

std::size_t batch_norm_channel_axis(const std::string& data_format, std::size_t rank) {
  if (data_format != "NCHW" && data_format != "NHWC") {
    throw invalid_argument(
        fmt::format("data_format '{}' is not NCHW or NHWC", data_format));
  }
  return data_format == "NHWC" && rank >= 2 ? rank - 1 : 1;
}

batch_norm_geometry batch_norm_geometry_of(const shape& x,
                                           const std::array<const shape*, 4>& params,
                                           std::size_t channel_axis,
                                           const std::array<const char*, 4>& names) {
  if (x.rank() < 2) {
    throw invalid_argument(
        fmt::format("x must have rank >= 2 ([N, C, ...]), got shape {}", to_string(x)));
  }
  batch_norm_geometry g;
  g.channels = x[channel_axis];
  g.outer = 1;
  for (std::size_t k = 0; k < channel_axis; ++k) g.outer *= x[k];
  for (std::size_t k = channel_axis + 1; k < x.rank(); ++k) g.inner *= x[k];
  for (std::size_t i = 0; i < params.size(); ++i) {
    const shape* p = params[i];
    if (p == nullptr) continue;
    const bool ok = p->rank() == 1 && ((*p)[0] < 0 || g.channels < 0 || (*p)[0] == g.channels);
    if (!ok) {
      throw invalid_argument(fmt::format("{} of shape {} must be [C] = [{}] (x is {})", names[i],
                                         to_string(*p), g.channels, to_string(x)));
    }
  }
  return g;
}

void check_batch_norm_packed(const shape& s, std::int64_t channels, bool stacked,
                             const char* what) {
  const std::int64_t w = batch_norm_packed_width(channels);
  const std::size_t rank = stacked ? 2 : 1;
  const std::int64_t last = s.rank() == rank ? s[rank - 1] : 0;
  if (s.rank() != rank || (last >= 0 && w >= 0 && last != w)) {
    throw invalid_argument(fmt::format("{} of shape {} must be [{}{}]: {} of {} channels", what,
                                       to_string(s), stacked ? "R, " : "", w,
                                       stacked ? "the ranks' packed (count, mean, m2)"
                                               : "the packed (sum dy, sum dy (x - mean), count)",
                                       channels));
  }
}

void check_batch_norm_dy(const shape& dy, const shape& x) {
  bool ok = dy.rank() == x.rank();
  for (std::size_t k = 0; ok && k < x.rank(); ++k) ok = dy[k] < 0 || x[k] < 0 || dy[k] == x[k];
  if (!ok) {
    throw invalid_argument(
        fmt::format("dy of shape {} does not match x of shape {}", to_string(dy), to_string(x)));
  }
}

}  // namespace loom::normalization_rules
