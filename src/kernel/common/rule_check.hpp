// check_rule: an op rule (include/loom/graph/ops/*_rules.hpp) run by a kernel, its failure
// reported as the kernel's own (Note [nn rule messages] in nn_rules.hpp).
#pragma once

#include <string>
#include <utility>

#include "loom/core/error.hpp"

namespace loom {

/// Returns rule(); when it throws loom::invalid_argument, fails through ctx (a
/// kernel_context or kernel_construction: a node_error naming the node, op and device)
/// with the rule's message.
template <class Context, class Rule>
decltype(auto) check_rule(const Context& ctx, Rule&& rule) {
  try {
    return std::forward<Rule>(rule)();
  } catch (const invalid_argument& e) {
    ctx.fail(std::string(e.what()));
  }
}

}  // namespace loom
