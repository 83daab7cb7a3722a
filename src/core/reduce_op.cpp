#include "loom/core/reduce_op.hpp"

#include <fmt/format.h>

#include "loom/core/error.hpp"

namespace loom {

std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      return "sum";
    case reduce_op::avg:
      return "avg";
    case reduce_op::max:
      return "max";
    case reduce_op::min:
      return "min";
    case reduce_op::prod:
      return "prod";
  }
  return "?";
}

reduce_op reduce_op_from_string(std::string_view name) {
  for (const reduce_op op :
       {reduce_op::sum, reduce_op::avg, reduce_op::max, reduce_op::min, reduce_op::prod}) {
    if (to_string(op) == name) return op;
  }
  throw invalid_argument(
      fmt::format("unknown reduction '{}' (sum, avg, max, min or prod)", name));
}

std::string reduce_op_refusal(reduce_op op, dtype t) {
  if (op == reduce_op::avg && !is_floating(t)) {
    return fmt::format("avg needs a floating-point dtype, not {}", to_string(t));
  }
  return {};
}

}  // namespace loom
