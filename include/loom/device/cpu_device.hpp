// cpu_device: host memory and a thread pool.
#pragma once

#include <filesystem>
#include <memory>

#include "loom/device/device.hpp"
#include "loom/device/device_factory.hpp"
#include "loom/device/thread_pool.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/logging_adaptor.hpp"

namespace loom {

/// The options of CPU device `index`'s pool ("cpu:<index>", growing, at most `memory_limit`
/// bytes; 0: no limit).
[[nodiscard]] memory::bfc_pool_options cpu_pool_options(int index, std::size_t memory_limit);

class cpu_device final : public device {
 public:
  /// CPU device `index` ("/device:CPU:<index>") with a pool of `threads` threads (named
  /// "cpu:<index>") and a growing bfc_pool over host memory (named "cpu:<index>") holding at
  /// most `memory_limit` bytes (0: no limit): an allocation past the limit throws
  /// loom::out_of_memory. `description` is free text. Throws loom::invalid_argument for a
  /// negative index or threads < 1. Destruction finishes the work queued on the pool first.
  cpu_device(int index, int threads, std::size_t memory_limit, std::string description);
  /// The same over `upstream` (which must outlive the device) instead of pageable host
  /// memory: pinned memory, for the GPU-compatible CPU device of the CUDA backend.
  cpu_device(int index, int threads, std::size_t memory_limit, std::string description,
             memory::memory_resource& upstream);
  ~cpu_device() override;

  memory::memory_resource& allocator() override {
    return log_ ? static_cast<memory::memory_resource&>(*log_) : *pool_allocator_;
  }
  /// From now on, every allocate and deallocate through allocator() is logged to `path`
  /// (device_options::cpu_memory_log). Call before the device allocates anything.
  void log_allocations(const std::filesystem::path& path);
  thread_pool* pool() noexcept override { return threads_.get(); }
  /// The pool itself, for statistics and trimming.
  [[nodiscard]] memory::bfc_pool& memory_pool() noexcept { return *pool_allocator_; }

 private:
  std::unique_ptr<memory::bfc_pool> pool_allocator_;
  std::unique_ptr<memory::logging_adaptor> log_;  // over the pool, when logging
  std::unique_ptr<thread_pool> threads_;
};

/// Makes options.virtual_cpu_devices CPU devices, "/device:CPU:0" .. "/device:CPU:N-1",
/// each with max(1, T / N) threads (T: options.cpu_threads, or hardware_concurrency when
/// 0), options.cpu_memory_limit bytes, and a description such as "x86_64 host, 2 threads,
/// virtual 1 of 4". Throws loom::invalid_argument for virtual_cpu_devices < 1 or
/// cpu_threads < 0.
class cpu_device_factory final : public device_factory {
 public:
  /// Devices whose pools draw from `upstream` (nullptr: pageable host memory), with
  /// `memory_note` ("pinned memory") added to their descriptions.
  explicit cpu_device_factory(memory::memory_resource* upstream = nullptr,
                              std::string memory_note = {})
      : upstream_(upstream), memory_note_(std::move(memory_note)) {}
  device_type type() const noexcept override { return device_type::cpu; }
  std::vector<std::unique_ptr<device>> create_devices(const device_options& options) override;

 private:
  memory::memory_resource* upstream_;
  std::string memory_note_;
};

}  // namespace loom
