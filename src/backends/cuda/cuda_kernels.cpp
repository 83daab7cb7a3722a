// The CUDA backend's kernel table: every family, listed once (no static registration).
#include "cuda_kernels.hpp"

namespace loom {

void register_cuda_kernels(kernel_registry& registry) {
  cuda::register_state_kernels(registry);
  cuda::register_transfer_kernels(registry);
  cuda::register_elementwise_kernels(registry);
  cuda::register_array_kernels(registry);
  cuda::register_fused_kernels(registry);
  cuda::register_nn_matmul_kernels(registry);
  cuda::register_optimizer_kernels(registry);
  cuda::register_reduction_kernels(registry);
  cuda::register_normalization_kernels(registry);
  cuda::register_nn_kernels(registry);
  cuda::register_nccl_kernels(registry);
}

}  // namespace loom
