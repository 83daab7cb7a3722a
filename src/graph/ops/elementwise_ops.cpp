// Placeholder: the elementwise family's op definitions arrive with their kernels.
#include "loom/graph/op_registry.hpp"

namespace loom {
void register_elementwise_ops(op_registry& /*registry*/) {}
}  // namespace loom
