#include "loom/memory/device_resources.hpp"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/memory/bfc_pool.hpp"
#include "loom/memory/host_resource.hpp"

namespace loom::memory {
namespace {

constexpr std::array<device_type, 4> known_types{device_type::cpu, device_type::cuda,
                                                 device_type::cuda_host, device_type::cuda_managed};

constexpr device_id cpu0{device_type::cpu, 0};

// One entry per (type, index); nullptr: none set (for cpu:0, the default pool).
std::array<std::atomic<memory_resource*>, known_types.size() * max_device_index> g_entries{};

// The device's entry, or nullptr when the registry cannot hold it.
std::atomic<memory_resource*>* entry(device_id device) noexcept {
  if (device.index < 0 || device.index >= max_device_index) return nullptr;
  for (std::size_t t = 0; t < known_types.size(); ++t) {
    if (known_types[t] == device.type) {
      return &g_entries[t * max_device_index + static_cast<std::size_t>(device.index)];
    }
  }
  return nullptr;
}

// The default cpu:0 pool, over the host resource, created on first use and never
// destroyed (see the header): a block may be given back to it from a static destructor.
memory_resource& default_cpu_pool() {
  static bfc_pool* const pool = [] {
    bfc_pool_options o;
    o.name = to_string(cpu0);
    return new bfc_pool(host_resource::instance(), std::move(o));
  }();
  return *pool;
}

}  // namespace

memory_resource* set_device_resource(device_id device, memory_resource* resource) {
  std::atomic<memory_resource*>* e = entry(device);
  if (e == nullptr) {
    throw invalid_argument(fmt::format(
        "set_device_resource: device {} cannot have a resource (known types: cpu, cuda, "
        "cuda_host, cuda_managed; indices 0 to {})",
        to_string(device), max_device_index - 1));
  }
  memory_resource* previous = e->exchange(resource, std::memory_order_acq_rel);
  if (previous == nullptr && device == cpu0) previous = &default_cpu_pool();
  return previous;
}

memory_resource* find_device_resource(device_id device) {
  const std::atomic<memory_resource*>* e = entry(device);
  if (e == nullptr) return nullptr;
  memory_resource* r = e->load(std::memory_order_acquire);
  if (r == nullptr && device == cpu0) return &default_cpu_pool();
  return r;
}

memory_resource& get_device_resource(device_id device) {
  memory_resource* r = find_device_resource(device);
  if (r == nullptr) {
    throw not_found(
        fmt::format("no memory resource for device {} (set one with "
                    "set_device_resource)",
                    to_string(device)));
  }
  return *r;
}

}  // namespace loom::memory
