// The CPU kernels of the array ops over run-time shapes and of the layout ops
// (src/graph/ops/array_shape_ops.cpp): shape_of, dynamic_reshape, expand, expand_grad and
// constant_of_shape read or write int64 shape tensors, which live on the host; tile, flip
// and strided_slice are the kernels every backend shares
// (src/kernel/common/array_layout_kernels.hpp) over the CPU's dense copy; strided_slice_grad
// writes dy into zeros; cumsum sums along its axis. Shapes and checks are the op rules'
// (loom/graph/ops/array_rules.hpp). Registered from register_array_kernels (array_kernels.cpp).
#include <cstring>
#include <type_traits>
#include <vector>

#include "array_copy.hpp"
#include "array_index.hpp"
#include "cpu_kernels.hpp"
#include "kernel/common/array_layout_kernels.hpp"
#include "kernel/common/array_views.hpp"
#include "kernel/common/elementwise_convert.hpp"
#include "loom/core/half.hpp"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::cpu {

void register_array_shape_kernels(kernel_registry& registry);

namespace {

constexpr device_type cpu = device_type::cpu;
using ints = std::vector<std::int64_t>;
using common::apply_rule;
using common::text_of;

// The entries of a 1-D int64 shape input.
ints shape_values(kernel_context& ctx, std::size_t i) {
  const tensor t = ctx.input_contiguous(i);
  if (t.rank() != 1) ctx.fail("the shape input must be 1-D, got {}", t.describe());
  const auto* p = t.data<std::int64_t>();
  return ints(p, p + t.num_elements());
}

// The type sums of T accumulate in (double for floats, int64 for integers, which wrap).
template <class T>
using acc_t = std::conditional_t<std::is_integral_v<T>, std::int64_t, double>;
template <class T>
acc_t<T> to_acc(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<std::int64_t>(v);
  } else {
    return to_double(v);
  }
}
template <class T>
T from_acc(acc_t<T> v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::uint64_t>(v));  // wraps
  } else {
    return ew::from_double<T>(v);
  }
}

class shape_of_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    tensor& out = ctx.allocate_output(0, shape{static_cast<std::int64_t>(in.rank())});
    auto* p = out.data<std::int64_t>();
    for (std::size_t d = 0; d < in.rank(); ++d) p[d] = in.dim(d);
  }
};

class dynamic_reshape_kernel final : public op_kernel {
 public:
  explicit dynamic_reshape_kernel(const kernel_construction& c)
      : op_kernel(c), allowzero_(c.attr<bool>("allowzero")) {}
  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const ints spec = shape_values(ctx, 1);
    const shape out = apply_rule(ctx, [&] {
      return array_rules::dynamic_reshape_shape(spec, in.shape(), allowzero_, text_of(in));
    });
    if (in.is_contiguous()) return ctx.set_output(0, in.reshaped(out));
    dense_copy{ctx}(0, in, out);
  }

 private:
  bool allowzero_;
};

class expand_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const ints target = shape_values(ctx, 1);
    const shape out =
        apply_rule(ctx, [&] { return array_rules::expand_shape(in.shape(), target, text_of(in)); });
    ctx.set_output(0, common::broadcast_view(in, out));
  }
};

// expand_grad: dy summed over the dimensions expand broadcast, each output element's terms
// in row-major order of dy (the result does not depend on the thread count).
class expand_grad_kernel final : public op_kernel {
 public:
  using op_kernel::op_kernel;
  void compute(kernel_context& ctx) override {
    const tensor dy = ctx.input_contiguous(0);
    const shape xs(shape_values(ctx, 1));
    (void)apply_rule(ctx, [&] {
      for (auto d : xs.dims()) {
        if (d < 0)
          throw invalid_argument(fmt::format("shape {} has a negative dimension", to_string(xs)));
      }
      return array_rules::expand_grad_axes(xs, dy.shape(), [&] { return to_string(xs); });
    });
    tensor& out = ctx.allocate_output(0, xs);
    const std::size_t lead = dy.rank() - xs.rank();
    // dy's index (row-major) splits into the kept part (out's index) and the summed part.
    shape kept_dims;
    shape summed_dims;
    for (std::size_t d = 0; d < dy.rank(); ++d) {
      const bool summed = d < lead || xs[d - lead] != dy.dim(d);
      (summed ? summed_dims : kept_dims).push_back(dy.dim(d));
    }
    const shape dy_strides = dy.strides();
    const std::int64_t n_out = out.num_elements();
    const std::int64_t n_sum = summed_dims.num_elements();
    visit_dtype(dy.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T* src = dy.data<T>();
        T* dst = out.data<T>();
        ctx.parallel_for(n_out, static_cast<double>(n_sum) * 2.0 + 1.0,
                         [&](std::int64_t begin, std::int64_t end) {
                           for (std::int64_t o = begin; o < end; ++o) {
                             // The offset in dy of kept index o, and of each summed index.
                             std::int64_t base = 0;
                             std::int64_t rest = o;
                             for (std::size_t d = dy.rank(), k = kept_dims.rank(); d-- > 0;) {
                               const bool summed = d < lead || xs[d - lead] != dy.dim(d);
                               if (summed) continue;
                               --k;
                               base += (rest % kept_dims[k]) * dy_strides[d];
                               rest /= kept_dims[k];
                             }
                             acc_t<T> sum{};
                             for (std::int64_t s = 0; s < n_sum; ++s) {
                               std::int64_t at = base;
                               std::int64_t r = s;
                               for (std::size_t d = dy.rank(), k = summed_dims.rank(); d-- > 0;) {
                                 const bool summed = d < lead || xs[d - lead] != dy.dim(d);
                                 if (!summed) continue;
                                 --k;
                                 at += (r % summed_dims[k]) * dy_strides[d];
                                 r /= summed_dims[k];
                               }
                               sum += to_acc(src[at]);
                             }
                             dst[o] = from_acc<T>(sum);
                           }
                         });
      }
    });
  }
};

class constant_of_shape_kernel final : public op_kernel {
 public:
  explicit constant_of_shape_kernel(const kernel_construction& c)
      : op_kernel(c), value_(c.attr<double>("value")) {}
  void compute(kernel_context& ctx) override {
    const ints dims = shape_values(ctx, 0);
    for (auto d : dims) {
      if (d < 0) ctx.fail("shape [{}] has a negative dimension", fmt::join(dims, ", "));
    }
    tensor& out = ctx.allocate_output(0, shape(dims));
    visit_dtype(out.type(), [&](auto tag) {
      using T = decltype(tag);
      const T v = ew::wrap_from_double<T>(value_);
      T* p = out.data<T>();
      ctx.parallel_for(out.num_elements(), 0.5, [&](std::int64_t begin, std::int64_t end) {
        std::fill(p + begin, p + end, v);
      });
    });
  }

 private:
  double value_;
};

// strided_slice_grad: zeros of the input's shape, then dy copied into the entries
// strided_slice read (each written once: the slice never reads an entry twice).
class strided_slice_grad_kernel final : public op_kernel {
 public:
  explicit strided_slice_grad_kernel(const kernel_construction& c)
      : op_kernel(c), attrs_(c), input_shape_(c.attr<shape>("input_shape")) {}
  void compute(kernel_context& ctx) override {
    const tensor& dy = ctx.input(0);
    const auto g = apply_rule(ctx, [&] {
      auto geometry = attrs_.geometry(input_shape_, [&] { return to_string(input_shape_); });
      if (geometry.out != dy.shape()) {
        throw invalid_argument(
            fmt::format("dy {} is not strided_slice's output {} for an input of shape {}",
                        dy.describe(), to_string(geometry.out), to_string(input_shape_)));
      }
      return geometry;
    });
    tensor& out = ctx.allocate_output(0, input_shape_);
    if (out.num_elements() == 0) return;
    std::memset(out.raw_data(), 0,
                static_cast<std::size_t>(out.num_elements()) * size_of(out.type()));
    if (dy.num_elements() == 0) return;
    const auto [offset, strides] = common::strided_slice_layout(g, 0, out.strides());
    const std::size_t elem = size_of(out.type());
    strided_copy(ctx, elem, dy.shape(), dy.raw_data(), dy.strides(),
                 static_cast<std::byte*>(out.raw_data()) + static_cast<std::size_t>(offset) * elem,
                 strides);
  }

 private:
  common::strided_slice_attrs attrs_;
  shape input_shape_;
};

// cumsum: one task per line along the axis (input read as [outer, n, inner]).
class cumsum_kernel final : public op_kernel {
 public:
  explicit cumsum_kernel(const kernel_construction& c)
      : op_kernel(c),
        axis_(c.attr<std::int64_t>("axis")),
        exclusive_(c.attr<bool>("exclusive")),
        reverse_(c.attr<bool>("reverse")) {}
  void compute(kernel_context& ctx) override {
    const tensor in = ctx.input_contiguous(0);
    const std::size_t ax = apply_rule(ctx, [&] {
      if (in.rank() == 0) {
        throw invalid_argument(fmt::format("cumsum needs rank >= 1, got {}", in.describe()));
      }
      return array_rules::wrap_axis(axis_, in.rank(), text_of(in));
    });
    tensor& out = ctx.allocate_output(0, in.shape());
    if (out.num_elements() == 0) return;
    std::int64_t outer = 1;
    std::int64_t inner = 1;
    for (std::size_t d = 0; d < ax; ++d) outer *= in.dim(d);
    for (std::size_t d = ax + 1; d < in.rank(); ++d) inner *= in.dim(d);
    const std::int64_t n = in.dim(ax);
    visit_dtype(in.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T* src = in.data<T>();
        T* dst = out.data<T>();
        ctx.parallel_for(outer * inner, static_cast<double>(n) * 3.0,
                         [&](std::int64_t begin, std::int64_t end) {
                           for (std::int64_t line = begin; line < end; ++line) {
                             const std::int64_t base = (line / inner) * n * inner + line % inner;
                             acc_t<T> sum{};
                             for (std::int64_t j = 0; j < n; ++j) {
                               const std::int64_t at = base + (reverse_ ? n - 1 - j : j) * inner;
                               const acc_t<T> v = to_acc(src[at]);
                               if (!exclusive_) sum += v;
                               dst[at] = from_acc<T>(sum);
                               if (exclusive_) sum += v;
                             }
                           }
                         });
      }
    });
  }

 private:
  std::int64_t axis_;
  bool exclusive_;
  bool reverse_;
};

// dynamic_slice: strided_slice's geometry for starts and ends read from its inputs.
class dynamic_slice_kernel final : public op_kernel {
 public:
  explicit dynamic_slice_kernel(const kernel_construction& c)
      : op_kernel(c), axes_(c.attr<ints>("axes")), steps_(c.attr<ints>("steps")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const ints starts = shape_values(ctx, 1);
    const ints ends = shape_values(ctx, 2);
    const auto g = apply_rule(ctx, [&] {
      return array_rules::strided_slice_shape(in.shape(), starts, ends, axes_, steps_, text_of(in));
    });
    if (g.out.num_elements() == 0) {
      ctx.allocate_output(0, g.out);
      return;
    }
    const auto [offset, strides] = common::strided_slice_layout(g, in.offset(), in.strides());
    dense_copy{ctx}(0, tensor::strided(in.buf(), in.type(), g.out, strides, offset), g.out);
  }

 private:
  ints axes_;
  ints steps_;
};

}  // namespace

void register_array_shape_kernels(kernel_registry& r) {
  r.add(make_kernel_def<dynamic_slice_kernel>("dynamic_slice", cpu));
  r.add(make_kernel_def<shape_of_kernel>("shape_of", cpu));
  r.add(make_kernel_def<dynamic_reshape_kernel>("dynamic_reshape", cpu));
  r.add(make_kernel_def<expand_kernel>("expand", cpu));
  r.add(make_kernel_def<expand_grad_kernel>("expand_grad", cpu));
  r.add(make_kernel_def<constant_of_shape_kernel>("constant_of_shape", cpu));
  r.add(make_kernel_def<common::tile_kernel<dense_copy>>("tile", cpu));
  r.add(make_kernel_def<common::flip_kernel<dense_copy>>("flip", cpu));
  r.add(make_kernel_def<common::strided_slice_kernel<dense_copy>>("strided_slice", cpu));
  r.add(make_kernel_def<strided_slice_grad_kernel>("strided_slice_grad", cpu));
  r.add(make_kernel_def<cumsum_kernel>("cumsum", cpu));
}

}  // namespace loom::cpu
