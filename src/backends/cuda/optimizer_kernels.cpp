// CUDA kernels of the optimizers: apply_sgd, apply_adam, apply_adamw (one parameter) and
// fused_sgd, fused_adam, fused_adamw (any number of parameters of mixed dtypes), with the
// semantics of the CPU kernels (src/backends/cpu/optimizer_kernels.cpp): the same checks
// (include/loom/graph/ops/optimizer_rules.hpp), the same state variables (Note [optimizer
// state], shared code in src/kernel/common/optimizer_state.hpp), the same element math
// rounded the same way.
//
// Note [cuda optimizer steps]
// A step is queued on the compute stream and the host does not wait for it:
//   1. a one-thread prologue reads lr, step and grad_scale where they live (device memory;
//      values from the host when the tensors are host tensors, checked there with the CPU
//      kernel's messages) and computes the step's constants into a small device struct,
//      as make_adam_constants / make_sgd_constants do (double, rounded to float once);
//   2. (fused, when check_finite or max_grad_norm > 0) one block per chunk of the gradients
//      writes the chunk's sum of squares of g / grad_scale into its slot, and one block adds
//      the slots in chunk order (deterministic) into grad_norm and found_inf, the clipping
//      coefficient, and `skip`: the decision to skip stays on the device, in the struct;
//   3. the update, one block per chunk, returns at once when `skip` is set; in one-pass
//      mode (check_finite = false, no clipping) it also writes each chunk's sum of squares,
//      and the reduction runs after it.
// Multi-tensor launches: the tensors' pointers and the chunk table travel as the kernels'
// argument (up to 64 tensors and 1024 chunks a launch, ~16 KiB; CUDA 12.1+ takes 32 KiB),
// so there is no limit on the tensor count and no host memory whose lifetime must follow
// the stream: more tensors take more launches.
// Invalid scalars found on the device (a device-resident lr that is NaN, say) cannot throw:
// the step does nothing and a fused node reports found_inf = true and grad_norm = NaN.
// One exception to "no waiting": a step that would create state (the first step: moments,
// momentum buffers, f32 masters) and may be skipped reads the skip flag first (one stream
// synchronisation), so that, as on CPU, a skipped step creates no state: SGD's momentum
// buffer must start as the first gradient actually applied.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/optimizer_state.hpp"
#include "kernel/common/apply_rule.hpp"
#include "kernels/optimizer.cuh"
#include "loom/graph/ops/optimizer_rules.hpp"
#include "loom/kernel/multi_tensor_apply.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "optimizer_launches.hpp"

namespace loom::cuda {
namespace {

using kernels::optim_algorithm;
using kernels::optim_tensor_list;
using kernels::optim_type;
using optim::algorithm;
using optim::param_info;

static_assert(kernels::optim_chunk_elements == multi_tensor_chunk_elements,
              "one chunk per block: the chunk table is loom's");

optim_type optim_type_of(dtype t) {
  static_assert(static_cast<int>(optim_type::f16) == static_cast<int>(dtype::f16) &&
                static_cast<int>(optim_type::bf16) == static_cast<int>(dtype::bf16));
  return static_cast<optim_type>(t);  // a float storage type: checked before
}

bool on_host(const tensor& t) {
  const device_type d = t.device().type;
  return d == device_type::cpu || d == device_type::cuda_host;
}

// One parameter's device buffers for one step.
struct device_param {
  void* param = nullptr;
  float* master = nullptr;
  const void* grad = nullptr;
  void* state0 = nullptr;
  void* state1 = nullptr;
  std::int64_t size = 0;
  optim_type param_type = optim_type::f32;
  optim_type grad_type = optim_type::f32;
  bool first = false;
};

// The argument of one launch over `g`.
optim_tensor_list make_list(const std::vector<tensor_chunk>& table, const launch_group& g,
                            const std::vector<device_param>& params, optim_type state_type) {
  optim_tensor_list l{};
  l.state_type = state_type;
  int slot = -1;
  std::int32_t last = -1;
  for (std::size_t c = g.chunk_begin; c < g.chunk_end; ++c) {
    const tensor_chunk& ch = table[c];
    if (ch.tensor != last) {
      last = ch.tensor;
      ++slot;
      const auto s = static_cast<std::size_t>(slot);
      const device_param& p = params[static_cast<std::size_t>(ch.tensor)];
      l.param[s] = p.param;
      l.master[s] = p.master;
      l.grad[s] = p.grad;
      l.state0[s] = p.state0;
      l.state1[s] = p.state1;
      l.size[s] = p.size;
      l.param_type[s] = p.param_type;
      l.grad_type[s] = p.grad_type;
      l.first[s] = p.first ? 1 : 0;
    }
    const std::size_t k = c - g.chunk_begin;
    l.chunk_tensor[k] = slot;
    l.chunk_begin[k] = ch.begin;
  }
  l.chunks = static_cast<std::int32_t>(g.chunk_end - g.chunk_begin);
  return l;
}

void check(kernel_context& ctx, cudaError_t e, const char* what) {
  if (e != cudaSuccess) ctx.fail("{} failed to launch: {}", what, describe(e));
}

tensor new_tensor(kernel_context& ctx, dtype t, const shape& s) {
  return memory::allocate_tensor(ctx.device().allocator(), ctx.device().id(), t, s);
}

// The variable's buffer, writable by this step in place: kept when this step holds the only
// reference to a dense buffer on this device, else replaced by a copy here (copy on write;
// a value restored into host memory moves to the device).
void make_writable(kernel_context& ctx, variable_store::variable& var) {
  tensor& v = var.value;
  if (v.device() != ctx.device().id()) {
    v = ctx.device().copy_from_host(v);
  } else if (!v.buf()->writable_in_place() || !v.is_contiguous()) {
    v = ctx.device().contiguous_copy(v);  // always a new buffer, on the compute stream
  }
}

// A moment: zeros when new (returns true), else made writable.
bool prepare_moment(kernel_context& ctx, cudaStream_t stream, const param_info& p,
                    variable_store::variable& var, dtype t) {
  if (!var.value.defined()) {
    var.value = new_tensor(ctx, t, p.shape);
    if (var.value.nbytes() > 0) {
      LOOM_CUDA_CHECK(cudaMemsetAsync(var.value.raw_data(), 0, var.value.nbytes(), stream));
    }
    return true;
  }
  make_writable(ctx, var);
  return false;
}

// True when the step would create a state variable of `p`.
bool creates_state(const optim::param_variables& v) {
  for (const variable_store::variable* s : {v.momentum, v.adam_m, v.adam_v, v.master}) {
    if (s != nullptr && !s->value.defined()) return true;
  }
  return false;
}

class optimizer_kernel : public op_kernel {
 public:
  optimizer_kernel(const kernel_construction& c, algorithm algo, bool fused)
      : op_kernel(c), node_(optim::read_optimizer_node(c, algo, fused)) {
    hyper_.algo = algo == algorithm::sgd    ? optim_algorithm::sgd
                  : algo == algorithm::adam ? optim_algorithm::adam
                                            : optim_algorithm::adamw;
    hyper_.momentum = node_.momentum;
    hyper_.dampening = node_.dampening;
    hyper_.nesterov = node_.nesterov ? 1 : 0;
    hyper_.beta1 = node_.beta1;
    hyper_.beta2 = node_.beta2;
    hyper_.eps = node_.eps;
    hyper_.weight_decay = node_.weight_decay;
    if (fused) {
      hyper_.max_grad_norm = node_.max_grad_norm;
      hyper_.check_finite = node_.check_finite ? 1 : 0;
    }
  }

  void compute(kernel_context& ctx) override {
    const kernels::optim_scalars scalars = read_scalars(ctx);

    // Gradients: dense, of their parameters' shapes.
    const std::size_t count = node_.params.size();
    std::vector<std::int64_t> sizes;
    const std::vector<tensor> grads = optim::dense_grads(ctx, node_, sizes);
    const auto table = make_chunk_table(sizes);
    const auto groups = group_chunks(table, kernels::optim_list_tensors,
                                     static_cast<std::size_t>(kernels::optim_list_chunks));

    launch_scope s(ctx);
    // Device scratch: the step's struct, then one double per chunk.
    const std::size_t state_bytes = (sizeof(kernels::optim_step_state) + 15) / 16 * 16;
    const tensor scratch = ctx.allocate_temp(
        dtype::u8, shape{static_cast<std::int64_t>(
                       state_bytes + sizeof(double) * std::max<std::size_t>(table.size(), 1))});
    auto* state = static_cast<kernels::optim_step_state*>(scratch.raw_data());
    auto* partial =
        reinterpret_cast<double*>(static_cast<std::byte*>(scratch.raw_data()) + state_bytes);
    float* norm_out = nullptr;
    bool* found_out = nullptr;
    if (node_.fused) {
      norm_out = ctx.allocate_output(0, dtype::f32, shape{}).data<float>();
      found_out = ctx.allocate_output(1, dtype::boolean, shape{}).data<bool>();
    }
    check(ctx, kernels::optim_prologue(hyper_, scalars, state, s.stream), "optimizer prologue");

    // Pass 1 (Note [cuda optimizer steps]).
    const bool pre_pass = node_.fused && (hyper_.check_finite != 0 || hyper_.max_grad_norm > 0.0);
    std::vector<device_param> dp(count);
    for (std::size_t k = 0; k < count; ++k) {
      dp[k].grad = grads[k].raw_data();
      dp[k].grad_type = optim_type_of(grads[k].type());
      dp[k].size = sizes[k];
    }
    const optim_type state_type = optim_type_of(node_.moment_type);
    if (pre_pass) {
      for (const launch_group& g : groups) {
        const optim_tensor_list list = make_list(table, g, dp, state_type);
        check(ctx,
              kernels::optim_sum_squares(list, partial, static_cast<std::int64_t>(g.chunk_begin),
                                         state, s.stream),
              "optimizer sum of squares");
      }
      check(ctx,
            kernels::optim_finalize(partial, static_cast<std::int64_t>(table.size()), hyper_, state,
                                    norm_out, found_out, s.stream),
            "optimizer reduction");
    }

    // The variables: looked up (state created empty when missing), locked in address
    // order, checked, then made writable (Note [optimizer state]).
    optim::locked_params vars(ctx, node_);
    bool creates = false;
    for (std::size_t k = 0; k < count; ++k) creates = creates || creates_state(vars[k]);
    const bool may_skip = (pre_pass && hyper_.check_finite != 0) || scalars.lr != nullptr ||
                          scalars.step != nullptr || scalars.grad_scale != nullptr;
    if (creates && may_skip && skipped(ctx, s.stream, state)) return;

    for (std::size_t k = 0; k < count; ++k) prepare(ctx, s.stream, k, vars[k], dp[k]);

    // Pass 2: the update.
    double* update_partial = node_.fused && !pre_pass ? partial : nullptr;
    for (const launch_group& g : groups) {
      const optim_tensor_list list = make_list(table, g, dp, state_type);
      check(ctx,
            kernels::optim_update(hyper_.algo, list, state, update_partial,
                                  static_cast<std::int64_t>(g.chunk_begin), s.stream),
            "optimizer update");
    }
    if (node_.fused && !pre_pass) {
      check(ctx,
            kernels::optim_finalize(partial, static_cast<std::int64_t>(table.size()), hyper_, state,
                                    norm_out, found_out, s.stream),
            "optimizer reduction");
    }
    check_launch(ctx, "optimizer update");
  }

 private:
  // lr, step and grad_scale: dtype and shape checked here; values checked here when they
  // are host tensors (with the CPU kernel's messages), else on the device.
  kernels::optim_scalars read_scalars(kernel_context& ctx) const {
    kernels::optim_scalars sc;
    const tensor& lr_t = ctx.input(node_.lr);
    common::apply_rule(ctx, [&] { optimizer_rules::check_scalar_input(lr_t, "lr", node_.lr, dtype::f32); });
    if (on_host(lr_t)) {
      const double lr = *lr_t.data<float>();
      common::apply_rule(ctx, [&] { optimizer_rules::check_lr(lr, node_.lr); });
      sc.lr_value = *lr_t.data<float>();
    } else {
      sc.lr = lr_t.data<float>();
    }
    if (node_.algo != algorithm::sgd) {
      const tensor& step_t = ctx.input(node_.step);
      common::apply_rule(ctx, [&] {
        optimizer_rules::check_scalar_input(step_t, "step", node_.step, dtype::i64);
      });
      if (on_host(step_t)) {
        const std::int64_t step = *step_t.data<std::int64_t>();
        common::apply_rule(ctx, [&] { optimizer_rules::check_step(step, node_.step); });
        sc.step_value = step;
      } else {
        sc.step = step_t.data<std::int64_t>();
      }
    }
    if (node_.fused) {
      const tensor& st = ctx.input(node_.scale);
      common::apply_rule(ctx, [&] {
        optimizer_rules::check_scalar_input(st, "grad_scale", node_.scale, dtype::f32);
      });
      if (on_host(st)) {
        const float v = *st.data<float>();
        common::apply_rule(ctx, [&] { optimizer_rules::check_grad_scale(v, node_.scale); });
        sc.grad_scale_value = v;
      } else {
        sc.grad_scale = st.data<float>();
      }
    }
    return sc;
  }

  // Waits for the prologue and the reduction and reads whether the step is skipped (Note
  // [cuda optimizer steps]: only before creating state). Invalid scalars fail here.
  bool skipped(kernel_context& ctx, cudaStream_t stream,
               const kernels::optim_step_state* state) const {
    kernels::optim_step_state host{};
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&host, state, sizeof(host), cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (host.bad_input != 0) {
      ctx.fail(
          "lr (input {}), step or grad_scale is invalid: lr must be finite and >= 0, "
          "step >= 1, grad_scale finite and > 0",
          node_.lr);
    }
    return host.skip != 0;
  }

  // Parameter k's buffers, writable, its missing state created (Note [optimizer state]).
  void prepare(kernel_context& ctx, cudaStream_t stream, std::size_t k,
               const optim::param_variables& v, device_param& out) const {
    const param_info& p = node_.params[k];
    auto& var = *v.param;
    make_writable(ctx, var);
    out.param = var.value.raw_data();
    out.param_type = optim_type_of(p.type);
    if (v.master != nullptr) {
      auto& m = *v.master;
      if (!m.value.defined()) {
        m.value = new_tensor(ctx, dtype::f32, p.shape);
        check(ctx,
              kernels::optim_widen(var.value.raw_data(), out.param_type, m.value.data<float>(),
                                   m.value.num_elements(), stream),
              "optimizer master copy");
      } else {
        make_writable(ctx, m);
      }
      out.master = m.value.data<float>();
    }
    if (v.momentum != nullptr) {
      out.first = prepare_moment(ctx, stream, p, *v.momentum, node_.moment_type);
      out.state0 = v.momentum->value.raw_data();
    }
    if (v.adam_m != nullptr) {
      (void)prepare_moment(ctx, stream, p, *v.adam_m, node_.moment_type);
      (void)prepare_moment(ctx, stream, p, *v.adam_v, node_.moment_type);
      out.state0 = v.adam_m->value.raw_data();
      out.state1 = v.adam_v->value.raw_data();
    }
  }

  optim::optimizer_node node_;
  kernels::optim_hyper hyper_;
};

template <algorithm A, bool Fused>
class optimizer_kernel_of final : public optimizer_kernel {
 public:
  explicit optimizer_kernel_of(const kernel_construction& c) : optimizer_kernel(c, A, Fused) {}
};

}  // namespace

std::vector<launch_group> group_chunks(const std::vector<tensor_chunk>& table, int max_tensors,
                                       std::size_t max_chunks) {
  if (max_tensors < 1 || max_chunks < 1) {
    throw invalid_argument("group_chunks: a launch must take at least one tensor and chunk");
  }
  std::vector<launch_group> groups;
  std::size_t i = 0;
  while (i < table.size()) {
    launch_group g{i, i};
    int tensors = 0;
    std::int32_t last = -1;
    while (g.chunk_end < table.size() && g.chunk_end - g.chunk_begin < max_chunks) {
      const std::int32_t t = table[g.chunk_end].tensor;
      if (t != last) {
        if (tensors == max_tensors) break;
        ++tensors;
        last = t;
      }
      ++g.chunk_end;
    }
    groups.push_back(g);
    i = g.chunk_end;
  }
  return groups;
}

void register_optimizer_kernels(kernel_registry& registry) {
  constexpr device_type gpu = device_type::cuda;
  registry.add(
      make_kernel_def<optimizer_kernel_of<algorithm::sgd, false>>("apply_sgd", gpu, {}, "cuda"));
  registry.add(
      make_kernel_def<optimizer_kernel_of<algorithm::adam, false>>("apply_adam", gpu, {}, "cuda"));
  registry.add(make_kernel_def<optimizer_kernel_of<algorithm::adamw, false>>("apply_adamw", gpu, {},
                                                                             "cuda"));
  registry.add(make_kernel_def<optimizer_kernel_of<algorithm::sgd, true>>("fused_sgd", gpu, {},
                                                                          "multi_tensor"));
  registry.add(make_kernel_def<optimizer_kernel_of<algorithm::adam, true>>("fused_adam", gpu, {},
                                                                           "multi_tensor"));
  registry.add(make_kernel_def<optimizer_kernel_of<algorithm::adamw, true>>("fused_adamw", gpu, {},
                                                                            "multi_tensor"));
}

}  // namespace loom::cuda
