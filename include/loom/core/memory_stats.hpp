// memory_stats: the figures a memory resource reports about itself.
//
// A plain value type, in core so that errors (out_of_memory) can carry it. Each resource
// fills what it knows: a pool fills every field; the statistics adaptor fills the byte and
// count fields; a field a resource does not track stays 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

struct memory_stats {
  // Bytes handed out and not yet given back, as requested by the callers.
  std::size_t bytes_in_use = 0;
  std::size_t peak_bytes_in_use = 0;
  // Bytes of all allocations ever made (a running total).
  std::uint64_t total_bytes_allocated = 0;
  // Bytes this resource holds from its upstream (for a pool: its regions).
  std::size_t bytes_reserved = 0;
  std::size_t peak_bytes_reserved = 0;
  // Counts.
  std::uint64_t allocations_in_use = 0;  // live blocks
  std::uint64_t num_allocs = 0;          // successful allocate calls
  std::uint64_t num_deallocs = 0;        // deallocate calls that freed a block
  std::uint64_t num_failed_allocs = 0;   // allocate calls that threw out_of_memory
  // Pools only.
  std::size_t free_bytes = 0;           // reserved bytes in free chunks
  std::size_t largest_free_block = 0;   // the largest single free chunk
  std::size_t unusable_bytes = 0;       // reserved, in use, but beyond what callers asked
                                        // for (rounding and alignment padding)
  std::uint64_t num_regions = 0;        // regions held from the upstream

  /// External fragmentation: 1 - largest_free_block / free_bytes; 0 when nothing is free.
  /// 0 means every free byte is in one block; close to 1 means free memory is scattered
  /// in pieces too small for a large request.
  [[nodiscard]] double fragmentation() const noexcept {
    return free_bytes == 0 ? 0.0
                           : 1.0 - static_cast<double>(largest_free_block) /
                                       static_cast<double>(free_bytes);
  }
};

/// One line, human-readable: "in use 1.5 MiB (peak 2 MiB), reserved 8 MiB, ...".
std::string to_string(const memory_stats& s);

/// "1.50 MiB", "512 B": bytes in binary units for messages and reports.
std::string format_bytes(std::uint64_t bytes);

}  // namespace loom
