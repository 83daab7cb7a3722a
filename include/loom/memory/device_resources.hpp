// device_resources: the process-wide memory resource of each device.
//
// One registry per process maps a device to the resource that serves allocations for it,
// as RMM's per-device resource does: loom's C ABI (c_api.h) allocates through it, so
// every library in the process that allocates through loom shares one pool per device.
// The registry does not own what it points to: whoever sets a resource keeps it alive
// until it is replaced.
//
// cpu:0 starts out served by a default resource, created on first use: a growing bfc_pool
// named "cpu:0" over host memory. It lives for the whole process and is never destroyed,
// so that blocks may still be given back to it while static objects are destroyed at exit.
// Other devices start with no resource; the CUDA backend sets theirs.
//
// Thread-safe: lookups are lock-free (one atomic load), so allocating through the registry
// costs nothing beyond the resource's own call. A resource replaced while another thread
// is in the middle of a call to it must stay alive until that call returns.
#pragma once

#include <cstdint>

#include "loom/core/device_id.hpp"
#include "loom/memory/memory_resource.hpp"

namespace loom::memory {

/// Devices of each type the registry can hold: indices 0 .. max_device_index - 1.
inline constexpr std::int32_t max_device_index = 64;

/// Makes `resource` (not owned; it must outlive its use through the registry) serve
/// `device`, and returns the resource that served it before: nullptr when none did, the
/// default pool for cpu:0 when nothing else was set. nullptr puts the device back in its
/// initial state (the default pool for cpu:0, nothing for other devices). Throws
/// loom::invalid_argument naming the device when its type is not one of
/// loom::device_type's or its index is outside [0, max_device_index).
memory_resource* set_device_resource(device_id device, memory_resource* resource);

/// The resource serving `device`. Throws loom::not_found naming the device when none does
/// (or when the device cannot be in the registry at all), and loom::out_of_memory when the
/// default cpu:0 pool cannot be created.
[[nodiscard]] memory_resource& get_device_resource(device_id device);

/// The resource serving `device`, or nullptr when none does. Throws only when the default
/// cpu:0 pool cannot be created (loom::out_of_memory).
[[nodiscard]] memory_resource* find_device_resource(device_id device);

}  // namespace loom::memory
