// device: one processor, with its memory resources and its compute resources.
//
// A device is made by its type's device_factory (device_factory.hpp) when a session starts,
// and lives as long as the session (or whoever else owns it). It owns
// - its memory: `allocator()`, the resource every tensor on it comes from (on CPU a growing
//   bfc_pool over host memory, so allocations are pooled and measurable);
// - its compute: on CPU an intra-op thread_pool (`pool()`); on a CUDA GPU a stream group
//   (compute, host-to-device, device-to-host, device-to-device; src/backends/cuda).
// Devices are thread-safe: many runs may use one at once.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "loom/core/device_id.hpp"
#include "loom/core/tensor.hpp"
#include "loom/memory/memory_resource.hpp"

namespace loom {

class thread_pool;

/// What a device is, for listings and for the placer.
struct device_attributes {
  std::string name;              // full name, "/device:CPU:0"
  device_id id;                  // {cpu, 0}
  std::size_t memory_limit = 0;  // bytes its allocator may hold (0: no limit but the machine's)
  int threads = 1;               // compute threads (CPU: the pool's size)
  std::string description;       // "x86_64 host, 2 threads, virtual 1 of 2"
};

class device {
 public:
  virtual ~device() = default;
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  [[nodiscard]] const device_attributes& attributes() const noexcept { return attributes_; }
  [[nodiscard]] const std::string& name() const noexcept { return attributes_.name; }
  [[nodiscard]] device_id id() const noexcept { return attributes_.id; }
  [[nodiscard]] device_type type() const noexcept { return attributes_.id.type; }

  /// The resource every tensor on this device comes from.
  [[nodiscard]] virtual memory::memory_resource& allocator() = 0;
  /// The intra-op thread pool (CPU devices); nullptr for devices that compute elsewhere.
  [[nodiscard]] virtual thread_pool* pool() noexcept { return nullptr; }
  /// The stream the device's tensors are ordered on: every buffer allocate() and kernels
  /// make records it (buffer::stream_of) and goes back to the allocator on it. The default
  /// stream on CPU; a CUDA device's compute stream.
  [[nodiscard]] virtual stream tensor_stream() const noexcept { return {}; }
  /// Waits until all work queued on the device is done (a no-op on CPU, where kernels
  /// finish before they return).
  virtual void sync() {}
  /// Held by kernels that use all of the device's threads themselves (op_kernel::
  /// uses_all_threads: oneDNN's, whose OpenMP threads do not share loom's pool), so two such
  /// kernels never run at once and oversubscribe the cores.
  [[nodiscard]] std::mutex& whole_device_mutex() noexcept { return whole_device_mutex_; }

  /// A new contiguous tensor on this device (from allocator()); its buffer goes back to
  /// allocator() when the last view is gone, so the device must outlive it. Throws
  /// loom::out_of_memory when the allocator does (a CPU device past its memory limit) and
  /// loom::invalid_argument for a shape with unknown or negative dimensions.
  [[nodiscard]] tensor allocate(dtype t, const shape& s);
  /// Copies `src` (host memory, any strides, including 0) into a new contiguous tensor on
  /// this device. The base implementation copies with the CPU and throws
  /// loom::invalid_argument when `src` is undefined, not in host-accessible memory, or this
  /// device's memory is not host-accessible (such devices override it).
  [[nodiscard]] virtual tensor copy_from_host(const tensor& src);
  /// A dense copy of `src` (on this device, any strides, including 0) in a new contiguous
  /// tensor on this device. The base implementation copies with the CPU (host-accessible
  /// memory); devices whose memory the CPU cannot reach override it (CUDA: a gather kernel
  /// on the compute stream).
  [[nodiscard]] virtual tensor contiguous_copy(const tensor& src);
  /// Copies `src` (on this device, any strides) into a new contiguous tensor on cpu:0 whose
  /// memory comes from `host` (which must outlive it). Throws as copy_from_host.
  [[nodiscard]] virtual tensor copy_to_host(const tensor& src, memory::memory_resource& host);

 protected:
  explicit device(device_attributes attributes) : attributes_(std::move(attributes)) {}

 private:
  device_attributes attributes_;
  std::mutex whole_device_mutex_;
};

}  // namespace loom
