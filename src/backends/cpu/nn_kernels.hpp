// The nn family's CPU kernels, one file per op group; register_nn_kernels (nn_kernels.cpp)
// lists them. Note [oneDNN integration] (nn_onednn.hpp) says how they call oneDNN.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "elementwise_loop.hpp"
#include "loom/core/half.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "loom/kernel/kernel_registry.hpp"

namespace loom::cpu {

void register_nn_matmul_kernels(kernel_registry& registry);  // matmul (nn_matmul.cpp)
void register_nn_conv_kernels(kernel_registry& registry);    // conv2d (nn_conv.cpp)
// max_pool2d, max_pool2d_with_indices, avg_pool2d (nn_pool.cpp)
void register_nn_pool_kernels(kernel_registry& registry);
// conv2d_backprop_input, conv2d_backprop_filter, conv_transpose2d (nn_conv_backward.cpp)
void register_nn_conv_backward_kernels(kernel_registry& registry);
// max_pool2d_grad, avg_pool2d_grad (nn_pool_backward.cpp)
void register_nn_pool_backward_kernels(kernel_registry& registry);
// fused_matmul, fused_conv2d (nn_fused.cpp)
void register_nn_fused_kernels(kernel_registry& registry);
// resize (nn_resize.cpp)
void register_nn_resize_kernels(kernel_registry& registry);
// to_channel_blocks, from_channel_blocks (nn_channel_blocks.cpp)
void register_nn_channel_block_kernels(kernel_registry& registry);

/// A kernel that can compute its output in chunks along dimension 0 and hand each chunk to
/// its caller as soon as it is done, while it is in cache (conv2d, for fused_conv2d's
/// epilogue: Note [convolutions in chunks] in nn_conv.cpp). after(lo, hi, n): images
/// [lo, hi) of n are done; the output is allocated by then (ctx.output(0)).
class chunked_kernel {
 public:
  using chunk_done = std::function<void(std::int64_t lo, std::int64_t hi, std::int64_t n)>;

  /// What a fused node asks of the convolution itself (Notes [bias and clip in the
  /// primitive], [the residual in the primitive] in nn_conv.cpp): its bias as a term of the
  /// sum (fused_conv2d's bias_in_sum; the node's input `bias_input`); the activation
  /// clip(lo, hi), or the residual (input `residual_input`) where nothing follows it, which
  /// the kernel applies only where that gives the unfused graph's bits. `check` is the fused
  /// node's check of its inputs against the output, called before they are read.
  struct in_core {
    std::optional<std::size_t> bias_input;
    std::optional<std::size_t> residual_input;
    bool clip = false;
    double lo = 0.0;
    double hi = 0.0;
    std::function<void(const tensor& out)> check;
  };

  virtual ~chunked_kernel() = default;
  /// Computes the output in chunks, with what `core` asks (when given), calling `after` for
  /// each chunk whose clip or residual the primitive did not apply.
  virtual void compute_in_chunks(kernel_context& ctx, const chunk_done& after, const in_core* core) = 0;
};

/// Copies the dense NCHW (or, nhwc, NHWC) tensor `plain` into the dense NCHW16c tensor
/// `blocked` [n, ceil(c / 16), h, w, 16], zeros past channel c (Note [channel blocks]), on
/// the device's threads.
void to_channel_blocks(kernel_context& ctx, const tensor& plain, const tensor& blocked, bool nhwc = false);
/// Copies the channels `plain` has (NCHW, or nhwc, NHWC) out of the dense NCHW16c tensor
/// `blocked`.
void from_channel_blocks(kernel_context& ctx, const tensor& blocked, const tensor& plain, bool nhwc = false);

namespace nn_detail {

// The window geometry of the kernels and their gradients (the op rules').
using nn_rules::conv_geometry;
using nn_rules::pool_geometry;

/// The conv_window of a conv2d node (or of its gradients', fused_conv2d's) attributes.
inline nn_rules::conv_window conv_window_of(const kernel_construction& c) {
  return nn_rules::conv_window_of(
      c.attr<std::int64_t>("groups"), c.attr<std::vector<std::int64_t>>("strides"),
      c.attr<std::vector<std::int64_t>>("dilations"), c.attr<std::vector<std::int64_t>>("padding"));
}

/// The pool_window of a pooling node's (or its gradient's) attributes.
inline nn_rules::pool_window pool_window_of(const kernel_construction& c) {
  return nn_rules::pool_window_of(
      c.attr<std::vector<std::int64_t>>("kernel"), c.attr<std::vector<std::int64_t>>("strides"),
      c.attr<std::vector<std::int64_t>>("padding"), c.attr<bool>("ceil_mode"),
      c.attr<std::vector<std::int64_t>>("dilations"));
}

/// ceil(a / d) for d > 0 and any a.
inline std::int64_t ceil_div(std::int64_t a, std::int64_t d) noexcept {
  return a >= 0 ? (a + d - 1) / d : -((-a) / d);
}

/// The convolution outputs ox with 0 <= ox * stride_w + shift < w, as [lo, hi).
inline std::pair<std::int64_t, std::int64_t> ox_range(const conv_geometry& g,
                                                      std::int64_t shift) noexcept {
  return {std::max<std::int64_t>(0, ceil_div(-shift, g.stride[1])),
          std::min(g.ow, ceil_div(g.w - shift, g.stride[1]))};
}

/// The input rows [first, second) that the window of output row oy covers, clipped to
/// the input (the pooling loops').
inline std::pair<std::int64_t, std::int64_t> window_rows(const pool_geometry& g,
                                                         std::int64_t oy) noexcept {
  const std::int64_t y0 = oy * g.stride[0] - g.pad[0];
  return {std::max<std::int64_t>(y0, 0), std::min(y0 + g.kernel[0], g.h)};
}

/// The input columns [first, second) that the window of output column ox covers, clipped
/// to the input.
inline std::pair<std::int64_t, std::int64_t> window_cols(const pool_geometry& g,
                                                         std::int64_t ox) noexcept {
  const std::int64_t x0 = ox * g.stride[1] - g.pad[2];
  return {std::max<std::int64_t>(x0, 0), std::min(x0 + g.kernel[1], g.w)};
}

/// The taps [first, second) of a dilated window starting at input index `start` (taps
/// start + i · dilation, 0 <= i < k) that fall inside [0, n).
inline std::pair<std::int64_t, std::int64_t> window_taps(std::int64_t start, std::int64_t k,
                                                         std::int64_t dilation,
                                                         std::int64_t n) noexcept {
  const std::int64_t lo = start >= 0 ? 0 : ceil_div(-start, dilation);
  const std::int64_t hi = std::min(k, ceil_div(n - start, dilation));
  return {lo, std::max(lo, hi)};
}

/// True for 2x2 windows with stride 2 and no padding: windows tile the plane (an odd last
/// row or column lies in none), and the max kernels take their vectorized paths.
inline bool tiles_2x2(const pool_geometry& g) noexcept {
  return !g.dilated() && g.kernel == std::array<std::int64_t, 2>{2, 2} &&
         g.stride == std::array<std::int64_t, 2>{2, 2} && g.pad == std::array<std::int64_t, 4>{};
}

/// The maximum of a window as max pooling defines it: from -inf, an element greater than
/// the maximum so far replaces it, so NaN never does (the gradient routes dy by the same
/// rule). Selects, no branches: loops over windows vectorize.
template <class T>
inline T window_max(T e0, T e1, T e2, T e3) noexcept {
  T best = -std::numeric_limits<T>::infinity();
  best = best < e0 ? e0 : best;
  best = best < e1 ? e1 : best;
  best = best < e2 ? e2 : best;
  best = best < e3 ? e3 : best;
  return best;
}

/// Calls f(T{}) with T the C++ type of the float dtype `t` (float, double, half, bfloat16);
/// for another dtype, fails through ctx: "<what> <verb> no kernel for <t>".
template <class F>
void visit_float_type(const kernel_context& ctx, dtype t, std::string_view what, F&& f,
                      std::string_view verb = "has") {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, half> ||
                  std::is_same_v<T, bfloat16>) {
      f(tag);
    } else {
      ctx.fail("{} {} no kernel for {}", what, verb, to_string(t));
    }
  });
}

/// The type the reference loops accumulate T in: double for double, float otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// T -> its accumulation type: the element-wise kernels' load (half and bfloat16 by the
/// branch-free conversions of elementwise_half.hpp, so loops over them vectorise).
template <class T>
[[gnu::always_inline]] inline acc_t<T> widen(T v) noexcept {
  static_assert(std::is_same_v<acc_t<T>, ew::compute_t<T>>, "a float type");
  return ew::load(v);
}
/// Accumulation type -> T: the element-wise kernels' store (half and bfloat16 rounded to
/// nearest even).
template <class T>
[[gnu::always_inline]] inline T narrow(acc_t<T> v) noexcept {
  static_assert(std::is_same_v<acc_t<T>, ew::compute_t<T>>, "a float type");
  return ew::store<T>(v);
}

/// out[i] = widen(in[i]) for i < n.
template <class T>
[[gnu::always_inline]] inline void widen_n(const T* __restrict in, std::int64_t n, acc_t<T>* __restrict out) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = widen(in[i]);
}
/// out[i] = narrow<T>(in[i]) for i < n.
template <class T>
[[gnu::always_inline]] inline void narrow_n(const acc_t<T>* __restrict in, std::int64_t n, T* __restrict out) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = narrow<T>(in[i]);
}

/// The maximum of the dilated window of output (oy, ox) over the plane `in` (taps
/// dilation apart, those outside the input skipped) and the index in the plane of the
/// element that holds it, by max pooling's rule: from -inf, a strictly greater element
/// replaces the maximum (the first of equal maxima wins, NaN never does; a window with
/// nothing above -inf gives its first tap). A window whose taps all fall in the padding
/// (dilated taps can step over the input) gives -inf at index -1. Forward, gradient and
/// max_pool2d_with_indices share it.
template <class T>
inline std::pair<acc_t<T>, std::int64_t> dilated_window_max(const T* in, const pool_geometry& g,
                                                            std::int64_t oy, std::int64_t ox) {
  const std::int64_t y0 = oy * g.stride[0] - g.pad[0];
  const std::int64_t x0 = ox * g.stride[1] - g.pad[2];
  const auto [i0, i1] = window_taps(y0, g.kernel[0], g.dilation[0], g.h);
  const auto [j0, j1] = window_taps(x0, g.kernel[1], g.dilation[1], g.w);
  acc_t<T> best = -std::numeric_limits<acc_t<T>>::infinity();
  std::int64_t at = i0 < i1 && j0 < j1 ? (y0 + i0 * g.dilation[0]) * g.w + x0 + j0 * g.dilation[1]
                                       : -1;
  for (std::int64_t i = i0; i < i1; ++i) {
    for (std::int64_t j = j0; j < j1; ++j) {
      const std::int64_t k = (y0 + i * g.dilation[0]) * g.w + x0 + j * g.dilation[1];
      const acc_t<T> e = widen<T>(in[k]);
      const bool greater = e > best;
      at = greater ? k : at;
      best = greater ? e : best;
    }
  }
  return {best, at};
}

}  // namespace nn_detail
}  // namespace loom::cpu
