// next_instance_id: ids for objects that key thread_local caches. Private to the memory
// room.
#pragma once

#include <atomic>
#include <cstdint>

namespace loom::memory::detail {

/// A process-wide unique, never reused, non-zero id. Objects that key thread_local caches
/// use it rather than their address: a new object at a reused address would match a stale
/// cache entry; a new id cannot.
inline std::uint64_t next_instance_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace loom::memory::detail
