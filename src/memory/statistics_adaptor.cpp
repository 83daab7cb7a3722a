#include "loom/memory/statistics_adaptor.hpp"

#include <algorithm>
#include <new>

#include "loom/memory/detail/single_threaded.hpp"

namespace loom::memory {
namespace {

using counter = std::atomic<std::uint64_t>;
constexpr std::size_t num_classes = statistics_adaptor::num_size_classes;

// a - b, or 0 when a snapshot taken during concurrent calls saw b's event before a's.
std::uint64_t difference(std::uint64_t a, std::uint64_t b) noexcept {
  return a > b ? a - b : 0;
}

}  // namespace

// One thread's counts (Note [per-thread shards]): by size class, whose sums are
// num_allocs and num_deallocs. They stay with the shard when its thread exits.
struct alignas(64) statistics_adaptor::shard {
  std::array<counter, num_classes> allocs{};
  std::array<counter, num_classes> deallocs{};
  counter bytes_allocated{0};
  counter failed{0};

  void retire(figures& /*shared*/) noexcept {}
};

// Every shard's counts, summed.
struct statistics_adaptor::count_sums {
  std::array<std::uint64_t, num_classes> allocs{};
  std::array<std::uint64_t, num_classes> deallocs{};
  std::uint64_t bytes_allocated = 0;
  std::uint64_t failed = 0;

  void add(const shard& s) noexcept {
    for (std::size_t k = 0; k < num_classes; ++k) {
      allocs[k] += s.allocs[k].load(std::memory_order_relaxed);
      deallocs[k] += s.deallocs[k].load(std::memory_order_relaxed);
    }
    bytes_allocated += s.bytes_allocated.load(std::memory_order_relaxed);
    failed += s.failed.load(std::memory_order_relaxed);
  }
};

namespace {

// Adds to a counter of the calling thread's own shard, or else of the spill shard, which
// any thread may write and so takes a read-modify-write.
void add(counter& c, std::uint64_t delta, bool own) noexcept {
  if (own) [[likely]] {
    detail::owner_add(c, delta);
  } else {
    c.fetch_add(delta, std::memory_order_relaxed);
  }
}

}  // namespace

statistics_adaptor::statistics_adaptor(memory_resource& upstream)
    : upstream_(upstream), shards_(figures_), spill_(std::make_unique<shard>()) {}

statistics_adaptor::~statistics_adaptor() = default;

void* statistics_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream s) {
  void* p = nullptr;
  try {
    p = upstream_.allocate(bytes, alignment, s);
  } catch (const std::bad_alloc&) {
    shard* own = shards_.local();
    add((own != nullptr ? own : spill_.get())->failed, 1, own != nullptr);
    throw;
  }
  // Note [single-threaded elision]: exact shared figures without a locked instruction
  // while the process has one thread.
  const std::size_t now = detail::shared_fetch_add(figures_.in_use, bytes) + bytes;
  detail::shared_fetch_max(figures_.peak, now);
  shard* own = shards_.local();
  shard& c = own != nullptr ? *own : *spill_;
  add(c.allocs[size_class(bytes)], 1, own != nullptr);
  add(c.bytes_allocated, bytes, own != nullptr);
  return p;
}

void statistics_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                       stream s) noexcept {
  // Counted before the block goes back, so that another thread that is handed the same
  // block next cannot count it while this one still does (which would inflate the peak).
  detail::shared_fetch_sub(figures_.in_use, bytes);
  shard* own = shards_.local();
  add((own != nullptr ? own : spill_.get())->deallocs[size_class(bytes)], 1, own != nullptr);
  upstream_.deallocate(p, bytes, alignment, s);
}

statistics_adaptor::count_sums statistics_adaptor::sum() const {
  count_sums sums;
  shards_.for_each([&](const shard& s) { sums.add(s); });
  sums.add(*spill_);
  return sums;
}

memory_stats statistics_adaptor::get_stats() const {
  memory_stats out;
  out.bytes_in_use = figures_.in_use.load(std::memory_order_relaxed);
  // The peak is raised just after the bytes in use, so it may lag them for a moment.
  out.peak_bytes_in_use = std::max(figures_.peak.load(std::memory_order_relaxed), out.bytes_in_use);

  const count_sums sums = sum();
  for (std::size_t k = 0; k < num_classes; ++k) {
    out.num_allocs += sums.allocs[k];
    out.num_deallocs += sums.deallocs[k];
  }
  out.allocations_in_use = difference(out.num_allocs, out.num_deallocs);
  out.total_bytes_allocated = sums.bytes_allocated;
  out.num_failed_allocs = sums.failed;
  return out;
}

statistics_adaptor::histogram_type statistics_adaptor::histogram() const {
  const count_sums sums = sum();
  histogram_type out;
  for (std::size_t k = 0; k < num_classes; ++k) {
    out[k] = {sums.allocs[k], difference(sums.allocs[k], sums.deallocs[k])};
  }
  return out;
}

void statistics_adaptor::reset_peaks() noexcept {
  figures_.peak.store(figures_.in_use.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

}  // namespace loom::memory
