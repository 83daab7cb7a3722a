#include "loom/passes/graph_editor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "pass_util.hpp"

namespace loom::passes {
namespace {

bool shapes_fit(const std::optional<shape>& a, const std::optional<shape>& b) {
  if (!a || !b) return true;
  if (a->rank() != b->rank()) return false;
  for (std::size_t d = 0; d < a->rank(); ++d) {
    if ((*a)[d] >= 0 && (*b)[d] >= 0 && (*a)[d] != (*b)[d]) return false;
  }
  return true;
}

// A name for the _arg standing for fed endpoint `e`: the node's own name when it is a
// placeholder (which has nothing else to give), else "<node>/fed_<k>"; never one that
// `source` or `work` holds.
std::string arg_name(const graph& source, const graph& work, endpoint e) {
  const node& n = source.at(e.node);
  std::string base = n.op() == "placeholder" ? n.name : fmt::format("{}/fed_{}", n.name, e.index);
  if (n.op() == "placeholder" && work.find(base) == nullptr) return base;
  for (std::size_t k = 1;; ++k) {
    std::string candidate = k == 1 ? base : fmt::format("{}_{}", base, k);
    if (source.find(candidate) == nullptr && work.find(candidate) == nullptr) return candidate;
  }
}

// Kahn's algorithm over the nodes [0, count) for which live(id) holds, smallest id first
// among the ready ones, so an unrewritten graph keeps its order and a rewritten one stays
// close to it. preds(id, visit) calls visit(p) for every edge p -> id (p live). A cycle
// leaves its nodes out of the result.
template <class Live, class Preds>
std::vector<node_id> kahn_order(std::size_t count, Live live, Preds preds) {
  std::vector<std::int32_t> pending(count, 0);
  std::vector<std::vector<node_id>> readers(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto id = static_cast<node_id>(i);
    if (!live(id)) continue;
    preds(id, [&](node_id p) {
      readers[static_cast<std::size_t>(p)].push_back(id);
      ++pending[i];
    });
  }
  std::priority_queue<node_id, std::vector<node_id>, std::greater<>> ready;
  for (std::size_t i = 0; i < count; ++i) {
    if (live(static_cast<node_id>(i)) && pending[i] == 0) ready.push(static_cast<node_id>(i));
  }
  std::vector<node_id> order;
  while (!ready.empty()) {
    const node_id id = ready.top();
    ready.pop();
    order.push_back(id);
    for (node_id r : readers[static_cast<std::size_t>(id)]) {
      if (--pending[static_cast<std::size_t>(r)] == 0) ready.push(r);
    }
  }
  return order;
}

}  // namespace

std::vector<bool> needed_nodes(const graph& g, const signature& sig, bool named_variables) {
  std::unordered_set<endpoint, endpoint_hash> fed(sig.feeds.begin(), sig.feeds.end());
  std::vector<bool> needed(g.num_nodes(), false);
  std::vector<node_id> stack;
  auto need = [&](node_id id) {
    if (!needed[static_cast<std::size_t>(id)]) {
      needed[static_cast<std::size_t>(id)] = true;
      stack.push_back(id);
    }
  };
  for (endpoint e : sig.fetches) {
    if (!fed.contains(e)) need(e.node);
  }
  for (node_id t : sig.targets) need(t);
  while (!stack.empty()) {
    const node& nd = g.at(stack.back());
    stack.pop_back();
    for (endpoint e : nd.inputs) {
      if (!fed.contains(e)) need(e.node);
    }
    for (node_id c : nd.control_inputs) need(c);
    if (named_variables && !nd.def->colocate_with_attr.empty()) {
      auto it = nd.attrs.find(nd.def->colocate_with_attr);
      if (it != nd.attrs.end() && it->second.type() == attr_type::string) {
        if (const node* v = g.find(it->second.as<std::string>())) need(v->id);
      }
    }
  }
  return needed;
}

graph_editor::graph_editor(const graph& source, const signature& sig) : work_(source.ops()) {
  const std::size_t n = source.num_nodes();
  auto check_node = [&](node_id id, const char* what) {
    if (id < 0 || static_cast<std::size_t>(id) >= n) {
      throw not_found(fmt::format("{} refers to node {}, which is not in the graph", what, id));
    }
  };
  auto check_endpoint = [&](endpoint e, const char* what) {
    check_node(e.node, what);
    if (e.index < 0 || static_cast<std::size_t>(e.index) >= source.at(e.node).outputs.size()) {
      throw not_found(fmt::format("{} refers to output {} of {}, which has {}", what, e.index,
                                  source.at(e.node).describe(), source.at(e.node).outputs.size()));
    }
  };
  std::unordered_map<endpoint, std::size_t, endpoint_hash> fed;
  for (std::size_t i = 0; i < sig.feeds.size(); ++i) {
    check_endpoint(sig.feeds[i], "a feed");
    if (!fed.emplace(sig.feeds[i], i).second) {
      throw invalid_argument(
          fmt::format("the feed {} is given twice", source.endpoint_name(sig.feeds[i])));
    }
  }
  for (endpoint e : sig.fetches) check_endpoint(e, "a fetch");
  for (node_id t : sig.targets) check_node(t, "a target");

  const std::vector<bool> needed = needed_nodes(source, sig, true);

  // Fed endpoints first, as _args (Note [fed values in rewritten graphs]).
  std::vector<endpoint> arg_of(sig.feeds.size());
  for (std::size_t i = 0; i < sig.feeds.size(); ++i) {
    const endpoint e = sig.feeds[i];
    const tensor_type& t = source.type_of(e);
    attr_map attrs{{"dtype", t.type}, {"known_rank", t.shape.has_value()}};
    if (t.shape) attrs.emplace("shape", *t.shape);
    const node& a = work_.add_node({.name = arg_name(source, work_, e),
                                    .op = "_arg",
                                    .inputs = {},
                                    .attrs = std::move(attrs)});
    arg_of[i] = {a.id, 0};
  }

  // The needed nodes, inputs and control inputs first. Ids order data edges, but a control
  // edge added later (graph::add_control_input) may point from a later node to an earlier
  // one: Kahn's algorithm over both, smallest id first.
  std::vector<node_id> copy_of(n, -1);
  auto map = [&](endpoint e) -> endpoint {
    if (auto it = fed.find(e); it != fed.end()) return arg_of[it->second];
    return {copy_of[static_cast<std::size_t>(e.node)], e.index};
  };
  const std::vector<node_id> order = kahn_order(
      n, [&](node_id id) { return needed[static_cast<std::size_t>(id)]; },
      [&](node_id id, auto&& visit) {
        for (endpoint e : source.at(id).inputs) {
          if (!fed.contains(e)) visit(e.node);
        }
        for (node_id c : source.at(id).control_inputs) visit(c);
      });
  for (node_id id : order) {
    const node& nd = source.at(id);
    node_spec spec{.name = nd.name,
                   .op = nd.op(),
                   .inputs = {},
                   .attrs = nd.attrs,
                   .device = nd.requested_device,
                   .control_inputs = {}};
    for (endpoint e : nd.inputs) spec.inputs.push_back(map(e));
    for (node_id c : nd.control_inputs)
      spec.control_inputs.push_back(copy_of[static_cast<std::size_t>(c)]);
    copy_of[static_cast<std::size_t>(nd.id)] = work_.add_node(std::move(spec)).id;
  }

  const std::size_t count = work_.num_nodes();
  alive_.assign(count, true);
  pinned_.assign(count, false);
  inputs_.resize(count);
  uses_.resize(count);
  control_users_.resize(count);
  controls_.resize(count);
  live_ = count;
  for (const node& nd : work_.nodes()) {
    inputs_[static_cast<std::size_t>(nd.id)] = nd.inputs;
    controls_[static_cast<std::size_t>(nd.id)] = nd.control_inputs;
    uses_[static_cast<std::size_t>(nd.id)].resize(nd.outputs.size());
    add_uses(nd.id);
  }
  for (endpoint a : arg_of) pinned_[static_cast<std::size_t>(a.node)] = true;
  for (endpoint e : sig.fetches) sig_.fetches.push_back(map(e));
  for (node_id t : sig.targets) {
    const node_id c = copy_of[static_cast<std::size_t>(t)];
    sig_.targets.push_back(c);
    pinned_[static_cast<std::size_t>(c)] = true;
  }
  sig_.feeds = std::move(arg_of);
}

void graph_editor::add_uses(node_id id) {
  const auto& ins = inputs_[static_cast<std::size_t>(id)];
  for (std::size_t k = 0; k < ins.size(); ++k) {
    uses_of(ins[k]).push_back({id, static_cast<std::int32_t>(k)});
  }
  for (node_id c : controls_[static_cast<std::size_t>(id)]) {
    control_users_[static_cast<std::size_t>(c)].push_back(id);
  }
}

std::vector<use>& graph_editor::uses_of(endpoint e) {
  return uses_.at(static_cast<std::size_t>(e.node)).at(static_cast<std::size_t>(e.index));
}

const std::vector<use>& graph_editor::uses(endpoint e) const {
  return uses_.at(static_cast<std::size_t>(e.node)).at(static_cast<std::size_t>(e.index));
}

bool graph_editor::has_control_users(node_id id) const {
  return !control_users_.at(static_cast<std::size_t>(id)).empty();
}

bool graph_editor::is_fetched(endpoint e) const {
  return std::find(sig_.fetches.begin(), sig_.fetches.end(), e) != sig_.fetches.end();
}

bool graph_editor::is_pinned(node_id id) const {
  return pinned_.at(static_cast<std::size_t>(id));
}

std::vector<node_id> graph_editor::topological_order() const {
  auto order = kahn_order(
      work_.num_nodes(), [&](node_id id) { return alive(id); },
      [&](node_id id, auto&& visit) {
        for (endpoint e : inputs(id)) visit(e.node);
        for (node_id c : control_inputs(id)) visit(c);
      });
  if (order.size() != live_) {
    throw invalid_argument("a pass left a cycle in the graph (a bug of that pass)");
  }
  return order;
}

node_id graph_editor::add(node_spec spec) {
  for (endpoint e : spec.inputs) {
    if (e.node < 0 || static_cast<std::size_t>(e.node) >= alive_.size() || !alive(e.node)) {
      throw invalid_argument(
          fmt::format("a pass added node '{}' ({}) reading a removed node", spec.name, spec.op));
    }
  }
  if (spec.name.empty()) spec.name = work_.unique_name(spec.op);
  const node& added = work_.add_node(std::move(spec));
  alive_.push_back(true);
  pinned_.push_back(false);
  inputs_.push_back(added.inputs);
  controls_.push_back(added.control_inputs);
  uses_.emplace_back(added.outputs.size());
  control_users_.emplace_back();
  ++live_;
  add_uses(added.id);
  return added.id;
}

void graph_editor::replace_uses(endpoint from, endpoint to) {
  if (from == to) return;
  const tensor_type& a = type_of(from);
  const tensor_type& b = type_of(to);
  if (a.type != b.type || !shapes_fit(a.shape, b.shape)) {
    throw invalid_argument(fmt::format("a pass replaced {} ({}) by {} ({}), which does not fit",
                                       work_.endpoint_name(from), to_string(a),
                                       work_.endpoint_name(to), to_string(b)));
  }
  std::vector<use> moved = std::move(uses_of(from));
  uses_of(from).clear();
  for (use u : moved)
    inputs_[static_cast<std::size_t>(u.node)][static_cast<std::size_t>(u.index)] = to;
  auto& into = uses_of(to);
  into.insert(into.end(), moved.begin(), moved.end());
  for (endpoint& f : sig_.fetches) {
    if (f == from) f = to;
  }
}

void graph_editor::replace_node(node_id from, node_id to) {
  auto& users = control_users_.at(static_cast<std::size_t>(from));
  auto& to_users = control_users_[static_cast<std::size_t>(to)];
  for (node_id u : users) {
    auto& cs = controls_[static_cast<std::size_t>(u)];
    const bool waits_already = std::find(cs.begin(), cs.end(), to) != cs.end();
    if (waits_already) {
      cs.erase(std::remove(cs.begin(), cs.end(), from), cs.end());
    } else {
      std::replace(cs.begin(), cs.end(), from, to);
      to_users.push_back(u);
    }
  }
  users.clear();
  bool was_target = false;
  for (node_id& t : sig_.targets) {
    if (t == from) {
      t = to;
      was_target = true;
    }
  }
  if (was_target) {
    pinned_[static_cast<std::size_t>(from)] = false;
    pinned_[static_cast<std::size_t>(to)] = true;
  }
}

void graph_editor::erase(node_id id) {
  const node& nd = at(id);
  if (!alive(id)) return;
  if (is_pinned(id)) {
    throw invalid_argument(
        fmt::format("a pass tried to remove {}, which the signature needs", nd.describe()));
  }
  if (has_control_users(id)) {
    throw invalid_argument(
        fmt::format("a pass tried to remove {}, which others wait for", nd.describe()));
  }
  for (std::size_t k = 0; k < nd.outputs.size(); ++k) {
    if (!uses({id, static_cast<std::int32_t>(k)}).empty()) {
      throw invalid_argument(fmt::format("a pass tried to remove {}, whose output {} is still read",
                                         nd.describe(), k));
    }
  }
  const auto& ins = inputs_[static_cast<std::size_t>(id)];
  for (std::size_t k = 0; k < ins.size(); ++k) {
    auto& us = uses_of(ins[k]);
    us.erase(std::remove(us.begin(), us.end(), use{id, static_cast<std::int32_t>(k)}), us.end());
  }
  for (node_id c : controls_[static_cast<std::size_t>(id)]) {
    auto& cu = control_users_[static_cast<std::size_t>(c)];
    cu.erase(std::remove(cu.begin(), cu.end(), id), cu.end());
  }
  alive_[static_cast<std::size_t>(id)] = false;
  --live_;
}

rewritten_graph graph_editor::finish() const {
  rewritten_graph out{graph(work_.ops()), {}, {}, {}};
  std::vector<node_id> new_id(work_.num_nodes(), -1);
  for (node_id id : topological_order()) {
    const node& nd = at(id);
    node_spec spec{.name = nd.name,
                   .op = nd.op(),
                   .inputs = {},
                   .attrs = nd.attrs,
                   .device = nd.requested_device,
                   .control_inputs = {}};
    for (endpoint e : inputs(id))
      spec.inputs.push_back({new_id[static_cast<std::size_t>(e.node)], e.index});
    for (node_id c : controls_[static_cast<std::size_t>(id)]) {
      spec.control_inputs.push_back(new_id[static_cast<std::size_t>(c)]);
    }
    new_id[static_cast<std::size_t>(id)] = out.g.add_node(std::move(spec)).id;
  }
  auto map = [&](endpoint e) {
    return endpoint{new_id[static_cast<std::size_t>(e.node)], e.index};
  };
  for (endpoint e : sig_.feeds) out.feeds.push_back(map(e));
  for (endpoint e : sig_.fetches) out.fetches.push_back(map(e));
  for (node_id t : sig_.targets) out.targets.push_back(new_id[static_cast<std::size_t>(t)]);
  return out;
}

}  // namespace loom::passes
