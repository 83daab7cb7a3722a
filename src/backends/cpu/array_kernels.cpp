// The CPU backend's array kernels: the kernels every backend shares
// (src/kernel/common/array_kernels.hpp) over the CPU's device work, and the family's
// registration. Here: the dense copy (cpu::dense_copy, array_copy.hpp) under reshape,
// transpose, split and slice, and concat's join; gather's take and one_hot's fill are in
// array_index_kernels.cpp, pad's fill and gather_grad's sum in array_grad_kernels.cpp (the
// CUDA counterparts: src/backends/cuda/array_kernels.cpp). squeeze, expand_dims and
// broadcast_to are views registered once for every device
// (src/kernel/common/neutral_kernels.cpp). The data movement is strided_copy (Note [strided
// copy] in array_copy.hpp); views: Note [array views] in src/kernel/common/array_views.hpp.
//
// The shared kernels check the shapes they get at run time (inference may have seen unknown
// dimensions) through the op rules (loom/graph/ops/array_rules.hpp), and report mismatches
// with ctx.fail, naming the node.
#include "kernel/common/array_kernels.hpp"

#include <cstring>
#include <utility>

#include "array_copy.hpp"
#include "cpu_kernels.hpp"
#include "kernel/common/array_views.hpp"

namespace loom::cpu {

// Defined in array_index_kernels.cpp: gather, one_hot.
void register_array_index_kernels(kernel_registry& registry);
// Defined in array_grad_kernels.cpp: pad, gather_grad.
void register_array_grad_kernels(kernel_registry& registry);
// Defined in array_shape_kernels.cpp: shape_of, dynamic_reshape, expand, constant_of_shape,
// tile, flip, strided_slice, cumsum and their gradient ops.
void register_array_shape_kernels(kernel_registry& registry);
// Defined in array_select_kernels.cpp: topk, gather_elements, scatter_elements, gather_nd,
// scatter_nd.
void register_array_select_kernels(kernel_registry& registry);

namespace {

constexpr device_type cpu = device_type::cpu;

// concat's CPU join (src/kernel/common/array_kernels.hpp): dense inputs row by row, others
// through strided_copy straight into their place.
class concat_join {
 public:
  explicit concat_join(kernel_context& ctx) : ctx_(ctx) {}

  void operator()(const common::concat_plan& plan) const {
    kernel_context& ctx = ctx_;
    const std::size_t n = ctx.num_inputs();
    const shape& out_shape = plan.out;
    const std::size_t ax = plan.axis;
    const bool all_dense = plan.all_dense;
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
  kernel_context& ctx_;
};

}  // namespace

void register_array_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(make_kernel_def<common::reshape_kernel<dense_copy>>("reshape", cpu, any));
  r.add(make_kernel_def<common::transpose_kernel<dense_copy>>("transpose", cpu, any));
  r.add(make_kernel_def<common::concat_kernel<concat_join>>("concat", cpu, any));
  r.add(make_kernel_def<common::split_kernel<dense_copy>>("split", cpu, any));
  r.add(make_kernel_def<common::slice_kernel<dense_copy>>("slice", cpu, any));
  register_array_index_kernels(r);
  register_array_grad_kernels(r);
  register_array_shape_kernels(r);
  register_array_select_kernels(r);
}

}  // namespace loom::cpu
