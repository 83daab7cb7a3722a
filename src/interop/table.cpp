#include "loom/interop/table.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_set>

namespace loom::interop {

const tensor& table::column(std::string_view name) const {
  for (std::size_t i = 0; i < names.size() && i < columns.size(); ++i) {
    if (names[i] == name) return columns[i];
  }
  throw not_found(
      fmt::format("table has no column '{}'; its columns are: {}", name, fmt::join(names, ", ")));
}

void table::validate() const {
  if (names.size() != columns.size()) {
    throw invalid_argument(
        fmt::format("table has {} names for {} columns", names.size(), columns.size()));
  }
  std::unordered_set<std::string_view> seen;
  for (std::size_t i = 0; i < columns.size(); ++i) {
    const tensor& c = columns[i];
    if (!c.defined()) {
      throw invalid_argument(fmt::format("table column '{}' (#{}) is undefined", names[i], i));
    }
    if (c.rank() != 1) {
      throw invalid_argument(fmt::format("table column '{}' (#{}) is {}: columns must be 1-D",
                                         names[i], i, c.describe()));
    }
    if (c.num_elements() != columns.front().num_elements()) {
      throw invalid_argument(fmt::format(
          "table column '{}' (#{}) has {} rows but column '{}' has {}: columns must have one "
          "length",
          names[i], i, c.num_elements(), names.front(), columns.front().num_elements()));
    }
    if (!seen.insert(names[i]).second) {
      throw invalid_argument(fmt::format("table has two columns named '{}'", names[i]));
    }
  }
}

}  // namespace loom::interop
