// CUDA kernels of the optimizers: apply_sgd, apply_adam, apply_adamw (one parameter) and
// fused_sgd, fused_adam, fused_adamw (any number of parameters of mixed dtypes), with the
// semantics of the CPU kernels (src/backends/cpu/optimizer_kernels.cpp): the same checks and
// messages, the same state variables (Note [optimizer state], shared code in
// backends/cpu/optimizer_state.hpp), the same element math rounded the same way.
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

#include "backends/cpu/optimizer_state.hpp"
#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernels/optimizer.cuh"
#include "loom/kernel/multi_tensor_apply.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"
#include "optimizer_launches.hpp"

namespace loom::cuda {
namespace {

using cpu::optim::algorithm;
using cpu::optim::param_info;
using kernels::optim_algorithm;
using kernels::optim_tensor_list;
using kernels::optim_type;

static_assert(kernels::optim_chunk_elements == multi_tensor_chunk_elements,
              "one chunk per block: the chunk table is loom's");

bool is_float_storage(dtype t) {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

optim_type optim_type_of(dtype t) {
  switch (t) {
    case dtype::f16:
      return optim_type::f16;
    case dtype::bf16:
      return optim_type::bf16;
    default:
      return optim_type::f32;
  }
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
bool creates_state(const cpu::optim::param_variables& v) {
  for (const variable_store::variable* s : {v.momentum, v.adam_m, v.adam_v, v.master}) {
    if (s != nullptr && !s->value.defined()) return true;
  }
  return false;
}

class optimizer_kernel : public op_kernel {
 public:
  optimizer_kernel(const kernel_construction& c, algorithm algo, bool fused)
      : op_kernel(c), algo_(algo), fused_(fused) {
    const loom::node& n = c.node();
    hyper_.algo = algo == algorithm::sgd    ? optim_algorithm::sgd
                  : algo == algorithm::adam ? optim_algorithm::adam
                                            : optim_algorithm::adamw;
    if (algo == algorithm::sgd) {
      hyper_.momentum = c.attr<double>("momentum");
      hyper_.dampening = c.attr<double>("dampening");
      hyper_.nesterov = c.attr<bool>("nesterov") ? 1 : 0;
    } else {
      hyper_.beta1 = c.attr<double>("beta1");
      hyper_.beta2 = c.attr<double>("beta2");
      hyper_.eps = c.attr<double>("eps");
    }
    hyper_.weight_decay = c.attr<double>("weight_decay");
    moment_type_ = c.attr<dtype>("moment_dtype");
    const bool master_weights = c.attr<bool>("master_weights");
    if (fused) {
      hyper_.max_grad_norm = c.attr<double>("max_grad_norm");
      hyper_.check_finite = c.attr<bool>("check_finite") ? 1 : 0;
    }
    const std::size_t count =
        fused ? static_cast<std::size_t>(c.attr<std::int64_t>("N")) : std::size_t{1};
    grads_ = count;
    lr_ = 2 * count;
    step_ = algo == algorithm::sgd ? lr_ : lr_ + 1;
    scale_ = algo == algorithm::sgd ? lr_ + 1 : lr_ + 2;
    if (c.graph() == nullptr) c.fail("an optimizer needs the graph to find its variables");
    for (std::size_t k = 0; k < count; ++k) {
      const loom::node& src = c.graph()->at(n.inputs.at(k).node);
      const std::string which =
          fused ? fmt::format("params[{}] (input {})", k, k) : "param (input 0)";
      if (src.op() != "variable") {
        c.fail(fmt::format("{} must come from a variable, not from {}", which, src.describe()));
      }
      for (const auto& p : params_) {
        if (p.name == src.name) {
          c.fail(fmt::format("{} updates variable '{}', which an earlier parameter updates too",
                             which, src.name));
        }
      }
      params_.push_back(
          cpu::optim::describe_param(src, algo, hyper_.momentum != 0.0, master_weights));
    }
  }

  void compute(kernel_context& ctx) override {
    const kernels::optim_scalars scalars = read_scalars(ctx);

    // Gradients: dense, of their parameters' shapes.
    const std::size_t count = params_.size();
    std::vector<tensor> grads(count);
    std::vector<std::int64_t> sizes(count);
    for (std::size_t k = 0; k < count; ++k) {
      grads[k] = ctx.input_contiguous(grads_ + k);
      const auto& p = params_[k];
      if (!is_float_storage(grads[k].type())) {
        ctx.fail("{} is {}; gradients must be float32, float16 or bfloat16", grad_name(k),
                 grads[k].describe());
      }
      if (grads[k].shape() != p.shape) {
        ctx.fail("{} has shape {} but parameter '{}' has shape {}", grad_name(k),
                 to_string(grads[k].shape()), p.name, to_string(p.shape));
      }
      sizes[k] = p.shape.num_elements();
    }
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
    if (fused_) {
      norm_out = ctx.allocate_output(0, dtype::f32, shape{}).data<float>();
      found_out = ctx.allocate_output(1, dtype::boolean, shape{}).data<bool>();
    }
    check(ctx, kernels::optim_prologue(hyper_, scalars, state, s.stream), "optimizer prologue");

    // Pass 1 (Note [cuda optimizer steps]).
    const bool pre_pass = fused_ && (hyper_.check_finite != 0 || hyper_.max_grad_norm > 0.0);
    std::vector<device_param> dp(count);
    for (std::size_t k = 0; k < count; ++k) {
      dp[k].grad = grads[k].raw_data();
      dp[k].grad_type = optim_type_of(grads[k].type());
      dp[k].size = sizes[k];
    }
    const optim_type state_type = optim_type_of(moment_type_);
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
    auto& store = ctx.variables();
    std::vector<cpu::optim::param_variables> vars(count);
    std::vector<std::mutex*> mutexes;
    for (std::size_t k = 0; k < count; ++k) {
      vars[k] = cpu::optim::find_variables(store, params_[k]);
      vars[k].add_mutexes(mutexes);
    }
    cpu::optim::ordered_locks locks(std::move(mutexes));
    for (std::size_t k = 0; k < count; ++k) (void)ctx.take_input(k);  // drop our reads
    bool creates = false;
    for (std::size_t k = 0; k < count; ++k) {
      cpu::optim::validate_param(ctx, params_[k], vars[k], moment_type_);
      creates = creates || creates_state(vars[k]);
    }
    const bool may_skip = (pre_pass && hyper_.check_finite != 0) || scalars.lr != nullptr ||
                          scalars.step != nullptr || scalars.grad_scale != nullptr;
    if (creates && may_skip && skipped(ctx, s.stream, state)) return;

    for (std::size_t k = 0; k < count; ++k) prepare(ctx, s.stream, k, vars[k], dp[k]);

    // Pass 2: the update.
    double* update_partial = fused_ && !pre_pass ? partial : nullptr;
    for (const launch_group& g : groups) {
      const optim_tensor_list list = make_list(table, g, dp, state_type);
      check(ctx,
            kernels::optim_update(hyper_.algo, list, state, update_partial,
                                  static_cast<std::int64_t>(g.chunk_begin), s.stream),
            "optimizer update");
    }
    if (fused_ && !pre_pass) {
      check(ctx,
            kernels::optim_finalize(partial, static_cast<std::int64_t>(table.size()), hyper_, state,
                                    norm_out, found_out, s.stream),
            "optimizer reduction");
    }
    check_launch(ctx, "optimizer update");
  }

 private:
  std::string grad_name(std::size_t k) const {
    return fused_ ? fmt::format("grads[{}] (input {})", k, grads_ + k) : "grad (input 1)";
  }

  // lr, step and grad_scale: dtype and shape checked here; values checked here when they
  // are host tensors (with the CPU kernel's messages), else on the device.
  kernels::optim_scalars read_scalars(kernel_context& ctx) const {
    kernels::optim_scalars sc;
    const tensor& lr_t = ctx.input(lr_);
    if (lr_t.num_elements() != 1 || lr_t.type() != dtype::f32) {
      ctx.fail("lr (input {}) must be a float32 scalar, got {}", lr_, lr_t.describe());
    }
    if (on_host(lr_t)) {
      const double lr = *lr_t.data<float>();
      if (!(lr >= 0.0) || !std::isfinite(lr)) {
        ctx.fail("lr (input {}) must be finite and >= 0, got {}", lr_, lr);
      }
      sc.lr_value = *lr_t.data<float>();
    } else {
      sc.lr = lr_t.data<float>();
    }
    if (algo_ != algorithm::sgd) {
      const tensor& step_t = ctx.input(step_);
      if (step_t.num_elements() != 1 || step_t.type() != dtype::i64) {
        ctx.fail("step (input {}) must be an int64 scalar, got {}", step_, step_t.describe());
      }
      if (on_host(step_t)) {
        const std::int64_t step = *step_t.data<std::int64_t>();
        if (step < 1) ctx.fail("step (input {}) is the 1-based step number; got {}", step_, step);
        sc.step_value = step;
      } else {
        sc.step = step_t.data<std::int64_t>();
      }
    }
    if (fused_) {
      const tensor& st = ctx.input(scale_);
      if (st.num_elements() != 1 || st.type() != dtype::f32) {
        ctx.fail("grad_scale (input {}) must be a float32 scalar, got {}", scale_, st.describe());
      }
      if (on_host(st)) {
        const float v = *st.data<float>();
        if (!(v > 0.0f) || !std::isfinite(v)) {
          ctx.fail("grad_scale (input {}) must be finite and > 0, got {}", scale_, v);
        }
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
          lr_);
    }
    return host.skip != 0;
  }

  // Parameter k's buffers, writable, its missing state created (Note [optimizer state]).
  void prepare(kernel_context& ctx, cudaStream_t stream, std::size_t k,
               const cpu::optim::param_variables& v, device_param& out) const {
    const param_info& p = params_[k];
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
      out.first = prepare_moment(ctx, stream, p, *v.momentum, moment_type_);
      out.state0 = v.momentum->value.raw_data();
    }
    if (v.adam_m != nullptr) {
      (void)prepare_moment(ctx, stream, p, *v.adam_m, moment_type_);
      (void)prepare_moment(ctx, stream, p, *v.adam_v, moment_type_);
      out.state0 = v.adam_m->value.raw_data();
      out.state1 = v.adam_v->value.raw_data();
    }
  }

  algorithm algo_;
  bool fused_;
  kernels::optim_hyper hyper_;
  dtype moment_type_ = dtype::f32;
  std::size_t grads_ = 1;  // index of the first gradient input
  std::size_t lr_ = 2;
  std::size_t step_ = 3;
  std::size_t scale_ = 4;
  std::vector<param_info> params_;
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
