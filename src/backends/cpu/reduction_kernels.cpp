// The reduction family's CPU kernels: reduce_* and argmax (reduction_reduce.cpp), softmax,
// log_softmax and softmax_cross_entropy (reduction_softmax.cpp).
#include "reduction_common.hpp"

namespace loom::cpu {

void register_reduction_kernels(kernel_registry& registry) {
  register_reduce_kernels(registry);
  register_softmax_kernels(registry);
}

}  // namespace loom::cpu
