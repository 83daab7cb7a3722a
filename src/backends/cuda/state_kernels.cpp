// CUDA kernels of the state ops (placeholder, _arg, const, variable, assign, assign_add,
// assign_sub, identity, no_op) and the transfer ops (_send, _recv). Their semantics are the
// CPU kernels' (src/backends/cpu/state_kernels.cpp); values live in device memory and every
// copy is ordered on the device's streams (Note [cuda stream group]).
#include <fmt/format.h>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernels/update.cuh"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;

std::vector<dtype> all_types() {
  return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,   dtype::i32,
          dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
}

class placeholder_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    ctx.fail("placeholder '{}' needs a feed ({}{})", ctx.node().name,
             to_string(ctx.node().attr<dtype>("dtype")),
             to_string(ctx.node().attr<shape>("shape")));
  }
};

// The value is copied to the device once, when the kernel is made.
class const_kernel final : public op_kernel {
 public:
  explicit const_kernel(const kernel_construction& c)
      : op_kernel(c), value_(c.device().copy_from_host(c.attr<tensor>("value"))) {}
  void compute(kernel_context& ctx) override { ctx.set_output(0, value_); }

 private:
  tensor value_;
};

class variable_kernel final : public op_kernel {
 public:
  explicit variable_kernel(const kernel_construction& c)
      : op_kernel(c), initial_(c.attr<tensor>("initial_value")) {}
  void compute(kernel_context& ctx) override {
    auto& var = ctx.variables().get(ctx.node().name);
    const std::lock_guard lock(var.mutex);
    if (!var.value.defined()) {
      if (!initial_.defined()) {
        ctx.fail("variable '{}' is read before it is assigned (it has no initial value)",
                 ctx.node().name);
      }
      var.value = ctx.device().copy_from_host(initial_);
    } else if (var.value.device() != ctx.device().id()) {
      // A value set elsewhere (a checkpoint restored on the host) moves here on first read.
      var.value = ctx.device().copy_from_host(var.value);
    }
    ctx.set_output(0, var.value);
  }

 private:
  tensor initial_;
};

enum class update { set, add, sub };

std::string variable_name_of(const kernel_construction& c) {
  if (c.node().op() == "assign") return c.attr<std::string>("variable");
  if (c.graph() == nullptr) c.fail("an update needs the graph to find its variable");
  const node& src = c.graph()->at(c.node().inputs.at(0).node);
  if (src.op() != "variable") {
    c.fail("input 0 must come from a variable, not from " + src.describe());
  }
  return src.name;
}

kernels::update_type update_type_of(kernel_context& ctx, dtype t) {
  switch (t) {
    case dtype::f32:
      return kernels::update_type::f32;
    case dtype::f64:
      return kernels::update_type::f64;
    case dtype::f16:
      return kernels::update_type::f16;
    case dtype::bf16:
      return kernels::update_type::bf16;
    case dtype::i32:
      return kernels::update_type::i32;
    case dtype::i64:
      return kernels::update_type::i64;
    default:
      ctx.fail("no in-place update for dtype {}", to_string(t));
  }
}

template <update U>
class update_kernel final : public op_kernel {
 public:
  explicit update_kernel(const kernel_construction& c)
      : op_kernel(c), variable_(variable_name_of(c)) {
    const loom::node* v = c.graph()->find(variable_);
    if (v == nullptr || v->op() != "variable") {
      c.fail("it names variable '" + variable_ + "', which is not a variable of the graph");
    }
    shape_ = v->attr<shape>("shape");
  }
  void compute(kernel_context& ctx) override {
    launch_scope scope(ctx);
    auto& var = ctx.variables().get(variable_);
    constexpr std::size_t value_input = U == update::set ? 0 : 1;
    const tensor& value = ctx.input(value_input);
    const std::lock_guard lock(var.mutex);
    if (U != update::set && !var.value.defined()) {
      ctx.fail("variable '{}' is updated before it is assigned", variable_);
    }
    if (value.shape() != shape_) {
      ctx.fail("value {} does not fit variable '{}' of shape {}", value.describe(), variable_,
               to_string(shape_));
    }
    if constexpr (U != update::set) (void)ctx.take_input(0);
    const bool writable = var.value.defined() && var.value.device() == ctx.device().id() &&
                          var.value.buf()->writable_in_place() &&
                          var.value.shape() == value.shape();
    const tensor src = ctx.input_contiguous(value_input);
    if (U == update::set) {
      if (!writable) var.value = ctx.device().allocate(value.type(), value.shape());
      LOOM_CUDA_CHECK(cudaMemcpyAsync(var.value.raw_data(), src.raw_data(), src.nbytes(),
                                      cudaMemcpyDeviceToDevice, scope.stream));
    } else {
      if (!writable) {
        var.value = var.value.device() == ctx.device().id()
                        ? ctx.device().contiguous_copy(var.value)
                        : ctx.device().copy_from_host(var.value);
      }
      LOOM_CUDA_CHECK(kernels::update(update_type_of(ctx, value.type()), var.value.raw_data(),
                                      src.raw_data(), src.num_elements(), U == update::sub,
                                      scope.stream));
    }
    ctx.set_output(0, var.value);
  }

 private:
  std::string variable_;
  shape shape_;
};

class identity_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override { ctx.set_output(0, ctx.input(0)); }
};

class no_op_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& /*ctx*/) override {}
};

// The sending side of a transfer off the GPU: to a host device, the value is copied into
// pinned host memory here (the CPU cannot reach device memory; the host side then takes
// the tensor as it is); to another GPU, the receiver copies (peer to peer).
class send_kernel final : public op_kernel {
 public:
  explicit send_kernel(const kernel_construction& c)
      : op_kernel(c),
        to_host_(is_host_accessible(parse_device_id(c.attr<std::string>("recv_device")).type)) {}
  void compute(kernel_context& ctx) override {
    if (!to_host_) {
      ctx.set_output(0, ctx.input(0));
      return;
    }
    cuda_device& dev = device_of(ctx);
    ctx.set_output(0, dev.copy_to_host(ctx.input(0), dev.pinned_host()));
  }
  bool is_cheap() const noexcept override { return false; }

 private:
  bool to_host_;
};

// The receiving side on the GPU: from the host (h2d stream) or from another GPU (d2d).
class recv_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    if (in.device() == ctx.device().id()) {
      ctx.set_output(0, in);
      return;
    }
    ctx.set_output(0, ctx.device().copy_from_host(in));
  }
  bool is_cheap() const noexcept override { return false; }
};

}  // namespace

void register_state_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types(), "dtype");
  r.add(make_kernel_def<placeholder_kernel>("placeholder", gpu, any, "cuda"));
  r.add(make_kernel_def<placeholder_kernel>("_arg", gpu, any, "cuda"));
  r.add(make_kernel_def<const_kernel>("const", gpu, any, "cuda"));
  r.add(make_kernel_def<variable_kernel>("variable", gpu, any, "cuda"));
  r.add(make_kernel_def<update_kernel<update::set>>("assign", gpu, type_constraint(all_types()),
                                                    "cuda"));
  const auto numeric =
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64});
  r.add(make_kernel_def<update_kernel<update::add>>("assign_add", gpu, numeric, "cuda"));
  r.add(make_kernel_def<update_kernel<update::sub>>("assign_sub", gpu, numeric, "cuda"));
  r.add(make_kernel_def<identity_kernel>("identity", gpu, type_constraint(all_types()), "cuda"));
  r.add(make_kernel_def<no_op_kernel>("no_op", gpu, {}, "cuda"));
}

void register_transfer_kernels(kernel_registry& r) {
  r.add(make_kernel_def<send_kernel>("_send", gpu, type_constraint(all_types()), "cuda"));
  r.add(make_kernel_def<recv_kernel>("_recv", gpu, type_constraint(all_types()), "cuda"));
}

}  // namespace loom::cuda
