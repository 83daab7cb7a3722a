// max_pool2d and avg_pool2d on CPU: oneDNN's pooling_forward for the dtypes it has on the
// machine (float32, bfloat16), a reference loop for float64 and the rest, and a vectorized
// loop of loom's own for max pooling over tiled 2x2 windows in float32 and float64;
// max_pool2d_with_indices by max pooling's own rule (dilated_window_max), every float type,
// as max_pool2d's dilated windows.
#include <algorithm>
#include <array>
#include <limits>

#include "kernel/common/apply_rule.hpp"
#include "nn_kernels.hpp"
#include "nn_onednn.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

// One task per (n, c) plane. The window is clipped to the input; padding never wins a max
// and counts towards a mean only with count_include_pad (the window is then always whole:
// inference keeps every window inside the padded input).
template <class T, bool Max>
void reference_pool(kernel_context& ctx, const T* x, T* out, const pool_geometry& g,
                    bool include_pad) {
  using Acc = acc_t<T>;
  const double cost = static_cast<double>(g.oh * g.ow * g.kernel[0] * g.kernel[1]);
  ctx.parallel_for(g.n * g.c, cost, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const T* in = x + p * g.h * g.w;
      T* dst = out + p * g.oh * g.ow;
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        const auto [ys, ye] = window_rows(g, oy);
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const auto [xs, xe] = window_cols(g, ox);
          Acc v = Max ? -std::numeric_limits<Acc>::infinity() : Acc{0};
          for (std::int64_t yy = ys; yy < ye; ++yy) {
            for (std::int64_t xx = xs; xx < xe; ++xx) {
              const Acc e = widen<T>(in[yy * g.w + xx]);
              if constexpr (Max) {
                v = std::max(v, e);
              } else {
                v += e;
              }
            }
          }
          if constexpr (!Max) {
            const std::int64_t count =
                include_pad ? g.kernel[0] * g.kernel[1] : (ye - ys) * (xe - xs);
            v /= static_cast<Acc>(count);
          }
          dst[oy * g.ow + ox] = narrow<T>(v);
        }
      }
    }
  });
}

// Max pooling over tiled 2x2 windows (tiles_2x2), every float type: one vectorized pass,
// faster than oneDNN's NCHW pooling here (the CNN training step's [128, 32, 28, 28] on 2
// threads: 0.32 ms against 1.03 ms), and the maximum by the gradient's own rule
// (window_max).
template <class C>
void max_pool_plane_2x2(const C* in, C* out, const pool_geometry& g) {
  for (std::int64_t oy = 0; oy < g.oh; ++oy) {
    const C* __restrict r0 = in + 2 * oy * g.w;
    const C* __restrict r1 = r0 + g.w;
    C* __restrict dst = out + oy * g.ow;
    for (std::int64_t ox = 0; ox < g.ow; ++ox) {
      dst[ox] = window_max(r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1]);
    }
  }
}

// Planes [lo, hi). Rows of a 28-wide plane are too short for 16-bit vectors (8 or more
// elements a step, the rest scalar conversions): float16 and bfloat16 planes are widened to
// float in L1 (`staged`: h w + oh ow floats), pooled by the float rows and narrowed back,
// exactly (the maximum is one of the window's values); through oneDNN, the bfloat16 CNN
// step's two pools took 1.0 ms against float32's 0.83 in this loop.
template <class T>
void max_pool_planes_2x2(const T* x, T* out, const pool_geometry& g, std::int64_t lo,
                         std::int64_t hi, acc_t<T>* staged) {
  using C = acc_t<T>;
  const std::int64_t plane = g.h * g.w;
  const std::int64_t out_plane = g.oh * g.ow;
  for (std::int64_t p = lo; p < hi; ++p) {
    if constexpr (std::is_same_v<T, C>) {
      max_pool_plane_2x2(x + p * plane, out + p * out_plane, g);
    } else {
      widen_n(x + p * plane, plane, staged);
      max_pool_plane_2x2(staged, staged + plane, g);
      narrow_n(staged + plane, out_plane, out + p * out_plane);
    }
  }
}

// The baseline's alone: variants as the gradient's (nn_pool_backward.cpp) took the bfloat16
// CNN step's two pools from 0.94 ms to 1.4-1.6 ms in AVX2 and AVX-512 alike (short planes: 196
// values in, 49 out for the second pool).
template <class T>
void max_pool_2x2(kernel_context& ctx, const T* x, T* out, const pool_geometry& g) {
  using C = acc_t<T>;
  const std::int64_t plane = g.h * g.w;
  ctx.parallel_for(g.n * g.c, static_cast<double>(plane), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<C> staged;
    if constexpr (!std::is_same_v<T, C>) staged.resize(static_cast<std::size_t>(plane + g.oh * g.ow));
    max_pool_planes_2x2(x, out, g, lo, hi, staged.data());
  });
}

// The geometry of a pooling node over x (its NCHW view: nn_rules::pool_input_view), failing
// the node for an input of another rank, an empty image, or a window larger than the padded
// input.
pool_geometry checked_pool_geometry(const kernel_context& ctx, const tensor& x,
                                    const nn_rules::pool_window& window, bool blocked = false) {
  const shape view = common::apply_rule(ctx, [&] { return nn_rules::pool_input_view(x.shape(), blocked); });
  const pool_geometry g = nn_rules::pool2d_geometry(view, window);
  if (g.h == 0 || g.w == 0) ctx.fail("pooling over an empty image: {}", x.describe());
  if (g.oh < 0 || g.ow < 0) {
    ctx.fail("the window [{}, {}] is larger than the padded input {}", g.kernel[0], g.kernel[1],
             x.describe());
  }
  return g;
}

// Max pooling by its rule (dilated_window_max, any window: the gradient's own), every float
// type; max_pool2d's loop for dilated windows. With `indices`, also the index of each
// maximum in x flattened: row-major (plane · H + h) · W + w, or column-major
// plane · H · W + w · H + h; -1 for a window over padding alone.
template <class T>
void max_pool_by_rule(kernel_context& ctx, const T* x, T* out, const pool_geometry& g,
                      std::int64_t* indices = nullptr, bool column_major = false) {
  const double cost = static_cast<double>(g.oh * g.ow * g.kernel[0] * g.kernel[1]);
  ctx.parallel_for(g.n * g.c, cost, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t p = lo; p < hi; ++p) {
      const T* in = x + p * g.h * g.w;
      for (std::int64_t o = p * g.oh * g.ow, oy = 0; oy < g.oh; ++oy) {
        for (std::int64_t ox = 0; ox < g.ow; ++ox, ++o) {
          const auto [best, at] = dilated_window_max(in, g, oy, ox);
          out[o] = narrow<T>(best);
          if (indices == nullptr) continue;
          const std::int64_t k = column_major ? at % g.w * g.h + at / g.w : at;
          indices[o] = at < 0 ? -1 : p * g.h * g.w + k;
        }
      }
    }
  });
}

dnnl::algorithm pooling_algorithm(bool max, bool include_pad) {
  return max           ? dnnl::algorithm::pooling_max
         : include_pad ? dnnl::algorithm::pooling_avg_include_padding
                       : dnnl::algorithm::pooling_avg_exclude_padding;
}

// oneDNN's pooling (inference) over g in the layout `tag`: nchw, or nChw16c (g.c then a
// whole number of blocks).
dnnl::pooling_forward::primitive_desc pooling_primitive(const pool_geometry& g, dnnl::memory::data_type dt,
                                                        dnnl::algorithm alg, dnnl::memory::format_tag tag) {
  const dnnl::memory::desc src_md({g.n, g.c, g.h, g.w}, dt, tag);
  const dnnl::memory::desc dst_md({g.n, g.c, g.oh, g.ow}, dt, tag);
  const dnnl::pooling_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src_md, dst_md,
                                         {g.stride[0], g.stride[1]}, {g.kernel[0], g.kernel[1]},
                                         {g.pad[0], g.pad[2]}, {g.pad[1], g.pad[3]});
  return {desc, onednn::user_scratchpad_attr(), onednn::engine()};
}

template <bool Max>
class pool_kernel final : public op_kernel {
 public:
  // oneDNN runs on its own (OpenMP) threads, all of the device's.
  [[nodiscard]] bool uses_all_threads() const noexcept override { return true; }
  explicit pool_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("T")),
        include_pad_(!Max && c.attr<bool>("count_include_pad")),
        blocked_(nn_rules::is_channel_blocked(c.attr<std::string>("data_format"))),
        window_(pool_window_of(c)) {}

  void compute(kernel_context& ctx) override {
    if (include_pad_ && window_.ceil_mode) {
      ctx.fail("ceil_mode with count_include_pad is not supported");  // Note [pooling ceil_mode]
    }
    if (blocked_) return compute_in_blocks(ctx);
    const pool_geometry g = checked_pool_geometry(ctx, ctx.input(0), window_);
    tensor& out = ctx.allocate_output(0, g.output_shape());
    if (out.num_elements() == 0) return;
    const tensor x = ctx.input_contiguous(0);
    if (g.dilated()) {
      if constexpr (!Max) ctx.fail("avg_pool2d takes dilations of 1 only");
      return visit_float_type(ctx, type_, "pooling", [&](auto tag) {
        using T = decltype(tag);
        max_pool_by_rule<T>(ctx, x.data<T>(), out.data<T>(), g);
      });
    }
    if constexpr (Max) {
      if (tiles_2x2(g)) {
        return visit_float_type(ctx, type_, "pooling", [&](auto tag) {
          using T = decltype(tag);
          max_pool_2x2<T>(ctx, x.data<T>(), out.data<T>(), g);
        });
      }
    }
    if (const auto dt = onednn::data_type_of(type_); dt && run_onednn(ctx, x, out, g, *dt)) return;
    visit_float_type(ctx, type_, "pooling", [&](auto tag) {
      using T = decltype(tag);
      reference_pool<T, Max>(ctx, x.data<T>(), out.data<T>(), g, include_pad_);
    });
  }

 private:
  // Under "NCHW16c" (Note [channel blocks]): oneDNN's pooling over nChw16c, the blocks'
  // zero channels pooled to zeros (padding never fills a whole window: it is smaller than
  // the window). conv_layout moves a pool into blocks only where this gives the NCHW
  // pooling's bits (cpu_pools_in_channel_blocks).
  void compute_in_blocks(kernel_context& ctx) {
    const pool_geometry g = checked_pool_geometry(ctx, ctx.input(0), window_, true);
    if (g.dilated()) ctx.fail("pooling in channel blocks (NCHW16c) takes dilations of 1 only");
    const auto dt = onednn::data_type_of(type_);
    if (!dt || (type_ != dtype::f32 && type_ != dtype::bf16)) {
      ctx.fail("pooling in channel blocks (NCHW16c) computes through oneDNN: float32 or bfloat16, not {}",
               to_string(type_));
    }
    tensor& out = ctx.allocate_output(0, nn_rules::blocked_shape(g.output_shape()));
    if (out.num_elements() == 0) return;
    const tensor x = ctx.input_contiguous(0);
    if (!run_onednn(ctx, x, out, g, *dt, dnnl::memory::format_tag::nChw16c)) {
      ctx.fail("oneDNN has no pooling over {} in channel blocks", x.describe());
    }
  }

  bool run_onednn(kernel_context& ctx, const tensor& x, tensor& out, const pool_geometry& g,
                  dnnl::memory::data_type dt,
                  dnnl::memory::format_tag layout = dnnl::memory::format_tag::nchw) {
    const int threads = ctx.num_threads();
    const onednn::primitive_cache::key key{static_cast<std::int64_t>(type_),
                                           threads,
                                           static_cast<std::int64_t>(layout),
                                           g.n,
                                           g.c,
                                           g.h,
                                           g.w};
    const auto plan = cache_.get(key, [&] {
      onednn::use_threads(threads);
      const auto pd = pooling_primitive(g, dt, pooling_algorithm(Max, include_pad_), layout);
      return onednn::make_plan<dnnl::pooling_forward>(pd, {{DNNL_ARG_SRC, pd.src_desc()}, {DNNL_ARG_DST, pd.dst_desc()}});
    });
    if (!plan->primitive) return false;
    onednn::execute(ctx, *plan, {x.raw_data(), out.raw_data()});
    return true;
  }

  dtype type_;
  bool include_pad_;
  bool blocked_;
  nn_rules::pool_window window_;
  onednn::primitive_cache cache_;
};

// max_pool2d_with_indices: (values, int64 indices), both [n, c, oh, ow].
class max_pool_with_indices_kernel final : public op_kernel {
 public:
  explicit max_pool_with_indices_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("T")),
        column_major_(c.attr<std::int64_t>("storage_order") == 1),
        window_(pool_window_of(c)) {}

  void compute(kernel_context& ctx) override {
    const pool_geometry g = checked_pool_geometry(ctx, ctx.input(0), window_);
    tensor& out = ctx.allocate_output(0, g.output_shape());
    tensor& indices = ctx.allocate_output(1, g.output_shape());
    if (out.num_elements() == 0) return;
    const tensor x = ctx.input_contiguous(0);
    visit_float_type(ctx, type_, "max_pool2d_with_indices", [&](auto tag) {
      using T = decltype(tag);
      max_pool_by_rule<T>(ctx, x.data<T>(), out.data<T>(), g, indices.data<std::int64_t>(),
                          column_major_);
    });
  }

 private:
  dtype type_;
  bool column_major_;
  nn_rules::pool_window window_;
};

}  // namespace

void register_nn_pool_kernels(kernel_registry& r) {
  const auto floats = type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16});
  r.add(make_kernel_def<pool_kernel<true>>("max_pool2d", device_type::cpu, floats, "onednn"));
  r.add(make_kernel_def<max_pool_with_indices_kernel>("max_pool2d_with_indices", device_type::cpu,
                                                      floats));
  r.add(make_kernel_def<pool_kernel<false>>("avg_pool2d", device_type::cpu, floats, "onednn"));
}

}  // namespace loom::cpu

namespace loom {

// Note [channel blocks]: a float32 pool between convolutions in blocks, unless the NCHW kernel
// is loom's own (tiled 2x2 max windows, dilations) or oneDNN would pool nChw16c with another
// implementation than nchw (which could treat NaN or a window of -inf otherwise): the same
// jit kernel pools both layouts on AVX-512 (nchw through its transposes).
bool nn_rules::cpu_pools_in_channel_blocks(const pool_geometry& g, dtype t, bool max, bool include_pad) noexcept {
  if (t != dtype::f32 || g.dilated() || (max && cpu::tiles_2x2(g)) || !cpu_computes_in_channel_blocks()) {
    return false;
  }
  if (g.c <= 0 || g.h <= 0 || g.w <= 0 || g.oh <= 0 || g.ow <= 0) return false;
  pool_geometry probe = g;
  probe.n = std::max<std::int64_t>(g.n, 1);  // an unknown batch
  pool_geometry blocks = probe;
  blocks.c = channel_blocks(g.c) * channel_block;
  try {
    using tag = dnnl::memory::format_tag;
    const auto alg = cpu::pooling_algorithm(max, include_pad);
    const auto dt = dnnl::memory::data_type::f32;
    return cpu::pooling_primitive(probe, dt, alg, tag::nchw).impl_info_str() ==
           cpu::pooling_primitive(blocks, dt, alg, tag::nChw16c).impl_info_str();
  } catch (...) {  // no primitive (dnnl::error), or no memory for one
    return false;
  }
}

}  // namespace loom
