// The chunks of a bfc_pool and the table that holds them (private to the pool).
//
// Chunk metadata lives outside the memory it describes, in one vector indexed by 32-bit
// handles, so the pool never touches the memory it hands out (device memory works the
// same as host memory) and no allocate or deallocate allocates metadata on the heap once
// the table has grown to the pool's working size. Handles of destroyed chunks are kept on
// an intrusive spare list and reused. A chunk takes 32 bytes, two to a cache line, so the
// metadata of a pool with thousands of chunks stays in the first-level cache: offsets and
// sizes count granules, and what matters only while a chunk is pending on a stream lives
// in a parallel array of stamps that the pool touches only when streams need synchronising.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "loom/core/stream.hpp"

namespace loom::memory::detail {

using chunk_handle = std::uint32_t;
inline constexpr chunk_handle no_chunk = 0xffff'ffffU;

/// The most granules a chunk, and so a region, can span.
inline constexpr std::size_t max_chunk_granules = 0xffff'ffffU;

enum class chunk_state : std::uint8_t { spare, free, in_use };

/// One chunk: a run of granules of one region, in use or free.
struct alignas(32) chunk {
  std::uint32_t offset = 0;          // granules from the start of its region
  std::uint32_t size = 0;            // granules
  chunk_handle prev = no_chunk;      // address-order neighbours within the region
  chunk_handle next = no_chunk;      // (for spare handles: the next spare)
  chunk_handle bin_prev = no_chunk;  // free: links of its bin's list
  chunk_handle bin_next = no_chunk;
  union {
    std::uint32_t slack;     // in use: chunk bytes minus the bytes requested (<= granularity)
    std::uint32_t bins = 0;  // free: which free_bins holds it (0: the ready bins)
  };
  std::uint16_t region = 0;  // index of the region holding it
  chunk_state state = chunk_state::spare;
  std::uint8_t alignment_log2 = 0;  // in use: log2 of the alignment asked for
};
static_assert(sizeof(chunk) == 32, "two chunks should fill one cache line");

/// When and on which stream a free chunk was (last) freed; read for pending chunks only.
struct free_stamp {
  std::uint64_t seq = 0;  // the pool's deallocation counter at the free
  stream on;
};

/// The chunks of one pool, addressed by handle. Not thread-safe: the pool's lock guards it.
class chunk_table {
 public:
  chunk& operator[](chunk_handle h) noexcept { return chunks_[h]; }
  const chunk& operator[](chunk_handle h) const noexcept { return chunks_[h]; }
  free_stamp& stamp(chunk_handle h) noexcept { return stamps_[h]; }
  [[nodiscard]] const free_stamp& stamp(chunk_handle h) const noexcept { return stamps_[h]; }

  /// Makes sure that `n` chunks can be created without allocating. Throws std::bad_alloc.
  void reserve(std::size_t n) {
    while (spares_ < n) {
      if (chunks_.size() >= no_chunk) throw std::bad_alloc();
      if (stamps_.size() == chunks_.size()) stamps_.emplace_back();
      chunks_.emplace_back();
      destroy(static_cast<chunk_handle>(chunks_.size() - 1));
    }
  }

  /// A new chunk, free, whose other fields the caller sets (each one, in place: copying
  /// a whole chunk just built field by field would stall on store forwarding); needs a
  /// prior reserve().
  chunk_handle create() noexcept {
    const chunk_handle h = spare_head_;
    spare_head_ = chunks_[h].next;
    --spares_;
    chunks_[h].state = chunk_state::free;
    return h;
  }

  /// Returns `h` to the spare list; a stale handle to it then names no chunk.
  void destroy(chunk_handle h) noexcept {
    chunk& c = chunks_[h];
    c.state = chunk_state::spare;
    c.next = spare_head_;
    spare_head_ = h;
    ++spares_;
  }

  /// Handles that name a chunk (created and not destroyed).
  [[nodiscard]] std::size_t live() const noexcept { return chunks_.size() - spares_; }
  /// One past the largest handle ever created.
  [[nodiscard]] std::size_t handles() const noexcept { return chunks_.size(); }

 private:
  std::vector<chunk> chunks_;
  std::vector<free_stamp> stamps_;  // by handle; at least as long as chunks_
  chunk_handle spare_head_ = no_chunk;
  std::size_t spares_ = 0;
};

}  // namespace loom::memory::detail
