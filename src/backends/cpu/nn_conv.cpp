// conv2d on CPU: oneDNN's convolution_forward for float32 and bfloat16 (NCHW activations,
// OIHW filters, as the tensors are laid out, so no reorder), a reference loop for float64
// and for whatever oneDNN cannot do on the machine.
#include <algorithm>
#include <array>
#include <cstring>

#include "graph/ops/nn_attrs.hpp"
#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

// ceil(a / d) for d > 0 and any a.
std::int64_t ceil_div(std::int64_t a, std::int64_t d) {
  return a >= 0 ? (a + d - 1) / d : -((-a) / d);
}

struct conv_geometry {
  std::int64_t n, c, h, w;     // input
  std::int64_t o, cg, kh, kw;  // filter
  std::int64_t oh, ow;         // output
  std::int64_t groups;
  std::array<std::int64_t, 2> stride, dilation;
  std::array<std::int64_t, 4> pad;  // top, bottom, left, right
};

// out[n, o] = sum over the group's channels c and the window of x[n, g*cg + c] * w[o, c].
// One task per output plane; each accumulates in Acc and rounds once.
template <class T>
void reference_conv(kernel_context& ctx, const T* x, const T* w, T* out, const conv_geometry& g) {
  using Acc = acc_t<T>;
  const std::int64_t planes = g.n * g.o;
  const std::int64_t plane = g.oh * g.ow;
  const std::int64_t per_group = g.o / g.groups;
  const double cost = static_cast<double>(g.cg * g.kh * g.kw * plane);
  ctx.parallel_for(planes, cost, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<Acc> acc(static_cast<std::size_t>(plane));
    for (std::int64_t p = lo; p < hi; ++p) {
      const std::int64_t n = p / g.o;
      const std::int64_t o = p % g.o;
      const std::int64_t group = o / per_group;
      std::fill(acc.begin(), acc.end(), Acc{0});
      for (std::int64_t c = 0; c < g.cg; ++c) {
        const T* in = x + (n * g.c + group * g.cg + c) * g.h * g.w;
        const T* filt = w + (o * g.cg + c) * g.kh * g.kw;
        for (std::int64_t i = 0; i < g.kh; ++i) {
          for (std::int64_t j = 0; j < g.kw; ++j) {
            const Acc wv = widen<T>(filt[i * g.kw + j]);
            const std::int64_t shift = j * g.dilation[1] - g.pad[2];  // iw = ow * sw + shift
            const std::int64_t ow_lo = std::max<std::int64_t>(0, ceil_div(-shift, g.stride[1]));
            const std::int64_t ow_hi = std::min(g.ow, ceil_div(g.w - shift, g.stride[1]));
            for (std::int64_t oy = 0; oy < g.oh; ++oy) {
              const std::int64_t iy = oy * g.stride[0] - g.pad[0] + i * g.dilation[0];
              if (iy < 0 || iy >= g.h) continue;
              const T* row = in + iy * g.w + shift;
              Acc* arow = acc.data() + oy * g.ow;
              const std::int64_t sw = g.stride[1];
              for (std::int64_t ox = ow_lo; ox < ow_hi; ++ox) {
                arow[ox] += wv * widen<T>(row[ox * sw]);
              }
            }
          }
        }
      }
      T* dst = out + p * plane;
      for (std::int64_t k = 0; k < plane; ++k) dst[k] = narrow<T>(acc[static_cast<std::size_t>(k)]);
    }
  });
}

class conv2d_kernel final : public op_kernel {
 public:
  // oneDNN runs on its own (OpenMP) threads, all of the device's.
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }
  explicit conv2d_kernel(const kernel_construction& c)
      : op_kernel(c), type_(c.attr<dtype>("T")), groups_(c.attr<std::int64_t>("groups")) {
    const auto s = c.attr<std::vector<std::int64_t>>("strides");
    const auto d = c.attr<std::vector<std::int64_t>>("dilations");
    stride_ = {s.at(0), s.at(1)};
    dilation_ = {d.at(0), d.at(1)};
    pad_ = nn_attrs::padding4(c.attr<std::vector<std::int64_t>>("padding"));
  }

  void compute(kernel_context& ctx) override {
    const tensor& xin = ctx.input(0);
    const tensor& win = ctx.input(1);
    if (xin.rank() != 4 || win.rank() != 4) {
      ctx.fail("conv2d needs an NCHW input and an OIHW filter of rank 4, got {} and {}",
               xin.describe(), win.describe());
    }
    conv_geometry g{};
    g.n = xin.dim(0), g.c = xin.dim(1), g.h = xin.dim(2), g.w = xin.dim(3);
    g.o = win.dim(0), g.cg = win.dim(1), g.kh = win.dim(2), g.kw = win.dim(3);
    g.groups = groups_;
    g.stride = stride_;
    g.dilation = dilation_;
    g.pad = pad_;
    if (g.c != g.cg * groups_ || g.o % groups_ != 0 || g.kh == 0 || g.kw == 0) {
      ctx.fail("filter {} does not fit input {} in {} groups", win.describe(), xin.describe(),
               groups_);
    }
    g.oh = nn_attrs::window_out_size(g.h, g.kh, g.stride[0], g.dilation[0], g.pad[0], g.pad[1]);
    g.ow = nn_attrs::window_out_size(g.w, g.kw, g.stride[1], g.dilation[1], g.pad[2], g.pad[3]);
    if (g.oh < 0 || g.ow < 0) {
      ctx.fail("the filter {} is larger than the padded input {}", win.describe(), xin.describe());
    }
    tensor& out = ctx.allocate_output(0, shape{g.n, g.o, g.oh, g.ow});
    if (out.num_elements() == 0) return;
    if (g.cg == 0 || g.h == 0 || g.w == 0) {  // every window lies in the padding: zeros
      std::memset(out.raw_data(), 0, out.nbytes());
      return;
    }
    const tensor x = ctx.input_contiguous(0);
    const tensor w = ctx.input_contiguous(1);
    if (const auto dt = onednn::data_type_of(type_); dt && run_onednn(ctx, x, w, out, g, *dt)) {
      return;
    }
    switch (type_) {
      case dtype::f32:
        return run_reference<float>(ctx, x, w, out, g);
      case dtype::f64:
        return run_reference<double>(ctx, x, w, out, g);
      case dtype::f16:
        return run_reference<half>(ctx, x, w, out, g);
      case dtype::bf16:
        return run_reference<bfloat16>(ctx, x, w, out, g);
      default:
        ctx.fail("conv2d has no kernel for {}", to_string(type_));
    }
  }

 private:
  template <class T>
  static void run_reference(kernel_context& ctx, const tensor& x, const tensor& w, tensor& out,
                            const conv_geometry& g) {
    reference_conv<T>(ctx, x.data<T>(), w.data<T>(), out.data<T>(), g);
  }

  bool run_onednn(kernel_context& ctx, const tensor& x, const tensor& w, tensor& out,
                  const conv_geometry& g, dnnl::memory::data_type dt) {
    using tag = dnnl::memory::format_tag;
    const int threads = ctx.num_threads();
    const onednn::primitive_cache::key key{
        static_cast<std::int64_t>(type_), threads, g.n, g.c, g.h, g.w, g.o, g.kh, g.kw};
    const auto plan = cache_.get(key, [&] {
      onednn::use_threads(threads);
      const dnnl::memory::desc src_md({g.n, g.c, g.h, g.w}, dt, tag::nchw);
      const dnnl::memory::desc wei_md =
          groups_ == 1
              ? dnnl::memory::desc({g.o, g.cg, g.kh, g.kw}, dt, tag::oihw)
              : dnnl::memory::desc({groups_, g.o / groups_, g.cg, g.kh, g.kw}, dt, tag::goihw);
      const dnnl::memory::desc dst_md({g.n, g.o, g.oh, g.ow}, dt, tag::nchw);
      // oneDNN picks the layouts it computes fastest in (Note [blocked layouts]).
      const auto any = [](const dnnl::memory::desc& md) {
        return dnnl::memory::desc(md.dims(), md.data_type(), tag::any);
      };
      const dnnl::convolution_forward::desc desc(
          dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, any(src_md),
          any(wei_md), any(dst_md), {g.stride[0], g.stride[1]},
          {g.dilation[0] - 1, g.dilation[1] - 1}, {g.pad[0], g.pad[2]}, {g.pad[1], g.pad[3]});
      const dnnl::convolution_forward::primitive_desc pd(desc, onednn::user_scratchpad_attr(),
                                                         onednn::engine());
      return onednn::make_plan<dnnl::convolution_forward>(
          pd, {{DNNL_ARG_SRC, src_md, pd.src_desc()},
               {DNNL_ARG_WEIGHTS, wei_md, pd.weights_desc()},
               {DNNL_ARG_DST, dst_md, pd.dst_desc(), true}});
    });
    if (!plan->primitive) return false;
    onednn::execute(ctx, *plan, {x.raw_data(), w.raw_data(), out.raw_data()});
    return true;
  }

  dtype type_;
  std::int64_t groups_;
  std::array<std::int64_t, 2> stride_{};
  std::array<std::int64_t, 2> dilation_{};
  std::array<std::int64_t, 4> pad_{};
  onednn::primitive_cache cache_;
};

}  // namespace

void register_nn_conv_kernels(kernel_registry& r) {
  r.add(make_kernel_def<conv2d_kernel>(
      "conv2d", device_type::cpu,
      type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16}), "onednn"));
}

}  // namespace loom::cpu
