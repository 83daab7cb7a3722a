// The nn family's CPU kernels, one file per op group; register_nn_kernels (nn_kernels.cpp)
// lists them. Note [oneDNN integration] (nn_onednn.hpp) says how they call oneDNN.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>
#include <utility>

#include "loom/core/half.hpp"
#include "loom/graph/ops/nn_rules.hpp"
#include "loom/kernel/kernel_registry.hpp"

namespace loom::cpu {

void register_nn_matmul_kernels(kernel_registry& registry);  // matmul (nn_matmul.cpp)
void register_nn_conv_kernels(kernel_registry& registry);    // conv2d (nn_conv.cpp)
void register_nn_pool_kernels(kernel_registry& registry);    // max_pool2d, avg_pool2d (nn_pool.cpp)
// conv2d_backprop_input, conv2d_backprop_filter (nn_conv_backward.cpp)
void register_nn_conv_backward_kernels(kernel_registry& registry);
// max_pool2d_grad, avg_pool2d_grad (nn_pool_backward.cpp)
void register_nn_pool_backward_kernels(kernel_registry& registry);
// fused_matmul, fused_conv2d (nn_fused.cpp)
void register_nn_fused_kernels(kernel_registry& registry);

namespace nn_detail {

// The window geometry of the kernels and their gradients (the op rules').
using nn_rules::conv_geometry;
using nn_rules::pool_geometry;

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

/// True for 2x2 windows with stride 2 and no padding: windows tile the plane (an odd last
/// row or column lies in none), and the max kernels take their vectorized paths.
inline bool tiles_2x2(const pool_geometry& g) noexcept {
  return g.kernel == std::array<std::int64_t, 2>{2, 2} &&
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
  switch (t) {
    case dtype::f32:
      return f(float{});
    case dtype::f64:
      return f(double{});
    case dtype::f16:
      return f(half{});
    case dtype::bf16:
      return f(bfloat16{});
    default:
      ctx.fail("{} {} no kernel for {}", what, verb, to_string(t));
  }
}

/// The type the reference loops accumulate T in: double for double, float otherwise.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// T -> its accumulation type.
template <class T>
inline acc_t<T> widen(T v) noexcept {
  return static_cast<acc_t<T>>(v);
}
/// Accumulation type -> T (rounded to nearest for half and bfloat16).
template <class T>
inline T narrow(acc_t<T> v) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return T(v);
  } else {
    return static_cast<T>(v);
  }
}

}  // namespace nn_detail
}  // namespace loom::cpu
