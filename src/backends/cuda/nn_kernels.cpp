// CUDA kernel of bias_add (kernels/bias_add.cu). Semantics, output shapes and argument
// checks are the CPU kernel's (src/backends/cpu/nn_kernels.cpp), with the same messages;
// every check on shapes and attributes runs before the first CUDA call, so a bad node fails
// alike on both devices. bias_add's gradient is a reduce_sum (reduction_kernels.cpp).
#include <fmt/format.h>

#include <limits>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/apply_rule.hpp"
#include "kernels/bias_add.cuh"
#include "loom/graph/ops/nn_rules.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;

kernels::elem_type elem_of(dtype t) {
  static_assert(static_cast<int>(kernels::elem_type::bf16) == static_cast<int>(dtype::bf16) &&
                static_cast<int>(kernels::elem_type::u8) == static_cast<int>(dtype::u8));
  return static_cast<kernels::elem_type>(static_cast<int>(t));
}

// ---- bias_add -----------------------------------------------------------------------------

class bias_add_kernel final : public op_kernel {
 public:
  explicit bias_add_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("T")),
        elem_(elem_of(type_)),
        nchw_(nn_rules::is_nchw(c.attr<std::string>("data_format"))) {}

  void compute(kernel_context& ctx) override {
    // Every check before the first CUDA call: the shapes (the op's rule), then the dtype.
    const shape s = ctx.input(0).shape();
    const nn_rules::bias_add_geometry g = common::apply_rule(
        ctx, [&] { return nn_rules::bias_add_geometry_of(ctx.input(0), ctx.input(1), nchw_); });
    if (!kernels::bias_add_supports(elem_)) {
      ctx.fail("bias_add has no kernel for {}", to_string(type_));
    }
    launch_scope scope(ctx);
    // Output first, so that a contiguous input held by this node alone is written in place.
    tensor& out = ctx.forward_input_or_allocate_output(0, 0, s);
    if (out.num_elements() == 0) return;
    const tensor x = ctx.input_contiguous(0);
    const tensor bias = ctx.input_contiguous(1);
    kernels::launch_bias_add(elem_, x.raw_data(), bias.raw_data(), out.raw_data(),
                             out.num_elements(), g.channels, g.inner, scope.stream);
    check_launch(ctx, "bias_add");
  }

 private:
  dtype type_;
  kernels::elem_type elem_;
  bool nchw_;
};

}  // namespace

void register_nn_kernels(kernel_registry& r) {
  r.add(make_kernel_def<bias_add_kernel>(
      "bias_add", gpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                       dtype::i8, dtype::u8}),
      "cuda"));
}

}  // namespace loom::cuda
