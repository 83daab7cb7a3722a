// describe_bytes: byte counts for error messages and reports. Private to the memory room.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>

#include "loom/core/memory_stats.hpp"

namespace loom::memory::detail {

/// "512 bytes", or "1048576 bytes (1.00 MiB)": exact, and readable when large.
inline std::string describe_bytes(std::size_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  return fmt::format("{} bytes ({})", bytes, format_bytes(bytes));
}

}  // namespace loom::memory::detail
