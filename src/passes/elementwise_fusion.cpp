// elementwise_fusion: maximal groups of element-wise ops become one fused_elementwise node,
// computed in one pass over memory (the CPU kernel keeps intermediates in L1 tiles).
//
// Members: nodes whose op has an ew_op (include/loom/graph/fused_expr.hpp), of a float
// dtype, with fully known shapes, no control edges, not a signature target.
//
// Growing a group. Nodes are visited from the last in topological order to the first; an
// unclaimed member starts a group (its root), which then takes its producers, latest
// first, so every consumer of a producer has been decided before the producer is. A
// producer joins when:
//   - it asks for the same device as the root (a request is the user's word);
//   - the group is below pass_options::max_fused_ops;
//   - its value is read only inside the group, or, when it is also read outside (or
//     fetched), it has the group's full shape: it becomes another result of the fused node
//     (multi-output fusion, what keeps a forward activation available to its gradient). A
//     value of a smaller shape read outside would need a result of another shape;
//   - taking it makes no cycle: no path leaves it through a node outside the group and
//     comes back into the group (which would make the fused node its own input).
// Every producer that is a member but does not join is logged with the rule it broke.
// Finite constants of one element (the scalars of `x * 2.0`) whose rank does not exceed
// the group's become literals of the expression; NaN and infinite ones stay inputs.
//
// A group of one op stays as it is: its own kernel is already one pass.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <queue>
#include <unordered_map>
#include <variant>

#include "loom/graph/fused_expr.hpp"
#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

class elementwise_fusion final : public graph_pass {
 public:
  elementwise_fusion() : graph_pass("elementwise_fusion") {}

 private:
  struct state {
    graph_editor& ed;
    std::vector<std::int32_t> pos;  // topological position, -1 for dead nodes
    std::vector<bool> claimed;      // in some group already
  };

  // A node that could be part of a group (before the rules about its neighbours).
  static bool member(const graph_editor& ed, node_id id) {
    const node& n = ed.at(id);
    if (!fusable_op(n) || n.outputs.size() != 1) return false;
    return is_floating(n.outputs[0].type) && n.outputs[0].shape &&
           n.outputs[0].shape->is_fully_defined() && !ed.is_pinned(id) &&
           !ed.has_control_users(id) && ed.control_inputs(id).empty();
  }

  // True when a path from `id` through nodes outside `in_group` reaches the group.
  static bool makes_cycle(const state& s, node_id id, const std::vector<bool>& in_group,
                          std::int32_t below) {
    std::vector<node_id> stack;
    std::vector<bool> seen(s.pos.size(), false);
    for (const use& u : s.ed.uses({id, 0})) {
      if (!in_group[static_cast<std::size_t>(u.node)]) stack.push_back(u.node);
    }
    while (!stack.empty()) {
      const node_id cur = stack.back();
      stack.pop_back();
      if (seen[static_cast<std::size_t>(cur)] || s.pos[static_cast<std::size_t>(cur)] >= below)
        continue;
      seen[static_cast<std::size_t>(cur)] = true;
      const node& n = s.ed.at(cur);
      for (std::size_t k = 0; k < n.outputs.size(); ++k) {
        for (const use& u : s.ed.uses({cur, static_cast<std::int32_t>(k)})) {
          if (in_group[static_cast<std::size_t>(u.node)]) return true;
          stack.push_back(u.node);
        }
      }
    }
    return false;
  }

  // The members of the group rooted at `root`, in no particular order.
  static std::vector<node_id> grow(state& s, pass_context& ctx, node_id root) {
    const graph_editor& ed = s.ed;
    const node& r = ed.at(root);
    const shape& group_shape = *r.outputs[0].shape;
    std::vector<bool> in_group(s.pos.size(), false);
    std::vector<node_id> members{root};
    in_group[static_cast<std::size_t>(root)] = true;
    auto later_first = [&](node_id a, node_id b) {
      return s.pos[static_cast<std::size_t>(a)] < s.pos[static_cast<std::size_t>(b)];
    };
    std::priority_queue<node_id, std::vector<node_id>, decltype(later_first)> todo(later_first);
    std::vector<bool> queued(s.pos.size(), false);
    auto push_inputs = [&](node_id id) {
      for (endpoint e : ed.inputs(id)) {
        if (!queued[static_cast<std::size_t>(e.node)] &&
            !in_group[static_cast<std::size_t>(e.node)]) {
          queued[static_cast<std::size_t>(e.node)] = true;
          todo.push(e.node);
        }
      }
    };
    push_inputs(root);
    while (!todo.empty()) {
      const node_id p = todo.top();
      todo.pop();
      if (s.claimed[static_cast<std::size_t>(p)] || !member(ed, p)) continue;
      const node& pn = ed.at(p);
      if (pn.outputs[0].type != r.outputs[0].type) continue;
      auto refuse = [&](const std::string& why) {
        ctx.refused({pn.name}, fmt::format("not fused into the group of '{}': {}", r.name, why));
      };
      if (!same_request(pn, r)) {
        refuse(fmt::format("it asks for device '{}', the group for '{}'", pn.requested_device,
                           r.requested_device));
        continue;
      }
      if (members.size() >= ctx.options().max_fused_ops) {
        refuse(
            fmt::format("the group has reached max_fused_ops ({})", ctx.options().max_fused_ops));
        continue;
      }
      const endpoint out{p, 0};
      std::string outside;
      for (const use& u : ed.uses(out)) {
        if (!in_group[static_cast<std::size_t>(u.node)]) outside = ed.at(u.node).name;
      }
      if (outside.empty() && ed.is_fetched(out)) outside = "a fetch";
      if (!outside.empty()) {
        if (!same_known_shape(pn.outputs[0].shape, group_shape)) {
          refuse(fmt::format(
              "its value ({}) is also read by {} outside the group, and a result "
              "must have the group's shape {}",
              to_string(pn.outputs[0]), outside == "a fetch" ? outside : "'" + outside + "'",
              to_string(group_shape)));
          continue;
        }
        if (makes_cycle(s, p, in_group, s.pos[static_cast<std::size_t>(root)])) {
          refuse(
              fmt::format("'{}' reads it outside the group and feeds the group back: fusing "
                          "would make a cycle",
                          outside));
          continue;
        }
      }
      in_group[static_cast<std::size_t>(p)] = true;
      members.push_back(p);
      push_inputs(p);
    }
    return members;
  }

  static void emit(state& s, pass_context& ctx, node_id root, std::vector<node_id> members) {
    graph_editor& ed = s.ed;
    const node& r = ed.at(root);
    const std::size_t group_rank = r.outputs[0].shape->rank();
    std::sort(members.begin(), members.end(), [&](node_id a, node_id b) {
      return s.pos[static_cast<std::size_t>(a)] < s.pos[static_cast<std::size_t>(b)];
    });
    std::unordered_map<node_id, std::int32_t> member_index;  // member -> instruction
    for (std::size_t i = 0; i < members.size(); ++i)
      member_index.emplace(members[i], static_cast<std::int32_t>(i));

    // Operands: members' values, literals, or the fused node's inputs.
    std::vector<endpoint> inputs;
    bool literals = true;  // one-element constants become literals (see below)
    auto operand = [&](endpoint e) -> std::variant<endpoint, fused_operand> {
      if (auto it = member_index.find(e.node); it != member_index.end()) {
        return fused_operand{.value = it->second, .literal = 0.0};  // fixed up below
      }
      const tensor_type& t = ed.type_of(e);
      if (literals && t.shape && t.shape->num_elements() == 1 && t.shape->rank() <= group_rank) {
        // A literal is finite (fused_expr::validate): a NaN or infinite constant stays an
        // input, read as a one-element tensor.
        if (auto v = uniform_constant(ed, e, 1); v && std::isfinite(*v)) {
          return fused_operand{.value = -1, .literal = *v};
        }
      }
      return e;
    };
    struct pending_instr {
      ew_op op;
      std::array<std::variant<endpoint, fused_operand>, 2> args;
      int arity;
    };
    // Literals must not change the fused node's shape: the broadcast of its inputs has to
    // be the group's. A one-element constant of the group's rank that is the only operand
    // giving a dimension would be lost, so when the inputs alone fall short, no constant
    // becomes a literal.
    auto inputs_broadcast_to_group = [&] {
      shape all;
      for (endpoint e : inputs) all = broadcast_shapes(all, *ed.type_of(e).shape);
      return all == *r.outputs[0].shape;
    };
    std::vector<pending_instr> pending;
    for (;;) {
      pending.clear();
      inputs.clear();
      for (node_id m : members) {
        const ew_op op = *fusable_op(ed.at(m));
        pending_instr pi{op, {}, info(op).arity};
        for (int k = 0; k < pi.arity; ++k) {
          pi.args[static_cast<std::size_t>(k)] = operand(ed.inputs(m)[static_cast<std::size_t>(k)]);
          if (const auto* e = std::get_if<endpoint>(&pi.args[static_cast<std::size_t>(k)])) {
            if (std::find(inputs.begin(), inputs.end(), *e) == inputs.end()) inputs.push_back(*e);
          }
        }
        pending.push_back(pi);
      }
      if (literals && !inputs_broadcast_to_group()) {
        literals = false;
        continue;
      }
      break;
    }
    if (inputs.empty()) return;  // constant through and through: folding's business

    fused_expr expr;
    expr.num_inputs = static_cast<std::int32_t>(inputs.size());
    for (const auto& pi : pending) {
      fused_instr in{pi.op, {}};
      for (int k = 0; k < pi.arity; ++k) {
        const auto& a = pi.args[static_cast<std::size_t>(k)];
        if (const auto* e = std::get_if<endpoint>(&a)) {
          const auto at = std::find(inputs.begin(), inputs.end(), *e) - inputs.begin();
          in.args[static_cast<std::size_t>(k)] = {static_cast<std::int32_t>(at), 0.0};
        } else {
          fused_operand o = std::get<fused_operand>(a);
          if (!o.is_literal()) o.value += expr.num_inputs;  // member i is value N + i
          in.args[static_cast<std::size_t>(k)] = o;
        }
      }
      expr.instrs.push_back(in);
    }
    std::vector<node_id> result_members;
    std::vector<std::int64_t> results;
    for (std::size_t i = 0; i < members.size(); ++i) {
      const endpoint out{members[i], 0};
      bool outside = ed.is_fetched(out);
      for (const use& u : ed.uses(out)) outside = outside || !member_index.contains(u.node);
      if (!outside) continue;
      result_members.push_back(members[i]);
      results.push_back(expr.num_inputs + static_cast<std::int64_t>(i));
      expr.results.push_back(expr.num_inputs + static_cast<std::int32_t>(i));
    }
    if (results.empty()) return;  // nothing reads the group: prune_dead's business
    expr.validate();

    const node_id fused = ed.add({.name = ed.g().unique_name("fused/" + r.name),
                                  .op = "fused_elementwise",
                                  .inputs = inputs,
                                  .attrs = {{"expr", expr.to_string()},
                                            {"results", results},
                                            {"M", static_cast<std::int64_t>(results.size())}},
                                  .device = r.requested_device,
                                  .control_inputs = {}});
    for (std::size_t j = 0; j < result_members.size(); ++j) {
      ed.replace_uses({result_members[j], 0}, {fused, static_cast<std::int32_t>(j)});
    }
    const auto names = names_of(ed, members);
    for (auto it = members.rbegin(); it != members.rend(); ++it) ed.erase(*it);
    for (node_id m : members) s.claimed[static_cast<std::size_t>(m)] = true;
    ctx.rewrote(names, fmt::format("fused_elementwise '{}' ({} ops, {} inputs, {} results): {}",
                                   ed.at(fused).name, members.size(), inputs.size(), results.size(),
                                   expr.to_string()));
  }

  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    const auto order = ed.topological_order();
    state s{ed, std::vector<std::int32_t>(ed.g().num_nodes(), -1),
            std::vector<bool>(ed.g().num_nodes(), false)};
    for (std::size_t i = 0; i < order.size(); ++i)
      s.pos[static_cast<std::size_t>(order[i])] = static_cast<std::int32_t>(i);
    bool changed = false;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const node_id root = *it;
      if (s.claimed[static_cast<std::size_t>(root)] || !ed.alive(root) || !member(ed, root))
        continue;
      auto members = grow(s, ctx, root);
      if (members.size() < 2) continue;
      // New nodes get ids past the order's end: keep pos and claimed covering them.
      emit(s, ctx, root, std::move(members));
      s.pos.resize(ed.g().num_nodes(), -1);
      s.claimed.resize(ed.g().num_nodes(), true);
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_elementwise_fusion() {
  return std::make_unique<elementwise_fusion>();
}

}  // namespace loom::passes
