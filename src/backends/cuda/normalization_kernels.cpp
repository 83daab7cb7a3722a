// The normalization family's CUDA kernels: layer_norm and layer_norm_grad (device code in
// kernels/layer_norm.cu; Note [cuda layer_norm]) and batch_norm (kernels/batch_norm.cu). Semantics are the CPU kernels'
// (src/backends/cpu/normalization_kernels.cpp); output shapes and argument checks are the
// rules both call (loom/graph/ops/normalization_rules.hpp). Every check on shapes and
// attributes runs before the first CUDA call, so a bad node fails alike on both devices.
#include <fmt/format.h>

#include <limits>

#include "cuda_kernels.hpp"
#include "kernel/common/normalization_helpers.hpp"
#include "kernels/batch_norm.cuh"
#include "kernels/layer_norm.cuh"
#include "reduction_common.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;
using namespace reduction;

// ---- layer_norm ---------------------------------------------------------------------------

class layer_norm_kernel final : public common::layer_norm_kernel_base {
 public:
  explicit layer_norm_kernel(const kernel_construction& c)
      : layer_norm_kernel_base(c), eps_(c.attr<double>("epsilon")) {}

  void compute(kernel_context& ctx) override {
    const dtype t = ctx.input(0).type();
    const normalization_rules::layer_norm_geometry g = forward_geometry(ctx);
    if (!kernels::layer_norm_supports(elem_of(t))) {
      ctx.fail("layer_norm has no kernel for {}", to_string(t));
    }
    launch_scope scope(ctx);
    const common::layer_norm_tensors io(ctx, g);
    if (g.rows == 0) return;
    if (g.n == 0) {  // the mean of nothing
      fill(ctx, scope, io.mean, std::numeric_limits<double>::quiet_NaN());
      fill(ctx, scope, io.rstd, std::numeric_limits<double>::quiet_NaN());
      return;
    }
    kernels::launch_layer_norm(elem_of(t), io.x.raw_data(), io.gamma.raw_data(),
                               io.beta.raw_data(), io.y.raw_data(), io.mean.raw_data(),
                               io.rstd.raw_data(), g.rows, g.n, eps_, scope.stream);
    check_launch(ctx, "layer_norm");
  }

 private:
  double eps_;
};

class layer_norm_grad_kernel final : public common::layer_norm_kernel_base {
 public:
  using layer_norm_kernel_base::layer_norm_kernel_base;

  void compute(kernel_context& ctx) override {
    const dtype t = ctx.input(1).type();
    const normalization_rules::layer_norm_geometry g = backward_geometry(ctx);
    if (!kernels::layer_norm_supports(elem_of(t))) {
      ctx.fail("layer_norm_grad has no kernel for {}", to_string(t));
    }
    launch_scope scope(ctx);
    const common::layer_norm_grad_tensors io(ctx, g);
    if (g.rows == 0 || g.n == 0) {  // sums over no rows: zeros
      fill(ctx, scope, io.dgamma, 0.0);
      fill(ctx, scope, io.dbeta, 0.0);
      return;
    }
    const std::size_t temp_bytes = kernels::layer_norm_grad_temp_bytes(elem_of(t), g.rows, g.n);
    tensor temp = ctx.allocate_temp(dtype::u8, shape{static_cast<std::int64_t>(temp_bytes)});
    kernels::launch_layer_norm_grad(elem_of(t), io.dy.raw_data(), io.x.raw_data(),
                                    io.gamma.raw_data(), io.mean.raw_data(), io.rstd.raw_data(),
                                    io.dx.raw_data(), io.dgamma.raw_data(), io.dbeta.raw_data(),
                                    temp.raw_data(), g.rows, g.n, scope.stream);
    check_launch(ctx, "layer_norm_grad");
  }
};

// ---- batch_norm ---------------------------------------------------------------------------

class batch_norm_kernel final : public op_kernel {
 public:
  explicit batch_norm_kernel(const kernel_construction& c)
      : op_kernel(c), eps_(c.attr<double>("epsilon")) {}

  void compute(kernel_context& ctx) override {
    const dtype t = ctx.input(0).type();
    const normalization_rules::batch_norm_geometry g = common::batch_norm_geometry(ctx);
    if (!kernels::batch_norm_supports(elem_of(t))) {
      ctx.fail("batch_norm has no kernel for {}", to_string(t));
    }
    launch_scope scope(ctx);
    const common::batch_norm_tensors io(ctx);
    if (io.x.num_elements() == 0) return;
    kernels::launch_batch_norm(elem_of(t), io.x.raw_data(), io.scale.raw_data(),
                               io.bias.raw_data(), io.mean.raw_data(), io.var.raw_data(),
                               io.y.raw_data(), g.outer, g.channels, g.inner, eps_, scope.stream);
    check_launch(ctx, "batch_norm");
  }

 private:
  double eps_;
};

}  // namespace

// normalization_train_kernels.cpp
void register_batch_norm_train_kernels(kernel_registry& registry);

void register_normalization_kernels(kernel_registry& r) {
  register_batch_norm_train_kernels(r);
  r.add(make_kernel_def<batch_norm_kernel>("batch_norm", gpu, "cuda"));
  r.add(make_kernel_def<layer_norm_kernel>("layer_norm", gpu, "cuda"));
  r.add(make_kernel_def<layer_norm_grad_kernel>("layer_norm_grad", gpu, "cuda"));
}

}  // namespace loom::cuda
