// The gradient of fused_elementwise (fused_ops.cpp): reverse mode over its expression.
//
// The forward is recomputed unfused (expand_values on the node's inputs), and the
// instructions are walked backwards, each handing the gradient of its value to its
// primitive node's own registered gradient function (through a gradient_context over that
// node), so every formula, and every unbroadcast to an operand's shape, is the primitive
// op's. Gradients reaching a value from several uses are summed. Literal operands receive
// nothing. An instruction whose op has no gradient (relu_grad, for one) fails as gradients()
// fails for that op, but only when a gradient actually reaches it.
#include <fmt/format.h>

#include "loom/graph/fused_expr.hpp"
#include "loom/graph/gradients.hpp"
#include "loom/graph/ops/array.hpp"
#include "loom/graph/ops/math.hpp"
#include "loom/graph/ops/reduction.hpp"

namespace loom {
namespace {

using grads = std::vector<std::optional<output>>;

output sum_of(const std::vector<output>& parts) {
  output total = parts.front();
  for (std::size_t k = 1; k < parts.size(); ++k) total = ops::add(total, parts[k]);
  return total;
}

// g (of the fused node's output shape) summed down to `to`, the shape of the value that was
// broadcast to it (as gradient_context::unbroadcast does for an input).
output sum_to(const gradient_context& c, output g, const shape& to) {
  const auto& gs_opt = g.type().shape;
  if (!gs_opt || !gs_opt->is_fully_defined()) {
    c.fail("the gradient of a result has no fully defined shape");
  }
  const shape& gs = *gs_opt;
  if (gs == to) return g;
  const std::size_t lead = gs.rank() - to.rank();
  std::vector<std::int64_t> axes;
  for (std::size_t d = 0; d < gs.rank(); ++d) {
    if (d < lead || (to[d - lead] == 1 && gs[d] != 1)) axes.push_back(static_cast<std::int64_t>(d));
  }
  output r = axes.empty() ? g : ops::reduce_sum(g, axes, false);
  return ops::reshape(r, to.to_vector());
}

grads fused_grad(const gradient_context& c) {
  const node& fwd = c.forward();
  const auto n = static_cast<std::size_t>(fwd.attr<std::int64_t>("N"));
  const fused_expr e =
      fused_expr::parse(fwd.attr<std::string>("expr"), static_cast<std::int32_t>(n),
                        fwd.attr<std::vector<std::int64_t>>("results"));
  std::vector<output> inputs;
  for (std::size_t i = 0; i < c.num_inputs(); ++i) inputs.push_back(c.input(i));

  // Which values a gradient reaches, before building anything: with none, no recompute.
  std::vector<std::vector<output>> partial(static_cast<std::size_t>(e.num_values()));
  bool any = false;
  for (std::size_t j = 0; j < e.results.size(); ++j) any = any || c.has_grad(j);
  if (!any) return grads(n);

  const std::vector<output> values = expand_values(e, inputs);
  for (std::size_t j = 0; j < e.results.size(); ++j) {
    if (!c.has_grad(j)) continue;
    const output v = values[static_cast<std::size_t>(e.results[j])];
    const auto& vs = v.type().shape;
    if (!vs || !vs->is_fully_defined()) {
      c.fail(fmt::format("result {} (%{}) has no fully defined shape", j, e.results[j]));
    }
    partial[static_cast<std::size_t>(e.results[j])].push_back(sum_to(c, c.grad(j), *vs));
  }

  const gradient_registry& registry = gradient_registry::global();
  for (std::size_t k = e.instrs.size(); k-- > 0;) {
    const auto v = static_cast<std::size_t>(e.num_inputs) + k;
    if (partial[v].empty()) continue;
    const fused_instr& in = e.instrs[k];
    const node& prim = values[v].producer();
    if (!registry.knows(prim.op())) {
      c.fail(
          fmt::format("instruction {} ({}) of its expression is on the path to the loss, and "
                      "op {} has no gradient",
                      k, info(in.op).name, prim.op()));
    }
    const gradient_fn* fn = registry.find(prim.op());
    if (fn == nullptr) continue;  // not differentiable: nothing flows back through it
    grads in_grads;
    {
      const gradient_context pc(c.builder(), prim, {sum_of(partial[v])});
      in_grads = (*fn)(pc);
    }
    for (int j = 0; j < info(in.op).arity; ++j) {
      const fused_operand& a = in.args[static_cast<std::size_t>(j)];
      const auto idx = static_cast<std::size_t>(j);
      if (a.is_literal() || idx >= in_grads.size() || !in_grads[idx]) continue;
      partial[static_cast<std::size_t>(a.value)].push_back(*in_grads[idx]);
    }
  }

  grads out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!partial[i].empty()) out[i] = sum_of(partial[i]);
  }
  return out;
}

}  // namespace

void register_fused_gradients(gradient_registry& r) {
  r.add("fused_elementwise", fused_grad);
}

}  // namespace loom
