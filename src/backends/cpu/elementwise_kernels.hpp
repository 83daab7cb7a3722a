// The CPU element-wise kernels, by file; register_elementwise_kernels (elementwise_kernels.cpp)
// calls each.
#pragma once

#include "loom/kernel/kernel_registry.hpp"

namespace loom::cpu {

/// make_kernel_def for kernels whose constructor takes `args` after the kernel_construction.
template <class K, class... Args>
kernel_def make_kernel_def_with(std::string op,
                                std::vector<std::pair<std::string, std::vector<dtype>>> constraints,
                                Args... args) {
  kernel_def d;
  d.op = std::move(op);
  d.device = device_type::cpu;
  d.constraints = std::move(constraints);
  d.label = "reference";
  d.create = [args...](const kernel_construction& c) -> std::unique_ptr<op_kernel> {
    return std::make_unique<K>(c, args...);
  };
  return d;
}

void register_unary_kernels(kernel_registry& registry);      // elementwise_unary.cpp
void register_binary_kernels(kernel_registry& registry);     // elementwise_binary.cpp
void register_cast_kernels(kernel_registry& registry);       // elementwise_cast.cpp: cast, where
void register_generator_kernels(kernel_registry& registry);  // elementwise_generators.cpp
void register_fused_kernels(kernel_registry& registry);      // fused_elementwise.cpp

}  // namespace loom::cpu
