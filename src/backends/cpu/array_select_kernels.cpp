// The CPU kernels of topk, gather_elements, scatter_elements, gather_nd and scatter_nd
// (src/graph/ops/array_select_ops.cpp). Shapes and checks are the op rules'
// (loom/graph/ops/array_rules.hpp); every index is checked (and wrapped when negative) before
// any data moves, and one out of range fails the node naming its position and value. The
// scatters copy data, then apply the updates one after another in row-major order (so
// duplicates resolve the same way every run). Registered from register_array_kernels
// (array_kernels.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "array_copy.hpp"
#include "array_index.hpp"
#include "cpu_kernels.hpp"
#include "kernel/common/apply_rule.hpp"
#include "kernel/common/elementwise_convert.hpp"
#include "loom/core/half.hpp"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::cpu {

void register_array_select_kernels(kernel_registry& registry);

namespace {

constexpr device_type cpu = device_type::cpu;
using common::apply_rule;
using common::text_of;

// The inputs' descriptions for the rules' messages.
auto texts_of(const kernel_context& ctx) {
  return [&ctx](std::size_t i) { return ctx.input(i).describe(); };
}

// The indices of input 1 as int64, each wrapped into [0, dim(k)) where dim(k) is the extent
// index k addresses; one outside [-dim, dim) fails the node.
template <class DimFn>
std::vector<std::int64_t> checked_indices(kernel_context& ctx, const tensor& indices,
                                          const std::string& what, DimFn&& dim) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(indices.num_elements()));
  visit_index(indices.type(), [&](auto tag) {
    using I = decltype(tag);
    const I* p = indices.data<I>();
    for (std::size_t k = 0; k < out.size(); ++k) {
      const auto v = static_cast<std::int64_t>(p[k]);
      const std::int64_t n = dim(k);
      if (v < -n || v >= n) {
        ctx.fail("indices{} = {} is out of range [{}, {}) for {}",
                 position(indices.shape(), static_cast<std::int64_t>(k)), v, -n, n, what);
      }
      out[k] = v < 0 ? v + n : v;
    }
  });
  return out;
}

// a combined with b by a scatter's reduction (1: add, 2: mul); bool adds as or and
// multiplies as and, integers wrap, 16-bit floats round once.
template <class T>
T combine(T a, T b, int reduction) {
  if constexpr (std::is_same_v<T, bool>) {
    return reduction == 1 ? (a || b) : (a && b);
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    const U x = static_cast<U>(a);
    const U y = static_cast<U>(b);
    return static_cast<T>(reduction == 1 ? static_cast<U>(x + y) : static_cast<U>(x * y));
  } else if constexpr (std::is_floating_point_v<T>) {
    return reduction == 1 ? a + b : a * b;
  } else {
    const double x = to_double(a);
    const double y = to_double(b);
    return ew::from_double<T>(reduction == 1 ? x + y : x * y);
  }
}

int reduction_code(const kernel_construction& c) {
  const auto r = c.attr<std::string>("reduction");
  return r == "add" ? 1 : r == "mul" ? 2 : 0;
}

// Row-major strides of s, in elements.
std::vector<std::int64_t> strides_of(const shape& s) {
  std::vector<std::int64_t> st(s.rank(), 1);
  for (std::size_t d = s.rank(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

// ---- topk ----------------------------------------------------------------------------------

class topk_kernel final : public op_kernel {
 public:
  explicit topk_kernel(const kernel_construction& c)
      : op_kernel(c),
        k_(c.attr<std::int64_t>("k")),
        axis_(c.attr<std::int64_t>("axis")),
        largest_(c.attr<bool>("largest")) {}

  void compute(kernel_context& ctx) override {
    const tensor x = ctx.input_contiguous(0);
    const auto g =
        apply_rule(ctx, [&] { return array_rules::topk_shape(x.shape(), k_, axis_, text_of(x)); });
    tensor& values = ctx.allocate_output(0, g.out);
    tensor& indices = ctx.allocate_output(1, g.out);
    if (values.num_elements() == 0) return;
    visit_dtype(x.type(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        run<T>(ctx, x.data<T>(), values.data<T>(), indices.data<std::int64_t>(), g);
      }
    });
  }

 private:
  template <class T>
  void run(const kernel_context& ctx, const T* x, T* vals, std::int64_t* idx,
           const array_rules::topk_geometry& g) const {
    // Integers compare as int64 (exactly), floats as double; NaN above every number.
    using K = std::conditional_t<std::is_integral_v<T>, std::int64_t, double>;
    const auto above = [](K a, K b) {
      if constexpr (std::is_floating_point_v<K>) {
        if (std::isnan(a)) return !std::isnan(b);
        if (std::isnan(b)) return false;
      }
      return a > b;
    };
    const bool largest = largest_;
    const std::int64_t n = g.n;
    const std::int64_t inner = g.inner;
    const std::int64_t k = k_;
    ctx.parallel_for(g.outer * inner, static_cast<double>(n) * 8.0,
                     [&](std::int64_t begin, std::int64_t end) {
                       std::vector<std::int64_t> order(static_cast<std::size_t>(n));
                       std::vector<K> key(static_cast<std::size_t>(n));
                       for (std::int64_t line = begin; line < end; ++line) {
                         const std::int64_t base = (line / inner) * n * inner + line % inner;
                         for (std::int64_t i = 0; i < n; ++i) {
                           const T v = x[base + i * inner];
                           if constexpr (std::is_integral_v<T>) {
                             key[static_cast<std::size_t>(i)] = static_cast<K>(v);
                           } else {
                             key[static_cast<std::size_t>(i)] = to_double(v);
                           }
                         }
                         std::iota(order.begin(), order.end(), std::int64_t{0});
                         const auto first = [&](std::int64_t a, std::int64_t b) {
                           const K ka = key[static_cast<std::size_t>(a)];
                           const K kb = key[static_cast<std::size_t>(b)];
                           const bool before = largest ? above(ka, kb) : above(kb, ka);
                           const bool after = largest ? above(kb, ka) : above(ka, kb);
                           return before || (!after && a < b);
                         };
                         std::partial_sort(order.begin(), order.begin() + k, order.end(), first);
                         const std::int64_t out_base = (line / inner) * k * inner + line % inner;
                         for (std::int64_t j = 0; j < k; ++j) {
                           const std::int64_t src = order[static_cast<std::size_t>(j)];
                           vals[out_base + j * inner] = x[base + src * inner];
                           idx[out_base + j * inner] = src;
                         }
                       }
                     });
  }

  std::int64_t k_;
  std::int64_t axis_;
  bool largest_;
};

// ---- gather_elements, scatter_elements -----------------------------------------------------

// The offset in data (dense, shape ds) of each element of indices (shape is), with its
// index value `wrapped[f]` along `axis`.
std::vector<std::int64_t> element_offsets(const shape& ds, const shape& is, std::size_t axis,
                                          const std::vector<std::int64_t>& wrapped) {
  const auto st = strides_of(ds);
  std::vector<std::int64_t> off(wrapped.size());
  std::vector<std::int64_t> pos(is.rank(), 0);
  for (std::size_t f = 0; f < wrapped.size(); ++f) {
    std::int64_t o = 0;
    for (std::size_t d = 0; d < is.rank(); ++d) o += (d == axis ? wrapped[f] : pos[d]) * st[d];
    off[f] = o;
    for (std::size_t d = is.rank(); d-- > 0;) {
      if (++pos[d] < is[d]) break;
      pos[d] = 0;
    }
  }
  return off;
}

class gather_elements_kernel final : public op_kernel {
 public:
  explicit gather_elements_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const tensor data = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    const std::size_t ax = apply_rule(ctx, [&] {
      return array_rules::elements_axis(data.shape(), indices.shape(), nullptr, axis_,
                                        texts_of(ctx));
    });
    const std::int64_t n = data.dim(ax);
    const auto wrapped =
        checked_indices(ctx, indices, fmt::format("data {} along axis {}", data.describe(), ax),
                        [n](std::size_t) { return n; });
    tensor& out = ctx.allocate_output(0, indices.shape());
    if (out.num_elements() == 0) return;
    const auto off = element_offsets(data.shape(), indices.shape(), ax, wrapped);
    visit_dtype(data.type(), [&](auto tag) {
      using T = decltype(tag);
      const T* src = data.data<T>();
      T* dst = out.data<T>();
      for (std::size_t f = 0; f < off.size(); ++f) dst[f] = src[off[f]];
    });
  }

 private:
  std::int64_t axis_;
};

class scatter_elements_kernel final : public op_kernel {
 public:
  explicit scatter_elements_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")), reduction_(reduction_code(c)) {}

  void compute(kernel_context& ctx) override {
    const tensor& data = ctx.input(0);
    const tensor indices = ctx.input_contiguous(1);
    const tensor updates = ctx.input_contiguous(2);
    const std::size_t ax = apply_rule(ctx, [&] {
      const shape us = updates.shape();
      return array_rules::elements_axis(data.shape(), indices.shape(), &us, axis_, texts_of(ctx));
    });
    const std::int64_t n = data.dim(ax);
    const auto wrapped =
        checked_indices(ctx, indices, fmt::format("data {} along axis {}", data.describe(), ax),
                        [n](std::size_t) { return n; });
    tensor& out = ctx.allocate_output(0, data.shape());
    if (out.num_elements() == 0) return;
    copy_dense(ctx, data, out.raw_data());
    const auto off = element_offsets(data.shape(), indices.shape(), ax, wrapped);
    const int r = reduction_;
    visit_dtype(data.type(), [&](auto tag) {
      using T = decltype(tag);
      const T* up = updates.data<T>();
      T* dst = out.data<T>();
      for (std::size_t f = 0; f < off.size(); ++f) {
        dst[off[f]] = r == 0 ? up[f] : combine(dst[off[f]], up[f], r);
      }
    });
  }

 private:
  std::int64_t axis_;
  int reduction_;
};

// ---- gather_nd, scatter_nd -----------------------------------------------------------------

// The first element in data (dense) of the slice each index tuple picks, for
// nd_geometry g: batch b's tuples start at b * (data's elements per batch element).
std::vector<std::int64_t> tuple_offsets(kernel_context& ctx, const tensor& data,
                                        const tensor& indices, const array_rules::nd_geometry& g) {
  const auto q = static_cast<std::size_t>(g.q);
  const auto wrapped = checked_indices(ctx, indices, fmt::format("data {}", data.describe()),
                                       [&](std::size_t k) { return g.dims[k % q]; });
  std::vector<std::int64_t> dim_stride(q, g.slice);
  for (std::size_t k = q; k-- > 1;) dim_stride[k - 1] = dim_stride[k] * g.dims[k];
  const std::int64_t per_batch = (q > 0 ? dim_stride[0] * g.dims[0] : g.slice);
  std::vector<std::int64_t> off(static_cast<std::size_t>(g.batches * g.tuples));
  for (std::size_t t = 0; t < off.size(); ++t) {
    std::int64_t o = static_cast<std::int64_t>(t) / g.tuples * per_batch;
    for (std::size_t k = 0; k < q; ++k) o += wrapped[t * q + k] * dim_stride[k];
    off[t] = o;
  }
  return off;
}

class gather_nd_kernel final : public op_kernel {
 public:
  explicit gather_nd_kernel(const kernel_construction& c)
      : op_kernel(c), batch_dims_(c.attr<std::int64_t>("batch_dims")) {}

  void compute(kernel_context& ctx) override {
    const tensor data = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    const auto g = apply_rule(ctx, [&] {
      return array_rules::nd_shape(data.shape(), indices.shape(), batch_dims_, texts_of(ctx));
    });
    const auto off = tuple_offsets(ctx, data, indices, g);
    tensor& out = ctx.allocate_output(0, g.out);
    if (out.num_elements() == 0) return;
    const std::size_t bytes = static_cast<std::size_t>(g.slice) * size_of(data.type());
    const auto* src = static_cast<const std::byte*>(data.raw_data());
    auto* dst = static_cast<std::byte*>(out.raw_data());
    const std::size_t elem = size_of(data.type());
    for (std::size_t t = 0; t < off.size(); ++t) {
      std::memcpy(dst + t * bytes, src + static_cast<std::size_t>(off[t]) * elem, bytes);
    }
  }

 private:
  std::int64_t batch_dims_;
};

class scatter_nd_kernel final : public op_kernel {
 public:
  explicit scatter_nd_kernel(const kernel_construction& c)
      : op_kernel(c),
        reduction_(reduction_code(c)),
        batch_dims_(c.attr<std::int64_t>("batch_dims")) {}

  void compute(kernel_context& ctx) override {
    const tensor& data = ctx.input(0);
    const tensor indices = ctx.input_contiguous(1);
    const tensor updates = ctx.input_contiguous(2);
    const auto g = apply_rule(ctx, [&] {
      auto geometry =
          array_rules::nd_shape(data.shape(), indices.shape(), batch_dims_, texts_of(ctx));
      array_rules::check_scatter_nd_updates(geometry, updates.shape(), texts_of(ctx));
      return geometry;
    });
    const auto off = tuple_offsets(ctx, data, indices, g);
    tensor& out = ctx.allocate_output(0, data.shape());
    if (out.num_elements() == 0) return;
    copy_dense(ctx, data, out.raw_data());
    const int r = reduction_;
    const std::int64_t slice = g.slice;
    visit_dtype(data.type(), [&](auto tag) {
      using T = decltype(tag);
      const T* up = updates.data<T>();
      T* dst = out.data<T>();
      for (std::size_t t = 0; t < off.size(); ++t) {
        T* d = dst + off[t];
        const T* u = up + static_cast<std::int64_t>(t) * slice;
        for (std::int64_t e = 0; e < slice; ++e) d[e] = r == 0 ? u[e] : combine(d[e], u[e], r);
      }
    });
  }

 private:
  int reduction_;
  std::int64_t batch_dims_;
};

}  // namespace

void register_array_select_kernels(kernel_registry& r) {
  r.add(make_kernel_def<topk_kernel>("topk", cpu));
  r.add(make_kernel_def<gather_elements_kernel>("gather_elements", cpu));
  r.add(make_kernel_def<scatter_elements_kernel>("scatter_elements", cpu));
  r.add(make_kernel_def<gather_nd_kernel>("gather_nd", cpu));
  r.add(make_kernel_def<scatter_nd_kernel>("scatter_nd", cpu));
}

}  // namespace loom::cpu
