// How a collective combines values: the reductions of loom::distributed's communicators
// and of the collective ops in graphs, with the one rule about which dtypes each takes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "loom/core/dtype.hpp"

namespace loom {

/// sum, avg (the sum divided by the number of values), max, min, prod. For bool, sum and
/// max are "any", prod and min "all".
enum class reduce_op : std::uint8_t { sum, avg, max, min, prod };

/// "sum", "avg", "max", "min", "prod".
[[nodiscard]] std::string_view to_string(reduce_op op) noexcept;
/// The reduce_op named `name`; throws loom::invalid_argument for another name, listing the
/// names.
[[nodiscard]] reduce_op reduce_op_from_string(std::string_view name);
/// Why `op` cannot combine elements of `t` (avg needs a floating-point dtype), or "" when it
/// can.
[[nodiscard]] std::string reduce_op_refusal(reduce_op op, dtype t);

}  // namespace loom
