// The optimizer kernels' variables (Note [optimizer state] in optimizer_state.hpp).
#include "kernel/common/optimizer_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "kernel/common/apply_rule.hpp"
#include "loom/graph/ops/optimizer_rules.hpp"

namespace loom::optim {

param_info describe_param(const node& var, algorithm algo, bool has_momentum, bool master_weights) {
  param_info p;
  p.name = var.name;
  p.type = var.attr<dtype>("dtype");
  p.shape = var.attr<shape>("shape");
  if (algo == algorithm::sgd) {
    if (has_momentum) p.momentum = p.name + "/momentum";
  } else {
    p.adam_m = p.name + "/adam_m";
    p.adam_v = p.name + "/adam_v";
  }
  if (master_weights && p.type != dtype::f32) p.master = p.name + "/master";
  return p;
}

ordered_locks::ordered_locks(std::vector<std::mutex*> mutexes) : held_(std::move(mutexes)) {
  std::sort(held_.begin(), held_.end(), std::less<>());
  held_.erase(std::unique(held_.begin(), held_.end()), held_.end());
  for (std::mutex* m : held_) m->lock();
}

ordered_locks::~ordered_locks() {
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) (*it)->unlock();
}

void param_variables::add_mutexes(std::vector<std::mutex*>& out) const {
  for (variable_store::variable* v : {param, momentum, adam_m, adam_v, master}) {
    if (v != nullptr) out.push_back(&v->mutex);
  }
}

param_variables find_variables(variable_store& store, const param_info& p) {
  param_variables v;
  v.param = &store.get(p.name);
  if (!p.momentum.empty()) v.momentum = &store.get(p.momentum);
  if (!p.adam_m.empty()) v.adam_m = &store.get(p.adam_m);
  if (!p.adam_v.empty()) v.adam_v = &store.get(p.adam_v);
  if (!p.master.empty()) v.master = &store.get(p.master);
  return v;
}

namespace {

// Existing state must be what this optimizer keeps; a checkpoint of another configuration
// (bf16 moments restored into an f32 run) is an error, not a silent reinterpretation.
void check_state(kernel_context& ctx, const param_info& p, const std::string& name,
                 const tensor& value, dtype want) {
  if (value.type() != want || value.shape() != p.shape) {
    ctx.fail("state variable '{}' is {}{} but parameter '{}' ({}{}) needs {}{}", name,
             to_string(value.type()), to_string(value.shape()), p.name, to_string(p.type),
             to_string(p.shape), to_string(want), to_string(p.shape));
  }
}

}  // namespace

void validate_param(kernel_context& ctx, const param_info& p, const param_variables& v,
                    dtype moment_type) {
  const auto& value = v.param->value;
  if (!value.defined()) ctx.fail("variable '{}' is updated before it is assigned", p.name);
  if (value.type() != p.type || value.shape() != p.shape) {
    ctx.fail("variable '{}' holds {} but is declared {}{}", p.name, value.describe(),
             to_string(p.type), to_string(p.shape));
  }
  if (v.master != nullptr && v.master->value.defined()) {
    check_state(ctx, p, p.master, v.master->value, dtype::f32);
  }
  if (v.momentum != nullptr && v.momentum->value.defined()) {
    check_state(ctx, p, p.momentum, v.momentum->value, moment_type);
  }
  if (v.adam_m != nullptr && v.adam_m->value.defined()) {
    check_state(ctx, p, p.adam_m, v.adam_m->value, moment_type);
  }
  if (v.adam_v != nullptr && v.adam_v->value.defined()) {
    check_state(ctx, p, p.adam_v, v.adam_v->value, moment_type);
  }
}

std::string optimizer_node::grad_name(std::size_t k) const {
  return fused ? fmt::format("grads[{}] (input {})", k, grads + k) : "grad (input 1)";
}

optimizer_node read_optimizer_node(const kernel_construction& c, algorithm algo, bool fused) {
  optimizer_node o;
  o.algo = algo;
  o.fused = fused;
  if (algo == algorithm::sgd) {
    o.momentum = c.attr<double>("momentum");
    o.dampening = c.attr<double>("dampening");
    o.nesterov = c.attr<bool>("nesterov");
  } else {
    o.beta1 = c.attr<double>("beta1");
    o.beta2 = c.attr<double>("beta2");
    o.eps = c.attr<double>("eps");
  }
  o.weight_decay = c.attr<double>("weight_decay");
  o.moment_type = c.attr<dtype>("moment_dtype");
  const bool master_weights = c.attr<bool>("master_weights");
  if (fused) {
    o.max_grad_norm = c.attr<double>("max_grad_norm");
    o.check_finite = c.attr<bool>("check_finite");
  }
  const std::size_t count =
      fused ? static_cast<std::size_t>(c.attr<std::int64_t>("N")) : std::size_t{1};
  o.grads = count;
  o.lr = 2 * count;
  o.step = algo == algorithm::sgd ? o.lr : o.lr + 1;
  o.scale = algo == algorithm::sgd ? o.lr + 1 : o.lr + 2;
  if (c.graph() == nullptr) c.fail("an optimizer needs the graph to find its variables");
  const node& n = c.node();
  for (std::size_t k = 0; k < count; ++k) {
    const node& src = c.graph()->at(n.inputs.at(k).node);
    const std::string which =
        fused ? fmt::format("params[{}] (input {})", k, k) : "param (input 0)";
    if (src.op() != "variable") {
      c.fail(fmt::format("{} must come from a variable, not from {}", which, src.describe()));
    }
    for (const auto& p : o.params) {
      if (p.name == src.name) {
        c.fail(fmt::format("{} updates variable '{}', which an earlier parameter updates too",
                           which, src.name));
      }
    }
    o.params.push_back(describe_param(src, algo, o.momentum != 0.0, master_weights));
  }
  return o;
}

std::vector<tensor> dense_grads(kernel_context& ctx, const optimizer_node& n,
                                std::vector<std::int64_t>& sizes) {
  const std::size_t count = n.params.size();
  std::vector<tensor> grads(count);
  sizes.assign(count, 0);
  for (std::size_t k = 0; k < count; ++k) {
    grads[k] = ctx.input_contiguous(n.grads + k);
    const param_info& p = n.params[k];
    common::apply_rule(ctx,
               [&] { optimizer_rules::check_grad(grads[k], n.grad_name(k), p.name, p.shape); });
    sizes[k] = p.shape.num_elements();
  }
  return grads;
}

namespace {

// The variables of every parameter of `n`.
std::vector<param_variables> find_all(kernel_context& ctx, const optimizer_node& n) {
  variable_store& store = ctx.variables();
  std::vector<param_variables> vars(n.params.size());
  for (std::size_t k = 0; k < vars.size(); ++k) vars[k] = find_variables(store, n.params[k]);
  return vars;
}

std::vector<std::mutex*> mutexes_of(const std::vector<param_variables>& vars) {
  std::vector<std::mutex*> mutexes;
  for (const param_variables& v : vars) v.add_mutexes(mutexes);
  return mutexes;
}

}  // namespace

locked_params::locked_params(kernel_context& ctx, const optimizer_node& n)
    : vars_(find_all(ctx, n)), locks_(mutexes_of(vars_)) {
  for (std::size_t k = 0; k < vars_.size(); ++k) (void)ctx.take_input(k);  // drop our reads
  for (std::size_t k = 0; k < vars_.size(); ++k) {
    validate_param(ctx, n.params[k], vars_[k], n.moment_type);
  }
}

}  // namespace loom::optim
