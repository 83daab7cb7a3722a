// cuda/resources: the upstream memory resources of the CUDA backend.
//
// Each is one thin class over one CUDA allocation call, as RMM's are; pools (bfc_pool) and
// adaptors compose over them. None includes a CUDA header: a stream is loom::stream, whose
// handle is the cudaStream_t. Only builds with the CUDA backend define these classes
// (src/backends/cuda/cuda_resources.cpp): include this header only from code that CMake
// compiles only in such builds (loom::cuda::is_built() says which build runs).
//
// - cuda_resource: device memory from cudaMalloc / cudaFree. cudaFree synchronises the
//   whole device, which is why it sits under a pool.
// - cuda_async_resource: cudaMallocFromPoolAsync / cudaFreeAsync on a memory pool of its
//   own: stream-ordered by the driver itself.
// - managed_resource: unified memory from cudaMallocManaged, reachable from host and device
//   and able to exceed the card's memory (the driver pages it); with prefetch and advice.
// - pinned_host_resource: page-locked host memory from cudaHostAlloc (portable, so every GPU
//   may copy from it asynchronously).
//
// All throw loom::out_of_memory (a std::bad_alloc) when CUDA reports no memory, and
// loom::cuda_error (src/backends/cuda/cuda_check.hpp's message: the call, the CUDA error
// name and text) for other failures, such as no driver or no device. Thread-safe.
#pragma once

#include <cstddef>

#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

/// The alignment CUDA guarantees for device and managed allocations; the device resources
/// refuse larger ones (a pool over them asks for regions aligned to this).
inline constexpr std::size_t cuda_allocation_alignment = 256;

/// Device memory of GPU `device` (a CUDA ordinal) from cudaMalloc.
class cuda_resource final : public memory_resource {
 public:
  explicit cuda_resource(int device);
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  bool do_is_equal(const memory_resource& other) const noexcept override;
  int device_;
};

/// Device memory of GPU `device` from cudaMallocFromPoolAsync on a CUDA memory pool owned
/// by this resource: an allocation is usable in stream order on the stream it was made on,
/// and a free is ordered after the work queued on its stream. `release_threshold` bytes
/// of freed memory the driver keeps for reuse instead of returning to the OS (RMM's knob).
class cuda_async_resource final : public memory_resource {
 public:
  explicit cuda_async_resource(int device, std::size_t release_threshold = ~std::size_t{0});
  ~cuda_async_resource() override;
  cuda_async_resource(const cuda_async_resource&) = delete;
  cuda_async_resource& operator=(const cuda_async_resource&) = delete;
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  int device_;
  void* pool_;  // cudaMemPool_t
};

/// Hints for managed memory (cudaMemAdvise / cudaMemPrefetchAsync).
struct managed_options {
  /// After each allocation, prefetch the block to the device on the allocating stream, so
  /// the first kernel does not fault its pages in one by one.
  bool prefetch_on_allocate = true;
  /// cudaMemAdviseSetPreferredLocation to the device: pages stay there unless memory runs
  /// short (then the driver evicts them to the host rather than failing).
  bool prefer_device = true;
  /// cudaMemAdviseSetAccessedBy the host, so host reads map pages instead of migrating them.
  bool host_accesses = false;
};

/// Unified memory of GPU `device` from cudaMallocManaged (cudaMemAttachGlobal): host and
/// device can both address it, and allocations may exceed the card's memory.
class managed_resource final : public memory_resource {
 public:
  explicit managed_resource(int device, managed_options options = {});
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] const managed_options& options() const noexcept { return options_; }
  /// Queues a migration of [p, p + bytes) to the GPU (to_device) or to the host, on `s`.
  void prefetch(const void* p, std::size_t bytes, bool to_device, stream s) const;
  /// cudaMemAdviseSetReadMostly on [p, p + bytes): read-only copies on host and device.
  void advise_read_mostly(const void* p, std::size_t bytes) const;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  bool do_is_equal(const memory_resource& other) const noexcept override;
  int device_;
  managed_options options_;
};

/// Page-locked host memory from cudaHostAlloc(cudaHostAllocPortable). Stateless.
class pinned_host_resource final : public memory_resource {
 public:
  /// The process-wide instance; never destroyed.
  static pinned_host_resource& instance() noexcept;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream s) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream s) noexcept override;
  bool do_is_equal(const memory_resource& other) const noexcept override;
};

}  // namespace loom::memory
