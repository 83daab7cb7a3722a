// The array kernels written once over a backend's device work: reshape, transpose, split,
// slice, concat, pad, gather, gather_grad and one_hot. Each reads its attributes once, applies its
// op rule (loom/graph/ops/array_rules.hpp) to the inputs, returns a view where the result is one
// (Note [array views] in src/kernel/common/array_views.hpp), and leaves the data movement to
// the backend's policy classes, each made from the kernel_context where the kernel is about
// to touch the device (the CUDA ones open their launch_scope there):
//   Copy:  void operator()(std::size_t i, const tensor& src, const shape& out) sets output i
//          to a new dense tensor of shape `out` (the node's output dtype) holding src's
//          elements (on the kernel's device, any strides) in row-major order;
//   Join:  void operator()(const concat_plan& plan) sets output 0 to the inputs joined;
//   Fill (pad):     void operator()(const tensor& in, const shape& out, const pad_attrs& a);
//   Fill (one_hot): void operator()(const array_rules::one_hot_geometry& g,
//                                   const one_hot_attrs& a);
//   Take (gather): void operator()(const array_rules::gather_geometry& g, bool wrap_negative)
//          (wrap_negative: an index in [-n, 0) counts from the end);
//   Sum (gather_grad): void operator()(const array_rules::gather_geometry& g).
// The policies read the inputs from the context (input_contiguous where they need dense
// data) and check index values where their device does (the CPU; not the GPU: Note [cuda
// value checks] in src/backends/cuda/elementwise_kernels.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "apply_rule.hpp"
#include "array_views.hpp"
#include "loom/graph/ops/array_rules.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// reshape: a view of a contiguous input; a dense copy of any other.
template <class Copy>
class reshape_kernel final : public op_kernel {
 public:
  explicit reshape_kernel(const kernel_construction& c)
      : op_kernel(c), target_(c.attr<std::vector<std::int64_t>>("shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape out = apply_rule(
        ctx, [&] { return array_rules::reshape_shape(target_, in.num_elements(), text_of(in)); });
    if (in.is_contiguous()) return ctx.set_output(0, in.reshaped(out));
    Copy{ctx}(0, in, out);
  }

 private:
  std::vector<std::int64_t> target_;
};

/// transpose: the permuted view when it is dense, else a dense copy of it.
template <class Copy>
class transpose_kernel final : public op_kernel {
 public:
  explicit transpose_kernel(const kernel_construction& c)
      : op_kernel(c), perm_(c.attr<std::vector<std::int64_t>>("perm")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const auto perm =
        apply_rule(ctx, [&] { return array_rules::transpose_perm(perm_, in.rank(), text_of(in)); });
    const tensor view = transpose_view(in, perm);
    if (view.is_contiguous()) return ctx.set_output(0, view);
    Copy{ctx}(0, view, view.shape());
  }

 private:
  std::vector<std::int64_t> perm_;
};

/// split: each piece a view when it is a contiguous block of the input, else a dense copy.
template <class Copy>
class split_kernel final : public op_kernel {
 public:
  explicit split_kernel(const kernel_construction& c)
      : op_kernel(c),
        num_splits_(c.attr<std::int64_t>("num_splits")),
        axis_(c.attr<std::int64_t>("axis")),
        sizes_(c.attr<std::vector<std::int64_t>>("sizes")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const auto [ax, pieces] = apply_rule(ctx, [&] {
      const std::size_t axis = array_rules::split_axis(axis_, in.rank(), text_of(in));
      return std::pair(
          axis, array_rules::split_sizes(in.dim(axis), axis, num_splits_, sizes_, text_of(in)));
    });
    std::optional<Copy> copy;  // made for the first piece that needs one
    std::int64_t at = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const tensor view = piece_view(in, ax, at, pieces[k]);
      at += pieces[k];
      if (view.is_contiguous()) {
        ctx.set_output(k, view);
      } else {
        if (!copy) copy.emplace(ctx);
        (*copy)(k, view, view.shape());
      }
    }
  }

 private:
  std::int64_t num_splits_;
  std::int64_t axis_;
  std::vector<std::int64_t> sizes_;
};

/// slice: always a dense copy of the block (empty when the block is).
template <class Copy>
class slice_kernel final : public op_kernel {
 public:
  explicit slice_kernel(const kernel_construction& c)
      : op_kernel(c),
        begin_(c.attr<std::vector<std::int64_t>>("begin")),
        size_(c.attr<std::vector<std::int64_t>>("size")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape s = apply_rule(
        ctx, [&] { return array_rules::slice_shape(begin_, size_, in.shape(), text_of(in)); });
    Copy copy(ctx);
    if (s.num_elements() == 0) {
      ctx.allocate_output(0, s);
      return;
    }
    copy(0, block_view(in, begin_, s), s);
  }

 private:
  std::vector<std::int64_t> begin_;
  std::vector<std::int64_t> size_;
};

/// concat: input 0 itself when it is the only input and dense; else the backend's Join.
template <class Join>
class concat_kernel final : public op_kernel {
 public:
  explicit concat_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const concat_plan plan = plan_concat(ctx, axis_);
    if (ctx.num_inputs() == 1 && plan.all_dense) return ctx.set_output(0, ctx.input(0));
    Join{ctx}(plan);
  }

 private:
  std::int64_t axis_;
};

/// pad's attributes: 2 paddings (before, after) per dimension and the constant.
struct pad_attrs {
  explicit pad_attrs(const kernel_construction& c)
      : paddings(c.attr<std::vector<std::int64_t>>("paddings")),
        constant(c.attr<double>("constant_value")),
        none(std::all_of(paddings.begin(), paddings.end(), [](auto p) { return p == 0; })) {}
  std::vector<std::int64_t> paddings;
  double constant;
  bool none;  // every padding is 0
};

/// pad: with no padding, the input itself when dense, else a dense copy; otherwise the
/// backend's Fill.
template <class Copy, class Fill>
class pad_kernel final : public op_kernel {
 public:
  explicit pad_kernel(const kernel_construction& c) : op_kernel(c), attrs_(c) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape s = apply_rule(
        ctx, [&] { return array_rules::pad_shape(in.shape(), attrs_.paddings, text_of(in)); });
    if (attrs_.none) {
      if (in.is_contiguous()) return ctx.set_output(0, in);
      return Copy{ctx}(0, in, in.shape());
    }
    Fill{ctx}(in, s, attrs_);
  }

 private:
  pad_attrs attrs_;
};

/// one_hot's attributes.
struct one_hot_attrs {
  explicit one_hot_attrs(const kernel_construction& c)
      : depth(c.attr<std::int64_t>("depth")),
        axis(c.attr<std::int64_t>("axis")),
        on(c.attr<double>("on_value")),
        off(c.attr<double>("off_value")) {}
  std::int64_t depth;
  std::int64_t axis;
  double on;
  double off;
};

/// one_hot: the geometry from the op rule, then the backend's Fill.
template <class Fill>
class one_hot_kernel final : public op_kernel {
 public:
  explicit one_hot_kernel(const kernel_construction& c) : op_kernel(c), attrs_(c) {}

  void compute(kernel_context& ctx) override {
    const tensor& idx = ctx.input(0);
    const auto g = apply_rule(ctx, [&] {
      return array_rules::one_hot_shape(idx.shape(), attrs_.depth, attrs_.axis, text_of(idx));
    });
    Fill{ctx}(g, attrs_);
  }

 private:
  one_hot_attrs attrs_;
};

/// gather: the geometry from the op rule, then the backend's Take.
template <class Take>
class gather_kernel final : public op_kernel {
 public:
  explicit gather_kernel(const kernel_construction& c)
      : op_kernel(c),
        axis_(c.attr<std::int64_t>("axis")),
        wrap_negative_(c.attr<bool>("wrap_negative")) {}

  void compute(kernel_context& ctx) override {
    const tensor& params = ctx.input(0);
    const auto g = apply_rule(ctx, [&] {
      return array_rules::gather_shape(params.shape(), ctx.input(1).shape(), axis_,
                                       text_of(params));
    });
    Take{ctx}(g, wrap_negative_);
  }

 private:
  std::int64_t axis_;
  bool wrap_negative_;
};

/// gather_grad: the geometry from the op rule (params_shape completed from dy), then the
/// backend's Sum.
template <class Sum>
class gather_grad_kernel final : public op_kernel {
 public:
  explicit gather_grad_kernel(const kernel_construction& c)
      : op_kernel(c),
        axis_(c.attr<std::int64_t>("axis")),
        params_shape_(c.attr<shape>("params_shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& dy = ctx.input(0);
    const tensor& indices = ctx.input(1);
    const auto g = apply_rule(ctx, [&] {
      return array_rules::gather_grad_shape(params_shape_, axis_, dy.shape(), indices.shape(),
                                            text_of(dy), text_of(indices));
    });
    Sum{ctx}(g);
  }

 private:
  std::int64_t axis_;
  shape params_shape_;
};

}  // namespace loom::common
