// The gradients of the pooling ops on CPU: max_pool2d_grad and avg_pool2d_grad, by loops of
// loom's own for every float type.
//
// Why not oneDNN's pooling_backward: for max pooling it reads the workspace (the argmax)
// that a forward_training pass writes, so it would cost a second forward pass and a
// workspace tensor; recomputing the argmax here reads each window once. For averages,
// measured on NCHW float32 ([16, 64, 56, 56], 3x3 windows, stride 2, 2 threads), oneDNN's
// jit backward (which transposes NCHW internally) took 8-12 ms against 7 ms for the loop
// below, and the max gradient here costs about what oneDNN's forward_training plus
// backward do. Loops of our own also fix the rules exactly: the first maximum in row-major
// window order wins ties, padding never wins, and sums run in a fixed order whatever the
// thread count.
//
// One task per (n, c) plane: the windows of a plane only touch that plane, so tasks never
// write to the same element. Each plane accumulates in float (double for float64) and
// rounds once.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_isa.hpp"
#include "nn_kernels.hpp"

namespace loom::cpu {
namespace {

using namespace nn_detail;

// Runs body(in_plane_index, acc, grad) for each plane, with `acc` a zeroed accumulator of
// h * w elements that is then rounded into dx's plane.
template <class T, class Body>
void for_each_plane(const kernel_context& ctx, const T* dy, T* dx, const pool_geometry& g,
                    double cost, Body&& body) {
  using Acc = acc_t<T>;
  const std::int64_t plane = g.h * g.w;
  ctx.parallel_for(g.n * g.c, cost, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<Acc> buffer;
    if constexpr (!std::is_same_v<T, Acc>) buffer.resize(static_cast<std::size_t>(plane));
    for (std::int64_t p = lo; p < hi; ++p) {
      T* dst = dx + p * plane;
      Acc* acc = nullptr;
      if constexpr (std::is_same_v<T, Acc>) {
        acc = dst;  // float and double accumulate in the output itself
      } else {
        acc = buffer.data();
      }
      std::fill_n(acc, plane, Acc{0});
      body(p, acc, dy + p * g.oh * g.ow);
      if constexpr (!std::is_same_v<T, Acc>) {
        for (std::int64_t k = 0; k < plane; ++k) dst[k] = narrow<T>(acc[k]);
      }
    }
  });
}

// The common 2x2, stride 2, unpadded case: windows tile the plane, so each window writes
// its four positions directly (dy at its maximum, 0 elsewhere), with no zeroing pass and no
// accumulator: one read of x and one write of dx. The maximum is chosen exactly as the
// general loop does (first strictly greater element, from -inf). Never inlined into the
// wider variants below: with 8 or 16 floats a step, a 14-window row is mostly the scalar
// remainder (the bfloat16 CNN step's pool gradients took 7.0 ms in AVX-512, 3.7 ms in
// AVX2 and 2.7 in the baseline's 4 a step).
template <class C>
[[gnu::noinline]] void max_pool_grad_plane_2x2(const C* in, const C* grad, C* out, const pool_geometry& g) {
  constexpr C inf = std::numeric_limits<C>::infinity();
  // An odd last row or column lies in no window.
  if (g.h % 2 != 0 || g.w % 2 != 0) std::fill_n(out, g.h * g.w, C{0});
  for (std::int64_t oy = 0; oy < g.oh; ++oy) {
    const C* __restrict r0 = in + 2 * oy * g.w;
    const C* __restrict r1 = r0 + g.w;
    const C* __restrict dy_row = grad + oy * g.ow;
    C* __restrict o0 = out + 2 * oy * g.w;
    C* __restrict o1 = o0 + g.w;
    // Selects, no branches, and no dependence between windows, so the loop vectorizes: on
    // real activations which element wins is random, and a branch per comparison
    // mispredicts (9.5 ms a CNN step for the two pool gradients with branches, 5.6 ms
    // branch-free scalar; vectorized, 1.6 ms on 2 threads).
    for (std::int64_t ox = 0; ox < g.ow; ++ox) {
      const std::int64_t c0 = 2 * ox;
      const C e0 = r0[c0];
      const C e1 = r0[c0 + 1];
      const C e2 = r1[c0];
      const C e3 = r1[c0 + 1];
      // The winner is the first element equal to the maximum (as the general loop's
      // "e > best" finds it); when nothing beats -inf, the first element.
      const C best = window_max(e0, e1, e2, e3);
      const bool w0 = (best == -inf) | (e0 == best);
      const bool w1 = !w0 & (e1 == best);
      const bool w2 = !(w0 | w1) & (e2 == best);
      const bool w3 = !(w0 | w1 | w2);
      const C v = dy_row[ox];  // loaded once, unconditionally: no control flow
      o0[c0] = w0 ? v : C{0};
      o0[c0 + 1] = w1 ? v : C{0};
      o1[c0] = w2 ? v : C{0};
      o1[c0 + 1] = w3 ? v : C{0};
    }
  }
}

// The 2x2 case over planes [lo, hi). float16 and bfloat16 planes (x, dy) are widened to
// float in L1 (`staged`: 2 h w + oh ow floats), routed by the float loop and narrowed back,
// exactly (dx holds dy's values and zeros): the rows of a 28-wide plane are too short for
// 16-bit vectors, and the general loop below, accumulating in float, took 4.4 ms of the
// CNN's bfloat16 training step, 2.2 times float32's.
template <class T>
[[gnu::always_inline]] inline void max_pool_grad_planes_2x2(const T* x, const T* dy, T* dx,
                                                            const pool_geometry& g, std::int64_t lo,
                                                            std::int64_t hi, acc_t<T>* staged) {
  using C = acc_t<T>;
  const std::int64_t plane = g.h * g.w;
  const std::int64_t out_plane = g.oh * g.ow;
  for (std::int64_t p = lo; p < hi; ++p) {
    if constexpr (std::is_same_v<T, C>) {
      max_pool_grad_plane_2x2(x + p * plane, dy + p * out_plane, dx + p * plane, g);
    } else {
      C* in = staged;
      C* grad = in + plane;
      C* out = grad + out_plane;
      widen_n(x + p * plane, plane, in);
      widen_n(dy + p * out_plane, out_plane, grad);
      max_pool_grad_plane_2x2(in, grad, out, g);
      narrow_n(out, plane, dx + p * plane);
    }
  }
}

// Compiled for each instruction set (Note [fused instruction sets]): the conversions of the
// float16 / bfloat16 planes are long loops that the wide variants do 16 at a time; the
// float rows stay the baseline's (above).
#define LOOM_POOL_GRAD_VARIANT(isa, target_attr)                                              \
  template <class T>                                                                           \
  target_attr void max_pool_grad_planes_2x2_##isa(const T* x, const T* dy, T* dx,             \
                                                  const pool_geometry& g, std::int64_t lo,    \
                                                  std::int64_t hi, acc_t<T>* staged) {        \
    max_pool_grad_planes_2x2(x, dy, dx, g, lo, hi, staged);                                    \
  }
LOOM_POOL_GRAD_VARIANT(baseline, LOOM_ISA_BASELINE)
#if LOOM_ISA_HAS_AVX2
LOOM_POOL_GRAD_VARIANT(avx2, LOOM_ISA_AVX2)
#endif
#if LOOM_ISA_HAS_AVX512
LOOM_POOL_GRAD_VARIANT(avx512, LOOM_ISA_AVX512)
#endif
#undef LOOM_POOL_GRAD_VARIANT

template <class T>
void max_pool_grad_2x2(const kernel_context& ctx, const T* x, const T* dy, T* dx,
                       const pool_geometry& g) {
  using C = acc_t<T>;
  const std::int64_t plane = g.h * g.w;
  auto planes = &max_pool_grad_planes_2x2_baseline<T>;
  switch (widest_cpu_isa()) {
    case isa_cap::avx512:
#if LOOM_ISA_HAS_AVX512
      planes = &max_pool_grad_planes_2x2_avx512<T>;
      break;
#endif
    case isa_cap::avx2:
#if LOOM_ISA_HAS_AVX2
      planes = &max_pool_grad_planes_2x2_avx2<T>;
#endif
      break;
    case isa_cap::baseline:
      break;
  }
  ctx.parallel_for(g.n * g.c, static_cast<double>(plane), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<C> staged;
    if constexpr (!std::is_same_v<T, C>) {
      staged.resize(static_cast<std::size_t>(2 * plane + g.oh * g.ow));
    }
    planes(x, dy, dx, g, lo, hi, staged.data());
  });
}

// dx[argmax of each window] += dy[window].
template <class T>
void max_pool_grad(const kernel_context& ctx, const T* x, const T* dy, T* dx,
                   const pool_geometry& g) {
  if (tiles_2x2(g)) return max_pool_grad_2x2<T>(ctx, x, dy, dx, g);
  using Acc = acc_t<T>;
  const double cost = static_cast<double>(g.oh * g.ow * g.kernel[0] * g.kernel[1] + g.h * g.w);
  if (g.dilated()) {  // taps dilation apart: the same rule over them
    for_each_plane<T>(ctx, dy, dx, g, cost, [&](std::int64_t p, Acc* acc, const T* grad) {
      const T* in = x + p * g.h * g.w;
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const std::int64_t at = dilated_window_max(in, g, oy, ox).second;
          if (at >= 0) acc[at] += widen<T>(grad[oy * g.ow + ox]);  // -1: no input in the window
        }
      }
    });
    return;
  }
  for_each_plane<T>(ctx, dy, dx, g, cost, [&](std::int64_t p, Acc* acc, const T* grad) {
    const T* in = x + p * g.h * g.w;
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      const auto [ys, ye] = window_rows(g, oy);
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        const auto [xs, xe] = window_cols(g, ox);
        // As the forward: a strictly greater element replaces the maximum, so the first of
        // equal maxima wins; a window of NaN or -inf only routes to its first element.
        Acc best = -std::numeric_limits<Acc>::infinity();
        std::int64_t at = ys * g.w + xs;
        for (std::int64_t yy = ys; yy < ye; ++yy) {
          for (std::int64_t xx = xs; xx < xe; ++xx) {
            // Selects, not a branch: on real data the comparison is unpredictable.
            const Acc e = widen<T>(in[yy * g.w + xx]);
            const bool greater = e > best;
            at = greater ? yy * g.w + xx : at;
            best = greater ? e : best;
          }
        }
        acc[at] += widen<T>(grad[oy * g.ow + ox]);
      }
    }
  });
}

// dx[each position of a window] += dy[window] / count (the forward's divisor).
template <class T>
void avg_pool_grad(const kernel_context& ctx, const T* dy, T* dx, const pool_geometry& g,
                   bool include_pad) {
  using Acc = acc_t<T>;
  const double cost = static_cast<double>(g.oh * g.ow * g.kernel[0] * g.kernel[1] + g.h * g.w);
  for_each_plane<T>(ctx, dy, dx, g, cost, [&](std::int64_t, Acc* acc, const T* grad) {
    for (std::int64_t oy = 0; oy < g.oh; ++oy) {
      const auto [ys, ye] = window_rows(g, oy);
      for (std::int64_t ox = 0; ox < g.ow; ++ox) {
        const auto [xs, xe] = window_cols(g, ox);
        const std::int64_t count = include_pad ? g.kernel[0] * g.kernel[1] : (ye - ys) * (xe - xs);
        const Acc v = widen<T>(grad[oy * g.ow + ox]) / static_cast<Acc>(count);
        for (std::int64_t yy = ys; yy < ye; ++yy) {
          Acc* row = acc + yy * g.w;
          for (std::int64_t xx = xs; xx < xe; ++xx) row[xx] += v;
        }
      }
    }
  });
}

template <bool Max>
class pool_grad_kernel final : public op_kernel {
 public:
  explicit pool_grad_kernel(const kernel_construction& c)
      : op_kernel(c),
        type_(c.attr<dtype>("T")),
        include_pad_(!Max && c.attr<bool>("count_include_pad")),
        window_(pool_window_of(c)) {
    if constexpr (!Max) input_shape_ = c.attr<shape>("input_shape");
  }

  void compute(kernel_context& ctx) override {
    const tensor& dyin = ctx.input(Max ? 1 : 0);
    if (dyin.rank() != 4) ctx.fail("dy must have rank 4, got {}", dyin.describe());
    shape xs;
    if constexpr (Max) {
      xs = ctx.input(0).shape();
      if (xs.rank() != 4) ctx.fail("the input must have rank 4, got {}", ctx.input(0).describe());
    } else {
      xs = input_shape_;
      for (std::size_t d = 0; d < 4; ++d) {
        if (xs[d] < 0 && d < 2) xs[d] = dyin.dim(d);
        if (xs[d] < 0) {
          ctx.fail("input_shape {} leaves dimension {} unknown, and dy {} does not determine it",
                   to_string(input_shape_), d, dyin.describe());
        }
      }
    }
    const std::string given = Max ? fmt::format("input {}", ctx.input(0).describe())
                                  : fmt::format("input_shape {}", to_string(xs));
    if (include_pad_ && window_.ceil_mode) {
      ctx.fail("ceil_mode with count_include_pad is not supported");  // Note [pooling ceil_mode]
    }
    if (!Max && (window_.dilation[0] != 1 || window_.dilation[1] != 1)) {
      ctx.fail("avg_pool2d takes dilations of 1 only");
    }
    const pool_geometry g = nn_rules::pool2d_geometry(xs, window_);
    if (g.h == 0 || g.w == 0) ctx.fail("pooling over an empty image: {}", given);
    if (g.oh < 0 || g.ow < 0) {
      ctx.fail("the window [{}, {}] is larger than the padded {}", g.kernel[0], g.kernel[1], given);
    }
    const shape expected = g.output_shape();
    if (dyin.shape() != expected) {
      ctx.fail("dy {} does not match the forward output {} of {}", dyin.describe(),
               to_string(expected), given);
    }
    tensor& dx = ctx.allocate_output(0, xs);
    if (dx.num_elements() == 0) return;
    const tensor dy = ctx.input_contiguous(Max ? 1 : 0);
    tensor x;
    if constexpr (Max) x = ctx.input_contiguous(0);
    visit_float_type(
        ctx, type_, "pooling gradients", [&](auto tag) { run<decltype(tag)>(ctx, x, dy, dx, g); },
        "have");
  }

 private:
  template <class T>
  void run(const kernel_context& ctx, [[maybe_unused]] const tensor& x, const tensor& dy,
           tensor& dx, const pool_geometry& g) const {
    if constexpr (Max) {
      max_pool_grad<T>(ctx, x.data<T>(), dy.data<T>(), dx.data<T>(), g);
    } else {
      avg_pool_grad<T>(ctx, dy.data<T>(), dx.data<T>(), g, include_pad_);
    }
  }

  dtype type_;
  bool include_pad_;
  nn_rules::pool_window window_;
  shape input_shape_;
};

}  // namespace

void register_nn_pool_backward_kernels(kernel_registry& r) {
  const auto floats = type_constraint({dtype::f32, dtype::f64, dtype::f16, dtype::bf16});
  r.add(make_kernel_def<pool_grad_kernel<true>>("max_pool2d_grad", device_type::cpu, floats));
  r.add(make_kernel_def<pool_grad_kernel<false>>("avg_pool2d_grad", device_type::cpu, floats));
}

}  // namespace loom::cpu
