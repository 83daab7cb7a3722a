// host_resource: pageable host memory from the C library (aligned_alloc / free).
//
// The upstream of host pools. Stateless: all instances are equal. Thread-safe.
// Regions for other kinds of memory come as their own upstream resources with the CUDA
// backend: pinned host (cudaHostAlloc), cuda (cudaMalloc), cuda-async (cudaMallocAsync,
// stream-ordered) and managed (cudaMallocManaged); each is one small class beside this one.
#pragma once

#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

class host_resource final : public memory_resource {
 public:
  /// The process-wide instance (host_resource has no state; this is a convenience). It is
  /// never destroyed, so it serves pools that outlive static destruction.
  static host_resource& instance() noexcept;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                     stream s) noexcept override;
  bool do_is_equal(const memory_resource& other) const noexcept override;
};

}  // namespace loom::memory
