// The CUDA backend's array kernels: the kernels every backend shares
// (src/kernel/common/array_kernels.hpp: reshape, transpose, split, slice, concat, pad, gather,
// gather_grad, one_hot; array_layout_kernels.hpp: tile, flip, strided_slice) over the CUDA
// device work below, and gather_elements and gather_nd (a dense copy, concat's join, the
// fills of pad and one_hot, gather's take, gather_grad's sum), and the family's registration.
// The CPU's counterparts are in src/backends/cpu/array_kernels.cpp, array_index_kernels.cpp
// and array_grad_kernels.cpp; the device code is in kernels/array.cu. squeeze, expand_dims and
// broadcast_to are views registered once for every device
// (src/kernel/common/neutral_kernels.cpp).
//
// Views are the CPU's (Note [array views] in src/kernel/common/array_views.hpp): reshape of
// a contiguous input, a transpose whose permuted view is dense and split pieces that are
// contiguous blocks share the input's buffer and launch nothing. Everything else is a
// strided copy on the compute stream (launch_copy: both sides strided, so concat writes each
// input straight into its place in the output).
//
// Shapes, checks and messages are the op rules' (loom/graph/ops/array_rules.hpp), which the
// CPU kernels call too. Each kernel applies them to the inputs' shapes before it touches CUDA
// (launch_scope), so a bad node fails alike on both devices; checks of index values are not
// made on the GPU (Note [cuda value checks] in elementwise_kernels.cpp).
#include "kernel/common/array_kernels.hpp"

#include <cstring>
#include <utility>

#include "cuda_check.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "kernel/common/array_layout_kernels.hpp"
#include "kernel/common/array_views.hpp"
#include "kernel/common/elementwise_convert.hpp"
#include "kernels/array.cuh"
#include "loom/graph/ops/array_rules.hpp"

namespace loom::cuda {
namespace {

constexpr device_type gpu_type = device_type::cuda;
using ints = std::vector<std::int64_t>;
using constraints = std::vector<std::pair<std::string, std::vector<dtype>>>;

template <class K>
kernel_def cuda_def(std::string op, constraints c = {}) {
  return make_kernel_def<K>(std::move(op), gpu_type, std::move(c), "cuda");
}

// The bits of `v` converted to T as one_hot's values and pad's constant are (CPU:
// ew::wrap_from_double, kernel/common/elementwise_convert.hpp), in the low bytes.
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

// The dense copy of the array kernels every backend shares (src/kernel/common/
// array_kernels.hpp): made where a kernel is about to copy, it opens the launch scope there;
// each call sets output i to a new dense tensor of shape `out` holding src's elements.
class dense_copy {
 public:
  explicit dense_copy(kernel_context& ctx) : ctx_(ctx), scope_(ctx) {}
  void operator()(std::size_t i, const tensor& src, const shape& out) {
    tensor& dense = ctx_.allocate_output(i, out);
    copy_to(ctx_, scope_, src, dense.raw_data(), contiguous_strides(src.shape()));
  }

 private:
  kernel_context& ctx_;
  launch_scope scope_;
};

// ---- concat, pad: the device work of the shared kernels ------------------------------------

// concat's join (src/kernel/common/array_kernels.hpp): each input straight into its place,
// the output's strides from the input's first position along the axis.
class concat_join {
 public:
  explicit concat_join(kernel_context& ctx) : ctx_(ctx) {}
  void operator()(const common::concat_plan& plan) {
    launch_scope scope(ctx_);
    tensor& out = ctx_.allocate_output(0, plan.out);
    if (out.num_elements() == 0) return;
    const std::size_t elem = size_of(out.type());
    const std::int64_t inner = out.strides()[plan.axis];  // elements after the axis
    auto* dst = static_cast<std::byte*>(out.raw_data());
    std::int64_t at = 0;
    for (std::size_t i = 0; i < ctx_.num_inputs(); ++i) {
      const tensor& in = ctx_.input(i);
      copy_to(ctx_, scope, in, dst + static_cast<std::size_t>(at * inner) * elem, out.strides());
      at += in.dim(plan.axis);
    }
  }

 private:
  kernel_context& ctx_;
};

// pad's fill (src/kernel/common/array_kernels.hpp): launch_pad, for up to pad_max_dims
// dimensions.
class pad_fill {
 public:
  explicit pad_fill(kernel_context& ctx) : ctx_(ctx) {}
  void operator()(const tensor& in, const shape& s, const common::pad_attrs& a) {
    const std::size_t rank = in.rank();
    if (rank > static_cast<std::size_t>(kernels::pad_max_dims)) {
      ctx_.fail("the CUDA pad kernel takes at most {} dimensions; {} has {}", kernels::pad_max_dims,
                in.describe(), rank);
    }
    launch_scope scope(ctx_);
    tensor& out = ctx_.allocate_output(0, s);
    if (out.num_elements() == 0) return;
    kernels::pad_layout l;
    l.rank = static_cast<int>(rank);
    l.count = out.num_elements();
    for (std::size_t d = 0; d < rank; ++d) {
      l.out_dims[d] = s[d];
      l.in_dims[d] = in.dim(d);
      l.before[d] = a.paddings[2 * d];
      l.in_strides[d] = in.strides()[d];
    }
    if (!kernels::launch_pad(size_of(in.type()), in.raw_data(), out.raw_data(),
                             element_bits(in.type(), a.constant), l, scope.stream)) {
      ctx_.fail("pad does not take {}", to_string(in.type()));
    }
    check_launch(ctx_, "pad");
  }

 private:
  kernel_context& ctx_;
};

// ---- gather, one_hot, gather_grad: the device work of the shared kernels -----------------

// gather's take (src/kernel/common/array_kernels.hpp); indices out of range gather zeros.
class gather_take {
 public:
  explicit gather_take(kernel_context& ctx) : ctx_(ctx) {}
  void operator()(const array_rules::gather_geometry& g, bool wrap_negative) {
    launch_scope scope(ctx_);
    const tensor params = ctx_.input_contiguous(0);
    const tensor indices = ctx_.input_contiguous(1);
    tensor& out = ctx_.allocate_output(0, g.out);
    if (out.num_elements() == 0) return;
    if (!kernels::launch_gather(size_of(params.type()), indices.type() == dtype::i64, wrap_negative,
                                params.raw_data(), indices.raw_data(), out.raw_data(), g.outer, g.n,
                                g.inner, indices.num_elements(), scope.stream)) {
      ctx_.fail("gather does not take {}", to_string(params.type()));
    }
    check_launch(ctx_, "gather");
  }

 private:
  kernel_context& ctx_;
};

// one_hot's fill (src/kernel/common/array_kernels.hpp).
class one_hot_fill {
 public:
  explicit one_hot_fill(kernel_context& ctx) : ctx_(ctx) {}
  void operator()(const array_rules::one_hot_geometry& g, const common::one_hot_attrs& a) {
    launch_scope scope(ctx_);
    const tensor indices = ctx_.input_contiguous(0);
    tensor& out = ctx_.allocate_output(0, g.out);
    if (out.num_elements() == 0) return;
    const dtype t = out.type();
    if (!kernels::launch_one_hot(size_of(t), indices.type() == dtype::i64, indices.raw_data(),
                                 out.raw_data(), g.prefix, a.depth, g.suffix, element_bits(t, a.on),
                                 element_bits(t, a.off), scope.stream)) {
      ctx_.fail("one_hot does not make {}", to_string(t));
    }
    check_launch(ctx_, "one_hot");
  }

 private:
  kernel_context& ctx_;
};

// gather_grad's sum (src/kernel/common/array_kernels.hpp); indices out of range add nothing.
class gather_grad_sum {
 public:
  explicit gather_grad_sum(kernel_context& ctx) : ctx_(ctx) {}
  void operator()(const array_rules::gather_geometry& g) {
    kernel_context& ctx = ctx_;
    if (ctx.input(0).type() == dtype::boolean) ctx.fail("gather_grad has no kernel for bool");
    const std::int64_t count = ctx.input(1).num_elements();

    launch_scope scope(ctx);
    tensor& out = ctx.allocate_output(0, g.out);
    if (out.num_elements() == 0) return;
    if (count == 0) {  // nothing was gathered: zeros
      LOOM_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), scope.stream));
      return;
    }
    const tensor dy = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    const std::size_t bytes = kernels::gather_grad_scratch_bytes(count, g.n);
    const tensor scratch = ctx.allocate_temp(dtype::u8, {static_cast<std::int64_t>(bytes)});
    LOOM_CUDA_CHECK(kernels::launch_gather_grad(
        static_cast<kernels::elem_type>(static_cast<int>(dy.type())), indices.type() == dtype::i64,
        dy.raw_data(), indices.raw_data(), out.raw_data(), g.outer, g.n, g.inner, count,
        scratch.raw_data(), bytes, scope.stream));
    check_launch(ctx, "gather_grad");
  }

 private:
  kernel_context& ctx_;
};

// ---- gather_elements, gather_nd ------------------------------------------------------------

// The inputs' descriptions for the rules' messages.
auto texts_of(const kernel_context& ctx) {
  return [&ctx](std::size_t i) { return ctx.input(i).describe(); };
}

// gather_elements: the op rule, then one thread per output element (indices are not checked
// on the GPU: one out of range gives zero bits).
class gather_elements_kernel final : public op_kernel {
 public:
  explicit gather_elements_kernel(const kernel_construction& c)
      : op_kernel(c), axis_(c.attr<std::int64_t>("axis")) {}

  void compute(kernel_context& ctx) override {
    const std::size_t ax = common::apply_rule(ctx, [&] {
      return array_rules::elements_axis(ctx.input(0).shape(), ctx.input(1).shape(), nullptr, axis_,
                                        texts_of(ctx));
    });
    if (ctx.input(0).rank() > static_cast<std::size_t>(kernels::select_max_dims)) {
      ctx.fail("the CUDA gather_elements takes at most {} dimensions", kernels::select_max_dims);
    }
    launch_scope scope(ctx);
    const tensor data = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    tensor& out = ctx.allocate_output(0, indices.shape());
    if (out.num_elements() == 0) return;
    kernels::elements_layout l;
    l.rank = static_cast<int>(data.rank());
    l.axis = static_cast<int>(ax);
    l.count = out.num_elements();
    l.n = data.dim(ax);
    for (std::size_t d = 0; d < data.rank(); ++d) {
      l.dims[d] = indices.dim(d);
      l.data_strides[d] = data.strides()[d];
    }
    if (!kernels::launch_gather_elements(size_of(data.type()), indices.type() == dtype::i64,
                                         data.raw_data(), indices.raw_data(), out.raw_data(), l,
                                         scope.stream)) {
      ctx.fail("gather_elements does not take {}", to_string(data.type()));
    }
    check_launch(ctx, "gather_elements");
  }

 private:
  std::int64_t axis_;
};

// gather_nd: the op rule, then one thread per output element.
class gather_nd_kernel final : public op_kernel {
 public:
  explicit gather_nd_kernel(const kernel_construction& c)
      : op_kernel(c), batch_dims_(c.attr<std::int64_t>("batch_dims")) {}

  void compute(kernel_context& ctx) override {
    const auto g = common::apply_rule(ctx, [&] {
      return array_rules::nd_shape(ctx.input(0).shape(), ctx.input(1).shape(), batch_dims_,
                                   texts_of(ctx));
    });
    if (g.q > kernels::select_max_dims) {
      ctx.fail("the CUDA gather_nd takes index tuples of at most {} entries",
               kernels::select_max_dims);
    }
    launch_scope scope(ctx);
    const tensor data = ctx.input_contiguous(0);
    const tensor indices = ctx.input_contiguous(1);
    tensor& out = ctx.allocate_output(0, g.out);
    if (out.num_elements() == 0) return;
    kernels::nd_layout l;
    l.q = static_cast<int>(g.q);
    l.tuples = g.tuples;
    l.slice = g.slice;
    l.count = out.num_elements();
    std::int64_t stride = g.slice;
    for (std::int64_t k = g.q; k-- > 0;) {
      l.dims[k] = g.dims[static_cast<std::size_t>(k)];
      l.dim_strides[k] = stride;
      stride *= l.dims[k];
    }
    l.batch_stride = stride;
    if (!kernels::launch_gather_nd(size_of(data.type()), indices.type() == dtype::i64,
                                   data.raw_data(), indices.raw_data(), out.raw_data(), l,
                                   scope.stream)) {
      ctx.fail("gather_nd does not take {}", to_string(data.type()));
    }
    check_launch(ctx, "gather_nd");
  }

 private:
  std::int64_t batch_dims_;
};

}  // namespace

void register_array_kernels(kernel_registry& r) {
  const auto any = type_constraint(all_types());
  r.add(cuda_def<common::reshape_kernel<dense_copy>>("reshape", any));
  r.add(cuda_def<common::transpose_kernel<dense_copy>>("transpose", any));
  r.add(cuda_def<common::concat_kernel<concat_join>>("concat", any));
  r.add(cuda_def<common::split_kernel<dense_copy>>("split", any));
  r.add(cuda_def<common::slice_kernel<dense_copy>>("slice", any));
  r.add(cuda_def<common::pad_kernel<dense_copy, pad_fill>>("pad", any));
  r.add(cuda_def<common::gather_kernel<gather_take>>(
      "gather", {{"T", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
  r.add(cuda_def<common::one_hot_kernel<one_hot_fill>>(
      "one_hot", {{"dtype", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
  // The op's dtypes: T numeric (no bool), Tindices int32 or int64.
  r.add(cuda_def<common::gather_grad_kernel<gather_grad_sum>>("gather_grad"));
  // tile, flip, strided_slice: strided views of the input, copied dense.
  r.add(cuda_def<common::tile_kernel<dense_copy>>("tile", any));
  r.add(cuda_def<common::flip_kernel<dense_copy>>("flip", any));
  r.add(cuda_def<common::strided_slice_kernel<dense_copy>>("strided_slice", any));
  r.add(cuda_def<gather_elements_kernel>(
      "gather_elements", {{"T", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
  r.add(cuda_def<gather_nd_kernel>("gather_nd",
                                   {{"T", all_types()}, {"Tindices", {dtype::i32, dtype::i64}}}));
}

}  // namespace loom::cuda
