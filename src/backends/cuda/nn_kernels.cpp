// CUDA kernels of layer_norm, layer_norm_grad (device code in kernels/layer_norm.cu; Note
// [cuda layer_norm]) and bias_add (kernels/bias_add.cu). Semantics, output shapes and
// argument checks are the CPU kernels' (src/backends/cpu/nn_layer_norm.cpp, nn_kernels.cpp),
// with the same messages; every check on shapes and attributes runs before the first CUDA
// call, so a bad node fails alike on both devices. bias_add's gradient is a reduce_sum
// (reduction_kernels.cpp).
#include <fmt/format.h>

#include <limits>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/rule_check.hpp"
#include "kernels/bias_add.cuh"
#include "kernels/layer_norm.cuh"
#include "kernels/reduction.cuh"
#include "loom/graph/ops/nn_rules.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;

kernels::elem_type elem_of(dtype t) {
  static_assert(static_cast<int>(kernels::elem_type::bf16) == static_cast<int>(dtype::bf16) &&
                static_cast<int>(kernels::elem_type::u8) == static_cast<int>(dtype::u8));
  return static_cast<kernels::elem_type>(static_cast<int>(t));
}

std::size_t normalize_axis(const kernel_context& ctx, std::int64_t axis, const shape& s) {
  const auto r = static_cast<std::int64_t>(s.rank());
  if (axis < -r || axis >= r) {
    ctx.fail("axis {} is out of range for input of shape {}", axis, to_string(s));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}

/// Input i as a dense tensor: the input itself when contiguous (so forwarding its buffer
/// stays possible), else a copy on the device in `hold`.
const tensor& dense_input(kernel_context& ctx, std::size_t i, tensor& hold) {
  const tensor& in = ctx.input(i);
  if (in.is_contiguous()) return in;
  hold = ctx.input_contiguous(i);
  return hold;
}

void split_dims(const shape& s, std::size_t axis, shape& lead, shape& normalized) {
  for (std::size_t k = 0; k < s.rank(); ++k) (k < axis ? lead : normalized).push_back(s[k]);
}

/// Fills the dense floating-point tensor t with v (0 or NaN) on the compute stream.
void fill_float(kernel_context& ctx, const launch_scope& scope, tensor& t, bool nan) {
  if (t.num_elements() == 0) return;
  std::uint64_t bits = 0;  // +0.0 in every float type
  if (nan) {
    switch (t.type()) {
      case dtype::f64:
        bits = 0x7ff8000000000000ull;
        break;
      case dtype::f32:
        bits = 0x7fc00000u;
        break;
      case dtype::f16:
        bits = 0x7e00u;
        break;
      default:
        bits = 0x7fc0u;
        break;  // bf16
    }
  }
  kernels::launch_fill(t.raw_data(), t.num_elements(), static_cast<int>(size_of(t.type())), bits,
                       scope.stream);
  check_launch(ctx, "fill");
}

// ---- layer_norm ---------------------------------------------------------------------------

class layer_norm_kernel final : public op_kernel {
 public:
  explicit layer_norm_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")), eps_(c.attr<double>("epsilon")) {}

  void compute(kernel_context& ctx) override {
    const shape s = ctx.input(0).shape();
    const dtype t = ctx.input(0).type();
    const shape& gs = ctx.input(1).shape();
    const shape& bs = ctx.input(2).shape();
    const std::size_t axis = normalize_axis(ctx, axis_, s);
    shape lead;
    shape normalized;
    split_dims(s, axis, lead, normalized);
    if (gs != normalized || bs != normalized) {
      ctx.fail("gamma {} and beta {} must both have shape x.shape[{}:] = {} (x is {})",
               to_string(gs), to_string(bs), axis, to_string(normalized), to_string(s));
    }
    if (!kernels::layer_norm_supports(elem_of(t))) {
      ctx.fail("layer_norm has no kernel for {}", to_string(t));
    }
    const std::int64_t rows = lead.num_elements();
    const std::int64_t n = normalized.num_elements();
    launch_scope scope(ctx);
    tensor hold_x;
    tensor hold_g;
    tensor hold_b;
    const tensor& x = dense_input(ctx, 0, hold_x);
    const tensor& gamma = dense_input(ctx, 1, hold_g);
    const tensor& beta = dense_input(ctx, 2, hold_b);
    tensor& y = ctx.forward_input_or_allocate_output(0, 0, s);
    tensor& mean = ctx.allocate_output(1, lead);
    tensor& rstd = ctx.allocate_output(2, lead);
    if (rows == 0) return;
    if (n == 0) {  // the mean of nothing
      fill_float(ctx, scope, mean, true);
      fill_float(ctx, scope, rstd, true);
      return;
    }
    kernels::launch_layer_norm(elem_of(t), x.raw_data(), gamma.raw_data(), beta.raw_data(),
                               y.raw_data(), mean.raw_data(), rstd.raw_data(), rows, n, eps_,
                               scope.stream);
    check_launch(ctx, "layer_norm");
  }

 private:
  std::int64_t axis_;
  double eps_;
};

class layer_norm_grad_kernel final : public op_kernel {
 public:
  explicit layer_norm_grad_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const shape& dys = ctx.input(0).shape();
    const shape s = ctx.input(1).shape();
    const dtype t = ctx.input(1).type();
    const shape& gs = ctx.input(2).shape();
    const shape& ms = ctx.input(3).shape();
    const shape& rs = ctx.input(4).shape();
    const std::size_t axis = normalize_axis(ctx, axis_, s);
    shape lead;
    shape normalized;
    split_dims(s, axis, lead, normalized);
    if (dys != s) {
      ctx.fail("dy of shape {} does not match x of shape {}", to_string(dys), to_string(s));
    }
    if (gs != normalized) {
      ctx.fail("gamma of shape {} does not match x.shape[{}:] = {} (x is {})", to_string(gs), axis,
               to_string(normalized), to_string(s));
    }
    if (ms != lead || rs != lead) {
      ctx.fail("mean {} and rstd {} must both have shape x.shape[:{}] = {} (x is {})",
               to_string(ms), to_string(rs), axis, to_string(lead), to_string(s));
    }
    if (!kernels::layer_norm_supports(elem_of(t))) {
      ctx.fail("layer_norm_grad has no kernel for {}", to_string(t));
    }
    const std::int64_t rows = lead.num_elements();
    const std::int64_t n = normalized.num_elements();
    launch_scope scope(ctx);
    tensor hold[5];
    const tensor& dy = dense_input(ctx, 0, hold[0]);
    const tensor& x = dense_input(ctx, 1, hold[1]);
    const tensor& gamma = dense_input(ctx, 2, hold[2]);
    const tensor& mean = dense_input(ctx, 3, hold[3]);
    const tensor& rstd = dense_input(ctx, 4, hold[4]);
    tensor& dx = ctx.forward_input_or_allocate_output(0, 0, s);
    tensor& dgamma = ctx.allocate_output(1, normalized);
    tensor& dbeta = ctx.allocate_output(2, normalized);
    if (rows == 0 || n == 0) {  // sums over no rows: zeros
      fill_float(ctx, scope, dgamma, false);
      fill_float(ctx, scope, dbeta, false);
      return;
    }
    const std::size_t temp_bytes = kernels::layer_norm_grad_temp_bytes(elem_of(t), rows, n);
    tensor temp = ctx.allocate_temp(dtype::u8, shape{static_cast<std::int64_t>(temp_bytes)});
    kernels::launch_layer_norm_grad(
        elem_of(t), dy.raw_data(), x.raw_data(), gamma.raw_data(), mean.raw_data(), rstd.raw_data(),
        dx.raw_data(), dgamma.raw_data(), dbeta.raw_data(), temp.raw_data(), rows, n, scope.stream);
    check_launch(ctx, "layer_norm_grad");
  }

 private:
  std::int64_t axis_;
};

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
    const nn_rules::bias_add_geometry g = check_rule(
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
  const std::vector<dtype> floats{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
  r.add(make_kernel_def<layer_norm_kernel>("layer_norm", gpu, type_constraint(floats), "cuda"));
  r.add(make_kernel_def<layer_norm_grad_kernel>("layer_norm_grad", gpu, type_constraint(floats),
                                                "cuda"));
  r.add(make_kernel_def<bias_add_kernel>(
      "bias_add", gpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                       dtype::i8, dtype::u8}),
      "cuda"));
}

}  // namespace loom::cuda
