// conv_layout: convolutions keep their activations in the layout they compute in between
// them: channel blocks (NCHW16c) where the CPU's rule says so, else channels-last (NHWC).
//
// oneDNN's fastest float32 / bfloat16 convolutions compute in NHWC, or on AVX-512 in
// channel blocks (Note [channel blocks] in nn_rules.hpp: loom's rule picks them for float32
// convolutions of 16 channels or more); a conv2d on NCHW tensors reorders its input into
// that layout and its output back on every run (Note [blocked layouts]), which on a network
// of small convolutions (depthwise-separable ones above all) costs more than the
// convolutions. This pass makes every NCHW conv2d and fused_conv2d of float32 or bfloat16
// with a rank-4 input its form in that layout between conversions:
//     y = conv(x, w, [bias], [r])
//  -> y = from_channel_blocks(conv_blocked(to_channel_blocks(x), w, [bias], [to_channel_blocks(r)]),
//                             channels)     (the rule says channel blocks, and the options allow them)
//  -> y = transpose(conv_nhwc(transpose(x, [0, 2, 3, 1]), w, [bias], [transpose(r, ...)]),
//                   [0, 3, 1, 2])           (otherwise)
// and then drops every conversion of a conversion that undoes it (the reader takes the value
// itself): a chain of convolutions whose epilogues took their bias, residual and activation
// converts its activations once where the chain starts and once where a value leaves it.
// A value read by several convolutions is converted once. (Undoing from_channel_blocks by
// to_channel_blocks gives back the same blocks, zeros included: the channels past the last
// are zero in every blocked tensor.)
//
// A first layer of fewer than 16 channels that the rule computes NCHW in and blocks out
// (conv_blocks::output) reads its NCHW input as it is. A max or average pool between
// convolutions in blocks pools the blocks (data_format "NCHW16c") where the CPU's rule says
// it gives the same bits (nn_rules::cpu_pools_in_channel_blocks): the conversion out of the
// blocks moves below it and meets the next convolution's. A float32 sum or mean over the
// pixels (a global average pool) sums the blocks, which gives the same bits too (sink_mean),
// and converts the [n, channels, 1, 1] result.
//
// Answers do not change: the converted node asks oneDNN for the same primitive as the NCHW
// one (format_tag::any for the activations, or nChw16c where the rule says channel blocks,
// whatever layout the tensors arrive in: the implementation, and with it every sum, does not
// depend on it), its epilogue applies the same steps to the same values, and the conversions
// move values unchanged. Convolutions of other dtypes (the reference loops) are left alone,
// as are nodes waiting for control inputs.
#include <fmt/format.h>

#include <optional>
#include <unordered_map>

#include "loom/graph/fused_expr.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "loom/graph/ops/reduction_rules.hpp"
#include "loom/passes/pass_manager.hpp"
#include "pass_util.hpp"

namespace loom::passes {
namespace {

using ints = std::vector<std::int64_t>;

const ints to_nhwc{0, 2, 3, 1};
const ints to_nchw{0, 3, 1, 2};

// The conversions made by the pass, of a value to NHWC or to channel blocks.
using transposes = std::unordered_map<endpoint, endpoint, endpoint_hash>;

struct made_conversions {
  transposes nhwc;
  transposes blocks;
};

class conv_layout final : public graph_pass {
 public:
  conv_layout() : graph_pass("conv_layout") {}

 private:
  // How the CPU computes the candidate `id` (Note [channel blocks]).
  static nn_rules::conv_blocks in_blocks(const graph_editor& ed, const pass_context& ctx, node_id id) {
    if (!ctx.options().channel_blocks) return nn_rules::conv_blocks::none;
    const node& n = ed.at(id);
    const auto& xs = ed.type_of(ed.inputs(id)[0]).shape;
    const auto& ws = ed.type_of(ed.inputs(id)[1]).shape;
    if (!xs || !ws || ws->rank() != 4 || (*ws)[0] < 0 || (*ws)[1] < 0) return nn_rules::conv_blocks::none;
    const nn_rules::conv_window win = nn_rules::conv_window_of(
        n.attr<std::int64_t>("groups"), n.attr<ints>("strides"), n.attr<ints>("dilations"), n.attr<ints>("padding"));
    const nn_rules::conv_geometry g = nn_rules::conv2d_geometry(*xs, *ws, win);
    return g.c >= 0 && g.fits() ? nn_rules::conv_channel_blocks(g, n.outputs[0].type) : nn_rules::conv_blocks::none;
  }

  static bool candidate(const graph_editor& ed, node_id id) {
    const node& n = ed.at(id);
    if (n.op() != "conv2d" && n.op() != "fused_conv2d") return false;
    if (!nn_rules::is_nchw(n.attr<std::string>("data_format"))) return false;
    const dtype t = n.outputs[0].type;
    if (t != dtype::f32 && t != dtype::bf16) return false;
    const auto& xs = ed.type_of(ed.inputs(id)[0]).shape;
    return xs && xs->rank() == 4 && ed.control_inputs(id).empty();
  }

  // A new node `op` of the one input `in`.
  static endpoint add1(graph_editor& ed, const std::string& op, endpoint in, attr_map attrs,
                       const std::string& name, const std::string& device) {
    return {ed.add({.name = ed.g().unique_name(name),
                    .op = op,
                    .inputs = {in},
                    .attrs = std::move(attrs),
                    .device = device,
                    .control_inputs = {}}),
            0};
  }

  static endpoint transpose(graph_editor& ed, endpoint e, const ints& perm, const std::string& name,
                            const std::string& device) {
    return add1(ed, "transpose", e, {{"perm", perm}}, name, device);
  }

  // `e` converted by `op`, once per value (`made`: the conversions of that kind so far).
  static endpoint converted(graph_editor& ed, transposes& made, endpoint e, const std::string& op,
                            const attr_map& attrs, const std::string& name, const std::string& device) {
    if (auto it = made.find(e); it != made.end()) return it->second;
    return made.emplace(e, add1(ed, op, e, attrs, name, device)).first->second;
  }

  static void rewrite(graph_editor& ed, pass_context& ctx, node_id id, made_conversions& made,
                      nn_rules::conv_blocks how) {
    const bool blocks = how != nn_rules::conv_blocks::none;
    const node& conv = ed.at(id);
    const std::string name = conv.name;
    const std::string device = conv.requested_device;
    const std::string layout = blocks ? "NCHW16c" : "NHWC";
    const std::string suffix = blocks ? "/blocks" : "/nhwc";
    const auto convert = [&](endpoint e, const std::string& what) {
      return blocks ? converted(ed, made.blocks, e, "to_channel_blocks", {}, name + "/blocks_" + what, device)
                    : converted(ed, made.nhwc, e, "transpose", {{"perm", to_nhwc}}, name + "/nhwc_" + what, device);
    };
    std::vector<endpoint> inputs = ed.inputs(id);
    // A first layer (conv_blocks::output) reads its input as it is, NCHW.
    if (how != nn_rules::conv_blocks::output) inputs[0] = convert(inputs[0], "input");
    const bool residual = conv.op() == "fused_conv2d" && conv.attr<bool>("has_residual");
    if (residual) inputs.back() = convert(inputs.back(), "residual");
    const std::int64_t channels = blocks ? (*ed.type_of(inputs[1]).shape)[0] : 0;  // in_blocks knows it
    attr_map attrs = conv.attrs;
    attrs.erase("T");
    attrs.erase("num_args");
    attrs["data_format"] = layout;
    const std::string op = conv.op();
    const node_id conv_id = ed.add({.name = ed.g().unique_name(name + suffix),
                                      .op = op,
                                      .inputs = std::move(inputs),
                                      .attrs = std::move(attrs),
                                      .device = device,
                                      .control_inputs = {}});
    const endpoint back = blocks ? add1(ed, "from_channel_blocks", {conv_id, 0}, {{"channels", channels}},
                                        name + "/nchw", device)
                                 : transpose(ed, {conv_id, 0}, to_nchw, name + "/nchw", device);
    ed.replace_uses({id, 0}, back);
    ed.replace_node(id, back.node);
    ed.erase(id);
    ctx.rewrote({name}, fmt::format("{} '{}' computes in {} between {}", op, ed.at(conv_id).name, layout,
                                    blocks ? "conversions" : "transposes"));
  }

  // perm `outer` applied after `inner` is the identity.
  static bool undoes(const ints& outer, const ints& inner) {
    if (outer.size() != inner.size()) return false;
    for (std::size_t i = 0; i < outer.size(); ++i) {
      const auto k = static_cast<std::size_t>(outer[i]);
      if (k >= inner.size() || inner[k] != static_cast<std::int64_t>(i)) return false;
    }
    return true;
  }

  // A node `id` over a node it pairs with (`pairs(outer, inner)`), both asked for the same
  // devices: its readers (and a fetch) read what `replacement(outer, inner, inner's input)`
  // gives instead, with the reason it gives for the log.
  template <class Pairs, class Replacement>
  static bool replace_pair(graph_editor& ed, pass_context& ctx, node_id id, Pairs&& pairs,
                           Replacement&& replacement) {
    const node& outer = ed.at(id);
    const node_id inner_id = ed.inputs(id)[0].node;
    const node& inner = ed.at(inner_id);
    if (!same_request(outer, inner) || !pairs(outer, inner)) return false;
    if (ed.uses({id, 0}).empty() && !ed.is_fetched({id, 0})) return false;
    const auto [to, why] = replacement(outer, inner, ed.inputs(inner_id)[0]);
    ed.replace_uses({id, 0}, to);
    ctx.rewrote({outer.name, inner.name}, why);
    return true;
  }

  // A node over a node it undoes: its readers read the inner node's input.
  template <class Undoes>
  static bool drop_round_trip(graph_editor& ed, pass_context& ctx, node_id id, Undoes&& undoes_input) {
    return replace_pair(ed, ctx, id, undoes_input, [&](const node& outer, const node& inner, endpoint v) {
      return std::pair{v, fmt::format("'{}' undoes '{}': its readers read '{}'", outer.name, inner.name,
                                      ed.g().endpoint_name(v))};
    });
  }

  // A transpose of a transpose it undoes.
  static bool cancel(graph_editor& ed, pass_context& ctx, node_id id) {
    return ed.at(id).op() == "transpose" &&
           drop_round_trip(ed, ctx, id, [](const node& outer, const node& inner) {
             return inner.op() == "transpose" && undoes(outer.attr<ints>("perm"), inner.attr<ints>("perm"));
           });
  }

  // to_channel_blocks of from_channel_blocks, both from / to the same layout: the same
  // blocks, zeros included (the channels past the last are zero in every blocked tensor).
  static bool cancel_blocks(graph_editor& ed, pass_context& ctx, node_id id) {
    return ed.at(id).op() == "to_channel_blocks" &&
           drop_round_trip(ed, ctx, id, [](const node& outer, const node& inner) {
             return inner.op() == "from_channel_blocks" &&
                    inner.attr<std::string>("data_format") == outer.attr<std::string>("data_format");
           });
  }

  // A conversion between NCHW and channel blocks next to a transpose between NHWC and NCHW
  // becomes one conversion from or to NHWC (a chain of NHWC convolutions, those of fewer
  // than 16 channels, meeting one in blocks): to_channel_blocks(transpose(v, to_nchw)) ->
  // to_channel_blocks(v, NHWC); transpose(from_channel_blocks(v), to_nhwc) ->
  // from_channel_blocks(v, NHWC). The same elements move to the same places, once.
  static bool merge_conversion(graph_editor& ed, pass_context& ctx, node_id id) {
    const node& n = ed.at(id);
    const bool into_blocks = n.op() == "to_channel_blocks" && n.attr<std::string>("data_format") == "NCHW";
    if (!into_blocks && !(n.op() == "transpose" && n.attr<ints>("perm") == to_nhwc)) return false;
    const auto pairs = [&](const node& /*outer*/, const node& inner) {
      return into_blocks ? inner.op() == "transpose" && inner.attr<ints>("perm") == to_nchw
                         : inner.op() == "from_channel_blocks" && inner.attr<std::string>("data_format") == "NCHW";
    };
    return replace_pair(ed, ctx, id, pairs, [&](const node& outer, const node& inner, endpoint v) {
      attr_map attrs{{"data_format", std::string("NHWC")}};
      if (!into_blocks) attrs.emplace("channels", inner.attr<std::int64_t>("channels"));
      const endpoint merged = add1(ed, into_blocks ? "to_channel_blocks" : "from_channel_blocks", v,
                                   std::move(attrs), outer.name + "/nhwc", outer.requested_device);
      return std::pair{merged, fmt::format("'{}' converts between NHWC and channel blocks at once",
                                           ed.at(merged.node).name)};
    });
  }

  // The input of `e` when e is the output of an NHWC -> NCHW transpose.
  static std::optional<endpoint> from_nhwc(const graph_editor& ed, endpoint e) {
    const node& n = ed.at(e.node);
    if (n.op() != "transpose" || n.attr<ints>("perm") != to_nchw) return std::nullopt;
    return ed.inputs(e.node)[0];
  }

  // A shape of 1s only: it broadcasts alike against either layout.
  static bool all_ones(const std::optional<shape>& s) {
    if (!s || s->rank() > 4) return false;
    for (std::size_t d = 0; d < s->rank(); ++d) {
      if ((*s)[d] != 1) return false;
    }
    return true;
  }

  // An element-wise node whose inputs are NHWC -> NCHW transposes (at least one) and
  // values of 1s (scalars) computes on the transposes' inputs, and its result is transposed
  // instead: the transpose moves below it, towards the next convolution's, which undoes it.
  static bool sink(graph_editor& ed, pass_context& ctx, node_id id) {
    const node& n = ed.at(id);
    if (!fusable_op(n) || n.outputs.size() != 1 || !ed.control_inputs(id).empty() ||
        ed.has_control_users(id) || ed.is_pinned(id)) {
      return false;
    }
    // Broadcasting commutes with a permutation applied to every operand of the same rank,
    // and values of 1s broadcast alike either way: shapes need not be known.
    std::vector<endpoint> inputs = ed.inputs(id);
    bool any = false;
    for (endpoint& in : inputs) {
      if (all_ones(ed.type_of(in).shape)) continue;
      const auto inner = from_nhwc(ed, in);
      if (!inner || !same_request(ed.at(in.node), n)) return false;
      in = *inner;
      any = true;
    }
    if (!any) return false;
    const std::string name = n.name;
    const std::string device = n.requested_device;
    const node_id moved = ed.add({.name = ed.g().unique_name(name + "/nhwc"),
                                  .op = n.op(),
                                  .inputs = std::move(inputs),
                                  .attrs = n.attrs,
                                  .device = device,
                                  .control_inputs = {}});
    ed.replace_uses({id, 0}, transpose(ed, {moved, 0}, to_nchw, name + "/nchw", device));
    ed.erase(id);
    ctx.rewrote({name}, fmt::format("'{}' computes in NHWC: the transpose moved below it",
                                    ed.at(moved).name));
    return true;
  }

  // The shape of node `id`'s input when that input is from_channel_blocks to NCHW (rank 4)
  // and `id` may move above the conversion (no control edges, not pinned, the conversion's
  // device request); else nothing.
  static std::optional<shape> from_blocks_input(graph_editor& ed, pass_context& ctx, node_id id) {
    const node& n = ed.at(id);
    if (!ctx.options().channel_blocks || !ed.control_inputs(id).empty() || ed.has_control_users(id) ||
        ed.is_pinned(id)) {
      return std::nullopt;
    }
    const endpoint in = ed.inputs(id)[0];
    const node& conversion = ed.at(in.node);
    const auto& xs = ed.type_of(in).shape;
    if (conversion.op() != "from_channel_blocks" || conversion.attr<std::string>("data_format") != "NCHW" ||
        !same_request(conversion, n) || !xs || xs->rank() != 4) {
      return std::nullopt;
    }
    return *xs;
  }

  // Node `id` (from_blocks_input) becomes its op over the blocks with `attrs`, and the
  // conversion moves below it, towards the next convolution's (which undoes it) or to a small
  // result; the log says `what` the node now does in the blocks.
  static void move_into_blocks(graph_editor& ed, pass_context& ctx, node_id id, attr_map attrs,
                               std::string_view what) {
    // Copies: adding nodes may move the ones `n` and the conversion refer to.
    const node& n = ed.at(id);
    const std::string name = n.name;
    const std::string op = n.op();
    const std::string device = n.requested_device;
    const endpoint in = ed.inputs(id)[0];
    const std::int64_t channels = ed.at(in.node).attr<std::int64_t>("channels");
    const endpoint blocks = ed.inputs(in.node)[0];
    attrs.erase("T");
    const node_id moved = ed.add({.name = ed.g().unique_name(name + "/blocks"),
                                  .op = op,
                                  .inputs = {blocks},
                                  .attrs = std::move(attrs),
                                  .device = device,
                                  .control_inputs = {}});
    ed.replace_uses({id, 0},
                    add1(ed, "from_channel_blocks", {moved, 0}, {{"channels", channels}}, name + "/nchw", device));
    ed.erase(id);
    ctx.rewrote({name}, fmt::format("'{}' {} in channel blocks: the conversion moved below it", ed.at(moved).name,
                                    what));
  }

  // A pool over from_channel_blocks pools the blocks themselves where the CPU's rule says the
  // bits are the same (cpu_pools_in_channel_blocks: float32, oneDNN's one implementation for
  // both layouts): pool(from_channel_blocks(v)) -> from_channel_blocks(pool_blocked(v)).
  static bool sink_pool(graph_editor& ed, pass_context& ctx, node_id id) {
    const node& n = ed.at(id);
    const bool max = n.op() == "max_pool2d";
    if ((!max && n.op() != "avg_pool2d") || !nn_rules::is_nchw(n.attr<std::string>("data_format"))) return false;
    const std::optional<shape> xs = from_blocks_input(ed, ctx, id);
    if (!xs) return false;
    const nn_rules::pool_geometry g = nn_rules::pool2d_geometry(
        *xs, nn_rules::pool_window_of(n.attr<ints>("kernel"), n.attr<ints>("strides"), n.attr<ints>("padding"),
                                      n.attr<bool>("ceil_mode"), n.attr<ints>("dilations")));
    const bool include_pad = !max && n.attr<bool>("count_include_pad");
    if (!nn_rules::cpu_pools_in_channel_blocks(g, n.outputs[0].type, max, include_pad)) return false;
    attr_map attrs = n.attrs;
    attrs["data_format"] = std::string("NCHW16c");
    move_into_blocks(ed, ctx, id, std::move(attrs), "pools");
    return true;
  }

  // A float32 sum or mean over the pixels of a from_channel_blocks (a global average pool
  // after the last convolution) sums the blocks themselves, the conversion moving below it to
  // the [n, channels, 1, 1] result: sum(from_channel_blocks(v), {2, 3}) ->
  // from_channel_blocks(sum(v, {2, 3})). The CPU's float sums give each channel the same bits
  // in either layout (Note [sums in any layout] in reduction_reduce.cpp): the pixels are one
  // run in both, the outputs as many. The padding channels are summed and dropped.
  static bool sink_mean(graph_editor& ed, pass_context& ctx, node_id id) {
    const node& n = ed.at(id);
    if ((n.op() != "reduce_mean" && n.op() != "reduce_sum") || n.outputs[0].type != dtype::f32 ||
        !n.attr<bool>("keepdims")) {
      return false;
    }
    const std::optional<shape> xs = from_blocks_input(ed, ctx, id);
    if (!xs) return false;
    const reduction_rules::reduce_geometry g =
        reduction_rules::reduce_geometry_of(*xs, n.attr<ints>("axes"), true, reduction_rules::rule_caller::inference);
    if (g.reduced != std::vector<char>{0, 0, 1, 1}) return false;
    attr_map attrs = n.attrs;
    attrs["axes"] = ints{2, 3};  // h and w of [n, blocks, h, w, 16] too
    move_into_blocks(ed, ctx, id, std::move(attrs), "sums the pixels");
    return true;
  }

  bool do_run(pass_context& ctx) override {
    graph_editor& ed = ctx.editor();
    bool changed = false;
    made_conversions made;
    for (node_id id : ed.topological_order()) {
      if (!ed.alive(id) || !candidate(ed, id)) continue;
      rewrite(ed, ctx, id, made, in_blocks(ed, ctx, id));
      changed = true;
    }
    if (!changed) return false;
    // In topological order a moved transpose is met again below its new reader.
    for (node_id id : ed.topological_order()) {
      if (ed.alive(id) && !sink(ed, ctx, id) && !sink_pool(ed, ctx, id) && !sink_mean(ed, ctx, id) &&
          !cancel(ed, ctx, id) && !cancel_blocks(ed, ctx, id)) {
        merge_conversion(ed, ctx, id);
      }
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<graph_pass> make_conv_layout() {
  return std::make_unique<conv_layout>();
}

}  // namespace loom::passes
