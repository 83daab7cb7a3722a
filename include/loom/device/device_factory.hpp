// device_factory: makes the devices of one type; the registry of factories.
//
// A session asks every registered factory for its devices (TensorFlow's DeviceFactory
// model). Factories are registered per device type with a priority; registering a factory
// of higher priority for a type replaces the one there, as a plugin does, and a lower one is
// ignored. loom's own backends register from one explicit place,
// `register_builtin_device_factories` (no static initializers).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/device/device.hpp"

namespace loom {

/// Options every factory reads what it needs from.
struct device_options {
  /// Logical CPU devices to split the machine into: "/device:CPU:0" .. "/device:CPU:N-1",
  /// each with its own pool and threads (threads divided between them, at least 1 each).
  int virtual_cpu_devices = 1;
  /// Threads of all CPU devices together (0: std::thread::hardware_concurrency()).
  int cpu_threads = 0;
  /// Bytes each CPU device's pool may hold (0: no limit).
  std::size_t cpu_memory_limit = 0;
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

/// Registers loom's own factories (CPU; CUDA when built with it). Called by global().
void register_builtin_device_factories(device_factory_registry& registry);

}  // namespace loom
