// The built-in backends, listed once: the CPU backend always, the CUDA backend in builds with
// it (LOOM_HAVE_CUDA, set by CMake when it compiles src/backends/cuda). The one file outside
// src/backends/cpu and src/backends/cuda that knows which backends exist.
#include "backends/builtin.hpp"

#include <memory>

#include "backends/cpu/cpu_kernels.hpp"
#include "kernel/common/neutral_kernels.hpp"
#include "loom/device/cpu_device.hpp"
#include "loom/device/device_factory.hpp"
#include "loom/kernel/kernel_registry.hpp"

#ifdef LOOM_HAVE_CUDA
#include "backends/cuda/cuda_info.hpp"
#include "backends/cuda/cuda_kernels.hpp"
#endif

namespace loom::backends {

void register_builtin(kernel_registry& registry) {
  register_cpu_kernels(registry);
#ifdef LOOM_HAVE_CUDA
  register_cuda_kernels(registry);
#endif
  // Kernels that are the same on every device (placeholder, identity, views, ...): once.
  common::register_device_neutral_kernels(registry);
}

void register_builtin(device_factory_registry& registry) {
  registry.register_factory(std::make_unique<cpu_device_factory>(), 0);
#ifdef LOOM_HAVE_CUDA
  register_cuda_device_factories(registry);
#endif
}

}  // namespace loom::backends
