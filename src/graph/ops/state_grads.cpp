// Gradients of the state ops (state_ops.cpp): identity passes the gradient through;
// sources have no inputs; updates of variables are not differentiable.
#include "loom/graph/gradients.hpp"

namespace loom {

void register_state_gradients(gradient_registry& r) {
  r.add("identity", [](const gradient_context& c) -> std::vector<std::optional<output>> {
    return {c.grad(0)};
  });
  // Optimizer steps update variables in place; nothing is differentiated through them.
  for (const char* op : {"placeholder", "_arg", "const", "variable", "assign", "assign_add",
                         "assign_sub", "no_op", "apply_sgd", "apply_adam", "apply_adamw",
                         "fused_sgd", "fused_adam", "fused_adamw"}) {
    r.add_none(op);
  }
}

}  // namespace loom
