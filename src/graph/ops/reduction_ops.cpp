// reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod, softmax, log_softmax,
// layer_norm, layer_norm_grad, softmax_cross_entropy, argmax: definitions, inference and
// builders.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/reduction.hpp"
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

// Wraps `axis` into [0, rank) or fails naming the input's shape.
std::size_t normalize(inference_context& c, std::int64_t axis, const shape& s) {
  const auto r = static_cast<std::int64_t>(s.rank());
  if (axis < -r || axis >= r) {
    c.fail(fmt::format("axis {} is out of range for input of shape {} (rank {})", axis,
                       to_string(s), r));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}

void infer_reduce(inference_context& c) {
  const tensor_type& in = c.input(0);
  const auto axes = c.attr<std::vector<std::int64_t>>("axes");
  const bool keepdims = c.attr<bool>("keepdims");
  if (!in.shape) {
    // Unknown rank: a full reduction without keepdims is still a scalar.
    c.set_output(0, in.type,
                 axes.empty() && !keepdims ? std::optional<shape>(shape{}) : std::nullopt);
    return;
  }
  const shape& s = *in.shape;
  std::vector<bool> reduced(s.rank(), axes.empty());
  for (const auto a : axes) {
    const std::size_t k = normalize(c, a, s);
    if (reduced[k]) {
      c.fail(fmt::format("axes {} name axis {} twice (input of shape {})", fmt::join(axes, ", "), k,
                         to_string(s)));
    }
    reduced[k] = true;
  }
  shape out;
  for (std::size_t k = 0; k < s.rank(); ++k) {
    if (!reduced[k])
      out.push_back(s[k]);
    else if (keepdims)
      out.push_back(1);
  }
  c.set_output(0, in.type, std::move(out));
}

void infer_along_axis(inference_context& c) {
  const tensor_type& in = c.input(0);
  if (in.shape) (void)normalize(c, c.attr<std::int64_t>("axis"), *in.shape);
  c.set_output(0, in);
}

// True when two dims may be equal (either unknown, or equal).
bool compatible(std::int64_t a, std::int64_t b) {
  return a < 0 || b < 0 || a == b;
}

void infer_layer_norm(inference_context& c) {
  const tensor_type& x = c.input(0);
  const dtype t = x.type;
  if (!x.shape) {
    for (std::size_t i = 0; i < 3; ++i) c.set_output(i, t, std::nullopt);
    return;
  }
  const shape& s = *x.shape;
  const std::size_t axis = normalize(c, c.attr<std::int64_t>("axis"), s);
  shape lead;
  shape normalized;
  for (std::size_t k = 0; k < s.rank(); ++k) (k < axis ? lead : normalized).push_back(s[k]);
  for (std::size_t i = 1; i <= 2; ++i) {
    const tensor_type& p = c.input(i);
    if (!p.shape) continue;
    bool ok = p.shape->rank() == normalized.rank();
    for (std::size_t k = 0; ok && k < normalized.rank(); ++k) {
      ok = compatible((*p.shape)[k], normalized[k]);
    }
    if (!ok) {
      c.fail(fmt::format("{} of shape {} does not match x.shape[{}:] = {} (x is {})",
                         i == 1 ? "gamma" : "beta", to_string(*p.shape), axis,
                         to_string(normalized), to_string(s)));
    }
  }
  c.set_output(0, t, s);
  c.set_output(1, t, lead);
  c.set_output(2, t, lead);
}

// Checks that input `i` (named `what`) fits `want` dim by dim (unknown dims fit anything).
void check_fits(inference_context& c, std::size_t i, const char* what, const shape& want,
                const std::string& want_name, std::size_t axis, const shape& x) {
  const tensor_type& p = c.input(i);
  if (!p.shape) return;
  bool ok = p.shape->rank() == want.rank();
  for (std::size_t k = 0; ok && k < want.rank(); ++k) ok = compatible((*p.shape)[k], want[k]);
  if (!ok) {
    c.fail(fmt::format("{} of shape {} does not match {} = {} (x is {}, axis {})", what,
                       to_string(*p.shape), want_name, to_string(want), to_string(x), axis));
  }
}

// layer_norm_grad(dy, x, gamma, mean, rstd) -> dx, dgamma, dbeta.
void infer_layer_norm_grad(inference_context& c) {
  const tensor_type& dy = c.input(0);
  const tensor_type& x = c.input(1);
  const dtype t = x.type;
  // x's shape, with dims it leaves unknown taken from dy's.
  std::optional<shape> xs = x.shape ? x.shape : dy.shape;
  if (x.shape && dy.shape) {
    bool ok = dy.shape->rank() == x.shape->rank();
    for (std::size_t k = 0; ok && k < x.shape->rank(); ++k) {
      ok = compatible((*dy.shape)[k], (*x.shape)[k]);
      if (ok && (*xs)[k] < 0) (*xs)[k] = (*dy.shape)[k];
    }
    if (!ok) {
      c.fail(fmt::format("dy of shape {} does not match x of shape {}", to_string(*dy.shape),
                         to_string(*x.shape)));
    }
  }
  if (!xs) {
    c.set_output(0, t, std::nullopt);
    c.set_output(1, t, c.input(2).shape);
    c.set_output(2, t, c.input(2).shape);
    return;
  }
  const shape& s = *xs;
  const std::size_t axis = normalize(c, c.attr<std::int64_t>("axis"), s);
  shape lead;
  shape normalized;
  for (std::size_t k = 0; k < s.rank(); ++k) (k < axis ? lead : normalized).push_back(s[k]);
  check_fits(c, 2, "gamma", normalized, fmt::format("x.shape[{}:]", axis), axis, s);
  check_fits(c, 3, "mean", lead, fmt::format("x.shape[:{}]", axis), axis, s);
  check_fits(c, 4, "rstd", lead, fmt::format("x.shape[:{}]", axis), axis, s);
  // dgamma and dbeta have gamma's shape: dims x leaves unknown are taken from gamma's.
  if (const auto& g = c.input(2).shape) {
    for (std::size_t k = 0; k < normalized.rank(); ++k) {
      if (normalized[k] < 0) normalized[k] = (*g)[k];
    }
  }
  c.set_output(0, t, s);
  c.set_output(1, t, normalized);
  c.set_output(2, t, normalized);
}

void infer_xent(inference_context& c) {
  const tensor_type& logits = c.input(0);
  const tensor_type& labels = c.input(1);
  const dtype t = logits.type;
  if (logits.shape && logits.shape->rank() != 2) {
    c.fail(fmt::format("logits must be [N, C], got shape {}", to_string(*logits.shape)));
  }
  if (labels.shape && labels.shape->rank() != 1) {
    c.fail(fmt::format("labels must be [N], got shape {}", to_string(*labels.shape)));
  }
  std::int64_t n = shape::unknown;
  std::int64_t classes = shape::unknown;
  if (logits.shape) {
    n = (*logits.shape)[0];
    classes = (*logits.shape)[1];
  }
  if (labels.shape) {
    const std::int64_t ln = (*labels.shape)[0];
    if (!compatible(n, ln)) {
      c.fail(fmt::format("labels of shape {} do not match logits of shape {} (N differs)",
                         to_string(*labels.shape), to_string(*logits.shape)));
    }
    if (n < 0) n = ln;
  }
  c.set_output(0, t, shape{n});
  c.set_output(1, t, shape{n, classes});
}

void infer_argmax(inference_context& c) {
  const tensor_type& in = c.input(0);
  const dtype out_t = c.attr<dtype>("output_type");
  if (!in.shape) {
    c.set_output(0, out_t, std::nullopt);
    return;
  }
  const std::size_t axis = normalize(c, c.attr<std::int64_t>("axis"), *in.shape);
  shape out;
  for (std::size_t k = 0; k < in.shape->rank(); ++k) {
    if (k != axis) out.push_back((*in.shape)[k]);
  }
  c.set_output(0, out_t, std::move(out));
}

void add_reduce(op_registry& r, const char* name, const char* summary,
                const std::vector<dtype>& types) {
  op_def d;
  d.name = name;
  d.summary = summary;
  d.inputs = {typed("input")};
  d.outputs = {typed("output")};
  attr_def axes = attr("axes", attr_type::ints, attr_value(std::vector<std::int64_t>{}));
  axes.validate = validate_axes;
  d.attrs = {type_attr("T", types), std::move(axes),
             attr("keepdims", attr_type::boolean, attr_value(false))};
  d.infer = infer_reduce;
  r.add(std::move(d));
}

}  // namespace

void register_reduction_ops(op_registry& r) {
  add_reduce(r, "reduce_sum", "sum over axes", reduce_types());
  add_reduce(r, "reduce_mean", "mean over axes", float_types());
  add_reduce(r, "reduce_max", "maximum over axes (NaN propagates)", reduce_types());
  add_reduce(r, "reduce_min", "minimum over axes (NaN propagates)", reduce_types());
  add_reduce(r, "reduce_prod", "product over axes", reduce_types());
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
    d.name = "layer_norm";
    d.summary = "(x - mean) * rstd * gamma + beta over dims [axis, rank)";
    d.inputs = {typed("x"), typed("gamma"), typed("beta")};
    d.outputs = {typed("y"), typed("mean"), typed("rstd")};
    attr_def eps = attr("epsilon", attr_type::real, attr_value(1e-5));
    eps.validate = [](const attr_value& v) {
      if (!(v.as<double>() >= 0.0)) throw invalid_argument("epsilon must be >= 0");
    };
    d.attrs = {type_attr("T", float_types()), attr("axis", attr_type::integer, attr_value(-1)),
               std::move(eps)};
    d.infer = infer_layer_norm;
    r.add(std::move(d));
  }
  {
    // The gradient of layer_norm in one node (reduction_grads.cpp emits it): dx, and gamma's
    // and beta's gradients summed over the leading dims, from the forward's mean and rstd.
    op_def d;
    d.name = "layer_norm_grad";
    d.summary = "layer_norm's gradient: dx, dgamma, dbeta from dy, x, gamma, mean, rstd";
    d.inputs = {typed("dy"), typed("x"), typed("gamma"), typed("mean"), typed("rstd")};
    d.outputs = {typed("dx"), typed("dgamma"), typed("dbeta")};
    d.attrs = {type_attr("T", float_types()), attr("axis", attr_type::integer, attr_value(-1))};
    d.infer = infer_layer_norm_grad;
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
  {
    op_def d;
    d.name = "argmax";
    d.summary = "index of the maximum along axis (first on ties, NaN wins)";
    d.inputs = {typed("input")};
    d.outputs = {typed("output", "output_type")};
    attr_def out_t = type_attr("output_type", {dtype::i64, dtype::i32});
    out_t.default_value = attr_value(dtype::i64);
    d.attrs = {type_attr("T", argmax_types()), attr("axis", attr_type::integer, attr_value(-1)),
               std::move(out_t)};
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

output softmax(output x, std::int64_t axis, const node_options& o) {
  return x.builder().add1("softmax", {x}, {{"axis", axis}}, o);
}
output log_softmax(output x, std::int64_t axis, const node_options& o) {
  return x.builder().add1("log_softmax", {x}, {{"axis", axis}}, o);
}

layer_norm_outputs layer_norm(output x, output gamma, output beta, std::int64_t axis,
                              double epsilon, const node_options& o) {
  auto outs =
      x.builder().add("layer_norm", {x, gamma, beta}, {{"axis", axis}, {"epsilon", epsilon}}, o);
  return {outs.at(0), outs.at(1), outs.at(2)};
}

softmax_cross_entropy_outputs softmax_cross_entropy(output logits, output labels,
                                                    const node_options& o) {
  auto outs = logits.builder().add("softmax_cross_entropy", {logits, labels}, {}, o);
  return {outs.at(0), outs.at(1)};
}

output argmax(output x, std::int64_t axis, dtype output_type, const node_options& o) {
  return x.builder().add1("argmax", {x}, {{"axis", axis}, {"output_type", output_type}}, o);
}

}  // namespace ops
}  // namespace loom
