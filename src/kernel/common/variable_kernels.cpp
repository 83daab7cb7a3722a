// The checks every device's variable updates share (variable_kernels.hpp).
#include "variable_kernels.hpp"

#include "loom/graph/graph.hpp"

namespace loom::common {
namespace {

// assign names its variable; the updates read it as input 0.
std::string variable_name_of(const kernel_construction& c) {
  if (c.node().op() == "assign") return c.attr<std::string>("variable");
  if (c.graph() == nullptr) c.fail("an update needs the graph to find its variable");
  const node& src = c.graph()->at(c.node().inputs.at(0).node);
  if (src.op() != "variable") {
    c.fail("input 0 must come from a variable, not from " + src.describe());
  }
  return src.name;
}

}  // namespace

update_target::update_target(const kernel_construction& c) : name(variable_name_of(c)) {
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

}  // namespace loom::common
