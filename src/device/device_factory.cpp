#include "loom/device/device_factory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "backends/builtin.hpp"
#include "loom/core/error.hpp"

namespace loom {

device_factory_registry& device_factory_registry::global() {
  static device_factory_registry registry;
  static const bool registered = [] {
    register_builtin_device_factories(registry);
    return true;
  }();
  (void)registered;
  return registry;
}

bool device_factory_registry::register_factory(std::unique_ptr<device_factory> factory,
                                               int priority) {
  if (!factory) throw invalid_argument("register_factory: the factory is null");
  const device_type type = factory->type();
  std::unique_ptr<device_factory> replaced;  // destroyed after the lock is released
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [type](const entry& e) { return e.factory->type() == type; });
  if (it == entries_.end()) {
    // Kept in device_type order, so create_devices asks CPU first.
    auto pos = std::find_if(entries_.begin(), entries_.end(), [type](const entry& e) {
      return static_cast<std::int32_t>(e.factory->type()) > static_cast<std::int32_t>(type);
    });
    entries_.insert(pos, entry{std::move(factory), priority});
    return true;
  }
  if (priority < it->priority) return false;
  replaced = std::exchange(it->factory, std::move(factory));
  it->priority = priority;
  return true;
}

device_factory* device_factory_registry::find(device_type type) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const entry& e : entries_) {
    if (e.factory->type() == type) return e.factory.get();
  }
  return nullptr;
}

std::vector<std::unique_ptr<device>> device_factory_registry::create_devices(
    const device_options& options) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::unique_ptr<device>> devices;
  for (const entry& e : entries_) {
    std::vector<std::unique_ptr<device>> made = e.factory->create_devices(options);
    for (auto& d : made) devices.push_back(std::move(d));
  }
  return devices;
}

void register_builtin_device_factories(device_factory_registry& registry) {
  backends::register_builtin(registry);
}

}  // namespace loom
