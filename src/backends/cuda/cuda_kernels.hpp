// The CUDA backend's kernel families; register_cuda_kernels (cuda_kernels.cpp) calls each.
// Kernels run on the device's compute stream (Note [cuda stream group]): compute() queues
// the work and returns.
#pragma once

#include "loom/kernel/kernel_registry.hpp"

namespace loom::cuda {

void register_state_kernels(kernel_registry& registry);        // state_kernels.cpp
void register_transfer_kernels(kernel_registry& registry);     // state_kernels.cpp
void register_elementwise_kernels(kernel_registry& registry);  // elementwise_kernels.cpp
void register_array_kernels(kernel_registry& registry);        // array_kernels.cpp
void register_reduction_kernels(kernel_registry& registry);    // reduction_kernels.cpp
void register_normalization_kernels(kernel_registry& registry);  // normalization_kernels.cpp
void register_nn_kernels(kernel_registry& registry);           // nn_kernels.cpp
void register_nn_matmul_kernels(kernel_registry& registry);    // nn_matmul.cpp (matmul, fused_matmul)
void register_optimizer_kernels(kernel_registry& registry);    // optimizer_kernels.cpp
void register_fused_kernels(kernel_registry& registry);        // fused_elementwise.cpp
// all_reduce, broadcast, all_gather, reduce_scatter (nccl_communicator.cpp)
void register_nccl_kernels(kernel_registry& registry);

}  // namespace loom::cuda

namespace loom {

/// The CUDA backend's kernel table (cuda_kernels.cpp): registers every family above, whether
/// or not a GPU is present. Called by backends::register_builtin (src/backends/builtin.cpp).
void register_cuda_kernels(kernel_registry& registry);

}  // namespace loom
