// How a kernel calls an op rule (loom/graph/ops/*_rules.hpp): the rule throws
// loom::invalid_argument with its message alone; the kernel reports it naming its node and
// device (kernel_context::fail), exactly as if it had made the check itself.
#pragma once

#include <string>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// Returns rule()'s result; an invalid_argument it throws becomes ctx.fail(message), where
/// ctx is a kernel_context (at run time) or a kernel_construction (a check on attributes
/// when the kernel is made): a node_error naming the node, op and device. Call it around
/// the rule alone, not around code whose own invalid_argument must pass unchanged.
template <class Context, class Rule>
decltype(auto) apply_rule(const Context& ctx, Rule&& rule) {
  try {
    return std::forward<Rule>(rule)();
  } catch (const invalid_argument& e) {
    ctx.fail(std::string(e.what()));
  }
}

/// The text callback of a rule's message for tensor `t`: its description.
inline auto text_of(const tensor& t) {
  return [&t] { return t.describe(); };
}

}  // namespace loom::common
