// CUDA kernels of the array ops: reshape, squeeze, expand_dims, transpose, concat, split,
// slice, pad, gather, gather_grad, one_hot and broadcast_to. The device code is in
// kernels/array.cu.
//
// Views are the CPU's (Note [array views] in src/backends/cpu/array_kernels.cpp): reshape of a
// contiguous input, squeeze, expand_dims, broadcast_to, a transpose whose permuted view is
// dense and split pieces that are contiguous blocks share the input's buffer and launch
// nothing. Everything else is a strided copy on the compute stream (launch_copy: both sides
// strided, so concat writes each input straight into its place in the output).
//
// Checks, messages and dtypes are the CPU kernels'. Each kernel makes its checks on the
// inputs' shapes before it touches CUDA (launch_scope), so a bad node fails alike on both
// devices; checks of index values are not made on the GPU (Note [cuda value checks] in
// elementwise_kernels.cpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/elementwise_convert.hpp"
#include "kernels/array.cuh"

namespace loom::cuda {
namespace {

constexpr device_type gpu_type = device_type::cuda;
using ints = std::vector<std::int64_t>;
using constraints = std::vector<std::pair<std::string, std::vector<dtype>>>;

std::vector<dtype> all_types() {
  return {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,   dtype::i32,
          dtype::i64, dtype::i8,  dtype::u8,  dtype::boolean};
}

template <class K>
kernel_def cuda_def(std::string op, constraints c) {
  return make_kernel_def<K>(std::move(op), gpu_type, std::move(c), "cuda");
}

// Wraps a possibly negative axis into [0, rank), or fails naming the node.
std::size_t axis_in(const kernel_context& ctx, std::int64_t axis, const tensor& t) {
  const auto rank = static_cast<std::int64_t>(t.rank());
  if (axis < -rank || axis >= rank) {
    ctx.fail("axis {} is outside [{}, {}) for {}", axis, -rank, rank, t.describe());
  }
  return static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
}

// The bits of `v` converted to T as one_hot's values and pad's constant are (wrap_from_double,
// as on CPU), in the low bytes.
std::uint64_t element_bits(dtype t, double v) {
  std::uint64_t bits = 0;
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T e = ew::wrap_from_double<T>(v);
    std::memcpy(&bits, &e, sizeof(T));
  });
  return bits;
}

// ---- strided copies --------------------------------------------------------------------------

// The copy layout of `dims` from src_strides to dst_strides: size-1 dimensions dropped,
// neighbours merged where both sides step through them as through one (Note [strided copy]
// in src/backends/cpu/array_copy.hpp); flat when both sides are then dense.
kernels::ew_layout copy_layout(const kernel_context& ctx, const shape& dims,
                               const shape& src_strides, const shape& dst_strides) {
  kernels::ew_layout l;
  l.count = dims.num_elements();
  shape d;
  shape s;
  shape t;
  for (std::size_t k = 0; k < dims.rank(); ++k) {
    const std::int64_t n = dims[k];
    if (n == 1) continue;
    const std::size_t r = d.rank();
    if (r > 0 && s[r - 1] == src_strides[k] * n && t[r - 1] == dst_strides[k] * n) {
      d[r - 1] *= n;
      s[r - 1] = src_strides[k];
      t[r - 1] = dst_strides[k];
    } else {
      d.push_back(n);
      s.push_back(src_strides[k]);
      t.push_back(dst_strides[k]);
    }
  }
  if (d.rank() == 0 || (d.rank() == 1 && s[0] == 1 && t[0] == 1)) {
    l.flat[0] = 1;
    l.flat[1] = 1;
    return l;
  }
  if (d.rank() > static_cast<std::size_t>(kernels::ew_max_dims)) {
    ctx.fail("the CUDA copy kernel takes at most {} dimensions after merging; {} has {}",
             kernels::ew_max_dims, to_string(dims), d.rank());
  }
  l.rank = static_cast<int>(d.rank());
  for (std::size_t k = 0; k < d.rank(); ++k) {
    l.dims[k] = d[k];
    l.strides[0][k] = s[k];
    l.strides[1][k] = t[k];
  }
  return l;
}

// Copies the elements of `src` (on the device, any strides) to dst, whose element (i0, ...)
// is at dst + Σ ik·dst_strides[k].
void copy_to(kernel_context& ctx, const launch_scope& scope, const tensor& src, void* dst,
             const shape& dst_strides) {
  if (src.num_elements() == 0) return;
  const auto layout = copy_layout(ctx, src.shape(), src.strides(), dst_strides);
  if (!kernels::launch_copy(size_of(src.type()), src.raw_data(), dst, layout, scope.stream)) {
    ctx.fail("cannot copy {}", src.describe());
  }
  check_launch(ctx, "copy");
}

// Sets output i to a new dense tensor holding the elements of `view`.
void output_dense_copy(kernel_context& ctx, const launch_scope& scope, std::size_t i,
                       const tensor& view) {
  tensor& out = ctx.allocate_output(i, view.shape());
  copy_to(ctx, scope, view, out.raw_data(), out.strides());
}

// ---- shape ops -------------------------------------------------------------------------------

class reshape_kernel final : public op_kernel {
 public:
  explicit reshape_kernel(const kernel_construction& c)
      : op_kernel(c), target_(c.attr<ints>("shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const shape out = resolve(ctx, in);
    if (in.is_contiguous()) return ctx.set_output(0, in.reshaped(out));
    launch_scope scope(ctx);
    tensor& dense = ctx.allocate_output(0, out);
    copy_to(ctx, scope, in, dense.raw_data(), contiguous_strides(in.shape()));
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
    launch_scope scope(ctx);
    output_dense_copy(ctx, scope, 0, view);
  }

 private:
  ints perm_;
};

class broadcast_to_kernel final : public op_kernel {
 public:
  explicit broadcast_to_kernel(const kernel_construction& c)
      : op_kernel(c), target_(c.attr<shape>("shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    if (in.rank() > target_.rank()) {
      ctx.fail("cannot broadcast {} to {}: the target has fewer dimensions", in.describe(),
               to_string(target_));
    }
    const std::size_t lead = target_.rank() - in.rank();
    shape strides = shape::filled(target_.rank(), 0);
    for (std::size_t d = 0; d < in.rank(); ++d) {
      const std::int64_t want = target_[lead + d];
      if (in.dim(d) == want) {
        strides[lead + d] = in.strides()[d];
      } else if (in.dim(d) != 1) {
        ctx.fail("cannot broadcast {} to {}: dimension {} is {}, not 1 or {}", in.describe(),
                 to_string(target_), d, in.dim(d), want);
      }
    }
    ctx.set_output(0, tensor::strided(in.buf(), in.type(), target_, strides, in.offset()));
  }

 private:
  shape target_;
};

// ---- concat, split, slice, pad ---------------------------------------------------------------

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
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, out_shape);
    if (out.num_elements() == 0) return;
    // Each input straight into its place: the output's strides from the input's first
    // position along the axis.
    const std::size_t elem = size_of(out.type());
    const std::int64_t inner = out.strides()[ax];  // elements after the axis
    auto* dst = static_cast<std::byte*>(out.raw_data());
    std::int64_t at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const tensor& in = ctx.input(i);
      copy_to(ctx, scope, in, dst + static_cast<std::size_t>(at * inner) * elem, out.strides());
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
    std::optional<launch_scope> scope;  // made for the first piece that needs a copy
    std::int64_t at = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      shape s = in.shape();
      s[ax] = pieces[k];
      const tensor view = tensor::strided(in.buf(), in.type(), s, in.strides(),
                                          in.offset() + at * in.strides()[ax]);
      at += pieces[k];
      if (view.is_contiguous()) {
        ctx.set_output(k, view);
      } else {
        if (!scope) scope.emplace(ctx);
        output_dense_copy(ctx, *scope, k, view);
      }
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
    launch_scope scope(ctx);
    if (s.num_elements() == 0) {
      ctx.allocate_output(0, s);
      return;
    }
    output_dense_copy(ctx, scope, 0, tensor::strided(in.buf(), in.type(), s, in.strides(), offset));
  }

 private:
  ints begin_;
  ints size_;
};

class pad_kernel final : public op_kernel {
 public:
  explicit pad_kernel(const kernel_construction& c)
      : op_kernel(c),
        paddings_(c.attr<ints>("paddings")),
        constant_(c.attr<double>("constant_value")) {}

  void compute(kernel_context& ctx) override {
    const tensor& in = ctx.input(0);
    const std::size_t rank = in.rank();
    if (paddings_.size() != 2 * rank) {
      ctx.fail("paddings [{}] has {} entries for the rank-{} input {}: it needs 2 per dimension",
               fmt::join(paddings_, ", "), paddings_.size(), rank, in.describe());
    }
    if (std::all_of(paddings_.begin(), paddings_.end(), [](auto p) { return p == 0; })) {
      if (in.is_contiguous()) return ctx.set_output(0, in);
      launch_scope scope(ctx);
      return output_dense_copy(ctx, scope, 0, in);
    }
    if (rank > static_cast<std::size_t>(kernels::pad_max_dims)) {
      ctx.fail("the CUDA pad kernel takes at most {} dimensions; {} has {}", kernels::pad_max_dims,
               in.describe(), rank);
    }
    shape s = in.shape();
    for (std::size_t d = 0; d < rank; ++d) s[d] += paddings_[2 * d] + paddings_[2 * d + 1];
    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, s);
    if (out.num_elements() == 0) return;
    kernels::pad_layout l;
    l.rank = static_cast<int>(rank);
    l.count = out.num_elements();
    for (std::size_t d = 0; d < rank; ++d) {
      l.out_dims[d] = s[d];
      l.in_dims[d] = in.dim(d);
      l.before[d] = paddings_[2 * d];
      l.in_strides[d] = in.strides()[d];
    }
    if (!kernels::launch_pad(size_of(in.type()), in.raw_data(), out.raw_data(),
                             element_bits(in.type(), constant_), l, scope.stream)) {
      ctx.fail("pad does not take {}", to_string(in.type()));
    }
    check_launch(ctx, "pad");
  }

 private:
  ints paddings_;
  double constant_;
};

// ---- gather, one_hot, gather_grad ------------------------------------------------------------

class gather_kernel final : public op_kernel {
 public:
  explicit gather_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const tensor& p = ctx.input(0);
    const auto rank = static_cast<std::int64_t>(p.rank());
    if (rank == 0) ctx.fail("params must have rank >= 1, got {}", p.describe());
    if (axis_ < -rank || axis_ >= rank) {
      ctx.fail("axis {} is outside [{}, {}) for params {}", axis_, -rank, rank, p.describe());
    }
    const auto ax = static_cast<std::size_t>(axis_ < 0 ? axis_ + rank : axis_);
    shape out_shape;
    std::int64_t outer = 1;
    std::int64_t inner = 1;
    for (std::size_t d = 0; d < ax; ++d) {
      out_shape.push_back(p.dim(d));
      outer *= p.dim(d);
    }
    for (auto d : ctx.input(1).shape().dims()) out_shape.push_back(d);
    for (std::size_t d = ax + 1; d < p.rank(); ++d) {
      out_shape.push_back(p.dim(d));
      inner *= p.dim(d);
    }
    launch_scope scope(ctx);
    const tensor params = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    tensor& out = ctx.allocate_output(0, out_shape);
    if (out.num_elements() == 0) return;
    if (!kernels::launch_gather(size_of(params.type()), indices.type() == dtype::i64,
                                params.raw_data(), indices.raw_data(), out.raw_data(), outer,
                                params.dim(ax), inner, indices.num_elements(), scope.stream)) {
      ctx.fail("gather does not take {}", to_string(params.type()));
    }
    check_launch(ctx, "gather");
  }

 private:
  std::int64_t axis_;
};

class one_hot_kernel final : public op_kernel {
 public:
  explicit one_hot_kernel(const kernel_construction& c)
      : op_kernel(c),
        depth_(c.attr<std::int64_t>("depth")),
        axis_(c.attr<std::int64_t>("axis")),
        on_(c.attr<double>("on_value")),
        off_(c.attr<double>("off_value")) {}

  void compute(kernel_context& ctx) override {
    const tensor& idx = ctx.input(0);
    const auto rank = static_cast<std::int64_t>(idx.rank());
    if (axis_ < -1 || axis_ > rank) {
      ctx.fail("axis {} is outside [-1, {}] for indices {}", axis_, rank, idx.describe());
    }
    const auto at = static_cast<std::size_t>(axis_ == -1 ? rank : axis_);
    shape out_shape;
    std::int64_t prefix = 1;
    std::int64_t suffix = 1;
    for (std::size_t d = 0; d < idx.rank(); ++d) {
      if (d == at) out_shape.push_back(depth_);
      out_shape.push_back(idx.dim(d));
      (d < at ? prefix : suffix) *= idx.dim(d);
    }
    if (at == idx.rank()) out_shape.push_back(depth_);
    launch_scope scope(ctx);
    const tensor indices = ctx.input_contiguous(0);
    tensor& out = ctx.allocate_output(0, out_shape);
    if (out.num_elements() == 0) return;
    const dtype t = out.type();
    if (!kernels::launch_one_hot(size_of(t), indices.type() == dtype::i64, indices.raw_data(),
                                 out.raw_data(), prefix, depth_, suffix, element_bits(t, on_),
                                 element_bits(t, off_), scope.stream)) {
      ctx.fail("one_hot does not make {}", to_string(t));
    }
    check_launch(ctx, "one_hot");
  }

 private:
  std::int64_t depth_;
  std::int64_t axis_;
  double on_;
  double off_;
};

class gather_grad_kernel final : public op_kernel {
 public:
  explicit gather_grad_kernel(const kernel_construction& c)
      : op_kernel(c),
        axis_(c.attr<std::int64_t>("axis")),
        params_shape_(c.attr<shape>("params_shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& dy_in = ctx.input(0);
    const tensor& idx_in = ctx.input(1);
    shape ps = params_shape_;
    const auto rank = static_cast<std::int64_t>(ps.rank());
    if (axis_ < -rank || axis_ >= rank) {
      ctx.fail("axis {} is outside [{}, {}) for params_shape {}", axis_, -rank, rank,
               to_string(ps));
    }
    const auto ax = static_cast<std::size_t>(axis_ < 0 ? axis_ + rank : axis_);
    const std::size_t k = idx_in.rank();
    // dy must be gather's output: ps[:ax] + indices.shape + ps[ax+1:].
    const auto mismatch = [&] {
      ctx.fail("dy {} is not gather's output for params_shape {}, indices {} and axis {}",
               dy_in.describe(), to_string(params_shape_), idx_in.describe(), ax);
    };
    if (dy_in.rank() != ps.rank() - 1 + k) mismatch();
    for (std::size_t d = 0; d < ps.rank(); ++d) {
      if (d == ax) continue;
      const std::int64_t have = dy_in.dim(d < ax ? d : d - 1 + k);
      if (ps[d] < 0) ps[d] = have;
      if (ps[d] != have) mismatch();
    }
    for (std::size_t j = 0; j < k; ++j) {
      if (dy_in.dim(ax + j) != idx_in.dim(j)) mismatch();
    }
    if (ps[ax] < 0) {
      ctx.fail("params_shape {} leaves the gathered dimension {} unknown", to_string(ps), ax);
    }
    if (dy_in.type() == dtype::boolean) ctx.fail("gather_grad has no kernel for bool");
    std::int64_t outer = 1;
    std::int64_t inner = 1;
    for (std::size_t d = 0; d < ax; ++d) outer *= ps[d];
    for (std::size_t d = ax + 1; d < ps.rank(); ++d) inner *= ps[d];
    const std::int64_t n = ps[ax];
    const std::int64_t count = idx_in.num_elements();

    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, ps);
    if (out.num_elements() == 0) return;
    if (count == 0) {  // nothing was gathered: zeros
      LOOM_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), scope.stream));
      return;
    }
    const tensor dy = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    const std::size_t bytes = kernels::gather_grad_scratch_bytes(count, n);
    const tensor scratch = ctx.allocate_temp(dtype::u8, {static_cast<std::int64_t>(bytes)});
    LOOM_CUDA_CHECK(kernels::launch_gather_grad(
        static_cast<kernels::elem_type>(static_cast<int>(dy.type())), indices.type() == dtype::i64,
        dy.raw_data(), indices.raw_data(), out.raw_data(), outer, n, inner, count,
        scratch.raw_data(), bytes, scope.stream));
    check_launch(ctx, "gather_grad");
  }

 private:
  std::int64_t axis_;
  shape params_shape_;
};

}  // namespace

void register_array_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(cuda_def<reshape_kernel>("reshape", any));
  r.add(cuda_def<squeeze_kernel>("squeeze", any));
  r.add(cuda_def<expand_dims_kernel>("expand_dims", any));
  r.add(cuda_def<transpose_kernel>("transpose", any));
  r.add(cuda_def<concat_kernel>("concat", any));
  r.add(cuda_def<split_kernel>("split", any));
  r.add(cuda_def<slice_kernel>("slice", any));
  r.add(cuda_def<pad_kernel>("pad", any));
  r.add(cuda_def<broadcast_to_kernel>("broadcast_to", any));
  r.add(cuda_def<gather_kernel>("gather",
                                {{"T", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
  r.add(cuda_def<one_hot_kernel>("one_hot",
                                 {{"dtype", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
  r.add(cuda_def<gather_grad_kernel>(
      "gather_grad", {{"T",
                       {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64,
                        dtype::i8, dtype::u8}},
                      {"Tindices", {dtype::i32, dtype::i64}}}));
}

}  // namespace loom::cuda
