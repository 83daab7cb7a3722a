// Device-neutral helpers of the reduction family's kernels, for every backend (the
// normalization family's build on them: normalization_helpers.hpp): running a shape rule
// (loom/graph/ops/reduction_rules.hpp) so that its failure names the node, dense inputs,
// and the kernels' bases, which hold the node's attributes and apply the rules to an
// input's shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernel/common/apply_rule.hpp"
#include "loom/graph/ops/reduction_rules.hpp"
#include "loom/kernel/op_kernel.hpp"

namespace loom::common {

/// An input as a dense tensor: the input itself when contiguous (a reference into the
/// context, so forwarding its buffer stays possible), else a copy on the kernel's device
/// kept in `hold`.
inline const tensor& dense_input(kernel_context& ctx, std::size_t i, tensor& hold) {
  const tensor& in = ctx.input(i);
  if (in.is_contiguous()) return in;
  hold = ctx.input_contiguous(i);
  return hold;
}

/// Base of the reduce_* kernels of kind K: the node's axes and keepdims.
template <reduction_rules::reduce_kind K>
class reduce_kernel_base : public op_kernel {
 public:
  explicit reduce_kernel_base(const kernel_construction& c)
      : op_kernel(c),
        axes_(c.attr<std::vector<std::int64_t>>("axes")),
        keepdims_(c.attr<bool>("keepdims")) {}

 protected:
  /// The reduction's geometry over an input of shape s (reduce_geometry_of, then
  /// check_identity); a rule's failure fails the node.
  reduction_rules::reduce_geometry geometry(const kernel_context& ctx, const shape& s) const {
    return common::apply_rule(ctx, [&] {
      auto g = reduction_rules::reduce_geometry_of(s, axes_, keepdims_);
      reduction_rules::check_identity(K, g, s);
      return g;
    });
  }

 private:
  std::vector<std::int64_t> axes_;
  bool keepdims_;
};

/// Base of the kernels that work along the node's "axis" (softmax, log_softmax, argmax).
class axis_kernel_base : public op_kernel {
 public:
  explicit axis_kernel_base(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

 protected:
  /// The axis in [0, rank) of s and the split around it; an axis out of range fails the node.
  reduction_rules::along_axis along(const kernel_context& ctx, const shape& s) const {
    return common::apply_rule(ctx, [&] { return reduction_rules::along_axis_of(s, axis_); });
  }

  /// As along, for argmax and argmin (`op`): an empty axis fails the node too.
  reduction_rules::along_axis argmax_along(const kernel_context& ctx, const shape& s,
                                           const char* op = "argmax") const {
    return common::apply_rule(ctx, [&] {
      const auto a = reduction_rules::along_axis_of(s, axis_);
      reduction_rules::check_argmax_axis(a, s, op);
      return a;
    });
  }

 private:
  std::int64_t axis_;
};

/// Base of the argmax and argmin kernels: the axis, and the attributes keepdims and
/// select_last_index (ties go to the last index instead of the first).
class arg_kernel_base : public axis_kernel_base {
 public:
  explicit arg_kernel_base(const kernel_construction& c)
      : axis_kernel_base(c),
        is_min_(c.node().op() == "argmin"),
        keepdims_(c.attr<bool>("keepdims")),
        last_(c.attr<bool>("select_last_index")) {}

 protected:
  [[nodiscard]] const char* op_name() const noexcept { return is_min_ ? "argmin" : "argmax"; }
  bool is_min_;
  bool keepdims_;
  bool last_;
};

}  // namespace loom::common
