// The element-wise ops' rules (include/loom/graph/ops/math_rules.hpp).
#include "loom/graph/ops/math_rules.hpp"

#include <fmt/format.h>

#include <cmath>

#include "loom/core/error.hpp"

namespace loom::math_rules {

shape broadcast_shape(std::span<const shape* const> shapes) {
  shape out;
  for (const shape* s : shapes) out = broadcast_shapes(out, *s);
  return out;
}

std::optional<shape> broadcast_shape(std::span<const std::optional<shape>* const> shapes) {
  shape out;
  for (const std::optional<shape>* s : shapes) {
    if (!*s) return std::nullopt;
    out = broadcast_shapes(out, **s);
  }
  return out;
}

void check_defined_shape(const shape& s) {
  for (auto dim : s.dims()) {
    if (dim < 0)
      throw invalid_argument(fmt::format("shape {} must be fully defined", to_string(s)));
  }
}

std::int64_t range_length(double start, double limit, double delta) {
  if (delta == 0.0) throw invalid_argument("range: delta must not be 0");
  const double n = std::ceil((limit - start) / delta);
  if (!std::isfinite(n)) {
    throw invalid_argument(
        fmt::format("range({}, {}, {}) has no finite length", start, limit, delta));
  }
  if (n <= 0) return 0;
  if (n > static_cast<double>(std::int64_t{1} << 48)) {
    throw invalid_argument(fmt::format("range({}, {}, {}) has {} elements, too many to allocate",
                                       start, limit, delta, n));
  }
  return static_cast<std::int64_t>(n);
}

}  // namespace loom::math_rules
