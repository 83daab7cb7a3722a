// The CPU backend's kernel families. Each family registers its kernels from one function;
// register_cpu_kernels (cpu_kernels.cpp) is the one table that lists them.
#pragma once

#include "loom/kernel/kernel_registry.hpp"

namespace loom::cpu {

void register_state_kernels(kernel_registry& registry);        // const, variable, assign*
void register_transfer_kernels(kernel_registry& registry);     // _send
void register_elementwise_kernels(kernel_registry& registry);  // unary, binary, where, cast, fill, range, random
void register_nn_kernels(kernel_registry& registry);           // matmul, conv2d, pooling, bias_add (oneDNN)
void register_reduction_kernels(kernel_registry& registry);    // reductions, softmax, xent, argmax
void register_normalization_kernels(kernel_registry& registry);  // layer_norm, layer_norm_grad
void register_array_kernels(kernel_registry& registry);        // reshape, transpose, concat, split, slice, gather, one_hot
// placeholder, _arg, identity, no_op, _recv, squeeze, expand_dims and broadcast_to are the same
// on every device: src/kernel/common/neutral_kernels.cpp registers them once.
void register_optimizer_kernels(kernel_registry& registry);    // apply_sgd/adam/adamw, fused_sgd/adam/adamw
// all_reduce, broadcast, all_gather, reduce_scatter (collective_kernels.cpp)
void register_collective_kernels(kernel_registry& registry);

}  // namespace loom::cpu

namespace loom {

/// The CPU backend's kernel table (cpu_kernels.cpp): registers every family above. Called by
/// backends::register_builtin (src/backends/builtin.cpp).
void register_cpu_kernels(kernel_registry& registry);

}  // namespace loom
