// builtin: where loom's backends plug into the registries.
//
// The kernel registry and the device-factory registry know no backend: on first use each
// hands itself to register_builtin, whose one definition (builtin.cpp) is the only place
// outside a backend's own room that knows which backends this library was built with.
// Everything is registered from these explicit calls; nothing from static initializers.
#pragma once

namespace loom {

class kernel_registry;
class device_factory_registry;

namespace backends {

/// Registers the kernels of every built-in backend: the CPU backend's table, then, in builds
/// with it, the CUDA backend's (whether or not a GPU is present). Called once, by
/// kernel_registry::global().
void register_builtin(kernel_registry& registry);

/// Registers the device factories of every built-in backend: the CPU factory at priority 0,
/// then, in builds with it, the CUDA backend's GPU and GPU-compatible CPU factories at
/// priority 10. Called by register_builtin_device_factories (loom/device/device_factory.hpp).
void register_builtin(device_factory_registry& registry);

}  // namespace backends
}  // namespace loom
