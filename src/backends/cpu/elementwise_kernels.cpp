// CPU element-wise kernels: the family's table (Note [element-wise iteration] in
// src/kernel/common/elementwise_plan.hpp).
#include "elementwise_kernels.hpp"

#include "cpu_kernels.hpp"

namespace loom::cpu {

void register_elementwise_kernels(kernel_registry& r) {
  register_unary_kernels(r);
  register_binary_kernels(r);
  register_cast_kernels(r);
  register_generator_kernels(r);
  register_fused_kernels(r);
}

}  // namespace loom::cpu
