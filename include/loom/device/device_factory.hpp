// device_factory: makes the devices of one type; the registry of factories.
//
// A session asks every registered factory for its devices (TensorFlow's DeviceFactory
// model). Factories are registered per device type with a priority; registering a factory
// of higher priority for a type replaces the one there, as a plugin does, and a lower one is
// ignored. loom's own backends register from one explicit place,
// `register_builtin_device_factories`, which src/backends/builtin.cpp answers (no static
// initializers).
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/device/device.hpp"

namespace loom {

/// How CUDA devices take and hand out their memory (TensorFlow's GPUOptions, RMM's
/// resources). See docs/cuda.md.
struct cuda_options {
  /// Where the pool's regions come from: cudaMalloc ("cuda"), cudaMallocAsync
  /// ("cuda_async": the driver's own stream-ordered pool, under loom's), or
  /// cudaMallocManaged ("managed": unified memory, which can exceed the card's memory).
  enum class upstream_kind { cuda, cuda_async, managed };
  upstream_kind upstream = upstream_kind::cuda;
  /// Use a bfc_pool over the upstream (true), or hand out the upstream's blocks directly
  /// (false: every allocation is a cudaMalloc; for comparison and debugging).
  bool pool = true;
  /// Fraction of the card's total memory the pool takes when it is made (TensorFlow's
  /// per_process_gpu_memory_fraction with allow_growth off); 0 takes nothing up front.
  double preallocate_fraction = 0.0;
  /// Grow the pool on demand (TensorFlow's allow_growth). Off with a preallocation: a fixed
  /// pool that fails once it is full.
  bool allow_growth = true;
  /// Bytes the pool may hold at most (0: the card's free memory when the device is made).
  std::size_t memory_limit = 0;
  /// When the device's memory is exhausted, allocate from managed (unified) memory instead of
  /// failing: the allocation succeeds and the driver pages it between host and device.
  bool spill_to_managed = false;
  /// Serve the process's C ABI allocator (loom_allocate for cuda:N) from this pool, so that
  /// PyTorch, CuPy and Numba plugged into loom share it (c_api.h).
  bool serve_c_api = true;
  /// CPU devices allocate from pinned (page-locked) host memory when a GPU is present, so
  /// copies to and from the GPU run asynchronously at full bandwidth (TensorFlow's
  /// GPU-compatible CPU device).
  bool pinned_cpu_memory = true;
};

/// Options every factory reads what it needs from.
struct device_options {
  /// Logical CPU devices to split the machine into: "/device:CPU:0" .. "/device:CPU:N-1",
  /// each with its own pool and threads (threads divided between them, at least 1 each).
  int virtual_cpu_devices = 1;
  /// Threads of all CPU devices together (0: std::thread::hardware_concurrency()).
  int cpu_threads = 0;
  /// Bytes each CPU device's pool may hold (0: no limit).
  std::size_t cpu_memory_limit = 0;
  /// When set, every allocate and deallocate of cpu:0 is logged to this file (loom's
  /// allocation log: `loom memreplay` replays it; `loom train --memory-report` draws it).
  std::filesystem::path cpu_memory_log;
  /// GPUs to use, by CUDA ordinal (after CUDA_VISIBLE_DEVICES); -1 uses every one, 0 none.
  int cuda_device_count = -1;
  /// Memory of CUDA devices.
  cuda_options cuda;
};

class device_factory {
 public:
  virtual ~device_factory() = default;
  /// The type this factory makes.
  [[nodiscard]] virtual device_type type() const noexcept = 0;
  /// Creates the devices of this type present here (none is not an error: a CUDA factory
  /// on a machine without a GPU returns an empty list).
  [[nodiscard]] virtual std::vector<std::unique_ptr<device>> create_devices(
      const device_options& options) = 0;
};

/// The registry of factories. Thread-safe.
class device_factory_registry {
 public:
  /// The process's registry, with loom's built-in factories registered on first use.
  static device_factory_registry& global();

  /// Registers `factory` for its type at `priority`. Returns true when it is now the
  /// factory for that type (it had the highest priority; a tie replaces too, destroying the
  /// factory replaced); false when a factory of higher priority stays (`factory` is then
  /// destroyed). Throws loom::invalid_argument for a null factory.
  bool register_factory(std::unique_ptr<device_factory> factory, int priority);
  /// The factory in charge of `type`, or nullptr. The pointer stays valid until a factory
  /// for that type replaces it.
  [[nodiscard]] device_factory* find(device_type type) const;
  /// Asks every factory for its devices, in device_type order (CPU first), and returns them
  /// all. Propagates what a factory throws (cpu: loom::invalid_argument for bad options).
  /// Holds the registry's lock meanwhile, so a factory must not call the registry.
  [[nodiscard]] std::vector<std::unique_ptr<device>> create_devices(
      const device_options& options) const;

 private:
  struct entry {
    std::unique_ptr<device_factory> factory;
    int priority;
  };
  mutable std::mutex mutex_;
  std::vector<entry> entries_;
};

/// Registers loom's own factories: the CPU factory at priority 0 and, in builds with the CUDA
/// backend, its GPU and GPU-compatible CPU factories at priority 10 (which replaces the CPU
/// one). The built-in backends are listed in src/backends/builtin.cpp. Called by global().
void register_builtin_device_factories(device_factory_registry& registry);

}  // namespace loom
