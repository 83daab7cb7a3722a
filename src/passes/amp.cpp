// The `amp` pass: automatic mixed precision (loom/passes/amp.hpp).
//
// Note [automatic mixed precision]
// The pass walks the plan's graph in topological order. A float32 node whose op the policy
// lowers (or that a node override lowers) is replaced by the same op with T = the low type:
// - Inputs: each float32 input of type T is cast to the low type, once per tensor (a map
//   from tensor to its cast), so a weight read by the forward product and by the backward
//   product of the input gradient is cast once. A float32 input that is itself a cast *from*
//   the low type (the float32 result of a node lowered before) is not cast back: the node
//   reads the low-precision tensor itself, since widening and narrowing again gives the
//   same bits. Chains of lowered nodes (a convolution's forward result read by the next
//   convolution) thus pass 16-bit tensors along.
// - Outputs: each output of type T is cast to float32 for its readers (what they read
//   before, up to the rounding), and that cast is dropped by prune_dead when every reader
//   was lowered too.
// - Kernels: a node is lowered only where a device the plan may use has a kernel of its op
//   for the low type that is not emulated (kernel_def::emulated: oneDNN with only its
//   reference loops for that type on this CPU); otherwise it stays float32 and the log says
//   why (policy.allow_emulated lowers it anyway).
// Then the optimizers: an update whose gradient input is such a float32 cast of a 16-bit
// gradient reads the 16-bit gradient itself (the fused and per-variable updates take
// gradients of any float type and compute in float32), so master weights are updated from
// 16-bit gradients with no cast pass in between: the same values, since the cast is exact.
// The pass runs after epilogue_fusion (a fused_matmul / fused_conv2d is lowered as one node,
// its bias and residual with it) and before conv_layout (which keeps bfloat16 convolutions
// in NHWC or channel blocks as it does float32 ones).
#include "loom/passes/amp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/graph/op_registry.hpp"
#include "loom/kernel/kernel_registry.hpp"
#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {

amp_policy default_amp_policy() {
  amp_policy p;
  p.lower = {"matmul",          "fused_matmul",          "conv2d",
             "fused_conv2d",    "conv2d_backprop_input", "conv2d_backprop_filter",
             "conv_transpose2d"};
  p.keep_float32 = {"softmax",    "log_softmax", "softmax_cross_entropy",
                    "layer_norm", "reduce_sum",  "reduce_mean",
                    "reduce_max", "reduce_min",  "reduce_prod",
                    "exp",        "log",         "pow",
                    "fused_adam", "fused_adamw", "fused_sgd",
                    "apply_adam", "apply_adamw", "apply_sgd"};
  p.follow = {"relu",
              "relu_grad",
              "max_pool2d",
              "max_pool2d_with_indices",
              "max_pool2d_grad",
              "avg_pool2d",
              "avg_pool2d_grad",
              "reshape",
              "transpose",
              "slice",
              "concat",
              "identity",
              "add",
              "sub",
              "mul",
              "maximum",
              "minimum",
              "bias_add"};
  return p;
}

void validate(const amp_options& options) {
  if (options.type != dtype::f32 && options.type != dtype::bf16 && options.type != dtype::f16) {
    throw invalid_argument(
        fmt::format("amp: the low precision must be bfloat16 or float16 (float32: off), not {}",
                    to_string(options.type)));
  }
  const op_registry& ops = op_registry::global();
  auto check = [&](const std::vector<std::string>& list, const char* which) {
    for (const auto& op : list) {
      if (ops.find(op) == nullptr) {
        throw invalid_argument(
            fmt::format("amp: the policy's {} list names '{}', which is not an op", which, op));
      }
    }
  };
  check(options.policy.lower, "lower");
  check(options.policy.keep_float32, "keep_float32");
  check(options.policy.follow, "follow");
}

dtype amp_type_from_name(const std::string& name) {
  if (name == "bf16" || name == "bfloat16") return dtype::bf16;
  if (name == "fp16" || name == "float16" || name == "f16") return dtype::f16;
  if (name.empty() || name == "off" || name == "fp32" || name == "float32" || name == "f32") {
    return dtype::f32;
  }
  throw invalid_argument(fmt::format("amp: unknown precision '{}' (bf16, fp16, or off)", name));
}

amp_summary summarize_amp(const std::vector<pass_record>& log) {
  amp_summary out;
  for (const auto& r : log) {
    if (r.pass != "amp") continue;
    if (r.what == pass_record::kind::rewrite && r.result.find(" computes in ") != std::string::npos) {
      ++out.lowered;
    } else if (r.what == pass_record::kind::refused && out.kept_reason.empty() &&
               r.reason.find("policy") == std::string::npos) {
      out.kept_reason = r.reason;
    }
  }
  return out;
}

namespace {

bool listed(const std::vector<std::string>& list, const std::string& op) {
  return std::find(list.begin(), list.end(), op) != list.end();
}

// The first arg_def of each input index of `n` (lists expanded by their length attribute),
// or nullptr for an index past the op's arguments.
std::vector<const arg_def*> input_args(const node& n) {
  std::vector<const arg_def*> out;
  for (const arg_def& a : n.def->inputs) {
    std::int64_t count = 1;
    if (!a.list_length_attr.empty()) count = n.attr<std::int64_t>(a.list_length_attr);
    for (std::int64_t i = 0; i < count; ++i) out.push_back(&a);
  }
  out.resize(n.inputs.size(), nullptr);
  return out;
}

// Why no device the plan may use computes `op` at full speed in `low`: nullopt when one
// does; `emulated` is set when the only kernels there emulate it.
std::optional<std::string> low_precision_gap(const std::string& op, dtype low,
                                             const std::string& request,
                                             const std::vector<device_type>& device_types,
                                             bool& emulated) {
  emulated = false;
  std::vector<std::string> reasons;
  for (const kernel_def* d : fitting_kernels(op, {{"T", low}}, request, device_types)) {
    std::optional<std::string> slow;
    if (d->emulated) slow = d->emulated(low);
    if (!slow) return std::nullopt;
    emulated = true;
    reasons.push_back(fmt::format("on {}: {}", to_string(d->device), *slow));
  }
  if (reasons.empty()) {
    const std::optional<device_type> want = requested_type(request);
    return fmt::format("no {} kernel for {}{}", op, to_string(low),
                       want ? fmt::format(" on {}", to_string(*want)) : std::string());
  }
  return fmt::format("{}", fmt::join(reasons, "; "));
}

// Note [short reductions stay float32]
// A convolution that sums fewer than 16 input values for each output (input channels per
// group x kernel area: a first layer over one channel and a 3x3 window sums 9) gains
// nothing from the low precision's products, whose units take 32 bfloat16 values at a time
// (an AMX tile's row) or pairs of them: oneDNN 2.6 computed the CNN's first convolution
// ([128, 1, 28, 28], 32 filters of 3x3) in bfloat16 in 0.95 ms a step against float32's 0.56,
// and its filter gradient in 0.87 against 0.42. So such a conv2d / fused_conv2d and its
// conv2d_backprop_filter stay float32 (the log says why; a node override still lowers
// them), and what follows them computes in float32 up to the next lowered product: the
// CNN's step under bfloat16 AMP went from 10.5 to 10.1 ms. The gradient of such a
// convolution's input sums over its filters, not its channels, and is lowered as before.
constexpr std::int64_t min_low_precision_taps = 16;

// The input values a convolution node sums for each output (channels per group x kernel
// area, from its filter, or conv2d_backprop_filter's filter_shape); -1 when unknown or not
// such a node.
std::int64_t convolution_taps(const graph_editor& ed, const node& n) {
  std::optional<shape> filter;
  if (n.op() == "conv2d_backprop_filter") {
    filter = n.attr<shape>("filter_shape");
  } else if (n.op() == "conv2d" || n.op() == "fused_conv2d") {
    filter = ed.type_of(ed.inputs(n.id)[1]).shape;
  }
  if (!filter || filter->rank() != 4) return -1;
  const std::int64_t c = (*filter)[1], kh = (*filter)[2], kw = (*filter)[3];
  return c < 0 || kh < 0 || kw < 0 ? -1 : c * kh * kw;
}

// One run of the pass over one plan's graph (the pass object itself is shared by every
// plan the session builds, so it keeps no state).
class lowering {
 public:
  lowering(pass_context& ctx, dtype low) : low_(low), ctx_(ctx) {}

  bool run() {
    pass_context& ctx = ctx_;
    graph_editor& ed = ctx.editor();
    bool changed = false;
    // Node overrides name the plan's nodes as the earlier passes left them; a name that is
    // not there (fused into another node, or not needed for this signature) is said so.
    std::vector<std::string> overrides_unseen;
    for (const auto& [name, lower] : ctx.options().amp.policy.nodes) {
      const node* n = ed.g().find(name);
      if (n == nullptr || !ed.alive(n->id)) overrides_unseen.push_back(name);
    }
    for (const auto& name : overrides_unseen) {
      ctx.refused({name},
                  "the policy names this node, which this plan does not have (merged "
                  "into another by a fusion, or not needed for these fetches: "
                  "explain_passes names the plan's nodes)");
    }
    for (const node_id id : ed.topological_order()) {
      if (!ed.alive(id)) continue;
      const node& n = ed.at(id);
      const std::string why = reason_to_lower(ctx, n);
      if (why.empty()) continue;
      lower(ctx, id, why);
      changed = true;
    }
    for (const node_id id : ed.topological_order()) {
      if (!ed.alive(id)) continue;
      if (ed.at(id).def->is_stateful) {
        changed |= read_low_gradients(ctx, id);
      } else if (ed.at(id).op() == "reduce_sum") {
        changed |= sum_low_values(ctx, id);
      }
    }
    return changed;
  }

 private:
  // Why node `n` is lowered ("matmul is in the policy's lower list"), or "" when it stays
  // as it is (logging why, for the nodes a user would ask about).
  std::string reason_to_lower(pass_context& ctx, const node& n) {
    const amp_policy& policy = ctx.options().amp.policy;
    const auto t = n.attrs.find("T");
    const bool float32 = t != n.attrs.end() && std::holds_alternative<dtype>(t->second.get()) &&
                         t->second.as<dtype>() == dtype::f32;
    const auto over = policy.nodes.find(n.name);
    std::string why;
    if (over != policy.nodes.end()) {
      if (!over->second) {
        ctx.refused({n.name}, "kept float32: the policy keeps this node");
        return {};
      }
      why = "the policy lowers this node";
    } else if (listed(policy.keep_float32, n.op())) {
      if (float32)
        ctx.refused({n.name},
                    fmt::format("kept float32: {} is in the policy's float32 list", n.op()));
      return {};
    } else if (listed(policy.lower, n.op())) {
      if (const std::int64_t taps = convolution_taps(ctx.editor(), n);
          taps >= 0 && taps < min_low_precision_taps && float32) {
        ctx.refused({n.name}, fmt::format("kept float32: it sums {} input values for each output, fewer "
                                          "than the {} that make {} products pay",
                                          taps, min_low_precision_taps, to_string(low_)));
        return {};
      }
      why = fmt::format("{} is in the policy's lower list", n.op());
    } else if (listed(policy.follow, n.op()) && float32 && inputs_are_low(n)) {
      why = fmt::format("{} follows its inputs, which are {}", n.op(), to_string(low_));
    } else {
      return {};
    }
    if (t == n.attrs.end() || !std::holds_alternative<dtype>(t->second.get())) {
      ctx.refused({n.name},
                  fmt::format("kept as it is: {} has no type attribute T to lower", n.op()));
      return {};
    }
    if (!float32) {
      ctx.refused({n.name}, fmt::format("kept {}: AMP lowers float32 nodes only",
                                        to_string(t->second.as<dtype>())));
      return {};
    }
    if (n.def->is_stateful) {
      ctx.refused({n.name}, fmt::format("kept float32: {} is stateful", n.op()));
      return {};
    }
    for (const arg_def& a : n.def->inputs) {
      if (a.any_type) {
        ctx.refused({n.name}, fmt::format("kept float32: {} takes inputs of any dtype", n.op()));
        return {};
      }
    }
    bool emulated = false;
    if (const auto gap = low_precision_gap(n.op(), low_, n.requested_device,
                                           ctx.options().device_types, emulated)) {
      if (!(emulated && policy.allow_emulated)) {
        ctx.refused({n.name}, fmt::format("kept float32: {}", *gap));
        return {};
      }
      why += fmt::format(", emulated ({}) but the policy allows it", *gap);
    }
    return why;
  }

  // Every float32 input of `n` that its type T gives is the float32 cast of a
  // low-precision tensor (a lowered node's result), and there is at least one.
  bool inputs_are_low(const node& n) const {
    const graph_editor& ed = ctx_.editor();
    const std::vector<const arg_def*> args = input_args(n);
    const std::vector<endpoint>& inputs = ed.inputs(n.id);
    bool any = false;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (args[i] == nullptr || args[i]->type_attr != "T") continue;
      if (ed.type_of(inputs[i]).type != dtype::f32) continue;
      const node& p = ed.at(inputs[i].node);
      if (p.op() != "cast" || ed.type_of(ed.inputs(p.id)[0]).type != low_) return false;
      any = true;
    }
    return any;
  }

  // A name not yet in the graph: `base`, else base_1, base_2, ...
  std::string unique_name(const graph_editor& ed, const std::string& base) {
    if (ed.g().find(base) == nullptr) return base;
    for (int i = 1;; ++i) {
      std::string name = fmt::format("{}_{}", base, i);
      if (ed.g().find(name) == nullptr) return name;
    }
  }

  // `src` (float32) in the low precision: the low-precision tensor it was cast from, or a
  // cast made once and shared.
  endpoint to_low(graph_editor& ed, endpoint src, const std::string& request) {
    if (const auto it = low_of_.find(src); it != low_of_.end()) return it->second;
    const node& p = ed.at(src.node);
    endpoint r;
    if (p.op() == "cast" && ed.type_of(ed.inputs(src.node)[0]).type == low_) {
      r = ed.inputs(src.node)[0];
    } else {
      const std::string base = src.index == 0 ? p.name : fmt::format("{}_{}", p.name, src.index);
      r = {ed.add({unique_name(ed, fmt::format("{}/to_{}", base, to_string(low_))),
                   "cast",
                   {src},
                   {{"to", low_}},
                   request,
                   {}}),
           0};
      ++casts_in_;
    }
    low_of_.emplace(src, r);
    return r;
  }

  void lower(pass_context& ctx, node_id id, const std::string& why) {
    graph_editor& ed = ctx.editor();
    const node n = ed.at(id);  // a copy: ed.add may move the graph's nodes
    const std::vector<const arg_def*> args = input_args(n);
    casts_in_ = 0;
    std::vector<endpoint> inputs = ed.inputs(id);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (args[i] != nullptr && args[i]->type_attr == "T" &&
          ed.type_of(inputs[i]).type == dtype::f32) {
        inputs[i] = to_low(ed, inputs[i], n.requested_device);
      }
    }
    attr_map attrs = n.attrs;
    attrs.insert_or_assign("T", attr_value(low_));
    const node_id low =
        ed.add({unique_name(ed, fmt::format("{}/{}", n.name, to_string(low_))), n.op(), inputs,
                std::move(attrs), n.requested_device, ed.control_inputs(id)});
    int casts_out = 0;
    for (std::size_t k = 0; k < n.outputs.size(); ++k) {
      const endpoint old{id, static_cast<std::int32_t>(k)};
      const endpoint now{low, static_cast<std::int32_t>(k)};
      const bool typed = k < n.def->outputs.size() && n.def->outputs[k].type_attr == "T";
      if (!typed) {
        ed.replace_uses(old, now);
        continue;
      }
      const std::string base = k == 0 ? n.name : fmt::format("{}_{}", n.name, k);
      const node_id back = ed.add({unique_name(ed, base + "/to_float32"),
                                   "cast",
                                   {now},
                                   {{"to", dtype::f32}},
                                   n.requested_device,
                                   {}});
      back_casts_.insert(back);
      ed.replace_uses(old, {back, 0});
      ++casts_out;
    }
    ed.replace_node(id, low);
    ed.erase(id);
    ctx.rewrote({n.name},
                fmt::format("'{}' computes in {} ({}; {} cast{} in, {} out)", ed.at(low).name,
                            to_string(low_), why, casts_in_, casts_in_ == 1 ? "" : "s", casts_out));
  }

  // An optimizer update whose gradients include casts this pass made of 16-bit gradients
  // reads those gradients directly (Note [automatic mixed precision]).
  bool read_low_gradients(pass_context& ctx, node_id id) {
    graph_editor& ed = ctx.editor();
    const node n = ed.at(id);
    const std::vector<const arg_def*> args = input_args(n);
    std::vector<endpoint> inputs = ed.inputs(id);
    int swapped = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (args[i] == nullptr || !args[i]->any_type ||
          (args[i]->name != "grad" && args[i]->name != "grads")) {
        continue;
      }
      if (back_casts_.count(inputs[i].node) == 0) continue;
      inputs[i] = ed.inputs(inputs[i].node)[0];
      ++swapped;
    }
    if (swapped == 0) return false;
    const node_id now = ed.add({unique_name(ed, n.name + "/amp"), n.op(), inputs, n.attrs,
                                n.requested_device, ed.control_inputs(id)});
    for (std::size_t k = 0; k < n.outputs.size(); ++k) {
      ed.replace_uses({id, static_cast<std::int32_t>(k)}, {now, static_cast<std::int32_t>(k)});
    }
    ed.replace_node(id, now);
    ed.erase(id);
    ctx.rewrote({n.name},
                fmt::format("'{}' reads {} {} gradient{} without a cast to float32",
                            ed.at(now).name, swapped, to_string(low_), swapped == 1 ? "" : "s"));
    return true;
  }

  // A float32 reduce_sum of a cast this pass made of 16-bit values (a bias's gradient, say)
  // sums those values into float32 itself (its output_type): the same sum bit for bit
  // (the cast is exact and the accumulation the same), reading half the bytes, and the cast
  // is gone when nothing else reads it.
  bool sum_low_values(pass_context& ctx, node_id id) {
    graph_editor& ed = ctx.editor();
    const node n = ed.at(id);
    const endpoint in = ed.inputs(id)[0];
    if (n.attrs.at("T").as<dtype>() != dtype::f32 ||
        n.attrs.at("output_type").as<dtype>() != dtype::f32 || back_casts_.count(in.node) == 0) {
      return false;
    }
    attr_map attrs = n.attrs;
    attrs.insert_or_assign("T", attr_value(low_));
    const node_id now = ed.add({unique_name(ed, n.name + "/amp"), n.op(),
                                {ed.inputs(in.node)[0]}, std::move(attrs), n.requested_device,
                                ed.control_inputs(id)});
    ed.replace_uses({id, 0}, {now, 0});
    ed.replace_node(id, now);
    ed.erase(id);
    ctx.rewrote({n.name}, fmt::format("'{}' sums {} values into float32 without a cast",
                                      ed.at(now).name, to_string(low_)));
    return true;
  }

  const dtype low_;
  pass_context& ctx_;
  std::unordered_map<endpoint, endpoint, endpoint_hash> low_of_;
  std::unordered_set<node_id> back_casts_;
  int casts_in_ = 0;
};

class amp_pass final : public graph_pass {
 public:
  amp_pass() : graph_pass("amp") {}

 private:
  bool do_run(pass_context& ctx) override {
    const amp_options& amp = ctx.options().amp;
    if (!amp.enabled()) return false;
    return lowering(ctx, amp.type).run();
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_amp() {
  return std::make_unique<amp_pass>();
}

}  // namespace loom::passes
