// fused_matmul and fused_conv2d on CPU: y = act(core + bias + residual) as one oneDNN
// primitive with post-ops, or the plain op's kernel and an element-wise epilogue loop.
//
// Note [fused epilogue]
// A fused node runs one oneDNN primitive (matmul or convolution_forward) whose bias argument
// is the node's bias and whose post-ops are `sum` (the residual) then `eltwise` (the
// activation), so the core's result is written once, with the epilogue applied while it
// is still in registers; the unfused graph writes and reads it back three times.
// - The residual goes through `sum` (dst = core + bias + dst), not `binary_add`: the output
//   starts as the residual, in the residual's own buffer when the node holds the only
//   reference to it (Note [buffer forwarding]), else in a copy. oneDNN 2.6 has no brgemm
//   convolution for a `binary_add` of a full-size tensor and falls back to `ref:any`,
//   while `sum` keeps the fast kernels.
// - A convolution computing in another layout (Note [blocked layouts]) takes the residual
//   reordered into that layout before it, and its output is reordered back after.
// - Where oneDNN makes no primitive (float64; float16 in oneDNN 2.6; a chain of post-ops
//   the machine's oneDNN lacks; a matmul with K = 0 or a convolution over an empty image),
//   the node runs the plain op's CPU kernel (matmul's or conv2d's, from the kernel
//   registry, made from the fused node itself, whose attributes include the plain op's),
//   then an element-wise loop adds the bias and the residual and applies the activation
//   (the functions of the relu, gelu, tanh and sigmoid kernels). Results are always those
//   of the unfused graph, up to rounding: the fused node rounds to T once, the unfused
//   graph after each op.
//
// Note [brgconv sum and eltwise]
// oneDNN 2.6's brgemm convolutions (brgconv, chosen for most float32 and bfloat16 shapes
// here) mishandle a `sum` post-op when the padding on some side is at least the filter's
// size, so that whole output rows or columns lie in the padding ({3, 5, 7, 3} * {7, 5, 1, 3}
// with padding [0, 1, 1, 0] is one): followed by an `eltwise` post-op they crash (SIGSEGV
// in the JIT code, 48 of 300 random such shapes), alone they leave the residual out of
// those rows. With paddings smaller than the filter (the common case) and with `eltwise`
// alone, 450 random shapes ran and the tests here agree with the reference. A node with a
// residual and such a padding therefore skips to oneDNN's next implementation (jit or
// gemm), which handles it.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>

#include "elementwise_math.hpp"
#include "graph/ops/nn_attrs.hpp"
#include "loom/core/half.hpp"
#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

enum class activation { none, relu, gelu, gelu_tanh, tanh, sigmoid };

activation activation_of(const kernel_construction& c) {
  const auto s = c.attr<std::string>("activation");
  if (s == "none") return activation::none;
  if (s == "relu") return activation::relu;
  if (s == "gelu") return activation::gelu;
  if (s == "gelu_tanh") return activation::gelu_tanh;
  if (s == "tanh") return activation::tanh;
  if (s == "sigmoid") return activation::sigmoid;
  c.fail("unknown activation \"" + s + "\"");
}

std::optional<dnnl::algorithm> eltwise_of(activation a) {
  switch (a) {
    case activation::relu:
      return dnnl::algorithm::eltwise_relu;  // alpha 0: max(x, 0)
    case activation::gelu:
      return dnnl::algorithm::eltwise_gelu_erf;
    case activation::gelu_tanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case activation::tanh:
      return dnnl::algorithm::eltwise_tanh;
    case activation::sigmoid:
      return dnnl::algorithm::eltwise_logistic;
    default:
      return std::nullopt;
  }
}

// The activations in the accumulation type, as the element-wise kernels compute them
// (elementwise_unary.cpp): float through the vectorisable ew:: functions, double through libm.
struct act_none {
  template <class C>
  C operator()(C x) const noexcept {
    return x;
  }
};
struct act_relu {
  template <class C>
  C operator()(C x) const noexcept {
    return x < C{0} ? C{0} : x;  // NaN passes through
  }
};
struct act_gelu {
  template <class C>
  C operator()(C x) const noexcept {
    return C{0.5} * x * std::erfc(-x * std::numbers::sqrt2_v<C> / C{2});
  }
};
struct act_gelu_tanh {
  static constexpr double k = 0.7978845608028654;  // sqrt(2 / pi)
  float operator()(float x) const noexcept {
    const float u = static_cast<float>(k) * (x + 0.044715f * x * x * x);
    return x * ew::fast_sigmoid(2.0f * u);
  }
  double operator()(double x) const noexcept {
    const double u = k * (x + 0.044715 * x * x * x);
    return x / (1.0 + std::exp(-2.0 * u));
  }
};
struct act_tanh {
  float operator()(float x) const noexcept { return ew::fast_tanh(x); }
  double operator()(double x) const noexcept { return std::tanh(x); }
};
struct act_sigmoid {
  float operator()(float x) const noexcept { return ew::fast_sigmoid(x); }
  double operator()(double x) const noexcept { return 1.0 / (1.0 + std::exp(-x)); }
};

template <class F>
void visit_activation(activation a, F&& f) {
  switch (a) {
    case activation::none:
      return f(act_none{});
    case activation::relu:
      return f(act_relu{});
    case activation::gelu:
      return f(act_gelu{});
    case activation::gelu_tanh:
      return f(act_gelu_tanh{});
    case activation::tanh:
      return f(act_tanh{});
    case activation::sigmoid:
      return f(act_sigmoid{});
  }
}

// out[p, s] = act(out[p, s] + bias[p % channels] + residual[p, s]) over `planes` planes of
// `inner` elements (a matmul's product is planes of one element, a convolution's output
// planes of OH * OW); bias and residual may be null.
template <class T, class Act>
void epilogue_loop(kernel_context& ctx, T* out, const T* bias, const T* residual,
                   std::int64_t planes, std::int64_t channels, std::int64_t inner, Act act) {
  using Acc = acc_t<T>;
  ctx.parallel_for(planes, static_cast<double>(inner) * 4.0, [&](std::int64_t lo, std::int64_t hi) {
    std::int64_t c = lo % channels;
    for (std::int64_t p = lo; p < hi; ++p) {
      T* o = out + p * inner;
      const Acc b = bias != nullptr ? widen<T>(bias[c]) : Acc{0};
      if (residual != nullptr) {
        const T* r = residual + p * inner;
        for (std::int64_t s = 0; s < inner; ++s) {
          o[s] = narrow<T>(act(widen<T>(o[s]) + b + widen<T>(r[s])));
        }
      } else {
        for (std::int64_t s = 0; s < inner; ++s) o[s] = narrow<T>(act(widen<T>(o[s]) + b));
      }
      if (++c == channels) c = 0;
    }
  });
}

// The highest-priority CPU kernel of the plain op `op` for the fused node (the fallback).
std::unique_ptr<op_kernel> plain_kernel(const kernel_construction& c, std::string_view op) {
  for (const kernel_def* k : kernel_registry::global().kernels_for(op)) {
    if (k->device == device_type::cpu && k->matches(c.node())) return k->create(c);
  }
  c.fail(fmt::format("no CPU kernel of {} for T = {}", op, to_string(c.attr<dtype>("T"))));
}

// Runs a plan whose argument count is only known at run time (3 to 5 buffers).
void execute_n(kernel_context& ctx, const onednn::plan& p, const std::vector<const void*>& d) {
  switch (d.size()) {
    case 3:
      return onednn::execute(ctx, p, {d[0], d[1], d[2]});
    case 4:
      return onednn::execute(ctx, p, {d[0], d[1], d[2], d[3]});
    default:
      return onednn::execute(ctx, p, {d[0], d[1], d[2], d[3], d[4]});
  }
}

// What fused_matmul and fused_conv2d share: the epilogue's attributes and inputs, its
// checks, its post-ops and the fallback (Note [fused epilogue]).
class fused_kernel : public op_kernel {
 public:
  // oneDNN runs on its own (OpenMP) threads, all of the device's.
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }

 protected:
  // `channel_axis`: the output dimension the bias runs along (-1: the last).
  fused_kernel(const kernel_construction& c, std::string_view plain_op, int channel_axis)
      : op_kernel(c),
        type_(c.attr<dtype>("T")),
        has_bias_(c.attr<bool>("has_bias")),
        has_residual_(c.attr<bool>("has_residual")),
        act_(activation_of(c)),
        channel_axis_(channel_axis),
        plain_(plain_kernel(c, plain_op)) {
    const std::size_t wanted = 2 + std::size_t{has_bias_} + std::size_t{has_residual_};
    if (c.node().inputs.size() != wanted) {
      c.fail(fmt::format("has {} inputs, but has_bias = {} and has_residual = {} need {}",
                         c.node().inputs.size(), has_bias_, has_residual_, wanted));
    }
  }

  [[nodiscard]] std::size_t residual_input() const noexcept { return has_bias_ ? 3 : 2; }

  // Fails unless the bias is [out[channel]] and the residual has shape `out`.
  void check_args(kernel_context& ctx, const shape& out) const {
    if (has_bias_) {
      const tensor& b = ctx.input(2);
      const std::size_t axis = channel(out);
      if (b.rank() != 1 || b.dim(0) != out[axis]) {
        ctx.fail("bias {} does not match the {} channels (dimension {}) of the output {}",
                 b.describe(), out[axis], axis, to_string(out));
      }
    }
    if (has_residual_) {
      const tensor& r = ctx.input(residual_input());
      if (r.shape() != out) {
        ctx.fail("residual {} must have the output's shape {}", r.describe(), to_string(out));
      }
    }
  }

  // The post-ops: sum for the residual, then eltwise for the activation; user scratchpad.
  [[nodiscard]] dnnl::primitive_attr primitive_attr() const {
    dnnl::primitive_attr attr = onednn::user_scratchpad_attr();
    dnnl::post_ops ops;
    if (has_residual_) ops.append_sum(1.0f);
    if (const auto alg = eltwise_of(act_)) ops.append_eltwise(1.0f, *alg, 0.0f, 0.0f);
    attr.set_post_ops(ops);
    return attr;
  }

  // Output 0 of shape `s` holding the residual, for a `sum` post-op to add onto: the
  // residual's buffer when this node may write it, else a copy.
  tensor& output_from_residual(kernel_context& ctx, const shape& s) const {
    const std::size_t r = residual_input();
    if (tensor* out = ctx.forward_input(r, 0, s)) return *out;
    const tensor residual = ctx.input_contiguous(r);
    tensor& out = ctx.allocate_output(0, s);
    const auto* src = static_cast<const std::byte*>(residual.raw_data());
    auto* dst = static_cast<std::byte*>(out.raw_data());
    constexpr std::int64_t chunk = 1 << 16;
    const auto bytes = static_cast<std::int64_t>(out.nbytes());
    ctx.parallel_for((bytes + chunk - 1) / chunk, chunk * 0.1,
                     [&](std::int64_t lo, std::int64_t hi) {
                       const std::int64_t end = std::min(bytes, hi * chunk);
                       std::memcpy(dst + lo * chunk, src + lo * chunk,
                                   static_cast<std::size_t>(end - lo * chunk));
                     });
    return out;
  }

  // The plain op's kernel, then the epilogue over its output.
  void run_plain(kernel_context& ctx) const {
    plain_->compute(ctx);
    tensor out = ctx.output(0);
    if (out.num_elements() == 0 || (!has_bias_ && !has_residual_ && act_ == activation::none)) {
      return;
    }
    const shape& s = out.shape();
    const std::size_t axis = channel(s);
    std::int64_t inner = 1;
    for (std::size_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
    const tensor bias = has_bias_ ? ctx.input_contiguous(2) : tensor();
    const tensor residual = has_residual_ ? ctx.input_contiguous(residual_input()) : tensor();
    const auto run = [&](auto tag) {
      using T = decltype(tag);
      visit_activation(act_, [&](auto act) {
        epilogue_loop<T>(ctx, out.data<T>(), has_bias_ ? bias.data<T>() : nullptr,
                         has_residual_ ? residual.data<T>() : nullptr, out.num_elements() / inner,
                         s[axis], inner, act);
      });
    };
    switch (type_) {
      case dtype::f32:
        return run(float{});
      case dtype::f64:
        return run(double{});
      case dtype::f16:
        return run(half{});
      case dtype::bf16:
        return run(bfloat16{});
      default:
        ctx.fail("{} has no kernel for {}", node().op(), to_string(type_));
    }
  }

  dtype type_;
  bool has_bias_;
  bool has_residual_;
  activation act_;

 private:
  [[nodiscard]] std::size_t channel(const shape& out) const noexcept {
    return channel_axis_ < 0 ? out.rank() - 1 : static_cast<std::size_t>(channel_axis_);
  }

  int channel_axis_;
  std::unique_ptr<op_kernel> plain_;
};

// ---- fused_matmul -------------------------------------------------------------------------

// A dense input seen as oneDNN takes it: the output's rank (leading dimensions of 1, which
// oneDNN broadcasts), the transpose as swapped strides, size-1 dimensions given the strides
// of a dense layout (as matmul's kernel does, nn_matmul.cpp).
struct operand {
  shape dims;
  shape strides;
};

operand view_of(const tensor& x, bool transposed, std::size_t rank) {
  const shape dense = contiguous_strides(x.shape());
  operand v{shape::filled(rank, 1), shape::filled(rank, 0)};
  const std::size_t lead = rank - x.rank();
  for (std::size_t i = 0; i < x.rank(); ++i) {
    v.dims[lead + i] = x.dim(i);
    v.strides[lead + i] = dense[i];
  }
  if (transposed) {
    std::swap(v.dims[rank - 1], v.dims[rank - 2]);
    std::swap(v.strides[rank - 1], v.strides[rank - 2]);
  }
  std::int64_t size = 1;
  for (std::size_t i = rank; i-- > 0;) {
    if (v.dims[i] == 1) v.strides[i] = size;
    size *= v.dims[i];
  }
  return v;
}

class fused_matmul_kernel final : public fused_kernel {
 public:
  explicit fused_matmul_kernel(const kernel_construction& c)
      : fused_kernel(c, "matmul", -1),
        transpose_a_(c.attr<bool>("transpose_a")),
        transpose_b_(c.attr<bool>("transpose_b")) {}

  void compute(kernel_context& ctx) override {
    const tensor& a = ctx.input(0);
    const tensor& b = ctx.input(1);
    const auto [out_shape, k] = matmul_dims_of(ctx, a, b, transpose_a_, transpose_b_);
    check_args(ctx, out_shape);
    if (out_shape.num_elements() == 0) {
      ctx.allocate_output(0, out_shape);
      return;
    }
    const auto dt = onednn::data_type_of(type_);
    if (k > 0 && dt && !onednn_lacks_type_.load(std::memory_order_relaxed)) {
      if (run_onednn(ctx, out_shape, *dt)) return;
      // float32 oneDNN always has; for the others, later calls go straight to the fallback.
      if (type_ != dtype::f32) onednn_lacks_type_.store(true, std::memory_order_relaxed);
    }
    run_plain(ctx);
  }

 private:
  bool run_onednn(kernel_context& ctx, const shape& out_shape, dnnl::memory::data_type dt) {
    const tensor a = ctx.input_contiguous(0);
    const tensor b = ctx.input_contiguous(1);
    const std::size_t rank = out_shape.rank();
    const operand va = view_of(a, transpose_a_, rank);
    const operand vb = view_of(b, transpose_b_, rank);
    const int threads = ctx.num_threads();
    onednn::primitive_cache::key key;
    key.reserve(3 + 5 * rank);
    key.push_back(static_cast<std::int64_t>(type_));
    key.push_back(threads);
    key.push_back(static_cast<std::int64_t>(rank));
    for (const shape* v : {&va.dims, &va.strides, &vb.dims, &vb.strides, &out_shape}) {
      key.insert(key.end(), v->begin(), v->end());
    }
    const auto plan = cache_.get(key, [&] {
      onednn::use_threads(threads);
      const auto md = [dt](const shape& dims, const shape& strides) {
        return dnnl::memory::desc(onednn::dims_of(dims.dims()), dt,
                                  onednn::dims_of(strides.dims()));
      };
      const dnnl::memory::desc src_md = md(va.dims, va.strides);
      const dnnl::memory::desc wei_md = md(vb.dims, vb.strides);
      const dnnl::memory::desc dst_md = md(out_shape, contiguous_strides(out_shape));
      // [1, ..., 1, N]: one bias per column, broadcast over the rows and batches.
      shape bias_dims = shape::filled(rank, 1);
      bias_dims[rank - 1] = out_shape[rank - 1];
      const dnnl::memory::desc bias_md = md(bias_dims, contiguous_strides(bias_dims));
      const dnnl::matmul::desc desc = has_bias_
                                          ? dnnl::matmul::desc(src_md, wei_md, bias_md, dst_md)
                                          : dnnl::matmul::desc(src_md, wei_md, dst_md);
      const dnnl::matmul::primitive_desc pd(desc, primitive_attr(), onednn::engine());
      std::vector<onednn::arg_desc> args{{DNNL_ARG_SRC, src_md}, {DNNL_ARG_WEIGHTS, wei_md}};
      if (has_bias_) args.push_back({DNNL_ARG_BIAS, bias_md});
      args.push_back({DNNL_ARG_DST, dst_md});
      return onednn::make_plan<dnnl::matmul>(pd, std::move(args));
    });
    if (!plan->primitive) return false;
    const tensor bias = has_bias_ ? ctx.input_contiguous(2) : tensor();
    tensor& out =
        has_residual_ ? output_from_residual(ctx, out_shape) : ctx.allocate_output(0, out_shape);
    std::vector<const void*> data{a.raw_data(), b.raw_data()};
    if (has_bias_) data.push_back(bias.raw_data());
    data.push_back(out.raw_data());
    execute_n(ctx, *plan, data);
    return true;
  }

  bool transpose_a_;
  bool transpose_b_;
  onednn::primitive_cache cache_;
  std::atomic<bool> onednn_lacks_type_{false};
};

// ---- fused_conv2d -------------------------------------------------------------------------

class fused_conv2d_kernel final : public fused_kernel {
 public:
  explicit fused_conv2d_kernel(const kernel_construction& c)
      : fused_kernel(c, "conv2d", 1), groups_(c.attr<std::int64_t>("groups")) {
    const auto s = c.attr<std::vector<std::int64_t>>("strides");
    const auto d = c.attr<std::vector<std::int64_t>>("dilations");
    stride_ = {s.at(0), s.at(1)};
    dilation_ = {d.at(0), d.at(1)};
    pad_ = nn_attrs::padding4(c.attr<std::vector<std::int64_t>>("padding"));
  }

  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    const tensor& w = ctx.input(1);
    if (x.rank() != 4 || w.rank() != 4) {
      ctx.fail("conv2d needs an NCHW input and an OIHW filter of rank 4, got {} and {}",
               x.describe(), w.describe());
    }
    geometry g{x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0),
               w.dim(1), w.dim(2), w.dim(3), 0,        0};
    if (g.c != g.cg * groups_ || g.o % groups_ != 0 || g.kh == 0 || g.kw == 0) {
      ctx.fail("filter {} does not fit input {} in {} groups", w.describe(), x.describe(), groups_);
    }
    g.oh = nn_attrs::window_out_size(g.h, g.kh, stride_[0], dilation_[0], pad_[0], pad_[1]);
    g.ow = nn_attrs::window_out_size(g.w, g.kw, stride_[1], dilation_[1], pad_[2], pad_[3]);
    if (g.oh < 0 || g.ow < 0) {
      ctx.fail("the filter {} is larger than the padded input {}", w.describe(), x.describe());
    }
    const shape out_shape{g.n, g.o, g.oh, g.ow};
    check_args(ctx, out_shape);
    if (out_shape.num_elements() == 0) {
      ctx.allocate_output(0, out_shape);
      return;
    }
    const auto dt = onednn::data_type_of(type_);
    // An empty image or no channels per group: the core is zeros, which the plain kernel
    // writes without oneDNN.
    if (dt && g.cg > 0 && g.h > 0 && g.w > 0 && run_onednn(ctx, g, out_shape, *dt)) return;
    run_plain(ctx);
  }

 private:
  struct geometry {
    std::int64_t n, c, h, w;     // input
    std::int64_t o, cg, kh, kw;  // filter
    std::int64_t oh, ow;         // output
  };

  // Plans in reorder_cache_: the residual into the primitive's layout, and the output back.
  enum role : std::int64_t { residual_in = 0, output_out = 1 };

  bool run_onednn(kernel_context& ctx, const geometry& g, const shape& out_shape,
                  dnnl::memory::data_type dt) {
    using tag = dnnl::memory::format_tag;
    const int threads = ctx.num_threads();
    const onednn::primitive_cache::key key{
        static_cast<std::int64_t>(type_), threads, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw};
    const dnnl::memory::desc dst_md({g.n, g.o, g.oh, g.ow}, dt, tag::nchw);
    const auto plan = cache_.get(key, [&] {
      onednn::use_threads(threads);
      const dnnl::memory::desc src_md({g.n, g.c, g.h, g.w}, dt, tag::nchw);
      const dnnl::memory::desc wei_md =
          groups_ == 1
              ? dnnl::memory::desc({g.o, g.cg, g.kh, g.kw}, dt, tag::oihw)
              : dnnl::memory::desc({groups_, g.o / groups_, g.cg, g.kh, g.kw}, dt, tag::goihw);
      const dnnl::memory::desc bias_md({g.o}, dt, tag::x);
      // oneDNN picks the layouts it computes fastest in (Note [blocked layouts]).
      const auto any = [](const dnnl::memory::desc& md) {
        return dnnl::memory::desc(md.dims(), md.data_type(), tag::any);
      };
      const dnnl::memory::dims strides{stride_[0], stride_[1]};
      const dnnl::memory::dims dilations{dilation_[0] - 1, dilation_[1] - 1};
      const dnnl::memory::dims pad_l{pad_[0], pad_[2]};
      const dnnl::memory::dims pad_r{pad_[1], pad_[3]};
      const auto prop = dnnl::prop_kind::forward_inference;
      const auto alg = dnnl::algorithm::convolution_direct;
      const dnnl::convolution_forward::desc desc =
          has_bias_
              ? dnnl::convolution_forward::desc(prop, alg, any(src_md), any(wei_md), bias_md,
                                                any(dst_md), strides, dilations, pad_l, pad_r)
              : dnnl::convolution_forward::desc(prop, alg, any(src_md), any(wei_md), any(dst_md),
                                                strides, dilations, pad_l, pad_r);
      dnnl::convolution_forward::primitive_desc pd(desc, primitive_attr(), onednn::engine());
      if (has_residual_ &&
          (pad_[0] >= g.kh || pad_[1] >= g.kh || pad_[2] >= g.kw || pad_[3] >= g.kw)) {
        // Note [brgconv sum and eltwise]: the next implementation, or none.
        while (std::string_view(pd.impl_info_str()).starts_with("brg")) {
          if (!pd.next_impl()) throw dnnl::error(dnnl_unimplemented, "only brgconv");
        }
      }
      std::vector<onednn::arg_desc> args{{DNNL_ARG_SRC, src_md, pd.src_desc()},
                                         {DNNL_ARG_WEIGHTS, wei_md, pd.weights_desc()}};
      if (has_bias_) args.push_back({DNNL_ARG_BIAS, bias_md, pd.bias_desc()});
      // With a residual the destination is a buffer in the primitive's own layout, which
      // starts as the residual (reordered by the kernel); otherwise loom's output,
      // reordered back by execute() when the layouts differ.
      if (has_residual_) {
        args.push_back({DNNL_ARG_DST, pd.dst_desc()});
      } else {
        args.push_back({DNNL_ARG_DST, dst_md, pd.dst_desc(), true});
      }
      return onednn::make_plan<dnnl::convolution_forward>(pd, std::move(args));
    });
    if (!plan->primitive) return false;
    const tensor x = ctx.input_contiguous(0);
    const tensor w = ctx.input_contiguous(1);
    const tensor bias = has_bias_ ? ctx.input_contiguous(2) : tensor();
    std::vector<const void*> data{x.raw_data(), w.raw_data()};
    if (has_bias_) data.push_back(bias.raw_data());
    if (!has_residual_) {
      data.push_back(ctx.allocate_output(0, out_shape).raw_data());
      execute_n(ctx, *plan, data);
      return true;
    }
    const dnnl::memory::desc& inner = plan->args.back().md;
    if (inner == dst_md) {  // the primitive writes NCHW: onto the residual in the output
      data.push_back(output_from_residual(ctx, out_shape).raw_data());
      execute_n(ctx, *plan, data);
      return true;
    }
    const auto reorder = [&](role r) {
      onednn::primitive_cache::key k = key;
      k.push_back(r);
      return reorder_cache_.get(k, [&] {
        onednn::use_threads(threads);
        const dnnl::memory::desc& from = r == residual_in ? dst_md : inner;
        const dnnl::memory::desc& to = r == residual_in ? inner : dst_md;
        const dnnl::reorder::primitive_desc pd(onednn::engine(), from, onednn::engine(), to,
                                               onednn::user_scratchpad_attr());
        return onednn::make_plan<dnnl::reorder>(pd, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
      });
    };
    const auto in = reorder(residual_in);
    const auto back = reorder(output_out);
    if (!in->primitive || !back->primitive) return false;
    const tensor staged =
        ctx.allocate_temp(dtype::u8, shape{static_cast<std::int64_t>(inner.get_size())});
    {
      const tensor residual = ctx.input_contiguous(residual_input());
      onednn::execute(ctx, *in, {residual.raw_data(), staged.raw_data()});
    }
    // The residual is read: the output may take its buffer.
    tensor& out = ctx.forward_input_or_allocate_output(residual_input(), 0, out_shape);
    data.push_back(staged.raw_data());
    execute_n(ctx, *plan, data);
    onednn::execute(ctx, *back, {staged.raw_data(), out.raw_data()});
    return true;
  }

  std::int64_t groups_;
  std::array<std::int64_t, 2> stride_{};
  std::array<std::int64_t, 2> dilation_{};
  std::array<std::int64_t, 4> pad_{};
  onednn::primitive_cache cache_;
  onednn::primitive_cache reorder_cache_;
};

}  // namespace

void register_nn_fused_kernels(kernel_registry& r) {
  r.add(make_kernel_def<fused_matmul_kernel>(
      "fused_matmul", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "onednn"));
  r.add(make_kernel_def<fused_conv2d_kernel>(
      "fused_conv2d", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "onednn"));
}

}  // namespace loom::cpu
