// Device-neutral helpers of the normalization family's kernels (layer_norm,
// layer_norm_grad, batch_norm), for every backend: the kernels' base, which holds the node's
// axis and applies loom/graph/ops/normalization_rules.hpp to the inputs' shapes, the dense
// inputs and allocated outputs of each op, and batch_norm's checked geometry.
#pragma once

#include <cstdint>

#include "kernel/common/reduction_helpers.hpp"
#include "loom/graph/ops/normalization_rules.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// Base of the layer_norm and layer_norm_grad kernels: the node's axis (and epsilon, for
/// layer_norm).
class layer_norm_kernel_base : public op_kernel {
 public:
  explicit layer_norm_kernel_base(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

 protected:
  /// layer_norm's geometry over its input x, checking gamma and beta (inputs 1 and 2); a
  /// rule's failure fails the node.
  normalization_rules::layer_norm_geometry forward_geometry(const kernel_context& ctx) const {
    return common::apply_rule(ctx, [&] {
      const shape& x = ctx.input(0).shape();
      auto g = normalization_rules::layer_norm_geometry_of(x, axis_);
      normalization_rules::check_layer_norm_params(g, x, ctx.input(1).shape(),
                                                   ctx.input(2).shape());
      return g;
    });
  }

  /// layer_norm_grad's geometry over its input x (input 1), checking dy, gamma, mean and
  /// rstd (inputs 0, 2, 3, 4).
  normalization_rules::layer_norm_geometry backward_geometry(const kernel_context& ctx) const {
    return common::apply_rule(ctx, [&] {
      const shape& x = ctx.input(1).shape();
      auto g = normalization_rules::layer_norm_geometry_of(x, axis_);
      normalization_rules::check_layer_norm_grad_args(g, x, ctx.input(0).shape(),
                                                      ctx.input(2).shape(), ctx.input(3).shape(),
                                                      ctx.input(4).shape());
      return g;
    });
  }

 private:
  std::int64_t axis_;
};

/// layer_norm's inputs as dense tensors (copies held here where an input is not dense) and
/// its outputs: y (x's buffer when it can be forwarded), mean and rstd. Built in place, once
/// the geometry is checked.
class layer_norm_tensors {
 public:
  layer_norm_tensors(kernel_context& ctx, const normalization_rules::layer_norm_geometry& g)
      : x(dense_input(ctx, 0, hold_[0])),
        gamma(dense_input(ctx, 1, hold_[1])),
        beta(dense_input(ctx, 2, hold_[2])),
        y(ctx.forward_input_or_allocate_output(0, 0, x.shape())),
        mean(ctx.allocate_output(1, g.lead)),
        rstd(ctx.allocate_output(2, g.lead)) {}
  layer_norm_tensors(const layer_norm_tensors&) = delete;
  layer_norm_tensors& operator=(const layer_norm_tensors&) = delete;

 private:
  tensor hold_[3];

 public:
  const tensor& x;
  const tensor& gamma;
  const tensor& beta;
  tensor& y;
  tensor& mean;
  tensor& rstd;
};

/// layer_norm_grad's inputs (dy, x, gamma, mean, rstd) as dense tensors and its outputs: dx
/// (dy's buffer when it can be forwarded), dgamma and dbeta.
class layer_norm_grad_tensors {
 public:
  layer_norm_grad_tensors(kernel_context& ctx, const normalization_rules::layer_norm_geometry& g)
      : dy(dense_input(ctx, 0, hold_[0])),
        x(dense_input(ctx, 1, hold_[1])),
        gamma(dense_input(ctx, 2, hold_[2])),
        mean(dense_input(ctx, 3, hold_[3])),
        rstd(dense_input(ctx, 4, hold_[4])),
        dx(ctx.forward_input_or_allocate_output(0, 0, x.shape())),
        dgamma(ctx.allocate_output(1, g.normalized)),
        dbeta(ctx.allocate_output(2, g.normalized)) {}
  layer_norm_grad_tensors(const layer_norm_grad_tensors&) = delete;
  layer_norm_grad_tensors& operator=(const layer_norm_grad_tensors&) = delete;

 private:
  tensor hold_[5];

 public:
  const tensor& dy;
  const tensor& x;
  const tensor& gamma;
  const tensor& mean;
  const tensor& rstd;
  tensor& dx;
  tensor& dgamma;
  tensor& dbeta;
};

/// batch_norm's geometry over its input x and its four [C] vectors (inputs 1 to 4), channels
/// where the node's data_format puts them; a rule's failure fails the node.
inline normalization_rules::batch_norm_geometry batch_norm_geometry(const kernel_context& ctx) {
  return common::apply_rule(ctx, [&] {
    const shape& x = ctx.input(0).shape();
    return normalization_rules::batch_norm_geometry_of(
        x,
        {&ctx.input(1).shape(), &ctx.input(2).shape(), &ctx.input(3).shape(),
         &ctx.input(4).shape()},
        normalization_rules::batch_norm_channel_axis(
            ctx.node().attr<std::string>("data_format"), x.rank()));
  });
}

/// batch_norm's inputs (x, scale, bias, mean, var) as dense tensors and its output y (x's
/// buffer when it can be forwarded). Built once the geometry is checked.
class batch_norm_tensors {
 public:
  explicit batch_norm_tensors(kernel_context& ctx)
      : x(dense_input(ctx, 0, hold_[0])),
        scale(dense_input(ctx, 1, hold_[1])),
        bias(dense_input(ctx, 2, hold_[2])),
        mean(dense_input(ctx, 3, hold_[3])),
        var(dense_input(ctx, 4, hold_[4])),
        y(ctx.forward_input_or_allocate_output(0, 0, x.shape())) {}
  batch_norm_tensors(const batch_norm_tensors&) = delete;
  batch_norm_tensors& operator=(const batch_norm_tensors&) = delete;

 private:
  tensor hold_[5];

 public:
  const tensor& x;
  const tensor& scale;
  const tensor& bias;
  const tensor& mean;
  const tensor& var;
  tensor& y;
};

}  // namespace loom::common
