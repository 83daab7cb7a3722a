// apply_sgd, apply_adam, apply_adamw (one parameter) and fused_sgd, fused_adam, fused_adamw
// (a list of parameters of mixed dtypes). Formulas and state: docs/training.md, "Optimizers".
#include <fmt/format.h>

#include "loom/graph/op_registry.hpp"
#include "loom/graph/ops/optimizer.hpp"
#include "loom/graph/ops/optimizer_rules.hpp"
#include "op_def_helpers.hpp"

namespace loom {
namespace {

using namespace op_helpers;

using optimizer_rules::is_float_storage;

attr_def checked(std::string name, attr_type t, attr_value def,
                 std::function<void(const attr_value&)> validate) {
  attr_def a = attr(std::move(name), t, std::move(def));
  a.validate = std::move(validate);
  return a;
}

auto at_least_zero = [](const attr_value& v) {
  if (!(v.as<double>() >= 0.0)) throw invalid_argument("must be >= 0");
};
auto zero_to_one = [](const attr_value& v) {
  const double x = v.as<double>();
  if (!(x >= 0.0 && x < 1.0)) throw invalid_argument("must be in [0, 1)");
};
auto zero_to_one_closed = [](const attr_value& v) {
  const double x = v.as<double>();
  if (!(x >= 0.0 && x <= 1.0)) throw invalid_argument("must be in [0, 1]");
};

attr_def moment_dtype_attr() {
  attr_def a = attr("moment_dtype", attr_type::type, attr_value(dtype::f32));
  a.allowed_types = {dtype::f32, dtype::bf16};
  return a;
}

std::vector<attr_def> sgd_attrs() {
  return {checked("momentum", attr_type::real, 0.0, at_least_zero),
          checked("dampening", attr_type::real, 0.0, zero_to_one_closed),
          checked("weight_decay", attr_type::real, 0.0, at_least_zero),
          attr("nesterov", attr_type::boolean, false),
          moment_dtype_attr(),
          attr("master_weights", attr_type::boolean, true)};
}

std::vector<attr_def> adam_attrs(double weight_decay) {
  return {checked("beta1", attr_type::real, 0.9, zero_to_one),
          checked("beta2", attr_type::real, 0.999, zero_to_one),
          checked("eps", attr_type::real, 1e-8, at_least_zero),
          checked("weight_decay", attr_type::real, weight_decay, at_least_zero),
          moment_dtype_attr(),
          attr("master_weights", attr_type::boolean, true)};
}

void add_fused_attrs(std::vector<attr_def>& attrs) {
  attrs.push_back(attr("N", attr_type::integer));
  attrs.push_back(checked("max_grad_norm", attr_type::real, 0.0, at_least_zero));
  attrs.push_back(attr("check_finite", attr_type::boolean, true));
}

void check_nesterov(inference_context& c) {
  optimizer_rules::check_nesterov(c.attr<bool>("nesterov"), c.attr<double>("momentum"),
                                  c.attr<double>("dampening"));
}

void check_scalar(inference_context& c, std::size_t i, const char* what) {
  const auto& t = c.input(i);
  if (t.shape && t.shape->rank() != 0) {
    c.fail(fmt::format("{} (input {}) must be a scalar, got {}", what, i, to_string(t)));
  }
}

// A parameter and its gradient: float storage types, shapes equal where known.
void check_pair(inference_context& c, std::size_t param, std::size_t grad, const std::string& pname,
                const std::string& gname) {
  const auto& p = c.input(param);
  const auto& g = c.input(grad);
  if (!is_float_storage(p.type)) {
    c.fail(fmt::format("{} (input {}) is {}; parameters must be float32, float16 or bfloat16",
                       pname, param, to_string(p)));
  }
  if (!is_float_storage(g.type)) {
    c.fail(fmt::format("{} (input {}) is {}; gradients must be float32, float16 or bfloat16", gname,
                       grad, to_string(g)));
  }
  bool fits = true;
  if (p.shape && g.shape) {
    if (p.shape->rank() != g.shape->rank()) {
      fits = false;
    } else {
      for (std::size_t d = 0; d < p.shape->rank(); ++d) {
        const auto a = (*p.shape)[d];
        const auto b = (*g.shape)[d];
        if (a >= 0 && b >= 0 && a != b) fits = false;
      }
    }
  }
  if (!fits) {
    c.fail(fmt::format("{} {} does not fit {} {}", gname, to_string(g), pname, to_string(p)));
  }
}

// Inputs of the per-tensor ops: param, grad, lr[, step].
void infer_apply(inference_context& c, bool has_step) {
  check_pair(c, 0, 1, "param", "grad");
  check_scalar(c, 2, "lr");
  if (has_step) check_scalar(c, 3, "step");
}

// Inputs of the fused ops: params[N], grads[N], lr[, step], grad_scale.
void infer_fused(inference_context& c, bool has_step) {
  const auto n = static_cast<std::size_t>(c.attr<std::int64_t>("N"));
  for (std::size_t k = 0; k < n; ++k) {
    check_pair(c, k, n + k, fmt::format("params[{}]", k), fmt::format("grads[{}]", k));
  }
  check_scalar(c, 2 * n, "lr");
  if (has_step) check_scalar(c, 2 * n + 1, "step");
  check_scalar(c, has_step ? 2 * n + 2 : 2 * n + 1, "grad_scale");
  c.set_output(0, dtype::f32, shape{});
  c.set_output(1, dtype::boolean, shape{});
}

// Inputs of any dtype, each its own (arg_def::any_type); the ops' inference checks them.
arg_def any_input(std::string name) {
  return arg_def{std::move(name), {}, dtype::f32, {}, true};
}
arg_def any_list(std::string name, std::string length_attr) {
  return arg_def{std::move(name), {}, dtype::f32, std::move(length_attr), true};
}

op_def apply_def(const char* name, const char* summary, bool has_step,
                 std::vector<attr_def> attrs) {
  op_def d;
  d.name = name;
  d.summary = summary;
  d.inputs = {any_input("param"), any_input("grad"), fixed("lr", dtype::f32)};
  if (has_step) d.inputs.push_back(fixed("step", dtype::i64));
  d.attrs = std::move(attrs);
  d.is_stateful = true;
  d.colocate_with_input = 0;
  return d;
}

op_def fused_def(const char* name, const char* summary, bool has_step,
                 std::vector<attr_def> attrs) {
  op_def d;
  d.name = name;
  d.summary = summary;
  d.inputs = {any_list("params", "N"), any_list("grads", "N"), fixed("lr", dtype::f32)};
  if (has_step) d.inputs.push_back(fixed("step", dtype::i64));
  d.inputs.push_back(fixed("grad_scale", dtype::f32));
  d.outputs = {fixed("grad_norm", dtype::f32), fixed("found_inf", dtype::boolean)};
  add_fused_attrs(attrs);
  d.attrs = std::move(attrs);
  d.is_stateful = true;
  // Note [fused optimizer placement]: the node is placed with its first parameter; the
  // others are found in the session's store by name, so every parameter of one fused
  // node must live on one device (on a single CPU device, always true).
  d.colocate_with_input = 0;
  return d;
}

}  // namespace

void register_optimizer_ops(op_registry& r) {
  {
    op_def d =
        apply_def("apply_sgd", "param -= lr * SGD direction (momentum, Nesterov, weight decay)",
                  false, sgd_attrs());
    d.infer = [](inference_context& c) {
      infer_apply(c, false);
      check_nesterov(c);
    };
    r.add(std::move(d));
  }
  {
    op_def d = apply_def("apply_adam", "one Adam step (bias-corrected; L2 weight decay)", true,
                         adam_attrs(0.0));
    d.infer = [](inference_context& c) { infer_apply(c, true); };
    r.add(std::move(d));
  }
  {
    op_def d =
        apply_def("apply_adamw", "one AdamW step (decoupled weight decay)", true, adam_attrs(0.01));
    d.infer = [](inference_context& c) { infer_apply(c, true); };
    r.add(std::move(d));
  }
  {
    op_def d = fused_def("fused_sgd", "SGD over many parameters of mixed dtypes in one call", false,
                         sgd_attrs());
    d.infer = [](inference_context& c) {
      infer_fused(c, false);
      check_nesterov(c);
    };
    r.add(std::move(d));
  }
  {
    op_def d = fused_def("fused_adam", "Adam over many parameters of mixed dtypes in one call",
                         true, adam_attrs(0.0));
    d.infer = [](inference_context& c) { infer_fused(c, true); };
    r.add(std::move(d));
  }
  {
    op_def d = fused_def("fused_adamw", "AdamW over many parameters of mixed dtypes in one call",
                         true, adam_attrs(0.01));
    d.infer = [](inference_context& c) { infer_fused(c, true); };
    r.add(std::move(d));
  }
}

namespace ops {
namespace {

void require_variable(const char* fn, const std::string& what, const output& param) {
  const node& p = param.producer();
  if (p.op() != "variable") {
    throw invalid_argument(
        fmt::format("ops::{}: {} must be a variable's output, not {}", fn, what, p.describe()));
  }
}

attr_map sgd_attr_map(const sgd_options& s) {
  return {{"momentum", s.momentum},         {"dampening", s.dampening},
          {"weight_decay", s.weight_decay}, {"nesterov", s.nesterov},
          {"moment_dtype", s.moment_dtype}, {"master_weights", s.master_weights}};
}

attr_map adam_attr_map(const adam_options& a, double default_decay) {
  return {{"beta1", a.beta1},
          {"beta2", a.beta2},
          {"eps", a.eps},
          {"weight_decay", a.weight_decay.value_or(default_decay)},
          {"moment_dtype", a.moment_dtype},
          {"master_weights", a.master_weights}};
}

// Adds a node with no outputs and returns its name (the node just added).
std::string add_target(const char* op, const std::vector<output>& inputs, attr_map attrs,
                       const node_options& o) {
  graph_builder& b = inputs.front().builder();
  (void)b.add(op, inputs, std::move(attrs), o);
  return b.g().nodes().back().name;
}

fused_update add_fused(const char* op, const std::vector<output>& params,
                       const std::vector<output>& grads, std::vector<output> scalars,
                       attr_map attrs, const fused_options& fused, const node_options& o) {
  if (params.size() != grads.size()) {
    throw invalid_argument(
        fmt::format("ops::{}: {} params but {} grads", op, params.size(), grads.size()));
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    require_variable(op, fmt::format("params[{}]", k), params[k]);
  }
  std::vector<output> inputs = params;
  inputs.insert(inputs.end(), grads.begin(), grads.end());
  inputs.insert(inputs.end(), scalars.begin(), scalars.end());
  attrs.emplace("N", static_cast<std::int64_t>(params.size()));
  attrs.emplace("max_grad_norm", fused.max_grad_norm);
  attrs.emplace("check_finite", fused.check_finite);
  graph_builder& b = scalars.front().builder();
  auto outs = b.add(op, inputs, std::move(attrs), o);
  return {b.g().at(outs.at(0).ep().node).name, outs.at(0), outs.at(1)};
}

}  // namespace

std::string apply_sgd(output param, output grad, output lr, const sgd_options& options,
                      const node_options& o) {
  require_variable("apply_sgd", "param", param);
  return add_target("apply_sgd", {param, grad, lr}, sgd_attr_map(options), o);
}

std::string apply_adam(output param, output grad, output lr, output step,
                       const adam_options& options, const node_options& o) {
  require_variable("apply_adam", "param", param);
  return add_target("apply_adam", {param, grad, lr, step}, adam_attr_map(options, 0.0), o);
}

std::string apply_adamw(output param, output grad, output lr, output step,
                        const adam_options& options, const node_options& o) {
  require_variable("apply_adamw", "param", param);
  return add_target("apply_adamw", {param, grad, lr, step}, adam_attr_map(options, 0.01), o);
}

fused_update fused_sgd(const std::vector<output>& params, const std::vector<output>& grads,
                       output lr, output grad_scale, const sgd_options& options,
                       const fused_options& fused, const node_options& o) {
  return add_fused("fused_sgd", params, grads, {lr, grad_scale}, sgd_attr_map(options), fused, o);
}

fused_update fused_adam(const std::vector<output>& params, const std::vector<output>& grads,
                        output lr, output step, output grad_scale, const adam_options& options,
                        const fused_options& fused, const node_options& o) {
  return add_fused("fused_adam", params, grads, {lr, step, grad_scale}, adam_attr_map(options, 0.0),
                   fused, o);
}

fused_update fused_adamw(const std::vector<output>& params, const std::vector<output>& grads,
                         output lr, output step, output grad_scale, const adam_options& options,
                         const fused_options& fused, const node_options& o) {
  return add_fused("fused_adamw", params, grads, {lr, step, grad_scale},
                   adam_attr_map(options, 0.01), fused, o);
}

}  // namespace ops
}  // namespace loom
