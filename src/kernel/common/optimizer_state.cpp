// The optimizer kernels' variables (Note [optimizer state] in optimizer_state.hpp).
#include "optimizer_state.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

#include "loom/core/half.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::cpu::optim {

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

// The variable's buffer, writable by this step: in place when this step holds the only
// reference (the variable's read was dropped with ctx.take_input), else a copy that
// replaces it, so a tensor someone still reads keeps its old value.
void make_writable(kernel_context& ctx, variable_store::variable& var) {
  if (var.value.buf()->writable_in_place() && var.value.is_contiguous() &&
      var.value.device() == ctx.device().id()) {
    return;
  }
  var.value = memory::contiguous_copy(var.value, ctx.device().allocator(), ctx.device().id());
}

tensor new_tensor(kernel_context& ctx, dtype t, const shape& s) {
  return memory::allocate_tensor(ctx.device().allocator(), ctx.device().id(), t, s);
}

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

// A moment: zeros when new (returns true), else made writable (validate_param checked it).
bool prepare_moment(kernel_context& ctx, const param_info& p, variable_store::variable& var,
                    dtype t) {
  if (!var.value.defined()) {
    var.value = new_tensor(ctx, t, p.shape);
    if (var.value.nbytes() > 0) std::memset(var.value.raw_data(), 0, var.value.nbytes());
    return true;
  }
  make_writable(ctx, var);
  return false;
}

void widen(const tensor& src, float* dst) {
  const std::int64_t n = src.num_elements();
  if (src.type() == dtype::f16) {
    const half* s = src.data<half>();
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  } else {
    const bfloat16* s = src.data<bfloat16>();
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
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

param_buffers prepare_param(kernel_context& ctx, const param_info& p, const param_variables& v,
                            const tensor& grad, dtype moment_type) {
  auto& var = *v.param;
  make_writable(ctx, var);

  param_buffers b;
  b.param = var.value.raw_data();
  b.param_type = p.type;
  b.grad = grad.raw_data();
  b.grad_type = grad.type();
  b.size = p.shape.num_elements();
  b.state_type = moment_type;
  if (v.master != nullptr) {
    auto& m = *v.master;
    if (!m.value.defined()) {
      m.value = new_tensor(ctx, dtype::f32, p.shape);
      widen(var.value, m.value.data<float>());
    } else {
      make_writable(ctx, m);
    }
    b.master = m.value.data<float>();
  }
  if (v.momentum != nullptr) {
    b.first = prepare_moment(ctx, p, *v.momentum, moment_type);
    b.state[0] = v.momentum->value.raw_data();
  }
  if (v.adam_m != nullptr) {
    (void)prepare_moment(ctx, p, *v.adam_m, moment_type);
    (void)prepare_moment(ctx, p, *v.adam_v, moment_type);
    b.state[0] = v.adam_m->value.raw_data();
    b.state[1] = v.adam_v->value.raw_data();
  }
  return b;
}

}  // namespace loom::cpu::optim
