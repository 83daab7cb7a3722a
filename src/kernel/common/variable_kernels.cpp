// The checks every device's variable updates share (variable_kernels.hpp).
#include "variable_kernels.hpp"

#include <fmt/format.h>

#include "loom/graph/graph.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::common {
namespace {

// assign names its variable; the other updates read it as input `input`.
std::string variable_name_of(const kernel_construction& c, std::size_t input) {
  if (c.node().op() == "assign") return c.attr<std::string>("variable");
  if (c.graph() == nullptr) c.fail("an update needs the graph to find its variable");
  const node& src = c.graph()->at(c.node().inputs.at(input).node);
  if (src.op() != "variable") {
    c.fail(fmt::format("input {} must come from a variable, not from {}", input, src.describe()));
  }
  return src.name;
}

}  // namespace

update_target::update_target(const kernel_construction& c, std::size_t input)
    : name(variable_name_of(c, input)) {
  const loom::node* v = c.graph()->find(name);
  if (v == nullptr || v->op() != "variable") {
    c.fail("it names variable '" + name + "', which is not a variable of the graph");
  }
  declared = v->attr<shape>("shape");
}

void update_target::check(const kernel_context& ctx, const variable_store::variable& var,
                          const tensor& value, bool needs_value) const {
  if (needs_value && !var.value.defined()) {
    ctx.fail("variable '{}' is updated before it is assigned", name);
  }
  if (value.shape() != declared) {
    ctx.fail("value {} does not fit variable '{}' of shape {}", value.describe(), name,
             to_string(declared));
  }
}

tensor& writable_value(kernel_context& ctx, variable_store::variable& var, std::size_t input) {
  (void)ctx.take_input(input);
  if (!(var.value.buf()->writable_in_place() && var.value.is_contiguous())) {
    var.value = memory::contiguous_copy(var.value, ctx.device().allocator(), ctx.device().id());
  }
  return var.value;
}

}  // namespace loom::common
