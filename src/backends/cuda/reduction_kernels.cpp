// CUDA kernels of reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod, argmax,
// softmax, log_softmax and softmax_cross_entropy (device code in kernels/reduction.cu and
// kernels/softmax.cu). Semantics, output shapes and argument checks are the CPU kernels'
// (src/backends/cpu/reduction_reduce.cpp, reduction_softmax.cpp), with the same messages;
// every check on shapes and attributes runs before the first CUDA call, so a bad node fails
// alike on both devices.
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

#include <cstring>
#include <limits>
#include <vector>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernels/reduction.cuh"
#include "kernels/softmax.cuh"
#include "loom/core/half.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu = device_type::cuda;
using kernels::reduce_op;

static_assert(static_cast<int>(kernels::elem_type::f32) == static_cast<int>(dtype::f32));
static_assert(static_cast<int>(kernels::elem_type::f64) == static_cast<int>(dtype::f64));
static_assert(static_cast<int>(kernels::elem_type::f16) == static_cast<int>(dtype::f16));
static_assert(static_cast<int>(kernels::elem_type::bf16) == static_cast<int>(dtype::bf16));
static_assert(static_cast<int>(kernels::elem_type::i32) == static_cast<int>(dtype::i32));
static_assert(static_cast<int>(kernels::elem_type::i64) == static_cast<int>(dtype::i64));
static_assert(static_cast<int>(kernels::elem_type::i8) == static_cast<int>(dtype::i8));
static_assert(static_cast<int>(kernels::elem_type::u8) == static_cast<int>(dtype::u8));

kernels::elem_type elem_of(dtype t) {
  return static_cast<kernels::elem_type>(static_cast<int>(t));
}

/// Wraps `axis` into [0, rank) of `s`, or fails naming it (as the CPU kernels do).
std::size_t normalize_axis(const kernel_context& ctx, std::int64_t axis, const shape& s) {
  const auto r = static_cast<std::int64_t>(s.rank());
  if (axis < -r || axis >= r) {
    ctx.fail("axis {} is out of range for input of shape {}", axis, to_string(s));
  }
  return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}

/// Input i as a dense tensor: the input itself when contiguous (a reference into the
/// context, so forwarding its buffer stays possible), else a copy on the device in `hold`.
const tensor& dense_input(kernel_context& ctx, std::size_t i, tensor& hold) {
  const tensor& in = ctx.input(i);
  if (in.is_contiguous()) return in;
  hold = ctx.input_contiguous(i);
  return hold;
}

/// (outer, n, inner) element counts of `s` around `axis`.
struct axis_split {
  std::int64_t outer = 1;
  std::int64_t n = 1;
  std::int64_t inner = 1;
};
axis_split split_at(const shape& s, std::size_t axis) {
  axis_split r;
  for (std::size_t k = 0; k < s.rank(); ++k) {
    if (k < axis)
      r.outer *= s[k];
    else if (k == axis)
      r.n = s[k];
    else
      r.inner *= s[k];
  }
  return r;
}

/// The bits of `v` as a value of t (for fills of 1, 2, 4 or 8 bytes).
std::uint64_t bits_of(dtype t, double v) {
  std::uint64_t bits = 0;
  auto put = [&](auto x) { std::memcpy(&bits, &x, sizeof x); };
  switch (t) {
    case dtype::f32:
      put(static_cast<float>(v));
      break;
    case dtype::f64:
      put(v);
      break;
    case dtype::f16:
      put(half(static_cast<float>(v)));
      break;
    case dtype::bf16:
      put(bfloat16(static_cast<float>(v)));
      break;
    case dtype::i32:
      put(static_cast<std::int32_t>(v));
      break;
    case dtype::i64:
      put(static_cast<std::int64_t>(v));
      break;
    case dtype::i8:
      put(static_cast<std::int8_t>(v));
      break;
    case dtype::u8:
      put(static_cast<std::uint8_t>(v));
      break;
    case dtype::boolean:
      put(static_cast<std::uint8_t>(v != 0.0));
      break;
  }
  return bits;
}

/// Fills the dense tensor t with v on the compute stream.
void fill(kernel_context& ctx, const launch_scope& scope, tensor& t, double v) {
  if (t.num_elements() == 0) return;
  kernels::launch_fill(t.raw_data(), t.num_elements(), static_cast<int>(size_of(t.type())),
                       bits_of(t.type(), v), scope.stream);
  check_launch(ctx, "fill");
}

const char* kind_name(reduce_op k) {
  switch (k) {
    case reduce_op::sum:
      return "reduce_sum";
    case reduce_op::mean:
      return "reduce_mean";
    case reduce_op::max:
      return "reduce_max";
    case reduce_op::min:
      return "reduce_min";
    case reduce_op::prod:
      return "reduce_prod";
  }
  return "reduce";
}

// ---- reduce_* -----------------------------------------------------------------------------

template <reduce_op K>
class reduce_kernel final : public op_kernel {
 public:
  explicit reduce_kernel(const kernel_construction& c)
      : op_kernel(c),
        axes_(c.attr<std::vector<std::int64_t>>("axes")),
        keepdims_(c.attr<bool>("keepdims")) {}

  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    const shape& s = x.shape();
    std::vector<char> reduced(s.rank(), axes_.empty() ? 1 : 0);
    for (const auto a : axes_) {
      const std::size_t k = normalize_axis(ctx, a, s);
      if (reduced[k]) ctx.fail("axes name axis {} twice (input of shape {})", k, to_string(s));
      reduced[k] = 1;
    }
    shape out_shape;
    std::int64_t num_red = 1;
    std::int64_t num_out = 1;
    for (std::size_t k = 0; k < s.rank(); ++k) {
      if (reduced[k]) {
        num_red *= s[k];
        if (keepdims_) out_shape.push_back(1);
      } else {
        num_out *= s[k];
        out_shape.push_back(s[k]);
      }
    }
    if (num_red == 0 && (K == reduce_op::max || K == reduce_op::min)) {
      std::size_t axis = 0;
      while (axis < s.rank() && !(reduced[axis] && s[axis] == 0)) ++axis;
      ctx.fail("{} of an empty axis (axis {} of input shape {}) has no identity", kind_name(K),
               axis, to_string(s));
    }
    if (!kernels::reduce_supports(elem_of(x.type()), K)) {
      ctx.fail("{} has no kernel for {}", kind_name(K), to_string(x.type()));
    }
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, out_shape);
    if (num_out == 0) return;
    if (num_red == 0) {  // sum 0, prod 1, mean NaN
      const double v = K == reduce_op::prod   ? 1.0
                       : K == reduce_op::mean ? std::numeric_limits<double>::quiet_NaN()
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
    const kernels::reduce_plan plan = kernels::plan_reduce(elem_of(x.type()), K, outer, n, inner);
    tensor temp;
    if (plan.temp_bytes > 0) {
      temp = ctx.allocate_temp(dtype::u8, shape{static_cast<std::int64_t>(plan.temp_bytes)});
    }
    kernels::launch_reduce(plan, elem_of(x.type()), K, dense->raw_data(), out.raw_data(),
                           temp.defined() ? temp.raw_data() : nullptr, scope.stream);
    check_launch(ctx, kind_name(K));
  }

 private:
  std::vector<std::int64_t> axes_;
  bool keepdims_;
};

// ---- argmax -----------------------------------------------------------------------------

class argmax_kernel final : public op_kernel {
 public:
  explicit argmax_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const shape s = ctx.input(0).shape();
    const dtype t = ctx.input(0).type();
    const std::size_t axis = normalize_axis(ctx, axis_, s);
    const axis_split sp = split_at(s, axis);
    if (sp.n == 0) {
      ctx.fail("argmax of an empty axis (axis {} of input shape {})", axis, to_string(s));
    }
    if (!kernels::argmax_supports(elem_of(t))) {
      ctx.fail("argmax has no kernel for {}", to_string(t));
    }
    shape out_shape;
    for (std::size_t k = 0; k < s.rank(); ++k) {
      if (k != axis) out_shape.push_back(s[k]);
    }
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, out_shape);
    if (sp.outer * sp.inner == 0) return;
    tensor hold;
    const tensor& x = dense_input(ctx, 0, hold);
    kernels::launch_argmax(elem_of(t), out.type() == dtype::i32, x.raw_data(), out.raw_data(),
                           sp.outer, sp.n, sp.inner, scope.stream);
    check_launch(ctx, "argmax");
  }

 private:
  std::int64_t axis_;
};

// ---- softmax / log_softmax ----------------------------------------------------------------

template <bool Log>
class softmax_kernel final : public op_kernel {
 public:
  explicit softmax_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const shape s = ctx.input(0).shape();
    const dtype t = ctx.input(0).type();
    const std::size_t axis = normalize_axis(ctx, axis_, s);
    const axis_split sp = split_at(s, axis);
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

 private:
  std::int64_t axis_;
};

// ---- softmax_cross_entropy ------------------------------------------------------------------

class xent_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;

  void compute(kernel_context& ctx) override {
    const shape xs = ctx.input(0).shape();
    const shape ls = ctx.input(1).shape();
    const dtype t = ctx.input(0).type();
    if (xs.rank() != 2 || ls.rank() != 1 || ls[0] != xs[0]) {
      ctx.fail("logits {} must be [N, C] and labels {} must be [N]", to_string(xs), to_string(ls));
    }
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
  const std::vector<dtype> numeric{dtype::f32,  dtype::f64, dtype::f16,
                                   dtype::bf16, dtype::i32, dtype::i64};
  const std::vector<dtype> floats{dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
  r.add(make_kernel_def<reduce_kernel<reduce_op::sum>>("reduce_sum", gpu, type_constraint(numeric),
                                                       "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_op::mean>>("reduce_mean", gpu, type_constraint(floats),
                                                        "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_op::max>>("reduce_max", gpu, type_constraint(numeric),
                                                       "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_op::min>>("reduce_min", gpu, type_constraint(numeric),
                                                       "cuda"));
  r.add(make_kernel_def<reduce_kernel<reduce_op::prod>>("reduce_prod", gpu,
                                                        type_constraint(numeric), "cuda"));
  std::vector<dtype> argmax_types = numeric;
  argmax_types.push_back(dtype::i8);
  argmax_types.push_back(dtype::u8);
  r.add(make_kernel_def<argmax_kernel>(
      "argmax", gpu, {{"T", argmax_types}, {"output_type", {dtype::i32, dtype::i64}}}, "cuda"));
  r.add(make_kernel_def<softmax_kernel<false>>("softmax", gpu, type_constraint(floats), "cuda"));
  r.add(make_kernel_def<softmax_kernel<true>>("log_softmax", gpu, type_constraint(floats), "cuda"));
  r.add(make_kernel_def<xent_kernel>("softmax_cross_entropy", gpu,
                                     {{"T", floats}, {"Tlabels", {dtype::i32, dtype::i64}}},
                                     "cuda"));
}

}  // namespace loom::cuda
