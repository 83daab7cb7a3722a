// reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod, reduce_l1, reduce_l2,
// reduce_sum_square, reduce_log_sum, reduce_log_sum_exp, reduce_any, reduce_all, softmax,
// log_softmax, softmax_cross_entropy, argmax, argmin: definitions, inference (shape rules in
// loom/graph/ops/reduction_rules.hpp) and builders (var, std and logsumexp, composed of these,
// are in reduction_builders.cpp).
#include <fmt/format.h>

#include <algorithm>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/reduction.hpp"
#include "loom/graph/ops/reduction_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

const std::vector<dtype>& reduce_types() {
  static const std::vector<dtype> t{dtype::f32,  dtype::f64, dtype::f16,
                                    dtype::bf16, dtype::i32, dtype::i64};
  return t;
}

const std::vector<dtype>& argmax_types() {
  static const std::vector<dtype> t{dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                    dtype::i32, dtype::i64, dtype::i8,  dtype::u8};
  return t;
}

// Rejects an axes list that names the same value twice (aliases such as 1 and -2 are found
// by inference, once the rank is known).
void validate_axes(const attr_value& v) {
  auto axes = v.as<std::vector<std::int64_t>>();
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    throw invalid_argument("axes may not repeat an axis");
  }
}

void infer_reduce(inference_context& c) {
  const tensor_type& in = c.input(0);
  const auto axes = c.attr<std::vector<std::int64_t>>("axes");
  const bool keepdims = c.attr<bool>("keepdims");
  dtype out = in.type;
  if (c.def().find_attr("output_type") != nullptr) {  // reduce_sum's
    out = c.attr<dtype>("output_type");
    reduction_rules::check_sum_output_type(in.type, out);
  }
  if (!in.shape) {
    // Unknown rank: a full reduction without keepdims is still a scalar.
    c.set_output(0, out,
                 axes.empty() && !keepdims ? std::optional<shape>(shape{}) : std::nullopt);
    return;
  }
  c.set_output(0, out,
               reduction_rules::reduce_geometry_of(*in.shape, axes, keepdims,
                                                   reduction_rules::rule_caller::inference)
                   .output);
}

void infer_along_axis(inference_context& c) {
  const tensor_type& in = c.input(0);
  if (in.shape) {
    (void)reduction_rules::normalize_axis(c.attr<std::int64_t>("axis"), *in.shape,
                                          reduction_rules::rule_caller::inference);
  }
  c.set_output(0, in);
}

void infer_xent(inference_context& c) {
  auto [loss, backprop] = reduction_rules::xent_outputs(c.input(0).shape, c.input(1).shape);
  const dtype t = c.input(0).type;
  c.set_output(0, t, std::move(loss));
  c.set_output(1, t, std::move(backprop));
}

void infer_argmax(inference_context& c) {
  const tensor_type& in = c.input(0);
  const dtype out_t = c.attr<dtype>("output_type");
  if (!in.shape) {
    c.set_output(0, out_t, std::nullopt);
    return;
  }
  const std::size_t axis = reduction_rules::normalize_axis(
      c.attr<std::int64_t>("axis"), *in.shape, reduction_rules::rule_caller::inference);
  c.set_output(0, out_t, reduction_rules::argmax_output(*in.shape, axis, c.attr<bool>("keepdims")));
}

// With `output_type` (reduce_sum): the output's dtype, T's unless given
// (check_sum_output_type says which others are allowed).
void add_reduce(op_registry& r, const char* name, const char* summary,
                const std::vector<dtype>& types, bool output_type = false) {
  op_def d;
  d.name = name;
  d.summary = summary;
  d.inputs = {typed("input")};
  d.outputs = {output_type ? typed("output", "output_type") : typed("output")};
  attr_def axes = attr("axes", attr_type::ints, attr_value(std::vector<std::int64_t>{}));
  axes.validate = validate_axes;
  d.attrs = {type_attr("T", types), std::move(axes),
             attr("keepdims", attr_type::boolean, attr_value(false))};
  if (output_type) {
    attr_def out = type_attr("output_type", types);
    out.default_from = "T";
    d.attrs.push_back(std::move(out));
  }
  d.infer = infer_reduce;
  r.add(std::move(d));
}

}  // namespace

void register_reduction_ops(op_registry& r) {
  add_reduce(r, "reduce_sum", "sum over axes", reduce_types(), /*output_type=*/true);
  add_reduce(r, "reduce_mean", "mean over axes", float_types());
  add_reduce(r, "reduce_max", "maximum over axes (NaN propagates)", reduce_types());
  add_reduce(r, "reduce_min", "minimum over axes (NaN propagates)", reduce_types());
  add_reduce(r, "reduce_prod", "product over axes", reduce_types());
  add_reduce(r, "reduce_l1", "sum of absolute values over axes", reduce_types());
  add_reduce(r, "reduce_l2", "sqrt of the sum of squares over axes", float_types());
  add_reduce(r, "reduce_sum_square", "sum of squares over axes", reduce_types());
  add_reduce(r, "reduce_log_sum", "log of the sum over axes", float_types());
  add_reduce(r, "reduce_log_sum_exp", "log sum exp over axes (max-shifted, stable)",
             float_types());
  add_reduce(r, "reduce_any", "logical or over axes", {dtype::boolean});
  add_reduce(r, "reduce_all", "logical and over axes", {dtype::boolean});
  for (const char* name : {"softmax", "log_softmax"}) {
    op_def d;
    d.name = name;
    d.summary = std::string_view(name) == "softmax" ? "exp(x - max) / sum exp(x - max) along axis"
                                                    : "x - max - log sum exp(x - max) along axis";
    d.inputs = {typed("input")};
    d.outputs = {typed("output")};
    d.attrs = {type_attr("T", float_types()), attr("axis", attr_type::integer, attr_value(-1))};
    d.infer = infer_along_axis;
    r.add(std::move(d));
  }
  {
    op_def d;
    d.name = "softmax_cross_entropy";
    d.summary = "sparse softmax cross-entropy: per-example loss and its gradient";
    d.inputs = {typed("logits"), typed("labels", "Tlabels")};
    d.outputs = {typed("loss"), typed("backprop")};
    d.attrs = {type_attr("T", float_types()), type_attr("Tlabels", {dtype::i32, dtype::i64})};
    d.infer = infer_xent;
    r.add(std::move(d));
  }
  for (const bool is_min : {false, true}) {
    op_def d;
    d.name = is_min ? "argmin" : "argmax";
    d.summary = is_min ? "index of the minimum along axis (first on ties, NaN wins)"
                       : "index of the maximum along axis (first on ties, NaN wins)";
    d.inputs = {typed("input")};
    d.outputs = {typed("output", "output_type")};
    attr_def out_t = type_attr("output_type", {dtype::i64, dtype::i32});
    out_t.default_value = attr_value(dtype::i64);
    d.attrs = {type_attr("T", argmax_types()), attr("axis", attr_type::integer, attr_value(-1)),
               std::move(out_t), attr("keepdims", attr_type::boolean, attr_value(false)),
               attr("select_last_index", attr_type::boolean, attr_value(false))};
    d.infer = infer_argmax;
    r.add(std::move(d));
  }
}

namespace ops {
namespace {

output reduce(const char* op, output x, std::vector<std::int64_t> axes, bool keepdims,
              const node_options& o) {
  return x.builder().add1(op, {x}, {{"axes", std::move(axes)}, {"keepdims", keepdims}}, o);
}

}  // namespace

output reduce_sum(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_sum", x, std::move(axes), keepdims, o);
}
output reduce_sum(output x, std::vector<std::int64_t> axes, bool keepdims, dtype output_type,
                  const node_options& o) {
  return x.builder().add1(
      "reduce_sum", {x},
      {{"axes", std::move(axes)}, {"keepdims", keepdims}, {"output_type", output_type}}, o);
}
output reduce_mean(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_mean", x, std::move(axes), keepdims, o);
}
output reduce_max(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_max", x, std::move(axes), keepdims, o);
}
output reduce_min(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_min", x, std::move(axes), keepdims, o);
}
output reduce_prod(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_prod", x, std::move(axes), keepdims, o);
}

output reduce_l1(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_l1", x, std::move(axes), keepdims, o);
}
output reduce_l2(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_l2", x, std::move(axes), keepdims, o);
}
output reduce_sum_square(output x, std::vector<std::int64_t> axes, bool keepdims,
                         const node_options& o) {
  return reduce("reduce_sum_square", x, std::move(axes), keepdims, o);
}
output reduce_log_sum(output x, std::vector<std::int64_t> axes, bool keepdims,
                      const node_options& o) {
  return reduce("reduce_log_sum", x, std::move(axes), keepdims, o);
}
output reduce_log_sum_exp(output x, std::vector<std::int64_t> axes, bool keepdims,
                          const node_options& o) {
  return reduce("reduce_log_sum_exp", x, std::move(axes), keepdims, o);
}
output reduce_any(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_any", x, std::move(axes), keepdims, o);
}
output reduce_all(output x, std::vector<std::int64_t> axes, bool keepdims, const node_options& o) {
  return reduce("reduce_all", x, std::move(axes), keepdims, o);
}

output softmax(output x, std::int64_t axis, const node_options& o) {
  return x.builder().add1("softmax", {x}, {{"axis", axis}}, o);
}
output log_softmax(output x, std::int64_t axis, const node_options& o) {
  return x.builder().add1("log_softmax", {x}, {{"axis", axis}}, o);
}

softmax_cross_entropy_outputs softmax_cross_entropy(output logits, output labels,
                                                    const node_options& o) {
  auto outs = logits.builder().add("softmax_cross_entropy", {logits, labels}, {}, o);
  return {outs.at(0), outs.at(1)};
}

output argmax(output x, std::int64_t axis, dtype output_type, const node_options& o) {
  return x.builder().add1("argmax", {x}, {{"axis", axis}, {"output_type", output_type}}, o);
}

namespace {
output arg_node(const char* op, output x, std::int64_t axis, dtype output_type, bool keepdims,
                bool select_last_index, const node_options& o) {
  return x.builder().add1(op, {x},
                          {{"axis", axis},
                           {"output_type", output_type},
                           {"keepdims", keepdims},
                           {"select_last_index", select_last_index}},
                          o);
}
}  // namespace

output argmax(output x, std::int64_t axis, dtype output_type, bool keepdims, bool select_last_index,
              const node_options& o) {
  return arg_node("argmax", x, axis, output_type, keepdims, select_last_index, o);
}

output argmin(output x, std::int64_t axis, dtype output_type, bool keepdims, bool select_last_index,
              const node_options& o) {
  return arg_node("argmin", x, axis, output_type, keepdims, select_last_index, o);
}

}  // namespace ops
}  // namespace loom
