// The nn family's CPU kernels, one file per op group; register_nn_kernels (nn_kernels.cpp)
// lists them. Note [oneDNN integration] (nn_onednn.hpp) says how they call oneDNN.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "loom/core/half.hpp"
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

/// matmul's output shape for a and b (batch dims broadcast, then [M, N]) and its inner
/// dimension K.
struct matmul_dims {
  shape out;
  std::int64_t k = 0;
};
/// Fails the kernel naming the shapes when the ranks, K or the batch dims do not fit
/// (nn_matmul.cpp; matmul and fused_matmul).
matmul_dims matmul_dims_of(kernel_context& ctx, const tensor& a, const tensor& b, bool transpose_a,
                           bool transpose_b);

namespace nn_detail {

/// A 2-D pooling window over x [n, c, h, w] giving [n, c, oh, ow] (the forward kernels and
/// their gradients share it).
struct pool_geometry {
  std::int64_t n, c, h, w, oh, ow;
  std::array<std::int64_t, 2> kernel, stride;
  std::array<std::int64_t, 4> pad;  // top, bottom, left, right
};

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
