// CPU kernels of the array ops: reshape, transpose, concat, split and slice here; gather and
// one_hot in array_index_kernels.cpp; pad and gather_grad in array_grad_kernels.cpp. squeeze,
// expand_dims and broadcast_to are views every device shares (src/kernel/common/
// neutral_kernels.cpp). Shapes and checks are the op rules' (loom/graph/ops/array_rules.hpp);
// the data movement is strided_copy (Note [strided copy] in array_copy.hpp).
//
// Note [array views]: reshape of a contiguous input, squeeze and expand_dims (of any input)
// and transpose whose permuted view is already dense return views sharing the input's
// buffer: no copy, and the executor may run them inline. split returns views when a piece is
// a contiguous block of its input (splits along the outermost non-trivial axis of a dense
// tensor);
// other pieces, slice and concat are dense copies. A view keeps its whole buffer alive, and
// because the buffer then has more than one owner no kernel writes into it in place (see
// kernel_context::forward_input_or_allocate_output and the variable updates).
//
// Kernels check the shapes they get at run time (inference may have seen unknown
// dimensions) through the op rules, and report mismatches with ctx.fail, naming the node.
#include <cstring>
#include <utility>

#include "array_copy.hpp"
#include "cpu_kernels.hpp"
#include "kernel/common/apply_rule.hpp"
#include "kernel/common/array_views.hpp"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::cpu {

// Defined in array_index_kernels.cpp: gather, one_hot.
void register_array_index_kernels(kernel_registry& registry);
// Defined in array_grad_kernels.cpp: pad, gather_grad.
void register_array_grad_kernels(kernel_registry& registry);

namespace {

constexpr device_type cpu = device_type::cpu;
using ints = std::vector<std::int64_t>;
using common::apply_rule;
using common::text_of;

class reshape_kernel final : public op_kernel {
 public:
  explicit reshape_kernel(const kernel_construction& c)
      : op_kernel(c), target_(c.attr<ints>("shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape out = apply_rule(
        ctx, [&] { return array_rules::reshape_shape(target_, in.num_elements(), text_of(in)); });
    if (in.is_contiguous()) return ctx.set_output(0, in.reshaped(out));
    tensor& dense = ctx.allocate_output(0, out);
    copy_dense(ctx, in, dense.raw_data());
  }

 private:
  ints target_;
};

class transpose_kernel final : public op_kernel {
 public:
  explicit transpose_kernel(const kernel_construction& c)
      : op_kernel(c), perm_(c.attr<ints>("perm")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const ints perm =
        apply_rule(ctx, [&] { return array_rules::transpose_perm(perm_, in.rank(), text_of(in)); });
    const tensor view = common::transpose_view(in, perm);
    if (view.is_contiguous()) return ctx.set_output(0, view);
    output_dense_copy(ctx, 0, view);
  }

 private:
  ints perm_;
};

class concat_kernel final : public op_kernel {
 public:
  explicit concat_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const std::size_t n = ctx.num_inputs();
    const tensor& first = ctx.input(0);
    std::vector<shape> shapes;
    bool all_dense = true;
    for (std::size_t i = 0; i < n; ++i) {
      shapes.push_back(ctx.input(i).shape());
      all_dense = all_dense && ctx.input(i).is_contiguous();
    }
    const auto [out_shape, ax] = apply_rule(ctx, [&] {
      return array_rules::concat_shape(shapes, axis_,
                                       [&](std::size_t i) { return ctx.input(i).describe(); });
    });
    if (n == 1 && all_dense) return ctx.set_output(0, first);
    tensor& out = ctx.allocate_output(0, out_shape);
    if (out.num_elements() == 0) return;

    const std::size_t elem = size_of(out.type());
    std::int64_t outer = 1;
    for (std::size_t d = 0; d < ax; ++d) outer *= out_shape[d];
    const std::int64_t inner = out.strides()[ax];  // elements after the axis
    auto* dst = static_cast<std::byte*>(out.raw_data());
    if (all_dense && outer > 1) {
      // One pass over the output rows, each filled from every input in turn.
      std::vector<std::pair<const std::byte*, std::size_t>> parts;  // (data, bytes per row)
      for (std::size_t i = 0; i < n; ++i) {
        const tensor& in = ctx.input(i);
        const auto bytes = static_cast<std::size_t>(in.dim(ax) * inner) * elem;
        if (bytes > 0) parts.emplace_back(static_cast<const std::byte*>(in.raw_data()), bytes);
      }
      const std::size_t row = static_cast<std::size_t>(out_shape[ax] * inner) * elem;
      ctx.parallel_for(outer, static_cast<double>(row) * 0.1 + 5.0 * static_cast<double>(n),
                       [&](std::int64_t begin, std::int64_t end) {
                         for (std::int64_t o = begin; o < end; ++o) {
                           std::byte* d = dst + static_cast<std::size_t>(o) * row;
                           for (const auto& [src, bytes] : parts) {
                             std::memcpy(d, src + static_cast<std::size_t>(o) * bytes, bytes);
                             d += bytes;
                           }
                         }
                       });
      return;
    }
    std::int64_t at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const tensor& in = ctx.input(i);
      if (in.num_elements() > 0) {
        strided_copy(ctx, elem, in.shape(), in.raw_data(), in.strides(),
                     dst + static_cast<std::size_t>(at * inner) * elem, out.strides());
      }
      at += in.dim(ax);
    }
  }

 private:
  std::int64_t axis_;
};

class split_kernel final : public op_kernel {
 public:
  explicit split_kernel(const kernel_construction& c)
      : op_kernel(c),
        num_splits_(c.attr<std::int64_t>("num_splits")),
        axis_(c.attr<std::int64_t>("axis")),
        sizes_(c.attr<ints>("sizes")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const auto [ax, pieces] = apply_rule(ctx, [&] {
      const std::size_t axis = array_rules::split_axis(axis_, in.rank(), text_of(in));
      return std::pair(axis, array_rules::split_sizes(in.dim(axis), axis, num_splits_, sizes_,
                                                      text_of(in)));
    });
    std::int64_t at = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const tensor view = common::piece_view(in, ax, at, pieces[k]);
      at += pieces[k];
      if (view.is_contiguous())
        ctx.set_output(k, view);
      else
        output_dense_copy(ctx, k, view);
    }
  }

 private:
  std::int64_t num_splits_;
  std::int64_t axis_;
  ints sizes_;
};

class slice_kernel final : public op_kernel {
 public:
  explicit slice_kernel(const kernel_construction& c)
      : op_kernel(c), begin_(c.attr<ints>("begin")), size_(c.attr<ints>("size")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape s = apply_rule(
        ctx, [&] { return array_rules::slice_shape(begin_, size_, in.shape(), text_of(in)); });
    if (s.num_elements() == 0) {
      ctx.allocate_output(0, s);
      return;
    }
    output_dense_copy(ctx, 0, common::block_view(in, begin_, s));
  }

 private:
  ints begin_;
  ints size_;
};

}  // namespace

void register_array_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(make_kernel_def<reshape_kernel>("reshape", cpu, any));
  r.add(make_kernel_def<transpose_kernel>("transpose", cpu, any));
  r.add(make_kernel_def<concat_kernel>("concat", cpu, any));
  r.add(make_kernel_def<split_kernel>("split", cpu, any));
  r.add(make_kernel_def<slice_kernel>("slice", cpu, any));
  register_array_index_kernels(r);
  register_array_grad_kernels(r);
}

}  // namespace loom::cpu
