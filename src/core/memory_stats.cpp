#include "loom/core/memory_stats.hpp"

#include <fmt/format.h>

#include <array>

namespace loom {

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<const char*, 6> units{"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  auto value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, units[unit]);
}

std::string to_string(const memory_stats& s) {
  return fmt::format(
      "in use {} in {} blocks (peak {}), reserved {} in {} regions (peak {}), free {}, "
      "largest free block {}, fragmentation {:.1f}%, unusable {}, {} allocs, {} deallocs, "
      "{} failed",
      format_bytes(s.bytes_in_use), s.allocations_in_use, format_bytes(s.peak_bytes_in_use),
      format_bytes(s.bytes_reserved), s.num_regions, format_bytes(s.peak_bytes_reserved),
      format_bytes(s.free_bytes), format_bytes(s.largest_free_block),
      100.0 * s.fragmentation(), format_bytes(s.unusable_bytes), s.num_allocs, s.num_deallocs,
      s.num_failed_allocs);
}

}  // namespace loom
