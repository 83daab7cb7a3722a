// common_subexpressions: equal nodes on equal inputs are computed once.
//
// Two nodes are equal when they have the same op, attributes, current inputs, control
// inputs and device request. Constants are equal when their values are (dtype, shape and
// bytes, for constants of up to 64K elements), so the scalar each `x * 2.0` makes is shared
// and the products after it can be too. Never merged: stateful ops (each update is its own
// effect), fed values, placeholders. The later node's readers and fetches move to the
// earlier one; prune_dead removes it when nothing else holds it.
#include <fmt/format.h>

#include <cstring>
#include <unordered_map>

#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

constexpr std::int64_t max_compared_elements = 1 << 16;

bool same_constant(const tensor& a, const tensor& b) {
  if (a.buf() == b.buf() && a.offset() == b.offset() && a.shape() == b.shape() &&
      a.type() == b.type()) {
    return true;
  }
  if (a.type() != b.type() || a.shape() != b.shape() || !a.is_contiguous() || !b.is_contiguous() ||
      a.device().type != device_type::cpu || b.device().type != device_type::cpu ||
      a.num_elements() > max_compared_elements) {
    return false;
  }
  return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

bool same_attrs(const node& a, const node& b) {
  if (a.attrs.size() != b.attrs.size()) return false;
  auto ib = b.attrs.begin();
  for (const auto& [name, value] : a.attrs) {
    if (name != ib->first) return false;
    if (value.type() == attr_type::tensor && ib->second.type() == attr_type::tensor) {
      if (!same_constant(value.as<tensor>(), ib->second.as<tensor>())) return false;
    } else if (!(value == ib->second)) {
      return false;
    }
    ++ib;
  }
  return true;
}

class common_subexpressions final : public graph_pass {
 public:
  common_subexpressions() : graph_pass("common_subexpressions") {}

 private:
  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    // Candidates bucketed by a cheap key (op and inputs); equality is checked in full.
    std::unordered_map<std::string, std::vector<node_id>> seen;
    bool changed = false;
    for (node_id id : ed.topological_order()) {
      const node& n = ed.at(id);
      if (n.def->is_stateful || n.op() == "_arg" || n.op() == "placeholder") continue;
      std::string key = n.op();
      for (endpoint e : ed.inputs(id)) key += fmt::format(",{}:{}", e.node, e.index);
      key += '|';
      for (node_id c : ed.control_inputs(id)) key += fmt::format("{},", c);
      if (n.op() == "const") key += to_string(n.outputs[0]);
      auto& bucket = seen[key];
      node_id twin = -1;
      for (node_id m : bucket) {
        const node& o = ed.at(m);
        if (ed.alive(m) && same_request(n, o) && same_attrs(n, o) &&
            ed.control_inputs(m) == ed.control_inputs(id)) {
          twin = m;
          break;
        }
      }
      if (twin < 0) {
        bucket.push_back(id);
        continue;
      }
      for (std::size_t k = 0; k < n.outputs.size(); ++k) {
        ed.replace_uses({id, static_cast<std::int32_t>(k)}, {twin, static_cast<std::int32_t>(k)});
      }
      ed.replace_node(id, twin);
      if (!ed.is_pinned(id)) ed.erase(id);
      ctx.rewrote({n.name}, fmt::format("its twin {}", ed.at(twin).describe()));
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_common_subexpressions() {
  return std::make_unique<common_subexpressions>();
}

}  // namespace loom::passes
