// CPU kernels of the state ops: const, assign, assign_add, assign_sub, and the sending side
// of a transfer (_send); variable is the kernel every backend shares, and the updates' checks
// are shared with the CUDA backend (src/kernel/common/variable_kernels.hpp). placeholder,
// _arg, identity, no_op and _recv are the same on every device and registered once for each
// (src/kernel/common/neutral_kernels.cpp).
#include <cstring>
#include <mutex>

#include "cpu_kernels.hpp"
#include "kernel/common/neutral_kernels.hpp"
#include "kernel/common/variable_kernels.hpp"
#include "loom/kernel/variable_store.hpp"
#include "loom/memory/tensor_allocation.hpp"

namespace loom::cpu {
namespace {

constexpr device_type cpu = device_type::cpu;

// The value is copied to the device once, when the kernel is made.
class const_kernel final : public op_kernel {
 public:
  explicit const_kernel(const kernel_construction& c) : op_kernel(c) {
    const tensor v = c.attr<tensor>("value");
    value_ = v.device() == c.device().id() && v.is_contiguous() ? v : c.device().copy_from_host(v);
  }
  void compute(kernel_context& ctx) override { ctx.set_output(0, value_); }

 private:
  tensor value_;
};

enum class update { set, add, sub };

template <class T>
void apply(update u, T* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      const float a = static_cast<float>(dst[i]);
      const float b = static_cast<float>(src[i]);
      dst[i] = T(u == update::add ? a + b : a - b);
    } else if constexpr (!std::is_same_v<T, bool>) {
      dst[i] = static_cast<T>(u == update::add ? dst[i] + src[i] : dst[i] - src[i]);
    }
  }
}

template <update U>
class update_kernel final : public op_kernel {
 public:
  explicit update_kernel(const kernel_construction& c) : op_kernel(c), target_(c) {}
  void compute(kernel_context& ctx) override {
    auto& var = ctx.variables().get(target_.name);
    constexpr std::size_t value_input = U == update::set ? 0 : 1;
    const tensor& value = ctx.input(value_input);
    std::lock_guard lock(var.mutex);
    target_.check(ctx, var, value, U != update::set);
    // The variable's own buffer is updated in place when no read still holds it (the value
    // read as input 0 by this node is dropped first); otherwise the variable gets a new one.
    if (U == update::set) {
      const bool writable = var.value.defined() && var.value.buf()->writable_in_place() &&
                            var.value.shape() == value.shape();
      if (!writable) {
        var.value = memory::allocate_tensor(ctx.device().allocator(), ctx.device().id(),
                                            value.type(), value.shape());
      }
      copy_to_dense(value, var.value.raw_data());
    } else {
      (void)common::writable_value(ctx, var, 0);
      const tensor src = ctx.input_contiguous(value_input);
      visit_dtype(value.type(), [&](auto tag) {
        using T = decltype(tag);
        apply<T>(U, var.value.template data<T>(), src.template data<T>(), src.num_elements());
      });
    }
    ctx.set_output(0, var.value);
  }

 private:
  common::update_target target_;
};

}  // namespace

void register_state_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types(), "dtype");
  r.add(make_kernel_def<const_kernel>("const", cpu, any));
  r.add(make_kernel_def<common::variable_kernel<false>>("variable", cpu, any));
  r.add(make_kernel_def<update_kernel<update::set>>("assign", cpu, type_constraint(all_types())));
  const auto numeric =
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64});
  r.add(make_kernel_def<update_kernel<update::add>>("assign_add", cpu, numeric));
  r.add(make_kernel_def<update_kernel<update::sub>>("assign_sub", cpu, numeric));
}

void register_transfer_kernels(kernel_registry& r) {
  // The copy happens on the receiving side (_recv, a kernel every device shares): the
  // tensor, wherever it lives, becomes a new buffer from the receiving device's allocator.
  r.add(make_kernel_def<common::identity_kernel>("_send", cpu, type_constraint(all_types())));
}

}  // namespace loom::cpu
