// CUDA kernels of the state ops (const, assign, assign_add, assign_sub) and the sending side
// of a transfer (_send). Their semantics are the CPU kernels'
// (src/backends/cpu/state_kernels.cpp); variable and the updates' checks are shared with it
// (src/kernel/common/variable_kernels.hpp). Values live in device memory and every copy is
// ordered on the device's streams (Note [cuda stream group]). placeholder, _arg, identity,
// no_op and _recv are the same on every device and registered once for each
// (src/kernel/common/neutral_kernels.cpp).
#include <fmt/format.h>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/variable_kernels.hpp"
#include "kernels/update.cuh"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;

// The value is copied to the device once, when the kernel is made.
class const_kernel final : public op_kernel {
 public:
  explicit const_kernel(const kernel_construction& c)
      : op_kernel(c), value_(c.device().copy_from_host(c.attr<tensor>("value"))) {}
  void compute(kernel_context& ctx) override { ctx.set_output(0, value_); }

 private:
  tensor value_;
};

enum class update { set, add, sub };

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
  explicit update_kernel(const kernel_construction& c) : op_kernel(c), target_(c) {}
  void compute(kernel_context& ctx) override {
    launch_scope scope(ctx);
    auto& var = ctx.variables().get(target_.name);
    constexpr std::size_t value_input = U == update::set ? 0 : 1;
    const tensor& value = ctx.input(value_input);
    const std::lock_guard lock(var.mutex);
    target_.check(ctx, var, value, U != update::set);
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
  common::update_target target_;
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

}  // namespace

void register_state_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types(), "dtype");
  r.add(make_kernel_def<const_kernel>("const", gpu, any, "cuda"));
  r.add(make_kernel_def<common::variable_kernel<true>>("variable", gpu, any, "cuda"));
  r.add(make_kernel_def<update_kernel<update::set>>("assign", gpu, type_constraint(all_types()),
                                                    "cuda"));
  const auto numeric =
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64});
  r.add(make_kernel_def<update_kernel<update::add>>("assign_add", gpu, numeric, "cuda"));
  r.add(make_kernel_def<update_kernel<update::sub>>("assign_sub", gpu, numeric, "cuda"));
}

void register_transfer_kernels(kernel_registry& r) {
  r.add(make_kernel_def<send_kernel>("_send", gpu, type_constraint(all_types()), "cuda"));
}

}  // namespace loom::cuda
