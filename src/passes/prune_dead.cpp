// prune_dead: removes nodes whose results nothing reads any more.
//
// The session already copies only what a signature needs; this pass removes what the other
// passes left behind (the inputs of a folded constant, the members of a fused group, a
// duplicate's producers). Kept whatever happens: stateful nodes (variables, updates),
// signature targets and fed values, and nodes something waits for.
#include <fmt/format.h>

#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

class prune_dead final : public graph_pass {
 public:
  prune_dead() : graph_pass("prune_dead") {}

 private:
  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    const auto order = ed.topological_order();
    std::vector<node_id> removed;
    // Readers first, so a chain of dead nodes goes in one sweep.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const node_id id = *it;
      const node& n = ed.at(id);
      if (n.def->is_stateful || ed.is_pinned(id) || !unused(ed, id)) continue;
      ed.erase(id);
      removed.push_back(id);
    }
    if (removed.empty()) return false;
    ctx.rewrote(names_of(ed, removed),
                fmt::format("removed ({} nodes nothing reads)", removed.size()));
    return true;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_prune_dead() {
  return std::make_unique<prune_dead>();
}

}  // namespace loom::passes
