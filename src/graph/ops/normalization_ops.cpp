// layer_norm, layer_norm_grad and batch_norm (inference), the normalization family's ops:
// definitions, inference (shape rules in loom/graph/ops/normalization_rules.hpp) and builders
// (the builders composed of other ops are in normalization_builders.cpp, the training batch
// normalisation ops in normalization_train_ops.cpp).
#include <fmt/format.h>

#include <array>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/normalization.hpp"
#include "loom/graph/ops/normalization_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

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
  auto geo = normalization_rules::layer_norm_geometry_of(s, c.attr<std::int64_t>("axis"),
                                                       reduction_rules::rule_caller::inference);
  const std::size_t axis = geo.axis;
  const shape& lead = geo.lead;
  shape& normalized = geo.normalized;
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
  auto geo = normalization_rules::layer_norm_geometry_of(s, c.attr<std::int64_t>("axis"),
                                                       reduction_rules::rule_caller::inference);
  const std::size_t axis = geo.axis;
  const shape& lead = geo.lead;
  shape& normalized = geo.normalized;
  check_fits(c, 2, "gamma", normalized, fmt::format("x.shape[{}:]", axis), axis, s);
  check_fits(c, 3, "mean", lead, fmt::format("x.shape[:{}]", axis), axis, s);
  check_fits(c, 4, "rstd", lead, fmt::format("x.shape[:{}]", axis), axis, s);
  // dgamma and dbeta have gamma's shape: dims x leaves unknown are taken from gamma's.
  if (const auto& gs = c.input(2).shape) {
    for (std::size_t k = 0; k < normalized.rank(); ++k) {
      if (normalized[k] < 0) normalized[k] = (*gs)[k];
    }
  }
  c.set_output(0, t, s);
  c.set_output(1, t, normalized);
  c.set_output(2, t, normalized);
}

void infer_batch_norm(inference_context& c) {
  const tensor_type& x = c.input(0);
  if (!x.shape) {
    c.set_output(0, x.type, std::nullopt);
    return;
  }
  std::array<const shape*, 4> params{};
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = c.input(i + 1).shape;
    params[i] = p ? &*p : nullptr;
  }
  (void)normalization_rules::batch_norm_geometry_of(
      *x.shape, params,
      normalization_rules::batch_norm_channel_axis(c.attr<std::string>("data_format"),
                                                   x.shape->rank()));
  c.set_output(0, x.type, *x.shape);
}

}  // namespace

void register_batch_norm_train_ops(op_registry& r);  // normalization_train_ops.cpp

void register_normalization_ops(op_registry& r) {
  register_batch_norm_train_ops(r);
  {
    op_def d;
    d.name = "layer_norm";
    d.summary = "(x - mean) * rstd * gamma + beta over dims [axis, rank)";
    d.inputs = {typed("x"), typed("gamma"), typed("beta")};
    d.outputs = {typed("y"), typed("mean"), typed("rstd")};
    d.attrs = {type_attr("T", float_types()), attr("axis", attr_type::integer, attr_value(-1)),
               nonnegative_real_attr("epsilon", 1e-5)};
    d.infer = infer_layer_norm;
    r.add(std::move(d));
  }
  {
    // The gradient of layer_norm in one node (normalization_grads.cpp emits it): dx, and gamma's
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
    d.name = "batch_norm";
    d.summary = "inference batch normalisation per channel (dim 1, or the last for NHWC)";
    d.inputs = {typed("x"), typed("scale"), typed("bias"), typed("mean"), typed("var")};
    d.outputs = {typed("y")};
    d.attrs = {type_attr("T", float_types()), nonnegative_real_attr("epsilon", 1e-5),
               data_format_attr("NCHW")};
    d.infer = infer_batch_norm;
    r.add(std::move(d));
  }
}

namespace ops {

layer_norm_outputs layer_norm(output x, output gamma, output beta, std::int64_t axis,
                              double epsilon, const node_options& o) {
  auto outs =
      x.builder().add("layer_norm", {x, gamma, beta}, {{"axis", axis}, {"epsilon", epsilon}}, o);
  return {outs.at(0), outs.at(1), outs.at(2)};
}

output batch_norm(output x, output scale, output bias, output mean, output var, double epsilon,
                  const node_options& o) {
  return x.builder().add1("batch_norm", {x, scale, bias, mean, var}, {{"epsilon", epsilon}}, o);
}

output batch_norm(output x, output scale, output bias, output mean, output var,
                  const batch_norm_options& b, const node_options& o) {
  return x.builder().add1("batch_norm", {x, scale, bias, mean, var},
                          {{"epsilon", b.epsilon}, {"data_format", b.data_format}}, o);
}

}  // namespace ops
}  // namespace loom
