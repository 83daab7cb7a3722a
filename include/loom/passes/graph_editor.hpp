// graph_editor: the mutable view of a graph that passes rewrite.
//
// A loom::graph only grows (Note [graph ids are topological]); a pass needs to add nodes,
// point readers at other tensors and drop nodes. The editor holds a working copy of the
// part of a graph that one (feeds, fetches, targets) signature needs, and keeps beside it
// what the copy cannot express: each node's current inputs, who reads every tensor, which
// nodes are gone, and the signature's pins (the endpoints fed and fetched, the nodes
// targeted). When the passes are done, `finish` writes a compact graph in topological order
// and says where each pin went.
//
// Signature (how the session hands a plan's graph to the passes):
//   - Fed endpoints become placeholders of their type: a fed value is opaque to the passes
//     (never folded), and whatever computed it before is not part of the copy.
//   - Only the nodes that the fetches and targets need are copied, plus the variables that
//     a copied node names by attribute (assign's `variable`), which kernels look up.
//
// Pins: a fetched endpoint follows replace_uses (a fetch of a tensor that a pass replaced
// reads the replacement); targets and stateful nodes are never erased.
//
// Not thread-safe; one editor per plan being built.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "loom/graph/graph.hpp"

namespace loom::passes {

/// One reader of a tensor: input `index` of node `node`.
struct use {
  node_id node = -1;
  std::int32_t index = 0;
  friend bool operator==(use, use) = default;
};

/// What a plan needs of a graph.
struct signature {
  std::vector<endpoint> feeds;
  std::vector<endpoint> fetches;
  std::vector<node_id> targets;
};

/// The nodes of `g` that `sig`'s fetches and targets need: a walk back along data and
/// control inputs, cut at fed endpoints. With `named_variables`, also the nodes a needed
/// node names by attribute (assign's variable), which its kernel looks up.
std::vector<bool> needed_nodes(const graph& g, const signature& sig, bool named_variables = false);

/// The graph the passes produced, and the signature's endpoints in it.
struct rewritten_graph {
  graph g;
  /// One per signature feed: the placeholder standing for it.
  std::vector<endpoint> feeds;
  std::vector<endpoint> fetches;
  std::vector<node_id> targets;
};

class graph_editor {
 public:
  /// A working copy of the part of `source` that `sig` needs. Throws loom::not_found /
  /// invalid_argument when the signature names endpoints or nodes not in `source`.
  graph_editor(const graph& source, const signature& sig);

  /// The working graph. Its nodes' `inputs` fields are stale once a pass has rewired them:
  /// read inputs through inputs() below.
  [[nodiscard]] const graph& g() const noexcept { return work_; }
  [[nodiscard]] const node& at(node_id id) const { return work_.at(id); }
  [[nodiscard]] bool alive(node_id id) const { return alive_.at(static_cast<std::size_t>(id)); }
  /// The node's current inputs. The references these accessors return stay valid while
  /// nodes are added (not while the node's readers are moved).
  [[nodiscard]] const std::vector<endpoint>& inputs(node_id id) const {
    return inputs_.at(static_cast<std::size_t>(id));
  }
  /// The node's current control inputs.
  [[nodiscard]] const std::vector<node_id>& control_inputs(node_id id) const {
    return controls_.at(static_cast<std::size_t>(id));
  }
  [[nodiscard]] const tensor_type& type_of(endpoint e) const { return work_.type_of(e); }
  /// The live readers of `e` (data edges only).
  [[nodiscard]] const std::vector<use>& uses(endpoint e) const;
  /// Live nodes that wait for `id` through a control edge.
  [[nodiscard]] bool has_control_users(node_id id) const;
  /// `e` is fetched.
  [[nodiscard]] bool is_fetched(endpoint e) const;
  /// A signature target, a stateful op, or a placeholder standing for a feed: never erased.
  [[nodiscard]] bool is_pinned(node_id id) const;
  /// Live nodes in a topological order (inputs before readers), computed afresh.
  [[nodiscard]] std::vector<node_id> topological_order() const;
  [[nodiscard]] std::size_t live_count() const noexcept { return live_; }

  /// Adds a node whose inputs are endpoints of live nodes; returns its id. Validation and
  /// inference as graph::add_node (and its exceptions). A spec without a name gets a unique
  /// one from its op.
  node_id add(node_spec spec);
  /// Every live reader of `from`, and a fetch of it, reads `to` instead. `to` must have
  /// `from`'s dtype and a shape that fits it (checked: loom::invalid_argument).
  void replace_uses(endpoint from, endpoint to);
  /// `to` takes `from`'s place as a node: nodes waiting for `from` wait for `to`, and a
  /// target `from` becomes `to` (data readers move with replace_uses, per output). For a
  /// pass replacing a stateful node (an update) that it then erases.
  void replace_node(node_id from, node_id to);
  /// Removes a node that nothing reads any more. Throws loom::invalid_argument when it
  /// still has readers (data or control) or is pinned.
  void erase(node_id id);

  /// The compact result: live nodes re-added in topological order (so every invariant of
  /// graph::add_node is checked again), and the signature's endpoints in it.
  [[nodiscard]] rewritten_graph finish() const;

 private:
  void add_uses(node_id id);
  std::vector<use>& uses_of(endpoint e);

  graph work_;
  std::vector<bool> alive_;
  // Deques: the references inputs(), uses() and control_inputs() return stay valid while
  // a pass adds nodes.
  std::deque<std::vector<endpoint>> inputs_;
  /// Readers per node, per output.
  std::deque<std::vector<std::vector<use>>> uses_;
  std::deque<std::vector<node_id>> controls_;  // each node's current control inputs
  std::deque<std::vector<node_id>> control_users_;
  std::vector<bool> pinned_;
  std::size_t live_ = 0;
  signature sig_;  // in the working graph's ids
};

}  // namespace loom::passes
