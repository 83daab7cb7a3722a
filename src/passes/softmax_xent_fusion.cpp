// softmax_xent_fusion: cross-entropy written as one_hot and log_softmax becomes one
// softmax_cross_entropy node, whose kernel also produces the gradient (output 1).
//
// Matches, for logits [N, C] of a float dtype T (C known) and labels [N] (int32 or int64):
//   ls   = log_softmax(logits, axis = -1 | 1)
//   oh   = one_hot(labels, depth = C, on = 1, off = 0, dtype = T, axis = -1 | 1)
//   loss = neg(reduce_sum(mul(oh, ls), axes = [-1] | [1]))       or
//   loss = reduce_sum(neg(mul(oh, ls)), axes = [-1] | [1])       or
//   loss = reduce_sum(mul(oh, neg(ls)), axes = [-1] | [1])
// (reduce_sum without keepdims; either operand order of the mul), and rewrites it as
// softmax_cross_entropy(logits, labels), whose output 0 (the loss, [N]) replaces `loss`.
// The one_hot node stays when something else reads it.
//
// One difference the rewrite makes: a label outside [0, C) gave a row of zeros, so a loss
// of 0, in the one-hot form; softmax_cross_entropy fails the run naming the row and the
// label (a loom::node_error), as TensorFlow's sparse op does. Valid labels give the same
// losses bit for bit, NaN included (Note [xent as its unfused form] in
// src/backends/cpu/reduction_softmax.cpp): the kernel's loss is the first form's,
// -(0 + y[label] + zeros); the other two forms sum -y[label] and +0s, which differ from it
// only in a loss of exactly 0 (+0 there, -0 in the first), so for those the rewrite adds
// +0 to the loss (an add that turns -0 into +0 and leaves every other value as it is).
//
// Refuses, logging the reason (and leaves the graph as written):
//   - an interior value (ls, neg(ls), the product, the sum, or its negation before the
//     sum) read outside the pattern, fetched or waited for. The usual cause is gradients()
//     having built the backward graph before the passes ran; the reason says so (build with
//     ops::softmax_cross_entropy, or run the passes before gradients);
//   - a one_hot that is not the labels' indicator: on/off values other than 1/0 (label
//     smoothing), a depth other than C, another dtype or axis, or labels that are not one
//     per row (a [1] label broadcast over the rows);
//   - a node of the match asking for another device than log_softmax, waiting for another
//     node (a control input), or a signature target that is not the loss;
//   - dtypes that no softmax_cross_entropy kernel takes on the requested device type.
#include <fmt/format.h>

#include <algorithm>

#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

// A reduce_sum over the class axis of a rank-2 value, without keepdims.
bool sums_classes(const node& n) {
  if (n.op() != "reduce_sum" || n.attr<bool>("keepdims")) return false;
  const auto axes = n.attr<std::vector<std::int64_t>>("axes");
  return axes.size() == 1 && (axes[0] == 1 || axes[0] == -1);
}

struct match {
  node_id ls = -1;
  node_id one_hot = -1;
  endpoint logits;
  endpoint labels;
  // The nodes from log_softmax to the loss, in order (the one_hot apart).
  std::vector<node_id> chain;
};

class softmax_xent_fusion final : public graph_pass {
 public:
  softmax_xent_fusion() : graph_pass("softmax_xent_fusion") {}

 private:
  // The mul of `v` by a one_hot node, among v's readers.
  static std::optional<std::pair<node_id, node_id>> times_one_hot(const graph_editor& ed,
                                                                  endpoint v) {
    for (const use& u : ed.uses(v)) {
      if (ed.at(u.node).op() != "mul") continue;
      const auto o = other_input(ed, u.node, v);
      if (o && *o != v && ed.at(o->node).op() == "one_hot") return std::pair{u.node, o->node};
    }
    return std::nullopt;
  }

  // The only reader of `v` when it has exactly one.
  static std::optional<node_id> sole_reader(const graph_editor& ed, endpoint v) {
    if (ed.uses(v).size() != 1) return std::nullopt;
    return ed.uses(v).front().node;
  }

  // The structure from log_softmax `id` to the loss; nullopt when there is none.
  static std::optional<match> find(const graph_editor& ed, node_id id) {
    const node& n = ed.at(id);
    if (n.op() != "log_softmax" || !is_floating(n.outputs[0].type)) return std::nullopt;
    const auto& s = n.outputs[0].shape;
    if (!s || s->rank() != 2) return std::nullopt;
    const auto axis = n.attr<std::int64_t>("axis");
    if (axis != 1 && axis != -1) return std::nullopt;
    match mt;
    mt.ls = id;
    mt.logits = ed.inputs(id)[0];
    mt.chain.push_back(id);
    const endpoint ls{id, 0};
    // mul(oh, neg(ls)) then reduce_sum, or mul(oh, ls) then neg/reduce_sum in either order.
    std::optional<std::pair<node_id, node_id>> m = times_one_hot(ed, ls);
    bool negated = false;
    if (!m) {
      for (const use& u : ed.uses(ls)) {
        if (ed.at(u.node).op() != "neg") continue;
        m = times_one_hot(ed, {u.node, 0});
        if (m) {
          mt.chain.push_back(u.node);
          negated = true;
          break;
        }
      }
    }
    if (!m) return std::nullopt;
    mt.chain.push_back(m->first);
    mt.one_hot = m->second;
    mt.labels = ed.inputs(mt.one_hot)[0];
    const auto next = sole_reader(ed, {m->first, 0});
    if (!next) return mt;  // the chain stops early: check() says why
    const node& nn = ed.at(*next);
    if (sums_classes(nn)) {
      mt.chain.push_back(*next);
      if (negated) return mt;
      const auto neg = sole_reader(ed, {*next, 0});
      if (neg && ed.at(*neg).op() == "neg") mt.chain.push_back(*neg);
    } else if (!negated && nn.op() == "neg") {
      mt.chain.push_back(*next);
      const auto sum = sole_reader(ed, {*next, 0});
      if (sum && sums_classes(ed.at(*sum))) mt.chain.push_back(*sum);
    }
    return mt;
  }

  // Why the match does not fuse; nullopt when it does.
  static std::optional<std::string> check(const graph_editor& ed, const match& mt) {
    const node& ls = ed.at(mt.ls);
    const dtype t = ls.outputs[0].type;
    const std::int64_t classes = (*ls.outputs[0].shape)[1];
    // The chain must end in the loss: log_softmax, [neg,] mul, [neg,] reduce_sum, [neg].
    const node& last = ed.at(mt.chain.back());
    const bool complete =
        mt.chain.size() == 4 &&
        (last.op() == "neg" || (last.op() == "reduce_sum" && (ed.at(mt.chain[1]).op() == "neg" ||
                                                              ed.at(mt.chain[2]).op() == "neg")));
    if (!complete) {
      // Name the value where the walk stopped when someone else reads it.
      const endpoint at{mt.chain.back(), 0};
      if (auto who = outside_reader(ed, at, mt.chain)) {
        return read_outside_reason(ed, at, *who, "ops::softmax_cross_entropy");
      }
      return fmt::format("'{}' is not followed by the sum over classes and its negation",
                         last.name);
    }
    const node& oh = ed.at(mt.one_hot);
    const auto on = oh.attr<double>("on_value");
    const auto off = oh.attr<double>("off_value");
    if (on != 1.0 || off != 0.0) {
      return fmt::format(
          "one_hot '{}' has on_value {} and off_value {} (label smoothing?); "
          "softmax_cross_entropy takes 1 and 0",
          oh.name, on, off);
    }
    if (oh.attr<std::int64_t>("depth") != classes || classes < 0) {
      return fmt::format("one_hot '{}' has depth {}, logits {} have {} classes", oh.name,
                         oh.attr<std::int64_t>("depth"), to_string(ls.outputs[0]), classes);
    }
    const auto oh_axis = oh.attr<std::int64_t>("axis");
    const auto& labels = ed.type_of(mt.labels);
    if (oh.outputs[0].type != t || (oh_axis != -1 && oh_axis != 1) || !labels.shape ||
        labels.shape->rank() != 1) {
      return fmt::format(
          "one_hot '{}' gives {} (axis {}) from labels {}; it must give {}[N, {}] "
          "from labels [N]",
          oh.name, to_string(oh.outputs[0]), oh_axis, to_string(labels), to_string(t), classes);
    }
    if (oh.outputs[0].shape != ls.outputs[0].shape) {
      return fmt::format(
          "one_hot '{}' gives {}, not the logits' shape {}: its labels do not "
          "have one per row",
          oh.name, to_string(oh.outputs[0]), to_string(ls.outputs[0]));
    }
    const node& mul = ed.at(mt.chain[ed.at(mt.chain[1]).op() == "neg" ? 2 : 1]);
    if (mul.outputs[0].shape != ls.outputs[0].shape) {
      return fmt::format("'{}' broadcasts to {}, not the logits' shape {}", mul.name,
                         to_string(mul.outputs[0]), to_string(ls.outputs[0]));
    }
    for (node_id id : mt.chain) {
      const node& n = ed.at(id);
      if (!same_request(n, ls)) {
        return fmt::format("'{}' asks for device '{}' and '{}' for '{}'", n.name,
                           n.requested_device, ls.name, ls.requested_device);
      }
      if (!ed.control_inputs(id).empty()) {
        return fmt::format("'{}' waits for '{}' (a control input)", n.name,
                           ed.at(ed.control_inputs(id).front()).name);
      }
    }
    for (std::size_t i = 0; i + 1 < mt.chain.size(); ++i) {
      const endpoint e{mt.chain[i], 0};
      if (ed.is_pinned(e.node))
        return fmt::format("'{}' is a target of the run", ed.at(e.node).name);
      if (auto who = outside_reader(ed, e, mt.chain)) {
        return read_outside_reason(ed, e, *who, "ops::softmax_cross_entropy");
      }
    }
    if (auto why = missing_kernel("softmax_cross_entropy", {{"T", t}, {"Tlabels", labels.type}},
                                  ls.requested_device)) {
      return why;
    }
    return std::nullopt;
  }

  static void rewrite(graph_editor& ed, pass_context& ctx, const match& mt) {
    const node_id loss = mt.chain.back();
    const node_id x = ed.add({.name = ed.g().unique_name("fused/" + ed.at(loss).name),
                              .op = "softmax_cross_entropy",
                              .inputs = {mt.logits, mt.labels},
                              .attrs = {},
                              .device = ed.at(mt.ls).requested_device,
                              .control_inputs = {}});
    endpoint result{x, 0};
    if (ed.at(loss).op() == "reduce_sum") {
      // reduce_sum(neg(...)) or reduce_sum(mul(oh, neg(ls))): a zero loss is +0 there.
      const dtype t = ed.type_of({mt.ls, 0}).type;
      const node_id zero = ed.add({.name = ed.g().unique_name(ed.at(x).name + "/zero"),
                                   .op = "zeros",
                                   .inputs = {},
                                   .attrs = {{"dtype", t}, {"shape", shape{}}},
                                   .device = ed.at(mt.ls).requested_device,
                                   .control_inputs = {}});
      result = {ed.add({.name = ed.g().unique_name(ed.at(x).name + "/plus_zero"),
                        .op = "add",
                        .inputs = {{x, 0}, {zero, 0}},
                        .attrs = {},
                        .device = ed.at(mt.ls).requested_device,
                        .control_inputs = {}}),
                0};
    }
    ed.replace_uses({loss, 0}, result);
    ed.replace_node(loss, result.node);
    std::vector<node_id> removed = mt.chain;
    for (auto it = mt.chain.rbegin(); it != mt.chain.rend(); ++it) ed.erase(*it);
    if (!ed.is_pinned(mt.one_hot) && unused(ed, mt.one_hot)) {
      ed.erase(mt.one_hot);
      removed.push_back(mt.one_hot);
    }
    ctx.rewrote(names_of(ed, removed),
                fmt::format("softmax_cross_entropy '{}' (logits '{}', labels '{}')", ed.at(x).name,
                            ed.g().endpoint_name(mt.logits), ed.g().endpoint_name(mt.labels)));
  }

  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    bool changed = false;
    for (node_id id : ed.topological_order()) {
      if (!ed.alive(id)) continue;
      const auto mt = find(ed, id);
      if (!mt) continue;
      if (auto why = check(ed, *mt)) {
        // The candidate's nodes: log_softmax, one_hot, then the rest of the chain.
        std::vector<std::string> names = names_of(ed, mt->chain);
        names.push_back(ed.at(mt->one_hot).name);
        std::rotate(names.begin() + 1, names.end() - 1, names.end());
        ctx.refused(std::move(names), *why);
        continue;
      }
      rewrite(ed, ctx, *mt);
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_softmax_xent_fusion() {
  return std::make_unique<softmax_xent_fusion>();
}

}  // namespace loom::passes
