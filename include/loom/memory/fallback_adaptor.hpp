// fallback_adaptor: allocate from a primary resource, and from a fallback one when the
// primary is out of memory.
//
// The CUDA backend's "spill rather than fail" policy is this adaptor over the device pool
// with managed (unified) memory as the fallback: a job that outgrows the card keeps running,
// its overflow paged by the driver (cuda_options::spill_to_managed). Nothing in it is CUDA's:
// any two resources compose, so its behaviour is tested on host memory.
//
// deallocate sends a block back to the resource it came from: blocks from the fallback are
// remembered (a hash set, under a mutex taken only for fallback blocks' bookkeeping and for
// lookups while any fallback block is live). Thread-safe when both resources are. Both must
// outlive the adaptor.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <unordered_set>

#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

class fallback_adaptor final : public memory_resource {
 public:
  fallback_adaptor(memory_resource& primary, memory_resource& fallback)
      : primary_(&primary), fallback_(&fallback) {}

  [[nodiscard]] memory_resource& primary() const noexcept { return *primary_; }
  [[nodiscard]] memory_resource& fallback() const noexcept { return *fallback_; }
  /// Blocks now held from the fallback, and their bytes.
  [[nodiscard]] std::size_t fallback_blocks() const;
  [[nodiscard]] std::size_t fallback_bytes() const;
  /// Allocations the fallback served since the adaptor was made.
  [[nodiscard]] std::uint64_t fallback_allocations() const noexcept {
    return fallback_count_.load(std::memory_order_relaxed);
  }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  /// The primary's figures (what the pool holds); the fallback's are fallback_bytes().
  std::optional<memory_stats> do_stats() const override { return primary_->stats(); }

  memory_resource* primary_;
  memory_resource* fallback_;
  mutable std::mutex mutex_;
  std::unordered_set<void*> from_fallback_;
  std::size_t fallback_bytes_ = 0;
  std::atomic<std::size_t> live_fallback_{0};
  std::atomic<std::uint64_t> fallback_count_{0};
};

}  // namespace loom::memory
