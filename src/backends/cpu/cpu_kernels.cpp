// The CPU backend's kernel table: every family, listed once (no static registration).
#include "cpu_kernels.hpp"

namespace loom {

void register_cpu_kernels(kernel_registry& registry) {
  cpu::register_state_kernels(registry);
  cpu::register_transfer_kernels(registry);
  cpu::register_elementwise_kernels(registry);
  cpu::register_nn_kernels(registry);
  cpu::register_reduction_kernels(registry);
  cpu::register_normalization_kernels(registry);
  cpu::register_array_kernels(registry);
  cpu::register_optimizer_kernels(registry);
  cpu::register_collective_kernels(registry);
}

}  // namespace loom
