// The variable kernel every backend registers, and what the variable updates (assign,
// assign_add, assign_sub) check on every device: which variable a node updates, and that a
// value fits it. The update itself (in place or into a new buffer) is each backend's.
#pragma once

#include <mutex>
#include <string>

#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"
#include "loom/device/device.hpp"
#include "loom/kernel/op_kernel.hpp"
#include "loom/kernel/variable_store.hpp"

namespace loom::common {

/// variable: the session's value of the variable named as the node. A variable without one
/// takes initial_value, copied to the kernel's device, on its first read (and fails when it
/// has none). With `Adopt`, a value that lives on another device (a checkpoint restored on
/// the host) is copied to the kernel's device on its first read there (the CUDA backend);
/// without, it is returned where it is (the CPU backend).
template <bool Adopt>
class variable_kernel final : public op_kernel {
 public:
  explicit variable_kernel(const kernel_construction& c)
      : op_kernel(c), initial_(c.attr<tensor>("initial_value")) {}
  void compute(kernel_context& ctx) override {
    auto& var = ctx.variables().get(ctx.node().name);
    const std::lock_guard lock(var.mutex);
    if (!var.value.defined()) {
      if (!initial_.defined()) {
        ctx.fail("variable '{}' is read before it is assigned (it has no initial value)",
                 ctx.node().name);
      }
      var.value = ctx.device().copy_from_host(initial_);
    } else if (Adopt && var.value.device() != ctx.device().id()) {
      var.value = ctx.device().copy_from_host(var.value);
    }
    ctx.set_output(0, var.value);
  }

 private:
  tensor initial_;
};

/// The variable an update node writes and its declared shape.
struct update_target {
  /// Finds it: assign names it (attribute "variable"); the other updates read it as input
  /// `input` (assign_add and assign_sub: 0; batch_norm_train: 3 and 4). Fails
  /// (kernel_construction::fail) when the graph is missing, the input does not come from a
  /// variable, or the name is not a variable of the graph.
  explicit update_target(const kernel_construction& c, std::size_t input = 0);

  /// Fails (ctx.fail) when `needs_value` and the variable has none yet, or `value` does not
  /// have the variable's shape. Call it holding var.mutex.
  void check(const kernel_context& ctx, const variable_store::variable& var, const tensor& value,
             bool needs_value) const;

  std::string name;
  shape declared;
};

/// The variable's value, made safe to update in place: the node's own read of it (input
/// `input`) is dropped first, and where another reference still holds the buffer (a fetched
/// value, a reader still running) or it is not dense, the variable gets a dense copy on the
/// kernel's device. Call holding var.mutex, with a value defined.
tensor& writable_value(kernel_context& ctx, variable_store::variable& var, std::size_t input);

}  // namespace loom::common
