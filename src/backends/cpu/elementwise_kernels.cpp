// Placeholder: the elementwise family's CPU kernels.
#include "cpu_kernels.hpp"

namespace loom::cpu {
void register_elementwise_kernels(kernel_registry& /*registry*/) {}
}  // namespace loom::cpu
