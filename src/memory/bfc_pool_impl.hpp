// The state of a bfc_pool behind its pointer to implementation (private to the pool).
// bfc_pool.cpp holds the allocation paths; bfc_pool_inspect.cpp the snapshots, dumps and
// invariant checks. Everything here is guarded by mutex_ unless a comment says otherwise;
// methods whose name ends in _locked expect it held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/misuse.hpp"
#include "memory/bfc_bins.hpp"
#include "memory/bfc_chunk.hpp"
#include "memory/spin_mutex.hpp"

namespace loom::memory {

struct bfc_pool::impl {
  /// Region ids are 16 bits in a chunk.
  static constexpr std::size_t max_regions = 0xffff;

  using lock_type = std::unique_lock<detail::spin_mutex>;
  using chunk_handle = detail::chunk_handle;

  /// A region taken from the upstream. In regions_, size 0 marks a vacant entry.
  struct region {
    std::uintptr_t base = 0;
    std::size_t size = 0;                   // bytes, a multiple of the granularity
    chunk_handle first = detail::no_chunk;  // its lowest chunk: never merged away
    // Granule index -> the chunk that starts there. Entries of chunks merged away are left
    // stale; a lookup accepts an entry only when the chunk it names starts at the index.
    std::unique_ptr<chunk_handle[]> slots;
  };
  /// The regions in address order, for finding the region of a pointer.
  struct region_ref {
    std::uintptr_t base;
    std::size_t size;
    std::uint16_t id;  // index into regions_
  };
  /// Free chunks freed on `owner` and not synchronised since. Bound to its owner while
  /// non-empty; an empty one is rebound to the next stream that needs one.
  struct pending_bins {
    explicit pending_bins(stream s) : owner(s) {}
    stream owner;
    detail::free_bins bins;
  };
  /// One allocate call, for growth and error messages.
  struct request {
    std::size_t bytes;
    std::size_t alignment;
    stream on;
    std::size_t search;  // granules to look for: the rounded size plus alignment slack
  };
  /// A deallocate call that does not match what the pool handed out.
  struct misuse_case {
    misuse_kind kind;
    const char* what;                // why, as a clause
    std::size_t expected;            // requested bytes of the block (0 when unknown)
    std::size_t expected_alignment;  // its alignment (0 when unknown)
  };

  impl(memory_resource& upstream, bfc_pool_options options);
  ~impl();
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;

  // ---- bfc_pool's operations (bfc_pool.cpp); each takes the lock itself
  void* allocate(std::size_t bytes, std::size_t alignment, stream s);
  void deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept;
  std::size_t trim();
  void synchronize_streams();
  memory_stats stats() const;
  void reset_peaks();

  // ---- snapshots and checks (bfc_pool_inspect.cpp)
  std::vector<region_info> regions_locked() const;
  void check_invariants_locked() const;
  memory_stats stats_locked() const noexcept;

  // ---- helpers (bfc_pool.cpp), all with the lock held
  /// The granules of the chunk for a request of `bytes`: at least one.
  [[nodiscard]] std::size_t granules_for(std::size_t bytes) const noexcept {
    return bytes == 0 ? 1 : (bytes + granularity_ - 1) >> shift_;
  }
  /// Bytes of `granules` granules.
  [[nodiscard]] std::size_t bytes_of(std::size_t granules) const noexcept {
    return granules << shift_;
  }
  /// The address of chunk `c`'s first byte.
  [[nodiscard]] std::uintptr_t addr_of(const detail::chunk& c) const noexcept {
    return regions_[c.region].base + bytes_of(c.offset);
  }
  /// The bytes a caller asked for of in-use chunk `c`.
  [[nodiscard]] std::size_t requested_of(const detail::chunk& c) const noexcept {
    return bytes_of(c.size) - c.slack;
  }
  /// The free bins with the given id: 0 the ready bins, i + 1 pending_[i].
  detail::free_bins& bins(std::uint32_t id) noexcept {
    return id == 0 ? ready_ : pending_[id - 1]->bins;
  }
  [[nodiscard]] const detail::free_bins& bins(std::uint32_t id) const noexcept {
    return id == 0 ? ready_ : pending_[id - 1]->bins;
  }
  [[nodiscard]] std::uint32_t pending_id(stream s) const noexcept;  // 0: none bound to s
  [[nodiscard]] const region_ref* region_of(std::uintptr_t addr) const noexcept;
  [[nodiscard]] chunk_handle chunk_at(std::uintptr_t addr) const noexcept;
  [[nodiscard]] chunk_handle find_fit(std::size_t search, stream s) const noexcept;
  chunk_handle find_fit_after_sync(lock_type& lock, const request& r);
  [[nodiscard]] std::vector<stream> streams_to_sync(std::size_t search) const;
  [[nodiscard]] std::vector<stream> streams_of_free_regions() const;
  chunk_handle grow(lock_type& lock, const request& r);
  region take_region(lock_type& lock, std::size_t size, const request& r);
  region acquire(std::size_t size) const;              // without the lock
  void return_region(const region& r) const noexcept;  // without the lock
  void give_back(lock_type& lock, region r) noexcept;
  void reserve_for_attach();
  void attach(region r) noexcept;
  chunk_handle carve(chunk_handle h, std::size_t granules, std::size_t alignment) noexcept;
  chunk_handle split(chunk_handle h, std::uint32_t front) noexcept;
  chunk_handle coalesce(chunk_handle h) noexcept;
  void release(chunk_handle h, std::uintptr_t addr, stream s) noexcept;
  std::uint32_t bins_for_free(stream s) noexcept;
  void synchronize(lock_type& lock, const std::vector<stream>& streams);
  void make_ready(stream s, std::uint64_t horizon) noexcept;
  [[noreturn]] void fail(lock_type& lock, const request& r, const std::string& reason);
  void report(lock_type& lock, const misuse_case& m, const void* p, std::size_t bytes,
              std::size_t alignment, stream s) noexcept;
  void report_leaks() const noexcept;
  void poison(std::uintptr_t addr, std::size_t bytes) const noexcept;
  void unpoison(std::uintptr_t addr, std::size_t bytes) const noexcept;

  // ---- configuration (immutable after construction: read without the lock)
  memory_resource& upstream_;
  const bfc_pool_options options_;
  const std::string label_;  // "bfc_pool 'name'"
  const unsigned shift_;     // log2 of the granularity
  const std::size_t granularity_;
  const std::size_t region_alignment_;  // max(granularity, options.region_alignment)
  const std::size_t max_region_;        // bytes of the largest region chunks can index
  const std::size_t step_;              // growth_step rounded up to the granularity

  // ---- state
  mutable detail::spin_mutex mutex_;
  detail::chunk_table chunks_;
  std::vector<region> regions_;  // by id; at most max_regions
  std::vector<region_ref> by_address_;
  // A copy of the entry of by_address_ that chunk_at() found last, tried before searching
  // (frees come in runs from one region); size 0 when none, as trim() leaves it.
  mutable region_ref last_region_{0, 0, 0};
  detail::free_bins ready_;  // free chunks usable on any stream (bins id 0)
  std::vector<std::unique_ptr<pending_bins>> pending_;  // bins id i + 1
  memory_stats stats_;  // the counters; stats_locked() derives the rest (allocations_in_use
                        // too: num_allocs - num_deallocs)
  std::size_t in_use_chunk_bytes_ = 0;
  std::size_t held_ = 0;        // bytes held from the upstream, taken or being taken/returned
  std::size_t growing_ = 0;     // growths between reserving bytes and attaching the region
  std::uint64_t free_seq_ = 0;  // deallocations so far; orders frees against syncs
};

}  // namespace loom::memory
