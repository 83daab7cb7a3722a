// CPU kernels of the array ops: reshape, squeeze, expand_dims, transpose, concat, split and
// slice here; gather and one_hot in array_index_kernels.cpp. The data movement is
// strided_copy (Note [strided copy] in array_copy.hpp).
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
// dimensions) and report mismatches with ctx.fail, naming the node.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include "array_copy.hpp"
#include "cpu_kernels.hpp"

namespace loom::cpu {

// Defined in array_index_kernels.cpp: gather, one_hot.
void register_array_index_kernels(kernel_registry& registry);
// Defined in array_grad_kernels.cpp: pad, gather_grad, broadcast_to.
void register_array_grad_kernels(kernel_registry& registry);

namespace {

constexpr device_type cpu = device_type::cpu;
using ints = std::vector<std::int64_t>;

std::vector<dtype> all_types() {
  return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,   dtype::i32,
          dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
}

// Wraps a possibly negative axis into [0, rank), or fails naming the node.
std::size_t axis_in(const kernel_context& ctx, std::int64_t axis, const tensor& t) {
  const auto rank = static_cast<std::int64_t>(t.rank());
  if (axis < -rank || axis >= rank) {
    ctx.fail("axis {} is outside [{}, {}) for {}", axis, -rank, rank, t.describe());
  }
  return static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
}

class reshape_kernel final : public op_kernel {
 public:
  explicit reshape_kernel(const kernel_construction& c)
      : op_kernel(c), target_(c.attr<ints>("shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape out = resolve(ctx, in);
    if (in.is_contiguous()) return ctx.set_output(0, in.reshaped(out));
    tensor& dense = ctx.allocate_output(0, out);
    copy_dense(ctx, in, dense.raw_data());
  }

 private:
  shape resolve(const kernel_context& ctx, const tensor& in) const {
    shape out(target_);
    const std::int64_t n = in.num_elements();
    std::int64_t known = 1;
    std::ptrdiff_t infer_at = -1;
    for (std::size_t i = 0; i < target_.size(); ++i) {
      if (target_[i] < 0)
        infer_at = static_cast<std::ptrdiff_t>(i);
      else
        known *= target_[i];
    }
    bool ok = infer_at < 0 ? known == n : known != 0 && n % known == 0;
    if (ok && infer_at >= 0) out[static_cast<std::size_t>(infer_at)] = n / known;
    if (!ok) {
      ctx.fail("cannot reshape {} ({} elements) to [{}]", in.describe(), n,
               fmt::join(target_, ", "));
    }
    return out;
  }

  ints target_;
};

class squeeze_kernel final : public op_kernel {
 public:
  explicit squeeze_kernel(const kernel_construction& c)
      : op_kernel(c), axes_(c.attr<ints>("axes")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    std::vector<bool> drop(in.rank(), false);
    if (axes_.empty()) {
      for (std::size_t d = 0; d < in.rank(); ++d) drop[d] = in.dim(d) == 1;
    }
    for (auto a : axes_) {
      const std::size_t d = axis_in(ctx, a, in);
      if (in.dim(d) != 1) {
        ctx.fail("cannot squeeze dimension {} of {}: its size is {}, not 1", d, in.describe(),
                 in.dim(d));
      }
      drop[d] = true;
    }
    shape s;
    shape strides;
    for (std::size_t d = 0; d < in.rank(); ++d) {
      if (drop[d]) continue;
      s.push_back(in.dim(d));
      strides.push_back(in.strides()[d]);
    }
    ctx.set_output(0, tensor::strided(in.buf(), in.type(), s, strides, in.offset()));
  }

 private:
  ints axes_;
};

class expand_dims_kernel final : public op_kernel {
 public:
  explicit expand_dims_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const auto rank = static_cast<std::int64_t>(in.rank());
    if (axis_ < -rank - 1 || axis_ > rank) {
      ctx.fail("axis {} is outside [{}, {}] for {}", axis_, -rank - 1, rank, in.describe());
    }
    const auto at = static_cast<std::size_t>(axis_ < 0 ? axis_ + rank + 1 : axis_);
    shape s;
    shape strides;
    for (std::size_t d = 0; d <= in.rank(); ++d) {
      if (d == at) {
        // Any stride serves a dimension of size 1; this one keeps dense views dense.
        s.push_back(1);
        strides.push_back(d < in.rank() ? in.strides()[d] * in.dim(d) : 1);
      }
      if (d < in.rank()) {
        s.push_back(in.dim(d));
        strides.push_back(in.strides()[d]);
      }
    }
    ctx.set_output(0, tensor::strided(in.buf(), in.type(), s, strides, in.offset()));
  }

 private:
  std::int64_t axis_;
};

class transpose_kernel final : public op_kernel {
 public:
  explicit transpose_kernel(const kernel_construction& c)
      : op_kernel(c), perm_(c.attr<ints>("perm")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const std::size_t rank = in.rank();
    if (!perm_.empty() && perm_.size() != rank) {
      ctx.fail("perm [{}] has {} entries for the rank-{} input {}", fmt::join(perm_, ", "),
               perm_.size(), rank, in.describe());
    }
    shape s = shape::filled(rank, 0);
    shape strides = shape::filled(rank, 0);
    for (std::size_t i = 0; i < rank; ++i) {
      const auto p = perm_.empty() ? rank - 1 - i : static_cast<std::size_t>(perm_[i]);
      s[i] = in.dim(p);
      strides[i] = in.strides()[p];
    }
    const tensor view = tensor::strided(in.buf(), in.type(), s, strides, in.offset());
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
    if (first.rank() == 0) ctx.fail("cannot concatenate scalars (input 0 is {})", first.describe());
    const std::size_t ax = axis_in(ctx, axis_, first);
    shape out_shape = first.shape();
    out_shape[ax] = 0;
    bool all_dense = true;
    for (std::size_t i = 0; i < n; ++i) {
      const tensor& in = ctx.input(i);
      bool fits = in.rank() == first.rank();
      for (std::size_t d = 0; fits && d < in.rank(); ++d)
        fits = d == ax || in.dim(d) == first.dim(d);
      if (!fits) {
        ctx.fail("input {} is {} but input 0 is {}: only dimension {} may differ", i, in.describe(),
                 first.describe(), ax);
      }
      out_shape[ax] += in.dim(ax);
      all_dense = all_dense && in.is_contiguous();
    }
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
    if (in.rank() == 0) ctx.fail("cannot split a scalar ({})", in.describe());
    const std::size_t ax = axis_in(ctx, axis_, in);
    const ints pieces = piece_sizes(ctx, in, ax);
    std::int64_t at = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      shape s = in.shape();
      s[ax] = pieces[k];
      const tensor view = tensor::strided(in.buf(), in.type(), s, in.strides(),
                                          in.offset() + at * in.strides()[ax]);
      at += pieces[k];
      if (view.is_contiguous())
        ctx.set_output(k, view);
      else
        output_dense_copy(ctx, k, view);
    }
  }

 private:
  ints piece_sizes(const kernel_context& ctx, const tensor& in, std::size_t ax) const {
    const std::int64_t dim = in.dim(ax);
    if (sizes_.empty()) {
      if (dim % num_splits_ != 0) {
        ctx.fail("dimension {} of {} (size {}) does not split into {} equal pieces", ax,
                 in.describe(), dim, num_splits_);
      }
      return ints(static_cast<std::size_t>(num_splits_), dim / num_splits_);
    }
    ints pieces = sizes_;
    std::int64_t known = 0;
    std::ptrdiff_t rest_at = -1;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i] < 0)
        rest_at = static_cast<std::ptrdiff_t>(i);
      else
        known += pieces[i];
    }
    if (rest_at >= 0 ? known > dim : known != dim) {
      ctx.fail("sizes [{}] do not add up to dimension {} of {} (size {})", fmt::join(sizes_, ", "),
               ax, in.describe(), dim);
    }
    if (rest_at >= 0) pieces[static_cast<std::size_t>(rest_at)] = dim - known;
    return pieces;
  }

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
    if (begin_.size() != in.rank() || size_.size() != in.rank()) {
      ctx.fail("begin [{}] and size [{}] do not have the rank of {}", fmt::join(begin_, ", "),
               fmt::join(size_, ", "), in.describe());
    }
    shape s = shape::filled(in.rank(), 0);
    std::int64_t offset = in.offset();
    for (std::size_t d = 0; d < in.rank(); ++d) {
      const std::int64_t end = size_[d] < 0 ? in.dim(d) : begin_[d] + size_[d];
      if (begin_[d] > in.dim(d) || end > in.dim(d)) {
        ctx.fail("begin [{}] size [{}] reaches outside {} in dimension {} ({} > {})",
                 fmt::join(begin_, ", "), fmt::join(size_, ", "), in.describe(), d,
                 std::max(begin_[d], end), in.dim(d));
      }
      s[d] = end - begin_[d];
      offset += begin_[d] * in.strides()[d];
    }
    if (s.num_elements() == 0) {
      ctx.allocate_output(0, s);
      return;
    }
    output_dense_copy(ctx, 0, tensor::strided(in.buf(), in.type(), s, in.strides(), offset));
  }

 private:
  ints begin_;
  ints size_;
};

}  // namespace

void register_array_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(make_kernel_def<reshape_kernel>("reshape", cpu, any));
  r.add(make_kernel_def<squeeze_kernel>("squeeze", cpu, any));
  r.add(make_kernel_def<expand_dims_kernel>("expand_dims", cpu, any));
  r.add(make_kernel_def<transpose_kernel>("transpose", cpu, any));
  r.add(make_kernel_def<concat_kernel>("concat", cpu, any));
  r.add(make_kernel_def<split_kernel>("split", cpu, any));
  r.add(make_kernel_def<slice_kernel>("slice", cpu, any));
  register_array_index_kernels(r);
  register_array_grad_kernels(r);
}

}  // namespace loom::cpu
