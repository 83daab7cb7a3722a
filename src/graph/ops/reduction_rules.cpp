// The reduction family's shape rules (include/loom/graph/ops/reduction_rules.hpp).
#include "loom/graph/ops/reduction_rules.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/core/error.hpp"

namespace loom::reduction_rules {

std::size_t normalize_axis(std::int64_t axis, const shape& s, rule_caller caller) {
  const auto r = static_cast<std::int64_t>(s.rank());
  if (axis < -r || axis >= r) {
    if (caller == rule_caller::inference) {
      throw invalid_argument(fmt::format("axis {} is out of range for input of shape {} (rank {})",
                                         axis, to_string(s), r));
    }
    throw invalid_argument(
        fmt::format("axis {} is out of range for input of shape {}", axis, to_string(s)));
  }
  return s.normalize_axis(axis);
}

axis_split split_at(const shape& s, std::size_t axis) {
  axis_split r;
  for (std::size_t k = 0; k < s.rank(); ++k) {
    if (k < axis)
      r.outer *= s[k];
    else if (k == axis)
      r.n = s[k];
    else
      r.inner *= s[k];
  }
  return r;
}

const char* op_name(reduce_kind k) noexcept {
  switch (k) {
    case reduce_kind::sum:
      return "reduce_sum";
    case reduce_kind::mean:
      return "reduce_mean";
    case reduce_kind::max:
      return "reduce_max";
    case reduce_kind::min:
      return "reduce_min";
    case reduce_kind::prod:
      return "reduce_prod";
    case reduce_kind::l1:
      return "reduce_l1";
    case reduce_kind::l2:
      return "reduce_l2";
    case reduce_kind::sum_square:
      return "reduce_sum_square";
    case reduce_kind::log_sum:
      return "reduce_log_sum";
    case reduce_kind::log_sum_exp:
      return "reduce_log_sum_exp";
    case reduce_kind::any:
      return "reduce_any";
    case reduce_kind::all:
      return "reduce_all";
  }
  return "reduce";
}

reduce_geometry reduce_geometry_of(const shape& s, const std::vector<std::int64_t>& axes,
                                   bool keepdims, rule_caller caller) {
  reduce_geometry g;
  g.reduced.assign(s.rank(), axes.empty() ? 1 : 0);
  for (const auto a : axes) {
    const std::size_t k = normalize_axis(a, s, caller);
    if (g.reduced[k]) {
      if (caller == rule_caller::inference) {
        throw invalid_argument(fmt::format("axes {} name axis {} twice (input of shape {})",
                                           fmt::join(axes, ", "), k, to_string(s)));
      }
      throw invalid_argument(
          fmt::format("axes name axis {} twice (input of shape {})", k, to_string(s)));
    }
    g.reduced[k] = 1;
  }
  for (std::size_t k = 0; k < s.rank(); ++k) {
    if (g.reduced[k]) {
      g.num_red *= s[k];
      if (keepdims) g.output.push_back(1);
    } else {
      g.num_out *= s[k];
      g.output.push_back(s[k]);
    }
  }
  return g;
}

void check_identity(reduce_kind k, const reduce_geometry& g, const shape& s) {
  if (g.num_red != 0 || !(k == reduce_kind::max || k == reduce_kind::min)) return;
  std::size_t axis = 0;
  while (axis < s.rank() && !(g.reduced[axis] && s[axis] == 0)) ++axis;
  throw invalid_argument(fmt::format("{} of an empty axis (axis {} of input shape {}) has no identity",
                                     op_name(k), axis, to_string(s)));
}

void check_sum_output_type(dtype in, dtype out) {
  if (out == in || (out == dtype::f32 && (in == dtype::f16 || in == dtype::bf16))) return;
  throw invalid_argument(fmt::format(
      "reduce_sum of {} cannot give {}: output_type is the input's type, or float32 for a "
      "float16 or bfloat16 input",
      to_string(in), to_string(out)));
}

along_axis along_axis_of(const shape& s, std::int64_t axis) {
  along_axis a;
  a.axis = normalize_axis(axis, s);
  a.split = split_at(s, a.axis);
  return a;
}

shape argmax_output(const shape& s, std::size_t axis, bool keepdims) {
  shape out;
  for (std::size_t k = 0; k < s.rank(); ++k) {
    if (k != axis) {
      out.push_back(s[k]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  return out;
}

void check_argmax_axis(const along_axis& a, const shape& s, const char* op) {
  if (a.split.n == 0) {
    throw invalid_argument(
        fmt::format("{} of an empty axis (axis {} of input shape {})", op, a.axis, to_string(s)));
  }
}

namespace {
// True when two dims may be equal (either unknown, or equal).
bool compatible(std::int64_t a, std::int64_t b) {
  return a < 0 || b < 0 || a == b;
}
}  // namespace

std::pair<shape, shape> xent_outputs(const std::optional<shape>& logits,
                                     const std::optional<shape>& labels) {
  if (logits && logits->rank() != 2) {
    throw invalid_argument(fmt::format("logits must be [N, C], got shape {}", to_string(*logits)));
  }
  if (labels && labels->rank() != 1) {
    throw invalid_argument(fmt::format("labels must be [N], got shape {}", to_string(*labels)));
  }
  std::int64_t n = shape::unknown;
  std::int64_t classes = shape::unknown;
  if (logits) {
    n = (*logits)[0];
    classes = (*logits)[1];
  }
  if (labels) {
    const std::int64_t ln = (*labels)[0];
    if (!compatible(n, ln)) {
      throw invalid_argument(
          fmt::format("labels of shape {} do not match logits of shape {} (N differs)",
                      to_string(*labels), to_string(*logits)));
    }
    if (n < 0) n = ln;
  }
  return {shape{n}, shape{n, classes}};
}

void check_xent_shapes(const shape& logits, const shape& labels) {
  if (logits.rank() != 2 || labels.rank() != 1 || labels[0] != logits[0]) {
    throw invalid_argument(fmt::format("logits {} must be [N, C] and labels {} must be [N]",
                                       to_string(logits), to_string(labels)));
  }
}

}  // namespace loom::reduction_rules
