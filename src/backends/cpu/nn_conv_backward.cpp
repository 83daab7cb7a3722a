// The gradients of conv2d on CPU: conv2d_backprop_input (dx) and conv2d_backprop_filter
// (dw), and conv_transpose2d, which is conv2d_backprop_input with its output shape from its
// own rule. float32 and bfloat16 run oneDNN's convolution_backward_data / _weights on the
// tensors' own NCHW / OIHW layouts (no reorder), with the forward primitive descriptor as
// the hint oneDNN asks for; float64, float16 and whatever oneDNN cannot do on the machine
// run reference loops. Note [oneDNN integration] (nn_onednn.hpp) says how primitives are
// cached and fed.
//
// Both reference loops give every output element to one task, which sums its terms in a
// fixed order and rounds once: no atomics, and the result does not depend on the thread
// count.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "kernel/common/apply_rule.hpp"
#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

// dx[n, ci] = sum over the filters o of ci's group, the window (i, j) and the outputs
// (oy, ox) whose window reads (iy, ix) of dy[n, o, oy, ox] * w[o, ci % cg, i, j].
// One task per input plane.
template <class T>
void reference_backprop_input(const kernel_context& ctx, const T* dy, const T* w, T* dx,
                              const conv_geometry& g) {
  using Acc = acc_t<T>;
  const std::int64_t plane = g.h * g.w;
  const std::int64_t per_group = g.o / g.groups;
  const double cost = static_cast<double>(per_group * g.kh * g.kw * g.oh * g.ow) + 1.0;
  ctx.parallel_for(g.n * g.c, cost, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<Acc> acc(static_cast<std::size_t>(plane));
    for (std::int64_t p = lo; p < hi; ++p) {
      const std::int64_t n = p / g.c;
      const std::int64_t ci = p % g.c;
      const std::int64_t group = ci / g.cg;
      std::fill(acc.begin(), acc.end(), Acc{0});
      for (std::int64_t o = group * per_group; o < (group + 1) * per_group; ++o) {
        const T* grad = dy + (n * g.o + o) * g.oh * g.ow;
        const T* filt = w + (o * g.cg + ci % g.cg) * g.kh * g.kw;
        for (std::int64_t i = 0; i < g.kh; ++i) {
          for (std::int64_t j = 0; j < g.kw; ++j) {
            const Acc wv = widen<T>(filt[i * g.kw + j]);
            const std::int64_t shift = j * g.dilation[1] - g.pad[2];  // ix = ox * sw + shift
            const auto [ox_lo, ox_hi] = ox_range(g, shift);
            for (std::int64_t oy = 0; oy < g.oh; ++oy) {
              const std::int64_t iy = oy * g.stride[0] - g.pad[0] + i * g.dilation[0];
              if (iy < 0 || iy >= g.h) continue;
              const T* grow = grad + oy * g.ow;
              Acc* arow = acc.data() + iy * g.w;
              for (std::int64_t ox = ox_lo; ox < ox_hi; ++ox) {
                arow[ox * g.stride[1] + shift] += wv * widen<T>(grow[ox]);
              }
            }
          }
        }
      }
      T* dst = dx + p * plane;
      for (std::int64_t k = 0; k < plane; ++k) dst[k] = narrow<T>(acc[static_cast<std::size_t>(k)]);
    }
  });
}

// dw[o, c, i, j] = sum over n and the outputs (oy, ox) of dy[n, o, oy, ox] *
// x[n, group(o) * cg + c, iy, ix]. One task per (o, c): its kh x kw window.
template <class T>
void reference_backprop_filter(const kernel_context& ctx, const T* x, const T* dy, T* dw,
                               const conv_geometry& g) {
  using Acc = acc_t<T>;
  const std::int64_t per_group = g.o / g.groups;
  const std::int64_t window = g.kh * g.kw;
  const double cost = static_cast<double>(g.n * window * g.oh * g.ow) + 1.0;
  ctx.parallel_for(g.o * g.cg, cost, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<Acc> acc(static_cast<std::size_t>(window));
    for (std::int64_t t = lo; t < hi; ++t) {
      const std::int64_t o = t / g.cg;
      const std::int64_t ci = (o / per_group) * g.cg + t % g.cg;
      std::fill(acc.begin(), acc.end(), Acc{0});
      for (std::int64_t n = 0; n < g.n; ++n) {
        const T* in = x + (n * g.c + ci) * g.h * g.w;
        const T* grad = dy + (n * g.o + o) * g.oh * g.ow;
        for (std::int64_t i = 0; i < g.kh; ++i) {
          for (std::int64_t j = 0; j < g.kw; ++j) {
            const std::int64_t shift = j * g.dilation[1] - g.pad[2];
            const auto [ox_lo, ox_hi] = ox_range(g, shift);
            Acc sum{0};
            for (std::int64_t oy = 0; oy < g.oh; ++oy) {
              const std::int64_t iy = oy * g.stride[0] - g.pad[0] + i * g.dilation[0];
              if (iy < 0 || iy >= g.h) continue;
              const T* grow = grad + oy * g.ow;
              const T* irow = in + iy * g.w;
              for (std::int64_t ox = ox_lo; ox < ox_hi; ++ox) {
                sum += widen<T>(grow[ox]) * widen<T>(irow[ox * g.stride[1] + shift]);
              }
            }
            acc[static_cast<std::size_t>(i * g.kw + j)] += sum;
          }
        }
      }
      T* dst = dw + t * window;
      for (std::int64_t k = 0; k < window; ++k)
        dst[k] = narrow<T>(acc[static_cast<std::size_t>(k)]);
    }
  });
}

// What both gradient kernels share: conv2d's attributes, the checks of the geometry, and
// the oneDNN descriptors of the forward convolution.
class conv_backward_kernel : public op_kernel {
 public:
  // oneDNN runs on its own (OpenMP) threads, all of the device's.
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }

 protected:
  explicit conv_backward_kernel(const kernel_construction& c)
      : op_kernel(c), type_(c.attr<dtype>("T")), window_(conv_window_of(c)) {}

  // The geometry of x_shape * filter_shape (both resolved, rank 4), checked against dy.
  // `given` says where the shapes came from, for messages.
  conv_geometry geometry(const kernel_context& ctx, const shape& xs, const shape& ws,
                         const tensor& dy, const std::string& given) const {
    const conv_geometry g = nn_rules::conv2d_geometry(xs, ws, window_);
    if (!g.fits()) ctx.fail("{} do not fit each other in {} groups", given, g.groups);
    if (g.oh < 0 || g.ow < 0) ctx.fail("{}: the filter is larger than the padded input", given);
    const shape expected = g.output_shape();
    if (dy.shape() != expected) {
      ctx.fail("dy {} does not match the forward output {} of {}", dy.describe(),
               to_string(expected), given);
    }
    return g;
  }

  // The key of a oneDNN plan: what the primitive depends on besides the attributes.
  [[nodiscard]] onednn::primitive_cache::key key_of(const conv_geometry& g, int threads) const {
    return {static_cast<std::int64_t>(type_), threads, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw};
  }

  struct descriptors {
    dnnl::memory::desc src, wei, dst;
    dnnl::convolution_forward::primitive_desc forward;  // the hint of the backward ones
  };

  [[nodiscard]] descriptors describe(const conv_geometry& g, dnnl::memory::data_type dt) const {
    using tag = dnnl::memory::format_tag;
    descriptors d;
    d.src = dnnl::memory::desc({g.n, g.c, g.h, g.w}, dt, tag::nchw);
    d.wei = g.groups == 1
                ? dnnl::memory::desc({g.o, g.cg, g.kh, g.kw}, dt, tag::oihw)
                : dnnl::memory::desc({g.groups, g.o / g.groups, g.cg, g.kh, g.kw}, dt, tag::goihw);
    d.dst = dnnl::memory::desc({g.n, g.o, g.oh, g.ow}, dt, tag::nchw);
    const dnnl::convolution_forward::desc forward(
        dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, any(d.src),
        any(d.wei), any(d.dst), strides(), dilates(), padding_l(), padding_r());
    d.forward = dnnl::convolution_forward::primitive_desc(forward, onednn::engine());
    return d;
  }

  // The same descriptor with the layout left to oneDNN (Note [blocked layouts]).
  static dnnl::memory::desc any(const dnnl::memory::desc& md) {
    return dnnl::memory::desc(md.dims(), md.data_type(), dnnl::memory::format_tag::any);
  }

  [[nodiscard]] dnnl::memory::dims strides() const {
    return {window_.stride[0], window_.stride[1]};
  }
  // oneDNN counts dilation from 0 (no dilation), loom from 1.
  [[nodiscard]] dnnl::memory::dims dilates() const {
    return {window_.dilation[0] - 1, window_.dilation[1] - 1};
  }
  [[nodiscard]] dnnl::memory::dims padding_l() const { return {window_.pad[0], window_.pad[2]}; }
  [[nodiscard]] dnnl::memory::dims padding_r() const { return {window_.pad[1], window_.pad[3]}; }

  static void zero(tensor& t) { std::memset(t.raw_data(), 0, t.nbytes()); }

  dtype type_;
  nn_rules::conv_window window_;
  onednn::primitive_cache cache_;
};

void require_rank4(const kernel_context& ctx, const tensor& t, const char* what) {
  if (t.rank() != 4) ctx.fail("{} must have rank 4, got {}", what, t.describe());
}

// -1 dimensions of a shape attribute resolved from the inputs (`from`, -1 where they cannot
// say); fails naming the attribute when one stays unknown.
shape resolve(const kernel_context& ctx, const char* attr, shape s, const shape& from) {
  for (std::size_t d = 0; d < s.rank(); ++d) {
    if (s[d] < 0) s[d] = from[d];
    if (s[d] < 0) {
      ctx.fail("{} {} leaves dimension {} unknown, and the inputs do not determine it", attr,
               to_string(s), d);
    }
  }
  return s;
}

// What conv2d_backprop_input and conv_transpose2d share: dx of a resolved shape from dy
// (input 0) and the filter (input 1), by oneDNN's backward-data or the reference loop.
class backprop_input_kernel : public conv_backward_kernel {
 protected:
  using conv_backward_kernel::conv_backward_kernel;

  // dx of shape xs (rank 4, every dimension known); `op` names the op in messages.
  void run(kernel_context& ctx, const shape& xs, const char* op) {
    const tensor& dyin = ctx.input(0);
    const tensor& win = ctx.input(1);
    const conv_geometry g =
        geometry(ctx, xs, win.shape(), dyin,
                 fmt::format("input_shape {} and filter {}", to_string(xs), win.describe()));
    tensor& dx = ctx.allocate_output(0, xs);
    if (dx.num_elements() == 0) return;
    if (dyin.num_elements() == 0) return zero(dx);  // no filters: nothing flows back
    const tensor dy = ctx.input_contiguous(0);
    const tensor w = ctx.input_contiguous(1);
    if (const auto dt = onednn::data_type_of(type_); dt && run_onednn(ctx, dy, w, dx, g, *dt)) {
      return;
    }
    visit_float_type(ctx, type_, op, [&](auto tag) {
      using T = decltype(tag);
      reference_backprop_input<T>(ctx, dy.data<T>(), w.data<T>(), dx.data<T>(), g);
    });
  }

 private:
  bool run_onednn(kernel_context& ctx, const tensor& dy, const tensor& w, tensor& dx,
                  const conv_geometry& g, dnnl::memory::data_type dt) {
    const int threads = ctx.num_threads();
    const auto plan = cache_.get(key_of(g, threads), [&] {
      onednn::use_threads(threads);
      const descriptors d = describe(g, dt);
      const dnnl::convolution_backward_data::desc desc(
          dnnl::algorithm::convolution_direct, any(d.src), any(d.wei), any(d.dst), strides(),
          dilates(), padding_l(), padding_r());
      const dnnl::convolution_backward_data::primitive_desc pd(desc, onednn::user_scratchpad_attr(),
                                                               onednn::engine(), d.forward);
      return onednn::make_plan<dnnl::convolution_backward_data>(
          pd, {{DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc()},
               {DNNL_ARG_WEIGHTS, d.wei, pd.weights_desc()},
               {DNNL_ARG_DIFF_SRC, d.src, pd.diff_src_desc(), true}});
    });
    if (!plan->primitive) return false;
    onednn::execute(ctx, *plan, {dy.raw_data(), w.raw_data(), dx.raw_data()});
    return true;
  }
};

class conv2d_backprop_input_kernel final : public backprop_input_kernel {
 public:
  explicit conv2d_backprop_input_kernel(const kernel_construction& c)
      : backprop_input_kernel(c), input_shape_(c.attr<shape>("input_shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& dyin = ctx.input(0);
    const tensor& win = ctx.input(1);
    require_rank4(ctx, dyin, "dy");
    require_rank4(ctx, win, "the filter");
    const shape xs = resolve(ctx, "input_shape", input_shape_,
                             shape{dyin.dim(0), win.dim(1) * window_.groups, -1, -1});
    run(ctx, xs, "conv2d_backprop_input");
  }

 private:
  shape input_shape_;
};

// conv_transpose2d(x, w): conv2d_backprop_input of x by w, its output shape from the rule.
// x plays dy, and ONNX's filter layout [C_in, C_out / groups, kH, kW] is conv2d's
// [O, C / groups, kH, kW] of the conv2d whose gradient this is.
class conv_transpose2d_kernel final : public backprop_input_kernel {
 public:
  explicit conv_transpose2d_kernel(const kernel_construction& c)
      : backprop_input_kernel(c),
        output_padding_(c.attr<std::vector<std::int64_t>>("output_padding")) {}

  void compute(kernel_context& ctx) override {
    const tensor& x = ctx.input(0);
    const tensor& w = ctx.input(1);
    const shape ys = common::apply_rule(ctx, [&] {
      return nn_rules::conv_transpose2d_output(x, w, window_,
                                               {output_padding_.at(0), output_padding_.at(1)});
    });
    run(ctx, ys, "conv_transpose2d");
  }

 private:
  std::vector<std::int64_t> output_padding_;
};

class conv2d_backprop_filter_kernel final : public conv_backward_kernel {
 public:
  explicit conv2d_backprop_filter_kernel(const kernel_construction& c)
      : conv_backward_kernel(c), filter_shape_(c.attr<shape>("filter_shape")) {}

  void compute(kernel_context& ctx) override {
    const tensor& xin = ctx.input(0);
    const tensor& dyin = ctx.input(1);
    require_rank4(ctx, xin, "the input");
    require_rank4(ctx, dyin, "dy");
    const std::int64_t groups = window_.groups;
    const std::int64_t cg = xin.dim(1) % groups == 0 ? xin.dim(1) / groups : -1;
    const shape ws = resolve(ctx, "filter_shape", filter_shape_, shape{dyin.dim(1), cg, -1, -1});
    const conv_geometry g =
        geometry(ctx, xin.shape(), ws, dyin,
                 fmt::format("input {} and filter_shape {}", xin.describe(), to_string(ws)));
    tensor& dw = ctx.allocate_output(0, ws);
    if (dw.num_elements() == 0) return;
    if (dyin.num_elements() == 0 || g.h == 0 || g.w == 0) return zero(dw);  // an empty sum
    const tensor x = ctx.input_contiguous(0);
    const tensor dy = ctx.input_contiguous(1);
    if (const auto dt = onednn::data_type_of(type_); dt && run_onednn(ctx, x, dy, dw, g, *dt)) {
      return;
    }
    visit_float_type(ctx, type_, "conv2d_backprop_filter", [&](auto tag) {
      using T = decltype(tag);
      reference_backprop_filter<T>(ctx, x.data<T>(), dy.data<T>(), dw.data<T>(), g);
    });
  }

 private:
  bool run_onednn(kernel_context& ctx, const tensor& x, const tensor& dy, tensor& dw,
                  const conv_geometry& g, dnnl::memory::data_type dt) {
    const int threads = ctx.num_threads();
    const auto plan = cache_.get(key_of(g, threads), [&] {
      onednn::use_threads(threads);
      const descriptors d = describe(g, dt);
      const dnnl::convolution_backward_weights::desc desc(
          dnnl::algorithm::convolution_direct, any(d.src), any(d.wei), any(d.dst), strides(),
          dilates(), padding_l(), padding_r());
      const dnnl::convolution_backward_weights::primitive_desc pd(
          desc, onednn::user_scratchpad_attr(), onednn::engine(), d.forward);
      return onednn::make_plan<dnnl::convolution_backward_weights>(
          pd, {{DNNL_ARG_SRC, d.src, pd.src_desc()},
               {DNNL_ARG_DIFF_DST, d.dst, pd.diff_dst_desc()},
               {DNNL_ARG_DIFF_WEIGHTS, d.wei, pd.diff_weights_desc(), true}});
    });
    if (!plan->primitive) return false;
    onednn::execute(ctx, *plan, {x.raw_data(), dy.raw_data(), dw.raw_data()});
    return true;
  }

  shape filter_shape_;
};

}  // namespace

void register_nn_conv_backward_kernels(kernel_registry& r) {
  const auto floats = type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16});
  r.add(onednn::with_emulated_reason(make_kernel_def<conv2d_backprop_input_kernel>("conv2d_backprop_input", device_type::cpu,
                                                      floats, "onednn")));
  r.add(onednn::with_emulated_reason(make_kernel_def<conv2d_backprop_filter_kernel>("conv2d_backprop_filter", device_type::cpu,
                                                       floats, "onednn")));
  r.add(onednn::with_emulated_reason(make_kernel_def<conv_transpose2d_kernel>("conv_transpose2d", device_type::cpu, floats,
                                                 "onednn")));
}

}  // namespace loom::cpu
