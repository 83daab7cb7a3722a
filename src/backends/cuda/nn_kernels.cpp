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
#include "kernels/bias_add.cuh"

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
        nchw_(c.attr<std::string>("data_format") == "NCHW"),
        type_(c.attr<dtype>("T")) {}

  void compute(kernel_context& ctx) override {
    const shape s = ctx.input(0).shape();
    const tensor& bias_in = ctx.input(1);
    if (s.rank() < 2 || bias_in.rank() != 1) {
      ctx.fail("bias_add needs an input of rank >= 2 and a bias of rank 1, got {} and {}",
               ctx.input(0).describe(), bias_in.describe());
    }
    const std::size_t axis = nchw_ ? 1 : s.rank() - 1;
    const std::int64_t channels = s[axis];
    if (bias_in.dim(0) != channels) {
      ctx.fail("bias {} does not match the {} channels of input {}", bias_in.describe(), channels,
               ctx.input(0).describe());
    }
    if (!kernels::bias_add_supports(elem_of(type_))) {
      ctx.fail("bias_add has no kernel for {}", to_string(type_));
    }
    launch_scope scope(ctx);
    // Output first, so that a contiguous input held by this node alone is written in place.
    tensor& out = ctx.forward_input_or_allocate_output(0, 0, s);
    if (out.num_elements() == 0) return;
    const tensor x = ctx.input_contiguous(0);
    const tensor bias = ctx.input_contiguous(1);
    std::int64_t inner = 1;
    if (nchw_) {
      for (std::size_t i = 2; i < s.rank(); ++i) inner *= s[i];
    }
    kernels::launch_bias_add(elem_of(type_), x.raw_data(), bias.raw_data(), out.raw_data(),
                             s.num_elements(), channels, inner, scope.stream);
    check_launch(ctx, "bias_add");
  }

 private:
  bool nchw_;
  dtype type_;
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
