// epilogue_fusion: a matmul or conv2d and the element-wise ops after it (bias, residual,
// activation) become one fused_matmul or fused_conv2d node, whose CPU kernel runs the plain
// op's kernel and then the whole epilogue in one pass over its output, bit for bit as the
// unfused ops (Note [fused epilogue] in src/backends/cpu/nn_fused.cpp).
//
// Matches a core, then any of these steps, in this order, at least one:
//   core  = matmul(a, b) (any transposes, batched too) or conv2d(x, w) (any attributes), or
//         fused_conv2d(x, w, bias) with bias_in_sum and nothing else (an imported Conv with
//         its bias: then the match has its bias already, and no bias step follows)
//   bias: bias_add(core, bias) along the channel (the last dim of a matmul's product:
//         "NHWC", or "NCHW" on a rank-2 product; dim 1 of a conv2d's NCHW output: "NCHW";
//         the last of an NHWC conv2d's: "NHWC"), or add(core, bias) (either order) where
//         the bias broadcasts along every dim but the channel: [N] or [1, N] for a matmul
//         (leading 1s), [C, 1, 1] or [1, C, 1, 1] for an NCHW conv2d (a [C] bias added to
//         NCHW runs along W, NumPy-style, and is not a channel bias), [C] for an NHWC one.
//         A bias of rank > 1 is reshaped to [N] / [C].
//   residual: add(., r) (either order), r of exactly the output's (fully known) shape and
//         dtype and not computed from the core;
//   activation: relu, gelu (approximate "none" -> "gelu", "tanh" -> "gelu_tanh"), tanh or
//         sigmoid; or clip (Note [clip activation] in nn_rules.hpp), the form ONNX's Clip
//         lowers to: maximum(., lo) optionally followed by minimum(., hi), or minimum(., hi)
//         alone (the missing bound infinite), lo and hi scalar consts (rank 0 or all dims 1,
//         no higher rank than the output) of the core's dtype. The value must be the first
//         operand: maximum(lo, .) gives the value where the two tie and maximum(., lo) the
//         bound, which differ for -0 against +0 (Note [NaN rules]), so it is not fused.
// The match becomes fused_matmul(a, b, [bias], [residual]) or fused_conv2d(x, w, [bias],
// [residual]) with the core's attributes, has_bias, has_residual and activation (and
// clip_min, clip_max for clip); its output replaces the last matched value (its readers,
// fetches, control readers and target). This pass runs before element-wise fusion, which
// would otherwise take the bias and the activation into a fused_elementwise node.
//
// A step joins only when the value before it is read by that step alone (not fetched, no
// control readers, not a target), asks for the core's device, and waits for no other node
// (control inputs); otherwise the match stops before it (a clip's minimum too: then the
// maximum alone is fused), and when it was an epilogue op it is logged as refused with the
// reason (typically: the value is also read by a gradient, because gradients() ran before
// the passes; relu's own gradient reads relu's output, which the fused node provides, so
// training graphs fuse; maximum's and minimum's read their inputs, so a clip does not).
// Also logged: bias shapes that are not channel biases, maximum / minimum whose operands
// are no clip, and dtypes no fused kernel takes on the requested device type.
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "loom/graph/ops/nn_rules.hpp"
#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

bool epilogue_op(const std::string& op) {
  return op == "bias_add" || op == "add" || op == "relu" || op == "gelu" || op == "tanh" ||
         op == "sigmoid" || op == "maximum" || op == "minimum";
}

struct match {
  node_id core = -1;
  bool conv = false;
  std::size_t channel = 0;     // the bias's dim of the output
  std::vector<node_id> chain;  // core first
  std::optional<endpoint> bias;
  bool bias_in_sum = false;  // the core's own bias (a fused_conv2d core)
  std::optional<endpoint> residual;
  std::string activation = "none";
  // Activation "clip": its bounds, and whether a maximum was taken that a minimum may end.
  double clip_min = -std::numeric_limits<double>::infinity();
  double clip_max = std::numeric_limits<double>::infinity();
  bool clip_open = false;
};

class epilogue_fusion final : public graph_pass {
 public:
  epilogue_fusion() : graph_pass("epilogue_fusion") {}

 private:
  // When `b` broadcasts against output shape `out` along every dim but `channel` (where it
  // has the channel count), the bias as [C] needs no more than a reshape.
  static bool channel_bias(const std::optional<shape>& b, const shape& out, std::size_t channel) {
    if (!b || b->rank() > out.rank() || b->rank() < out.rank() - channel) return false;
    const std::size_t lead = out.rank() - b->rank();
    for (std::size_t k = 0; k < b->rank(); ++k) {
      const std::size_t d = lead + k;
      const std::int64_t want = d == channel ? out[d] : 1;
      if (want < 0 || (*b)[k] != want) return false;
    }
    return true;
  }

  // Why maximum or minimum `r` of `cur` is no clip step: its first operand must be `cur`,
  // its second a scalar const of dtype `t`, a rank no higher than the output's `out`;
  // nullopt when it is one.
  static std::optional<std::string> why_not_clip(const graph_editor& ed, node_id r, endpoint cur,
                                                 dtype t, const shape& out) {
    const auto& in = ed.inputs(r);
    const std::string& op = ed.at(r).op();
    if (in.size() != 2) return fmt::format("it has {} inputs", in.size());
    if (in[0] == cur && in[1] == cur) return "it takes the value twice";
    if (in[0] != cur) {
      return fmt::format(
          "the value is its second operand: only {0}(value, bound) is a clip ({0}(bound, "
          "value) gives the value where the two tie, -0 against +0, not the bound)",
          op);
    }
    const endpoint b = in[1];
    const std::string name = ed.g().endpoint_name(b);
    const tensor_type& bt = ed.type_of(b);
    if (bt.type != t) {
      return fmt::format("its bound '{}' is {}, not the output's {}", name, to_string(bt.type),
                         to_string(t));
    }
    const bool scalar = bt.shape && bt.shape->rank() <= out.rank() &&
                        std::all_of(bt.shape->dims().begin(), bt.shape->dims().end(),
                                    [](std::int64_t d) { return d == 1; });
    if (!scalar) return fmt::format("its bound '{}' ({}) is not a scalar", name, to_string(bt));
    if (!uniform_constant(ed, b, 1)) return fmt::format("its bound '{}' is no const", name);
    return std::nullopt;
  }

  // Extends the match by one step at reader `r` of `cur`; false when `r` is no step of
  // the kind `kind` ("bias", "residual", "activation", and "clip_max": the minimum that
  // may follow a clip's maximum).
  static bool take(const graph_editor& ed, match& mt, node_id r, endpoint cur,
                   const std::string& kind, const shape& out) {
    const node& rn = ed.at(r);
    const dtype t = ed.at(mt.core).outputs[0].type;
    if (kind == "bias") {
      if (rn.op() == "bias_add") {
        if (ed.inputs(r)[0] != cur) return false;
        const bool nchw = rn.attr<std::string>("data_format") == "NCHW";
        const std::size_t ch = nchw ? 1 : out.rank() - 1;
        if (ch != mt.channel) return false;
        mt.bias = ed.inputs(r)[1];
      } else if (rn.op() == "add") {
        const auto b = other_input(ed, r, cur);
        if (!b || *b == cur || ed.type_of(*b).type != t) return false;
        if (!channel_bias(ed.type_of(*b).shape, out, mt.channel)) return false;
        mt.bias = *b;
      } else {
        return false;
      }
    } else if (kind == "residual") {
      if (rn.op() != "add") return false;
      const auto res = other_input(ed, r, cur);
      if (!res || *res == cur || ed.type_of(*res).type != t) return false;
      if (!same_known_shape(ed.type_of(*res).shape, out)) return false;
      // Not computed from the core (the fused node would read its own result).
      if (std::find(mt.chain.begin(), mt.chain.end(), res->node) != mt.chain.end() ||
          reaches(ed, mt.core, res->node)) {
        return false;
      }
      mt.residual = *res;
    } else {
      const std::string& op = rn.op();
      const bool clip_end = kind == "clip_max";
      if (!clip_end && (op == "relu" || op == "tanh" || op == "sigmoid")) {
        mt.activation = op;
      } else if (!clip_end && op == "gelu") {
        mt.activation = rn.attr<std::string>("approximate") == "tanh" ? "gelu_tanh" : "gelu";
      } else if ((op == "maximum" && !clip_end) || op == "minimum") {
        if (why_not_clip(ed, r, cur, t, out)) return false;
        const double bound = *uniform_constant(ed, ed.inputs(r)[1], 1);
        mt.activation = "clip";
        mt.clip_open = op == "maximum";
        (op == "maximum" ? mt.clip_min : mt.clip_max) = bound;
      } else {
        return false;
      }
    }
    mt.chain.push_back(r);
    return true;
  }

  // Why add or bias_add `r` of `cur` is neither a bias nor a residual step.
  static std::string why_not_added(const graph_editor& ed, node_id r, endpoint cur,
                                   const shape& out) {
    if (ed.at(r).op() == "bias_add") {
      return fmt::format(
          "its data_format \"{}\" adds the bias along another dim than the "
          "output's channels (output {})",
          ed.at(r).attr<std::string>("data_format"), to_string(out));
    }
    const auto other = other_input(ed, r, cur);
    if (!other || *other == cur) return "it adds the value to itself";
    const auto& os = ed.type_of(*other).shape;
    const std::string name = ed.g().endpoint_name(*other);
    if (same_known_shape(os, out)) {
      return fmt::format(
          "it adds '{}', which is computed from the core's result: fusing would "
          "make a cycle",
          name);
    }
    if (!out.is_fully_defined()) {
      return fmt::format(
          "the output's shape {} is not fully known, so '{}' ({}) cannot be shown "
          "to be a residual of exactly that shape",
          to_string(out), name, to_string(ed.type_of(*other)));
    }
    return fmt::format(
        "it adds '{}' ({}), which is neither a channel bias nor a residual of "
        "the output's shape {}",
        name, to_string(ed.type_of(*other)), to_string(out));
  }

  // A fused_conv2d whose epilogue is only its own bias, in the sum: a core that has its bias.
  static bool conv_with_bias(const node& n) {
    return n.op() == "fused_conv2d" && n.attr<bool>("bias_in_sum") && !n.attr<bool>("has_residual") &&
           n.attr<std::string>("activation") == "none";
  }

  static std::optional<match> find(const graph_editor& ed, pass_context& ctx, node_id id) {
    const node& core = ed.at(id);
    const bool with_bias = conv_with_bias(core);
    const bool conv = core.op() == "conv2d" || with_bias;
    if ((core.op() != "matmul" && !conv) || !is_floating(core.outputs[0].type)) return std::nullopt;
    const auto& os = core.outputs[0].shape;
    if (!os || os->rank() < 2 || (conv && os->rank() != 4)) return std::nullopt;
    const shape out = *os;
    match mt;
    mt.core = id;
    mt.conv = conv;
    mt.channel = nn_rules::channel_axis(
        out.rank(), conv && nn_rules::is_nchw(core.attr<std::string>("data_format")));
    mt.chain.push_back(id);
    if (with_bias) {
      mt.bias = ed.inputs(id)[2];
      mt.bias_in_sum = true;
    }
    if (!ed.control_inputs(id).empty()) {
      if (auto r = ed.uses({id, 0}); !r.empty() && epilogue_op(ed.at(r.front().node).op())) {
        ctx.refused({core.name},
                    fmt::format("no epilogue fused: '{}' waits for '{}' (a control input)",
                                core.name, ed.at(ed.control_inputs(id).front()).name));
      }
      return std::nullopt;
    }
    for (const char* kind : {"bias", "residual", "activation", "clip_max"}) {
      if (std::string(kind) == "clip_max" && !mt.clip_open) break;
      if (std::string(kind) == "bias" && mt.bias_in_sum) continue;
      const endpoint cur{mt.chain.back(), 0};
      const auto& uses = ed.uses(cur);
      auto refuse = [&](node_id r, const std::string& why) {
        if (epilogue_op(ed.at(r).op())) {
          ctx.refused({ed.at(r).name},
                      fmt::format("not fused into the epilogue of '{}': {}", core.name, why));
        }
      };
      if (uses.empty()) break;
      if (uses.size() > 1 || ed.is_fetched(cur) || ed.has_control_users(cur.node) ||
          ed.is_pinned(cur.node)) {
        std::vector<node_id> readers;
        for (const use& u : uses) readers.push_back(u.node);
        for (node_id r : readers) {
          const auto who = outside_reader(ed, cur, {r});
          refuse(r, who ? read_outside_reason(ed, cur, *who,
                                              conv ? "ops::fused_conv2d" : "ops::fused_matmul")
                        : fmt::format("'{}' is a target of the run", ed.at(cur.node).name));
        }
        break;
      }
      const node_id r = uses.front().node;
      const node& rn = ed.at(r);
      if (!same_request(rn, core)) {
        refuse(r, fmt::format("it asks for device '{}', '{}' for '{}'", rn.requested_device,
                              core.name, core.requested_device));
        break;
      }
      if (!ed.control_inputs(r).empty()) {
        refuse(r, fmt::format("it waits for '{}' (a control input)",
                              ed.at(ed.control_inputs(r).front()).name));
        break;
      }
      if (take(ed, mt, r, cur, kind, out)) continue;
      // Not this step: maybe a later one (an add without bias is a residual, say).
      if (std::string(kind) == "activation" || std::string(kind) == "clip_max") {
        if (std::string(kind) == "activation" && (rn.op() == "add" || rn.op() == "bias_add")) {
          refuse(r, why_not_added(ed, r, cur, out));
        }
        if (rn.op() == "maximum" || rn.op() == "minimum") {
          if (auto why = why_not_clip(ed, r, cur, ed.at(id).outputs[0].type, out)) refuse(r, *why);
        }
        break;
      }
    }
    if (mt.chain.size() < 2) return std::nullopt;
    return mt;
  }

  static bool rewrite(graph_editor& ed, pass_context& ctx, const match& mt) {
    const node& core = ed.at(mt.core);
    const dtype t = core.outputs[0].type;
    if (auto why = missing_kernel(mt.conv ? "fused_conv2d" : "fused_matmul", {{"T", t}},
                                  core.requested_device)) {
      ctx.refused(names_of(ed, mt.chain), *why);
      return false;
    }
    const node_id last = mt.chain.back();
    const std::string last_name = ed.at(last).name;
    std::vector<endpoint> inputs{ed.inputs(mt.core)[0], ed.inputs(mt.core)[1]};
    if (mt.bias) {
      const auto& bs = ed.type_of(*mt.bias).shape;
      endpoint b = *mt.bias;
      if (bs && bs->rank() != 1) {
        const std::int64_t c = (*core.outputs[0].shape)[mt.channel];
        b = {ed.add({.name = ed.g().unique_name(fmt::format("{}/bias", last_name)),
                     .op = "reshape",
                     .inputs = {b},
                     .attrs = {{"shape", std::vector<std::int64_t>{c}}},
                     .device = core.requested_device,
                     .control_inputs = {}}),
             0};
      }
      inputs.push_back(b);
    }
    if (mt.residual) inputs.push_back(*mt.residual);
    attr_map attrs = core.attrs;
    for (const char* epilogue_attr : {"T", "num_args", "has_bias", "has_residual", "activation", "clip_min",
                                      "clip_max", "bias_in_sum"}) {
      attrs.erase(epilogue_attr);
    }
    if (mt.conv) attrs.emplace("bias_in_sum", mt.bias_in_sum);
    attrs.emplace("has_bias", mt.bias.has_value());
    attrs.emplace("has_residual", mt.residual.has_value());
    attrs.emplace("activation", mt.activation);
    if (mt.activation == "clip") {
      attrs.emplace("clip_min", mt.clip_min);
      attrs.emplace("clip_max", mt.clip_max);
    }
    const std::string op = mt.conv ? "fused_conv2d" : "fused_matmul";
    const node_id fused = ed.add({.name = ed.g().unique_name("fused/" + last_name),
                                  .op = op,
                                  .inputs = inputs,
                                  .attrs = std::move(attrs),
                                  .device = core.requested_device,
                                  .control_inputs = {}});
    ed.replace_uses({last, 0}, {fused, 0});
    ed.replace_node(last, fused);
    const auto names = names_of(ed, mt.chain);
    for (auto it = mt.chain.rbegin(); it != mt.chain.rend(); ++it) ed.erase(*it);
    std::vector<std::string> parts;
    if (mt.bias) {
      parts.push_back(fmt::format("bias '{}'{}", ed.g().endpoint_name(*mt.bias), mt.bias_in_sum ? " (in the sum)" : ""));
    }
    if (mt.residual)
      parts.push_back(fmt::format("residual '{}'", ed.g().endpoint_name(*mt.residual)));
    if (mt.activation == "clip") {
      parts.push_back(fmt::format("clip [{}, {}]", mt.clip_min, mt.clip_max));
    } else if (mt.activation != "none") {
      parts.push_back(mt.activation);
    }
    std::string what;
    for (const auto& p : parts) what += fmt::format("{}{}", what.empty() ? "" : ", ", p);
    ctx.rewrote(names, fmt::format("{} '{}' ({})", op, ed.at(fused).name, what));
    return true;
  }

  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    bool changed = false;
    for (node_id id : ed.topological_order()) {
      if (!ed.alive(id)) continue;
      const auto mt = find(ed, ctx, id);
      if (!mt) continue;
      changed = rewrite(ed, ctx, *mt) || changed;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_epilogue_fusion() {
  return std::make_unique<epilogue_fusion>();
}

}  // namespace loom::passes
