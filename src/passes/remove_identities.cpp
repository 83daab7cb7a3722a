// remove_identities: identity nodes, and ops that return their input unchanged.
//
// Matches (the output must have the input's dtype and known shape, so no broadcast hides
// in the "no-op"):
//   identity(x); x * 1, 1 * x; x / 1; x - (+0); x + (-0), (-0) + x for floats (IEEE:
//   x + -0 is x for every x, x + +0 turns -0 into +0), x + 0 for integers; cast to the same
//   dtype; reshape / broadcast_to to the same shape; transpose by the identity permutation.
// Refuses (and says so only where a user would wonder):
//   - a node asking for another device than its input's producer: it is a copy the user
//     asked for (docs/runtime.md, "Placement");
//   - an identity of a stateful node's output (a variable read): kept as the read;
//   - nodes with control edges in or out, and signature targets.
#include <fmt/format.h>

#include <cmath>

#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

// The input a no-op node passes through, or nullopt.
std::optional<endpoint> passes_through(const graph_editor& ed, node_id id) {
  const node& n = ed.at(id);
  const auto& in = ed.inputs(id);
  const std::string& op = n.op();
  if (op == "identity") return in[0];
  auto fits = [&](endpoint x) {
    const tensor_type& out = n.outputs[0];
    const tensor_type& t = ed.type_of(x);
    return t.type == out.type && same_known_shape(t.shape, out.shape);
  };
  if (op == "cast" || op == "reshape" || op == "broadcast_to") {
    return fits(in[0]) ? std::optional(in[0]) : std::nullopt;
  }
  if (op == "transpose") {
    const auto perm = n.attr<std::vector<std::int64_t>>("perm");
    bool identity = !perm.empty();
    for (std::size_t k = 0; k < perm.size(); ++k)
      identity = identity && perm[k] == static_cast<std::int64_t>(k);
    const auto& s = ed.type_of(in[0]).shape;
    if (s && s->rank() <= 1) identity = true;
    return identity && fits(in[0]) ? std::optional(in[0]) : std::nullopt;
  }
  if (in.size() != 2) return std::nullopt;
  const bool floats = is_floating(n.outputs[0].type);
  auto is = [&](endpoint c, double v, bool negative_zero) {
    const auto u = uniform_constant(ed, c);
    if (!u || *u != v) return false;
    if (v == 0.0 && floats) return std::signbit(*u) == negative_zero;
    return true;
  };
  if (op == "mul") {
    if (is(in[1], 1.0, false) && fits(in[0])) return in[0];
    if (is(in[0], 1.0, false) && fits(in[1])) return in[1];
  } else if (op == "div") {
    if (is(in[1], 1.0, false) && fits(in[0])) return in[0];
  } else if (op == "sub") {
    if (is(in[1], 0.0, false) && fits(in[0])) return in[0];
  } else if (op == "add") {
    if (is(in[1], 0.0, true) && fits(in[0])) return in[0];
    if (is(in[0], 0.0, true) && fits(in[1])) return in[1];
  }
  return std::nullopt;
}

class remove_identities final : public graph_pass {
 public:
  remove_identities() : graph_pass("remove_identities") {}

 private:
  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    bool changed = false;
    for (node_id id : ed.topological_order()) {
      const node& n = ed.at(id);
      if (n.outputs.size() != 1 || n.def->is_stateful) continue;
      const auto x = passes_through(ed, id);
      if (!x) continue;
      const node& producer = ed.at(x->node);
      if (!same_request(n, producer)) {
        ctx.refused({n.name},
                    fmt::format("asks for device '{}' while its input's producer '{}' asks "
                                "for '{}': a copy the graph asked for",
                                n.requested_device, producer.name, producer.requested_device));
        continue;
      }
      if (n.op() == "identity" && producer.def->is_stateful) continue;  // a variable's read
      if (ed.is_pinned(id) || ed.has_control_users(id) || !ed.control_inputs(id).empty()) continue;
      ed.replace_uses({id, 0}, *x);
      ed.erase(id);
      ctx.rewrote({n.name}, fmt::format("its input {}", ed.g().endpoint_name(*x)));
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_remove_identities() {
  return std::make_unique<remove_identities>();
}

}  // namespace loom::passes
