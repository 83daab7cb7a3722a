// constant_folding: subgraphs whose inputs are all constants are evaluated once, when the
// plan is made, and replaced by their results.
//
// Foldable: a deterministic op (not stateful; random ops are functions of their seed, so
// they count) whose data inputs all come from constants or other foldable nodes, with no
// control inputs. The pass evaluates the whole foldable region in one run of the
// evaluator (the session's CPU device), fetching only the region's frontier: the values
// read by nodes outside it or fetched. Each frontier value becomes a `const`.
// Refused, with the reason in the log:
//   - a frontier value above pass_options::max_folded_bytes (it would be kept in memory for
//     the plan's life instead of being computed and freed each run), or of unknown shape;
//   - a region the evaluator fails on (no CPU kernel, a kernel error): left to run as
//     written, where the error, if real, surfaces with the run.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>

#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

bool is_source(const node& n) {
  const std::string& op = n.op();
  return op == "const" || op == "_arg" || op == "placeholder" || op == "variable";
}

std::optional<std::size_t> known_bytes(const tensor_type& t) {
  if (!t.shape || !t.shape->is_fully_defined()) return std::nullopt;
  return static_cast<std::size_t>(t.shape->num_elements()) * size_of(t.type);
}

class constant_folding final : public graph_pass {
 public:
  constant_folding() : graph_pass("constant_folding") {}

 private:
  bool do_run(pass_context& ctx) override {
    if (!ctx.evaluate()) return false;
    graph_editor& ed = ctx.editor();
    const auto order = ed.topological_order();

    // The foldable region.
    std::vector<bool> foldable(ed.g().num_nodes(), false);
    std::vector<node_id> region;
    for (node_id id : order) {
      const node& n = ed.at(id);
      if (n.def->is_stateful || is_source(n) || !ed.control_inputs(id).empty()) continue;
      if (n.outputs.empty()) continue;
      bool all_constant = true;
      for (endpoint e : ed.inputs(id)) {
        const node& p = ed.at(e.node);
        all_constant =
            all_constant && (p.op() == "const" || foldable[static_cast<std::size_t>(e.node)]);
      }
      if (!all_constant) continue;
      foldable[static_cast<std::size_t>(id)] = true;
      region.push_back(id);
    }
    if (region.empty()) return false;

    // Its frontier: values read outside the region, or fetched.
    std::vector<endpoint> frontier;
    for (node_id id : region) {
      const node& n = ed.at(id);
      for (std::size_t k = 0; k < n.outputs.size(); ++k) {
        const endpoint e{id, static_cast<std::int32_t>(k)};
        bool outside = ed.is_fetched(e) || ed.has_control_users(id);
        for (const use& u : ed.uses(e))
          outside = outside || !foldable[static_cast<std::size_t>(u.node)];
        if (!outside) continue;
        const auto bytes = known_bytes(n.outputs[k]);
        if (!bytes) {
          ctx.refused({n.name},
                      fmt::format("its result's shape is not known ({})", to_string(n.outputs[k])));
        } else if (*bytes > ctx.options().max_folded_bytes) {
          ctx.refused({n.name},
                      fmt::format("its result takes {} bytes, above max_folded_bytes ({})", *bytes,
                                  ctx.options().max_folded_bytes));
        } else {
          frontier.push_back(e);
        }
      }
    }
    if (frontier.empty()) return false;

    // The region as a graph of its own: its constants, then its nodes.
    graph sub(ed.g().ops());
    std::unordered_map<node_id, node_id> in_sub;
    auto copy = [&](node_id id) {
      const node& n = ed.at(id);
      node_spec spec{.name = n.name,
                     .op = n.op(),
                     .inputs = {},
                     .attrs = n.attrs,
                     .device = {},
                     .control_inputs = {}};
      for (endpoint e : ed.inputs(id)) spec.inputs.push_back({in_sub.at(e.node), e.index});
      in_sub.emplace(id, sub.add_node(std::move(spec)).id);
    };
    for (node_id id : region) {
      for (endpoint e : ed.inputs(id)) {
        if (!foldable[static_cast<std::size_t>(e.node)] && !in_sub.contains(e.node)) copy(e.node);
      }
      copy(id);
    }
    std::vector<endpoint> fetches;
    for (endpoint e : frontier) fetches.push_back({in_sub.at(e.node), e.index});
    std::vector<tensor> values;
    try {
      values = ctx.evaluate()(sub, fetches);
    } catch (const std::exception& ex) {
      ctx.refused(names_of(ed, region), fmt::format("evaluating them failed: {}", ex.what()));
      return false;
    }

    std::vector<std::string> folded_names;
    for (std::size_t i = 0; i < frontier.size(); ++i) {
      const endpoint e = frontier[i];
      const node& n = ed.at(e.node);
      if (values[i].device().type != device_type::cpu) continue;
      const node_id c = ed.add(
          {.name = ed.g().unique_name(e.index == 0 ? n.name + "/folded"
                                                   : fmt::format("{}/folded_{}", n.name, e.index)),
           .op = "const",
           .inputs = {},
           .attrs = {{"value", values[i]}},
           .device = n.requested_device,
           .control_inputs = {}});
      ed.replace_uses(e, {c, 0});
      if (ed.has_control_users(e.node)) ed.replace_node(e.node, c);
      folded_names.push_back(ed.at(c).name);
    }
    ctx.rewrote(names_of(ed, region), fmt::format("const {}", fmt::join(folded_names, ", ")));
    return true;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_constant_folding() {
  return std::make_unique<constant_folding>();
}

}  // namespace loom::passes
