// CUDA kernels of reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod, reduce_l1,
// reduce_l2, reduce_sum_square, reduce_log_sum, reduce_log_sum_exp, reduce_any, reduce_all,
// argmax,
// softmax, log_softmax and softmax_cross_entropy (device code in kernels/reduction.cu and
// kernels/softmax.cu). Semantics are the CPU kernels' (src/backends/cpu/reduction_reduce.cpp,
// reduction_softmax.cpp); output shapes and argument checks are the rules both call
// (loom/graph/ops/reduction_rules.hpp). Every check on shapes and attributes runs before the
// first CUDA call, so a bad node fails alike on both devices.
//
// One difference, as TensorFlow's GPU kernel: softmax_cross_entropy cannot check its labels
// before it runs without waiting for the GPU, so a label outside [0, C) gives its row NaN
// loss and NaN backprop instead of an error (Note [cuda softmax]).
//
// Reductions (Note [cuda reduction plan]): a dense input whose reduced axes are neighbours
// (after dropping dims of size 1) is reduced in place as [outer, n, inner]; a non-contiguous
// one is made dense first; one whose reduced axes are apart (axes {0, 2} of a rank-3 tensor)
// is copied once with its reduced axes moved last (a strided gather on the compute stream),
// and reduced as rows.
#include <fmt/format.h>

#include <limits>
#include <vector>

#include "cuda_kernels.hpp"
#include "kernels/softmax.cuh"
#include "loom/graph/ops/reduction_rules.hpp"
#include "reduction_common.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;
using namespace reduction;
using kernels::reduce_op;
using reduction_rules::reduce_kind;

// The device code's reductions are the rules' kinds, in the same order.
static_assert(static_cast<int>(reduce_op::sum) == static_cast<int>(reduce_kind::sum) &&
              static_cast<int>(reduce_op::mean) == static_cast<int>(reduce_kind::mean) &&
              static_cast<int>(reduce_op::max) == static_cast<int>(reduce_kind::max) &&
              static_cast<int>(reduce_op::min) == static_cast<int>(reduce_kind::min) &&
              static_cast<int>(reduce_op::prod) == static_cast<int>(reduce_kind::prod) &&
              static_cast<int>(reduce_op::l1) == static_cast<int>(reduce_kind::l1) &&
              static_cast<int>(reduce_op::l2) == static_cast<int>(reduce_kind::l2) &&
              static_cast<int>(reduce_op::sum_square) == static_cast<int>(reduce_kind::sum_square) &&
              static_cast<int>(reduce_op::log_sum) == static_cast<int>(reduce_kind::log_sum) &&
              static_cast<int>(reduce_op::log_sum_exp) ==
                  static_cast<int>(reduce_kind::log_sum_exp) &&
              static_cast<int>(reduce_op::any) == static_cast<int>(reduce_kind::any) &&
              static_cast<int>(reduce_op::all) == static_cast<int>(reduce_kind::all));

// ---- reduce_* -----------------------------------------------------------------------------

template <reduce_kind K>
class reduce_kernel final : public common::reduce_kernel_base<K> {
 public:
  using common::reduce_kernel_base<K>::reduce_kernel_base;

  void compute(kernel_context& ctx) override {
    constexpr reduce_op op = static_cast<reduce_op>(static_cast<int>(K));
    const tensor& x = ctx.input(0);
    const shape& s = x.shape();
    const reduction_rules::reduce_geometry rg = this->geometry(ctx, s);
    const std::vector<char>& reduced = rg.reduced;
    const std::int64_t num_red = rg.num_red;
    const std::int64_t num_out = rg.num_out;
    if (!kernels::reduce_supports(elem_of(x.type()), op)) {
      ctx.fail("{} has no kernel for {}", reduction_rules::op_name(K), to_string(x.type()));
    }
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, rg.output);
    // reduce_sum's output_type: x's own, or float32 for a float16 / bfloat16 x.
    common::apply_rule(ctx, [&] { reduction_rules::check_sum_output_type(x.type(), out.type()); });
    const bool widen = out.type() != x.type();
    if (num_out == 0) return;
    if (num_red == 0) {  // sums 0, prod and all 1, mean NaN, logs -inf
      const double v = (K == reduce_kind::prod || K == reduce_kind::all) ? 1.0
                       : K == reduce_kind::mean ? std::numeric_limits<double>::quiet_NaN()
                       : (K == reduce_kind::log_sum || K == reduce_kind::log_sum_exp)
                           ? -std::numeric_limits<double>::infinity()
                           : 0.0;
      return fill(ctx, scope, out, v);
    }
    // The dims that matter (size 1 dropped), neighbours of the same kind merged.
    struct group {
      std::int64_t size;
      bool reduced;
    };
    std::vector<group> groups;
    for (std::size_t k = 0; k < s.rank(); ++k) {
      if (s[k] == 1) continue;
      const bool r = reduced[k] != 0;
      if (!groups.empty() && groups.back().reduced == r) {
        groups.back().size *= s[k];
      } else {
        groups.push_back({s[k], r});
      }
    }
    std::size_t reduced_groups = 0;
    for (const group& g : groups) reduced_groups += g.reduced ? 1 : 0;
    tensor hold;
    const tensor* dense = &x;
    std::int64_t outer = 1;
    std::int64_t n = num_red;
    std::int64_t inner = 1;
    if (reduced_groups <= 1) {
      if (!x.is_contiguous()) {
        hold = ctx.input_contiguous(0);
        dense = &hold;
      }
      bool before = true;
      for (const group& g : groups) {
        if (g.reduced) {
          before = false;
        } else {
          (before ? outer : inner) *= g.size;
        }
      }
    } else {
      // The reduced axes apart: one gather with the kept dims first, the reduced dims last.
      shape dims;
      shape strides;
      for (const int pass : {0, 1}) {
        for (std::size_t k = 0; k < s.rank(); ++k) {
          if ((reduced[k] != 0) == (pass == 1) && s[k] != 1) {
            dims.push_back(s[k]);
            strides.push_back(x.strides()[k]);
          }
        }
      }
      const tensor view = tensor::strided(x.buf(), x.type(), dims, strides, x.offset());
      hold = scope.dev.contiguous_copy(view);
      dense = &hold;
      outer = num_out;
    }
    const kernels::reduce_plan plan =
        kernels::plan_reduce(elem_of(x.type()), op, outer, n, inner, widen);
    tensor temp;
    if (plan.temp_bytes > 0) {
      temp = ctx.allocate_temp(dtype::u8, shape{static_cast<std::int64_t>(plan.temp_bytes)});
    }
    kernels::launch_reduce(plan, elem_of(x.type()), op, dense->raw_data(), out.raw_data(),
                           temp.defined() ? temp.raw_data() : nullptr, scope.stream, widen);
    check_launch(ctx, reduction_rules::op_name(K));
  }
};

// ---- argmax -----------------------------------------------------------------------------

// argmax and argmin (common::arg_kernel_base reads which, and the attributes).
class argmax_kernel final : public common::arg_kernel_base {
 public:
  using arg_kernel_base::arg_kernel_base;

  void compute(kernel_context& ctx) override {
    const shape s = ctx.input(0).shape();
    const dtype t = ctx.input(0).type();
    const reduction_rules::along_axis a = argmax_along(ctx, s, op_name());
    const reduction_rules::axis_split& sp = a.split;
    if (!kernels::argmax_supports(elem_of(t))) {
      ctx.fail("{} has no kernel for {}", op_name(), to_string(t));
    }
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, reduction_rules::argmax_output(s, a.axis, keepdims_));
    if (sp.outer * sp.inner == 0) return;
    tensor hold;
    const tensor& x = dense_input(ctx, 0, hold);
    kernels::launch_argmax(elem_of(t), out.type() == dtype::i32, is_min_, last_, x.raw_data(),
                           out.raw_data(), sp.outer, sp.n, sp.inner, scope.stream);
    check_launch(ctx, op_name());
  }
};

// ---- softmax / log_softmax ----------------------------------------------------------------

template <bool Log>
class softmax_kernel final : public common::axis_kernel_base {
 public:
  using axis_kernel_base::axis_kernel_base;

  void compute(kernel_context& ctx) override {
    const shape s = ctx.input(0).shape();
    const dtype t = ctx.input(0).type();
    const reduction_rules::axis_split sp = along(ctx, s).split;
    if (!kernels::softmax_supports(elem_of(t))) {
      ctx.fail("{} has no kernel for {}", Log ? "log_softmax" : "softmax", to_string(t));
    }
    launch_scope scope(ctx);
    tensor hold;
    const tensor& x = dense_input(ctx, 0, hold);
    tensor& y = ctx.forward_input_or_allocate_output(0, 0, s);
    if (s.num_elements() == 0) return;
    kernels::launch_softmax(elem_of(t), Log, x.raw_data(), y.raw_data(), sp.outer, sp.n, sp.inner,
                            scope.stream);
    check_launch(ctx, Log ? "log_softmax" : "softmax");
  }
};

// ---- softmax_cross_entropy ------------------------------------------------------------------

class xent_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;

  void compute(kernel_context& ctx) override {
    const shape xs = ctx.input(0).shape();
    const shape ls = ctx.input(1).shape();
    const dtype t = ctx.input(0).type();
    common::apply_rule(ctx, [&] { reduction_rules::check_xent_shapes(xs, ls); });
    if (!kernels::softmax_supports(elem_of(t))) {
      ctx.fail("softmax_cross_entropy has no kernel for {}", to_string(t));
    }
    const std::int64_t rows = xs[0];
    const std::int64_t classes = xs[1];
    launch_scope scope(ctx);
    tensor hold_x;
    tensor hold_l;
    const tensor& x = dense_input(ctx, 0, hold_x);
    const tensor& labels = dense_input(ctx, 1, hold_l);
    tensor& backprop = ctx.forward_input_or_allocate_output(0, 1, xs);
    tensor& loss = ctx.allocate_output(0, shape{rows});
    if (rows == 0) return;
    if (classes == 0) {  // every label is out of range: NaN losses
      return fill(ctx, scope, loss, std::numeric_limits<double>::quiet_NaN());
    }
    kernels::launch_softmax_xent(elem_of(t), labels.type() == dtype::i32, x.raw_data(),
                                 labels.raw_data(), loss.raw_data(), backprop.raw_data(), rows,
                                 classes, scope.stream);
    check_launch(ctx, "softmax_cross_entropy");
  }
};

}  // namespace

void register_reduction_kernels(kernel_registry& r) {
  r.add(make_kernel_def<reduce_kernel<reduce_kind::sum>>("reduce_sum", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::mean>>("reduce_mean", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::max>>("reduce_max", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::min>>("reduce_min", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::prod>>("reduce_prod", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::l1>>("reduce_l1", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::l2>>("reduce_l2", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::sum_square>>("reduce_sum_square", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::log_sum>>("reduce_log_sum", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::log_sum_exp>>("reduce_log_sum_exp", gpu,
                                                                 "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::any>>("reduce_any", gpu, "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_kind::all>>("reduce_all", gpu, "cuda"));
  r.add(make_kernel_def<argmax_kernel>("argmax", gpu, "cuda"));
  r.add(make_kernel_def<argmax_kernel>("argmin", gpu, "cuda"));
  r.add(make_kernel_def<softmax_kernel<false>>("softmax", gpu, "cuda"));
  r.add(make_kernel_def<softmax_kernel<true>>("log_softmax", gpu, "cuda"));
  r.add(make_kernel_def<xent_kernel>("softmax_cross_entropy", gpu, "cuda"));
}

}  // namespace loom::cuda
