// CPU kernels of the optimizers: apply_sgd, apply_adam, apply_adamw (one parameter each,
// the unfused reference) and fused_sgd, fused_adam, fused_adamw (any number of parameters
// of mixed dtypes in one call, over multi_tensor_apply). Both kinds run the same code per
// chunk, and the same element math (optimizer_math.hpp), so they agree bitwise.
//
// Note [fused optimizer passes]
// A fused call makes one chunk table over its gradients and runs up to two passes over it:
//   pass 1 (when check_finite or max_grad_norm > 0): each chunk's sum of squares of the
//     unscaled gradients g/grad_scale into its slot of a per-chunk array
//     (Note [deterministic multi-tensor reductions]). Their sum gives grad_norm, and a sum
//     that is not finite means some gradient is inf or NaN: found_inf. With check_finite the
//     step then stops before touching any variable: parameters, moments and masters stay
//     bitwise as they were and no state is created, as torch.cuda.amp.GradScaler skips
//     the optimizer step. With max_grad_norm the gradients are scaled by
//     clip = min(1, max_grad_norm / (grad_norm + 1e-6)) in f32, as clip_grad_norm_ does.
//   pass 2: the update, chunk by chunk; without pass 1 each chunk first adds its sum of
//     squares to its slot (the chunk is then in cache), so grad_norm and found_inf are still
//     reported but cannot stop the step (check_finite = false: one read of each gradient,
//     for when the caller knows its gradients are finite).
// The inf/NaN check needs every gradient read before anything is written, so a skippable
// step costs one extra read of the gradients (4 of 32 bytes per element for f32 Adam).
//
// Note [deterministic multi-tensor reductions]
// A chunk's sum of squares is computed by one thread in a fixed order (eight lanes, each
// summing blocks of 8 squares in f32 and the blocks in double, added in a fixed order; see
// sum_squares_of), and the chunks' sums are added in chunk order, so grad_norm does not
// depend on the thread count or on which thread ran which chunk.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_kernels.hpp"
#include "kernel/common/optimizer_state.hpp"
#include "kernel/common/apply_rule.hpp"
#include "loom/core/half.hpp"
#include "loom/graph/ops/optimizer_rules.hpp"
#include "loom/kernel/multi_tensor_apply.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "optimizer_math.hpp"

namespace loom::cpu {
namespace {

using loom::optim::algorithm;
using loom::optim::param_info;
using loom::optim::param_variables;
using optim::grad_transform;

// Rough cost of one element of an update, in ns, for splitting work over threads.
constexpr double update_ns_per_element = 1.5;
// Elements converted to float at a time for f16/bf16 operands (stack buffers, in L1).
constexpr std::int64_t widen_block = 512;

// ---- element access ------------------------------------------------------------------

template <class T>
void load_as_float(const void* base, std::int64_t offset, std::int64_t n, float* out) {
  const T* src = static_cast<const T*>(base) + offset;
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]);
}

template <class T>
void store_from_float(void* base, std::int64_t offset, std::int64_t n, const float* in) {
  T* dst = static_cast<T*>(base) + offset;
  for (std::int64_t i = 0; i < n; ++i) dst[i] = T(in[i]);
}

void load_floats(dtype t, const void* base, std::int64_t offset, std::int64_t n, float* out) {
  switch (t) {
    case dtype::f16:
      return load_as_float<half>(base, offset, n, out);
    case dtype::bf16:
      return load_as_float<bfloat16>(base, offset, n, out);
    default:
      return load_as_float<float>(base, offset, n, out);
  }
}

void store_floats(dtype t, void* base, std::int64_t offset, std::int64_t n, const float* in) {
  switch (t) {
    case dtype::f16:
      return store_from_float<half>(base, offset, n, in);
    case dtype::bf16:
      return store_from_float<bfloat16>(base, offset, n, in);
    default:
      return store_from_float<float>(base, offset, n, in);
  }
}

float* f32_at(void* base, std::int64_t offset) {
  return static_cast<float*>(base) + offset;
}
const float* f32_at(const void* base, std::int64_t offset) {
  return static_cast<const float*>(base) + offset;
}

// ---- the step's buffers (Note [optimizer state]) ---------------------------------------

// One parameter's buffers for one step, all writable by this step (resolved under the
// locks by prepare_param).
struct param_buffers {
  void* param = nullptr;
  dtype param_type = dtype::f32;
  float* master = nullptr;  // nullptr: none
  const void* grad = nullptr;
  dtype grad_type = dtype::f32;
  void* state[2] = {nullptr, nullptr};  // adam: m, v; sgd: momentum (or none)
  dtype state_type = dtype::f32;
  std::int64_t size = 0;
  bool first = false;  // SGD: the momentum buffer is new this step
};

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

// Under the locks, after validate_param: creates missing state (zeros; the master from
// the parameter), makes every buffer writable (copy on write) and returns the pointers.
// `grad` must be contiguous and of the parameter's shape.
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

// ---- pass 1: sums of squares ---------------------------------------------------------

template <class G, bool Unscale>
float unscaled(const G* g, std::int64_t i, float scale) {
  float u = static_cast<float>(g[i]);
  if constexpr (Unscale) u = u / scale;
  return u;
}

template <class G, bool Unscale>
double sum_squares_of(const void* base, std::int64_t begin, std::int64_t end, float scale) {
  const G* g = static_cast<const G*>(base);
  // Note [deterministic multi-tensor reductions]: eight lanes, element i of a block always
  // in lane i % 8. A lane sums its block's squares in f32 (8 terms: a relative error of
  // at most 8 x 2^-24, which vector code computes as fast as the update reads), then
  // adds them to its double accumulator; a block whose f32 sum is not finite is redone in
  // double, so large finite gradients never pass for inf. The lanes are added in a fixed
  // order: the same sum however the work is threaded.
  constexpr int lanes = 8;
  constexpr std::int64_t block = 64;
  double acc[lanes] = {};
  std::int64_t i = begin;
  for (; i + block <= end; i += block) {
    float part[lanes] = {};
    for (std::int64_t k = 0; k < block; k += lanes) {
      for (int j = 0; j < lanes; ++j) {
        const float u = unscaled<G, Unscale>(g, i + k + j, scale);
        part[j] += u * u;
      }
    }
    const float total =
        ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    if (std::isfinite(total)) {
      for (int j = 0; j < lanes; ++j) acc[j] += static_cast<double>(part[j]);
    } else {
      for (std::int64_t k = 0; k < block; ++k) {
        const double u = unscaled<G, Unscale>(g, i + k, scale);
        acc[k % lanes] += u * u;
      }
    }
  }
  for (; i < end; ++i) {
    const double u = unscaled<G, Unscale>(g, i, scale);
    acc[0] += u * u;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class G>
double sum_squares_t(const void* base, std::int64_t begin, std::int64_t end, float scale) {
  return scale == 1.0f ? sum_squares_of<G, false>(base, begin, end, scale)
                       : sum_squares_of<G, true>(base, begin, end, scale);
}

// Σ (g/scale)² over elements [begin, end) of a gradient, in double.
double sum_squares(dtype t, const void* g, std::int64_t begin, std::int64_t end, float scale) {
  switch (t) {
    case dtype::f16:
      return sum_squares_t<half>(g, begin, end, scale);
    case dtype::bf16:
      return sum_squares_t<bfloat16>(g, begin, end, scale);
    default:
      return sum_squares_t<float>(g, begin, end, scale);
  }
}

// ---- pass 2: the update of one chunk -------------------------------------------------

struct step_constants {
  algorithm algo = algorithm::adam;
  optim::adam_constants adam;
  optim::sgd_constants sgd;
};

void update_dense(const step_constants& c, float* w, const float* g, float* s0, float* s1,
                  std::int64_t n, const grad_transform& t, bool first) {
  if (c.algo == algorithm::sgd) {
    optim::sgd_update(w, g, s0, n, c.sgd, t, first);
  } else {
    optim::adam_update(w, g, s0, s1, n, c.adam, t);
  }
}

// Elements [begin, end) of one parameter. All-f32 operands are updated where they lie;
// f16/bf16 ones are widened block by block into float buffers, updated by the same code,
// and rounded back. With a master, the master is the weight and the parameter its rounding.
void update_chunk(const step_constants& c, const param_buffers& b, std::int64_t begin,
                  std::int64_t end, const grad_transform& t) {
  const int states = c.algo == algorithm::sgd ? (b.state[0] != nullptr ? 1 : 0) : 2;
  const bool weight_direct = b.master != nullptr || b.param_type == dtype::f32;
  const bool grad_direct = b.grad_type == dtype::f32;
  const bool state_direct = states == 0 || b.state_type == dtype::f32;
  float* weight = b.master != nullptr ? b.master : static_cast<float*>(b.param);

  if (weight_direct && grad_direct && state_direct) {
    update_dense(c, weight + begin, f32_at(b.grad, begin),
                 states > 0 ? f32_at(b.state[0], begin) : nullptr,
                 states > 1 ? f32_at(b.state[1], begin) : nullptr, end - begin, t, b.first);
    if (b.master != nullptr)
      store_floats(b.param_type, b.param, begin, end - begin, b.master + begin);
    return;
  }
  float wbuf[widen_block];
  float gbuf[widen_block];
  float s0buf[widen_block];
  float s1buf[widen_block];
  for (std::int64_t at = begin; at < end; at += widen_block) {
    const std::int64_t n = std::min(widen_block, end - at);
    float* w = weight + at;
    if (!weight_direct) {
      load_floats(b.param_type, b.param, at, n, wbuf);
      w = wbuf;
    }
    const float* g = f32_at(b.grad, at);
    if (!grad_direct) {
      load_floats(b.grad_type, b.grad, at, n, gbuf);
      g = gbuf;
    }
    float* s0 = states > 0 ? f32_at(b.state[0], at) : nullptr;
    float* s1 = states > 1 ? f32_at(b.state[1], at) : nullptr;
    if (!state_direct) {
      s0 = s0buf;
      s1 = s1buf;
      if (states > 0) load_floats(b.state_type, b.state[0], at, n, s0buf);
      if (states > 1) load_floats(b.state_type, b.state[1], at, n, s1buf);
    }
    update_dense(c, w, g, s0, s1, n, t, b.first);
    if (!state_direct) {
      if (states > 0) store_floats(b.state_type, b.state[0], at, n, s0buf);
      if (states > 1) store_floats(b.state_type, b.state[1], at, n, s1buf);
    }
    if (b.param_type != dtype::f32) store_floats(b.param_type, b.param, at, n, w);
  }
}

// ---- the kernels -----------------------------------------------------------------------

class optimizer_kernel : public op_kernel {
 public:
  optimizer_kernel(const kernel_construction& c, algorithm algo, bool fused)
      : op_kernel(c), node_(loom::optim::read_optimizer_node(c, algo, fused)) {}

  void compute(kernel_context& ctx) override {
    const step_constants constants = read_constants(ctx);
    grad_transform transform;
    if (node_.fused) transform.scale = read_grad_scale(ctx);

    // Gradients: dense, of their parameters' shapes.
    const std::size_t count = node_.params.size();
    std::vector<std::int64_t> sizes;
    const std::vector<tensor> grads = loom::optim::dense_grads(ctx, node_, sizes);
    const auto table = make_chunk_table(sizes);

    // Pass 1 (Note [fused optimizer passes]).
    std::vector<double> partial(node_.fused ? table.size() : 0, 0.0);
    const bool pre_pass = node_.fused && (node_.check_finite || node_.max_grad_norm > 0.0);
    float norm = 0.0f;
    bool found_inf = false;
    auto summarize = [&] {
      double total = 0.0;
      for (const double s : partial) total += s;
      norm = static_cast<float>(std::sqrt(total));
      found_inf = !std::isfinite(total);
    };
    if (pre_pass) {
      multi_tensor_apply(ctx, table, 0.3, [&](std::size_t i, const tensor_chunk& ch) {
        const auto& g = grads[static_cast<std::size_t>(ch.tensor)];
        partial[i] = sum_squares(g.type(), g.raw_data(), ch.begin, ch.end, transform.scale);
      });
      summarize();
      if (found_inf && node_.check_finite) {
        write_outputs(ctx, norm, true);
        return;
      }
      if (node_.max_grad_norm > 0.0) {
        // clip_grad_norm_: max_norm / (total_norm + 1e-6), clamped to 1, in f32.
        transform.clip = std::min(static_cast<float>(node_.max_grad_norm) / (norm + 1e-6f), 1.0f);
      }
    }

    // The variables: looked up (state created empty when missing), locked in address
    // order, checked, then made writable (Note [optimizer state]).
    loom::optim::locked_params vars(ctx, node_);
    std::vector<param_buffers> buffers(count);
    for (std::size_t k = 0; k < count; ++k) {
      buffers[k] = prepare_param(ctx, node_.params[k], vars[k], grads[k], node_.moment_type);
    }

    // Pass 2: the update, chunk by chunk.
    multi_tensor_apply(
        ctx, table, update_ns_per_element, [&](std::size_t i, const tensor_chunk& ch) {
          const auto& b = buffers[static_cast<std::size_t>(ch.tensor)];
          if (node_.fused && !pre_pass) {
            partial[i] = sum_squares(b.grad_type, b.grad, ch.begin, ch.end, transform.scale);
          }
          update_chunk(constants, b, ch.begin, ch.end, transform);
        });
    if (node_.fused) {
      if (!pre_pass) summarize();
      write_outputs(ctx, norm, found_inf);
    }
  }

 private:
  step_constants read_constants(kernel_context& ctx) const {
    const tensor& lr_t = ctx.input(node_.lr);
    common::apply_rule(ctx, [&] { optimizer_rules::check_scalar_input(lr_t, "lr", node_.lr, dtype::f32); });
    const double lr = *lr_t.data<float>();
    common::apply_rule(ctx, [&] { optimizer_rules::check_lr(lr, node_.lr); });
    step_constants c;
    c.algo = node_.algo;
    if (node_.algo == algorithm::sgd) {
      c.sgd = optim::make_sgd_constants(lr, node_.momentum, node_.dampening, node_.weight_decay,
                                        node_.nesterov);
      return c;
    }
    const tensor& step_t = ctx.input(node_.step);
    common::apply_rule(
        ctx, [&] { optimizer_rules::check_scalar_input(step_t, "step", node_.step, dtype::i64); });
    const std::int64_t step = *step_t.data<std::int64_t>();
    common::apply_rule(ctx, [&] { optimizer_rules::check_step(step, node_.step); });
    c.adam = optim::make_adam_constants(lr, step, node_.beta1, node_.beta2, node_.eps,
                                        node_.weight_decay, node_.algo == algorithm::adamw);
    return c;
  }

  float read_grad_scale(kernel_context& ctx) const {
    const tensor& s = ctx.input(node_.scale);
    common::apply_rule(ctx, [&] {
      optimizer_rules::check_scalar_input(s, "grad_scale", node_.scale, dtype::f32);
    });
    const float v = *s.data<float>();
    common::apply_rule(ctx, [&] { optimizer_rules::check_grad_scale(v, node_.scale); });
    return v;
  }

  static void write_outputs(kernel_context& ctx, float norm, bool found_inf) {
    *ctx.allocate_output(0, dtype::f32, shape{}).data<float>() = norm;
    *ctx.allocate_output(1, dtype::boolean, shape{}).data<bool>() = found_inf;
  }

  loom::optim::optimizer_node node_;
};

template <algorithm A, bool Fused>
class optimizer_kernel_of final : public optimizer_kernel {
 public:
  explicit optimizer_kernel_of(const kernel_construction& c) : optimizer_kernel(c, A, Fused) {}
};

}  // namespace

void register_optimizer_kernels(kernel_registry& r) {
  constexpr device_type cpu = device_type::cpu;
  r.add(make_kernel_def<optimizer_kernel_of<algorithm::sgd, false>>("apply_sgd", cpu));
  r.add(make_kernel_def<optimizer_kernel_of<algorithm::adam, false>>("apply_adam", cpu));
  r.add(make_kernel_def<optimizer_kernel_of<algorithm::adamw, false>>("apply_adamw", cpu));
  r.add(make_kernel_def<optimizer_kernel_of<algorithm::sgd, true>>("fused_sgd", cpu, {},
                                                                   "multi_tensor"));
  r.add(make_kernel_def<optimizer_kernel_of<algorithm::adam, true>>("fused_adam", cpu, {},
                                                                    "multi_tensor"));
  r.add(make_kernel_def<optimizer_kernel_of<algorithm::adamw, true>>("fused_adamw", cpu, {},
                                                                     "multi_tensor"));
}

}  // namespace loom::cpu
