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
// allocate(n): round n up to the pool's granularity (256 bytes by default; n = 0 takes one
// granule), then look for the *smallest* free chunk that fits (best fit; of equal chunks,
// the one put back most recently, which is the warmest in the caches). Free chunks live
// in *bins* by size class (16 classes per power of two), each bin sorted by size, and a
// bitmap says which bins are non-empty, so the search starts at the request's own bin and
// jumps to the next non-empty one in O(1). If the chunk found is larger than needed, it is
// *split*: the front part is handed out, the rest (a multiple of the granularity, so worth
// keeping) becomes a new free chunk. Chunks start at multiples of the granularity, so
// smaller alignments come free; a larger one looks for n + alignment - granularity bytes
// and splits off the unaligned front as a free chunk too. If nothing fits, the pool grows
// (a new region from the upstream, taken without holding the pool's lock), and if it
// cannot grow it throws loom::out_of_memory carrying the pool's statistics. A chunk spans
// at most 2^32 - 1 granules (1 TiB at the default granularity) and a pool holds at most
// 65535 regions; requests beyond either fail the same way.
//
// deallocate(p): find the chunk starting at p (an array per region maps each
// granularity-sized slot to its chunk in O(1)), check the call against what was handed
// out, mark it free and *coalesce* it with its free neighbours, so that free memory always
// forms the largest blocks possible: two free chunks are never adjacent (unless they are
// in different stream states, below).
//
// Streams (Note [stream-ordered memory] in loom/core/stream.hpp): a free chunk remembers
// the stream it was freed on. allocate on stream S takes chunks freed on S, or chunks
// whose stream has since been synchronised. When nothing fits on S but chunks freed on
// other streams would, the pool synchronises those streams (through the
// stream_synchronizer option; on CPU there is one stream and it is a no-op), marks their
// chunks ready, and retries before it grows.
//   In detail: with options.synchronize set, a chunk freed on S is *pending* on S; without
// it, every freed chunk is *ready* at once. Ready chunks and the pending chunks of each
// stream are kept in separate bins, so a search looks only at chunks usable on its stream.
// Free chunks coalesce only with free neighbours in the same state (both ready, or both
// pending on the same stream); so two adjacent free chunks are always in different states,
// and they coalesce once synchronisation makes both ready. A search that fails on S waits
// for every stream with pending chunks in a run of adjacent free chunks that, made ready,
// would hold the request. The pool calls options.synchronize without holding its lock, so
// frees keep coming meanwhile; a chunk freed on S after the wait began stays pending.
//
// trim(): hands every wholly free region back to the upstream. It first synchronises the
// streams with pending chunks in such regions, then detaches the regions under the lock,
// so no other thread can allocate from them, and frees them after releasing the lock, so
// other threads keep allocating meanwhile.
//
// The lock: one mutex (spinning briefly, then sleeping; no atomic instruction at all while
// the process has a single thread, as glibc's malloc does) guards the pool's state. It is
// never held while the pool calls the upstream or reports misuse, nor while it calls
// options.synchronize (but for the out-of-memory case in stream_synchronizer's contract).
// Chunk metadata lives in a table outside the pooled memory (the pool never touches the
// bytes it hands out, so device memory works alike), and allocate and deallocate allocate
// nothing on the heap once the table has grown.
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
/// Must be thread-safe and should not throw: an exception propagates out of allocate,
/// trim and synchronize_streams, but terminates the program when the pool calls it from
/// deallocate (only when it cannot record another stream for lack of memory); from the
/// pool's destructor it is reported on stderr and the pool's regions are not returned (work
/// may still use them). The pool calls it without holding its lock (except in that
/// out-of-memory case), so it may use the pool. CPU: unset (work on the default stream is
/// always done).
using stream_synchronizer = std::function<void(stream)>;

/// How a bfc_pool takes, carves and checks its memory.
struct bfc_pool_options {
  /// Name used in errors, dumps and misuse reports ("cpu:0", "session budget", ...).
  std::string name = "bfc_pool";
  /// Bytes taken from the upstream at construction (0: none until the first allocate).
  std::size_t initial_size = 0;
  /// Bytes of each region taken when the pool grows (rounded up to the granularity); a
  /// request larger than this gets a region of its own. A growth that would pass max_size
  /// takes what is left instead, when the request fits in it; when the upstream refuses a
  /// step, the pool asks once more for just the request. 0 disables growth (a fixed,
  /// preallocated pool).
  std::size_t growth_step = std::size_t{64} << 20;
  /// The most bytes the pool will ever hold from its upstream, counting regions being
  /// taken or given back, so threads growing at once cannot pass it either.
  std::size_t max_size = max_allocation_size;
  /// Chunk granularity: sizes are rounded up to it and chunks start at multiples of it
  /// (regions are taken aligned to max(granularity, region_alignment)). A power of two from 64 to
  /// 1 GiB. Requests with larger alignments look for size + alignment - granularity bytes
  /// and skip ahead in the chunk found; the skipped front stays free.
  std::size_t granularity = 256;
  /// The alignment each region is asked of the upstream with (at least the granularity): a
  /// power of two. A page suits host memory; CUDA's resources guarantee 256 bytes
  /// (memory::cuda_allocation_alignment) and refuse more, so their pools ask for that.
  std::size_t region_alignment = 4096;
  /// Waits for a stream; see the model above. Empty: streams need no synchronisation.
  stream_synchronizer synchronize;
  /// Under ASan: poison free chunks (true unless the memory is not host-accessible, as
  /// device memory is not).
  bool poison_free_memory = true;
};

/// A snapshot of one chunk, for dumps and invariant checks.
struct chunk_info {
  std::size_t offset;     // from the start of its region
  std::size_t size;       // bytes of the chunk
  std::size_t requested;  // bytes the caller asked for (0 when free)
  bool in_use;
  stream freed_on;  // for pending chunks: the stream they wait for (else default)
  bool needs_sync;  // free, but pending: not yet reusable on every stream
};

/// A snapshot of one region and its chunks.
struct region_info {
  const void* base;
  std::size_t size;
  std::vector<chunk_info> chunks;  // in address order
};

/// The pool; see the model at the top of this file. Thread-safe, except destruction.
class bfc_pool final : public memory_resource {
 public:
  /// Builds a pool over `upstream`, which must outlive it. Takes options.initial_size
  /// (rounded up to the granularity) from the upstream at once, and throws out_of_memory
  /// when it cannot. Throws invalid_argument for options that cannot work (a granularity
  /// that is not a power of two from 64 to 1 GiB, initial_size > max_size or beyond the
  /// largest region, or no initial size and no growth).
  explicit bfc_pool(memory_resource& upstream, bfc_pool_options options = {});
  /// Synchronises the streams of pending chunks and gives every region back to the
  /// upstream. Blocks still in use are reported once, as one misuse_kind::leak report
  /// naming their count and bytes. No other thread may use the pool meanwhile.
  ~bfc_pool() override;

  bfc_pool(const bfc_pool&) = delete;
  bfc_pool& operator=(const bfc_pool&) = delete;

  /// Hands every wholly free region back to the upstream; returns the bytes released.
  /// A fixed pool (growth_step 0) keeps its regions, since it could not take them back.
  /// Other threads may allocate and deallocate meanwhile. Thread-safe. Propagates what
  /// options.synchronize throws (and then releases nothing).
  std::size_t trim();

  /// Synchronises every stream that has pending free chunks and makes them reusable on
  /// any stream (chunks freed while it waits stay pending). Thread-safe.
  void synchronize_streams();

  /// All the figures of memory_stats, consistent with each other (taken under the lock).
  [[nodiscard]] memory_stats get_stats() const;

  /// Resets the peaks to the current values. Thread-safe.
  void reset_peaks();

  /// The regions and their chunks now, in address order. Thread-safe.
  [[nodiscard]] std::vector<region_info> regions() const;

  /// A readable map of regions and chunks, with the statistics first: a line
  /// "bfc_pool 'name': <to_string(stats)>", then per region a line "region i: base ..."
  /// and a table of its chunks (offset, size, requested, state: in_use, free, or
  /// pending:<stream> for a free chunk waiting for its stream). Thread-safe.
  void dump(std::ostream& os) const;
  /// The same as JSON: {"name":..., "stats":{<every memory_stats field>}, "regions":
  /// [{"base":<address as an integer>, "size":..., "chunks":[{"offset":.., "size":..,
  /// "requested":.., "in_use":.., "stream":<freed_on as an integer>, "needs_sync":..}]}]}.
  /// Thread-safe.
  [[nodiscard]] std::string dump_json() const;

  /// Checks every internal invariant (chunks tile each region, no two free neighbours,
  /// bins hold exactly the free chunks in their size class, statistics agree with the
  /// chunks) and throws loom::error describing the first one broken. For tests; O(n).
  void check_invariants() const;

  /// The options the pool was built with.
  [[nodiscard]] const bfc_pool_options& options() const noexcept;
  /// The resource the pool takes its regions from.
  [[nodiscard]] memory_resource& upstream() const noexcept;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  std::optional<memory_stats> do_stats() const override { return get_stats(); }

  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace loom::memory
