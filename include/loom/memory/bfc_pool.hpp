// bfc_pool: a best-fit-with-coalescing pool over any upstream memory_resource.
//
// ---------------------------------------------------------------------------------------
// High-level model (read this first)
// ---------------------------------------------------------------------------------------
// The pool takes large *regions* from its upstream (all at once when preallocated, or one
// growth step at a time, up to a maximum) and carves them into *chunks*. Every byte of
// every region belongs to exactly one chunk; a chunk is either in use (handed out by
// allocate) or free. Chunks of a region form a doubly linked list in address order, so
// each chunk knows its neighbours.
//
// allocate(n): round n up to the pool's granularity (256 bytes by default), then look for
// the *smallest* free chunk that fits (best fit). Free chunks live in *bins* by size class
// (16 classes per power of two), and a bitmap says which bins are non-empty, so the search
// starts at the request's own bin and jumps to the next non-empty one in O(1). If the
// chunk found is larger than needed and the remainder is worth keeping (at least the
// granularity), it is *split*: the front part is handed out, the rest becomes a new free
// chunk. If nothing fits, the pool grows (a new region from the upstream, taken without
// holding the pool's lock), and if it cannot grow it throws loom::out_of_memory carrying
// the pool's statistics.
//
// deallocate(p): find the chunk starting at p (an array per region maps each
// granularity-sized slot to its chunk in O(1)), check the call against what was handed
// out, mark it free and *coalesce* it with its free neighbours, so that free memory always
// forms the largest blocks possible: two free chunks are never adjacent.
//
// Streams (Note [stream-ordered memory] in loom/core/stream.hpp): a free chunk remembers
// the stream it was freed on. allocate on stream S takes chunks freed on S, or chunks
// whose stream has since been synchronised. When nothing fits on S but chunks freed on
// other streams would, the pool synchronises those streams (through the
// stream_synchronizer option; on CPU there is one stream and it is a no-op), marks their
// chunks ready, and retries before it grows.
//
// trim(): hands every wholly free region back to the upstream. It detaches such regions
// under the lock, so no other thread can allocate from them, and frees them after
// releasing the lock, so other threads keep allocating meanwhile.
//
// Under AddressSanitizer the pool poisons free chunks and the padding after each block,
// so a use-after-free or an overflow into a neighbour is reported even though the memory
// never goes back to malloc.
// ---------------------------------------------------------------------------------------
#pragma once

#include <cstddef>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

/// Called by the pool to wait until all work queued on a stream so far has finished.
/// Must be thread-safe. CPU: unset (work on the default stream is always done).
using stream_synchronizer = std::function<void(stream)>;

struct bfc_pool_options {
  /// Name used in errors, dumps and misuse reports ("cpu:0", "session budget", ...).
  std::string name = "bfc_pool";
  /// Bytes taken from the upstream at construction (0: none until the first allocate).
  std::size_t initial_size = 0;
  /// Bytes of each region taken when the pool grows; a request larger than this gets a
  /// region of its own rounded up to the granularity. 0 disables growth (a fixed,
  /// preallocated pool).
  std::size_t growth_step = std::size_t{64} << 20;
  /// The most bytes the pool will ever hold from its upstream.
  std::size_t max_size = max_allocation_size;
  /// Chunk granularity: sizes are rounded up to it and chunks start at multiples of it.
  /// A power of two, at least 64. Requests with larger alignments are served by skipping
  /// ahead in a chunk; the skipped part stays free.
  std::size_t granularity = 256;
  /// Waits for a stream; see the model above. Empty: streams need no synchronisation.
  stream_synchronizer synchronize;
  /// Under ASan: poison free chunks (true unless the memory is not host-accessible, as
  /// device memory is not).
  bool poison_free_memory = true;
};

/// A snapshot of one chunk, for dumps and invariant checks.
struct chunk_info {
  std::size_t offset;          // from the start of its region
  std::size_t size;            // bytes of the chunk
  std::size_t requested;       // bytes the caller asked for (0 when free)
  bool in_use;
  stream freed_on;             // for free chunks: the stream they were freed on
  bool needs_sync;             // free, but not yet reusable on every stream
};

struct region_info {
  const void* base;
  std::size_t size;
  std::vector<chunk_info> chunks;  // in address order
};

class bfc_pool final : public memory_resource {
 public:
  /// Builds a pool over `upstream`, which must outlive it. Takes options.initial_size
  /// from the upstream at once (and throws out_of_memory when it cannot).
  /// Throws invalid_argument for options that cannot work (a granularity that is not a
  /// power of two >= 64, initial_size > max_size).
  explicit bfc_pool(memory_resource& upstream, bfc_pool_options options = {});
  /// Gives every region back to the upstream. Blocks still in use are reported as leaks
  /// through report_misuse, once per pool, with their count and bytes.
  ~bfc_pool() override;

  bfc_pool(const bfc_pool&) = delete;
  bfc_pool& operator=(const bfc_pool&) = delete;

  /// Hands every wholly free region back to the upstream; returns the bytes released.
  /// Other threads may allocate and deallocate meanwhile. Thread-safe.
  std::size_t trim();

  /// Synchronises every stream that has pending free chunks and makes them reusable on
  /// any stream. Thread-safe.
  void synchronize_streams();

  /// All the figures of memory_stats, consistent with each other (taken under the lock).
  [[nodiscard]] memory_stats get_stats() const;

  /// Resets the peaks to the current values.
  void reset_peaks();

  /// The regions and their chunks now, in address order.
  [[nodiscard]] std::vector<region_info> regions() const;

  /// A readable map of regions and chunks, with the statistics first.
  void dump(std::ostream& os) const;
  /// The same as JSON: {"name":..., "stats":{...}, "regions":[{"base":..., "size":...,
  /// "chunks":[{"offset":..,"size":..,"requested":..,"in_use":..,"stream":..}]}]}.
  [[nodiscard]] std::string dump_json() const;

  /// Checks every internal invariant (chunks tile each region, no two free neighbours,
  /// bins hold exactly the free chunks in their size class, statistics agree with the
  /// chunks) and throws loom::error describing the first one broken. For tests; O(n).
  void check_invariants() const;

  [[nodiscard]] const bfc_pool_options& options() const noexcept;
  [[nodiscard]] memory_resource& upstream() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     stream s) noexcept override;
  std::optional<memory_stats> do_stats() const override { return get_stats(); }

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace loom::memory
