// How a kernel calls an op rule (loom/graph/ops/*_rules.hpp): the rule throws
// loom::invalid_argument with its message alone; the kernel reports it naming its node and
// device (kernel_context::fail), exactly as if it had made the check itself.
#pragma once

#include <string>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// Returns rule()'s result; an invalid_argument it throws becomes ctx.fail(message). Call it
/// around the rule alone, not around code whose own invalid_argument must pass unchanged.
template <class Rule>
decltype(auto) apply_rule(const kernel_context& ctx, Rule&& rule) {
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
