// statistics_adaptor: counts what passes through it to its upstream.
//
// It keeps the bytes and blocks in use, the peak of the bytes in use, running totals,
// failed requests, and a histogram of requests by power-of-two size class:
//
//   loom::memory::statistics_adaptor stats{pool};
//   void* p = stats.allocate(1000);
//   stats.get_stats().bytes_in_use;                          // 1000
//   stats.histogram()[statistics_adaptor::size_class(1000)];  // {num_allocs 1, in_use 1}
//
// Cost: one atomic read-modify-write per call, on the bytes in use (what makes the peak
// exact); every other figure lives in per-thread shards that only their thread writes
// (Note [per-thread shards] in loom/memory/detail/thread_shards.hpp).
//
// An adaptor is equal (is_equal) only to itself: a block must go back through the
// adaptor that handed it out, or the figures would be wrong.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "loom/memory/detail/thread_shards.hpp"
#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

/// Counts for one size class of statistics_adaptor's histogram.
struct size_class_counts {
  std::uint64_t num_allocs = 0;  // successful allocations in this class, ever
  std::uint64_t in_use = 0;      // of those, not yet given back

  friend constexpr bool operator==(const size_class_counts&, const size_class_counts&) = default;
};

class statistics_adaptor final : public memory_resource {
 public:
  /// Size classes: class k holds requests of more than 2^(k-1) and at most 2^k bytes;
  /// class 0 holds requests of 0 and 1 byte. Requests are at most max_allocation_size
  /// (2^62) bytes, hence 63 classes.
  static constexpr std::size_t num_size_classes = 63;
  /// The size class of a request of `bytes` (<= max_allocation_size) bytes.
  [[nodiscard]] static constexpr std::size_t size_class(std::size_t bytes) noexcept {
    return bytes <= 1 ? 0 : static_cast<std::size_t>(std::bit_width(bytes - 1));
  }
  using histogram_type = std::array<size_class_counts, num_size_classes>;

  /// Counts calls to `upstream`, which must outlive the adaptor. Throws std::bad_alloc.
  explicit statistics_adaptor(memory_resource& upstream);
  ~statistics_adaptor() override;

  statistics_adaptor(const statistics_adaptor&) = delete;
  statistics_adaptor& operator=(const statistics_adaptor&) = delete;

  /// The figures now: bytes_in_use, peak_bytes_in_use, total_bytes_allocated,
  /// allocations_in_use, num_allocs, num_deallocs, num_failed_allocs (upstream threw
  /// std::bad_alloc; requests that the interface rejects before reaching the adaptor, such
  /// as sizes above max_allocation_size, are not counted); other fields are 0. Sizes are
  /// those the callers pass, trusted on deallocate. bytes_in_use and the peak are exact at
  /// every moment. The running counts are exact whenever no call is in flight; while calls
  /// run on other threads each lies between its values at the start and at the end of
  /// this call. allocations_in_use, a difference of two counts, is exact only when no call
  /// is in flight (and never below 0). Thread-safe.
  [[nodiscard]] memory_stats get_stats() const;

  /// Allocations by size class (see size_class()), with the same exactness as the counts
  /// of get_stats(). Thread-safe.
  [[nodiscard]] histogram_type histogram() const;

  /// Sets the peak to the bytes in use now. Thread-safe.
  void reset_peaks() noexcept;

  /// The resource this adaptor forwards to.
  [[nodiscard]] memory_resource& upstream() const noexcept { return upstream_; }

 private:
  // What every thread updates with atomic read-modify-writes.
  struct figures {
    std::atomic<std::size_t> in_use{0};
    std::atomic<std::size_t> peak{0};
  };
  struct shard;  // one thread's counts (src/memory/statistics_adaptor.cpp)
  struct count_sums;

  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  std::optional<memory_stats> do_stats() const override { return get_stats(); }

  [[nodiscard]] count_sums sum() const;

  memory_resource& upstream_;
  figures figures_;
  detail::thread_shards<figures, shard> shards_;
  // Counts of threads without a shard (see thread_shards::local), updated atomically.
  std::unique_ptr<shard> spill_;
};

}  // namespace loom::memory
