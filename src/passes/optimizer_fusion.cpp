// optimizer_fusion: per-parameter updates (apply_sgd, apply_adam, apply_adamw) of one step
// become one multi-tensor update (fused_sgd, fused_adam, fused_adamw), which walks every
// parameter in one kernel call (include/loom/graph/ops/optimizer.hpp).
//
// Matches the apply nodes of one op that share every hyperparameter attribute (momentum,
// betas, eps, weight decay, moment dtype, master weights, ...), the lr input and the step
// input (the same tensors, not equal values), and the device requests of the nodes and of
// their variables (Note [fused optimizer placement]: a fused node runs where its first
// parameter lives). Each group of two or more becomes one fused node over the group's
// parameters in topological order, with the same attributes, max_grad_norm 0 (no clipping),
// check_finite false (no skipped step when a gradient is inf or NaN) and a grad_scale of 1
// (a `ones` node), so it computes what the applies computed: the fused and per-tensor
// kernels run the same element math on the same state (`<param>/adam_m`, ...) and agree
// bitwise. The fused node takes the applies' place (graph_editor::replace_node: targets
// and nodes waiting for an apply wait for it), and the applies are removed.
//
// Left alone, and logged with the reason:
//   - applies of one op split by differing hyperparameters, lr or step inputs, device
//     requests or their variables' device requests: one fused node per group, each
//     logged against the largest group;
//   - an apply that waits, through data or control edges, for another apply of its group
//     (fusing them would make the fused node wait for itself);
//   - a second apply of the same variable in a group (the fused kernel updates each
//     variable once);
//   - an apply whose parameter is not a variable's output (fed, say);
//   - an op with no fused kernel on the requested device type.
// A group of one stays as it is.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

bool is_apply(const std::string& op) {
  return op == "apply_sgd" || op == "apply_adam" || op == "apply_adamw";
}

class optimizer_fusion final : public graph_pass {
 public:
  optimizer_fusion() : graph_pass("optimizer_fusion") {}

 private:
  struct group {
    std::vector<node_id> members;
    std::vector<std::string> variables;
  };

  // The apply's step input, or the lr again for SGD (which has none).
  static endpoint step_of(const graph_editor& ed, node_id a) {
    const auto& in = ed.inputs(a);
    return in.size() > 3 ? in[3] : in[2];
  }

  // What keeps apply `b` out of the group whose first member is `a` (same op); empty when
  // nothing does.
  static std::string difference(const graph_editor& ed, node_id a, node_id b) {
    const node& na = ed.at(a);
    const node& nb = ed.at(b);
    if (!same_request(na, nb)) {
      return fmt::format("it asks for device '{}', '{}' for '{}'", nb.requested_device, na.name,
                         na.requested_device);
    }
    const node& va = ed.at(ed.inputs(a)[0].node);
    const node& vb = ed.at(ed.inputs(b)[0].node);
    if (!same_request(va, vb)) {
      return fmt::format("its variable '{}' asks for device '{}', '{}' for '{}'", vb.name,
                         vb.requested_device, va.name, va.requested_device);
    }
    for (const auto& [name, value] : na.attrs) {
      const auto it = nb.attrs.find(name);
      if (it == nb.attrs.end() || !(it->second == value)) {
        return fmt::format("its {} is {}, '{}' has {}", name,
                           it == nb.attrs.end() ? "unset" : it->second.to_string(), na.name,
                           value.to_string());
      }
    }
    if (ed.inputs(a)[2] != ed.inputs(b)[2]) {
      return fmt::format("its lr is '{}', '{}' reads '{}'", ed.g().endpoint_name(ed.inputs(b)[2]),
                         na.name, ed.g().endpoint_name(ed.inputs(a)[2]));
    }
    if (step_of(ed, a) != step_of(ed, b)) {
      return fmt::format("its step is '{}', '{}' reads '{}'", ed.g().endpoint_name(step_of(ed, b)),
                         na.name, ed.g().endpoint_name(step_of(ed, a)));
    }
    return {};
  }

  // Nodes that depend on `id` (through data and control edges), marked in `down`.
  static void mark_downstream(const std::vector<std::vector<node_id>>& readers, node_id id,
                              std::vector<bool>& down) {
    std::vector<node_id> stack{id};
    while (!stack.empty()) {
      const node_id n = stack.back();
      stack.pop_back();
      for (node_id r : readers[static_cast<std::size_t>(n)]) {
        if (!down[static_cast<std::size_t>(r)]) {
          down[static_cast<std::size_t>(r)] = true;
          stack.push_back(r);
        }
      }
    }
  }

  static bool fuse(graph_editor& ed, pass_context& ctx, const group& g) {
    const node& first = ed.at(g.members.front());
    const std::string fused_op = "fused_" + first.op().substr(std::string("apply_").size());
    // The node runs where its first variable lives (colocation): that request counts when
    // the update asks for none.
    const node& var = ed.at(ed.inputs(g.members.front())[0].node);
    const std::string& request =
        first.requested_device.empty() ? var.requested_device : first.requested_device;
    if (auto why = missing_kernel(fused_op, {}, request)) {
      ctx.refused(names_of(ed, g.members), *why);
      return false;
    }
    const bool has_step = first.op() != "apply_sgd";
    std::vector<endpoint> inputs;
    for (node_id m : g.members) inputs.push_back(ed.inputs(m)[0]);
    for (node_id m : g.members) inputs.push_back(ed.inputs(m)[1]);
    inputs.push_back(ed.inputs(g.members.front())[2]);
    if (has_step) inputs.push_back(ed.inputs(g.members.front())[3]);
    const node_id scale = ed.add({.name = ed.g().unique_name(first.name + "/grad_scale"),
                                  .op = "ones",
                                  .inputs = {},
                                  .attrs = {{"dtype", dtype::f32}, {"shape", shape{}}},
                                  .device = first.requested_device,
                                  .control_inputs = {}});
    inputs.push_back({scale, 0});
    attr_map attrs = first.attrs;
    attrs.emplace("N", static_cast<std::int64_t>(g.members.size()));  // two lists: not inferred
    attrs.emplace("max_grad_norm", 0.0);
    attrs.emplace("check_finite", false);
    // What any member waited for, the fused node waits for (no member waits for another:
    // the grouping's cycle rule).
    std::vector<node_id> waits;
    for (node_id m : g.members) {
      for (node_id c : ed.control_inputs(m)) {
        if (std::find(waits.begin(), waits.end(), c) == waits.end()) waits.push_back(c);
      }
    }
    const node_id fused = ed.add({.name = ed.g().unique_name("fused/" + first.name),
                                  .op = fused_op,
                                  .inputs = std::move(inputs),
                                  .attrs = std::move(attrs),
                                  .device = first.requested_device,
                                  .control_inputs = std::move(waits)});
    const auto names = names_of(ed, g.members);
    for (node_id m : g.members) {
      ed.replace_node(m, fused);
      ed.erase(m);
    }
    std::string vars;
    for (const auto& v : g.variables) vars += fmt::format("{}'{}'", vars.empty() ? "" : ", ", v);
    ctx.rewrote(names, fmt::format("{} '{}' over {} parameters ({})", fused_op, ed.at(fused).name,
                                   g.members.size(), vars));
    return true;
  }

  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    const auto order = ed.topological_order();
    // Readers of each node through data and control edges, for the cycle rule.
    std::vector<std::vector<node_id>> readers(ed.g().num_nodes());
    for (node_id id : order) {
      for (endpoint e : ed.inputs(id)) readers[static_cast<std::size_t>(e.node)].push_back(id);
      for (node_id c : ed.control_inputs(id)) readers[static_cast<std::size_t>(c)].push_back(id);
    }
    // Candidates per op, in graph order, split into groups of equal keys.
    std::map<std::string, std::vector<group>> by_op;
    std::map<node_id, std::vector<bool>> down_of;  // per group leader
    for (node_id id : order) {
      const node& n = ed.at(id);
      if (!is_apply(n.op())) continue;
      const node& var = ed.at(ed.inputs(id)[0].node);
      if (var.op() != "variable") {
        ctx.refused({n.name}, fmt::format("its parameter '{}' is not a variable's output ({})",
                                          ed.g().endpoint_name(ed.inputs(id)[0]), var.describe()));
        continue;
      }
      auto& groups = by_op[n.op()];
      bool placed = false;
      for (group& g : groups) {
        if (!difference(ed, g.members.front(), id).empty()) continue;
        auto& down_g = down_of[g.members.front()];
        if (down_g[static_cast<std::size_t>(id)]) {
          ctx.refused({n.name}, fmt::format("not fused with '{}': it waits for an update of that "
                                            "group, and fusing would make the fused node wait for "
                                            "itself",
                                            ed.at(g.members.front()).name));
          placed = true;
          break;
        }
        if (std::find(g.variables.begin(), g.variables.end(), var.name) != g.variables.end()) {
          ctx.refused({n.name}, fmt::format("not fused with '{}': its group updates variable '{}' "
                                            "already",
                                            ed.at(g.members.front()).name, var.name));
          placed = true;
          break;
        }
        g.members.push_back(id);
        g.variables.push_back(var.name);
        mark_downstream(readers, id, down_g);
        placed = true;
        break;
      }
      if (!placed) {
        groups.push_back({{id}, {var.name}});
        auto& down_g = down_of[id];
        down_g.assign(ed.g().num_nodes(), false);
        mark_downstream(readers, id, down_g);
      }
    }
    bool changed = false;
    for (auto& [op, groups] : by_op) {
      // The largest group is the reference the others are logged against.
      const auto largest = std::max_element(
          groups.begin(), groups.end(),
          [](const group& a, const group& b) { return a.members.size() < b.members.size(); });
      for (auto it = groups.begin(); it != groups.end(); ++it) {
        if (it != largest) {
          ctx.refused(names_of(ed, it->members),
                      fmt::format("not fused with '{}': {}", ed.at(largest->members.front()).name,
                                  difference(ed, largest->members.front(), it->members.front())));
        }
      }
      for (const group& g : groups) {
        if (g.members.size() >= 2) changed = fuse(ed, ctx, g) || changed;
      }
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_optimizer_fusion() {
  return std::make_unique<optimizer_fusion>();
}

}  // namespace loom::passes
