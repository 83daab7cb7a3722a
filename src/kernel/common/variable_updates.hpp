// What the variable updates (assign, assign_add, assign_sub) check on every device: which
// variable a node updates, and that a value fits it. The update itself (in place or into a
// new buffer) is each backend's.
#pragma once

#include <string>

#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernel/op_kernel.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::common {

/// The variable an update node writes and its declared shape.
struct update_target {
  /// Finds it: assign names it (attribute "variable"); assign_add and assign_sub read it as
  /// input 0. Fails (kernel_construction::fail) when the graph is missing, input 0 does not
  /// come from a variable, or the name is not a variable of the graph.
  explicit update_target(const kernel_construction& c);

  /// Fails (ctx.fail) when `needs_value` and the variable has none yet, or `value` does not
  /// have the variable's shape. Call it holding var.mutex.
  void check(const kernel_context& ctx, const variable_store::variable& var, const tensor& value,
             bool needs_value) const;

  std::string name;
  shape declared;
};

}  // namespace loom::common
