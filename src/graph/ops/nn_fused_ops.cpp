// fused_matmul and fused_conv2d: matmul or conv2d with an epilogue, y = act(core + bias +
// residual), as one node (Note [fused epilogue] in src/backends/cpu/nn_fused.cpp says how
// the CPU kernels run it). Definitions, inference and builders.
//
// The core's shape is what matmul's or conv2d's own inference says (it runs on the first
// two inputs with the node's attributes), so the fused ops accept and reject exactly what
// the plain ops do, with the same messages; only the epilogue's checks are added here.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <limits>
#include <string_view>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/nn.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

constexpr const auto& activations = nn_rules::activation_names;

attr_def activation_attr() {
  attr_def a = attr("activation", attr_type::string, std::string("none"));
  a.validate = [](const attr_value& v) {
    const auto s = v.as<std::string>();
    if (std::find(activations.begin(), activations.end(), s) == activations.end()) {
      throw invalid_argument(fmt::format("unknown activation \"{}\" (expected one of \"{}\")", s,
                                         fmt::join(activations, "\", \"")));
    }
  };
  return a;
}

attr_def num_args_attr() {
  attr_def a = attr("num_args", attr_type::integer);
  a.validate = [](const attr_value& v) {
    const auto n = v.as<std::int64_t>();
    if (n < 0 || n > 2) throw invalid_argument("must be 0, 1 or 2 (a bias, a residual, or both)");
  };
  return a;
}

// The attributes of the epilogue, shared by both ops. clip_min and clip_max: activation
// "clip"'s bounds (Note [clip activation] in nn_rules.hpp).
std::vector<attr_def> epilogue_attr_defs() {
  constexpr double inf = std::numeric_limits<double>::infinity();
  return {num_args_attr(),
          attr("has_bias", attr_type::boolean, false),
          attr("has_residual", attr_type::boolean, false),
          activation_attr(),
          attr("clip_min", attr_type::real, -inf),
          attr("clip_max", attr_type::real, inf)};
}

// Runs `core`'s inference on the node's first two inputs with `attrs` (the core op's
// attributes, taken from the node) and returns its output type. Failures are the core's.
tensor_type infer_core(const inference_context& c, const op_def& core, const attr_map& attrs) {
  inference_context cc(core, c.node_name(), attrs, {c.input(0), c.input(1)}, 1);
  // Only the dtype: the shape stays unknown until the core's inference sets it. (Setting a
  // whole tensor_type with std::nullopt trips GCC 12's -Wmaybe-uninitialized under ASan.)
  cc.outputs().at(0).type = c.input(0).type;
  core.infer(cc);
  return cc.outputs().at(0);
}

// Checks the epilogue inputs (from input 2 on) against the core's output `out`: num_args
// is has_bias + has_residual; clip bounds only with activation "clip"; the bias has rank 1
// and the size of dimension `channel` of the output (`blocked`, an NCHW16c output: as many
// values as that dimension's blocks hold); the residual has the output's shape. `what` names
// the core's output and `channel_name` the bias's dimension in messages.
void check_epilogue(const inference_context& c, const tensor_type& out, std::size_t channel,
                    std::string_view what, std::string_view channel_name, bool blocked = false) {
  const bool has_bias = c.attr<bool>("has_bias");
  const bool has_residual = c.attr<bool>("has_residual");
  const auto num_args = c.attr<std::int64_t>("num_args");
  const std::int64_t wanted = std::int64_t{has_bias} + std::int64_t{has_residual};
  if (num_args != wanted) {
    c.fail(fmt::format(
        "got {} epilogue input{} (num_args = {}), but has_bias = {} and has_residual = {} "
        "need {}",
        num_args, num_args == 1 ? "" : "s", num_args, has_bias, has_residual, wanted));
  }
  try {
    nn_rules::check_clip_bounds(nn_rules::activation_of(c.attr<std::string>("activation")),
                                c.attr<double>("clip_min"), c.attr<double>("clip_max"));
  } catch (const invalid_argument& e) {
    c.fail(e.what());
  }
  std::size_t next = 2;
  if (has_bias) {
    const tensor_type& bias = c.input(next++);
    if (bias.shape && bias.shape->rank() != 1) {
      c.fail(fmt::format("bias must have rank 1, got {}", to_string(*bias.shape)));
    }
    if (bias.shape && out.shape && channel < out.shape->rank()) {
      const std::int64_t want = (*out.shape)[channel];
      // An NCHW16c output: the bias has one value per channel, the output a block per 16.
      const std::int64_t have = blocked ? nn_rules::channel_blocks((*bias.shape)[0]) : (*bias.shape)[0];
      if (want >= 0 && have >= 0 && want != have) {
        c.fail(fmt::format("bias {} does not match the {} {} of the {} {}", to_string(*bias.shape),
                           want, channel_name, what, to_string(*out.shape)));
      }
    }
  }
  if (has_residual) {
    const tensor_type& residual = c.input(next);
    if (residual.shape && out.shape) {
      const shape& r = *residual.shape;
      const shape& o = *out.shape;
      bool fits = r.rank() == o.rank();
      for (std::size_t d = 0; fits && d < r.rank(); ++d) {
        fits = r[d] < 0 || o[d] < 0 || r[d] == o[d];
      }
      if (!fits) {
        c.fail(fmt::format("residual {} must have the shape of the {} {}", to_string(r), what,
                           to_string(o)));
      }
    }
  }
}

}  // namespace

// Called from register_nn_ops after matmul and conv2d are registered: the fused ops'
// inference runs theirs.
void register_nn_fused_ops(op_registry& r) {
  const op_def* matmul = &r.get("matmul");
  const op_def* conv2d = &r.get("conv2d");
  {
    op_def d;
    d.name = "fused_matmul";
    d.summary = "act(a @ b + bias + residual): matmul with a fused epilogue";
    d.inputs = {typed("a"), typed("b"), typed_list("args", "num_args")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T", float_types()), attr("transpose_a", attr_type::boolean, false),
               attr("transpose_b", attr_type::boolean, false)};
    for (auto& a : epilogue_attr_defs()) d.attrs.push_back(std::move(a));
    d.infer = [matmul](inference_context& c) {
      const tensor_type out = infer_core(c, *matmul,
                                         {{"T", c.attr_value_of("T")},
                                          {"transpose_a", c.attr_value_of("transpose_a")},
                                          {"transpose_b", c.attr_value_of("transpose_b")}});
      const std::size_t last = out.shape ? out.shape->rank() - 1 : 0;
      check_epilogue(c, out, last, "product", "columns");
      c.set_output(0, out);
    };
    r.add(std::move(d));
  }
  {
    op_def d = r.get("conv2d");  // conv2d's inputs and attributes, its validation included
    d.name = "fused_conv2d";
    d.summary = "act(conv2d(input, filter) + bias + residual): conv2d with a fused epilogue";
    d.inputs.push_back(typed_list("args", "num_args"));
    for (auto& a : epilogue_attr_defs()) d.attrs.push_back(std::move(a));
    // The bias as a term of the convolution's sum (ops::epilogue::bias_in_sum).
    d.attrs.push_back(attr("bias_in_sum", attr_type::boolean, false));
    d.infer = [conv2d](inference_context& c) {
      try {
        nn_rules::check_bias_in_sum(c.attr<bool>("bias_in_sum"), c.attr<bool>("has_bias"));
      } catch (const invalid_argument& e) {
        c.fail(e.what());
      }
      attr_map attrs;
      for (const auto& a : conv2d->attrs) attrs.emplace(a.name, c.attr_value_of(a.name));
      const tensor_type out = infer_core(c, *conv2d, attrs);
      const std::string format = c.attr<std::string>("data_format");
      const bool blocked = nn_rules::is_channel_blocked(format);
      check_epilogue(c, out, nn_rules::is_nchw(format) || blocked ? 1 : 3, "output",
                     blocked ? "channel blocks" : "channels", blocked);
      c.set_output(0, out);
    };
    r.add(std::move(d));
  }
}

namespace ops {

namespace {
// The inputs and attributes of an epilogue.
void add_epilogue(const epilogue& e, std::vector<output>& inputs, attr_map& attrs) {
  if (e.bias) inputs.push_back(*e.bias);
  if (e.residual) inputs.push_back(*e.residual);
  attrs.emplace("has_bias", e.bias.has_value());
  attrs.emplace("has_residual", e.residual.has_value());
  attrs.emplace("activation", e.activation);
  attrs.emplace("clip_min", e.clip_min);
  attrs.emplace("clip_max", e.clip_max);
}
}  // namespace

output fused_matmul(output a, output b, const epilogue& e, bool transpose_a, bool transpose_b,
                    const node_options& o) {
  if (e.bias_in_sum) {
    throw invalid_argument("fused_matmul: bias_in_sum is a convolution's (fused_conv2d); a matmul's bias is added to its product");
  }
  std::vector<output> inputs{a, b};
  attr_map attrs{{"transpose_a", transpose_a}, {"transpose_b", transpose_b}};
  add_epilogue(e, inputs, attrs);
  return a.builder().add1("fused_matmul", inputs, std::move(attrs), o);
}

output fused_conv2d(output x, output w, const epilogue& e, const conv2d_options& options,
                    const node_options& o) {
  std::vector<output> inputs{x, w};
  attr_map attrs{{"strides", options.strides},
                 {"padding", options.padding},
                 {"dilations", options.dilations},
                 {"groups", options.groups},
                 {"data_format", options.data_format},
                 {"bias_in_sum", e.bias_in_sum}};
  add_epilogue(e, inputs, attrs);
  return x.builder().add1("fused_conv2d", inputs, std::move(attrs), o);
}

}  // namespace ops
}  // namespace loom
